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
 * This file is the handler's side; the worker's is genrun.c, the request
 * object genjob.c (gen_int.h).
 */
#include "server/gen_int.h"
#include "base/clock.h"
#include "base/err.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void on_gone_cb(void *arg)
{
	struct gen *g = arg;
	ksv_queue_cancel(g->s->queue, &g->job);
}

static struct gen *gen_new(struct ksv_server *s, const char *route, int wire)
{
	struct gen *g = calloc(1, sizeof *g);
	if (!g)
		return NULL;
	g->s = s;
	g->refs = 1;
	g->route = route;
	g->wire = wire;
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
	ksv_reply_error_wire(g->s, c, g->wire == KSV_WIRE_ANTHROPIC ? KSV_WIRE_ANTHROPIC : KSV_WIRE_OPENAI, status,
			     param, "%s", msg);
}

static const char *route_name(int api, int wire)
{
	if (wire == KSV_WIRE_ANTHROPIC)
		return "/v1/messages";
	if (wire == KSV_WIRE_RESPONSES)
		return "/v1/responses";
	return api == KSV_API_CHAT ? "/v1/chat/completions" : "/v1/completions";
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
	int w = gen_wait_phase(g, PH_STARTED, c);
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

/* Everything before the queue (intake.c), then the answer's state. 0 or
 * an answer was sent. */
static int prepare(struct gen *g, const struct ksv_request *rq, int api)
{
	struct ksv_server *s = g->s;
	if (ksv_intake_gen(s, rq, g->wire, api, g->route, &g->in))
		return 1;
	/* the answer names the model as the request did (one of the served names) */
	ksv_answer_init(&g->ans, g->w, api, g->in.req.model ? g->in.req.model : s->model_name, g->in.req.stream);
	g->ans.tb = s->tb;
	g->ans.include_usage = g->in.req.stream && g->in.req.include_usage;
	g->ans.logprobs = g->in.req.logprobs;
	g->ans.return_progress = g->in.req.stream && g->in.req.return_progress;
	g->ans.encrypted_reasoning = g->in.req.encrypted_reasoning;
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
	if (g->in.req.stream) {
		attach_stream(g, c);
		goto out;
	}
	if (gen_wait_phase(g, PH_DONE, c)) {
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
