/*
 * vec.c - see vec.h. Each kernel: a scalar reference, then the AVX2 path
 * that mirrors it operation for operation.
 */
#include "engine/vec.h"
#include "engine/isa.h"
#include "engine/gemm.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define TGT2 __attribute__((target("avx2,fma")))
#endif

/* exp constants (Cephes expf). */
#define EXP_HI 88.0f
#define EXP_LO -86.0f
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO -2.12194440e-4f
#define P0 1.9875691500e-4f
#define P1 1.3981999507e-3f
#define P2 8.3334519073e-3f
#define P3 4.1665795894e-2f
#define P4 1.6666665459e-1f
#define P5 5.0000001201e-1f

float ke_exp(float x)
{
	x = x < EXP_HI ? x : EXP_HI;
	x = x > EXP_LO ? x : EXP_LO;
	float n = rintf(x * LOG2E);
	float r = fmaf(n, -LN2_HI, x);
	r = fmaf(n, -LN2_LO, r);
	float p = P0;
	p = fmaf(p, r, P1);
	p = fmaf(p, r, P2);
	p = fmaf(p, r, P3);
	p = fmaf(p, r, P4);
	p = fmaf(p, r, P5);
	float r2 = r * r;
	float y = fmaf(p, r2, r);
	y = y + 1.0f;
	/* y * 2^n by adding n to the exponent field: exact for the clamped
	 * range (n >= -124 keeps the result normal), and no float multiply
	 * that a compiler could fuse with a following add. */
	uint32_t bits;
	memcpy(&bits, &y, 4);
	bits += (uint32_t)((int32_t)n) << 23;
	memcpy(&y, &bits, 4);
	return y;
}

/* tanh, canonical (ke_tanh): below |z| = 0.25 the odd Taylor series to
 * z^11 (the next term is under 1e-8 of z there), by Horner in z^2 with
 * fmas, t = fma(p, z^2 z, z); from 0.25 on (e - 1) / (e + 1) with e =
 * ke_exp(2 |z|) (clamped: 1 from |z| = 44), the sign put back; NaN stays
 * NaN. Within 2e-7 relative of tanh in double (test_kernels). */
#define TH3 -3.33333333333e-1f
#define TH5 1.33333333333e-1f
#define TH7 -5.39682539683e-2f
#define TH9 2.18694885362e-2f
#define TH11 -8.86323552990e-3f
#define TH_SMALL 0.25f
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

static float ke_tanh(float z)
{
	if (z != z)
		return z;
	const float a = fabsf(z);
	if (a < TH_SMALL) {
		const float z2 = z * z;
		float p = TH11;
		p = fmaf(p, z2, TH9);
		p = fmaf(p, z2, TH7);
		p = fmaf(p, z2, TH5);
		p = fmaf(p, z2, TH3);
		const float q = z2 * z;
		return fmaf(p, q, z);
	}
	const float e = ke_exp(a + a);
	return copysignf((e - 1.0f) / (e + 1.0f), z);
}

/* gelu_tanh of one value, canonical: x^3 as (x x) x, the inner sum as an
 * fma (0.044715 x^3 + x: nothing is left for a compiler to contract), the
 * canonical tanh, then (0.5 x) (1 + t). */
static float ke_gelu(float x)
{
	const float x3 = (x * x) * x;
	const float t = ke_tanh(GELU_K * fmaf(GELU_C, x3, x));
	return (0.5f * x) * (1.0f + t);
}

/* Elements [i, n) on the scalar path: the SIMD paths' tails, and the
 * whole of the scalar one. */
static void gelu_from(float *g, const float *u, int i, int n)
{
	for (; i < n; i++)
		g[i] = u ? ke_gelu(g[i]) * u[i] : ke_gelu(g[i]);
}

