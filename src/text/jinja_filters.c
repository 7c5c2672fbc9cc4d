/*
 * jinja_filters.c - Jinja's filters and tests (jinja2.filters,
 * jinja2.tests), with the name tables the parser resolves them against.
 * They work on values only: nothing here calls back into the evaluator.
 */
#include "text/jinja_int.h"
#include <errno.h>
#include <math.h>
#include <utf8proc.h>

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
		return kj_str_case(rt, at, v, CASE_LOWER);
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
		struct val s = kj_str_strip(rt, at, v, NULL, 3);
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
		struct val s = kj_str_strip(rt, at, v, NULL, 3);
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

/*
 * The filters, one function each (or one for a group that differs by a
 * flag, which reads id), found by id in g_filters: jinja2.filters' names,
 * arguments and defaults. fname is the filter's name for messages.
 */
typedef struct val filter_fn(struct rt *rt, const struct node *at, int id, const char *fname, const struct val *v,
			     const struct args *a);
#define FILTER(name)                                                                                 \
	static struct val name(struct rt *rt, const struct node *at, int id __attribute__((unused)), \
			       const char *fname __attribute__((unused)), const struct val *v, const struct args *a)

FILTER(filter_abs)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	if (v->t == V_FLOAT)
		return vfloat(fabs(v->u.f));
	if (is_intlike(v)) {
		if (v->u.i == INT64_MIN)
			UNSUP(rt, at, "integer overflow");
		return vint(v->u.i < 0 ? -v->u.i : v->u.i);
	}
	TYPE_ERR(rt, at, "bad operand type for abs(): '%s'", kj_kind_name(v));
}

FILTER(filter_attr)
{
	static const char *const pn[] = {"name"};
	struct val p[1];
	kj_bind(rt, at, fname, pn, 1, 1, a, p);
	kj_want_str(rt, at, fname, &p[0]);
	if (v->t == V_DICT) {
		int m = kj_meth_lookup(V_DICT, 0, p[0].u.s.p, p[0].u.s.n);
		return m >= 0 ? kj_method_val(rt, at, v, m) : kj_undef_of(p[0].u.s.p, p[0].u.s.n, V_DICT, 0);
	}
	return kj_get_attr(rt, at, v, p[0].u.s.p, p[0].u.s.n);
}

FILTER(filter_batch)
{
	static const char *const pn[] = {"linecount", "fill_with"};
	struct val p[2];
	kj_bind(rt, at, fname, pn, 2, 1, a, p);
	int64_t k = kj_want_int(rt, at, fname, &p[0]);
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

FILTER(filter_case)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	struct val s = kj_str_of(rt, at, v);
	s.safe = v->t == V_STR && v->safe;
	return kj_str_case(rt, at, &s, id == F_CAPITALIZE ? CASE_CAPITALIZE : id == F_LOWER ? CASE_LOWER : CASE_UPPER);
}

FILTER(filter_title)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	struct val s = kj_str_of(rt, at, v);
	return jinja_title(rt, at, &s);
}

FILTER(filter_center)
{
	static const char *const pn[] = {"width"};
	struct val p[1];
	kj_bind(rt, at, fname, pn, 1, 0, a, p);
	struct val s = kj_str_of(rt, at, v);
	return kj_str_pad(rt, at, &s, p[0].t == V_MISSING ? 80 : kj_want_int(rt, at, fname, &p[0]), NULL, 0);
}

FILTER(filter_length)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	return vint(kj_val_len(rt, at, v));
}

FILTER(filter_default)
{
	static const char *const pn[] = {"default_value", "boolean"};
	struct val p[2];
	kj_bind(rt, at, fname, pn, 2, 0, a, p);
	int boolean = p[1].t != V_MISSING && kj_truthy(&p[1]);
	if (v->t == V_UNDEF || (boolean && !kj_truthy(v)))
		return p[0].t == V_MISSING ? vstr("", 0) : p[0];
	return *v;
}

