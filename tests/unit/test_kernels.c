/*
 * test_kernels.c - the engine's kernels: GEMM, vector ops, attention,
 * DeltaNet, sampler.
 *
 * Three kinds of checks: accuracy against double-precision naive code;
 * bit-identity between the scalar reference and the SIMD paths (skipped,
 * not passed, where the CPU lacks a path); and batch invariance -- a
 * row's bytes do not depend on how many rows, which chunk, which thread
 * range or which page size it was computed with.
 */
#include "kt.h"
#include "base/err.h"
#include "base/pages.h"
#include "engine/attn.h"
#include "engine/deltanet.h"
#include "engine/gemm.h"
#include "engine/isa.h"
#include "engine/kvq8.h"
#include "engine/matmul.h"
#include "engine/sample.h"
#include "engine/vec.h"
#include "model/safetensors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_seed = 12345;

static float frand(void)
{
	return (float)((double)(kt_rand(&g_seed) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

static int irand(int n)
{
	return (int)(kt_rand(&g_seed) % (uint64_t)n);
}

static uint16_t bf16_of(float f)
{
	uint16_t h;
	ke_vec_f32_to_bf16(&h, &f, 1);
	return h;
}

static float f_of_bf16(uint16_t h)
{
	float f;
	ke_vec_bf16_to_f32(&f, &h, 1);
	return f;
}

/* Weights as f32 or bf16 (w32 then holds the widened bf16 values). */
struct wmat {
	float *w32;
	uint16_t *w16;
	struct ke_mat m;
};

static void wmat_make(struct wmat *w, int N, int K, int bf)
{
	w->w32 = malloc((size_t)N * K * sizeof(float) + 64);
	w->w16 = malloc((size_t)N * K * 2 + 64);
	for (size_t i = 0; i < (size_t)N * K; i++) {
		float f = frand();
		w->w16[i] = bf16_of(f);
		w->w32[i] = bf ? f_of_bf16(w->w16[i]) : f;
	}
	struct ke_mat m = {bf ? (void *)w->w16 : (void *)w->w32, bf ? KV_DT_BF16 : KV_DT_F32, N, K, (size_t)K};
	w->m = m;
}

static void wmat_free(struct wmat *w)
{
	free(w->w32);
	free(w->w16);
}

static float *rand_vec(size_t n)
{
	float *v = malloc(n * sizeof *v + 64);
	for (size_t i = 0; i < n; i++)
		v[i] = frand();
	return v;
}

static const int g_K[] = {1, 5, 15, 16, 17, 31, 64, 100, 257};

KT_CASE(gemm_matches_double_reference)
{
	for (int bf = 0; bf < 2; bf++)
		for (size_t ki = 0; ki < sizeof g_K / sizeof g_K[0]; ki++) {
			int K = g_K[ki], M = 1 + irand(9), N = 1 + irand(40);
			struct wmat w;
			wmat_make(&w, N, K, bf);
			float *x = rand_vec((size_t)M * K), *y = malloc((size_t)M * N * sizeof *y);
			ke_gemm(&w.m, x, (size_t)K, M, y, (size_t)N, 0);
			for (int i = 0; i < M; i++)
				for (int n = 0; n < N; n++) {
					double ref = 0, mag = 0;
					for (int k = 0; k < K; k++) {
						ref += (double)x[i * K + k] * w.w32[(size_t)n * K + k];
						mag += fabs((double)x[i * K + k] * w.w32[(size_t)n * K + k]);
					}
					double err = fabs(y[i * N + n] - ref);
					KT_CHECKF(err <= 1e-6 * mag + 1e-30, "bf=%d K=%d (%d,%d): %g vs %g", bf, K, i, n,
						  y[i * N + n], ref);
				}
			free(x);
			free(y);
			wmat_free(&w);
		}
}

KT_CASE(gemm_simd_paths_bit_identical_to_scalar)
{
	int best = ke_isa_best();
	if (best == KE_ISA_SCALAR) {
		kt_skip("this CPU has no AVX2+FMA path to compare");
		return;
	}
	for (int rep = 0; rep < 60; rep++) {
		int bf = rep & 1, K = g_K[irand(9)] + (rep % 3 == 0 ? 256 : 0), M = 1 + irand(11), N = 1 + irand(50);
		unsigned fl = rep % 4 == 3 ? KE_GEMM_ACCUM : 0;
		struct wmat w;
		wmat_make(&w, N, K, bf);
		float *x = rand_vec((size_t)M * K), *y0 = rand_vec((size_t)M * N);
		float *y1 = malloc((size_t)M * N * sizeof *y1), *y2 = malloc((size_t)M * N * sizeof *y2);
		memcpy(y1, y0, (size_t)M * N * sizeof *y1);
		memcpy(y2, y0, (size_t)M * N * sizeof *y2);
		ke_gemm_range(KE_ISA_SCALAR, &w.m, x, (size_t)K, M, y0, (size_t)N, fl, 0, N);
		ke_gemm_range(KE_ISA_AVX2, &w.m, x, (size_t)K, M, y1, (size_t)N, fl, 0, N);
		KT_CHECKF(!memcmp(y0, y1, (size_t)M * N * sizeof *y0), "avx2 != scalar M=%d N=%d K=%d bf=%d", M, N, K, bf);
		if (best >= KE_ISA_AVX512) {
			ke_gemm_range(KE_ISA_AVX512, &w.m, x, (size_t)K, M, y2, (size_t)N, fl, 0, N);
			KT_CHECKF(!memcmp(y0, y2, (size_t)M * N * sizeof *y0), "avx512 != scalar M=%d N=%d K=%d bf=%d", M, N,
				  K, bf);
		}
		free(x);
		free(y0);
		free(y1);
		free(y2);
		wmat_free(&w);
	}
	if (best < KE_ISA_AVX512)
		kt_skip("AVX2 checked; this CPU has no AVX-512 path");
}

/* Rows longer than the AVX2 path's K piece (512): the accumulators are
 * parked between pieces, which must change no bit (vs scalar, vs M = 1). */
KT_CASE(gemm_long_rows_paths_bit_identical)
{
	int best = ke_isa_best();
	if (best == KE_ISA_SCALAR) {
		kt_skip("this CPU has no AVX2+FMA path to compare");
		return;
	}
	static const int Ks[] = {1025, 1536, 2047, 4100};
	for (int rep = 0; rep < 8; rep++) {
		int bf = rep & 1, K = Ks[rep % 4], M = 2 + irand(7), N = 1 + irand(70);
		unsigned fl = rep % 3 == 2 ? KE_GEMM_ACCUM : 0;
		struct wmat w;
		wmat_make(&w, N, K, bf);
		float *x = rand_vec((size_t)M * K), *y0 = rand_vec((size_t)M * N);
		float *y1 = malloc((size_t)M * N * sizeof *y1), *y2 = malloc((size_t)M * N * sizeof *y2);
		float *r1 = malloc((size_t)N * sizeof *r1);
		memcpy(y1, y0, (size_t)M * N * sizeof *y1);
		memcpy(y2, y0, (size_t)M * N * sizeof *y2);
		memcpy(r1, y0 + (size_t)(M - 1) * N, (size_t)N * sizeof *r1);
		ke_gemm_range(KE_ISA_SCALAR, &w.m, x, (size_t)K, M, y0, (size_t)N, fl, 0, N);
		ke_gemm_range(KE_ISA_AVX2, &w.m, x, (size_t)K, M, y1, (size_t)N, fl, 0, N);
		KT_CHECKF(!memcmp(y0, y1, (size_t)M * N * sizeof *y0), "avx2 != scalar M=%d N=%d K=%d bf=%d", M, N, K, bf);
		ke_gemm_range(KE_ISA_AVX2, &w.m, x + (size_t)(M - 1) * K, (size_t)K, 1, r1, (size_t)N, fl, 0, N);
		KT_CHECKF(!memcmp(r1, y1 + (size_t)(M - 1) * N, (size_t)N * sizeof *r1), "avx2 row M-1 != M=1, K=%d", K);
		if (best >= KE_ISA_AVX512) {
			ke_gemm_range(KE_ISA_AVX512, &w.m, x, (size_t)K, M, y2, (size_t)N, fl, 0, N);
			KT_CHECKF(!memcmp(y0, y2, (size_t)M * N * sizeof *y0), "avx512 != scalar M=%d N=%d K=%d", M, N, K);
		}
		free(x);
		free(y0);
		free(y1);
		free(y2);
		free(r1);
		wmat_free(&w);
	}
}

/* bf16 weights with many rows go through f32 panels widened once
 * (several panels when K is long), and longer rows through widened f32
 * blocks on the K-split sweep (AVX-512; several blocks and a ragged last
 * piece at 2500 and 4100): the same bits as the scalar path and as one
 * row at a time. */
KT_CASE(gemm_packed_panels_bit_identical)
{
	static const int Ks[] = {300, 700, 1024, 2500, 4100};
	for (int ki = 0; ki < 5; ki++) {
		int K = Ks[ki], M = 37, N = 100 + 7 * ki;
		unsigned fl = ki & 1 ? KE_GEMM_ACCUM : 0; /* y += on every other shape */
		struct wmat w;
		wmat_make(&w, N, K, 1);
		float *x = rand_vec((size_t)M * K), *yi = rand_vec((size_t)M * N);
		float *y0 = malloc((size_t)M * N * 4), *y1 = malloc((size_t)M * N * 4);
		memcpy(y0, yi, (size_t)M * N * 4);
		ke_gemm_range(KE_ISA_SCALAR, &w.m, x, (size_t)K, M, y0, (size_t)N, fl, 0, N);
		for (int isa = KE_ISA_AVX2; isa <= ke_isa_best(); isa++) {
			memcpy(y1, yi, (size_t)M * N * 4);
			ke_gemm_range(isa, &w.m, x, (size_t)K, M, y1, (size_t)N, fl, 0, N);
			KT_CHECKF(!memcmp(y0, y1, (size_t)M * N * 4), "%s != scalar K=%d", ke_isa_name(isa), K);
			memcpy(y1, yi + (size_t)(M - 1) * N, (size_t)N * 4);
			ke_gemm_range(isa, &w.m, x + (size_t)(M - 1) * K, (size_t)K, 1, y1, (size_t)N, fl, 3, N);
			KT_CHECKF(!memcmp(y0 + (size_t)(M - 1) * N + 3, y1 + 3, (size_t)(N - 3) * 4), "%s one row, K=%d",
				  ke_isa_name(isa), K);
		}
		free(x);
		free(yi);
		free(y0);
		free(y1);
		wmat_free(&w);
	}
}

/* Every tile of every path and its edge remainders (the prefill tiles are
 * 6 x 4 on AVX-512, 4 x 6 below 6 rows, 3 x 2 on AVX2; packed panels from
 * 32 rows): all M x N up to 13 x 13 and M 32..38, bf16 and f32, short,
 * ragged and long rows, against the scalar reference bit for bit. */
KT_CASE(gemm_every_tile_shape_bit_identical)
{
	static const int Ks[] = {16, 37, 517, 1300};
	for (int ki = 0; ki < 4; ki++)
		for (int bf = 0; bf < 2; bf++) {
			int K = Ks[ki];
			struct wmat w;
			wmat_make(&w, 13, K, bf);
			float *x = rand_vec((size_t)38 * K), *y0 = malloc(38 * 13 * 4), *y1 = malloc(38 * 13 * 4);
			for (int M = 1; M <= 38; M = M == 13 ? 32 : M + 1)
				for (int N = 1; N <= 13; N++) {
					struct ke_mat m = w.m;
					m.rows = N;
					ke_gemm_range(KE_ISA_SCALAR, &m, x, (size_t)K, M, y0, 13, 0, 0, N);
					for (int isa = KE_ISA_AVX2; isa <= ke_isa_best(); isa++) {
						memset(y1, 0, 38 * 13 * 4);
						ke_gemm_range(isa, &m, x, (size_t)K, M, y1, 13, 0, 0, N);
						int bad = 0;
						for (int i = 0; i < M; i++)
							bad |= memcmp(y0 + i * 13, y1 + i * 13, (size_t)N * 4) != 0;
						KT_CHECKF(!bad, "%s != scalar M=%d N=%d K=%d bf=%d", ke_isa_name(isa), M, N, K, bf);
					}
				}
			free(x);
			free(y0);
			free(y1);
			wmat_free(&w);
		}
}

KT_CASE(gemm_row_result_independent_of_m_and_split)
{
	/* the batch-invariance contract: decode (M=1) == prefill rows, whatever
	 * the threads, ranges, tiles or neighbours */
	for (int bf = 0; bf < 2; bf++)
		for (int isa = KE_ISA_SCALAR; isa <= ke_isa_best(); isa++) {
			int M = 37, N = 45, K = 300;
			struct wmat w;
			wmat_make(&w, N, K, bf);
			float *x = rand_vec((size_t)M * K), *full = malloc((size_t)M * N * 4), *part = malloc((size_t)M * N * 4);
			int saved = ke_isa();
			ke_isa_set(isa);
			ke_gemm(&w.m, x, (size_t)K, M, full, (size_t)N, 0);
			for (int i = 0; i < M; i++)
				ke_gemm(&w.m, x + (size_t)i * K, (size_t)K, 1, part + (size_t)i * N, (size_t)N, 0);
			KT_CHECKF(!memcmp(full, part, (size_t)M * N * 4), "M=1 rows differ (isa %s bf %d)", ke_isa_name(isa), bf);
			for (int rep = 0; rep < 10; rep++) {
				int i0 = irand(M), m = 1 + irand(M - i0), n0 = irand(N), n1 = n0 + 1 + irand(N - n0);
				memset(part, 0, (size_t)M * N * 4);
				ke_gemm_range(isa, &w.m, x + (size_t)i0 * K, (size_t)K, m, part + (size_t)i0 * N, (size_t)N, 0, n0, n1);
				for (int i = i0; i < i0 + m; i++)
					KT_CHECKF(!memcmp(full + (size_t)i * N + n0, part + (size_t)i * N + n0, (size_t)(n1 - n0) * 4),
						  "rows %d+%d cols [%d,%d) differ", i0, m, n0, n1);
			}
			ke_isa_set(saved);
			free(x);
			free(full);
			free(part);
			wmat_free(&w);
		}
}

KT_CASE(gemm_accum_and_unaligned_weights)
{
	int M = 3, N = 13, K = 77;
	struct wmat w;
	wmat_make(&w, N, K, 1);
	float *x = rand_vec((size_t)M * K), *y = malloc((size_t)M * N * 4), *acc = rand_vec((size_t)M * N);
	float *acc0 = malloc((size_t)M * N * 4);
	memcpy(acc0, acc, (size_t)M * N * 4);
	ke_gemm(&w.m, x, (size_t)K, M, y, (size_t)N, 0);
	ke_gemm(&w.m, x, (size_t)K, M, acc, (size_t)N, KE_GEMM_ACCUM);
	for (int i = 0; i < M * N; i++)
		KT_CHECK(acc[i] == acc0[i] + y[i]);
	/* bf16 data at an odd byte address and f32 data at a non-multiple of 4
	 * (safetensors from other writers) give the same bytes */
	char *b16 = malloc((size_t)N * K * 2 + 3), *b32 = malloc((size_t)N * K * 4 + 3);
	memcpy(b16 + 1, w.w16, (size_t)N * K * 2);
	memcpy(b32 + 3, w.w32, (size_t)N * K * 4);
	for (int isa = KE_ISA_SCALAR; isa <= ke_isa_best(); isa++) {
		float *y2 = malloc((size_t)M * N * 4), *y3 = malloc((size_t)M * N * 4);
		struct ke_mat u16 = {b16 + 1, KV_DT_BF16, N, K, (size_t)K}, u32 = {b32 + 3, KV_DT_F32, N, K, (size_t)K};
		ke_gemm_range(isa, &w.m, x, (size_t)K, M, y, (size_t)N, 0, 0, N);
		ke_gemm_range(isa, &u16, x, (size_t)K, M, y2, (size_t)N, 0, 0, N);
		ke_gemm_range(isa, &u32, x, (size_t)K, M, y3, (size_t)N, 0, 0, N);
		KT_CHECKF(!memcmp(y, y2, (size_t)M * N * 4), "unaligned bf16 differs on %s", ke_isa_name(isa));
		KT_CHECKF(!memcmp(y, y3, (size_t)M * N * 4), "unaligned f32 (bf16 values) differs on %s", ke_isa_name(isa));
		free(y2);
		free(y3);
	}
	free(b16);
	free(b32);
	free(x);
	free(y);
	free(acc);
	free(acc0);
	wmat_free(&w);
}

KT_CASE(dot_is_the_gemm_order)
{
	for (int rep = 0; rep < 40; rep++) {
		int n = 1 + irand(300);
		float *a = rand_vec((size_t)n), *b = rand_vec((size_t)n), y;
		float r = ke_dot_ref(a, b, n);
		struct ke_mat m = {b, KV_DT_F32, 1, n, (size_t)n};
		ke_gemm_range(KE_ISA_SCALAR, &m, a, (size_t)n, 1, &y, 1, 0, 0, 1);
		KT_CHECK(r == y);
		for (int isa = KE_ISA_SCALAR; isa <= ke_isa_best(); isa++)
			KT_CHECKF(ke_vec_dot_isa(isa, a, b, n) == r, "n=%d isa %s", n, ke_isa_name(isa));
		free(a);
		free(b);
	}
}

KT_CASE(exp_accuracy_and_paths)
{
	double worst = 0;
	for (int i = 0; i <= 200000; i++) {
		float x = -85.0f + 170.0f * (float)i / 200000.0f;
		double e = exp((double)x), r = fabs((double)ke_exp(x) - e) / e;
		if (r > worst)
			worst = r;
	}
	KT_CHECKF(worst < 4e-7, "ke_exp max relative error %g", worst);
	KT_CHECK(ke_exp(0.0f) == 1.0f);
	KT_CHECK(ke_exp(-1000.0f) > 0.0f && ke_exp(-1000.0f) < 1e-37f);
	KT_CHECK(isfinite(ke_exp(1000.0f)));
	int n = 1003;
	float *x = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
	for (int i = 0; i < n; i++)
		x[i] = i < 10 ? (float)(i * 40 - 200) : frand() * 100.0f;
	ke_vec_exp_isa(KE_ISA_SCALAR, a, x, n);
	if (ke_isa_best() >= KE_ISA_AVX2) {
		for (int isa = KE_ISA_AVX2; isa <= ke_isa_best(); isa++) {
			ke_vec_exp_isa(isa, b, x, n);
			KT_CHECKF(!memcmp(a, b, (size_t)n * 4), "exp %s != scalar", ke_isa_name(isa));
		}
	} else {
		kt_skip("no AVX2 path on this CPU (accuracy checked)");
	}
	free(x);
	free(a);
	free(b);
}

/* The final softcap's canonical tanh: every path the scalar's bits
 * (NaN kept, infinities to +-cap), and near libm's tanh in double across
 * both branches (|x / cap| below and above 0.25) and the clamp. */
KT_CASE(softcap_paths_and_accuracy)
{
	const float cap = 30.0f;
	const size_t n = 4099;
	float *x = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
	for (size_t i = 0; i < n; i++)
		x[i] = i < 2000 ? (float)((double)i - 1000.0) * 0.0125f /* +-12.5: across |x / cap| = 0.25 */
			       : (frand() - 0.5f) * (i % 3 ? 200.0f : 4000.0f);
	x[0] = NAN, x[1] = INFINITY, x[2] = -INFINITY, x[3] = 1e-30f, x[4] = -7.5f, x[5] = 7.5f, x[6] = 3000.0f;
	memcpy(a, x, n * 4);
	ke_vec_softcap_isa(KE_ISA_SCALAR, a, cap, n);
	double worst = 0;
	for (size_t i = 1; i < n; i++) {
		const double r = (double)cap * tanh((double)x[i] / cap), e = fabs(a[i] - r) / (fabs(r) + 1e-30);
		worst = e > worst ? e : worst;
		KT_CHECKF(e <= 1e-6, "softcap(%g) = %.9g, want %.9g (relative error %.3g)", x[i], a[i], r, e);
	}
	fprintf(stderr, "  softcap: worst relative error %.3g against double tanh\n", worst);
	KT_CHECK(isnan(a[0]) && a[1] == cap && a[2] == -cap);
	if (ke_isa_best() < KE_ISA_AVX2)
		kt_skip("no AVX2 path on this CPU (accuracy checked)");
	for (int isa = KE_ISA_AVX2; isa <= ke_isa_best(); isa++) {
		memcpy(b, x, n * 4);
		ke_vec_softcap_isa(isa, b, cap, n);
		KT_CHECKF(!memcmp(a, b, n * 4), "softcap %s != scalar", ke_isa_name(isa));
	}
	free(x);
	free(a);
	free(b);
}

KT_CASE(gelu_paths_and_accuracy)
{
	/* gelu_tanh(x) * u: the canonical tanh inside, the same bits on every
	 * path (tails of 1..15 included). Accuracy against the double formula:
	 * within 1e-6 relative, plus what 1 + tanh's rounding costs where tanh
	 * is near -1 (0.5 |x| |u| times 2.5e-7: the cancellation any float
	 * evaluation of this formula has, libm's tanhf's or torch's) */
	const int n = 4099;
	float *x = malloc((size_t)n * 4), *u = malloc((size_t)n * 4), *a = malloc((size_t)n * 4),
	      *b = malloc((size_t)n * 4);
	for (int i = 0; i < n; i++) {
		x[i] = i < 2000 ? (float)(i - 1000) * 0.006f /* +-6: across the tanh's 0.25 boundary */
				: (frand() - 0.5f) * (i % 3 ? 20.0f : 400.0f);
		u[i] = frand() - 0.5f;
	}
	x[0] = NAN, x[1] = INFINITY, x[2] = -INFINITY, x[3] = 1e-30f, x[4] = -0.0f, x[5] = 60.0f, x[6] = -60.0f;
	for (int with_u = 0; with_u < 2; with_u++) {
		const float *uu = with_u ? u : NULL;
		memcpy(a, x, (size_t)n * 4);
		ke_vec_gelu_tanh_mul_isa(KE_ISA_SCALAR, a, uu, n);
		double worst = 0;
		for (int i = 3; i < n; i++) {
			const double v = x[i], r = 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))) *
						   (with_u ? (double)u[i] : 1.0);
			const double bound = 1e-6 * fabs(r) + 2.5e-7 * 0.5 * fabs(v) * (with_u ? fabs((double)u[i]) : 1.0);
			const double e = fabs(a[i] - r) / (bound + 1e-300);
			worst = e > worst ? e : worst;
			KT_CHECKF(fabs(a[i] - r) <= bound, "gelu(%g)%s = %.9g, want %.9g (error %.3g of the bound)", x[i],
				  with_u ? " * u" : "", a[i], r, e);
		}
		if (with_u)
			fprintf(stderr, "  gelu: worst error %.3g of the bound against double tanh\n", worst);
		else
			KT_CHECK(isnan(a[0]) && isnan(a[1]) == 0 && a[1] == INFINITY && isnan(a[2]));
		for (int isa = KE_ISA_AVX2; isa <= ke_isa_best(); isa++)
			for (int len = n; len >= n - 15; len -= 5) {
				memcpy(b, x, (size_t)n * 4);
				ke_vec_gelu_tanh_mul_isa(isa, b, uu, len);
				KT_CHECKF(!memcmp(a, b, (size_t)len * 4), "gelu %s (n %d) != scalar", ke_isa_name(isa), len);
			}
	}
	if (ke_isa_best() < KE_ISA_AVX2)
		kt_skip("no AVX2 path on this CPU (accuracy checked)");
	free(x);
	free(u);
	free(a);
	free(b);
}

