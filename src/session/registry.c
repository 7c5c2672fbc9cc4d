/*
 * registry.c - see registry.h.
 */
#include "session/registry.h"
#include "cache/echo.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "store/ns.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct salted {
	char *salt;               /* malloc'd request salt */
	struct kss_tier tier;
	struct kv_h128 ns;
	uint64_t last_use_ns;
	int users;                /* requests holding the tier now */
};

struct kss_registry {
	struct kss_registry_params p;
	pthread_mutex_t mu;
	struct salted salted[KSS_MAX_SALTED];
	int n;
	struct kc_stats closed;   /* counters of the salted caches closed so far */
};

/* Counters of a into acc; sizes too when `sizes`. */
static void add_stats(struct kc_stats *acc, const struct kc_stats *a, int sizes)
{
	acc->lookups += a->lookups;
	acc->hits += a->hits;
	acc->misses += a->misses;
	acc->tokens_saved += a->tokens_saved;
	acc->evictions += a->evictions;
	acc->pressure_evictions += a->pressure_evictions;
	acc->nontrim_skips += a->nontrim_skips;
	acc->snaps += a->snaps;
	acc->stores += a->stores;
	acc->superseded += a->superseded;
	acc->dedup_bytes_saved += a->dedup_bytes_saved;
	if (sizes) {
		acc->bytes_in_use += a->bytes_in_use;
		acc->cap_bytes += a->cap_bytes;
		acc->entries += a->entries;
		acc->nodes += a->nodes;
		acc->rps += a->rps;
		acc->snapshots += a->snapshots;
	}
}

int kss_registry_create(const struct kss_registry_params *p, struct kss_registry **out)
{
	*out = NULL;
	if (!p->cache)
		return kv_fail(KV_ERR_INVALID, "registry: the default namespace's cache is needed");
	struct kss_registry *r = calloc(1, sizeof *r);
	if (!r)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	r->p = *p;
	pthread_mutex_init(&r->mu, NULL);
	*out = r;
	return KV_OK;
}

/* Give each of the 1 + n caches an equal share of the budget. Lock held. */
static void share_budget(struct kss_registry *r)
{
	if (!r->p.budget_total)
		return;
	uint64_t share = r->p.budget_total / (uint64_t)(1 + r->n);
	kc_cache_set_budget(r->p.cache, share);
	for (int i = 0; i < r->n; i++)
		kc_cache_set_budget(r->salted[i].tier.cache, share);
}

static void close_salted(struct kss_registry *r, struct salted *t, double flush_s)
{
	struct kc_stats st;
	kc_cache_stats(t->tier.cache, &st);
	add_stats(&r->closed, &st, 0);
	if (t->tier.store) {
		if (flush_s > 0)
			ks_store_flush(t->tier.store, flush_s, NULL);
		ks_store_close(t->tier.store); /* before the cache: its writer holds views */
	}
	kc_cache_destroy(t->tier.cache);
	free(t->salt);
	memset(t, 0, sizeof *t);
}

void kss_registry_destroy(struct kss_registry *r)
{
	if (!r)
		return;
	for (int i = 0; i < r->n; i++)
		close_salted(r, &r->salted[i], 0);
	pthread_mutex_destroy(&r->mu);
	free(r);
}

/* The namespace salt of a request salt, derived from the default
 * namespace (fixed 16 bytes: fingerprint + --cache-salt), so two servers
 * with different --cache-salt never share a request salt's files, and no
 * choice of the two salts can make another pair's bytes (a plain
 * concatenation could). */
static struct kv_h128 salted_ns(const struct kss_registry *r, const char *salt, int *ok)
{
	size_t b = strlen(salt);
	char *s = malloc(b + 16);
	struct kv_h128 ns = {0, 0};
	*ok = s != NULL;
	if (s) {
		snprintf(s, b + 16, "request:%s", salt);
		ns = ks_ns_derive(r->p.ns, s);
		free(s);
	}
	return ns;
}

