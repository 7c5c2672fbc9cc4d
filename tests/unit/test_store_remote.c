/*
 * test_store_remote.c - the remote tier (store/remote.h, store/rwrite.c,
 * fetch.c with the remote as its source) against the in-process fake
 * cluster of fake_redis.h: server A's objects reach server B through Redis
 * and restore byte for byte (hybrid at a message boundary with its
 * anchor, dense at the longest prefix); the manifest is written last;
 * corrupt, truncated, misplaced and foreign values are misses, counted
 * and deleted; another namespace never hits; a tier that is down is
 * skipped at once and its writes dropped, then picked up again; a slow
 * node bounds a lookup at the timeout; the shutdown flush drops what is
 * queued; a remote hit goes to the local disk when to_disk is on. Every
 * object is read in small ranges (several pipelined calls each) unless a
 * case says plain GETs; a restore has several reads in flight on several
 * nodes, one node slow mid-restore makes it a clean miss within the
 * deadline, and a value evicted between its calls is a miss, not corrupt.
 * tests/e2e/remote_tier.sh runs the real servers against a real cluster.
 */
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "cache/names.h"
#include "store/remote.h"
#include "store/store.h"
#include "kt.h"
#include "fake_redis.h"
#include "test_store_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The session of test_store.c: anchor at 20, boundary entry at 37 with
 * checkpoints 16, 20, 32, prompt 40, completion entry at 46 (B = 8). */
#define N_PROMPT 40
#define B0 20
#define B1 37
#define N_DONE 46

static void session(struct ts_env *e, const int32_t *tok)
{
	uint32_t ck1[] = {16, B0, 32};
	ts_put(e, tok, B1, ck1, 3, B0);
	uint32_t ck2[] = {B0, 32, B1};
	ts_put(e, tok, N_DONE, ck2, 3, B0);
}

/* Objects read in ranges: every block, tail and snapshot of these small
 * layouts (range_min 1), in odd-sized ranges, a few per call, so each
 * value takes several pipelined calls; 0: plain GETs (range_min huge). */
static int g_ranges = 1;

static struct ks_remote *hub(struct fr_cluster *cl, int timeout_ms, int to_disk, uint64_t queue, const struct ke_layout *L)
{
	char url[128];
	struct ks_remote *r = NULL;
	fr_url(cl, NULL, url, sizeof url);
	struct ks_remote_params p = {.url = url, .timeout_ms = timeout_ms, .to_disk = to_disk, .queue_bytes = queue,
				     .layout = L, .no_thread = 1, .range_min = g_ranges ? 1 : SIZE_MAX,
				     .range_chunk = 200, .range_window = 2};
	if (ks_remote_create(&p, &r))
		return NULL;
	return r;
}

static int open_env(struct ts_env *e, const char *name, int hybrid, struct ks_remote *r, struct kv_h128 ns)
{
	char root[4096];
	snprintf(root, sizeof root, "%s/%s", kt_tmpdir(), name);
	struct ks_params p = {.no_threads = 1, .remote = r, .ns = ns};
	return ts_open(e, root, hybrid, &p);
}

/*
 * What the server does for a request: RAM, then the disk tier, then the
 * remote tier, each for what the ones before lack; the hit checked byte
 * for byte against a cold run (a wrong hit fails the test). Returns the
 * resume position; *remote_pos what the remote loaded (0: nothing).
 */
static uint32_t lookup(struct ts_env *e, const int32_t *tok, uint32_t n, const uint32_t *bounds, size_t nb,
		       uint32_t *anchor, uint32_t *remote_pos)
{
	struct kc_hit h;
	struct kv_page *rp[512];
	struct ks_fetch f;
	*remote_pos = 0;
	for (int remote = 0; remote < 2; remote++) {
		kc_cache_peek(e->c, tok, n, &h);
		kc_hit_pages(&h, rp);
		struct ks_req rq = {.tokens = tok, .n = n, .bounds = bounds, .n_bounds = nb, .ram_pos = h.pos,
				    .ram_pages = rp, .ram_n_pages = h.n_pages};
		KT_OK(remote ? ks_store_fetch_remote(e->s, &rq, &f) : ks_store_fetch(e->s, &rq, &f));
		kc_hit_release(e->c, &h);
		if (remote)
			*remote_pos = f.pos;
	}
	kc_cache_lookup(e->c, tok, n, &h);
	uint32_t bad = tc_verify_hit(e->c, &h, tok);
	KT_CHECKF(bad == 0, "WRONG HIT: resume at %u differs from a cold run at position %u", h.pos, bad - 1);
	uint32_t pos = bad ? 0 : h.pos;
	if (anchor)
		*anchor = h.anchor;
	kc_hit_release(e->c, &h);
	return pos;
}

static const struct kv_h128 NS = {0x1111, 0x2222};

