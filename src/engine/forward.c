/*
 * forward.c - the forward pass of one chunk of tokens (dense Qwen3 and the
 * hybrid Qwen3.5 / Qwen3-Next), following Hugging Face's modeling code;
 * docs/engine.md lists the math and where kvkeep's order of operations
 * differs (it never differs in what is computed).
 *
 * Shapes below: n = tokens in the chunk, D = hidden, I = intermediate,
 * H/Hkv = query/KV heads of attention, hd = head_dim, Hk/Hv = key/value
 * heads of the DeltaNet with dims dk/dv, C = conv channels = 2 Hk dk + Hv dv.
 * Every row is computed by kernels whose result does not depend on n.
 */
#include "engine/engine_int.h"
#include "engine/attn.h"
#include "engine/deltanet.h"
#include "engine/isa.h"
#include "engine/mamba.h"
#include "engine/kvq8.h"
#include "engine/matmul.h"
#include "engine/qgemm.h"
#include "engine/prof.h"
#include "engine/vec.h"
#include "base/pool.h"

#include <math.h>
#include <string.h>

static void embed_row_raw(const struct ke_model *m, int32_t id, float *out);

/* The embedding of id, times the model's embedding scale (gemma). */
void ke_forward_embed(const struct ke_model *m, int32_t id, float *out)
{
	embed_row_raw(m, id, out);
	if (m->embed_mul != 1.0f)
		for (int i = 0; i < m->cfg.hidden; i++)
			out[i] = out[i] * m->embed_mul;
}

/* Row id of a looked-up table (the embeddings, gemma4's per-layer ones)
 * as f32, whatever its type. */
static void table_row(const struct ke_mat *t, int32_t id, float *out)
{
	if (ke_qgemm_handles(t)) { /* quantized or F16 table: engine/qgemm.c */
		ke_qgemm_row(t, id, out);
		return;
	}
	if (t->dtype == KV_DT_MLX_AFFINE) {
		ke_mat_row_f32(t, id, out); /* MLX: the one row, dequantized */
		return;
	}
	const char *row = (const char *)t->data + (size_t)id * t->ld * (t->dtype == KV_DT_BF16 ? 2 : 4);
	if (t->dtype == KV_DT_BF16)
		ke_vec_bf16_to_f32(out, row, (size_t)t->cols);
	else
		memcpy(out, row, (size_t)t->cols * sizeof *out);
}

static void embed_row_raw(const struct ke_model *m, int32_t id, float *out)
{
	table_row(&m->embed, id, out);
}

/* cos/sin of position x inverse frequency, f32 like Hugging Face, times
 * the RoPE attention factor (YaRN's; 1 otherwise, and x * 1 == x). */
static void rope_tables(const struct ke_model *m, const float *inv_freq, int half, int pos0, int n, float *cs,
			float *sn)
{
	float af = m->cfg.rope_attn_factor > 0 ? (float)m->cfg.rope_attn_factor : 1.0f;
	for (int t = 0; t < n; t++) {
		float p = (float)(pos0 + t);
		for (int i = 0; i < half; i++) {
			float f = inv_freq[i] * p;
			cs[(size_t)t * half + i] = cosf(f) * af;
			sn[(size_t)t * half + i] = sinf(f) * af;
		}
	}
}

/* RoPE on adjacent pairs (llama.cpp's "normal" mode, for a llama GGUF
 * whose q/k rows the converter permuted for it) */
static void rope_pairs(float *x, const float *cs, const float *sn, int half)
{
	for (int i = 0; i < half; i++) {
		float x1 = x[2 * i], x2 = x[2 * i + 1];
		x[2 * i] = x1 * cs[i] - x2 * sn[i];
		x[2 * i + 1] = x2 * cs[i] + x1 * sn[i];
	}
}

/* rotate-half RoPE on the first 2 half dims of x */
static void rope(float *x, const float *cs, const float *sn, int half)
{
	for (int i = 0; i < half; i++) {
		float x1 = x[i], x2 = x[i + half];
		x[i] = x1 * cs[i] - x2 * sn[i];
		x[i + half] = x2 * cs[i] + x1 * sn[i];
	}
}

static void rope_any(const struct kv_model_config *c, float *x, const float *cs, const float *sn, int half)
{
	if (c->rope_interleaved)
		rope_pairs(x, cs, sn, half);
	else
		rope(x, cs, sn, half);
}

/* Head size and KV heads of an attention layer (gemma4's sliding and
 * global layers differ; 0 in a layer the loader did not set: the model's). */
static int layer_hd(const struct kv_model_config *c, const struct ke_layer *ly)
{
	return ly->hd ? ly->hd : c->head_dim;
}

static int layer_kv(const struct kv_model_config *c, const struct ke_layer *ly)
{
	return ly->n_kv ? ly->n_kv : c->n_kv_heads;
}

static void write_row(const struct ke_layout *lay, struct kv_page **pages, int seg, int pos, const float *src)
{
	int B = lay->page_tokens;
	char *dst = (char *)pages[pos / B]->data + ke_layout_row_off(lay, seg, pos % B, B);
	if (lay->kv_dtype == KV_DT_BF16)
		ke_vec_f32_to_bf16(dst, src, (size_t)lay->head_dim);
	else if (lay->kv_dtype == KV_DT_Q8_0)
		ke_kvq8_quant_row(dst, src, lay->head_dim); /* once, here: attention reads the codes */
	else
		memcpy(dst, src, (size_t)lay->head_dim * sizeof *src);
}

/* Per-row steps run on the pool by rows (engine/rows.c). */
static void par_rows(int n, double work, ke_row_fn fn, const void *ctx)
{
	ke_par_rows(n, work, fn, ctx);
}

struct norm_job {
	float *out;
	const float *x, *w;
	int D;
	float eps;
};

static void norm_row(const void *ctx, int t)
{
	const struct norm_job *j = ctx;
	ke_vec_rmsnorm(j->out + (size_t)t * j->D, j->x + (size_t)t * j->D, j->w, j->D, j->eps);
}

