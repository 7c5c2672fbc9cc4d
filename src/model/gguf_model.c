/*
 * gguf_model.c - see gguf_model.h. One name table serves conversion and
 * loading, so the two directions cannot drift apart.
 */
#include "model/gguf_model.h"
#include "model/quant.h"
#include "model/safetensors.h"
#include "base/err.h"
#include "base/io.h"
#include "base/json.h"
#include "base/mem.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Pre-tokenizer regexes by tokenizer.ggml.pre (the Split patterns of the
 * real tokenizer.json files). */
static const char g_re_qwen2[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
	"\\s+(?!\\S)|\\s+";
static const char g_re_qwen35[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
	"\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* How a tensor's bytes differ between the HF layout and llama.cpp's. */
enum xf {
	XF_NONE = 0,
	XF_NORM1,     /* (1 + w) norm: GGUF stores 1 + w (hybrid only) */
	XF_NEGEXP,    /* A_log -> -exp(A_log) */
	XF_VROWS,     /* rows are value heads (blocks of vrow rows) from row voff on */
	XF_VCOLS,     /* columns are value heads (blocks of dv) */
	XF_F32,       /* kept F32 whatever the file type (1-D, conv) */
};

struct name_map {
	const char *hf;       /* suffix after "model.layers.N." (or full top-level name) */
	const char *gg;       /* suffix after "blk.N." */
	int hybrid_only;      /* 1 hybrid, 0 both, -1 dense only */
	int xf;
};

static const struct name_map g_layer[] = {
	{"input_layernorm.weight", "attn_norm.weight", 0, XF_NORM1},
	{"post_attention_layernorm.weight", "ffn_norm.weight", -1, XF_NONE},
	{"post_attention_layernorm.weight", "post_attention_norm.weight", 1, XF_NORM1},
	{"self_attn.q_proj.weight", "attn_q.weight", 0, XF_NONE},
	{"self_attn.k_proj.weight", "attn_k.weight", 0, XF_NONE},
	{"self_attn.v_proj.weight", "attn_v.weight", 0, XF_NONE},
	{"self_attn.o_proj.weight", "attn_output.weight", 0, XF_NONE},
	{"self_attn.q_norm.weight", "attn_q_norm.weight", 0, XF_NORM1},
	{"self_attn.k_norm.weight", "attn_k_norm.weight", 0, XF_NORM1},
	{"mlp.gate_proj.weight", "ffn_gate.weight", 0, XF_NONE},
	{"mlp.up_proj.weight", "ffn_up.weight", 0, XF_NONE},
	{"mlp.down_proj.weight", "ffn_down.weight", 0, XF_NONE},
	{"linear_attn.in_proj_qkv.weight", "attn_qkv.weight", 1, XF_VROWS},
	{"linear_attn.in_proj_z.weight", "attn_gate.weight", 1, XF_VROWS},
	{"linear_attn.in_proj_b.weight", "ssm_beta.weight", 1, XF_VROWS},
	{"linear_attn.in_proj_a.weight", "ssm_alpha.weight", 1, XF_VROWS},
	{"linear_attn.conv1d.weight", "ssm_conv1d.weight", 1, XF_VROWS},
	{"linear_attn.dt_bias", "ssm_dt.bias", 1, XF_VROWS},
	{"linear_attn.A_log", "ssm_a", 1, XF_NEGEXP},
	{"linear_attn.norm.weight", "ssm_norm.weight", 1, XF_NONE},
	{"linear_attn.out_proj.weight", "ssm_out.weight", 1, XF_VCOLS},
};
#define N_LAYER_MAP (sizeof g_layer / sizeof g_layer[0])

static const char *arch_gguf(const struct kv_model_config *c)
{
	return c->hybrid ? "qwen35" : "qwen3";
}

static int applies(const struct name_map *m, const struct kv_model_config *c)
{
	return m->hybrid_only == 0 || (m->hybrid_only == 1) == (c->hybrid != 0);
}

int kv_gguf_name_from_hf(const struct kv_model_config *c, const char *hf, char *buf, size_t cap)
{
	const char *p = "model.";
	int layer;
	if (!strcmp(hf, "model.embed_tokens.weight"))
		return snprintf(buf, cap, "token_embd.weight"), 1;
	if (!strcmp(hf, "model.norm.weight"))
		return snprintf(buf, cap, "output_norm.weight"), 1;
	if (!strcmp(hf, "lm_head.weight"))
		return snprintf(buf, cap, "output.weight"), 1;
	if (strncmp(hf, p, strlen(p)) || sscanf(hf + strlen(p), "layers.%d.", &layer) != 1)
		return 0;
	const char *rest = strchr(hf + strlen(p) + 7, '.');
	if (!rest)
		return 0;
	rest++;
	for (size_t i = 0; i < N_LAYER_MAP; i++)
		if (applies(&g_layer[i], c) && !strcmp(rest, g_layer[i].hf))
			return snprintf(buf, cap, "blk.%d.%s", layer, g_layer[i].gg), 1;
	return 0;
}

/* --- value-head order -------------------------------------------------------- */

/* HF head of tiled position h (toward GGUF) or tiled position of HF head
 * h (from GGUF). Hk | Hv is checked by the config. */
static int vhead_src(const struct kv_model_config *c, int h, int to_gguf)
{
	int Hk = c->lin_k_heads, per = c->lin_v_heads / c->lin_k_heads;
	if (to_gguf)
		return (h % Hk) * per + h / Hk;
	return (h % per) * Hk + h / per;
}

static int needs_vperm(const struct kv_model_config *c)
{
	return c->hybrid && c->lin_k_heads != c->lin_v_heads;
}

/* Where the value heads sit in a tensor's rows: first row and rows per head. */
static void vrows_of(const struct kv_model_config *c, const char *gg, int64_t *voff, int64_t *vrow)
{
	int64_t kd = 2ll * c->lin_k_heads * c->lin_k_dim;
	if (!strncmp(gg, "blk.", 4) && strchr(gg + 4, '.'))
		gg = strchr(gg + 4, '.') + 1;
	*voff = 0;
	*vrow = c->lin_v_dim;
	if (strstr(gg, "attn_qkv") || strstr(gg, "ssm_conv1d"))
		*voff = kd;
	else if (strstr(gg, "ssm_beta") || strstr(gg, "ssm_alpha") || strstr(gg, "ssm_dt") || !strcmp(gg, "ssm_a"))
		*vrow = 1;
}

/* Permute value-head rows of a row-major byte matrix in place via tmp. */
static void perm_rows(const struct kv_model_config *c, uint8_t *p, size_t row_bytes, int64_t voff, int64_t vrow,
		      int to_gguf, uint8_t *tmp)
{
	size_t blk = (size_t)vrow * row_bytes;
	uint8_t *v = p + (size_t)voff * row_bytes;
	memcpy(tmp, v, blk * (size_t)c->lin_v_heads);
	for (int h = 0; h < c->lin_v_heads; h++)
		memcpy(v + (size_t)h * blk, tmp + (size_t)vhead_src(c, h, to_gguf) * blk, blk);
}

/* Permute value-head column blocks of each row (block = dv elements of
 * elem_bytes, or whole quant blocks: bytes per head). */
static void perm_cols(const struct kv_model_config *c, uint8_t *p, int64_t rows, size_t row_bytes,
		      size_t head_bytes, int to_gguf, uint8_t *tmp)
{
	for (int64_t r = 0; r < rows; r++) {
		uint8_t *row = p + (size_t)r * row_bytes;
		memcpy(tmp, row, row_bytes);
		for (int h = 0; h < c->lin_v_heads; h++)
			memcpy(row + (size_t)h * head_bytes, tmp + (size_t)vhead_src(c, h, to_gguf) * head_bytes,
			       head_bytes);
	}
}

/* --- conversion ---------------------------------------------------------------- */

struct conv_t {
	const struct kv_model_config *c;
	const struct kv_tensor *src;
	char gg[96];
	int xf;
	int dt;                   /* output dtype */
	int64_t rows, cols;       /* row-major shape of the output */
};

static int conv_fill(void *ctx, void *dst, uint64_t nbytes)
{
	struct conv_t *t = ctx;
	uint64_t n = t->src->numel;
	float *f = kv_alloc(KV_MEM_OTHER, (size_t)n * 4 + 64);
	uint8_t *tmp = NULL;
	int rc;
	if (!f)
		return kv_fail(KV_ERR_NOMEM, "out of memory converting '%s'", t->src->name);
	if ((rc = kv_tensor_to_f32(t->src, f, 0, n)))
		goto out;
	if (t->xf == XF_NORM1 && t->c->hybrid)
		for (uint64_t i = 0; i < n; i++)
			f[i] = 1.0f + f[i];
	if (t->xf == XF_NEGEXP)
		for (uint64_t i = 0; i < n; i++)
			f[i] = -expf(f[i]);
	if (needs_vperm(t->c) && (t->xf == XF_VROWS || t->xf == XF_VCOLS || t->xf == XF_NEGEXP)) {
		if (!(tmp = kv_alloc(KV_MEM_OTHER, (size_t)n * 4 + 64))) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto out;
		}
		if (t->xf == XF_VCOLS) {
			perm_cols(t->c, (uint8_t *)f, t->rows, (size_t)t->cols * 4, (size_t)t->c->lin_v_dim * 4, 1, tmp);
		} else {
			int64_t voff, vrow;
			vrows_of(t->c, t->gg, &voff, &vrow);
			/* a vector's "rows" are its elements */
			size_t rb = t->src->ndim == 1 ? 4 : (size_t)(n / (uint64_t)t->rows) * 4;
			perm_rows(t->c, (uint8_t *)f, rb, voff, vrow, 1, tmp);
		}
	}
	uint64_t rb = kv_dtype_row_bytes(t->dt, (uint64_t)t->cols);
	if (rb * (uint64_t)t->rows != nbytes) {
		rc = kv_fail(KV_ERR_INVALID, "internal: '%s' size", t->gg);
		goto out;
	}
	for (int64_t r = 0; r < t->rows && !rc; r++)
		rc = kq_quant_row(t->dt, f + (size_t)r * (size_t)t->cols, (uint8_t *)dst + (size_t)r * rb,
				  (size_t)t->cols);
out:
	kv_free(tmp);
	kv_free(f);
	return rc;
}

static void json_free_str(char *s) { free(s); }

/* tokenizer.json + tokenizer_config.json of hf_dir into GGUF metadata. */
static int conv_tokenizer(struct kv_ggufw *w, const char *dir, const struct kv_model_config *c)
{
	char path[4200];
	json_t *tok = NULL, *cfg = NULL;
	char **strs = NULL;
	int32_t *types = NULL;
	size_t n_ids = 0;
	int rc;
	snprintf(path, sizeof path, "%s/tokenizer.json", dir);
	if ((rc = kv_json_load_file(path, 64u << 20, &tok)))
		return kv_fail_ctx(rc, "convert");
	json_t *model = json_object_get(tok, "model"), *vocab = json_object_get(model, "vocab"),
	       *merges = json_object_get(model, "merges"), *added = json_object_get(tok, "added_tokens");
	if (!json_is_object(vocab) || !json_is_array(merges)) {
		rc = kv_fail(KV_ERR_UNSUPPORTED, "%s: not a BPE tokenizer.json (model.vocab / model.merges)", path);
		goto out;
	}
	const char *k;
	json_t *v;
	size_t i;
	json_object_foreach(vocab, k, v) {
		if (json_integer_value(v) >= 0 && (size_t)json_integer_value(v) + 1 > n_ids)
			n_ids = (size_t)json_integer_value(v) + 1;
	}
	json_array_foreach(added, i, v) {
		json_int_t id = json_integer_value(json_object_get(v, "id"));
		if (id >= 0 && (size_t)id + 1 > n_ids)
			n_ids = (size_t)id + 1;
	}
	/* llama.cpp wants one token per row of token_embd: pad with [PADn]
	 * the way its converter does. */
	if ((size_t)c->vocab > n_ids)
		n_ids = (size_t)c->vocab;
	strs = calloc(n_ids, sizeof *strs);
	types = calloc(n_ids, sizeof *types);
	if (!strs || !types) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	json_object_foreach(vocab, k, v) {
		json_int_t id = json_integer_value(v);
		if (id >= 0 && (size_t)id < n_ids && !strs[id]) {
			strs[id] = strdup(k);
			types[id] = 1;
		}
	}
	json_array_foreach(added, i, v) {
		json_int_t id = json_integer_value(json_object_get(v, "id"));
		const char *s = json_string_value(json_object_get(v, "content"));
		if (id < 0 || (size_t)id >= n_ids || !s)
			continue;
		free(strs[id]);
		strs[id] = strdup(s);
		types[id] = json_is_true(json_object_get(v, "special")) ? 3 : 4;
	}
	for (i = 0; i < n_ids; i++)
		if (!strs[i]) {
			char b[32];
			snprintf(b, sizeof b, "[PAD%zu]", i);
			strs[i] = strdup(b);
			types[i] = 5;
		}
	for (i = 0; i < n_ids; i++)
		if (!strs[i]) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto out;
		}
	/* The pre-tokenizer: llama.cpp knows it by name; the exact regex also
	 * goes in a key of ours so kvkeep reads back what it wrote. */
	const char *re = NULL, *pre_name = "default";
	{
		json_t *pt = json_object_get(tok, "pre_tokenizer"), *seq = json_object_get(pt, "pretokenizers"), *e;
		size_t j;
		json_array_foreach(seq, j, e)
			if (!re && json_is_string(json_object_get(e, "type")) &&
			    !strcmp(json_string_value(json_object_get(e, "type")), "Split"))
				re = json_string_value(json_object_get(json_object_get(e, "pattern"), "Regex"));
		if (!re && json_is_string(json_object_get(pt, "type")) &&
		    !strcmp(json_string_value(json_object_get(pt, "type")), "Split"))
			re = json_string_value(json_object_get(json_object_get(pt, "pattern"), "Regex"));
	}
	if (re && !strcmp(re, g_re_qwen2))
		pre_name = "qwen2";
	else if (re && !strcmp(re, g_re_qwen35))
		pre_name = "qwen35";
	if (re && (rc = kv_ggufw_set_str(w, "kvkeep.tokenizer.pre_regex", re)))
		goto out;
	if ((rc = kv_ggufw_set_str(w, "tokenizer.ggml.model", "gpt2")) ||
	    (rc = kv_ggufw_set_str(w, "tokenizer.ggml.pre", pre_name)) ||
	    (rc = kv_ggufw_set_arr_str(w, "tokenizer.ggml.tokens", n_ids, (const char *const *)strs)) ||
	    (rc = kv_ggufw_set_arr_i32(w, "tokenizer.ggml.token_type", n_ids, types)))
		goto out;
	{
		size_t nm = json_array_size(merges);
		char **ms = calloc(nm ? nm : 1, sizeof *ms);
		if (!ms) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto out;
		}
		json_array_foreach(merges, i, v) {
			if (json_is_string(v)) {
				ms[i] = strdup(json_string_value(v));
			} else if (json_is_array(v) && json_array_size(v) == 2) {
				const char *a = json_string_value(json_array_get(v, 0)), *b = json_string_value(json_array_get(v, 1));
				if (a && b && (ms[i] = malloc(strlen(a) + strlen(b) + 2)))
					sprintf(ms[i], "%s %s", a, b);
			}
			if (!ms[i])
				rc = kv_fail(KV_ERR_UNSUPPORTED, "%s: merge %zu is neither \"a b\" nor [a, b]", path, i);
		}
		if (!rc)
			rc = kv_ggufw_set_arr_str(w, "tokenizer.ggml.merges", nm, (const char *const *)ms);
		for (i = 0; i < nm; i++)
			free(ms[i]);
		free(ms);
		if (rc)
			goto out;
	}
	/* Special ids: eos from config.json, bos and padding from
	 * tokenizer_config.json names when present. */
	if (c->n_eos > 0 && (rc = kv_ggufw_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_ids[0])))
		goto out;
	snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
	if (kv_json_load_file(path, 64u << 20, &cfg) == KV_OK) {
		const char *tmpl = json_string_value(json_object_get(cfg, "chat_template"));
		const char *pad = json_string_value(json_object_get(cfg, "pad_token"));
		const char *bos = json_string_value(json_object_get(cfg, "bos_token"));
		for (i = 0; i < n_ids; i++) {
			if (pad && !strcmp(strs[i], pad) && (rc = kv_ggufw_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)i)))
				goto out;
			if (bos && !strcmp(strs[i], bos) && (rc = kv_ggufw_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)i)))
				goto out;
		}
		if ((rc = kv_ggufw_set_bool(w, "tokenizer.ggml.add_bos_token",
					    json_is_true(json_object_get(cfg, "add_bos_token")))))
			goto out;
		if (tmpl && (rc = kv_ggufw_set_str(w, "tokenizer.chat_template", tmpl)))
			goto out;
	} else {
		kv_errclear();
	}
	if (c->bos_id >= 0 && (rc = kv_ggufw_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos_id)))
		goto out;
	rc = KV_OK;
