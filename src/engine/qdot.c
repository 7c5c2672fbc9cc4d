/*
 * qdot.c - see qdot.h. The scalar functions are the definition; the AVX2
 * and AVX-512 (VNNI) kernels compute the same integers (exact, in any
 * order) and the same float operations in the same order.
 */
#include "engine/qdot.h"
#include "engine/isa.h"
#include "model/quant.h"
#include "model/safetensors.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* The float operations are the ones written: no contraction into FMAs. */
#pragma GCC optimize("fp-contract=off")

int ke_qdot_block(int dt)
{
	if (dt == KV_DT_Q8_0)
		return 32;
	if (dt == KV_DT_Q4_K || dt == KV_DT_Q6_K)
		return 256;
	return 0;
}

size_t ke_qact_row_bytes(int block, int K)
{
	size_t b = (size_t)K + (size_t)(K / block) * 4 + (block == 256 ? (size_t)(K / 16) * 2 : 0);
	return (b + 63) & ~(size_t)63;
}

/* Where the scales and sums of a row start. */
static inline float *row_d(uint8_t *row, int K)
{
	return (float *)(row + K);
}

static inline int16_t *row_bs(uint8_t *row, int block, int K)
{
	return (int16_t *)(row + K + (size_t)(K / block) * 4);
}

static inline float h2f(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return kv_f16_to_f32(h);
}

/* The block's scale from the exact |x| maximum (as bits); 0 when the codes
 * are all zero, with *id the multiplier for the codes. */
static inline float block_scale(uint32_t mb, float *id, int *zero)
{
	float d;
	*zero = 1;
	*id = 0.0f;
	if (mb >= 0x7f800000u) { /* inf or NaN in the block */
		uint32_t nan = 0x7fc00000u;
		memcpy(&d, &nan, 4);
		return d;
	}
	if (mb < 0x00800000u) /* zero or subnormal: nothing worth a code */
		return 0.0f;
	float amax;
	memcpy(&amax, &mb, 4);
	*zero = 0;
	*id = 127.0f / amax;
	return amax / 127.0f;
}

static void quant_scalar(int block, const float *x, int K, uint8_t *row)
{
	int8_t *q = (int8_t *)row;
	float *d = row_d(row, K);
	for (int b = 0; b < K / block; b++) {
		const float *xb = x + (size_t)b * block;
		uint32_t mb = 0;
		for (int k = 0; k < block; k++) {
			uint32_t u;
			memcpy(&u, &xb[k], 4);
			u &= 0x7fffffffu;
			mb = u > mb ? u : mb;
		}
		float id;
		int zero;
		d[b] = block_scale(mb, &id, &zero);
		for (int k = 0; k < block; k++) {
			long r = zero ? 0 : lrintf(xb[k] * id);
			q[(size_t)b * block + k] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
		}
	}
}

static void fill_bsums(int block, int K, uint8_t *row)
{
	if (block != 256)
		return;
	const int8_t *q = (const int8_t *)row;
	int16_t *bs = row_bs(row, block, K);
	for (int g = 0; g < K / 16; g++) {
		int s = 0;
		for (int k = 0; k < 16; k++)
			s += q[16 * g + k];
		bs[g] = (int16_t)s;
	}
}

#if defined(__x86_64__)
#define TGT2 __attribute__((target("avx2,fma,f16c")))

/* Same as quant_scalar: integer max of the magnitudes' bits, the scalar
 * divisions, products rounded to nearest even by cvtps (the default MXCSR
 * mode, what lrintf uses), clamped to [-127, 127]. */
