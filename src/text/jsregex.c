/*
 * jsregex.c - ECMAScript regex subset -> grammar IR (jsregex.h).
 *
 * Recursive descent straight to IR expressions. A class is collected as
 * code point ranges and encoded by kv_rx_class: in JSON mode the code
 * points a JSON string cannot hold raw ('"', '\', U+0000..U+001F) become
 * their escapes (\", \\, \n, \u0001, ...), so the grammar writes exactly
 * one encoding of each character.
 */
#include "text/jsregex.h"
#include "base/err.h"
#include "base/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct crs {
	uint32_t *v; /* pairs */
	int n, c;
};

static int crs_add(struct crs *r, uint32_t lo, uint32_t hi)
{
	if (r->n == r->c) {
		int c = r->c ? 2 * r->c : 16;
		uint32_t *v = realloc(r->v, (size_t)c * 2 * sizeof *v);
		if (!v)
			return kv_fail(KV_ERR_NOMEM, "pattern: out of memory");
		r->v = v;
		r->c = c;
	}
	r->v[2 * r->n] = lo;
	r->v[2 * r->n + 1] = hi;
	r->n++;
	return 0;
}

static int cmp_pair(const void *a, const void *b)
{
	const uint32_t *x = a, *y = b;
	return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Sort, merge, and complement when negate. */
static int crs_norm(struct crs *r, int negate)
{
	if (r->n)
		qsort(r->v, (size_t)r->n, 2 * sizeof *r->v, cmp_pair);
	int w = 0;
	for (int i = 0; i < r->n; i++) {
		if (w && r->v[2 * i] <= r->v[2 * (w - 1) + 1] + 1) {
			if (r->v[2 * i + 1] > r->v[2 * (w - 1) + 1])
				r->v[2 * (w - 1) + 1] = r->v[2 * i + 1];
		} else {
			r->v[2 * w] = r->v[2 * i];
			r->v[2 * w + 1] = r->v[2 * i + 1];
			w++;
		}
	}
	r->n = w;
	if (!negate)
		return 0;
	struct crs c = {0};
	uint32_t next = 0;
	for (int i = 0; i < r->n; i++) {
		if (r->v[2 * i] > next && crs_add(&c, next, r->v[2 * i] - 1))
			goto nomem;
		next = r->v[2 * i + 1] + 1;
	}
	if (next <= 0x10FFFF && crs_add(&c, next, 0x10FFFF))
		goto nomem;
	free(r->v);
	*r = c;
	return 0;
nomem:
	free(c.v);
	return -1;
}

static int crs_has(const struct crs *r, uint32_t c)
{
	for (int i = 0; i < r->n; i++)
		if (c >= r->v[2 * i] && c <= r->v[2 * i + 1])
			return 1;
	return 0;
}

/* Remove one code point from normalised ranges. */
static int crs_remove(struct crs *r, uint32_t c)
{
	for (int i = 0; i < r->n; i++) {
		uint32_t lo = r->v[2 * i], hi = r->v[2 * i + 1];
		if (c < lo || c > hi)
			continue;
		if (lo == hi) {
			memmove(r->v + 2 * i, r->v + 2 * i + 2, (size_t)(r->n - i - 1) * 2 * sizeof *r->v);
			r->n--;
		} else if (c == lo) {
			r->v[2 * i] = lo + 1;
		} else if (c == hi) {
			r->v[2 * i + 1] = hi - 1;
		} else {
			r->v[2 * i + 1] = c - 1;
			if (crs_add(r, c + 1, hi))
				return -1;
			qsort(r->v, (size_t)r->n, 2 * sizeof *r->v, cmp_pair);
		}
		return 0;
	}
	return 0;
}

static int escape_of(uint32_t c, char *buf)
{
	switch (c) {
	case '"': return sprintf(buf, "\\\"");
	case '\\': return sprintf(buf, "\\\\");
	case '\n': return sprintf(buf, "\\n");
	case '\r': return sprintf(buf, "\\r");
	case '\t': return sprintf(buf, "\\t");
	case '\b': return sprintf(buf, "\\b");
	case '\f': return sprintf(buf, "\\f");
	default: return sprintf(buf, "\\u%04x", c);
	}
}

int kv_rx_class(struct kv_gram *g, const uint32_t *pairs, int n, int negate, const struct kv_rx_opts *o)
{
	struct crs r = {0};
	int alts[40], na = 0, out = -1;
	for (int i = 0; i < n; i++)
		if (crs_add(&r, pairs[2 * i], pairs[2 * i + 1]))
			goto done;
	if (crs_norm(&r, negate))
		goto done;
	if (o->mode == KV_RX_JSON) {
		char buf[8];
		int all_ctl = 1;
		for (uint32_t c = 0; c < 0x20 && all_ctl; c++)
			all_ctl = crs_has(&r, c);
		if (all_ctl) {
			/* every control character: \n \r \t and \u00XX for all 32
			 * (one short alternative instead of 32) */
			int hex = kv_gram_alt2(g, kv_gram_bytes(g, '0', '9'), kv_gram_bytes(g, 'a', 'f'));
			alts[na++] = kv_gram_seq2(g, kv_gram_lits(g, "\\u00"), kv_gram_seq2(g, kv_gram_bytes(g, '0', '1'), hex));
			alts[na++] = kv_gram_lits(g, "\\n");
			alts[na++] = kv_gram_lits(g, "\\r");
			alts[na++] = kv_gram_lits(g, "\\t");
			if (crs_remove(&r, 0) || crs_norm(&r, 0))
				goto done;
			for (uint32_t c = 1; c < 0x20; c++)
				if (crs_remove(&r, c))
					goto done;
		}
		for (uint32_t c = 0; c < 0x20; c++)
			if (crs_has(&r, c)) {
				int l = escape_of(c, buf);
				alts[na++] = kv_gram_lit(g, buf, (size_t)l);
				if (crs_remove(&r, c))
					goto done;
			}
		static const uint32_t sp[3] = {'"', '\\', '<'};
		for (int k = 0; k < 3; k++) {
			if (!crs_has(&r, sp[k]) || (sp[k] == '<' && !o->no_lt))
				continue;
			int l = escape_of(sp[k], buf);
			alts[na++] = kv_gram_lit(g, buf, (size_t)l);
			if (crs_remove(&r, sp[k]))
				goto done;
		}
	} else if (o->no_lt && crs_remove(&r, '<')) {
		goto done;
	}
	if (r.n)
		alts[na++] = kv_gram_cps(g, r.v, r.n, 0);
	out = kv_gram_alt(g, alts, na);
done:
	free(r.v);
	return out;
}

/* --- the parser ----------------------------------------------------------------- */

struct rp {
	const char *s;
	size_t n, i;
	struct kv_gram *g;
	const struct kv_rx_opts *o;
	int depth;
	int err;  /* the code of the first error */
};

static int bad(struct rp *p, int code, const char *what)
{
	if (!p->err)
		p->err = code;
	return kv_fail(code, "pattern \"%.*s\": %s at offset %zu", (int)(p->n > 80 ? 80 : p->n), p->s, what, p->i);
}

static const uint32_t SPACES[] = {0x09, 0x0D, 0x20, 0x20, 0xA0, 0xA0, 0x1680, 0x1680, 0x2000, 0x200A,
				  0x2028, 0x2029, 0x202F, 0x202F, 0x205F, 0x205F, 0x3000, 0x3000, 0xFEFF, 0xFEFF};

/* Class escapes \d \w \s (and negations) into r. 1 if c was one. */
static int class_escape(int c, struct crs *r)
{
	struct crs t = {0};
	int neg = 0, rc = 1;
	switch (c) {
	case 'D': neg = 1; /* fall through */
	case 'd': crs_add(&t, '0', '9'); break;
	case 'W': neg = 1; /* fall through */
	case 'w':
		crs_add(&t, '0', '9');
		crs_add(&t, 'A', 'Z');
		crs_add(&t, '_', '_');
		crs_add(&t, 'a', 'z');
		break;
	case 'S': neg = 1; /* fall through */
	case 's':
		for (size_t k = 0; k < sizeof SPACES / sizeof SPACES[0]; k += 2)
			crs_add(&t, SPACES[k], SPACES[k + 1]);
		break;
	default:
		rc = 0;
	}
	if (rc) {
		crs_norm(&t, neg);
		for (int i = 0; i < t.n; i++)
			crs_add(r, t.v[2 * i], t.v[2 * i + 1]);
	}
	free(t.v);
	return rc;
}

/* A single-character escape after '\' (p->i at the char after '\'):
 * *cp, or -1 with an error. */
static int char_escape(struct rp *p, uint32_t *cp, int in_class)
{
	char c = p->s[p->i];
	switch (c) {
	case 'n': *cp = '\n'; p->i++; return 0;
	case 'r': *cp = '\r'; p->i++; return 0;
	case 't': *cp = '\t'; p->i++; return 0;
	case 'f': *cp = '\f'; p->i++; return 0;
	case 'v': *cp = '\v'; p->i++; return 0;
	case '0': *cp = 0; p->i++; return 0;
	case 'x':
		if (p->i + 2 < p->n) {
			int a = kv_hex_digit(p->s[p->i + 1]), b = kv_hex_digit(p->s[p->i + 2]);
			if (a >= 0 && b >= 0) {
				*cp = (uint32_t)(a * 16 + b);
				p->i += 3;
				return 0;
			}
		}
		return bad(p, KV_ERR_INVALID, "\\x needs two hexadecimal digits"), -1;
	case 'u': {
		uint32_t v = 0;
		if (p->i + 1 < p->n && p->s[p->i + 1] == '{') {
			size_t j = p->i + 2;
			int nd = 0;
			while (j < p->n && p->s[j] != '}' && nd < 7) {
				int h = kv_hex_digit(p->s[j]);
				if (h < 0)
					return bad(p, KV_ERR_INVALID, "bad \\u{...} escape"), -1;
				v = v * 16 + (uint32_t)h;
				j++;
				nd++;
			}
			if (j >= p->n || p->s[j] != '}' || !nd || v > 0x10FFFF)
				return bad(p, KV_ERR_INVALID, "bad \\u{...} escape"), -1;
			p->i = j + 1;
			*cp = v;
			return 0;
		}
		for (int k = 1; k <= 4; k++) {
			int h = p->i + (size_t)k < p->n ? kv_hex_digit(p->s[p->i + k]) : -1;
			if (h < 0)
				return bad(p, KV_ERR_INVALID, "\\u needs four hexadecimal digits"), -1;
			v = v * 16 + (uint32_t)h;
		}
		p->i += 5;
		if (v >= 0xD800 && v <= 0xDFFF)
			return bad(p, KV_ERR_UNSUPPORTED, "surrogate escapes are not supported"), -1;
		*cp = v;
		return 0;
	}
	case 'b':
		if (in_class) {
			*cp = '\b';
			p->i++;
			return 0;
		}
		return bad(p, KV_ERR_UNSUPPORTED, "word boundaries (\\b) are not supported"), -1;
	case 'B':
		return bad(p, KV_ERR_UNSUPPORTED, "\\B is not supported"), -1;
	case 'p':
	case 'P':
		return bad(p, KV_ERR_UNSUPPORTED, "Unicode property classes (\\p{...}) are not supported"), -1;
	case 'c':
		return bad(p, KV_ERR_UNSUPPORTED, "control escapes (\\c) are not supported"), -1;
	case 'k':
		return bad(p, KV_ERR_UNSUPPORTED, "named back-references (\\k) are not supported"), -1;
	default:
		if (c >= '1' && c <= '9')
			return bad(p, KV_ERR_UNSUPPORTED, "back-references are not supported"), -1;
		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
			return bad(p, KV_ERR_INVALID, "unknown escape"), -1;
		{
			int32_t v;
			int l = kv_utf8_decode(p->s + p->i, p->n - p->i, &v);
			if (l <= 0)
				return bad(p, KV_ERR_INVALID, "invalid UTF-8"), -1;
			p->i += (size_t)l;
			*cp = (uint32_t)v;
			return 0;
		}
	}
}

static int enc_class(struct rp *p, struct crs *r, int negate)
{
	return kv_rx_class(p->g, r->v, r->n, negate, p->o);
}

/* The class at p->i ('[' ...) into *r, negation applied. 0 or -1. */
static int class_ranges(struct rp *p, struct crs *out)
{
	struct crs r = {0};
	int neg = 0, x = -1;
	p->i++; /* [ */
	if (p->i < p->n && p->s[p->i] == '^') {
		neg = 1;
		p->i++;
	}
	int first = 1;
	for (;;) {
		if (p->i >= p->n) {
			bad(p, KV_ERR_INVALID, "unclosed character class");
			goto out;
		}
		char c = p->s[p->i];
		if (c == ']' && !first)
			break;
		if (c == ']' && first) { /* JS: [] matches nothing, [^] anything */
			break;
		}
		first = 0;
		uint32_t lo;
		if (c == '\\') {
			p->i++;
			if (p->i >= p->n) {
				bad(p, KV_ERR_INVALID, "pattern ends after '\\'");
				goto out;
			}
			if (class_escape(p->s[p->i], &r)) {
				p->i++;
				continue;
			}
			if (char_escape(p, &lo, 1))
				goto out;
		} else {
			int32_t v;
			int l = kv_utf8_decode(p->s + p->i, p->n - p->i, &v);
			if (l <= 0) {
				bad(p, KV_ERR_INVALID, "invalid UTF-8");
				goto out;
			}
			p->i += (size_t)l;
			lo = (uint32_t)v;
		}
		uint32_t hi = lo;
		if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
			p->i++;
			if (p->s[p->i] == '\\') {
				p->i++;
				if (p->i >= p->n) {
					bad(p, KV_ERR_INVALID, "pattern ends after '\\'");
					goto out;
				}
				struct crs dummy = {0};
				if (class_escape(p->s[p->i], &dummy)) {
					free(dummy.v);
					bad(p, KV_ERR_UNSUPPORTED, "a class escape as a range end");
					goto out;
				}
				if (char_escape(p, &hi, 1))
					goto out;
			} else {
				int32_t v;
				int l = kv_utf8_decode(p->s + p->i, p->n - p->i, &v);
				if (l <= 0) {
					bad(p, KV_ERR_INVALID, "invalid UTF-8");
					goto out;
				}
				p->i += (size_t)l;
				hi = (uint32_t)v;
			}
			if (hi < lo) {
				bad(p, KV_ERR_INVALID, "character range out of order");
				goto out;
			}
		}
		if (crs_add(&r, lo, hi))
			goto out;
	}
	p->i++; /* ] */
	if (crs_norm(&r, neg))
		goto out;
	*out = r;
	r.v = NULL;
	x = 0;
out:
	free(r.v);
	return x;
}

