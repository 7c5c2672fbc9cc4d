/*
 * tree.c - the objects of the RAM cache (index.h) made and collected:
 * nodes, resume points and entries with their references, the LRU list
 * (the order eviction reads, evict.c), the dirty list (what the disk
 * tier has not taken yet), and the byte and object counts the
 * invariants of cache.c are stated in.
 *
 * An object goes away when its last reference or pin does: the _gc
 * functions free what nothing holds any more and walk up the path, so
 * freeing an entry frees exactly what no other entry, hit or view
 * shares. Callers hold the cache's mutex.
 */
#include "cache/cache_int.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

void kc_tree_dirty_push(struct kc_cache *c, struct kc_obj *o)
{
	o->dnext = NULL;
	o->dprev = c->dirty_tail;
	if (c->dirty_tail)
		c->dirty_tail->dnext = o;
	else
		c->dirty_head = o;
	c->dirty_tail = o;
	o->dirty = 1;
	c->n_dirty++;
}

void kc_tree_dirty_unlink(struct kc_cache *c, struct kc_obj *o)
{
	if (!o->dirty)
		return;
	if (o->dprev)
		o->dprev->dnext = o->dnext;
	else
		c->dirty_head = o->dnext;
	if (o->dnext)
		o->dnext->dprev = o->dprev;
	else
		c->dirty_tail = o->dprev;
	o->dprev = o->dnext = NULL;
	o->dirty = 0;
	c->n_dirty--;
}

static void lru_unlink(struct kc_cache *c, struct kc_entry *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		c->lru_head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		c->lru_tail = e->prev;
	e->prev = e->next = NULL;
}

void kc_tree_lru_front(struct kc_cache *c, struct kc_entry *e)
{
	e->last_use_ms = kv_wall_ms();
	e->prev = NULL;
	e->next = c->lru_head;
	if (c->lru_head)
		c->lru_head->prev = e;
	else
		c->lru_tail = e;
	c->lru_head = e;
}

void kc_tree_touch(struct kc_cache *c, struct kc_entry *e)
{
	if (!e || c->lru_head == e)
		return;
	lru_unlink(c, e);
	kc_tree_lru_front(c, e);
}

struct kc_node *kc_tree_node_new(struct kc_cache *c, struct kc_node *parent, const int32_t *blk, struct kv_h128 h,
				struct kv_page *page, int clean)
{
	struct kc_node *n = calloc(1, sizeof *n);
	if (!n) {
		kv_fail(KV_ERR_NOMEM, "prefix cache: cannot allocate a node");
		return NULL;
	}
	n->tokens = kv_alloc(KV_MEM_CACHE, (size_t)c->B * sizeof(int32_t));
	if (!n->tokens) {
		free(n);
		return NULL;
	}
	memcpy(n->tokens, blk, (size_t)c->B * sizeof(int32_t));
	n->obj.kind = KC_OBJ_BLOCK;
	n->parent = parent;
	n->depth = parent->depth + 1;
	n->hash = h;
	n->sib = parent->kid;
	if (parent->kid)
		parent->kid->sib_prev = n;
	parent->kid = n;
	parent->n_kids++;
	parent->refs++;
	if (c->ops->add(c->ix, n) != KV_OK) {
		parent->kid = n->sib;
		if (n->sib)
			n->sib->sib_prev = NULL;
		parent->n_kids--;
		parent->refs--;
		kv_free(n->tokens);
		free(n);
		return NULL;
	}
	kv_page_ref(page);
	n->page = page;
	c->bytes += node_bytes(c);
	c->n_nodes++;
	if (!clean)
		kc_tree_dirty_push(c, &n->obj);
	return n;
}

/* Free n and then its ancestors while nothing references them. */
void kc_tree_node_gc(struct kc_cache *c, struct kc_node *n, uint64_t *rel)
{
	while (n && n != &c->root && n->refs == 0) {
		struct kc_node *p = n->parent;
		c->ops->del(c->ix, n);
		if (n->sib_prev)
			n->sib_prev->sib = n->sib;
		else
			p->kid = n->sib;
		if (n->sib)
			n->sib->sib_prev = n->sib_prev;
		p->n_kids--;
		p->refs--;
		kc_tree_dirty_unlink(c, &n->obj);
		/* The page is really given back only if we held the last reference
		 * (a live sequence may still use it). */
		if (kv_page_refs(n->page) == 1)
			*rel += c->L.page_bytes;
		kv_page_unref(n->page);
		kv_free(n->tokens);
		*rel += (uint64_t)c->B * sizeof(int32_t);
		c->bytes -= node_bytes(c);
		c->n_nodes--;
		free(n->rx_kids);
		free(n);
		n = p;
	}
}

