/*
 * request.c - see request.h.
 *
 * Validation is explicit and field by field so that every refusal names
 * the field: a client gets "messages[3].tool_calls[0].function.name: must
 * be a string", not a generic "bad request". Nothing here trusts a type:
 * every json_t is checked before it is read.
 */
#include "server/request.h"
#include "base/err.h"
#include "base/json.h"
#include "text/template.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(struct ksv_req *r, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int bad(struct ksv_req *r, const char *param, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	snprintf(r->err_param, sizeof r->err_param, "%s", param);
	return kv_fail(KV_ERR_INVALID, "%s: %s", param, msg);
}

void ksv_req_free(struct ksv_req *r)
{
	if (!r)
		return;
	json_decref(r->body);
	json_decref(r->messages);
	json_decref(r->tools);
	free(r->prompt_ids);
	r->body = r->messages = r->tools = NULL;
	r->prompt_ids = NULL;
}

static const char *type_name(const json_t *v)
{
	const char *lit;
	size_t n;
	if (kv_json_number_literal(v, &lit, &n))
		return "a number beyond the range kvkeep reads (64-bit integers, doubles)";
	switch (json_typeof(v)) {
	case JSON_OBJECT:
		return "an object";
	case JSON_ARRAY:
		return "an array";
	case JSON_STRING:
		return "a string";
	case JSON_INTEGER:
	case JSON_REAL:
		return "a number";
	case JSON_TRUE:
	case JSON_FALSE:
		return "a boolean";
	default:
		return "null";
	}
}

/* 1 when a JSON string holds a NUL byte: C comparisons would see only
 * the part before it ("user\u0000x" would pass as "user"), so names and
 * keywords with one are refused. */
static int has_nul(const json_t *v)
{
	return json_is_string(v) && strlen(json_string_value(v)) != json_string_length(v);
}

/* A number too large for the parser (base/json.h kv_json_number_literal:
 * 2^63, 1e999) is reported with its text and the field's range rather
 * than as the string it is carried in. 1 when it was (and r says so). */
static int out_of_range(struct ksv_req *r, const char *key, const json_t *v, const char *range)
{
	const char *lit;
	size_t n;
	if (!kv_json_number_literal(v, &lit, &n))
		return 0;
	bad(r, key, "%.*s%s is out of range %s", n > 40 ? 40 : (int)n, lit, n > 40 ? "..." : "", range);
	return 1;
}

/* Optional number in [lo, hi] (lo_open: lo excluded). */
static int get_num(struct ksv_req *r, const json_t *o, const char *key, double lo, int lo_open, double hi, double def,
		   double *out)
{
	json_t *v = json_object_get(o, key);
	*out = def;
	if (!v || json_is_null(v))
		return KV_OK;
	char range[64];
	snprintf(range, sizeof range, "[%g, %g]", lo, hi);
	if (out_of_range(r, key, v, range))
		return KV_ERR_INVALID;
	if (!json_is_number(v))
		return bad(r, key, "must be a number, got %s", type_name(v));
	double d = json_number_value(v);
	if (!isfinite(d) || d < lo || (lo_open && d == lo) || d > hi)
		return bad(r, key, "%g is out of range (%s%g, %g]", d, lo_open ? "(" : "[", lo, hi);
	*out = d;
	return KV_OK;
}

/* Optional integer in [lo, hi]. */
static int get_int(struct ksv_req *r, const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t def,
		   int64_t *out)
{
	json_t *v = json_object_get(o, key);
	*out = def;
	if (!v || json_is_null(v))
		return KV_OK;
	if (json_is_real(v)) {
		double d = json_real_value(v);
		if (!(d == floor(d)) || d < -9.2e18 || d > 9.2e18)
			return bad(r, key, "must be an integer");
		*out = (int64_t)d;
	} else if (json_is_integer(v)) {
		*out = json_integer_value(v);
	} else if (kv_json_number_literal(v, &(const char *){NULL}, &(size_t){0})) {
		char range[64];
		snprintf(range, sizeof range, "[%lld, %lld]", (long long)lo, (long long)hi);
		out_of_range(r, key, v, range);
		return KV_ERR_INVALID;
	} else {
		return bad(r, key, "must be an integer, got %s", type_name(v));
	}
	if (*out < lo || *out > hi)
		return bad(r, key, "%lld is out of range [%lld, %lld]", (long long)*out, (long long)lo, (long long)hi);
	return KV_OK;
}