/* The fake's value of an object of namespace ns (NULL: none). Borrowed. */
static struct fr_kv *value_of(struct fr_cluster *cl, struct ks_remote *r, struct kv_h128 ns, int kind, struct kv_h128 id)
{
	char key[200];
	size_t kl = ks_remote_key(r, ns, kind, id, key, sizeof key);
	pthread_mutex_lock(&cl->mu);
	struct fr_kv **p = fr_find(cl, key, kl);
	pthread_mutex_unlock(&cl->mu);
	return p ? *p : NULL;
}

static int count_keys(struct fr_cluster *cl, const char *sub)
{
	int n = 0;
	pthread_mutex_lock(&cl->mu);
	for (struct fr_kv *e = cl->kv; e; e = e->next)
		if (memmem(e->key, e->klen, sub, strlen(sub)))
			n++;
	pthread_mutex_unlock(&cl->mu);
	return n;
}

KT_CASE(a_writes_b_resumes_at_the_boundary)
{
	struct fr_cluster *cl = fr_start(3, NULL);
	KT_REQUIRE(cl);
	struct ke_layout L;
	ts_layout(&L, 1);
	struct ks_remote *r = hub(cl, 1000, 0, 0, &L);
	KT_REQUIRE(r);
	KT_CHECK(ks_remote_up(r));
	struct ts_env a, b;
	int32_t tok[64];
	uint32_t bounds[] = {B0, B1}, anchor = 0, rpos = 0;
	ts_tokens(tok, 64, 64, 3);
	KT_OK(open_env(&a, "a", 1, r, NS));
	session(&a, tok);
	ks_store_drain(a.s);
	struct ks_remote_stats st;
	ks_remote_stats(r, &st);
	/* 5 blocks, tails and snapshots of the resume points, 2 manifests */
	KT_EQ_U64(st.written_objects, (uint64_t)count_keys(cl, "kvkeep:"));
	KT_CHECK(count_keys(cl, ".block.") == 5);
	KT_EQ_INT(count_keys(cl, ".entry."), 2);
	KT_EQ_U64(st.incomplete, 0);
	KT_EQ_U64(st.dropped[KS_RDROP_DOWN] + st.dropped[KS_RDROP_QUEUE] + st.dropped[KS_RDROP_ERROR], 0);

	/* server B: an empty disk; turn 1 replayed resumes from Redis at the
	 * last boundary with its anchor */
	KT_OK(open_env(&b, "b", 1, r, NS));
	uint32_t pos = lookup(&b, tok, N_PROMPT, bounds, 2, &anchor, &rpos);
	KT_EQ_INT(pos, B1);
	KT_EQ_INT(rpos, B1);
	KT_EQ_INT(anchor, B0);
	ks_remote_stats(r, &st);
	KT_EQ_U64(st.hits, 1);
	KT_CHECK(st.read_objects >= 7); /* 4 blocks, tail, snapshot, manifest, anchor snapshot */
	/* a new turn: with no catalog the remote finds resume points at the
	 * prompt's boundaries, stride and interval multiples (docs/cluster.md),
	 * so the completion entry at 46 is found when 46 is a boundary of the
	 * prompt, and the turn resumes at 37 when it is not */
	pos = lookup(&b, tok, 60, bounds, 2, NULL, &rpos);
	KT_EQ_INT(pos, B1);
	uint32_t bounds3[] = {B0, B1, N_DONE};
	pos = lookup(&b, tok, 60, bounds3, 3, NULL, &rpos);
	KT_EQ_INT(pos, N_DONE);
	KT_EQ_INT(rpos, N_DONE);
	/* with to_disk off nothing of it reached B's disk */
	ks_store_drain(b.s);
	struct ks_stats ds;
	ks_store_stats(b.s, &ds);
	KT_EQ_U64(ds.written[KS_BLOCK] + ds.written[KS_ENTRY], 0);
	ts_close(&a);
	ts_close(&b);
	ks_remote_destroy(r);
	fr_stop(cl);
}

/* The same restore with plain GETs (the objects under range_min). */
KT_CASE(plain_gets_restore_too)
{
	struct fr_cluster *cl = fr_start(3, NULL);
	KT_REQUIRE(cl);
	struct ke_layout L;
	ts_layout(&L, 1);
	g_ranges = 0;
	struct ks_remote *r = hub(cl, 1000, 0, 0, &L);
	g_ranges = 1;
	KT_REQUIRE(r);
	struct ts_env a, b;
	int32_t tok[64];
	uint32_t bounds[] = {B0, B1}, anchor = 0, rpos = 0;
	ts_tokens(tok, 64, 64, 4);
	KT_OK(open_env(&a, "a", 1, r, NS));
	session(&a, tok);
	ks_store_drain(a.s);
	KT_OK(open_env(&b, "b", 1, r, NS));
	int ranges0 = 0;
	for (int i = 0; i < 3; i++)
		ranges0 += atomic_load(&cl->node[i].commands);
	KT_EQ_INT(lookup(&b, tok, N_PROMPT, bounds, 2, &anchor, &rpos), B1);
	KT_EQ_INT(rpos, B1);
	KT_EQ_INT(anchor, B0);
	int cmds = 0;
	for (int i = 0; i < 3; i++)
		cmds += atomic_load(&cl->node[i].commands);
	/* one EXISTS batch and one GET per object: far fewer commands than
	 * the ranged reads of the other cases */
	KT_CHECKF(cmds - ranges0 < 60, "%d commands for a restore of plain GETs", cmds - ranges0);
	ts_close(&a);
	ts_close(&b);
	ks_remote_destroy(r);
	fr_stop(cl);
}

