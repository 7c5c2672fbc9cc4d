/*
 * jinja_lex.c - the Jinja lexer: template source to tokens, with the
 * whitespace control of trim_blocks / lstrip_blocks applied here, as
 * jinja2.lexer does (the rules are listed above enum tkind in jinja_int.h).
 */
#include "text/jinja_int.h"

#include "base/utf8.h"

const char *const kj_op_text[] = {
	"+", "-", "/", "//", "*", "%", "**", "~", "[", "]", "(", ")", "{", "}", "==", "!=", ">", ">=", "<",
	"<=", "=", ".", ":", "|", ",", ";",
};

/* Line and column (1-based, in code points) of byte offset off: a binary
 * search of the line starts kv_tmpl_compile records before lexing. */
void kj_pos_of(const struct kv_tmpl *t, size_t off, int *line, int *col)
{
	int lo = 0, hi = t->n_lines - 1;
	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;
		if (t->lines[mid] <= off)
			lo = mid;
		else
			hi = mid - 1;
	}
	*line = lo + 1;
	*col = (int)kv_utf8_count(t->src + t->lines[lo], off - t->lines[lo]) + 1;
}

void __attribute__((noreturn, format(printf, 3, 4)))
kj_cfail(struct cstate *cs, size_t off, const char *fmt, ...)
{
	char msg[600];
	va_list ap;
	int line, col;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	kj_pos_of(cs->t, off, &line, &col);
	cs->err = kv_fail(cs->err ? cs->err : KV_ERR_INVALID, "%s: line %d column %d: %s", cs->t->what, line,
			  col, msg);
	longjmp(cs->jb, 1);
}

void __attribute__((noreturn)) kj_cnomem(struct cstate *cs)
{
	cs->err = kv_fail(KV_ERR_NOMEM, "%s: out of memory while compiling", cs->t->what);
	longjmp(cs->jb, 1);
}

void *kj_calloc_c(struct cstate *cs, size_t n)
{
	void *p = kj_ar_alloc_raw(&cs->t->ar, n);
	if (!p)
		kj_cnomem(cs);
	memset(p, 0, n);
	return p;
}

static struct tok *push_tok(struct cstate *cs, int t, size_t off)
{
	if (cs->nt == cs->cap) {
		size_t nc = cs->cap ? cs->cap * 2 : 256;
		struct tok *n = kj_ar_alloc_raw(&cs->t->ar, nc * sizeof *n);
		if (!n)
			kj_cnomem(cs);
		if (cs->nt)
			memcpy(n, cs->tk, cs->nt * sizeof *n);
		cs->tk = n;
		cs->cap = nc;
	}
	struct tok *k = &cs->tk[cs->nt++];
	memset(k, 0, sizeof *k);
	k->t = (uint8_t)t;
	k->off = off;
	return k;
}

/* Python whitespace (\s) at p? Returns its byte length or 0. */
static int ws_at(const char *s, size_t n, size_t pos)
{
	int32_t cp;
	if (pos >= n)
		return 0;
	int l = kv_utf8_decode(s + pos, n - pos, &cp);
	return l && kj_py_isspace(cp) ? l : 0;
}

static size_t skip_ws(const char *s, size_t n, size_t pos)
{
	int l;
	while ((l = ws_at(s, n, pos)))
		pos += (size_t)l;
	return pos;
}

/* Length of text[0..len) without trailing Python whitespace. */
static size_t rstrip_len(const char *p, size_t len)
{
	while (len > 0) {
		size_t b = len - 1;
		while (b > 0 && ((unsigned char)p[b] & 0xC0) == 0x80)
			b--;
		int32_t cp;
		if (!kv_utf8_decode(p + b, len - b, &cp) || !kj_py_isspace(cp))
			break;
		len = b;
	}
	return len;
}

/* Apply the whitespace control of a tag to the data before it. */
static size_t strip_before(const char *text, size_t len, int sign, int is_var, int line_starting)
{
	if (sign == '-')
		return rstrip_len(text, len);
	if (sign != '+' && !is_var) {
		size_t l = len;
		while (l > 0 && text[l - 1] != '\n')
			l--;
		if ((l > 0 || line_starting) && l < len && rstrip_len(text + l, len - l) == 0)
			return l;
	}
	return len;
}