static int get_bool(struct ksv_req *r, const json_t *o, const char *key, int def, int *out)
{
	json_t *v = json_object_get(o, key);
	*out = def;
	if (!v || json_is_null(v))
		return KV_OK;
	if (!json_is_boolean(v))
		return bad(r, key, "must be true or false, got %s", type_name(v));
	*out = json_is_true(v);
	return KV_OK;
}

/* content: string | list of text parts | null (when allowed). */
static int check_content(struct ksv_req *r, const json_t *c, const char *path, int null_ok)
{
	char p[128];
	if (!c || json_is_null(c)) {
		if (null_ok)
			return KV_OK;
		return bad(r, path, "is required (a string or a list of text parts)");
	}
	if (json_is_string(c))
		return KV_OK;
	if (!json_is_array(c))
		return bad(r, path, "must be a string or a list of text parts, got %s", type_name(c));
	for (size_t i = 0; i < json_array_size(c); i++) {
		const json_t *part = json_array_get(c, i);
		/* the part's name for errors; one too long to spell names the content */
		if (snprintf(p, sizeof p, "%s[%zu]", path, i) >= (int)sizeof p)
			snprintf(p, sizeof p, "%.*s", (int)sizeof p - 1, path);
		if (!json_is_object(part))
			return bad(r, p, "must be an object {\"type\": \"text\", \"text\": ...}, got %s", type_name(part));
		const json_t *t = json_object_get(part, "type");
		if (!json_is_string(t) || has_nul(t))
			return bad(r, p, "needs a string \"type\"");
		if (strcmp(json_string_value(t), "text"))
			return bad(r, p, "content part type '%s' is not supported (text only)", json_string_value(t));
		const json_t *tx = json_object_get(part, "text");
		if (!json_is_string(tx)) {
			if (snprintf(p, sizeof p, "%s[%zu].text", path, i) >= (int)sizeof p)
				snprintf(p, sizeof p, "%.*s", (int)sizeof p - 1, path);
			return bad(r, p, "must be a string");
		}
	}
	return KV_OK;
}

static int check_tool_calls(struct ksv_req *r, const json_t *tc, size_t mi)
{
	char p[128];
	snprintf(p, sizeof p, "messages[%zu].tool_calls", mi);
	if (!json_is_array(tc))
		return bad(r, p, "must be an array, got %s", type_name(tc));
	for (size_t i = 0; i < json_array_size(tc); i++) {
		const json_t *c = json_array_get(tc, i);
		snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu]", mi, i);
		if (!json_is_object(c))
			return bad(r, p, "must be an object");
		const json_t *id = json_object_get(c, "id"), *ty = json_object_get(c, "type");
		const json_t *fn = json_object_get(c, "function");
		if (id && !json_is_string(id)) {
			snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].id", mi, i);
			return bad(r, p, "must be a string");
		}
		if (ty && !json_is_null(ty) && (!json_is_string(ty) || strcmp(json_string_value(ty), "function"))) {
			snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].type", mi, i);
			return bad(r, p, "must be \"function\"");
		}
		if (!json_is_object(fn)) {
			snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].function", mi, i);
			return bad(r, p, "must be an object with name and arguments");
		}
		if (!json_is_string(json_object_get(fn, "name"))) {
			snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].function.name", mi, i);
			return bad(r, p, "must be a string");
		}
		const json_t *a = json_object_get(fn, "arguments");
		if (a && !json_is_string(a) && !json_is_object(a)) {
			snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].function.arguments", mi, i);
			return bad(r, p, "must be a JSON string or an object, got %s", type_name(a));
		}
	}
	return KV_OK;
}

