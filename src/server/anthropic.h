/*
 * anthropic.h - the Anthropic Messages API (POST /v1/messages), as Claude
 * Code speaks it: request translation and the wire format
 * (ksv_wire_anthropic, wire.h).
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
 *   usage          cache_read_input_tokens counts the prompt tokens the
 *                  cache served; cache_creation_input_tokens those this
 *                  request prefilled and the cache keeps; input_tokens the
 *                  rest: the three add up to the prompt, as in Anthropic's
 *                  API (message_start already carries the final split:
 *                  the lookup is done when it is sent).
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

/*
 * Translate a Messages body into an OpenAI chat body (a new json_t the
 * caller owns). for_count = 1: the count_tokens body (max_tokens not
 * required). On error returns KV_ERR_INVALID with the message set
 * (kv_fail) and the offending path in param.
 */
int ksv_anth_to_chat(const json_t *body, int for_count, json_t **chat, char *param, size_t param_cap);

/* The OpenAI-style finish reason ("stop", "length", "tool_calls") as a
 * stop_reason; stop_hit: a stop sequence ended the output. */
const char *ksv_anth_stop_reason(const char *finish, int stop_hit);

/* Error body for an HTTP status (malloc'd), and the ping event. */
char *ksv_anth_error(int status, const char *message, size_t *len);
void ksv_anth_ping(struct kv_buf *out);

/* {"input_tokens": n} for /v1/messages/count_tokens. malloc'd. */
char *ksv_anth_count_body(int64_t n, size_t *len);

#endif
