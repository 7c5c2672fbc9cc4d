/*
 * queue.c - see queue.h.
 *
 * One mutex and two condition variables: `work` wakes workers when a job
 * is queued or the scheduler closes, `done` wakes waiters when a job
 * changes to DONE or CANCELLED. The queue is a singly linked FIFO.
 */
#include "server/queue.h"
#include "base/clock.h"
#include "base/err.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct ksv_queue {
	pthread_mutex_t mu;
	pthread_cond_t work, done;
	struct ksv_job *head, *tail;
	int n_queued, n_running, max_queue;
	int closed, stop;
	int n_workers;
	pthread_t *workers;
	struct ksv_job **cur;     /* job each worker runs now, or NULL */
};

struct worker_arg {
	struct ksv_queue *s;
	int idx;
};

static void *worker_main(void *arg)
{
	struct worker_arg wa = *(struct worker_arg *)arg;
	struct ksv_queue *s = wa.s;
	free(arg);
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->head && !s->stop)
			pthread_cond_wait(&s->work, &s->mu);
		if (!s->head && s->stop)
			break;
		struct ksv_job *j = s->head;
		s->head = j->next;
		if (!s->head)
			s->tail = NULL;
		j->next = NULL;
		s->n_queued--;
		s->n_running++;
		j->state = KSV_JOB_RUNNING;
		j->t_start_ns = kv_now_ns();
		s->cur[wa.idx] = j;
		pthread_mutex_unlock(&s->mu);
		j->run(j);
		pthread_mutex_lock(&s->mu);
		s->cur[wa.idx] = NULL;
		s->n_running--;
		j->state = KSV_JOB_DONE;
		pthread_cond_broadcast(&s->done);
		if (j->done) {
			void (*done)(struct ksv_job *) = j->done;
			pthread_mutex_unlock(&s->mu);
			done(j); /* may free j */
			pthread_mutex_lock(&s->mu);
		}
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

struct ksv_queue *ksv_queue_create(int n_workers, int max_queue)
{
	struct ksv_queue *s = calloc(1, sizeof *s);
	if (!s) {
		kv_fail(KV_ERR_NOMEM, "sched: out of memory");
		return NULL;
	}
	if (n_workers < 1)
		n_workers = 1;
	s->max_queue = max_queue < 0 ? 0 : max_queue;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->work, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->done, &ca);
	pthread_condattr_destroy(&ca);
	s->workers = calloc((size_t)n_workers, sizeof *s->workers);
	s->cur = calloc((size_t)n_workers, sizeof *s->cur);
	if (!s->workers || !s->cur)
		goto fail;
	for (int i = 0; i < n_workers; i++) {
		struct worker_arg *wa = malloc(sizeof *wa);
		if (!wa)
			goto fail_threads;
		wa->s = s;
		wa->idx = i;
		if (pthread_create(&s->workers[i], NULL, worker_main, wa)) {
			free(wa);
			goto fail_threads;
		}
		s->n_workers++;
	}
	return s;
fail_threads:
	pthread_mutex_lock(&s->mu);
	s->stop = 1;
	pthread_cond_broadcast(&s->work);
	pthread_mutex_unlock(&s->mu);
	for (int i = 0; i < s->n_workers; i++)
		pthread_join(s->workers[i], NULL);
fail:
	free(s->workers);
	free(s->cur);
	free(s);
	kv_fail(KV_ERR_NOMEM, "sched: cannot start worker threads");
	return NULL;
}

static void cancel_queued_locked(struct ksv_queue *s)
{
	struct ksv_job *j = s->head;
	while (j) {
		struct ksv_job *n = j->next;
		j->next = NULL;
		atomic_store(&j->cancel, 1);
		j->state = KSV_JOB_CANCELLED;
		j = n;
	}
	s->head = s->tail = NULL;
	s->n_queued = 0;
	pthread_cond_broadcast(&s->done);
}

void ksv_queue_close(struct ksv_queue *s, int cancel_running)
{
	pthread_mutex_lock(&s->mu);
	s->closed = 1;
	cancel_queued_locked(s);
	if (cancel_running)
		for (int i = 0; i < s->n_workers; i++)
			if (s->cur[i])
				atomic_store(&s->cur[i]->cancel, 1);
	pthread_mutex_unlock(&s->mu);
}

