/*
 * attn.c - see attn.h.
 *
 * A tile (query tokens [t0, t1) of one KV head, R = (t1 - t0) G rows)
 * walks the key blocks. Per block, on the vector paths with enough rows
 * ("wide" tiles: prefill), the block's bf16 or q8_0 keys and values are
 * widened to f32 a few keys at a time (exact), and:
 *   scores  S^T[j][r] = gemm-dot(k_j, q_r): the keys are the activation
 *           rows and the queries the weight rows of ke_gemm_range (an fma
 *           product is commutative, so these are the bits of dot(q_r,
 *           k_j)), which leaves the row index contiguous: the softmax
 *           steps below run over 8 (AVX-512: 16) rows per vector, each
 *           row still doing its own ops in key order (a row's sum over
 *           keys was one 4-cycle dependent chain per key before). On
 *           AVX-512 with hd a multiple of 16 the tile computes the same
 *           canonical dots itself with the rows in the lanes (qk_lanes:
 *           the lane classes of the 16-lane order two at a time, the
 *           tree as vertical adds);
 *   softmax per row, element-wise and in key order (attn.h);
 *   PV      acc[r] += p_j[r] v_j, j ascending, in register strips.
 * Rows of the tile whose query does not reach key j (the diagonal block)
 * skip it: for key j the rows that use it are a suffix [rj, R). Narrow
 * tiles (decode, and the scalar path) compute the scores with the keys as
 * weight rows, in place, and transpose them; on AVX-512 tiles of 1, 2, 4
 * or 8 rows do the same dots in qk_narrow, 16 outputs per register tile
 * reduced together, and prefetch K ahead and V for the PV pass (decode is
 * bound by streaming them). q8_0 rows are read as they are by the decode
 * score kernel and the PV strips (16 codes, vpmovsxbd, convert, times the
 * block's scale: the exact values); the scalar path and AVX2's decode
 * scores take them through the f32 buffer of a wide tile. The chunks of the key split
 * (attn.h) are merged by the tile itself (prefill) or, for a decode step,
 * computed as separate units in parallel and merged by attn_split.
 */
#include "engine/attn.h"
#include "engine/gemm.h"
#include "engine/isa.h"
#include "engine/kvq8.h"
#include "engine/matmul.h"
#include "engine/prof.h"
#include "engine/vec.h"
#include "model/safetensors.h"
#include "base/pool.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Keys widened at a time (hd <= 128). */
#define WB 32
/* Query rows per score gemm of a wide tile. */
#define QK_ROWS 36

/* Sizes for heads of hd: about KE_ATTN_TILE_ROWS query rows per tile at
 * hd <= 128 (fewer for wider heads), keys widened WB at a time and query
 * rows per score gemm: the widened keys or values, the queries or
 * accumulators they meet and the scores stay in L1 (48 KiB here). Speed
 * knobs only. */
static int hd_scale(int hd)
{
	return hd <= 128 ? 1 : (hd + 127) / 128;
}

static int tile_tokens(int G, int hd, int isa)
{
	/* AVX-512 at head_dim 256: 32 rows, whole 16-row vectors for the lane
	 * scores (24 rows would waste a quarter of the lanes or keep the gemm
	 * tiles): bench-hybrid's shape in 256-query chunks ~1.1x; the AVX2
	 * tiles showed no gain from it and keep 24 */
	int rows = isa >= KE_ISA_AVX512 && hd > 128 && hd <= 256 ? 32 : KE_ATTN_TILE_ROWS / hd_scale(hd);
	int tq = rows / G;
	return tq < 1 ? 1 : tq;
}

static int wb_keys(int hd)
{
	int w = WB / hd_scale(hd);
	return w < 8 ? 8 : w;
}

static int qk_rows(int hd)
{
	int q = QK_ROWS / hd_scale(hd);
	return q < 6 ? 6 : q;
}

/* Keys per register tile of the lane-wise scores (qk_lanes), and the
 * floats of its stack of partial sums (3 levels x 4 keys x 3 vectors). */
#define QK_NK 4
#define QK_STACK (3 * QK_NK * 3 * 16)

/* Chunk states of the decode split: this many tiles' worth per thread. */
#define SLOT_TILES 2
/* Rows from which a tile widens its key/value blocks to f32. */
#define WIDE_ROWS 12

struct tile_scr {
	float *st;    /* [BLOCK][R] scores, row index contiguous */
	float *srm;   /* [rmax][BLOCK] scores of narrow tiles, row-major */
	float *acc;   /* [R][hd] current chunk */
	float *qt;    /* [R][hd] */
	float *m, *l, *tmp, *cf; /* [R] */
	float *M, *L; /* [R] merged chunks before the current one */
	float *ACC;   /* [R][hd] */
	float *kf;    /* [WB][hd] widened keys or values */
	float *qT;    /* [hd][round up(R, 16)] queries transposed (qk_lanes) */
	float *slots; /* SLOT_TILES x rmax x (hd + 2) */
};

static size_t scr_floats(int rmax, int hd)
{
	size_t r = (size_t)rmax, h = (size_t)hd;
	return 2u * KE_ATTN_BLOCK * r + 3 * r * h + 6 * r + WB * h + h * (r + 16) +
	       SLOT_TILES * r * (h + 2) + 16u;
}

size_t ke_attn_scratch_floats(int group, int head_dim)
{
	/* the larger of the paths' tiles (the path is chosen per call) */
	size_t a = scr_floats(tile_tokens(group, head_dim, KE_ISA_AVX512) * group, head_dim);
	size_t b = scr_floats(tile_tokens(group, head_dim, KE_ISA_SCALAR) * group, head_dim);
	return a > b ? a : b;
}

static void scr_carve(struct tile_scr *s, float *p, int rmax, int hd)
{
	size_t r = (size_t)rmax, h = (size_t)hd;
	s->st = p;
	p += KE_ATTN_BLOCK * r;
	s->srm = p;
	p += KE_ATTN_BLOCK * r;
	s->acc = p;
	p += r * h;
	s->qt = p;
	p += r * h;
	s->ACC = p;
	p += r * h;
	s->m = p;
	s->l = p + r;
	s->tmp = p + 2 * r;
	s->cf = p + 3 * r;
	s->M = p + 4 * r;
	s->L = p + 5 * r;
	p += 6 * r;
	s->kf = p;
	p += WB * h;
	s->qT = p;
	p += h * (r + 16);
	s->slots = p;
}

/* What a KV row holds, as the kernels below are specialised (a
 * compile-time constant in each): f32, bf16 (widened exactly), or Q8_0
 * blocks (engine/kvq8.h: code x scale, exact). */
enum { KT_F32 = 0, KT_BF16 = 1, KT_Q8 = 2 };

static int kv_kind(int kv_dtype)
{
	return kv_dtype == KV_DT_BF16 ? KT_BF16 : kv_dtype == KV_DT_Q8_0 ? KT_Q8 : KT_F32;
}

/* The Q8_0 block holding element col of a row. */
static inline const char *q8_block(const char *row, int col)
{
	return row + (size_t)(col / KE_KVQ8_BLOCK) * KE_KVQ8_BLOCK_BYTES;
}

#if defined(__x86_64__)
#include <immintrin.h>
#define TGT2 __attribute__((target("avx2,fma")))

/* Elements [col, col + 8) of a row of kind kt, exactly as f32. */
TGT2 static inline __m256 ld8(const char *row, int col, int kt)
{
	if (kt == KT_BF16)
		return _mm256_castsi256_ps(
			_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)col))), 16));
	if (kt == KT_Q8) {
		const char *b = q8_block(row, col);
		__m128i q = _mm_loadl_epi64((const __m128i *)(const void *)(b + 2 + (col & 31)));
		return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_set1_ps(ke_kvq8_scale(b)));
	}
	return _mm256_loadu_ps((const float *)(const void *)(row + 4 * (size_t)col));
}

/* Elements [col, col + 16) (col a multiple of 16) as two vectors; a q8
 * block's scale is read once. */
TGT2 static inline void ld8x2(const char *row, int col, int kt, __m256 *v0, __m256 *v1)
{
	if (kt == KT_Q8) {
		const char *b = q8_block(row, col);
		__m128i q = _mm_loadu_si128((const __m128i *)(const void *)(b + 2 + (col & 31)));
		__m256 d = _mm256_set1_ps(ke_kvq8_scale(b));
		*v0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
		*v1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))), d);
		return;
	}
	*v0 = ld8(row, col, kt);
	*v1 = ld8(row, col + 8, kt);
}

/* n bf16 values to f32 (exact). */
TGT2 static void widen_avx2(float *y, const char *x, int n)
{
	int i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, ld8(x, i, KT_BF16));
	for (; i < n; i++) {
		uint16_t h;
		memcpy(&h, x + 2 * i, 2);
		uint32_t u = (uint32_t)h << 16;
		memcpy(y + i, &u, 4);
	}
}

/* n (a multiple of 32) values of a q8 row to f32 (exact). */
TGT2 static void dequant_avx2(float *y, const char *row, int n)
{
	for (int i = 0; i < n; i += 16) {
		__m256 v0, v1;
		ld8x2(row, i, KT_Q8, &v0, &v1);
		_mm256_storeu_ps(y + i, v0);
		_mm256_storeu_ps(y + i + 8, v1);
	}
}

/* A 16-column strip of GS query rows: acc rows stay in registers across
 * the block's keys. P[j * ldp + i] is row i's weight of key j. */
