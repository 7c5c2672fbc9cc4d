/*
 * writer.c - object writes and the write-behind thread (store_int.h).
 *
 * The thread takes the cache's dirty objects one at a time (so a stop
 * request never strands an object it took but did not write) and the
 * queued interval checkpoints, writes them with the durable protocol minus
 * the folder sync, and syncs every touched folder once per batch. Objects
 * already on disk (content-addressed names) are not written again. An
 * entry manifest is written only when every block and resume point it
 * needs is on disk, so a manifest never promises what is not there.
 *
 * Write-behind writes go straight from the cache's memory (pages are
 * immutable and pinned by the view): nothing is copied. Only the shutdown
 * flush, which must be able to stop at a deadline, copies tensor by tensor
 * (obj.h).
 */
#include "base/clock.h"
#include "base/err.h"
#include "base/io.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/durable.h"
#include "cache/names.h"
#include "store/ns.h"
#include "store/store_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static unsigned shard_of(struct kv_h128 id)
{
	return (unsigned)(id.hi >> 56);
}

struct dir_sync {
	char (*dir)[4096];
	int *ok, *err;
};

static void dir_sync_one(void *ctx, size_t i)
{
	struct dir_sync *d = ctx;
	d->ok[i] = kv_io_fsync_dir(d->dir[i]) == 0;
	d->err[i] = d->ok[i] ? 0 : errno;
}

/* Sync the folders of the settled objects (caller holds wmu). */
static void sync_dirs(struct ks_store *s)
{
	/* the distinct folders: the namespace folders that got new shards,
	 * then each shard folder holding a new object */
	size_t cap = s->n_pend + KS_AREA__COUNT, nd = 0;
	char (*dir)[4096] = malloc(cap * sizeof *dir);
	int *ok = malloc(cap * sizeof *ok), *err = malloc(cap * sizeof *err);
	if (!dir || !ok || !err) {
		free(dir);
		free(ok);
		free(err);
		return; /* objects stay unsynced folder-wise; a crash may lose them, never tear them */
	}
	for (int a = 0; a < KS_AREA__COUNT; a++)
		if (s->ns_dir_dirty[a]) {
			snprintf(dir[nd++], sizeof dir[0], "%s", s->dir[a]);
			s->ns_dir_dirty[a] = 0;
		}
	size_t first_shard = nd;
	for (size_t i = 0; i < s->n_pend; i++) {
		char d[4096];
		snprintf(d, sizeof d, "%s", s->pend[i].path);
		char *sl = strrchr(d, '/');
		if (sl)
			*sl = 0;
		size_t k;
		for (k = first_shard; k < nd && strcmp(dir[k], d); k++)
			;
		if (k == nd)
			snprintf(dir[nd++], sizeof dir[0], "%s", d);
	}
	struct dir_sync ds = {dir, ok, err};
	ks_par_run(nd, KS_SYNC_THREADS, dir_sync_one, &ds);
	for (size_t k = 0; k < nd; k++) {
		if (ok[k])
			continue;
		size_t dl = strlen(dir[k]);
		/* a failed folder sync is never retried: its new objects do not exist */
		for (size_t i = 0; k >= first_shard && i < s->n_pend; i++) {
			struct ks_pending *q = &s->pend[i];
			if (strncmp(q->path, dir[k], dl) || q->path[dl] != '/' || strchr(q->path + dl + 1, '/'))
				continue;
			kv_io_unlink(q->path);
			pthread_mutex_lock(&s->mu);
			ks_cat_del(s->cat, ks_cat_find(s->cat, q->area, q->kind, q->id));
			pthread_mutex_unlock(&s->mu);
		}
		ks_store_write_failed(s, kv_fail(kv_io_errno_code(err[k]), "fsync folder %s: %s", dir[k], strerror(err[k])),
				      "folder");
	}
	free(dir);
	free(ok);
	free(err);
	s->n_pend = 0;
}

