/*
 * genrun.c - a generation request on its worker (see gen_int.h): the
 * session runs it (session/request.h kss_request) and reports through the
 * sink below; the sink hands the wire format (wire.h) what to send, and at
 * the end the request is counted, logged and its answer remembered.
 */
#include "server/gen_int.h"
#include "session/spec.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "session/echo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- the session's sink (worker thread) ------------------------------------- */

static void on_admitted(void *ctx)
{
	gen_set_phase(ctx, PH_STARTED);
}

/* The stream's first bytes, once: the usage split is known (or the
 * request failed before its lookup and the error follows). */
static void stream_start(struct gen *g)
{
	if (g->started || !g->in.req.stream)
		return;
	g->started = 1;
	g->w->start(&g->ans, &g->sse);
	gen_emit(g);
}

/* How often a long prefill says something: a keep-alive on the stream
 * (Anthropic ping, Responses comment) and an info log line. */
#define KEEPALIVE_NS 1000000000ull
#define PROGRESS_LOG_NS 3000000000ull

/* The wire's progress event (OpenAI prompt_progress with return_progress,
 * a keep-alive when due), on a stream that started. */
static void stream_progress(struct gen *g, uint32_t done, uint64_t now, int keepalive_due)
{
	if (!g->in.req.stream || !g->started || !g->w->progress)
		return;
	struct ksv_progress p = {.total = g->in.pr.n_tokens,
				 .cache = g->ans.usage.cached_tokens,
				 .processed = done,
				 .time_ms = (int64_t)((now - g->t_prefill0) / 1000000),
				 .keepalive = keepalive_due};
	g->w->progress(&g->ans, &p, &g->sse);
	if (keepalive_due)
		g->t_last_ka = now;
	gen_emit(g);
}

static void on_resumed(void *ctx, const struct kss_usage *u)
{
	struct gen *g = ctx;
	uint64_t now = kv_now_ns();
	g->ans.usage = *u;
	g->t_prefill0 = g->t_last_ka = g->t_last_log = now;
	atomic_store_explicit(&g->live.prompt_tokens, g->in.pr.n_tokens, memory_order_relaxed);
	atomic_store_explicit(&g->live.cached_tokens, u->cached_tokens, memory_order_relaxed);
	atomic_store_explicit(&g->live.processed, u->cached_tokens, memory_order_relaxed);
	atomic_store_explicit(&g->live.t_prefill_ns, now, memory_order_relaxed);
	atomic_store_explicit(&g->live.phase, KSV_IF_PREFILL, memory_order_relaxed);
	stream_start(g);
	/* llama.cpp sends a first progress chunk before any work (processed =
	 * cache) */
	stream_progress(g, u->cached_tokens, now, 0);
}

/* A prefill chunk is done: done of total prompt tokens are in the
 * sequence (the cached ones included). */
static void on_progress(void *ctx, uint32_t done, uint32_t total)
{
	struct gen *g = ctx;
	uint64_t now = kv_now_ns();
	atomic_store_explicit(&g->live.processed, done, memory_order_relaxed);
	stream_progress(g, done, now, now - g->t_last_ka >= KEEPALIVE_NS);
	if (now - g->t_last_log >= PROGRESS_LOG_NS && done < total) {
		/* a prefill of minutes is not silent in the log either */
		uint32_t cached = g->ans.usage.cached_tokens;
		double el = (double)(now - g->t_prefill0) / 1e9;
		double rate = el > 0 && done > cached ? (double)(done - cached) / el : 0;
		g->t_last_log = now;
		KV_INFO("request.progress",
			"route=%s phase=prefill processed=%u total=%u cached=%u elapsed_s=%.1f tok_s=%.0f eta_s=%.0f", g->route,
			done, total, cached, el, rate, rate > 0 ? (double)(total - done) / rate : -1.0);
	}
}

static void on_token(void *ctx, const struct kss_token *t)
{
	struct gen *g = ctx;
	uint64_t now = kv_now_ns();
	if (!atomic_fetch_add_explicit(&g->live.gen_tokens, 1, memory_order_relaxed)) {
		atomic_store_explicit(&g->live.t_first_ns, now, memory_order_relaxed);
		atomic_store_explicit(&g->live.phase, KSV_IF_DECODE, memory_order_relaxed);
	}
	if (g->t_prev)
		ksv_observe(g->s->f_itl, (double)(now - g->t_prev) / 1e9);
	g->t_prev = now;
	ksv_answer_token(&g->ans, t);
	kv_buf_add(&g->gen_ids, &t->id, sizeof t->id);
}