/*
 * Objects in flight on several nodes at once (the read threads), and one
 * node that stops answering reads in the middle of the restore: the
 * lookup ends near the deadline as a clean miss (nothing enters RAM, no
 * page kept: ts_close checks), the tier goes down; back up, the same
 * restore hits. Then a value evicted between two of its ranged calls: a
 * miss for that part (a shorter hit), not a corrupt value.
 */
KT_CASE(one_node_slow_mid_restore_then_eviction_mid_read)
{
	struct fr_cluster *cl = fr_start(3, NULL);
	KT_REQUIRE(cl);
	struct ke_layout L;
	ts_layout(&L, 1);
	struct ks_remote *r = hub(cl, 150, 0, 0, &L);
	KT_REQUIRE(r);
	struct ts_env a, b;
	int32_t tok[64];
	uint32_t bounds[] = {B0, B1}, anchor = 0, rpos = 0;
	ts_tokens(tok, 64, 64, 12);
	KT_OK(open_env(&a, "a", 1, r, NS));
	session(&a, tok);
	ks_store_drain(a.s);
	/* the objects are spread over the nodes */
	int nodes_with = 0;
	for (int n = 0; n < 3; n++) {
		int have = 0;
		pthread_mutex_lock(&cl->mu);
		for (struct fr_kv *e = cl->kv; e; e = e->next)
			have |= kv_redis_slot(e->key, e->klen) * 3 / KV_REDIS_SLOTS == n;
		pthread_mutex_unlock(&cl->mu);
		nodes_with += have;
	}
	KT_EQ_INT(nodes_with, 3);
	kv_log_set_level(KV_LOG_ERROR);
	atomic_store(&cl->node[1].read_delay_ms, 1500);
	KT_OK(open_env(&b, "b", 1, r, NS));
	uint64_t t0 = kv_now_ns();
	KT_EQ_INT(lookup(&b, tok, N_PROMPT, bounds, 2, NULL, &rpos), 0);
	double ms = (double)(kv_now_ns() - t0) / 1e6;
	KT_EQ_INT(rpos, 0);
	KT_CHECKF(ms < 1000, "a restore with one slow node took %.0f ms (timeout 150, the node delays 1500)", ms);
	struct ks_remote_stats st;
	ks_remote_stats(r, &st);
	KT_CHECK(st.timeouts >= 1);
	KT_CHECK(!ks_remote_up(r));
	KT_EQ_U64(st.hits, 0);
	atomic_store(&cl->node[1].read_delay_ms, 0);
	kv_sleep_ms(1600); /* the fake finishes the slow commands */
	KT_CHECK(ks_remote_probe_now(r));
	ts_close(&b);
	/* every read a little slow: the restore has several objects in flight
	 * at once (the read threads), on several nodes */
	for (int n = 0; n < 3; n++)
		atomic_store(&cl->node[n].read_delay_ms, 3);
	atomic_store(&cl->max_reads_in_flight, 0);
	KT_OK(open_env(&b, "b2", 1, r, NS));
	KT_EQ_INT(lookup(&b, tok, N_PROMPT, bounds, 2, &anchor, &rpos), B1);
	KT_EQ_INT(rpos, B1);
	KT_CHECKF(atomic_load(&cl->max_reads_in_flight) >= 2, "at most %d reads in flight during a restore",
		  atomic_load(&cl->max_reads_in_flight));
	for (int n = 0; n < 3; n++)
		atomic_store(&cl->node[n].read_delay_ms, 0);
	ts_close(&b);

	/* eviction in the middle of a ranged read: the value whose ranges are
	 * being read is gone at the 2nd GETRANGE from now */
	ks_remote_stats(r, &st);
	uint64_t bad0 = 0;
	for (int i = 0; i < KS_BAD__COUNT; i++)
		bad0 += st.bad[i];
	atomic_store(&cl->drop_after_ranges, 2);
	KT_OK(open_env(&b, "b3", 1, r, NS));
	uint32_t pos = lookup(&b, tok, N_PROMPT, bounds, 2, NULL, &rpos);
	KT_CHECKF(pos < B1, "resumed at %u with a part evicted mid-read", pos);
	KT_EQ_INT(atomic_load(&cl->drop_after_ranges), 0);
	ks_remote_stats(r, &st);
	uint64_t bad1 = 0;
	for (int i = 0; i < KS_BAD__COUNT; i++)
		bad1 += st.bad[i];
	KT_EQ_U64(bad1, bad0); /* a miss, not a corrupt value */
	KT_CHECK(ks_remote_up(r));
	kv_log_set_level(KV_LOG_WARN);
	ts_close(&b);
	ts_close(&a);
	ks_remote_destroy(r);
	fr_stop(cl);
}

