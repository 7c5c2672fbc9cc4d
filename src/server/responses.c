/*
 * responses.c - see responses.h.
 */
#include "server/responses.h"
#include "server/openai.h"
#include "server/wire.h"
#include "base/err.h"
#include "base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- request translation --------------------------------------------------- */

/* Text of a string or a list of text parts (input_text, output_text,
 * text, summary_text, reasoning_text), joined with "\n". */
static int part_text(const json_t *part, const char *p, struct kv_buf *out, char *param, size_t cap)
{
	const char *type = json_string_value(json_object_get(part, "type"));
	if (!json_is_object(part) || !type)
		return ksv_wire_bad(param, cap, p, "%s: a content part must be an object with a \"type\"%s", NULL);
	if (!strcmp(type, "input_image") || !strcmp(type, "input_file") || !strcmp(type, "input_audio"))
		return ksv_wire_bad(param, cap, p, "%s: %s parts are not supported: this server runs text-only models", type);
	if (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text") &&
	    strcmp(type, "summary_text") && strcmp(type, "reasoning_text") && strcmp(type, "refusal"))
		return ksv_wire_bad(param, cap, p, "%s: unsupported content part type \"%s\"", type);
	const json_t *t = json_object_get(part, !strcmp(type, "refusal") ? "refusal" : "text");
	if (!json_is_string(t))
		return ksv_wire_bad(param, cap, p, "%s.text: must be a string%s", NULL);
	kv_buf_add(out, json_string_value(t), json_string_length(t));
	return KV_OK;
}

static int parts_text(const json_t *c, const char *path, struct kv_buf *out, char *param, size_t cap)
{
	return ksv_wire_join_text(c, path, "content parts", part_text, out, param, cap);
}

/* The assistant message the next function_call joins: the last message
 * if it is an assistant message, else a new empty one. */
static json_t *assistant_tail(json_t *msgs, struct kv_buf *pending_reasoning)
{
	json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
	if (!last || !ksv_wire_is(json_object_get(last, "role"), "assistant")) {
		last = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
		json_array_append_new(msgs, last);
	}
	if (pending_reasoning->len) {
		json_object_set_new(last, "reasoning_content", ksv_wire_buf_string(pending_reasoning));
		kv_buf_reset(pending_reasoning);
	}
	return last;
}

/* Reasoning that no assistant message or call took (an answer that was
 * reasoning alone): an assistant message of its own. */
static void flush_reasoning(json_t *msgs, struct kv_buf *pending_reasoning)
{
	if (!pending_reasoning->len)
		return;
	json_t *m = json_pack("{s:s, s:s, s:o}", "role", "assistant", "content", "", "reasoning_content",
			      ksv_wire_buf_string(pending_reasoning));
	json_array_append_new(msgs, m);
	kv_buf_reset(pending_reasoning);
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

/*
 * encrypted_content of the reasoning items this server returns (when the
 * request's "include" asks for "reasoning.encrypted_content", as Codex
 * does with store: false): "kvk1:" + base64 of the reasoning text. It is
 * not secret (the client has the text anyway): it lets a client that
 * keeps only encrypted_content send the reasoning back, so the history
 * renders as generated. Other servers' values are opaque: ignored.
 */
static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static json_t *reasoning_seal(const char *p, size_t n)
{
	struct kv_buf b = KV_BUF_INIT;
	const unsigned char *u = (const unsigned char *)p;
	kv_buf_adds(&b, "kvk1:");
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)u[i] << 16 | (i + 1 < n ? (uint32_t)u[i + 1] << 8 : 0) | (i + 2 < n ? u[i + 2] : 0);
		char q[4] = {b64[v >> 18 & 63], b64[v >> 12 & 63], i + 1 < n ? b64[v >> 6 & 63] : '=',
			     i + 2 < n ? b64[v & 63] : '='};
		kv_buf_add(&b, q, 4);
	}
	json_t *j = b.oom ? json_null() : json_stringn(b.p, b.len);
	kv_buf_free(&b);
	return j ? j : json_null();
}

