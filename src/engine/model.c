/*
 * model.c - see model.h.
 */
#include "engine/model.h"
#include "engine/attn.h"
#include "engine/engine_int.h"
#include "engine/qgemm.h"
#include "engine/qdot.h"
#include "engine/qpanel.h"
#include "engine/isa.h"
#include "engine/moe.h"
#include "model/open.h"
#include "model/quant.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/pool.h"
#include "model/mlx.h"
#include "model/weights.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DV_MAX 1024
#define HEAD_DIM_MAX 4096

struct loader {
	struct ke_model *m;
	float *next;     /* next free float in m->owned */
	float *end;
	struct kv_mlx_qcfg *q; /* config.json's MLX quantization block, or NULL */
	struct kv_tensor_spec *specs; /* what the config implies (float shapes) */
	size_t n_specs;
	int qdot;        /* block matrices take the integer path (--quant-act q8) */
};

int ke_quant_act_parse(const char *s)
{
	if (!s || !strcmp(s, "q8"))
		return KE_QACT_Q8;
	if (!strcmp(s, "f32"))
		return KE_QACT_F32;
	return -1;
}

/* The float shape the config implies for a matrix name; -1 if unknown. */
static void spec_shape(const struct loader *L, const char *name, int64_t *rows, int64_t *cols)
{
	*rows = *cols = -1;
	for (size_t i = 0; i < L->n_specs; i++) {
		const struct kv_tensor_spec *v = &L->specs[i];
		/* (m->prefix is swapped while lm_head loads: match both of its names) */
		if (v->role == KV_ROLE_LM_HEAD ? !strcmp(name, kv_config_lm_head_name("")) ||
						 !strcmp(name, kv_config_lm_head_name("language_model.model."))
					       : !strcmp(v->name, name)) {
			*rows = v->shape[0];
			*cols = v->shape[1];
			return;
		}
	}
}

static int find(struct loader *L, const char *name, const struct kv_tensor **out)
{
	const struct kv_tensor *t = kv_weights_find(L->m->w, name);
	if (!t)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: weights lack tensor '%s'", L->m->dir, name);
	*out = t;
	return KV_OK;
}

static int load_mat(struct loader *L, struct ke_mat *mat, const char *fmt, int layer)
{
	char name[160];
	const struct kv_tensor *t = NULL;
	int rc;
	snprintf(name, sizeof name, fmt, L->m->prefix, layer);
	if ((rc = find(L, name, &t)))
		return rc;
	if (t->ndim != 2)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' has %d dims, a matrix has 2", t->file, name, t->ndim);
	if (t->dtype == KV_DT_U32) { /* MLX affine groups */
		struct kv_mlx_qmat qm;
		if (!L->q)
			return kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' is U32 (MLX quantized) but config.json has no "
				       "\"quantization\" block", t->file, name);
		int64_t er, ec;
		spec_shape(L, name, &er, &ec);
		if (er < 0)
			return kv_fail(KV_ERR_INCOMPATIBLE, "%s: internal: no shape for '%s'", t->file, name);
		if ((rc = kv_mlx_matrix(L->m->w, name, L->q, er, ec, &qm)))
			return rc;
		memset(mat, 0, sizeof *mat);
		mat->data = qm.codes->data;
		mat->dtype = KV_DT_MLX_AFFINE;
		mat->rows = (int)qm.rows;
		mat->cols = (int)qm.cols;
		mat->ld = (size_t)qm.cols;
		mat->scales = qm.scales->data;
		mat->biases = qm.biases->data;
		mat->sb_dtype = qm.scales->dtype;
		mat->bits = qm.bits;
		mat->group = qm.group;
		goto noted;
	}
	if (t->dtype != KV_DT_F32 && t->dtype != KV_DT_BF16 && t->dtype != KV_DT_F16 && !kv_dtype_is_quant(t->dtype))
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: tensor '%s' is %s; the engine runs F32, BF16, F16 and ggml block "
			       "type matrices", t->file, name, kv_dtype_name(t->dtype) ? kv_dtype_name(t->dtype) : "?");
	if (t->dtype != KV_DT_F32 && t->dtype != KV_DT_BF16 && t->shape[1] > KE_QGEMM_MAX_K)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: tensor '%s' has rows of %lld, above the %d quantized products take",
			       t->file, name, (long long)t->shape[1], KE_QGEMM_MAX_K);
	if ((t->dtype == KV_DT_F32 || t->dtype == KV_DT_BF16) && !kv_tensor_is_aligned(t))
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' is not aligned for its dtype", t->file, name);
	if (t->shape[0] <= 0 || t->shape[1] <= 0 || t->shape[0] > INT32_MAX || t->shape[1] > INT32_MAX)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' has an unusable shape", t->file, name);
	memset(mat, 0, sizeof *mat);
	mat->data = t->data;
	mat->dtype = t->dtype;
	mat->rows = (int)t->shape[0];
	mat->cols = (int)t->shape[1];
	mat->ld = (size_t)t->shape[1];
	mat->qdot = L->qdot && ke_qdot_block(t->dtype) > 0;
noted:;
	struct ke_model *m = L->m;
	if (m->n_mats < KE_MAX_MATS) {
		m->mats[m->n_mats] = *mat;
		m->mat_names[m->n_mats] = t->name;
		m->n_mats++;
	}
	return KV_OK;
}

/* A small tensor of n elements as f32 (1 + w when plus_one). */
static int load_vec(struct loader *L, const float **out, int n, int plus_one, const char *fmt, int layer)
{
	char name[160];
	const struct kv_tensor *t = NULL;
	int rc;
	snprintf(name, sizeof name, fmt, L->m->prefix, layer);
	if ((rc = find(L, name, &t)))
		return rc;
	if ((uint64_t)n != t->numel)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' has %llu elements, expected %d", t->file, name,
			       (unsigned long long)t->numel, n);
	if (t->dtype != KV_DT_F32 && t->dtype != KV_DT_BF16 && t->dtype != KV_DT_F16)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' is %s, expected F32, BF16 or F16", t->file, name,
			       kv_dtype_name(t->dtype));
	if (L->next + n > L->end)
		return kv_fail(KV_ERR_INVALID, "%s: internal: small-tensor arena too small", name);
	float *v = L->next;
	L->next += n;
	if ((rc = kv_tensor_to_f32(t, v, 0, (uint64_t)n)))
		return kv_fail_ctx(rc, "%s", name);
	for (int i = 0; i < n; i++) {
		if (!isfinite(v[i]))
			return kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' element %d is not finite", t->file, name, i);
		if (plus_one)
			v[i] = 1.0f + v[i];
	}
	*out = v;
	return KV_OK;
}

static size_t arena_floats(const struct kv_model_config *c)
{
	/* (+ rope_freqs; the MTP head's norms: 5 hidden + 2 head_dim, load_mtp) */
	size_t n = (size_t)c->hidden + (size_t)c->rotary_dim + 64 + 5 * (size_t)c->hidden + 2 * (size_t)c->head_dim +
		   (size_t)c->ple_dim;
	size_t C = (size_t)kv_config_conv_dim(c);
	/* the sliding layers' inverse frequencies (their own rotary dim: gemma4) */
	n += (size_t)(c->local_rotary_dim > c->rotary_dim ? c->local_rotary_dim : c->rotary_dim) / 2;
	for (int l = 0; l < c->n_layers; l++) {
		n += 5 * (size_t)c->hidden + 1; /* in/post norms, gemma's output norms, gemma4's layer_scalar
						   and per-layer embedding norm */
		if (c->layer_type[l] == KV_LAYER_MAMBA) /* conv w + b, A, dt_bias, D, gated norm */
			n += C * ((size_t)c->conv_kernel + 1) + 3 * (size_t)c->ssm_heads +
			     (size_t)c->ssm_heads * (size_t)c->ssm_head_dim;
		else if (c->layer_type[l] == KV_LAYER_MLP)
			;
		else if (c->layer_type[l] == KV_LAYER_ATTN) {
			size_t hd = (size_t)kv_config_layer_head_dim(c, l), nkv = (size_t)kv_config_layer_kv_heads(c, l);
			n += 2 * hd + ((size_t)c->n_heads + 2 * nkv) * hd + (size_t)c->hidden +
			     (size_t)c->n_heads; /* q/k norms, biases, sinks */
		}
		else
			n += C * (size_t)c->conv_kernel + 2 * (size_t)c->lin_v_heads + (size_t)c->lin_v_dim;
	}
	return n;
}

