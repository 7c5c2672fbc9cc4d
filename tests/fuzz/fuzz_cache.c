/*
 * fuzz_cache.c - differential target for the prefix cache: one operation
 * stream (insert, lookup, evict, budget change, check) drives the radix
 * index, the hash index and a naive reference model that keeps whole
 * token sequences in an array and answers lookups by brute force. Every
 * lookup must give the same resume point and shared length in all three,
 * every restored byte must be what a cold run would hold, both caches must
 * evict the same entries, and their byte/node/dedup accounting must equal
 * the model's recomputation. Any difference aborts (a fuzzer crash).
 *
 * Input: byte 0 picks the shape (bit 0 hybrid, bits 1-2 the page size
 * 4/8/16/4); then each operation reads its bytes from the stream; a short
 * stream ends the run. tests/unit/test_cache_diff.c runs the same
 * function over random streams, and tests/fuzz/corpus/cache holds seeds.
 */
#include "../unit/test_cache_util.h"
#include "base/err.h"
#include "base/log.h"
#include "cache/cache.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DF_MAXL 96       /* tokens per sequence */
#define DF_SEQS 8        /* sequences kept to derive sharing prompts from */
#define DF_MAXOPS 600
#define DF_SNAP 16       /* snapshot bytes */

struct df_entry {
	uint64_t id;
	uint32_t n;
	int32_t tok[DF_MAXL];
	uint32_t snaps[KC_CKPT_HARD + 1]; /* snapshot positions: checkpoints + end (hybrid) */
	uint32_t n_snaps;
	int live;
};

struct df_evlog {
	uint64_t ids[256];
	uint32_t n;
	int overflow;
};

struct df {
	const uint8_t *p;
	size_t n, i;
	struct ke_layout L;
	uint32_t B;
	int hybrid;
	struct kv_pages *pool;
	struct kc_cache *c[2];
	struct df_evlog ev[2];
	struct df_entry *e;
	size_t n_e, cap_e;
	int32_t seq[DF_SEQS][DF_MAXL];
	uint32_t seq_n[DF_SEQS];
	char *why;
	size_t why_len;
};

/* What the streams exercised, summed over runs (the unit test checks the
 * streams are not vacuous). */
static struct {
	uint64_t hits, misses, evictions, pressure, snaps, partial, lookups, puts, dedup;
} df_totals;

static int df_byte(struct df *d, uint8_t *b)
{
	if (d->i >= d->n)
		return 0;
	*b = d->p[d->i++];
	return 1;
}

static int df_fail(struct df *d, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(d->why, d->why_len, fmt, ap);
	va_end(ap);
	return 1;
}

static void df_on_evict(void *ctx, uint64_t id, uint32_t len)
{
	struct df_evlog *l = ctx;
	(void)len;
	if (l->n < sizeof l->ids / sizeof l->ids[0])
		l->ids[l->n++] = id;
	else
		l->overflow = 1;
}

/* Both caches must have evicted the same entries; the model follows. */
static int df_sync_evictions(struct df *d, const char *op)
{
	if (d->ev[0].overflow || d->ev[1].overflow)
		return df_fail(d, "%s: eviction log overflow", op);
	if (d->ev[0].n != d->ev[1].n || memcmp(d->ev[0].ids, d->ev[1].ids, d->ev[0].n * sizeof(uint64_t)))
		return df_fail(d, "%s: radix evicted %u entries, hash %u (or different ones)", op, d->ev[0].n,
			       d->ev[1].n);
	for (uint32_t k = 0; k < d->ev[0].n; k++) {
		size_t j;
		for (j = 0; j < d->n_e; j++)
			if (d->e[j].live && d->e[j].id == d->ev[0].ids[k])
				break;
		if (j == d->n_e)
			return df_fail(d, "%s: evicted unknown entry %llu", op, (unsigned long long)d->ev[0].ids[k]);
		d->e[j].live = 0;
	}
	d->ev[0].n = d->ev[1].n = 0;
	return 0;
}