static void reasoning_unseal(const json_t *v, struct kv_buf *out)
{
	const char *s = json_string_value(v);
	size_t n = json_string_length(v);
	if (!s || n < 5 || memcmp(s, "kvk1:", 5))
		return;
	uint32_t acc = 0;
	int bits = 0;
	for (size_t i = 5; i < n && s[i] != '='; i++) {
		const char *f = memchr(b64, s[i], 64);
		if (!f || !s[i]) {
			kv_buf_reset(out); /* not ours after all: no reasoning */
			return;
		}
		acc = acc << 6 | (uint32_t)(f - b64);
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			kv_buf_addc(out, (char)(acc >> bits & 0xff));
		}
	}
	if (memchr(out->p ? out->p : "", 0, out->len))
		kv_buf_reset(out);
}

static int translate_input(const json_t *input, json_t *msgs, char *param, size_t cap)
{
	if (json_is_string(input)) {
		json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", input));
		return KV_OK;
	}
	if (!json_is_array(input) || !json_array_size(input))
		return ksv_wire_bad(param, cap, "input", "%s: must be a string or a non-empty list of items%s", NULL);
	struct kv_buf reasoning = KV_BUF_INIT;
	int rc = KV_OK;
	char p[64], fp[96];
	size_t i;
	const json_t *it;
	json_array_foreach(input, i, it) {
		snprintf(p, sizeof p, "input[%zu]", i);
		if (!json_is_object(it)) {
			rc = ksv_wire_bad(param, cap, p, "%s: must be an object%s", NULL);
			break;
		}
		const json_t *type = json_object_get(it, "type");
		if (type && !json_is_string(type)) {
			rc = ksv_wire_bad(param, cap, p, "%s.type: must be a string%s", NULL);
			break;
		}
		if (!type || ksv_wire_is(type, "message")) {
			const json_t *role = json_object_get(it, "role");
			const char *r = NULL;
			if (ksv_wire_is(role, "user"))
				r = "user";
			else if (ksv_wire_is(role, "assistant"))
				r = "assistant";
			else if (ksv_wire_is(role, "system") || ksv_wire_is(role, "developer"))
				r = "system";
			if (!r) {
				snprintf(fp, sizeof fp, "%s.role", p);
				rc = ksv_wire_bad(param, cap, fp, "%s: must be user, assistant, system or developer%s", NULL);
				break;
			}
			struct kv_buf t = KV_BUF_INIT;
			snprintf(fp, sizeof fp, "%s.content", p);
			if ((rc = parts_text(json_object_get(it, "content"), fp, &t, param, cap))) {
				kv_buf_free(&t);
				break;
			}
			int assistant = ksv_wire_is(role, "assistant");
			if (!assistant)
				flush_reasoning(msgs, &reasoning);
			json_t *m = json_pack("{s:s, s:o}", "role", r, "content", ksv_wire_buf_string(&t));
			kv_buf_free(&t);
			if (assistant && reasoning.len) {
				json_object_set_new(m, "reasoning_content", ksv_wire_buf_string(&reasoning));
				kv_buf_reset(&reasoning);
			}
			json_array_append_new(msgs, m);
		} else if (ksv_wire_is(type, "function_call") || ksv_wire_is(type, "custom_tool_call")) {
			int custom = ksv_wire_is(type, "custom_tool_call");
			const char *call_id = json_string_value(json_object_get(it, "call_id"));
			const char *name = json_string_value(json_object_get(it, "name"));
			const json_t *a = json_object_get(it, custom ? "input" : "arguments");
			if (!call_id || !name || (a && !json_is_string(a))) {
				rc = ksv_wire_bad(param, cap, p, "%s: needs string \"call_id\", \"name\" and \"arguments\"%s", NULL);
				break;
			}
			json_t *args;
			if (custom)
				args = json_pack("{s:s}", "input", a ? json_string_value(a) : "");
			else
				args = json_string(a ? json_string_value(a) : "{}");
			add_call(assistant_tail(msgs, &reasoning), call_id, name, args);
		} else if (ksv_wire_is(type, "function_call_output") || ksv_wire_is(type, "custom_tool_call_output")) {
			const char *call_id = json_string_value(json_object_get(it, "call_id"));
			if (!call_id) {
				snprintf(fp, sizeof fp, "%s.call_id", p);
				rc = ksv_wire_bad(param, cap, fp, "%s: required string%s", NULL);
				break;
			}
			struct kv_buf t = KV_BUF_INIT;
			snprintf(fp, sizeof fp, "%s.output", p);
			const json_t *o = json_object_get(it, "output");
			if (o && (rc = parts_text(o, fp, &t, param, cap))) {
				kv_buf_free(&t);
				break;
			}
			flush_reasoning(msgs, &reasoning);
			json_array_append_new(msgs, json_pack("{s:s, s:o, s:s}", "role", "tool", "content", ksv_wire_buf_string(&t),
							      "tool_call_id", call_id));
			kv_buf_free(&t);
		} else if (ksv_wire_is(type, "reasoning")) {
			const json_t *c = json_object_get(it, "content");
			const json_t *s = json_object_get(it, "summary");
			const json_t *src = json_is_array(c) && json_array_size(c) ? c : s;
			snprintf(fp, sizeof fp, "%s.%s", p, src == c ? "content" : "summary");
			kv_buf_reset(&reasoning);
			if (src && !json_is_null(src) && (rc = parts_text(src, fp, &reasoning, param, cap)))
				break;
			/* no text, but our own encrypted_content: the reasoning it carries */
			if (!reasoning.len)
				reasoning_unseal(json_object_get(it, "encrypted_content"), &reasoning);
		} else {
			rc = ksv_wire_bad(param, cap, p, "%s: unsupported input item type \"%s\"", json_string_value(type));
			break;
		}
	}
	if (!rc)
		flush_reasoning(msgs, &reasoning);
	kv_buf_free(&reasoning);
	return rc;
}

