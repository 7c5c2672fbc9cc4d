/*
 * gbnf.c - GBNF text to the grammar IR (gbnf.h has the syntax).
 *
 * A recursive-descent parser over the bytes, one function per production.
 * Positions are byte offsets; messages turn them into line and column.
 * The first use of every rule is remembered so that a rule that is never
 * defined is reported where it is used.
 */
#include "text/gbnf.h"
#include "base/err.h"
#include "base/utf8.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ps {
	const char *s;
	size_t n, i;
	struct kv_gram *g;
	int depth;
	size_t *first_use; /* [rule] byte offset of the first reference, or SIZE_MAX */
	int n_use;
};

static void where(const struct ps *p, size_t at, int *line, int *col)
{
	int l = 1, c = 1;
	for (size_t i = 0; i < at && i < p->n; i++) {
		if (p->s[i] == '\n') {
			l++;
			c = 1;
		} else if (((unsigned char)p->s[i] & 0xC0) != 0x80) {
			c++;
		}
	}
	*line = l;
	*col = c;
}

static int err_at(const struct ps *p, size_t at, const char *what)
{
	int l, c;
	where(p, at, &l, &c);
	return kv_fail(KV_ERR_INVALID, "grammar line %d column %d: %s", l, c, what);
}

static int err_atf(const struct ps *p, size_t at, const char *fmt, const char *arg)
{
	int l, c;
	where(p, at, &l, &c);
	char msg[512];
	snprintf(msg, sizeof msg, fmt, arg);
	return kv_fail(KV_ERR_INVALID, "grammar line %d column %d: %s", l, c, msg);
}

static int is_word(int c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skip blanks and comments; newlines too when nl_ok. */
static void space(struct ps *p, int nl_ok)
{
	while (p->i < p->n) {
		char c = p->s[p->i];
		if (c == ' ' || c == '\t' || (nl_ok && (c == '\n' || c == '\r'))) {
			p->i++;
		} else if (c == '#') {
			while (p->i < p->n && p->s[p->i] != '\n' && p->s[p->i] != '\r')
				p->i++;
		} else {
			break;
		}
	}
}

/* One character of a literal or class (escapes decoded) into *cp. */
static int parse_char(struct ps *p, uint32_t *cp)
{
	size_t at = p->i;
	if (p->i >= p->n)
		return err_at(p, at, "unexpected end of grammar");
	unsigned char c = (unsigned char)p->s[p->i];
	if (c == '\\') {
		if (p->i + 1 >= p->n)
			return err_at(p, at, "unexpected end of grammar after '\\'");
		char e = p->s[p->i + 1];
		int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
		if (digits) {
			uint32_t v = 0;
			for (int k = 0; k < digits; k++) {
				int h = p->i + 2 + (size_t)k < p->n ? kv_hex_digit(p->s[p->i + 2 + k]) : -1;
				if (h < 0)
					return err_atf(p, at, "escape \\%s needs hexadecimal digits", e == 'x' ? "x" : e == 'u' ? "u" : "U");
				v = v * 16 + (uint32_t)h;
			}
			if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
				return err_at(p, at, "escape is not a Unicode scalar value (past U+10FFFF or a surrogate)");
			p->i += 2 + (size_t)digits;
			*cp = v;
			return 0;
		}
		switch (e) {
		case 'n': *cp = '\n'; break;
		case 'r': *cp = '\r'; break;
		case 't': *cp = '\t'; break;
		case '\\': case '"': case '[': case ']': case '-': case '\'': case '^': case '/':
			*cp = (uint32_t)e;
			break;
		default: {
			char tmp[2] = {e, 0};
			return err_atf(p, at, "unknown escape \\%s", tmp);
		}
		}
		p->i += 2;
		return 0;
	}
	int32_t v;
	int len = kv_utf8_decode(p->s + p->i, p->n - p->i, &v);
	if (len <= 0)
		return err_at(p, at, "invalid UTF-8 in the grammar");
	p->i += (size_t)len;
	*cp = (uint32_t)v;
	return 0;
}

static int parse_alts(struct ps *p, int nested);

/* A literal "...": a SEQ of the code points' bytes. */
static int parse_literal(struct ps *p)
{
	size_t at = p->i;
	struct kv_buf b = KV_BUF_INIT;
	p->i++;
	for (;;) {
		if (p->i >= p->n || p->s[p->i] == '\n' || p->s[p->i] == '\r') {
			kv_buf_free(&b);
			return err_at(p, at, "unclosed string literal");
		}
		if (p->s[p->i] == '"')
			break;
		uint32_t cp;
		if (parse_char(p, &cp)) {
			kv_buf_free(&b);
			return -2;
		}
		uint8_t u[4];
		int n = kv_utf8_encode(cp, u);
		kv_buf_add(&b, u, (size_t)n);
	}
	p->i++;
	if (b.oom) {
		kv_buf_free(&b);
		return kv_fail(KV_ERR_NOMEM, "grammar: out of memory"), -2;
	}
	int x = kv_gram_lit(p->g, b.p, b.len);
	kv_buf_free(&b);
	return x;
}

/* A class [...] or [^...]. */
static int parse_class(struct ps *p)
{
	size_t at = p->i;
	int neg = 0;
	uint32_t *pairs = NULL;
	int n = 0, c = 0, x = -2;
	p->i++;
	if (p->i < p->n && p->s[p->i] == '^') {
		neg = 1;
		p->i++;
	}
	for (;;) {
		if (p->i >= p->n || p->s[p->i] == '\n' || p->s[p->i] == '\r') {
			err_at(p, at, "unclosed character class");
			goto out;
		}
		if (p->s[p->i] == ']')
			break;
		uint32_t lo, hi;
		if (parse_char(p, &lo))
			goto out;
		hi = lo;
		if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
			p->i++;
			size_t rat = p->i;
			if (parse_char(p, &hi))
				goto out;
			if (hi < lo) {
				err_at(p, rat, "character range is backwards (end before start)");
				goto out;
			}
		}
		if (n == c) {
			c = c ? 2 * c : 16;
			uint32_t *q = realloc(pairs, (size_t)c * 2 * sizeof *q);
			if (!q) {
				kv_fail(KV_ERR_NOMEM, "grammar: out of memory");
				goto out;
			}
			pairs = q;
		}
		pairs[2 * n] = lo;
		pairs[2 * n + 1] = hi;
		n++;
	}
	p->i++;
	x = kv_gram_cps(p->g, pairs, n, neg);
	if (x < 0)
		x = -2;
out:
	free(pairs);
	return x;
}

