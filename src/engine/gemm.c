/*
 * gemm.c - see gemm.h for the numerics contract.
 *
 * Loop structure (all paths): the caller's column range is cut into
 * blocks of NB weight rows small enough to stay in L2; inside a block, for
 * each tile of MR activation rows, the NR-row weight tiles are swept. A
 * tile keeps MR x NR lane accumulators in registers for the whole K, so
 * every output sees the canonical order whatever MR and NR are; tile
 * sizes are chosen per path for speed only.
 *
 * The SIMD functions use explicit fused multiply-adds wherever the scalar
 * reference calls fmaf(), and nothing else that could be contracted.
 */
#include "engine/gemm.h"
#include "engine/isa.h"
#include "model/safetensors.h"
#include "base/mem.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Weight bytes per block: a block of rows is swept by every row tile of
 * the activations, so it should stay in L2 (1 MB on this CPU). */
#define NB_BYTES (256u * 1024u)

static inline float ld_bf16(const void *p)
{
	uint16_t h;
	uint32_t u;
	float f;
	memcpy(&h, p, 2);
	u = (uint32_t)h << 16;
	memcpy(&f, &u, 4);
	return f;
}

static inline float w_at(const struct ke_mat *w, int n, int k)
{
	size_t i = (size_t)n * w->ld + (size_t)k;
	if (w->dtype == KV_DT_BF16)
		return ld_bf16((const char *)w->data + i * 2);
	float f;
	memcpy(&f, (const char *)w->data + i * 4, 4);
	return f;
}

static inline float tree16(float *a)
{
	for (int j = 0; j < 8; j++)
		a[j] = a[j] + a[j + 8];
	for (int j = 0; j < 4; j++)
		a[j] = a[j] + a[j + 4];
	for (int j = 0; j < 2; j++)
		a[j] = a[j] + a[j + 2];
	return a[0] + a[1];
}

float ke_dot_ref(const float *a, const float *b, int n)
{
	float acc[16] = {0};
	for (int k = 0; k < n; k += 16)
		for (int j = 0; j < 16; j++) {
			float x = k + j < n ? a[k + j] : 0.0f, y = k + j < n ? b[k + j] : 0.0f;
			acc[j] = fmaf(x, y, acc[j]);
		}
	return tree16(acc);
}

/* --- what a matrix is ------------------------------------------------------ */

size_t ke_mat_bytes(const struct ke_mat *w)
{
	size_t n = (size_t)w->rows * (size_t)w->cols;
	switch (w->dtype) {
	case KV_DT_F32: return n * 4;
	case KV_DT_BF16:
	case KV_DT_F16: return n * 2;
	case KV_DT_MLX_AFFINE: {
		size_t ng = w->group > 0 ? (size_t)w->rows * (size_t)(w->cols / w->group) : 0;
		return n * (size_t)w->bits / 8 + 2 * ng * kv_dtype_size(w->sb_dtype);
	}
	}
	/* ggml block types (model/quant.h): whole blocks per row */
	return (size_t)w->rows * (size_t)kv_dtype_row_bytes(w->dtype, (uint64_t)w->cols);
}

const char *ke_mat_format(const struct ke_mat *w, char *buf, size_t cap)
{
	if (w->dtype == KV_DT_MLX_AFFINE)
		snprintf(buf, cap, "MLX%d g%d", w->bits, w->group);
	else
		snprintf(buf, cap, "%s", kv_dtype_name(w->dtype) ? kv_dtype_name(w->dtype) : "?");
	return buf;
}

/* --- scalar reference ----------------------------------------------------- */

static void gemm_scalar(const struct ke_mat *w, const float *x, size_t ldx, int m, float *y, size_t ldy,
			unsigned flags, int n0, int n1)
{
	int K = w->cols;
	for (int i = 0; i < m; i++) {
		const float *xr = x + (size_t)i * ldx;
		for (int n = n0; n < n1; n++) {
			float acc[16] = {0};
			for (int k = 0; k < K; k += 16)
				for (int j = 0; j < 16; j++) {
					float xv = 0.0f, wv = 0.0f;
					if (k + j < K) {
						xv = xr[k + j];
						wv = w_at(w, n, k + j);
					}
					acc[j] = fmaf(xv, wv, acc[j]);
				}
			float r = tree16(acc);
			float *yo = y + (size_t)i * ldy + n;
			*yo = (flags & KE_GEMM_ACCUM) ? *yo + r : r;
		}
	}
}

#if defined(__x86_64__)

/* --- AVX2 + FMA ----------------------------------------------------------- */

#define TGT2 __attribute__((target("avx2,fma")))
#define INL __attribute__((always_inline)) inline
/* Keeps a loaded vector in a register: without it GCC folds the x load
 * into each of the NR fused multiply-adds that use it, so the loop issues
 * MR x NR + NR loads per block instead of MR + NR and becomes bound by the
 * two load ports (16 loads per 12 FMAs in the 3x2 tile). */
#define REG(v) __asm__("" : "+x"(v))

/* Lanes 0-7 of a 16-lane accumulator live in one register, 8-15 in another. */
TGT2 static INL float hsum2(__m256 lo, __m256 hi)
{
	__m256 t = _mm256_add_ps(lo, hi);                                              /* j + j+8 */
	__m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)); /* j + j+4 */
	__m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));                                 /* j + j+2 */
	__m128 r = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));                              /* 0 + 1 */
	return _mm_cvtss_f32(r);
}

/* Eight canonical reductions at once. t[q] = lo + hi of output q (the
 * j + j+8 step); then (j, j+4), (j, j+2), (0, 1) as in hsum2, each an
 * IEEE add of the same pair (addition is commutative bit for bit), by
 * transposing: ~3.6 ops per output instead of 7. The lanes come out as
 * t[0] t[2] t[4] t[6] t[1] t[3] t[5] t[7]. */
TGT2 static INL __m256 hsum8x2(__m256 t0, __m256 t1, __m256 t2, __m256 t3, __m256 t4, __m256 t5, __m256 t6,
			       __m256 t7)
{
#define H4(a, b) _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31))
	__m256 a01 = H4(t0, t1), a23 = H4(t2, t3), a45 = H4(t4, t5), a67 = H4(t6, t7); /* j + j+4 */
#undef H4
	__m256 b0 = _mm256_add_ps(_mm256_shuffle_ps(a01, a23, 0x44), _mm256_shuffle_ps(a01, a23, 0xEE)); /* j + j+2 */
	__m256 b1 = _mm256_add_ps(_mm256_shuffle_ps(a45, a67, 0x44), _mm256_shuffle_ps(a45, a67, 0xEE));
	return _mm256_add_ps(_mm256_shuffle_ps(b0, b1, 0x88), _mm256_shuffle_ps(b0, b1, 0xDD)); /* 0 + 1 */
}

