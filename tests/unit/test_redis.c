/*
 * test_redis.c - the Redis Cluster client (base/redis.h) against the
 * in-process fake cluster of fake_redis.h: URL rules, CRC16 key slots and
 * hash tags, routing from one seed, MOVED after a reshard, ASK during a
 * migration, TRYAGAIN, a slow node against the call's deadline, a dead
 * node (fails fast, then the replica's promotion through a map refresh),
 * a restarted node behind pooled connections, AUTH, standalone servers,
 * values in pieces and the reply size limit, the probe, abort, STRLEN
 * and GETRANGE into the caller's buffers, MOVED and ASK inside one
 * pipelined batch, and a slow node inside a batch over two nodes.
 * tests/e2e/remote_tier.sh runs the same client against real redis-server
 * clusters.
 */
#include "kt.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "base/redis.h"
#include "fake_redis.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static struct kv_redis *client(struct fr_cluster *cl, const char *userinfo, const char *password, int timeout_ms)
{
	char url[256];
	struct kv_redis *r = NULL;
	fr_url(cl, userinfo, url, sizeof url);
	struct kv_redis_params p = {.url = url, .password = password, .timeout_ms = timeout_ms};
	if (kv_redis_create(&p, &r))
		return NULL;
	return r;
}

static int set1(struct kv_redis *r, const char *k, const char *v)
{
	struct iovec iov = {(void *)v, strlen(v)};
	struct kv_redis_op op = {.cmd = KV_REDIS_SET, .key = k, .klen = strlen(k), .val = &iov, .nval = 1};
	kv_redis_exec(r, &op, 1, 0);
	return op.rc;
}

/* GET k: KV_OK and the value must equal want (NULL: must be missing). */
static int get1(struct kv_redis *r, const char *k, const char *want)
{
	struct kv_redis_op op = {.cmd = KV_REDIS_GET, .key = k, .klen = strlen(k)};
	kv_redis_exec(r, &op, 1, 0);
	int ok;
	if (!want)
		ok = op.rc == KV_ERR_NOT_FOUND;
	else
		ok = op.rc == KV_OK && op.len == strlen(want) && !memcmp(op.data, want, op.len);
	free(op.data);
	return ok ? KV_OK : (op.rc ? op.rc : KV_ERR_CORRUPT);
}

