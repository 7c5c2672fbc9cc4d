/*
 * test_client_http.c - src/client/http_client: URL parsing, response
 * framing (Content-Length, chunked, until close), the SSE parser fed at
 * every split point, timeouts and abort. The peer is a canned-bytes server
 * on a loopback socket run by a thread of this test, so the exact wire
 * bytes (including broken ones) are under the test's control.
 */
#include "kt.h"
#include "base/clock.h"
#include "base/err.h"
#include "client/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* --- canned server ------------------------------------------------------ */

struct canned {
	int lfd;
	int port;
	const char *reply;     /* bytes sent after the request head was read */
	size_t reply_len;
	int delay_ms;          /* sleep between bytes of reply (0: one send) */
	int hold_ms;           /* keep the socket open this long before closing */
	char req[8192];        /* what the client sent (head + body) */
	size_t req_len;
	pthread_t th;
};

static void *canned_main(void *arg)
{
	struct canned *c = arg;
	int fd = accept(c->lfd, NULL, NULL);
	if (fd < 0)
		return NULL;
	/* read the request head, then the body by Content-Length */
	c->req_len = 0;
	for (;;) {
		ssize_t r = recv(fd, c->req + c->req_len, sizeof c->req - 1 - c->req_len, 0);
		if (r <= 0)
			break;
		c->req_len += (size_t)r;
		c->req[c->req_len] = 0;
		char *e = strstr(c->req, "\r\n\r\n");
		if (e) {
			const char *cl = strcasestr(c->req, "content-length:");
			size_t want = (size_t)(e + 4 - c->req) + (cl ? (size_t)atol(cl + 15) : 0);
			if (c->req_len >= want)
				break;
		}
	}
	if (c->delay_ms) {
		for (size_t i = 0; i < c->reply_len; i++) {
			if (send(fd, c->reply + i, 1, MSG_NOSIGNAL) != 1)
				break;
			kv_sleep_ms((uint64_t)c->delay_ms);
		}
	} else if (c->reply_len) {
		if (send(fd, c->reply, c->reply_len, MSG_NOSIGNAL) < 0) {
			/* the client may have gone; nothing to do */
		}
	}
	if (c->hold_ms)
		kv_sleep_ms((uint64_t)c->hold_ms);
	close(fd);
	return NULL;
}

static int canned_start(struct canned *c, const char *reply, size_t len)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof a;
	c->lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (c->lfd < 0 || bind(c->lfd, (struct sockaddr *)&a, sizeof a) || listen(c->lfd, 4) ||
	    getsockname(c->lfd, (struct sockaddr *)&a, &al))
		return -1;
	c->port = ntohs(a.sin_port);
	c->reply = reply;
	c->reply_len = len;
	return pthread_create(&c->th, NULL, canned_main, c);
}

static void canned_stop(struct canned *c)
{
	pthread_join(c->th, NULL);
	close(c->lfd);
}

/* One request against a canned reply; returns the body (malloc'd) or NULL. */
static char *roundtrip(const char *reply, int *status, int *rc_out)
{
	struct canned c = {0};
	struct kcl_http *h = NULL;
	struct kcl_http_resp r;
	char *body = NULL;
	size_t len;
	int rc;
	*rc_out = -100;
	if (canned_start(&c, reply, strlen(reply)))
		return NULL;
	rc = kcl_http_connect("127.0.0.1", c.port, 5000, &h);
	if (!rc)
		rc = kcl_http_send(h, "POST", "/v1/x", "application/json", "{\"a\":1}", 7, "X-Test: 1\r\n");
	if (!rc)
		rc = kcl_http_read_head(h, &r);
	if (!rc) {
		*status = r.status;
		rc = kcl_http_read_all(h, &r, 1 << 20, &body, &len);
		kcl_http_resp_free(&r);
	}
	*rc_out = rc;
	kcl_http_close(h);
	canned_stop(&c);
	return body;
}

KT_CASE(url_parse)
{
	struct kcl_url u;
	KT_OK(kcl_url_parse("http://127.0.0.1:8000/v1/", &u));
	KT_EQ_STR(u.host, "127.0.0.1");
	KT_EQ_INT(u.port, 8000);
	KT_EQ_STR(u.path, "/v1");
	KT_OK(kcl_url_parse("http://localhost", &u));
	KT_EQ_INT(u.port, 80);
	KT_EQ_STR(u.path, "");
	KT_OK(kcl_url_parse("http://[::1]:9/a", &u));
	KT_EQ_STR(u.host, "::1");
	KT_EQ_INT(u.port, 9);
	KT_EQ_INT(kcl_url_parse("https://x", &u), KV_ERR_INVALID);
	KT_EQ_INT(kcl_url_parse("http://:80", &u), KV_ERR_INVALID);
	KT_EQ_INT(kcl_url_parse("http://h:0/", &u), KV_ERR_INVALID);
	KT_EQ_INT(kcl_url_parse("http://h:99999/", &u), KV_ERR_INVALID);
	KT_EQ_INT(kcl_url_parse("http://h:12x/", &u), KV_ERR_INVALID);
	KT_EQ_INT(kcl_url_parse(NULL, &u), KV_ERR_INVALID);
}

