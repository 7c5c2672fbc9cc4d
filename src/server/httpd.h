/*
 * httpd.h - the HTTP transport of `kvkeep serve`: libmicrohttpd with one
 * thread per connection, body and header limits, and streaming responses
 * that notice a client going away.
 *
 * What it guarantees, whatever the handler does:
 *   - A request whose Content-Length exceeds max_body gets 413 before its
 *     body is read (the connection is closed after the reply). A chunked
 *     body is counted as it arrives and refused the same way once it
 *     passes the limit.
 *   - A connection must deliver a complete request head within
 *     header_timeout_ms of being accepted (or of the end of its previous
 *     request, for keep-alive): a watchdog shuts down connections that do
 *     not, so a client trickling one header byte per second cannot hold a
 *     thread forever. Idle keep-alive connections close at the same
 *     deadline. A request that is being answered has no time limit (a
 *     long prefill may be silent for minutes), except that a stream whose
 *     client takes no bytes for stall_timeout_s is closed.
 *   - At most max_connections connections exist at once (libmicrohttpd
 *     refuses more at accept time); each has its own thread, so a slow or
 *     blocked handler never delays another connection. Idle connections
 *     (no request head yet, or between keep-alive requests) keep a reserve
 *     of max_connections / 8 slots (2-64) free: a new connection past that
 *     closes the oldest idle one, so idle sockets cannot lock out /health.
 *   - A handler may block (it runs on its connection's thread); while it
 *     waits it can ask ksv_conn_gone() whether the client hung up.
 *
 * A handler answers exactly once, with ksv_conn_reply (a whole body) or
 * ksv_conn_stream (a chunked body produced by another thread through a
 * struct ksv_stream). A handler that returns without answering gets 500.
 *
 * Threads: handlers run on connection threads; a stream is written from
 * any thread (usually the engine worker) and drained by its connection's
 * thread.
 */
#ifndef KV_SERVER_HTTPD_H
#define KV_SERVER_HTTPD_H

#include <stddef.h>
#include <stdint.h>

struct ksv_httpd;
struct ksv_conn;
struct ksv_stream;

struct ksv_request {
	const char *method;   /* "GET", "POST", ... */
	const char *path;     /* URL path without the query string */
	const char *body;     /* request body, NUL-terminated ("" when none) */
	size_t body_len;
	struct ksv_conn *conn;
};

typedef void (*ksv_handler_fn)(void *ctx, const struct ksv_request *rq);

struct ksv_httpd_params {
	const char *host;          /* address to bind, e.g. "127.0.0.1", "0.0.0.0", "::" */
	int port;                  /* 0 picks a free port (see ksv_httpd_port) */
	size_t max_body;           /* bytes; larger bodies get 413 */
	int max_connections;       /* concurrent connections */
	int header_timeout_ms;     /* complete request head within this */
	int stall_timeout_s;       /* close a stream whose client took no bytes for this long (0 never) */
	ksv_handler_fn handler;
	void *ctx;
	/* Optional: called once per finished request with the status sent (0 if
	 * none could be sent) and whether the client went away first. route is
	 * what the handler set with ksv_conn_set_route, else "other". */
	void (*on_done)(void *ctx, const char *route, int status, int gone, double seconds);
	/* Optional: called when the watchdog closes a slow connection. */
	void (*on_timeout)(void *ctx);
	/* Optional: the metrics label of a path (a static string), used from
	 * the moment the head arrives, so answers the transport gives itself
	 * (413) are counted under the right route. */
	const char *(*route_of)(void *ctx, const char *path);
};

/* Start listening. KV_ERR_IO when the address cannot be bound. */
int ksv_httpd_start(const struct ksv_httpd_params *p, struct ksv_httpd **out);
/* The bound port. */
int ksv_httpd_port(const struct ksv_httpd *h);
/* Stop accepting new connections (existing ones continue). */
void ksv_httpd_quiesce(struct ksv_httpd *h);
/* Close everything, wait for connection threads, free. Streams still open
 * are ended for their clients. */
