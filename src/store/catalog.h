/*
 * catalog.h - the in-memory list of what one namespace holds on disk: one
 * record per object file, found by (area, kind, id) and by parent.
 *
 * The records form the same tree as the RAM cache (cache/names.h names them; cache/index.h holds them): a
 * block's parent is the previous block's chain hash (the namespace for
 * the first), a tail's, snapshot's or entry's parent is the block its
 * position sits in. Tails, snapshots and the entry ending at the same
 * resume point share one id (the resume point's name).
 *
 *   ns ── block h0 ── block h1 ── tail/snap/entry of rp (h1, [i j])
 *          │            └── block h1' ...
 *          └── tail/snap of rp (h0, [])   (a snapshot at exactly 1 x B)
 *
 * Last use. Every record has its own last-use time (the file's mtime,
 * refreshed when the object is written or loaded) and an eviction key
 * `eff` = the newest last use in its subtree. Evicting by smallest `eff`,
 * deepest first on ties, therefore never removes a block while something
 * built on it is newer: leaves go first and shared prefixes last.
 *
 * An entry and the tail and snapshot of the resume point it ends at share
 * one id; putting or touching the entry raises theirs too, so the three
 * age together.
 *
 * Not thread-safe: the store holds its mutex around every call.
 */
#ifndef KV_STORE_CATALOG_H
#define KV_STORE_CATALOG_H

#include <stddef.h>
#include <stdint.h>

#include "base/hash.h"

struct ks_rec {
	struct kv_h128 id;       /* object name */
	struct kv_h128 parent;   /* see above */
	uint64_t bytes;          /* file size */
	int64_t mtime;           /* own last use, unix nanoseconds */
	int64_t eff;             /* newest last use in the subtree (eviction key), ns */
	uint32_t pos;            /* block: end position; rp kinds: position; entry: length */
	uint32_t n;              /* n_tokens of the file */
	uint8_t kind;            /* enum ks_kind */
	uint8_t area;            /* enum ks_area */
	uint8_t anchor;          /* snapshot: protected anchor; entry: 1 if it has one */
	uint8_t live;            /* 0 on the free list */
	uint32_t anchor_pos;     /* entry: its anchor (0 none) */
	int32_t next_sib;        /* next record with the same parent, -1 */
};

struct ks_cat;

struct ks_cat *ks_cat_create(void);
void ks_cat_destroy(struct ks_cat *c);

/*
 * Insert a record (copied), or update the one with the same (area, kind,
 * id): its size, last use and fields are replaced. Returns its index, or
 * -1 when out of memory. The eviction keys of its ancestors are raised.
 */
int32_t ks_cat_put(struct ks_cat *c, const struct ks_rec *r);
/* Index of (area, kind, id), -1 if absent. */
int32_t ks_cat_find(const struct ks_cat *c, int area, int kind, struct kv_h128 id);
/* The record at i (valid until the next put/del). */
const struct ks_rec *ks_cat_at(const struct ks_cat *c, int32_t i);
/* Remove record i. */
void ks_cat_del(struct ks_cat *c, int32_t i);
/* First record whose parent is h (-1 none); follow ks_rec.next_sib. */
int32_t ks_cat_first_child(const struct ks_cat *c, struct kv_h128 h);
/* Mark i used at `now` and raise its ancestors' keys. */
void ks_cat_touch(struct ks_cat *c, int32_t i, int64_t now);

/* Records and bytes in an area (area < 0: all). */
size_t ks_cat_count(const struct ks_cat *c, int area);
uint64_t ks_cat_bytes(const struct ks_cat *c, int area);
/* Highest index + 1 (for iteration with ks_cat_at; skip !live). */
int32_t ks_cat_end(const struct ks_cat *c);

/*
 * Eviction order for an area (area < 0: both): indexes of live records
 * sorted by (eff ascending, pos descending) - or, with by_mtime, by own
 * last use (oldest files first, the checkpoint rule). *out malloc'd
 * (free()), *n records. KV_OK or KV_ERR_NOMEM.
 */
int ks_cat_order(const struct ks_cat *c, int area, int by_mtime, int32_t **out, size_t *n);

#endif
