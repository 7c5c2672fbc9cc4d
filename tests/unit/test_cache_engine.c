/*
 * test_cache_engine.c - cached == cold, bit for bit, with the real engine.
 *
 * For tiny-dense and tiny-hybrid (written with kv_synth_write, B = 16,
 * checkpoint stride 32 so stride snapshots, thinning, snapping and the
 * anchor all happen at these sizes), 200+ random multi-turn sessions per
 * family run through kss_run: a few shared system prompts, sessions that
 * continue, branch from an earlier turn with another message, replay an
 * earlier prompt, or ask for a prefix of a stored sequence; every 40
 * sessions the budget drops so low that entries get evicted. After every
 * request the logits after the prompt must equal, by memcmp, those of a
 * cold prefill of the same prompt in a fresh sequence; a replay must also
 * generate the same tokens as the first time. Half the sessions use a
 * radix-indexed cache, half a hash-indexed one. The case then checks that
 * each kind of hit really happened (radix, hash, a partial block, a
 * snapped checkpoint, the anchor) and that evictions did.
 */
#include "kt.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/io.h"
#include "base/log.h"
#include "cache/cache.h"
#include "session/run.h"
#include "engine/model.h"
#include "engine/seq.h"
#include "model/gguf_convert.h"
#include "model/mlx.h"
#include "model/mlx_convert.h"
#include "model/safetensors.h"
#include "model/synth.h"
#include "model/gguf_model.h"
#include "model/quant.h"
#include "base/durable.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXT 1024   /* tokens per conversation */
#define HIST 24     /* conversations remembered for branches and replays */
#define GEN 4       /* tokens generated per turn */

static uint64_t g_seed = 0x5eed;
static int g_mlx_bits; /* > 0: run the preset converted to an MLX folder */
static int g_ftype = -1; /* >= 0: run the model from a GGUF of this file type */

static struct ke_model *load_model(const char *preset)
{
	char dir[1024];
	struct ke_model *m = NULL;
	snprintf(dir, sizeof dir, "%s/%s", kt_tmpdir(), preset);
	struct kv_synth_opts o = {.preset = preset, .out_dir = dir, .seed = 7, .dtype = KV_DT_BF16};
	if (kv_synth_write(&o) != KV_OK) {
		kt_fail(__FILE__, __LINE__, "synth %s: %s", preset, kv_errmsg());
		return NULL;
	}
	if (g_mlx_bits) {
		char q[1100];
		snprintf(q, sizeof q, "%s-mlx%d", dir, g_mlx_bits);
		struct kv_mlx_write_opts mo = {.hf_dir = dir, .out_dir = q, .bits = g_mlx_bits, .group_size = 64,
					       .dw_flags = KV_DW_NO_SYNC};
		if (kv_mlx_write(&mo) != KV_OK) {
			kt_fail(__FILE__, __LINE__, "convert %s to MLX: %s", preset, kv_errmsg());
			return NULL;
		}
		if (kv_path_fmt(dir, sizeof dir, "%s", q)) {
			kt_fail(__FILE__, __LINE__, "%s", kv_errmsg());
			return NULL;
		}
	}
	if (g_ftype >= 0) {
		char gg[1100];
		snprintf(gg, sizeof gg, "%s.%s.gguf", dir, kq_ftype_name(g_ftype));
		struct kv_gguf_convert_params cp = {dir, gg, g_ftype, KV_DW_NO_SYNC};
		if (kv_gguf_convert(&cp, NULL, NULL) != KV_OK) {
			kt_fail(__FILE__, __LINE__, "convert %s: %s", preset, kv_errmsg());
			return NULL;
		}
		if (kv_path_fmt(dir, sizeof dir, "%s", gg)) {
			kt_fail(__FILE__, __LINE__, "%s", kv_errmsg());
			return NULL;
		}
	}
	struct ke_model_params mp = {.page_tokens = 16};
	if (ke_model_load(dir, &mp, &m) != KV_OK) {
		kt_fail(__FILE__, __LINE__, "load %s: %s", preset, kv_errmsg());
		return NULL;
	}
	return m;
}