/* out[t] = rmsnorm(x[t]) * w for the n rows of D floats */
static void norm_rows(float *out, const float *x, const float *w, int n, int D, float eps)
{
	struct norm_job j = {out, x, w, D, eps};
	par_rows(n, 4.0 * D, norm_row, &j);
}

struct silu_job {
	float *g;
	const float *u; /* NULL: silu(g) alone */
	size_t w;
};

static void silu_row(const void *ctx, int t)
{
	const struct silu_job *j = ctx;
	float *g = j->g + (size_t)t * j->w;
	if (j->u)
		ke_vec_silu_mul(g, j->u + (size_t)t * j->w, (int)j->w);
	else
		ke_vec_silu(g, (int)j->w);
}

/* g = silu(g) (* u) over n rows of w floats (elementwise: the same bits
 * however the rows are cut) */
static void silu_rows(float *g, const float *u, int n, size_t w)
{
	struct silu_job j = {g, u, w};
	par_rows(n, 20.0 * (double)w, silu_row, &j);
}

static void gelu_row(const void *ctx, int t)
{
	const struct silu_job *j = ctx;
	ke_vec_gelu_tanh_mul(j->g + (size_t)t * j->w, j->u ? j->u + (size_t)t * j->w : NULL, (int)j->w);
}

/* g = gelu_tanh(g) * u over n rows of w floats (gemma's GeGLU) */
static void gelu_rows(float *g, const float *u, int n, size_t w)
{
	struct silu_job j = {g, u, w};
	par_rows(n, 40.0 * (double)w, gelu_row, &j);
}

/* att * sigmoid(gate) for one row of w floats */
struct gate_job {
	float *att, *gate;
	size_t w;
};

static void gate_row(const void *ctx, int t)
{
	const struct gate_job *j = ctx;
	float *g = j->gate + (size_t)t * j->w, *a = j->att + (size_t)t * j->w;
	for (size_t i = 0; i < j->w; i++)
		g[i] = 0.0f - g[i];
	ke_vec_exp(g, g, (int)j->w);
	for (size_t i = 0; i < j->w; i++)
		a[i] = a[i] * (1.0f / (1.0f + g[i]));
}

/* One row of an attention layer after its q/k/v projections: q and k
 * normed and rotated, k and v written to the sequence's KV pages (each row
 * its own position: rows never share a KV row). */
struct qk_job {
	const struct ke_fwd *f;
	const struct ke_layer *ly;
};

static void qk_row(const void *ctx, int t)
{
	const struct qk_job *j = ctx;
	const struct ke_fwd *f = j->f;
	const struct ke_layer *ly = j->ly;
	const struct kv_model_config *c = &f->m->cfg;
	const struct ke_layout *lay = f->lay ? f->lay : &f->m->lay;
	struct ke_scratch *sc = f->sc;
	int hd = layer_hd(c, ly), H = c->n_heads, Hkv = layer_kv(c, ly);
	int gated = c->attn_output_gate, half = ly->window ? f->m->rot_half_local : f->m->rot_half;
	size_t qw = (size_t)H * hd * (gated ? 2 : 1), kw = (size_t)Hkv * hd;
	float eps = (float)c->rms_eps;
	/* the sliding layers' RoPE may have its own base (gemma3) and dim (gemma4) */
	const float *cs = (ly->window ? sc->cosl : sc->cosv) + (size_t)t * half;
	const float *sn = (ly->window ? sc->sinl : sc->sinv) + (size_t)t * half;
	if (ly->q_b) /* gpt_oss: biases before RoPE */
		for (size_t i = 0; i < (size_t)H * hd; i++)
			sc->q[(size_t)t * qw + i] = sc->q[(size_t)t * qw + i] + ly->q_b[i];
	for (int h = 0; h < H; h++) {
		/* hybrid q_proj rows per head: [query hd | gate hd] */
		const float *src = sc->q + (size_t)t * qw + (size_t)h * hd * (gated ? 2 : 1);
		float *dst = sc->qh + ((size_t)t * H + h) * hd;
		if (gated)
			memcpy(sc->gate + ((size_t)t * H + h) * hd, src + hd, (size_t)hd * sizeof *src);
		if (ly->q_norm)
			ke_vec_rmsnorm(dst, src, ly->q_norm, hd, eps);
		else
			memcpy(dst, src, (size_t)hd * sizeof *src);
		rope_any(c, dst, cs, sn, half);
	}
	if (ly->kv_shared) /* gemma4: this layer reads an earlier layer's KV */
		return;
	struct ke_seq *s = f->seqs[f->row_seq[t]];
	int pos = s->pos + t - f->row0[f->row_seq[t]];
	/* a sliding layer's rows go to the sequence's window pages */
	const struct ke_layout *wl = ly->window ? &f->m->wlay : lay;
	struct kv_page **pg = ly->window ? s->wpages : s->pages;
	for (int g = 0; g < Hkv; g++) {
		float *k = sc->k + (size_t)t * kw + (size_t)g * hd, *v = sc->v + (size_t)t * kw + (size_t)g * hd;
		if (ly->k_b)
			for (int i = 0; i < hd; i++) {
				k[i] = k[i] + ly->k_b[(size_t)g * hd + i];
				v[i] = v[i] + ly->v_b[(size_t)g * hd + i];
			}
		if (c->v_norm) /* gemma4: V RMS-normalised without a weight */
			ke_vec_rmsnorm(v, v, NULL, hd, eps);
		if (ly->k_norm)
			ke_vec_rmsnorm(k, k, ly->k_norm, hd, eps);
		rope_any(c, k, cs, sn, half);
		write_row(wl, pg, (ly->idx * 2 + 0) * Hkv + g, pos, k);
		write_row(wl, pg, (ly->idx * 2 + 1) * Hkv + g, pos, v);
	}
}

/* x[t] += y[t] (+ b) for n rows of D floats: a branch's output added to
 * the residual stream after its bias (HF: x + (W a + b)). */
struct add_job {
	float *x;
	const float *y, *b;
	int D;
};

