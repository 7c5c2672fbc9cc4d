/*
 * par.h - the engine's parallel-for: dynamic chunks, and a caller that
 * never waits for a worker that has not started.
 *
 * kv_pool_for (base/pool.h) gives each thread a fixed range, so a call
 * lasts until the slowest thread has been scheduled and finished; on a
 * machine whose cores are busy with other processes one descheduled
 * worker stalls every kernel call for a time slice. Here the caller and
 * the workers claim chunks of `grain` indices from a shared counter; when
 * the counter runs out the caller closes the call, and a worker that had
 * not joined by then never touches it. The caller waits only for workers
 * that are running a chunk. Which thread runs which chunk never changes a
 * result: every kernel computes each index on its own (gemm.h, attn.h).
 *
 * fn gets [begin, end) and a thread index (0 = caller, 1..n-1 = workers),
 * unique among the threads inside one call (for per-thread scratch).
 * Calls from inside fn run inline; concurrent calls from several threads
 * are serialised. Threads: KVKEEP_THREADS, else one per core.
 */
#ifndef KV_ENGINE_PAR_H
#define KV_ENGINE_PAR_H

#include <stddef.h>

typedef void (*ke_range_fn)(void *ctx, size_t begin, size_t end, int thread);

void ke_par_for(size_t n, size_t grain, ke_range_fn fn, void *ctx);
/* Threads a call may use (caller included), >= 1. */
int ke_par_threads(void);

#endif
