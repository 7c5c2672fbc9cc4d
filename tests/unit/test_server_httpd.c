/*
 * test_server_httpd.c - src/server/httpd: the libmicrohttpd transport on
 * loopback with test handlers: whole replies, keep-alive, 413 before the
 * body is read, chunked streams, a client hanging up mid-stream and while a
 * handler blocks, the head deadline against a byte-trickling client, and
 * 200 idle connections that must not stop service. Every wait is bounded.
 */
#include "kt.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "client/http_client.h"
#include "server/httpd.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static atomic_int g_done_count, g_last_status, g_gone_fired, g_handler_saw_gone, g_producer_cancelled;
static atomic_int g_timeouts;
static char g_last_route[64];

struct prod {
	struct ksv_stream *st;
	int n, gap_ms;
};

static void *producer(void *arg)
{
	struct prod *p = arg;
	char line[64];
	for (int i = 0; i < p->n; i++) {
		snprintf(line, sizeof line, "data: %d\n\n", i);
		if (ksv_stream_write(p->st, line, strlen(line)) == KV_ERR_CANCELLED) {
			atomic_store(&g_producer_cancelled, 1);
			break;
		}
		kv_sleep_ms((uint64_t)p->gap_ms);
	}
	ksv_stream_end(p->st);
	free(p);
	return NULL;
}

static void on_gone(void *arg)
{
	(void)arg;
	atomic_store(&g_gone_fired, 1);
}

static void handler(void *ctx, const struct ksv_request *rq)
{
	(void)ctx;
	if (!strcmp(rq->path, "/echo")) {
		ksv_conn_set_route(rq->conn, "/echo");
		ksv_conn_header(rq->conn, "X-Len", "1");
		ksv_conn_reply(rq->conn, 200, "text/plain", rq->body, rq->body_len);
	} else if (!strcmp(rq->path, "/stream") || !strcmp(rq->path, "/slowstream") || !strcmp(rq->path, "/gapstream")) {
		int slow = !strcmp(rq->path, "/slowstream"), gap = !strcmp(rq->path, "/gapstream");
		struct ksv_stream *st = ksv_conn_stream(rq->conn, 200, "text/event-stream");
		if (!st)
			return;
		ksv_stream_on_gone(st, on_gone, NULL);
		struct prod *p = malloc(sizeof *p);
		p->st = st;
		p->n = slow ? 200 : gap ? 2 : 5;
		p->gap_ms = slow ? 20 : gap ? 2500 : 5;
		pthread_t th;
		pthread_create(&th, NULL, producer, p);
		pthread_detach(th);
	} else if (!strcmp(rq->path, "/block")) {
		/* wait up to 5 s for the client to leave */
		for (int i = 0; i < 250; i++) {
			if (ksv_conn_gone(rq->conn)) {
				atomic_store(&g_handler_saw_gone, 1);
				break;
			}
			kv_sleep_ms(20);
		}
		ksv_conn_reply(rq->conn, 200, "text/plain", "late", 4);
	} else if (!strcmp(rq->path, "/sleep")) {
		kv_sleep_ms(2500); /* longer than the 1 s inactivity timeout */
		ksv_conn_reply(rq->conn, 200, "text/plain", "slept", 5);
	} else if (!strcmp(rq->path, "/none")) {
		/* no reply: the transport answers 500 */
	} else {
		ksv_conn_reply(rq->conn, 404, "text/plain", "no", 2);
	}
}

static void on_done(void *ctx, const char *route, int status, int gone, double s)
{
	(void)ctx;
	(void)gone;
	(void)s;
	snprintf(g_last_route, sizeof g_last_route, "%s", route);
	atomic_store(&g_last_status, status);
	atomic_fetch_add(&g_done_count, 1);
}

static void on_timeout(void *ctx)
{
	(void)ctx;
	atomic_fetch_add(&g_timeouts, 1);
}

static int g_idle_s = 30;

static int g_max_conns = 400;

