/*
 * seq.c - see seq.h. Invariant kept by every function: n_pages ==
 * ceil(pos / B) and the sequence holds exactly one reference on each.
 * Window pages (sliding layers, layout.h): n_wpages == ceil(pos / B),
 * entries before the page of the next query's first needed block are NULL
 * (dropped: the sequence keeps only its window), the others hold one
 * reference each and are never shared (a fork or resume copies the
 * window through a snapshot).
 */
#include "engine/attn.h"
#include "engine/prof.h"
#include "engine/seq.h"
#include "engine/engine_int.h"
#include "base/err.h"
#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

#define DEFAULT_CHUNK 256
#define MAX_CHUNK KE_FWD_MAX_ROWS

/* zero_rec = 0 leaves the recurrent state uninitialised: for resume,
 * which overwrites all of it with a snapshot right away (touching 12 MiB
 * twice would double the restore cost of a bench-hybrid sequence).
 * Scratch and recurrent buffers come from the model's stash when a
 * destroyed sequence left some (warm memory, see engine_int.h). */
static int seq_create(struct ke_model *m, const struct ke_seq_params *p, int zero_rec, struct ke_seq **out)
{
	struct ke_seq *s;
	*out = NULL;
	s = calloc(1, sizeof *s);
	if (!s)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	s->m = m;
	if (p)
		s->p = *p;
	if (s->p.chunk <= 0)
		s->p.chunk = DEFAULT_CHUNK;
	if (s->p.chunk > MAX_CHUNK || s->p.max_tokens < 0) {
		free(s);
		return kv_fail(KV_ERR_INVALID, "sequence: chunk must be in [1, %d] and max_tokens >= 0", MAX_CHUNK);
	}
	size_t bytes = ke_scratch_plan(m, s->p.chunk, NULL, NULL);
	void *block = ke_stash_take(m, 0, bytes);
	if (!block)
		block = kv_alloc(KV_MEM_SCRATCH, bytes);
	if (!block) {
		free(s);
		return kv_fail(KV_ERR_NOMEM, "sequence: cannot allocate %zu bytes of scratch", bytes);
	}
	ke_scratch_plan(m, s->p.chunk, &s->sc, block);
	if (m->lay.rec_bytes) {
		s->rec = ke_stash_take(m, 1, m->lay.rec_bytes);
		if (!s->rec)
			s->rec = kv_alloc(KV_MEM_SCRATCH, m->lay.rec_bytes);
		if (s->rec && zero_rec)
			memset(s->rec, 0, m->lay.rec_bytes);
		if (!s->rec) {
			ke_seq_destroy(s);
			return kv_fail(KV_ERR_NOMEM, "sequence: cannot allocate %zu bytes of recurrent state",
				       m->lay.rec_bytes);
		}
	}
	*out = s;
	return KV_OK;
}

int ke_seq_create(struct ke_model *m, const struct ke_seq_params *p, struct ke_seq **out)
{
	return seq_create(m, p, 1, out);
}

static void spec_free(struct ke_seq *s)
{
	if (!s->spec)
		return;
	ke_stash_put(s->m, 1, s->spec->alt);
	kv_free(s->spec->log);
	kv_free(s->spec->junk);
	free(s->spec);
	s->spec = NULL;
}

size_t ke_model_spec_bytes(const struct ke_model *m)
{
	if (!m->lay.rec_bytes)
		return 0;
	return m->lay.rec_bytes +
	       (size_t)m->lay.n_rec_layers * KE_SPEC_MAX_ROWS * ke_spec_log_w(m) * sizeof(float) +
	       ke_spec_junk_w(m) * sizeof(float);
}

/* The undo buffers of speculative forwards (engine_int.h struct ke_spec),
 * made on the first one. */
static int spec_alloc(struct ke_seq *s)
{
	const struct ke_model *m = s->m;
	if (s->spec)
		return KV_OK;
	struct ke_spec *sp = calloc(1, sizeof *sp);
	if (!sp)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	s->spec = sp;
	if (!m->lay.rec_bytes) /* attention only (windows too): nothing to undo but cutting */
		return KV_OK;
	sp->alt = ke_stash_take(s->m, 1, m->lay.rec_bytes);
	if (!sp->alt)
		sp->alt = kv_alloc(KV_MEM_SCRATCH, m->lay.rec_bytes);
	sp->log = kv_alloc(KV_MEM_SCRATCH,
			   (size_t)m->lay.n_rec_layers * KE_SPEC_MAX_ROWS * ke_spec_log_w(m) * sizeof(float));
	sp->junk = kv_alloc(KV_MEM_SCRATCH, ke_spec_junk_w(m) * sizeof(float));
	if (!sp->alt || !sp->log || !sp->junk) {
		spec_free(s);
		return kv_fail(KV_ERR_NOMEM, "sequence: cannot allocate %zu bytes for speculative decoding",
			       ke_model_spec_bytes(m));
	}
	return KV_OK;
}

