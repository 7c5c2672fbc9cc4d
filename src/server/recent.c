/*
 * recent.c - see recent.h.
 */
#include "server/recent.h"
#include "base/err.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct ksv_recent {
	pthread_mutex_t mu;
	struct ksv_recent_req ring[KSV_RECENT_MAX];
	uint64_t n;                 /* records ever added */
	uint64_t prompt_tokens, cached_tokens, prefill_tokens, gen_tokens, requests;
	double prefill_ms, decode_ms;
};

int ksv_recent_create(struct ksv_recent **out)
{
	struct ksv_recent *r = calloc(1, sizeof *r);
	if (!r)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	pthread_mutex_init(&r->mu, NULL);
	*out = r;
	return KV_OK;
}

void ksv_recent_destroy(struct ksv_recent *r)
{
	if (!r)
		return;
	for (int i = 0; i < KSV_RECENT_MAX; i++)
		json_decref(r->ring[i].miss);
	pthread_mutex_destroy(&r->mu);
	free(r);
}

void ksv_recent_add(struct ksv_recent *r, const struct ksv_recent_req *q)
{
	pthread_mutex_lock(&r->mu);
	struct ksv_recent_req *slot = &r->ring[r->n % KSV_RECENT_MAX];
	json_decref(slot->miss);
	*slot = *q;
	r->n++;
	r->requests++;
	r->prompt_tokens += q->prompt_tokens;
	r->cached_tokens += q->cached_ram + q->cached_disk + q->cached_remote;
	r->prefill_tokens += q->prompt_tokens - q->cached_ram - q->cached_disk - q->cached_remote;
	r->gen_tokens += q->gen_tokens;
	r->prefill_ms += q->prefill_ms;
	r->decode_ms += q->decode_ms;
	pthread_mutex_unlock(&r->mu);
}

/* A miss explanation without its text (a new object). */
static json_t *numbers_only(json_t *miss)
{
	json_t *j = json_deep_copy(miss);
	if (j) {
		json_object_set_new(j, "new", json_null());
		json_object_set_new(j, "cached", json_null());
	}
	return j;
}

void ksv_recent_json(struct ksv_recent *r, json_t *obj, int text_default, int text_salted)
{
	json_t *reqs = json_array(), *c = json_object();
	pthread_mutex_lock(&r->mu);
	uint64_t first = r->n > KSV_RECENT_MAX ? r->n - KSV_RECENT_MAX : 0;
	for (uint64_t i = first; i < r->n; i++) {
		const struct ksv_recent_req *q = &r->ring[i % KSV_RECENT_MAX];
		json_t *j = json_pack("{s:I, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f}", "t_ms",
				      (json_int_t)q->t_ms, "route", q->route, "resume", q->resume, "prompt_tokens",
				      (json_int_t)q->prompt_tokens, "cached_ram", (json_int_t)q->cached_ram, "cached_disk",
				      (json_int_t)q->cached_disk, "cached_remote", (json_int_t)q->cached_remote, "computed",
				      (json_int_t)(q->prompt_tokens - q->cached_ram - q->cached_disk - q->cached_remote),
				      "gen_tokens", (json_int_t)q->gen_tokens, "ttft_ms", q->ttft_ms, "prefill_ms",
				      q->prefill_ms, "decode_ms", q->decode_ms);
		json_object_set_new(j, "namespace", json_string(q->salted ? "salted" : "default"));
		if (!q->miss)
			json_object_set_new(j, "miss", json_null());
		else if (q->salted ? text_salted : text_default)
			json_object_set(j, "miss", q->miss);
		else
			json_object_set_new(j, "miss", numbers_only(q->miss));
		json_array_append_new(reqs, j);
	}
	json_object_set_new(c, "requests", json_integer((json_int_t)r->requests));
	json_object_set_new(c, "prompt_tokens", json_integer((json_int_t)r->prompt_tokens));
	json_object_set_new(c, "cached_tokens", json_integer((json_int_t)r->cached_tokens));
	json_object_set_new(c, "prefill_tokens", json_integer((json_int_t)r->prefill_tokens));
	json_object_set_new(c, "gen_tokens", json_integer((json_int_t)r->gen_tokens));
	json_object_set_new(c, "prefill_ms", json_real(r->prefill_ms));
	json_object_set_new(c, "decode_ms", json_real(r->decode_ms));
	pthread_mutex_unlock(&r->mu);
	json_object_set_new(obj, "requests", reqs);
	json_object_set_new(obj, "counters", c);
}
