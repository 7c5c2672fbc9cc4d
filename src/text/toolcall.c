/*
 * toolcall.c - tool calls in generated text (toolcall.h has the formats).
 *
 * The streaming parser is a three-state machine over a buffer of text not
 * yet reported:
 *   CONTENT  report text up to the next opener ("<tool_call>", and in the
 *            XML form also a bare "<function="); keep back a tail that is
 *            a proper prefix of an opener, since the next chunk may finish
 *            it;
 *   CALL     collect the body until the matching closer ("</tool_call>",
 *            "</function>"), then parse it: a good call becomes the three
 *            call events, a bad one goes out as content, byte for byte;
 *   AFTER    whitespace after a call is held; it is dropped if another
 *            call or the end follows, reported if other text follows;
 *   SKIP     a call body grew past max_call_bytes: everything up to and
 *            including its closer is content (the same events whether the
 *            closer arrived in the same chunk or much later).
 * Everything the parser holds is in one kv_buf; each feed appends to it
 * and consumes what it can, so chunk boundaries (single bytes included)
 * never change the events.
 */
#include "text/toolcall.h"
#include "base/buf.h"
#include "base/err.h"
#include "base/json.h"
#include "base/utf8.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { S_CONTENT, S_CALL, S_AFTER, S_SKIP };

static const char *const openers[] = {"<tool_call>", "<function=", "<TOOLCALL>"};
static const char *const closers[] = {"</tool_call>", "</function>", "</TOOLCALL>"};

/* The openers a format looks for: [*o0, *o1) of openers[]. */
static void opener_range(int format, int *o0, int *o1)
{
	*o0 = format == KV_TC_LIST ? 2 : 0;
	*o1 = format == KV_TC_XML ? 2 : format == KV_TC_LIST ? 3 : 1;
}

struct kv_tc_parser {
	int format;
	const json_t *tools;   /* borrowed */
	size_t max_call;
	int state;
	int opener;            /* S_CALL: index into openers */
	struct kv_buf pend;    /* text not reported yet (S_CALL: the body) */
	int n_calls;
};

int kv_tc_parser_create(const struct kv_tc_params *prm, struct kv_tc_parser **out)
{
	struct kv_tc_parser *p = calloc(1, sizeof *p);
	*out = NULL;
	if (!p)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	if (prm) {
		if (prm->format != KV_TC_JSON && prm->format != KV_TC_XML && prm->format != KV_TC_LIST) {
			free(p);
			return kv_fail(KV_ERR_INVALID, "tool-call format %d is unknown", prm->format);
		}
		if (prm->tools && !json_is_array(prm->tools) && !json_is_null(prm->tools)) {
			free(p);
			return kv_fail(KV_ERR_INVALID, "tools must be an array");
		}
		p->format = prm->format;
		p->tools = prm->tools;
		p->max_call = prm->max_call_bytes;
	}
	if (!p->max_call)
		p->max_call = KV_TC_DEFAULT_MAX_CALL;
	*out = p;
	return KV_OK;
}

void kv_tc_parser_free(struct kv_tc_parser *p)
{
	if (!p)
		return;
	kv_buf_free(&p->pend);
	free(p);
}

int kv_tc_count(const struct kv_tc_parser *p)
{
	return p->n_calls;
}

/* --- JSON helpers -------------------------------------------------------- */

static const char *js_ws(const char *p, const char *e)
{
	while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
		p++;
	return p;
}

/* End of the JSON string starting at p (on the quote), or NULL. */
static const char *js_str_end(const char *p, const char *e)
{
	for (p++; p < e; p++) {
		if (*p == '\\') {
			p++;
			continue;
		}
		if (*p == '"')
			return p + 1;
	}
	return NULL;
}

/* End of one JSON value at p (no leading whitespace), or NULL. Only the
 * shape is checked here; jansson validated the whole body already. */
static const char *js_skip(const char *p, const char *e, int depth)
{
	if (p >= e || depth > KV_TC_MAX_DEPTH)
		return NULL;
	if (*p == '"')
		return js_str_end(p, e);
	if (*p == '{' || *p == '[') {
		char close = *p == '{' ? '}' : ']';
		p = js_ws(p + 1, e);
		if (p < e && *p == close)
			return p + 1;
		for (;;) {
			if (close == '}') {
				if (p >= e || *p != '"' || !(p = js_str_end(p, e)))
					return NULL;
				p = js_ws(p, e);
				if (p >= e || *p != ':')
					return NULL;
				p = js_ws(p + 1, e);
			}
			if (!(p = js_skip(p, e, depth + 1)))
				return NULL;
			p = js_ws(p, e);
			if (p < e && *p == ',') {
				p = js_ws(p + 1, e);
				continue;
			}
			return p < e && *p == close ? p + 1 : NULL;
		}
	}
	while (p < e && (isalnum((unsigned char)*p) || *p == '-' || *p == '+' || *p == '.'))
		p++;
	return p;
}

