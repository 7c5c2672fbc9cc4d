/*
 * toolcall.h - tool calls in generated text, turned into OpenAI tool_calls.
 *
 * Three wire forms, two wrapped in <tool_call> ... </tool_call>:
 *
 *   Qwen3 (JSON)        <tool_call>
 *                       {"name": "read_file", "arguments": {"path": "a.c"}}
 *                       </tool_call>
 *   Qwen3.5 (XML)       <tool_call>
 *                       <function=read_file>
 *                       <parameter=path>
 *                       a.c
 *                       </parameter>
 *                       </function>
 *                       </tool_call>
 *
 *   Nemotron-H (list)   <TOOLCALL>[{"name": "read_file", "arguments": {"path": "a.c"}},
 *                                  {"name": "grep", "arguments": {"q": "x"}}]</TOOLCALL>
 *                       (one block, a JSON array of calls, each element as
 *                       the JSON form's object; Granite 4.0-H uses the JSON
 *                       form above)
 *
 * In the XML form (and only there) a bare <function=...>...</function>
 * without the wrapper is accepted too, as models sometimes drop it.
 *
 * JSON form: the body must be one JSON object with a "name" string and an
 * "arguments" object (or "parameters"; a JSON string holding an object is
 * accepted; absent means {}). The arguments string handed out is the
 * model's own bytes of that value, so a chat template that re-renders a
 * string argument reproduces the generated text exactly.
 * XML form: each parameter value is the text between <parameter=NAME> and
 * </parameter>, minus one leading and one trailing newline, coerced with
 * the tool's JSON schema (parameters.properties[NAME].type): integer,
 * number, boolean and null from their literal text, object and array from
 * JSON text, anything else (string, unknown tool or parameter, or text that
 * does not parse as the type) stays a string. The arguments are then one
 * JSON object, json.dumps style (", " and ": ", non-ASCII kept).
 *
 * Streaming: kv_tc_feed takes text as it is generated (any chunking, down
 * to single bytes) and reports events through a callback:
 *   KV_TC_CONTENT      text outside tool calls (a suffix that may be the
 *                      start of "<tool_call>" is held back until it is
 *                      known not to be);
 *   KV_TC_CALL_START   a tool call with its name,
 *   KV_TC_ARGS_DELTA   its arguments JSON,
 *   KV_TC_CALL_END     the end of the call;
 * the three call events come together when "</tool_call>" completes the
 * call and it parses. A call that does not parse (malformed JSON, missing
 * name, nesting beyond KV_TC_MAX_DEPTH, a body beyond max_call_bytes, no
 * closing tag at the end) comes back as KV_TC_CONTENT with its exact
 * bytes: nothing is ever dropped, except whitespace between and after
 * tool calls. Unknown tool names are returned like known ones.
 */
#ifndef KV_TEXT_TOOLCALL_H
#define KV_TEXT_TOOLCALL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define KV_TC_MAX_DEPTH 64                    /* JSON nesting in arguments */
#define KV_TC_DEFAULT_MAX_CALL (4u << 20)     /* bytes of one call body */

enum kv_tc_format {
	KV_TC_JSON = 0, /* Qwen3: <tool_call>{"name": ..., "arguments": ...}</tool_call> */
	KV_TC_XML = 1,  /* Qwen3.5: <function=NAME><parameter=ARG>VALUE</parameter> */
	KV_TC_LIST = 2, /* Nemotron-H: <TOOLCALL>[{"name": ..., "arguments": ...}, ...]</TOOLCALL> */
};

enum kv_tc_kind { KV_TC_CONTENT = 0, KV_TC_CALL_START, KV_TC_ARGS_DELTA, KV_TC_CALL_END };

struct kv_tc_event {
	int kind;          /* enum kv_tc_kind */
	int index;         /* tool call number in this message, from 0 */
	const char *text;  /* CONTENT: the text; CALL_START: the function name;
	                      ARGS_DELTA: arguments JSON; CALL_END: NULL.
	                      Valid only during the callback. */
	size_t len;
};

/* Return 0 to continue; anything else stops and is returned by feed. */
typedef int (*kv_tc_emit_fn)(void *ud, const struct kv_tc_event *ev);

struct kv_tc_params {
	int format;               /* enum kv_tc_format */
	const json_t *tools;      /* OpenAI tools array for XML coercion, or NULL;
	                             borrowed, must outlive the parser */
	size_t max_call_bytes;    /* 0: KV_TC_DEFAULT_MAX_CALL */
};

struct kv_tc_parser;

int kv_tc_parser_create(const struct kv_tc_params *p, struct kv_tc_parser **out);
void kv_tc_parser_free(struct kv_tc_parser *p);
/* Feed generated text (any split). Events go to fn. */
int kv_tc_feed(struct kv_tc_parser *p, const char *text, size_t len, kv_tc_emit_fn fn, void *ud);
/* End of generation: flushes held-back text, and tries to parse a call
 * that was never closed (else returns it as content). */
int kv_tc_finish(struct kv_tc_parser *p, kv_tc_emit_fn fn, void *ud);
/* Number of tool calls reported so far. */
int kv_tc_count(const struct kv_tc_parser *p);

/*
 * One shot: the whole generated text to OpenAI fields. *content is the
 * malloc'd text outside tool calls (NUL-terminated, *content_len bytes);
 * *tool_calls a new JSON array (json_decref) of
 *   {"id": "<id_prefix><n>", "type": "function",
 *    "function": {"name": ..., "arguments": "<JSON text>"}}
 * (empty when there are none). id_prefix NULL means "call_".
 */
int kv_tc_parse(const char *text, size_t len, const struct kv_tc_params *p, const char *id_prefix, char **content,
		size_t *content_len, json_t **tool_calls);

#endif