/* bf16 -> f32 (bits << 16): the 8 words loaded into both 128-bit lanes
 * (vbroadcasti128, a load-port uop), then one byte shuffle puts word i in
 * the high half of dword i and zeros the low half, where zero-extend +
 * shift took two uops on the vector ports. Exactly the same value. */
TGT2 static INL __m256 ld8w(const void *p, int bf)
{
	if (bf) {
		const __m256i ctl = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7, -1, -1, 8, 9,
						     -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15);
		__m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
		return _mm256_castsi256_ps(_mm256_shuffle_epi8(v, ctl));
	}
	return _mm256_loadu_ps((const float *)p);
}

/* MR x NR tile, AVX2. x rows at x + i*ldx, w rows at w + j*wstride bytes.
 * Columns [k0, k1) of K (k0 a multiple of 16): the 16-lane accumulators
 * start at zero, or from st_in (MR x NR x 16 floats, lanes in order) when
 * this is a later piece of K; they end in st_out when more of K follows,
 * else they are reduced into y. A lane's sequence of fmas is the same
 * whether K is done in one piece or several. */
TGT2 static INL void tile2(const int MR, const int NR, const int bf, const int pf, const float *x, size_t ldx, const char *w,
			   size_t wstride, int K, float *y, size_t ldy, unsigned flags, int k0, int k1,
			   const float *st_in, float *st_out)
{
	__m256 lo[3][4], hi[3][4];
	const size_t es = bf ? 2 : 4;
	(void)K;
#pragma GCC unroll 3
	for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
		for (int j = 0; j < NR; j++) {
			if (st_in) {
				lo[i][j] = _mm256_loadu_ps(st_in + (i * NR + j) * 16);
				hi[i][j] = _mm256_loadu_ps(st_in + (i * NR + j) * 16 + 8);
			} else {
				lo[i][j] = _mm256_setzero_ps();
				hi[i][j] = _mm256_setzero_ps();
			}
		}
	int k = k0;
	for (; k + 16 <= k1; k += 16) {
		__m256 wv[4];
#pragma GCC unroll 4
		for (int j = 0; j < NR; j++) {
			/* as tile5: the same columns of the rows two tiles ahead (no
			 * hardware prefetcher runs ahead over several short row
			 * streams): one thread, M = 256, f32 tiles 0.87 -> 0.93x
			 * OpenBLAS; bf16 decode (M = 1, weights from memory) +14%.
			 * f32 decode measured 12% slower with it, so it has none. */
			if (pf && (MR > 1 || bf))
				_mm_prefetch(w + (j + 2 * NR) * wstride + (size_t)k * es, _MM_HINT_T0);
			wv[j] = ld8w(w + j * wstride + (size_t)k * es, bf);
		}
#pragma GCC unroll 3
		for (int i = 0; i < MR; i++) {
			__m256 xv = _mm256_loadu_ps(x + i * ldx + k);
			REG(xv);
#pragma GCC unroll 4
			for (int j = 0; j < NR; j++)
				lo[i][j] = _mm256_fmadd_ps(xv, wv[j], lo[i][j]);
		}
#pragma GCC unroll 4
		for (int j = 0; j < NR; j++)
			wv[j] = ld8w(w + j * wstride + (size_t)(k + 8) * es, bf);
#pragma GCC unroll 3
		for (int i = 0; i < MR; i++) {
			__m256 xv = _mm256_loadu_ps(x + i * ldx + k + 8);
			REG(xv);
#pragma GCC unroll 4
			for (int j = 0; j < NR; j++)
				hi[i][j] = _mm256_fmadd_ps(xv, wv[j], hi[i][j]);
		}
	}
	if (k < k1) {
		/* Zero-padded last block, through small buffers. */
		float xb[3][16], wb[4][16];
		int r = k1 - k;
#pragma GCC unroll 3
		for (int i = 0; i < MR; i++) {
			memset(xb[i], 0, sizeof xb[i]);
			memcpy(xb[i], x + i * ldx + k, (size_t)r * 4);
		}
#pragma GCC unroll 4
		for (int j = 0; j < NR; j++) {
			memset(wb[j], 0, sizeof wb[j]);
			const char *wp = w + j * wstride + (size_t)k * es;
			for (int t = 0; t < r; t++) {
				if (bf)
					wb[j][t] = ld_bf16(wp + (size_t)t * 2);
				else
					memcpy(&wb[j][t], wp + (size_t)t * 4, 4);
			}
		}
#pragma GCC unroll 3
		for (int i = 0; i < MR; i++) {
			__m256 x0 = _mm256_loadu_ps(xb[i]), x1 = _mm256_loadu_ps(xb[i] + 8);
#pragma GCC unroll 4
			for (int j = 0; j < NR; j++) {
				lo[i][j] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(wb[j]), lo[i][j]);
				hi[i][j] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(wb[j] + 8), hi[i][j]);
			}
		}
	}
	if (st_out) {
#pragma GCC unroll 3
		for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
			for (int j = 0; j < NR; j++) {
				_mm256_storeu_ps(st_out + (i * NR + j) * 16, lo[i][j]);
				_mm256_storeu_ps(st_out + (i * NR + j) * 16 + 8, hi[i][j]);
			}
		return;
	}
	if (MR * NR >= 5) {
		/* up to 8 outputs (the tiles have at most 6), the rest zero; output
		 * q goes in as argument (q % 4) * 2 + q / 4 so that the result
		 * lanes are in order */
		__m256 t[8];
		float r[8];
#pragma GCC unroll 8
		for (int q = 0; q < 8; q++)
			t[(q % 4) * 2 + q / 4] = q < MR * NR ? _mm256_add_ps(lo[q / NR][q % NR], hi[q / NR][q % NR])
							     : _mm256_setzero_ps();
		__m256 h = hsum8x2(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
		if (NR == 2) {
			/* row i's two outputs are lanes 2i, 2i + 1: one 8-byte store
			 * per row, where the 8 floats went to the stack and came back
			 * one by one (perf: the tile's reduction and stores were a
			 * quarter of its samples at K = 256) */
			__m128 q0 = _mm256_castps256_ps128(h), q1 = _mm256_extractf128_ps(h, 1);
			__m128 rw[3] = {q0, _mm_movehl_ps(q0, q0), q1};
#pragma GCC unroll 3
			for (int i = 0; i < MR; i++) {
				/* 8-byte unaligned moves (y is only float-aligned) */
				__m128i *yo = (__m128i *)(void *)(y + i * ldy);
				__m128 v = rw[i];
				if (flags & KE_GEMM_ACCUM)
					v = _mm_add_ps(_mm_castsi128_ps(_mm_loadl_epi64(yo)), v);
				_mm_storel_epi64(yo, _mm_castps_si128(v));
			}
			return;
		}
		_mm256_storeu_ps(r, h);
#pragma GCC unroll 3
		for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
			for (int j = 0; j < NR; j++) {
				float *yo = y + i * ldy + j;
				*yo = (flags & KE_GEMM_ACCUM) ? *yo + r[i * NR + j] : r[i * NR + j];
			}
		return;
	}
#pragma GCC unroll 3
	for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
		for (int j = 0; j < NR; j++) {
			float r = hsum2(lo[i][j], hi[i][j]);
			float *yo = y + i * ldy + j;
			*yo = (flags & KE_GEMM_ACCUM) ? *yo + r : r;
		}
}