static int add_function_tool(const json_t *t, const char *path, json_t *out, char *param, size_t cap)
{
	const char *name = json_string_value(json_object_get(t, "name"));
	if (!name)
		return ksv_wire_bad(param, cap, path, "%s.name: required string%s", NULL);
	const json_t *params = json_object_get(t, "parameters");
	if (json_is_null(params))
		params = NULL;
	if (params && !json_is_object(params))
		return ksv_wire_bad(param, cap, path, "%s.parameters: must be an object%s", NULL);
	ksv_wire_add_function(out, name, json_object_get(t, "description"), params);
	return KV_OK;
}

static int translate_tools(const json_t *tools, json_t *chat, char *param, size_t cap)
{
	if (!tools || json_is_null(tools))
		return KV_OK;
	if (!json_is_array(tools))
		return ksv_wire_bad(param, cap, "tools", "%s: must be a list%s", NULL);
	json_t *out = json_array();
	int rc = KV_OK;
	char p[64], q[96];
	size_t i, j;
	const json_t *t, *u;
	json_array_foreach(tools, i, t) {
		snprintf(p, sizeof p, "tools[%zu]", i);
		const char *type = json_string_value(json_object_get(t, "type"));
		if (!json_is_object(t) || !type) {
			rc = ksv_wire_bad(param, cap, p, "%s: must be an object with a \"type\"%s", NULL);
			break;
		}
		if (!strcmp(type, "function")) {
			if ((rc = add_function_tool(t, p, out, param, cap)))
				break;
		} else if (!strcmp(type, "namespace")) {
			const json_t *inner = json_object_get(t, "tools");
			if (!json_is_array(inner)) {
				rc = ksv_wire_bad(param, cap, p, "%s.tools: a namespace needs a list of tools%s", NULL);
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

/* text.format: {type: "text" | "json_object" | "json_schema", name?,
 * schema, strict?} as chat's response_format (request.c checks it). */
static int translate_text_format(const json_t *text, json_t *chat, char *param, size_t cap)
{
	const json_t *f = json_is_object(text) ? json_object_get(text, "format") : NULL;
	if (text && !json_is_null(text) && !json_is_object(text))
		return ksv_wire_bad(param, cap, "text", "%s: must be an object%s", NULL);
	if (!f || json_is_null(f))
		return KV_OK;
	const json_t *ty = json_is_object(f) ? json_object_get(f, "type") : NULL;
	if (ksv_wire_is(ty, "text"))
		return KV_OK;
	if (ksv_wire_is(ty, "json_object")) {
		json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"));
		return KV_OK;
	}
	if (!ksv_wire_is(ty, "json_schema"))
		return ksv_wire_bad(param, cap, "text.format.type", "%s: must be \"text\", \"json_object\" or \"json_schema\"%s",
				    NULL);
	json_t *js = json_object();
	static const char *const keys[] = {"name", "schema", "strict"};
	for (size_t k = 0; k < 3; k++) {
		const json_t *v = json_object_get(f, keys[k]);
		if (v)
			json_object_set(js, keys[k], (json_t *)v);
	}
	json_object_set_new(chat, "response_format", json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js));
	return KV_OK;
}

int ksv_resp_to_chat(const json_t *body, json_t **chat_out, char *param, size_t cap)
{
	json_t *chat, *msgs;
	int rc = ksv_wire_translate_begin(body, chat_out, param, cap, &chat, &msgs);
	if (rc)
		return rc;
	const json_t *v;
	if ((v = json_object_get(body, "previous_response_id")) && !json_is_null(v)) {
		rc = ksv_wire_bad(param, cap, "previous_response_id",
			 "%s: not supported: this server keeps no responses; send the whole conversation in \"input\" "
			 "(store: false)%s", NULL);
		goto fail;
	}
	if ((v = json_object_get(body, "model"))) {
		if (!json_is_string(v)) {
			rc = ksv_wire_bad(param, cap, "model", "%s: must be a string%s", NULL);
			goto fail;
		}
		json_object_set(chat, "model", (json_t *)v);
	}
	if ((v = json_object_get(body, "instructions")) && !json_is_null(v)) {
		if (!json_is_string(v)) {
			rc = ksv_wire_bad(param, cap, "instructions", "%s: must be a string%s", NULL);
			goto fail;
		}
		if (json_string_length(v))
			json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", v));
	}
	if (!(v = json_object_get(body, "input"))) {
		rc = ksv_wire_bad(param, cap, "input", "%s: required%s", NULL);
		goto fail;
	}
	if ((rc = translate_input(v, msgs, param, cap)))
		goto fail;
	if (!json_array_size(msgs)) {
		rc = ksv_wire_bad(param, cap, "input", "%s: holds no message%s", NULL);
		goto fail;
	}
	json_object_set(chat, "messages", msgs);
	if ((rc = translate_tools(json_object_get(body, "tools"), chat, param, cap)))
		goto fail;
	if ((v = json_object_get(body, "tool_choice")) && !json_is_null(v)) {
		if (json_is_string(v))
			json_object_set(chat, "tool_choice", (json_t *)v);
		else if (json_is_object(v) && ksv_wire_is(json_object_get(v, "type"), "function") &&
			 json_is_string(json_object_get(v, "name")))
			json_object_set_new(chat, "tool_choice",
					    json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name",
						      json_object_get(v, "name")));
		else if (json_is_object(v) && json_is_string(json_object_get(v, "type")))
			json_object_set_new(chat, "tool_choice", json_string("auto")); /* allowed_tools, built-ins */
		else {
			rc = ksv_wire_bad(param, cap, "tool_choice", "%s: must be a string or {type: \"function\", name}%s", NULL);
			goto fail;
		}
	}
	if ((v = json_object_get(body, "reasoning")) && !json_is_null(v)) {
		if (!json_is_object(v)) {
			rc = ksv_wire_bad(param, cap, "reasoning", "%s: must be an object%s", NULL);
			goto fail;
		}
		const json_t *e = json_object_get(v, "effort");
		if (e && !json_is_null(e)) {
			if (!json_is_string(e)) {
				rc = ksv_wire_bad(param, cap, "reasoning.effort", "%s: must be a string%s", NULL);
				goto fail;
			}
			int on = !(ksv_wire_is(e, "none") || ksv_wire_is(e, "minimal"));
			json_object_set_new(chat, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", on));
			json_object_set(chat, "reasoning_effort", (json_t *)e); /* harmony's variable */
		}
	}
	if ((v = json_object_get(body, "max_output_tokens")) && !json_is_null(v))
		json_object_set(chat, "max_tokens", (json_t *)v);
	if ((v = json_object_get(body, "parallel_tool_calls")) && !json_is_null(v))
		json_object_set(chat, "parallel_tool_calls", (json_t *)v);
	if ((rc = translate_text_format(json_object_get(body, "text"), chat, param, cap)))
		goto fail;
	ksv_wire_copy_sampling(body, chat);
fail:
	return ksv_wire_translated(rc, msgs, chat, chat_out);
}

/* --- the request, as a wire ---------------------------------------------------- */

static int resp_parse(const json_t *body, int api, int for_count, struct ksv_req *req)
{
	json_t *chat = NULL;
	char param[96] = "";
	(void)api, (void)for_count;
	int rc = ksv_resp_to_chat(body, &chat, param, sizeof param);
	if ((rc = ksv_wire_chat_req(rc, chat, param, req)))
		return rc;
	size_t i;
	const json_t *inc;
	json_array_foreach(json_object_get(body, "include"), i, inc)
		if (ksv_wire_is(inc, "reasoning.encrypted_content"))
			req->encrypted_reasoning = 1;
	return rc;
}

/* --- the answer ------------------------------------------------------------------ */

/* Every Responses event carries its type and a sequence number. */
static void emit(struct ksv_answer *a, struct kv_buf *out, const char *type, json_t *data)
{
	json_object_set_new(data, "type", json_string(type));
	json_object_set_new(data, "sequence_number", json_integer(a->seq++));
	ksv_sse_event(out, type, data);
}

static json_t *usage_json(const struct ksv_answer *a)
{
	const struct kss_usage *u = &a->usage;
	json_t *j = json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens", (json_int_t)u->prompt_tokens,
			      "input_tokens_details", "cached_tokens", (json_int_t)u->cached_tokens, "output_tokens",
			      (json_int_t)u->completion_tokens, "output_tokens_details", "reasoning_tokens",
			      (json_int_t)a->reasoning_tokens, "total_tokens",
			      (json_int_t)u->prompt_tokens + u->completion_tokens);
	ksv_wire_usage_ext(a, j);
	return j;
}

/* The output items so far (as they are when complete). */
static json_t *item_json(const struct ksv_answer *a, const struct ksv_block *b, int complete);

static json_t *items_json(const struct ksv_answer *a)
{
	json_t *arr = json_array();
	for (size_t i = 0; i < a->n_blk; i++)
		json_array_append_new(arr, item_json(a, &a->blk[i], !(a->open && i == a->n_blk - 1)));
	return arr;
}

/* The response object; with_usage 0 -> "usage": null. */
static json_t *resp_obj(const struct ksv_answer *a, const char *status, const char *incomplete, int with_usage)
{
	json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:n}", "id", a->id, "object", "response", "created_at",
			      (json_int_t)a->created, "status", status, "model", a->model, "output", items_json(a), "error");
	json_object_set_new(o, "incomplete_details", incomplete ? json_pack("{s:s}", "reason", incomplete) : json_null());
	json_object_set_new(o, "usage", with_usage ? usage_json(a) : json_null());
	return o;
}