/* Append s as a JSON string, escaped the way Python's json.dumps does
 * with ensure_ascii=False. */
static void js_put_str(struct kv_buf *b, const char *s, size_t n)
{
	kv_buf_addc(b, '"');
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		switch (c) {
		case '"': kv_buf_adds(b, "\\\""); break;
		case '\\': kv_buf_adds(b, "\\\\"); break;
		case '\n': kv_buf_adds(b, "\\n"); break;
		case '\r': kv_buf_adds(b, "\\r"); break;
		case '\t': kv_buf_adds(b, "\\t"); break;
		case '\b': kv_buf_adds(b, "\\b"); break;
		case '\f': kv_buf_adds(b, "\\f"); break;
		default:
			if (c < 0x20)
				kv_buf_printf(b, "\\u%04x", c);
			else
				kv_buf_addc(b, (char)c);
		}
	}
	kv_buf_addc(b, '"');
}

/* The arguments become JSON strings: what jansson's json_stringn accepts
 * (valid UTF-8; NUL bytes are allowed; a NULL pointer is not). */
static int valid_utf8(const char *s, size_t n)
{
	return s && kv_utf8_valid(s, n);
}

/* --- the JSON form ----------------------------------------------------------- */

/* Parse a Qwen3 call body into name and arguments (the model's bytes of
 * the arguments value). 0 on success, -1 if malformed. */
static int parse_json_call(const char *b, size_t n, struct kv_buf *name, struct kv_buf *args)
{
	json_error_t e;
	json_t *root;
	const char *s = b, *end = b + n;
	s = js_ws(s, end);
	while (end > s && (end[-1] == ' ' || end[-1] == '\n' || end[-1] == '\r' || end[-1] == '\t'))
		end--;
	if (s >= end || *s != '{' || kv_json_text_depth(s, (size_t)(end - s)) > KV_TC_MAX_DEPTH + 1)
		return -1;
	root = json_loadb(s, (size_t)(end - s), JSON_REJECT_DUPLICATES, &e);
	if (!json_is_object(root)) {
		json_decref(root);
		return -1;
	}
	json_t *nm = json_object_get(root, "name");
	const char *akey = json_object_get(root, "arguments") ? "arguments"
			   : json_object_get(root, "parameters") ? "parameters" : NULL;
	json_t *av = akey ? json_object_get(root, akey) : NULL;
	int rc = -1;
	if (!json_is_string(nm) || !json_string_length(nm) || (av && !json_is_object(av) && !json_is_string(av)))
		goto done;
	kv_buf_add(name, json_string_value(nm), json_string_length(nm));
	if (!av) {
		kv_buf_adds(args, "{}");
		rc = 0;
		goto done;
	}
	if (json_is_string(av)) {
		/* double-encoded: the string must hold a JSON object */
		json_t *inner;
		if (kv_json_text_depth(json_string_value(av), json_string_length(av)) > KV_TC_MAX_DEPTH)
			goto done;
		inner = json_loadb(json_string_value(av), json_string_length(av), 0, &e);
		if (json_is_object(inner)) {
			kv_buf_add(args, json_string_value(av), json_string_length(av));
			rc = 0;
		}
		json_decref(inner);
		goto done;
	}
	/* find the raw bytes of the arguments value in the top-level object */
	const char *p = js_ws(s + 1, end);
	while (p < end && *p == '"') {
		const char *ke = js_str_end(p, end);
		if (!ke)
			goto done;
		json_t *key = json_loadb(p, (size_t)(ke - p), JSON_DECODE_ANY, &e);
		int hit = json_is_string(key) && !strcmp(json_string_value(key), akey);
		json_decref(key);
		p = js_ws(ke, end);
		if (p >= end || *p != ':')
			goto done;
		p = js_ws(p + 1, end);
		const char *ve = js_skip(p, end, 1);
		if (!ve)
			goto done;
		if (hit) {
			kv_buf_add(args, p, (size_t)(ve - p));
			rc = 0;
			goto done;
		}
		p = js_ws(ve, end);
		if (p < end && *p == ',')
			p = js_ws(p + 1, end);
	}
done:
	json_decref(root);
	return rc;
}

