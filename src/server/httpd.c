/*
 * httpd.c - see httpd.h.
 *
 * libmicrohttpd runs in MHD_USE_THREAD_PER_CONNECTION mode: each accepted
 * socket gets a thread that reads the request, calls our access handler
 * (which may block) and, for streams, calls our content reader until the
 * body ends. Two things libmicrohttpd does not do are added here:
 *
 *   - an absolute deadline for the request head. Its own timeout is an
 *     inactivity timeout, which a client sending one byte every few hundred
 *     milliseconds never trips. Connections are tracked from the
 *     NOTIFY_CONNECTION callback; a watchdog thread shuts down (shutdown(2),
 *     not close: libmicrohttpd still owns the descriptor) every connection
 *     whose head is overdue. The tracking entry is removed under the same
 *     lock in the CLOSED notification, which libmicrohttpd sends before it
 *     closes the descriptor, so the watchdog never touches a reused fd.
 *     libmicrohttpd's inactivity timeout is off: it would also cut a
 *     stream that is silent during a long prefill. The watchdog instead
 *     closes idle keep-alive connections (same deadline as a head) and
 *     streams whose client stopped reading (bytes pending, none taken for
 *     stall_timeout_s).
 *   - noticing a client that hangs up while its response is still being
 *     generated. The content reader waits for bytes in 50 ms slices and
 *     polls the socket for POLLRDHUP/POLLHUP between them; a handler that
 *     blocks does the same through ksv_conn_gone().
 */
#include "server/httpd.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define STREAM_MAX_PENDING (64u << 20) /* bytes waiting for a slow client */
#define WAIT_SLICE_MS 50

struct track {
	struct track *prev, *next;
	struct ksv_stream *stream; /* referenced stream of the current request, or NULL */
	int fd;
	uint64_t deadline_ns;   /* head must be complete by then (when !busy) */
	int busy;               /* a request head arrived; its handler owns the time */
	int killed;             /* the watchdog shut it down */
	int linger;             /* refused a body early: drain it before the close */
};

struct hdr {
	char *name, *value;
};

struct ksv_conn {
	struct ksv_httpd *h;
	struct MHD_Connection *mc;
	int fd;
	struct kv_buf body;
	int replied;            /* a response was queued */
	int status;
	const char *route;
	struct hdr *hdrs;
	size_t n_hdrs;
	uint64_t t0_ns;
};

struct ksv_stream {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int refs;
	struct kv_buf buf;      /* bytes not yet handed to libmicrohttpd: buf[off, len) */
	size_t off;
	int ended;              /* the producer called ksv_stream_end */
	int gone;               /* the client left (or the connection died) */
	int fd;
	uint64_t last_drain_ns; /* when libmicrohttpd last took bytes, or bytes became pending */
	int why;                /* enum ksv_gone_why: the first reason the stream ended early */
	void (*on_gone)(void *arg);
	void *on_gone_arg;
	int gone_fired;
	int in_cb;              /* on_gone is running (ksv_stream_end waits for it) */
};

struct ksv_httpd {
	struct ksv_httpd_params p;
	struct MHD_Daemon *d;
	int port;
	pthread_mutex_t tmu;    /* guards the track list */
	struct track *tracks;
	int n_conns;
	pthread_t watchdog;
	int watchdog_started;
	atomic_int stop;
};

static struct track *track_of(struct MHD_Connection *mc);

/* --- streams ------------------------------------------------------------- */

static void stream_unref(struct ksv_stream *s)
{
	pthread_mutex_lock(&s->mu);
	int left = --s->refs;
	pthread_mutex_unlock(&s->mu);
	if (left)
		return;
	kv_buf_free(&s->buf);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

/* Mark gone (why: the reason, kept if one is known already) and run the
 * callback once, outside the lock. */
static void stream_set_gone(struct ksv_stream *s, int why)
{
	void (*fn)(void *) = NULL;
	void *arg = NULL;
	pthread_mutex_lock(&s->mu);
	s->gone = 1;
	if (!s->why)
		s->why = why;
	if (!s->ended && !s->gone_fired && s->on_gone) {
		s->gone_fired = 1;
		s->in_cb = 1;
		fn = s->on_gone;
		arg = s->on_gone_arg;
	}
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (fn) {
		fn(arg);
		pthread_mutex_lock(&s->mu);
		s->in_cb = 0;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mu);
	}
}