static void emit_data(struct cstate *cs, const char *p, size_t n, size_t off)
{
	if (!n)
		return;
	struct tok *k = push_tok(cs, K_DATA, off);
	k->p = p;
	k->n = n;
}

/* Decode a string literal body the way Jinja does (Python's
 * unicode-escape after backslashreplace). */
static void decode_string(struct cstate *cs, struct tok *k, const char *p, size_t n, size_t off)
{
	char *out = kj_calloc_c(cs, n * 3 + 4), *o = out;
	size_t i = 0;
	while (i < n) {
		if (p[i] != '\\') {
			*o++ = p[i++];
			continue;
		}
		i++;
		if (i >= n)
			kj_cfail(cs, off, "string literal ends with a backslash");
		unsigned char c = (unsigned char)p[i];
		int32_t cp = -1;
		int digits = 0;
		switch (c) {
		case '\n': i++; continue;
		case '\\': *o++ = '\\'; i++; continue;
		case '\'': *o++ = '\''; i++; continue;
		case '"': *o++ = '"'; i++; continue;
		case 'a': *o++ = 7; i++; continue;
		case 'b': *o++ = 8; i++; continue;
		case 'f': *o++ = 12; i++; continue;
		case 'n': *o++ = 10; i++; continue;
		case 'r': *o++ = 13; i++; continue;
		case 't': *o++ = 9; i++; continue;
		case 'v': *o++ = 11; i++; continue;
		case 'x': digits = 2; break;
		case 'u': digits = 4; break;
		case 'U': digits = 8; break;
		case 'N': kj_cfail(cs, off, "\\N{...} escapes are not supported");
		default:
			if (c >= '0' && c <= '7') {
				cp = 0;
				for (int d = 0; d < 3 && i < n && p[i] >= '0' && p[i] <= '7'; d++)
					cp = cp * 8 + (p[i++] - '0');
				break;
			}
			if (c >= 0x80) {
				/* backslashreplace turns the character into its own
				 * escape, then "\\" decodes to one backslash */
				int32_t u;
				int l = kv_utf8_decode(p + i, n - i, &u);
				if (!l)
					kj_cfail(cs, off, "invalid UTF-8 in string literal");
				o += sprintf(o, u < 0x100 ? "\\x%02x" : u < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)u);
				i += (size_t)l;
				continue;
			}
			*o++ = '\\';
			*o++ = (char)c;
			i++;
			continue;
		}
		if (digits) {
			i++;
			cp = 0;
			for (int d = 0; d < digits; d++) {
				int h = i < n ? kv_hex_digit((unsigned char)p[i]) : -1;
				if (h < 0)
					kj_cfail(cs, off, "truncated \\%c escape in string literal", c);
				cp = cp * 16 + h;
				i++;
			}
		}
		if (cp > 0x10FFFF || cp < 0)
			kj_cfail(cs, off, "illegal Unicode character in string literal");
		if (cp >= 0xD800 && cp <= 0xDFFF)
			kj_cfail(cs, off, "surrogate code point U+%04X in string literal cannot be rendered", (unsigned)cp);
		o += kv_utf8_encode(cp, o);
	}
	k->p = out;
	k->n = (size_t)(o - out);
}

static int is_digit(int c)
{
	return c >= '0' && c <= '9';
}

/* (\d+_)*\d+ at pos; returns end or pos if none. */
static size_t scan_digits_us(const char *s, size_t n, size_t pos)
{
	size_t e = pos;
	if (e >= n || !is_digit((unsigned char)s[e]))
		return pos;
	for (;;) {
		while (e < n && is_digit((unsigned char)s[e]))
			e++;
		if (e + 1 < n && s[e] == '_' && is_digit((unsigned char)s[e + 1])) {
			e++;
			continue;
		}
		return e;
	}
}

