/*
 * gguf_convert.c - see gguf_convert.h: a Hugging Face folder written as a
 * GGUF file in llama.cpp's layout (the names, transforms and value-head
 * order of model/gguf_map.h), each tensor produced while the writer
 * writes it, its rows quantized in parallel on the pool.
 */
#include "model/gguf_convert.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/gguf_map.h"
#include "model/open.h"
#include "model/quant.h"
#include "model/weights.h"
#include "base/err.h"
#include "base/io.h"
#include "base/json.h"
#include "base/mem.h"
#include "base/pool.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A run of whole rows of a source tensor (cols elements each). */
struct piece {
	const struct kv_tensor *src;
	int64_t r0, rows;
};

struct conv_t {
	const struct kv_model_config *c;
	/* gpt-oss (oss_fill): 1 MXFP4 blocks of the release (src; scales in
	 * src2), 2 a float [E][2I] bias; split 0 all rows, 1 the even rows or
	 * elements (gate), 2 the odd ones (up) */
	int oss, split;
	const struct kv_tensor *src2;
	const struct kv_tensor *src;  /* the first piece's tensor (names, vectors) */
	struct piece *pc;             /* the output's rows, in order (npc runs) */
	int npc;
	char gg[96];
	int xf;
	int dt;                   /* output dtype */
	int64_t rows, cols;       /* row-major shape of the output (rows of all stacked matrices) */
	int ndim;                 /* of the output: 1, 2 or 3 (expert stacks) */
	int64_t shape[3];
};

struct quant_rows {
	int dt;
	const float *f;
	uint8_t *dst;
	size_t cols, rb;
	int failed; /* written only as 1 */
};

/* Rows 1 + [b, e) of a conversion (row 0 ran on the caller). */
static void quant_rows_fn(void *ctx, size_t b, size_t e, int thread)
{
	struct quant_rows *q = ctx;
	(void)thread;
	for (size_t r = b + 1; r < e + 1; r++)
		if (kq_quant_row(q->dt, q->f + r * q->cols, q->dst + r * q->rb, q->cols))
			__atomic_store_n(&q->failed, 1, __ATOMIC_RELAXED);
}

static int conv_fill(void *ctx, void *dst, uint64_t nbytes)
{
	struct conv_t *t = ctx;
	uint64_t n = (uint64_t)t->rows * (uint64_t)t->cols;
	float *f = kv_alloc(KV_MEM_OTHER, (size_t)n * 4 + 64);
	uint8_t *tmp = NULL;
	int rc = KV_OK;
	if (!f)
		return kv_fail(KV_ERR_NOMEM, "out of memory converting '%s'", t->src->name);
	for (int i = 0, r = 0; i < t->npc && !rc; r += (int)t->pc[i].rows, i++)
		rc = kv_tensor_to_f32(t->pc[i].src, f + (size_t)r * (size_t)t->cols,
				      (uint64_t)t->pc[i].r0 * (uint64_t)t->cols,
				      (uint64_t)t->pc[i].rows * (uint64_t)t->cols);
	if (rc)
		goto out;
	if (t->xf == KV_GGUF_XF_NORM1 && t->c->norm_plus_one)
		for (uint64_t i = 0; i < n; i++)
			f[i] = 1.0f + f[i];
	if (t->xf == KV_GGUF_XF_PERMQK && t->c->arch == KV_ARCH_LLAMA) {
		/* llama.cpp's LlamaModel.permute: per head, row (half, i) -> (i,
		 * half), so its adjacent-pair RoPE rotates what HF's rotate-half
		 * rotates */
		int64_t hd = t->c->head_dim, heads = t->rows / hd;
		if (!(tmp = kv_alloc(KV_MEM_OTHER, (size_t)n * 4 + 64))) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto out;
		}
		memcpy(tmp, f, (size_t)n * 4);
		for (int64_t h = 0; h < heads; h++)
			for (int64_t half = 0; half < 2; half++)
				for (int64_t i = 0; i < hd / 2; i++)
					memcpy(f + (size_t)(h * hd + 2 * i + half) * (size_t)t->cols,
					       (float *)(void *)tmp + (size_t)(h * hd + half * (hd / 2) + i) * (size_t)t->cols,
					       (size_t)t->cols * 4);
		kv_free(tmp);
		tmp = NULL;
	}
	if (t->xf == KV_GGUF_XF_NEGEXP)
		for (uint64_t i = 0; i < n; i++)
			f[i] = -expf(f[i]);
	if (kv_gguf_vperm(t->c) && (t->xf == KV_GGUF_XF_VROWS || t->xf == KV_GGUF_XF_VCOLS || t->xf == KV_GGUF_XF_NEGEXP)) {
		if (!(tmp = kv_alloc(KV_MEM_OTHER, (size_t)n * 4 + 64))) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto out;
		}
		if (t->xf == KV_GGUF_XF_VCOLS) {
			kv_gguf_perm_cols(t->c, (uint8_t *)f, t->rows, (size_t)t->cols * 4, (size_t)t->c->lin_v_dim * 4, 1, tmp);
		} else {
			int64_t voff, vrow;
			kv_gguf_vrows(t->c, t->gg, &voff, &vrow);
			/* a vector's "rows" are its elements */
			size_t rb = t->src->ndim == 1 ? 4 : (size_t)(n / (uint64_t)t->rows) * 4;
			kv_gguf_perm_rows(t->c, (uint8_t *)f, rb, voff, vrow, 1, tmp);
		}
	}
	uint64_t rb = kv_dtype_row_bytes(t->dt, (uint64_t)t->cols);
	if (rb * (uint64_t)t->rows != nbytes) {
		rc = kv_fail(KV_ERR_INVALID, "internal: '%s' size", t->gg);
		goto out;
	}
	/* Row 0 on this thread (an unsupported type or length fails here, with
	 * its message), the rest on the pool: each row is quantized on its own,
	 * so the bytes do not depend on the threads (the K types' search takes
	 * minutes for a real-size model on one core). */
	if (t->rows > 0)
		rc = kq_quant_row(t->dt, f, dst, (size_t)t->cols);
	if (!rc && t->rows > 1) {
		struct quant_rows q = {.dt = t->dt, .f = f, .dst = dst, .cols = (size_t)t->cols, .rb = (size_t)rb};
		kv_pool_for(kv_pool_global(), (size_t)t->rows - 1, 8, quant_rows_fn, &q);
		if (q.failed)
			rc = kv_fail(KV_ERR_INVALID, "quantize: '%s' to %s failed on a row", t->gg,
				     kv_dtype_name(t->dt));
	}
