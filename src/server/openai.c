/*
 * openai.c - see openai.h: the OpenAI chat and completions formats.
 *
 * Objects are built with jansson (insertion order is kept, so the keys
 * come out in the documented order) and dumped compact. Reals print with
 * 17 significant digits, so a float logprob survives the trip exactly.
 */
#include "server/openai.h"
#include "server/wire.h"
#include "base/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- the request ---------------------------------------------------------------- */

static int oai_parse(const json_t *body, int api, int for_count, struct ksv_req *req)
{
	(void)for_count;
	return ksv_req_parse_json(api, json_incref((json_t *)body), req);
}

/* --- pieces ----------------------------------------------------------------------- */

static json_t *bytes_array(const char *p, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(a, json_integer((unsigned char)p[i]));
	return a;
}

static json_t *tok_text(const struct ksv_answer *a, int32_t id, json_t **bytes)
{
	size_t n;
	const char *p = kv_tok_bytes_get(a->tb, id, &n);
	if (bytes)
		*bytes = bytes_array(p, n);
	return ksv_json_text(p, n);
}

static json_t *chat_lp_entry(const struct ksv_answer *a, const struct ksv_lp_rec *l)
{
	json_t *e = json_object(), *b, *top = json_array();
	json_object_set_new(e, "token", tok_text(a, l->id, &b));
	json_object_set_new(e, "logprob", json_real((double)l->lp));
	json_object_set_new(e, "bytes", b);
	for (int i = 0; i < l->n_top; i++) {
		json_t *t = json_object(), *tb;
		json_object_set_new(t, "token", tok_text(a, l->top_id[i], &tb));
		json_object_set_new(t, "logprob", json_real((double)l->top_lp[i]));
		json_object_set_new(t, "bytes", tb);
		json_array_append_new(top, t);
	}
	json_object_set_new(e, "top_logprobs", top);
	return e;
}

/* The logprobs object of a choice for records lps[0, n). */
static json_t *lp_object(struct ksv_answer *a, const struct ksv_lp_rec *lps, size_t n)
{
	if (!a->logprobs)
		return json_null();
	if (a->api == KSV_API_CHAT) {
		json_t *c = json_array(), *obj = json_object();
		for (size_t i = 0; i < n; i++)
			json_array_append_new(c, chat_lp_entry(a, &lps[i]));
		json_object_set_new(obj, "content", c);
		return obj;
	}
	json_t *toks = json_array(), *tlp = json_array(), *top = json_array(), *off = json_array();
	for (size_t i = 0; i < n; i++) {
		size_t len;
		kv_tok_bytes_get(a->tb, lps[i].id, &len);
		json_array_append_new(toks, tok_text(a, lps[i].id, NULL));
		json_array_append_new(tlp, json_real((double)lps[i].lp));
		json_t *m = json_object();
		for (int k = 0; k < lps[i].n_top; k++) {
			json_t *key = tok_text(a, lps[i].top_id[k], NULL);
			if (!json_object_get(m, json_string_value(key)))
				json_object_set_new(m, json_string_value(key), json_real((double)lps[i].top_lp[k]));
			json_decref(key);
		}
		json_array_append_new(top, m);
		json_array_append_new(off, json_integer((json_int_t)a->text_offset));
		a->text_offset += len;
	}
	json_t *obj = json_object();
	json_object_set_new(obj, "tokens", toks);
	json_object_set_new(obj, "token_logprobs", tlp);
	json_object_set_new(obj, "top_logprobs", top);
	json_object_set_new(obj, "text_offset", off);
	return obj;
}

static json_t *usage_json(const struct ksv_answer *a)
{
	const struct kss_usage *u = &a->usage;
	json_t *j = json_object(), *d = json_object();
	json_object_set_new(j, "prompt_tokens", json_integer(u->prompt_tokens));
	json_object_set_new(j, "completion_tokens", json_integer(u->completion_tokens));
	json_object_set_new(j, "total_tokens", json_integer((json_int_t)u->prompt_tokens + u->completion_tokens));
	json_object_set_new(d, "cached_tokens", json_integer(u->cached_tokens));
	json_object_set_new(j, "prompt_tokens_details", d);
	ksv_wire_usage_ext(a, j);
	return j;
}

