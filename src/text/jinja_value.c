/*
 * jinja_value.c - Jinja values with Python semantics: the render arena,
 * UTF-8 and Python character classes, lists and dicts, str() / repr() /
 * json.dumps(), truth, equality, ordering, arithmetic, Undefined,
 * attribute and item access, slicing and iteration.
 */
#include "text/jinja_int.h"
#include <utf8proc.h>

/* ------------------------------------------------------------------------
 * Arena (struct arena in jinja_int.h)
 * ---------------------------------------------------------------------- */

#define TM_MAX_VALUE_DEPTH     200                  /* repr/tojson/== nesting */

void kj_ar_free(struct arena *a)
{
	struct achunk *c = a->head, *n;
	while (c) {
		n = c->next;
		kv_free(c);
		c = n;
	}
	a->head = NULL;
	a->total = 0;
}

/* NULL when the cap would be passed or malloc fails. */
void *kj_ar_alloc_raw(struct arena *a, size_t n)
{
	struct achunk *c = a->head;
	size_t need = (n + 15) & ~(size_t)15;
	if (n > ((size_t)1 << 40))
		return NULL;
	if (!c || c->size - c->off < need) {
		size_t sz = need > (32u << 10) ? need : (64u << 10);
		if (a->cap && a->total + sz > a->cap)
			return NULL;
		c = kv_alloc(KV_MEM_OTHER, sizeof *c + sz);
		if (!c)
			return NULL;
		c->size = sz;
		c->off = 0;
		if (a->head && need > (32u << 10)) {
			/* a big block gets its own chunk behind the current one, so
			 * the current chunk's free space stays usable */
			c->next = a->head->next;
			a->head->next = c;
		} else {
			c->next = a->head;
			a->head = c;
		}
		a->total += sz;
	}
	void *p = (char *)c->data + c->off;
	c->off += need;
	return p;
}

/* 1 if p points into one of a's chunks. */
int kj_ar_contains(const struct arena *a, const void *p)
{
	for (const struct achunk *c = a->head; c; c = c->next)
		if ((const char *)p >= (const char *)c->data && (const char *)p < (const char *)c->data + c->size)
			return 1;
	return 0;
}

/* ------------------------------------------------------------------------
 * UTF-8 (base/utf8.h does the decoding and encoding) and Python
 * character classes
 * ---------------------------------------------------------------------- */

/* Length of the code point starting at p in text already known to be
 * valid UTF-8 (1 for a stray byte, so loops always advance). */
static inline int u8_len(const char *p, size_t n)
{
	unsigned char c = (unsigned char)*p;
	int l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
	return (size_t)l <= n ? l : 1;
}

