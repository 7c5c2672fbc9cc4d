/*
 * responses.c - see responses.h.
 */
#include "server/responses.h"
#include "server/openai.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OPEN_NONE = 0, OPEN_MSG, OPEN_REASONING, OPEN_CALL };

/* --- request translation --------------------------------------------------- */

static int bad(char *param, size_t cap, const char *path, const char *fmt, const char *detail)
{
	snprintf(param, cap, "%s", path);
	return kv_fail(KV_ERR_INVALID, fmt, path, detail ? detail : "");
}

static int is_str(const json_t *j, const char *s)
{
	size_t n = strlen(s);
	return json_is_string(j) && json_string_length(j) == n && !memcmp(json_string_value(j), s, n);
}

/* Text of a string or a list of text parts (input_text, output_text,
 * text, summary_text, reasoning_text), joined with "\n". */
static int parts_text(const json_t *c, const char *path, struct kv_buf *out, char *param, size_t cap)
{
	char p[160];
	if (json_is_string(c)) {
		kv_buf_add(out, json_string_value(c), json_string_length(c));
		return KV_OK;
	}
	if (!json_is_array(c))
		return bad(param, cap, path, "%s: must be a string or a list of content parts%s", NULL);
	size_t i;
	const json_t *part;
	json_array_foreach(c, i, part) {
		snprintf(p, sizeof p, "%s[%zu]", path, i);
		const char *type = json_string_value(json_object_get(part, "type"));
		if (!json_is_object(part) || !type)
			return bad(param, cap, p, "%s: a content part must be an object with a \"type\"%s", NULL);
		if (!strcmp(type, "input_image") || !strcmp(type, "input_file") || !strcmp(type, "input_audio"))
			return bad(param, cap, p, "%s: %s parts are not supported: this server runs text-only models", type);
		if (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text") &&
		    strcmp(type, "summary_text") && strcmp(type, "reasoning_text") && strcmp(type, "refusal"))
			return bad(param, cap, p, "%s: unsupported content part type \"%s\"", type);
		const json_t *t = json_object_get(part, !strcmp(type, "refusal") ? "refusal" : "text");
		if (!json_is_string(t))
			return bad(param, cap, p, "%s.text: must be a string%s", NULL);
		if (i)
			kv_buf_adds(out, "\n");
		kv_buf_add(out, json_string_value(t), json_string_length(t));
	}
	return KV_OK;
}

static json_t *buf_string(struct kv_buf *b)
{
	return json_stringn(b->p ? b->p : "", b->len);
}

/* The assistant message the next function_call joins: the last message
 * if it is an assistant message, else a new empty one. */
static json_t *assistant_tail(json_t *msgs, struct kv_buf *pending_reasoning)
{
	json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
	if (!last || !is_str(json_object_get(last, "role"), "assistant")) {
		last = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
		json_array_append_new(msgs, last);
	}
	if (pending_reasoning->len) {
		json_object_set_new(last, "reasoning_content", buf_string(pending_reasoning));
		kv_buf_reset(pending_reasoning);
	}
	return last;
}

static void add_call(json_t *asst, const char *call_id, const char *name, json_t *args)
{
	json_t *calls = json_object_get(asst, "tool_calls");
	if (!calls) {
		calls = json_array();
		json_object_set_new(asst, "tool_calls", calls);
	}
	json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", call_id, "type", "function",
					       "function", "name", name, "arguments", args));
}

