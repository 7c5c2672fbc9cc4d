/*
 * decode.c - see decode.h.
 */
#include "session/decode.h"
#include "session/spec.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/mem.h"
#include "engine/mtp.h"
#include "engine/sample.h"

#include <string.h>

struct dec {
	struct kss_decode *d;
	const struct kss_run_params *p;
	int V, D;
	struct kss_spec *sp;
	float *rows;              /* KE_SPEC_MAX_ROWS x V: a verification's logits */
	/* the MTP head (engine/mtp.h), NULL when not used. Its context is
	 * fed lazily: the hidden states of the fed rows wait in `pend` (the
	 * positions [pend_pos, pend_pos + n_pend)) until a draft asks for the
	 * head; their next tokens are the sequence's (all[], then tok) */
	struct ke_mtp_seq *mtp;
	float *hid;               /* KE_SPEC_MAX_ROWS x D: the last forward's hidden states */
	float *pend;              /* KE_MTP_ROWS x D */
	int n_pend;
	uint32_t pend_pos;
	int32_t tok;              /* the newest picked token */
};

/* One forward of one token: through the scheduler's batch, or here. */
static int forward1(struct dec *x, int32_t tok, float *logits)
{
	if (x->p->sched)
		return x->mtp ? kss_sched_forward_hidden(x->p->sched, x->d->s, &tok, 1, logits, x->hid)
			      : kss_sched_forward(x->p->sched, x->d->s, &tok, 1, logits);
	struct ke_prefill_opts o = {.hidden_all = x->mtp ? x->hid : NULL};
	return ke_seq_prefill(x->d->s, &tok, 1, &o, logits);
}

/* A verification of n rows, every row's logits into x->rows. */
static int verify(struct dec *x, const int32_t *tok, int n)
{
	float *hid = x->mtp ? x->hid : NULL;
	if (x->p->sched)
		return kss_sched_verify(x->p->sched, x->d->s, tok, n, x->rows, hid);
	struct ke_prefill_opts o = {.logits_all = x->rows, .hidden_all = hid, .spec = 1, .cancel = x->p->cancel};
	return ke_seq_prefill(x->d->s, tok, n, &o, NULL);
}

/* Hidden states of n rows ending at the sequence's end join the MTP
 * head's waiting context; the oldest go when it is full (the head then
 * starts its context again, mtp.h). */
static void pend_add(struct dec *x, const float *h, int n)
{
	if (!x->mtp || n <= 0)
		return;
	uint32_t end = x->d->total;
	if (n > KE_MTP_ROWS) {
		h += (size_t)(n - KE_MTP_ROWS) * x->D;
		n = KE_MTP_ROWS;
	}
	if (x->n_pend + n > KE_MTP_ROWS) {
		int drop = x->n_pend + n - KE_MTP_ROWS;
		memmove(x->pend, x->pend + (size_t)drop * x->D, (size_t)(x->n_pend - drop) * x->D * sizeof *x->pend);
		x->n_pend -= drop;
	}
	memcpy(x->pend + (size_t)x->n_pend * x->D, h, (size_t)n * x->D * sizeof *h);
	x->n_pend += n;
	x->pend_pos = end - (uint32_t)x->n_pend;
}

/* The MTP head as spec.h's draft source: the waiting context, then up to
 * max drafts after the newest picked token. */
static int mtp_draft(void *ctx, int max, int32_t *out, double *seconds)
{
	struct dec *x = ctx;
	int32_t next[KE_MTP_ROWS];
	uint64_t t0 = kv_now_ns();
	*seconds = 0.0;
	if (!x->n_pend)
		return 0;
	for (int i = 0; i < x->n_pend; i++) {
		uint32_t q = x->pend_pos + (uint32_t)i + 1;
		next[i] = q < x->d->total ? x->d->all[q] : x->tok;
	}
	int k = ke_mtp_seq_draft(x->mtp, (int)x->pend_pos, x->pend, next, x->n_pend, max, out);
	x->n_pend = 0;
	*seconds = (double)(kv_now_ns() - t0) / 1e9;
	return k > 0 ? k : 0;
}

