/*
 * test_qdot.c - the integer path for quantized weights (engine/qdot.h,
 * --quant-act q8): per-row activation quantization and the dots of every
 * type it takes (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
 * Q6_K, MXFP4; several K and M) are bit-identical on the scalar, AVX2 and AVX-512 paths
 * (random data and edge cases), an output never depends on M, the tile,
 * the column range or the thread (ke_gemm row i of M = 37 == the M = 1
 * GEMV, memcmp), and the float result matches a double evaluation of the
 * same formula.
 */
#include "kt.h"
#include "base/err.h"
#include "engine/gemm.h"
#include "engine/isa.h"
#include "engine/qpanel.h"
#include "engine/matmul.h"
#include "engine/qdot.h"
#include "engine/qgemm.h"
#include "model/quant.h"
#include "model/safetensors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float frand(uint64_t *s, float scale)
{
	return (float)((double)(kt_rand(s) % 2000001) / 1000000.0 - 1.0) * scale;
}

static void *amalloc(size_t n)
{
	void *p = NULL;
	if (posix_memalign(&p, 64, n ? n : 64))
		return NULL;
	memset(p, 0, n);
	return p;
}

/* A row with the edge cases in separate blocks of `block` elements. */
static void edge_row(float *x, int K, int block, uint64_t *s)
{
	for (int k = 0; k < K; k++)
		x[k] = frand(s, 1.0f);
	int nb = K / block;
	for (int k = 0; k < block; k++) {
		if (nb > 0)
			x[k] = 0.0f; /* all-zero block */
		if (nb > 1)
			x[block + k] = frand(s, 3.0e38f); /* huge */
		if (nb > 2)
			x[2 * block + k] = frand(s, 1.0e-39f); /* subnormal only: zero block */
		if (nb > 3)
			x[3 * block + k] = (float)((int)(kt_rand(s) % 255) - 127) / 127.0f * 2.5f; /* exact codes, ties */
		if (nb > 4)
			x[4 * block + k] = -0.0f;
		if (nb > 5)
			x[5 * block + k] = frand(s, 1.0e-30f); /* tiny but normal */
	}
	if (nb > 6)
		x[6 * block + 3] = INFINITY;
	if (nb > 7)
		x[7 * block + 5] = NAN;
}

KT_CASE(act_quant_paths_identical)
{
	const int K = 2048;
	uint64_t s = 11;
	float *x = malloc((size_t)K * 4);
	for (int bi = 0; bi < 2; bi++) {
		int block = bi ? 256 : 32;
		size_t rb = ke_qact_row_bytes(block, K);
		uint8_t *ref = amalloc(rb), *got = amalloc(rb);
		for (int trial = 0; trial < 20; trial++) {
			if (trial < 10)
				edge_row(x, K, block, &s);
			else
				for (int k = 0; k < K; k++)
					x[k] = frand(&s, trial * 0.7f);
			memset(ref, 0xAB, rb);
			ke_qact_quant(KE_ISA_SCALAR, block, x, K, ref);
			/* the definition: codes in [-127, 127], d = amax / 127 */
			const int8_t *q = (const int8_t *)ref;
			const float *d = (const float *)(ref + K);
			for (int k = 0; k < K; k++)
				KT_CHECKF(q[k] >= -127 && q[k] <= 127, "code %d at %d", q[k], k);
			for (int b = 0; b < K / block; b++) {
				float amax = 0.0f;
				int bad = 0;
				for (int k = 0; k < block; k++) {
					float a = fabsf(x[b * block + k]);
					bad |= !isfinite(a);
					amax = a > amax ? a : amax;
				}
				if (bad)
					KT_CHECKF(isnan(d[b]), "block %d with inf/NaN: d = %g", b, d[b]);
				else if (amax < 1.17549435e-38f)
					KT_CHECKF(d[b] == 0.0f, "zero/subnormal block %d: d = %g", b, d[b]);
				else
					KT_CHECKF(d[b] == amax / 127.0f, "block %d: d %g != amax/127", b, d[b]);
			}
			for (int isa = KE_ISA_AVX2; isa <= ke_isa_best(); isa++) {
				memset(got, 0xAB, rb);
				ke_qact_quant(isa, block, x, K, got);
				KT_CHECKF(!memcmp(ref, got, rb), "block %d trial %d: ISA %s differs from scalar", block, trial,
					  ke_isa_name(isa));
			}
		}
		free(ref);
		free(got);
	}
	if (ke_isa_best() < KE_ISA_AVX2)
		kt_skip("no AVX2 on this CPU: only the scalar path ran");
	free(x);
}