KT_CASE(remote_hit_goes_to_disk_when_asked)
{
	struct fr_cluster *cl = fr_start(2, NULL);
	KT_REQUIRE(cl);
	struct ke_layout L;
	ts_layout(&L, 1);
	struct ks_remote *r = hub(cl, 1000, 1, 0, &L);
	KT_REQUIRE(r);
	struct ts_env a, b;
	int32_t tok[64];
	uint32_t bounds[] = {B0, B1}, rpos;
	ts_tokens(tok, 64, 64, 4);
	KT_OK(open_env(&a, "a", 1, r, NS));
	session(&a, tok);
	ks_store_drain(a.s);
	struct ks_remote_stats st0, st;
	ks_remote_stats(r, &st0);
	KT_OK(open_env(&b, "b", 1, r, NS));
	KT_EQ_INT(lookup(&b, tok, N_PROMPT, bounds, 2, NULL, &rpos), B1);
	KT_EQ_INT(rpos, B1);
	ks_store_drain(b.s);
	struct ks_stats ds;
	ks_store_stats(b.s, &ds);
	KT_CHECK(ds.written[KS_BLOCK] == 4 && ds.written[KS_ENTRY] == 1);
	/* ... and was offered back to Redis: content-addressed, the same keys
	 * (objects under KS_REMOTE_BIG, as here, are simply set again) */
	ks_remote_stats(r, &st);
	KT_EQ_U64(st.written_objects - st0.written_objects + st.present_objects - st0.present_objects, 9);
	KT_EQ_INT(count_keys(cl, "kvkeep:"), (int)st0.written_objects);
	ts_close(&b);
	/* B restarted: its own disk serves now; Redis has nothing longer */
	KT_OK(open_env(&b, "b", 1, r, NS));
	ks_remote_stats(r, &st0);
	KT_EQ_INT(lookup(&b, tok, N_PROMPT, bounds, 2, NULL, &rpos), B1);
	KT_EQ_INT(rpos, 0);
	ks_remote_stats(r, &st);
	KT_EQ_U64(st.hits, st0.hits);
	KT_EQ_U64(st.read_objects, st0.read_objects);
	ts_close(&a);
	ts_close(&b);
	ks_remote_destroy(r);
	fr_stop(cl);
}

KT_CASE(dense_longest_prefix)
{
	struct fr_cluster *cl = fr_start(3, NULL);
	KT_REQUIRE(cl);
	struct ke_layout L;
	ts_layout(&L, 0);
	struct ks_remote *r = hub(cl, 1000, 0, 0, &L);
	KT_REQUIRE(r);
	struct ts_env a, b;
	int32_t tok[80];
	uint32_t bounds[] = {37}, rpos;
	ts_tokens(tok, 80, 80, 5);
	KT_OK(open_env(&a, "a", 0, r, NS));
	ts_put(&a, tok, 37, NULL, 0, 0);
	ks_store_drain(a.s);
	KT_OK(open_env(&b, "b", 0, r, NS));
	/* the boundary at 37 names the tail; blocks alone would give 32 */
	KT_EQ_INT(lookup(&b, tok, 50, bounds, 1, NULL, &rpos), 37);
	ts_close(&b);
	KT_OK(open_env(&b, "b2", 0, r, NS));
	KT_EQ_INT(lookup(&b, tok, 50, NULL, 0, NULL, &rpos), 32);
	ts_close(&a);
	ts_close(&b);
	ks_remote_destroy(r);
	fr_stop(cl);
}