KT_CASE(content_length_body)
{
	int st = 0, rc;
	char *b = roundtrip("HTTP/1.1 201 Created\r\nContent-Length: 5\r\nX-A:  v  \r\n\r\nhello", &st, &rc);
	KT_OK(rc);
	KT_EQ_INT(st, 201);
	KT_EQ_STR(b, "hello");
	free(b);
}

KT_CASE(chunked_body)
{
	int st = 0, rc;
	char *b = roundtrip("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
			    "3\r\nabc\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nTrailer: x\r\n\r\n",
			    &st, &rc);
	KT_OK(rc);
	KT_EQ_STR(b, "abcabcdefghijklmnopqrstuvwxyz");
	free(b);
}

KT_CASE(body_until_close)
{
	int st = 0, rc;
	char *b = roundtrip("HTTP/1.0 200 OK\r\n\r\nall of it", &st, &rc);
	KT_OK(rc);
	KT_EQ_STR(b, "all of it");
	free(b);
}

KT_CASE(broken_framing_is_an_error)
{
	int st = 0, rc;
	char *b = roundtrip("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n", &st, &rc);
	KT_EQ_INT(rc, KV_ERR_CORRUPT);
	free(b);
	b = roundtrip("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", &st, &rc);
	KT_EQ_INT(rc, KV_ERR_IO);
	free(b);
	b = roundtrip("garbage\r\n\r\n", &st, &rc);
	KT_EQ_INT(rc, KV_ERR_CORRUPT);
	free(b);
	b = roundtrip("HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\n", &st, &rc);
	KT_EQ_INT(rc, KV_ERR_CORRUPT);
	free(b);
	b = roundtrip("", &st, &rc); /* closed without a head */
	KT_EQ_INT(rc, KV_ERR_IO);
	free(b);
}

KT_CASE(request_bytes_and_headers)
{
	struct canned c = {0};
	struct kcl_http *h;
	struct kcl_http_resp r;
	char v[64];
	const char *reply = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nConnection: close\r\n"
			    "Content-Length: 0\r\n\r\n";
	KT_REQUIRE(canned_start(&c, reply, strlen(reply)) == 0);
	KT_OK(kcl_http_connect("127.0.0.1", c.port, 5000, &h));
	KT_OK(kcl_http_send(h, "POST", "/p", "application/json", "{}", 2, NULL));
	KT_OK(kcl_http_read_head(h, &r));
	KT_EQ_INT(kcl_http_header(&r, "Content-Type", v, sizeof v), 1);
	KT_EQ_STR(v, "text/event-stream");
	KT_EQ_INT(kcl_http_header(&r, "x-none", v, sizeof v), 0);
	KT_EQ_INT(r.keep_alive, 0);
	char buf[8];
	KT_EQ_INT(kcl_http_read(h, &r, buf, sizeof buf), 0);
	kcl_http_resp_free(&r);
	kcl_http_close(h);
	canned_stop(&c);
	KT_CHECK(strncmp(c.req, "POST /p HTTP/1.1\r\n", 18) == 0);
	KT_CHECK(strcasestr(c.req, "\r\nHost: 127.0.0.1:") != NULL);
	KT_CHECK(strstr(c.req, "\r\nContent-Length: 2\r\n") != NULL);
	KT_CHECK(c.req_len >= 2 && !memcmp(c.req + c.req_len - 2, "{}", 2));
}

/* Every split of an SSE byte stream gives the same events. */
KT_CASE(sse_every_split)
{
	const char *stream = ": comment\r\n"
			     "data: {\"a\":1}\r\n\r\n"
			     "event: ping\ndata:x\ndata: y\n\n"
			     "id: 7\rdata: z\r\r"
			     "data\n\n"   /* a field with no colon: empty data */
			     "retry: 5\n\n" /* no data: not dispatched */
			     "data: [DONE]\n\n";
	const char *want_data[] = {"{\"a\":1}", "x\ny", "z", "", "[DONE]"};
	const char *want_ev[] = {"message", "ping", "message", "message", "message"};
	size_t n = strlen(stream);
	for (size_t split = 0; split <= n; split++) {
		struct kcl_sse s;
		struct kcl_sse_event ev;
		int k = 0, got;
		kcl_sse_init(&s);
		const char *parts[2] = {stream, stream + split};
		size_t lens[2] = {split, n - split};
		for (int pi = 0; pi < 2; pi++) {
			size_t off = 0;
			while (off < lens[pi]) {
				size_t u = kcl_sse_feed(&s, parts[pi] + off, lens[pi] - off, &ev, &got);
				KT_REQUIRE(u != (size_t)-1);
				off += u;
				if (got) {
					KT_REQUIRE(k < 5);
					KT_CHECKF(!strcmp(ev.data, want_data[k]), "split %zu event %d: '%s'", split, k,
						  ev.data);
					KT_EQ_STR(ev.event, want_ev[k]);
					KT_EQ_INT(ev.data_len, strlen(want_data[k]));
					k++;
				}
			}
		}
		KT_CHECKF(k == 5, "split %zu: %d events", split, k);
		kcl_sse_free(&s);
	}
}

