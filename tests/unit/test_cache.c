/*
 * test_cache.c - the RAM prefix cache core: lookup rules (dense and
 * hybrid), restored bytes, pins, LRU and leaves, the MRU rule, admission,
 * the prefill projection, count caps, the disk-tier views, argument
 * checks and the invariant checker. Every case runs on both indexes.
 */
#include "kt.h"
#include "test_cache_util.h"
#include "base/err.h"
#include "base/hash.h"
#include "base/log.h"
#include "cache/cache.h"
#include "cache/index.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

struct tc {
	struct ke_layout L;
	struct kv_pages *pool;
	struct kc_cache *c;
	uint64_t evicted[64];
	int n_evicted;
	uint64_t used; /* what mem_used reports */
};

static void on_ev(void *ctx, uint64_t id, uint32_t len)
{
	struct tc *t = ctx;
	(void)len;
	if (t->n_evicted < 64)
		t->evicted[t->n_evicted++] = id;
}

static uint64_t fake_used(void *ctx)
{
	return ((struct tc *)ctx)->used;
}

static int tc_open(struct tc *t, int B, int hybrid, int index, struct kc_params *extra)
{
	struct kc_policy pol;
	struct kc_params p;
	memset(t, 0, sizeof *t);
	tc_layout(&t->L, B, hybrid, 24);
	kc_policy_default(&pol, hybrid);
	t->pool = kv_pages_create(t->L.page_bytes, 0, 8);
	p = extra ? *extra : (struct kc_params){0};
	p.layout = &t->L;
	p.index = index;
	p.policy = &pol;
	p.on_evict = on_ev;
	p.evict_ctx = t;
	if (extra && extra->mem_used) {
		p.mem_used = fake_used;
		p.mem_ctx = t;
	}
	p.ns = (struct kv_h128){7, 9};
	return kc_cache_create(&p, &t->c);
}

static void tc_close(struct tc *t)
{
	kc_cache_destroy(t->c);
	KT_EQ_INT(kv_pages_in_use(t->pool), 0);
	kv_pages_destroy(t->pool);
}

/* Store tok[0..n) with checkpoints (hybrid gets snapshots everywhere). */
static uint64_t put(struct tc *t, const int32_t *tok, uint32_t n, const uint32_t *ck, uint32_t n_ck, uint32_t anchor)
{
	struct kv_page *pg[64];
	struct kc_put_ckpt c[8];
	uint64_t id = 0;
	int np = tc_pages(t->pool, &t->L, tok, n, pg);
	int hyb = t->L.n_rec_layers > 0;
	for (uint32_t i = 0; i < n_ck; i++) {
		c[i].pos = ck[i];
		c[i].snap = hyb ? tc_snap(t->c, tok, ck[i]) : NULL;
	}
	struct kc_put p = {.tokens = tok, .n = n, .pages = pg, .snap = hyb ? tc_snap(t->c, tok, n) : NULL,
			   .ckpt = c, .n_ckpt = n_ck, .anchor = anchor};
	if (kc_cache_put(t->c, &p, &id) != KV_OK)
		id = 0;
	for (int i = 0; i < np; i++)
		kv_page_unref(pg[i]);
	return id;
}

/* Lookup, verify the restored bytes, release; returns the hit. */
static struct kc_hit look(struct tc *t, const int32_t *tok, uint32_t n)
{
	struct kc_hit h, copy;
	kc_cache_lookup(t->c, tok, n, &h);
	KT_CHECKF(tc_verify_hit(t->c, &h, tok) == 0, "restored bytes differ for n=%u p=%u", n, h.pos);
	copy = h; /* release clears the pins and pointers */
	kc_hit_release(t->c, &h);
	return copy;
}

static const int32_t A[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};

