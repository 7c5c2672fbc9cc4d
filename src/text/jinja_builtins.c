/*
 * jinja_builtins.c - what a template can call: argument binding, the
 * methods of str / dict / list, the globals (range, namespace,
 * raise_exception, strftime_now, ...), macros, and Jinja's filters and
 * tests. The name tables the parser resolves against live here too.
 */
#include "text/jinja_int.h"
#include <errno.h>
#include <time.h>
#include <utf8proc.h>

/* ------------------------------------------------------------------------
 * Builtin tables: filters, tests, global functions, methods
 * ---------------------------------------------------------------------- */

/* Jinja's builtin filter names; ids past F_STRIPTAGS are known to Jinja but
 * not supported here (a compile-time error says so). */
const char *const kj_filt_names[F__COUNT] = {
	"abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape",
	"first", "float", "forceescape", "format", "indent", "int", "items", "join", "last", "length",
	"list", "lower", "map", "max", "min", "reject", "rejectattr", "replace", "reverse", "round",
	"safe", "select", "selectattr", "sort", "string", "sum", "title", "tojson", "trim", "truncate",
	"unique", "upper", "wordcount", "striptags", "slice", "groupby", "filesizeformat", "pprint",
	"random", "urlencode", "urlize", "wordwrap", "xmlattr",
};
const char *const kj_test_names[T__COUNT] = {
	"odd", "even", "divisibleby", "defined", "undefined", "filter", "test", "none", "boolean", "false",
	"true", "integer", "float", "lower", "upper", "string", "mapping", "number", "sequence",
	"iterable", "callable", "sameas", "escaped", "in", "==", "eq", "equalto", "!=", "ne", ">", "gt",
	"greaterthan", ">=", "ge", "<", "lt", "lessthan", "<=", "le",
};
const char *const kj_gfn_names[G__COUNT] = {
	"range", "namespace", "raise_exception", "strftime_now", "dict", "lipsum", "cycler", "joiner",
};

/* Methods of Python str/dict/list objects. The ones marked unsupported
 * below exist in Python; calling them is an error here rather than the
 * Undefined Jinja would give for a name Python does not have. */
enum meth {
	/* str */
	M_S_CAPITALIZE, M_S_CENTER, M_S_COUNT, M_S_ENDSWITH, M_S_FIND, M_S_FORMAT, M_S_INDEX, M_S_ISALNUM,
	M_S_ISALPHA, M_S_ISDIGIT, M_S_ISLOWER, M_S_ISSPACE, M_S_ISUPPER, M_S_JOIN, M_S_LJUST, M_S_LOWER,
	M_S_LSTRIP, M_S_PARTITION, M_S_REMOVEPREFIX, M_S_REMOVESUFFIX, M_S_REPLACE, M_S_RFIND, M_S_RINDEX,
	M_S_RJUST, M_S_RPARTITION, M_S_RSPLIT, M_S_RSTRIP, M_S_SPLIT, M_S_SPLITLINES, M_S_STARTSWITH,
	M_S_STRIP, M_S_TITLE, M_S_UPPER, M_S_ZFILL, M_S_ISNUMERIC, M_S_ISDECIMAL,
	M_S__UNSUPPORTED, /* marker: str methods below are not implemented */
	M_S_CASEFOLD, M_S_ENCODE, M_S_EXPANDTABS, M_S_FORMAT_MAP, M_S_ISASCII, M_S_ISIDENTIFIER,
	M_S_ISPRINTABLE, M_S_ISTITLE, M_S_MAKETRANS, M_S_SWAPCASE, M_S_TRANSLATE,
	/* dict */
	M_D_GET, M_D_ITEMS, M_D_KEYS, M_D_VALUES, M_D_COPY,
	M_D__UNSUPPORTED,
	M_D_CLEAR, M_D_FROMKEYS, M_D_POP, M_D_POPITEM, M_D_SETDEFAULT, M_D_UPDATE,
	/* list / tuple */
	M_L_COUNT, M_L_INDEX, M_L_COPY,
	M_L__UNSUPPORTED,
	M_L_APPEND, M_L_CLEAR, M_L_EXTEND, M_L_INSERT, M_L_POP, M_L_REMOVE, M_L_REVERSE, M_L_SORT,
	/* loop */
	M_LOOP_CYCLE, M_LOOP_CHANGED,
	M__COUNT
};
static const char *const meth_names[M__COUNT] = {
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

int kj_find_name(const char *const *tab, int n, const char *s, size_t len)
{
	for (int i = 0; i < n; i++)
		if (tab[i] && strlen(tab[i]) == len && !memcmp(tab[i], s, len))
			return i;
	return -1;
}

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
		if (meth_names[i][0] && strlen(meth_names[i]) == n && !memcmp(meth_names[i], s, n)) {
			/* tuples have count/index only */
			if (vkind == V_LIST && lkind == L_TUPLE && i != M_L_COUNT && i != M_L_INDEX)
				return -1;
			return i;
		}
	return -1;
}

static int meth_supported(int id)
{
	return !((id > M_S__UNSUPPORTED && id < M_D_GET) || (id > M_D__UNSUPPORTED && id < M_L_COUNT) ||
		 (id > M_L__UNSUPPORTED && id < M_LOOP_CYCLE) || id == M_LOOP_CHANGED);
}

/* ------------------------------------------------------------------------
 * Calls: argument binding, str/dict/list methods, globals, macros
 * ---------------------------------------------------------------------- */

/* Bind args to parameter names pn[0..np). out[i] is V_MISSING when not
 * given; the first nreq parameters are required. */
static void bind(struct rt *rt, const struct node *at, const char *fname, const char *const *pn, int np, int nreq,
		 const struct args *a, struct val *out)
{
	if (a->n > np)
		TYPE_ERR(rt, at, "%s() takes at most %d argument%s (%d given)", fname, np, np == 1 ? "" : "s", a->n);
	for (int i = 0; i < np; i++)
		out[i] = i < a->n ? a->v[i] : KJ_MISSING;
	for (int k = 0; k < a->nkw; k++) {
		int i;
		for (i = 0; i < np; i++)
			if (!strcmp(pn[i], a->kwn[k]))
				break;
		if (i == np)
			TYPE_ERR(rt, at, "%s() got an unexpected keyword argument '%s'", fname, a->kwn[k]);
		if (out[i].t != V_MISSING)
			TYPE_ERR(rt, at, "%s() got multiple values for argument '%s'", fname, a->kwn[k]);
		out[i] = a->kwv[k];
	}
	for (int i = 0; i < nreq; i++)
		if (out[i].t == V_MISSING)
			TYPE_ERR(rt, at, "%s() missing required argument '%s'", fname, pn[i]);
}

static int64_t want_int(struct rt *rt, const struct node *at, const char *fname, const struct val *v)
{
	if (!is_intlike(v))
		TYPE_ERR(rt, at, "%s(): '%s' object cannot be interpreted as an integer", fname, kj_kind_name(v));
	return v->u.i;
}

static const struct val *want_str(struct rt *rt, const struct node *at, const char *fname, const struct val *v)
{
	if (v->t != V_STR)
		TYPE_ERR(rt, at, "%s(): expected a string, got %s", fname, kj_kind_name(v));
	return v;
}

/* --- case mapping ---------------------------------------------------------- */

enum { CASE_LOWER, CASE_UPPER, CASE_TITLE, CASE_CAPITALIZE };

static struct val str_case(struct rt *rt, const struct node *at, const struct val *s, int mode)
{
	struct outbuf b = {0};
	const char *p = s->u.s.p;
	size_t n = s->u.s.n, i = 0;
	int prev_cased = 0, first = 1;
	while (i < n) {
		int32_t c;
		int l = kv_utf8_decode(p + i, n - i, &c);
		if (!l) {
			c = (unsigned char)p[i];
			l = 1;
		}
		if (kj_special_casing(c))
			UNSUP(rt, at, "case mapping of U+%04X (it maps to several characters; not supported)",
			      (unsigned)c);
		int32_t r = c;
		switch (mode) {
		case CASE_LOWER: r = utf8proc_tolower(c); break;
		case CASE_UPPER: r = utf8proc_toupper(c); break;
		case CASE_TITLE:
			r = prev_cased ? utf8proc_tolower(c) : utf8proc_totitle(c);
			prev_cased = kj_py_iscased(c);
			break;
		case CASE_CAPITALIZE:
			r = first ? utf8proc_totitle(c) : utf8proc_tolower(c);
			break;
		}
		first = 0;
		kj_ob_cp(rt, at, &b, r);
		i += (size_t)l;
	}
	struct val v = kj_ob_val(&b);
	v.safe = s->safe;
	return v;
}

/* Python's str.islower()/isupper(): at least one cased character and
 * none of the other case (titlecase letters fail both). */
static int str_is_case(const struct val *s, int upper)
{
	int cased = 0;
	for (size_t i = 0; i < s->u.s.n;) {
		int32_t c;
		int l = kv_utf8_decode(s->u.s.p + i, s->u.s.n - i, &c);
		if (!l)
			return 0;
		i += (size_t)l;
		int k = utf8proc_category(c);
		if (k == UTF8PROC_CATEGORY_LT)
			return 0;
		if (k == UTF8PROC_CATEGORY_LU) {
			if (!upper)
				return 0;
			cased = 1;
		} else if (k == UTF8PROC_CATEGORY_LL) {
			if (upper)
				return 0;
			cased = 1;
		}
	}
	return cased;
}

/* --- strip / split / replace ------------------------------------------------- */

static int in_set(const int32_t *set, int n, int32_t c)
{
	for (int i = 0; i < n; i++)
		if (set[i] == c)
			return 1;
	return 0;
}

/* which: 1 left, 2 right, 3 both. chars: V_MISSING/None = whitespace. */
static struct val str_strip(struct rt *rt, const struct node *at, const struct val *s, const struct val *chars,
			    int which)
{
	const char *p = s->u.s.p;
	size_t a = 0, b = s->u.s.n;
	int32_t set[64];
	int nset = -1;
	if (chars && chars->t != V_MISSING && chars->t != V_NONE) {
		if (chars->t != V_STR)
			TYPE_ERR(rt, at, "strip arg must be None or str");
		nset = 0;
		for (size_t i = 0; i < chars->u.s.n;) {
			int32_t c;
			int l = kv_utf8_decode(chars->u.s.p + i, chars->u.s.n - i, &c);
			if (!l) {
				c = (unsigned char)chars->u.s.p[i];
				l = 1;
			}
			if (nset == 64)
				UNSUP(rt, at, "strip() with more than 64 characters");
			set[nset++] = c;
			i += (size_t)l;
		}
	}
#define IN_SET(c) (nset < 0 ? kj_py_isspace(c) : in_set(set, nset, c))
	if (which & 1) {
		while (a < b) {
			int32_t c;
			int l = kv_utf8_decode(p + a, b - a, &c);
			if (!l || !IN_SET(c))
				break;
			a += (size_t)l;
		}
	}
	if (which & 2) {
		while (b > a) {
			size_t q = b - 1;
			while (q > a && ((unsigned char)p[q] & 0xC0) == 0x80)
				q--;
			int32_t c;
			int l = kv_utf8_decode(p + q, b - q, &c);
			if (!l || !IN_SET(c))
				break;
			b = q;
		}
	}
#undef IN_SET
	struct val r = vstr(p + a, b - a);
	r.safe = s->safe;
	return r;
}


