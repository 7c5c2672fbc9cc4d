/*
 * redis.c - see redis.h.
 *
 * Invariants: `mu` guards the node table, the slot map, the idle
 * connection lists, the counters and the last error; no socket I/O runs
 * under it. Nodes are never removed (at most KV_REDIS_MAX_NODES), so a
 * node index stays valid for the client's life. A connection is either
 * idle in its node's list or held by exactly one call; a connection that
 * saw any transport error is closed, never pooled: its reply stream may
 * be out of step with its requests.
 */
#include "base/redis.h"
#include "base/clock.h"
#include "base/err.h"

#include <hiredis/hiredis.h>
#include <hiredis/read.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MS 1000000ull
#define NODE_BACKOFF_MIN_NS (50 * MS)
#define NODE_BACKOFF_MAX_NS (2000 * MS)
#define REFRESH_MIN_NS (100 * MS)
#define MAX_REDIRECTS 5
#define MAX_STALLS 3              /* rounds where no node could take the ops */
#define READ_CHUNK (256u << 10)
#define RAW_BUF (64u << 10)       /* a connection's buffer for reply heads */
#define MAX_ARRAY (1 << 20)        /* elements of one array reply */
#define CMD_PING 100              /* internal: the probe's PING */
#define CMD_SLOTS 101             /* internal: CLUSTER SLOTS */

/* --- URL, CRC16, slots ------------------------------------------------- */

static int unhex(int c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Copy s[0, n) into out with %XX decoded. */
static int decode(const char *s, size_t n, char *out, size_t cap, const char *what)
{
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		int c = (unsigned char)s[i];
		if (c == '%') {
			if (i + 2 >= n)
				return kv_fail(KV_ERR_INVALID, "remote cache URL: a %% in the %s is not followed by two hex digits",
					       what);
			int a = unhex(s[i + 1]), b = unhex(s[i + 2]);
			if (a < 0 || b < 0)
				return kv_fail(KV_ERR_INVALID, "remote cache URL: a %% in the %s is not followed by two hex digits",
					       what);
			c = a * 16 + b;
			i += 2;
		}
		if (o + 1 >= cap)
			return kv_fail(KV_ERR_INVALID, "remote cache URL: the %s is longer than %zu bytes", what, cap - 1);
		out[o++] = (char)c;
	}
	out[o] = 0;
	return KV_OK;
}

static int parse_hostport(const char *s, size_t n, char *host, size_t hcap, int *port)
{
	const char *colon = NULL;
	size_t hl;
	if (n && s[0] == '[') {
		const char *rb = memchr(s, ']', n);
		if (!rb)
			return kv_fail(KV_ERR_INVALID, "remote cache URL: '%.*s' has no closing ']'", (int)n, s);
		hl = (size_t)(rb - s - 1);
		if (hl == 0 || hl >= hcap)
			return kv_fail(KV_ERR_INVALID, "remote cache URL: bad host in '%.*s'", (int)n, s);
		memcpy(host, s + 1, hl);
		host[hl] = 0;
		colon = rb + 1 < s + n ? rb + 1 : NULL;
		if (colon && *colon != ':')
			return kv_fail(KV_ERR_INVALID, "remote cache URL: '%.*s': expected ':' after ']'", (int)n, s);
	} else {
		colon = memchr(s, ':', n);
		hl = colon ? (size_t)(colon - s) : n;
		if (hl == 0 || hl >= hcap)
			return kv_fail(KV_ERR_INVALID, "remote cache URL: empty or too long host in '%.*s'", (int)n, s);
		for (size_t i = 0; i < hl; i++)
			if (s[i] == '@' || s[i] == '/' || s[i] == '[' || s[i] == ']' || (unsigned char)s[i] <= ' ')
				return kv_fail(KV_ERR_INVALID, "remote cache URL: bad character in host '%.*s'", (int)hl, s);
		memcpy(host, s, hl);
		host[hl] = 0;
	}
	*port = 6379;
	if (colon) {
		const char *p = colon + 1, *e = s + n;
		long v = 0;
		if (p == e)
			return kv_fail(KV_ERR_INVALID, "remote cache URL: empty port in '%.*s'", (int)n, s);
		for (; p < e; p++) {
			if (*p < '0' || *p > '9' || v > 65535)
				return kv_fail(KV_ERR_INVALID, "remote cache URL: bad port in '%.*s'", (int)n, s);
			v = v * 10 + (*p - '0');
		}
		if (v < 1 || v > 65535)
			return kv_fail(KV_ERR_INVALID, "remote cache URL: port out of range in '%.*s'", (int)n, s);
		*port = (int)v;
	}
	return KV_OK;
}

int kv_redis_url_parse(const char *url, struct kv_redis_url *out)
{
	const char *p, *end, *at;
	int rc;
	memset(out, 0, sizeof *out);
	if (!url || !*url)
		return kv_fail(KV_ERR_INVALID, "remote cache URL is empty");
	if (!strncmp(url, "rediss://", 9))
		return kv_fail(KV_ERR_INVALID, "remote cache URL: rediss:// (TLS) is not supported by this build; keep "
					       "Redis on a private network (docs/cluster.md)");
	if (strncmp(url, "redis://", 8))
		return kv_fail(KV_ERR_INVALID, "remote cache URL must start with redis:// (got '%.40s')", url);
	p = url + 8;
	end = p + strlen(p);
	/* an optional "/" or "/0" at the end: a cluster has database 0 only */
	{
		const char *sl = memchr(p, '/', (size_t)(end - p));
		if (sl) {
			if (!(sl + 1 == end || (sl[1] == '0' && sl + 2 == end)))
				return kv_fail(KV_ERR_INVALID, "remote cache URL: only database 0 exists in a cluster ('%s')", sl);
			end = sl;
		}
	}
	at = NULL;
	for (const char *q = p; q < end; q++)
		if (*q == '@')
			at = q;
	if (at) {
		const char *colon = memchr(p, ':', (size_t)(at - p));
		if (colon) {
			if ((rc = decode(p, (size_t)(colon - p), out->user, sizeof out->user, "user")) ||
			    (rc = decode(colon + 1, (size_t)(at - colon - 1), out->pass, sizeof out->pass, "password")))
				return rc;
		} else if ((rc = decode(p, (size_t)(at - p), out->pass, sizeof out->pass, "password"))) {
			return rc;
		}
		p = at + 1;
	}
	while (p < end) {
		const char *comma = memchr(p, ',', (size_t)(end - p));
		const char *e = comma ? comma : end;
		if (out->n_seeds == KV_REDIS_MAX_SEEDS)
			return kv_fail(KV_ERR_INVALID, "remote cache URL: more than %d hosts", KV_REDIS_MAX_SEEDS);
		if ((rc = parse_hostport(p, (size_t)(e - p), out->seed[out->n_seeds].host, sizeof out->seed[0].host,
					 &out->seed[out->n_seeds].port)))
			return rc;
		out->n_seeds++;
		p = comma ? comma + 1 : end;
		if (comma && p == end)
			return kv_fail(KV_ERR_INVALID, "remote cache URL ends with ','");
	}
	if (!out->n_seeds)
		return kv_fail(KV_ERR_INVALID, "remote cache URL names no host");
	return KV_OK;
}

uint16_t kv_redis_crc16(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint16_t crc = 0;
	for (size_t i = 0; i < n; i++) {
		crc ^= (uint16_t)(b[i] << 8);
		for (int k = 0; k < 8; k++)
			crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
	}
	return crc;
}