TGT2 static void quant_avx2(int block, const float *x, int K, uint8_t *row)
{
	int8_t *q = (int8_t *)row;
	float *d = row_d(row, K);
	const __m256i mask = _mm256_set1_epi32(0x7fffffff), lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
	const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
	for (int b = 0; b < K / block; b++) {
		const float *xb = x + (size_t)b * block;
		__m256i m = _mm256_setzero_si256();
		for (int k = 0; k < block; k += 8)
			m = _mm256_max_epi32(m, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(xb + k)), mask));
		__m128i m4 = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
		m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0x4e));
		m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0xb1));
		float id;
		int zero;
		d[b] = block_scale((uint32_t)_mm_cvtsi128_si32(m4), &id, &zero);
		int8_t *qb = q + (size_t)b * block;
		if (zero) {
			memset(qb, 0, (size_t)block);
			continue;
		}
		const __m256 idv = _mm256_set1_ps(id);
		for (int k = 0; k < block; k += 32) {
			__m256i v[4];
			for (int t = 0; t < 4; t++) {
				__m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + k + 8 * t), idv));
				v[t] = _mm256_min_epi32(_mm256_max_epi32(r, lo), hi);
			}
			__m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
			_mm256_storeu_si256((__m256i *)(qb + k), _mm256_permutevar8x32_epi32(p, perm));
		}
	}
}

/* gemm.h's tree over 16 lanes held as two registers (lanes 0-7, 8-15). */
TGT2 static inline float hsum16(__m256 lo, __m256 hi)
{
	__m256 t = _mm256_add_ps(lo, hi);
	__m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
	__m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
	return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}

/* The K types' tree over 8 lanes: (lanes j + j+4), then (+ j+2), then 0 + 1. */
TGT2 static inline float hsum8(__m256 a)
{
	__m128 u = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
	__m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
	return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}

TGT2 static inline int hsum_i32(__m256i v)
{
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
	return _mm_cvtsi128_si32(s);
}

/* int32 lane l = sum of the 4 products u[4l..4l+3] * s[4l..4l+3] (u
 * unsigned, s signed, pair sums within int16: callers keep |u| <= 128,
 * |s| <= 127). */
TGT2 static inline __m256i dot4_avx2(__m256i u, __m256i s)
{
	return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

#define Q8_BODY(DOT4)                                                                                              \
	do {                                                                                                       \
		__m256 acc[KE_QDOT_MR][2];                                                                         \
		for (int i = 0; i < KE_QDOT_MR; i++)                                                              \
			acc[i][0] = acc[i][1] = _mm256_setzero_ps();                                               \
		const size_t doff = (size_t)K;                                                                     \
		for (int b = 0; b < nb; b++) {                                                                     \
			const uint8_t *blk = wrow + (size_t)b * 34;                                                \
			const __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 2));                           \
			const __m256i aw = _mm256_abs_epi8(w);                                                      \
			const float dw = h2f(blk);                                                                 \
			const int h = b & 1;                                                                       \
			for (int i = 0; i < mr; i++) {                                                             \
				const uint8_t *xr = arow + (size_t)i * astride;                                    \
				__m256i xv = _mm256_load_si256((const __m256i *)(xr + 32 * (size_t)b));             \
				__m256i p = DOT4(aw, _mm256_sign_epi8(xv, w));                                      \
				float dx;                                                                          \
				memcpy(&dx, xr + doff + 4 * (size_t)b, 4);                                         \
				__m256 s = _mm256_set1_ps(dw * dx);                                                \
				acc[i][h] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), acc[i][h]);                  \
			}                                                                                          \
		}                                                                                                  \
		for (int i = 0; i < mr; i++)                                                                       \
			out[i] = hsum16(acc[i][0], acc[i][1]);                                                     \
	} while (0)

TGT2 static void q8_0_avx2(const uint8_t *wrow, int K, const uint8_t *arow, size_t astride, int mr, float *out)
{
	const int nb = K / 32;
	Q8_BODY(dot4_avx2);
}

