/*
 * moe.c - the sparse MoE block, see moe.h.
 */
#include "engine/moe.h"
#include "engine/engine_int.h"
#include "engine/matmul.h"
#include "engine/vec.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/pool.h"
#include "engine/qdot.h"
#include "engine/qgemm.h"
#include "model/mlx.h"
#include "model/quant.h"
#include "model/weights.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The matrix dtypes an expert may have: what ke_gemm multiplies. */
static int dtype_ok(int dt)
{
	return dt == KV_DT_F32 || dt == KV_DT_BF16 || dt == KV_DT_F16 || kv_dtype_is_quant(dt);
}

/* A tensor of the block: present, of a dtype ke_gemm runs, and of the
 * given shape (ndim 2 or 3). An MLX quantized matrix (U32 codes with
 * .scales / .biases, mlx-lm's SwitchGLU stacks included) is checked
 * through model/mlx.h against the float shape, its leading expert
 * dimension folded into the rows; *mq gets its parts (NULL: refused).
 * Messages name the tensor. */
static int get(const struct ke_model *m, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2,
	       const struct kv_tensor **out, struct kv_mlx_qmat *mq)
{
	const struct kv_tensor *t = kv_weights_find(m->w, name);
	int64_t want[3] = {d0, d1, d2};
	char ws[96], hs[96];
	if (mq)
		memset(mq, 0, sizeof *mq);
	if (!t)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: weights lack tensor '%s' (expected shape %s)", m->dir, name,
			       kv_shape_str(ndim, want, ws, sizeof ws));
	if (t->dtype == KV_DT_U32 && mq) {
		int64_t rows = ndim == 3 ? d0 * d1 : d0, cols = ndim == 3 ? d2 : d1;
		int rc = kv_mlx_matrix(m->w, name, NULL, rows, cols, mq);
		if (rc)
			return rc;
		if (mq->codes->ndim != ndim || mq->codes->shape[0] != d0)
			return kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' has shape %s, expected %d dims led by %lld",
				       t->file, name, kv_shape_str(t->ndim, t->shape, hs, sizeof hs), ndim, (long long)d0);
		*out = t;
		return KV_OK;
	}
	if (!dtype_ok(t->dtype))
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: tensor '%s' is %s; experts run F32, BF16, F16, ggml block types "
			       "or MLX affine groups", t->file, name, kv_dtype_name(t->dtype) ? kv_dtype_name(t->dtype) : "?");
	int ok = t->ndim == ndim;
	for (int i = 0; ok && i < ndim; i++)
		ok = t->shape[i] == want[i];
	if (!ok)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' has shape %s, expected %s", t->file, name,
			       kv_shape_str(t->ndim, t->shape, hs, sizeof hs), kv_shape_str(ndim, want, ws, sizeof ws));
	int64_t cols = want[ndim - 1];
	if (t->dtype != KV_DT_F32 && t->dtype != KV_DT_BF16 && cols > KE_QGEMM_MAX_K)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: tensor '%s' has rows of %lld, above the %d quantized products take",
			       t->file, name, (long long)cols, KE_QGEMM_MAX_K);
	*out = t;
	return KV_OK;
}

/* A view of rows [r0, r0 + rows) of matrix e of a tensor holding a stack
 * of [rows_per][cols] matrices (e = 0 and rows_per = rows for a plain
 * matrix). No bytes are copied: the row stride of a block type is its
 * block row bytes (kv_dtype_row_bytes), and an MLX stack's codes, scales
 * and biases are offset alike. Rows of block types are whole blocks, so
 * any row is a valid start. */
static void view(const struct ke_model *m, struct ke_mat *v, const struct kv_tensor *t, const struct kv_mlx_qmat *mq,
		 int64_t e,
		 int64_t rows_per, int64_t r0, int rows, int cols)
{
	uint64_t row0 = (uint64_t)e * (uint64_t)rows_per + (uint64_t)r0;
	memset(v, 0, sizeof *v);
	v->rows = rows;
	v->cols = cols;
	v->ld = (size_t)cols;
	if (mq && mq->codes) {
		uint64_t sb = (uint64_t)(cols / mq->group) * kv_dtype_row_bytes(mq->scales->dtype, 1);
		v->dtype = KV_DT_MLX_AFFINE;
		v->data = (const char *)mq->codes->data + row0 * (uint64_t)cols * (uint64_t)mq->bits / 8;
		v->scales = (const char *)mq->scales->data + row0 * sb;
		v->biases = (const char *)mq->biases->data + row0 * sb;
		v->sb_dtype = mq->scales->dtype;
		v->bits = mq->bits;
		v->group = mq->group;
		return;
	}
	v->dtype = t->dtype;
	v->data = (const char *)t->data + row0 * kv_dtype_row_bytes(t->dtype, (uint64_t)cols);
	/* the model's --quant-act mode, as engine/model.c sets it for every
	 * other matrix, so experts and dense matrices round alike */
	v->qdot = m->qdot && ke_qdot_block(t->dtype) > 0;
}

static void list_mat(struct ke_model *m, const struct ke_mat *v, const char *name)
{
	if (m->n_mats < KE_MAX_MATS) {
		m->mats[m->n_mats] = *v;
		m->mat_names[m->n_mats++] = name;
	}
}

static int mat2(struct ke_model *m, struct ke_mat *v, int64_t rows, int64_t cols, const char *fmt, int layer,
		int list)
{
	char name[192];
	const struct kv_tensor *t;
	int rc;
	snprintf(name, sizeof name, fmt, m->prefix, layer);
	struct kv_mlx_qmat mq;
	if ((rc = get(m, name, 2, rows, cols, 0, &t, &mq)))
		return rc;
	view(m, v, t, &mq, 0, rows, 0, (int)rows, (int)cols);
	if (list)
		list_mat(m, v, t->name);
	return KV_OK;
}

