/*
 * catalog.c - see catalog.h.
 *
 * Records live in one growable array (indexes stay valid across growth;
 * freed slots are reused). Two indexes, open-addressing tables of record
 * numbers whose keys are read from the records themselves (nothing is
 * stored twice): key (area, kind, id) -> index, and parent hash -> first
 * child, the children chained through next_sib. A slot is 4 bytes and the
 * tables stay at most 70% full, so the indexes cost 6-12 bytes per record
 * on top of the record's 80 (docs/persistence.md has the measurements).
 */
#include "store/catalog.h"
#include "base/err.h"
#include "store/dir.h"
#include "store/obj.h"

#include <stdlib.h>
#include <string.h>

#define SLOT_EMPTY (-1)
#define SLOT_GONE (-2) /* deleted: probing goes on past it */

struct itab {
	int32_t *slot;           /* record index, SLOT_EMPTY or SLOT_GONE */
	uint32_t cap;            /* power of two (0 before the first insert) */
	uint32_t used, gone;     /* live slots, tombstones */
};

struct ks_cat {
	struct ks_rec *r;
	int32_t n, cap;          /* slots used (high-water mark), allocated */
	int32_t *free_list;
	int32_t n_free, cap_free;
	struct itab by_key;      /* (area, kind, id) -> index */
	struct itab by_parent;   /* parent -> first child index */
	size_t count[KS_AREA__COUNT];
	uint64_t bytes[KS_AREA__COUNT];
};

/* ids and parents are XXH3 hashes already: mixing in area and kind is all
 * the hashing needed */
static uint64_t hash_key(int area, int kind, struct kv_h128 id)
{
	return (id.lo ^ (id.hi * 0x9E3779B97F4A7C15ull)) + (uint64_t)(kind * 4 + area) * 0xC2B2AE3D27D4EB4Full;
}

static uint64_t hash_parent(struct kv_h128 p)
{
	return p.lo ^ (p.hi * 0x9E3779B97F4A7C15ull);
}

static uint64_t slot_hash(const struct ks_cat *c, const struct itab *t, int32_t i)
{
	const struct ks_rec *r = &c->r[i];
	return t == &c->by_key ? hash_key(r->area, r->kind, r->id) : hash_parent(r->parent);
}

/* Rebuild t with capacity ncap (a power of two). */
static int itab_resize(struct ks_cat *c, struct itab *t, uint32_t ncap)
{
	int32_t *ns = malloc((size_t)ncap * sizeof *ns);
	if (!ns)
		return -1;
	for (uint32_t j = 0; j < ncap; j++)
		ns[j] = SLOT_EMPTY;
	for (uint32_t j = 0; j < t->cap; j++) {
		int32_t i = t->slot[j];
		if (i < 0)
			continue;
		uint32_t h = (uint32_t)slot_hash(c, t, i) & (ncap - 1);
		while (ns[h] != SLOT_EMPTY)
			h = (h + 1) & (ncap - 1);
		ns[h] = i;
	}
	free(t->slot);
	t->slot = ns;
	t->cap = ncap;
	t->gone = 0;
	return 0;
}

/* Room for one more: at most 70% of the slots live or deleted. */
static int itab_reserve(struct ks_cat *c, struct itab *t)
{
	if ((uint64_t)(t->used + t->gone + 1) * 10 <= (uint64_t)t->cap * 7)
		return 0;
	uint32_t ncap = t->cap ? t->cap : 1024;
	while ((uint64_t)(t->used + 1) * 10 > (uint64_t)ncap * 5)
		ncap *= 2; /* after a rebuild: at most half full */
	return itab_resize(c, t, ncap);
}

/* Slot position of the by_key entry for (area, kind, id), or -1. */
static int64_t find_key(const struct ks_cat *c, int area, int kind, struct kv_h128 id)
{
	const struct itab *t = &c->by_key;
	if (!t->cap)
		return -1;
	for (uint32_t h = (uint32_t)hash_key(area, kind, id) & (t->cap - 1), k = 0; k < t->cap;
	     h = (h + 1) & (t->cap - 1), k++) {
		int32_t i = t->slot[h];
		if (i == SLOT_EMPTY)
			return -1;
		if (i >= 0 && c->r[i].area == area && c->r[i].kind == kind && kv_h128_eq(c->r[i].id, id))
			return h;
	}
	return -1;
}

/* Slot position of the by_parent entry for parent p, or -1. */
static int64_t find_parent(const struct ks_cat *c, struct kv_h128 p)
{
	const struct itab *t = &c->by_parent;
	if (!t->cap)
		return -1;
	for (uint32_t h = (uint32_t)hash_parent(p) & (t->cap - 1), k = 0; k < t->cap; h = (h + 1) & (t->cap - 1), k++) {
		int32_t i = t->slot[h];
		if (i == SLOT_EMPTY)
			return -1;
		if (i >= 0 && kv_h128_eq(c->r[i].parent, p))
			return h;
	}
	return -1;
}