uint16_t kv_redis_slot(const char *key, size_t n)
{
	const char *open = memchr(key, '{', n);
	if (open) {
		size_t o = (size_t)(open - key);
		const char *close = memchr(open + 1, '}', n - o - 1);
		if (close && close > open + 1)
			return kv_redis_crc16(open + 1, (size_t)(close - open - 1)) & (KV_REDIS_SLOTS - 1);
	}
	return kv_redis_crc16(key, n) & (KV_REDIS_SLOTS - 1);
}

/* --- reply objects ------------------------------------------------------ */

/* hiredis's own reply objects abort the process when an allocation fails
 * (HIREDIS_OOM_HANDLER); ours return NULL, which the reader turns into an
 * error on that connection. */
struct rrep {
	int type;
	long long integer;
	size_t len;
	char *str;
	size_t elements;
	struct rrep **element;
	int borrowed;             /* str is the caller's buffer (kv_redis_op.buf): not ours to free */
};

static void *rep_attach(const redisReadTask *task, struct rrep *r)
{
	if (task->parent && task->parent->obj) {
		struct rrep *p = task->parent->obj;
		if (task->idx >= 0 && (size_t)task->idx < p->elements)
			p->element[task->idx] = r;
	}
	return r;
}

static void *rep_string(const redisReadTask *task, char *str, size_t len)
{
	struct rrep *r = calloc(1, sizeof *r);
	if (!r || !(r->str = malloc(len + 1))) {
		free(r);
		return NULL;
	}
	memcpy(r->str, str, len);
	r->str[len] = 0;
	r->len = len;
	r->type = task->type;
	return rep_attach(task, r);
}

static void *rep_array(const redisReadTask *task, int elements)
{
	struct rrep *r;
	if (elements < 0 || elements > MAX_ARRAY)
		return NULL;
	r = calloc(1, sizeof *r);
	if (!r)
		return NULL;
	if (elements && !(r->element = calloc((size_t)elements, sizeof *r->element))) {
		free(r);
		return NULL;
	}
	r->elements = (size_t)elements;
	r->type = REDIS_REPLY_ARRAY;
	return rep_attach(task, r);
}

static void *rep_integer(const redisReadTask *task, long long v)
{
	struct rrep *r = calloc(1, sizeof *r);
	if (!r)
		return NULL;
	r->type = REDIS_REPLY_INTEGER;
	r->integer = v;
	return rep_attach(task, r);
}

static void *rep_nil(const redisReadTask *task)
{
	struct rrep *r = calloc(1, sizeof *r);
	if (!r)
		return NULL;
	r->type = REDIS_REPLY_NIL;
	return rep_attach(task, r);
}

static void rep_free(void *o)
{
	struct rrep *r = o;
	if (!r)
		return;
	for (size_t i = 0; i < r->elements; i++)
		rep_free(r->element[i]);
	free(r->element);
	if (!r->borrowed)
		free(r->str);
	free(r);
}

static redisReplyObjectFunctions g_fns = {rep_string, rep_array, rep_integer, rep_nil, rep_free};

/* --- the client ---------------------------------------------------------- */

struct conn {
	redisContext *c;
	int node;
	int reused;               /* came from the idle list */
	/* batches of reads (GET, GETRANGE, STRLEN) read their replies here,
	 * not through hiredis's reader (raw_reply): a value's bytes then go
	 * from the socket straight into the buffer the caller gets (or gave:
	 * kv_redis_op.buf), where the reader would have copied them twice
	 * more (its growing buffer, then the reply object) */
	int raw;
	char *rb;                 /* RAW_BUF bytes (more while a send waits), or NULL */
	size_t rb_cap, rb_pos, rb_len;
	struct conn *next;
};

struct node {
	char host[256];
	int port;
	uint64_t fail_until;      /* skip until then (monotonic ns) */
	uint32_t streak;          /* consecutive connect failures */
	struct conn *idle;
	int n_idle;
};

struct kv_redis {
	struct kv_redis_params p;
	char url[1024];
	char user[128], pass[256];
	pthread_mutex_t mu;
	struct node nodes[KV_REDIS_MAX_NODES];
	int n_nodes;
	int n_seeds;              /* nodes[0, n_seeds) are the URL's hosts */
	int16_t slot[KV_REDIS_SLOTS];
	uint32_t covered, masters;
	int standalone;
	uint64_t refreshed_ns;
	int want_refresh;
	int abort_pipe[2];
	atomic_int aborted;
	struct kv_redis_stats st;
	char last_err[256];
	char refresh_err[200];    /* why the last refresh failed ("" after a good one) */
};

static void set_err(struct kv_redis *r, const char *msg)
{
	pthread_mutex_lock(&r->mu);
	snprintf(r->last_err, sizeof r->last_err, "%s", msg);
	pthread_mutex_unlock(&r->mu);
}

/* kv_fail, and remember the message for kv_redis_last_error. */
static int fail(struct kv_redis *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct kv_redis *r, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	kv_failv(code, fmt, ap);
	va_end(ap);
	set_err(r, kv_errmsg());
	return code;
}

/* Index of host:port, added when new (caller holds mu); -1 when full. */
static int node_find_add(struct kv_redis *r, const char *host, int port)
{
	for (int i = 0; i < r->n_nodes; i++)
		if (r->nodes[i].port == port && !strcmp(r->nodes[i].host, host))
			return i;
	if (r->n_nodes == KV_REDIS_MAX_NODES || strlen(host) >= sizeof r->nodes[0].host)
		return -1;
	struct node *n = &r->nodes[r->n_nodes];
	memset(n, 0, sizeof *n);
	snprintf(n->host, sizeof n->host, "%s", host);
	n->port = port;
	return r->n_nodes++;
}

int kv_redis_create(const struct kv_redis_params *p, struct kv_redis **out)
{
	struct kv_redis_url u;
	int rc;
	*out = NULL;
	if (!p || !p->url)
		return kv_fail(KV_ERR_INVALID, "remote cache: no URL");
	if ((rc = kv_redis_url_parse(p->url, &u)))
		return rc;
	struct kv_redis *r = calloc(1, sizeof *r);
	if (!r)
		return kv_fail(KV_ERR_NOMEM, "remote cache: out of memory");
	r->p = *p;
	snprintf(r->url, sizeof r->url, "%s", p->url);
	r->p.url = r->url;
	r->p.user = r->p.password = NULL;
	snprintf(r->user, sizeof r->user, "%s", p->user ? p->user : u.user);
	snprintf(r->pass, sizeof r->pass, "%s", p->password ? p->password : u.pass);
	if (r->p.timeout_ms <= 0)
		r->p.timeout_ms = KV_REDIS_TIMEOUT_MS;
	if (!r->p.max_reply)
		r->p.max_reply = 1ull << 30;
	if (r->p.idle_per_node <= 0)
		r->p.idle_per_node = 8;
	pthread_mutex_init(&r->mu, NULL);
	for (int i = 0; i < KV_REDIS_SLOTS; i++)
		r->slot[i] = -1;
	for (int i = 0; i < u.n_seeds; i++)
		node_find_add(r, u.seed[i].host, u.seed[i].port);
	r->n_seeds = r->n_nodes;
	r->want_refresh = 1;
	if (pipe2(r->abort_pipe, O_CLOEXEC | O_NONBLOCK)) {
		pthread_mutex_destroy(&r->mu);
		free(r);
		return kv_fail(KV_ERR_IO, "remote cache: pipe: %s", strerror(errno));
	}
	*out = r;
	return KV_OK;
}

