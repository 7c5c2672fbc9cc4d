/*
 * flush.c - the shutdown flush (store.h ks_store_flush). The write-rate
 * estimate it predicts with is core.c's (ks_rate_add, ks_rate_bps).
 *
 * Order. What is still dirty is grouped into units: one per entry (the
 * entry's blocks and resume points not yet on disk, then its manifest),
 * entries ending at a message boundary first, newest first within each
 * group; then the objects no dirty entry needs; then queued interval
 * checkpoints. A unit is written whole or skipped.
 *
 * Budget. deadline = start + budget - headroom, headroom = min(0.5 s,
 * budget / 10), kept for the final folder syncs. Each unit's time is
 * predicted as bytes / rate: with no write sample in this process yet,
 * the rate of a 16 MiB fsynced probe, halved (serialisation overhead) and
 * clamped to 150-600 MB/s (so a page-cache-fast probe cannot
 * over-promise and a slow one cannot skip everything); afterwards the rate
 * observed on real writes - the flush's own units once there is one
 * (each unit's folder syncs are done right after it and counted), else
 * the write-behind's recent writes. A unit predicted to end past the deadline is
 * skipped and the next (maybe smaller) one is tried. Writes themselves
 * stop between tensors once the deadline passes (obj.h), so a wrong
 * prediction costs at most one tensor and one data sync.
 */
#include "base/clock.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/io.h"
#include "base/log.h"
#include "base/map.h"
#include "base/mem.h"
#include "cache/names.h"
#include "store/store_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * The write probe: up to 16 MiB written and fsynced in the namespace
 * folder, then removed. On a disk too slow to write 16 MiB in a fifth of
 * the time left, it stops there and measures what it wrote (the probe
 * must not eat the budget it is meant to plan). Returns bytes/s, 0 when
 * it could not run.
 */
static double probe(struct ks_store *s, uint64_t deadline_ns)
{
	char path[4096];
	struct kv_dw w;
	const size_t chunk = 64u << 10;
	void *buf = kv_zalloc(KV_MEM_OTHER, chunk);
	double bps = 0;
	if (!buf)
		return 0;
	if (kv_path_fmt(path, sizeof path, "%s/flush-probe", s->dir[KS_AREA_MAIN])) {
		kv_free(buf);
		return 0;
	}
	uint64_t t0 = kv_now_ns(), stop = t0 + (deadline_ns > t0 ? (deadline_ns - t0) / 5 : 0);
	if (kv_dw_begin(&w, path) == KV_OK) {
		size_t off = 0;
		int ok = 1;
		while (ok && off < KS_PROBE_BYTES && kv_now_ns() < stop) {
			ok = kv_dw_write(&w, buf, chunk) == KV_OK;
			off += ok ? chunk : 0;
		}
		if (ok && off && kv_io_fdatasync(w.fd) == 0) {
			uint64_t dt = kv_now_ns() - t0;
			bps = (double)off * 1e9 / (double)(dt ? dt : 1);
		}
		kv_dw_abort(&w);
	}
	kv_free(buf);
	return bps;
}

struct unit {
	size_t first, n;          /* range in the member list */
	uint64_t bytes;
	int entry;                /* view index of its entry, -1 none */
	int boundary;
	int job;                  /* index into jobs, -1 none */
};

struct vec {
	struct kc_view *v;
	size_t n, cap;
};

static int cmp_entries(const void *a, const void *b, void *ctx)
{
	const int *bnd = ctx;
	int x = *(const int *)a, y = *(const int *)b;
	if (bnd[x] != bnd[y])
		return bnd[y] - bnd[x]; /* boundary entries first */
	return y - x;                   /* then newest first (the dirty list is in creation order) */
}

static void key(int kind, struct kv_h128 id, uint8_t k[17])
{
	k[0] = (uint8_t)kind;
	for (int i = 0; i < 8; i++) {
		k[1 + i] = (uint8_t)(id.lo >> (8 * i));
		k[9 + i] = (uint8_t)(id.hi >> (8 * i));
	}
}

/* One ks_flush_run: what its steps share, and what `done:` frees. */
struct flush_run {
	struct ks_store *s;
	struct ks_flush_report *rep;
	uint64_t deadline;
	struct vec vv;              /* dirty views (released at the end) */
	struct ks_ckpt_job **jobs;  /* queued checkpoints (owned) */
	size_t n_jobs;
	struct unit *units;
	size_t n_units;
	size_t *mem, n_mem;         /* the units' members: indexes into vv */
	int *is_bnd, *assigned, *ents;
	struct kv_map *ix;          /* (kind, id) -> index into vv */
	double probe_bps;
	struct ks_rate frate;       /* the flush's own write rate */
};