static uint32_t lcp(const int32_t *a, uint32_t an, const int32_t *b, uint32_t bn)
{
	uint32_t i = 0, m = an < bn ? an : bn;
	while (i < m && a[i] == b[i])
		i++;
	return i;
}

/* The reference answer: shared = longest common prefix with any stored
 * sequence; dense resume = min(shared, n - 1); hybrid resume = the largest
 * snapshot position p <= n - 1 of an entry sharing at least p tokens. */
static void df_naive(const struct df *d, const int32_t *tok, uint32_t n, uint32_t *shared, uint32_t *pos)
{
	*shared = 0;
	*pos = 0;
	for (size_t j = 0; j < d->n_e; j++) {
		const struct df_entry *e = &d->e[j];
		uint32_t l;
		if (!e->live)
			continue;
		l = lcp(tok, n, e->tok, e->n);
		if (l > *shared)
			*shared = l;
		if (d->hybrid)
			for (uint32_t k = 0; k < e->n_snaps; k++)
				if (e->snaps[k] <= l && e->snaps[k] <= n - 1 && e->snaps[k] > *pos)
					*pos = e->snaps[k];
	}
	if (!d->hybrid && n)
		*pos = *shared < n - 1 ? *shared : n - 1;
}

static int same_prefix(const struct df_entry *a, const struct df_entry *b, uint32_t len)
{
	return a->n >= len && b->n >= len && !memcmp(a->tok, b->tok, len * sizeof(int32_t));
}

/* Recompute the accounting from the model and compare with both caches. */
static int df_check(struct df *d, const char *op)
{
	uint64_t nodes = 0, rps = 0, bytes = 0, dedup = 0, entries = 0;
	uint64_t nb = kc_policy_node_bytes(&d->L);
	struct kc_stats st[2];

	for (size_t j = 0; j < d->n_e; j++) {
		const struct df_entry *e = &d->e[j];
		if (!e->live)
			continue;
		entries++;
		for (uint32_t k = 1; k <= e->n / d->B; k++) {
			uint32_t len = k * d->B, through = 0;
			size_t q;
			for (q = 0; q < j; q++)
				if (d->e[q].live && same_prefix(&d->e[q], e, len))
					break;
			if (q < j)
				continue; /* counted with an earlier entry */
			for (q = j; q < d->n_e; q++)
				if (d->e[q].live && same_prefix(&d->e[q], e, len))
					through++;
			nodes++;
			bytes += nb;
			dedup += (uint64_t)(through - 1) * d->L.page_bytes;
		}
		for (uint32_t k = 0; k < e->n_snaps; k++) {
			uint32_t s = e->snaps[k];
			int seen = 0;
			for (size_t q = 0; q <= j && !seen; q++) {
				const struct df_entry *o = &d->e[q];
				if (!o->live || !same_prefix(o, e, s))
					continue;
				for (uint32_t r = 0; r < o->n_snaps && !seen; r++)
					if (o->snaps[r] == s && (q < j || r < k))
						seen = 1;
			}
			if (seen)
				continue;
			rps++;
			bytes += kc_policy_rp_bytes(&d->L, s % d->B, d->hybrid);
		}
	}
	for (int k = 0; k < 2; k++) {
		if (kc_cache_check(d->c[k]) != KV_OK)
			return df_fail(d, "%s: %s check: %s", op, k ? "hash" : "radix", kv_errmsg());
		kc_cache_stats(d->c[k], &st[k]);
		if (st[k].bytes_in_use != bytes || st[k].nodes != nodes || st[k].rps != rps ||
		    st[k].entries != entries || st[k].dedup_bytes_saved != dedup ||
		    st[k].snapshots != (d->hybrid ? rps : 0))
			return df_fail(d,
				       "%s: %s accounting: bytes %llu/%llu nodes %llu/%llu rps %llu/%llu "
				       "entries %llu/%llu dedup %llu/%llu",
				       op, k ? "hash" : "radix", (unsigned long long)st[k].bytes_in_use,
				       (unsigned long long)bytes, (unsigned long long)st[k].nodes,
				       (unsigned long long)nodes, (unsigned long long)st[k].rps, (unsigned long long)rps,
				       (unsigned long long)st[k].entries, (unsigned long long)entries,
				       (unsigned long long)st[k].dedup_bytes_saved, (unsigned long long)dedup);
	}
	return 0;
}