KT_CASE(url_rules)
{
	struct kv_redis_url u;
	KT_OK(kv_redis_url_parse("redis://10.0.0.1:7000", &u));
	KT_EQ_INT(u.n_seeds, 1);
	KT_EQ_STR(u.seed[0].host, "10.0.0.1");
	KT_EQ_INT(u.seed[0].port, 7000);
	KT_EQ_STR(u.pass, "");
	KT_OK(kv_redis_url_parse("redis://kv:s%40cret:x@a:7000,b:7001,[::1]:7002/", &u));
	KT_EQ_STR(u.user, "kv");
	KT_EQ_STR(u.pass, "s@cret:x");
	KT_EQ_INT(u.n_seeds, 3);
	KT_EQ_STR(u.seed[1].host, "b");
	KT_EQ_INT(u.seed[1].port, 7001);
	KT_EQ_STR(u.seed[2].host, "::1");
	KT_EQ_INT(u.seed[2].port, 7002);
	KT_OK(kv_redis_url_parse("redis://:only-pass@h", &u));
	KT_EQ_STR(u.user, "");
	KT_EQ_STR(u.pass, "only-pass");
	KT_EQ_INT(u.seed[0].port, 6379);
	KT_OK(kv_redis_url_parse("redis://h:1/0", &u));
	const char *bad[] = {"", "http://h:1", "rediss://h:1", "redis://", "redis://h:0", "redis://h:65536",
			     "redis://h:12x", "redis://h:1,", "redis://h:1/3", "redis://[::1:7000", "redis://h:",
			     "redis://a%4@h:1", "redis://a%zz@h:1"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		KT_CHECKF(kv_redis_url_parse(bad[i], &u) == KV_ERR_INVALID, "'%s' was accepted", bad[i]);
	KT_CHECK(strstr(kv_errmsg(), "hex") != NULL);
	char many[2048] = "redis://";
	for (int i = 0; i < 17; i++)
		sprintf(many + strlen(many), "%sh%d:1", i ? "," : "", i);
	KT_EQ_INT(kv_redis_url_parse(many, &u), KV_ERR_INVALID);
}

KT_CASE(crc16_and_slots)
{
	KT_EQ_INT(kv_redis_crc16("123456789", 9), 0x31C3);
	/* values CLUSTER KEYSLOT gives (the Redis Cluster specification's
	 * examples; tests/e2e/remote_tier checks more against redis-server) */
	KT_EQ_INT(kv_redis_slot("foo", 3), 12182);
	KT_EQ_INT(kv_redis_slot("123456789", 9), 0x31C3 & 16383);
	KT_EQ_INT(kv_redis_slot("{user1000}.following", 20), kv_redis_slot("user1000", 8));
	KT_EQ_INT(kv_redis_slot("foo{bar}{zap}", 13), kv_redis_crc16("bar", 3) & 16383);
	/* CLUSTER KEYSLOT of redis-server 7.0 */
	KT_EQ_INT(kv_redis_slot("foo{bar}{zap}", 13), 5061);
	KT_EQ_INT(kv_redis_slot("foo{}{bar}", 10), 8363);
	KT_EQ_INT(kv_redis_slot("foo{{bar}}zap", 13), 4015);
	KT_EQ_INT(kv_redis_slot("foo{}{bar}", 10), kv_redis_crc16("foo{}{bar}", 10) & 16383);
	KT_EQ_INT(kv_redis_slot("foo{{bar}}zap", 13), kv_redis_crc16("{bar", 4) & 16383);
	KT_EQ_INT(kv_redis_slot("{", 1), kv_redis_crc16("{", 1) & 16383);
}

KT_CASE(routes_from_one_seed)
{
	struct fr_cluster *cl = fr_start(3, NULL);
	KT_REQUIRE(cl);
	struct kv_redis *r = client(cl, NULL, NULL, 1000);
	KT_REQUIRE(r);
	char k[32], v[32];
	for (int i = 0; i < 120; i++) {
		snprintf(k, sizeof k, "key-%d", i);
		snprintf(v, sizeof v, "value-%d", i * 7);
		KT_OK(set1(r, k, v));
	}
	/* one batch: every node gets its group, pipelined */
	struct kv_redis_op ops[120];
	char keys[120][32];
	for (int i = 0; i < 120; i++) {
		snprintf(keys[i], sizeof keys[i], "key-%d", i);
		ops[i] = (struct kv_redis_op){.cmd = KV_REDIS_GET, .key = keys[i], .klen = strlen(keys[i])};
	}
	KT_EQ_INT(kv_redis_exec(r, ops, 120, 0), 0);
	for (int i = 0; i < 120; i++) {
		snprintf(v, sizeof v, "value-%d", i * 7);
		KT_CHECKF(ops[i].rc == KV_OK && ops[i].len == strlen(v) && !memcmp(ops[i].data, v, ops[i].len),
			  "key %d: rc %d", i, ops[i].rc);
		free(ops[i].data);
	}
	for (int n = 0; n < 3; n++)
		KT_CHECKF(atomic_load(&cl->node[n].commands) > 20, "node %d served %d", n, atomic_load(&cl->node[n].commands));
	KT_OK(get1(r, "never-set", NULL));
	struct kv_redis_op ex[3] = {{.cmd = KV_REDIS_EXISTS, .key = "key-1", .klen = 5},
				    {.cmd = KV_REDIS_TOUCH, .key = "nope", .klen = 4},
				    {.cmd = KV_REDIS_DEL, .key = "key-2", .klen = 5}};
	KT_EQ_INT(kv_redis_exec(r, ex, 3, 0), 0);
	KT_EQ_INT(ex[0].rc, KV_OK);
	KT_EQ_INT(ex[0].n, 1);
	KT_EQ_INT(ex[1].rc, KV_ERR_NOT_FOUND);
	KT_EQ_INT(ex[2].rc, KV_OK);
	KT_OK(get1(r, "key-2", NULL));
	struct kv_redis_stats st;
	kv_redis_stats(r, &st);
	KT_EQ_INT(st.masters, 3);
	KT_EQ_INT(st.slots_covered, KV_REDIS_SLOTS);
	KT_EQ_INT(st.moved, 0);
	KT_CHECK(st.refreshes >= 1);
	KT_OK(kv_redis_probe(r, 500));
	kv_redis_destroy(r);
	fr_stop(cl);
}

KT_CASE(moved_after_a_reshard)
{
	struct fr_cluster *cl = fr_start(3, NULL);
	KT_REQUIRE(cl);
	struct kv_redis *r = client(cl, NULL, NULL, 1000);
	KT_REQUIRE(r);
	KT_OK(set1(r, "foo", "bar")); /* slot 12182: node 2 */
	KT_EQ_INT(kv_redis_slot("foo", 3) * 3 / KV_REDIS_SLOTS, 2);
	/* node 2's slots go to node 0: the client's map is stale */
	fr_set_owner(cl, 2 * KV_REDIS_SLOTS / 3 + 1, KV_REDIS_SLOTS - 1, 0);
	int before = atomic_load(&cl->node[0].commands);
	KT_OK(get1(r, "foo", "bar"));
	KT_CHECK(atomic_load(&cl->node[2].moved_sent) >= 1);
	KT_CHECK(atomic_load(&cl->node[0].commands) > before);
	struct kv_redis_stats st;
	kv_redis_stats(r, &st);
	KT_CHECK(st.moved >= 1);
	/* the map followed: the next call goes straight to node 0 */
	int moved = atomic_load(&cl->node[2].moved_sent);
	KT_OK(get1(r, "foo", "bar"));
	KT_EQ_INT(atomic_load(&cl->node[2].moved_sent), moved);
	kv_redis_destroy(r);
	fr_stop(cl);
}

KT_CASE(ask_during_a_migration)
{
	struct fr_cluster *cl = fr_start(3, NULL);
	KT_REQUIRE(cl);
	struct kv_redis *r = client(cl, NULL, NULL, 1000);
	KT_REQUIRE(r);
	int s = kv_redis_slot("foo", 3);
	KT_OK(set1(r, "foo", "old"));
	pthread_mutex_lock(&cl->mu);
	cl->migrating[s] = 1; /* from node 2 to node 1 */
	pthread_mutex_unlock(&cl->mu);
	/* a key still on the source is served there; a new one is asked of
	 * the target (after ASKING), without changing the map */
	KT_OK(get1(r, "foo", "old"));
	char k2[32];
	for (int i = 0;; i++) {
		snprintf(k2, sizeof k2, "m%d", i);
		if (kv_redis_slot(k2, strlen(k2)) == s)
			break;
	}
	int t0 = atomic_load(&cl->node[1].commands);
	KT_OK(set1(r, k2, "new"));
	KT_CHECK(atomic_load(&cl->node[2].ask_sent) >= 1);
	KT_CHECK(atomic_load(&cl->node[1].commands) > t0);
	KT_OK(get1(r, k2, "new"));
	struct kv_redis_stats st;
	kv_redis_stats(r, &st);
	KT_CHECK(st.ask >= 1);
	/* a GET batch (replies read raw) follows an ASK too: a key of the slot
	 * that is on neither node is asked of the target, which has nil */
	uint64_t asks = st.ask;
	char k3[32];
	for (int i = 0;; i++) {
		snprintf(k3, sizeof k3, "q%d", i);
		if (kv_redis_slot(k3, strlen(k3)) == s)
			break;
	}
	KT_OK(get1(r, k3, NULL));
	kv_redis_stats(r, &st);
	KT_EQ_U64(st.ask, asks + 1);
	KT_EQ_INT(st.moved, 0);
	/* the migration ends: the slot is node 1's, a MOVED moves the map */
	pthread_mutex_lock(&cl->mu);
	cl->migrating[s] = -1;
	cl->owner[s] = 1;
	pthread_mutex_unlock(&cl->mu);
	KT_OK(get1(r, "foo", "old"));
	kv_redis_stats(r, &st);
	KT_CHECK(st.moved >= 1);
	kv_redis_destroy(r);
	fr_stop(cl);
}

KT_CASE(tryagain_is_retried)
{
	struct fr_cluster *cl = fr_start(1, NULL);
	KT_REQUIRE(cl);
	struct kv_redis *r = client(cl, NULL, NULL, 1000);
	KT_REQUIRE(r);
	KT_OK(set1(r, "a", "1"));
	atomic_store(&cl->tryagain, 3);
	KT_OK(get1(r, "a", "1"));
	struct kv_redis_stats st;
	kv_redis_stats(r, &st);
	KT_CHECK(st.tryagain >= 3);
	kv_redis_destroy(r);
	fr_stop(cl);
}

KT_CASE(slow_node_costs_at_most_the_timeout)
{
	struct fr_cluster *cl = fr_start(2, NULL);
	KT_REQUIRE(cl);
	struct kv_redis *r = client(cl, NULL, NULL, 100);
	KT_REQUIRE(r);
	KT_OK(set1(r, "foo", "bar")); /* slot 12182: node 1 */
	atomic_store(&cl->node[1].delay_ms, 1500);
	uint64_t t0 = kv_now_ns();
	struct kv_redis_op op = {.cmd = KV_REDIS_GET, .key = "foo", .klen = 3};
	KT_EQ_INT(kv_redis_exec(r, &op, 1, 0), 1);
	double ms = (double)(kv_now_ns() - t0) / 1e6;
	KT_EQ_INT(op.rc, KV_ERR_TIMEOUT);
	/* the timeout, not the node's 1.5 s (loose: shared machines, sanitizers) */
	KT_CHECKF(ms >= 95 && ms < 600, "the call took %.1f ms with a 100 ms timeout", ms);
	struct kv_redis_stats st;
	kv_redis_stats(r, &st);
	KT_EQ_INT(st.timeouts, 1);
	atomic_store(&cl->node[1].delay_ms, 0);
	KT_OK(get1(r, "foo", "bar"));
	kv_redis_destroy(r);
	fr_stop(cl);
}

KT_CASE(dead_master_fails_fast_then_failover)
{
	struct fr_cluster *cl = fr_start(3, NULL);
	KT_REQUIRE(cl);
	struct kv_redis *r = client(cl, NULL, NULL, 1000);
	KT_REQUIRE(r);
	KT_OK(set1(r, "foo", "bar")); /* node 2 */
	char a[16];
	for (int i = 0;; i++) { /* a key of node 0 */
		snprintf(a, sizeof a, "a%d", i);
		if (kv_redis_slot(a, strlen(a)) * 3 / KV_REDIS_SLOTS == 0)
			break;
	}
	KT_OK(set1(r, a, "1"));
	fr_down(&cl->node[2]);
	uint64_t t0 = kv_now_ns();
	struct kv_redis_op op = {.cmd = KV_REDIS_GET, .key = "foo", .klen = 3};
	kv_redis_exec(r, &op, 1, 0);
	double ms = (double)(kv_now_ns() - t0) / 1e6;
	KT_EQ_INT(op.rc, KV_ERR_IO);
	KT_CHECKF(ms < 700, "a dead node held the call %.0f ms (timeout 1000)", ms);
	KT_OK(get1(r, a, "1")); /* other slots still answer */
	KT_CHECK(kv_redis_probe(r, 300) != KV_OK);
	/* the replica is promoted: node 2's slots now belong to node 1 */
	fr_set_owner(cl, 2 * KV_REDIS_SLOTS / 3 + 1, KV_REDIS_SLOTS - 1, 1);
	kv_sleep_ms(120); /* past the refresh rate limit */
	KT_OK(get1(r, "foo", "bar"));
	KT_OK(kv_redis_probe(r, 300));
	kv_redis_destroy(r);
	fr_stop(cl);
}

KT_CASE(restarted_node_behind_pooled_connections)
{
	struct fr_cluster *cl = fr_start(1, NULL);
	KT_REQUIRE(cl);
	struct kv_redis *r = client(cl, NULL, NULL, 1000);
	KT_REQUIRE(r);
	KT_OK(set1(r, "k", "v"));
	KT_OK(get1(r, "k", "v"));
	fr_down(&cl->node[0]);
	kv_sleep_ms(20);
	KT_REQUIRE(fr_up(&cl->node[0]) == 0);
	/* the pooled connection is dead: found out, dropped, retried */
	KT_OK(get1(r, "k", "v"));
	kv_redis_destroy(r);
	fr_stop(cl);
}

KT_CASE(auth)
{
	struct fr_cluster *cl = fr_start(2, "s3cret");
	KT_REQUIRE(cl);
	struct kv_redis *r = client(cl, "kv:wrong", NULL, 300);
	KT_REQUIRE(r);
	struct kv_redis_op op = {.cmd = KV_REDIS_GET, .key = "a", .klen = 1};
	kv_redis_exec(r, &op, 1, 0);
	KT_EQ_INT(op.rc, KV_ERR_IO);
	struct kv_redis_stats st;
	kv_redis_stats(r, &st);
	KT_CHECK(st.auth_failures >= 1);
	char last[256];
	kv_redis_last_error(r, last, sizeof last);
	KT_CHECKF(strstr(last, "password") || strstr(last, "WRONGPASS"), "last error: %s", last);
	kv_redis_destroy(r);
	/* the password from elsewhere (a file, the environment) wins over the URL's */
	r = client(cl, "kv:wrong", "s3cret", 300);
	KT_REQUIRE(r);
	KT_OK(set1(r, "a", "1"));
	KT_OK(get1(r, "a", "1"));
	kv_redis_destroy(r);
	/* no password at all: the server's NOAUTH */
	r = client(cl, NULL, NULL, 300);
	KT_REQUIRE(r);
	kv_redis_exec(r, &op, 1, 0);
	KT_CHECK(op.rc != KV_OK);
	kv_redis_destroy(r);
	fr_stop(cl);
}

KT_CASE(standalone_server_owns_every_slot)
{
	struct fr_cluster *cl = fr_start(1, NULL);
	KT_REQUIRE(cl);
	cl->standalone = 1;
	struct kv_redis *r = client(cl, NULL, NULL, 500);
	KT_REQUIRE(r);
	KT_OK(set1(r, "x", "y"));
	KT_OK(get1(r, "x", "y"));
	struct kv_redis_stats st;
	kv_redis_stats(r, &st);
	KT_EQ_INT(st.standalone, 1);
	KT_EQ_INT(st.slots_covered, KV_REDIS_SLOTS);
	KT_OK(kv_redis_probe(r, 500));
	kv_redis_destroy(r);
	fr_stop(cl);
}

KT_CASE(values_in_pieces_and_the_reply_limit)
{
	struct fr_cluster *cl = fr_start(2, NULL);
	KT_REQUIRE(cl);
	struct kv_redis *r = client(cl, NULL, NULL, 3000);
	KT_REQUIRE(r);
	size_t n = 8u << 20;
	uint8_t *a = malloc(n);
	KT_REQUIRE(a);
	uint64_t seed = 7;
	for (size_t i = 0; i < n; i++)
		a[i] = (uint8_t)kt_rand(&seed);
	struct iovec iov[3] = {{a, 100}, {a + 100, n / 2}, {a + 100 + n / 2, n - 100 - n / 2}};
	struct kv_redis_op op = {.cmd = KV_REDIS_SET, .key = "big", .klen = 3, .val = iov, .nval = 3};
	KT_EQ_INT(kv_redis_exec(r, &op, 1, 0), 0);
	KT_OK(op.rc);
	struct kv_redis_op g = {.cmd = KV_REDIS_GET, .key = "big", .klen = 3};
	KT_EQ_INT(kv_redis_exec(r, &g, 1, 0), 0);
	KT_OK(g.rc);
	KT_CHECK(g.len == n && !memcmp(g.data, a, n));
	free(g.data);
	kv_redis_destroy(r);
	char url[256];
	fr_url(cl, NULL, url, sizeof url);
	struct kv_redis_params p = {.url = url, .timeout_ms = 3000, .max_reply = 1u << 20};
	KT_OK(kv_redis_create(&p, &r));
	kv_redis_exec(r, &g, 1, 0);
	KT_EQ_INT(g.rc, KV_ERR_FULL);
	KT_CHECK(g.data == NULL);
	KT_OK(get1(r, "nope", NULL)); /* the client goes on */
	kv_redis_destroy(r);
	free(a);
	fr_stop(cl);
}

struct abort_ctx {
	struct kv_redis *r;
	int rc;
	double ms;
};

static void *slow_call(void *arg)
{
	struct abort_ctx *a = arg;
	uint64_t t0 = kv_now_ns();
	struct kv_redis_op op = {.cmd = KV_REDIS_GET, .key = "foo", .klen = 3};
	kv_redis_exec(a->r, &op, 1, 5000);
	a->rc = op.rc;
	a->ms = (double)(kv_now_ns() - t0) / 1e6;
	return NULL;
}

KT_CASE(abort_ends_calls_in_flight)
{
	struct fr_cluster *cl = fr_start(1, NULL);
	KT_REQUIRE(cl);
	struct kv_redis *r = client(cl, NULL, NULL, 5000);
	KT_REQUIRE(r);
	KT_OK(set1(r, "foo", "bar"));
	atomic_store(&cl->node[0].delay_ms, 3000);
	struct abort_ctx a = {.r = r};
	pthread_t t;
	pthread_create(&t, NULL, slow_call, &a);
	kv_sleep_ms(80);
	kv_redis_abort(r);
	pthread_join(t, NULL);
	KT_EQ_INT(a.rc, KV_ERR_CANCELLED);
	KT_CHECKF(a.ms < 1500, "aborted call took %.0f ms (the node delays 3000)", a.ms);
	struct kv_redis_op op = {.cmd = KV_REDIS_GET, .key = "foo", .klen = 3};
	kv_redis_exec(r, &op, 1, 0);
	KT_EQ_INT(op.rc, KV_ERR_CANCELLED);
	atomic_store(&cl->node[0].delay_ms, 0);
	kv_redis_destroy(r);
	fr_stop(cl);
}

/* A key of node `node` of a 3-node fake (slots split in thirds). */
static void key_of(int node, int nth, char *out, size_t cap)
{
	for (int i = 0, seen = 0;; i++) {
		snprintf(out, cap, "k%d-%d", node, i);
		if (kv_redis_slot(out, strlen(out)) * 3 / KV_REDIS_SLOTS == node && seen++ == nth)
			return;
	}
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)kt_rand(&seed);
}