/* Lex one tag body ({{ ... }} or {% ... %}) starting at pos; returns the
 * position after the tag end. */
static size_t lex_tag(struct cstate *cs, size_t pos, int is_block, int *line_starting, size_t tag_off)
{
	const char *s = cs->t->src;
	size_t n = cs->t->src_len;
	char stack[TM_MAX_PARSE_DEPTH];
	int sp = 0;

	for (;;) {
		if (pos >= n)
			return n; /* the parser reports the missing end */
		if (sp == 0) {
			if (is_block) {
				if (s[pos] == '+' && pos + 2 < n && !strncmp(s + pos + 1, "%}", 2)) {
					push_tok(cs, K_BEND, pos);
					*line_starting = 0;
					return pos + 3;
				}
				if (s[pos] == '-' && pos + 2 < n && !strncmp(s + pos + 1, "%}", 2)) {
					push_tok(cs, K_BEND, pos);
					size_t e = skip_ws(s, n, pos + 3);
					*line_starting = e > pos + 3 && s[e - 1] == '\n';
					return e;
				}
				if (s[pos] == '%' && pos + 1 < n && s[pos + 1] == '}') {
					push_tok(cs, K_BEND, pos);
					size_t e = pos + 2;
					if (e < n && s[e] == '\n')
						e++;
					*line_starting = s[e - 1] == '\n';
					return e;
				}
			} else {
				if (s[pos] == '-' && pos + 2 < n && !strncmp(s + pos + 1, "}}", 2)) {
					push_tok(cs, K_VEND, pos);
					size_t e = skip_ws(s, n, pos + 3);
					*line_starting = e > pos + 3 && s[e - 1] == '\n';
					return e;
				}
				if (s[pos] == '}' && pos + 1 < n && s[pos + 1] == '}') {
					push_tok(cs, K_VEND, pos);
					*line_starting = 0;
					return pos + 2;
				}
			}
		}
		int wl = ws_at(s, n, pos);
		if (wl) {
			pos = skip_ws(s, n, pos);
			continue;
		}
		unsigned char c = (unsigned char)s[pos];
		/* float: (?<!\.)(\d+_)*\d+((\.(\d+_)*\d+)?e[+-]?(\d+_)*\d+|\.(\d+_)*\d+) */
		if (is_digit(c) && !(pos > 0 && s[pos - 1] == '.')) {
			size_t e = scan_digits_us(s, n, pos), fe = 0;
			size_t q = e;
			if (q < n && s[q] == '.') {
				size_t d = scan_digits_us(s, n, q + 1);
				if (d > q + 1)
					q = d;
			}
			if (q < n && (s[q] == 'e' || s[q] == 'E')) {
				size_t r = q + 1;
				if (r < n && (s[r] == '+' || s[r] == '-'))
					r++;
				size_t d = scan_digits_us(s, n, r);
				if (d > r)
					fe = d;
			}
			if (!fe && q > e)
				fe = q;
			if (fe) {
				char buf[128];
				size_t bl = 0;
				for (size_t j = pos; j < fe && bl < sizeof buf - 1; j++)
					if (s[j] != '_')
						buf[bl++] = s[j];
				buf[bl] = 0;
				struct tok *k = push_tok(cs, K_FLOAT, pos);
				k->f = strtod(buf, NULL);
				pos = fe;
				continue;
			}
		}
		if (is_digit(c)) {
			/* integer: 0b(_?[01])+ | 0o(_?[0-7])+ | 0x(_?hex)+ | [1-9](_?\d)* | 0(_?0)* */
			unsigned __int128 acc = 0;
			size_t q = pos + 1;
			int base = 0, count = 0;
			if (c == '0' && pos + 1 < n) {
				char b = (char)(s[pos + 1] | 0x20);
				base = b == 'b' ? 2 : b == 'o' ? 8 : b == 'x' ? 16 : 0;
			}
			if (base) {
				size_t r0 = pos + 2;
				for (;;) {
					size_t r = r0;
					if (r < n && s[r] == '_')
						r++;
					int h = r < n ? kv_hex_digit((unsigned char)s[r]) : -1;
					if (h < 0 || h >= base)
						break;
					acc = acc * (unsigned)base + (unsigned)h;
					if (acc > (unsigned __int128)INT64_MAX)
						kj_cfail(cs, pos, "integer literal too large (beyond 64 bits)");
					r0 = r + 1;
					count++;
				}
				if (count)
					q = r0;
			}
			if (!count) {
				acc = (unsigned)(c - '0');
				for (;;) {
					size_t r = q;
					if (r < n && s[r] == '_')
						r++;
					if (r >= n || !is_digit((unsigned char)s[r]) || (c == '0' && s[r] != '0'))
						break;
					acc = acc * 10 + (unsigned)(s[r] - '0');
					if (acc > (unsigned __int128)INT64_MAX)
						kj_cfail(cs, pos, "integer literal too large (beyond 64 bits)");
					q = r + 1;
				}
			}
			struct tok *k = push_tok(cs, K_INT, pos);
			k->i = (int64_t)acc;
			pos = q;
			continue;
		}
		if (c == '_' || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')) {
			size_t q = pos;
			while (q < n && (s[q] == '_' || is_digit((unsigned char)s[q]) ||
					 ((s[q] | 0x20) >= 'a' && (s[q] | 0x20) <= 'z')))
				q++;
			if (q < n && (unsigned char)s[q] >= 0x80)
				kj_cfail(cs, pos, "non-ASCII identifiers are not supported");
			struct tok *k = push_tok(cs, K_NAME, pos);
			k->p = s + pos;
			k->n = q - pos;
			pos = q;
			continue;
		}
		if (c >= 0x80)
			kj_cfail(cs, pos, "unexpected character in tag (non-ASCII identifiers are not supported)");
		if (c == '\'' || c == '"') {
			size_t q = pos + 1;
			while (q < n && s[q] != (char)c) {
				if (s[q] == '\\' && q + 1 < n)
					q++;
				q++;
			}
			if (q >= n)
				kj_cfail(cs, pos, "unexpected char '%c' (unterminated string literal)", c);
			struct tok *k = push_tok(cs, K_STR, pos);
			decode_string(cs, k, s + pos + 1, q - pos - 1, pos);
			pos = q + 1;
			continue;
		}
		/* operators, longest first */
		int op = -1;
		size_t ol = 1;
		static const int two[] = {O_FLOORDIV, O_POW, O_EQ, O_NE, O_GTEQ, O_LTEQ};
		for (unsigned j = 0; j < sizeof two / sizeof two[0]; j++)
			if (pos + 1 < n && s[pos] == kj_op_text[two[j]][0] && s[pos + 1] == kj_op_text[two[j]][1]) {
				op = two[j];
				ol = 2;
				break;
			}
		if (op < 0)
			for (int j = 0; j <= O_SEMICOLON; j++)
				if (kj_op_text[j][1] == 0 && s[pos] == kj_op_text[j][0]) {
					op = j;
					break;
				}
		if (op < 0)
			kj_cfail(cs, pos, "unexpected char '%c'", c >= 0x20 && c < 0x7f ? c : '?');
		if (op == O_LBRACE || op == O_LPAREN || op == O_LBRACKET) {
			if (sp >= (int)sizeof stack)
				kj_cfail(cs, pos, "brackets nested deeper than %d", TM_MAX_PARSE_DEPTH);
			stack[sp++] = op == O_LBRACE ? '}' : op == O_LPAREN ? ')' : ']';
		} else if (op == O_RBRACE || op == O_RPAREN || op == O_RBRACKET) {
			if (!sp)
				kj_cfail(cs, pos, "unexpected '%c'", c);
			if (stack[--sp] != (char)c)
				kj_cfail(cs, pos, "unexpected '%c', expected '%c'", c, stack[sp]);
		}
		struct tok *k = push_tok(cs, K_OP, pos);
		k->op = (uint8_t)op;
		pos += ol;
	}
	(void)tag_off;
}

