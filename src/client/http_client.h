/*
 * http_client.h - a small blocking HTTP/1.1 client over TCP sockets, and an
 * incremental Server-Sent Events (SSE) parser.
 *
 * Who uses it: `kvkeep chat` (talks to a spawned or remote server),
 * `kvkeep bench replay` (replays recorded request bodies) and the server
 * tests. It is deliberately small: plain http:// only (no TLS, no proxy),
 * one request at a time per connection, keep-alive reuse when the server
 * allows it, request bodies given whole, response bodies read
 * incrementally. Every blocking step has a deadline (the connection's
 * timeout), so a server that goes silent cannot hang the caller.
 *
 * Wire rules it follows (RFC 9112): the request carries Host,
 * Content-Length (when there is a body) and "Connection: keep-alive"; the
 * response head is read up to the empty line (at most KSV_HTTP_MAX_HEAD
 * bytes); the body is framed by "Transfer-Encoding: chunked", else by
 * Content-Length, else by the end of the connection. Responses to HEAD and
 * 1xx/204/304 statuses have no body.
 *
 * SSE (the WHATWG event-stream format): lines end with \n, \r\n or \r;
 * "data:" lines of one event are joined with \n; "event:" names the
 * event; "id:" and "retry:" are read and ignored; lines starting with ':'
 * are comments; an empty line dispatches the event (an event with no data
 * line is not dispatched). One space after the colon is dropped. The
 * OpenAI stream ends with the event "data: [DONE]", which this parser
 * returns like any other event: the caller checks for it.
 *
 * Typical streaming use:
 *
 *     struct kcl_url u;
 *     if (kcl_url_parse("http://127.0.0.1:8000/v1", &u)) ...
 *     struct kcl_http *h;
 *     if (kcl_http_connect(u.host, u.port, 30000, &h)) ...
 *     char path[1200];
 *     snprintf(path, sizeof path, "%s/chat/completions", u.path);
 *     kcl_http_send(h, "POST", path, "application/json", body, len, NULL);
 *     struct kcl_http_resp r;
 *     kcl_http_read_head(h, &r);           // r.status, kcl_http_header(&r, "content-type")
 *     struct kcl_sse sse;
 *     kcl_sse_init(&sse);
 *     struct kcl_sse_event ev;
 *     while (kcl_http_next_event(h, &r, &sse, &ev) == 1)
 *             if (strcmp(ev.data, "[DONE]")) handle(ev.data, ev.data_len);
 *     kcl_sse_free(&sse);
 *     kcl_http_resp_free(&r);
 *     kcl_http_close(h);
 *
 * One-shot use: kcl_http_fetch(url, "GET", NULL, 0, timeout, &status, &body, &len).
 *
 * Errors are kv_err codes with a kv_fail message: KV_ERR_IO (connect
 * refused, reset, unexpected close), KV_ERR_TIMEOUT (a deadline passed),
 * KV_ERR_CORRUPT (the server broke HTTP framing), KV_ERR_INVALID (bad URL,
 * bad arguments), KV_ERR_FULL (a head or body bigger than the caller's
 * limit), KV_ERR_NOMEM.
 *
 * Thread-safety: one connection is used by one thread at a time, except
 * kcl_http_abort(), which any thread (or a signal handler) may call to make
 * the blocked call return KV_ERR_CANCELLED promptly.
 */
#ifndef KV_CLIENT_HTTP_CLIENT_H
#define KV_CLIENT_HTTP_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

#define KSV_HTTP_MAX_HEAD (64 * 1024) /* bytes of a response head we accept */

/* A parsed base URL: "http://HOST[:PORT][/PATH]". */
struct kcl_url {
	char host[256]; /* name or literal; IPv6 literals without brackets */
	int port;       /* default 80 */
	char path[1024];/* path prefix without a trailing '/', "" for none */
};

/* Parse a base URL; only http:// is accepted. KV_OK or KV_ERR_INVALID. */
int kcl_url_parse(const char *url, struct kcl_url *out);

struct kcl_http;

/* Open a TCP connection. timeout_ms bounds the connect and becomes the
 * connection's per-call timeout (<= 0: 30 s). *out is owned by the caller
 * (kcl_http_close). */
int kcl_http_connect(const char *host, int port, int timeout_ms, struct kcl_http **out);
/* Close and free (NULL ok). */
void kcl_http_close(struct kcl_http *h);
/* Change the per-call timeout (ms, <= 0: no deadline). */
void kcl_http_set_timeout(struct kcl_http *h, int timeout_ms);
/* Make the current or next blocking call fail with KV_ERR_CANCELLED; safe
 * from another thread or a signal handler (async-signal-safe). */