#define T2(mr, nr, bf) \
	TGT2 static void t2_##mr##_##nr##_##bf(const float *x, size_t ldx, const char *w, size_t ws, int K, \
					      float *y, size_t ldy, unsigned fl) \
	{ tile2(mr, nr, bf, 1, x, ldx, w, ws, K, y, ldy, fl, 0, K, NULL, NULL); }
T2(1, 1, 0) T2(1, 2, 0) T2(2, 1, 0) T2(2, 2, 0) T2(3, 1, 0) T2(3, 2, 0)
T2(1, 1, 1) T2(1, 2, 1) T2(2, 1, 1) T2(2, 2, 1) T2(3, 1, 1) T2(3, 2, 1)
T2(1, 3, 0) T2(1, 4, 0) T2(1, 3, 1) T2(1, 4, 1)

typedef void (*tile_fn)(const float *, size_t, const char *, size_t, int, float *, size_t, unsigned);
typedef void (*tile_kfn)(const float *, size_t, const char *, size_t, int, float *, size_t, unsigned, int, int,
			 const float *, float *);

#define T2K(mr, nr, bf) \
	TGT2 static void t2k_##mr##_##nr##_##bf(const float *x, size_t ldx, const char *w, size_t ws, int K, \
					       float *y, size_t ldy, unsigned fl, int k0, int k1, const float *si, \
					       float *so) \
	{ tile2(mr, nr, bf, 1, x, ldx, w, ws, K, y, ldy, fl, k0, k1, si, so); }
T2K(1, 1, 0) T2K(1, 2, 0) T2K(2, 1, 0) T2K(2, 2, 0) T2K(3, 1, 0) T2K(3, 2, 0)
T2K(1, 1, 1) T2K(1, 2, 1) T2K(2, 1, 1) T2K(2, 2, 1) T2K(3, 1, 1) T2K(3, 2, 1)
static const tile_kfn g_t2k[2][3][2] = {
	{{t2k_1_1_0, t2k_1_2_0}, {t2k_2_1_0, t2k_2_2_0}, {t2k_3_1_0, t2k_3_2_0}},
	{{t2k_1_1_1, t2k_1_2_1}, {t2k_2_1_1, t2k_2_2_1}, {t2k_3_1_1, t2k_3_2_1}},
};

static const tile_fn g_t2[2][3][2] = {
	{{t2_1_1_0, t2_1_2_0}, {t2_2_1_0, t2_2_2_0}, {t2_3_1_0, t2_3_2_0}},
	{{t2_1_1_1, t2_1_2_1}, {t2_2_1_1, t2_2_2_1}, {t2_3_1_1, t2_3_2_1}},
};
/* One activation row (decode): four weight rows per tile, so each thread
 * keeps four weight streams in flight instead of two. */
static const tile_fn g_t2v[2][4] = {
	{t2_1_1_0, t2_1_2_0, t2_1_3_0, t2_1_4_0},
	{t2_1_1_1, t2_1_2_1, t2_1_3_1, t2_1_4_1},
};

/* --- AVX-512 -------------------------------------------------------------- */

/* REG for the 32 AVX-512 registers ("x" names only the first 16). Without
 * it GCC folded the x load into each fma of the 8 x 3 and 6 x 4 tiles
 * (MR x NR loads per block instead of MR + NR). */
#define REG5(v) __asm__("" : "+v"(v))
#define TGT5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#define MR5 4
#define NR5 6

TGT5 static INL float hsum5(__m512 a)
{
	__m256 t = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1)); /* j + j+8 */
	__m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));    /* j + j+4 */
	__m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));                                    /* j + j+2 */
	__m128 r = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));                                 /* 0 + 1 */
	return _mm_cvtss_f32(r);
}

/* Four canonical reductions at once: lanes (j, j+8) of every accumulator,
 * then (j, j+4), (j, j+2), (0, 1), each an IEEE add of the same pair as
 * hsum5 (addition is commutative bit for bit). Returns {a, b, c, d}. */
TGT5 static INL __m128 hsum4x5(__m512 a, __m512 b, __m512 c, __m512 d)
{
	__m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
	__m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
	/* ab = [ta0 ta1 tb0 tb1] (128-bit chunks of the 8-lane partial sums) */
	__m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
	/* u = [ua ub uc ud], 4 lanes each */
	__m512 v = _mm512_add_ps(u, _mm512_permute_ps(u, 0xEE));
	__m512 w = _mm512_add_ps(v, _mm512_permute_ps(v, 0x55));
	/* lane 0 of each 128-bit chunk */
	return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
									      0, 0), w));
}

/* bf16 -> f32 (bits << 16) in one shuffle: word i of the 16 loaded goes
 * to the high half of dword i, the low halves zeroed by the mask (vpermw:
 * one uop on port 5), where zero-extend + shift took two uops on the FMA
 * ports for every weight vector. Exactly the same value. */
TGT5 static INL __m512i bf16_idx5(void)
{
	return _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0,
				1, 0, 0, 0);
}

/* Sixteen canonical reductions at once, the outputs of a 4 x 4 block of
 * accumulators a[r][c]: the same four steps and pairs as hsum5 (each an
 * IEEE add; addition is commutative bit for bit), transposed so that
 * 128-bit chunk r of the result holds row r's four outputs in column
 * order: ~2.8 shuffles and adds per output, against 3.5 for hsum4x5. */
