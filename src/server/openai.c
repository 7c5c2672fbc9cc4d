/*
 * openai.c - see openai.h.
 *
 * Objects are built with jansson (insertion order is kept, so the keys
 * come out in the documented order) and dumped compact. Reals print with
 * 17 significant digits, so a float logprob survives the trip exactly.
 */
#include "server/openai.h"
#include "server/request.h"
#include "base/clock.h"
#include "base/utf8.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(17))

static uint64_t rng_next(void)
{
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	static uint64_t s;
	static int seeded;
	uint64_t z;
	pthread_mutex_lock(&mu);
	if (!seeded) {
		if (getrandom(&s, sizeof s, GRND_NONBLOCK) != sizeof s)
			s = kv_now_ns() ^ ((uint64_t)kv_wall_ms() << 20);
		seeded = 1;
	}
	z = (s += 0x9E3779B97F4A7C15ull);
	pthread_mutex_unlock(&mu);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

void ksv_oai_rand_id(const char *prefix, char *out, size_t cap)
{
	static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
	size_t n = strlen(prefix);
	if (cap < n + 25) {
		if (cap)
			out[0] = 0;
		return;
	}
	memcpy(out, prefix, n);
	for (size_t i = 0; i < 24; i++)
		out[n + i] = al[rng_next() % (sizeof al - 1)];
	out[n + 24] = 0;
}

void ksv_oai_tool_call_id(char out[32])
{
	ksv_oai_rand_id("call_", out, 32);
}

void ksv_oai_init(struct ksv_oai *o, int api, const char *model, int include_usage, int logprobs)
{
	memset(o, 0, sizeof *o);
	o->api = api;
	snprintf(o->id, sizeof o->id, "%s-%016llx%08llx", api == KSV_API_CHAT ? "chatcmpl" : "cmpl",
		 (unsigned long long)rng_next(), (unsigned long long)(rng_next() & 0xffffffffu));
	o->created = kv_wall_s();
	snprintf(o->model, sizeof o->model, "%s", model ? model : "");
	o->include_usage = include_usage;
	o->logprobs = logprobs;
}

json_t *ksv_json_text(const char *p, size_t n)
{
	json_t *j = json_stringn(p ? p : "", p ? n : 0);
	if (j)
		return j;
	/* invalid UTF-8 (or NUL): rebuild with one U+FFFD for each bad byte
	 * (the tokenizer's decode, kv_utf8_lossy_append, replaces each maximal
	 * subpart instead; these strings keep their per-byte rule) */
	struct kv_buf b = KV_BUF_INIT;
	for (size_t i = 0; i < n;) {
		int k = kv_utf8_seq(p + i, n - i);
		if (k > 0) {
			kv_buf_add(&b, p + i, (size_t)k);
			i += (size_t)k;
		} else {
			kv_buf_adds(&b, KV_UTF8_FFFD);
			i++;
		}
	}
	j = json_stringn(b.p ? b.p : "", b.len);
	kv_buf_free(&b);
	return j ? j : json_string("");
}

static json_t *bytes_array(const char *p, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(a, json_integer((unsigned char)p[i]));
	return a;
}

static json_t *chat_lp_entry(const struct ksv_lp *l)
{
	json_t *e = json_object();
	json_object_set_new(e, "token", ksv_json_text(l->bytes, l->len));
	json_object_set_new(e, "logprob", json_real((double)l->logprob));
	json_object_set_new(e, "bytes", bytes_array(l->bytes, l->len));
	json_t *top = json_array();
	for (int i = 0; i < l->n_top; i++) {
		json_t *t = json_object();
		json_object_set_new(t, "token", ksv_json_text(l->top[i].bytes, l->top[i].len));
		json_object_set_new(t, "logprob", json_real((double)l->top[i].logprob));
		json_object_set_new(t, "bytes", bytes_array(l->top[i].bytes, l->top[i].len));
		json_array_append_new(top, t);
	}
	json_object_set_new(e, "top_logprobs", top);
	return e;
}

/* logprobs object of a choice for n tokens. */
static json_t *lp_object(struct ksv_oai *o, const struct ksv_lp *lps, size_t n)
{
	if (!o->logprobs)
		return json_null();
	if (o->api == KSV_API_CHAT) {
		json_t *c = json_array();
		for (size_t i = 0; i < n; i++)
			json_array_append_new(c, chat_lp_entry(&lps[i]));
		json_t *obj = json_object();
		json_object_set_new(obj, "content", c);
		return obj;
	}
	json_t *toks = json_array(), *tlp = json_array(), *top = json_array(), *off = json_array();
	for (size_t i = 0; i < n; i++) {
		json_array_append_new(toks, ksv_json_text(lps[i].bytes, lps[i].len));
		json_array_append_new(tlp, json_real((double)lps[i].logprob));
		json_t *m = json_object();
		for (int k = 0; k < lps[i].n_top; k++) {
			json_t *key = ksv_json_text(lps[i].top[k].bytes, lps[i].top[k].len);
			if (!json_object_get(m, json_string_value(key)))
				json_object_set_new(m, json_string_value(key), json_real((double)lps[i].top[k].logprob));
			json_decref(key);
		}
		json_array_append_new(top, m);
		json_array_append_new(off, json_integer((json_int_t)o->text_offset));
		o->text_offset += lps[i].len;
	}
	json_t *obj = json_object();
	json_object_set_new(obj, "tokens", toks);
	json_object_set_new(obj, "token_logprobs", tlp);
	json_object_set_new(obj, "top_logprobs", top);
	json_object_set_new(obj, "text_offset", off);
	return obj;
}

static json_t *usage_json(const struct ksv_usage *u)
{
	json_t *j = json_object(), *d = json_object();
	json_object_set_new(j, "prompt_tokens", json_integer(u->prompt_tokens));
	json_object_set_new(j, "completion_tokens", json_integer(u->completion_tokens));
	json_object_set_new(j, "total_tokens", json_integer(u->prompt_tokens + u->completion_tokens));
	json_object_set_new(d, "cached_tokens", json_integer(u->cached_tokens));
	json_object_set_new(j, "prompt_tokens_details", d);
	return j;
}

static json_t *chunk_base(struct ksv_oai *o)
{
	json_t *c = json_object();
	json_object_set_new(c, "id", json_string(o->id));
	json_object_set_new(c, "object", json_string(o->api == KSV_API_CHAT ? "chat.completion.chunk" : "text_completion"));
	json_object_set_new(c, "created", json_integer(o->created));
	json_object_set_new(c, "model", json_string(o->model));
	json_object_set_new(c, "system_fingerprint", json_string("kvkeep-" KVKEEP_VERSION));
	return c;
}

void ksv_sse_event(struct kv_buf *out, const char *event, json_t *data)
{
	char *s = json_dumps(data, DUMP_FLAGS);
	json_decref(data);
	if (!s) {
		out->oom = 1;
		return;
	}
	if (event) {
		kv_buf_adds(out, "event: ");
		kv_buf_adds(out, event);
		kv_buf_addc(out, '\n');
	}
	kv_buf_adds(out, "data: ");
	kv_buf_adds(out, s);
	kv_buf_adds(out, "\n\n");
	free(s);
}

char *ksv_json_body(json_t *j, size_t *len)
{
	char *s = j ? json_dumps(j, DUMP_FLAGS) : NULL;
	json_decref(j);
	if (len)
		*len = s ? strlen(s) : 0;
	return s;
}

static void emit(json_t *chunk, struct kv_buf *out)
{
	ksv_sse_event(out, NULL, chunk);
}

/* A chunk with one choice; takes ownership of delta (chat) or text (completions). */
static void emit_choice(struct ksv_oai *o, json_t *delta_or_text, json_t *logprobs, const char *finish,
			struct kv_buf *out)
{
	json_t *c = chunk_base(o), *choices = json_array(), *ch = json_object();
	json_object_set_new(ch, "index", json_integer(0));
	json_object_set_new(ch, o->api == KSV_API_CHAT ? "delta" : "text", delta_or_text);
	json_object_set_new(ch, "logprobs", logprobs ? logprobs : json_null());
	json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
	json_array_append_new(choices, ch);
	json_object_set_new(c, "choices", choices);
	if (o->include_usage)
		json_object_set_new(c, "usage", json_null());
	emit(c, out);
}

void ksv_oai_sse_role(struct ksv_oai *o, struct kv_buf *out)
{
	if (o->role_sent)
		return;
	o->role_sent = 1;
	if (o->api != KSV_API_CHAT)
		return;
	json_t *d = json_object();
	json_object_set_new(d, "role", json_string("assistant"));
	json_object_set_new(d, "content", json_string(""));
	emit_choice(o, d, NULL, NULL, out);
}

void ksv_oai_sse_delta(struct ksv_oai *o, const char *content, size_t len, const char *reasoning, size_t rlen,
		       const struct ksv_lp *lps, size_t n_lps, struct kv_buf *out)
{
	ksv_oai_sse_role(o, out);
	json_t *lp = o->logprobs && n_lps ? lp_object(o, lps, n_lps) : NULL;
	if (o->api != KSV_API_CHAT) {
		emit_choice(o, ksv_json_text(content, len), lp, NULL, out);
		return;
	}
	json_t *d = json_object();
	if (reasoning && rlen)
		json_object_set_new(d, "reasoning_content", ksv_json_text(reasoning, rlen));
	if (content && (len || !(reasoning && rlen)))
		json_object_set_new(d, "content", ksv_json_text(content, len));
	emit_choice(o, d, lp, NULL, out);
}

void ksv_oai_sse_tool_start(struct ksv_oai *o, int index, const char *id, const char *name, struct kv_buf *out)
{
	ksv_oai_sse_role(o, out);
	json_t *d = json_object(), *arr = json_array(), *tc = json_object(), *fn = json_object();
	json_object_set_new(tc, "index", json_integer(index));
	json_object_set_new(tc, "id", json_string(id));
	json_object_set_new(tc, "type", json_string("function"));
	json_object_set_new(fn, "name", ksv_json_text(name, strlen(name)));
	json_object_set_new(fn, "arguments", json_string(""));
	json_object_set_new(tc, "function", fn);
	json_array_append_new(arr, tc);
	json_object_set_new(d, "tool_calls", arr);
	emit_choice(o, d, NULL, NULL, out);
}

void ksv_oai_sse_tool_args(struct ksv_oai *o, int index, const char *args, size_t len, struct kv_buf *out)
{
	ksv_oai_sse_role(o, out);
	json_t *d = json_object(), *arr = json_array(), *tc = json_object(), *fn = json_object();
	json_object_set_new(tc, "index", json_integer(index));
	json_object_set_new(fn, "arguments", ksv_json_text(args, len));
	json_object_set_new(tc, "function", fn);
	json_array_append_new(arr, tc);
	json_object_set_new(d, "tool_calls", arr);
	emit_choice(o, d, NULL, NULL, out);
}

void ksv_oai_sse_finish(struct ksv_oai *o, const char *reason, struct kv_buf *out)
{
	ksv_oai_sse_role(o, out);
	emit_choice(o, o->api == KSV_API_CHAT ? json_object() : json_string(""), NULL, reason, out);
}

void ksv_oai_sse_usage(struct ksv_oai *o, const struct ksv_usage *u, struct kv_buf *out)
{
	if (!o->include_usage)
		return;
	json_t *c = chunk_base(o);
	json_object_set_new(c, "choices", json_array());
	json_object_set_new(c, "usage", usage_json(u));
	emit(c, out);
}

static void error_fields(int status, const char **type, const char **code)
{
	switch (status) {
	case 400:
		*type = "invalid_request_error";
		*code = "invalid_request";
		break;
	case 401:
		*type = "invalid_request_error";
		*code = "invalid_api_key";
		break;
	case 403:
		*type = "invalid_request_error";
		*code = "forbidden";
		break;
	case 404:
		*type = "invalid_request_error";
		*code = "not_found";
		break;
	case 405:
		*type = "invalid_request_error";
		*code = "method_not_allowed";
		break;
	case 413:
		*type = "invalid_request_error";
		*code = "request_too_large";
		break;
	case 429:
	case 503:
		*type = "overloaded_error";
		*code = status == 429 ? "queue_full" : "overloaded";
		break;
	default:
		*type = "server_error";
		*code = "internal_error";
		break;
	}
}

static json_t *error_json(int status, const char *message, const char *param)
{
	const char *type, *code;
	error_fields(status, &type, &code);
	json_t *e = json_object(), *w = json_object();
	json_object_set_new(e, "message", ksv_json_text(message, strlen(message)));
	json_object_set_new(e, "type", json_string(type));
	json_object_set_new(e, "param", param && *param ? json_string(param) : json_null());
	json_object_set_new(e, "code", json_string(code));
	json_object_set_new(w, "error", e);
	return w;
}

char *ksv_oai_error(int status, const char *message, const char *param, size_t *len)
{
	json_t *w = error_json(status, message ? message : "", param);
	return ksv_json_body(w, len);
}

void ksv_oai_sse_error(struct ksv_oai *o, int status, const char *message, struct kv_buf *out)
{
	(void)o;
	emit(error_json(status, message ? message : "", NULL), out);
}

void ksv_oai_sse_done(struct kv_buf *out)
{
	kv_buf_adds(out, "data: [DONE]\n\n");
}

char *ksv_oai_response(struct ksv_oai *o, const struct ksv_oai_result *r, size_t *len)
{
	json_t *c = json_object(), *choices = json_array(), *ch = json_object();
	json_object_set_new(c, "id", json_string(o->id));
	json_object_set_new(c, "object", json_string(o->api == KSV_API_CHAT ? "chat.completion" : "text_completion"));
	json_object_set_new(c, "created", json_integer(o->created));
	json_object_set_new(c, "model", json_string(o->model));
	json_object_set_new(c, "system_fingerprint", json_string("kvkeep-" KVKEEP_VERSION));
	json_object_set_new(ch, "index", json_integer(0));
	if (o->api == KSV_API_CHAT) {
		json_t *m = json_object();
		json_object_set_new(m, "role", json_string("assistant"));
		json_object_set_new(m, "content", r->content ? ksv_json_text(r->content, r->content_len) : json_null());
		if (r->reasoning)
			json_object_set_new(m, "reasoning_content", ksv_json_text(r->reasoning, r->reasoning_len));
		if (r->n_calls) {
			json_t *arr = json_array();
			for (size_t i = 0; i < r->n_calls; i++) {
				json_t *tc = json_object(), *fn = json_object();
				json_object_set_new(tc, "id", json_string(r->calls[i].id));
				json_object_set_new(tc, "type", json_string("function"));
				json_object_set_new(fn, "name", ksv_json_text(r->calls[i].name, strlen(r->calls[i].name)));
				json_object_set_new(fn, "arguments",
						    ksv_json_text(r->calls[i].arguments, strlen(r->calls[i].arguments)));
				json_object_set_new(tc, "function", fn);
				json_array_append_new(arr, tc);
			}
			json_object_set_new(m, "tool_calls", arr);
		}
		json_object_set_new(ch, "message", m);
	} else {
		json_object_set_new(ch, "text", ksv_json_text(r->content ? r->content : "", r->content ? r->content_len : 0));
	}
	json_object_set_new(ch, "logprobs", lp_object(o, r->lps, r->n_lps));
	json_object_set_new(ch, "finish_reason", json_string(r->finish_reason ? r->finish_reason : "stop"));
	json_array_append_new(choices, ch);
	json_object_set_new(c, "choices", choices);
	json_object_set_new(c, "usage", usage_json(&r->usage));
	return ksv_json_body(c, len);
}