/* The token plain decoding would take as its i-th: forced, the caller's
 * pick, or greedy. Non-zero: generation ends without a token. */
static int pick(struct dec *x, uint32_t i, const float *logits, int32_t *tok)
{
	const struct kss_run_params *p = x->p;
	if (p->forced)
		*tok = p->forced[i];
	else if (p->pick)
		return p->pick(p->pick_ctx, logits, x->V, tok);
	else
		*tok = ke_argmax(logits, x->V);
	return KV_OK;
}

static int is_stop(const struct kss_run_params *p, int32_t tok)
{
	for (size_t k = 0; k < p->n_stop_ids; k++)
		if (tok == p->stop_ids[k])
			return 1;
	return 0;
}

/* Take a picked token: out, the count, the draft sources' history. */
static void took(struct dec *x, int32_t tok)
{
	if (x->p->out)
		x->p->out[x->d->generated] = tok;
	x->d->generated++;
	if (x->sp && kss_spec_append(x->sp, tok) != KV_OK) {
		/* the lookup index could not grow: decode on without drafts */
		kss_spec_destroy(x->sp);
		x->sp = NULL;
	}
}

/* Feed rows[0..keep) that are now the sequence's: the token list and the
 * checkpoint interval. */
static void fed(struct dec *x, const int32_t *rows, int keep)
{
	struct kss_decode *d = x->d;
	memcpy(d->all + d->total, rows, (size_t)keep * sizeof *rows);
	d->total += (uint32_t)keep;
	if (d->every && d->total % d->every == 0)
		d->on_every(d->every_ctx, d->s, (int)d->total);
}

static double secs_since(uint64_t t0)
{
	return (double)(kv_now_ns() - t0) / 1e9;
}

/*
 * One verification: rows = [tok, draft[0..k)]. Picks at each row in
 * order; returns through *next the token the last pick chose (the next
 * step's tok) and *end = 1 when generation ends. KV_OK or the engine's
 * error.
 */
static int spec_step(struct dec *x, int32_t tok, const int32_t *draft, int k, int src, int32_t *next, int *end)
{
	const struct kss_run_params *p = x->p;
	int32_t rows[KE_SPEC_MAX_ROWS];
	int keep = 0, rc;
	rows[0] = tok;
	memcpy(rows + 1, draft, (size_t)k * sizeof *draft);
	uint64_t t0 = kv_now_ns();
	if ((rc = verify(x, rows, k + 1)))
		return rc;
	/* the step's cost: the forward, then the rollback (timed below) */
	double dt = secs_since(t0);
	*end = 0;
	for (int i = 0; i <= k; i++) {
		int32_t t;
		keep = i + 1; /* rows 0..i hold real tokens */
		if (pick(x, x->d->generated, x->rows + (size_t)i * x->V, &t) != KV_OK) {
			*end = 1;
			break;
		}
		took(x, t);
		*next = t;
		if (is_stop(p, t) || x->d->generated == p->max_new) {
			*end = 1;
			break;
		}
		if (i == k || t != draft[i])
			break;
	}
	uint64_t t1 = kv_now_ns();
	if ((rc = ke_seq_accept(x->d->s, keep)))
		return rc;
	dt += secs_since(t1);
	fed(x, rows, keep);
	pend_add(x, x->hid, keep);
	if (x->sp)
		kss_spec_verified(x->sp, src, k, keep - 1, dt);
	x->d->spec.steps++;
	x->d->spec.drafted[src] += (uint32_t)k;
	x->d->spec.accepted[src] += (uint32_t)(keep - 1);
	return KV_OK;
}

int kss_decode_ctx_rows(const struct kss_run_params *p, const struct ke_model *m)
{
	int mtp_mode = p->speculative == KSS_SPEC_MTP || p->speculative == KSS_SPEC_AUTO;
	return mtp_mode && !p->spec_draft && p->max_new > 1 && ke_model_has_mtp(m) ? KE_MTP_ROWS : 0;
}

