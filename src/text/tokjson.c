/*
 * tokjson.c - the streaming tokenizer.json reader (tokjson.h).
 */
#include "text/tokjson.h"
#include "base/err.h"
#include "base/json.h"
#include "base/utf8.h"

#include <stdlib.h>
#include <string.h>

static int tj_err(struct tj *r, const char *msg)
{
	return kv_fail(KV_ERR_INVALID, "%s: %s%sJSON error at byte %zu: %s", r->what, r->ctx ? r->ctx : "",
		       r->ctx ? ": " : "", r->i, msg);
}

static void tj_ws(struct tj *r)
{
	while (r->i < r->n && (r->p[r->i] == ' ' || r->p[r->i] == '\n' || r->p[r->i] == '\r' || r->p[r->i] == '\t'))
		r->i++;
}

static int tj_hex4(struct tj *r, uint32_t *v)
{
	*v = 0;
	if (r->n - r->i < 4)
		return tj_err(r, "truncated \\u escape");
	for (int k = 0; k < 4; k++) {
		char c = r->p[r->i++];
		*v <<= 4;
		if (c >= '0' && c <= '9')
			*v |= (uint32_t)(c - '0');
		else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
			*v |= (uint32_t)((c | 0x20) - 'a' + 10);
		else
			return tj_err(r, "bad \\u escape");
	}
	return KV_OK;
}

/* A string at the cursor, decoded into the arena. */
static int tj_string(struct tj *r, struct tj_str *out)
{
	const uint8_t *p = (const uint8_t *)r->p;
	size_t start;
	if (r->i >= r->n || p[r->i] != '"')
		return tj_err(r, "expected a string");
	r->i++;
	out->off = (uint32_t)r->arena.len;
	for (;;) {
		start = r->i;
		while (r->i < r->n && p[r->i] != '"' && p[r->i] != '\\' && p[r->i] >= 0x20 && p[r->i] < 0x80)
			r->i++;
		kv_buf_add(&r->arena, p + start, r->i - start);
		if (r->i >= r->n)
			return tj_err(r, "unterminated string");
		uint8_t c = p[r->i];
		if (c == '"') {
			r->i++;
			break;
		}
		if (c < 0x20)
			return tj_err(r, "control character in a string");
		if (c >= 0x80) {
			int k = kv_utf8_seq(p + r->i, r->n - r->i);
			if (k <= 0)
				return tj_err(r, "invalid UTF-8 in a string");
			kv_buf_add(&r->arena, p + r->i, (size_t)k);
			r->i += (size_t)k;
			continue;
		}
		/* backslash */
		if (++r->i >= r->n)
			return tj_err(r, "unterminated string");
		c = p[r->i++];
		uint32_t u, lo;
		uint8_t enc[4];
		int rc;
		switch (c) {
		case '"': case '\\': case '/':
			kv_buf_addc(&r->arena, (char)c);
			break;
		case 'b': kv_buf_addc(&r->arena, '\b'); break;
		case 'f': kv_buf_addc(&r->arena, '\f'); break;
		case 'n': kv_buf_addc(&r->arena, '\n'); break;
		case 'r': kv_buf_addc(&r->arena, '\r'); break;
		case 't': kv_buf_addc(&r->arena, '\t'); break;
		case 'u':
			if ((rc = tj_hex4(r, &u)))
				return rc;
			if (u >= 0xDC00 && u <= 0xDFFF)
				return tj_err(r, "lone low surrogate in \\u escape");
			if (u >= 0xD800 && u <= 0xDBFF) {
				if (r->n - r->i < 6 || p[r->i] != '\\' || p[r->i + 1] != 'u')
					return tj_err(r, "lone high surrogate in \\u escape");
				r->i += 2;
				if ((rc = tj_hex4(r, &lo)))
					return rc;
				if (lo < 0xDC00 || lo > 0xDFFF)
					return tj_err(r, "bad surrogate pair in \\u escape");
				u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
			}
			kv_buf_add(&r->arena, enc, (size_t)kv_utf8_encode(u, enc));
			break;
		default:
			return tj_err(r, "bad escape in a string");
		}
	}
	if (r->arena.oom || r->arena.len > UINT32_MAX)
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", r->what);
	out->len = (uint32_t)(r->arena.len - out->off);
	return KV_OK;
}

