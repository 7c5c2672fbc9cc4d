/*
 * rwrite.c - the store's remote writer (store_int.h): the write-behind of
 * the remote tier (remote.h).
 *
 * The disk writer takes each dirty object of the RAM cache as a view,
 * writes it to disk and hands the view on (ks_rwrite_offer): the view's
 * references keep its pages and snapshot alive until this thread has sent
 * them, so nothing is copied and the disk writer never waits for the
 * network. The queue is bounded in bytes (--remote-cache-queue-mb); a view
 * that does not fit, or that arrives while the tier is down or the store
 * is stopping, is released at once and counted as dropped (a miss later
 * for that part, never a wrong answer).
 *
 * A view becomes the same objects as on disk (ks_view_objs, the one list
 * of kinds). An entry manifest is put only when every object it names
 * answers EXISTS (ks_entry_needs): the manifest is last, so a reader that
 * finds it finds its parts, unless Redis evicted or lost them since (a
 * miss for that part). Views come in dependency order (cache.h
 * kc_cache_take_dirty), so the parts were put just before.
 */
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "store/remote.h"
#include "store/store_int.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t view_bytes(const struct ks_store *s, const struct kc_view *v, size_t *objs)
{
	struct ks_obj_src o[KS_VIEW_OBJS];
	size_t n = ks_view_objs(s, v, o);
	uint64_t b = 0;
	for (size_t i = 0; i < n; i++)
		b += ks_obj_data_bytes(&s->L, o[i].kind, o[i].n_tokens, o[i].n_ckpt);
	*objs = n;
	return b;
}

static void drop_view(struct ks_store *s, struct kc_view *v, int why)
{
	size_t objs;
	view_bytes(s, v, &objs);
	ks_remote_note_drop(s->p.remote, why, objs);
	kc_cache_view_release(s->p.cache, v);
}

void ks_rwrite_offer(struct ks_store *s, struct kc_view *v)
{
	struct ks_remote *r = s->p.remote;
	size_t objs;
	uint64_t b = view_bytes(s, v, &objs);
	struct ks_rjob *j = NULL;
	int why = -1;
	pthread_mutex_lock(&s->mu);
	if (s->r_halt || s->r_stop)
		why = KS_RDROP_SHUTDOWN;
	else if (!ks_remote_up(r))
		why = KS_RDROP_DOWN;
	else if (s->rq_len && s->rq_bytes + b > ks_remote_queue_cap(r))
		why = KS_RDROP_QUEUE;
	else if (!(j = malloc(sizeof *j)))
		why = KS_RDROP_QUEUE;
	if (why < 0) {
		j->v = *v; /* the references move with the struct */
		j->bytes = b;
		j->next = NULL;
		if (s->rq_tail)
			s->rq_tail->next = j;
		else
			s->rq_head = j;
		s->rq_tail = j;
		s->rq_len++;
		s->rq_bytes += b;
		pthread_cond_signal(&s->rcv);
	}
	pthread_mutex_unlock(&s->mu);
	if (why >= 0) {
		ks_remote_note_drop(r, why, objs);
		kc_cache_view_release(s->p.cache, v);
	} else {
		ks_remote_note_queue(r, 1, (int64_t)b);
	}
	memset(v, 0, sizeof *v);
}

/* Send one view's objects. KV_OK, or the error that stopped it. */
static int write_view(struct ks_store *s, const struct kc_view *v, size_t *left)
{
	struct ks_remote *r = s->p.remote;
	struct ks_obj_src o[KS_VIEW_OBJS];
	size_t n = ks_view_objs(s, v, o);
	int rc = KV_OK;
	*left = 0;
	for (size_t i = 0; i < n; i++) {
		int sent;
		if (o[i].kind == KS_ENTRY) {
			struct ks_need *nd;
			size_t k;
			if ((rc = ks_entry_needs(s, v->tokens, v->n_tokens, v->ckpt, v->n_ckpt, &nd, &k))) {
				*left = n - i;
				return rc;
			}
			int *kinds = malloc((k ? k : 1) * sizeof *kinds);
			struct kv_h128 *ids = malloc((k ? k : 1) * sizeof *ids);
			uint8_t *have = malloc(k ? k : 1);
			int complete = kinds && ids && have;
			for (size_t q = 0; complete && q < k; q++) {
				kinds[q] = nd[q].kind;
				ids[q] = nd[q].id;
			}
			if (complete && (rc = ks_remote_have(r, s->p.ns, kinds, ids, k, 1, have)))
				complete = 0;
			for (size_t q = 0; complete && q < k; q++)
				complete = have[q];
			free(nd);
			free(kinds);
			free(ids);
			free(have);
			if (rc) {
				*left = n - i;
				return rc;
			}
			if (!complete) {
				ks_remote_note_incomplete(r);
				continue;
			}
		}
		if ((rc = ks_remote_put(r, &s->L, &o[i], &sent))) {
			*left = n - i;
			return rc;
		}
	}
	return KV_OK;
}