/* 1. The writer finishes the object in hand and leaves. Returns 1 when it
 * is still busy at the deadline. */
static int stop_writer(struct ks_store *s, uint64_t deadline)
{
	pthread_mutex_lock(&s->mu);
	s->stop = 1;
	pthread_cond_broadcast(&s->cv);
	while (s->writer_busy && kv_now_ns() < deadline) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 5 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&s->cv, &s->mu, &ts);
	}
	int busy = s->writer_busy;
	pthread_mutex_unlock(&s->mu);
	return busy;
}

/* 2. Everything still dirty: the cache's views and the queued checkpoints. */
static void take_dirty(struct flush_run *f)
{
	struct ks_store *s = f->s;
	struct vec *vv = &f->vv;
	for (;;) {
		if (vv->n == vv->cap) {
			size_t nc = vv->cap ? vv->cap * 2 : 256;
			struct kc_view *nv = realloc(vv->v, nc * sizeof *nv);
			if (!nv)
				break;
			vv->v = nv;
			vv->cap = nc;
		}
		size_t k = s->p.cache ? kc_cache_take_dirty(s->p.cache, vv->v + vv->n, vv->cap - vv->n) : 0;
		if (!k)
			break;
		vv->n += k;
	}
	for (struct ks_ckpt_job *j; (pthread_mutex_lock(&s->mu), j = s->q_head, pthread_mutex_unlock(&s->mu), j);) {
		pthread_mutex_lock(&s->mu);
		s->q_head = j->next;
		if (!s->q_head)
			s->q_tail = NULL;
		s->q_len--;
		pthread_mutex_unlock(&s->mu);
		struct ks_ckpt_job **nj = realloc(f->jobs, (f->n_jobs + 1) * sizeof *nj);
		if (!nj) {
			ks_writer_job_free(j);
			continue;
		}
		f->jobs = nj;
		f->jobs[f->n_jobs++] = j;
	}
}

/* Add the dirty view (kind, id), if there is one not in a unit yet, to u. */
static void add_member(struct flush_run *f, struct unit *u, int kind, struct kv_h128 id)
{
	uint8_t kk[17];
	uint64_t vi;
	key(kind, id, kk);
	if (kv_map_get(f->ix, kk, sizeof kk, &vi) && !f->assigned[vi]) {
		f->assigned[vi] = 1;
		f->mem[f->n_mem++] = (size_t)vi;
		u->bytes += ks_writer_view_bytes(f->s, &f->vv.v[vi]);
	}
}

/* One entry's unit: its dirty blocks, then its dirty resume points (the
 * checkpoints and the end), then the entry itself. */
static void add_entry_unit(struct flush_run *f, int ent)
{
	struct ks_store *s = f->s;
	const struct kc_view *ev = &f->vv.v[ent];
	struct unit *u = &f->units[f->n_units++];
	uint32_t nh, B = s->B;
	struct kv_h128 *h = ks_store_chain(s, ev->tokens, ev->n_tokens, &nh);
	memset(u, 0, sizeof *u);
	u->first = f->n_mem;
	u->entry = ent;
	u->boundary = f->is_bnd[ent];
	u->job = -1;
	for (uint32_t k = 1; h && k < nh; k++)
		add_member(f, u, KC_OBJ_BLOCK, h[k]);
	for (uint32_t c = 0; h && c <= ev->n_ckpt; c++) {
		uint32_t p = c < ev->n_ckpt ? ev->ckpt[c] : ev->n_tokens;
		if (p / B >= nh)
			continue;
		add_member(f, u, KC_OBJ_RP, kc_rp_id(h[p / B], ev->tokens + (size_t)(p / B) * B, p % B));
	}
	free(h);
	f->assigned[ent] = 1;
	f->mem[f->n_mem++] = (size_t)ent;
	u->bytes += ks_writer_view_bytes(s, ev);
	u->n = f->n_mem - u->first;
}

/* 3. Units, in the order of the file comment: entries (boundary first,
 * newest first), the objects no entry needs, the checkpoints. */
