/*
 * anthropic.c - see anthropic.h.
 *
 * The translation builds the OpenAI chat body with jansson and leaves all
 * generation-field validation (ranges, types) to request.c, so a value is
 * refused by one rule whichever API carried it. Structure that only
 * exists in the Messages API (blocks, tool_result, thinking) is checked
 * here, with paths in the Messages body's own terms.
 */
#include "server/anthropic.h"
#include "server/openai.h"
#include "server/wire.h"
#include "base/err.h"
#include "base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- request translation --------------------------------------------------- */

/* The "type" of content block b at path p: an object with a string type;
 * image and document blocks are refused (text-only models). */
static int block_type(const json_t *b, const char *p, const char **type, char *param, size_t cap)
{
	*type = json_string_value(json_object_get(b, "type"));
	if (!json_is_object(b) || !*type)
		return ksv_wire_bad(param, cap, p, "%s: a content block must be an object with a \"type\"%s", NULL);
	if (!strcmp(*type, "image") || !strcmp(*type, "document"))
		return ksv_wire_bad(param, cap, p, "%s: %s blocks are not supported: this server runs text-only models", *type);
	return KV_OK;
}

/* Appends the "text" of text block b to out. */
static int block_text(const json_t *b, const char *p, struct kv_buf *out, char *param, size_t cap)
{
	const json_t *t = json_object_get(b, "text");
	if (!json_is_string(t))
		return ksv_wire_bad(param, cap, p, "%s.text: must be a string%s", NULL);
	kv_buf_add(out, json_string_value(t), json_string_length(t));
	return KV_OK;
}

/* One block of a text-only content list: a text block's text. */
static int text_block(const json_t *b, const char *p, struct kv_buf *out, char *param, size_t cap)
{
	const char *type;
	int rc = block_type(b, p, &type, param, cap);
	if (rc)
		return rc;
	if (strcmp(type, "text"))
		return ksv_wire_bad(param, cap, p, "%s: unsupported content block type \"%s\" here", type);
	return block_text(b, p, out, param, cap);
}

/* Appends the text of `content` (a string, or a list of text blocks) to
 * out, blocks joined with "\n". Other block types are refused. */
static int text_blocks(const json_t *content, const char *path, struct kv_buf *out, char *param, size_t cap)
{
	return ksv_wire_join_text(content, path, "content blocks", text_block, out, param, cap);
}

static int user_message(const json_t *content, const char *path, json_t *msgs, char *param, size_t cap)
{
	struct kv_buf text = KV_BUF_INIT;
	int has_text = 0, rc = KV_OK;
	char p[160];
	if (json_is_string(content)) {
		json_t *m = json_pack("{s:s, s:O}", "role", "user", "content", content);
		json_array_append_new(msgs, m);
		return KV_OK;
	}
	if (!json_is_array(content))
		return ksv_wire_bad(param, cap, path, "%s: must be a string or a list of content blocks%s", NULL);
	size_t i;
	const json_t *b;
	json_array_foreach(content, i, b) {
		snprintf(p, sizeof p, "%s[%zu]", path, i);
		const char *type;
		if ((rc = block_type(b, p, &type, param, cap)))
			goto out;
		if (!strcmp(type, "text")) {
			if (has_text)
				kv_buf_adds(&text, "\n");
			if ((rc = block_text(b, p, &text, param, cap)))
				goto out;
			has_text = 1;
		} else if (!strcmp(type, "tool_result")) {
			const char *id = json_string_value(json_object_get(b, "tool_use_id"));
			if (!id) {
				rc = ksv_wire_bad(param, cap, p, "%s.tool_use_id: required string%s", NULL);
				goto out;
			}
			struct kv_buf r = KV_BUF_INIT;
			const json_t *c = json_object_get(b, "content");
			char cp[176];
			snprintf(cp, sizeof cp, "%s.content", p);
			if (c && !json_is_null(c) && (rc = text_blocks(c, cp, &r, param, cap))) {
				kv_buf_free(&r);
				goto out;
			}
			json_t *m = json_pack("{s:s, s:o, s:s}", "role", "tool", "content", ksv_wire_buf_string(&r), "tool_call_id", id);
			kv_buf_free(&r);
			json_array_append_new(msgs, m);
		} else {
			rc = ksv_wire_bad(param, cap, p, "%s: unsupported content block type \"%s\" in a user message", type);
			goto out;
		}
	}
	if (has_text || json_array_size(content) == 0)
		json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "user", "content", ksv_wire_buf_string(&text)));
out:
	kv_buf_free(&text);
	return rc;
}

