/*
 * attn.c - see attn.h.
 */
#include "engine/attn.h"
#include "engine/gemm.h"
#include "engine/isa.h"
#include "engine/prof.h"
#include "engine/vec.h"
#include "model/safetensors.h"
#include "base/pool.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

size_t ke_attn_scratch_floats(int group, int head_dim)
{
	/* a tile of R rows: scores [R][BLOCK], acc [R][hd], queries [R][hd], m [R], l [R] */
	int tq = KE_ATTN_TILE_ROWS / group;
	size_t r = (size_t)(tq < 1 ? 1 : tq) * (size_t)group;
	return r * KE_ATTN_BLOCK + 2u * r * (size_t)head_dim + 2u * r + 16u;
}

#if defined(__x86_64__)
#include <immintrin.h>
#define TGT2 __attribute__((target("avx2,fma")))

TGT2 static inline __m256 ld8(const char *p, int bf)
{
	if (bf)
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
	return _mm256_loadu_ps((const float *)(const void *)p);
}

/* A 16-column strip of GS query rows: acc rows stay in registers across
 * the block's keys. */
TGT2 static inline __attribute__((always_inline)) void pv_strip(const int GS, float *acc, const float *P,
								const char *const *vrow, int nb, int hd, int d0, int bf)
{
	size_t es = bf ? 2 : 4;
	__m256 a[4][2];
#pragma GCC unroll 4
	for (int i = 0; i < GS; i++) {
		a[i][0] = _mm256_loadu_ps(acc + (size_t)i * hd + d0);
		a[i][1] = _mm256_loadu_ps(acc + (size_t)i * hd + d0 + 8);
	}
	for (int j = 0; j < nb; j++) {
		__m256 v0 = ld8(vrow[j] + (size_t)d0 * es, bf), v1 = ld8(vrow[j] + (size_t)(d0 + 8) * es, bf);
#pragma GCC unroll 4
		for (int i = 0; i < GS; i++) {
			__m256 p = _mm256_broadcast_ss(P + (size_t)i * KE_ATTN_BLOCK + j);
			a[i][0] = _mm256_fmadd_ps(p, v0, a[i][0]);
			a[i][1] = _mm256_fmadd_ps(p, v1, a[i][1]);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < GS; i++) {
		_mm256_storeu_ps(acc + (size_t)i * hd + d0, a[i][0]);
		_mm256_storeu_ps(acc + (size_t)i * hd + d0 + 8, a[i][1]);
	}
}

#define TGT5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))

TGT5 static inline __m512 ld16(const char *p, int bf)
{
	if (bf)
		return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
	return _mm512_loadu_ps((const float *)(const void *)p);
}

/* The same strip with 32 columns in two 16-lane registers per row. */
TGT5 static inline __attribute__((always_inline)) void pv_strip5(const int GS, float *acc, const float *P,
								 const char *const *vrow, int nb, int hd, int d0, int bf)
{
	size_t es = bf ? 2 : 4;
	__m512 a[4][2];
#pragma GCC unroll 4
	for (int i = 0; i < GS; i++) {
		a[i][0] = _mm512_loadu_ps(acc + (size_t)i * hd + d0);
		a[i][1] = _mm512_loadu_ps(acc + (size_t)i * hd + d0 + 16);
	}
	for (int j = 0; j < nb; j++) {
		__m512 v0 = ld16(vrow[j] + (size_t)d0 * es, bf), v1 = ld16(vrow[j] + (size_t)(d0 + 16) * es, bf);
#pragma GCC unroll 4
		for (int i = 0; i < GS; i++) {
			__m512 p = _mm512_set1_ps(P[(size_t)i * KE_ATTN_BLOCK + j]);
			a[i][0] = _mm512_fmadd_ps(p, v0, a[i][0]);
			a[i][1] = _mm512_fmadd_ps(p, v1, a[i][1]);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < GS; i++) {
		_mm512_storeu_ps(acc + (size_t)i * hd + d0, a[i][0]);
		_mm512_storeu_ps(acc + (size_t)i * hd + d0 + 16, a[i][1]);
	}
}

#define PVS5(gs, bf) \
	TGT5 static void pv5_##gs##_##bf(float *acc, const float *P, const char *const *vrow, int nb, int hd, int d0) \
	{ pv_strip5(gs, acc, P, vrow, nb, hd, d0, bf); }
PVS5(1, 0) PVS5(2, 0) PVS5(3, 0) PVS5(4, 0) PVS5(1, 1) PVS5(2, 1) PVS5(3, 1) PVS5(4, 1)

#define PVS(gs, bf) \
	TGT2 static void pv_##gs##_##bf(float *acc, const float *P, const char *const *vrow, int nb, int hd, int d0) \
	{ pv_strip(gs, acc, P, vrow, nb, hd, d0, bf); }
PVS(1, 0) PVS(2, 0) PVS(3, 0) PVS(4, 0) PVS(1, 1) PVS(2, 1) PVS(3, 1) PVS(4, 1)
typedef void (*pv_fn)(float *, const float *, const char *const *, int, int, int);
static const pv_fn g_pv[2][4] = {{pv_1_0, pv_2_0, pv_3_0, pv_4_0}, {pv_1_1, pv_2_1, pv_3_1, pv_4_1}};
static const pv_fn g_pv5[2][4] = {{pv5_1_0, pv5_2_0, pv5_3_0, pv5_4_0}, {pv5_1_1, pv5_2_1, pv5_3_1, pv5_4_1}};

/* acc[i][d] = fma(P[i][j], V_j[d], acc[i][d]) for j ascending, i < G:
 * the same operations, element by element, as pv_scalar below. */
static void pv_avx2(float *acc, const float *P, const char *const *vrow, int nb, int G, int hd, int bf, int isa)
{
	int d0 = 0;
	if (isa >= KE_ISA_AVX512)
		for (; d0 + 32 <= hd; d0 += 32)
			for (int g0 = 0; g0 < G; g0 += 4) {
				int gs = G - g0 < 4 ? G - g0 : 4;
				g_pv5[bf][gs - 1](acc + (size_t)g0 * hd, P + (size_t)g0 * KE_ATTN_BLOCK, vrow, nb, hd, d0);
			}
	for (; d0 + 16 <= hd; d0 += 16)
		for (int g0 = 0; g0 < G; g0 += 4) {
			int gs = G - g0 < 4 ? G - g0 : 4;
			g_pv[bf][gs - 1](acc + (size_t)g0 * hd, P + (size_t)g0 * KE_ATTN_BLOCK, vrow, nb, hd, d0);
		}
	for (int d = d0; d < hd; d++)
		for (int j = 0; j < nb; j++)
			for (int i = 0; i < G; i++) {
				float v;
				if (bf) {
					uint16_t h;
					memcpy(&h, vrow[j] + (size_t)d * 2, 2);
					uint32_t u = (uint32_t)h << 16;
					memcpy(&v, &u, 4);
				} else {
					memcpy(&v, vrow[j] + (size_t)d * 4, 4);
				}
				float *y = acc + (size_t)i * hd + d;
				*y = fmaf(P[(size_t)i * KE_ATTN_BLOCK + j], v, *y);
			}
}
#endif

static void pv_scalar(float *acc, const float *P, const char *const *vrow, int nb, int G, int hd, int bf)
{
	for (int j = 0; j < nb; j++)
		for (int i = 0; i < G; i++) {
			float pj = P[(size_t)i * KE_ATTN_BLOCK + j];
			if (bf)
				ke_vec_axpy_bf16_isa(KE_ISA_SCALAR, acc + (size_t)i * hd, pj, vrow[j], hd);
			else
				ke_vec_axpy_isa(KE_ISA_SCALAR, acc + (size_t)i * hd, pj, (const float *)(const void *)vrow[j], hd);
		}
}

static inline const char *kv_row(const struct ke_layout *lay, struct kv_page *const *pages, int seg, int pos)
{
	int B = lay->page_tokens;
	const struct kv_page *pg = pages[pos / B];
	return (const char *)pg->data + ((size_t)seg * (size_t)B + (size_t)(pos % B)) * lay->row_bytes;
}

/* Query tokens per tile for a group size G: about KE_ATTN_TILE_ROWS rows. */
static int tile_tokens(int G)
{
	int tq = KE_ATTN_TILE_ROWS / G;
	return tq < 1 ? 1 : tq;
}

/* Per-row online-softmax update for one block: row i of S holds the raw
 * scores of keys b0..b0+nb-1. The same operations as the one-row form. */
static void softmax_row(float *s, int nb, float scale, float *m, float *l, float *acc, int hd)
{
	float bm = -FLT_MAX;
	for (int j = 0; j < nb; j++) {
		s[j] = s[j] * scale;
		bm = s[j] > bm ? s[j] : bm;
	}
	float mn = *m > bm ? *m : bm;
	float c = ke_exp(*m - mn);
	for (int j = 0; j < nb; j++)
		s[j] = s[j] - mn;
	ke_vec_exp(s, s, nb);
	float sum = 0.0f;
	for (int j = 0; j < nb; j++)
		sum = sum + s[j];
	*l = *l * c + sum;
	*m = mn;
	if (c != 1.0f) /* x * 1 == x exactly: skipping it changes no bit */
		ke_vec_scale(acc, c, hd);
}

static void pv_rows(float *acc, const float *P, const char *const *vrow, int nb, int rows, int hd, int bf, int isa)
{
#if defined(__x86_64__)
	if (isa >= KE_ISA_AVX2) {
		pv_avx2(acc, P, vrow, nb, rows, hd, bf, isa);
		return;
	}
#endif
	(void)isa;
	pv_scalar(acc, P, vrow, nb, rows, hd, bf);
}

/*
 * A tile: query tokens [t0, t1) of one KV head, R = (t1 - t0) G rows.
 * Each key block is loaded once for all the rows whose query reaches it
 * (a token at position p uses keys 0..p); every row still sees exactly
 * the one-row sequence of operations (attn.h): the scores of a block are
 * row-independent gemm outputs, and the softmax and PV of a row only
 * read its own keys 0..min(block end, p).
 */
static void attn_tile(const struct ke_attn_args *a, int t0, int t1, int g, float *scr, int isa)
{
	const struct ke_layout *lay = a->lay;
	int hd = lay->head_dim, Hkv = lay->n_kv_heads, G = a->n_heads / Hkv, B = lay->page_tokens;
	int nt = t1 - t0, R = nt * G;
	int kseg = (a->layer * 2 + 0) * Hkv + g, vseg = (a->layer * 2 + 1) * Hkv + g;
	int bf = lay->kv_dtype == KV_DT_BF16;
	int rmax = tile_tokens(G) * G;
	float *S = scr;                                 /* [R][BLOCK] */
	float *acc = S + (size_t)rmax * KE_ATTN_BLOCK;  /* [R][hd] */
	float *qt = acc + (size_t)rmax * hd;            /* [R][hd] */
	float *m = qt + (size_t)rmax * hd;              /* [R] */
	float *l = m + rmax;                            /* [R] */
	int last = a->pos0 + t1 - 1;

	for (int t = 0; t < nt; t++)
		memcpy(qt + (size_t)t * G * hd, a->q + ((size_t)(t0 + t) * a->n_heads + (size_t)g * G) * hd,
		       (size_t)G * hd * sizeof *qt);
	memset(acc, 0, (size_t)R * hd * sizeof *acc);
	for (int i = 0; i < R; i++) {
		m[i] = -FLT_MAX;
		l[i] = 0.0f;
	}
	const char *vrow[KE_ATTN_BLOCK];
	for (int b0 = 0; b0 <= last; b0 += KE_ATTN_BLOCK) {
		int nbm = last + 1 - b0 < KE_ATTN_BLOCK ? last + 1 - b0 : KE_ATTN_BLOCK;
		/* first token of the tile whose query reaches this block */
		int ta = b0 - a->pos0 - t0;
		if (ta < 0)
			ta = 0;
		int r0 = ta * G, nr = R - r0;
		/* Scores, one gemm per stretch of the block that lies in one page. */
		for (int j0 = 0; j0 < nbm;) {
			int p = b0 + j0;
			int in_page = B - p % B;
			int n = nbm - j0 < in_page ? nbm - j0 : in_page;
			struct ke_mat km = {kv_row(lay, a->pages, kseg, p), lay->kv_dtype, n, hd, (size_t)hd};
			ke_gemm_range(isa, &km, qt + (size_t)r0 * hd, (size_t)hd, nr, S + (size_t)r0 * KE_ATTN_BLOCK + j0,
				      KE_ATTN_BLOCK, 0, 0, n);
			j0 += n;
		}
		for (int j = 0; j < nbm; j++)
			vrow[j] = kv_row(lay, a->pages, vseg, b0 + j);
		/* Runs of tokens with the same key count share one PV pass. */
		for (int t = ta; t < nt;) {
			int pos = a->pos0 + t0 + t;
			int nb = pos + 1 - b0 < KE_ATTN_BLOCK ? pos + 1 - b0 : KE_ATTN_BLOCK;
			int te = t + 1;
			while (te < nt && nb == KE_ATTN_BLOCK)
				te++;
			for (int i = t * G; i < te * G; i++)
				softmax_row(S + (size_t)i * KE_ATTN_BLOCK, nb, a->scale, m + i, l + i, acc + (size_t)i * hd, hd);
			pv_rows(acc + (size_t)t * G * hd, S + (size_t)t * G * KE_ATTN_BLOCK, vrow, nb, (te - t) * G, hd, bf,
				isa);
			t = te;
		}
	}
	for (int t = 0; t < nt; t++) {
		float *o = a->out + ((size_t)(t0 + t) * a->n_heads + (size_t)g * G) * hd;
		for (int i = 0; i < G; i++) {
			const float *ac = acc + ((size_t)t * G + i) * hd;
			float inv = 1.0f / l[t * G + i];
			for (int d = 0; d < hd; d++)
				o[(size_t)i * hd + d] = ac[d] * inv;
		}
	}
}

struct attn_job {
	const struct ke_attn_args *a;
	int isa;
	size_t scr_floats;
	int tq, n_tiles;
};

static void attn_part(void *ctx, size_t b, size_t e, int thread)
{
	const struct attn_job *j = ctx;
	const struct ke_attn_args *a = j->a;
	int Hkv = a->lay->n_kv_heads;
	float *scr = a->scratch + (size_t)thread * j->scr_floats;
	/* Causal work grows with the token index; tiles are handed out zigzag
	 * (last, first, second to last, ...) so the big ones go first and
	 * chunks stay balanced. Order never affects results. */
	for (size_t u = b; u < e; u++) {
		size_t k = u / (size_t)Hkv;
		int ti = (int)(k % 2 == 1 ? k / 2 : (size_t)j->n_tiles - 1 - k / 2);
		int t0 = ti * j->tq, t1 = t0 + j->tq < a->n_tok ? t0 + j->tq : a->n_tok;
		attn_tile(a, t0, t1, (int)(u % (size_t)Hkv), scr, j->isa);
	}
}

void ke_attn(const struct ke_attn_args *a)
{
	int G = a->n_heads / a->lay->n_kv_heads;
	struct attn_job j = {a, ke_isa(), ke_attn_scratch_floats(G, a->lay->head_dim), tile_tokens(G), 0};
	j.n_tiles = (a->n_tok + j.tq - 1) / j.tq;
	size_t units = (size_t)j.n_tiles * (size_t)a->lay->n_kv_heads;
	double work = (double)a->n_tok * (double)(a->pos0 + a->n_tok) * a->n_heads * a->lay->head_dim;
	double t0 = ke_prof_t0();
	if (a->scratch_threads < kv_pool_size(kv_pool_global()) || units == 1 || work < KE_PAR_MIN_WORK)
		attn_part(&j, 0, units, 0);
	else
		kv_pool_for(kv_pool_global(), units, 1, attn_part, &j);
	if (t0 != 0.0) {
		/* q.k and p.v: 4 flops per (query head, key, dim); each tile reads
		 * the K and V rows of its keys once per KV head */
		double n = a->n_tok, keys = n * (a->pos0 + 1) + n * (n - 1) / 2, kvb = 0;
		for (int t = 0; t < a->n_tok; t += j.tq) {
			int t1 = t + j.tq < a->n_tok ? t + j.tq : a->n_tok;
			kvb += (double)(a->pos0 + t1) * 2.0 * (double)a->lay->row_bytes * a->lay->n_kv_heads;
		}
		ke_prof_add(KE_PROF_ATTN, t0, 4.0 * keys * a->n_heads * a->lay->head_dim, kvb);
	}
}
