/*
 * fake_redis.h - a small in-process Redis Cluster for the unit tests of
 * base/redis.c and store/remote.c: N nodes on 127.0.0.1 (port 0, each
 * with its own accept thread and a thread per connection), one shared
 * key space, a slot owner per slot, and faults a test switches on:
 *
 *   owner[s]        the node serving slot s; a key of another node's slot
 *                   gets "MOVED s host:port" (so a client with a stale map
 *                   is redirected, as by a real cluster)
 *   migrating[s]    slot s moving to node migrating[s]: its owner still
 *                   serves keys it has and answers "ASK" for the others;
 *                   the target serves it only right after ASKING
 *   delay_ms        every command of a node waits this long (a slow node)
 *   set_delay_ms    every SET of a node waits this long (slow writes only)
 *   read_delay_ms   every GET, GETRANGE and STRLEN of a node waits this long
 *                   (slow reads only: a lookup's EXISTS goes through);
 *                   reads_in_flight / max_reads_in_flight count the reads
 *                   waiting so on all nodes at once (a client's concurrency)
 *   down            the node closes its listener and every connection (a
 *                   dead master); fr_up opens it again on the same port
 *   tryagain        the next n commands get -TRYAGAIN
 *   drop_after_ranges  the value a GETRANGE reads is deleted just before
 *                   the n-th GETRANGE from now is answered (evicted in the
 *                   middle of a ranged read)
 *   password        AUTH required
 *   standalone      CLUSTER SLOTS answers "cluster support disabled"
 *
 * Only what the client sends is understood: AUTH, PING, ASKING, CLUSTER
 * SLOTS, GET, GETRANGE, STRLEN, SET, EXISTS, TOUCH, DEL. Values live in one list shared by
 * every node (the fake has no real data placement: ownership only decides
 * who answers). Counters per node let tests see where commands went.
 */
#ifndef KV_TESTS_FAKE_REDIS_H
#define KV_TESTS_FAKE_REDIS_H

#include "base/redis.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FR_MAX_NODES 4
#define FR_MAX_CONNS 64

struct fr_kv {
	char *key;
	size_t klen;
	char *val;
	size_t vlen;
	struct fr_kv *next;
};

struct fr_cluster;

struct fr_node {
	struct fr_cluster *cl;
	int idx;
	int port;
	int lfd;
	pthread_t acceptor;
	int running;
	atomic_int down;
	atomic_int delay_ms;
	atomic_int set_delay_ms;
	atomic_int read_delay_ms;
	atomic_int commands;    /* data commands served (GET/SET/...) */
	atomic_int moved_sent, ask_sent;
	int conns[FR_MAX_CONNS];
	pthread_mutex_t cmu;
};

struct fr_cluster {
	pthread_mutex_t mu;
	struct fr_node node[FR_MAX_NODES];
	int n;
	int owner[KV_REDIS_SLOTS];
	int migrating[KV_REDIS_SLOTS]; /* -1 none */
	struct fr_kv *kv;
	char password[64];
	atomic_int tryagain;
	atomic_int drop_after_ranges;
	atomic_int reads_in_flight, max_reads_in_flight;
	int standalone;
};

struct fr_conn {
	struct fr_node *nd;
	int fd;
	char *buf;
	size_t len, cap, pos;
};

static int fr_fill(struct fr_conn *c)
{
	if (c->pos == c->len)
		c->pos = c->len = 0;
	if (c->len == c->cap) {
		if (c->pos) {
			memmove(c->buf, c->buf + c->pos, c->len - c->pos);
			c->len -= c->pos;
			c->pos = 0;
		} else {
			size_t nc = c->cap ? c->cap * 2 : 65536;
			char *nb = realloc(c->buf, nc);
			if (!nb)
				return -1;
			c->buf = nb;
			c->cap = nc;
		}
	}
	ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
	if (n <= 0)
		return -1;
	c->len += (size_t)n;
	return 0;
}