/* The Responses API has no keep-alive event: while the prompt is
 * prefilled, an SSE comment line once a second (every SSE parser skips
 * lines that start with ':'; no sequence_number is used up), saying how
 * far the prefill is. */
static void resp_progress(struct ksv_answer *a, const struct ksv_progress *p, struct kv_buf *out)
{
	(void)a;
	if (out && p->keepalive)
		kv_buf_printf(out, ": keep-alive prefill %u/%u\n\n", p->processed, p->total);
}

static void resp_start(struct ksv_answer *a, struct kv_buf *out)
{
	emit(a, out, "response.created", json_pack("{s:o}", "response", resp_obj(a, "in_progress", NULL, 0)));
	emit(a, out, "response.in_progress", json_pack("{s:o}", "response", resp_obj(a, "in_progress", NULL, 0)));
}

static json_t *block_text(const struct ksv_block *b)
{
	return ksv_json_text(b->text.p ? b->text.p : "", b->text.len);
}

static json_t *output_text_part(const struct ksv_block *b)
{
	return json_pack("{s:s, s:o, s:[]}", "type", "output_text", "text", block_text(b), "annotations");
}

static json_t *item_json(const struct ksv_answer *a, const struct ksv_block *b, int complete)
{
	const char *status = complete ? "completed" : "in_progress";
	if (b->kind == KSV_BLK_TEXT)
		return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", b->item_id, "type", "message", "status", status, "role",
				 "assistant", "content", complete ? json_pack("[o]", output_text_part(b)) : json_array());
	if (b->kind == KSV_BLK_REASONING) {
		json_t *r = json_pack("{s:s, s:s, s:[], s:o}", "id", b->item_id, "type", "reasoning", "summary", "content",
				      complete ? json_pack("[{s:s, s:o}]", "type", "reasoning_text", "text", block_text(b))
					       : json_array());
		if (complete && a->encrypted_reasoning)
			json_object_set_new(r, "encrypted_content", reasoning_seal(b->text.p ? b->text.p : "", b->text.len));
		if (complete)
			json_object_set_new(r, "status", json_string(status));
		return r;
	}
	return json_pack("{s:s, s:s, s:s, s:s, s:s, s:o}", "id", b->item_id, "type", "function_call", "status", status,
			 "call_id", b->call_id, "name", b->name, "arguments", complete ? block_text(b) : json_string(""));
}

