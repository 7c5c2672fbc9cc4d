/*
 * genjob.c - a generation request object and its stream plumbing (see
 * gen_int.h).
 */
#include "server/gen_int.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/err.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void gen_unref(struct gen *g)
{
	pthread_mutex_lock(&g->mu);
	int left = --g->refs;
	pthread_mutex_unlock(&g->mu);
	if (left)
		return;
	ksv_intake_free(&g->in);
	kv_buf_free(&g->pend);
	kv_buf_free(&g->sse);
	kv_buf_free(&g->gen_ids);
	ksv_answer_free(&g->ans);
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
	free(g);
}

void gen_set_phase(struct gen *g, int phase)
{
	pthread_mutex_lock(&g->mu);
	g->phase = phase;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/*
 * Bytes a stream may hold that its client has not taken. Past this the
 * request's own thread waits for the client (its sequence makes no
 * progress, the engine's scheduler does not wait for it: the others go on)
 * until the client reads, leaves, or the watchdog cuts it at
 * --stall-timeout-s.
 */
#define KSV_STREAM_HIGH_WATER (256u << 10)

/* g->stream is ended by the worker, so it stays valid here after the
 * lock is dropped. */
void gen_emit(struct gen *g)
{
	struct kv_buf *b = &g->sse;
	struct ksv_stream *st = NULL;
	if (!b->len)
		return;
	pthread_mutex_lock(&g->mu);
	if (g->stream) {
		if (ksv_stream_write(g->stream, b->p, b->len))
			atomic_store(&g->job.cancel, 1);
		else
			st = g->stream;
	} else if (!g->gone) {
		kv_buf_add(&g->pend, b->p, b->len);
	}
	pthread_mutex_unlock(&g->mu);
	kv_buf_reset(b);
	if (st && ksv_stream_pending(st) > KSV_STREAM_HIGH_WATER) {
		kss_service_away(g->s->svc, 1);
		int rc;
		while ((rc = ksv_stream_wait_room(st, KSV_STREAM_HIGH_WATER / 2, 100)) == KV_ERR_TIMEOUT &&
		       !atomic_load(&g->job.cancel))
			;
		if (rc == KV_ERR_CANCELLED)
			atomic_store(&g->job.cancel, 1);
		kss_service_away(g->s->svc, 0);
	}
}

int gen_wait_phase(struct gen *g, int phase, struct ksv_conn *c)
{
	struct timespec ts;
	pthread_mutex_lock(&g->mu);
	while (g->phase < phase) {
		if (ksv_queue_state(g->s->queue, &g->job) == KSV_JOB_CANCELLED) {
			pthread_mutex_unlock(&g->mu);
			return 2;
		}
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += 50 * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&g->cv, &g->mu, &ts);
		if (g->phase >= phase)
			break;
		pthread_mutex_unlock(&g->mu);
		int gone = ksv_conn_gone(c);
		pthread_mutex_lock(&g->mu);
		if (gone) {
			g->gone = 1;
			pthread_mutex_unlock(&g->mu);
			return 1;
		}
	}
	pthread_mutex_unlock(&g->mu);
	return 0;
}