KT_CASE(manifest_only_when_every_part_is_there)
{
	struct fr_cluster *cl = fr_start(3, NULL);
	KT_REQUIRE(cl);
	struct ke_layout L;
	ts_layout(&L, 1);
	struct ks_remote *r = hub(cl, 1000, 0, 0, &L);
	KT_REQUIRE(r);
	struct ts_env a, b;
	int32_t tok[64];
	uint32_t ck[] = {16}, bounds[] = {B1}, rpos;
	ts_tokens(tok, 64, 64, 6);
	KT_OK(open_env(&a, "a", 1, r, NS));
	ts_put(&a, tok, 33, ck, 1, 0);
	ks_store_drain(a.s);
	KT_EQ_INT(count_keys(cl, ".entry."), 1);
	/* Redis loses block 3 (evicted, or a failover lost it) */
	uint32_t nh;
	struct kv_h128 h[8];
	h[0] = NS;
	for (nh = 1; nh <= 4; nh++)
		h[nh] = kc_chain_hash(h[nh - 1], tok + (nh - 1) * 8, 8);
	char key[200];
	size_t kl = ks_remote_key(r, NS, KS_BLOCK, h[3], key, sizeof key);
	pthread_mutex_lock(&cl->mu);
	struct fr_kv **p = fr_find(cl, key, kl);
	KT_REQUIRE(p);
	struct fr_kv *gone = *p;
	*p = gone->next;
	pthread_mutex_unlock(&cl->mu);
	free(gone->key);
	free(gone->val);
	free(gone);
	/* a longer entry on the same path: its manifest names block 3 */
	ts_put(&a, tok, B1, NULL, 0, 0);
	ks_store_drain(a.s);
	struct ks_remote_stats st;
	ks_remote_stats(r, &st);
	KT_EQ_U64(st.incomplete, 1);
	KT_EQ_INT(count_keys(cl, ".entry."), 1);
	/* B: the prompt through block 3 resumes below it (at the checkpoint
	 * at 16), never past the missing part */
	KT_OK(open_env(&b, "b", 1, r, NS));
	uint32_t pos = lookup(&b, tok, N_PROMPT, bounds, 1, NULL, &rpos);
	KT_CHECKF(pos <= 16, "resumed at %u past a missing block", pos);
	ts_close(&a);
	ts_close(&b);
	ks_remote_destroy(r);
	fr_stop(cl);
}

/* Replace the fake's value of (kind, id) by f(old). */
static void mutate(struct fr_cluster *cl, struct ks_remote *r, int kind, struct kv_h128 id, int how,
		   const struct fr_kv *src)
{
	struct fr_kv *e = value_of(cl, r, NS, kind, id);
	if (!e)
		return;
	pthread_mutex_lock(&cl->mu);
	if (how == 0) /* flip a byte near the end */
		e->val[e->vlen - 5] ^= 0x21;
	else if (how == 1) /* truncate */
		e->vlen = e->vlen * 2 / 3;
	else if (src) { /* another object's bytes */
		char *v = malloc(src->vlen);
		memcpy(v, src->val, src->vlen);
		free(e->val);
		e->val = v;
		e->vlen = src->vlen;
	}
	pthread_mutex_unlock(&cl->mu);
}

KT_CASE(bad_values_are_misses_counted_and_deleted)
{
	struct fr_cluster *cl = fr_start(3, NULL);
	KT_REQUIRE(cl);
	struct ke_layout L;
	ts_layout(&L, 1);
	struct ks_remote *r = hub(cl, 1000, 0, 0, &L);
	KT_REQUIRE(r);
	struct ts_env a, b, x;
	int32_t tok[64];
	uint32_t bounds[] = {B0, B1}, rpos;
	ts_tokens(tok, 64, 64, 7);
	KT_OK(open_env(&a, "a", 1, r, NS));
	session(&a, tok);
	ks_store_drain(a.s);
	/* another model (namespace) with the same tokens */
	struct kv_h128 ns2 = {0x3333, 0x4444};
	KT_OK(open_env(&x, "x", 1, r, ns2));
	session(&x, tok);
	ks_store_drain(x.s);

	/* the resume point at 37: snapshot flipped */
	struct kv_h128 h[8];
	h[0] = NS;
	for (int k = 1; k <= 5; k++)
		h[k] = kc_chain_hash(h[k - 1], tok + (k - 1) * 8, 8);
	struct kv_h128 rp37 = kc_rp_id(h[4], tok + 32, 5);
	mutate(cl, r, KS_SNAP, rp37, 0, NULL);
	KT_OK(open_env(&b, "b1", 1, r, NS));
	uint32_t pos = lookup(&b, tok, N_PROMPT, bounds, 2, NULL, &rpos);
	KT_EQ_INT(pos, 32); /* the checkpoint below it */
	struct ks_remote_stats st;
	ks_remote_stats(r, &st);
	KT_EQ_U64(st.bad[KS_BAD_CRC], 1);
	KT_CHECK(value_of(cl, r, NS, KS_SNAP, rp37) == NULL); /* deleted */
	ts_close(&b);

	/* block 2 truncated: everything built on it is gone */
	mutate(cl, r, KS_BLOCK, h[2], 1, NULL);
	KT_OK(open_env(&b, "b2", 1, r, NS));
	pos = lookup(&b, tok, N_PROMPT, bounds, 2, NULL, &rpos);
	KT_CHECKF(pos <= 8, "resumed at %u past a truncated block 2", pos);
	ks_remote_stats(r, &st);
	KT_CHECK(st.bad[KS_BAD_SIZE] + st.bad[KS_BAD_ARITH] + st.bad[KS_BAD_HEADER] >= 1);
	KT_CHECK(value_of(cl, r, NS, KS_BLOCK, h[2]) == NULL);
	ts_close(&b);

	/* the anchor snapshot at 20 holds the one at 16 (a real object of ours
	 * under the wrong key): refused, the hit keeps no anchor */
	ts_close(&a);
	KT_OK(open_env(&a, "a2", 1, r, NS));
	session(&a, tok);
	ks_store_drain(a.s); /* puts back what was deleted (the keys were missing) */
	struct kv_h128 rp20 = kc_rp_id(h[2], tok + 16, 4), rp16 = kc_rp_id(h[2], tok + 16, 0);
	struct fr_kv *v16 = value_of(cl, r, NS, KS_SNAP, rp16);
	KT_REQUIRE(v16);
	mutate(cl, r, KS_SNAP, rp20, 2, v16);
	KT_OK(open_env(&b, "b4", 1, r, NS));
	uint32_t anchor = 99;
	pos = lookup(&b, tok, N_PROMPT, bounds, 2, &anchor, &rpos);
	KT_EQ_INT(pos, B1);
	KT_EQ_INT(anchor, 0);
	ks_remote_stats(r, &st);
	KT_CHECK(st.bad[KS_BAD_HEADER] >= 1);
	ts_close(&b);

	/* block 1 holds the other model's block 1 (same tokens): foreign */
	struct kv_h128 x1 = kc_chain_hash(ns2, tok, 8);
	struct fr_kv *xv = value_of(cl, r, ns2, KS_BLOCK, x1);
	KT_REQUIRE(xv);
	mutate(cl, r, KS_BLOCK, h[1], 2, xv);
	KT_OK(open_env(&b, "b3", 1, r, NS));
	pos = lookup(&b, tok, N_PROMPT, bounds, 2, NULL, &rpos);
	KT_EQ_INT(pos, 0);
	ks_remote_stats(r, &st);
	KT_EQ_U64(st.bad[KS_BAD_NS], 1);
	KT_CHECK(value_of(cl, r, NS, KS_BLOCK, h[1]) == NULL);
	KT_CHECK(value_of(cl, r, ns2, KS_BLOCK, x1) != NULL); /* the other model's own key is untouched */
	ts_close(&b);
	ts_close(&a);
	ts_close(&x);
	ks_remote_destroy(r);
	fr_stop(cl);
}

