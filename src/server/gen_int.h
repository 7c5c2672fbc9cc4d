/*
 * gen_int.h - a generation request (struct gen) as the three files of its
 * path share it. Private to src/server:
 *
 *   gen.c     the HTTP side: handler, queue, waiting, the answer or stream
 *   genrun.c  the worker side: kss_request (session/request.h) and its
 *             sink, which hands the wire format what the session reports
 *   genjob.c  the request object and its stream plumbing, below both
 *             (calls go gen.c -> genrun.c -> genjob.c, and gen.c -> genjob.c)
 *
 * Lifetime (struct gen): reference counted, one reference for the handler
 * and one for the worker. A stream is ended by the worker when it
 * finishes, or by the handler when it attaches a stream to a job that
 * already finished.
 */
#ifndef KV_SERVER_GEN_INT_H
#define KV_SERVER_GEN_INT_H

#include "server/server_int.h"
#include "server/inflight.h"
#include "server/wire.h"
#include "session/request.h"

enum { PH_QUEUED = 0, PH_STARTED, PH_DONE };

struct gen {
	struct ksv_job job;
	struct ksv_server *s;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int refs;
	const struct ksv_wire *w;
	int wire;                 /* enum ksv_wire_id */
	const char *route;
	struct ksv_intake in;     /* the request, parsed, checked and rendered (intake.c) */
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
	/* while it runs (worker): the dashboard's record and the prefill's clocks */
	struct ksv_inflight_rec live;
	uint64_t t_prefill0;      /* the prefill began (kv_now_ns) */
	uint64_t t_last_ka;       /* the last keep-alive (or the stream's start) */
	uint64_t t_last_log;      /* the last progress log line */
	struct kv_buf sse;
	struct kss_request_result res;
};

/* genjob.c */
void gen_unref(struct gen *g);
void gen_set_phase(struct gen *g, int phase);
/* The SSE bytes made so far (g->sse) to the client, or kept until the
 * stream is attached; waits (away from the engine) while a slow client's
 * stream is full. Worker thread only. */
void gen_emit(struct gen *g);
/* Wait for the job to reach `phase`; 0, 1 if the client went away, 2 if
 * the queue dropped the job before it ran (shutdown). */
int gen_wait_phase(struct gen *g, int phase, struct ksv_conn *c);

/* genrun.c: the job's run and done functions (queue.h). */
void gen_run(struct ksv_job *job);
void gen_done(struct ksv_job *job);

#endif
