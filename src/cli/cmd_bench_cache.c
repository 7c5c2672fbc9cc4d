/*
 * cmd_bench_cache.c - `kvkeep bench cache`: speed and memory of the RAM
 * prefix cache. A benchmark, not a test: it asserts nothing (targets are
 * printed next to the numbers).
 *
 *   kvkeep bench cache [--json] [--entries N] [--prompt N] [--queries N]
 *       [--restore-tokens N] [--model DIR | --no-engine] [--transient-tokens N]
 *
 * Sections, all in one run:
 *   lookup     --entries (1000) entries sharing prefixes (20 system prompts
 *              of 8-16K tokens; each entry continues a system prompt or cuts
 *              an earlier entry at a random point past its middle, then adds
 *              512-8192 new tokens, up to 32K), synthetic layout (B = 256).
 *              --queries lookups of a --prompt (32,768) token prompt sharing
 *              the first 3/4 or more of a random entry; p50/p99 of lookup +
 *              release, for the radix and the hash index. Target: p99 < 1 ms.
 *   memory     20 agent sessions of 3 turns (200-2000 tokens each) on 6
 *              system prompts of 8-24K tokens, a third of them branching
 *              from an earlier turn, layout of 8 KiB of KV per token
 *              (bench-dense), B = 256: accounted bytes / (distinct cached
 *              token positions x
 *              KV bytes per token), the distinct positions counted here
 *              independently (sorted sequences, sum of len - LCP with the
 *              previous). Also with the bookkeeping structs. Target 1.02.
 *   restore    a hybrid resume point of --restore-tokens (16,384) + 100
 *              tokens: engine = lookup + ke_seq_resume (64 shared pages, the
 *              tail rows, the snapshot) + release, on the bench-hybrid
 *              model (9B DeltaNet heads: 12.6 MiB of recurrent state),
 *              against one memcpy of the same snapshot bytes into a warm
 *              buffer, medians of 21. Synthetic = the cache's part alone
 *              (lookup, page list, tail copy into a page, snapshot memcpy).
 *              Target: within 1.5x.
 *   transient  a cold prefill of --transient-tokens (2048) tokens on
 *              bench-hybrid: peak memory growth (VmHWM after resetting it,
 *              and the engine's scratch accounting) beyond the prompt's KV
 *              and the recurrent state, per byte of prompt KV: the factor
 *              of the hybrid prefill projection (docs/cache.md).
 * Without --model, the engine sections write bench-hybrid into a temporary
 * folder first (kv_synth_write); --no-engine skips them.
 */