static struct ksv_httpd *start(int header_timeout_ms)
{
	struct ksv_httpd *h = NULL;
	struct ksv_httpd_params p = {.host = "127.0.0.1",
				     .port = 0,
				     .max_body = 1000,
				     .max_connections = g_max_conns,
				     .header_timeout_ms = header_timeout_ms,
				     .stall_timeout_s = g_idle_s,
				     .handler = handler,
				     .on_done = on_done,
				     .on_timeout = on_timeout};
	if (ksv_httpd_start(&p, &h))
		return NULL;
	return h;
}

static int raw_connect(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Read from fd until the peer closes or ms pass; returns bytes read. */
static size_t read_until_close(int fd, char *buf, size_t cap, int ms, int *closed)
{
	size_t n = 0;
	uint64_t end = kv_now_ns() + (uint64_t)ms * 1000000ull;
	*closed = 0;
	while (kv_now_ns() < end) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		if (poll(&pf, 1, 20) <= 0)
			continue;
		ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
		if (r <= 0) {
			*closed = 1;
			break;
		}
		n += (size_t)r;
		if (n >= cap - 1)
			break;
	}
	buf[n] = 0;
	return n;
}

static int get(int port, const char *method, const char *path, const char *body, char **out)
{
	char url[128];
	int st = 0;
	snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
	if (kcl_http_fetch(url, method, body, body ? strlen(body) : 0, 5000, &st, out, NULL)) {
		fprintf(stderr, "  fetch %s: %s\n", path, kv_errmsg());
		return -1;
	}
	return st;
}

KT_CASE(reply_echo_and_route)
{
	struct ksv_httpd *h = start(2000);
	KT_REQUIRE(h);
	int port = ksv_httpd_port(h);
	char *b = NULL;
	int before = atomic_load(&g_done_count);
	KT_EQ_INT(get(port, "POST", "/echo", "{\"x\":1}", &b), 200);
	KT_EQ_STR(b, "{\"x\":1}");
	free(b);
	for (int i = 0; i < 100 && atomic_load(&g_done_count) == before; i++)
		kv_sleep_ms(10);
	KT_EQ_STR(g_last_route, "/echo");
	KT_EQ_INT(atomic_load(&g_last_status), 200);
	KT_EQ_INT(get(port, "GET", "/nope", NULL, &b), 404);
	free(b);
	KT_EQ_INT(get(port, "GET", "/none", NULL, &b), 500);
	KT_CHECK(b && strstr(b, "\"error\""));
	free(b);
	ksv_httpd_stop(h);
}

KT_CASE(keep_alive_two_requests)
{
	struct ksv_httpd *h = start(2000);
	KT_REQUIRE(h);
	struct kcl_http *c;
	struct kcl_http_resp r;
	char *b;
	size_t n;
	KT_OK(kcl_http_connect("127.0.0.1", ksv_httpd_port(h), 5000, &c));
	for (int i = 0; i < 2; i++) {
		KT_OK(kcl_http_send(c, "POST", "/echo", "text/plain", "abc", 3, NULL));
		KT_OK(kcl_http_read_head(c, &r));
		KT_EQ_INT(r.status, 200);
		KT_EQ_INT(r.keep_alive, 1);
		KT_OK(kcl_http_read_all(c, &r, 100, &b, &n));
		KT_EQ_STR(b, "abc");
		free(b);
		kcl_http_resp_free(&r);
	}
	kcl_http_close(c);
	ksv_httpd_stop(h);
}

/* 413 arrives although the body was never sent. */
KT_CASE(body_limit_413_before_body)
{
	struct ksv_httpd *h = start(2000);
	KT_REQUIRE(h);
	int fd = raw_connect(ksv_httpd_port(h));
	KT_REQUIRE(fd >= 0);
	const char *head = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
			   "Content-Length: 100000000\r\n\r\n";
	KT_REQUIRE(send(fd, head, strlen(head), 0) == (ssize_t)strlen(head));
	char buf[2048];
	int closed;
	uint64_t t0 = kv_now_ns();
	read_until_close(fd, buf, sizeof buf, 3000, &closed);
	KT_CHECKF(strncmp(buf, "HTTP/1.1 413", 12) == 0, "got '%.40s'", buf);
	KT_CHECK(strstr(buf, "request_too_large") != NULL);
	KT_CHECK(closed);
	KT_CHECK((kv_now_ns() - t0) / 1000000 < 2500);
	close(fd);
	/* a body within the limit is fine */
	char *b = NULL;
	KT_EQ_INT(get(ksv_httpd_port(h), "POST", "/echo", "small", &b), 200);
	free(b);
	ksv_httpd_stop(h);
}