TGT2 static inline __attribute__((always_inline)) void pv_strip(const int GS, float *acc, const float *P, int ldp,
								const char *const *vrow, int nb, int hd, int d0, int kt)
{
	__m256 a[4][2];
#pragma GCC unroll 4
	for (int i = 0; i < GS; i++) {
		a[i][0] = _mm256_loadu_ps(acc + (size_t)i * hd + d0);
		a[i][1] = _mm256_loadu_ps(acc + (size_t)i * hd + d0 + 8);
	}
	for (int j = 0; j < nb; j++) {
		__m256 v0, v1;
		ld8x2(vrow[j], d0, kt, &v0, &v1);
#pragma GCC unroll 4
		for (int i = 0; i < GS; i++) {
			__m256 p = _mm256_broadcast_ss(P + (size_t)j * ldp + i);
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

/* The scale of a q8 block, broadcast: vcvtph2ps of the half in every
 * word (exact, a NaN quieted: ke_kvq8_scale's value). */
TGT5 static inline __m512 q8_scale16(const char *b)
{
	uint16_t h;
	memcpy(&h, b, 2);
	return _mm512_cvtph_ps(_mm256_set1_epi16((short)h));
}

/* 16 codes of a q8 block from element o (0 or 16) times its scale d. */
TGT5 static inline __m512 q8x16(const char *b, int o, __m512 d)
{
	__m128i q = _mm_loadu_si128((const __m128i *)(const void *)(b + 2 + o));
	return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
}

/* Elements [col, col + 16) of a row of kind kt (col a multiple of 16). */
TGT5 static inline __m512 ld16(const char *row, int col, int kt)
{
	if (kt == KT_BF16)
		return _mm512_castsi512_ps(
			_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * (size_t)col))), 16));
	if (kt == KT_Q8) {
		const char *b = q8_block(row, col);
		return q8x16(b, col & 31, q8_scale16(b));
	}
	return _mm512_loadu_ps((const float *)(const void *)(row + 4 * (size_t)col));
}

/* Elements [col, col + 32) (col a multiple of 32) as two vectors; a q8
 * block is exactly these 32, its scale read once. */
TGT5 static inline void ld16x2(const char *row, int col, int kt, __m512 *v0, __m512 *v1)
{
	if (kt == KT_Q8) {
		const char *b = q8_block(row, col);
		__m512 d = q8_scale16(b);
		*v0 = q8x16(b, 0, d);
		*v1 = q8x16(b, 16, d);
		return;
	}
	*v0 = ld16(row, col, kt);
	*v1 = ld16(row, col + 16, kt);
}

/* n (a multiple of 32) values of a q8 row to f32 (exact). */
TGT5 static void dequant_avx512(float *y, const char *row, int n)
{
	for (int i = 0; i < n; i += 32) {
		__m512 v0, v1;
		ld16x2(row, i, KT_Q8, &v0, &v1);
		_mm512_storeu_ps(y + i, v0);
		_mm512_storeu_ps(y + i + 16, v1);
	}
}

/* 16 bf16 values to f32 (exact): one word permute puts value i in the
 * high half of dword i and zeroes the low halves (1 uop, where
 * zero-extend + shift is 2). idx is bf16_idx(). */
TGT5 static inline __m512i bf16_idx(void)
{
	return _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0,
				1, 0, 0, 0);
}

TGT5 static inline __m512 bf16x16(const char *x, __m512i idx)
{
	__m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)x));
	return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, idx, v));
}

/* n (a multiple of 16) bf16 values to f32 (exact). */
TGT5 static void widen_avx512(float *y, const char *x, int n)
{
	const __m512i idx = bf16_idx();
	for (int i = 0; i < n; i += 16)
		_mm512_storeu_ps(y + i, bf16x16(x + 2 * i, idx));
}

/* The same strip with 32 columns in two 16-lane registers per row, up to
 * 6 rows (12 accumulators); d0 is a multiple of 32. */
TGT5 static inline __attribute__((always_inline)) void pv_strip5(const int GS, float *acc, const float *P, int ldp,
								 const char *const *vrow, int nb, int hd, int d0, int kt)
{
	__m512 a[6][2];
#pragma GCC unroll 6
	for (int i = 0; i < GS; i++) {
		a[i][0] = _mm512_loadu_ps(acc + (size_t)i * hd + d0);
		a[i][1] = _mm512_loadu_ps(acc + (size_t)i * hd + d0 + 16);
	}
	for (int j = 0; j < nb; j++) {
		__m512 v0, v1;
		ld16x2(vrow[j], d0, kt, &v0, &v1);
#pragma GCC unroll 6
		for (int i = 0; i < GS; i++) {
			__m512 p = _mm512_set1_ps(P[(size_t)j * ldp + i]);
			a[i][0] = _mm512_fmadd_ps(p, v0, a[i][0]);
			a[i][1] = _mm512_fmadd_ps(p, v1, a[i][1]);
		}
	}
#pragma GCC unroll 6
	for (int i = 0; i < GS; i++) {
		_mm512_storeu_ps(acc + (size_t)i * hd + d0, a[i][0]);
		_mm512_storeu_ps(acc + (size_t)i * hd + d0 + 16, a[i][1]);
	}
}

/* 64 columns (four registers per row), up to 5 rows: 20 accumulators,
 * so each broadcast weight feeds four fmas instead of two. (Strips of 6
 * rows, 24 accumulators, measured ~5% slower.) */
TGT5 static inline __attribute__((always_inline)) void pv_strip5w(const int GS, float *acc, const float *P, int ldp,
								  const char *const *vrow, int nb, int hd, int d0, int kt)
{
	__m512 a[5][4];
#pragma GCC unroll 5
	for (int i = 0; i < GS; i++)
#pragma GCC unroll 4
		for (int c = 0; c < 4; c++)
			a[i][c] = _mm512_loadu_ps(acc + (size_t)i * hd + d0 + 16 * c);
	for (int j = 0; j < nb; j++) {
		__m512 v[4];
		ld16x2(vrow[j], d0, kt, &v[0], &v[1]);
		ld16x2(vrow[j], d0 + 32, kt, &v[2], &v[3]);
#pragma GCC unroll 5
		for (int i = 0; i < GS; i++) {
			__m512 p = _mm512_set1_ps(P[(size_t)j * ldp + i]);
#pragma GCC unroll 4
			for (int c = 0; c < 4; c++)
				a[i][c] = _mm512_fmadd_ps(p, v[c], a[i][c]);
		}
	}
#pragma GCC unroll 5
	for (int i = 0; i < GS; i++)
#pragma GCC unroll 4
		for (int c = 0; c < 4; c++)
			_mm512_storeu_ps(acc + (size_t)i * hd + d0 + 16 * c, a[i][c]);
}

#define PVS5W(gs, kt) \
	TGT5 static void pv5w_##gs##_##kt(float *acc, const float *P, int ldp, const char *const *vrow, int nb, int hd, \
					  int d0) \
	{ pv_strip5w(gs, acc, P, ldp, vrow, nb, hd, d0, kt); }
PVS5W(1, 0) PVS5W(2, 0) PVS5W(3, 0) PVS5W(4, 0) PVS5W(5, 0)
PVS5W(1, 1) PVS5W(2, 1) PVS5W(3, 1) PVS5W(4, 1) PVS5W(5, 1)
PVS5W(1, 2) PVS5W(2, 2) PVS5W(3, 2) PVS5W(4, 2) PVS5W(5, 2)

#define PVS5(gs, kt) \
	TGT5 static void pv5_##gs##_##kt(float *acc, const float *P, int ldp, const char *const *vrow, int nb, int hd, \
					 int d0) \
	{ pv_strip5(gs, acc, P, ldp, vrow, nb, hd, d0, kt); }
PVS5(1, 0) PVS5(2, 0) PVS5(3, 0) PVS5(4, 0) PVS5(5, 0) PVS5(6, 0)
PVS5(1, 1) PVS5(2, 1) PVS5(3, 1) PVS5(4, 1) PVS5(5, 1) PVS5(6, 1)
PVS5(1, 2) PVS5(2, 2) PVS5(3, 2) PVS5(4, 2) PVS5(5, 2) PVS5(6, 2)

#define PVS(gs, kt) \
	TGT2 static void pv_##gs##_##kt(float *acc, const float *P, int ldp, const char *const *vrow, int nb, int hd, \
					int d0) \
	{ pv_strip(gs, acc, P, ldp, vrow, nb, hd, d0, kt); }
PVS(1, 0) PVS(2, 0) PVS(3, 0) PVS(4, 0) PVS(1, 1) PVS(2, 1) PVS(3, 1) PVS(4, 1)
PVS(1, 2) PVS(2, 2) PVS(3, 2) PVS(4, 2)
typedef void (*pv_fn)(float *, const float *, int, const char *const *, int, int, int);
static const pv_fn g_pv[3][4] = {{pv_1_0, pv_2_0, pv_3_0, pv_4_0},
				 {pv_1_1, pv_2_1, pv_3_1, pv_4_1},
				 {pv_1_2, pv_2_2, pv_3_2, pv_4_2}};
static const pv_fn g_pv5w[3][5] = {{pv5w_1_0, pv5w_2_0, pv5w_3_0, pv5w_4_0, pv5w_5_0},
				   {pv5w_1_1, pv5w_2_1, pv5w_3_1, pv5w_4_1, pv5w_5_1},
				   {pv5w_1_2, pv5w_2_2, pv5w_3_2, pv5w_4_2, pv5w_5_2}};
