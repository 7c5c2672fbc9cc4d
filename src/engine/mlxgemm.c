/*
 * mlxgemm.c - the GEMM of weight matrices stored in a narrower format than
 * the f32/bf16 the core kernels of gemm.c read: F16 matrices and MLX
 * affine groups (KV_DT_MLX_AFFINE, 4 or 8 bits, gemm.h struct ke_mat).
 *
 * Numerics. A weight element has exactly one f32 value, whatever path
 * computes it:
 *   F16   the exact widening (a signalling NaN comes back quiet, as the
 *         F16C instruction does);
 *   MLX   w = fmaf(scale, (float)q, bias) with scale and bias of the
 *         element's group widened exactly to f32 (one rounding; when the
 *         scales are bf16 or f16, as mlx writes them for such models,
 *         scale * q is exact in f32 and this equals scale * q + bias).
 * The product then runs the canonical 16-lane reduction of gemm.h on those
 * values (fused in registers for decode, or blocks of dequantized rows
 * handed to the f32 kernels of ke_gemm_dense_range). So a row's result depends only on the weights' values and
 * the activation row: never on M, the block, the thread or the CPU path
 * (the scalar, AVX2 and AVX-512 dequantizers give the same bits; tested in
 * test_mlx.c).
 *
 * Paths: decode (M = 1) on AVX2 / AVX-512 dequantizes in registers and
 * multiplies at once (gemv_*). Otherwise rows are dequantized into a
 * per-thread f32 buffer of about 256 KB (swept by every tile of
 * activation rows, as gemm.c's blocks, so only the packed bytes come from
 * memory) and the block goes to the f32 kernels of ke_gemm_dense_range. The
 * buffer belongs to the thread until it exits (base/mem.h kv_tls_scratch)
 * and is counted under KV_MEM_SCRATCH.
 */
#include "engine/mlxgemm.h"
#include "engine/gemm.h"
#include "engine/isa.h"
#include "model/quant.h"
#include "model/safetensors.h"
#include "base/mem.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static inline float f16_val(uint16_t h)
{
	float f = kv_f16_to_f32(h);
	if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) { /* NaN: quiet it as F16C does */
		uint32_t u;
		memcpy(&u, &f, 4);
		u |= 0x00400000u;
		memcpy(&f, &u, 4);
	}
	return f;
}

/* Element i of a scales/biases array (exact widening; any alignment). */
static inline float sb_at(const void *p, int dt, size_t i)
{
	uint16_t h;
	float f;
	if (dt == KV_DT_F32) {
		memcpy(&f, (const char *)p + i * 4, 4);
		return f;
	}
	memcpy(&h, (const char *)p + i * 2, 2);
	if (dt == KV_DT_BF16) {
		uint32_t u = (uint32_t)h << 16;
		memcpy(&f, &u, 4);
		return f;
	}
	return f16_val(h);
}

static inline const uint8_t *mlx_codes(const struct ke_mat *w, int r)
{
	return (const uint8_t *)w->data + (size_t)r * w->ld * (size_t)w->bits / 8;
}

/* --- scalar ---------------------------------------------------------------- */

static void dq_scalar(const struct ke_mat *w, int r, float *out)
{
	int K = w->cols;
	if (w->dtype == KV_DT_MLX_AFFINE) {
		const uint8_t *c = mlx_codes(w, r);
		int G = w->group, ng = K / G;
		for (int g = 0; g < ng; g++) {
			float s = sb_at(w->scales, w->sb_dtype, (size_t)r * ng + g);
			float b = sb_at(w->biases, w->sb_dtype, (size_t)r * ng + g);
			for (int t = 0; t < G; t++) {
				int k = g * G + t;
				unsigned q = w->bits == 4 ? (c[k >> 1] >> ((k & 1) * 4)) & 15u : c[k];
				out[k] = fmaf(s, (float)q, b);
			}
		}
		return;
	}
	const char *p = (const char *)w->data + (size_t)r * w->ld * 2;
	for (int k = 0; k < K; k++) {
		uint16_t h;
		memcpy(&h, p + (size_t)k * 2, 2);
		out[k] = f16_val(h);
	}
}

#if defined(__x86_64__)

/* --- AVX2 (+ F16C) ----------------------------------------------------------- */

#define TGT2 __attribute__((target("avx2,fma,f16c")))