static int translate_input(const json_t *input, json_t *msgs, char *param, size_t cap)
{
	if (json_is_string(input)) {
		json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", input));
		return KV_OK;
	}
	if (!json_is_array(input) || !json_array_size(input))
		return bad(param, cap, "input", "%s: must be a string or a non-empty list of items%s", NULL);
	struct kv_buf reasoning = KV_BUF_INIT;
	int rc = KV_OK;
	char p[64], fp[96];
	size_t i;
	const json_t *it;
	json_array_foreach(input, i, it) {
		snprintf(p, sizeof p, "input[%zu]", i);
		if (!json_is_object(it)) {
			rc = bad(param, cap, p, "%s: must be an object%s", NULL);
			break;
		}
		const json_t *type = json_object_get(it, "type");
		if (type && !json_is_string(type)) {
			rc = bad(param, cap, p, "%s.type: must be a string%s", NULL);
			break;
		}
		if (!type || is_str(type, "message")) {
			const json_t *role = json_object_get(it, "role");
			const char *r = NULL;
			if (is_str(role, "user"))
				r = "user";
			else if (is_str(role, "assistant"))
				r = "assistant";
			else if (is_str(role, "system") || is_str(role, "developer"))
				r = "system";
			if (!r) {
				snprintf(fp, sizeof fp, "%s.role", p);
				rc = bad(param, cap, fp, "%s: must be user, assistant, system or developer%s", NULL);
				break;
			}
			struct kv_buf t = KV_BUF_INIT;
			snprintf(fp, sizeof fp, "%s.content", p);
			if ((rc = parts_text(json_object_get(it, "content"), fp, &t, param, cap))) {
				kv_buf_free(&t);
				break;
			}
			json_t *m = json_pack("{s:s, s:o}", "role", r, "content", buf_string(&t));
			kv_buf_free(&t);
			if (!strcmp(r, "assistant") && reasoning.len) {
				json_object_set_new(m, "reasoning_content", buf_string(&reasoning));
				kv_buf_reset(&reasoning);
			}
			json_array_append_new(msgs, m);
		} else if (is_str(type, "function_call") || is_str(type, "custom_tool_call")) {
			int custom = is_str(type, "custom_tool_call");
			const char *call_id = json_string_value(json_object_get(it, "call_id"));
			const char *name = json_string_value(json_object_get(it, "name"));
			const json_t *a = json_object_get(it, custom ? "input" : "arguments");
			if (!call_id || !name || (a && !json_is_string(a))) {
				rc = bad(param, cap, p, "%s: needs string \"call_id\", \"name\" and \"arguments\"%s", NULL);
				break;
			}
			json_t *args;
			if (custom)
				args = json_pack("{s:s}", "input", a ? json_string_value(a) : "");
			else
				args = json_string(a ? json_string_value(a) : "{}");
			add_call(assistant_tail(msgs, &reasoning), call_id, name, args);
		} else if (is_str(type, "function_call_output") || is_str(type, "custom_tool_call_output")) {
			const char *call_id = json_string_value(json_object_get(it, "call_id"));
			if (!call_id) {
				snprintf(fp, sizeof fp, "%s.call_id", p);
				rc = bad(param, cap, fp, "%s: required string%s", NULL);
				break;
			}
			struct kv_buf t = KV_BUF_INIT;
			snprintf(fp, sizeof fp, "%s.output", p);
			const json_t *o = json_object_get(it, "output");
			if (o && (rc = parts_text(o, fp, &t, param, cap))) {
				kv_buf_free(&t);
				break;
			}
			json_array_append_new(msgs, json_pack("{s:s, s:o, s:s}", "role", "tool", "content", buf_string(&t),
							      "tool_call_id", call_id));
			kv_buf_free(&t);
		} else if (is_str(type, "reasoning")) {
			const json_t *c = json_object_get(it, "content");
			const json_t *s = json_object_get(it, "summary");
			const json_t *src = json_is_array(c) && json_array_size(c) ? c : s;
			snprintf(fp, sizeof fp, "%s.%s", p, src == c ? "content" : "summary");
			kv_buf_reset(&reasoning);
			if (src && !json_is_null(src) && (rc = parts_text(src, fp, &reasoning, param, cap)))
				break;
		} else {
			rc = bad(param, cap, p, "%s: unsupported input item type \"%s\"", json_string_value(type));
			break;
		}
	}
	kv_buf_free(&reasoning);
	return rc;
}