static int make_units(struct flush_run *f)
{
	struct ks_store *s = f->s;
	struct vec *vv = &f->vv;
	f->is_bnd = calloc(vv->n + 1, sizeof *f->is_bnd);
	f->assigned = calloc(vv->n + 1, sizeof *f->assigned);
	f->ents = malloc((vv->n + 1) * sizeof *f->ents);
	f->mem = malloc((vv->n + 1) * sizeof *f->mem);
	f->units = malloc((vv->n + f->n_jobs + 1) * sizeof *f->units);
	f->ix = kv_map_create(vv->n * 2 + 16);
	if (!f->is_bnd || !f->assigned || !f->ents || !f->mem || !f->units || !f->ix)
		return kv_fail(KV_ERR_NOMEM, "flush: out of memory");
	size_t n_ents = 0;
	pthread_mutex_lock(&s->mu);
	for (size_t i = 0; i < vv->n; i++) {
		uint8_t k[17];
		key(vv->v[i].kind, vv->v[i].id, k);
		kv_map_put(f->ix, k, sizeof k, i);
		if (vv->v[i].kind == KC_OBJ_ENTRY) {
			f->is_bnd[i] = ks_store_is_boundary_locked(s, vv->v[i].id);
			f->ents[n_ents++] = (int)i;
		}
	}
	pthread_mutex_unlock(&s->mu);
	qsort_r(f->ents, n_ents, sizeof *f->ents, cmp_entries, f->is_bnd);
	for (size_t e = 0; e < n_ents; e++)
		add_entry_unit(f, f->ents[e]);
	for (size_t i = 0; i < vv->n; i++)
		if (!f->assigned[i]) {
			struct unit *u = &f->units[f->n_units++];
			memset(u, 0, sizeof *u);
			u->first = f->n_mem;
			u->n = 1;
			u->entry = -1;
			u->job = -1;
			f->mem[f->n_mem++] = i;
			u->bytes = ks_writer_view_bytes(s, &vv->v[i]);
		}
	for (size_t i = 0; i < f->n_jobs; i++) {
		struct unit *u = &f->units[f->n_units++];
		memset(u, 0, sizeof *u);
		u->entry = -1;
		u->job = (int)i;
		u->bytes = (uint64_t)f->jobs[i]->n * s->L.kv_bytes_per_token + (s->hybrid ? s->L.snapshot_bytes : 0) +
			   (uint64_t)f->jobs[i]->n * 4 + 8192;
	}
	return KV_OK;
}

/* 1 when the unit is predicted to end past the deadline (or the deadline
 * has passed): the rate is the flush's own, else the write-behind's, else
 * the probe's (run once, here). */
static int unit_late(struct flush_run *f, const struct unit *u)
{
	struct ks_store *s = f->s;
	struct ks_flush_report *rep = f->rep;
	uint64_t now = kv_now_ns(), deadline = f->deadline;
	if (rep->deadline_hit || now >= deadline)
		return 1;
	/* the flush's own units (their folder syncs included) are the
	 * best sample; then the write-behind's; then the probe */
	double bps = ks_rate_bps(&f->frate);
	if (bps <= 0) {
		pthread_mutex_lock(&s->mu);
		bps = ks_rate_bps(&s->rate);
		pthread_mutex_unlock(&s->mu);
	}
	if (bps <= 0 && !rep->probed) {
		rep->probed = 1;
		uint64_t tp = kv_now_ns();
		f->probe_bps = probe(s, deadline) / 2;
		rep->probe_seconds = (double)(kv_now_ns() - tp) / 1e9;
		if (f->probe_bps < KS_PROBE_MIN_BPS)
			f->probe_bps = KS_PROBE_MIN_BPS;
		if (f->probe_bps > KS_PROBE_MAX_BPS)
			f->probe_bps = KS_PROBE_MAX_BPS;
		now = kv_now_ns();
	}
	if (bps <= 0)
		bps = f->probe_bps > 0 ? f->probe_bps : KS_PROBE_MIN_BPS;
	if (rep->first_bps == 0)
		rep->first_bps = bps;
	double pred_ns = (double)u->bytes / bps * 1e9;
	if (now >= deadline || (double)now + pred_ns > (double)deadline) {
		KV_INFO("store.flush_skip", "entry_len=%u boundary=%d bytes=%llu predicted_ms=%.1f left_ms=%.1f",
			u->entry >= 0 ? f->vv.v[u->entry].n_tokens : 0, u->boundary, (unsigned long long)u->bytes,
			pred_ns / 1e6, now < deadline ? (double)(deadline - now) / 1e6 : 0.0);
		return 1;
	}
	return 0;
}