static const pv_fn g_pv5[3][6] = {{pv5_1_0, pv5_2_0, pv5_3_0, pv5_4_0, pv5_5_0, pv5_6_0},
				  {pv5_1_1, pv5_2_1, pv5_3_1, pv5_4_1, pv5_5_1, pv5_6_1},
				  {pv5_1_2, pv5_2_2, pv5_3_2, pv5_4_2, pv5_5_2, pv5_6_2}};

/* Scores with the query rows in the lanes (AVX-512, hd a multiple of 16):
 * qt is the tile's queries transposed, qt[k * ldq + r], so one vector holds
 * element k of 16 query rows and one fma per (key, 16 rows) advances lane
 * class j = k % 16 of the canonical 16-lane accumulators of all 16 scores
 * at once. The accumulator of class j is computed alone (k = j, j + 16,
 * ..., one fma each, from 0: the gemm's lane j), and the classes are
 * summed in the canonical tree (gemm.h: j + j+8, then + j+4, + j+2, 0 + 1)
 * by visiting them in bit-reversed order with a stack of partial sums: the
 * same operations on the same values as the gemm tile, so the same bits,
 * but the tree costs one vertical add per 16 scores per level instead of
 * lane shuffles per score, and no load is folded twice. */
static const int g_leaf[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

/* NK keys (kf + kk * hd; keys >= nk repeat key nk - 1 and are not stored)
 * x NV vectors of 16 rows from row v0; scores st[kk * ldst + r], rows < R.
 * Lane classes j and j + 8 are computed together (leaf pair i = classes
 * g_leaf[2i], g_leaf[2i] + 8) and added at once: the tree's first level
 * in registers, half the partial sums through memory (parking all 16
 * classes one by one measured 0.93x of this). */
TGT5 static inline __attribute__((always_inline)) void qk_lanes_tile(const int NV, const int HD, const float *kf,
								     int nk, int hd, const float *qt, int ldq, int v0,
								     float *st, int ldst, int R)
{
	/* HD > 0: the head size as a constant (the k loop unrolled) */
	if (HD)
		hd = HD;
	__m512 a[QK_NK][3], b[QK_NK][3];
	float stk[QK_STACK] __attribute__((aligned(64))); /* partial sums */
	const float *kp[QK_NK];
#pragma GCC unroll 4
	for (int kk = 0; kk < QK_NK; kk++) {
		kp[kk] = kf + (size_t)(kk < nk ? kk : nk - 1) * hd;
#pragma GCC unroll 3
		for (int v = 0; v < 3; v++)
			a[kk][v] = b[kk][v] = _mm512_setzero_ps();
	}
	int sp = 0;
	for (int i = 0; i < 8; i++) {
		int j = g_leaf[2 * i];
#pragma GCC unroll 4
		for (int kk = 0; kk < QK_NK; kk++)
#pragma GCC unroll 3
			for (int v = 0; v < NV; v++)
				a[kk][v] = b[kk][v] = _mm512_setzero_ps();
#pragma GCC unroll 16
		for (int k = j; k < hd; k += 16) {
			const float *q = qt + (size_t)k * ldq + v0;
			__m512 qa[3], qb[3];
#pragma GCC unroll 3
			for (int v = 0; v < NV; v++) {
				qa[v] = _mm512_loadu_ps(q + 16 * v);
				qb[v] = _mm512_loadu_ps(q + 8 * (size_t)ldq + 16 * v);
			}
#pragma GCC unroll 4
			for (int kk = 0; kk < QK_NK; kk++) {
				__m512 ka = _mm512_set1_ps(kp[kk][k]), kb = _mm512_set1_ps(kp[kk][k + 8]);
#pragma GCC unroll 3
				for (int v = 0; v < NV; v++) {
					a[kk][v] = _mm512_fmadd_ps(ka, qa[v], a[kk][v]);
					b[kk][v] = _mm512_fmadd_ps(kb, qb[v], b[kk][v]);
				}
			}
		}
		/* j + j+8, then the pairs close ctz(i + 1) more levels */
#pragma GCC unroll 4
		for (int kk = 0; kk < QK_NK; kk++)
#pragma GCC unroll 3
			for (int v = 0; v < NV; v++)
				a[kk][v] = _mm512_add_ps(a[kk][v], b[kk][v]);
		for (int c = i + 1; !(c & 1); c >>= 1) {
			sp--;
#pragma GCC unroll 4
			for (int kk = 0; kk < QK_NK; kk++)
#pragma GCC unroll 3
				for (int v = 0; v < NV; v++)
					a[kk][v] = _mm512_add_ps(_mm512_load_ps(stk + ((size_t)(sp * QK_NK + kk) * 3 + v) * 16),
								 a[kk][v]);
		}
		if (i < 7) {
#pragma GCC unroll 4
			for (int kk = 0; kk < QK_NK; kk++)
#pragma GCC unroll 3
				for (int v = 0; v < NV; v++)
					_mm512_store_ps(stk + ((size_t)(sp * QK_NK + kk) * 3 + v) * 16, a[kk][v]);
			sp++;
		}
	}
#pragma GCC unroll 3
	for (int v = 0; v < NV; v++) {
		int left = R - (v0 + 16 * v);
		__mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
#pragma GCC unroll 4
		for (int kk = 0; kk < QK_NK; kk++)
			if (kk < nk)
				_mm512_mask_storeu_ps(st + (size_t)kk * ldst + v0 + 16 * v, m, a[kk][v]);
	}
}

#define QKL(nv, HD) \
	TGT5 static void qk_lanes_##nv##_##HD(const float *kf, int nk, int hd, const float *qt, int ldq, int v0, \
					      float *st, int ldst, int R) \
	{ qk_lanes_tile(nv, HD, kf, nk, hd, qt, ldq, v0, st, ldst, R); }
QKL(1, 0) QKL(2, 0) QKL(3, 0) QKL(1, 128) QKL(2, 128) QKL(3, 128)
typedef void (*qk_fn)(const float *, int, int, const float *, int, int, float *, int, int);
static const qk_fn g_qk[2][3] = {{qk_lanes_1_0, qk_lanes_2_0, qk_lanes_3_0},
				 {qk_lanes_1_128, qk_lanes_2_128, qk_lanes_3_128}};

/* st[j * R + r] = gemm-dot(k_j, q_r) for keys j < n (kf + j * hd) and
 * rows [r0, R) (rows of the first vector below r0 get scores too: nothing
 * reads them). */
TGT5 static void qk_lanes(const float *kf, int n, int hd, const float *qt, int ldq, float *st, int R, int r0)
{
	for (int k0 = 0; k0 < n; k0 += QK_NK) {
		int nk = n - k0 < QK_NK ? n - k0 : QK_NK;
		for (int v0 = r0 & ~15; v0 < R; v0 += 48) {
			int nv = (R - v0 + 15) / 16;
			g_qk[hd == 128][(nv < 3 ? nv : 3) - 1](
				kf + (size_t)k0 * hd, nk, hd, qt, ldq, v0, st + (size_t)k0 * R, R, R);
		}
	}
}

/* Lane n of the result is the canonical tree (gemm.h) of accumulator
 * a[n]: j + j+8, + j+4, + j+2, 0 + 1, each an IEEE add of the same pair
 * as the gemm's one-output reduction (addition is commutative bit for
 * bit), done for 16 outputs at once by transposing 128-bit chunks and
 * lanes: 15 adds and 30 shuffles for 16 outputs, where one output alone
 * takes 4 adds and 4 shuffles that serve nobody else. */
TGT5 static inline __m512 tree16(const __m512 *a)
{
	__m512 u[4];
	for (int c = 0; c < 4; c++) {
		__m512 p[2];
		/* j + j+8: p[h] = [a_{8h+c} (8 lanes) | a_{8h+4+c} (8 lanes)] */
		for (int h = 0; h < 2; h++) {
			__m512 x = a[8 * h + c], y = a[8 * h + 4 + c];
			p[h] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
		}
		/* j + j+4: chunk r of u[c] = the 4-lane partial sums of a[4r + c] */
		u[c] = _mm512_add_ps(_mm512_shuffle_f32x4(p[0], p[1], 0x88), _mm512_shuffle_f32x4(p[0], p[1], 0xDD));
	}
	/* j + j+2, then 0 + 1: chunk r = (u0[r], u1[r], u2[r], u3[r]) */
	__m512 v0 = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x44), _mm512_shuffle_ps(u[0], u[1], 0xEE));
	__m512 v1 = _mm512_add_ps(_mm512_shuffle_ps(u[2], u[3], 0x44), _mm512_shuffle_ps(u[2], u[3], 0xEE));
	return _mm512_add_ps(_mm512_shuffle_ps(v0, v1, 0x88), _mm512_shuffle_ps(v0, v1, 0xDD));
}