static int fd_hung_up(int fd)
{
	struct pollfd pf = {.fd = fd, .events = POLLRDHUP};
	if (fd < 0)
		return 1;
	if (poll(&pf, 1, 0) < 0)
		return 0;
	return (pf.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static void add_ms(struct timespec *ts, int ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_nsec += (long)ms * 1000000L;
	while (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct ksv_stream *s = cls;
	(void)pos;
	pthread_mutex_lock(&s->mu);
	for (;;) {
		if (s->off < s->buf.len) {
			size_t n = s->buf.len - s->off;
			if (n > max)
				n = max;
			memcpy(buf, s->buf.p + s->off, n);
			s->off += n;
			s->last_drain_ns = kv_now_ns();
			if (s->off == s->buf.len) {
				kv_buf_reset(&s->buf);
				s->off = 0;
			}
			pthread_cond_broadcast(&s->cv); /* a producer may wait for room */
			pthread_mutex_unlock(&s->mu);
			return (ssize_t)n;
		}
		if (s->ended) {
			pthread_mutex_unlock(&s->mu);
			return MHD_CONTENT_READER_END_OF_STREAM;
		}
		if (s->gone) {
			pthread_mutex_unlock(&s->mu);
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
		struct timespec ts;
		add_ms(&ts, WAIT_SLICE_MS);
		pthread_cond_timedwait(&s->cv, &s->mu, &ts);
		if (s->off < s->buf.len || s->ended)
			continue;
		pthread_mutex_unlock(&s->mu);
		int hup = fd_hung_up(s->fd);
		if (hup) {
			stream_set_gone(s, KSV_GONE_HANGUP);
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
		pthread_mutex_lock(&s->mu);
	}
}

/* libmicrohttpd is done with the response: the connection's reference. */
static void stream_free_cb(void *cls)
{
	struct ksv_stream *s = cls;
	pthread_mutex_lock(&s->mu);
	int unfinished = !s->ended || s->off < s->buf.len;
	pthread_mutex_unlock(&s->mu);
	if (unfinished)
		/* the connection closed under the response (the watchdog's cut
		 * has set its own reason before) */
		stream_set_gone(s, KSV_GONE_HANGUP);
	stream_unref(s);
}

int ksv_stream_write(struct ksv_stream *s, const void *p, size_t n)
{
	int rc = KV_OK;
	pthread_mutex_lock(&s->mu);
	if (s->gone)
		rc = KV_ERR_CANCELLED;
	else if (s->buf.len - s->off + n > STREAM_MAX_PENDING)
		rc = KV_ERR_NOMEM;
	else {
		/* the stall clock runs from when bytes are waiting: a stream
		 * silent for minutes (a long prefill) is not a stalled reader */
		if (s->off == s->buf.len)
			s->last_drain_ns = kv_now_ns();
		kv_buf_add(&s->buf, p, n);
		if (s->buf.oom)
			rc = KV_ERR_NOMEM;
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	if (rc == KV_ERR_NOMEM)
		stream_set_gone(s, KSV_GONE_OVERFLOW); /* treat a client that stopped reading as gone */
	return rc;
}

size_t ksv_stream_pending(struct ksv_stream *s)
{
	pthread_mutex_lock(&s->mu);
	size_t n = s->buf.len - s->off;
	pthread_mutex_unlock(&s->mu);
	return n;
}

int ksv_stream_wait_room(struct ksv_stream *s, size_t max_pending, int ms)
{
	struct timespec ts;
	int rc = KV_OK;
	add_ms(&ts, ms);
	pthread_mutex_lock(&s->mu);
	while (!s->gone && s->buf.len - s->off > max_pending)
		if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) == ETIMEDOUT)
			break;
	if (s->gone)
		rc = KV_ERR_CANCELLED;
	else if (s->buf.len - s->off > max_pending)
		rc = KV_ERR_TIMEOUT;
	pthread_mutex_unlock(&s->mu);
	return rc;
}

const char *ksv_stream_gone_why(struct ksv_stream *s)
{
	static const char *names[] = {"-", "hangup", "stalled", "overflow"};
	pthread_mutex_lock(&s->mu);
	int w = s->gone || s->why ? s->why : KSV_GONE_NONE;
	pthread_mutex_unlock(&s->mu);
	return w >= 0 && w < (int)(sizeof names / sizeof names[0]) ? names[w] : "-";
}

int ksv_stream_gone(struct ksv_stream *s)
{
	pthread_mutex_lock(&s->mu);
	int g = s->gone;
	pthread_mutex_unlock(&s->mu);
	return g;
}

void ksv_stream_on_gone(struct ksv_stream *s, void (*fn)(void *arg), void *arg)
{
	int now = 0;
	pthread_mutex_lock(&s->mu);
	s->on_gone = fn;
	s->on_gone_arg = arg;
	if (s->gone && !s->gone_fired && !s->ended && fn) {
		s->gone_fired = 1;
		s->in_cb = 1;
		now = 1;
	}
	pthread_mutex_unlock(&s->mu);
	if (now) {
		fn(arg);
		pthread_mutex_lock(&s->mu);
		s->in_cb = 0;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mu);
	}
}

void ksv_stream_end(struct ksv_stream *s)
{
	pthread_mutex_lock(&s->mu);
	s->ended = 1;
	s->on_gone = NULL;
	pthread_cond_broadcast(&s->cv);
	/* after this returns the callback's argument may be freed */
	while (s->in_cb)
		pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
	stream_unref(s);
}

/* --- answering ------------------------------------------------------------ */

void ksv_conn_set_route(struct ksv_conn *c, const char *route)
{
	c->route = route;
}

const char *ksv_conn_route(const struct ksv_conn *c)
{
	return c->route ? c->route : "other";
}

void ksv_conn_header(struct ksv_conn *c, const char *name, const char *value)
{
	struct hdr *nh = realloc(c->hdrs, (c->n_hdrs + 1) * sizeof *nh);
	if (!nh)
		return;
	c->hdrs = nh;
	nh[c->n_hdrs].name = strdup(name);
	nh[c->n_hdrs].value = strdup(value);
	if (nh[c->n_hdrs].name && nh[c->n_hdrs].value)
		c->n_hdrs++;
	else {
		free(nh[c->n_hdrs].name);
		free(nh[c->n_hdrs].value);
	}
}

const char *ksv_conn_req_header(struct ksv_conn *c, const char *name)
{
	return MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, name);
}

void ksv_conn_peer(struct ksv_conn *c, char *out, size_t cap)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	char ip[64] = "?";
	int port = 0;
	if (ci && ci->client_addr) {
		const struct sockaddr *sa = ci->client_addr;
		if (sa->sa_family == AF_INET) {
			const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
			inet_ntop(AF_INET, &in->sin_addr, ip, sizeof ip);
			port = ntohs(in->sin_port);
		} else if (sa->sa_family == AF_INET6) {
			const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
			inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof ip);
			port = ntohs(in6->sin6_port);
		}
	}
	snprintf(out, cap, "%s:%d", ip, port);
}

