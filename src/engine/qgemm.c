/*
 * qgemm.c - see qgemm.h. q8 mode: activation rows are quantized into a
 * per-thread buffer and handed to engine/qdot.c. f32 mode: weight rows are
 * dequantized a panel at a time into a per-thread buffer of KE_QGEMM_MAX_K
 * floats and handed to the f32 kernel: the panel is as many rows as fit,
 * so each dequantized row is used by all M activation rows while it is hot
 * in cache.
 */
#include "engine/qgemm.h"
#include "base/mem.h"
#include "base/pool.h"
#include "engine/isa.h"
#include "engine/prof.h"
#include "engine/qdot.h"
#include "engine/qpanel.h"
#include "model/quant.h"
#include "model/safetensors.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* The fused kernels below must round exactly like model/quant.c: products
 * and differences stay separate operations. */
#pragma GCC optimize("fp-contract=off")

/* Per-thread panel (256 KiB), static TLS: part of each thread's TLS block,
 * so it goes with the thread (nothing to free). */
static __thread float tl_panel[KE_QGEMM_MAX_K] __attribute__((aligned(64)));

int ke_qgemm_handles(const struct ke_mat *w)
{
	return kv_dtype_is_quant(w->dtype) || w->dtype == KV_DT_F16;
}

static const uint8_t *row_ptr(const struct ke_mat *w, int r)
{
	return (const uint8_t *)w->data + (size_t)r * (size_t)kv_dtype_row_bytes(w->dtype, (uint64_t)w->ld);
}

void ke_qgemm_row(const struct ke_mat *w, int r, float *out)
{
	kq_dequant_row(w->dtype, row_ptr(w, r), out, (size_t)w->cols);
}

#if defined(__x86_64__)
/*
 * Fused AVX2 GEMV for small M (decode): each group of 16 weights is
 * dequantized in registers -- the same float operations as model/quant.c,
 * so the same values -- and multiplied into the 16 lane accumulators in
 * the canonical order of gemm.h (lanes 0-7 in one register, 8-15 in
 * another, then the fixed tree), so results equal the panel path bit for
 * bit. Types: every block type but Q8_K (the rest takes the panel path);
 * an AVX-512 twin follows for Q8_0, Q4_K and Q6_K.
 */
#define TGT2 __attribute__((target("avx2,fma,f16c")))
#define FMR 4

TGT2 static inline float q_hsum(__m256 lo, __m256 hi)
{
	__m256 t = _mm256_add_ps(lo, hi);
	__m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
	__m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
	__m128 r = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
	return _mm_cvtss_f32(r);
}

static inline float q_h2f(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return kv_f16_to_f32(h);
}

/* 16 unsigned byte values -> two vectors of floats. */
TGT2 static inline void u8x16_f(__m128i b, __m256 *lo, __m256 *hi)
{
	*lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
	*hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)));
}

TGT2 static inline void s8x16_f(__m128i b, __m256 *lo, __m256 *hi)
{
	*lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
	*hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
}

struct facc {
	__m256 lo[FMR], hi[FMR];
};

TGT2 static inline void f_acc(struct facc *a, int mr, const float *x, size_t ldx, int k, __m256 wl, __m256 wh)
{
	for (int i = 0; i < mr; i++) {
		a->lo[i] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (size_t)i * ldx + k), wl, a->lo[i]);
		a->hi[i] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (size_t)i * ldx + k + 8), wh, a->hi[i]);
	}
}

