/*
 * browser.h - what a web browser may do with `kvkeep serve`.
 *
 * A browser sends requests for any page the user opens, with the user's
 * network position: a page on the internet can POST to 127.0.0.1:8000,
 * and with DNS rebinding its own host name can resolve to it. The server
 * answers only what the user meant to allow:
 *
 *   Host     on a server without --api-key (its API is open), the Host
 *            header must name it: an IP address, localhost (or a
 *            *.localhost name), the --host value, an --allowed-host name,
 *            or the host of an --allowed-origin. A rebinding page's Host
 *            is its own name: 403. With an API key the key decides.
 *   Origin   a request that carries one (browsers add it to cross-origin
 *            requests and to every POST) must come from a loopback page
 *            (http(s)://localhost, 127.x, [::1], any port), from the
 *            server's own origin (Origin equal to Host), or from an
 *            --allowed-origin ("*": any). Otherwise 403. An allowed
 *            origin gets Access-Control-Allow-Origin on every answer, and
 *            its CORS preflight (OPTIONS) is answered: 204 with the
 *            methods, the headers asked for, Max-Age 600.
 *   Bodies   a JSON route refuses text/plain, form-encoded and multipart
 *            bodies (the "simple requests" a page may send cross-origin
 *            without a preflight) with 415. A body sent with no
 *            Content-Type is read as JSON (scripts, old clients).
 *   Headers  every answer carries X-Content-Type-Options: nosniff
 *            (httpd.c); the dashboard page a Content-Security-Policy that
 *            runs only its own script (a nonce per answer) and connects
 *            only to this server.
 *
 * Agents, SDKs and curl send no Origin and a Host of the address they
 * were given, so none of this touches them (tests/e2e/server_browser).
 */
#ifndef KV_SERVER_BROWSER_H
#define KV_SERVER_BROWSER_H

#include <stddef.h>

struct ksv_conn;

struct ksv_browser {
	const char *host;            /* --host */
	const char *allowed_origin;  /* --allowed-origin list, or NULL */
	const char *allowed_host;    /* --allowed-host list, or NULL */
	int open_api;                /* no --api-key: the Host check applies */
};

/* 0: the request may go on (CORS headers added to c where they belong);
 * else the status to refuse it with (403) and why in msg. */
int ksv_browser_check(const struct ksv_browser *b, struct ksv_conn *c, char *msg, size_t cap);
/* An OPTIONS request (after ksv_browser_check passed): the preflight's
 * headers for a route answering `methods` ("POST", "GET"); the caller
 * replies 204. */
void ksv_browser_preflight(struct ksv_conn *c, const char *methods);
/* A JSON route's body: 0, or 415 with why in msg. */
int ksv_browser_json_body(struct ksv_conn *c, size_t body_len, char *msg, size_t cap);
/* The dashboard's Content-Security-Policy for a script nonce. */
void ksv_browser_csp(const char *nonce, char *out, size_t cap);
/* Checks of a list flag's values at start: KV_ERR_INVALID naming the bad one. */
int ksv_browser_check_flags(const char *allowed_origin, const char *allowed_host);

#endif