static inline float bf16f(const void *p, size_t i)
{
	uint16_t h;
	uint32_t u;
	float f;
	memcpy(&h, (const char *)p + 2 * i, 2);
	u = (uint32_t)h << 16;
	memcpy(&f, &u, 4);
	return f;
}

#if defined(__x86_64__)

TGT2 static inline __m256 exp8(__m256 x)
{
	x = _mm256_min_ps(x, _mm256_set1_ps(EXP_HI));
	x = _mm256_max_ps(x, _mm256_set1_ps(EXP_LO));
	__m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
	r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
	__m256 p = _mm256_set1_ps(P0);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P1));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P2));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P3));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P4));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P5));
	__m256 r2 = _mm256_mul_ps(r, r);
	__m256 y = _mm256_fmadd_ps(p, r2, r);
	y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
	__m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
	return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), e));
}

TGT2 static float dot_avx2(const float *a, const float *b, int n)
{
	__m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
	int k = 0;
	for (; k + 16 <= n; k += 16) {
		lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), lo);
		hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), hi);
	}
	if (k < n) {
		float ta[16] = {0}, tb[16] = {0};
		memcpy(ta, a + k, (size_t)(n - k) * 4);
		memcpy(tb, b + k, (size_t)(n - k) * 4);
		lo = _mm256_fmadd_ps(_mm256_loadu_ps(ta), _mm256_loadu_ps(tb), lo);
		hi = _mm256_fmadd_ps(_mm256_loadu_ps(ta + 8), _mm256_loadu_ps(tb + 8), hi);
	}
	__m256 t = _mm256_add_ps(lo, hi);
	__m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
	__m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
	__m128 r = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
	return _mm_cvtss_f32(r);
}

#define TGT5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))

/* exp8's operations on 16 lanes (the same bits). */
TGT5 static inline __m512 exp16(__m512 x)
{
	x = _mm512_min_ps(x, _mm512_set1_ps(EXP_HI));
	x = _mm512_max_ps(x, _mm512_set1_ps(EXP_LO));
	__m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
					_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), x);
	r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
	__m512 p = _mm512_set1_ps(P0);
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P1));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P2));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P3));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P4));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P5));
	__m512 r2 = _mm512_mul_ps(r, r);
	__m512 y = _mm512_fmadd_ps(p, r2, r);
	y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
	__m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
	return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(y), e));
}

/* tanh8's operations on 16 lanes (the same bits). */
TGT5 static inline __m512 tanh16(__m512 z)
{
	const __m512 a = _mm512_abs_ps(z), z2 = _mm512_mul_ps(z, z);
	__m512 p = _mm512_set1_ps(TH11);
	p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(TH9));
	p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(TH7));
	p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(TH5));
	p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(TH3));
	const __m512 small = _mm512_fmadd_ps(p, _mm512_mul_ps(z2, z), z);
	const __m512 e = exp16(_mm512_add_ps(a, a)), one = _mm512_set1_ps(1.0f);
	__m512 big = _mm512_div_ps(_mm512_sub_ps(e, one), _mm512_add_ps(e, one));
	big = _mm512_or_ps(big, _mm512_and_ps(_mm512_set1_ps(-0.0f), z));
	const __m512 t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(TH_SMALL), _CMP_LT_OQ), big, small);
	return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(z, z, _CMP_UNORD_Q), t, z);
}

TGT5 static void softcap_avx512(float *x, float cap, size_t n)
{
	const __m512 c = _mm512_set1_ps(cap);
	size_t i = 0;
	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(x + i, _mm512_mul_ps(c, tanh16(_mm512_div_ps(_mm512_loadu_ps(x + i), c))));
	for (; i < n; i++)
		x[i] = cap * ke_tanh(x[i] / cap);
}