TGT2 static void fused_row(int dt, const uint8_t *row, int K, const float *x, size_t ldx, int mr, float *out)
{
	struct facc a;
	for (int i = 0; i < FMR; i++)
		a.lo[i] = a.hi[i] = _mm256_setzero_ps();
	__m256 wl, wh;
	if (dt == KV_DT_Q8_0) {
		for (int b = 0; b < K / 32; b++) {
			const uint8_t *blk = row + (size_t)b * 34;
			__m256 d = _mm256_set1_ps(q_h2f(blk));
			for (int g = 0; g < 2; g++) {
				s8x16_f(_mm_loadu_si128((const __m128i *)(blk + 2 + 16 * g)), &wl, &wh);
				f_acc(&a, mr, x, ldx, 32 * b + 16 * g, _mm256_mul_ps(wl, d), _mm256_mul_ps(wh, d));
			}
		}
	} else if (dt == KV_DT_Q4_0 || dt == KV_DT_Q5_0) {
		/* element j: low nibble of qs[j] (j < 16) or high nibble of qs[j-16],
		 * Q5_0's 5th bit from bit j of qh; minus 8 / 16, times d */
		const int q5 = dt == KV_DT_Q5_0;
		const size_t bb = q5 ? 22 : 18;
		const __m128i m4 = _mm_set1_epi8(0x0F), off = _mm_set1_epi8(q5 ? 16 : 8);
		const __m128i sel = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
		const __m128i bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
		for (int b = 0; b < K / 32; b++) {
			const uint8_t *blk = row + (size_t)b * bb, *qs = blk + (q5 ? 6 : 2);
			__m256 d = _mm256_set1_ps(q_h2f(blk));
			uint32_t qh = 0;
			if (q5)
				memcpy(&qh, blk + 2, 4);
			__m128i raw = _mm_loadu_si128((const __m128i *)qs);
			for (int g = 0; g < 2; g++) {
				__m128i v = g ? _mm_and_si128(_mm_srli_epi16(raw, 4), m4) : _mm_and_si128(raw, m4);
				if (q5) {
					__m128i hb = _mm_shuffle_epi8(_mm_set1_epi16((short)(qh >> (16 * g))), sel);
					hb = _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(hb, bit), bit), _mm_set1_epi8(0x10));
					v = _mm_or_si128(v, hb);
				}
				s8x16_f(_mm_sub_epi8(v, off), &wl, &wh);
				f_acc(&a, mr, x, ldx, 32 * b + 16 * g, _mm256_mul_ps(wl, d), _mm256_mul_ps(wh, d));
			}
		}
	} else if (dt == KV_DT_Q4_1 || dt == KV_DT_Q5_1) {
		/* as Q4_0 / Q5_0, unsigned codes, then (q * d) + m as dq_q4_1 */
		const int q5 = dt == KV_DT_Q5_1;
		const size_t bb = q5 ? 24 : 20;
		const __m128i m4 = _mm_set1_epi8(0x0F);
		const __m128i sel = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
		const __m128i bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
		for (int b = 0; b < K / 32; b++) {
			const uint8_t *blk = row + (size_t)b * bb, *qs = blk + (q5 ? 8 : 4);
			const __m256 d = _mm256_set1_ps(q_h2f(blk)), mn = _mm256_set1_ps(q_h2f(blk + 2));
			uint32_t qh = 0;
			if (q5)
				memcpy(&qh, blk + 4, 4);
			__m128i raw = _mm_loadu_si128((const __m128i *)qs);
			for (int g = 0; g < 2; g++) {
				__m128i v = g ? _mm_and_si128(_mm_srli_epi16(raw, 4), m4) : _mm_and_si128(raw, m4);
				if (q5) {
					__m128i hb = _mm_shuffle_epi8(_mm_set1_epi16((short)(qh >> (16 * g))), sel);
					hb = _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(hb, bit), bit), _mm_set1_epi8(0x10));
					v = _mm_or_si128(v, hb);
				}
				u8x16_f(v, &wl, &wh);
				f_acc(&a, mr, x, ldx, 32 * b + 16 * g, _mm256_add_ps(_mm256_mul_ps(wl, d), mn),
				      _mm256_add_ps(_mm256_mul_ps(wh, d), mn));
			}
		}
	} else if (dt == KV_DT_Q5_K) {
		/* Q4_K's steps with the 5th bit: bit 2c + h of qh[l] */
		const __m128i m4 = _mm_set1_epi8(0x0F), one = _mm_set1_epi8(1);
		for (int b = 0; b < K / 256; b++) {
			const uint8_t *blk = row + (size_t)b * 176, *scales = blk + 4, *qh = blk + 16, *q = blk + 48;
			const float d = q_h2f(blk), min = q_h2f(blk + 2);
			for (int c = 0; c < 4; c++) {
				for (int h = 0; h < 2; h++) {
					int j = 2 * c + h;
					uint8_t sc, mm;
					kq_scale_min_k4(scales, j, &sc, &mm);
					__m256 dv = _mm256_set1_ps(d * (float)sc), mv = _mm256_set1_ps(min * (float)mm);
					for (int s = 0; s < 2; s++) {
						__m128i raw = _mm_loadu_si128((const __m128i *)(q + 32 * c + 16 * s));
						__m128i nib = h ? _mm_and_si128(_mm_srli_epi16(raw, 4), m4) : _mm_and_si128(raw, m4);
						__m128i hb = _mm_loadu_si128((const __m128i *)(qh + 16 * s));
						hb = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(hb, j), one), 4);
						u8x16_f(_mm_or_si128(nib, hb), &wl, &wh);
						f_acc(&a, mr, x, ldx, 256 * b + 64 * c + 32 * h + 16 * s,
						      _mm256_sub_ps(_mm256_mul_ps(dv, wl), mv), _mm256_sub_ps(_mm256_mul_ps(dv, wh), mv));
					}
				}
			}
		}
	} else if (dt == KV_DT_Q2_K || dt == KV_DT_Q3_K) {
		/* group (n, j, h) of 16: element 128 n + 32 j + 16 h + l from bits
		 * 2j of q[32 n + 16 h + l]; Q2_K (dl q) - ml, Q3_K dl (q | hbit << 2) - 4 dl
		 * as dl * (code - 4 * !hbit), the products of model/quant.c */
		const int q3 = dt == KV_DT_Q3_K;
		const __m128i m3 = _mm_set1_epi8(3), one = _mm_set1_epi8(1), four = _mm_set1_epi8(4);
		for (int b = 0; b < K / 256; b++) {
			const uint8_t *blk = row + (size_t)b * (q3 ? 110 : 84);
			int8_t s3[16];
			float d, min = 0.0f;
			if (q3) {
				const uint32_t km1 = 0x03030303u, km2 = 0x0f0f0f0fu;
				uint32_t aux[4];
				memcpy(aux, blk + 96, 12);
				uint32_t tmp = aux[2];
				aux[2] = ((aux[0] >> 4) & km2) | (((tmp >> 4) & km1) << 4);
				aux[3] = ((aux[1] >> 4) & km2) | (((tmp >> 6) & km1) << 4);
				aux[0] = (aux[0] & km2) | (((tmp >> 0) & km1) << 4);
				aux[1] = (aux[1] & km2) | (((tmp >> 2) & km1) << 4);
				memcpy(s3, aux, 16);
				d = q_h2f(blk + 108);
			} else {
				d = q_h2f(blk + 80);
				min = q_h2f(blk + 82);
			}
			const uint8_t *qs = blk + (q3 ? 32 : 16);
			for (int n = 0; n < 2; n++) {
				for (int j = 0; j < 4; j++) {
					for (int h = 0; h < 2; h++) {
						const int is = 8 * n + 2 * j + h;
						__m128i v = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(qs + 32 * n + 16 * h)), 2 * j), m3);
						__m256 dv, mv = _mm256_setzero_ps();
						if (q3) {
							__m128i hb = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(blk + 16 * h)), 4 * n + j), one);
							v = _mm_sub_epi8(_mm_or_si128(v, _mm_slli_epi16(hb, 2)), four);
							s8x16_f(v, &wl, &wh);
							dv = _mm256_set1_ps(d * (float)(s3[is] - 32));
							f_acc(&a, mr, x, ldx, 256 * b + 128 * n + 32 * j + 16 * h, _mm256_mul_ps(dv, wl),
							      _mm256_mul_ps(dv, wh));
						} else {
							u8x16_f(v, &wl, &wh);
							dv = _mm256_set1_ps(d * (float)(blk[is] & 0xF));
							mv = _mm256_set1_ps(min * (float)(blk[is] >> 4));
							f_acc(&a, mr, x, ldx, 256 * b + 128 * n + 32 * j + 16 * h,
							      _mm256_sub_ps(_mm256_mul_ps(dv, wl), mv), _mm256_sub_ps(_mm256_mul_ps(dv, wh), mv));
						}
					}
				}
			}
		}
	} else if (dt == KV_DT_F16) {
		for (int k = 0; k < K; k += 16) {
			__m128i h0 = _mm_loadu_si128((const __m128i *)(row + 2 * (size_t)k)),
				h1 = _mm_loadu_si128((const __m128i *)(row + 2 * (size_t)k + 16));
			f_acc(&a, mr, x, ldx, k, _mm256_cvtph_ps(h0), _mm256_cvtph_ps(h1)); /* exact widening */
		}
	} else if (dt == KV_DT_Q4_K) {
		const __m128i m4 = _mm_set1_epi8(0x0F);
		for (int b = 0; b < K / 256; b++) {
			const uint8_t *blk = row + (size_t)b * 144, *scales = blk + 4, *q = blk + 16;
			const float d = q_h2f(blk), min = q_h2f(blk + 2);
			for (int c = 0; c < 4; c++) {
				for (int h = 0; h < 2; h++) {
					int j = 2 * c + h;
					uint8_t sc, mm;
					kq_scale_min_k4(scales, j, &sc, &mm);
					__m256 dv = _mm256_set1_ps(d * (float)sc), mv = _mm256_set1_ps(min * (float)mm);
					for (int s = 0; s < 2; s++) {
						__m128i raw = _mm_loadu_si128((const __m128i *)(q + 32 * c + 16 * s));
						__m128i nib = h ? _mm_and_si128(_mm_srli_epi16(raw, 4), m4) : _mm_and_si128(raw, m4);
						u8x16_f(nib, &wl, &wh);
						f_acc(&a, mr, x, ldx, 256 * b + 64 * c + 32 * h + 16 * s,
						      _mm256_sub_ps(_mm256_mul_ps(dv, wl), mv), _mm256_sub_ps(_mm256_mul_ps(dv, wh), mv));
					}
				}
			}
		}
	} else { /* KV_DT_Q6_K */
		const __m128i m4 = _mm_set1_epi8(0x0F), m3 = _mm_set1_epi8(3), o32 = _mm_set1_epi8(32);
		for (int b = 0; b < K / 256; b++) {
			const uint8_t *blk = row + (size_t)b * 210;
			const int8_t *sc = (const int8_t *)(blk + 192);
			const float d = q_h2f(blk + 208);
			for (int n = 0; n < 2; n++) {
				const uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
				const int8_t *s8 = sc + 8 * n;
				for (int part = 0; part < 4; part++) { /* y[l + 32 part], l in 0..31 */
					for (int s = 0; s < 2; s++) {
						int l0 = 16 * s;
						__m128i lo = _mm_loadu_si128((const __m128i *)(ql + l0 + ((part & 1) ? 32 : 0)));
						__m128i hb = _mm_loadu_si128((const __m128i *)(qh + l0));
						__m128i low = (part < 2) ? _mm_and_si128(lo, m4) : _mm_and_si128(_mm_srli_epi16(lo, 4), m4);
						__m128i hi2 = _mm_and_si128(_mm_srli_epi16(hb, 2 * part), m3);
						__m128i q = _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(hi2, 4)), o32);
						s8x16_f(q, &wl, &wh);
						__m256 dv = _mm256_set1_ps(d * (float)s8[2 * part + s]);
						f_acc(&a, mr, x, ldx, 256 * b + 128 * n + 32 * part + l0, _mm256_mul_ps(dv, wl),
						      _mm256_mul_ps(dv, wh));
					}
				}
			}
		}
	}
	for (int i = 0; i < mr; i++)
		out[i] = q_hsum(a.lo[i], a.hi[i]);
}