static int parse_class(struct rp *p)
{
	struct crs r = {0};
	if (class_ranges(p, &r))
		return -1;
	int x = enc_class(p, &r, 0);
	free(r.v);
	return x;
}

static int any_char(struct rp *p, int dot)
{
	/* '.' leaves out the line terminators; the unanchored padding is any
	 * character at all */
	static const uint32_t lt[] = {'\n', '\n', '\r', '\r', 0x2028, 0x2029};
	if (dot)
		return kv_rx_class(p->g, lt, 3, 1, p->o);
	static const uint32_t all[] = {0, 0x10FFFF};
	return kv_rx_class(p->g, all, 1, 0, p->o);
}

static int parse_alt(struct rp *p, int top);

/* {n}, {n,}, {n,m} at p->i: 1 and bounds if well-formed, else 0 (a
 * literal '{'). */
static int quant_braces(struct rp *p, int *mn, int *mx)
{
	size_t j = p->i + 1;
	long a = 0, b;
	int nd = 0;
	while (j < p->n && p->s[j] >= '0' && p->s[j] <= '9' && nd < 9) {
		a = a * 10 + (p->s[j] - '0');
		j++;
		nd++;
	}
	if (!nd)
		return 0;
	if (j < p->n && p->s[j] == '}') {
		b = a;
	} else if (j < p->n && p->s[j] == ',') {
		j++;
		if (j < p->n && p->s[j] == '}') {
			b = -1;
		} else {
			int nd2 = 0;
			b = 0;
			while (j < p->n && p->s[j] >= '0' && p->s[j] <= '9' && nd2 < 9) {
				b = b * 10 + (p->s[j] - '0');
				j++;
				nd2++;
			}
			if (!nd2 || j >= p->n || p->s[j] != '}')
				return 0;
		}
	} else {
		return 0;
	}
	p->i = j + 1;
	*mn = (int)(a > KV_GRAM_MAX_REP ? KV_GRAM_MAX_REP + 1 : a);
	*mx = b < 0 ? -1 : (int)(b > KV_GRAM_MAX_REP ? KV_GRAM_MAX_REP + 1 : b);
	return 1;
}

