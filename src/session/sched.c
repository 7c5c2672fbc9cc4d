/*
 * sched.c - see sched.h.
 *
 * One mutex guards everything: the pending list (a FIFO of forwards that
 * wait for a step), the join/away counters, the statistics and the list of
 * in-flight prefills. Two condition variables: `work` wakes the engine
 * thread when a forward is submitted (or the set of sequences it waits for
 * changes), `done` wakes submitters when their step ran and flight waiters
 * when a prefill reached a stop point. The engine thread takes the batch
 * out of the list under the lock and runs it without the lock.
 */
#include "session/sched.h"
#include "base/clock.h"
#include "base/err.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_CHUNK 256
#define DEFAULT_GATHER_US 2000

struct fwd {
	struct ke_batch_item it;
	int done;
	uint64_t t_submit;
	struct fwd *next;
};

struct kss_flight {
	const void *ns;
	int32_t *tok;
	uint32_t n;
	uint32_t *stops;
	size_t n_stops;
	uint32_t reached;         /* the newest stop passed */
	uint32_t wants[8];        /* stops that waiters wait for */
	int n_wants;
	struct kss_flight *next;
};

struct kss_sched {
	struct kss_sched_params p;
	struct ke_batch *batch;
	pthread_mutex_t mu;
	pthread_cond_t work, done;
	pthread_t thread;
	int stop;
	struct fwd *head, *tail;
	struct kss_sched_stats st;
	struct kss_flight *flights;
	struct fwd **take;        /* [max_running] the step being run */
	struct ke_batch_item *items;
};

static void deadline_in(struct timespec *ts, long us)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += us / 1000000;
	ts->tv_nsec += (us % 1000000) * 1000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/* Take the next step out of the pending list: every decode (n == 1)
 * first, then prefill chunks oldest first while the rows fit. Lock held. */
static int take_step(struct kss_sched *s)
{
	int k = 0, rows = 0;
	for (int pass = 0; pass < 2; pass++) {
		struct fwd **pp = &s->head, *prev = NULL;
		while (*pp && k < s->p.max_running) {
			struct fwd *f = *pp;
			int dec = f->it.n == 1 || f->it.spec; /* verifications are decodes */
			if ((pass == 0) != dec || rows + f->it.n > s->p.max_batch_tokens) {
				prev = f;
				pp = &f->next;
				continue;
			}
			*pp = f->next;
			if (s->tail == f)
				s->tail = prev;
			f->next = NULL;
			s->take[k++] = f;
			rows += f->it.n;
			s->st.pending--;
		}
	}
	return k;
}

static void *engine_main(void *arg)
{
	struct kss_sched *s = arg;
	uint64_t t_free = 0;      /* when the last step ended */
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->head && !s->stop)
			pthread_cond_wait(&s->work, &s->mu);
		if (s->stop)
			break;
		/* gather: until every joined sequence that is not away has
		 * submitted, or gather_us after the oldest submission or the end
		 * of the last step, whichever is later. (Counting from the oldest
		 * submission alone splits the sequences into two halves that
		 * alternate: those that submitted during a step would start the
		 * next one at once, before the others are back.) */
		uint64_t t_old = s->head->t_submit > t_free ? s->head->t_submit : t_free;
		while (!s->stop && s->st.pending < s->st.joined - s->st.away) {
			uint64_t now = kv_now_ns(), end = t_old + (uint64_t)s->p.gather_us * 1000u;
			if (now >= end)
				break;
			struct timespec ts;
			deadline_in(&ts, (long)((end - now) / 1000u) + 1);
			pthread_cond_timedwait(&s->work, &s->mu, &ts);
		}
		if (s->stop)
			break;
		int k = take_step(s);
		if (!k)
			continue;
		pthread_mutex_unlock(&s->mu);
		int rows = 0, rc;
		for (int i = 0; i < k; i++) {
			s->items[i] = s->take[i]->it;
			s->items[i].rc = KV_OK;
			rows += s->items[i].n;
		}
		uint64_t t0 = kv_now_ns();
		rc = ke_batch_run(s->batch, s->items, k);
		double dt = (double)(kv_now_ns() - t0) / 1e9;
		pthread_mutex_lock(&s->mu);
		for (int i = 0; i < k; i++) {
			s->take[i]->it.rc = rc ? rc : s->items[i].rc;
			s->take[i]->done = 1;
			if (s->items[i].spec)
				s->st.verify_rows += (uint64_t)s->items[i].n;
			else if (s->items[i].n > 1)
				s->st.prefill_rows += (uint64_t)s->items[i].n;
		}
		t_free = kv_now_ns();
		s->st.steps++;
		s->st.rows += (uint64_t)rows;
		s->st.items += (uint64_t)k;
		s->st.step_s += dt;
		s->st.last_batch = k;
		s->st.last_rows = rows;
		s->st.last_step_s = dt;
		if (k > s->st.max_batch)
			s->st.max_batch = k;
		pthread_cond_broadcast(&s->done);
	}
	/* shutdown: nothing pending runs */
	for (struct fwd *f = s->head; f; f = f->next) {
		f->it.rc = KV_ERR_CANCELLED;
		f->done = 1;
	}
	s->head = s->tail = NULL;
	s->st.pending = 0;
	pthread_cond_broadcast(&s->done);
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