TGT5 static INL __m512 hsum16x5(__m512 a00, __m512 a01, __m512 a02, __m512 a03, __m512 a10, __m512 a11, __m512 a12,
				__m512 a13, __m512 a20, __m512 a21, __m512 a22, __m512 a23, __m512 a30, __m512 a31,
				__m512 a32, __m512 a33)
{
	/* j + j+8: [a0+a2, a1+a3 | b0+b2, b1+b3] in 128-bit chunks */
#define P8(a, b) _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE))
	/* j + j+4: chunk k = the 4-lane partial sums of accumulator k of (a, b, c, d) */
#define Q4(p, q) _mm512_add_ps(_mm512_shuffle_f32x4(p, q, 0x88), _mm512_shuffle_f32x4(p, q, 0xDD))
	__m512 u0 = Q4(P8(a00, a10), P8(a20, a30)), u1 = Q4(P8(a01, a11), P8(a21, a31));
	__m512 u2 = Q4(P8(a02, a12), P8(a22, a32)), u3 = Q4(P8(a03, a13), P8(a23, a33));
#undef P8
#undef Q4
	/* j + j+2, then 0 + 1: chunk r = (u0[r], u1[r], u2[r], u3[r]) */
	__m512 v0 = _mm512_add_ps(_mm512_shuffle_ps(u0, u1, 0x44), _mm512_shuffle_ps(u0, u1, 0xEE));
	__m512 v1 = _mm512_add_ps(_mm512_shuffle_ps(u2, u3, 0x44), _mm512_shuffle_ps(u2, u3, 0xEE));
	return _mm512_add_ps(_mm512_shuffle_ps(v0, v1, 0x88), _mm512_shuffle_ps(v0, v1, 0xDD));
}

/* Four outputs of one row into y (y = r, or y + r with KE_GEMM_ACCUM: the
 * scalar path's *yo + r). */
TGT5 static INL void put4(float *y, __m128 r, unsigned flags)
{
	_mm_storeu_ps(y, (flags & KE_GEMM_ACCUM) ? _mm_add_ps(_mm_loadu_ps(y), r) : r);
}

/* bf: 1 = bf16 weights, 0 = f32 rows, 2 = f32 panel of interleaved rows
 * (IL5 below); 0 and 2 load the same way. */
TGT5 static INL __m512 ld16w(const void *p, int bf)
{
	if (bf == 1)
		return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(
			0xAAAAAAAAu, bf16_idx5(), _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p))));
	return _mm512_loadu_ps((const float *)p);
}

TGT5 static INL __m512 ld16w_mask(const void *p, int bf, __mmask16 m)
{
	if (bf == 1)
		return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
	return _mm512_maskz_loadu_ps(m, p);
}

/* Columns [k0, k1) with parked accumulators, as tile2. */
TGT5 static INL void tile5(const int MR, const int NR, const int bf, const int pf, const float *x, size_t ldx, const char *w,
			   size_t wstride, int K, float *y, size_t ldy, unsigned flags, int k0, int k1,
			   const float *st_in, float *st_out)
{
	__m512 acc[8][6];
	/* bytes per column: the interleaved panel holds 4 rows x 16 floats
	 * per block of 16 columns (wstride 64 there) */
	const size_t es = bf == 1 ? 2 : bf == 2 ? 16 : 4;
	(void)K;
#pragma GCC unroll 8
	for (int i = 0; i < MR; i++)
#pragma GCC unroll 6
		for (int j = 0; j < NR; j++)
			acc[i][j] = st_in ? _mm512_loadu_ps(st_in + (i * NR + j) * 16) : _mm512_setzero_ps();
	int k = k0;
	for (; k + 16 <= k1; k += 16) {
		__m512 wv[6];
#pragma GCC unroll 6
		for (int j = 0; j < NR; j++) {
			/* the same columns two tiles ahead (sweeps walk the weight rows
			 * in order): with several activation rows a tile's FMAs hide
			 * its own loads but the hardware prefetcher does not run ahead
			 * over 6 short row streams, and the tile waited on memory. The
			 * decode GEMMs of bench-hybrid, one thread: M = 1 7.2 -> 4.4 ms,
			 * M = 4 10.5 -> 5.5 ms per step. A prefetch past the matrix
			 * never faults. */
			if (pf)
				_mm_prefetch(w + (j + 2 * NR) * wstride + (size_t)k * es, _MM_HINT_T0);
			wv[j] = ld16w(w + j * wstride + (size_t)k * es, bf);
		}
#pragma GCC unroll 8
		for (int i = 0; i < MR; i++) {
			__m512 xv = _mm512_loadu_ps(x + i * ldx + k);
			REG5(xv);
#pragma GCC unroll 6
			for (int j = 0; j < NR; j++)
				acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
		}
	}
	if (k < k1) {
		__mmask16 m = (__mmask16)((1u << (k1 - k)) - 1u);
		__m512 wv[6];
#pragma GCC unroll 6
		for (int j = 0; j < NR; j++)
			wv[j] = ld16w_mask(w + j * wstride + (size_t)k * es, bf, m);
#pragma GCC unroll 8
		for (int i = 0; i < MR; i++) {
			__m512 xv = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
#pragma GCC unroll 6
			for (int j = 0; j < NR; j++)
				acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
		}
	}
	if (st_out) {
#pragma GCC unroll 8
		for (int i = 0; i < MR; i++)
#pragma GCC unroll 6
			for (int j = 0; j < NR; j++)
				_mm512_storeu_ps(st_out + (i * NR + j) * 16, acc[i][j]);
		return;
	}
	if (NR == 4) {
		/* the prefill tiles: rows four at a time with hsum16x5, the rest
		 * with hsum4x5, each row's four outputs stored together */
		int i = 0;
#pragma GCC unroll 2
		for (; i + 4 <= MR; i += 4) {
			__m512 v = hsum16x5(acc[i][0], acc[i][1], acc[i][2], acc[i][3], acc[i + 1][0], acc[i + 1][1],
					    acc[i + 1][2], acc[i + 1][3], acc[i + 2][0], acc[i + 2][1], acc[i + 2][2],
					    acc[i + 2][3], acc[i + 3][0], acc[i + 3][1], acc[i + 3][2], acc[i + 3][3]);
			put4(y + i * ldy, _mm512_castps512_ps128(v), flags);
			put4(y + (i + 1) * ldy, _mm512_extractf32x4_ps(v, 1), flags);
			put4(y + (i + 2) * ldy, _mm512_extractf32x4_ps(v, 2), flags);
			put4(y + (i + 3) * ldy, _mm512_extractf32x4_ps(v, 3), flags);
		}
#pragma GCC unroll 3
		for (; i < MR; i++)
			put4(y + i * ldy, hsum4x5(acc[i][0], acc[i][1], acc[i][2], acc[i][3]), flags);
		return;
	}
	/* Reductions four accumulators at a time (hsum4x5: the same pairs as
	 * hsum5), the rest one by one. */
	float r[48];
	const int T = MR * NR;
	int q = 0;
#pragma GCC unroll 12
	for (; q + 4 <= T; q += 4)
		_mm_storeu_ps(r + q, hsum4x5(acc[q / NR][q % NR], acc[(q + 1) / NR][(q + 1) % NR],
					      acc[(q + 2) / NR][(q + 2) % NR], acc[(q + 3) / NR][(q + 3) % NR]));
#pragma GCC unroll 3
	for (; q < T; q++)
		r[q] = hsum5(acc[q / NR][q % NR]);
#pragma GCC unroll 8
	for (int i = 0; i < MR; i++)
#pragma GCC unroll 6
		for (int j = 0; j < NR; j++) {
			float *yo = y + i * ldy + j;
			*yo = (flags & KE_GEMM_ACCUM) ? *yo + r[i * NR + j] : r[i * NR + j];
		}
}