/* Put record i in t (its key is not there yet); reserve first. */
static void itab_add(struct ks_cat *c, struct itab *t, int32_t i)
{
	uint32_t h = (uint32_t)slot_hash(c, t, i) & (t->cap - 1);
	while (t->slot[h] >= 0)
		h = (h + 1) & (t->cap - 1);
	if (t->slot[h] == SLOT_GONE)
		t->gone--;
	t->slot[h] = i;
	t->used++;
}

static void itab_del_at(struct itab *t, int64_t h)
{
	t->slot[h] = SLOT_GONE;
	t->used--;
	t->gone++;
}

struct ks_cat *ks_cat_create(void)
{
	return calloc(1, sizeof(struct ks_cat));
}

void ks_cat_destroy(struct ks_cat *c)
{
	if (!c)
		return;
	free(c->by_key.slot);
	free(c->by_parent.slot);
	free(c->r);
	free(c->free_list);
	free(c);
}

int32_t ks_cat_find(const struct ks_cat *c, int area, int kind, struct kv_h128 id)
{
	int64_t h = find_key(c, area, kind, id);
	return h < 0 ? -1 : c->by_key.slot[h];
}

const struct ks_rec *ks_cat_at(const struct ks_cat *c, int32_t i)
{
	return i >= 0 && i < c->n && c->r[i].live ? &c->r[i] : NULL;
}

int32_t ks_cat_first_child(const struct ks_cat *c, struct kv_h128 h)
{
	int64_t s = find_parent(c, h);
	return s < 0 ? -1 : c->by_parent.slot[s];
}

/* The block record a record hangs under (-1: the namespace or missing). */
static int32_t parent_block(const struct ks_cat *c, const struct ks_rec *r)
{
	return ks_cat_find(c, KS_AREA_MAIN, KS_BLOCK, r->parent);
}

static void raise_up(struct ks_cat *c, int32_t i, int64_t t)
{
	/* eff only grows along the chain, so stop at the first ancestor that
	 * is already as new */
	for (int32_t p = parent_block(c, &c->r[i]), guard = 0; p >= 0 && guard < (1 << 22); guard++) {
		if (c->r[p].eff >= t)
			break;
		c->r[p].eff = t;
		p = parent_block(c, &c->r[p]);
	}
}

/* An entry and the tail/snapshot of its end share an id: keep their keys
 * together (the entry's files are useless without the rp's). */
static void group_eff(struct ks_cat *c, int32_t i)
{
	struct ks_rec *r = &c->r[i];
	static const int kinds[3] = {KS_TAIL, KS_SNAP, KS_ENTRY};
	int64_t m = r->eff;
	int32_t mem[2 * 3];
	int n = 0;
	if (r->kind != KS_TAIL && r->kind != KS_SNAP && r->kind != KS_ENTRY)
		return;
	for (int a = 0; a < KS_AREA__COUNT; a++)
		for (int k = 0; k < 3; k++) {
			int32_t j = ks_cat_find(c, a, kinds[k], r->id);
			if (j >= 0) {
				mem[n++] = j;
				if (c->r[j].eff > m)
					m = c->r[j].eff;
			}
		}
	for (int k = 0; k < n; k++)
		c->r[mem[k]].eff = m;
}

int32_t ks_cat_put(struct ks_cat *c, const struct ks_rec *in)
{
	int32_t i = ks_cat_find(c, in->area, in->kind, in->id);
	if (i >= 0) {
		struct ks_rec *r = &c->r[i];
		c->bytes[r->area] -= r->bytes;
		r->bytes = in->bytes;
		c->bytes[r->area] += r->bytes;
		r->pos = in->pos;
		r->n = in->n;
		r->anchor = in->anchor;
		r->anchor_pos = in->anchor_pos;
		if (in->mtime > r->mtime)
			r->mtime = in->mtime;
		if (r->mtime > r->eff)
			r->eff = r->mtime;
		group_eff(c, i);
		raise_up(c, i, c->r[i].eff);
		return i;
	}
	if (in->area >= KS_AREA__COUNT)
		return -1;
	if (itab_reserve(c, &c->by_key) || itab_reserve(c, &c->by_parent))
		return -1;
	if (c->n_free) {
		i = c->free_list[--c->n_free];
	} else {
		if (c->n == c->cap) {
			int32_t nc = c->cap ? c->cap * 2 : 256;
			struct ks_rec *nr = realloc(c->r, (size_t)nc * sizeof *nr);
			if (!nr)
				return -1;
			c->r = nr;
			c->cap = nc;
		}
		i = c->n++;
	}
	struct ks_rec *r = &c->r[i];
	*r = *in;
	r->live = 1;
	r->eff = r->mtime;
	/* the new record heads its parent's child list */
	int64_t ps = find_parent(c, r->parent);
	r->next_sib = ps >= 0 ? c->by_parent.slot[ps] : -1;
	if (ps >= 0)
		c->by_parent.slot[ps] = i;
	else
		itab_add(c, &c->by_parent, i);
	itab_add(c, &c->by_key, i);
	/* children added before their parent (a scan goes in name order) */
	if (r->kind == KS_BLOCK)
		for (int32_t ch = ks_cat_first_child(c, r->id); ch >= 0; ch = c->r[ch].next_sib)
			if (c->r[ch].eff > r->eff)
				r->eff = c->r[ch].eff;
	c->count[r->area]++;
	c->bytes[r->area] += r->bytes;
	group_eff(c, i);
	raise_up(c, i, c->r[i].eff);
	return i;
}