/* A [rows][cols] float table (F32 / BF16 / F16) as f32 at dst. */
static int bias_copy(const struct ke_model *m, const char *name, int64_t rows, int64_t cols, float *dst)
{
	const struct kv_tensor *t = kv_weights_find(m->w, name);
	int64_t want[2] = {rows, cols};
	char ws[64], hs[64];
	if (!t)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: weights lack tensor '%s'", m->dir, name);
	if ((uint64_t)(rows * cols) != t->numel || (t->dtype != KV_DT_F32 && t->dtype != KV_DT_BF16 && t->dtype != KV_DT_F16))
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' is %s %s, expected a float %s", t->file, name,
			       kv_dtype_name(t->dtype) ? kv_dtype_name(t->dtype) : "?", kv_shape_str(t->ndim, t->shape, hs, sizeof hs),
			       kv_shape_str(cols > 1 ? 2 : 1, cols > 1 ? want : &want[0], ws, sizeof ws));
	return kv_tensor_to_f32(t, dst, 0, t->numel);
}

/* The release's U8 blocks [E, rows, nb, 16] and scales [E, rows, nb] of one
 * stack, repacked to ggml MXFP4 rows at dst (rows x nb x 17 bytes per
 * expert). Shapes are checked by kv_config_check_weights; checked again. */
static int mxfp4_stack(const struct ke_model *m, const char *base, int64_t E, int64_t rows, int64_t cols, uint8_t *dst)
{
	char bn[192], sn[192];
	snprintf(bn, sizeof bn, "%s_blocks", base);
	snprintf(sn, sizeof sn, "%s_scales", base);
	const struct kv_tensor *b = kv_weights_find(m->w, bn), *s = kv_weights_find(m->w, sn);
	uint64_t nb = (uint64_t)E * (uint64_t)rows * (uint64_t)(cols / 32);
	if (!b || !s)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: weights lack tensor '%s'", m->dir, b ? sn : bn);
	if (b->dtype != KV_DT_U8 || s->dtype != KV_DT_U8 || b->numel != nb * 16 || s->numel != nb || cols % 32)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: MXFP4 tensors '%s' / '%s' do not hold %lld x %lld x %lld U8 blocks",
			       b->file, bn, sn, (long long)E, (long long)rows, (long long)cols);
	kq_mxfp4_from_hf(b->data, s->data, nb, dst);
	return KV_OK;
}

/* GPT-OSS's block (moe.h): router with bias, experts with biases, from
 * the release's MXFP4 layout or switch_mlp stacks. */
static int oai_load(struct ke_model *m, int layer, struct ke_moe *mo)
{
	const struct kv_model_config *c = &m->cfg;
	const int64_t E = mo->E, I = mo->I, D = c->hidden;
	char name[192];
	int rc;
	int mx = c->expert_layout == KV_EXPERTS_OAI_MXFP4;
	size_t fl = (size_t)E + (size_t)E * 2 * (size_t)I + (size_t)E * (size_t)D;
	size_t gu_bytes = mx ? (size_t)(E * 2 * I) * (size_t)(D / 32) * 17 : 0;
	size_t dn_bytes = mx ? (size_t)(E * D) * (size_t)(I / 32) * 17 : 0;
	char *own = kv_alloc(KV_MEM_WEIGHTS, fl * sizeof(float) + gu_bytes + dn_bytes);
	if (!own)
		return kv_fail(KV_ERR_NOMEM, "out of memory for the experts of layer %d", layer);
	mo->owned = own;
	float *fb = (float *)(void *)own;
	mo->kind = KV_MOE_OAI;
	mo->limit = (float)c->swiglu_limit;
	mo->router_b = fb;
	mo->gu_b = fb + E;
	mo->up_b = mo->gu_b + E * I;
	mo->down_b = mo->gu_b + 2 * E * I;
	if ((rc = mat2(m, &mo->router, E, D, "%slayers.%d.mlp.router.weight", layer, 1)))
		return rc;
	snprintf(name, sizeof name, "%slayers.%d.mlp.router.bias", m->prefix, layer);
	if ((rc = bias_copy(m, name, E, 1, fb)))
		return rc;
	if (mx) {
		uint8_t *gu = (uint8_t *)own + fl * sizeof(float), *dn = gu + gu_bytes;
		snprintf(name, sizeof name, "%slayers.%d.mlp.experts.gate_up_proj", m->prefix, layer);
		if ((rc = mxfp4_stack(m, name, E, 2 * I, D, gu)))
			return rc;
		snprintf(name, sizeof name, "%slayers.%d.mlp.experts.down_proj", m->prefix, layer);
		if ((rc = mxfp4_stack(m, name, E, D, I, dn)))
			return rc;
		snprintf(name, sizeof name, "%slayers.%d.mlp.experts.gate_up_proj_bias", m->prefix, layer);
		if ((rc = bias_copy(m, name, E, 2 * I, (float *)mo->gu_b)))
			return rc;
		snprintf(name, sizeof name, "%slayers.%d.mlp.experts.down_proj_bias", m->prefix, layer);
		if ((rc = bias_copy(m, name, E, D, (float *)mo->down_b)))
			return rc;
		mo->gu_fused = 1;
		for (int e = 0; e < E; e++) {
			struct ke_mat *g = &mo->gate[e], *d = &mo->down[e];
			memset(g, 0, sizeof *g);
			memset(d, 0, sizeof *d);
			*g = (struct ke_mat){gu + (size_t)e * (size_t)(2 * I) * (size_t)(D / 32) * 17, KV_DT_MXFP4, (int)(2 * I),
					     (int)D, (size_t)D};
			*d = (struct ke_mat){dn + (size_t)e * (size_t)D * (size_t)(I / 32) * 17, KV_DT_MXFP4, (int)D, (int)I,
					     (size_t)I};
			/* the --quant-act mode, as view() sets it for GGUF's stacks:
			 * the release folder and its GGUF round alike */
			g->qdot = d->qdot = m->qdot;
		}
		return KV_OK;
	}
	/* switch_mlp stacks (GGUF, MLX): separate gate and up, with biases */
	static const char *const nm[3] = {"gate_proj", "up_proj", "down_proj"};
	const struct kv_tensor *st[3];
	struct kv_mlx_qmat mq[3];
	float *bd[3] = {(float *)mo->gu_b, (float *)mo->up_b, (float *)mo->down_b};
	for (int j = 0; j < 3; j++) {
		snprintf(name, sizeof name, "%slayers.%d.mlp.switch_mlp.%s.weight", m->prefix, layer, nm[j]);
		if ((rc = get(m, name, 3, E, j == 2 ? D : I, j == 2 ? I : D, &st[j], &mq[j])))
			return rc;
		snprintf(name, sizeof name, "%slayers.%d.mlp.switch_mlp.%s.bias", m->prefix, layer, nm[j]);
		if ((rc = bias_copy(m, name, E, j == 2 ? D : I, bd[j])))
			return rc;
	}
	for (int e = 0; e < E; e++) {
		view(m, &mo->gate[e], st[0], &mq[0], e, I, 0, (int)I, (int)D);
		view(m, &mo->up[e], st[1], &mq[1], e, I, 0, (int)I, (int)D);
		view(m, &mo->down[e], st[2], &mq[2], e, D, 0, (int)D, (int)I);
	}
	return KV_OK;
}

