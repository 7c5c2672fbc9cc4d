/*
 * browser.c - see browser.h.
 */
#include "server/browser.h"
#include "base/err.h"
#include "server/httpd.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* The host part of a Host header or an origin's authority ("[::1]:8000"
 * -> "[::1]", "a.b:80" -> "a.b"), lowercased, into out. */
static void host_part(const char *auth, size_t n, char *out, size_t cap)
{
	size_t end = n;
	if (n && auth[0] == '[') {
		const char *rb = memchr(auth, ']', n);
		end = rb ? (size_t)(rb - auth) + 1 : n;
	} else {
		const char *colon = memchr(auth, ':', n);
		if (colon)
			end = (size_t)(colon - auth);
	}
	size_t k = 0;
	for (size_t i = 0; i < end && k + 1 < cap; i++)
		out[k++] = (char)tolower((unsigned char)auth[i]);
	out[k] = 0;
}

static int ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a >= b && !strcmp(s + a - b, suffix);
}

static int is_ip(const char *h)
{
	unsigned char buf[16];
	return h[0] == '[' || inet_pton(AF_INET, h, buf) == 1;
}

static int is_loopback(const char *h)
{
	unsigned char a[4];
	if (!strcmp(h, "localhost") || ends_with(h, ".localhost") || !strcmp(h, "[::1]"))
		return 1;
	return inet_pton(AF_INET, h, a) == 1 && a[0] == 127;
}

/* 1 when the comma-separated list holds item (ASCII case-insensitive,
 * spaces around items ignored). */
static int list_has(const char *list, const char *item, size_t n)
{
	for (const char *p = list; p && *p;) {
		while (*p == ' ' || *p == ',')
			p++;
		const char *e = p;
		while (*e && *e != ',')
			e++;
		const char *t = e;
		while (t > p && t[-1] == ' ')
			t--;
		if ((size_t)(t - p) == n && !strncasecmp(p, item, n))
			return 1;
		p = e;
	}
	return 0;
}

/* The authority of an origin "scheme://authority" (no path), or NULL. */
static const char *origin_authority(const char *o, int *web)
{
	const char *sep = strstr(o, "://");
	*web = 0;
	if (!sep || sep == o || strchr(sep + 3, '/') || !sep[3])
		return NULL;
	*web = (sep - o == 4 && !strncasecmp(o, "http", 4)) || (sep - o == 5 && !strncasecmp(o, "https", 5));
	return sep + 3;
}

/* 1 when some --allowed-origin names host h. */
static int origin_list_has_host(const char *list, const char *h)
{
	char item[256], hp[256];
	for (const char *p = list; p && *p;) {
		while (*p == ' ' || *p == ',')
			p++;
		const char *e = p;
		while (*e && *e != ',' && *e != ' ')
			e++;
		size_t n = (size_t)(e - p);
		if (n && n < sizeof item) {
			memcpy(item, p, n);
			item[n] = 0;
			int web;
			const char *a = origin_authority(item, &web);
			if (a) {
				host_part(a, strlen(a), hp, sizeof hp);
				if (!strcmp(hp, h))
					return 1;
			}
		}
		p = e;
	}
	return 0;
}

static int host_allowed(const struct ksv_browser *b, const char *host_hdr)
{
	char h[256], own[256];
	if (!host_hdr || !b->open_api || (b->allowed_host && list_has(b->allowed_host, "*", 1)))
		return 1;
	host_part(host_hdr, strlen(host_hdr), h, sizeof h);
	if (!h[0] || is_ip(h) || is_loopback(h))
		return 1;
	host_part(b->host, strlen(b->host), own, sizeof own);
	if (!strcmp(h, own))
		return 1;
	if (b->allowed_host && list_has(b->allowed_host, h, strlen(h)))
		return 1;
	return b->allowed_origin && origin_list_has_host(b->allowed_origin, h);
}

static int origin_allowed(const struct ksv_browser *b, const char *origin, const char *host_hdr)
{
	if (b->allowed_origin && (list_has(b->allowed_origin, "*", 1) ||
				  list_has(b->allowed_origin, origin, strlen(origin))))
		return 1;
	int web;
	const char *a = origin_authority(origin, &web);
	if (!a || !web)
		return 0; /* "null" (sandboxed frames, files), extensions: only when listed */
	char h[256];
	host_part(a, strlen(a), h, sizeof h);
	if (is_loopback(h))
		return 1;
	/* the server's own pages (the dashboard), at whatever address the
	 * user reached it by; the Host check has vouched for that address */
	return host_hdr && !strcasecmp(a, host_hdr);
}

