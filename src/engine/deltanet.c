/*
 * deltanet.c - see deltanet.h.
 */
#include "engine/deltanet.h"
#include "engine/isa.h"

#include <math.h>
#include <string.h>

/* The conv's separate multiply and add must stay two roundings: GCC's
 * vector intrinsics are plain vector arithmetic and would be fused into
 * an FMA on the AVX-512 path (and the scalar code on an FMA target). */
#pragma GCC optimize("fp-contract=off")

#if defined(__x86_64__)
#include <immintrin.h>
#define TGT2 __attribute__((target("avx2,fma")))
#endif

#if defined(__x86_64__)
#define TGT5C __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
/*
 * The K = 4 conv of 16 channels at a time, the scalar code's operations
 * (0 + w0 s0, then + w1 s1, + w2 s2, + w3 x, each a separate multiply
 * and add) on 16 lanes: bit-identical. The state's [16][3] and the
 * weights' [16][4] are taken apart with permutes; the new state is the
 * old one moved down one float with x put in every third lane. A decode
 * token of bench-hybrid runs 49152 channels through it (0.25 ms a token
 * as scalar code, 4 sequences: a millisecond per step on one thread).
 */
TGT5C static int conv4_avx512(float *state, const float *w, float *x, int C)
{
	/* s_j[c] = st[3c + j]: from A:B (elements < 32), then from the result:C */
	static const int32_t s_lo[3][16] = {
		{0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 0, 0, 0, 0, 0},
		{1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 0, 0, 0, 0, 0},
		{2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 0, 0, 0, 0, 0, 0},
	};
	static const int32_t s_hi[3][16] = {
		{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 17, 20, 23, 26, 29},
		{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 18, 21, 24, 27, 30},
		{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 19, 22, 25, 28, 31},
	};
	/* w_j[c] = w[4c + j]: channels 0-7 from W0:W1, 8-15 from W2:W3 */
	static const int32_t w_ix[4][16] = {
		{0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28},
		{1, 5, 9, 13, 17, 21, 25, 29, 1, 5, 9, 13, 17, 21, 25, 29},
		{2, 6, 10, 14, 18, 22, 26, 30, 2, 6, 10, 14, 18, 22, 26, 30},
		{3, 7, 11, 15, 19, 23, 27, 31, 3, 7, 11, 15, 19, 23, 27, 31},
	};
	/* x[c] goes to new element 3c + 2: lanes 2, 5, .. of the three vectors */
	static const int32_t x_ix[3][16] = {
		{0, 0, 0, 0, 0, 1, 0, 0, 2, 0, 0, 3, 0, 0, 4, 0},
		{0, 5, 0, 0, 6, 0, 0, 7, 0, 0, 8, 0, 0, 9, 0, 0},
		{10, 0, 0, 11, 0, 0, 12, 0, 0, 13, 0, 0, 14, 0, 0, 15},
	};
	const __mmask16 x_m[3] = {0x4924, 0x2492, 0x9249};
	__m512i sl[3], sh[3], wi[4], xi[3];
	for (int j = 0; j < 3; j++) {
		sl[j] = _mm512_loadu_si512(s_lo[j]);
		sh[j] = _mm512_loadu_si512(s_hi[j]);
		xi[j] = _mm512_loadu_si512(x_ix[j]);
	}
	for (int j = 0; j < 4; j++)
		wi[j] = _mm512_loadu_si512(w_ix[j]);
	int c = 0;
	for (; c + 16 <= C; c += 16) {
		float *st = state + (size_t)c * 3;
		const float *wc = w + (size_t)c * 4;
		__m512 A = _mm512_loadu_ps(st), B = _mm512_loadu_ps(st + 16), Cv = _mm512_loadu_ps(st + 32);
		__m512 W0 = _mm512_loadu_ps(wc), W1 = _mm512_loadu_ps(wc + 16), W2 = _mm512_loadu_ps(wc + 32),
		       W3 = _mm512_loadu_ps(wc + 48);
		__m512 xv = _mm512_loadu_ps(x + c), acc = _mm512_setzero_ps();
		for (int j = 0; j < 4; j++) {
			__m512 wj = _mm512_mask_blend_ps(0xFF00, _mm512_permutex2var_ps(W0, wi[j], W1),
							 _mm512_permutex2var_ps(W2, wi[j], W3));
			__m512 sj = j < 3 ? _mm512_permutex2var_ps(_mm512_permutex2var_ps(A, sl[j], B), sh[j], Cv) : xv;
			acc = _mm512_add_ps(acc, _mm512_mul_ps(wj, sj));
		}
		__m512 N0 = _mm512_loadu_ps(st + 1), N1 = _mm512_loadu_ps(st + 17);
		__m512 N2 = _mm512_maskz_loadu_ps(0x7FFF, st + 33); /* st[48] is the next group's */
		_mm512_storeu_ps(st, _mm512_mask_permutexvar_ps(N0, x_m[0], xi[0], xv));
		_mm512_storeu_ps(st + 16, _mm512_mask_permutexvar_ps(N1, x_m[1], xi[1], xv));
		_mm512_storeu_ps(st + 32, _mm512_mask_permutexvar_ps(N2, x_m[2], xi[2], xv));
		_mm512_storeu_ps(x + c, acc);
	}
	return c;
}
#endif