/* STRLEN and GETRANGE, the values landing in the caller's buffers. */
KT_CASE(ranges_into_buffers)
{
	struct fr_cluster *cl = fr_start(3, NULL);
	KT_REQUIRE(cl);
	struct kv_redis *r = client(cl, NULL, NULL, 2000);
	KT_REQUIRE(r);
	size_t n = 300000, ch = 65536;
	uint8_t *a = malloc(n), *got = malloc(n + 16);
	KT_REQUIRE(a && got);
	fill(a, n, 3);
	struct iovec iov = {a, n};
	struct kv_redis_op set = {.cmd = KV_REDIS_SET, .key = "v", .klen = 1, .val = &iov, .nval = 1};
	KT_EQ_INT(kv_redis_exec(r, &set, 1, 0), 0);
	KT_OK(set.rc);
	/* STRLEN then every range of the value and one past its end, pipelined */
	struct kv_redis_op ops[8];
	int k = 0;
	ops[k++] = (struct kv_redis_op){.cmd = KV_REDIS_STRLEN, .key = "v", .klen = 1};
	for (size_t off = 0; off < n + ch; off += ch, k++)
		ops[k] = (struct kv_redis_op){.cmd = KV_REDIS_GETRANGE, .key = "v", .klen = 1, .start = off,
					      .end = off + ch - 1, .buf = got + (off < n ? off : n), .cap = ch};
	KT_EQ_INT(kv_redis_exec(r, ops, (size_t)k, 0), 0);
	KT_OK(ops[0].rc);
	KT_EQ_U64((uint64_t)ops[0].n, n);
	size_t total = 0;
	for (int i = 1; i < k; i++) {
		KT_OK(ops[i].rc);
		KT_CHECK(ops[i].data == ops[i].buf); /* no copy, nothing to free */
		total += ops[i].len;
	}
	KT_EQ_U64(ops[k - 1].len, 0); /* past the end: "" */
	KT_EQ_U64(total, n);
	KT_CHECK(!memcmp(got, a, n));
	/* a reply longer than the buffer: KV_ERR_FULL, and the client goes on */
	struct kv_redis_op small = {.cmd = KV_REDIS_GETRANGE, .key = "v", .klen = 1, .start = 0, .end = 999, .buf = got, .cap = 10};
	kv_redis_exec(r, &small, 1, 0);
	KT_EQ_INT(small.rc, KV_ERR_FULL);
	struct kv_redis_op whole = {.cmd = KV_REDIS_GET, .key = "v", .klen = 1, .buf = got, .cap = n};
	KT_EQ_INT(kv_redis_exec(r, &whole, 1, 0), 0);
	KT_OK(whole.rc);
	KT_CHECK(whole.data == got && whole.len == n && !memcmp(got, a, n));
	/* a missing key: STRLEN 0 (not found), GETRANGE "" */
	struct kv_redis_op miss[2] = {{.cmd = KV_REDIS_STRLEN, .key = "nope", .klen = 4},
				      {.cmd = KV_REDIS_GETRANGE, .key = "nope", .klen = 4, .start = 0, .end = 9, .buf = got, .cap = 10}};
	KT_EQ_INT(kv_redis_exec(r, miss, 2, 0), 0);
	KT_EQ_INT(miss[0].rc, KV_ERR_NOT_FOUND);
	KT_EQ_INT(miss[0].n, 0);
	KT_OK(miss[1].rc);
	KT_EQ_U64(miss[1].len, 0);
	free(a);
	free(got);
	kv_redis_destroy(r);
	fr_stop(cl);
}