/* A forward of n rows from position pos0 ran: speculative ones can be
 * taken back until the next change, others end any earlier undo. */
static void spec_after(struct ke_seq *s, int spec, int pos0, int n)
{
	if (!s->spec)
		return;
	s->spec->rows = 0;
	if (!spec)
		return;
	if (s->spec->alt) { /* the new state is in alt: swap (struct ke_spec) */
		float *t = s->rec;
		s->rec = s->spec->alt;
		s->spec->alt = t;
	}
	s->spec->rows = n;
	s->spec->pos0 = pos0;
}

void ke_seq_destroy(struct ke_seq *s)
{
	if (!s)
		return;
	spec_free(s);
	for (int i = 0; i < s->n_pages; i++)
		kv_page_unref(s->pages[i]);
	free(s->pages);
	for (int i = 0; i < s->n_wpages; i++)
		kv_page_unref(s->wpages[i]);
	free(s->wpages);
	kv_free(s->tokens);
	ke_stash_put(s->m, 1, s->rec);
	ke_stash_put(s->m, 0, s->sc.block);
	free(s);
}

int ke_seq_pos(const struct ke_seq *s)
{
	return s->pos;
}

const int32_t *ke_seq_tokens(const struct ke_seq *s)
{
	return s->tokens;
}

int ke_seq_n_pages(const struct ke_seq *s)
{
	return s->n_pages;
}

struct kv_page *ke_seq_page(const struct ke_seq *s, int i)
{
	return i >= 0 && i < s->n_pages ? s->pages[i] : NULL;
}

struct ke_model *ke_seq_model(const struct ke_seq *s)
{
	return s->m;
}

int ke_seq_window_pages(const struct ke_seq *s)
{
	int n = 0;
	for (int i = 0; i < s->n_wpages; i++)
		n += s->wpages[i] != NULL;
	return n;
}

size_t ke_seq_scratch_bytes(const struct ke_seq *s)
{
	return s->sc.bytes + s->m->lay.rec_bytes + (s->spec ? ke_model_spec_bytes(s->m) : 0);
}

size_t ke_seq_snapshot_bytes(const struct ke_seq *s)
{
	return s->m->lay.snapshot_bytes;
}

static int tokens_reserve(struct ke_seq *s, int need)
{
	if (need <= s->tok_cap)
		return KV_OK;
	int cap = s->tok_cap ? s->tok_cap : 1024;
	while (cap < need)
		cap = cap > (1 << 29) ? need : cap * 2;
	int32_t *t = kv_realloc(KV_MEM_OTHER, s->tokens, (size_t)cap * sizeof *t);
	if (!t)
		return kv_fail(KV_ERR_NOMEM, "sequence: out of memory for %d token ids", cap);
	s->tokens = t;
	s->tok_cap = cap;
	return KV_OK;
}

static int pages_reserve(struct ke_seq *s, int need)
{
	if (need <= s->pages_cap)
		return KV_OK;
	int cap = s->pages_cap ? s->pages_cap : 16;
	while (cap < need)
		cap *= 2;
	struct kv_page **p = realloc(s->pages, (size_t)cap * sizeof *p);
	if (!p)
		return kv_fail(KV_ERR_NOMEM, "sequence: out of memory for the page list");
	s->pages = p;
	s->pages_cap = cap;
	return KV_OK;
}

/* Make positions [pos, end) writable: copy a shared partial page, add
 * fresh pages. On failure nothing changed. */
