/*
 * jschema.c - JSON Schema -> grammar IR (jschema.h has the policy).
 *
 * sch() compiles one schema object to an expression: $ref targets become
 * rules (memoised by the target's json_t, so recursion is a rule
 * reference), anyOf / oneOf alternatives, allOf a merged schema, then
 * per type: const / enum literals, objects (the properties in order, each
 * optional one may be skipped: rules N_i "nothing written yet from i",
 * S_i "something written, from i" and V_i "the value of i and the rest",
 * which the automaton compiler shares instead of copying), arrays, strings
 * (free, bounded length, pattern or format through jsregex.c), numbers
 * (digit-range expressions for bounds) and free-form values (one
 * recursive "value" rule).
 *
 * Strings must not contain the forbidden words (tool-call closing tags)
 * raw: a free string runs an Aho-Corasick automaton over the words as
 * right-linear rules (a loop once compiled); a bounded, pattern or format
 * string writes '<' (every word starts with it) as \u003c instead.
 */
#include "text/jschema.h"
#include "base/buf.h"
#include "base/err.h"
#include "base/json.h"
#include "base/map.h"
#include "text/jsregex.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64, T_ALL = 127 };

#define MAX_DEPTH 200
#define MAX_WORDS 16

struct js {
	struct kv_gram *g;
	const json_t *root;
	int strict;
	int raw_top;               /* the top value's strings are raw text */
	const char *words[MAX_WORDS];
	int n_words;
	struct kv_rx_opts rx;      /* JSON strings */
	struct kv_rx_opts rxraw;   /* raw strings */
	struct kv_map *refs;       /* json_t pointer -> rule */
	int r_value;               /* free-form value, -1 until needed */
	int r_string;              /* a free JSON string (quotes included) */
	int r_raw;                 /* free raw text (no terminator) */
	int depth;
	char path[512];
	size_t plen;
	json_t *tmp;               /* merged schemas kept alive until the end */
	int err;                   /* the code of the first error */
};

/* --- messages and paths --------------------------------------------------------- */

static const char *where(struct js *J)
{
	return J->plen ? J->path : "#";
}

static size_t path_push(struct js *J, const char *a, const char *b)
{
	size_t old = J->plen;
	if (!J->plen) {
		J->path[0] = '#';
		J->plen = 1;
	}
	int n = snprintf(J->path + J->plen, sizeof J->path - J->plen, "/%s%s%s", a, b ? "/" : "", b ? b : "");
	if (n > 0 && J->plen + (size_t)n < sizeof J->path)
		J->plen += (size_t)n;
	else
		J->path[J->plen] = 0;
	return old;
}

static void path_pop(struct js *J, size_t old)
{
	J->plen = old;
	J->path[old] = 0;
}

static int unsupported(struct js *J, const char *kw, const char *why)
{
	if (!J->err)
		J->err = KV_ERR_UNSUPPORTED;
	return kv_fail(KV_ERR_UNSUPPORTED, "unsupported JSON Schema keyword '%s' at %s%s%s", kw, where(J),
		       why ? ": " : "", why ? why : "");
}

static int invalid(struct js *J, const char *what)
{
	if (!J->err)
		J->err = KV_ERR_INVALID;
	return kv_fail(KV_ERR_INVALID, "JSON Schema at %s: %s", where(J), what);
}

/* --- keyword classes ----------------------------------------------------------- */

static const char *const SUPPORTED[] = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "anyOf", "oneOf", "allOf",
    "items", "prefixItems", "additionalItems", "minItems", "maxItems", "$ref", "$defs", "definitions",
    "nullable", "format", "pattern", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "uniqueItems", "minProperties", "maxProperties", NULL};

static const char *const UNSUPPORTED[] = {
    "not", "if", "then", "else", "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas",
    "dependencies", "unevaluatedProperties", "unevaluatedItems", "contains", "minContains", "maxContains",
    "$dynamicRef", "$recursiveRef", "contentSchema", NULL};

static int in_list(const char *const *l, const char *k)
{
	for (; *l; l++)
		if (!strcmp(*l, k))
			return 1;
	return 0;
}

/* Strict: every validation keyword we do not support is an error. */
static int check_keywords(struct js *J, const json_t *s)
{
	const char *k;
	json_t *v;
	if (!J->strict)
		return 0;
	json_object_foreach((json_t *)s, k, v) {
		if (in_list(UNSUPPORTED, k))
			return unsupported(J, k, NULL);
	}
	return 0;
}

/* --- small builders ------------------------------------------------------------ */

static int lit(struct js *J, const char *s)
{
	return kv_gram_lits(J->g, s);
}

static int comma(struct js *J)
{
	return kv_gram_seq2(J->g, lit(J, ","), kv_gram_opt(J->g, lit(J, " ")));
}

static int colon(struct js *J)
{
	return kv_gram_seq2(J->g, lit(J, ":"), kv_gram_opt(J->g, lit(J, " ")));
}

/* One JSON string character (raw or escaped), '<' escaped when words
 * are forbidden. */
static int json_char(struct js *J)
{
	static const uint32_t all[2] = {0, 0x10FFFF};
	return kv_rx_class(J->g, all, 1, 0, &J->rx);
}

/* The other escapes a free string may use: \/ and \u for any
 * non-surrogate (the class above writes one escape per character; a
 * model may write another). */
static int extra_escapes(struct js *J)
{
	struct kv_gram *g = J->g;
	int hex = kv_gram_alt(g, (int[]){kv_gram_bytes(g, '0', '9'), kv_gram_bytes(g, 'a', 'f'), kv_gram_bytes(g, 'A', 'F')},
			      3);
	/* \uXXXX without D800..DFFF: first digit not d/D, or d/D then 0-7 */
	int nd = kv_gram_alt(g, (int[]){kv_gram_bytes(g, '0', '9'), kv_gram_bytes(g, 'a', 'c'), kv_gram_bytes(g, 'e', 'f'),
					kv_gram_bytes(g, 'A', 'C'), kv_gram_bytes(g, 'E', 'F')},
			     5);
	int u1 = kv_gram_seq(g, (int[]){nd, hex, hex, hex}, 4);
	int u2 = kv_gram_seq(g, (int[]){kv_gram_alt2(g, lit(J, "d"), lit(J, "D")), kv_gram_bytes(g, '0', '7'), hex, hex}, 4);
	int esc = kv_gram_alt(g, (int[]){lit(J, "\"") , lit(J, "\\"), lit(J, "/"), lit(J, "b"), lit(J, "f"), lit(J, "n"),
					 lit(J, "r"), lit(J, "t"), kv_gram_seq2(g, lit(J, "u"), kv_gram_alt2(g, u1, u2))},
			      9);
	return kv_gram_seq2(g, lit(J, "\\"), esc);
}

/*
 * Free text that contains none of the words, as right-linear rules over
 * an Aho-Corasick automaton of the words. json: JSON string content
 * followed by the closing quote (escapes reset the automaton: no word
 * contains '\'); raw: raw text, ending anywhere (the caller writes the
 * terminator, which must not extend a word: it starts with a newline).
 */
static int free_text(struct js *J, int json)
{
	struct kv_gram *g = J->g;
	/* the trie of the words, over ASCII */
	int go[128][128], fail[128], term[128], n = 1;
	memset(go, -1, sizeof go);
	memset(term, 0, sizeof term);
	for (int w = 0; w < J->n_words; w++) {
		int s = 0;
		for (const char *c = J->words[w]; *c; c++) {
			int b = (unsigned char)*c & 127;
			if (go[s][b] < 0) {
				if (n >= 127)
					return kv_fail(KV_ERR_INVALID, "tool-call words are too long"), -1;
				go[s][b] = n++;
			}
			s = go[s][b];
		}
		term[s] = 1;
	}
	/* failure links, breadth first; complete go[][] into the automaton */
	int q[128], qh = 0, qt = 0;
	fail[0] = 0;
	for (int b = 0; b < 128; b++) {
		if (go[0][b] < 0) {
			go[0][b] = 0;
		} else {
			fail[go[0][b]] = 0;
			q[qt++] = go[0][b];
		}
	}
	while (qh < qt) {
		int s = q[qh++];
		term[s] |= term[fail[s]];
		for (int b = 0; b < 128; b++) {
			int t = go[s][b];
			if (t < 0) {
				go[s][b] = go[fail[s]][b];
			} else {
				fail[t] = go[fail[s]][b];
				q[qt++] = t;
			}
		}
	}
	int rule[128];
	for (int s = 0; s < n; s++)
		rule[s] = term[s] ? -1 : kv_gram_rule_new(g, json ? "string-chars" : "raw-chars");
	/* characters outside ASCII (and, for JSON, escapes) reset the automaton */
	static const uint32_t hi[2] = {0x80, 0x10FFFF};
	for (int s = 0; s < n; s++) {
		if (term[s])
			continue;
		int alts[140], na = 0;
		alts[na++] = json ? lit(J, "\"") : kv_gram_empty(g);
		alts[na++] = kv_gram_seq2(g, kv_gram_cps(g, hi, 1, 0), kv_gram_ref(g, rule[0]));
		if (json)
			alts[na++] = kv_gram_seq2(g, extra_escapes(J), kv_gram_ref(g, rule[0]));
		/* ASCII, grouped by the next state */
		for (int t = 0; t < n; t++) {
			if (term[t])
				continue;
			uint32_t pairs[256];
			int np = 0;
			for (int b = 0; b < 128; b++) {
				if (go[s][b] != t)
					continue;
				if (json && (b < 0x20 || b == '"' || b == '\\'))
					continue;
				if (np && pairs[2 * (np - 1) + 1] + 1 == (uint32_t)b) {
					pairs[2 * (np - 1) + 1] = (uint32_t)b;
				} else {
					pairs[2 * np] = pairs[2 * np + 1] = (uint32_t)b;
					np++;
				}
			}
			if (np)
				alts[na++] = kv_gram_seq2(g, kv_gram_cps(g, pairs, np, 0), kv_gram_ref(g, rule[t]));
		}
		if (kv_gram_define(g, rule[s], kv_gram_alt(g, alts, na)))
			return -1;
	}
	return kv_gram_ref(g, rule[0]);
}