int kss_registry_get(struct kss_registry *r, const char *salt, struct kss_tier *out)
{
	int rc, ok;
	if (!salt) {
		out->cache = r->p.cache;
		out->store = r->p.store;
		return KV_OK;
	}
	if (!*salt)
		return kv_fail(KV_ERR_INVALID, "an empty cache salt names no namespace");
	pthread_mutex_lock(&r->mu);
	for (int i = 0; i < r->n; i++) {
		if (!strcmp(r->salted[i].salt, salt)) {
			r->salted[i].last_use_ns = kv_now_ns();
			r->salted[i].users++;
			*out = r->salted[i].tier;
			pthread_mutex_unlock(&r->mu);
			return KV_OK;
		}
	}
	if (r->n == KSS_MAX_SALTED) {
		/* close the least recently used idle salt to make room */
		int v = -1;
		for (int i = 0; i < r->n; i++)
			if (!r->salted[i].users && (v < 0 || r->salted[i].last_use_ns < r->salted[v].last_use_ns))
				v = i;
		if (v < 0) {
			pthread_mutex_unlock(&r->mu);
			return kv_fail(KV_ERR_FULL, "all %d cache salt namespaces have requests running", KSS_MAX_SALTED);
		}
		KV_INFO("serve.salt_closed", "tenants=%d msg=\"least recently used cache salt closed to make room\"", r->n);
		close_salted(r, &r->salted[v], 0.5);
		r->salted[v] = r->salted[--r->n];
	}
	struct salted *t = &r->salted[r->n];
	memset(t, 0, sizeof *t);
	t->ns = salted_ns(r, salt, &ok);
	t->salt = strdup(salt);
	if (!ok || !t->salt) {
		free(t->salt);
		t->salt = NULL;
		pthread_mutex_unlock(&r->mu);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	struct kc_params cp = r->p.cache_params;
	cp.ns = t->ns;
	if ((rc = kc_cache_create(&cp, &t->tier.cache))) {
		free(t->salt);
		t->salt = NULL;
		pthread_mutex_unlock(&r->mu);
		return rc;
	}
	if (r->p.open_store)
		r->p.open_store(r->p.ctx, cp.ns, t->tier.cache, &t->tier.store);
	if (t->tier.store)
		ks_store_start_scan(t->tier.store);
	t->last_use_ns = kv_now_ns();
	t->users = 1;
	r->n++;
	share_budget(r);
	char nsx[33];
	kv_h128_hex(cp.ns, nsx);
	KV_INFO("serve.salt_opened", "namespace=%s tenants=%d disk=%d", nsx, r->n, t->tier.store != NULL);
	*out = t->tier;
	pthread_mutex_unlock(&r->mu);
	return KV_OK;
}

void kss_registry_put(struct kss_registry *r, const struct kss_tier *t)
{
	if (!t->cache || t->cache == r->p.cache)
		return;
	pthread_mutex_lock(&r->mu);
	for (int i = 0; i < r->n; i++)
		if (r->salted[i].tier.cache == t->cache && r->salted[i].users > 0)
			r->salted[i].users--;
	pthread_mutex_unlock(&r->mu);
}

void kss_registry_each(struct kss_registry *r, void (*fn)(void *ctx, const struct kss_tier *t, struct kv_h128 ns, int salted),
		       void *ctx)
{
	struct kss_tier d = {r->p.cache, r->p.store};
	pthread_mutex_lock(&r->mu);
	fn(ctx, &d, r->p.ns, 0);
	for (int i = 0; i < r->n; i++)
		fn(ctx, &r->salted[i].tier, r->salted[i].ns, 1);
	pthread_mutex_unlock(&r->mu);
}

int kss_registry_with(struct kss_registry *r, const char *salt, void (*fn)(void *ctx, const struct kss_tier *t), void *ctx)
{
	int found = 0;
	pthread_mutex_lock(&r->mu);
	if (!salt) {
		struct kss_tier d = {r->p.cache, r->p.store};
		fn(ctx, &d);
		found = 1;
	}
	for (int i = 0; salt && i < r->n && !found; i++)
		if (!strcmp(r->salted[i].salt, salt)) {
			fn(ctx, &r->salted[i].tier);
			found = 1;
		}
	pthread_mutex_unlock(&r->mu);
	return found;
}

/* Lock held. */
static void sum_stats(struct kss_registry *r, struct kc_stats *out)
{
	struct kc_stats st;
	kc_cache_stats(r->p.cache, out);
	add_stats(out, &r->closed, 0);
	for (int i = 0; i < r->n; i++) {
		kc_cache_stats(r->salted[i].tier.cache, &st);
		add_stats(out, &st, 1);
	}
}

void kss_registry_stats(struct kss_registry *r, struct kc_stats *out)
{
	pthread_mutex_lock(&r->mu);
	sum_stats(r, out);
	pthread_mutex_unlock(&r->mu);
}

void kss_registry_clear(struct kss_registry *r, struct kc_stats *before, struct kc_stats *after)
{
	struct kc_stats tmp;
	pthread_mutex_lock(&r->mu);
	sum_stats(r, before ? before : &tmp);
	kc_cache_clear(r->p.cache);
	if (kc_cache_echo(r->p.cache))
		kc_echo_clear(kc_cache_echo(r->p.cache));
	for (int i = 0; i < r->n; i++) {
		kc_cache_clear(r->salted[i].tier.cache);
		if (kc_cache_echo(r->salted[i].tier.cache))
			kc_echo_clear(kc_cache_echo(r->salted[i].tier.cache));
	}
	sum_stats(r, after ? after : &tmp);
	pthread_mutex_unlock(&r->mu);
}

double kss_registry_flush_salted(struct kss_registry *r, double budget_s)
{
	uint64_t t0 = kv_now_ns();
	int order[KSS_MAX_SALTED];
	pthread_mutex_lock(&r->mu);
	int n = r->n;
	for (int i = 0; i < n; i++)
		order[i] = i;
	/* most recently used first */
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && r->salted[order[j]].last_use_ns > r->salted[order[j - 1]].last_use_ns; j--) {
			int x = order[j];
			order[j] = order[j - 1];
			order[j - 1] = x;
		}
	for (int i = 0; i < n; i++) {
		double left = budget_s - (double)(kv_now_ns() - t0) / 1e9;
		if (left <= 0)
			break;
		if (r->salted[order[i]].tier.store)
			ks_store_flush(r->salted[order[i]].tier.store, left, NULL);
	}
	pthread_mutex_unlock(&r->mu);
	return (double)(kv_now_ns() - t0) / 1e9;
}

int kss_registry_salted(struct kss_registry *r)
{
	pthread_mutex_lock(&r->mu);
	int n = r->n;
	pthread_mutex_unlock(&r->mu);
	return n;
}
