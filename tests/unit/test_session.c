/*
 * test_session.c - the session layer: the engine's scheduler (continuous
 * batching, gathering, away sequences, in-flight prefills) and the
 * request driver run through it.
 *
 *   - threads that each drive a sequence through kss_sched_forward (decode
 *     tokens and prefill chunks mixed) get the logits of running alone, by
 *     memcmp, and the scheduler really batched them
 *   - a joined sequence that is away does not make a step wait; one that
 *     is not away does (up to gather_us)
 *   - a request whose prompt shares a stop point of a running prefill
 *     waits for it, asks for it to be stored, and a cancel ends the wait
 *   - kss_run on 6 threads through one scheduler and one cache (dense and
 *     hybrid): the same tokens and logits as running the requests one
 *     after another, and requests started together on the same system
 *     prompt resume from the one that prefills it
 */
#include "kt.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "cache/cache.h"
#include "engine/model.h"
#include "engine/seq.h"
#include "model/safetensors.h"
#include "model/synth.h"
#include "session/run.h"
#include "session/sched.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t g_seed = 0x5e55;

static struct ke_model *load_model(const char *preset)
{
	char dir[1024];
	struct ke_model *m = NULL;
	snprintf(dir, sizeof dir, "%s/%s", kt_tmpdir(), preset);
	struct kv_synth_opts o = {.preset = preset, .out_dir = dir, .seed = 7, .dtype = KV_DT_BF16};
	if (kv_synth_write(&o) != KV_OK) {
		kt_fail(__FILE__, __LINE__, "synth %s: %s", preset, kv_errmsg());
		return NULL;
	}
	struct ke_model_params mp = {.page_tokens = 16};
	if (ke_model_load(dir, &mp, &m) != KV_OK) {
		kt_fail(__FILE__, __LINE__, "load %s: %s", preset, kv_errmsg());
		return NULL;
	}
	return m;
}

static int rnd(int lo, int hi)
{
	return lo + (int)(kt_rand(&g_seed) % (uint64_t)(hi - lo + 1));
}

/* --- forwards from several threads ------------------------------------------ */

struct driver {
	struct kss_sched *s;
	struct ke_model *m;
	int32_t tok[160];
	int n;
	int chunks[160];          /* the chunk sizes this thread uses, in order */
	float *want;              /* [n][V] logits of every position, alone */
	int bad, rc;
};

static void *drive(void *arg)
{
	struct driver *d = arg;
	int V = ke_model_config(d->m)->vocab;
	struct ke_seq *seq = NULL;
	struct ke_seq_params sp = {.chunk = 1};
	float *lg = malloc((size_t)V * sizeof *lg);
	if ((d->rc = ke_seq_create(d->m, &sp, &seq)))
		goto out;
	kss_sched_join(d->s);
	for (int at = 0, k = 0; at < d->n; k++) {
		int n = d->chunks[k];
		if ((d->rc = kss_sched_forward(d->s, seq, d->tok + at, n, lg)))
			break;
		at += n;
		if (memcmp(lg, d->want + (size_t)(at - 1) * V, (size_t)V * sizeof *lg))
			d->bad++;
	}
	kss_sched_leave(d->s);
out:
	ke_seq_destroy(seq);
	free(lg);
	return NULL;
}

