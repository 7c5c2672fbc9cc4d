/*
 * registry.h - the cache namespaces a server serves: the default one and
 * the salted ones (--allow-request-salt), each a RAM cache plus its disk
 * tier, with one shared byte budget.
 *
 * The namespace of the cache is the model fingerprint plus a salt
 * (docs/cache.md, store/ns.h). The server's own salt (--cache-salt) names
 * the default namespace. With --allow-request-salt a request may carry a
 * "cache_salt" string: requests with the same salt share a namespace of
 * their own - a RAM cache and a disk folder that no other salt reads -
 * and reuse each other's prefixes like any session does. A salt is a byte
 * string without NUL; its namespace derives from the default namespace
 * (fixed 16 bytes) and "request:" + salt, so no pair of server and request
 * salts can name another pair's namespace.
 *
 * Salted namespaces are opened on first use, at most KSS_MAX_SALTED of
 * them; the least recently used one is closed to make room (its unsaved
 * objects are flushed with a short budget first). The RAM budget is
 * shared: with k salted namespaces open, each of the k + 1 caches gets
 * 1 / (k + 1) of it, so salts never raise the process's cache memory.
 *
 * Threads: every function locks the registry. A tier handed out by
 * kss_registry_get stays open while the request that got it runs: a
 * namespace with running requests is never closed (its use count), so the
 * LRU close picks an idle one, and a request finds every namespace open
 * when none is idle (KV_ERR_FULL).
 */
#ifndef KV_SESSION_REGISTRY_H
#define KV_SESSION_REGISTRY_H

#include <stdint.h>

#include "base/hash.h"
#include "cache/cache.h"
#include "store/store.h"

#define KSS_MAX_SALTED 8

struct kss_tier {
	struct kc_cache *cache;
	struct ks_store *store;   /* NULL: no disk tier */
};

struct kss_registry_params {
	struct kc_cache *cache;   /* the default namespace's (borrowed: the caller destroys it) */
	struct ks_store *store;   /* and its disk tier, or NULL (borrowed) */
	struct kv_h128 ns;        /* the default namespace */
	struct kc_params cache_params; /* what salted caches are made with (ns replaced) */
	uint64_t budget_total;    /* RAM budget shared by all caches (0: no sharing) */
	/* Opens the disk tier of a salted namespace over its cache (*out NULL:
	 * none). Called with the registry locked. */
	void (*open_store)(void *ctx, struct kv_h128 ns, struct kc_cache *cache, struct ks_store **out);
	void *ctx;
};

struct kss_registry;

int kss_registry_create(const struct kss_registry_params *p, struct kss_registry **out);
/* Closes every salted namespace (stores first, then caches); the default
 * one stays the caller's. NULL ok. */
void kss_registry_destroy(struct kss_registry *r);

/*
 * The tier of a request: the default one for salt NULL, else the salt's
 * own (opened if needed). Pair with kss_registry_put. KV_OK, KV_ERR_FULL
 * (every salted namespace busy), KV_ERR_NOMEM / KV_ERR_INVALID when a new
 * one cannot be made.
 */
int kss_registry_get(struct kss_registry *r, const char *salt, struct kss_tier *out);
/* The request that got tier t is done with it. */
void kss_registry_put(struct kss_registry *r, const struct kss_tier *t);

/* Visit every open namespace, the default first (salted: 1), with the
 * registry locked: fn must not call the registry. */
void kss_registry_each(struct kss_registry *r, void (*fn)(void *ctx, const struct kss_tier *t, struct kv_h128 ns, int salted),
		       void *ctx);
/* With a salt's tier open: fn(ctx, tier) with the registry locked (probe);
 * returns 0 when that namespace is not open (fn not called). */
int kss_registry_with(struct kss_registry *r, const char *salt, void (*fn)(void *ctx, const struct kss_tier *t), void *ctx);

/*
 * Prefix-cache statistics of every namespace together: counters summed
 * over the open ones and those closed since start (so they never go
 * down), sizes summed over the open ones, lookup latency quantiles of the
 * default namespace.
 */
void kss_registry_stats(struct kss_registry *r, struct kc_stats *out);
/* Drop every namespace's RAM entries (POST /v1/cache/clear); *before and
 * *after (may be NULL) get the summed statistics around it. */
void kss_registry_clear(struct kss_registry *r, struct kc_stats *before, struct kc_stats *after);

/* Shutdown: flush every salted namespace's store within budget_s in
 * total, most recently used first. Returns the seconds used. */
double kss_registry_flush_salted(struct kss_registry *r, double budget_s);
/* Salted namespaces open now. */
int kss_registry_salted(struct kss_registry *r);

#endif