static int assistant_message(const json_t *content, const char *path, json_t *msgs, char *param, size_t cap)
{
	char p[160];
	if (json_is_string(content)) {
		json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "assistant", "content", content));
		return KV_OK;
	}
	if (!json_is_array(content))
		return ksv_wire_bad(param, cap, path, "%s: must be a string or a list of content blocks%s", NULL);
	struct kv_buf text = KV_BUF_INIT, think = KV_BUF_INIT;
	json_t *calls = json_array();
	int rc = KV_OK;
	size_t i;
	const json_t *b;
	json_array_foreach(content, i, b) {
		snprintf(p, sizeof p, "%s[%zu]", path, i);
		const char *type;
		if ((rc = block_type(b, p, &type, param, cap)))
			goto out;
		if (!strcmp(type, "text")) {
			if ((rc = block_text(b, p, &text, param, cap)))
				goto out;
		} else if (!strcmp(type, "thinking")) {
			const json_t *t = json_object_get(b, "thinking");
			if (t && !json_is_string(t)) {
				rc = ksv_wire_bad(param, cap, p, "%s.thinking: must be a string%s", NULL);
				goto out;
			}
			if (t)
				kv_buf_add(&think, json_string_value(t), json_string_length(t));
		} else if (!strcmp(type, "redacted_thinking")) {
			/* opaque to us: nothing the model could read */
		} else if (!strcmp(type, "tool_use") || !strcmp(type, "server_tool_use")) {
			const char *id = json_string_value(json_object_get(b, "id"));
			const char *name = json_string_value(json_object_get(b, "name"));
			const json_t *input = json_object_get(b, "input");
			if (!id || !name) {
				rc = ksv_wire_bad(param, cap, p, "%s: tool_use needs string \"id\" and \"name\"%s", NULL);
				goto out;
			}
			if (input && !json_is_object(input)) {
				rc = ksv_wire_bad(param, cap, p, "%s.input: must be an object%s", NULL);
				goto out;
			}
			json_t *args = input ? json_incref((json_t *)input) : json_object();
			json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", id, "type", "function",
							       "function", "name", name, "arguments", args));
		} else {
			rc = ksv_wire_bad(param, cap, p, "%s: unsupported content block type \"%s\" in an assistant message", type);
			goto out;
		}
	}
	json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content", ksv_wire_buf_string(&text));
	if (think.len)
		json_object_set_new(m, "reasoning_content", ksv_wire_buf_string(&think));
	if (json_array_size(calls))
		json_object_set(m, "tool_calls", calls);
	json_array_append_new(msgs, m);
out:
	json_decref(calls);
	kv_buf_free(&text);
	kv_buf_free(&think);
	return rc;
}

static int translate_tools(const json_t *tools, json_t *chat, char *param, size_t cap)
{
	char p[64];
	if (!tools || json_is_null(tools))
		return KV_OK;
	if (!json_is_array(tools))
		return ksv_wire_bad(param, cap, "tools", "%s: must be a list%s", NULL);
	json_t *out = json_array();
	size_t i;
	const json_t *t;
	json_array_foreach(tools, i, t) {
		snprintf(p, sizeof p, "tools[%zu]", i);
		if (!json_is_object(t)) {
			json_decref(out);
			return ksv_wire_bad(param, cap, p, "%s: must be an object%s", NULL);
		}
		const char *type = json_string_value(json_object_get(t, "type"));
		const char *name = json_string_value(json_object_get(t, "name"));
		if (type && strcmp(type, "custom")) {
			KV_INFO("anthropic.tool_ignored", "tool=%s type=%s reason=server_tool", name ? name : "?", type);
			continue;
		}
		if (!name) {
			json_decref(out);
			return ksv_wire_bad(param, cap, p, "%s.name: required string%s", NULL);
		}
		const json_t *schema = json_object_get(t, "input_schema");
		if (schema && !json_is_object(schema)) {
			json_decref(out);
			return ksv_wire_bad(param, cap, p, "%s.input_schema: must be an object%s", NULL);
		}
		ksv_wire_add_function(out, name, json_object_get(t, "description"), schema);
	}
	if (json_array_size(out))
		json_object_set(chat, "tools", out);
	json_decref(out);
	return KV_OK;
}