/* A free JSON string, quotes included (a shared rule). */
static int free_string(struct js *J)
{
	struct kv_gram *g = J->g;
	if (J->r_string >= 0)
		return kv_gram_ref(g, J->r_string);
	int r = kv_gram_rule_new(g, "string");
	J->r_string = r;
	int body;
	if (J->n_words)
		body = free_text(J, 1);
	else
		body = kv_gram_seq2(g, kv_gram_star(g, kv_gram_alt2(g, json_char(J), extra_escapes(J))), lit(J, "\""));
	if (kv_gram_define(g, r, kv_gram_seq2(g, lit(J, "\""), body)))
		return -1;
	return kv_gram_ref(g, r);
}

/* Free raw text (XML parameter values). */
static int free_raw(struct js *J)
{
	struct kv_gram *g = J->g;
	if (J->r_raw >= 0)
		return kv_gram_ref(g, J->r_raw);
	int r = kv_gram_rule_new(g, "raw-text");
	J->r_raw = r;
	int body;
	if (J->n_words) {
		body = free_text(J, 0);
	} else {
		static const uint32_t all[2] = {0, 0x10FFFF};
		body = kv_gram_star(g, kv_gram_cps(g, all, 1, 0));
	}
	if (kv_gram_define(g, r, body))
		return -1;
	return kv_gram_ref(g, r);
}

/* The JSON text of a value, json.dumps style (", " and ": "). */
static int dump_value(struct js *J, const json_t *v, struct kv_buf *b, int depth)
{
	if (depth > 64)
		return invalid(J, "a const or enum value nests too deeply");
	const char *lit_txt;
	size_t lit_n;
	if (kv_json_number_literal(v, &lit_txt, &lit_n)) {
		kv_buf_add(b, lit_txt, lit_n);
		return 0;
	}
	if (json_is_object(v)) {
		const char *k;
		json_t *x;
		int first = 1;
		kv_buf_addc(b, '{');
		json_object_foreach((json_t *)v, k, x) {
			if (!first)
				kv_buf_adds(b, ", ");
			first = 0;
			json_t *ks = json_string(k);
			char *t = json_dumps(ks, JSON_ENCODE_ANY);
			json_decref(ks);
			if (!t)
				return kv_fail(KV_ERR_NOMEM, "out of memory");
			kv_buf_adds(b, t);
			free(t);
			kv_buf_adds(b, ": ");
			if (dump_value(J, x, b, depth + 1))
				return -1;
		}
		kv_buf_addc(b, '}');
		return 0;
	}
	if (json_is_array(v)) {
		size_t i;
		json_t *x;
		kv_buf_addc(b, '[');
		json_array_foreach((json_t *)v, i, x) {
			if (i)
				kv_buf_adds(b, ", ");
			if (dump_value(J, x, b, depth + 1))
				return -1;
		}
		kv_buf_addc(b, ']');
		return 0;
	}
	if (json_is_real(v)) {
		/* shortest text that reads back as the same double */
		char t[40];
		double d = json_real_value(v);
		if (!isfinite(d))
			return invalid(J, "a non-finite number in const or enum");
		for (int prec = 1; prec <= 17; prec++) {
			snprintf(t, sizeof t, "%.*g", prec, d);
			if (strtod(t, NULL) == d)
				break;
		}
		if (!strpbrk(t, ".eEn"))
			strcat(t, ".0");
		kv_buf_adds(b, t);
		return 0;
	}
	char *t = json_dumps(v, JSON_ENCODE_ANY);
	if (!t)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	kv_buf_adds(b, t);
	free(t);
	return 0;
}

static int json_type_bits(const json_t *v)
{
	const char *l;
	size_t n;
	if (kv_json_number_literal(v, &l, &n))
		return memchr(l, '.', n) || memchr(l, 'e', n) || memchr(l, 'E', n) ? T_NUM : T_NUM | T_INT;
	switch (json_typeof(v)) {
	case JSON_NULL: return T_NULL;
	case JSON_TRUE:
	case JSON_FALSE: return T_BOOL;
	case JSON_INTEGER: return T_INT | T_NUM;
	case JSON_REAL: {
		double d = json_real_value(v);
		return d == floor(d) && fabs(d) < 1e15 ? T_INT | T_NUM : T_NUM;
	}
	case JSON_STRING: return T_STR;
	case JSON_ARRAY: return T_ARR;
	case JSON_OBJECT: return T_OBJ;
	}
	return 0;
}

/* A literal value (const / enum member). */
static int literal(struct js *J, const json_t *v, int raw)
{
	if (raw && json_is_string(v)) /* raw text: the string itself */
		return kv_gram_lit(J->g, json_string_value(v), json_string_length(v));
	struct kv_buf b = KV_BUF_INIT;
	if (dump_value(J, v, &b, 0)) {
		kv_buf_free(&b);
		return -1;
	}
	int x = kv_gram_lit(J->g, b.p ? b.p : "", b.len);
	kv_buf_free(&b);
	return x;
}

/* 1 when the literal text holds a forbidden word (it would end a tool
 * call early). */
static int has_word(struct js *J, const json_t *v)
{
	if (!J->n_words)
		return 0;
	char *t = json_dumps(v, JSON_ENCODE_ANY);
	int hit = 0;
	for (int w = 0; t && w < J->n_words && !hit; w++)
		hit = strstr(t, J->words[w]) != NULL;
	if (json_is_string(v))
		for (int w = 0; w < J->n_words && !hit; w++)
			hit = strstr(json_string_value(v), J->words[w]) != NULL;
	free(t);
	return hit;
}

/* --- numbers --------------------------------------------------------------------- */

#define NUM_MAX 9999999999999999ULL /* 16 digits */

/* All n-digit strings s with lo <= s <= hi (leading zeros allowed). */
static int digits_between(struct js *J, const char *lo, const char *hi, int n)
{
	struct kv_gram *g = J->g;
	if (n == 0)
		return kv_gram_empty(g);
	if (n == 1)
		return kv_gram_bytes(g, lo[0], hi[0]);
	if (lo[0] == hi[0])
		return kv_gram_seq2(g, kv_gram_bytes(g, lo[0], lo[0]), digits_between(J, lo + 1, hi + 1, n - 1));
	char nines[20], zeros[20];
	memset(nines, '9', (size_t)n);
	memset(zeros, '0', (size_t)n);
	int alts[3], na = 0;
	int lo_z = !memcmp(lo + 1, zeros, (size_t)n - 1), hi_n = !memcmp(hi + 1, nines, (size_t)n - 1);
	char a = lo_z ? lo[0] : (char)(lo[0] + 1), b = hi_n ? hi[0] : (char)(hi[0] - 1);
	if (!lo_z)
		alts[na++] = kv_gram_seq2(g, kv_gram_bytes(g, lo[0], lo[0]), digits_between(J, lo + 1, nines, n - 1));
	if (a <= b)
		alts[na++] = kv_gram_seq2(g, kv_gram_bytes(g, a, b), kv_gram_rep(g, kv_gram_bytes(g, '0', '9'), n - 1, n - 1));
	if (!hi_n)
		alts[na++] = kv_gram_seq2(g, kv_gram_bytes(g, hi[0], hi[0]), digits_between(J, zeros, hi + 1, n - 1));
	return kv_gram_alt(g, alts, na);
}

static int ndig(unsigned long long x)
{
	int n = 1;
	while (x >= 10) {
		x /= 10;
		n++;
	}
	return n;
}

/* Decimal integers a..b without leading zeros (0 <= a <= b <= NUM_MAX). */
static int intrange(struct js *J, unsigned long long a, unsigned long long b)
{
	int alts[20], na = 0;
	unsigned long long p = 1;
	for (int len = 1; len <= 16; len++, p *= 10) {
		unsigned long long x = len == 1 ? 0 : p, y = p * 10 - 1;
		if (x < a)
			x = a;
		if (y > b)
			y = b;
		if (x > y)
			continue;
		char lo[24], hi[24];
		snprintf(lo, sizeof lo, "%llu", x);
		snprintf(hi, sizeof hi, "%llu", y);
		if (ndig(x) != len || ndig(y) != len)
			continue;
		alts[na++] = digits_between(J, lo, hi, len);
	}
	return kv_gram_alt(J->g, alts, na);
}