static int df_insert(struct df *d)
{
	uint8_t b0, b1, b2, b3, bt;
	struct df_entry ne;
	struct kv_page *pg[DF_MAXL];
	struct kc_put_ckpt ck[2][4];
	uint32_t n_ck = 0, anchor = 0;
	int np, rc[2];
	uint64_t id[2];
	uint32_t src, keep, add;

	if (!df_byte(d, &b0) || !df_byte(d, &b1) || !df_byte(d, &b2) || !df_byte(d, &b3))
		return -1;
	memset(&ne, 0, sizeof ne);
	src = b0 % DF_SEQS;
	keep = d->seq_n[src] ? b1 % (d->seq_n[src] + 1) : 0;
	add = 1 + b2 % 24;
	if (keep + add > DF_MAXL)
		add = DF_MAXL - keep;
	memcpy(ne.tok, d->seq[src], keep * sizeof(int32_t));
	for (uint32_t i = 0; i < add; i++) {
		if (!df_byte(d, &bt))
			bt = (uint8_t)i;
		/* A small alphabet makes shared prefixes and partial blocks common. */
		ne.tok[keep + i] = bt & 0x80 ? (int32_t)bt : (int32_t)(bt % 4);
	}
	ne.n = keep + add;
	memcpy(d->seq[b3 % DF_SEQS], ne.tok, ne.n * sizeof(int32_t));
	d->seq_n[b3 % DF_SEQS] = ne.n;
	if (d->hybrid) {
		uint32_t want = b3 >> 5, last = 0; /* 0..7, at most 4 used */
		for (uint32_t k = 0; k < want && n_ck < 4; k++) {
			uint8_t bp;
			uint32_t pos;
			if (!df_byte(d, &bp))
				break;
			pos = last + 1 + bp % 16;
			if (pos >= ne.n)
				break;
			ck[0][n_ck].pos = ck[1][n_ck].pos = pos;
			ne.snaps[ne.n_snaps++] = pos;
			last = pos;
			n_ck++;
		}
		if (n_ck && (b2 & 0x80))
			anchor = ck[0][(b2 >> 3) % n_ck].pos;
	}
	np = tc_pages(d->pool, &d->L, ne.tok, ne.n, pg);
	if (np < 0)
		return df_fail(d, "insert: no pages: %s", kv_errmsg());
	for (int k = 0; k < 2; k++) {
		struct kc_put put = {.tokens = ne.tok, .n = ne.n, .pages = pg, .anchor = anchor};
		for (uint32_t q = 0; q < n_ck; q++)
			ck[k][q].snap = tc_snap(d->c[k], ne.tok, ck[k][q].pos);
		put.ckpt = ck[k];
		put.n_ckpt = n_ck;
		put.snap = d->hybrid ? tc_snap(d->c[k], ne.tok, ne.n) : NULL;
		rc[k] = kc_cache_put(d->c[k], &put, &id[k]);
	}
	for (int i = 0; i < np; i++)
		kv_page_unref(pg[i]);
	if (rc[0] || rc[1])
		return df_fail(d, "insert: put failed %d/%d: %s", rc[0], rc[1], kv_errmsg());
	if (id[0] != id[1])
		return df_fail(d, "insert: ids differ %llu/%llu", (unsigned long long)id[0], (unsigned long long)id[1]);
	if (d->hybrid)
		ne.snaps[ne.n_snaps++] = ne.n;
	else
		ne.snaps[0] = ne.n, ne.n_snaps = 1;
	/* A sequence already stored keeps its entry (made most recent). */
	for (size_t j = 0; j < d->n_e; j++)
		if (d->e[j].live && d->e[j].n == ne.n && !memcmp(d->e[j].tok, ne.tok, ne.n * sizeof(int32_t))) {
			if (d->e[j].id != id[0])
				return df_fail(d, "insert: duplicate got id %llu, model has %llu",
					       (unsigned long long)id[0], (unsigned long long)d->e[j].id);
			return df_sync_evictions(d, "insert");
		}
	if (d->n_e == d->cap_e) {
		size_t cap = d->cap_e ? d->cap_e * 2 : 64;
		struct df_entry *v = realloc(d->e, cap * sizeof *v);
		if (!v)
			return df_fail(d, "insert: out of memory");
		d->e = v;
		d->cap_e = cap;
	}
	ne.id = id[0];
	ne.live = 1;
	d->e[d->n_e++] = ne;
	return df_sync_evictions(d, "insert");
}

