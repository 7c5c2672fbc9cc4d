/*
 * http_client.c - see http_client.h.
 *
 * The connection keeps one read buffer; the head parser and the body
 * reader both consume from it, so bytes of the body that arrived with the
 * head are never lost. Every recv/send waits with poll() against the
 * connection's deadline, in slices of at most 200 ms so an abort flag is
 * noticed; kcl_http_abort also shuts the socket down, which wakes a
 * blocked poll at once.
 */
#include "client/http_client.h"
#include "base/clock.h"
#include "base/err.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>
#include <fcntl.h>

struct kcl_http {
	int fd;
	int timeout_ms;          /* per call; <= 0 no deadline */
	volatile int aborted;    /* set by kcl_http_abort */
	char host[300];          /* Host header value */
	char rbuf[16384];
	size_t rpos, rend;       /* unread bytes are rbuf[rpos, rend) */
	int eof;                 /* the peer closed its side */
};

int kcl_url_parse(const char *url, struct kcl_url *out)
{
	const char *p, *host_end, *path;
	memset(out, 0, sizeof *out);
	out->port = 80;
	if (!url || strncasecmp(url, "http://", 7))
		return kv_fail(KV_ERR_INVALID, "url '%s': only http://HOST[:PORT][/PATH] is supported", url ? url : "");
	p = url + 7;
	path = strchr(p, '/');
	if (!path)
		path = p + strlen(p);
	if (*p == '[') { /* IPv6 literal */
		const char *rb = memchr(p, ']', (size_t)(path - p));
		if (!rb || rb - p - 1 <= 0 || (size_t)(rb - p - 1) >= sizeof out->host)
			return kv_fail(KV_ERR_INVALID, "url '%s': bad IPv6 literal", url);
		memcpy(out->host, p + 1, (size_t)(rb - p - 1));
		host_end = rb + 1;
		if (host_end < path && *host_end != ':')
			return kv_fail(KV_ERR_INVALID, "url '%s': junk after ']'", url);
	} else {
		host_end = memchr(p, ':', (size_t)(path - p));
		if (!host_end)
			host_end = path;
		if (host_end == p || (size_t)(host_end - p) >= sizeof out->host)
			return kv_fail(KV_ERR_INVALID, "url '%s': missing or too long host", url);
		memcpy(out->host, p, (size_t)(host_end - p));
	}
	if (host_end < path && *host_end == ':') {
		char *end;
		long port = strtol(host_end + 1, &end, 10);
		if (end != path || port <= 0 || port > 65535)
			return kv_fail(KV_ERR_INVALID, "url '%s': bad port", url);
		out->port = (int)port;
	}
	size_t pl = strlen(path);
	while (pl > 0 && path[pl - 1] == '/')
		pl--;
	if (pl >= sizeof out->path)
		return kv_fail(KV_ERR_INVALID, "url '%s': path too long", url);
	memcpy(out->path, path, pl);
	out->path[pl] = 0;
	return KV_OK;
}

/* Milliseconds left before the deadline, -1 for none, 0 when passed. */
static int left_ms(uint64_t deadline_ns)
{
	if (!deadline_ns)
		return -1;
	uint64_t now = kv_now_ns();
	if (now >= deadline_ns)
		return 0;
	uint64_t ms = (deadline_ns - now + 999999) / 1000000;
	return ms > 1000000000 ? 1000000000 : (int)ms;
}

static uint64_t deadline_of(const struct kcl_http *h)
{
	return h->timeout_ms > 0 ? kv_now_ns() + (uint64_t)h->timeout_ms * 1000000ull : 0;
}

/* Wait until fd is ready for `events`. KV_OK, KV_ERR_TIMEOUT, KV_ERR_CANCELLED, KV_ERR_IO. */
static int wait_fd(struct kcl_http *h, short events, uint64_t deadline_ns, const char *what)
{
	for (;;) {
		if (h->aborted)
			return kv_fail(KV_ERR_CANCELLED, "http: %s cancelled", what);
		int ms = left_ms(deadline_ns);
		if (ms == 0)
			return kv_fail(KV_ERR_TIMEOUT, "http: %s timed out after %d ms", what, h->timeout_ms);
		/* wake up now and then to notice an abort even if shutdown raced */
		if (ms < 0 || ms > 200)
			ms = 200;
		struct pollfd pf = {.fd = h->fd, .events = events};
		int r = poll(&pf, 1, ms);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return kv_fail(KV_ERR_IO, "http: poll: %s", strerror(errno));
		}
		if (r > 0)
			return KV_OK;
	}
}