static int queue(struct ksv_conn *c, int status, const char *ctype, struct MHD_Response *r)
{
	if (!r)
		return kv_fail(KV_ERR_NOMEM, "httpd: cannot create a response");
	if (ctype)
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
	/* a browser never reads an answer as another type than it says */
	MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
	for (size_t i = 0; i < c->n_hdrs; i++)
		MHD_add_response_header(r, c->hdrs[i].name, c->hdrs[i].value);
	enum MHD_Result ok = MHD_queue_response(c->mc, (unsigned)status, r);
	MHD_destroy_response(r);
	if (ok != MHD_YES)
		return kv_fail(KV_ERR_IO, "httpd: libmicrohttpd refused the response");
	c->replied = 1;
	c->status = status;
	return KV_OK;
}

int ksv_conn_reply(struct ksv_conn *c, int status, const char *content_type, const char *body, size_t len)
{
	if (c->replied)
		return kv_fail(KV_ERR_INVALID, "httpd: already replied");
	struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)(body ? body : ""),
								 MHD_RESPMEM_MUST_COPY);
	return queue(c, status, content_type, r);
}

struct ksv_stream *ksv_conn_stream(struct ksv_conn *c, int status, const char *content_type)
{
	if (c->replied)
		return NULL;
	struct ksv_stream *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	pthread_mutex_init(&s->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cv, &ca);
	pthread_condattr_destroy(&ca);
	s->refs = 2;
	s->fd = c->fd;
	s->last_drain_ns = kv_now_ns();
	struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, s,
								   stream_free_cb);
	if (!r) {
		pthread_cond_destroy(&s->cv);
		pthread_mutex_destroy(&s->mu);
		free(s);
		return NULL;
	}
	/* the response owns the connection's reference from here on: if
	 * queueing fails, destroying it calls stream_free_cb */
	if (queue(c, status, content_type, r)) {
		ksv_stream_end(s);
		return NULL;
	}
	/* the watchdog watches the stream for a client that stopped reading */
	struct track *t = track_of(c->mc);
	if (t) {
		pthread_mutex_lock(&c->h->tmu);
		if (!t->stream) {
			pthread_mutex_lock(&s->mu);
			s->refs++;
			pthread_mutex_unlock(&s->mu);
			t->stream = s;
		}
		pthread_mutex_unlock(&c->h->tmu);
	}
	return s;
}