static int cmp_mat(const void *a, const void *b)
{
	const struct ke_mat *x = a, *y = b;
	double sx = (double)x->rows * x->cols, sy = (double)y->rows * y->cols;
	return sx < sy ? 1 : sx > sy ? -1 : 0;
}

/*
 * RoPE scaling, in f32 like transformers' modeling_rope_utils.py:
 *   linear: inv_freq / factor
 *   yarn:   pos_freqs = base^(2i/dim); extrapolation 1 / pos_freqs,
 *           interpolation 1 / (factor pos_freqs); the correction range
 *           [low, high] = [floor(d(beta_fast)), ceil(d(beta_slow))] (no
 *           rounding without "truncate") clamped to [0, dim - 1], with
 *           d(r) = dim ln(orig_max / (2 pi r)) / (2 ln base); ramp_i =
 *           clamp((i - low) / (high - low), 0, 1); e = 1 - ramp;
 *           inv = interp (1 - e) + extrap e.
 * (YaRN's attention factor multiplies cos and sin: forward.c.)
 */
static void rope_scale_freqs(const struct kv_model_config *c, float *inv, int half)
{
	if (c->rope_scaling == KV_ROPE_LLAMA3) {
		/* transformers' _compute_llama3_parameters, in f32 like its
		 * tensors: wavelen = 2 pi / inv; long waves / factor, short ones
		 * kept, a smooth blend between */
		float fac = (float)c->rope_factor, lo = (float)c->rope_low_freq, hi = (float)c->rope_high_freq;
		float om = (float)c->rope_orig_max_pos;
		float low_wl = om / lo, high_wl = om / hi;
		for (int i = 0; i < half; i++) {
			float wl = 2.0f * (float)M_PI / inv[i];
			if (wl > low_wl) {
				inv[i] = inv[i] / fac;
			} else if (wl >= high_wl) {
				float sm = (om / wl - lo) / (hi - lo);
				inv[i] = (1.0f - sm) * inv[i] / fac + sm * inv[i];
			}
		}
		return;
	}
	if (c->rope_scaling == KV_ROPE_LINEAR) {
		for (int i = 0; i < half; i++)
			inv[i] = inv[i] / (float)c->rope_factor;
		return;
	}
	if (c->rope_scaling != KV_ROPE_YARN)
		return;
	double dim = c->rotary_dim, base = c->rope_theta, om = c->rope_orig_max_pos;
	double low = dim * log(om / (c->rope_beta_fast * 2 * M_PI)) / (2 * log(base));
	double high = dim * log(om / (c->rope_beta_slow * 2 * M_PI)) / (2 * log(base));
	if (c->rope_truncate) {
		low = floor(low);
		high = ceil(high);
	}
	low = low > 0 ? low : 0;
	high = high < dim - 1 ? high : dim - 1;
	if (low == high)
		high += 0.001; /* transformers: "prevent singularity" */
	float span = (float)(high - low), lo = (float)low, fac = (float)c->rope_factor;
	for (int i = 0; i < half; i++) {
		float pf = powf((float)base, (float)(2 * i) / (float)c->rotary_dim);
		float extrap = 1.0f / pf, interp = 1.0f / (fac * pf);
		float r = ((float)i - lo) / span;
		r = r < 0.0f ? 0.0f : r > 1.0f ? 1.0f : r;
		float e = 1.0f - r;
		float a = interp * (1.0f - e), b = extrap * e;
		inv[i] = a + b;
	}
}

int ke_kv_parse(const char *s)
{
	if (!s || !strcmp(s, "bf16"))
		return KE_KV_BF16;
	if (!strcmp(s, "f32"))
		return KE_KV_F32;
	if (!strcmp(s, "q8_0"))
		return KE_KV_Q8_0;
	return -1;
}

const char *ke_kv_name(int kv)
{
	switch (kv) {
	case KE_KV_BF16:
		return "bf16";
	case KE_KV_F32:
		return "f32";
	case KE_KV_Q8_0:
		return "q8_0";
	default:
		return NULL;
	}
}

int ke_kv_dtype(int kv)
{
	switch (kv) {
	case KE_KV_BF16:
		return KV_DT_BF16;
	case KE_KV_F32:
		return KV_DT_F32;
	case KE_KV_Q8_0:
		return KV_DT_Q8_0;
	default:
		return -1;
	}
}

static void fill_layout(struct ke_model *m, int kv_dtype, int B)
{
	const struct kv_model_config *c = &m->cfg;
	struct ke_layout *l = &m->lay;
	memset(l, 0, sizeof *l);
	l->page_tokens = B;
	l->kv_dtype = kv_dtype;
	/* the pages hold the global attention layers only (layout.h), and of
	 * those only the ones with KV of their own (gemma4's shared layers
	 * read an earlier layer's) */
	l->n_attn_layers = kv_config_kv_layers(c, 0);
	l->n_kv_heads = c->n_kv_heads;
	l->head_dim = c->head_dim;
	l->n_segments = l->n_attn_layers * 2 * c->n_kv_heads;
	l->row_bytes = ke_layout_row_bytes(kv_dtype, c->head_dim);
	l->page_bytes = (size_t)l->n_segments * (size_t)B * l->row_bytes;
	l->kv_bytes_per_token = (size_t)l->n_segments * l->row_bytes;
	size_t off = 0;
	int C = (int)kv_config_conv_dim(c), K1 = c->conv_kernel - 1;
	for (int i = 0; i < c->n_layers; i++) {
		if (c->layer_type[i] == KV_LAYER_MAMBA) {
			/* a Mamba-2 layer: conv [C][K-1] then S [H][P][N], the same two
			 * arrays as a DeltaNet layer, so the cache keeps them alike */
			struct ke_rec_layer *r = &l->rec[l->n_rec_layers++];
			r->layer = i;
			r->conv_off = off;
			r->conv_bytes = (size_t)C * (size_t)K1 * 4;
			r->conv_dims[0] = C;
			r->conv_dims[1] = K1;
			off += r->conv_bytes;
			r->state_off = off;
			r->state_bytes = (size_t)c->ssm_heads * (size_t)c->ssm_head_dim * (size_t)c->ssm_state * 4;
			r->state_dims[0] = c->ssm_heads;
			r->state_dims[1] = c->ssm_head_dim;
			r->state_dims[2] = c->ssm_state;
			off += r->state_bytes;
			continue;
		}
		if (c->layer_type[i] != KV_LAYER_DELTANET)
			continue;
		struct ke_rec_layer *r = &l->rec[l->n_rec_layers++];
		r->layer = i;
		r->conv_off = off;
		r->conv_bytes = (size_t)C * (size_t)K1 * 4;
		r->conv_dims[0] = C;
		r->conv_dims[1] = K1;
		off += r->conv_bytes;
		r->state_off = off;
		r->state_bytes = (size_t)c->lin_v_heads * (size_t)c->lin_k_dim * (size_t)c->lin_v_dim * 4;
		r->state_dims[0] = c->lin_v_heads;
		r->state_dims[1] = c->lin_k_dim;
		r->state_dims[2] = c->lin_v_dim;
		off += r->state_bytes;
	}
	l->rec_bytes = off;
	l->window = c->n_swa_layers ? c->sliding_window : 0;
	for (int i = 0; i < c->n_layers && l->window; i++) {
		if (c->layer_type[i] != KV_LAYER_ATTN || !c->layer_window[i] || kv_config_kv_layer(c, i) != i)
			continue;
		struct ke_win_layer *w = &l->win[l->n_win_layers];
		w->layer = i;
		w->idx = l->n_win_layers++;
		w->rows = l->window - 1;
		w->kv_heads = kv_config_swa_kv_heads(c);
		w->head_dim = kv_config_swa_head_dim(c);
		w->row_bytes = ke_layout_row_bytes(kv_dtype, w->head_dim);
		size_t half = (size_t)w->kv_heads * (size_t)w->rows * w->row_bytes;
		w->k_off = off;
		w->v_off = off + half;
		w->bytes = 2 * half;
		off += w->bytes;
	}
	l->snapshot_bytes = off;
	/* the window pages: the same segment layout over the window layers,
	 * with their geometry */
	m->wlay = *l;
	m->wlay.n_attn_layers = l->n_win_layers;
	m->wlay.n_kv_heads = kv_config_swa_kv_heads(c);
	m->wlay.head_dim = kv_config_swa_head_dim(c);
	m->wlay.row_bytes = ke_layout_row_bytes(kv_dtype, m->wlay.head_dim);
	m->wlay.n_segments = l->n_win_layers * 2 * m->wlay.n_kv_heads;
	m->wlay.page_bytes = (size_t)m->wlay.n_segments * (size_t)B * m->wlay.row_bytes;
	m->wlay.kv_bytes_per_token = (size_t)m->wlay.n_segments * m->wlay.row_bytes;
}