static const int g_types[] = {KV_DT_Q8_0, KV_DT_Q4_K, KV_DT_Q6_K, KV_DT_Q4_0, KV_DT_Q5_0, KV_DT_Q4_1,
			      KV_DT_Q5_1, KV_DT_Q5_K, KV_DT_Q3_K, KV_DT_Q2_K, KV_DT_MXFP4};

/* Where a block of dt keeps its f16 scale (f16[0]) and its f16 min
 * (f16[1], -1 if none). */
static void f16_fields(int dt, int *f)
{
	f[1] = -1;
	switch (dt) {
	case KV_DT_Q4_1:
	case KV_DT_Q5_1:
	case KV_DT_Q4_K:
	case KV_DT_Q5_K: f[0] = 0, f[1] = 2; break;
	case KV_DT_Q6_K: f[0] = 208; break;
	case KV_DT_Q3_K: f[0] = 108; break;
	case KV_DT_Q2_K: f[0] = 80, f[1] = 82; break;
	default: f[0] = 0; break;
	}
}

/* Weight rows: half from the quantizer (realistic), a quarter random bytes
 * (every code, -128 included, extreme 6-bit scales and mins) and a quarter
 * all-max bytes (every code and sub-scale at its maximum) with finite f16
 * scales, some of them zero, and mins at up to +-65504. */
static void weight_rows(int dt, uint8_t *wq, int N, int K, uint64_t *s)
{
	size_t rb = (size_t)kv_dtype_row_bytes(dt, (uint64_t)K);
	float *wf = malloc((size_t)K * 4);
	for (int r = 0; r < N; r++) {
		uint8_t *row = wq + (size_t)r * rb;
		if (dt == KV_DT_MXFP4) {
			/* no quantizer: random codes (every one of the 16), or all
			 * 0xFF (-12, the largest magnitude), under E8M0 scales around
			 * the release's (2^-8 .. 2^2) and the extremes that still
			 * stay finite in the dot: 0 and 1 (subnormal 2^-128, 2^-127) */
			for (size_t i = 0; i < rb; i++)
				row[i] = r % 4 == 3 ? 0xFF : (uint8_t)kt_rand(s);
			for (size_t b = 0; b < rb / 17; b++) {
				unsigned pick = b == 0 ? 8 : (unsigned)(kt_rand(s) % 9); /* block 0 normal: a row's error
											  is measured against its sum */
				row[b * 17] = pick == 0 ? 0 : pick == 1 ? 1 : pick == 2 ? 2 : (uint8_t)(120 + kt_rand(s) % 11);
			}
			continue;
		}
		if (r % 2 == 0) {
			for (int k = 0; k < K; k++)
				wf[k] = frand(s, 0.05f * (float)(1 + r));
			if (kq_quant_row(dt, wf, row, (size_t)K))
				kt_fail(__FILE__, __LINE__, "quant: %s", kv_errmsg());
			continue;
		}
		for (size_t i = 0; i < rb; i++)
			row[i] = r % 4 == 3 ? 0xFF : (uint8_t)kt_rand(s);
		size_t bsz = kv_dtype_block_bytes(dt);
		int f[2];
		f16_fields(dt, f);
		for (size_t b = 0; b < rb / bsz; b++) {
			uint8_t *blk = row + b * bsz;
			for (int t = 0; t < 2; t++) {
				if (f[t] < 0)
					continue;
				unsigned pick = (unsigned)(kt_rand(s) % 7);
				float v = pick == 0 ? 0.0f : frand(s, 0.01f);
				if (t == 1 && pick == 1)
					v = (kt_rand(s) & 1) ? 65504.0f : -65504.0f; /* extreme min */
				else if (t == 1 && pick == 2)
					v = frand(s, 100.0f);
				uint16_t h = kv_f32_to_f16(v);
				memcpy(blk + f[t], &h, 2);
			}
		}
	}
	free(wf);
}

