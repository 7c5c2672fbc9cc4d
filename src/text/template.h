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
 *
 * The interpreter is jinja_lex.c, jinja_parse.c, jinja_value.c,
 * jinja_builtins.c and jinja_eval.c (what they share: jinja_int.h); the
 * chat layer (kv_chat_*) is chat.c.
 */
#ifndef KV_TEXT_TEMPLATE_H
#define KV_TEXT_TEMPLATE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

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
 * Caps for one render; 0 in a field means the default (4M steps, 64 MiB
 * of output, 512 MiB of interpreter memory). A render that passes a cap
 * stops with KV_ERR_INVALID (KV_ERR_NOMEM for memory) naming the cap.
 * Steps count executed statements, loop iterations, macro calls and items
 * processed by filters.
 */
struct kv_tmpl_limits {
	uint64_t max_steps;
	size_t max_output;   /* bytes of rendered text (and of any one string) */
	size_t max_memory;   /* bytes the interpreter may hold during a render */
};
int kv_tmpl_render_ex(const struct kv_tmpl *t, const json_t *ctx, const struct kv_tmpl_limits *lim, char **out,
		      size_t *len);

/*
 * The chat layer: a model's template plus its special tokens.
 * kv_chat_load reads <dir>/tokenizer_config.json (chat_template as a
 * string, or a list of {name, template} where "default" is used, and
 * "tool_use" for requests with tools when present; a chat_template.jinja
 * file beside it wins over both), the special tokens (bos/eos/unk/sep/pad/
 * cls/mask, additional_special_tokens) and added_tokens_decoder (where
 * boundaries may cut). tok is borrowed and must outlive the chat; it may
 * be NULL (then renders give text only). A missing config or template is
 * KV_ERR_NOT_FOUND, a template that does not compile KV_ERR_INVALID or
 * KV_ERR_UNSUPPORTED with line and column. A loaded chat is read-only and
 * may be used from several threads at once.
 */
struct kv_chat;
int kv_chat_load(const char *model_dir, const struct kv_tok *tok, struct kv_chat **out);
int kv_chat_load_mem(const char *tokenizer_config_json, size_t len, const struct kv_tok *tok,
		     struct kv_chat **out);
void kv_chat_free(struct kv_chat *c);
/* Replace the chat's template(s) with this source (a --chat-template
 * override); `what` names it in errors. On error c is unchanged. */
int kv_chat_set_template(struct kv_chat *c, const char *src, size_t len, const char *what);
/* The tool-call syntax the template renders, enum kv_tc_format
 * (text/toolcall.h): 1 Qwen3.5-style XML (<function=...>), 2 Nemotron-H's
 * <TOOLCALL>[...] list, 0 the <tool_call> JSON (Qwen3, Granite 4.0-H). */
int kv_chat_xml_tools(const struct kv_chat *c);
/* 1 if the template writes GPT-OSS harmony messages (<|channel|>...): the
 * answers are parsed with text/harmony.h, and assistant messages sent back
 * get their reasoning_content as "thinking" and their tool-call arguments
 * as objects, as the template expects. */
int kv_chat_harmony(const struct kv_chat *c);

/*
 * An assistant message rendered exactly as the model generated it (the
 * server's own answer sent back by the client: session/echo.h). The
 * template renders a stand-in for the message (its content a placeholder,
 * no reasoning, no tool calls); the stand-in, from the message's role
 * header ("<|im_start|>assistant\n": the first line of `text`) to the end
 * of the placeholder, is replaced by `text`, and its tokens are `tokens`,
 * never tokenized again. A splice whose stand-in cannot be found (the
 * template dropped or changed it) is not applied.
 */
struct kv_chat_splice {
	size_t message;              /* index in messages (an assistant message) */
	const char *text;            /* the generation prompt as it was rendered, then the generated text */
	size_t text_len;
	const int32_t *tokens;       /* text's tokens as generated (borrowed) */
	size_t n_tokens;
};

