/*
 * core.c - what every part of the disk tier shares, below the facade
 * (store.c) and its workers (writer.c, fetch.c, scan.c, flush.c, evict.c):
 * object paths, the catalog lookup with its file fallback, rejected files
 * and quarantine, write-failure accounting, the namespace claim, the
 * prefix chain hashes, the write-rate estimate and the parallel runner.
 *
 * Calls go one way: store.c -> the workers -> evict.c -> core.c, and
 * core.c calls nothing of its folder but catalog.c, dir.c, ns.c and obj.c
 * (tests/arch/check.py fails on a circle). A helper two workers need
 * lives here, not in one of them.
 */
#include "base/err.h"
#include "base/io.h"
#include "base/log.h"
#include "cache/budget.h"
#include "cache/names.h"
#include "store/ns.h"
#include "store/store_int.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const char *ks_werr_name(int w)
{
	static const char *const n[KS_WERR__COUNT] = {"enospc", "eio", "fsync", "readonly", "cap"};
	return w >= 0 && w < KS_WERR__COUNT ? n[w] : "?";
}

uint64_t ks_ckpt_cap_parse(const char *v)
{
	uint64_t x;
	if (!v || !*v)
		return KS_CKPT_MAX_BYTES_DEFAULT;
	/* the same number rule as the cache's KVKEEP_* byte counts */
	if (kc_budget_parse_u64(v, &x) != 0) {
		/* read at every store open and scan: said once */
		static atomic_int warned;
		if (!atomic_exchange(&warned, 1))
			KV_WARN("store.ckpt_cap", "value=\"%.40s\" msg=\"KVKEEP_KV_CHECKPOINT_MAX_BYTES is not a byte count: "
					  "using 20 GiB\"",
			v);
		return KS_CKPT_MAX_BYTES_DEFAULT;
	}
	return x;
}

int ks_store_path(const struct ks_store *s, int area, int kind, struct kv_h128 id, char *out, size_t cap)
{
	return ks_dir_obj_path(s->dir[area], kind, id, out, cap);
}