static json_t *chunk_base(const struct ksv_answer *a)
{
	json_t *c = json_object();
	json_object_set_new(c, "id", json_string(a->id));
	json_object_set_new(c, "object", json_string(a->api == KSV_API_CHAT ? "chat.completion.chunk" : "text_completion"));
	json_object_set_new(c, "created", json_integer(a->created));
	json_object_set_new(c, "model", json_string(a->model));
	json_object_set_new(c, "system_fingerprint", json_string("kvkeep-" KVKEEP_VERSION));
	return c;
}

/* A chunk with one choice; takes ownership of delta (chat) or text (completions). */
static void emit_choice(struct ksv_answer *a, json_t *delta_or_text, json_t *logprobs, const char *finish,
			struct kv_buf *out)
{
	json_t *c = chunk_base(a), *choices = json_array(), *ch = json_object();
	json_object_set_new(ch, "index", json_integer(0));
	json_object_set_new(ch, a->api == KSV_API_CHAT ? "delta" : "text", delta_or_text);
	json_object_set_new(ch, "logprobs", logprobs ? logprobs : json_null());
	json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
	json_array_append_new(choices, ch);
	json_object_set_new(c, "choices", choices);
	if (a->include_usage)
		json_object_set_new(c, "usage", json_null());
	ksv_sse_event(out, NULL, c);
}

static void role_chunk(struct ksv_answer *a, struct kv_buf *out)
{
	if (a->role_sent)
		return;
	a->role_sent = 1;
	if (a->api != KSV_API_CHAT)
		return;
	json_t *d = json_object();
	json_object_set_new(d, "role", json_string("assistant"));
	json_object_set_new(d, "content", json_string(""));
	emit_choice(a, d, NULL, NULL, out);
}

/* The pending token's logprobs, for the delta about to be sent (NULL: none). */
static json_t *take_lp(struct ksv_answer *a)
{
	if (!a->logprobs || !a->lp_pending || !a->n_lps)
		return NULL;
	a->lp_pending = 0;
	return lp_object(a, &a->lps[a->n_lps - 1], 1);
}

/* A content or reasoning delta (text may be empty: a logprobs carrier). */
static void text_delta(struct ksv_answer *a, int reasoning, const char *t, size_t n, struct kv_buf *out)
{
	role_chunk(a, out);
	json_t *lp = take_lp(a);
	if (a->api != KSV_API_CHAT) {
		emit_choice(a, ksv_json_text(t, n), lp, NULL, out);
		return;
	}
	json_t *d = json_object();
	json_object_set_new(d, reasoning ? "reasoning_content" : "content", ksv_json_text(t, n));
	emit_choice(a, d, lp, NULL, out);
}

/* {"tool_calls": [call]}; call starts with its "index" */
static void tool_delta(struct ksv_answer *a, json_t *call, struct kv_buf *out)
{
	role_chunk(a, out);
	json_t *d = json_pack("{s:[o]}", "tool_calls", call);
	emit_choice(a, d, NULL, NULL, out);
}

/* --- the stream ------------------------------------------------------------------- */

static void oai_start(struct ksv_answer *a, struct kv_buf *out)
{
	role_chunk(a, out);
}

static void oai_open(struct ksv_answer *a, const struct ksv_block *b, struct kv_buf *out)
{
	if (!out || b->kind != KSV_BLK_TOOL)
		return;
	tool_delta(a,
		   json_pack("{s:i, s:s, s:s, s:{s:o, s:s}}", "index", b->tool_index, "id", b->call_id, "type", "function",
			     "function", "name", ksv_json_text(b->name, strlen(b->name)), "arguments", ""),
		   out);
}