/* The same with one 16-lane register per row (AVX-512): lane j holds what
 * lanes j of the AVX2 pair hold, the tree is gemm.h's, so the results are
 * the AVX2 kernel's bit for bit. */
#define TGT5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))

TGT5 static inline float q_hsum5(__m512 a)
{
	__m256 t = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
	__m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
	__m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
	__m128 r = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
	return _mm_cvtss_f32(r);
}

TGT5 static inline void f_acc5(__m512 *a, int mr, const float *x, size_t ldx, int k, __m512 wv)
{
	for (int i = 0; i < mr; i++)
		a[i] = _mm512_fmadd_ps(_mm512_loadu_ps(x + (size_t)i * ldx + k), wv, a[i]);
}

TGT5 static void fused_row5(int dt, const uint8_t *row, int K, const float *x, size_t ldx, int mr, float *out)
{
	__m512 a[FMR];
	for (int i = 0; i < FMR; i++)
		a[i] = _mm512_setzero_ps();
	if (dt == KV_DT_Q8_0) {
		for (int b = 0; b < K / 32; b++) {
			const uint8_t *blk = row + (size_t)b * 34;
			__m512 d = _mm512_set1_ps(q_h2f(blk));
			for (int g = 0; g < 2; g++) {
				__m128i q = _mm_loadu_si128((const __m128i *)(blk + 2 + 16 * g));
				f_acc5(a, mr, x, ldx, 32 * b + 16 * g, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d));
			}
		}
	} else if (dt == KV_DT_Q4_K) {
		const __m128i m4 = _mm_set1_epi8(0x0F);
		for (int b = 0; b < K / 256; b++) {
			const uint8_t *blk = row + (size_t)b * 144, *scales = blk + 4, *q = blk + 16;
			const float d = q_h2f(blk), min = q_h2f(blk + 2);
			for (int c = 0; c < 4; c++) {
				for (int h = 0; h < 2; h++) {
					int j = 2 * c + h;
					uint8_t sc, mm;
					kq_scale_min_k4(scales, j, &sc, &mm);
					__m512 dv = _mm512_set1_ps(d * (float)sc), mv = _mm512_set1_ps(min * (float)mm);
					for (int s = 0; s < 2; s++) {
						__m128i raw = _mm_loadu_si128((const __m128i *)(q + 32 * c + 16 * s));
						__m128i nib = h ? _mm_and_si128(_mm_srli_epi16(raw, 4), m4) : _mm_and_si128(raw, m4);
						__m512 wf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(nib));
						f_acc5(a, mr, x, ldx, 256 * b + 64 * c + 32 * h + 16 * s,
						       _mm512_sub_ps(_mm512_mul_ps(dv, wf), mv));
					}
				}
			}
		}
	} else { /* KV_DT_Q6_K */
		const __m128i m4 = _mm_set1_epi8(0x0F), m3 = _mm_set1_epi8(3), o32 = _mm_set1_epi8(32);
		for (int b = 0; b < K / 256; b++) {
			const uint8_t *blk = row + (size_t)b * 210;
			const int8_t *sc = (const int8_t *)(blk + 192);
			const float d = q_h2f(blk + 208);
			for (int n = 0; n < 2; n++) {
				const uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
				const int8_t *s8 = sc + 8 * n;
				for (int part = 0; part < 4; part++) {
					for (int s = 0; s < 2; s++) {
						int l0 = 16 * s;
						__m128i lo = _mm_loadu_si128((const __m128i *)(ql + l0 + ((part & 1) ? 32 : 0)));
						__m128i hb = _mm_loadu_si128((const __m128i *)(qh + l0));
						__m128i low = (part < 2) ? _mm_and_si128(lo, m4) : _mm_and_si128(_mm_srli_epi16(lo, 4), m4);
						__m128i hi2 = _mm_and_si128(_mm_srli_epi16(hb, 2 * part), m3);
						__m128i q = _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(hi2, 4)), o32);
						__m512 dv = _mm512_set1_ps(d * (float)s8[2 * part + s]);
						f_acc5(a, mr, x, ldx, 256 * b + 128 * n + 32 * part + l0,
						       _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))));
					}
				}
			}
		}
	}
	for (int i = 0; i < mr; i++)
		out[i] = q_hsum5(a[i]);
}
#endif