static void resp_open(struct ksv_answer *a, const struct ksv_block *b, struct kv_buf *out)
{
	int idx = (int)a->n_blk - 1;
	if (!out)
		return;
	emit(a, out, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", idx, "item", item_json(a, b, 0)));
	if (b->kind == KSV_BLK_TEXT)
		emit(a, out, "response.content_part.added",
		     json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[]}}", "item_id", b->item_id, "output_index", idx,
			       "content_index", 0, "part", "type", "output_text", "text", "", "annotations"));
}

static void resp_delta(struct ksv_answer *a, const struct ksv_block *b, const char *t, size_t n, struct kv_buf *out)
{
	static const char *const type[] = {[KSV_BLK_TEXT] = "response.output_text.delta",
					   [KSV_BLK_REASONING] = "response.reasoning_text.delta",
					   [KSV_BLK_TOOL] = "response.function_call_arguments.delta"};
	if (!out)
		return;
	json_t *d = json_pack("{s:s, s:i}", "item_id", b->item_id, "output_index", (int)a->n_blk - 1);
	if (b->kind != KSV_BLK_TOOL)
		json_object_set_new(d, "content_index", json_integer(0));
	json_object_set_new(d, "delta", ksv_json_text(t, n));
	emit(a, out, type[b->kind], d);
}

