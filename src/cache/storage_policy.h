/*
 * storage_policy.h - the storage policy: where prefill stops for
 * snapshots and what an entry keeps (docs/cache.md, the storage rules).
 * Pure functions, no cache or engine needed, so every rule is testable
 * with plain numbers. What leaves the cache, and when, is eviction
 * (evict.c), not this policy.
 *
 * Vocabulary. A request has a prompt of n tokens, message boundaries
 * b_0 < b_1 < ... (token positions just after a message's "<|im_end|>\n";
 * b_0 is the end of system + tools) and a resume point p found by the
 * lookup. Positions are token counts: a snapshot "at 2048" is the state
 * after tokens [0, 2048).
 *
 * Rules, for models with non-trimmable (recurrent) state:
 *   - Stride checkpoints at every multiple of `stride` (2048, counted from
 *     position 0, so they line up across sessions sharing a prefix).
 *   - Every message boundary above p is snapshotted too.
 *   - At most `ckpt_max` (4) checkpoints per entry, 0 disables them.
 *     Candidates are added in position order; when one more than the
 *     maximum is held, thinning drops the checkpoint with the smallest gap
 *     to its predecessor (the first one's predecessor is position 0), ties
 *     to the oldest, never the newest, never the anchor.
 *   - The anchor: the first boundary b_0 of a cold session (one whose
 *     resume point carries no anchor) is protected. It occupies one of the
 *     ckpt_max slots and is inherited by every later entry that resumes at
 *     or above it, so it survives restarts and thinning.
 *   - A request stores up to three entries: the boundary entry ending at
 *     the last boundary, the prompt entry ending at n (skipped when
 *     n - last stored boundary <= 64: it adds at most 64 tokens of reuse),
 *     and the completion entry ending after the generated tokens (skipped
 *     when it and the boundary entry would not both fit the budget).
 * Dense models resume anywhere their KV covers: no snapshots, one entry
 * per request (prompt + completion), stop points = just the prompt end.
 */
#ifndef KV_CACHE_STORAGE_POLICY_H
#define KV_CACHE_STORAGE_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "engine/layout.h"

#define KC_STRIDE_DEFAULT 2048
#define KC_CKPT_MAX_DEFAULT 4
#define KC_CKPT_HARD 64        /* largest accepted KVKEEP_HYBRID_CHECKPOINT_MAX */
#define KC_MIN_REUSE_DEFAULT 64
#define KC_HYBRID_ENTRIES_AUTO 8

struct kc_policy {
	int hybrid;           /* 1: snapshots needed to resume (recurrent layers) */
	uint32_t stride;      /* KVKEEP_HYBRID_CHECKPOINT_STRIDE, tokens, > 0 */
	uint32_t ckpt_max;    /* KVKEEP_HYBRID_CHECKPOINT_MAX, 0..KC_CKPT_HARD */
	int anchor;           /* 1: protect the first boundary of a cold session */
	uint32_t min_reuse;   /* the 64-token rule */
};

/* Defaults: stride 2048, max 4, anchor on, min_reuse 64. */
void kc_policy_default(struct kc_policy *p, int hybrid);

/*
 * Apply the environment values (NULL = unset). Invalid values (not a plain
 * integer, stride 0, max above KC_CKPT_HARD) keep the default and log one
 * warning line each. Returns the number of invalid values.
 */
int kc_policy_env(struct kc_policy *p, const char *stride_env, const char *max_env);
/* kc_policy_env with the environment (base/env.h). */
int kc_policy_from_env(struct kc_policy *p);

/*
 * Stop points for a prompt of n tokens resumed at `resume`: ascending,
 * unique, each in (resume, n]. Hybrid: boundaries above resume, stride
 * multiples above resume and below n (when ckpt_max > 0), and n. When
 * ckpt_max is 0 only the last boundary (the boundary entry's end) and n.
 * Dense: just n. Returns the count; at most `cap` are written (the count
 * is still returned, so call with cap 0 to size the array).
 * Boundaries outside (0, n) and unsorted ones are ignored.
 */
size_t kc_policy_stops(const struct kc_policy *p, uint32_t n, const uint32_t *bounds, size_t n_bounds,
		       uint32_t resume, uint32_t *out, size_t cap);

/* The last boundary in (0, n), 0 if none. */
uint32_t kc_policy_last_boundary(uint32_t n, const uint32_t *bounds, size_t n_bounds);

/*
 * The anchor for this request: the inherited anchor if the resume point
 * carries one at or below `resume`; else, for a cold session, b_0 if
 * anchors are on, ckpt_max > 0 and b_0 >= resume (so a snapshot exists or
 * will be taken there). 0 = none.
 */
uint32_t kc_policy_anchor(const struct kc_policy *p, uint32_t n, const uint32_t *bounds, size_t n_bounds,
			  uint32_t resume, uint32_t inherited_anchor);

/* A checkpoint set under construction: positions ascending. */
struct kc_ckpts {
	uint32_t pos[KC_CKPT_HARD + 1];
	uint32_t n;
	uint32_t anchor;      /* protected position (0 = none) */
};

/*
 * Add a candidate at pos (must be above every held position; equal or
 * lower positions are ignored and return 0). If the set then holds more
 * than ckpt_max, one is dropped by the thinning rule and its position is
 * returned (it may be pos itself only when ckpt_max is 0, or when the only
 * other is the anchor and ckpt_max is 1); else 0.
 */
uint32_t kc_policy_ckpt_add(const struct kc_policy *p, struct kc_ckpts *s, uint32_t pos);

/* The 64-token rule: 1 if the prompt entry (end n) should be stored given
 * the last boundary stored at or below n (0 if none). Dense: always 1. */
int kc_policy_store_prompt(const struct kc_policy *p, uint32_t n, uint32_t last_boundary);

/* The completion-entry rule: 1 if the boundary entry and the completion
 * entry fit the budget together (both_bytes = bytes of the two entries
 * with their shared KV counted once). Dense: always 1. */
int kc_policy_store_completion(const struct kc_policy *p, uint64_t both_bytes, uint64_t budget);

/*
 * Bytes one entry of n tokens costs on its own: floor(n / B) pages and
 * their tokens, the end resume point's tail rows and tokens, and for every
 * checkpoint its tail rows and tokens; plus one snapshot for the end and
 * one per checkpoint when the layout has recurrent layers. This is exactly
 * what the cache accounts for such an entry when it shares nothing.
 * ckpt may be NULL when n_ckpt is 0.
 */
uint64_t kc_policy_entry_bytes(const struct ke_layout *L, uint32_t n, const uint32_t *ckpt, uint32_t n_ckpt);

/* Bytes of one full block node (page + B tokens) and of a resume point
 * with t tail rows (rows + tokens, plus a snapshot if with_snap). */
uint64_t kc_policy_node_bytes(const struct ke_layout *L);
uint64_t kc_policy_rp_bytes(const struct ke_layout *L, uint32_t t, int with_snap);

#endif