static int pages_for(struct ke_seq *s, int end)
{
	const struct ke_layout *lay = &s->m->lay;
	int B = lay->page_tokens, rc;
	if (lay->n_segments == 0)
		return KV_OK;
	int need = (end + B - 1) / B;
	if ((rc = pages_reserve(s, need)))
		return rc;
	int have = s->n_pages;
	struct kv_page *cow = NULL;
	int part = s->pos % B;
	if (part && kv_page_refs(s->pages[s->pos / B]) > 1) {
		/* Shared partial page: never write into it; continue on a copy. */
		cow = kv_page_alloc(s->m->pages);
		if (!cow)
			return kv_fail_ctx(KV_ERR_FULL, "sequence: copy-on-write of a shared page");
		ke_layout_copy_rows(lay, cow->data, B, s->pages[s->pos / B]->data, B, part);
	}
	for (int i = have; i < need; i++) {
		struct kv_page *pg = kv_page_alloc(s->m->pages);
		if (!pg) {
			/* the pool said why (limit reached or no memory); both mean no room */
			rc = KV_ERR_FULL;
			for (int j = have; j < i; j++)
				kv_page_unref(s->pages[j]);
			kv_page_unref(cow);
			return kv_fail_ctx(rc, "sequence: KV page for position %d", i * B);
		}
		s->pages[i] = pg;
	}
	s->n_pages = need;
	if (cow) {
		kv_page_unref(s->pages[s->pos / B]);
		s->pages[s->pos / B] = cow;
	}
	return KV_OK;
}

/* The first position whose window-page rows the next query may read
 * (attn.h: the block of its window's first key). */
static int win_keep_pos(const struct ke_seq *s, int pos)
{
	int W = s->m->lay.window, lo = pos - W + 1 > 0 ? pos - W + 1 : 0;
	return lo / KE_ATTN_BLOCK * KE_ATTN_BLOCK;
}

/* Window pages for positions [pos, end): fresh pages where there are none
 * (never shared, so written in place). On failure nothing changed. */
static int wpages_for(struct ke_seq *s, int end)
{
	const struct ke_layout *wl = &s->m->wlay;
	int B = wl->page_tokens;
	if (!wl->n_segments)
		return KV_OK;
	int need = (end + B - 1) / B;
	if (need > s->wpages_cap) {
		int cap = s->wpages_cap ? s->wpages_cap : 16;
		while (cap < need)
			cap *= 2;
		struct kv_page **p = realloc(s->wpages, (size_t)cap * sizeof *p);
		if (!p)
			return kv_fail(KV_ERR_NOMEM, "sequence: out of memory for the window page list");
		s->wpages = p;
		s->wpages_cap = cap;
	}
	for (int i = s->n_wpages; i < need; i++) {
		struct kv_page *pg = kv_page_alloc(s->m->wpages);
		if (!pg) {
			for (int j = s->n_wpages; j < i; j++)
				kv_page_unref(s->wpages[j]);
			return kv_fail_ctx(KV_ERR_FULL, "sequence: window page for position %d", i * B);
		}
		s->wpages[i] = pg;
	}
	if (need > s->n_wpages)
		s->n_wpages = need;
	return KV_OK;
}

/* Drop the window pages no later query reads (below win_keep_pos). */
static void wpages_trim(struct ke_seq *s)
{
	if (!s->m->wlay.n_segments)
		return;
	int keep = win_keep_pos(s, s->pos) / s->m->wlay.page_tokens;
	for (int i = 0; i < keep && i < s->n_wpages; i++) {
		kv_page_unref(s->wpages[i]);
		s->wpages[i] = NULL;
	}
}

/* Row t of segment seg of the window pages at position q. */
static char *wrow(const struct ke_seq *s, int seg, int q)
{
	const struct ke_layout *wl = &s->m->wlay;
	int B = wl->page_tokens;
	return (char *)s->wpages[q / B]->data + ke_layout_row_off(wl, seg, q % B, B);
}

/* The windows at s->pos into a snapshot buffer (layout.h: W - 1 rows per
 * head, zeros below position 0). */
static void win_gather(const struct ke_seq *s, char *snap)
{
	const struct ke_layout *L = &s->m->lay;
	/* every window layer has the window pages' geometry (wlay) */
	int Hkv = s->m->wlay.n_kv_heads, p = s->pos;
	size_t rb = s->m->wlay.row_bytes;
	for (int w = 0; w < L->n_win_layers; w++) {
		const struct ke_win_layer *wl = &L->win[w];
		for (int kv = 0; kv < 2; kv++)
			for (int h = 0; h < Hkv; h++) {
				char *dst = snap + (kv ? wl->v_off : wl->k_off) + (size_t)h * wl->rows * rb;
				int seg = (wl->idx * 2 + kv) * Hkv + h;
				for (int i = 0; i < wl->rows; i++) {
					int q = p - wl->rows + i;
					if (q < 0)
						memset(dst + (size_t)i * rb, 0, rb);
					else
						memcpy(dst + (size_t)i * rb, wrow(s, seg, q), rb);
				}
			}
	}
}