#define T5(mr, nr, bf) \
	TGT5 static void t5_##mr##_##nr##_##bf(const float *x, size_t ldx, const char *w, size_t ws, int K, \
					      float *y, size_t ldy, unsigned fl) \
	{ tile5(mr, nr, bf, 1, x, ldx, w, ws, K, y, ldy, fl, 0, K, NULL, NULL); }
#define T5K(mr, nr, bf) \
	TGT5 static void t5k_##mr##_##nr##_##bf(const float *x, size_t ldx, const char *w, size_t ws, int K, \
					       float *y, size_t ldy, unsigned fl, int k0, int k1, const float *si, \
					       float *so) \
	{ tile5(mr, nr, bf, 0, x, ldx, w, ws, K, y, ldy, fl, k0, k1, si, so); }
#define T5ROW(mr, bf) T5(mr, 1, bf) T5(mr, 2, bf) T5(mr, 3, bf) T5(mr, 4, bf) T5(mr, 5, bf) T5(mr, 6, bf)
T5ROW(1, 0) T5ROW(2, 0) T5ROW(3, 0) T5ROW(4, 0) T5ROW(5, 0) T5ROW(6, 0)
T5ROW(1, 1) T5ROW(2, 1) T5ROW(3, 1) T5ROW(4, 1) T5ROW(5, 1) T5ROW(6, 1)
#define T5KROW(mr, bf) T5K(mr, 1, bf) T5K(mr, 2, bf) T5K(mr, 3, bf) T5K(mr, 4, bf)
T5KROW(1, 0) T5KROW(2, 0) T5KROW(3, 0) T5KROW(4, 0) T5KROW(5, 0) T5KROW(6, 0)
T5KROW(1, 1) T5KROW(2, 1) T5KROW(3, 1) T5KROW(4, 1) T5KROW(5, 1) T5KROW(6, 1)
T5KROW(1, 2) T5KROW(2, 2) T5KROW(3, 2) T5KROW(4, 2) T5KROW(5, 2) T5KROW(6, 2)

#define T5TAB(mr, bf) {t5_##mr##_1_##bf, t5_##mr##_2_##bf, t5_##mr##_3_##bf, t5_##mr##_4_##bf, \
		       t5_##mr##_5_##bf, t5_##mr##_6_##bf}
/* Every tile up to 6 x 6; a sweep with an MR x NR shape uses rows 1..MR,
 * columns 1..NR (the table's rows are T5LD long). Prefill (M >= 6) runs 6
 * x 4 tiles: each 16-column block loads 4 weight vectors, which come from
 * L2 (the block of weight rows, or the widened panel, is swept by every
 * row tile), and 6 activation vectors from L1, for 24 fmas; the 4 x 6
 * tile loaded 6 from L2 for the same 24, and on bf16 weights widened 6
 * instead of 4. Decode batches (M < 6) keep 4 x 6: six weight streams in
 * flight per tile, which the prefetch below was tuned for. */
#define T5LD 6
static const tile_fn g_t5[2][6][T5LD] = {
	{T5TAB(1, 0), T5TAB(2, 0), T5TAB(3, 0), T5TAB(4, 0), T5TAB(5, 0), T5TAB(6, 0)},
	{T5TAB(1, 1), T5TAB(2, 1), T5TAB(3, 1), T5TAB(4, 1), T5TAB(5, 1), T5TAB(6, 1)},
};
/* Long rows: 6 x 4 tiles (weights come from L2 there, activations from
 * L1, so fewer weight rows per tile and more activation rows). */
#define T5K4TAB(mr, bf) {t5k_##mr##_1_##bf, t5k_##mr##_2_##bf, t5k_##mr##_3_##bf, t5k_##mr##_4_##bf}
static const tile_kfn g_t5k[3][6][4] = {
	{T5K4TAB(1, 0), T5K4TAB(2, 0), T5K4TAB(3, 0), T5K4TAB(4, 0), T5K4TAB(5, 0), T5K4TAB(6, 0)},
	{T5K4TAB(1, 1), T5K4TAB(2, 1), T5K4TAB(3, 1), T5K4TAB(4, 1), T5K4TAB(5, 1), T5K4TAB(6, 1)},
	{T5K4TAB(1, 2), T5K4TAB(2, 2), T5K4TAB(3, 2), T5K4TAB(4, 2), T5K4TAB(5, 2), T5K4TAB(6, 2)},
};

#endif /* __x86_64__ */

/* Blocked sweep over [n0, n1) with a tile table. */
static void sweep(const tile_fn *tab, int tld, int mr_max, int nr_max, const struct ke_mat *w, const float *x,
		  size_t ldx, int m, float *y, size_t ldy, unsigned flags, int n0, int n1)
{
	size_t es = w->dtype == KV_DT_BF16 ? 2 : 4;
	size_t wstride = w->ld * es;
	size_t row_bytes = (size_t)w->cols * es;
	int nb = (int)(NB_BYTES / (row_bytes ? row_bytes : 1));
	if (nb < nr_max)
		nb = nr_max;
	nb -= nb % nr_max;
	const char *wd = w->data;
	for (int b0 = n0; b0 < n1; b0 += nb) {
		int b1 = b0 + nb < n1 ? b0 + nb : n1;
		for (int i = 0; i < m; i += mr_max) {
			int mr = m - i < mr_max ? m - i : mr_max;
			for (int n = b0; n < b1; n += nr_max) {
				int nr = b1 - n < nr_max ? b1 - n : nr_max;
				tab[(mr - 1) * tld + (nr - 1)](x + (size_t)i * ldx, ldx, wd + (size_t)n * wstride,
								  wstride, w->cols, y + (size_t)i * ldy + n, ldy, flags);
			}
		}
	}
}

#if defined(__x86_64__)
/*
 * bf16 weights with several activation rows: a panel of weight rows is
 * widened to f32 once (exact, so the f32 tiles then do the same fmas on
 * the same values) and swept by every row tile of the activations. In the
 * bf16 tiles each weight vector costs a widening shuffle for every row
 * tile that reads it; here once per panel. AVX-512 (stack panels, the
 * 6 x 4 tiles without prefetch); AVX2 widens its panels with
 * sweep_widened below.
 */