void kj_lex(struct cstate *cs)
{
	const char *s = cs->t->src;
	size_t n = cs->t->src_len, pos = 0;
	int line_starting = 1;

	while (pos < n) {
		/* find the next tag start */
		size_t q = pos;
		int kind = 0; /* '{', '%', '#' */
		while (q + 1 < n) {
			if (s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#')) {
				kind = s[q + 1];
				break;
			}
			q++;
		}
		if (!kind) {
			emit_data(cs, s + pos, n - pos, pos);
			break;
		}
		int sign = q + 2 < n && (s[q + 2] == '-' || s[q + 2] == '+') ? s[q + 2] : 0;
		size_t after = q + 2 + (sign ? 1 : 0);
		/* {% raw %} ... {% endraw %} */
		int raw = 0;
		size_t raw_end = 0;
		if (kind == '%') {
			size_t r = skip_ws(s, n, after);
			if (r + 3 <= n && !strncmp(s + r, "raw", 3)) {
				size_t e = skip_ws(s, n, r + 3);
				if (e + 2 < n && s[e] == '-' && !strncmp(s + e + 1, "%}", 2)) {
					raw = 1;
					raw_end = skip_ws(s, n, e + 3);
				} else if (e + 1 < n && !strncmp(s + e, "%}", 2)) {
					raw = 1;
					raw_end = e + 2;
				}
			}
		}
		size_t keep = strip_before(s + pos, q - pos, sign, kind == '{', line_starting);
		emit_data(cs, s + pos, keep, pos);
		if (raw) {
			line_starting = s[raw_end - 1] == '\n';
			/* body up to {%[-+]? \s* endraw \s* (+%}|-%}\s*|%}\n?) */
			size_t b = raw_end;
			for (;;) {
				size_t t = b;
				while (t + 1 < n && !(s[t] == '{' && s[t + 1] == '%'))
					t++;
				if (t + 1 >= n)
					kj_cfail(cs, q, "missing end of raw directive");
				int esign = t + 2 < n && (s[t + 2] == '-' || s[t + 2] == '+') ? s[t + 2] : 0;
				size_t r = skip_ws(s, n, t + 2 + (esign ? 1 : 0));
				if (r + 6 <= n && !strncmp(s + r, "endraw", 6)) {
					size_t e = skip_ws(s, n, r + 6), end = 0;
					if (e + 2 < n && s[e] == '+' && !strncmp(s + e + 1, "%}", 2))
						end = e + 3;
					else if (e + 2 < n && s[e] == '-' && !strncmp(s + e + 1, "%}", 2))
						end = skip_ws(s, n, e + 3);
					else if (e + 1 < n && !strncmp(s + e, "%}", 2)) {
						end = e + 2;
						if (end < n && s[end] == '\n')
							end++;
					}
					if (end) {
						size_t k2 = strip_before(s + raw_end, t - raw_end, esign, 0, line_starting);
						emit_data(cs, s + raw_end, k2, raw_end);
						line_starting = s[end - 1] == '\n';
						pos = end;
						break;
					}
				}
				b = t + 1;
			}
			continue;
		}
		if (kind == '#') {
			size_t e = after, end = 0;
			for (;;) {
				if (e + 1 >= n)
					kj_cfail(cs, q, "missing end of comment tag");
				if (s[e] == '+' && e + 2 < n && !strncmp(s + e + 1, "#}", 2)) {
					end = e + 3;
					break;
				}
				if (s[e] == '-' && e + 2 < n && !strncmp(s + e + 1, "#}", 2)) {
					end = skip_ws(s, n, e + 3);
					break;
				}
				if (s[e] == '#' && s[e + 1] == '}') {
					end = e + 2;
					if (end < n && s[end] == '\n')
						end++;
					break;
				}
				e++;
			}
			line_starting = s[end - 1] == '\n';
			pos = end;
			continue;
		}
		push_tok(cs, kind == '{' ? K_VBEGIN : K_BBEGIN, q);
		pos = lex_tag(cs, after, kind == '%', &line_starting, q);
	}
	push_tok(cs, K_EOF, n);
}
