/*
 * turn.h - one request's dealings with the prefix cache, engine-agnostic:
 * the lookup, the stop points, the snapshots taken at them, and what is
 * stored at the end, following the storage policy (storage_policy.h).
 *
 * The caller runs the engine; the turn tells it where to stop and takes
 * what it hands over:
 *
 *   kc_turn_begin        lookup (the hit is pinned for the turn's life),
 *                        stop points, anchor, inherited checkpoints
 *   (restore the sequence from kc_turn_hit, prefill prompt[p:] stopping at
 *    every kc_turn_stops position)
 *   kc_turn_at_stop      at each stop: the snapshot there (hybrid) and the
 *                        sequence's pages. At the last message boundary the
 *                        boundary entry is stored right away (its snapshot
 *                        then lives in the cache); at the prompt end the
 *                        prompt entry unless the 64-token rule skips it;
 *                        anywhere else the snapshot joins the checkpoint
 *                        set, thinned on the spot so at most ckpt_max + 1
 *                        snapshots are ever held.
 *   (decode)
 *   kc_turn_end          the completion entry (hybrid: unless it and the
 *                        boundary entry would not both fit the budget;
 *                        dense: the one entry of the request)
 *   kc_turn_free
 *
 * A turn is used by one thread; the cache calls it makes lock the cache.
 */
#ifndef KV_CACHE_TURN_H
#define KV_CACHE_TURN_H

#include <stddef.h>
#include <stdint.h>

#include "base/pages.h"
#include "cache/cache.h"

struct kc_turn_req {
	const int32_t *tokens;     /* the prompt, n tokens; borrowed for the turn's life */
	uint32_t n;
	const uint32_t *bounds;    /* message boundaries, ascending, each in (0, n); copied */
	size_t n_bounds;
};

struct kc_turn;

/* KV_ERR_INVALID (empty prompt), KV_ERR_NOMEM. */
int kc_turn_begin(struct kc_cache *c, const struct kc_turn_req *r, struct kc_turn **out);
/* The resume point (valid for the turn's life). */
const struct kc_hit *kc_turn_hit(const struct kc_turn *t);
/* Stop points, ascending, all in (p, n]; the last one is n. */
const uint32_t *kc_turn_stops(const struct kc_turn *t, size_t *n);

/*
 * The engine stands at stop `pos` (state exactly after tokens [0, pos)).
 * snap: hybrid, a kc_cache_snap_alloc buffer with the snapshot at pos
 * (ownership passes, always); NULL for dense. pages: the sequence's
 * ceil(pos / B) pages (borrowed). Stops must come in order; a position
 * that is not a stop is KV_ERR_INVALID.
 */
int kc_turn_at_stop(struct kc_turn *t, uint32_t pos, void *snap, struct kv_page *const *pages);

/*
 * kc_turn_at_stop, and an entry ending at pos stored right away whatever
 * the policy says about this stop: another request waits for exactly this
 * prefix (session/sched.h, two agents on one system prompt), so it must be
 * in the cache when the prefill passes it. Dense: tokens [0, pos) with
 * their pages (snap NULL), at any pos inside the prompt (a dense model
 * resumes anywhere, so pos need not be a stop); hybrid: a stop, with the
 * snapshot at pos.
 */
int kc_turn_share_at_stop(struct kc_turn *t, uint32_t pos, void *snap, struct kv_page *const *pages);

/* 1 if kc_turn_end would store a completion entry of n_total tokens and so
 * needs a snapshot at n_total (hybrid) - take one only then. */
int kc_turn_wants_end(const struct kc_turn *t, uint32_t n_total);

/*
 * After decode: the sequence holds KV for all[0, n_total) (the prompt
 * followed by the generated tokens that were fed back; n_total >= n).
 * snap: hybrid snapshot at n_total (ownership passes) or NULL to store
 * nothing more; dense: NULL. pages: ceil(n_total / B) pages.
 */
int kc_turn_end(struct kc_turn *t, const int32_t *all, uint32_t n_total, void *snap, struct kv_page *const *pages);

/* Releases the hit and every snapshot still owned. NULL ok. */
void kc_turn_free(struct kc_turn *t);

#endif