TGT2 static void dq_avx2(const struct ke_mat *w, int r, float *out)
{
	int K = w->cols;
	if (w->dtype == KV_DT_MLX_AFFINE) {
		const uint8_t *c = mlx_codes(w, r);
		int G = w->group, ng = K / G;
		const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), m4 = _mm256_set1_epi32(15);
		for (int g = 0; g < ng; g++) {
			__m256 s = _mm256_set1_ps(sb_at(w->scales, w->sb_dtype, (size_t)r * ng + g));
			__m256 b = _mm256_set1_ps(sb_at(w->biases, w->sb_dtype, (size_t)r * ng + g));
			for (int t = 0; t < G; t += 8) {
				int k = g * G + t;
				__m256i q;
				if (w->bits == 4) {
					uint32_t u;
					memcpy(&u, c + (k >> 1), 4);
					q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)u), sh), m4);
				} else {
					q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(c + k)));
				}
				_mm256_storeu_ps(out + k, _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(q), b));
			}
		}
		return;
	}
	const char *p = (const char *)w->data + (size_t)r * w->ld * 2;
	int k = 0;
	for (; k + 8 <= K; k += 8)
		_mm256_storeu_ps(out + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + (size_t)k * 2))));
	for (; k < K; k++) {
		uint16_t h;
		memcpy(&h, p + (size_t)k * 2, 2);
		out[k] = f16_val(h);
	}
}

/* The canonical tree over lanes 0-7 (lo) and 8-15 (hi), as gemm.c. */
TGT2 static inline float hsum2(__m256 lo, __m256 hi)
{
	__m256 t = _mm256_add_ps(lo, hi);                                              /* j + j+8 */
	__m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)); /* j + j+4 */
	__m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));                                 /* j + j+2 */
	__m128 r = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));                              /* 0 + 1 */
	return _mm_cvtss_f32(r);
}

/* 8 dequantized weights of row codes c at element k (MLX). */
TGT2 static inline __m256 dq8_mlx(const uint8_t *c, int k, int bits, __m256 s, __m256 b)
{
	__m256i q;
	if (bits == 4) {
		uint32_t u;
		memcpy(&u, c + (k >> 1), 4);
		q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)u), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
				     _mm256_set1_epi32(15));
	} else {
		q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(c + k)));
	}
	return _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(q), b);
}

/* Decode (M = 1): dequantize in registers and multiply at once, NR rows
 * at a time (a compile-time constant, so the accumulators stay in
 * registers); the same values and order as the block path. */
TGT2 static inline __attribute__((always_inline)) void gemv2_tile(const int NR, const struct ke_mat *w,
								   const float *x, float *y, unsigned flags, int n)
{
	int K = w->cols;
	__m256 lo[2], hi[2];
#pragma GCC unroll 2
	for (int j = 0; j < NR; j++) {
		lo[j] = _mm256_setzero_ps();
		hi[j] = _mm256_setzero_ps();
	}
	if (w->dtype == KV_DT_MLX_AFFINE) {
		int G = w->group, ng = K / G, bits = w->bits;
		const uint8_t *c[2];
#pragma GCC unroll 2
		for (int j = 0; j < NR; j++)
			c[j] = mlx_codes(w, n + j);
		for (int g = 0; g < ng; g++) {
			__m256 sv[2], bv[2];
#pragma GCC unroll 2
			for (int j = 0; j < NR; j++) {
				size_t gi = (size_t)(n + j) * ng + g;
				sv[j] = _mm256_set1_ps(sb_at(w->scales, w->sb_dtype, gi));
				bv[j] = _mm256_set1_ps(sb_at(w->biases, w->sb_dtype, gi));
			}
			for (int k = g * G; k < (g + 1) * G; k += 16) {
				__m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
#pragma GCC unroll 2
				for (int j = 0; j < NR; j++) {
					lo[j] = _mm256_fmadd_ps(x0, dq8_mlx(c[j], k, bits, sv[j], bv[j]), lo[j]);
					hi[j] = _mm256_fmadd_ps(x1, dq8_mlx(c[j], k + 8, bits, sv[j], bv[j]), hi[j]);
				}
			}
		}
	} else {
		const char *p[2];
#pragma GCC unroll 2
		for (int j = 0; j < NR; j++)
			p[j] = (const char *)w->data + (size_t)(n + j) * w->ld * 2;
		int k = 0;
		for (; k + 16 <= K; k += 16) {
			__m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
#pragma GCC unroll 2
			for (int j = 0; j < NR; j++) {
				const char *q = p[j] + (size_t)k * 2;
				lo[j] = _mm256_fmadd_ps(x0, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)q)), lo[j]);
				hi[j] = _mm256_fmadd_ps(x1, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(q + 16))),
							hi[j]);
			}
		}
		if (k < K) { /* zero-padded last block */
			float xb[16] = {0}, wb[16];
			memcpy(xb, x + k, (size_t)(K - k) * 4);
			__m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
#pragma GCC unroll 2
			for (int j = 0; j < NR; j++) {
				memset(wb, 0, sizeof wb);
				for (int t = 0; t < K - k; t++) {
					uint16_t h;
					memcpy(&h, p[j] + (size_t)(k + t) * 2, 2);
					wb[t] = f16_val(h);
				}
				lo[j] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(wb), lo[j]);
				hi[j] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(wb + 8), hi[j]);
			}
		}
	}
