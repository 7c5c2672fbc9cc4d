/*
 * run.c - see run.h.
 */
#include "cache/run.h"
#include "cache/turn.h"
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
};

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
	if (!is_turn_stop(x, pos))
		return KV_OK;
	x->stops++;
	return kc_turn_at_stop(x->turn, (uint32_t)pos, take_snap(x, s), seq_pages(x, s));
}

static int argmax(const float *l, int v)
{
	int best = 0;
	for (int i = 1; i < v; i++)
		if (l[i] > l[best])
			best = i;
	return best;
}

static double ms_since(uint64_t t0)
{
	return (double)(kv_now_ns() - t0) / 1e6;
}

int kc_run(struct kc_cache *c, struct ke_model *m, const struct kc_run_params *p, struct kc_run_result *r)
{
	const struct ke_layout *L = ke_model_layout(m);
	const struct kc_hit *hit;
	struct run_ctx x = {.c = c};
	struct ke_seq *s = NULL;
	struct ke_seq_params sp = {.chunk = p->chunk};
	int V = ke_model_config(m)->vocab, rc;
	int32_t *all = NULL;
	float *logits = NULL;
	int *stops = NULL;
	const uint32_t *st;
	size_t n_st;
	uint32_t total, n_gen = 0;
	uint64_t t0;

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

	/* 1. lookup */
	t0 = kv_now_ns();
	struct kc_turn_req tr = {.tokens = p->prompt, .n = p->n, .bounds = p->bounds, .n_bounds = p->n_bounds};
	if ((rc = kc_turn_begin(c, &tr, &x.turn)))
		goto out;
	hit = kc_turn_hit(x.turn);
	r->resumed = hit->pos;
	r->shared = hit->shared;
	r->n_next = hit->n_next;
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
	/* the turn's stops merged with the interval points in (resume, n] */
	size_t n_iv = x.every ? (p->n / x.every - hit->pos / x.every) : 0, n_all = 0;
	stops = malloc((n_st + n_iv + 1) * sizeof *stops);
	if (!stops) {
		rc = kv_fail(KV_ERR_NOMEM, "run: %zu stops", n_st);
		goto out;
	}
	{
		size_t i = 0;
		uint32_t iv = x.every ? (hit->pos / x.every + 1) * x.every : UINT32_MAX;
		while (i < n_st || (x.every && iv <= p->n)) {
			uint32_t a = i < n_st ? st[i] : UINT32_MAX, b = x.every && iv <= p->n ? iv : UINT32_MAX;
			uint32_t v = a < b ? a : b;
			stops[n_all++] = (int)v;
			if (a == v)
				i++;
			if (b == v)
				iv += x.every;
		}
	}
	struct ke_prefill_opts po = {.stops = stops, .n_stops = (int)n_all, .on_stop = on_stop, .ctx = &x,
				     .cancel = p->cancel};
	rc = ke_seq_prefill(s, p->prompt + hit->pos, (int)(p->n - hit->pos), &po, logits);
	r->prefilled = p->n - hit->pos;
	r->stops = x.stops;
	r->prefill_ms = ms_since(t0);
	if (rc)
		goto out;
	if (p->logits)
		memcpy(p->logits, logits, (size_t)V * sizeof *logits);

	/* 5. decode: feed back every generated token but the last */
	t0 = kv_now_ns();
	total = p->n;
	for (uint32_t i = 0; i < p->max_new; i++) {
		int32_t tok;
		int stop = 0;
		if (p->forced)
			tok = p->forced[i];
		else if (p->pick) {
			if (p->pick(p->pick_ctx, logits, V, &tok) != KV_OK)
				break;
		} else
			tok = argmax(logits, V);
		if (p->out)
			p->out[i] = tok;
		n_gen++;
		for (size_t k = 0; k < p->n_stop_ids; k++)
			stop |= tok == p->stop_ids[k];
		if (stop || i + 1 == p->max_new)
			break;
		if ((rc = ke_seq_decode(s, tok, logits)))
			goto out;
		all[total++] = tok;
		if (x.every && total % x.every == 0)
			x.on_every(x.every_ctx, s, (int)total);
	}
	r->generated = n_gen;
	r->decode_ms = ms_since(t0);

	/* 6. store the completion entry */
	t0 = kv_now_ns();
	rc = kc_turn_end(x.turn, all, total,
			 kc_turn_wants_end(x.turn, total) ? take_snap(&x, s) : NULL, seq_pages(&x, s));
	r->store_ms = ms_since(t0);
out:
	kc_turn_free(x.turn);
	ke_seq_destroy(s);
	free(stops);
	free(x.pages);
	free(all);
	kv_free(logits);
	return rc;
}