int ksv_conn_gone(struct ksv_conn *c)
{
	return fd_hung_up(c->fd);
}

/* --- libmicrohttpd callbacks --------------------------------------------- */

/* Every refusal is logged at info (a client's failing agent must leave a
 * trace in the server log), like ksv_reply_error does for the server's. */
static void log_413(const char *route, size_t limit, const char *how)
{
	KV_INFO("http.error", "route=%s status=413 msg=\"request body is larger than the limit of %zu bytes (%s)\"",
		route ? route : "other", limit, how);
}

static const char *json_error_413(size_t limit, char *buf, size_t cap)
{
	snprintf(buf, cap,
		 "{\"error\":{\"message\":\"request body is larger than the limit of %zu bytes\","
		 "\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"request_too_large\"}}",
		 limit);
	return buf;
}

static struct track *track_of(struct MHD_Connection *mc)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	return ci ? (struct track *)ci->socket_context : NULL;
}

static void mark_linger(struct ksv_httpd *h, struct MHD_Connection *mc)
{
	struct track *t = track_of(mc);
	if (t) {
		pthread_mutex_lock(&h->tmu);
		t->linger = 1;
		pthread_mutex_unlock(&h->tmu);
	}
}

/*
 * Lingering close. A 413 goes out before the body is read; libmicrohttpd
 * then closes the socket with the body's bytes still unread, and the
 * kernel answers unread data with a reset, which makes many clients
 * (node's fetch among them) lose the 413 they were sent and report a
 * broken connection instead. So before the close we stop sending and read
 * and drop what the client still sends, for at most LINGER_MS or
 * LINGER_BYTES: nothing is kept, and a client that stops sending is not
 * waited for.
 */
#define LINGER_MS 2000
#define LINGER_BYTES (64u << 20)
static void linger_drain(int fd)
{
	char buf[16384];
	uint64_t end = kv_now_ns() + (uint64_t)LINGER_MS * 1000000ull;
	size_t got = 0;
	shutdown(fd, SHUT_WR);
	while (got < LINGER_BYTES) {
		uint64_t now = kv_now_ns();
		if (now >= end)
			break;
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		int r = poll(&pf, 1, (int)((end - now) / 1000000ull) + 1);
		if (r <= 0)
			break;
		ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
		if (k <= 0) {
			if (k < 0 && (errno == EINTR || errno == EAGAIN))
				continue;
			break;
		}
		got += (size_t)k;
	}
}

/* A whole 413 reply written straight to the socket (small: it fits the
 * socket buffer), counted like any reply. */