#include "base/clock.h"
#include "base/env.h"
#include "base/err.h"
#include "base/io.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/pages.h"
#include "cache/cache.h"
#include "cli/cli.h"
#include "engine/model.h"
#include "engine/seq.h"
#include "model/safetensors.h"
#include "model/synth.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd64(void)
{
	uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint32_t rnd(uint32_t lo, uint32_t hi)
{
	return lo + (uint32_t)(rnd64() % ((uint64_t)hi - lo + 1));
}

static void rand_tokens(int32_t *t, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = (int32_t)rnd(10, 150000);
}

static void layout_dense(struct ke_layout *L, int B, int n_attn, int heads, int dim, int elem)
{
	memset(L, 0, sizeof *L);
	L->page_tokens = B;
	L->kv_dtype = elem == 2 ? KV_DT_BF16 : KV_DT_F32;
	L->n_attn_layers = n_attn;
	L->n_kv_heads = heads;
	L->head_dim = dim;
	L->n_segments = n_attn * 2 * heads;
	L->row_bytes = (size_t)dim * (size_t)elem;
	L->page_bytes = (size_t)L->n_segments * (size_t)B * L->row_bytes;
	L->kv_bytes_per_token = (size_t)L->n_segments * L->row_bytes;
}

/* Store tok[0..n): a fresh page per block (pages already held by the cache
 * are dropped right after, as a live sequence's would be). */
static int store(struct kc_cache *const *cs, int n_caches, struct kv_pages *pool, const int32_t *tok, uint32_t n,
		 uint32_t B, void *snap_src, size_t snap_bytes, uint64_t *id)
{
	uint32_t np = (n + B - 1) / B;
	struct kv_page **pg = calloc(np, sizeof *pg);
	int rc = KV_OK;
	if (!pg)
		return KV_ERR_NOMEM;
	for (uint32_t i = 0; i < np && !rc; i++)
		if (!(pg[i] = kv_page_alloc(pool)))
			rc = KV_ERR_NOMEM;
	for (int k = 0; k < n_caches && !rc; k++) {
		void *snap = NULL;
		if (snap_bytes) {
			snap = kc_cache_snap_alloc(cs[k]);
			if (snap)
				memcpy(snap, snap_src, snap_bytes);
		}
		struct kc_put p = {.tokens = tok, .n = n, .pages = pg, .snap = snap};
		rc = kc_cache_put(cs[k], &p, id);
	}
	for (uint32_t i = 0; i < np; i++)
		kv_page_unref(pg[i]);
	free(pg);
	return rc;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double q)
{
	qsort(v, n, sizeof *v, cmp_double);
	return v[(size_t)((double)(n - 1) * q)];
}

/* --- lookup ------------------------------------------------------------------ */

struct lookup_res {
	double p50[2], p99[2];
	uint64_t nodes, entries, avg_resume;
};

static int bench_lookup(uint32_t n_entries, uint32_t prompt, uint32_t queries, struct lookup_res *res)
{
	struct ke_layout L;
	struct kv_pages *pool;
	struct kc_cache *cs[2] = {NULL, NULL};
	int32_t **seq = calloc(n_entries, sizeof *seq), *q = malloc(((size_t)prompt + 1) * sizeof *q);
	uint32_t *len = calloc(n_entries, sizeof *len);
	int32_t *sys[20];
	uint32_t sys_n[20];
	double *lat = malloc((size_t)queries * sizeof *lat);
	uint64_t resumed = 0;
	int rc = KV_OK;

	layout_dense(&L, 256, 1, 1, 2, 2); /* 8 bytes of KV per token: the index is what is measured */
	pool = kv_pages_create(L.page_bytes, 0, 64);
	if (!seq || !q || !len || !lat || !pool)
		return kv_fail(KV_ERR_NOMEM, "bench lookup: allocation");
	for (int k = 0; k < 2 && !rc; k++) {
		struct kc_params p = {.layout = &L, .index = k, .ns = {3, 4}};
		rc = kc_cache_create(&p, &cs[k]);
	}
	for (int s = 0; s < 20 && !rc; s++) {
		sys_n[s] = rnd(8192, 16384);
		sys[s] = malloc(sys_n[s] * sizeof(int32_t));
		if (!sys[s])
			return kv_fail(KV_ERR_NOMEM, "bench lookup: allocation");
		rand_tokens(sys[s], sys_n[s]);
	}
	for (uint32_t e = 0; e < n_entries && !rc; e++) {
		uint32_t keep, add;
		const int32_t *base;
		seq[e] = malloc(32768 * sizeof(int32_t));
		if (!seq[e])
			return kv_fail(KV_ERR_NOMEM, "bench lookup: allocation");
		if (e && rnd(0, 1)) {
			uint32_t from = rnd(0, e - 1);
			base = seq[from];
			keep = rnd(len[from] / 2, len[from]);
		} else {
			uint32_t s = rnd(0, 19);
			base = sys[s];
			keep = sys_n[s];
		}
		memcpy(seq[e], base, keep * sizeof(int32_t));
		add = rnd(512, 8192);
		if (keep + add > 32768)
			add = 32768 - keep;
		rand_tokens(seq[e] + keep, add);
		len[e] = keep + add;
		rc = store(cs, 2, pool, seq[e], len[e], 256, NULL, 0, NULL);
	}
	for (int k = 0; k < 2 && !rc; k++) {
		uint64_t s2 = g_rng;
		g_rng = 12345; /* the same queries for both indexes */
		for (uint32_t i = 0; i < queries; i++) {
			struct kc_hit h;
			uint32_t e = rnd(0, n_entries - 1);
			uint32_t keep = rnd(len[e] / 4 * 3, len[e]);
			uint64_t t0;
			memcpy(q, seq[e], keep * sizeof *q);
			rand_tokens(q + keep, prompt - keep);
			t0 = kv_now_ns();
			kc_cache_lookup(cs[k], q, prompt, &h);
			kc_hit_release(cs[k], &h);
			lat[i] = (double)(kv_now_ns() - t0) / 1e6;
			if (!k)
				resumed += h.pos;
		}
		res->p50[k] = pct(lat, queries, 0.50);
		res->p99[k] = pct(lat, queries, 0.99);
		g_rng = s2;
	}
	if (!rc) {
		struct kc_stats st;
		kc_cache_stats(cs[0], &st);
		res->nodes = st.nodes;
		res->entries = st.entries;
		res->avg_resume = queries ? resumed / queries : 0;
	}
	for (int k = 0; k < 2; k++)
		kc_cache_destroy(cs[k]);
	for (uint32_t e = 0; e < n_entries; e++)
		free(seq[e]);
	for (int s = 0; s < 20; s++)
		free(sys[s]);
	free(seq);
	free(len);
	free(q);
	free(lat);
	if (!kv_pages_in_use(pool))
		kv_pages_destroy(pool);
	return rc;
}

/* --- memory ---------------------------------------------------------------------- */

struct mem_seq {
	int32_t *tok;
	uint32_t n;
	uint64_t id;
	int live;
};

struct mem_ctx {
	struct mem_seq *v;
	uint32_t n;
};

static void mem_on_evict(void *ctx, uint64_t id, uint32_t l)
{
	struct mem_ctx *m = ctx;
	(void)l;
	for (uint32_t i = 0; i < m->n; i++)
		if (m->v[i].id == id)
			m->v[i].live = 0;
}

static struct mem_seq *g_sort_v;
static int cmp_seq(const void *a, const void *b)
{
	const struct mem_seq *x = &g_sort_v[*(const uint32_t *)a], *y = &g_sort_v[*(const uint32_t *)b];
	uint32_t m = x->n < y->n ? x->n : y->n;
	for (uint32_t i = 0; i < m; i++)
		if (x->tok[i] != y->tok[i])
			return x->tok[i] < y->tok[i] ? -1 : 1;
	return x->n < y->n ? -1 : x->n > y->n;
}

struct mem_res {
	double ratio, ratio_structs;
	uint64_t distinct, bytes, dedup, entries, superseded;
};

static int bench_memory(struct mem_res *res)
{
	struct ke_layout L;
	struct kv_pages *pool;
	struct kc_cache *c = NULL;
	struct mem_ctx mc = {0};
	struct kc_stats st;
	int32_t *sys[6];
	uint32_t sys_n[6], *ord, k = 0;
	int rc;

	layout_dense(&L, 256, 8, 2, 128, 2); /* bench-dense: 8 KiB per token */
	pool = kv_pages_create(L.page_bytes, 0, 16);
	mc.v = calloc(64, sizeof *mc.v);
	ord = calloc(64, sizeof *ord);
	/* Agent-sized: system + tools of 8-24K tokens shared by sessions,
	 * turns of 200-2000 tokens. Pages are never written (only the tails
	 * copy rows), so the 8 KiB/token geometry costs address space, not
	 * RAM. */
	if (!pool || !mc.v || !ord)
		return kv_fail(KV_ERR_NOMEM, "bench memory: allocation");
	struct kc_params p = {.layout = &L, .on_evict = mem_on_evict, .evict_ctx = &mc};
	if ((rc = kc_cache_create(&p, &c)))
		return rc;
	for (int s = 0; s < 6; s++) {
		sys_n[s] = rnd(8192, 24576);
		sys[s] = malloc(sys_n[s] * sizeof(int32_t));
		rand_tokens(sys[s], sys_n[s]);
	}
	/* 20 sessions of 3 turns (each turn extends the last, a dense cache
	 * keeps the newest), some branching from an earlier session. */
	for (int s = 0; s < 20 && !rc; s++) {
		int32_t *cur = malloc(32768 * sizeof(int32_t));
		uint32_t n;
		if (s && rnd(0, 2) == 0) {
			struct mem_seq *b = &mc.v[rnd(0, mc.n - 1)];
			n = rnd(b->n / 2, b->n);
			memcpy(cur, b->tok, n * sizeof *cur);
		} else {
			uint32_t w = rnd(0, 5);
			n = sys_n[w];
			memcpy(cur, sys[w], n * sizeof *cur);
		}
		for (int t = 0; t < 3 && !rc; t++) {
			uint32_t add = rnd(200, 2000);
			struct mem_seq *e = &mc.v[mc.n];
			rand_tokens(cur + n, add);
			n += add;
			e->tok = malloc(n * sizeof(int32_t));
			memcpy(e->tok, cur, n * sizeof(int32_t));
			e->n = n;
			e->live = 1;
			mc.n++;
			rc = store(&c, 1, pool, cur, n, 256, NULL, 0, &e->id);
		}
		free(cur);
	}
	/* Distinct positions: sort the live sequences; each adds its length
	 * minus the prefix it shares with its predecessor. */
	for (uint32_t i = 0; i < mc.n; i++)
		if (mc.v[i].live)
			ord[k++] = i;
	g_sort_v = mc.v;
	qsort(ord, k, sizeof *ord, cmp_seq);
	res->distinct = 0;
	for (uint32_t i = 0; i < k; i++) {
		const struct mem_seq *x = &mc.v[ord[i]];
		uint32_t l = 0;
		if (i) {
			const struct mem_seq *y = &mc.v[ord[i - 1]];
			uint32_t m = x->n < y->n ? x->n : y->n;
			while (l < m && x->tok[l] == y->tok[l])
				l++;
		}
		res->distinct += x->n - l;
	}
	kc_cache_stats(c, &st);
	res->bytes = st.bytes_in_use;
	res->dedup = st.dedup_bytes_saved;
	res->entries = st.entries;
	res->superseded = st.superseded;
	res->ratio = (double)st.bytes_in_use / ((double)res->distinct * (double)L.kv_bytes_per_token);
	res->ratio_structs =
		(double)(st.bytes_in_use + kc_cache_struct_bytes(&st)) /
		((double)res->distinct * (double)L.kv_bytes_per_token);
	kc_cache_destroy(c);
	for (uint32_t i = 0; i < mc.n; i++)
		free(mc.v[i].tok);
	for (int s = 0; s < 6; s++)
		free(sys[s]);
	free(mc.v);
	free(ord);
	if (!kv_pages_in_use(pool))
		kv_pages_destroy(pool);
	return rc;
}

/* --- restore ------------------------------------------------------------------------- */

struct restore_res {
	double restore_ms, memcpy_ms, ratio, syn_ms, syn_ratio;
	double create_ms;        /* ke_seq_create + destroy of an empty sequence */
	double memcpy_fresh_ms;  /* malloc + memcpy + free of the snapshot bytes */
	double ratio_fresh;      /* restore vs memcpy into a fresh buffer */
	uint64_t snap_bytes, pages;
	uint32_t tokens;
	int engine;
};

#define REPS 21

/* The cache's own part: lookup, page list, tail rows into a page, the
 * snapshot into a warm recurrent buffer. */
static int bench_restore_synthetic(const struct ke_layout *L, uint32_t R, struct restore_res *res)
{
	struct kv_pages *pool = kv_pages_create(L->page_bytes, 0, 8);
	struct kc_cache *c = NULL;
	int32_t *tok = malloc(((size_t)R + 1) * sizeof *tok);
	uint8_t *snap = malloc(L->snapshot_bytes), *warm = malloc(L->snapshot_bytes);
	struct kv_page *tail = NULL, **pg = malloc(((size_t)R / (size_t)L->page_tokens + 2) * sizeof *pg);
	double t[REPS], m[REPS];
	int rc;
	if (!pool || !tok || !snap || !warm || !pg)
		return kv_fail(KV_ERR_NOMEM, "bench restore: allocation");
	struct kc_params p = {.layout = L, .max_hybrid_entries = 4};
	if ((rc = kc_cache_create(&p, &c)))
		return rc;
	rand_tokens(tok, R + 1);
	memset(snap, 0x5a, L->snapshot_bytes);
	memset(warm, 0, L->snapshot_bytes);
	rc = store(&c, 1, pool, tok, R, (uint32_t)L->page_tokens, snap, L->snapshot_bytes, NULL);
	tail = kv_page_alloc(pool);
	for (int i = 0; i < REPS && !rc; i++) {
		struct kc_hit h;
		uint64_t t0 = kv_now_ns();
		kc_cache_lookup(c, tok, R + 1, &h);
		kc_hit_pages(&h, pg);
		for (uint32_t k = 0; k < h.n_pages; k++)
			kv_page_ref(pg[k]); /* a sequence keeps its own references */
		kc_hit_copy_tail(c, &h, tail->data);
		memcpy(warm, h.snap, L->snapshot_bytes);
		for (uint32_t k = 0; k < h.n_pages; k++)
			kv_page_unref(pg[k]);
		kc_hit_release(c, &h);
		t[i] = (double)(kv_now_ns() - t0) / 1e6;
		if (h.pos != R)
			rc = kv_fail(KV_ERR_INVALID, "bench restore: resumed at %u, not %u", h.pos, R);
		t0 = kv_now_ns();
		memcpy(warm, snap, L->snapshot_bytes);
		m[i] = (double)(kv_now_ns() - t0) / 1e6;
	}
	res->syn_ms = pct(t, REPS, 0.5);
	res->memcpy_ms = pct(m, REPS, 0.5);
	res->syn_ratio = res->syn_ms / res->memcpy_ms;
	kv_page_unref(tail);
	kc_cache_destroy(c);
	free(tok);
	free(snap);
	free(warm);
	free(pg);
	if (!kv_pages_in_use(pool))
		kv_pages_destroy(pool);
	return rc;
}

/* Engine: the same resume point restored into a real sequence. */
static int bench_restore_engine(struct ke_model *m, uint32_t R, struct restore_res *res)
{
	const struct ke_layout *L = ke_model_layout(m);
	struct kv_pages *pool = ke_model_pages(m);
	struct kc_cache *c = NULL;
	int32_t *tok = malloc(((size_t)R + 1) * sizeof *tok);
	uint8_t *snap = malloc(L->snapshot_bytes), *warm = malloc(L->snapshot_bytes);
	struct kv_page **pg = malloc(((size_t)R / (size_t)L->page_tokens + 2) * sizeof *pg);
	double t[REPS], mm[REPS], cr[REPS], mf[REPS];
	int rc, V = ke_model_config(m)->vocab;
	if (!tok || !snap || !warm || !pg)
		return kv_fail(KV_ERR_NOMEM, "bench restore: allocation");
	struct kc_params p = {.layout = L, .max_hybrid_entries = 4};
	if ((rc = kc_cache_create(&p, &c)))
		return rc;
	for (uint32_t i = 0; i <= R; i++)
		tok[i] = (int32_t)rnd(10, (uint32_t)V - 1);
	memset(snap, 0x3c, L->snapshot_bytes);
	memset(warm, 0, L->snapshot_bytes);
	rc = store(&c, 1, pool, tok, R, (uint32_t)L->page_tokens, snap, L->snapshot_bytes, NULL);
	for (int i = 0; i < REPS && !rc; i++) {
		struct kc_hit h;
		struct ke_seq *s = NULL;
		uint64_t t0 = kv_now_ns();
		kc_cache_lookup(c, tok, R + 1, &h);
		kc_hit_pages(&h, pg);
		struct ke_resume rs = {.pos = (int)h.pos, .tokens = tok, .pages = pg, .tail = h.tail,
				       .tail_stride = (int)h.tail_stride, .snapshot = h.snap,
				       .snapshot_len = L->snapshot_bytes};
		rc = ke_seq_resume(m, NULL, &rs, &s);
		kc_hit_release(c, &h);
		t[i] = (double)(kv_now_ns() - t0) / 1e6;
		ke_seq_destroy(s);
		t0 = kv_now_ns();
		memcpy(warm, snap, L->snapshot_bytes);
		mm[i] = (double)(kv_now_ns() - t0) / 1e6;
		/* What a new sequence's buffers cost by themselves. */
		t0 = kv_now_ns();
		if (ke_seq_create(m, NULL, &s) == KV_OK)
			ke_seq_destroy(s);
		cr[i] = (double)(kv_now_ns() - t0) / 1e6;
		t0 = kv_now_ns();
		{
			uint8_t *fresh = malloc(L->snapshot_bytes);
			if (fresh) {
				memcpy(fresh, snap, L->snapshot_bytes);
				__asm__ volatile("" : : "r"(fresh) : "memory");
			}
			free(fresh);
		}
		mf[i] = (double)(kv_now_ns() - t0) / 1e6;
	}
	res->restore_ms = pct(t, REPS, 0.5);
	res->memcpy_ms = pct(mm, REPS, 0.5);
	res->ratio = res->restore_ms / res->memcpy_ms;
	res->create_ms = pct(cr, REPS, 0.5);
	res->memcpy_fresh_ms = pct(mf, REPS, 0.5);
	res->ratio_fresh = res->restore_ms / res->memcpy_fresh_ms;
	res->snap_bytes = L->snapshot_bytes;
	res->pages = R / (uint32_t)L->page_tokens;
	res->tokens = R;
	res->engine = 1;
	kc_cache_destroy(c);
	free(tok);
	free(snap);
	free(warm);
	free(pg);
	return rc;
}

/* --- transient ------------------------------------------------------------------------ */

struct transient_res {
	double factor_rss, factor_acct, factor_beyond_scratch;
	uint64_t scratch, kv, rss_growth;
	uint32_t tokens;
	int have_rss;
};

static int vm_kb(const char *key, uint64_t *out)
{
	char buf[4096];
	ssize_t n;
	int fd = open("/proc/self/status", O_RDONLY);
	const char *p;
	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	p = strstr(buf, key);
	if (!p)
		return -1;
	*out = strtoull(p + strlen(key), NULL, 10) * 1024;
	return 0;
}

static int bench_transient(struct ke_model *m, uint32_t R, struct transient_res *res)
{
	const struct ke_layout *L = ke_model_layout(m);
	int32_t *tok = malloc((size_t)R * sizeof *tok);
	struct ke_seq *s = NULL;
	uint64_t rss0 = 0, hwm = 0, scratch0;
	int fd, rc, V = ke_model_config(m)->vocab;
	if (!tok)
		return kv_fail(KV_ERR_NOMEM, "bench transient: allocation");
	for (uint32_t i = 0; i < R; i++)
		tok[i] = (int32_t)rnd(10, (uint32_t)V - 1);
	/* Warm up: the first forward faults the mmap'd weights in, which is
	 * not a transient of the prefill. */
	if ((rc = ke_seq_create(m, NULL, &s)) == KV_OK)
		rc = ke_seq_prefill(s, tok, 64, NULL, NULL);
	ke_seq_destroy(s);
	s = NULL;
	if (rc)
		goto done;
	/* Reset the peak RSS (Linux: "5" > clear_refs), then measure it. */
	fd = open("/proc/self/clear_refs", O_WRONLY);
	res->have_rss = fd >= 0 && write(fd, "5", 1) == 1;
	if (fd >= 0)
		close(fd);
	res->have_rss = res->have_rss && vm_kb("VmRSS:", &rss0) == 0;
	scratch0 = kv_mem_used(KV_MEM_SCRATCH);
	rc = ke_seq_create(m, NULL, &s);
	if (!rc)
		rc = ke_seq_prefill(s, tok, (int)R, NULL, NULL);
	/* The sequence's scratch and recurrent state. Since sequences reuse
	 * the buffers of destroyed ones (engine_int.h), the warm-up's are
	 * reused here: they stay resident between requests, so the RSS growth
	 * below is the prefill's own and the scratch is a fixed cost. */
	res->scratch = s ? ke_seq_scratch_bytes(s) : 0;
	(void)scratch0;
	if (res->have_rss && vm_kb("VmHWM:", &hwm) == 0 && hwm > rss0)
		res->rss_growth = hwm - rss0;
	res->kv = (uint64_t)R * L->kv_bytes_per_token;
	res->tokens = R;
	/* Beyond the prompt's own KV and the recurrent state. */
	res->factor_acct = (double)(res->scratch > L->snapshot_bytes ? res->scratch - L->snapshot_bytes : 0) /
			   (double)res->kv;
	if (res->have_rss) {
		double extra = (double)res->rss_growth - (double)res->kv - (double)L->snapshot_bytes;
		res->factor_rss = extra > 0 ? extra / (double)res->kv : 0;
		extra -= (double)(res->scratch > L->snapshot_bytes ? res->scratch - L->snapshot_bytes : 0);
		res->factor_beyond_scratch = extra > 0 ? extra / (double)res->kv : 0;
	}
done:
	ke_seq_destroy(s);
	free(tok);
	return rc;
}

/* --- command ----------------------------------------------------------------------------- */

static int cmd_bench_cache(int argc, char **argv)
{
	int json = 0, no_engine = 0, rc;
	int64_t entries = 1000, prompt = 32768, queries = 2000, rtok = 16384, ttok = 2048;
	const char *model = NULL;
	char tmp[512] = "";
	struct ke_model *m = NULL;
	struct lookup_res lk = {0};
	struct mem_res mem = {0};
	struct restore_res rs = {0};
	struct transient_res tr = {0};
	const struct kv_flag flags[] = {
		{"json", KV_FLAG_BOOL, &json, NULL, "print one JSON object"},
		{"entries", KV_FLAG_INT, &entries, "N", "stored entries for the lookup bench (1000)"},
		{"prompt", KV_FLAG_INT, &prompt, "N", "prompt tokens per lookup (32768)"},
		{"queries", KV_FLAG_INT, &queries, "N", "lookups timed per index (2000)"},
		{"restore-tokens", KV_FLAG_INT, &rtok, "N", "full-page tokens of the restored resume point (16384)"},
		{"transient-tokens", KV_FLAG_INT, &ttok, "N", "prompt of the transient measurement (2048)"},
		{"model", KV_FLAG_STR, &model, "DIR", "hybrid model folder for the engine sections "
						      "(default: bench-hybrid written to a temporary folder)"},
		{"no-engine", KV_FLAG_BOOL, &no_engine, NULL, "skip the engine sections"},
		{0},
	};
	rc = kv_flags_parse("usage: kvkeep bench cache [flags]", flags, argc, argv, NULL, 0, NULL);
	if (rc)
		return rc == 1 ? 0 : 2;
	if (entries < 1 || entries > 100000 || prompt < 16 || prompt > 32768 || queries < 1 || rtok < 256 ||
	    rtok > 1 << 20 || ttok < 16 || ttok > 1 << 20) {
		fprintf(stderr, "kvkeep bench cache: a size is out of range (see --help)\n");
		return 2;
	}
	kv_log_set_level(KV_LOG_WARN);

	/* The engine sections run first, so the transient peak is not masked
	 * by the other sections' allocations. */
	if (!no_engine) {
		if (!model) {
			const char *t = kv_env(KV_ENV_TMPDIR);
			snprintf(tmp, sizeof tmp, "%s/kvkeep-bench-cache.XXXXXX", t && *t ? t : "/tmp");
			if (!mkdtemp(tmp)) {
				fprintf(stderr, "kvkeep bench cache: cannot make a temporary folder\n");
				return 1;
			}
			char dir[600];
			snprintf(dir, sizeof dir, "%s/bench-hybrid", tmp);
			struct kv_synth_opts so = {.preset = "bench-hybrid", .out_dir = dir, .seed = 1, .dtype = KV_DT_BF16};
			if ((rc = kv_synth_write(&so))) {
				fprintf(stderr, "kvkeep bench cache: %s\n", kv_errmsg());
				goto out;
			}
			rc = ke_model_load(dir, NULL, &m);
		} else {
			rc = ke_model_load(model, NULL, &m);
		}
		if (rc) {
			fprintf(stderr, "kvkeep bench cache: %s\n", kv_errmsg());
			goto out;
		}
		if (!ke_model_layout(m)->snapshot_bytes) {
			fprintf(stderr, "kvkeep bench cache: --model must be a hybrid model\n");
			rc = 2;
			goto out;
		}
		if ((rc = bench_transient(m, (uint32_t)ttok, &tr)) || (rc = bench_restore_engine(m, (uint32_t)rtok + 100, &rs)))
			goto fail;
	}
	{
		/* Synthetic restore on the same layout when there is an engine,
		 * else on the 9B-like geometry of bench-hybrid. */
		struct ke_layout L;
		if (m) {
			L = *ke_model_layout(m);
		} else {
			layout_dense(&L, 256, 2, 4, 256, 2);
			L.n_rec_layers = 6;
			L.snapshot_bytes = 6 * (32 * 128 * 128 * 4 + 8192 * 3 * 4);
		}
		double engine_memcpy = rs.memcpy_ms;
		if ((rc = bench_restore_synthetic(&L, (uint32_t)rtok + 100, &rs)))
			goto fail;
		if (rs.engine)
			rs.memcpy_ms = engine_memcpy; /* the engine ratio keeps its own baseline */
		else {
			rs.restore_ms = rs.syn_ms;
			rs.ratio = rs.syn_ratio;
			rs.snap_bytes = L.snapshot_bytes;
			rs.tokens = (uint32_t)rtok + 100;
			rs.pages = rs.tokens / 256;
		}
	}
	if ((rc = bench_lookup((uint32_t)entries, (uint32_t)prompt, (uint32_t)queries, &lk)))
		goto fail;
	if ((rc = bench_memory(&mem)))
		goto fail;

	if (json) {
		printf("{\"lookup_p50_ms\": %.4f, \"lookup_p99_ms\": %.4f, \"lookup_hash_p50_ms\": %.4f, "
		       "\"lookup_hash_p99_ms\": %.4f, \"lookup_entries\": %llu, \"lookup_nodes\": %llu, "
		       "\"lookup_prompt_tokens\": %lld, \"lookup_avg_resume\": %llu, "
		       "\"restore_ratio_vs_memcpy\": %.3f, \"restore_ms\": %.3f, \"memcpy_ms\": %.3f, "
		       "\"restore_measured\": \"%s\", \"restore_tokens\": %u, \"restore_snapshot_bytes\": %llu, "
		       "\"restore_synthetic_ms\": %.3f, \"restore_synthetic_ratio\": %.3f, "
		       "\"restore_create_seq_ms\": %.3f, \"memcpy_fresh_ms\": %.3f, \"restore_ratio_vs_fresh_memcpy\": %.3f, "
		       "\"bytes_per_token_ratio\": %.5f, \"bytes_per_token_ratio_with_structs\": %.5f, "
		       "\"memory_distinct_tokens\": %llu, \"memory_entries\": %llu, \"memory_dedup_bytes\": %llu",
		       lk.p50[0], lk.p99[0], lk.p50[1], lk.p99[1], (unsigned long long)lk.entries,
		       (unsigned long long)lk.nodes, (long long)prompt, (unsigned long long)lk.avg_resume, rs.ratio,
		       rs.restore_ms, rs.memcpy_ms, rs.engine ? "engine" : "synthetic", rs.tokens,
		       (unsigned long long)rs.snap_bytes, rs.syn_ms, rs.syn_ratio, rs.create_ms, rs.memcpy_fresh_ms,
		       rs.ratio_fresh, mem.ratio, mem.ratio_structs,
		       (unsigned long long)mem.distinct, (unsigned long long)mem.entries, (unsigned long long)mem.dedup);
		if (m)
			printf(", \"transient_factor\": %.4f, \"transient_factor_accounted\": %.4f, "
			       "\"transient_factor_beyond_scratch\": %.4f, "
			       "\"transient_tokens\": %u, \"transient_scratch_bytes\": %llu, \"transient_rss_growth\": %llu, "
			       "\"transient_rss_measured\": %s",
			       tr.have_rss ? tr.factor_rss : tr.factor_acct, tr.factor_acct, tr.factor_beyond_scratch, tr.tokens,
			       (unsigned long long)tr.scratch, (unsigned long long)tr.rss_growth,
			       tr.have_rss ? "true" : "false");
		printf("}\n");
	} else {
		printf("lookup   %llu entries (%llu blocks), %lld-token prompts, mean resume %llu tokens\n"
		       "         radix p50 %.4f ms  p99 %.4f ms   hash p50 %.4f ms  p99 %.4f ms   (target p99 < 1 ms)\n",
		       (unsigned long long)lk.entries, (unsigned long long)lk.nodes, (long long)prompt,
		       (unsigned long long)lk.avg_resume, lk.p50[0], lk.p99[0], lk.p50[1], lk.p99[1]);
		printf("restore  %u tokens, %llu pages, %.1f MiB snapshot: %s %.3f ms vs memcpy %.3f ms = %.2fx "
		       "(target 1.5x); cache part alone %.3f ms = %.2fx\n",
		       rs.tokens, (unsigned long long)rs.pages, (double)rs.snap_bytes / 1048576.0,
		       rs.engine ? "ke_seq_resume" : "synthetic", rs.restore_ms, rs.memcpy_ms, rs.ratio, rs.syn_ms,
		       rs.syn_ratio);
		if (rs.engine)
			printf("         a new empty sequence alone %.3f ms; memcpy into a fresh buffer %.3f ms "
			       "(restore = %.2fx of that)\n",
			       rs.create_ms, rs.memcpy_fresh_ms, rs.ratio_fresh);
		printf("memory   %llu entries, %llu distinct tokens: %.5f bytes per KV byte (%.5f with structs; "
		       "target 1.02), dedup saved %.1f MiB, %llu superseded\n",
		       (unsigned long long)mem.entries, (unsigned long long)mem.distinct, mem.ratio, mem.ratio_structs,
		       (double)mem.dedup / 1048576.0, (unsigned long long)mem.superseded);
		if (m)
			printf("transient %u-token cold prefill: scratch %.2f MiB, peak RSS growth %.2f MiB over %.2f MiB "
			       "of KV: factor %.4f (accounted %.4f), beyond the fixed scratch %.4f%s\n",
			       tr.tokens, (double)tr.scratch / 1048576.0, (double)tr.rss_growth / 1048576.0,
			       (double)tr.kv / 1048576.0, tr.have_rss ? tr.factor_rss : tr.factor_acct, tr.factor_acct,
			       tr.factor_beyond_scratch, tr.have_rss ? "" : " (no VmHWM reset here: accounted only)");
	}
	rc = 0;
	goto out;
fail:
	fprintf(stderr, "kvkeep bench cache: %s\n", kv_errmsg());
	rc = 1;
out:
	ke_model_destroy(m);
	if (tmp[0]) {
		char cmd[700];
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
		(void)!system(cmd);
	}
	return rc;
}
KV_COMMAND(bench_cache, "bench cache", "benchmark the prefix cache (lookup, restore, memory)", cmd_bench_cache);
