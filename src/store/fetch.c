/*
 * fetch.c - disk lookups and loads into the RAM cache (store.h "fetch").
 *
 * Plan. With h_k the prompt's chain hashes (h_0 = namespace), the disk
 * can resume the prompt at position p <= n - 1 when
 *   - blocks h_1 .. h_{floor(p/B)} are on disk, and
 *   - p is a block end (dense only), or a resume point (j, t) with
 *     p = jB + t whose id kc_rp_id(h_j, prompt[jB, p)) names a tail file
 *     (t > 0) and, for hybrid models, a snapshot file.
 * After the scan the catalog answers both questions (the rps hanging
 * under each h_j are its children). Before it, the file names are tried
 * directly: blocks in order, then the resume points a stored entry can
 * have on this prompt - its message boundaries, stride multiples and
 * interval-checkpoint multiples.
 *
 * Load. The blocks the RAM hit already pins are not read again. Every
 * file read is fully validated (obj.h) against the prompt's own tokens;
 * a file that fails is quarantined (or, if it vanished, forgotten) and
 * the plan is made again without it, so the result is a shorter hit or a
 * miss, never a wrong one. The entry put into the RAM cache ends at p
 * and carries, for hybrid models, the stored entry's anchor below p as
 * its one checkpoint (read from the manifest ending at p), so the anchor
 * survives the restart.
 *
 * Sources. The same plan, loads and checks run against the remote tier
 * (ks_fetch_remote, remote.h): it has no catalog, so the plan is always
 * the direct one, with every name it may ask about (the prompt's blocks,
 * the resume points of its candidate positions) looked up in one EXISTS
 * batch first; an object is a GET instead of a file read, validated by
 * the same code. A transport failure (timeout, a node gone) ends the
 * lookup as a miss at once: replanning would only wait on the same
 * cluster again. What it loads enters the RAM cache clean (or dirty, so
 * the disk writer keeps it too, when the tier's to_disk is on).
 */
#include "base/clock.h"
#include "base/corrupt.h"
#include "base/err.h"
#include "base/io.h"
#include "base/log.h"
#include "base/mem.h"
#include "cache/names.h"
#include "store/store_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#define MAX_EXCL 32
#define MAX_REPLANS 16

struct plan {
	uint32_t pos;             /* resume position (0: nothing) */
	uint32_t e;               /* length of the entry to put: pos, or d x B (dense blocks) */
	uint32_t j, t;            /* the resume point: node depth and tail rows (rp plans) */
	int rp;                   /* 1: a resume point's files are used */
	struct kv_h128 id;        /* its id */
	int tail_area, snap_area; /* where its files are (-1: none needed) */
	int anchor_flag;          /* catalog: the snapshot is a flagged anchor */
};

struct fctx {
	struct ks_store *s;
	const int32_t *tok;
	uint32_t n;
	struct kv_h128 *h;        /* chain hashes, nh of them */
	uint32_t nh;
	uint32_t max_blocks;      /* replans lower this when a block fails */
	struct kv_h128 excl[MAX_EXCL];
	uint32_t n_excl;
	const uint32_t *bounds;
	size_t n_bounds;
	int direct;
	int remote;               /* the source is the remote tier (always direct) */
	uint8_t *blk_have;        /* remote: block h[k] exists (nh of them) */
	struct ks_need *rpn;      /* remote: resume-point objects asked about ... */
	uint8_t *rp_have;         /* ... and whether each exists */
	size_t n_rp;
};

static int transport_err(int rc)
{
	return rc == KV_ERR_TIMEOUT || rc == KV_ERR_IO || rc == KV_ERR_CANCELLED;
}

static int excluded(const struct fctx *f, struct kv_h128 id)
{
	for (uint32_t i = 0; i < f->n_excl; i++)
		if (kv_h128_eq(f->excl[i], id))
			return 1;
	return 0;
}

static void exclude(struct fctx *f, struct kv_h128 id)
{
	if (f->n_excl < MAX_EXCL)
		f->excl[f->n_excl++] = id;
	else
		f->max_blocks = 0; /* too many bad files: give up on this prompt */
}