static void oai_delta(struct ksv_answer *a, const struct ksv_block *b, const char *t, size_t n, struct kv_buf *out)
{
	if (!out)
		return;
	if (b->kind == KSV_BLK_TOOL)
		tool_delta(a, json_pack("{s:i, s:{s:o}}", "index", b->tool_index, "function", "arguments", ksv_json_text(t, n)),
			   out);
	else
		text_delta(a, b->kind == KSV_BLK_REASONING, t, n, out);
}

static void oai_close(struct ksv_answer *a, const struct ksv_block *b, struct kv_buf *out)
{
	(void)a, (void)b, (void)out;
}

/* The end of a step: logprobs of a token whose text was held back. */
static void oai_step(struct ksv_answer *a, struct kv_buf *out)
{
	if (out && a->lp_pending && a->logprobs)
		text_delta(a, 0, "", 0, out);
}

/* llama.cpp's progress chunk (return_progress): an empty assistant delta
 * (completions: empty text) with prompt_progress {total, cache,
 * processed, time_ms}; processed / total is the share done. */
static void oai_progress(struct ksv_answer *a, const struct ksv_progress *p, struct kv_buf *out)
{
	if (!a->return_progress || !out)
		return;
	role_chunk(a, out);
	json_t *c = chunk_base(a), *choices = json_array(), *ch = json_object();
	json_object_set_new(ch, "index", json_integer(0));
	if (a->api == KSV_API_CHAT)
		json_object_set_new(ch, "delta", json_pack("{s:s, s:n}", "role", "assistant", "content"));
	else
		json_object_set_new(ch, "text", json_string(""));
	json_object_set_new(ch, "logprobs", json_null());
	json_object_set_new(ch, "finish_reason", json_null());
	json_array_append_new(choices, ch);
	json_object_set_new(c, "choices", choices);
	if (a->include_usage)
		json_object_set_new(c, "usage", json_null());
	json_object_set_new(c, "prompt_progress",
			    json_pack("{s:I, s:I, s:I, s:I}", "total", (json_int_t)p->total, "cache", (json_int_t)p->cache,
				      "processed", (json_int_t)p->processed, "time_ms", (json_int_t)p->time_ms));
	ksv_sse_event(out, NULL, c);
}

static void usage_chunk(struct ksv_answer *a, struct kv_buf *out)
{
	if (!a->include_usage)
		return;
	json_t *c = chunk_base(a);
	json_object_set_new(c, "choices", json_array());
	json_object_set_new(c, "usage", usage_json(a));
	ksv_sse_event(out, NULL, c);
}

static void oai_finish(struct ksv_answer *a, struct kv_buf *out)
{
	role_chunk(a, out);
	emit_choice(a, a->api == KSV_API_CHAT ? json_object() : json_string(""), NULL, a->finish, out);
	usage_chunk(a, out);
	kv_buf_adds(out, "data: [DONE]\n\n");
}

static void error_fields(int status, const char **type, const char **code)
{
	switch (status) {
	case 400: *type = "invalid_request_error"; *code = "invalid_request"; break;
	case 401: *type = "invalid_request_error"; *code = "invalid_api_key"; break;
	case 403: *type = "invalid_request_error"; *code = "forbidden"; break;
	case 404: *type = "invalid_request_error"; *code = "not_found"; break;
	case 405: *type = "invalid_request_error"; *code = "method_not_allowed"; break;
	case 413: *type = "invalid_request_error"; *code = "request_too_large"; break;
	case 415: *type = "invalid_request_error"; *code = "unsupported_media_type"; break;
	case 429:
	case 503:
		*type = "overloaded_error";
		*code = status == 429 ? "queue_full" : "overloaded";
		break;
	default: *type = "server_error"; *code = "internal_error"; break;
	}
}

static json_t *error_json_code(int status, const char *message, const char *param, const char *code_override)
{
	const char *type, *code;
	error_fields(status, &type, &code);
	if (code_override)
		code = code_override;
	json_t *e = json_object(), *w = json_object();
	json_object_set_new(e, "message", ksv_json_text(message, strlen(message)));
	json_object_set_new(e, "type", json_string(type));
	json_object_set_new(e, "param", param && *param ? json_string(param) : json_null());
	json_object_set_new(e, "code", json_string(code));
	json_object_set_new(w, "error", e);
	return w;
}

