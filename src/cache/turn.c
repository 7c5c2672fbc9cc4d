/*
 * turn.c - see turn.h.
 *
 * The checkpoint set mirrors the policy's kc_ckpts; next to each position
 * the turn remembers whether it still owns that snapshot (taken during this
 * prefill and not yet handed to the cache) or the cache holds it (inherited
 * from the hit, or already stored with an earlier entry of this turn, in
 * which case later puts pass NULL and the cache reuses it).
 */
#include "cache/turn.h"
#include "base/err.h"
#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

struct held {
	uint32_t pos;
	void *snap;                /* owned by the turn, or NULL: in the cache */
};

struct kc_turn {
	struct kc_cache *c;
	struct kc_policy pol;
	const struct ke_layout *L;
	const int32_t *tok;
	uint32_t n;
	uint32_t *bounds;
	size_t nb;
	uint32_t b_last;
	uint32_t anchor;
	struct kc_hit hit;
	uint32_t *stops;
	size_t n_stops, next_stop;
	struct kc_ckpts set;
	struct held held[KC_CKPT_HARD + 2];
	uint32_t n_held;
	int ended;
};

static void held_drop(struct kc_turn *t, uint32_t pos)
{
	for (uint32_t i = 0; i < t->n_held; i++)
		if (t->held[i].pos == pos) {
			kv_free(t->held[i].snap);
			t->held[i] = t->held[--t->n_held];
			return;
		}
}

static struct held *held_find(struct kc_turn *t, uint32_t pos)
{
	for (uint32_t i = 0; i < t->n_held; i++)
		if (t->held[i].pos == pos)
			return &t->held[i];
	return NULL;
}

/* Offer a checkpoint candidate; thinning may drop it or an older one. */
static void set_add(struct kc_turn *t, uint32_t pos, void *snap)
{
	uint32_t before = t->set.n, dropped;
	if (t->pol.ckpt_max == 0 || (before && pos <= t->set.pos[before - 1])) {
		kv_free(snap);
		return;
	}
	t->held[t->n_held].pos = pos;
	t->held[t->n_held].snap = snap;
	t->n_held++;
	dropped = kc_policy_ckpt_add(&t->pol, &t->set, pos);
	if (dropped)
		held_drop(t, dropped);
}

int kc_turn_begin(struct kc_cache *c, const struct kc_turn_req *r, struct kc_turn **out)
{
	struct kc_turn *t;
	int rc;

	*out = NULL;
	if (!r->tokens || !r->n)
		return kv_fail(KV_ERR_INVALID, "prefix cache turn: empty prompt");
	t = calloc(1, sizeof *t);
	if (!t)
		return kv_fail(KV_ERR_NOMEM, "prefix cache turn: cannot allocate");
	t->c = c;
	t->pol = *kc_cache_policy(c);
	t->L = kc_cache_layout(c);
	t->tok = r->tokens;
	t->n = r->n;
	if (r->n_bounds) {
		t->bounds = malloc(r->n_bounds * sizeof *t->bounds);
		if (!t->bounds) {
			free(t);
			return kv_fail(KV_ERR_NOMEM, "prefix cache turn: cannot copy boundaries");
		}
		memcpy(t->bounds, r->bounds, r->n_bounds * sizeof *t->bounds);
		t->nb = r->n_bounds;
	}
	rc = kc_cache_lookup(c, r->tokens, r->n, &t->hit);
	if (rc) {
		free(t->bounds);
		free(t);
		return rc;
	}
	t->b_last = kc_policy_last_boundary(t->n, t->bounds, t->nb);
	t->anchor = kc_policy_anchor(&t->pol, t->n, t->bounds, t->nb, t->hit.pos, t->hit.anchor);
	t->n_stops = kc_policy_stops(&t->pol, t->n, t->bounds, t->nb, t->hit.pos, NULL, 0);
	t->stops = malloc((t->n_stops ? t->n_stops : 1) * sizeof *t->stops);
	if (!t->stops) {
		kc_turn_free(t);
		return kv_fail(KV_ERR_NOMEM, "prefix cache turn: cannot allocate %zu stops", t->n_stops);
	}
	kc_policy_stops(&t->pol, t->n, t->bounds, t->nb, t->hit.pos, t->stops, t->n_stops);
	/* The checkpoints this session already has, then the resume point. */
	t->set.anchor = t->anchor;
	if (t->pol.hybrid) {
		for (uint32_t i = 0; i < t->hit.n_inh; i++)
			set_add(t, t->hit.inh[i], NULL);
		if (t->hit.pos)
			set_add(t, t->hit.pos, NULL);
	}
	*out = t;
	return KV_OK;
}

const struct kc_hit *kc_turn_hit(const struct kc_turn *t)
{
	return &t->hit;
}

const uint32_t *kc_turn_stops(const struct kc_turn *t, size_t *n)
{
	*n = t->n_stops;
	return t->stops;
}

/* Store an entry ending at `end` with the checkpoints below it. The
 * snapshots the turn owns go to the cache (which keeps or frees them). */