int ksv_browser_check(const struct ksv_browser *b, struct ksv_conn *c, char *msg, size_t cap)
{
	const char *host = ksv_conn_req_header(c, "Host");
	const char *origin = ksv_conn_req_header(c, "Origin");
	if (!host_allowed(b, host)) {
		char h[256];
		host_part(host, strlen(host), h, sizeof h);
		snprintf(msg, cap,
			 "this server does not answer to the host name '%s' (a protection against DNS rebinding on a server "
			 "without --api-key): reach it by IP address or localhost, or start it with --allowed-host %s",
			 h, h);
		return 403;
	}
	if (!origin)
		return 0;
	if (!origin_allowed(b, origin, host)) {
		snprintf(msg, cap,
			 "requests from the web page at '%.200s' are refused: start the server with --allowed-origin %.200s "
			 "to let that page call it",
			 origin, origin);
		return 403;
	}
	ksv_conn_header(c, "Access-Control-Allow-Origin", origin);
	ksv_conn_header(c, "Vary", "Origin");
	return 0;
}

/* Header names as a browser lists them: letters, digits, '-', '_', ',',
 * spaces; anything else and the default list is sent instead. */
static int header_list_ok(const char *s)
{
	if (!s || !*s || strlen(s) > 512)
		return 0;
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && !strchr("-_, ", *s))
			return 0;
	return 1;
}

void ksv_browser_preflight(struct ksv_conn *c, const char *methods)
{
	char m[64];
	const char *asked = ksv_conn_req_header(c, "Access-Control-Request-Headers");
	snprintf(m, sizeof m, "%s, OPTIONS", methods);
	ksv_conn_header(c, "Access-Control-Allow-Methods", m);
	ksv_conn_header(c, "Access-Control-Allow-Headers",
			header_list_ok(asked) ? asked
					      : "authorization, content-type, x-api-key, anthropic-version, x-cache-salt");
	ksv_conn_header(c, "Access-Control-Max-Age", "600");
	ksv_conn_header(c, "Allow", m);
}

int ksv_browser_json_body(struct ksv_conn *c, size_t body_len, char *msg, size_t cap)
{
	const char *ct = ksv_conn_req_header(c, "Content-Type");
	if (!ct || !body_len)
		return 0;
	char media[96];
	size_t k = 0;
	while (*ct == ' ')
		ct++;
	for (; *ct && *ct != ';' && *ct != ' ' && k + 1 < sizeof media; ct++)
		media[k++] = (char)tolower((unsigned char)*ct);
	media[k] = 0;
	if (!strcmp(media, "application/json") || ends_with(media, "+json"))
		return 0;
	snprintf(msg, cap,
		 "the body must be JSON sent with Content-Type: application/json (this one is '%s'; with curl: "
		 "-H 'Content-Type: application/json')",
		 media);
	return 415;
}

void ksv_browser_csp(const char *nonce, char *out, size_t cap)
{
	snprintf(out, cap,
		 "default-src 'none'; script-src 'nonce-%s'; style-src 'unsafe-inline'; connect-src 'self'; "
		 "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
		 nonce);
}

int ksv_browser_check_flags(const char *allowed_origin, const char *allowed_host)
{
	char item[256];
	for (const char *p = allowed_origin; p && *p;) {
		while (*p == ' ' || *p == ',')
			p++;
		const char *e = p;
		while (*e && *e != ',')
			e++;
		size_t n = (size_t)(e - p);
		while (n && p[n - 1] == ' ')
			n--;
		if (n) {
			int web;
			if (n >= sizeof item)
				return kv_fail(KV_ERR_INVALID, "--allowed-origin: '%.40s...' is too long", p);
			memcpy(item, p, n);
			item[n] = 0;
			if (strcmp(item, "*") && !origin_authority(item, &web))
				return kv_fail(KV_ERR_INVALID,
					       "--allowed-origin: '%s' is not an origin: write scheme://host[:port] with no "
					       "path (e.g. http://localhost:3000), or *",
					       item);
		}
		p = e;
	}
	for (const char *p = allowed_host; p && *p; p++)
		if (!isalnum((unsigned char)*p) && !strchr(".-_,* []:", *p))
			return kv_fail(KV_ERR_INVALID, "--allowed-host: '%s' is not a list of host names", allowed_host);
	return KV_OK;
}
