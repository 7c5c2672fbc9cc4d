/*
 * anthropic.h - the Anthropic Messages API (POST /v1/messages), as Claude
 * Code speaks it: request translation and response formatting.
 *
 * Requests are translated into the OpenAI chat body that request.h
 * validates, so every route shares one validation, one template render and
 * one generation path. The mapping:
 *
 *   system: string | [{type: "text", text}]  -> one "system" message; the
 *        text blocks are joined with "\n" (block boundaries are not
 *        visible to the model; the template renders one system turn).
 *   messages[i] {role: "user"|"assistant"|"system", content: string|blocks}
 *     user blocks     text -> the user message's text (joined with "\n");
 *                     tool_result {tool_use_id, content: string|blocks,
 *                     is_error} -> a "tool" message (tool_call_id =
 *                     tool_use_id), placed before the user's own text;
 *                     image / document -> 400 (this server runs text
 *                     models); other block types -> 400 naming them.
 *     assistant blocks text -> content; tool_use {id, name, input} ->
 *                     tool_calls; thinking {thinking, signature} ->
 *                     reasoning_content; redacted_thinking -> dropped.
 *     system          a system message at that place (Claude Code sends
 *                     them); the template decides where it may stand.
 *   tools: [{name, description?, input_schema}] -> function tools; server
 *        tools (a "type" other than "custom", e.g. web_search_20250305)
 *        are left out and logged.
 *   tool_choice: {type: auto|any|tool|none, name} -> auto|required|named|none
 *   thinking: {type: enabled|adaptive} -> enable_thinking true,
 *        {type: disabled} -> false, absent -> the template's default.
 *   max_tokens (required, >= 1), stop_sequences (<= 4), temperature,
 *        top_p, top_k, stream; metadata, cache_control (anywhere),
 *        context_management, service_tier and unknown fields are ignored.
 *
 * Responses (see anthropic.c for field order):
 *   non-streaming  {id: "msg_..", type: "message", role: "assistant",
 *                   model, content: [blocks], stop_reason, stop_sequence,
 *                   usage: {input_tokens, cache_creation_input_tokens,
 *                   cache_read_input_tokens, output_tokens}}
 *   streaming      "event: NAME\ndata: JSON\n\n" in the order
 *                   message_start, (content_block_start, *_delta...,
 *                   content_block_stop)*, message_delta, message_stop;
 *                   ping while waiting; error inside a stream.
 *   stop_reason    end_turn | tool_use | max_tokens | stop_sequence
 *   usage          input_tokens counts the prompt tokens the cache did not
 *                  serve; cache_read_input_tokens those it served;
 *                  cache_creation_input_tokens those newly stored.
 * Errors: {"type": "error", "error": {"type": T, "message": M}} with T
 * invalid_request_error (400, 413 request_too_large), authentication_error
 * (401), not_found_error (404), rate_limit_error (429), api_error (500),
 * overloaded_error (503).
 */
#ifndef KV_SERVER_ANTHROPIC_H
#define KV_SERVER_ANTHROPIC_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "server/output.h"

/* Usage in Anthropic's terms. */
struct ksv_anth_usage {
	int64_t input_tokens;         /* prompt tokens not served by the cache */
	int64_t cache_read;           /* prompt tokens served by the cache */
	int64_t cache_creation;       /* prompt tokens newly stored */
	int64_t output_tokens;
};

/*
 * Translate a Messages body into an OpenAI chat body (a new json_t the
 * caller owns). for_count = 1: the count_tokens body (max_tokens not
 * required). On error returns KV_ERR_INVALID with the message set
 * (kv_fail) and the offending path in param.
 */
int ksv_anth_to_chat(const json_t *body, int for_count, json_t **chat, char *param, size_t param_cap);

/* The state of one response: block indexes, what is open, the blocks kept
 * for the non-streaming body. */
struct ksv_anth {
	char id[40];                  /* msg_<24 alphanumerics> */
	char model[256];
	int stream;                   /* 1: events are written, 0: only kept */
	int next_index;               /* index of the next content block */
	int open;                     /* enum: 0 none, 1 text, 2 thinking, 3 tool_use */
	json_t *blocks;               /* owned: the content blocks so far */
	struct kv_buf cur;            /* text / thinking / argument JSON of the open block */
};

void ksv_anth_init(struct ksv_anth *a, const char *model, int stream);
void ksv_anth_free(struct ksv_anth *a);

/* message_start (streaming only). */
void ksv_anth_start(struct ksv_anth *a, const struct ksv_anth_usage *u, struct kv_buf *out);
/* One output event (output.h); out may be NULL when not streaming. */
void ksv_anth_event(struct ksv_anth *a, const struct ksv_ev *e, struct kv_buf *out);
/* Close what is open, then message_delta + message_stop (streaming). */
void ksv_anth_finish(struct ksv_anth *a, const char *stop_reason, const char *stop_sequence,
		     const struct ksv_anth_usage *u, struct kv_buf *out);
/* The whole message (non-streaming), after ksv_anth_finish. malloc'd. */
char *ksv_anth_response(struct ksv_anth *a, const char *stop_reason, const char *stop_sequence,
			const struct ksv_anth_usage *u, const json_t *ext, size_t *len);

/* The OpenAI-style finish reason ("stop", "length", "tool_calls") as a
 * stop_reason; stop_hit: a stop sequence ended the output. */
const char *ksv_anth_stop_reason(const char *finish, int stop_hit);

/* Error body / stream event for an HTTP status. malloc'd / appended. */
char *ksv_anth_error(int status, const char *message, size_t *len);
void ksv_anth_sse_error(int status, const char *message, struct kv_buf *out);
void ksv_anth_ping(struct kv_buf *out);

/* {"input_tokens": n} for /v1/messages/count_tokens. malloc'd. */
char *ksv_anth_count_body(int64_t n, size_t *len);

#endif