KT_CASE(other_namespace_never_hits)
{
	struct fr_cluster *cl = fr_start(3, NULL);
	KT_REQUIRE(cl);
	struct ke_layout L;
	ts_layout(&L, 1);
	struct ks_remote *r = hub(cl, 1000, 0, 0, &L);
	KT_REQUIRE(r);
	struct ts_env a, b;
	int32_t tok[64];
	uint32_t bounds[] = {B0, B1}, rpos;
	ts_tokens(tok, 64, 64, 8);
	KT_OK(open_env(&a, "a", 1, r, NS));
	session(&a, tok);
	ks_store_drain(a.s);
	struct kv_h128 salted = {0x5555, 0x6666};
	KT_OK(open_env(&b, "b", 1, r, salted));
	KT_EQ_INT(lookup(&b, tok, N_PROMPT, bounds, 2, NULL, &rpos), 0);
	char nsx[33];
	kv_h128_hex(salted, nsx);
	KT_EQ_INT(count_keys(cl, nsx), 0);
	session(&b, tok);
	ks_store_drain(b.s);
	KT_CHECK(count_keys(cl, nsx) > 0);
	kv_h128_hex(NS, nsx);
	int mine = count_keys(cl, nsx), all = count_keys(cl, "kvkeep:");
	KT_EQ_INT(all, 2 * mine); /* the same objects, each namespace its own keys */
	ts_close(&a);
	ts_close(&b);
	ks_remote_destroy(r);
	fr_stop(cl);
}