/*
 * The MTP head (engine_int.h struct ke_mtp_head) when the weights have
 * mtp.fc.weight (Hugging Face names; a GGUF's nextn tensors load under
 * them, model/gguf_model.c): its tensors as model/config.h
 * kv_config_mtp_tensors lists them, its norms (1 + w) like the model's
 * (po). Its matrices are not the model's (no part of the decode bytes or
 * the benchmark list). MLX folders never have a head (mlx-lm drops it).
 */
static int load_mtp(struct loader *L, int po)
{
	struct ke_model *m = L->m;
	const struct kv_model_config *c = &m->cfg;
	char save[64];
	int rc, n_mats = m->n_mats;
	if (!c->hybrid || !kv_weights_find(m->w, "mtp.fc.weight"))
		return KV_OK;
	struct ke_mtp_head *h = kv_zalloc(KV_MEM_WEIGHTS, sizeof *h);
	if (!h)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	m->mtp = h;
	snprintf(save, sizeof save, "%s", m->prefix);
	snprintf(m->prefix, sizeof m->prefix, "mtp.");
	struct ke_layer *ly = &h->layer;
	ly->type = KV_LAYER_ATTN;
	ly->idx = 0;
	if ((rc = load_mat(L, &h->fc, "%sfc.weight", 0)) ||
	    (rc = load_vec(L, &h->enorm, c->hidden, po, "%spre_fc_norm_embedding.weight", 0)) ||
	    (rc = load_vec(L, &h->hnorm, c->hidden, po, "%spre_fc_norm_hidden.weight", 0)) ||
	    (rc = load_vec(L, &h->norm, c->hidden, po, "%snorm.weight", 0)) ||
	    (rc = load_vec(L, &ly->in_norm, c->hidden, po, "%slayers.%d.input_layernorm.weight", 0)) ||
	    (rc = load_vec(L, &ly->post_norm, c->hidden, po, "%slayers.%d.post_attention_layernorm.weight", 0)) ||
	    (rc = load_mat(L, &ly->q, "%slayers.%d.self_attn.q_proj.weight", 0)) ||
	    (rc = load_mat(L, &ly->k, "%slayers.%d.self_attn.k_proj.weight", 0)) ||
	    (rc = load_mat(L, &ly->v, "%slayers.%d.self_attn.v_proj.weight", 0)) ||
	    (rc = load_mat(L, &ly->o, "%slayers.%d.self_attn.o_proj.weight", 0)) ||
	    (rc = load_vec(L, &ly->q_norm, c->head_dim, po, "%slayers.%d.self_attn.q_norm.weight", 0)) ||
	    (rc = load_vec(L, &ly->k_norm, c->head_dim, po, "%slayers.%d.self_attn.k_norm.weight", 0)))
		goto out;
	if (h->fc.rows != c->hidden || h->fc.cols != 2 * c->hidden ||
	    ly->q.rows != c->n_heads * c->head_dim * (c->attn_output_gate ? 2 : 1) || ly->q.cols != c->hidden ||
	    ly->k.rows != c->n_kv_heads * c->head_dim || ly->v.rows != c->n_kv_heads * c->head_dim ||
	    ly->o.rows != c->hidden || ly->o.cols != c->n_heads * c->head_dim) {
		rc = kv_fail(KV_ERR_INCOMPATIBLE, "%s: the MTP head's mtp.fc / self_attn matrices do not have the model's "
			     "shapes", m->dir);
		goto out;
	}
	if (kv_weights_find(m->w, "mtp.layers.0.mlp.gate.weight")) {
		if (!c->n_experts) {
			rc = kv_fail(KV_ERR_INCOMPATIBLE, "%s: the MTP head has experts, the model none", m->dir);
			goto out;
		}
		rc = ke_moe_load(m, 0, &ly->moe);
	} else {
		if (!(rc = load_mat(L, &ly->gate, "%slayers.%d.mlp.gate_proj.weight", 0)) &&
		    !(rc = load_mat(L, &ly->up, "%slayers.%d.mlp.up_proj.weight", 0)) &&
		    !(rc = load_mat(L, &ly->down, "%slayers.%d.mlp.down_proj.weight", 0)) &&
		    (ly->gate.rows != c->intermediate || ly->gate.cols != c->hidden || ly->down.cols != c->intermediate))
			rc = kv_fail(KV_ERR_INCOMPATIBLE, "%s: the MTP head's MLP is not the model's", m->dir);
	}
out:
	snprintf(m->prefix, sizeof m->prefix, "%s", save);
	m->n_mats = n_mats;
	return rc ? kv_fail_ctx(rc, "MTP head") : KV_OK;
}

/* The MTP head's one-layer KV layout and its page pool. */
static int mtp_pages(struct ke_model *m)
{
	struct ke_mtp_head *h = m->mtp;
	if (!h)
		return KV_OK;
	h->lay = m->lay;
	h->lay.n_attn_layers = 1;
	h->lay.n_segments = 2 * m->cfg.n_kv_heads;
	h->lay.page_bytes = (size_t)h->lay.n_segments * (size_t)h->lay.page_tokens * h->lay.row_bytes;
	h->lay.kv_bytes_per_token = (size_t)h->lay.n_segments * h->lay.row_bytes;
	h->lay.n_rec_layers = 0;
	h->lay.rec_bytes = 0;
	h->lay.n_win_layers = 0;
	h->lay.window = 0;
	h->lay.snapshot_bytes = 0;
	h->pages = kv_pages_create(h->lay.page_bytes, 0, 2);
	return h->pages ? KV_OK : kv_fail(KV_ERR_NOMEM, "out of memory for the MTP head's page pool");
}

int ke_model_has_mtp(const struct ke_model *m)
{
	return m->mtp != NULL;
}

/*
 * Touching the weights at load. The weights are a read-only file mapping.
 * The first pass of a forward over pages it has never read ran at a fifth
 * of the speed of later passes on this project's machines (virtual
 * machines: a 3-token forward of qwen35-9b Q4_K_M, 5 GB of weights from
 * the page cache, took 1.27 s the first time and 0.15-0.22 s after). The
 * cost is per 4 KiB page (about 0.9 us, whatever the kernel call that
 * maps it: MADV_POPULATE_READ mapped the file in 0.09 s and the first
 * forward still took 1.08 s; reading one byte a page took 1.2-1.5 s on
 * one thread and then the forward 0.25-0.33 s), so the GEMVs, which
 * stream the weights with prefetches that do not run ahead on such pages,
 * paid it at memory latency. A restarted server pays it on its first
 * request, which is the replayed turn the disk cache exists for. So the
 * load reads one byte of every page the products read, on the pool (the
 * page cache brought in too when the file is not in it yet).
 */
struct touch_range {
	const unsigned char *p;
	size_t n;
};

struct touch_job {
	struct touch_range *r;
	size_t n, cap, page;
	unsigned sink;
};

static void touch_add(struct touch_job *j, const void *p, size_t n)
{
	if (!p || !n)
		return;
	if (j->n == j->cap) {
		size_t cap = j->cap ? 2 * j->cap : 256;
		struct touch_range *r = realloc(j->r, cap * sizeof *r);
		if (!r)
			return; /* a page left untouched is only slower */
		j->r = r;
		j->cap = cap;
	}
	j->r[j->n++] = (struct touch_range){p, n};
}

/* Every byte a product reads: codes, and an MLX matrix's scales and
 * biases. */
static void touch_mat(struct touch_job *j, const struct ke_mat *w)
{
	if (!w->data || w->rows <= 0)
		return;
	if (w->dtype == KV_DT_MLX_AFFINE) {
		size_t ng = w->group > 0 ? (size_t)w->rows * (size_t)(w->cols / w->group) : 0;
		touch_add(j, w->data, (size_t)w->rows * w->ld * (size_t)w->bits / 8);
		touch_add(j, w->scales, ng * kv_dtype_size(w->sb_dtype));
		touch_add(j, w->biases, ng * kv_dtype_size(w->sb_dtype));
		return;
	}
	size_t n = ke_mat_bytes(w); /* block types: whole rows, ld == cols */
	if (w->dtype == KV_DT_F32 || w->dtype == KV_DT_BF16 || w->dtype == KV_DT_F16)
		n = ((size_t)(w->rows - 1) * w->ld + (size_t)w->cols) * kv_dtype_size(w->dtype);
	touch_add(j, w->data, n);
}

