/*
 * test_redis.c - the Redis Cluster client (base/redis.h) against the
 * in-process fake cluster of fake_redis.h: URL rules, CRC16 key slots and
 * hash tags, routing from one seed, MOVED after a reshard, ASK during a
 * migration, TRYAGAIN, a slow node against the call's deadline, a dead
 * node (fails fast, then the replica's promotion through a map refresh),
 * a restarted node behind pooled connections, AUTH, standalone servers,
 * values in pieces and the reply size limit, the probe, and abort.
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
	values_in_pieces_and_the_reply_limit, abort_ends_calls_in_flight, nothing_listening)