out:
	kv_free(tmp);
	kv_free(f);
	return rc;
}

/* gpt-oss's expert tensors from the release's layout: MXFP4 blocks (rows
 * split into gate = even, up = odd for gate_up) repacked to ggml's MXFP4
 * as they are, or dequantized for a float file; the [E][2I] bias split
 * the same way. */
static int oss_fill(void *ctx, void *dst, uint64_t nbytes)
{
	struct conv_t *t = ctx;
	uint64_t rows = (uint64_t)t->rows, cols = (uint64_t)t->cols;
	uint64_t rb = kv_dtype_row_bytes(t->dt, cols);
	int rc = KV_OK;
	if (rb * rows != nbytes)
		return kv_fail(KV_ERR_INVALID, "internal: '%s' size", t->gg);
	float *f = kv_alloc(KV_MEM_OTHER, (size_t)cols * 4 + 64), *g = NULL;
	if (!f)
		return kv_fail(KV_ERR_NOMEM, "out of memory converting '%s'", t->gg);
	if (t->oss == 2) { /* bias [E][2I] -> [E][I] */
		uint64_t E = rows, w = cols * (t->split ? 2 : 1);
		if (!(g = kv_alloc(KV_MEM_OTHER, (size_t)w * 4 + 64))) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto out;
		}
		for (uint64_t e = 0; e < E && !rc; e++) {
			if ((rc = kv_tensor_to_f32(t->src, g, e * w, w)))
				break;
			for (uint64_t i = 0; i < cols; i++)
				f[i] = t->split ? g[2 * i + (uint64_t)(t->split - 1)] : g[i];
			rc = kq_quant_row(t->dt, f, (uint8_t *)dst + e * rb, (size_t)cols);
		}
		goto out;
	}
	/* MXFP4 blocks: source row of output row r */
	uint64_t nb = cols / 32, per = (uint64_t)t->shape[1];
	const uint8_t *B = t->src->data, *S = t->src2->data;
	for (uint64_t r = 0; r < rows && !rc; r++) {
		uint64_t e = r / per, i = r % per;
		uint64_t sr = t->split ? e * 2 * per + 2 * i + (uint64_t)(t->split - 1) : r;
		uint8_t *o = (uint8_t *)dst + r * rb;
		if (t->dt == KV_DT_MXFP4) {
			kq_mxfp4_from_hf(B + sr * nb * 16, S + sr * nb, nb, o);
			continue;
		}
		uint8_t tmpb[17 * 64];
		for (uint64_t b0 = 0; b0 < nb; b0 += 64) {
			uint64_t k = nb - b0 < 64 ? nb - b0 : 64;
			kq_mxfp4_from_hf(B + (sr * nb + b0) * 16, S + sr * nb + b0, k, tmpb);
			if ((rc = kq_dequant_row(KV_DT_MXFP4, tmpb, f + b0 * 32, (size_t)k * 32)))
				break;
		}
		if (!rc)
			rc = kq_quant_row(t->dt, f, o, (size_t)cols);
	}
out:
	kv_free(g);
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
	if (kv_gguf_pre_name(re))
		pre_name = kv_gguf_pre_name(re);
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

/* The metadata writers below set <arch>.<key> through w, a (the arch
 * name), k (a key buffer) and rc (the first error wins); SETA writes a
 * per-layer array of L values. */
#define SETU(key, v) \
	do { snprintf(k, sizeof k, "%s.%s", a, key); if (!rc) rc = kv_ggufw_set_u32(w, k, (uint32_t)(v)); } while (0)
#define SETF(key, v) \
	do { snprintf(k, sizeof k, "%s.%s", a, key); if (!rc) rc = kv_ggufw_set_f32(w, k, (float)(v)); } while (0)
#define SETA(key, v) \
	do { snprintf(k, sizeof k, "%s.%s", a, key); if (!rc) rc = kv_ggufw_set_arr_i32(w, k, (size_t)L, v); } while (0)

/*
 * gemma4's keys as llama.cpp's converter writes them: per-layer arrays for
 * the sliding flags and the KV heads, the global layers' head size as
 * key_length (and rope.dimension_count), the sliding layers' as *_swa,
 * the no-feature keys (per-layer embeddings, shared KV layers) as 0.
 * attention_k_eq_v needs no key: the global layers have no attn_v.
 */