#pragma GCC unroll 2
	for (int j = 0; j < NR; j++) {
		float r = hsum2(lo[j], hi[j]);
		y[n + j] = (flags & KE_GEMM_ACCUM) ? y[n + j] + r : r;
	}
}

TGT2 static void gemv2_2(const struct ke_mat *w, const float *x, float *y, unsigned flags, int n)
{
	gemv2_tile(2, w, x, y, flags, n);
}

TGT2 static void gemv2_1(const struct ke_mat *w, const float *x, float *y, unsigned flags, int n)
{
	gemv2_tile(1, w, x, y, flags, n);
}

TGT2 static void gemv_avx2(const struct ke_mat *w, const float *x, float *y, unsigned flags, int n0, int n1)
{
	int n = n0;
	for (; n + 2 <= n1; n += 2)
		gemv2_2(w, x, y, flags, n);
	for (; n < n1; n++)
		gemv2_1(w, x, y, flags, n);
}

/* --- AVX-512 ------------------------------------------------------------------ */

#define TGT5 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

TGT5 static void dq_avx512(const struct ke_mat *w, int r, float *out)
{
	int K = w->cols;
	if (w->dtype == KV_DT_MLX_AFFINE) {
		const uint8_t *c = mlx_codes(w, r);
		int G = w->group, ng = K / G;
		const __m512i sh = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
		const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
		const __m512i m4 = _mm512_set1_epi32(15);
		for (int g = 0; g < ng; g++) {
			__m512 s = _mm512_set1_ps(sb_at(w->scales, w->sb_dtype, (size_t)r * ng + g));
			__m512 b = _mm512_set1_ps(sb_at(w->biases, w->sb_dtype, (size_t)r * ng + g));
			for (int t = 0; t < G; t += 16) {
				int k = g * G + t;
				__m512i q;
				if (w->bits == 4) {
					__m512i u = _mm512_castsi128_si512(
						_mm_loadl_epi64((const __m128i *)(const void *)(c + (k >> 1))));
					q = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(idx, u), sh), m4);
				} else {
					q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(c + k)));
				}
				_mm512_storeu_ps(out + k, _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(q), b));
			}
		}
		return;
	}
	const char *p = (const char *)w->data + (size_t)r * w->ld * 2;
	int k = 0;
	for (; k + 16 <= K; k += 16)
		_mm512_storeu_ps(out + k,
				 _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p + (size_t)k * 2))));
	for (; k < K; k++) {
		uint16_t h;
		memcpy(&h, p + (size_t)k * 2, 2);
		out[k] = f16_val(h);
	}
}

TGT5 static inline float hsum5(__m512 a)
{
	__m256 t = _mm256_add_ps(_mm512_castps512_ps256(a),
				 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));   /* j + j+8 */
	__m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)); /* j + j+4 */
	__m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));                                 /* j + j+2 */
	__m128 r = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));                              /* 0 + 1 */
	return _mm_cvtss_f32(r);
}

TGT5 static inline __m512 dq16_mlx(const uint8_t *c, int k, int bits, __m512 s, __m512 b)
{
	__m512i q;
	if (bits == 4) {
		__m512i u = _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)(const void *)(c + (k >> 1))));
		q = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), u);
		q = _mm512_and_si512(_mm512_srlv_epi32(q, _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20,
									     24, 28)),
				     _mm512_set1_epi32(15));
	} else {
		q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(c + k)));
	}
	return _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(q), b);
}