static void conn_close(struct conn *k)
{
	if (!k)
		return;
	redisFree(k->c);
	free(k->rb);
	free(k);
}

void kv_redis_destroy(struct kv_redis *r)
{
	if (!r)
		return;
	for (int i = 0; i < r->n_nodes; i++)
		while (r->nodes[i].idle) {
			struct conn *k = r->nodes[i].idle;
			r->nodes[i].idle = k->next;
			conn_close(k);
		}
	close(r->abort_pipe[0]);
	close(r->abort_pipe[1]);
	pthread_mutex_destroy(&r->mu);
	free(r);
}

void kv_redis_abort(struct kv_redis *r)
{
	if (!r)
		return;
	atomic_store(&r->aborted, 1);
	char c = 1;
	ssize_t w = write(r->abort_pipe[1], &c, 1);
	(void)w;
}

/* Wait until fd has one of `events` (KV_OK, *got the events seen), the
 * deadline passes (KV_ERR_TIMEOUT) or the client is aborted. */
static int wait_fd(struct kv_redis *r, int fd, short events, uint64_t deadline, short *got)
{
	for (;;) {
		if (atomic_load(&r->aborted))
			return kv_fail(KV_ERR_CANCELLED, "remote cache: shutting down");
		uint64_t now = kv_now_ns();
		if (now >= deadline)
			return kv_fail(KV_ERR_TIMEOUT, "remote cache: timed out");
		int ms = (int)((deadline - now + MS - 1) / MS);
		struct pollfd pf[2] = {{.fd = fd, .events = events}, {.fd = r->abort_pipe[0], .events = POLLIN}};
		int n = poll(pf, 2, ms);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return kv_fail(KV_ERR_IO, "remote cache: poll: %s", strerror(errno));
		if (pf[1].revents)
			return kv_fail(KV_ERR_CANCELLED, "remote cache: shutting down");
		if (pf[0].revents) {
			if (got)
				*got = pf[0].revents;
			return KV_OK;
		}
	}
}