static json_t *error_json(int status, const char *message, const char *param)
{
	return error_json_code(status, message, param, NULL);
}

char *ksv_oai_error(int status, const char *message, const char *param, size_t *len)
{
	return ksv_json_body(error_json(status, message ? message : "", param), len);
}

char *ksv_oai_error_code(int status, const char *code, const char *message, const char *param, size_t *len)
{
	return ksv_json_body(error_json_code(status, message ? message : "", param, code), len);
}

/* An error inside a stream that started: the error chunk, the usage so
 * far (with include_usage), [DONE]. */
static void oai_stream_error(struct ksv_answer *a, int status, const char *msg, struct kv_buf *out)
{
	ksv_sse_event(out, NULL, error_json(status, msg ? msg : "", NULL));
	usage_chunk(a, out);
	kv_buf_adds(out, "data: [DONE]\n\n");
}

/* --- the whole answer ------------------------------------------------------------- */

static json_t *message_json(struct ksv_answer *a)
{
	size_t cl = 0, rl = 0;
	char *content = ksv_answer_text(a, KSV_BLK_TEXT, &cl);
	char *reasoning = ksv_answer_text(a, KSV_BLK_REASONING, &rl);
	json_t *m = json_object();
	json_object_set_new(m, "role", json_string("assistant"));
	/* null only for tool calls alone (OpenAI's shape) */
	json_object_set_new(m, "content", content || !a->n_tools ? ksv_json_text(content, cl) : json_null());
	if (reasoning && rl)
		json_object_set_new(m, "reasoning_content", ksv_json_text(reasoning, rl));
	if (a->n_tools) {
		json_t *arr = json_array();
		for (size_t i = 0; i < a->n_blk; i++) {
			const struct ksv_block *b = &a->blk[i];
			if (b->kind != KSV_BLK_TOOL)
				continue;
			json_t *fn = json_object(), *tc = json_object();
			json_object_set_new(tc, "id", json_string(b->call_id));
			json_object_set_new(tc, "type", json_string("function"));
			json_object_set_new(fn, "name", ksv_json_text(b->name, strlen(b->name)));
			json_object_set_new(fn, "arguments",
					    b->text.len ? ksv_json_text(b->text.p, b->text.len) : json_string("{}"));
			json_object_set_new(tc, "function", fn);
			json_array_append_new(arr, tc);
		}
		json_object_set_new(m, "tool_calls", arr);
	}
	free(content);
	free(reasoning);
	return m;
}

static char *oai_body(struct ksv_answer *a, size_t *len)
{
	ksv_answer_close(a, NULL);
	json_t *c = json_object(), *choices = json_array(), *ch = json_object();
	json_object_set_new(c, "id", json_string(a->id));
	json_object_set_new(c, "object", json_string(a->api == KSV_API_CHAT ? "chat.completion" : "text_completion"));
	json_object_set_new(c, "created", json_integer(a->created));
	json_object_set_new(c, "model", json_string(a->model));
	json_object_set_new(c, "system_fingerprint", json_string("kvkeep-" KVKEEP_VERSION));
	json_object_set_new(ch, "index", json_integer(0));
	if (a->api == KSV_API_CHAT) {
		json_object_set_new(ch, "message", message_json(a));
	} else {
		size_t tl = 0;
		char *text = ksv_answer_text(a, KSV_BLK_TEXT, &tl);
		json_object_set_new(ch, "text", ksv_json_text(text, tl));
		free(text);
	}
	json_object_set_new(ch, "logprobs", lp_object(a, a->lps, a->n_lps));
	json_object_set_new(ch, "finish_reason", json_string(a->finish ? a->finish : "stop"));
	json_array_append_new(choices, ch);
	json_object_set_new(c, "choices", choices);
	json_object_set_new(c, "usage", usage_json(a));
	return ksv_json_body(c, len);
}

const struct ksv_wire ksv_wire_openai = KSV_WIRE_ROW(oai, "openai", NULL, "call_", oai_step, ksv_oai_error);
