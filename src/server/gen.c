/*
 * gen.c - a generation request over HTTP: from its body to its answer (see
 * server_int.h). The request itself runs in session/request.h; this file
 * speaks HTTP and hands the wire format (wire.h) what the session reports.
 *
 *   connection thread (handler)            request worker (queue.h)
 *   ---------------------------            ------------------------
 *   parse the body in the route's wire
 *     format, validate (400)
 *   render the chat template -> tokens
 *     and message boundaries (prompt.c)
 *   submit to the queue (429 when full) -> kss_request (session/request.h):
 *                                          namespace, admission (503),
 *                                          sampler -> sink.admitted
 *   wait for "started" or a failure   <-  "started" (status 200 decided)
 *     (polling for a client hang-up)
 *   reply: an error, or open the SSE       lookup -> sink.resumed: the
 *     stream and attach it                 stream's first bytes; prefill;
 *                                          decode -> sink.token / event /
 *                                          step: the wire format's chunks;
 *                                          store
 *   (stream: the connection thread         the stream's last bytes, one
 *    drains the chunks; non-stream:        log line, metrics
 *    wait for done, send the body)
 *
 * A client that hangs up sets the job's cancel flag (from the stream's
 * on_gone callback or the handler's poll). The session reads it between
 * prefill chunks and before every decoded token, so the generation stops
 * within one step and its sequence (and so its pages) is released.
 *
 * Lifetime of a request (struct gen): reference counted, one reference
 * for the handler and one for the worker. A stream is ended by the worker
 * when it finishes, or by the handler when it attaches a stream to a job
 * that already finished.
 */
#include "server/server_int.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/json.h"
#include "base/log.h"
#include "server/anthropic.h"
#include "server/normalize.h"
#include "server/openai.h"
#include "server/request.h"
#include "server/wire.h"
#include "session/echo.h"
#include "session/request.h"
#include "text/toolcall.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { PH_QUEUED = 0, PH_STARTED, PH_DONE };

struct gen {
	struct ksv_job job;
	struct ksv_server *s;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int refs;
	const struct ksv_wire *w;
	const char *route;
	struct ksv_req req;
	json_t *norm_report;      /* what --prompt-normalize changed (NULL: nothing) */
	const char *salt;         /* cache_salt (borrowed from req.body), NULL: none */
	struct ksv_prompt pr;     /* the rendered prompt (prompt.c) */
	char *forced;             /* text forced at the start of the answer (tool_choice), or NULL */
	uint32_t n_forced;        /* its tokens, appended to the prompt */
	int max_tokens;
	uint64_t t_arrive;
	/* phase, under mu */
	int phase;
	int fail_status;          /* 0, or the status of a failure before start */
	char fail_msg[300];
	/* stream, under mu */
	struct ksv_stream *stream;
	struct kv_buf pend;       /* SSE bytes made before the stream was attached */
	int gone;
	/* the answer (worker; read by the handler after PH_DONE) */
	struct ksv_answer ans;
	int started;              /* the stream's first bytes are out */
	int step_reasoning;       /* the current step produced reasoning */
	uint64_t t_prev;          /* the previous decode step, for the inter-token latency */
	struct kv_buf gen_ids;    /* the generated token ids (int32_t), for the answer's record */
	struct kv_buf sse;
	struct kss_request_result res;
};

static void gen_unref(struct gen *g)
{
	pthread_mutex_lock(&g->mu);
	int left = --g->refs;
	pthread_mutex_unlock(&g->mu);
	if (left)
		return;
	ksv_req_free(&g->req);
	ksv_prompt_free(&g->pr);
	free(g->forced);
	kv_buf_free(&g->pend);
	kv_buf_free(&g->sse);
	kv_buf_free(&g->gen_ids);
	ksv_answer_free(&g->ans);
	json_decref(g->norm_report);
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
	free(g);
}