TGT5 static void gelu_avx512(float *g, const float *u, int n)
{
	const __m512 k = _mm512_set1_ps(GELU_K), c = _mm512_set1_ps(GELU_C), h = _mm512_set1_ps(0.5f),
		     one = _mm512_set1_ps(1.0f);
	int i = 0;
	for (; i + 16 <= n; i += 16) {
		const __m512 x = _mm512_loadu_ps(g + i), x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
		const __m512 t = tanh16(_mm512_mul_ps(k, _mm512_fmadd_ps(c, x3, x)));
		__m512 y = _mm512_mul_ps(_mm512_mul_ps(h, x), _mm512_add_ps(one, t));
		if (u)
			y = _mm512_mul_ps(y, _mm512_loadu_ps(u + i));
		_mm512_storeu_ps(g + i, y);
	}
	gelu_from(g, u, i, n);
}

TGT5 static void exp_avx512(float *y, const float *x, int n)
{
	int i = 0;
	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(y + i, exp16(_mm512_loadu_ps(x + i)));
	for (; i < n; i++)
		y[i] = ke_exp(x[i]);
}

TGT2 static void exp_avx2(float *y, const float *x, int n)
{
	int i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
	for (; i < n; i++)
		y[i] = ke_exp(x[i]);
}

/* ke_tanh's operations on 8 lanes (both branches, blended). */
TGT2 static inline __m256 tanh8(__m256 z)
{
	const __m256 sgn = _mm256_set1_ps(-0.0f), a = _mm256_andnot_ps(sgn, z), z2 = _mm256_mul_ps(z, z);
	__m256 p = _mm256_set1_ps(TH11);
	p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(TH9));
	p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(TH7));
	p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(TH5));
	p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(TH3));
	const __m256 small = _mm256_fmadd_ps(p, _mm256_mul_ps(z2, z), z);
	const __m256 e = exp8(_mm256_add_ps(a, a)), one = _mm256_set1_ps(1.0f);
	__m256 big = _mm256_div_ps(_mm256_sub_ps(e, one), _mm256_add_ps(e, one));
	big = _mm256_or_ps(big, _mm256_and_ps(sgn, z));
	const __m256 t = _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(TH_SMALL), _CMP_LT_OQ));
	return _mm256_blendv_ps(t, z, _mm256_cmp_ps(z, z, _CMP_UNORD_Q));
}

TGT2 static void softcap_avx2(float *x, float cap, size_t n)
{
	const __m256 c = _mm256_set1_ps(cap);
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(x + i, _mm256_mul_ps(c, tanh8(_mm256_div_ps(_mm256_loadu_ps(x + i), c))));
	for (; i < n; i++)
		x[i] = cap * ke_tanh(x[i] / cap);
}

TGT2 static void gelu_avx2(float *g, const float *u, int n)
{
	const __m256 k = _mm256_set1_ps(GELU_K), c = _mm256_set1_ps(GELU_C), h = _mm256_set1_ps(0.5f),
		     one = _mm256_set1_ps(1.0f);
	int i = 0;
	for (; i + 8 <= n; i += 8) {
		const __m256 x = _mm256_loadu_ps(g + i), x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
		const __m256 t = tanh8(_mm256_mul_ps(k, _mm256_fmadd_ps(c, x3, x)));
		__m256 y = _mm256_mul_ps(_mm256_mul_ps(h, x), _mm256_add_ps(one, t));
		if (u)
			y = _mm256_mul_ps(y, _mm256_loadu_ps(u + i));
		_mm256_storeu_ps(g + i, y);
	}
	gelu_from(g, u, i, n);
}

TGT2 static void silu_mul_avx2(float *g, const float *u, int n)
{
	int i = 0;
	const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
	for (; i + 8 <= n; i += 8) {
		__m256 x = _mm256_loadu_ps(g + i);
		__m256 e = exp8(_mm256_sub_ps(zero, x));
		__m256 s = _mm256_div_ps(x, _mm256_add_ps(one, e));
		if (u)
			s = _mm256_mul_ps(s, _mm256_loadu_ps(u + i));
		_mm256_storeu_ps(g + i, s);
	}
	for (; i < n; i++) {
		float s = g[i] / (1.0f + ke_exp(0.0f - g[i]));
		g[i] = u ? s * u[i] : s;
	}
}