static void on_event(void *ctx, const struct kv_out_ev *e)
{
	struct gen *g = ctx;
	if (e->kind == KV_OUT_REASONING && e->len)
		g->step_reasoning = 1;
	ksv_answer_event(&g->ans, e, g->in.req.stream ? &g->sse : NULL);
}

static void on_step(void *ctx)
{
	struct gen *g = ctx;
	if (g->step_reasoning)
		g->ans.reasoning_tokens++;
	g->step_reasoning = 0;
	if (!g->in.req.stream)
		return;
	if (g->w->step)
		g->w->step(&g->ans, &g->sse);
	gen_emit(g);
}

static const struct kss_sink sink = {
	.admitted = on_admitted,
	.resumed = on_resumed,
	.progress = on_progress,
	.token = on_token,
	.event = on_event,
	.step = on_step,
};

/* --- the worker ------------------------------------------------------------ */

/* The "kvkeep" usage extension: what --prompt-normalize changed and where
 * the prompt departs from the cache. New ref, or NULL. */
static json_t *usage_ext(const struct gen *g)
{
	if (!g->in.norm_report && !g->res.have_explain && !g->in.pr.n_restored)
		return NULL;
	json_t *j = json_object();
	if (g->in.norm_report)
		json_object_set(j, "normalized", g->in.norm_report);
	if (g->res.have_explain)
		json_object_set_new(j, "cache", ksv_explain_json(&g->res.ex, g->in.trusted));
	if (g->in.pr.n_restored) {
		/* the server's own answers the prompt used as generated */
		json_t *a = json_array();
		for (size_t i = 0; i < g->in.pr.n_restored; i++)
			json_array_append_new(a, json_integer(g->in.pr.restored[i]));
		json_object_set_new(j, "restored_messages", a);
	}
	return j;
}

static const char *cons_name(int kind)
{
	static const char *const names[] = {[KSS_CONS_NONE] = "none", [KSS_CONS_SCHEMA] = "json_schema",
					    [KSS_CONS_JSON_OBJECT] = "json_object", [KSS_CONS_GBNF] = "grammar",
					    [KSS_CONS_TOOLS] = "tools"};
	return kind >= 0 && kind <= KSS_CONS_TOOLS ? names[kind] : "?";
}

static int fail_status(int why)
{
	switch (why) {
	case KSS_FAIL_BUSY:
	case KSS_FAIL_MEMORY:
		return 503;
	case KSS_FAIL_SAMPLER:
		return 400;
	case KSS_FAIL_CANCELLED:
		return 499;
	default:
		return 500;
	}
}

/* Metrics and the dashboard's record of a request that ran. */
static void account(struct gen *g)
{
	struct ksv_server *s = g->s;
	const struct kss_request_result *r = &g->res;
	int cancelled = r->fail == KSS_FAIL_CANCELLED;
	ksv_metrics_add(s->f_prompt_tok, g->in.pr.n_tokens);
	ksv_metrics_add(s->f_cached_tok, r->usage.cached_tokens);
	ksv_metrics_add(s->f_gen_tok, r->generated);
	ksv_series_add(ksv_series_get(s->f_resume, "kind", r->resume_kind, NULL), 1);
	ksv_observe(s->f_e2e, (double)(kv_now_ns() - g->t_arrive) / 1e9);
	if (r->t_first_ns)
		ksv_observe(s->f_ttft, (double)(r->t_first_ns - g->t_arrive) / 1e9);
	if (cancelled)
		return;
	uint32_t np = r->usage.prompt_tokens, pc = r->usage.cached_tokens;
	uint32_t from_disk = r->from_disk ? (r->from_disk < pc ? r->from_disk : pc) : 0;
	/* what the remote tier added beyond the disk's (the tiers are asked in
	 * that order: session/run.c) */
	uint32_t from_remote = r->from_remote ? (r->from_remote < pc ? r->from_remote : pc) : 0;
	from_remote = from_remote > from_disk ? from_remote - from_disk : 0;
	struct ksv_recent_req rec = {.t_ms = kv_wall_ms(), .prompt_tokens = np,
				     .cached_ram = pc - from_disk - from_remote, .cached_disk = from_disk,
				     .cached_remote = from_remote, .gen_tokens = r->generated,
				     .ttft_ms = r->t_first_ns ? (double)(r->t_first_ns - g->t_arrive) / 1e6 : 0,
				     .prefill_ms = r->prefill_ms, .decode_ms = r->decode_ms,
				     .miss = r->have_explain && pc < np ? ksv_explain_json(&r->ex, 1) : NULL,
				     .salted = g->in.salt != NULL};
	snprintf(rec.route, sizeof rec.route, "%s", g->route);
	snprintf(rec.resume, sizeof rec.resume, "%s", r->resume_kind);
	ksv_recent_add(s->recent, &rec);
}