static int df_lookup(struct df *d)
{
	uint8_t b0, b1, b2, bt;
	int32_t tok[DF_MAXL + 16];
	uint32_t n, src, keep, add, shared, pos;
	struct kc_hit h[2];

	if (!df_byte(d, &b0) || !df_byte(d, &b1) || !df_byte(d, &b2))
		return -1;
	src = b0 % DF_SEQS;
	keep = d->seq_n[src] ? b1 % (d->seq_n[src] + 1) : 0;
	add = b2 % 9;
	memcpy(tok, d->seq[src], keep * sizeof(int32_t));
	for (uint32_t i = 0; i < add; i++) {
		if (!df_byte(d, &bt))
			bt = 0;
		tok[keep + i] = bt & 0x80 ? (int32_t)bt : (int32_t)(bt % 4);
	}
	n = keep + add;
	if (!n)
		return 0;
	df_naive(d, tok, n, &shared, &pos);
	for (int k = 0; k < 2; k++) {
		uint32_t bad;
		if (kc_cache_lookup(d->c[k], tok, n, &h[k]) != KV_OK)
			return df_fail(d, "lookup failed: %s", kv_errmsg());
		bad = tc_verify_hit(d->c[k], &h[k], tok);
		if (bad) {
			kc_hit_release(d->c[0], &h[0]);
			if (k)
				kc_hit_release(d->c[1], &h[1]);
			return df_fail(d, "lookup n=%u: %s restored wrong bytes at position %u", n, k ? "hash" : "radix",
				       bad - 1);
		}
	}
	if (h[0].tail_rows)
		df_totals.partial++;
	kc_hit_release(d->c[0], &h[0]);
	kc_hit_release(d->c[1], &h[1]);
	if (h[0].pos != pos || h[1].pos != pos || h[0].shared != shared || h[1].shared != shared)
		return df_fail(d, "lookup n=%u: resume radix %u hash %u model %u; shared radix %u hash %u model %u", n,
			       h[0].pos, h[1].pos, pos, h[0].shared, h[1].shared, shared);
	if (h[0].n_inh != h[1].n_inh || h[0].anchor != h[1].anchor ||
	    memcmp(h[0].inh, h[1].inh, h[0].n_inh * sizeof h[0].inh[0]))
		return df_fail(d, "lookup n=%u: inherited checkpoints differ between indexes", n);
	/* Releasing a hit enforces limits again (the MRU entry may have
	 * changed), so evictions can happen here too. */
	return df_sync_evictions(d, "lookup");
}

static int df_evict(struct df *d)
{
	int rc0 = kc_cache_evict_lru(d->c[0], NULL), rc1 = kc_cache_evict_lru(d->c[1], NULL);
	if (rc0 != rc1)
		return df_fail(d, "evict: rc %d/%d", rc0, rc1);
	return df_sync_evictions(d, "evict");
}