static void resp_close(struct ksv_answer *a, const struct ksv_block *b, struct kv_buf *out)
{
	int idx = (int)a->n_blk - 1;
	if (!out)
		return;
	if (b->kind == KSV_BLK_TEXT) {
		emit(a, out, "response.output_text.done",
		     json_pack("{s:s, s:i, s:i, s:o}", "item_id", b->item_id, "output_index", idx, "content_index", 0, "text",
			       block_text(b)));
		emit(a, out, "response.content_part.done",
		     json_pack("{s:s, s:i, s:i, s:o}", "item_id", b->item_id, "output_index", idx, "content_index", 0, "part",
			       output_text_part(b)));
	} else if (b->kind == KSV_BLK_REASONING) {
		emit(a, out, "response.reasoning_text.done",
		     json_pack("{s:s, s:i, s:i, s:o}", "item_id", b->item_id, "output_index", idx, "content_index", 0, "text",
			       block_text(b)));
	} else {
		emit(a, out, "response.function_call_arguments.done",
		     json_pack("{s:s, s:i, s:o}", "item_id", b->item_id, "output_index", idx, "arguments", block_text(b)));
	}
	emit(a, out, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", idx, "item", item_json(a, b, 1)));
}

static int truncated(const struct ksv_answer *a)
{
	return a->finish && !strcmp(a->finish, "length");
}

static void resp_finish(struct ksv_answer *a, struct kv_buf *out)
{
	int len = truncated(a);
	emit(a, out, "response.completed",
	     json_pack("{s:o}", "response",
		       resp_obj(a, len ? "incomplete" : "completed", len ? "max_output_tokens" : NULL, 1)));
}

static char *resp_body(struct ksv_answer *a, size_t *len)
{
	ksv_answer_close(a, NULL);
	int trunc = truncated(a);
	return ksv_json_body(resp_obj(a, trunc ? "incomplete" : "completed", trunc ? "max_output_tokens" : NULL, 1), len);
}

static void resp_stream_error(struct ksv_answer *a, int status, const char *message, struct kv_buf *out)
{
	json_t *o = resp_obj(a, "failed", NULL, 0);
	json_object_set_new(o, "error", json_pack("{s:s, s:o}", "code", status >= 500 ? "server_error" : "invalid_request",
						  "message", ksv_json_text(message ? message : "", message ? strlen(message) : 0)));
	emit(a, out, "response.failed", json_pack("{s:o}", "response", o));
}

const struct ksv_wire ksv_wire_responses = KSV_WIRE_ROW(resp, "responses", "resp_", "call_", NULL, ksv_oai_error);