/*
 * Remember the answer exactly (session/echo.h), so that when the client
 * sends it back the prompt uses these tokens: the generation prompt (the
 * prompt after its last message), then every generated token. Only for chat answers that ended normally, under
 * --reasoning-history keep and --echo-generated on.
 */
static void remember_answer(struct gen *g)
{
	struct ksv_server *s = g->s;
	struct ksv_answer *a = &g->ans;
	const struct ksv_prompt *pr = &g->in.pr;
	if (g->in.req.api != KSV_API_CHAT || !pr->gp_text || strcmp(s->o.echo_generated, "on") ||
	    strcmp(s->o.reasoning_history, "keep"))
		return;
	struct kss_echo_call *calls = calloc(a->n_tools ? a->n_tools : 1, sizeof *calls);
	struct kss_echo_answer ea = {.gp_text = pr->gp_text, .gp_len = pr->gp_len,
				     .prefix = pr->tokens + pr->gp_tok, .n_prefix = pr->n_tokens - pr->gp_tok,
				     .gen = (const int32_t *)g->gen_ids.p, .n_gen = g->gen_ids.len / sizeof(int32_t),
				     .calls = calls};
	ea.content = ksv_answer_text(a, KSV_BLK_TEXT, &ea.content_len);
	ea.reasoning = ksv_answer_text(a, KSV_BLK_REASONING, &ea.reasoning_len);
	for (size_t i = 0; calls && i < a->n_blk; i++)
		if (a->blk[i].kind == KSV_BLK_TOOL)
			calls[ea.n_calls++] = (struct kss_echo_call){.id = a->blk[i].call_id, .name = a->blk[i].name,
								     .args = a->blk[i].text.p ? a->blk[i].text.p : "{}",
								     .args_len = a->blk[i].text.p ? a->blk[i].text.len : 2};
	if (calls && kss_echo_remember_answer(s->svc, g->in.salt, &ea))
		KV_DEBUG("echo.remember_failed", "route=%s err=\"%s\"", g->route, kv_errmsg());
	kv_errclear();
	free(calls);
	free((char *)ea.content);
	free((char *)ea.reasoning);
}

/* The stream's end: the wire's finish, or its error event. */
static void stream_end(struct gen *g, int status, const char *msg)
{
	stream_start(g);
	if (status) {
		g->w->stream_error(&g->ans, status, msg, &g->sse);
	} else {
		ksv_answer_close(&g->ans, &g->sse);
		g->w->finish(&g->ans, &g->sse);
	}
	gen_emit(g);
}