static void touch_part(void *ctx, size_t b, size_t e, int thread)
{
	struct touch_job *j = ctx;
	unsigned s = 0;
	(void)thread;
	for (size_t i = b; i < e; i++) {
		const volatile unsigned char *p = j->r[i].p;
		for (size_t o = 0; o < j->r[i].n; o += j->page)
			s += p[o];
		s += p[j->r[i].n - 1];
	}
	__atomic_fetch_add(&j->sink, s, __ATOMIC_RELAXED);
}

/* Reads a byte of every weight page (m->mats is largest first, so the
 * pool's chunks of one range each balance); returns the bytes covered. */
static double touch_weights(const struct ke_model *m)
{
	struct touch_job j = {.page = (size_t)sysconf(_SC_PAGESIZE)};
	double bytes = 0;
	if (j.page == 0 || j.page > 65536)
		j.page = 4096;
	for (int i = 0; i < m->n_mats; i++)
		touch_mat(&j, &m->mats[i]);
	for (int l = 0; l < m->cfg.n_layers; l++) {
		const struct ke_moe *mo = m->layers[l].moe;
		for (int e = 0; mo && e < mo->E; e++) {
			touch_mat(&j, &mo->gate[e]);
			touch_mat(&j, &mo->up[e]);
			touch_mat(&j, &mo->down[e]);
		}
	}
	for (size_t i = 0; i < j.n; i++)
		bytes += (double)j.r[i].n;
	if (j.n)
		kv_pool_for(kv_pool_global(), j.n, 1, touch_part, &j);
	free(j.r);
	return bytes;
}

/* The matrices the products read, each ke_mat once (not the embedding
 * tables, whose rows are looked up: a tied lm_head is its own ke_mat). */
struct mat_list {
	struct ke_mat **v;
	int n, cap;
};

