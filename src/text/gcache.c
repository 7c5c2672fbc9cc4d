/*
 * gcache.c - compiled grammars by key (gcache.h).
 *
 * A small array of entries with a use counter for LRU (max_entries is
 * tens), and a hash map from the key bytes to the slot.
 */
#include "text/gcache.h"
#include "base/err.h"
#include "base/map.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct slot {
	char *key;                 /* owned; NULL: free slot */
	size_t klen;
	struct kv_grammar *g;      /* one reference held by the cache */
	uint64_t used;             /* last use (the cache's clock) */
};

struct kv_gcache {
	const struct kv_gvocab *v;
	struct kv_grammar_params gp;
	pthread_mutex_t mu;
	struct kv_map *idx;        /* key -> slot */
	struct slot *s;
	int n;
	uint64_t clock;
};

int kv_gcache_create(const struct kv_gvocab *v, const struct kv_gcache_params *p, struct kv_gcache **out)
{
	struct kv_gcache *c = calloc(1, sizeof *c);
	*out = NULL;
	if (!c)
		return kv_fail(KV_ERR_NOMEM, "grammar cache: out of memory");
	c->v = v;
	c->n = p && p->max_entries > 0 ? p->max_entries : 64;
	c->gp.cache_bytes = p && p->grammar_cache_bytes ? p->grammar_cache_bytes : (size_t)16 << 20;
	c->s = calloc((size_t)c->n, sizeof *c->s);
	c->idx = kv_map_create((size_t)c->n * 2);
	if (!c->s || !c->idx) {
		kv_gcache_free(c);
		return kv_fail(KV_ERR_NOMEM, "grammar cache: out of memory");
	}
	pthread_mutex_init(&c->mu, NULL);
	*out = c;
	return KV_OK;
}

void kv_gcache_free(struct kv_gcache *c)
{
	if (!c)
		return;
	if (c->s) {
		for (int i = 0; i < c->n; i++) {
			free(c->s[i].key);
			kv_grammar_unref(c->s[i].g);
		}
		pthread_mutex_destroy(&c->mu);
	}
	free(c->s);
	kv_map_destroy(c->idx);
	free(c);
}

int kv_gcache_get(struct kv_gcache *c, const void *key, size_t klen, kv_gcache_build_fn build, void *ctx,
		  struct kv_grammar **out, int *hit)
{
	uint64_t at;
	*out = NULL;
	if (hit)
		*hit = 0;
	pthread_mutex_lock(&c->mu);
	if (kv_map_get(c->idx, key, klen, &at)) {
		struct slot *s = &c->s[at];
		s->used = ++c->clock;
		*out = kv_grammar_ref(s->g);
		pthread_mutex_unlock(&c->mu);
		if (hit)
			*hit = 1;
		return KV_OK;
	}
	pthread_mutex_unlock(&c->mu);
	/* a miss: build and compile outside the lock */
	struct kv_gram *ir = NULL;
	struct kv_grammar *g = NULL;
	int rc = build(ctx, &ir);
	if (!rc)
		rc = kv_grammar_create(ir, c->v, &c->gp, &g);
	kv_gram_free(ir);
	if (rc)
		return rc;
	char *k = malloc(klen ? klen : 1);
	if (!k) {
		kv_grammar_unref(g);
		return kv_fail(KV_ERR_NOMEM, "grammar cache: out of memory");
	}
	memcpy(k, key, klen);
	pthread_mutex_lock(&c->mu);
	if (kv_map_get(c->idx, key, klen, &at)) { /* another request was first */
		struct slot *s = &c->s[at];
		s->used = ++c->clock;
		*out = kv_grammar_ref(s->g);
		pthread_mutex_unlock(&c->mu);
		free(k);
		kv_grammar_unref(g);
		return KV_OK;
	}
	int victim = 0;
	for (int i = 0; i < c->n; i++) {
		if (!c->s[i].key) {
			victim = i;
			break;
		}
		if (c->s[i].used < c->s[victim].used)
			victim = i;
	}
	struct slot *s = &c->s[victim];
	struct kv_grammar *old = s->g;
	if (s->key) {
		kv_map_del(c->idx, s->key, s->klen);
		free(s->key);
	}
	*s = (struct slot){k, klen, g, ++c->clock};
	if (kv_map_put(c->idx, k, klen, (uint64_t)victim)) {
		free(k);
		*s = (struct slot){0};
		pthread_mutex_unlock(&c->mu);
		kv_grammar_unref(old);
		*out = g; /* not cached, still usable */
		return KV_OK;
	}
	*out = kv_grammar_ref(g);
	pthread_mutex_unlock(&c->mu);
	kv_grammar_unref(old); /* matchers may still hold it */
	return KV_OK;
}
