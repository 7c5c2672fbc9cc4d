/*
 * prof.h - per-phase time of the forward pass, for `kvkeep bench engine`.
 *
 * Off by default (one relaxed atomic load per kernel call). When on, the
 * thread that runs a forward adds, per phase, the wall time of each
 * top-level kernel call (its parallel part included) and the work it did:
 *   KE_PROF_GEMM   ke_gemm calls: flops 2 M N K, weight bytes N K es
 *   KE_PROF_ATTN   ke_attn calls: flops of q.k and p.v over the keys read
 *   KE_PROF_DN     DeltaNet conv + delta rule: flops 7 dk dv per token and
 *                  value head, bytes = the state read and written
 * Everything else of a forward (norms, RoPE, SiLU, embedding, copies) is
 * "other" = forward time - the three. Counters are process-wide: profile
 * one sequence at a time.
 */
#ifndef KV_ENGINE_PROF_H
#define KV_ENGINE_PROF_H

enum { KE_PROF_GEMM = 0, KE_PROF_ATTN, KE_PROF_DN, KE_PROF_FWD, KE_PROF__COUNT };

struct ke_prof {
	double sec[KE_PROF__COUNT];
	double flops[KE_PROF__COUNT];
	double bytes[KE_PROF__COUNT];
};

void ke_prof_enable(int on);
void ke_prof_reset(void);
void ke_prof_get(struct ke_prof *out);
/* Start of a timed region: 0 when profiling is off (then _add does nothing). */
double ke_prof_t0(void);
void ke_prof_add(int phase, double t0, double flops, double bytes);

/* Measured FMA peak of this machine on a path (enum ke_isa), GFLOP/s,
 * all pool threads, about `seconds` long: the yardstick of the phases. */
double ke_peak_gflops(int isa, double seconds);

#endif