out:
	for (i = 0; strs && i < n_ids; i++)
		json_free_str(strs[i]);
	free(strs);
	free(types);
	json_decref(tok);
	json_decref(cfg);
	return rc;
}

static int conv_meta(struct kv_ggufw *w, const struct kv_model_config *c, int ftype)
{
	char k[128];
	const char *a = arch_gguf(c);
	int rc = KV_OK;
#define SETU(key, v) \
	do { snprintf(k, sizeof k, "%s.%s", a, key); if (!rc) rc = kv_ggufw_set_u32(w, k, (uint32_t)(v)); } while (0)
#define SETF(key, v) \
	do { snprintf(k, sizeof k, "%s.%s", a, key); if (!rc) rc = kv_ggufw_set_f32(w, k, (float)(v)); } while (0)
	if ((rc = kv_ggufw_set_str(w, "general.architecture", a)) ||
	    (rc = kv_ggufw_set_str(w, "general.name", "kvkeep convert")) ||
	    (rc = kv_ggufw_set_u32(w, "general.file_type", (uint32_t)ftype)) ||
	    (rc = kv_ggufw_set_u32(w, "general.quantization_version", 2)))
		return rc;
	SETU("block_count", c->n_layers);
	SETU("context_length", c->max_positions > 0 ? c->max_positions : 32768);
	SETU("embedding_length", c->hidden);
	SETU("feed_forward_length", c->intermediate);
	SETU("attention.head_count", c->n_heads);
	SETU("attention.head_count_kv", c->n_kv_heads);
	SETU("attention.key_length", c->head_dim);
	SETU("attention.value_length", c->head_dim);
	SETF("rope.freq_base", c->rope_theta);
	SETU("rope.dimension_count", c->rotary_dim);
	SETF("attention.layer_norm_rms_epsilon", c->rms_eps);
	if (c->hybrid) {
		/* Text positions are equal in every M-RoPE section, so any split of
		 * rot/2 gives plain RoPE; this is the 11/11/10 shape scaled. */
		int half = c->rotary_dim / 2, s0 = (half * 11 + 16) / 32, s1 = s0, s2 = half - s0 - s1;
		int32_t sec[4] = {s0, s1, s2 > 0 ? s2 : 0, 0};
		SETU("ssm.conv_kernel", c->conv_kernel);
		SETU("ssm.state_size", c->lin_k_dim);
		SETU("ssm.group_count", c->lin_k_heads);
		SETU("ssm.time_step_rank", c->lin_v_heads);
		SETU("ssm.inner_size", c->lin_v_heads * c->lin_v_dim);
		/* our configs come from layer_types or the interval: write the interval
		 * when it describes the layers, which is what llama.cpp reads. */
		int interval = 0;
		for (int i = 0; i < c->n_layers && !interval; i++)
			if (c->layer_type[i] == KV_LAYER_ATTN)
				interval = i + 1;
		for (int i = 0; i < c->n_layers && interval; i++)
			if ((c->layer_type[i] == KV_LAYER_ATTN) != ((i + 1) % interval == 0))
				return kv_fail(KV_ERR_UNSUPPORTED, "convert: layer_types that are not every n-th layer "
					       "cannot be written as full_attention_interval");
		SETU("full_attention_interval", interval ? interval : c->n_layers + 1);
		snprintf(k, sizeof k, "%s.rope.dimension_sections", a);
		if (!rc)
			rc = kv_ggufw_set_arr_i32(w, k, 4, sec);
	}
#undef SETU
#undef SETF
	return rc;
}

