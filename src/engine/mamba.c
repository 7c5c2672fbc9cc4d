/*
 * mamba.c - see mamba.h.
 */
#include "engine/mamba.h"
#include "engine/deltanet.h"
#include "engine/engine_int.h"
#include "engine/isa.h"
#include "engine/matmul.h"
#include "engine/prof.h"
#include "engine/vec.h"
#include "base/pool.h"

#include <math.h>
#include <string.h>

/* S * dA and x * dt are single roundings, then one fma: GCC must not fuse
 * the products into other additions (on the SIMD paths its vector
 * arithmetic would be contracted otherwise). */
#pragma GCC optimize("fp-contract=off")

#if defined(__x86_64__)
#include <immintrin.h>
#define TGT2 __attribute__((target("avx2,fma")))
#endif

/* Rows swept together for all tokens of a chunk: 4 rows of N = 128 are
 * 2 KiB of state, which stays in L1 while the chunk's tokens go by. */
#define ROWS 4

static void scan_scalar(float *S, int P, int N, int n, const float *x, size_t sx, const float *B, const float *C,
			size_t sbc, const float *dt, const float *dA, size_t sd, float D, float *y, size_t sy)
{
	for (int p0 = 0; p0 < P; p0 += ROWS) {
		int p1 = p0 + ROWS < P ? p0 + ROWS : P;
		for (int t = 0; t < n; t++) {
			const float *Bt = B + (size_t)t * sbc, *Ct = C + (size_t)t * sbc;
			float a = dA[(size_t)t * sd], d = dt[(size_t)t * sd];
			for (int p = p0; p < p1; p++) {
				float xv = x[(size_t)t * sx + (size_t)p], xdt = xv * d;
				float *s = S + (size_t)p * (size_t)N;
				for (int k = 0; k < N; k++) {
					float decayed = s[k] * a;
					s[k] = fmaf(Bt[k], xdt, decayed);
				}
				y[(size_t)t * sy + (size_t)p] = fmaf(D, xv, ke_dot_ref(s, Ct, N));
			}
		}
	}
}

#if defined(__x86_64__)
TGT2 static inline float hsum_avx2(__m256 lo, __m256 hi)
{
	__m256 t = _mm256_add_ps(lo, hi);                                              /* j + j+8 */
	__m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)); /* j + j+4 */
	__m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));                                 /* j + j+2 */
	__m128 r = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));                             /* 0 + 1 */
	return _mm_cvtss_f32(r);
}

/* N a multiple of 16: lanes 0-7 of the canonical order in lo, 8-15 in hi. */
TGT2 static void scan_avx2(float *S, int P, int N, int n, const float *x, size_t sx, const float *B, const float *C,
			   size_t sbc, const float *dt, const float *dA, size_t sd, float D, float *y, size_t sy)
{
	for (int p0 = 0; p0 < P; p0 += ROWS) {
		int p1 = p0 + ROWS < P ? p0 + ROWS : P;
		for (int t = 0; t < n; t++) {
			const float *Bt = B + (size_t)t * sbc, *Ct = C + (size_t)t * sbc;
			__m256 va = _mm256_set1_ps(dA[(size_t)t * sd]);
			float d = dt[(size_t)t * sd];
			for (int p = p0; p < p1; p++) {
				float xv = x[(size_t)t * sx + (size_t)p];
				__m256 vx = _mm256_set1_ps(xv * d);
				float *s = S + (size_t)p * (size_t)N;
				__m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
				for (int k = 0; k < N; k += 16) {
					__m256 s0 = _mm256_mul_ps(_mm256_loadu_ps(s + k), va);
					__m256 s1 = _mm256_mul_ps(_mm256_loadu_ps(s + k + 8), va);
					s0 = _mm256_fmadd_ps(_mm256_loadu_ps(Bt + k), vx, s0);
					s1 = _mm256_fmadd_ps(_mm256_loadu_ps(Bt + k + 8), vx, s1);
					_mm256_storeu_ps(s + k, s0);
					_mm256_storeu_ps(s + k + 8, s1);
					lo = _mm256_fmadd_ps(s0, _mm256_loadu_ps(Ct + k), lo);
					hi = _mm256_fmadd_ps(s1, _mm256_loadu_ps(Ct + k + 8), hi);
				}
				y[(size_t)t * sy + (size_t)p] = fmaf(D, xv, hsum_avx2(lo, hi));
			}
		}
	}
}

#endif