int kss_sched_create(const struct kss_sched_params *p, struct kss_sched **out)
{
	int rc;
	*out = NULL;
	if (!p->model || p->max_running < 1 || p->max_running > 1024 || p->chunk < 0 || p->max_batch_tokens < 0 ||
	    p->gather_us < 0)
		return kv_fail(KV_ERR_INVALID, "scheduler: a model and max_running in [1, 1024] are needed");
	struct kss_sched *s = calloc(1, sizeof *s);
	if (!s)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	s->p = *p;
	if (!s->p.chunk)
		s->p.chunk = DEFAULT_CHUNK;
	if (s->p.spec_rows < 0 || s->p.spec_rows > KE_SPEC_MAX_ROWS)
		s->p.spec_rows = KE_SPEC_MAX_ROWS;
	if (!s->p.max_batch_tokens)
		s->p.max_batch_tokens = s->p.chunk + s->p.max_running * (s->p.spec_rows > 1 ? s->p.spec_rows : 1);
	if (!s->p.gather_us)
		s->p.gather_us = DEFAULT_GATHER_US;
	if (s->p.max_running > s->p.max_batch_tokens) {
		rc = kv_fail(KV_ERR_INVALID, "scheduler: --max-batch-tokens %d is below --max-running %d",
			     s->p.max_batch_tokens, s->p.max_running);
		free(s);
		return rc;
	}
	/* a chunk must fit beside the decode tokens of every other running
	 * sequence, or a prefill could wait forever behind them */
	if (s->p.chunk > s->p.max_batch_tokens - s->p.max_running + 1)
		s->p.chunk = s->p.max_batch_tokens - s->p.max_running + 1;
	/* verifications of every running sequence beside a chunk */
	if (s->p.spec_rows > 1 && s->p.spec_rows > (s->p.max_batch_tokens - s->p.chunk) / s->p.max_running)
		s->p.spec_rows = (s->p.max_batch_tokens - s->p.chunk) / s->p.max_running;
	if (s->p.spec_rows < 2)
		s->p.spec_rows = 0;
	s->take = calloc((size_t)s->p.max_running, sizeof *s->take);
	s->items = calloc((size_t)s->p.max_running, sizeof *s->items);
	if (!s->take || !s->items) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto fail;
	}
	if ((rc = ke_batch_create(p->model, s->p.max_batch_tokens, s->p.max_running, &s->batch)))
		goto fail;
	pthread_mutex_init(&s->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->work, &ca);
	pthread_cond_init(&s->done, &ca);
	pthread_condattr_destroy(&ca);
	if (pthread_create(&s->thread, NULL, engine_main, s)) {
		rc = kv_fail(KV_ERR_NOMEM, "scheduler: cannot start the engine thread");
		pthread_cond_destroy(&s->work);
		pthread_cond_destroy(&s->done);
		pthread_mutex_destroy(&s->mu);
		goto fail;
	}
	*out = s;
	return KV_OK;
fail:
	ke_batch_destroy(s->batch);
	free(s->take);
	free(s->items);
	free(s);
	return rc;
}

void kss_sched_destroy(struct kss_sched *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->stop = 1;
	pthread_cond_broadcast(&s->work);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->thread, NULL);
	while (s->flights) {
		struct kss_flight *f = s->flights;
		s->flights = f->next;
		free(f->tok);
		free(f->stops);
		free(f);
	}
	pthread_cond_destroy(&s->work);
	pthread_cond_destroy(&s->done);
	pthread_mutex_destroy(&s->mu);
	ke_batch_destroy(s->batch);
	free(s->take);
	free(s->items);
	free(s);
}