/*
 * 1 if the chat layer takes this role, 0 if not, KV_ERR_NOMEM. The list of
 * roles lives in one place, kv_chat_prepare_messages (text/template.h):
 * it is asked about a message holding only the role, so a request the
 * server accepts is one the template layer renders.
 */
static int role_known(const char *role)
{
	json_t *one = json_pack("[{s:s}]", "role", role), *out = NULL;
	if (!one)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	int rc = kv_chat_prepare_messages(one, &out);
	json_decref(one);
	json_decref(out);
	if (rc == KV_ERR_NOMEM)
		return rc;
	return rc == KV_OK;
}

static int parse_messages(struct ksv_req *r, const json_t *msgs)
{
	char p[128];
	if (!msgs || json_is_null(msgs))
		return bad(r, "messages", "is required");
	if (!json_is_array(msgs))
		return bad(r, "messages", "must be an array, got %s", type_name(msgs));
	if (json_array_size(msgs) == 0)
		return bad(r, "messages", "must not be empty");
	r->messages = json_deep_copy(msgs);
	if (!r->messages)
		return kv_fail(KV_ERR_NOMEM, "out of memory copying messages");
	for (size_t i = 0; i < json_array_size(r->messages); i++) {
		json_t *m = json_array_get(r->messages, i);
		snprintf(p, sizeof p, "messages[%zu]", i);
		if (!json_is_object(m))
			return bad(r, p, "must be an object, got %s", type_name(m));
		const json_t *role = json_object_get(m, "role");
		snprintf(p, sizeof p, "messages[%zu].role", i);
		if (!json_is_string(role))
			return bad(r, p, "must be a string");
		if (has_nul(role))
			return bad(r, p, "must not contain a NUL character");
		const char *rs = json_string_value(role);
		int is_asst = !strcmp(rs, "assistant"), is_tool = !strcmp(rs, "tool");
		int known = role_known(rs);
		if (known < 0)
			return known;
		if (!known) {
			/* the message names the roles text/template.h takes */
			return bad(r, p, "unknown role '%s' (system, developer, user, assistant, tool)", rs);
		}
		const json_t *name = json_object_get(m, "name");
		if (name && !json_is_null(name) && !json_is_string(name)) {
			snprintf(p, sizeof p, "messages[%zu].name", i);
			return bad(r, p, "must be a string");
		}
		const json_t *tc = json_object_get(m, "tool_calls");
		if (tc && !json_is_null(tc)) {
			if (!is_asst) {
				snprintf(p, sizeof p, "messages[%zu].tool_calls", i);
				return bad(r, p, "only assistant messages carry tool_calls");
			}
			int rc = check_tool_calls(r, tc, i);
			if (rc)
				return rc;
		}
		snprintf(p, sizeof p, "messages[%zu].content", i);
		int rc = check_content(r, json_object_get(m, "content"), p, is_asst);
		if (rc)
			return rc;
		const json_t *rc_ = json_object_get(m, "reasoning_content");
		if (rc_ && !json_is_null(rc_) && !json_is_string(rc_)) {
			snprintf(p, sizeof p, "messages[%zu].reasoning_content", i);
			return bad(r, p, "must be a string");
		}
		if (is_tool) {
			const json_t *id = json_object_get(m, "tool_call_id");
			snprintf(p, sizeof p, "messages[%zu].tool_call_id", i);
			if (!json_is_string(id))
				return bad(r, p, "is required for a tool message and must be a string");
		}
	}
	return KV_OK;
}