FILTER(filter_dictsort)
{
	static const char *const pn[] = {"case_sensitive", "by", "reverse"};
	struct val p[3];
	kj_bind(rt, at, fname, pn, 3, 0, a, p);
	if (v->t != V_DICT)
		TYPE_ERR(rt, at, "dictsort(): expected a mapping, got %s", kj_kind_name(v));
	int by = 0;
	if (p[1].t != V_MISSING) {
		kj_want_str(rt, at, fname, &p[1]);
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

FILTER(filter_escape)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	if (id == F_FORCEESCAPE && v->t == V_STR && v->safe) {
		struct val s = *v;
		s.safe = 0;
		return kj_markup_escape(rt, at, &s);
	}
	return kj_markup_escape(rt, at, v);
}

FILTER(filter_first)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	const struct list *l = kj_iter_items(rt, at, v);
	return l->n ? l->v[0] : vundef("no first item, sequence was empty");
}

FILTER(filter_last)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	if (v->t == V_LIST && v->u.l->kind == L_ITER)
		TYPE_ERR(rt, at, "last(): a generator cannot be reversed (use |list first)");
	const struct list *l = kj_iter_items(rt, at, v);
	return l->n ? l->v[l->n - 1] : vundef("no last item, sequence was empty");
}

FILTER(filter_float)
{
	static const char *const pn[] = {"default"};
	struct val p[1];
	kj_bind(rt, at, fname, pn, 1, 0, a, p);
	struct val def = p[0].t == V_MISSING ? vfloat(0.0) : p[0];
	return py_float(rt, at, v, &def);
}

FILTER(filter_int)
{
	static const char *const pn[] = {"default", "base"};
	struct val p[2];
	kj_bind(rt, at, fname, pn, 2, 0, a, p);
	struct val def = p[0].t == V_MISSING ? vint(0) : p[0];
	int64_t base = p[1].t == V_MISSING ? 10 : kj_want_int(rt, at, fname, &p[1]);
	if (base != 10 && base != 2 && base != 8 && base != 16)
		UNSUP(rt, at, "int(): base %lld", (long long)base);
	return py_int(rt, at, v, &def, base);
}

FILTER(filter_format)
{
	if (v->t != V_STR)
		TYPE_ERR(rt, at, "format(): the value must be a string");
	return printf_format(rt, at, v, a);
}