void ksv_queue_destroy(struct ksv_queue *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->closed = 1;
	cancel_queued_locked(s);
	for (int i = 0; i < s->n_workers; i++)
		if (s->cur[i])
			atomic_store(&s->cur[i]->cancel, 1);
	s->stop = 1;
	pthread_cond_broadcast(&s->work);
	pthread_mutex_unlock(&s->mu);
	for (int i = 0; i < s->n_workers; i++)
		pthread_join(s->workers[i], NULL);
	pthread_cond_destroy(&s->work);
	pthread_cond_destroy(&s->done);
	pthread_mutex_destroy(&s->mu);
	free(s->workers);
	free(s->cur);
	free(s);
}

int ksv_queue_submit(struct ksv_queue *s, struct ksv_job *job)
{
	int rc = KV_OK;
	pthread_mutex_lock(&s->mu);
	if (s->closed) {
		rc = kv_fail(KV_ERR_CANCELLED, "server is shutting down");
	} else if (s->n_queued >= s->max_queue + (s->n_workers - s->n_running)) {
		/* idle workers take jobs at once: they do not count as waiting */
		rc = kv_fail(KV_ERR_FULL, "request queue is full (%d waiting)", s->n_queued);
	} else {
		atomic_store(&job->cancel, 0);
		job->state = KSV_JOB_QUEUED;
		job->t_submit_ns = kv_now_ns();
		job->t_start_ns = 0;
		job->next = NULL;
		if (s->tail)
			s->tail->next = job;
		else
			s->head = job;
		s->tail = job;
		s->n_queued++;
		pthread_cond_signal(&s->work);
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

int ksv_queue_cancel(struct ksv_queue *s, struct ksv_job *job)
{
	int removed = 0;
	pthread_mutex_lock(&s->mu);
	atomic_store(&job->cancel, 1);
	if (job->state == KSV_JOB_QUEUED) {
		struct ksv_job **pp = &s->head, *prev = NULL;
		while (*pp && *pp != job) {
			prev = *pp;
			pp = &(*pp)->next;
		}
		if (*pp) {
			*pp = job->next;
			if (s->tail == job)
				s->tail = prev;
			job->next = NULL;
			s->n_queued--;
		}
		job->state = KSV_JOB_CANCELLED;
		removed = 1;
		pthread_cond_broadcast(&s->done);
	}
	pthread_mutex_unlock(&s->mu);
	return removed;
}

int ksv_queue_wait_ms(struct ksv_queue *s, struct ksv_job *job, int ms)
{
	struct timespec ts;
	int st;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	if (ms >= 0) {
		ts.tv_sec += ms / 1000;
		ts.tv_nsec += (long)(ms % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
	}
	pthread_mutex_lock(&s->mu);
	while (job->state != KSV_JOB_DONE && job->state != KSV_JOB_CANCELLED && job->state != KSV_JOB_NEW) {
		if (ms < 0) {
			pthread_cond_wait(&s->done, &s->mu);
		} else if (pthread_cond_timedwait(&s->done, &s->mu, &ts) == ETIMEDOUT) {
			break;
		}
	}
	st = job->state;
	pthread_mutex_unlock(&s->mu);
	return st;
}

int ksv_queue_wait(struct ksv_queue *s, struct ksv_job *job)
{
	return ksv_queue_wait_ms(s, job, -1);
}

int ksv_queue_state(struct ksv_queue *s, struct ksv_job *job)
{
	pthread_mutex_lock(&s->mu);
	int st = job->state;
	pthread_mutex_unlock(&s->mu);
	return st;
}

int ksv_queue_queued(struct ksv_queue *s)
{
	pthread_mutex_lock(&s->mu);
	int n = s->n_queued;
	pthread_mutex_unlock(&s->mu);
	return n;
}

int ksv_queue_running(struct ksv_queue *s)
{
	pthread_mutex_lock(&s->mu);
	int n = s->n_running;
	pthread_mutex_unlock(&s->mu);
	return n;
}
