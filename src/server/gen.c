/*
 * gen.c - a generation request, from its body to its answer (see server.h).
 *
 * A generation request, end to end (docs/architecture.md):
 *
 *   connection thread (handler)            engine worker (sched.h)
 *   ---------------------------            -----------------------
 *   parse + validate the body (400)
 *   render the chat template -> tokens
 *     and message boundaries
 *   submit to the queue (429 when full) -> admission: evict LRU cache
 *                                          entries before 503 (Retry-After)
 *   wait for "started" or a failure   <-  "started" (status 200 decided)
 *     (polling for a client hang-up)
 *   reply: an error, or open the SSE       kss_run (session/run.h, the request
 *     stream and attach it                 path): lookup, resume, prefill
 *                                          prompt[p:] with the policy's stop
 *                                          points and snapshots (every forward
 *                                          batched with the other running
 *                                          requests'), decode
 *                                          through pick() (sampler, logprobs,
 *                                          text -> output pipeline -> SSE
 *                                          chunks), store the entries
 *   (stream: the connection thread         one log line; metrics
 *    drains the chunks; non-stream:
 *    wait for done, send the body)
 *
 * A client that hangs up sets the job's cancel flag (from the stream's
 * on_gone callback or the handler's poll). The worker reads it between
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
#include "base/mem.h"
#include "base/utf8.h"
#include "session/run.h"
#include "engine/sample.h"
#include "server/anthropic.h"
#include "server/explain.h"
#include "server/normalize.h"
#include "server/openai.h"
#include "server/output.h"
#include "server/request.h"
#include "server/responses.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { PH_QUEUED = 0, PH_STARTED, PH_DONE };

/* --- a generation request ----------------------------------------------- */

struct gen {
	struct ksv_job job;
	struct ksv_server *s;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int refs;
	struct ksv_req req;
	int wire;                 /* enum ksv_wire: the API's body, answer and error shapes */
	struct ksv_anth anth;     /* KSV_WIRE_ANTHROPIC answer state */
	struct ksv_resp resp;     /* KSV_WIRE_RESPONSES answer state */
	json_t *norm_report;      /* what --prompt-normalize changed (NULL: nothing) */
	int stop_hit;             /* a stop string ended the output */
	struct ksv_explain ex;    /* where the prompt departs from the cache (explain.h) */
	int have_ex;
	const char *route;
	int32_t *prompt;
	uint32_t n_prompt;
	uint32_t *bounds;
	size_t n_bounds;
	int in_think;
	int max_tokens;
	char *forced;             /* text forced at the start of the answer (tool_choice), or NULL */
	uint32_t n_forced;        /* its tokens, appended to the prompt */
	uint64_t t_arrive;
	/* phase, under mu */
	int phase;
	int fail_status;          /* 0, or the status of a failure before start */
	char fail_msg[300];
	/* stream, under mu */
	struct ksv_stream *stream;
	struct kv_buf pend;       /* SSE bytes made before the stream was attached */
	int gone;
	/* result (worker; read by the handler after PH_DONE) */
	struct ksv_oai oai;
	struct ksv_out *out;
	struct kv_buf content, reasoning;
	int have_content;
	struct ksv_tool_call *calls;
	size_t n_calls;
	struct kv_buf cur_args;   /* arguments of the tool call being built */
	int32_t *lp_ids;          /* per generated token: [1 + top] ids */
	float *lp_vals;           /* and their logprobs */
	size_t n_lp, cap_lp;
	const char *finish;
	struct ksv_usage usage;
	const char *resume_kind;
	int from_disk;            /* the resume point was loaded from the disk tier */
	uint32_t disk_pos;        /* ... up to this position */
	const char *salt;         /* the request's cache_salt (borrowed from req.body), NULL: none */
	struct kss_tier tier;     /* RAM cache + disk store of its namespace (session/registry.h) */
	/* decode state (worker) */
	struct ke_sampler *smp;
	struct kv_tok_stream ds;
	struct kv_buf piece, sse;
	int n_gen;
	uint64_t t_first, t_prev;
	/* per-step logprobs for streaming */
	struct ksv_lp step_lp;
	struct ksv_lp_alt step_alts[KSV_MAX_TOP_LOGPROBS];
	int step_lp_pending;
};