void ke_ssm_scan(int isa, float *S, int P, int N, int n, const float *x, size_t sx, const float *B,
		 const float *C, size_t sbc, const float *dt, const float *dA, size_t sd, float D, float *y,
		 size_t sy)
{
#if defined(__x86_64__)
	/* AVX-512 machines run the AVX2 kernel: a 16-lane zmm version (one
	 * accumulator a row) measured 0.090 ns an element against 0.083 on a
	 * Zen 4 (one thread, N 128, P 80), and 4- or 8-row blocks with
	 * B and C loaded once for all rows were slower on both paths
	 * (0.11-0.13 ns). */
	int best = ke_isa_best();
	if (N % 16 == 0 && isa >= KE_ISA_AVX2 && best >= KE_ISA_AVX2) {
		scan_avx2(S, P, N, n, x, sx, B, C, sbc, dt, dA, sd, D, y, sy);
		return;
	}
#endif
	(void)isa;
	scan_scalar(S, P, N, n, x, sx, B, C, sbc, dt, dA, sd, D, y, sy);
}

/* --- the layer ------------------------------------------------------------------ */

/*
 * Buffers (the recurrent group of the sequence scratch, ke_scratch_plan):
 *   mix   [n][W + C + H]  in_proj output: z | xBC | dt; xBC goes through
 *                         the conv, SiLU, in place
 *   dq    the scan's operands and result, compact per head and group, so
 *         the scan of a head reads and writes contiguous rows (in mix a
 *         token's x, B and C sit W + C + H floats after the previous
 *         token's: a 512-token chunk touched a new page for every token
 *         and every block of rows, and the scan ran at a tenth of its
 *         speed): xg [H][n][P], Bg and Cg [G][n][N], dtg and dAg [H][n],
 *         yg [H][n][P]
 *   core  [n][W]          y gathered back per row, then the gated norm's output
 */
struct mix {
	const struct ke_fwd *f;
	const struct ke_layer *ly;
	int W, C, H, P, N, G, K, Wp;
	size_t conv_off, state_off;
	float *xg, *Bg, *Cg, *dtg, *dAg, *yg; /* in sc->dq */
};

#define CONV_BLOCK 64

/* Channels are independent: blocks of channels on the pool, every token
 * of the forward through its sequence's conv state in order. */
static void conv_part(void *ctx, size_t b, size_t e, int thread)
{
	const struct mix *j = ctx;
	const struct ke_fwd *f = j->f;
	float *mix = f->sc->mix;
	int c0 = (int)b * CONV_BLOCK, c1 = (int)e * CONV_BLOCK < j->C ? (int)e * CONV_BLOCK : j->C;
	(void)thread;
	for (int t = 0; t < f->n; t++) {
		const struct ke_seq *sq = f->seqs[f->row_seq[t]];
		float *st = (sq->spec_fwd ? sq->spec->alt : sq->rec) + j->conv_off / sizeof(float);
		ke_dn_conv(st + (size_t)c0 * (size_t)(j->K - 1), j->ly->conv_w + (size_t)c0 * (size_t)j->K,
			   mix + (size_t)t * (size_t)j->Wp + (size_t)j->W + (size_t)c0, c1 - c0, j->K);
	}
}

/* After the conv: + bias, SiLU over xBC; dt = softplus(dt_raw + dt_bias)
 * (torch's threshold 20) and dA = exp(dt A), once per head. */
static void pre_row(const void *ctx, int t)
{
	const struct mix *j = ctx;
	struct ke_scratch *sc = j->f->sc;
	float *row = sc->mix + (size_t)t * (size_t)j->Wp, *xbc = row + j->W, *dtr = row + j->W + j->C;
	if (j->ly->conv_b)
		for (int c = 0; c < j->C; c++)
			xbc[c] = xbc[c] + j->ly->conv_b[c];
	ke_vec_silu(xbc, j->C);
	size_t n = (size_t)j->f->n, P = (size_t)j->P, N = (size_t)j->N;
	for (int h = 0; h < j->H; h++) {
		float v = dtr[h] + j->ly->dt_bias[h];
		float sp = v > 20.0f ? v : log1pf(expf(v));
		j->dtg[(size_t)h * n + (size_t)t] = sp;
		j->dAg[(size_t)h * n + (size_t)t] = expf(sp * j->ly->neg_a[h]);
		memcpy(j->xg + ((size_t)h * n + (size_t)t) * P, xbc + (size_t)h * P, P * sizeof(float));
	}
	for (int g = 0; g < j->G; g++) {
		memcpy(j->Bg + ((size_t)g * n + (size_t)t) * N, xbc + (size_t)j->W + (size_t)g * N, N * sizeof(float));
		memcpy(j->Cg + ((size_t)g * n + (size_t)t) * N, xbc + (size_t)j->W + (size_t)(j->G + g) * N,
		       N * sizeof(float));
	}
}