static int fused_type(int dt)
{
	return dt == KV_DT_Q8_0 || dt == KV_DT_Q4_K || dt == KV_DT_Q6_K || dt == KV_DT_Q4_0 || dt == KV_DT_Q5_0 ||
	       dt == KV_DT_Q4_1 || dt == KV_DT_Q5_1 || dt == KV_DT_Q5_K || dt == KV_DT_Q2_K || dt == KV_DT_Q3_K ||
	       dt == KV_DT_F16;
}

/* Types with an AVX-512 twin (the others run the AVX2 kernel there). */
static int fused5_type(int dt)
{
	return dt == KV_DT_Q8_0 || dt == KV_DT_Q4_K || dt == KV_DT_Q6_K;
}

/* ---- the integer path (qdot.h): activations quantized per row ---- */

int ke_qgemm_int(const struct ke_mat *w)
{
	return w->qdot && ke_qdot_block(w->dtype) > 0;
}

/* Activation rows quantized at a time: about 1 MiB of them, so the piece
 * stays in L2 while the weight panels stream by (each panel is repacked
 * once per piece): 16..512 rows. */
static int qpiece(size_t rb)
{
	size_t p = ((size_t)1 << 20) / rb;
	return p < 16 ? 16 : p > 512 ? 512 : (int)p;
}