struct commit_ctx {
	struct ks_stage_rec *stg;
	int *rc;
	char (*msg)[256];
};

static void commit_one(void *ctx, size_t i)
{
	struct commit_ctx *c = ctx;
	c->rc[i] = ks_obj_stage_commit(&c->stg[i].st, KV_DW_NO_DIRSYNC);
	if (c->rc[i])
		snprintf(c->msg[i], sizeof c->msg[i], "%s", kv_errmsg()); /* kv_errmsg is per thread */
}

int ks_writer_settle(struct ks_store *s, uint64_t deadline_ns)
{
	uint64_t bytes = 0;
	int rc = KV_OK;
	if (!s->n_stg)
		return KV_OK;
	if (deadline_ns && kv_now_ns() >= deadline_ns) {
		for (size_t i = 0; i < s->n_stg; i++)
			ks_obj_stage_abort(&s->stg[i].st);
		s->n_stg = 0;
		s->stg_bytes = 0;
		return kv_fail(KV_ERR_TIMEOUT, "shutdown budget reached");
	}
	int rcs[KS_MAX_STAGED];
	char msgs[KS_MAX_STAGED][256];
	struct commit_ctx cc = {s->stg, rcs, msgs};
	ks_par_run(s->n_stg, KS_SYNC_THREADS, commit_one, &cc);
	for (size_t i = 0; i < s->n_stg; i++) {
		struct ks_stage_rec *g = &s->stg[i];
		if (rcs[i]) {
			ks_store_write_failed(s, kv_fail(rcs[i], "%s", msgs[i]), ks_kind_name(g->rec.kind));
			rc = rcs[i];
			continue;
		}
		if (s->n_pend >= KS_MAX_PENDING_SYNC)
			sync_dirs(s);
		struct ks_pending *p = &s->pend[s->n_pend++];
		snprintf(p->path, sizeof p->path, "%s", g->path);
		p->area = g->rec.area;
		p->kind = g->rec.kind;
		p->id = g->rec.id;
		g->rec.mtime = ks_dir_now_ns();
		pthread_mutex_lock(&s->mu);
		ks_cat_put(s->cat, &g->rec);
		s->st.written[g->rec.kind]++;
		s->st.written_bytes += g->rec.bytes;
		pthread_mutex_unlock(&s->mu);
		bytes += g->rec.bytes;
	}
	pthread_mutex_lock(&s->mu);
	if (bytes)
		ks_rate_add(&s->rate, bytes, kv_now_ns() - s->stg_t0);
	pthread_mutex_unlock(&s->mu);
	s->n_stg = 0;
	s->stg_bytes = 0;
	return rc;
}

void ks_writer_commit(struct ks_store *s)
{
	ks_writer_settle(s, 0);
	sync_dirs(s);
}