/* Read what the socket has (waiting for it first) into the reader. */
static int conn_fill(struct kv_redis *r, struct conn *k, uint64_t deadline, char *buf)
{
	short got = 0;
	int rc = wait_fd(r, k->c->fd, POLLIN, deadline, &got);
	if (rc)
		return rc;
	ssize_t n = recv(k->c->fd, buf, READ_CHUNK, MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return KV_OK;
	if (n < 0)
		return kv_fail(KV_ERR_IO, "remote cache: read: %s", strerror(errno));
	if (n == 0)
		return kv_fail(KV_ERR_IO, "remote cache: the server closed the connection");
	redisReader *rd = k->c->reader;
	if (rd->len - rd->pos + (size_t)n > r->p.max_reply + 65536)
		return kv_fail(KV_ERR_FULL, "remote cache: a reply is over %zu bytes", r->p.max_reply);
	if (redisReaderFeed(rd, buf, (size_t)n) != REDIS_OK)
		return kv_fail(KV_ERR_IO, "remote cache: reply: %s", rd->errstr);
	pthread_mutex_lock(&r->mu);
	r->st.bytes_in += (uint64_t)n;
	pthread_mutex_unlock(&r->mu);
	return KV_OK;
}

static int raw_reply(struct kv_redis *r, struct conn *k, uint64_t deadline, struct rrep **out, void *dst, size_t dcap);

/* The next reply (raw mode: a bulk string lands in dst when dst is set). */
static int conn_reply_into(struct kv_redis *r, struct conn *k, uint64_t deadline, char *buf, struct rrep **out,
			   void *dst, size_t dcap)
{
	*out = NULL;
	if (k->raw)
		return raw_reply(r, k, deadline, out, dst, dcap);
	for (;;) {
		void *rep = NULL;
		if (redisReaderGetReply(k->c->reader, &rep) != REDIS_OK)
			return kv_fail(KV_ERR_IO, "remote cache: bad reply: %s", k->c->reader->errstr);
		if (rep) {
			*out = rep;
			return KV_OK;
		}
		int rc = conn_fill(r, k, deadline, buf);
		if (rc)
			return rc;
	}
}

static int conn_reply(struct kv_redis *r, struct conn *k, uint64_t deadline, char *buf, struct rrep **out)
{
	return conn_reply_into(r, k, deadline, buf, out, NULL, 0);
}

/* Raw mode: read what the socket has (waiting for it first) into rb. */
static int raw_fill(struct kv_redis *r, struct conn *k, uint64_t deadline)
{
	short got = 0;
	if (k->rb_pos && k->rb_pos == k->rb_len)
		k->rb_pos = k->rb_len = 0;
	if (k->rb_len == k->rb_cap) {
		if (k->rb_pos) {
			memmove(k->rb, k->rb + k->rb_pos, k->rb_len - k->rb_pos);
			k->rb_len -= k->rb_pos;
			k->rb_pos = 0;
		} else {
			/* replies pile up while a long send waits: make room */
			size_t nc = k->rb_cap ? k->rb_cap * 2 : RAW_BUF;
			char *nb = nc <= r->p.max_reply + 65536 ? realloc(k->rb, nc) : NULL;
			if (!nb)
				return kv_fail(KV_ERR_FULL, "remote cache: replies over %zu bytes wait", r->p.max_reply);
			k->rb = nb;
			k->rb_cap = nc;
		}
	}
	int rc = wait_fd(r, k->c->fd, POLLIN, deadline, &got);
	if (rc)
		return rc;
	ssize_t n = recv(k->c->fd, k->rb + k->rb_len, k->rb_cap - k->rb_len, MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return KV_OK;
	if (n < 0)
		return kv_fail(KV_ERR_IO, "remote cache: read: %s", strerror(errno));
	if (n == 0)
		return kv_fail(KV_ERR_IO, "remote cache: the server closed the connection");
	k->rb_len += (size_t)n;
	pthread_mutex_lock(&r->mu);
	r->st.bytes_in += (uint64_t)n;
	pthread_mutex_unlock(&r->mu);
	return KV_OK;
}

/* Raw mode: n bytes into dst: what rb holds, then straight from the socket. */
static int raw_bytes(struct kv_redis *r, struct conn *k, uint64_t deadline, char *dst, size_t n)
{
	size_t have = k->rb_len - k->rb_pos, take = have < n ? have : n, got;
	memcpy(dst, k->rb + k->rb_pos, take);
	k->rb_pos += take;
	for (got = take; got < n;) {
		short ev = 0;
		int rc = wait_fd(r, k->c->fd, POLLIN, deadline, &ev);
		if (rc)
			return rc;
		ssize_t m = recv(k->c->fd, dst + got, n - got, MSG_DONTWAIT);
		if (m < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			continue;
		if (m < 0)
			return kv_fail(KV_ERR_IO, "remote cache: read: %s", strerror(errno));
		if (m == 0)
			return kv_fail(KV_ERR_IO, "remote cache: the server closed the connection");
		got += (size_t)m;
		pthread_mutex_lock(&r->mu);
		r->st.bytes_in += (uint64_t)m;
		pthread_mutex_unlock(&r->mu);
	}
	return KV_OK;
}

/*
 * Raw mode: one reply of a batch of reads (a status for ASKING, an error,
 * an integer for STRLEN, a bulk string or nil; anything else is out of
 * step). A bulk string's bytes land in dst (the op's own buffer: a reply
 * longer than dcap is KV_ERR_FULL), else in an exact-size buffer that
 * becomes the caller's value.
 */
static int raw_reply(struct kv_redis *r, struct conn *k, uint64_t deadline, struct rrep **out, void *dst, size_t dcap)
{
	char *crlf;
	int rc;
	*out = NULL;
	for (;;) {
		crlf = k->rb_len > k->rb_pos ? memmem(k->rb + k->rb_pos, k->rb_len - k->rb_pos, "\r\n", 2) : NULL;
		if (crlf)
			break;
		if (k->rb_len - k->rb_pos > 4096)
			return kv_fail(KV_ERR_IO, "remote cache: a reply line over 4096 bytes");
		if ((rc = raw_fill(r, k, deadline)))
			return rc;
	}
	char type = k->rb[k->rb_pos];
	size_t ll = (size_t)(crlf - (k->rb + k->rb_pos + 1));
	char line[4100];
	memcpy(line, k->rb + k->rb_pos + 1, ll);
	line[ll] = 0;
	k->rb_pos += ll + 3;
	struct rrep *rep = calloc(1, sizeof *rep);
	if (!rep)
		return kv_fail(KV_ERR_IO, "remote cache: out of memory");
	if (type == '+' || type == '-') {
		rep->type = type == '+' ? REDIS_REPLY_STATUS : REDIS_REPLY_ERROR;
		if (!(rep->str = strdup(line))) {
			rep_free(rep);
			return kv_fail(KV_ERR_IO, "remote cache: out of memory");
		}
		rep->len = ll;
		*out = rep;
		return KV_OK;
	}
	char *end = NULL;
	long long n = type == '$' || type == ':' ? strtoll(line, &end, 10) : -2;
	if (type == ':' && end && !*end && ll) {
		rep->type = REDIS_REPLY_INTEGER;
		rep->integer = n;
		*out = rep;
		return KV_OK;
	}
	if (type != '$' || !end || *end || n < -1) {
		rep_free(rep);
		return kv_fail(KV_ERR_IO, "remote cache: a read answered with an unexpected reply ('%c')", type);
	}
	if (n == -1) {
		rep->type = REDIS_REPLY_NIL;
		*out = rep;
		return KV_OK;
	}
	if ((unsigned long long)n > r->p.max_reply) {
		rep_free(rep);
		return kv_fail(KV_ERR_FULL, "remote cache: a reply of %lld bytes is over %zu", n, r->p.max_reply);
	}
	if (dst && (unsigned long long)n > dcap) {
		rep_free(rep);
		return kv_fail(KV_ERR_FULL, "remote cache: a reply of %lld bytes is over the %zu asked for", n, dcap);
	}
	rep->type = REDIS_REPLY_STRING;
	rep->len = (size_t)n;
	if (dst) {
		rep->str = dst;
		rep->borrowed = 1;
	} else if (!(rep->str = malloc((size_t)n + 1))) {
		rep_free(rep);
		return kv_fail(KV_ERR_IO, "remote cache: out of memory for a value of %lld bytes", n);
	}
	char tail[2];
	if ((rc = raw_bytes(r, k, deadline, rep->str, (size_t)n)) || (rc = raw_bytes(r, k, deadline, tail, 2))) {
		rep_free(rep);
		return rc;
	}
	if (tail[0] != '\r' || tail[1] != '\n') {
		rep_free(rep);
		return kv_fail(KV_ERR_IO, "remote cache: a value not followed by CRLF");
	}
	if (!dst)
		rep->str[n] = 0;
	*out = rep;
	return KV_OK;
}

/* Write the pieces (advancing iov), reading replies meanwhile when the
 * server sends them, so neither side can block the other. */
static int conn_send(struct kv_redis *r, struct conn *k, struct iovec *iov, size_t niov, uint64_t deadline, char *buf)
{
	uint64_t sent = 0;
	int rc = KV_OK;
	while (niov) {
		struct msghdr m = {.msg_iov = iov, .msg_iovlen = niov < IOV_MAX ? niov : IOV_MAX};
		ssize_t w = sendmsg(k->c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK) {
				rc = kv_fail(KV_ERR_IO, "remote cache: write: %s", strerror(errno));
				break;
			}
			short got = 0;
			if ((rc = wait_fd(r, k->c->fd, POLLOUT | POLLIN, deadline, &got)))
				break;
			if ((got & POLLIN) && !(got & POLLOUT) &&
			    (rc = k->raw ? raw_fill(r, k, deadline) : conn_fill(r, k, deadline, buf)))
				break;
			continue;
		}
		sent += (uint64_t)w;
		size_t left = (size_t)w;
		while (niov && left >= iov->iov_len) {
			left -= iov->iov_len;
			iov++;
			niov--;
		}
		if (niov && left) {
			iov->iov_base = (char *)iov->iov_base + left;
			iov->iov_len -= left;
		}
	}
	pthread_mutex_lock(&r->mu);
	r->st.bytes_out += sent;
	pthread_mutex_unlock(&r->mu);
	return rc;
}

/* One command as RESP into h (header of the pieces; a SET's value goes
 * as its own iovecs). Returns the bytes written to h. */
static size_t fmt_bulk(char *h, const char *s, size_t n)
{
	size_t o = (size_t)sprintf(h, "$%zu\r\n", n);
	memcpy(h + o, s, n);
	o += n;
	h[o++] = '\r';
	h[o++] = '\n';
	return o;
}

static int conn_auth(struct kv_redis *r, struct conn *k, uint64_t deadline, char *buf)
{
	char cmd[1024];
	size_t o;
	int rc;
	o = (size_t)sprintf(cmd, "*%d\r\n", r->user[0] ? 3 : 2);
	o += fmt_bulk(cmd + o, "AUTH", 4);
	if (r->user[0])
		o += fmt_bulk(cmd + o, r->user, strlen(r->user));
	o += fmt_bulk(cmd + o, r->pass, strlen(r->pass));
	struct iovec v = {cmd, o};
	struct rrep *rep = NULL;
	if ((rc = conn_send(r, k, &v, 1, deadline, buf)) || (rc = conn_reply(r, k, deadline, buf, &rep)))
		return rc;
	if (rep->type == REDIS_REPLY_ERROR) {
		pthread_mutex_lock(&r->mu);
		r->st.auth_failures++;
		pthread_mutex_unlock(&r->mu);
		rc = kv_fail(KV_ERR_IO, "remote cache: %s:%d refused the password: %.120s", r->nodes[k->node].host,
			     r->nodes[k->node].port, rep->str ? rep->str : "");
	}
	memset(cmd, 0, sizeof cmd);
	rep_free(rep);
	return rc;
}

/* A connection to node i: an idle one, or a new one (connected and
 * authenticated before the deadline). A node in its failure backoff is
 * refused at once unless `force`. */
static int conn_get(struct kv_redis *r, int i, uint64_t deadline, int force, char *buf, struct conn **out)
{
	char host[256];
	int port, rc;
	*out = NULL;
	if (atomic_load(&r->aborted))
		return kv_fail(KV_ERR_CANCELLED, "remote cache: shutting down");
	pthread_mutex_lock(&r->mu);
	struct node *nd = &r->nodes[i];
	struct conn *k = nd->idle;
	if (k) {
		nd->idle = k->next;
		nd->n_idle--;
		pthread_mutex_unlock(&r->mu);
		k->next = NULL;
		k->reused = 1;
		*out = k;
		return KV_OK;
	}
	if (!force && nd->fail_until > kv_now_ns()) {
		pthread_mutex_unlock(&r->mu);
		return kv_fail(KV_ERR_IO, "remote cache: %s:%d is not reachable (backing off)", nd->host, nd->port);
	}
	snprintf(host, sizeof host, "%s", nd->host);
	port = nd->port;
	r->st.connects++;
	pthread_mutex_unlock(&r->mu);

	k = calloc(1, sizeof *k);
	if (!k)
		return kv_fail(KV_ERR_NOMEM, "remote cache: out of memory");
	k->node = i;
	k->c = redisConnectNonBlock(host, port);
	if (!k->c) {
		free(k);
		return kv_fail(KV_ERR_NOMEM, "remote cache: out of memory");
	}
	if (k->c->err) {
		rc = kv_fail(KV_ERR_IO, "remote cache: connect %s:%d: %s", host, port, k->c->errstr);
		goto fail;
	}
	short got = 0;
	if ((rc = wait_fd(r, k->c->fd, POLLOUT, deadline, &got)))
		goto fail;
	int soerr = 0;
	socklen_t sl = sizeof soerr;
	if (getsockopt(k->c->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) || soerr) {
		rc = kv_fail(KV_ERR_IO, "remote cache: connect %s:%d: %s", host, port, strerror(soerr ? soerr : errno));
		goto fail;
	}
	k->c->reader->fn = &g_fns;
	if (r->pass[0] && (rc = conn_auth(r, k, deadline, buf)))
		goto fail;
	pthread_mutex_lock(&r->mu);
	r->nodes[i].streak = 0;
	r->nodes[i].fail_until = 0;
	pthread_mutex_unlock(&r->mu);
	*out = k;
	return KV_OK;
fail:
	conn_close(k);
	if (rc != KV_ERR_CANCELLED) {
		pthread_mutex_lock(&r->mu);
		struct node *n2 = &r->nodes[i];
		uint64_t b = NODE_BACKOFF_MIN_NS << (n2->streak < 6 ? n2->streak : 6);
		n2->fail_until = kv_now_ns() + (b < NODE_BACKOFF_MAX_NS ? b : NODE_BACKOFF_MAX_NS);
		n2->streak++;
		r->st.connect_failures++;
		r->want_refresh = 1;
		snprintf(r->last_err, sizeof r->last_err, "%s", kv_errmsg());
		pthread_mutex_unlock(&r->mu);
	}
	return rc;
}

static void conn_put(struct kv_redis *r, struct conn *k)
{
	/* bytes left over belong to no request: the stream is out of step */
	if (k->rb_len > k->rb_pos || k->c->reader->len > k->c->reader->pos) {
		conn_close(k);
		return;
	}
	k->raw = 0;
	k->rb_pos = k->rb_len = 0;
	pthread_mutex_lock(&r->mu);
	struct node *nd = &r->nodes[k->node];
	if (nd->n_idle < r->p.idle_per_node && !atomic_load(&r->aborted)) {
		k->next = nd->idle;
		nd->idle = k;
		nd->n_idle++;
		k = NULL;
	}
	pthread_mutex_unlock(&r->mu);
	conn_close(k);
}

/* A reused connection failed: its siblings in the pool are likely stale
 * too (the server restarted): drop them all. */
static void node_flush_idle(struct kv_redis *r, int i)
{
	pthread_mutex_lock(&r->mu);
	struct conn *k = r->nodes[i].idle;
	r->nodes[i].idle = NULL;
	r->nodes[i].n_idle = 0;
	pthread_mutex_unlock(&r->mu);
	while (k) {
		struct conn *n = k->next;
		conn_close(k);
		k = n;
	}
}

/* --- one call ------------------------------------------------------------ */

struct opx {
	uint16_t slot;
	int ask;          /* node to try after an ASK, -1 none */
	int asked;        /* this round: sent with ASKING */
	int redirects;
	int done;
	int fail;         /* the last transport failure: KV_ERR_IO / TIMEOUT / CANCELLED */
};

struct round {
	size_t completed, redirected, transient, unreachable;
};

/* Fill one op's result from its reply. */
static void handle_reply(struct kv_redis *r, struct kv_redis_op *op, struct opx *x, struct rrep *rep, struct round *rd)
{
	if (rep->type == REDIS_REPLY_ERROR) {
		const char *s = rep->str ? rep->str : "";
		unsigned slot;
		char ep[300];
		int moved = !strncmp(s, "MOVED ", 6), ask = !strncmp(s, "ASK ", 4);
		if ((moved || ask) && sscanf(s + (moved ? 6 : 4), "%u %299s", &slot, ep) == 2 && slot < KV_REDIS_SLOTS) {
			char *colon = strrchr(ep, ':');
			int port = colon ? atoi(colon + 1) : 0;
			if (colon)
				*colon = 0;
			pthread_mutex_lock(&r->mu);
			int ni = port > 0 && port < 65536 ? node_find_add(r, ep, port) : -1;
			if (moved) {
				r->st.moved++;
				if (ni >= 0)
					r->slot[slot] = (int16_t)ni;
				r->want_refresh = 1;
			} else {
				r->st.ask++;
				x->ask = ni;
			}
			pthread_mutex_unlock(&r->mu);
			rd->redirected++;
			if (ni < 0 || ++x->redirects > MAX_REDIRECTS) {
				x->done = 1;
				op->rc = fail(r, KV_ERR_IO, "remote cache: too many redirects for one key (last: %.100s)", s);
			}
			return;
		}
		if (!strncmp(s, "TRYAGAIN", 8) || !strncmp(s, "CLUSTERDOWN", 11) || !strncmp(s, "LOADING", 7) ||
		    !strncmp(s, "MASTERDOWN", 10) || !strncmp(s, "BUSY", 4)) {
			pthread_mutex_lock(&r->mu);
			r->st.tryagain++;
			if (!strncmp(s, "CLUSTERDOWN", 11))
				r->want_refresh = 1;
			pthread_mutex_unlock(&r->mu);
			x->fail = fail(r, KV_ERR_IO, "remote cache: %.120s", s);
			rd->transient++;
			return;
		}
		x->done = 1;
		pthread_mutex_lock(&r->mu);
		r->st.error_replies++;
		pthread_mutex_unlock(&r->mu);
		op->rc = fail(r, KV_ERR_INVALID, "remote cache: the server refused a command: %.160s", s);
		rd->completed++;
		return;
	}
	x->done = 1;
	rd->completed++;
	switch (op->cmd) {
	case KV_REDIS_GET:
	case KV_REDIS_GETRANGE:
		if (rep->type == REDIS_REPLY_NIL) {
			op->rc = KV_ERR_NOT_FOUND;
		} else if (rep->type == REDIS_REPLY_STRING && op->buf && !rep->borrowed && rep->len > op->cap) {
			op->rc = KV_ERR_FULL;
		} else if (rep->type == REDIS_REPLY_STRING && op->buf && !rep->borrowed) {
			/* read through hiredis (a batch mixing writes): to the buffer too */
			memcpy(op->buf, rep->str, rep->len);
			op->data = op->buf;
			op->len = rep->len;
			op->rc = KV_OK;
		} else if (rep->type == REDIS_REPLY_STRING) {
			op->data = rep->str;
			op->len = rep->len;
			rep->str = NULL;
			op->rc = KV_OK;
		} else {
			op->rc = fail(r, KV_ERR_INVALID, "remote cache: GET answered with reply type %d", rep->type);
		}
		break;
	case KV_REDIS_SET:
		op->rc = rep->type == REDIS_REPLY_STATUS ? KV_OK
							 : fail(r, KV_ERR_INVALID, "remote cache: SET answered with type %d",
								rep->type);
		break;
	case CMD_PING:
		op->rc = rep->type == REDIS_REPLY_STATUS ? KV_OK : fail(r, KV_ERR_INVALID, "remote cache: bad PING reply");
		break;
	default:
		if (rep->type == REDIS_REPLY_INTEGER) {
			op->n = rep->integer;
			op->rc = rep->integer > 0 ? KV_OK : KV_ERR_NOT_FOUND;
		} else {
			op->rc = fail(r, KV_ERR_INVALID, "remote cache: expected an integer, got reply type %d", rep->type);
		}
	}
}

static const char *cmd_name(int cmd, size_t *len)
{
	static const char *const n[] = {NULL, "GET", "SET", "EXISTS", "TOUCH", "DEL", "PING", "GETRANGE", "STRLEN"};
	const char *s = cmd == CMD_PING ? "PING" : cmd >= KV_REDIS_GET && cmd <= KV_REDIS_STRLEN ? n[cmd] : "PING";
	*len = strlen(s);
	return s;
}

/* The ops idx[0, k) (each not done, all for node `node`) on one
 * connection, pipelined. */
static void run_batch(struct kv_redis *r, int node, struct kv_redis_op *ops, struct opx *x, const size_t *idx, size_t k,
		      uint64_t deadline, char *buf, struct round *rd)
{
	struct conn *c = NULL;
	size_t hsize = 0, niov = 0, got = 0;
	int rc;
	for (size_t i = 0; i < k; i++)
		hsize += 160 + 2 * ops[idx[i]].klen + (x[idx[i]].asked ? 32 : 0);
	for (size_t i = 0; i < k; i++)
		niov += 2 + (size_t)(ops[idx[i]].cmd == KV_REDIS_SET ? ops[idx[i]].nval + 1 : 0);
	char *h = malloc(hsize);
	struct iovec *iov = malloc(niov * sizeof *iov);
	if (!h || !iov) {
		for (size_t i = 0; i < k; i++)
			x[idx[i]].fail = kv_fail(KV_ERR_IO, "remote cache: out of memory");
		goto out;
	}
	rc = conn_get(r, node, deadline, 0, buf, &c);
	if (rc) {
		for (size_t i = 0; i < k; i++)
			x[idx[i]].fail = rc == KV_ERR_NOMEM ? KV_ERR_IO : rc;
		rd->unreachable += k;
		goto out;
	}
	/* a batch of reads reads its replies raw (struct conn) */
	c->raw = 1;
	for (size_t i = 0; i < k; i++)
		if (ops[idx[i]].cmd != KV_REDIS_GET && ops[idx[i]].cmd != KV_REDIS_GETRANGE && ops[idx[i]].cmd != KV_REDIS_STRLEN)
			c->raw = 0;
	/* the pipeline: [ASKING] cmd key [value], for each op */
	size_t o = 0, v = 0;
	for (size_t i = 0; i < k; i++) {
		struct kv_redis_op *op = &ops[idx[i]];
		size_t cl, start = o;
		const char *cn = cmd_name(op->cmd, &cl);
		if (x[idx[i]].asked)
			o += (size_t)sprintf(h + o, "*1\r\n$6\r\nASKING\r\n");
		if (op->cmd == CMD_PING) {
			o += (size_t)sprintf(h + o, "*1\r\n");
			o += fmt_bulk(h + o, cn, cl);
			iov[v++] = (struct iovec){h + start, o - start};
			continue;
		}
		o += (size_t)sprintf(h + o, "*%d\r\n", op->cmd == KV_REDIS_SET ? 3 : op->cmd == KV_REDIS_GETRANGE ? 4 : 2);
		o += fmt_bulk(h + o, cn, cl);
		o += fmt_bulk(h + o, op->key, op->klen);
		if (op->cmd == KV_REDIS_GETRANGE) {
			char a[24], b[24];
			int la = snprintf(a, sizeof a, "%llu", (unsigned long long)op->start);
			int lb = snprintf(b, sizeof b, "%llu", (unsigned long long)op->end);
			o += fmt_bulk(h + o, a, (size_t)la);
			o += fmt_bulk(h + o, b, (size_t)lb);
		}
		if (op->cmd == KV_REDIS_SET) {
			size_t vl = 0;
			for (int j = 0; j < op->nval; j++)
				vl += op->val[j].iov_len;
			o += (size_t)sprintf(h + o, "$%zu\r\n", vl);
			iov[v++] = (struct iovec){h + start, o - start};
			for (int j = 0; j < op->nval; j++)
				if (op->val[j].iov_len)
					iov[v++] = op->val[j];
			iov[v++] = (struct iovec){(void *)"\r\n", 2};
		} else {
			iov[v++] = (struct iovec){h + start, o - start};
		}
	}
	rc = conn_send(r, c, iov, v, deadline, buf);
	for (; !rc && got < k; got++) {
		struct rrep *rep = NULL;
		struct opx *xi = &x[idx[got]];
		if (xi->asked) {
			if ((rc = conn_reply(r, c, deadline, buf, &rep)))
				break;
			rep_free(rep); /* +OK; an error shows in the command's own reply */
			rep = NULL;
		}
		struct kv_redis_op *op = &ops[idx[got]];
		int into = op->buf && (op->cmd == KV_REDIS_GET || op->cmd == KV_REDIS_GETRANGE);
		if ((rc = conn_reply_into(r, c, deadline, buf, &rep, into ? op->buf : NULL, into ? op->cap : 0)))
			break;
		handle_reply(r, op, xi, rep, rd);
		rep_free(rep);
	}
	if (rc) {
		/* the ops without a reply: retried (a reused connection may just
		 * be stale), except one whose reply was too big */
		int stale = c->reused && rc == KV_ERR_IO;
		if (stale)
			node_flush_idle(r, node);
		else if (rc == KV_ERR_IO) {
			pthread_mutex_lock(&r->mu);
			r->want_refresh = 1;
			pthread_mutex_unlock(&r->mu);
		}
		set_err(r, kv_errmsg());
		for (size_t i = got; i < k; i++) {
			if (i == got && rc == KV_ERR_FULL) {
				x[idx[i]].done = 1;
				ops[idx[i]].rc = KV_ERR_FULL;
				continue;
			}
			x[idx[i]].fail = rc;
		}
		if (!stale)
			rd->unreachable += k - got;
		conn_close(c);
		c = NULL;
	}
out:
	if (c)
		conn_put(r, c);
	free(h);
	free(iov);
}

/* CLUSTER SLOTS from node i into map; standalone servers own everything.
 * KV_OK, or the reason it could not be read. Caller holds nothing. */
static int read_slots(struct kv_redis *r, int i, uint64_t deadline, int force, char *buf, int16_t *map, int *standalone)
{
	struct conn *c;
	struct rrep *rep = NULL;
	int rc = conn_get(r, i, deadline, force, buf, &c);
	char cmd[64];
	size_t o;
	if (rc)
		return rc;
	o = (size_t)sprintf(cmd, "*2\r\n");
	o += fmt_bulk(cmd + o, "CLUSTER", 7);
	o += fmt_bulk(cmd + o, "SLOTS", 5);
	struct iovec v = {cmd, o};
	if ((rc = conn_send(r, c, &v, 1, deadline, buf)) || (rc = conn_reply(r, c, deadline, buf, &rep))) {
		if (c->reused)
			node_flush_idle(r, i);
		conn_close(c);
		return rc;
	}
	*standalone = 0;
	for (int s = 0; s < KV_REDIS_SLOTS; s++)
		map[s] = -1;
	if (rep->type == REDIS_REPLY_ERROR) {
		if (rep->str && strstr(rep->str, "cluster support disabled")) {
			*standalone = 1;
			for (int s = 0; s < KV_REDIS_SLOTS; s++)
				map[s] = (int16_t)i;
		} else {
			rc = kv_fail(KV_ERR_IO, "remote cache: CLUSTER SLOTS: %.120s", rep->str ? rep->str : "");
		}
	} else if (rep->type != REDIS_REPLY_ARRAY) {
		rc = kv_fail(KV_ERR_IO, "remote cache: CLUSTER SLOTS answered with reply type %d", rep->type);
	} else {
		char self[256];
		pthread_mutex_lock(&r->mu);
		snprintf(self, sizeof self, "%s", r->nodes[i].host);
		pthread_mutex_unlock(&r->mu);
		for (size_t e = 0; e < rep->elements && !rc; e++) {
			struct rrep *a = rep->element[e];
			if (!a || a->type != REDIS_REPLY_ARRAY || a->elements < 3 || !a->element[0] || !a->element[1] ||
			    !a->element[2] || a->element[0]->type != REDIS_REPLY_INTEGER ||
			    a->element[1]->type != REDIS_REPLY_INTEGER || a->element[2]->type != REDIS_REPLY_ARRAY ||
			    a->element[2]->elements < 2 || !a->element[2]->element[0] || !a->element[2]->element[1] ||
			    a->element[2]->element[0]->type != REDIS_REPLY_STRING ||
			    a->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
				rc = kv_fail(KV_ERR_IO, "remote cache: CLUSTER SLOTS: malformed range %zu", e);
				break;
			}
			long long lo = a->element[0]->integer, hi = a->element[1]->integer;
			long long port = a->element[2]->element[1]->integer;
			const char *host = a->element[2]->element[0]->str;
			if (lo < 0 || hi >= KV_REDIS_SLOTS || lo > hi || port < 1 || port > 65535) {
				rc = kv_fail(KV_ERR_IO, "remote cache: CLUSTER SLOTS: range %lld-%lld on port %lld", lo, hi, port);
				break;
			}
			if (!host[0] || !strcmp(host, "?"))
				host = self;
			pthread_mutex_lock(&r->mu);
			int ni = node_find_add(r, host, (int)port);
			pthread_mutex_unlock(&r->mu);
			if (ni < 0) {
				rc = kv_fail(KV_ERR_IO, "remote cache: CLUSTER SLOTS names more than %d nodes", KV_REDIS_MAX_NODES);
				break;
			}
			for (long long s = lo; s <= hi; s++)
				map[s] = (int16_t)ni;
		}
	}
	rep_free(rep);
	conn_put(r, c);
	return rc;
}

/* Read the slot map from the first node that gives it: the current
 * masters, then the other known nodes, then the URL's hosts. Rate
 * limited unless force. */
static int refresh(struct kv_redis *r, uint64_t deadline, int force, char *buf)
{
	int order[KV_REDIS_MAX_NODES], n = 0, rc = KV_ERR_IO;
	int16_t *map = malloc(KV_REDIS_SLOTS * sizeof *map);
	if (!map)
		return kv_fail(KV_ERR_NOMEM, "remote cache: out of memory");
	pthread_mutex_lock(&r->mu);
	uint64_t now = kv_now_ns();
	if (!force && r->refreshed_ns && now - r->refreshed_ns < REFRESH_MIN_NS) {
		pthread_mutex_unlock(&r->mu);
		free(map);
		return KV_OK;
	}
	r->refreshed_ns = now;
	r->want_refresh = 0;
	uint8_t is_master[KV_REDIS_MAX_NODES] = {0};
	for (int s = 0; s < KV_REDIS_SLOTS; s++)
		if (r->slot[s] >= 0)
			is_master[r->slot[s]] = 1;
	for (int pass = 0; pass < 3; pass++)
		for (int i = 0; i < r->n_nodes; i++) {
			int m = is_master[i], seed = i < r->n_seeds;
			if ((pass == 0 && m) || (pass == 1 && !m && !seed) || (pass == 2 && !m && seed))
				order[n++] = i;
		}
	pthread_mutex_unlock(&r->mu);
	int sa = 0;
	for (int k = 0; k < n && kv_now_ns() < deadline; k++) {
		if ((rc = read_slots(r, order[k], deadline, force, buf, map, &sa)) == KV_OK)
			break;
		if (rc == KV_ERR_CANCELLED)
			break;
	}
	if (rc == KV_OK) {
		uint8_t m[KV_REDIS_MAX_NODES] = {0};
		uint32_t cov = 0, nm = 0;
		for (int s = 0; s < KV_REDIS_SLOTS; s++)
			if (map[s] >= 0) {
				cov++;
				if (!m[map[s]]) {
					m[map[s]] = 1;
					nm++;
				}
			}
		pthread_mutex_lock(&r->mu);
		memcpy(r->slot, map, KV_REDIS_SLOTS * sizeof *map);
		r->covered = cov;
		r->masters = nm;
		r->standalone = sa;
		r->st.refreshes++;
		r->refresh_err[0] = 0;
		pthread_mutex_unlock(&r->mu);
	} else {
		pthread_mutex_lock(&r->mu);
		r->want_refresh = 1;
		snprintf(r->refresh_err, sizeof r->refresh_err, "%s", kv_errmsg());
		pthread_mutex_unlock(&r->mu);
		set_err(r, kv_errmsg());
	}
	free(map);
	return rc;
}

size_t kv_redis_exec(struct kv_redis *r, struct kv_redis_op *ops, size_t n, int timeout_ms)
{
	uint64_t t0 = kv_now_ns();
	uint64_t deadline = t0 + (uint64_t)(timeout_ms > 0 ? timeout_ms : r->p.timeout_ms) * MS;
	struct opx *x = calloc(n ? n : 1, sizeof *x);
	size_t *idx = malloc((n ? n : 1) * sizeof *idx);
	int *node_of = malloc((n ? n : 1) * sizeof *node_of);
	char *buf = malloc(READ_CHUNK);
	size_t failed = 0;
	int stalls = 0;
	for (size_t i = 0; i < n; i++) {
		ops[i].rc = KV_ERR_TIMEOUT;
		ops[i].data = NULL;
		ops[i].len = 0;
		ops[i].n = 0;
	}
	if (!x || !idx || !node_of || !buf) {
		for (size_t i = 0; i < n; i++)
			ops[i].rc = KV_ERR_IO;
		kv_fail(KV_ERR_NOMEM, "remote cache: out of memory");
		failed = n;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		x[i].slot = ops[i].key ? kv_redis_slot(ops[i].key, ops[i].klen) : 0;
		x[i].ask = -1;
		x[i].fail = KV_ERR_TIMEOUT;
	}
	for (int attempt = 0;; attempt++) {
		size_t pending = 0;
		for (size_t i = 0; i < n; i++)
			pending += !x[i].done;
		if (!pending)
			break;
		if (atomic_load(&r->aborted)) {
			for (size_t i = 0; i < n; i++)
				x[i].fail = KV_ERR_CANCELLED;
			break;
		}
		if (kv_now_ns() >= deadline)
			break;
		pthread_mutex_lock(&r->mu);
		int want = r->want_refresh || !r->covered;
		pthread_mutex_unlock(&r->mu);
		if (want)
			refresh(r, deadline, 0, buf);
		struct round rd = {0};
		pthread_mutex_lock(&r->mu);
		for (size_t i = 0; i < n; i++) {
			x[i].asked = 0;
			if (x[i].done)
				continue;
			if (x[i].ask >= 0) {
				node_of[i] = x[i].ask;
				x[i].asked = 1;
				x[i].ask = -1;
			} else {
				node_of[i] = r->slot[x[i].slot];
			}
		}
		pthread_mutex_unlock(&r->mu);
		/* group by node, one pipelined batch each */
		uint8_t seen[KV_REDIS_MAX_NODES] = {0};
		for (size_t i = 0; i < n; i++) {
			if (x[i].done)
				continue;
			if (node_of[i] < 0) {
				char why[200];
				pthread_mutex_lock(&r->mu);
				snprintf(why, sizeof why, "%s", r->refresh_err);
				pthread_mutex_unlock(&r->mu);
				x[i].fail = fail(r, KV_ERR_IO, "remote cache: slot %u has no node%s%s", x[i].slot,
						 why[0] ? "; the slot map could not be read: " : "", why);
				rd.unreachable++;
				continue;
			}
			if (seen[node_of[i]])
				continue;
			seen[node_of[i]] = 1;
			size_t k = 0;
			for (size_t j = i; j < n; j++)
				if (!x[j].done && node_of[j] == node_of[i])
					idx[k++] = j;
			run_batch(r, node_of[i], ops, x, idx, k, deadline, buf, &rd);
		}
		if (rd.redirected && !rd.transient && !rd.unreachable)
			continue; /* follow the redirects at once */
		if (!rd.transient && !rd.unreachable && !rd.redirected) {
			/* every op of the round got its answer: done, without the
			 * backoff below (it cost every call a millisecond) */
			size_t left = 0;
			for (size_t i = 0; i < n; i++)
				left += !x[i].done;
			if (!left)
				break;
		}
		if (rd.unreachable && !rd.completed && !rd.redirected && !rd.transient) {
			/* nothing could take the ops: after a few tries with a
			 * refreshed map, give up rather than wait for the deadline */
			if (++stalls >= MAX_STALLS)
				break;
			pthread_mutex_lock(&r->mu);
			r->want_refresh = 1;
			pthread_mutex_unlock(&r->mu);
		} else {
			stalls = 0;
		}
		uint64_t now = kv_now_ns(), wait = (uint64_t)(1u << (attempt < 5 ? attempt : 5)) * MS;
		if (now + wait >= deadline)
			wait = deadline > now ? deadline - now : 0;
		if (wait)
			kv_sleep_ms((wait + MS - 1) / MS);
	}
	for (size_t i = 0; i < n; i++) {
		if (x[i].done)
			continue;
		ops[i].rc = x[i].fail;
		failed++;
	}
out:
	pthread_mutex_lock(&r->mu);
	r->st.calls++;
	r->st.ops += n;
	for (size_t i = 0; i < n; i++) {
		if (ops[i].rc == KV_ERR_TIMEOUT)
			r->st.timeouts++;
		else if (ops[i].rc == KV_ERR_IO || ops[i].rc == KV_ERR_CANCELLED)
			r->st.io_errors++;
	}
	pthread_mutex_unlock(&r->mu);
	if (failed) {
		/* the calling thread's message names the first failure */
		for (size_t i = 0; i < n; i++)
			if (ops[i].rc == KV_ERR_TIMEOUT) {
				fail(r, KV_ERR_TIMEOUT, "remote cache: no answer within %d ms",
				     timeout_ms > 0 ? timeout_ms : r->p.timeout_ms);
				break;
			}
	}
	free(x);
	free(idx);
	free(node_of);
	free(buf);
	return failed;
}

int kv_redis_probe(struct kv_redis *r, int timeout_ms)
{
	uint64_t deadline = kv_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : r->p.timeout_ms) * MS;
	char *buf = malloc(READ_CHUNK);
	int rc, masters[KV_REDIS_MAX_NODES], nm = 0;
	if (!buf)
		return kv_fail(KV_ERR_NOMEM, "remote cache: out of memory");
	if ((rc = refresh(r, deadline, 1, buf)))
		goto out;
	pthread_mutex_lock(&r->mu);
	uint8_t m[KV_REDIS_MAX_NODES] = {0};
	for (int s = 0; s < KV_REDIS_SLOTS; s++)
		if (r->slot[s] >= 0 && !m[r->slot[s]]) {
			m[r->slot[s]] = 1;
			masters[nm++] = r->slot[s];
		}
	uint32_t cov = r->covered;
	pthread_mutex_unlock(&r->mu);
	if (cov < KV_REDIS_SLOTS) {
		rc = fail(r, KV_ERR_IO, "remote cache: %u of %d slots have no master", KV_REDIS_SLOTS - cov, KV_REDIS_SLOTS);
		goto out;
	}
	for (int i = 0; i < nm && !rc; i++) {
		struct conn *c;
		struct rrep *rep = NULL;
		char cmd[32];
		size_t o = (size_t)sprintf(cmd, "*1\r\n");
		o += fmt_bulk(cmd + o, "PING", 4);
		struct iovec v = {cmd, o};
		if ((rc = conn_get(r, masters[i], deadline, 1, buf, &c)))
			break;
		if ((rc = conn_send(r, c, &v, 1, deadline, buf)) || (rc = conn_reply(r, c, deadline, buf, &rep))) {
			conn_close(c);
			node_flush_idle(r, masters[i]);
			break;
		}
		if (rep->type != REDIS_REPLY_STATUS) {
			pthread_mutex_lock(&r->mu);
			rc = kv_fail(KV_ERR_IO, "remote cache: %s:%d answered PING with: %.100s", r->nodes[masters[i]].host,
				     r->nodes[masters[i]].port, rep->str ? rep->str : "?");
			pthread_mutex_unlock(&r->mu);
		}
		rep_free(rep);
		conn_put(r, c);
	}
	if (rc)
		set_err(r, kv_errmsg());
out:
	free(buf);
	return rc;
}

void kv_redis_stats(struct kv_redis *r, struct kv_redis_stats *out)
{
	pthread_mutex_lock(&r->mu);
	*out = r->st;
	out->nodes = (uint32_t)r->n_nodes;
	out->masters = r->masters;
	out->slots_covered = r->covered;
	out->standalone = r->standalone;
	pthread_mutex_unlock(&r->mu);
}

void kv_redis_last_error(struct kv_redis *r, char *out, size_t cap)
{
	pthread_mutex_lock(&r->mu);
	snprintf(out, cap, "%s", r->last_err);
	pthread_mutex_unlock(&r->mu);
}