static int tj_atom_char(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c == '+' || c == '-' || c == '.' || c == 'E';
}

/* Skip any value (structure checked; jansson checks the details of the
 * values it is given afterwards). */
static int tj_skip(struct tj *r)
{
	tj_ws(r);
	if (r->i >= r->n)
		return tj_err(r, "unexpected end");
	char c = r->p[r->i];
	if (c == '"') {
		for (r->i++; r->i < r->n && r->p[r->i] != '"'; r->i++)
			if (r->p[r->i] == '\\')
				r->i++;
		if (r->i >= r->n)
			return tj_err(r, "unterminated string");
		r->i++;
		return KV_OK;
	}
	if (c == '{' || c == '[') {
		char close = c == '{' ? '}' : ']';
		int rc;
		if (++r->depth > KV_JSON_MAX_DEPTH)
			return tj_err(r, "nested too deep");
		r->i++;
		tj_ws(r);
		if (r->i < r->n && r->p[r->i] == close) {
			r->i++;
			r->depth--;
			return KV_OK;
		}
		for (;;) {
			if (c == '{') {
				tj_ws(r);
				if (r->i >= r->n || r->p[r->i] != '"')
					return tj_err(r, "expected a key");
				if ((rc = tj_skip(r)))
					return rc;
				tj_ws(r);
				if (r->i >= r->n || r->p[r->i] != ':')
					return tj_err(r, "expected ':'");
				r->i++;
			}
			if ((rc = tj_skip(r)))
				return rc;
			tj_ws(r);
			if (r->i < r->n && r->p[r->i] == ',') {
				r->i++;
				continue;
			}
			if (r->i < r->n && r->p[r->i] == close) {
				r->i++;
				r->depth--;
				return KV_OK;
			}
			return tj_err(r, "expected ',' or a closing bracket");
		}
	}
	/* number or literal: a run of their characters */
	size_t s0 = r->i;
	while (r->i < r->n && tj_atom_char(r->p[r->i]))
		r->i++;
	if (r->i == s0)
		return tj_err(r, "expected a value");
	return KV_OK;
}

/* Skip a value and parse it with jansson. *out is a new reference. */
static int tj_capture(struct tj *r, const char *key, json_t **out)
{
	json_error_t e;
	size_t s0;
	int rc;
	tj_ws(r);
	s0 = r->i;
	r->ctx = key;
	rc = tj_skip(r);
	r->ctx = NULL;
	if (rc)
		return rc;
	*out = json_loadb(r->p + s0, r->i - s0, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);
	if (!*out)
		return kv_fail(KV_ERR_INVALID, "%s: %s: JSON error at byte %zu: %s", r->what, key, s0 + (size_t)e.position,
			       e.text);
	return KV_OK;
}

/* An integer id: digits only (jansson would make 1.0 a real). Anything
 * else is skipped and gives -1. */
static int tj_id(struct tj *r, int64_t *id)
{
	size_t s0;
	int64_t v = 0;
	tj_ws(r);
	s0 = r->i;
	while (r->i < r->n && r->p[r->i] >= '0' && r->p[r->i] <= '9' && r->i - s0 < 12)
		v = v * 10 + (r->p[r->i++] - '0');
	if (r->i > s0 && r->i < r->n && !tj_atom_char(r->p[r->i]) && !(r->p[s0] == '0' && r->i - s0 > 1)) {
		*id = v;
		return KV_OK;
	}
	r->i = s0;
	*id = -1;
	return tj_skip(r);
}

static int tj_grow(void **arr, size_t *cap, size_t n, size_t elem)
{
	if (n < *cap)
		return KV_OK;
	size_t nc = *cap ? *cap * 2 : 1024;
	void *na = realloc(*arr, nc * elem);
	if (!na)
		return KV_ERR_NOMEM;
	*arr = na;
	*cap = nc;
	return KV_OK;
}

