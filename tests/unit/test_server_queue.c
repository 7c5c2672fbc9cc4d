/*
 * test_server_queue.c - src/server/queue: FIFO order, the queue bound (an
 * idle worker does not count as waiting), cancelling a queued job (it
 * never runs) and a running one (its flag is set and it stops), close and
 * destroy with jobs in flight, the done callback that may free its job;
 * and src/server/options: defaults and range checks.
 */
#include "kt.h"
#include "base/clock.h"
#include "base/err.h"
#include "server/options.h"
#include "server/queue.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct tjob {
	struct ksv_job job;
	int id;
	int block_ms;          /* run waits this long, or until cancelled */
	atomic_int ran, saw_cancel, done_calls;
	int *order;            /* shared log of run order */
	atomic_int *n_order;
};

static void tjob_run(struct ksv_job *j)
{
	struct tjob *t = (struct tjob *)j;
	atomic_store(&t->ran, 1);
	if (t->order)
		t->order[atomic_fetch_add(t->n_order, 1)] = t->id;
	for (int i = 0; i < t->block_ms; i++) {
		if (atomic_load(&j->cancel)) {
			atomic_store(&t->saw_cancel, 1);
			return;
		}
		kv_sleep_ms(1);
	}
}

static void tjob_done(struct ksv_job *j)
{
	atomic_fetch_add(&((struct tjob *)j)->done_calls, 1);
}

static void init(struct tjob *t, int id, int block_ms, int *order, atomic_int *n_order)
{
	memset(t, 0, sizeof *t);
	t->job.run = tjob_run;
	t->job.done = tjob_done;
	t->id = id;
	t->block_ms = block_ms;
	t->order = order;
	t->n_order = n_order;
}

/* Wait until the scheduler runs `n` jobs (bounded). */
static int wait_running(struct ksv_queue *s, int n)
{
	for (int i = 0; i < 2000; i++) {
		if (ksv_queue_running(s) == n)
			return 1;
		kv_sleep_ms(1);
	}
	return 0;
}

KT_CASE(fifo_order_and_done)
{
	struct ksv_queue *s = ksv_queue_create(1, 16);
	KT_REQUIRE(s);
	struct tjob j[8];
	int order[8];
	atomic_int n = 0;
	for (int i = 0; i < 8; i++) {
		init(&j[i], i, i == 0 ? 50 : 0, order, &n);
		KT_OK(ksv_queue_submit(s, &j[i].job));
	}
	for (int i = 0; i < 8; i++)
		KT_EQ_INT(ksv_queue_wait(s, &j[i].job), KSV_JOB_DONE);
	KT_EQ_INT(atomic_load(&n), 8);
	for (int i = 0; i < 8; i++) {
		KT_EQ_INT(order[i], i);
		/* done runs after the state became DONE, once */
		for (int k = 0; k < 100 && !atomic_load(&j[i].done_calls); k++)
			kv_sleep_ms(1);
		KT_EQ_INT(atomic_load(&j[i].done_calls), 1);
	}
	ksv_queue_destroy(s);
}

KT_CASE(queue_bound_counts_waiting_only)
{
	struct ksv_queue *s = ksv_queue_create(1, 1);
	KT_REQUIRE(s);
	struct tjob a, b, c;
	init(&a, 1, 3000, NULL, NULL);
	init(&b, 2, 0, NULL, NULL);
	init(&c, 3, 0, NULL, NULL);
	KT_OK(ksv_queue_submit(s, &a.job)); /* taken by the idle worker */
	KT_REQUIRE(wait_running(s, 1));
	KT_OK(ksv_queue_submit(s, &b.job)); /* waits: the one allowed */
	KT_EQ_INT(ksv_queue_queued(s), 1);
	KT_EQ_INT(ksv_queue_submit(s, &c.job), KV_ERR_FULL);
	ksv_queue_cancel(s, &a.job);
	KT_EQ_INT(ksv_queue_wait(s, &b.job), KSV_JOB_DONE);
	ksv_queue_destroy(s);

	/* max_queue 0: a request runs when the worker is free, else is refused */
	s = ksv_queue_create(1, 0);
	init(&a, 1, 3000, NULL, NULL);
	init(&b, 2, 0, NULL, NULL);
	KT_OK(ksv_queue_submit(s, &a.job));
	KT_REQUIRE(wait_running(s, 1));
	KT_EQ_INT(ksv_queue_submit(s, &b.job), KV_ERR_FULL);
	ksv_queue_cancel(s, &a.job);
	KT_EQ_INT(ksv_queue_wait(s, &a.job), KSV_JOB_DONE);
	KT_OK(ksv_queue_submit(s, &b.job));
	KT_EQ_INT(ksv_queue_wait(s, &b.job), KSV_JOB_DONE);
	ksv_queue_destroy(s);
}