struct bound {
	int have;
	double v;
	int excl;
};

/* minimum / maximum / exclusive* of s (draft 4 boolean exclusives too). */
static int read_bounds(struct js *J, const json_t *s, struct bound *lo, struct bound *hi)
{
	memset(lo, 0, sizeof *lo);
	memset(hi, 0, sizeof *hi);
	const json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
	const json_t *emn = json_object_get(s, "exclusiveMinimum"), *emx = json_object_get(s, "exclusiveMaximum");
	if (mn) {
		if (!json_is_number(mn))
			return invalid(J, "minimum must be a number");
		*lo = (struct bound){1, json_number_value(mn), json_is_true(emn)};
	}
	if (mx) {
		if (!json_is_number(mx))
			return invalid(J, "maximum must be a number");
		*hi = (struct bound){1, json_number_value(mx), json_is_true(emx)};
	}
	if (json_is_number(emn) && (!lo->have || json_number_value(emn) >= lo->v))
		*lo = (struct bound){1, json_number_value(emn), 1};
	if (json_is_number(emx) && (!hi->have || json_number_value(emx) <= hi->v))
		*hi = (struct bound){1, json_number_value(emx), 1};
	if ((emn && !json_is_number(emn) && !json_is_boolean(emn)) || (emx && !json_is_number(emx) && !json_is_boolean(emx)))
		return invalid(J, "exclusiveMinimum / exclusiveMaximum must be a number or a boolean");
	return 0;
}

/* Integers in [lo, hi] (bounds inclusive, clamped to 16 digits). */
static int int_in(struct js *J, long long lo, long long hi)
{
	struct kv_gram *g = J->g;
	int alts[2], na = 0;
	if (hi >= 0 && lo <= hi) {
		unsigned long long a = lo > 0 ? (unsigned long long)lo : 0;
		alts[na++] = intrange(J, a, (unsigned long long)hi);
	}
	if (lo < 0 && lo <= hi) {
		unsigned long long a = hi < 0 ? (unsigned long long)(-hi) : 1, b = (unsigned long long)(-lo);
		alts[na++] = kv_gram_seq2(g, lit(J, "-"), intrange(J, a, b));
	}
	return kv_gram_alt(g, alts, na);
}

static int integer_schema(struct js *J, const json_t *s)
{
	struct bound lo, hi;
	const json_t *mo = json_object_get(s, "multipleOf");
	if (mo && J->strict && !(json_is_number(mo) && json_number_value(mo) == 1.0))
		return unsupported(J, "multipleOf", "only multipleOf 1 is supported"), -1;
	if (read_bounds(J, s, &lo, &hi))
		return -1;
	double l = -(double)NUM_MAX, h = (double)NUM_MAX;
	if (lo.have)
		l = lo.excl ? floor(lo.v) + 1 : ceil(lo.v);
	if (hi.have)
		h = hi.excl ? ceil(hi.v) - 1 : floor(hi.v);
	if (l < -(double)NUM_MAX)
		l = -(double)NUM_MAX;
	if (h > (double)NUM_MAX)
		h = (double)NUM_MAX;
	if (l > h)
		return invalid(J, "no integer lies within minimum / maximum"), -1;
	if (!lo.have && !hi.have) /* -0 is an integer too; keep it simple: */
		return kv_gram_seq2(J->g, kv_gram_opt(J->g, lit(J, "-")), intrange(J, 0, NUM_MAX));
	return int_in(J, (long long)l, (long long)h);
}

static int frac_any(struct js *J)
{
	return kv_gram_seq2(J->g, lit(J, "."), kv_gram_rep(J->g, kv_gram_bytes(J->g, '0', '9'), 1, 16));
}

/* A fraction with a non-zero digit. */
static int frac_nonzero(struct js *J)
{
	struct kv_gram *g = J->g;
	int d = kv_gram_bytes(g, '0', '9');
	return kv_gram_seq(g, (int[]){lit(J, "."), kv_gram_rep(g, d, 0, 7), kv_gram_bytes(g, '1', '9'), kv_gram_rep(g, d, 0, 8)},
			   4);
}

static int frac_zero(struct js *J)
{
	return kv_gram_seq2(J->g, lit(J, "."), kv_gram_rep(J->g, lit(J, "0"), 1, 16));
}

/*
 * Magnitudes m = I(.F) with L < m (lex) or L <= m, and m < U (uex) or
 * m <= U; L, U integers, 0 <= L, U may be NUM_MAX + 1 for "none". No
 * exponent.
 */
static int magnitude(struct js *J, unsigned long long L, int lex, unsigned long long U, int uex, int unbounded)
{
	struct kv_gram *g = J->g;
	int alts[4], na = 0;
	if (!unbounded && L > U)
		return kv_gram_fail(g);
	if (!unbounded && L == U) {
		if (lex || uex)
			return kv_gram_fail(g);
		return kv_gram_seq2(g, intrange(J, L, L), kv_gram_opt(g, frac_zero(J)));
	}
	/* I strictly between: any fraction */
	unsigned long long top = unbounded ? NUM_MAX : U - 1;
	if (L + 1 <= top)
		alts[na++] = kv_gram_seq2(g, intrange(J, L + 1, top), kv_gram_opt(g, frac_any(J)));
	/* I == L */
	if (lex)
		alts[na++] = kv_gram_seq2(g, intrange(J, L, L), frac_nonzero(J));
	else
		alts[na++] = kv_gram_seq2(g, intrange(J, L, L), kv_gram_opt(g, frac_any(J)));
	/* I == U */
	if (!unbounded && !uex)
		alts[na++] = kv_gram_seq2(g, intrange(J, U, U), kv_gram_opt(g, frac_zero(J)));
	return kv_gram_alt(g, alts, na);
}

static int number_schema(struct js *J, const json_t *s)
{
	struct kv_gram *g = J->g;
	struct bound lo, hi;
	if (read_bounds(J, s, &lo, &hi))
		return -1;
	const json_t *mo = json_object_get(s, "multipleOf");
	if (mo && json_is_number(mo) && json_number_value(mo) == 1.0)
		return integer_schema(J, s);
	if (mo && J->strict)
		return unsupported(J, "multipleOf", "only multipleOf 1 is supported"), -1;
	if (!lo.have && !hi.have) {
		int d = kv_gram_bytes(g, '0', '9');
		int ip = kv_gram_alt2(g, lit(J, "0"), kv_gram_seq2(g, kv_gram_bytes(g, '1', '9'), kv_gram_rep(g, d, 0, 15)));
		int ex = kv_gram_seq(g, (int[]){kv_gram_alt2(g, lit(J, "e"), lit(J, "E")),
						kv_gram_opt(g, kv_gram_alt2(g, lit(J, "+"), lit(J, "-"))), kv_gram_rep(g, d, 1, 2)},
				     3);
		return kv_gram_seq(g, (int[]){kv_gram_opt(g, lit(J, "-")), ip, kv_gram_opt(g, frac_any(J)), kv_gram_opt(g, ex)},
				   4);
	}
	/* round a bound with a fraction inward to an integer (documented) */
	double l = lo.have ? lo.v : -(double)NUM_MAX - 1, h = hi.have ? hi.v : (double)NUM_MAX + 1;
	int lex = lo.excl, hex = hi.excl;
	if (lo.have && l != floor(l)) {
		l = ceil(l);
		lex = 0;
	}
	if (hi.have && h != floor(h)) {
		h = floor(h);
		hex = 0;
	}
	if (l < -(double)NUM_MAX)
		l = -(double)NUM_MAX - 1, lex = 0;
	if (h > (double)NUM_MAX)
		h = (double)NUM_MAX + 1, hex = 0;
	int alts[2], na = 0;
	int hi_unb = !hi.have || h > (double)NUM_MAX;
	int lo_unb = !lo.have || l < -(double)NUM_MAX;
	/* non-negative values */
	if (hi_unb || h > 0 || (h == 0 && !hex)) {
		unsigned long long L = l > 0 ? (unsigned long long)l : 0;
		int lx = l >= 0 ? lex : 0;
		alts[na++] = magnitude(J, L, lx, hi_unb ? 0 : (unsigned long long)h, hex, hi_unb);
	}
	/* negative values: magnitude in (max(0, -h), -l] */
	if (lo_unb || l < 0) {
		unsigned long long ML = h < 0 && !hi_unb ? (unsigned long long)(-h) : 0;
		int mlx = h < 0 && !hi_unb ? hex : 1; /* above zero: no "-0" */
		alts[na++] = kv_gram_seq2(g, lit(J, "-"), magnitude(J, ML, mlx, lo_unb ? 0 : (unsigned long long)(-l), lex,
								     lo_unb));
	}
	if (!na)
		return invalid(J, "no number lies within minimum / maximum"), -1;
	return kv_gram_alt(g, alts, na);
}

/* --- strings --------------------------------------------------------------------- */

struct fmt {
	const char *name, *re;
};