static int store(struct kc_turn *t, const int32_t *tok, uint32_t end, void *snap, struct kv_page *const *pages)
{
	struct kc_put_ckpt ck[KC_CKPT_HARD + 1];
	struct kc_put p = {0};
	uint32_t k = 0, anchor = 0;

	for (uint32_t i = 0; i < t->set.n && k < KC_CKPT_HARD; i++) {
		struct held *h;
		if (t->set.pos[i] >= end)
			continue;
		h = held_find(t, t->set.pos[i]);
		ck[k].pos = t->set.pos[i];
		ck[k].snap = h ? h->snap : NULL;
		if (h)
			h->snap = NULL; /* the cache has it now */
		if (t->set.pos[i] == t->anchor)
			anchor = t->anchor;
		k++;
	}
	if (t->anchor == end)
		anchor = end;
	p.tokens = tok;
	p.n = end;
	p.pages = pages;
	p.snap = snap;
	p.ckpt = ck;
	p.n_ckpt = k;
	p.anchor = anchor;
	return kc_cache_put(t->c, &p, NULL);
}

static int at_stop(struct kc_turn *t, uint32_t pos, void *snap, struct kv_page *const *pages, int share)
{
	if (share && !t->pol.hybrid && pos > t->hit.pos && pos < t->n) {
		/* dense: any position inside the prompt resumes, stop or not
		 * (the stops themselves are not consumed) */
		struct kc_put p = {.tokens = t->tok, .n = pos, .pages = pages};
		kv_free(snap);
		return kc_cache_put(t->c, &p, NULL);
	}
	size_t i = t->next_stop;
	while (i < t->n_stops && t->stops[i] < pos)
		i++;
	if (i == t->n_stops || t->stops[i] != pos) {
		kv_free(snap);
		return kv_fail(KV_ERR_INVALID, "prefix cache turn: %u is not a stop point", pos);
	}
	t->next_stop = i + 1;
	if (share && !t->pol.hybrid) {
		struct kc_put p = {.tokens = t->tok, .n = pos, .pages = pages};
		kv_free(snap);
		return kc_cache_put(t->c, &p, NULL);
	}
	if (share && snap && pos != t->b_last) {
		int rc = store(t, t->tok, pos, snap, pages);
		set_add(t, pos, NULL);
		return rc;
	}
	if (!t->pol.hybrid || !snap) {
		kv_free(snap);
		return KV_OK;
	}
	if (pos == t->b_last) {
		int rc = store(t, t->tok, pos, snap, pages);
		/* The boundary's snapshot now lives in the cache; it is also a
		 * candidate checkpoint of the entries that follow. */
		set_add(t, pos, NULL);
		return rc;
	}
	if (pos == t->n) {
		if (!kc_policy_store_prompt(&t->pol, t->n, t->b_last)) {
			kv_free(snap);
			kc_cache_note_skip(t->c);
			return KV_OK;
		}
		int rc = store(t, t->tok, pos, snap, pages);
		set_add(t, pos, NULL);
		return rc;
	}
	set_add(t, pos, snap);
	return KV_OK;
}

int kc_turn_at_stop(struct kc_turn *t, uint32_t pos, void *snap, struct kv_page *const *pages)
{
	return at_stop(t, pos, snap, pages, 0);
}

int kc_turn_share_at_stop(struct kc_turn *t, uint32_t pos, void *snap, struct kv_page *const *pages)
{
	return at_stop(t, pos, snap, pages, 1);
}

/* Bytes of the completion entry plus the boundary entry's own end, shared
 * KV counted once: what "both fit the budget" compares. */
static uint64_t both_bytes(const struct kc_turn *t, uint32_t n_total)
{
	uint64_t b = kc_policy_entry_bytes(t->L, n_total, t->set.pos, t->set.n);
	int in_set = 0;
	for (uint32_t i = 0; i < t->set.n; i++)
		in_set |= t->set.pos[i] == t->b_last;
	if (t->b_last && !in_set)
		b += kc_policy_rp_bytes(t->L, t->b_last % (uint32_t)t->L->page_tokens, 1);
	return b;
}

int kc_turn_wants_end(const struct kc_turn *t, uint32_t n_total)
{
	uint64_t budget;
	if (!t->pol.hybrid)
		return 1;
	if (n_total <= t->n)
		return 0;
	budget = kc_cache_budget(t->c);
	return !budget || kc_policy_store_completion(&t->pol, both_bytes(t, n_total), budget);
}

int kc_turn_end(struct kc_turn *t, const int32_t *all, uint32_t n_total, void *snap, struct kv_page *const *pages)
{
	if (t->ended || n_total < t->n || !all || memcmp(all, t->tok, (size_t)t->n * sizeof *all)) {
		kv_free(snap);
		return kv_fail(KV_ERR_INVALID, "prefix cache turn: end of %u tokens does not extend the prompt of %u",
			       n_total, t->n);
	}
	t->ended = 1;
	if (!t->pol.hybrid) {
		struct kc_put p = {.tokens = all, .n = n_total, .pages = pages};
		kv_free(snap);
		return kc_cache_put(t->c, &p, NULL);
	}
	if (n_total == t->n) {
		kv_free(snap);
		return KV_OK;
	}
	if (!kc_turn_wants_end(t, n_total)) {
		kv_free(snap);
		kc_cache_note_skip(t->c);
		return KV_OK;
	}
	if (!snap)
		return KV_OK;
	return store(t, all, n_total, snap, pages);
}

void kc_turn_free(struct kc_turn *t)
{
	if (!t)
		return;
	kc_hit_release(t->c, &t->hit);
	for (uint32_t i = 0; i < t->n_held; i++)
		kv_free(t->held[i].snap);
	free(t->stops);
	free(t->bounds);
	free(t);
}