int kv_gguf_convert(const struct kv_gguf_convert_params *p, size_t *n_tensors, uint64_t *bytes)
{
	struct kv_model_config c;
	struct kv_weights *wt = NULL;
	struct kv_ggufw *w = NULL;
	struct kv_tensor_spec *spec = NULL;
	struct conv_t *ct = NULL;
	size_t ns = 0, nt = 0;
	uint64_t total = 0;
	char prefix[64];
	int rc;

	if (kq_ftype_name(p->ftype) == NULL)
		return kv_fail(KV_ERR_INVALID, "convert: unknown file type %d", p->ftype);
	if ((rc = kv_config_load(p->hf_dir, &c)))
		return rc;
	if (c.arch == KV_ARCH_QWEN3_NEXT)
		return kv_fail(KV_ERR_UNSUPPORTED, "convert: qwen3_next (fused DeltaNet projections) is not written yet");
	if ((rc = kv_weights_open(p->hf_dir, &wt)) || (rc = kv_config_check_weights(&c, wt, prefix, sizeof prefix)) ||
	    (rc = kv_config_tensors(&c, prefix, &spec, &ns)))
		goto out;
	if (!(w = kv_ggufw_create()) || !(ct = calloc(ns ? ns : 1, sizeof *ct))) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	if ((rc = conv_meta(w, &c, p->ftype)) || (rc = conv_tokenizer(w, p->hf_dir, &c)))
		goto out;
	struct kq_mix_ctx mix = {c.n_layers, c.n_layers, !c.tie_embeddings};
	int i_v = 0;
	for (size_t i = 0; i < ns; i++) {
		struct conv_t *t = &ct[nt];
		char hf[160];
		const char *name = spec[i].name;
		/* kv_config_tensors names with the folder's prefix; map as "model.". */
		if (!strncmp(name, prefix, strlen(prefix)))
			snprintf(hf, sizeof hf, "model.%s", name + strlen(prefix));
		else
			snprintf(hf, sizeof hf, "%s", name);
		t->c = &c;
		t->src = kv_weights_find(wt, name);
		if (!t->src || !kv_gguf_name_from_hf(&c, hf, t->gg, sizeof t->gg)) {
			rc = kv_fail(KV_ERR_INCOMPATIBLE, "convert: no GGUF name for tensor '%s'", name);
			goto out;
		}
		t->xf = XF_NONE;
		const char *suffix = strchr(t->gg, '.');
		for (size_t m = 0; m < N_LAYER_MAP; m++)
			if (!strncmp(t->gg, "blk.", 4) && suffix && !strcmp(strchr(suffix + 1, '.') + 1, g_layer[m].gg) &&
			    applies(&g_layer[m], &c))
				t->xf = g_layer[m].xf;
		if (!strcmp(t->gg, "output_norm.weight"))
			t->xf = XF_NORM1;
		/* Row-major 2-D view: conv1d [C, 1, K] -> [C, K]; vectors [1, n]. */
		int64_t numel = (int64_t)t->src->numel;
		t->cols = t->src->shape[t->src->ndim - 1];
		t->rows = numel / t->cols;
		int is_mat = (spec[i].role == KV_ROLE_EMBED || spec[i].role == KV_ROLE_LM_HEAD ||
			      spec[i].role == KV_ROLE_LINEAR || spec[i].role == KV_ROLE_LINEAR_OUT ||
			      spec[i].role == KV_ROLE_LINEAR_A);
		int layer = -1;
		sscanf(t->gg, "blk.%d.", &layer);
		if (is_mat) {
			t->dt = kq_ftype_tensor_dtype(p->ftype, &mix, t->gg, layer, i_v, t->cols);
			if (strstr(t->gg, "attn_v.weight") || strstr(t->gg, "attn_qkv.weight"))
				i_v++;
		} else {
			t->dt = KV_DT_F32;
		}
		int64_t shape[2] = {t->rows, t->cols};
		if ((rc = kv_ggufw_add_fill(w, t->gg, t->dt, t->src->ndim == 1 ? 1 : 2,
					    t->src->ndim == 1 ? &shape[1] : shape, conv_fill, t)))
			goto out;
		total += kv_dtype_row_bytes(t->dt, (uint64_t)t->cols) * (uint64_t)t->rows;
		nt++;
	}
	if ((rc = kv_ggufw_write(w, p->out, p->dw_flags)))
		goto out;
	if (n_tensors)
		*n_tensors = nt;
	if (bytes)
		*bytes = total;
out:
	kv_ggufw_destroy(w);
	free(ct);
	free(spec);
	kv_weights_close(wt);
	return rc;
}