static int parse_tools(struct ksv_req *r, const json_t *tools)
{
	char p[128];
	if (!tools || json_is_null(tools))
		return KV_OK;
	if (!json_is_array(tools))
		return bad(r, "tools", "must be an array, got %s", type_name(tools));
	for (size_t i = 0; i < json_array_size(tools); i++) {
		const json_t *t = json_array_get(tools, i);
		snprintf(p, sizeof p, "tools[%zu]", i);
		if (!json_is_object(t))
			return bad(r, p, "must be an object");
		const json_t *ty = json_object_get(t, "type");
		if (!json_is_string(ty) || has_nul(ty) || strcmp(json_string_value(ty), "function")) {
			snprintf(p, sizeof p, "tools[%zu].type", i);
			return bad(r, p, "must be \"function\"");
		}
		const json_t *fn = json_object_get(t, "function");
		snprintf(p, sizeof p, "tools[%zu].function", i);
		if (!json_is_object(fn))
			return bad(r, p, "must be an object");
		if (!json_is_string(json_object_get(fn, "name"))) {
			snprintf(p, sizeof p, "tools[%zu].function.name", i);
			return bad(r, p, "must be a string");
		}
		if (has_nul(json_object_get(fn, "name"))) {
			snprintf(p, sizeof p, "tools[%zu].function.name", i);
			return bad(r, p, "must not contain a NUL character");
		}
		const json_t *d = json_object_get(fn, "description");
		if (d && !json_is_null(d) && !json_is_string(d)) {
			snprintf(p, sizeof p, "tools[%zu].function.description", i);
			return bad(r, p, "must be a string");
		}
		const json_t *pa = json_object_get(fn, "parameters");
		if (pa && !json_is_null(pa) && !json_is_object(pa)) {
			snprintf(p, sizeof p, "tools[%zu].function.parameters", i);
			return bad(r, p, "must be a JSON schema object");
		}
		const json_t *st = json_object_get(fn, "strict");
		if (st && !json_is_null(st) && !json_is_boolean(st)) {
			snprintf(p, sizeof p, "tools[%zu].function.strict", i);
			return bad(r, p, "must be true or false");
		}
		r->tools_strict |= json_is_true(st);
	}
	if (json_array_size(tools) > 0)
		r->tools = json_incref((json_t *)tools);
	return KV_OK;
}

static int has_tool(const json_t *tools, const char *name)
{
	for (size_t i = 0; tools && i < json_array_size(tools); i++) {
		const json_t *fn = json_object_get(json_array_get(tools, i), "function");
		if (!strcmp(json_string_value(json_object_get(fn, "name")), name))
			return 1;
	}
	return 0;
}

/* response_format: text, json_object (with llama.cpp's optional schema)
 * or json_schema. */
static int parse_response_format(struct ksv_req *r, const json_t *rf)
{
	if (!rf || json_is_null(rf))
		return KV_OK;
	const json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
	const char *ty = json_is_string(t) && !has_nul(t) ? json_string_value(t) : "";
	r->fmt_param = "response_format";
	if (!strcmp(ty, "text"))
		return KV_OK;
	if (!strcmp(ty, "json_object")) {
		const json_t *sc = json_object_get(rf, "schema");
		if (sc && !json_is_null(sc)) {
			if (!json_is_object(sc) && !json_is_boolean(sc))
				return bad(r, "response_format.schema", "must be a JSON Schema (an object)");
			r->fmt = KSV_FMT_JSON_SCHEMA;
			r->fmt_schema = sc;
		} else {
			r->fmt = KSV_FMT_JSON_OBJECT;
		}
		return KV_OK;
	}
	if (!strcmp(ty, "json_schema")) {
		const json_t *js = json_object_get(rf, "json_schema");
		if (!json_is_object(js))
			return bad(r, "response_format.json_schema", "must be an object with a \"schema\"");
		const json_t *sc = json_object_get(js, "schema"), *st = json_object_get(js, "strict");
		if (!json_is_object(sc) && !json_is_boolean(sc))
			return bad(r, "response_format.json_schema.schema", "must be a JSON Schema (an object)");
		if (st && !json_is_null(st) && !json_is_boolean(st))
			return bad(r, "response_format.json_schema.strict", "must be true or false");
		r->fmt = KSV_FMT_JSON_SCHEMA;
		r->fmt_schema = sc;
		r->fmt_strict = json_is_true(st);
		r->fmt_param = "response_format.json_schema";
		return KV_OK;
	}
	return bad(r, "response_format.type", "must be \"text\", \"json_object\" or \"json_schema\"");
}

