/*
 * pool.c - see pool.h.
 *
 * Dispatch: the caller publishes (fn, ctx, n, grain), bumps `gen`, runs
 * range 0, then waits until `pending` reaches 0. Each worker spins on
 * `gen` for a while, then sleeps on a condition variable.
 */
#include "base/pool.h"
#include "base/err.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include <stdint.h>

#define SPIN_ITERS 20000

struct kv_pool {
	int n;                   /* threads including the caller */
	pthread_t *th;
	pthread_mutex_t call_lock; /* one kv_pool_for at a time */
	pthread_mutex_t lock;
	pthread_cond_t wake;
	pthread_cond_t done;
	uint64_t gen;            /* bumped per dispatch (atomic) */
	int pending;             /* workers still running this dispatch (atomic) */
	int stop;
	int sleepers;            /* workers blocked on `wake` (under lock) */
	kv_range_fn fn;
	void *ctx;
	size_t total, grain;
};

static _Thread_local int t_in_worker;

static void range_of(const struct kv_pool *p, int t, size_t *b, size_t *e)
{
	size_t units = (p->total + p->grain - 1) / p->grain;
	size_t per = units / (size_t)p->n, rem = units % (size_t)p->n;
	size_t ub = (size_t)t * per + ((size_t)t < rem ? (size_t)t : rem);
	size_t ue = ub + per + ((size_t)t < rem ? 1 : 0);
	*b = ub * p->grain;
	*e = ue * p->grain;
	if (*b > p->total)
		*b = p->total;
	if (*e > p->total)
		*e = p->total;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__)
	__builtin_ia32_pause();
#endif
}

struct warg {
	struct kv_pool *p;
	int t;
};

static void *worker(void *arg)
{
	struct warg *wa = arg;
	struct kv_pool *p = wa->p;
	int t = wa->t;
	uint64_t seen = 0;

	free(wa);
	t_in_worker = 1;
	for (;;) {
		uint64_t g;
		int spins = 0;
		while ((g = __atomic_load_n(&p->gen, __ATOMIC_ACQUIRE)) == seen && spins < SPIN_ITERS) {
			cpu_relax();
			spins++;
		}
		if (g == seen) {
			pthread_mutex_lock(&p->lock);
			p->sleepers++;
			while ((g = __atomic_load_n(&p->gen, __ATOMIC_ACQUIRE)) == seen && !p->stop)
				pthread_cond_wait(&p->wake, &p->lock);
			p->sleepers--;
			pthread_mutex_unlock(&p->lock);
		}
		if (p->stop)
			return NULL;
		seen = g;
		size_t b, e;
		range_of(p, t, &b, &e);
		if (b < e)
			p->fn(p->ctx, b, e, t);
		if (__atomic_sub_fetch(&p->pending, 1, __ATOMIC_ACQ_REL) == 0) {
			pthread_mutex_lock(&p->lock);
			pthread_cond_signal(&p->done);
			pthread_mutex_unlock(&p->lock);
		}
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
	if (!p)
		return NULL;
	p->n = n_threads > 0 ? n_threads : kv_ncores();
	if (p->n > 256)
		p->n = 256;
	pthread_mutex_init(&p->call_lock, NULL);
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->wake, NULL);
	pthread_cond_init(&p->done, NULL);
	p->th = calloc((size_t)p->n, sizeof *p->th);
	if (!p->th) {
		free(p);
		return NULL;
	}
	for (int t = 1; t < p->n; t++) {
		struct warg *wa = malloc(sizeof *wa);
		if (wa) {
			wa->p = p;
			wa->t = t;
		}
		if (!wa || pthread_create(&p->th[t], NULL, worker, wa) != 0) {
			free(wa);
			p->n = t; /* run with the threads that started */
			break;
		}
	}
	return p;
}

void kv_pool_destroy(struct kv_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->stop = 1;
	__atomic_add_fetch(&p->gen, 1, __ATOMIC_RELEASE);
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->lock);
	for (int t = 1; t < p->n; t++)
		pthread_join(p->th[t], NULL);
	pthread_mutex_destroy(&p->call_lock);
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->wake);
	pthread_cond_destroy(&p->done);
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
	if (!p || p->n == 1 || t_in_worker || n <= grain) {
		fn(ctx, 0, n, 0);
		return;
	}
	pthread_mutex_lock(&p->call_lock);
	p->fn = fn;
	p->ctx = ctx;
	p->total = n;
	p->grain = grain;
	__atomic_store_n(&p->pending, p->n - 1, __ATOMIC_RELEASE);
	pthread_mutex_lock(&p->lock);
	__atomic_add_fetch(&p->gen, 1, __ATOMIC_RELEASE);
	if (p->sleepers)
		pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->lock);

	size_t b, e;
	range_of(p, 0, &b, &e);
	t_in_worker = 1;
	if (b < e)
		fn(ctx, b, e, 0);
	t_in_worker = 0;

	int spins = 0;
	while (__atomic_load_n(&p->pending, __ATOMIC_ACQUIRE) > 0 && spins < SPIN_ITERS) {
		cpu_relax();
		spins++;
	}
	if (__atomic_load_n(&p->pending, __ATOMIC_ACQUIRE) > 0) {
		pthread_mutex_lock(&p->lock);
		while (__atomic_load_n(&p->pending, __ATOMIC_ACQUIRE) > 0)
			pthread_cond_wait(&p->done, &p->lock);
		pthread_mutex_unlock(&p->lock);
	}
	pthread_mutex_unlock(&p->call_lock);
}

static struct kv_pool *g_pool;
static pthread_once_t g_pool_once = PTHREAD_ONCE_INIT;

static void make_global(void)
{
	const char *e = getenv("KVKEEP_THREADS");
	int n = e ? atoi(e) : 0;
	g_pool = kv_pool_create(n > 0 ? n : 0);
}

struct kv_pool *kv_pool_global(void)
{
	pthread_once(&g_pool_once, make_global);
	return g_pool;
}