static int add_function_tool(const json_t *t, const char *path, json_t *out, char *param, size_t cap)
{
	const char *name = json_string_value(json_object_get(t, "name"));
	if (!name)
		return bad(param, cap, path, "%s.name: required string%s", NULL);
	json_t *fn = json_pack("{s:s}", "name", name);
	const json_t *d = json_object_get(t, "description");
	if (json_is_string(d))
		json_object_set(fn, "description", (json_t *)d);
	const json_t *params = json_object_get(t, "parameters");
	if (params && !json_is_null(params)) {
		if (!json_is_object(params)) {
			json_decref(fn);
			return bad(param, cap, path, "%s.parameters: must be an object%s", NULL);
		}
		json_object_set(fn, "parameters", (json_t *)params);
	}
	json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
	return KV_OK;
}

static int translate_tools(const json_t *tools, json_t *chat, char *param, size_t cap)
{
	if (!tools || json_is_null(tools))
		return KV_OK;
	if (!json_is_array(tools))
		return bad(param, cap, "tools", "%s: must be a list%s", NULL);
	json_t *out = json_array();
	int rc = KV_OK;
	char p[64], q[96];
	size_t i, j;
	const json_t *t, *u;
	json_array_foreach(tools, i, t) {
		snprintf(p, sizeof p, "tools[%zu]", i);
		const char *type = json_string_value(json_object_get(t, "type"));
		if (!json_is_object(t) || !type) {
			rc = bad(param, cap, p, "%s: must be an object with a \"type\"%s", NULL);
			break;
		}
		if (!strcmp(type, "function")) {
			if ((rc = add_function_tool(t, p, out, param, cap)))
				break;
		} else if (!strcmp(type, "namespace")) {
			const json_t *inner = json_object_get(t, "tools");
			if (!json_is_array(inner)) {
				rc = bad(param, cap, p, "%s.tools: a namespace needs a list of tools%s", NULL);
				break;
			}
			json_array_foreach(inner, j, u) {
				snprintf(q, sizeof q, "%s.tools[%zu]", p, j);
				const char *it = json_string_value(json_object_get(u, "type"));
				if (it && strcmp(it, "function")) {
					KV_INFO("responses.tool_ignored", "tool=%s type=%s reason=built_in",
						json_string_value(json_object_get(u, "name")) ?: "?", it);
					continue;
				}
				if ((rc = add_function_tool(u, q, out, param, cap)))
					break;
			}
			if (rc)
				break;
		} else {
			KV_INFO("responses.tool_ignored", "tool=%s type=%s reason=built_in",
				json_string_value(json_object_get(t, "name")) ?: "-", type);
		}
	}
	if (!rc && json_array_size(out))
		json_object_set(chat, "tools", out);
	json_decref(out);
	return rc;
}

