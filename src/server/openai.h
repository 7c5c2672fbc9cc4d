/*
 * openai.h - response bodies and SSE chunks in the OpenAI schema.
 *
 * Chat completion (stream: false):
 *   {"id": "chatcmpl-<24 hex>", "object": "chat.completion", "created": <unix s>,
 *    "model": M, "system_fingerprint": "kvkeep-<version>",
 *    "choices": [{"index": 0,
 *                 "message": {"role": "assistant", "content": string|null,
 *                             ["reasoning_content": string,]
 *                             ["tool_calls": [{"id": "call_<24>", "type": "function",
 *                                              "function": {"name", "arguments": string}}]]},
 *                 "logprobs": null | {"content": [TOKEN_LP, ...]},
 *                 "finish_reason": "stop" | "length" | "tool_calls"}],
 *    "usage": USAGE}
 *   TOKEN_LP = {"token": string, "logprob": number, "bytes": [int, ...],
 *               "top_logprobs": [{"token", "logprob", "bytes"}, ...]}
 *   USAGE = {"prompt_tokens", "completion_tokens", "total_tokens",
 *            "prompt_tokens_details": {"cached_tokens"}}
 *
 * Chat stream: "data: <chunk>\n\n" events, then "data: [DONE]\n\n". Every
 * chunk is {"id", "object": "chat.completion.chunk", "created", "model",
 * "system_fingerprint", "choices": [{"index": 0, "delta": {...}, "logprobs":
 * null|{...}, "finish_reason": null|reason}]} and, with
 * stream_options.include_usage, "usage": null; the last chunk before
 * [DONE] then has "choices": [] and the usage. The first delta carries
 * {"role": "assistant", "content": ""}. Tool calls stream as
 *   {"tool_calls": [{"index": i, "id": "call_..", "type": "function",
 *                    "function": {"name": N, "arguments": ""}}]}
 * followed by {"tool_calls": [{"index": i, "function": {"arguments": "<piece>"}}]}.
 *
 * Completions (/v1/completions): object "text_completion", choices
 * [{"index": 0, "text": T, "logprobs": null|LEGACY, "finish_reason"}];
 * LEGACY = {"tokens": [..], "token_logprobs": [..], "top_logprobs": [{tok: lp}],
 * "text_offset": [..]}. Streamed chunks have the same shape.
 *
 * Errors: {"error": {"message", "type", "param", "code"}} with type
 * invalid_request_error (400, 404, 413), server_error (500), and
 * overloaded_error (503, sent with Retry-After).
 *
 * Text given to these functions may hold any bytes: invalid UTF-8 is
 * replaced by U+FFFD so the JSON stays valid (token bytes keep the exact
 * values in "bytes").
 */
#ifndef KV_SERVER_OPENAI_H
#define KV_SERVER_OPENAI_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

/* One alternative token with its log-probability. */
struct ksv_lp_alt {
	const char *bytes;   /* the token's raw bytes */
	size_t len;
	float logprob;
};

/* The chosen token of one step, with its alternatives. */
struct ksv_lp {
	const char *bytes;
	size_t len;
	float logprob;
	int n_top;
	const struct ksv_lp_alt *top;
};

struct ksv_usage {
	int64_t prompt_tokens;
	int64_t completion_tokens;
	int64_t cached_tokens;
};

/* The state of one response (ids, what the stream has sent). */
struct ksv_oai {
	int api;                  /* enum ksv_api */
	char id[48];
	int64_t created;
	char model[256];
	int include_usage;
	int role_sent;
	int logprobs;             /* logprobs were asked for */
	size_t text_offset;       /* completions: bytes of text sent so far */
};

void ksv_oai_init(struct ksv_oai *o, int api, const char *model, int include_usage, int logprobs);
/* prefix + 24 random alphanumerics into out (cap >= strlen(prefix) + 25,
 * else out is ""). Used for call_, msg_, toolu_, resp_, fc_ ids. */
void ksv_oai_rand_id(const char *prefix, char *out, size_t cap);
/* "call_" + 24 random alphanumerics into out (>= 32 bytes). */
void ksv_oai_tool_call_id(char out[32]);

/* --- SSE chunks (each appends "data: ...\n\n" to out) ---------------------- */

void ksv_oai_sse_role(struct ksv_oai *o, struct kv_buf *out);
/* A content (and/or reasoning) delta with the logprobs of its tokens. Sends
 * the role chunk first if not sent yet. */
void ksv_oai_sse_delta(struct ksv_oai *o, const char *content, size_t len, const char *reasoning, size_t rlen,
		       const struct ksv_lp *lps, size_t n_lps, struct kv_buf *out);
void ksv_oai_sse_tool_start(struct ksv_oai *o, int index, const char *id, const char *name, struct kv_buf *out);
void ksv_oai_sse_tool_args(struct ksv_oai *o, int index, const char *args, size_t len, struct kv_buf *out);
void ksv_oai_sse_finish(struct ksv_oai *o, const char *reason, struct kv_buf *out);
/* The usage chunk (only when include_usage), then nothing else. */
void ksv_oai_sse_usage(struct ksv_oai *o, const struct ksv_usage *u, struct kv_buf *out);
/* An error inside a stream that already started. */
void ksv_oai_sse_error(struct ksv_oai *o, int status, const char *message, struct kv_buf *out);
void ksv_oai_sse_done(struct kv_buf *out);

/* --- whole responses ----------------------------------------------------- */

struct ksv_tool_call {
	char id[32];
	char *name;          /* malloc'd by the producer */
	char *arguments;     /* malloc'd JSON text */
};

struct ksv_oai_result {
	const char *content;         /* NULL: no content (null in JSON) */
	size_t content_len;
	const char *reasoning;       /* NULL: omitted */
	size_t reasoning_len;
	const struct ksv_tool_call *calls;
	size_t n_calls;
	const struct ksv_lp *lps;    /* every generated token (when logprobs) */
	size_t n_lps;
	const char *finish_reason;
	struct ksv_usage usage;
};

/* The full JSON body, malloc'd (free()). NULL when out of memory. */
char *ksv_oai_response(struct ksv_oai *o, const struct ksv_oai_result *r, size_t *len);

/* Error body for a status; param may be NULL or "". malloc'd (free()). */
char *ksv_oai_error(int status, const char *message, const char *param, size_t *len);

/* One SSE event: "event: NAME\n" (omitted when event is NULL, as OpenAI's
 * chat stream has it), "data: <compact JSON>\n\n". Takes data's reference;
 * out->oom on failure. The one writer of the three APIs' streams. */
void ksv_sse_event(struct kv_buf *out, const char *event, json_t *data);

/* A whole JSON body, compact, reals exact (17 digits): malloc'd (free());
 * NULL when j is NULL or out of memory. Takes j's reference. */
char *ksv_json_body(json_t *j, size_t *len);

/* A JSON string from arbitrary bytes (invalid UTF-8 -> U+FFFD). New ref. */
json_t *ksv_json_text(const char *p, size_t n);

#endif