/* Fresh window pages at s->pos from a snapshot: the rows of [lo, p) copied,
 * the rows of the first needed block below lo zeroed (attn.h reads them
 * with weight 0; they must be finite). s has no window pages yet. */
static int win_scatter(struct ke_seq *s, const char *snap)
{
	const struct ke_layout *L = &s->m->lay;
	int Hkv = s->m->wlay.n_kv_heads, p = s->pos, B = L->page_tokens, rc;
	size_t rb = s->m->wlay.row_bytes;
	if (!L->n_win_layers || !p)
		return KV_OK;
	int keep = win_keep_pos(s, p);
	s->n_wpages = keep / B; /* the entries below stay NULL */
	if ((rc = wpages_for(s, p)))
		return rc;
	for (int i = 0; i < keep / B; i++)
		s->wpages[i] = NULL;
	for (int w = 0; w < L->n_win_layers; w++) {
		const struct ke_win_layer *wl = &L->win[w];
		for (int kv = 0; kv < 2; kv++)
			for (int h = 0; h < Hkv; h++) {
				const char *src = snap + (kv ? wl->v_off : wl->k_off) + (size_t)h * wl->rows * rb;
				int seg = (wl->idx * 2 + kv) * Hkv + h;
				for (int q = keep; q < p; q++) {
					int i = q - (p - wl->rows);
					if (i < 0)
						memset(wrow(s, seg, q), 0, rb);
					else
						memcpy(wrow(s, seg, q), src + (size_t)i * rb, rb);
				}
			}
	}
	return KV_OK;
}

static int check_tokens(const struct ke_seq *s, const int32_t *tokens, int n)
{
	int V = s->m->cfg.vocab;
	for (int i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= V)
			return kv_fail(KV_ERR_INVALID, "token %d at index %d is outside the vocabulary [0, %d)", tokens[i],
				       i, V);
	return KV_OK;
}

int ke_seq_prefill(struct ke_seq *s, const int32_t *tokens, int n, const struct ke_prefill_opts *o, float *logits)
{
	struct ke_prefill_opts none = {0};
	int rc;
	if (!o)
		o = &none;
	if (n <= 0 || !tokens)
		return kv_fail(KV_ERR_INVALID, "prefill: no tokens");
	if (n > INT32_MAX - s->pos || (s->p.max_tokens && s->pos + n > s->p.max_tokens))
		return kv_fail(KV_ERR_INVALID, "prefill: %d + %d tokens exceed the sequence limit of %d", s->pos, n,
			       s->p.max_tokens);
	if ((rc = check_tokens(s, tokens, n)))
		return rc;
	if (o->n_stops < 0 || (o->n_stops > 0 && (!o->stops || !o->on_stop)))
		return kv_fail(KV_ERR_INVALID, "prefill: stops need a list and a callback");
	for (int i = 0; i < o->n_stops; i++)
		if (o->stops[i] <= s->pos || o->stops[i] > s->pos + n || (i && o->stops[i] <= o->stops[i - 1]))
			return kv_fail(KV_ERR_INVALID, "prefill: stop %d at position %d is not ascending inside (%d, %d]",
				       i, o->stops[i], s->pos, s->pos + n);
	if (o->spec && (n > KE_SPEC_MAX_ROWS || n > s->p.chunk || o->n_stops))
		return kv_fail(KV_ERR_INVALID, "prefill: a speculative forward of %d tokens (1..%d, one chunk, no stops)", n,
			       KE_SPEC_MAX_ROWS);
	if ((rc = tokens_reserve(s, s->pos + n)) || (o->spec && (rc = spec_alloc(s))))
		return rc;

	int V = s->m->cfg.vocab, D = s->m->cfg.hidden, next_stop = 0;
	int base = s->pos;   /* absolute position of tokens[0] */
	int done = 0;
	while (done < n) {
		if (o->cancel && __atomic_load_n(o->cancel, __ATOMIC_ACQUIRE))
			return kv_fail(KV_ERR_CANCELLED, "prefill cancelled at position %d", s->pos);
		int end = done + s->p.chunk < n ? done + s->p.chunk : n;
		if (next_stop < o->n_stops && o->stops[next_stop] - base < end)
			end = o->stops[next_stop] - base;
		int cnt = end - done;
		if ((rc = pages_for(s, s->pos + cnt)) || (rc = wpages_for(s, s->pos + cnt)))
			return rc;
		float *rows = o->logits_all ? o->logits_all + (size_t)done * V : NULL;
		float *last = (!rows && end == n) ? logits : NULL;
		double t0 = ke_prof_t0();
		s->spec_fwd = o->spec;
		ke_forward(s, tokens + done, cnt, rows, last);
		s->spec_fwd = 0;
		if (o->hidden_all)
			ke_forward_hidden(s->m, &s->sc, 0, cnt, o->hidden_all + (size_t)done * D);
		ke_prof_add(KE_PROF_FWD, t0, 0, 0);
		memcpy(s->tokens + s->pos, tokens + done, (size_t)cnt * sizeof *tokens);
		spec_after(s, o->spec, s->pos, cnt);
		s->pos += cnt;
		if (!o->spec) /* a speculative forward keeps its window until accepted */
			wpages_trim(s);
		done = end;
		if (rows && end == n && logits)
			memcpy(logits, rows + (size_t)(cnt - 1) * V, (size_t)V * sizeof *logits);
		if (next_stop < o->n_stops && o->stops[next_stop] == s->pos) {
			next_stop++;
			if ((rc = o->on_stop(o->ctx, s, s->pos)))
				return rc;
		}
	}
	return KV_OK;
}