static void add_row(const void *ctx, int t)
{
	const struct add_job *j = ctx;
	float *x = j->x + (size_t)t * j->D;
	const float *y = j->y + (size_t)t * j->D;
	for (int i = 0; i < j->D; i++) {
		float v = j->b ? y[i] + j->b[i] : y[i];
		x[i] = x[i] + v;
	}
}

/* The output of a branch computed into y (n rows of D): its bias, its
 * norm (gemma's post-attention / post-feedforward RMSNorm), then into x. */
static void branch_out(const struct ke_fwd *f, float *y, const float *b, const float *post, float *x, int n)
{
	const struct kv_model_config *c = &f->m->cfg;
	int D = c->hidden;
	struct add_job j = {x, y, b, D};
	if (post) {
		norm_rows(y, y, post, n, D, (float)c->rms_eps);
		j.b = NULL; /* gemma has no biases */
	}
	par_rows(n, 2.0 * D, add_row, &j);
}

static void attn_layer(const struct ke_fwd *f, const struct ke_layer *ly)
{
	const struct ke_model *m = f->m;
	const struct kv_model_config *c = &m->cfg;
	const struct ke_layout *lay = f->lay ? f->lay : &m->lay;
	struct ke_scratch *sc = f->sc;
	int n = f->n;
	int D = c->hidden, hd = layer_hd(c, ly), H = c->n_heads, Hkv = layer_kv(c, ly);
	int gated = c->attn_output_gate;
	size_t qw = (size_t)H * hd * (gated ? 2 : 1), kw = (size_t)Hkv * hd;

	ke_gemm(&ly->q, sc->h, (size_t)D, n, sc->q, qw, 0);
	if (ly->kv_shared) /* gemma4: no K or V of its own */
		;
	else if (ly->v_is_k) { /* gemma4 attention_k_eq_v: V is k_proj's output */
		ke_gemm(&ly->k, sc->h, (size_t)D, n, sc->k, kw, 0);
		memcpy(sc->v, sc->k, (size_t)n * kw * sizeof *sc->v);
	} else {
		ke_gemm(&ly->k, sc->h, (size_t)D, n, sc->k, kw, 0);
		ke_gemm(&ly->v, sc->h, (size_t)D, n, sc->v, kw, 0);
	}
	struct qk_job qj = {f, ly};
	par_rows(n, 8.0 * (H + 2 * Hkv) * hd, qk_row, &qj);
	/* attention reads each sequence's own pages: one call per sequence */
	for (int i = 0; i < f->n_seq; i++) {
		size_t r0 = (size_t)f->row0[i] * H * hd;
		struct ke_attn_args a = {
			.lay = ly->window ? &m->wlay : lay,
			.pages = ly->window ? f->seqs[i]->wpages : f->seqs[i]->pages,
			.layer = ly->idx,
			.n_heads = H,
			.q = sc->qh + r0,
			.out = sc->att + r0,
			.pos0 = f->seqs[i]->pos,
			.n_tok = f->row0[i + 1] - f->row0[i],
			.scale = c->attn_scale > 0 ? (float)c->attn_scale : (float)(1.0 / sqrt((double)hd)),
			.window = ly->window,
			.sinks = ly->sinks,
			.scratch = sc->attn_scr,
			.scratch_threads = sc->attn_threads,
		};
		ke_attn(&a);
	}
	if (gated) {
		/* att * sigmoid(gate), the exp on the vector path (the same bits
		 * as ke_exp: one scalar call per element was ~5% of a prefill) */
		struct gate_job gj = {sc->att, sc->gate, (size_t)H * hd};
		par_rows(n, 30.0 * H * hd, gate_row, &gj);
	}
	if (ly->o_b || ly->attn_post_norm) {
		/* h (the layer's normed input) is dead after q/k/v */
		ke_gemm(&ly->o, sc->att, (size_t)H * hd, n, sc->h, (size_t)D, 0);
		branch_out(f, sc->h, ly->o_b, ly->attn_post_norm, sc->x, n);
		return;
	}
	ke_gemm_residual(f, &ly->o, sc->att, (size_t)H * hd);
}

/* Where a forward writes a sequence's recurrent state: in place, or, in a
 * speculative forward, into the other buffer (engine_int.h struct ke_spec). */
static float *state_out(const struct ke_seq *s)
{
	return s->spec_fwd ? s->spec->alt : s->rec;
}

/* Row r of DeltaNet layer `idx` in a speculative sequence's log. */
static float *spec_log_row(const struct ke_seq *s, int idx, int r)
{
	return ke_spec_log_row(s, idx, r);
}

/* The delta rule of every (sequence, value head) pair of a forward: one
 * unit per pair, all in one pool dispatch (one dispatch per sequence made
 * a batch of c decode tokens wait c times for the slowest thread). */
struct dn_job {
	const struct ke_fwd *f;
	size_t state_off;          /* bytes into a sequence's rec: this layer's S [Hv][dk][dv] */
	const float *dq;           /* [n][C] */
	const float *beta, *alpha; /* [n][Hv] */
	float *core;               /* [n][Hv dv] */
	int C;
};

static void dn_heads(void *ctx, size_t b, size_t e, int thread)
{
	const struct dn_job *j = ctx;
	const struct kv_model_config *c = &j->f->m->cfg;
	int Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim, r = Hv / Hk;
	size_t kd = (size_t)Hk * dk;
	int isa = ke_isa();
	(void)thread;
	for (size_t u = b; u < e; u++) {
		int i = (int)(u / (size_t)Hv), h = (int)(u % (size_t)Hv), kh = h / r;
		int r0 = j->f->row0[i], ni = j->f->row0[i + 1] - r0;
		const struct ke_seq *sq = j->f->seqs[i];
		size_t off = j->state_off / sizeof(float) + (size_t)h * dk * dv;
		float *S = state_out(sq) + off;
		if (sq->spec_fwd) /* out of place: the head's old state stays for ke_seq_accept */
			memcpy(S, sq->rec + off, (size_t)dk * dv * sizeof *S);
		/* q, k of key head kh and v of value head h, all rows C floats apart */
		const float *row = j->dq + (size_t)r0 * j->C;
		ke_dn_rule_seq(isa, S, ni, row + (size_t)kh * dk, row + kd + (size_t)kh * dk, row + 2 * kd + (size_t)h * dv,
			       (size_t)j->C, j->alpha + (size_t)r0 * Hv + h, j->beta + (size_t)r0 * Hv + h, (size_t)Hv,
			       j->core + (size_t)r0 * Hv * dv + (size_t)h * dv, (size_t)Hv * dv, dk, dv);
	}
}