/* Write one unit and make it durable, counting it in the report. */
static void write_unit(struct flush_run *f, const struct unit *u)
{
	struct ks_store *s = f->s;
	struct ks_flush_report *rep = f->rep;
	int wrc = KV_OK;
	uint64_t tu0 = kv_now_ns();
	if (u->job >= 0) {
		wrc = ks_writer_ckpt(s, f->jobs[u->job], f->deadline);
		if (wrc == KV_OK)
			rep->objects_saved++;
	} else {
		for (size_t m = 0; m < u->n; m++) {
			const struct kc_view *v = &f->vv.v[f->mem[u->first + m]];
			wrc = ks_writer_view(s, v, f->deadline);
			if (wrc == KV_ERR_TIMEOUT)
				break;
			if (wrc == KV_OK)
				rep->objects_saved++;
		}
	}
	/* each unit is made durable before the next: its data and folder
	 * syncs count in the observed rate, and the final commit stays
	 * small; staged data past the deadline is abandoned, not synced */
	if (ks_writer_settle(s, f->deadline) == KV_ERR_TIMEOUT)
		wrc = KV_ERR_TIMEOUT;
	ks_writer_commit(s);
	ks_rate_add(&f->frate, u->bytes, kv_now_ns() - tu0);
	rep->write_seconds += (double)(kv_now_ns() - tu0) / 1e9;
	if (wrc == KV_ERR_TIMEOUT) {
		rep->deadline_hit = 1;
		rep->bytes_skipped += u->bytes;
		if (u->entry >= 0)
			rep->entries_skipped++;
		return;
	}
	rep->bytes_saved += u->bytes;
	if (u->entry >= 0) {
		if (ks_store_has(s, KS_AREA_MAIN, KS_ENTRY, f->vv.v[u->entry].id)) {
			if (!rep->entries_saved) {
				rep->first_entry_len = f->vv.v[u->entry].n_tokens;
				rep->first_entry_boundary = u->boundary;
			}
			rep->entries_saved++;
		} else {
			rep->entries_skipped++;
		}
	}
}

/* The flush's counters and its log line. */
static void count_flush(struct ks_store *s, const struct ks_flush_report *rep, double budget_s)
{
	pthread_mutex_lock(&s->mu);
	s->st.flush_entries_saved += rep->entries_saved;
	s->st.flush_entries_skipped += rep->entries_skipped;
	s->st.flush_bytes += rep->bytes_saved;
	s->st.flush_seconds += rep->seconds;
	pthread_mutex_unlock(&s->mu);
	KV_INFO("store.flush",
		"saved_entries=%u saved_objects=%u saved_mb=%.1f skipped_entries=%u skipped_objects=%u skipped_mb=%.1f "
		"first_entry_len=%u first_boundary=%d ms=%.1f budget_ms=%.0f rate_mbps=%.0f probed=%d deadline_hit=%d",
		rep->entries_saved, rep->objects_saved, (double)rep->bytes_saved / 1e6, rep->entries_skipped,
		rep->objects_skipped, (double)rep->bytes_skipped / 1e6, rep->first_entry_len, rep->first_entry_boundary,
		rep->seconds * 1e3, budget_s * 1e3, rep->first_bps / 1e6, rep->probed, rep->deadline_hit);
}

int ks_flush_run(struct ks_store *s, double budget_s, struct ks_flush_report *rep)
{
	uint64_t t0 = kv_now_ns();
	double head = budget_s / 10 < 0.5 ? budget_s / 10 : 0.5;
	struct flush_run f = {.s = s, .rep = rep};
	int rc = KV_OK;

	f.deadline = t0 + (uint64_t)((budget_s - head > 0 ? budget_s - head : 0) * 1e9);
	rep->budget_s = budget_s;
	if (stop_writer(s, f.deadline)) {
		KV_WARN("store.flush", "msg=\"the writer is still busy at the deadline: nothing flushed\"");
		rep->seconds = (double)(kv_now_ns() - t0) / 1e9;
		return KV_ERR_TIMEOUT;
	}
	ks_rwrite_halt(s); /* remote writes still queued are dropped: the budget is the disk's */
	ks_echo_save(s); /* the answer records first: small, and a replayed session needs them */
	pthread_mutex_lock(&s->wmu);
	take_dirty(&f);
	if (!f.vv.n && !f.n_jobs)
		goto done;
	if ((rc = make_units(&f)))
		goto done;

	/* 4. write, unit by unit, while the predictions fit */
	for (size_t ui = 0; ui < f.n_units; ui++) {
		const struct unit *u = &f.units[ui];
		if (unit_late(&f, u)) {
			rep->bytes_skipped += u->bytes;
			rep->objects_skipped += u->job >= 0 ? 1 : (uint32_t)u->n;
			if (u->entry >= 0)
				rep->entries_skipped++;
			continue;
		}
		write_unit(&f, u);
	}

done:
	/* 5. the folder syncs (the headroom is for these) */
	ks_writer_commit(s);
	pthread_mutex_unlock(&s->wmu);
	for (size_t i = 0; i < f.vv.n; i++)
		kc_cache_view_release(s->p.cache, &f.vv.v[i]);
	for (size_t i = 0; i < f.n_jobs; i++)
		ks_writer_job_free(f.jobs[i]);
	free(f.vv.v);
	free(f.jobs);
	free(f.units);
	free(f.mem);
	free(f.is_bnd);
	free(f.assigned);
	free(f.ents);
	kv_map_destroy(f.ix);
	rep->seconds = (double)(kv_now_ns() - t0) / 1e9;
	count_flush(s, rep, budget_s);
	return rc;
}