int ke_seq_decode(struct ke_seq *s, int32_t token, float *logits)
{
	return ke_seq_prefill(s, &token, 1, NULL, logits);
}

int ke_seq_snapshot(const struct ke_seq *s, void *buf, size_t len)
{
	size_t need = s->m->lay.snapshot_bytes;
	if (len != need)
		return kv_fail(KV_ERR_INVALID, "snapshot: buffer of %zu bytes, the state is %zu", len, need);
	if (s->m->lay.rec_bytes)
		memcpy(buf, s->rec, s->m->lay.rec_bytes);
	win_gather(s, buf);
	return KV_OK;
}

/* Drop every window page (before a scatter). */
static void wpages_clear(struct ke_seq *s)
{
	for (int i = 0; i < s->n_wpages; i++)
		kv_page_unref(s->wpages[i]);
	s->n_wpages = 0;
}

/*
 * Drop the window pages past the position (an accept that takes rows
 * back). The speculative forward did not trim (ke_seq_prefill /
 * ke_batch_run), so the pages the kept position's window reads are all
 * still there: the rejected rows evicted nothing.
 */
static void wpages_cut(struct ke_seq *s)
{
	int B = s->m->wlay.page_tokens;
	if (!s->m->wlay.n_segments)
		return;
	int keep = (s->pos + B - 1) / B;
	for (int i = keep; i < s->n_wpages; i++) {
		kv_page_unref(s->wpages[i]);
		s->wpages[i] = NULL;
	}
	if (s->n_wpages > keep)
		s->n_wpages = keep;
}

/* Cut pages and tokens to p (no state change). */
static void cut(struct ke_seq *s, int p)
{
	const struct ke_layout *lay = &s->m->lay;
	if (s->spec)
		s->spec->rows = 0;
	if (lay->n_segments) {
		int keep = (p + lay->page_tokens - 1) / lay->page_tokens;
		for (int i = keep; i < s->n_pages; i++)
			kv_page_unref(s->pages[i]);
		s->n_pages = keep;
	}
	s->pos = p;
}

int ke_seq_accept(struct ke_seq *s, int keep)
{
	struct ke_spec *sp = s->spec;
	if (!sp || !sp->rows || s->pos != sp->pos0 + sp->rows)
		return kv_fail(KV_ERR_INVALID, "accept: the last forward of this sequence was not speculative");
	if (keep < 1 || keep > sp->rows)
		return kv_fail(KV_ERR_INVALID, "accept: keep %d of %d rows", keep, sp->rows);
	if (keep < sp->rows && sp->alt) {
		/* back to the state before the forward, then the kept rows */
		float *t = s->rec;
		s->rec = sp->alt;
		sp->alt = t;
		ke_spec_replay(s, keep);
	}
	if (keep < sp->rows) {
		cut(s, sp->pos0 + keep);
		wpages_cut(s);
	}
	sp->rows = 0;
	wpages_trim(s);
	return KV_OK;
}

