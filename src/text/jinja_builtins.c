/*
 * jinja_builtins.c - the functions a template can call that are not its
 * own: argument binding, Python's str operations, the methods of str /
 * dict / list / loop, and the globals (range, namespace, raise_exception,
 * strftime_now, ...). Filters and tests are jinja_filters.c; macros, which
 * run template code, are called by jinja_eval.c. Nothing here calls back
 * into the evaluator.
 */
#include "text/jinja_int.h"
#include <errno.h>
#include <time.h>
#include <utf8proc.h>

/* ------------------------------------------------------------------------
 * Name tables: global functions (the parser resolves names against them)
 * ---------------------------------------------------------------------- */

const char *const kj_gfn_names[G__COUNT] = {
	"range", "namespace", "raise_exception", "strftime_now", "dict", "lipsum", "cycler", "joiner",
};

int kj_find_name(const char *const *tab, int n, const char *s, size_t len)
{
	for (int i = 0; i < n; i++)
		if (tab[i] && strlen(tab[i]) == len && !memcmp(tab[i], s, len))
			return i;
	return -1;
}

static int meth_supported(int id)
{
	return !((id > M_S__UNSUPPORTED && id < M_D_GET) || (id > M_D__UNSUPPORTED && id < M_L_COUNT) ||
		 (id > M_L__UNSUPPORTED && id < M_LOOP_CYCLE) || id == M_LOOP_CHANGED);
}

/* ------------------------------------------------------------------------
 * Calls: argument binding, str/dict/list methods, globals
 * ---------------------------------------------------------------------- */

/* Bind args to parameter names pn[0..np). out[i] is V_MISSING when not
 * given; the first nreq parameters are required. */