/* A chunked upload is cut off once it passes the limit. */
KT_CASE(body_limit_chunked)
{
	struct ksv_httpd *h = start(2000);
	KT_REQUIRE(h);
	int fd = raw_connect(ksv_httpd_port(h));
	KT_REQUIRE(fd >= 0);
	const char *head = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
	KT_REQUIRE(send(fd, head, strlen(head), 0) > 0);
	char chunk[600];
	memset(chunk, 'a', sizeof chunk);
	int cut = 0;
	for (int i = 0; i < 10 && !cut; i++) {
		char sz[16];
		snprintf(sz, sizeof sz, "%zx\r\n", sizeof chunk);
		if (send(fd, sz, strlen(sz), MSG_NOSIGNAL) < 0 || send(fd, chunk, sizeof chunk, MSG_NOSIGNAL) < 0 ||
		    send(fd, "\r\n", 2, MSG_NOSIGNAL) < 0)
			cut = 1;
		kv_sleep_ms(20);
	}
	char buf[2048];
	int closed;
	read_until_close(fd, buf, sizeof buf, 3000, &closed);
	/* a 413 the client can read (not an empty reply), then the close */
	KT_CHECKF(strncmp(buf, "HTTP/1.1 413", 12) == 0, "got '%.40s'", buf);
	KT_CHECK(strstr(buf, "request_too_large") != NULL);
	KT_CHECK(closed || cut);
	for (int i = 0; i < 100 && atomic_load(&g_last_status) != 413; i++)
		kv_sleep_ms(10);
	KT_EQ_INT(atomic_load(&g_last_status), 413);
	close(fd);
	ksv_httpd_stop(h);
}

KT_CASE(stream_chunks)
{
	struct ksv_httpd *h = start(2000);
	KT_REQUIRE(h);
	struct kcl_http *c;
	struct kcl_http_resp r;
	struct kcl_sse s;
	struct kcl_sse_event ev;
	KT_OK(kcl_http_connect("127.0.0.1", ksv_httpd_port(h), 5000, &c));
	KT_OK(kcl_http_send(c, "GET", "/stream", NULL, NULL, 0, NULL));
	KT_OK(kcl_http_read_head(c, &r));
	KT_EQ_INT(r.status, 200);
	KT_EQ_INT(r.chunked, 1);
	kcl_sse_init(&s);
	for (int i = 0; i < 5; i++) {
		char want[16];
		snprintf(want, sizeof want, "%d", i);
		KT_EQ_INT(kcl_http_next_event(c, &r, &s, &ev), 1);
		KT_EQ_STR(ev.data, want);
	}
	KT_EQ_INT(kcl_http_next_event(c, &r, &s, &ev), 0);
	kcl_sse_free(&s);
	kcl_http_resp_free(&r);
	kcl_http_close(c);
	ksv_httpd_stop(h);
}

