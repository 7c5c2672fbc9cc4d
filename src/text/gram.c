/*
 * gram.c - the grammar IR (gram.h).
 *
 * Nodes live in one growing array and kids in another; rule names in a
 * hash map (name -> id). A code point class is turned into UTF-8 byte
 * sequences by splitting each range at the points where the encoded
 * length changes and then, within one length, at the points where a
 * leading byte changes, the way RE2 and Rust's regex-syntax build their
 * UTF-8 automata (the byte ranges are exact: no overlongs, no surrogates).
 */
#include "text/gram.h"
#include "base/err.h"
#include "base/map.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rule {
	char *name;   /* owned, NUL-terminated */
	int expr;     /* -1: not defined yet */
	int line, col;
};

struct kv_gram {
	struct kv_gx *x;
	int n_x, c_x;
	int32_t *kids;
	int n_kids, c_kids;
	struct rule *r;
	int n_r, c_r;
	struct kv_map *names;
	int root;
	int err;          /* first error, sticky */
	char *errmsg;     /* its message */
};

int kv_gram_create(struct kv_gram **out)
{
	struct kv_gram *g = calloc(1, sizeof *g);
	*out = NULL;
	if (!g || !(g->names = kv_map_create(64))) {
		free(g);
		return kv_fail(KV_ERR_NOMEM, "grammar: out of memory");
	}
	g->root = -1;
	*out = g;
	return KV_OK;
}

void kv_gram_free(struct kv_gram *g)
{
	if (!g)
		return;
	for (int i = 0; i < g->n_r; i++)
		free(g->r[i].name);
	free(g->r);
	free(g->x);
	free(g->kids);
	kv_map_destroy(g->names);
	free(g->errmsg);
	free(g);
}

/* Record the first error (the message kv_fail just set). Returns -1. */
static int sticky(struct kv_gram *g, int rc)
{
	if (!g->err) {
		g->err = rc;
		free(g->errmsg);
		g->errmsg = strdup(kv_errmsg());
	}
	return -1;
}

int kv_gram_error(const struct kv_gram *g)
{
	if (g->err)
		kv_fail(g->err, "%s", g->errmsg ? g->errmsg : "grammar error");
	return g->err;
}

/* --- rules ----------------------------------------------------------------- */

static int add_rule(struct kv_gram *g, const char *name, size_t len)
{
	if (g->n_r >= KV_GRAM_MAX_RULES)
		return sticky(g, kv_fail(KV_ERR_INVALID, "grammar: more than %d rules", KV_GRAM_MAX_RULES));
	if (g->n_r == g->c_r) {
		int c = g->c_r ? 2 * g->c_r : 16;
		struct rule *r = realloc(g->r, (size_t)c * sizeof *r);
		if (!r)
			return sticky(g, kv_fail(KV_ERR_NOMEM, "grammar: out of memory"));
		g->r = r;
		g->c_r = c;
	}
	char *nm = malloc(len + 1);
	if (!nm)
		return sticky(g, kv_fail(KV_ERR_NOMEM, "grammar: out of memory"));
	memcpy(nm, name, len);
	nm[len] = 0;
	if (kv_map_put(g->names, nm, len, (uint64_t)g->n_r)) {
		free(nm);
		return sticky(g, kv_fail(KV_ERR_NOMEM, "grammar: out of memory"));
	}
	g->r[g->n_r] = (struct rule){nm, -1, 0, 0};
	return g->n_r++;
}

int kv_gram_rule(struct kv_gram *g, const char *name, size_t len)
{
	uint64_t v;
	if (kv_map_get(g->names, name, len, &v))
		return (int)v;
	return add_rule(g, name, len);
}

int kv_gram_rule_new(struct kv_gram *g, const char *hint)
{
	char nm[128];
	size_t hl = strlen(hint);
	if (hl > 100)
		hl = 100;
	memcpy(nm, hint, hl);
	nm[hl] = 0;
	if (!kv_map_get(g->names, nm, hl, NULL))
		return add_rule(g, nm, hl);
	for (int k = 2;; k++) {
		int n = snprintf(nm + hl, sizeof nm - hl, "-%d", k);
		if (!kv_map_get(g->names, nm, hl + (size_t)n, NULL))
			return add_rule(g, nm, hl + (size_t)n);
	}
}