void kj_bind(struct rt *rt, const struct node *at, const char *fname, const char *const *pn, int np, int nreq,
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

int64_t kj_want_int(struct rt *rt, const struct node *at, const char *fname, const struct val *v)
{
	if (!is_intlike(v))
		TYPE_ERR(rt, at, "%s(): '%s' object cannot be interpreted as an integer", fname, kj_kind_name(v));
	return v->u.i;
}

const struct val *kj_want_str(struct rt *rt, const struct node *at, const char *fname, const struct val *v)
{
	if (v->t != V_STR)
		TYPE_ERR(rt, at, "%s(): expected a string, got %s", fname, kj_kind_name(v));
	return v;
}

/* --- case mapping ---------------------------------------------------------- */


struct val kj_str_case(struct rt *rt, const struct node *at, const struct val *s, int mode)
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
int kj_str_is_case(const struct val *s, int upper)
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
struct val kj_str_strip(struct rt *rt, const struct node *at, const struct val *s, const struct val *chars,
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


struct val kj_str_split(struct rt *rt, const struct node *at, const struct val *s, const struct val *sep,
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
			w = kj_str_strip(rt, at, &w, NULL, 2);
			kj_lb_push(rt, at, &lb, w);
		} else {
			size_t keep = parts.n - (size_t)maxsplit;
			const struct val *lastk = &parts.v[keep - 1];
			struct val w = vstr(p, (size_t)(lastk->u.s.p + lastk->u.s.n - p));
			w = kj_str_strip(rt, at, &w, NULL, 1);
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

struct val kj_str_replace(struct rt *rt, const struct node *at, const struct val *s, const struct val *old,
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

struct val kj_str_pad(struct rt *rt, const struct node *at, const struct val *s, int64_t width,
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

struct val kj_str_splitlines(struct rt *rt, const struct node *at, const struct val *s, int keepends)
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

struct val kj_str_join(struct rt *rt, const struct node *at, const struct val *sep, const struct list *items,
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

/*
 * The methods, one function each (or one for a group that differs by a
 * flag, which reads id), found by id in g_methods with the kind of object
 * they belong to: Python's str, dict and list methods, and loop.cycle.
 * fname is "kind.name" for messages.
 */
typedef struct val method_fn(struct rt *rt, const struct node *at, const struct val *self, int id, const char *fname,
			     const struct args *a);
#define METHOD(name)                                                                                      \
	static struct val name(struct rt *rt, const struct node *at, const struct val *self,                \
			       int id __attribute__((unused)), const char *fname __attribute__((unused)), \
			       const struct args *a)

/* Parameter names the methods bind. */
static const char *const pn_chars[] = {"chars"}, *const pn_sep[] = {"sep", "maxsplit"},
		  *const pn_replace[] = {"old", "new", "count"}, *const pn_width[] = {"width", "fillchar"},
		  *const pn_sub[] = {"sub"}, *const pn_keepends[] = {"keepends"}, *const pn_x[] = {"x"},
		  *const pn_get[] = {"key", "default"};

METHOD(meth_str_strip)
{
	struct val p[1];
	kj_bind(rt, at, fname, pn_chars, 1, 0, a, p);
	if (p[0].t == V_STR)
		p[0] = marg(rt, at, self, &p[0]);
	return kj_str_strip(rt, at, self, &p[0], id == M_S_STRIP ? 3 : id == M_S_LSTRIP ? 1 : 2);
}

METHOD(meth_str_split)
{
	struct val p[2];
	kj_bind(rt, at, fname, pn_sep, 2, 0, a, p);
	if (p[0].t == V_STR)
		p[0] = marg(rt, at, self, &p[0]);
	return kj_str_split(rt, at, self, &p[0], p[1].t == V_MISSING ? -1 : kj_want_int(rt, at, fname, &p[1]),
			 id == M_S_RSPLIT);
}

METHOD(meth_str_replace)
{
	struct val p[3];
	kj_bind(rt, at, fname, pn_replace, 3, 2, a, p);
	kj_want_str(rt, at, fname, &p[0]);
	kj_want_str(rt, at, fname, &p[1]);
	p[0] = marg(rt, at, self, &p[0]);
	p[1] = marg(rt, at, self, &p[1]);
	{
		struct val r = kj_str_replace(rt, at, self, &p[0], &p[1],
					   p[2].t == V_MISSING ? -1 : kj_want_int(rt, at, fname, &p[2]));
		r.safe = self->safe;
		return r;
	}
}

METHOD(meth_str_startsends)
{
	if (a->n != 1 || a->nkw)
		UNSUP(rt, at, "%s() with start/end arguments", fname);
	return vbool(startsends(rt, at, self, &a->v[0], id == M_S_ENDSWITH));
}

METHOD(meth_str_case)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	return kj_str_case(rt, at, self, id == M_S_UPPER ? CASE_UPPER : id == M_S_LOWER ? CASE_LOWER
					     : id == M_S_TITLE ? CASE_TITLE : CASE_CAPITALIZE);
}

METHOD(meth_str_pad)
{
	struct val p[2];
	kj_bind(rt, at, fname, pn_width, 2, 1, a, p);
	return kj_str_pad(rt, at, self, kj_want_int(rt, at, fname, &p[0]), &p[1],
		       id == M_S_CENTER ? 0 : id == M_S_LJUST ? 1 : 2);
}

METHOD(meth_str_zfill)
{
	struct val p[1];
	kj_bind(rt, at, fname, pn_width, 1, 1, a, p);
	int64_t w = kj_want_int(rt, at, fname, &p[0]), len = (int64_t)kv_utf8_count(self->u.s.p, self->u.s.n);
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

METHOD(meth_str_count)
{
	if (a->n != 1 || a->nkw)
		UNSUP(rt, at, "%s() with start/end arguments", fname);
	kj_want_str(rt, at, fname, &a->v[0]);
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

METHOD(meth_str_find)
{
	if (a->n != 1 || a->nkw)
		UNSUP(rt, at, "%s() with start/end arguments", fname);
	kj_want_str(rt, at, fname, &a->v[0]);
	int64_t r = str_find(self, &a->v[0], id == M_S_RFIND || id == M_S_RINDEX);
	if (r < 0 && (id == M_S_INDEX || id == M_S_RINDEX))
		TYPE_ERR(rt, at, "substring not found");
	return vint(r);
}

METHOD(meth_str_partition)
{
	struct val p[1];
	kj_bind(rt, at, fname, pn_sub, 1, 1, a, p);
	kj_want_str(rt, at, fname, &p[0]);
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

METHOD(meth_str_remove)
{
	struct val p[1];
	kj_bind(rt, at, fname, pn_sub, 1, 1, a, p);
	kj_want_str(rt, at, fname, &p[0]);
	int e = id == M_S_REMOVESUFFIX;
	if (p[0].u.s.n && startsends(rt, at, self, &p[0], e)) {
		struct val r = vstr(self->u.s.p + (e ? 0 : p[0].u.s.n), self->u.s.n - p[0].u.s.n);
		r.safe = self->safe;
		return r;
	}
	return *self;
}

METHOD(meth_str_splitlines)
{
	struct val p[1];
	kj_bind(rt, at, fname, pn_keepends, 1, 0, a, p);
	return kj_str_splitlines(rt, at, self, p[0].t != V_MISSING && kj_truthy(&p[0]));
}

METHOD(meth_str_join)
{
	struct val p[1];
	kj_bind(rt, at, fname, pn_x, 1, 1, a, p);
	return kj_str_join(rt, at, self, kj_iter_items(rt, at, &p[0]), 1);
}

METHOD(meth_str_format)
{
	return str_format(rt, at, self, a);
}

METHOD(meth_str_isalnum)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	return vbool(str_all(self, kj_py_isalnum));
}

METHOD(meth_str_isalpha)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	return vbool(str_all(self, kj_py_isalpha));
}

METHOD(meth_str_isdigit)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	return vbool(str_all(self, kj_py_isdigit));
}

METHOD(meth_str_isnumeric)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	return vbool(str_all(self, py_isnumeric_cp));
}

METHOD(meth_str_isspace)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	return vbool(str_all(self, kj_py_isspace));
}

METHOD(meth_str_islower)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	return vbool(kj_str_is_case(self, 0));
}

METHOD(meth_str_isupper)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	return vbool(kj_str_is_case(self, 1));
}

METHOD(meth_dict_get)
{
	const struct dict *d = self->u.d;
	struct val p[2];
	kj_bind(rt, at, fname, pn_get, 2, 1, a, p);
	long i = kj_dict_find(rt, at, d, &p[0]);
	return i >= 0 ? d->v[i] : p[1].t == V_MISSING ? KJ_NONE : p[1];
}

METHOD(meth_dict_items)
{
	const struct dict *d = self->u.d;
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	struct list *l = kj_list_new(rt, at, d->n, L_ITEMS);
	for (size_t i = 0; i < d->n; i++) {
		struct list *pair = kj_list_new(rt, at, 2, L_TUPLE);
		pair->v[0] = d->k[i];
		pair->v[1] = d->v[i];
		l->v[i] = vlist(pair);
	}
	return vlist(l);
}

METHOD(meth_dict_keys_values)
{
	const struct dict *d = self->u.d;
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	struct list *l = kj_list_new(rt, at, d->n, id == M_D_KEYS ? L_KEYS : L_VALUES);
	if (d->n)
		memcpy(l->v, id == M_D_KEYS ? d->k : d->v, d->n * sizeof *l->v);
	return vlist(l);
}

METHOD(meth_dict_copy)
{
	const struct dict *d = self->u.d;
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	struct dict *c = kj_dict_new(rt, at, d->n);
	for (size_t i = 0; i < d->n; i++)
		kj_dict_set(rt, at, c, d->k[i], d->v[i]);
	return vdict(c);
}

METHOD(meth_list_count)
{
	const struct list *l = self->u.l;
	struct val p[1];
	kj_bind(rt, at, fname, pn_x, 1, 1, a, p);
	int64_t c = 0;
	for (size_t i = 0; i < l->n; i++)
		c += kj_val_eq(rt, at, &l->v[i], &p[0], 0);
	return vint(c);
}

METHOD(meth_list_index)
{
	const struct list *l = self->u.l;
	if (a->n != 1 || a->nkw)
		UNSUP(rt, at, "%s() with start/end arguments", fname);
	for (size_t i = 0; i < l->n; i++)
		if (kj_val_eq(rt, at, &l->v[i], &a->v[0], 0))
			return vint((int64_t)i);
	TYPE_ERR(rt, at, "%s(): value is not in the list", fname);
}

METHOD(meth_list_copy)
{
	const struct list *l = self->u.l;
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	struct list *c = kj_list_new(rt, at, l->n, l->kind);
	memcpy(c->v, l->v, l->n * sizeof *l->v);
	return vlist(c);
}

METHOD(meth_loop_cycle)
{
	if (a->nkw || a->n == 0)
		TYPE_ERR(rt, at, "loop.cycle(): no items for cycling given");
	return a->v[self->u.lo->i % (size_t)a->n];
}

static const struct {
	int kind;       /* enum vkind of self */
	method_fn *fn;
} g_methods[M__COUNT] = {
	[M_S_STRIP] = {V_STR, meth_str_strip},
	[M_S_LSTRIP] = {V_STR, meth_str_strip},
	[M_S_RSTRIP] = {V_STR, meth_str_strip},
	[M_S_SPLIT] = {V_STR, meth_str_split},
	[M_S_RSPLIT] = {V_STR, meth_str_split},
	[M_S_REPLACE] = {V_STR, meth_str_replace},
	[M_S_STARTSWITH] = {V_STR, meth_str_startsends},
	[M_S_ENDSWITH] = {V_STR, meth_str_startsends},
	[M_S_UPPER] = {V_STR, meth_str_case},
	[M_S_LOWER] = {V_STR, meth_str_case},
	[M_S_TITLE] = {V_STR, meth_str_case},
	[M_S_CAPITALIZE] = {V_STR, meth_str_case},
	[M_S_CENTER] = {V_STR, meth_str_pad},
	[M_S_LJUST] = {V_STR, meth_str_pad},
	[M_S_RJUST] = {V_STR, meth_str_pad},
	[M_S_ZFILL] = {V_STR, meth_str_zfill},
	[M_S_COUNT] = {V_STR, meth_str_count},
	[M_S_FIND] = {V_STR, meth_str_find},
	[M_S_RFIND] = {V_STR, meth_str_find},
	[M_S_INDEX] = {V_STR, meth_str_find},
	[M_S_RINDEX] = {V_STR, meth_str_find},
	[M_S_PARTITION] = {V_STR, meth_str_partition},
	[M_S_RPARTITION] = {V_STR, meth_str_partition},
	[M_S_REMOVEPREFIX] = {V_STR, meth_str_remove},
	[M_S_REMOVESUFFIX] = {V_STR, meth_str_remove},
	[M_S_SPLITLINES] = {V_STR, meth_str_splitlines},
	[M_S_JOIN] = {V_STR, meth_str_join},
	[M_S_FORMAT] = {V_STR, meth_str_format},
	[M_S_ISALNUM] = {V_STR, meth_str_isalnum},
	[M_S_ISALPHA] = {V_STR, meth_str_isalpha},
	[M_S_ISDIGIT] = {V_STR, meth_str_isdigit},
	[M_S_ISDECIMAL] = {V_STR, meth_str_isdigit},
	[M_S_ISNUMERIC] = {V_STR, meth_str_isnumeric},
	[M_S_ISSPACE] = {V_STR, meth_str_isspace},
	[M_S_ISLOWER] = {V_STR, meth_str_islower},
	[M_S_ISUPPER] = {V_STR, meth_str_isupper},
	[M_D_GET] = {V_DICT, meth_dict_get},
	[M_D_ITEMS] = {V_DICT, meth_dict_items},
	[M_D_KEYS] = {V_DICT, meth_dict_keys_values},
	[M_D_VALUES] = {V_DICT, meth_dict_keys_values},
	[M_D_COPY] = {V_DICT, meth_dict_copy},
	[M_L_COUNT] = {V_LIST, meth_list_count},
	[M_L_INDEX] = {V_LIST, meth_list_index},
	[M_L_COPY] = {V_LIST, meth_list_copy},
	[M_LOOP_CYCLE] = {V_LOOP, meth_loop_cycle},
};

struct val kj_call_method(struct rt *rt, const struct node *at, const struct val *self, int id,
			  const struct args *a)
{
	const char *name = kj_meth_names[id];
	char fname[48];
	snprintf(fname, sizeof fname, "%s.%s", kj_kind_name(self), name);
	if (!meth_supported(id)) {
		if ((id > M_D__UNSUPPORTED && id < M_L_COUNT) || (id > M_L__UNSUPPORTED && id < M_LOOP_CYCLE))
			TYPE_ERR(rt, at, "access to attribute '%s' of '%s' object is unsafe (templates cannot modify "
					 "lists or dicts)", name, kj_kind_name(self));
		UNSUP(rt, at, "%s() is not supported", fname);
	}
	if (g_methods[id].fn && self->t == g_methods[id].kind)
		return g_methods[id].fn(rt, at, self, id, fname, a);
	UNSUP(rt, at, "%s() is not supported", fname);
}

struct val kj_call_global(struct rt *rt, const struct node *at, int fn, const struct args *a)
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
			r1 = kj_want_int(rt, at, "range", &a->v[0]);
		} else {
			r0 = kj_want_int(rt, at, "range", &a->v[0]);
			r1 = kj_want_int(rt, at, "range", &a->v[1]);
			if (a->n == 3)
				rs = kj_want_int(rt, at, "range", &a->v[2]);
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
		kj_bind(rt, at, "raise_exception", pn, 1, 1, a, p);
		struct val m = kj_str_of(rt, at, &p[0]);
		kj_rfail(rt, at, KV_ERR_INVALID, "template error: %.*s", (int)(m.u.s.n > 500 ? 500 : m.u.s.n), m.u.s.p);
	}
	case G_STRFTIME: {
		static const char *const pn[] = {"format"};
		char buf[512];
		kj_bind(rt, at, "strftime_now", pn, 1, 1, a, p);
		kj_want_str(rt, at, "strftime_now", &p[0]);
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