/* The experts of layer `layer` as views into the stacked gate_up
 * [E][2I][D] (expert e's gate rows, then its up rows) and down [E][D][I]
 * tensors layers.N.<gu> and layers.N.<down>. */
static int stacked_views(struct ke_model *m, struct ke_moe *mo, int layer, const char *gu_name, const char *dn_name)
{
	const int E = mo->E, I = mo->I, D = m->cfg.hidden;
	char name[192];
	const struct kv_tensor *gu, *dn;
	int rc;
	snprintf(name, sizeof name, "%slayers.%d.%s", m->prefix, layer, gu_name);
	if ((rc = get(m, name, 3, E, 2 * (int64_t)I, D, &gu, NULL)))
		return rc;
	snprintf(name, sizeof name, "%slayers.%d.%s", m->prefix, layer, dn_name);
	if ((rc = get(m, name, 3, E, D, I, &dn, NULL)))
		return rc;
	for (int e = 0; e < E; e++) {
		view(m, &mo->gate[e], gu, NULL, e, 2 * (int64_t)I, 0, I, D);
		view(m, &mo->up[e], gu, NULL, e, 2 * (int64_t)I, I, I, D);
		view(m, &mo->down[e], dn, NULL, e, D, 0, D, I);
	}
	return KV_OK;
}

/* Gemma 4's block (moe.h): router.proj / .scale / .per_expert_scale, the
 * fused experts.gate_up_proj [E][2I][D] (gate rows then up rows) and
 * experts.down_proj [E][D][I], the two branch norms. */
static int gemma4_load(struct ke_model *m, int layer, struct ke_moe *mo)
{
	const struct kv_model_config *c = &m->cfg;
	const int E = mo->E, D = c->hidden;
	char name[192];
	int rc;
	mo->kind = KV_MOE_GEMMA4;
	mo->eps = (float)c->rms_eps;
	float *f = kv_alloc(KV_MEM_WEIGHTS, (3 * (size_t)D + (size_t)E) * sizeof *f);
	if (!f)
		return kv_fail(KV_ERR_NOMEM, "out of memory for the experts of layer %d", layer);
	mo->owned = f;
	mo->rscale = f;
	mo->pre2 = f + D;
	mo->post2 = f + 2 * (size_t)D;
	mo->escale = f + 3 * (size_t)D;
	static const char *const vn[4] = {"router.scale", "pre_feedforward_layernorm_2.weight",
					  "post_feedforward_layernorm_2.weight", "router.per_expert_scale"};
	for (int i = 0; i < 4; i++) {
		snprintf(name, sizeof name, "%slayers.%d.%s", m->prefix, layer, vn[i]);
		if ((rc = bias_copy(m, name, i == 3 ? E : D, 1, f + (size_t)i * D)))
			return rc;
	}
	if ((rc = mat2(m, &mo->router, E, D, "%slayers.%d.router.proj.weight", layer, 1)))
		return rc;
	return stacked_views(m, mo, layer, "experts.gate_up_proj", "experts.down_proj");
}