int ke_seq_rewind(struct ke_seq *s, int p, const void *snap, size_t len)
{
	size_t need = s->m->lay.snapshot_bytes;
	if (p < 0 || p > s->pos)
		return kv_fail(KV_ERR_INVALID, "rewind to %d: the sequence is at %d", p, s->pos);
	if (need) {
		if (snap && len != need)
			return kv_fail(KV_ERR_INVALID, "rewind: snapshot of %zu bytes, the state is %zu", len, need);
		if (!snap && p != s->pos && p != 0)
			return kv_fail(KV_ERR_INVALID, "rewind to %d: a hybrid model needs a snapshot taken there", p);
		size_t rb = s->m->lay.rec_bytes;
		if (snap && rb)
			memcpy(s->rec, snap, rb);
		else if (p == 0 && rb)
			memset(s->rec, 0, rb);
		if (snap || p == 0) {
			wpages_clear(s);
			cut(s, p);
			return win_scatter(s, snap);
		}
	} else if (snap && len) {
		return kv_fail(KV_ERR_INVALID, "rewind: a dense model has no recurrent snapshot");
	}
	cut(s, p);
	return KV_OK;
}

int ke_seq_truncate(struct ke_seq *s, int p)
{
	if (p < 0 || p > s->pos)
		return kv_fail(KV_ERR_INVALID, "truncate to %d: the sequence is at %d", p, s->pos);
	if (s->m->lay.snapshot_bytes && p != s->pos)
		return kv_fail(KV_ERR_UNSUPPORTED, "truncate: a hybrid model's recurrent state cannot be cut; "
			       "rewind with a snapshot taken at %d", p);
	cut(s, p);
	return KV_OK;
}

int ke_seq_resume(struct ke_model *m, const struct ke_seq_params *p, const struct ke_resume *r, struct ke_seq **out)
{
	const struct ke_layout *lay = &m->lay;
	struct ke_seq *s = NULL;
	int B = lay->page_tokens, rc;
	*out = NULL;
	if (r->pos < 0 || (r->pos > 0 && !r->tokens))
		return kv_fail(KV_ERR_INVALID, "resume: position %d without tokens", r->pos);
	if (p && p->max_tokens && r->pos > p->max_tokens)
		return kv_fail(KV_ERR_INVALID, "resume: position %d past the sequence limit %d", r->pos, p->max_tokens);
	int n_full = lay->n_segments ? r->pos / B : 0, tail = lay->n_segments ? r->pos % B : 0;
	if (n_full && !r->pages)
		return kv_fail(KV_ERR_INVALID, "resume at %d: %d full pages needed, none given", r->pos, n_full);
	for (int i = 0; i < n_full; i++)
		if (!r->pages[i] || r->pages[i]->pool != m->pages)
			return kv_fail(KV_ERR_INCOMPATIBLE, "resume: page %d is not from this model's page pool", i);
	if (tail && (!r->tail || r->tail_stride < tail))
		return kv_fail(KV_ERR_INVALID, "resume at %d: a tail of %d rows is needed", r->pos, tail);
	if (lay->snapshot_bytes) {
		if (!r->snapshot || r->snapshot_len != lay->snapshot_bytes)
			return kv_fail(KV_ERR_INVALID, "resume at %d: a hybrid model needs a snapshot of %zu bytes (got %zu)",
				       r->pos, lay->snapshot_bytes, r->snapshot ? r->snapshot_len : 0);
	} else if (r->snapshot && r->snapshot_len) {
		return kv_fail(KV_ERR_INVALID, "resume: a dense model has no recurrent snapshot");
	}
	if ((rc = seq_create(m, p, lay->rec_bytes == 0, &s)))
		return rc;
	if (r->pos && (rc = check_tokens(s, r->tokens, r->pos)))
		goto fail;
	if ((rc = tokens_reserve(s, r->pos > 0 ? r->pos : 1)) || (rc = pages_reserve(s, n_full + 1)))
		goto fail;
	for (int i = 0; i < n_full; i++) {
		kv_page_ref(r->pages[i]);
		s->pages[s->n_pages++] = r->pages[i];
	}
	if (tail) {
		struct kv_page *pg = kv_page_alloc(m->pages);
		if (!pg) {
			rc = kv_fail_ctx(KV_ERR_FULL, "resume: tail page");
			goto fail;
		}
		ke_layout_copy_rows(lay, pg->data, B, r->tail, r->tail_stride, tail);
		s->pages[s->n_pages++] = pg;
	}
	if (r->pos)
		memcpy(s->tokens, r->tokens, (size_t)r->pos * sizeof *s->tokens);
	if (lay->rec_bytes)
		memcpy(s->rec, r->snapshot, lay->rec_bytes);
	s->pos = r->pos;
	if (lay->n_win_layers && (rc = win_scatter(s, r->snapshot)))
		goto fail;
	*out = s;
	return KV_OK;
fail:
	ke_seq_destroy(s);
	return rc;
}