/* What the integer dot approximates: kq_dequant_row's weights (ggml's
 * to_float values) times the dequantized activation codes, in double;
 * *mag = sum |w x|. The float steps of qdot.h round at most a few times
 * per block, so they stay within a small multiple of 2^-24 * mag of this
 * (and 2^-24 * |terms| of the min chain where one is subtracted). */
static double ref_dot(int dt, const uint8_t *w, int K, const uint8_t *a, double *mag)
{
	const int8_t *qx = (const int8_t *)a;
	const float *dx = (const float *)(a + K);
	double y = 0.0;
	*mag = 0.0;
	float *wd = malloc((size_t)K * 4);
	kq_dequant_row(dt, w, wd, (size_t)K);
	int blk = ke_qdot_block(dt);
	for (int k = 0; k < K; k++) {
		double t = (double)wd[k] * ((double)dx[k / blk] * qx[k]);
		y += t;
		*mag += fabs(t);
	}
	free(wd);
	return y;
}

/* The prepacked panels (engine/qpanel.h) where this CPU's path takes
 * them: every panel packed, then products of 1..M activation rows over
 * rows [0, N) and [16, N) (a short last panel) equal the definition. */
static void pre_panels_match(int dt, const uint8_t *wq, size_t wb, int N, int K, const uint8_t *a, size_t ab, int M,
			     const float *ref)
{
	const int isa = ke_isa_best();
	size_t pb = ke_qpanel_pre_bytes(isa, dt, N, K);
	if (!pb)
		return;
	KT_CHECK(pb == (size_t)((N + 15) / 16) * 16 * wb); /* the rows' bytes, a short panel padded */
	uint8_t *pk = amalloc(pb);
	ke_qpanel_pre_pack(dt, wq, wb, N, K, 0, 1, pk);
	ke_qpanel_pre_pack(dt, wq, wb, N, K, 1, (N + 15) / 16, pk);
	float *got = malloc((size_t)M * N * 4);
	for (int mr = 1; mr <= M; mr++) {
		memset(got, 0xff, (size_t)M * N * 4);
		for (int i0 = 0; i0 < M; i0 += mr) {
			int r = M - i0 < mr ? M - i0 : mr;
			KT_CHECK(ke_qpanel_gemm_pre(isa, dt, pk, K, a + (size_t)i0 * ab, ab, r, got + i0 * N, N, 0, 0, 16));
			KT_CHECK(ke_qpanel_gemm_pre(isa, dt, pk, K, a + (size_t)i0 * ab, ab, r, got + i0 * N, N, 0, 16, N));
		}
		KT_CHECKF(!memcmp(ref, got, (size_t)M * N * 4), "%s K %d: prepacked panels, rows by %d differ from the "
			  "definition", kv_dtype_name(dt), K, mr);
	}
	/* not on a panel boundary, or a path without panels: refused */
	KT_CHECK(!ke_qpanel_gemm_pre(isa, dt, pk, K, a, ab, 1, got, N, 0, 5, N));
	KT_CHECK(!ke_qpanel_gemm_pre(KE_ISA_AVX2, dt, pk, K, a, ab, 1, got, N, 0, 0, N));
	KT_CHECK(!ke_qpanel_pre_bytes(KE_ISA_AVX2, dt, N, K) && !ke_qpanel_pre_bytes(isa, KV_DT_Q4_K, N, 256));
	free(got);
	free(pk);
}