static void list_add(struct mat_list *l, struct ke_mat *w)
{
	if (!w->data || w->rows <= 0)
		return;
	if (l->n == l->cap) {
		int cap = l->cap ? 2 * l->cap : 256;
		struct ke_mat **v = realloc(l->v, (size_t)cap * sizeof *v);
		if (!v)
			return; /* a matrix left out runs on its rows: the same numbers */
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = w;
}

static void list_layer(struct mat_list *l, struct ke_layer *ly)
{
	struct ke_mat *own[] = {&ly->gate, &ly->up,	  &ly->down, &ly->q, &ly->k, &ly->v,   &ly->o,	     &ly->ple_gate,
				&ly->ple_out, &ly->qkv, &ly->z,    &ly->b, &ly->a, &ly->out, &ly->in_proj};
	for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
		list_add(l, own[i]);
	struct ke_moe *mo = ly->moe;
	if (!mo)
		return;
	list_add(l, &mo->router);
	for (int e = 0; e < mo->E; e++) {
		list_add(l, &mo->gate[e]);
		list_add(l, &mo->up[e]);
		list_add(l, &mo->down[e]);
	}
	list_add(l, &mo->sh_gate);
	list_add(l, &mo->sh_up);
	list_add(l, &mo->sh_down);
	list_add(l, &mo->sh_router);
}

struct pack_job {
	const struct ke_mat *w;
	uint8_t *out;
};

static void pack_part(void *ctx, size_t b, size_t e, int thread)
{
	const struct pack_job *j = ctx;
	(void)thread;
	ke_qpanel_pre_pack(j->w->dtype, j->w->data, (size_t)kv_dtype_row_bytes(j->w->dtype, (uint64_t)j->w->ld),
			   j->w->rows, j->w->cols, (int)b, (int)e, j->out);
}

/* The prepacked panels of every matrix the path takes (engine/qpanel.h:
 * Q8_0, Q4_0, Q5_0 and MXFP4 under --quant-act q8 on AVX-512 VNNI; not with
 * KVKEEP_PREPACK=0), in one block m->packed; returns its bytes. Without
 * the memory the rows serve, same numbers. */
static size_t prepack(struct ke_model *m)
{
	const int isa = ke_isa();
	struct mat_list l = {0};
	const char *env = kv_env(KV_ENV_PREPACK);
	if (env && strcmp(env, "0") && strcmp(env, "1"))
		KV_WARN("engine.model.prepack", "msg=\"KVKEEP_PREPACK is 0 or 1; using 1\" value=%s", env);
	if (!m->qdot || (env && !strcmp(env, "0")))
		return 0;
	list_add(&l, &m->lm_head);
	list_add(&l, &m->ple_proj);
	for (int i = 0; i < m->cfg.n_layers; i++)
		list_layer(&l, &m->layers[i]);
	if (m->mtp) {
		list_add(&l, &m->mtp->fc);
		list_layer(&l, &m->mtp->layer);
	}
	size_t total = 0;
	for (int i = 0; i < l.n; i++)
		if (l.v[i]->qdot)
			total += ke_qpanel_pre_bytes(isa, l.v[i]->dtype, l.v[i]->rows, l.v[i]->cols);
	/* a copy as large as the matrices: only with room to spare (a
	 * quarter of what is available left over), never pushing the machine
	 * into swap or a container past its cgroup limit (against which the
	 * mapped weights and our own allocations count); GGUF rows are mmap'd
	 * pages the kernel can drop */
	uint64_t avail = 0, lim = 0, used = kv_weights_bytes(m->w);
	int known = total && kv_mem_available(NULL, &avail) == KV_OK;
	kv_mem_cgroup_limit(NULL, "/proc/self/cgroup", &lim);
	for (int c = 0; c < KV_MEM__COUNT; c++)
		used += kv_mem_used(c);
	if (total && lim) {
		uint64_t room = used < lim ? lim - used : 0;
		avail = known && avail < room ? avail : room;
		known = 1;
	}
	if (known && (double)total > 0.75 * (double)avail) {
		KV_WARN("engine.model.prepack", "dir=%s bytes=%zu available=%llu: no room for the prepacked panels; the "
			"products read the rows (same numbers, slower)", m->dir, total, (unsigned long long)avail);
		total = 0;
	}
	kv_errclear();
	if (total && !(m->packed = kv_alloc(KV_MEM_WEIGHTS, total))) {
		KV_WARN("engine.model.prepack", "dir=%s bytes=%zu: no memory for the prepacked panels; the products "
			"read the rows (same numbers, slower)", m->dir, total);
		total = 0;
	}
	size_t off = 0;
	for (int i = 0; i < l.n && total; i++) {
		struct ke_mat *w = l.v[i];
		size_t bytes = w->qdot ? ke_qpanel_pre_bytes(isa, w->dtype, w->rows, w->cols) : 0;
		for (int j = 0; j < i && bytes; j++) /* the same rows seen before: their panels */
			if (l.v[j]->panels && l.v[j]->data == w->data && l.v[j]->rows == w->rows && l.v[j]->cols == w->cols) {
				w->panels = l.v[j]->panels;
				bytes = 0;
			}
		if (!bytes)
			continue;
		struct pack_job j = {w, (uint8_t *)m->packed + off};
		kv_pool_for(kv_pool_global(), (size_t)(w->rows + 15) / 16, 16, pack_part, &j);
		w->panels = j.out;
		off += bytes;
	}
	for (int i = 0; i < m->n_mats && off; i++) /* the listed copies (ke_model_mat) get them too */
		for (int j = 0; j < l.n && !m->mats[i].panels; j++)
			if (l.v[j]->panels && l.v[j]->data == m->mats[i].data && l.v[j]->rows == m->mats[i].rows &&
			    l.v[j]->cols == m->mats[i].cols)
				m->mats[i].panels = l.v[j]->panels;
	free(l.v);
	return off;
}

/* The bytes a decode step reads (m->decode_bytes) and m->mats largest
 * first (ke_model_load). */
static void mats_finish(struct ke_model *m)
{
	uint64_t db = 0;
	for (int i = 0; i < m->n_mats; i++)
		db += ke_mat_bytes(&m->mats[i]);
	db += m->embed.rows ? ke_mat_bytes(&m->embed) / (uint64_t)m->embed.rows : 0; /* one embedding row */
	db += ke_moe_decode_bytes(m); /* only the k experts a token routes to */
	m->decode_bytes = db;
	/* Largest first, names kept in step: sort index pairs. */
	for (int i = 1; i < m->n_mats; i++)
		for (int j = i; j > 0 && cmp_mat(&m->mats[j - 1], &m->mats[j]) > 0; j--) {
			struct ke_mat t = m->mats[j];
			const char *tn = m->mat_names[j];
			m->mats[j] = m->mats[j - 1];
			m->mat_names[j] = m->mat_names[j - 1];
			m->mats[j - 1] = t;
			m->mat_names[j - 1] = tn;
		}
}

/* The RoPE tables' frequencies and gemma's embedding scale (ke_model_load). */
static int rope_setup(struct loader *L)
{
	struct ke_model *m = L->m;
	const struct kv_model_config *c = &m->cfg;
	int rc;
	/* RoPE inverse frequencies as Hugging Face computes them, in f32:
	 * 1 / base^(2i / rot). */
	int half = c->rotary_dim / 2;
	m->inv_freq = L->next;
	L->next += half;
	m->rot_half = m->rot_half_local = half;
	for (int i = 0; i < half; i++)
		m->inv_freq[i] = 1.0f / powf((float)c->rope_theta, (float)(2 * i) / (float)c->rotary_dim);
	/* gemma4's "proportional" RoPE: the frequencies of the whole global
	 * head, the first rope_rot_pairs of them rotating, the others 0 (cos 1,
	 * sin 0: those dims pass through) */
	for (int i = c->rope_rot_pairs; c->rope_rot_pairs > 0 && i < half; i++)
		m->inv_freq[i] = 0.0f;
	rope_scale_freqs(c, m->inv_freq, half);
	if (c->rope_freqs_tensor) {
		/* a llama3 GGUF: the frequencies divided by the file's factors
		 * (ggml's rope: theta / freq_factor) */
		const float *ff;
		char save[64];
		snprintf(save, sizeof save, "%s", m->prefix);
		m->prefix[0] = 0;
		rc = load_vec(L, &ff, half, 0, "%srope_freqs.weight", 0);
		snprintf(m->prefix, sizeof m->prefix, "%s", save);
		if (rc)
			return rc;
		for (int i = 0; i < half; i++)
			m->inv_freq[i] = m->inv_freq[i] / ff[i];
	}
	m->inv_freq_local = m->inv_freq;
	/* the sliding layers' own table: gemma3's own base without the
	 * scaling, gemma4's own base over its own (smaller) head */
	int lrot = c->local_rotary_dim ? c->local_rotary_dim : c->rotary_dim;
	if (c->n_swa_layers &&
	    (c->arch == KV_ARCH_GEMMA4 || (c->arch == KV_ARCH_GEMMA3 && (c->rope_local_theta != c->rope_theta ||
									 c->rope_scaling != KV_ROPE_NONE)))) {
		m->inv_freq_local = L->next;
		m->rot_half_local = lrot / 2;
		L->next += lrot / 2;
		for (int i = 0; i < lrot / 2; i++)
			m->inv_freq_local[i] = 1.0f / powf((float)c->rope_local_theta, (float)(2 * i) / (float)lrot);
	}
	/* gemma: the embedding times sqrt(hidden), in f32 (llama.cpp's
	 * sqrtf(n_embd); transformers rounds it to the weights' dtype) */
	m->embed_mul = c->embed_scale ? sqrtf((float)c->hidden) : 1.0f;
	return KV_OK;
}

/* Rows [r0, r0 + rows) of a loaded matrix as a matrix of its own (no
 * copy): the row stride of its type, and an MLX matrix's scales and
 * biases offset alike. */
static void mat_rows(const struct ke_mat *src, int r0, int rows, struct ke_mat *out)
{
	*out = *src;
	out->rows = rows;
	if (src->dtype == KV_DT_MLX_AFFINE) {
		size_t sb = (size_t)(src->cols / src->group) * kv_dtype_size(src->sb_dtype);
		out->data = (const char *)src->data + (size_t)r0 * (size_t)src->cols * (size_t)src->bits / 8;
		out->scales = (const char *)src->scales + (size_t)r0 * sb;
		out->biases = (const char *)src->biases + (size_t)r0 * sb;
		return;
	}
	out->data = (const char *)src->data + (size_t)r0 * (size_t)kv_dtype_row_bytes(src->dtype, (uint64_t)src->ld);
}

/* One layer of a Mamba-2 hybrid (Granite 4.0-H: model.layers.N.{mamba,
 * self_attn}, post norm and FFN; Nemotron-H: backbone.layers.N.mixer, one
 * norm, no FFN). Names and shapes: model/config_ssm.c. */
static int load_ssm_layer(struct loader *L, int i)
{
	struct ke_model *m = L->m;
	const struct kv_model_config *c = &m->cfg;
	struct ke_layer *ly = &m->layers[i];
	const int nem = c->arch == KV_ARCH_NEMOTRON_H, H = c->ssm_heads, W = c->ssm_heads * c->ssm_head_dim;
	const char *mx = nem ? "%slayers.%d.mixer." : "%slayers.%d.mamba.", *at = nem ? "%slayers.%d.mixer." : "%slayers.%d.self_attn.";
	char f[128];
	int rc;
#define NM(base, rest) (snprintf(f, sizeof f, "%s%s", base, rest), f)
	ly->type = c->layer_type[i];
	if ((rc = load_vec(L, &ly->in_norm, c->hidden, 0, nem ? "%slayers.%d.norm.weight" : "%slayers.%d.input_layernorm.weight",
			   i)))
		return rc;
	if (ly->type == KV_LAYER_MAMBA) {
		const float *a_log;
		if ((rc = load_mat(L, &ly->in_proj, NM(mx, "in_proj.weight"), i)) ||
		    (rc = load_mat(L, &ly->out, NM(mx, "out_proj.weight"), i)) ||
		    (rc = load_vec(L, &ly->conv_w, m->conv_dim * c->conv_kernel, 0, NM(mx, "conv1d.weight"), i)) ||
		    (c->ssm_conv_bias && (rc = load_vec(L, &ly->conv_b, m->conv_dim, 0, NM(mx, "conv1d.bias"), i))) ||
		    (rc = load_vec(L, &a_log, H, 0, NM(mx, "A_log"), i)) ||
		    (rc = load_vec(L, &ly->dt_bias, H, 0, NM(mx, "dt_bias"), i)) ||
		    (rc = load_vec(L, &ly->ssm_d, H, 0, NM(mx, "D"), i)) ||
		    (rc = load_vec(L, &ly->gnorm, W, 0, NM(mx, "norm.weight"), i)))
			return rc;
		float *na = (float *)a_log;
		for (int h = 0; h < H && !c->a_is_neg_exp; h++)
			na[h] = -expf(na[h]); /* A = -exp(A_log), as transformers' -torch.exp(A_log.float()) */
		ly->neg_a = na;
	} else if (ly->type == KV_LAYER_ATTN) {
		if ((rc = load_mat(L, &ly->q, NM(at, "q_proj.weight"), i)) ||
		    (rc = load_mat(L, &ly->k, NM(at, "k_proj.weight"), i)) ||
		    (rc = load_mat(L, &ly->v, NM(at, "v_proj.weight"), i)) ||
		    (rc = load_mat(L, &ly->o, NM(at, "o_proj.weight"), i)))
			return rc;
	} else {
		if ((rc = load_mat(L, &ly->up, "%slayers.%d.mixer.up_proj.weight", i)) ||
		    (rc = load_mat(L, &ly->down, "%slayers.%d.mixer.down_proj.weight", i)))
			return rc;
	}
#undef NM
	if (!c->layer_ffn)
		return KV_OK;
	if ((rc = load_vec(L, &ly->post_norm, c->hidden, 0, "%slayers.%d.post_attention_layernorm.weight", i)))
		return rc;
	if (c->layer_moe[i])
		return ke_moe_load_granite(m, i, &ly->moe); /* moe.c */
	char mn[160];
	snprintf(mn, sizeof mn, "%slayers.%d.mlp.gate_proj.weight", m->prefix, i);
	if (kv_weights_find(m->w, mn)) /* mlx-lm's dense Granite, a GGUF's ffn_{gate,up,down} */
		return (rc = load_mat(L, &ly->gate, "%slayers.%d.mlp.gate_proj.weight", i)) ||
				       (rc = load_mat(L, &ly->up, "%slayers.%d.mlp.up_proj.weight", i)) ||
				       (rc = load_mat(L, &ly->down, "%slayers.%d.mlp.down_proj.weight", i))
			       ? rc
			       : KV_OK;
	/* shared_mlp.input_linear holds gate then up */
	struct ke_mat gu;
	if ((rc = load_mat(L, &gu, "%slayers.%d.shared_mlp.input_linear.weight", i)) ||
	    (rc = load_mat(L, &ly->down, "%slayers.%d.shared_mlp.output_linear.weight", i)))
		return rc;
	if (gu.rows != 2 * c->shared_intermediate)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: layer %d shared_mlp.input_linear has %d rows, expected %d",
			       m->dir, i, gu.rows, 2 * c->shared_intermediate);
	mat_rows(&gu, 0, c->shared_intermediate, &ly->gate);
	mat_rows(&gu, c->shared_intermediate, c->shared_intermediate, &ly->up);
	return KV_OK;
}

