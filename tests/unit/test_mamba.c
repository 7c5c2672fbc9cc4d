/*
 * test_mamba.c - the Mamba-2 scan kernel (engine/mamba.h): every CPU path
 * gives the bits of the scalar definition, n tokens at once give the bits
 * of n single-token calls (the prefill chunk vs decode), and the scalar
 * definition agrees with a double-precision recurrence.
 */
#include "kt.h"
#include "engine/isa.h"
#include "engine/mamba.h"
#include "engine/vec.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_s = 12345;
static float rnd(void)
{
	g_s = g_s * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((double)(g_s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

struct prob {
	int P, N, n;
	size_t sx, sbc;
	float *x, *B, *C, *dt, *dA, *S0, D;
};

static void make(struct prob *p, int P, int N, int n)
{
	p->P = P, p->N = N, p->n = n;
	p->sx = (size_t)P + 3;
	p->sbc = (size_t)N + 5;
	p->x = malloc(sizeof(float) * p->sx * (size_t)n);
	p->B = malloc(sizeof(float) * p->sbc * (size_t)n);
	p->C = malloc(sizeof(float) * p->sbc * (size_t)n);
	p->dt = malloc(sizeof(float) * (size_t)n);
	p->dA = malloc(sizeof(float) * (size_t)n);
	p->S0 = malloc(sizeof(float) * (size_t)P * (size_t)N);
	for (size_t i = 0; i < p->sx * (size_t)n; i++)
		p->x[i] = rnd();
	for (size_t i = 0; i < p->sbc * (size_t)n; i++) {
		p->B[i] = rnd();
		p->C[i] = rnd();
	}
	for (int t = 0; t < n; t++) {
		p->dt[t] = 0.05f + 0.5f * fabsf(rnd());
		p->dA[t] = expf(-p->dt[t] * (0.1f + fabsf(rnd())));
	}
	for (int i = 0; i < P * N; i++)
		p->S0[i] = rnd();
	p->D = 0.9f;
}

static void drop(struct prob *p)
{
	free(p->x), free(p->B), free(p->C), free(p->dt), free(p->dA), free(p->S0);
}

/* n tokens in `chunk`-token calls on one path: y [n][P] and the final S. */
static void run(const struct prob *p, int isa, int chunk, float *y, float *S)
{
	memcpy(S, p->S0, sizeof(float) * (size_t)p->P * (size_t)p->N);
	for (int t0 = 0; t0 < p->n; t0 += chunk) {
		int m = p->n - t0 < chunk ? p->n - t0 : chunk;
		ke_ssm_scan(isa, S, p->P, p->N, m, p->x + (size_t)t0 * p->sx, p->sx, p->B + (size_t)t0 * p->sbc,
			    p->C + (size_t)t0 * p->sbc, p->sbc, p->dt + t0, p->dA + t0, 1, p->D, y + (size_t)t0 * p->P,
			    (size_t)p->P);
	}
}

KT_CASE(scan_paths_and_chunks_bit_identical)
{
	const int shapes[][2] = {{64, 128}, {80, 128}, {5, 16}, {7, 48}, {3, 20}, {9, 1}};
	for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
		struct prob p;
		make(&p, shapes[k][0], shapes[k][1], 37);
		size_t ys = (size_t)p.n * p.P, ss = (size_t)p.P * p.N;
		float *yr = malloc(4 * ys), *Sr = malloc(4 * ss), *y = malloc(4 * ys), *S = malloc(4 * ss);
		run(&p, KE_ISA_SCALAR, 1, yr, Sr); /* the definition, token by token */
		const int chunks[] = {1, 2, 7, 37, 64};
		for (int isa = KE_ISA_SCALAR; isa <= ke_isa_best(); isa++)
			for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
				run(&p, isa, chunks[c], y, S);
				KT_CHECKF(!memcmp(y, yr, 4 * ys) && !memcmp(S, Sr, 4 * ss),
					  "P %d N %d: %s with chunks of %d differs from scalar token by token", p.P, p.N,
					  ke_isa_name(isa), chunks[c]);
			}
		free(yr), free(Sr), free(y), free(S);
		drop(&p);
	}
}

/* The scalar definition against the recurrence in double precision. */
KT_CASE(scan_matches_double_recurrence)
{
	struct prob p;
	make(&p, 16, 32, 50);
	size_t ys = (size_t)p.n * p.P, ss = (size_t)p.P * p.N;
	float *y = malloc(4 * ys), *S = malloc(4 * ss);
	double *Sd = malloc(8 * ss), worst = 0;
	run(&p, KE_ISA_SCALAR, 50, y, S);
	for (size_t i = 0; i < ss; i++)
		Sd[i] = p.S0[i];
	for (int t = 0; t < p.n; t++)
		for (int r = 0; r < p.P; r++) {
			double acc = 0, xv = p.x[(size_t)t * p.sx + r];
			for (int k = 0; k < p.N; k++) {
				double *s = &Sd[(size_t)r * p.N + k];
				*s = *s * p.dA[t] + p.B[(size_t)t * p.sbc + k] * xv * p.dt[t];
				acc += *s * p.C[(size_t)t * p.sbc + k];
			}
			acc += p.D * xv;
			double e = fabs(acc - y[(size_t)t * p.P + r]) / (1.0 + fabs(acc));
			worst = e > worst ? e : worst;
		}
	KT_CHECKF(worst < 1e-5, "scan vs double recurrence: %g", worst);
	free(y), free(S), free(Sd);
	drop(&p);
}

/* Nemotron-H's relu(x)^2 on every path, edge values included. */
KT_CASE(relu2_paths)
{
	float a[37], b[37];
	for (int i = 0; i < 37; i++)
		a[i] = rnd() * 3.0f;
	a[0] = -0.0f, a[1] = NAN, a[2] = -INFINITY, a[3] = INFINITY, a[4] = 1e-30f;
	memcpy(b, a, sizeof a);
	ke_vec_relu2_isa(KE_ISA_SCALAR, a, 37);
	for (int isa = KE_ISA_AVX2; isa <= ke_isa_best(); isa++) {
		float c[37];
		memcpy(c, b, sizeof c);
		ke_vec_relu2_isa(isa, c, 37);
		KT_CHECKF(!memcmp(a, c, sizeof a), "%s differs from scalar", ke_isa_name(isa));
	}
	KT_CHECK(a[0] == 0.0f && !signbit(a[0]) && a[1] == 0.0f && a[2] == 0.0f && isinf(a[3]) && a[4] == 0.0f);
}

KT_MAIN(scan_paths_and_chunks_bit_identical, scan_matches_double_recurrence, relu2_paths)
