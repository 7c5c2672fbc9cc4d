/*
 * tenant.h - per-request cache salts (--allow-request-salt).
 *
 * The namespace of the cache is the model fingerprint plus a salt
 * (DESIGN.md 4, store/ns.h). The server's own salt (--cache-salt) names
 * the default tier. With --allow-request-salt a request may carry a
 * "cache_salt" string: requests with the same salt share a namespace of
 * their own - a RAM cache and a disk folder that no other salt reads -
 * and reuse each other's prefixes like any session does.
 *
 * A tier is a RAM cache plus its disk store (NULL when the server has no
 * disk tier). Salted tiers are created on first use, at most
 * KSV_MAX_TENANTS of them; the least recently used one is closed to make
 * room (its unsaved objects are flushed with a short budget first). The
 * byte budget of the RAM tier is shared: with k salted tiers open, each of
 * the k + 1 caches gets 1 / (k + 1) of it, so salts never raise the
 * process's cache memory.
 *
 * Threads: tiers are created and closed only by the generation (scheduler)
 * thread through ksv_tenant_get; readers on other threads (the probe
 * route, metrics) hold the tenant lock while they use a tier.
 */
#ifndef KV_SERVER_TENANT_H
#define KV_SERVER_TENANT_H

#include <stdint.h>

#include "cache/cache.h"
#include "store/store.h"

#define KSV_MAX_TENANTS 8

struct ksv_server;

struct ksv_tier {
	struct kc_cache *cache;
	struct ks_store *store;   /* NULL: no disk tier */
};

struct ksv_tenant {
	char *salt;               /* malloc'd request salt */
	struct ksv_tier tier;
	uint64_t last_use_ns;
};

/*
 * The tier of a request: the default one for salt NULL or "", else the
 * salt's own (created if needed). Scheduler thread only. KV_OK, or
 * KV_ERR_NOMEM / KV_ERR_INVALID when a new tier cannot be made.
 */
int ksv_tenant_get(struct ksv_server *s, const char *salt, struct ksv_tier *out);
/* Lock / unlock the tenant table (for readers on other threads). */
void ksv_tenant_lock(struct ksv_server *s);
void ksv_tenant_unlock(struct ksv_server *s);
/* With the lock held: the salt's tier if it is open, else NULL. */
const struct ksv_tier *ksv_tenant_find(struct ksv_server *s, const char *salt);
/* Shutdown: flush every salted tier's store within budget_s in total,
 * most recently used first. Returns the seconds used. */
double ksv_tenant_flush_all(struct ksv_server *s, double budget_s);
/* Close every salted tier (stores first, then caches). */
void ksv_tenant_close_all(struct ksv_server *s);
/* Open salted tiers now. */
int ksv_tenant_count(struct ksv_server *s);

#endif
