/*
 * cache_int.h - the RAM cache's state, shared by its modules. Internal to
 * src/cache (other layers use cache.h). Calls go one way:
 *
 *   cache.c   the facade (cache.h): create/destroy, lookup, put, the
 *             counters, the check, the disk tier's views
 *   evict.c   RAM eviction: victims, the count and byte caps, admission,
 *             the hybrid prefill reclaim, the budget (cache.h)
 *   tree.c    the objects of index.h made and collected: nodes, resume
 *             points, entries, the LRU and dirty lists, the byte counts
 *
 * cache.c calls evict.c and tree.c, evict.c calls tree.c, and tree.c
 * calls neither (tests/arch/check.py fails on a circle). Every function
 * declared here runs with `mu` held by its caller.
 */
#ifndef KV_CACHE_CACHE_INT_H
#define KV_CACHE_CACHE_INT_H

#include "cache/cache.h"
#include "cache/index.h"

#include <pthread.h>

#define LAT_RING 4096

struct kc_cache {
	pthread_mutex_t mu;
	struct ke_layout L;
	struct kc_policy pol;
	const struct kc_index_ops *ops;
	void *ix;
	struct kc_echo *echo;     /* the namespace's answer records (echo.h), or NULL */
	struct kc_node root;
	uint32_t B;
	int hybrid;
	int disabled;
	uint64_t budget;
	uint32_t max_entries;
	int32_t max_hyb;
	uint64_t mem_cap;
	uint64_t (*mem_used)(void *);
	void *mem_ctx;
	double tf;
	void (*on_evict)(void *, uint64_t, uint32_t);
	void *evict_ctx;

	struct kc_entry *lru_head, *lru_tail;
	struct kc_obj *dirty_head, *dirty_tail;
	size_t n_dirty;

	uint64_t bytes, n_entries, n_nodes, n_rps, n_snaps, dedup;
	uint64_t next_id;
	struct kc_stats st;        /* event counters only; sizes filled on demand */
	uint64_t lat[LAT_RING];
	uint32_t lat_n, lat_i;

	struct kc_node **path;     /* scratch for put, path_cap slots */
	size_t path_cap;
	struct kc_rp **rpv;        /* scratch for lookup */
	size_t rpv_cap;
};

/* Bytes the cache counts for a node, and for an rp's tail of t rows (the
 * policy's own numbers, so its entry estimate is exact). */
static inline uint64_t node_bytes(const struct kc_cache *c)
{
	return kc_policy_node_bytes(&c->L);
}

static inline uint64_t rp_tail_bytes(const struct kc_cache *c, uint32_t t)
{
	return kc_policy_rp_bytes(&c->L, t, 0);
}

/* tree.c ------------------------------------------------------------------- */

/* The dirty list (objects the disk tier has not taken yet), in creation
 * order: append; remove (nothing when o is not on it). */
void kc_tree_dirty_push(struct kc_cache *c, struct kc_obj *o);
void kc_tree_dirty_unlink(struct kc_cache *c, struct kc_obj *o);
/* The LRU list: put e at the front (most recently used) with the time of
 * use; kc_tree_touch moves e there (NULL: nothing). */
void kc_tree_lru_front(struct kc_cache *c, struct kc_entry *e);
void kc_tree_touch(struct kc_cache *c, struct kc_entry *e);
/* A new node under parent for block blk (hash h), holding one reference
 * on page; on the dirty list unless clean. NULL on failure (kv_fail). */
struct kc_node *kc_tree_node_new(struct kc_cache *c, struct kc_node *parent, const int32_t *blk, struct kv_h128 h,
				 struct kv_page *page, int clean);
/* Free n and then its ancestors while nothing references them; *rel +=
 * the bytes given back. */
void kc_tree_node_gc(struct kc_cache *c, struct kc_node *n, uint64_t *rel);
/* The rp of x with these t tail tokens, or NULL. */
struct kc_rp *kc_tree_rp_find(struct kc_node *x, const int32_t *tail, uint32_t t);
/* A new rp at x with t tail tokens, its rows copied from page. NULL on
 * failure. */
struct kc_rp *kc_tree_rp_new(struct kc_cache *c, struct kc_node *x, const int32_t *tail, uint32_t t,
			     const struct kv_page *page, int clean);
/* Give r the snapshot snap (kv_alloc'd; the rp owns it from here). */
void kc_tree_rp_set_snap(struct kc_cache *c, struct kc_rp *r, void *snap);
/* Free r (and the nodes it leaves unreferenced) when nothing references
 * or pins it; *rel += the bytes given back. */
void kc_tree_rp_gc(struct kc_cache *c, struct kc_rp *r, uint64_t *rel);
/* Count an entry ending below x in (delta 1) or out (-1) of the nodes'
 * `through` and the dedup bytes. */
void kc_tree_through_add(struct kc_cache *c, struct kc_node *x, int delta);
/* Free entry e and what only it references; calls on_evict. */
void kc_tree_entry_free(struct kc_cache *c, struct kc_entry *e, uint64_t *rel);

/* evict.c ------------------------------------------------------------------ */

/* Evict down to the entry caps and the byte budget (after a put, a
 * budget change, a released hit). */
void kc_evict_enforce(struct kc_cache *c);

#endif