/* Decode scores (narrow tiles of R = 1, 2, 4 or 8 rows, hd a multiple of
 * 16): st[j * R + r] = gemm-dot(k_j, q_r) for keys j < nk of krow, 16 / R
 * keys per register tile, so the 16 outputs of a tile are one vector of
 * st and are reduced together by tree16 (the gemm's decode tiles reduced
 * each output alone, about as many shuffles and adds as the 8 fmas of a
 * head_dim-128 dot). Each key's lane j takes k = j, j + 16, ... with one
 * fma from 0: the canonical order.
 * Decode attention streams K and V from memory (67 MB per token at 8K on
 * bench-dense), and the hardware prefetcher alone kept one thread at ~8
 * GB/s of the ~16 a plain read reaches: the V rows of the same keys (vrow,
 * vbytes each) are prefetched here, so the PV pass that follows finds them
 * in cache, and the K rows QKN_PF_K bytes ahead (the key rows of a head
 * are contiguous within a page; a prefetch past it never faults). One
 * thread, bench-dense Q4_K_M at 8K, decode attention of 64 tokens: 0.65 s
 * with neither, 0.53-0.62 with V alone, 0.46 with K alone, 0.30-0.34 with
 * both (K 1, 3, 4 or 8 KiB ahead: 0.32-0.38). */
#define QKN_PF_K 2048
TGT5 static inline __attribute__((always_inline)) void qk_narrow_tile(const int R, const int kt, const char *const *krow,
								      int nk, int hd, const float *q, float *st,
								      const char *const *vrow, int vbytes)
{
	const int NK = 16 / R;
	const size_t es = kt == KT_BF16 ? 2 : 4;
	const __m512i idx = bf16_idx();
	__m512 a[16];
	const char *kp[16];
	for (int kk = 0; kk < NK; kk++) {
		kp[kk] = krow[kk < nk ? kk : nk - 1];
		if (kk < nk)
			for (int o = 0; o < vbytes; o += 64) {
				_mm_prefetch(vrow[kk] + o, _MM_HINT_T0);
				/* an address, not a pointer into the page: it may lie past it */
				_mm_prefetch((const char *)((uintptr_t)kp[kk] + QKN_PF_K + (uintptr_t)o), _MM_HINT_T0);
			}
	}
#pragma GCC unroll 16
	for (int n = 0; n < 16; n++)
		a[n] = _mm512_setzero_ps();
	if (kt == KT_Q8) {
		/* a block (32 elements) per step: its scale converted once, the
		 * two halves fed in k order, so every accumulator still takes
		 * k = j, j + 16, j + 32, ... one fma each */
		for (int k = 0; k < hd; k += 32) {
			__m512 qv[2][8];
#pragma GCC unroll 8
			for (int r = 0; r < R; r++) {
				qv[0][r] = _mm512_loadu_ps(q + (size_t)r * hd + k);
				qv[1][r] = _mm512_loadu_ps(q + (size_t)r * hd + k + 16);
			}
#pragma GCC unroll 16
			for (int kk = 0; kk < NK; kk++) {
				const char *b = q8_block(kp[kk], k);
				__m512 d = q8_scale16(b);
#pragma GCC unroll 2
				for (int h = 0; h < 2; h++) {
					__m512 kv = q8x16(b, 16 * h, d);
#pragma GCC unroll 8
					for (int r = 0; r < R; r++)
						a[kk * R + r] = _mm512_fmadd_ps(kv, qv[h][r], a[kk * R + r]);
				}
			}
		}
	} else {
		for (int k = 0; k < hd; k += 16) {
			__m512 qv[8];
#pragma GCC unroll 8
			for (int r = 0; r < R; r++)
				qv[r] = _mm512_loadu_ps(q + (size_t)r * hd + k);
#pragma GCC unroll 16
			for (int kk = 0; kk < NK; kk++) {
				__m512 kv = kt == KT_BF16
						    ? bf16x16(kp[kk] + (size_t)k * es, idx)
						    : _mm512_loadu_ps((const float *)(const void *)(kp[kk] + (size_t)k * es));
#pragma GCC unroll 8
				for (int r = 0; r < R; r++)
					a[kk * R + r] = _mm512_fmadd_ps(kv, qv[r], a[kk * R + r]);
			}
		}
	}
	int n = nk * R;
	_mm512_mask_storeu_ps(st, n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u), tree16(a));
}

#define QKN(R, kt) \
	TGT5 static void qk_narrow_##R##_##kt(const char *const *krow, int nk, int hd, const float *q, float *st, \
					      const char *const *vrow, int vbytes) \
	{ qk_narrow_tile(R, kt, krow, nk, hd, q, st, vrow, vbytes); }
QKN(1, 0) QKN(2, 0) QKN(4, 0) QKN(8, 0) QKN(1, 1) QKN(2, 1) QKN(4, 1) QKN(8, 1)
QKN(1, 2) QKN(2, 2) QKN(4, 2) QKN(8, 2)
typedef void (*qkn_fn)(const char *const *, int, int, const float *, float *, const char *const *, int);
static const qkn_fn g_qkn[3][4] = {{qk_narrow_1_0, qk_narrow_2_0, qk_narrow_4_0, qk_narrow_8_0},
				   {qk_narrow_1_1, qk_narrow_2_1, qk_narrow_4_1, qk_narrow_8_1},
				   {qk_narrow_1_2, qk_narrow_2_2, qk_narrow_4_2, qk_narrow_8_2}};

/* The scores of keys [0, n) of a block for a narrow tile of R rows (R
 * divides 16), [key][row] as attn_tile keeps them. */
TGT5 static void qk_narrow(const char *const *krow, int n, int hd, int kt, const float *q, float *st, int R,
			   const char *const *vrow, int vbytes)
{
	int NK = 16 / R, ri = R == 1 ? 0 : R == 2 ? 1 : R == 4 ? 2 : 3;
	for (int k0 = 0; k0 < n; k0 += NK)
		g_qkn[kt][ri](krow + k0, n - k0 < NK ? n - k0 : NK, hd, q, st + (size_t)k0 * R, vrow + k0, vbytes);
}

/* acc[i][d] = fma(P[j][i], V_j[d], acc[i][d]) for j ascending, i < G:
 * the same operations, element by element, as pv_scalar below. */
static void pv_avx2(float *acc, const float *P, int ldp, const char *const *vrow, int nb, int G, int hd, int kt,
		    int isa)
{
	int d0 = 0;
	if (isa >= KE_ISA_AVX512 && G >= 4)
		for (; d0 + 64 <= hd; d0 += 64)
			for (int g0 = 0; g0 < G; g0 += 5) {
				int gs = G - g0 < 5 ? G - g0 : 5;
				g_pv5w[kt][gs - 1](acc + (size_t)g0 * hd, P + g0, ldp, vrow, nb, hd, d0);
			}
	if (isa >= KE_ISA_AVX512)
		for (; d0 + 32 <= hd; d0 += 32)
			for (int g0 = 0; g0 < G; g0 += 6) {
				int gs = G - g0 < 6 ? G - g0 : 6;
				g_pv5[kt][gs - 1](acc + (size_t)g0 * hd, P + g0, ldp, vrow, nb, hd, d0);
			}
	for (; d0 + 16 <= hd; d0 += 16)
		for (int g0 = 0; g0 < G; g0 += 4) {
			int gs = G - g0 < 4 ? G - g0 : 4;
			g_pv[kt][gs - 1](acc + (size_t)g0 * hd, P + g0, ldp, vrow, nb, hd, d0);
		}
	for (int d = d0; d < hd; d++)
		for (int j = 0; j < nb; j++)
			for (int i = 0; i < G; i++) {
				float v;
				if (kt == KT_BF16) {
					uint16_t h;
					memcpy(&h, vrow[j] + (size_t)d * 2, 2);
					uint32_t u = (uint32_t)h << 16;
					memcpy(&v, &u, 4);
				} else if (kt == KT_Q8) {
					const char *b = q8_block(vrow[j], d);
					v = (float)(int8_t)b[2 + d % KE_KVQ8_BLOCK] * ke_kvq8_scale(b);
				} else {
					memcpy(&v, vrow[j] + (size_t)d * 4, 4);
				}
				float *y = acc + (size_t)i * hd + d;
				*y = fmaf(P[(size_t)j * ldp + i], v, *y);
			}
}

/* The softmax steps of one block, rows 8 at a time (element-wise, so the
 * bits of the scalar versions below). st is [nbm][R]; key j is used by
 * rows [rj, R), rj = G * max(0, base + j). */
static inline int key_row0(int base, int j, int G)
{
	return base + j > 0 ? (base + j) * G : 0;
}

/* Lanes r..r+7 that are rows >= rj. */
TGT2 static inline __m256 rows_from(int r, int rj)
{
	__m256i idx = _mm256_add_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	return _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(rj - 1)));
}

TGT2 static inline __m128 rows_from4(int r, int rj)
{
	__m128i idx = _mm_add_epi32(_mm_set1_epi32(r), _mm_setr_epi32(0, 1, 2, 3));
	return _mm_castsi128_ps(_mm_cmpgt_epi32(idx, _mm_set1_epi32(rj - 1)));
}

/* st *= scale (all of it); bm[r] = max over the keys row r uses, in key
 * order, 8 (then 4) rows per register. */