#define PANEL_FLOATS 16384 /* at most 64 KiB on the stack; panel_floats() sizes them */
#define PANEL_PAD 16       /* rows not a multiple of 4 KiB apart (L1 set aliasing) */
/* Batched decode (a few rows per sequence set, the weights streamed from
 * memory) keeps the bf16 tiles, whose prefetch runs ahead of the stream:
 * with the panels, 8 decoding sequences measured 2.8x the step of 4 on
 * bench-dense (bench batch), against 1.3x for 2 -> 4. */
#define PACK_MIN_M 32
/* Longer rows keep the bf16 tiles: with a few rows per panel the
 * activations are re-read from L2 for every panel (K = 2048 measured
 * 0.9x the bf16 tiles). */
#define PACK_MAX_K 1024
/* AVX-512 panels take rows up to 512 columns; longer rows go to the
 * widened K-split blocks (sweep_widened), whose 512 KiB-1 MiB block sits
 * in L2 while the 6-row activation tile (24 KiB at K = 1024) stays in
 * L1. One thread, M = 256, Zen 5, best of 6-8 alternating runs, GFLOP/s
 * (OpenBLAS SkylakeX ~194-216 in the same runs): K = 1024 N = 512 179 ->
 * 211, N = 2048 180 -> 208; K = 768 175 -> 193; at K = 512 the widened
 * blocks lost (201 against 210 on the small panels), at K = 256 164
 * against 193. */
#define PACK_MAX_K5 512
/* AVX2 widened blocks: a quarter of the L2 (wide2_bytes below; 128 KiB,
 * 60 rows of 512 floats, on Zen 3's 512 KiB). The first choice, 32 KiB
 * (best of 24-1024 KiB on a Zen 5 running the AVX2 path, whose L2 of
 * 1 MiB holds the activations), lost on a real AVX2-only CPU: on Zen 3 a
 * 32 KiB panel and the 3-row activation tile (6 KiB at K = 512) do not
 * both stay in the 32 KiB L1, and the M activation rows, streamed once
 * per panel, do not fit its L2. With the larger block the tile's
 * activation rows stay in L1 for 60 weight rows and the block streams
 * from L2. One thread, Zen 3, 16 alternating runs, median ratio to
 * OpenBLAS (Haswell kernel) in the same runs: M = 256 N = 2048 K = 512
 * 0.72-0.74 -> 0.81-0.84, N = 1024 K = 512 0.69 -> 0.84, M = 512 N = 2048
 * 0.67 -> 0.79; K = 1024 unchanged (0.66-0.68). Splitting M so that the
 * activations fit the L2 (32 KiB panels) did not help (0.72), nor did
 * copying the activation tile to a padded buffer (0.67). */
#define WIDE2_BYTES (128u * 1024u)

TGT2 static void widen_row2(float *dst, const char *src, int K)
{
	int k = 0;
	for (; k + 8 <= K; k += 8)
		_mm256_storeu_ps(dst + k, ld8w(src + (size_t)k * 2, 1));
	for (; k < K; k++)
		dst[k] = ld_bf16(src + (size_t)k * 2);
}

/*
 * The AVX-512 panels interleave their rows in groups of four (IL5): for
 * each block of 16 columns, the 16 floats of row 0, then rows 1, 2, 3, so
 * a 6 x 4 tile reads one contiguous stream (256 bytes per block) instead
 * of four rows a panel row apart, and its four weight loads share one
 * base register. Group g of a panel with row stride ld floats starts at
 * float 4 g ld (ld >= K rounded up to 16), so the tile for rows n..n+3
 * starts at row n's offset of the row layout. Same values, same fmas.
 * One thread, M = 256, Zen 5, 8 runs alternating with the old layout and
 * OpenBLAS (SkylakeX kernel), median ratio to OpenBLAS: N = 2048 K = 512
 * 0.94 -> 0.96, N = 1024 K = 512 0.94 -> 0.98, N = 8192 K = 256 0.91 ->
 * 0.93 (a standalone sweep of one L2 panel: +3%).
 */
TGT5 static void widen_il5(float *panel, int ld, int r, const char *src, int K)
{
	float *dst = panel + (size_t)(r / 4) * 4 * (size_t)ld + (size_t)(r % 4) * 16;
	int k = 0;
	for (; k + 16 <= K; k += 16)
		_mm512_storeu_ps(dst + (size_t)k * 4, ld16w(src + (size_t)k * 2, 1));
	for (; k < K; k++)
		dst[(size_t)(k / 16) * 64 + k % 16] = ld_bf16(src + (size_t)k * 2);
}

/*
 * Widening reads the weights from memory (or L3) and the tiles cannot
 * start before it is done, so each panel waited on its own weight stream:
 * the widening took 6% of a M = 256, N = 2048, K = 512 product (perf,
 * one thread, Zen 5), 2.5% with this. While the row tiles sweep panel b,
 * the source bytes of panel b + 1 (`bytes` from src) are prefetched into
 * L2, slice `part` of `parts` per row tile. The next block of a range may
 * lie past the matrix: a prefetch never faults.
 */
static void pf_next(const char *src, size_t bytes, int part, int parts)
{
#if defined(__x86_64__)
	size_t per = (bytes / (size_t)parts + 63) & ~(size_t)63;
	size_t b = (size_t)part * per, e = b + per < bytes ? b + per : bytes;
	for (; b < e; b += 64)
		_mm_prefetch(src + b, _MM_HINT_T1);
#else
	(void)src, (void)bytes, (void)part, (void)parts;
#endif
}

/* num / den of the cache sysconf(name) reports (CPUID), `dflt` when it
 * reports none, clamped to [lo, hi]; computed once (*cached). Block and
 * panel sizes only: no result depends on them. */
static size_t cache_share(int name, size_t num, size_t den, size_t dflt, size_t lo, size_t hi, size_t *cached)
{
	size_t b = __atomic_load_n(cached, __ATOMIC_RELAXED);
	if (b)
		return b;
	long c = sysconf(name);
	b = c > 0 ? (size_t)c * num / den : dflt;
	b = b < lo ? lo : b > hi ? hi : b;
	__atomic_store_n(cached, b, __ATOMIC_RELAXED);
	return b;
}

/* Panel row stride: K rounded up to whole cache lines, plus the pad, so
 * every row starts on a cache line (a 64-byte load that straddles two
 * lines costs two; the in-cache f32 tile measured up to 1.4x slower on
 * rows 16 bytes off). */