/* --- the XML form ------------------------------------------------------------ */

/* The JSON schema type wanted for parameter pname of tool fname: a bit set
 * of T_* (0 = unknown: keep a string). */
enum { T_STRING = 1, T_INTEGER = 2, T_NUMBER = 4, T_BOOLEAN = 8, T_OBJECT = 16, T_ARRAY = 32, T_NULL = 64 };

static int type_bits(const json_t *t)
{
	const char *s = json_string_value(t);
	if (!s)
		return 0;
	if (!strcmp(s, "string"))
		return T_STRING;
	if (!strcmp(s, "integer"))
		return T_INTEGER;
	if (!strcmp(s, "number"))
		return T_NUMBER;
	if (!strcmp(s, "boolean"))
		return T_BOOLEAN;
	if (!strcmp(s, "object"))
		return T_OBJECT;
	if (!strcmp(s, "array"))
		return T_ARRAY;
	if (!strcmp(s, "null"))
		return T_NULL;
	return 0;
}

static int schema_types(const json_t *schema, int depth)
{
	int bits = 0;
	size_t i;
	json_t *v;
	if (!json_is_object(schema) || depth > 4)
		return 0;
	json_t *t = json_object_get(schema, "type");
	if (json_is_string(t))
		bits |= type_bits(t);
	else if (json_is_array(t))
		json_array_foreach(t, i, v) bits |= type_bits(v);
	static const char *const alts[] = {"anyOf", "oneOf"};
	for (int a = 0; a < 2; a++) {
		json_t *l = json_object_get(schema, alts[a]);
		if (json_is_array(l))
			json_array_foreach(l, i, v) bits |= schema_types(v, depth + 1);
	}
	return bits;
}

static int param_types(const json_t *tools, const char *fname, const char *pname)
{
	size_t i;
	json_t *t;
	if (!json_is_array(tools))
		return 0;
	json_array_foreach(tools, i, t) {
		json_t *fn = json_object_get(t, "function");
		if (!fn)
			fn = t;
		const char *n = json_string_value(json_object_get(fn, "name"));
		if (n && !strcmp(n, fname))
			return schema_types(json_object_get(json_object_get(json_object_get(fn, "parameters"), "properties"),
							    pname), 0);
	}
	return 0;
}

static int is_json_number(const char *s, size_t n)
{
	size_t i = 0;
	if (i < n && s[i] == '-')
		i++;
	if (i >= n || !isdigit((unsigned char)s[i]))
		return 0;
	if (s[i] == '0')
		i++;
	else
		while (i < n && isdigit((unsigned char)s[i]))
			i++;
	if (i < n && s[i] == '.') {
		i++;
		if (i >= n || !isdigit((unsigned char)s[i]))
			return 0;
		while (i < n && isdigit((unsigned char)s[i]))
			i++;
	}
	if (i < n && (s[i] == 'e' || s[i] == 'E')) {
		i++;
		if (i < n && (s[i] == '+' || s[i] == '-'))
			i++;
		if (i >= n || !isdigit((unsigned char)s[i]))
			return 0;
		while (i < n && isdigit((unsigned char)s[i]))
			i++;
	}
	return i == n;
}

static int ieq(const char *s, size_t n, const char *w)
{
	return strlen(w) == n && !strncasecmp(s, w, n);
}

