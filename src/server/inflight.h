/*
 * inflight.h - the generation requests running now, for the dashboard
 * (GET /v1/dashboard/state "running") while they run: a request that
 * prefills 14K tokens for minutes shows its progress and its rate, not
 * "no request yet" until it ends (recent.h keeps the ones that ended).
 *
 * A record lives in its request (struct gen, genrun.c) and is linked
 * into the registry from the start of its run to its end. The worker
 * writes the numbers (relaxed atomics: a reader may see one field a step
 * newer than another, never a torn value); the state route reads them
 * under the registry's lock, which keeps the record linked while it reads.
 */
#ifndef KV_SERVER_INFLIGHT_H
#define KV_SERVER_INFLIGHT_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>

enum ksv_inflight_phase { KSV_IF_WAITING = 0, KSV_IF_PREFILL, KSV_IF_DECODE };

struct ksv_inflight_rec {
	char route[32];
	int64_t t_arrive_ms;            /* wall clock at arrival */
	uint64_t t_start_ns;            /* kv_now_ns when its run began */
	atomic_int phase;               /* enum ksv_inflight_phase */
	atomic_uint prompt_tokens;      /* 0 until the lookup is done */
	atomic_uint cached_tokens;      /* resumed from the cache */
	atomic_uint processed;          /* prompt tokens done, cached ones included */
	atomic_uint gen_tokens;         /* generated so far */
	atomic_uint_least64_t t_prefill_ns; /* the prefill's start (kv_now_ns), 0 before */
	atomic_uint_least64_t t_first_ns;   /* the first generated token, 0 before */
	struct ksv_inflight_rec *prev, *next; /* under the registry's lock */
};

struct ksv_inflight;

int ksv_inflight_create(struct ksv_inflight **out);
void ksv_inflight_destroy(struct ksv_inflight *r);
/* Link rec (its fields set by the caller) / unlink it; rec must stay
 * valid while linked. */
void ksv_inflight_add(struct ksv_inflight *r, struct ksv_inflight_rec *rec);
void ksv_inflight_remove(struct ksv_inflight *r, struct ksv_inflight_rec *rec);
/* [{"route", "t_ms", "phase": "waiting"|"prefill"|"decode", "prompt_tokens",
 *   "cached_tokens", "processed", "gen_tokens", "elapsed_ms",
 *   "prefill_tok_s", "decode_tok_s"}], oldest first. New ref. */
json_t *ksv_inflight_json(struct ksv_inflight *r);

#endif