KT_CASE(dot_paths_identical_and_exact)
{
	/* 288: an odd count of 32-blocks; 33024 (129 super-blocks) and 8224
	 * (257 32-blocks): rows longer than one chunk of the 4-row kernels'
	 * rows-outer order at 4 activation rows (qdot.c ro_cb) */
	const int Ks[] = {256, 768, 2048, 288, 33024, 8224}, N = 21, M = 24;
	uint64_t s = 23;
	double worst[sizeof g_types / sizeof g_types[0]] = {0};
	float *x = malloc((size_t)M * 33024 * 4);
	for (size_t kk = 0; kk < sizeof Ks / sizeof Ks[0]; kk++) {
		const int K = Ks[kk];
		for (size_t t = 0; t < sizeof g_types / sizeof g_types[0]; t++) {
			int dt = g_types[t], block = ke_qdot_block(dt);
			if (K % block)
				continue;
			size_t wb = (size_t)kv_dtype_row_bytes(dt, (uint64_t)K), ab = ke_qact_row_bytes(block, K);
			uint8_t *wq = malloc(wb * N), *a = amalloc(ab * M);
			weight_rows(dt, wq, N, K, &s);
			for (int i = 0; i < M * K; i++)
				x[i] = frand(&s, 2.0f);
			for (int k = 0; k < block; k++)
				x[k] = 0.0f; /* a zero activation block */
			for (int k = 0; k < 64; k++)
				x[K + k] = (k & 1) ? 1.0f : -1.0f; /* codes +-127 */
			for (int k = 0; k < K; k++)
				x[2 * K + k] = 1.0f; /* all +127: the code sums at their maximum */
			for (int i = 0; i < M; i++)
				ke_qact_quant(KE_ISA_SCALAR, block, x + (size_t)i * K, K, a + (size_t)i * ab);
			float ref[M * N], got[M * N];
			for (int i = 0; i < M; i++)
				for (int n = 0; n < N; n++) {
					ref[i * N + n] = ke_qdot_ref(dt, wq + (size_t)n * wb, K, a + (size_t)i * ab);
					double mag, r = ref_dot(dt, wq + (size_t)n * wb, K, a + (size_t)i * ab, &mag);
					double e = fabs((double)ref[i * N + n] - r) / (mag + 1e-30);
					worst[t] = e > worst[t] ? e : worst[t];
					KT_CHECKF(e <= 2e-6, "%s K %d row %d act %d: %.9g vs double %.9g (error %.3g of sum |w x|)",
						  kv_dtype_name(dt), K, n, i, ref[i * N + n], r, e);
				}
			for (int isa = KE_ISA_SCALAR; isa <= ke_isa_best(); isa++)
				for (int mr = 1; mr <= M; mr += K > 4096 ? 3 : 1) {
					/* rows in groups of mr (4-row kernels below the crossovers of qpanel.c: 8 to 17 rows, panels from there), columns split at 5 */
					for (int i0 = 0; i0 < M; i0 += mr) {
						int r = M - i0 < mr ? M - i0 : mr;
						ke_qdot_gemm(isa, dt, wq, wb, K, a + (size_t)i0 * ab, ab, r, got + i0 * N, N, 0, 0, 5);
						ke_qdot_gemm(isa, dt, wq, wb, K, a + (size_t)i0 * ab, ab, r, got + i0 * N, N, 0, 5, N);
					}
					KT_CHECKF(!memcmp(ref, got, sizeof ref), "%s K %d: ISA %s, rows by %d differ from the definition",
						  kv_dtype_name(dt), K, ke_isa_name(isa), mr);
				}
			pre_panels_match(dt, wq, wb, N, K, a, ab, M, ref);
			free(wq);
			free(a);
		}
	}
	for (size_t t = 0; t < sizeof g_types / sizeof g_types[0]; t++)
		fprintf(stderr, "  %s: ke_qdot_ref vs the dequantized double dot, worst error %.3g of sum |w x|\n",
			kv_dtype_name(g_types[t]), worst[t]);
	free(x);
}

