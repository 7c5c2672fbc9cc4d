/*
 * cache.h - the RAM prefix cache: lookup of resume points, storage of
 * entries, byte budget, LRU eviction, admission, counters, and the hooks
 * the disk tier uses. Engine-agnostic: it moves bytes according to a
 * struct ke_layout and never interprets them (docs/cache.md). The objects
 * and the tree are drawn in index.h.
 *
 * Threads. Every function here takes the cache's mutex, so the scheduler
 * thread and the disk writer may call in concurrently. What a hit or an
 * object view points at is pinned and immutable: read it without the
 * lock until kc_hit_release / kc_cache_view_release.
 *
 * Lookup. kc_cache_lookup finds the best resume point p <= n - 1 of a
 * prompt (at least one token is always prefilled, to get logits):
 *   dense  - the longest prefix covered by stored KV: full blocks of the
 *            path, then the first rows of a stored child page or of a
 *            stored tail whose tokens match;
 *   hybrid - the newest resume point with a snapshot at or below that
 *            shared prefix whose tokens match. When it lies below the
 *            shared prefix the lookup "snaps" (counted, and logged as
 *            "LCP snapped to checkpoint: shared=S entry_len=E resumed_at=P").
 *
 * Eviction (evict.c, docs/cache.md). Entries are evicted LRU-first; a lookup that
 * uses an entry's end (or, dense, all of its KV) makes it most recently
 * used, storing an entry does too. Budget pressure first takes "leaf"
 * entries (unpinned, and their end is not shared, so evicting them frees
 * memory) and never the most recently used entry while memory in use is
 * below the memory cap (0 = no cap known: never). Admission may evict
 * everything unpinned before it says "no room". The hybrid prefill
 * reclaim stops as soon as an eviction releases nothing.
 */
#ifndef KV_CACHE_CACHE_H
#define KV_CACHE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "base/hash.h"
#include "base/pages.h"
#include "cache/names.h"
#include "cache/storage_policy.h"
#include "engine/layout.h"

enum kc_index_kind { KC_INDEX_RADIX = 0, KC_INDEX_HASH = 1 };

#define KC_HYBRID_NONE (-1) /* max_hybrid_entries: keep no non-trimmable entries */

/* The engine's measured transient factor (docs/cache.md, `kvkeep bench
 * cache`): peak bytes of a prefill beyond its prompt KV, its recurrent
 * state and the sequence's fixed scratch, per byte of prompt KV. This
 * engine attends in 64-key blocks and never materialises a score matrix,
 * so the measured value is 0: its transient is the per-sequence scratch
 * (kc_prefill_need.scratch), not a multiple of the KV. */
#define KC_TRANSIENT_FACTOR_DEFAULT 0.0

struct kc_params {
	const struct ke_layout *layout;  /* copied */
	struct kv_h128 ns;               /* namespace hash: h_{-1} of every chain */
	int index;                       /* enum kc_index_kind (0 = radix) */
	int disabled;                    /* --disable-prefix-cache: lookups miss, puts store nothing */
	uint64_t budget_bytes;           /* byte cap of the RAM tier; 0 = no byte cap */
	uint32_t max_entries;            /* legacy --prefix-cache-size count mode; 0 = no count cap */
	int32_t max_hybrid_entries;      /* --hybrid-cache-entries: 0 = automatic (8 when the
					    layout has recurrent layers), > 0 = that many,
					    KC_HYBRID_NONE = store no hybrid entries */
	uint64_t mem_cap;                /* memory cap in bytes (0 = none known) */
	/* Memory the process uses now; NULL = kv_mem_total(). */
	uint64_t (*mem_used)(void *ctx);
	void *mem_ctx;
	double transient_factor;         /* prefill transient per byte of prompt KV beyond
					    the scratch; < 0 or 0: KC_TRANSIENT_FACTOR_DEFAULT */
	const struct kc_policy *policy;  /* NULL: defaults + environment; copied */
	uint64_t echo_bytes;             /* the namespace's answer records (echo.h); 0: none */
	/* Called (under the cache lock: do not call back in) for every evicted
	 * entry. Optional. */
	void (*on_evict)(void *ctx, uint64_t entry_id, uint32_t len);
	void *evict_ctx;
};

