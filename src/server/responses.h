/*
 * responses.h - the OpenAI Responses API (POST /v1/responses), as the
 * Codex CLI speaks it: request translation and response formatting.
 *
 * Like the Messages route (anthropic.h), a Responses body is translated
 * into the chat body request.h validates, so every route shares one
 * validation, render and generation path. The mapping:
 *
 *   instructions (string)       -> a leading "system" message
 *   input: string               -> one user message
 *   input: [items]
 *     {type: "message" (or no type), role: user|system|developer|assistant,
 *      content: string | [{type: input_text|output_text|text, text}]}
 *                               -> that message (parts joined with "\n");
 *                                  input_image / input_file -> 400
 *     {type: "function_call", call_id, name, arguments}
 *                               -> a tool call of an assistant message;
 *                                  consecutive calls (and the assistant
 *                                  text just before them) form one message
 *     {type: "function_call_output", call_id, output: string | parts}
 *                               -> a "tool" message
 *     {type: "custom_tool_call", call_id, name, input} and its
 *      "custom_tool_call_output" -> the same, arguments {"input": input}
 *     {type: "reasoning", summary: [{text}], content: [{text}],
 *      encrypted_content}       -> reasoning_content of the next
 *                                  assistant message (sent back verbatim
 *                                  by clients; content wins over summary,
 *                                  and with neither, this server's own
 *                                  encrypted_content "kvk1:<base64>" gives
 *                                  the text); reasoning no assistant
 *                                  message or call follows is an assistant
 *                                  message of its own (an answer that was
 *                                  reasoning alone)
 *   include: ["reasoning.encrypted_content"] -> the answer's reasoning
 *     items carry encrypted_content (store: false clients keep only it)
 *     item "id" / "status" fields are accepted and ignored; other item
 *     types are a 400 naming them.
 *   tools: [{type: "function", name, description, parameters, strict}];
 *     {type: "namespace", tools: [...]} groups are flattened; built-in
 *     tool types (web_search, local_shell, custom, file_search, mcp, ...)
 *     are left out and logged.
 *   tool_choice: "auto" | "none" | "required" | {type: "function", name}
 *   reasoning.effort: "none" | "minimal" -> thinking off, other efforts on,
 *     absent -> the template's default.
 *   max_output_tokens -> max_tokens; temperature, top_p, stream.
 *   store, include, prompt_cache_key, parallel_tool_calls, text,
 *   truncation, metadata, user, service_tier: accepted and ignored.
 *   previous_response_id: 400 - this server keeps no responses, so a
 *   client must send the whole conversation (Codex does, with store: false).
 *
 * Output: a response object {id: "resp_..", object: "response",
 * created_at, status: completed|incomplete, model, output: [items],
 * usage: {input_tokens, input_tokens_details: {cached_tokens},
 * output_tokens, output_tokens_details: {reasoning_tokens}, total_tokens}}
 * with items "reasoning", "message" (output_text parts) and
 * "function_call". Streaming: "event: TYPE\ndata: JSON\n\n" with a
 * sequence_number on each event: response.created, response.in_progress,
 * then per item response.output_item.added, its deltas
 * (response.output_text.delta, response.reasoning_text.delta,
 * response.function_call_arguments.delta), their .done events,
 * response.output_item.done; last response.completed (or
 * response.failed with an error). Errors before the stream are the OpenAI
 * error shape (openai.h).
 */
#ifndef KV_SERVER_RESPONSES_H
#define KV_SERVER_RESPONSES_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>


/* Translate a Responses body into an OpenAI chat body (new json_t owned by
 * the caller). KV_ERR_INVALID with the message set and param naming the
 * field on error. */
int ksv_resp_to_chat(const json_t *body, json_t **chat, char *param, size_t param_cap);

#endif
