/*
 * run.c - see run.h.
 */
#include "session/run.h"
#include "session/decode.h"
#include "cache/turn.h"
#include "engine/sample.h"
#include "base/log.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

struct run_ctx {
	struct kc_cache *c;
	struct kc_turn *turn;
	struct kv_page **pages;     /* scratch for the page list, cap slots */
	size_t cap;
	int hybrid;
	uint32_t stops;
	/* interval checkpoints (run.h `every`): the turn's own stops, to tell
	 * them from the interval points merged in */
	uint32_t every;
	void (*on_every)(void *ctx, struct ke_seq *s, int pos);
	void *every_ctx;
	const uint32_t *tstops;
	size_t n_tstops;
	struct kss_sched *sched;
	struct kss_flight *flight;  /* this prefill, for requests that share its stops */
	/* the MTP head's context (session/decode.h): the hidden states of
	 * the prompt's last forward, at most ctx_rows of them */
	int ctx_rows;
	float *ctx_hidden;          /* ctx_rows x hidden */
	int n_ctx;
};

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return x < y ? -1 : x > y;
}

static int is_bound(const struct kss_run_params *p, uint32_t pos)
{
	for (size_t i = 0; i < p->n_bounds; i++)
		if (p->bounds[i] == pos)
			return 1;
	return 0;
}

static int is_turn_stop(const struct run_ctx *x, int pos)
{
	for (size_t i = 0; i < x->n_tstops; i++)
		if (x->tstops[i] == (uint32_t)pos)
			return 1;
	return 0;
}

/* The sequence's pages into the scratch list. */
static struct kv_page *const *seq_pages(struct run_ctx *x, const struct ke_seq *s)
{
	int n = ke_seq_n_pages(s);
	for (int i = 0; i < n && (size_t)i < x->cap; i++)
		x->pages[i] = ke_seq_page(s, i);
	return x->pages;
}

/* Snapshot of the sequence into a cache buffer (NULL for dense or OOM;
 * a missing snapshot only means less gets stored). */
static void *take_snap(struct run_ctx *x, const struct ke_seq *s)
{
	void *b;
	if (!x->hybrid)
		return NULL;
	b = kc_cache_snap_alloc(x->c);
	if (b && ke_seq_snapshot(s, b, ke_seq_snapshot_bytes(s)) != KV_OK) {
		kc_cache_snap_free(x->c, b);
		b = NULL;
	}
	return b;
}

static int on_stop(void *ctx, struct ke_seq *s, int pos)
{
	struct run_ctx *x = ctx;
	/* an interval point that is not one of the turn's stops */
	if (x->every && pos % (int)x->every == 0 && x->on_every)
		x->on_every(x->every_ctx, s, pos);
	if (!is_turn_stop(x, pos)) {
		/* dense: a message boundary another request waits for (run.c
		 * adds them to the stops only then); failing to store it only
		 * means the waiter prefills the prefix itself */
		if (!x->hybrid && x->flight) {
			if (kss_sched_flight_wanted(x->sched, x->flight, (uint32_t)pos))
				kc_turn_share_at_stop(x->turn, (uint32_t)pos, NULL, seq_pages(x, s));
			kss_sched_flight_at(x->sched, x->flight, (uint32_t)pos);
		}
		return KV_OK;
	}
	x->stops++;
	/* a request waiting for this prefix (sched.h): store it right away */
	int rc = kss_sched_flight_wanted(x->sched, x->flight, (uint32_t)pos)
			 ? kc_turn_share_at_stop(x->turn, (uint32_t)pos, take_snap(x, s), seq_pages(x, s))
			 : kc_turn_at_stop(x->turn, (uint32_t)pos, take_snap(x, s), seq_pages(x, s));
	if (x->flight)
		kss_sched_flight_at(x->sched, x->flight, (uint32_t)pos);
	return rc;
}

/* The recurrent state of a running sequence, for an interval checkpoint. */
static int snap_fill(void *ctx, void *dst, size_t len)
{
	return ke_seq_snapshot(ctx, dst, len);
}

/* on_every for a disk tier: --kv-disk-checkpoint-interval. Queued, never
 * waited for. */
static void disk_checkpoint(void *ctx, struct ke_seq *seq, int pos)
{
	struct ks_store *store = ctx;
	int n = ke_seq_n_pages(seq);
	struct kv_page **pg = malloc(((size_t)n + 1) * sizeof *pg);
	if (!pg)
		return;
	for (int i = 0; i < n; i++)
		pg[i] = ke_seq_page(seq, i);
	if (ks_store_ckpt(store, ke_seq_tokens(seq), (uint32_t)pos, pg, snap_fill, seq) == KV_ERR_FULL)
		KV_DEBUG("store.ckpt_dropped", "pos=%d msg=\"the disk writer queue is full\"", pos);
	free(pg);
}