struct kc_cache;

/* KV_OK, KV_ERR_INVALID (bad layout / parameters) or KV_ERR_NOMEM. */
int kc_cache_create(const struct kc_params *p, struct kc_cache **out);
/* Every hit and view must have been released. Drops all references. */
void kc_cache_destroy(struct kc_cache *c);

const struct ke_layout *kc_cache_layout(const struct kc_cache *c);
const struct kc_policy *kc_cache_policy(const struct kc_cache *c);
/* Name of an index kind ("radix"/"hash"); parse one: KV_OK or KV_ERR_INVALID. */
const char *kc_index_name(int kind);
int kc_index_parse(const char *s, int *kind);

/* A snapshot buffer of layout->snapshot_bytes (KV_MEM_CACHE). Hand it to
 * kc_cache_put (which takes ownership) or free it with kc_cache_snap_free. */
void *kc_cache_snap_alloc(struct kc_cache *c);
void kc_cache_snap_free(struct kc_cache *c, void *snap);

/* --- lookup ------------------------------------------------------------ */

#define KC_NEXT_TOKENS 8

struct kc_hit {
	uint32_t pos;             /* resume point p (0 = miss) */
	uint32_t shared;          /* tokens shared with the best stored sequence (>= pos) */
	/* The best stored sequence's tokens right after `shared` (up to
	 * KC_NEXT_TOKENS; 0 when it ends there): what the prompt departs from,
	 * for the miss explainer. */
	int32_t next[KC_NEXT_TOKENS];
	uint32_t n_next;
	uint32_t n_pages;         /* floor(pos / B) full pages to share */
	uint32_t tail_rows;       /* pos % B rows to copy into a fresh page */
	const void *tail;         /* those rows: row r of segment s at (s x tail_stride + r)
				     x row_bytes (a stored page's data or a compact tail) */
	uint32_t tail_stride;     /* rows per segment in `tail` (B or the tail's length) */
	const void *snap;         /* hybrid: the snapshot at pos; NULL otherwise */
	/* Hybrid: snapshot positions below pos on this prompt's path, already
	 * thinned to the policy's maximum, and the anchor among them or at pos
	 * (0 = none). The turn that resumes here inherits them. */
	uint32_t inh[KC_CKPT_HARD + 1];
	uint32_t n_inh;
	uint32_t anchor;
	/* Private: what the hit pins. */
	struct kc_node *node_;
	struct kc_node *src_node_;
	struct kc_rp *src_rp_;
	struct kc_rp *inh_rp_[KC_CKPT_HARD + 1];
};

/*
 * Find the best resume point of tok[0, n). Always fills *hit (pos 0 on a
 * miss) and pins what it found until kc_hit_release (call it for misses
 * too; releasing twice is harmless). Counts a hit or a miss and the
 * lookup latency.
 */
int kc_cache_lookup(struct kc_cache *c, const int32_t *tok, uint32_t n, struct kc_hit *hit);
/* The same lookup without side effects: no counters, no LRU touch, no
 * log line (the disk tier asks how far the RAM tier goes before the
 * request's own lookup). The hit is pinned: release it with kc_hit_release. */
int kc_cache_peek(struct kc_cache *c, const int32_t *tok, uint32_t n, struct kc_hit *hit);
/* The hit's n_pages page pointers, in order (borrowed: take your own
 * kv_page_ref for each page a sequence keeps). */
void kc_hit_pages(const struct kc_hit *h, struct kv_page **out);
/* Write the hit's tail_rows rows of every segment into the front of a
 * page-sized buffer laid out as layout.h says. */
void kc_hit_copy_tail(const struct kc_cache *c, const struct kc_hit *h, void *page_data);
/* Unpins; limits that pins kept from applying are enforced now. */
void kc_hit_release(struct kc_cache *c, struct kc_hit *h);

/* --- storing ----------------------------------------------------------- */

struct kc_put_ckpt {
	uint32_t pos;             /* 0 < pos < n */
	void *snap;               /* snapshot at pos (ownership passes), or NULL to
				     reuse the one the cache already holds at pos (the
				     checkpoint is dropped if there is none) */
};