void ke_dn_conv(float *state, const float *w, float *x, int C, int K)
{
	ke_dn_conv_isa(ke_isa(), state, w, x, C, K);
}

void ke_dn_conv_isa(int isa, float *state, const float *w, float *x, int C, int K)
{
	int K1 = K - 1;
	if (K == 4) {
		int c0 = 0;
#if defined(__x86_64__)
		if (isa >= KE_ISA_AVX512 && ke_isa_best() >= KE_ISA_AVX512)
			c0 = conv4_avx512(state, w, x, C);
#endif
		(void)isa;
		/* The kernel of every Qwen3.5 / Qwen3-Next model, unrolled: the same
		 * operations in the same order as the loop below, without its
		 * memmove call per channel (6% of an 8K prefill). */
		for (int c = c0; c < C; c++) {
			float *st = state + (size_t)c * 3;
			const float *wc = w + (size_t)c * 4;
			float s0 = st[0], s1 = st[1], s2 = st[2], xc = x[c];
			float acc = 0.0f;
			acc = acc + wc[0] * s0;
			acc = acc + wc[1] * s1;
			acc = acc + wc[2] * s2;
			acc = acc + wc[3] * xc;
			st[0] = s1;
			st[1] = s2;
			st[2] = xc;
			x[c] = acc;
		}
		return;
	}
	for (int c = 0; c < C; c++) {
		float *st = state + (size_t)c * K1;
		const float *wc = w + (size_t)c * K;
		float acc = 0.0f;
		for (int j = 0; j < K1; j++)
			acc = acc + wc[j] * st[j];
		float xc = x[c];
		acc = acc + wc[K1] * xc;
		if (K1 > 0) {
			memmove(st, st + 1, (size_t)(K1 - 1) * sizeof *st);
			st[K1 - 1] = xc;
		}
		x[c] = acc;
	}
}

static void rule_scalar(float *S, const float *q, const float *k, const float *v, float alpha, float beta,
			float *o, int dk, int dv, float *u)
{
	for (int j = 0; j < dv; j++)
		u[j] = 0.0f;
	for (int i = 0; i < dk; i++) {
		float *s = S + (size_t)i * dv;
		for (int j = 0; j < dv; j++) {
			s[j] = s[j] * alpha;
			u[j] = fmaf(s[j], k[i], u[j]);
		}
	}
	for (int j = 0; j < dv; j++) {
		u[j] = (v[j] - u[j]) * beta;
		o[j] = 0.0f;
	}
	for (int i = 0; i < dk; i++) {
		float *s = S + (size_t)i * dv;
		for (int j = 0; j < dv; j++) {
			s[j] = fmaf(k[i], u[j], s[j]);
			o[j] = fmaf(s[j], q[i], o[j]);
		}
	}
}