static void l2norm(float *x, int n)
{
	float ss = ke_vec_dot(x, x, n);
	float inv = 1.0f / sqrtf(ss + 1e-6f);
	for (int i = 0; i < n; i++)
		x[i] = x[i] * inv;
}

/* p holds Hv blocks of w floats in tiled order (block j Hk + k is HF head
 * k (Hv / Hk) + j); put them in HF order, through tmp (Hv w floats). */
static void untile(float *p, float *tmp, int Hk, int Hv, int w)
{
	int r = Hv / Hk;
	memcpy(tmp, p, (size_t)Hv * (size_t)w * sizeof *p);
	for (int g = 0; g < Hv; g++)
		memcpy(p + (size_t)g * w, tmp + (size_t)((g % r) * Hk + g / r) * w, (size_t)w * sizeof *p);
}

/* A DeltaNet row after the conv: q, k l2-normed (q scaled), beta =
 * sigmoid(b), alpha = exp(-A softplus(a + dt_bias)) per value head. */
struct dn_row_job {
	const struct kv_model_config *c;
	const struct ke_layer *ly;
	struct ke_scratch *sc;
	int C;
};

static void dn_row(const void *ctx, int t)
{
	const struct dn_row_job *j = ctx;
	const struct kv_model_config *c = j->c;
	const struct ke_layer *ly = j->ly;
	int Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim;
	size_t kd = (size_t)Hk * dk;
	float qscale = (float)(1.0 / sqrt((double)dk));
	float *row = j->sc->dq + (size_t)t * j->C;
	for (int g = 0; g < Hk; g++) {
		float *q = row + (size_t)g * dk, *k = row + kd + (size_t)g * dk;
		l2norm(q, dk);
		for (int i = 0; i < dk; i++)
			q[i] = q[i] * qscale;
		l2norm(k, dk);
	}
	for (int h = 0; h < Hv; h++) {
		float *bp = j->sc->beta + (size_t)t * Hv + h, *ap = j->sc->alpha + (size_t)t * Hv + h;
		float b = *bp, x = *ap + ly->dt_bias[h];
		float sp = x > 20.0f ? x : log1pf(expf(x)); /* torch softplus, threshold 20 */
		*bp = 1.0f / (1.0f + expf(-b));
		*ap = expf(ly->neg_a[h] * sp);
	}
}

/* The gated RMSNorm of a row's value heads: (norm(o) * w) * silu(z). */
static void gnorm_row(const void *ctx, int t)
{
	const struct dn_row_job *j = ctx;
	const struct kv_model_config *c = j->c;
	int Hv = c->lin_v_heads, dv = c->lin_v_dim;
	size_t vd = (size_t)Hv * dv;
	for (int h = 0; h < Hv; h++) {
		float *o = j->sc->core + (size_t)t * vd + (size_t)h * dv;
		const float *z = j->sc->z + (size_t)t * vd + (size_t)h * dv;
		ke_vec_rmsnorm(o, o, j->ly->gnorm, dv, (float)c->rms_eps);
		for (int i = 0; i < dv; i++)
			o[i] = o[i] * z[i];
	}
}

/* The causal conv of a chunk, token by token through each sequence's conv
 * state, over a range of channel blocks: channels are independent (each
 * has its own K - 1 state values and kernel), so blocks run on different
 * threads with every channel's operations and order unchanged. */
#define CONV_BLOCK 64
struct conv_job {
	const struct ke_fwd *f;
	const struct ke_layer *ly;
	size_t conv_off; /* bytes into a sequence's rec: this layer's state [C][K - 1] */
	float *dq;       /* [n][C] */
	int C, K;
};

static void conv_part(void *ctx, size_t b, size_t e, int thread)
{
	const struct conv_job *j = ctx;
	const struct ke_fwd *f = j->f;
	(void)thread;
	int c0 = (int)b * CONV_BLOCK, c1 = (int)e * CONV_BLOCK < j->C ? (int)e * CONV_BLOCK : j->C;
	for (int t = 0; t < f->n; t++) {
		float *conv = state_out(f->seqs[f->row_seq[t]]) + j->conv_off / sizeof(float);
		ke_dn_conv(conv + (size_t)c0 * (j->K - 1), j->ly->conv_w + (size_t)c0 * j->K, j->dq + (size_t)t * j->C + c0,
			   c1 - c0, j->K);
	}
}

