/*
 * wire.h - the three APIs behind one table.
 *
 * A generation request arrives in one of three wire formats: OpenAI
 * (/v1/chat/completions, /v1/completions), Anthropic Messages
 * (/v1/messages) and OpenAI Responses (/v1/responses). Each fills one
 * struct ksv_wire (openai.c, anthropic.c, responses.c):
 *
 *   parse          the body (parsed JSON) -> a validated chat request
 *                  (request.h), translated as a jansson value, never
 *                  through JSON text
 *   start          the first bytes of a stream
 *   open / delta / close
 *                  a block of the answer: text, reasoning or a tool call
 *   step           the end of one decoded token (OpenAI: its logprobs)
 *   progress       a prefill chunk done: OpenAI's prompt_progress chunk
 *                  (return_progress), Anthropic's ping, a Responses
 *                  keep-alive comment (docs/api.md "Progress")
 *   finish         the last bytes of a stream, usage included
 *   stream_error   an error inside a stream that already started
 *   body           the whole answer, non-streaming
 *   error_body     an error answer
 *
 * What the three share lives once, here: the block machine (struct
 * ksv_answer: which block is open, the blocks kept for the whole body, the
 * ids the client will send back), the usage numbers (session/request.h
 * struct kss_usage, one source for every API), and the "kvkeep" usage
 * extension. A formatter only turns those into its own JSON.
 *
 * The machine, fed the output pipeline's events (text/output.h):
 *   content   -> a text block (opened on the first non-empty piece)
 *   reasoning -> a reasoning block
 *   tool start-> a tool block (name, a new id with the API's prefix)
 *   tool args -> its arguments, piece by piece
 *   tool end  -> the tool block closes
 * A block of another kind opening closes the open one; so does the end.
 */
#ifndef KV_SERVER_WIRE_H
#define KV_SERVER_WIRE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "server/request.h"
#include "session/request.h"
#include "text/output.h"
#include "text/tokbytes.h"

/* The API of a request: its body, answer and error shapes. */
enum ksv_wire_id { KSV_WIRE_OPENAI = 0, KSV_WIRE_ANTHROPIC, KSV_WIRE_RESPONSES };

enum ksv_blk_kind { KSV_BLK_TEXT = 1, KSV_BLK_REASONING, KSV_BLK_TOOL };

struct ksv_block {
	int kind;                  /* enum ksv_blk_kind */
	struct kv_buf text;        /* text, reasoning, or the tool call's arguments JSON */
	char *name;                /* tool: its name (owned) */
	char call_id[40];          /* tool: the id the client sends back (call_..., toolu_...) */
	char item_id[40];          /* Responses: the output item's id (msg_, rs_, fc_) */
	int tool_index;            /* tool: 0, 1, ... among the answer's tool calls */
};

/* One generated token's logprobs, kept for the whole body. */
struct ksv_lp_rec {
	int32_t id;
	float lp;
	int n_top;
	int32_t top_id[KSS_MAX_TOP_LOGPROBS];
	float top_lp[KSS_MAX_TOP_LOGPROBS];
};

struct ksv_wire;

/* Where a prefill stands (llama.cpp's prompt_progress fields). */
struct ksv_progress {
	uint32_t total;            /* prompt tokens */
	uint32_t cache;            /* of those, resumed from the cache */
	uint32_t processed;        /* done so far, the cached ones included */
	int64_t time_ms;           /* since the prompt's processing began */
	int keepalive;             /* 1: the stream has been quiet for a second: a keep-alive is due */
};

/* One answer being built. */
struct ksv_answer {
	const struct ksv_wire *w;
	int api;                   /* enum ksv_api (OpenAI chat or completions) */
	int stream;
	char id[48];               /* chatcmpl-..., msg_..., resp_... */
	int64_t created;           /* unix seconds */
	char model[256];           /* the name the answer reports */
	const struct kv_tok_bytes *tb; /* token bytes (logprobs) */
	struct ksv_block *blk;     /* the blocks so far (owned) */
	size_t n_blk, cap_blk;
	int open;                  /* 1: blk[n_blk - 1] is open */
	int n_tools;
	/* OpenAI */
	int include_usage, logprobs, role_sent;
	int return_progress;       /* prompt_progress chunks (llama.cpp's return_progress) */
	size_t text_offset;        /* completions: bytes of text sent so far */
	struct ksv_lp_rec *lps;    /* every generated token's (logprobs only) */
	size_t n_lps, cap_lps;
	int lp_pending;            /* streaming: lps[n_lps - 1] not sent yet */
	/* Responses */
	int seq;                   /* the next sequence_number */
	uint32_t reasoning_tokens; /* generated tokens that were reasoning */
	int encrypted_reasoning;   /* reasoning items carry encrypted_content */
	/* the end, set by the caller before finish / body */
	struct kss_usage usage;
	const char *finish;        /* "stop", "length", "tool_calls" */
	const char *stop_sequence; /* the stop string that ended it, or NULL */
	json_t *ext;               /* the "kvkeep" usage extension (owned), or NULL */
};