/* A conversation: tokens so far (prompt + generated), and its boundaries. */
struct conv {
	int32_t tok[MAXT];
	uint32_t n;
	uint32_t b[64];
	uint32_t nb;
	uint32_t anchor;       /* b[0]: end of the system prompt */
	int32_t gen[GEN];      /* what the last turn generated */
	uint32_t last_prompt;  /* length of the last prompt */
};

struct counts {
	int requests, hits, radix_hits, hash_hits, partial, snapped, anchor_hits, replays, prefixes, branches;
	int mismatches, replay_mismatch;
};

static int rnd(int lo, int hi)
{
	return lo + (int)(kt_rand(&g_seed) % (uint64_t)(hi - lo + 1));
}

static void add_tokens(struct conv *c, int n)
{
	for (int i = 0; i < n && c->n < MAXT; i++)
		c->tok[c->n++] = rnd(20, 600);
}

/* A message: its tokens, then the end-of-message pair, then a boundary. */
static void add_message(struct conv *c, int len)
{
	c->tok[c->n++] = 3; /* "<|im_start|>" stand-in */
	add_tokens(c, len);
	c->tok[c->n++] = 4; /* "<|im_end|>" */
	c->tok[c->n++] = 5; /* "\n" */
	c->b[c->nb++] = c->n;
}

/* Cold reference: a fresh sequence, the whole prompt in one prefill. */
static int cold_logits(struct ke_model *m, const int32_t *tok, uint32_t n, float *out)
{
	struct ke_seq *s = NULL;
	int rc = ke_seq_create(m, NULL, &s);
	if (!rc)
		rc = ke_seq_prefill(s, tok, (int)n, NULL, out);
	ke_seq_destroy(s);
	return rc;
}

/* Run one request (prompt = c->tok[0..n)) and compare with cold. */
static void request(struct ke_model *m, struct kc_cache *cache, int is_hash, struct conv *c, uint32_t n,
		    const uint32_t *bounds, uint32_t nb, float *lc, float *lw, int V, struct counts *k, int32_t *out)
{
	struct kss_run_result r;
	struct kss_run_params p = {.prompt = c->tok, .n = n, .bounds = bounds, .n_bounds = nb, .max_new = GEN,
				  .logits = lc, .out = out};
	int rc = kss_run(cache, m, &p, &r);
	if (rc != KV_OK) {
		kt_fail(__FILE__, __LINE__, "kss_run: %s", kv_errmsg());
		k->mismatches++;
		return;
	}
	k->requests++;
	if (cold_logits(m, c->tok, n, lw) != KV_OK || memcmp(lc, lw, (size_t)V * sizeof *lc)) {
		k->mismatches++;
		if (k->mismatches < 4)
			kt_fail(__FILE__, __LINE__, "logits differ: n=%u resumed=%u shared=%u (%s)", n, r.resumed,
				r.shared, is_hash ? "hash" : "radix");
	}
	if (r.resumed) {
		k->hits++;
		if (is_hash)
			k->hash_hits++;
		else
			k->radix_hits++;
		if (r.resumed % 16)
			k->partial++;
		if (r.shared > r.resumed && r.shared < n)
			k->snapped++;
		if (c->anchor && r.resumed == c->anchor && r.shared > c->anchor)
			k->anchor_hits++;
	}
}

