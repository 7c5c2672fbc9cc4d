/*
 * request.c - see request.h.
 */
#include "session/request.h"
#include "session/run.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "engine/layout.h"
#include "store/store.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ull * 1024ull)

struct kss_service {
	struct kss_service_params p;
	int32_t eos[KSS_MAX_EOS];
	int vocab;
	int hybrid;
	const struct ke_layout *lay;
	struct kss_cons *cons;          /* compiled constraints (constrain.h) */
	/* the admission projections of the requests running now: they may
	 * still grow to them, so they count as used */
	atomic_uint_fast64_t reserved;
	pthread_mutex_t spec_mu;        /* guards spec */
	struct kss_spec_totals spec;
};

int kss_service_create(const struct kss_service_params *p, struct kss_service **out)
{
	struct kss_service *s = calloc(1, sizeof *s);
	*out = NULL;
	if (!s)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	s->p = *p;
	if (s->p.n_eos > KSS_MAX_EOS)
		s->p.n_eos = KSS_MAX_EOS;
	for (int i = 0; i < s->p.n_eos; i++)
		s->eos[i] = p->eos[i];
	s->p.eos = s->eos;
	s->vocab = ke_model_config(p->model)->vocab;
	s->lay = ke_model_layout(p->model);
	s->hybrid = ke_layout_nontrim(s->lay);
	struct kss_cons_params cp = {.tok = p->tok, .vocab = s->vocab, .eos = s->eos, .n_eos = s->p.n_eos};
	int rc = kss_cons_create(&cp, &s->cons);
	if (rc) {
		free(s);
		return rc;
	}
	pthread_mutex_init(&s->spec_mu, NULL);
	*out = s;
	return KV_OK;
}

void kss_service_destroy(struct kss_service *s)
{
	if (!s)
		return;
	kss_cons_free(s->cons);
	pthread_mutex_destroy(&s->spec_mu);
	free(s);
}

struct kss_cons *kss_service_cons(struct kss_service *s)
{
	return s->cons;
}

void kss_service_spec_totals(struct kss_service *s, struct kss_spec_totals *out)
{
	pthread_mutex_lock(&s->spec_mu);
	*out = s->spec;
	pthread_mutex_unlock(&s->spec_mu);
}

/* A request's speculation, added to the totals. */
static void spec_account(struct kss_service *s, const struct kss_run_spec *sp)
{
	pthread_mutex_lock(&s->spec_mu);
	s->spec.requests++;
	s->spec.steps += sp->steps;
	s->spec.plain += sp->plain;
	for (int i = 0; i < 2; i++) {
		s->spec.drafted[i] += sp->drafted[i];
		s->spec.accepted[i] += sp->accepted[i];
	}
	pthread_mutex_unlock(&s->spec_mu);
}

/* Memory a speculating request adds (engine/seq.h ke_model_spec_bytes,
 * the logits of a verification, the lookup index): admission counts it. */
static uint64_t spec_overhead(const struct kss_service *s, uint32_t n)
{
	int md = s->p.spec_max_draft ? s->p.spec_max_draft : KSS_RUN_SPEC_DRAFT;
	return ke_model_spec_bytes(s->p.model) + (uint64_t)(md + 1) * (uint64_t)s->vocab * sizeof(float) +
	       3ull * 4 * (2ull * n + 8192) + 4ull * n;
}

uint64_t kss_request_overhead(const struct ke_model *m, int chunk)
{
	return ke_model_layout(m)->snapshot_bytes + ke_model_scratch_bytes(m, chunk ? chunk : 256) +
	       ke_model_window_seq_bytes(m, chunk) +
	       (uint64_t)ke_model_config(m)->vocab * sizeof(float);
}

uint64_t kss_service_request_overhead(const struct kss_service *s)
{
	return kss_request_overhead(s->p.model, s->p.prefill_chunk);
}

struct kss_registry *kss_service_registry(struct kss_service *s)
{
	return s->p.reg;
}