static void batched_forwards(const char *preset)
{
	enum { K = 4 };
	struct ke_model *m = load_model(preset);
	KT_REQUIRE(m);
	int V = ke_model_config(m)->vocab;
	struct kss_sched *s = NULL;
	struct kss_sched_params p = {.model = m, .max_running = K, .chunk = 12};
	KT_OK(kss_sched_create(&p, &s));
	struct driver d[K];
	pthread_t th[K];
	for (int i = 0; i < K; i++) {
		memset(&d[i], 0, sizeof d[i]);
		d[i].s = s;
		d[i].m = m;
		d[i].n = rnd(60, 160);
		for (int t = 0; t < d[i].n; t++)
			d[i].tok[t] = rnd(20, 600);
		/* a prefill in chunks, then decode steps */
		int at = 0, k = 0, pre = d[i].n / 2;
		while (at < d[i].n) {
			int c = at < pre ? rnd(1, 12) : 1;
			if (at + c > d[i].n)
				c = d[i].n - at;
			d[i].chunks[k++] = c;
			at += c;
		}
		struct ke_seq *alone = NULL;
		struct ke_seq_params sp = {.chunk = 512};
		d[i].want = malloc((size_t)d[i].n * V * sizeof(float));
		struct ke_prefill_opts o = {.logits_all = d[i].want};
		KT_OK(ke_seq_create(m, &sp, &alone));
		KT_OK(ke_seq_prefill(alone, d[i].tok, d[i].n, &o, NULL));
		ke_seq_destroy(alone);
	}
	for (int i = 0; i < K; i++)
		pthread_create(&th[i], NULL, drive, &d[i]);
	for (int i = 0; i < K; i++)
		pthread_join(th[i], NULL);
	struct kss_sched_stats st;
	kss_sched_stats(s, &st);
	for (int i = 0; i < K; i++) {
		KT_OK(d[i].rc);
		KT_CHECKF(d[i].bad == 0, "%s: thread %d: %d forwards differ from running alone", preset, i, d[i].bad);
		free(d[i].want);
	}
	KT_CHECKF(st.max_batch >= 2, "%s: no step batched two sequences (max %d over %llu steps)", preset, st.max_batch,
		  (unsigned long long)st.steps);
	KT_CHECK(st.items > st.steps);
	KT_EQ_INT(st.joined, 0);
	KT_EQ_INT(st.pending, 0);
	/* a forward longer than a chunk is refused */
	struct ke_seq *q = NULL;
	KT_OK(ke_seq_create(m, NULL, &q));
	int32_t many[13] = {0};
	KT_EQ_INT(kss_sched_forward(s, q, many, 13, NULL), KV_ERR_INVALID);
	ke_seq_destroy(q);
	kss_sched_destroy(s);
	ke_model_destroy(m);
}

KT_CASE(batched_forwards_equal_alone_dense)
{
	batched_forwards("tiny-dense");
}

KT_CASE(batched_forwards_equal_alone_hybrid)
{
	batched_forwards("tiny-hybrid");
}

/* Four sequences decoding together run as batches of four: a step waits
 * for all of them. (The split into two alternating halves that gathering
 * from the oldest submission caused needs steps slower than a thread
 * wake-up; tiny models are too fast to show it: `kvkeep bench batch` with
 * KVKEEP_BENCH_BATCH_DEBUG=1 on bench-hybrid does, mean batch 2.00 -> 4.00.) */
struct dec4 {
	struct kss_sched *s;
	struct ke_model *m;
	pthread_barrier_t *bar;
	int rc;
};

static void *dec4_main(void *arg)
{
	struct dec4 *d = arg;
	struct ke_seq *q = NULL;
	struct ke_seq_params sp = {.chunk = 1};
	int32_t t = 7;
	d->rc = ke_seq_create(d->m, &sp, &q);
	kss_sched_join(d->s);
	pthread_barrier_wait(d->bar);
	for (int i = 0; i < 40 && !d->rc; i++)
		d->rc = kss_sched_forward(d->s, q, &t, 1, NULL);
	kss_sched_leave(d->s);
	ke_seq_destroy(q);
	return NULL;
}