/* Through ke_gemm (threads, pieces of rows) and ke_gemm_range (column
 * ranges): every row of an M = 37 product equals the M = 1 GEMV of that
 * row, on every path; and the q8 result is close to the exact f32 one. */
KT_CASE(gemm_m_invariance)
{
	const int K = 512, N = 45, M = 37;
	uint64_t s = 31;
	float *x = malloc((size_t)M * K * 4), *y = malloc((size_t)M * N * 4), *y1 = malloc((size_t)N * 4);
	float *yf = malloc((size_t)M * N * 4), *yr = malloc((size_t)M * N * 4);
	for (int i = 0; i < M * K; i++)
		x[i] = frand(&s, 1.5f);
	int saved = ke_isa();
	for (size_t t = 0; t < sizeof g_types / sizeof g_types[0]; t++) {
		int dt = g_types[t];
		size_t wb = (size_t)kv_dtype_row_bytes(dt, (uint64_t)K);
		uint8_t *wq = malloc(wb * N);
		weight_rows(dt, wq, N, K, &s);
		for (int r = 1; r < N; r += 2) /* the quantizer's rows only: realistic magnitudes for the f32 check */
			memcpy(wq + (size_t)r * wb, wq + (size_t)(r - 1) * wb, wb);
		struct ke_mat q = {wq, dt, N, K, (size_t)K}, f = q;
		q.qdot = 1;
		KT_CHECK(ke_qgemm_int(&q) && !ke_qgemm_int(&f));
		float *ref = NULL;
		for (int isa = KE_ISA_SCALAR; isa <= ke_isa_best(); isa++) {
			ke_isa_set(isa);
			ke_gemm(&q, x, (size_t)K, M, y, (size_t)N, 0);
			for (int i = 0; i < M; i++) {
				ke_gemm(&q, x + (size_t)i * K, (size_t)K, 1, y1, (size_t)N, 0);
				KT_CHECKF(!memcmp(y1, y + (size_t)i * N, (size_t)N * 4), "%s ISA %s: row %d of M=%d != M=1",
					  kv_dtype_name(dt), ke_isa_name(isa), i, M);
			}
			/* column ranges and row groups through ke_gemm_range, accumulate flag */
			for (int i = 0; i < M * N; i++)
				yr[i] = 0.0f;
			for (int i0 = 0; i0 < M; i0 += 5) {
				int mm = M - i0 < 5 ? M - i0 : 5;
				ke_gemm_range(isa, &q, x + (size_t)i0 * K, (size_t)K, mm, yr + (size_t)i0 * N, (size_t)N,
					      KE_GEMM_ACCUM, 0, 7);
				ke_gemm_range(isa, &q, x + (size_t)i0 * K, (size_t)K, mm, yr + (size_t)i0 * N, (size_t)N,
					      KE_GEMM_ACCUM, 7, N);
			}
			int same = 1;
			for (int i = 0; i < M * N; i++)
				same &= yr[i] == y[i] || (isnan(yr[i]) && isnan(y[i]));
			KT_CHECKF(same, "%s ISA %s: ke_gemm_range pieces differ from ke_gemm", kv_dtype_name(dt),
				  ke_isa_name(isa));
			if (!ref) {
				ref = malloc((size_t)M * N * 4);
				memcpy(ref, y, (size_t)M * N * 4);
			} else {
				KT_CHECKF(!memcmp(ref, y, (size_t)M * N * 4), "%s ISA %s differs from scalar", kv_dtype_name(dt),
					  ke_isa_name(isa));
			}
		}
		/* with prepacked panels (where this CPU's path takes them): the
		 * same numbers through ke_gemm, M = 1 and column ranges that do
		 * and do not start on a panel boundary; a path without panels
		 * reads the rows */
		size_t pb = ke_qpanel_pre_bytes(ke_isa_best(), dt, N, K);
		if (pb) {
			uint8_t *pk = amalloc(pb);
			ke_qpanel_pre_pack(dt, wq, wb, N, K, 0, (N + 15) / 16, pk);
			struct ke_mat qp = q;
			qp.panels = pk;
			for (int isa = KE_ISA_AVX2; isa <= ke_isa_best(); isa++) {
				ke_isa_set(isa);
				ke_gemm(&qp, x, (size_t)K, M, y, (size_t)N, 0);
				KT_CHECKF(!memcmp(ref, y, (size_t)M * N * 4), "%s ISA %s: with panels != without",
					  kv_dtype_name(dt), ke_isa_name(isa));
				for (int i = 0; i < M; i++) {
					ke_gemm(&qp, x + (size_t)i * K, (size_t)K, 1, y1, (size_t)N, 0);
					KT_CHECKF(!memcmp(y1, ref + (size_t)i * N, (size_t)N * 4),
						  "%s ISA %s: panels, row %d of M=1 != without", kv_dtype_name(dt),
						  ke_isa_name(isa), i);
				}
				const int cuts[][3] = {{0, 7, N}, {0, 16, N}, {0, 19, N}};
				for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
					memset(yr, 0, (size_t)M * N * 4);
					for (int h = 0; h < 2; h++)
						ke_gemm_range(isa, &qp, x, (size_t)K, M, yr, (size_t)N, KE_GEMM_ACCUM, cuts[c][h],
							      cuts[c][h + 1]);
					int same = 1;
					for (int i = 0; i < M * N; i++)
						same &= yr[i] == ref[i] || (isnan(yr[i]) && isnan(ref[i]));
					KT_CHECKF(same, "%s ISA %s: panels, ranges cut at %d differ", kv_dtype_name(dt),
						  ke_isa_name(isa), cuts[c][1]);
				}
			}
			free(pk);
		}
		ke_isa_set(saved);
		/* more rows than one quantized piece (ke_qgemm works in pieces of at
		 * most 512 rows): rows on both sides of the seams equal the GEMV */
		{
			const int MB = 1100;
			float *xb = malloc((size_t)MB * K * 4), *yb = malloc((size_t)MB * N * 4);
			for (int i = 0; i < MB * K; i++)
				xb[i] = x[i % (M * K)] * (float)(1 + i / (M * K));
			ke_gemm(&q, xb, (size_t)K, MB, yb, (size_t)N, 0);
			const int rows[] = {0, 511, 512, 1023, 1024, MB - 1};
			for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
				ke_gemm(&q, xb + (size_t)rows[r] * K, (size_t)K, 1, y1, (size_t)N, 0);
				KT_CHECKF(!memcmp(y1, yb + (size_t)rows[r] * N, (size_t)N * 4), "%s: row %d of M=%d != M=1",
					  kv_dtype_name(dt), rows[r], MB);
			}
			free(xb);
			free(yb);
		}
		/* closeness to the exact f32 product: per-row int8 activations
		 * keep about 2 significant digits per element */
		ke_gemm(&f, x, (size_t)K, M, yf, (size_t)N, 0);
		double err = 0, nrm = 0;
		for (int i = 0; i < M * N; i++) {
			err += ((double)y[i] - yf[i]) * ((double)y[i] - yf[i]);
			nrm += (double)yf[i] * yf[i];
		}
		KT_CHECKF(sqrt(err / nrm) < 0.02, "%s: q8 vs f32 relative error %.3g", kv_dtype_name(dt), sqrt(err / nrm));
		fprintf(stderr, "  %s: q8 vs exact f32 relative rms error %.3g\n", kv_dtype_name(dt), sqrt(err / nrm));
		free(ref);
		free(wq);
	}
	free(x);
	free(y);
	free(y1);
	free(yf);
	free(yr);
}

KT_MAIN(act_quant_paths_identical, dot_paths_identical_and_exact, gemm_m_invariance)