KT_CASE(silu_axpy_paths_and_accuracy)
{
	int n = 1000 + irand(100);
	float *g = rand_vec((size_t)n), *u = rand_vec((size_t)n), *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
	for (int i = 0; i < n; i++)
		g[i] *= 30.0f;
	memcpy(a, g, (size_t)n * 4);
	ke_vec_silu_mul_isa(KE_ISA_SCALAR, a, u, n);
	for (int i = 0; i < n; i++) {
		double s = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
		KT_CHECKF(fabs(a[i] - s) <= 1e-6 * fabs(s) + 1e-30, "silu(%g)*%g = %g, want %g", g[i], u[i], a[i], s);
	}
	if (ke_isa_best() < KE_ISA_AVX2) {
		kt_skip("no AVX2 path on this CPU (accuracy checked)");
		goto out;
	}
	memcpy(b, g, (size_t)n * 4);
	ke_vec_silu_mul_isa(KE_ISA_AVX2, b, u, n);
	KT_CHECK(!memcmp(a, b, (size_t)n * 4));
	uint16_t *v16 = malloc((size_t)n * 2);
	for (int i = 0; i < n; i++)
		v16[i] = bf16_of(u[i]);
	memcpy(a, g, (size_t)n * 4);
	memcpy(b, g, (size_t)n * 4);
	ke_vec_axpy_isa(KE_ISA_SCALAR, a, 0.37f, u, n);
	ke_vec_axpy_isa(KE_ISA_AVX2, b, 0.37f, u, n);
	KT_CHECK(!memcmp(a, b, (size_t)n * 4));
	ke_vec_axpy_bf16_isa(KE_ISA_SCALAR, a, -1.3f, v16, n);
	ke_vec_axpy_bf16_isa(KE_ISA_AVX2, b, -1.3f, v16, n);
	KT_CHECK(!memcmp(a, b, (size_t)n * 4));
	free(v16);
out:
	free(g);
	free(u);
	free(a);
	free(b);
}