int ke_moe_load(struct ke_model *m, int layer, struct ke_moe **out)
{
	const struct kv_model_config *c = &m->cfg;
	const int E = c->n_experts, I = c->moe_intermediate, Is = c->shared_intermediate, D = c->hidden;
	char name[192];
	const struct kv_tensor *t;
	int rc;

	*out = NULL;
	struct ke_moe *mo = kv_alloc(KV_MEM_WEIGHTS, sizeof *mo + 3 * (size_t)E * sizeof(struct ke_mat));
	if (!mo)
		return kv_fail(KV_ERR_NOMEM, "out of memory for the experts of layer %d", layer);
	/* the views too: GPT-OSS's fused MXFP4 experts leave up[] unused, and
	 * whoever walks every expert (touch_weights) must see them empty */
	memset(mo, 0, sizeof *mo + 3 * (size_t)E * sizeof(struct ke_mat));
	mo->E = E;
	mo->k = c->n_experts_per_tok;
	mo->I = I;
	mo->Is = Is;
	mo->norm_topk = c->norm_topk_prob;
	mo->gate = (struct ke_mat *)(mo + 1);
	mo->up = mo->gate + E;
	mo->down = mo->up + E;
	if (c->moe_kind == KV_MOE_OAI || c->moe_kind == KV_MOE_GEMMA4) {
		if ((rc = c->moe_kind == KV_MOE_OAI ? oai_load(m, layer, mo) : gemma4_load(m, layer, mo)))
			goto fail;
		*out = mo;
		return KV_OK;
	}
	if ((rc = mat2(m, &mo->router, E, D, "%slayers.%d.mlp.gate.weight", layer, 1)) ||
	    (rc = mat2(m, &mo->sh_gate, Is, D, "%slayers.%d.mlp.shared_expert.gate_proj.weight", layer, 1)) ||
	    (rc = mat2(m, &mo->sh_up, Is, D, "%slayers.%d.mlp.shared_expert.up_proj.weight", layer, 1)) ||
	    (rc = mat2(m, &mo->sh_down, D, Is, "%slayers.%d.mlp.shared_expert.down_proj.weight", layer, 1)) ||
	    (rc = mat2(m, &mo->sh_router, 1, D, "%slayers.%d.mlp.shared_expert_gate.weight", layer, 0)))
		goto fail;
	snprintf(name, sizeof name, "%slayers.%d.mlp.experts.gate_up_proj", m->prefix, layer);
	if (kv_weights_find(m->w, name)) {
		if ((rc = stacked_views(m, mo, layer, "mlp.experts.gate_up_proj", "mlp.experts.down_proj")))
			goto fail;
	} else if (snprintf(name, sizeof name, "%slayers.%d.mlp.switch_mlp.gate_proj.weight", m->prefix, layer),
		   kv_weights_find(m->w, name)) {
		/* mlx-lm SwitchGLU (floats or MLX groups) and GGUF's
		 * ffn_{gate,up,down}_exps: separate [E][I][D] gate and up stacks */
		static const char *const nm[3] = {"gate_proj", "up_proj", "down_proj"};
		const struct kv_tensor *st[3];
		struct kv_mlx_qmat mq[3];
		for (int j = 0; j < 3; j++) {
			snprintf(name, sizeof name, "%slayers.%d.mlp.switch_mlp.%s.weight", m->prefix, layer, nm[j]);
			if ((rc = get(m, name, 3, E, j == 2 ? D : I, j == 2 ? I : D, &st[j], &mq[j])))
				goto fail;
		}
		for (int e = 0; e < E; e++) {
			view(m, &mo->gate[e], st[0], &mq[0], e, I, 0, I, D);
			view(m, &mo->up[e], st[1], &mq[1], e, I, 0, I, D);
			view(m, &mo->down[e], st[2], &mq[2], e, D, 0, D, I);
		}
	} else {
		for (int e = 0; e < E; e++) {
			static const char *const nm[3] = {"gate_proj", "up_proj", "down_proj"};
			struct ke_mat *dst[3] = {&mo->gate[e], &mo->up[e], &mo->down[e]};
			for (int j = 0; j < 3; j++) {
				int rows = j == 2 ? D : I, cols = j == 2 ? I : D;
				snprintf(name, sizeof name, "%slayers.%d.mlp.experts.%d.%s.weight", m->prefix, layer, e,
					 nm[j]);
				struct kv_mlx_qmat mq;
				if ((rc = get(m, name, 2, rows, cols, 0, &t, &mq)))
					goto fail;
				view(m, dst[j], t, &mq, 0, rows, 0, rows, cols);
			}
		}
	}
	*out = mo;
	return KV_OK;
fail:
	ke_moe_free(mo);
	return rc;
}