#define TGT5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
TGT5 static inline __m256i dot4_vnni(__m256i u, __m256i s)
{
	return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

TGT5 static void q8_0_vnni(const uint8_t *wrow, int K, const uint8_t *arow, size_t astride, int mr, float *out)
{
	const int nb = K / 32;
	Q8_BODY(dot4_vnni);
}

/* Q4_K's 6-bit scale and min of slice j (ggml's get_scale_min_k4). */
static inline void q4k_sm(const uint8_t *scales, int j, int *sc, int *mm)
{
	if (j < 4) {
		*sc = scales[j] & 63;
		*mm = scales[j + 4] & 63;
	} else {
		*sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
		*mm = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
	}
}

TGT2 static void q4_k_avx2(const uint8_t *wrow, int K, const uint8_t *arow, size_t astride, int mr, float *out)
{
	const int nb = K / 256;
	const __m256i m4 = _mm256_set1_epi8(0x0F);
	__m256 acc[KE_QDOT_MR];
	float c[KE_QDOT_MR];
	for (int i = 0; i < KE_QDOT_MR; i++) {
		acc[i] = _mm256_setzero_ps();
		c[i] = 0.0f;
	}
	for (int b = 0; b < nb; b++) {
		const uint8_t *blk = wrow + (size_t)b * 144, *qs = blk + 16;
		const float d = h2f(blk), dmin = h2f(blk + 2);
		__m256i u[8], scv[8];
		int16_t mins[16];
		for (int j = 0; j < 8; j++) {
			int sc, mm;
			q4k_sm(blk + 4, j, &sc, &mm);
			scv[j] = _mm256_set1_epi16((short)sc);
			mins[2 * j] = mins[2 * j + 1] = (int16_t)mm;
		}
		for (int ch = 0; ch < 4; ch++) {
			__m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * ch));
			u[2 * ch] = _mm256_and_si256(raw, m4);
			u[2 * ch + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
		}
		const __m256i mv = _mm256_loadu_si256((const __m256i *)mins);
		for (int i = 0; i < mr; i++) {
			const uint8_t *xr = arow + (size_t)i * astride;
			const uint8_t *xq = xr + 256 * (size_t)b;
			__m256i S = _mm256_setzero_si256();
			for (int j = 0; j < 8; j++) {
				__m256i xv = _mm256_load_si256((const __m256i *)(xq + 32 * j));
				S = _mm256_add_epi32(S, _mm256_madd_epi16(_mm256_maddubs_epi16(u[j], xv), scv[j]));
			}
			float dx;
			memcpy(&dx, xr + K + 4 * (size_t)b, 4);
			const __m256i bs = _mm256_loadu_si256((const __m256i *)(xr + K + (size_t)(K / 256) * 4 + 32 * (size_t)b));
			int C = hsum_i32(_mm256_madd_epi16(mv, bs));
			acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(S), acc[i]);
			c[i] = fmaf(dmin * dx, (float)C, c[i]);
		}
	}
	for (int i = 0; i < mr; i++)
		out[i] = hsum8(acc[i]) - c[i];
}