KT_CASE(rmsnorm_matches_double)
{
	int n = 200;
	float *x = rand_vec((size_t)n), *w = rand_vec((size_t)n), *o = malloc((size_t)n * 4);
	ke_vec_rmsnorm(o, x, w, n, 1e-6f);
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	double r = 1.0 / sqrt(ss / n + 1e-6);
	for (int i = 0; i < n; i++)
		KT_CHECK(fabs(o[i] - x[i] * r * w[i]) <= 1e-6 * fabs(x[i] * r * w[i]) + 1e-7);
	ke_vec_rmsnorm(x, x, NULL, n, 1e-6f); /* in place, no weight */
	double s2 = 0;
	for (int i = 0; i < n; i++)
		s2 += (double)x[i] * x[i];
	KT_CHECK(fabs(s2 / n - 1.0) < 1e-4);
	free(x);
	free(w);
	free(o);
}

/* --- attention ------------------------------------------------------------- */

struct kvfix {
	struct ke_layout lay;
	struct kv_pages *pool;
	struct kv_page *pages[128];
	int n_pages;
};

/* One attention layer, Hkv heads of hd, B tokens per page, T positions of
 * K/V from kv (positions x heads x hd each for K then V); bf: 0 f32 rows,
 * 1 bf16, 2 q8_0 (the engine's quantizer, engine/kvq8.h). */