static int parse_seq(struct rp *p, int top, int *anch_start, int *anch_end)
{
	int *items = NULL, n = 0, c = 0, out = -1;
	*anch_start = *anch_end = 0;
	for (;;) {
		if (p->i >= p->n)
			break;
		char ch = p->s[p->i];
		if (ch == '|' || ch == ')')
			break;
		int x;
		if (ch == '^') {
			if (!top || n || *anch_start) {
				bad(p, KV_ERR_UNSUPPORTED, "'^' inside the pattern (only at the start) is not supported");
				goto out;
			}
			*anch_start = 1;
			p->i++;
			continue;
		}
		if (ch == '$') {
			p->i++;
			if (!top || (p->i < p->n && p->s[p->i] != '|')) {
				p->i--;
				bad(p, KV_ERR_UNSUPPORTED, "'$' inside the pattern (only at the end) is not supported");
				goto out;
			}
			*anch_end = 1;
			break;
		}
		if (ch == '(') {
			if (++p->depth > 100) {
				bad(p, KV_ERR_INVALID, "groups nest too deeply");
				goto out;
			}
			p->i++;
			if (p->i + 1 < p->n && p->s[p->i] == '?') {
				char k = p->s[p->i + 1];
				if (k == ':') {
					p->i += 2;
				} else if (k == '<' && p->i + 2 < p->n && p->s[p->i + 2] != '=' && p->s[p->i + 2] != '!') {
					const char *e = memchr(p->s + p->i, '>', p->n - p->i);
					if (!e) {
						bad(p, KV_ERR_INVALID, "unclosed group name");
						goto out;
					}
					p->i = (size_t)(e - p->s) + 1;
				} else {
					bad(p, KV_ERR_UNSUPPORTED, "lookahead and lookbehind are not supported");
					goto out;
				}
			}
			x = parse_alt(p, 0);
			if (x < 0)
				goto out;
			if (p->i >= p->n || p->s[p->i] != ')') {
				bad(p, KV_ERR_INVALID, "unclosed group");
				goto out;
			}
			p->i++;
			p->depth--;
		} else if (ch == '[') {
			x = parse_class(p);
		} else if (ch == '.') {
			p->i++;
			x = any_char(p, 1);
		} else if (ch == '\\') {
			p->i++;
			if (p->i >= p->n) {
				bad(p, KV_ERR_INVALID, "pattern ends after '\\'");
				goto out;
			}
			struct crs r = {0};
			if (class_escape(p->s[p->i], &r)) {
				p->i++;
				x = enc_class(p, &r, 0);
			} else {
				uint32_t cp;
				if (char_escape(p, &cp, 0)) {
					free(r.v);
					goto out;
				}
				uint32_t pr[2] = {cp, cp};
				x = kv_rx_class(p->g, pr, 1, 0, p->o);
			}
			free(r.v);
		} else if (ch == '*' || ch == '+' || ch == '?') {
			bad(p, KV_ERR_INVALID, "nothing to repeat");
			goto out;
		} else {
			int32_t v;
			int l = kv_utf8_decode(p->s + p->i, p->n - p->i, &v);
			if (l <= 0) {
				bad(p, KV_ERR_INVALID, "invalid UTF-8");
				goto out;
			}
			p->i += (size_t)l;
			uint32_t pr[2] = {(uint32_t)v, (uint32_t)v};
			x = kv_rx_class(p->g, pr, 1, 0, p->o);
		}
		if (x < 0)
			goto out;
		/* quantifiers */
		for (;;) {
			if (p->i >= p->n)
				break;
			char q = p->s[p->i];
			int mn, mx;
			if (q == '*' || q == '+' || q == '?') {
				p->i++;
				mn = q == '+';
				mx = q == '?' ? 1 : -1;
			} else if (q == '{' && quant_braces(p, &mn, &mx)) {
				if (mn > KV_GRAM_MAX_REP || mx > KV_GRAM_MAX_REP) {
					bad(p, KV_ERR_UNSUPPORTED, "a repetition count over 100000");
					goto out;
				}
				if (mx >= 0 && mx < mn) {
					bad(p, KV_ERR_INVALID, "numbers out of order in {} quantifier");
					goto out;
				}
			} else {
				break;
			}
			if (p->i < p->n && p->s[p->i] == '?')
				p->i++; /* lazy: the same strings match */
			x = kv_gram_rep(p->g, x, mn, mx);
			if (x < 0)
				goto out;
			break; /* JS forbids a quantifier on a quantifier */
		}
		if (p->i < p->n && (p->s[p->i] == '*' || p->s[p->i] == '+')) {
			bad(p, KV_ERR_INVALID, "nothing to repeat");
			goto out;
		}
		if (kv_gram_ids_push(&items, &n, &c, x, "pattern"))
			goto out;
	}
	out = kv_gram_seq(p->g, items, n);
out:
	free(items);
	return out;
}