/* Per-thread buffer of quantized rows, 64-byte aligned, grown as needed
 * (base/mem.h kv_tls_scratch). */
static uint8_t *act_buf(size_t bytes)
{
	return kv_tls_scratch(KV_TLS_QGEMM_ACT, bytes);
}

static void act_quant(int isa, const struct ke_mat *w, const float *x, size_t ldx, int m, uint8_t *a, size_t rb)
{
	int blk = ke_qdot_block(w->dtype);
	for (int i = 0; i < m; i++)
		ke_qact_quant(isa, blk, x + (size_t)i * ldx, w->cols, a + (size_t)i * rb);
}

/* Outputs [n0, n1) of m quantized rows a (stride rb): the prepacked
 * panels from the first panel boundary on when the matrix has them and
 * the path takes them, the rows otherwise (same numbers). */
static void qdot_run(int isa, const struct ke_mat *w, const uint8_t *a, size_t rb, int m, float *y, size_t ldy,
		     unsigned flags, int n0, int n1)
{
	const size_t ws = (size_t)kv_dtype_row_bytes(w->dtype, (uint64_t)w->ld);
	const int accum = (flags & KE_GEMM_ACCUM) != 0;
	if (w->panels && n1 > n0) {
		int h = n0 % 16 ? n0 + 16 - n0 % 16 : n0;
		h = h < n1 ? h : n1;
		ke_qdot_gemm(isa, w->dtype, w->data, ws, w->cols, a, rb, m, y, ldy, accum, n0, h);
		if (h == n1 || ke_qpanel_gemm_pre(isa, w->dtype, w->panels, w->cols, a, rb, m, y, ldy, accum, h, n1))
			return;
		n0 = h;
	}
	ke_qdot_gemm(isa, w->dtype, w->data, ws, w->cols, a, rb, m, y, ldy, accum, n0, n1);
}