static void kvfix_make(struct kvfix *f, int Hkv, int hd, int B, int T, int bf, const float *kk, const float *vv)
{
	int dt = bf == 2 ? KV_DT_Q8_0 : bf ? KV_DT_BF16 : KV_DT_F32;
	memset(f, 0, sizeof *f);
	f->lay.page_tokens = B;
	f->lay.kv_dtype = dt;
	f->lay.n_attn_layers = 1;
	f->lay.n_kv_heads = Hkv;
	f->lay.head_dim = hd;
	f->lay.n_segments = 2 * Hkv;
	f->lay.row_bytes = ke_layout_row_bytes(dt, hd);
	f->lay.page_bytes = (size_t)f->lay.n_segments * B * f->lay.row_bytes;
	f->pool = kv_pages_create(f->lay.page_bytes, 0, 0);
	f->n_pages = (T + B - 1) / B;
	for (int i = 0; i < f->n_pages; i++)
		f->pages[i] = kv_page_alloc(f->pool);
	for (int t = 0; t < T; t++)
		for (int g = 0; g < Hkv; g++)
			for (int kv = 0; kv < 2; kv++) {
				const float *src = (kv ? vv : kk) + ((size_t)t * Hkv + g) * hd;
				char *dst = (char *)f->pages[t / B]->data + ke_layout_row_off(&f->lay, kv * Hkv + g, t % B, B);
				if (bf == 2)
					ke_kvq8_quant_row(dst, src, hd);
				else if (bf)
					ke_vec_f32_to_bf16(dst, src, (size_t)hd);
				else
					memcpy(dst, src, (size_t)hd * 4);
			}
}

static void kvfix_free(struct kvfix *f)
{
	for (int i = 0; i < f->n_pages; i++)
		kv_page_unref(f->pages[i]);
	kv_pages_destroy(f->pool);
}

static void run_attn(struct kvfix *f, int H, const float *q, float *out, int pos0, int n, float *scr, int threads)
{
	struct ke_attn_args a = {&f->lay, f->pages, 0, H, q, out, pos0, n, 0.25f, scr, threads};
	ke_attn(&a);
}

KT_CASE(attention_matches_naive_softmax)
{
	int H = 6, Hkv = 2, hd = 40, T = 150, G = H / Hkv;
	for (int bf = 0; bf < 2; bf++) {
		float *kk = rand_vec((size_t)T * Hkv * hd), *vv = rand_vec((size_t)T * Hkv * hd);
		float *q = rand_vec((size_t)T * H * hd), *out = malloc((size_t)T * H * hd * 4);
		for (size_t i = 0; i < (size_t)T * H * hd; i++)
			q[i] *= 3.0f; /* peaky softmax */
		struct kvfix f;
		kvfix_make(&f, Hkv, hd, 32, T, bf, kk, vv);
		float *scr = malloc(16 * ke_attn_scratch_floats(G, hd) * 4);
		run_attn(&f, H, q, out, 0, T, scr, 16);
		double worst = 0;
		for (int t = 0; t < T; t++)
			for (int h = 0; h < H; h++) {
				int g = h / G;
				double s[150], mx = -1e300, sum = 0;
				for (int j = 0; j <= t; j++) {
					double d = 0;
					for (int i = 0; i < hd; i++) {
						float kf = kk[((size_t)j * Hkv + g) * hd + i];
						if (bf)
							kf = f_of_bf16(bf16_of(kf));
						d += (double)q[((size_t)t * H + h) * hd + i] * kf;
					}
					s[j] = d * 0.25;
					mx = s[j] > mx ? s[j] : mx;
				}
				for (int j = 0; j <= t; j++)
					sum += (s[j] = exp(s[j] - mx));
				for (int i = 0; i < hd; i++) {
					double o = 0;
					for (int j = 0; j <= t; j++) {
						float vf = vv[((size_t)j * Hkv + g) * hd + i];
						if (bf)
							vf = f_of_bf16(bf16_of(vf));
						o += s[j] / sum * vf;
					}
					double e = fabs(out[((size_t)t * H + h) * hd + i] - o);
					worst = e > worst ? e : worst;
				}
			}
		KT_CHECKF(worst < 2e-5, "bf=%d max abs error %g", bf, worst);
		kvfix_free(&f);
		free(kk);
		free(vv);
		free(q);
		free(out);
		free(scr);
	}
}

KT_CASE(attention_invariant_to_chunks_threads_and_page_size)
{
	int H = 4, Hkv = 2, hd = 32, T = 300, G = H / Hkv;
	float *kk = rand_vec((size_t)T * Hkv * hd), *vv = rand_vec((size_t)T * Hkv * hd);
	float *q = rand_vec((size_t)T * H * hd);
	size_t sz = (size_t)T * H * hd * 4;
	float *full = malloc(sz), *part = malloc(sz);
	float *scr = malloc(16 * ke_attn_scratch_floats(G, hd) * 4);
	struct kvfix f, f2;
	kvfix_make(&f, Hkv, hd, 64, T, 1, kk, vv);
	kvfix_make(&f2, Hkv, hd, 7, T, 1, kk, vv); /* other page size, same rows */
	run_attn(&f, H, q, full, 0, T, scr, 16);
	for (int t = 0; t < T; t++) /* one query at a time, single thread */
		run_attn(&f, H, q + (size_t)t * H * hd, part + (size_t)t * H * hd, t, 1, scr, 1);
	KT_CHECK(!memcmp(full, part, sz));
	for (int rep = 0; rep < 10; rep++) {
		memset(part, 0, sz);
		for (int t = 0; t < T;) {
			int n = 1 + irand(90);
			if (t + n > T)
				n = T - t;
			run_attn(&f2, H, q + (size_t)t * H * hd, part + (size_t)t * H * hd, t, n, scr, rep % 2 ? 16 : 1);
			t += n;
		}
		KT_CHECKF(!memcmp(full, part, sz), "random chunks, page size 7, rep %d", rep);
	}
	kvfix_free(&f);
	kvfix_free(&f2);
	free(kk);
	free(vv);
	free(q);
	free(full);
	free(part);
	free(scr);
}

/* Contexts longer than one KE_ATTN_SPLIT chunk: the chunk merges of a
 * prefill, of a decode step split over chunks and threads, of any query
 * chunking and of every CPU path give the same bits; and the merged
 * result is still the softmax. */
KT_CASE(attention_key_split_prefill_equals_decode_and_paths)
{
	int H = 8, Hkv = 2, hd = 64, T = 2 * KE_ATTN_SPLIT + 76, G = H / Hkv;
	float *kk = rand_vec((size_t)T * Hkv * hd), *vv = rand_vec((size_t)T * Hkv * hd);
	float *q = rand_vec((size_t)T * H * hd);
	size_t row = (size_t)H * hd, sz = (size_t)T * row * 4;
	float *full = malloc(sz), *part = malloc(sz), *one = malloc(row * 4);
	float *scr = malloc(16 * ke_attn_scratch_floats(G, hd) * 4);
	struct kvfix f, f2;
	kvfix_make(&f, Hkv, hd, 64, T, 1, kk, vv);
	kvfix_make(&f2, Hkv, hd, 48, T, 1, kk, vv);
	run_attn(&f, H, q, full, 0, T, scr, 16);
	/* decode steps across the chunk starts, split (16) and serial (1) */
	int probe[] = {0, 1, 300, KE_ATTN_SPLIT - 1, KE_ATTN_SPLIT, KE_ATTN_SPLIT + 1, 900, 2 * KE_ATTN_SPLIT - 1,
		       2 * KE_ATTN_SPLIT, T - 1};
	for (size_t i = 0; i < sizeof probe / sizeof probe[0]; i++)
		for (int th = 1; th <= 16; th += 15) {
			int t = probe[i];
			run_attn(&f, H, q + (size_t)t * row, one, t, 1, scr, th);
			KT_CHECKF(!memcmp(one, full + (size_t)t * row, row * 4), "decode at %d, %d threads", t, th);
		}
	/* a small batch of queries (one tile, split) across a chunk start */
	run_attn(&f2, H, q + (size_t)(KE_ATTN_SPLIT - 3) * row, part, KE_ATTN_SPLIT - 3, 6, scr, 16);
	KT_CHECK(!memcmp(part, full + (size_t)(KE_ATTN_SPLIT - 3) * row, 6 * row * 4));
	for (int rep = 0; rep < 3; rep++) {
		memset(part, 0, sz);
		for (int t = 0; t < T;) {
			int n = 1 + irand(400);
			if (t + n > T)
				n = T - t;
			run_attn(&f2, H, q + (size_t)t * row, part + (size_t)t * row, t, n, scr, rep % 2 ? 16 : 1);
			t += n;
		}
		KT_CHECKF(!memcmp(full, part, sz), "random chunks, page size 48, rep %d", rep);
	}
	int saved = ke_isa();
	for (int isa = KE_ISA_SCALAR; isa <= ke_isa_best(); isa++) {
		ke_isa_set(isa);
		run_attn(&f, H, q, part, 0, T, scr, 16);
		KT_CHECKF(!memcmp(full, part, sz), "isa %s", ke_isa_name(isa));
		run_attn(&f, H, q + (size_t)(T - 1) * row, one, T - 1, 1, scr, 16);
		KT_CHECKF(!memcmp(one, full + (size_t)(T - 1) * row, row * 4), "decode, isa %s", ke_isa_name(isa));
	}
	ke_isa_set(saved);
	/* the merged chunks are the softmax over all keys (double reference) */
	double worst = 0;
	for (int t = T - 3; t < T; t++)
		for (int h = 0; h < H; h++) {
			int g = h / G;
			double *s = malloc((size_t)T * sizeof *s), mx = -1e300, sum = 0;
			for (int j = 0; j <= t; j++) {
				double d = 0;
				for (int i = 0; i < hd; i++)
					d += (double)q[(size_t)t * row + (size_t)h * hd + i] *
					     f_of_bf16(bf16_of(kk[((size_t)j * Hkv + g) * hd + i]));
				s[j] = d * 0.25;
				mx = s[j] > mx ? s[j] : mx;
			}
			for (int j = 0; j <= t; j++)
				sum += (s[j] = exp(s[j] - mx));
			for (int i = 0; i < hd; i++) {
				double o = 0;
				for (int j = 0; j <= t; j++)
					o += s[j] / sum * f_of_bf16(bf16_of(vv[((size_t)j * Hkv + g) * hd + i]));
				double e = fabs(full[(size_t)t * row + (size_t)h * hd + i] - o);
				worst = e > worst ? e : worst;
			}
			free(s);
		}
	KT_CHECKF(worst < 2e-5, "max abs error %g", worst);
	kvfix_free(&f);
	kvfix_free(&f2);
	free(kk);
	free(vv);
	free(q);
	free(full);
	free(part);
	free(one);
	free(scr);
}

