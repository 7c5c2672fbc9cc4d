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
#include "base/pool.h"

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
	if (c->arch == KV_ARCH_QWEN3_NEXT)
		return "qwen3next";
	if (c->hybrid)
		return c->n_moe_layers ? "qwen35moe" : "qwen35";
	return "qwen3";
}

/* The MoE tensors of a layer (llama.cpp's qwen35moe / qwen3next names).
 * The routed experts are stacks [E][rows][cols]: ffn_gate_exps and
 * ffn_up_exps [E][I][D], ffn_down_exps [E][D][I] (or llama.cpp's fused
 * ffn_gate_up_exps [E][2I][D], read only). They load under mlx-lm's
 * SwitchGLU names (or the HF stacked names for the fused one), which the
 * engine views per expert (engine/moe.c). ffn_gate_inp_shexp is 1-D [D]
 * where HF's shared_expert_gate is [1, D]. */
static const struct {
	const char *hf, *gg;
} g_moe[] = {
	{"mlp.gate.weight", "ffn_gate_inp.weight"},
	{"mlp.switch_mlp.gate_proj.weight", "ffn_gate_exps.weight"},
	{"mlp.switch_mlp.up_proj.weight", "ffn_up_exps.weight"},
	{"mlp.switch_mlp.down_proj.weight", "ffn_down_exps.weight"},
	{"mlp.experts.gate_up_proj", "ffn_gate_up_exps.weight"},
	{"mlp.experts.down_proj", "ffn_down_exps.weight"},
	{"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
	{"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
	{"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
	{"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
	/* qwen3next's fused DeltaNet projections: llama.cpp's converter splits
	 * in_proj_qkvz into attn_qkv + attn_gate; old files have ssm_in */
	{"linear_attn.in_proj_qkvz.weight", "ssm_in.weight"},
	{"linear_attn.in_proj_ba.weight", "ssm_ba.weight"},
};
#define N_MOE_MAP (sizeof g_moe / sizeof g_moe[0])

/* The MTP head's own tensors (Hugging Face `mtp.*`, llama.cpp's
 * blk.<n_layers>.nextn.*); its decoder layer maps as a layer does, from
 * mtp.layers.0.* to blk.<n_layers>.*. Its norms are (1 + w) norms. */
static const struct {
	const char *hf, *gg;
	int xf;
} g_nextn[] = {
	{"mtp.fc.weight", "nextn.eh_proj.weight", XF_NONE},
	{"mtp.pre_fc_norm_embedding.weight", "nextn.enorm.weight", XF_NORM1},
	{"mtp.pre_fc_norm_hidden.weight", "nextn.hnorm.weight", XF_NORM1},
	{"mtp.norm.weight", "nextn.shared_head_norm.weight", XF_NORM1},
};
#define N_NEXTN_MAP (sizeof g_nextn / sizeof g_nextn[0])

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
	for (size_t i = 0; i < N_MOE_MAP; i++)
		if (!strcmp(rest, g_moe[i].hf))
			return snprintf(buf, cap, "blk.%d.%s", layer, g_moe[i].gg), 1;
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

/* llama.cpp's qwen35 / qwen35moe converter tiles the value heads; its
 * qwen3next converter keeps Hugging Face's grouped order. */
static int needs_vperm(const struct kv_model_config *c)
{
	return c->hybrid && c->arch != KV_ARCH_QWEN3_NEXT && c->lin_k_heads != c->lin_v_heads;
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

/* A run of whole rows of a source tensor (cols elements each). */
struct piece {
	const struct kv_tensor *src;
	int64_t r0, rows;
};

struct conv_t {
	const struct kv_model_config *c;
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

static int conv_meta(struct kv_ggufw *w, const struct kv_model_config *c, int ftype, int n_mtp)
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
	/* llama.cpp counts the MTP layers in block_count */
	SETU("block_count", c->n_layers + n_mtp);
	if (n_mtp)
		SETU("nextn_predict_layers", n_mtp);
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
		if (!rc && c->arch != KV_ARCH_QWEN3_NEXT) /* qwen3next: plain NeoX RoPE */
			rc = kv_ggufw_set_arr_i32(w, k, 4, sec);
	}
	if (c->n_moe_layers) {
		SETU("expert_count", c->n_experts);
		SETU("expert_used_count", c->n_experts_per_tok);
		SETU("expert_feed_forward_length", c->moe_intermediate);
		SETU("expert_shared_feed_forward_length", c->shared_intermediate);
	}
#undef SETU
#undef SETF
	return rc;
}

/* What llama.cpp's qwen35moe / qwen3next graphs can run: every layer
 * sparse for qwen3next (its loader has no dense MLP), top-k weights
 * renormalised (both graphs pass norm_w = true), value heads as wide as
 * key heads (the loaders size them by ssm.state_size). */
static int conv_check_moe(const struct kv_model_config *c)
{
	if (c->arch == KV_ARCH_QWEN3_NEXT && c->n_moe_layers != c->n_layers)
		return kv_fail(KV_ERR_UNSUPPORTED, "convert: qwen3next GGUF: llama.cpp's qwen3next has a sparse MoE block "
			       "on every layer; this config has %d dense layer(s) (mlp_only_layers / decoder_sparse_step)",
			       c->n_layers - c->n_moe_layers);
	if (c->n_moe_layers && !c->norm_topk_prob)
		return kv_fail(KV_ERR_UNSUPPORTED, "convert: %s GGUF: llama.cpp always renormalises the top-k routing "
			       "weights; norm_topk_prob false cannot be written", arch_gguf(c));
	if (c->n_moe_layers && c->lin_k_dim != c->lin_v_dim)
		return kv_fail(KV_ERR_UNSUPPORTED, "convert: %s GGUF: llama.cpp sizes value heads by ssm.state_size; "
			       "linear_value_head_dim %d differs from linear_key_head_dim %d", arch_gguf(c), c->lin_v_dim,
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
	/* the MTP head (mtp.*) becomes llama.cpp's nextn layer after the others */
	int n_mtp = 0;
	if (c.hybrid && kv_weights_find(wt, "mtp.fc.weight")) {
		struct kv_tensor_spec *mt = NULL, *all;
		size_t nm = 0;
		struct kv_model_config cm = c;
		kv_config_detect_experts(&cm, wt, "mtp.");
		if ((rc = kv_config_mtp_tensors(&cm, kv_weights_find(wt, "mtp.layers.0.mlp.gate.weight") != NULL, &mt, &nm)))
			goto out;
		if (!(all = realloc(spec, (ns + nm) * sizeof *spec))) {
			free(mt);
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto out;
		}
		spec = all;
		memcpy(spec + ns, mt, nm * sizeof *mt);
		ns += nm;
		free(mt);
		n_mtp = 1;
	}
	/* an HF tensor gives at most two GGUF tensors (gate_up_proj, in_proj_qkvz) */
	if (!(w = kv_ggufw_create()) || !(ct = calloc(2 * ns + 1, sizeof *ct))) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	if ((rc = conv_meta(w, &c, p->ftype, n_mtp)) || (rc = conv_tokenizer(w, p->hf_dir, &c)))
		goto out;
	struct kq_mix_ctx mix = {c.n_layers, c.n_layers, !c.tie_embeddings, c.n_moe_layers ? c.n_experts : 0,
				  c.n_kv_heads ? c.n_heads / c.n_kv_heads : 0};
	int i_v = 0;
	const int64_t E = c.n_experts, I = c.moe_intermediate, D = c.hidden;
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
		if (spec[i].expert > 0)
			continue; /* SPLIT experts: all stacked with expert 0 */
		if (!src) {
			rc = kv_fail(KV_ERR_INCOMPATIBLE, "convert: no tensor '%s'", name);
			goto out;
		}
		if (spec[i].expert == 0) {
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
		} else if (rest && !strcmp(rest, "mlp.experts.gate_up_proj")) {
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
			int found = 0;
			for (size_t m = 0; m < N_NEXTN_MAP && is_mtp; m++)
				if (!strcmp(name, g_nextn[m].hf))
					found = snprintf(gg, sizeof gg, "blk.%d.%s", layer, g_nextn[m].gg) > 0;
			if (!found && !kv_gguf_name_from_hf(&c, hf, gg, sizeof gg)) {
				rc = kv_fail(KV_ERR_INCOMPATIBLE, "convert: no GGUF name for tensor '%s'", name);
				goto out;
			}
			if (!(o[0] = conv_new(ct, &nt, &c, gg, 1)))
				goto oom;
			int64_t cols = src->shape[src->ndim - 1];
			conv_add(o[0], src, 0, (int64_t)(src->numel / (uint64_t)cols));
			if (src->ndim == 1 || (rest && !strcmp(rest, "mlp.shared_expert_gate.weight"))) {
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
		for (int j = 0; j < nout; j++) {
			struct conv_t *t = o[j];
			t->cols = t->shape[t->ndim - 1];
			if (t->ndim == 1)
				t->rows = 1;
			t->xf = XF_NONE;
			const char *suffix = strchr(t->gg, '.');
			for (size_t m = 0; m < N_LAYER_MAP; m++)
				if (!strncmp(t->gg, "blk.", 4) && suffix && !strcmp(strchr(suffix + 1, '.') + 1, g_layer[m].gg) &&
				    applies(&g_layer[m], &c))
					t->xf = g_layer[m].xf;
			if (!strcmp(t->gg, "output_norm.weight"))
				t->xf = XF_NORM1;
			for (size_t m = 0; m < N_NEXTN_MAP && is_mtp; m++)
				if (strstr(t->gg, g_nextn[m].gg))
					t->xf = g_nextn[m].xf;
			int role = spec[i].role;
			int is_mat = t->ndim >= 2 && (role == KV_ROLE_EMBED || role == KV_ROLE_LM_HEAD ||
						      role == KV_ROLE_LINEAR || role == KV_ROLE_LINEAR_OUT ||
						      role == KV_ROLE_LINEAR_A);
			if (is_mat) {
				t->dt = kq_ftype_tensor_dtype(p->ftype, &mix, t->gg, layer, i_v, t->cols);
				if (strstr(t->gg, "attn_v.weight") || strstr(t->gg, "attn_qkv.weight"))
					i_v++;
			} else {
				t->dt = KV_DT_F32; /* norms, conv, dt, A, the router (llama.cpp keeps ffn_gate_inp F32) */
			}
			if ((rc = kv_ggufw_add_fill(w, t->gg, t->dt, t->ndim, t->shape, conv_fill, t)))
				goto out;
			total += kv_dtype_row_bytes(t->dt, (uint64_t)t->cols) * (uint64_t)t->rows;
		}
	}
	if (p->split_max_bytes || p->split_max_tensors) {
		char pre[4096];
		size_t ol = strlen(p->out);
		if (ol >= 5 && !strcmp(p->out + ol - 5, ".gguf"))
			ol -= 5;
		if (ol == 0 || ol >= sizeof pre) {
			rc = kv_fail(KV_ERR_INVALID, "convert: bad output name '%s'", p->out);
			goto out;
		}
		memcpy(pre, p->out, ol);
		pre[ol] = 0;
		if ((rc = kv_ggufw_write_split(w, pre, p->split_max_bytes, p->split_max_tensors, p->dw_flags, p->n_files)))
			goto out;
	} else {
		if ((rc = kv_ggufw_write(w, p->out, p->dw_flags)))
			goto out;
		if (p->n_files)
			*p->n_files = 1;
	}
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

/* Every MoE layer's tensors present with llama.cpp's shapes (row-major
 * here, ggml's ne reversed), so a broken file fails naming the GGUF
 * tensor rather than the Hugging Face name the engine looks up. */
static int check_moe(const struct kv_gguf *g, const struct kv_model_config *c)
{
	const int64_t E = c->n_experts, I = c->moe_intermediate, Is = c->shared_intermediate, D = c->hidden;
	for (int l = 0; l < c->n_layers; l++) {
		if (!c->layer_moe[l])
			continue;
		char n[96];
		snprintf(n, sizeof n, "blk.%d.ffn_gate_up_exps.weight", l);
		int fused = kv_gguf_tensor_find(g, n) != NULL;
		const struct {
			const char *name;
			int ndim;
			int64_t s0, s1, s2;
		} want[] = {
			{"ffn_gate_inp.weight", 2, E, D, 0},
			{fused ? "ffn_gate_up_exps.weight" : "ffn_gate_exps.weight", 3, E, fused ? 2 * I : I, D},
			{fused ? NULL : "ffn_up_exps.weight", 3, E, I, D},
			{"ffn_down_exps.weight", 3, E, D, I},
			{"ffn_gate_shexp.weight", 2, Is, D, 0},
			{"ffn_up_shexp.weight", 2, Is, D, 0},
			{"ffn_down_shexp.weight", 2, D, Is, 0},
			{"ffn_gate_inp_shexp.weight", 1, D, 0, 0},
		};
		for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
			if (!want[i].name)
				continue;
			int64_t ws[3] = {want[i].s0, want[i].s1, want[i].s2};
			char a[96], b[96];
			snprintf(n, sizeof n, "blk.%d.%s", l, want[i].name);
			const struct kv_tensor *t = kv_gguf_tensor_find(g, n);
			if (!t)
				return kv_fail(KV_ERR_INCOMPATIBLE, "%s: GGUF lacks expert tensor '%s' (expected shape %s)",
					       kv_gguf_path(g), n, kv_shape_str(want[i].ndim, ws, a, sizeof a));
			int ok = t->ndim == want[i].ndim;
			for (int d = 0; ok && d < t->ndim; d++)
				ok = t->shape[d] == ws[d];
			if (want[i].ndim == 1 && t->ndim == 2 && t->shape[0] == 1 && t->shape[1] == ws[0])
				ok = 1; /* ffn_gate_inp_shexp written as {n_embd, 1}: the same values */
			if (!ok)
				return kv_fail(KV_ERR_INCOMPATIBLE, "%s: expert tensor '%s' has shape %s, expected %s",
					       kv_gguf_path(g), n, kv_shape_str(t->ndim, t->shape, b, sizeof b),
					       kv_shape_str(want[i].ndim, ws, a, sizeof a));
		}
	}
	return KV_OK;
}

int kv_gguf_config(const struct kv_gguf *g, struct kv_model_config *out)
{
	char *arch = NULL;
	json_t *o = json_object();
	int64_t v;
	double f;
	int rc, hybrid, moe, next;
	memset(out, 0, sizeof *out);
	if (!o)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	if ((rc = kv_gguf_get_str(g, "general.architecture", &arch)))
		goto out;
	if (strcmp(arch, "qwen3") && strcmp(arch, "qwen35") && strcmp(arch, "qwen35moe") && strcmp(arch, "qwen3next")) {
		rc = kv_fail(KV_ERR_UNSUPPORTED, "%s: GGUF architecture '%s' (kvkeep runs qwen3, qwen35, qwen35moe and "
			     "qwen3next)", kv_gguf_path(g), arch);
		goto out;
	}
	hybrid = strcmp(arch, "qwen3") != 0;
	moe = !strcmp(arch, "qwen35moe") || !strcmp(arch, "qwen3next");
	next = !strcmp(arch, "qwen3next");
	json_object_set_new(o, "model_type", json_string(next ? "qwen3_next" : moe ? "qwen3_5_moe_text" : hybrid ? "qwen3_5_text" : "qwen3"));
	if (next) {
		/* llama.cpp's qwen3next graph: every layer sparse, top-k renormalised */
		json_object_set_new(o, "norm_topk_prob", json_true());
		json_object_set_new(o, "decoder_sparse_step", json_integer(1));
		json_object_set_new(o, "mlp_only_layers", json_array());
	}
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
		{"expert_count", "num_experts", 3},
		{"expert_used_count", "num_experts_per_tok", 3},
		{"expert_feed_forward_length", "moe_intermediate_size", 4},
		{"expert_shared_feed_forward_length", "shared_expert_intermediate_size", 4},
	};
	for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
		if ((ints[i].required == 2 && !hybrid) || (ints[i].required >= 3 && !moe))
			continue;
		rc = get_u(g, arch, ints[i].gg, &v);
		/* a MoE text config may have no dense intermediate_size; the expert
		 * sizes have llama.cpp's fallbacks below */
		if (rc == KV_ERR_NOT_FOUND && (!ints[i].required || ints[i].required == 4 ||
						 (moe && !strcmp(ints[i].gg, "feed_forward_length"))))
			continue;
		if (rc)
			goto out;
		json_object_set_new(o, ints[i].hf, json_integer(v));
	}
	kv_errclear();
	if (moe) {
		/* llama.cpp: n_ff_exp = n_ff / n_expert_used and n_ff_shexp = n_ff
		 * when the keys are absent */
		int64_t ff = json_integer_value(json_object_get(o, "intermediate_size")),
			k = json_integer_value(json_object_get(o, "num_experts_per_tok"));
		if (!json_object_get(o, "moe_intermediate_size") && ff > 0 && k > 0)
			json_object_set_new(o, "moe_intermediate_size", json_integer(ff / k));
		if (!json_object_get(o, "shared_expert_intermediate_size") && ff > 0)
			json_object_set_new(o, "shared_expert_intermediate_size", json_integer(ff));
	}
	/* llama.cpp counts multi-token-prediction layers (blk.<n_layers>.nextn.*)
	 * in block_count; the text model has block_count - nextn layers. */
	{
		int64_t nextn = 0, bc = json_integer_value(json_object_get(o, "num_hidden_layers"));
		if (get_u(g, arch, "nextn_predict_layers", &nextn) == KV_OK && nextn > 0 && nextn < bc) {
			json_object_set_new(o, "num_hidden_layers", json_integer(bc - nextn));
			json_object_set_new(o, "mtp_num_hidden_layers", json_integer(nextn));
		}
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
	if (next) {
		/* llama.cpp's converter splits in_proj_qkvz into attn_qkv + attn_gate
		 * (loaded as in_proj_qkv / in_proj_z) and kvkeep splits ssm_ba into
		 * in_proj_b / in_proj_a; only old files keep the fused ssm_in */
		out->fused_deltanet = 0;
		for (int l = 0; l < out->n_layers; l++)
			if (out->layer_type[l] == KV_LAYER_DELTANET) {
				char n[64];
				snprintf(n, sizeof n, "blk.%d.ssm_in.weight", l);
				out->fused_deltanet = kv_gguf_tensor_find(g, n) != NULL;
				break;
			}
	}
	if (out->n_moe_layers && (rc = check_moe(g, out)))
		goto out;
	if (out->n_moe_layers) {
		/* the names kv_gguf_hf_tensors gives the expert stacks */
		char n[64];
		for (int l = 0; l < out->n_layers; l++)
			if (out->layer_moe[l]) {
				snprintf(n, sizeof n, "blk.%d.ffn_gate_up_exps.weight", l);
				out->expert_layout = kv_gguf_tensor_find(g, n) ? KV_EXPERTS_STACKED : KV_EXPERTS_SWITCH;
				break;
			}
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
	/* one more entry per layer: qwen3next's ssm_ba gives in_proj_b and in_proj_a */
	struct kv_tensor *v = calloc(nt + (size_t)c->n_layers + 1, sizeof *v);
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
			/* the MTP layer (nextn): under the Hugging Face mtp.* names */
			int mtp = c->n_mtp_layers > 0 && layer == c->n_layers && !strncmp(t->name, "blk.", 4);
			if (mtp) {
				const char *rest = strchr(t->name + 4, '.') + 1;
				for (size_t m = 0; m < N_NEXTN_MAP; m++)
					if (!strcmp(rest, g_nextn[m].gg))
						snprintf(hf, sizeof hf, "%s", g_nextn[m].hf);
				for (size_t m = 0; m < N_LAYER_MAP && !hf[0]; m++)
					if (applies(&g_layer[m], c) && !strcmp(rest, g_layer[m].gg))
						snprintf(hf, sizeof hf, "mtp.layers.0.%s", g_layer[m].hf);
			}
			int ba_split = 0;
			if (!hf[0] && layer >= 0 && (layer < c->n_layers || mtp)) {
				const char *rest = strchr(t->name + 4, '.') + 1;
				for (size_t m = 0; m < N_MOE_MAP && !hf[0]; m++) {
					if (strcmp(rest, g_moe[m].gg))
						continue;
					const char *h = g_moe[m].hf;
					if (!strcmp(rest, "ffn_down_exps.weight")) {
						/* beside a fused ffn_gate_up_exps: the HF stacked pair */
						char fu[64];
						snprintf(fu, sizeof fu, "blk.%d.ffn_gate_up_exps.weight", layer);
						if (kv_gguf_tensor_find(g, fu))
							h = "mlp.experts.down_proj";
					}
					if (!strcmp(rest, "ssm_in.weight") && !c->fused_deltanet)
						break;
					if (!strcmp(rest, "ssm_ba.weight") && !c->fused_deltanet)
						ba_split = 1;
					if (mtp)
						snprintf(hf, sizeof hf, "mtp.layers.0.%s", h);
					else
						snprintf(hf, sizeof hf, "model.layers.%d.%s", layer, h);
				}
			}
			if (!hf[0])
				continue; /* not a tensor of the text model (mtp, vision...) */
			if (ba_split) {
				/* qwen3next's ssm_ba [Hk][b per, a per] rows -> HF in_proj_b and
				 * in_proj_a [Hv] (rows are whole blocks, so any type copies) */
				int64_t per = c->lin_v_heads / c->lin_k_heads, rows = t->ndim == 2 ? t->shape[0] : 0;
				size_t rb = rows ? (size_t)kv_dtype_row_bytes(t->dtype, (uint64_t)t->shape[1]) : 0;
				if (rows != 2ll * c->lin_v_heads || !rb || rb * (size_t)rows != t->nbytes) {
					rc = kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' is not [%d, %d]", t->file, t->name,
						     2 * c->lin_v_heads, c->hidden);
					goto fail;
				}
				if (pass == 0) {
					owned += 2 * ((t->nbytes / 2 + 63) & ~(uint64_t)63);
					k += 2;
					continue;
				}
				for (int j = 0; j < 2; j++) {
					struct kv_tensor *d = &v[k++];
					*d = *t;
					snprintf(hf, sizeof hf, "model.layers.%d.linear_attn.in_proj_%s.weight", layer, j ? "a" : "b");
					if (!(d->name = strdup(hf))) {
						rc = kv_fail(KV_ERR_NOMEM, "out of memory");
						goto fail;
					}
					d->shape[0] = c->lin_v_heads;
					d->numel = t->numel / 2;
					d->nbytes = t->nbytes / 2;
					for (int64_t h = 0; h < c->lin_v_heads; h++)
						memcpy(b + off + (size_t)h * rb,
						       (const uint8_t *)t->data + (size_t)((h / per) * 2 * per + j * per + h % per) * rb, rb);
					d->data = b + off;
					off += (d->nbytes + 63) & ~(uint64_t)63;
				}
				continue;
			}
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
			if (strstr(t->name, "ffn_gate_inp_shexp") && t->ndim == 1) {
				/* {n_embd} -> HF's shared_expert_gate [1, D] */
				d->ndim = 2;
				d->shape[1] = t->shape[0];
				d->shape[0] = 1;
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
	kv_gguf_hf_free(v, nt + (size_t)c->n_layers + 1);
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