int ksv_resp_to_chat(const json_t *body, json_t **chat_out, char *param, size_t cap)
{
	*chat_out = NULL;
	param[0] = 0;
	if (!json_is_object(body))
		return bad(param, cap, "", "request body%s: must be a JSON object%s", NULL);
	json_t *chat = json_object(), *msgs = json_array();
	int rc = KV_OK;
	const json_t *v;
	if ((v = json_object_get(body, "previous_response_id")) && !json_is_null(v)) {
		rc = bad(param, cap, "previous_response_id",
			 "%s: not supported: this server keeps no responses; send the whole conversation in \"input\" "
			 "(store: false)%s", NULL);
		goto fail;
	}
	if ((v = json_object_get(body, "model"))) {
		if (!json_is_string(v)) {
			rc = bad(param, cap, "model", "%s: must be a string%s", NULL);
			goto fail;
		}
		json_object_set(chat, "model", (json_t *)v);
	}
	if ((v = json_object_get(body, "instructions")) && !json_is_null(v)) {
		if (!json_is_string(v)) {
			rc = bad(param, cap, "instructions", "%s: must be a string%s", NULL);
			goto fail;
		}
		if (json_string_length(v))
			json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", v));
	}
	if (!(v = json_object_get(body, "input"))) {
		rc = bad(param, cap, "input", "%s: required%s", NULL);
		goto fail;
	}
	if ((rc = translate_input(v, msgs, param, cap)))
		goto fail;
	if (!json_array_size(msgs)) {
		rc = bad(param, cap, "input", "%s: holds no message%s", NULL);
		goto fail;
	}
	json_object_set(chat, "messages", msgs);
	if ((rc = translate_tools(json_object_get(body, "tools"), chat, param, cap)))
		goto fail;
	if ((v = json_object_get(body, "tool_choice")) && !json_is_null(v)) {
		if (json_is_string(v))
			json_object_set(chat, "tool_choice", (json_t *)v);
		else if (json_is_object(v) && is_str(json_object_get(v, "type"), "function") &&
			 json_is_string(json_object_get(v, "name")))
			json_object_set_new(chat, "tool_choice",
					    json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name",
						      json_object_get(v, "name")));
		else if (json_is_object(v) && json_is_string(json_object_get(v, "type")))
			json_object_set_new(chat, "tool_choice", json_string("auto")); /* allowed_tools, built-ins */
		else {
			rc = bad(param, cap, "tool_choice", "%s: must be a string or {type: \"function\", name}%s", NULL);
			goto fail;
		}
	}
	if ((v = json_object_get(body, "reasoning")) && !json_is_null(v)) {
		if (!json_is_object(v)) {
			rc = bad(param, cap, "reasoning", "%s: must be an object%s", NULL);
			goto fail;
		}
		const json_t *e = json_object_get(v, "effort");
		if (e && !json_is_null(e)) {
			if (!json_is_string(e)) {
				rc = bad(param, cap, "reasoning.effort", "%s: must be a string%s", NULL);
				goto fail;
			}
			int on = !(is_str(e, "none") || is_str(e, "minimal"));
			json_object_set_new(chat, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", on));
		}
	}
	if ((v = json_object_get(body, "max_output_tokens")) && !json_is_null(v))
		json_object_set(chat, "max_tokens", (json_t *)v);
	static const char *const copy[] = {"temperature", "top_p", "stream", "top_k", "min_p", "seed", "presence_penalty",
					   "frequency_penalty", "repetition_penalty"};
	for (size_t k = 0; k < sizeof copy / sizeof *copy; k++)
		if ((v = json_object_get(body, copy[k])) && !json_is_null(v))
			json_object_set(chat, copy[k], (json_t *)v);
	if (json_is_true(json_object_get(body, "stream")))
		json_object_set_new(chat, "stream_options", json_pack("{s:b}", "include_usage", 1));
	json_decref(msgs);
	*chat_out = chat;
	return KV_OK;
fail:
	json_decref(msgs);
	json_decref(chat);
	return rc;
}

/* --- responses ----------------------------------------------------------- */

/* Every Responses event carries its type and a sequence number. */
static void emit(struct ksv_resp *r, struct kv_buf *out, const char *type, json_t *data)
{
	json_object_set_new(data, "type", json_string(type));
	json_object_set_new(data, "sequence_number", json_integer(r->seq++));
	ksv_sse_event(out, type, data);
}

void ksv_resp_init(struct ksv_resp *r, const char *model, int stream)
{
	memset(r, 0, sizeof *r);
	ksv_oai_rand_id("resp_", r->id, sizeof r->id);
	snprintf(r->model, sizeof r->model, "%s", model ? model : "");
	r->created = kv_wall_s();
	r->stream = stream;
	r->items = json_array();
	struct kv_buf z = KV_BUF_INIT;
	r->cur = z;
}

void ksv_resp_free(struct ksv_resp *r)
{
	json_decref(r->items);
	r->items = NULL;
	kv_buf_free(&r->cur);
}