/* Decode (M = 1): NR rows at once (a compile-time constant, so the
 * accumulators stay in registers); see gemv_avx2. */
TGT5 static inline __attribute__((always_inline)) void gemv5_tile(const int NR, const struct ke_mat *w,
								   const float *x, float *y, unsigned flags, int n)
{
	int K = w->cols;
	__m512 acc[4];
#pragma GCC unroll 4
	for (int j = 0; j < NR; j++)
		acc[j] = _mm512_setzero_ps();
	if (w->dtype == KV_DT_MLX_AFFINE) {
		int G = w->group, ng = K / G, bits = w->bits;
		const uint8_t *c[4];
#pragma GCC unroll 4
		for (int j = 0; j < NR; j++)
			c[j] = mlx_codes(w, n + j);
		for (int g = 0; g < ng; g++) {
			__m512 sv[4], bv[4];
#pragma GCC unroll 4
			for (int j = 0; j < NR; j++) {
				size_t gi = (size_t)(n + j) * ng + g;
				sv[j] = _mm512_set1_ps(sb_at(w->scales, w->sb_dtype, gi));
				bv[j] = _mm512_set1_ps(sb_at(w->biases, w->sb_dtype, gi));
			}
			if (bits == 4) {
				for (int k = g * G; k < (g + 1) * G; k += 16) {
					__m512 xv = _mm512_loadu_ps(x + k);
#pragma GCC unroll 4
					for (int j = 0; j < NR; j++)
						acc[j] = _mm512_fmadd_ps(xv, dq16_mlx(c[j], k, 4, sv[j], bv[j]), acc[j]);
				}
			} else {
				for (int k = g * G; k < (g + 1) * G; k += 16) {
					__m512 xv = _mm512_loadu_ps(x + k);
#pragma GCC unroll 4
					for (int j = 0; j < NR; j++)
						acc[j] = _mm512_fmadd_ps(xv, dq16_mlx(c[j], k, 8, sv[j], bv[j]), acc[j]);
				}
			}
		}
	} else {
		const char *p[4];
#pragma GCC unroll 4
		for (int j = 0; j < NR; j++)
			p[j] = (const char *)w->data + (size_t)(n + j) * w->ld * 2;
		int k = 0;
		for (; k + 16 <= K; k += 16) {
			__m512 xv = _mm512_loadu_ps(x + k);
#pragma GCC unroll 4
			for (int j = 0; j < NR; j++)
				acc[j] = _mm512_fmadd_ps(
					xv, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p[j] + (size_t)k * 2))),
					acc[j]);
		}
		if (k < K) {
			__mmask16 m = (__mmask16)((1u << (K - k)) - 1u);
			__m512 xv = _mm512_maskz_loadu_ps(m, x + k);
#pragma GCC unroll 4
			for (int j = 0; j < NR; j++)
				acc[j] = _mm512_fmadd_ps(xv, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p[j] + (size_t)k * 2)),
							 acc[j]);
		}
	}
#pragma GCC unroll 4
	for (int j = 0; j < NR; j++) {
		float r = hsum5(acc[j]);
		y[n + j] = (flags & KE_GEMM_ACCUM) ? y[n + j] + r : r;
	}
}

TGT5 static void gemv5_4(const struct ke_mat *w, const float *x, float *y, unsigned flags, int n)
{
	gemv5_tile(4, w, x, y, flags, n);
}

TGT5 static void gemv5_1(const struct ke_mat *w, const float *x, float *y, unsigned flags, int n)
{
	gemv5_tile(1, w, x, y, flags, n);
}

TGT5 static void gemv_avx512(const struct ke_mat *w, const float *x, float *y, unsigned flags, int n0, int n1)
{
	int n = n0;
	for (; n + 4 <= n1; n += 4)
		gemv5_4(w, x, y, flags, n);
	for (; n < n1; n++)
		gemv5_1(w, x, y, flags, n);
}

#endif /* __x86_64__ */