static int tj_vocab(struct tj *r)
{
	int rc;
	r->i++; /* '{' */
	tj_ws(r);
	if (r->i < r->n && r->p[r->i] == '}') {
		r->i++;
		return KV_OK;
	}
	for (;;) {
		struct tj_vocab v;
		tj_ws(r);
		if ((rc = tj_string(r, &v.s)))
			return rc;
		tj_ws(r);
		if (r->i >= r->n || r->p[r->i] != ':')
			return tj_err(r, "expected ':'");
		r->i++;
		if ((rc = tj_id(r, &v.id)))
			return rc;
		if (tj_grow((void **)&r->vocab, &r->c_vocab, r->n_vocab, sizeof *r->vocab))
			return kv_fail(KV_ERR_NOMEM, "%s: out of memory", r->what);
		r->vocab[r->n_vocab++] = v;
		tj_ws(r);
		if (r->i < r->n && r->p[r->i] == ',') {
			r->i++;
			continue;
		}
		if (r->i < r->n && r->p[r->i] == '}') {
			r->i++;
			return KV_OK;
		}
		return tj_err(r, "expected ',' or '}' in model.vocab");
	}
}

/* One merges entry: "a b" or ["a", "b"]; anything else is skipped and
 * recorded as malformed (the loader names its index). */
static int tj_merge(struct tj *r, struct tj_merge *m)
{
	size_t s0;
	int rc;
	tj_ws(r);
	s0 = r->i;
	memset(m, 0, sizeof *m);
	if (r->i < r->n && r->p[r->i] == '"') {
		struct tj_str whole;
		const char *str, *sp;
		if ((rc = tj_string(r, &whole)))
			return rc;
		str = r->arena.p + whole.off;
		sp = memchr(str, ' ', whole.len);
		if (!sp || memchr(sp + 1, ' ', whole.len - (size_t)(sp + 1 - str))) {
			m->a.len = UINT32_MAX;
			return KV_OK;
		}
		m->a = (struct tj_str){whole.off, (uint32_t)(sp - str)};
		m->b = (struct tj_str){whole.off + m->a.len + 1, whole.len - m->a.len - 1};
		return KV_OK;
	}
	if (r->i < r->n && r->p[r->i] == '[') {
		r->i++;
		tj_ws(r);
		if (r->i < r->n && r->p[r->i] == '"' && !tj_string(r, &m->a)) {
			tj_ws(r);
			if (r->i < r->n && r->p[r->i] == ',') {
				r->i++;
				tj_ws(r);
				if (r->i < r->n && r->p[r->i] == '"' && !tj_string(r, &m->b)) {
					tj_ws(r);
					if (r->i < r->n && r->p[r->i] == ']') {
						r->i++;
						m->pair = 1;
						return KV_OK;
					}
				}
			}
		}
		kv_errclear();
		r->i = s0;
	}
	m->a.len = UINT32_MAX;
	return tj_skip(r);
}

static int tj_merges(struct tj *r)
{
	int rc;
	r->i++; /* '[' */
	tj_ws(r);
	if (r->i < r->n && r->p[r->i] == ']') {
		r->i++;
		return KV_OK;
	}
	for (;;) {
		if (tj_grow((void **)&r->merges, &r->c_merges, r->n_merges, sizeof *r->merges))
			return kv_fail(KV_ERR_NOMEM, "%s: out of memory", r->what);
		if ((rc = tj_merge(r, &r->merges[r->n_merges])))
			return rc;
		r->n_merges++;
		tj_ws(r);
		if (r->i < r->n && r->p[r->i] == ',') {
			r->i++;
			continue;
		}
		if (r->i < r->n && r->p[r->i] == ']') {
			r->i++;
			return KV_OK;
		}
		return tj_err(r, "expected ',' or ']' in model.merges");
	}
}

/* An object whose members go to `obj` through jansson, except the ones
 * `special` consumes (it returns 1 when it did). */