/* Ask the disk tier (remote 0) or the remote tier for what the RAM hit
 * lacks (its pages stay pinned by the turn while the store reads).
 * Returns the position now in RAM from there (0: nothing loaded). Never
 * fails the request. */
static uint32_t tier_fetch(struct ks_store *st, int remote, const struct kss_run_params *p, const struct kc_hit *h)
{
	struct ks_fetch f = {0};
	struct kv_page **rp = h->n_pages ? malloc(h->n_pages * sizeof *rp) : NULL;
	if (h->n_pages && !rp)
		return 0;
	if (rp)
		kc_hit_pages(h, rp);
	struct ks_req rq = {.tokens = p->prompt, .n = p->n, .bounds = p->bounds, .n_bounds = p->n_bounds,
			    .ram_pos = h->pos, .ram_pages = rp, .ram_n_pages = rp ? h->n_pages : 0};
	if (remote)
		ks_store_fetch_remote(st, &rq, &f);
	else
		ks_store_fetch(st, &rq, &f);
	free(rp);
	return f.pos > h->pos ? f.pos : 0;
}

/* One forward of n tokens: through the scheduler's batch, or here; hidden
 * (may be NULL) gets every row's final hidden state. */
static int forward(const struct kss_run_params *p, struct ke_seq *s, const int32_t *tok, int n, float *logits,
		   float *hidden)
{
	if (p->sched)
		return hidden ? kss_sched_forward_hidden(p->sched, s, tok, n, logits, hidden)
			      : kss_sched_forward(p->sched, s, tok, n, logits);
	struct ke_prefill_opts po = {.cancel = p->cancel, .hidden_all = hidden};
	return ke_seq_prefill(s, tok, n, &po, logits);
}

/* Prefill prompt[pos, n) stopping at every stop (on_stop at each). With a
 * scheduler each forward is one chunk, so a long prefill shares the engine
 * with the others step by step; the cancel flag is read between them. */
static int prefill(struct run_ctx *x, const struct kss_run_params *p, struct ke_seq *s, const int *stops, size_t n_stops,
		   float *logits)
{
	int n = (int)p->n, rc;
	int chunk = p->sched ? kss_sched_chunk(p->sched) : n;
	size_t next = 0;
	while (ke_seq_pos(s) < n) {
		int at = ke_seq_pos(s);
		if (p->cancel && __atomic_load_n(p->cancel, __ATOMIC_ACQUIRE))
			return kv_fail(KV_ERR_CANCELLED, "prefill cancelled at position %d", at);
		int end = at + chunk < n ? at + chunk : n;
		if (next < n_stops && stops[next] < end)
			end = stops[next];
		/* the last ctx_rows positions in a forward of their own, for
		 * their hidden states (chunk ends never change results) */
		if (x->ctx_rows && end == n && end - at > x->ctx_rows)
			end = n - x->ctx_rows;
		if (end == n)
			x->n_ctx = x->ctx_rows ? end - at : 0;
		if ((rc = forward(p, s, p->prompt + at, end - at, end == n ? logits : NULL,
				  end == n && x->ctx_rows ? x->ctx_hidden : NULL)))
			return rc;
		if (ke_seq_pos(s) != end)
			return kv_fail(KV_ERR_CANCELLED, "prefill stopped at position %d", ke_seq_pos(s));
		if (p->on_progress)
			p->on_progress(p->cb_ctx, (uint32_t)end, (uint32_t)n);
		if (next < n_stops && stops[next] == end) {
			next++;
			if ((rc = on_stop(x, s, end)))
				return rc;
		}
	}
	return KV_OK;
}

static double ms_since(uint64_t t0)
{
	return (double)(kv_now_ns() - t0) / 1e6;
}