static struct ks_rjob *pop(struct ks_store *s)
{
	struct ks_rjob *j = s->rq_head;
	if (j) {
		s->rq_head = j->next;
		if (!s->rq_head)
			s->rq_tail = NULL;
		s->rq_len--;
		s->rq_bytes -= j->bytes;
	}
	return j;
}

/* Write (or, with the tier down or the store stopping, drop) one job. */
static void run_job(struct ks_store *s, struct ks_rjob *j)
{
	struct ks_remote *r = s->p.remote;
	ks_remote_note_queue(r, -1, -(int64_t)j->bytes);
	pthread_mutex_lock(&s->mu);
	int stopping = s->r_halt || s->r_stop;
	pthread_mutex_unlock(&s->mu);
	if (stopping) {
		drop_view(s, &j->v, KS_RDROP_SHUTDOWN);
	} else if (!ks_remote_up(r)) {
		drop_view(s, &j->v, KS_RDROP_DOWN);
	} else {
		size_t left = 0;
		int rc = write_view(s, &j->v, &left);
		if (rc)
			ks_remote_note_drop(r, ks_remote_up(r) ? KS_RDROP_ERROR : KS_RDROP_DOWN, left);
		kc_cache_view_release(s->p.cache, &j->v);
	}
	free(j);
}

static void *rwriter_main(void *arg)
{
	struct ks_store *s = arg;
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->rq_head && !s->r_stop)
			pthread_cond_wait(&s->rcv, &s->mu);
		struct ks_rjob *j = pop(s);
		if (!j)
			break; /* stopping with an empty queue */
		s->r_busy = 1;
		pthread_mutex_unlock(&s->mu);
		run_job(s, j);
		pthread_mutex_lock(&s->mu);
		s->r_busy = 0;
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

int ks_rwrite_start(struct ks_store *s)
{
	pthread_cond_init(&s->rcv, NULL);
	s->r_inited = 1;
	if (s->p.no_threads)
		return KV_OK;
	s->r_running = 1;
	if (pthread_create(&s->rwriter, NULL, rwriter_main, s)) {
		s->r_running = 0;
		return kv_fail(KV_ERR_NOMEM, "remote cache: cannot start the writer thread");
	}
	return KV_OK;
}

/* Release every queued view as dropped (caller holds nothing). */
static void drop_queue(struct ks_store *s)
{
	for (;;) {
		pthread_mutex_lock(&s->mu);
		struct ks_rjob *j = pop(s);
		pthread_mutex_unlock(&s->mu);
		if (!j)
			break;
		ks_remote_note_queue(s->p.remote, -1, -(int64_t)j->bytes);
		drop_view(s, &j->v, KS_RDROP_SHUTDOWN);
		free(j);
	}
}

void ks_rwrite_halt(struct ks_store *s)
{
	if (!s->p.remote || !s->r_inited)
		return;
	pthread_mutex_lock(&s->mu);
	s->r_halt = 1;
	uint32_t n = s->rq_len;
	pthread_mutex_unlock(&s->mu);
	drop_queue(s);
	if (n)
		KV_INFO("remote.flush", "dropped_views=%u msg=\"remote writes pending at shutdown are dropped, never waited "
					"for\"",
			n);
}

void ks_rwrite_stop(struct ks_store *s)
{
	if (!s->p.remote || !s->r_inited)
		return;
	pthread_mutex_lock(&s->mu);
	s->r_stop = 1;
	pthread_cond_broadcast(&s->rcv);
	pthread_mutex_unlock(&s->mu);
	drop_queue(s); /* the thread then finds it empty and leaves */
	if (s->r_running)
		pthread_join(s->rwriter, NULL);
	s->r_running = 0;
	drop_queue(s);
	pthread_cond_destroy(&s->rcv);
	s->r_inited = 0;
}

size_t ks_rwrite_drain(struct ks_store *s)
{
	size_t n = 0;
	if (!s->p.remote || !s->r_inited)
		return 0;
	for (;;) {
		pthread_mutex_lock(&s->mu);
		struct ks_rjob *j = pop(s);
		pthread_mutex_unlock(&s->mu);
		if (!j)
			break;
		run_job(s, j);
		n++;
	}
	return n;
}
