/*
 * evict.c - RAM eviction (cache.h "Eviction", docs/cache.md): which entry
 * goes (least recently used; under budget pressure "leaf" entries only,
 * whose eviction frees memory, and never the most recently used one while
 * the process is below its memory cap), the entry-count caps, the byte
 * budget, admission before a request (kc_cache_admit: everything
 * unpinned may go before "no room"), and the hybrid prefill reclaim.
 *
 * The objects themselves are freed by tree.c (kc_tree_entry_free).
 */
#include "cache/cache_int.h"
#include "base/err.h"
#include "base/mem.h"

#include <stdlib.h>

static uint64_t mem_used_now(struct kc_cache *c)
{
	return c->mem_used ? c->mem_used(c->mem_ctx) : kv_mem_total();
}

/* 1 if evicting e frees memory: its end is not shared and holds a tail, a
 * snapshot or the last reference to a block. */
static int entry_is_leaf(const struct kc_cache *c, const struct kc_entry *e)
{
	const struct kc_rp *r = e->end;
	if (r->pins || r->refs != 1)
		return 0;
	if (r->t || r->snap)
		return 1;
	return r->node != &c->root && r->node->refs == 1;
}

/* The least recently used evictable entry: leaves first; then (if not
 * leaves_only) any unpinned one. guard_mru keeps the head. */
static struct kc_entry *pick_victim(struct kc_cache *c, int leaves_only, int guard_mru)
{
	for (struct kc_entry *e = c->lru_tail; e; e = e->prev) {
		if (guard_mru && e == c->lru_head)
			continue;
		if (!e->end->pins && entry_is_leaf(c, e))
			return e;
	}
	if (leaves_only)
		return NULL;
	for (struct kc_entry *e = c->lru_tail; e; e = e->prev) {
		if (guard_mru && e == c->lru_head)
			continue;
		if (!e->end->pins)
			return e;
	}
	return NULL;
}

static uint64_t evict(struct kc_cache *c, struct kc_entry *e, int pressure)
{
	uint64_t rel = 0;
	kc_tree_entry_free(c, e, &rel);
	c->st.evictions++;
	if (pressure)
		c->st.pressure_evictions++;
	return rel;
}

static uint32_t count_cap(const struct kc_cache *c)
{
	uint32_t lim = c->max_entries;
	if (c->hybrid && c->max_hyb > 0 && (!lim || (uint32_t)c->max_hyb < lim))
		lim = (uint32_t)c->max_hyb;
	return lim;
}

void kc_evict_enforce(struct kc_cache *c)
{
	uint32_t lim = count_cap(c);
	while (lim && c->n_entries > lim) {
		struct kc_entry *e = pick_victim(c, 0, 1);
		if (!e)
			break;
		evict(c, e, 0);
	}
	while (c->budget && c->bytes > c->budget) {
		/* docs/cache.md "Budget and eviction": the MRU entry survives
		 * pressure while the process is below the memory cap itself. */
		int guard = !(c->mem_cap && mem_used_now(c) >= c->mem_cap);
		struct kc_entry *e = pick_victim(c, 1, guard);
		if (!e)
			break;
		evict(c, e, 1);
	}
}

void kc_cache_set_budget(struct kc_cache *c, uint64_t bytes)
{
	pthread_mutex_lock(&c->mu);
	c->budget = bytes;
	kc_evict_enforce(c);
	pthread_mutex_unlock(&c->mu);
}

uint64_t kc_cache_budget(struct kc_cache *c)
{
	pthread_mutex_lock(&c->mu);
	uint64_t b = c->budget;
	pthread_mutex_unlock(&c->mu);
	return b;
}

int kc_cache_evict_lru(struct kc_cache *c, uint64_t *released)
{
	struct kc_entry *e;
	uint64_t rel = 0;
	pthread_mutex_lock(&c->mu);
	e = pick_victim(c, 0, 0);
	if (e)
		rel = evict(c, e, 0);
	pthread_mutex_unlock(&c->mu);
	if (released)
		*released = rel;
	return e ? KV_OK : KV_ERR_NOT_FOUND;
}

void kc_cache_clear(struct kc_cache *c)
{
	while (kc_cache_evict_lru(c, NULL) == KV_OK)
		;
}

int kc_cache_admit(struct kc_cache *c, uint64_t used, uint64_t need, uint64_t cap, uint64_t *released)
{
	uint64_t rel = 0;
	int rc = KV_OK;
	if (released)
		*released = 0;
	if (!cap)
		return KV_OK;
	pthread_mutex_lock(&c->mu);
	while (used - (rel < used ? rel : used) + need > cap) {
		struct kc_entry *e = pick_victim(c, 0, 0);
		if (!e) {
			rc = kv_fail(KV_ERR_FULL, "no room: %llu bytes in use + %llu needed > cap %llu after evicting",
				     (unsigned long long)(used - (rel < used ? rel : used)), (unsigned long long)need,
				     (unsigned long long)cap);
			break;
		}
		rel += evict(c, e, 0);
	}
	pthread_mutex_unlock(&c->mu);
	if (released)
		*released = rel;
	return rc;
}

int kc_cache_reclaim_prefill(struct kc_cache *c, const struct kc_prefill_need *need, uint64_t *projected,
			     uint64_t *released)
{
	uint64_t rel = 0, proj, limit;
	int rc = KV_OK;

	proj = need->recurrent + need->inflight + need->scratch +
	       (uint64_t)((double)need->remaining_tokens * (double)c->L.kv_bytes_per_token * (1.0 + c->tf));
	if (projected)
		*projected = proj;
	if (released)
		*released = 0;
	if (!c->hybrid || !need->cap)
		return KV_OK;
	limit = need->cap / 10 * 9;
	pthread_mutex_lock(&c->mu);
	for (;;) {
		uint64_t now = need->used - (rel < need->used ? rel : need->used);
		struct kc_entry *e;
		uint64_t r;
		if (now + proj <= limit)
			break;
		e = pick_victim(c, 1, now < need->cap);
		if (!e) {
			rc = KV_ERR_FULL;
			break;
		}
		r = evict(c, e, 1);
		rel += r;
		if (!r) {
			/* An eviction that frees nothing means the memory is held
			 * elsewhere; evicting more would only lose cache. */
			rc = KV_ERR_FULL;
			break;
		}
	}
	pthread_mutex_unlock(&c->mu);
	if (rc != KV_OK)
		kv_fail(rc, "prefill projection %llu bytes does not fit 90%% of the cap %llu",
			(unsigned long long)proj, (unsigned long long)need->cap);
	if (released)
		*released = rel;
	return rc;
}
