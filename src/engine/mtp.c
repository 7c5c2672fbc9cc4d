/*
 * mtp.c - see mtp.h. The head's decoder layer runs through forward.c
 * (ke_forward_layer) on a sequence of its own: the head's KV pages in its
 * one-layer layout (engine_int.h struct ke_mtp_head), positions counted
 * from the context's start.
 */
#include "engine/mtp.h"
#include "engine/engine_int.h"
#include "engine/matmul.h"
#include "engine/sample.h"
#include "engine/vec.h"
#include "base/err.h"
#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

struct ke_mtp_seq {
	struct ke_model *m;
	struct ke_seq ps;         /* the head's sequence: its pages and context length (pos) */
	int base;                 /* the sequence position of context row 0 */
	float *cat;               /* [KE_MTP_ROWS][2 hidden] the fc input */
	float *g;                 /* [hidden] the head's output at the last row */
	float *logits;            /* [vocab] */
};

int ke_mtp_seq_create(struct ke_model *m, struct ke_mtp_seq **out)
{
	*out = NULL;
	if (!m->mtp)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: the model has no MTP head", m->dir);
	struct ke_mtp_seq *ms = calloc(1, sizeof *ms);
	if (!ms)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	ms->m = m;
	ms->ps.m = m;
	size_t D = (size_t)m->cfg.hidden, sb = ke_scratch_plan(m, KE_MTP_ROWS, NULL, NULL);
	void *block = kv_alloc(KV_MEM_SCRATCH, sb);
	ms->cat = kv_alloc(KV_MEM_SCRATCH, KE_MTP_ROWS * 2 * D * sizeof(float));
	ms->g = kv_alloc(KV_MEM_SCRATCH, D * sizeof(float));
	ms->logits = kv_alloc(KV_MEM_SCRATCH, (size_t)m->cfg.vocab * sizeof(float));
	if (block)
		ke_scratch_plan(m, KE_MTP_ROWS, &ms->ps.sc, block);
	if (!block || !ms->cat || !ms->g || !ms->logits) {
		kv_free(block);
		ms->ps.sc.block = NULL;
		ke_mtp_seq_destroy(ms);
		return kv_fail(KV_ERR_NOMEM, "MTP head: out of memory for its scratch");
	}
	*out = ms;
	return KV_OK;
}

void ke_mtp_seq_destroy(struct ke_mtp_seq *ms)
{
	if (!ms)
		return;
	for (int i = 0; i < ms->ps.n_pages; i++)
		kv_page_unref(ms->ps.pages[i]);
	free(ms->ps.pages);
	kv_free(ms->ps.sc.block);
	kv_free(ms->cat);
	kv_free(ms->g);
	kv_free(ms->logits);
	free(ms);
}

int ke_mtp_seq_context(const struct ke_mtp_seq *ms)
{
	return ms->ps.pos;
}

/* Pages of the head's pool for context rows [0, end). */
static int pages_for(struct ke_mtp_seq *ms, int end)
{
	const struct ke_mtp_head *h = ms->m->mtp;
	int B = h->lay.page_tokens, need = (end + B - 1) / B;
	if (need > ms->ps.pages_cap) {
		int cap = ms->ps.pages_cap ? ms->ps.pages_cap * 2 : 16;
		while (cap < need)
			cap *= 2;
		struct kv_page **p = realloc(ms->ps.pages, (size_t)cap * sizeof *p);
		if (!p)
			return kv_fail(KV_ERR_NOMEM, "MTP head: page list");
		ms->ps.pages = p;
		ms->ps.pages_cap = cap;
	}
	while (ms->ps.n_pages < need) {
		struct kv_page *pg = kv_page_alloc(h->pages);
		if (!pg)
			return kv_fail_ctx(KV_ERR_FULL, "MTP head: KV page");
		ms->ps.pages[ms->ps.n_pages++] = pg;
	}
	return KV_OK;
}

/* n rows through the head at context positions pos .. pos + n - 1; g and
 * logits of the last row (of every row into all, when given). */