static int translate_tool_choice(const json_t *tc, json_t *chat, char *param, size_t cap)
{
	if (!tc || json_is_null(tc))
		return KV_OK;
	const char *type = json_string_value(json_object_get(tc, "type"));
	if (!json_is_object(tc) || !type)
		return ksv_wire_bad(param, cap, "tool_choice", "%s: must be an object with a \"type\"%s", NULL);
	if (!strcmp(type, "auto"))
		json_object_set_new(chat, "tool_choice", json_string("auto"));
	else if (!strcmp(type, "any"))
		json_object_set_new(chat, "tool_choice", json_string("required"));
	else if (!strcmp(type, "none"))
		json_object_set_new(chat, "tool_choice", json_string("none"));
	else if (!strcmp(type, "tool")) {
		const char *name = json_string_value(json_object_get(tc, "name"));
		if (!name)
			return ksv_wire_bad(param, cap, "tool_choice.name", "%s: required string for type \"tool\"%s", NULL);
		json_object_set_new(chat, "tool_choice",
				    json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", name));
	} else
		return ksv_wire_bad(param, cap, "tool_choice.type", "%s: must be auto, any, tool or none, not \"%s\"", type);
	const json_t *dp = json_object_get(tc, "disable_parallel_tool_use");
	if (dp && !json_is_null(dp)) {
		if (!json_is_boolean(dp))
			return ksv_wire_bad(param, cap, "tool_choice.disable_parallel_tool_use", "%s: must be true or false%s",
					    NULL);
		json_object_set_new(chat, "parallel_tool_calls", json_boolean(!json_is_true(dp)));
	}
	return KV_OK;
}

static int translate_thinking(const json_t *th, json_t *chat, char *param, size_t cap)
{
	if (!th || json_is_null(th))
		return KV_OK;
	const char *type = json_string_value(json_object_get(th, "type"));
	if (!json_is_object(th) || !type)
		return ksv_wire_bad(param, cap, "thinking", "%s: must be an object with a \"type\"%s", NULL);
	int on;
	if (!strcmp(type, "enabled") || !strcmp(type, "adaptive"))
		on = 1;
	else if (!strcmp(type, "disabled"))
		on = 0;
	else
		return ksv_wire_bad(param, cap, "thinking.type", "%s: must be enabled, adaptive or disabled, not \"%s\"", type);
	json_object_set_new(chat, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", on));
	return KV_OK;
}

int ksv_anth_to_chat(const json_t *body, int for_count, json_t **chat_out, char *param, size_t cap)
{
	json_t *chat, *msgs;
	int rc = ksv_wire_translate_begin(body, chat_out, param, cap, &chat, &msgs);
	if (rc)
		return rc;
	const json_t *v;
	char p[64];

	if ((v = json_object_get(body, "model"))) {
		if (!json_is_string(v)) {
			rc = ksv_wire_bad(param, cap, "model", "%s: must be a string%s", NULL);
			goto fail;
		}
		json_object_set(chat, "model", (json_t *)v);
	}
	/* system */
	v = json_object_get(body, "system");
	if (v && !json_is_null(v)) {
		struct kv_buf sys = KV_BUF_INIT;
		if ((rc = text_blocks(v, "system", &sys, param, cap))) {
			kv_buf_free(&sys);
			goto fail;
		}
		if (sys.len)
			json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "system", "content", ksv_wire_buf_string(&sys)));
		kv_buf_free(&sys);
	}
	/* messages */
	const json_t *ms = json_object_get(body, "messages");
	if (!json_is_array(ms) || json_array_size(ms) == 0) {
		rc = ksv_wire_bad(param, cap, "messages", "%s: required non-empty list%s", NULL);
		goto fail;
	}
	size_t i;
	const json_t *m;
	json_array_foreach(ms, i, m) {
		snprintf(p, sizeof p, "messages[%zu]", i);
		const json_t *role = json_object_get(m, "role");
		const json_t *content = json_object_get(m, "content");
		if (!json_is_object(m) || !json_is_string(role)) {
			rc = ksv_wire_bad(param, cap, p, "%s: must be an object with a string \"role\"%s", NULL);
			goto fail;
		}
		/* full-string compare: "user\u0000x" is not "user" */
		const char *r = json_string_value(role);
		size_t rl = json_string_length(role);
		char cp[80];
		snprintf(cp, sizeof cp, "%s.content", p);
		if (!content) {
			rc = ksv_wire_bad(param, cap, cp, "%s: required%s", NULL);
			goto fail;
		}
		if (rl == 4 && !memcmp(r, "user", 4))
			rc = user_message(content, cp, msgs, param, cap);
		else if (rl == 9 && !memcmp(r, "assistant", 9))
			rc = assistant_message(content, cp, msgs, param, cap);
		else if (rl == 6 && !memcmp(r, "system", 6)) {
			struct kv_buf t = KV_BUF_INIT;
			if (!(rc = text_blocks(content, cp, &t, param, cap)))
				json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "system", "content", ksv_wire_buf_string(&t)));
			kv_buf_free(&t);
		} else {
			char rp[80];
			snprintf(rp, sizeof rp, "%s.role", p);
			rc = ksv_wire_bad(param, cap, rp, "%s: must be \"user\", \"assistant\" or \"system\"%s", NULL);
		}
		if (rc)
			goto fail;
	}
	json_object_set(chat, "messages", msgs);
	if ((rc = translate_tools(json_object_get(body, "tools"), chat, param, cap)) ||
	    (rc = translate_tool_choice(json_object_get(body, "tool_choice"), chat, param, cap)) ||
	    (rc = translate_thinking(json_object_get(body, "thinking"), chat, param, cap)))
		goto fail;
	/* generation fields: copied as they are; request.c checks them */
	v = json_object_get(body, "max_tokens");
	if (!for_count) {
		if (!v || json_is_null(v)) {
			/* Anthropic's max_tokens has no default: null is no value */
			rc = ksv_wire_bad(param, cap, "max_tokens", "%s: required (an integer >= 1)%s", NULL);
			goto fail;
		}
		json_object_set(chat, "max_tokens", (json_t *)v);
	}
	ksv_wire_copy_sampling(body, chat);
	if ((v = json_object_get(body, "stop_sequences")) && !json_is_null(v)) {
		if (!json_is_array(v)) {
			rc = ksv_wire_bad(param, cap, "stop_sequences", "%s: must be a list of strings%s", NULL);
			goto fail;
		}
		json_object_set(chat, "stop", (json_t *)v);
	}