FILTER(filter_indent)
{
	static const char *const pn[] = {"width", "first", "blank"};
	struct val p[3];
	kj_bind(rt, at, fname, pn, 3, 0, a, p);
	if (v->t != V_STR)
		TYPE_ERR(rt, at, "indent(): can only indent a string, not %s", kj_kind_name(v));
	struct val ind;
	if (p[0].t == V_STR) {
		ind = p[0];
	} else {
		int64_t w = p[0].t == V_MISSING ? 4 : kj_want_int(rt, at, fname, &p[0]);
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
	const struct list *lines = kj_str_splitlines(rt, at, &sv, 0).u.l;
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

FILTER(filter_items)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
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

FILTER(filter_join)
{
	static const char *const pn[] = {"d", "attribute"};
	struct val p[2];
	kj_bind(rt, at, fname, pn, 2, 0, a, p);
	struct val sep = p[0].t == V_MISSING ? vstr("", 0) : kj_str_of(rt, at, &p[0]);
	const struct list *items = kj_iter_items(rt, at, v);
	if (p[1].t != V_MISSING && p[1].t != V_NONE) {
		struct list *m = kj_list_new(rt, at, items->n, L_LIST);
		for (size_t i = 0; i < items->n; i++)
			m->v[i] = attr_path(rt, at, &items->v[i], &p[1]);
		items = m;
	}
	kj_step(rt, at, items->n);
	return kj_str_join(rt, at, &sep, items, 0);
}

FILTER(filter_list)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	const struct list *items = kj_iter_items(rt, at, v);
	struct list *l = kj_list_new(rt, at, items->n, L_LIST);
	memcpy(l->v, items->v, items->n * sizeof *l->v);
	return vlist(l);
}

FILTER(filter_map)
{
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

FILTER(filter_max_min)
{
	static const char *const pn[] = {"case_sensitive", "attribute"};
	struct val p[2];
	kj_bind(rt, at, fname, pn, 2, 0, a, p);
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

FILTER(filter_reject)
{
	return select_reject(rt, at, v, a, 0, 0);
}

FILTER(filter_select)
{
	return select_reject(rt, at, v, a, 1, 0);
}

FILTER(filter_rejectattr)
{
	return select_reject(rt, at, v, a, 0, 1);
}

FILTER(filter_selectattr)
{
	return select_reject(rt, at, v, a, 1, 1);
}

FILTER(filter_replace)
{
	static const char *const pn[] = {"old", "new", "count"};
	struct val p[3];
	kj_bind(rt, at, fname, pn, 3, 2, a, p);
	struct val s = kj_str_of(rt, at, v), o = kj_str_of(rt, at, &p[0]), nw = kj_str_of(rt, at, &p[1]);
	int64_t cnt = p[2].t == V_MISSING || p[2].t == V_NONE ? -1 : kj_want_int(rt, at, fname, &p[2]);
	struct val r = kj_str_replace(rt, at, &s, &o, &nw, cnt);
	r.safe = 0;
	return r;
}

FILTER(filter_reverse)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
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

FILTER(filter_round)
{
	static const char *const pn[] = {"precision", "method"};
	struct val p[2];
	kj_bind(rt, at, fname, pn, 2, 0, a, p);
	int64_t prec = p[0].t == V_MISSING ? 0 : kj_want_int(rt, at, fname, &p[0]);
	int method = 0;
	if (p[1].t != V_MISSING) {
		kj_want_str(rt, at, fname, &p[1]);
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

FILTER(filter_safe)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	struct val s = kj_str_of(rt, at, v);
	s.safe = 1;
	return s;
}

FILTER(filter_sort)
{
	static const char *const pn[] = {"reverse", "case_sensitive", "attribute"};
	struct val p[3];
	kj_bind(rt, at, fname, pn, 3, 0, a, p);
	const struct list *items = kj_iter_items(rt, at, v);
	struct list *l = kj_list_new(rt, at, items->n, L_LIST);
	memcpy(l->v, items->v, items->n * sizeof *l->v);
	struct val *keys = kj_ralloc(rt, at, (items->n ? items->n : 1) * sizeof *keys);
	int cs = p[1].t != V_MISSING && kj_truthy(&p[1]);
	for (size_t i = 0; i < items->n; i++) {
		/* "a,b" sorts by a tuple of attributes */
		if (p[2].t == V_STR && memchr(p[2].u.s.p, ',', p[2].u.s.n)) {
			struct val parts = kj_str_split(rt, at, &p[2], &(struct val){.t = V_STR, .u.s = {",", 1}}, -1, 0);
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

FILTER(filter_string)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
	return kj_str_of(rt, at, v);
}

FILTER(filter_sum)
{
	static const char *const pn[] = {"attribute", "start"};
	struct val p[2];
	kj_bind(rt, at, fname, pn, 2, 0, a, p);
	struct val acc = p[1].t == V_MISSING ? vint(0) : p[1];
	const struct list *items = kj_iter_items(rt, at, v);
	kj_step(rt, at, items->n);
	for (size_t i = 0; i < items->n; i++) {
		struct val x = p[0].t != V_MISSING ? attr_path(rt, at, &items->v[i], &p[0]) : items->v[i];
		acc = kj_binop(rt, at, B_ADD, &acc, &x);
	}
	return acc;
}

FILTER(filter_tojson)
{
	static const char *const pn[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
	struct val p[4];
	kj_bind(rt, at, fname, pn, 4, 0, a, p);
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

FILTER(filter_trim)
{
	static const char *const pn[] = {"chars"};
	struct val p[1];
	kj_bind(rt, at, fname, pn, 1, 0, a, p);
	struct val s = kj_str_of(rt, at, v);
	s.safe = v->t == V_STR && v->safe;
	return kj_str_strip(rt, at, &s, &p[0], 3);
}

FILTER(filter_truncate)
{
	static const char *const pn[] = {"length", "killwords", "end", "leeway"};
	struct val p[4];
	kj_bind(rt, at, fname, pn, 4, 0, a, p);
	if (v->t != V_STR)
		TYPE_ERR(rt, at, "truncate(): expected a string");
	int64_t length = p[0].t == V_MISSING ? 255 : kj_want_int(rt, at, fname, &p[0]);
	int kill = p[1].t != V_MISSING && kj_truthy(&p[1]);
	struct val end = p[2].t == V_MISSING ? vstr("...", 3) : *kj_want_str(rt, at, fname, &p[2]);
	int64_t leeway = p[3].t == V_MISSING || p[3].t == V_NONE ? 5 : kj_want_int(rt, at, fname, &p[3]);
	int64_t elen = (int64_t)kv_utf8_count(end.u.s.p, end.u.s.n), slen = (int64_t)kv_utf8_count(v->u.s.p, v->u.s.n);
	if (length < elen || leeway < 0)
		TYPE_ERR(rt, at, "truncate(): expected length >= %lld and leeway >= 0", (long long)elen);
	if (slen <= length + leeway)
		return *v;
	struct val cut = vint(length - elen);
	struct val head = kj_do_slice(rt, at, v, &KJ_MISSING, &cut, &KJ_MISSING);
	if (!kill) {
		struct val sp = vstr(" ", 1);
		struct val parts = kj_str_split(rt, at, &head, &sp, 1, 1);
		head = parts.u.l->v[0];
	}
	struct val r = kj_binop(rt, at, B_ADD, &head, &end);
	return r;
}

FILTER(filter_unique)
{
	static const char *const pn[] = {"case_sensitive", "attribute"};
	struct val p[2];
	kj_bind(rt, at, fname, pn, 2, 0, a, p);
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

FILTER(filter_wordcount)
{
	struct val p[1];
	kj_bind(rt, at, fname, NULL, 0, 0, a, p);
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

static filter_fn *const g_filters[F__COUNT] = {
	[F_ABS] = filter_abs,
	[F_ATTR] = filter_attr,
	[F_BATCH] = filter_batch,
	[F_CAPITALIZE] = filter_case,
	[F_LOWER] = filter_case,
	[F_UPPER] = filter_case,
	[F_TITLE] = filter_title,
	[F_CENTER] = filter_center,
	[F_COUNT] = filter_length,
	[F_LENGTH] = filter_length,
	[F_D] = filter_default,
	[F_DEFAULT] = filter_default,
	[F_DICTSORT] = filter_dictsort,
	[F_E] = filter_escape,
	[F_ESCAPE] = filter_escape,
	[F_FORCEESCAPE] = filter_escape,
	[F_FIRST] = filter_first,
	[F_LAST] = filter_last,
	[F_FLOAT] = filter_float,
	[F_INT] = filter_int,
	[F_FORMAT] = filter_format,
	[F_INDENT] = filter_indent,
	[F_ITEMS] = filter_items,
	[F_JOIN] = filter_join,
	[F_LIST] = filter_list,
	[F_MAP] = filter_map,
	[F_MAX] = filter_max_min,
	[F_MIN] = filter_max_min,
	[F_REJECT] = filter_reject,
	[F_SELECT] = filter_select,
	[F_REJECTATTR] = filter_rejectattr,
	[F_SELECTATTR] = filter_selectattr,
	[F_REPLACE] = filter_replace,
	[F_REVERSE] = filter_reverse,
	[F_ROUND] = filter_round,
	[F_SAFE] = filter_safe,
	[F_SORT] = filter_sort,
	[F_STRING] = filter_string,
	[F_SUM] = filter_sum,
	[F_TOJSON] = filter_tojson,
	[F_TRIM] = filter_trim,
	[F_TRUNCATE] = filter_truncate,
	[F_UNIQUE] = filter_unique,
	[F_WORDCOUNT] = filter_wordcount,
};

struct val kj_call_filter(struct rt *rt, const struct node *at, int id, const struct val *v,
			      const struct args *a)
{
	const char *fname = kj_filt_names[id];
	if (!g_filters[id])
		UNSUP(rt, at, "filter '%s' is not supported", fname);
	return g_filters[id](rt, at, id, fname, v, a);
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
		kj_bind(rt, at, tname, NULL, 0, 0, a, p);
		struct val two = vint(2), r = kj_binop(rt, at, B_MOD, v, &two), want = vint(id == T_ODD);
		return kj_val_eq(rt, at, &r, &want, 0);
	}
	case T_DIVISIBLEBY: {
		kj_bind(rt, at, tname, pn_num, 1, 1, a, p);
		struct val r = kj_binop(rt, at, B_MOD, v, &p[0]), z = vint(0);
		return kj_val_eq(rt, at, &r, &z, 0);
	}
	case T_DEFINED: kj_bind(rt, at, tname, NULL, 0, 0, a, p); return v->t != V_UNDEF;
	case T_UNDEFINED: kj_bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_UNDEF;
	case T_FILTER:
	case T_TEST:
		kj_bind(rt, at, tname, NULL, 0, 0, a, p);
		if (v->t != V_STR)
			return 0;
		return id == T_FILTER ? kj_find_name(kj_filt_names, F_FIRST_UNSUPPORTED, v->u.s.p, v->u.s.n) >= 0
				      : kj_find_name(kj_test_names, T__COUNT, v->u.s.p, v->u.s.n) >= 0;
	case T_NONE: kj_bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_NONE;
	case T_BOOLEAN: kj_bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_BOOL;
	case T_FALSE: kj_bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_BOOL && !v->u.i;
	case T_TRUE: kj_bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_BOOL && v->u.i;
	case T_INTEGER: kj_bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_INT;
	case T_FLOAT: kj_bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_FLOAT;
	case T_LOWER:
	case T_UPPER: {
		kj_bind(rt, at, tname, NULL, 0, 0, a, p);
		struct val s = kj_str_of(rt, at, v);
		return kj_str_is_case(&s, id == T_UPPER);
	}
	case T_STRING: kj_bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_STR;
	case T_MAPPING: kj_bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_DICT;
	case T_NUMBER: kj_bind(rt, at, tname, NULL, 0, 0, a, p); return is_num(v);
	case T_SEQUENCE:
		kj_bind(rt, at, tname, NULL, 0, 0, a, p);
		return v->t == V_STR || v->t == V_DICT || v->t == V_UNDEF || is_seq_list(v);
	case T_ITERABLE:
		kj_bind(rt, at, tname, NULL, 0, 0, a, p);
		return v->t == V_STR || v->t == V_DICT || v->t == V_UNDEF || v->t == V_LIST;
	case T_CALLABLE:
		kj_bind(rt, at, tname, NULL, 0, 0, a, p);
		return v->t == V_MACRO || v->t == V_FUNC || v->t == V_METHOD || v->t == V_LOOP;
	case T_SAMEAS: kj_bind(rt, at, tname, pn_other, 1, 1, a, p); return sameas(v, &p[0]);
	case T_ESCAPED: kj_bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_STR && v->safe;
	case T_IN: kj_bind(rt, at, tname, pn_seq, 1, 1, a, p); return kj_contains(rt, at, v, &p[0]);
	case T_EQ1: case T_EQ2: case T_EQ3:
		kj_bind(rt, at, tname, pn_b, 1, 1, a, p);
		return kj_val_eq(rt, at, v, &p[0], 0);
	case T_NE1: case T_NE2:
		kj_bind(rt, at, tname, pn_b, 1, 1, a, p);
		return !kj_val_eq(rt, at, v, &p[0], 0);
	case T_GT1: case T_GT2: case T_GT3:
		kj_bind(rt, at, tname, pn_b, 1, 1, a, p);
		return kj_val_cmp(rt, at, v, &p[0], ">", 0) > 0;
	case T_GE1: case T_GE2:
		kj_bind(rt, at, tname, pn_b, 1, 1, a, p);
		return kj_val_cmp(rt, at, v, &p[0], ">=", 0) >= 0;
	case T_LT1: case T_LT2: case T_LT3:
		kj_bind(rt, at, tname, pn_b, 1, 1, a, p);
		return kj_val_cmp(rt, at, v, &p[0], "<", 0) < 0;
	case T_LE1: case T_LE2:
		kj_bind(rt, at, tname, pn_b, 1, 1, a, p);
		return kj_val_cmp(rt, at, v, &p[0], "<=", 0) <= 0;
	}
	UNSUP(rt, at, "test '%s' is not supported", tname);
}