/* A line (without CRLF) into out; -1 on EOF. */
static int fr_line(struct fr_conn *c, char *out, size_t cap)
{
	for (;;) {
		char *e = c->len > c->pos ? memchr(c->buf + c->pos, '\n', c->len - c->pos) : NULL;
		if (e) {
			size_t n = (size_t)(e - (c->buf + c->pos));
			if (n && c->buf[c->pos + n - 1] == '\r')
				n--;
			if (n >= cap)
				n = cap - 1;
			memcpy(out, c->buf + c->pos, n);
			out[n] = 0;
			c->pos = (size_t)(e - c->buf) + 1;
			return 0;
		}
		if (fr_fill(c))
			return -1;
	}
}

static int fr_bytes(struct fr_conn *c, char *out, size_t n)
{
	while (c->len - c->pos < n + 2)
		if (fr_fill(c))
			return -1;
	memcpy(out, c->buf + c->pos, n);
	c->pos += n + 2;
	return 0;
}

static void fr_send(int fd, const void *p, size_t n)
{
	const char *b = p;
	while (n) {
		ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
		if (w <= 0)
			return;
		b += w;
		n -= (size_t)w;
	}
}

static void fr_sendf(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fr_sendf(int fd, const char *fmt, ...)
{
	char b[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(b, sizeof b, fmt, ap);
	va_end(ap);
	fr_send(fd, b, (size_t)n);
}

/* caller holds mu */
static inline struct fr_kv **fr_find(struct fr_cluster *cl, const char *k, size_t kl)
{
	for (struct fr_kv **p = &cl->kv; *p; p = &(*p)->next)
		if ((*p)->klen == kl && !memcmp((*p)->key, k, kl))
			return p;
	return NULL;
}

static void fr_put(struct fr_cluster *cl, const char *k, size_t kl, const char *v, size_t vl)
{
	pthread_mutex_lock(&cl->mu);
	struct fr_kv **p = fr_find(cl, k, kl), *e;
	if (p) {
		e = *p;
		free(e->val);
	} else {
		e = calloc(1, sizeof *e);
		e->key = malloc(kl);
		memcpy(e->key, k, kl);
		e->klen = kl;
		e->next = cl->kv;
		cl->kv = e;
	}
	e->val = malloc(vl ? vl : 1);
	memcpy(e->val, v, vl);
	e->vlen = vl;
	pthread_mutex_unlock(&cl->mu);
}

static inline int fr_exists(struct fr_cluster *cl, const char *k, size_t kl)
{
	pthread_mutex_lock(&cl->mu);
	int e = fr_find(cl, k, kl) != NULL;
	pthread_mutex_unlock(&cl->mu);
	return e;
}

static void *fr_conn_main(void *arg)
{
	struct fr_conn *c = arg;
	struct fr_node *nd = c->nd;
	struct fr_cluster *cl = nd->cl;
	int authed = !cl->password[0], asking = 0;
	char line[128];
	char *argv[4] = {0};
	size_t argl[4];
	for (;;) {
		int argc;
		if (fr_line(c, line, sizeof line) || line[0] != '*')
			break;
		argc = atoi(line + 1);
		if (argc < 1 || argc > 4)
			break;
		int bad = 0;
		for (int i = 0; i < argc; i++) {
			if (fr_line(c, line, sizeof line) || line[0] != '$') {
				bad = 1;
				break;
			}
			argl[i] = (size_t)atoll(line + 1);
			free(argv[i]);
			argv[i] = malloc(argl[i] + 1);
			if (!argv[i] || fr_bytes(c, argv[i], argl[i])) {
				bad = 1;
				break;
			}
			argv[i][argl[i]] = 0;
		}
		if (bad || atomic_load(&nd->down))
			break;
		int d = atomic_load(&nd->delay_ms);
		if (d)
			usleep((useconds_t)d * 1000);
		const char *cmd = argv[0];
		if ((d = atomic_load(&nd->set_delay_ms)) && !strcasecmp(cmd, "SET"))
			usleep((useconds_t)d * 1000);
		if ((d = atomic_load(&nd->read_delay_ms)) &&
		    (!strcasecmp(cmd, "GET") || !strcasecmp(cmd, "GETRANGE") || !strcasecmp(cmd, "STRLEN"))) {
			int now = atomic_fetch_add(&cl->reads_in_flight, 1) + 1, m = atomic_load(&cl->max_reads_in_flight);
			while (now > m && !atomic_compare_exchange_weak(&cl->max_reads_in_flight, &m, now))
				;
			usleep((useconds_t)d * 1000);
			atomic_fetch_sub(&cl->reads_in_flight, 1);
		}
		if (!strcasecmp(cmd, "AUTH")) {
			const char *pw = argv[argc - 1];
			authed = !strcmp(pw, cl->password);
			fr_sendf(c->fd, authed ? "+OK\r\n" : "-WRONGPASS invalid username-password pair\r\n");
			continue;
		}
		if (!authed) {
			fr_sendf(c->fd, "-NOAUTH Authentication required.\r\n");
			continue;
		}
		if (!strcasecmp(cmd, "PING")) {
			fr_sendf(c->fd, "+PONG\r\n");
			continue;
		}
		if (!strcasecmp(cmd, "ASKING")) {
			asking = 1;
			fr_sendf(c->fd, "+OK\r\n");
			continue;
		}
		if (!strcasecmp(cmd, "CLUSTER")) {
			if (cl->standalone) {
				fr_sendf(c->fd, "-ERR This instance has cluster support disabled\r\n");
				continue;
			}
			/* contiguous ranges of the owner table */
			char *out = malloc(1 << 16);
			size_t o = 0;
			int nr = 0;
			char body[1 << 15];
			size_t bo = 0;
			pthread_mutex_lock(&cl->mu);
			for (int s = 0; s < KV_REDIS_SLOTS;) {
				int e = s, ow = cl->owner[s];
				while (e + 1 < KV_REDIS_SLOTS && cl->owner[e + 1] == ow)
					e++;
				if (ow >= 0) {
					bo += (size_t)snprintf(body + bo, sizeof body - bo,
							       "*3\r\n:%d\r\n:%d\r\n*3\r\n$9\r\n127.0.0.1\r\n:%d\r\n$2\r\nid\r\n", s, e,
							       cl->node[ow].port);
					nr++;
				}
				s = e + 1;
			}
			pthread_mutex_unlock(&cl->mu);
			o = (size_t)sprintf(out, "*%d\r\n", nr);
			memcpy(out + o, body, bo);
			fr_send(c->fd, out, o + bo);
			free(out);
			continue;
		}
		if (argc < 2) {
			fr_sendf(c->fd, "-ERR wrong number of arguments\r\n");
			continue;
		}
		if (atomic_load(&cl->tryagain) > 0) {
			atomic_fetch_sub(&cl->tryagain, 1);
			fr_sendf(c->fd, "-TRYAGAIN Multiple keys request during rehashing of slot\r\n");
			continue;
		}
		int slot = kv_redis_slot(argv[1], argl[1]);
		pthread_mutex_lock(&cl->mu);
		int ow = cl->owner[slot], mig = cl->migrating[slot];
		pthread_mutex_unlock(&cl->mu);
		int here = ow == nd->idx;
		int was_asking = asking;
		asking = 0;
		if (!here && !(mig == nd->idx && was_asking)) {
			atomic_fetch_add(&nd->moved_sent, 1);
			fr_sendf(c->fd, "-MOVED %d 127.0.0.1:%d\r\n", slot, ow >= 0 ? cl->node[ow].port : 1);
			continue;
		}
		if (here && mig >= 0 && !fr_exists(cl, argv[1], argl[1])) {
			atomic_fetch_add(&nd->ask_sent, 1);
			fr_sendf(c->fd, "-ASK %d 127.0.0.1:%d\r\n", slot, cl->node[mig].port);
			continue;
		}
		atomic_fetch_add(&nd->commands, 1);
		if (!strcasecmp(cmd, "GET")) {
			pthread_mutex_lock(&cl->mu);
			struct fr_kv **p = fr_find(cl, argv[1], argl[1]);
			if (!p) {
				pthread_mutex_unlock(&cl->mu);
				fr_sendf(c->fd, "$-1\r\n");
				continue;
			}
			size_t vl = (*p)->vlen;
			char *v = malloc(vl + 64);
			int o = sprintf(v, "$%zu\r\n", vl);
			memcpy(v + o, (*p)->val, vl);
			pthread_mutex_unlock(&cl->mu);
			memcpy(v + o + vl, "\r\n", 2);
			fr_send(c->fd, v, (size_t)o + vl + 2);
			free(v);
		} else if (!strcasecmp(cmd, "GETRANGE") && argc == 4) {
			/* bytes [start, end] clamped to the value, "" past its end or
			 * for a missing key (as Redis; negative offsets not needed) */
			long long st = atoll(argv[2]), en = atoll(argv[3]);
			pthread_mutex_lock(&cl->mu);
			struct fr_kv **p = fr_find(cl, argv[1], argl[1]);
			if (p && atomic_load(&cl->drop_after_ranges) > 0 && atomic_fetch_sub(&cl->drop_after_ranges, 1) == 1) {
				struct fr_kv *e = *p;
				*p = e->next;
				free(e->key);
				free(e->val);
				free(e);
				p = NULL;
			}
			size_t vl = p ? (*p)->vlen : 0, from = 0, n = 0;
			if (p && st >= 0 && en >= st && (size_t)st < vl) {
				from = (size_t)st;
				n = ((size_t)en < vl ? (size_t)en + 1 : vl) - from;
			}
			char *v = malloc(n + 64);
			int o = sprintf(v, "$%zu\r\n", n);
			if (n)
				memcpy(v + o, (*p)->val + from, n);
			pthread_mutex_unlock(&cl->mu);
			memcpy(v + o + n, "\r\n", 2);
			fr_send(c->fd, v, (size_t)o + n + 2);
			free(v);
		} else if (!strcasecmp(cmd, "STRLEN")) {
			pthread_mutex_lock(&cl->mu);
			struct fr_kv **p = fr_find(cl, argv[1], argl[1]);
			size_t vl = p ? (*p)->vlen : 0;
			pthread_mutex_unlock(&cl->mu);
			fr_sendf(c->fd, ":%zu\r\n", vl);
		} else if (!strcasecmp(cmd, "SET") && argc == 3) {
			fr_put(cl, argv[1], argl[1], argv[2], argl[2]);
			fr_sendf(c->fd, "+OK\r\n");
		} else if (!strcasecmp(cmd, "EXISTS") || !strcasecmp(cmd, "TOUCH")) {
			fr_sendf(c->fd, ":%d\r\n", fr_exists(cl, argv[1], argl[1]));
		} else if (!strcasecmp(cmd, "DEL")) {
			pthread_mutex_lock(&cl->mu);
			struct fr_kv **p = fr_find(cl, argv[1], argl[1]);
			int n = 0;
			if (p) {
				struct fr_kv *e = *p;
				*p = e->next;
				free(e->key);
				free(e->val);
				free(e);
				n = 1;
			}
			pthread_mutex_unlock(&cl->mu);
			fr_sendf(c->fd, ":%d\r\n", n);
		} else {
			fr_sendf(c->fd, "-ERR unknown command '%s'\r\n", cmd);
		}
	}
	pthread_mutex_lock(&nd->cmu);
	for (int i = 0; i < FR_MAX_CONNS; i++)
		if (nd->conns[i] == c->fd)
			nd->conns[i] = -1;
	pthread_mutex_unlock(&nd->cmu);
	close(c->fd);
	for (int i = 0; i < 4; i++)
		free(argv[i]);
	free(c->buf);
	free(c);
	return NULL;
}

static void *fr_accept_main(void *arg)
{
	struct fr_node *nd = arg;
	for (;;) {
		int fd = accept(nd->lfd, NULL, NULL);
		if (fd < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (atomic_load(&nd->down)) {
			close(fd);
			continue;
		}
		/* as redis-server does: with Nagle on, a reply sent in pieces
		 * waits for the client's delayed ACK (40 ms per call) */
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		struct fr_conn *c = calloc(1, sizeof *c);
		c->nd = nd;
		c->fd = fd;
		pthread_mutex_lock(&nd->cmu);
		for (int i = 0; i < FR_MAX_CONNS; i++)
			if (nd->conns[i] < 0) {
				nd->conns[i] = fd;
				break;
			}
		pthread_mutex_unlock(&nd->cmu);
		pthread_t t;
		pthread_create(&t, NULL, fr_conn_main, c);
		pthread_detach(t);
	}
	return NULL;
}

/* Listen on port (0: any) and start accepting. */
static int fr_listen(struct fr_node *nd, int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	socklen_t al = sizeof a;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	nd->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1;
	setsockopt(nd->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (nd->lfd < 0 || bind(nd->lfd, (struct sockaddr *)&a, sizeof a) || listen(nd->lfd, 64))
		return -1;
	getsockname(nd->lfd, (struct sockaddr *)&a, &al);
	nd->port = ntohs(a.sin_port);
	atomic_store(&nd->down, 0);
	nd->running = pthread_create(&nd->acceptor, NULL, fr_accept_main, nd) == 0;
	return nd->running ? 0 : -1;
}

static struct fr_cluster *fr_kept[16];

/* n nodes, slots split evenly in order. */
static inline struct fr_cluster *fr_start(int n, const char *password)
{
	struct fr_cluster *cl = calloc(1, sizeof *cl);
	for (int i = 0; i < 16; i++)
		if (!fr_kept[i]) {
			fr_kept[i] = cl;
			break;
		}
	pthread_mutex_init(&cl->mu, NULL);
	cl->n = n;
	if (password)
		snprintf(cl->password, sizeof cl->password, "%s", password);
	for (int s = 0; s < KV_REDIS_SLOTS; s++) {
		cl->owner[s] = s * n / KV_REDIS_SLOTS;
		cl->migrating[s] = -1;
	}
	for (int i = 0; i < n; i++) {
		struct fr_node *nd = &cl->node[i];
		nd->cl = cl;
		nd->idx = i;
		pthread_mutex_init(&nd->cmu, NULL);
		for (int k = 0; k < FR_MAX_CONNS; k++)
			nd->conns[k] = -1;
		if (fr_listen(nd, 0))
			return NULL;
	}
	return cl;
}

/* Close the listener and every connection: the node is dead. */
static inline void fr_down(struct fr_node *nd)
{
	atomic_store(&nd->down, 1);
	if (nd->running) {
		shutdown(nd->lfd, SHUT_RDWR);
		close(nd->lfd);
		pthread_join(nd->acceptor, NULL);
		nd->running = 0;
	}
	pthread_mutex_lock(&nd->cmu);
	for (int i = 0; i < FR_MAX_CONNS; i++)
		if (nd->conns[i] >= 0)
			shutdown(nd->conns[i], SHUT_RDWR);
	pthread_mutex_unlock(&nd->cmu);
}

static inline int fr_up(struct fr_node *nd)
{
	return fr_listen(nd, nd->port);
}

static inline void fr_set_owner(struct fr_cluster *cl, int from, int to, int node)
{
	pthread_mutex_lock(&cl->mu);
	for (int s = from; s <= to; s++)
		cl->owner[s] = node;
	pthread_mutex_unlock(&cl->mu);
}

static inline void fr_stop(struct fr_cluster *cl)
{
	if (!cl)
		return;
	for (int i = 0; i < cl->n; i++)
		fr_down(&cl->node[i]);
	usleep(20000); /* connection threads see EOF and leave */
	pthread_mutex_lock(&cl->mu);
	while (cl->kv) {
		struct fr_kv *e = cl->kv;
		cl->kv = e->next;
		free(e->key);
		free(e->val);
		free(e);
	}
	pthread_mutex_unlock(&cl->mu);
	/* the struct stays (reachable from fr_kept, so the leak checker of
	 * the sanitizer build does not count it): a detached connection
	 * thread may still be leaving */
}

/* "redis://127.0.0.1:p" with the first node only (the client must find the
 * others from CLUSTER SLOTS). */
static inline void fr_url(struct fr_cluster *cl, const char *userinfo, char *out, size_t cap)
{
	snprintf(out, cap, "redis://%s%s127.0.0.1:%d", userinfo ? userinfo : "", userinfo ? "@" : "", cl->node[0].port);
}

#endif