fail:
	return ksv_wire_translated(rc, msgs, chat, chat_out);
}

/* --- the request, as a wire ---------------------------------------------------- */

static int anth_parse(const json_t *body, int api, int for_count, struct ksv_req *req)
{
	json_t *chat = NULL;
	char param[96] = "";
	(void)api;
	int rc = ksv_anth_to_chat(body, for_count, &chat, param, sizeof param);
	return ksv_wire_chat_req(rc, chat, param, req);
}

/* --- the answer ------------------------------------------------------------------ */

static void emit(struct kv_buf *out, const char *event, json_t *data)
{
	ksv_sse_event(out, event, data);
}

/* Anthropic's usage: the three input fields add up to the prompt. */
static json_t *usage_json(const struct ksv_answer *a)
{
	const struct kss_usage *u = &a->usage;
	json_int_t input = (json_int_t)u->prompt_tokens - u->cached_tokens - u->cache_creation_tokens;
	json_t *j = json_pack("{s:I, s:I, s:I, s:I}", "input_tokens", input < 0 ? 0 : input, "cache_creation_input_tokens",
			      (json_int_t)u->cache_creation_tokens, "cache_read_input_tokens", (json_int_t)u->cached_tokens,
			      "output_tokens", (json_int_t)u->completion_tokens);
	ksv_wire_usage_ext(a, j);
	return j;
}

const char *ksv_anth_stop_reason(const char *finish, int stop_hit)
{
	if (stop_hit)
		return "stop_sequence";
	if (finish && !strcmp(finish, "length"))
		return "max_tokens";
	if (finish && !strcmp(finish, "tool_calls"))
		return "tool_use";
	return "end_turn";
}

static json_t *stop_json(const struct ksv_answer *a)
{
	return a->stop_sequence ? json_string(a->stop_sequence) : json_null();
}

/* message_start (the usage split is known: the lookup is done) and a ping. */
static void anth_start(struct ksv_answer *a, struct kv_buf *out)
{
	json_t *msg = json_pack("{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:o}", "id", a->id, "type", "message", "role",
				"assistant", "model", a->model, "content", "stop_reason", "stop_sequence", "usage",
				usage_json(a));
	emit(out, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message", msg));
	ksv_anth_ping(out);
}

/* The content block of b as the answer shows it (text and input filled
 * when the block is complete). */
static json_t *block_json(const struct ksv_block *b, int complete)
{
	const char *t = b->text.p ? b->text.p : "";
	size_t n = complete ? b->text.len : 0;
	if (b->kind == KSV_BLK_TEXT)
		return json_pack("{s:s, s:o}", "type", "text", "text", ksv_json_text(t, n));
	if (b->kind == KSV_BLK_REASONING)
		return json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking", ksv_json_text(t, n), "signature", "");
	json_t *in = NULL;
	if (complete) {
		json_error_t je;
		in = n ? json_loadb(t, n, 0, &je) : json_object();
		if (!json_is_object(in)) {
			/* the tool-call parser hands over valid JSON; anything
			 * else is kept visible rather than dropped */
			json_decref(in);
			in = json_pack("{s:o}", "_raw", ksv_json_text(t, n));
		}
	}
	return json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", b->call_id, "name", b->name, "input",
			 in ? in : json_object());
}