/*
 * One pipelined batch of ranged reads over every node, with a MOVED (a
 * resharded slot) and an ASK (a migrating slot) in its middle: every op
 * ends with the right bytes, the others of the batch untouched.
 */
KT_CASE(moved_and_ask_inside_a_batch)
{
	struct fr_cluster *cl = fr_start(3, NULL);
	KT_REQUIRE(cl);
	struct kv_redis *r = client(cl, NULL, NULL, 2000);
	KT_REQUIRE(r);
	enum { NK = 6, SZ = 5000, CH = 1024 };
	char key[NK][32];
	static uint8_t val[NK][SZ], got[NK][SZ];
	for (int i = 0; i < NK; i++) {
		key_of(i % 3, i / 3, key[i], sizeof key[i]);
		fill(val[i], SZ, (uint64_t)i + 10);
		struct iovec iov = {val[i], SZ};
		struct kv_redis_op set = {.cmd = KV_REDIS_SET, .key = key[i], .klen = strlen(key[i]), .val = &iov, .nval = 1};
		kv_redis_exec(r, &set, 1, 0);
		KT_OK(set.rc);
	}
	/* key 1's slot (node 1) moves to node 2: the map is stale */
	int s1 = kv_redis_slot(key[1], strlen(key[1]));
	fr_set_owner(cl, s1, s1, 2);
	/* key 5's slot (node 2) migrates to node 0: key 5 is still on the
	 * source and served there; a key of that slot the source lacks is
	 * ASKed of the target (which has nothing either: "" and 0) */
	int s5 = kv_redis_slot(key[5], strlen(key[5]));
	pthread_mutex_lock(&cl->mu);
	cl->migrating[s5] = 0;
	pthread_mutex_unlock(&cl->mu);
	char gone[32];
	for (int i = 0;; i++) {
		snprintf(gone, sizeof gone, "gone%d", i);
		if (kv_redis_slot(gone, strlen(gone)) == s5)
			break;
	}
	char gb[8];
	struct kv_redis_op ops[NK * (SZ / CH + 1) + 3];
	int n = 0;
	for (int i = 0; i < NK; i++) {
		const char *k = key[i];
		for (size_t off = 0; off < SZ; off += CH)
			ops[n++] = (struct kv_redis_op){.cmd = KV_REDIS_GETRANGE, .key = k, .klen = strlen(k), .start = off,
							.end = off + CH - 1, .buf = got[i] + off, .cap = SZ - off < CH ? SZ - off : CH};
		if (i == 2) {
			ops[n++] = (struct kv_redis_op){.cmd = KV_REDIS_STRLEN, .key = gone, .klen = strlen(gone)};
			ops[n++] = (struct kv_redis_op){.cmd = KV_REDIS_GETRANGE, .key = gone, .klen = strlen(gone), .start = 0,
							.end = 7, .buf = gb, .cap = sizeof gb};
		}
	}
	struct kv_redis_stats st0, st1;
	kv_redis_stats(r, &st0);
	int asks0 = atomic_load(&cl->node[2].ask_sent);
	KT_EQ_INT(kv_redis_exec(r, ops, (size_t)n, 0), 0);
	for (int i = 0; i < n; i++)
		KT_CHECKF(ops[i].rc == KV_OK || (ops[i].cmd == KV_REDIS_STRLEN && ops[i].rc == KV_ERR_NOT_FOUND), "op %d: rc %d",
			  i, ops[i].rc);
	for (int i = 0; i < NK; i++)
		KT_CHECKF(!memcmp(got[i], val[i], SZ), "value %d differs", i);
	for (int i = 0; i < n; i++)
		if (ops[i].key == gone)
			KT_CHECK(ops[i].cmd == KV_REDIS_STRLEN ? ops[i].n == 0 : ops[i].len == 0);
	kv_redis_stats(r, &st1);
	KT_CHECK(st1.moved > st0.moved);
	KT_CHECK(atomic_load(&cl->node[2].ask_sent) > asks0);
	KT_CHECK(st1.ask > st0.ask);
	kv_redis_destroy(r);
	fr_stop(cl);
}