struct ksv_wire {
	const char *name;           /* "openai", "anthropic", "responses" */
	const char *answer_id_prefix; /* of the answer's id + 24 alphanumerics (NULL: OpenAI's own) */
	const char *tool_id_prefix; /* of the ids the answer gives tool calls */
	/* body: the parsed request (borrowed); for_count: count_tokens.
	 * KV_ERR_INVALID with req->err_param set. */
	int (*parse)(const json_t *body, int api, int for_count, struct ksv_req *req);
	void (*start)(struct ksv_answer *a, struct kv_buf *out);
	void (*open)(struct ksv_answer *a, const struct ksv_block *b, struct kv_buf *out);
	void (*delta)(struct ksv_answer *a, const struct ksv_block *b, const char *t, size_t n, struct kv_buf *out);
	void (*close)(struct ksv_answer *a, const struct ksv_block *b, struct kv_buf *out);
	void (*step)(struct ksv_answer *a, struct kv_buf *out);        /* may be NULL */
	void (*progress)(struct ksv_answer *a, const struct ksv_progress *p, struct kv_buf *out); /* may be NULL */
	void (*finish)(struct ksv_answer *a, struct kv_buf *out);
	void (*stream_error)(struct ksv_answer *a, int status, const char *msg, struct kv_buf *out);
	char *(*body)(struct ksv_answer *a, size_t *len);               /* malloc'd */
	char *(*error_body)(int status, const char *msg, const char *param, size_t *len); /* malloc'd */
};

/* A format's row from its functions, named PREFIX_parse, PREFIX_start,
 * ... PREFIX_body: the same names in every format, so a row is one line
 * and a missing function a compile error. */
#define KSV_WIRE_ROW(p, name_, answer_prefix, tool_prefix, step_, error_body_)                                  \
	{.name = name_, .answer_id_prefix = answer_prefix, .tool_id_prefix = tool_prefix, .parse = p##_parse,        \
	 .start = p##_start, .open = p##_open, .delta = p##_delta, .close = p##_close, .step = step_,                 \
	 .progress = p##_progress, .finish = p##_finish, .stream_error = p##_stream_error, .body = p##_body, .error_body = error_body_}

extern const struct ksv_wire ksv_wire_openai, ksv_wire_anthropic, ksv_wire_responses;
/* The table of an API (wires.c, above the three formats). */
const struct ksv_wire *ksv_wire_of(int id);

/* --- the block machine ------------------------------------------------------ */

void ksv_answer_init(struct ksv_answer *a, const struct ksv_wire *w, int api, const char *model, int stream);
void ksv_answer_free(struct ksv_answer *a);
/* One output event; out NULL when not streaming (the blocks are kept). */
void ksv_answer_event(struct ksv_answer *a, const struct kv_out_ev *e, struct kv_buf *out);
/* Close the open block, if any. */
void ksv_answer_close(struct ksv_answer *a, struct kv_buf *out);
/* A generated token's logprobs (a->logprobs). */
void ksv_answer_token(struct ksv_answer *a, const struct kss_token *t);
/* The text of every block of one kind, concatenated (malloc'd, NUL-
 * terminated; *len its length); NULL when there is none. */
char *ksv_answer_text(const struct ksv_answer *a, int kind, size_t *len);

/* --- helpers of the formatters ---------------------------------------------- */

/* "bad request" with the field's path: sets param and the message
 * (fmt has one %s for path and one for detail). KV_ERR_INVALID. */
int ksv_wire_bad(char *param, size_t cap, const char *path, const char *fmt, const char *detail);
/* 1 if j is the string s exactly (no NUL tricks). */
int ksv_wire_is(const json_t *j, const char *s);
/* A JSON string from a buffer (empty when the buffer is). New ref. */
json_t *ksv_wire_buf_string(const struct kv_buf *b);
/* Append {type: function, function: {name, description?, parameters?}}
 * to out from a tool's name, description and schema (any may be NULL
 * but the name). */
void ksv_wire_add_function(json_t *out, const char *name, const json_t *description, const json_t *schema);
/* The miss explainer (session/explain.h) as JSON: {"shared_tokens",
 * "first_diff", "message", "role", "tool", "new", "cached"}. New ref. */
json_t *ksv_explain_json(const struct kss_explain *e, int with_cached);

/* --- what the translated APIs (Messages, Responses) share ----------------------- */

/* The text of a string or a list of parts (each appended by part(), the
 * item's path given as "path[i]"), parts joined with "\n"; `what` names
 * the list in the error ("content blocks"). 0, or KV_ERR_INVALID with
 * param set. */
int ksv_wire_join_text(const json_t *c, const char *path, const char *what,
		       int (*part)(const json_t *item, const char *path, struct kv_buf *out, char *param, size_t cap),
		       struct kv_buf *out, char *param, size_t cap);
/* The sampling fields a translated body carries as they are (request.c
 * checks them: the penalties, min_p and seed are kvkeep's extensions
 * there as on chat completions), and usage in the last stream chunk. */
void ksv_wire_copy_sampling(const json_t *body, json_t *chat);
/* The start of a translation: *out NULL, param "", the body must be an
 * object; a new chat body and message list. 0 or KV_ERR_INVALID. */
int ksv_wire_translate_begin(const json_t *body, json_t **out, char *param, size_t cap, json_t **chat, json_t **msgs);
/* The end of a translation: drops msgs (the translation's own reference);
 * on success (rc 0) hands chat to *out, else drops it. Returns rc. */
int ksv_wire_translated(int rc, json_t *msgs, json_t *chat, json_t **out);
/* The translated body as a validated request (ksv_req_parse_json takes
 * chat); rc nonzero: the translation failed at `param`. */
int ksv_wire_chat_req(int rc, json_t *chat, const char *param, struct ksv_req *req);
/* The "kvkeep" usage extension in a usage object (when a->ext). */
void ksv_wire_usage_ext(const struct ksv_answer *a, json_t *usage);

#endif