static int panel_ld(int K)
{
	return (K + 15) / 16 * 16 + PANEL_PAD;
}

/*
 * Floats per AVX-512 panel: 2/5 of the L1 data cache (sysconf, from
 * CPUID; 19.2 KiB of Zen 5's 48 KiB), 8 to 64 KiB, so that the panel and
 * the 6-row activation tile (12 KiB at K = 512) are both L1-resident
 * while every row tile sweeps the panel. The 64 KiB panel came from L2:
 * one thread, M = 256, Zen 5, best of 8 alternating runs, GFLOP/s (panel
 * floats 16384 / 4300 / 4900 / 5300): N = 2048 K = 512 197 / 212-215 /
 * 210 / 214, N = 8192 K = 256 185 / 199-209 / 193 / 212, N = 1024 K = 512
 * - / 223 / - / 223, against OpenBLAS (SkylakeX) 193-216. 2-4 KiB-row
 * panels (2200-3200 floats) lost 5-7% at K = 512. A speed knob only.
 */
static int panel_floats(void)
{
	static size_t cached;
	return (int)(cache_share(_SC_LEVEL1_DCACHE_SIZE, 2, 5, 16384, 8192, PANEL_FLOATS * 4, &cached) / 4);
}

static size_t wide2_bytes(void)
{
	static size_t cached;
	return cache_share(_SC_LEVEL2_CACHE_SIZE, 1, 4, WIDE2_BYTES, 32768, 4 * WIDE2_BYTES, &cached);
}

static int panel_rows(int K, int nr_max)
{
	int nb = panel_floats() / panel_ld(K);
	return nb - nb % nr_max;
}

static void sweep_packed(const tile_kfn *tab, int tld, int mr_max, int nr_max, const struct ke_mat *w,
			 const float *x, size_t ldx, int m, float *y, size_t ldy, unsigned flags, int n0, int n1)
{
	_Alignas(64) float panel[PANEL_FLOATS];
	int K = w->cols, ld = panel_ld(K);
	int nb = panel_rows(K, nr_max);
	size_t wstride = w->ld * 2;
	const char *wd = w->data;
	for (int b0 = n0; b0 < n1; b0 += nb) {
		int b1 = b0 + nb < n1 ? b0 + nb : n1;
		for (int r = b0; r < b1; r++)
			widen_il5(panel, ld, r - b0, wd + (size_t)r * wstride, K);
		int nx = b1 + nb < n1 ? nb : n1 - b1, tiles = (m + mr_max - 1) / mr_max;
		for (int i = 0; i < m; i += mr_max) {
			int mr = m - i < mr_max ? m - i : mr_max;
			if (nx > 0)
				pf_next(wd + (size_t)b1 * wstride, (size_t)nx * wstride, i / mr_max, tiles);
			for (int n = b0; n < b1; n += nr_max) {
				int nr = b1 - n < nr_max ? b1 - n : nr_max;
				tab[(mr - 1) * tld + (nr - 1)](x + (size_t)i * ldx, ldx,
								  (const char *)(panel + (size_t)(n - b0) * ld), 64, K,
								  y + (size_t)i * ldy + n, ldy, flags, 0, K,
								  NULL, NULL);
			}
		}
	}
}
#endif

#if defined(__x86_64__)
/*
 * The sweep for long rows (K > 2 KC on AVX2, > 4 KC on AVX-512): inside a block of weight rows and
 * a tile of 3 activation rows, K is walked in pieces of KC columns, each
 * piece swept over all the block's weight tiles, the 16-lane accumulators
 * parked in st between pieces. So the MR x KC activations stay in L1 while
 * the block's tiles use them (with the whole K, 3 rows of 4096 floats do
 * not fit in L1 and came from L2 for every weight tile: L2-bound at about
 * 3/4 of the FMA rate). Same operations per lane as one piece.
 */
#define KC2 512
/* The piece actually walked: 1024 columns (6 activation rows of them,
 * 24 KiB, still sit in L1 next to the streamed weights). With the block
 * below, one thread, M = 256, AVX-512: N = 512 K = 2048 ~123 -> ~139
 * GFLOP/s, K = 4096 bf16 ~105 -> ~115, f32 ~107 -> ~125; AVX2 K = 2048
 * ~68 -> ~73. */
#define KCP 1024
#define NBK_MAX 144

/* Weight bytes per block of the K-split sweeps: half the L2 of this CPU
 * (sysconf, from CPUID), 256 KiB to 1 MiB; the activation pieces are
 * re-read from L2 once per block, so the larger the block the fewer
 * passes (1 MiB on the 2 MiB L2 of Sapphire Rapids). The AVX2 tiles take
 * a quarter of the L2 instead (wide2_bytes: 128 KiB on Zen 3's 512 KiB):
 * one thread, Zen 3, 20 alternating runs, median ratio to OpenBLAS, M =
 * 256: N = 512 K = 2048 0.66 -> 0.70, N = 1024 K = 4096 0.61 -> 0.65, N =
 * 2048 K = 2048 0.68 -> 0.73 (the parked accumulators and the activation
 * piece share the L2 with the block). A speed knob only: no result
 * depends on it. */
static size_t kblock_bytes(void)
{
	static size_t cached;
	return cache_share(_SC_LEVEL2_CACHE_SIZE, 1, 2, NB_BYTES, NB_BYTES, 4 * NB_BYTES, &cached);
}

static void sweep_k(const tile_kfn *tab, int mr_max, int nr_max, int bf, size_t block, const struct ke_mat *w,
		    const float *x, size_t ldx, int m, float *y, size_t ldy, unsigned flags, int n0, int n1)
{
	/* bf 2: an interleaved f32 panel (IL5), whose tiles step 64 bytes
	 * from row to row inside a group of four */
	size_t es = bf == 1 ? 2 : 4;
	size_t wstride = w->ld * es, tws = bf == 2 ? 64 : wstride;
	int K = w->cols;
	int nb = (int)(block / ((size_t)K * es));
	nb = nb < nr_max ? nr_max : nb > NBK_MAX ? NBK_MAX : nb;
	nb -= nb % nr_max;
	/* parked accumulators of one row tile across the block: at most
	 * NBK_MAX weight rows x 6 activation rows x 16 lanes (54 KiB) */
	_Alignas(64) float st[NBK_MAX * 6 * 16];
	const char *wd = w->data;
	for (int b0 = n0; b0 < n1; b0 += nb) {
		int b1 = b0 + nb < n1 ? b0 + nb : n1;
		for (int i = 0; i < m; i += mr_max) {
			int mr = m - i < mr_max ? m - i : mr_max;
			for (int k0 = 0; k0 < K; k0 += KCP) {
				int k1 = k0 + KCP < K ? k0 + KCP : K;
				for (int n = b0; n < b1; n += nr_max) {
					int nr = b1 - n < nr_max ? b1 - n : nr_max;
					float *t = st + (size_t)(n - b0) * mr_max * 16;
					tab[(mr - 1) * nr_max + (nr - 1)](x + (size_t)i * ldx, ldx, wd + (size_t)n * wstride,
									  tws, K, y + (size_t)i * ldy + n, ldy, flags, k0,
									  k1, k0 ? t : NULL, k1 < K ? t : NULL);
				}
			}
		}
	}
}
#endif