static int parse_int(struct ps *p, int *v)
{
	size_t at = p->i;
	long long x = 0;
	if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
		return err_at(p, at, "expected a number in the repetition");
	while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
		x = x * 10 + (p->s[p->i] - '0');
		if (x > KV_GRAM_MAX_REP) {
			int l, c;
			where(p, at, &l, &c);
			return kv_fail(KV_ERR_INVALID, "grammar line %d column %d: repetition bound is larger than %d", l, c,
				       KV_GRAM_MAX_REP);
		}
		p->i++;
	}
	*v = (int)x;
	return 0;
}

/* Postfix operators after an atom. */
static int parse_postfix(struct ps *p, int x)
{
	for (;;) {
		if (p->i >= p->n)
			return x;
		char c = p->s[p->i];
		if (c == '*' || c == '+' || c == '?') {
			p->i++;
			x = kv_gram_rep(p->g, x, c == '+', c == '?' ? 1 : -1);
		} else if (c == '{') {
			size_t at = p->i;
			int mn = 0, mx;
			p->i++;
			space(p, 0);
			if (p->i < p->n && p->s[p->i] == ',') {
				mn = 0;
			} else if (parse_int(p, &mn)) {
				return -2;
			}
			space(p, 0);
			if (p->i < p->n && p->s[p->i] == ',') {
				p->i++;
				space(p, 0);
				if (p->i < p->n && p->s[p->i] == '}') {
					mx = -1;
				} else if (parse_int(p, &mx)) {
					return -2;
				}
			} else {
				mx = mn;
			}
			space(p, 0);
			if (p->i >= p->n || p->s[p->i] != '}')
				return err_at(p, at, "unclosed repetition '{'"), -2;
			p->i++;
			if (mx >= 0 && mx < mn)
				return err_at(p, at, "repetition {m,n} has n < m"), -2;
			x = kv_gram_rep(p->g, x, mn, mx);
		} else {
			return x;
		}
		if (x < 0)
			return -2;
		space(p, 0);
	}
}

static int note_use(struct ps *p, int r, size_t at)
{
	if (r >= p->n_use) {
		int c = p->n_use ? p->n_use : 64;
		while (c <= r)
			c *= 2;
		size_t *u = realloc(p->first_use, (size_t)c * sizeof *u);
		if (!u)
			return kv_fail(KV_ERR_NOMEM, "grammar: out of memory");
		for (int i = p->n_use; i < c; i++)
			u[i] = SIZE_MAX;
		p->first_use = u;
		p->n_use = c;
	}
	if (p->first_use[r] == SIZE_MAX)
		p->first_use[r] = at;
	return 0;
}

