/*
 * catalog.c - see catalog.h.
 *
 * Records live in one growable array (indexes stay valid across growth;
 * freed slots are reused). Two maps: key (area, kind, id) -> index, and
 * parent hash -> first child, the children chained through next_sib.
 */
#include "store/catalog.h"
#include "base/err.h"
#include "base/map.h"
#include "store/dir.h"
#include "store/obj.h"

#include <stdlib.h>
#include <string.h>

struct ks_cat {
	struct ks_rec *r;
	int32_t n, cap;          /* slots used (high-water mark), allocated */
	int32_t *free_list;
	int32_t n_free, cap_free;
	struct kv_map *by_key;   /* 18-byte key -> index */
	struct kv_map *by_parent;/* 16-byte parent -> first child index */
	size_t count[KS_AREA__COUNT];
	uint64_t bytes[KS_AREA__COUNT];
};

static void h_bytes(struct kv_h128 h, uint8_t *b)
{
	for (int i = 0; i < 8; i++) {
		b[i] = (uint8_t)(h.lo >> (8 * i));
		b[8 + i] = (uint8_t)(h.hi >> (8 * i));
	}
}

static void key_of(int area, int kind, struct kv_h128 id, uint8_t k[18])
{
	k[0] = (uint8_t)area;
	k[1] = (uint8_t)kind;
	h_bytes(id, k + 2);
}

struct ks_cat *ks_cat_create(void)
{
	struct ks_cat *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->by_key = kv_map_create(1024);
	c->by_parent = kv_map_create(1024);
	if (!c->by_key || !c->by_parent) {
		ks_cat_destroy(c);
		return NULL;
	}
	return c;
}

void ks_cat_destroy(struct ks_cat *c)
{
	if (!c)
		return;
	kv_map_destroy(c->by_key);
	kv_map_destroy(c->by_parent);
	free(c->r);
	free(c->free_list);
	free(c);
}

void ks_cat_clear(struct ks_cat *c)
{
	kv_map_clear(c->by_key);
	kv_map_clear(c->by_parent);
	c->n = 0;
	c->n_free = 0;
	memset(c->count, 0, sizeof c->count);
	memset(c->bytes, 0, sizeof c->bytes);
}

int32_t ks_cat_find(const struct ks_cat *c, int area, int kind, struct kv_h128 id)
{
	uint8_t k[18];
	uint64_t v;
	key_of(area, kind, id, k);
	return kv_map_get(c->by_key, k, sizeof k, &v) ? (int32_t)v : -1;
}

const struct ks_rec *ks_cat_at(const struct ks_cat *c, int32_t i)
{
	return i >= 0 && i < c->n && c->r[i].live ? &c->r[i] : NULL;
}

int32_t ks_cat_first_child(const struct ks_cat *c, struct kv_h128 h)
{
	uint8_t k[16];
	uint64_t v;
	h_bytes(h, k);
	return kv_map_get(c->by_parent, k, sizeof k, &v) ? (int32_t)v : -1;
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
	uint8_t k[18], pk[16];
	uint64_t v;
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
	key_of(r->area, r->kind, r->id, k);
	h_bytes(r->parent, pk);
	r->next_sib = kv_map_get(c->by_parent, pk, sizeof pk, &v) ? (int32_t)v : -1;
	if (kv_map_put(c->by_key, k, sizeof k, (uint64_t)i) || kv_map_put(c->by_parent, pk, sizeof pk, (uint64_t)i)) {
		kv_map_del(c->by_key, k, sizeof k);
		r->live = 0;
		if (c->n_free < c->cap_free)
			c->free_list[c->n_free++] = i;
		return -1;
	}
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
	uint8_t k[18], pk[16];
	uint64_t v;
	struct ks_rec *r;
	if (i < 0 || i >= c->n || !c->r[i].live)
		return;
	r = &c->r[i];
	key_of(r->area, r->kind, r->id, k);
	kv_map_del(c->by_key, k, sizeof k);
	h_bytes(r->parent, pk);
	if (kv_map_get(c->by_parent, pk, sizeof pk, &v)) {
		if ((int32_t)v == i) {
			if (r->next_sib >= 0)
				kv_map_put(c->by_parent, pk, sizeof pk, (uint64_t)r->next_sib);
			else
				kv_map_del(c->by_parent, pk, sizeof pk);
		} else {
			for (int32_t p = (int32_t)v; p >= 0; p = c->r[p].next_sib)
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