/* A batch over two nodes, one of them slow: the call ends at its
 * deadline, the slow node's ops time out holding nothing, the client
 * then serves both nodes again. */
KT_CASE(slow_node_inside_a_batch)
{
	struct fr_cluster *cl = fr_start(3, NULL);
	KT_REQUIRE(cl);
	struct kv_redis *r = client(cl, NULL, NULL, 150);
	KT_REQUIRE(r);
	char k0[32], k1[32];
	key_of(0, 0, k0, sizeof k0);
	key_of(1, 0, k1, sizeof k1);
	KT_OK(set1(r, k0, "zero"));
	KT_OK(set1(r, k1, "one"));
	atomic_store(&cl->node[1].delay_ms, 1500);
	char b0[16], b1[16];
	struct kv_redis_op ops[4] = {{.cmd = KV_REDIS_GETRANGE, .key = k0, .klen = strlen(k0), .start = 0, .end = 15, .buf = b0, .cap = 16},
				     {.cmd = KV_REDIS_GETRANGE, .key = k1, .klen = strlen(k1), .start = 0, .end = 15, .buf = b1, .cap = 16},
				     {.cmd = KV_REDIS_STRLEN, .key = k0, .klen = strlen(k0)},
				     {.cmd = KV_REDIS_GET, .key = k1, .klen = strlen(k1)}};
	uint64_t t0 = kv_now_ns();
	size_t failed = kv_redis_exec(r, ops, 4, 0);
	double ms = (double)(kv_now_ns() - t0) / 1e6;
	KT_CHECKF(ms < 700, "a batch with a slow node took %.0f ms (timeout 150, the node delays 1500)", ms);
	/* node 0's group went first and answered; node 1's timed out */
	KT_EQ_INT(ops[0].rc, KV_OK);
	KT_CHECK(ops[0].len == 4 && !memcmp(b0, "zero", 4));
	KT_EQ_INT(ops[2].rc, KV_OK);
	KT_EQ_INT(ops[2].n, 4);
	KT_EQ_INT(failed, 2);
	KT_EQ_INT(ops[1].rc, KV_ERR_TIMEOUT);
	KT_EQ_INT(ops[3].rc, KV_ERR_TIMEOUT);
	KT_CHECK(ops[3].data == NULL);
	atomic_store(&cl->node[1].delay_ms, 0);
	kv_sleep_ms(1600); /* the fake finishes the slow commands */
	KT_OK(get1(r, k1, "one"));
	KT_OK(get1(r, k0, "zero"));
	kv_redis_destroy(r);
	fr_stop(cl);
}

