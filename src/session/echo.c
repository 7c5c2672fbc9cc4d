/*
 * echo.c - see echo.h.
 */
#include "session/echo.h"
#include "base/err.h"
#include "base/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_MAGIC "kvkeep-echo-1|"

/* "<len>:" + bytes: fields that cannot run into each other */
static void field(struct kv_buf *k, const char *p, size_t n)
{
	kv_buf_printf(k, "%zu:", n);
	kv_buf_add(k, p ? p : "", n);
}

/* Arguments as parsed JSON written again with sorted keys and no spaces;
 * text that does not parse is kept as it is (it still must match). */
static void canon_args(struct kv_buf *k, const char *p, size_t n)
{
	json_t *j = NULL;
	char *c = NULL;
	if (n && !kv_json_parse("tool-call arguments", p, n, KV_JSON_MAX_DEPTH, &j))
		c = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY | JSON_ALLOW_NUL);
	kv_errclear();
	if (c)
		field(k, c, strlen(c));
	else
		field(k, p, n);
	free(c);
	json_decref(j);
}

static void canon_args_json(struct kv_buf *k, const json_t *a)
{
	if (json_is_string(a)) {
		canon_args(k, json_string_value(a), json_string_length(a));
		return;
	}
	char *c = a ? json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY | JSON_ALLOW_NUL) : NULL;
	if (c)
		field(k, c, strlen(c));
	else
		field(k, "", 0);
	free(c);
}

/* The content's text: a string, or text parts joined with nothing between
 * (as the chat layer prepares it); anything else is "". */
static void content_text(const json_t *c, struct kv_buf *out)
{
	size_t i;
	const json_t *part;
	if (json_is_string(c)) {
		kv_buf_add(out, json_string_value(c), json_string_length(c));
		return;
	}
	json_array_foreach(c, i, part) {
		const json_t *t = json_object_get(part, "text");
		if (json_is_string(t))
			kv_buf_add(out, json_string_value(t), json_string_length(t));
	}
}

int kss_echo_key_message(const json_t *msg, struct kv_buf *key, struct kv_buf *reasoning)
{
	struct kv_buf content = KV_BUF_INIT;
	size_t i;
	const json_t *tc;
	kv_buf_reset(key);
	kv_buf_reset(reasoning);
	content_text(json_object_get(msg, "content"), &content);
	kv_buf_adds(key, KEY_MAGIC);
	field(key, content.p, content.len);
	kv_buf_free(&content);
	json_array_foreach(json_object_get(msg, "tool_calls"), i, tc) {
		const json_t *fn = json_object_get(tc, "function");
		const json_t *id = json_object_get(tc, "id"), *name = json_object_get(fn, "name");
		field(key, json_string_value(id), json_string_length(id));
		field(key, json_string_value(name), json_string_length(name));
		canon_args_json(key, json_object_get(fn, "arguments"));
	}
	const json_t *r = json_object_get(msg, "reasoning_content");
	if (json_is_string(r))
		kv_buf_add(reasoning, json_string_value(r), json_string_length(r));
	return key->oom || reasoning->oom ? kv_fail(KV_ERR_NOMEM, "out of memory") : KV_OK;
}

int kss_echo_key_answer(const char *content, size_t content_len, const struct kss_echo_call *calls, size_t n,
			struct kv_buf *key)
{
	kv_buf_reset(key);
	kv_buf_adds(key, KEY_MAGIC);
	field(key, content, content_len);
	for (size_t i = 0; i < n; i++) {
		field(key, calls[i].id, strlen(calls[i].id));
		field(key, calls[i].name, strlen(calls[i].name));
		canon_args(key, calls[i].args, calls[i].args_len);
	}
	return key->oom ? kv_fail(KV_ERR_NOMEM, "out of memory") : KV_OK;
}

void kss_echo_found_free(struct kss_echo_found *f)
{
	for (size_t i = 0; i < f->n; i++)
		free(f->blocks[i]);
	free(f->blocks);
	free(f->splices);
	memset(f, 0, sizeof *f);
}

struct find_ctx {
	const json_t *messages;
	struct kss_echo_found *out;
	int rc;
};

