/*
 * store.c - the disk tier's facade (store.h): open/close, the shutdown
 * budget, the checkpoint queue, counters and listings. The work itself is
 * in writer.c, fetch.c, scan.c and flush.c, eviction in evict.c, and what
 * they share in core.c (store_int.h says who owns what and which way
 * calls go).
 */
#include "store/store.h"
#include "base/env.h"
#include "base/err.h"
#include "base/io.h"
#include "base/log.h"
#include "base/mem.h"
#include "store/ns.h"
#include "store/store_int.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double ks_store_budget_parse(const char *env)
{
	char *end;
	double v;
	if (!env || !*env)
		return KS_SHUTDOWN_BUDGET_DEFAULT;
	errno = 0;
	v = strtod(env, &end);
	if (errno || *end || !(v >= 0) || v > 3600) {
		/* read at every shutdown step and dashboard poll: said once */
		static atomic_int warned;
		if (!atomic_exchange(&warned, 1))
			KV_WARN("store.budget", "value=\"%.40s\" msg=\"KVKEEP_SHUTDOWN_BUDGET is not a number of seconds: using "
					"3.5\"",
			env);
		return KS_SHUTDOWN_BUDGET_DEFAULT;
	}
	return v;
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
	s->hybrid = ke_layout_nontrim(&s->L);
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

	if (s->p.remote && !p->tool && (rc = ks_rwrite_start(s))) {
		s->p.remote = NULL;
		KV_WARN("remote.disabled", "err=\"%s\" msg=\"no remote writer for this namespace: it only reads the remote "
					    "tier\"",
			kv_errmsg());
	}
	if (p->tool)
		s->p.remote = NULL;
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
	ks_echo_load(s); /* answers remembered before a restart, before any request */
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
	ks_rwrite_stop(s); /* after the disk writer: it hands views on */
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

int ks_store_fetch_remote(struct ks_store *s, const struct ks_req *rq, struct ks_fetch *out)
{
	memset(out, 0, sizeof *out);
	if (!s || !s->p.remote || !rq || !rq->tokens || rq->n < 2)
		return KV_OK;
	return ks_fetch_remote(s, rq, out);
}

int ks_store_has_remote(const struct ks_store *s)
{
	return s && s->p.remote;
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
	if (!s)
		return 0;
	size_t n = ks_writer_drain(s, 0);
	if (s->p.no_threads)
		ks_rwrite_drain(s); /* tests: the remote writer's queue too */
	return n;
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
		if (n < max) {
			/* what the entry takes on disk: its manifest, the tail and
			 * snapshot of its end (same id), and the blocks up to it (its
			 * parent chain), as `kvkeep cache ls` counts them (which adds
			 * its checkpoints' snapshots) */
			uint64_t bytes = r->bytes;
			for (int k = KS_TAIL; k <= KS_SNAP; k++) {
				int32_t j = ks_cat_find(s->cat, KS_AREA_MAIN, k, r->id);
				if (j >= 0)
					bytes += ks_cat_at(s->cat, j)->bytes;
			}
			struct kv_h128 p = r->parent;
			/* a chain is at most one block per token long: a bound, not a hope */
			for (uint32_t hops = 0; hops <= r->pos; hops++) {
				int32_t j = ks_cat_find(s->cat, KS_AREA_MAIN, KS_BLOCK, p);
				if (j < 0)
					break;
				const struct ks_rec *b = ks_cat_at(s->cat, j);
				bytes += b->bytes;
				p = b->parent;
			}
			out[n] = (struct ks_entry_info){.tokens = r->pos, .anchor = r->anchor_pos,
							.last_use_ms = r->mtime / 1000000, .bytes = bytes, .id = r->id};
		}
		n++;
	}
	pthread_mutex_unlock(&s->mu);
	return n;
}