int kcl_http_connect(const char *host, int port, int timeout_ms, struct kcl_http **out)
{
	struct addrinfo hints = {0}, *res = NULL, *ai;
	char portstr[16];
	int rc, last_err = 0;
	struct kcl_http *h;

	*out = NULL;
	if (!host || !*host || port <= 0 || port > 65535)
		return kv_fail(KV_ERR_INVALID, "http: bad host or port");
	h = calloc(1, sizeof *h);
	if (!h)
		return kv_fail(KV_ERR_NOMEM, "http: out of memory");
	h->fd = -1;
	h->timeout_ms = timeout_ms > 0 ? timeout_ms : 30000;
	if (strchr(host, ':'))
		snprintf(h->host, sizeof h->host, "[%s]:%d", host, port);
	else
		snprintf(h->host, sizeof h->host, "%s:%d", host, port);
	snprintf(portstr, sizeof portstr, "%d", port);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	rc = getaddrinfo(host, portstr, &hints, &res);
	if (rc) {
		free(h);
		return kv_fail(KV_ERR_IO, "http: cannot resolve '%s': %s", host, gai_strerror(rc));
	}
	uint64_t deadline = deadline_of(h);
	for (ai = res; ai; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
		if (fd < 0) {
			last_err = errno;
			continue;
		}
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS) {
			h->fd = fd;
			if (wait_fd(h, POLLOUT, deadline, "connect") == KV_OK) {
				int soerr = 0;
				socklen_t sl = sizeof soerr;
				getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
				if (!soerr)
					break;
				last_err = soerr;
			} else {
				last_err = ETIMEDOUT;
			}
			h->fd = -1;
		} else {
			last_err = errno;
		}
		close(fd);
	}
	freeaddrinfo(res);
	if (h->fd < 0) {
		free(h);
		return kv_fail(last_err == ETIMEDOUT ? KV_ERR_TIMEOUT : KV_ERR_IO, "http: connect to %s:%d: %s", host,
			       port, strerror(last_err ? last_err : ECONNREFUSED));
	}
	int one = 1;
	setsockopt(h->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	*out = h;
	return KV_OK;
}

void kcl_http_close(struct kcl_http *h)
{
	if (!h)
		return;
	if (h->fd >= 0)
		close(h->fd);
	free(h);
}

void kcl_http_set_timeout(struct kcl_http *h, int timeout_ms)
{
	h->timeout_ms = timeout_ms;
}

void kcl_http_abort(struct kcl_http *h)
{
	h->aborted = 1;
	if (h->fd >= 0)
		shutdown(h->fd, SHUT_RDWR);
}

int kcl_http_fd(const struct kcl_http *h)
{
	return h->fd;
}

static int send_all(struct kcl_http *h, const char *p, size_t n, uint64_t deadline)
{
	while (n > 0) {
		int rc = wait_fd(h, POLLOUT, deadline, "send");
		if (rc)
			return rc;
		ssize_t w = send(h->fd, p, n, MSG_NOSIGNAL);
		if (w < 0) {
			if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
				continue;
			return kv_fail(KV_ERR_IO, "http: send: %s", strerror(errno));
		}
		p += w;
		n -= (size_t)w;
	}
	return KV_OK;
}