void ksv_httpd_stop(struct ksv_httpd *h);
/* Requests whose head arrived and whose answer is not complete yet
 * (streams included): shutdown waits for them to get their answer. */
int ksv_httpd_busy(const struct ksv_httpd *h);
/* Connections open now. */
int ksv_httpd_connections(const struct ksv_httpd *h);

/* --- answering ------------------------------------------------------------ */

/* Label used for metrics and logs ("/v1/chat/completions"); the string must
 * be static. */
void ksv_conn_set_route(struct ksv_conn *c, const char *route);
/* The route label (static string). */
const char *ksv_conn_route(const struct ksv_conn *c);
/* Add a response header (copied) before replying, e.g. Retry-After. */
void ksv_conn_header(struct ksv_conn *c, const char *name, const char *value);
/* Request header value (case-insensitive), valid during the handler; NULL
 * if absent. */
const char *ksv_conn_req_header(struct ksv_conn *c, const char *name);
/* The client's address as text ("127.0.0.1:53122"; "?" if unknown). */
void ksv_conn_peer(struct ksv_conn *c, char *out, size_t cap);
/* Whole-body reply; body is copied. Returns KV_OK or an error when a reply
 * was already given. */
int ksv_conn_reply(struct ksv_conn *c, int status, const char *content_type, const char *body, size_t len);
/*
 * Chunked streaming reply. Returns a stream with two references: one for
 * the caller (release it with ksv_stream_end when done writing) and one
 * held by the connection until the client got everything or left. NULL on
 * failure (the handler should then reply with an error).
 */
struct ksv_stream *ksv_conn_stream(struct ksv_conn *c, int status, const char *content_type);
/* 1 if the client closed its connection (polls the socket, non-blocking). */
int ksv_conn_gone(struct ksv_conn *c);

/* --- streams ------------------------------------------------------------- */

/* Queue bytes for the client. KV_ERR_CANCELLED once the client is gone
 * (the bytes are dropped), KV_ERR_NOMEM when the client is so slow that
 * more than 64 MiB are waiting. */
int ksv_stream_write(struct ksv_stream *s, const void *p, size_t n);
/* 1 once the client is gone. */
int ksv_stream_gone(struct ksv_stream *s);
/* Why a stream ended before its producer ended it, for the request log:
 * "hangup" (the client closed the connection), "stalled" (the watchdog
 * cut a client that read nothing for --stall-timeout-s), "overflow" (more
 * than the pending limit waited), or "-" while it has not. */
enum ksv_gone_why { KSV_GONE_NONE = 0, KSV_GONE_HANGUP, KSV_GONE_STALLED, KSV_GONE_OVERFLOW };
const char *ksv_stream_gone_why(struct ksv_stream *s);
/* Bytes queued that the client has not taken yet. */
size_t ksv_stream_pending(struct ksv_stream *s);
/* Wait up to ms until at most max_pending bytes are queued: KV_OK, or
 * KV_ERR_CANCELLED once the client is gone, KV_ERR_TIMEOUT when the time
 * ran out first. Lets a producer bound what a slow client holds. */
int ksv_stream_wait_room(struct ksv_stream *s, size_t max_pending, int ms);
/*
 * fn(arg) is called once, from the connection thread, when the client
 * disconnects before the stream ended (not called after a normal end). If
 * the client is already gone it is called at once from this thread.
 */
void ksv_stream_on_gone(struct ksv_stream *s, void (*fn)(void *arg), void *arg);
/* The producer is done: the client gets the rest and the end of the body.
 * Drops the caller's reference; s must not be used after. When it returns
 * the on_gone callback is not running and will never run, so its argument
 * may be freed. Do not call it from inside that callback. */
void ksv_stream_end(struct ksv_stream *s);

#endif