/* The structured-output fields: response_format, and llama.cpp's
 * json_schema and grammar; at most one of them. */
static int parse_format(struct ksv_req *r, const json_t *b)
{
	const json_t *js = json_object_get(b, "json_schema"), *gr = json_object_get(b, "grammar");
	int rc = parse_response_format(r, json_object_get(b, "response_format"));
	if (rc)
		return rc;
	if (js && !json_is_null(js)) {
		if (r->fmt)
			return bad(r, "json_schema", "give one of response_format, json_schema and grammar");
		if (!json_is_object(js) && !json_is_boolean(js))
			return bad(r, "json_schema", "must be a JSON Schema (an object)");
		r->fmt = KSV_FMT_JSON_SCHEMA;
		r->fmt_schema = js;
		r->fmt_param = "json_schema";
	}
	if (gr && !json_is_null(gr)) {
		if (!json_is_string(gr))
			return bad(r, "grammar", "must be a string (GBNF)");
		if (!json_string_length(gr)) /* llama.cpp clients send "" for none */
			return KV_OK;
		if (r->fmt)
			return bad(r, "grammar", "give one of response_format, json_schema and grammar");
		r->fmt = KSV_FMT_GRAMMAR;
		r->grammar = json_string_value(gr);
		r->grammar_len = json_string_length(gr);
		r->fmt_param = "grammar";
	}
	return get_bool(r, b, "parallel_tool_calls", 1, &r->parallel_tool_calls);
}

static int parse_tool_choice(struct ksv_req *r, const json_t *tc)
{
	r->tool_choice = KSV_TC_AUTO;
	if (!tc || json_is_null(tc))
		return KV_OK;
	if (json_is_string(tc)) {
		const char *s = has_nul(tc) ? "" : json_string_value(tc);
		if (!strcmp(s, "auto"))
			r->tool_choice = KSV_TC_AUTO;
		else if (!strcmp(s, "none"))
			r->tool_choice = KSV_TC_NONE;
		else if (!strcmp(s, "required"))
			r->tool_choice = KSV_TC_REQUIRED;
		else
			return bad(r, "tool_choice", "must be \"auto\", \"none\", \"required\" or a named function");
	} else if (json_is_object(tc)) {
		const json_t *ty = json_object_get(tc, "type"), *fn = json_object_get(tc, "function");
		if (!json_is_string(ty) || has_nul(ty) || strcmp(json_string_value(ty), "function") || !json_is_object(fn) ||
		    !json_is_string(json_object_get(fn, "name")) || has_nul(json_object_get(fn, "name")))
			return bad(r, "tool_choice", "must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
		r->tool_choice = KSV_TC_NAMED;
		r->tool_name = json_string_value(json_object_get(fn, "name"));
		if (!has_tool(r->tools, r->tool_name))
			return bad(r, "tool_choice", "function '%s' is not in tools", r->tool_name);
	} else {
		return bad(r, "tool_choice", "must be a string or an object, got %s", type_name(tc));
	}
	if (r->tool_choice == KSV_TC_REQUIRED && !r->tools)
		return bad(r, "tool_choice", "\"required\" needs a non-empty tools list");
	return KV_OK;
}

static int parse_prompt(struct ksv_req *r, const json_t *pr)
{
	if (!pr || json_is_null(pr))
		return bad(r, "prompt", "is required");
	if (json_is_array(pr) && json_array_size(pr) == 1 &&
	    (json_is_string(json_array_get(pr, 0)) || json_is_array(json_array_get(pr, 0))))
		pr = json_array_get(pr, 0); /* a batch of one */
	if (json_is_string(pr)) {
		r->prompt = json_string_value(pr);
		r->prompt_len = json_string_length(pr);
		if (!r->prompt_len)
			return bad(r, "prompt", "must not be empty");
		return KV_OK;
	}
	if (!json_is_array(pr))
		return bad(r, "prompt", "must be a string or a list of token ids, got %s", type_name(pr));
	size_t n = json_array_size(pr);
	if (n == 0)
		return bad(r, "prompt", "must not be empty");
	for (size_t i = 0; i < n; i++)
		if (json_is_string(json_array_get(pr, i)) || json_is_array(json_array_get(pr, i)))
			return bad(r, "prompt", "batches of several prompts are not supported (n must be 1)");
	r->prompt_ids = malloc(n * sizeof *r->prompt_ids);
	if (!r->prompt_ids)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		const json_t *v = json_array_get(pr, i);
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
			return bad(r, "prompt", "token ids must be non-negative integers (item %zu)", i);
		r->prompt_ids[i] = (int32_t)json_integer_value(v);
	}
	r->n_prompt_ids = n;
	return KV_OK;
}