/* --- loading ------------------------------------------------------------------- */

/* <arch>.<key> as an integer; a per-layer array (hybrid GGUFs may write
 * head counts per layer, 0 on recurrent layers) gives its largest value. */
static int get_u(const struct kv_gguf *g, const char *arch, const char *key, int64_t *v)
{
	char k[128];
	snprintf(k, sizeof k, "%s.%s", arch, key);
	const struct kv_gguf_kv *kv = kv_gguf_kv_find(g, k);
	if (kv && kv->type == KV_GGUF_ARR && kv->n > 0 && kv->arr_type != KV_GGUF_STR && kv->arr_type != KV_GGUF_F32 &&
	    kv->arr_type != KV_GGUF_F64) {
		int64_t best = 0, x;
		for (uint64_t i = 0; i < kv->n; i++)
			if (kv_gguf_arr_int(kv, i, &x) == KV_OK && x > best)
				best = x;
		*v = best;
		return KV_OK;
	}
	return kv_gguf_get_int(g, k, v);
}

int kv_gguf_config(const struct kv_gguf *g, struct kv_model_config *out)
{
	char *arch = NULL;
	json_t *o = json_object();
	int64_t v;
	double f;
	int rc, hybrid;
	memset(out, 0, sizeof *out);
	if (!o)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	if ((rc = kv_gguf_get_str(g, "general.architecture", &arch)))
		goto out;
	if (strcmp(arch, "qwen3") && strcmp(arch, "qwen35")) {
		rc = kv_fail(KV_ERR_UNSUPPORTED, "%s: GGUF architecture '%s' (kvkeep runs qwen3 and qwen35)",
			     kv_gguf_path(g), arch);
		goto out;
	}
	hybrid = !strcmp(arch, "qwen35");
	json_object_set_new(o, "model_type", json_string(hybrid ? "qwen3_5_text" : "qwen3"));
	static const struct {
		const char *gg, *hf;
		int required;
	} ints[] = {
		{"block_count", "num_hidden_layers", 1},
		{"embedding_length", "hidden_size", 1},
		{"feed_forward_length", "intermediate_size", 1},
		{"attention.head_count", "num_attention_heads", 1},
		{"attention.head_count_kv", "num_key_value_heads", 1},
		{"attention.key_length", "head_dim", 0},
		{"context_length", "max_position_embeddings", 0},
		{"full_attention_interval", "full_attention_interval", 0},
		{"ssm.conv_kernel", "linear_conv_kernel_dim", 2},
		{"ssm.state_size", "linear_key_head_dim", 2},
		{"ssm.group_count", "linear_num_key_heads", 2},
		{"ssm.time_step_rank", "linear_num_value_heads", 2},
	};
	for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
		if (ints[i].required == 2 && !hybrid)
			continue;
		rc = get_u(g, arch, ints[i].gg, &v);
		if (rc == KV_ERR_NOT_FOUND && !ints[i].required)
			continue;
		if (rc)
			goto out;
		json_object_set_new(o, ints[i].hf, json_integer(v));
	}
	/* llama.cpp counts multi-token-prediction layers (blk.<n_layers>.nextn.*)
	 * in block_count; the text model has block_count - nextn layers. */
	{
		int64_t nextn = 0, bc = json_integer_value(json_object_get(o, "num_hidden_layers"));
		if (get_u(g, arch, "nextn_predict_layers", &nextn) == KV_OK && nextn > 0 && nextn < bc)
			json_object_set_new(o, "num_hidden_layers", json_integer(bc - nextn));
		kv_errclear();
	}
	if (hybrid) {
		int64_t inner, hv;
		if ((rc = get_u(g, arch, "ssm.inner_size", &inner)) || (rc = get_u(g, arch, "ssm.time_step_rank", &hv)))
			goto out;
		if (hv <= 0 || inner % hv) {
			rc = KV_CORRUPT(kv_gguf_path(g), 0, "ssm.inner_size %lld does not divide into %lld value heads",
					(long long)inner, (long long)hv);
			goto out;
		}
		json_object_set_new(o, "linear_value_head_dim", json_integer(inner / hv));
	}
	{
		char k[128];
		snprintf(k, sizeof k, "%s.rope.freq_base", arch);
		if (kv_gguf_get_float(g, k, &f) == KV_OK)
			json_object_set_new(o, "rope_theta", json_real(f));
		snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
		if ((rc = kv_gguf_get_float(g, k, &f)))
			goto out;
		json_object_set_new(o, "rms_norm_eps", json_real(f));
		snprintf(k, sizeof k, "%s.rope.dimension_count", arch);
		int64_t hd = json_integer_value(json_object_get(o, "head_dim"));
		if (!hd) {
			int64_t e = json_integer_value(json_object_get(o, "hidden_size")),
				h = json_integer_value(json_object_get(o, "num_attention_heads"));
			hd = h ? e / h : 0;
			json_object_set_new(o, "head_dim", json_integer(hd));
		}
		if (kv_gguf_get_int(g, k, &v) == KV_OK && hd > 0)
			json_object_set_new(o, "partial_rotary_factor", json_real((double)v / (double)hd));
		else if (hybrid)
			json_object_set_new(o, "partial_rotary_factor", json_real(0.25));
		kv_errclear();
	}
	const struct kv_tensor *emb = kv_gguf_tensor_find(g, "token_embd.weight");
	if (!emb || emb->ndim != 2) {
		rc = kv_fail(KV_ERR_INCOMPATIBLE, "%s: no 2-D token_embd.weight", kv_gguf_path(g));
		goto out;
	}
	json_object_set_new(o, "vocab_size", json_integer(emb->shape[0]));
	json_object_set_new(o, "tie_word_embeddings", json_boolean(!kv_gguf_tensor_find(g, "output.weight")));
	if (kv_gguf_get_int(g, "tokenizer.ggml.eos_token_id", &v) == KV_OK)
		json_object_set_new(o, "eos_token_id", json_integer(v));
	if (kv_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &v) == KV_OK)
		json_object_set_new(o, "bos_token_id", json_integer(v));
	kv_errclear();
	{
		char *txt = json_dumps(o, JSON_COMPACT);
		if (!txt) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto out;
		}
		rc = kv_config_parse(txt, strlen(txt), kv_gguf_path(g), out);
		free(txt);
		if (rc)
			goto out;
	}
	snprintf(out->torch_dtype, sizeof out->torch_dtype, "gguf");
	out->gguf = 1;
	if (hybrid) {
		out->norm_plus_one = 0; /* stored with the 1 added */
		out->a_is_neg_exp = 1;
		out->out_proj_tiled = kv_gguf_out_tiled(g, out);
		out->vrows_tiled = needs_vperm(out);
	}