/* Attention layer i (its K/V geometry, the KV layer it reads, its
 * projections, norms, biases and sinks); counts it among the paged or the
 * window layers when it has KV of its own. */
static int load_attn_layer(struct loader *L, int i, int po, int *n_attn, int *n_win)
{
	struct ke_model *m = L->m;
	const struct kv_model_config *c = &m->cfg;
	struct ke_layer *ly = &m->layers[i];
	int rc;
	int src = kv_config_kv_layer(c, i);
	ly->window = c->layer_window[i] ? c->sliding_window : 0;
	/* gemma4's KV-shared layers: the pages (index) of the layer they read */
	ly->kv_shared = src != i;
	ly->idx = ly->kv_shared ? m->layers[src].idx : ly->window ? (*n_win)++ : (*n_attn)++;
	ly->hd = kv_config_layer_head_dim(c, i);
	ly->n_kv = kv_config_layer_kv_heads(c, i);
	ly->v_is_k = kv_config_layer_v_is_k(c, i);
	if ((rc = load_mat(L, &ly->q, "%slayers.%d.self_attn.q_proj.weight", i)) ||
	    (!ly->kv_shared && (rc = load_mat(L, &ly->k, "%slayers.%d.self_attn.k_proj.weight", i))) ||
	    (!ly->v_is_k && !ly->kv_shared &&
	     (rc = load_mat(L, &ly->v, "%slayers.%d.self_attn.v_proj.weight", i))) ||
	    (rc = load_mat(L, &ly->o, "%slayers.%d.self_attn.o_proj.weight", i)))
		return rc;
	if (c->qk_norm &&
	    ((rc = load_vec(L, &ly->q_norm, ly->hd, po, "%slayers.%d.self_attn.q_norm.weight", i)) ||
	     (!ly->kv_shared &&
	      (rc = load_vec(L, &ly->k_norm, ly->hd, po, "%slayers.%d.self_attn.k_norm.weight", i)))))
		return rc;
	int qd = c->n_heads * ly->hd, kd = ly->n_kv * ly->hd;
	if (c->attn_bias &&
	    ((rc = load_vec(L, &ly->q_b, qd, 0, "%slayers.%d.self_attn.q_proj.bias", i)) ||
	     (rc = load_vec(L, &ly->k_b, kd, 0, "%slayers.%d.self_attn.k_proj.bias", i)) ||
	     (rc = load_vec(L, &ly->v_b, kd, 0, "%slayers.%d.self_attn.v_proj.bias", i)) ||
	     (rc = load_vec(L, &ly->o_b, c->hidden, 0, "%slayers.%d.self_attn.o_proj.bias", i))))
		return rc;
	if (c->attn_sinks && (rc = load_vec(L, &ly->sinks, c->n_heads, 0, "%slayers.%d.self_attn.sinks", i)))
		return rc;
	return KV_OK;
}

