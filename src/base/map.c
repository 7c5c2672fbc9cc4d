/*
 * map.c - see map.h.
 *
 * Slot: hash (0 = empty; real hashes are forced non-zero), key offset and
 * length in the arena, value. Capacity is a power of two, load <= 0.7.
 */
#include "base/map.h"
#include "base/err.h"
#include "base/hash.h"

#include <stdlib.h>
#include <string.h>

struct slot {
	uint64_t h;
	uint64_t koff;
	uint32_t klen;
	uint64_t val;
};

struct kv_map {
	struct slot *s;
	size_t cap;      /* power of two */
	size_t n;        /* live entries */
	char *arena;
	size_t alen, acap;
	size_t garbage;  /* arena bytes of deleted keys */
};

static uint64_t hkey(const void *k, size_t n)
{
	uint64_t h = kv_xxh3_64(k, n, 0x6b766b6570ull);
	return h ? h : 1;
}

struct kv_map *kv_map_create(size_t expected)
{
	struct kv_map *m = calloc(1, sizeof *m);
	size_t cap = 16;
	if (!m)
		return NULL;
	while (cap * 7 / 10 < expected)
		cap *= 2;
	m->s = calloc(cap, sizeof *m->s);
	if (!m->s) {
		free(m);
		return NULL;
	}
	m->cap = cap;
	return m;
}

void kv_map_destroy(struct kv_map *m)
{
	if (!m)
		return;
	free(m->s);
	free(m->arena);
	free(m);
}

static int arena_add(struct kv_map *m, const void *k, size_t n, uint64_t *off)
{
	if (m->alen + n > m->acap) {
		size_t nc = m->acap ? m->acap : 256;
		while (nc < m->alen + n)
			nc *= 2;
		char *na = realloc(m->arena, nc);
		if (!na)
			return -1;
		m->arena = na;
		m->acap = nc;
	}
	if (n)
		memcpy(m->arena + m->alen, k, n);
	*off = m->alen;
	m->alen += n;
	return 0;
}

static int grow(struct kv_map *m, size_t ncap)
{
	struct slot *ns = calloc(ncap, sizeof *ns);
	char *na = NULL;
	size_t alen = 0, acap = m->alen - m->garbage;
	if (!ns)
		return -1;
	if (acap) {
		na = malloc(acap);
		if (!na) {
			free(ns);
			return -1;
		}
	}
	for (size_t i = 0; i < m->cap; i++) {
		struct slot *o = &m->s[i];
		if (!o->h)
			continue;
		size_t j = o->h & (ncap - 1);
		while (ns[j].h)
			j = (j + 1) & (ncap - 1);
		ns[j] = *o;
		memcpy(na + alen, m->arena + o->koff, o->klen);
		ns[j].koff = alen;
		alen += o->klen;
	}
	free(m->s);
	free(m->arena);
	m->s = ns;
	m->cap = ncap;
	m->arena = na;
	m->alen = alen;
	m->acap = acap;
	m->garbage = 0;
	return 0;
}

static size_t find(const struct kv_map *m, const void *k, size_t n, uint64_t h)
{
	size_t j = h & (m->cap - 1);
	while (m->s[j].h) {
		if (m->s[j].h == h && m->s[j].klen == n && !memcmp(m->arena + m->s[j].koff, k, n))
			return j;
		j = (j + 1) & (m->cap - 1);
	}
	return (size_t)-1;
}

int kv_map_put(struct kv_map *m, const void *key, size_t klen, uint64_t val)
{
	uint64_t h = hkey(key, klen), off;
	size_t j;
	if (klen > UINT32_MAX)
		return kv_fail(KV_ERR_INVALID, "map key too long");
	j = find(m, key, klen, h);
	if (j != (size_t)-1) {
		m->s[j].val = val;
		return KV_OK;
	}
	if ((m->n + 1) * 10 > m->cap * 7 && grow(m, m->cap * 2))
		return kv_fail(KV_ERR_NOMEM, "map grow failed");
	if (arena_add(m, key, klen, &off))
		return kv_fail(KV_ERR_NOMEM, "map arena grow failed");
	j = h & (m->cap - 1);
	while (m->s[j].h)
		j = (j + 1) & (m->cap - 1);
	m->s[j] = (struct slot){h, off, (uint32_t)klen, val};
	m->n++;
	return KV_OK;
}

int kv_map_get(const struct kv_map *m, const void *key, size_t klen, uint64_t *val)
{
	size_t j = find(m, key, klen, hkey(key, klen));
	if (j == (size_t)-1)
		return 0;
	if (val)
		*val = m->s[j].val;
	return 1;
}

int kv_map_del(struct kv_map *m, const void *key, size_t klen)
{
	size_t j = find(m, key, klen, hkey(key, klen)), mask = m->cap - 1;
	if (j == (size_t)-1)
		return 0;
	m->garbage += m->s[j].klen;
	m->s[j].h = 0;
	m->n--;
	/* Backward-shift: move later members of the probe run into the hole. */
	size_t i = (j + 1) & mask;
	while (m->s[i].h) {
		size_t home = m->s[i].h & mask;
		/* Move s[i] to j if its home is not in (j, i] cyclically. */
		int move = (j <= i) ? (home <= j || home > i) : (home <= j && home > i);
		if (move) {
			m->s[j] = m->s[i];
			m->s[i].h = 0;
			j = i;
		}
		i = (i + 1) & mask;
	}
	if (m->garbage > 4096 && m->garbage > m->alen / 2)
		grow(m, m->cap); /* compaction; failure just keeps the garbage */
	return 1;
}

size_t kv_map_count(const struct kv_map *m)
{
	return m->n;
}

void kv_map_clear(struct kv_map *m)
{
	memset(m->s, 0, m->cap * sizeof *m->s);
	m->n = 0;
	m->alen = 0;
	m->garbage = 0;
}

int kv_map_next(const struct kv_map *m, size_t *it, const void **key, size_t *klen, uint64_t *val)
{
	while (*it < m->cap) {
		const struct slot *s = &m->s[(*it)++];
		if (!s->h)
			continue;
		if (key)
			*key = m->arena + s->koff;
		if (klen)
			*klen = s->klen;
		if (val)
			*val = s->val;
		return 1;
	}
	return 0;
}
