/*
 * tenant.c - per-request cache salts. See tenant.h.
 */
#include "server/tenant.h"
#include "server/server_int.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "store/ns.h"

#include <stdlib.h>
#include <string.h>

void ksv_tenant_lock(struct ksv_server *s)
{
	pthread_mutex_lock(&s->tenant_lock);
}

void ksv_tenant_unlock(struct ksv_server *s)
{
	pthread_mutex_unlock(&s->tenant_lock);
}

int ksv_tenant_count(struct ksv_server *s)
{
	ksv_tenant_lock(s);
	int n = s->n_tenants;
	ksv_tenant_unlock(s);
	return n;
}

const struct ksv_tier *ksv_tenant_find(struct ksv_server *s, const char *salt)
{
	for (int i = 0; i < s->n_tenants; i++)
		if (!strcmp(s->tenants[i].salt, salt))
			return &s->tenants[i].tier;
	return NULL;
}

/* Give each of the 1 + n_tenants caches an equal share of the budget. */
static void share_budget(struct ksv_server *s)
{
	if (!s->budget_total)
		return;
	uint64_t share = s->budget_total / (uint64_t)(1 + s->n_tenants);
	kc_cache_set_budget(s->cache, share);
	for (int i = 0; i < s->n_tenants; i++)
		kc_cache_set_budget(s->tenants[i].tier.cache, share);
}

static void close_tier(struct ksv_server *s, struct ksv_tenant *t, double flush_s)
{
	if (t->tier.store) {
		if (flush_s > 0)
			ks_store_flush(t->tier.store, flush_s, NULL);
		ks_store_close(t->tier.store); /* before the cache: its writer holds views */
	}
	kc_cache_destroy(t->tier.cache);
	(void)s;
	free(t->salt);
	memset(t, 0, sizeof *t);
}

/* The namespace salt of a request salt, derived below from the server's
 * namespace (fingerprint + --cache-salt, a fixed 16 bytes), so two servers
 * with different --cache-salt never share a request salt's files, and no
 * choice of the two salts can make another pair's bytes (a plain
 * concatenation could). Request salts hold no NUL (gen.c refuses them). */
static char *ns_salt(const char *salt)
{
	size_t b = strlen(salt);
	char *r = malloc(b + 16);
	if (r)
		snprintf(r, b + 16, "request:%s", salt);
	return r;
}

int ksv_tenant_get(struct ksv_server *s, const char *salt, struct ksv_tier *out)
{
	int rc;
	if (!salt || !*salt) {
		out->cache = s->cache;
		out->store = s->store;
		return KV_OK;
	}
	ksv_tenant_lock(s);
	for (int i = 0; i < s->n_tenants; i++) {
		if (!strcmp(s->tenants[i].salt, salt)) {
			s->tenants[i].last_use_ns = kv_now_ns();
			*out = s->tenants[i].tier;
			ksv_tenant_unlock(s);
			return KV_OK;
		}
	}
	if (s->n_tenants == KSV_MAX_TENANTS) {
		/* close the least recently used salt to make room */
		int v = 0;
		for (int i = 1; i < s->n_tenants; i++)
			if (s->tenants[i].last_use_ns < s->tenants[v].last_use_ns)
				v = i;
		KV_INFO("serve.salt_closed", "tenants=%d msg=\"least recently used cache salt closed to make room\"",
			s->n_tenants);
		close_tier(s, &s->tenants[v], 0.5);
		s->tenants[v] = s->tenants[--s->n_tenants];
	}
	struct ksv_tenant *t = &s->tenants[s->n_tenants];
	memset(t, 0, sizeof *t);
	char *nss = ns_salt(salt);
	t->salt = strdup(salt);
	if (!nss || !t->salt) {
		free(nss);
		free(t->salt);
		t->salt = NULL;
		ksv_tenant_unlock(s);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	struct kc_params cp = s->cache_params;
	cp.ns = ks_ns_derive(s->ns, nss);
	cp.policy = &s->policy;
	if ((rc = kc_cache_create(&cp, &t->tier.cache))) {
		free(nss);
		free(t->salt);
		t->salt = NULL;
		ksv_tenant_unlock(s);
		return rc;
	}
	ksv_server_open_store(s, cp.ns, t->tier.cache, 1, &t->tier.store);
	if (t->tier.store)
		ks_store_start_scan(t->tier.store);
	free(nss);
	t->last_use_ns = kv_now_ns();
	s->n_tenants++;
	share_budget(s);
	char nsx[33];
	kv_h128_hex(cp.ns, nsx);
	KV_INFO("serve.salt_opened", "namespace=%s tenants=%d disk=%d", nsx, s->n_tenants, t->tier.store != NULL);
	*out = t->tier;
	ksv_tenant_unlock(s);
	return KV_OK;
}

double ksv_tenant_flush_all(struct ksv_server *s, double budget_s)
{
	uint64_t t0 = kv_now_ns();
	int order[KSV_MAX_TENANTS];
	ksv_tenant_lock(s);
	int n = s->n_tenants;
	for (int i = 0; i < n; i++)
		order[i] = i;
	/* most recently used first */
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && s->tenants[order[j]].last_use_ns > s->tenants[order[j - 1]].last_use_ns; j--) {
			int x = order[j];
			order[j] = order[j - 1];
			order[j - 1] = x;
		}
	for (int i = 0; i < n; i++) {
		double left = budget_s - (double)(kv_now_ns() - t0) / 1e9;
		if (left <= 0)
			break;
		if (s->tenants[order[i]].tier.store)
			ks_store_flush(s->tenants[order[i]].tier.store, left, NULL);
	}
	ksv_tenant_unlock(s);
	return (double)(kv_now_ns() - t0) / 1e9;
}

void ksv_tenant_close_all(struct ksv_server *s)
{
	ksv_tenant_lock(s);
	for (int i = 0; i < s->n_tenants; i++)
		close_tier(s, &s->tenants[i], 0);
	s->n_tenants = 0;
	ksv_tenant_unlock(s);
}