/* One unit per (sequence, head), all in one pool dispatch. */
static void scan_part(void *ctx, size_t b, size_t e, int thread)
{
	const struct mix *j = ctx;
	const struct ke_fwd *f = j->f;
	int isa = ke_isa(), hpg = j->H / j->G;
	size_t n = (size_t)f->n, P = (size_t)j->P, N = (size_t)j->N;
	(void)thread;
	for (size_t u = b; u < e; u++) {
		int i = (int)(u / (size_t)j->H), h = (int)(u % (size_t)j->H), g = h / hpg;
		size_t r0 = (size_t)f->row0[i], ni = (size_t)f->row0[i + 1] - r0;
		const struct ke_seq *sq = f->seqs[i];
		size_t off = j->state_off / sizeof(float) + (size_t)h * P * N;
		float *S = (sq->spec_fwd ? sq->spec->alt : sq->rec) + off;
		if (sq->spec_fwd) /* out of place: the old state stays for ke_seq_accept */
			memcpy(S, sq->rec + off, P * N * sizeof *S);
		size_t hx = (size_t)h * n + r0, gx = (size_t)g * n + r0;
		ke_ssm_scan(isa, S, j->P, j->N, (int)ni, j->xg + hx * P, P, j->Bg + gx * N, j->Cg + gx * N, N, j->dtg + hx,
			    j->dAg + hx, 1, j->ly->ssm_d[h], j->yg + hx * P, P);
	}
}

/* The gated RMSNorm: g = silu(z) * y (z's buffer), then per group of the
 * width rmsnorm(g) * w into core. */
static void gnorm_row(const void *ctx, int t)
{
	const struct mix *j = ctx;
	const struct kv_model_config *c = &j->f->m->cfg;
	struct ke_scratch *sc = j->f->sc;
	float *z = sc->mix + (size_t)t * (size_t)j->Wp, *y = sc->core + (size_t)t * (size_t)j->W;
	int gs = j->W / c->ssm_norm_groups;
	size_t n = (size_t)j->f->n, P = (size_t)j->P;
	for (int h = 0; h < j->H; h++) /* the row's y back from the heads' compact rows */
		memcpy(y + (size_t)h * P, j->yg + ((size_t)h * n + (size_t)t) * P, P * sizeof(float));
	ke_vec_silu_mul(z, y, j->W);
	for (int g = 0; g < c->ssm_norm_groups; g++)
		ke_vec_rmsnorm(y + (size_t)g * (size_t)gs, z + (size_t)g * (size_t)gs, j->ly->gnorm + (size_t)g * (size_t)gs,
			       gs, (float)c->rms_eps);
}