static int df_budget(struct df *d)
{
	uint8_t b;
	uint64_t bytes;
	if (!df_byte(d, &b))
		return -1;
	bytes = b < 32 ? 0 : (uint64_t)b * (kc_policy_node_bytes(&d->L) / 4);
	kc_cache_set_budget(d->c[0], bytes);
	kc_cache_set_budget(d->c[1], bytes);
	return df_sync_evictions(d, "budget");
}

/* 0 when all three agree on the whole stream; else 1 with *why set. */
static int cache_diff_run(const uint8_t *data, size_t size, char *why, size_t why_len)
{
	struct df d;
	uint8_t cfg, op;
	int rc = 0, ops = 0;
	static const uint32_t Bs[4] = {4, 8, 16, 4};

	memset(&d, 0, sizeof d);
	d.p = data;
	d.n = size;
	d.why = why;
	d.why_len = why_len;
	why[0] = 0;
	if (!df_byte(&d, &cfg))
		return 0;
	d.hybrid = cfg & 1;
	d.B = Bs[(cfg >> 1) & 3];
	tc_layout(&d.L, (int)d.B, d.hybrid, DF_SNAP);
	d.pool = kv_pages_create(d.L.page_bytes, 0, 64);
	for (int k = 0; k < 2 && d.pool; k++) {
		struct kc_policy pol;
		struct kc_params p = {
			.layout = &d.L,
			.ns = {0x1111, 0x2222},
			.index = k ? KC_INDEX_HASH : KC_INDEX_RADIX,
			.max_hybrid_entries = 1000,
			.policy = &pol,
			.on_evict = df_on_evict,
			.evict_ctx = &d.ev[k],
		};
		kc_policy_default(&pol, d.hybrid);
		if (kc_cache_create(&p, &d.c[k]) != KV_OK) {
			rc = df_fail(&d, "create: %s", kv_errmsg());
			goto out;
		}
	}
	if (!d.pool) {
		rc = df_fail(&d, "no page pool");
		goto out;
	}
	while (!rc && ops++ < DF_MAXOPS && df_byte(&d, &op)) {
		int r;
		switch (op % 8) {
		case 0: case 1: case 2: r = df_insert(&d); break;
		case 3: case 4: case 5: r = df_lookup(&d); break;
		case 6: r = df_evict(&d); break;
		default: r = op & 0x80 ? df_check(&d, "check") : df_budget(&d); break;
		}
		if (r < 0)
			break; /* stream ended inside an operation */
		rc = r;
	}
	if (!rc)
		rc = df_check(&d, "final");
	if (!rc) {
		struct kc_stats st;
		kc_cache_stats(d.c[0], &st);
		df_totals.hits += st.hits;
		df_totals.misses += st.misses;
		df_totals.evictions += st.evictions;
		df_totals.pressure += st.pressure_evictions;
		df_totals.snaps += st.snaps;
		df_totals.lookups += st.lookups;
		df_totals.puts += st.stores;
		df_totals.dedup += st.dedup_bytes_saved ? 1 : 0;
	}
out:
	kc_cache_destroy(d.c[0]);
	kc_cache_destroy(d.c[1]);
	if (d.pool && kv_pages_in_use(d.pool) && !rc)
		rc = df_fail(&d, "%zu pages leaked", kv_pages_in_use(d.pool));
	if (d.pool && !kv_pages_in_use(d.pool))
		kv_pages_destroy(d.pool);
	free(d.e);
	return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char why[512];
	static int quiet;
	if (!quiet) {
		kv_log_set_level(KV_LOG_ERROR); /* the snap log line is info */
		quiet = 1;
	}
	if (cache_diff_run(data, size, why, sizeof why)) {
		fprintf(stderr, "fuzz_cache: %s\n", why);
		abort();
	}
	return 0;
}