/* Every assistant message of the request against the namespace's records
 * (registry locked: only lookups, copies out). */
static void find_in(void *ctx, const struct kss_tier *t)
{
	struct find_ctx *f = ctx;
	struct kc_echo *e = kc_cache_echo(t->cache);
	struct kv_buf key = KV_BUF_INIT, rs = KV_BUF_INIT;
	size_t i, n = json_array_size(f->messages);
	const json_t *m;
	if (!e)
		return;
	f->out->splices = calloc(n ? n : 1, sizeof *f->out->splices);
	f->out->blocks = calloc(n ? n : 1, sizeof *f->out->blocks);
	if (!f->out->splices || !f->out->blocks) {
		f->rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		return;
	}
	json_array_foreach(f->messages, i, m) {
		const char *role = json_string_value(json_object_get(m, "role"));
		if (!role || strcmp(role, "assistant"))
			continue;
		if ((f->rc = kss_echo_key_message(m, &key, &rs)))
			break;
		struct kc_echo_rec r;
		void *block = NULL;
		int rc = kc_echo_get(e, key.p, key.len, rs.p, rs.len, &r, &block);
		if (rc == KV_ERR_NOMEM) {
			f->rc = rc;
			break;
		}
		if (rc)
			continue;
		struct kss_echo_found *o = f->out;
		o->blocks[o->n] = block;
		o->splices[o->n++] = (struct kv_chat_splice){.message = i, .text = r.text, .text_len = r.text_len,
							     .tokens = r.tokens, .n_tokens = r.n_tokens};
	}
	kv_errclear();
	kv_buf_free(&key);
	kv_buf_free(&rs);
}

int kss_echo_find(struct kss_service *s, const char *salt, const json_t *messages, struct kss_echo_found *out)
{
	struct find_ctx f = {.messages = messages, .out = out};
	memset(out, 0, sizeof *out);
	kss_registry_with(kss_service_registry(s), salt, find_in, &f);
	if (f.rc)
		kss_echo_found_free(out);
	return f.rc;
}

struct remember_ctx {
	const struct kc_echo_rec *r;
	int rc;
};

static void remember_in(void *ctx, const struct kss_tier *t)
{
	struct remember_ctx *x = ctx;
	struct kc_echo *e = kc_cache_echo(t->cache);
	if (e)
		x->rc = kc_echo_put(e, x->r, 1);
}

int kss_echo_remember(struct kss_service *s, const char *salt, const struct kc_echo_rec *r)
{
	struct remember_ctx x = {.r = r};
	kss_registry_with(kss_service_registry(s), salt, remember_in, &x);
	return x.rc;
}

int kss_echo_remember_answer(struct kss_service *s, const char *salt, const struct kss_echo_answer *a)
{
	struct kv_buf text = KV_BUF_INIT, key = KV_BUF_INIT, toks = KV_BUF_INIT;
	char *gtext = NULL;
	size_t glen = 0;
	int rc = a->n_gen ? kv_tok_decode(kss_service_tok(s), a->gen, a->n_gen, 0, &gtext, &glen) : KV_OK;
	if (rc)
		goto out;
	kv_buf_add(&text, a->gp_text, a->gp_len);
	kv_buf_add(&text, gtext, glen);
	kv_buf_add(&toks, a->prefix, a->n_prefix * sizeof(int32_t));
	kv_buf_add(&toks, a->gen, a->n_gen * sizeof(int32_t));
	if (text.oom || toks.oom) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	if ((rc = kss_echo_key_answer(a->content, a->content_len, a->calls, a->n_calls, &key)))
		goto out;
	struct kc_echo_rec rec = {.key = key.p, .key_len = key.len, .reasoning = a->reasoning ? a->reasoning : "",
				  .reasoning_len = a->reasoning ? a->reasoning_len : 0, .text = text.p, .text_len = text.len,
				  .tokens = (const int32_t *)toks.p, .n_tokens = (uint32_t)(toks.len / sizeof(int32_t))};
	rc = kss_echo_remember(s, salt, &rec);
out:
	kv_buf_free(&text);
	kv_buf_free(&key);
	kv_buf_free(&toks);
	free(gtext);
	return rc;
}