static struct val str_split(struct rt *rt, const struct node *at, const struct val *s, const struct val *sep,
			    int64_t maxsplit, int right)
{
	struct lbuild lb = {0};
	const char *p = s->u.s.p;
	size_t n = s->u.s.n;
	if (sep->t == V_MISSING || sep->t == V_NONE) {
		/* runs of whitespace, ends ignored */
		struct lbuild parts = {0};
		size_t i = 0;
		while (i < n) {
			int32_t c;
			int l;
			while (i < n && (l = kv_utf8_decode(p + i, n - i, &c)) && kj_py_isspace(c))
				i += (size_t)l;
			if (i >= n)
				break;
			size_t st = i;
			while (i < n) {
				l = kv_utf8_decode(p + i, n - i, &c);
				if (!l)
					l = 1, c = 0;
				if (kj_py_isspace(c))
					break;
				i += (size_t)l;
			}
			struct val w = vstr(p + st, i - st);
			w.safe = s->safe;
			kj_lb_push(rt, at, &parts, w);
		}
		if (maxsplit < 0 || (size_t)maxsplit + 1 >= parts.n)
			return kj_lb_done(rt, at, &parts, L_LIST);
		/* with maxsplit the remainder keeps its inner whitespace */
		if (!right) {
			for (size_t k = 0; k < (size_t)maxsplit; k++)
				kj_lb_push(rt, at, &lb, parts.v[k]);
			const char *rest = parts.v[maxsplit].u.s.p;
			struct val w = vstr(rest, (size_t)(p + n - rest));
			w = str_strip(rt, at, &w, NULL, 2);
			kj_lb_push(rt, at, &lb, w);
		} else {
			size_t keep = parts.n - (size_t)maxsplit;
			const struct val *lastk = &parts.v[keep - 1];
			struct val w = vstr(p, (size_t)(lastk->u.s.p + lastk->u.s.n - p));
			w = str_strip(rt, at, &w, NULL, 1);
			kj_lb_push(rt, at, &lb, w);
			for (size_t k = keep; k < parts.n; k++)
				kj_lb_push(rt, at, &lb, parts.v[k]);
		}
		return kj_lb_done(rt, at, &lb, L_LIST);
	}
	if (sep->t != V_STR)
		TYPE_ERR(rt, at, "must be str or None, not %s", kj_kind_name(sep));
	if (!sep->u.s.n)
		TYPE_ERR(rt, at, "empty separator");
	const char *q = sep->u.s.p;
	size_t m = sep->u.s.n;
	if (!right) {
		size_t i = 0;
		int64_t done = 0;
		for (;;) {
			const char *hit = maxsplit >= 0 && done >= maxsplit ? NULL : memmem(p + i, n - i, q, m);
			if (!hit) {
				struct val w = vstr(p + i, n - i);
				w.safe = s->safe;
				kj_lb_push(rt, at, &lb, w);
				break;
			}
			struct val w = vstr(p + i, (size_t)(hit - (p + i)));
			w.safe = s->safe;
			kj_lb_push(rt, at, &lb, w);
			i = (size_t)(hit - p) + m;
			done++;
			kj_step(rt, at, 1);
		}
		return kj_lb_done(rt, at, &lb, L_LIST);
	}
	/* rsplit: collect from the right, then reverse */
	size_t end = n;
	int64_t done = 0;
	for (;;) {
		const char *hit = NULL;
		if (!(maxsplit >= 0 && done >= maxsplit) && end >= m)
			for (size_t j = end - m + 1; j-- > 0;)
				if (!memcmp(p + j, q, m)) {
					hit = p + j;
					break;
				}
		if (!hit) {
			struct val w = vstr(p, end);
			w.safe = s->safe;
			kj_lb_push(rt, at, &lb, w);
			break;
		}
		struct val w = vstr(hit + m, (size_t)(p + end - (hit + m)));
		w.safe = s->safe;
		kj_lb_push(rt, at, &lb, w);
		end = (size_t)(hit - p);
		done++;
		kj_step(rt, at, 1);
	}
	for (size_t a = 0, b = lb.n ? lb.n - 1 : 0; a < b; a++, b--) {
		struct val t = lb.v[a];
		lb.v[a] = lb.v[b];
		lb.v[b] = t;
	}
	return kj_lb_done(rt, at, &lb, L_LIST);
}

static struct val str_replace(struct rt *rt, const struct node *at, const struct val *s, const struct val *old,
			      const struct val *new, int64_t count)
{
	struct outbuf b = {0};
	const char *p = s->u.s.p;
	size_t n = s->u.s.n, i = 0;
	int64_t done = 0;
	if (!old->u.s.n) {
		/* '' matches between every character and at both ends */
		size_t *offs;
		size_t cnt = kj_cp_offsets(rt, at, p, n, &offs);
		for (size_t k = 0; k <= cnt; k++) {
			if (count < 0 || done < count) {
				kj_ob_add(rt, at, &b, new->u.s.p, new->u.s.n);
				done++;
			}
			if (k < cnt)
				kj_ob_add(rt, at, &b, p + OFF(offs, k), OFF(offs, k + 1) - OFF(offs, k));
		}
		return kj_ob_val(&b);
	}
	for (;;) {
		const char *hit = count >= 0 && done >= count ? NULL : memmem(p + i, n - i, old->u.s.p, old->u.s.n);
		if (!hit) {
			if (i == 0)
				return *s; /* nothing replaced: the same string */
			kj_ob_add(rt, at, &b, p + i, n - i);
			break;
		}
		kj_ob_add(rt, at, &b, p + i, (size_t)(hit - (p + i)));
		kj_ob_add(rt, at, &b, new->u.s.p, new->u.s.n);
		i = (size_t)(hit - p) + old->u.s.n;
		done++;
	}
	return kj_ob_val(&b);
}

static struct val str_pad(struct rt *rt, const struct node *at, const struct val *s, int64_t width,
			  const struct val *fill, int mode /* 0 center, 1 ljust, 2 rjust */)
{
	int64_t len = (int64_t)kv_utf8_count(s->u.s.p, s->u.s.n);
	const char *f = " ";
	size_t fl = 1;
	if (fill && fill->t != V_MISSING) {
		if (fill->t != V_STR || kv_utf8_count(fill->u.s.p, fill->u.s.n) != 1)
			TYPE_ERR(rt, at, "the fill character must be exactly one character long");
		f = fill->u.s.p;
		fl = fill->u.s.n;
	}
	if (width <= len)
		return *s;
	if (width > (int64_t)rt->max_out)
		kj_rfail(rt, at, KV_ERR_INVALID, "padding wider than the output cap");
	int64_t marg = width - len, left;
	if (mode == 0)
		left = marg / 2 + (marg & width & 1);
	else if (mode == 1)
		left = 0;
	else
		left = marg;
	struct outbuf b = {0};
	for (int64_t i = 0; i < left; i++)
		kj_ob_add(rt, at, &b, f, fl);
	kj_ob_add(rt, at, &b, s->u.s.p, s->u.s.n);
	for (int64_t i = 0; i < marg - left; i++)
		kj_ob_add(rt, at, &b, f, fl);
	struct val r = kj_ob_val(&b);
	r.safe = s->safe;
	return r;
}

static int is_line_break(int32_t c)
{
	return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
	       c == 0x85 || c == 0x2028 || c == 0x2029;
}

static struct val str_splitlines(struct rt *rt, const struct node *at, const struct val *s, int keepends)
{
	struct lbuild lb = {0};
	const char *p = s->u.s.p;
	size_t n = s->u.s.n, i = 0, st = 0;
	while (i < n) {
		int32_t c;
		int l = kv_utf8_decode(p + i, n - i, &c);
		if (!l)
			l = 1, c = 0;
		if (is_line_break(c)) {
			size_t e = i + (size_t)l;
			if (c == '\r' && e < n && p[e] == '\n')
				e++;
			struct val w = vstr(p + st, (keepends ? e : i) - st);
			w.safe = s->safe;
			kj_lb_push(rt, at, &lb, w);
			i = st = e;
			continue;
		}
		i += (size_t)l;
	}
	if (st < n) {
		struct val w = vstr(p + st, n - st);
		w.safe = s->safe;
		kj_lb_push(rt, at, &lb, w);
	}
	return kj_lb_done(rt, at, &lb, L_LIST);
}

/* Code-point index of the first/last occurrence of sub, or -1. */
static int64_t str_find(const struct val *s, const struct val *sub, int last)
{
	const char *p = s->u.s.p, *hit = NULL;
	size_t n = s->u.s.n, m = sub->u.s.n;
	if (!last) {
		hit = m ? memmem(p, n, sub->u.s.p, m) : p;
	} else if (m <= n) {
		for (size_t j = n - m + 1; j-- > 0;)
			if (!memcmp(p + j, sub->u.s.p, m)) {
				hit = p + j;
				break;
			}
	}
	return hit ? (int64_t)kv_utf8_count(p, (size_t)(hit - p)) : -1;
}

static struct val str_join(struct rt *rt, const struct node *at, const struct val *sep, const struct list *items,
			   int strict)
{
	struct outbuf b = {0};
	for (size_t i = 0; i < items->n; i++) {
		if (i)
			kj_ob_add(rt, at, &b, sep->u.s.p, sep->u.s.n);
		if (items->v[i].t == V_STR) {
			kj_ob_add(rt, at, &b, items->v[i].u.s.p, items->v[i].u.s.n);
		} else if (strict) {
			TYPE_ERR(rt, at, "sequence item %zu: expected str instance, %s found", i, kj_kind_name(&items->v[i]));
		} else {
			kj_to_str(rt, at, &items->v[i], &b, 0);
		}
	}
	return kj_ob_val(&b);
}

/* Python's str.format for "{}", "{0}", "{name}", "{{", "}}" and the !s/!r
 * conversions; format specs and field access are not supported. */