KT_CASE(cancel_queued_and_running)
{
	struct ksv_queue *s = ksv_queue_create(1, 8);
	KT_REQUIRE(s);
	struct tjob a, b, c;
	init(&a, 1, 5000, NULL, NULL);
	init(&b, 2, 0, NULL, NULL);
	init(&c, 3, 0, NULL, NULL);
	KT_OK(ksv_queue_submit(s, &a.job));
	KT_REQUIRE(wait_running(s, 1));
	KT_OK(ksv_queue_submit(s, &b.job));
	KT_OK(ksv_queue_submit(s, &c.job));
	/* a queued job is removed and never runs */
	KT_EQ_INT(ksv_queue_cancel(s, &b.job), 1);
	KT_EQ_INT(ksv_queue_state(s, &b.job), KSV_JOB_CANCELLED);
	KT_EQ_INT(ksv_queue_queued(s), 1);
	/* a running job gets its flag and stops soon */
	uint64_t t0 = kv_now_ns();
	KT_EQ_INT(ksv_queue_cancel(s, &a.job), 0);
	KT_EQ_INT(ksv_queue_wait(s, &a.job), KSV_JOB_DONE);
	KT_CHECK((kv_now_ns() - t0) / 1000000 < 1000);
	KT_EQ_INT(atomic_load(&a.saw_cancel), 1);
	KT_EQ_INT(ksv_queue_wait(s, &c.job), KSV_JOB_DONE);
	KT_EQ_INT(atomic_load(&b.ran), 0);
	KT_EQ_INT(atomic_load(&b.done_calls), 0);
	KT_EQ_INT(atomic_load(&c.ran), 1);
	/* cancelling a finished job changes nothing */
	KT_EQ_INT(ksv_queue_cancel(s, &c.job), 0);
	KT_EQ_INT(ksv_queue_state(s, &c.job), KSV_JOB_DONE);
	/* a timed wait returns the current state */
	struct tjob d;
	init(&d, 4, 300, NULL, NULL);
	KT_OK(ksv_queue_submit(s, &d.job));
	int st = ksv_queue_wait_ms(s, &d.job, 20);
	KT_CHECK(st == KSV_JOB_QUEUED || st == KSV_JOB_RUNNING);
	KT_EQ_INT(ksv_queue_wait(s, &d.job), KSV_JOB_DONE);
	ksv_queue_destroy(s);
}

KT_CASE(close_and_destroy_in_flight)
{
	struct ksv_queue *s = ksv_queue_create(1, 8);
	KT_REQUIRE(s);
	struct tjob a, b;
	init(&a, 1, 5000, NULL, NULL);
	init(&b, 2, 0, NULL, NULL);
	KT_OK(ksv_queue_submit(s, &a.job));
	KT_REQUIRE(wait_running(s, 1));
	KT_OK(ksv_queue_submit(s, &b.job));
	uint64_t t0 = kv_now_ns();
	ksv_queue_close(s, 1);
	KT_EQ_INT(ksv_queue_state(s, &b.job), KSV_JOB_CANCELLED);
	KT_EQ_INT(ksv_queue_submit(s, &b.job), KV_ERR_CANCELLED);
	KT_EQ_INT(ksv_queue_wait(s, &a.job), KSV_JOB_DONE);
	KT_EQ_INT(atomic_load(&a.saw_cancel), 1);
	KT_CHECK((kv_now_ns() - t0) / 1000000 < 1000);
	ksv_queue_destroy(s);
	/* destroy alone cancels too */
	s = ksv_queue_create(2, 8);
	init(&a, 1, 5000, NULL, NULL);
	KT_OK(ksv_queue_submit(s, &a.job));
	KT_REQUIRE(wait_running(s, 1));
	t0 = kv_now_ns();
	ksv_queue_destroy(s);
	KT_EQ_INT(atomic_load(&a.saw_cancel), 1);
	KT_CHECK((kv_now_ns() - t0) / 1000000 < 1000);
}