int ks_writer_put(struct ks_store *s, int area, const struct ks_obj_src *src, uint64_t deadline_ns)
{
	unsigned sh = shard_of(src->id);
	int rc;
	struct ks_obj_src o = *src;

	pthread_mutex_lock(&s->mu);
	int writable = s->writable;
	pthread_mutex_unlock(&s->mu);
	if (!writable)
		return kv_fail(KV_ERR_IO, "disk cache is read-only");
	/* a full disk at open: claim the namespace now that there may be room */
	if (s->unclaimed && (rc = ks_store_claim(s))) {
		if (rc != KV_ERR_NOT_OURS)
			ks_store_write_failed(s, rc, "namespace");
		return rc;
	}
	if (!s->shard_made[area][sh]) {
		char d[4096];
		if ((rc = ks_dir_shard_path(s->dir[area], src->id, d, sizeof d)) || (rc = ks_dir_ensure(d))) {
			ks_store_write_failed(s, rc, "folder");
			return rc;
		}
		s->shard_made[area][sh] = 1;
		s->ns_dir_dirty[area] = 1;
	}
	uint64_t need = ks_obj_data_bytes(&s->L, src->kind, src->n_tokens, src->n_ckpt) + 4096;
	if ((rc = ks_evict_make_room(s, need + s->stg_bytes))) {
		ks_store_write_failed(s, rc, ks_kind_name(src->kind));
		return rc;
	}
	if (!o.created)
		o.created = (int64_t)time(NULL);
	o.ns = s->p.ns;
	if (!s->n_stg)
		s->stg_t0 = kv_now_ns();
	struct ks_stage_rec *g = &s->stg[s->n_stg];
	rc = ks_store_path(s, area, src->kind, src->id, g->path, sizeof g->path);
	if (!rc)
		rc = ks_obj_stage(g->path, &s->L, &o, deadline_ns, &g->st);
	if (rc) {
		if (rc != KV_ERR_TIMEOUT)
			ks_store_write_failed(s, rc, ks_kind_name(src->kind));
		return rc;
	}
	g->rec = (struct ks_rec){.id = src->id,
				 .parent = src->parent,
				 .bytes = g->st.bytes,
				 .pos = src->pos,
				 .n = src->n_tokens,
				 .kind = (uint8_t)src->kind,
				 .area = (uint8_t)area,
				 .anchor = (uint8_t)(src->kind == KS_SNAP ? src->anchor_flag != 0 : src->anchor != 0),
				 .anchor_pos = src->kind == KS_ENTRY ? src->anchor : 0};
	s->n_stg++;
	s->stg_bytes += g->st.bytes;
	if (s->n_stg >= KS_MAX_STAGED || s->stg_bytes >= KS_STAGE_BYTES)
		return ks_writer_settle(s, deadline_ns);
	return KV_OK;
}

/* The object is on disk already: mark it used. */
static void touch_rec(struct ks_store *s, int area, int kind, struct kv_h128 id)
{
	pthread_mutex_lock(&s->mu);
	ks_cat_touch(s->cat, ks_cat_find(s->cat, area, kind, id), ks_dir_now_ns());
	pthread_mutex_unlock(&s->mu);
}

static int has_any(struct ks_store *s, int kind, struct kv_h128 id)
{
	return ks_store_has(s, KS_AREA_MAIN, kind, id) || ks_store_has(s, KS_AREA_CKPT, kind, id);
}

/* Every block and resume point the entry (tok, n, ckpt) needs is on disk. */
static int entry_complete(struct ks_store *s, const int32_t *tok, uint32_t n, const uint32_t *ck, uint32_t n_ck)
{
	struct ks_need *nd;
	size_t k;
	int ok;
	if (ks_entry_needs(s, tok, n, ck, n_ck, &nd, &k))
		return 0;
	ok = 1;
	for (size_t i = 0; ok && i < k; i++)
		ok = nd[i].kind == KS_BLOCK ? ks_store_has(s, KS_AREA_MAIN, KS_BLOCK, nd[i].id) : has_any(s, nd[i].kind, nd[i].id);
	free(nd);
	return ok;
}