int kv_gram_define(struct kv_gram *g, int rule, int expr)
{
	if (rule < 0 || expr < 0)
		return g->err ? g->err : kv_fail(KV_ERR_INVALID, "grammar: bad rule or expression");
	if (g->r[rule].expr >= 0)
		return kv_fail(KV_ERR_INVALID, "rule '%s' is defined twice", g->r[rule].name);
	g->r[rule].expr = expr;
	return KV_OK;
}

void kv_gram_rule_pos(struct kv_gram *g, int rule, int line, int col)
{
	if (rule >= 0 && rule < g->n_r) {
		g->r[rule].line = line;
		g->r[rule].col = col;
	}
}

void kv_gram_set_root(struct kv_gram *g, int rule)
{
	g->root = rule;
}

int kv_gram_root(const struct kv_gram *g)
{
	return g->root;
}

int kv_gram_n_rules(const struct kv_gram *g)
{
	return g->n_r;
}

const char *kv_gram_rule_name(const struct kv_gram *g, int rule)
{
	return rule >= 0 && rule < g->n_r ? g->r[rule].name : "?";
}

int kv_gram_rule_expr(const struct kv_gram *g, int rule)
{
	return rule >= 0 && rule < g->n_r ? g->r[rule].expr : -1;
}

void kv_gram_rule_where(const struct kv_gram *g, int rule, int *line, int *col)
{
	*line = rule >= 0 && rule < g->n_r ? g->r[rule].line : 0;
	*col = rule >= 0 && rule < g->n_r ? g->r[rule].col : 0;
}

/* --- expressions ----------------------------------------------------------- */

static int add_node(struct kv_gram *g, int kind, int a, int b, const int *kids, int nk)
{
	if (g->err)
		return -1;
	for (int i = 0; i < nk; i++)
		if (kids[i] < 0)
			return -1;
	if (g->n_x >= KV_GRAM_MAX_EXPRS || g->n_kids > KV_GRAM_MAX_EXPRS * 2 - nk)
		return sticky(g, kv_fail(KV_ERR_INVALID, "grammar: more than %d expression nodes (too large)",
					 KV_GRAM_MAX_EXPRS));
	if (g->n_x == g->c_x) {
		int c = g->c_x ? 2 * g->c_x : 256;
		struct kv_gx *x = realloc(g->x, (size_t)c * sizeof *x);
		if (!x)
			return sticky(g, kv_fail(KV_ERR_NOMEM, "grammar: out of memory"));
		g->x = x;
		g->c_x = c;
	}
	if (g->n_kids + nk > g->c_kids) {
		int c = g->c_kids ? 2 * g->c_kids : 512;
		while (c < g->n_kids + nk)
			c *= 2;
		int32_t *k = realloc(g->kids, (size_t)c * sizeof *k);
		if (!k)
			return sticky(g, kv_fail(KV_ERR_NOMEM, "grammar: out of memory"));
		g->kids = k;
		g->c_kids = c;
	}
	struct kv_gx *x = &g->x[g->n_x];
	x->kind = (uint8_t)kind;
	x->a = a;
	x->b = b;
	x->kids = g->n_kids;
	x->n_kids = nk;
	for (int i = 0; i < nk; i++)
		g->kids[g->n_kids++] = kids[i];
	return g->n_x++;
}

int kv_gram_empty(struct kv_gram *g)
{
	return add_node(g, KV_GX_EMPTY, 0, 0, NULL, 0);
}

int kv_gram_fail(struct kv_gram *g)
{
	return add_node(g, KV_GX_FAIL, 0, 0, NULL, 0);
}

int kv_gram_bytes(struct kv_gram *g, int lo, int hi)
{
	if (lo < 0 || hi > 255 || lo > hi)
		return g->err ? -1 : sticky(g, kv_fail(KV_ERR_INVALID, "grammar: byte range %d..%d", lo, hi));
	return add_node(g, KV_GX_BYTES, lo, hi, NULL, 0);
}