static void send_raw_413(struct ksv_conn *c, const char *body)
{
	char buf[1024];
	int n = snprintf(buf, sizeof buf,
			 "HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\nContent-Type: application/json\r\n"
			 "X-Content-Type-Options: nosniff\r\nContent-Length: %zu\r\n\r\n%s",
			 strlen(body), body);
	if (c->fd >= 0 && n > 0 && (size_t)n < sizeof buf) {
		ssize_t w = send(c->fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
		(void)w;
	}
	c->replied = 1;
	c->status = 413;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
				 const char *version, const char *upload_data, size_t *upload_size, void **con_cls)
{
	struct ksv_httpd *h = cls;
	struct ksv_conn *c = *con_cls;
	char msg[256];
	(void)version;

	if (!c) {
		c = calloc(1, sizeof *c);
		if (!c)
			return MHD_NO;
		c->h = h;
		c->mc = mc;
		c->t0_ns = kv_now_ns();
		c->route = h->p.route_of ? h->p.route_of(h->p.ctx, url) : "other";
		if (!c->route)
			c->route = "other";
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
		c->fd = ci ? ci->connect_fd : -1;
		*con_cls = c;
		struct track *t = track_of(mc);
		if (t) {
			pthread_mutex_lock(&h->tmu);
			t->busy = 1;
			pthread_mutex_unlock(&h->tmu);
		}
		const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
		if (cl) {
			char *e;
			errno = 0;
			unsigned long long v = strtoull(cl, &e, 10);
			if (errno || e == cl || v > h->p.max_body) {
				json_error_413(h->p.max_body, msg, sizeof msg);
				log_413(c->route, h->p.max_body, "Content-Length");
				mark_linger(h, mc);
				ksv_conn_header(c, "Connection", "close");
				ksv_conn_reply(c, 413, "application/json", msg, strlen(msg));
			}
		}
		return MHD_YES;
	}
	if (*upload_size) {
		size_t n = *upload_size;
		*upload_size = 0;
		if (c->replied)
			return MHD_YES; /* discard what follows a refusal */
		if (c->body.len + n > c->h->p.max_body) {
			json_error_413(h->p.max_body, msg, sizeof msg);
			log_413(c->route, h->p.max_body, "chunked");
			mark_linger(h, mc);
			ksv_conn_header(c, "Connection", "close");
			if (ksv_conn_reply(c, 413, "application/json", msg, strlen(msg)) == KV_OK)
				return MHD_YES;
			/* libmicrohttpd queues a response only before the body or
			 * after all of it, and a chunked body has no length to
			 * refuse up front: write the 413 to the socket ourselves
			 * (nothing else of this request was sent), then close */
			send_raw_413(c, msg);
			return MHD_NO;
		}
		kv_buf_add(&c->body, upload_data, n);
		if (c->body.oom)
			return MHD_NO;
		return MHD_YES;
	}
	if (c->replied)
		return MHD_YES;
	if (!c->body.p)
		kv_buf_reserve(&c->body, 1);
	if (c->body.oom)
		return MHD_NO;
	struct ksv_request rq = {.method = method,
				 .path = url,
				 .body = c->body.p ? c->body.p : "",
				 .body_len = c->body.len,
				 .conn = c};
	h->p.handler(h->p.ctx, &rq);
	if (!c->replied) {
		const char *e = "{\"error\":{\"message\":\"internal error: no response\",\"type\":\"server_error\","
				"\"param\":null,\"code\":null}}";
		KV_INFO("http.error", "route=%s status=500 msg=\"internal error: no response\"", c->route);
		if (ksv_conn_reply(c, 500, "application/json", e, strlen(e)))
			return MHD_NO;
	}
	return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe)
{
	struct ksv_httpd *h = cls;
	struct ksv_conn *c = *con_cls;
	struct track *t = track_of(mc);
	struct ksv_stream *old = NULL;
	if (t) {
		pthread_mutex_lock(&h->tmu);
		t->busy = 0;
		t->deadline_ns = kv_now_ns() + (uint64_t)h->p.header_timeout_ms * 1000000ull;
		old = t->stream;
		t->stream = NULL;
		pthread_mutex_unlock(&h->tmu);
	}
	if (old)
		stream_unref(old);
	if (!c)
		return;
	if (h->p.on_done)
		h->p.on_done(h->p.ctx, c->route, c->replied ? c->status : 0, toe != MHD_REQUEST_TERMINATED_COMPLETED_OK,
			     (double)(kv_now_ns() - c->t0_ns) / 1e9);
	kv_buf_free(&c->body);
	for (size_t i = 0; i < c->n_hdrs; i++) {
		free(c->hdrs[i].name);
		free(c->hdrs[i].value);
	}
	free(c->hdrs);
	free(c);
	*con_cls = NULL;
}

/*
 * The reserve. Idle connections (no request head yet, or keep-alive
 * between requests) may hold at most max_connections - reserve slots:
 * past that, each new connection shuts down the oldest idle one, so 512
 * silent sockets (renewed forever by one peer) cannot keep /health and
 * new requests out. Connections inside a request are never evicted; an
 * idle keep-alive connection closed this way is one any HTTP client
 * expects to see closed and retries.
 */
static int reserve_of(int max_connections)
{
	int r = max_connections / 8;
	return r < 2 ? 2 : r > 64 ? 64 : r;
}

/* Shut down the oldest idle connection (caller holds tmu); 1 if one was. */
static int evict_idle_locked(struct ksv_httpd *h)
{
	struct track *victim = NULL;
	for (struct track *t = h->tracks; t; t = t->next)
		if (t != h->tracks && !t->busy && !t->killed && t->fd >= 0 && !t->stream)
			victim = t; /* the list is newest first: keep the last match; never the newest */
	if (!victim)
		return 0;
	shutdown(victim->fd, SHUT_RDWR);
	victim->killed = 1;
	return 1;
}

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
			  enum MHD_ConnectionNotificationCode toe)
{
	struct ksv_httpd *h = cls;
	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		struct track *t = calloc(1, sizeof *t);
		if (!t)
			return;
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
		t->fd = ci ? ci->connect_fd : -1;
		t->deadline_ns = kv_now_ns() + (uint64_t)h->p.header_timeout_ms * 1000000ull;
		pthread_mutex_lock(&h->tmu);
		t->next = h->tracks;
		if (h->tracks)
			h->tracks->prev = t;
		h->tracks = t;
		h->n_conns++;
		int evicted = h->n_conns > h->p.max_connections - reserve_of(h->p.max_connections) && evict_idle_locked(h);
		pthread_mutex_unlock(&h->tmu);
		if (evicted)
			KV_DEBUG("http.evict_idle", "connections=%d limit=%d", h->n_conns, h->p.max_connections);
		*socket_context = t;
	} else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
		struct track *t = *socket_context;
		struct ksv_stream *old = NULL;
		if (t && t->linger && t->fd >= 0)
			linger_drain(t->fd);
		pthread_mutex_lock(&h->tmu);
		if (t) {
			if (t->prev)
				t->prev->next = t->next;
			else
				h->tracks = t->next;
			if (t->next)
				t->next->prev = t->prev;
			old = t->stream;
		}
		h->n_conns--;
		pthread_mutex_unlock(&h->tmu);
		if (old)
			stream_unref(old);
		free(t);
		*socket_context = NULL;
	}
}