static void sessions(const char *preset, int n_sessions)
{
	struct ke_model *m = load_model(preset);
	struct kc_cache *cache[2] = {NULL, NULL};
	struct conv *hist = calloc(HIST, sizeof *hist), cur;
	struct counts k = {0};
	struct kc_stats st[2];
	int n_hist = 0, V, hybrid;
	float *lc, *lw;
	int32_t sys[3][96];
	int sys_n[3];

	KT_REQUIRE(m && hist);
	V = ke_model_config(m)->vocab;
	hybrid = ke_model_layout(m)->snapshot_bytes > 0;
	lc = malloc((size_t)V * sizeof *lc);
	lw = malloc((size_t)V * sizeof *lw);
	for (int ix = 0; ix < 2; ix++) {
		struct kc_policy pol;
		kc_policy_default(&pol, hybrid);
		pol.stride = 32;
		struct kc_params p = {.layout = ke_model_layout(m), .index = ix, .policy = &pol, .ns = {1, 2},
				      .max_hybrid_entries = 64};
		KT_OK(kc_cache_create(&p, &cache[ix]));
	}
	for (int s = 0; s < 3; s++) {
		sys_n[s] = 40 + 20 * s;
		for (int i = 0; i < sys_n[s]; i++)
			sys[s][i] = rnd(20, 600);
	}
	kv_log_set_level(KV_LOG_ERROR);
	for (int s = 0; s < n_sessions && k.mismatches < 4; s++) {
		int ix = s & 1, op = rnd(0, 9), turns;
		struct kc_cache *cc = cache[ix];
		/* Budget pressure now and then: room for about two sessions. */
		if (s % 40 == 20)
			for (int q = 0; q < 2; q++)
				kc_cache_set_budget(cache[q], hybrid ? 200000 : 120000);
		if (s % 40 == 32)
			for (int q = 0; q < 2; q++)
				kc_cache_set_budget(cache[q], 0);
		if (op <= 1 && n_hist) {
			/* Replay an earlier prompt exactly: same logits, same tokens. */
			struct conv *h = &hist[rnd(0, n_hist - 1)];
			int32_t out[GEN];
			uint32_t nb = 0;
			cur = *h;
			while (nb < h->nb && h->b[nb] < h->last_prompt)
				nb++;
			request(m, cc, ix, &cur, h->last_prompt, h->b, nb, lc, lw, V, &k, out);
			k.replays++;
			if (memcmp(out, h->gen, sizeof out))
				k.replay_mismatch++;
			continue;
		}
		if (op == 2 && n_hist) {
			/* A prefix of a stored sequence (prompt + generated). */
			struct conv *h = &hist[rnd(0, n_hist - 1)];
			cur = *h;
			uint32_t n = (uint32_t)rnd(2, (int)h->n);
			uint32_t nb = 0;
			while (nb < h->nb && h->b[nb] < n)
				nb++;
			request(m, cc, ix, &cur, n, h->b, nb, lc, lw, V, &k, NULL);
			k.prefixes++;
			continue;
		}
		if (op <= 5 && n_hist) {
			/* Branch: an earlier conversation cut at one of its
			 * boundaries, continued with another message. */
			struct conv *h = &hist[rnd(0, n_hist - 1)];
			uint32_t cut = (uint32_t)rnd(0, (int)h->nb - 1);
			cur = *h;
			cur.n = cur.b[cut];
			cur.nb = cut + 1;
			k.branches++;
		} else {
			/* A new session on one of the shared system prompts. */
			int which = rnd(0, 2);
			memset(&cur, 0, sizeof cur);
			memcpy(cur.tok, sys[which], (size_t)sys_n[which] * sizeof(int32_t));
			cur.n = (uint32_t)sys_n[which];
			cur.b[cur.nb++] = cur.n;
		}
		cur.anchor = cur.b[0];
		turns = rnd(1, 3);
		for (int t = 0; t < turns && cur.n + 80 < MAXT; t++) {
			uint32_t n;
			add_message(&cur, rnd(3, 24));
			cur.tok[cur.n++] = 3; /* generation prompt */
			cur.tok[cur.n++] = 6;
			n = cur.n;
			request(m, cc, ix, &cur, n, cur.b, cur.nb, lc, lw, V, &k, cur.gen);
			cur.last_prompt = n;
			/* The assistant message as the next render shows it: the
			 * generated tokens, then end of message. */
			for (int g = 0; g < GEN; g++)
				cur.tok[cur.n++] = cur.gen[g];
			cur.tok[cur.n++] = 4;
			cur.tok[cur.n++] = 5;
			cur.b[cur.nb++] = cur.n;
			if (n_hist < HIST)
				hist[n_hist++] = cur;
			else
				hist[rnd(0, HIST - 1)] = cur;
		}
	}
	kv_log_set_level(KV_LOG_WARN);
	for (int ix = 0; ix < 2; ix++) {
		KT_OK(kc_cache_check(cache[ix]));
		kc_cache_stats(cache[ix], &st[ix]);
	}
	fprintf(stderr,
		"%s: %d requests, %d hits (radix %d, hash %d), partial %d, snapped %d, anchor %d, replays %d, "
		"prefixes %d, branches %d, evictions %llu+%llu\n",
		preset, k.requests, k.hits, k.radix_hits, k.hash_hits, k.partial, k.snapped, k.anchor_hits, k.replays,
		k.prefixes, k.branches, (unsigned long long)st[0].evictions, (unsigned long long)st[1].evictions);
	/* Coverage floors scale with the number of sessions (200 normally). */
#define AT_LEAST(x, per200) KT_CHECKF((long long)(x) > (long long)(per200) * n_sessions / 200, "%s = %lld", #x, (long long)(x))
	KT_EQ_INT(k.mismatches, 0);
	KT_EQ_INT(k.replay_mismatch, 0);
	KT_CHECK(k.requests >= n_sessions);
	AT_LEAST(k.radix_hits, 50);
	AT_LEAST(k.hash_hits, 50);
	AT_LEAST(k.replays, 10);
	AT_LEAST(k.prefixes, 5);
	AT_LEAST(k.branches, 10);
	AT_LEAST(st[0].evictions, 5);
	AT_LEAST(st[1].evictions, 5);
	AT_LEAST(k.partial, 10);
	if (hybrid) {
		AT_LEAST(k.snapped, 10);
		AT_LEAST(k.anchor_hits, 3);
	}
	for (int ix = 0; ix < 2; ix++)
		kc_cache_destroy(cache[ix]);
	free(lc);
	free(lw);
	free(hist);
	ke_model_destroy(m);
}