static struct val str_format(struct rt *rt, const struct node *at, const struct val *fmt, const struct args *a)
{
	struct outbuf b = {0};
	const char *p = fmt->u.s.p;
	size_t n = fmt->u.s.n, i = 0;
	int auto_idx = 0;
	while (i < n) {
		char c = p[i];
		if (c == '{' && i + 1 < n && p[i + 1] == '{') {
			kj_ob_addc(rt, at, &b, '{');
			i += 2;
			continue;
		}
		if (c == '}' && i + 1 < n && p[i + 1] == '}') {
			kj_ob_addc(rt, at, &b, '}');
			i += 2;
			continue;
		}
		if (c == '}')
			TYPE_ERR(rt, at, "single '}' encountered in format string");
		if (c != '{') {
			kj_ob_addc(rt, at, &b, c);
			i++;
			continue;
		}
		size_t j = i + 1;
		while (j < n && p[j] != '}')
			j++;
		if (j >= n)
			TYPE_ERR(rt, at, "single '{' encountered in format string");
		const char *f = p + i + 1;
		size_t fl = j - i - 1, nl = 0;
		while (nl < fl && f[nl] != '!' && f[nl] != ':')
			nl++;
		int conv = 's';
		if (nl < fl && f[nl] == '!' && nl + 2 == fl && (f[nl + 1] == 'r' || f[nl + 1] == 's'))
			conv = f[nl + 1];
		else if (nl < fl)
			UNSUP(rt, at, "str.format() with format specs or conversions other than !r/!s");
		const struct val *v = NULL;
		if (nl == 0) {
			if (auto_idx >= a->n)
				TYPE_ERR(rt, at, "str.format(): replacement index %d out of range", auto_idx);
			v = &a->v[auto_idx++];
		} else if (f[0] >= '0' && f[0] <= '9') {
			int k = 0;
			for (size_t q = 0; q < nl; q++) {
				if (f[q] < '0' || f[q] > '9' || k > 100000)
					UNSUP(rt, at, "str.format() field access is not supported");
				k = k * 10 + (f[q] - '0');
			}
			if (k >= a->n)
				TYPE_ERR(rt, at, "str.format(): replacement index %d out of range", k);
			v = &a->v[k];
		} else {
			for (size_t q = 0; q < nl; q++)
				if (f[q] == '.' || f[q] == '[')
					UNSUP(rt, at, "str.format() field access is not supported");
			for (int k = 0; k < a->nkw; k++)
				if (strlen(a->kwn[k]) == nl && !memcmp(a->kwn[k], f, nl))
					v = &a->kwv[k];
			if (!v)
				TYPE_ERR(rt, at, "str.format(): no argument named '%.*s'", (int)nl, f);
		}
		if (conv == 'r')
			kj_to_repr(rt, at, v, &b, 0);
		else
			kj_to_str(rt, at, v, &b, 0);
		i = j + 1;
	}
	return kj_ob_val(&b);
}

static int startsends(struct rt *rt, const struct node *at, const struct val *s, const struct val *x, int ends)
{
	if (x->t == V_LIST && x->u.l->kind == L_TUPLE) {
		for (size_t i = 0; i < x->u.l->n; i++)
			if (startsends(rt, at, s, &x->u.l->v[i], ends))
				return 1;
		return 0;
	}
	if (x->t != V_STR)
		TYPE_ERR(rt, at, "%s first arg must be str or a tuple of str, not %s", ends ? "endswith" : "startswith",
			 kj_kind_name(x));
	if (x->u.s.n > s->u.s.n)
		return 0;
	return !memcmp(s->u.s.p + (ends ? s->u.s.n - x->u.s.n : 0), x->u.s.p, x->u.s.n);
}

static int str_all(const struct val *s, int (*pred)(int32_t))
{
	if (!s->u.s.n)
		return 0;
	for (size_t i = 0; i < s->u.s.n;) {
		int32_t c;
		int l = kv_utf8_decode(s->u.s.p + i, s->u.s.n - i, &c);
		if (!l || !pred(c))
			return 0;
		i += (size_t)l;
	}
	return 1;
}