static void dn_layer(const struct ke_fwd *f, const struct ke_layer *ly)
{
	const struct ke_model *m = f->m;
	const struct kv_model_config *c = &m->cfg;
	struct ke_scratch *sc = f->sc;
	const struct ke_rec_layer *rl = &m->lay.rec[ly->idx];
	int D = c->hidden, Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
	int r = Hv / Hk, K = c->conv_kernel, C = m->conv_dim, n = f->n;
	size_t kd = (size_t)Hk * dk, vd = (size_t)Hv * dv;

	if (ly->fused) {
		/* Qwen3-Next: qkvz grouped per key head g as [q_g | k_g | v_g (r dv) | z_g (r dv)],
		 * ba as [b_g (r) | a_g (r)]; regroup into [q | k | v], z, b, a. */
		size_t qw = 2 * kd + 2 * vd, gw = 2 * (size_t)dk + 2 * (size_t)r * dv;
		ke_gemm(&ly->qkv, sc->h, (size_t)D, n, sc->mix, qw, 0);
		ke_gemm(&ly->b, sc->h, (size_t)D, n, sc->ba, 2 * (size_t)Hv, 0);
		for (int t = 0; t < n; t++) {
			float *dq = sc->dq + (size_t)t * C, *z = sc->z + (size_t)t * vd;
			for (int g = 0; g < Hk; g++) {
				const float *src = sc->mix + (size_t)t * qw + (size_t)g * gw;
				size_t rv = (size_t)r * dv;
				memcpy(dq + (size_t)g * dk, src, (size_t)dk * 4);
				memcpy(dq + kd + (size_t)g * dk, src + dk, (size_t)dk * 4);
				memcpy(dq + 2 * kd + g * rv, src + 2 * dk, rv * 4);
				memcpy(z + g * rv, src + 2 * dk + rv, rv * 4);
				const float *ba = sc->ba + (size_t)t * 2 * Hv + (size_t)g * 2 * r;
				memcpy(sc->beta + (size_t)t * Hv + (size_t)g * r, ba, (size_t)r * 4);
				memcpy(sc->alpha + (size_t)t * Hv + (size_t)g * r, ba + r, (size_t)r * 4);
			}
		}
	} else {
		ke_gemm(&ly->qkv, sc->h, (size_t)D, n, sc->dq, (size_t)C, 0);
		ke_gemm(&ly->z, sc->h, (size_t)D, n, sc->z, vd, 0);
		ke_gemm(&ly->b, sc->h, (size_t)D, n, sc->beta, (size_t)Hv, 0);
		ke_gemm(&ly->a, sc->h, (size_t)D, n, sc->alpha, (size_t)Hv, 0);
		if (c->vrows_tiled) {
			/* GGUF rows in llama.cpp's tiled value-head order: move the heads
			 * of the outputs back to HF's order (core is free until dn_heads) */
			for (int t = 0; t < n; t++) {
				untile(sc->dq + (size_t)t * C + 2 * kd, sc->core, Hk, Hv, dv);
				untile(sc->z + (size_t)t * vd, sc->core, Hk, Hv, dv);
				untile(sc->beta + (size_t)t * Hv, sc->core, Hk, Hv, 1);
				untile(sc->alpha + (size_t)t * Hv, sc->core, Hk, Hv, 1);
			}
		}
	}
	/* speculative sequences: log the conv's inputs, and run the conv on a
	 * copy of the old state (struct ke_spec) */
	for (int i = 0; i < f->n_seq; i++) {
		const struct ke_seq *sq = f->seqs[i];
		if (!sq->spec_fwd)
			continue;
		memcpy((char *)sq->spec->alt + rl->conv_off, (const char *)sq->rec + rl->conv_off, rl->conv_bytes);
		for (int t = f->row0[i]; t < f->row0[i + 1]; t++)
			memcpy(spec_log_row(sq, ly->idx, t - f->row0[i]), sc->dq + (size_t)t * C, (size_t)C * sizeof(float));
	}
	/* causal conv, token by token through each sequence's conv state, then SiLU */
	double t0 = ke_prof_t0();
	struct conv_job cj = {f, ly, rl->conv_off, sc->dq, C, K};
	size_t cblocks = ((size_t)C + CONV_BLOCK - 1) / CONV_BLOCK;
	if (n > 1 && 2.0 * n * C * K >= KE_PAR_MIN_WORK / 4)
		kv_pool_for(kv_pool_global(), cblocks, 1, conv_part, &cj);
	else
		conv_part(&cj, 0, cblocks, 0);
	silu_rows(sc->dq, NULL, n, (size_t)C);
	struct dn_row_job rj = {c, ly, sc, C};
	par_rows(n, 6.0 * Hk * dk + 40.0 * Hv, dn_row, &rj);
	for (int i = 0; i < f->n_seq; i++) {
		const struct ke_seq *sq = f->seqs[i];
		if (!sq->spec_fwd)
			continue;
		for (int t = f->row0[i]; t < f->row0[i + 1]; t++) {
			float *lr = spec_log_row(sq, ly->idx, t - f->row0[i]);
			memcpy(lr + C, sc->dq + (size_t)t * C, (size_t)C * sizeof(float));
			memcpy(lr + 2 * (size_t)C, sc->alpha + (size_t)t * Hv, (size_t)Hv * sizeof(float));
			memcpy(lr + 2 * (size_t)C + Hv, sc->beta + (size_t)t * Hv, (size_t)Hv * sizeof(float));
		}
	}
	/* the delta rule runs through each sequence's own state S */
	struct dn_job j = {f, rl->state_off, sc->dq, sc->beta, sc->alpha, sc->core, C};
	size_t units = (size_t)f->n_seq * (size_t)Hv;
	if (units > 1 && 4.0 * n * Hv * dk * dv >= KE_PAR_MIN_WORK)
		kv_pool_for(kv_pool_global(), units, 1, dn_heads, &j);
	else
		dn_heads(&j, 0, units, 0);
	ke_prof_add(KE_PROF_DN, t0, 7.0 * n * Hv * dk * dv, 8.0 * n * Hv * dk * dv);
	/* gated RMSNorm per value head: (norm(o) * w) * silu(z) */
	silu_rows(sc->z, NULL, n, vd);
	struct dn_row_job gj = {c, ly, sc, C};
	par_rows(n, 6.0 * (double)vd, gnorm_row, &gj);
	if (c->out_proj_tiled) {
		/* out_proj kept in llama.cpp's tiled value-head order (GGUF blocks
		 * straddle heads): feed it the heads in that order (z is dead). */
		for (int t = 0; t < n; t++)
			for (int h = 0; h < Hv; h++)
				memcpy(sc->z + (size_t)t * vd + (size_t)h * dv,
				       sc->core + (size_t)t * vd + (size_t)((h % Hk) * r + h / Hk) * dv, (size_t)dv * 4);
		ke_gemm(&ly->out, sc->z, vd, n, sc->x, (size_t)D, KE_GEMM_ACCUM);
		return;
	}
	ke_gemm(&ly->out, sc->core, vd, n, sc->x, (size_t)D, KE_GEMM_ACCUM);
}

/* Nemotron-H's MLP layer: x += down(relu(up h)^2), the square one
 * rounding of r * r as torch's relu(x) ** 2. */
struct relu2_job {
	float *u;
	size_t w;
};

