/*
 * auth.h - who may call which route of `kvkeep serve`.
 *
 * Two keys, both optional:
 *   --api-key K (or KVKEEP_API_KEY)   the API routes: /v1/chat/completions,
 *                                     /v1/completions, /v1/models
 *   --admin-key A (or KVKEEP_ADMIN_KEY) the cache admin routes:
 *                                     /v1/cache/info, /v1/cache/clear,
 *                                     /v1/cache/probe (the admin key is
 *                                     also accepted on the API routes)
 * A key is sent as "Authorization: Bearer K" or "x-api-key: K" (as
 * llama.cpp and vLLM take it). With no --api-key the API routes are open.
 * With no --admin-key the admin routes answer only when the server listens
 * on loopback; listening beyond it (0.0.0.0, a LAN address, a host name)
 * they are refused with 403, since they reveal and clear what other
 * clients cached. /health and /metrics stay open (probes and scrapers).
 * Wrong or missing key: 401 with "WWW-Authenticate: Bearer".
 *
 * Keys are compared in time that depends only on the server's key length,
 * never on how many leading bytes match.
 */
#ifndef KV_SERVER_AUTH_H
#define KV_SERVER_AUTH_H

#include <stddef.h>

enum ksv_auth_class { KSV_AUTH_OPEN = 0, KSV_AUTH_API, KSV_AUTH_ADMIN };
enum ksv_auth_verdict { KSV_AUTH_OK = 0, KSV_AUTH_UNAUTHORIZED, KSV_AUTH_FORBIDDEN };

struct ksv_auth {
	const char *api_key;   /* NULL or "": API routes open */
	const char *admin_key; /* NULL or "": admin routes only on loopback */
	int loopback;          /* the server listens on loopback only */
};

/* 1 when s equals key (both NUL-terminated), in time that depends on
 * strlen(key) only. */
int ksv_auth_equal(const char *key, const char *s);
/* 1 for 127.0.0.0/8, ::1, ::ffff:127.x and "localhost". */
int ksv_auth_is_loopback(const char *host);
/* The key a request presents (Bearer token or x-api-key), or NULL. The
 * header values are borrowed; the result points into one of them. */
const char *ksv_auth_presented(const char *authorization, const char *x_api_key);
/* May a request presenting `key` (NULL: none) call a route of class c? */
enum ksv_auth_verdict ksv_auth_check(const struct ksv_auth *a, enum ksv_auth_class c, const char *key);
/* May a request presenting `key` see text that other clients sent (the
 * cached side of a miss explanation)? Only with the admin key, or, on a
 * server with no key at all that listens on loopback only, anyone (every
 * client is the machine's own user). An API key alone never does: the
 * admin routes' loopback rule above lets it call them, not read other
 * clients' prompts. */
int ksv_auth_trusted(const struct ksv_auth *a, const char *key);
/* ... with the admin key itself (configured and presented). */
int ksv_auth_is_admin(const struct ksv_auth *a, const char *key);

#endif