KT_CASE(sse_event_size_limit)
{
	struct kcl_sse s;
	struct kcl_sse_event ev;
	int got;
	char big[300];
	memset(big, 'a', sizeof big);
	memcpy(big, "data: ", 6);
	kcl_sse_init(&s);
	s.max_event = 100;
	KT_EQ_U64(kcl_sse_feed(&s, big, sizeof big, &ev, &got), (size_t)-1);
	kcl_sse_free(&s);
}

/* SSE over a chunked response, one byte at a time on the wire. */
KT_CASE(sse_over_chunked_slow)
{
	struct canned c = {0};
	struct kcl_http *h;
	struct kcl_http_resp r;
	struct kcl_sse s;
	struct kcl_sse_event ev;
	const char *reply = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
			    "8\r\ndata: a\n\r\n"
			    "9\r\n\ndata: bb\r\n"
			    "2\r\n\n\n\r\n"
			    "8\r\ndata: c\n\r\n" /* unterminated last event */
			    "0\r\n\r\n";
	c.delay_ms = 1;
	KT_REQUIRE(canned_start(&c, reply, strlen(reply)) == 0);
	KT_OK(kcl_http_connect("127.0.0.1", c.port, 5000, &h));
	KT_OK(kcl_http_send(h, "GET", "/", NULL, NULL, 0, NULL));
	KT_OK(kcl_http_read_head(h, &r));
	kcl_sse_init(&s);
	KT_EQ_INT(kcl_http_next_event(h, &r, &s, &ev), 1);
	KT_EQ_STR(ev.data, "a");
	KT_EQ_INT(kcl_http_next_event(h, &r, &s, &ev), 1);
	KT_EQ_STR(ev.data, "bb");
	KT_EQ_INT(kcl_http_next_event(h, &r, &s, &ev), 1);
	KT_EQ_STR(ev.data, "c");
	KT_EQ_INT(kcl_http_next_event(h, &r, &s, &ev), 0);
	kcl_sse_free(&s);
	kcl_http_resp_free(&r);
	kcl_http_close(h);
	canned_stop(&c);
}

KT_CASE(timeout_and_abort)
{
	struct canned c = {0};
	struct kcl_http *h;
	struct kcl_http_resp r;
	c.hold_ms = 1500; /* never answers */
	KT_REQUIRE(canned_start(&c, "", 0) == 0);
	KT_OK(kcl_http_connect("127.0.0.1", c.port, 300, &h));
	KT_OK(kcl_http_send(h, "GET", "/", NULL, NULL, 0, NULL));
	uint64_t t0 = kv_now_ns();
	KT_EQ_INT(kcl_http_read_head(h, &r), KV_ERR_TIMEOUT);
	double el = (double)(kv_now_ns() - t0) / 1e9;
	KT_CHECKF(el > 0.25 && el < 1.2, "timeout took %.3f s", el);
	/* abort from this thread before the call: returns at once */
	kcl_http_set_timeout(h, 0);
	kcl_http_abort(h);
	t0 = kv_now_ns();
	KT_EQ_INT(kcl_http_read_head(h, &r), KV_ERR_CANCELLED);
	KT_CHECK((double)(kv_now_ns() - t0) / 1e9 < 0.5);
	kcl_http_close(h);
	canned_stop(&c);
}

KT_CASE(connect_refused)
{
	struct kcl_http *h = NULL;
	/* bind a port, close it, connect: refused */
	struct canned c = {0};
	KT_REQUIRE(canned_start(&c, "", 0) == 0);
	int port = c.port;
	/* let the canned thread finish by connecting once */
	KT_OK(kcl_http_connect("127.0.0.1", port, 1000, &h));
	kcl_http_close(h);
	canned_stop(&c);
	h = NULL;
	KT_EQ_INT(kcl_http_connect("127.0.0.1", port, 1000, &h), KV_ERR_IO);
	KT_CHECK(h == NULL);
	KT_EQ_INT(kcl_http_connect("", 80, 1000, &h), KV_ERR_INVALID);
}

KT_CASE(fetch_one_shot)
{
	struct canned c = {0};
	const char *reply = "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}";
	char url[64], *body = NULL;
	size_t len = 0;
	int st = 0;
	KT_REQUIRE(canned_start(&c, reply, strlen(reply)) == 0);
	snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/models", c.port);
	KT_OK(kcl_http_fetch(url, "GET", NULL, 0, 5000, &st, &body, &len));
	canned_stop(&c);
	KT_EQ_INT(st, 404);
	KT_EQ_STR(body, "{}");
	KT_EQ_INT(len, 2);
	KT_CHECK(strncmp(c.req, "GET /v1/models HTTP/1.1\r\n", 25) == 0);
	free(body);
}

KT_MAIN(url_parse, content_length_body, chunked_body, body_until_close, broken_framing_is_an_error,
	request_bytes_and_headers, sse_every_split, sse_event_size_limit, sse_over_chunked_slow, timeout_and_abort,
	connect_refused, fetch_one_shot)
