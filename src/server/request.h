/*
 * request.h - OpenAI request bodies, parsed and validated into a struct.
 *
 * Accepted (POST /v1/chat/completions), as agent clients send them:
 *   model                 string (optional; must name the served model)
 *   messages              non-empty array of
 *       {role: "system"|"developer"|"user"|"assistant"|"tool",
 *        content: string | [{type: "text", text: string}, ...] | null,
 *        name?: string,
 *        tool_calls?: [{id: string, type?: "function",
 *                       function: {name: string, arguments: string|object}}]  (assistant),
 *        tool_call_id: string (tool, required),
 *        reasoning_content?: string (assistant)}
 *     content may be null or absent only for an assistant message (it is
 *     rendered as "", as vLLM does: templates expect a string); "developer"
 *     is rendered as "system" (the chat templates know no developer role).
 *   tools                 [{type: "function", function: {name, description?, parameters?}}]
 *   tool_choice           "auto" | "none" | "required" | {type: "function", function: {name}}
 *   stream, stream_options.include_usage
 *   max_tokens, max_completion_tokens (the latter wins; >= 1)
 *   sampling (ksv_req_parse_sampling, shared by every generation route):
 *   temperature [0, 2], top_p (0, 1], top_k (-1 or 0 = off, else >= 1),
 *   min_p [0, 1], presence_penalty / frequency_penalty [-2, 2],
 *   repetition_penalty > 0 (1 = off), seed (integer); a field left out (or
 *   null) takes the server's default (ksv_sampling_resolve)
 *   stop (string or up to 4 strings)
 *   logprobs (bool), top_logprobs (0-20, needs logprobs: true)
 *   n (must be 1), chat_template_kwargs.enable_thinking (bool),
 *   ignore_eos (bool, vLLM's extension: generate max_tokens tokens even
 *   past end-of-sequence tokens; benchmarks and tests use it)
 *   speculative (bool, kvkeep's: false decodes this request without
 *   speculative decoding; the output is the same, docs/api.md)
 *   return_progress (bool, llama.cpp's extension: a streamed answer sends
 *   prompt_progress chunks while the prompt is prefilled)
 *   logit_bias (only empty)
 *   structured output (docs/api.md "Structured output"), one of:
 *     response_format     {type: "text"} | {type: "json_object", schema?} |
 *                         {type: "json_schema", json_schema: {name?, schema, strict?}}
 *     json_schema         a JSON Schema (llama.cpp's field)
 *     grammar             GBNF text (llama.cpp's field)
 *   parallel_tool_calls (bool, default true); a tool's function.strict
 * POST /v1/completions takes prompt (string, [string], [int, ...] or
 * [[int, ...]]) instead of messages/tools, logprobs as an integer 0-20 and
 * echo (only false), suffix (only empty), best_of (only 1).
 * Every other field is ignored. A field with a wrong type or value is
 * KV_ERR_INVALID with a message naming it ("messages[2].content: ...") and
 * the OpenAI `param` path in req->err_param.
 */
#ifndef KV_SERVER_REQUEST_H
#define KV_SERVER_REQUEST_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/sample.h"
#include "model/genconfig.h"

enum ksv_api { KSV_API_CHAT = 0, KSV_API_COMPLETION = 1 };
enum ksv_tool_choice { KSV_TC_AUTO = 0, KSV_TC_NONE, KSV_TC_REQUIRED, KSV_TC_NAMED };
/* The answer's format (structured output). */
enum ksv_fmt { KSV_FMT_TEXT = 0, KSV_FMT_JSON_OBJECT, KSV_FMT_JSON_SCHEMA, KSV_FMT_GRAMMAR };

#define KSV_MAX_STOP 4
#define KSV_MAX_TOP_LOGPROBS 20

/* The sampling fields of one request; `set` has bit (1 << KV_GC_*) for
 * every field the request gave, KSV_SP_SEED for the seed. */