int ke_seq_fork(const struct ke_seq *src, int p, const struct ke_seq_params *params, struct ke_seq **out)
{
	const struct ke_layout *lay = &src->m->lay;
	int B = lay->page_tokens;
	*out = NULL;
	if (p < 0 || p > src->pos)
		return kv_fail(KV_ERR_INVALID, "fork at %d: the sequence is at %d", p, src->pos);
	if (lay->snapshot_bytes && p != src->pos && p != 0)
		return kv_fail(KV_ERR_INVALID, "fork at %d: a hybrid model can fork only at its position %d", p,
			       src->pos);
	struct ke_resume r = {
		.pos = p,
		.tokens = src->tokens,
		.pages = src->pages,
		.tail = (lay->n_segments && p % B) ? src->pages[p / B]->data : NULL,
		.tail_stride = B,
		.snapshot = lay->snapshot_bytes ? src->rec : NULL,
		.snapshot_len = lay->snapshot_bytes,
	};
	struct ke_seq_params sp = params ? *params : src->p;
	if (lay->snapshot_bytes && p == 0) {
		/* position 0: the zero state, not the source's */
		int rc = ke_seq_create(src->m, &sp, out);
		return rc;
	}
	if (lay->n_win_layers) {
		/* the window pages are the source's own: copy them through a snapshot */
		void *snap = kv_alloc(KV_MEM_SCRATCH, lay->snapshot_bytes);
		if (!snap)
			return kv_fail(KV_ERR_NOMEM, "fork: no memory for a %zu-byte snapshot", lay->snapshot_bytes);
		int rc = ke_seq_snapshot(src, snap, lay->snapshot_bytes);
		r.snapshot = snap;
		if (!rc)
			rc = ke_seq_resume(src->m, &sp, &r, out);
		kv_free(snap);
		return rc;
	}
	return ke_seq_resume(src->m, &sp, &r, out);
}

/* --- batches ------------------------------------------------------------ */

struct ke_batch {
	struct ke_model *m;
	int max_tokens, max_seqs;
	struct ke_scratch sc;     /* max_tokens rows */
	float *logits;            /* [logit_rows][vocab] */
	int logit_rows;           /* rows logits holds: max_seqs, grown for verifications */
	float **all;              /* [max_seqs] */
	struct ke_seq **seqs;     /* [max_seqs] */
	const int32_t **toks;     /* [max_seqs] */
	float **last;             /* [max_seqs] */
	int *row0;                /* [max_seqs + 1] */
	int *row_seq;             /* [max_tokens] */
};

int ke_batch_create(struct ke_model *m, int max_tokens, int max_seqs, struct ke_batch **out)
{
	*out = NULL;
	if (max_tokens < 1 || max_tokens > MAX_CHUNK || max_seqs < 1 || max_seqs > max_tokens)
		return kv_fail(KV_ERR_INVALID, "batch: max_tokens must be in [1, %d] and max_seqs in [1, max_tokens]",
			       MAX_CHUNK);
	struct ke_batch *b = calloc(1, sizeof *b);
	if (!b)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	b->m = m;
	b->max_tokens = max_tokens;
	b->max_seqs = max_seqs;
	size_t bytes = ke_scratch_plan(m, max_tokens, NULL, NULL);
	void *block = kv_alloc(KV_MEM_SCRATCH, bytes);
	b->logits = kv_alloc(KV_MEM_SCRATCH, (size_t)max_seqs * m->cfg.vocab * sizeof *b->logits);
	b->seqs = calloc((size_t)max_seqs, sizeof *b->seqs);
	b->toks = calloc((size_t)max_seqs, sizeof *b->toks);
	b->last = calloc((size_t)max_seqs, sizeof *b->last);
	b->all = calloc((size_t)max_seqs, sizeof *b->all);
	b->logit_rows = max_seqs;
	b->row0 = calloc((size_t)max_seqs + 1, sizeof *b->row0);
	b->row_seq = calloc((size_t)max_tokens, sizeof *b->row_seq);
	if (block)
		ke_scratch_plan(m, max_tokens, &b->sc, block);
	if (!block || !b->logits || !b->seqs || !b->toks || !b->last || !b->all || !b->row0 || !b->row_seq) {
		kv_free(block);
		b->sc.block = NULL;
		ke_batch_destroy(b);
		return kv_fail(KV_ERR_NOMEM, "batch: cannot allocate scratch for %d tokens", max_tokens);
	}
	*out = b;
	return KV_OK;
}

