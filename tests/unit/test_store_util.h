/*
 * test_store_util.h - fixtures for the disk-tier tests: a small layout
 * (B = 8, two attention layers, two recurrent layers with real dims), a
 * RAM cache + store pair on a temp folder, entries whose bytes are a
 * function of their tokens (test_cache_util.h), and a check that a lookup
 * after a restart is a correct hit or a miss, byte for byte.
 */
#ifndef KV_TESTS_STORE_UTIL_H
#define KV_TESTS_STORE_UTIL_H

#include "base/err.h"
#include "base/io.h"
#include "base/pages.h"
#include "cache/cache.h"
#include "cache/storage_policy.h"
#include "store/store.h"
#include "kt.h"
#include "test_cache_util.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TS_B 8

/* Attention layers and KV heads of ts_layout; a test may raise them to
 * make objects bigger (rows stay 8 bytes, which tc_verify_hit needs). */
static int ts_attn_layers = 2, ts_kv_heads = 2;
/* Bytes for answer records (cache/echo.h) in the RAM cache; 0: none. */
static uint64_t ts_echo_bytes = 0;

static inline void ts_layout(struct ke_layout *L, int hybrid)
{
	memset(L, 0, sizeof *L);
	L->page_tokens = TS_B;
	L->kv_dtype = KV_DT_F32;
	L->n_attn_layers = ts_attn_layers;
	L->n_kv_heads = ts_kv_heads;
	L->head_dim = 2;
	L->n_segments = ts_attn_layers * 2 * ts_kv_heads;
	L->row_bytes = 8;
	L->page_bytes = (size_t)L->n_segments * TS_B * L->row_bytes;
	L->kv_bytes_per_token = (size_t)L->n_segments * L->row_bytes;
	if (hybrid) {
		size_t off = 0;
		L->n_rec_layers = 2;
		for (int i = 0; i < 2; i++) {
			struct ke_rec_layer *r = &L->rec[i];
			r->layer = i * 2;
			r->conv_dims[0] = 3;
			r->conv_dims[1] = 2;
			r->conv_bytes = 3 * 2 * 4;
			r->conv_off = off;
			off += r->conv_bytes;
			r->state_dims[0] = 2;
			r->state_dims[1] = 2;
			r->state_dims[2] = 2;
			r->state_bytes = 2 * 2 * 2 * 4;
			r->state_off = off;
			off += r->state_bytes;
		}
		L->snapshot_bytes = off;
	}
}

struct ts_env {
	struct ke_layout L;
	struct kv_pages *pool;
	struct kc_cache *c;
	struct ks_store *s;
	char root[4096];
	struct kv_h128 ns;
	int hybrid;
};

static inline int ts_open(struct ts_env *e, const char *root, int hybrid, const struct ks_params *extra)
{
	struct kc_policy pol;
	struct ks_params p = extra ? *extra : (struct ks_params){.no_threads = 1};
	int rc;
	memset(e, 0, sizeof *e);
	e->hybrid = hybrid;
	ts_layout(&e->L, hybrid);
	snprintf(e->root, sizeof e->root, "%s", root);
	e->ns = p.ns.lo || p.ns.hi ? p.ns : (struct kv_h128){0x1111, 0x2222};
	kc_policy_default(&pol, hybrid);
	e->pool = kv_pages_create(e->L.page_bytes, 0, 8);
	struct kc_params cp = {.layout = &e->L, .ns = e->ns, .policy = &pol, .max_hybrid_entries = 64,
			       .echo_bytes = ts_echo_bytes};
	if ((rc = kc_cache_create(&cp, &e->c)))
		return rc;
	p.root = root;
	p.ns = e->ns;
	p.label = "test";
	p.layout = &e->L;
	p.cache = e->c;
	p.pages = e->pool;
	if (!p.stride)
		p.stride = 16;
	if (!p.max_bytes)
		p.max_bytes = 1ull << 30;
	if (!p.reserve_bytes)
		p.reserve_bytes = 1;
	if (!p.env_ckpt_max)
		p.env_ckpt_max = "";
	return ks_store_open(&p, &e->s);
}

static inline void ts_close(struct ts_env *e)
{
	ks_store_close(e->s);
	kc_cache_destroy(e->c);
	if (e->pool) {
		KT_EQ_INT(kv_pages_in_use(e->pool), 0);
		kv_pages_destroy(e->pool);
	}
	memset(e, 0, sizeof *e);
}

