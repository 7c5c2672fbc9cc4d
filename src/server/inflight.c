/*
 * inflight.c - see inflight.h.
 */
#include "server/inflight.h"
#include "base/clock.h"
#include "base/err.h"

#include <pthread.h>
#include <stdlib.h>

struct ksv_inflight {
	pthread_mutex_t mu;
	struct ksv_inflight_rec *head, *tail; /* oldest first */
};

int ksv_inflight_create(struct ksv_inflight **out)
{
	struct ksv_inflight *r = calloc(1, sizeof *r);
	if (!r)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	pthread_mutex_init(&r->mu, NULL);
	*out = r;
	return KV_OK;
}

void ksv_inflight_destroy(struct ksv_inflight *r)
{
	if (!r)
		return;
	pthread_mutex_destroy(&r->mu);
	free(r);
}

void ksv_inflight_add(struct ksv_inflight *r, struct ksv_inflight_rec *rec)
{
	pthread_mutex_lock(&r->mu);
	rec->next = NULL;
	rec->prev = r->tail;
	if (r->tail)
		r->tail->next = rec;
	else
		r->head = rec;
	r->tail = rec;
	pthread_mutex_unlock(&r->mu);
}

void ksv_inflight_remove(struct ksv_inflight *r, struct ksv_inflight_rec *rec)
{
	pthread_mutex_lock(&r->mu);
	if (rec->prev)
		rec->prev->next = rec->next;
	else if (r->head == rec)
		r->head = rec->next;
	if (rec->next)
		rec->next->prev = rec->prev;
	else if (r->tail == rec)
		r->tail = rec->prev;
	rec->prev = rec->next = NULL;
	pthread_mutex_unlock(&r->mu);
}

static const char *phase_name(int p)
{
	return p == KSV_IF_PREFILL ? "prefill" : p == KSV_IF_DECODE ? "decode" : "waiting";
}

json_t *ksv_inflight_json(struct ksv_inflight *r)
{
	json_t *a = json_array();
	uint64_t now = kv_now_ns();
	pthread_mutex_lock(&r->mu);
	for (struct ksv_inflight_rec *q = r->head; q; q = q->next) {
		int ph = atomic_load_explicit(&q->phase, memory_order_relaxed);
		unsigned np = atomic_load_explicit(&q->prompt_tokens, memory_order_relaxed);
		unsigned nc = atomic_load_explicit(&q->cached_tokens, memory_order_relaxed);
		unsigned done = atomic_load_explicit(&q->processed, memory_order_relaxed);
		unsigned gen = atomic_load_explicit(&q->gen_tokens, memory_order_relaxed);
		uint64_t tp = atomic_load_explicit(&q->t_prefill_ns, memory_order_relaxed);
		uint64_t tf = atomic_load_explicit(&q->t_first_ns, memory_order_relaxed);
		/* this request's own rates: prompt tokens computed per second of
		 * its prefill so far, tokens generated per second since its first */
		double pre_s = tp ? (double)((tf ? tf : now) - tp) / 1e9 : 0;
		double dec_s = tf ? (double)(now - tf) / 1e9 : 0;
		double pre_rate = pre_s > 0 && done > nc ? (double)(done - nc) / pre_s : 0;
		double dec_rate = dec_s > 0 && gen > 1 ? (double)(gen - 1) / dec_s : 0;
		json_array_append_new(a, json_pack("{s:s, s:I, s:s, s:I, s:I, s:I, s:I, s:f, s:f, s:f}", "route", q->route,
						   "t_ms", (json_int_t)q->t_arrive_ms, "phase", phase_name(ph),
						   "prompt_tokens", (json_int_t)np, "cached_tokens", (json_int_t)nc,
						   "processed", (json_int_t)done, "gen_tokens", (json_int_t)gen, "elapsed_ms",
						   (double)(now - q->t_start_ns) / 1e6, "prefill_tok_s", pre_rate,
						   "decode_tok_s", dec_rate));
	}
	pthread_mutex_unlock(&r->mu);
	return a;
}
