/*
 * store.c - the disk tier's facade (store.h): open/close, the disk caps,
 * rejected files, counters. The work itself is in writer.c, fetch.c,
 * scan.c and flush.c (store_int.h says who owns what).
 */
#include "store/store.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/err.h"
#include "base/io.h"
#include "base/log.h"
#include "base/mem.h"
#include "cache/budget.h"
#include "cache/names.h"
#include "store/ns.h"
#include "store/store_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *ks_werr_name(int w)
{
	static const char *const n[KS_WERR__COUNT] = {"enospc", "eio", "fsync", "readonly", "cap"};
	return w >= 0 && w < KS_WERR__COUNT ? n[w] : "?";
}

double ks_store_budget_parse(const char *env)
{
	char *end;
	double v;
	if (!env || !*env)
		return KS_SHUTDOWN_BUDGET_DEFAULT;
	errno = 0;
	v = strtod(env, &end);
	if (errno || *end || !(v >= 0) || v > 3600) {
		KV_WARN("store.budget", "value=\"%.40s\" msg=\"KVKEEP_SHUTDOWN_BUDGET is not a number of seconds: using "
					"3.5\"",
			env);
		return KS_SHUTDOWN_BUDGET_DEFAULT;
	}
	return v;
}

uint64_t ks_ckpt_cap_parse(const char *v)
{
	uint64_t x;
	if (!v || !*v)
		return KS_CKPT_MAX_BYTES_DEFAULT;
	/* the same number rule as the cache's KVKEEP_* byte counts */
	if (kc_budget_parse_u64(v, &x) != 0) {
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

void ks_store_evict_locked(struct ks_store *s, int32_t i, int ckpt_rule)
{
	const struct ks_rec *r = ks_cat_at(s->cat, i);
	char path[4096];
	if (!r)
		return;
	/* unlink under the lock: a short metadata call, and it keeps the
	 * catalog and the folder in agreement (a path that cannot be built
	 * names no file: nothing to unlink) */
	if (ks_store_path(s, r->area, r->kind, r->id, path, sizeof path) == KV_OK && kv_io_unlink(path) != 0 &&
	    errno != ENOENT)
		return;
	if (ckpt_rule)
		s->st.ckpt_evictions++;
	else
		s->st.evictions++;
	ks_cat_del(s->cat, i);
}

/* Evict from `order` until fits(s) says stop. Returns bytes freed. */
static uint64_t evict_order(struct ks_store *s, int32_t *order, size_t n, int ckpt_rule, uint64_t need_free)
{
	uint64_t freed = 0;
	for (size_t k = 0; k < n && freed < need_free; k++) {
		const struct ks_rec *r = ks_cat_at(s->cat, order[k]);
		if (!r)
			continue;
		uint64_t b = r->bytes;
		size_t before = ks_cat_count(s->cat, -1);
		ks_store_evict_locked(s, order[k], ckpt_rule);
		if (ks_cat_count(s->cat, -1) < before)
			freed += b;
	}
	return freed;
}

/* Evict up to k records in order; returns how many went. */
static size_t evict_count(struct ks_store *s, int32_t *order, size_t n, size_t k)
{
	size_t gone = 0;
	for (size_t i = 0; i < n && gone < k; i++) {
		size_t before = ks_cat_count(s->cat, -1);
		if (!ks_cat_at(s->cat, order[i]))
			continue;
		ks_store_evict_locked(s, order[i], 0);
		gone += before - ks_cat_count(s->cat, -1);
	}
	return gone;
}

int ks_store_make_room(struct ks_store *s, uint64_t need)
{
	uint64_t total = 0, avail = 0, used, over = 0;
	int have_fs = ks_dir_fs(s->dir[KS_AREA_MAIN], &total, &avail) == KV_OK;
	int32_t *order = NULL;
	size_t n = 0;
	pthread_mutex_lock(&s->mu);
	used = ks_cat_bytes(s->cat, -1);
	if (used + need > s->cap_bytes)
		over = used + need - s->cap_bytes;
	if (have_fs && avail < need + s->reserve_bytes && need + s->reserve_bytes - avail > over)
		over = need + s->reserve_bytes - avail;
	if (over && ks_cat_order(s->cat, -1, 0, &order, &n) == KV_OK) {
		uint64_t freed = evict_order(s, order, n, 0, over);
		free(order);
		if (freed < over) {
			pthread_mutex_unlock(&s->mu);
			return kv_fail(KV_ERR_FULL, "disk cache cap: %llu bytes more do not fit (cap %llu, free %llu)",
				       (unsigned long long)need, (unsigned long long)s->cap_bytes,
				       (unsigned long long)avail);
		}
	}
	/* the object cap bounds the index's memory and the startup scan: past
	 * it, evict down to 95% so the sort is not paid on every write */
	size_t cnt = ks_cat_count(s->cat, -1), add = need ? 1 : 0;
	if (s->max_files && cnt + add > s->max_files) {
		size_t target = s->max_files - s->max_files / 20;
		order = NULL;
		if (ks_cat_order(s->cat, -1, 0, &order, &n) == KV_OK) {
			evict_count(s, order, n, cnt + add - target);
			free(order);
		}
		if (ks_cat_count(s->cat, -1) + add > s->max_files) {
			pthread_mutex_unlock(&s->mu);
			return kv_fail(KV_ERR_FULL, "disk cache cap: %zu objects (the object cap)", s->max_files);
		}
	}
	pthread_mutex_unlock(&s->mu);
	return KV_OK;
}

void ks_store_enforce_caps(struct ks_store *s)
{
	int32_t *order = NULL;
	size_t n = 0;
	ks_store_make_room(s, 0);
	pthread_mutex_lock(&s->mu);
	uint64_t cb = ks_cat_bytes(s->cat, KS_AREA_CKPT);
	if (s->ckpt_cap_bytes && cb > s->ckpt_cap_bytes && ks_cat_order(s->cat, KS_AREA_CKPT, 1, &order, &n) == KV_OK) {
		evict_order(s, order, n, 1, cb - s->ckpt_cap_bytes);
		free(order);
	}
	s->last_enforce_ns = (int64_t)kv_now_ns();
	pthread_mutex_unlock(&s->mu);
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

int ks_store_open(const struct ks_params *p, struct ks_store **out)
{
	struct ks_store *s;
	int rc;
	*out = NULL;
	if (!p || !p->root || !*p->root || !p->layout || p->layout->page_tokens <= 0)
		return kv_fail(KV_ERR_INVALID, "disk cache: no folder or layout");
	s = calloc(1, sizeof *s);
	if (!s)
		return kv_fail(KV_ERR_NOMEM, "disk cache: out of memory");
	s->p = *p;
	s->lock_fd = -1;
	s->L = *p->layout;
	s->p.layout = &s->L;
	s->B = (uint32_t)s->L.page_tokens;
	s->hybrid = s->L.n_rec_layers > 0;
	if ((rc = kv_path_fmt(s->root, sizeof s->root, "%s", p->root))) {
		free(s);
		return kv_fail_ctx(rc, "disk cache");
	}
	/* the label is shown, never a path: a long one is cut */
	snprintf(s->label, sizeof s->label, "%.*s", (int)sizeof s->label - 1, p->label ? p->label : "");
	s->p.root = s->root;
	s->p.label = s->label;
	if (!s->p.queue_cap)
		s->p.queue_cap = 4;
	if (s->p.scan_max_s <= 0)
		s->p.scan_max_s = 120;
	if (s->p.ns_max_age_s <= 0)
		s->p.ns_max_age_s = KS_NS_MAX_AGE_S;
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->wmu, NULL);
	pthread_cond_init(&s->cv, NULL);
	atomic_init(&s->scan_done, 0);
	s->cat = ks_cat_create();
	s->pend = malloc(KS_MAX_PENDING_SYNC * sizeof *s->pend);
	s->stg = malloc(KS_MAX_STAGED * sizeof *s->stg);
	if (!s->cat || !s->pend || !s->stg) {
		ks_store_close(s);
		return kv_fail(KV_ERR_NOMEM, "disk cache: out of memory");
	}
	/* every object path must fit (then ks_store_path never fails) */
	for (int a = 0; a < KS_AREA__COUNT; a++) {
		char probe[sizeof s->dir[a]];
		rc = ks_dir_ns_path(s->root, s->p.ns, a, s->dir[a], sizeof s->dir[a]);
		for (int k = KS_BLOCK; !rc && k < KS_KIND__END; k++)
			rc = ks_dir_obj_path(s->dir[a], k, s->p.ns, probe, sizeof probe);
		if (rc) {
			ks_store_close(s);
			return kv_fail_ctx(rc, "disk cache");
		}
	}

	/* folders, lock and marker. A folder we cannot write makes a read-only
	 * store; a full disk is the same degraded-but-retrying state as an
	 * ENOSPC during the run (the writer claims the namespace once there
	 * is room); another server on the namespace makes a store that reads
	 * and never writes or deletes. */
	s->writable = 1;
	if (p->tool) {
		s->p.no_threads = 1;
	} else if ((rc = ks_store_claim(s)) == KV_ERR_FULL) {
		ks_store_write_failed(s, rc, "namespace");
	} else if (rc && rc != KV_ERR_NOT_OURS) {
		s->writable = 0;
		s->unclaimed = 0;
		s->st.write_errors[KS_WERR_READONLY]++;
		s->logged_werr[KS_WERR_READONLY] = 1;
		KV_WARN("store.readonly", "root=%s err=\"%s\" msg=\"cannot write the disk cache folder: the disk tier is "
					  "read-only, serving from RAM\"",
			s->root, kv_errmsg());
	}

	/* caps */
	uint64_t total = 0, avail = 0;
	if (ks_dir_fs(s->writable ? s->dir[KS_AREA_MAIN] : s->root, &total, &avail) != KV_OK)
		total = avail = 0;
	s->cap_bytes = p->max_bytes ? p->max_bytes : (total ? total / 10 : (10ull << 30));
	s->max_files = p->max_files ? (size_t)p->max_files : KS_MAX_FILES_DEFAULT;
	s->reserve_bytes = p->reserve_bytes ? p->reserve_bytes : (total / 20 < (4ull << 30) ? total / 20 : (4ull << 30));
	s->ckpt_cap_bytes = ks_ckpt_cap_parse(p->env_ckpt_max ? p->env_ckpt_max : kv_env(KV_ENV_KV_CHECKPOINT_MAX_BYTES));

	if (!p->no_threads) {
		s->writer_running = 1;
		if (pthread_create(&s->writer, NULL, ks_writer_main, s)) {
			s->writer_running = 0;
			ks_store_close(s);
			return kv_fail(KV_ERR_NOMEM, "disk cache: cannot start the writer thread");
		}
	}
	char hex[33];
	kv_h128_hex(s->p.ns, hex);
	KV_INFO("store.open", "root=%s namespace=%s writable=%d cap_mb=%llu max_files=%zu reserve_mb=%llu ckpt_cap_mb=%llu "
			      "ckpt_interval=%u",
		s->root, hex, s->writable, (unsigned long long)(s->cap_bytes >> 20), s->max_files,
		(unsigned long long)(s->reserve_bytes >> 20), (unsigned long long)(s->ckpt_cap_bytes >> 20),
		s->p.ckpt_interval);
	*out = s;
	return KV_OK;
}

void ks_store_close(struct ks_store *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->stop = 1;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (s->writer_running)
		pthread_join(s->writer, NULL);
	if (s->scan_running)
		pthread_join(s->scanner, NULL);
	while (s->q_head) {
		struct ks_ckpt_job *j = s->q_head;
		s->q_head = j->next;
		ks_writer_job_free(j);
	}
	if (s->lock_fd >= 0)
		kv_io_close(s->lock_fd); /* releases the namespace lock */
	ks_cat_destroy(s->cat);
	free(s->tool_order);
	for (size_t i = 0; s->stg && i < s->n_stg; i++)
		ks_obj_stage_abort(&s->stg[i].st);
	free(s->stg);
	free(s->pend);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->wmu);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

void ks_store_start_scan(struct ks_store *s)
{
	if (!s || s->scan_started)
		return;
	s->scan_started = 1;
	if (s->p.no_threads) {
		ks_scan_run(s);
		return;
	}
	s->scan_running = 1;
	if (pthread_create(&s->scanner, NULL, ks_scan_main, s)) {
		s->scan_running = 0;
		s->scan_started = 0;
		KV_WARN("store.scan", "msg=\"cannot start the scan thread: scanning in the caller\"");
		ks_scan_run(s);
	}
}

int ks_store_scan_done(struct ks_store *s)
{
	return s && atomic_load(&s->scan_done);
}

int ks_store_fetch(struct ks_store *s, const struct ks_req *rq, struct ks_fetch *out)
{
	memset(out, 0, sizeof *out);
	if (!s || !rq || !rq->tokens || rq->n < 2)
		return KV_OK;
	return ks_fetch_run(s, rq, out);
}

uint32_t ks_store_probe(struct ks_store *s, const int32_t *tok, uint32_t n, const uint32_t *bounds,
			size_t n_bounds)
{
	if (!s || !tok || n < 2)
		return 0;
	return ks_fetch_probe(s, tok, n, bounds, n_bounds);
}

size_t ks_store_drain(struct ks_store *s)
{
	return s ? ks_writer_drain(s, 0) : 0;
}

void ks_store_kick(struct ks_store *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->kicked = 1;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

uint32_t ks_store_ckpt_interval(const struct ks_store *s)
{
	return s ? s->p.ckpt_interval : 0;
}

int ks_store_ckpt(struct ks_store *s, const int32_t *tok, uint32_t n, struct kv_page *const *pages,
		  ks_snap_fill_fn snap_fill, void *ctx)
{
	struct ks_ckpt_job *j;
	uint32_t nfull, t;
	int rc;
	if (!s || !tok || !n || !pages)
		return kv_fail(KV_ERR_INVALID, "disk checkpoint: nothing to save");
	pthread_mutex_lock(&s->mu);
	int full = s->q_len >= s->p.queue_cap || !s->writable;
	if (full)
		s->st.drops++;
	pthread_mutex_unlock(&s->mu);
	if (full)
		return kv_fail(KV_ERR_FULL, "disk checkpoint queue is full: dropped");
	j = calloc(1, sizeof *j);
	if (!j)
		return kv_fail(KV_ERR_NOMEM, "disk checkpoint: out of memory");
	nfull = n / s->B;
	t = n % s->B;
	j->n = n;
	j->created = (int64_t)time(NULL);
	j->tokens = malloc((size_t)n * sizeof *j->tokens);
	j->pages = malloc(((size_t)nfull + 1) * sizeof *j->pages);
	if (!j->tokens || !j->pages)
		goto nomem;
	memcpy(j->tokens, tok, (size_t)n * sizeof *tok);
	/* full pages are immutable: a reference is all the writer needs */
	for (uint32_t i = 0; i < nfull; i++) {
		kv_page_ref(pages[i]);
		j->pages[j->n_pages++] = pages[i];
	}
	if (t) {
		/* the last page is still being written by decode: copy its rows */
		j->tail = kv_alloc(KV_MEM_CACHE, ke_layout_tail_bytes(&s->L, (int)t));
		if (!j->tail)
			goto nomem;
		ke_layout_copy_rows(&s->L, j->tail, (int)t, pages[nfull]->data, s->L.page_tokens, (int)t);
	}
	if (s->hybrid) {
		j->snap = kv_alloc(KV_MEM_CACHE, s->L.snapshot_bytes);
		if (!j->snap)
			goto nomem;
		if (!snap_fill || (rc = snap_fill(ctx, j->snap, s->L.snapshot_bytes))) {
			ks_writer_job_free(j);
			return kv_fail(KV_ERR_INVALID, "disk checkpoint: no recurrent state at %u", n);
		}
	}
	pthread_mutex_lock(&s->mu);
	if (s->q_len >= s->p.queue_cap) {
		s->st.drops++;
		pthread_mutex_unlock(&s->mu);
		ks_writer_job_free(j);
		return kv_fail(KV_ERR_FULL, "disk checkpoint queue is full: dropped");
	}
	if (s->q_tail)
		s->q_tail->next = j;
	else
		s->q_head = j;
	s->q_tail = j;
	s->q_len++;
	s->st.ckpts_queued++;
	s->kicked = 1;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return KV_OK;
nomem:
	ks_writer_job_free(j);
	return kv_fail(KV_ERR_NOMEM, "disk checkpoint: out of memory");
}

int ks_store_flush(struct ks_store *s, double budget_s, struct ks_flush_report *rep)
{
	struct ks_flush_report dummy;
	if (!rep)
		rep = &dummy;
	memset(rep, 0, sizeof *rep);
	if (!s)
		return KV_OK;
	return ks_flush_run(s, budget_s, rep);
}

void ks_store_stats(struct ks_store *s, struct ks_stats *out)
{
	pthread_mutex_lock(&s->mu);
	*out = s->st;
	out->writable = s->writable;
	out->scan_done = atomic_load(&s->scan_done);
	for (int a = 0; a < 2; a++) {
		out->files[a] = ks_cat_count(s->cat, a);
		out->bytes[a] = ks_cat_bytes(s->cat, a);
	}
	out->cap_bytes = s->cap_bytes;
	out->reserve_bytes = s->reserve_bytes;
	out->ckpt_cap_bytes = s->ckpt_cap_bytes;
	out->queue_len = s->q_len;
	out->write_bps = ks_rate_bps(&s->rate);
	pthread_mutex_unlock(&s->mu);
}

uint64_t ks_store_disk_bytes(struct ks_store *s)
{
	pthread_mutex_lock(&s->mu);
	uint64_t b = ks_cat_bytes(s->cat, -1);
	pthread_mutex_unlock(&s->mu);
	return b;
}

/* The next live record of the tool order (caller holds mu); -1 none. */
static int32_t next_victim_locked(struct ks_store *s)
{
	if (!s->tool_order && ks_cat_order(s->cat, -1, 0, &s->tool_order, &s->tool_n) != KV_OK)
		return -1;
	while (s->tool_i < s->tool_n && !ks_cat_at(s->cat, s->tool_order[s->tool_i]))
		s->tool_i++;
	return s->tool_i < s->tool_n ? s->tool_order[s->tool_i] : -1;
}

int64_t ks_store_next_victim(struct ks_store *s)
{
	pthread_mutex_lock(&s->mu);
	int32_t i = next_victim_locked(s);
	int64_t k = i >= 0 ? ks_cat_at(s->cat, i)->eff : INT64_MAX;
	pthread_mutex_unlock(&s->mu);
	return k;
}

uint64_t ks_store_evict_next(struct ks_store *s)
{
	uint64_t freed = 0;
	pthread_mutex_lock(&s->mu);
	int32_t i = next_victim_locked(s);
	if (i >= 0) {
		uint64_t b = ks_cat_at(s->cat, i)->bytes;
		ks_store_evict_locked(s, i, 0);
		if (!ks_cat_at(s->cat, i))
			freed = b;
		else
			s->tool_i++; /* could not delete it: move on */
	}
	pthread_mutex_unlock(&s->mu);
	return freed;
}

const char *ks_store_root(const struct ks_store *s)
{
	return s->root;
}

const char *ks_store_ns_dir(const struct ks_store *s)
{
	return s->dir[KS_AREA_MAIN];
}

size_t ks_store_list_entries(struct ks_store *s, struct ks_entry_info *out, size_t max)
{
	size_t n = 0;
	pthread_mutex_lock(&s->mu);
	int32_t end = ks_cat_end(s->cat);
	for (int32_t i = 0; i < end; i++) {
		const struct ks_rec *r = ks_cat_at(s->cat, i);
		if (!r || !r->live || r->kind != KS_ENTRY || r->area != KS_AREA_MAIN)
			continue;
		if (n < max)
			out[n] = (struct ks_entry_info){.tokens = r->pos, .anchor = r->anchor_pos,
							.last_use_ms = r->mtime / 1000000, .bytes = r->bytes, .id = r->id};
		n++;
	}
	pthread_mutex_unlock(&s->mu);
	return n;
}