int kv_gram_lit(struct kv_gram *g, const void *s, size_t n)
{
	const uint8_t *p = s;
	if (n == 0)
		return kv_gram_empty(g);
	if (n == 1)
		return kv_gram_bytes(g, p[0], p[0]);
	if (n > KV_GRAM_MAX_EXPRS)
		return sticky(g, kv_fail(KV_ERR_INVALID, "grammar: literal of %zu bytes is too long", n));
	int stack[64], *k = n <= 64 ? stack : malloc(n * sizeof *k);
	if (!k)
		return sticky(g, kv_fail(KV_ERR_NOMEM, "grammar: out of memory"));
	for (size_t i = 0; i < n; i++)
		k[i] = kv_gram_bytes(g, p[i], p[i]);
	int r = add_node(g, KV_GX_SEQ, 0, 0, k, (int)n);
	if (k != stack)
		free(k);
	return r;
}

int kv_gram_lits(struct kv_gram *g, const char *s)
{
	return kv_gram_lit(g, s, strlen(s));
}

int kv_gram_seq(struct kv_gram *g, const int *kids, int n)
{
	if (n == 0)
		return kv_gram_empty(g);
	if (n == 1)
		return kids[0];
	return add_node(g, KV_GX_SEQ, 0, 0, kids, n);
}

int kv_gram_ids_push(int **ids, int *n, int *cap, int x, const char *what)
{
	if (*n == *cap) {
		int c = *cap ? 2 * *cap : 8;
		int *q = realloc(*ids, (size_t)c * sizeof *q);
		if (!q)
			return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
		*ids = q;
		*cap = c;
	}
	(*ids)[(*n)++] = x;
	return 0;
}

int kv_gram_alt(struct kv_gram *g, const int *kids, int n)
{
	if (n == 0)
		return kv_gram_fail(g);
	if (n == 1)
		return kids[0];
	return add_node(g, KV_GX_ALT, 0, 0, kids, n);
}

int kv_gram_seq2(struct kv_gram *g, int a, int b)
{
	int k[2] = {a, b};
	return kv_gram_seq(g, k, 2);
}

int kv_gram_seq3(struct kv_gram *g, int a, int b, int c)
{
	int k[3] = {a, b, c};
	return kv_gram_seq(g, k, 3);
}

int kv_gram_alt2(struct kv_gram *g, int a, int b)
{
	int k[2] = {a, b};
	return kv_gram_alt(g, k, 2);
}

int kv_gram_rep(struct kv_gram *g, int x, int min, int max)
{
	if (x < 0)
		return -1;
	if (min < 0 || min > KV_GRAM_MAX_REP || max > KV_GRAM_MAX_REP || (max >= 0 && max < min))
		return sticky(g, kv_fail(KV_ERR_INVALID, "grammar: repetition {%d,%d} out of range (bounds up to %d)",
					 min, max, KV_GRAM_MAX_REP));
	if (min == 1 && max == 1)
		return x;
	if (max == 0)
		return kv_gram_empty(g);
	return add_node(g, KV_GX_REP, min, max < 0 ? -1 : max, &x, 1);
}

int kv_gram_opt(struct kv_gram *g, int x)
{
	return kv_gram_rep(g, x, 0, 1);
}

int kv_gram_star(struct kv_gram *g, int x)
{
	return kv_gram_rep(g, x, 0, -1);
}

int kv_gram_ref(struct kv_gram *g, int rule)
{
	if (rule < 0)
		return -1;
	return add_node(g, KV_GX_REF, rule, 0, NULL, 0);
}

const struct kv_gx *kv_gram_node(const struct kv_gram *g, int expr)
{
	return &g->x[expr];
}

const int32_t *kv_gram_kids(const struct kv_gram *g, int expr)
{
	return g->kids + g->x[expr].kids;
}

int kv_gram_n_exprs(const struct kv_gram *g)
{
	return g->n_x;
}

/* --- code point classes ---------------------------------------------------- */

struct cpr {
	uint32_t lo, hi;
};