/* 200 sessions per family; sanitizer builds (make san-test sets
 * KVKEEP_SANITIZER) run the engine ~15x slower and do 50. */
static int n_sessions(void)
{
	const char *e = getenv("KVKEEP_SANITIZER");
	return e && *e && strcmp(e, "0") ? 50 : 200;
}

KT_CASE(cached_equals_cold_dense) { sessions("tiny-dense", n_sessions()); }
KT_CASE(cached_equals_cold_hybrid) { sessions("tiny-hybrid", n_sessions()); }
/* The same on an MLX 4-bit folder (50 sessions, the sanitizer count: the
 * math is the same engine, only the weight format differs; 50 still spans
 * the budget drops that evict). */
KT_CASE(cached_equals_cold_hybrid_mlx4)
{
	g_mlx_bits = 4;
	sessions("tiny-hybrid", 50);
	g_mlx_bits = 0;
}

/* The same on a Q4_K_M GGUF of the hybrid (quantized products, tiled
 * out_proj): the cache never sees the weight format. */
KT_CASE(cached_equals_cold_hybrid_q4_k_m)
{
	g_ftype = KQ_FTYPE_Q4_K_M;
	sessions("tiny-hybrid", n_sessions());
	g_ftype = -1;
}

static int pick_two(void *ctx, const float *logits, int vocab, int32_t *tok)
{
	int *calls = ctx;
	(void)logits;
	(void)vocab;
	if (++*calls > 2)
		return KV_ERR_CANCELLED; /* stop generating */
	*tok = 42;
	return KV_OK;
}