int ks_writer_view(struct ks_store *s, const struct kc_view *v, uint64_t deadline_ns)
{
	struct ks_obj_src o[KS_VIEW_OBJS];
	size_t n = ks_view_objs(s, v, o);
	int rc = KV_OK;
	for (size_t i = 0; i < n && !rc; i++) {
		if (o[i].kind != KS_ENTRY) {
			/* content-addressed: an object on disk is the same bytes */
			if (ks_store_has(s, KS_AREA_MAIN, o[i].kind, o[i].id)) {
				if (o[i].kind == KS_BLOCK)
					touch_rec(s, KS_AREA_MAIN, KS_BLOCK, o[i].id);
				continue;
			}
			rc = ks_writer_put(s, KS_AREA_MAIN, &o[i], deadline_ns);
			continue;
		}
		if (ks_store_has(s, KS_AREA_MAIN, KS_ENTRY, o[i].id)) {
			touch_rec(s, KS_AREA_MAIN, KS_ENTRY, o[i].id);
			continue;
		}
		/* what the manifest names must be durable and known first */
		if ((rc = ks_writer_settle(s, deadline_ns)) == KV_ERR_TIMEOUT)
			return rc;
		if (!entry_complete(s, v->tokens, v->n_tokens, v->ckpt, v->n_ckpt)) {
			pthread_mutex_lock(&s->mu);
			s->st.incomplete++;
			pthread_mutex_unlock(&s->mu);
			return kv_fail(KV_ERR_NOT_FOUND, "entry of %u tokens: a block or resume point is not on disk",
				       v->n_tokens);
		}
		rc = ks_writer_put(s, KS_AREA_MAIN, &o[i], deadline_ns);
	}
	return rc;
}

uint64_t ks_writer_view_bytes(const struct ks_store *s, const struct kc_view *v)
{
	const uint64_t hdr = 2048;
	switch (v->kind) {
	case KC_OBJ_BLOCK:
		return hdr + ks_obj_data_bytes(&s->L, KS_BLOCK, s->B, 0);
	case KC_OBJ_RP:
		return (v->n_tokens ? hdr + ks_obj_data_bytes(&s->L, KS_TAIL, v->n_tokens, 0) : 0) +
		       (v->snap && s->hybrid ? hdr + ks_obj_data_bytes(&s->L, KS_SNAP, v->n_tokens, 0) : 0);
	default:
		return hdr + ks_obj_data_bytes(&s->L, KS_ENTRY, v->n_tokens, v->n_ckpt);
	}
}

int ks_writer_ckpt(struct ks_store *s, const struct ks_ckpt_job *j, uint64_t deadline_ns)
{
	uint32_t nh, B = s->B, t = j->n % B;
	struct kv_h128 *h = ks_store_chain(s, j->tokens, j->n, &nh);
	int rc = KV_OK;
	if (!h)
		return kv_fail(KV_ERR_NOMEM, "disk checkpoint: out of memory");
	/* blocks are shared with everything else: main area */
	for (uint32_t k = 1; k < nh && k <= j->n_pages && !rc; k++) {
		if (ks_store_has(s, KS_AREA_MAIN, KS_BLOCK, h[k]))
			continue;
		struct ks_obj_src o = {.kind = KS_BLOCK, .id = h[k], .parent = h[k - 1], .pos = k * B,
				       .tokens = j->tokens + (size_t)(k - 1) * B, .n_tokens = B,
				       .kv = j->pages[k - 1]->data, .created = j->created};
		rc = ks_writer_put(s, KS_AREA_MAIN, &o, deadline_ns);
	}
	struct kv_h128 node = h[j->n / B];
	const int32_t *tail = j->tokens + (size_t)(j->n / B) * B;
	struct kv_h128 id = kc_rp_id(node, tail, t);
	if (!rc && t && !has_any(s, KS_TAIL, id)) {
		struct ks_obj_src o = {.kind = KS_TAIL, .id = id, .parent = node, .pos = j->n, .tokens = tail,
				       .n_tokens = t, .kv = j->tail, .created = j->created};
		rc = ks_writer_put(s, KS_AREA_CKPT, &o, deadline_ns);
	}
	if (!rc && s->hybrid && j->snap && !has_any(s, KS_SNAP, id)) {
		struct ks_obj_src o = {.kind = KS_SNAP, .id = id, .parent = node, .pos = j->n, .tokens = tail,
				       .n_tokens = t, .snap = j->snap, .created = j->created};
		rc = ks_writer_put(s, KS_AREA_CKPT, &o, deadline_ns);
	}
	if (!rc)
		rc = ks_writer_settle(s, deadline_ns);
	if (!rc && !has_any(s, KS_ENTRY, id)) {
		struct ks_obj_src o = {.kind = KS_ENTRY, .id = id, .parent = node, .pos = j->n, .tokens = j->tokens,
				       .n_tokens = j->n, .created = j->created};
		rc = ks_writer_put(s, KS_AREA_CKPT, &o, deadline_ns);
	}
	free(h);
	if (!rc) {
		pthread_mutex_lock(&s->mu);
		s->st.ckpts_written++;
		pthread_mutex_unlock(&s->mu);
	}
	return rc;
}