out:
	free(arch);
	json_decref(o);
	return rc;
}

/* Bytes of one value head of out_proj's rows, 0 if a block straddles. */
static size_t out_head_bytes(const struct kv_tensor *t, int dv)
{
	int qk = kq_block_elems(t->dtype);
	if (qk <= 0 || dv % qk)
		return 0;
	return (size_t)kv_dtype_row_bytes(t->dtype, (uint64_t)dv);
}

int kv_gguf_out_tiled(const struct kv_gguf *g, const struct kv_model_config *c)
{
	if (!needs_vperm(c))
		return 0;
	for (int l = 0; l < c->n_layers; l++) {
		char n[64];
		snprintf(n, sizeof n, "blk.%d.ssm_out.weight", l);
		const struct kv_tensor *t = kv_gguf_tensor_find(g, n);
		/* float types are permuted back (the HF summation order, so an F32
		 * GGUF gives the folder's logits bit for bit); block types never
		 * are (no copy of the matrix): the engine permutes the input */
		if (t && (kq_is_quant(t->dtype) || !out_head_bytes(t, c->lin_v_dim)))
			return 1;
	}
	return 0;
}

void kv_gguf_hf_free(struct kv_tensor *t, size_t n)
{
	for (size_t i = 0; t && i < n; i++)
		free((char *)t[i].name);
	free(t);
}