struct qjob {
	int isa;
	const struct ke_mat *w;
	const uint8_t *a;
	size_t rb;
	int m;
	float *y;
	size_t ldy;
	unsigned flags;
};

static void qjob_part(void *ctx, size_t b, size_t e, int thread)
{
	const struct qjob *j = ctx;
	(void)thread;
	qdot_run(j->isa, j->w, j->a, j->rb, j->m, j->y, j->ldy, j->flags, (int)b, (int)e);
}

void ke_qgemm(const struct ke_mat *w, const float *x, size_t ldx, int m, float *y, size_t ldy, unsigned flags)
{
	const int isa = ke_isa();
	double t0 = ke_prof_t0();
	size_t rb = ke_qact_row_bytes(ke_qdot_block(w->dtype), w->cols);
	const int qp = qpiece(rb);
	int piece = m < qp ? m : qp;
	uint8_t *a = act_buf((size_t)piece * rb);
	if (!a) { /* no scratch: the same numbers, computed chunk by chunk */
		ke_qgemm_range(isa, w, x, ldx, m, y, ldy, flags, 0, w->rows);
		return;
	}
	for (int i0 = 0; i0 < m; i0 += qp) {
		int mp = m - i0 < qp ? m - i0 : qp;
		act_quant(isa, w, x + (size_t)i0 * ldx, ldx, mp, a, rb);
		struct qjob j = {isa, w, a, rb, mp, y + (size_t)i0 * ldy, ldy, flags};
		double work = (double)mp * w->rows * w->cols;
		if (work < KE_PAR_MIN_WORK) {
			qjob_part(&j, 0, (size_t)w->rows, 0);
		} else {
			/* chunks of whole 16-row panels, about four per thread */
			size_t per = (size_t)w->rows / (4u * (size_t)kv_pool_size(kv_pool_global())) + 1;
			per = (per + 15) / 16 * 16;
			kv_pool_for(kv_pool_global(), (size_t)w->rows, per, qjob_part, &j);
		}
	}
	ke_prof_add(KE_PROF_GEMM, t0, 2.0 * m * w->rows * w->cols, (double)ke_mat_bytes(w));
}