/* Python's str.isspace() (and the \s of re on str patterns). */
int kj_py_isspace(int32_t c)
{
	if (c < 0x80)
		return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
	return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
	       c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Python's str.isprintable() per character: everything but categories
 * Cc Cf Cs Co Cn Zl Zp Zs, space excepted. */
static int py_isprintable(int32_t c)
{
	if (c == ' ')
		return 1;
	if (c < 0x20 || c == 0x7F)
		return 0;
	if (c < 0x7F)
		return 1;
	int k = utf8proc_category(c);
	return !(k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CS ||
		 k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CN || k == UTF8PROC_CATEGORY_ZL ||
		 k == UTF8PROC_CATEGORY_ZP || k == UTF8PROC_CATEGORY_ZS);
}

int kj_py_isalpha(int32_t c)
{
	if (c < 0x80)
		return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
	int k = utf8proc_category(c);
	return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

int kj_py_isdigit(int32_t c)
{
	if (c < 0x80)
		return c >= '0' && c <= '9';
	return utf8proc_category(c) == UTF8PROC_CATEGORY_ND;
}

int kj_py_isalnum(int32_t c)
{
	if (kj_py_isalpha(c) || kj_py_isdigit(c))
		return 1;
	if (c < 0x80)
		return 0;
	int k = utf8proc_category(c);
	return k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* Cased characters (Lu, Ll, Lt) for islower/isupper/title. */
int kj_py_iscased(int32_t c)
{
	if (c < 0x80)
		return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
	int k = utf8proc_category(c);
	return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
	       utf8proc_toupper(c) != c || utf8proc_tolower(c) != c;
}

/*
 * Characters whose Python upper()/lower()/title() is more than one code
 * point (SpecialCasing.txt). utf8proc only has the simple mappings, so a
 * string holding one of these is reported as unsupported instead of being
 * cased differently from Python.
 */
int kj_special_casing(int32_t c)
{
	return c == 0xDF || c == 0x130 || c == 0x149 || c == 0x1F0 || c == 0x390 || c == 0x3B0 ||
	       c == 0x587 || (c >= 0x1E96 && c <= 0x1E9A) || (c >= 0x1F50 && c <= 0x1F56 && !(c & 1)) ||
	       (c >= 0x1F80 && c <= 0x1FAF) || (c >= 0x1FB2 && c <= 0x1FB4) || c == 0x1FB6 || c == 0x1FB7 ||
	       c == 0x1FBC || (c >= 0x1FC2 && c <= 0x1FC4) || c == 0x1FC6 || c == 0x1FC7 || c == 0x1FCC ||
	       c == 0x1FD2 || c == 0x1FD3 || c == 0x1FD6 || c == 0x1FD7 || (c >= 0x1FE2 && c <= 0x1FE4) ||
	       c == 0x1FE6 || c == 0x1FE7 || (c >= 0x1FF2 && c <= 0x1FF4) || c == 0x1FF6 || c == 0x1FF7 ||
	       c == 0x1FFC || (c >= 0xFB00 && c <= 0xFB06) || (c >= 0xFB13 && c <= 0xFB17) || c == 0x3A3;
}

const struct val KJ_NONE = {.t = V_NONE};
const struct val KJ_MISSING = {.t = V_MISSING};

const char *kj_kind_name(const struct val *v)
{
	switch (v->t) {
	case V_UNDEF: return "Undefined";
	case V_NONE: return "NoneType";
	case V_BOOL: return "bool";
	case V_INT: return "int";
	case V_FLOAT: return "float";
	case V_STR: return "str";
	case V_LIST:
		switch (v->u.l->kind) {
		case L_TUPLE: return "tuple";
		case L_ITER: return "generator";
		case L_ITEMS: return "dict_items";
		case L_KEYS: return "dict_keys";
		case L_VALUES: return "dict_values";
		case L_RANGE: return "range";
		}
		return "list";
	case V_DICT: return "dict";
	case V_NS: return "Namespace";
	case V_MACRO: return "Macro";
	case V_FUNC: return "function";
	case V_METHOD: return "method";
	case V_LOOP: return "LoopContext";
	}
	return "?";
}

/* Python-compatible hash of a dict key: equal keys (1, 1.0, true) hash
 * equal. Returns 0 and sets *ok = 0 for unhashable values. */
static uint64_t key_hash(const struct val *v, int *ok)
{
	*ok = 1;
	switch (v->t) {
	case V_NONE: return 0x9e3779b97f4a7c15ull;
	case V_BOOL:
	case V_INT: return (uint64_t)v->u.i * 0x9E3779B97F4A7C15ull;
	case V_FLOAT:
		if (v->u.f == floor(v->u.f) && fabs(v->u.f) < 9.2e18)
			return (uint64_t)(int64_t)v->u.f * 0x9E3779B97F4A7C15ull;
		{
			uint64_t b;
			memcpy(&b, &v->u.f, 8);
			return b * 0xC2B2AE3D27D4EB4Full;
		}
	case V_STR: {
		uint64_t h = 1469598103934665603ull;
		for (size_t i = 0; i < v->u.s.n; i++)
			h = (h ^ (unsigned char)v->u.s.p[i]) * 1099511628211ull;
		return h;
	}
	case V_LIST:
		if (v->u.l->kind == L_TUPLE) {
			uint64_t h = 0x345678;
			for (size_t i = 0; i < v->u.l->n; i++) {
				uint64_t e = key_hash(&v->u.l->v[i], ok);
				if (!*ok)
					return 0;
				h = (h ^ e) * 1000003ull;
			}
			return h;
		}
		break;
	}
	*ok = 0;
	return 0;
}

/* ------------------------------------------------------------------------
 * Runtime state: errors, allocation, steps, strings, output, scopes, lists,
 * dicts, JSON -> values
 * ---------------------------------------------------------------------- */

#define RT_DIVERGED 1000    /* internal: verify-mode mismatch, not an error */

void __attribute__((noreturn, format(printf, 4, 5)))
kj_rfail(struct rt *rt, const struct node *at, int code, const char *fmt, ...)
{
	char msg[700];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (at)
		kv_fail(code, "%s: line %d column %d: %s", rt->t->what, at->line, at->col, msg);
	else
		kv_fail(code, "%s: %s", rt->t->what, msg);
	rt->err = code;
	longjmp(rt->jb, 1);
}

void *kj_ralloc(struct rt *rt, const struct node *at, size_t n)
{
	void *p = kj_ar_alloc_raw(rt->ar, n ? n : 1);
	if (!p)
		kj_rfail(rt, at, KV_ERR_NOMEM, "render used more than %zu bytes of memory (template memory cap)",
		      rt->ar->cap);
	return p;
}

void kj_step(struct rt *rt, const struct node *at, uint64_t n)
{
	rt->steps += n;
	if (rt->steps > rt->max_steps)
		kj_rfail(rt, at, KV_ERR_INVALID,
		      "template ran more than %llu steps (statements and loop iterations); it may never end",
		      (unsigned long long)rt->max_steps);
}

/* --- strings under construction ----------------------------------------- */

void kj_ob_add(struct rt *rt, const struct node *at, struct outbuf *b, const char *p, size_t n)
{
	if (b->n + n > rt->max_out)
		kj_rfail(rt, at, KV_ERR_INVALID, "string longer than the %zu byte output cap", rt->max_out);
	if (b->n + n + 1 > b->cap) {
		size_t nc = b->cap ? b->cap * 2 : 64;
		while (nc < b->n + n + 1)
			nc *= 2;
		char *np = kj_ralloc(rt, at, nc);
		if (b->n)
			memcpy(np, b->p, b->n);
		b->p = np;
		b->cap = nc;
	}
	if (n)
		memcpy(b->p + b->n, p, n);
	b->n += n;
}

void kj_ob_adds(struct rt *rt, const struct node *at, struct outbuf *b, const char *s)
{
	kj_ob_add(rt, at, b, s, strlen(s));
}

void kj_ob_addc(struct rt *rt, const struct node *at, struct outbuf *b, char c)
{
	kj_ob_add(rt, at, b, &c, 1);
}

void kj_ob_cp(struct rt *rt, const struct node *at, struct outbuf *b, int32_t cp)
{
	char e[4];
	kj_ob_add(rt, at, b, e, (size_t)kv_utf8_encode(cp, e));
}

struct val kj_ob_val(struct outbuf *b)
{
	return vstr(b->p ? b->p : "", b->n);
}

struct val kj_str_copy(struct rt *rt, const struct node *at, const char *p, size_t n)
{
	char *d = kj_ralloc(rt, at, n + 1);
	if (n)
		memcpy(d, p, n);
	d[n] = 0;
	return vstr(d, n);
}

/* --- output ---------------------------------------------------------------- */

void kj_emit(struct rt *rt, const struct node *at, const char *p, size_t n)
{
	if (!n)
		return;
	if (rt->cap) {
		kj_ob_add(rt, at, rt->cap, p, n);
		return;
	}
	if (rt->out_len + n > rt->max_out)
		kj_rfail(rt, at, KV_ERR_INVALID, "rendered text longer than the %zu byte output cap", rt->max_out);
	if (rt->expect) {
		if (rt->out_len + n > rt->expect_len || memcmp(rt->expect + rt->out_len, p, n)) {
			rt->diverged = 1;
			rt->err = RT_DIVERGED;
			longjmp(rt->jb, 1);
		}
	} else {
		kv_buf_add(rt->out, p, n);
		if (rt->out->oom)
			kj_rfail(rt, at, KV_ERR_NOMEM, "out of memory for the rendered text");
	}
	rt->out_len += n;
}

/* --- scopes ---------------------------------------------------------------- */

struct scope *kj_scope_new(struct rt *rt, const struct node *at, struct scope *parent)
{
	struct scope *s = kj_ralloc(rt, at, sizeof *s);
	memset(s, 0, sizeof *s);
	s->parent = parent;
	return s;
}

void kj_scope_set(struct rt *rt, const struct node *at, struct scope *s, int sym, struct val v)
{
	for (int i = 0; i < s->n; i++)
		if (s->syms[i] == sym) {
			s->vals[i] = v;
			return;
		}
	if (s->n == s->cap) {
		int nc = s->cap ? s->cap * 2 : 8;
		int *ns = kj_ralloc(rt, at, (size_t)nc * sizeof *ns);
		struct val *nv = kj_ralloc(rt, at, (size_t)nc * sizeof *nv);
		if (s->n) {
			memcpy(ns, s->syms, (size_t)s->n * sizeof *ns);
			memcpy(nv, s->vals, (size_t)s->n * sizeof *nv);
		}
		s->syms = ns;
		s->vals = nv;
		s->cap = nc;
	}
	s->syms[s->n] = sym;
	s->vals[s->n++] = v;
}

const struct val *kj_scope_get(const struct scope *s, int sym)
{
	for (; s; s = s->parent)
		for (int i = s->n - 1; i >= 0; i--)
			if (s->syms[i] == sym)
				return &s->vals[i];
	return NULL;
}

/* --- lists and dicts ------------------------------------------------------- */

struct list *kj_list_new(struct rt *rt, const struct node *at, size_t n, int kind)
{
	if (n > ((size_t)1 << 32))
		kj_rfail(rt, at, KV_ERR_INVALID, "list of %zu items is too large", n);
	struct list *l = kj_ralloc(rt, at, sizeof *l + n * sizeof(struct val));
	memset(l, 0, sizeof *l);
	l->n = n;
	l->kind = (uint8_t)kind;
	return l;
}

void kj_lb_push(struct rt *rt, const struct node *at, struct lbuild *b, struct val v)
{
	if (b->n == b->cap) {
		size_t nc = b->cap ? b->cap * 2 : 8;
		struct val *nv = kj_ralloc(rt, at, nc * sizeof *nv);
		if (b->n)
			memcpy(nv, b->v, b->n * sizeof *nv);
		b->v = nv;
		b->cap = nc;
	}
	b->v[b->n++] = v;
}

struct val kj_lb_done(struct rt *rt, const struct node *at, struct lbuild *b, int kind)
{
	struct list *l = kj_list_new(rt, at, b->n, kind);
	if (b->n)
		memcpy(l->v, b->v, b->n * sizeof *b->v);
	return vlist(l);
}

struct dict *kj_dict_new(struct rt *rt, const struct node *at, size_t cap)
{
	struct dict *d = kj_ralloc(rt, at, sizeof *d);
	memset(d, 0, sizeof *d);
	if (cap) {
		d->k = kj_ralloc(rt, at, cap * sizeof *d->k);
		d->v = kj_ralloc(rt, at, cap * sizeof *d->v);
		d->cap = cap;
	}
	return d;
}

static void dict_reindex(struct rt *rt, const struct node *at, struct dict *d)
{
	size_t ic = 16;
	while (ic < d->n * 2)
		ic *= 2;
	d->idx = kj_ralloc(rt, at, ic * sizeof *d->idx);
	memset(d->idx, 0, ic * sizeof *d->idx);
	d->idx_cap = ic;
	for (size_t i = 0; i < d->n; i++) {
		int ok;
		size_t h = (size_t)key_hash(&d->k[i], &ok) & (ic - 1);
		while (d->idx[h])
			h = (h + 1) & (ic - 1);
		d->idx[h] = (uint32_t)(i + 1);
	}
}

/* Index of key in d, or -1. Unhashable keys are a TypeError. */
long kj_dict_find(struct rt *rt, const struct node *at, const struct dict *d, const struct val *key)
{
	int ok;
	if (!d->idx && key->t == V_STR) {
		/* small dict, string key: compare directly (a str equals only a str) */
		for (size_t j = 0; j < d->n; j++)
			if (d->k[j].t == V_STR && d->k[j].u.s.n == key->u.s.n && !memcmp(d->k[j].u.s.p, key->u.s.p, key->u.s.n))
				return (long)j;
		return -1;
	}
	uint64_t h = key_hash(key, &ok);
	if (!ok)
		TYPE_ERR(rt, at, "unhashable type: '%s'", kj_kind_name(key));
	if (d->idx) {
		size_t m = d->idx_cap - 1, i = (size_t)h & m;
		while (d->idx[i]) {
			size_t j = d->idx[i] - 1;
			if (kj_val_eq(rt, at, &d->k[j], key, 0))
				return (long)j;
			i = (i + 1) & m;
		}
		return -1;
	}
	for (size_t j = 0; j < d->n; j++)
		if (kj_val_eq(rt, at, &d->k[j], key, 0))
			return (long)j;
	return -1;
}

/* Insert or overwrite (Python: the first key object is kept). */
void kj_dict_set(struct rt *rt, const struct node *at, struct dict *d, struct val key, struct val v)
{
	long i = kj_dict_find(rt, at, d, &key);
	if (i >= 0) {
		d->v[i] = v;
		return;
	}
	if (d->n == d->cap) {
		size_t nc = d->cap ? d->cap * 2 : 8;
		struct val *nk = kj_ralloc(rt, at, nc * sizeof *nk), *nv = kj_ralloc(rt, at, nc * sizeof *nv);
		if (d->n) {
			memcpy(nk, d->k, d->n * sizeof *nk);
			memcpy(nv, d->v, d->n * sizeof *nv);
		}
		d->k = nk;
		d->v = nv;
		d->cap = nc;
	}
	d->k[d->n] = key;
	d->v[d->n] = v;
	d->n++;
	if (d->n > 8 && (!d->idx || d->n * 2 > d->idx_cap))
		dict_reindex(rt, at, d);
	else if (d->idx) {
		int ok;
		size_t m = d->idx_cap - 1, h = (size_t)key_hash(&key, &ok) & m;
		while (d->idx[h])
			h = (h + 1) & m;
		d->idx[h] = (uint32_t)d->n;
	}
}

const struct val *kj_dict_get_str(struct rt *rt, const struct node *at, const struct dict *d, const char *s,
				      size_t n)
{
	struct val k = vstr(s, n);
	long i = kj_dict_find(rt, at, d, &k);
	return i >= 0 ? &d->v[i] : NULL;
}

/* --- JSON -> values -------------------------------------------------------- */

struct val kj_from_json(struct rt *rt, const json_t *j, int depth)
{
	if (depth > TM_MAX_VALUE_DEPTH)
		kj_rfail(rt, NULL, KV_ERR_INVALID, "context value nested deeper than %d", TM_MAX_VALUE_DEPTH);
	switch (json_typeof(j)) {
	case JSON_NULL: return KJ_NONE;
	case JSON_TRUE: return vbool(1);
	case JSON_FALSE: return vbool(0);
	case JSON_INTEGER: return vint((int64_t)json_integer_value(j));
	case JSON_REAL: return vfloat(json_real_value(j));
	case JSON_STRING: {
		/* a number jansson could not hold (base/json.h): an integer keeps
		 * its digits, a real that overflowed is +-inf, as in Python */
		const char *lit;
		size_t n;
		if (kv_json_number_literal(j, &lit, &n)) {
			if (memchr(lit, '.', n) || memchr(lit, 'e', n) || memchr(lit, 'E', n))
				return vfloat(lit[0] == '-' ? -INFINITY : INFINITY);
			struct val v = vstr(lit, n);
			v.bigint = 1;
			return v;
		}
		return vstr(json_string_value(j), json_string_length(j));
	}
	case JSON_ARRAY: {
		size_t n = json_array_size(j);
		struct list *l = kj_list_new(rt, NULL, n, L_LIST);
		for (size_t i = 0; i < n; i++)
			l->v[i] = kj_from_json(rt, json_array_get(j, i), depth + 1);
		return vlist(l);
	}
	case JSON_OBJECT: {
		struct dict *d = kj_dict_new(rt, NULL, json_object_size(j));
		const char *k;
		json_t *v;
		json_object_foreach((json_t *)j, k, v) {
			struct val key = vstr(k, strlen(k));
			struct val val = kj_from_json(rt, v, depth + 1);
			/* keys are unique in a json object: append */
			d->k[d->n] = key;
			d->v[d->n++] = val;
		}
		if (d->n > 8)
			dict_reindex(rt, NULL, d);
		return vdict(d);
	}
	}
	return KJ_NONE;
}

/* ------------------------------------------------------------------------
 * str(), repr() and json.dumps() of values
 * ---------------------------------------------------------------------- */

/* Python's repr(float): the shortest string that reads back exactly,
 * fixed notation when the decimal exponent is in [-4, 16), else
 * exponent notation with at least two exponent digits. */
static void fmt_float(double x, char *out, size_t cap)
{
	char buf[64], digits[32];
	int exp10, nd = 0;

	if (isnan(x)) {
		snprintf(out, cap, "nan");
		return;
	}
	if (isinf(x)) {
		snprintf(out, cap, x < 0 ? "-inf" : "inf");
		return;
	}
	if (x == 0) {
		snprintf(out, cap, signbit(x) ? "-0.0" : "0.0");
		return;
	}
	for (int p = 1; p <= 17; p++) {
		snprintf(buf, sizeof buf, "%.*e", p - 1, x);
		if (strtod(buf, NULL) == x)
			break;
	}
	/* buf: [-]d[.ddd]e[+-]XX */
	const char *q = buf;
	int neg = 0;
	if (*q == '-') {
		neg = 1;
		q++;
	}
	for (; *q && *q != 'e'; q++)
		if (*q != '.')
			digits[nd++] = *q;
	exp10 = atoi(q + 1);
	while (nd > 1 && digits[nd - 1] == '0')
		nd--;
	digits[nd] = 0;
	int decpt = exp10 + 1; /* value = 0.digits x 10^decpt */
	char *o = out;
	size_t left = cap;
#define PUT(...) do { int w_ = snprintf(o, left, __VA_ARGS__); if (w_ < 0 || (size_t)w_ >= left) return; o += w_; left -= (size_t)w_; } while (0)
	if (neg)
		PUT("-");
	if (decpt > -4 && decpt <= 16) {
		if (decpt <= 0) {
			PUT("0.");
			for (int i = 0; i < -decpt; i++)
				PUT("0");
			PUT("%s", digits);
		} else if (decpt >= nd) {
			PUT("%s", digits);
			for (int i = nd; i < decpt; i++)
				PUT("0");
			PUT(".0");
		} else {
			PUT("%.*s.%s", decpt, digits, digits + decpt);
		}
	} else {
		PUT("%c", digits[0]);
		if (nd > 1)
			PUT(".%s", digits + 1);
		PUT("e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
	}
#undef PUT
}

static void repr_str(struct rt *rt, const struct node *at, const char *p, size_t n, struct outbuf *b)
{
	int has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
	char q = has_sq && !has_dq ? '"' : '\'';
	kj_ob_addc(rt, at, b, q);
	size_t i = 0;
	while (i < n) {
		int32_t c;
		int l = kv_utf8_decode(p + i, n - i, &c);
		if (!l) {
			c = (unsigned char)p[i];
			l = 1;
		}
		char e[16];
		if (c == '\\' || c == q) {
			e[0] = '\\';
			e[1] = (char)c;
			kj_ob_add(rt, at, b, e, 2);
		} else if (c == '\n') {
			kj_ob_add(rt, at, b, "\\n", 2);
		} else if (c == '\r') {
			kj_ob_add(rt, at, b, "\\r", 2);
		} else if (c == '\t') {
			kj_ob_add(rt, at, b, "\\t", 2);
		} else if (!py_isprintable(c)) {
			int w = snprintf(e, sizeof e, c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" : "\\U%08x",
					 (unsigned)c);
			kj_ob_add(rt, at, b, e, (size_t)w);
		} else {
			kj_ob_add(rt, at, b, p + i, (size_t)l);
		}
		i += (size_t)l;
	}
	kj_ob_addc(rt, at, b, q);
}

static void value_depth(struct rt *rt, const struct node *at, int depth)
{
	if (depth > TM_MAX_VALUE_DEPTH)
		kj_rfail(rt, at, KV_ERR_INVALID, "value nested deeper than %d", TM_MAX_VALUE_DEPTH);
}

static void repr_seq(struct rt *rt, const struct node *at, const struct list *l, struct outbuf *b, int depth,
		     const char *open, const char *close)
{
	kj_ob_adds(rt, at, b, open);
	for (size_t i = 0; i < l->n; i++) {
		if (i)
			kj_ob_add(rt, at, b, ", ", 2);
		kj_to_repr(rt, at, &l->v[i], b, depth + 1);
	}
	kj_ob_adds(rt, at, b, close);
}

static void repr_dict(struct rt *rt, const struct node *at, const struct dict *d, struct outbuf *b, int depth)
{
	kj_ob_addc(rt, at, b, '{');
	for (size_t i = 0; i < d->n; i++) {
		if (i)
			kj_ob_add(rt, at, b, ", ", 2);
		kj_to_repr(rt, at, &d->k[i], b, depth + 1);
		kj_ob_add(rt, at, b, ": ", 2);
		kj_to_repr(rt, at, &d->v[i], b, depth + 1);
	}
	kj_ob_addc(rt, at, b, '}');
}

/* str(v) appended to b. */
void kj_to_str(struct rt *rt, const struct node *at, const struct val *v, struct outbuf *b, int depth)
{
	char num[64];
	value_depth(rt, at, depth);
	switch (v->t) {
	case V_UNDEF:
	case V_MISSING:
		return;
	case V_NONE:
		kj_ob_add(rt, at, b, "None", 4);
		return;
	case V_BOOL:
		kj_ob_adds(rt, at, b, v->u.i ? "True" : "False");
		return;
	case V_INT:
		snprintf(num, sizeof num, "%lld", (long long)v->u.i);
		kj_ob_adds(rt, at, b, num);
		return;
	case V_FLOAT:
		fmt_float(v->u.f, num, sizeof num);
		kj_ob_adds(rt, at, b, num);
		return;
	case V_STR:
		kj_ob_add(rt, at, b, v->u.s.p, v->u.s.n);
		return;
	case V_LIST: {
		const struct list *l = v->u.l;
		switch (l->kind) {
		case L_LIST: repr_seq(rt, at, l, b, depth, "[", "]"); return;
		case L_TUPLE: repr_seq(rt, at, l, b, depth, "(", l->n == 1 ? ",)" : ")"); return;
		case L_ITEMS: repr_seq(rt, at, l, b, depth, "dict_items([", "])"); return;
		case L_KEYS: repr_seq(rt, at, l, b, depth, "dict_keys([", "])"); return;
		case L_VALUES: repr_seq(rt, at, l, b, depth, "dict_values([", "])"); return;
		case L_RANGE:
			if (l->rs == 1)
				snprintf(num, sizeof num, "range(%lld, %lld)", (long long)l->r0, (long long)l->r1);
			else
				snprintf(num, sizeof num, "range(%lld, %lld, %lld)", (long long)l->r0, (long long)l->r1,
					 (long long)l->rs);
			kj_ob_adds(rt, at, b, num);
			return;
		}
		UNSUP(rt, at, "printing a generator or iterator (Python would print its address); "
			      "convert it with |list or |join first");
	}
	case V_DICT:
		repr_dict(rt, at, v->u.d, b, depth);
		return;
	case V_NS:
		kj_ob_adds(rt, at, b, "<Namespace ");
		repr_dict(rt, at, v->u.ns->d, b, depth);
		kj_ob_addc(rt, at, b, '>');
		return;
	case V_MACRO:
		kj_ob_adds(rt, at, b, "<Macro ");
		repr_str(rt, at, v->u.m->def->s, strlen(v->u.m->def->s), b);
		kj_ob_addc(rt, at, b, '>');
		return;
	case V_LOOP:
		snprintf(num, sizeof num, "<LoopContext %zu/%zu>", v->u.lo->i + 1, v->u.lo->items->n);
		kj_ob_adds(rt, at, b, num);
		return;
	}
	UNSUP(rt, at, "printing a %s (Python would print its address)", kj_kind_name(v));
}

void kj_to_repr(struct rt *rt, const struct node *at, const struct val *v, struct outbuf *b, int depth)
{
	value_depth(rt, at, depth);
	if (v->t == V_STR) {
		if (v->bigint) {
			kj_ob_add(rt, at, b, v->u.s.p, v->u.s.n);
		} else if (v->safe) {
			kj_ob_adds(rt, at, b, "Markup(");
			repr_str(rt, at, v->u.s.p, v->u.s.n, b);
			kj_ob_addc(rt, at, b, ')');
		} else {
			repr_str(rt, at, v->u.s.p, v->u.s.n, b);
		}
	} else if (v->t == V_UNDEF) {
		kj_ob_adds(rt, at, b, "Undefined");
	} else {
		kj_to_str(rt, at, v, b, depth);
	}
}

/* str(v) as a value (v itself when it is a string). */
struct val kj_str_of(struct rt *rt, const struct node *at, const struct val *v)
{
	if (v->t == V_STR)
		return *v;
	struct outbuf b = {0};
	kj_to_str(rt, at, v, &b, 0);
	return kj_ob_val(&b);
}

static void json_str(struct rt *rt, const struct node *at, const char *p, size_t n, int ensure_ascii,
		     struct outbuf *b)
{
	kj_ob_addc(rt, at, b, '"');
	size_t i = 0, run = 0;
	while (i < n) {
		unsigned char c = (unsigned char)p[i];
		const char *esc = NULL;
		char e[16];
		int l = 1;
		if (c == '"')
			esc = "\\\"";
		else if (c == '\\')
			esc = "\\\\";
		else if (c == '\n')
			esc = "\\n";
		else if (c == '\r')
			esc = "\\r";
		else if (c == '\t')
			esc = "\\t";
		else if (c == '\b')
			esc = "\\b";
		else if (c == '\f')
			esc = "\\f";
		else if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
			snprintf(e, sizeof e, "\\u%04x", c);
			esc = e;
		} else if (c >= 0x80 && ensure_ascii) {
			int32_t cp;
			l = kv_utf8_decode(p + i, n - i, &cp);
			if (!l) {
				cp = 0xFFFD;
				l = 1;
			}
			if (cp >= 0x10000) {
				cp -= 0x10000;
				snprintf(e, sizeof e, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
			} else {
				snprintf(e, sizeof e, "\\u%04x", (unsigned)cp);
			}
			esc = e;
		}
		if (esc) {
			if (run)
				kj_ob_add(rt, at, b, p + i - run, run);
			run = 0;
			kj_ob_adds(rt, at, b, esc);
			i += (size_t)l;
		} else {
			run++;
			i++;
		}
	}
	if (run)
		kj_ob_add(rt, at, b, p + n - run, run);
	kj_ob_addc(rt, at, b, '"');
}

static void json_newline(struct rt *rt, const struct node *at, const struct jopts *o, int level, struct outbuf *b)
{
	kj_ob_addc(rt, at, b, '\n');
	for (int i = 0; i < level; i++)
		kj_ob_add(rt, at, b, o->indent, o->indent_n);
}

static int str_cmp(const struct val *a, const struct val *b)
{
	size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
	int c = memcmp(a->u.s.p, b->u.s.p, n);
	if (c)
		return c;
	return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
}

void kj_to_json(struct rt *rt, const struct node *at, const struct val *v, const struct jopts *o, int level,
		    struct outbuf *b)
{
	char num[64];
	value_depth(rt, at, level);
	switch (v->t) {
	case V_NONE:
		kj_ob_add(rt, at, b, "null", 4);
		return;
	case V_BOOL:
		kj_ob_adds(rt, at, b, v->u.i ? "true" : "false");
		return;
	case V_INT:
		snprintf(num, sizeof num, "%lld", (long long)v->u.i);
		kj_ob_adds(rt, at, b, num);
		return;
	case V_FLOAT:
		if (isnan(v->u.f))
			kj_ob_adds(rt, at, b, "NaN");
		else if (isinf(v->u.f))
			kj_ob_adds(rt, at, b, v->u.f < 0 ? "-Infinity" : "Infinity");
		else {
			fmt_float(v->u.f, num, sizeof num);
			kj_ob_adds(rt, at, b, num);
		}
		return;
	case V_STR:
		if (v->bigint)
			kj_ob_add(rt, at, b, v->u.s.p, v->u.s.n);
		else
			json_str(rt, at, v->u.s.p, v->u.s.n, o->ensure_ascii, b);
		return;
	case V_LIST:
		if (v->u.l->kind == L_LIST || v->u.l->kind == L_TUPLE) {
			const struct list *l = v->u.l;
			if (!l->n) {
				kj_ob_add(rt, at, b, "[]", 2);
				return;
			}
			kj_ob_addc(rt, at, b, '[');
			for (size_t i = 0; i < l->n; i++) {
				if (i)
					kj_ob_adds(rt, at, b, o->item_sep);
				if (o->indent)
					json_newline(rt, at, o, level + 1, b);
				kj_to_json(rt, at, &l->v[i], o, level + 1, b);
			}
			if (o->indent)
				json_newline(rt, at, o, level, b);
			kj_ob_addc(rt, at, b, ']');
			return;
		}
		break;
	case V_DICT: {
		const struct dict *d = v->u.d;
		size_t *order = NULL;
		if (!d->n) {
			kj_ob_add(rt, at, b, "{}", 2);
			return;
		}
		if (o->sort_keys) {
			order = kj_ralloc(rt, at, d->n * sizeof *order);
			for (size_t i = 0; i < d->n; i++) {
				if (d->k[i].t != V_STR)
					UNSUP(rt, at, "tojson(sort_keys=true) with non-string keys");
				order[i] = i;
			}
			/* insertion sort: stable, dicts in templates are small */
			for (size_t i = 1; i < d->n; i++) {
				size_t x = order[i], j = i;
				while (j > 0 && str_cmp(&d->k[order[j - 1]], &d->k[x]) > 0) {
					order[j] = order[j - 1];
					j--;
				}
				order[j] = x;
			}
		}
		kj_ob_addc(rt, at, b, '{');
		for (size_t ii = 0; ii < d->n; ii++) {
			size_t i = order ? order[ii] : ii;
			const struct val *k = &d->k[i];
			if (ii)
				kj_ob_adds(rt, at, b, o->item_sep);
			if (o->indent)
				json_newline(rt, at, o, level + 1, b);
			switch (k->t) {
			case V_STR:
				json_str(rt, at, k->u.s.p, k->u.s.n, o->ensure_ascii, b);
				break;
			case V_INT:
			case V_FLOAT:
			case V_BOOL:
			case V_NONE: {
				struct outbuf kb = {0};
				kj_to_json(rt, at, k, o, level + 1, &kb);
				json_str(rt, at, kb.p, kb.n, 0, b);
				break;
			}
			default:
				TYPE_ERR(rt, at, "tojson: keys must be str, int, float, bool or None, not %s", kj_kind_name(k));
			}
			kj_ob_adds(rt, at, b, o->key_sep);
			kj_to_json(rt, at, &d->v[i], o, level + 1, b);
		}
		if (o->indent)
			json_newline(rt, at, o, level, b);
		kj_ob_addc(rt, at, b, '}');
		return;
	}
	default:
		break;
	}
	TYPE_ERR(rt, at, "tojson: object of type %s is not JSON serializable", kj_kind_name(v));
}

/* ------------------------------------------------------------------------
 * Truth, equality, ordering, arithmetic (Python semantics)
 * ---------------------------------------------------------------------- */

int kj_truthy(const struct val *v)
{
	switch (v->t) {
	case V_UNDEF:
	case V_NONE:
	case V_MISSING:
		return 0;
	case V_BOOL:
	case V_INT:
		return v->u.i != 0;
	case V_FLOAT:
		return v->u.f != 0;
	case V_STR:
		return v->u.s.n > 0;
	case V_LIST:
		return v->u.l->kind == L_ITER || v->u.l->n > 0;
	case V_DICT:
		return v->u.d->n > 0;
	}
	return 1;
}

int kj_val_eq(struct rt *rt, const struct node *at, const struct val *a, const struct val *b, int depth)
{
	value_depth(rt, at, depth);
	if (is_num(a) && is_num(b)) {
		if (a->t == V_FLOAT || b->t == V_FLOAT)
			return num_f(a) == num_f(b);
		return a->u.i == b->u.i;
	}
	if (a->t != b->t)
		return 0;
	switch (a->t) {
	case V_UNDEF:
	case V_NONE:
		return 1;
	case V_STR:
		return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
	case V_LIST: {
		const struct list *x = a->u.l, *y = b->u.l;
		if (x == y)
			return 1;
		int kx = x->kind == L_RANGE ? L_LIST : x->kind, ky = y->kind == L_RANGE ? L_LIST : y->kind;
		if (x->kind == L_RANGE && y->kind == L_RANGE)
			kx = ky = L_RANGE;
		if (kx != ky || x->kind == L_ITER || x->n != y->n)
			return 0;
		for (size_t i = 0; i < x->n; i++)
			if (!kj_val_eq(rt, at, &x->v[i], &y->v[i], depth + 1))
				return 0;
		return 1;
	}
	case V_DICT: {
		const struct dict *x = a->u.d, *y = b->u.d;
		if (x == y)
			return 1;
		if (x->n != y->n)
			return 0;
		for (size_t i = 0; i < x->n; i++) {
			long j = kj_dict_find(rt, at, y, &x->k[i]);
			if (j < 0 || !kj_val_eq(rt, at, &x->v[i], &y->v[j], depth + 1))
				return 0;
		}
		return 1;
	}
	case V_NS: return a->u.ns == b->u.ns;
	case V_MACRO: return a->u.m == b->u.m;
	case V_LOOP: return a->u.lo == b->u.lo;
	case V_FUNC: return a->fn == b->fn;
	case V_METHOD: return a->u.me == b->u.me;
	}
	return 0;
}

/* <0, 0, >0 for Python ordering; a TypeError for unordered kinds. */
int kj_val_cmp(struct rt *rt, const struct node *at, const struct val *a, const struct val *b, const char *op,
		   int depth)
{
	value_depth(rt, at, depth);
	if (is_num(a) && is_num(b)) {
		if (a->t == V_FLOAT || b->t == V_FLOAT) {
			double x = num_f(a), y = num_f(b);
			return x < y ? -1 : x > y ? 1 : 0;
		}
		return a->u.i < b->u.i ? -1 : a->u.i > b->u.i;
	}
	if (a->t == V_STR && b->t == V_STR)
		return str_cmp(a, b);
	if (a->t == V_LIST && b->t == V_LIST && a->u.l->kind == b->u.l->kind &&
	    (a->u.l->kind == L_LIST || a->u.l->kind == L_TUPLE)) {
		const struct list *x = a->u.l, *y = b->u.l;
		for (size_t i = 0; i < x->n && i < y->n; i++)
			if (!kj_val_eq(rt, at, &x->v[i], &y->v[i], depth + 1))
				return kj_val_cmp(rt, at, &x->v[i], &y->v[i], op, depth + 1);
		return x->n < y->n ? -1 : x->n > y->n;
	}
	if (a->t == V_UNDEF || b->t == V_UNDEF)
		TYPE_ERR(rt, at, "'%s' on an undefined value", op);
	TYPE_ERR(rt, at, "'%s' not supported between instances of '%s' and '%s'", op, kj_kind_name(a), kj_kind_name(b));
}

int kj_contains(struct rt *rt, const struct node *at, const struct val *needle, const struct val *hay)
{
	switch (hay->t) {
	case V_STR:
		if (needle->t != V_STR)
			TYPE_ERR(rt, at, "'in <string>' requires string as left operand, not %s", kj_kind_name(needle));
		if (!needle->u.s.n)
			return 1;
		return memmem(hay->u.s.p, hay->u.s.n, needle->u.s.p, needle->u.s.n) != NULL;
	case V_LIST:
		for (size_t i = 0; i < hay->u.l->n; i++)
			if (kj_val_eq(rt, at, needle, &hay->u.l->v[i], 0))
				return 1;
		return 0;
	case V_DICT:
		return kj_dict_find(rt, at, hay->u.d, needle) >= 0;
	case V_UNDEF:
		return 0;
	}
	TYPE_ERR(rt, at, "argument of type '%s' is not iterable", kj_kind_name(hay));
}

static void __attribute__((noreturn)) overflow(struct rt *rt, const struct node *at)
{
	UNSUP(rt, at, "integer overflow (values beyond 64 bits are not supported)");
}

static int64_t add_ck(struct rt *rt, const struct node *at, int64_t a, int64_t b)
{
	int64_t r;
	if (__builtin_add_overflow(a, b, &r))
		overflow(rt, at);
	return r;
}

static int64_t sub_ck(struct rt *rt, const struct node *at, int64_t a, int64_t b)
{
	int64_t r;
	if (__builtin_sub_overflow(a, b, &r))
		overflow(rt, at);
	return r;
}

static int64_t mul_ck(struct rt *rt, const struct node *at, int64_t a, int64_t b)
{
	int64_t r;
	if (__builtin_mul_overflow(a, b, &r))
		overflow(rt, at);
	return r;
}

static double py_fmod_floor(double vx, double wx, double *floordiv)
{
	double mod = fmod(vx, wx), div = (vx - mod) / wx;
	if (mod) {
		if ((wx < 0) != (mod < 0)) {
			mod += wx;
			div -= 1.0;
		}
	} else {
		mod = copysign(0.0, wx);
	}
	if (div) {
		double f = floor(div);
		if (div - f > 0.5)
			f += 1.0;
		*floordiv = f;
	} else {
		*floordiv = copysign(0.0, vx / wx);
	}
	return mod;
}

static struct val repeat(struct rt *rt, const struct node *at, const struct val *seq, int64_t k)
{
	if (k <= 0)
		return seq->t == V_STR ? vstr("", 0) : vlist(kj_list_new(rt, at, 0, seq->u.l->kind));
	if (seq->t == V_STR) {
		if (seq->u.s.n && (uint64_t)k > rt->max_out / seq->u.s.n)
			kj_rfail(rt, at, KV_ERR_INVALID, "string repetition larger than the %zu byte output cap", rt->max_out);
		struct outbuf b = {0};
		for (int64_t i = 0; i < k; i++)
			kj_ob_add(rt, at, &b, seq->u.s.p, seq->u.s.n);
		struct val r = kj_ob_val(&b);
		r.safe = seq->safe;
		return r;
	}
	const struct list *l = seq->u.l;
	if (l->n && (uint64_t)k > (uint64_t)(1u << 24) / l->n)
		kj_rfail(rt, at, KV_ERR_INVALID, "list repetition too large");
	struct list *r = kj_list_new(rt, at, l->n * (size_t)k, l->kind);
	for (int64_t i = 0; i < k; i++)
		memcpy(r->v + (size_t)i * l->n, l->v, l->n * sizeof *l->v);
	return vlist(r);
}

struct val kj_binop(struct rt *rt, const struct node *at, int op, const struct val *a, const struct val *b)
{
	static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
	if (a->t == V_UNDEF || b->t == V_UNDEF) {
		const struct val *u = a->t == V_UNDEF ? a : b;
		if (u->u.s.p)
			TYPE_ERR(rt, at, "'%.*s' is undefined", (int)u->u.s.n, u->u.s.p);
		TYPE_ERR(rt, at, "'%s' on an undefined value", names[op]);
	}
	if (is_num(a) && is_num(b)) {
		int fl = a->t == V_FLOAT || b->t == V_FLOAT;
		int64_t x = a->u.i, y = b->u.i;
		double fx = num_f(a), fy = num_f(b);
		switch (op) {
		case B_ADD:
			if (fl)
				return vfloat(fx + fy);
			return vint(add_ck(rt, at, x, y));
		case B_SUB:
			if (fl)
				return vfloat(fx - fy);
			return vint(sub_ck(rt, at, x, y));
		case B_MUL:
			if (fl)
				return vfloat(fx * fy);
			return vint(mul_ck(rt, at, x, y));
		case B_DIV:
			if (fy == 0)
				TYPE_ERR(rt, at, "division by zero");
			return vfloat(fl ? fx / fy : (double)x / (double)y);
		case B_FLOORDIV:
		case B_MOD:
			if (fl ? fy == 0 : y == 0)
				TYPE_ERR(rt, at, "integer division or modulo by zero");
			if (fl) {
				double fd, m = py_fmod_floor(fx, fy, &fd);
				return vfloat(op == B_MOD ? m : fd);
			}
			if (x == INT64_MIN && y == -1)
				UNSUP(rt, at, "integer overflow (values beyond 64 bits are not supported)");
			{
				int64_t q = x / y, m = x % y;
				if (m && ((m < 0) != (y < 0))) {
					m += y;
					q -= 1;
				}
				return vint(op == B_MOD ? m : q);
			}
		case B_POW:
			if (!fl && y >= 0) {
				int64_t acc = 1, base = x;
				int64_t e = y;
				while (e) {
					if (e & 1)
						acc = mul_ck(rt, at, acc, base);
					e >>= 1;
					if (e)
						base = mul_ck(rt, at, base, base);
				}
				return vint(acc);
			}
			if (fx == 0 && fy < 0)
				TYPE_ERR(rt, at, "0.0 cannot be raised to a negative power");
			if (fx < 0 && fy != floor(fy))
				UNSUP(rt, at, "complex results of ** are not supported");
			return vfloat(pow(fx, fy));
		}
	}
	if (op == B_ADD) {
		if (a->t == V_STR && b->t == V_STR) {
			/* Markup + str escapes the plain side */
			struct val x = *a, y = *b;
			if (a->safe && !b->safe)
				y = kj_markup_escape(rt, at, b);
			else if (b->safe && !a->safe)
				x = kj_markup_escape(rt, at, a);
			if (!x.u.s.n) {
				y.safe = a->safe | b->safe;
				return y;
			}
			if (!y.u.s.n) {
				x.safe = a->safe | b->safe;
				return x;
			}
			if (x.u.s.n + y.u.s.n > rt->max_out)
				kj_rfail(rt, at, KV_ERR_INVALID, "string longer than the %zu byte output cap", rt->max_out);
			char *p = kj_ralloc(rt, at, x.u.s.n + y.u.s.n + 1);
			memcpy(p, x.u.s.p, x.u.s.n);
			memcpy(p + x.u.s.n, y.u.s.p, y.u.s.n);
			struct val v = vstr(p, x.u.s.n + y.u.s.n);
			v.safe = a->safe | b->safe;
			return v;
		}
		if (a->t == V_LIST && b->t == V_LIST && a->u.l->kind == b->u.l->kind &&
		    (a->u.l->kind == L_LIST || a->u.l->kind == L_TUPLE)) {
			struct list *l = kj_list_new(rt, at, a->u.l->n + b->u.l->n, a->u.l->kind);
			memcpy(l->v, a->u.l->v, a->u.l->n * sizeof *l->v);
			memcpy(l->v + a->u.l->n, b->u.l->v, b->u.l->n * sizeof *l->v);
			return vlist(l);
		}
	}
	if (op == B_MUL) {
		const struct val *seq = NULL, *k = NULL;
		if ((a->t == V_STR || is_seq_list(a)) && is_intlike(b))
			seq = a, k = b;
		else if ((b->t == V_STR || is_seq_list(b)) && is_intlike(a))
			seq = b, k = a;
		if (seq && (seq->t == V_STR || seq->u.l->kind != L_RANGE))
			return repeat(rt, at, seq, k->u.i);
	}
	if (op == B_MOD && a->t == V_STR)
		UNSUP(rt, at, "printf-style '%%' formatting of strings is not supported (use ~ or |string)");
	TYPE_ERR(rt, at, "unsupported operand type(s) for %s: '%s' and '%s'", names[op], kj_kind_name(a), kj_kind_name(b));
}

/* ------------------------------------------------------------------------
 * Undefined, attribute and item access, slicing, iteration
 * ---------------------------------------------------------------------- */

/* An Undefined for a missing attribute/item of a value of kind `parent`. */
struct val kj_undef_of(const char *name, size_t n, int parent_kind, int is_item)
{
	struct val v = {.t = V_UNDEF};
	v.u.s.p = name;
	v.u.s.n = n;
	v.fn = (uint16_t)(parent_kind + 1);
	v.safe = (uint8_t)is_item;
	return v;
}

static const char *const vkind_obj[] = {
	"undefined", "None", "bool object", "int object", "float object", "str object", "list object",
	"dict object", "Namespace object", "Macro object", "function", "method", "LoopContext object", "?",
};

void __attribute__((noreturn)) kj_fail_undef(struct rt *rt, const struct node *at, const struct val *u)
{
	if (u->fn && u->u.s.p)
		TYPE_ERR(rt, at, "'%s' has no %s '%.*s'", vkind_obj[u->fn - 1], u->safe ? "element" : "attribute",
			 (int)(u->u.s.n > 80 ? 80 : u->u.s.n), u->u.s.p);
	if (u->u.s.p)
		TYPE_ERR(rt, at, "'%.*s' is undefined", (int)(u->u.s.n > 80 ? 80 : u->u.s.n), u->u.s.p);
	if (u->fn)
		TYPE_ERR(rt, at, "'%s' has no such element (index out of range or missing key)", vkind_obj[u->fn - 1]);
	TYPE_ERR(rt, at, "undefined value used");
}

struct val kj_method_val(struct rt *rt, const struct node *at, const struct val *self, int id)
{
	struct method *me = kj_ralloc(rt, at, sizeof *me);
	me->self = *self;
	struct val v = {.t = V_METHOD};
	v.fn = (uint16_t)id;
	v.u.me = me;
	return v;
}

static struct val loop_attr(struct rt *rt, const struct node *at, const struct val *lv, const char *s, size_t n)
{
	const struct loopobj *lo = lv->u.lo;
	size_t len = lo->items->n, i = lo->i;
#define IS(x) (n == sizeof(x) - 1 && !memcmp(s, x, n))
	if (IS("index"))
		return vint((int64_t)i + 1);
	if (IS("index0"))
		return vint((int64_t)i);
	if (IS("revindex"))
		return vint((int64_t)(len - i));
	if (IS("revindex0"))
		return vint((int64_t)(len - i - 1));
	if (IS("first"))
		return vbool(i == 0);
	if (IS("last"))
		return vbool(i + 1 == len);
	if (IS("length"))
		return vint((int64_t)len);
	if (IS("depth"))
		return vint(lo->depth);
	if (IS("depth0"))
		return vint(lo->depth - 1);
	if (IS("previtem"))
		return i > 0 ? lo->items->v[i - 1] : vundef("there is no previous item");
	if (IS("nextitem"))
		return i + 1 < len ? lo->items->v[i + 1] : vundef("there is no next item");
#undef IS
	int m = kj_meth_lookup(V_LOOP, 0, s, n);
	if (m >= 0)
		return kj_method_val(rt, at, lv, m);
	return kj_undef_of(s, n, V_LOOP, 0);
}

/* obj.name (Jinja: Python attribute first, then obj[name]). */
struct val kj_get_attr(struct rt *rt, const struct node *at, const struct val *obj, const char *s, size_t n)
{
	if (obj->t == V_UNDEF)
		kj_fail_undef(rt, at, obj);
	if (n >= 1 && s[0] == '_' && obj->t != V_DICT)
		return kj_undef_of(s, n, obj->t, 0); /* sandbox: private attributes */
	switch (obj->t) {
	case V_DICT: {
		int m = kj_meth_lookup(V_DICT, 0, s, n);
		if (m >= 0)
			return kj_method_val(rt, at, obj, m);
		const struct val *v = kj_dict_get_str(rt, at, obj->u.d, s, n);
		return v ? *v : kj_undef_of(s, n, V_DICT, 0);
	}
	case V_STR:
	case V_LIST: {
		int m = kj_meth_lookup(obj->t, obj->t == V_LIST ? obj->u.l->kind : 0, s, n);
		if (m >= 0)
			return kj_method_val(rt, at, obj, m);
		return kj_undef_of(s, n, obj->t, 0);
	}
	case V_NS: {
		const struct val *v = kj_dict_get_str(rt, at, obj->u.ns->d, s, n);
		return v ? *v : kj_undef_of(s, n, V_NS, 0);
	}
	case V_LOOP:
		return loop_attr(rt, at, obj, s, n);
	}
	return kj_undef_of(s, n, obj->t, 0);
}

static int is_ascii(const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)p[i] >= 0x80)
			return 0;
	return 1;
}

/* Byte offsets of each code point of s, plus the end: *offs has
 * count+1 entries (NULL when s is ASCII: offset == index). */
size_t kj_cp_offsets(struct rt *rt, const struct node *at, const char *p, size_t n, size_t **offs)
{
	if (is_ascii(p, n)) {
		*offs = NULL;
		return n;
	}
	size_t cnt = kv_utf8_count(p, n), k = 0;
	size_t *o = kj_ralloc(rt, at, (cnt + 1) * sizeof *o);
	for (size_t i = 0; i < n; i += (size_t)u8_len(p + i, n - i))
		o[k++] = i;
	o[k] = n;
	*offs = o;
	return k;
}

struct val kj_get_item(struct rt *rt, const struct node *at, const struct val *obj, const struct val *key)
{
	if (obj->t == V_UNDEF)
		kj_fail_undef(rt, at, obj);
	switch (obj->t) {
	case V_LIST:
		if (is_seq_list(obj) && is_intlike(key)) {
			int64_t i = key->u.i, len = (int64_t)obj->u.l->n;
			if (i < 0)
				i += len;
			if (i >= 0 && i < len)
				return obj->u.l->v[i];
			return kj_undef_of(NULL, 0, V_LIST, 1);
		}
		break;
	case V_STR:
		if (is_intlike(key)) {
			size_t *offs;
			size_t cnt = kj_cp_offsets(rt, at, obj->u.s.p, obj->u.s.n, &offs);
			int64_t i = key->u.i;
			if (i < 0)
				i += (int64_t)cnt;
			if (i >= 0 && (size_t)i < cnt) {
				struct val r = vstr(obj->u.s.p + OFF(offs, i), OFF(offs, i + 1) - OFF(offs, i));
				r.safe = obj->safe;
				return r;
			}
			return kj_undef_of(NULL, 0, V_STR, 1);
		}
		break;
	case V_DICT: {
		long i = kj_dict_find(rt, at, obj->u.d, key);
		if (i >= 0)
			return obj->u.d->v[i];
		break;
	}
	}
	if (key->t == V_STR)
		return kj_get_attr(rt, at, obj, key->u.s.p, key->u.s.n);
	return kj_undef_of(NULL, 0, obj->t, 1);
}

static int slice_index(struct rt *rt, const struct node *at, const struct val *v, int64_t *out)
{
	if (v->t == V_MISSING || v->t == V_NONE)
		return 0;
	if (!is_intlike(v))
		TYPE_ERR(rt, at, "slice indices must be integers or None, not %s", kj_kind_name(v));
	*out = v->u.i;
	return 1;
}

/* Python's PySlice_AdjustIndices; returns the slice length. */
static int64_t slice_adjust(struct rt *rt, const struct node *at, int64_t len, const struct val *a,
			    const struct val *b, const struct val *c, int64_t *start, int64_t *stop, int64_t *stepp)
{
	int64_t kj_step = 1;
	if (slice_index(rt, at, c, &kj_step) && kj_step == 0)
		TYPE_ERR(rt, at, "slice step cannot be zero");
	int64_t lower = kj_step > 0 ? 0 : -1, upper = kj_step > 0 ? len : len - 1;
	int64_t s0, s1;
	if (slice_index(rt, at, a, &s0)) {
		if (s0 < 0) {
			s0 += len;
			if (s0 < lower)
				s0 = lower;
		} else if (s0 > upper) {
			s0 = upper;
		}
	} else {
		s0 = kj_step > 0 ? lower : upper;
	}
	if (slice_index(rt, at, b, &s1)) {
		if (s1 < 0) {
			s1 += len;
			if (s1 < lower)
				s1 = lower;
		} else if (s1 > upper) {
			s1 = upper;
		}
	} else {
		s1 = kj_step > 0 ? upper : lower;
	}
	*start = s0;
	*stop = s1;
	*stepp = kj_step;
	if (kj_step > 0)
		return s0 < s1 ? (s1 - s0 - 1) / kj_step + 1 : 0;
	return s1 < s0 ? (s0 - s1 - 1) / (-kj_step) + 1 : 0;
}

struct val kj_do_slice(struct rt *rt, const struct node *at, const struct val *obj, const struct val *a,
			   const struct val *b, const struct val *c)
{
	int64_t start, stop, kj_step, cnt;
	if (obj->t == V_UNDEF)
		kj_fail_undef(rt, at, obj);
	if (obj->t == V_STR) {
		size_t *offs;
		size_t ncp = kj_cp_offsets(rt, at, obj->u.s.p, obj->u.s.n, &offs);
		cnt = slice_adjust(rt, at, (int64_t)ncp, a, b, c, &start, &stop, &kj_step);
		struct val r;
		if (kj_step == 1) {
			r = cnt ? vstr(obj->u.s.p + OFF(offs, start), OFF(offs, start + cnt) - OFF(offs, start))
				: vstr("", 0);
		} else {
			struct outbuf ob = {0};
			for (int64_t i = 0, k = start; i < cnt; i++, k += kj_step)
				kj_ob_add(rt, at, &ob, obj->u.s.p + OFF(offs, k), OFF(offs, k + 1) - OFF(offs, k));
			r = kj_ob_val(&ob);
		}
		r.safe = obj->safe;
		return r;
	}
	if (is_seq_list(obj)) {
		const struct list *l = obj->u.l;
		cnt = slice_adjust(rt, at, (int64_t)l->n, a, b, c, &start, &stop, &kj_step);
		struct list *r = kj_list_new(rt, at, (size_t)cnt, l->kind);
		for (int64_t i = 0, k = start; i < cnt; i++, k += kj_step)
			r->v[i] = l->v[k];
		if (l->kind == L_RANGE) {
			r->r0 = l->r0 + start * l->rs;
			r->r1 = l->r0 + stop * l->rs;
			r->rs = l->rs * kj_step;
		}
		return vlist(r);
	}
	return kj_undef_of(NULL, 0, obj->t, 1);
}

/* The items a for loop (or a filter) iterates over. */
const struct list *kj_iter_items(struct rt *rt, const struct node *at, const struct val *v)
{
	switch (v->t) {
	case V_LIST:
		return v->u.l;
	case V_DICT: {
		struct list *l = kj_list_new(rt, at, v->u.d->n, L_LIST);
		if (v->u.d->n)
			memcpy(l->v, v->u.d->k, v->u.d->n * sizeof *l->v);
		return l;
	}
	case V_STR: {
		size_t *offs;
		size_t cnt = kj_cp_offsets(rt, at, v->u.s.p, v->u.s.n, &offs);
		struct list *l = kj_list_new(rt, at, cnt, L_LIST);
		for (size_t i = 0; i < cnt; i++) {
			l->v[i] = vstr(v->u.s.p + OFF(offs, i), OFF(offs, i + 1) - OFF(offs, i));
			l->v[i].safe = v->safe;
		}
		return l;
	}
	case V_UNDEF:
		return kj_list_new(rt, at, 0, L_LIST);
	}
	TYPE_ERR(rt, at, "'%s' object is not iterable", kj_kind_name(v));
}

/* len(v), or a TypeError. */
int64_t kj_val_len(struct rt *rt, const struct node *at, const struct val *v)
{
	switch (v->t) {
	case V_STR:
		return (int64_t)kv_utf8_count(v->u.s.p, v->u.s.n);
	case V_LIST:
		if (v->u.l->kind != L_ITER)
			return (int64_t)v->u.l->n;
		break;
	case V_DICT:
		return (int64_t)v->u.d->n;
	case V_UNDEF:
		return 0;
	}
	TYPE_ERR(rt, at, "object of type '%s' has no len()", kj_kind_name(v));
}

/* ------------------------------------------------------------------------
 * Method names (attribute lookup finds them; jinja_builtins.c runs them)
 * ---------------------------------------------------------------------- */

const char *const kj_meth_names[M__COUNT] = {
	"capitalize", "center", "count", "endswith", "find", "format", "index", "isalnum", "isalpha",
	"isdigit", "islower", "isspace", "isupper", "join", "ljust", "lower", "lstrip", "partition",
	"removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit",
	"rstrip", "split", "splitlines", "startswith", "strip", "title", "upper", "zfill", "isnumeric",
	"isdecimal", "",
	"casefold", "encode", "expandtabs", "format_map", "isascii", "isidentifier", "isprintable",
	"istitle", "maketrans", "swapcase", "translate",
	"get", "items", "keys", "values", "copy", "",
	"clear", "fromkeys", "pop", "popitem", "setdefault", "update",
	"count", "index", "copy", "",
	"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort",
	"cycle", "changed",
};

/* Method id for a name on an object of the given kind, or -1. */
int kj_meth_lookup(int vkind, int lkind, const char *s, size_t n)
{
	int lo, hi;
	if (vkind == V_STR)
		lo = M_S_CAPITALIZE, hi = M_D_GET;
	else if (vkind == V_DICT)
		lo = M_D_GET, hi = M_L_COUNT;
	else if (vkind == V_LIST && (lkind == L_LIST || lkind == L_TUPLE))
		lo = M_L_COUNT, hi = M_LOOP_CYCLE;
	else if (vkind == V_LOOP)
		lo = M_LOOP_CYCLE, hi = M__COUNT;
	else
		return -1;
	for (int i = lo; i < hi; i++)
		if (kj_meth_names[i][0] && strlen(kj_meth_names[i]) == n && !memcmp(kj_meth_names[i], s, n)) {
			/* tuples have count/index only */
			if (vkind == V_LIST && lkind == L_TUPLE && i != M_L_COUNT && i != M_L_INDEX)
				return -1;
			return i;
		}
	return -1;
}

/* ------------------------------------------------------------------------
 * Markup: the escape of the e / escape filters and of safe concatenation
 * ---------------------------------------------------------------------- */

struct val kj_markup_escape(struct rt *rt, const struct node *at, const struct val *v)
{
	if (v->t == V_STR && v->safe)
		return *v;
	struct val s = kj_str_of(rt, at, v);
	struct outbuf b = {0};
	size_t run = 0;
	for (size_t i = 0; i < s.u.s.n; i++) {
		const char *e = NULL;
		switch (s.u.s.p[i]) {
		case '&': e = "&amp;"; break;
		case '<': e = "&lt;"; break;
		case '>': e = "&gt;"; break;
		case '"': e = "&#34;"; break;
		case '\'': e = "&#39;"; break;
		}
		if (!e) {
			run++;
			continue;
		}
		kj_ob_add(rt, at, &b, s.u.s.p + i - run, run);
		run = 0;
		kj_ob_adds(rt, at, &b, e);
	}
	struct val r;
	if (!b.n) {
		r = s;
	} else {
		kj_ob_add(rt, at, &b, s.u.s.p + s.u.s.n - run, run);
		r = kj_ob_val(&b);
	}
	r.safe = 1;
	return r;
}