void ke_batch_destroy(struct ke_batch *b)
{
	if (!b)
		return;
	kv_free(b->sc.block);
	kv_free(b->logits);
	free(b->seqs);
	free(b->toks);
	free(b->last);
	free(b->all);
	free(b->row0);
	free(b->row_seq);
	free(b);
}

int ke_batch_max_tokens(const struct ke_batch *b)
{
	return b->max_tokens;
}

int ke_batch_max_seqs(const struct ke_batch *b)
{
	return b->max_seqs;
}

int ke_batch_run(struct ke_batch *b, struct ke_batch_item *items, int n_items)
{
	int total = 0, k = 0, lrows = 0;
	if (n_items < 0 || n_items > b->max_seqs)
		return kv_fail(KV_ERR_INVALID, "batch: %d items, at most %d", n_items, b->max_seqs);
	for (int i = 0; i < n_items; i++) {
		if (items[i].n < 1 || !items[i].tokens || !items[i].s || items[i].s->m != b->m)
			return kv_fail(KV_ERR_INVALID, "batch: item %d is empty or of another model", i);
		for (int j = 0; j < i; j++)
			if (items[j].s == items[i].s)
				return kv_fail(KV_ERR_INVALID, "batch: a sequence appears twice");
		if (items[i].spec && items[i].n > KE_SPEC_MAX_ROWS)
			return kv_fail(KV_ERR_INVALID, "batch: item %d: a speculative forward of %d rows (at most %d)", i,
				       items[i].n, KE_SPEC_MAX_ROWS);
		total += items[i].n;
		lrows += items[i].logits_all ? items[i].n : 1;
	}
	if (total > b->max_tokens)
		return kv_fail(KV_ERR_INVALID, "batch: %d tokens, at most %d", total, b->max_tokens);
	if (lrows > b->logit_rows) {
		/* verifications want every row's logits: grown once, kept */
		float *nl = kv_alloc(KV_MEM_SCRATCH, (size_t)lrows * b->m->cfg.vocab * sizeof *nl);
		if (!nl)
			return kv_fail(KV_ERR_NOMEM, "batch: logits of %d rows", lrows);
		kv_free(b->logits);
		b->logits = nl;
		b->logit_rows = lrows;
	}
	b->row0[0] = 0;
	for (int i = 0; i < n_items; i++) {
		struct ke_batch_item *it = &items[i];
		struct ke_seq *s = it->s;
		if (s->p.max_tokens && s->pos + it->n > s->p.max_tokens)
			it->rc = kv_fail(KV_ERR_INVALID, "batch: %d + %d tokens exceed the sequence limit of %d", s->pos,
					 it->n, s->p.max_tokens);
		else if (!(it->rc = check_tokens(s, it->tokens, it->n)) && !(it->rc = tokens_reserve(s, s->pos + it->n)) &&
			 !(it->rc = it->spec ? spec_alloc(s) : KV_OK) && !(it->rc = pages_for(s, s->pos + it->n)))
			it->rc = wpages_for(s, s->pos + it->n);
		if (it->rc)
			continue;
		s->spec_fwd = it->spec;
		b->seqs[k] = s;
		b->toks[k] = it->tokens;
		b->last[k] = it->logits;
		b->all[k] = it->logits_all;
		b->row0[k + 1] = b->row0[k] + it->n;
		for (int t = b->row0[k]; t < b->row0[k + 1]; t++)
			b->row_seq[t] = k;
		k++;
	}
	if (k) {
		struct ke_fwd f = {.m = b->m, .sc = &b->sc, .n = b->row0[k], .n_seq = k, .seqs = b->seqs,
				   .row0 = b->row0, .row_seq = b->row_seq};
		double t0 = ke_prof_t0();
		ke_forward_batch(&f, b->toks, b->last, b->all, b->logits);
		ke_prof_add(KE_PROF_FWD, t0, 0, 0);
	}
	for (int i = 0, j = 0; i < n_items; i++) {
		struct ke_batch_item *it = &items[i];
		if (it->rc)
			continue;
		if (it->hidden)
			ke_forward_hidden(b->m, &b->sc, b->row0[j], it->n, it->hidden);
		j++;
		it->s->spec_fwd = 0;
		memcpy(it->s->tokens + it->s->pos, it->tokens, (size_t)it->n * sizeof *it->tokens);
		spec_after(it->s, it->spec, it->s->pos, it->n);
		it->s->pos += it->n;
		if (!it->spec)
			wpages_trim(it->s);
	}
	return KV_OK;
}