/* A sequence: items until '|', ')', end of rule. -2 on error. */
static int parse_seq(struct ps *p, int nested)
{
	int *items = NULL, n = 0, c = 0, out = -2;
	for (;;) {
		space(p, nested);
		if (p->i >= p->n)
			break;
		char ch = p->s[p->i];
		size_t at = p->i;
		int x;
		if (ch == '|' || ch == ')' || ch == '\n' || ch == '\r')
			break;
		if (ch == '"') {
			x = parse_literal(p);
		} else if (ch == '[') {
			x = parse_class(p);
		} else if (ch == '.') {
			p->i++;
			x = kv_gram_any_cp(p->g);
		} else if (ch == '(') {
			if (++p->depth > KV_GBNF_MAX_NEST) {
				err_at(p, at, "groups nest too deeply");
				goto out;
			}
			p->i++;
			x = parse_alts(p, 1);
			if (x < 0)
				goto out;
			space(p, 1);
			if (p->i >= p->n || p->s[p->i] != ')') {
				err_at(p, at, "unclosed group '('");
				goto out;
			}
			p->i++;
			p->depth--;
		} else if (ch == '<') {
			err_at(p, at, "token references (<...>) are not supported: write the token's text as a literal");
			goto out;
		} else if (is_word((unsigned char)ch)) {
			size_t s = p->i;
			while (p->i < p->n && is_word((unsigned char)p->s[p->i]))
				p->i++;
			size_t e = p->i;
			space(p, 0);
			if (p->i + 3 <= p->n && !memcmp(p->s + p->i, "::=", 3)) {
				/* the next rule starts: the caller forgot a newline */
				err_at(p, s, "expected a newline before the next rule");
				goto out;
			}
			int r = kv_gram_rule(p->g, p->s + s, e - s);
			if (r < 0 || note_use(p, r, s))
				goto out;
			x = kv_gram_ref(p->g, r);
		} else {
			char tmp[8] = {0};
			int l = kv_utf8_seq(p->s + p->i, p->n - p->i);
			memcpy(tmp, p->s + p->i, l > 0 ? (size_t)l : 1);
			err_atf(p, at, "unexpected character '%s'", tmp);
			goto out;
		}
		if (x < 0)
			goto out;
		space(p, nested);
		x = parse_postfix(p, x);
		if (x < 0)
			goto out;
		if (kv_gram_ids_push(&items, &n, &c, x, "grammar"))
			goto out;
	}
	out = kv_gram_seq(p->g, items, n);
	if (out < 0)
		out = -2;
out:
	free(items);
	return out;
}

static int parse_alts(struct ps *p, int nested)
{
	int *alts = NULL, n = 0, c = 0, out = -2;
	for (;;) {
		int x = parse_seq(p, nested);
		if (x < 0)
			goto out;
		if (kv_gram_ids_push(&alts, &n, &c, x, "grammar"))
			goto out;
		space(p, nested);
		if (p->i < p->n && p->s[p->i] == '|') {
			p->i++;
			space(p, 1);
			continue;
		}
		break;
	}
	out = kv_gram_alt(p->g, alts, n);
	if (out < 0)
		out = -2;
out:
	free(alts);
	return out;
}

int kv_gbnf_parse(const char *text, size_t len, struct kv_gram **out)
{
	struct ps p = {.s = text, .n = len};
	int rc;
	*out = NULL;
	if ((rc = kv_gram_create(&p.g)))
		return rc;
	for (;;) {
		space(&p, 1);
		if (p.i >= p.n)
			break;
		size_t at = p.i;
		if (!is_word((unsigned char)p.s[p.i])) {
			rc = err_at(&p, at, "expected a rule name");
			goto fail;
		}
		while (p.i < p.n && is_word((unsigned char)p.s[p.i]))
			p.i++;
		size_t ne = p.i;
		space(&p, 0);
		if (p.i + 3 > p.n || memcmp(p.s + p.i, "::=", 3)) {
			rc = err_at(&p, p.i, "expected '::=' after the rule name");
			goto fail;
		}
		p.i += 3;
		space(&p, 1);
		int r = kv_gram_rule(p.g, p.s + at, ne - at);
		if (r < 0) {
			rc = kv_gram_error(p.g);
			goto fail;
		}
		if (kv_gram_rule_expr(p.g, r) >= 0) {
			rc = err_atf(&p, at, "rule '%s' is defined twice", kv_gram_rule_name(p.g, r));
			goto fail;
		}
		p.depth = 0;
		int x = parse_alts(&p, 0);
		if (x < 0) {
			int ge = kv_gram_error(p.g);
			rc = ge ? ge : KV_ERR_INVALID;
			goto fail;
		}
		if (p.i < p.n && p.s[p.i] != '\n' && p.s[p.i] != '\r') {
			rc = err_at(&p, p.i, p.s[p.i] == ')' ? "unmatched ')'" : "expected a newline or the end after the rule");
			goto fail;
		}
		int l, c;
		where(&p, at, &l, &c);
		kv_gram_define(p.g, r, x);
		kv_gram_rule_pos(p.g, r, l, c);
	}
	if ((rc = kv_gram_error(p.g)))
		goto fail;
	for (int r = 0; r < kv_gram_n_rules(p.g); r++)
		if (kv_gram_rule_expr(p.g, r) < 0) {
			size_t at = r < p.n_use && p.first_use[r] != SIZE_MAX ? p.first_use[r] : 0;
			rc = err_atf(&p, at, "rule '%s' is used but never defined", kv_gram_rule_name(p.g, r));
			goto fail;
		}
	int root = kv_gram_rule(p.g, "root", 4);
	if (root < 0 || kv_gram_rule_expr(p.g, root) < 0) {
		rc = kv_fail(KV_ERR_INVALID, "grammar: there is no 'root' rule");
		goto fail;
	}
	kv_gram_set_root(p.g, root);
	free(p.first_use);
	*out = p.g;
	return KV_OK;
fail:
	if (!rc)
		rc = KV_ERR_INVALID;
	free(p.first_use);
	kv_gram_free(p.g);
	return rc;
}