void ke_mamba_layer(const struct ke_fwd *f, const struct ke_layer *ly)
{
	const struct ke_model *m = f->m;
	const struct kv_model_config *c = &m->cfg;
	const struct ke_rec_layer *rl = &m->lay.rec[ly->idx];
	struct ke_scratch *sc = f->sc;
	int n = f->n;
	struct mix j = {
		.f = f,
		.ly = ly,
		.W = c->ssm_heads * c->ssm_head_dim,
		.C = m->conv_dim,
		.H = c->ssm_heads,
		.P = c->ssm_head_dim,
		.N = c->ssm_state,
		.G = c->ssm_groups,
		.K = c->conv_kernel,
		.conv_off = rl->conv_off,
		.state_off = rl->state_off,
	};
	j.Wp = j.W + j.C + j.H;
	size_t nn = (size_t)n;
	j.xg = sc->dq;
	j.Bg = j.xg + nn * (size_t)j.W;
	j.Cg = j.Bg + nn * (size_t)j.G * (size_t)j.N;
	j.dtg = j.Cg + nn * (size_t)j.G * (size_t)j.N;
	j.dAg = j.dtg + nn * (size_t)j.H;
	j.yg = j.dAg + nn * (size_t)j.H;
	ke_gemm(&ly->in_proj, sc->h, (size_t)c->hidden, n, sc->mix, (size_t)j.Wp, 0);
	/* speculative sequences: log each row's conv input and raw dt (what
	 * ke_mamba_replay needs), and run the conv on a copy of the old state */
	for (int i = 0; i < f->n_seq; i++) {
		const struct ke_seq *sq = f->seqs[i];
		if (!sq->spec_fwd)
			continue;
		memcpy((char *)sq->spec->alt + rl->conv_off, (const char *)sq->rec + rl->conv_off, rl->conv_bytes);
		for (int t = f->row0[i]; t < f->row0[i + 1]; t++)
			memcpy(ke_spec_log_row(sq, ly->idx, t - f->row0[i]), sc->mix + (size_t)t * (size_t)j.Wp + (size_t)j.W,
			       (size_t)(j.C + j.H) * sizeof(float));
	}
	double t0 = ke_prof_t0();
	size_t cblocks = ((size_t)j.C + CONV_BLOCK - 1) / CONV_BLOCK;
	if (n > 1 && 2.0 * n * j.C * j.K >= KE_PAR_MIN_WORK / 4)
		kv_pool_for(kv_pool_global(), cblocks, 1, conv_part, &j);
	else
		conv_part(&j, 0, cblocks, 0);
	ke_par_rows(n, 20.0 * j.C + 40.0 * j.H, pre_row, &j);
	size_t units = (size_t)f->n_seq * (size_t)j.H;
	double work = 4.0 * n * (double)j.W * j.N;
	if (units > 1 && work >= KE_PAR_MIN_WORK)
		kv_pool_for(kv_pool_global(), units, 1, scan_part, &j);
	else
		scan_part(&j, 0, units, 0);
	ke_prof_add(KE_PROF_DN, t0, 5.0 * n * (double)j.W * j.N, 8.0 * n * (double)j.W * j.N);
	ke_par_rows(n, 30.0 * j.W, gnorm_row, &j);
	ke_gemm_residual(f, &ly->out, sc->core, (size_t)j.W);
}

/* ke_seq_accept's replay on the state before a speculative forward: per
 * Mamba-2 layer and kept row, the conv step on the logged input, then
 * pre_row's bias, SiLU, softplus and exp, then the scan of each head for
 * that one row: the operations of the forward in its order (the scan
 * gives the same bits at any chunk size), its y thrown away. */
void ke_mamba_replay(struct ke_seq *s, int keep)
{
	const struct ke_model *m = s->m;
	const struct kv_model_config *c = &m->cfg;
	int W = c->ssm_heads * c->ssm_head_dim, C = m->conv_dim, H = c->ssm_heads, P = c->ssm_head_dim;
	int N = c->ssm_state, G = c->ssm_groups, K = c->conv_kernel, hpg = H / G, isa = ke_isa();
	float *xbc = s->spec->junk, *dt = xbc + C, *dA = dt + H, *y = dA + H;
	for (int l = 0; l < c->n_layers; l++) {
		const struct ke_layer *ly = &m->layers[l];
		if (ly->type != KV_LAYER_MAMBA)
			continue;
		const struct ke_rec_layer *rl = &m->lay.rec[ly->idx];
		float *st = s->rec + rl->conv_off / sizeof(float), *S0 = s->rec + rl->state_off / sizeof(float);
		for (int t = 0; t < keep; t++) {
			const float *row = ke_spec_log_row(s, ly->idx, t);
			memcpy(xbc, row, (size_t)C * sizeof *xbc);
			for (int c0 = 0; c0 < C; c0 += CONV_BLOCK) /* conv_part's blocks */
				ke_dn_conv(st + (size_t)c0 * (size_t)(K - 1), ly->conv_w + (size_t)c0 * (size_t)K, xbc + c0,
					   (C - c0 < CONV_BLOCK ? C - c0 : CONV_BLOCK), K);
			if (ly->conv_b)
				for (int ch = 0; ch < C; ch++)
					xbc[ch] = xbc[ch] + ly->conv_b[ch];
			ke_vec_silu(xbc, C);
			for (int h = 0; h < H; h++) {
				float v = row[C + h] + ly->dt_bias[h];
				dt[h] = v > 20.0f ? v : log1pf(expf(v));
				dA[h] = expf(dt[h] * ly->neg_a[h]);
			}
			for (int h = 0; h < H; h++) {
				int g = h / hpg;
				ke_ssm_scan(isa, S0 + (size_t)h * P * N, P, N, 1, xbc + (size_t)h * P, (size_t)P,
					    xbc + W + (size_t)g * N, xbc + W + (size_t)(G + g) * N, (size_t)N, dt + h, dA + h, 1,
					    ly->ssm_d[h], y, (size_t)P);
			}
		}
	}
}
