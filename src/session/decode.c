/*
 * decode.c - see decode.h.
 */
#include "session/decode.h"
#include "session/spec.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/mem.h"
#include "engine/sample.h"

#include <string.h>

struct dec {
	struct kss_decode *d;
	const struct kss_run_params *p;
	int V;
	struct kss_spec *sp;
	float *rows;              /* KE_SPEC_MAX_ROWS x V: a verification's logits */
};

/* One forward of one token: through the scheduler's batch, or here. */
static int forward1(struct dec *x, int32_t tok, float *logits)
{
	if (x->p->sched)
		return kss_sched_forward(x->p->sched, x->d->s, &tok, 1, logits);
	return ke_seq_prefill(x->d->s, &tok, 1, NULL, logits);
}

/* A verification of n rows, every row's logits into x->rows. */
static int verify(struct dec *x, const int32_t *tok, int n)
{
	if (x->p->sched)
		return kss_sched_verify(x->p->sched, x->d->s, tok, n, x->rows, NULL);
	struct ke_prefill_opts o = {.logits_all = x->rows, .spec = 1, .cancel = x->p->cancel};
	return ke_seq_prefill(x->d->s, tok, n, &o, NULL);
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
	if ((rc = ke_seq_accept(x->d->s, keep)))
		return rc;
	fed(x, rows, keep);
	if (x->sp)
		kss_spec_verified(x->sp, src, k, keep - 1, dt);
	x->d->spec.steps++;
	x->d->spec.drafted[src] += (uint32_t)k;
	x->d->spec.accepted[src] += (uint32_t)(keep - 1);
	return KV_OK;
}

int kss_decode_run(struct kss_decode *d)
{
	const struct kss_run_params *p = d->p;
	struct dec x = {.d = d, .p = p, .V = ke_model_config(ke_seq_model(d->s))->vocab};
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
		/* speculation is an optimisation: without its memory, decode plainly */
		if (x.rows && kss_spec_create(&sp, d->all, d->total, &x.sp) != KV_OK)
			x.sp = NULL;
	}
	if (pick(&x, 0, d->logits, &tok) != KV_OK)
		goto out;
	took(&x, tok);
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
			continue;
		}
		uint64_t t0 = kv_now_ns();
		if ((rc = forward1(&x, tok, d->logits)))
			break;
		if (x.sp)
			kss_spec_plain(x.sp, secs_since(t0));
		d->spec.plain += x.sp ? 1 : 0;
		fed(&x, &tok, 1);
		if (pick(&x, d->generated, d->logits, &tok) != KV_OK)
			break;
		took(&x, tok);
	}
out:
	if (x.sp)
		d->spec.mtp_ms = (double)kss_spec_stats(x.sp)->mtp_s_us / 1e3;
	kss_spec_destroy(x.sp);
	kv_free(x.rows);
	return rc;
}