/* The wide tiles' scores with the query rows in the vector lanes (AVX-512,
 * head_dim a multiple of 16, a constant-size kernel at 128): every path,
 * bf16 and f32 KV, prefill in one call or two, give the bits of the scalar
 * path. The last tiles of the shapes have 44, 30 and 15 rows (3, 2 and 1
 * row vectors, the last one masked); key groups are cut by the end of a
 * block; head_dim 256 (24-row tiles, the gemm scores) is checked too. */
/* Random K, V and queries of T tokens (H query heads over Hkv KV heads
 * of head_dim hd), a reference output buffer and scratch for 16 threads:
 * what the attention path tests below share. */
struct acase {
	float *kk, *vv, *q, *ref, *scr;
	size_t row, sz; /* floats per token of q/out, bytes of T tokens */
};

static void acase_make(struct acase *a, int H, int Hkv, int hd, int T)
{
	a->kk = rand_vec((size_t)T * Hkv * hd);
	a->vv = rand_vec((size_t)T * Hkv * hd);
	a->q = rand_vec((size_t)T * H * hd);
	a->row = (size_t)H * hd;
	a->sz = (size_t)T * a->row * 4;
	a->ref = malloc(a->sz);
	a->scr = malloc(16 * ke_attn_scratch_floats(H / Hkv, hd) * 4);
}

/* KV pages of 48 tokens (bf16 or f32) into f, and the scalar path's
 * prefill of all T tokens into a->ref; the ISA is left as it was. */
static void acase_ref(struct acase *a, struct kvfix *f, int H, int Hkv, int hd, int T, int bf)
{
	kvfix_make(f, Hkv, hd, 48, T, bf, a->kk, a->vv);
	int saved = ke_isa();
	ke_isa_set(KE_ISA_SCALAR);
	run_attn(f, H, a->q, a->ref, 0, T, a->scr, 1);
	ke_isa_set(saved);
}

static void acase_free(struct acase *a)
{
	free(a->kk);
	free(a->vv);
	free(a->q);
	free(a->ref);
	free(a->scr);
}

KT_CASE(attention_lane_scores_match_scalar_at_head_dims)
{
	static const int shapes[][4] = {{8, 2, 128, 131}, {4, 2, 128, 111}, {6, 2, 64, 101}, {4, 2, 256, 125}};
	for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
		int H = shapes[si][0], Hkv = shapes[si][1], hd = shapes[si][2], T = shapes[si][3], G = H / Hkv;
		struct acase a;
		acase_make(&a, H, Hkv, hd, T);
		float *q = a.q, *ref = a.ref, *scr = a.scr, *out = malloc(a.sz);
		size_t row = a.row, sz = a.sz;
		for (int bf = 0; bf < 2; bf++) {
			struct kvfix f;
			acase_ref(&a, &f, H, Hkv, hd, T, bf);
			int saved = ke_isa();
			for (int isa = KE_ISA_AVX2; isa <= ke_isa_best(); isa++) {
				ke_isa_set(isa);
				memset(out, 0, sz);
				run_attn(&f, H, q, out, 0, T, scr, 1);
				KT_CHECKF(!memcmp(out, ref, sz), "hd %d G %d bf %d isa %s, one call", hd, G, bf,
					  ke_isa_name(isa));
				memset(out, 0, sz);
				run_attn(&f, H, q, out, 0, 70, scr, 16);
				run_attn(&f, H, q + 70 * row, out + 70 * row, 70, T - 70, scr, 16);
				KT_CHECKF(!memcmp(out, ref, sz), "hd %d G %d bf %d isa %s, two calls", hd, G, bf,
					  ke_isa_name(isa));
			}
			ke_isa_set(saved);
			kvfix_free(&f);
		}
		acase_free(&a);
		free(out);
	}
}

/* Decode (narrow) tiles of 1, 2, 4 and 8 rows take the AVX-512 decode
 * score kernel (qk_narrow: 16 / R keys per register tile, the tail keys of
 * a block masked) and 3 rows the gemm tiles: every decode step and 2-token
 * step equals the scalar path's prefill bit for bit, single and split
 * (past a chunk start), bf16 and f32 KV, pages of 48 tokens. */
KT_CASE(attention_decode_scores_match_scalar)
{
	static const int shapes[][3] = {{4, 4, 128}, {8, 4, 256}, {8, 2, 128}, {8, 1, 64}, {6, 2, 128}};
	static const int probe[] = {0, 1, 14, 62, 63, 64, 300, 511, 512, 513, 601};
	int T = 603;
	for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
		int H = shapes[si][0], Hkv = shapes[si][1], hd = shapes[si][2], G = H / Hkv;
		struct acase a;
		acase_make(&a, H, Hkv, hd, T);
		float *q = a.q, *ref = a.ref, *scr = a.scr, *out = malloc(2 * a.row * 4);
		size_t row = a.row;
		for (int bf = 0; bf < 2; bf++) {
			struct kvfix f;
			acase_ref(&a, &f, H, Hkv, hd, T, bf);
			int saved = ke_isa();
			for (int isa = KE_ISA_AVX2; isa <= ke_isa_best(); isa++) {
				ke_isa_set(isa);
				for (size_t i = 0; i < sizeof probe / sizeof probe[0]; i++)
					for (int n = 1; n <= 2; n++)
						for (int th = 1; th <= 16; th += 15) {
							int t = probe[i];
							run_attn(&f, H, q + (size_t)t * row, out, t, n, scr, th);
							KT_CHECKF(!memcmp(out, ref + (size_t)t * row, (size_t)n * row * 4),
								  "G %d hd %d bf %d isa %s at %d, %d tokens, %d threads", G, hd,
								  bf, ke_isa_name(isa), t, n, th);
						}
			}
			ke_isa_set(saved);
			kvfix_free(&f);
		}
		acase_free(&a);
		free(out);
	}
}

/* --- 8-bit KV (engine/kvq8.h) --------------------------------------------------- */

/* The quantizer against its definition: d is the half of amax / 127
 * (saturated at 65504), codes are rint(x / d) in [-127, 127], each value
 * reads back within half a step (the block's largest within a step when
 * d rounded down and it clamped); zeros, subnormal-only, huge, inf and
 * NaN blocks; and the 34-byte ggml Q8_0 block layout. */