TGT2 static void q6_k_avx2(const uint8_t *wrow, int K, const uint8_t *arow, size_t astride, int mr, float *out)
{
	const int nb = K / 256;
	const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
	__m256 acc[KE_QDOT_MR];
	float c[KE_QDOT_MR];
	for (int i = 0; i < KE_QDOT_MR; i++) {
		acc[i] = _mm256_setzero_ps();
		c[i] = 0.0f;
	}
	for (int b = 0; b < nb; b++) {
		const uint8_t *blk = wrow + (size_t)b * 210;
		const int8_t *sc = (const int8_t *)(blk + 192);
		const float d = h2f(blk + 208);
		__m256i u[8], scv[8];
		int16_t s16[16];
		for (int g = 0; g < 16; g++)
			s16[g] = sc[g];
		for (int n = 0; n < 2; n++) {
			const uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
			const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
			for (int part = 0; part < 4; part++) {
				__m256i lo = _mm256_loadu_si256((const __m256i *)(ql + ((part & 1) ? 32 : 0)));
				__m256i low = part < 2 ? _mm256_and_si256(lo, m4) : _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4);
				__m256i hi2 = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * part), m3);
				int s = 4 * n + part;
				u[s] = _mm256_or_si256(low, _mm256_slli_epi16(hi2, 4));
				scv[s] = _mm256_set_m128i(_mm_set1_epi16(s16[2 * s + 1]), _mm_set1_epi16(s16[2 * s]));
			}
		}
		const __m256i sv = _mm256_loadu_si256((const __m256i *)s16);
		for (int i = 0; i < mr; i++) {
			const uint8_t *xr = arow + (size_t)i * astride;
			const uint8_t *xq = xr + 256 * (size_t)b;
			__m256i S = _mm256_setzero_si256();
			for (int j = 0; j < 8; j++) {
				__m256i xv = _mm256_load_si256((const __m256i *)(xq + 32 * j));
				S = _mm256_add_epi32(S, _mm256_madd_epi16(_mm256_maddubs_epi16(u[j], xv), scv[j]));
			}
			float dx;
			memcpy(&dx, xr + K + 4 * (size_t)b, 4);
			const __m256i bs = _mm256_loadu_si256((const __m256i *)(xr + K + (size_t)(K / 256) * 4 + 32 * (size_t)b));
			int C = 32 * hsum_i32(_mm256_madd_epi16(sv, bs));
			acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(S), acc[i]);
			c[i] = fmaf(d * dx, (float)C, c[i]);
		}
	}
	for (int i = 0; i < mr; i++)
		out[i] = hsum8(acc[i]) - c[i];
}
#endif

/* ---- scalar: the definition ---- */

static float tree16(float *a)
{
	for (int j = 0; j < 8; j++)
		a[j] += a[j + 8];
	for (int j = 0; j < 4; j++)
		a[j] += a[j + 4];
	for (int j = 0; j < 2; j++)
		a[j] += a[j + 2];
	return a[0] + a[1];
}

static float tree8(float *a, float c)
{
	for (int j = 0; j < 4; j++)
		a[j] += a[j + 4];
	for (int j = 0; j < 2; j++)
		a[j] += a[j + 2];
	return (a[0] + a[1]) - c;
}

static float q8_0_scalar(const uint8_t *wrow, int K, const uint8_t *xr)
{
	float a[16] = {0};
	const int8_t *xq = (const int8_t *)xr;
	for (int b = 0; b < K / 32; b++) {
		const uint8_t *blk = wrow + (size_t)b * 34;
		const int8_t *qw = (const int8_t *)(blk + 2), *qx = xq + 32 * (size_t)b;
		float dx;
		memcpy(&dx, xr + K + 4 * (size_t)b, 4);
		const float s = h2f(blk) * dx;
		for (int l = 0; l < 8; l++) {
			int p = 0;
			for (int t = 0; t < 4; t++)
				p += qw[4 * l + t] * qx[4 * l + t];
			float *al = &a[8 * (b & 1) + l];
			*al = fmaf(s, (float)p, *al);
		}
	}
	return tree16(a);
}

static float q4_k_scalar(const uint8_t *wrow, int K, const uint8_t *xr)
{
	float a[8] = {0}, c = 0.0f;
	const int nb = K / 256;
	for (int b = 0; b < nb; b++) {
		const uint8_t *blk = wrow + (size_t)b * 144, *qs = blk + 16;
		const int8_t *qx = (const int8_t *)xr + 256 * (size_t)b;
		const int16_t *bs = (const int16_t *)(xr + K + (size_t)nb * 4) + 16 * b;
		float dx;
		memcpy(&dx, xr + K + 4 * (size_t)b, 4);
		int S[8] = {0}, C = 0;
		for (int s = 0; s < 8; s++) {
			int sc, mm;
			q4k_sm(blk + 4, s, &sc, &mm);
			for (int l = 0; l < 8; l++) {
				int p = 0;
				for (int t = 0; t < 4; t++) {
					int e = 4 * l + t, v = qs[32 * (s / 2) + e];
					p += ((s & 1) ? v >> 4 : v & 15) * qx[32 * s + e];
				}
				S[l] += sc * p;
			}
			C += mm * (bs[2 * s] + bs[2 * s + 1]);
		}
		const float dd = h2f(blk) * dx, dm = h2f(blk + 2) * dx;
		for (int l = 0; l < 8; l++)
			a[l] = fmaf(dd, (float)S[l], a[l]);
		c = fmaf(dm, (float)C, c);
	}
	return tree8(a, c);
}

