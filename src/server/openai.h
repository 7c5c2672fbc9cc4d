/*
 * openai.h - the OpenAI wire format (ksv_wire_openai, wire.h): chat
 * completions and legacy completions, and the JSON / SSE helpers every
 * format uses.
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
 *            "prompt_tokens_details": {"cached_tokens"}[, "kvkeep": {...}]}
 *   content is null only when the answer is tool calls alone.
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
 * A token's logprobs ride on the delta its text came in; a token whose
 * text is held back (a possible stop string) sends them in an empty
 * content delta at the end of its step.
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

/* prefix + 24 random alphanumerics into out (cap >= strlen(prefix) + 25,
 * else out is ""). Used for call_, msg_, toolu_, resp_, fc_ ids. */
void ksv_oai_rand_id(const char *prefix, char *out, size_t cap);
/* 64 random bits (ids). */
uint64_t ksv_wire_rand64(void);

/* Error body for a status; param may be NULL or "". malloc'd (free()). */
char *ksv_oai_error(int status, const char *message, const char *param, size_t *len);
/* The same with OpenAI's own code for the case instead of the status's
 * ("context_length_exceeded"). */
char *ksv_oai_error_code(int status, const char *code, const char *message, const char *param, size_t *len);

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