int kv_gguf_hf_tensors(const struct kv_gguf *g, const struct kv_model_config *c, struct kv_tensor **out, size_t *n,
		       void **blob)
{
	size_t nt = kv_gguf_tensor_count(g), k = 0;
	uint64_t owned = 0, off = 0, maxb = 0;
	struct kv_tensor *v = calloc(nt ? nt : 1, sizeof *v);
	uint8_t *b = NULL, *tmp = NULL;
	int rc = KV_OK, tiled_out = c->out_proj_tiled;
	*out = NULL;
	*n = 0;
	*blob = NULL;
	if (!v)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	/* Pass 1: names, and bytes of the tensors that must be copied. */
	for (int pass = 0; pass < 2; pass++) {
		k = 0;
		for (size_t i = 0; i < nt; i++) {
			const struct kv_tensor *t = kv_gguf_tensor_at(g, i);
			char hf[160] = "";
			int xf = XF_NONE, layer = -1;
			if (!strcmp(t->name, "token_embd.weight"))
				snprintf(hf, sizeof hf, "model.embed_tokens.weight");
			else if (!strcmp(t->name, "output_norm.weight"))
				snprintf(hf, sizeof hf, "model.norm.weight");
			else if (!strcmp(t->name, "output.weight"))
				snprintf(hf, sizeof hf, "lm_head.weight");
			else if (sscanf(t->name, "blk.%d.", &layer) == 1 && layer >= 0 && layer < c->n_layers) {
				const char *rest = strchr(t->name + 4, '.') + 1;
				for (size_t m = 0; m < N_LAYER_MAP; m++)
					if (applies(&g_layer[m], c) && !strcmp(rest, g_layer[m].gg)) {
						snprintf(hf, sizeof hf, "model.layers.%d.%s", layer, g_layer[m].hf);
						xf = g_layer[m].xf;
					}
			}
			if (!hf[0])
				continue; /* not a tensor of the text model (mtp, vision...) */
			/* the projections' rows stay tiled (the engine permutes their
			 * outputs, so no copy of the big matrices); the small conv,
			 * dt and A tensors are permuted back */
			int small_rows = t->ndim == 1 || strstr(t->name, "ssm_conv1d") != NULL;
			int perm = needs_vperm(c) && ((xf == XF_VROWS && (small_rows || !c->vrows_tiled)) ||
						       xf == XF_NEGEXP || (xf == XF_VCOLS && !tiled_out));
			if (pass == 0) {
				if (perm) {
					owned += (t->nbytes + 63) & ~(uint64_t)63;
					if (t->nbytes > maxb)
						maxb = t->nbytes;
				}
				k++;
				continue;
			}
			struct kv_tensor *d = &v[k++];
			*d = *t;
			if (!(d->name = strdup(hf))) {
				rc = kv_fail(KV_ERR_NOMEM, "out of memory");
				goto fail;
			}
			if (xf == XF_VROWS && strstr(t->name, "ssm_conv1d")) {
				/* [C, K] -> HF's [C, 1, K] */
				d->ndim = 3;
				d->shape[2] = t->shape[1];
				d->shape[1] = 1;
				d->shape[0] = t->shape[0];
			}
			if (!perm)
				continue;
			memcpy(b + off, t->data, (size_t)t->nbytes);
			if (xf == XF_VCOLS) {
				size_t rb = (size_t)kv_dtype_row_bytes(t->dtype, (uint64_t)t->shape[t->ndim - 1]);
				perm_cols(c, b + off, t->numel / (uint64_t)t->shape[t->ndim - 1], rb,
					  out_head_bytes(t, c->lin_v_dim), 0, tmp);
			} else {
				int64_t voff, vrow, rows = t->ndim == 1 ? (int64_t)t->numel : t->shape[0];
				const char *rest = strchr(t->name + 4, '.') + 1;
				size_t rb = t->ndim == 1 ? (size_t)kv_dtype_row_bytes(t->dtype, 1)
							 : (size_t)kv_dtype_row_bytes(t->dtype, (uint64_t)t->shape[1]);
				vrows_of(c, rest, &voff, &vrow);
				if (!rb || voff + vrow * c->lin_v_heads > rows) {
					rc = kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' has %lld rows, too few for %d value heads",
						     t->file, t->name, (long long)rows, c->lin_v_heads);
					goto fail;
				}
				perm_rows(c, b + off, rb, voff, vrow, 0, tmp);
			}
			d->data = b + off;
			off += (t->nbytes + 63) & ~(uint64_t)63;
		}
		if (pass == 0 && owned) {
			b = kv_alloc(KV_MEM_WEIGHTS, (size_t)owned);
			tmp = malloc((size_t)maxb + 64);
			if (!b || !tmp) {
				rc = kv_fail(KV_ERR_NOMEM, "out of memory for %llu bytes of permuted tensors",
					     (unsigned long long)owned);
				goto fail;
			}
		}
	}
	free(tmp);
	*out = v;
	*n = k;
	*blob = b;
	return KV_OK;