KT_CASE(stream_client_hangs_up)
{
	struct ksv_httpd *h = start(2000);
	KT_REQUIRE(h);
	struct kcl_http *c;
	struct kcl_http_resp r;
	struct kcl_sse s;
	struct kcl_sse_event ev;
	atomic_store(&g_gone_fired, 0);
	atomic_store(&g_producer_cancelled, 0);
	KT_OK(kcl_http_connect("127.0.0.1", ksv_httpd_port(h), 5000, &c));
	KT_OK(kcl_http_send(c, "GET", "/slowstream", NULL, NULL, 0, NULL));
	KT_OK(kcl_http_read_head(c, &r));
	kcl_sse_init(&s);
	KT_EQ_INT(kcl_http_next_event(c, &r, &s, &ev), 1);
	kcl_sse_free(&s);
	kcl_http_resp_free(&r);
	kcl_http_close(c); /* hang up after the first event */
	uint64_t t0 = kv_now_ns();
	while (!(atomic_load(&g_gone_fired) && atomic_load(&g_producer_cancelled)) && kv_now_ns() - t0 < 3000000000ull)
		kv_sleep_ms(5);
	KT_CHECK(atomic_load(&g_gone_fired));
	KT_CHECK(atomic_load(&g_producer_cancelled));
	/* the producer would have run 4 s; it stopped within a few of its 20 ms steps */
	KT_CHECKF((kv_now_ns() - t0) / 1000000 < 500, "noticed after %llu ms",
		  (unsigned long long)((kv_now_ns() - t0) / 1000000));
	ksv_httpd_stop(h);
}

KT_CASE(blocking_handler_sees_hangup)
{
	struct ksv_httpd *h = start(2000);
	KT_REQUIRE(h);
	atomic_store(&g_handler_saw_gone, 0);
	int fd = raw_connect(ksv_httpd_port(h));
	KT_REQUIRE(fd >= 0);
	const char *req = "GET /block HTTP/1.1\r\nHost: x\r\n\r\n";
	KT_REQUIRE(send(fd, req, strlen(req), 0) > 0);
	kv_sleep_ms(100);
	close(fd);
	uint64_t t0 = kv_now_ns();
	while (!atomic_load(&g_handler_saw_gone) && kv_now_ns() - t0 < 3000000000ull)
		kv_sleep_ms(5);
	KT_CHECK(atomic_load(&g_handler_saw_gone));
	ksv_httpd_stop(h);
}

struct served {
	int port;
	int ok;
};

static void *serve_other(void *arg)
{
	struct served *s = arg;
	for (int i = 0; i < 5; i++) {
		char *b = NULL;
		if (get(s->port, "POST", "/echo", "hi", &b) == 200 && b && !strcmp(b, "hi"))
			s->ok++;
		free(b);
		kv_sleep_ms(100);
	}
	return NULL;
}

/* One header byte every 100 ms: closed at the 600 ms deadline, while
 * another client keeps being served. */
KT_CASE(slow_header_client_is_closed)
{
	struct ksv_httpd *h = start(600);
	KT_REQUIRE(h);
	int port = ksv_httpd_port(h);
	int before = atomic_load(&g_timeouts);
	int fd = raw_connect(port);
	KT_REQUIRE(fd >= 0);
	struct served sv = {.port = port};
	pthread_t th;
	pthread_create(&th, NULL, serve_other, &sv);
	const char *req = "GET /echo HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
	uint64_t t0 = kv_now_ns();
	int closed_at_ms = -1;
	for (size_t i = 0; i < strlen(req); i++) {
		if (send(fd, req + i, 1, MSG_NOSIGNAL) != 1) {
			closed_at_ms = (int)((kv_now_ns() - t0) / 1000000);
			break;
		}
		struct pollfd pf = {.fd = fd, .events = POLLIN | POLLRDHUP};
		if (poll(&pf, 1, 100) > 0) {
			char b[64];
			if (recv(fd, b, sizeof b, 0) <= 0) {
				closed_at_ms = (int)((kv_now_ns() - t0) / 1000000);
				break;
			}
		}
	}
	pthread_join(th, NULL);
	close(fd);
	/* the watchdog counts the kill just after it shut the socket */
	for (int i = 0; i < 100 && atomic_load(&g_timeouts) == before; i++)
		kv_sleep_ms(10);
	KT_CHECKF(closed_at_ms >= 500 && closed_at_ms < 2000, "closed at %d ms", closed_at_ms);
	KT_EQ_INT(sv.ok, 5);
	KT_CHECKF(atomic_load(&g_timeouts) > before, "timeouts %d before %d closed at %d", atomic_load(&g_timeouts), before, closed_at_ms);
	ksv_httpd_stop(h);
}