static int parse_alt(struct rp *p, int top)
{
	int *alts = NULL, n = 0, c = 0, out = -1;
	for (;;) {
		int as, ae;
		int x = parse_seq(p, top, &as, &ae);
		if (x < 0)
			goto out;
		if (top) {
			int pad = -1;
			if (!as || !ae)
				pad = kv_gram_star(p->g, any_char(p, 0));
			int parts[3], np = 0;
			if (!as)
				parts[np++] = pad;
			parts[np++] = x;
			if (!ae)
				parts[np++] = pad;
			x = kv_gram_seq(p->g, parts, np);
			if (x < 0)
				goto out;
		}
		if (kv_gram_ids_push(&alts, &n, &c, x, "pattern"))
			goto out;
		if (p->i < p->n && p->s[p->i] == '|') {
			p->i++;
			continue;
		}
		break;
	}
	out = kv_gram_alt(p->g, alts, n);
out:
	free(alts);
	return out;
}

int kv_rx_compile(struct kv_gram *g, const char *pat, size_t n, const struct kv_rx_opts *o, int *expr)
{
	struct rp p = {.s = pat, .n = n, .g = g, .o = o};
	*expr = -1;
	if (!kv_utf8_valid(pat, n))
		return kv_fail(KV_ERR_INVALID, "pattern is not valid UTF-8");
	int x = parse_alt(&p, 1);
	if (x < 0) {
		int rc = p.err ? p.err : kv_gram_error(g);
		return rc ? rc : (int)KV_ERR_INVALID;
	}
	if (p.i < p.n)
		return bad(&p, KV_ERR_INVALID, "unmatched ')'");
	*expr = x;
	return KV_OK;
}