static void relu2_row(const void *ctx, int t)
{
	const struct relu2_job *j = ctx;
	ke_vec_relu2(j->u + (size_t)t * j->w, (int)j->w);
}

static void mlp_relu2(const struct ke_fwd *f, const struct ke_layer *ly)
{
	struct ke_scratch *sc = f->sc;
	int D = f->m->cfg.hidden, I = ly->up.rows;
	ke_gemm(&ly->up, sc->h, (size_t)D, f->n, sc->m1, (size_t)I, 0);
	struct relu2_job j = {sc->m1, (size_t)I};
	par_rows(f->n, 2.0 * I, relu2_row, &j);
	ke_gemm_residual(f, &ly->down, sc->m1, (size_t)I);
}

/* Granite: logits / logits_scaling (a division, as transformers does). */
struct logits_job {
	float *v;
	size_t n;
	float div, cap; /* div 0: none; cap 0: no softcap */
};

#define LOGITS_GRAIN 16384

static void logits_part(void *ctx, size_t b0, size_t b1, int thread)
{
	const struct logits_job *j = ctx;
	(void)thread;
	const size_t e = b1 * LOGITS_GRAIN < j->n ? b1 * LOGITS_GRAIN : j->n;
	float *v = j->v + b0 * LOGITS_GRAIN;
	const size_t n = e - b0 * LOGITS_GRAIN;
	if (j->div != 0.0f)
		for (size_t i = 0; i < n; i++)
			v[i] = v[i] / j->div;
	if (j->cap > 0.0f)
		ke_vec_softcap(v, j->cap, n);
}

/* The logits' final steps, each element on its own (the same floats on
 * any split): the division (granite's logits_scaling), then the final
 * softcap (Gemma: a tanh per logit, 262144 of them a token: 2.3 ms on one
 * thread with libm's tanhf, before vec.c's canonical tanh), over the
 * pool's threads. */
static void logits_finish(const struct kv_model_config *c, float *v, size_t n)
{
	struct logits_job j = {v, n, c->logits_div == 0.0 || c->logits_div == 1.0 ? 0.0f : (float)c->logits_div,
			       c->final_softcap > 0 ? (float)c->final_softcap : 0.0f};
	if (n && (j.div != 0.0f || j.cap > 0.0f))
		kv_pool_for(kv_pool_global(), (n + LOGITS_GRAIN - 1) / LOGITS_GRAIN, 1, logits_part, &j);
}

/* The RoPE tables of f's rows, each at its sequence's position. */
static void rope_rows(const struct ke_fwd *f)
{
	const struct kv_model_config *c = &f->m->cfg;
	size_t half = (size_t)f->m->rot_half, lh = (size_t)f->m->rot_half_local;
	for (int i = 0; c->n_attn_layers && i < f->n_seq; i++) {
		int r0 = f->row0[i], ni = f->row0[i + 1] - r0;
		rope_tables(f->m, f->m->inv_freq, (int)half, f->seqs[i]->pos, ni, f->sc->cosv + r0 * half,
			    f->sc->sinv + r0 * half);
		if (f->sc->cosl != f->sc->cosv)
			rope_tables(f->m, f->m->inv_freq_local, (int)lh, f->seqs[i]->pos, ni, f->sc->cosl + r0 * lh,
				    f->sc->sinl + r0 * lh);
	}
}

struct scale_job {
	float *x;
	float s;
	int D;
};

static void scale_row(const void *ctx, int t)
{
	const struct scale_job *j = ctx;
	float *x = j->x + (size_t)t * j->D;
	for (int i = 0; i < j->D; i++)
		x[i] = x[i] * j->s;
}

static void layer_body(const struct ke_fwd *f, const struct ke_layer *ly);

/* gemma4's per-layer inputs of f's rows (sc->ple, [n][L P]), llama.cpp's
 * project_per_layer_inputs: for layer l, P-slice of
 *   (rmsnorm(W_proj x * D^-1/2) * norm + table[token] * sqrt(P)) * 2^-1/2
 * with x the scaled embedding (sc->x before the first layer). */
struct ple_job {
	const struct ke_model *m;
	const struct ke_fwd *f;
	const int32_t *const *toks;
};

static void ple_row(const void *ctx, int t)
{
	const struct ple_job *j = ctx;
	const struct ke_model *m = j->m;
	const struct kv_model_config *c = &m->cfg;
	const struct ke_fwd *f = j->f;
	int P = c->ple_dim, L = c->n_layers, i = f->row_seq[t];
	size_t LP = (size_t)L * P;
	float *e = f->sc->ple + (size_t)t * LP, *pr = f->sc->ple2 + (size_t)t * LP;
	float sp = sqrtf((float)P), sd = 1.0f / sqrtf((float)c->hidden), s2 = 1.0f / sqrtf(2.0f);
	table_row(&m->ple_embed, j->toks[i][t - f->row0[i]], e);
	for (int l = 0; l < L; l++) {
		float *v = pr + (size_t)l * P, *o = e + (size_t)l * P;
		for (int p = 0; p < P; p++)
			v[p] = v[p] * sd;
		ke_vec_rmsnorm(v, v, m->ple_norm, P, (float)c->rms_eps);
		for (int p = 0; p < P; p++)
			o[p] = (v[p] + o[p] * sp) * s2;
	}
}

static void ple_inputs(const struct ke_fwd *f, const int32_t *const *toks)
{
	const struct ke_model *m = f->m;
	const struct kv_model_config *c = &m->cfg;
	size_t LP = (size_t)c->n_layers * c->ple_dim;
	ke_gemm(&m->ple_proj, f->sc->x, (size_t)c->hidden, f->n, f->sc->ple2, LP, 0);
	struct ple_job j = {m, f, toks};
	par_rows(f->n, 8.0 * (double)LP, ple_row, &j);
}

struct ple_mul_job {
	float *g;
	const float *ple;
	int P, l, L;
};