KT_CASE(kvq8_quantizer_matches_its_definition)
{
	enum { N = 256 };
	float x[N], y[N];
	uint8_t row[N / 32 * 34];
	KT_EQ_U64(ke_kvq8_row_bytes(N), sizeof row);
	for (int rep = 0; rep < 400; rep++) {
		float scale = rep % 4 == 0 ? 1e-3f : rep % 4 == 1 ? 1.0f : rep % 4 == 2 ? 300.0f : 1e-6f;
		for (int i = 0; i < N; i++)
			x[i] = frand() * scale;
		if (rep % 5 == 0)
			x[irand(N)] = 0.0f;
		ke_kvq8_quant_row(row, x, N);
		ke_kvq8_dequant_row(y, row, N);
		for (int b = 0; b < N / 32; b++) {
			const uint8_t *blk = row + b * 34;
			float amax = 0;
			for (int j = 0; j < 32; j++)
				amax = fmaxf(amax, fabsf(x[b * 32 + j]));
			uint16_t h = (uint16_t)(blk[0] | blk[1] << 8);
			KT_EQ_INT(h, kv_f32_to_f16(amax / 127.0f));
			float d = ke_kvq8_scale(blk);
			KT_CHECK(d == kv_f16_to_f32(h));
			for (int j = 0; j < 32; j++) {
				int q = (int8_t)blk[2 + j];
				float v = x[b * 32 + j];
				KT_CHECKF(q >= -127 && q <= 127, "code %d", q);
				if (d == 0.0f) {
					KT_EQ_INT(q, 0);
					continue;
				}
				float want = rintf(v / d);
				want = want > 127 ? 127 : want < -127 ? -127 : want;
				KT_CHECKF(q == (int)want, "rep %d block %d elem %d: code %d, rint(x / d) %g", rep, b, j, q, want);
				KT_CHECK(y[b * 32 + j] == (float)q * d); /* exact */
				KT_CHECKF(fabsf(y[b * 32 + j] - v) <= (fabsf(v) == amax ? 1.01f : 0.5f) * d,
					  "rep %d: %g read back as %g (d %g)", rep, v, y[b * 32 + j], d);
			}
		}
	}
	/* edge blocks */
	for (int i = 0; i < 32; i++)
		x[i] = 0.0f, x[32 + i] = (float)i * 1e-30f, x[64 + i] = (i - 16) * 1e7f, x[96 + i] = (float)i;
	x[96 + 5] = INFINITY;
	for (int i = 128; i < N; i++)
		x[i] = (float)(i - 128);
	x[200] = NAN;
	ke_kvq8_quant_row(row, x, N);
	ke_kvq8_dequant_row(y, row, N);
	for (int i = 0; i < 64; i++)
		KT_CHECKF(y[i] == 0.0f, "zero / subnormal-only block: %g at %d", y[i], i);
	KT_EQ_INT(row[2 * 34] | row[2 * 34 + 1] << 8, 0x7bff); /* saturated at 65504 */
	KT_CHECK(y[64] == -127.0f * 65504.0f && y[64 + 31] == 127.0f * 65504.0f);
	for (int i = 96; i < 128; i++)
		KT_CHECKF(isnan(y[i]), "inf block: %g at %d", y[i], i);
	for (int i = 192; i < 224; i++)
		KT_CHECKF(isnan(y[i]), "NaN block: %g at %d", y[i], i);
	for (int i = 224; i < 256; i++)
		KT_CHECK(!isnan(y[i]) && fabsf(y[i] - x[i]) <= 0.5f * ke_kvq8_scale(row + 7 * 34));
	/* a half NaN (quiet or signalling) reads as a quiet NaN, as F16C gives */
	uint8_t sn[2] = {0x01, 0x7c};
	float f = ke_kvq8_scale(sn);
	uint32_t u;
	memcpy(&u, &f, 4);
	KT_CHECKF(isnan(f) && (u & 0x00400000u), "signalling half NaN read as %08x", u);
}

/* q8_0 rows (dt 2) and f32 rows holding their exact values (dequantized)
 * into f / fd, pages of B tokens. */
static void kvfix_q8_pair(struct kvfix *f, struct kvfix *fd, int Hkv, int hd, int B, int T, const float *kk,
			  const float *vv)
{
	size_t n = (size_t)T * Hkv;
	float *dk = malloc(n * hd * 4), *dv = malloc(n * hd * 4);
	uint8_t *row = malloc(ke_kvq8_row_bytes(hd));
	for (size_t r = 0; r < n; r++) {
		ke_kvq8_quant_row(row, kk + r * hd, hd);
		ke_kvq8_dequant_row(dk + r * hd, row, hd);
		ke_kvq8_quant_row(row, vv + r * hd, hd);
		ke_kvq8_dequant_row(dv + r * hd, row, hd);
	}
	kvfix_make(f, Hkv, hd, B, T, 2, kk, vv);
	kvfix_make(fd, Hkv, hd, B, T, 0, dk, dv);
	free(dk);
	free(dv);
	free(row);
}

/*
 * The attention kernels on q8_0 KV, every path this CPU has: they read the
 * 34-byte blocks directly (scores and PV of decode tiles in registers on
 * AVX-512 and AVX2, wide tiles dequantizing each key and value row once
 * per tile, the scalar path through a small f32 buffer), and give the
 * bits of attention over f32 rows holding the dequantized values, which
 * is the scalar reference (its paths are tested equal above). Checked for
 * G = 1, 2, 4 (the AVX-512 decode kernel's 1, 2, 4 rows), 3 (the gemm
 * fallback) and 8 (lane scores), head_dim 32, 64, 128 and 256, a context
 * over one KE_ATTN_SPLIT chunk: whole prefill, decode and 2-token steps
 * at the block and chunk edges (1 and 16 threads: the split decode),
 * random query chunks on pages of 7 tokens (the best path; the others'
 * chunk invariance is the f32 kernels' tests); and against a double
 * softmax.
 */
KT_CASE(attention_q8_kv_paths_match_scalar_and_f32_of_its_values)
{
	static const int shapes[][3] = {{4, 4, 128}, {8, 4, 256}, {8, 2, 64}, {6, 2, 32}, {8, 1, 128}, {16, 2, 128}};
	static const int probe[] = {0, 1, 31, 63, 64, 300, 511, 512, 513, 538};
	int T = 540;
	for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
		int H = shapes[si][0], Hkv = shapes[si][1], hd = shapes[si][2], G = H / Hkv;
		struct acase a;
		acase_make(&a, H, Hkv, hd, T);
		for (size_t i = 0; i < (size_t)T * H * hd; i++)
			a.q[i] *= 3.0f; /* peaky softmax: the scores matter */
		float *q = a.q, *scr = a.scr, *out = malloc(a.sz), *ref = a.ref;
		size_t row = a.row, sz = a.sz;
		struct kvfix f, fd, f7, fd7;
		kvfix_q8_pair(&f, &fd, Hkv, hd, 48, T, a.kk, a.vv);
		kvfix_q8_pair(&f7, &fd7, Hkv, hd, 7, T, a.kk, a.vv);
		int saved = ke_isa();
		ke_isa_set(KE_ISA_SCALAR);
		run_attn(&fd, H, q, ref, 0, T, scr, 1); /* the reference: f32 rows, scalar */
		for (int isa = KE_ISA_SCALAR; isa <= ke_isa_best(); isa++) {
			ke_isa_set(isa);
			memset(out, 0, sz);
			run_attn(&f, H, q, out, 0, T, scr, 16);
			KT_CHECKF(!memcmp(out, ref, sz), "G %d hd %d isa %s: q8 prefill differs from the f32 of its values", G,
				  hd, ke_isa_name(isa));
			for (size_t i = 0; i < sizeof probe / sizeof probe[0]; i++)
				for (int n = 1; n <= 2; n++)
					for (int th = 1; th <= 16; th += 15) {
						int t = probe[i];
						run_attn(&f, H, q + (size_t)t * row, out, t, n, scr, th);
						KT_CHECKF(!memcmp(out, ref + (size_t)t * row, (size_t)n * row * 4),
							  "G %d hd %d isa %s: decode at %d, %d tokens, %d threads", G, hd,
							  ke_isa_name(isa), t, n, th);
					}
			if (isa != ke_isa_best())
				continue; /* (the chunking of the other paths: below) */
			memset(out, 0, sz);
			for (int t = 0; t < T;) {
				int n = 1 + irand(130);
				if (t + n > T)
					n = T - t;
				run_attn(&f7, H, q + (size_t)t * row, out + (size_t)t * row, t, n, scr, 1 + 15 * irand(2));
				t += n;
			}
			KT_CHECKF(!memcmp(out, ref, sz), "G %d hd %d isa %s: random chunks, pages of 7", G, hd,
				  ke_isa_name(isa));
		}
		ke_isa_set(saved);
		/* and it is the softmax over the dequantized values (double) */
		double worst = 0;
		int ts[2] = {100, T - 1};
		for (int k = 0; k < 2; k++) {
			int t = ts[k];
			float *dk = malloc((size_t)T * hd * 4), *dv = malloc((size_t)T * hd * 4);
			for (int h = 0; h < H; h++) {
				int g = h / G;
				for (int j = 0; j <= t; j++) {
					memcpy(dk + (size_t)j * hd, (char *)fd.pages[j / 48]->data +
									    ke_layout_row_off(&fd.lay, g, j % 48, 48), (size_t)hd * 4);
					memcpy(dv + (size_t)j * hd, (char *)fd.pages[j / 48]->data +
									    ke_layout_row_off(&fd.lay, Hkv + g, j % 48, 48), (size_t)hd * 4);
				}
				double *sc = malloc((size_t)(t + 1) * sizeof *sc), mx = -1e300, sum = 0;
				for (int j = 0; j <= t; j++) {
					double d = 0;
					for (int i = 0; i < hd; i++)
						d += (double)q[(size_t)t * row + (size_t)h * hd + i] * dk[(size_t)j * hd + i];
					sc[j] = d * 0.25;
					mx = sc[j] > mx ? sc[j] : mx;
				}
				for (int j = 0; j <= t; j++)
					sum += (sc[j] = exp(sc[j] - mx));
				for (int i = 0; i < hd; i++) {
					double o = 0;
					for (int j = 0; j <= t; j++)
						o += sc[j] / sum * dv[(size_t)j * hd + i];
					worst = fmax(worst, fabs(ref[(size_t)t * row + (size_t)h * hd + i] - o));
				}
				free(sc);
			}
			free(dk);
			free(dv);
		}
		KT_CHECKF(worst < 5e-5, "G %d hd %d: max abs error %g against the double softmax", G, hd, worst);
		kvfix_free(&f);
		kvfix_free(&fd);
		kvfix_free(&f7);
		kvfix_free(&fd7);
		acase_free(&a);
		free(out);
	}
}