int kss_decode_run(struct kss_decode *d)
{
	const struct kss_run_params *p = d->p;
	struct ke_model *m = ke_seq_model(d->s);
	struct dec x = {.d = d, .p = p, .V = ke_model_config(m)->vocab, .D = ke_model_config(m)->hidden};
	int32_t tok, draft[KE_SPEC_MAX_ROWS];
	int rc = KV_OK, max_rows = 0;

	d->generated = 0;
	memset(&d->spec, 0, sizeof d->spec);
	if (!p->max_new)
		return KV_OK;
	if (p->speculative) {
		max_rows = p->sched ? kss_sched_spec_rows(p->sched) : KE_SPEC_MAX_ROWS;
		int md = p->spec_max_draft ? p->spec_max_draft : KSS_RUN_SPEC_DRAFT;
		if (md > max_rows - 1)
			md = max_rows - 1;
		struct kss_spec_params sp = {.mode = p->speculative, .max_draft = md, .mtp = p->spec_draft,
					     .mtp_ctx = p->spec_draft_ctx};
		x.rows = md >= 1 ? kv_alloc(KV_MEM_SCRATCH, (size_t)(md + 1) * x.V * sizeof *x.rows) : NULL;
		if (x.rows && kss_decode_ctx_rows(p, m) && ke_mtp_seq_create(m, &x.mtp) == KV_OK) {
			x.hid = kv_alloc(KV_MEM_SCRATCH, (size_t)KE_SPEC_MAX_ROWS * x.D * sizeof *x.hid);
			x.pend = kv_alloc(KV_MEM_SCRATCH, (size_t)KE_MTP_ROWS * x.D * sizeof *x.pend);
			if (!x.hid || !x.pend) { /* without the head, then */
				ke_mtp_seq_destroy(x.mtp);
				x.mtp = NULL;
			} else {
				sp.mtp = mtp_draft;
				sp.mtp_ctx = &x;
				pend_add(&x, d->ctx_hidden, d->ctx_hidden ? d->n_ctx : 0);
			}
		}
		/* speculation is an optimisation: without its memory, decode plainly */
		if (x.rows && kss_spec_create(&sp, d->all, d->total, &x.sp) != KV_OK)
			x.sp = NULL;
	}
	if (pick(&x, 0, d->logits, &tok) != KV_OK)
		goto out;
	took(&x, tok);
	x.tok = tok;
	for (;;) {
		if (is_stop(p, tok) || d->generated == p->max_new)
			break;
		/* a draft of at most: the picks left after this one, and the
		 * rows left before the next checkpoint position */
		int budget = (int)(p->max_new - d->generated) - 1, src = -1, k = 0;
		if (d->every) {
			uint32_t to_next = d->every - d->total % d->every;
			if ((int)to_next - 1 < budget)
				budget = (int)to_next - 1;
		}
		if (x.sp && budget > 0)
			k = kss_spec_draft(x.sp, budget, draft, &src);
		if (k > 0) {
			int end;
			if ((rc = spec_step(&x, tok, draft, k, src, &tok, &end)) || end)
				break;
			x.tok = tok;
			continue;
		}
		uint64_t t0 = kv_now_ns();
		if ((rc = forward1(&x, tok, d->logits)))
			break;
		if (x.sp)
			kss_spec_plain(x.sp, secs_since(t0));
		d->spec.plain += x.sp ? 1 : 0;
		fed(&x, &tok, 1);
		pend_add(&x, x.hid, 1);
		if (pick(&x, d->generated, d->logits, &tok) != KV_OK)
			break;
		took(&x, tok);
		x.tok = tok;
	}
out:
	if (x.sp)
		d->spec.mtp_ms = (double)kss_spec_stats(x.sp)->mtp_s_us / 1e3;
	kss_spec_destroy(x.sp);
	ke_mtp_seq_destroy(x.mtp);
	kv_free(x.rows);
	kv_free(x.hid);
	kv_free(x.pend);
	return rc;
}