#if defined(__x86_64__)
/* dv a multiple of 8 (the caller checks). */
TGT2 static void rule_avx2(float *S, const float *q, const float *k, const float *v, float alpha, float beta,
			   float *o, int dk, int dv, float *u)
{
	__m256 al = _mm256_set1_ps(alpha), be = _mm256_set1_ps(beta);
	for (int j = 0; j < dv; j += 8)
		_mm256_storeu_ps(u + j, _mm256_setzero_ps());
	for (int i = 0; i < dk; i++) {
		float *s = S + (size_t)i * dv;
		__m256 ki = _mm256_set1_ps(k[i]);
		for (int j = 0; j < dv; j += 8) {
			__m256 sv = _mm256_mul_ps(_mm256_loadu_ps(s + j), al);
			_mm256_storeu_ps(s + j, sv);
			_mm256_storeu_ps(u + j, _mm256_fmadd_ps(sv, ki, _mm256_loadu_ps(u + j)));
		}
	}
	for (int j = 0; j < dv; j += 8) {
		__m256 d = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + j), _mm256_loadu_ps(u + j)), be);
		_mm256_storeu_ps(u + j, d);
		_mm256_storeu_ps(o + j, _mm256_setzero_ps());
	}
	for (int i = 0; i < dk; i++) {
		float *s = S + (size_t)i * dv;
		__m256 ki = _mm256_set1_ps(k[i]), qi = _mm256_set1_ps(q[i]);
		for (int j = 0; j < dv; j += 8) {
			__m256 sv = _mm256_fmadd_ps(ki, _mm256_loadu_ps(u + j), _mm256_loadu_ps(s + j));
			_mm256_storeu_ps(s + j, sv);
			_mm256_storeu_ps(o + j, _mm256_fmadd_ps(sv, qi, _mm256_loadu_ps(o + j)));
		}
	}
}
#endif

#if defined(__x86_64__)
/*
 * Fused sweep, one strip of NV vectors of W lanes (columns j0..j0+NV*W)
 * at a time; every column is independent, so strips do not interact.
 *   u = read of token 0 (after its decay);
 *   per token t: d = (v_t - u) * beta_t; o_t = 0; u = 0 (if t+1 < n);
 *     for i: S[i] = fma(k_t[i], d, S[i]); o_t = fma(S[i], q_t[i], o_t);
 *            if t+1 < n: S[i] = S[i] * alpha_{t+1}; u = fma(S[i], k_{t+1}[i], u)
 */
#define DN_SWEEP(NAME, NV, TGT, VT, W, LOAD, STORE, SET1, ZERO, MUL, SUB, FMA) \
	TGT static void NAME(float *S, int n, const float *q, const float *k, const float *v, size_t sq, \
			     const float *alpha, const float *beta, size_t sab, float *o, size_t so, int dk, int dv, \
			     int j0) \
	{ \
		VT u[NV], d[NV], ov[NV]; \
		_Pragma("GCC unroll 8") for (int x = 0; x < NV; x++) \
			u[x] = ZERO(); \
		{ \
			VT al = SET1(alpha[0]); \
			for (int i = 0; i < dk; i++) { \
				float *s = S + (size_t)i * dv + j0; \
				VT ki = SET1(k[i]); \
				_Pragma("GCC unroll 8") for (int x = 0; x < NV; x++) { \
					VT sv = MUL(LOAD(s + x * W), al); \
					STORE(s + x * W, sv); \
					u[x] = FMA(sv, ki, u[x]); \
				} \
			} \
		} \
		for (int t = 0; t < n; t++) { \
			const float *qt = q + (size_t)t * sq, *kt = k + (size_t)t * sq, *vt = v + (size_t)t * sq; \
			VT be = SET1(beta[(size_t)t * sab]); \
			_Pragma("GCC unroll 8") for (int x = 0; x < NV; x++) { \
				d[x] = MUL(SUB(LOAD(vt + j0 + x * W), u[x]), be); \
				ov[x] = ZERO(); \
				u[x] = ZERO(); \
			} \
			if (t + 1 < n) { \
				const float *kn = kt + sq; \
				VT al = SET1(alpha[(size_t)(t + 1) * sab]); \
				for (int i = 0; i < dk; i++) { \
					float *s = S + (size_t)i * dv + j0; \
					VT ki = SET1(kt[i]), qi = SET1(qt[i]), kni = SET1(kn[i]); \
					_Pragma("GCC unroll 8") for (int x = 0; x < NV; x++) { \
						VT sv = FMA(ki, d[x], LOAD(s + x * W)); \
						ov[x] = FMA(sv, qi, ov[x]); \
						sv = MUL(sv, al); \
						STORE(s + x * W, sv); \
						u[x] = FMA(sv, kni, u[x]); \
					} \
				} \
			} else { \
				for (int i = 0; i < dk; i++) { \
					float *s = S + (size_t)i * dv + j0; \
					VT ki = SET1(kt[i]), qi = SET1(qt[i]); \
					_Pragma("GCC unroll 8") for (int x = 0; x < NV; x++) { \
						VT sv = FMA(ki, d[x], LOAD(s + x * W)); \
						STORE(s + x * W, sv); \
						ov[x] = FMA(sv, qi, ov[x]); \
					} \
				} \
			} \
			float *ot = o + (size_t)t * so + j0; \
			_Pragma("GCC unroll 8") for (int x = 0; x < NV; x++) \
				STORE(ot + x * W, ov[x]); \
		} \
	}