int kss_run(struct kc_cache *c, struct ke_model *m, const struct kss_run_params *p, struct kss_run_result *r)
{
	const struct ke_layout *L = ke_model_layout(m);
	const struct kc_hit *hit;
	struct run_ctx x = {.c = c};
	struct ke_seq *s = NULL;
	/* with a scheduler the batch's scratch is used, not the sequence's */
	struct ke_seq_params sp = {.chunk = p->sched ? 1 : p->chunk};
	int V = ke_model_config(m)->vocab, rc;
	int32_t *all = NULL;
	float *logits = NULL;
	int *stops = NULL;
	uint32_t *share = NULL;       /* the stops a waiting request may be given */
	const uint32_t *st;
	size_t n_st;
	uint32_t total;
	uint64_t t0;
	int joined = 0;

	memset(r, 0, sizeof *r);
	if (!p->prompt || !p->n)
		return kv_fail(KV_ERR_INVALID, "run: empty prompt");
	if (L->page_tokens != kc_cache_layout(c)->page_tokens || L->page_bytes != kc_cache_layout(c)->page_bytes ||
	    L->snapshot_bytes != kc_cache_layout(c)->snapshot_bytes)
		return kv_fail(KV_ERR_INCOMPATIBLE, "run: the cache was made for another layout");
	x.hybrid = L->snapshot_bytes > 0;
	x.cap = ((size_t)p->n + p->max_new) / (size_t)L->page_tokens + 2;
	x.pages = malloc(x.cap * sizeof *x.pages);
	all = malloc(((size_t)p->n + p->max_new + 1) * sizeof *all);
	logits = kv_alloc(KV_MEM_SCRATCH, (size_t)V * sizeof *logits);
	if (!x.pages || !all || !logits) {
		rc = kv_fail(KV_ERR_NOMEM, "run: scratch for %u tokens", p->n + p->max_new);
		goto out;
	}
	memcpy(all, p->prompt, (size_t)p->n * sizeof *all);
	if ((x.ctx_rows = kss_decode_ctx_rows(p, m)) &&
	    !(x.ctx_hidden = kv_alloc(KV_MEM_SCRATCH, (size_t)x.ctx_rows * ke_model_config(m)->hidden * sizeof(float))))
		x.ctx_rows = 0; /* the head starts without the prompt's context */

	/* 0. another running request prefilling a stop point we share: wait
	 * for it, then find it in the cache */
	x.sched = p->sched;
	if (p->sched) {
		/* provisional stops: what the lookup may choose from */
		uint32_t *pv = malloc((p->n_bounds + 1) * sizeof *pv);
		size_t n_pv = 0;
		for (size_t i = 0; pv && i < p->n_bounds; i++)
			pv[n_pv++] = p->bounds[i];
		if (pv)
			pv[n_pv++] = p->n;
		x.flight = kss_sched_flight_begin(p->sched, c, p->prompt, p->n, pv, pv ? n_pv : 0,
						  (const atomic_int *)p->cancel, &r->waited);
		free(pv);
	}

	/* 1. lookup: RAM, then the disk tier for what RAM lacks, then the
	 * remote tier (store/remote.h) for what both lack */
	t0 = kv_now_ns();
	struct kc_turn_req tr = {.tokens = p->prompt, .n = p->n, .bounds = p->bounds, .n_bounds = p->n_bounds};
	if ((rc = kc_turn_begin(c, &tr, &x.turn)))
		goto out;
	hit = kc_turn_hit(x.turn);
	for (int remote = 0; remote < 2 && p->store; remote++) {
		uint32_t got;
		if (hit->pos + 1 >= p->n || (remote && !ks_store_has_remote(p->store)) ||
		    !(got = tier_fetch(p->store, remote, p, hit)))
			continue;
		if (remote)
			r->from_remote = got;
		else
			r->from_disk = got;
		/* the tier put a longer resume point into RAM: use it */
		kc_turn_free(x.turn);
		x.turn = NULL;
		if ((rc = kc_turn_begin(c, &tr, &x.turn)))
			goto out;
		hit = kc_turn_hit(x.turn);
	}
	r->resumed = hit->pos;
	r->shared = hit->shared;
	r->n_next = hit->n_next; /* what the prompt departs from (the miss explainer) */
	memcpy(r->next, hit->next, sizeof r->next);
	r->lookup_ms = ms_since(t0);

	/* 2. restore */
	t0 = kv_now_ns();
	if (hit->pos) {
		struct kv_page **pg = malloc(((size_t)hit->n_pages + 1) * sizeof *pg);
		if (!pg) {
			rc = kv_fail(KV_ERR_NOMEM, "run: page list of %u", hit->n_pages);
			goto out;
		}
		kc_hit_pages(hit, pg);
		struct ke_resume rs = {
			.pos = (int)hit->pos, .tokens = p->prompt, .pages = pg, .tail = hit->tail,
			.tail_stride = (int)hit->tail_stride, .snapshot = hit->snap,
			.snapshot_len = hit->snap ? L->snapshot_bytes : 0,
		};
		rc = ke_seq_resume(m, &sp, &rs, &s);
		free(pg);
	} else {
		rc = ke_seq_create(m, &sp, &s);
	}
	if (rc)
		goto out;
	r->restore_ms = ms_since(t0);
	if (p->on_resume)
		p->on_resume(p->cb_ctx, r);

	/* 3. hybrid prefill projection */
	if (x.hybrid && p->mem_cap) {
		/* The sequence exists: its scratch and state are in `used`. */
		struct kc_prefill_need need = {.used = kv_mem_total(), .remaining_tokens = p->n - hit->pos,
					       .cap = p->mem_cap};
		kc_cache_reclaim_prefill(c, &need, NULL, NULL); /* not fitting is not fatal */
	}

	/* 4. prefill with stop points */
	t0 = kv_now_ns();
	st = kc_turn_stops(x.turn, &n_st);
	x.tstops = st;
	x.n_tstops = n_st;
	x.every = p->on_every ? p->every : 0;
	x.on_every = p->on_every;
	x.every_ctx = p->every_ctx;
	if (!p->on_every && p->store && ks_store_ckpt_interval(p->store)) {
		x.every = ks_store_ckpt_interval(p->store);
		x.on_every = disk_checkpoint;
		x.every_ctx = p->store;
	}
	/* the turn's stops merged with the interval points in (resume, n]
	 * and, for a dense model run through a scheduler, the message
	 * boundaries: a dense turn stores only at its end, so these are the
	 * points where a request waiting for a shared prefix can be given it
	 * (on_stop). Chunk ends never change results (batch invariance). */
	size_t n_iv = x.every ? (p->n / x.every - hit->pos / x.every) : 0, n_all = 0, n_sh = 0;
	size_t n_db = p->sched && !x.hybrid ? p->n_bounds : 0;
	stops = malloc((n_st + n_iv + n_db + 1) * sizeof *stops);
	share = malloc((n_st + n_db + 1) * sizeof *share);
	if (!stops || !share) {
		rc = kv_fail(KV_ERR_NOMEM, "run: %zu stops", n_st);
		goto out;
	}
	for (size_t i = 0; i < n_st; i++)
		stops[n_all++] = (int)st[i];
	for (uint32_t iv = x.every ? (hit->pos / x.every + 1) * x.every : 0; x.every && iv <= p->n; iv += x.every)
		stops[n_all++] = (int)iv;
	for (size_t i = 0; i < n_db; i++)
		if (p->bounds[i] > hit->pos && p->bounds[i] < p->n)
			stops[n_all++] = (int)p->bounds[i];
	qsort(stops, n_all, sizeof *stops, cmp_int);
	{
		size_t u = 0;
		for (size_t i = 0; i < n_all; i++)
			if (!u || stops[i] != stops[u - 1])
				stops[u++] = stops[i];
		n_all = u;
	}
	for (size_t i = 0; i < n_all; i++)
		if (is_turn_stop(&x, stops[i]) || (n_db && is_bound(p, (uint32_t)stops[i])))
			share[n_sh++] = (uint32_t)stops[i];
	if (p->sched) {
		kss_sched_flight_stops(p->sched, x.flight, share, n_sh);
		kss_sched_join(p->sched);
		joined = 1;
	}
	rc = prefill(&x, p, s, stops, n_all, logits);
	kss_sched_flight_end(p->sched, x.flight);
	x.flight = NULL;
	r->prefilled = p->n - hit->pos;
	r->stops = x.stops;
	r->prefill_ms = ms_since(t0);
	if (rc)
		goto out;
	if (p->logits)
		memcpy(p->logits, logits, (size_t)V * sizeof *logits);

	/* 5. decode (session/decode.h): feed back every generated token but
	 * the last, plainly or verifying drafts */
	t0 = kv_now_ns();
	struct kss_decode dc = {.p = p, .s = s, .logits = logits, .all = all, .total = p->n, .every = x.every,
				.on_every = x.on_every, .every_ctx = x.every_ctx, .ctx_hidden = x.n_ctx ? x.ctx_hidden : NULL,
				.n_ctx = x.n_ctx};
	rc = kss_decode_run(&dc);
	total = dc.total;
	r->generated = dc.generated;
	r->spec = dc.spec;
	r->decode_ms = ms_since(t0);
	if (rc)
		goto out;

	/* 6. store the completion entry */
	t0 = kv_now_ns();
	rc = kc_turn_end(x.turn, all, total,
			 kc_turn_wants_end(x.turn, total) ? take_snap(&x, s) : NULL, seq_pages(&x, s));
	r->store_ms = ms_since(t0);
out:
	if (p->sched && x.flight) {
		kss_sched_flight_end(p->sched, x.flight);
	}
	if (joined)
		kss_sched_leave(p->sched);
	kc_turn_free(x.turn);
	ke_seq_destroy(s);
	free(stops);
	free(share);
	free(x.pages);
	free(all);
	kv_free(logits);
	kv_free(x.ctx_hidden);
	return rc;
}