#define KSV_SP_SEED (1u << KV_GC_N)
struct ksv_sampling {
	unsigned set;
	double v[KV_GC_N];         /* indexed by enum kv_gencfg_field (top_k as a whole number) */
	uint64_t seed;
};

struct ksv_req {
	int api;                   /* enum ksv_api */
	json_t *body;              /* owned: the parsed body */
	const char *model;         /* borrowed from body; NULL when absent */
	json_t *messages;          /* chat: owned copy as sent (validated); NULL for completions */
	json_t *tools;             /* owned reference or NULL (no tools / empty list) */
	int tool_choice;           /* enum ksv_tool_choice */
	const char *tool_name;     /* KSV_TC_NAMED: borrowed */
	int parallel_tool_calls;   /* several calls may follow each other (default 1) */
	int tools_strict;          /* some function has "strict": true */
	/* structured output */
	int fmt;                   /* enum ksv_fmt */
	const json_t *fmt_schema;  /* JSON_SCHEMA (or JSON_OBJECT with a schema): borrowed from body */
	int fmt_strict;            /* json_schema.strict */
	const char *grammar;       /* GRAMMAR: GBNF text, borrowed */
	size_t grammar_len;
	const char *fmt_param;     /* the field that asked for it, for errors */
	/* completions */
	const char *prompt;        /* borrowed, NULL when given as ids */
	size_t prompt_len;
	int32_t *prompt_ids;       /* malloc'd when given as ids */
	size_t n_prompt_ids;
	/* generation */
	int stream;
	int include_usage;
	int64_t max_tokens;        /* -1: not given */
	struct ksv_sampling sp;    /* temperature, top_p, ..., seed as given */
	const char *stop[KSV_MAX_STOP]; /* borrowed */
	size_t n_stop;
	int logprobs;              /* 1: report the chosen tokens' logprobs */
	int top_logprobs;          /* 0..20 alternatives per token */
	int enable_thinking;       /* -1 unset, 0, 1 */
	int ignore_eos;            /* vLLM extension: keep generating past end-of-sequence tokens */
	int speculative;           /* kvkeep extension, default true: false decodes without drafts
				    * (speculative decoding; the output is the same either way) */
	int return_progress;       /* llama.cpp extension: prompt_progress chunks while prefilling (streams) */
	int encrypted_reasoning;   /* Responses: include has "reasoning.encrypted_content" */
	char err_param[96];        /* on error: the offending field's path */
};

/*
 * Parse and validate a body. On error returns KV_ERR_INVALID (message set
 * with kv_fail; req->err_param names the field) and req is left freeable.
 * max_depth bounds JSON nesting (deeper bodies are refused before jansson
 * sees them).
 */
int ksv_req_parse(int api, const char *body, size_t len, int max_depth, struct ksv_req *req);
/* The same from a parsed body, whose reference it takes (req->body):
 * the Messages and Responses translations hand their chat body here. */
int ksv_req_parse_json(int api, json_t *body, struct ksv_req *req);
void ksv_req_free(struct ksv_req *req);

/*
 * The sampling fields of a request body object `o` (any route: chat,
 * completions, and routes with other body shapes that use the same field
 * names) into *sp. Errors as ksv_req_parse (req->err_param names the field).
 */
int ksv_req_parse_sampling(struct ksv_req *req, const json_t *o, struct ksv_sampling *sp);
/*
 * The sampler's parameters: each field from the request when it gave one,
 * else from dflt (every field set: the server's resolved defaults, see
 * kv_gencfg_overlay). No seed: `fallback_seed`.
 */
void ksv_sampling_resolve(const struct ksv_sampling *sp, const struct kv_gencfg *dflt, uint64_t fallback_seed,
			  struct ke_sample_params *out);

/* Parse only the messages/tools of a chat body (for /v1/cache/probe, which
 * takes a chat body without generation fields). Same rules. */
int ksv_req_parse_probe(const char *body, size_t len, int max_depth, struct ksv_req *req);

#endif
