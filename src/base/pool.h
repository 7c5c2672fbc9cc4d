/*
 * pool.h - a pthread pool with a parallel-for over index ranges.
 *
 * kv_pool_for(pool, n, grain, fn, ctx) runs fn over [0, n) in chunks of
 * `grain` indices and returns when all are done. Chunks are claimed from a
 * shared counter by the caller and by the workers, so a worker that the
 * OS has not scheduled yet never holds up the call: when the counter runs
 * out the caller closes the call and waits only for workers that are
 * inside a chunk (a late worker sees the call closed and leaves). On a
 * machine whose cores are busy with other processes this matters: a fixed
 * split would make every call last until its slowest thread got a time
 * slice.
 *
 * Which thread runs which chunk varies from call to call, so fn must
 * compute each index on its own (the engine's kernels do: every output
 * column has one fixed reduction order). The `thread` argument is unique
 * among the threads inside one call (0 = the caller), for per-thread
 * scratch. Calls from inside fn run inline. Calls from several outside
 * threads are serialised by a mutex.
 */
#ifndef KV_BASE_POOL_H
#define KV_BASE_POOL_H

#include <stddef.h>

struct kv_pool;

/* fn gets [begin, end) and the index of the thread running it (0 = caller,
 * 1 .. size-1 = workers). */
typedef void (*kv_range_fn)(void *ctx, size_t begin, size_t end, int thread);

/* n_threads <= 0: one per online core (the caller counts as one). NULL on
 * failure. */
struct kv_pool *kv_pool_create(int n_threads);
void kv_pool_destroy(struct kv_pool *p);
/* Threads a call may use, caller included (>= 1). */
int kv_pool_size(const struct kv_pool *p);
void kv_pool_for(struct kv_pool *p, size_t n, size_t grain, kv_range_fn fn, void *ctx);

/* Process-wide pool, created on first use with KVKEEP_THREADS threads (or
 * one per core). Never destroyed. */
struct kv_pool *kv_pool_global(void);
/* Threads the global pool will have (n > 0), for `serve -t N`: wins over
 * KVKEEP_THREADS. Only before the pool's first use: KV_ERR_INVALID after. */
int kv_pool_global_threads(int n);
/* Number of online cores (>= 1). */
int kv_ncores(void);

#endif