int kss_sched_chunk(const struct kss_sched *s)
{
	return s->p.chunk;
}

int kss_sched_max_batch_tokens(const struct kss_sched *s)
{
	return s->p.max_batch_tokens;
}

void kss_sched_join(struct kss_sched *s)
{
	pthread_mutex_lock(&s->mu);
	s->st.joined++;
	pthread_mutex_unlock(&s->mu);
}

void kss_sched_leave(struct kss_sched *s)
{
	pthread_mutex_lock(&s->mu);
	s->st.joined--;
	pthread_cond_broadcast(&s->work); /* one fewer to wait for */
	pthread_mutex_unlock(&s->mu);
}

void kss_sched_away(struct kss_sched *s, int away)
{
	pthread_mutex_lock(&s->mu);
	s->st.away += away ? 1 : -1;
	pthread_cond_broadcast(&s->work);
	pthread_mutex_unlock(&s->mu);
}

static int submit(struct kss_sched *s, const struct ke_batch_item *it)
{
	struct fwd f = {.it = *it, .t_submit = kv_now_ns()};
	pthread_mutex_lock(&s->mu);
	if (s->stop) {
		pthread_mutex_unlock(&s->mu);
		return kv_fail(KV_ERR_CANCELLED, "the scheduler is stopping");
	}
	if (s->tail)
		s->tail->next = &f;
	else
		s->head = &f;
	s->tail = &f;
	s->st.pending++;
	pthread_cond_signal(&s->work);
	while (!f.done)
		pthread_cond_wait(&s->done, &s->mu);
	pthread_mutex_unlock(&s->mu);
	if (f.it.rc == KV_ERR_CANCELLED)
		return kv_fail(KV_ERR_CANCELLED, "the scheduler is stopping");
	return f.it.rc;
}

int kss_sched_forward(struct kss_sched *s, struct ke_seq *seq, const int32_t *tok, int n, float *logits)
{
	if (n < 1 || n > s->p.chunk)
		return kv_fail(KV_ERR_INVALID, "scheduler: a forward of %d tokens (1..%d)", n, s->p.chunk);
	struct ke_batch_item it = {.s = seq, .tokens = tok, .n = n, .logits = logits};
	return submit(s, &it);
}

int kss_sched_forward_hidden(struct kss_sched *s, struct ke_seq *seq, const int32_t *tok, int n, float *logits,
			     float *hidden)
{
	if (n < 1 || n > s->p.chunk)
		return kv_fail(KV_ERR_INVALID, "scheduler: a forward of %d tokens (1..%d)", n, s->p.chunk);
	struct ke_batch_item it = {.s = seq, .tokens = tok, .n = n, .logits = logits, .hidden = hidden};
	return submit(s, &it);
}

int kss_sched_verify(struct kss_sched *s, struct ke_seq *seq, const int32_t *tok, int n, float *logits_all,
		     float *hidden)
{
	if (n < 1 || n > s->p.spec_rows || !logits_all)
		return kv_fail(KV_ERR_INVALID, "scheduler: a verification of %d tokens (1..%d)", n, s->p.spec_rows);
	struct ke_batch_item it = {.s = seq, .tokens = tok, .n = n, .logits_all = logits_all, .hidden = hidden, .spec = 1};
	return submit(s, &it);
}

int kss_sched_spec_rows(const struct kss_sched *s)
{
	return s->p.spec_rows;
}

void kss_sched_stats(struct kss_sched *s, struct kss_sched_stats *out)
{
	pthread_mutex_lock(&s->mu);
	*out = s->st;
	pthread_mutex_unlock(&s->mu);
}

/* --- in-flight prefills ---------------------------------------------------- */

/* The furthest stop of f that tok[0, n) shares and f has not stored yet
 * (0: none). Lock held. */
static uint32_t shared_stop(const struct kss_flight *f, const int32_t *tok, uint32_t n)
{
	uint32_t lcp = 0, m = f->n < n ? f->n : n;
	while (lcp < m && f->tok[lcp] == tok[lcp])
		lcp++;
	uint32_t best = 0;
	for (size_t i = 0; i < f->n_stops; i++)
		if (f->stops[i] <= lcp && f->stops[i] < n && f->stops[i] > f->reached)
			best = f->stops[i];
	return best;
}