TGT2 static void axpy_avx2(float *y, float a, const float *x, int n)
{
	int i = 0;
	__m256 av = _mm256_set1_ps(a);
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
	for (; i < n; i++)
		y[i] = fmaf(a, x[i], y[i]);
}

/* y * a, element-wise: the bits of the scalar loop */
TGT2 static void scale_avx2(float *y, float a, int n)
{
	int i = 0;
	__m256 av = _mm256_set1_ps(a);
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), av));
	for (; i < n; i++)
		y[i] = y[i] * a;
}

/* max(x, 0)^2: maxps gives its second operand (+0) for NaN and for -0,
 * as the scalar x > 0 ? x : 0 does */
TGT2 static void relu2_avx2(float *x, int n)
{
	int i = 0;
	__m256 z = _mm256_setzero_ps();
	for (; i + 8 <= n; i += 8) {
		__m256 r = _mm256_max_ps(_mm256_loadu_ps(x + i), z);
		_mm256_storeu_ps(x + i, _mm256_mul_ps(r, r));
	}
	for (; i < n; i++) {
		float r = x[i] > 0.0f ? x[i] : 0.0f;
		x[i] = r * r;
	}
}

TGT2 static void axpy_bf16_avx2(float *y, float a, const void *x, int n)
{
	int i = 0;
	__m256 av = _mm256_set1_ps(a);
	const char *xb = x;
	for (; i + 8 <= n; i += 8) {
		__m256 xv = _mm256_castsi256_ps(
			_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(xb + 2 * i))), 16));
		_mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, xv, _mm256_loadu_ps(y + i)));
	}
	for (; i < n; i++)
		y[i] = fmaf(a, bf16f(x, (size_t)i), y[i]);
}

#endif

static int isa2(int isa)
{
	return isa >= KE_ISA_AVX2 && ke_isa_best() >= KE_ISA_AVX2;
}

float ke_vec_dot_isa(int isa, const float *a, const float *b, int n)
{
#if defined(__x86_64__)
	if (isa2(isa))
		return dot_avx2(a, b, n);
#endif
	(void)isa;
	return ke_dot_ref(a, b, n);
}

float ke_vec_dot(const float *a, const float *b, int n)
{
	return ke_vec_dot_isa(ke_isa(), a, b, n);
}

void ke_vec_exp_isa(int isa, float *y, const float *x, int n)
{
#if defined(__x86_64__)
	if (isa >= KE_ISA_AVX512 && ke_isa_best() >= KE_ISA_AVX512) {
		exp_avx512(y, x, n);
		return;
	}
	if (isa2(isa)) {
		exp_avx2(y, x, n);
		return;
	}
#endif
	(void)isa;
	for (int i = 0; i < n; i++)
		y[i] = ke_exp(x[i]);
}

void ke_vec_exp(float *y, const float *x, int n)
{
	ke_vec_exp_isa(ke_isa(), y, x, n);
}

void ke_vec_silu_mul_isa(int isa, float *g, const float *u, int n)
{
#if defined(__x86_64__)
	if (isa2(isa)) {
		silu_mul_avx2(g, u, n);
		return;
	}
#endif
	(void)isa;
	for (int i = 0; i < n; i++) {
		float s = g[i] / (1.0f + ke_exp(0.0f - g[i]));
		g[i] = u ? s * u[i] : s;
	}
}

void ke_vec_silu_mul(float *g, const float *u, int n)
{
	ke_vec_silu_mul_isa(ke_isa(), g, u, n);
}

void ke_vec_silu(float *x, int n)
{
	ke_vec_silu_mul_isa(ke_isa(), x, NULL, n);
}