/* Deterministic tokens: a shared prefix of `shared` tokens from seed 1,
 * then tokens from `seed`. */
static inline void ts_tokens(int32_t *t, uint32_t n, uint32_t shared, uint64_t seed)
{
	uint64_t a = 1, b = seed;
	for (uint32_t i = 0; i < n; i++)
		t[i] = (int32_t)(kt_rand(i < shared ? &a : &b) % 5000) + 10;
}

/* Store tok[0..n) as an entry with checkpoints (hybrid: snapshots). */
static inline uint64_t ts_put(struct ts_env *e, const int32_t *tok, uint32_t n, const uint32_t *ck, uint32_t n_ck,
			      uint32_t anchor)
{
	struct kv_page *pg[512];
	struct kc_put_ckpt c[16];
	uint64_t id = 0;
	int np = tc_pages(e->pool, &e->L, tok, n, pg);
	if (np < 0)
		return 0;
	for (uint32_t i = 0; i < n_ck; i++) {
		c[i].pos = ck[i];
		c[i].snap = e->hybrid ? tc_snap(e->c, tok, ck[i]) : NULL;
	}
	struct kc_put p = {.tokens = tok,
			   .n = n,
			   .pages = pg,
			   .snap = e->hybrid ? tc_snap(e->c, tok, n) : NULL,
			   .ckpt = c,
			   .n_ckpt = n_ck,
			   .anchor = anchor};
	int rc = kc_cache_put(e->c, &p, &id);
	KT_CHECKF(rc == KV_OK, "kc_cache_put: %s", kv_errmsg());
	for (int i = 0; i < np; i++)
		kv_page_unref(pg[i]);
	return id;
}

/*
 * The after-restart lookup the server does: RAM first, the disk tier
 * when it offers more, then the RAM lookup again. Checks the hit byte for
 * byte against what a cold run would hold (a wrong hit fails the test).
 * Returns the resume position (0 = miss); *anchor gets the hit's anchor.
 */
static inline uint32_t ts_lookup(struct ts_env *e, const int32_t *tok, uint32_t n, const uint32_t *bounds,
				 size_t n_bounds, uint32_t *anchor, struct ks_fetch *fo)
{
	struct kc_hit h;
	struct ks_fetch f;
	struct kv_page *rp[512];
	kc_cache_peek(e->c, tok, n, &h);
	kc_hit_pages(&h, rp);
	struct ks_req rq = {.tokens = tok,
			    .n = n,
			    .bounds = bounds,
			    .n_bounds = n_bounds,
			    .ram_pos = h.pos,
			    .ram_pages = rp,
			    .ram_n_pages = h.n_pages};
	KT_OK(ks_store_fetch(e->s, &rq, &f));
	if (fo)
		*fo = f;
	if (f.pos) {
		kc_hit_release(e->c, &h);
		kc_cache_lookup(e->c, tok, n, &h);
		KT_CHECKF(h.pos == f.pos, "RAM lookup after a disk load resumes at %u, the load said %u", h.pos, f.pos);
	}
	uint32_t bad = tc_verify_hit(e->c, &h, tok);
	KT_CHECKF(bad == 0, "WRONG HIT: resume at %u differs from a cold run at position %u", h.pos, bad - 1);
	uint32_t pos = bad ? 0 : h.pos;
	if (anchor)
		*anchor = h.anchor;
	kc_hit_release(e->c, &h);
	return pos;
}

/* Count files under a folder whose names contain `sub`; remove a tree.
 * (nftw, not a shell: the crash tests call these hundreds of times.) */
static const char *ts_sub_;
static int ts_count_;
static int ts_count_fn_(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
	(void)sb;
	if (type == FTW_F && strstr(path + ftw->base, ts_sub_))
		ts_count_++;
	return 0;
}

static inline int ts_count_files(const char *dir, const char *sub)
{
	ts_sub_ = sub;
	ts_count_ = 0;
	if (nftw(dir, ts_count_fn_, 16, FTW_PHYS) != 0)
		return access(dir, F_OK) == 0 ? -1 : 0;
	return ts_count_;
}

static int ts_rm_fn_(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
	(void)sb;
	(void)ftw;
	return type == FTW_DP ? rmdir(path) : unlink(path);
}

static inline int ts_rmrf(const char *dir)
{
	if (access(dir, F_OK) != 0)
		return 0;
	return nftw(dir, ts_rm_fn_, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