static int cpr_cmp(const void *a, const void *b)
{
	const struct cpr *x = a, *y = b;
	return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Byte sequences for code points lo..hi that all encode to n bytes.
 * Appends alternatives (SEQ of BYTES) to alts. */
struct alts {
	int *v;
	int n, c;
};

static int alts_push(struct kv_gram *g, struct alts *a, int x)
{
	if (x < 0)
		return -1;
	if (a->n == a->c) {
		int c = a->c ? 2 * a->c : 16;
		int *v = realloc(a->v, (size_t)c * sizeof *v);
		if (!v)
			return sticky(g, kv_fail(KV_ERR_NOMEM, "grammar: out of memory"));
		a->v = v;
		a->c = c;
	}
	a->v[a->n++] = x;
	return 0;
}

static void enc(uint32_t cp, int n, uint8_t *b)
{
	if (n == 1) {
		b[0] = (uint8_t)cp;
	} else if (n == 2) {
		b[0] = (uint8_t)(0xC0 | (cp >> 6));
		b[1] = (uint8_t)(0x80 | (cp & 0x3F));
	} else if (n == 3) {
		b[0] = (uint8_t)(0xE0 | (cp >> 12));
		b[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
		b[2] = (uint8_t)(0x80 | (cp & 0x3F));
	} else {
		b[0] = (uint8_t)(0xF0 | (cp >> 18));
		b[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
		b[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
		b[3] = (uint8_t)(0x80 | (cp & 0x3F));
	}
}

/*
 * lo..hi all of encoded length n. If the range covers whole blocks of the
 * trailing bytes, the encoding of lo and hi gives one sequence of ranges;
 * otherwise split at the first trailing position where it does not.
 */
static int utf8_split(struct kv_gram *g, uint32_t lo, uint32_t hi, int n, struct alts *a)
{
	for (int i = 1; i < n; i++) {
		uint32_t m = (1u << (6 * i)) - 1; /* the low 6*i bits */
		if ((lo & ~m) != (hi & ~m)) {
			if ((lo & m) != 0) {
				if (utf8_split(g, lo, lo | m, n, a) || utf8_split(g, (lo | m) + 1, hi, n, a))
					return -1;
				return 0;
			}
			if ((hi & m) != m) {
				if (utf8_split(g, lo, (hi & ~m) - 1, n, a) || utf8_split(g, hi & ~m, hi, n, a))
					return -1;
				return 0;
			}
		}
	}
	uint8_t bl[4], bh[4];
	enc(lo, n, bl);
	enc(hi, n, bh);
	int k[4];
	for (int i = 0; i < n; i++)
		k[i] = kv_gram_bytes(g, bl[i], bh[i]);
	return alts_push(g, a, kv_gram_seq(g, k, n));
}

int kv_gram_cps(struct kv_gram *g, const uint32_t *pairs, int n, int negate)
{
	if (g->err)
		return -1;
	struct cpr *r = malloc(((size_t)n + 2) * sizeof *r);
	struct alts a = {0};
	int m = 0, out = -1;
	if (!r)
		return sticky(g, kv_fail(KV_ERR_NOMEM, "grammar: out of memory"));
	for (int i = 0; i < n; i++) {
		uint32_t lo = pairs[2 * i], hi = pairs[2 * i + 1];
		if (lo > hi || lo > 0x10FFFF) {
			sticky(g, kv_fail(KV_ERR_INVALID, "grammar: bad code point range U+%X..U+%X", lo, hi));
			goto done;
		}
		if (hi > 0x10FFFF)
			hi = 0x10FFFF;
		r[m++] = (struct cpr){lo, hi};
	}
	qsort(r, (size_t)m, sizeof *r, cpr_cmp);
	/* merge overlapping and adjacent ranges */
	int w = 0;
	for (int i = 0; i < m; i++) {
		if (w && r[i].lo <= r[w - 1].hi + 1) {
			if (r[i].hi > r[w - 1].hi)
				r[w - 1].hi = r[i].hi;
		} else {
			r[w++] = r[i];
		}
	}
	m = w;
	if (negate) {
		struct cpr *c = malloc(((size_t)m + 1) * sizeof *c);
		int k = 0;
		uint32_t next = 0;
		if (!c) {
			sticky(g, kv_fail(KV_ERR_NOMEM, "grammar: out of memory"));
			goto done;
		}
		for (int i = 0; i < m; i++) {
			if (r[i].lo > next)
				c[k++] = (struct cpr){next, r[i].lo - 1};
			next = r[i].hi + 1;
		}
		if (next <= 0x10FFFF)
			c[k++] = (struct cpr){next, 0x10FFFF};
		free(r);
		r = c;
		m = k;
	}
	static const uint32_t lim[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
	for (int i = 0; i < m; i++) {
		/* cut out the surrogates, then split by encoded length */
		uint32_t parts[2][2];
		int np = 0;
		if (r[i].hi < 0xD800 || r[i].lo > 0xDFFF) {
			parts[np][0] = r[i].lo;
			parts[np++][1] = r[i].hi;
		} else {
			if (r[i].lo < 0xD800) {
				parts[np][0] = r[i].lo;
				parts[np++][1] = 0xD7FF;
			}
			if (r[i].hi > 0xDFFF) {
				parts[np][0] = 0xE000;
				parts[np++][1] = r[i].hi;
			}
		}
		for (int p = 0; p < np; p++) {
			uint32_t lo = parts[p][0], hi = parts[p][1];
			for (int len = 1; len <= 4 && lo <= hi; len++) {
				if (lo > lim[len - 1])
					continue;
				uint32_t top = hi < lim[len - 1] ? hi : lim[len - 1];
				if (utf8_split(g, lo, top, len, &a))
					goto done;
				lo = top + 1;
			}
		}
	}
	out = kv_gram_alt(g, a.v, a.n);
done:
	free(r);
	free(a.v);
	return out;
}

int kv_gram_any_cp(struct kv_gram *g)
{
	uint32_t all[2] = {0, 0x10FFFF};
	return kv_gram_cps(g, all, 1, 0);
}

/* --- dump ------------------------------------------------------------------ */

static void put_byte(struct kv_buf *o, int c, int in_class)
{
	if (c == '\n')
		kv_buf_adds(o, "\\n");
	else if (c == '\r')
		kv_buf_adds(o, "\\r");
	else if (c == '\t')
		kv_buf_adds(o, "\\t");
	else if (c == '\\' || (!in_class && c == '"') || (in_class && (c == ']' || c == '-' || c == '^')))
		kv_buf_printf(o, "\\%c", c);
	else if (c >= 0x20 && c < 0x7F)
		kv_buf_addc(o, (char)c);
	else
		kv_buf_printf(o, "\\x%02X", c);
}

static void dump_x(const struct kv_gram *g, int e, struct kv_buf *o, int depth)
{
	const struct kv_gx *x = &g->x[e];
	const int32_t *k = g->kids + x->kids;
	if (depth > 200) {
		kv_buf_adds(o, "...");
		return;
	}
	switch (x->kind) {
	case KV_GX_EMPTY:
		kv_buf_adds(o, "\"\"");
		break;
	case KV_GX_FAIL:
		kv_buf_adds(o, "[^\\x00-\\U0010FFFF]");
		break;
	case KV_GX_BYTES:
		if (x->a == x->b) {
			kv_buf_addc(o, '"');
			put_byte(o, x->a, 0);
			kv_buf_addc(o, '"');
		} else {
			kv_buf_addc(o, '[');
			put_byte(o, x->a, 1);
			kv_buf_addc(o, '-');
			put_byte(o, x->b, 1);
			kv_buf_addc(o, ']');
		}
		break;
	case KV_GX_SEQ:
	case KV_GX_ALT:
		kv_buf_addc(o, '(');
		for (int i = 0; i < x->n_kids; i++) {
			if (i)
				kv_buf_adds(o, x->kind == KV_GX_SEQ ? " " : " | ");
			dump_x(g, k[i], o, depth + 1);
		}
		kv_buf_addc(o, ')');
		break;
	case KV_GX_REP:
		dump_x(g, k[0], o, depth + 1);
		if (x->b < 0)
			kv_buf_printf(o, "{%d,}", x->a);
		else
			kv_buf_printf(o, "{%d,%d}", x->a, x->b);
		break;
	case KV_GX_REF:
		kv_buf_adds(o, g->r[x->a].name);
		break;
	}
}

void kv_gram_dump(const struct kv_gram *g, struct kv_buf *out)
{
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < g->n_r; i++) {
			if ((pass == 0) != (i == g->root))
				continue;
			kv_buf_printf(out, "%s ::= ", g->r[i].name);
			if (g->r[i].expr < 0)
				kv_buf_adds(out, "(undefined)");
			else
				dump_x(g, g->r[i].expr, out, 0);
			kv_buf_addc(out, '\n');
		}
}