int kv_rx_simple(const char *pat, size_t n, uint32_t **pairs, int *n_pairs, int *min, int *max)
{
	struct rp p = {.s = pat, .n = n};
	struct crs r = {0};
	*pairs = NULL;
	*n_pairs = 0;
	if (n < 3 || pat[0] != '^' || pat[n - 1] != '$' || pat[n - 2] == '\\')
		return 0;
	p.n = n - 1; /* without the '$' */
	p.i = 1;
	char c = pat[1];
	if (c == '[') {
		if (class_ranges(&p, &r))
			goto no;
	} else if (c == '.') {
		static const uint32_t lt[] = {'\n', '\n', '\r', '\r', 0x2028, 0x2029};
		for (int k = 0; k < 3; k++)
			crs_add(&r, lt[2 * k], lt[2 * k + 1]);
		crs_norm(&r, 1);
		p.i++;
	} else if (c == '\\' && p.i + 1 < p.n && class_escape(pat[2], &r)) {
		crs_norm(&r, 0);
		p.i += 2;
	} else {
		goto no;
	}
	int mn = 1, mx = 1;
	if (p.i < p.n) {
		char q = pat[p.i];
		if (q == '*' || q == '+' || q == '?') {
			mn = q == '+';
			mx = q == '?' ? 1 : -1;
			p.i++;
		} else if (q == '{' && quant_braces(&p, &mn, &mx)) {
			if (mx >= 0 && mx < mn)
				goto no;
		} else {
			goto no;
		}
	}
	if (p.i != p.n)
		goto no;
	*pairs = r.v;
	*n_pairs = r.n;
	*min = mn;
	*max = mx;
	return 1;
no:
	free(r.v);
	kv_errclear();
	return 0;
}