int ke_moe_load_granite(struct ke_model *m, int layer, struct ke_moe **out)
{
	const struct kv_model_config *c = &m->cfg;
	const int E = c->n_experts, I = c->moe_intermediate, Is = c->shared_intermediate, D = c->hidden;
	char name[192];
	const struct kv_tensor *t;
	struct kv_mlx_qmat mq;
	int rc;

	*out = NULL;
	struct ke_moe *mo = kv_alloc(KV_MEM_WEIGHTS, sizeof *mo + 3 * (size_t)E * sizeof(struct ke_mat));
	if (!mo)
		return kv_fail(KV_ERR_NOMEM, "out of memory for the experts of layer %d", layer);
	memset(mo, 0, sizeof *mo);
	mo->E = E;
	mo->k = c->n_experts_per_tok;
	mo->I = I;
	mo->Is = Is;
	mo->norm_topk = 1;
	mo->out_scale = c->residual_mult > 0 ? (float)c->residual_mult : 1.0f;
	mo->gate = (struct ke_mat *)(mo + 1);
	mo->up = mo->gate + E;
	mo->down = mo->up + E;
	if (c->shared_split) { /* a GGUF's ffn_{gate,up}_shexp */
		if ((rc = mat2(m, &mo->sh_gate, Is, D, "%slayers.%d.shared_mlp.gate_proj.weight", layer, 1)) ||
		    (rc = mat2(m, &mo->sh_up, Is, D, "%slayers.%d.shared_mlp.up_proj.weight", layer, 1)))
			goto fail;
	} else {
		/* the shared expert's gate and up are the two halves of one matrix */
		snprintf(name, sizeof name, "%slayers.%d.shared_mlp.input_linear.weight", m->prefix, layer);
		if ((rc = get(m, name, 2, 2 * (int64_t)Is, D, 0, &t, &mq)))
			goto fail;
		view(m, &mo->sh_gate, t, &mq, 0, 2 * (int64_t)Is, 0, Is, D);
		view(m, &mo->sh_up, t, &mq, 0, 2 * (int64_t)Is, Is, Is, D);
		list_mat(m, &mo->sh_gate, t->name);
		list_mat(m, &mo->sh_up, t->name);
	}
	if ((rc = mat2(m, &mo->router, E, D, "%slayers.%d.block_sparse_moe.router.layer.weight", layer, 1)) ||
	    (rc = mat2(m, &mo->sh_down, D, Is, "%slayers.%d.shared_mlp.output_linear.weight", layer, 1)))
		goto fail;
	snprintf(name, sizeof name, "%slayers.%d.block_sparse_moe.input_linear.weight", m->prefix, layer);
	if (kv_weights_find(m->w, name)) {
		if ((rc = stacked_views(m, mo, layer, "block_sparse_moe.input_linear.weight",
					"block_sparse_moe.output_linear.weight")))
			goto fail;
	} else {
		static const char *const nm[3] = {"gate_proj", "up_proj", "down_proj"};
		const struct kv_tensor *st[3];
		struct kv_mlx_qmat sq[3];
		for (int j = 0; j < 3; j++) {
			snprintf(name, sizeof name, "%slayers.%d.block_sparse_moe.switch_mlp.%s.weight", m->prefix, layer,
				 nm[j]);
			if ((rc = get(m, name, 3, E, j == 2 ? D : I, j == 2 ? I : D, &st[j], &sq[j])))
				goto fail;
		}
		for (int e = 0; e < E; e++) {
			view(m, &mo->gate[e], st[0], &sq[0], e, I, 0, I, D);
			view(m, &mo->up[e], st[1], &sq[1], e, I, 0, I, D);
			view(m, &mo->down[e], st[2], &sq[2], e, D, 0, D, I);
		}
	}
	*out = mo;
	return KV_OK;
fail:
	kv_free(mo);
	return rc;
}

void ke_moe_free(struct ke_moe *mo)
{
	if (mo)
		kv_free(mo->owned);
	kv_free(mo);
}

#define ALIGN16(n) (((size_t)(n) + 15) & ~(size_t)15)

struct moe_scr {
	float *logits; /* [C][E] router logits, then probabilities */
	float *w;      /* [C][k] weights of the selected experts (ascending id) */
	int32_t *sel;  /* [C][k] selected expert ids, ascending */
	int32_t *list; /* [C k] slots t * k + r grouped by expert */
	int32_t *cnt;  /* [E + 1] start of each expert's group in list */
	float *xin;    /* [C][D] gathered inputs, then that expert's outputs */
	float *g1, *g2; /* [C][max(I, Is)] */
	float *eo;     /* [C k][D] expert output of each slot */
	float *so;     /* [C][D] shared expert output */
	float *sg;     /* [C] shared expert gate logit */
	int32_t *act;  /* [E] experts with at least one slot */
	float *par;    /* threads x PAR_ROWS x (D + 2 Im): per-thread xin, g1, g2 */
	float *rin;    /* [C][D] gemma4: the router's input, then the experts' */
};

/* Experts run in parallel (one per thread, single-threaded products) when
 * each has at most PAR_ROWS tokens, as in decode; bigger groups split
 * their products' rows over the threads instead. Same bits either way. */
#define PAR_ROWS 16

static size_t carve(const struct kv_model_config *c, int C, float *base, struct moe_scr *s)
{
	size_t E = (size_t)c->n_experts, k = (size_t)c->n_experts_per_tok, D = (size_t)c->hidden;
	size_t Im = (size_t)(c->moe_intermediate > c->shared_intermediate ? c->moe_intermediate
									  : c->shared_intermediate);
	if (c->moe_kind == KV_MOE_OAI)
		Im = 2 * (size_t)c->moe_intermediate; /* the interleaved gate_up outputs */
	size_t off = 0, n = (size_t)C;
#define TAKE(field, type, count) \
	do { \
		if (s) \
			s->field = (type *)(void *)(base + off); \
		off += ALIGN16(count); \
	} while (0)
	TAKE(logits, float, n * E);
	TAKE(w, float, n * k);
	TAKE(sel, int32_t, n * k);
	TAKE(list, int32_t, n * k);
	TAKE(cnt, int32_t, E + 1);
	TAKE(xin, float, n * D);
	TAKE(g1, float, n * Im);
	TAKE(g2, float, n * Im);
	TAKE(eo, float, n * k * D);
	TAKE(so, float, n * D);
	TAKE(sg, float, n);
	TAKE(act, int32_t, E);
	TAKE(par, float, (size_t)kv_pool_size(kv_pool_global()) * PAR_ROWS * (D + 2 * Im));
	if (c->moe_kind == KV_MOE_GEMMA4)
		TAKE(rin, float, n * D);
#undef TAKE
	return off;
}

size_t ke_moe_scratch_floats(const struct kv_model_config *c, int chunk)
{
	if (!c->n_moe_layers)
		return 0;
	return carve(c, chunk, NULL, NULL);
}