static json_t *usage_json(const struct ksv_resp_usage *u)
{
	return json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens", (json_int_t)u->input_tokens,
			 "input_tokens_details", "cached_tokens", (json_int_t)u->cached_tokens, "output_tokens",
			 (json_int_t)u->output_tokens, "output_tokens_details", "reasoning_tokens",
			 (json_int_t)u->reasoning_tokens, "total_tokens", (json_int_t)(u->input_tokens + u->output_tokens));
}

/* The response object; usage NULL -> null. */
static json_t *resp_obj(struct ksv_resp *r, const char *status, const char *incomplete, const struct ksv_resp_usage *u,
			const json_t *ext)
{
	json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:O, s:n}", "id", r->id, "object", "response", "created_at",
			      (json_int_t)r->created, "status", status, "model", r->model, "output", r->items, "error");
	json_object_set_new(o, "incomplete_details",
			    incomplete ? json_pack("{s:s}", "reason", incomplete) : json_null());
	json_t *usage = u ? usage_json(u) : json_null();
	if (u && ext)
		json_object_set(usage, "kvkeep", (json_t *)ext);
	json_object_set_new(o, "usage", usage);
	return o;
}

void ksv_resp_start(struct ksv_resp *r, struct kv_buf *out)
{
	emit(r, out, "response.created", json_pack("{s:o}", "response", resp_obj(r, "in_progress", NULL, NULL, NULL)));
	emit(r, out, "response.in_progress", json_pack("{s:o}", "response", resp_obj(r, "in_progress", NULL, NULL, NULL)));
}

static json_t *cur_item(struct ksv_resp *r)
{
	return json_array_get(r->items, json_array_size(r->items) - 1);
}