KT_CASE(dense_lookup_rules)
{
	for (int ix = 0; ix < 2; ix++) {
		struct tc t;
		struct kc_hit h;
		struct kc_stats st;
		KT_OK(tc_open(&t, 4, 0, ix, NULL));
		KT_CHECK(put(&t, A, 10, NULL, 0, 0) > 0);
		/* The same prompt again: everything but the last token. */
		h = look(&t, A, 10);
		KT_EQ_INT(h.pos, 9);
		KT_EQ_INT(h.shared, 10);
		KT_EQ_INT(h.n_pages, 2);
		KT_EQ_INT(h.tail_rows, 1);
		/* Diverging inside block 2: its stored page's first rows. */
		int32_t q1[] = {1, 2, 3, 4, 5, 6, 99, 98};
		h = look(&t, q1, 8);
		KT_EQ_INT(h.pos, 6);
		KT_EQ_INT(h.tail_rows, 2);
		KT_EQ_INT(h.tail_stride, 4); /* rows of a page */
		/* Exactly two full blocks: the last one gives 3 rows. */
		h = look(&t, A, 8);
		KT_EQ_INT(h.pos, 7);
		KT_EQ_INT(h.n_pages, 1);
		KT_EQ_INT(h.tail_rows, 3);
		/* Longer prompt: all 10 stored tokens; the tail is a stored tail. */
		int32_t q2[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
		h = look(&t, q2, 12);
		KT_EQ_INT(h.pos, 10);
		KT_EQ_INT(h.tail_rows, 2);
		KT_EQ_INT(h.tail_stride, 2); /* compact tail */
		/* Tail diverging after one row. */
		int32_t q3[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 77, 76};
		h = look(&t, q3, 11);
		KT_EQ_INT(h.pos, 9);
		/* Misses. */
		int32_t q4[] = {9, 9, 9};
		h = look(&t, q4, 3);
		KT_EQ_INT(h.pos, 0);
		h = look(&t, A, 1);
		KT_EQ_INT(h.pos, 0);
		KT_EQ_INT(h.shared, 1);
		/* A second sequence sharing block 1: stored once. */
		int32_t b[] = {1, 2, 3, 4, 5, 6, 50, 51, 52, 53, 54, 55};
		KT_CHECK(put(&t, b, 12, NULL, 0, 0) > 0);
		kc_cache_stats(t.c, &st);
		KT_EQ_INT(st.nodes, 4);
		KT_EQ_INT(st.entries, 2);
		KT_EQ_U64(st.dedup_bytes_saved, t.L.page_bytes);
		KT_EQ_U64(st.bytes_in_use, 4 * kc_policy_node_bytes(&t.L) + kc_policy_rp_bytes(&t.L, 2, 0) +
						   kc_policy_rp_bytes(&t.L, 0, 0));
		KT_EQ_INT(st.hits, 5);
		KT_EQ_INT(st.misses, 2);
		KT_EQ_U64(st.tokens_saved, 9 + 6 + 7 + 10 + 9);
		KT_OK(kc_cache_check(t.c));
		tc_close(&t);
	}
}

static int capture_begin(char *path, size_t len)
{
	int fd;
	snprintf(path, len, "%s/log", kt_tmpdir());
	fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
	kv_log_set_fd(fd);
	kv_log_set_level(KV_LOG_INFO);
	return fd;
}

static void capture_end(int fd, char *buf, size_t len, const char *path)
{
	FILE *f;
	size_t n = 0;
	kv_log_set_fd(2);
	kv_log_set_level(KV_LOG_WARN);
	close(fd);
	f = fopen(path, "r");
	if (f) {
		n = fread(buf, 1, len - 1, f);
		fclose(f);
	}
	buf[n] = 0;
}

KT_CASE(hybrid_lookup_needs_snapshots)
{
	for (int ix = 0; ix < 2; ix++) {
		struct tc t;
		struct kc_hit h;
		struct kc_stats st;
		uint32_t ck[] = {3, 6};
		char path[512], logbuf[4096];
		int fd;
		KT_OK(tc_open(&t, 4, 1, ix, NULL));
		KT_CHECK(put(&t, A, 10, ck, 2, 0) > 0);
		/* Shares 8 tokens; the newest snapshot at or below is 6. */
		int32_t q[] = {1, 2, 3, 4, 5, 6, 7, 8, 77};
		fd = capture_begin(path, sizeof path);
		h = look(&t, q, 9);
		capture_end(fd, logbuf, sizeof logbuf, path);
		KT_EQ_INT(h.pos, 6);
		KT_EQ_INT(h.shared, 8);
		KT_CHECKF(strstr(logbuf, "LCP snapped to checkpoint: shared=8 entry_len=10 resumed_at=6") != NULL,
			  "log: %s", logbuf);
		/* The stored prompt itself: p <= n - 1 rules out the end snapshot. */
		h = look(&t, A, 10);
		KT_EQ_INT(h.pos, 6);
		/* Extending it: the end snapshot, and the checkpoints below are
		 * inherited. */
		int32_t q2[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
		h = look(&t, q2, 11);
		KT_EQ_INT(h.pos, 10);
		KT_EQ_INT(h.n_inh, 2);
		KT_EQ_INT(h.inh[0], 3);
		KT_EQ_INT(h.inh[1], 6);
		/* Shares only 2 tokens, below every snapshot: a miss. */
		int32_t q3[] = {1, 2, 40, 41};
		h = look(&t, q3, 4);
		KT_EQ_INT(h.pos, 0);
		KT_EQ_INT(h.shared, 2);
		kc_cache_stats(t.c, &st);
		KT_EQ_INT(st.snaps, 2);
		KT_EQ_INT(st.snapshots, 3);
		KT_OK(kc_cache_check(t.c));
		tc_close(&t);
	}
}

KT_CASE(anchor_is_recorded_and_inherited)
{
	struct tc t;
	struct kc_hit h;
	uint32_t ck[] = {3, 6};
	int32_t q[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
	KT_OK(tc_open(&t, 4, 1, 0, NULL));
	put(&t, A, 10, ck, 2, 3);
	h = look(&t, q, 11);
	KT_EQ_INT(h.anchor, 3);
	KT_EQ_INT(h.n_inh, 2);
	tc_close(&t);
}

KT_CASE(pins_keep_data_alive)
{
	for (int hyb = 0; hyb < 2; hyb++) {
		struct tc t;
		struct kc_hit h;
		struct kc_stats st;
		uint32_t ck[] = {5};
		int32_t q[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
		KT_OK(tc_open(&t, 4, hyb, 0, NULL));
		put(&t, A, 10, ck, hyb, 0);
		kc_cache_lookup(t.c, q, 11, &h);
		KT_EQ_INT(h.pos, 10);
		kc_cache_clear(t.c); /* the entry is pinned through its end: stays */
		kc_cache_stats(t.c, &st);
		KT_EQ_INT(st.entries, 1);
		KT_OK(kc_cache_check(t.c));
		kc_hit_release(t.c, &h);
		kc_cache_clear(t.c);
		/* Pin via a hit in the middle of the entry (dense: node pins). */
		put(&t, A, 10, ck, hyb, 0);
		kc_cache_lookup(t.c, q, 7, &h);
		KT_CHECK(h.pos >= 5);
		kc_cache_clear(t.c);
		kc_cache_stats(t.c, &st);
		KT_EQ_INT(st.entries, 0);
		KT_CHECK(st.nodes >= 1); /* what the hit uses is still there */
		KT_EQ_INT(tc_verify_hit(t.c, &h, q), 0);
		KT_OK(kc_cache_check(t.c));
		kc_hit_release(t.c, &h);
		kc_hit_release(t.c, &h); /* twice is harmless */
		kc_cache_stats(t.c, &st);
		KT_EQ_INT(st.nodes, 0);
		KT_EQ_INT(st.rps, 0);
		KT_EQ_U64(st.bytes_in_use, 0);
		tc_close(&t);
	}
}

KT_CASE(lru_order_and_leaves_first)
{
	for (int ix = 0; ix < 2; ix++) {
		struct tc t;
		int32_t x[] = {10, 1, 1, 1, 1, 1}, y[] = {20, 1, 1, 1, 1, 1}, z[] = {30, 1, 1, 1, 1, 1};
		uint64_t ix_, iy, iz;
		KT_OK(tc_open(&t, 4, 0, ix, NULL));
		ix_ = put(&t, x, 6, NULL, 0, 0);
		iy = put(&t, y, 6, NULL, 0, 0);
		iz = put(&t, z, 6, NULL, 0, 0);
		int32_t qx[] = {10, 1, 1, 1, 1, 1, 5};
		look(&t, qx, 7); /* uses all of x: x becomes the most recent */
		KT_OK(kc_cache_evict_lru(t.c, NULL));
		KT_OK(kc_cache_evict_lru(t.c, NULL));
		KT_EQ_INT(t.n_evicted, 2);
		KT_EQ_U64(t.evicted[0], iy);
		KT_EQ_U64(t.evicted[1], iz);
		KT_OK(kc_cache_evict_lru(t.c, NULL));
		KT_EQ_U64(t.evicted[2], ix_);
		KT_EQ_INT(kc_cache_evict_lru(t.c, NULL), KV_ERR_NOT_FOUND);
		/* Dense: P = two full blocks, Q extends it, so P is redundant
		 * (Q covers every position P did) and is dropped at once. */
		t.n_evicted = 0;
		uint64_t ip = put(&t, A, 8, NULL, 0, 0);
		put(&t, A, 10, NULL, 0, 0);
		KT_EQ_INT(t.n_evicted, 1);
		KT_EQ_U64(t.evicted[0], ip);
		struct kc_stats st;
		kc_cache_stats(t.c, &st);
		KT_EQ_INT(st.superseded, 1);
		KT_EQ_INT(st.entries, 1);
		tc_close(&t);

		/* Hybrid: Q extends P and keeps P's end as a checkpoint. P is
		 * older but not a leaf (evicting it frees nothing while Q uses
		 * its snapshot), so Q goes first. */
		KT_OK(tc_open(&t, 4, 1, ix, NULL));
		uint32_t ck[] = {8};
		ip = put(&t, A, 8, NULL, 0, 0);
		uint64_t iq = put(&t, A, 10, ck, 1, 0);
		KT_EQ_INT(t.n_evicted, 0);
		KT_OK(kc_cache_evict_lru(t.c, NULL));
		KT_EQ_U64(t.evicted[0], iq);
		KT_OK(kc_cache_evict_lru(t.c, NULL));
		KT_EQ_U64(t.evicted[1], ip);
		tc_close(&t);
	}
}

KT_CASE(mru_survives_pressure_below_cap)
{
	struct tc t;
	struct kc_params ex = {.mem_used = fake_used, .mem_cap = 1000000};
	struct kc_stats st;
	int32_t big[40], other[40];
	for (int i = 0; i < 40; i++) {
		big[i] = i;
		other[i] = 100 + i;
	}
	KT_OK(tc_open(&t, 4, 1, 0, &ex));
	t.used = 500000;
	kc_cache_set_budget(t.c, 100); /* smaller than any entry */
	put(&t, big, 40, NULL, 0, 0);
	kc_cache_stats(t.c, &st);
	KT_EQ_INT(st.entries, 1); /* kept although over the budget */
	KT_CHECK(st.bytes_in_use > 100);
	put(&t, other, 40, NULL, 0, 0);
	kc_cache_stats(t.c, &st);
	KT_EQ_INT(st.entries, 1);
	KT_EQ_INT(st.pressure_evictions, 1);
	KT_EQ_INT(t.n_evicted, 1);
	/* At the memory cap itself the MRU entry goes too. */
	t.used = 1000000;
	kc_cache_set_budget(t.c, 100);
	kc_cache_stats(t.c, &st);
	KT_EQ_INT(st.entries, 0);
	KT_EQ_INT(st.pressure_evictions, 2);
	tc_close(&t);
}

KT_CASE(admission_evicts_before_no_room)
{
	struct tc t;
	struct kc_stats st;
	uint64_t rel, one;
	int32_t s[3][20];
	for (int k = 0; k < 3; k++)
		for (int i = 0; i < 20; i++)
			s[k][i] = k * 100 + i;
	KT_OK(tc_open(&t, 4, 0, 0, NULL));
	for (int k = 0; k < 3; k++)
		put(&t, s[k], 20, NULL, 0, 0);
	kc_cache_stats(t.c, &st);
	one = st.bytes_in_use / 3;
	/* Fits without evicting. */
	KT_OK(kc_cache_admit(t.c, 1000, 100, 2000, &rel));
	KT_EQ_U64(rel, 0);
	/* Needs a bit more than one entry: two LRU entries go. */
	KT_OK(kc_cache_admit(t.c, 10000, one + 1, 10000, &rel));
	KT_EQ_U64(rel, 2 * one);
	KT_EQ_INT(t.n_evicted, 2);
	/* The MRU entry goes too before "no room"... */
	KT_OK(kc_cache_admit(t.c, 10000, one, 10000, &rel));
	KT_EQ_U64(rel, one);
	/* ... and with nothing left it is "no room". */
	KT_EQ_INT(kc_cache_admit(t.c, 10000, 1, 10000, &rel), KV_ERR_FULL);
	KT_EQ_INT(kc_cache_admit(t.c, 10000, 1, 0, &rel), KV_OK); /* no cap */
	tc_close(&t);
}

KT_CASE(admission_counts_only_memory_really_freed)
{
	/* A live sequence still holds the pages: evicting gives back only the
	 * tokens and tails, so admission says "no room". */
	struct tc t;
	struct kv_page *pg[8];
	uint64_t rel;
	int np;
	KT_OK(tc_open(&t, 4, 0, 0, NULL));
	np = tc_pages(t.pool, &t.L, A, 8, pg);
	struct kc_put p = {.tokens = A, .n = 8, .pages = pg};
	KT_OK(kc_cache_put(t.c, &p, NULL));
	KT_EQ_INT(kc_cache_admit(t.c, 10000, t.L.page_bytes, 10000, &rel), KV_ERR_FULL);
	KT_EQ_U64(rel, 8 * sizeof(int32_t));
	for (int i = 0; i < np; i++)
		kv_page_unref(pg[i]);
	tc_close(&t);
}

KT_CASE(prefill_projection)
{
	struct tc t;
	struct kc_params ex = {.transient_factor = 0.5};
	struct kc_prefill_need need = {.used = 0, .recurrent = 1000, .inflight = 500, .scratch = 300,
				       .remaining_tokens = 100, .cap = 100000};
	struct kc_stats st;
	uint64_t proj, rel, one;
	int32_t s[4][20];
	for (int k = 0; k < 4; k++)
		for (int i = 0; i < 20; i++)
			s[k][i] = k * 100 + i;
	KT_OK(tc_open(&t, 4, 1, 0, &ex));
	/* 1000 + 500 + 300 + 100 x 16 x 1.5 */
	KT_OK(kc_cache_reclaim_prefill(t.c, &need, &proj, &rel));
	KT_EQ_U64(proj, 1000 + 500 + 300 + 2400);
	KT_EQ_U64(rel, 0);
	for (int k = 0; k < 4; k++)
		put(&t, s[k], 20, NULL, 0, 0);
	kc_cache_stats(t.c, &st);
	one = st.bytes_in_use / 4;
	/* Over 90% of the cap by a bit more than one entry: two evictions. */
	need.used = need.cap / 10 * 9 - proj + one + 1;
	KT_OK(kc_cache_reclaim_prefill(t.c, &need, &proj, &rel));
	KT_EQ_U64(rel, 2 * one);
	kc_cache_stats(t.c, &st);
	KT_EQ_INT(st.entries, 2);
	KT_EQ_INT(st.pressure_evictions, 2);
	/* Far over, but below the cap itself: everything but the MRU entry
	 * goes, then it does not fit. */
	need.used = need.cap / 10 * 9;
	KT_EQ_INT(kc_cache_reclaim_prefill(t.c, &need, &proj, &rel), KV_ERR_FULL);
	kc_cache_stats(t.c, &st);
	KT_EQ_INT(st.entries, 1);
	tc_close(&t);
	/* Dense models: no projection eviction. */
	KT_OK(tc_open(&t, 4, 0, 0, &ex));
	put(&t, s[0], 20, NULL, 0, 0);
	need.used = need.cap;
	KT_OK(kc_cache_reclaim_prefill(t.c, &need, &proj, &rel));
	kc_cache_stats(t.c, &st);
	KT_EQ_INT(st.entries, 1);
	tc_close(&t);
}

KT_CASE(count_caps_and_disable)
{
	struct tc t;
	struct kc_stats st;
	struct kc_params ex = {.max_entries = 2};
	struct kc_hit h;
	int32_t s[12][6];
	for (int k = 0; k < 12; k++)
		for (int i = 0; i < 6; i++)
			s[k][i] = k * 10 + i;
	/* Legacy count mode. */
	KT_OK(tc_open(&t, 4, 0, 0, &ex));
	for (int k = 0; k < 3; k++)
		put(&t, s[k], 6, NULL, 0, 0);
	kc_cache_stats(t.c, &st);
	KT_EQ_INT(st.entries, 2);
	KT_EQ_INT(t.n_evicted, 1);
	tc_close(&t);
	/* Hybrid automatic: 8 entries. */
	KT_OK(tc_open(&t, 4, 1, 0, NULL));
	for (int k = 0; k < 12; k++)
		put(&t, s[k], 6, NULL, 0, 0);
	kc_cache_stats(t.c, &st);
	KT_EQ_INT(st.entries, 8);
	tc_close(&t);
	/* --hybrid-cache-entries 3, and none. */
	ex = (struct kc_params){.max_hybrid_entries = 3};
	KT_OK(tc_open(&t, 4, 1, 0, &ex));
	for (int k = 0; k < 5; k++)
		put(&t, s[k], 6, NULL, 0, 0);
	kc_cache_stats(t.c, &st);
	KT_EQ_INT(st.entries, 3);
	tc_close(&t);
	ex = (struct kc_params){.max_hybrid_entries = KC_HYBRID_NONE};
	KT_OK(tc_open(&t, 4, 1, 0, &ex));
	KT_EQ_U64(put(&t, s[0], 6, NULL, 0, 0), 0);
	kc_cache_stats(t.c, &st);
	KT_EQ_INT(st.entries, 0);
	KT_EQ_U64(kv_mem_used(KV_MEM_CACHE), 0); /* the snapshots were freed */
	tc_close(&t);
	/* Disabled: stores nothing, lookups miss and count nothing. */
	ex = (struct kc_params){.disabled = 1};
	KT_OK(tc_open(&t, 4, 0, 0, &ex));
	KT_EQ_U64(put(&t, s[0], 6, NULL, 0, 0), 0);
	kc_cache_lookup(t.c, s[0], 6, &h);
	KT_EQ_INT(h.pos, 0);
	kc_hit_release(t.c, &h);
	kc_cache_stats(t.c, &st);
	KT_EQ_INT(st.entries + st.lookups, 0);
	tc_close(&t);
}

KT_CASE(dirty_views_for_the_disk_tier)
{
	for (int ix = 0; ix < 2; ix++) {
		struct tc t;
		struct kc_view v[8];
		size_t n;
		struct kv_h128 h0, h1, ns = {7, 9};
		KT_OK(tc_open(&t, 4, 1, ix, NULL));
		uint32_t ck[] = {6};
		put(&t, A, 10, ck, 1, 6);
		KT_EQ_INT(kc_cache_dirty_count(t.c), 5); /* 2 blocks, 2 rps, 1 entry */
		n = kc_cache_take_dirty(t.c, v, 8);
		KT_REQUIRE(n == 5);
		KT_EQ_INT(kc_cache_dirty_count(t.c), 0);
		h0 = kc_chain_hash(ns, A, 4);
		h1 = kc_chain_hash(h0, A + 4, 4);
		KT_CHECK(v[0].kind == KC_OBJ_BLOCK && kv_h128_eq(v[0].id, h0) && kv_h128_eq(v[0].parent, ns));
		KT_CHECK(v[1].kind == KC_OBJ_BLOCK && kv_h128_eq(v[1].id, h1) && kv_h128_eq(v[1].parent, h0));
		KT_EQ_INT(v[1].pos, 8);
		KT_CHECK(v[2].kind == KC_OBJ_RP && v[3].kind == KC_OBJ_RP);
		KT_CHECK(v[4].kind == KC_OBJ_ENTRY && v[4].pos == 10 && v[4].n_ckpt == 1 && v[4].ckpt[0] == 6 &&
			 v[4].anchor_pos == 6 && !memcmp(v[4].tokens, A, sizeof A));
		/* A view pins its object: the entry cannot be evicted under the
		 * writer, and the views stay readable until released. */
		kc_cache_clear(t.c);
		{
			struct kc_stats st;
			kc_cache_stats(t.c, &st);
			KT_EQ_INT(st.entries, 1);
		}
		for (int k = 0; k < 4; k++) {
			if (v[k].kind == KC_OBJ_BLOCK) {
				KT_CHECK(v[k].page && kv_page_refs(v[k].page) >= 1);
			} else {
				struct kv_h128 want = kc_rp_id(v[k].pos == 10 ? h1 : h0, A + (v[k].pos == 10 ? 8 : 4),
							       v[k].pos % 4);
				KT_CHECK(kv_h128_eq(v[k].id, want));
				KT_EQ_INT(v[k].snap_bytes, 24);
				uint8_t want_snap[24];
				tc_snap_bytes(&t.L, A, v[k].pos, want_snap);
				KT_CHECK(!memcmp(v[k].snap, want_snap, 24));
				KT_EQ_INT(v[k].tail_bytes, (v[k].pos % 4) * 16);
				KT_EQ_INT(v[k].anchor, v[k].pos == 6);
			}
		}
		for (size_t k = 0; k < n; k++)
			kc_cache_view_release(t.c, &v[k]);
		KT_OK(kc_cache_check(t.c));
		kc_cache_clear(t.c);
		{
			struct kc_stats st;
			kc_cache_stats(t.c, &st);
			KT_EQ_U64(st.bytes_in_use, 0); /* unpinned, now it all goes */
			KT_EQ_INT(kv_pages_in_use(t.pool), 0);
		}
		/* Loaded from disk: nothing is dirty, and it serves hits. */
		struct kv_page *pg[4];
		int np = tc_pages(t.pool, &t.L, A, 10, pg);
		struct kc_put p = {.tokens = A, .n = 10, .pages = pg, .snap = tc_snap(t.c, A, 10), .clean = 1};
		KT_OK(kc_cache_put(t.c, &p, NULL));
		for (int i = 0; i < np; i++)
			kv_page_unref(pg[i]);
		KT_EQ_INT(kc_cache_dirty_count(t.c), 0);
		int32_t q[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0};
		KT_EQ_INT(look(&t, q, 11).pos, 10);
		tc_close(&t);
	}
}

KT_CASE(put_rejects_bad_arguments_without_leaks)
{
	struct tc t;
	struct kv_page *pg[4];
	struct kc_stats st;
	uint64_t mem0;
	int np;
	KT_OK(tc_open(&t, 4, 1, 0, NULL));
	mem0 = kv_mem_used(KV_MEM_CACHE);
	np = tc_pages(t.pool, &t.L, A, 10, pg);
	struct kc_put_ckpt ck[2] = {{6, tc_snap(t.c, A, 6)}, {3, tc_snap(t.c, A, 3)}};
	struct kc_put p = {.tokens = A, .n = 10, .pages = pg, .snap = tc_snap(t.c, A, 10), .ckpt = ck, .n_ckpt = 2};
	KT_EQ_INT(kc_cache_put(t.c, &p, NULL), KV_ERR_INVALID); /* not ascending */
	KT_EQ_U64(kv_mem_used(KV_MEM_CACHE), mem0);            /* snapshots freed */
	struct kc_put_ckpt ck2[1] = {{6, tc_snap(t.c, A, 6)}};
	p = (struct kc_put){.tokens = A, .n = 10, .pages = pg, .snap = tc_snap(t.c, A, 10), .ckpt = ck2, .n_ckpt = 1,
			    .anchor = 5};
	KT_EQ_INT(kc_cache_put(t.c, &p, NULL), KV_ERR_INVALID); /* anchor not a checkpoint */
	p = (struct kc_put){.tokens = A, .n = 10, .pages = pg, .snap = NULL};
	KT_EQ_INT(kc_cache_put(t.c, &p, NULL), KV_ERR_INVALID); /* hybrid end without snapshot */
	struct kv_page *nopg[4] = {pg[0], NULL, NULL, NULL};
	p = (struct kc_put){.tokens = A, .n = 10, .pages = nopg, .snap = tc_snap(t.c, A, 10)};
	KT_EQ_INT(kc_cache_put(t.c, &p, NULL), KV_ERR_INVALID); /* new block without a page */
	p = (struct kc_put){.tokens = A, .n = 0, .pages = pg};
	KT_EQ_INT(kc_cache_put(t.c, &p, NULL), KV_ERR_INVALID);
	kc_cache_stats(t.c, &st);
	KT_EQ_INT(st.nodes + st.rps + st.entries, 0); /* nothing half-made stays */
	KT_EQ_U64(st.bytes_in_use, 0);
	KT_EQ_U64(kv_mem_used(KV_MEM_CACHE), mem0);
	KT_OK(kc_cache_check(t.c));
	for (int i = 0; i < np; i++)
		kv_page_unref(pg[i]);
	tc_close(&t);
}

KT_CASE(check_detects_broken_invariants)
{
	struct tc t;
	struct kc_hit h;
	KT_OK(tc_open(&t, 4, 0, 0, NULL));
	put(&t, A, 10, NULL, 0, 0);
	kc_cache_lookup(t.c, A, 10, &h);
	KT_REQUIRE(h.node_ != NULL);
	KT_OK(kc_cache_check(t.c));
	h.node_->through++;
	KT_EQ_INT(kc_cache_check(t.c), KV_ERR_CORRUPT);
	KT_CHECK(strstr(kv_errmsg(), "through") != NULL);
	h.node_->through--;
	h.node_->tokens[0] ^= 1; /* the chain hash no longer matches */
	KT_EQ_INT(kc_cache_check(t.c), KV_ERR_CORRUPT);
	KT_CHECK(strstr(kv_errmsg(), "hash") != NULL);
	h.node_->tokens[0] ^= 1;
	KT_OK(kc_cache_check(t.c));
	kc_hit_release(t.c, &h);
	tc_close(&t);
}

KT_CASE(namespace_and_latency)
{
	struct tc t;
	struct kc_stats st;
	struct kc_view v[4];
	KT_OK(tc_open(&t, 4, 0, 1, NULL));
	put(&t, A, 10, NULL, 0, 0);
	KT_REQUIRE(kc_cache_take_dirty(t.c, v, 1) == 1);
	/* h_0 = XXH3_128(namespace || block 0): another namespace, another name. */
	KT_CHECK(kv_h128_eq(v[0].id, kc_chain_hash((struct kv_h128){7, 9}, A, 4)));
	KT_CHECK(!kv_h128_eq(v[0].id, kc_chain_hash((struct kv_h128){7, 10}, A, 4)));
	kc_cache_view_release(t.c, &v[0]);
	for (int i = 0; i < 100; i++)
		look(&t, A, 10);
	kc_cache_stats(t.c, &st);
	KT_CHECK(st.lookup_p50_ms > 0 && st.lookup_p99_ms >= st.lookup_p50_ms && st.lookup_p99_ms < 100);
	int kind = -1;
	KT_OK(kc_index_parse("hash", &kind));
	KT_EQ_INT(kind, KC_INDEX_HASH);
	KT_EQ_INT(kc_index_parse("trie", &kind), KV_ERR_INVALID);
	KT_EQ_STR(kc_index_name(KC_INDEX_RADIX), "radix");
	tc_close(&t);
}

KT_MAIN(dense_lookup_rules, hybrid_lookup_needs_snapshots, anchor_is_recorded_and_inherited, pins_keep_data_alive,
	lru_order_and_leaves_first, mru_survives_pressure_below_cap, admission_evicts_before_no_room,
	admission_counts_only_memory_really_freed, prefill_projection, count_caps_and_disable,
	dirty_views_for_the_disk_tier, put_rejects_bad_arguments_without_leaks, check_detects_broken_invariants,
	namespace_and_latency)