/* GPT-OSS routing: the k largest logits (strict-greater argmax passes:
 * ties to the lower id), softmax over those values in rank order, listed
 * by ascending id. */
static void oai_route(const struct ke_moe *mo, const float *lg, int32_t *sel, float *w)
{
	const int E = mo->E, k = mo->k;
	uint64_t taken[(1 << 16) / 64 + 1];
	int32_t rk[64];
	float ev[64], sum = 0.0f;
	memset(taken, 0, ((size_t)E / 64 + 1) * sizeof taken[0]);
	for (int r = 0; r < k; r++) {
		int best = -1;
		for (int e = 0; e < E; e++) {
			if (taken[e >> 6] >> (e & 63) & 1)
				continue;
			if (best < 0 || lg[e] > lg[best])
				best = e;
		}
		taken[best >> 6] |= 1ull << (best & 63);
		rk[r] = best;
	}
	for (int r = 0; r < k; r++) { /* rank 0 holds the maximum */
		ev[r] = ke_exp(lg[rk[r]] - lg[rk[0]]);
		sum += ev[r];
	}
	int r = 0;
	for (int e = 0; e < E && r < k; e++)
		if (taken[e >> 6] >> (e & 63) & 1) {
			int q = 0;
			while (rk[q] != e)
				q++;
			sel[r] = e;
			w[r] = ev[q] / sum;
			r++;
		}
}

void ke_moe_route(const struct ke_moe *mo, float *p, int32_t *sel, float *w)
{
	const int E = mo->E, k = mo->k;
	if (mo->kind == KV_MOE_OAI) {
		oai_route(mo, p, sel, w);
		return;
	}
	float mx = p[0], sum = 0.0f;
	for (int e = 1; e < E; e++)
		mx = p[e] > mx ? p[e] : mx;
	for (int e = 0; e < E; e++) {
		p[e] = ke_exp(p[e] - mx);
		sum += p[e];
	}
	float inv = 1.0f / sum;
	for (int e = 0; e < E; e++)
		p[e] = p[e] * inv;
	/* top-k: k passes of a strict-greater argmax, so among equal
	 * probabilities the lower expert id wins. The chosen set is then
	 * listed in ascending id, the order the outputs are summed in. */
	uint64_t taken[(1 << 16) / 64 + 1];
	memset(taken, 0, ((size_t)E / 64 + 1) * sizeof taken[0]);
	float tsum = 0.0f;
	for (int r = 0; r < k; r++) {
		int best = -1;
		for (int e = 0; e < E; e++) {
			if (taken[e >> 6] >> (e & 63) & 1)
				continue;
			if (best < 0 || p[e] > p[best])
				best = e;
		}
		taken[best >> 6] |= 1ull << (best & 63);
		tsum += p[best]; /* in rank order, like torch's sum over the top-k */
	}
	int r = 0;
	for (int e = 0; e < E && r < k; e++)
		if (taken[e >> 6] >> (e & 63) & 1) {
			sel[r] = e;
			w[r] = mo->norm_topk ? p[e] / tsum : p[e];
			r++;
		}
}

struct expert_job {
	const struct ke_moe *mo;
	const struct moe_scr *s;
	const float *h;
	int D;
	int shared_bufs;   /* 1: use the chunk-sized buffers (one thread) */
};

/* GPT-OSS expert e on m gathered rows xin [m][D]; its output replaces
 * xin. g1 holds up to 2I floats a row, g2 I. */
static void oai_expert(const struct ke_moe *mo, int e, float *xin, int m, int D, float *g1, float *g2)
{
	const int I = mo->I;
	const float L = mo->limit;
	if (mo->gu_fused) {
		ke_gemm(&mo->gate[e], xin, (size_t)D, m, g1, 2 * (size_t)I, 0);
	} else {
		/* separate stacks: gate into g1's first half, up into g2, then
		 * interleaved like the release's outputs */
		ke_gemm(&mo->gate[e], xin, (size_t)D, m, g2, (size_t)I, 0);
		for (int t = m - 1; t >= 0; t--)
			for (int i = I - 1; i >= 0; i--)
				g1[(size_t)t * 2 * I + 2 * i] = g2[(size_t)t * I + i];
		ke_gemm(&mo->up[e], xin, (size_t)D, m, g2, (size_t)I, 0);
		for (int t = 0; t < m; t++)
			for (int i = 0; i < I; i++)
				g1[(size_t)t * 2 * I + 2 * i + 1] = g2[(size_t)t * I + i];
	}
	const float *bg = mo->gu_b + (size_t)e * (mo->gu_fused ? 2 * (size_t)I : (size_t)I);
	const float *bu = mo->gu_fused ? bg + 1 : mo->up_b + (size_t)e * I;
	int st = mo->gu_fused ? 2 : 1;
	/* glu = g / (1 + exp(-1.702 g)), y = (u + 1) glu; the exps of a row
	 * in one ke_vec_exp call (the canonical exp on every path: the same
	 * bits as ke_exp, at a fraction of a scalar call each) */
	for (int t = 0; t < m; t++) {
		float *a = g1 + (size_t)t * 2 * I;
		float *y = g2 + (size_t)t * I;
		for (int i = 0; i < I; i++) {
			float g = a[2 * i] + bg[(size_t)st * i], u = a[2 * i + 1] + bu[(size_t)st * i];
			a[2 * i] = g < L ? g : L;
			a[2 * i + 1] = u < L ? (u > -L ? u : -L) : L;
			y[i] = 0.0f - 1.702f * a[2 * i];
		}
		ke_vec_exp(y, y, I);
		for (int i = 0; i < I; i++) {
			float glu = a[2 * i] / (1.0f + y[i]);
			y[i] = (a[2 * i + 1] + 1.0f) * glu;
		}
	}
	ke_gemm(&mo->down[e], g2, (size_t)I, m, xin, (size_t)D, 0);
	const float *bd = mo->down_b + (size_t)e * D;
	for (int t = 0; t < m; t++)
		for (int i = 0; i < D; i++)
			xin[(size_t)t * D + i] = xin[(size_t)t * D + i] + bd[i];
}

