/*
 * replay.h - the non-CLI half of `kvkeep bench replay`: reading recorded
 * request traces, preparing bodies, sending one streamed request and
 * measuring it, and the statistics of a run.
 *
 * Trace formats (read here):
 *   JSONL   one chat-completions request body per line, UTF-8. Lines end
 *           with \n (a \r before it is dropped). Blank lines are skipped
 *           and do not count. Line numbers are 1-based and name the item
 *           ("trace.jsonl:7"). A line that is not JSON, or whose value is
 *           not an object, becomes a bad item: it keeps its place and its
 *           reason, and the replay reports it and goes on.
 *   folder  every regular file named *.json (not starting with '.') is one
 *           body; files are taken in name order with digit runs compared
 *           as numbers (GNU strverscmp: 2.json before 10.json, as `ls -v`),
 *           so recorders that do not zero-pad still replay in order.
 * Bodies are kept as parsed (jansson keeps key order) and sent unchanged
 * except for the fields kcl_replay_prepare sets.
 *
 * What is measured per request (kcl_replay_result): the HTTP status; from
 * the stream's usage object (the last non-null one; OpenAI sends it in a
 * final chunk with empty choices when stream_options.include_usage is
 * set) prompt_tokens, completion_tokens and
 * prompt_tokens_details.cached_tokens; the time to the first token, i.e.
 * the first chunk whose delta carries non-empty content, reasoning
 * (reasoning_content / reasoning) or tool_calls; the total time until the
 * body ends. Times start just before the connection is opened.
 *
 * Ownership: a trace owns its items and their bodies; results own nothing
 * (fixed-size strings).
 */
#ifndef KV_CLIENT_REPLAY_H
#define KV_CLIENT_REPLAY_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "client/http_client.h"

#define KSV_REPLAY_MAX_TRACE ((size_t)2 << 30)  /* bytes of a JSONL trace we read */
#define KSV_REPLAY_MAX_BODY ((size_t)256 << 20) /* bytes of one folder-mode body */

/* --- traces --------------------------------------------------------------- */

struct kcl_replay_item {
	char *source;  /* "FILE:LINE" or "DIR/NAME.json"; malloc'd */
	json_t *body;  /* the request body (a JSON object); NULL for a bad item */
	char *error;   /* why the item is bad (malloc'd); NULL for a good one */
};

struct kcl_replay_trace {
	struct kcl_replay_item *items; /* n items in replay order */
	size_t n;
};

/* Parse JSONL bytes. `what` prefixes item sources ("trace.jsonl"). Bad lines
 * become bad items; only running out of memory fails. *out: free with
 * kcl_replay_trace_free. */
int kcl_replay_load_jsonl_mem(const char *what, const char *p, size_t n, struct kcl_replay_trace **out);
/* Read a JSONL file (at most KSV_REPLAY_MAX_TRACE bytes) through kv_io. */
int kcl_replay_load_jsonl(const char *path, struct kcl_replay_trace **out);
/* Read every *.json file of a folder, in strverscmp order. A folder with no
 * such file is KV_ERR_NOT_FOUND. */
int kcl_replay_load_dir(const char *dir, struct kcl_replay_trace **out);
void kcl_replay_trace_free(struct kcl_replay_trace *t);

/*
 * The body to send: a copy of `body` with "stream": true,
 * "stream_options": {..., "include_usage": true} (other stream_options keys
 * kept), "temperature": 0, and the token limit capped at max_tokens:
 * "max_tokens" and "max_completion_tokens" are lowered to max_tokens where
 * present and larger, and "max_tokens" is added when neither is present.
 * With model non-NULL, "model" is set to it (the caller's --model: recorded
 * traces name whatever model the client used). Every other field goes out
 * unchanged. *out is malloc'd compact JSON (free()).
 */
int kcl_replay_prepare(const json_t *body, int64_t max_tokens, const char *model, char **out, size_t *len);

/* --- one streamed response ------------------------------------------------ */

/* Accumulates what one SSE response says. Counters are -1 until seen. */
struct kcl_replay_stream {
	int64_t prompt_tokens;
	int64_t cached_tokens;     /* usage.prompt_tokens_details.cached_tokens */
	int64_t completion_tokens;
	int64_t n_token_chunks;    /* chunks with content, reasoning or tool calls */
	double t_first;            /* seconds to the first such chunk; < 0 until seen */
	int done;                  /* "[DONE]" seen */
	int n_bad;                 /* events that were not JSON objects */
	char finish_reason[32];    /* last non-null finish_reason, "" if none */
	char error[256];           /* an in-stream {"error": ...} message, "" if none */
};

void kcl_replay_stream_init(struct kcl_replay_stream *s);
/* Account one event's data (the joined data: lines), received `t` seconds
 * after the request started. Never fails: malformed events are counted. */
void kcl_replay_stream_event(struct kcl_replay_stream *s, const char *data, size_t n, double t);

/* --- one request ------------------------------------------------------------ */

struct kcl_replay_result {
	int ok;                    /* HTTP 200 and a complete stream without error */
	int status;                /* HTTP status; 0 when no response came */
	int64_t prompt_tokens;     /* -1: not reported */
	int64_t cached_tokens;     /* -1: not reported */
	int64_t generated_tokens;  /* usage.completion_tokens, else token chunks counted */
	double ttft_s;             /* < 0: no token came */
	double total_s;
	char error[512];           /* "" when ok */
};

/*
 * POST body to <base>/chat/completions (base: a parsed --base-url such as
 * http://127.0.0.1:8000/v1) and read the stream. Always fills *res; the
 * return value is KV_OK when a response was obtained (whatever its
 * status), else the transport error (also written into res->error). A
 * non-200 response's error message (OpenAI {"error": {"message"}}, or the
 * start of the body) goes into res->error.
 */
int kcl_replay_send(const struct kcl_url *base, const char *body, size_t len, int timeout_ms,
		    struct kcl_replay_result *res);

/* --- statistics ------------------------------------------------------------- */

/*
 * The q-quantile (0 <= q <= 1) of v[0..n) by linear interpolation between
 * the closest ranks of the sorted values (position q*(n-1), the default of
 * numpy.percentile): p50 of {1,2,3,4} is 2.5, p90 of 1..10 is 9.1. NaN when
 * n == 0. v is not modified.
 */
double kcl_replay_quantile(const double *v, size_t n, double q);

struct kcl_replay_summary {
	size_t requests;           /* items replayed (bad ones included) */
	size_t ok, failed;
	int64_t prompt_tokens;     /* over ok requests */
	int64_t cached_tokens;     /* over ok requests; not-reported counts as 0 */
	int64_t generated_tokens;
	double reuse_ratio;        /* cached / prompt over the whole run; NaN when prompt is 0 */
	double ttft_p50_s, ttft_p90_s;   /* over ok requests with a first token; NaN if none */
	double total_p50_s, total_p90_s; /* over ok requests */
};

void kcl_replay_summarize(const struct kcl_replay_result *r, size_t n, struct kcl_replay_summary *out);

#endif