int ke_model_load(const char *dir, const struct ke_model_params *p, struct ke_model **out)
{
	struct ke_model_params dp = {0};
	struct ke_model *m;
	struct kv_model_config *c;
	struct loader L = {0};
	int rc;

	*out = NULL;
	if (!p)
		p = &dp;
	if (p->page_tokens < 0 || p->page_tokens > 65536)
		return kv_fail(KV_ERR_INVALID, "page_tokens %d must be in [1, 65536]", p->page_tokens);
	m = calloc(1, sizeof *m);
	if (!m)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	pthread_mutex_init(&m->stash_lock, NULL);
	snprintf(m->dir, sizeof m->dir, "%s", dir);
	c = &m->cfg;
	if ((rc = kv_config_load(dir, c)))
		goto fail;
	if (c->hybrid && c->lin_v_dim > DV_MAX) {
		rc = kv_fail(KV_ERR_UNSUPPORTED, "%s: linear_value_head_dim %d is above the %d supported", dir,
			     c->lin_v_dim, DV_MAX);
		goto fail;
	}
	if (c->head_dim > HEAD_DIM_MAX) {
		rc = kv_fail(KV_ERR_UNSUPPORTED, "%s: head_dim %d is above the %d supported", dir, c->head_dim,
			     HEAD_DIM_MAX);
		goto fail;
	}
	if (ke_kv_dtype(p->kv) < 0) {
		rc = kv_fail(KV_ERR_INVALID, "KV dtype %d is not bf16, f32 or q8_0", p->kv);
		goto fail;
	}
	if (c->n_attn_layers && (!ke_layout_row_bytes(ke_kv_dtype(p->kv), c->head_dim) ||
				 !ke_layout_row_bytes(ke_kv_dtype(p->kv), kv_config_swa_head_dim(c)))) {
		rc = kv_fail(KV_ERR_UNSUPPORTED, "%s: q8_0 KV needs head_dim a multiple of %d, the model has %d", dir,
			     KE_KVQ8_BLOCK, c->head_dim % KE_KVQ8_BLOCK ? c->head_dim : kv_config_swa_head_dim(c));
		goto fail;
	}
	if ((rc = kv_weights_open(dir, &m->w)))
		goto fail;
	if ((rc = kv_config_check_weights(c, m->w, m->prefix, sizeof m->prefix)))
		goto fail;
	if (c->ssm && !c->gguf) /* mlx-lm's Granite names: the tensor list follows the weights */
		kv_config_detect_experts(c, m->w, m->prefix);

	size_t nf = arena_floats(c);
	m->owned = kv_alloc(KV_MEM_WEIGHTS, nf * sizeof(float));
	if (!m->owned) {
		rc = KV_ERR_NOMEM;
		goto fail;
	}
	L.m = m;
	L.next = m->owned;
	L.end = L.next + nf;
	L.q = NULL;
	if (p->quant_act != KE_QACT_Q8 && p->quant_act != KE_QACT_F32) {
		rc = kv_fail(KV_ERR_INVALID, "quant_act %d is not q8 or f32", p->quant_act);
		goto fail;
	}
	L.qdot = m->qdot = p->quant_act == KE_QACT_Q8;
	/* a GGUF has no config.json and no MLX groups (its block types go to
	 * engine/qgemm.c) */
	if ((!c->gguf && (rc = kv_mlx_qcfg_load(dir, &L.q))) ||
	    (rc = kv_config_tensors(c, m->prefix, &L.specs, &L.n_specs)))
		goto fail;
	int po = c->norm_plus_one;
	/* mlx-lm's sanitize() stores conv1d as [C, K, 1] and, in the same
	 * pass, the (1 + w) norms as 1 + w: such a folder's norms are used as
	 * they are. */
	for (int i = 0; i < c->n_layers && po; i++) {
		if (c->layer_type[i] != KV_LAYER_DELTANET)
			continue;
		char cn[160];
		snprintf(cn, sizeof cn, "%slayers.%d.linear_attn.conv1d.weight", m->prefix, i);
		const struct kv_tensor *ct = kv_weights_find(m->w, cn);
		if (ct && ct->ndim == 3 && ct->shape[2] == 1 && c->conv_kernel != 1)
			po = 0;
		break;
	}
	m->conv_dim = (int)kv_config_conv_dim(c);
	int nem = c->arch == KV_ARCH_NEMOTRON_H;
	if ((rc = load_mat(&L, &m->embed, nem ? "%sembeddings.weight" : "%sembed_tokens.weight", 0)))
		goto fail;
	m->n_mats--; /* the embedding table is looked up, not multiplied (unless tied, below) */
	if ((rc = load_vec(&L, &m->final_norm, c->hidden, po, nem ? "%snorm_f.weight" : "%snorm.weight", 0)))
		goto fail;
	if (c->tie_embeddings) {
		m->lm_head = m->embed;
		m->mats[m->n_mats] = m->embed;
		m->mat_names[m->n_mats++] = "lm_head (tied embed_tokens)";
	} else {
		char save[64];
		snprintf(save, sizeof save, "%s", m->prefix);
		/* lm_head.weight sits at the top level (language_model.lm_head in mlx-lm's names) */
		snprintf(m->prefix, sizeof m->prefix, "%s", kv_config_lm_head_name(save));
		rc = load_mat(&L, &m->lm_head, "%s", 0);
		snprintf(m->prefix, sizeof m->prefix, "%s", save);
		if (rc)
			goto fail;
	}
	if (c->ple_dim) {
		/* gemma4's per-layer embeddings: the table is looked up (not
		 * multiplied, like embed_tokens), its projection multiplied */
		if ((rc = load_mat(&L, &m->ple_embed, "%sembed_tokens_per_layer.weight", 0)))
			goto fail;
		m->n_mats--;
		if ((rc = load_mat(&L, &m->ple_proj, "%sper_layer_model_projection.weight", 0)) ||
		    (rc = load_vec(&L, &m->ple_norm, c->ple_dim, po, "%sper_layer_projection_norm.weight", 0)))
			goto fail;
	}
	int n_attn = 0, n_dn = 0, n_win = 0;
	for (int i = 0; i < c->n_layers; i++) {
		struct ke_layer *ly = &m->layers[i];
		if (c->ssm) {
			if ((rc = load_ssm_layer(&L, i)))
				goto fail;
			/* index among the recurrent layers (layout.rec) or the attention ones */
			ly->idx = ly->type == KV_LAYER_ATTN ? n_attn++ : ly->type == KV_LAYER_MAMBA ? n_dn++ : 0;
			continue;
		}
		ly->type = c->layer_type[i];
		/* gemma: post_attention_layernorm normalises the attention output
		 * and pre_feedforward_layernorm is the MLP's input norm */
		if ((rc = load_vec(&L, &ly->in_norm, c->hidden, po, "%slayers.%d.input_layernorm.weight", i)) ||
		    (rc = load_vec(&L, c->sandwich_norm ? &ly->attn_post_norm : &ly->post_norm, c->hidden, po,
				   "%slayers.%d.post_attention_layernorm.weight", i)))
			goto fail;
		if (c->sandwich_norm &&
		    ((rc = load_vec(&L, &ly->post_norm, c->hidden, po, "%slayers.%d.pre_feedforward_layernorm.weight", i)) ||
		     (rc = load_vec(&L, &ly->ffn_post_norm, c->hidden, po, "%slayers.%d.post_feedforward_layernorm.weight",
				    i))))
			goto fail;
		if (c->layer_scalar && (rc = load_vec(&L, &ly->scalar, 1, 0, "%slayers.%d.layer_scalar", i)))
			goto fail;
		if (c->ple_dim && ((rc = load_mat(&L, &ly->ple_gate, "%slayers.%d.per_layer_input_gate.weight", i)) ||
				   (rc = load_mat(&L, &ly->ple_out, "%slayers.%d.per_layer_projection.weight", i)) ||
				   (rc = load_vec(&L, &ly->ple_post, c->hidden, po,
						  "%slayers.%d.post_per_layer_input_norm.weight", i))))
			goto fail;
		if (ly->type == KV_LAYER_ATTN) {
			if ((rc = load_attn_layer(&L, i, po, &n_attn, &n_win)))
				goto fail;
		} else {
			ly->idx = n_dn++;
			ly->fused = c->fused_deltanet;
			if (ly->fused) {
				if ((rc = load_mat(&L, &ly->qkv, "%slayers.%d.linear_attn.in_proj_qkvz.weight", i)) ||
				    (rc = load_mat(&L, &ly->b, "%slayers.%d.linear_attn.in_proj_ba.weight", i)))
					goto fail;
			} else {
				if ((rc = load_mat(&L, &ly->qkv, "%slayers.%d.linear_attn.in_proj_qkv.weight", i)) ||
				    (rc = load_mat(&L, &ly->z, "%slayers.%d.linear_attn.in_proj_z.weight", i)) ||
				    (rc = load_mat(&L, &ly->b, "%slayers.%d.linear_attn.in_proj_b.weight", i)) ||
				    (rc = load_mat(&L, &ly->a, "%slayers.%d.linear_attn.in_proj_a.weight", i)))
					goto fail;
			}
			const float *a_log;
			if ((rc = load_mat(&L, &ly->out, "%slayers.%d.linear_attn.out_proj.weight", i)) ||
			    (rc = load_vec(&L, &ly->conv_w, m->conv_dim * c->conv_kernel, 0,
					   "%slayers.%d.linear_attn.conv1d.weight", i)) ||
			    (rc = load_vec(&L, &a_log, c->lin_v_heads, 0, "%slayers.%d.linear_attn.A_log", i)) ||
			    (rc = load_vec(&L, &ly->dt_bias, c->lin_v_heads, 0, "%slayers.%d.linear_attn.dt_bias", i)) ||
			    (rc = load_vec(&L, &ly->gnorm, c->lin_v_dim, 0, "%slayers.%d.linear_attn.norm.weight", i)))
				goto fail;
			/* g = -exp(A_log) * softplus(a + dt_bias): keep -exp(A_log) (same rounding
			 * as Hugging Face's A_log.float().exp(), negated exactly). */
			float *na = (float *)a_log;
			for (int h = 0; h < c->lin_v_heads && !c->a_is_neg_exp; h++)
				na[h] = -expf(na[h]); /* a GGUF's ssm_a already is -exp(A_log) */
			ly->neg_a = na;
		}
		if (c->layer_moe[i]) { /* moe.c */
			if ((rc = ke_moe_load(m, i, &ly->moe)))
				goto fail;
			/* gemma4: the experts run beside the dense MLP */
			if (c->moe_kind != KV_MOE_GEMMA4)
				continue;
			if ((rc = load_vec(&L, &ly->ffn_post_norm1, c->hidden, po,
					   "%slayers.%d.post_feedforward_layernorm_1.weight", i)))
				goto fail;
		}
		if ((rc = load_mat(&L, &ly->gate, "%slayers.%d.mlp.gate_proj.weight", i)) ||
		    (rc = load_mat(&L, &ly->up, "%slayers.%d.mlp.up_proj.weight", i)) ||
		    (rc = load_mat(&L, &ly->down, "%slayers.%d.mlp.down_proj.weight", i)))
			goto fail;
	}
	if ((rc = load_mtp(&L, po)))
		goto fail;
	if ((rc = rope_setup(&L)))
		goto fail;

	fill_layout(m, ke_kv_dtype(p->kv), p->page_tokens ? p->page_tokens : 256);
	if (m->lay.n_segments > 0) {
		m->pages = kv_pages_create(m->lay.page_bytes, p->max_pages, 8);
		if (!m->pages) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory for the page pool");
			goto fail;
		}
	}
	if (m->wlay.n_segments > 0) {
		/* window pages are per sequence (a few each), never cached */
		m->wpages = kv_pages_create(m->wlay.page_bytes, 0, 8);
		if (!m->wpages) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory for the window page pool");
			goto fail;
		}
	}
	if ((rc = mtp_pages(m)))
		goto fail;
	mats_finish(m);
	double t_touch = kv_now_s(), touched = touch_weights(m);
	t_touch = kv_now_s() - t_touch;
	double t_pack = kv_now_s();
	m->packed_bytes = prepack(m);
	double packed = (double)m->packed_bytes;
	t_pack = kv_now_s() - t_pack;
	KV_INFO("engine.model.load", "dir=%s arch=%s layers=%d attn=%d sliding=%d window=%d deltanet=%d mamba=%d "
		"hidden=%d vocab=%d kv=%s "
		"page_tokens=%d weights_mb=%.1f touched_mb=%.1f touch_ms=%.0f packed_mb=%.1f pack_ms=%.0f mtp=%d", dir,
		kv_arch_name(c->arch),
		c->n_layers, c->n_attn_layers, c->n_swa_layers, c->sliding_window, c->n_deltanet_layers, c->n_ssm_layers,
		c->hidden, c->vocab, ke_kv_name(p->kv),
		m->lay.page_tokens, (double)kv_weights_bytes(m->w) / 1048576.0, touched / 1048576.0, t_touch * 1e3,
		packed / 1048576.0, t_pack * 1e3, m->mtp != NULL);
	kv_mlx_qcfg_free(L.q);
	free(L.specs);
	*out = m;
	return KV_OK;
fail:
	kv_mlx_qcfg_free(L.q);
	free(L.specs);
	ke_model_destroy(m);
	return rc;
}

void *ke_stash_take(struct ke_model *m, int kind, size_t bytes)
{
	void *p = NULL;
	pthread_mutex_lock(&m->stash_lock);
	if (kind == 0) {
		for (int i = 0; i < m->n_scratch; i++) {
			if (m->stash_scratch_bytes[i] != bytes)
				continue;
			p = m->stash_scratch[i];
			m->n_scratch--;
			m->stash_scratch[i] = m->stash_scratch[m->n_scratch];
			m->stash_scratch_bytes[i] = m->stash_scratch_bytes[m->n_scratch];
			break;
		}
	} else if (m->n_rec && bytes == m->lay.rec_bytes) {
		p = m->stash_rec[--m->n_rec];
	}
	pthread_mutex_unlock(&m->stash_lock);
	return p;
}

