/*
 * echo.c - see echo.h.
 *
 * Records live in one malloc'd block each (header, key, reasoning, text,
 * tokens), on a doubly linked LRU list, found through an open-addressing
 * table keyed by the key's 128-bit hash (the key bytes are then compared).
 * Sizes are small (an answer is a few KB to a few hundred KB), so the
 * block is copied out whole on a hit: the caller holds no lock afterwards.
 */
#include "cache/echo.h"
#include "base/err.h"
#include "base/mem.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct rec {
	struct rec *prev, *next;   /* LRU: head = most recent */
	struct kv_h128 id;         /* of the key alone: records that differ only
	                              in their reasoning share it */
	uint64_t used;             /* last put or hit (a store-wide counter) */
	size_t bytes;              /* this block */
	int dirty;
	struct kc_echo_rec r;      /* pointers into this block */
};

struct kc_echo {
	pthread_mutex_t mu;
	uint64_t budget, bytes;
	struct rec *head, *tail;
	struct rec **slot;         /* open addressing, tombstones = TOMB */
	size_t cap, used, live;
	struct kc_echo_stats st;
	uint64_t tick;
};

static struct rec tomb_rec;
#define TOMB (&tomb_rec)

struct kv_h128 kc_echo_id(const char *key, size_t key_len)
{
	return kv_xxh3_128(key, key_len, 0x6563686f6b657931ull); /* "echokey1" */
}

int kc_echo_create(uint64_t budget, struct kc_echo **out)
{
	struct kc_echo *e = calloc(1, sizeof *e);
	*out = NULL;
	if (!e)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	e->budget = budget;
	e->cap = 64;
	e->slot = calloc(e->cap, sizeof *e->slot);
	if (!e->slot) {
		free(e);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	pthread_mutex_init(&e->mu, NULL);
	*out = e;
	return KV_OK;
}

static void rec_free(struct kc_echo *e, struct rec *r)
{
	e->bytes -= r->bytes;
	kv_free(r);
}

void kc_echo_destroy(struct kc_echo *e)
{
	if (!e)
		return;
	for (struct rec *r = e->head, *n; r; r = n) {
		n = r->next;
		rec_free(e, r);
	}
	free(e->slot);
	pthread_mutex_destroy(&e->mu);
	free(e);
}

static size_t slot_of(const struct kc_echo *e, struct kv_h128 id)
{
	return (size_t)(id.lo ^ (id.hi * 0x9E3779B97F4A7C15ull)) & (e->cap - 1);
}

static int same_reasoning(const struct rec *r, const char *reasoning, size_t n)
{
	return r->r.reasoning_len == n && (!n || !memcmp(r->r.reasoning, reasoning, n));
}

/*
 * The slot of the record with this key. Several records may share a key
 * (answers that differ only in their reasoning, e.g. reasoning alone and
 * no content): exact = 1 wants the one with exactly this reasoning (put,
 * and lookups of a message that carries reasoning); exact = 0 the most
 * recently used of them (a message whose reasoning the client dropped).
 */
static struct rec **find(struct kc_echo *e, struct kv_h128 id, const char *key, size_t key_len, const char *reasoning,
			 size_t rlen, int exact)
{
	struct rec **best = NULL;
	for (size_t i = slot_of(e, id), k = 0; k < e->cap; i = (i + 1) & (e->cap - 1), k++) {
		struct rec *r = e->slot[i];
		if (!r)
			break;
		if (r == TOMB || !kv_h128_eq(r->id, id) || r->r.key_len != key_len || memcmp(r->r.key, key, key_len))
			continue;
		if (exact ? same_reasoning(r, reasoning, rlen) : (!best || r->used > (*best)->used))
			best = &e->slot[i];
		if (exact && best)
			break;
	}
	return best;
}

static int grow(struct kc_echo *e)
{
	size_t nc = e->cap * 2;
	struct rec **ns = calloc(nc, sizeof *ns);
	if (!ns)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < e->cap; i++) {
		struct rec *r = e->slot[i];
		if (!r || r == TOMB)
			continue;
		size_t j = (size_t)(r->id.lo ^ (r->id.hi * 0x9E3779B97F4A7C15ull)) & (nc - 1);
		while (ns[j])
			j = (j + 1) & (nc - 1);
		ns[j] = r;
	}
	free(e->slot);
	e->slot = ns;
	e->cap = nc;
	e->used = e->live;
	return KV_OK;
}

static void lru_unlink(struct kc_echo *e, struct rec *r)
{
	if (r->prev)
		r->prev->next = r->next;
	else
		e->head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		e->tail = r->prev;
	r->prev = r->next = NULL;
}

static void lru_front(struct kc_echo *e, struct rec *r)
{
	r->next = e->head;
	r->prev = NULL;
	if (e->head)
		e->head->prev = r;
	e->head = r;
	if (!e->tail)
		e->tail = r;
}

/* Remove r from the table and the list and free it (lock held). */
static void drop(struct kc_echo *e, struct rec *r)
{
	struct rec **s = find(e, r->id, r->r.key, r->r.key_len, r->r.reasoning, r->r.reasoning_len, 1);
	if (s) {
		*s = TOMB;
		e->live--;
	}
	lru_unlink(e, r);
	rec_free(e, r);
}