static int file_exists(const struct ks_store *s, int area, int kind, struct kv_h128 id)
{
	char path[4096];
	struct stat sb;
	return ks_store_path(s, area, kind, id, path, sizeof path) == KV_OK && stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Area holding (kind, id): main first; -1 when neither. Catalog mode
 * needs mu held. The remote tier has one area: "main". */
static int area_of(struct fctx *f, int kind, struct kv_h128 id)
{
	if (f->remote) {
		for (size_t i = 0; i < f->n_rp; i++)
			if (f->rpn[i].kind == kind && kv_h128_eq(f->rpn[i].id, id))
				return f->rp_have[i] ? KS_AREA_MAIN : -1;
		return -1;
	}
	for (int a = 0; a < KS_AREA__COUNT; a++)
		if (f->direct ? file_exists(f->s, a, kind, id) : ks_cat_find(f->s->cat, a, kind, id) >= 0)
			return a;
	return -1;
}

static int cmp_desc(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

/* A resume point at p = jB + t: usable when its files exist. */
static int try_rp(struct fctx *f, uint32_t j, uint32_t t, struct kv_h128 id, struct plan *pl)
{
	int ta = -1, sa = -1;
	if (excluded(f, id))
		return 0;
	if (t && (ta = area_of(f, KS_TAIL, id)) < 0)
		return 0;
	if (f->s->hybrid && (sa = area_of(f, KS_SNAP, id)) < 0)
		return 0;
	if (!t && !f->s->hybrid)
		return 0; /* a dense rp at a block end adds nothing over the block */
	pl->pos = j * f->s->B + t;
	pl->e = pl->pos;
	pl->j = j;
	pl->t = t;
	pl->rp = 1;
	pl->id = id;
	pl->tail_area = ta;
	pl->snap_area = sa;
	return 1;
}

/* Block h[k] of the prompt is in the source (catalog mode: mu held). */
static int have_block(struct fctx *f, uint32_t k)
{
	if (f->remote)
		return f->blk_have && k < f->nh && f->blk_have[k];
	return f->direct ? file_exists(f->s, KS_AREA_MAIN, KS_BLOCK, f->h[k])
			 : ks_cat_find(f->s->cat, KS_AREA_MAIN, KS_BLOCK, f->h[k]) >= 0;
}

/*
 * Positions an entry of this prompt can end or checkpoint at, for the
 * direct plan: its message boundaries, the stride and the interval
 * multiples, in [1, n - 1], descending (repeats possible). *out malloc'd.
 */
static size_t candidates(const struct fctx *f, uint32_t **out)
{
	const struct ks_store *s = f->s;
	uint32_t lim = f->n - 1, stride = s->p.stride, iv = s->p.ckpt_interval;
	size_t nc = 0, cap = f->n_bounds + 64;
	if (stride)
		cap += lim / stride;
	if (iv)
		cap += lim / iv;
	uint32_t *cand = malloc(cap * sizeof *cand);
	*out = cand;
	if (!cand)
		return 0;
	for (size_t i = 0; i < f->n_bounds; i++)
		if (f->bounds[i] >= 1 && f->bounds[i] <= lim)
			cand[nc++] = f->bounds[i];
	for (uint32_t p = stride; stride && p <= lim && nc < cap; p += stride)
		cand[nc++] = p;
	for (uint32_t p = iv; iv && p <= lim && nc < cap; p += iv)
		cand[nc++] = p;
	qsort(cand, nc, sizeof *cand, cmp_desc);
	return nc;
}

static void make_plan(struct fctx *f, struct plan *pl)
{
	struct ks_store *s = f->s;
	uint32_t B = s->B, lim = f->n - 1, K = f->nh - 1, d = 0;
	memset(pl, 0, sizeof *pl);
	if (K > f->max_blocks)
		K = f->max_blocks;
	if (!f->direct)
		pthread_mutex_lock(&s->mu);
	while (d < K && have_block(f, d + 1))
		d++;

	struct plan best = {0};
	if (!f->direct) {
		for (uint32_t j = 0; j <= d; j++) {
			for (int32_t c = ks_cat_first_child(s->cat, f->h[j]); c >= 0;) {
				const struct ks_rec *r = ks_cat_at(s->cat, c);
				int32_t next = r ? r->next_sib : -1;
				if (r && (r->kind == KS_TAIL || r->kind == KS_SNAP) && r->n < B && r->pos == j * B + r->n &&
				    r->pos >= 1 && r->pos <= lim && r->pos > best.pos) {
					struct kv_h128 id = kc_rp_id(f->h[j], f->tok + (size_t)j * B, r->n);
					struct plan c2;
					if (kv_h128_eq(id, r->id) && try_rp(f, j, r->n, id, &c2)) {
						int32_t si = ks_cat_find(s->cat, c2.snap_area < 0 ? 0 : c2.snap_area, KS_SNAP, id);
						const struct ks_rec *sr = ks_cat_at(s->cat, si);
						c2.anchor_flag = sr ? sr->anchor : 0;
						best = c2;
					}
				}
				c = next;
			}
		}
		pthread_mutex_unlock(&s->mu);
	} else {
		uint32_t *cand = NULL;
		size_t nc = candidates(f, &cand);
		for (size_t i = 0; i < nc; i++) {
			uint32_t p = cand[i], j = p / B, t = p % B;
			if ((i && cand[i - 1] == p) || j > d || p <= best.pos)
				continue;
			struct kv_h128 id = kc_rp_id(f->h[j], f->tok + (size_t)j * B, t);
			if (try_rp(f, j, t, id, &best))
				break; /* descending: the first usable one is the longest */
		}
		free(cand);
	}
	/* dense: full blocks resume anywhere inside them */
	if (!s->hybrid && d && d * B >= best.pos) {
		memset(&best, 0, sizeof best);
		best.e = d * B;
		best.pos = d * B < lim ? d * B : lim;
		best.tail_area = best.snap_area = -1;
	}
	*pl = best;
}

/*
 * Remote: ask in one EXISTS batch about every name the plan may test: the
 * prompt's blocks, and the tail and snapshot of each candidate position.
 * KV_OK, or the transport error (the lookup ends).
 */
static int remote_probe(struct fctx *f)
{
	struct ks_store *s = f->s;
	uint32_t B = s->B, K = f->nh - 1, *cand = NULL;
	size_t nc = candidates(f, &cand), n = 0, cap = (size_t)K + 2 * nc + 1;
	int *kinds = malloc(cap * sizeof *kinds);
	struct kv_h128 *ids = malloc(cap * sizeof *ids);
	uint8_t *have = malloc(cap);
	int rc = KV_OK;
	f->blk_have = calloc((size_t)f->nh + 1, 1);
	f->rpn = malloc(2 * (nc + 1) * sizeof *f->rpn);
	f->rp_have = calloc(2 * (nc + 1), 1);
	if (!kinds || !ids || !have || !f->blk_have || !f->rpn || !f->rp_have) {
		rc = kv_fail(KV_ERR_NOMEM, "remote lookup: out of memory");
		goto out;
	}
	for (uint32_t k = 1; k <= K; k++) {
		kinds[n] = KS_BLOCK;
		ids[n++] = f->h[k];
	}
	for (size_t i = 0; i < nc; i++) {
		uint32_t p = cand[i], j = p / B, t = p % B;
		if ((i && cand[i - 1] == p) || j > K)
			continue;
		struct kv_h128 id = kc_rp_id(f->h[j], f->tok + (size_t)j * B, t);
		if (t)
			f->rpn[f->n_rp++] = (struct ks_need){KS_TAIL, id};
		if (s->hybrid)
			f->rpn[f->n_rp++] = (struct ks_need){KS_SNAP, id};
	}
	for (size_t i = 0; i < f->n_rp; i++) {
		kinds[n] = f->rpn[i].kind;
		ids[n++] = f->rpn[i].id;
	}
	if ((rc = ks_remote_have(s->p.remote, s->p.ns, kinds, ids, n, 0, have)))
		goto out;
	for (uint32_t k = 1; k <= K; k++)
		f->blk_have[k] = have[k - 1];
	for (size_t i = 0; i < f->n_rp; i++)
		f->rp_have[i] = have[K + i];
out:
	free(cand);
	free(kinds);
	free(ids);
	free(have);
	return rc;
}

/* Open + validate one object into the given destination: a file, or a
 * remote value (remote.h ks_remote_load validates and deletes a bad one).
 * A file that fails is rejected (quarantine unless it is merely
 * missing/foreign). */
static int load_obj(struct ks_store *s, int remote, int area, int kind, struct kv_h128 id, struct kv_h128 parent,
		    uint32_t pos, const struct ks_obj_dst *dst, struct ks_obj_info *info, uint64_t *bytes)
{
	char path[4096];
	struct ks_obj *o;
	int bad = KS_BAD_NONE, rc;
	if (remote)
		return ks_remote_load(s->p.remote, &s->L, s->p.ns, kind, id, parent, pos, dst, info, bytes);
	if ((rc = ks_store_path(s, area, kind, id, path, sizeof path)))
		return rc; /* no file can have that name: nothing to reject */
	rc = ks_obj_open(path, &s->L, kind, &s->p.ns, &o, &bad);
	if (rc == KV_OK) {
		const struct ks_obj_info *in = ks_obj_info(o);
		if (!kv_h128_eq(in->id, id) || !kv_h128_eq(in->parent, parent) || in->pos != pos) {
			bad = KS_BAD_HEADER;
			rc = KV_CORRUPT(path, 0, "header names another object (id, parent or position differ)");
		} else {
			rc = ks_obj_read(o, dst, &bad);
			if (rc == KV_OK) {
				if (info)
					*info = *in;
				*bytes += in->file_size;
			}
		}
		ks_obj_close(o);
	}
	if (rc == KV_OK)
		return KV_OK;
	if (rc == KV_ERR_NOT_FOUND) {
		/* gone (evicted, pruned): just forget it */
		pthread_mutex_lock(&s->mu);
		ks_cat_del(s->cat, ks_cat_find(s->cat, area, kind, id));
		pthread_mutex_unlock(&s->mu);
		return rc;
	}
	ks_store_reject(s, path, area, kind, id, bad);
	return rc;
}

/* Start reading a whole file into the page cache (a hint: the read that
 * follows is the one that counts, and checks everything). */
static void will_need(struct ks_store *s, int area, int kind, struct kv_h128 id)
{
	char path[4096];
	if (ks_store_path(s, area, kind, id, path, sizeof path))
		return;
	int fd = kv_io_open(path, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return;
	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
	kv_io_close(fd);
}

/*
 * Map in a fresh page's memory with one call before the read lands in it:
 * faulting it in 4 KiB at a time inside the read's copy costs more than
 * the copy on some virtual machines (measured here: a third of a
 * restore's CPU time). Advisory: failure changes nothing.
 */
static void prefault(void *p, size_t n)
{
#ifdef MADV_POPULATE_WRITE
	uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, e = ((uintptr_t)p + n) & ~(uintptr_t)4095;
	if (e > a)
		(void)madvise((void *)a, e - a, MADV_POPULATE_WRITE);
#else
	(void)p;
	(void)n;
#endif
}

/* The files of one plan, read by the loader threads: the blocks (items
 * 0 .. n_want-1), then the resume point's tail and snapshot, if any. */
struct blk_ctx {
	struct ks_store *s;
	const struct fctx *f;
	const struct ks_req *rq;
	struct kv_page **own;
	const uint32_t *want;
	uint32_t n_want;
	int *rc;
	uint64_t *bytes;
	/* the resume point (plan.rp) */
	const struct plan *pl;
	void *tail, *snap;         /* destinations (NULL: not wanted) */
	int tail_rc, snap_rc;
	uint64_t tail_bytes, snap_bytes;
	struct ks_obj_info snap_info;
};

static void load_block(struct blk_ctx *b, size_t i);

static void load_item(void *ctx, size_t i)
{
	struct blk_ctx *b = ctx;
	uint32_t B = b->s->B;
	const struct plan *pl = b->pl;
	if (i < b->n_want) {
		load_block(b, i);
		return;
	}
	if (i == b->n_want && b->tail) {
		struct ks_obj_dst d = {.kv = b->tail, .expect = b->rq->tokens + (size_t)pl->j * B};
		b->tail_rc = load_obj(b->s, b->f->remote, pl->tail_area, KS_TAIL, pl->id, b->f->h[pl->j], pl->pos, &d, NULL,
				      &b->tail_bytes);
		return;
	}
	prefault(b->snap, b->s->L.snapshot_bytes);
	struct ks_obj_dst d = {.snap = b->snap, .expect = b->rq->tokens + (size_t)pl->j * B};
	b->snap_rc = load_obj(b->s, b->f->remote, pl->snap_area, KS_SNAP, pl->id, b->f->h[pl->j], pl->pos, &d,
			      &b->snap_info, &b->snap_bytes);
}

static void load_block(struct blk_ctx *b, size_t i)
{
	uint32_t k = b->want[i], B = b->s->B;
	struct kv_page *pg = kv_page_alloc(b->s->p.pages);
	b->bytes[i] = 0;
	if (!pg) {
		b->rc[i] = KV_ERR_NOMEM;
		return;
	}
	prefault(pg->data, b->s->L.page_bytes);
	struct ks_obj_dst d = {.kv = pg->data, .expect = b->rq->tokens + (size_t)k * B};
	b->rc[i] = load_obj(b->s, b->f->remote, KS_AREA_MAIN, KS_BLOCK, b->f->h[k + 1], b->f->h[k], (k + 1) * B, &d, NULL,
			    &b->bytes[i]);
	if (b->rc[i]) {
		if (b->rc[i] == KV_ERR_NOMEM)
			b->rc[i] = KV_ERR_CORRUPT; /* an allocation inside the check: treat as unusable */
		kv_page_unref(pg);
		return;
	}
	b->own[k] = pg;
}

static void touch_used(struct ks_store *s, int area, int kind, struct kv_h128 id)
{
	char path[4096];
	if (ks_store_path(s, area, kind, id, path, sizeof path) == KV_OK)
		ks_dir_touch(path);
	pthread_mutex_lock(&s->mu);
	ks_cat_touch(s->cat, ks_cat_find(s->cat, area, kind, id), ks_dir_now_ns());
	pthread_mutex_unlock(&s->mu);
}

static void note_bounds(struct ks_store *s, const struct fctx *f)
{
	uint32_t B = s->B;
	pthread_mutex_lock(&s->mu);
	for (size_t i = 0; i < f->n_bounds; i++) {
		uint32_t b = f->bounds[i];
		if (b == 0 || b > f->n || b / B >= f->nh)
			continue;
		s->bring[s->bring_next] = kc_rp_id(f->h[b / B], f->tok + (size_t)(b / B) * B, b % B);
		s->bring_next = (s->bring_next + 1) % KS_BOUNDARY_RING;
		if (s->bring_n < KS_BOUNDARY_RING)
			s->bring_n++;
	}
	pthread_mutex_unlock(&s->mu);
}

uint32_t ks_fetch_probe(struct ks_store *s, const int32_t *tok, uint32_t n, const uint32_t *bounds, size_t n_bounds)
{
	struct fctx f = {.s = s, .tok = tok, .n = n, .bounds = bounds, .n_bounds = n_bounds, .max_blocks = UINT32_MAX};
	struct plan pl;
	f.direct = !atomic_load(&s->scan_done);
	f.h = ks_store_chain(s, tok, n, &f.nh);
	if (!f.h)
		return 0;
	make_plan(&f, &pl);
	free(f.h);
	return pl.pos;
}

/* One ks_fetch_run: what its steps share, and what `out:` frees. */
struct fetch_run {
	struct ks_store *s;
	const struct ks_req *rq;
	struct fctx f;
	struct plan pl;
	struct kv_page **own;      /* pages read from disk, by block (own_n + 1) */
	struct kv_page **pages;    /* the entry's pages: RAM's or own (borrowed) */
	struct kv_page *tail_page; /* the entry's last, partial page (owned) */
	uint32_t own_n;
	uint32_t *want;            /* blocks one round reads ... */
	int *wrc;                  /* ... their results ... */
	uint64_t *wbytes;          /* ... and sizes */
	void *snap, *asnap;        /* the resume point's and the anchor's snapshots (owned until put) */
	void *tail;                /* a tail file's rows (kv_alloc scratch) */
	uint64_t bytes;
	uint32_t files, anchor;
};

/*
 * Plan, read the plan's files in parallel, and plan again without the
 * file that failed, up to MAX_REPLANS rounds. A miss (also when every
 * round failed) leaves pl.pos at 0; the return is an error only when
 * memory for the reads runs out.
 */
static int load_plans(struct fetch_run *r)
{
	struct ks_store *s = r->s;
	const struct ks_req *rq = r->rq;
	struct fctx *f = &r->f;
	struct plan *pl = &r->pl;
	uint32_t B = s->B;
	for (int round = 0; round < MAX_REPLANS; round++) {
		make_plan(f, pl);
		if (pl->pos <= rq->ram_pos) {
			pl->pos = 0;
			break;
		}
		uint32_t nblk = pl->e / B, k;
		/* blocks: the RAM hit's pages first, then the files, read in
		 * parallel (a full device queue; CRCs checked while other reads
		 * are under way) */
		uint32_t n_want = 0;
		for (k = 0; k < nblk; k++) {
			if (k < rq->ram_n_pages && rq->ram_pages && rq->ram_pages[k])
				r->pages[k] = rq->ram_pages[k];
			else if (!r->own[k])
				r->want[n_want++] = k;
		}
		/* tell the kernel every file this plan reads, so the device works
		 * on all of them at once instead of one readahead window at a time */
		for (uint32_t i = 0; i < n_want && !f->remote; i++)
			will_need(s, KS_AREA_MAIN, KS_BLOCK, f->h[r->want[i] + 1]);
		if (pl->rp && pl->t && !f->remote)
			will_need(s, pl->tail_area, KS_TAIL, pl->id);
		if (pl->rp && s->hybrid && !f->remote) {
			will_need(s, pl->snap_area, KS_SNAP, pl->id);
			will_need(s, KS_AREA_MAIN, KS_ENTRY, pl->id); /* its anchor is read next */
		}
		/* the resume point's files go with the blocks */
		if (pl->rp && pl->t && !r->tail && !(r->tail = kv_alloc(KV_MEM_SCRATCH, s->L.page_bytes)))
			return kv_fail(KV_ERR_NOMEM, "disk lookup: out of memory");
		if (s->hybrid && !r->snap && !(r->snap = kc_cache_snap_alloc(s->p.cache)))
			return kv_fail(KV_ERR_NOMEM, "disk lookup: out of memory");
		struct blk_ctx bc = {.s = s, .f = f, .rq = rq, .own = r->own, .want = r->want, .n_want = n_want,
				     .rc = r->wrc, .bytes = r->wbytes, .pl = pl, .tail = pl->rp && pl->t ? r->tail : NULL,
				     .snap = pl->rp && s->hybrid ? r->snap : NULL};
		size_t n_items = n_want + (bc.tail ? 1 : 0) + (bc.snap ? 1 : 0);
		ks_par_run(n_items, KS_READ_THREADS, load_item, &bc);
		if (f->remote) {
			/* the cluster failed a read: stop here (a miss), never wait on
			 * it again for this request */
			int tr = (bc.tail && transport_err(bc.tail_rc)) || (bc.snap && transport_err(bc.snap_rc));
			for (uint32_t i = 0; i < n_want && !tr; i++)
				tr = transport_err(r->wrc[i]);
			if (tr) {
				pl->pos = 0;
				return KV_OK;
			}
		}
		uint32_t bad_k = UINT32_MAX;
		for (uint32_t i = 0; i < n_want; i++) {
			if (r->wrc[i] == KV_ERR_NOMEM) {
				/* no room for the pages: a miss, not an error */
				KV_WARN("store.fetch", "msg=\"no free KV page to load into\"");
				pl->pos = 0;
				return KV_OK;
			}
			if (r->wrc[i] && r->want[i] < bad_k)
				bad_k = r->want[i];
			if (!r->wrc[i]) {
				r->bytes += r->wbytes[i];
				r->files++;
			}
		}
		if (bc.tail && !bc.tail_rc) {
			r->bytes += bc.tail_bytes;
			r->files++;
		}
		if (bc.snap && !bc.snap_rc) {
			r->bytes += bc.snap_bytes;
			r->files++;
		}
		if (bad_k != UINT32_MAX) {
			f->max_blocks = bad_k;
			continue;
		}
		if ((bc.tail && bc.tail_rc) || (bc.snap && bc.snap_rc)) {
			exclude(f, pl->id);
			continue;
		}
		for (k = 0; k < nblk; k++)
			if (!(k < rq->ram_n_pages && rq->ram_pages && rq->ram_pages[k]))
				r->pages[k] = r->own[k];
		if (bc.tail) {
			if (!r->tail_page && !(r->tail_page = kv_page_alloc(s->p.pages))) {
				pl->pos = 0;
				return KV_OK;
			}
			ke_layout_copy_rows(&s->L, r->tail_page->data, (int)B, r->tail, (int)pl->t, (int)pl->t);
			r->pages[nblk] = r->tail_page;
		}
		if (bc.snap)
			pl->anchor_flag = bc.snap_info.anchor_flag;
		return KV_OK;
	}
	/* every round failed (or nothing beats RAM): a miss. The last plan's
	 * files failed their checks, so it must never reach the RAM cache. */
	pl->pos = 0;
	return KV_OK;
}

/*
 * Dense models: the first rows of a stored block or tail that shares only
 * part of its tokens with the prompt (the RAM tier does the same) extend
 * the hit past the plan, ending the entry with a partial page.
 */
static void extend_partial(struct fetch_run *r)
{
	struct ks_store *s = r->s;
	const struct ks_req *rq = r->rq;
	struct fctx *f = &r->f;
	struct plan *pl = &r->pl;
	uint32_t B = s->B;
	uint32_t d = pl->rp ? pl->j : pl->e / B, lim = rq->n - 1, have = pl->pos > d * B ? pl->pos - d * B : 0;
	struct {
		int kind, area;
		struct kv_h128 id;
		uint32_t pos, n;
	} cand[16];
	int nc = 0;
	if (d < f->nh && d <= f->max_blocks && lim > d * B) {
		pthread_mutex_lock(&s->mu);
		for (int32_t c = ks_cat_first_child(s->cat, f->h[d]); c >= 0 && nc < 16;) {
			const struct ks_rec *rec = ks_cat_at(s->cat, c);
			if (!rec)
				break;
			if (((rec->kind == KS_BLOCK && rec->area == KS_AREA_MAIN) || rec->kind == KS_TAIL) && rec->n > have &&
			    !excluded(f, rec->id)) {
				cand[nc].kind = rec->kind;
				cand[nc].area = rec->area;
				cand[nc].id = rec->id;
				cand[nc].pos = rec->pos;
				cand[nc].n = rec->n;
				nc++;
			}
			c = rec->next_sib;
		}
		pthread_mutex_unlock(&s->mu);
	}
	uint32_t best = have;
	struct kv_page *best_pg = NULL;
	for (int i = 0; i < nc; i++) {
		int32_t ctok[4096];
		if (cand[i].n > B || B > 4096)
			continue;
		if (!r->tail && !(r->tail = kv_alloc(KV_MEM_SCRATCH, s->L.page_bytes)))
			break;
		struct kv_page *pg = kv_page_alloc(s->p.pages);
		if (!pg)
			break;
		struct ks_obj_dst d2 = {.tokens = ctok, .kv = cand[i].kind == KS_BLOCK ? pg->data : r->tail};
		if (load_obj(s, 0, cand[i].area, cand[i].kind, cand[i].id, f->h[d], cand[i].pos, &d2, NULL, &r->bytes)) {
			kv_page_unref(pg);
			continue;
		}
		r->files++;
		uint32_t m = cand[i].n < lim - d * B ? cand[i].n : lim - d * B, l = 0;
		while (l < m && ctok[l] == rq->tokens[(size_t)d * B + l])
			l++;
		if (l > best) {
			if (cand[i].kind == KS_TAIL)
				ke_layout_copy_rows(&s->L, pg->data, (int)B, r->tail, (int)cand[i].n, (int)l);
			kv_page_unref(best_pg);
			best_pg = pg;
			best = l;
		} else {
			kv_page_unref(pg);
		}
	}
	if (best_pg && d * B + best > pl->pos && d * B + best > rq->ram_pos) {
		/* blocks 1..d are loaded (or in RAM): the partial page ends the entry */
		for (uint32_t k = 0; k < d; k++)
			if (!r->pages[k])
				best = 0;
		if (best) {
			pl->pos = pl->e = d * B + best;
			pl->rp = 0;
			kv_page_unref(r->tail_page);
			r->tail_page = best_pg;
			best_pg = NULL;
			r->pages[d] = r->tail_page;
		}
	}
	kv_page_unref(best_pg);
}

/* Hybrid models: the stored entry's anchor below p, from its manifest,
 * and the anchor's snapshot (r->asnap) when its file is there. */
static void read_anchor(struct fetch_run *r)
{
	struct ks_store *s = r->s;
	const struct ks_req *rq = r->rq;
	struct fctx *f = &r->f;
	struct plan *pl = &r->pl;
	uint32_t B = s->B;
	if (pl->anchor_flag) {
		r->anchor = pl->pos;
		return;
	}
	int ea = -1, rem = f->remote;
	/* the remote has no catalog: its GET is the existence check */
	for (int a = 0; a < KS_AREA__COUNT && ea < 0; a++)
		if (rem ? a == KS_AREA_MAIN : ks_store_has(s, a, KS_ENTRY, pl->id))
			ea = a;
	uint32_t ck[KS_MAX_CKPT];
	struct ks_obj_info ei;
	struct ks_obj_dst d = {.ckpt = ck, .expect = rq->tokens};
	if (ea >= 0 && load_obj(s, rem, ea, KS_ENTRY, pl->id, f->h[pl->j], pl->pos, &d, &ei, &r->bytes) == KV_OK) {
		r->files++;
		uint32_t a = ei.anchor;
		if (a && a < pl->pos && a / B < f->nh) {
			struct kv_h128 aid = kc_rp_id(f->h[a / B], rq->tokens + (size_t)(a / B) * B, a % B);
			int sa = rem ? KS_AREA_MAIN
				 : ks_store_has(s, KS_AREA_MAIN, KS_SNAP, aid) ? KS_AREA_MAIN
				 : ks_store_has(s, KS_AREA_CKPT, KS_SNAP, aid) ? KS_AREA_CKPT
									       : -1;
			struct ks_obj_dst ad = {.expect = rq->tokens + (size_t)(a / B) * B};
			if (sa >= 0 && (ad.snap = r->asnap = kc_cache_snap_alloc(s->p.cache)) &&
			    load_obj(s, rem, sa, KS_SNAP, aid, f->h[a / B], a, &ad, NULL, &r->bytes) == KV_OK) {
				r->files++;
				r->anchor = a;
				if (!rem)
					touch_used(s, sa, KS_SNAP, aid);
			} else {
				kc_cache_snap_free(s->p.cache, r->asnap);
				r->asnap = NULL;
			}
		}
		if (!rem)
			touch_used(s, ea, KS_ENTRY, pl->id);
	}
}

/* Hand the loaded entry to the RAM tier (its snapshots are consumed) and
 * note the last use of every file that served it. KV_OK, or the cache's
 * refusal (logged: then the fetch is a miss). */
static int put_entry(struct fetch_run *r)
{
	struct ks_store *s = r->s;
	struct plan *pl = &r->pl;
	uint32_t B = s->B;
	struct kc_put_ckpt ck = {.pos = r->anchor, .snap = r->asnap};
	struct kc_put put = {.tokens = r->rq->tokens,
			     .n = pl->e,
			     .pages = r->pages,
			     .snap = r->snap,
			     .ckpt = r->anchor && r->anchor < pl->e ? &ck : NULL,
			     .n_ckpt = r->anchor && r->anchor < pl->e ? 1 : 0,
			     .anchor = r->anchor,
			     /* a remote hit is queued for the disk writer too when the
			      * tier says so */
			     .clean = r->f.remote ? !ks_remote_to_disk(s->p.remote) : 1};
	uint64_t eid = 0;
	if (!put.n_ckpt && r->asnap) {
		kc_cache_snap_free(s->p.cache, r->asnap);
		put.ckpt = NULL;
	}
	r->asnap = NULL;
	int prc = kc_cache_put(s->p.cache, &put, &eid);
	r->snap = NULL; /* consumed */
	if (prc) {
		KV_WARN("store.fetch", "msg=\"the RAM cache refused the loaded entry\" err=\"%s\"", kv_errmsg());
		return prc;
	}
	if (r->f.remote)
		return KV_OK; /* a GET already made the keys recently used */
	for (uint32_t k = 0; k < pl->e / B; k++)
		if (r->own[k])
			touch_used(s, KS_AREA_MAIN, KS_BLOCK, r->f.h[k + 1]);
	if (pl->rp && pl->t)
		touch_used(s, pl->tail_area, KS_TAIL, pl->id);
	if (pl->rp && s->hybrid)
		touch_used(s, pl->snap_area, KS_SNAP, pl->id);
	return KV_OK;
}

/* The fetch's counters and its log line. */
static void count_fetch(struct ks_store *s, const struct ks_req *rq, const struct ks_fetch *out, int remote)
{
	if (remote) {
		ks_remote_note_fetch(s->p.remote, out->pos, out->bytes, out->files, out->seconds);
		if (out->pos)
			KV_INFO("remote.fetch", "resumed_at=%u anchor=%u prompt=%u ram_pos=%u objects=%u bytes=%llu ms=%.2f",
				out->pos, out->anchor, rq->n, rq->ram_pos, out->files, (unsigned long long)out->bytes,
				out->seconds * 1e3);
		return;
	}
	pthread_mutex_lock(&s->mu);
	if (out->direct)
		s->st.direct_lookups++;
	if (out->pos) {
		s->st.loads++;
		s->st.load_bytes += out->bytes;
		s->st.load_files += out->files;
		s->st.load_tokens += out->pos;
		s->st.load_seconds += out->seconds;
	}
	pthread_mutex_unlock(&s->mu);
	if (out->pos)
		KV_INFO("store.fetch", "resumed_at=%u anchor=%u prompt=%u ram_pos=%u files=%u bytes=%llu ms=%.2f direct=%d",
			out->pos, out->anchor, rq->n, rq->ram_pos, out->files, (unsigned long long)out->bytes,
			out->seconds * 1e3, out->direct);
}

/* One lookup against the disk (remote 0) or the remote tier. */
static int fetch_from(struct ks_store *s, const struct ks_req *rq, struct ks_fetch *out, int remote)
{
	uint64_t t0 = kv_now_ns();
	struct fetch_run r = {.s = s, .rq = rq};
	int rc = KV_OK;

	r.f = (struct fctx){.s = s, .tok = rq->tokens, .n = rq->n, .bounds = rq->bounds, .n_bounds = rq->n_bounds,
			    .max_blocks = UINT32_MAX, .remote = remote};
	r.f.direct = remote || !atomic_load(&s->scan_done);
	r.f.h = ks_store_chain(s, rq->tokens, rq->n, &r.f.nh);
	if (!r.f.h)
		return kv_fail(KV_ERR_NOMEM, "disk lookup: out of memory");
	if (!remote)
		note_bounds(s, &r.f); /* once per request: the disk lookup comes first */
	r.own_n = r.f.nh;
	r.own = calloc(r.own_n + 1, sizeof *r.own);
	r.pages = calloc(r.own_n + 1, sizeof *r.pages);
	r.want = malloc((r.own_n + 1) * sizeof *r.want);
	r.wrc = malloc((r.own_n + 1) * sizeof *r.wrc);
	r.wbytes = malloc((r.own_n + 1) * sizeof *r.wbytes);
	if (!r.own || !r.pages || !r.want || !r.wrc || !r.wbytes) {
		rc = kv_fail(KV_ERR_NOMEM, "disk lookup: out of memory");
		goto out;
	}
	if (remote && remote_probe(&r.f))
		goto out; /* the cluster failed the lookup: a miss (the tier is down now) */
	if ((rc = load_plans(&r)))
		goto out;
	if (!s->hybrid && !r.f.direct && (r.pl.pos || !rq->ram_pos))
		extend_partial(&r);
	if (!r.pl.pos)
		goto out;
	if (s->hybrid && r.pl.rp)
		read_anchor(&r);
	if (put_entry(&r))
		r.pl.pos = 0;

out:
	out->pos = rc ? 0 : r.pl.pos;
	out->anchor = out->pos ? r.anchor : 0;
	out->bytes = r.bytes;
	out->files = r.files;
	out->direct = r.f.direct && !remote;
	out->seconds = (double)(kv_now_ns() - t0) / 1e9;
	count_fetch(s, rq, out, remote);
	for (uint32_t k = 0; k <= r.own_n && r.own; k++)
		kv_page_unref(r.own[k]);
	kv_page_unref(r.tail_page);
	if (r.snap)
		kc_cache_snap_free(s->p.cache, r.snap);
	if (r.asnap)
		kc_cache_snap_free(s->p.cache, r.asnap);
	kv_free(r.tail);
	free(r.own);
	free(r.pages);
	free(r.want);
	free(r.wrc);
	free(r.wbytes);
	free(r.f.h);
	free(r.f.blk_have);
	free(r.f.rpn);
	free(r.f.rp_have);
	return rc;
}

int ks_fetch_run(struct ks_store *s, const struct ks_req *rq, struct ks_fetch *out)
{
	return fetch_from(s, rq, out, 0);
}

int ks_fetch_remote(struct ks_store *s, const struct ks_req *rq, struct ks_fetch *out)
{
	if (!ks_remote_up(s->p.remote)) {
		ks_remote_note_skip(s->p.remote);
		return KV_OK; /* down: the local tiers answer, nothing waits */
	}
	return fetch_from(s, rq, out, 1);
}