/* Each a subset of the format that ajv-formats accepts. */
static const struct fmt FORMATS[] = {
    {"date", "^[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|"
	     "02-(?:0[1-9]|1[0-9]|2[0-8]))$"},
    {"time", "^(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"date-time", "^[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|"
		  "02-(?:0[1-9]|1[0-9]|2[0-8]))T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?"
		  "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"uuid", "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
    {"email", "^[a-z0-9]{1,20}(?:[._-][a-z0-9]{1,20}){0,3}@[a-z0-9]{1,20}(?:-[a-z0-9]{1,20}){0,2}"
	      "(?:\\.[a-z0-9]{1,20}){0,2}\\.[a-z]{2,8}$"},
    {"hostname", "^[a-z0-9]{1,20}(?:-[a-z0-9]{1,20}){0,2}(?:\\.[a-z0-9]{1,20}(?:-[a-z0-9]{1,20}){0,2}){0,4}$"},
    {"ipv4", "^(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$"},
    {"uri", "^https?://[a-z0-9]{1,20}(?:-[a-z0-9]{1,20}){0,2}(?:\\.[a-z0-9]{1,20}(?:-[a-z0-9]{1,20}){0,2}){0,4}"
	    "(?::[1-9][0-9]{0,3})?(?:/[A-Za-z0-9._~-]{1,30}){0,10}/?(?:\\?[A-Za-z0-9._~-]{1,20}=[A-Za-z0-9._~-]{0,30}"
	    "(?:&[A-Za-z0-9._~-]{1,20}=[A-Za-z0-9._~-]{0,30}){0,5})?$"},
    {"uri-reference", "^https?://[a-z0-9]{1,20}(?:-[a-z0-9]{1,20}){0,2}(?:\\.[a-z0-9]{1,20}(?:-[a-z0-9]{1,20}){0,2}){0,4}"
		      "(?::[1-9][0-9]{0,3})?(?:/[A-Za-z0-9._~-]{1,30}){0,10}/?$"},
    {NULL, NULL}};

static int get_count(struct js *J, const json_t *s, const char *k, long long def, long long *out)
{
	const json_t *v = json_object_get(s, k);
	*out = def;
	if (!v)
		return 0;
	if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) != floor(json_number_value(v))) {
		char m[96];
		snprintf(m, sizeof m, "%s must be a non-negative integer", k);
		return invalid(J, m);
	}
	double d = json_number_value(v);
	*out = d > 1e9 ? 1000000000LL : (long long)d;
	return 0;
}

/* Length bounds beyond this are not enforced: each counted character is
 * a state of its own (docs/constrain.md). */
#define MAX_LEN_BOUND 1000

/* One character of ranges r (encoded for the mode). */
static int class_char(struct js *J, const uint32_t *r, int n, int raw)
{
	return kv_rx_class(J->g, r, n, 0, raw ? &J->rxraw : &J->rx);
}

/* Intersect sorted merged ranges a (in place) with b. */
static int intersect(uint32_t **a, int *na, const uint32_t *b, int nb)
{
	uint32_t *o = malloc(((size_t)*na + (size_t)nb + 1) * 2 * sizeof *o);
	int k = 0, i = 0, j = 0;
	if (!o)
		return -1;
	while (i < *na && j < nb) {
		uint32_t lo = (*a)[2 * i] > b[2 * j] ? (*a)[2 * i] : b[2 * j];
		uint32_t hi = (*a)[2 * i + 1] < b[2 * j + 1] ? (*a)[2 * i + 1] : b[2 * j + 1];
		if (lo <= hi) {
			o[2 * k] = lo;
			o[2 * k + 1] = hi;
			k++;
		}
		if ((*a)[2 * i + 1] < b[2 * j + 1])
			i++;
		else
			j++;
	}
	free(*a);
	*a = o;
	*na = k;
	return 0;
}

/* The JSON text (or raw text) of a string schema. */
static int string_schema(struct js *J, const json_t *s, int raw)
{
	struct kv_gram *g = J->g;
	const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
	long long mn, mx;
	if (get_count(J, s, "minLength", 0, &mn) || get_count(J, s, "maxLength", -1, &mx))
		return -1;
	if (mx >= 0 && mn > mx)
		return invalid(J, "minLength is larger than maxLength"), -1;
	const char *re = NULL; /* the one pattern or format that is not simple */
	size_t re_len = 0;
	int n_complex = 0;
	/* the character class and length the simple patterns allow */
	uint32_t *cls = malloc(2 * sizeof *cls);
	int ncls = 1, out = -1;
	if (!cls)
		return kv_fail(KV_ERR_NOMEM, "out of memory"), -1;
	cls[0] = 0;
	cls[1] = 0x10FFFF;
	if (fmt) {
		if (!json_is_string(fmt)) {
			invalid(J, "format must be a string");
			goto done;
		}
		const char *fre = NULL;
		for (const struct fmt *f = FORMATS; f->name; f++)
			if (!strcmp(f->name, json_string_value(fmt)))
				fre = f->re;
		if (!fre && J->strict) {
			char why[160];
			snprintf(why, sizeof why, "format \"%.100s\" is not one of those supported", json_string_value(fmt));
			unsupported(J, "format", why);
			goto done;
		}
		if (fre) {
			re = fre;
			re_len = strlen(fre);
			n_complex++;
		}
	}
	if (pat) {
		size_t np = json_is_array(pat) ? json_array_size(pat) : 1;
		for (size_t i = 0; i < np; i++) {
			const json_t *one = json_is_array(pat) ? json_array_get(pat, i) : pat;
			if (!json_is_string(one)) {
				invalid(J, "pattern must be a string");
				goto done;
			}
			uint32_t *pr;
			int npr, pmin, pmax;
			if (kv_rx_simple(json_string_value(one), json_string_length(one), &pr, &npr, &pmin, &pmax)) {
				int rc = intersect(&cls, &ncls, pr, npr);
				free(pr);
				if (rc) {
					kv_fail(KV_ERR_NOMEM, "out of memory");
					goto done;
				}
				if (pmin > mn)
					mn = pmin;
				if (pmax >= 0 && (mx < 0 || pmax < mx))
					mx = pmax;
				continue;
			}
			n_complex++;
			if (!re) {
				re = json_string_value(one);
				re_len = json_string_length(one);
			}
		}
	}
	int simple = ncls != 1 || cls[0] != 0 || cls[1] != 0x10FFFF;
	if (n_complex > 1 || (n_complex && (simple || mn > 0 || mx >= 0))) {
		if (J->strict) {
			unsupported(J, fmt && pat ? "pattern" : pat ? "pattern" : "format",
				    "a pattern or format together with another pattern, format or length bound");
			goto done;
		}
		/* not strict: the first pattern or format alone */
		simple = 0;
		mn = 0;
		mx = -1;
	}
	if (n_complex) {
		int x;
		int rc = kv_rx_compile(g, re, re_len, raw ? &J->rxraw : &J->rx, &x);
		if (rc) {
			if (rc == KV_ERR_UNSUPPORTED && !J->strict && (!fmt || re != NULL)) {
				kv_errclear();
				goto plain; /* an unsupported pattern is ignored when not strict */
			}
			if (!J->err)
				J->err = rc;
			kv_fail_ctx(rc, "JSON Schema at %s", where(J));
			goto done;
		}
		out = raw ? x : kv_gram_seq3(g, lit(J, "\""), x, lit(J, "\""));
		goto done;
	}
plain:
	if (mx > MAX_LEN_BOUND)
		mx = -1; /* documented: not enforced */
	if (mn > MAX_LEN_BOUND) {
		if (J->strict) {
			unsupported(J, "minLength", "a bound over 1000");
			goto done;
		}
		mn = 0;
	}
	if (simple || mn > 0 || mx >= 0) {
		if (!ncls) {
			invalid(J, "the patterns allow no character at all");
			goto done;
		}
		int ch = class_char(J, cls, ncls, raw);
		int body = kv_gram_rep(g, ch, (int)mn, (int)mx);
		out = raw ? body : kv_gram_seq3(g, lit(J, "\""), body, lit(J, "\""));
		goto done;
	}
	out = raw ? free_raw(J) : free_string(J);
done:
	free(cls);
	return out;
}

/* --- free-form values ------------------------------------------------------------ */

static int any_value(struct js *J)
{
	struct kv_gram *g = J->g;
	if (J->r_value >= 0)
		return kv_gram_ref(g, J->r_value);
	int rv = kv_gram_rule_new(g, "value"), ro = kv_gram_rule_new(g, "object"), ra = kv_gram_rule_new(g, "array");
	J->r_value = rv;
	int str = free_string(J);
	int kv = kv_gram_seq3(g, free_string(J), colon(J), kv_gram_ref(g, rv));
	int obj = kv_gram_seq3(g, lit(J, "{"),
			       kv_gram_opt(g, kv_gram_seq2(g, kv, kv_gram_star(g, kv_gram_seq2(g, comma(J),
												  kv_gram_seq3(g, free_string(J), colon(J), kv_gram_ref(g, rv)))))),
			       lit(J, "}"));
	int arr = kv_gram_seq3(g, lit(J, "["),
			       kv_gram_opt(g, kv_gram_seq2(g, kv_gram_ref(g, rv),
							   kv_gram_star(g, kv_gram_seq2(g, comma(J), kv_gram_ref(g, rv))))),
			       lit(J, "]"));
	if (kv_gram_define(g, ro, obj) || kv_gram_define(g, ra, arr))
		return -1;
	json_t *empty = json_object();
	int num = number_schema(J, empty);
	json_decref(empty);
	int alts[] = {kv_gram_ref(g, ro), kv_gram_ref(g, ra), str, num, lit(J, "true"), lit(J, "false"), lit(J, "null")};
	if (kv_gram_define(g, rv, kv_gram_alt(g, alts, 7)))
		return -1;
	return kv_gram_ref(g, rv);
}