static void ple_mul_row(const void *ctx, int t)
{
	const struct ple_mul_job *j = ctx;
	float *g = j->g + (size_t)t * j->P;
	const float *in = j->ple + ((size_t)t * j->L + j->l) * j->P;
	ke_vec_gelu_tanh_mul(g, NULL, j->P);
	for (int p = 0; p < j->P; p++)
		g[p] = g[p] * in[p];
}

/* gemma4's per-layer embedding block at the end of layer l: x +=
 * rmsnorm(W_out (gelu(W_gate x) * ple_l)) * post_per_layer_input_norm. */
static void ple_block(const struct ke_fwd *f, const struct ke_layer *ly, int l)
{
	const struct kv_model_config *c = &f->m->cfg;
	struct ke_scratch *sc = f->sc;
	int D = c->hidden, P = c->ple_dim, n = f->n;
	ke_gemm(&ly->ple_gate, sc->x, (size_t)D, n, sc->m1, (size_t)P, 0);
	struct ple_mul_job j = {sc->m1, sc->ple, P, l, c->n_layers};
	par_rows(n, 40.0 * P, ple_mul_row, &j);
	ke_gemm(&ly->ple_out, sc->m1, (size_t)P, n, sc->h, (size_t)D, 0);
	branch_out(f, sc->h, NULL, ly->ple_post, sc->x, n);
}

/* One decoder layer on the residual stream of f's rows; gemma4 adds its
 * per-layer embedding block and multiplies the result (the residual
 * stream) by the layer's scalar. */
static void layer_rows(const struct ke_fwd *f, const struct ke_layer *ly)
{
	layer_body(f, ly);
	if (ly->ple_post)
		ple_block(f, ly, (int)(ly - f->m->layers));
	if (ly->scalar) {
		struct scale_job j = {f->sc->x, ly->scalar[0], f->m->cfg.hidden};
		par_rows(f->n, 1.0 * j.D, scale_row, &j);
	}
}

static void layer_body(const struct ke_fwd *f, const struct ke_layer *ly)
{
	const struct kv_model_config *c = &f->m->cfg;
	struct ke_scratch *sc = f->sc;
	int D = c->hidden, n = f->n;
	float eps = (float)c->rms_eps;
	norm_rows(sc->h, sc->x, ly->in_norm, n, D, eps);
	if (ly->type == KV_LAYER_ATTN)
		attn_layer(f, ly);
	else if (ly->type == KV_LAYER_MAMBA)
		ke_mamba_layer(f, ly); /* mamba.c */
	else if (ly->type == KV_LAYER_MLP)
		mlp_relu2(f, ly);
	else
		dn_layer(f, ly);
	if (!ly->post_norm) /* Nemotron-H: the mixer is the whole layer */
		return;
	norm_rows(sc->h, sc->x, ly->post_norm, n, D, eps);
	if (ly->moe && !ly->ffn_post_norm1) { /* sparse MoE block, moe.c */
		ke_moe_forward(ly->moe, sc->h, n, D, sc->x, sc->moe);
		return;
	}
	int I = ly->gate.rows; /* Granite's dense MLP is shared_intermediate wide */
	ke_gemm(&ly->gate, sc->h, (size_t)D, n, sc->m1, (size_t)I, 0);
	ke_gemm(&ly->up, sc->h, (size_t)D, n, sc->m2, (size_t)I, 0);
	if (c->mlp_act == KV_ACT_GELU_TANH)
		gelu_rows(sc->m1, sc->m2, n, (size_t)I);
	else
		silu_rows(sc->m1, sc->m2, n, (size_t)I);
	if (ly->ffn_post_norm) { /* gemma: the MLP output normed before the residual add */
		ke_gemm(&ly->down, sc->m1, (size_t)I, n, sc->h, (size_t)D, 0);
		if (ly->ffn_post_norm1) { /* gemma4: the dense branch normed, the experts' added (moe.h) */
			norm_rows(sc->h, sc->h, ly->ffn_post_norm1, n, D, eps);
			ke_moe_forward_gemma4(ly->moe, sc->x, sc->h, n, D, sc->moe);
		}
		branch_out(f, sc->h, NULL, ly->ffn_post_norm, sc->x, n);
		return;
	}
	ke_gemm_residual(f, &ly->down, sc->m1, (size_t)ly->down.cols);
}

/*
 * The rows of every sequence of f, concatenated, through all layers: the
 * GEMMs and per-row steps run over all f->n rows at once (their result per
 * row does not depend on the other rows), attention and the DeltaNet state
 * per sequence. Leaves the residual stream of every row in sc->x.
 */
static void forward_rows(const struct ke_fwd *f, const int32_t *const *toks)
{
	const struct ke_model *m = f->m;
	int D = m->cfg.hidden;
	for (int i = 0; i < f->n_seq; i++) {
		int r0 = f->row0[i], ni = f->row0[i + 1] - r0;
		for (int t = 0; t < ni; t++)
			ke_forward_embed(m, toks[i][t], f->sc->x + (size_t)(r0 + t) * D);
		if (m->cfg.embed_mult != 0.0 && m->cfg.embed_mult != 1.0) /* Granite's embedding_multiplier */
			for (size_t e = (size_t)r0 * D; e < (size_t)(r0 + ni) * D; e++)
				f->sc->x[e] = f->sc->x[e] * (float)m->cfg.embed_mult;
	}
	rope_rows(f);
	if (m->cfg.ple_dim)
		ple_inputs(f, toks);
	for (int l = 0; l < m->cfg.n_layers; l++)
		layer_rows(f, &m->layers[l]);
}

void ke_forward_layer(const struct ke_fwd *f, const struct ke_layer *ly)
{
	rope_rows(f);
	layer_rows(f, ly);
}