void kcl_http_abort(struct kcl_http *h);
/* The socket (for poll by callers that multiplex). */
int kcl_http_fd(const struct kcl_http *h);

/*
 * Send one request. A connection is reused for the next request only after
 * the previous response body was read to its end and r.keep_alive was 1;
 * otherwise open a new one. `extra_headers` is NULL or "Name: value\r\n..." lines
 * (each ending with \r\n). body may be NULL when len is 0; content_type
 * NULL sends none.
 */
int kcl_http_send(struct kcl_http *h, const char *method, const char *path, const char *content_type,
		  const void *body, size_t len, const char *extra_headers);

struct kcl_http_resp {
	int status;             /* e.g. 200 */
	char *head;             /* malloc'd raw head (status line + headers), NUL-terminated */
	size_t head_len;
	int chunked;            /* Transfer-Encoding: chunked */
	int64_t content_length; /* -1 when absent */
	int keep_alive;         /* the connection can be reused after the body */
	int no_body;            /* HEAD, 1xx, 204, 304 */
	/* body framing state, private */
	int64_t remaining;      /* bytes left in the body or current chunk */
	int state;              /* 0 body, 1 chunk size line, 2 chunk CRLF, 3 trailers, 4 done */
};

/* Read the response head (status line and headers). Call once after
 * kcl_http_send. r is filled; free with kcl_http_resp_free. */
int kcl_http_read_head(struct kcl_http *h, struct kcl_http_resp *r);
void kcl_http_resp_free(struct kcl_http_resp *r);
/* Value of a header (case-insensitive name), copied into out (NUL-
 * terminated, truncated to cap). Returns 1 if present, 0 if not. */
int kcl_http_header(const struct kcl_http_resp *r, const char *name, char *out, size_t cap);

/* Read up to cap bytes of body. Returns the count (> 0), 0 at the end of
 * the body, or a negative kv_err code. */
long kcl_http_read(struct kcl_http *h, struct kcl_http_resp *r, void *buf, size_t cap);
/* Read the rest of the body into *out (malloc'd, NUL-terminated; free()).
 * A body longer than max is KV_ERR_FULL. */
int kcl_http_read_all(struct kcl_http *h, struct kcl_http_resp *r, size_t max, char **out, size_t *len);

/* --- SSE ---------------------------------------------------------------- */

struct kcl_sse_event {
	const char *event;      /* "message" unless an event: line named it */
	const char *data;       /* data lines joined by \n, NUL-terminated */
	size_t data_len;
};

/* Parser state. Fields are private; the event pointers stay valid until the
 * next call that feeds or reads this parser. */
struct kcl_sse {
	struct kv_buf line;     /* the line being assembled */
	struct kv_buf data;     /* data of the event being assembled */
	struct kv_buf out;      /* data of the event last returned */
	char event[64];
	char out_event[64];
	int have_data;          /* a data: line was seen in this event */
	int last_cr;            /* the previous byte was \r (for \r\n) */
	struct kv_buf pend;     /* body bytes read but not yet parsed */
	size_t pend_off;
	size_t max_event;       /* an event larger than this is an error (default 16 MiB) */
};

void kcl_sse_init(struct kcl_sse *s);
void kcl_sse_free(struct kcl_sse *s);
/*
 * Feed bytes. Consumes bytes up to and including the end of the first
 * event completed in them and returns how many were consumed; *got is 1
 * when that event was dispatched into *ev. Call again with the rest. A
 * return of (size_t)-1 means the event grew beyond max_event.
 */
size_t kcl_sse_feed(struct kcl_sse *s, const char *p, size_t n, struct kcl_sse_event *ev, int *got);
/*
 * Read the next event of an SSE response body. Returns 1 with *ev set, 0 at
 * the end of the body (an unterminated last event that has data is
 * dispatched before that, so a server that closes without the final empty
 * line loses nothing), or a negative kv_err code.
 */
int kcl_http_next_event(struct kcl_http *h, struct kcl_http_resp *r, struct kcl_sse *s, struct kcl_sse_event *ev);

/* --- one-shot helper ------------------------------------------------------ */

/*
 * Connect to the server of `url` (http://host:port/path), send one request
 * to that path and read the whole response (at most 64 MiB). *body is
 * malloc'd (free()) and NUL-terminated; body/len may be NULL when unused.
 */
int kcl_http_fetch(const char *url, const char *method, const char *req_body, size_t req_len, int timeout_ms,
		   int *status, char **body, size_t *len);
/* The same with extra request headers (as in kcl_http_send; may be NULL). */
int kcl_http_fetch_h(const char *url, const char *method, const char *req_body, size_t req_len, int timeout_ms,
		     const char *extra_headers, int *status, char **body, size_t *len);

#endif