const struct kv_tok *kss_service_tok(const struct kss_service *s)
{
	return s->p.tok;
}

void kss_service_away(struct kss_service *s, int away)
{
	kss_sched_away(s->p.engine, away);
}

/* --- one request ------------------------------------------------------------ */

struct req {
	struct kss_service *s;
	const struct kss_request_params *p;
	const struct kss_sink *k;
	void *ctx;
	struct kss_request_result *r;
	struct kss_tier tier;
	struct ke_sampler *smp;
	struct kv_out *out;
	struct kv_tok_stream ds;
	struct kv_buf piece;
	int cache_on;             /* the tier keeps what this request prefills */
	struct kss_cmatch *cm;    /* structured output, or NULL */
	float *masked;            /* logits as the constraint leaves them (logprobs) */
};

static int is_eos(const struct kss_service *s, int32_t t)
{
	for (int i = 0; i < s->p.n_eos; i++)
		if (s->eos[i] == t)
			return 1;
	return 0;
}

static int cancelled(const struct req *q)
{
	return q->p->cancel && atomic_load(q->p->cancel);
}

/* The output pipeline's events go to the sink as they are. */
static void on_out_event(void *ctx, const struct kv_out_ev *e)
{
	struct req *q = ctx;
	if (q->k->event)
		q->k->event(q->ctx, e);
}

/* The usage split once the resume point p is known. */
static void usage_at(struct req *q, uint32_t p)
{
	struct kss_usage *u = &q->r->usage;
	u->prompt_tokens = q->p->n_prompt;
	u->cached_tokens = p < u->prompt_tokens ? p : u->prompt_tokens;
	/* what this request adds to the cache: the prompt it computes, which
	 * the turn stores (the completion entry covers it; docs/api.md) */
	u->cache_creation_tokens = q->cache_on ? u->prompt_tokens - u->cached_tokens : 0;
}

static void on_resume(void *ctx, const struct kss_run_result *rr)
{
	struct req *q = ctx;
	usage_at(q, rr->resumed);
	if (q->k->resumed)
		q->k->resumed(q->ctx, &q->r->usage);
}

static void on_progress(void *ctx, uint32_t pos, uint32_t n)
{
	struct req *q = ctx;
	if (q->k->progress)
		q->k->progress(q->ctx, pos, n);
}