#define TGT5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#define AVX2_OPS TGT2, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_setzero_ps, \
	_mm256_mul_ps, _mm256_sub_ps, _mm256_fmadd_ps
#define AVX512_OPS TGT5, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_setzero_ps, \
	_mm512_mul_ps, _mm512_sub_ps, _mm512_fmadd_ps
#define DN_SWEEP_(...) DN_SWEEP(__VA_ARGS__)
DN_SWEEP_(sweep_avx2_4, 4, AVX2_OPS)
DN_SWEEP_(sweep_avx2_1, 1, AVX2_OPS)
/* 128-column strips where dv allows: 8 independent o / u chains per row
 * of S instead of 4 (the 4-wide strip waited on their latency) and the
 * three broadcasts of a row shared by twice the columns; the strip's 64
 * KiB of S (dk = 128) comes from L2. One thread, 8 heads of dk = dv = 128,
 * 256 tokens: 59.6 -> 69-76 GFLOP/s. 29 zmm registers, no spills. */
DN_SWEEP_(sweep_avx512_8, 8, AVX512_OPS)
DN_SWEEP_(sweep_avx512_4, 4, AVX512_OPS)
DN_SWEEP_(sweep_avx512_1, 1, AVX512_OPS)

/*
 * One token (decode), AVX-512, dv a multiple of 16: the same operations
 * per element as the sweep, in two passes over S instead of two
 * read-write passes:
 *   pass 1 (read only): u = fma(S[i] * alpha, k[i], u), i ascending;
 *   pass 2: S[i] = fma(k[i], d, S[i] * alpha); o = fma(S[i], q[i], o).
 * S[i] * alpha is computed twice and rounds the same both times, so S and
 * o are bit-identical to the sweep's (which stores the decayed S in pass 1
 * and reloads it). Blocks of up to 128 columns (8 vectors) walk whole
 * 512-byte rows when dv = 128: pass 1 streams the head's 64 KiB from
 * memory in address order (the sweep's 64-column strips read half of each
 * row, then came back for the other half), pass 2 finds it in L2.
 * Decode is bound by these bytes: 12 MiB of state per bench-hybrid
 * sequence and token (docs/engine.md, batched decode).
 */
#define DEC_BLOCK(NAME, NV) \
	TGT5 static void NAME(float *S, const float *q, const float *k, const float *v, float alpha, float beta, \
			      float *o, int dk, int dv, int j0) \
	{ \
		__m512 u[NV], d[NV], ov[NV], al = _mm512_set1_ps(alpha); \
		_Pragma("GCC unroll 8") for (int x = 0; x < NV; x++) \
			u[x] = _mm512_setzero_ps(); \
		for (int i = 0; i < dk; i++) { \
			const float *s = S + (size_t)i * dv + j0; \
			__m512 ki = _mm512_set1_ps(k[i]); \
			_Pragma("GCC unroll 8") for (int x = 0; x < NV; x++) { \
				/* 8 rows ahead (into the next head at the end, which \
				 * is usually the next one run): 5-10% faster */ \
				_mm_prefetch((const char *)(s + 8 * (size_t)dv + x * 16), _MM_HINT_T0); \
				u[x] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(s + x * 16), al), ki, u[x]); \
			} \
		} \
		__m512 be = _mm512_set1_ps(beta); \
		_Pragma("GCC unroll 8") for (int x = 0; x < NV; x++) { \
			d[x] = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(v + j0 + x * 16), u[x]), be); \
			ov[x] = _mm512_setzero_ps(); \
		} \
		for (int i = 0; i < dk; i++) { \
			float *s = S + (size_t)i * dv + j0; \
			__m512 ki = _mm512_set1_ps(k[i]), qi = _mm512_set1_ps(q[i]); \
			_Pragma("GCC unroll 8") for (int x = 0; x < NV; x++) { \
				__m512 sv = _mm512_fmadd_ps(ki, d[x], _mm512_mul_ps(_mm512_loadu_ps(s + x * 16), al)); \
				_mm512_storeu_ps(s + x * 16, sv); \
				ov[x] = _mm512_fmadd_ps(sv, qi, ov[x]); \
			} \
		} \
		_Pragma("GCC unroll 8") for (int x = 0; x < NV; x++) \
			_mm512_storeu_ps(o + j0 + x * 16, ov[x]); \
	}