void ke_mat_dequant_rows(int isa, const struct ke_mat *w, int r0, int r1, float *out)
{
	int best = ke_isa_best();
	if (isa > best)
		isa = best;
	for (int r = r0; r < r1; r++) {
		float *o = out + (size_t)(r - r0) * (size_t)w->cols;
#if defined(__x86_64__)
		if (isa == KE_ISA_AVX512) {
			dq_avx512(w, r, o);
			continue;
		}
		if (isa == KE_ISA_AVX2) {
			dq_avx2(w, r, o);
			continue;
		}
#endif
		dq_scalar(w, r, o);
	}
}

/* The per-thread block buffer (see the top of the file). */
static float *block_buf(size_t floats)
{
	return kv_tls_scratch(KV_TLS_MLX_BLOCK, floats * sizeof(float));
}

/* One weight element, the value every path uses. */
static float w_val(const struct ke_mat *w, int r, int k)
{
	if (w->dtype == KV_DT_MLX_AFFINE) {
		const uint8_t *c = mlx_codes(w, r);
		size_t g = (size_t)r * (size_t)(w->cols / w->group) + (size_t)(k / w->group);
		unsigned q = w->bits == 4 ? (c[k >> 1] >> ((k & 1) * 4)) & 15u : c[k];
		return fmaf(sb_at(w->scales, w->sb_dtype, g), (float)q, sb_at(w->biases, w->sb_dtype, g));
	}
	uint16_t h;
	memcpy(&h, (const char *)w->data + ((size_t)r * w->ld + (size_t)k) * 2, 2);
	return f16_val(h);
}

/* Canonical reduction without any buffer: the fallback when the block
 * buffer cannot be allocated (same values, same order, same bits). */
static void gemm_direct(const struct ke_mat *w, const float *x, size_t ldx, int m, float *y, size_t ldy,
			unsigned flags, int n0, int n1)
{
	int K = w->cols;
	for (int n = n0; n < n1; n++)
		for (int i = 0; i < m; i++) {
			const float *xr = x + (size_t)i * ldx;
			float a[16] = {0};
			for (int k = 0; k < K; k += 16)
				for (int j = 0; j < 16; j++)
					a[j] = k + j < K ? fmaf(xr[k + j], w_val(w, n, k + j), a[j]) : fmaf(0.0f, 0.0f, a[j]);
			for (int j = 0; j < 8; j++)
				a[j] = a[j] + a[j + 8];
			for (int j = 0; j < 4; j++)
				a[j] = a[j] + a[j + 4];
			for (int j = 0; j < 2; j++)
				a[j] = a[j] + a[j + 2];
			float r = a[0] + a[1];
			float *yo = y + (size_t)i * ldy + n;
			*yo = (flags & KE_GEMM_ACCUM) ? *yo + r : r;
		}
}

void ke_gemm_range_dq(int isa, const struct ke_mat *w, const float *x, size_t ldx, int m, float *y, size_t ldy,
		      unsigned flags, int n0, int n1)
{
	int best = ke_isa_best();
	if (isa > best)
		isa = best;
#if defined(__x86_64__)
	if (m == 1 && isa == KE_ISA_AVX512) {
		gemv_avx512(w, x, y, flags, n0, n1);
		return;
	}
	if (m == 1 && isa == KE_ISA_AVX2) {
		gemv_avx2(w, x, y, flags, n0, n1);
		return;
	}
#endif
	size_t K = (size_t)w->cols, target = 256u * 1024u;
	size_t nb = K ? target / (K * 4) : 1;
	/* Multiples of 12 rows hold whole tiles of every f32 path (NR 2 and 6). */
	if (nb >= 12)
		nb -= nb % 12;
	if (nb < 1)
		nb = 1;
	if (nb > (size_t)(n1 - n0))
		nb = (size_t)(n1 - n0);
	float *buf = block_buf(nb * K);
	if (!buf) {
		gemm_direct(w, x, ldx, m, y, ldy, flags, n0, n1);
		return;
	}
	for (int b0 = n0; b0 < n1; b0 += (int)nb) {
		int b1 = b0 + (int)nb < n1 ? b0 + (int)nb : n1;
		ke_mat_dequant_rows(isa, w, b0, b1, buf);
		struct ke_mat t = {.data = buf, .dtype = KV_DT_F32, .rows = b1 - b0, .cols = w->cols, .ld = K};
		ke_gemm_dense_range(isa, &t, x, ldx, m, y + b0, ldy, flags, 0, b1 - b0);
	}
}