struct kc_put {
	const int32_t *tokens;    /* the entry's sequence, n tokens (borrowed) */
	uint32_t n;               /* > 0; the entry's end resume point */
	/* ceil(n / B) pages of the sequence, pages[i] holding tokens
	 * [iB, iB + B): full pages get one more reference, tail rows are
	 * copied. A page may be NULL when the cache already holds that block
	 * (disk loads) or no tail is taken from it. Borrowed. */
	struct kv_page *const *pages;
	void *snap;               /* snapshot at n (hybrid; ownership passes), NULL: reuse */
	const struct kc_put_ckpt *ckpt; /* ascending positions */
	uint32_t n_ckpt;          /* <= KC_CKPT_HARD */
	uint32_t anchor;          /* 0, n, or one of the checkpoint positions */
	int clean;                /* 1: loaded from disk, not queued for the writer */
};

/*
 * Store an entry. Snapshots passed in are always consumed (kept or freed),
 * on errors too. An entry with the same end already stored is made most
 * recently used instead (*entry_id = its id). Afterwards the count caps
 * and the byte budget are enforced (the new entry is the most recently
 * used one). *entry_id = 0 when nothing was stored (cache disabled, or
 * --hybrid-cache-entries 0). KV_ERR_INVALID for arguments that break the
 * rules above, KV_ERR_NOMEM.
 */
int kc_cache_put(struct kc_cache *c, const struct kc_put *p, uint64_t *entry_id);

/* --- budget, eviction, admission ---------------------------------------- */

/* Change the byte budget (0 = none) and evict down to it. */
void kc_cache_set_budget(struct kc_cache *c, uint64_t bytes);
/* The namespace's store of the server's own answers (echo.h); NULL when
 * echo_bytes was 0 (kept for a disabled cache too: prompts render the same
 * with and without the KV cache). Lives as long as the cache. */
struct kc_echo *kc_cache_echo(const struct kc_cache *c);
/* 0 for a cache made with `disabled` (it stores nothing), or NULL. */
int kc_cache_enabled(const struct kc_cache *c);
uint64_t kc_cache_budget(struct kc_cache *c);
/* Evict the least recently used unpinned entry (leaves first), MRU
 * included. KV_OK and *released (bytes given back to the allocator), or
 * KV_ERR_NOT_FOUND when nothing is evictable. */
int kc_cache_evict_lru(struct kc_cache *c, uint64_t *released);
/* Evict every unpinned entry. */
void kc_cache_clear(struct kc_cache *c);

/*
 * Admission: a request needs `need` bytes on top of `used` (everything in
 * use now: weights, pages, cache, other reservations). If used + need >
 * cap, evict LRU entries (the MRU one included) until it fits. KV_OK, or
 * KV_ERR_FULL ("no room": answer 503 with Retry-After) when evicting
 * everything evictable is not enough. cap 0: always KV_OK.
 */
int kc_cache_admit(struct kc_cache *c, uint64_t used, uint64_t need, uint64_t cap, uint64_t *released);

struct kc_prefill_need {
	uint64_t used;             /* memory in use now */
	uint64_t recurrent;        /* recurrent state of the new sequence */
	uint64_t scratch;          /* the sequence's prefill scratch if not yet allocated
				      (ke_model_scratch_bytes), 0 if counted in used */
	uint64_t inflight;         /* reservations of requests already running */
	uint64_t remaining_tokens; /* prompt tokens still to prefill */
	uint64_t cap;              /* memory cap (0: nothing to do) */
};
/*
 * The hybrid prefill projection: recurrent + inflight + scratch +
 * remaining prompt KV x (1 + transient factor) against 90% of the cap. Evicts LRU entries
 * (pressure: the MRU one survives while used < cap) until it fits and
 * stops as soon as an eviction releases nothing. *projected = the
 * projection. KV_OK if it fits, KV_ERR_FULL if not (the caller decides);
 * dense layouts: KV_OK without evicting (only hybrid prefill materialises
 * large transients).
 */
int kc_cache_reclaim_prefill(struct kc_cache *c, const struct kc_prefill_need *need, uint64_t *projected,
			     uint64_t *released);

/* --- counters ----------------------------------------------------------- */