DEC_BLOCK(dec_avx512_8, 8)
DEC_BLOCK(dec_avx512_1, 1)

static void dec_avx512(float *S, const float *q, const float *k, const float *v, float alpha, float beta, float *o,
		       int dk, int dv)
{
	int j0 = 0;
	for (; j0 + 128 <= dv; j0 += 128)
		dec_avx512_8(S, q, k, v, alpha, beta, o, dk, dv, j0);
	for (; j0 < dv; j0 += 16)
		dec_avx512_1(S, q, k, v, alpha, beta, o, dk, dv, j0);
}
#endif

#define DV_MAX 1024

void ke_dn_rule_seq(int isa, float *S, int n, const float *q, const float *k, const float *v, size_t sq,
		    const float *alpha, const float *beta, size_t sab, float *o, size_t so, int dk, int dv)
{
	if (n <= 0)
		return;
	int best = ke_isa_best();
	if (isa > best)
		isa = best;
#if defined(__x86_64__)
	if (isa >= KE_ISA_AVX512 && dv % 16 == 0 && n == 1) {
		dec_avx512(S, q, k, v, alpha[0], beta[0], o, dk, dv);
		return;
	}
	if (isa >= KE_ISA_AVX512 && dv % 16 == 0) {
		int j0 = 0;
		for (; j0 + 128 <= dv; j0 += 128)
			sweep_avx512_8(S, n, q, k, v, sq, alpha, beta, sab, o, so, dk, dv, j0);
		for (; j0 + 64 <= dv; j0 += 64)
			sweep_avx512_4(S, n, q, k, v, sq, alpha, beta, sab, o, so, dk, dv, j0);
		for (; j0 < dv; j0 += 16)
			sweep_avx512_1(S, n, q, k, v, sq, alpha, beta, sab, o, so, dk, dv, j0);
		return;
	}
	if (isa >= KE_ISA_AVX2 && dv % 8 == 0) {
		int j0 = 0;
		for (; j0 + 32 <= dv; j0 += 32)
			sweep_avx2_4(S, n, q, k, v, sq, alpha, beta, sab, o, so, dk, dv, j0);
		for (; j0 < dv; j0 += 8)
			sweep_avx2_1(S, n, q, k, v, sq, alpha, beta, sab, o, so, dk, dv, j0);
		return;
	}
#endif
	for (int t = 0; t < n; t++)
		ke_dn_rule_isa(KE_ISA_SCALAR, S, q + (size_t)t * sq, k + (size_t)t * sq, v + (size_t)t * sq,
			       alpha[(size_t)t * sab], beta[(size_t)t * sab], o + (size_t)t * so, dk, dv);
}

void ke_dn_rule_isa(int isa, float *S, const float *q, const float *k, const float *v, float alpha, float beta,
		    float *o, int dk, int dv)
{
	float u[DV_MAX];
	/* The model loader rejects dv > DV_MAX; this keeps a stray caller safe. */
	if (dv > DV_MAX)
		return;
#if defined(__x86_64__)
	if (isa >= KE_ISA_AVX2 && ke_isa_best() >= KE_ISA_AVX2 && dv % 8 == 0) {
		rule_avx2(S, q, k, v, alpha, beta, o, dk, dv, u);
		return;
	}
#endif
	(void)isa;
	rule_scalar(S, q, k, v, alpha, beta, o, dk, dv, u);
}

void ke_dn_rule(float *S, const float *q, const float *k, const float *v, float alpha, float beta, float *o,
		int dk, int dv)
{
	ke_dn_rule_isa(ke_isa(), S, q, k, v, alpha, beta, o, dk, dv);
}