fail:
	free(tmp);
	kv_free(b);
	kv_gguf_hf_free(v, nt);
	return rc;
}

/* --- tokenizer ----------------------------------------------------------------- */

static json_t *byte_level(void)
{
	json_t *o = json_object();
	json_object_set_new(o, "type", json_string("ByteLevel"));
	json_object_set_new(o, "add_prefix_space", json_false());
	json_object_set_new(o, "trim_offsets", json_false());
	json_object_set_new(o, "use_regex", json_false());
	return o;
}

int kv_gguf_tokenizer_json(const struct kv_gguf *g, char **json, size_t *len)
{
	char *model = NULL, *pre = NULL;
	const struct kv_gguf_kv *toks = kv_gguf_kv_find(g, "tokenizer.ggml.tokens"),
				*types = kv_gguf_kv_find(g, "tokenizer.ggml.token_type"),
				*merges = kv_gguf_kv_find(g, "tokenizer.ggml.merges");
	json_t *root = NULL;
	const char *re;
	char *own_re = NULL;
	int rc;
	*json = NULL;
	*len = 0;
	if ((rc = kv_gguf_get_str(g, "tokenizer.ggml.model", &model)))
		return rc;
	if (strcmp(model, "gpt2")) {
		rc = kv_fail(KV_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model '%s' (kvkeep reads gpt2 BPE)", kv_gguf_path(g),
			     model);
		goto out;
	}
	if (kv_gguf_get_str(g, "tokenizer.ggml.pre", &pre))
		pre = strdup("qwen2");
	kv_gguf_get_str(g, "kvkeep.tokenizer.pre_regex", &own_re);
	kv_errclear();
	if (own_re)
		re = own_re;
	else if (pre && !strcmp(pre, "qwen2"))
		re = g_re_qwen2;
	else if (pre && !strcmp(pre, "qwen35"))
		re = g_re_qwen35;
	else {
		rc = kv_fail(KV_ERR_UNSUPPORTED, "%s: tokenizer.ggml.pre '%s' has no pre-tokenizer in kvkeep",
			     kv_gguf_path(g), pre ? pre : "?");
		goto out;
	}
	if (!toks || toks->type != KV_GGUF_ARR || toks->arr_type != KV_GGUF_STR || !merges ||
	    merges->type != KV_GGUF_ARR || merges->arr_type != KV_GGUF_STR ||
	    (types && (types->type != KV_GGUF_ARR || types->n != toks->n))) {
		rc = KV_CORRUPT(kv_gguf_path(g), 0, "tokenizer.ggml.tokens / token_type / merges missing or mistyped");
		goto out;
	}
	root = json_object();
	json_t *added = json_array(), *vocab = json_object(), *mg = json_array(), *m = json_object(),
	       *pt = json_object(), *seq = json_array(), *split = json_object(), *pat = json_object(),
	       *norm = json_object();
	for (uint64_t i = 0; i < toks->n; i++) {
		int64_t ty = 1;
		json_t *s = json_stringn(toks->astr[i], (size_t)toks->alen[i]);
		if (!s) {
			rc = KV_CORRUPT(kv_gguf_path(g), 0, "token %llu is not UTF-8", (unsigned long long)i);
			goto out_json;
		}
		if (types)
			kv_gguf_arr_int(types, i, &ty);
		if (ty == 3 || ty == 4) {
			json_t *a = json_object();
			json_object_set_new(a, "id", json_integer((json_int_t)i));
			json_object_set(a, "content", s);
			json_object_set_new(a, "single_word", json_false());
			json_object_set_new(a, "lstrip", json_false());
			json_object_set_new(a, "rstrip", json_false());
			json_object_set_new(a, "normalized", json_false()); /* as Qwen's tokenizer.json */
			json_object_set_new(a, "special", json_boolean(ty == 3));
			json_array_append_new(added, a);
			json_decref(s);
		} else if (ty == 5) {
			json_decref(s); /* padding rows: no token */
		} else {
			json_object_set_new(vocab, json_string_value(s), json_integer((json_int_t)i));
			json_decref(s);
		}
	}
	for (uint64_t i = 0; i < merges->n; i++) {
		json_t *s = json_stringn(merges->astr[i], (size_t)merges->alen[i]);
		if (!s) {
			rc = KV_CORRUPT(kv_gguf_path(g), 0, "merge %llu is not UTF-8", (unsigned long long)i);
			goto out_json;
		}
		json_array_append_new(mg, s);
	}
	json_object_set_new(root, "version", json_string("1.0"));
	json_object_set_new(root, "added_tokens", added);
	added = NULL;
	json_object_set_new(norm, "type", json_string("NFC"));
	json_object_set_new(root, "normalizer", norm);
	norm = NULL;
	json_object_set_new(split, "type", json_string("Split"));
	json_object_set_new(pat, "Regex", json_string(re));
	json_object_set_new(split, "pattern", pat);
	pat = NULL;
	json_object_set_new(split, "behavior", json_string("Isolated"));
	json_object_set_new(split, "invert", json_false());
	json_array_append_new(seq, split);
	split = NULL;
	json_array_append_new(seq, byte_level());
	json_object_set_new(pt, "type", json_string("Sequence"));
	json_object_set_new(pt, "pretokenizers", seq);
	seq = NULL;
	json_object_set_new(root, "pre_tokenizer", pt);
	pt = NULL;
	json_object_set_new(root, "decoder", byte_level());
	json_object_set_new(m, "type", json_string("BPE"));
	json_object_set_new(m, "vocab", vocab);
	vocab = NULL;
	json_object_set_new(m, "merges", mg);
	mg = NULL;
	json_object_set_new(m, "byte_fallback", json_false());
	json_object_set_new(m, "ignore_merges", json_false());
	json_object_set_new(root, "model", m);
	m = NULL;
	*json = json_dumps(root, JSON_COMPACT);
	rc = *json ? KV_OK : kv_fail(KV_ERR_NOMEM, "out of memory");
	if (*json)
		*len = strlen(*json);
out_json:
	json_decref(added);
	json_decref(vocab);
	json_decref(mg);
	json_decref(m);
	json_decref(pt);
	json_decref(seq);
	json_decref(split);
	json_decref(pat);
	json_decref(norm);
out:
	json_decref(root);
	free(model);
	free(pre);
	free(own_re);
	return rc;
}