KT_CASE(down_tier_is_skipped_then_picked_up)
{
	struct fr_cluster *cl = fr_start(2, NULL);
	KT_REQUIRE(cl);
	struct ke_layout L;
	ts_layout(&L, 1);
	for (int i = 0; i < 2; i++)
		fr_down(&cl->node[i]);
	kv_log_set_level(KV_LOG_ERROR);
	struct ks_remote *r = hub(cl, 200, 0, 0, &L);
	KT_REQUIRE(r); /* a cluster down at start is not an error */
	KT_CHECK(!ks_remote_up(r));
	struct ts_env a, b;
	int32_t tok[64];
	uint32_t bounds[] = {B0, B1}, rpos;
	ts_tokens(tok, 64, 64, 9);
	KT_OK(open_env(&a, "a", 1, r, NS));
	session(&a, tok);
	ks_store_drain(a.s);
	struct ks_remote_stats st;
	ks_remote_stats(r, &st);
	KT_CHECK(st.dropped[KS_RDROP_DOWN] > 0);
	KT_EQ_U64(st.written_objects, 0);
	KT_OK(open_env(&b, "b", 1, r, NS));
	uint64_t t0 = kv_now_ns();
	KT_EQ_INT(lookup(&b, tok, N_PROMPT, bounds, 2, NULL, &rpos), 0);
	KT_CHECKF(kv_now_ns() - t0 < 100000000ull, "a lookup with the tier down took %.1f ms", (kv_now_ns() - t0) / 1e6);
	ks_remote_stats(r, &st);
	KT_EQ_U64(st.skipped, 1);
	/* the cluster comes back: a probe picks it up, writes go through */
	for (int i = 0; i < 2; i++)
		KT_REQUIRE(fr_up(&cl->node[i]) == 0);
	KT_CHECK(ks_remote_probe_now(r));
	session(&a, tok);
	ts_close(&a);
	KT_OK(open_env(&a, "a2", 1, r, NS));
	session(&a, tok);
	ks_store_drain(a.s);
	KT_EQ_INT(lookup(&b, tok, N_PROMPT, bounds, 2, NULL, &rpos), B1);
	KT_EQ_INT(rpos, B1);
	/* a master dies mid-run: the next lookup fails fast, takes the tier
	 * down, and the answer comes from the local tiers */
	fr_down(&cl->node[0]);
	fr_down(&cl->node[1]);
	ts_close(&b);
	KT_OK(open_env(&b, "b2", 1, r, NS));
	t0 = kv_now_ns();
	KT_EQ_INT(lookup(&b, tok, N_PROMPT, bounds, 2, NULL, &rpos), 0);
	KT_CHECKF(kv_now_ns() - t0 < 700000000ull, "lookup took %.1f ms (timeout 200, nodes dead)", (kv_now_ns() - t0) / 1e6);
	KT_CHECK(!ks_remote_up(r));
	ks_remote_stats(r, &st);
	KT_EQ_U64(st.downs, 1);
	kv_log_set_level(KV_LOG_WARN);
	ts_close(&a);
	ts_close(&b);
	ks_remote_destroy(r);
	fr_stop(cl);
}

KT_CASE(slow_node_bounds_the_lookup)
{
	struct fr_cluster *cl = fr_start(2, NULL);
	KT_REQUIRE(cl);
	struct ke_layout L;
	ts_layout(&L, 1);
	struct ks_remote *r = hub(cl, 100, 0, 0, &L);
	KT_REQUIRE(r);
	struct ts_env a, b;
	int32_t tok[64];
	uint32_t bounds[] = {B0, B1}, rpos;
	ts_tokens(tok, 64, 64, 10);
	KT_OK(open_env(&a, "a", 1, r, NS));
	session(&a, tok);
	ks_store_drain(a.s);
	kv_log_set_level(KV_LOG_ERROR);
	atomic_store(&cl->node[0].delay_ms, 2000);
	atomic_store(&cl->node[1].delay_ms, 2000);
	KT_OK(open_env(&b, "b", 1, r, NS));
	uint64_t t0 = kv_now_ns();
	KT_EQ_INT(lookup(&b, tok, N_PROMPT, bounds, 2, NULL, &rpos), 0);
	double ms = (double)(kv_now_ns() - t0) / 1e6;
	KT_CHECKF(ms < 700, "a lookup on slow nodes took %.0f ms with a 100 ms timeout (nodes delay 2 s)", ms);
	struct ks_remote_stats st;
	ks_remote_stats(r, &st);
	KT_CHECK(st.timeouts >= 1);
	KT_CHECK(!ks_remote_up(r));
	atomic_store(&cl->node[0].delay_ms, 0);
	atomic_store(&cl->node[1].delay_ms, 0);
	kv_sleep_ms(2100); /* the fake finishes the slow commands */
	KT_CHECK(ks_remote_probe_now(r));
	kv_log_set_level(KV_LOG_WARN);
	ts_close(&a);
	ts_close(&b);
	ks_remote_destroy(r);
	fr_stop(cl);
}

/* The writers' calls get five times the timeout (no request waits on
 * them): with every SET slower than a lookup's deadline, every object and
 * the manifest are still written and the tier stays up; the next server
 * resumes from them. */