static void *watchdog_main(void *arg)
{
	struct ksv_httpd *h = arg;
	while (!atomic_load(&h->stop)) {
		int killed = 0;
		uint64_t now = kv_now_ns();
		pthread_mutex_lock(&h->tmu);
		for (struct track *t = h->tracks; t; t = t->next) {
			if (t->killed || t->fd < 0)
				continue;
			int kill = !t->busy && now > t->deadline_ns;
			if (!kill && t->stream && h->p.stall_timeout_s > 0) {
				/* bytes waiting and none taken for stall_timeout_s: the
				 * client stopped reading */
				struct ksv_stream *s = t->stream;
				pthread_mutex_lock(&s->mu);
				/* `now` was read before the lock: a reader may have
				 * taken bytes since, so last_drain_ns can be later
				 * than now (that difference would wrap around) */
				uint64_t ld = s->last_drain_ns;
				kill = s->off < s->buf.len && now > ld &&
				       now - ld > (uint64_t)h->p.stall_timeout_s * 1000000000ull;
				if (kill && !s->why)
					s->why = KSV_GONE_STALLED;
				pthread_mutex_unlock(&s->mu);
			}
			if (kill) {
				shutdown(t->fd, SHUT_RDWR);
				t->killed = 1;
				killed++;
			}
		}
		pthread_mutex_unlock(&h->tmu);
		for (int i = 0; i < killed; i++) {
			KV_DEBUG("http.header_timeout", "timeout_ms=%d", h->p.header_timeout_ms);
			if (h->p.on_timeout)
				h->p.on_timeout(h->p.ctx);
		}
		kv_sleep_ms(100);
	}
	return NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	char buf[512];
	(void)cls;
	vsnprintf(buf, sizeof buf, fmt, ap);
	size_t n = strlen(buf);
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		buf[--n] = 0;
	KV_DEBUG("http.mhd", "msg=\"%s\"", buf);
}

/* Why the daemon could not listen: bind the address once more, alone,
 * and keep the errno (libmicrohttpd only logs it). */
static int bind_errno(const struct addrinfo *a)
{
	int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
	if (fd < 0)
		return errno;
	int one = 1, e = 0;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, 1))
		e = errno;
	close(fd);
	return e;
}

