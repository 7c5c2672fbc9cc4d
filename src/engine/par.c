/*
 * par.c - see par.h.
 *
 * Protocol of one call (all atomics sequentially consistent):
 *   caller: publish fn/ctx/n/grain, next = 0, open = 1, bump gen, wake
 *           sleepers; claim chunks; open = 0; wait until active == 0.
 *   worker: see gen change; active++; if (!open || gen changed) active--
 *           and go back; else claim chunks until none, active--.
 * If a worker's "active++" comes before the caller's "open = 0" in the
 * total order, the caller sees active > 0 and waits for it; otherwise the
 * worker sees open == 0 and leaves without touching the job. So the job
 * (on the caller's stack) is never used after the caller returns.
 */
#include "engine/par.h"
#include "base/pool.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define SPIN 4000

struct team {
	int n;                    /* threads including the caller */
	pthread_mutex_t call;     /* one call at a time */
	pthread_mutex_t lock;     /* sleepers */
	pthread_cond_t wake;
	int sleepers;
	/* the current job */
	ke_range_fn fn;
	void *ctx;
	size_t total, grain;
	size_t next;              /* atomic: next unclaimed index */
	int open;                 /* atomic */
	int active;               /* atomic: workers inside the job */
	uint64_t gen;             /* atomic */
};

static struct team g_team;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static _Thread_local int t_inside;

static inline void relax(void)
{
#if defined(__x86_64__)
	__builtin_ia32_pause();
#endif
}

static void run_chunks(struct team *t, int id)
{
	for (;;) {
		size_t b = __atomic_fetch_add(&t->next, t->grain, __ATOMIC_SEQ_CST);
		if (b >= t->total)
			return;
		size_t e = b + t->grain < t->total ? b + t->grain : t->total;
		t->fn(t->ctx, b, e, id);
	}
}

static void *worker(void *arg)
{
	struct team *t = &g_team;
	int id = (int)(intptr_t)arg;
	uint64_t seen = 0;
	t_inside = 1;
	for (;;) {
		uint64_t g;
		int spins = 0;
		while ((g = __atomic_load_n(&t->gen, __ATOMIC_SEQ_CST)) == seen && spins < SPIN) {
			relax();
			spins++;
		}
		if (g == seen) {
			pthread_mutex_lock(&t->lock);
			t->sleepers++;
			while ((g = __atomic_load_n(&t->gen, __ATOMIC_SEQ_CST)) == seen)
				pthread_cond_wait(&t->wake, &t->lock);
			t->sleepers--;
			pthread_mutex_unlock(&t->lock);
		}
		seen = g;
		__atomic_add_fetch(&t->active, 1, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(&t->open, __ATOMIC_SEQ_CST) && __atomic_load_n(&t->gen, __ATOMIC_SEQ_CST) == g)
			run_chunks(t, id);
		__atomic_sub_fetch(&t->active, 1, __ATOMIC_SEQ_CST);
	}
	return NULL;
}

static void team_init(void)
{
	struct team *t = &g_team;
	const char *e = getenv("KVKEEP_THREADS");
	int n = e ? atoi(e) : 0;
	if (n <= 0)
		n = kv_ncores();
	if (n > 64)
		n = 64;
	pthread_mutex_init(&t->call, NULL);
	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->wake, NULL);
	t->n = 1;
	for (int i = 1; i < n; i++) {
		pthread_t th;
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		int rc = pthread_create(&th, &at, worker, (void *)(intptr_t)i);
		pthread_attr_destroy(&at);
		if (rc)
			break; /* run with the threads that started */
		t->n = i + 1;
	}
}

int ke_par_threads(void)
{
	pthread_once(&g_once, team_init);
	return g_team.n;
}

void ke_par_for(size_t n, size_t grain, ke_range_fn fn, void *ctx)
{
	struct team *t = &g_team;
	if (n == 0)
		return;
	if (grain == 0)
		grain = 1;
	if (t_inside || n <= grain || ke_par_threads() == 1) {
		fn(ctx, 0, n, 0);
		return;
	}
	pthread_mutex_lock(&t->call);
	t->fn = fn;
	t->ctx = ctx;
	t->total = n;
	t->grain = grain;
	__atomic_store_n(&t->next, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&t->open, 1, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&t->gen, 1, __ATOMIC_SEQ_CST);
	pthread_mutex_lock(&t->lock);
	if (t->sleepers)
		pthread_cond_broadcast(&t->wake);
	pthread_mutex_unlock(&t->lock);
	t_inside = 1;
	run_chunks(t, 0);
	t_inside = 0;
	__atomic_store_n(&t->open, 0, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(&t->active, __ATOMIC_SEQ_CST) > 0)
		relax();
	pthread_mutex_unlock(&t->call);
}