int kv_gguf_chat_template(const struct kv_gguf *g, char **out)
{
	return kv_gguf_get_str(g, "tokenizer.chat_template", out);
}

int kv_gguf_tokenizer_config_json(const struct kv_gguf *g, char **json, size_t *len)
{
	const struct kv_gguf_kv *toks = kv_gguf_kv_find(g, "tokenizer.ggml.tokens"),
				*types = kv_gguf_kv_find(g, "tokenizer.ggml.token_type");
	char *tmpl = NULL;
	json_t *cfg = json_object(), *dec = json_object();
	int rc;
	static const struct {
		const char *gg, *hf;
	} ids[] = {
		{"tokenizer.ggml.bos_token_id", "bos_token"},
		{"tokenizer.ggml.eos_token_id", "eos_token"},
		{"tokenizer.ggml.padding_token_id", "pad_token"},
	};
	*json = NULL;
	*len = 0;
	if ((rc = kv_gguf_chat_template(g, &tmpl)))
		goto out;
	if (!toks || toks->type != KV_GGUF_ARR || toks->arr_type != KV_GGUF_STR) {
		rc = KV_CORRUPT(kv_gguf_path(g), 0, "tokenizer.ggml.tokens missing or not a string array");
		goto out;
	}
	json_object_set_new(cfg, "chat_template", json_string(tmpl));
	for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
		int64_t id;
		if (kv_gguf_get_int(g, ids[i].gg, &id) == KV_OK && id >= 0 && (uint64_t)id < toks->n)
			json_object_set_new(cfg, ids[i].hf, json_stringn(toks->astr[id], (size_t)toks->alen[id]));
	}
	kv_errclear();
	for (uint64_t i = 0; types && types->type == KV_GGUF_ARR && i < toks->n && i < types->n; i++) {
		int64_t ty = 1;
		kv_gguf_arr_int(types, i, &ty);
		if (ty != 3 && ty != 4)
			continue;
		json_t *a = json_object(), *s = json_stringn(toks->astr[i], (size_t)toks->alen[i]);
		char key[32];
		if (!s) {
			json_decref(a);
			continue;
		}
		json_object_set_new(a, "content", s);
		json_object_set_new(a, "lstrip", json_false());
		json_object_set_new(a, "normalized", json_false());
		json_object_set_new(a, "rstrip", json_false());
		json_object_set_new(a, "single_word", json_false());
		json_object_set_new(a, "special", json_boolean(ty == 3));
		snprintf(key, sizeof key, "%llu", (unsigned long long)i);
		json_object_set_new(dec, key, a);
	}
	json_object_set(cfg, "added_tokens_decoder", dec);
	*json = json_dumps(cfg, JSON_COMPACT);
	rc = *json ? KV_OK : kv_fail(KV_ERR_NOMEM, "out of memory");
	if (*json)
		*len = strlen(*json);
out:
	free(tmpl);
	json_decref(dec);
	json_decref(cfg);
	return rc;
}