struct kv_chat_opts {
	int add_generation_prompt;   /* 1 for a request the model answers */
	int enable_thinking;         /* -1: leave undefined, 0 false, 1 true */
	const json_t *kwargs;        /* optional object of extra template variables
	                                (the request's chat_template_kwargs); borrowed */
	int skip_boundaries;         /* 1: tokens only, no boundary search */
	int max_message_boundaries;  /* 0: every message end; N > 0: only the last N
	                                message ends are searched (plus the end of
	                                system + tools), which bounds the cost on long
	                                conversations (see kv_chat_render) */
	int keep_reasoning;          /* 1: render every user turn as the template renders
	                                the newest one, so the reasoning it shows there
	                                stays when later turns arrive (see "Reasoning
	                                history" below) */
	const struct kv_chat_splice *splices; /* n_splices (borrowed), ascending message */
	size_t n_splices;
	int request_specials;        /* 1: special-token literals inside the request's
	                                strings (content, tool results, names, tools,
	                                kwargs) become control tokens, as in Hugging
	                                Face; 0 (default): they are tokenized as the
	                                text they are, and only the template's own
	                                special tokens are control tokens */
	const char *reasoning_effort; /* NULL, or the template variable
	                                reasoning_effort (harmony: "low", "medium",
	                                "high"); chat_template_kwargs win; borrowed */
};

/*
 * A rendered chat. Boundaries are token positions where a message ends
 * (just after its "<|im_end|>\n"): boundary[0] is the end of system +
 * tools (or of the first message when there is neither), then the end of
 * every later message before the generation prompt. The tokens of
 * render(messages[:k]) are an exact prefix of `tokens` at each boundary.
 * first_is_system marks boundary[0] when it ends system + tools (the
 * anchor of docs/cache.md).
 */
struct kv_chat_render {
	char *text;            /* malloc'd rendered prompt */
	size_t text_len;
	int32_t *tokens;       /* malloc'd token ids of text */
	size_t n_tokens;
	int32_t *boundaries;   /* malloc'd, ascending token positions */
	size_t n_boundaries;
	int first_is_system;   /* boundary[0] ends system (+ tools) */
	size_t *boundary_bytes;/* malloc'd: byte offset in text of each boundary */
	uint32_t *boundary_msgs;/* malloc'd: boundary i ends render(messages[:k]),
	                           k = boundary_msgs[i] */
	int first_from_probe;  /* boundary[0] came from the probe (see below) */
	int kept;              /* keep_reasoning changed the text */
	int32_t *splice_at;    /* malloc'd, n_splices entries: the token position where
	                          each splice starts, -1 where it was not applied */
	size_t n_spliced;      /* splices applied */
};

/*
 * Preparation, exactly as the server does it (kv_chat_prepare_messages):
 *  - messages must be a non-empty array of objects;
 *  - role must be "system", "developer", "user", "assistant" or "tool"
 *    (anything else is KV_ERR_INVALID naming the message index);
 *    "developer" becomes "system";
 *  - content given as a list of parts is joined into one string with no
 *    separator; only {"type": "text", "text": "..."} parts are accepted
 *    (other part types are KV_ERR_UNSUPPORTED); a string is passed
 *    unchanged; null or absent content becomes "" (an assistant turn that
 *    only calls tools; templates use content as a string); other types are
 *    KV_ERR_INVALID;
 *  - tool_calls, when present, must be an array of {"function": {"name":
 *    string, "arguments": JSON string or object}}; arguments given as a
 *    JSON string stay a string, so the model's own bytes are re-rendered;
 *  - every other field reaches the template unchanged.
 * *out is a new array (json_decref it); its messages share values with
 * the input.
 */
int kv_chat_prepare_messages(const json_t *messages, json_t **out);