static int py_isnumeric_cp(int32_t c)
{
	if (c < 0x80)
		return c >= '0' && c <= '9';
	int k = utf8proc_category(c);
	return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* A str method argument; on a Markup receiver plain strings are escaped
 * first, as markupsafe does. */
static struct val marg(struct rt *rt, const struct node *at, const struct val *self, const struct val *v)
{
	if (self->safe && v->t == V_STR && !v->safe)
		return kj_markup_escape(rt, at, v);
	return *v;
}

static struct val call_method(struct rt *rt, const struct node *at, const struct val *self, int id,
			      const struct args *a)
{
	struct val p[4];
	const char *name = meth_names[id];
	char fname[48];
	snprintf(fname, sizeof fname, "%s.%s", kj_kind_name(self), name);
	if (!meth_supported(id)) {
		if ((id > M_D__UNSUPPORTED && id < M_L_COUNT) || (id > M_L__UNSUPPORTED && id < M_LOOP_CYCLE))
			TYPE_ERR(rt, at, "access to attribute '%s' of '%s' object is unsafe (templates cannot modify "
					 "lists or dicts)", name, kj_kind_name(self));
		UNSUP(rt, at, "%s() is not supported", fname);
	}
	if (self->t == V_STR) {
		static const char *const n1[] = {"chars"}, *const nsep[] = {"sep", "maxsplit"},
				  *const nrep[] = {"old", "new", "count"}, *const nw[] = {"width", "fillchar"},
				  *const nsub[] = {"sub"}, *const nke[] = {"keepends"}, *const nx[] = {"x"};
		switch (id) {
		case M_S_STRIP:
		case M_S_LSTRIP:
		case M_S_RSTRIP:
			bind(rt, at, fname, n1, 1, 0, a, p);
			if (p[0].t == V_STR)
				p[0] = marg(rt, at, self, &p[0]);
			return str_strip(rt, at, self, &p[0], id == M_S_STRIP ? 3 : id == M_S_LSTRIP ? 1 : 2);
		case M_S_SPLIT:
		case M_S_RSPLIT:
			bind(rt, at, fname, nsep, 2, 0, a, p);
			if (p[0].t == V_STR)
				p[0] = marg(rt, at, self, &p[0]);
			return str_split(rt, at, self, &p[0], p[1].t == V_MISSING ? -1 : want_int(rt, at, fname, &p[1]),
					 id == M_S_RSPLIT);
		case M_S_REPLACE:
			bind(rt, at, fname, nrep, 3, 2, a, p);
			want_str(rt, at, fname, &p[0]);
			want_str(rt, at, fname, &p[1]);
			p[0] = marg(rt, at, self, &p[0]);
			p[1] = marg(rt, at, self, &p[1]);
			{
				struct val r = str_replace(rt, at, self, &p[0], &p[1],
							   p[2].t == V_MISSING ? -1 : want_int(rt, at, fname, &p[2]));
				r.safe = self->safe;
				return r;
			}
		case M_S_STARTSWITH:
		case M_S_ENDSWITH:
			if (a->n != 1 || a->nkw)
				UNSUP(rt, at, "%s() with start/end arguments", fname);
			return vbool(startsends(rt, at, self, &a->v[0], id == M_S_ENDSWITH));
		case M_S_UPPER:
		case M_S_LOWER:
		case M_S_TITLE:
		case M_S_CAPITALIZE:
			bind(rt, at, fname, NULL, 0, 0, a, p);
			return str_case(rt, at, self, id == M_S_UPPER ? CASE_UPPER : id == M_S_LOWER ? CASE_LOWER
							     : id == M_S_TITLE ? CASE_TITLE : CASE_CAPITALIZE);
		case M_S_CENTER:
		case M_S_LJUST:
		case M_S_RJUST:
			bind(rt, at, fname, nw, 2, 1, a, p);
			return str_pad(rt, at, self, want_int(rt, at, fname, &p[0]), &p[1],
				       id == M_S_CENTER ? 0 : id == M_S_LJUST ? 1 : 2);
		case M_S_ZFILL: {
			bind(rt, at, fname, nw, 1, 1, a, p);
			int64_t w = want_int(rt, at, fname, &p[0]), len = (int64_t)kv_utf8_count(self->u.s.p, self->u.s.n);
			if (w <= len)
				return *self;
			if (w > (int64_t)rt->max_out)
				kj_rfail(rt, at, KV_ERR_INVALID, "padding wider than the output cap");
			struct outbuf b = {0};
			size_t sign = self->u.s.n && (self->u.s.p[0] == '-' || self->u.s.p[0] == '+');
			kj_ob_add(rt, at, &b, self->u.s.p, sign);
			for (int64_t i = 0; i < w - len; i++)
				kj_ob_addc(rt, at, &b, '0');
			kj_ob_add(rt, at, &b, self->u.s.p + sign, self->u.s.n - sign);
			return kj_ob_val(&b);
		}
		case M_S_COUNT: {
			if (a->n != 1 || a->nkw)
				UNSUP(rt, at, "%s() with start/end arguments", fname);
			want_str(rt, at, fname, &a->v[0]);
			if (!a->v[0].u.s.n)
				return vint((int64_t)kv_utf8_count(self->u.s.p, self->u.s.n) + 1);
			int64_t c = 0;
			const char *q = self->u.s.p, *e = q + self->u.s.n;
			while ((q = memmem(q, (size_t)(e - q), a->v[0].u.s.p, a->v[0].u.s.n))) {
				c++;
				q += a->v[0].u.s.n;
			}
			return vint(c);
		}
		case M_S_FIND:
		case M_S_RFIND:
		case M_S_INDEX:
		case M_S_RINDEX: {
			if (a->n != 1 || a->nkw)
				UNSUP(rt, at, "%s() with start/end arguments", fname);
			want_str(rt, at, fname, &a->v[0]);
			int64_t r = str_find(self, &a->v[0], id == M_S_RFIND || id == M_S_RINDEX);
			if (r < 0 && (id == M_S_INDEX || id == M_S_RINDEX))
				TYPE_ERR(rt, at, "substring not found");
			return vint(r);
		}
		case M_S_PARTITION:
		case M_S_RPARTITION: {
			bind(rt, at, fname, nsub, 1, 1, a, p);
			want_str(rt, at, fname, &p[0]);
			if (!p[0].u.s.n)
				TYPE_ERR(rt, at, "empty separator");
			struct list *l = kj_list_new(rt, at, 3, L_TUPLE);
			int64_t k = str_find(self, &p[0], id == M_S_RPARTITION);
			if (k < 0) {
				l->v[0] = id == M_S_PARTITION ? *self : vstr("", 0);
				l->v[1] = vstr("", 0);
				l->v[2] = id == M_S_PARTITION ? vstr("", 0) : *self;
			} else {
				size_t *offs;
				kj_cp_offsets(rt, at, self->u.s.p, self->u.s.n, &offs);
				size_t b0 = OFF(offs, k), b1 = b0 + p[0].u.s.n;
				l->v[0] = vstr(self->u.s.p, b0);
				l->v[1] = p[0];
				l->v[2] = vstr(self->u.s.p + b1, self->u.s.n - b1);
			}
			return vlist(l);
		}
		case M_S_REMOVEPREFIX:
		case M_S_REMOVESUFFIX: {
			bind(rt, at, fname, nsub, 1, 1, a, p);
			want_str(rt, at, fname, &p[0]);
			int e = id == M_S_REMOVESUFFIX;
			if (p[0].u.s.n && startsends(rt, at, self, &p[0], e)) {
				struct val r = vstr(self->u.s.p + (e ? 0 : p[0].u.s.n), self->u.s.n - p[0].u.s.n);
				r.safe = self->safe;
				return r;
			}
			return *self;
		}
		case M_S_SPLITLINES:
			bind(rt, at, fname, nke, 1, 0, a, p);
			return str_splitlines(rt, at, self, p[0].t != V_MISSING && kj_truthy(&p[0]));
		case M_S_JOIN: {
			bind(rt, at, fname, nx, 1, 1, a, p);
			return str_join(rt, at, self, kj_iter_items(rt, at, &p[0]), 1);
		}
		case M_S_FORMAT:
			return str_format(rt, at, self, a);
		case M_S_ISALNUM: bind(rt, at, fname, NULL, 0, 0, a, p); return vbool(str_all(self, kj_py_isalnum));
		case M_S_ISALPHA: bind(rt, at, fname, NULL, 0, 0, a, p); return vbool(str_all(self, kj_py_isalpha));
		case M_S_ISDIGIT:
		case M_S_ISDECIMAL: bind(rt, at, fname, NULL, 0, 0, a, p); return vbool(str_all(self, kj_py_isdigit));
		case M_S_ISNUMERIC: bind(rt, at, fname, NULL, 0, 0, a, p); return vbool(str_all(self, py_isnumeric_cp));
		case M_S_ISSPACE: bind(rt, at, fname, NULL, 0, 0, a, p); return vbool(str_all(self, kj_py_isspace));
		case M_S_ISLOWER: bind(rt, at, fname, NULL, 0, 0, a, p); return vbool(str_is_case(self, 0));
		case M_S_ISUPPER: bind(rt, at, fname, NULL, 0, 0, a, p); return vbool(str_is_case(self, 1));
		}
	}
	if (self->t == V_DICT) {
		static const char *const nget[] = {"key", "default"};
		const struct dict *d = self->u.d;
		switch (id) {
		case M_D_GET: {
			bind(rt, at, fname, nget, 2, 1, a, p);
			long i = kj_dict_find(rt, at, d, &p[0]);
			return i >= 0 ? d->v[i] : p[1].t == V_MISSING ? KJ_NONE : p[1];
		}
		case M_D_ITEMS: {
			bind(rt, at, fname, NULL, 0, 0, a, p);
			struct list *l = kj_list_new(rt, at, d->n, L_ITEMS);
			for (size_t i = 0; i < d->n; i++) {
				struct list *pair = kj_list_new(rt, at, 2, L_TUPLE);
				pair->v[0] = d->k[i];
				pair->v[1] = d->v[i];
				l->v[i] = vlist(pair);
			}
			return vlist(l);
		}
		case M_D_KEYS:
		case M_D_VALUES: {
			bind(rt, at, fname, NULL, 0, 0, a, p);
			struct list *l = kj_list_new(rt, at, d->n, id == M_D_KEYS ? L_KEYS : L_VALUES);
			if (d->n)
				memcpy(l->v, id == M_D_KEYS ? d->k : d->v, d->n * sizeof *l->v);
			return vlist(l);
		}
		case M_D_COPY: {
			bind(rt, at, fname, NULL, 0, 0, a, p);
			struct dict *c = kj_dict_new(rt, at, d->n);
			for (size_t i = 0; i < d->n; i++)
				kj_dict_set(rt, at, c, d->k[i], d->v[i]);
			return vdict(c);
		}
		}
	}
	if (self->t == V_LIST) {
		static const char *const nx[] = {"x"};
		const struct list *l = self->u.l;
		switch (id) {
		case M_L_COUNT: {
			bind(rt, at, fname, nx, 1, 1, a, p);
			int64_t c = 0;
			for (size_t i = 0; i < l->n; i++)
				c += kj_val_eq(rt, at, &l->v[i], &p[0], 0);
			return vint(c);
		}
		case M_L_INDEX:
			if (a->n != 1 || a->nkw)
				UNSUP(rt, at, "%s() with start/end arguments", fname);
			for (size_t i = 0; i < l->n; i++)
				if (kj_val_eq(rt, at, &l->v[i], &a->v[0], 0))
					return vint((int64_t)i);
			TYPE_ERR(rt, at, "%s(): value is not in the list", fname);
		case M_L_COPY: {
			bind(rt, at, fname, NULL, 0, 0, a, p);
			struct list *c = kj_list_new(rt, at, l->n, l->kind);
			memcpy(c->v, l->v, l->n * sizeof *l->v);
			return vlist(c);
		}
		}
	}
	if (self->t == V_LOOP && id == M_LOOP_CYCLE) {
		if (a->nkw || a->n == 0)
			TYPE_ERR(rt, at, "loop.cycle(): no items for cycling given");
		return a->v[self->u.lo->i % (size_t)a->n];
	}
	UNSUP(rt, at, "%s() is not supported", fname);
}

static struct val call_global(struct rt *rt, const struct node *at, int fn, const struct args *a)
{
	struct val p[3];
	switch (fn) {
	case G_RANGE: {
		int64_t r0 = 0, r1, rs = 1;
		if (a->nkw)
			TYPE_ERR(rt, at, "range() takes no keyword arguments");
		if (a->n < 1 || a->n > 3)
			TYPE_ERR(rt, at, "range expected 1 to 3 arguments, got %d", a->n);
		if (a->n == 1) {
			r1 = want_int(rt, at, "range", &a->v[0]);
		} else {
			r0 = want_int(rt, at, "range", &a->v[0]);
			r1 = want_int(rt, at, "range", &a->v[1]);
			if (a->n == 3)
				rs = want_int(rt, at, "range", &a->v[2]);
		}
		if (rs == 0)
			TYPE_ERR(rt, at, "range() arg 3 must not be zero");
		int64_t cnt = 0;
		if (rs > 0 && r0 < r1)
			cnt = (int64_t)(((__int128)r1 - r0 - 1) / rs + 1);
		else if (rs < 0 && r0 > r1)
			cnt = (int64_t)(((__int128)r0 - r1 - 1) / -(__int128)rs + 1);
		if (cnt > TM_MAX_RANGE)
			TYPE_ERR(rt, at, "range too big: the sandbox blocks ranges larger than %d items", TM_MAX_RANGE);
		struct list *l = kj_list_new(rt, at, (size_t)cnt, L_RANGE);
		l->r0 = r0;
		l->r1 = r1;
		l->rs = rs;
		for (int64_t i = 0; i < cnt; i++)
			l->v[i] = vint(r0 + i * rs);
		return vlist(l);
	}
	case G_NAMESPACE:
	case G_DICT: {
		struct dict *d = kj_dict_new(rt, at, 0);
		if (a->n > 1)
			TYPE_ERR(rt, at, "%s() expected at most 1 positional argument", kj_gfn_names[fn]);
		if (a->n == 1) {
			const struct val *src = &a->v[0];
			if (src->t == V_DICT) {
				for (size_t i = 0; i < src->u.d->n; i++)
					kj_dict_set(rt, at, d, src->u.d->k[i], src->u.d->v[i]);
			} else {
				const struct list *l = kj_iter_items(rt, at, src);
				for (size_t i = 0; i < l->n; i++) {
					const struct val *e = &l->v[i];
					if (!is_seq_list(e) || e->u.l->n != 2)
						TYPE_ERR(rt, at, "%s(): sequence element %zu is not a pair", kj_gfn_names[fn], i);
					kj_dict_set(rt, at, d, e->u.l->v[0], e->u.l->v[1]);
				}
			}
		}
		for (int k = 0; k < a->nkw; k++)
			kj_dict_set(rt, at, d, vstr(a->kwn[k], strlen(a->kwn[k])), a->kwv[k]);
		if (fn == G_DICT)
			return vdict(d);
		struct ns *ns = kj_ralloc(rt, at, sizeof *ns);
		ns->d = d;
		struct val v = {.t = V_NS};
		v.u.ns = ns;
		return v;
	}
	case G_RAISE: {
		static const char *const pn[] = {"message"};
		bind(rt, at, "raise_exception", pn, 1, 1, a, p);
		struct val m = kj_str_of(rt, at, &p[0]);
		kj_rfail(rt, at, KV_ERR_INVALID, "template error: %.*s", (int)(m.u.s.n > 500 ? 500 : m.u.s.n), m.u.s.p);
	}
	case G_STRFTIME: {
		static const char *const pn[] = {"format"};
		char buf[512];
		bind(rt, at, "strftime_now", pn, 1, 1, a, p);
		want_str(rt, at, "strftime_now", &p[0]);
		time_t now = time(NULL);
		struct tm tmv;
		localtime_r(&now, &tmv);
		char *f = kj_ralloc(rt, at, p[0].u.s.n + 1);
		memcpy(f, p[0].u.s.p, p[0].u.s.n);
		f[p[0].u.s.n] = 0;
		size_t w = p[0].u.s.n ? strftime(buf, sizeof buf, f, &tmv) : 0;
		if (p[0].u.s.n && !w)
			UNSUP(rt, at, "strftime_now(): format produced no output or more than %zu bytes", sizeof buf);
		return kj_str_copy(rt, at, buf, w);
	}
	}
	UNSUP(rt, at, "the global function '%s' is not supported", kj_gfn_names[fn]);
}

static struct val call_macro(struct rt *rt, const struct node *at, const struct macro *m, const struct args *a)
{
	const struct node *def = m->def;
	int np = def->tg->n, ndef = def->nw;
	if (++rt->macro_depth > TM_MAX_MACRO_DEPTH)
		kj_rfail(rt, at, KV_ERR_INVALID, "macros nested deeper than %d calls (runaway recursion?)",
		      TM_MAX_MACRO_DEPTH);
	kj_step(rt, at, 1);
	struct scope *sc = kj_scope_new(rt, at, m->closure);
	if (a->n > np && !def->varargs)
		TYPE_ERR(rt, at, "macro '%s' takes not more than %d argument(s)", def->s, np);
	uint8_t *used = kj_ralloc(rt, at, (size_t)a->nkw + 1);
	memset(used, 0, (size_t)a->nkw + 1);
	for (int i = 0; i < np; i++) {
		struct val v = i < a->n ? a->v[i] : KJ_MISSING;
		for (int k = 0; k < a->nkw; k++)
			if (!strcmp(a->kwn[k], def->tg->names[i])) {
				if (v.t != V_MISSING)
					TYPE_ERR(rt, at, "macro '%s' got multiple values for argument '%s'", def->s,
						 def->tg->names[i]);
				v = a->kwv[k];
				used[k] = 1;
			}
		if (v.t == V_MISSING) {
			int di = i - (np - ndef);
			v = di >= 0 ? kj_eval(rt, def->w[di], sc) : vundef(def->tg->names[i]);
		}
		kj_scope_set(rt, at, sc, def->tg->syms[i], v);
	}
	struct dict *kw = kj_dict_new(rt, at, 0);
	for (int k = 0; k < a->nkw; k++)
		if (!used[k]) {
			if (!def->kwargs)
				TYPE_ERR(rt, at, "macro '%s' takes no keyword argument '%s'", def->s, a->kwn[k]);
			kj_dict_set(rt, at, kw, vstr(a->kwn[k], strlen(a->kwn[k])), a->kwv[k]);
		}
	if (def->varargs) {
		int extra = a->n > np ? a->n - np : 0;
		struct list *l = kj_list_new(rt, at, (size_t)extra, L_TUPLE);
		for (int i = 0; i < extra; i++)
			l->v[i] = a->v[np + i];
		kj_scope_set(rt, at, sc, rt->t->sym_varargs, vlist(l));
	}
	if (def->kwargs)
		kj_scope_set(rt, at, sc, rt->t->sym_kwargs, vdict(kw));
	struct outbuf *saved = rt->cap, ob = {0};
	int ctl = 0;
	rt->cap = &ob;
	kj_exec_body(rt, def->v, def->nv, sc, &ctl);
	rt->cap = saved;
	rt->macro_depth--;
	return kj_ob_val(&ob);
}

struct val kj_call_value(struct rt *rt, const struct node *at, const struct val *f, const struct args *a)
{
	switch (f->t) {
	case V_METHOD:
		return call_method(rt, at, &f->u.me->self, f->fn, a);
	case V_FUNC:
		return call_global(rt, at, f->fn, a);
	case V_MACRO:
		return call_macro(rt, at, f->u.m, a);
	case V_UNDEF:
		kj_fail_undef(rt, at, f);
	}
	TYPE_ERR(rt, at, "'%s' object is not callable", kj_kind_name(f));
}

/* ------------------------------------------------------------------------
 * Filters and tests
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

/* Attribute path lookup for map/sort/selectattr ("a.b.0"). */
static struct val attr_path(struct rt *rt, const struct node *at, const struct val *item, const struct val *path)
{
	if (path->t == V_MISSING || path->t == V_NONE)
		return *item;
	if (is_intlike(path))
		return kj_get_item(rt, at, item, path);
	if (path->t != V_STR)
		TYPE_ERR(rt, at, "attribute must be a string or an integer");
	struct val cur = *item;
	const char *p = path->u.s.p, *e = p + path->u.s.n;
	while (p <= e) {
		const char *d = memchr(p, '.', (size_t)(e - p));
		if (!d)
			d = e;
		size_t n = (size_t)(d - p);
		int digits = n > 0;
		int64_t k = 0;
		for (size_t i = 0; i < n; i++) {
			if (p[i] < '0' || p[i] > '9' || k > (INT64_MAX - 9) / 10)
				digits = 0;
			else
				k = k * 10 + (p[i] - '0');
		}
		struct val key = digits ? vint(k) : vstr(p, n);
		cur = kj_get_item(rt, at, &cur, &key);
		p = d + 1;
	}
	return cur;
}

static struct val lower_key(struct rt *rt, const struct node *at, const struct val *v, int case_sensitive)
{
	if (!case_sensitive && v->t == V_STR)
		return str_case(rt, at, v, CASE_LOWER);
	return *v;
}

/* Stable merge sort of items by keys (Python's sorted). */
static void sort_vals(struct rt *rt, const struct node *at, struct val *items, struct val *keys, size_t n,
		      int reverse)
{
	if (n < 2)
		return;
	struct val *ti = kj_ralloc(rt, at, n * sizeof *ti), *tk = kj_ralloc(rt, at, n * sizeof *tk);
	for (size_t w = 1; w < n; w *= 2) {
		for (size_t lo = 0; lo < n; lo += 2 * w) {
			size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
			size_t i = lo, j = mid, o = lo;
			while (i < mid && j < hi) {
				int c = reverse ? kj_val_cmp(rt, at, &keys[j], &keys[i], "<", 0) > 0
						: kj_val_cmp(rt, at, &keys[j], &keys[i], "<", 0) < 0;
				if (c) {
					ti[o] = items[j];
					tk[o++] = keys[j++];
				} else {
					ti[o] = items[i];
					tk[o++] = keys[i++];
				}
			}
			while (i < mid) {
				ti[o] = items[i];
				tk[o++] = keys[i++];
			}
			while (j < hi) {
				ti[o] = items[j];
				tk[o++] = keys[j++];
			}
		}
		memcpy(items, ti, n * sizeof *ti);
		memcpy(keys, tk, n * sizeof *tk);
		kj_step(rt, at, n);
	}
}

static int find_test(struct rt *rt, const struct node *at, const struct val *name)
{
	if (name->t != V_STR)
		TYPE_ERR(rt, at, "test name must be a string");
	int id = kj_find_name(kj_test_names, T__COUNT, name->u.s.p, name->u.s.n);
	if (id < 0)
		TYPE_ERR(rt, at, "no test named '%.*s'", (int)(name->u.s.n > 60 ? 60 : name->u.s.n), name->u.s.p);
	return id;
}

/* select / reject / selectattr / rejectattr */
static struct val select_reject(struct rt *rt, const struct node *at, const struct val *v, const struct args *a,
				int want, int by_attr)
{
	struct lbuild lb = {0};
	int off = by_attr ? 1 : 0, tid = -1;
	if (by_attr && a->n < 1)
		TYPE_ERR(rt, at, "missing parameter for attribute name");
	if (a->n > off)
		tid = find_test(rt, at, &a->v[off]);
	struct args ta = {a->n > off + 1 ? a->v + off + 1 : NULL, a->n > off + 1 ? a->n - off - 1 : 0, a->kwn, a->kwv,
			  a->nkw};
	const struct list *items = kj_iter_items(rt, at, v);
	kj_step(rt, at, items->n);
	for (size_t i = 0; i < items->n; i++) {
		struct val x = by_attr ? attr_path(rt, at, &items->v[i], &a->v[0]) : items->v[i];
		int r = tid >= 0 ? kj_test_value(rt, at, tid, &x, &ta) : kj_truthy(&x);
		if (r == want)
			kj_lb_push(rt, at, &lb, items->v[i]);
	}
	return kj_lb_done(rt, at, &lb, L_ITER);
}

static struct val py_int(struct rt *rt, const struct node *at, const struct val *v, const struct val *def,
			 int64_t base)
{
	if (is_intlike(v))
		return vint(v->u.i);
	if (v->t == V_FLOAT) {
		if (isnan(v->u.f) || isinf(v->u.f) || fabs(v->u.f) >= 9.2e18)
			return *def;
		return vint((int64_t)v->u.f);
	}
	if (v->t == V_STR) {
		char buf[128];
		struct val s = str_strip(rt, at, v, NULL, 3);
		if (s.u.s.n == 0 || s.u.s.n >= sizeof buf)
			return *def;
		size_t k = 0;
		for (size_t i = 0; i < s.u.s.n; i++)
			if (s.u.s.p[i] != '_' || (i > 0 && i + 1 < s.u.s.n))
				buf[k++] = s.u.s.p[i];
		buf[k] = 0;
		char *end;
		errno = 0;
		long long x = strtoll(buf, &end, (int)base);
		if (!errno && *end == 0 && end != buf && !(base == 10 && strchr(buf, 'x')))
			return vint(x);
		double f = strtod(buf, &end);
		if (*end == 0 && end != buf && !isnan(f) && !isinf(f) && fabs(f) < 9.2e18 && !strchr(buf, 'x') &&
		    !strchr(buf, 'X'))
			return vint((int64_t)f);
		return *def;
	}
	return *def;
}

static struct val py_float(struct rt *rt, const struct node *at, const struct val *v, const struct val *def)
{
	if (is_num(v))
		return vfloat(num_f(v));
	if (v->t == V_STR) {
		char buf[128];
		struct val s = str_strip(rt, at, v, NULL, 3);
		if (s.u.s.n == 0 || s.u.s.n >= sizeof buf)
			return *def;
		memcpy(buf, s.u.s.p, s.u.s.n);
		buf[s.u.s.n] = 0;
		for (size_t i = 0; buf[i]; i++)
			if (buf[i] == 'x' || buf[i] == 'X' || buf[i] == 'p' || buf[i] == 'P' || buf[i] == '_')
				return *def; /* hex floats and underscores: not what Python's float() reads */
		char *end;
		double f = strtod(buf, &end);
		if (*end == 0 && end != buf)
			return vfloat(f);
	}
	return *def;
}

/* Jinja's title filter: words split at runs of [-\s({\[<]. */
static struct val jinja_title(struct rt *rt, const struct node *at, const struct val *s)
{
	struct outbuf b = {0};
	const char *p = s->u.s.p;
	size_t n = s->u.s.n, i = 0;
	int at_start = 1;
	while (i < n) {
		int32_t c;
		int l = kv_utf8_decode(p + i, n - i, &c);
		if (!l)
			l = 1, c = (unsigned char)p[i];
		int sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || kj_py_isspace(c);
		if (sep) {
			kj_ob_add(rt, at, &b, p + i, (size_t)l);
			at_start = 1;
		} else {
			if (kj_special_casing(c))
				UNSUP(rt, at, "case mapping of U+%04X (several characters) is not supported", (unsigned)c);
			kj_ob_cp(rt, at, &b, at_start ? utf8proc_toupper(c) : utf8proc_tolower(c));
			at_start = 0;
		}
		i += (size_t)l;
	}
	return kj_ob_val(&b);
}

static struct val printf_format(struct rt *rt, const struct node *at, const struct val *fmt, const struct args *a)
{
	struct outbuf b = {0};
	int k = 0;
	if (a->nkw)
		UNSUP(rt, at, "format() with keyword arguments");
	for (size_t i = 0; i < fmt->u.s.n; i++) {
		char c = fmt->u.s.p[i];
		if (c != '%') {
			kj_ob_addc(rt, at, &b, c);
			continue;
		}
		if (++i >= fmt->u.s.n)
			TYPE_ERR(rt, at, "incomplete format");
		c = fmt->u.s.p[i];
		if (c == '%') {
			kj_ob_addc(rt, at, &b, '%');
			continue;
		}
		if (k >= a->n)
			TYPE_ERR(rt, at, "not enough arguments for format string");
		const struct val *v = &a->v[k++];
		if (c == 's') {
			kj_to_str(rt, at, v, &b, 0);
		} else if (c == 'r') {
			kj_to_repr(rt, at, v, &b, 0);
		} else if (c == 'd' || c == 'i') {
			if (!is_num(v))
				TYPE_ERR(rt, at, "%%%c format: a real number is required, not %s", c, kj_kind_name(v));
			struct val iv = v->t == V_FLOAT ? py_int(rt, at, v, &KJ_NONE, 10) : vint(v->u.i);
			if (iv.t != V_INT)
				TYPE_ERR(rt, at, "cannot convert float to integer");
			kj_to_str(rt, at, &iv, &b, 0);
		} else {
			UNSUP(rt, at, "format(): only %%s, %%r, %%d, %%i and %%%% are supported");
		}
	}
	if (k < a->n)
		TYPE_ERR(rt, at, "not all arguments converted during string formatting");
	return kj_ob_val(&b);
}

struct val kj_call_filter(struct rt *rt, const struct node *at, int id, const struct val *v,
			      const struct args *a)
{
	struct val p[6];
	const char *fname = kj_filt_names[id];
	switch (id) {
	case F_ABS:
		bind(rt, at, fname, NULL, 0, 0, a, p);
		if (v->t == V_FLOAT)
			return vfloat(fabs(v->u.f));
		if (is_intlike(v)) {
			if (v->u.i == INT64_MIN)
				UNSUP(rt, at, "integer overflow");
			return vint(v->u.i < 0 ? -v->u.i : v->u.i);
		}
		TYPE_ERR(rt, at, "bad operand type for abs(): '%s'", kj_kind_name(v));
	case F_ATTR: {
		static const char *const pn[] = {"name"};
		bind(rt, at, fname, pn, 1, 1, a, p);
		want_str(rt, at, fname, &p[0]);
		if (v->t == V_DICT) {
			int m = kj_meth_lookup(V_DICT, 0, p[0].u.s.p, p[0].u.s.n);
			return m >= 0 ? kj_method_val(rt, at, v, m) : kj_undef_of(p[0].u.s.p, p[0].u.s.n, V_DICT, 0);
		}
		return kj_get_attr(rt, at, v, p[0].u.s.p, p[0].u.s.n);
	}
	case F_BATCH: {
		static const char *const pn[] = {"linecount", "fill_with"};
		bind(rt, at, fname, pn, 2, 1, a, p);
		int64_t k = want_int(rt, at, fname, &p[0]);
		if (k <= 0)
			TYPE_ERR(rt, at, "batch(): linecount must be positive");
		const struct list *items = kj_iter_items(rt, at, v);
		struct lbuild out = {0};
		for (size_t i = 0; i < items->n; i += (size_t)k) {
			size_t m = items->n - i < (size_t)k ? items->n - i : (size_t)k;
			int fill = m < (size_t)k && p[1].t != V_MISSING && p[1].t != V_NONE;
			struct list *row = kj_list_new(rt, at, fill ? (size_t)k : m, L_LIST);
			memcpy(row->v, items->v + i, m * sizeof *row->v);
			for (size_t j = m; fill && j < (size_t)k; j++)
				row->v[j] = p[1];
			kj_lb_push(rt, at, &out, vlist(row));
		}
		return kj_lb_done(rt, at, &out, L_ITER);
	}
	case F_CAPITALIZE:
	case F_LOWER:
	case F_UPPER: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		struct val s = kj_str_of(rt, at, v);
		s.safe = v->t == V_STR && v->safe;
		return str_case(rt, at, &s, id == F_CAPITALIZE ? CASE_CAPITALIZE : id == F_LOWER ? CASE_LOWER : CASE_UPPER);
	}
	case F_TITLE: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		struct val s = kj_str_of(rt, at, v);
		return jinja_title(rt, at, &s);
	}
	case F_CENTER: {
		static const char *const pn[] = {"width"};
		bind(rt, at, fname, pn, 1, 0, a, p);
		struct val s = kj_str_of(rt, at, v);
		return str_pad(rt, at, &s, p[0].t == V_MISSING ? 80 : want_int(rt, at, fname, &p[0]), NULL, 0);
	}
	case F_COUNT:
	case F_LENGTH:
		bind(rt, at, fname, NULL, 0, 0, a, p);
		return vint(kj_val_len(rt, at, v));
	case F_D:
	case F_DEFAULT: {
		static const char *const pn[] = {"default_value", "boolean"};
		bind(rt, at, fname, pn, 2, 0, a, p);
		int boolean = p[1].t != V_MISSING && kj_truthy(&p[1]);
		if (v->t == V_UNDEF || (boolean && !kj_truthy(v)))
			return p[0].t == V_MISSING ? vstr("", 0) : p[0];
		return *v;
	}
	case F_DICTSORT: {
		static const char *const pn[] = {"case_sensitive", "by", "reverse"};
		bind(rt, at, fname, pn, 3, 0, a, p);
		if (v->t != V_DICT)
			TYPE_ERR(rt, at, "dictsort(): expected a mapping, got %s", kj_kind_name(v));
		int by = 0;
		if (p[1].t != V_MISSING) {
			want_str(rt, at, fname, &p[1]);
			if (p[1].u.s.n == 5 && !memcmp(p[1].u.s.p, "value", 5))
				by = 1;
			else if (!(p[1].u.s.n == 3 && !memcmp(p[1].u.s.p, "key", 3)))
				TYPE_ERR(rt, at, "dictsort(): you can only sort by either \"key\" or \"value\"");
		}
		const struct dict *d = v->u.d;
		struct list *l = kj_list_new(rt, at, d->n, L_LIST);
		struct val *keys = kj_ralloc(rt, at, (d->n ? d->n : 1) * sizeof *keys);
		int cs = p[0].t != V_MISSING && kj_truthy(&p[0]);
		for (size_t i = 0; i < d->n; i++) {
			struct list *pair = kj_list_new(rt, at, 2, L_TUPLE);
			pair->v[0] = d->k[i];
			pair->v[1] = d->v[i];
			l->v[i] = vlist(pair);
			keys[i] = lower_key(rt, at, by ? &d->v[i] : &d->k[i], cs);
		}
		sort_vals(rt, at, l->v, keys, d->n, p[2].t != V_MISSING && kj_truthy(&p[2]));
		return vlist(l);
	}
	case F_E:
	case F_ESCAPE:
	case F_FORCEESCAPE:
		bind(rt, at, fname, NULL, 0, 0, a, p);
		if (id == F_FORCEESCAPE && v->t == V_STR && v->safe) {
			struct val s = *v;
			s.safe = 0;
			return kj_markup_escape(rt, at, &s);
		}
		return kj_markup_escape(rt, at, v);
	case F_FIRST: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		const struct list *l = kj_iter_items(rt, at, v);
		return l->n ? l->v[0] : vundef("no first item, sequence was empty");
	}
	case F_LAST: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		if (v->t == V_LIST && v->u.l->kind == L_ITER)
			TYPE_ERR(rt, at, "last(): a generator cannot be reversed (use |list first)");
		const struct list *l = kj_iter_items(rt, at, v);
		return l->n ? l->v[l->n - 1] : vundef("no last item, sequence was empty");
	}
	case F_FLOAT: {
		static const char *const pn[] = {"default"};
		bind(rt, at, fname, pn, 1, 0, a, p);
		struct val def = p[0].t == V_MISSING ? vfloat(0.0) : p[0];
		return py_float(rt, at, v, &def);
	}
	case F_INT: {
		static const char *const pn[] = {"default", "base"};
		bind(rt, at, fname, pn, 2, 0, a, p);
		struct val def = p[0].t == V_MISSING ? vint(0) : p[0];
		int64_t base = p[1].t == V_MISSING ? 10 : want_int(rt, at, fname, &p[1]);
		if (base != 10 && base != 2 && base != 8 && base != 16)
			UNSUP(rt, at, "int(): base %lld", (long long)base);
		return py_int(rt, at, v, &def, base);
	}
	case F_FORMAT: {
		if (v->t != V_STR)
			TYPE_ERR(rt, at, "format(): the value must be a string");
		return printf_format(rt, at, v, a);
	}
	case F_INDENT: {
		static const char *const pn[] = {"width", "first", "blank"};
		bind(rt, at, fname, pn, 3, 0, a, p);
		if (v->t != V_STR)
			TYPE_ERR(rt, at, "indent(): can only indent a string, not %s", kj_kind_name(v));
		struct val ind;
		if (p[0].t == V_STR) {
			ind = p[0];
		} else {
			int64_t w = p[0].t == V_MISSING ? 4 : want_int(rt, at, fname, &p[0]);
			if (w > 4096)
				UNSUP(rt, at, "indent wider than 4096");
			char *sp = kj_ralloc(rt, at, w > 0 ? (size_t)w : 1);
			memset(sp, ' ', w > 0 ? (size_t)w : 0);
			ind = vstr(sp, w > 0 ? (size_t)w : 0);
		}
		int first = p[1].t != V_MISSING && kj_truthy(&p[1]), blank = p[2].t != V_MISSING && kj_truthy(&p[2]);
		/* s += "\n"; lines = s.splitlines() */
		struct outbuf sb = {0};
		kj_ob_add(rt, at, &sb, v->u.s.p, v->u.s.n);
		kj_ob_addc(rt, at, &sb, '\n');
		struct val sv = kj_ob_val(&sb);
		const struct list *lines = str_splitlines(rt, at, &sv, 0).u.l;
		struct outbuf b = {0};
		if (first)
			kj_ob_add(rt, at, &b, ind.u.s.p, ind.u.s.n);
		for (size_t i = 0; i < lines->n; i++) {
			const struct val *ln = &lines->v[i];
			if (i) {
				kj_ob_addc(rt, at, &b, '\n');
				if (blank || ln->u.s.n)
					kj_ob_add(rt, at, &b, ind.u.s.p, ind.u.s.n);
			}
			kj_ob_add(rt, at, &b, ln->u.s.p, ln->u.s.n);
		}
		struct val r = kj_ob_val(&b);
		r.safe = v->safe;
		return r;
	}
	case F_ITEMS: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		if (v->t == V_UNDEF)
			return vlist(kj_list_new(rt, at, 0, L_ITER));
		if (v->t != V_DICT)
			TYPE_ERR(rt, at, "items(): can only get item pairs from a mapping");
		struct list *l = kj_list_new(rt, at, v->u.d->n, L_ITER);
		for (size_t i = 0; i < v->u.d->n; i++) {
			struct list *pair = kj_list_new(rt, at, 2, L_TUPLE);
			pair->v[0] = v->u.d->k[i];
			pair->v[1] = v->u.d->v[i];
			l->v[i] = vlist(pair);
		}
		return vlist(l);
	}
	case F_JOIN: {
		static const char *const pn[] = {"d", "attribute"};
		bind(rt, at, fname, pn, 2, 0, a, p);
		struct val sep = p[0].t == V_MISSING ? vstr("", 0) : kj_str_of(rt, at, &p[0]);
		const struct list *items = kj_iter_items(rt, at, v);
		if (p[1].t != V_MISSING && p[1].t != V_NONE) {
			struct list *m = kj_list_new(rt, at, items->n, L_LIST);
			for (size_t i = 0; i < items->n; i++)
				m->v[i] = attr_path(rt, at, &items->v[i], &p[1]);
			items = m;
		}
		kj_step(rt, at, items->n);
		return str_join(rt, at, &sep, items, 0);
	}
	case F_LIST: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		const struct list *items = kj_iter_items(rt, at, v);
		struct list *l = kj_list_new(rt, at, items->n, L_LIST);
		memcpy(l->v, items->v, items->n * sizeof *l->v);
		return vlist(l);
	}
	case F_MAP: {
		struct lbuild lb = {0};
		if (!kj_truthy(v))
			return vlist(kj_list_new(rt, at, 0, L_ITER));
		const struct list *items = kj_iter_items(rt, at, v);
		kj_step(rt, at, items->n);
		if (a->n == 0) {
			struct val attr = KJ_MISSING, def = KJ_NONE;
			for (int k = 0; k < a->nkw; k++) {
				if (!strcmp(a->kwn[k], "attribute"))
					attr = a->kwv[k];
				else if (!strcmp(a->kwn[k], "default"))
					def = a->kwv[k];
				else
					TYPE_ERR(rt, at, "map(): unexpected keyword argument '%s'", a->kwn[k]);
			}
			if (attr.t == V_MISSING)
				TYPE_ERR(rt, at, "map() requires a filter argument");
			for (size_t i = 0; i < items->n; i++) {
				struct val x = attr_path(rt, at, &items->v[i], &attr);
				if (x.t == V_UNDEF && def.t != V_NONE)
					x = def;
				kj_lb_push(rt, at, &lb, x);
			}
			return kj_lb_done(rt, at, &lb, L_ITER);
		}
		if (a->v[0].t != V_STR)
			TYPE_ERR(rt, at, "map(): the filter name must be a string");
		int fid = kj_find_name(kj_filt_names, F__COUNT, a->v[0].u.s.p, a->v[0].u.s.n);
		if (fid < 0)
			TYPE_ERR(rt, at, "no filter named '%.*s'", (int)(a->v[0].u.s.n > 60 ? 60 : a->v[0].u.s.n),
				 a->v[0].u.s.p);
		if (fid >= F_FIRST_UNSUPPORTED)
			UNSUP(rt, at, "filter '%s' is not supported", kj_filt_names[fid]);
		struct args fa = {a->v + 1, a->n - 1, a->kwn, a->kwv, a->nkw};
		for (size_t i = 0; i < items->n; i++)
			kj_lb_push(rt, at, &lb, kj_call_filter(rt, at, fid, &items->v[i], &fa));
		return kj_lb_done(rt, at, &lb, L_ITER);
	}
	case F_MAX:
	case F_MIN: {
		static const char *const pn[] = {"case_sensitive", "attribute"};
		bind(rt, at, fname, pn, 2, 0, a, p);
		const struct list *items = kj_iter_items(rt, at, v);
		if (!items->n)
			return vundef("no aggregated item, sequence was empty");
		int cs = p[0].t != V_MISSING && kj_truthy(&p[0]);
		size_t best = 0;
		struct val bk = lower_key(rt, at, &items->v[0], cs);
		if (p[1].t != V_MISSING) {
			struct val x = attr_path(rt, at, &items->v[0], &p[1]);
			bk = lower_key(rt, at, &x, cs);
		}
		for (size_t i = 1; i < items->n; i++) {
			struct val x = p[1].t != V_MISSING ? attr_path(rt, at, &items->v[i], &p[1]) : items->v[i];
			struct val k = lower_key(rt, at, &x, cs);
			int c = kj_val_cmp(rt, at, &k, &bk, id == F_MAX ? ">" : "<", 0);
			if (id == F_MAX ? c > 0 : c < 0) {
				best = i;
				bk = k;
			}
		}
		return items->v[best];
	}
	case F_REJECT: return select_reject(rt, at, v, a, 0, 0);
	case F_SELECT: return select_reject(rt, at, v, a, 1, 0);
	case F_REJECTATTR: return select_reject(rt, at, v, a, 0, 1);
	case F_SELECTATTR: return select_reject(rt, at, v, a, 1, 1);
	case F_REPLACE: {
		static const char *const pn[] = {"old", "new", "count"};
		bind(rt, at, fname, pn, 3, 2, a, p);
		struct val s = kj_str_of(rt, at, v), o = kj_str_of(rt, at, &p[0]), nw = kj_str_of(rt, at, &p[1]);
		int64_t cnt = p[2].t == V_MISSING || p[2].t == V_NONE ? -1 : want_int(rt, at, fname, &p[2]);
		struct val r = str_replace(rt, at, &s, &o, &nw, cnt);
		r.safe = 0;
		return r;
	}
	case F_REVERSE: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		if (v->t == V_STR) {
			struct val neg = vint(-1);
			return kj_do_slice(rt, at, v, &KJ_MISSING, &KJ_MISSING, &neg);
		}
		const struct list *items = kj_iter_items(rt, at, v);
		int kind = v->t == V_LIST && v->u.l->kind == L_ITER ? L_LIST : L_ITER;
		if (v->t == V_LIST && (v->u.l->kind == L_ITEMS || v->u.l->kind == L_KEYS || v->u.l->kind == L_VALUES))
			kind = L_ITER;
		struct list *l = kj_list_new(rt, at, items->n, kind);
		for (size_t i = 0; i < items->n; i++)
			l->v[i] = items->v[items->n - 1 - i];
		return vlist(l);
	}
	case F_ROUND: {
		static const char *const pn[] = {"precision", "method"};
		bind(rt, at, fname, pn, 2, 0, a, p);
		int64_t prec = p[0].t == V_MISSING ? 0 : want_int(rt, at, fname, &p[0]);
		int method = 0;
		if (p[1].t != V_MISSING) {
			want_str(rt, at, fname, &p[1]);
			if (p[1].u.s.n == 4 && !memcmp(p[1].u.s.p, "ceil", 4))
				method = 1;
			else if (p[1].u.s.n == 5 && !memcmp(p[1].u.s.p, "floor", 5))
				method = 2;
			else if (!(p[1].u.s.n == 6 && !memcmp(p[1].u.s.p, "common", 6)))
				TYPE_ERR(rt, at, "round(): method must be common, ceil or floor");
		}
		if (!is_num(v))
			TYPE_ERR(rt, at, "round(): expected a number, got %s", kj_kind_name(v));
		if (prec < -300 || prec > 300)
			UNSUP(rt, at, "round() precision out of range");
		double x = num_f(v), m = pow(10.0, (double)prec);
		if (method)
			return vfloat((method == 1 ? ceil(x * m) : floor(x * m)) / m);
		if (is_intlike(v) && prec >= 0)
			return vint(v->u.i);
		if (is_intlike(v)) {
			double q = pow(10.0, (double)-prec), r = nearbyint(x / q) * q;
			if (fabs(r) >= 9.2e18)
				UNSUP(rt, at, "integer overflow");
			return vint((int64_t)r);
		}
		if (prec > 0) {
			char buf[400];
			snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
			return vfloat(strtod(buf, NULL));
		}
		if (prec == 0)
			return vfloat(nearbyint(x));
		return vfloat(nearbyint(x / pow(10.0, (double)-prec)) * pow(10.0, (double)-prec));
	}
	case F_SAFE: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		struct val s = kj_str_of(rt, at, v);
		s.safe = 1;
		return s;
	}
	case F_SORT: {
		static const char *const pn[] = {"reverse", "case_sensitive", "attribute"};
		bind(rt, at, fname, pn, 3, 0, a, p);
		const struct list *items = kj_iter_items(rt, at, v);
		struct list *l = kj_list_new(rt, at, items->n, L_LIST);
		memcpy(l->v, items->v, items->n * sizeof *l->v);
		struct val *keys = kj_ralloc(rt, at, (items->n ? items->n : 1) * sizeof *keys);
		int cs = p[1].t != V_MISSING && kj_truthy(&p[1]);
		for (size_t i = 0; i < items->n; i++) {
			/* "a,b" sorts by a tuple of attributes */
			if (p[2].t == V_STR && memchr(p[2].u.s.p, ',', p[2].u.s.n)) {
				struct val parts = str_split(rt, at, &p[2], &(struct val){.t = V_STR, .u.s = {",", 1}}, -1, 0);
				struct list *kt = kj_list_new(rt, at, parts.u.l->n, L_TUPLE);
				for (size_t j = 0; j < parts.u.l->n; j++) {
					struct val x = attr_path(rt, at, &items->v[i], &parts.u.l->v[j]);
					kt->v[j] = lower_key(rt, at, &x, cs);
				}
				keys[i] = vlist(kt);
			} else {
				struct val x = attr_path(rt, at, &items->v[i], p[2].t == V_MISSING ? &KJ_MISSING : &p[2]);
				keys[i] = lower_key(rt, at, &x, cs);
			}
		}
		sort_vals(rt, at, l->v, keys, items->n, p[0].t != V_MISSING && kj_truthy(&p[0]));
		return vlist(l);
	}
	case F_STRING: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		return kj_str_of(rt, at, v);
	}
	case F_SUM: {
		static const char *const pn[] = {"attribute", "start"};
		bind(rt, at, fname, pn, 2, 0, a, p);
		struct val acc = p[1].t == V_MISSING ? vint(0) : p[1];
		const struct list *items = kj_iter_items(rt, at, v);
		kj_step(rt, at, items->n);
		for (size_t i = 0; i < items->n; i++) {
			struct val x = p[0].t != V_MISSING ? attr_path(rt, at, &items->v[i], &p[0]) : items->v[i];
			acc = kj_binop(rt, at, B_ADD, &acc, &x);
		}
		return acc;
	}
	case F_TOJSON: {
		static const char *const pn[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
		bind(rt, at, fname, pn, 4, 0, a, p);
		struct jopts o = {0, NULL, 0, ", ", ": ", 0};
		o.ensure_ascii = p[0].t != V_MISSING && kj_truthy(&p[0]);
		if (p[1].t == V_STR) {
			o.indent = p[1].u.s.p;
			o.indent_n = p[1].u.s.n;
		} else if (is_intlike(&p[1])) {
			int64_t w = p[1].u.i < 0 ? 0 : p[1].u.i;
			if (w > 4096)
				UNSUP(rt, at, "tojson indent wider than 4096");
			char *sp = kj_ralloc(rt, at, (size_t)w + 1);
			memset(sp, ' ', (size_t)w);
			o.indent = sp;
			o.indent_n = (size_t)w;
		} else if (p[1].t != V_MISSING && p[1].t != V_NONE) {
			TYPE_ERR(rt, at, "tojson(): indent must be an integer or a string");
		}
		if (o.indent)
			o.item_sep = ",";
		if (p[2].t != V_MISSING && p[2].t != V_NONE) {
			if (!is_seq_list(&p[2]) || p[2].u.l->n != 2 || p[2].u.l->v[0].t != V_STR ||
			    p[2].u.l->v[1].t != V_STR)
				TYPE_ERR(rt, at, "tojson(): separators must be a pair of strings");
			struct val s0 = kj_str_copy(rt, at, p[2].u.l->v[0].u.s.p, p[2].u.l->v[0].u.s.n);
			struct val s1 = kj_str_copy(rt, at, p[2].u.l->v[1].u.s.p, p[2].u.l->v[1].u.s.n);
			o.item_sep = s0.u.s.p;
			o.key_sep = s1.u.s.p;
		}
		o.sort_keys = p[3].t != V_MISSING && kj_truthy(&p[3]);
		const void *key = v->t == V_DICT ? (const void *)v->u.d : v->t == V_LIST ? (const void *)v->u.l : NULL;
		int memo = rt->memo && key && !o.ensure_ascii && !o.indent && p[2].t != V_LIST && !o.sort_keys &&
			   kj_ar_contains(rt->memo->ar, key);
		size_t slot = memo ? ((uintptr_t)key >> 4) % TJ_MEMO : 0;
		if (memo) {
			for (size_t k = 0; k < TJ_MEMO && rt->memo->key[slot]; k++, slot = (slot + 1) % TJ_MEMO)
				if (rt->memo->key[slot] == key)
					return vstr(rt->memo->p[slot], rt->memo->n[slot]);
		}
		struct outbuf b = {0};
		kj_to_json(rt, at, v, &o, 0, &b);
		if (memo && !rt->memo->key[slot]) {
			char *copy = kj_ar_alloc_raw(rt->memo->ar, b.n + 1);
			if (copy) {
				if (b.n)
					memcpy(copy, b.p, b.n);
				copy[b.n] = 0;
				rt->memo->key[slot] = key;
				rt->memo->p[slot] = copy;
				rt->memo->n[slot] = b.n;
			}
		}
		return kj_ob_val(&b);
	}
	case F_TRIM: {
		static const char *const pn[] = {"chars"};
		bind(rt, at, fname, pn, 1, 0, a, p);
		struct val s = kj_str_of(rt, at, v);
		s.safe = v->t == V_STR && v->safe;
		return str_strip(rt, at, &s, &p[0], 3);
	}
	case F_TRUNCATE: {
		static const char *const pn[] = {"length", "killwords", "end", "leeway"};
		bind(rt, at, fname, pn, 4, 0, a, p);
		if (v->t != V_STR)
			TYPE_ERR(rt, at, "truncate(): expected a string");
		int64_t length = p[0].t == V_MISSING ? 255 : want_int(rt, at, fname, &p[0]);
		int kill = p[1].t != V_MISSING && kj_truthy(&p[1]);
		struct val end = p[2].t == V_MISSING ? vstr("...", 3) : *want_str(rt, at, fname, &p[2]);
		int64_t leeway = p[3].t == V_MISSING || p[3].t == V_NONE ? 5 : want_int(rt, at, fname, &p[3]);
		int64_t elen = (int64_t)kv_utf8_count(end.u.s.p, end.u.s.n), slen = (int64_t)kv_utf8_count(v->u.s.p, v->u.s.n);
		if (length < elen || leeway < 0)
			TYPE_ERR(rt, at, "truncate(): expected length >= %lld and leeway >= 0", (long long)elen);
		if (slen <= length + leeway)
			return *v;
		struct val cut = vint(length - elen);
		struct val head = kj_do_slice(rt, at, v, &KJ_MISSING, &cut, &KJ_MISSING);
		if (!kill) {
			struct val sp = vstr(" ", 1);
			struct val parts = str_split(rt, at, &head, &sp, 1, 1);
			head = parts.u.l->v[0];
		}
		struct val r = kj_binop(rt, at, B_ADD, &head, &end);
		return r;
	}
	case F_UNIQUE: {
		static const char *const pn[] = {"case_sensitive", "attribute"};
		bind(rt, at, fname, pn, 2, 0, a, p);
		const struct list *items = kj_iter_items(rt, at, v);
		int cs = p[0].t != V_MISSING && kj_truthy(&p[0]);
		struct lbuild lb = {0};
		struct dict *seen = kj_dict_new(rt, at, 0);
		kj_step(rt, at, items->n);
		for (size_t i = 0; i < items->n; i++) {
			struct val x = p[1].t != V_MISSING ? attr_path(rt, at, &items->v[i], &p[1]) : items->v[i];
			struct val k = lower_key(rt, at, &x, cs);
			if (kj_dict_find(rt, at, seen, &k) < 0) {
				kj_dict_set(rt, at, seen, k, KJ_NONE);
				kj_lb_push(rt, at, &lb, items->v[i]);
			}
		}
		return kj_lb_done(rt, at, &lb, L_ITER);
	}
	case F_WORDCOUNT: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		struct val s = kj_str_of(rt, at, v);
		int64_t words = 0;
		int in = 0;
		for (size_t i = 0; i < s.u.s.n;) {
			int32_t c;
			int l = kv_utf8_decode(s.u.s.p + i, s.u.s.n - i, &c);
			if (!l)
				l = 1, c = 0;
			int w = c == '_' || kj_py_isalnum(c);
			if (w && !in)
				words++;
			in = w;
			i += (size_t)l;
		}
		return vint(words);
	}
	}
	UNSUP(rt, at, "filter '%s' is not supported", fname);
}