void ke_vec_gelu_tanh_mul_isa(int isa, float *g, const float *u, int n)
{
#if defined(__x86_64__)
	if (isa >= KE_ISA_AVX512 && ke_isa_best() >= KE_ISA_AVX512) {
		gelu_avx512(g, u, n);
		return;
	}
	if (isa2(isa)) {
		gelu_avx2(g, u, n);
		return;
	}
#endif
	(void)isa;
	gelu_from(g, u, 0, n);
}

void ke_vec_gelu_tanh_mul(float *g, const float *u, int n)
{
	ke_vec_gelu_tanh_mul_isa(ke_isa(), g, u, n);
}

void ke_vec_softcap_isa(int isa, float *x, float cap, size_t n)
{
#if defined(__x86_64__)
	if (isa >= KE_ISA_AVX512 && ke_isa_best() >= KE_ISA_AVX512) {
		softcap_avx512(x, cap, n);
		return;
	}
	if (isa2(isa)) {
		softcap_avx2(x, cap, n);
		return;
	}
#endif
	(void)isa;
	for (size_t i = 0; i < n; i++)
		x[i] = cap * ke_tanh(x[i] / cap);
}

void ke_vec_softcap(float *x, float cap, size_t n)
{
	ke_vec_softcap_isa(ke_isa(), x, cap, n);
}

void ke_vec_axpy_isa(int isa, float *y, float a, const float *x, int n)
{
#if defined(__x86_64__)
	if (isa2(isa)) {
		axpy_avx2(y, a, x, n);
		return;
	}
#endif
	(void)isa;
	for (int i = 0; i < n; i++)
		y[i] = fmaf(a, x[i], y[i]);
}

void ke_vec_axpy_bf16_isa(int isa, float *y, float a, const void *x, int n)
{
#if defined(__x86_64__)
	if (isa2(isa)) {
		axpy_bf16_avx2(y, a, x, n);
		return;
	}
#endif
	(void)isa;
	for (int i = 0; i < n; i++)
		y[i] = fmaf(a, bf16f(x, (size_t)i), y[i]);
}

void ke_vec_axpy_bf16(float *y, float a, const void *x, int n)
{
	ke_vec_axpy_bf16_isa(ke_isa(), y, a, x, n);
}

void ke_vec_relu2_isa(int isa, float *x, int n)
{
#if defined(__x86_64__)
	if (isa2(isa)) {
		relu2_avx2(x, n);
		return;
	}
#endif
	(void)isa;
	for (int i = 0; i < n; i++) {
		float r = x[i] > 0.0f ? x[i] : 0.0f;
		x[i] = r * r;
	}
}

void ke_vec_relu2(float *x, int n)
{
	ke_vec_relu2_isa(ke_isa(), x, n);
}

void ke_vec_scale(float *y, float a, int n)
{
	int i = 0;
#if defined(__x86_64__)
	if (isa2(ke_isa())) {
		scale_avx2(y, a, n);
		return;
	}
#endif
	for (; i < n; i++)
		y[i] = y[i] * a;
}

void ke_vec_rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
	float ss = ke_vec_dot(x, x, n);
	float r = 1.0f / sqrtf(ss / (float)n + eps);
	if (w) {
		for (int i = 0; i < n; i++)
			out[i] = (x[i] * r) * w[i];
	} else {
		for (int i = 0; i < n; i++)
			out[i] = x[i] * r;
	}
}

void ke_vec_bf16_to_f32(float *y, const void *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] = bf16f(x, i);
}

void ke_vec_f32_to_bf16(void *y, const float *x, size_t n)
{
	char *o = y;
	for (size_t i = 0; i < n; i++) {
		uint32_t u;
		uint16_t h;
		memcpy(&u, &x[i], 4);
		if ((u & 0x7fffffffu) > 0x7f800000u)
			h = (uint16_t)((u >> 16) | 0x40u);
		else
			h = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
		memcpy(o + 2 * i, &h, 2);
	}
}