struct kc_rp *kc_tree_rp_find(struct kc_node *x, const int32_t *tail, uint32_t t)
{
	for (struct kc_rp *r = x->rps; r; r = r->next)
		if (r->t == t && (!t || !kc_tok_cmp(r->tail_tok, tail, t)))
			return r;
	return NULL;
}

/* Copy rows [0, t) of every segment of a page into a compact tail. */
static void rows_to_tail(const struct kc_cache *c, const void *page, uint32_t t, void *tail)
{
	size_t rb = c->L.row_bytes;
	for (int s = 0; s < c->L.n_segments; s++)
		memcpy((char *)tail + (size_t)s * t * rb, (const char *)page + (size_t)s * c->B * rb, (size_t)t * rb);
}

struct kc_rp *kc_tree_rp_new(struct kc_cache *c, struct kc_node *x, const int32_t *tail, uint32_t t,
			    const struct kv_page *page, int clean)
{
	struct kc_rp *r = calloc(1, sizeof *r);
	if (!r) {
		kv_fail(KV_ERR_NOMEM, "prefix cache: cannot allocate a resume point");
		return NULL;
	}
	r->obj.kind = KC_OBJ_RP;
	r->t = t;
	if (t) {
		r->tail_tok = kv_alloc(KV_MEM_CACHE, (size_t)t * sizeof(int32_t));
		r->tail_kv = kv_alloc(KV_MEM_CACHE, (size_t)t * c->L.kv_bytes_per_token);
		if (!r->tail_tok || !r->tail_kv) {
			kv_free(r->tail_tok);
			kv_free(r->tail_kv);
			free(r);
			return NULL;
		}
		memcpy(r->tail_tok, tail, (size_t)t * sizeof(int32_t));
		rows_to_tail(c, page->data, t, r->tail_kv);
	}
	r->node = x;
	r->pos = x->depth * c->B + t;
	r->id = kc_rp_id(x->hash, tail, t);
	x->refs++;
	r->next = x->rps;
	x->rps = r;
	c->bytes += rp_tail_bytes(c, t);
	c->n_rps++;
	if (!clean)
		kc_tree_dirty_push(c, &r->obj);
	return r;
}

void kc_tree_rp_set_snap(struct kc_cache *c, struct kc_rp *r, void *snap)
{
	r->snap = snap;
	c->bytes += c->L.snapshot_bytes;
	c->n_snaps++;
}

void kc_tree_rp_gc(struct kc_cache *c, struct kc_rp *r, uint64_t *rel)
{
	struct kc_node *x = r->node;
	struct kc_rp **pp;
	if (r->refs || r->pins)
		return;
	for (pp = &x->rps; *pp && *pp != r; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = r->next;
	kc_tree_dirty_unlink(c, &r->obj);
	if (r->t) {
		kv_free(r->tail_tok);
		kv_free(r->tail_kv);
		*rel += rp_tail_bytes(c, r->t);
	}
	c->bytes -= rp_tail_bytes(c, r->t);
	c->n_rps--;
	if (r->snap) {
		kv_free(r->snap);
		*rel += c->L.snapshot_bytes;
		c->bytes -= c->L.snapshot_bytes;
		c->n_snaps--;
	}
	free(r);
	x->refs--;
	kc_tree_node_gc(c, x, rel);
}

void kc_tree_through_add(struct kc_cache *c, struct kc_node *x, int delta)
{
	for (; x && x != &c->root; x = x->parent) {
		if (delta > 0) {
			if (x->through >= 1)
				c->dedup += c->L.page_bytes;
			x->through++;
		} else {
			x->through--;
			if (x->through >= 1)
				c->dedup -= c->L.page_bytes;
		}
	}
}

void kc_tree_entry_free(struct kc_cache *c, struct kc_entry *e, uint64_t *rel)
{
	struct kc_rp *end = e->end;
	uint64_t id = e->id;
	uint32_t len = end->pos;

	lru_unlink(c, e);
	kc_tree_dirty_unlink(c, &e->obj);
	kc_tree_through_add(c, end->node, -1);
	end->entry = NULL;
	end->refs--;
	for (uint32_t i = 0; i < e->n_ckpt; i++)
		e->ckpt[i]->refs--;
	/* Checkpoints sit above the end on the same path; collect the end
	 * first so nodes fall away from the bottom up. */
	kc_tree_rp_gc(c, end, rel);
	for (uint32_t i = e->n_ckpt; i-- > 0;)
		kc_tree_rp_gc(c, e->ckpt[i], rel);
	free(e->ckpt);
	free(e);
	c->n_entries--;
	if (c->on_evict)
		c->on_evict(c->evict_ctx, id, len);
}