/* done() may free the job: the scheduler never touches it afterwards. */
static void free_done(struct ksv_job *j)
{
	free(j);
}

static void noop_run(struct ksv_job *j)
{
	(void)j;
}

KT_CASE(done_may_free_the_job)
{
	struct ksv_queue *s = ksv_queue_create(1, 64);
	KT_REQUIRE(s);
	for (int i = 0; i < 50; i++) {
		struct ksv_job *j = calloc(1, sizeof *j);
		j->run = noop_run;
		j->done = free_done;
		KT_OK(ksv_queue_submit(s, j));
	}
	for (int i = 0; i < 1000 && (ksv_queue_queued(s) || ksv_queue_running(s)); i++)
		kv_sleep_ms(1);
	KT_EQ_INT(ksv_queue_queued(s), 0);
	ksv_queue_destroy(s);
}

KT_CASE(options_defaults_and_checks)
{
	struct ksv_opts o;
	ksv_opts_default(&o);
	KT_EQ_STR(o.host, "127.0.0.1");
	KT_EQ_INT(o.port, 8000);
	KT_EQ_INT(o.prefix_cache, 1);
	KT_EQ_STR(o.prefix_cache_index, "radix");
	KT_EQ_INT(o.hybrid_cache_entries, -1);
	KT_EQ_INT(o.kv_disk_checkpoint_interval, 0);
	KT_EQ_INT(ksv_opts_check(&o), KV_ERR_INVALID); /* no model */
	o.model_dir = "m";
	KT_OK(ksv_opts_check(&o));
	o.prefix_cache_index = "btree";
	KT_EQ_INT(ksv_opts_check(&o), KV_ERR_INVALID);
	KT_CHECK(strstr(kv_errmsg(), "--prefix-cache-index") != NULL);
	o.prefix_cache_index = "hash";
	KT_OK(ksv_opts_check(&o));
	o.cache_memory_percent = 1.5;
	KT_EQ_INT(ksv_opts_check(&o), KV_ERR_INVALID);
	o.cache_memory_percent = 0.5;
	o.port = 70000;
	KT_EQ_INT(ksv_opts_check(&o), KV_ERR_INVALID);
	o.port = 0;
	o.kv_dtype = "fp8";
	KT_EQ_INT(ksv_opts_check(&o), KV_ERR_INVALID);
	o.kv_dtype = "f32";
	o.prefix_cache_size = 0;
	KT_EQ_INT(ksv_opts_check(&o), KV_ERR_INVALID);
	o.prefix_cache_size = 100;
	o.memory_cap_mb = 0;
	KT_EQ_INT(ksv_opts_check(&o), KV_ERR_INVALID);
	o.memory_cap_mb = 4096;
	o.header_timeout_ms = 5;
	KT_EQ_INT(ksv_opts_check(&o), KV_ERR_INVALID);
	o.header_timeout_ms = 1000;
	KT_OK(ksv_opts_check(&o));
	/* the remote tier's flags (docs/cluster.md) */
	KT_EQ_INT(o.remote_cache_timeout_ms, 200);
	KT_EQ_STR(o.remote_cache_prefix, "kvkeep:");
	o.remote_cache = "http://h:1";
	KT_EQ_INT(ksv_opts_check(&o), KV_ERR_INVALID);
	KT_CHECK(strstr(kv_errmsg(), "--remote-cache") != NULL);
	o.remote_cache = "redis://10.0.0.5:7000,10.0.0.6:7000";
	KT_OK(ksv_opts_check(&o));
	o.remote_cache_timeout_ms = 0;
	KT_EQ_INT(ksv_opts_check(&o), KV_ERR_INVALID);
	o.remote_cache_timeout_ms = 200;
	o.remote_cache_to_disk = "maybe";
	KT_EQ_INT(ksv_opts_check(&o), KV_ERR_INVALID);
	o.remote_cache_to_disk = "off";
	KT_OK(ksv_opts_check(&o));
	o.remote_cache = NULL;
	o.remote_cache_password_file = "/run/secrets/redis";
	KT_EQ_INT(ksv_opts_check(&o), KV_ERR_INVALID); /* a password file without a URL */
}

KT_MAIN(fifo_order_and_done, queue_bound_counts_waiting_only, cancel_queued_and_running, close_and_destroy_in_flight,
	done_may_free_the_job, options_defaults_and_checks)