static void close_item(struct ksv_resp *r, struct kv_buf *out)
{
	if (r->open == OPEN_NONE)
		return;
	json_t *it = cur_item(r);
	int idx = (int)json_array_size(r->items) - 1;
	const char *id = json_string_value(json_object_get(it, "id"));
	json_t *text = ksv_json_text(r->cur.p ? r->cur.p : "", r->cur.len);
	int st = r->stream && out;
	if (r->open == OPEN_MSG) {
		json_t *part = json_pack("{s:s, s:O, s:[]}", "type", "output_text", "text", text, "annotations");
		json_object_set_new(it, "content", json_pack("[O]", part));
		if (st) {
			emit(r, out, "response.output_text.done",
			     json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index", idx, "content_index", 0, "text", text));
			emit(r, out, "response.content_part.done",
			     json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index", idx, "content_index", 0, "part", part));
		}
		json_decref(part);
	} else if (r->open == OPEN_REASONING) {
		json_object_set_new(it, "content", json_pack("[{s:s, s:O}]", "type", "reasoning_text", "text", text));
		if (st)
			emit(r, out, "response.reasoning_text.done",
			     json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index", idx, "content_index", 0, "text", text));
	} else {
		json_object_set(it, "arguments", text);
		if (st)
			emit(r, out, "response.function_call_arguments.done",
			     json_pack("{s:s, s:i, s:O}", "item_id", id, "output_index", idx, "arguments", text));
	}
	json_decref(text);
	json_object_set_new(it, "status", json_string("completed"));
	if (st)
		emit(r, out, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", idx, "item", it));
	r->open = OPEN_NONE;
	kv_buf_reset(&r->cur);
}

static void open_item(struct ksv_resp *r, int kind, json_t *item, struct kv_buf *out)
{
	close_item(r, out);
	json_array_append_new(r->items, item);
	int idx = (int)json_array_size(r->items) - 1;
	r->open = kind;
	kv_buf_reset(&r->cur);
	if (!r->stream || !out)
		return;
	emit(r, out, "response.output_item.added", json_pack("{s:i, s:O}", "output_index", idx, "item", item));
	if (kind == OPEN_MSG)
		emit(r, out, "response.content_part.added",
		     json_pack("{s:O, s:i, s:i, s:{s:s, s:s, s:[]}}", "item_id", json_object_get(item, "id"), "output_index",
			       idx, "content_index", 0, "part", "type", "output_text", "text", "", "annotations"));
}

static void item_delta(struct ksv_resp *r, const char *type, int with_content_index, const char *text, size_t len,
		       struct kv_buf *out)
{
	kv_buf_add(&r->cur, text, len);
	if (!r->stream || !out || !len)
		return;
	int idx = (int)json_array_size(r->items) - 1;
	json_t *d = json_pack("{s:O, s:i}", "item_id", json_object_get(cur_item(r), "id"), "output_index", idx);
	if (with_content_index)
		json_object_set_new(d, "content_index", json_integer(0));
	json_object_set_new(d, "delta", ksv_json_text(text, len));
	emit(r, out, type, d);
}

void ksv_resp_event(struct ksv_resp *r, const struct ksv_ev *e, struct kv_buf *out)
{
	char id[40], call[40];
	switch (e->kind) {
	case KSV_EV_CONTENT:
		if (r->open != OPEN_MSG) {
			if (!e->len)
				return;
			ksv_oai_rand_id("msg_", id, sizeof id);
			open_item(r, OPEN_MSG, json_pack("{s:s, s:s, s:s, s:s, s:[]}", "id", id, "type", "message", "status",
							 "in_progress", "role", "assistant", "content"), out);
		}
		item_delta(r, "response.output_text.delta", 1, e->text, e->len, out);
		break;
	case KSV_EV_REASONING:
		if (r->open != OPEN_REASONING) {
			if (!e->len)
				return;
			ksv_oai_rand_id("rs_", id, sizeof id);
			open_item(r, OPEN_REASONING, json_pack("{s:s, s:s, s:[], s:[]}", "id", id, "type", "reasoning",
							       "summary", "content"), out);
		}
		item_delta(r, "response.reasoning_text.delta", 1, e->text, e->len, out);
		break;
	case KSV_EV_TOOL_START:
		ksv_oai_rand_id("fc_", id, sizeof id);
		ksv_oai_rand_id("call_", call, sizeof call);
		open_item(r, OPEN_CALL, json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", id, "type", "function_call",
						  "status", "in_progress", "call_id", call, "name", e->name ? e->name : "",
						  "arguments", ""), out);
		break;
	case KSV_EV_TOOL_ARGS:
		if (r->open == OPEN_CALL)
			item_delta(r, "response.function_call_arguments.delta", 0, e->text, e->len, out);
		break;
	case KSV_EV_TOOL_END:
		if (r->open == OPEN_CALL)
			close_item(r, out);
		break;
	}
}

void ksv_resp_finish(struct ksv_resp *r, const char *finish, const struct ksv_resp_usage *u, const json_t *ext,
		     struct kv_buf *out)
{
	close_item(r, out);
	if (!r->stream || !out)
		return;
	int len = finish && !strcmp(finish, "length");
	emit(r, out, "response.completed",
	     json_pack("{s:o}", "response",
		       resp_obj(r, len ? "incomplete" : "completed", len ? "max_output_tokens" : NULL, u, ext)));
}

char *ksv_resp_response(struct ksv_resp *r, const char *finish, const struct ksv_resp_usage *u, const json_t *ext,
			size_t *len)
{
	close_item(r, NULL);
	int trunc = finish && !strcmp(finish, "length");
	json_t *o = resp_obj(r, trunc ? "incomplete" : "completed", trunc ? "max_output_tokens" : NULL, u, ext);
	return ksv_json_body(o, len);
}

void ksv_resp_sse_error(struct ksv_resp *r, int status, const char *message, struct kv_buf *out)
{
	json_t *o = resp_obj(r, "failed", NULL, NULL, NULL);
	json_object_set_new(o, "error", json_pack("{s:s, s:o}", "code", status >= 500 ? "server_error" : "invalid_request",
						  "message", ksv_json_text(message ? message : "", message ? strlen(message) : 0)));
	emit(r, out, "response.failed", json_pack("{s:o}", "response", o));
}
