/*
 * wire.c - see wire.h: the block machine and what the formatters share.
 */
#include "server/wire.h"
#include "server/openai.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/utf8.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(17))

/* --- ids, JSON text, SSE ----------------------------------------------------- */

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

uint64_t ksv_wire_rand64(void)
{
	return rng_next();
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

/* --- the block machine --------------------------------------------------------- */

void ksv_answer_init(struct ksv_answer *a, const struct ksv_wire *w, int api, const char *model, int stream)
{
	memset(a, 0, sizeof *a);
	a->w = w;
	a->api = api;
	a->stream = stream;
	a->created = kv_wall_s();
	snprintf(a->model, sizeof a->model, "%s", model ? model : "");
	if (w->answer_id_prefix)
		ksv_oai_rand_id(w->answer_id_prefix, a->id, sizeof a->id);
	else /* OpenAI's: chatcmpl- / cmpl- and 24 hex digits */
		snprintf(a->id, sizeof a->id, "%s-%016llx%08llx", api == KSV_API_CHAT ? "chatcmpl" : "cmpl",
			 (unsigned long long)rng_next(), (unsigned long long)(rng_next() & 0xffffffffu));
}

void ksv_answer_free(struct ksv_answer *a)
{
	for (size_t i = 0; i < a->n_blk; i++) {
		kv_buf_free(&a->blk[i].text);
		free(a->blk[i].name);
	}
	free(a->blk);
	free(a->lps);
	json_decref(a->ext);
	memset(a, 0, sizeof *a);
}

void ksv_answer_close(struct ksv_answer *a, struct kv_buf *out)
{
	if (!a->open)
		return;
	a->open = 0;
	a->w->close(a, &a->blk[a->n_blk - 1], a->stream ? out : NULL);
}

static struct ksv_block *open_block(struct ksv_answer *a, int kind, const char *name, struct kv_buf *out)
{
	ksv_answer_close(a, out);
	if (a->n_blk == a->cap_blk) {
		size_t nc = a->cap_blk ? a->cap_blk * 2 : 4;
		struct ksv_block *nb = realloc(a->blk, nc * sizeof *nb);
		if (!nb)
			return NULL;
		a->blk = nb;
		a->cap_blk = nc;
	}
	struct ksv_block *b = &a->blk[a->n_blk++];
	memset(b, 0, sizeof *b);
	b->kind = kind;
	if (kind == KSV_BLK_TOOL) {
		b->name = strdup(name ? name : "");
		b->tool_index = a->n_tools++;
		ksv_oai_rand_id(a->w->tool_id_prefix, b->call_id, sizeof b->call_id);
	}
	ksv_oai_rand_id(kind == KSV_BLK_TEXT ? "msg_" : kind == KSV_BLK_REASONING ? "rs_" : "fc_", b->item_id,
			sizeof b->item_id);
	a->open = 1;
	a->w->open(a, b, a->stream ? out : NULL);
	return b;
}

static void add_text(struct ksv_answer *a, const char *t, size_t n, struct kv_buf *out)
{
	struct ksv_block *b = &a->blk[a->n_blk - 1];
	kv_buf_add(&b->text, t, n);
	if (n)
		a->w->delta(a, b, t, n, a->stream ? out : NULL);
}

void ksv_answer_event(struct ksv_answer *a, const struct kv_out_ev *e, struct kv_buf *out)
{
	int open_kind = a->open ? a->blk[a->n_blk - 1].kind : 0;
	switch (e->kind) {
	case KV_OUT_CONTENT:
	case KV_OUT_REASONING: {
		int kind = e->kind == KV_OUT_CONTENT ? KSV_BLK_TEXT : KSV_BLK_REASONING;
		if (open_kind != kind && (!e->len || !open_block(a, kind, NULL, out)))
			return;
		add_text(a, e->text, e->len, out);
		break;
	}
	case KV_OUT_TOOL_START:
		open_block(a, KSV_BLK_TOOL, e->name, out);
		break;
	case KV_OUT_TOOL_ARGS:
		if (open_kind == KSV_BLK_TOOL)
			add_text(a, e->text, e->len, out);
		break;
	case KV_OUT_TOOL_END:
		if (open_kind == KSV_BLK_TOOL)
			ksv_answer_close(a, out);
		break;
	}
}

void ksv_answer_token(struct ksv_answer *a, const struct kss_token *t)
{
	if (!a->logprobs)
		return;
	if (a->stream)
		a->n_lps = 0; /* a stream sends each token's at once: keep one */
	if (a->n_lps == a->cap_lps) {
		size_t nc = a->cap_lps ? a->cap_lps * 2 : 64;
		struct ksv_lp_rec *n = realloc(a->lps, nc * sizeof *n);
		if (!n)
			return;
		a->lps = n;
		a->cap_lps = nc;
	}
	struct ksv_lp_rec *r = &a->lps[a->n_lps++];
	r->id = t->id;
	r->lp = t->logprob;
	r->n_top = t->n_top;
	for (int i = 0; i < t->n_top; i++) {
		r->top_id[i] = t->top_id[i];
		r->top_lp[i] = t->top_lp[i];
	}
	a->lp_pending = 1;
}

char *ksv_answer_text(const struct ksv_answer *a, int kind, size_t *len)
{
	struct kv_buf b = KV_BUF_INIT;
	int any = 0;
	for (size_t i = 0; i < a->n_blk; i++)
		if (a->blk[i].kind == kind) {
			kv_buf_add(&b, a->blk[i].text.p ? a->blk[i].text.p : "", a->blk[i].text.len);
			any = 1;
		}
	*len = b.len;
	if (!any || b.oom) {
		kv_buf_free(&b);
		*len = 0;
		return NULL;
	}
	return b.p ? kv_buf_take(&b) : strdup("");
}

/* --- helpers of the formatters ---------------------------------------------- */

int ksv_wire_bad(char *param, size_t cap, const char *path, const char *fmt, const char *detail)
{
	snprintf(param, cap, "%s", path);
	return kv_fail(KV_ERR_INVALID, fmt, path, detail ? detail : "");
}

int ksv_wire_is(const json_t *j, const char *s)
{
	size_t n = strlen(s);
	return json_is_string(j) && json_string_length(j) == n && !memcmp(json_string_value(j), s, n);
}

json_t *ksv_wire_buf_string(const struct kv_buf *b)
{
	return json_stringn(b->p ? b->p : "", b->len);
}

void ksv_wire_add_function(json_t *out, const char *name, const json_t *description, const json_t *schema)
{
	json_t *fn = json_pack("{s:s}", "name", name);
	if (json_is_string(description))
		json_object_set(fn, "description", (json_t *)description);
	if (schema)
		json_object_set(fn, "parameters", (json_t *)schema);
	json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
}

void ksv_wire_usage_ext(const struct ksv_answer *a, json_t *usage)
{
	if (a->ext && usage)
		json_object_set(usage, "kvkeep", a->ext);
}

json_t *ksv_explain_json(const struct kss_explain *e, int with_cached)
{
	json_t *j = json_object();
	json_object_set_new(j, "shared_tokens", json_integer(e->shared));
	json_object_set_new(j, "first_diff", e->shared < e->prompt_tokens ? json_integer(e->shared) : json_null());
	json_object_set_new(j, "message", e->message >= 0 ? json_integer(e->message) : json_null());
	json_object_set_new(j, "role", e->role[0] ? json_string(e->role) : json_null());
	json_object_set_new(j, "tool", e->tool >= 0 ? json_integer(e->tool) : json_null());
	json_object_set_new(j, "new", ksv_json_text(e->new_text, strlen(e->new_text)));
	/* the cached side is what another client sent: only for a trusted
	 * caller (auth.h ksv_auth_trusted) */
	json_object_set_new(j, "cached", with_cached && e->cached_text[0]
						 ? ksv_json_text(e->cached_text, strlen(e->cached_text))
						 : json_null());
	return j;
}

void ksv_wire_copy_sampling(const json_t *body, json_t *chat)
{
	static const char *const copy[] = {"temperature", "top_p", "top_k", "stream", "min_p", "seed", "presence_penalty",
					   "frequency_penalty", "repetition_penalty", "speculative"};
	json_t *v;
	for (size_t k = 0; k < sizeof copy / sizeof *copy; k++)
		if ((v = json_object_get(body, copy[k])) && !json_is_null(v))
			json_object_set(chat, copy[k], v);
	if (json_is_true(json_object_get(body, "stream")))
		json_object_set_new(chat, "stream_options", json_pack("{s:b}", "include_usage", 1));
}

int ksv_wire_translated(int rc, json_t *msgs, json_t *chat, json_t **out)
{
	json_decref(msgs);
	if (rc)
		json_decref(chat);
	else
		*out = chat;
	return rc;
}

int ksv_wire_chat_req(int rc, json_t *chat, const char *param, struct ksv_req *req)
{
	memset(req, 0, sizeof *req);
	if (rc) {
		snprintf(req->err_param, sizeof req->err_param, "%s", param);
		return KV_ERR_INVALID;
	}
	return ksv_req_parse_json(KSV_API_CHAT, chat, req);
}

int ksv_wire_join_text(const json_t *c, const char *path, const char *what,
		       int (*part)(const json_t *item, const char *path, struct kv_buf *out, char *param, size_t cap),
		       struct kv_buf *out, char *param, size_t cap)
{
	char p[160];
	if (json_is_string(c)) {
		kv_buf_add(out, json_string_value(c), json_string_length(c));
		return KV_OK;
	}
	if (!json_is_array(c))
		return ksv_wire_bad(param, cap, path, "%s: must be a string or a list of %s", what);
	size_t i;
	const json_t *item;
	json_array_foreach(c, i, item) {
		snprintf(p, sizeof p, "%s[%zu]", path, i);
		if (i)
			kv_buf_adds(out, "\n");
		int rc = part(item, p, out, param, cap);
		if (rc)
			return rc;
	}
	return KV_OK;
}

int ksv_wire_translate_begin(const json_t *body, json_t **out, char *param, size_t cap, json_t **chat, json_t **msgs)
{
	*out = NULL;
	param[0] = 0;
	if (!json_is_object(body))
		return ksv_wire_bad(param, cap, "", "request body%s: must be a JSON object%s", NULL);
	*chat = json_object();
	*msgs = json_array();
	return KV_OK;
}