static int rows(struct ke_mtp_seq *ms, const float *hidden, const int32_t *next, int n, float *all)
{
	const struct ke_model *m = ms->m;
	const struct ke_mtp_head *h = m->mtp;
	struct ke_scratch *sc = &ms->ps.sc;
	int D = m->cfg.hidden, V = m->cfg.vocab, rc;
	float eps = (float)m->cfg.rms_eps;
	if ((rc = pages_for(ms, ms->ps.pos + n)))
		return rc;
	for (int t = 0; t < n; t++) {
		float *e = sc->x + (size_t)t * D, *c = ms->cat + (size_t)t * 2 * D;
		if (next[t] < 0 || next[t] >= V)
			return kv_fail(KV_ERR_INVALID, "MTP head: token %d outside the vocabulary", next[t]);
		ke_forward_embed(m, next[t], e);
		ke_vec_rmsnorm(c, e, h->enorm, D, eps);
		ke_vec_rmsnorm(c + D, hidden + (size_t)t * D, h->hnorm, D, eps);
	}
	ke_gemm(&h->fc, ms->cat, 2 * (size_t)D, n, sc->x, (size_t)D, 0);
	struct ke_seq *sp = &ms->ps;
	int row0[2] = {0, n}, row_seq[KE_MTP_ROWS] = {0};
	struct ke_fwd f = {.m = m, .sc = sc, .n = n, .n_seq = 1, .seqs = &sp, .row0 = row0, .row_seq = row_seq,
			   .lay = &h->lay};
	ke_forward_layer(&f, &h->layer);
	ms->ps.pos += n;
	for (int t = 0; all && t < n; t++) {
		ke_vec_rmsnorm(ms->g, sc->x + (size_t)t * D, h->norm, D, eps);
		ke_gemm(&m->lm_head, ms->g, (size_t)D, 1, all + (size_t)t * V, (size_t)V, 0);
	}
	ke_vec_rmsnorm(ms->g, sc->x + (size_t)(n - 1) * D, h->norm, D, eps);
	ke_gemm(&m->lm_head, ms->g, (size_t)D, 1, ms->logits, (size_t)V, 0);
	return KV_OK;
}

int ke_mtp_seq_logits(struct ke_mtp_seq *ms, const float *hidden, const int32_t *next, int n, float *logits)
{
	if (n < 1 || n > KE_MTP_ROWS)
		return kv_fail(KV_ERR_INVALID, "MTP head: %d rows (1..%d)", n, KE_MTP_ROWS);
	ms->base = 0;
	ms->ps.pos = 0;
	int rc = rows(ms, hidden, next, n, logits);
	ms->ps.pos = 0;
	return rc;
}

int ke_mtp_seq_draft(struct ke_mtp_seq *ms, int pos, const float *hidden, const int32_t *next, int n, int k,
		     int32_t *out)
{
	int D = ms->m->cfg.hidden, rc;
	if (n < 1 || n > KE_MTP_ROWS || k < 0 || k > 15 || pos < 0)
		return kv_fail(KV_ERR_INVALID, "MTP head: %d rows, %d drafts", n, k);
	if (pos != ms->base + ms->ps.pos) { /* not where the context ends: start again here */
		ms->base = pos;
		ms->ps.pos = 0;
	}
	if ((rc = rows(ms, hidden, next, n, NULL))) {
		ms->ps.pos = 0;
		return rc;
	}
	int keep = ms->ps.pos;
	for (int j = 0; j < k; j++) {
		out[j] = ke_argmax(ms->logits, ms->m->cfg.vocab);
		if (j + 1 == k)
			break;
		/* chain: the head's own output and its draft make the next row */
		float *g = ms->cat + (size_t)(KE_MTP_ROWS - 1) * 2 * D; /* a row rows() does not use for n = 1 */
		memcpy(g, ms->g, (size_t)D * sizeof *g);
		if ((rc = rows(ms, g, &out[j], 1, NULL))) {
			k = j + 1;
			break;
		}
	}
	ms->ps.pos = keep; /* the chained rows are drafts: taken back */
	return k;
}
