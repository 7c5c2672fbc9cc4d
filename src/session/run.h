/*
 * run.h - one request's path through cache, disk tier and engine: lookup,
 * disk fetch of what RAM lacks, restore, prefill with stop points and
 * snapshots, decode into the caller's pick callback (the sink), store.
 * Used by the server (one thread per running request, every forward
 * batched with the other running requests' by session/sched.h), by the
 * tests and by `kvkeep bench`. Without a scheduler the forwards run on the
 * calling thread. Every cache call locks the cache and each run has its
 * own sequence, so runs on several threads are safe.
 *
 * Multi-turn sessions are just successive runs whose prompts extend each
 * other (the chat renderer makes them); nothing here keeps conversation
 * state between runs.
 *
 *   kss_run(cache, model, params, result):
 *     0. with a scheduler: wait while another running request is
 *        prefilling a stop point this prompt shares (sched.h)
 *     1. kc_turn_begin: lookup -> resume point p (pinned); with a disk
 *        tier, when RAM lacks part of the prompt the store is asked for the
 *        rest (ram_pos = p) and, if it loaded more, the turn looks up again;
 *        then, the same way, the remote tier (when the store has one) for
 *        what RAM and disk both lack
 *     2. p > 0: ke_seq_resume from the shared full pages, the tail rows and
 *        (hybrid) the snapshot; else a fresh sequence
 *     3. hybrid and a memory cap given: kc_cache_reclaim_prefill
 *     4. ke_seq_prefill(prompt[p:]) stopping at the turn's stop points;
 *        at each one the snapshot and the pages go to kc_turn_at_stop
 *     5. decode up to max_new tokens (forced tokens, a callback, or greedy
 *        argmax); every generated token but the last is fed back
 *     6. kc_turn_end: the completion entry (snapshot taken only if wanted)
 */
#ifndef KV_SESSION_RUN_H
#define KV_SESSION_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "cache/cache.h"
#include "engine/model.h"
#include "engine/seq.h"
#include "session/sched.h"
#include "store/store.h"

/* Pick the next token from logits (vocab floats). Return KV_OK, or
 * anything else to stop generating (that code is not an error). */
typedef int (*kss_pick_fn)(void *ctx, const float *logits, int vocab, int32_t *tok);

/* What speculative decoding did in one run (session/decode.h); all 0 when
 * it was off. Sources as session/spec.h enum kss_spec_src (0 lookup, 1 MTP). */
struct kss_run_spec {
	uint32_t steps;             /* verification forwards */
	uint32_t plain;             /* decode forwards without a draft */
	uint32_t drafted[2];        /* draft tokens verified, by source */
	uint32_t accepted[2];       /* of those, kept */
	double mtp_ms;              /* time the MTP head took drafting */
};

struct kss_run_result {
	uint32_t resumed;           /* p: tokens restored from the cache */
	uint32_t shared;            /* tokens shared with the cache's best sequence */
	int32_t next[KC_NEXT_TOKENS]; /* its tokens right after `shared` (cache.h kc_hit.next) */
	uint32_t n_next;
	uint32_t prefilled;         /* n - p */
	uint32_t generated;         /* tokens in out */
	uint32_t stops;             /* stop points the prefill paused at */
	uint32_t from_disk;         /* resume point loaded from the disk tier (0: none) */
	uint32_t from_remote;       /* resume point loaded from the remote tier (0: none) */
	uint32_t waited;            /* stop of another request's prefill waited for (0: none) */
	double lookup_ms, restore_ms, prefill_ms, decode_ms, store_ms;
	struct kss_run_spec spec;   /* speculative decoding */
};

struct kss_run_params {
	const int32_t *prompt;      /* n tokens (borrowed) */
	uint32_t n;
	const uint32_t *bounds;     /* message boundaries (may be NULL) */
	size_t n_bounds;
	uint32_t max_new;           /* tokens to generate (0: prefill and store only) */
	const int32_t *forced;      /* optional: the tokens to "generate" (max_new of them) */
	kss_pick_fn pick;            /* optional: used when forced is NULL; default argmax */
	void *pick_ctx;
	const int32_t *stop_ids;    /* optional: generation ends after one of these */
	size_t n_stop_ids;
	float *logits;              /* optional out: logits after the prompt (vocab floats) */
	int32_t *out;               /* optional out: the generated tokens (max_new slots) */
	uint64_t mem_cap;           /* hybrid prefill projection against this cap (0: skip) */
	int chunk;                  /* prefill chunk (0: engine default) */
	const int *cancel;          /* read between prefill chunks */
	/* Optional (the disk tier's --kv-disk-checkpoint-interval): every
	 * `every` tokens of prefill and decode, on_every sees the sequence at
	 * exactly that position (prefill stops there too). Its return value is
	 * ignored: a checkpoint that cannot be taken never fails the run. */
	uint32_t every;
	void (*on_every)(void *ctx, struct ke_seq *s, int pos);
	void *every_ctx;
	/* Optional: the disk tier of this cache's namespace: asked for what
	 * RAM lacks, and (when on_every is NULL) its checkpoint interval
	 * becomes `every` with checkpoints queued to it. */
	struct ks_store *store;
	/* Optional: run every forward through this scheduler (batched with
	 * the other running requests); NULL runs them on this thread. */
	struct kss_sched *sched;
	/* Optional: called once the resume point is known (after the lookup
	 * and the restore, before the prefill): r holds resumed, shared,
	 * next, from_disk and waited. */
	void (*on_resume)(void *ctx, const struct kss_run_result *r);
	/* Optional: called after every prefill forward with the position
	 * reached (pos of n). */
	void (*on_progress)(void *ctx, uint32_t pos, uint32_t n);
	void *cb_ctx;               /* for on_resume and on_progress */
	/* Optional: speculative decoding (session/decode.h, spec.h): a mode of
	 * enum kss_spec_mode (0: off) and the longest draft a step verifies
	 * (0: KSS_RUN_SPEC_DRAFT). The output is the same either way. */
	int speculative;
	int spec_max_draft;
	/* Optional: a draft source in the MTP head's place (session/spec.h
	 * kss_mtp_fn; the tests' oracle drafts). NULL: the model's head, if any. */
	int (*spec_draft)(void *ctx, int max, int32_t *out, double *seconds);
	void *spec_draft_ctx;
};

#define KSS_RUN_SPEC_DRAFT 8


/*
 * Run one request. KV_OK; engine errors (KV_ERR_FULL page pool,
 * KV_ERR_CANCELLED, KV_ERR_INVALID token ids) and KV_ERR_NOMEM come back
 * as they are, after whatever was already stored (the boundary entry of a
 * cancelled prefill stays: it is valid).
 */
int kss_run(struct kc_cache *c, struct ke_model *m, const struct kss_run_params *p, struct kss_run_result *r);

#endif