#if defined(__x86_64__)
/*
 * bf16 weights with rows longer than the panels take (K > PACK_MAX_K5) and
 * many activation rows, AVX-512 (and on AVX2 the panels themselves, in
 * blocks of WIDE2_BYTES): blocks of weight rows are widened to f32
 * (exactly) into a per-thread buffer of one K-split block (kblock_bytes:
 * 1 MiB on this CPU, 256 KiB to 1 MiB) and multiplied by
 * the f32 path (the K-split sweep, whose tiles then load aligned f32
 * vectors with no widening per row tile): the same fmas on the same
 * values, so the same bits. One thread, M = 256: N = 512 K = 2048 ~112 ->
 * ~137 GFLOP/s, N = 1024 K = 4096 ~104 -> ~132 (with 256 KiB blocks and
 * 512-column pieces it lost at K = 4096: 12 widened rows per block). The
 * buffer belongs to the thread until it exits (base/mem.h
 * kv_tls_scratch), counted under KV_MEM_SCRATCH;
 * without it (allocation failure) the bf16 tiles run instead. (On AVX2
 * the same measured 3-6% slower than the bf16 K-split tiles.) AVX-512
 * widens into interleaved groups of four rows (IL5) and runs the K-split
 * sweep on them directly: one thread, M = 256, Zen 5, best of 8
 * alternating runs: N = 512 K = 2048 183 -> 190 GFLOP/s, N = 256 K =
 * 4096 172 -> 178.
 */
static int sweep_widened(int isa, size_t block, const struct ke_mat *w, const float *x, size_t ldx, int m, float *y,
			 size_t ldy, unsigned flags, int n0, int n1)
{
	int K = w->cols, ld = panel_ld(K);
	int nb = (int)(block / ((size_t)ld * 4));
	nb = nb < 4 ? 4 : nb - nb % 4;
	float *wide = kv_tls_scratch(KV_TLS_GEMM_WIDE, (size_t)nb * (size_t)ld * sizeof(float));
	if (!wide)
		return 0;
	const char *wd = w->data;
	size_t wstride = w->ld * 2;
	for (int b0 = n0; b0 < n1; b0 += nb) {
		int b1 = b0 + nb < n1 ? b0 + nb : n1;
		struct ke_mat wf = {wide, KV_DT_F32, b1 - b0, K, (size_t)ld};
		if (isa >= KE_ISA_AVX512) {
			for (int r = b0; r < b1; r++)
				widen_il5(wide, ld, r - b0, wd + (size_t)r * wstride, K);
			sweep_k(&g_t5k[2][0][0], 6, 4, 2, block, &wf, x, ldx, m, y + b0, ldy, flags, 0, b1 - b0);
			continue;
		}
		for (int r = b0; r < b1; r++)
			widen_row2(wide + (size_t)(r - b0) * ld, wd + (size_t)r * wstride, K);
		ke_gemm_dense_range(isa, &wf, x, ldx, m, y + b0, ldy, flags, 0, b1 - b0);
	}
	return 1;
}
#endif

void ke_gemm_dense_range(int isa, const struct ke_mat *w, const float *x, size_t ldx, int m, float *y, size_t ldy,
			 unsigned flags, int n0, int n1)
{
	if (m <= 0 || n1 <= n0)
		return;
	int best = ke_isa_best();
	if (isa > best)
		isa = best;
	int bf = w->dtype == KV_DT_BF16;
#if defined(__x86_64__)
	if (isa == KE_ISA_AVX512) {
		int pre = m >= 6, mr = pre ? 6 : MR5, nr = pre ? 4 : NR5;
		/* The panels and the K-split sweep run the tiles without prefetch
		 * (t5k): their weights are an L2-resident panel or block, where
		 * the prefetches only took load slots (one thread, M = 256: packed
		 * N = 2048 K = 512 +5%, f32 K = 2048 on the K split +25%). */
		if (bf && m >= PACK_MIN_M && w->cols <= PACK_MAX_K5 && panel_rows(w->cols, 4) >= 4)
			sweep_packed(&g_t5k[2][0][0], 4, 6, 4, w, x, ldx, m, y, ldy, flags, n0, n1);
		else if (bf && m >= PACK_MIN_M && w->cols > PACK_MAX_K5 &&
			 sweep_widened(isa, kblock_bytes(), w, x, ldx, m, y, ldy, flags, n0, n1))
			;
		else if (m > 1 && w->cols > (bf ? 4 : 2) * KC2)
			/* f32 rows from 1024: measured 0.8x -> 1.1x of the whole-row
			 * sweep at K = 2048; bf16 rows (half the bytes from L2) were
			 * no faster there, so they keep the whole row up to 2048 */
			sweep_k(&g_t5k[bf][0][0], 6, 4, bf, kblock_bytes(), w, x, ldx, m, y, ldy, flags, n0, n1);
		else
			sweep(&g_t5[bf][0][0], T5LD, mr, nr, w, x, ldx, m, y, ldy, flags, n0, n1);
		return;
	}
	if (isa == KE_ISA_AVX2) {
		if (m == 1)
			sweep(&g_t2v[bf][0], 4, 1, 4, w, x, ldx, m, y, ldy, flags, n0, n1);
		else if (bf && m >= PACK_MIN_M && w->cols <= PACK_MAX_K &&
			 sweep_widened(isa, wide2_bytes(), w, x, ldx, m, y, ldy, flags, n0, n1))
			/* AVX2 widens its panels into the same per-thread buffer
			 * and runs the plain f32 sweep on them: the stack panel
			 * with the K-split tiles measured 4-6% slower (one thread,
			 * M = 256, K = 512 and 1024) */
			;
		else if (w->cols > 2 * KC2)
			sweep_k(&g_t2k[bf][0][0], 3, 2, bf, wide2_bytes(), w, x, ldx, m, y, ldy, flags, n0, n1);
		else
			sweep(&g_t2[bf][0][0], 2, 3, 2, w, x, ldx, m, y, ldy, flags, n0, n1);
		return;
	}
#endif
	(void)bf;
	gemm_scalar(w, x, ldx, m, y, ldy, flags, n0, n1);
}
