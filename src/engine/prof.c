/*
 * prof.c - see prof.h.
 */
#include "engine/prof.h"
#include "engine/isa.h"
#include "base/clock.h"
#include "base/pool.h"

#include <pthread.h>
#include <string.h>

static int g_on;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ke_prof g_prof;

void ke_prof_enable(int on)
{
	__atomic_store_n(&g_on, on ? 1 : 0, __ATOMIC_RELEASE);
}

void ke_prof_reset(void)
{
	pthread_mutex_lock(&g_lock);
	memset(&g_prof, 0, sizeof g_prof);
	pthread_mutex_unlock(&g_lock);
}

void ke_prof_get(struct ke_prof *out)
{
	pthread_mutex_lock(&g_lock);
	*out = g_prof;
	pthread_mutex_unlock(&g_lock);
}

double ke_prof_t0(void)
{
	return __atomic_load_n(&g_on, __ATOMIC_RELAXED) ? kv_now_s() : 0.0;
}

void ke_prof_add(int phase, double t0, double flops, double bytes)
{
	if (t0 == 0.0 || phase < 0 || phase >= KE_PROF__COUNT)
		return;
	double dt = kv_now_s() - t0;
	pthread_mutex_lock(&g_lock);
	g_prof.sec[phase] += dt;
	g_prof.flops[phase] += flops;
	g_prof.bytes[phase] += bytes;
	pthread_mutex_unlock(&g_lock);
}

/* --- FMA peak --------------------------------------------------------------- */

#define PEAK_ITERS 4096

#if defined(__x86_64__)
#include <immintrin.h>
/* Independent accumulators, each a named variable: as an array indexed in
 * a loop GCC -O2 kept them on the stack (a load, an fma and a store per
 * step, bound by the store), which printed a "peak" below what the GEMM
 * reaches. REG() pins each one in a register after every step, so the
 * loop is nothing but FMAs (objdump: vfmadd on registers, no memory
 * operand). 12 accumulators (AVX2) / 16 (AVX-512) cover the 4-cycle FMA
 * latency on both FMA ports of current x86 cores. */
#define PREG(v) __asm__("" : "+v"(v)) /* "v": any of the 32 vector registers */
#define P12(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11)
#define P16(OP) P12(OP) OP(12) OP(13) OP(14) OP(15)

__attribute__((target("avx2,fma"))) static float peak_avx2(long n)
{
	__m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
#define DECL2(i) __m256 a##i = _mm256_set1_ps((float)(i));
	P12(DECL2)
	for (long r = 0; r < n; r++) {
#define STEP2(i) a##i = _mm256_fmadd_ps(a##i, b, c); PREG(a##i);
		P12(STEP2)
	}
	__m256 s = _mm256_setzero_ps();
#define SUM2(i) s = _mm256_add_ps(s, a##i);
	P12(SUM2)
	return _mm256_cvtss_f32(s);
}

__attribute__((target("avx512f,avx2,fma"))) static float peak_avx512(long n)
{
	__m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
#define DECL5(i) __m512 a##i = _mm512_set1_ps((float)(i));
	P16(DECL5)
	for (long r = 0; r < n; r++) {
#define STEP5(i) a##i = _mm512_fmadd_ps(a##i, b, c); PREG(a##i);
		P16(STEP5)
	}
	__m512 s = _mm512_setzero_ps();
#define SUM5(i) s = _mm512_add_ps(s, a##i);
	P16(SUM5)
	return _mm512_reduce_add_ps(s);
}
#endif

struct peak_job {
	int isa;
	long iters;
	volatile float sink;
};

static void peak_part(void *ctx, size_t b, size_t e, int thread)
{
	struct peak_job *j = ctx;
	(void)thread;
	for (size_t u = b; u < e; u++) {
#if defined(__x86_64__)
		if (j->isa >= KE_ISA_AVX512)
			j->sink = peak_avx512(j->iters);
		else if (j->isa >= KE_ISA_AVX2)
			j->sink = peak_avx2(j->iters);
#endif
	}
}

static double flops_per_iter(int isa)
{
	return isa >= KE_ISA_AVX512 ? 2.0 * 16 * 16 : isa >= KE_ISA_AVX2 ? 2.0 * 8 * 12 : 0.0;
}

double ke_peak_gflops(int isa, double seconds)
{
	if (isa > ke_isa_best())
		isa = ke_isa_best();
	if (isa < KE_ISA_AVX2)
		return 0.0;
	struct kv_pool *p = kv_pool_global();
	size_t th = (size_t)kv_pool_size(p);
	struct peak_job j = {isa, PEAK_ITERS, 0};
	/* one unit per thread; grow the units until a run takes ~ seconds / 4,
	 * then keep the best of four */
	double best = 0;
	for (int round = 0; round < 40; round++) {
		double t = kv_now_s();
		kv_pool_for(p, th, 1, peak_part, &j);
		t = kv_now_s() - t;
		double g = flops_per_iter(isa) * (double)j.iters * (double)th / t / 1e9;
		best = g > best ? g : best;
		if (t < seconds / 4)
			j.iters *= 2;
		else if (round >= 4)
			break;
	}
	return best;
}
