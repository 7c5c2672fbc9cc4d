/*
 * template.h - chat templates: a Jinja subset interpreter and the chat
 * renderer that reports message boundaries.
 *
 * The interpreter renders the chat_template of tokenizer_config.json the
 * way Hugging Face does (trim_blocks, lstrip_blocks, loopcontrols, tojson
 * = json.dumps(ensure_ascii=False) with ", " / ": " separators and key
 * order kept). Unsupported syntax is an error naming line and column.
 * Loop iterations, recursion depth and output size are capped.
 *
 * Values passed in are jansson values (json_t): the OpenAI request's
 * messages and tools are given to the template as they are.
 */
#ifndef KV_MODEL_TEMPLATE_H
#define KV_MODEL_TEMPLATE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "model/tokenizer.h"

struct kv_tmpl;

/* Compile template source. `what` names it in error messages. */
int kv_tmpl_compile(const char *src, size_t len, const char *what, struct kv_tmpl **out);
void kv_tmpl_free(struct kv_tmpl *t);

/*
 * Render with a context object (its keys become top-level variables,
 * e.g. messages, tools, add_generation_prompt, bos_token, eos_token,
 * enable_thinking). *out is malloc'd (free()).
 */
int kv_tmpl_render(const struct kv_tmpl *t, const json_t *ctx, char **out, size_t *len);

/*
 * The chat layer: a model's template plus its special tokens.
 * kv_chat_load reads <dir>/tokenizer_config.json (chat_template as a
 * string, or a list of {name, template} where "default" is used, or a
 * chat_template.jinja file beside it) and the bos/eos tokens.
 */
struct kv_chat;
int kv_chat_load(const char *model_dir, const struct kv_tok *tok, struct kv_chat **out);
int kv_chat_load_mem(const char *tokenizer_config_json, size_t len, const struct kv_tok *tok,
		     struct kv_chat **out);
void kv_chat_free(struct kv_chat *c);
/* 1 if the template renders Qwen3.5-style XML tool calls (<function=...>). */
int kv_chat_xml_tools(const struct kv_chat *c);

struct kv_chat_opts {
	int add_generation_prompt;   /* 1 for a request the model answers */
	int enable_thinking;         /* -1: leave undefined, 0 false, 1 true */
};

/*
 * A rendered chat. Boundaries are token positions where a message ends
 * (just after its "<|im_end|>\n"): boundary[0] is the end of system +
 * tools (or of the first message when there is neither), then the end of
 * every later message before the generation prompt. The tokens of
 * render(messages[:k]) are an exact prefix of `tokens` at each boundary.
 * is_anchor marks boundary[0] when it ends system + tools.
 */
struct kv_chat_render {
	char *text;            /* malloc'd rendered prompt */
	size_t text_len;
	int32_t *tokens;       /* malloc'd token ids of text */
	size_t n_tokens;
	int32_t *boundaries;   /* malloc'd, ascending token positions */
	size_t n_boundaries;
	int first_is_system;   /* boundary[0] ends system (+ tools) */
};

/*
 * Prepare and render an OpenAI `messages` array (+ optional `tools`).
 * Preparation, exactly as the server does it: content given as a list of
 * text parts is joined into one string (no separator); null content stays
 * null... (see template.c for the full rules). Unknown roles and malformed
 * messages are KV_ERR_INVALID naming the message index.
 */
int kv_chat_render(const struct kv_chat *c, const json_t *messages, const json_t *tools,
		   const struct kv_chat_opts *opts, struct kv_chat_render *out);
void kv_chat_render_free(struct kv_chat_render *r);

#endif