/* Append the JSON for one parameter value, coerced with the schema. */
static int put_value(struct kv_buf *b, const char *v, size_t n, int types)
{
	const char *s = v, *e = v + n;
	while (s < e && isspace((unsigned char)*s))
		s++;
	while (e > s && isspace((unsigned char)e[-1]))
		e--;
	size_t m = (size_t)(e - s);
	if ((types & T_NULL) && (ieq(s, m, "null") || ieq(s, m, "none"))) {
		kv_buf_adds(b, "null");
		return 0;
	}
	if ((types & T_INTEGER) && m && m < 40) {
		char tmp[48], *end;
		memcpy(tmp, s, m);
		tmp[m] = 0;
		errno = 0;
		long long x = strtoll(tmp, &end, 10);
		if (!errno && *end == 0 && end != tmp && (isdigit((unsigned char)tmp[0]) || tmp[0] == '-' || tmp[0] == '+')) {
			kv_buf_printf(b, "%lld", x);
			return 0;
		}
	}
	if ((types & (T_NUMBER | T_INTEGER)) && is_json_number(s, m)) {
		kv_buf_add(b, s, m);
		return 0;
	}
	if ((types & T_BOOLEAN) && (ieq(s, m, "true") || ieq(s, m, "false"))) {
		kv_buf_adds(b, (s[0] | 0x20) == 't' ? "true" : "false");
		return 0;
	}
	if ((types & (T_OBJECT | T_ARRAY)) && m && (*s == '{' || *s == '[')) {
		if (kv_json_text_depth(s, m) > KV_TC_MAX_DEPTH)
			return -1; /* too deep: the whole call is malformed */
		json_error_t je;
		json_t *j = json_loadb(s, m, 0, &je);
		int ok = (json_is_object(j) && (types & T_OBJECT)) || (json_is_array(j) && (types & T_ARRAY));
		json_decref(j);
		if (ok) {
			kv_buf_add(b, s, m);
			return 0;
		}
	}
	if (!valid_utf8(v, n))
		return -1;
	js_put_str(b, v, n);
	return 0;
}

static const char *find(const char *p, const char *e, const char *w)
{
	size_t n = strlen(w);
	if ((size_t)(e - p) < n)
		return NULL;
	return memmem(p, (size_t)(e - p), w, n);
}

static int starts(const char *p, const char *e, const char *w)
{
	size_t n = strlen(w);
	return (size_t)(e - p) >= n && !memcmp(p, w, n);
}

/* Parse "<function=NAME>(<parameter=P>\nV\n</parameter>)*</function>"
 * (surrounded by whitespace) into name and a JSON arguments object. */
static int parse_xml_call(const char *b, size_t n, const json_t *tools, struct kv_buf *name, struct kv_buf *args)
{
	const char *p = b, *e = b + n;
	while (p < e && isspace((unsigned char)*p))
		p++;
	if (!starts(p, e, "<function="))
		return -1;
	p += 10;
	const char *gt = memchr(p, '>', (size_t)(e - p));
	if (!gt || gt == p || gt - p > 256 || memchr(p, '\n', (size_t)(gt - p)) || memchr(p, '<', (size_t)(gt - p)))
		return -1;
	kv_buf_add(name, p, (size_t)(gt - p));
	if (!valid_utf8(name->p, name->len))
		return -1;
	p = gt + 1;
	kv_buf_addc(args, '{');
	int np = 0;
	for (;;) {
		while (p < e && isspace((unsigned char)*p))
			p++;
		if (p >= e)
			break; /* lenient: no </function> */
		if (starts(p, e, "</function>")) {
			p += 11;
			break;
		}
		if (!starts(p, e, "<parameter="))
			return -1;
		p += 11;
		gt = memchr(p, '>', (size_t)(e - p));
		if (!gt || gt == p || gt - p > 256 || memchr(p, '\n', (size_t)(gt - p)) || memchr(p, '<', (size_t)(gt - p)))
			return -1;
		const char *pn = p;
		size_t pnl = (size_t)(gt - p);
		p = gt + 1;
		/* the value ends at </parameter>, or (lenient) at the next
		 * <parameter= or </function> */
		const char *ve = find(p, e, "</parameter>"), *next = find(p, e, "<parameter="), *fend = find(p, e, "</function>");
		const char *stop = ve;
		if (next && (!stop || next < stop))
			stop = next;
		if (fend && (!stop || fend < stop))
			stop = fend;
		if (!stop)
			stop = e;
		const char *vs = p, *vend = stop;
		if (vs < vend && *vs == '\n')
			vs++;
		if (vend > vs && vend[-1] == '\n')
			vend--;
		char pname[257];
		memcpy(pname, pn, pnl);
		pname[pnl] = 0;
		if (!valid_utf8(pname, pnl))
			return -1;
		if (np++)
			kv_buf_adds(args, ", ");
		js_put_str(args, pname, pnl);
		kv_buf_adds(args, ": ");
		if (put_value(args, vs, (size_t)(vend - vs), param_types(tools, name->p, pname)))
			return -1;
		p = stop == ve ? ve + 12 : stop;
	}
	while (p < e && isspace((unsigned char)*p))
		p++;
	if (p != e)
		return -1;
	kv_buf_addc(args, '}');
	return 0;
}

