/*
 * pool.c - see pool.h.
 *
 * Protocol of one call (all atomics sequentially consistent):
 *   caller: publish fn/ctx/n/grain, next = 0, open = 1, bump gen, wake
 *           sleepers; claim chunks; open = 0; wait until active == 0.
 *   worker: see gen change; active++; if open and gen unchanged, claim
 *           chunks until none; active--.
 * If a worker's "active++" comes before the caller's "open = 0" in the
 * total order, the caller sees active > 0 and waits for it; otherwise the
 * worker sees open == 0 and leaves without touching the job. So the job
 * (whose ctx usually lives on the caller's stack) is never used after the
 * caller returns. Workers spin briefly before sleeping so the many small
 * calls of a decode step stay cheap.
 */
#include "base/env.h"
#include "base/pool.h"
#include "base/err.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define SPIN_ITERS 4000

struct kv_pool {
	int n;                     /* threads including the caller */
	pthread_t *th;             /* th[1 .. n-1] */
	pthread_mutex_t call;      /* one call at a time */
	pthread_mutex_t lock;      /* guards sleepers and the wake condition */
	pthread_cond_t wake;
	int sleepers;
	int stop;                  /* atomic */
	/* the current job */
	kv_range_fn fn;
	void *ctx;
	size_t total, grain;
	size_t next;               /* atomic: next unclaimed index */
	int open;                  /* atomic */
	int active;                /* atomic: workers inside the job */
	uint64_t gen;              /* atomic */
};

struct warg {
	struct kv_pool *p;
	int id;
};

static _Thread_local int t_inside;

static inline void cpu_relax(void)
{
#if defined(__x86_64__)
	__builtin_ia32_pause();
#endif
}

static void run_chunks(struct kv_pool *p, int id)
{
	for (;;) {
		size_t b = __atomic_fetch_add(&p->next, p->grain, __ATOMIC_SEQ_CST);
		if (b >= p->total)
			return;
		size_t e = b + p->grain < p->total ? b + p->grain : p->total;
		p->fn(p->ctx, b, e, id);
	}
}

static void *worker(void *arg)
{
	struct warg *wa = arg;
	struct kv_pool *p = wa->p;
	int id = wa->id;
	uint64_t seen = 0;

	free(wa);
	t_inside = 1;
	for (;;) {
		uint64_t g;
		int spins = 0;
		while ((g = __atomic_load_n(&p->gen, __ATOMIC_SEQ_CST)) == seen && spins < SPIN_ITERS) {
			cpu_relax();
			spins++;
		}
		if (g == seen) {
			pthread_mutex_lock(&p->lock);
			p->sleepers++;
			while ((g = __atomic_load_n(&p->gen, __ATOMIC_SEQ_CST)) == seen)
				pthread_cond_wait(&p->wake, &p->lock);
			p->sleepers--;
			pthread_mutex_unlock(&p->lock);
		}
		if (__atomic_load_n(&p->stop, __ATOMIC_SEQ_CST))
			return NULL;
		seen = g;
		__atomic_add_fetch(&p->active, 1, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(&p->open, __ATOMIC_SEQ_CST) && __atomic_load_n(&p->gen, __ATOMIC_SEQ_CST) == g)
			run_chunks(p, id);
		__atomic_sub_fetch(&p->active, 1, __ATOMIC_SEQ_CST);
	}
}

int kv_ncores(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : (int)n;
}

struct kv_pool *kv_pool_create(int n_threads)
{
	struct kv_pool *p = calloc(1, sizeof *p);
	int want = n_threads > 0 ? n_threads : kv_ncores();

	if (!p)
		return NULL;
	if (want > 256)
		want = 256;
	p->th = calloc((size_t)want, sizeof *p->th);
	if (!p->th) {
		free(p);
		return NULL;
	}
	pthread_mutex_init(&p->call, NULL);
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->wake, NULL);
	p->n = 1;
	for (int i = 1; i < want; i++) {
		struct warg *wa = malloc(sizeof *wa);
		if (!wa)
			break;
		wa->p = p;
		wa->id = i;
		if (pthread_create(&p->th[i], NULL, worker, wa) != 0) {
			free(wa);
			break; /* run with the threads that started */
		}
		p->n = i + 1;
	}
	return p;
}

void kv_pool_destroy(struct kv_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	__atomic_store_n(&p->stop, 1, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&p->gen, 1, __ATOMIC_SEQ_CST);
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->lock);
	for (int t = 1; t < p->n; t++)
		pthread_join(p->th[t], NULL);
	pthread_mutex_destroy(&p->call);
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->wake);
	free(p->th);
	free(p);
}

int kv_pool_size(const struct kv_pool *p)
{
	return p ? p->n : 1;
}

void kv_pool_for(struct kv_pool *p, size_t n, size_t grain, kv_range_fn fn, void *ctx)
{
	if (n == 0)
		return;
	if (grain == 0)
		grain = 1;
	if (!p || p->n == 1 || t_inside || n <= grain) {
		fn(ctx, 0, n, 0);
		return;
	}
	pthread_mutex_lock(&p->call);
	p->fn = fn;
	p->ctx = ctx;
	p->total = n;
	p->grain = grain;
	__atomic_store_n(&p->next, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&p->open, 1, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&p->gen, 1, __ATOMIC_SEQ_CST);
	pthread_mutex_lock(&p->lock);
	if (p->sleepers)
		pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->lock);
	t_inside = 1;
	run_chunks(p, 0);
	t_inside = 0;
	__atomic_store_n(&p->open, 0, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(&p->active, __ATOMIC_SEQ_CST) > 0)
		cpu_relax();
	pthread_mutex_unlock(&p->call);
}

static struct kv_pool *g_pool;
static pthread_once_t g_pool_once = PTHREAD_ONCE_INIT;
static int g_want;          /* kv_pool_global_threads, 0: not given */
static atomic_int g_made;

static void make_global(void)
{
	const char *e = kv_env(KV_ENV_THREADS);
	int n = g_want > 0 ? g_want : e ? atoi(e) : 0;
	g_pool = kv_pool_create(n > 0 ? n : 0);
	atomic_store(&g_made, 1);
}

int kv_pool_global_threads(int n)
{
	if (n < 1 || atomic_load(&g_made))
		return kv_fail(KV_ERR_INVALID, "the thread count is set before the thread pool starts, to 1 or more");
	g_want = n;
	return KV_OK;
}

struct kv_pool *kv_pool_global(void)
{
	pthread_once(&g_pool_once, make_global);
	return g_pool;
}