static int any_object(struct js *J)
{
	any_value(J);
	int r = kv_gram_rule(J->g, "object", 6);
	return kv_gram_ref(J->g, r);
}

/* --- $ref ------------------------------------------------------------------------ */

static const json_t *resolve(struct js *J, const char *ref)
{
	if (ref[0] != '#') {
		unsupported(J, "$ref", "only references inside the document (\"#...\") are supported");
		return NULL;
	}
	const json_t *cur = J->root;
	const char *p = ref + 1;
	if (*p && *p != '/') {
		unsupported(J, "$ref", "anchors (\"#name\") are not supported");
		return NULL;
	}
	while (*p == '/') {
		p++;
		char tok[256];
		size_t n = 0;
		while (*p && *p != '/' && n + 1 < sizeof tok) {
			char c = *p++;
			if (c == '~' && (*p == '0' || *p == '1')) {
				c = *p == '0' ? '~' : '/';
				p++;
			} else if (c == '%' && p[0] && p[1]) {
				char h[3] = {p[0], p[1], 0};
				c = (char)strtol(h, NULL, 16);
				p += 2;
			}
			tok[n++] = c;
		}
		tok[n] = 0;
		if (json_is_object(cur)) {
			cur = json_object_get(cur, tok);
		} else if (json_is_array(cur)) {
			char *e;
			long k = strtol(tok, &e, 10);
			cur = *e || k < 0 ? NULL : json_array_get(cur, (size_t)k);
		} else {
			cur = NULL;
		}
		if (!cur)
			break;
	}
	if (!cur) {
		char m[400];
		snprintf(m, sizeof m, "$ref \"%.300s\" points to nothing", ref);
		invalid(J, m);
	}
	return cur;
}

static int sch(struct js *J, const json_t *s, int raw);