static void gen_set_phase(struct gen *g, int phase)
{
	pthread_mutex_lock(&g->mu);
	g->phase = phase;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/*
 * Bytes a stream may hold that its client has not taken. Past this the
 * request's own thread waits for the client (its sequence makes no
 * progress, the engine's scheduler does not wait for it: the others go on)
 * until the client reads, leaves, or the watchdog cuts it at
 * --stall-timeout-s.
 */
#define KSV_STREAM_HIGH_WATER (256u << 10)

/* Send the SSE bytes made so far to the client (or keep them until the
 * stream is attached). Worker thread only: g->stream is ended by this
 * thread, so it stays valid here after the lock is dropped. */
static void gen_emit(struct gen *g)
{
	struct kv_buf *b = &g->sse;
	struct ksv_stream *st = NULL;
	if (!b->len)
		return;
	pthread_mutex_lock(&g->mu);
	if (g->stream) {
		if (ksv_stream_write(g->stream, b->p, b->len))
			atomic_store(&g->job.cancel, 1);
		else
			st = g->stream;
	} else if (!g->gone) {
		kv_buf_add(&g->pend, b->p, b->len);
	}
	pthread_mutex_unlock(&g->mu);
	kv_buf_reset(b);
	if (st && ksv_stream_pending(st) > KSV_STREAM_HIGH_WATER) {
		kss_service_away(g->s->svc, 1);
		int rc;
		while ((rc = ksv_stream_wait_room(st, KSV_STREAM_HIGH_WATER / 2, 100)) == KV_ERR_TIMEOUT &&
		       !atomic_load(&g->job.cancel))
			;
		if (rc == KV_ERR_CANCELLED)
			atomic_store(&g->job.cancel, 1);
		kss_service_away(g->s->svc, 0);
	}
}

/* --- the session's sink (worker thread) ------------------------------------- */

static void on_admitted(void *ctx)
{
	gen_set_phase(ctx, PH_STARTED);
}

/* The stream's first bytes, once: the usage split is known (or the
 * request failed before its lookup and the error follows). */
static void stream_start(struct gen *g)
{
	if (g->started || !g->req.stream)
		return;
	g->started = 1;
	g->w->start(&g->ans, &g->sse);
	gen_emit(g);
}

static void on_resumed(void *ctx, const struct kss_usage *u)
{
	struct gen *g = ctx;
	g->ans.usage = *u;
	stream_start(g);
}

static void on_token(void *ctx, const struct kss_token *t)
{
	struct gen *g = ctx;
	uint64_t now = kv_now_ns();
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
	ksv_answer_event(&g->ans, e, g->req.stream ? &g->sse : NULL);
}

static void on_step(void *ctx)
{
	struct gen *g = ctx;
	if (g->step_reasoning)
		g->ans.reasoning_tokens++;
	g->step_reasoning = 0;
	if (!g->req.stream)
		return;
	if (g->w->step)
		g->w->step(&g->ans, &g->sse);
	gen_emit(g);
}

static const struct kss_sink sink = {
	.admitted = on_admitted,
	.resumed = on_resumed,
	.token = on_token,
	.event = on_event,
	.step = on_step,
};

/* --- the worker ------------------------------------------------------------ */

/* The "kvkeep" usage extension: what --prompt-normalize changed and where
 * the prompt departs from the cache. New ref, or NULL. */
static json_t *usage_ext(const struct gen *g)
{
	if (!g->norm_report && !g->res.have_explain && !g->pr.n_restored)
		return NULL;
	json_t *j = json_object();
	if (g->norm_report)
		json_object_set(j, "normalized", g->norm_report);
	if (g->res.have_explain)
		json_object_set_new(j, "cache", ksv_explain_json(&g->res.ex));
	if (g->pr.n_restored) {
		/* the server's own answers the prompt used as generated */
		json_t *a = json_array();
		for (size_t i = 0; i < g->pr.n_restored; i++)
			json_array_append_new(a, json_integer(g->pr.restored[i]));
		json_object_set_new(j, "restored_messages", a);
	}
	return j;
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
	ksv_metrics_add(s->f_prompt_tok, g->pr.n_tokens);
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
	struct ksv_recent_req rec = {.t_ms = kv_wall_ms(), .prompt_tokens = np, .cached_ram = pc - from_disk,
				     .cached_disk = from_disk, .gen_tokens = r->generated,
				     .ttft_ms = r->t_first_ns ? (double)(r->t_first_ns - g->t_arrive) / 1e6 : 0,
				     .prefill_ms = r->prefill_ms, .decode_ms = r->decode_ms,
				     .miss = r->have_explain && pc < np ? ksv_explain_json(&r->ex) : NULL};
	snprintf(rec.route, sizeof rec.route, "%s", g->route);
	snprintf(rec.resume, sizeof rec.resume, "%s", r->resume_kind);
	ksv_recent_add(s->recent, &rec);
}

/*
 * Remember the answer exactly (session/echo.h), so that when the client
 * sends it back the prompt uses these tokens: the generation prompt and
 * any forced opening (the prompt after its last message), then every
 * generated token. Only for chat answers that ended normally, under
 * --reasoning-history keep and --echo-generated on.
 */
static void remember_answer(struct gen *g)
{
	struct ksv_server *s = g->s;
	struct ksv_answer *a = &g->ans;
	if (g->req.api != KSV_API_CHAT || !g->pr.gp_text || strcmp(s->o.echo_generated, "on") ||
	    strcmp(s->o.reasoning_history, "keep"))
		return;
	size_t n_gen = g->gen_ids.len / sizeof(int32_t);
	const int32_t *gen = (const int32_t *)g->gen_ids.p;
	struct kv_buf text = KV_BUF_INIT, key = KV_BUF_INIT, toks = KV_BUF_INIT;
	struct kss_echo_call *calls = calloc(a->n_tools ? a->n_tools : 1, sizeof *calls);
	char *gtext = NULL, *content = NULL, *reasoning = NULL;
	size_t glen = 0, cl = 0, rl = 0, nc = 0;
	if (!calls || (n_gen && kv_tok_decode(s->tok, gen, n_gen, 0, &gtext, &glen)))
		goto out;
	kv_buf_add(&text, g->pr.gp_text, g->pr.gp_len);
	if (g->forced)
		kv_buf_adds(&text, g->forced);
	kv_buf_add(&text, gtext, glen);
	kv_buf_add(&toks, g->pr.tokens + g->pr.gp_tok, (g->pr.n_tokens - g->pr.gp_tok) * sizeof(int32_t));
	kv_buf_add(&toks, gen, n_gen * sizeof(int32_t));
	content = ksv_answer_text(a, KSV_BLK_TEXT, &cl);
	reasoning = ksv_answer_text(a, KSV_BLK_REASONING, &rl);
	for (size_t i = 0; i < a->n_blk; i++)
		if (a->blk[i].kind == KSV_BLK_TOOL)
			calls[nc++] = (struct kss_echo_call){.id = a->blk[i].call_id, .name = a->blk[i].name,
							     .args = a->blk[i].text.p ? a->blk[i].text.p : "{}",
							     .args_len = a->blk[i].text.p ? a->blk[i].text.len : 2};
	if (text.oom || toks.oom || kss_echo_key_answer(content, cl, calls, nc, &key))
		goto out;
	struct kc_echo_rec rec = {.key = key.p, .key_len = key.len, .reasoning = reasoning ? reasoning : "",
				  .reasoning_len = rl, .text = text.p, .text_len = text.len,
				  .tokens = (const int32_t *)toks.p, .n_tokens = (uint32_t)(toks.len / sizeof(int32_t))};
	if (kss_echo_remember(s->svc, g->salt, &rec))
		KV_DEBUG("echo.remember_failed", "route=%s err=\"%s\"", g->route, kv_errmsg());
out:
	kv_errclear();
	kv_buf_free(&text);
	kv_buf_free(&key);
	kv_buf_free(&toks);
	free(calls);
	free(gtext);
	free(content);
	free(reasoning);
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

static void gen_run(struct ksv_job *job)
{
	struct gen *g = (struct gen *)job;
	struct ksv_server *s = g->s;
	struct kss_request_result *r = &g->res;
	uint64_t t_start = kv_now_ns();
	ksv_observe(s->f_queue_wait, (double)(t_start - g->job.t_submit_ns) / 1e9);

	/* request > server defaults (flag > generation_config > OpenAI) */
	struct kss_request_params rp = {
		.route = g->route,
		.salt = g->salt,
		.prompt = g->pr.tokens,
		.n_prompt = g->pr.n_tokens,
		.n_forced = g->n_forced,
		.forced_text = g->forced,
		.bounds = g->pr.bounds,
		.n_bounds = g->pr.n_bounds,
		.max_tokens = (uint32_t)g->max_tokens,
		.logprobs = g->req.logprobs,
		.top_logprobs = g->req.top_logprobs,
		.ignore_eos = g->req.ignore_eos,
		.out = {.stop = g->req.stop,
			.n_stop = g->req.n_stop,
			.split_reasoning = s->o.split_reasoning && g->req.api == KSV_API_CHAT,
			.in_think = g->pr.in_think,
			.tools = g->req.tool_choice != KSV_TC_NONE ? g->req.tools : NULL,
			.xml_tools = s->xml_tools},
		.cancel = &g->job.cancel,
	};
	ksv_sampling_resolve(&g->req.sp, &s->sdef, kv_now_ns() ^ (uint64_t)(uintptr_t)g, &rp.sp);
	kss_request(s->svc, &rp, &sink, g, r);

	int cancelled = r->fail == KSS_FAIL_CANCELLED;
	int status = r->fail ? fail_status(r->fail) : 0;
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
	g->ans.stop_sequence = r->stop_hit && g->req.n_stop ? g->req.stop[0] : NULL;
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
		if (g->req.stream && cancelled && atomic_load(&s->stopping))
			/* shutdown, not a hang-up: tell the client why the stream ends */
			stream_end(g, 503, "the server is shutting down");
		else if (g->req.stream && !cancelled)
			stream_end(g, status, r->err);
		pthread_mutex_lock(&g->mu);
		if (status && !cancelled && !g->req.stream) {
			g->fail_status = status;
			snprintf(g->fail_msg, sizeof g->fail_msg, "%s", r->err);
		}
		g->phase = PH_DONE;
		if (g->stream) {
			ksv_stream_end(g->stream);
			g->stream = NULL;
		}
		pthread_cond_broadcast(&g->cv);
		pthread_mutex_unlock(&g->mu);
	}

	double dur = (double)(kv_now_ns() - g->t_arrive) / 1e9;
	double gen_s = r->t_first_ns ? (double)(r->t_last_ns - r->t_first_ns) / 1e9 : 0;
	KV_INFO("request",
		"route=%s stream=%d prompt_tokens=%u cached_tokens=%u resume=%s disk=%d restored_messages=%zu gen_tokens=%u "
		"forced_tokens=%u finish=%s ttft_ms=%.1f tok_s=%.1f queue_ms=%.1f prefill_ms=%.1f total_ms=%.1f%s%s",
		g->route, g->req.stream, r->usage.prompt_tokens, r->usage.cached_tokens,
		r->admitted ? r->resume_kind : "none", r->from_disk > 0, g->pr.n_restored, r->generated, g->n_forced,
		cancelled ? "cancelled" : status ? "error" : r->finish,
		r->t_first_ns ? (double)(r->t_first_ns - g->t_arrive) / 1e6 : 0.0,
		gen_s > 0 && r->generated > 1 ? (r->generated - 1) / gen_s : 0.0, (double)(t_start - g->job.t_submit_ns) / 1e6,
		r->prefill_ms, dur * 1e3, status && !cancelled ? " error=" : "", status && !cancelled ? r->err : "");
	/* the worker's reference is dropped in gen_done, after the queue is
	 * through with the job */
}

static void gen_done(struct ksv_job *job)
{
	gen_unref((struct gen *)job);
}

static void on_gone_cb(void *arg)
{
	struct gen *g = arg;
	ksv_queue_cancel(g->s->queue, &g->job);
}

/* Wait for the job to reach `phase`; 0, 1 if the client went away, 2 if
 * the queue dropped the job before it ran (shutdown). */
static int wait_phase(struct gen *g, int phase, struct ksv_conn *c)
{
	struct timespec ts;
	pthread_mutex_lock(&g->mu);
	while (g->phase < phase) {
		if (ksv_queue_state(g->s->queue, &g->job) == KSV_JOB_CANCELLED) {
			pthread_mutex_unlock(&g->mu);
			return 2;
		}
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += 50 * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&g->cv, &g->mu, &ts);
		if (g->phase >= phase)
			break;
		pthread_mutex_unlock(&g->mu);
		int gone = ksv_conn_gone(c);
		pthread_mutex_lock(&g->mu);
		if (gone) {
			g->gone = 1;
			pthread_mutex_unlock(&g->mu);
			return 1;
		}
	}
	pthread_mutex_unlock(&g->mu);
	return 0;
}