void gen_run(struct ksv_job *job)
{
	struct gen *g = (struct gen *)job;
	struct ksv_server *s = g->s;
	struct kss_request_result *r = &g->res;
	uint64_t t_start = kv_now_ns();
	ksv_observe(s->f_queue_wait, (double)(t_start - g->job.t_submit_ns) / 1e9);

	/* request > server defaults (flag > generation_config > OpenAI) */
	struct kss_request_params rp = {
		.route = g->route,
		.salt = g->in.salt,
		.prompt = g->in.pr.tokens,
		.n_prompt = g->in.pr.n_tokens,
		.grammar = g->in.grammar,
		.may_think = s->o.split_reasoning && g->in.req.api == KSV_API_CHAT && g->in.req.enable_thinking != 0,
		.bounds = g->in.pr.bounds,
		.n_bounds = g->in.pr.n_bounds,
		.max_tokens = (uint32_t)g->in.max_tokens,
		.logprobs = g->in.req.logprobs,
		.top_logprobs = g->in.req.top_logprobs,
		.ignore_eos = g->in.req.ignore_eos,
		.no_speculation = !g->in.req.speculative,
		.out = {.stop = g->in.req.stop,
			.n_stop = g->in.req.n_stop,
			.split_reasoning = s->o.split_reasoning && g->in.req.api == KSV_API_CHAT,
			.in_think = g->in.pr.in_think,
			.tools = g->in.req.tool_choice != KSV_TC_NONE ? g->in.req.tools : NULL,
			.xml_tools = s->xml_tools,
			.harmony = s->harmony && g->in.req.api == KSV_API_CHAT},
		.cancel = &g->job.cancel,
	};
	ksv_sampling_resolve(&g->in.req.sp, &s->sdef, kv_now_ns() ^ (uint64_t)(uintptr_t)g, &rp.sp);
	/* on the dashboard while it runs (inflight.h) */
	snprintf(g->live.route, sizeof g->live.route, "%s", g->route);
	g->live.t_arrive_ms = kv_wall_ms() - (int64_t)((t_start - g->t_arrive) / 1000000);
	g->live.t_start_ns = g->t_arrive;
	ksv_inflight_add(s->inflight, &g->live);
	kss_request(s->svc, &rp, &sink, g, r);
	ksv_inflight_remove(s->inflight, &g->live);

	int cancelled = r->fail == KSS_FAIL_CANCELLED;
	int status = r->fail ? fail_status(r->fail) : 0;
	const char *why = NULL; /* a cancelled request: why (httpd.h ksv_stream_gone_why) */
	if (r->fail == KSS_FAIL_MEMORY && !r->admitted)
		ksv_metrics_add(s->f_rej_503, 1);
	/* counted before the client gets its answer, so a client that reads
	 * /metrics right after sees its own request */
	if (r->admitted)
		account(g);
	if (cancelled)
		ksv_metrics_add(s->f_cancelled, 1);
	/* the answer's end */
	g->ans.usage = r->usage;
	g->ans.finish = r->finish;
	g->ans.stop_sequence = r->stop_hit && g->in.req.n_stop ? g->in.req.stop[0] : NULL;
	g->ans.ext = usage_ext(g);
	if (r->admitted && !r->fail)
		remember_answer(g);
	if (!r->admitted) {
		pthread_mutex_lock(&g->mu);
		g->fail_status = status ? status : 500;
		snprintf(g->fail_msg, sizeof g->fail_msg, "%s", r->err[0] ? r->err : "internal error");
		g->phase = PH_DONE;
		pthread_cond_broadcast(&g->cv);
		pthread_mutex_unlock(&g->mu);
	} else {
		if (g->in.req.stream && cancelled && atomic_load(&s->stopping))
			/* shutdown, not a hang-up: tell the client why the stream ends */
			stream_end(g, 503, "the server is shutting down");
		else if (g->in.req.stream && !cancelled)
			stream_end(g, status, r->err);
		pthread_mutex_lock(&g->mu);
		if (status && !cancelled && !g->in.req.stream) {
			g->fail_status = status;
			snprintf(g->fail_msg, sizeof g->fail_msg, "%s", r->err);
		}
		g->phase = PH_DONE;
		if (cancelled)
			why = atomic_load(&s->stopping) ? "shutdown" : g->stream ? ksv_stream_gone_why(g->stream) : "hangup";
		if (g->stream) {
			ksv_stream_end(g->stream);
			g->stream = NULL;
		}
		pthread_cond_broadcast(&g->cv);
		pthread_mutex_unlock(&g->mu);
	}

	double dur = (double)(kv_now_ns() - g->t_arrive) / 1e9;
	double gen_s = r->t_first_ns ? (double)(r->t_last_ns - r->t_first_ns) / 1e9 : 0;
	unsigned spec_drafted = r->spec.drafted[0] + r->spec.drafted[1];
	unsigned spec_accepted = r->spec.accepted[0] + r->spec.accepted[1];
	KV_INFO("request",
		"route=%s stream=%d prompt_tokens=%u cached_tokens=%u resume=%s disk=%d remote=%d restored_messages=%zu "
		"gen_tokens=%u constraint=%s finish=%s%s%s ttft_ms=%.1f tok_s=%.1f queue_ms=%.1f prefill_ms=%.1f total_ms=%.1f "
		"spec=%s spec_drafted=%u spec_accepted=%u spec_acceptance=%.2f%s%s",
		g->route, g->in.req.stream, r->usage.prompt_tokens, r->usage.cached_tokens,
		r->admitted ? r->resume_kind : "none", r->from_disk > 0, r->from_remote > 0, g->in.pr.n_restored, r->generated,
		cons_name(g->in.cons_kind),
		cancelled ? "cancelled" : status ? "error" : r->finish, why ? " why=" : "", why ? why : "",
		r->t_first_ns ? (double)(r->t_first_ns - g->t_arrive) / 1e6 : 0.0,
		gen_s > 0 && r->generated > 1 ? (r->generated - 1) / gen_s : 0.0, (double)(t_start - g->job.t_submit_ns) / 1e6,
		r->prefill_ms, dur * 1e3, kss_spec_mode_name(r->speculative), spec_drafted, spec_accepted,
		spec_drafted ? (double)spec_accepted / spec_drafted : 0.0, status && !cancelled ? " error=" : "",
		status && !cancelled ? r->err : "");
	/* the worker's reference is dropped in gen_done, after the queue is
	 * through with the job */
}

void gen_done(struct ksv_job *job)
{
	gen_unref((struct gen *)job);
}