KT_CASE(writes_outlast_a_lookup_deadline)
{
	struct fr_cluster *cl = fr_start(2, NULL);
	KT_REQUIRE(cl);
	struct ke_layout L;
	ts_layout(&L, 1);
	struct ks_remote *r = hub(cl, 100, 0, 0, &L);
	KT_REQUIRE(r);
	struct ts_env a, b;
	int32_t tok[64];
	uint32_t bounds[] = {B0, B1}, rpos;
	ts_tokens(tok, 64, 64, 13);
	KT_OK(open_env(&a, "a", 1, r, NS));
	atomic_store(&cl->node[0].set_delay_ms, 150); /* past 100 ms and its bytes' 0.1 ms */
	atomic_store(&cl->node[1].set_delay_ms, 150);
	session(&a, tok);
	ks_store_drain(a.s);
	atomic_store(&cl->node[0].set_delay_ms, 0);
	atomic_store(&cl->node[1].set_delay_ms, 0);
	struct ks_remote_stats st;
	ks_remote_stats(r, &st);
	KT_CHECKF(st.downs == 0, "a write took the tier down (SETs take 150 ms, the timeout is 100 ms)");
	KT_CHECK(ks_remote_up(r));
	KT_CHECK(st.written_objects >= 2);
	KT_EQ_U64(st.dropped[KS_RDROP_DOWN] + st.dropped[KS_RDROP_ERROR], 0);
	KT_CHECK(count_keys(cl, ".entry.") >= 1);
	KT_OK(open_env(&b, "b", 1, r, NS));
	KT_EQ_INT(lookup(&b, tok, N_PROMPT, bounds, 2, NULL, &rpos), B1);
	KT_EQ_INT(rpos, B1);
	ts_close(&a);
	ts_close(&b);
	ks_remote_destroy(r);
	fr_stop(cl);
}

KT_CASE(queue_cap_and_shutdown_drop)
{
	struct fr_cluster *cl = fr_start(2, NULL);
	KT_REQUIRE(cl);
	struct ke_layout L;
	ts_layout(&L, 1);
	struct ks_remote *r = hub(cl, 1000, 0, 1, &L); /* a 1-byte queue: one view at a time */
	KT_REQUIRE(r);
	struct ts_env a;
	int32_t tok[64];
	ts_tokens(tok, 64, 64, 11);
	KT_OK(open_env(&a, "a", 1, r, NS));
	session(&a, tok);
	ks_store_drain(a.s);
	struct ks_remote_stats st;
	ks_remote_stats(r, &st);
	KT_CHECK(st.dropped[KS_RDROP_QUEUE] > 0);
	KT_EQ_U64(st.written_objects, 1);
	KT_EQ_INT(count_keys(cl, ".entry."), 0); /* dropped, never a manifest without parts */
	ts_close(&a);
	ks_remote_destroy(r);

	/* SIGTERM: the flush drops what the remote writer holds and keeps to
	 * its budget. The writers run as threads; a slow cluster keeps the
	 * remote writer on its first object while the disk writer hands the
	 * rest on. */
	r = hub(cl, 3000, 0, 0, &L);
	KT_REQUIRE(r);
	char root[4096];
	snprintf(root, sizeof root, "%s/a2", kt_tmpdir());
	struct ks_params p = {.remote = r, .ns = NS};
	KT_OK(ts_open(&a, root, 1, &p));
	atomic_store(&cl->node[0].delay_ms, 1500);
	atomic_store(&cl->node[1].delay_ms, 1500);
	int32_t tok2[64];
	ts_tokens(tok2, 64, 64, 12);
	session(&a, tok2);
	ks_store_kick(a.s);
	for (int i = 0; i < 200; i++) {
		ks_remote_stats(r, &st);
		if (st.queue_len >= 3)
			break;
		kv_sleep_ms(5);
	}
	KT_CHECK(st.queue_len >= 3);
	struct ks_flush_report rep;
	KT_OK(ks_store_flush(a.s, 1.0, &rep));
	ks_remote_stats(r, &st);
	KT_CHECK(st.dropped[KS_RDROP_SHUTDOWN] >= 3);
	KT_EQ_U64(st.queue_len, 0);
	KT_CHECKF(rep.seconds < 1.3, "flush took %.2f s of a 1 s budget", rep.seconds);
	ks_remote_abort(r); /* what the server does next: the SET in flight is cut */
	uint64_t t0 = kv_now_ns();
	ts_close(&a);
	KT_CHECKF(kv_now_ns() - t0 < 600000000ull, "close waited %.0f ms for the remote writer (its SET: 1.5 s a command)",
		  (kv_now_ns() - t0) / 1e6);
	ks_remote_stats(r, &st);
	KT_CHECK(st.written_objects <= 1);
	atomic_store(&cl->node[0].delay_ms, 0);
	atomic_store(&cl->node[1].delay_ms, 0);
	ks_remote_destroy(r);
	fr_stop(cl);
}

KT_MAIN(a_writes_b_resumes_at_the_boundary, remote_hit_goes_to_disk_when_asked, dense_longest_prefix,
	manifest_only_when_every_part_is_there, bad_values_are_misses_counted_and_deleted, other_namespace_never_hits,
	down_tier_is_skipped_then_picked_up, slow_node_bounds_the_lookup, writes_outlast_a_lookup_deadline,
	queue_cap_and_shutdown_drop, plain_gets_restore_too, one_node_slow_mid_restore_then_eviction_mid_read)