static void anth_open(struct ksv_answer *a, const struct ksv_block *b, struct kv_buf *out)
{
	if (out)
		emit(out, "content_block_start",
		     json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", (int)a->n_blk - 1, "content_block",
			       block_json(b, 0)));
}

static void anth_delta(struct ksv_answer *a, const struct ksv_block *b, const char *t, size_t n, struct kv_buf *out)
{
	static const char *const type[] = {[KSV_BLK_TEXT] = "text_delta", [KSV_BLK_REASONING] = "thinking_delta",
					   [KSV_BLK_TOOL] = "input_json_delta"};
	static const char *const key[] = {[KSV_BLK_TEXT] = "text", [KSV_BLK_REASONING] = "thinking",
					  [KSV_BLK_TOOL] = "partial_json"};
	if (out)
		emit(out, "content_block_delta",
		     json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index", (int)a->n_blk - 1, "delta",
			       "type", type[b->kind], key[b->kind], ksv_json_text(t, n)));
}

/* A thinking block ends with its (empty) signature, then every block stops. */
static void anth_close(struct ksv_answer *a, const struct ksv_block *b, struct kv_buf *out)
{
	int idx = (int)a->n_blk - 1;
	if (!out)
		return;
	if (b->kind == KSV_BLK_REASONING)
		emit(out, "content_block_delta",
		     json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", idx, "delta", "type",
			       "signature_delta", "signature", ""));
	emit(out, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", idx));
}

static void anth_finish(struct ksv_answer *a, struct kv_buf *out)
{
	json_t *d = json_pack("{s:s, s:o}", "stop_reason", ksv_anth_stop_reason(a->finish, a->stop_sequence != NULL),
			      "stop_sequence", stop_json(a));
	emit(out, "message_delta", json_pack("{s:s, s:o, s:o}", "type", "message_delta", "delta", d, "usage", usage_json(a)));
	emit(out, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

static char *anth_body(struct ksv_answer *a, size_t *len)
{
	ksv_answer_close(a, NULL);
	json_t *blocks = json_array();
	for (size_t i = 0; i < a->n_blk; i++)
		json_array_append_new(blocks, block_json(&a->blk[i], 1));
	json_t *msg = json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:o}", "id", a->id, "type", "message", "role",
				"assistant", "model", a->model, "content", blocks, "stop_reason",
				ksv_anth_stop_reason(a->finish, a->stop_sequence != NULL), "stop_sequence", stop_json(a),
				"usage", usage_json(a));
	return ksv_json_body(msg, len);
}

static const char *error_type(int status)
{
	switch (status) {
	case 400: return "invalid_request_error";
	case 401: return "authentication_error";
	case 403: return "permission_error";
	case 404: return "not_found_error";
	case 413: return "request_too_large";
	case 415: return "invalid_request_error";
	case 429: return "rate_limit_error";
	case 503: return "overloaded_error";
	default: return status >= 500 ? "api_error" : "invalid_request_error";
	}
}

static json_t *error_json(int status, const char *message)
{
	return json_pack("{s:s, s:{s:s, s:o}}", "type", "error", "error", "type", error_type(status), "message",
			 ksv_json_text(message ? message : "", message ? strlen(message) : 0));
}

char *ksv_anth_error(int status, const char *message, size_t *len)
{
	return ksv_json_body(error_json(status, message), len);
}

static char *anth_error_body(int status, const char *message, const char *param, size_t *len)
{
	(void)param;
	return ksv_anth_error(status, message, len);
}

static void anth_stream_error(struct ksv_answer *a, int status, const char *message, struct kv_buf *out)
{
	(void)a;
	emit(out, "error", error_json(status, message));
}

void ksv_anth_ping(struct kv_buf *out)
{
	emit(out, "ping", json_pack("{s:s}", "type", "ping"));
}

/* While the prompt is prefilled the stream would be silent: a ping once a
 * second (Anthropic's own keep-alive event; clients and proxies see the
 * stream is alive). */
static void anth_progress(struct ksv_answer *a, const struct ksv_progress *p, struct kv_buf *out)
{
	(void)a;
	if (out && p->keepalive)
		ksv_anth_ping(out);
}

char *ksv_anth_count_body(int64_t n, size_t *len)
{
	return ksv_json_body(json_pack("{s:I}", "input_tokens", (json_int_t)n), len);
}

const struct ksv_wire ksv_wire_anthropic = KSV_WIRE_ROW(anth, "anthropic", "msg_", "toolu_", NULL, anth_error_body);