KT_CASE(steps_gather_every_running_sequence)
{
	struct ke_model *m = load_model("tiny-dense");
	KT_REQUIRE(m);
	struct kss_sched *s = NULL;
	struct kss_sched_params p = {.model = m, .max_running = 4, .gather_us = 100000};
	KT_OK(kss_sched_create(&p, &s));
	pthread_barrier_t bar;
	pthread_barrier_init(&bar, NULL, 4);
	struct dec4 d[4];
	pthread_t th[4];
	for (int i = 0; i < 4; i++) {
		d[i] = (struct dec4){.s = s, .m = m, .bar = &bar};
		pthread_create(&th[i], NULL, dec4_main, &d[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		KT_OK(d[i].rc);
	}
	struct kss_sched_stats st;
	kss_sched_stats(s, &st);
	KT_EQ_U64(st.items, 160);
	KT_CHECKF(st.steps <= 44, "160 decode tokens of 4 sequences took %llu steps (mean batch %.2f, want about 4)",
		  (unsigned long long)st.steps, 160.0 / (double)st.steps);
	pthread_barrier_destroy(&bar);
	kss_sched_destroy(s);
	ke_model_destroy(m);
}

/* A step waits (up to gather_us) for a joined sequence, never for one
 * that is away. */
KT_CASE(away_sequences_are_not_waited_for)
{
	struct ke_model *m = load_model("tiny-dense");
	KT_REQUIRE(m);
	struct kss_sched *s = NULL;
	struct kss_sched_params p = {.model = m, .max_running = 2, .gather_us = 300000};
	KT_OK(kss_sched_create(&p, &s));
	struct ke_seq *q = NULL;
	KT_OK(ke_seq_create(m, NULL, &q));
	int32_t t = 5;
	kss_sched_join(s); /* this thread */
	kss_sched_join(s); /* another sequence that never submits */
	uint64_t t0 = kv_now_ns();
	KT_OK(kss_sched_forward(s, q, &t, 1, NULL));
	double waited = (double)(kv_now_ns() - t0) / 1e6;
	KT_CHECKF(waited >= 250, "the step did not wait for the other joined sequence (%.1f ms)", waited);
	kss_sched_away(s, 1); /* the other one now waits for its client */
	t0 = kv_now_ns();
	KT_OK(kss_sched_forward(s, q, &t, 1, NULL));
	waited = (double)(kv_now_ns() - t0) / 1e6;
	KT_CHECKF(waited < 150, "the step waited %.1f ms for a sequence that is away", waited);
	kss_sched_away(s, 0);
	kss_sched_leave(s);
	kss_sched_leave(s);
	KT_EQ_INT(ke_seq_pos(q), 2);
	ke_seq_destroy(q);
	kss_sched_destroy(s);
	ke_model_destroy(m);
}

/* --- in-flight prefills ---------------------------------------------------------- */

struct waiter {
	struct kss_sched *s;
	const int32_t *tok;
	uint32_t n;
	atomic_int cancel;
	atomic_int done;
	uint32_t waited;
	struct kss_flight *f;
};

static void *wait_main(void *arg)
{
	struct waiter *w = arg;
	uint32_t stops[] = {w->n};
	w->f = kss_sched_flight_begin(w->s, "ns", w->tok, w->n, stops, 1, &w->cancel, &w->waited);
	atomic_store(&w->done, 1);
	return NULL;
}

KT_CASE(flights_wait_for_a_shared_stop)
{
	struct ke_model *m = load_model("tiny-dense");
	KT_REQUIRE(m);
	struct kss_sched *s = NULL;
	struct kss_sched_params p = {.model = m, .max_running = 2};
	KT_OK(kss_sched_create(&p, &s));
	int32_t a[100], b[100];
	for (int i = 0; i < 100; i++)
		a[i] = b[i] = rnd(20, 600);
	b[60] = a[60] + 1; /* b shares a's first 60 tokens */
	uint32_t waited = 0, prov[] = {40, 100};
	struct kss_flight *fa = kss_sched_flight_begin(s, "ns", a, 100, prov, 2, NULL, &waited);
	KT_REQUIRE(fa);
	KT_EQ_INT(waited, 0);
	/* the lookup chose a's real stops: 20, 50 (shared) and 100 */
	uint32_t real[] = {20, 50, 100};
	kss_sched_flight_stops(s, fa, real, 3);
	/* another namespace never waits */
	uint32_t st1[] = {100};
	struct kss_flight *fo = kss_sched_flight_begin(s, "other", b, 100, st1, 1, NULL, &waited);
	KT_EQ_INT(waited, 0);
	kss_sched_flight_end(s, fo);

	struct waiter w = {.s = s, .tok = b, .n = 100};
	pthread_t th;
	pthread_create(&th, NULL, wait_main, &w);
	kv_sleep_ms(100);
	KT_CHECKF(!atomic_load(&w.done), "b did not wait for a's stop at 50");
	KT_CHECK(kss_sched_flight_wanted(s, fa, 50));
	KT_CHECK(!kss_sched_flight_wanted(s, fa, 20));
	kss_sched_flight_at(s, fa, 20);
	kv_sleep_ms(60);
	KT_CHECKF(!atomic_load(&w.done), "b went on at 20, before the stop it shares");
	kss_sched_flight_at(s, fa, 50);
	pthread_join(th, NULL);
	KT_EQ_INT(w.waited, 50);
	struct kss_sched_stats st;
	kss_sched_stats(s, &st);
	KT_EQ_INT((int)st.flight_waits, 1);

	/* a third prompt sharing b's stop 100? no: 100 is not < its n; but a's
	 * 100 is not shared either (it differs at 60): no wait. A cancel ends
	 * a wait that would otherwise last. */
	kss_sched_flight_end(s, w.f);
	struct waiter w2 = {.s = s, .tok = a, .n = 100};
	uint32_t st2[] = {90, 100};
	kss_sched_flight_stops(s, fa, st2, 2);
	pthread_create(&th, NULL, wait_main, &w2);
	kv_sleep_ms(80);
	KT_CHECK(!atomic_load(&w2.done));
	atomic_store(&w2.cancel, 1);
	pthread_join(th, NULL);
	KT_EQ_INT(w2.waited, 90);
	kss_sched_flight_end(s, w2.f);
	kss_sched_flight_end(s, fa);
	kss_sched_destroy(s);
	ke_model_destroy(m);
}

/* --- the request driver through the scheduler -------------------------------- */

#define NREQ 6
#define GEN 5

struct req {
	struct kc_cache *c;
	struct ke_model *m;
	struct kss_sched *s;
	int32_t tok[400];
	uint32_t n, bounds[2];
	int32_t out[GEN];
	float *logits;
	struct kss_run_result r;
	int rc;
};

/* on_every at token GATE of a prefill through the scheduler: hold it until
 * every other request has arrived and waits for its flight (or 20 s), so
 * that the test does not depend on how fast the threads start: on a loaded
 * machine the first request could otherwise pass the shared stop (250)
 * before the last one arrives, and a request that arrives after the stop
 * was passed prefills it itself (sched.h). A second request prefilling the
 * shared prompt holds here too, until the deadline, and the count fails. */
#define GATE 200

static void gate(void *ctx, struct ke_seq *seq, int pos)
{
	struct kss_sched *s = ctx;
	(void)seq;
	if (pos != GATE)
		return;
	for (int i = 0; i < 20000; i++) {
		struct kss_sched_stats st;
		kss_sched_stats(s, &st);
		if (st.flight_waits >= NREQ - 1)
			return;
		usleep(1000);
	}
}

static void *req_main(void *arg)
{
	struct req *q = arg;
	struct kss_run_params p = {.prompt = q->tok, .n = q->n, .bounds = q->bounds, .n_bounds = 2, .max_new = GEN,
				   .out = q->out, .logits = q->logits, .sched = q->s};
	if (q->s) {
		p.every = GATE;
		p.on_every = gate;
		p.every_ctx = q->s;
	}
	q->rc = kss_run(q->c, q->m, &p, &q->r);
	return NULL;
}

static void run_through_the_scheduler(const char *preset)
{
	struct ke_model *m = load_model(preset);
	KT_REQUIRE(m);
	int V = ke_model_config(m)->vocab;
	struct kc_policy pol;
	kc_policy_default(&pol, ke_model_layout(m)->snapshot_bytes > 0);
	struct kc_cache *c1 = NULL, *c2 = NULL;
	struct kc_params cp = {.layout = ke_model_layout(m), .policy = &pol, .ns = {3, 4}};
	KT_OK(kc_cache_create(&cp, &c1));
	KT_OK(kc_cache_create(&cp, &c2));
	struct kss_sched *s = NULL;
	struct kss_sched_params sp = {.model = m, .max_running = NREQ, .chunk = 32};
	KT_OK(kss_sched_create(&sp, &s));
	static struct req seq[NREQ], par[NREQ];
	int32_t sys[300];
	for (int i = 0; i < 300; i++)
		sys[i] = rnd(20, 600);
	for (int i = 0; i < NREQ; i++) {
		struct req *q = &seq[i];
		memset(q, 0, sizeof *q);
		uint32_t ns = 250; /* one shared system prompt */
		memcpy(q->tok, sys, ns * sizeof *sys);
		q->n = ns + (uint32_t)rnd(5, 60);
		for (uint32_t t = ns; t < q->n; t++)
			q->tok[t] = rnd(20, 600);
		q->bounds[0] = ns;
		q->bounds[1] = q->n - 2;
		q->m = m;
		par[i] = *q;
		seq[i].c = c1;
		par[i].c = c2;
		par[i].s = s;
		seq[i].logits = malloc((size_t)V * 4);
		par[i].logits = malloc((size_t)V * 4);
	}
	/* one after another, without a scheduler */
	for (int i = 0; i < NREQ; i++) {
		req_main(&seq[i]);
		KT_OK(seq[i].rc);
	}
	/* all at once through the scheduler, on a cache of their own */
	pthread_t th[NREQ];
	for (int i = 0; i < NREQ; i++)
		pthread_create(&th[i], NULL, req_main, &par[i]);
	for (int i = 0; i < NREQ; i++)
		pthread_join(th[i], NULL);
	int resumed = 0, waited = 0;
	for (int i = 0; i < NREQ; i++) {
		KT_OK(par[i].rc);
		KT_CHECKF(!memcmp(seq[i].out, par[i].out, sizeof seq[i].out), "%s request %d: other tokens", preset, i);
		KT_CHECKF(!memcmp(seq[i].logits, par[i].logits, (size_t)V * 4), "%s request %d: other logits", preset, i);
		resumed += par[i].r.resumed >= 250;
		waited += par[i].r.waited > 0;
		free(seq[i].logits);
		free(par[i].logits);
	}
	/* at most one of them prefilled the shared system prompt */
	KT_CHECKF(resumed >= NREQ - 1, "%s: only %d of %d requests resumed from the shared prompt (%d waited)", preset,
		  resumed, NREQ, waited);
	struct kss_sched_stats st;
	kss_sched_stats(s, &st);
	KT_CHECKF(st.max_batch >= 2, "no step batched two requests (max %d)", st.max_batch);
	kss_sched_destroy(s);
	kc_cache_destroy(c1);
	kc_cache_destroy(c2);
	ke_model_destroy(m);
}

KT_CASE(run_through_the_scheduler_equals_one_at_a_time_dense)
{
	run_through_the_scheduler("tiny-dense");
}

KT_CASE(run_through_the_scheduler_equals_one_at_a_time_hybrid)
{
	run_through_the_scheduler("tiny-hybrid");
}

KT_MAIN(batched_forwards_equal_alone_dense, batched_forwards_equal_alone_hybrid, steps_gather_every_running_sequence,
	away_sequences_are_not_waited_for,
	flights_wait_for_a_shared_stop, run_through_the_scheduler_equals_one_at_a_time_dense,
	run_through_the_scheduler_equals_one_at_a_time_hybrid)