void ks_writer_job_free(struct ks_ckpt_job *j)
{
	if (!j)
		return;
	for (uint32_t i = 0; i < j->n_pages; i++)
		kv_page_unref(j->pages[i]);
	free(j->pages);
	free(j->tokens);
	kv_free(j->tail);
	kv_free(j->snap);
	free(j);
}

static struct ks_ckpt_job *pop_job(struct ks_store *s)
{
	pthread_mutex_lock(&s->mu);
	struct ks_ckpt_job *j = s->q_head;
	if (j) {
		s->q_head = j->next;
		if (!s->q_head)
			s->q_tail = NULL;
		s->q_len--;
	}
	pthread_mutex_unlock(&s->mu);
	return j;
}

static int stop_requested(struct ks_store *s)
{
	pthread_mutex_lock(&s->mu);
	int st = s->stop;
	pthread_mutex_unlock(&s->mu);
	return st;
}

size_t ks_writer_drain(struct ks_store *s, int honor_stop)
{
	size_t n = 0;
	int ckpt_done = 0;
	pthread_mutex_lock(&s->wmu);
	for (;;) {
		if (honor_stop && stop_requested(s))
			break;
		struct kc_view v;
		size_t k = s->p.cache ? kc_cache_take_dirty(s->p.cache, &v, 1) : 0;
		if (k) {
			if (ks_writer_view(s, &v, 0) == KV_OK)
				n++;
			/* the same view goes on to the remote tier, written or not here */
			if (s->p.remote)
				ks_rwrite_offer(s, &v);
			else
				kc_cache_view_release(s->p.cache, &v);
			continue;
		}
		struct ks_ckpt_job *j = pop_job(s);
		if (!j)
			break;
		if (ks_writer_ckpt(s, j, 0) == KV_OK)
			n++;
		ks_writer_job_free(j);
		ckpt_done = 1;
	}
	ks_writer_commit(s);
	pthread_mutex_unlock(&s->wmu);
	if (!(honor_stop && stop_requested(s)))
		ks_echo_save(s); /* the answers remembered meanwhile (echo.c) */
	if (ckpt_done)
		ks_evict_enforce_caps(s); /* the checkpoint cap, oldest first */
	return n;
}

void *ks_writer_main(void *arg)
{
	struct ks_store *s = arg;
	pthread_mutex_lock(&s->mu);
	while (!s->stop) {
		if (!s->kicked && !s->q_head) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 200 * 1000 * 1000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&s->cv, &s->mu, &ts);
		}
		if (s->stop)
			break;
		s->kicked = 0;
		s->writer_busy = 1;
		pthread_mutex_unlock(&s->mu);
		ks_writer_drain(s, 1);
		/* the marker's mtime is the namespace's last use (ns.h): keep it
		 * fresh for scanners that do not know the lock */
		int64_t now = ks_dir_now_ns();
		if (!s->unclaimed && !s->ns_busy && now - s->touched_ns > (int64_t)KS_NS_TOUCH_S * 1000000000) {
			char mk[4200];
			snprintf(mk, sizeof mk, "%s/%s", s->dir[KS_AREA_MAIN], KS_NS_FILE);
			ks_dir_touch(mk);
			s->touched_ns = now;
		}
		pthread_mutex_lock(&s->mu);
		s->writer_busy = 0;
		pthread_cond_broadcast(&s->cv);
	}
	s->writer_busy = 0;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return NULL;
}