static int parse_stop(struct ksv_req *r, const json_t *st)
{
	if (!st || json_is_null(st))
		return KV_OK;
	if (json_is_string(st)) {
		if (json_string_length(st) == 0)
			return bad(r, "stop", "must not be empty");
		r->stop[r->n_stop++] = json_string_value(st);
		return KV_OK;
	}
	if (!json_is_array(st))
		return bad(r, "stop", "must be a string or a list of strings, got %s", type_name(st));
	if (json_array_size(st) > KSV_MAX_STOP)
		return bad(r, "stop", "at most %d stop sequences", KSV_MAX_STOP);
	for (size_t i = 0; i < json_array_size(st); i++) {
		const json_t *s = json_array_get(st, i);
		if (!json_is_string(s) || json_string_length(s) == 0)
			return bad(r, "stop", "item %zu must be a non-empty string", i);
		r->stop[r->n_stop++] = json_string_value(s);
	}
	return KV_OK;
}

int ksv_req_parse_sampling(struct ksv_req *r, const json_t *o, struct ksv_sampling *sp)
{
	/* the OpenAI ranges; repetition_penalty is vLLM's (> 0) */
	static const struct {
		double lo, hi;
		int lo_open;
	} range[KV_GC_N] = {
		[KV_GC_TEMPERATURE] = {0, 2, 0},
		[KV_GC_TOP_P] = {0, 1, 1},
		[KV_GC_MIN_P] = {0, 1, 0},
		[KV_GC_PRESENCE_PENALTY] = {-2, 2, 0},
		[KV_GC_FREQUENCY_PENALTY] = {-2, 2, 0},
		[KV_GC_REPETITION_PENALTY] = {0, INFINITY, 1},
	};
	int rc;
	memset(sp, 0, sizeof *sp);
	for (int f = 0; f < KV_GC_N; f++) {
		const char *key = kv_gencfg_name(f);
		json_t *v = json_object_get(o, key);
		if (!v || json_is_null(v))
			continue;
		if (f == KV_GC_TOP_K) {
			int64_t iv;
			if ((rc = get_int(r, o, key, -1, INT32_MAX, 0, &iv)))
				return rc;
			sp->v[f] = iv < 0 ? 0 : (double)iv;
		} else if ((rc = get_num(r, o, key, range[f].lo, range[f].lo_open, range[f].hi, 0, &sp->v[f]))) {
			return rc;
		}
		sp->set |= 1u << f;
	}
	json_t *seed = json_object_get(o, "seed");
	if (seed && !json_is_null(seed)) {
		if (!json_is_integer(seed))
			return bad(r, "seed", "must be an integer, got %s", type_name(seed));
		sp->seed = (uint64_t)json_integer_value(seed);
		sp->set |= KSV_SP_SEED;
	}
	return KV_OK;
}