/* The cause and the fix, in words. */
static int listen_error(const char *host, int port, int e)
{
	if (e == EADDRINUSE)
		return kv_fail(KV_ERR_IO, "port %d on %s is already in use (another server is listening there): stop it, "
					  "or pick another port with --port N (--port 0 takes any free one)", port, host);
	if (e == EACCES)
		return kv_fail(KV_ERR_IO, "port %d on %s needs more privileges (ports below 1024 need root): use --port "
					  "8000 or another port above 1023", port, host);
	if (e == EADDRNOTAVAIL)
		return kv_fail(KV_ERR_IO, "%s is not an address of this machine: use --host 127.0.0.1 (this machine "
					  "only) or --host 0.0.0.0 (every interface)", host);
	return kv_fail(KV_ERR_IO, "cannot listen on %s:%d: %s", host, port, e ? strerror(e) : "unknown error");
}

int ksv_httpd_start(const struct ksv_httpd_params *p, struct ksv_httpd **out)
{
	struct addrinfo hints = {0}, *res = NULL;
	char portstr[16];
	int rc;
	*out = NULL;
	if (!p->handler || p->port < 0 || p->port > 65535)
		return kv_fail(KV_ERR_INVALID, "httpd: bad parameters");
	struct ksv_httpd *h = calloc(1, sizeof *h);
	if (!h)
		return kv_fail(KV_ERR_NOMEM, "httpd: out of memory");
	h->p = *p;
	if (h->p.max_connections <= 0)
		h->p.max_connections = 512;
	if (h->p.header_timeout_ms <= 0)
		h->p.header_timeout_ms = 10000;
	pthread_mutex_init(&h->tmu, NULL);

	snprintf(portstr, sizeof portstr, "%d", p->port);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	rc = getaddrinfo(p->host && *p->host ? p->host : NULL, portstr, &hints, &res);
	if (rc) {
		pthread_mutex_destroy(&h->tmu);
		free(h);
		return kv_fail(KV_ERR_INVALID, "httpd: cannot resolve host '%s': %s", p->host ? p->host : "",
			       gai_strerror(rc));
	}
	unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
			 MHD_USE_ITC | MHD_USE_ERROR_LOG;
	if (res->ai_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_access, h,
				MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h,
				MHD_OPTION_SOCK_ADDR, res->ai_addr,
				MHD_OPTION_CONNECTION_LIMIT, (unsigned int)h->p.max_connections,
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)0,
				MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(128 * 1024),
				MHD_OPTION_THREAD_STACK_SIZE, (size_t)(2u << 20),
				MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned int)1024,
				MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
				MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
				MHD_OPTION_END);
	int why = h->d ? 0 : bind_errno(res);
	freeaddrinfo(res);
	if (!h->d) {
		pthread_mutex_destroy(&h->tmu);
		free(h);
		return listen_error(p->host && *p->host ? p->host : "*", p->port, why);
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
	h->port = di ? di->port : p->port;
	if (pthread_create(&h->watchdog, NULL, watchdog_main, h) == 0)
		h->watchdog_started = 1;
	*out = h;
	return KV_OK;
}

int ksv_httpd_port(const struct ksv_httpd *h)
{
	return h->port;
}

void ksv_httpd_quiesce(struct ksv_httpd *h)
{
	MHD_socket s = MHD_quiesce_daemon(h->d);
	if (s != MHD_INVALID_SOCKET)
		close(s);
}

int ksv_httpd_busy(const struct ksv_httpd *h)
{
	struct ksv_httpd *hm = (struct ksv_httpd *)h;
	int n = 0;
	pthread_mutex_lock(&hm->tmu);
	for (struct track *t = hm->tracks; t; t = t->next)
		n += t->busy && !t->killed;
	pthread_mutex_unlock(&hm->tmu);
	return n;
}

int ksv_httpd_connections(const struct ksv_httpd *h)
{
	struct ksv_httpd *hm = (struct ksv_httpd *)h;
	pthread_mutex_lock(&hm->tmu);
	int n = h->n_conns;
	pthread_mutex_unlock(&hm->tmu);
	return n;
}

void ksv_httpd_stop(struct ksv_httpd *h)
{
	if (!h)
		return;
	atomic_store(&h->stop, 1);
	if (h->watchdog_started)
		pthread_join(h->watchdog, NULL);
	MHD_stop_daemon(h->d);
	pthread_mutex_destroy(&h->tmu);
	free(h);
}