static void fail(struct req *q, int why, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(struct req *q, int why, const char *fmt, ...)
{
	va_list ap;
	q->r->fail = why;
	va_start(ap, fmt);
	vsnprintf(q->r->err, sizeof q->r->err, fmt, ap);
	va_end(ap);
}

/* Stop codes of pick (any non-KV_OK value ends decoding). */
enum { PICK_EOS = 1, PICK_STOP_STRING = 2, PICK_CANCEL = 3, PICK_FAIL = 4 };

static void token_logprobs(struct req *q, const float *logits, int32_t t, struct kss_token *ti)
{
	const struct kv_tok_bytes *tb = q->s->p.tb;
	int top = q->p->top_logprobs;
	if (top > KSS_MAX_TOP_LOGPROBS)
		top = KSS_MAX_TOP_LOGPROBS;
	ti->logprob = ke_token_logprob(logits, q->s->vocab, t);
	ti->n_top = top ? ke_top_logprobs(logits, q->s->vocab, top, ti->top_id, ti->top_lp) : 0;
	/* under a constraint fewer tokens than asked may be possible: the
	 * impossible ones (-inf) are not alternatives */
	while (ti->n_top > 0 && !isfinite(ti->top_lp[ti->n_top - 1]))
		ti->n_top--;
	for (int i = 0; i < ti->n_top; i++)
		ti->top_bytes[i] = kv_tok_bytes_get(tb, ti->top_id[i], &ti->top_len[i]);
}

/*
 * kss_run's pick callback: one decode step. Samples, reports the token
 * and its logprobs, feeds its text through the output pipeline (whose
 * events reach the sink), and decides whether generation goes on. The
 * cancel flag is read before every token, so a client that left stops
 * the generation within one step.
 */
static int pick(void *ctx, const float *logits, int vocab, int32_t *tok)
{
	struct req *q = ctx;
	struct kss_request_result *r = q->r;
	(void)vocab;
	uint64_t now = kv_now_ns();
	if (!r->t_first_ns)
		r->t_first_ns = now; /* the first call comes right after the prefill */
	r->t_last_ns = now;
	if (cancelled(q))
		return PICK_CANCEL;
	const uint32_t *mask = NULL;
	if (q->cm && kss_cmatch_mask(q->cm, &mask)) {
		fail(q, KSS_FAIL_ENGINE, "constraint: %s", kv_errmsg());
		return PICK_FAIL;
	}
	int32_t t = mask ? ke_sample_masked(q->smp, logits, mask) : ke_sample(q->smp, logits);
	if (q->cm && kss_cmatch_accept(q->cm, t)) {
		fail(q, KSS_FAIL_ENGINE, "constraint: %s", kv_errmsg());
		return PICK_FAIL;
	}
	if (mask && q->p->logprobs) {
		/* the reported distribution is the one sampled from */
		memcpy(q->masked, logits, (size_t)q->s->vocab * sizeof *logits);
		ke_logits_mask(q->masked, q->s->vocab, mask);
		logits = q->masked;
	}
	if (!q->p->ignore_eos && is_eos(q->s, t)) {
		r->finish = "stop";
		return PICK_EOS;
	}
	r->generated++;
	struct kss_token ti = {.id = t};
	ti.bytes = kv_tok_bytes_get(q->s->p.tb, t, &ti.len);
	if (q->p->logprobs)
		token_logprobs(q, logits, t, &ti);
	if (q->k->token)
		q->k->token(q->ctx, &ti);
	kv_buf_reset(&q->piece);
	kv_tok_stream_feed(&q->ds, t, &q->piece);
	int hit = kv_out_feed(q->out, q->piece.p ? q->piece.p : "", q->piece.len);
	if (q->k->step)
		q->k->step(q->ctx);
	*tok = t;
	if (hit == 1) {
		r->finish = "stop";
		r->stop_hit = 1;
		return PICK_STOP_STRING;
	}
	return KV_OK;
}


/* Admission: the request's projected memory against the cap; the cache
 * gives up LRU entries before we ever answer 503. 0 or the failure. */
static int admit(struct req *q, uint64_t need)
{
	struct kss_service *s = q->s;
	uint64_t cap = s->p.mem_cap, released = 0;
	if (!cap)
		return 0;
	/* the requests running beside this one may still grow to their own
	 * projections: they count as used (conservatively: what they already
	 * hold is in kv_mem_total too) */
	uint64_t used = kv_mem_total() + atomic_load(&s->reserved);
	if (kc_cache_admit(q->tier.cache, used, need, cap, &released) != KV_ERR_FULL)
		return 0;
	if (q->tier.cache != s->p.cache && kc_cache_admit(s->p.cache, used, need, cap, &released) != KV_ERR_FULL)
		return 0;
	fail(q, KSS_FAIL_MEMORY,
	     "not enough memory for this request (%llu MiB projected, cap %llu MiB) and the cache has nothing left to "
	     "evict; retry later",
	     (unsigned long long)(need / MiB), (unsigned long long)(cap / MiB));
	return 1;
}

static const char *resume_kind(const struct req *q, uint32_t p, uint32_t shared)
{
	if (p == 0)
		return "miss";
	if (q->s->hybrid && q->p->n_bounds && p == q->p->bounds[0])
		return "anchor"; /* the end of system + tools */
	if (q->s->hybrid && p < shared)
		return "snap";
	return "hit";
}

/* After the run: what the output pipeline still holds, the finish reason. */
static void finish_output(struct req *q)
{
	kv_buf_reset(&q->piece);
	kv_tok_stream_finish(&q->ds, &q->piece);
	if (q->piece.len)
		kv_out_feed(q->out, q->piece.p, q->piece.len);
	kv_out_finish(q->out);
	if (q->k->step)
		q->k->step(q->ctx);
	q->r->n_tool_calls = kv_out_n_tool_calls(q->out);
	if (q->r->n_tool_calls > 0 && !strcmp(q->r->finish, "stop"))
		q->r->finish = "tool_calls";
}

void kss_request(struct kss_service *s, const struct kss_request_params *p, const struct kss_sink *sink, void *ctx,
		 struct kss_request_result *r)
{
	static const struct kss_sink none = {0};
	struct req q = {.s = s, .p = p, .k = sink ? sink : &none, .ctx = ctx, .r = r};
	struct kss_run_result res;
	uint64_t reserved = 0;
	int rc;

	memset(r, 0, sizeof *r);
	memset(&res, 0, sizeof res);
	r->finish = "length";
	r->resume_kind = "miss";
	if (cancelled(&q)) {
		fail(&q, KSS_FAIL_CANCELLED, "cancelled");
		return;
	}
	/* the namespace of this request: the server's, or its cache_salt's */
	if ((rc = kss_registry_get(s->p.reg, p->salt, &q.tier))) {
		fail(&q, rc == KV_ERR_FULL ? KSS_FAIL_BUSY : KSS_FAIL_ENGINE, "cache for cache_salt: %s", kv_errmsg());
		return;
	}
	q.cache_on = kc_cache_enabled(q.tier.cache);
	/* speculation (session/decode.h): the server's mode unless the
	 * request opts out; it changes nothing but speed */
	r->speculative = p->no_speculation ? 0 : s->p.speculative;
	uint64_t need = (uint64_t)(p->n_prompt + p->max_tokens) * s->lay->kv_bytes_per_token +
			kss_service_request_overhead(s) +
			(r->speculative ? spec_overhead(s, p->n_prompt + p->max_tokens) : 0);
	if (admit(&q, need))
		goto out;
	/* the sampler is this sequence's alone: its generator and its penalty
	 * counts (the prompt, for repetition_penalty) */
	if ((rc = ke_sampler_create(s->vocab, &p->sp, &q.smp))) {
		fail(&q, KSS_FAIL_SAMPLER, "%s", kv_errmsg());
		goto out;
	}
	ke_sampler_prompt(q.smp, p->prompt, p->n_prompt);
	struct kv_out_params op = p->out;
	op.fn = on_out_event;
	op.ctx = &q;
	if ((rc = kv_out_create(&op, &q.out))) {
		fail(&q, KSS_FAIL_ENGINE, "%s", kv_errmsg());
		goto out;
	}
	kv_tok_stream_init(&q.ds, s->p.tok, !p->out.harmony); /* harmony's markers are parsed */
	if (p->grammar && (kss_cmatch_create(s->cons, p->grammar, p->out.in_think, p->may_think, &q.cm) ||
			   (p->logprobs && !(q.masked = malloc((size_t)s->vocab * sizeof *q.masked))))) {
		fail(&q, KSS_FAIL_ENGINE, "constraint: %s", kv_errmsg());
		goto out;
	}

	/* the status is decided: later failures reach a streaming client as
	 * an error event */
	r->admitted = 1;
	if (q.k->admitted)
		q.k->admitted(ctx);
	atomic_fetch_add(&s->reserved, need);
	reserved = need;
	r->reserved_bytes = need;
	usage_at(&q, 0);

	/* lookup (the disk tier for what RAM lacks), restore, prefill with the
	 * policy's stop points, decode through pick(), store: every forward
	 * batched with the other running requests by the engine's scheduler */
	struct kss_run_params rp = {.prompt = p->prompt,
				   .n = p->n_prompt,
				   .bounds = p->bounds,
				   .n_bounds = p->n_bounds,
				   .max_new = p->max_tokens,
				   .pick = pick,
				   .pick_ctx = &q,
				   .mem_cap = s->p.mem_cap,
				   .chunk = s->p.prefill_chunk,
				   .cancel = (const int *)p->cancel,
				   .store = q.tier.store,
				   .sched = s->p.engine,
				   .on_resume = on_resume,
				   .on_progress = on_progress,
				   .cb_ctx = &q,
				   .speculative = r->speculative,
				   .spec_max_draft = s->p.spec_max_draft};
	rc = kss_run(q.tier.cache, s->p.model, &rp, &res);
	r->spec = res.spec;
	if (r->speculative)
		spec_account(s, &res.spec);
	ks_store_kick(q.tier.store); /* new entries for the write-behind */
	r->from_disk = res.from_disk;
	r->from_remote = res.from_remote;
	r->prefill_ms = res.prefill_ms;
	r->decode_ms = res.decode_ms;
	r->resume_kind = resume_kind(&q, res.resumed, res.shared);
	usage_at(&q, res.resumed);
	r->usage.completion_tokens = r->generated;
	uint32_t np = p->n_prompt;
	if (q.tier.cache && rc != KV_ERR_CANCELLED) {
		/* the miss explainer: where this prompt departs from the cache */
		kss_explain(s->p.tok, p->prompt, np, res.shared, res.next, res.n_next, &r->ex);
		r->have_explain = 1;
		if (res.shared < np)
			kss_explain_log(p->route ? p->route : "-", &r->ex);
	}
	if (rc == KV_ERR_CANCELLED || cancelled(&q))
		fail(&q, KSS_FAIL_CANCELLED, "cancelled");
	else if (rc)
		fail(&q, rc == KV_ERR_FULL || rc == KV_ERR_NOMEM ? KSS_FAIL_MEMORY : KSS_FAIL_ENGINE, "engine: %s",
		     kv_errmsg());
	else if (!r->fail) /* pick may have failed (the constraint) */
		finish_output(&q);
out:
	if (reserved)
		atomic_fetch_sub(&s->reserved, reserved);
	kss_registry_put(s->p.reg, &q.tier);
	kv_out_destroy(q.out);
	ke_sampler_destroy(q.smp);
	kv_buf_free(&q.piece);
	kss_cmatch_free(q.cm);
	free(q.masked);
}

/* --- the probe ---------------------------------------------------------------- */

struct probe_look {
	struct kss_service *s;
	const int32_t *prompt;
	uint32_t n;
	const uint32_t *bounds;
	size_t n_bounds;
	struct kss_probe_result *r;
};

/* What one namespace holds of the probed prompt (registry locked). */
static void probe_look(void *ctx, const struct kss_tier *t)
{
	struct probe_look *pl = ctx;
	struct kss_probe_result *r = pl->r;
	struct kc_hit hit;
	kc_cache_peek(t->cache, pl->prompt, pl->n, &hit);
	r->ram_pos = hit.pos;
	r->ram_shared = hit.shared;
	kss_explain(pl->s->p.tok, pl->prompt, pl->n, hit.shared, hit.next, hit.n_next, &r->ex);
	r->have_explain = 1;
	kc_hit_release(t->cache, &hit);
	r->disk_pos = t->store ? ks_store_probe(t->store, pl->prompt, pl->n, pl->bounds, pl->n_bounds) : 0;
	r->have_disk = t->store != NULL;
}

void kss_probe(struct kss_service *s, const char *salt, const int32_t *prompt, uint32_t n, const uint32_t *bounds,
	       size_t n_bounds, struct kss_probe_result *r)
{
	struct probe_look pl = {.s = s, .prompt = prompt, .n = n, .bounds = bounds, .n_bounds = n_bounds, .r = r};
	memset(r, 0, sizeof *r);
	/* a cache_salt probes that salt's namespace when it is open; the
	 * registry keeps it open while we look */
	r->open = kss_registry_with(s->p.reg, salt, probe_look, &pl);
}