TGT2 static void sm_max_avx2(float *st, int R, int nbm, int base, int G, float scale, float *bm)
{
	__m256 sc = _mm256_set1_ps(scale);
	int n = R * nbm, i = 0, r = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(st + i, _mm256_mul_ps(_mm256_loadu_ps(st + i), sc));
	for (; i < n; i++)
		st[i] = st[i] * scale;
	for (; r + 8 <= R; r += 8) {
		__m256 b = _mm256_loadu_ps(bm + r);
		for (int j = 0; j < nbm; j++) {
			int rj = key_row0(base, j, G);
			if (rj >= r + 8)
				break;
			__m256 v = _mm256_loadu_ps(st + (size_t)j * R + r), gt = _mm256_cmp_ps(v, b, _CMP_GT_OQ);
			if (rj > r)
				gt = _mm256_and_ps(gt, rows_from(r, rj));
			b = _mm256_blendv_ps(b, v, gt);
		}
		_mm256_storeu_ps(bm + r, b);
	}
	for (; r + 4 <= R; r += 4) {
		__m128 b = _mm_loadu_ps(bm + r);
		for (int j = 0; j < nbm; j++) {
			int rj = key_row0(base, j, G);
			if (rj >= r + 4)
				break;
			__m128 v = _mm_loadu_ps(st + (size_t)j * R + r), gt = _mm_cmpgt_ps(v, b);
			if (rj > r)
				gt = _mm_and_ps(gt, rows_from4(r, rj));
			b = _mm_blendv_ps(b, v, gt);
		}
		_mm_storeu_ps(bm + r, b);
	}
	for (int j = 0; j < nbm; j++)
		for (int q = r > key_row0(base, j, G) ? r : key_row0(base, j, G); q < R; q++)
			bm[q] = st[(size_t)j * R + q] > bm[q] ? st[(size_t)j * R + q] : bm[q];
}

/* st[j][r] -= m[r] (all of it) */
TGT2 static void sm_sub_avx2(float *st, int R, int nbm, const float *m)
{
	int r = 0;
	for (; r + 8 <= R; r += 8) {
		__m256 mv = _mm256_loadu_ps(m + r);
		for (int j = 0; j < nbm; j++)
			_mm256_storeu_ps(st + (size_t)j * R + r, _mm256_sub_ps(_mm256_loadu_ps(st + (size_t)j * R + r), mv));
	}
	for (; r + 4 <= R; r += 4) {
		__m128 mv = _mm_loadu_ps(m + r);
		for (int j = 0; j < nbm; j++)
			_mm_storeu_ps(st + (size_t)j * R + r, _mm_sub_ps(_mm_loadu_ps(st + (size_t)j * R + r), mv));
	}
	for (; r < R; r++)
		for (int j = 0; j < nbm; j++)
			st[(size_t)j * R + r] = st[(size_t)j * R + r] - m[r];
}

/* sum[r] = sum[r] + p[j][r], keys in order, over the keys row r uses */
TGT2 static void sm_sum_avx2(const float *st, int R, int nbm, int base, int G, float *sum)
{
	int r = 0;
	for (; r + 8 <= R; r += 8) {
		__m256 a = _mm256_loadu_ps(sum + r);
		for (int j = 0; j < nbm; j++) {
			int rj = key_row0(base, j, G);
			if (rj >= r + 8)
				break;
			__m256 t = _mm256_add_ps(a, _mm256_loadu_ps(st + (size_t)j * R + r));
			a = rj > r ? _mm256_blendv_ps(a, t, rows_from(r, rj)) : t;
		}
		_mm256_storeu_ps(sum + r, a);
	}
	for (; r + 4 <= R; r += 4) {
		__m128 a = _mm_loadu_ps(sum + r);
		for (int j = 0; j < nbm; j++) {
			int rj = key_row0(base, j, G);
			if (rj >= r + 4)
				break;
			__m128 t = _mm_add_ps(a, _mm_loadu_ps(st + (size_t)j * R + r));
			a = rj > r ? _mm_blendv_ps(a, t, rows_from4(r, rj)) : t;
		}
		_mm_storeu_ps(sum + r, a);
	}
	for (int j = 0; j < nbm; j++)
		for (int q = r > key_row0(base, j, G) ? r : key_row0(base, j, G); q < R; q++)
			sum[q] = sum[q] + st[(size_t)j * R + q];
}

/* The softmax steps 16 rows per register (AVX-512; the same element-wise
 * operations as the 8-row versions and the scalar code: a masked lane is
 * a row the key does not reach, or past R). */
TGT5 static inline __mmask16 rows_mask5(int r, int rj, int R)
{
	int lo = rj > r ? rj - r : 0, hi = R - r < 16 ? R - r : 16;
	return lo >= hi ? 0 : (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

TGT5 static void sm_max_avx512(float *st, int R, int nbm, int base, int G, float scale, float *bm)
{
	__m512 sc = _mm512_set1_ps(scale);
	int n = R * nbm, i = 0;
	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(st + i, _mm512_mul_ps(_mm512_loadu_ps(st + i), sc));
	if (i < n) {
		__mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
		_mm512_mask_storeu_ps(st + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, st + i), sc));
	}
	for (int r = 0; r < R; r += 16) {
		__mmask16 all = rows_mask5(r, 0, R);
		__m512 b = _mm512_maskz_loadu_ps(all, bm + r);
		for (int j = 0; j < nbm; j++) {
			int rj = key_row0(base, j, G);
			if (rj >= r + 16)
				break;
			__mmask16 m = rj > r ? rows_mask5(r, rj, R) : all;
			__m512 v = _mm512_maskz_loadu_ps(all, st + (size_t)j * R + r);
			b = _mm512_mask_blend_ps(_mm512_mask_cmp_ps_mask(m, v, b, _CMP_GT_OQ), b, v);
		}
		_mm512_mask_storeu_ps(bm + r, all, b);
	}
}

TGT5 static void sm_sub_avx512(float *st, int R, int nbm, const float *m)
{
	if (R < 16 && 16 % R == 0) {
		/* narrow tiles: st taken flat, lane i is row i % R (per-row
		 * vectors of R lanes, masked, read back what the previous key's
		 * masked store wrote and stalled on it: 9% of a decode step) */
		__m512i ix = _mm512_and_si512(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
					      _mm512_set1_epi32(R - 1));
		__m512 mv = _mm512_permutexvar_ps(ix, _mm512_maskz_loadu_ps((__mmask16)((1u << R) - 1u), m));
		int n = R * nbm, i = 0;
		for (; i + 16 <= n; i += 16)
			_mm512_storeu_ps(st + i, _mm512_sub_ps(_mm512_loadu_ps(st + i), mv));
		if (i < n) {
			__mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
			_mm512_mask_storeu_ps(st + i, k, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, st + i), mv));
		}
		return;
	}
	for (int r = 0; r < R; r += 16) {
		__mmask16 all = rows_mask5(r, 0, R);
		__m512 mv = _mm512_maskz_loadu_ps(all, m + r);
		for (int j = 0; j < nbm; j++)
			_mm512_mask_storeu_ps(st + (size_t)j * R + r, all,
					      _mm512_sub_ps(_mm512_maskz_loadu_ps(all, st + (size_t)j * R + r), mv));
	}
}

TGT5 static void sm_sum_avx512(const float *st, int R, int nbm, int base, int G, float *sum)
{
	for (int r = 0; r < R; r += 16) {
		__mmask16 all = rows_mask5(r, 0, R);
		__m512 a = _mm512_maskz_loadu_ps(all, sum + r);
		for (int j = 0; j < nbm; j++) {
			int rj = key_row0(base, j, G);
			if (rj >= r + 16)
				break;
			__mmask16 m = rj > r ? rows_mask5(r, rj, R) : all;
			a = _mm512_mask_add_ps(a, m, a, _mm512_maskz_loadu_ps(all, st + (size_t)j * R + r));
		}
		_mm512_mask_storeu_ps(sum + r, all, a);
	}
}

/* x *= c, n a multiple of 16 (each element x * c, as ke_vec_scale) */
TGT5 static void scale_avx512(float *x, float c, int n)
{
	__m512 cv = _mm512_set1_ps(c);
	for (int i = 0; i < n; i += 16)
		_mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), cv));
}
#endif

static void widen(float *y, const char *x, int n, int isa)
{
#if defined(__x86_64__)
	if (isa >= KE_ISA_AVX512 && n % 16 == 0) {
		widen_avx512(y, x, n);
		return;
	}
	if (isa >= KE_ISA_AVX2) {
		widen_avx2(y, x, n);
		return;
	}
#endif
	(void)isa;
	ke_vec_bf16_to_f32(y, x, (size_t)n);
}

/* A KV row of kind kt (n elements) as f32 in y: the same exact values
 * on every path. */
static void row_f32(float *y, const char *row, int n, int kt, int isa)
{
	if (kt == KT_BF16) {
		widen(y, row, n, isa);
		return;
	}
	if (kt == KT_F32) {
		memcpy(y, row, (size_t)n * sizeof *y);
		return;
	}
#if defined(__x86_64__)
	if (isa >= KE_ISA_AVX512) {
		dequant_avx512(y, row, n);
		return;
	}
	if (isa >= KE_ISA_AVX2) {
		dequant_avx2(y, row, n);
		return;
	}
#endif
	ke_kvq8_dequant_row(y, row, n);
}

static void sm_max(float *st, int R, int nbm, int base, int G, float scale, float *bm, int isa)
{
#if defined(__x86_64__)
	if (isa >= KE_ISA_AVX2) {
		/* narrow tiles: 8 / 4 rows per register, unmasked (the same
		 * element-wise operations) */
		if (isa >= KE_ISA_AVX512 && R > 8)
			sm_max_avx512(st, R, nbm, base, G, scale, bm);
		else
			sm_max_avx2(st, R, nbm, base, G, scale, bm);
		return;
	}
#endif
	(void)isa;
	for (int i = 0; i < R * nbm; i++)
		st[i] = st[i] * scale;
	for (int j = 0; j < nbm; j++)
		for (int r = key_row0(base, j, G); r < R; r++)
			bm[r] = st[(size_t)j * R + r] > bm[r] ? st[(size_t)j * R + r] : bm[r];
}