void ksv_sampling_resolve(const struct ksv_sampling *sp, const struct kv_gencfg *dflt, uint64_t fallback_seed,
			  struct ke_sample_params *out)
{
	double v[KV_GC_N];
	for (int f = 0; f < KV_GC_N; f++)
		v[f] = sp->set & (1u << f) ? sp->v[f] : dflt->v[f];
	*out = (struct ke_sample_params){.temperature = v[KV_GC_TEMPERATURE],
					 .top_k = (int)v[KV_GC_TOP_K],
					 .top_p = v[KV_GC_TOP_P],
					 .min_p = v[KV_GC_MIN_P],
					 .presence_penalty = v[KV_GC_PRESENCE_PENALTY],
					 .frequency_penalty = v[KV_GC_FREQUENCY_PENALTY],
					 .repetition_penalty = v[KV_GC_REPETITION_PENALTY],
					 .seed = sp->set & KSV_SP_SEED ? sp->seed : fallback_seed};
}

/* Known fields whose non-default values we cannot honour: refused with a
 * clear message rather than silently giving a different answer. */
static int check_unsupported(struct ksv_req *r, const json_t *b)
{
	json_t *lb = json_object_get(b, "logit_bias");
	if (lb && !json_is_null(lb) && !(json_is_object(lb) && json_object_size(lb) == 0))
		return bad(r, "logit_bias", "is not supported");
	int64_t n;
	int rc = get_int(r, b, "n", 1, 1, 1, &n);
	if (rc)
		return bad(r, "n", "only n = 1 is supported");
	if (r->api == KSV_API_COMPLETION) {
		int echo;
		if ((rc = get_bool(r, b, "echo", 0, &echo)))
			return rc;
		if (echo)
			return bad(r, "echo", "is not supported");
		json_t *sfx = json_object_get(b, "suffix");
		if (sfx && !json_is_null(sfx) && !(json_is_string(sfx) && json_string_length(sfx) == 0))
			return bad(r, "suffix", "is not supported");
		if ((rc = get_int(r, b, "best_of", 1, 1, 1, &n)))
			return bad(r, "best_of", "only best_of = 1 is supported");
	}
	return KV_OK;
}

/* The parsed body (its reference taken), an object, and its model. */
static int parse_common(struct ksv_req *r, json_t *body)
{
	r->body = body;
	if (!json_is_object(r->body))
		return bad(r, "body", "must be a JSON object, got %s", type_name(r->body));
	json_t *m = json_object_get(r->body, "model");
	if (m && !json_is_null(m)) {
		if (!json_is_string(m))
			return bad(r, "model", "must be a string");
		if (has_nul(m))
			return bad(r, "model", "must not contain a NUL character");
		r->model = json_string_value(m);
	}
	return KV_OK;
}

static void req_init(struct ksv_req *r, int api)
{
	memset(r, 0, sizeof *r);
	r->api = api;
	r->max_tokens = -1;
	r->enable_thinking = -1;
}

int ksv_req_parse(int api, const char *body, size_t len, int max_depth, struct ksv_req *r)
{
	json_t *j = NULL;
	req_init(r, api);
	int rc = kv_json_parse("request body", body, len, max_depth, &j);
	if (rc)
		return rc;
	return ksv_req_parse_json(api, j, r);
}