static int set_stops(struct kss_flight *f, const uint32_t *stops, size_t n_stops)
{
	uint32_t *ns = malloc((n_stops + 1) * sizeof *ns);
	if (!ns)
		return KV_ERR_NOMEM;
	if (n_stops)
		memcpy(ns, stops, n_stops * sizeof *stops);
	free(f->stops);
	f->stops = ns;
	f->n_stops = n_stops;
	return KV_OK;
}

struct kss_flight *kss_sched_flight_begin(struct kss_sched *s, const void *ns, const int32_t *tok, uint32_t n,
					  const uint32_t *stops, size_t n_stops, const atomic_int *cancel,
					  uint32_t *waited)
{
	int counted = 0;
	*waited = 0;
	struct kss_flight *f = calloc(1, sizeof *f);
	if (f) {
		f->ns = ns;
		f->n = n;
		f->tok = malloc(((size_t)n + 1) * sizeof *f->tok);
		if (!f->tok || set_stops(f, stops, n_stops)) {
			free(f->tok);
			free(f);
			f = NULL;
		} else {
			memcpy(f->tok, tok, (size_t)n * sizeof *tok);
		}
	}
	pthread_mutex_lock(&s->mu);
	for (;;) {
		uint32_t best = 0;
		struct kss_flight *bf = NULL;
		for (struct kss_flight *o = s->flights; o; o = o->next)
			if (o->ns == ns) {
				uint32_t b = shared_stop(o, tok, n);
				if (b > best) {
					best = b;
					bf = o;
				}
			}
		if (!best || s->stop || (cancel && atomic_load(cancel)))
			break;
		int have = 0;
		for (int i = 0; i < bf->n_wants; i++)
			have |= bf->wants[i] == best;
		if (!have && bf->n_wants < (int)(sizeof bf->wants / sizeof bf->wants[0]))
			bf->wants[bf->n_wants++] = best;
		if (!counted) {
			s->st.flight_waits++;
			counted = 1;
		}
		if (best > *waited) {
			s->st.flight_tokens += best - *waited;
			*waited = best;
		}
		/* woken by flight_at / flight_stops / flight_end; the slice bounds
		 * how late a cancel is seen */
		struct timespec ts;
		deadline_in(&ts, 50000);
		pthread_cond_timedwait(&s->done, &s->mu, &ts);
	}
	if (f) {
		f->next = s->flights;
		s->flights = f;
	}
	pthread_mutex_unlock(&s->mu);
	return f;
}

void kss_sched_flight_stops(struct kss_sched *s, struct kss_flight *f, const uint32_t *stops, size_t n_stops)
{
	if (!f)
		return;
	pthread_mutex_lock(&s->mu);
	if (set_stops(f, stops, n_stops))
		f->n_stops = 0; /* out of memory: nobody waits for this one */
	pthread_cond_broadcast(&s->done);
	pthread_mutex_unlock(&s->mu);
}

int kss_sched_flight_wanted(struct kss_sched *s, struct kss_flight *f, uint32_t pos)
{
	int w = 0;
	if (!f)
		return 0;
	pthread_mutex_lock(&s->mu);
	for (int i = 0; i < f->n_wants; i++)
		w |= f->wants[i] == pos;
	if (!w && pos > f->reached)
		f->reached = pos; /* nobody waits: passed (see sched.h) */
	pthread_mutex_unlock(&s->mu);
	return w;
}

void kss_sched_flight_at(struct kss_sched *s, struct kss_flight *f, uint32_t pos)
{
	if (!f)
		return;
	pthread_mutex_lock(&s->mu);
	if (pos > f->reached)
		f->reached = pos;
	pthread_cond_broadcast(&s->done);
	pthread_mutex_unlock(&s->mu);
}

void kss_sched_flight_end(struct kss_sched *s, struct kss_flight *f)
{
	if (!f)
		return;
	pthread_mutex_lock(&s->mu);
	for (struct kss_flight **pp = &s->flights; *pp; pp = &(*pp)->next)
		if (*pp == f) {
			*pp = f->next;
			break;
		}
	pthread_cond_broadcast(&s->done);
	pthread_mutex_unlock(&s->mu);
	free(f->tok);
	free(f->stops);
	free(f);
}