/* kss_run's options: the memory-cap projection evicts and the logits stay
 * exact, stop ids and the pick callback end generation, cancel stops the
 * prefill and keeps the cache consistent. */
KT_CASE(run_options)
{
	struct ke_model *m = load_model("tiny-hybrid");
	struct kc_cache *c = NULL;
	struct kss_run_result r;
	struct kc_stats st;
	int32_t tok[300], out[8];
	float *lc, *lw;
	int V, calls = 0, cancel = 1;
	KT_REQUIRE(m);
	V = ke_model_config(m)->vocab;
	lc = malloc((size_t)V * 4);
	lw = malloc((size_t)V * 4);
	struct kc_policy pol;
	kc_policy_default(&pol, 1);
	pol.stride = 32;
	struct kc_params p = {.layout = ke_model_layout(m), .policy = &pol};
	KT_OK(kc_cache_create(&p, &c));
	for (int i = 0; i < 300; i++)
		tok[i] = rnd(20, 600);
	uint32_t b1[] = {60};
	struct kss_run_params rp = {.prompt = tok, .n = 100, .bounds = b1, .n_bounds = 1, .max_new = 3};
	KT_OK(kss_run(c, m, &rp, &r));
	KT_EQ_INT(r.resumed, 0);
	KT_CHECK(r.stops >= 4); /* 32, 60, 64, 96, 100 */
	/* A cap far below what is in use: the projection evicts (the MRU
	 * entry too, usage being over the cap), and the result is still
	 * exact. */
	rp = (struct kss_run_params){.prompt = tok, .n = 200, .bounds = b1, .n_bounds = 1, .max_new = 2,
				    .logits = lc, .mem_cap = 1};
	KT_OK(kss_run(c, m, &rp, &r));
	KT_CHECK(r.resumed > 0);
	kc_cache_stats(c, &st);
	KT_CHECK(st.pressure_evictions > 0);
	KT_OK(cold_logits(m, tok, 200, lw));
	KT_CHECK(!memcmp(lc, lw, (size_t)V * 4));
	/* Stop ids and the pick callback. */
	int32_t forced[] = {7, 8, 9, 10};
	int32_t stop[] = {9};
	rp = (struct kss_run_params){.prompt = tok, .n = 210, .max_new = 4, .forced = forced, .stop_ids = stop,
				    .n_stop_ids = 1, .out = out};
	KT_OK(kss_run(c, m, &rp, &r));
	KT_EQ_INT(r.generated, 3);
	KT_EQ_INT(out[2], 9);
	rp = (struct kss_run_params){.prompt = tok, .n = 220, .max_new = 6, .pick = pick_two, .pick_ctx = &calls,
				    .out = out};
	KT_OK(kss_run(c, m, &rp, &r));
	KT_EQ_INT(r.generated, 2);
	KT_EQ_INT(out[0], 42);
	/* Cancelled before the first chunk. */
	rp = (struct kss_run_params){.prompt = tok, .n = 300, .max_new = 1, .cancel = &cancel};
	KT_EQ_INT(kss_run(c, m, &rp, &r), KV_ERR_CANCELLED);
	KT_OK(kc_cache_check(c));
	/* Bad input: an id outside the vocabulary is an error, not a crash. */
	int32_t bad[3] = {1, 2, 1 << 30};
	rp = (struct kss_run_params){.prompt = bad, .n = 3};
	KT_EQ_INT(kss_run(c, m, &rp, &r), KV_ERR_INVALID);
	KT_OK(kc_cache_check(c));
	kc_cache_destroy(c);
	ke_model_destroy(m);
	free(lc);
	free(lw);
}

KT_MAIN(cached_equals_cold_dense, cached_equals_cold_hybrid, cached_equals_cold_hybrid_mlx4,
	cached_equals_cold_hybrid_q4_k_m, run_options)