int ks_store_has(struct ks_store *s, int area, int kind, struct kv_h128 id)
{
	pthread_mutex_lock(&s->mu);
	int have = ks_cat_find(s->cat, area, kind, id) >= 0;
	pthread_mutex_unlock(&s->mu);
	if (have || atomic_load(&s->scan_done))
		return have;
	char path[4096];
	struct stat sb;
	return ks_store_path(s, area, kind, id, path, sizeof path) == KV_OK && stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

void ks_store_reject(struct ks_store *s, const char *path, int area, int kind, struct kv_h128 id, int bad)
{
	int corrupt = bad != KS_BAD_NS && bad != KS_BAD_VERSION && bad != KS_BAD_IO && bad != KS_BAD_NONE;
	char tag[33];
	kv_h128_hex(s->p.ns, tag);
	pthread_mutex_lock(&s->mu);
	if (bad > 0 && bad < KS_BAD__COUNT)
		s->st.bad[bad]++;
	int32_t i = ks_cat_find(s->cat, area, kind, id);
	if (i >= 0 && corrupt)
		ks_cat_del(s->cat, i);
	if (corrupt)
		s->st.quarantined++;
	pthread_mutex_unlock(&s->mu);
	if (!corrupt)
		return;
	KV_WARN("store.quarantine", "file=%s reason=%s err=\"%s\"", path, ks_bad_name(bad), kv_errmsg());
	ks_dir_quarantine(s->root, path, tag, s->p.quarantine_bytes);
}

void ks_store_write_failed(struct ks_store *s, int rc, const char *what)
{
	const char *msg = kv_errmsg();
	int w;
	if (rc == KV_ERR_FULL)
		w = strstr(msg, "cap") ? KS_WERR_CAP : KS_WERR_ENOSPC;
	else if (strstr(msg, "Read-only") || strstr(msg, "Permission denied") || strstr(msg, "Operation not permitted"))
		w = KS_WERR_READONLY;
	else if (strstr(msg, "fdatasync") || strstr(msg, "fsync"))
		w = KS_WERR_FSYNC;
	else
		w = KS_WERR_EIO;
	pthread_mutex_lock(&s->mu);
	s->st.write_errors[w]++;
	int first = !s->logged_werr[w];
	s->logged_werr[w] = 1;
	if (w == KS_WERR_READONLY)
		s->writable = 0;
	pthread_mutex_unlock(&s->mu);
	if (first)
		KV_WARN("store.write_failed",
			"kind=%s object=%s err=\"%s\" msg=\"disk cache write failed; serving from RAM (logged once per "
			"kind)\"",
			ks_werr_name(w), what, msg);
}

int ks_store_is_boundary_locked(const struct ks_store *s, struct kv_h128 id)
{
	for (uint32_t i = 0; i < s->bring_n; i++)
		if (kv_h128_eq(s->bring[i], id))
			return 1;
	return 0;
}

/*
 * Run fn(ctx, i) for i in [0, n) on up to max_threads threads (the caller
 * is one of them). Used for waits on the device: data and folder syncs
 * issued together let the kernel and the device merge their cache flushes
 * and journal commits (measured here: 30 small files, 0.13-0.22 s one
 * after another, 0.01 s in parallel), and reads issued together keep the
 * device queue full while other threads check CRCs. Runs everything in
 * the calling thread when threads cannot start.
 */
struct par {
	void (*fn)(void *ctx, size_t i);
	void *ctx;
	size_t n, stride, first;
};

static void *par_main(void *arg)
{
	struct par *p = arg;
	for (size_t i = p->first; i < p->n; i += p->stride)
		p->fn(p->ctx, i);
	return NULL;
}

void ks_par_run(size_t n, size_t max_threads, void (*fn)(void *ctx, size_t i), void *ctx)
{
	pthread_t t[KS_PAR_MAX];
	struct par p[KS_PAR_MAX];
	size_t nt = n < max_threads ? n : max_threads, started = 0;
	if (nt > KS_PAR_MAX)
		nt = KS_PAR_MAX;
	if (nt <= 1) {
		for (size_t i = 0; i < n; i++)
			fn(ctx, i);
		return;
	}
	for (size_t k = 0; k < nt; k++) {
		p[k] = (struct par){fn, ctx, n, nt, k};
		if (k > 0 && pthread_create(&t[k], NULL, par_main, &p[k]) == 0)
			started |= (size_t)1 << k;
	}
	par_main(&p[0]);
	for (size_t k = 1; k < nt; k++) {
		if (started & ((size_t)1 << k))
			pthread_join(t[k], NULL);
		else
			par_main(&p[k]);
	}
}

struct kv_h128 *ks_store_chain(const struct ks_store *s, const int32_t *tok, uint32_t n, uint32_t *nh)
{
	uint32_t K = n / s->B;
	struct kv_h128 *h = malloc(((size_t)K + 1) * sizeof *h);
	if (!h)
		return NULL;
	h[0] = s->p.ns;
	for (uint32_t k = 1; k <= K; k++)
		h[k] = kc_chain_hash(h[k - 1], tok + (size_t)(k - 1) * s->B, s->B);
	*nh = K + 1;
	return h;
}

size_t ks_view_objs(const struct ks_store *s, const struct kc_view *v, struct ks_obj_src *o)
{
	size_t n = 0;
	if (v->kind == KC_OBJ_BLOCK) {
		o[n++] = (struct ks_obj_src){.kind = KS_BLOCK, .ns = s->p.ns, .id = v->id, .parent = v->parent,
					     .pos = v->pos, .tokens = v->tokens, .n_tokens = v->n_tokens,
					     .kv = v->page->data};
	} else if (v->kind == KC_OBJ_RP) {
		if (v->n_tokens)
			o[n++] = (struct ks_obj_src){.kind = KS_TAIL, .ns = s->p.ns, .id = v->id, .parent = v->parent,
						     .pos = v->pos, .tokens = v->tokens, .n_tokens = v->n_tokens,
						     .kv = v->tail_kv};
		if (v->snap && s->hybrid && v->snap_bytes == s->L.snapshot_bytes)
			o[n++] = (struct ks_obj_src){.kind = KS_SNAP, .ns = s->p.ns, .id = v->id, .parent = v->parent,
						     .pos = v->pos, .tokens = v->tokens, .n_tokens = v->n_tokens,
						     .snap = v->snap, .anchor_flag = v->anchor};
	} else if (v->kind == KC_OBJ_ENTRY) {
		o[n++] = (struct ks_obj_src){.kind = KS_ENTRY, .ns = s->p.ns, .id = v->id, .parent = v->parent,
					     .pos = v->n_tokens, .tokens = v->tokens, .n_tokens = v->n_tokens,
					     .ckpt = v->ckpt, .n_ckpt = v->n_ckpt, .anchor = v->anchor_pos};
	}
	return n;
}

int ks_entry_needs(const struct ks_store *s, const int32_t *tok, uint32_t n, const uint32_t *ck, uint32_t n_ck,
		   struct ks_need **out, size_t *count)
{
	uint32_t nh, B = s->B;
	struct kv_h128 *h = ks_store_chain(s, tok, n, &nh);
	struct ks_need *nd = h ? malloc(((size_t)nh + 2 * ((size_t)n_ck + 1)) * sizeof *nd) : NULL;
	size_t k = 0;
	*out = NULL;
	*count = 0;
	if (!nd) {
		free(h);
		return kv_fail(KV_ERR_NOMEM, "entry of %u tokens: out of memory", n);
	}
	for (uint32_t b = 1; b < nh; b++)
		nd[k++] = (struct ks_need){KS_BLOCK, h[b]};
	for (uint32_t i = 0; i <= n_ck; i++) {
		uint32_t p = i < n_ck ? ck[i] : n, t = p % B;
		if (p / B >= nh)
			continue;
		struct kv_h128 id = kc_rp_id(h[p / B], tok + (size_t)(p / B) * B, t);
		if (t)
			nd[k++] = (struct ks_need){KS_TAIL, id};
		if (s->hybrid)
			nd[k++] = (struct ks_need){KS_SNAP, id};
	}
	free(h);
	*out = nd;
	*count = k;
	return KV_OK;
}

int ks_store_claim(struct ks_store *s)
{
	int rc;
	long pid = 0;
	s->unclaimed = 1;
	if ((rc = ks_dir_ensure(s->dir[KS_AREA_MAIN])) || (rc = ks_dir_ensure(s->dir[KS_AREA_CKPT])))
		return rc;
	if (s->lock_fd < 0 && (rc = ks_ns_lock(s->dir[KS_AREA_MAIN], 2.0, &s->lock_fd, &pid))) {
		if (rc != KV_ERR_NOT_OURS)
			return rc;
		pthread_mutex_lock(&s->mu);
		s->writable = 0;
		s->ns_busy = 1;
		pthread_mutex_unlock(&s->mu);
		s->unclaimed = 0;
		KV_WARN("store.ns_busy", "root=%s pid=%ld err=\"%s\" msg=\"another kvkeep server serves this namespace: "
					 "this one reads its disk cache but writes and deletes nothing; give each "
					 "server its own --cache-dir or --cache-salt\"",
			s->root, pid, kv_errmsg());
		return rc;
	}
	if ((rc = ks_ns_mark(s->dir[KS_AREA_MAIN], s->p.ns, s->label, s->p.salted, &s->L)))
		return rc;
	s->touched_ns = ks_dir_now_ns();
	s->unclaimed = 0;
	return KV_OK;
}

void ks_rate_add(struct ks_rate *r, uint64_t bytes, uint64_t ns)
{
	/* keep roughly the last few seconds of writes */
	if (r->ns > 4000000000ull) {
		r->ns /= 2;
		r->bytes /= 2;
	}
	r->bytes += bytes;
	r->ns += ns ? ns : 1;
	r->n++;
}

double ks_rate_bps(const struct ks_rate *r)
{
	return r->n && r->ns ? (double)r->bytes * 1e9 / (double)r->ns : 0;
}
