/*
 * test_cache_diff.c - the differential test of the prefix cache: radix
 * index, hash index and a naive reference model driven by one random
 * operation stream (insert, lookup, evict, budget change, check) must give
 * the same answer to every lookup. The stream interpreter is the libFuzzer
 * target tests/fuzz/fuzz_cache.c, included here so both run the same code.
 */
#include "kt.h"
#include "base/err.h"
#include "base/log.h"

#include "../fuzz/fuzz_cache.c"

/* Random streams: each case is many streams of one page size / family. */
static void run_streams(int hybrid, int b_sel, int n_streams, uint64_t seed)
{
	uint8_t buf[1200];
	char why[512];
	kv_log_set_level(KV_LOG_ERROR);
	for (int s = 0; s < n_streams; s++) {
		size_t len = 200 + kt_rand(&seed) % (sizeof buf - 200);
		for (size_t i = 0; i < len; i++)
			buf[i] = (uint8_t)kt_rand(&seed);
		buf[0] = (uint8_t)((hybrid ? 1 : 0) | (b_sel << 1) | (buf[0] & 0xf8));
		if (cache_diff_run(buf, len, why, sizeof why)) {
			KT_CHECKF(0, "stream %d (seed %llu): %s", s, (unsigned long long)seed, why);
			return;
		}
	}
}

/* Each family must really have hit, missed, restored partial blocks,
 * shared blocks, evicted (by hand and under budget pressure) and, for
 * hybrid models, snapped below the shared prefix. */
static void check_coverage(int hybrid)
{
	fprintf(stderr, "lookups %llu hits %llu misses %llu partial %llu evictions %llu pressure %llu snaps %llu\n",
		(unsigned long long)df_totals.lookups, (unsigned long long)df_totals.hits,
		(unsigned long long)df_totals.misses, (unsigned long long)df_totals.partial,
		(unsigned long long)df_totals.evictions, (unsigned long long)df_totals.pressure,
		(unsigned long long)df_totals.snaps);
	KT_CHECKF(df_totals.hits > 100 && df_totals.misses > 10, "hits %llu misses %llu",
		  (unsigned long long)df_totals.hits, (unsigned long long)df_totals.misses);
	KT_CHECKF(df_totals.partial > 20, "partial-block hits %llu", (unsigned long long)df_totals.partial);
	KT_CHECKF(df_totals.evictions > 50 && df_totals.pressure > 10, "evictions %llu pressure %llu",
		  (unsigned long long)df_totals.evictions, (unsigned long long)df_totals.pressure);
	KT_CHECKF(df_totals.dedup > 10, "runs with shared blocks %llu", (unsigned long long)df_totals.dedup);
	if (hybrid)
		KT_CHECKF(df_totals.snaps > 50, "snapped lookups %llu", (unsigned long long)df_totals.snaps);
	memset(&df_totals, 0, sizeof df_totals);
}

KT_CASE(diff_dense_b4) { run_streams(0, 0, 150, 11); check_coverage(0); }
KT_CASE(diff_dense_b8) { run_streams(0, 1, 150, 12); check_coverage(0); }
KT_CASE(diff_dense_b16) { run_streams(0, 2, 100, 13); check_coverage(0); }
KT_CASE(diff_hybrid_b4) { run_streams(1, 0, 150, 21); check_coverage(1); }
KT_CASE(diff_hybrid_b8) { run_streams(1, 1, 150, 22); check_coverage(1); }
KT_CASE(diff_hybrid_b16) { run_streams(1, 2, 100, 23); check_coverage(1); }

/* The differential itself must be able to fail: a model that forgets an
 * entry disagrees with the caches. */
KT_CASE(diff_detects_a_wrong_model)
{
	uint8_t s[] = {0, /* dense, B = 4 */
		       0, 0, 0, 9, 1, 2, 3, 1, 2, 3, 0, 1, 2, 3, /* insert 10 tokens into seq 0 (roughly) */
		       3, 1, 200, 0}; /* lookup a prefix of seq 1 (written by the insert) */
	struct df d;
	char why[256];
	/* Run the stream once normally: it must pass. */
	KT_CHECKF(cache_diff_run(s, sizeof s, why, sizeof why) == 0, "%s", why);
	/* Then by hand: insert, kill the model's entry, look up -> mismatch. */
	memset(&d, 0, sizeof d);
	d.why = why;
	d.why_len = sizeof why;
	d.B = 4;
	tc_layout(&d.L, 4, 0, 0);
	d.pool = kv_pages_create(d.L.page_bytes, 0, 0);
	for (int k = 0; k < 2; k++) {
		struct kc_params p = {.layout = &d.L, .index = k, .on_evict = df_on_evict, .evict_ctx = &d.ev[k]};
		KT_OK(kc_cache_create(&p, &d.c[k]));
	}
	d.p = s + 1;
	d.n = sizeof s - 1;
	KT_CHECK(df_byte(&d, &(uint8_t){0}) && df_insert(&d) == 0);
	KT_REQUIRE(d.n_e == 1);
	d.e[0].live = 0;
	d.i = 15;
	KT_CHECK(df_lookup(&d) == 1);
	KT_CHECK(strstr(why, "model 0") != NULL);
	kc_cache_destroy(d.c[0]);
	kc_cache_destroy(d.c[1]);
	KT_EQ_INT(kv_pages_in_use(d.pool), 0);
	kv_pages_destroy(d.pool);
	free(d.e);
}

KT_MAIN(diff_dense_b4, diff_dense_b8, diff_dense_b16, diff_hybrid_b4, diff_hybrid_b8, diff_hybrid_b16,
	diff_detects_a_wrong_model)