static void experts_part(void *ctx, size_t b0, size_t b1, int thread)
{
	const struct expert_job *j = ctx;
	const struct ke_moe *mo = j->mo;
	const struct moe_scr *s = j->s;
	const int D = j->D, k = mo->k, I = mo->I;
	/* the row width carve() gave g1 and g2: GPT-OSS's gate_up is 2I wide */
	const size_t Im = mo->kind == KV_MOE_OAI ? 2 * (size_t)mo->I : (size_t)(mo->I > mo->Is ? mo->I : mo->Is);
	float *xin = s->xin, *g1 = s->g1, *g2 = s->g2;
	if (!j->shared_bufs) {
		xin = s->par + (size_t)thread * PAR_ROWS * ((size_t)D + 2 * Im);
		g1 = xin + (size_t)PAR_ROWS * D;
		g2 = g1 + (size_t)PAR_ROWS * Im;
	}
	for (size_t a = b0; a < b1; a++) {
		int e = s->act[a], b = s->cnt[e], m = s->cnt[e + 1] - b;
		for (int i = 0; i < m; i++)
			memcpy(xin + (size_t)i * D, j->h + (size_t)(s->list[b + i] / k) * D, (size_t)D * sizeof *xin);
		if (mo->kind == KV_MOE_OAI) {
			oai_expert(mo, e, xin, m, D, g1, g2);
		} else if (mo->kind == KV_MOE_GEMMA4) {
			ke_gemm(&mo->gate[e], xin, (size_t)D, m, g1, (size_t)I, 0);
			ke_gemm(&mo->up[e], xin, (size_t)D, m, g2, (size_t)I, 0);
			ke_vec_gelu_tanh_mul(g1, g2, m * I);
			ke_gemm(&mo->down[e], g1, (size_t)I, m, xin, (size_t)D, 0);
			const float sc = mo->escale[e];
			for (size_t q = 0; q < (size_t)m * D; q++)
				xin[q] = xin[q] * sc;
		} else {
			ke_gemm(&mo->gate[e], xin, (size_t)D, m, g1, (size_t)I, 0);
			ke_gemm(&mo->up[e], xin, (size_t)D, m, g2, (size_t)I, 0);
			ke_vec_silu_mul(g1, g2, m * I);
			ke_gemm(&mo->down[e], g1, (size_t)I, m, xin, (size_t)D, 0);
		}
		for (int i = 0; i < m; i++)
			memcpy(s->eo + (size_t)s->list[b + i] * D, xin + (size_t)i * D, (size_t)D * sizeof *xin);
	}
}

/* Route the n tokens, run each selected expert once on its tokens (their
 * outputs in s->eo, slot t * k + r); rin: the router's input rows (h for
 * all but gemma4). */
static void route_and_run(const struct ke_moe *mo, const float *rin, const float *h, int n, int D,
			  struct moe_scr *sp)
{
	const int E = mo->E, k = mo->k;
	struct moe_scr s = *sp;
	ke_gemm(&mo->router, rin, (size_t)D, n, s.logits, (size_t)E, 0);
	if (mo->router_b)
		for (int t = 0; t < n; t++)
			for (int e = 0; e < E; e++)
				s.logits[(size_t)t * E + e] = s.logits[(size_t)t * E + e] + mo->router_b[e];
	for (int t = 0; t < n; t++)
		ke_moe_route(mo, s.logits + (size_t)t * E, s.sel + (size_t)t * k, s.w + (size_t)t * k);

	/* group slots by expert (counting sort, token order inside a group) */
	memset(s.cnt, 0, ((size_t)E + 1) * sizeof *s.cnt);
	for (int i = 0; i < n * k; i++)
		s.cnt[s.sel[i] + 1]++;
	for (int e = 0; e < E; e++)
		s.cnt[e + 1] += s.cnt[e];
	for (int i = 0; i < n * k; i++)
		s.list[s.cnt[s.sel[i]]++] = i;
	for (int e = E; e > 0; e--)
		s.cnt[e] = s.cnt[e - 1];
	s.cnt[0] = 0;

	/* each expert once, on all its tokens; the rows do not depend on how
	 * many there are (ke_gemm) */
	int n_act = 0, max_m = 0;
	for (int e = 0; e < E; e++) {
		int m = s.cnt[e + 1] - s.cnt[e];
		if (m)
			s.act[n_act++] = e;
		max_m = m > max_m ? m : max_m;
	}
	struct expert_job j = {mo, &s, h, D, 0};
	if (n_act > 1 && max_m <= PAR_ROWS) {
		kv_pool_for(kv_pool_global(), (size_t)n_act, 1, experts_part, &j);
	} else {
		j.shared_bufs = 1;
		experts_part(&j, 0, (size_t)n_act, 0);
	}
}

static void carve_for(const struct ke_moe *mo, int n, int D, float *scratch, struct moe_scr *s)
{
	struct kv_model_config cc;
	cc.n_experts = mo->E;
	cc.n_experts_per_tok = mo->k;
	cc.hidden = D;
	cc.moe_intermediate = mo->I;
	cc.shared_intermediate = mo->Is;
	cc.moe_kind = mo->kind;
	carve(&cc, n, scratch, s);
}