static void gen_unref(struct gen *g)
{
	pthread_mutex_lock(&g->mu);
	int left = --g->refs;
	pthread_mutex_unlock(&g->mu);
	if (left)
		return;
	ksv_req_free(&g->req);
	free(g->forced);
	free(g->prompt);
	free(g->bounds);
	kv_buf_free(&g->pend);
	kv_buf_free(&g->content);
	kv_buf_free(&g->reasoning);
	kv_buf_free(&g->cur_args);
	for (size_t i = 0; i < g->n_calls; i++) {
		free(g->calls[i].name);
		free(g->calls[i].arguments);
	}
	free(g->calls);
	free(g->lp_ids);
	free(g->lp_vals);
	ksv_out_destroy(g->out);
	if (g->wire == KSV_WIRE_ANTHROPIC)
		ksv_anth_free(&g->anth);
	else if (g->wire == KSV_WIRE_RESPONSES)
		ksv_resp_free(&g->resp);
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

static void gen_fail(struct gen *g, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void gen_fail(struct gen *g, int status, const char *fmt, ...)
{
	va_list ap;
	pthread_mutex_lock(&g->mu);
	g->fail_status = status;
	va_start(ap, fmt);
	vsnprintf(g->fail_msg, sizeof g->fail_msg, fmt, ap);
	va_end(ap);
	g->phase = PH_DONE;
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

/* Send SSE bytes to the client (or keep them until the stream is attached).
 * Worker thread only: g->stream is ended by this thread, so it stays valid
 * here after the lock is dropped. */
static void gen_emit(struct gen *g, struct kv_buf *b)
{
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
		kss_sched_away(g->s->engine, 1);
		int rc;
		while ((rc = ksv_stream_wait_room(st, KSV_STREAM_HIGH_WATER / 2, 100)) == KV_ERR_TIMEOUT &&
		       !atomic_load(&g->job.cancel))
			;
		if (rc == KV_ERR_CANCELLED)
			atomic_store(&g->job.cancel, 1);
		kss_sched_away(g->s->engine, 0);
	}
}

/* --- token bytes (for logprobs) ------------------------------------------ */

/* GPT-2 byte-level alphabet: code point -> byte, or -1. */
static int bytelevel_byte(uint32_t cp)
{
	if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
		return (int)cp;
	if (cp >= 256 && cp < 256 + 68) {
		int k = (int)cp - 256, b;
		for (b = 0; b < 256; b++) {
			int direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
			if (!direct && k-- == 0)
				return b;
		}
	}
	return -1;
}

/* Raw bytes of one token from its vocabulary piece; falls back to the
 * tokenizer's decode for pieces outside the byte-level alphabet. */
static int piece_bytes(const struct kv_tok *t, int32_t id, struct kv_buf *out)
{
	const char *p = kv_tok_piece(t, id);
	size_t start = out->len;
	if (p) {
		const unsigned char *u = (const unsigned char *)p;
		size_t left = strlen(p);
		int ok = 1;
		while (left && ok) {
			int32_t cp;
			int n = kv_utf8_decode(u, left, &cp);
			int b = n > 0 ? bytelevel_byte((uint32_t)cp) : -1;
			if (b < 0) {
				ok = 0;
				break;
			}
			kv_buf_addc(out, (char)b);
			u += n;
			left -= (size_t)n;
		}
		if (ok)
			return KV_OK;
		out->len = start;
	}
	char *txt = NULL;
	size_t len = 0;
	int rc = kv_tok_decode(t, &id, 1, 0, &txt, &len);
	if (rc)
		return rc;
	kv_buf_add(out, txt, len);
	free(txt);
	return KV_OK;
}

int ksv_gen_token_table(struct ksv_server *s)
{
	struct kv_buf b = KV_BUF_INIT;
	s->tb_off = malloc((size_t)s->vocab * sizeof *s->tb_off);
	s->tb_len = malloc((size_t)s->vocab * sizeof *s->tb_len);
	if (!s->tb_off || !s->tb_len)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	for (int i = 0; i < s->vocab; i++) {
		size_t at = b.len;
		if (i < kv_tok_vocab_size(s->tok) && kv_tok_piece(s->tok, i))
			piece_bytes(s->tok, i, &b);
		if (b.len - at > 65535)
			b.len = at + 65535;
		s->tb_off[i] = (uint32_t)at;
		s->tb_len[i] = (uint16_t)(b.len - at);
	}
	if (b.oom) {
		kv_buf_free(&b);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	s->tb_data = b.p ? kv_buf_take(&b) : calloc(1, 1);
	return KV_OK;
}

static const char *tok_bytes(const struct ksv_server *s, int32_t id, size_t *len)
{
	if (id < 0 || id >= s->vocab) {
		*len = 0;
		return "";
	}
	*len = s->tb_len[id];
	return s->tb_data + s->tb_off[id];
}

/* --- output events -------------------------------------------------------- */

static void flush_step_lp(struct gen *g, struct kv_buf *sse)
{
	if (!g->step_lp_pending)
		return;
	g->step_lp_pending = 0;
	ksv_oai_sse_delta(&g->oai, "", 0, NULL, 0, &g->step_lp, 1, sse);
}

/* The output pipeline's callback (worker thread). */
static void on_event(void *ctx, const struct ksv_ev *e)
{
	struct gen *g = ctx;
	struct kv_buf sse = KV_BUF_INIT;
	if (g->wire != KSV_WIRE_OPENAI) {
		/* the Messages / Responses formatters keep their own blocks */
		if (g->wire == KSV_WIRE_ANTHROPIC)
			ksv_anth_event(&g->anth, e, g->req.stream ? &sse : NULL);
		else
			ksv_resp_event(&g->resp, e, g->req.stream ? &sse : NULL);
		if (g->req.stream)
			gen_emit(g, &sse);
		kv_buf_free(&sse);
		return;
	}
	if (g->req.stream) {
		switch (e->kind) {
		case KSV_EV_CONTENT:
		case KSV_EV_REASONING: {
			int lp = g->step_lp_pending;
			g->step_lp_pending = 0;
			if (e->kind == KSV_EV_CONTENT)
				ksv_oai_sse_delta(&g->oai, e->text, e->len, NULL, 0, lp ? &g->step_lp : NULL, lp, &sse);
			else
				ksv_oai_sse_delta(&g->oai, NULL, 0, e->text, e->len, lp ? &g->step_lp : NULL, lp, &sse);
			break;
		}
		case KSV_EV_TOOL_START: {
			char id[32];
			ksv_oai_tool_call_id(id);
			ksv_oai_sse_tool_start(&g->oai, e->index, id, e->name ? e->name : "", &sse);
			break;
		}
		case KSV_EV_TOOL_ARGS:
			ksv_oai_sse_tool_args(&g->oai, e->index, e->text, e->len, &sse);
			break;
		default:
			break;
		}
		gen_emit(g, &sse);
		kv_buf_free(&sse);
		return;
	}
	switch (e->kind) {
	case KSV_EV_CONTENT:
		kv_buf_add(&g->content, e->text, e->len);
		g->have_content = 1;
		break;
	case KSV_EV_REASONING:
		kv_buf_add(&g->reasoning, e->text, e->len);
		break;
	case KSV_EV_TOOL_START: {
		struct ksv_tool_call *nc = realloc(g->calls, (g->n_calls + 1) * sizeof *nc);
		if (!nc)
			break;
		g->calls = nc;
		ksv_oai_tool_call_id(nc[g->n_calls].id);
		nc[g->n_calls].name = strdup(e->name ? e->name : "");
		nc[g->n_calls].arguments = NULL;
		g->n_calls++;
		kv_buf_reset(&g->cur_args);
		break;
	}
	case KSV_EV_TOOL_ARGS:
		kv_buf_add(&g->cur_args, e->text, e->len);
		break;
	case KSV_EV_TOOL_END:
		if (g->n_calls) {
			free(g->calls[g->n_calls - 1].arguments);
			g->calls[g->n_calls - 1].arguments = strdup(g->cur_args.p ? g->cur_args.p : "");
		}
		kv_buf_reset(&g->cur_args);
		break;
	}
}

/* --- cache salts ------------------------------------------------------------ */

/*
 * The request's cache_salt: *out NULL when absent (or JSON null), else
 * the salt. A salt names a namespace by its full bytes, so the two byte
 * strings a C string would confuse are refused rather than silently
 * sharing a namespace: one with NUL inside ("x\u0000a" would be "x"), and
 * the empty one (it would be the server's own namespace: omit the field
 * for that). Replies 400 and returns 1 on a bad salt.
 */
static int request_salt(struct ksv_server *s, struct ksv_conn *c, const json_t *body, const char **out)
{
	const json_t *salt = json_object_get(body, "cache_salt");
	const char *why = NULL;
	*out = NULL;
	if (!salt || json_is_null(salt))
		return 0;
	if (!json_is_string(salt))
		why = "cache_salt must be a string";
	else if (!s->o.allow_request_salt)
		why = "cache_salt is not accepted: start the server with --allow-request-salt";
	else if (!json_string_length(salt))
		why = "cache_salt must not be empty (omit it to use the server's namespace)";
	else if (memchr(json_string_value(salt), 0, json_string_length(salt)))
		why = "cache_salt must not contain NUL characters";
	if (why) {
		ksv_reply_error(s, c, 400, "cache_salt", "%s", why);
		return 1;
	}
	*out = json_string_value(salt);
	return 0;
}

/* --- the worker ------------------------------------------------------------ */

static int is_eos(const struct ksv_server *s, int32_t t)
{
	for (int i = 0; i < s->n_eos; i++)
		if (s->eos[i] == t)
			return 1;
	return 0;
}

static void record_lp(struct gen *g, const float *logits, int32_t tok)
{
	struct ksv_server *s = g->s;
	int top = g->req.top_logprobs, stride = 1 + KSV_MAX_TOP_LOGPROBS;
	int32_t ids[KSV_MAX_TOP_LOGPROBS];
	float lps[KSV_MAX_TOP_LOGPROBS];
	float lp = ke_token_logprob(logits, s->vocab, tok);
	int n = top ? ke_top_logprobs(logits, s->vocab, top, ids, lps) : 0;
	if (g->req.stream) {
		g->step_lp.bytes = tok_bytes(s, tok, &g->step_lp.len);
		g->step_lp.logprob = lp;
		g->step_lp.n_top = n;
		g->step_lp.top = g->step_alts;
		for (int i = 0; i < n; i++) {
			g->step_alts[i].bytes = tok_bytes(s, ids[i], &g->step_alts[i].len);
			g->step_alts[i].logprob = lps[i];
		}
		g->step_lp_pending = 1;
		return;
	}
	if (g->n_lp == g->cap_lp) {
		size_t nc = g->cap_lp ? g->cap_lp * 2 : 64;
		int32_t *ni = realloc(g->lp_ids, nc * (size_t)stride * sizeof *ni);
		if (!ni)
			return;
		g->lp_ids = ni;
		float *nv = realloc(g->lp_vals, nc * (size_t)stride * sizeof *nv);
		if (!nv)
			return;
		g->lp_vals = nv;
		g->cap_lp = nc;
	}
	int32_t *ri = g->lp_ids + g->n_lp * (size_t)stride;
	float *rv = g->lp_vals + g->n_lp * (size_t)stride;
	ri[0] = tok;
	rv[0] = lp;
	for (int i = 0; i < top; i++) {
		ri[1 + i] = i < n ? ids[i] : -1;
		rv[1 + i] = i < n ? lps[i] : 0;
	}
	g->n_lp++;
}

static void gen_done(struct ksv_job *job);

/* Memory a generation needs besides its KV: recurrent state, the
 * sequence's scratch and the logits. */
uint64_t ksv_gen_request_overhead(const struct ksv_server *s)
{
	return s->lay->snapshot_bytes + ke_model_scratch_bytes(s->model, (int)s->o.prefill_chunk) +
	       (uint64_t)s->vocab * sizeof(float);
}

/* Stop codes of the pick callback (any non-KV_OK value ends decoding). */
enum { PICK_EOS = 1, PICK_STOP_STRING = 2, PICK_CANCEL = 3 };

/*
 * kss_run's pick callback: one decode step. Runs the sampler, records
 * logprobs, feeds the text through the output pipeline (which streams
 * it), and decides whether generation goes on. The cancel flag is read
 * here, before every token, so a client that left stops the generation
 * within one step.
 */
static int pick(void *ctx, const float *logits, int vocab, int32_t *tok)
{
	struct gen *g = ctx;
	struct ksv_server *s = g->s;
	(void)vocab;
	uint64_t now = kv_now_ns();
	if (!g->t_first) { /* the first call comes right after the prefill */
		g->t_first = now;
		ksv_observe(s->f_ttft, (double)(now - g->t_arrive) / 1e9);
	} else {
		ksv_observe(s->f_itl, (double)(now - g->t_prev) / 1e9);
	}
	g->t_prev = now;
	if (atomic_load(&g->job.cancel))
		return PICK_CANCEL;
	int32_t t = ke_sample(g->smp, logits);
	if (!g->req.ignore_eos && is_eos(s, t)) {
		g->finish = "stop";
		return PICK_EOS;
	}
	g->n_gen++;
	if (g->req.logprobs)
		record_lp(g, logits, t);
	kv_buf_reset(&g->piece);
	kv_tok_stream_feed(&g->ds, t, &g->piece);
	int hit = ksv_out_feed(g->out, g->piece.p ? g->piece.p : "", g->piece.len);
	if (g->req.stream) {
		flush_step_lp(g, &g->sse);
		gen_emit(g, &g->sse);
	}
	*tok = t;
	if (hit == 1) {
		g->finish = "stop";
		g->stop_hit = 1;
		return PICK_STOP_STRING;
	}
	return KV_OK;
}

/* --- the answer in the request's API (enum ksv_wire) ---------------------- */

static struct ksv_anth_usage anth_usage(const struct gen *g)
{
	struct ksv_anth_usage u = {.input_tokens = g->usage.prompt_tokens - g->usage.cached_tokens,
				   .cache_read = g->usage.cached_tokens,
				   .output_tokens = g->usage.completion_tokens};
	/* what this request added to the cache: the prompt it computed, when
	 * a cache keeps it */
	if (g->tier.cache)
		u.cache_creation = u.input_tokens;
	return u;
}

static struct ksv_resp_usage resp_usage(const struct gen *g)
{
	struct ksv_resp_usage u = {.input_tokens = g->usage.prompt_tokens,
				   .cached_tokens = g->usage.cached_tokens,
				   .output_tokens = g->usage.completion_tokens};
	return u;
}

/* The "kvkeep" usage extension: what --prompt-normalize changed. New
 * ref, or NULL when there is nothing to say. */
static json_t *usage_ext(const struct gen *g)
{
	if (!g->norm_report && !g->have_ex)
		return NULL;
	json_t *j = json_object();
	if (g->norm_report)
		json_object_set(j, "normalized", g->norm_report);
	if (g->have_ex)
		json_object_set_new(j, "cache", ksv_explain_json(&g->ex));
	return j;
}

/* The first bytes of a stream: OpenAI's role chunk, Anthropic's
 * message_start (the usage split is known only at the end: the start
 * counts every prompt token as input) and a ping, Responses' created. */
static void wire_start(struct gen *g, struct kv_buf *out)
{
	if (g->wire == KSV_WIRE_ANTHROPIC) {
		struct ksv_anth_usage u = {.input_tokens = g->n_prompt - g->n_forced};
		ksv_anth_start(&g->anth, &u, out);
		ksv_anth_ping(out);
	} else if (g->wire == KSV_WIRE_RESPONSES)
		ksv_resp_start(&g->resp, out);
	else
		ksv_oai_sse_role(&g->oai, out);
}

static void wire_stream_error(struct gen *g, int status, const char *msg, int with_usage, struct kv_buf *out)
{
	if (g->wire == KSV_WIRE_ANTHROPIC)
		ksv_anth_sse_error(status, msg, out);
	else if (g->wire == KSV_WIRE_RESPONSES)
		ksv_resp_sse_error(&g->resp, status, msg, out);
	else {
		ksv_oai_sse_error(&g->oai, status, msg, out);
		if (with_usage)
			ksv_oai_sse_usage(&g->oai, &g->usage, out);
		ksv_oai_sse_done(out);
	}
}

static const char *stop_sequence(const struct gen *g)
{
	/* the stop matcher ends on the first string that matched; with one
	 * stop string that is the one, with several the output's tail says */
	if (!g->stop_hit || !g->req.n_stop)
		return NULL;
	return g->req.stop[0];
}

static void wire_stream_finish(struct gen *g, struct kv_buf *out)
{
	json_t *ext = usage_ext(g);
	if (g->wire == KSV_WIRE_ANTHROPIC) {
		struct ksv_anth_usage u = anth_usage(g);
		ksv_anth_finish(&g->anth, ksv_anth_stop_reason(g->finish, g->stop_hit), stop_sequence(g), &u, out);
	} else if (g->wire == KSV_WIRE_RESPONSES) {
		struct ksv_resp_usage u = resp_usage(g);
		ksv_resp_finish(&g->resp, g->finish, &u, ext, out);
	} else {
		ksv_oai_sse_finish(&g->oai, g->finish, out);
		ksv_oai_sse_usage(&g->oai, &g->usage, out);
		ksv_oai_sse_done(out);
	}
	json_decref(ext);
}

/* The whole non-streaming body of a Messages / Responses request. */
static char *wire_body(struct gen *g, size_t *len)
{
	json_t *ext = usage_ext(g);
	char *body;
	if (g->wire == KSV_WIRE_ANTHROPIC) {
		struct ksv_anth_usage u = anth_usage(g);
		body = ksv_anth_response(&g->anth, ksv_anth_stop_reason(g->finish, g->stop_hit), stop_sequence(g), &u, ext,
					 len);
	} else {
		struct ksv_resp_usage u = resp_usage(g);
		body = ksv_resp_response(&g->resp, g->finish, &u, ext, len);
	}
	json_decref(ext);
	return body;
}

static void gen_run(struct ksv_job *job)
{
	struct gen *g = (struct gen *)job;
	struct ksv_server *s = g->s;
	struct kss_run_result res;
	int rc = KV_OK, started = 0, cancelled = 0, err_status = 0;
	uint64_t t_start = kv_now_ns();
	char errbuf[300] = "";
	uint32_t p = 0;
	uint64_t reserved = 0;     /* this request's share of s->reserved */

	memset(&res, 0, sizeof res);
	ksv_observe(s->f_queue_wait, (double)(t_start - g->job.t_submit_ns) / 1e9);
	if (atomic_load(&g->job.cancel)) {
		cancelled = 1;
		goto out;
	}

	/* the namespace of this request: the server's, or its cache_salt's */
	if ((rc = kss_registry_get(s->reg, g->salt, &g->tier))) {
		err_status = rc == KV_ERR_FULL ? 503 : 500;
		snprintf(errbuf, sizeof errbuf, "cache for cache_salt: %s", kv_errmsg());
		goto out;
	}

	/* admission: the request's projected memory against the cap; the
	 * cache gives up LRU entries before we ever answer 503 */
	uint64_t need = (uint64_t)(g->n_prompt + (uint32_t)g->max_tokens) * s->lay->kv_bytes_per_token +
			ksv_gen_request_overhead(s);
	uint64_t released = 0;
	/* the requests running beside this one may still grow to their own
	 * projections: they count as used (conservatively: what they already
	 * hold is in kv_mem_total too) */
	uint64_t used = kv_mem_total() + atomic_load(&s->reserved);
	if (s->mem_cap && kc_cache_admit(g->tier.cache, used, need, s->mem_cap, &released) == KV_ERR_FULL &&
	    (g->tier.cache == s->cache ||
	     kc_cache_admit(s->cache, used, need, s->mem_cap, &released) == KV_ERR_FULL)) {
		ksv_metrics_add(s->f_rej_503, 1);
		err_status = 503;
		snprintf(errbuf, sizeof errbuf,
			 "not enough memory for this request (%llu MiB projected, cap %llu MiB) and the cache has "
			 "nothing left to evict; retry later",
			 (unsigned long long)(need / MiB), (unsigned long long)(s->mem_cap / MiB));
		goto out;
	}
	/* request > server defaults (flag > generation_config > OpenAI); the
	 * sampler is this sequence's alone: its generator and its penalty
	 * counts (prompt for repetition_penalty, forced tokens as generated) */
	struct ke_sample_params sp;
	ksv_sampling_resolve(&g->req.sp, &s->sdef, kv_now_ns() ^ (uint64_t)(uintptr_t)g, &sp);
	if ((rc = ke_sampler_create(s->vocab, &sp, &g->smp))) {
		err_status = 400;
		snprintf(errbuf, sizeof errbuf, "%s", kv_errmsg());
		goto out;
	}
	ke_sampler_prompt(g->smp, g->prompt, g->n_prompt - g->n_forced);
	for (uint32_t i = g->n_prompt - g->n_forced; i < g->n_prompt; i++)
		ke_sampler_accept(g->smp, g->prompt[i]);

	/* status decided: the handler may open the stream now; later errors
	 * reach a streaming client as an error event */
	started = 1;
	gen_set_phase(g, PH_STARTED);
	if (g->req.stream) {
		wire_start(g, &g->sse);
		gen_emit(g, &g->sse);
	}
	kv_tok_stream_init(&g->ds, s->tok, 1);
	g->finish = "length";
	if (g->forced) /* the answer starts with the forced tool-call opening */
		ksv_out_feed(g->out, g->forced, strlen(g->forced));

	/* lookup (the disk tier for what RAM lacks), restore, prefill with the
	 * policy's stop points, decode through pick(), store: the session's
	 * driver does it all, every forward batched with the other running
	 * requests by the engine's scheduler */
	atomic_fetch_add(&s->reserved, need);
	reserved = need;
	struct kss_run_params rp = {.prompt = g->prompt,
				   .n = g->n_prompt,
				   .bounds = g->bounds,
				   .n_bounds = g->n_bounds,
				   .max_new = (uint32_t)g->max_tokens,
				   .pick = pick,
				   .pick_ctx = g,
				   .mem_cap = s->mem_cap,
				   .chunk = (int)s->o.prefill_chunk,
				   .cancel = (const int *)&g->job.cancel,
				   .store = g->tier.store,
				   .sched = s->engine};
	rc = kss_run(g->tier.cache, s->model, &rp, &res);
	g->from_disk = res.from_disk > 0;
	g->disk_pos = res.from_disk;
	ks_store_kick(g->tier.store); /* new entries for the write-behind */
	p = res.resumed;
	if (g->tier.cache && rc != KV_ERR_CANCELLED) {
		/* the miss explainer: where this prompt departs from the cache */
		ksv_explain(s->tok, g->prompt, g->n_prompt - g->n_forced, res.shared, res.next, res.n_next, &g->ex);
		g->have_ex = 1;
		if (res.shared < g->n_prompt - g->n_forced)
			ksv_explain_log(g->route, &g->ex);
	}
	if (rc == KV_ERR_CANCELLED || atomic_load(&g->job.cancel)) {
		cancelled = 1;
	} else if (rc) {
		err_status = rc == KV_ERR_FULL || rc == KV_ERR_NOMEM ? 503 : 500;
		snprintf(errbuf, sizeof errbuf, "engine: %s", kv_errmsg());
	}
	if (p == 0)
		g->resume_kind = "miss";
	else if (s->hybrid && g->n_bounds && p == g->bounds[0])
		g->resume_kind = "anchor"; /* the end of system + tools */
	else if (s->hybrid && p < res.shared)
		g->resume_kind = "snap";
	else
		g->resume_kind = "hit";
	/* forced tokens are part of the answer, not of the prompt */
	g->usage.prompt_tokens = g->n_prompt - g->n_forced;
	g->usage.cached_tokens = p < g->n_prompt - g->n_forced ? p : g->n_prompt - g->n_forced;
	g->usage.completion_tokens = g->n_gen + g->n_forced;
	if (!cancelled && !err_status) {
		kv_buf_reset(&g->piece);
		kv_tok_stream_finish(&g->ds, &g->piece);
		if (g->piece.len)
			ksv_out_feed(g->out, g->piece.p, g->piece.len);
		ksv_out_finish(g->out);
		if (g->req.stream) {
			flush_step_lp(g, &g->sse);
			gen_emit(g, &g->sse);
		}
		if (ksv_out_n_tool_calls(g->out) > 0 && !strcmp(g->finish, "stop"))
			g->finish = "tool_calls";
	}

out:
	atomic_fetch_sub(&s->reserved, reserved);
	kss_registry_put(s->reg, &g->tier);
	/* counted before the client gets its answer, so a client that reads
	 * /metrics right after sees its own request */
	if (started) {
		ksv_metrics_add(s->f_prompt_tok, g->n_prompt);
		ksv_metrics_add(s->f_cached_tok, p);
		ksv_metrics_add(s->f_gen_tok, g->n_gen);
		ksv_series_add(ksv_series_get(s->f_resume, "kind", g->resume_kind ? g->resume_kind : "miss", NULL), 1);
		ksv_observe(s->f_e2e, (double)(kv_now_ns() - g->t_arrive) / 1e9);
	}
	if (started && !cancelled) {
		/* the dashboard's record of this request */
		uint32_t np = g->n_prompt - g->n_forced, pc = p < np ? p : np;
		uint32_t from_disk = g->from_disk ? (g->disk_pos < pc ? g->disk_pos : pc) : 0;
		struct ksv_recent_req rec = {.t_ms = kv_wall_ms(), .prompt_tokens = np, .cached_ram = pc - from_disk,
					     .cached_disk = from_disk, .gen_tokens = (uint32_t)g->n_gen,
					     .ttft_ms = g->t_first ? (double)(g->t_first - g->t_arrive) / 1e6 : 0,
					     .prefill_ms = res.prefill_ms, .decode_ms = res.decode_ms,
					     .miss = g->have_ex && pc < np ? ksv_explain_json(&g->ex) : NULL};
		snprintf(rec.route, sizeof rec.route, "%s", g->route);
		snprintf(rec.resume, sizeof rec.resume, "%s", g->resume_kind ? g->resume_kind : "miss");
		ksv_recent_add(s->recent, &rec);
	}
	if (cancelled)
		ksv_metrics_add(s->f_cancelled, 1);
	/* finish the response */
	if (!started) {
		if (cancelled)
			gen_fail(g, 499, "cancelled");
		else
			gen_fail(g, err_status ? err_status : 500, "%s", errbuf[0] ? errbuf : "internal error");
	} else {
		struct kv_buf *sse = &g->sse;
		if (g->req.stream && cancelled && atomic_load(&s->stopping)) {
			/* shutdown, not a hang-up: tell the client why the stream ends */
			wire_stream_error(g, 503, "the server is shutting down", 0, sse);
			gen_emit(g, sse);
		}
		if (g->req.stream && !cancelled) {
			if (err_status)
				wire_stream_error(g, err_status, errbuf, 1, sse);
			else
				wire_stream_finish(g, sse);
			gen_emit(g, sse);
		}
		pthread_mutex_lock(&g->mu);
		if (err_status && !g->req.stream) {
			g->fail_status = err_status;
			snprintf(g->fail_msg, sizeof g->fail_msg, "%s", errbuf);
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
	double gen_s = g->t_first ? (double)(g->t_prev - g->t_first) / 1e9 : 0;
	KV_INFO("request",
		"route=%s stream=%d prompt_tokens=%u cached_tokens=%u resume=%s disk=%d gen_tokens=%d forced_tokens=%u "
		"finish=%s ttft_ms=%.1f tok_s=%.1f queue_ms=%.1f prefill_ms=%.1f total_ms=%.1f%s%s",
		g->route, g->req.stream, g->n_prompt - g->n_forced, p, g->resume_kind ? g->resume_kind : "none",
		g->from_disk, g->n_gen,
		g->n_forced,
		cancelled ? "cancelled" : err_status ? "error" : g->finish ? g->finish : "none",
		g->t_first ? (double)(g->t_first - g->t_arrive) / 1e6 : 0.0,
		gen_s > 0 && g->n_gen > 1 ? (g->n_gen - 1) / gen_s : 0.0, (double)(t_start - g->job.t_submit_ns) / 1e6,
		res.prefill_ms, dur * 1e3, err_status ? " error=" : "", err_status ? errbuf : "");
	ke_sampler_destroy(g->smp);
	g->smp = NULL;
	kv_buf_free(&g->sse);
	kv_buf_free(&g->piece);
	/* the worker's reference is dropped in gen_done, after the scheduler
	 * is through with the job */
}

static void gen_done(struct ksv_job *job)
{
	gen_unref((struct gen *)job);
}

static void on_gone_cb(void *arg)
{
	struct gen *g = arg;
	ksv_sched_cancel(g->s->sched, &g->job);
}

/* Wait for the job to reach `phase`; 0, 1 if the client went away, 2 if
 * the scheduler dropped the job before it ran (shutdown). */
static int wait_phase(struct gen *g, int phase, struct ksv_conn *c)
{
	struct timespec ts;
	pthread_mutex_lock(&g->mu);
	while (g->phase < phase) {
		if (ksv_sched_state(g->s->sched, &g->job) == KSV_JOB_CANCELLED) {
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

static struct gen *gen_new(struct ksv_server *s, const char *route)
{
	struct gen *g = calloc(1, sizeof *g);
	if (!g)
		return NULL;
	g->s = s;
	g->refs = 1;
	g->route = route;
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

/*
 * Boundaries searched per request: the end of system + tools plus the
 * ends of the newest messages. The search renders the template once per
 * message searched, so an unbounded search costs O(messages^2) (0.1 s at
 * 400 messages); the snapshots a turn needs are at the newest boundaries
 * (what the next turn resumes from) and at the anchor, which is always
 * searched.
 */
#define KSV_MAX_MESSAGE_BOUNDARIES 16

/* Render the chat (or tokenize the completion prompt) into g. Replies and
 * returns nonzero on a client error. */
static int prepare_prompt(struct ksv_server *s, struct gen *g, struct ksv_conn *c)
{
	struct ksv_req *r = &g->req;
	if (r->api == KSV_API_CHAT) {
		if (!s->chat) {
			ksv_reply_error_wire(s, c, g->wire, 500, NULL, "chat templates are not available in this build");
			return 1;
		}
		const json_t *kw = json_object_get(r->body, "chat_template_kwargs");
		struct kv_chat_opts co = {.add_generation_prompt = 1,
					  .enable_thinking = r->enable_thinking,
					  .kwargs = json_is_object(kw) ? kw : NULL,
					  .max_message_boundaries = KSV_MAX_MESSAGE_BOUNDARIES,
					  .request_specials = s->o.special_tokens_in_request};
		struct kv_chat_render rr;
		memset(&rr, 0, sizeof rr);
		int rc = kv_chat_render(s->chat, r->messages, r->tools, &co, &rr);
		if (rc) {
			ksv_reply_error_wire(s, c, g->wire, rc == KV_ERR_NOMEM ? 500 : 400, "messages", "%s", kv_errmsg());
			kv_chat_render_free(&rr);
			return 1;
		}
		g->n_prompt = (uint32_t)rr.n_tokens;
		g->prompt = malloc((rr.n_tokens ? rr.n_tokens : 1) * sizeof *g->prompt);
		g->bounds = malloc((rr.n_boundaries ? rr.n_boundaries : 1) * sizeof *g->bounds);
		if (!g->prompt || !g->bounds) {
			kv_chat_render_free(&rr);
			ksv_reply_error_wire(s, c, g->wire, 500, NULL, "out of memory");
			return 1;
		}
		memcpy(g->prompt, rr.tokens, rr.n_tokens * sizeof *g->prompt);
		for (size_t i = 0; i < rr.n_boundaries; i++)
			if (rr.boundaries[i] > 0 && (uint32_t)rr.boundaries[i] < g->n_prompt)
				g->bounds[g->n_bounds++] = (uint32_t)rr.boundaries[i];
		/* the generation prompt may open a think block (Qwen3.5-style) */
		static const char open_think[] = "<think>\n";
		size_t ol = sizeof open_think - 1;
		g->in_think = rr.text_len >= ol && !memcmp(rr.text + rr.text_len - ol, open_think, ol);
		kv_chat_render_free(&rr);
	} else if (r->prompt) {
		int32_t *ids = NULL;
		size_t n = 0;
		int rc = kv_tok_encode(s->tok, r->prompt, r->prompt_len, 1, &ids, &n);
		if (rc) {
			ksv_reply_error_wire(s, c, g->wire, 400, "prompt", "%s", kv_errmsg());
			return 1;
		}
		g->prompt = ids;
		g->n_prompt = (uint32_t)n;
	} else {
		for (size_t i = 0; i < r->n_prompt_ids; i++)
			if (r->prompt_ids[i] >= s->vocab) {
				ksv_reply_error_wire(s, c, g->wire, 400, "prompt", "token id %d is outside the vocabulary (%d)", r->prompt_ids[i],
					    s->vocab);
				return 1;
			}
		g->prompt = malloc(r->n_prompt_ids * sizeof *g->prompt);
		if (!g->prompt) {
			ksv_reply_error_wire(s, c, g->wire, 500, NULL, "out of memory");
			return 1;
		}
		memcpy(g->prompt, r->prompt_ids, r->n_prompt_ids * sizeof *g->prompt);
		g->n_prompt = (uint32_t)r->n_prompt_ids;
	}
	if (g->n_prompt == 0) {
		ksv_reply_error_wire(s, c, g->wire, 400, r->api == KSV_API_CHAT ? "messages" : "prompt", "the prompt is empty");
		return 1;
	}
	if ((int64_t)g->n_prompt >= s->ctx_len) {
		ksv_reply_error_wire(s, c, g->wire, 400, r->api == KSV_API_CHAT ? "messages" : "prompt",
			    "the prompt is %u tokens; this model's context is %d tokens", g->n_prompt, s->ctx_len);
		return 1;
	}
	return 0;
}

/* 1 if a tool name can be written into the template's syntax as is. */
static int plain_name(const char *n)
{
	if (!*n)
		return 0;
	for (; *n; n++)
		if (!((*n >= 'a' && *n <= 'z') || (*n >= 'A' && *n <= 'Z') || (*n >= '0' && *n <= '9') || *n == '_' ||
		      *n == '-' || *n == '.'))
			return 0;
	return 1;
}

/*
 * tool_choice "required" or a named function: the answer is made to start
 * with the opening of a tool call in the template's own syntax, so the
 * model can only continue it (a documented feature, not a test hook):
 *   Qwen3 JSON   <tool_call>\n{"name": "NAME", "arguments":     (named)
 *                <tool_call>\n{"name": "                       (required)
 *   Qwen3.5 XML  <tool_call>\n<function=NAME>\n                  (named)
 *                <tool_call>\n<function=                        (required)
 * The forced tokens are prefilled after the generation prompt and count as
 * completion tokens. Replies and returns nonzero on error.
 */
static int force_tool_call(struct ksv_server *s, struct gen *g, struct ksv_conn *c)
{
	struct ksv_req *r = &g->req;
	struct kv_buf b = KV_BUF_INIT;
	if (r->api != KSV_API_CHAT || !r->tools || (r->tool_choice != KSV_TC_REQUIRED && r->tool_choice != KSV_TC_NAMED))
		return 0;
	const char *name = r->tool_choice == KSV_TC_NAMED ? r->tool_name : NULL;
	if (name && !plain_name(name)) {
		ksv_reply_error_wire(s, c, g->wire, 400, "tool_choice", "tool name '%s' cannot be forced (letters, digits, _ - . only)", name);
		return 1;
	}
	if (s->xml_tools) {
		if (name)
			kv_buf_printf(&b, "<tool_call>\n<function=%s>\n", name);
		else
			kv_buf_adds(&b, "<tool_call>\n<function=");
	} else {
		if (name)
			kv_buf_printf(&b, "<tool_call>\n{\"name\": \"%s\", \"arguments\": ", name);
		else
			kv_buf_adds(&b, "<tool_call>\n{\"name\": \"");
	}
	int32_t *ids = NULL;
	size_t n = 0;
	if (b.oom || kv_tok_encode(s->tok, b.p, b.len, 1, &ids, &n)) {
		kv_buf_free(&b);
		ksv_reply_error_wire(s, c, g->wire, 500, NULL, "cannot encode the forced tool call: %s", kv_errmsg());
		return 1;
	}
	int32_t *np = realloc(g->prompt, (g->n_prompt + n) * sizeof *np);
	if (!np) {
		free(ids);
		kv_buf_free(&b);
		ksv_reply_error_wire(s, c, g->wire, 500, NULL, "out of memory");
		return 1;
	}
	memcpy(np + g->n_prompt, ids, n * sizeof *ids);
	free(ids);
	g->prompt = np;
	g->n_prompt += (uint32_t)n;
	g->n_forced = (uint32_t)n;
	g->forced = kv_buf_take(&b);
	if ((int64_t)g->n_prompt >= s->ctx_len) {
		ksv_reply_error_wire(s, c, g->wire, 400, "messages", "the prompt is %u tokens; this model's context is %d tokens", g->n_prompt,
			    s->ctx_len);
		return 1;
	}
	return 0;
}

/*
 * The body of a request in any API, as a validated chat request in g->req:
 * Messages and Responses bodies are translated into the chat body first
 * (anthropic.h, responses.h); then --prompt-normalize applies to the
 * messages of every chat request. Replies and returns nonzero on error.
 */
static int parse_body(struct ksv_server *s, struct gen *g, const struct ksv_request *rq, int api, int for_count)
{
	struct ksv_conn *c = rq->conn;
	if (g->wire == KSV_WIRE_OPENAI) {
		if (ksv_req_parse(api, rq->body, rq->body_len, JSON_MAX_DEPTH, &g->req)) {
			ksv_reply_error_wire(s, c, g->wire, 400, g->req.err_param, "%s", kv_errmsg());
			return 1;
		}
	} else {
		json_t *body = NULL, *chat = NULL;
		char param[96] = "";
		int rc = kv_json_parse("request body", rq->body, rq->body_len, JSON_MAX_DEPTH, &body);
		if (!rc)
			rc = g->wire == KSV_WIRE_ANTHROPIC ? ksv_anth_to_chat(body, for_count, &chat, param, sizeof param)
							   : ksv_resp_to_chat(body, &chat, param, sizeof param);
		json_decref(body);
		char *text = rc ? NULL : json_dumps(chat, JSON_COMPACT | JSON_ALLOW_NUL);
		json_decref(chat);
		if (rc) {
			ksv_reply_error_wire(s, c, g->wire, 400, param, "%s", kv_errmsg());
			return 1;
		}
		if (!text) {
			ksv_reply_error_wire(s, c, g->wire, 500, NULL, "out of memory");
			return 1;
		}
		rc = ksv_req_parse(KSV_API_CHAT, text, strlen(text), JSON_MAX_DEPTH, &g->req);
		free(text);
		if (rc) {
			ksv_reply_error_wire(s, c, g->wire, 400, g->req.err_param, "%s", kv_errmsg());
			return 1;
		}
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
	struct gen *g = gen_new(s, "/v1/messages/count_tokens");
	if (!g) {
		ksv_reply_error_wire(s, c, KSV_WIRE_ANTHROPIC, 500, NULL, "out of memory");
		return;
	}
	g->wire = KSV_WIRE_ANTHROPIC;
	ksv_anth_init(&g->anth, s->model_name, 0);
	if (parse_body(s, g, rq, KSV_API_CHAT, 1) || prepare_prompt(s, g, c)) {
		gen_unref(g);
		return;
	}
	size_t len = 0;
	char *body = ksv_anth_count_body(g->n_prompt, &len);
	if (body)
		ksv_conn_reply(c, 200, "application/json", body, len);
	else
		ksv_reply_error_wire(s, c, KSV_WIRE_ANTHROPIC, 500, NULL, "out of memory");
	free(body);
	gen_unref(g);
}

void ksv_gen_handle(struct ksv_server *s, const struct ksv_request *rq, int api, int wire)
{
	struct ksv_conn *c = rq->conn;
	const char *route = route_name(api, wire);
	if (atomic_load(&s->stopping)) {
		ksv_reply_error_wire(s, c, wire, 503, NULL, "the server is shutting down");
		return;
	}
	struct gen *g = gen_new(s, route);
	if (!g) {
		ksv_reply_error_wire(s, c, wire, 500, NULL, "out of memory");
		return;
	}
	g->wire = wire;
	if (parse_body(s, g, rq, api, 0))
		goto out;
	if (g->req.model && strcmp(g->req.model, s->model_name)) {
		ksv_reply_error_wire(s, c, g->wire, 404, "model", "the model '%s' does not exist (this server serves '%s')", g->req.model,
			    s->model_name);
		goto out;
	}
	/* cache_salt: with --allow-request-salt, requests with the same salt
	 * share a namespace of their own (session/registry.h); without it a salt is
	 * refused rather than silently sharing the server's namespace */
	if (request_salt(s, c, g->req.body, &g->salt))
		goto out;
	if (prepare_prompt(s, g, c))
		goto out;
	if (force_tool_call(s, g, c))
		goto out;
	int64_t room = s->ctx_len - (int64_t)g->n_prompt;
	int64_t mt = g->req.max_tokens > 0 ? g->req.max_tokens : s->o.default_max_tokens;
	if (g->n_forced && mt <= (int64_t)g->n_forced) {
		ksv_reply_error_wire(s, c, g->wire, 400, g->req.max_tokens > 0 ? "max_tokens" : "tool_choice",
			    "max_tokens %lld leaves no room: the forced tool-call opening alone takes %u tokens",
			    (long long)mt, g->n_forced);
		goto out;
	}
	mt -= g->n_forced; /* forced tokens count against max_tokens */
	g->max_tokens = (int)(mt < room ? mt : room);

	struct ksv_out_params op = {.stop = g->req.stop,
				    .n_stop = g->req.n_stop,
				    .split_reasoning = s->o.split_reasoning && api == KSV_API_CHAT,
				    .in_think = g->in_think,
				    .tools = g->req.tool_choice != KSV_TC_NONE ? g->req.tools : NULL,
				    .xml_tools = s->xml_tools,
				    .fn = on_event,
				    .ctx = g};
	if (ksv_out_create(&op, &g->out)) {
		ksv_reply_error_wire(s, c, g->wire, 500, NULL, "%s", kv_errmsg());
		goto out;
	}
	ksv_oai_init(&g->oai, api, s->model_name, g->req.stream && g->req.include_usage, g->req.logprobs);
	if (wire == KSV_WIRE_ANTHROPIC)
		ksv_anth_init(&g->anth, s->model_name, g->req.stream);
	else if (wire == KSV_WIRE_RESPONSES)
		ksv_resp_init(&g->resp, s->model_name, g->req.stream);

	g->refs++; /* the worker's reference */
	int rc = ksv_sched_submit(s->sched, &g->job);
	if (rc) {
		g->refs--;
		if (rc == KV_ERR_FULL) {
			ksv_metrics_add(s->f_rej_429, 1);
			ksv_reply_error_wire(s, c, g->wire, 429, NULL, "too many requests are waiting (%lld); retry later",
				    (long long)s->o.max_queue);
		} else {
			ksv_reply_error_wire(s, c, g->wire, 503, NULL, "the server is shutting down");
		}
		goto out;
	}
	int w = wait_phase(g, PH_STARTED, c);
	if (w) {
		/* the client left while queued or prefilling, or shutdown */
		ksv_sched_cancel(s->sched, &g->job);
		if (ksv_sched_state(s->sched, &g->job) == KSV_JOB_CANCELLED) {
			/* removed before running: the worker's reference is ours to drop */
			gen_unref(g);
			if (w == 1)
				ksv_metrics_add(s->f_cancelled, 1);
		}
		if (w == 2)
			ksv_reply_error_wire(s, c, g->wire, 503, NULL, "the server is shutting down");
		else
			ksv_reply_error_wire(s, c, g->wire, 499, NULL, "client closed the connection");
		goto out;
	}
	pthread_mutex_lock(&g->mu);
	int failed = g->phase == PH_DONE && g->fail_status;
	pthread_mutex_unlock(&g->mu);
	if (failed) {
		ksv_reply_error_wire(s, c, g->wire, g->fail_status, NULL, "%s", g->fail_msg);
		goto out;
	}
	if (g->req.stream) {
		ksv_conn_header(c, "Cache-Control", "no-cache");
		ksv_conn_header(c, "X-Accel-Buffering", "no");
		struct ksv_stream *st = ksv_conn_stream(c, 200, "text/event-stream; charset=utf-8");
		if (!st) {
			atomic_store(&g->job.cancel, 1);
			ksv_reply_error_wire(s, c, g->wire, 500, NULL, "cannot open the stream");
			goto out;
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
		goto out;
	}
	if (wait_phase(g, PH_DONE, c)) {
		/* the job is running (it started): the cancel flag stops it */
		ksv_sched_cancel(s->sched, &g->job);
		ksv_reply_error_wire(s, c, g->wire, 499, NULL, "client closed the connection");
		goto out;
	}
	if (g->fail_status) {
		ksv_reply_error_wire(s, c, g->wire, g->fail_status, NULL, "%s", g->fail_msg);
		goto out;
	}
	/* the whole body */
	if (g->wire != KSV_WIRE_OPENAI) {
		size_t blen = 0;
		char *b = wire_body(g, &blen);
		if (b)
			ksv_conn_reply(c, 200, "application/json", b, blen);
		else
			ksv_reply_error_wire(s, c, g->wire, 500, NULL, "out of memory");
		free(b);
		goto out;
	}
	struct ksv_lp *lps = NULL;
	struct ksv_lp_alt *alts = NULL;
	int top = g->req.top_logprobs, stride = 1 + KSV_MAX_TOP_LOGPROBS;
	if (g->n_lp) {
		lps = calloc(g->n_lp, sizeof *lps);
		alts = calloc(g->n_lp * (size_t)(top ? top : 1), sizeof *alts);
		for (size_t i = 0; lps && alts && i < g->n_lp; i++) {
			const int32_t *ri = g->lp_ids + i * (size_t)stride;
			const float *rv = g->lp_vals + i * (size_t)stride;
			lps[i].bytes = tok_bytes(s, ri[0], &lps[i].len);
			lps[i].logprob = rv[0];
			lps[i].top = alts + i * (size_t)top;
			for (int k = 0; k < top && ri[1 + k] >= 0; k++) {
				alts[i * (size_t)top + (size_t)k].bytes = tok_bytes(s, ri[1 + k], &alts[i * (size_t)top + (size_t)k].len);
				alts[i * (size_t)top + (size_t)k].logprob = rv[1 + k];
				lps[i].n_top = k + 1;
			}
		}
	}
	int calls = g->n_calls > 0;
	struct ksv_oai_result res = {
		.content = g->have_content || !calls ? (g->content.p ? g->content.p : "") : NULL,
		.content_len = g->content.len,
		.reasoning = g->reasoning.len ? g->reasoning.p : NULL,
		.reasoning_len = g->reasoning.len,
		.calls = g->calls,
		.n_calls = g->n_calls,
		.lps = lps && alts ? lps : NULL,
		.n_lps = lps && alts ? g->n_lp : 0,
		.finish_reason = g->finish,
		.usage = g->usage,
	};
	for (size_t i = 0; i < g->n_calls; i++)
		if (!g->calls[i].arguments)
			g->calls[i].arguments = strdup("{}");
	size_t len = 0;
	char *body = ksv_oai_response(&g->oai, &res, &len);
	free(lps);
	free(alts);
	if (body)
		ksv_conn_reply(c, 200, "application/json", body, len);
	else
		ksv_reply_error_wire(s, c, g->wire, 500, NULL, "out of memory");
	free(body);
out:
	gen_unref(g); /* this thread's reference; the worker holds its own */
}

struct probe_look {
	struct gen *g;
	uint32_t pos, shared, dpos;
	int have_disk;
};

/* What one namespace holds of the probed prompt (registry locked). */
static void probe_look(void *ctx, const struct kss_tier *t)
{
	struct probe_look *pl = ctx;
	struct gen *g = pl->g;
	struct kc_hit hit;
	kc_cache_peek(t->cache, g->prompt, g->n_prompt, &hit);
	pl->pos = hit.pos;
	pl->shared = hit.shared;
	ksv_explain(g->s->tok, g->prompt, g->n_prompt, hit.shared, hit.next, hit.n_next, &g->ex);
	g->have_ex = 1;
	kc_hit_release(t->cache, &hit);
	pl->dpos = t->store ? ks_store_probe(t->store, g->prompt, g->n_prompt, g->bounds, g->n_bounds) : 0;
	pl->have_disk = t->store != NULL;
}

void ksv_gen_probe(struct ksv_server *s, const struct ksv_request *rq)
{
	struct ksv_conn *c = rq->conn;
	struct gen *g = gen_new(s, "/v1/cache/probe");
	if (!g) {
		ksv_reply_error(s, c, 500, NULL, "out of memory");
		return;
	}
	if (ksv_req_parse_probe(rq->body, rq->body_len, JSON_MAX_DEPTH, &g->req)) {
		ksv_reply_error_wire(s, c, g->wire, 400, g->req.err_param, "%s", kv_errmsg());
		gen_unref(g);
		return;
	}
	if (prepare_prompt(s, g, c)) {
		gen_unref(g);
		return;
	}
	/* a cache_salt probes that salt's namespace when it is open
	 * (session/registry.h); the registry keeps it open while we look */
	const char *ss = NULL;
	if (request_salt(s, c, g->req.body, &ss)) {
		gen_unref(g);
		return;
	}
	struct probe_look pl = {.g = g};
	int open = kss_registry_with(s->reg, ss, probe_look, &pl);
	uint32_t pos = pl.pos, shared = pl.shared, dpos = pl.dpos;
	int have_disk = open ? pl.have_disk : s->store != NULL;
	json_t *j = json_object(), *ram = json_object(), *disk = json_object();
	json_object_set_new(j, "prompt_tokens", json_integer(g->n_prompt));
	if (ss)
		json_object_set_new(j, "salt_tier_open", json_boolean(open));
	json_object_set_new(ram, "cached_tokens", json_integer(pos));
	json_object_set_new(ram, "shared_tokens", json_integer(shared));
	json_object_set_new(j, "ram", ram);
	json_object_set_new(disk, "available", json_boolean(have_disk));
	json_object_set_new(disk, "cached_tokens", json_integer(dpos));
	json_object_set_new(j, "disk", disk);
	if (dpos > pos)
		pos = dpos;
	json_object_set_new(j, "cached_tokens", json_integer(pos));
	json_object_set_new(j, "cold_tokens", json_integer(g->n_prompt - pos));
	json_t *bs = json_array();
	for (size_t i = 0; i < g->n_bounds; i++)
		json_array_append_new(bs, json_integer(g->bounds[i]));
	json_object_set_new(j, "boundaries", bs);
	if (g->have_ex)
		json_object_set_new(j, "miss", ksv_explain_json(&g->ex));
	ksv_reply_json(c, 200, j);
	gen_unref(g);
}