int ksv_req_parse_json(int api, json_t *body, struct ksv_req *r)
{
	int rc;
	int64_t iv;

	req_init(r, api);
	if ((rc = parse_common(r, body)))
		return rc;
	const json_t *b = r->body;
	if (api == KSV_API_CHAT) {
		if ((rc = parse_messages(r, json_object_get(b, "messages"))))
			return rc;
		if ((rc = parse_tools(r, json_object_get(b, "tools"))))
			return rc;
		if ((rc = parse_tool_choice(r, json_object_get(b, "tool_choice"))))
			return rc;
		json_t *kw = json_object_get(b, "chat_template_kwargs");
		if (kw && !json_is_null(kw)) {
			if (!json_is_object(kw))
				return bad(r, "chat_template_kwargs", "must be an object");
			json_t *et = json_object_get(kw, "enable_thinking");
			if (et && !json_is_null(et)) {
				if (!json_is_boolean(et))
					return bad(r, "chat_template_kwargs.enable_thinking", "must be true or false");
				r->enable_thinking = json_is_true(et);
			}
		}
	} else {
		if ((rc = parse_prompt(r, json_object_get(b, "prompt"))))
			return rc;
	}
	if ((rc = check_unsupported(r, b)) || (rc = parse_format(r, b)))
		return rc;
	if ((rc = get_bool(r, b, "stream", 0, &r->stream)))
		return rc;
	if ((rc = get_bool(r, b, "ignore_eos", 0, &r->ignore_eos)))
		return rc;
	if ((rc = get_bool(r, b, "speculative", 1, &r->speculative)))
		return rc;
	if ((rc = get_bool(r, b, "return_progress", 0, &r->return_progress)))
		return rc;
	json_t *so = json_object_get(b, "stream_options");
	if (so && !json_is_null(so)) {
		if (!json_is_object(so))
			return bad(r, "stream_options", "must be an object");
		json_t *iu = json_object_get(so, "include_usage");
		if (iu && !json_is_null(iu)) {
			if (!json_is_boolean(iu))
				return bad(r, "stream_options.include_usage", "must be true or false");
			r->include_usage = json_is_true(iu);
		}
	}
	if ((rc = get_int(r, b, "max_tokens", 1, INT32_MAX, -1, &iv)))
		return rc;
	r->max_tokens = iv;
	if ((rc = get_int(r, b, "max_completion_tokens", 1, INT32_MAX, -1, &iv)))
		return rc;
	if (iv > 0)
		r->max_tokens = iv;
	if ((rc = ksv_req_parse_sampling(r, b, &r->sp)))
		return rc;
	if ((rc = parse_stop(r, json_object_get(b, "stop"))))
		return rc;
	if (api == KSV_API_CHAT) {
		if ((rc = get_bool(r, b, "logprobs", 0, &r->logprobs)))
			return rc;
		if ((rc = get_int(r, b, "top_logprobs", 0, KSV_MAX_TOP_LOGPROBS, -1, &iv)))
			return rc;
		if (iv >= 0 && !r->logprobs)
			return bad(r, "top_logprobs", "needs \"logprobs\": true");
		r->top_logprobs = iv < 0 ? 0 : (int)iv;
	} else {
		if ((rc = get_int(r, b, "logprobs", 0, KSV_MAX_TOP_LOGPROBS, -1, &iv)))
			return rc;
		r->logprobs = iv >= 0;
		r->top_logprobs = iv < 0 ? 0 : (int)iv;
	}
	return KV_OK;
}

int ksv_req_parse_probe(const char *body, size_t len, int max_depth, struct ksv_req *r)
{
	json_t *j = NULL;
	req_init(r, KSV_API_CHAT);
	int rc = kv_json_parse("request body", body, len, max_depth, &j);
	if (rc)
		return rc;
	if ((rc = parse_common(r, j)))
		return rc;
	if ((rc = parse_messages(r, json_object_get(r->body, "messages"))))
		return rc;
	if ((rc = parse_tools(r, json_object_get(r->body, "tools"))))
		return rc;
	json_t *kw = json_object_get(r->body, "chat_template_kwargs");
	if (json_is_object(kw) && json_is_boolean(json_object_get(kw, "enable_thinking")))
		r->enable_thinking = json_is_true(json_object_get(kw, "enable_thinking"));
	return KV_OK;
}