int kcl_http_send(struct kcl_http *h, const char *method, const char *path, const char *content_type,
		  const void *body, size_t len, const char *extra_headers)
{
	struct kv_buf b = KV_BUF_INIT;
	int rc;
	if (!method || !path || path[0] != '/' || strpbrk(path, " \r\n") || (len && !body))
		return kv_fail(KV_ERR_INVALID, "http: bad request line");
	/* a fresh request must not see bytes left over from an earlier one */
	h->rpos = h->rend = 0;
	kv_buf_printf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: kvkeep/%s\r\nAccept: */*\r\n"
			  "Connection: keep-alive\r\n", method, path, h->host, KVKEEP_VERSION);
	if (content_type)
		kv_buf_printf(&b, "Content-Type: %s\r\n", content_type);
	if (len || strcmp(method, "GET"))
		kv_buf_printf(&b, "Content-Length: %zu\r\n", len);
	if (extra_headers)
		kv_buf_adds(&b, extra_headers);
	kv_buf_adds(&b, "\r\n");
	if (b.oom) {
		kv_buf_free(&b);
		return kv_fail(KV_ERR_NOMEM, "http: out of memory");
	}
	uint64_t deadline = deadline_of(h);
	rc = send_all(h, b.p, b.len, deadline);
	kv_buf_free(&b);
	if (!rc && len)
		rc = send_all(h, body, len, deadline);
	return rc;
}

/* Read more bytes into rbuf (compacting it first). Returns bytes read, 0 at
 * EOF, or a negative kv_err code. */
static long fill(struct kcl_http *h, uint64_t deadline)
{
	if (h->rpos > 0) {
		memmove(h->rbuf, h->rbuf + h->rpos, h->rend - h->rpos);
		h->rend -= h->rpos;
		h->rpos = 0;
	}
	if (h->rend == sizeof h->rbuf)
		return kv_fail(KV_ERR_FULL, "http: read buffer full");
	if (h->eof)
		return 0;
	for (;;) {
		int rc = wait_fd(h, POLLIN, deadline, "read");
		if (rc)
			return rc;
		ssize_t r = recv(h->fd, h->rbuf + h->rend, sizeof h->rbuf - h->rend, 0);
		if (r < 0) {
			if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
				continue;
			if (h->aborted)
				return kv_fail(KV_ERR_CANCELLED, "http: read cancelled");
			return kv_fail(KV_ERR_IO, "http: recv: %s", strerror(errno));
		}
		if (r == 0) {
			h->eof = 1;
			if (h->aborted)
				return kv_fail(KV_ERR_CANCELLED, "http: read cancelled");
			return 0;
		}
		h->rend += (size_t)r;
		return r;
	}
}

void kcl_http_resp_free(struct kcl_http_resp *r)
{
	free(r->head);
	memset(r, 0, sizeof *r);
}

int kcl_http_header(const struct kcl_http_resp *r, const char *name, char *out, size_t cap)
{
	size_t nl = strlen(name);
	const char *p = r->head ? strstr(r->head, "\r\n") : NULL;
	while (p) {
		p += 2;
		const char *eol = strstr(p, "\r\n");
		if (!eol || eol == p)
			break;
		const char *colon = memchr(p, ':', (size_t)(eol - p));
		if (colon && (size_t)(colon - p) == nl && !strncasecmp(p, name, nl)) {
			const char *v = colon + 1;
			while (v < eol && (*v == ' ' || *v == '\t'))
				v++;
			const char *ve = eol;
			while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
				ve--;
			if (out && cap) {
				size_t n = (size_t)(ve - v) < cap - 1 ? (size_t)(ve - v) : cap - 1;
				memcpy(out, v, n);
				out[n] = 0;
			}
			return 1;
		}
		p = eol;
	}
	return 0;
}

/* 1 if the comma-separated header value contains token (case-insensitive). */
static int has_token(const char *v, const char *tok)
{
	size_t tl = strlen(tok);
	while (*v) {
		while (*v == ' ' || *v == ',' || *v == '\t')
			v++;
		const char *e = v;
		while (*e && *e != ',')
			e++;
		const char *te = e;
		while (te > v && (te[-1] == ' ' || te[-1] == '\t'))
			te--;
		if ((size_t)(te - v) == tl && !strncasecmp(v, tok, tl))
			return 1;
		v = e;
	}
	return 0;
}

int kcl_http_read_head(struct kcl_http *h, struct kcl_http_resp *r)
{
	uint64_t deadline = deadline_of(h);
	char *end = NULL;
	char val[256];

	memset(r, 0, sizeof *r);
	r->content_length = -1;
	for (;;) {
		/* search only the unread part of the buffer */
		if (h->rend > h->rpos) {
			end = memmem(h->rbuf + h->rpos, h->rend - h->rpos, "\r\n\r\n", 4);
			if (end)
				break;
		}
		if (h->rend - h->rpos >= sizeof h->rbuf)
			return kv_fail(KV_ERR_FULL, "http: response head larger than %zu bytes", sizeof h->rbuf);
		long n = fill(h, deadline);
		if (n < 0)
			return (int)n;
		if (n == 0)
			return kv_fail(KV_ERR_IO, "http: connection closed before the response head");
	}
	size_t hl = (size_t)(end - (h->rbuf + h->rpos)) + 4;
	r->head = malloc(hl + 1);
	if (!r->head)
		return kv_fail(KV_ERR_NOMEM, "http: out of memory");
	memcpy(r->head, h->rbuf + h->rpos, hl);
	r->head[hl] = 0;
	r->head_len = hl;
	h->rpos += hl;

	int major = 0, minor = 0, status = 0;
	if (sscanf(r->head, "HTTP/%d.%d %d", &major, &minor, &status) != 3 || status < 100 || status > 999) {
		kcl_http_resp_free(r);
		return kv_fail(KV_ERR_CORRUPT, "http: bad status line");
	}
	r->status = status;
	r->keep_alive = major > 1 || (major == 1 && minor >= 1);
	if (kcl_http_header(r, "connection", val, sizeof val)) {
		if (has_token(val, "close"))
			r->keep_alive = 0;
		else if (has_token(val, "keep-alive"))
			r->keep_alive = 1;
	}
	if (kcl_http_header(r, "transfer-encoding", val, sizeof val) && has_token(val, "chunked"))
		r->chunked = 1;
	if (!r->chunked && kcl_http_header(r, "content-length", val, sizeof val)) {
		char *e;
		errno = 0;
		long long cl = strtoll(val, &e, 10);
		if (errno || e == val || *e || cl < 0) {
			kcl_http_resp_free(r);
			return kv_fail(KV_ERR_CORRUPT, "http: bad Content-Length '%s'", val);
		}
		r->content_length = cl;
	}
	r->no_body = status < 200 || status == 204 || status == 304;
	if (r->no_body) {
		r->state = 4;
	} else if (r->chunked) {
		r->state = 1;
	} else if (r->content_length >= 0) {
		r->state = 0;
		r->remaining = r->content_length;
	} else {
		r->state = 0;
		r->remaining = -1; /* until close */
		r->keep_alive = 0;
	}
	if (r->content_length == 0 && !r->chunked)
		r->state = 4;
	return KV_OK;
}

/* Read a CRLF-terminated line from rbuf into line (without CRLF). */
static int read_line(struct kcl_http *h, char *line, size_t cap, uint64_t deadline)
{
	for (;;) {
		char *nl = memchr(h->rbuf + h->rpos, '\n', h->rend - h->rpos);
		if (nl) {
			size_t n = (size_t)(nl - (h->rbuf + h->rpos));
			size_t m = n;
			if (m > 0 && h->rbuf[h->rpos + m - 1] == '\r')
				m--;
			if (m >= cap)
				return kv_fail(KV_ERR_CORRUPT, "http: chunk line too long");
			memcpy(line, h->rbuf + h->rpos, m);
			line[m] = 0;
			h->rpos += n + 1;
			return KV_OK;
		}
		if (h->rend - h->rpos >= 4096)
			return kv_fail(KV_ERR_CORRUPT, "http: chunk line too long");
		long r = fill(h, deadline);
		if (r < 0)
			return (int)r;
		if (r == 0)
			return kv_fail(KV_ERR_IO, "http: connection closed inside chunked framing");
	}
}

long kcl_http_read(struct kcl_http *h, struct kcl_http_resp *r, void *buf, size_t cap)
{
	uint64_t deadline = deadline_of(h);
	char line[4200];
	int rc;

	for (;;) {
		switch (r->state) {
		case 4:
			return 0;
		case 1: { /* chunk size line: hex size, optional ;extensions */
			if ((rc = read_line(h, line, sizeof line, deadline)))
				return rc;
			char *e;
			errno = 0;
			unsigned long long sz = strtoull(line, &e, 16);
			if (e == line || errno || (*e && *e != ';' && *e != ' ' && *e != '\t') || sz > (1ull << 40))
				return kv_fail(KV_ERR_CORRUPT, "http: bad chunk size line '%.40s'", line);
			if (sz == 0) {
				r->state = 3;
			} else {
				r->remaining = (int64_t)sz;
				r->state = 0;
			}
			continue;
		}
		case 2: /* CRLF after chunk data */
			if ((rc = read_line(h, line, sizeof line, deadline)))
				return rc;
			if (line[0])
				return kv_fail(KV_ERR_CORRUPT, "http: missing CRLF after chunk data");
			r->state = 1;
			continue;
		case 3: /* trailers up to an empty line */
			if ((rc = read_line(h, line, sizeof line, deadline)))
				return rc;
			if (!line[0])
				r->state = 4;
			continue;
		default:
			break;
		}
		/* state 0: body bytes */
		if (r->remaining == 0) {
			r->state = r->chunked ? 2 : 4;
			continue;
		}
		if (h->rend == h->rpos) {
			long n = fill(h, deadline);
			if (n < 0)
				return n;
			if (n == 0) {
				if (r->remaining < 0) { /* body ends at close */
					r->state = 4;
					return 0;
				}
				return kv_fail(KV_ERR_IO, "http: connection closed with %lld body bytes missing",
					       (long long)r->remaining);
			}
		}
		size_t avail = h->rend - h->rpos;
		size_t n = avail < cap ? avail : cap;
		if (r->remaining >= 0 && (int64_t)n > r->remaining)
			n = (size_t)r->remaining;
		memcpy(buf, h->rbuf + h->rpos, n);
		h->rpos += n;
		if (r->remaining >= 0)
			r->remaining -= (int64_t)n;
		return (long)n;
	}
}

int kcl_http_read_all(struct kcl_http *h, struct kcl_http_resp *r, size_t max, char **out, size_t *len)
{
	struct kv_buf b = KV_BUF_INIT;
	char tmp[16384];
	*out = NULL;
	if (len)
		*len = 0;
	for (;;) {
		long n = kcl_http_read(h, r, tmp, sizeof tmp);
		if (n < 0) {
			kv_buf_free(&b);
			return (int)n;
		}
		if (n == 0)
			break;
		if (b.len + (size_t)n > max) {
			kv_buf_free(&b);
			return kv_fail(KV_ERR_FULL, "http: response body larger than %zu bytes", max);
		}
		kv_buf_add(&b, tmp, (size_t)n);
	}
	if (b.oom) {
		kv_buf_free(&b);
		return kv_fail(KV_ERR_NOMEM, "http: out of memory");
	}
	if (!b.p)
		kv_buf_reserve(&b, 1);
	if (b.oom || !b.p)
		return kv_fail(KV_ERR_NOMEM, "http: out of memory");
	if (len)
		*len = b.len;
	*out = kv_buf_take(&b);
	return KV_OK;
}

/* --- SSE ---------------------------------------------------------------- */

void kcl_sse_init(struct kcl_sse *s)
{
	memset(s, 0, sizeof *s);
	s->max_event = 16u << 20;
}

void kcl_sse_free(struct kcl_sse *s)
{
	kv_buf_free(&s->line);
	kv_buf_free(&s->data);
	kv_buf_free(&s->out);
	kv_buf_free(&s->pend);
	memset(s, 0, sizeof *s);
}

/* Handle one complete line. Returns 1 when it dispatched an event. */
static int sse_line(struct kcl_sse *s, struct kcl_sse_event *ev)
{
	const char *l = s->line.p ? s->line.p : "";
	size_t n = s->line.len;
	if (n == 0) {
		int got = 0;
		if (s->have_data) {
			kv_buf_reset(&s->out);
			kv_buf_add(&s->out, s->data.p ? s->data.p : "", s->data.len);
			if (!s->out.p)
				kv_buf_reserve(&s->out, 1);
			snprintf(s->out_event, sizeof s->out_event, "%s", s->event[0] ? s->event : "message");
			ev->event = s->out_event;
			ev->data = s->out.p ? s->out.p : "";
			ev->data_len = s->out.len;
			got = 1;
		}
		kv_buf_reset(&s->data);
		s->have_data = 0;
		s->event[0] = 0;
		return got;
	}
	if (l[0] == ':')
		return 0;
	const char *colon = memchr(l, ':', n);
	size_t fl = colon ? (size_t)(colon - l) : n;
	const char *v = colon ? colon + 1 : l + n;
	size_t vl = (size_t)(l + n - v);
	if (vl > 0 && *v == ' ') {
		v++;
		vl--;
	}
	if (fl == 4 && !memcmp(l, "data", 4)) {
		if (s->have_data)
			kv_buf_addc(&s->data, '\n');
		kv_buf_add(&s->data, v, vl);
		s->have_data = 1;
	} else if (fl == 5 && !memcmp(l, "event", 5)) {
		size_t m = vl < sizeof s->event - 1 ? vl : sizeof s->event - 1;
		memcpy(s->event, v, m);
		s->event[m] = 0;
	}
	return 0;
}

size_t kcl_sse_feed(struct kcl_sse *s, const char *p, size_t n, struct kcl_sse_event *ev, int *got)
{
	*got = 0;
	for (size_t i = 0; i < n; i++) {
		char c = p[i];
		if (c == '\n' && s->last_cr) { /* second half of \r\n */
			s->last_cr = 0;
			continue;
		}
		s->last_cr = 0;
		if (c == '\r' || c == '\n') {
			s->last_cr = c == '\r';
			int d = sse_line(s, ev);
			kv_buf_reset(&s->line);
			if (d) {
				*got = 1;
				return i + 1;
			}
			continue;
		}
		kv_buf_addc(&s->line, c);
		if (s->line.len + s->data.len > s->max_event || s->line.oom || s->data.oom)
			return (size_t)-1;
	}
	return n;
}

int kcl_http_next_event(struct kcl_http *h, struct kcl_http_resp *r, struct kcl_sse *s, struct kcl_sse_event *ev)
{
	char tmp[8192];
	for (;;) {
		if (s->pend_off < s->pend.len) {
			int got;
			size_t used = kcl_sse_feed(s, s->pend.p + s->pend_off, s->pend.len - s->pend_off, ev, &got);
			if (used == (size_t)-1)
				return kv_fail(KV_ERR_FULL, "sse: event larger than %zu bytes", s->max_event);
			s->pend_off += used;
			if (s->pend_off == s->pend.len) {
				kv_buf_reset(&s->pend);
				s->pend_off = 0;
			}
			if (got)
				return 1;
			continue;
		}
		long n = kcl_http_read(h, r, tmp, sizeof tmp);
		if (n < 0)
			return (int)n;
		if (n == 0) {
			/* end of body: flush an unterminated line and event */
			if (s->line.len) {
				sse_line(s, ev);
				kv_buf_reset(&s->line);
			}
			return sse_line(s, ev) ? 1 : 0;
		}
		kv_buf_reset(&s->pend);
		s->pend_off = 0;
		kv_buf_add(&s->pend, tmp, (size_t)n);
		if (s->pend.oom)
			return kv_fail(KV_ERR_NOMEM, "sse: out of memory");
	}
}

int kcl_http_fetch(const char *url, const char *method, const char *req_body, size_t req_len, int timeout_ms,
		   int *status, char **body, size_t *len)
{
	return kcl_http_fetch_h(url, method, req_body, req_len, timeout_ms, NULL, status, body, len);
}

int kcl_http_fetch_h(const char *url, const char *method, const char *req_body, size_t req_len, int timeout_ms,
		     const char *extra_headers, int *status, char **body, size_t *len)
{
	struct kcl_url u;
	struct kcl_http *h = NULL;
	struct kcl_http_resp r = {0};
	char *b = NULL;
	size_t bl = 0;
	int rc;

	if (status)
		*status = 0;
	if (body)
		*body = NULL;
	if (len)
		*len = 0;
	if ((rc = kcl_url_parse(url, &u)))
		return rc;
	if ((rc = kcl_http_connect(u.host, u.port, timeout_ms, &h)))
		return rc;
	rc = kcl_http_send(h, method, u.path[0] ? u.path : "/", req_body ? "application/json" : NULL, req_body,
			   req_len, extra_headers);
	if (!rc)
		rc = kcl_http_read_head(h, &r);
	if (!rc && strcasecmp(method, "HEAD"))
		rc = kcl_http_read_all(h, &r, 64u << 20, &b, &bl);
	if (!rc && status)
		*status = r.status;
	kcl_http_resp_free(&r);
	kcl_http_close(h);
	if (!rc && body)
		*body = b;
	else
		free(b);
	if (!rc && len)
		*len = bl;
	return rc;
}