static void sm_sub(float *st, int R, int nbm, const float *m, int isa)
{
#if defined(__x86_64__)
	if (isa >= KE_ISA_AVX2) {
		if (isa >= KE_ISA_AVX512)
			sm_sub_avx512(st, R, nbm, m);
		else
			sm_sub_avx2(st, R, nbm, m);
		return;
	}
#endif
	(void)isa;
	for (int j = 0; j < nbm; j++)
		for (int r = 0; r < R; r++)
			st[(size_t)j * R + r] = st[(size_t)j * R + r] - m[r];
}

static void sm_sum(const float *st, int R, int nbm, int base, int G, float *sum, int isa)
{
#if defined(__x86_64__)
	if (isa >= KE_ISA_AVX2) {
		if (isa >= KE_ISA_AVX512 && R > 8)
			sm_sum_avx512(st, R, nbm, base, G, sum);
		else
			sm_sum_avx2(st, R, nbm, base, G, sum);
		return;
	}
#endif
	(void)isa;
	for (int j = 0; j < nbm; j++)
		for (int r = key_row0(base, j, G); r < R; r++)
			sum[r] = sum[r] + st[(size_t)j * R + r];
}

static void scale_row(float *x, float c, int n, int isa)
{
#if defined(__x86_64__)
	if (isa >= KE_ISA_AVX512 && n % 16 == 0) {
		scale_avx512(x, c, n);
		return;
	}
#endif
	(void)isa;
	ke_vec_scale(x, c, (size_t)n);
}

static void scores_lanes(const float *kf, int n, int hd, const float *qt, int ldq, float *st, int R, int r0)
{
#if defined(__x86_64__)
	qk_lanes(kf, n, hd, qt, ldq, st, R, r0);
#else
	(void)kf, (void)n, (void)hd, (void)qt, (void)ldq, (void)st, (void)R, (void)r0;
#endif
}

static void scores_narrow(const char *const *krow, int n, int hd, int kt, const float *q, float *st, int R,
			  const char *const *vrow, int vbytes)
{
#if defined(__x86_64__)
	qk_narrow(krow, n, hd, kt, q, st, R, vrow, vbytes);
#else
	(void)krow, (void)n, (void)hd, (void)kt, (void)q, (void)st, (void)R, (void)vrow, (void)vbytes;
#endif
}

/* The scalar PV: f32 or bf16 rows (q8 rows reach it as f32, dequantized
 * by the caller). */
static void pv_scalar(float *acc, const float *P, int ldp, const char *const *vrow, int nb, int G, int hd, int kt)
{
	for (int j = 0; j < nb; j++)
		for (int i = 0; i < G; i++) {
			float pj = P[(size_t)j * ldp + i];
			if (kt == KT_BF16)
				ke_vec_axpy_bf16_isa(KE_ISA_SCALAR, acc + (size_t)i * hd, pj, vrow[j], hd);
			else
				ke_vec_axpy_isa(KE_ISA_SCALAR, acc + (size_t)i * hd, pj, (const float *)(const void *)vrow[j], hd);
		}
}

static void pv_rows(float *acc, const float *P, int ldp, const char *const *vrow, int nb, int rows, int hd, int kt,
		    int isa)
{
#if defined(__x86_64__)
	if (isa >= KE_ISA_AVX2) {
		pv_avx2(acc, P, ldp, vrow, nb, rows, hd, kt, isa);
		return;
	}
#endif
	(void)isa;
	pv_scalar(acc, P, ldp, vrow, nb, rows, hd, kt);
}

static inline const char *kv_row(const struct ke_layout *lay, struct kv_page *const *pages, int seg, int pos)
{
	int B = lay->page_tokens;
	const struct kv_page *pg = pages[pos / B];
	return (const char *)pg->data + ((size_t)seg * (size_t)B + (size_t)(pos % B)) * lay->row_bytes;
}

/* The merge of attn.h: (M, L, ACC) <- chunk state (m, l, acc), or a copy
 * of it for the first chunk. Plain code, explicit fmaf: the same bits on
 * every path and in every caller. */
static void merge_state(float *M, float *L, float *ACC, float m, float l, const float *acc, int hd, int first,
			int isa)
{
	if (first) {
		*M = m;
		*L = l;
		memcpy(ACC, acc, (size_t)hd * sizeof *ACC);
		return;
	}
	float mn = *M > m ? *M : m;
	float a = ke_exp(*M - mn), b = ke_exp(m - mn);
	*L = fmaf(l, b, *L * a);
	*M = mn;
	if (a != 1.0f) /* x * 1 == x exactly: skipping it changes no bit */
		ke_vec_scale(ACC, a, hd);
	ke_vec_axpy_isa(isa, ACC, b, acc, hd);
}

/* The sink logit sk as one more key with no value (attn.h). */
static void sink_merge(float *M, float *L, float *ACC, float sk, int hd)
{
	float mn = *M > sk ? *M : sk;
	float a = ke_exp(*M - mn), b = ke_exp(sk - mn);
	*L = fmaf(1.0f, b, *L * a);
	*M = mn;
	if (a != 1.0f) /* x * 1 == x exactly: skipping it changes no bit */
		ke_vec_scale(ACC, a, (size_t)hd);
}

/* First key of the window of the query at pos (0 without a window). */
static inline int win_lo(int W, int pos)
{
	return W > 0 && pos - W + 1 > 0 ? pos - W + 1 : 0;
}

/* Keys of block b0 below the window of each row get `v` (-inf before the
 * block maximum, 0 after the exp): rows of tokens [ta, nt), G per token. */
static void win_mask(const struct ke_attn_args *a, float *st, int R, int G, int nbm, int b0, int t0, int ta, int nt,
		     float v)
{
	for (int t = nt - 1; t >= ta; t--) {
		int cut = win_lo(a->window, a->pos0 + t0 + t) - b0;
		if (cut <= 0)
			break; /* earlier tokens' windows start earlier */
		int n = cut < nbm ? cut : nbm;
		for (int j = 0; j < n; j++)
			for (int i = 0; i < G; i++)
				st[(size_t)j * R + (size_t)t * G + i] = v;
	}
}

/* l = l * c + sum, the multiply rounded on its own (plain code: no fma
 * contraction on the baseline target). */
static void l_update(float *l, const float *c, const float *sum, int n)
{
	for (int r = 0; r < n; r++)
		l[r] = l[r] * c[r] + sum[r];
}

/*
 * One tile over keys [kb, ke) (kb a multiple of KE_ATTN_SPLIT, ke <= last
 * key + 1): with merge set, kb = 0 and the tile merges its chunks as it
 * crosses their starts and writes the output; without, [kb, ke) is one
 * chunk and its state is left in the scratch (acc, m, l).
 */
