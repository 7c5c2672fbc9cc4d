/*
 * index.h - the objects of the RAM prefix cache and the block-index
 * interface with its two implementations (radix.c, hashidx.c).
 *
 * Internal to src/cache: other layers use cache.h. The tree, for B = 4
 * (three stored sequences, "|" = block edges, "." = tail tokens):
 *
 *   root (h_-1 = namespace)               rps at root: pos 2  [a b]      (tail)
 *    |
 *    +-- node [a b c d]  h_0              rps: pos 4 (t = 0, snapshot)
 *    |    |
 *    |    +-- node [e f g h]  h_1         rps: pos 10 [i j]  <- entry X end
 *    |    +-- node [e f x y]  h_1'        rps: pos 9  [z]    <- entry Y end
 *    +-- node [a q r s]  h_0'             rps: pos 6  [t u]  <- entry Z end
 *
 *   - A node is one full block of B tokens with one reference on its KV
 *     page (shared with live sequences, never copied, immutable). Its chain
 *     hash is h_i = XXH3_128(h_{i-1} as 16 bytes (lo, hi, little endian) ||
 *     the block's tokens as int32 LE). Node depth d covers tokens
 *     [(d-1)B, dB); the root (depth 0) holds nothing.
 *   - A resume point (rp) at node X is the position p = depth(X) B + t,
 *     0 <= t < B: the KV of the path to X plus its own copy of the first t
 *     rows of the next block (the tail, compact: row r of segment s at
 *     (s t + r) row_bytes) and, for hybrid models, the recurrent snapshot
 *     at exactly p. rps are unique per (node, tail tokens).
 *   - An entry is what one request stored: its end rp (one entry per end
 *     rp), up to ckpt_max checkpoint rps below it on its path, and the
 *     anchor flag of one of them. Entries are the unit of LRU eviction.
 *
 * References: an entry holds one ref on each of its rps; an rp holds one
 * ref on its node; a node holds one ref on its parent. Hits and the disk
 * writer add pins (rp.pins, node.refs). An object goes away when its last
 * ref/pin does, so eviction of an entry frees exactly what nobody else
 * shares.
 *
 * Every index answers through exact token comparison: a hash is only a way
 * to find a candidate.
 */
#ifndef KV_CACHE_INDEX_H
#define KV_CACHE_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "base/hash.h"
#include "base/pages.h"
#include "cache/names.h"

/* First member of every object: links of the dirty list (new objects the
 * disk tier has not taken yet), in creation order. */
struct kc_obj {
	struct kc_obj *dprev, *dnext;
	uint8_t kind;              /* enum kc_obj_kind */
	uint8_t dirty;             /* 1 while on the dirty list */
};

struct kc_rp;
struct kc_entry;

struct kc_node {
	struct kc_obj obj;
	struct kc_node *parent;    /* NULL for the root */
	struct kc_node *kid;       /* first child (creation order, newest first) */
	struct kc_node *sib, *sib_prev; /* siblings under the same parent */
	struct kc_rp *rps;         /* resume points with depth*B <= pos < depth*B + B */
	struct kv_h128 hash;       /* chain hash through this block; root: namespace */
	int32_t *tokens;           /* B tokens (root: NULL); KV_MEM_CACHE */
	struct kv_page *page;      /* one reference (root: NULL) */
	uint32_t depth;            /* blocks from the root */
	uint32_t refs;             /* kids + rps + pins; 0 -> freed (not the root) */
	uint32_t pins;             /* hits holding this node (counted in refs too) */
	uint32_t n_kids;
	uint32_t through;          /* entries whose sequence covers this block */
	/* Radix index: children sorted by their tokens (owned by radix.c). */
	struct kc_node **rx_kids;
	uint32_t rx_n, rx_cap;
	uint8_t hx_indexed;        /* hash index: 1 if the map points at this node */
};

struct kc_rp {
	struct kc_obj obj;
	struct kc_node *node;      /* one reference */
	struct kc_rp *next;        /* in node->rps */
	struct kc_entry *entry;    /* the entry ending here, or NULL */
	struct kv_h128 id;         /* kc_rp_id(node hash, tail tokens) */
	uint32_t pos;              /* node->depth * B + t */
	uint32_t t;                /* tail rows, < B */
	int32_t *tail_tok;         /* t tokens, NULL when t == 0 */
	void *tail_kv;             /* t rows of every segment, compact; NULL when t == 0 */
	void *snap;                /* snapshot_bytes at exactly pos, or NULL */
	uint32_t refs;             /* entries using it (as end or checkpoint) */
	uint32_t pins;             /* hits and disk-writer views */
	uint8_t anchor;            /* an entry named it its protected anchor */
};

struct kc_entry {
	struct kc_obj obj;
	struct kc_entry *prev, *next; /* LRU list: head = most recently used */
	struct kc_rp *end;         /* one reference; end->entry == this */
	struct kc_rp **ckpt;       /* n_ckpt references, ascending positions */
	uint32_t n_ckpt;
	uint32_t anchor;           /* anchor position (0 = none) */
	uint64_t id;               /* 1, 2, ... in creation order */
	int64_t last_use_ms;       /* wall clock of the last store or hit (kv_wall_ms) */
};


/*
 * The index interface. The core keeps the tree links (parent, kid list,
 * refs); an index only answers "which child holds this block" and "how
 * deep does this prompt go" its own way.
 */
struct kc_index_ops {
	const char *name;          /* "radix" / "hash" */
	void *(*create)(uint32_t B);
	void (*destroy)(void *ix);
	/* n is already linked under its parent. KV_OK or KV_ERR_NOMEM. */
	int (*add)(void *ix, struct kc_node *n);
	/* Before n is unlinked. */
	void (*del)(void *ix, struct kc_node *n);
	/* The child of parent spelling blk[0, B) exactly (h = its chain hash). */
	struct kc_node *(*child)(void *ix, struct kc_node *parent, const int32_t *blk, struct kv_h128 h);
	/* The deepest node whose path spells tok[0, depth B), depth <= max_blocks. */
	struct kc_node *(*walk)(void *ix, struct kc_node *root, const int32_t *tok, uint32_t max_blocks);
	/* Among the children of n, one with the longest common prefix with
	 * q[0, qn) (qn <= B); *lcp = that length. NULL and 0 if no child
	 * shares a token. */
	struct kc_node *(*best_kid)(void *ix, struct kc_node *n, const int32_t *q, uint32_t qn, uint32_t *lcp);
};

extern const struct kc_index_ops kc_radix_ops;
extern const struct kc_index_ops kc_hashidx_ops;

#endif