/* --- DeltaNet --------------------------------------------------------------- */

KT_CASE(deltanet_rule_matches_double_and_paths_agree)
{
	int dk = 24, dv = 40, T = 50;
	float *S = calloc((size_t)dk * dv, 4), *S2 = calloc((size_t)dk * dv, 4);
	double *Sd = calloc((size_t)dk * dv, 8);
	float o[40], o2[40];
	int same = 1;
	double worst = 0;
	for (int t = 0; t < T; t++) {
		float q[24], k[24], v[40];
		for (int i = 0; i < dk; i++) {
			q[i] = frand() * 0.3f;
			k[i] = frand() * 0.3f;
		}
		for (int j = 0; j < dv; j++)
			v[j] = frand();
		float alpha = 0.9f + 0.1f * (frand() + 1) / 2, beta = (frand() + 1) / 2;
		ke_dn_rule_isa(KE_ISA_SCALAR, S, q, k, v, alpha, beta, o, dk, dv);
		if (ke_isa_best() >= KE_ISA_AVX2) {
			ke_dn_rule_isa(KE_ISA_AVX2, S2, q, k, v, alpha, beta, o2, dk, dv);
			same &= !memcmp(o, o2, sizeof o) && !memcmp(S, S2, (size_t)dk * dv * 4);
		}
		double u[40];
		for (int j = 0; j < dv; j++) {
			u[j] = 0;
			for (int i = 0; i < dk; i++) {
				Sd[i * dv + j] *= alpha;
				u[j] += Sd[i * dv + j] * k[i];
			}
		}
		for (int j = 0; j < dv; j++) {
			double d = (v[j] - u[j]) * beta, od = 0;
			for (int i = 0; i < dk; i++)
				Sd[i * dv + j] += k[i] * d;
			(void)od;
		}
		for (int j = 0; j < dv; j++) {
			double od = 0;
			for (int i = 0; i < dk; i++)
				od += Sd[i * dv + j] * q[i];
			double e = fabs(o[j] - od);
			worst = e > worst ? e : worst;
		}
	}
	KT_CHECKF(worst < 1e-5, "max abs error %g", worst);
	if (ke_isa_best() >= KE_ISA_AVX2)
		KT_CHECK(same);
	else
		kt_skip("no AVX2 path on this CPU (accuracy checked)");
	free(S);
	free(S2);
	free(Sd);
}

/* ke_dn_rule_seq on every path (one token: the decode kernel; several:
 * the fused sweep) leaves S and the outputs bit-identical to the scalar
 * rule run token by token, for head sizes that take the 128-column
 * blocks (decode; the prefill sweep's 128- and 64-column strips), the
 * 16-column tail, all of them, and no SIMD path at all. */
KT_CASE(deltanet_rule_seq_paths_match_scalar_token_by_token)
{
	static const int dvs[] = {16, 40, 80, 128, 144, 208, 256};
	int dk = 32, T = 7;
	for (size_t di = 0; di < sizeof dvs / sizeof dvs[0]; di++) {
		int dv = dvs[di], C = 2 * dk + dv;
		size_t ss = (size_t)dk * dv;
		float *ref = malloc(ss * 4), *S = malloc(ss * 4), *S0 = malloc(ss * 4);
		float *rows = malloc((size_t)T * C * 4), *oref = malloc((size_t)T * dv * 4), *o = malloc((size_t)T * dv * 4);
		float ab[2 * 7];
		for (size_t i = 0; i < ss; i++)
			S0[i] = frand() * 0.5f;
		for (int i = 0; i < T * C; i++)
			rows[i] = frand() * 0.3f;
		for (int t = 0; t < T; t++) {
			ab[2 * t] = 0.9f + 0.1f * (frand() + 1) / 2; /* alpha */
			ab[2 * t + 1] = (frand() + 1) / 2;           /* beta */
		}
		memcpy(ref, S0, ss * 4);
		for (int t = 0; t < T; t++) {
			const float *r = rows + (size_t)t * C;
			ke_dn_rule_isa(KE_ISA_SCALAR, ref, r, r + dk, r + 2 * dk, ab[2 * t], ab[2 * t + 1], oref + (size_t)t * dv,
				       dk, dv);
		}
		for (int isa = KE_ISA_SCALAR; isa <= ke_isa_best(); isa++) {
			/* token by token (decode), then T - 1 at once after one (prefill) */
			memcpy(S, S0, ss * 4);
			for (int t = 0; t < T; t++) {
				const float *r = rows + (size_t)t * C;
				ke_dn_rule_seq(isa, S, 1, r, r + dk, r + 2 * dk, (size_t)C, ab + 2 * t, ab + 2 * t + 1, 2,
					       o + (size_t)t * dv, (size_t)dv, dk, dv);
			}
			KT_CHECKF(!memcmp(S, ref, ss * 4) && !memcmp(o, oref, (size_t)T * dv * 4),
				  "dv %d, %s, one token at a time", dv, ke_isa_name(isa));
			memcpy(S, S0, ss * 4);
			ke_dn_rule_seq(isa, S, 1, rows, rows + dk, rows + 2 * dk, (size_t)C, ab, ab + 1, 2, o, (size_t)dv, dk, dv);
			ke_dn_rule_seq(isa, S, T - 1, rows + C, rows + C + dk, rows + C + 2 * dk, (size_t)C, ab + 2, ab + 3, 2,
				       o + dv, (size_t)dv, dk, dv);
			KT_CHECKF(!memcmp(S, ref, ss * 4) && !memcmp(o, oref, (size_t)T * dv * 4), "dv %d, %s, 1 + %d tokens",
				  dv, ke_isa_name(isa), T - 1);
		}
		free(ref);
		free(S);
		free(S0);
		free(rows);
		free(oref);
		free(o);
	}
	if (ke_isa_best() == KE_ISA_SCALAR)
		kt_skip("this CPU has only the scalar path (scalar checked)");
}

KT_CASE(deltanet_conv_is_causal_with_state)
{
	int C = 5, K = 4, T = 9;
	float w[20], state[15] = {0}, x[9][5], hist[12][5] = {{0}};
	for (int i = 0; i < C * K; i++)
		w[i] = frand();
	for (int t = 0; t < T; t++)
		for (int c = 0; c < C; c++)
			x[t][c] = hist[t + K - 1][c] = frand();
	for (int t = 0; t < T; t++) {
		float y[5];
		memcpy(y, x[t], sizeof y);
		ke_dn_conv(state, w, y, C, K);
		for (int c = 0; c < C; c++) {
			double r = 0;
			for (int j = 0; j < K; j++)
				r += (double)w[c * K + j] * hist[t + j][c];
			KT_CHECKF(fabs(y[c] - r) < 1e-6, "t=%d c=%d %g vs %g", t, c, y[c], r);
		}
	}
	for (int c = 0; c < C; c++) /* the state holds the last K-1 inputs, oldest first */
		for (int j = 0; j < K - 1; j++)
			KT_CHECK(state[c * (K - 1) + j] == x[T - (K - 1) + j][c]);
}

/* --- sampler ---------------------------------------------------------------- */

/* The K = 4 conv on every path: 16 channels at a time plus a scalar tail
 * (C = 16 k + 5), several tokens through the state, bit-identical to the
 * scalar code (outputs and state), the sign of a zero sum included. */