static struct gen *gen_new(struct ksv_server *s, const char *route, int wire)
{
	struct gen *g = calloc(1, sizeof *g);
	if (!g)
		return NULL;
	g->s = s;
	g->refs = 1;
	g->route = route;
	g->w = ksv_wire_of(wire);
	g->t_arrive = kv_now_ns();
	g->job.run = gen_run;
	g->job.done = gen_done;
	pthread_mutex_init(&g->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g->cv, &ca);
	pthread_condattr_destroy(&ca);
	return g;
}

/* An error answer in the request's wire format. */
static void gen_error(struct gen *g, struct ksv_conn *c, int status, const char *param, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
static void gen_error(struct gen *g, struct ksv_conn *c, int status, const char *param, const char *fmt, ...)
{
	char msg[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	ksv_reply_error_wire(g->s, c, g->w == &ksv_wire_anthropic ? KSV_WIRE_ANTHROPIC : KSV_WIRE_OPENAI, status, param,
			     "%s", msg);
}

/* --- the request's way in ---------------------------------------------------- */

/*
 * The request's cache_salt: NULL when absent (or JSON null), else the
 * salt. A salt names a namespace by its full bytes, so the two byte
 * strings a C string would confuse are refused rather than silently
 * sharing a namespace: one with NUL inside ("x\u0000a" would be "x"), and
 * the empty one (it would be the server's own namespace: omit the field
 * for that). Replies 400 and returns 1 on a bad salt.
 */
static int request_salt(struct gen *g, struct ksv_conn *c, const json_t *body, const char **out)
{
	const json_t *salt = json_object_get(body, "cache_salt");
	const char *why = NULL;
	*out = NULL;
	if (!salt || json_is_null(salt))
		return 0;
	if (!json_is_string(salt))
		why = "cache_salt must be a string";
	else if (!g->s->o.allow_request_salt)
		why = "cache_salt is not accepted: start the server with --allow-request-salt";
	else if (!json_string_length(salt))
		why = "cache_salt must not be empty (omit it to use the server's namespace)";
	else if (memchr(json_string_value(salt), 0, json_string_length(salt)))
		why = "cache_salt must not contain NUL characters";
	if (why) {
		gen_error(g, c, 400, "cache_salt", "%s", why);
		return 1;
	}
	*out = json_string_value(salt);
	return 0;
}

/*
 * The body of a request in its API, as a validated chat request in g->req
 * (wire.h parse), then --prompt-normalize on its messages. Replies and
 * returns nonzero on error.
 */
static int parse_body(struct gen *g, const struct ksv_request *rq, int api, int for_count)
{
	struct ksv_server *s = g->s;
	json_t *body = NULL;
	if (kv_json_parse("request body", rq->body, rq->body_len, JSON_MAX_DEPTH, &body)) {
		gen_error(g, rq->conn, 400, "", "%s", kv_errmsg());
		return 1;
	}
	int rc = g->w->parse(body, api, for_count, &g->req);
	json_decref(body);
	if (rc) {
		gen_error(g, rq->conn, 400, g->req.err_param, "%s", kv_errmsg());
		return 1;
	}
	if (g->req.api == KSV_API_CHAT && g->req.messages && s->norm_rules) {
		json_t *wrap = json_pack("{s:O}", "messages", g->req.messages);
		int n = wrap ? ksv_norm_apply(wrap, s->norm_rules, &g->norm_report) : 0;
		json_decref(wrap);
		for (size_t i = 0; n && i < json_array_size(g->norm_report); i++) {
			json_t *r = json_array_get(g->norm_report, i);
			KV_INFO("prompt.normalize", "route=%s rule=%s message=%lld removed_bytes=%zu", g->route,
				json_string_value(json_object_get(r, "rule")),
				(long long)json_integer_value(json_object_get(r, "message")),
				json_string_length(json_object_get(r, "removed")));
		}
	}
	return 0;
}

/* The prompt (prompt.c), replying on a client error. */
static int prepare_prompt(struct gen *g, struct ksv_conn *c)
{
	char param[32];
	int status = ksv_prompt_make(g->s, &g->req, g->salt, &g->pr, param, sizeof param);
	if (status) {
		gen_error(g, c, status, param, "%s", kv_errmsg());
		return 1;
	}
	return 0;
}

/*
 * tool_choice "required" or a named function: the answer is made to start
 * with the opening of a tool call in the template's own syntax, so the
 * model can only continue it (text/toolcall.h kv_tc_opener; a documented
 * feature, not a test hook). The forced tokens are prefilled after the
 * generation prompt and count as completion tokens. Replies and returns
 * nonzero on error.
 */
static int force_tool_call(struct gen *g, struct ksv_conn *c)
{
	struct ksv_server *s = g->s;
	struct ksv_req *r = &g->req;
	if (r->api != KSV_API_CHAT || !r->tools || (r->tool_choice != KSV_TC_REQUIRED && r->tool_choice != KSV_TC_NAMED))
		return 0;
	if (kv_tc_opener(s->xml_tools ? KV_TC_XML : KV_TC_JSON, r->tool_choice == KSV_TC_NAMED ? r->tool_name : NULL,
			 &g->forced)) {
		gen_error(g, c, 400, "tool_choice", "%s", kv_errmsg());
		return 1;
	}
	int rc = ksv_prompt_append(s, &g->pr, g->forced, &g->n_forced);
	if (rc) {
		gen_error(g, c, 500, NULL, "cannot encode the forced tool call: %s", kv_errmsg());
		return 1;
	}
	if ((int64_t)g->pr.n_tokens >= s->ctx_len) {
		gen_error(g, c, 400, "messages", "the prompt is %u tokens; this model's context is %d tokens", g->pr.n_tokens,
			  s->ctx_len);
		return 1;
	}
	return 0;
}

static const char *route_name(int api, int wire)
{
	if (wire == KSV_WIRE_ANTHROPIC)
		return "/v1/messages";
	if (wire == KSV_WIRE_RESPONSES)
		return "/v1/responses";
	return api == KSV_API_CHAT ? "/v1/chat/completions" : "/v1/completions";
}

void ksv_gen_count_tokens(struct ksv_server *s, const struct ksv_request *rq)
{
	struct ksv_conn *c = rq->conn;
	struct gen *g = gen_new(s, "/v1/messages/count_tokens", KSV_WIRE_ANTHROPIC);
	if (!g) {
		ksv_reply_error_wire(s, c, KSV_WIRE_ANTHROPIC, 500, NULL, "out of memory");
		return;
	}
	if (parse_body(g, rq, KSV_API_CHAT, 1) || prepare_prompt(g, c)) {
		gen_unref(g);
		return;
	}
	size_t len = 0;
	char *body = ksv_anth_count_body(g->pr.n_tokens, &len);
	if (body)
		ksv_conn_reply(c, 200, "application/json", body, len);
	else
		gen_error(g, c, 500, NULL, "out of memory");
	free(body);
	gen_unref(g);
}

/* Stream the answer: the bytes made so far, then the worker's. */
static void attach_stream(struct gen *g, struct ksv_conn *c)
{
	ksv_conn_header(c, "Cache-Control", "no-cache");
	ksv_conn_header(c, "X-Accel-Buffering", "no");
	struct ksv_stream *st = ksv_conn_stream(c, 200, "text/event-stream; charset=utf-8");
	if (!st) {
		atomic_store(&g->job.cancel, 1);
		gen_error(g, c, 500, NULL, "cannot open the stream");
		return;
	}
	pthread_mutex_lock(&g->mu);
	if (g->pend.len)
		ksv_stream_write(st, g->pend.p, g->pend.len);
	kv_buf_free(&g->pend);
	if (g->phase == PH_DONE) {
		ksv_stream_end(st);
	} else {
		g->stream = st;
		ksv_stream_on_gone(st, on_gone_cb, g);
	}
	pthread_mutex_unlock(&g->mu);
}

/* Queue the request and wait until it started (or failed before). 0: it
 * started; nonzero: an answer was sent. */
static int submit(struct gen *g, struct ksv_conn *c)
{
	struct ksv_server *s = g->s;
	g->refs++; /* the worker's reference */
	int rc = ksv_queue_submit(s->queue, &g->job);
	if (rc) {
		g->refs--;
		if (rc == KV_ERR_FULL) {
			ksv_metrics_add(s->f_rej_429, 1);
			gen_error(g, c, 429, NULL, "too many requests are waiting (%lld); retry later", (long long)s->o.max_queue);
		} else {
			gen_error(g, c, 503, NULL, "the server is shutting down");
		}
		return 1;
	}
	int w = wait_phase(g, PH_STARTED, c);
	if (w) {
		/* the client left while queued or prefilling, or shutdown */
		ksv_queue_cancel(s->queue, &g->job);
		if (ksv_queue_state(s->queue, &g->job) == KSV_JOB_CANCELLED) {
			/* removed before running: the worker's reference is ours to drop */
			gen_unref(g);
			if (w == 1)
				ksv_metrics_add(s->f_cancelled, 1);
		}
		if (w == 2)
			gen_error(g, c, 503, NULL, "the server is shutting down");
		else
			gen_error(g, c, 499, NULL, "client closed the connection");
		return 1;
	}
	pthread_mutex_lock(&g->mu);
	int failed = g->phase == PH_DONE && g->fail_status;
	pthread_mutex_unlock(&g->mu);
	if (failed) {
		gen_error(g, c, g->fail_status, NULL, "%s", g->fail_msg);
		return 1;
	}
	return 0;
}

/* Everything before the queue: parse, model, salt, prompt, limits. 0 or
 * an answer was sent. */
static int prepare(struct gen *g, const struct ksv_request *rq, int api)
{
	struct ksv_server *s = g->s;
	struct ksv_conn *c = rq->conn;
	if (parse_body(g, rq, api, 0))
		return 1;
	if (g->req.model && strcmp(g->req.model, s->model_name)) {
		gen_error(g, c, 404, "model", "the model '%s' does not exist (this server serves '%s')", g->req.model,
			  s->model_name);
		return 1;
	}
	/* cache_salt: with --allow-request-salt, requests with the same salt
	 * share a namespace of their own (session/registry.h); without it a salt is
	 * refused rather than silently sharing the server's namespace */
	if (request_salt(g, c, g->req.body, &g->salt) || prepare_prompt(g, c) || force_tool_call(g, c))
		return 1;
	int64_t room = s->ctx_len - (int64_t)g->pr.n_tokens;
	int64_t mt = g->req.max_tokens > 0 ? g->req.max_tokens : s->o.default_max_tokens;
	if (g->n_forced && mt <= (int64_t)g->n_forced) {
		gen_error(g, c, 400, g->req.max_tokens > 0 ? "max_tokens" : "tool_choice",
			  "max_tokens %lld leaves no room: the forced tool-call opening alone takes %u tokens", (long long)mt,
			  g->n_forced);
		return 1;
	}
	mt -= g->n_forced; /* forced tokens count against max_tokens */
	g->max_tokens = (int)(mt < room ? mt : room);
	ksv_answer_init(&g->ans, g->w, api, s->model_name, g->req.stream);
	g->ans.tb = &s->tb;
	g->ans.include_usage = g->req.stream && g->req.include_usage;
	g->ans.logprobs = g->req.logprobs;
	g->ans.encrypted_reasoning = g->req.encrypted_reasoning;
	return 0;
}

void ksv_gen_handle(struct ksv_server *s, const struct ksv_request *rq, int api, int wire)
{
	struct ksv_conn *c = rq->conn;
	if (atomic_load(&s->stopping)) {
		ksv_reply_error_wire(s, c, wire, 503, NULL, "the server is shutting down");
		return;
	}
	struct gen *g = gen_new(s, route_name(api, wire), wire);
	if (!g) {
		ksv_reply_error_wire(s, c, wire, 500, NULL, "out of memory");
		return;
	}
	if (prepare(g, rq, api) || submit(g, c))
		goto out;
	if (g->req.stream) {
		attach_stream(g, c);
		goto out;
	}
	if (wait_phase(g, PH_DONE, c)) {
		/* the job is running (it started): the cancel flag stops it */
		ksv_queue_cancel(s->queue, &g->job);
		gen_error(g, c, 499, NULL, "client closed the connection");
		goto out;
	}
	if (g->fail_status) {
		gen_error(g, c, g->fail_status, NULL, "%s", g->fail_msg);
		goto out;
	}
	size_t len = 0;
	char *body = g->w->body(&g->ans, &len);
	if (body)
		ksv_conn_reply(c, 200, "application/json", body, len);
	else
		gen_error(g, c, 500, NULL, "out of memory");
	free(body);
out:
	gen_unref(g); /* this thread's reference; the worker holds its own */
}

void ksv_gen_probe(struct ksv_server *s, const struct ksv_request *rq)
{
	struct ksv_conn *c = rq->conn;
	struct gen *g = gen_new(s, "/v1/cache/probe", KSV_WIRE_OPENAI);
	if (!g) {
		ksv_reply_error(s, c, 500, NULL, "out of memory");
		return;
	}
	const char *ss = NULL;
	if (ksv_req_parse_probe(rq->body, rq->body_len, JSON_MAX_DEPTH, &g->req)) {
		gen_error(g, c, 400, g->req.err_param, "%s", kv_errmsg());
		goto out;
	}
	if (request_salt(g, c, g->req.body, &ss))
		goto out;
	g->salt = ss;
	if (prepare_prompt(g, c))
		goto out;
	struct kss_probe_result pr;
	kss_probe(s->svc, ss, g->pr.tokens, g->pr.n_tokens, g->pr.bounds, g->pr.n_bounds, &pr);
	uint32_t pos = pr.ram_pos, dpos = pr.disk_pos;
	int have_disk = pr.open ? pr.have_disk : s->store != NULL;
	json_t *j = json_object(), *ram = json_object(), *disk = json_object();
	json_object_set_new(j, "prompt_tokens", json_integer(g->pr.n_tokens));
	if (ss)
		json_object_set_new(j, "salt_tier_open", json_boolean(pr.open));
	json_object_set_new(ram, "cached_tokens", json_integer(pos));
	json_object_set_new(ram, "shared_tokens", json_integer(pr.ram_shared));
	json_object_set_new(j, "ram", ram);
	json_object_set_new(disk, "available", json_boolean(have_disk));
	json_object_set_new(disk, "cached_tokens", json_integer(dpos));
	json_object_set_new(j, "disk", disk);
	if (dpos > pos)
		pos = dpos;
	json_object_set_new(j, "cached_tokens", json_integer(pos));
	json_object_set_new(j, "cold_tokens", json_integer(g->pr.n_tokens - pos));
	json_t *bs = json_array();
	for (size_t i = 0; i < g->pr.n_bounds; i++)
		json_array_append_new(bs, json_integer(g->pr.bounds[i]));
	json_object_set_new(j, "boundaries", bs);
	if (pr.have_explain)
		json_object_set_new(j, "miss", ksv_explain_json(&pr.ex));
	ksv_reply_json(c, 200, j);
out:
	gen_unref(g);
}