KT_CASE(nothing_listening)
{
	/* a port nobody listens on: create succeeds (lazy), calls fail fast */
	struct kv_redis *r = NULL;
	struct kv_redis_params p = {.url = "redis://127.0.0.1:1", .timeout_ms = 500};
	KT_OK(kv_redis_create(&p, &r));
	uint64_t t0 = kv_now_ns();
	struct kv_redis_op op = {.cmd = KV_REDIS_GET, .key = "a", .klen = 1};
	KT_EQ_INT(kv_redis_exec(r, &op, 1, 0), 1);
	KT_EQ_INT(op.rc, KV_ERR_IO);
	KT_CHECKF((kv_now_ns() - t0) / 1000000 < 450, "took %llu ms", (unsigned long long)((kv_now_ns() - t0) / 1000000));
	KT_CHECK(kv_redis_probe(r, 200) != KV_OK);
	kv_redis_destroy(r);
}

KT_MAIN(url_rules, crc16_and_slots, routes_from_one_seed, moved_after_a_reshard, ask_during_a_migration,
	tryagain_is_retried, slow_node_costs_at_most_the_timeout, dead_master_fails_fast_then_failover,
	restarted_node_behind_pooled_connections, auth, standalone_server_owns_every_slot,
	values_in_pieces_and_the_reply_limit, abort_ends_calls_in_flight, ranges_into_buffers, moved_and_ask_inside_a_batch,
	slow_node_inside_a_batch, nothing_listening)