KT_CASE(two_hundred_idle_connections)
{
	struct ksv_httpd *h = start(5000);
	KT_REQUIRE(h);
	int port = ksv_httpd_port(h);
	int fds[200], n = 0;
	for (int i = 0; i < 200; i++) {
		fds[i] = raw_connect(port);
		if (fds[i] >= 0)
			n++;
	}
	KT_EQ_INT(n, 200);
	uint64_t t0 = kv_now_ns();
	char *b = NULL;
	KT_EQ_INT(get(port, "POST", "/echo", "still here", &b), 200);
	KT_EQ_STR(b, "still here");
	free(b);
	KT_CHECK((kv_now_ns() - t0) / 1000000 < 2000);
	for (int i = 0; i < 100 && ksv_httpd_connections(h) < 200; i++)
		kv_sleep_ms(10);
	KT_CHECK(ksv_httpd_connections(h) >= 200);
	for (int i = 0; i < 200; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	ksv_httpd_stop(h);
}

/* A handler that takes longer than the inactivity timeout still answers:
 * the timeout is for silent sockets, not for slow generations. */
KT_CASE(slow_handler_outlives_idle_timeout)
{
	g_idle_s = 1;
	struct ksv_httpd *h = start(5000);
	g_idle_s = 30;
	KT_REQUIRE(h);
	char *b = NULL;
	KT_EQ_INT(get(ksv_httpd_port(h), "GET", "/sleep", NULL, &b), 200);
	KT_EQ_STR(b, "slept");
	free(b);
	/* same for a stream that is silent for longer than the timeout */
	KT_EQ_INT(get(ksv_httpd_port(h), "GET", "/gapstream", NULL, &b), 200);
	KT_EQ_STR(b, "data: 0\n\ndata: 1\n\n");
	free(b);
	ksv_httpd_stop(h);
}

KT_CASE(bind_error)
{
	struct ksv_httpd *a = start(1000), *b = NULL;
	KT_REQUIRE(a);
	struct ksv_httpd_params p = {.host = "127.0.0.1", .port = ksv_httpd_port(a), .max_body = 10,
				     .handler = handler};
	KT_EQ_INT(ksv_httpd_start(&p, &b), KV_ERR_IO);
	p.host = "no.such.host.invalid";
	p.port = 0;
	KT_CHECK(ksv_httpd_start(&p, &b) != KV_OK);
	ksv_httpd_stop(a);
}

/* As many idle sockets as the connection limit (one peer, renewing them):
 * /health-style requests are still served at once, not after the header
 * timeout, because idle connections keep a reserve free. */
KT_CASE(idle_connections_keep_a_reserve)
{
	g_max_conns = 32;
	struct ksv_httpd *h = start(5000);
	g_max_conns = 400;
	KT_REQUIRE(h);
	int port = ksv_httpd_port(h);
	int fds[64];
	for (int i = 0; i < 64; i++)
		fds[i] = raw_connect(port);
	kv_sleep_ms(200);
	for (int round = 0; round < 3; round++) {
		uint64_t t0 = kv_now_ns();
		char *b = NULL;
		KT_EQ_INT(get(port, "POST", "/echo", "served", &b), 200);
		KT_EQ_STR(b, "served");
		free(b);
		KT_CHECKF((kv_now_ns() - t0) / 1000000 < 1500, "round %d took %llu ms", round,
			  (unsigned long long)((kv_now_ns() - t0) / 1000000));
		/* the attacker renews what was closed */
		for (int i = 0; i < 64; i++) {
			close(fds[i]);
			fds[i] = raw_connect(port);
		}
		kv_sleep_ms(100);
	}
	KT_CHECK(ksv_httpd_connections(h) <= 32);
	for (int i = 0; i < 64; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	ksv_httpd_stop(h);
}

KT_MAIN(idle_connections_keep_a_reserve, reply_echo_and_route, keep_alive_two_requests, body_limit_413_before_body, body_limit_chunked, stream_chunks,
	stream_client_hangs_up, blocking_handler_sees_hangup, slow_header_client_is_closed,
	two_hundred_idle_connections, slow_handler_outlives_idle_timeout, bind_error)
