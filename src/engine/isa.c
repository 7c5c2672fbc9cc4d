/*
 * isa.c - see isa.h.
 */
#include "engine/isa.h"
#include "base/env.h"
#include "base/log.h"

#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

static int g_isa = -1;  /* atomic: -1 until detected */

int ke_isa_best(void)
{
#if defined(__x86_64__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
	    __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2"))
		return KE_ISA_AVX512;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return KE_ISA_AVX2;
#endif
	return KE_ISA_SCALAR;
}

const char *ke_isa_name(int isa)
{
	switch (isa) {
	case KE_ISA_AVX2:
		return "avx2";
	case KE_ISA_AVX512:
		return "avx512";
	default:
		return "scalar";
	}
}

int ke_isa_set(int isa)
{
	int best = ke_isa_best();
	if (isa < KE_ISA_SCALAR)
		isa = KE_ISA_SCALAR;
	if (isa > best)
		isa = best;
	__atomic_store_n(&g_isa, isa, __ATOMIC_RELEASE);
	return isa;
}

/* The first call reads KVKEEP_ISA. Several kernel threads can make that
 * first call at once: the one whose compare-and-swap sets the path is the
 * one that warns, so a bad value warns once per process. */
int ke_isa(void)
{
	int v = __atomic_load_n(&g_isa, __ATOMIC_ACQUIRE);
	if (v >= 0)
		return v;
	int best = ke_isa_best(), want = best, unknown = 0;
	const char *e = kv_env(KV_ENV_ISA);
	if (e && *e) {
		if (!strcmp(e, "scalar"))
			want = KE_ISA_SCALAR;
		else if (!strcmp(e, "avx2"))
			want = KE_ISA_AVX2;
		else if (!strcmp(e, "avx512"))
			want = KE_ISA_AVX512;
		else
			unknown = 1;
	}
	int isa = want > best ? best : want;
	if (!__atomic_compare_exchange_n(&g_isa, &v, isa, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return v; /* another thread (or ke_isa_set) chose first */
	if (unknown)
		KV_WARN("engine.isa", "msg=\"unknown KVKEEP_ISA ignored\" value=%s", e);
	if (want > best)
		KV_WARN("engine.isa", "msg=\"KVKEEP_ISA above what the CPU has\" want=%s using=%s", ke_isa_name(want),
			ke_isa_name(best));
	return isa;
}

int ke_isa_has_f16c(void)
{
	static int have = -1; /* atomic: -1 until asked */
	int v = __atomic_load_n(&have, __ATOMIC_RELAXED);
	if (v >= 0)
		return v;
	v = 0;
#if defined(__x86_64__)
	unsigned a, b, c, d;
	v = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) ? 1 : 0;
#endif
	__atomic_store_n(&have, v, __ATOMIC_RELAXED);
	return v;
}