/* --- the streaming machine ------------------------------------------------- */

static int emit_text(kv_tc_emit_fn fn, void *ud, int kind, int index, const char *s, size_t n)
{
	struct kv_tc_event ev = {kind, index, s, n};
	if (kind == KV_TC_CONTENT && !n)
		return 0;
	return fn(ud, &ev);
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of an
 * opener (it may be completed by the next chunk). */
static size_t held_tail(const struct kv_tc_parser *p, const char *s, size_t n)
{
	size_t best = 0;
	int o0, o1;
	opener_range(p->format, &o0, &o1);
	for (int o = o0; o < o1; o++) {
		size_t ol = strlen(openers[o]);
		for (size_t k = ol - 1; k > best; k--)
			if (k <= n && !memcmp(s + n - k, openers[o], k)) {
				best = k;
				break;
			}
	}
	return best;
}

/* First opener in s[0..n): its offset (or n) and index in *which. */
static size_t first_opener(const struct kv_tc_parser *p, const char *s, size_t n, int *which)
{
	size_t best = n;
	int o0, o1;
	opener_range(p->format, &o0, &o1);
	for (int o = o0; o < o1; o++) {
		const char *hit = memmem(s, n, openers[o], strlen(openers[o]));
		if (hit && (size_t)(hit - s) < best) {
			best = (size_t)(hit - s);
			*which = o;
		}
	}
	return best;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of cl. */
static size_t held_closer(const char *s, size_t n, const char *cl)
{
	for (size_t k = strlen(cl) - 1; k > 0; k--)
		if (k <= n && !memcmp(s + n - k, cl, k))
			return k;
	return 0;
}

static void consume(struct kv_buf *b, size_t n)
{
	if (!n)
		return;
	memmove(b->p, b->p + n, b->len - n);
	b->len -= n;
	b->p[b->len] = 0;
}

/* A Nemotron-H block: a JSON array whose elements are JSON-form call
 * objects. Each element's name and arguments go to names / args as
 * NUL-separated entries (*n of them); -1 if anything is malformed (then
 * the whole block is content). */
static int parse_list_call(const char *b, size_t n, struct kv_buf *names, struct kv_buf *args, int *count)
{
	const char *s = js_ws(b, b + n), *end = b + n;
	json_error_t e;
	*count = 0;
	while (end > s && (end[-1] == ' ' || end[-1] == '\n' || end[-1] == '\r' || end[-1] == '\t'))
		end--;
	if (s >= end || *s != '[' || kv_json_text_depth(s, (size_t)(end - s)) > KV_TC_MAX_DEPTH + 2)
		return -1;
	json_t *root = json_loadb(s, (size_t)(end - s), JSON_REJECT_DUPLICATES, &e);
	int ok = json_is_array(root) && json_array_size(root) > 0;
	json_decref(root);
	if (!ok)
		return -1;
	const char *p = js_ws(s + 1, end);
	while (p < end && *p != ']') {
		const char *ve = js_skip(p, end, 1);
		struct kv_buf nm = KV_BUF_INIT, ar = KV_BUF_INIT;
		if (!ve || parse_json_call(p, (size_t)(ve - p), &nm, &ar) || memchr(nm.p, 0, nm.len)) {
			kv_buf_free(&nm);
			kv_buf_free(&ar);
			return -1;
		}
		kv_buf_add(names, nm.p, nm.len);
		kv_buf_addc(names, 0);
		kv_buf_add(args, ar.p, ar.len);
		kv_buf_addc(args, 0);
		kv_buf_free(&nm);
		kv_buf_free(&ar);
		(*count)++;
		p = js_ws(ve, end);
		if (p < end && *p == ',')
			p = js_ws(p + 1, end);
	}
	return p < end && *p == ']' && js_ws(p + 1, end) == end ? 0 : -1;
}

/* Parse the call body and report it; a body that does not parse goes out
 * as content, with its tags, exactly as generated. */
static int finish_call(struct kv_tc_parser *p, const char *body, size_t n, int closed, kv_tc_emit_fn fn, void *ud)
{
	struct kv_buf name = KV_BUF_INIT, args = KV_BUF_INIT, raw = KV_BUF_INIT;
	int bad, rc, count = 1;
	if (p->opener == 2) {
		bad = parse_list_call(body, n, &name, &args, &count);
	} else if (p->opener == 1) {
		/* bare <function=...>: parse it with its tags */
		kv_buf_adds(&raw, openers[1]);
		kv_buf_add(&raw, body, n);
		if (closed)
			kv_buf_adds(&raw, closers[1]);
		bad = raw.oom || parse_xml_call(raw.p, raw.len, p->tools, &name, &args);
	} else if (p->format == KV_TC_XML) {
		bad = parse_xml_call(body, n, p->tools, &name, &args);
	} else {
		bad = parse_json_call(body, n, &name, &args);
	}
	if (name.oom || args.oom || raw.oom) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
	} else if (bad) {
		kv_buf_reset(&raw);
		kv_buf_adds(&raw, openers[p->opener]);
		kv_buf_add(&raw, body, n);
		if (closed)
			kv_buf_adds(&raw, closers[p->opener]);
		rc = raw.oom ? kv_fail(KV_ERR_NOMEM, "out of memory")
			     : emit_text(fn, ud, KV_TC_CONTENT, p->n_calls, raw.p, raw.len);
	} else if (p->opener == 2) {
		/* every call of the block, in order (names and args NUL-separated) */
		const char *nm = name.p, *ar = args.p;
		rc = 0;
		for (int k = 0; k < count && !rc; k++) {
			int idx = p->n_calls++;
			size_t nl = strlen(nm), al = strlen(ar);
			if (!(rc = emit_text(fn, ud, KV_TC_CALL_START, idx, nm, nl)) &&
			    !(rc = emit_text(fn, ud, KV_TC_ARGS_DELTA, idx, ar, al)))
				rc = emit_text(fn, ud, KV_TC_CALL_END, idx, NULL, 0);
			nm += nl + 1;
			ar += al + 1;
		}
	} else {
		int idx = p->n_calls++;
		if (!(rc = emit_text(fn, ud, KV_TC_CALL_START, idx, name.p, name.len)) &&
		    !(rc = emit_text(fn, ud, KV_TC_ARGS_DELTA, idx, args.p, args.len)))
			rc = emit_text(fn, ud, KV_TC_CALL_END, idx, NULL, 0);
	}
	kv_buf_free(&name);
	kv_buf_free(&args);
	kv_buf_free(&raw);
	return rc;
}

static int process(struct kv_tc_parser *p, kv_tc_emit_fn fn, void *ud, int final)
{
	struct kv_buf *b = &p->pend;
	int rc;
	for (;;) {
		if (p->state == S_AFTER) {
			size_t w = 0;
			while (w < b->len && isspace((unsigned char)b->p[w]))
				w++;
			if (w == b->len) {
				if (final)
					kv_buf_reset(b); /* trailing whitespace after calls */
				return 0;
			}
			int which = 0;
			size_t at = first_opener(p, b->p + w, b->len - w, &which);
			if (at == 0) {
				consume(b, w); /* whitespace between two calls */
			} else if (held_tail(p, b->p + w, b->len - w) == b->len - w && !final) {
				return 0; /* maybe the start of the next call */
			}
			p->state = S_CONTENT;
			continue;
		}
		if (p->state == S_CONTENT) {
			int which = 0;
			size_t at = first_opener(p, b->p ? b->p : "", b->len, &which);
			if (at < b->len) {
				if ((rc = emit_text(fn, ud, KV_TC_CONTENT, p->n_calls, b->p, at)))
					return rc;
				consume(b, at + strlen(openers[which]));
				p->opener = which;
				p->state = S_CALL;
				continue;
			}
			size_t keep = final ? 0 : held_tail(p, b->p ? b->p : "", b->len);
			if ((rc = emit_text(fn, ud, KV_TC_CONTENT, p->n_calls, b->p, b->len - keep)))
				return rc;
			consume(b, b->len - keep);
			return 0;
		}
		const char *cl = closers[p->opener];
		size_t cll = strlen(cl);
		const char *hit = b->len ? memmem(b->p, b->len, cl, cll) : NULL;
		if (p->state == S_SKIP) {
			size_t n = hit ? (size_t)(hit - b->p) + cll : final ? b->len : b->len - held_closer(b->p, b->len, cl);
			if ((rc = emit_text(fn, ud, KV_TC_CONTENT, p->n_calls, b->p, n)))
				return rc;
			consume(b, n);
			if (!hit && !final)
				return 0;
			p->state = S_CONTENT;
			continue;
		}
		/* S_CALL */
		if (hit && (size_t)(hit - b->p) <= p->max_call) {
			size_t bl = (size_t)(hit - b->p);
			if ((rc = finish_call(p, b->p, bl, 1, fn, ud)))
				return rc;
			consume(b, bl + cll);
			p->state = S_AFTER;
			continue;
		}
		if (hit || b->len >= p->max_call + cll) {
			/* the body is longer than max_call: not a call; it and its
			 * closer go out as content */
			if ((rc = emit_text(fn, ud, KV_TC_CONTENT, p->n_calls, openers[p->opener], strlen(openers[p->opener]))))
				return rc;
			p->state = S_SKIP;
			continue;
		}
		if (final) {
			/* the text ended inside a call: parse what is there (the
			 * closer may have been a stop string), else it is content */
			if (b->len > p->max_call)
				rc = emit_text(fn, ud, KV_TC_CONTENT, p->n_calls, openers[p->opener], strlen(openers[p->opener])) ||
				     emit_text(fn, ud, KV_TC_CONTENT, p->n_calls, b->p, b->len);
			else
				rc = finish_call(p, b->p ? b->p : "", b->len, 0, fn, ud);
			if (rc)
				return rc;
			kv_buf_reset(b);
			p->state = S_AFTER;
			continue;
		}
		return 0;
	}
}

int kv_tc_feed(struct kv_tc_parser *p, const char *text, size_t len, kv_tc_emit_fn fn, void *ud)
{
	if (!len)
		return KV_OK;
	kv_buf_add(&p->pend, text, len);
	if (p->pend.oom)
		return kv_fail(KV_ERR_NOMEM, "out of memory in the tool-call parser");
	return process(p, fn, ud, 0);
}

int kv_tc_finish(struct kv_tc_parser *p, kv_tc_emit_fn fn, void *ud)
{
	int rc = process(p, fn, ud, 1);
	kv_buf_reset(&p->pend);
	p->state = S_CONTENT;
	return rc;
}

/* --- one shot -------------------------------------------------------------- */

struct collect {
	struct kv_buf content;
	json_t *calls;
	json_t *cur;
	const char *prefix;
};

static int collect_ev(void *ud, const struct kv_tc_event *ev)
{
	struct collect *c = ud;
	char id[96];
	switch (ev->kind) {
	case KV_TC_CONTENT:
		kv_buf_add(&c->content, ev->text, ev->len);
		return c->content.oom ? kv_fail(KV_ERR_NOMEM, "out of memory") : 0;
	case KV_TC_CALL_START:
		snprintf(id, sizeof id, "%s%d", c->prefix, ev->index);
		c->cur = json_pack("{s:s,s:s,s:{s:s%,s:s}}", "id", id, "type", "function", "function", "name", ev->text,
				   ev->len, "arguments", "");
		return c->cur ? 0 : kv_fail(KV_ERR_NOMEM, "out of memory");
	case KV_TC_ARGS_DELTA:
		if (json_object_set_new(json_object_get(c->cur, "function"), "arguments", json_stringn(ev->text, ev->len)))
			return kv_fail(KV_ERR_NOMEM, "out of memory");
		return 0;
	case KV_TC_CALL_END:
		json_array_append_new(c->calls, c->cur);
		c->cur = NULL;
		return 0;
	}
	return 0;
}

int kv_tc_parse(const char *text, size_t len, const struct kv_tc_params *prm, const char *id_prefix, char **content,
		size_t *content_len, json_t **tool_calls)
{
	struct kv_tc_parser *p;
	struct collect c = {KV_BUF_INIT, json_array(), NULL, id_prefix ? id_prefix : "call_"};
	int rc;
	*content = NULL;
	*tool_calls = NULL;
	if (!c.calls)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	if ((rc = kv_tc_parser_create(prm, &p))) {
		json_decref(c.calls);
		return rc;
	}
	rc = kv_tc_feed(p, text, len, collect_ev, &c);
	if (!rc)
		rc = kv_tc_finish(p, collect_ev, &c);
	kv_tc_parser_free(p);
	json_decref(c.cur);
	if (rc) {
		kv_buf_free(&c.content);
		json_decref(c.calls);
		return rc;
	}
	if (content_len)
		*content_len = c.content.len;
	*content = c.content.p ? kv_buf_take(&c.content) : strdup("");
	if (!*content) {
		json_decref(c.calls);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	*tool_calls = c.calls;
	return KV_OK;
}