void ke_qgemm_range(int isa, const struct ke_mat *w, const float *x, size_t ldx, int m, float *y, size_t ldy,
		    unsigned flags, int n0, int n1)
{
	const int K = w->cols;
	if (ke_qgemm_int(w) && m > 0 && n1 > n0) {
		size_t rb = ke_qact_row_bytes(ke_qdot_block(w->dtype), K);
		const int qp = qpiece(rb);
		int piece = m < qp ? m : qp;
		uint8_t *a = act_buf((size_t)piece * rb);
		if (!a) { /* no scratch: one row at a time in the panel (it holds a
			   * row of KE_QGEMM_MAX_K codes with their scales), same numbers */
			a = (uint8_t *)tl_panel;
			piece = 1;
		}
		for (int i0 = 0; i0 < m; i0 += piece) {
			int mp = m - i0 < piece ? m - i0 : piece;
			act_quant(isa, w, x + (size_t)i0 * ldx, ldx, mp, a, rb);
			qdot_run(isa, w, a, rb, mp, y + (size_t)i0 * ldy, ldy, flags, n0, n1);
		}
		return;
	}
#if defined(__x86_64__)
	if (isa > ke_isa_best())
		isa = ke_isa_best();
	/* F16 needs F16C (every AVX2 CPU we know has it; checked anyway) and
	 * whole 16-element groups (block types always have them). */
	if (isa >= KE_ISA_AVX2 && m <= FMR && fused_type(w->dtype) && m > 0 &&
	    (w->dtype != KV_DT_F16 || (K % 16 == 0 && ke_isa_has_f16c()))) {
		for (int n = n0; n < n1; n++) {
			float r[FMR];
			if (isa == KE_ISA_AVX512 && fused5_type(w->dtype))
				fused_row5(w->dtype, row_ptr(w, n), K, x, ldx, m, r);
			else
				fused_row(w->dtype, row_ptr(w, n), K, x, ldx, m, r);
			for (int i = 0; i < m; i++) {
				float *yo = y + (size_t)i * ldy + n;
				*yo = (flags & KE_GEMM_ACCUM) ? *yo + r[i] : r[i];
			}
		}
		return;
	}
#endif
	int P = KE_QGEMM_MAX_K / (K > 0 ? K : 1);
	if (P < 1 || m <= 0 || n1 <= n0)
		return; /* K > KE_QGEMM_MAX_K is refused at model load */
	if (P > 48)
		P = 48;
	for (int n = n0; n < n1; n += P) {
		int p = n1 - n < P ? n1 - n : P;
		for (int r = 0; r < p; r++)
			kq_dequant_row(w->dtype, row_ptr(w, n + r), tl_panel + (size_t)r * (size_t)K, (size_t)K);
		struct ke_mat f = {tl_panel, KV_DT_F32, p, K, (size_t)K};
		ke_gemm_dense_range(isa, &f, x, ldx, m, y + n, ldy, flags, 0, p);
	}
}