struct g4_row_job {
	const struct ke_moe *mo;
	const struct moe_scr *s;
	const float *x;
	float *y;
	int D, phase;
};

/* gemma4, per row: phase 0 the router's input (rmsnorm(x) D^-1/2 scale)
 * into rin and the experts' (rmsnorm(x) pre2) into xin; phase 1 the
 * fixed-order weighted sum, normed by post2, added to y. */
static void g4_row(const void *ctx, int t)
{
	const struct g4_row_job *j = ctx;
	const struct ke_moe *mo = j->mo;
	const struct moe_scr *s = j->s;
	const int D = j->D, k = mo->k;
	const float *xr = j->x + (size_t)t * D;
	if (j->phase == 0) {
		float *r = s->rin + (size_t)t * D, inv = 1.0f / sqrtf((float)D);
		ke_vec_rmsnorm(r, xr, NULL, D, mo->eps);
		ke_vec_rmsnorm(s->xin + (size_t)t * D, xr, mo->pre2, D, mo->eps);
		for (int i = 0; i < D; i++)
			r[i] = (r[i] * inv) * mo->rscale[i];
		return;
	}
	float *sum = s->rin + (size_t)t * D, *yr = j->y + (size_t)t * D;
	for (int i = 0; i < D; i++) {
		float v = 0.0f;
		for (int r = 0; r < k; r++)
			v = v + s->eo[((size_t)t * k + r) * D + i] * s->w[(size_t)t * k + r];
		sum[i] = v;
	}
	ke_vec_rmsnorm(sum, sum, mo->post2, D, mo->eps);
	for (int i = 0; i < D; i++)
		yr[i] = yr[i] + sum[i];
}

void ke_moe_forward_gemma4(const struct ke_moe *mo, const float *x, float *y, int n, int D, float *scratch)
{
	struct moe_scr s;
	carve_for(mo, n, D, scratch, &s);
	/* the experts' input rows go to s.so ([C][D], unused by gemma4):
	 * route_and_run gathers from them */
	struct moe_scr s2 = s;
	s2.xin = s.so;
	struct g4_row_job j = {mo, &s2, x, y, D, 0};
	ke_par_rows(n, 8.0 * D, g4_row, &j);
	route_and_run(mo, s.rin, s.so, n, D, &s);
	j.s = &s;
	j.phase = 1;
	ke_par_rows(n, 4.0 * D * (mo->k + 2), g4_row, &j);
}

void ke_moe_forward(const struct ke_moe *mo, const float *h, int n, int D, float *x, float *scratch)
{
	const int k = mo->k;
	struct moe_scr s;
	carve_for(mo, n, D, scratch, &s);
	route_and_run(mo, h, h, n, D, &s);

	if (mo->kind == KV_MOE_OAI) { /* no shared expert: the fixed-order sum */
		for (int t = 0; t < n; t++) {
			float *xr = x + (size_t)t * D;
			for (int i = 0; i < D; i++) {
				float y = 0.0f;
				for (int r = 0; r < k; r++)
					y = y + s.eo[((size_t)t * k + r) * D + i] * s.w[(size_t)t * k + r];
				xr[i] = xr[i] + y;
			}
		}
		return;
	}
	/* shared expert and its gate */
	ke_gemm(&mo->sh_gate, h, (size_t)D, n, s.g1, (size_t)mo->Is, 0);
	ke_gemm(&mo->sh_up, h, (size_t)D, n, s.g2, (size_t)mo->Is, 0);
	ke_vec_silu_mul(s.g1, s.g2, n * mo->Is);
	ke_gemm(&mo->sh_down, s.g1, (size_t)mo->Is, n, s.so, (size_t)D, 0);
	if (mo->sh_router.data)
		ke_gemm(&mo->sh_router, h, (size_t)D, n, s.sg, 1, 0);

	/* the fixed-order sum of moe.h, then the residual */
	const float os = mo->out_scale != 0.0f ? mo->out_scale : 1.0f;
	for (int t = 0; t < n; t++) {
		/* ungated (Granite): g = 1, and 1 * so is so exactly */
		float g = mo->sh_router.data ? 1.0f / (1.0f + ke_exp(0.0f - s.sg[t])) : 1.0f;
		float *xr = x + (size_t)t * D;
		const float *so = s.so + (size_t)t * D;
		for (int i = 0; i < D; i++) {
			float y = 0.0f;
			for (int r = 0; r < k; r++) {
				float term = s.eo[((size_t)t * k + r) * D + i] * s.w[(size_t)t * k + r];
				y = y + term;
			}
			float sh = g * so[i];
			y = y + sh;
			float v = y * os; /* 1 but for Granite: y exactly */
			xr[i] = xr[i] + v;
		}
	}
}

uint64_t ke_moe_decode_bytes(const struct ke_model *m)
{
	uint64_t b = 0;
	for (int l = 0; l < m->cfg.n_layers; l++) {
		const struct ke_moe *mo = m->layers[l].moe;
		if (!mo)
			continue;
		/* the k experts a token reads, at the first expert's size (one
		 * checkpoint stores all experts of a layer alike) */
		b += (uint64_t)mo->k * (ke_mat_bytes(&mo->gate[0]) + (mo->gu_fused ? 0 : ke_mat_bytes(&mo->up[0])) +
					ke_mat_bytes(&mo->down[0]));
		if (mo->kind != KV_MOE_OAI)
			b += ke_mat_bytes(&mo->sh_router);
	}
	return b;
}
