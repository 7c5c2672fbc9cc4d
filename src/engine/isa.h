/*
 * isa.h - which CPU code path the engine's kernels take.
 *
 * Every kernel of src/engine has a scalar reference and SIMD paths
 * (AVX2+FMA, AVX-512). The paths are written so that they compute the
 * same operations in the same order, with fused multiply-adds exactly
 * where the scalar reference calls fmaf(): their results are bit for bit
 * identical, which the unit tests check (test_kernels.c). So the choice of
 * path changes speed, never numbers.
 *
 * The path is picked once at run time from CPUID (no -march flags: SIMD
 * functions carry target attributes, so the binary runs on any x86-64).
 * KVKEEP_ISA=scalar|avx2|avx512 forces a lower path (a higher one than
 * the CPU has is clamped down with a warning). Tests switch paths with
 * ke_isa_set().
 */
#ifndef KV_ENGINE_ISA_H
#define KV_ENGINE_ISA_H

enum ke_isa { KE_ISA_SCALAR = 0, KE_ISA_AVX2 = 1, KE_ISA_AVX512 = 2 };

/* The path in use (detected on first call). */
int ke_isa(void);
/* Best path this CPU supports. */
int ke_isa_best(void);
/* Force a path; clamped to ke_isa_best(). Returns the path now in use.
 * Not thread-safe against running kernels: call between forwards. */
int ke_isa_set(int isa);
/* "scalar", "avx2", "avx512". */
const char *ke_isa_name(int isa);
/* 1 if the CPU has F16C (half <-> float conversions). Asked of CPUID once:
 * "f16c" is not a __builtin_cpu_supports name in every compiler (clang 14,
 * which the fuzz build uses, lacks it). */
int ke_isa_has_f16c(void);

#endif