void ke_forward(struct ke_seq *s, const int32_t *tok, int n, float *rows_out, float *last_out)
{
	const struct ke_model *m = s->m;
	const struct kv_model_config *c = &m->cfg;
	struct ke_scratch *sc = &s->sc;
	int D = c->hidden, V = c->vocab;
	float eps = (float)c->rms_eps;
	int row0[2] = {0, n};
	int row_seq[KE_FWD_MAX_ROWS];
	struct ke_fwd f = {.m = m, .sc = sc, .n = n, .n_seq = 1, .seqs = &s, .row0 = row0, .row_seq = row_seq};

	memset(row_seq, 0, (size_t)n * sizeof *row_seq);
	forward_rows(&f, &tok);
	if (rows_out) {
		norm_rows(sc->h, sc->x, m->final_norm, n, D, eps);
		ke_gemm(&m->lm_head, sc->h, (size_t)D, n, rows_out, (size_t)V, 0);
		logits_finish(c, rows_out, (size_t)n * V);
	} else if (last_out) {
		ke_vec_rmsnorm(sc->h, sc->x + (size_t)(n - 1) * D, m->final_norm, D, eps);
		ke_gemm(&m->lm_head, sc->h, (size_t)D, 1, last_out, (size_t)V, 0);
		logits_finish(c, last_out, (size_t)V);
	}
}

void ke_forward_batch(const struct ke_fwd *f, const int32_t *const *toks, float *const *last_out,
		      float *const *all_out, float *logits_tmp)
{
	const struct kv_model_config *c = &f->m->cfg;
	struct ke_scratch *sc = f->sc;
	int D = c->hidden, V = c->vocab, k = 0;
	float eps = (float)c->rms_eps;

	forward_rows(f, toks);
	/* the rows that want logits (every row of a verification, else the
	 * last row of each sequence that wants it), gathered into h: one
	 * lm_head GEMM over k rows gives each row what M = 1 would */
	for (int i = 0; i < f->n_seq; i++) {
		int r1 = f->row0[i + 1], r0 = all_out && all_out[i] ? f->row0[i] : r1 - 1;
		if (!last_out[i] && !(all_out && all_out[i]))
			continue;
		for (int t = r0; t < r1; t++)
			ke_vec_rmsnorm(sc->h + (size_t)k++ * D, sc->x + (size_t)t * D, f->m->final_norm, D, eps);
	}
	if (!k)
		return;
	ke_gemm(&f->m->lm_head, sc->h, (size_t)D, k, logits_tmp, (size_t)V, 0);
	logits_finish(c, logits_tmp, (size_t)k * V);
	k = 0;
	for (int i = 0; i < f->n_seq; i++) {
		int rows = f->row0[i + 1] - f->row0[i];
		if (all_out && all_out[i]) {
			memcpy(all_out[i], logits_tmp + (size_t)k * V, (size_t)rows * V * sizeof *logits_tmp);
			if (last_out[i])
				memcpy(last_out[i], logits_tmp + (size_t)(k + rows - 1) * V, (size_t)V * sizeof *logits_tmp);
			k += rows;
		} else if (last_out[i]) {
			memcpy(last_out[i], logits_tmp + (size_t)k++ * V, (size_t)V * sizeof *logits_tmp);
		}
	}
}

void ke_forward_hidden(const struct ke_model *m, const struct ke_scratch *sc, int r0, int n, float *hid_out)
{
	int D = m->cfg.hidden;
	for (int t = 0; t < n; t++)
		ke_vec_rmsnorm(hid_out + (size_t)t * D, sc->x + (size_t)(r0 + t) * D, m->final_norm, D,
			       (float)m->cfg.rms_eps);
}

/* --- taking speculative rows back (engine_int.h struct ke_spec) ----------- */

struct replay_job {
	struct ke_seq *s;
	int keep;
};

/* Unit u = (DeltaNet layer u / Hv, value head u % Hv): the delta rule of
 * the kept rows on the old state, from the log. */
static void replay_heads(void *ctx, size_t b, size_t e, int thread)
{
	const struct replay_job *j = ctx;
	const struct ke_model *m = j->s->m;
	const struct kv_model_config *c = &m->cfg;
	int Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim, r = Hv / Hk;
	size_t kd = (size_t)Hk * dk, C = (size_t)m->conv_dim, W = ke_spec_log_w(m);
	int isa = ke_isa();
	(void)thread;
	for (size_t u = b; u < e; u++) {
		int l = (int)(u / (size_t)Hv), h = (int)(u % (size_t)Hv), kh = h / r;
		const struct ke_rec_layer *rl = &m->lay.rec[l];
		float *S = j->s->rec + rl->state_off / sizeof(float) + (size_t)h * dk * dv;
		const float *row = spec_log_row(j->s, l, 0) + C;
		const float *ab = spec_log_row(j->s, l, 0) + 2 * C;
		ke_dn_rule_seq(isa, S, j->keep, row + (size_t)kh * dk, row + kd + (size_t)kh * dk,
			       row + 2 * kd + (size_t)h * dv, W, ab + h, ab + Hv + h, W,
			       j->s->spec->junk + (size_t)h * dv, (size_t)Hv * dv, dk, dv);
	}
}

void ke_spec_replay(struct ke_seq *s, int keep)
{
	const struct ke_model *m = s->m;
	const struct kv_model_config *c = &m->cfg;
	int K = c->conv_kernel, C = m->conv_dim;
	if (c->n_ssm_layers) { /* the Mamba-2 hybrids have no DeltaNet layer */
		ke_mamba_replay(s, keep);
		return;
	}
	/* the conv state is the last K - 1 inputs: shift the kept rows' in */
	for (int l = 0; K > 1 && l < m->lay.n_rec_layers; l++) {
		float *st = s->rec + m->lay.rec[l].conv_off / sizeof(float);
		for (int t = 0; t < keep; t++) {
			const float *x = spec_log_row(s, l, t);
			for (int ch = 0; ch < C; ch++) {
				float *sc = st + (size_t)ch * (K - 1);
				memmove(sc, sc + 1, (size_t)(K - 2) * sizeof *sc);
				sc[K - 2] = x[ch];
			}
		}
	}
	struct replay_job j = {s, keep};
	size_t units = (size_t)m->lay.n_rec_layers * (size_t)c->lin_v_heads;
	if (units > 1 && 4.0 * keep * (double)units * c->lin_k_dim * c->lin_v_dim >= KE_PAR_MIN_WORK)
		kv_pool_for(kv_pool_global(), units, 1, replay_heads, &j);
	else
		replay_heads(&j, 0, units, 0);
}