/* One block holding a copy of r: counted as cache memory (kv_alloc) when
 * the store keeps it, a plain malloc for a caller's copy (free()). */
static struct rec *rec_copy(const struct kc_echo_rec *in, int kept)
{
	size_t bytes = sizeof(struct rec) + in->n_tokens * sizeof(int32_t) + in->key_len + in->reasoning_len +
		       in->text_len + 3;
	struct rec *r = kept ? kv_alloc(KV_MEM_CACHE, bytes) : malloc(bytes);
	if (!r)
		return NULL;
	memset(r, 0, sizeof *r);
	r->bytes = bytes;
	char *p = (char *)(r + 1);
	int32_t *tok = (int32_t *)p; /* tokens first: aligned after the header */
	memcpy(tok, in->tokens, in->n_tokens * sizeof(int32_t));
	p += in->n_tokens * sizeof(int32_t);
	char *key = p;
	memcpy(key, in->key, in->key_len);
	key[in->key_len] = 0;
	p += in->key_len + 1;
	char *rs = p;
	if (in->reasoning_len)
		memcpy(rs, in->reasoning, in->reasoning_len);
	rs[in->reasoning_len] = 0;
	p += in->reasoning_len + 1;
	char *tx = p;
	memcpy(tx, in->text, in->text_len);
	tx[in->text_len] = 0;
	r->r = (struct kc_echo_rec){.key = key, .key_len = in->key_len, .reasoning = rs,
				    .reasoning_len = in->reasoning_len, .text = tx, .text_len = in->text_len,
				    .tokens = tok, .n_tokens = in->n_tokens};
	return r;
}

int kc_echo_put(struct kc_echo *e, const struct kc_echo_rec *in, int dirty)
{
	struct rec *r = rec_copy(in, 1);
	if (!r)
		return kv_fail(KV_ERR_NOMEM, "out of memory for an answer record");
	r->id = kc_echo_id(in->key, in->key_len);
	r->dirty = dirty;
	pthread_mutex_lock(&e->mu);
	if (r->bytes > e->budget) {
		pthread_mutex_unlock(&e->mu);
		kv_free(r);
		return KV_OK; /* larger than the whole store: not kept */
	}
	struct rec **old = find(e, r->id, in->key, in->key_len, in->reasoning, in->reasoning_len, 1);
	if (old)
		drop(e, *old);
	r->used = ++e->tick;
	while (e->bytes + r->bytes > e->budget && e->tail) {
		drop(e, e->tail);
		e->st.evictions++;
	}
	if ((e->used + 1) * 4 > e->cap * 3 && grow(e)) {
		pthread_mutex_unlock(&e->mu);
		kv_free(r);
		return KV_ERR_NOMEM;
	}
	size_t i = slot_of(e, r->id);
	while (e->slot[i] && e->slot[i] != TOMB)
		i = (i + 1) & (e->cap - 1);
	if (!e->slot[i])
		e->used++;
	e->slot[i] = r;
	e->live++;
	e->bytes += r->bytes;
	lru_front(e, r);
	e->st.puts++;
	pthread_mutex_unlock(&e->mu);
	return KV_OK;
}

/* A copy of r's record in one block the caller frees. */
static int copy_out(const struct rec *r, struct kc_echo_rec *out, void **block)
{
	struct rec *c = rec_copy(&r->r, 0);
	if (!c)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	*out = c->r;
	*block = c;
	return KV_OK;
}

int kc_echo_get(struct kc_echo *e, const char *key, size_t key_len, const char *reasoning, size_t reasoning_len,
		struct kc_echo_rec *out, void **out_block)
{
	int rc = KV_ERR_NOT_FOUND;
	*out_block = NULL;
	struct kv_h128 id = kc_echo_id(key, key_len);
	pthread_mutex_lock(&e->mu);
	struct rec **s = find(e, id, key, key_len, reasoning, reasoning_len, reasoning_len > 0);
	if (s) {
		(*s)->used = ++e->tick;
		lru_unlink(e, *s);
		lru_front(e, *s);
		rc = copy_out(*s, out, out_block);
		e->st.hits++;
	} else {
		e->st.misses++;
	}
	pthread_mutex_unlock(&e->mu);
	return rc;
}

size_t kc_echo_take_dirty(struct kc_echo *e, struct kc_echo_rec *out, void **blocks, size_t max)
{
	size_t n = 0;
	pthread_mutex_lock(&e->mu);
	for (struct rec *r = e->head; r && n < max; r = r->next) {
		if (!r->dirty)
			continue;
		if (copy_out(r, &out[n], &blocks[n]))
			break;
		r->dirty = 0;
		n++;
	}
	pthread_mutex_unlock(&e->mu);
	return n;
}

void kc_echo_stats(struct kc_echo *e, struct kc_echo_stats *out)
{
	pthread_mutex_lock(&e->mu);
	*out = e->st;
	out->records = e->live;
	out->bytes = e->bytes;
	out->budget = e->budget;
	pthread_mutex_unlock(&e->mu);
}

void kc_echo_clear(struct kc_echo *e)
{
	pthread_mutex_lock(&e->mu);
	while (e->head)
		drop(e, e->head);
	memset(e->slot, 0, e->cap * sizeof *e->slot);
	e->used = e->live = 0;
	pthread_mutex_unlock(&e->mu);
}