/*
 * Prepare and render an OpenAI `messages` array (+ optional `tools`, an
 * array; null or empty means none). The template sees, as with Hugging
 * Face: the tokenizer_config special tokens (bos_token, eos_token, ...,
 * additional_special_tokens), opts->kwargs, enable_thinking when >= 0,
 * messages, tools (none when absent), documents (none) and
 * add_generation_prompt. With tools and a "tool_use" named template, that
 * template is used.
 *
 * How boundaries are found: for each k the template renders messages[:k]
 * without the generation prompt, compared byte by byte against the full
 * render as it is produced (no copy; the render stops at the first
 * difference). A k whose render is a prefix of the full text, ending at a
 * "clean cut", gives a boundary. A clean cut is the end of the text or a
 * position where an added token (no lstrip/rstrip/normalized) starts and
 * no added token straddles it: the tokenizer starts a new segment there,
 * so the tokens of the prefix are exactly the first tokens of the whole.
 * Templates that re-render earlier turns differently (Qwen3 drops old
 * reasoning) thus get no boundary where the prefix property fails. The
 * end of system + tools comes from rendering messages[:h] (h = 1 if the
 * first message is a system message, else 0); if that render fails (some
 * templates insist on a user message) a probe user message is appended
 * and the last clean cut shared by both renders is used. Tokens are then
 * encoded segment by segment between cuts. Cost: one render per message
 * (the prefix renders store nothing), so O(messages^2) template work in
 * all: a few ms at 100 messages, ~0.1-0.3 s at 400 (docs/templates.md).
 * max_message_boundaries limits the search to the newest messages, which
 * are the ones a live conversation has not cached yet.
 *
 * Needs a tokenizer (kv_chat_load's tok); with tok NULL only text is
 * produced. out is filled on success (kv_chat_render_free); on error it
 * is left empty.
 */
/*
 * Special-token literals from the request (request_specials = 0). Before
 * rendering, every occurrence of a special added token's text (as the
 * tokenizer marks it: <|im_start|>, <|im_end|>, <|endoftext|>, ...) in a
 * request string is replaced by a placeholder "[kvsp<16 hex>.<k>]" (a
 * random per-process tag, so no request text can forge one); the template
 * runs on that; then the placeholders are put back and remembered as
 * spans. Each segment that holds such a span is tokenized in pieces: the
 * template's special tokens (outside the spans) as control tokens, the
 * text between them, request literals included, with allow_special = 0.
 * Text and boundaries are exactly as without the option; only the ids of
 * the request's literals differ (ordinary BPE tokens). Non-special added
 * tokens (<think>, <tool_call>, ...) are single tokens either way, as in
 * Hugging Face. A template that changes a placeholder (|upper) leaves it
 * in the text as it made it.
 */
/*
 * Reasoning history (keep_reasoning). Templates such as Qwen3's keep an
 * assistant turn's reasoning only after the last user message: when a new
 * user message arrives, every earlier turn is rendered again without it,
 * and the rendered history departs from what the model saw (and the cache
 * holds) right after the first user message. With keep_reasoning the
 * conversation is cut at its user messages q_0 < q_1 < ... and each user
 * turn j (messages q_j up to q_{j+1}) is rendered as the template renders
 * it when it is the newest turn: the text of render(messages[:q_{j+1}])
 * (no generation prompt) from where message q_j starts. The newest turn
 * and everything before q_0 come from the whole render as usual. Where
 * message q_j starts is found as for the anchor: a probe user message
 * after messages[:q_j] and the last clean cut both renders share. Each
 * turn's text depends only on the messages up to it, so it stays the same
 * in every later request: the prefix holds. The renders of earlier turns
 * are remembered by content (a small LRU per chat), so a request renders
 * about two more prefixes than without the option. A template whose
 * renders break the rule (the text before q_j differs between renders)
 * makes the whole request fall back to the template's own rendering.
 */
int kv_chat_render(const struct kv_chat *c, const json_t *messages, const json_t *tools,
		   const struct kv_chat_opts *opts, struct kv_chat_render *out);
void kv_chat_render_free(struct kv_chat_render *r);

/* The template source used without tools (tool_use = 0) or with tools
 * (the "tool_use" template when there is one): for fingerprints. Valid
 * while c lives. */
const char *kv_chat_template_source(const struct kv_chat *c, int tool_use);

#endif