KT_CASE(deltanet_conv_paths_match_scalar)
{
	int C = 16 * 5 + 5, K = 4, T = 6;
	float *w = malloc((size_t)C * K * 4), *st0 = malloc((size_t)C * 3 * 4), *ref = malloc((size_t)C * 3 * 4);
	float *st = malloc((size_t)C * 3 * 4), *x = malloc((size_t)T * C * 4), *yr = malloc((size_t)T * C * 4);
	float *y = malloc((size_t)T * C * 4);
	for (int i = 0; i < C * K; i++)
		w[i] = frand();
	for (int i = 0; i < C * 3; i++)
		st0[i] = frand();
	for (int i = 0; i < T * C; i++)
		x[i] = frand();
	/* channel 2, token 0: every product -0, so the sum is 0 + -0 = +0
	 * (a path that started from the first product would give -0) */
	for (int j = 0; j < 3; j++)
		st0[2 * 3 + j] = -0.0f;
	x[2] = -0.0f;
	for (int j = 0; j < 4; j++)
		w[2 * 4 + j] = 0.5f;
	memcpy(ref, st0, (size_t)C * 3 * 4);
	memcpy(yr, x, (size_t)T * C * 4);
	for (int t = 0; t < T; t++)
		ke_dn_conv_isa(KE_ISA_SCALAR, ref, w, yr + (size_t)t * C, C, K);
	for (int isa = KE_ISA_AVX2; isa <= ke_isa_best(); isa++) {
		memcpy(st, st0, (size_t)C * 3 * 4);
		memcpy(y, x, (size_t)T * C * 4);
		for (int t = 0; t < T; t++)
			ke_dn_conv_isa(isa, st, w, y + (size_t)t * C, C, K);
		KT_CHECKF(!memcmp(st, ref, (size_t)C * 3 * 4) && !memcmp(y, yr, (size_t)T * C * 4), "%s differs from scalar",
			  ke_isa_name(isa));
	}
	if (ke_isa_best() == KE_ISA_SCALAR)
		kt_skip("this CPU has only the scalar path");
	free(w);
	free(st0);
	free(ref);
	free(st);
	free(x);
	free(yr);
	free(y);
}

KT_CASE(sampler_greedy_and_reproducible)
{
	float l[10] = {0.5f, 2.0f, -1.0f, 2.0f, 0.0f, 1.0f, -3.0f, 0.2f, 1.9f, 0.1f};
	KT_EQ_INT(ke_argmax(l, 10), 1); /* lowest id among ties */
	struct ke_sampler *s, *s2, *s3;
	struct ke_sample_params p = {.temperature = 0.0, .top_p = 1.0};
	KT_OK(ke_sampler_create(10, &p, &s));
	KT_EQ_INT(ke_sample(s, l), 1);
	ke_sampler_destroy(s);
	p.temperature = 1.0;
	p.seed = 42;
	KT_OK(ke_sampler_create(10, &p, &s));
	KT_OK(ke_sampler_create(10, &p, &s2));
	p.seed = 43;
	KT_OK(ke_sampler_create(10, &p, &s3));
	int same = 1, diff = 0, a[200];
	for (int i = 0; i < 200; i++) {
		a[i] = ke_sample(s, l);
		same &= a[i] == ke_sample(s2, l);
		diff |= a[i] != ke_sample(s3, l);
	}
	KT_CHECK(same);
	KT_CHECK(diff);
	ke_sampler_seed(s, 42);
	for (int i = 0; i < 200; i++)
		KT_CHECK(ke_sample(s, l) == a[i]);
	ke_sampler_destroy(s);
	ke_sampler_destroy(s2);
	ke_sampler_destroy(s3);
}

KT_CASE(sampler_filters)
{
	enum { V = 1000, N = 20000 };
	float *l = malloc(V * 4);
	for (int i = 0; i < V; i++)
		l[i] = -5.0f + 0.01f * (float)((i * 37) % V); /* distinct */
	int order[V];
	for (int i = 0; i < V; i++)
		order[i] = i;
	for (int i = 0; i < V; i++) /* ids sorted by logit, descending */
		for (int j = i; j > 0 && l[order[j]] > l[order[j - 1]]; j--) {
			int t = order[j];
			order[j] = order[j - 1];
			order[j - 1] = t;
		}
	double z = 0;
	for (int i = 0; i < V; i++)
		z += exp(l[i] - l[order[0]]);
	struct ke_sampler *s;
	/* top-k 5: only the 5 best, frequencies near their renormalised mass */
	struct ke_sample_params p = {.temperature = 1.0, .top_k = 5, .top_p = 1.0, .seed = 7};
	KT_OK(ke_sampler_create(V, &p, &s));
	int cnt[V];
	memset(cnt, 0, sizeof cnt);
	for (int i = 0; i < N; i++)
		cnt[ke_sample(s, l)]++;
	double z5 = 0;
	for (int i = 0; i < 5; i++)
		z5 += exp(l[order[i]] - l[order[0]]);
	int inside = 0;
	for (int i = 0; i < 5; i++) {
		inside += cnt[order[i]];
		double want = exp(l[order[i]] - l[order[0]]) / z5 * N;
		KT_CHECKF(fabs(cnt[order[i]] - want) < 5 * sqrt(want) + 5, "top-k rank %d: %d draws, expected %.0f", i,
			  cnt[order[i]], want);
	}
	KT_EQ_INT(inside, N);
	ke_sampler_destroy(s);
	/* top-p: the smallest prefix with mass >= p */
	p.top_k = 0;
	p.top_p = 0.05;
	KT_OK(ke_sampler_create(V, &p, &s));
	double acc = 0;
	int need = 0;
	while (acc < 0.05 * 1.0) {
		acc += exp(l[order[need]] - l[order[0]]) / z;
		need++;
	}
	memset(cnt, 0, sizeof cnt);
	for (int i = 0; i < N; i++)
		cnt[ke_sample(s, l)]++;
	int used = 0, outside = 0;
	for (int i = 0; i < V; i++) {
		int rank = 0;
		while (order[rank] != i)
			rank++;
		if (cnt[i])
			used++;
		if (cnt[i] && rank >= need)
			outside++;
	}
	KT_EQ_INT(outside, 0);
	KT_CHECKF(used == need, "top-p used %d tokens, the nucleus has %d", used, need);
	ke_sampler_destroy(s);
	/* min-p: nothing below min_p x p_max */
	p.top_p = 1.0;
	p.min_p = 0.9;
	KT_OK(ke_sampler_create(V, &p, &s));
	for (int i = 0; i < 2000; i++) {
		int t = ke_sample(s, l);
		KT_CHECK(exp(l[t] - l[order[0]]) >= 0.9 - 1e-12);
	}
	ke_sampler_destroy(s);
	/* bad parameters are refused, naming the field */
	struct ke_sample_params bad[] = {
		{.temperature = -1, .top_p = 1}, {.temperature = 1, .top_p = 0}, {.temperature = 1, .top_p = 1.5},
		{.temperature = 1, .top_p = 1, .min_p = 2}, {.temperature = 1, .top_p = 1, .top_k = -3},
		{.temperature = NAN, .top_p = 1},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		KT_EQ_INT(ke_sampler_create(V, &bad[i], &s), KV_ERR_INVALID);
		KT_CHECK(s == NULL);
	}
	/* all -inf / NaN logits: token 0, no crash */
	for (int i = 0; i < V; i++)
		l[i] = i % 2 ? -INFINITY : NAN;
	p.min_p = 0;
	KT_OK(ke_sampler_create(V, &p, &s));
	KT_EQ_INT(ke_sample(s, l), 0);
	ke_sampler_destroy(s);
	free(l);
}

KT_CASE(logprobs)
{
	float l[6] = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f, 2.0f}, lp[6];
	ke_logsoftmax(l, 6, lp);
	double sum = 0;
	for (int i = 0; i < 6; i++)
		sum += exp(lp[i]);
	KT_CHECK(fabs(sum - 1.0) < 1e-6);
	int32_t ids[6];
	float top[6];
	KT_EQ_INT(ke_top_logprobs(l, 6, 4, ids, top), 4);
	KT_EQ_INT(ids[0], 1);
	KT_EQ_INT(ids[1], 2);
	KT_EQ_INT(ids[2], 5);
	KT_EQ_INT(ids[3], 0);
	for (int i = 0; i < 4; i++)
		KT_CHECK(fabsf(top[i] - lp[ids[i]]) < 1e-6f);
	KT_CHECK(fabsf(ke_token_logprob(l, 6, 3) - lp[3]) < 1e-6f);
	KT_CHECK(isinf(ke_token_logprob(l, 6, 9)));
	KT_EQ_INT(ke_top_logprobs(l, 6, 10, ids, top), 6);
}

KT_MAIN(gemm_matches_double_reference, gemm_simd_paths_bit_identical_to_scalar, gemm_long_rows_paths_bit_identical,
	gemm_packed_panels_bit_identical, gemm_every_tile_shape_bit_identical,
	gemm_row_result_independent_of_m_and_split, gemm_accum_and_unaligned_weights, dot_is_the_gemm_order,
	exp_accuracy_and_paths, silu_axpy_paths_and_accuracy, softcap_paths_and_accuracy, gelu_paths_and_accuracy, rmsnorm_matches_double, attention_matches_naive_softmax,
	attention_invariant_to_chunks_threads_and_page_size,
	attention_key_split_prefill_equals_decode_and_paths, attention_lane_scores_match_scalar_at_head_dims,
	attention_decode_scores_match_scalar, kvq8_quantizer_matches_its_definition,
	attention_q8_kv_paths_match_scalar_and_f32_of_its_values,
	deltanet_rule_matches_double_and_paths_agree,
	deltanet_rule_seq_paths_match_scalar_token_by_token, deltanet_conv_is_causal_with_state,
	deltanet_conv_paths_match_scalar, sampler_greedy_and_reproducible, sampler_filters, logprobs)
