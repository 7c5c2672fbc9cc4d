/*
 * pool.h - a pthread pool with a parallel-for over index ranges.
 *
 * kv_pool_for(pool, n, grain, fn, ctx) splits [0, n) into one contiguous
 * range per thread (range edges are multiples of `grain`), runs them, and
 * returns when all are done. The split depends only on n, grain and the
 * pool size, so callers that need determinism get it. The calling thread
 * runs the first range itself. Workers spin briefly before sleeping so the
 * many small dispatches of a decode step stay cheap.
 *
 * Calls from inside a worker run inline (no nesting). Calls from several
 * outside threads are serialised by a mutex.
 */
#ifndef KV_BASE_POOL_H
#define KV_BASE_POOL_H

#include <stddef.h>

struct kv_pool;

/* fn gets [begin, end) and the index of the thread running it (0 = caller). */
typedef void (*kv_range_fn)(void *ctx, size_t begin, size_t end, int thread);

/* n_threads <= 0: one per online core. Returns NULL on failure. */
struct kv_pool *kv_pool_create(int n_threads);
void kv_pool_destroy(struct kv_pool *p);
int kv_pool_size(const struct kv_pool *p);
void kv_pool_for(struct kv_pool *p, size_t n, size_t grain, kv_range_fn fn, void *ctx);

/* Process-wide pool, created on first use with KVKEEP_THREADS threads (or
 * one per core). Never destroyed. */
struct kv_pool *kv_pool_global(void);
/* Number of online cores (>= 1). */
int kv_ncores(void);

#endif