void ke_stash_put(struct ke_model *m, int kind, void *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&m->stash_lock);
	if (kind == 0 && m->n_scratch < KE_STASH) {
		m->stash_scratch_bytes[m->n_scratch] = kv_alloc_size(p);
		m->stash_scratch[m->n_scratch++] = p;
		p = NULL;
	} else if (kind == 1 && m->n_rec < KE_STASH) {
		m->stash_rec[m->n_rec++] = p;
		p = NULL;
	}
	pthread_mutex_unlock(&m->stash_lock);
	kv_free(p);
}

void ke_model_destroy(struct ke_model *m)
{
	if (!m)
		return;
	for (int i = 0; i < m->n_scratch; i++)
		kv_free(m->stash_scratch[i]);
	for (int i = 0; i < m->n_rec; i++)
		kv_free(m->stash_rec[i]);
	pthread_mutex_destroy(&m->stash_lock);
	if (m->pages)
		kv_pages_destroy(m->pages);
	if (m->wpages)
		kv_pages_destroy(m->wpages);
	for (int i = 0; i < KV_MAX_LAYERS; i++)
		ke_moe_free(m->layers[i].moe);
	if (m->mtp) {
		ke_moe_free(m->mtp->layer.moe);
		if (m->mtp->pages)
			kv_pages_destroy(m->mtp->pages);
		kv_free(m->mtp);
	}
	kv_free(m->owned);
	kv_free(m->packed);
	if (m->w)
		kv_weights_close(m->w);
	free(m);
}

size_t ke_model_packed_bytes(const struct ke_model *m)
{
	return m->packed_bytes;
}

const struct kv_model_config *ke_model_config(const struct ke_model *m)
{
	return &m->cfg;
}

const struct ke_layout *ke_model_layout(const struct ke_model *m)
{
	return &m->lay;
}

struct kv_pages *ke_model_pages(struct ke_model *m)
{
	return m->pages;
}

uint64_t ke_model_decode_bytes(const struct ke_model *m)
{
	return m->decode_bytes;
}

int ke_model_qdot(const struct ke_model *m)
{
	for (int i = 0; i < m->n_mats; i++)
		if (m->mats[i].qdot)
			return 1;
	return 0;
}

int ke_model_n_mats(const struct ke_model *m)
{
	return m->n_mats;
}

const struct ke_mat *ke_model_mat(const struct ke_model *m, int i, const char **name)
{
	if (i < 0 || i >= m->n_mats)
		return NULL;
	if (name)
		*name = m->mat_names[i];
	return &m->mats[i];
}

/* --- scratch plan ---------------------------------------------------------- */

size_t ke_scratch_plan(const struct ke_model *m, int chunk, struct ke_scratch *sc, void *block)
{
	const struct kv_model_config *c = &m->cfg;
	size_t C = (size_t)chunk, off = 0;
	char *b = block;
	struct ke_scratch tmp;
	if (!sc)
		sc = &tmp;
	memset(sc, 0, sizeof *sc);
	sc->chunk = chunk;
#define CARVE(field, nfloats) \
	do { \
		size_t _n = (size_t)(nfloats); \
		sc->field = b ? (float *)(void *)(b + off) : NULL; \
		off += ((_n * sizeof(float)) + 63) & ~(size_t)63; \
	} while (0)
	/* the wider of the global and the sliding layers' heads (gemma4) */
	int hd_max = c->head_dim > kv_config_swa_head_dim(c) ? c->head_dim : kv_config_swa_head_dim(c);
	size_t kv_g = (size_t)c->n_kv_heads * c->head_dim,
	       kv_s = (size_t)kv_config_swa_kv_heads(c) * kv_config_swa_head_dim(c);
	size_t Hhd = (size_t)c->n_heads * hd_max, KVhd = kv_g > kv_s ? kv_g : kv_s;
	CARVE(x, C * c->hidden);
	CARVE(h, C * c->hidden);
	if (c->ple_dim) { /* live across the layers of a chunk */
		CARVE(ple, C * (size_t)c->n_layers * (size_t)c->ple_dim);
		CARVE(ple2, C * (size_t)c->n_layers * (size_t)c->ple_dim);
	}
	if (c->n_attn_layers) {
		/* live across the layers of a chunk */
		CARVE(cosv, C * (size_t)(m->rot_half + 1));
		CARVE(sinv, C * (size_t)(m->rot_half + 1));
		if (m->inv_freq_local != m->inv_freq) {
			CARVE(cosl, C * (size_t)(m->rot_half_local + 1));
			CARVE(sinl, C * (size_t)(m->rot_half_local + 1));
		} else {
			sc->cosl = sc->cosv;
			sc->sinl = sc->sinv;
		}
		int th = kv_pool_size(kv_pool_global());
		sc->attn_threads = th;
		size_t as = ke_attn_scratch_floats(c->n_heads / c->n_kv_heads, c->head_dim);
		if (c->n_swa_layers) {
			size_t asw = ke_attn_scratch_floats(c->n_heads / kv_config_swa_kv_heads(c), kv_config_swa_head_dim(c));
			as = asw > as ? asw : as;
		}
		CARVE(attn_scr, (size_t)th * as);
	}
	/* One region for what lives inside one step of a layer: the attention
	 * buffers, the DeltaNet buffers and the MLP buffers are never live at
	 * the same time (each step ends by adding into x), so they overlay. */
	size_t base = off, end = off;
	/* Granite's dense MLP is shared_intermediate wide */
	size_t mlp_w = (size_t)(c->ssm && c->shared_intermediate > c->intermediate ? c->shared_intermediate
											: c->intermediate);
	if (c->double_wide) /* gemma4's double-wide KV-shared layers */
		mlp_w = 2 * (size_t)c->intermediate;
	if ((size_t)c->ple_dim > mlp_w) /* the per-layer embedding block's gate runs in m1 */
		mlp_w = (size_t)c->ple_dim;
	CARVE(m1, C * mlp_w);
	CARVE(m2, C * mlp_w);
	CARVE(moe, ke_moe_scratch_floats(c, chunk));
	end = off > end ? off : end;
	if (c->n_attn_layers) {
		off = base;
		CARVE(q, C * Hhd * (c->attn_output_gate ? 2 : 1));
		CARVE(qh, C * Hhd);
		if (c->attn_output_gate)
			CARVE(gate, C * Hhd);
		CARVE(k, C * KVhd);
		CARVE(v, C * KVhd);
		CARVE(att, C * Hhd);
		end = off > end ? off : end;
	}
	if (c->n_ssm_layers) {
		/* Mamba-2 (mamba.c): in_proj output, the scan's operands, y */
		size_t H = (size_t)c->ssm_heads, W = H * (size_t)c->ssm_head_dim;
		off = base;
		size_t GN = (size_t)c->ssm_groups * (size_t)c->ssm_state;
		CARVE(mix, C * (W + (size_t)kv_config_conv_dim(c) + H));
		CARVE(dq, C * (2 * W + 2 * GN + 2 * H)); /* the scan's compact operands (mamba.c) */
		CARVE(core, C * W);
		end = off > end ? off : end;
	}
	if (c->n_deltanet_layers) {
		size_t Hv = (size_t)c->lin_v_heads, vd = Hv * c->lin_v_dim;
		size_t conv = (size_t)kv_config_conv_dim(c);
		off = base;
		if (c->fused_deltanet) /* only Qwen3-Next regroups a fused projection */
			CARVE(mix, C * (conv + vd));
		CARVE(dq, C * conv);
		CARVE(z, C * vd);
		CARVE(ba, C * 2 * Hv);
		CARVE(beta, C * Hv);
		CARVE(alpha, C * Hv);
		CARVE(core, C * vd);
		end = off > end ? off : end;
	}
	off = end;
#undef CARVE
	sc->block = block;
	sc->bytes = off;
	return off;
}

size_t ke_model_scratch_bytes(const struct ke_model *m, int chunk)
{
	return ke_scratch_plan(m, chunk > 0 ? chunk : 256, NULL, NULL);
}

size_t ke_model_window_seq_bytes(const struct ke_model *m, int chunk)
{
	if (!m->lay.n_win_layers)
		return 0;
	size_t B = (size_t)m->wlay.page_tokens;
	size_t span = (size_t)m->lay.window + KE_ATTN_BLOCK + (size_t)(chunk > 0 ? chunk : 256);
	return ((span + B - 1) / B + 1) * m->wlay.page_bytes;
}