static int sameas(const struct val *a, const struct val *b)
{
	if (a->t != b->t)
		return 0;
	switch (a->t) {
	case V_NONE: return 1;
	case V_BOOL: return a->u.i == b->u.i;
	case V_INT: return a->u.i == b->u.i && a->u.i >= -5 && a->u.i <= 256;
	case V_STR: return a->u.s.p == b->u.s.p && a->u.s.n == b->u.s.n;
	case V_LIST: return a->u.l == b->u.l;
	case V_DICT: return a->u.d == b->u.d;
	case V_NS: return a->u.ns == b->u.ns;
	case V_MACRO: return a->u.m == b->u.m;
	}
	return 0;
}

int kj_test_value(struct rt *rt, const struct node *at, int id, const struct val *v, const struct args *a)
{
	struct val p[1];
	static const char *const pn_other[] = {"other"}, *const pn_num[] = {"num"}, *const pn_seq[] = {"seq"},
			  *const pn_b[] = {"b"};
	const char *tname = kj_test_names[id];
	switch (id) {
	case T_ODD:
	case T_EVEN: {
		bind(rt, at, tname, NULL, 0, 0, a, p);
		struct val two = vint(2), r = kj_binop(rt, at, B_MOD, v, &two), want = vint(id == T_ODD);
		return kj_val_eq(rt, at, &r, &want, 0);
	}
	case T_DIVISIBLEBY: {
		bind(rt, at, tname, pn_num, 1, 1, a, p);
		struct val r = kj_binop(rt, at, B_MOD, v, &p[0]), z = vint(0);
		return kj_val_eq(rt, at, &r, &z, 0);
	}
	case T_DEFINED: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t != V_UNDEF;
	case T_UNDEFINED: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_UNDEF;
	case T_FILTER:
	case T_TEST:
		bind(rt, at, tname, NULL, 0, 0, a, p);
		if (v->t != V_STR)
			return 0;
		return id == T_FILTER ? kj_find_name(kj_filt_names, F_FIRST_UNSUPPORTED, v->u.s.p, v->u.s.n) >= 0
				      : kj_find_name(kj_test_names, T__COUNT, v->u.s.p, v->u.s.n) >= 0;
	case T_NONE: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_NONE;
	case T_BOOLEAN: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_BOOL;
	case T_FALSE: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_BOOL && !v->u.i;
	case T_TRUE: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_BOOL && v->u.i;
	case T_INTEGER: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_INT;
	case T_FLOAT: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_FLOAT;
	case T_LOWER:
	case T_UPPER: {
		bind(rt, at, tname, NULL, 0, 0, a, p);
		struct val s = kj_str_of(rt, at, v);
		return str_is_case(&s, id == T_UPPER);
	}
	case T_STRING: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_STR;
	case T_MAPPING: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_DICT;
	case T_NUMBER: bind(rt, at, tname, NULL, 0, 0, a, p); return is_num(v);
	case T_SEQUENCE:
		bind(rt, at, tname, NULL, 0, 0, a, p);
		return v->t == V_STR || v->t == V_DICT || v->t == V_UNDEF || is_seq_list(v);
	case T_ITERABLE:
		bind(rt, at, tname, NULL, 0, 0, a, p);
		return v->t == V_STR || v->t == V_DICT || v->t == V_UNDEF || v->t == V_LIST;
	case T_CALLABLE:
		bind(rt, at, tname, NULL, 0, 0, a, p);
		return v->t == V_MACRO || v->t == V_FUNC || v->t == V_METHOD || v->t == V_LOOP;
	case T_SAMEAS: bind(rt, at, tname, pn_other, 1, 1, a, p); return sameas(v, &p[0]);
	case T_ESCAPED: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_STR && v->safe;
	case T_IN: bind(rt, at, tname, pn_seq, 1, 1, a, p); return kj_contains(rt, at, v, &p[0]);
	case T_EQ1: case T_EQ2: case T_EQ3:
		bind(rt, at, tname, pn_b, 1, 1, a, p);
		return kj_val_eq(rt, at, v, &p[0], 0);
	case T_NE1: case T_NE2:
		bind(rt, at, tname, pn_b, 1, 1, a, p);
		return !kj_val_eq(rt, at, v, &p[0], 0);
	case T_GT1: case T_GT2: case T_GT3:
		bind(rt, at, tname, pn_b, 1, 1, a, p);
		return kj_val_cmp(rt, at, v, &p[0], ">", 0) > 0;
	case T_GE1: case T_GE2:
		bind(rt, at, tname, pn_b, 1, 1, a, p);
		return kj_val_cmp(rt, at, v, &p[0], ">=", 0) >= 0;
	case T_LT1: case T_LT2: case T_LT3:
		bind(rt, at, tname, pn_b, 1, 1, a, p);
		return kj_val_cmp(rt, at, v, &p[0], "<", 0) < 0;
	case T_LE1: case T_LE2:
		bind(rt, at, tname, pn_b, 1, 1, a, p);
		return kj_val_cmp(rt, at, v, &p[0], "<=", 0) <= 0;
	}
	UNSUP(rt, at, "test '%s' is not supported", tname);
}