static void attn_tile(const struct ke_attn_args *a, int t0, int t1, int g, int kb, int ke, int merge,
		      const struct tile_scr *s, int isa)
{
	const struct ke_layout *lay = a->lay;
	int hd = lay->head_dim, Hkv = lay->n_kv_heads, G = a->n_heads / Hkv, B = lay->page_tokens;
	int nt = t1 - t0, R = nt * G;
	/* wide: vector paths with enough rows to repay widening the block */
	int wide = isa >= KE_ISA_AVX2 && R >= WIDE_ROWS;
	int wb = wb_keys(hd), qr = qk_rows(hd);
	int kseg = (a->layer * 2 + 0) * Hkv + g, vseg = (a->layer * 2 + 1) * Hkv + g;
	int kt = kv_kind(lay->kv_dtype);
	float *acc = s->acc, *m = s->m, *l = s->l;

	for (int t = 0; t < nt; t++)
		memcpy(s->qt + (size_t)t * G * hd, a->q + ((size_t)(t0 + t) * a->n_heads + (size_t)g * G) * hd,
		       (size_t)G * hd * sizeof *s->qt);
	memset(acc, 0, (size_t)R * hd * sizeof *acc);
	for (int i = 0; i < R; i++) {
		m[i] = -FLT_MAX;
		l[i] = 0.0f;
	}
	/* lanes: the scores with the rows in the lanes (qk_lanes), where at
	 * most 1/8 of the lanes would be padding (a 24-row tile at head_dim 256
	 * wastes 1/4 and measured 0.92x the gemm tiles) */
	int ldq = (R + 15) & ~15;
	int lanes = wide && isa >= KE_ISA_AVX512 && hd % 16 == 0 && (ldq - R) * 8 <= R;
	/* narrow tiles of 1, 2, 4 or 8 rows: the decode score kernel
	 * (qk_narrow), which writes [key][row] itself */
	int nar = !wide && isa >= KE_ISA_AVX512 && hd % 16 == 0 && R <= 16 && 16 % R == 0;
	if (lanes)
		for (int k = 0; k < hd; k++) {
			for (int r = 0; r < R; r++)
				s->qT[(size_t)k * ldq + r] = s->qt[(size_t)r * hd + k];
			for (int r = R; r < ldq; r++)
				s->qT[(size_t)k * ldq + r] = 0.0f;
		}
	struct ke_mat qm = {s->qt, KV_DT_F32, R, hd, (size_t)hd};
	const char *vrow[KE_ATTN_BLOCK], *krow[KE_ATTN_BLOCK];
	/* a window: start at the block of the first row's first key (the
	 * pages before it may be gone) */
	int W = a->window, bs = kb;
	if (W) {
		int l0 = win_lo(W, a->pos0 + t0) / KE_ATTN_BLOCK * KE_ATTN_BLOCK;
		bs = l0 > bs ? l0 : bs;
	}
	for (int b0 = bs; b0 < ke; b0 += KE_ATTN_BLOCK) {
		int nbm = ke - b0 < KE_ATTN_BLOCK ? ke - b0 : KE_ATTN_BLOCK;
		/* first token of the tile whose query reaches this block */
		int ta = b0 - a->pos0 - t0;
		if (ta < 0)
			ta = 0;
		int r0 = ta * G, nr = R - r0;
		if (merge && b0 > bs && b0 % KE_ATTN_SPLIT == 0) {
			/* a new chunk for the rows that reach it; a row whose window
			 * starts in this chunk or later has nothing to merge yet */
			int cb = b0 / KE_ATTN_SPLIT;
			for (int i = r0; i < R; i++) {
				int cl = win_lo(W, a->pos0 + t0 + i / G) / KE_ATTN_SPLIT;
				if (cl < cb)
					merge_state(s->M + i, s->L + i, s->ACC + (size_t)i * hd, m[i], l[i], acc + (size_t)i * hd,
						    hd, cl == cb - 1, isa);
				m[i] = -FLT_MAX;
				l[i] = 0.0f;
			}
			memset(acc + (size_t)r0 * hd, 0, (size_t)nr * hd * sizeof *acc);
		}
		/* Scores. Wide tiles make the keys the activation rows, which
		 * writes the scores [key][row] directly; with bf16 or q8 KV they
		 * widen the keys (and below the values) to f32 (exact) WB keys at
		 * a time, so the widened rows, the queries or accumulators and the
		 * scores stay in L1 together. Narrow tiles (decode) read the keys
		 * in place as weight rows and transpose their few rows (q8 keys
		 * off the AVX-512 kernel: dequantized WB at a time first).
		 * Otherwise one gemm per stretch of the block that lies in one
		 * page. */
		for (int j = 0; j < nbm;) { /* one page at a time: no division per key */
			int p = b0 + j, in_page = B - p % B;
			int n = nbm - j < in_page ? nbm - j : in_page;
			const char *kr = kv_row(lay, a->pages, kseg, p), *vr = kv_row(lay, a->pages, vseg, p);
			for (int q = 0; q < n; q++) {
				krow[j + q] = kr + (size_t)q * lay->row_bytes;
				vrow[j + q] = vr + (size_t)q * lay->row_bytes;
			}
			j += n;
		}
		if (lanes) {
			for (int w0 = 0; w0 < nbm; w0 += wb) {
				int n = nbm - w0 < wb ? nbm - w0 : wb;
				for (int j = 0; j < n; j++)
					row_f32(s->kf + (size_t)j * hd, krow[w0 + j], hd, kt, isa);
				scores_lanes(s->kf, n, hd, s->qT, ldq, s->st + (size_t)w0 * R, R, r0);
			}
		} else if (wide && kt != KT_F32) {
			for (int w0 = 0; w0 < nbm; w0 += wb) {
				int n = nbm - w0 < wb ? nbm - w0 : wb;
				for (int j = 0; j < n; j++)
					row_f32(s->kf + (size_t)j * hd, krow[w0 + j], hd, kt, isa);
				/* query rows in pieces of QK_ROWS: with the widened keys they
				 * stay in L1 */
				for (int q0 = r0; q0 < R; q0 += qr)
					ke_gemm_range(isa, &qm, s->kf, (size_t)hd, n, s->st + (size_t)w0 * R, (size_t)R, 0, q0,
						      q0 + qr < R ? q0 + qr : R);
			}
		} else if (nar) {
			scores_narrow(krow, nbm, hd, kt, s->qt, s->st, R, vrow, (int)lay->row_bytes);
		} else if (kt == KT_Q8) {
			/* narrow q8 tiles on AVX2 and the scalar path: the f32
			 * weight rows of the gemm are the dequantized keys */
			for (int w0 = 0; w0 < nbm; w0 += wb) {
				int n = nbm - w0 < wb ? nbm - w0 : wb;
				for (int j = 0; j < n; j++) {
					row_f32(s->kf + (size_t)j * hd, krow[w0 + j], hd, kt, isa);
					for (size_t o = 0; o < lay->row_bytes; o += 64)
						__builtin_prefetch(vrow[w0 + j] + o);
				}
				struct ke_mat km = {s->kf, KV_DT_F32, n, hd, (size_t)hd};
				ke_gemm_range(isa, &km, s->qt + (size_t)r0 * hd, (size_t)hd, nr,
					      s->srm + (size_t)r0 * KE_ATTN_BLOCK + w0, KE_ATTN_BLOCK, 0, 0, n);
			}
		} else {
			for (int j0 = 0; j0 < nbm;) {
				int p = b0 + j0;
				int in_page = B - p % B;
				int n = nbm - j0 < in_page ? nbm - j0 : in_page;
				if (wide) {
					ke_gemm_range(isa, &qm, (const float *)(const void *)krow[j0], (size_t)hd, n,
						      s->st + (size_t)j0 * R, (size_t)R, 0, r0, R);
				} else {
					struct ke_mat km = {krow[j0], lay->kv_dtype, n, hd, (size_t)hd};
					/* the PV pass below finds these V rows in cache (as
					 * qk_narrow does on AVX-512): AVX2, one thread,
					 * bench-dense Q4_K_M at 8K, decode attention 0.62-0.89 s
					 * -> 0.53-0.64 in two alternating rounds; K rows 2 KiB
					 * ahead as well showed no gain over the gemm's own
					 * prefetch */
					for (int q = 0; q < n; q++)
						for (size_t o = 0; o < lay->row_bytes; o += 64)
							__builtin_prefetch(vrow[j0 + q] + o);
					ke_gemm_range(isa, &km, s->qt + (size_t)r0 * hd, (size_t)hd, nr,
						      s->srm + (size_t)r0 * KE_ATTN_BLOCK + j0, KE_ATTN_BLOCK, 0, 0, n);
				}
				j0 += n;
			}
		}
		if (!wide && !nar)
			for (int j = 0; j < nbm; j++)
				for (int i = r0; i < R; i++)
					s->st[(size_t)j * R + i] = s->srm[(size_t)i * KE_ATTN_BLOCK + j];
		if (W)
			win_mask(a, s->st, R, G, nbm, b0, t0, ta, nt, -INFINITY);
		/* Softmax (attn.h), per row over the keys it uses. */
		int base = b0 - a->pos0 - t0;
		float *bm = s->tmp, *cf = s->cf;
		for (int i = r0; i < R; i++)
			bm[i] = -FLT_MAX;
		sm_max(s->st, R, nbm, base, G, a->scale, bm, isa);
		for (int i = r0; i < R; i++) {
			float mn = m[i] > bm[i] ? m[i] : bm[i];
			cf[i] = m[i] - mn;
			m[i] = mn;
		}
		ke_vec_exp_isa(isa, cf + r0, cf + r0, nr);
		sm_sub(s->st, R, nbm, m, isa);
		ke_vec_exp_isa(isa, s->st, s->st, R * nbm);
		if (W)
			win_mask(a, s->st, R, G, nbm, b0, t0, ta, nt, 0.0f);
		float *sm = bm; /* reused for the sums */
		for (int i = r0; i < R; i++)
			sm[i] = 0.0f;
		sm_sum(s->st, R, nbm, base, G, sm, isa);
		l_update(l + r0, cf + r0, sm + r0, nr);
		for (int i = r0; i < R; i++)
			if (cf[i] != 1.0f) /* x * 1 == x exactly: skipping it changes no bit */
				scale_row(acc + (size_t)i * hd, cf[i], hd, isa);
		/* PV, WB keys at a time (each row still takes its keys in
		 * order); runs of tokens with the same key count share a pass. */
		for (int w0 = 0; w0 < nbm; w0 += wb) {
			int wn = nbm - w0 < wb ? nbm - w0 : wb, vkt = kt;
			const char *vw[WB];
			/* wide tiles widen each value row once for all their rows;
			 * the scalar PV reads f32 or bf16 only */
			if ((wide && kt != KT_F32) || (kt == KT_Q8 && isa < KE_ISA_AVX2)) {
				for (int j = 0; j < wn; j++) {
					row_f32(s->kf + (size_t)j * hd, vrow[w0 + j], hd, kt, isa);
					vw[j] = (const char *)(s->kf + (size_t)j * hd);
				}
				vkt = KT_F32;
			} else {
				memcpy(vw, vrow + w0, (size_t)wn * sizeof *vw);
			}
			int tw = ta > b0 + w0 - a->pos0 - t0 ? ta : b0 + w0 - a->pos0 - t0;
			for (int t = tw; t < nt;) {
				int pos = a->pos0 + t0 + t;
				int nb = pos + 1 - b0 - w0 < wn ? pos + 1 - b0 - w0 : wn;
				int te = t + 1;
				while (te < nt && nb == wn)
					te++;
				pv_rows(acc + (size_t)t * G * hd, s->st + (size_t)w0 * R + (size_t)t * G, R, vw, nb, (te - t) * G,
					hd, vkt, isa);
				t = te;
			}
		}
	}
	if (!merge)
		return;
	for (int t = 0; t < nt; t++) {
		float *o = a->out + ((size_t)(t0 + t) * a->n_heads + (size_t)g * G) * hd;
		int pos = a->pos0 + t0 + t;
		for (int i = 0; i < G; i++) {
			int r = t * G + i;
			float *ac = acc + (size_t)r * hd;
			float L = l[r], M = m[r];
			if (pos / KE_ATTN_SPLIT > win_lo(W, pos) / KE_ATTN_SPLIT) {
				merge_state(s->M + r, s->L + r, s->ACC + (size_t)r * hd, m[r], l[r], ac, hd, 0, isa);
				ac = s->ACC + (size_t)r * hd;
				L = s->L[r];
				M = s->M[r];
			}
			if (a->sinks)
				sink_merge(&M, &L, ac, a->sinks[g * G + i], hd);
			float inv = 1.0f / L;
			for (int d = 0; d < hd; d++)
				o[(size_t)i * hd + d] = ac[d] * inv;
		}
	}
}