static int conv_meta_gemma4(struct kv_ggufw *w, const struct kv_model_config *c, const char *a)
{
	char k[128];
	int rc = KV_OK, L = c->n_layers;
	int32_t *swa = calloc((size_t)L, sizeof *swa), *kvh = calloc((size_t)L, sizeof *kvh);
	if (!swa || !kvh) {
		free(swa);
		free(kvh);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	for (int l = 0; l < L; l++) {
		swa[l] = c->layer_window[l];
		kvh[l] = kv_config_layer_kv_heads(c, l);
	}
	SETA("attention.head_count_kv", kvh);
	SETU("attention.sliding_window", c->sliding_window > 0 ? c->sliding_window : 512);
	SETA("attention.sliding_window_pattern", swa);
	SETU("attention.key_length_swa", kv_config_swa_head_dim(c));
	SETU("attention.value_length_swa", kv_config_swa_head_dim(c));
	SETU("rope.dimension_count_swa", c->local_rotary_dim ? c->local_rotary_dim : kv_config_swa_head_dim(c));
	SETF("rope.freq_base_swa", c->rope_local_theta);
	SETU("attention.shared_kv_layers", c->n_kv_shared);
	SETU("embedding_length_per_layer_input", c->ple_dim);
	for (int l = 0; l < L; l++) /* the MLP widths (double-wide KV-shared layers) */
		kvh[l] = kv_config_layer_intermediate(c, l);
	SETA("feed_forward_length", kvh);
	if (c->final_softcap > 0)
		SETF("final_logit_softcapping", c->final_softcap);
	free(swa);
	free(kvh);
	return rc;
}

/*
 * llama / gemma3 / gpt-oss keys (gguf_model.c reads them back). What
 * llama.cpp's loaders cannot hold is refused naming the field: a sliding
 * pattern other than "every p-th layer global", a gemma3 softmax scale
 * other than the one llama.cpp computes.
 */
static int conv_meta_window(struct kv_ggufw *w, const struct kv_model_config *c, const char *a)
{
	char k[128];
	int rc = KV_OK;
	if (c->arch == KV_ARCH_GEMMA4)
		return conv_meta_gemma4(w, c, a);
	if (c->n_swa_layers) {
		int per = 0;
		for (int l = 0; l < c->n_layers && !per; l++)
			if (!c->layer_window[l])
				per = l + 1;
		for (int l = 0; l < c->n_layers && per; l++)
			if (c->layer_window[l] != (l % per < per - 1))
				per = 0;
		if (!per)
			return kv_fail(KV_ERR_UNSUPPORTED, "convert: %s GGUF: layer_types must make every p-th layer global "
				       "(llama.cpp's sliding_window_pattern)", a);
		snprintf(k, sizeof k, "%s.attention.sliding_window", a);
		rc = kv_ggufw_set_u32(w, k, (uint32_t)c->sliding_window);
		snprintf(k, sizeof k, "%s.attention.sliding_window_pattern", a);
		if (!rc)
			rc = kv_ggufw_set_u32(w, k, (uint32_t)per);
	}
	if (!rc && c->arch == KV_ARCH_GEMMA3) {
		double want = c->n_layers == 62 ? (double)c->hidden / c->n_heads : (double)c->head_dim;
		if (fabs(c->attn_scale - 1.0 / sqrt(want)) > 1e-9)
			return kv_fail(KV_ERR_UNSUPPORTED, "convert: gemma3 GGUF: query_pre_attn_scalar must be %g, the "
				       "scale llama.cpp computes for %d layers", want, c->n_layers);
		snprintf(k, sizeof k, "%s.rope.freq_base_swa", a);
		rc = kv_ggufw_set_f32(w, k, (float)c->rope_local_theta);
		snprintf(k, sizeof k, "%s.final_logit_softcapping", a);
		if (!rc && c->final_softcap > 0)
			rc = kv_ggufw_set_f32(w, k, (float)c->final_softcap);
	}
	if (!rc && (c->rope_scaling == KV_ROPE_LINEAR || c->rope_scaling == KV_ROPE_YARN)) {
		snprintf(k, sizeof k, "%s.rope.scaling.type", a);
		rc = kv_ggufw_set_str(w, k, c->rope_scaling == KV_ROPE_LINEAR ? "linear" : "yarn");
		snprintf(k, sizeof k, "%s.rope.scaling.factor", a);
		if (!rc)
			rc = kv_ggufw_set_f32(w, k, (float)c->rope_factor);
		if (!rc && c->rope_scaling == KV_ROPE_YARN) {
			snprintf(k, sizeof k, "%s.rope.scaling.original_context_length", a);
			rc = kv_ggufw_set_u32(w, k, (uint32_t)c->rope_orig_max_pos);
			snprintf(k, sizeof k, "%s.rope.scaling.yarn_beta_fast", a);
			if (!rc)
				rc = kv_ggufw_set_f32(w, k, (float)c->rope_beta_fast);
			snprintf(k, sizeof k, "%s.rope.scaling.yarn_beta_slow", a);
			if (!rc)
				rc = kv_ggufw_set_f32(w, k, (float)c->rope_beta_slow);
		}
	}
	return rc;
}

/* rope_freqs, the factor each inverse frequency is divided by, as
 * llama.cpp's converter writes it: llama3's (1 for short waves, factor for
 * long ones, the blend's inverse between); gemma4's global layers'
 * "proportional" RoPE (1 for the rope_rot_pairs frequencies that rotate,
 * 1e30, a frequency of ~0, for the others). */
static int rope_freqs_fill(void *ctx, void *dst, uint64_t nbytes)
{
	const struct kv_model_config *c = ctx;
	int half = c->rotary_dim / 2;
	if (nbytes != (uint64_t)half * 4)
		return kv_fail(KV_ERR_INVALID, "internal: rope_freqs size");
	float *o = dst;
	if (c->arch == KV_ARCH_GEMMA4) {
		for (int i = 0; i < half; i++)
			o[i] = i < c->rope_rot_pairs || !c->rope_rot_pairs ? 1.0f : 1e30f;
		return KV_OK;
	}
	double fac = c->rope_factor, lo = c->rope_low_freq, hi = c->rope_high_freq, om = c->rope_orig_max_pos;
	for (int i = 0; i < half; i++) {
		double inv = 1.0 / pow(c->rope_theta, (double)(2 * i) / c->rotary_dim), wl = 2 * M_PI / inv;
		if (wl < om / hi)
			o[i] = 1.0f;
		else if (wl > om / lo)
			o[i] = (float)fac;
		else {
			double sm = (om / wl - lo) / (hi - lo);
			o[i] = (float)(1.0 / ((1 - sm) / fac + sm));
		}
	}
	return KV_OK;
}

/* granitehybrid / nemotron_h, as llama.cpp's converter writes them: the
 * layer pattern in per-layer arrays (head_count_kv 0 on Mamba layers;
 * nemotron_h's feed_forward_length non-zero on MLP layers), ssm.*,
 * Granite's multipliers, no RoPE (rope.scaling.finetuned false). */
static int conv_meta_ssm(struct kv_ggufw *w, const struct kv_model_config *c, const char *a)
{
	char k[128];
	int rc = KV_OK, L = c->n_layers;
	int32_t *kvh = calloc((size_t)L, sizeof *kvh), *ff = calloc((size_t)L, sizeof *ff);
	if (!kvh || !ff) {
		free(kvh);
		free(ff);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	for (int l = 0; l < L; l++) {
		kvh[l] = c->layer_type[l] == KV_LAYER_ATTN ? c->n_kv_heads : 0;
		ff[l] = c->layer_type[l] == KV_LAYER_MLP ? c->intermediate : 0;
	}
	SETU("context_length", 1u << 20); /* no RoPE: llama.cpp's converter writes 2^20 */
	SETU("embedding_length", c->hidden);
	SETU("attention.head_count", c->n_heads);
	SETA("attention.head_count_kv", kvh);
	SETU("attention.key_length", c->head_dim);
	SETU("attention.value_length", c->head_dim);
	SETF("attention.layer_norm_rms_epsilon", c->rms_eps);
	SETU("ssm.conv_kernel", c->conv_kernel);
	SETU("ssm.state_size", c->ssm_state);
	SETU("ssm.group_count", c->ssm_groups);
	SETU("ssm.inner_size", c->ssm_heads * c->ssm_head_dim);
	SETU("ssm.time_step_rank", c->ssm_heads);
	if (c->arch == KV_ARCH_NEMOTRON_H) {
		SETA("feed_forward_length", ff);
		SETF("attention.layer_norm_epsilon", c->rms_eps); /* its loader requires it */
	} else {
		/* n_ff: an expert's width (MoE), else the dense shared_mlp's */
		SETU("feed_forward_length", c->n_moe_layers ? c->moe_intermediate : c->shared_intermediate);
		SETF("attention.scale", c->attn_scale);
		SETF("embedding_scale", c->embed_mult);
		SETF("residual_scale", c->residual_mult);
		SETF("logit_scale", c->logits_div);
		snprintf(k, sizeof k, "%s.rope.scaling.finetuned", a);
		if (!rc)
			rc = kv_ggufw_set_bool(w, k, 0);
		if (c->n_moe_layers) {
			SETU("expert_count", c->n_experts);
			SETU("expert_used_count", c->n_experts_per_tok);
			SETU("expert_shared_feed_forward_length", c->shared_intermediate);
		}
	}
	free(kvh);
	free(ff);
	return rc;
}

static int conv_meta(struct kv_ggufw *w, const struct kv_model_config *c, int ftype, int n_mtp)
{
	char k[128];
	const char *a = kv_gguf_arch(c);
	int rc = KV_OK;
	if ((rc = kv_ggufw_set_str(w, "general.architecture", a)) ||
	    (rc = kv_ggufw_set_str(w, "general.name", "kvkeep convert")) ||
	    (rc = kv_ggufw_set_u32(w, "general.file_type", (uint32_t)ftype)) ||
	    (rc = kv_ggufw_set_u32(w, "general.quantization_version", 2)))
		return rc;
	/* llama.cpp counts the MTP layers in block_count */
	SETU("block_count", c->n_layers + n_mtp);
	if (n_mtp)
		SETU("nextn_predict_layers", n_mtp);
	if (c->ssm) {
		rc = conv_meta_ssm(w, c, a);
		return rc;
	}
	SETU("context_length", c->max_positions > 0 ? c->max_positions : 32768);
	SETU("embedding_length", c->hidden);
	if (c->arch != KV_ARCH_GEMMA4) /* gemma4: a per-layer array (conv_meta_gemma4) */
		SETU("feed_forward_length", c->intermediate);
	SETU("attention.head_count", c->n_heads);
	if (c->arch != KV_ARCH_GEMMA4) /* gemma4: a per-layer array (conv_meta_gemma4) */
		SETU("attention.head_count_kv", c->n_kv_heads);
	SETU("attention.key_length", c->head_dim);
	SETU("attention.value_length", c->head_dim);
	SETF("rope.freq_base", c->rope_theta);
	SETU("rope.dimension_count", c->rotary_dim);
	SETF("attention.layer_norm_rms_epsilon", c->rms_eps);
	if (kv_arch_window_family(c->arch) && (rc = conv_meta_window(w, c, a)))
		return rc;
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
		if (!rc && c->arch != KV_ARCH_QWEN3_NEXT) /* qwen3next: plain NeoX RoPE */
			rc = kv_ggufw_set_arr_i32(w, k, 4, sec);
	}
	if (c->n_moe_layers && (c->moe_kind == KV_MOE_OAI || c->moe_kind == KV_MOE_GEMMA4)) {
		SETU("expert_count", c->n_experts);
		SETU("expert_used_count", c->n_experts_per_tok);
		SETU("expert_feed_forward_length", c->moe_intermediate);
	} else if (c->n_moe_layers) {
		SETU("expert_count", c->n_experts);
		SETU("expert_used_count", c->n_experts_per_tok);
		SETU("expert_feed_forward_length", c->moe_intermediate);
		SETU("expert_shared_feed_forward_length", c->shared_intermediate);
	}
	return rc;
}

/* What llama.cpp's qwen35moe / qwen3next graphs can run: every layer
 * sparse for qwen3next (its loader has no dense MLP), top-k weights
 * renormalised (both graphs pass norm_w = true), value heads as wide as
 * key heads (the loaders size them by ssm.state_size). */
static int conv_check_moe(const struct kv_model_config *c)
{
	/* Granite's gated norm spans the whole width in transformers and each
	 * of the n_groups groups in llama.cpp: the same only for one group */
	if (c->arch == KV_ARCH_GRANITE_HYBRID && c->ssm_groups != 1)
		return kv_fail(KV_ERR_UNSUPPORTED, "convert: granitehybrid GGUF: llama.cpp normalises the Mamba output "
			       "per group, transformers over the whole width; mamba_n_groups %d cannot be written",
			       c->ssm_groups);
	if (c->ssm)
		return KV_OK;
	if (c->arch == KV_ARCH_QWEN3_NEXT && c->n_moe_layers != c->n_layers)
		return kv_fail(KV_ERR_UNSUPPORTED, "convert: qwen3next GGUF: llama.cpp's qwen3next has a sparse MoE block "
			       "on every layer; this config has %d dense layer(s) (mlp_only_layers / decoder_sparse_step)",
			       c->n_layers - c->n_moe_layers);
	if (c->n_moe_layers && !c->norm_topk_prob)
		return kv_fail(KV_ERR_UNSUPPORTED, "convert: %s GGUF: llama.cpp always renormalises the top-k routing "
			       "weights; norm_topk_prob false cannot be written", kv_gguf_arch(c));
	if (c->n_moe_layers && c->lin_k_dim != c->lin_v_dim)
		return kv_fail(KV_ERR_UNSUPPORTED, "convert: %s GGUF: llama.cpp sizes value heads by ssm.state_size; "
			       "linear_value_head_dim %d differs from linear_key_head_dim %d", kv_gguf_arch(c), c->lin_v_dim,
			       c->lin_k_dim);
	return KV_OK;
}

/* A new output tensor with room for npc pieces. */
static struct conv_t *conv_new(struct conv_t *ct, size_t *nt, const struct kv_model_config *c, const char *gg,
			       int npc)
{
	struct conv_t *t = &ct[*nt];
	memset(t, 0, sizeof *t);
	if (!(t->pc = calloc((size_t)npc, sizeof *t->pc)))
		return NULL;
	t->c = c;
	snprintf(t->gg, sizeof t->gg, "%s", gg);
	(*nt)++;
	return t;
}

static void conv_add(struct conv_t *t, const struct kv_tensor *src, int64_t r0, int64_t rows)
{
	if (!t->npc)
		t->src = src;
	t->pc[t->npc].src = src;
	t->pc[t->npc].r0 = r0;
	t->pc[t->npc].rows = rows;
	t->npc++;
	t->rows += rows;
}

/* The MTP head's tensors appended to spec (n_mtp 1), when the folder has
 * one (kv_gguf_convert). */
static int conv_mtp_specs(const struct kv_model_config *c, const struct kv_weights *wt, struct kv_tensor_spec **spec,
			  size_t *ns, int *n_mtp)
{
	int rc;
	if (!c->hybrid || !kv_weights_find(wt, "mtp.fc.weight"))
		return KV_OK;
	struct kv_tensor_spec *mt = NULL, *all;
	size_t nm = 0;
	struct kv_model_config cm = *c;
	kv_config_detect_experts(&cm, wt, "mtp.");
	if ((rc = kv_config_mtp_tensors(&cm, kv_weights_find(wt, "mtp.layers.0.mlp.gate.weight") != NULL, &mt, &nm)))
		return rc;
	if (!(all = realloc(*spec, (*ns + nm) * sizeof **spec))) {
		free(mt);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	*spec = all;
	memcpy(*spec + *ns, mt, nm * sizeof *mt);
	*ns += nm;
	free(mt);
	*n_mtp = 1;
	return KV_OK;
}

/* Write the file, or its split parts (kv_gguf_convert). */
static int conv_write(struct kv_ggufw *w, const struct kv_gguf_convert_params *p)
{
	int rc;
	if (p->split_max_bytes || p->split_max_tensors) {
		char pre[4096];
		size_t ol = strlen(p->out);
		if (ol >= 5 && !strcmp(p->out + ol - 5, ".gguf"))
			ol -= 5;
		if (ol == 0 || ol >= sizeof pre)
			return kv_fail(KV_ERR_INVALID, "convert: bad output name '%s'", p->out);
		memcpy(pre, p->out, ol);
		pre[ol] = 0;
		return kv_ggufw_write_split(w, pre, p->split_max_bytes, p->split_max_tensors, p->dw_flags, p->n_files);
	}
	if ((rc = kv_ggufw_write(w, p->out, p->dw_flags)))
		return rc;
	if (p->n_files)
		*p->n_files = 1;
	return KV_OK;
}

/* The GGUF tensors o[0..nout) of one HF tensor: their dtype (the file
 * type's mix for matrices, F32 otherwise, MXFP4 for gpt-oss's experts)
 * and transform, added to w (kv_gguf_convert). */
static int conv_add_outs(struct kv_ggufw *w, const struct kv_gguf_convert_params *p, const struct kv_model_config *c,
			 const struct kq_mix_ctx *mix, struct conv_t **o, int nout, const char *name, int role, int layer,
			 int *i_v, int *i_down, uint64_t *total)
{
	int rc, is_mtp = !strncmp(name, "mtp.", 4);
	for (int j = 0; j < nout; j++) {
		struct conv_t *t = o[j];
		t->cols = t->shape[t->ndim - 1];
		if (t->ndim == 1)
			t->rows = 1;
		t->xf = KV_GGUF_XF_NONE;
		const char *suffix = strchr(t->gg, '.');
		int xf;
		if (!strncmp(t->gg, "blk.", 4) && suffix && kv_gguf_layer_hf(c, strchr(suffix + 1, '.') + 1, &xf))
			t->xf = xf;
		if (!strcmp(t->gg, "output_norm.weight"))
			t->xf = KV_GGUF_XF_NORM1;
		if (is_mtp && kv_gguf_nextn_gg(name, &xf))
			t->xf = xf;
		int is_mat = t->ndim >= 2 && (role == KV_ROLE_EMBED || role == KV_ROLE_LM_HEAD ||
					      role == KV_ROLE_LINEAR || role == KV_ROLE_LINEAR_OUT ||
					      role == KV_ROLE_LINEAR_A);
		if (t->oss) {
			/* gpt-oss experts: float files dequantize them, the others keep
			 * the release's MXFP4 (as llama.cpp's converter does) */
			int fl = p->ftype == KQ_FTYPE_F32 || p->ftype == KQ_FTYPE_F16 || p->ftype == KQ_FTYPE_BF16;
			t->cols = t->oss == 2 ? t->shape[1] : t->shape[2];
			t->dt = t->oss == 2 ? KV_DT_F32
				: !fl ? KV_DT_MXFP4 : p->ftype == KQ_FTYPE_F32 ? KV_DT_F32
				: p->ftype == KQ_FTYPE_F16 ? KV_DT_F16 : KV_DT_BF16;
			if ((rc = kv_ggufw_add_fill(w, t->gg, t->dt, t->ndim, t->shape, oss_fill, t)))
				return rc;
			*total += kv_dtype_row_bytes(t->dt, (uint64_t)t->cols) * (uint64_t)t->rows;
			continue;
		}
		if (is_mat) {
			/* llama.cpp counts ffn_down tensors, not layers (equal unless some
			 * layers have none, as Nemotron-H's Mamba and attention layers) */
			int ml = strstr(t->gg, "ffn_down.") && c->ssm ? (*i_down)++ : layer;
			t->dt = kq_ftype_tensor_dtype(p->ftype, mix, t->gg, ml, *i_v, t->cols);
			if (strstr(t->gg, "attn_v.weight") || strstr(t->gg, "attn_qkv.weight"))
				(*i_v)++;
		} else {
			t->dt = KV_DT_F32; /* norms, conv, dt, A, the router (llama.cpp keeps ffn_gate_inp F32) */
		}
		if ((rc = kv_ggufw_add_fill(w, t->gg, t->dt, t->ndim, t->shape, conv_fill, t)))
			return rc;
		*total += kv_dtype_row_bytes(t->dt, (uint64_t)t->cols) * (uint64_t)t->rows;
	}
	return KV_OK;
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
	if ((rc = conv_check_moe(&c)))
		return rc;
	if ((rc = kv_weights_open(p->hf_dir, &wt)) || (rc = kv_config_check_weights(&c, wt, prefix, sizeof prefix)) ||
	    (rc = kv_config_tensors(&c, prefix, &spec, &ns)))
		goto out;
	int n_mtp = 0;
	if ((rc = conv_mtp_specs(&c, wt, &spec, &ns, &n_mtp)))
		goto out;
	/* an HF tensor gives at most two GGUF tensors (gate_up_proj, in_proj_qkvz) */
	if (!(w = kv_ggufw_create()) || !(ct = calloc(2 * ns + 1, sizeof *ct))) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	if ((rc = conv_meta(w, &c, p->ftype, n_mtp)) || (rc = conv_tokenizer(w, p->hf_dir, &c)))
		goto out;
	struct kq_mix_ctx mix = {c.n_layers, c.n_layers, !c.tie_embeddings, c.n_moe_layers ? c.n_experts : 0,
				  c.n_kv_heads ? c.n_heads / c.n_kv_heads : 0};
	if (c.ssm) /* attn_v only on the attention layers (no attn_qkv on the Mamba ones) */
		mix.n_attn_v = c.n_attn_layers;
	int i_v = 0, i_down = 0;
	const int64_t E = c.n_experts, I = c.moe_intermediate, D = c.hidden, Is = c.shared_intermediate;
	for (size_t i = 0; i < ns; i++) {
		char hf[160], gg[96], ggb[96];
		const char *name = spec[i].name, *rest = NULL;
		const struct kv_tensor *src = kv_weights_find(wt, name);
		int layer = spec[i].layer, nout = 0, is_mtp = !strncmp(name, "mtp.", 4);
		/* where a layer's tensors sit in the folder: the MTP layer under mtp.layers.0. */
		const char *sprefix = is_mtp ? "mtp." : prefix;
		int slayer = is_mtp ? 0 : layer;
		struct conv_t *o[2] = {NULL, NULL};
		/* kv_config_tensors names with the folder's prefix; map as "model.". */
		if (is_mtp && !strncmp(name, "mtp.layers.0.", 13))
			snprintf(hf, sizeof hf, "model.layers.%d.%s", layer, name + 13);
		else if (!strncmp(name, prefix, strlen(prefix)))
			snprintf(hf, sizeof hf, "model.%s", name + strlen(prefix));
		else
			snprintf(hf, sizeof hf, "%s", name);
		if (layer >= 0 && strchr(hf + 13, '.'))
			rest = strchr(hf + 13, '.') + 1; /* after "model.layers.N." */
		if (spec[i].expert > 0 || spec[i].role == KV_ROLE_MXFP4_SCALES)
			continue; /* SPLIT experts: all stacked with expert 0; scales go with their blocks */
		if (!src) {
			rc = kv_fail(KV_ERR_INCOMPATIBLE, "convert: no tensor '%s'", name);
			goto out;
		}
		if (rest && c.moe_kind == KV_MOE_OAI && (spec[i].role == KV_ROLE_MXFP4_BLOCKS ||
							    (spec[i].role == KV_ROLE_BIAS && strstr(rest, "mlp.experts.")))) {
			/* gpt-oss's release: gate_up rows (and bias elements) interleaved */
			int gu = strstr(rest, "gate_up_proj") != NULL, blk = spec[i].role == KV_ROLE_MXFP4_BLOCKS;
			const struct kv_tensor *sc = NULL;
			if (blk) {
				char sn[192];
				snprintf(sn, sizeof sn, "%.*s_scales", (int)(strlen(name) - 7), name);
				if (!(sc = kv_weights_find(wt, sn))) {
					rc = kv_fail(KV_ERR_INCOMPATIBLE, "convert: no tensor '%s'", sn);
					goto out;
				}
			}
			for (int j = 0; j < (gu ? 2 : 1); j++) {
				snprintf(gg, sizeof gg, "blk.%d.ffn_%s_exps.%s", layer, gu ? (j ? "up" : "gate") : "down",
					 blk ? "weight" : "bias");
				if (!(o[j] = conv_new(ct, &nt, &c, gg, 1)))
					goto oom;
				o[j]->src = src;
				o[j]->src2 = sc;
				o[j]->oss = blk ? 1 : 2;
				o[j]->split = gu ? j + 1 : 0;
				o[j]->ndim = blk ? 3 : 2;
				o[j]->shape[0] = E;
				o[j]->shape[1] = gu ? I : D;
				o[j]->shape[2] = gu ? D : I;
				if (!blk)
					o[j]->shape[1] = gu ? I : D;
				o[j]->rows = blk ? E * o[j]->shape[1] : E;
			}
			nout = gu ? 2 : 1;
		} else if (spec[i].expert == 0) {
			/* mlp.experts.0.{gate,up,down}_proj.weight: stack the E experts */
			const char *which = strstr(rest, "gate_proj") ? "gate" : strstr(rest, "up_proj") ? "up" : "down";
			snprintf(gg, sizeof gg, "blk.%d.ffn_%s_exps.weight", layer, which);
			if (!(o[0] = conv_new(ct, &nt, &c, gg, (int)E)))
				goto oom;
			for (int64_t e = 0; e < E; e++) {
				char en[192];
				snprintf(en, sizeof en, "%slayers.%d.mlp.experts.%lld.%s_proj.weight", sprefix, slayer,
					 (long long)e, which);
				const struct kv_tensor *et = kv_weights_find(wt, en);
				if (!et || et->ndim != 2 || et->shape[0] != src->shape[0] || et->shape[1] != src->shape[1]) {
					rc = kv_fail(KV_ERR_INCOMPATIBLE, "convert: expert tensor '%s' missing or misshapen", en);
					goto out;
				}
				conv_add(o[0], et, 0, et->shape[0]);
			}
			o[0]->ndim = 3;
			o[0]->shape[0] = E;
			o[0]->shape[1] = src->shape[0];
			o[0]->shape[2] = src->shape[1];
			nout = 1;
		} else if (c.ssm && rest && !strcmp(rest, "shared_mlp.input_linear.weight")) {
			/* Granite's [2 Is][D] gate | up -> ffn_{gate,up}_shexp (MoE) or ffn_{gate,up} */
			const char *sx = c.n_moe_layers ? "_shexp" : "";
			snprintf(gg, sizeof gg, "blk.%d.ffn_gate%s.weight", layer, sx);
			snprintf(ggb, sizeof ggb, "blk.%d.ffn_up%s.weight", layer, sx);
			if (!(o[0] = conv_new(ct, &nt, &c, gg, 1)) || !(o[1] = conv_new(ct, &nt, &c, ggb, 1)))
				goto oom;
			conv_add(o[0], src, 0, Is);
			conv_add(o[1], src, Is, Is);
			for (int j = 0; j < 2; j++) {
				o[j]->ndim = 2;
				o[j]->shape[0] = Is;
				o[j]->shape[1] = D;
			}
			nout = 2;
		} else if (c.ssm && rest && !c.n_moe_layers && !strcmp(rest, "shared_mlp.output_linear.weight")) {
			snprintf(gg, sizeof gg, "blk.%d.ffn_down.weight", layer); /* dense Granite */
			if (!(o[0] = conv_new(ct, &nt, &c, gg, 1)))
				goto oom;
			conv_add(o[0], src, 0, D);
			o[0]->ndim = 2;
			o[0]->shape[0] = D;
			o[0]->shape[1] = Is;
			nout = 1;
		} else if (rest && (!strcmp(rest, "mlp.experts.gate_up_proj") ||
				    (c.ssm && !strcmp(rest, "block_sparse_moe.input_linear.weight")))) {
			/* [E][2I][D] -> ffn_gate_exps and ffn_up_exps [E][I][D] (llama.cpp's converter splits it) */
			snprintf(gg, sizeof gg, "blk.%d.ffn_gate_exps.weight", layer);
			snprintf(ggb, sizeof ggb, "blk.%d.ffn_up_exps.weight", layer);
			if (!(o[0] = conv_new(ct, &nt, &c, gg, (int)E)) || !(o[1] = conv_new(ct, &nt, &c, ggb, (int)E)))
				goto oom;
			for (int64_t e = 0; e < E; e++) {
				conv_add(o[0], src, e * 2 * I, I);
				conv_add(o[1], src, e * 2 * I + I, I);
			}
			for (int j = 0; j < 2; j++) {
				o[j]->ndim = 3;
				o[j]->shape[0] = E;
				o[j]->shape[1] = I;
				o[j]->shape[2] = D;
			}
			nout = 2;
		} else if (rest && !strcmp(rest, "linear_attn.in_proj_qkvz.weight")) {
			/* qwen3next: per key head [q dk, k dk, v per dv, z per dv] ->
			 * attn_qkv [q of all heads, k of all, v of all] + attn_gate [z] */
			const int64_t Hk = c.lin_k_heads, dk = c.lin_k_dim, pv = (int64_t)(c.lin_v_heads / Hk) * c.lin_v_dim,
				      G = 2 * dk + 2 * pv;
			snprintf(gg, sizeof gg, "blk.%d.attn_qkv.weight", layer);
			snprintf(ggb, sizeof ggb, "blk.%d.attn_gate.weight", layer);
			if (!(o[0] = conv_new(ct, &nt, &c, gg, 3 * (int)Hk)) || !(o[1] = conv_new(ct, &nt, &c, ggb, (int)Hk)))
				goto oom;
			for (int part = 0; part < 3; part++)
				for (int64_t k = 0; k < Hk; k++)
					conv_add(o[0], src, k * G + (part == 0 ? 0 : part == 1 ? dk : 2 * dk), part < 2 ? dk : pv);
			for (int64_t k = 0; k < Hk; k++)
				conv_add(o[1], src, k * G + 2 * dk + pv, pv);
			for (int j = 0; j < 2; j++) {
				o[j]->ndim = 2;
				o[j]->shape[0] = o[j]->rows;
				o[j]->shape[1] = D;
			}
			nout = 2;
		} else {
			const char *nx = is_mtp ? kv_gguf_nextn_gg(name, NULL) : NULL;
			if (nx)
				snprintf(gg, sizeof gg, "blk.%d.%s", layer, nx);
			else if (!kv_gguf_name_from_hf(&c, hf, gg, sizeof gg)) {
				rc = kv_fail(KV_ERR_INCOMPATIBLE, "convert: no GGUF name for tensor '%s'", name);
				goto out;
			}
			if (!(o[0] = conv_new(ct, &nt, &c, gg, 1)))
				goto oom;
			int64_t cols = src->shape[src->ndim - 1];
			conv_add(o[0], src, 0, (int64_t)(src->numel / (uint64_t)cols));
			size_t gl = strlen(gg);
			if (c.ssm && gl > 6 && (!strcmp(gg + gl - 6, ".ssm_a") || !strcmp(gg + gl - 6, ".ssm_d"))) {
				o[0]->ndim = 2; /* llama.cpp's {1, H}: [H][1] */
				o[0]->shape[0] = (int64_t)src->numel;
				o[0]->shape[1] = 1;
				o[0]->rows = o[0]->pc[0].rows = o[0]->shape[0];
			} else if (c.ssm && strstr(gg, ".ssm_norm.")) {
				o[0]->ndim = 2; /* {W / G, G}: [G][W / G] */
				o[0]->shape[0] = c.ssm_groups;
				o[0]->shape[1] = (int64_t)src->numel / c.ssm_groups;
				o[0]->rows = o[0]->pc[0].rows = c.ssm_groups;
			} else if (src->ndim == 1 || (rest && !strcmp(rest, "mlp.shared_expert_gate.weight"))) {
				o[0]->ndim = 1; /* llama.cpp's ffn_gate_inp_shexp is {n_embd} */
				o[0]->shape[0] = (int64_t)src->numel;
			} else if (src->ndim == 3 && strstr(gg, "_exps.")) {
				o[0]->ndim = 3; /* unquantized switch_mlp / stacked down_proj */
				memcpy(o[0]->shape, src->shape, sizeof o[0]->shape);
			} else {
				/* row-major 2-D view: conv1d [C, 1, K] -> [C, K] */
				o[0]->ndim = 2;
				o[0]->shape[0] = o[0]->rows;
				o[0]->shape[1] = cols;
			}
			nout = 1;
		}
		if ((rc = conv_add_outs(w, p, &c, &mix, o, nout, name, spec[i].role, layer, &i_v, &i_down, &total)))
			goto out;
	}
	if (c.rope_scaling == KV_ROPE_LLAMA3 || c.arch == KV_ARCH_GEMMA4) {
		/* llama.cpp keeps llama3's and gemma4's frequencies as a factor tensor */
		int64_t half = c.rotary_dim / 2;
		if ((rc = kv_ggufw_add_fill(w, "rope_freqs.weight", KV_DT_F32, 1, &half, rope_freqs_fill, &c)))
			goto out;
		total += (uint64_t)half * 4;
	}
	if ((rc = conv_write(w, p)))
		goto out;
	if (n_tensors)
		*n_tensors = nt;
	if (bytes)
		*bytes = total;
	goto out;
oom:
	rc = kv_fail(KV_ERR_NOMEM, "out of memory");
out:
	kv_ggufw_destroy(w);
	for (size_t i = 0; ct && i < nt; i++)
		free(ct[i].pc);
	free(ct);
	free(spec);
	kv_weights_close(wt);
	return rc;
}