void ks_cat_del(struct ks_cat *c, int32_t i)
{
	struct ks_rec *r;
	if (i < 0 || i >= c->n || !c->r[i].live)
		return;
	r = &c->r[i];
	int64_t ks = find_key(c, r->area, r->kind, r->id);
	if (ks >= 0)
		itab_del_at(&c->by_key, ks);
	int64_t ps = find_parent(c, r->parent);
	if (ps >= 0) {
		int32_t v = c->by_parent.slot[ps];
		if (v == i) {
			/* the next sibling has the same parent: it takes the slot */
			if (r->next_sib >= 0)
				c->by_parent.slot[ps] = r->next_sib;
			else
				itab_del_at(&c->by_parent, ps);
		} else {
			for (int32_t p = v; p >= 0; p = c->r[p].next_sib)
				if (c->r[p].next_sib == i) {
					c->r[p].next_sib = r->next_sib;
					break;
				}
		}
	}
	c->count[r->area]--;
	c->bytes[r->area] -= r->bytes;
	r->live = 0;
	if (c->n_free == c->cap_free) {
		int32_t nc = c->cap_free ? c->cap_free * 2 : 64;
		int32_t *nf = realloc(c->free_list, (size_t)nc * sizeof *nf);
		if (!nf)
			return; /* the slot is just not reused */
		c->free_list = nf;
		c->cap_free = nc;
	}
	c->free_list[c->n_free++] = i;
}

void ks_cat_touch(struct ks_cat *c, int32_t i, int64_t now)
{
	if (i < 0 || i >= c->n || !c->r[i].live)
		return;
	if (now > c->r[i].mtime)
		c->r[i].mtime = now;
	if (now > c->r[i].eff)
		c->r[i].eff = now;
	group_eff(c, i);
	raise_up(c, i, c->r[i].eff);
}

size_t ks_cat_count(const struct ks_cat *c, int area)
{
	if (area < 0)
		return c->count[0] + c->count[1];
	return area < KS_AREA__COUNT ? c->count[area] : 0;
}

uint64_t ks_cat_bytes(const struct ks_cat *c, int area)
{
	if (area < 0)
		return c->bytes[0] + c->bytes[1];
	return area < KS_AREA__COUNT ? c->bytes[area] : 0;
}

int32_t ks_cat_end(const struct ks_cat *c)
{
	return c->n;
}

struct order_ctx {
	const struct ks_rec *r;
	int by_mtime;
};

static int cmp_order(const void *a, const void *b, void *ctx)
{
	const struct order_ctx *o = ctx;
	const struct ks_rec *x = &o->r[*(const int32_t *)a], *y = &o->r[*(const int32_t *)b];
	int64_t kx = o->by_mtime ? x->mtime : x->eff, ky = o->by_mtime ? y->mtime : y->eff;
	if (kx != ky)
		return kx < ky ? -1 : 1;
	if (x->pos != y->pos)
		return x->pos > y->pos ? -1 : 1;
	/* an entry before its tail and snapshot: the manifest never outlives them */
	return (int)y->kind - (int)x->kind;
}

int ks_cat_order(const struct ks_cat *c, int area, int by_mtime, int32_t **out, size_t *n)
{
	size_t k = 0;
	int32_t *v = malloc(((size_t)c->n + 1) * sizeof *v);
	*out = NULL;
	*n = 0;
	if (!v)
		return kv_fail(KV_ERR_NOMEM, "disk cache: out of memory ordering %d records", c->n);
	for (int32_t i = 0; i < c->n; i++)
		if (c->r[i].live && (area < 0 || c->r[i].area == area))
			v[k++] = i;
	struct order_ctx o = {c->r, by_mtime};
	qsort_r(v, k, sizeof *v, cmp_order, &o);
	*out = v;
	*n = k;
	return KV_OK;
}