struct attn_job {
	const struct ke_attn_args *a;
	int isa;
	size_t scr_floats;
	int rmax, tq, n_tiles;
	/* decode split: units [u0, u0 + n) of (chunk, head) = (c0 + u / Hkv, u % Hkv) */
	int u0, slot_floats, slots_per_thread, c0;
};

static void attn_part(void *ctx, size_t b, size_t e, int thread)
{
	const struct attn_job *j = ctx;
	const struct ke_attn_args *a = j->a;
	int Hkv = a->lay->n_kv_heads;
	struct tile_scr s;
	scr_carve(&s, a->scratch + (size_t)thread * j->scr_floats, j->rmax, a->lay->head_dim);
	/* Causal work grows with the token index; tiles are handed out zigzag
	 * (last, first, second to last, ...) so the big ones go first and
	 * chunks stay balanced. Order never affects results. */
	for (size_t u = b; u < e; u++) {
		size_t k = u / (size_t)Hkv;
		int ti = (int)(k % 2 == 1 ? k / 2 : (size_t)j->n_tiles - 1 - k / 2);
		int t0 = ti * j->tq, t1 = t0 + j->tq < a->n_tok ? t0 + j->tq : a->n_tok;
		attn_tile(a, t0, t1, (int)(u % (size_t)Hkv), 0, a->pos0 + t1, 1, &s, j->isa);
	}
}

/* One chunk of one head into its slot: [acc R x hd][m R][l R]. */
static void split_part(void *ctx, size_t b, size_t e, int thread)
{
	const struct attn_job *j = ctx;
	const struct ke_attn_args *a = j->a;
	int Hkv = a->lay->n_kv_heads, hd = a->lay->head_dim, R = a->n_tok * (a->n_heads / Hkv);
	int last = a->pos0 + a->n_tok;
	struct tile_scr s;
	float *base = a->scratch;
	scr_carve(&s, base + (size_t)thread * j->scr_floats, j->rmax, hd);
	for (size_t v = b; v < e; v++) {
		int u = j->u0 + (int)v;
		int c = j->c0 + u / Hkv, g = u % Hkv;
		int kb = c * KE_ATTN_SPLIT, ke = kb + KE_ATTN_SPLIT < last ? kb + KE_ATTN_SPLIT : last;
		attn_tile(a, 0, a->n_tok, g, kb, ke, 0, &s, j->isa);
		/* slot v lives in the slot area of thread v / slots_per_thread */
		struct tile_scr o;
		scr_carve(&o, base + (v / (size_t)j->slots_per_thread) * j->scr_floats, j->rmax, hd);
		float *slot = o.slots + (v % (size_t)j->slots_per_thread) * (size_t)j->slot_floats;
		memcpy(slot, s.acc, (size_t)R * hd * sizeof *slot);
		memcpy(slot + (size_t)R * hd, s.m, (size_t)R * sizeof *slot);
		memcpy(slot + (size_t)R * hd + R, s.l, (size_t)R * sizeof *slot);
	}
}

/* Decode (one tile per head) over several chunks: waves of (chunk, head)
 * units in parallel, each wave merged in chunk order into totals kept in
 * the output rows (ACC), M and L. */
#define SPLIT_MAX_ROWS 1024
static void attn_split(struct attn_job *j, int threads)
{
	const struct ke_attn_args *a = j->a;
	int Hkv = a->lay->n_kv_heads, hd = a->lay->head_dim, G = a->n_heads / Hkv, R = a->n_tok * G;
	int last = a->pos0 + a->n_tok - 1, nch = last / KE_ATTN_SPLIT + 1;
	int c0 = win_lo(a->window, a->pos0) / KE_ATTN_SPLIT; /* the first row's first chunk */
	float M[SPLIT_MAX_ROWS], L[SPLIT_MAX_ROWS];
	j->slot_floats = R * (hd + 2);
	j->slots_per_thread = SLOT_TILES * j->rmax * (hd + 2) / j->slot_floats;
	j->c0 = c0;
	int nslot = j->slots_per_thread * threads, total = (nch - c0) * Hkv;
	for (int w0 = 0; w0 < total; w0 += nslot) {
		int n = total - w0 < nslot ? total - w0 : nslot;
		j->u0 = w0;
		kv_pool_for(kv_pool_global(), (size_t)n, 1, split_part, j);
		for (int v = 0; v < n; v++) {
			int u = w0 + v, c = c0 + u / Hkv, g = u % Hkv;
			struct tile_scr o;
			scr_carve(&o, a->scratch + (size_t)(v / j->slots_per_thread) * j->scr_floats, j->rmax, hd);
			const float *slot = o.slots + (size_t)(v % j->slots_per_thread) * j->slot_floats;
			for (int r = 0; r < R; r++) {
				int t = r / G, pos = a->pos0 + t, cl = win_lo(a->window, pos) / KE_ATTN_SPLIT;
				if (pos < c * KE_ATTN_SPLIT || c < cl)
					continue; /* this token's query does not reach chunk c */
				float *out = a->out + ((size_t)t * a->n_heads + (size_t)g * G + (size_t)(r % G)) * hd;
				merge_state(M + g * R + r, L + g * R + r, out, slot[(size_t)R * hd + r],
					    slot[(size_t)R * hd + R + r], slot + (size_t)r * hd, hd, c == cl, j->isa);
			}
		}
	}
	for (int g = 0; g < Hkv; g++)
		for (int r = 0; r < R; r++) {
			int t = r / G;
			float *out = a->out + ((size_t)t * a->n_heads + (size_t)g * G + (size_t)(r % G)) * hd;
			if (a->sinks)
				sink_merge(&M[g * R + r], &L[g * R + r], out, a->sinks[g * G + r % G], hd);
			float inv = 1.0f / L[g * R + r];
			for (int d = 0; d < hd; d++)
				out[d] = out[d] * inv;
		}
}

void ke_attn(const struct ke_attn_args *a)
{
	int G = a->n_heads / a->lay->n_kv_heads, Hkv = a->lay->n_kv_heads;
	struct attn_job j = {a, ke_isa(), ke_attn_scratch_floats(G, a->lay->head_dim),
			     0, 0, 0, 0, 0, 0, 0};
	j.tq = tile_tokens(G, a->lay->head_dim, j.isa);
	j.rmax = j.tq * G;
	j.n_tiles = (a->n_tok + j.tq - 1) / j.tq;
	size_t units = (size_t)j.n_tiles * (size_t)Hkv;
	int span = a->pos0 + a->n_tok; /* keys a row may read */
	if (a->window && a->window + a->n_tok < span)
		span = a->window + a->n_tok;
	double work = (double)a->n_tok * (double)span * a->n_heads * a->lay->head_dim;
	double t0 = ke_prof_t0();
	int threads = kv_pool_size(kv_pool_global());
	int last = a->pos0 + a->n_tok - 1;
	int serial = a->scratch_threads < threads || work < KE_PAR_MIN_WORK;
	int chunks = last / KE_ATTN_SPLIT - win_lo(a->window, a->pos0) / KE_ATTN_SPLIT + 1;
	if (!serial && j.n_tiles == 1 && chunks > 1 && Hkv * a->n_tok * G <= SPLIT_MAX_ROWS)
		attn_split(&j, threads);
	else if (serial || units == 1)
		attn_part(&j, 0, units, 0);
	else
		kv_pool_for(kv_pool_global(), units, 1, attn_part, &j);
	if (t0 != 0.0) {
		/* q.k and p.v: 4 flops per (query head, key, dim); each tile reads
		 * the K and V rows of its keys once per KV head */
		double n = a->n_tok, keys = n * (a->pos0 + 1) + n * (n - 1) / 2, kvb = 0;
		if (a->window && keys > n * a->window)
			keys = n * a->window; /* about: a window's rows read at most W keys */
		for (int t = 0; t < a->n_tok; t += j.tq) {
			int t1 = t + j.tq < a->n_tok ? t + j.tq : a->n_tok;
			kvb += (double)(a->pos0 + t1) * 2.0 * (double)a->lay->row_bytes * a->lay->n_kv_heads;
		}
		ke_prof_add(KE_PROF_ATTN, t0, 4.0 * keys * a->n_heads * a->lay->head_dim, kvb);
	}
}