static int ref_rule(struct js *J, const json_t *target, const char *ref)
{
	uint64_t rid;
	if (kv_map_get(J->refs, &target, sizeof target, &rid))
		return kv_gram_ref(J->g, (int)rid);
	const char *nm = strrchr(ref, '/');
	char hint[80];
	snprintf(hint, sizeof hint, "ref-%.60s", nm && nm[1] ? nm + 1 : "root");
	for (char *c = hint; *c; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-'))
			*c = '-';
	int r = kv_gram_rule_new(J->g, hint);
	if (r < 0 || kv_map_put(J->refs, &target, sizeof target, (uint64_t)r))
		return -1;
	char save[512];
	size_t old = J->plen;
	memcpy(save, J->path, sizeof save);
	snprintf(J->path, sizeof J->path, "%s", ref);
	J->plen = strlen(J->path);
	int x = sch(J, target, 0);
	memcpy(J->path, save, sizeof save);
	J->plen = old;
	if (x < 0 || kv_gram_define(J->g, r, x))
		return -1;
	return kv_gram_ref(J->g, r);
}

/* --- merging (allOf, siblings of anyOf / $ref) ------------------------------------ */

static int merge_into(struct js *J, json_t *dst, const json_t *src, int depth);

/* Follow $ref chains of a schema to be merged (not through recursion). */
static const json_t *deref(struct js *J, const json_t *s)
{
	for (int hop = 0; hop < 32 && json_is_object(s); hop++) {
		const json_t *r = json_object_get(s, "$ref");
		if (!json_is_string(r))
			return s;
		int others = 0;
		const char *k;
		json_t *v;
		json_object_foreach((json_t *)s, k, v) others += !in_list(SUPPORTED, k) || !strcmp(k, "$ref") ? 0 : 1;
		if (others)
			return s; /* merged with its siblings by the caller */
		s = resolve(J, json_string_value(r));
		if (!s)
			return NULL;
	}
	return s;
}

static int type_bits_of(const json_t *t);

static int merge_into(struct js *J, json_t *dst, const json_t *src0, int depth)
{
	if (depth > 16)
		return unsupported(J, "allOf", "nested too deeply");
	const json_t *src = deref(J, src0);
	if (!src)
		return -1;
	if (json_is_true(src) || (json_is_object(src) && !json_object_size(src)))
		return 0;
	if (!json_is_object(src))
		return invalid(J, "allOf member is not a schema (false can match nothing)");
	const char *k;
	json_t *v;
	/* additionalProperties: false applies to the member's own properties:
	 * a property only the other side declares cannot appear at all */
	{
		const json_t *dp = json_object_get(dst, "properties"), *sp = json_object_get(src, "properties");
		int dclosed = json_is_false(json_object_get(dst, "additionalProperties"));
		int sclosed = json_is_false(json_object_get(src, "additionalProperties"));
		if ((dclosed && json_is_object(sp)) || (sclosed && json_is_object(dp))) {
			json_t *np = json_is_object(dp) ? json_copy((json_t *)dp) : json_object();
			const char *pk;
			json_t *pv;
			if (dclosed && json_is_object(sp))
				json_object_foreach((json_t *)sp, pk, pv) if (!json_object_get(np, pk)) json_object_set_new(np, pk, json_false());
			if (sclosed && json_is_object(dp))
				json_object_foreach((json_t *)dp, pk, pv) if (!json_object_get(sp, pk)) json_object_set_new(np, pk, json_false());
			json_object_set_new(dst, "properties", np);
		}
	}
	json_object_foreach((json_t *)src, k, v) {
		json_t *cur = json_object_get(dst, k);
		if (!strcmp(k, "allOf")) {
			size_t i;
			json_t *m;
			if (!json_is_array(v))
				return invalid(J, "allOf must be an array");
			json_array_foreach(v, i, m) if (merge_into(J, dst, m, depth + 1)) return -1;
			continue;
		}
		if (!cur) {
			json_object_set(dst, k, v);
			continue;
		}
		if (json_equal(cur, v))
			continue;
		if (!strcmp(k, "required")) {
			size_t i;
			json_t *x, *u = json_copy(cur);
			json_array_foreach(v, i, x) {
				size_t j;
				json_t *y;
				int have = 0;
				json_array_foreach(u, j, y) have |= json_equal(x, y);
				if (!have)
					json_array_append(u, x);
			}
			json_object_set_new(dst, k, u);
		} else if (!strcmp(k, "properties") && json_is_object(cur) && json_is_object(v)) {
			json_t *u = json_copy(cur);
			const char *pk;
			json_t *pv;
			json_object_foreach(v, pk, pv) {
				json_t *old = json_object_get(u, pk);
				if (!old || json_is_false(pv)) {
					json_object_set(u, pk, pv);
				} else if (json_is_false(old)) {
					continue; /* a closed member does not allow it */
				} else if (!json_equal(old, pv)) {
					json_t *m = json_object();
					json_object_set_new(m, "allOf", json_pack("[OO]", old, pv));
					json_object_set_new(u, pk, m);
				}
			}
			json_object_set_new(dst, k, u);
		} else if (!strcmp(k, "type")) {
			int bits = type_bits_of(cur) & type_bits_of(v);
			if (!bits)
				return invalid(J, "allOf members have no type in common");
			json_t *arr = json_array();
			static const char *const names[] = {"null", "boolean", "integer", "number", "string", "array", "object"};
			for (int b = 0; b < 7; b++)
				if (bits & (1 << b) && !(b == 2 && (bits & T_NUM)))
					json_array_append_new(arr, json_string(names[b]));
			json_object_set_new(dst, k, arr);
		} else if (!strcmp(k, "pattern")) {
			/* several patterns: all must match (string_schema intersects
			 * the simple ones) */
			json_t *l = json_is_array(cur) ? json_copy(cur) : json_pack("[O]", cur);
			json_array_append(l, v);
			json_object_set_new(dst, k, l);
		} else if ((!strcmp(k, "minLength") || !strcmp(k, "minItems") || !strcmp(k, "minimum") ||
			    !strcmp(k, "minProperties")) && json_is_number(cur) && json_is_number(v)) {
			if (json_number_value(v) > json_number_value(cur))
				json_object_set(dst, k, v);
		} else if ((!strcmp(k, "maxLength") || !strcmp(k, "maxItems") || !strcmp(k, "maximum") ||
			    !strcmp(k, "maxProperties")) && json_is_number(cur) && json_is_number(v)) {
			if (json_number_value(v) < json_number_value(cur))
				json_object_set(dst, k, v);
		} else if (!strcmp(k, "description") || !strcmp(k, "title") || !in_list(SUPPORTED, k)) {
			continue; /* annotations: the first one stays */
		} else {
			return unsupported(J, "allOf", "members give different values for the same keyword");
		}
	}
	return 0;
}

/* --- objects ------------------------------------------------------------------------ */

static int is_key_char(int c)
{
	return c == '-' || (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || c == '_' || (c >= 'a' && c <= 'z');
}

struct names {
	const char **v;
	size_t *len;
	int n;
};

/*
 * Keys over [A-Za-z0-9_-] that extend prefix p and are none of the names:
 * a walk down the names' trie (the names are few and short), leaving it
 * with any character no name continues with.
 */
static int notin(struct js *J, const struct names *N, struct kv_buf *p, int depth)

{
	struct kv_gram *g = J->g;
	static const uint32_t kc[] = {'-', '-', '0', '9', 'A', 'Z', '_', '_', 'a', 'z'};
	int alts[80], na = 0;
	/* which next characters continue some name with this prefix */
	uint8_t cont[128] = {0};
	int is_name = 0, any = 0;
	for (int i = 0; i < N->n; i++) {
		if (N->len[i] < p->len || memcmp(N->v[i], p->p ? p->p : "", p->len))
			continue;
		if (N->len[i] == p->len) {
			is_name = 1;
		} else {
			unsigned char c = (unsigned char)N->v[i][p->len];
			if (c < 128 && is_key_char(c)) {
				cont[c] = 1;
				any = 1;
			}
		}
	}
	if (!any) {
		/* no name continues: anything from here, but not empty if the
		 * prefix itself is a name (or empty) */
		int k = kv_gram_cps(g, kc, 5, 0);
		return is_name || p->len == 0 ? kv_gram_rep(g, k, 1, -1) : kv_gram_star(g, k);
	}
	if (!is_name && p->len)
		alts[na++] = kv_gram_empty(g);
	/* characters that leave every name */
	uint32_t pairs[128];
	int np = 0;
	for (int c = 0; c < 128; c++) {
		if (!is_key_char(c) || cont[c])
			continue;
		if (np && pairs[2 * (np - 1) + 1] + 1 == (uint32_t)c) {
			pairs[2 * (np - 1) + 1] = (uint32_t)c;
		} else {
			pairs[2 * np] = pairs[2 * np + 1] = (uint32_t)c;
			np++;
		}
	}
	if (np)
		alts[na++] = kv_gram_seq2(g, kv_gram_cps(g, pairs, np, 0), kv_gram_star(g, kv_gram_cps(g, kc, 5, 0)));
	for (int c = 0; c < 128 && na < 78; c++) {
		if (!cont[c])
			continue;
		if (depth > 200)
			return kv_fail(KV_ERR_INVALID, "property names are too long"), -1;
		kv_buf_addc(p, (char)c);
		int rest = notin(J, N, p, depth + 1);
		p->len--;
		alts[na++] = kv_gram_seq2(g, kv_gram_bytes(g, c, c), rest);
	}
	return kv_gram_alt(g, alts, na);
}

static int object_schema(struct js *J, const json_t *s)
{
	struct kv_gram *g = J->g;
	const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
	const json_t *addl = json_object_get(s, "additionalProperties");
	if (props && !json_is_object(props))
		return invalid(J, "properties must be an object"), -1;
	if (req && !json_is_array(req))
		return invalid(J, "required must be an array"), -1;
	if (addl && !json_is_boolean(addl) && !json_is_object(addl))
		return invalid(J, "additionalProperties must be a boolean or a schema"), -1;
	size_t np = props ? json_object_size(props) : 0, nr = req ? json_array_size(req) : 0;
	/* property list: properties in order, then required names not there */
	const char **names = calloc(np + nr + 1, sizeof *names);
	size_t *nlen = calloc(np + nr + 1, sizeof *nlen);
	const json_t **psch = calloc(np + nr + 1, sizeof *psch);
	int *isreq = calloc(np + nr + 1, sizeof *isreq);
	int n = 0, out = -1;
	if (!names || !nlen || !psch || !isreq) {
		kv_fail(KV_ERR_NOMEM, "out of memory");
		goto done;
	}
	if (props) {
		const char *k;
		json_t *v;
		json_object_foreach((json_t *)props, k, v) {
			names[n] = k;
			nlen[n] = strlen(k);
			psch[n] = v;
			n++;
		}
	}
	for (size_t i = 0; i < nr; i++) {
		const json_t *r = json_array_get(req, i);
		if (!json_is_string(r)) {
			invalid(J, "required must list strings");
			goto done;
		}
		int found = -1;
		for (int j = 0; j < n; j++)
			if (!strcmp(names[j], json_string_value(r)))
				found = j;
		if (found < 0) {
			if (json_is_false(addl)) {
				char m[300];
				snprintf(m, sizeof m, "required property \"%.200s\" is not allowed (additionalProperties is false)",
					 json_string_value(r));
				invalid(J, m);
				goto done;
			}
			names[n] = json_string_value(r);
			nlen[n] = json_string_length(r);
			psch[n] = json_is_object(addl) ? addl : NULL; /* any value, or the additional schema */
			found = n++;
		}
		isreq[found] = 1;
	}
	/* a property whose schema is false cannot appear */
	int w = 0;
	for (int i = 0; i < n; i++) {
		if (psch[i] && json_is_false(psch[i])) {
			if (isreq[i]) {
				invalid(J, "a required property has the schema false");
				goto done;
			}
			continue;
		}
		names[w] = names[i];
		nlen[w] = nlen[i];
		psch[w] = psch[i];
		isreq[w] = isreq[i];
		w++;
	}
	n = w;
	int n_req = 0;
	for (int i = 0; i < n; i++)
		n_req += isreq[i];
	/* min/maxProperties that the layout gives anyway are fine */
	long long minp, maxp;
	if (get_count(J, s, "minProperties", 0, &minp) || get_count(J, s, "maxProperties", -1, &maxp))
		goto done;
	/* extras */
	int extras = 0, extra_val = -1;
	if (json_is_object(addl) || json_is_true(addl) || (!addl && !props)) {
		extras = 1;
	}
	if (minp > n_req && J->strict && !(extras && !n)) {
		unsupported(J, "minProperties", "more than the required properties");
		goto done;
	}
	if (maxp >= 0 && (maxp < n_req || ((size_t)maxp < (size_t)n || extras)) && J->strict) {
		if (maxp < n_req) {
			invalid(J, "maxProperties is smaller than the number of required properties");
			goto done;
		}
		unsupported(J, "maxProperties", "fewer than the properties the object may have");
		goto done;
	}
	if (!props && !nr && extras && !json_is_object(addl) && minp <= 0) {
		out = any_object(J); /* free-form object */
		goto done;
	}
	int ekv = -1;
	if (extras) {
		struct names N = {names, nlen, n};
		struct kv_buf pre = KV_BUF_INIT;
		int key = kv_gram_seq3(g, lit(J, "\""), notin(J, &N, &pre, 0), lit(J, "\""));
		kv_buf_free(&pre);
		size_t old = path_push(J, "additionalProperties", NULL);
		extra_val = json_is_object(addl) ? sch(J, addl, 0) : any_value(J);
		path_pop(J, old);
		if (key < 0 || extra_val < 0)
			goto done;
		ekv = kv_gram_seq3(g, key, colon(J), extra_val);
	}
	/* rules from the end: S_i (something written), N_i (nothing), V_i */
	int *Sr = calloc((size_t)n + 2, sizeof *Sr), *Nr = calloc((size_t)n + 2, sizeof *Nr);
	if (!Sr || !Nr) {
		free(Sr);
		free(Nr);
		kv_fail(KV_ERR_NOMEM, "out of memory");
		goto done;
	}
	for (int i = 0; i <= n; i++) {
		Sr[i] = kv_gram_rule_new(g, "obj-s");
		Nr[i] = kv_gram_rule_new(g, "obj-n");
	}
	int rc = 0;
	/* the tail: extras after the listed properties */
	int s_end = extras ? kv_gram_star(g, kv_gram_seq2(g, comma(J), ekv)) : kv_gram_empty(g);
	int n_end = extras ? kv_gram_opt(g, kv_gram_seq2(g, ekv, kv_gram_star(g, kv_gram_seq2(g, comma(J), ekv))))
			   : kv_gram_empty(g);
	rc |= kv_gram_define(g, Sr[n], s_end);
	rc |= kv_gram_define(g, Nr[n], n_end);
	for (int i = n - 1; i >= 0 && !rc; i--) {
		json_t *ks = json_stringn(names[i], nlen[i]);
		char *kt = json_dumps(ks, JSON_ENCODE_ANY);
		json_decref(ks);
		if (!kt) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			break;
		}
		int key = lit(J, kt);
		free(kt);
		size_t old = path_push(J, "properties", names[i]);
		int val = psch[i] ? sch(J, psch[i], 0) : any_value(J);
		path_pop(J, old);
		if (val < 0) {
			rc = -1;
			break;
		}
		int vr = kv_gram_rule_new(g, "obj-v");
		rc |= kv_gram_define(g, vr, kv_gram_seq3(g, colon(J), val, kv_gram_ref(g, Sr[i + 1])));
		int s_has = kv_gram_seq3(g, comma(J), key, kv_gram_ref(g, vr));
		int n_has = kv_gram_seq2(g, key, kv_gram_ref(g, vr));
		if (isreq[i]) {
			rc |= kv_gram_define(g, Sr[i], s_has);
			rc |= kv_gram_define(g, Nr[i], n_has);
		} else {
			rc |= kv_gram_define(g, Sr[i], kv_gram_alt2(g, s_has, kv_gram_ref(g, Sr[i + 1])));
			rc |= kv_gram_define(g, Nr[i], kv_gram_alt2(g, n_has, kv_gram_ref(g, Nr[i + 1])));
		}
	}
	if (!rc)
		out = kv_gram_seq3(g, lit(J, "{"), kv_gram_ref(g, Nr[0]), lit(J, "}"));
	free(Sr);
	free(Nr);
done:
	free(names);
	free(nlen);
	free(psch);
	free(isreq);
	return out;
}

/* --- arrays ------------------------------------------------------------------------ */

static int array_schema(struct js *J, const json_t *s)
{
	struct kv_gram *g = J->g;
	const json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
	const json_t *addi = json_object_get(s, "additionalItems");
	long long mn, mx;
	if (get_count(J, s, "minItems", 0, &mn) || get_count(J, s, "maxItems", -1, &mx))
		return -1;
	if (mx >= 0 && mn > mx)
		return invalid(J, "minItems is larger than maxItems"), -1;
	const json_t *uq = json_object_get(s, "uniqueItems");
	if (json_is_true(uq) && J->strict && !(mx >= 0 && mx <= 1))
		return unsupported(J, "uniqueItems", NULL), -1;
	/* the tuple part and the schema of the rest */
	const json_t *tuple = NULL, *rest = NULL;
	int rest_false = 0;
	if (json_is_array(prefix)) {
		tuple = prefix;
		rest = items;
	} else if (json_is_array(items)) { /* draft 4..2019 tuple form */
		tuple = items;
		rest = addi;
	} else {
		rest = items;
	}
	if (rest && json_is_false(rest))
		rest_false = 1;
	int k = tuple ? (int)json_array_size(tuple) : 0;
	if (rest_false && (mx < 0 || mx > k))
		mx = k;
	if (mn > KV_GRAM_MAX_REP || mx > KV_GRAM_MAX_REP)
		return unsupported(J, "maxItems", "a bound over 100000"), -1;
	if (mx >= 0 && mn > mx)
		return invalid(J, "no array length satisfies minItems, maxItems and the items"), -1;
	/* elements 0..k-1 from the tuple, then the rest schema */
	int *el = calloc((size_t)k + 1, sizeof *el);
	if (!el)
		return kv_fail(KV_ERR_NOMEM, "out of memory"), -1;
	for (int i = 0; i < k; i++) {
		char idx[24];
		snprintf(idx, sizeof idx, "%d", i);
		size_t old = path_push(J, tuple == prefix ? "prefixItems" : "items", idx);
		el[i] = sch(J, json_array_get(tuple, (size_t)i), 0);
		path_pop(J, old);
		if (el[i] < 0) {
			free(el);
			return -1;
		}
	}
	int relem = -1;
	if (!rest_false && (mx < 0 || mx > k)) {
		size_t old = path_push(J, rest == addi && addi ? "additionalItems" : "items", NULL);
		relem = rest && !json_is_true(rest) ? sch(J, rest, 0) : any_value(J);
		path_pop(J, old);
		if (relem < 0) {
			free(el);
			return -1;
		}
		if (rest && json_is_true(rest))
			relem = any_value(J);
		/* a rule: the automaton compiler builds a large item once and
		 * calls it, instead of copying it maxItems times (gpda.c) */
		int ir = kv_gram_rule_new(g, "item");
		if (kv_gram_define(g, ir, relem)) {
			free(el);
			return -1;
		}
		relem = kv_gram_ref(g, ir);
	}
	/* build from the end: T(i) = the elements from i on, after i elements
	 * written (i > 0 means a comma comes first) */
	int tail; /* elements k.. : count c in [max(mn-k,0), mx-k] */
	if (relem >= 0) {
		int lo = mn > k ? (int)(mn - k) : 0, hi = mx < 0 ? -1 : (int)(mx - k);
		if (k == 0) {
			/* [ (e (, e){lo-1,hi-1})? ] */
			if (hi == 0) {
				tail = kv_gram_empty(g);
			} else {
				int more = kv_gram_rep(g, kv_gram_seq2(g, comma(J), relem), lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
				int one = kv_gram_seq2(g, relem, more);
				tail = lo > 0 ? one : kv_gram_opt(g, one);
			}
			free(el);
			return kv_gram_seq3(g, lit(J, "["), tail, lit(J, "]"));
		}
		tail = kv_gram_rep(g, kv_gram_seq2(g, comma(J), relem), lo, hi);
	} else {
		tail = kv_gram_empty(g);
	}
	/* the tuple elements: element i is optional when i >= mn */
	int x = tail;
	for (int i = k - 1; i >= 0; i--) {
		int piece = i ? kv_gram_seq3(g, comma(J), el[i], x) : kv_gram_seq2(g, el[i], x);
		x = i >= mn ? kv_gram_opt(g, piece) : piece;
	}
	free(el);
	return kv_gram_seq3(g, lit(J, "["), x, lit(J, "]"));
}

/* --- the dispatcher ---------------------------------------------------------------- */

static int type_bits_of(const json_t *t)
{
	static const char *const names[] = {"null", "boolean", "integer", "number", "string", "array", "object"};
	int bits = 0;
	if (json_is_string(t)) {
		for (int b = 0; b < 7; b++)
			if (!strcmp(json_string_value(t), names[b]))
				bits |= 1 << b;
		if (bits == T_NUM)
			bits |= T_INT;
		return bits ? bits : -1;
	}
	if (json_is_array(t)) {
		size_t i;
		json_t *v;
		json_array_foreach((json_t *)t, i, v) {
			int b = type_bits_of(v);
			if (b < 0 || !json_is_string(v))
				return -1;
			bits |= b;
		}
		return bits;
	}
	return -1;
}

/* Types to generate when "type" is absent: what the keywords imply
 * (narrower is always sound), else everything. */
static int implied_types(const json_t *s)
{
	static const char *const obj[] = {"properties", "required", "additionalProperties", "minProperties",
					  "maxProperties", NULL};
	static const char *const arr[] = {"items", "prefixItems", "minItems", "maxItems", "additionalItems", NULL};
	static const char *const str[] = {"minLength", "maxLength", "pattern", "format", NULL};
	static const char *const num[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", NULL};
	for (int i = 0; obj[i]; i++)
		if (json_object_get(s, obj[i]))
			return T_OBJ;
	for (int i = 0; arr[i]; i++)
		if (json_object_get(s, arr[i]))
			return T_ARR;
	for (int i = 0; str[i]; i++)
		if (json_object_get(s, str[i]))
			return T_STR;
	for (int i = 0; num[i]; i++)
		if (json_object_get(s, num[i]))
			return T_NUM | T_INT;
	return T_ALL;
}

/* 1 when s has validation keywords besides those listed in skip. */
static int has_validation_except(const json_t *s, const char *const *skip)
{
	const char *k;
	json_t *v;
	json_object_foreach((json_t *)s, k, v) {
		if (in_list(skip, k))
			continue;
		if (in_list(SUPPORTED, k) || in_list(UNSUPPORTED, k))
			return 1;
	}
	return 0;
}

/* A copy of s without the listed keys. */
static json_t *without(const json_t *s, const char *const *drop)
{
	json_t *c = json_object();
	const char *k;
	json_t *v;
	json_object_foreach((json_t *)s, k, v) if (!in_list(drop, k)) json_object_set(c, k, v);
	return c;
}

static int keep(struct js *J, json_t *t)
{
	if (!J->tmp)
		J->tmp = json_array();
	return json_array_append_new(J->tmp, t);
}

static int typed(struct js *J, const json_t *s, int bits, int raw)
{
	struct kv_gram *g = J->g;
	int alts[8], na = 0;
	if (bits & T_OBJ)
		alts[na++] = object_schema(J, s);
	if (bits & T_ARR)
		alts[na++] = array_schema(J, s);
	if (bits & T_STR) {
		int x = string_schema(J, s, raw);
		if (raw && (bits & ~T_STR) && x >= 0) {
			/* raw text in a union: keep clear of what the tool-call
			 * parser would read as another type (a leading space,
			 * digit, sign, brace, t/f/n) */
			static const uint32_t bad[] = {0, 0x20, '+', '+', '-', '-', '0', '9', '[', '[', '{', '{',
						       'F', 'F', 'N', 'N', 'T', 'T', 'f', 'f', 'n', 'n'};
			int first = kv_gram_cps(g, bad, 11, 1);
			static const uint32_t lt[] = {'<', '<'};
			(void)lt;
			static const uint32_t all[2] = {0, 0x10FFFF};
			int rest = kv_gram_star(g, kv_rx_class(g, all, 1, 0, &J->rxraw));
			x = kv_gram_seq2(g, first, rest);
			/* only a free string can take this form */
			if (json_object_get(s, "pattern") || json_object_get(s, "format") || json_object_get(s, "minLength") ||
			    json_object_get(s, "maxLength"))
				x = J->strict ? (unsupported(J, "type", "a constrained string in a union of types, as a "
								       "raw tool-call parameter"),
						 -1)
					      : x;
		}
		alts[na++] = x;
	}
	if (bits & T_NUM)
		alts[na++] = number_schema(J, s);
	else if (bits & T_INT)
		alts[na++] = integer_schema(J, s);
	if (bits & T_BOOL)
		alts[na++] = kv_gram_alt2(g, lit(J, "true"), lit(J, "false"));
	if (bits & T_NULL)
		alts[na++] = lit(J, "null");
	for (int i = 0; i < na; i++)
		if (alts[i] < 0)
			return -1;
	return kv_gram_alt(g, alts, na);
}

static int sch(struct js *J, const json_t *s, int raw)
{
	struct kv_gram *g = J->g;
	int out = -1;
	if (++J->depth > MAX_DEPTH) {
		J->depth--;
		return invalid(J, "the schema nests too deeply"), -1;
	}
	if (json_is_true(s)) {
		out = any_value(J);
		goto done;
	}
	if (json_is_false(s)) {
		invalid(J, "the schema is false: no value can match");
		goto done;
	}
	if (!json_is_object(s)) {
		invalid(J, "a schema must be an object or a boolean");
		goto done;
	}
	if (check_keywords(J, s))
		goto done;
	/* $ref (with siblings: merged) */
	const json_t *ref = json_object_get(s, "$ref");
	if (ref) {
		if (!json_is_string(ref)) {
			invalid(J, "$ref must be a string");
			goto done;
		}
		static const char *const skip[] = {"$ref", "$defs", "definitions", NULL};
		const json_t *target = resolve(J, json_string_value(ref));
		if (!target)
			goto done;
		if (!has_validation_except(s, skip)) {
			if (raw) {
				out = sch(J, target, raw);
				goto done;
			}
			out = ref_rule(J, target, json_string_value(ref));
			goto done;
		}
		json_t *m = without(s, skip);
		keep(J, m);
		if (merge_into(J, m, target, 0))
			goto done;
		out = sch(J, m, raw);
		goto done;
	}
	/* allOf: one merged schema */
	const json_t *all = json_object_get(s, "allOf");
	if (all) {
		static const char *const drop[] = {"allOf", NULL};
		if (!json_is_array(all)) {
			invalid(J, "allOf must be an array");
			goto done;
		}
		json_t *m = without(s, drop);
		keep(J, m);
		size_t i;
		json_t *x;
		json_array_foreach(all, i, x) if (merge_into(J, m, x, 0)) goto done;
		out = sch(J, m, raw);
		goto done;
	}
	/* anyOf / oneOf: alternatives, each with the siblings merged in */
	const char *altk = json_object_get(s, "anyOf") ? "anyOf" : json_object_get(s, "oneOf") ? "oneOf" : NULL;
	if (altk) {
		const json_t *l = json_object_get(s, altk);
		if (!json_is_array(l) || !json_array_size(l)) {
			invalid(J, "anyOf / oneOf must be a non-empty array");
			goto done;
		}
		if (json_object_get(s, "anyOf") && json_object_get(s, "oneOf")) {
			if (J->strict) {
				unsupported(J, "oneOf", "together with anyOf");
				goto done;
			}
		}
		static const char *const drop[] = {"anyOf", "oneOf", "$defs", "definitions", NULL};
		static const char *const none[] = {"anyOf", "oneOf", NULL};
		int siblings = has_validation_except(s, none);
		size_t n = json_array_size(l);
		int *alts = calloc(n + 1, sizeof *alts), na = 0;
		if (!alts) {
			kv_fail(KV_ERR_NOMEM, "out of memory");
			goto done;
		}
		for (size_t i = 0; i < n; i++) {
			const json_t *b = json_array_get(l, i);
			char idx[24];
			snprintf(idx, sizeof idx, "%zu", i);
			size_t old = path_push(J, altk, idx);
			int x;
			if (json_is_false(b)) {
				path_pop(J, old);
				continue;
			}
			if (siblings) {
				json_t *m = without(s, drop);
				keep(J, m);
				x = merge_into(J, m, b, 0) ? -1 : sch(J, m, raw);
			} else {
				x = sch(J, b, raw);
			}
			path_pop(J, old);
			if (x < 0) {
				free(alts);
				goto done;
			}
			alts[na++] = x;
		}
		out = na ? kv_gram_alt(g, alts, na) : (invalid(J, "every alternative is false"), -1);
		free(alts);
		goto done;
	}
	/* the type set */
	const json_t *t = json_object_get(s, "type");
	int bits;
	if (t) {
		bits = type_bits_of(t);
		if (bits < 0) {
			invalid(J, "type must be a type name or a list of them");
			goto done;
		}
	} else {
		bits = implied_types(s);
	}
	if (json_is_true(json_object_get(s, "nullable")))
		bits |= T_NULL;
	/* const / enum */
	const json_t *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
	if (cst || en) {
		json_t *vals = json_array();
		keep(J, vals);
		if (cst)
			json_array_append(vals, (json_t *)cst);
		else if (json_is_array(en))
			json_array_extend(vals, (json_t *)en);
		else {
			invalid(J, "enum must be an array");
			goto done;
		}
		int *alts = calloc(json_array_size(vals) + 1, sizeof *alts), na = 0;
		size_t i;
		json_t *v;
		/* the values' own types narrow what "type" left open: an enum of
		 * strings alone is a string, raw text in the XML form included */
		int vb = 0;
		json_array_foreach(vals, i, v)
			vb |= json_type_bits(v);
		if (bits & vb)
			bits &= vb;
		json_array_foreach(vals, i, v) {
			int tb = json_type_bits(v);
			if (!(tb & bits) || has_word(J, v))
				continue; /* not of the allowed types (or would end a tool call) */
			if (json_is_number(v) && !(bits & T_NUM) && !(tb & T_INT))
				continue;
			if (raw && json_is_string(v) && (bits & ~T_STR))
				continue; /* see typed(): raw strings in unions */
			alts[na++] = literal(J, v, raw);
		}
		out = na ? kv_gram_alt(g, alts, na) : (invalid(J, "no enum / const value fits the schema"), -1);
		free(alts);
		goto done;
	}
	out = typed(J, s, bits, raw);
done:
	J->depth--;
	return out;
}

/* --- entry points -------------------------------------------------------------------- */

static int js_init(struct js *J, struct kv_gram *g, const json_t *root, const struct kv_js_opts *o)
{
	memset(J, 0, sizeof *J);
	J->g = g;
	J->root = root;
	J->strict = o && o->strict;
	J->raw_top = o && o->raw_strings;
	J->r_value = J->r_string = J->r_raw = -1;
	if (o && o->forbid)
		for (const char *const *w = o->forbid; *w && J->n_words < MAX_WORDS; w++) {
			if (!**w || (*w)[0] != '<')
				return kv_fail(KV_ERR_INVALID, "forbidden words must start with '<'");
			J->words[J->n_words++] = *w;
		}
	J->rx.mode = KV_RX_JSON;
	J->rx.no_lt = J->n_words > 0;
	J->rxraw.mode = KV_RX_RAW;
	J->rxraw.no_lt = J->n_words > 0;
	J->refs = kv_map_create(16);
	return J->refs ? 0 : kv_fail(KV_ERR_NOMEM, "out of memory");
}

static void js_done(struct js *J)
{
	kv_map_destroy(J->refs);
	json_decref(J->tmp);
}

int kv_jschema_expr(struct kv_gram *g, const json_t *schema, const struct kv_js_opts *o, int *expr)
{
	struct js J;
	int rc = js_init(&J, g, schema, o);
	*expr = -1;
	if (rc)
		return rc;
	int x = sch(&J, schema, J.raw_top);
	if (x < 0) {
		rc = kv_gram_error(g);
		if (!rc)
			rc = J.err ? J.err : KV_ERR_INVALID;
	} else {
		*expr = x;
	}
	js_done(&J);
	return rc;
}

int kv_jschema_compile(const json_t *schema, const struct kv_js_opts *o, struct kv_gram **out)
{
	struct kv_gram *g;
	int x, rc = kv_gram_create(&g);
	*out = NULL;
	if (rc)
		return rc;
	if ((rc = kv_jschema_expr(g, schema, o, &x)))
		goto fail;
	int root = kv_gram_rule(g, "root", 4);
	if ((rc = kv_gram_define(g, root, x)))
		goto fail;
	kv_gram_set_root(g, root);
	*out = g;
	return KV_OK;
fail:
	kv_gram_free(g);
	return rc;
}

int kv_jschema_any_object(const struct kv_js_opts *o, struct kv_gram **out)
{
	json_t *s = json_pack("{s:s}", "type", "object");
	int rc = kv_jschema_compile(s, o, out);
	json_decref(s);
	return rc;
}

int kv_jschema_text_without(struct kv_gram *g, const char *const *words, int *expr)
{
	struct js J;
	struct kv_js_opts o = {.forbid = words};
	json_t *t = json_true();
	int rc = js_init(&J, g, t, &o);
	*expr = -1;
	if (!rc) {
		int x = free_raw(&J);
		if (x < 0)
			rc = kv_gram_error(g) ? kv_gram_error(g) : KV_ERR_INVALID;
		*expr = x;
	}
	js_done(&J);
	json_decref(t);
	return rc;
}