static float q6_k_scalar(const uint8_t *wrow, int K, const uint8_t *xr)
{
	float a[8] = {0}, c = 0.0f;
	const int nb = K / 256;
	for (int b = 0; b < nb; b++) {
		const uint8_t *blk = wrow + (size_t)b * 210;
		const int8_t *sc = (const int8_t *)(blk + 192);
		const int8_t *qx = (const int8_t *)xr + 256 * (size_t)b;
		const int16_t *bs = (const int16_t *)(xr + K + (size_t)nb * 4) + 16 * b;
		float dx;
		memcpy(&dx, xr + K + 4 * (size_t)b, 4);
		int S[8] = {0}, C = 0;
		for (int s = 0; s < 8; s++) {
			int n = s / 4, part = s % 4;
			const uint8_t *ql = blk + 64 * n + ((part & 1) ? 32 : 0), *qh = blk + 128 + 32 * n;
			for (int l = 0; l < 8; l++) {
				int p = 0;
				for (int t = 0; t < 4; t++) {
					int e = 4 * l + t;
					int low = part < 2 ? ql[e] & 15 : ql[e] >> 4;
					int u = low | (((qh[e] >> (2 * part)) & 3) << 4);
					p += u * qx[32 * s + e];
				}
				S[l] += sc[2 * s + (l >= 4)] * p;
			}
		}
		for (int g = 0; g < 16; g++)
			C += sc[g] * bs[g];
		C *= 32;
		const float dd = h2f(blk + 208) * dx;
		for (int l = 0; l < 8; l++)
			a[l] = fmaf(dd, (float)S[l], a[l]);
		c = fmaf(dd, (float)C, c);
	}
	return tree8(a, c);
}

static int have_vnni(void)
{
#if defined(__x86_64__)
	static int v = -1;
	if (v < 0)
		v = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") ? 1 : 0;
	return v;
#else
	return 0;
#endif
}

void ke_qact_quant(int isa, int block, const float *x, int K, void *row)
{
	if (isa > ke_isa_best())
		isa = ke_isa_best();
#if defined(__x86_64__)
	if (isa >= KE_ISA_AVX2)
		quant_avx2(block, x, K, row);
	else
#endif
		quant_scalar(block, x, K, row);
	fill_bsums(block, K, row);
}

void ke_qdot_rows(int isa, int dt, const uint8_t *wrow, int K, const uint8_t *arow, size_t astride, int mr,
		  float *out)
{
	if (isa > ke_isa_best())
		isa = ke_isa_best();
#if defined(__x86_64__)
	if (isa >= KE_ISA_AVX2) {
		if (dt == KV_DT_Q8_0) {
			if (isa == KE_ISA_AVX512 && have_vnni())
				q8_0_vnni(wrow, K, arow, astride, mr, out);
			else
				q8_0_avx2(wrow, K, arow, astride, mr, out);
		} else if (dt == KV_DT_Q4_K) {
			q4_k_avx2(wrow, K, arow, astride, mr, out);
		} else {
			q6_k_avx2(wrow, K, arow, astride, mr, out);
		}
		return;
	}
#endif
	for (int i = 0; i < mr; i++) {
		const uint8_t *xr = arow + (size_t)i * astride;
		out[i] = dt == KV_DT_Q8_0 ? q8_0_scalar(wrow, K, xr)
			 : dt == KV_DT_Q4_K ? q4_k_scalar(wrow, K, xr)
					    : q6_k_scalar(wrow, K, xr);
	}
}