static int tj_object(struct tj *r, json_t *obj, const char *ctx, int (*special)(struct tj *, const char *, size_t))
{
	int rc;
	tj_ws(r);
	if (r->i >= r->n || r->p[r->i] != '{')
		return tj_err(r, "expected an object");
	r->i++;
	tj_ws(r);
	if (r->i < r->n && r->p[r->i] == '}') {
		r->i++;
		return KV_OK;
	}
	for (;;) {
		struct tj_str k;
		char key[64];
		json_t *v;
		tj_ws(r);
		if ((rc = tj_string(r, &k)))
			return rc;
		snprintf(key, sizeof key, "%s%.*s", ctx, (int)(k.len < 40 ? k.len : 40), r->arena.p + k.off);
		tj_ws(r);
		if (r->i >= r->n || r->p[r->i] != ':')
			return tj_err(r, "expected ':'");
		r->i++;
		tj_ws(r);
		if (json_object_getn(obj, r->arena.p + k.off, k.len) ||
		    (special && !strcmp(ctx, "model.") && k.len == 5 && !memcmp(r->arena.p + k.off, "vocab", 5) &&
		     r->has_vocab) ||
		    (special && !strcmp(ctx, "model.") && k.len == 6 && !memcmp(r->arena.p + k.off, "merges", 6) &&
		     r->has_merges))
			return kv_fail(KV_ERR_INVALID, "%s: duplicate key \"%s\"", r->what, key);
		rc = special ? special(r, r->arena.p + k.off, k.len) : 0;
		if (rc < 0)
			return rc;
		if (rc == 0) {
			if ((rc = tj_capture(r, key, &v)))
				return rc;
			if (json_object_setn_new(obj, r->arena.p + k.off, k.len, v))
				return kv_fail(KV_ERR_NOMEM, "%s: out of memory", r->what);
		}
		tj_ws(r);
		if (r->i < r->n && r->p[r->i] == ',') {
			r->i++;
			continue;
		}
		if (r->i < r->n && r->p[r->i] == '}') {
			r->i++;
			return KV_OK;
		}
		return tj_err(r, "expected ',' or '}'");
	}
}

static int tj_model_member(struct tj *r, const char *k, size_t kl)
{
	int rc;
	if (kl == 5 && !memcmp(k, "vocab", 5) && r->i < r->n && r->p[r->i] == '{') {
		r->has_vocab = 1;
		return (rc = tj_vocab(r)) ? rc : 1;
	}
	if (kl == 6 && !memcmp(k, "merges", 6) && r->i < r->n && r->p[r->i] == '[') {
		r->has_merges = 1;
		return (rc = tj_merges(r)) ? rc : 1;
	}
	return 0;
}

static int tj_root_member(struct tj *r, const char *k, size_t kl)
{
	int rc;
	json_t *model;
	if (!(kl == 5 && !memcmp(k, "model", 5) && r->i < r->n && r->p[r->i] == '{'))
		return 0;
	model = json_object();
	if (!model)
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", r->what);
	/* set first: the key is then known to the duplicate check */
	if (json_object_set_new(r->root, "model", model))
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", r->what);
	return (rc = tj_object(r, model, "model.", tj_model_member)) ? rc : 1;
}

void kv_tokjson_free(struct tj *r)
{
	json_decref(r->root);
	kv_buf_free(&r->arena);
	free(r->vocab);
	free(r->merges);
}

int kv_tokjson_read(struct tj *r, const char *p, size_t n, const char *what)
{
	int rc;
	memset(r, 0, sizeof *r);
	r->what = what;
	r->p = p;
	r->n = n;
	r->root = json_object();
	if (!r->root)
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
	tj_ws(r);
	if (r->i < r->n && r->p[r->i] != '{')
		return kv_fail(KV_ERR_INVALID, "%s: not a JSON object", what);
	if ((rc = tj_object(r, r->root, "", tj_root_member)))
		return rc;
	tj_ws(r);
	if (r->i != r->n)
		return tj_err(r, "text after the top-level object");
	return KV_OK;
}