struct kc_stats {
	uint64_t lookups, hits, misses;
	uint64_t tokens_saved;       /* sum of resume positions of hits */
	uint64_t evictions;          /* entries evicted for any reason */
	uint64_t pressure_evictions; /* ... by budget pressure or prefill reclaim */
	uint64_t nontrim_skips;      /* hybrid entries not stored (64-token and completion rules) */
	uint64_t snaps;              /* hybrid lookups snapped below the shared prefix */
	uint64_t bytes_in_use;       /* accounted bytes (pages, tokens, tails, snapshots) */
	uint64_t cap_bytes;          /* the byte budget (0 = none) */
	uint64_t entries, nodes, rps, snapshots;
	uint64_t dedup_bytes_saved;  /* KV page bytes not stored twice thanks to sharing */
	uint64_t stores;             /* entries stored (new ones) */
	uint64_t superseded;         /* dense entries dropped: a new entry extends them */
	double lookup_p50_ms, lookup_p99_ms; /* over the last 4096 lookups */
};
void kc_cache_stats(struct kc_cache *c, struct kc_stats *out);
/* Bytes of the index's own structures (nodes, resume points, entries) for
 * the counts in st: what bytes_in_use leaves out (benchmarks). */
uint64_t kc_cache_struct_bytes(const struct kc_stats *st);

/* One stored entry, for displays (the dashboard). */
struct kc_entry_info {
	uint64_t id;                 /* creation order */
	uint32_t tokens;             /* its length */
	uint32_t anchor;             /* 0 = none */
	uint32_t ckpt[KC_CKPT_HARD]; /* checkpoint positions, ascending */
	uint32_t n_ckpt;
	int64_t last_use_ms;         /* wall clock */
	uint64_t bytes;              /* KV of its length + its snapshots (blocks it
				        shares with other entries count in each) */
	int dirty;                   /* 1: not yet handed to the disk writer */
};
/* Up to max entries, most recently used first; returns how many there are
 * in all. */
size_t kc_cache_list(struct kc_cache *c, struct kc_entry_info *out, size_t max);
/* Count an entry the policy chose not to store (kc_turn does this). */
void kc_cache_note_skip(struct kc_cache *c);

/* Verify every invariant (refs, counts, bytes, index consistency, token
 * chains). KV_OK or KV_ERR_CORRUPT naming the first broken one. For tests
 * and `kvkeep cache verify`; O(size). */
int kc_cache_check(struct kc_cache *c);

/* --- disk-tier hooks ----------------------------------------------------- */

/*
 * A view of one object for the disk writer. Everything it points at stays
 * valid until kc_cache_view_release, even if the object is evicted.
 */
struct kc_view {
	int kind;                   /* KC_OBJ_BLOCK / KC_OBJ_RP / KC_OBJ_ENTRY (names.h) */
	struct kv_h128 id;          /* block: chain hash; rp: XXH3_128(node hash || tail
				       tokens); entry: its end rp's id */
	struct kv_h128 parent;      /* block: previous chain hash (the namespace for the
				       first block); rp: its block's chain hash */
	uint32_t pos;               /* block: end position (depth x B); rp: position;
				       entry: length */
	int32_t *tokens;            /* block: B; rp: tail tokens; entry: all n (owned copy) */
	uint32_t n_tokens;
	struct kv_page *page;       /* block: one reference held by the view */
	const void *tail_kv;        /* rp: t rows per segment, compact */
	size_t tail_bytes;
	const void *snap;           /* rp: snapshot or NULL */
	size_t snap_bytes;
	int anchor;                 /* rp: flagged anchor */
	uint32_t ckpt[KC_CKPT_HARD];/* entry: checkpoint positions, ascending */
	uint32_t n_ckpt;
	uint32_t anchor_pos;        /* entry: its anchor (0 none) */
	void *priv_;
};

/* Take up to max new (dirty) objects in dependency order: a block after
 * its parent, an rp after its block, an entry after its rps. Returns how
 * many views were filled; each must be released. Objects loaded with
 * clean = 1 never show up. */
size_t kc_cache_take_dirty(struct kc_cache *c, struct kc_view *out, size_t max);
void kc_cache_view_release(struct kc_cache *c, struct kc_view *v);
/* Number of objects waiting on the dirty list. */
size_t kc_cache_dirty_count(struct kc_cache *c);

#endif
