/*
 * template.c - chat templates: a Jinja subset interpreter and the chat
 * renderer that reports message boundaries (template.h).
 *
 * What it renders. The chat_template of a tokenizer_config.json, the way
 * Hugging Face renders it: jinja2.sandbox.ImmutableSandboxedEnvironment
 * with trim_blocks, lstrip_blocks and the loopcontrols extension, `tojson`
 * replaced by json.dumps(x, ensure_ascii=False, indent=None) (so key order
 * is kept and the separators are ", " and ": "), and the globals
 * raise_exception and strftime_now. The output is meant to be byte for
 * byte what Python's jinja2 produces; tests/ref/template_oracle.sh checks
 * that against Debian's python3-jinja2.
 *
 * The supported subset (docs/templates.md lists it with examples):
 *   tags        if/elif/else, for (with `if` filter, else, loop.*),
 *               set (names, tuples, namespace attributes, set blocks),
 *               macro (defaults, keyword arguments), filter blocks, with,
 *               raw, break/continue, generation (HF), print, comments
 *   expressions literals (str, int, float, list, tuple, dict, true/false/
 *               none), attribute and item access, slices with steps,
 *               calls, filters, tests, not/and/or, comparisons (chained),
 *               in / not in, + - * / // % **, ~, `a if c else b`
 *   values      Python semantics: truthiness, str()/repr() formatting,
 *               int/float arithmetic, code-point string indexing, and
 *               Jinja's default Undefined (prints as "", iterates as
 *               empty, raises on attribute access and arithmetic).
 * Anything outside the subset (extends/include/import, call blocks,
 * recursive loops, unknown filters or tests, Python methods we do not
 * implement) is an error naming the template, line and column, never a
 * silent wrong render.
 *
 * How it runs. The source is lexed (whitespace control applied there, as
 * Jinja's lexer does) and parsed into an AST once per template. A render
 * walks the AST. Every value made during a render lives in a render arena
 * freed in one go at the end; values are immutable (the sandbox forbids
 * mutating lists and dicts) except namespace objects, so sharing is free.
 * Runtime errors unwind with longjmp to the render entry point: all memory
 * they could leak is in the arena, so one jump cleans everything up.
 *
 * Caps, so a template can never hang or exhaust memory: statements + loop
 * iterations + filter items per render (steps), output bytes, arena bytes,
 * nesting depth of evaluation (C stack), macro recursion, container depth
 * for repr/tojson/comparisons, and range() length (100000, the sandbox's
 * own limit). Each produces an error that names the cap.
 *
 * Thread-safety: a compiled template is read-only after kv_tmpl_compile
 * and may be rendered from several threads at once.
 */
#include "text/template.h"
#include "model/gguf_model.h"
#include "base/buf.h"
#include "base/err.h"
#include "base/io.h"
#include "base/json.h"
#include "base/log.h"
#include "base/map.h"
#include "base/mem.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <unistd.h>
#include <sys/random.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

/* ------------------------------------------------------------------------
 * Limits
 * ---------------------------------------------------------------------- */

#define TM_DEFAULT_MAX_STEPS   (4u * 1000 * 1000)   /* statements + iterations */
#define TM_DEFAULT_MAX_OUTPUT  (64u << 20)          /* bytes of rendered text */
#define TM_DEFAULT_MAX_MEMORY  (512u << 20)         /* arena bytes per render */
#define TM_MAX_EVAL_DEPTH      1000                 /* nested eval/exec calls */
#define TM_MAX_MACRO_DEPTH     100                  /* nested macro calls */
#define TM_MAX_PARSE_DEPTH     200                  /* nested expressions/blocks */
#define TM_MAX_VALUE_DEPTH     200                  /* repr/tojson/== nesting */
#define TM_MAX_RANGE           100000               /* jinja2.sandbox.MAX_RANGE */
#define TM_MAX_SOURCE          (16u << 20)          /* template source bytes */

/* ------------------------------------------------------------------------
 * Arena: bump allocation in chunks, freed all at once. `cap` bounds the
 * bytes a render may hold (0 = no bound).
 * ---------------------------------------------------------------------- */

struct achunk {
	struct achunk *next;
	size_t size, off;
	max_align_t data[];
};

struct arena {
	struct achunk *head;
	size_t total;   /* bytes in all chunks */
	size_t cap;     /* 0 = unbounded */
};

static void ar_free(struct arena *a)
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
static void *ar_alloc_raw(struct arena *a, size_t n)
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
static int ar_contains(const struct arena *a, const void *p)
{
	for (const struct achunk *c = a->head; c; c = c->next)
		if ((const char *)p >= (const char *)c->data && (const char *)p < (const char *)c->data + c->size)
			return 1;
	return 0;
}

/* ------------------------------------------------------------------------
 * UTF-8 and Python character classes
 * ---------------------------------------------------------------------- */

/* Decode one code point at p (n bytes left). Returns its length, or 0 if
 * the bytes are not valid UTF-8 (overlong, surrogate, truncated). */
static int u8_dec(const char *p, size_t n, int32_t *cp)
{
	const unsigned char *s = (const unsigned char *)p;
	if (n == 0)
		return 0;
	if (s[0] < 0x80) {
		*cp = s[0];
		return 1;
	}
	if (s[0] >= 0xC2 && s[0] <= 0xDF) {
		if (n < 2 || (s[1] & 0xC0) != 0x80)
			return 0;
		*cp = ((s[0] & 0x1F) << 6) | (s[1] & 0x3F);
		return 2;
	}
	if (s[0] >= 0xE0 && s[0] <= 0xEF) {
		if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80)
			return 0;
		*cp = ((s[0] & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F);
		if (*cp < 0x800 || (*cp >= 0xD800 && *cp <= 0xDFFF))
			return 0;
		return 3;
	}
	if (s[0] >= 0xF0 && s[0] <= 0xF4) {
		if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
			return 0;
		*cp = ((s[0] & 0x07) << 18) | ((s[1] & 0x3F) << 12) | ((s[2] & 0x3F) << 6) | (s[3] & 0x3F);
		if (*cp < 0x10000 || *cp > 0x10FFFF)
			return 0;
		return 4;
	}
	return 0;
}

/* Length of the code point starting at p in text already known to be
 * valid UTF-8 (1 for a stray byte, so loops always advance). */
static inline int u8_len(const char *p, size_t n)
{
	unsigned char c = (unsigned char)*p;
	int l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
	return (size_t)l <= n ? l : 1;
}

static int u8_enc(int32_t cp, char *out)
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xC0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xE0 | (cp >> 12));
		out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
		out[2] = (char)(0x80 | (cp & 0x3F));
		return 3;
	}
	out[0] = (char)(0xF0 | (cp >> 18));
	out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
	out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
	out[3] = (char)(0x80 | (cp & 0x3F));
	return 4;
}

/* Byte offset of the first invalid UTF-8 sequence, or -1. */
static long u8_invalid_at(const char *p, size_t n)
{
	size_t i = 0;
	while (i < n) {
		int32_t cp;
		if ((unsigned char)p[i] < 0x80) {
			i++;
			continue;
		}
		int l = u8_dec(p + i, n - i, &cp);
		if (!l)
			return (long)i;
		i += (size_t)l;
	}
	return -1;
}

static size_t u8_count(const char *p, size_t n)
{
	size_t c = 0;
	for (size_t i = 0; i < n; i++)
		c += ((unsigned char)p[i] & 0xC0) != 0x80;
	return c;
}

/* Python's str.isspace() (and the \s of re on str patterns). */
static int py_isspace(int32_t c)
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

static int py_isalpha(int32_t c)
{
	if (c < 0x80)
		return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
	int k = utf8proc_category(c);
	return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

static int py_isdigit(int32_t c)
{
	if (c < 0x80)
		return c >= '0' && c <= '9';
	return utf8proc_category(c) == UTF8PROC_CATEGORY_ND;
}

static int py_isalnum(int32_t c)
{
	if (py_isalpha(c) || py_isdigit(c))
		return 1;
	if (c < 0x80)
		return 0;
	int k = utf8proc_category(c);
	return k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* Cased characters (Lu, Ll, Lt) for islower/isupper/title. */
static int py_iscased(int32_t c)
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
static int special_casing(int32_t c)
{
	return c == 0xDF || c == 0x130 || c == 0x149 || c == 0x1F0 || c == 0x390 || c == 0x3B0 ||
	       c == 0x587 || (c >= 0x1E96 && c <= 0x1E9A) || (c >= 0x1F50 && c <= 0x1F56 && !(c & 1)) ||
	       (c >= 0x1F80 && c <= 0x1FAF) || (c >= 0x1FB2 && c <= 0x1FB4) || c == 0x1FB6 || c == 0x1FB7 ||
	       c == 0x1FBC || (c >= 0x1FC2 && c <= 0x1FC4) || c == 0x1FC6 || c == 0x1FC7 || c == 0x1FCC ||
	       c == 0x1FD2 || c == 0x1FD3 || c == 0x1FD6 || c == 0x1FD7 || (c >= 0x1FE2 && c <= 0x1FE4) ||
	       c == 0x1FE6 || c == 0x1FE7 || (c >= 0x1FF2 && c <= 0x1FF4) || c == 0x1FF6 || c == 0x1FF7 ||
	       c == 0x1FFC || (c >= 0xFB00 && c <= 0xFB06) || (c >= 0xFB13 && c <= 0xFB17) || c == 0x3A3;
}

/* ------------------------------------------------------------------------
 * Values
 * ---------------------------------------------------------------------- */

enum vkind {
	V_UNDEF = 0, /* Jinja's default Undefined; u.s names what was missing */
	V_NONE,
	V_BOOL,
	V_INT,
	V_FLOAT,
	V_STR,       /* UTF-8 bytes, not NUL-terminated; `safe` marks Markup */
	V_LIST,      /* list, tuple, iterator or dict view (see enum lkind) */
	V_DICT,
	V_NS,        /* namespace(): the one mutable object */
	V_MACRO,
	V_FUNC,      /* a global function (range, namespace, ...) */
	V_METHOD,    /* a bound method of a str/dict/list value */
	V_LOOP,      /* the `loop` object of a for loop */
	V_MISSING,   /* internal: an argument that was not passed */
};

/* What a V_LIST is, which decides printing, len() and indexing. */
enum lkind {
	L_LIST = 0,
	L_TUPLE,
	L_ITER,      /* generator/iterator (select, map, reverse, items ...):
	                no len(), no indexing, always true, not printable */
	L_ITEMS,     /* dict.items() / keys() / values() views */
	L_KEYS,
	L_VALUES,
	L_RANGE,
};

struct list;
struct dict;
struct ns;
struct macro;
struct method;
struct loopobj;

struct val {
	uint8_t t;      /* enum vkind */
	uint8_t safe;   /* V_STR: Markup (from |safe, |e, |tojson of Markup) */
	uint16_t fn;    /* V_FUNC / V_METHOD: builtin id */
	uint8_t bigint; /* V_STR: an integer beyond int64 from the request's JSON (its
			   digits): str() and tojson print it bare, as Python's int */
	uint8_t pad[3];
	union {
		int64_t i;  /* V_INT, V_BOOL (0/1) */
		double f;
		struct {
			const char *p;
			size_t n;
		} s;        /* V_STR; V_UNDEF: name hint (p may be NULL) */
		struct list *l;
		struct dict *d;
		struct ns *ns;
		struct macro *m;
		struct method *me;
		struct loopobj *lo;
	} u;
};

struct list {
	size_t n;
	uint8_t kind;           /* enum lkind */
	int64_t r0, r1, rs;     /* L_RANGE: start, stop, step (for repr) */
	struct val v[];
};

/* Ordered dict. Small dicts are scanned; larger ones carry an open
 * addressing index of slot numbers (keys hashed Python-style so that
 * 1, 1.0 and true are the same key). */
struct dict {
	size_t n, cap;
	struct val *k, *v;
	uint32_t *idx;          /* NULL or idx_cap slots, 0 = empty, else i+1 */
	size_t idx_cap;
};

struct ns {
	struct dict *d;
};

struct node;
struct scope;

struct macro {
	const struct node *def;
	struct scope *closure;
};

struct method {
	struct val self;
};

struct loopobj {
	const struct list *items;
	size_t i;               /* index0 of the current item */
	int depth;              /* 1 for the outermost loop */
};

static const struct val VNONE = {.t = V_NONE};
static const struct val VMISSING = {.t = V_MISSING};

static inline struct val vbool(int b)
{
	struct val v = {.t = V_BOOL};
	v.u.i = b != 0;
	return v;
}
static inline struct val vint(int64_t i)
{
	struct val v = {.t = V_INT};
	v.u.i = i;
	return v;
}
static inline struct val vfloat(double f)
{
	struct val v = {.t = V_FLOAT};
	v.u.f = f;
	return v;
}
static inline struct val vstr(const char *p, size_t n)
{
	struct val v = {.t = V_STR};
	v.u.s.p = p;
	v.u.s.n = n;
	return v;
}
static inline struct val vundef(const char *name)
{
	struct val v = {.t = V_UNDEF};
	v.u.s.p = name;
	v.u.s.n = name ? strlen(name) : 0;
	return v;
}
static inline struct val vlist(struct list *l)
{
	struct val v = {.t = V_LIST};
	v.u.l = l;
	return v;
}
static inline struct val vdict(struct dict *d)
{
	struct val v = {.t = V_DICT};
	v.u.d = d;
	return v;
}

static inline int is_num(const struct val *v)
{
	return v->t == V_INT || v->t == V_FLOAT || v->t == V_BOOL;
}
static inline int is_intlike(const struct val *v)
{
	return v->t == V_INT || v->t == V_BOOL;
}
static inline double num_f(const struct val *v)
{
	return v->t == V_FLOAT ? v->u.f : (double)v->u.i;
}
/* A list value that supports len() and indexing. */
static inline int is_seq_list(const struct val *v)
{
	return v->t == V_LIST && (v->u.l->kind == L_LIST || v->u.l->kind == L_TUPLE || v->u.l->kind == L_RANGE);
}

static const char *kind_name(const struct val *v)
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
 * AST
 * ---------------------------------------------------------------------- */

enum nkind {
	/* statements */
	N_DATA,      /* s: text */
	N_PRINT,     /* a: expression */
	N_IF,        /* a: test, v: body, w: else body (elif = nested N_IF) */
	N_FOR,       /* tg: target, a: iterable, b: filter or NULL, v: body, w: else */
	N_SET,       /* tg: target, a: value */
	N_SETBLOCK,  /* tg: target, v: body, c: filter chain over N_BLOCKVAL or NULL */
	N_MACRO,     /* sym: name, tg: params, w: defaults (last nw params), v: body */
	N_BREAK,
	N_CONTINUE,
	N_FILTERBLK, /* v: body, c: filter chain over N_BLOCKVAL */
	N_WITH,      /* tg: names, w: values, v: body */
	N_SCOPE,     /* v: body rendered in its own scope ({% generation %}) */
	/* expressions */
	N_CONST,     /* k */
	N_NAME,      /* sym, s */
	N_GETATTR,   /* a: object, s: attribute */
	N_GETITEM,   /* a: object, b: key or N_SLICE */
	N_SLICE,     /* a, b, c: start, stop, step (each may be NULL) */
	N_CALL,      /* a: callee, v: args, w: kwarg values, kwn: kwarg names */
	N_FILTER,    /* a: operand, fid, s: name, v/w/kwn: arguments */
	N_TEST,      /* a: operand, fid, s: name, v/w/kwn: arguments */
	N_NOT,       /* a */
	N_NEG,       /* a */
	N_POS,       /* a */
	N_BIN,       /* op, a, b */
	N_CONCAT,    /* v: operands */
	N_CMP,       /* a: first, v: operands, ops: one per operand */
	N_AND,       /* a, b */
	N_OR,        /* a, b */
	N_COND,      /* a: test, b: if true, c: if false or NULL */
	N_LIST,      /* v */
	N_TUPLE,     /* v */
	N_DICT,      /* v: keys, w: values */
	N_BLOCKVAL,  /* the captured body of a set/filter block */
};

enum binop { B_ADD, B_SUB, B_MUL, B_DIV, B_FLOORDIV, B_MOD, B_POW };
enum cmpop { C_EQ, C_NE, C_LT, C_LE, C_GT, C_GE, C_IN, C_NOTIN };

/* An assignment target: names, or one namespace attribute (ns.attr). */
struct target {
	int n;                  /* names (>1: tuple unpacking) */
	int *syms;
	const char **names;
	int tuple;              /* written as a tuple ("a," or "a, b") */
	int ns_attr;            /* 1: syms[0] is the namespace, attr below */
	const char *attr;
};

struct node {
	uint8_t kind;           /* enum nkind */
	uint8_t op;             /* enum binop for N_BIN */
	uint16_t fid;           /* filter or test id */
	int line, col;
	int sym;                /* N_NAME, N_MACRO */
	struct node *a, *b, *c;
	struct node **v, **w;
	int nv, nw;
	const char **kwn;       /* keyword names, nw of them (calls) */
	uint8_t *ops;           /* N_CMP */
	struct target *tg;
	const char *s;          /* text, name or attribute */
	size_t sn;
	struct val k;           /* N_CONST */
	uint8_t varargs, kwargs;/* N_MACRO: body uses varargs / kwargs */
	int16_t mid[5];         /* N_GETATTR: method id of the name on str, dict,
	                           list, tuple, loop (-1: none), found at parse time */
};

/* ------------------------------------------------------------------------
 * Builtin tables: filters, tests, global functions, methods
 * ---------------------------------------------------------------------- */

enum filt {
	F_ABS, F_ATTR, F_BATCH, F_CAPITALIZE, F_CENTER, F_COUNT, F_D, F_DEFAULT, F_DICTSORT, F_E, F_ESCAPE,
	F_FIRST, F_FLOAT, F_FORCEESCAPE, F_FORMAT, F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH,
	F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND,
	F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE, F_TOJSON, F_TRIM, F_TRUNCATE,
	F_UNIQUE, F_UPPER, F_WORDCOUNT, F_STRIPTAGS, F_SLICE, F_GROUPBY, F_FILESIZEFORMAT, F_PPRINT,
	F_RANDOM, F_URLENCODE, F_URLIZE, F_WORDWRAP, F_XMLATTR,
	F__COUNT
};
/* Jinja's builtin filter names; ids past F_STRIPTAGS are known to Jinja but
 * not supported here (a compile-time error says so). */
static const char *const filt_names[F__COUNT] = {
	"abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape",
	"first", "float", "forceescape", "format", "indent", "int", "items", "join", "last", "length",
	"list", "lower", "map", "max", "min", "reject", "rejectattr", "replace", "reverse", "round",
	"safe", "select", "selectattr", "sort", "string", "sum", "title", "tojson", "trim", "truncate",
	"unique", "upper", "wordcount", "striptags", "slice", "groupby", "filesizeformat", "pprint",
	"random", "urlencode", "urlize", "wordwrap", "xmlattr",
};
#define F_FIRST_UNSUPPORTED F_STRIPTAGS

enum test {
	T_ODD, T_EVEN, T_DIVISIBLEBY, T_DEFINED, T_UNDEFINED, T_FILTER, T_TEST, T_NONE, T_BOOLEAN, T_FALSE,
	T_TRUE, T_INTEGER, T_FLOAT, T_LOWER, T_UPPER, T_STRING, T_MAPPING, T_NUMBER, T_SEQUENCE,
	T_ITERABLE, T_CALLABLE, T_SAMEAS, T_ESCAPED, T_IN, T_EQ1, T_EQ2, T_EQ3, T_NE1, T_NE2, T_GT1, T_GT2,
	T_GT3, T_GE1, T_GE2, T_LT1, T_LT2, T_LT3, T_LE1, T_LE2,
	T__COUNT
};
static const char *const test_names[T__COUNT] = {
	"odd", "even", "divisibleby", "defined", "undefined", "filter", "test", "none", "boolean", "false",
	"true", "integer", "float", "lower", "upper", "string", "mapping", "number", "sequence",
	"iterable", "callable", "sameas", "escaped", "in", "==", "eq", "equalto", "!=", "ne", ">", "gt",
	"greaterthan", ">=", "ge", "<", "lt", "lessthan", "<=", "le",
};

enum gfn { G_RANGE, G_NAMESPACE, G_RAISE, G_STRFTIME, G_DICT, G_LIPSUM, G_CYCLER, G_JOINER, G__COUNT };
static const char *const gfn_names[G__COUNT] = {
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

static int find_name(const char *const *tab, int n, const char *s, size_t len)
{
	for (int i = 0; i < n; i++)
		if (tab[i] && strlen(tab[i]) == len && !memcmp(tab[i], s, len))
			return i;
	return -1;
}

/* Method id for a name on an object of the given kind, or -1. */
static int meth_lookup(int vkind, int lkind, const char *s, size_t n)
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
 * The compiled template
 * ---------------------------------------------------------------------- */

struct kv_tmpl {
	struct arena ar;        /* AST, tokens, strings, symbol names */
	char *src;              /* normalised source (arena) */
	size_t src_len;
	size_t *lines;          /* byte offset of each line start */
	int n_lines;
	struct node **body;
	int n_body;
	struct kv_map *syms;    /* name -> symbol id */
	const char **sym_names;
	int n_syms, cap_syms;
	int sym_loop, sym_varargs, sym_kwargs;
	char what[96];
};

static void pos_of(const struct kv_tmpl *t, size_t off, int *line, int *col)
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
	*col = (int)u8_count(t->src + t->lines[lo], off - t->lines[lo]) + 1;
}

/* ------------------------------------------------------------------------
 * Lexer
 *
 * Mirrors jinja2.lexer with trim_blocks and lstrip_blocks on:
 *  - newlines (\r\n, \r, \n) become \n and one trailing newline of the
 *    source is dropped (keep_trailing_newline=False);
 *  - "{%-", "{{-", "{#-" strip all whitespace before the tag, "-%}",
 *    "-}}", "-#}" all whitespace after it;
 *  - trim_blocks: a block or comment tag eats one newline right after it;
 *  - lstrip_blocks: spaces/tabs between a line start and a block or
 *    comment tag are removed ("{%+" turns that off);
 *  - inside tags, "}}"/"%}" end the tag only while no bracket is open.
 * ---------------------------------------------------------------------- */

enum tkind { K_EOF, K_DATA, K_VBEGIN, K_VEND, K_BBEGIN, K_BEND, K_NAME, K_STR, K_INT, K_FLOAT, K_OP };
enum opk {
	O_ADD, O_SUB, O_DIV, O_FLOORDIV, O_MUL, O_MOD, O_POW, O_TILDE, O_LBRACKET, O_RBRACKET, O_LPAREN,
	O_RPAREN, O_LBRACE, O_RBRACE, O_EQ, O_NE, O_GT, O_GTEQ, O_LT, O_LTEQ, O_ASSIGN, O_DOT, O_COLON,
	O_PIPE, O_COMMA, O_SEMICOLON,
};
static const char *const op_text[] = {
	"+", "-", "/", "//", "*", "%", "**", "~", "[", "]", "(", ")", "{", "}", "==", "!=", ">", ">=", "<",
	"<=", "=", ".", ":", "|", ",", ";",
};

struct tok {
	uint8_t t;      /* enum tkind */
	uint8_t op;     /* enum opk */
	size_t off;     /* byte offset in the normalised source */
	const char *p;  /* K_DATA/K_NAME: text; K_STR: decoded value */
	size_t n;
	int64_t i;
	double f;
};

struct cstate {             /* lexer + parser state */
	struct kv_tmpl *t;
	jmp_buf jb;
	int err;
	struct tok *tk;
	size_t nt, cap;
	size_t i;               /* parser position */
	int depth;              /* expression/block nesting */
	int loops;              /* enclosing for loops (break/continue) */
	int macros;             /* enclosing macro definitions */
};

static void __attribute__((noreturn, format(printf, 3, 4)))
cfail(struct cstate *cs, size_t off, const char *fmt, ...)
{
	char msg[600];
	va_list ap;
	int line, col;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	pos_of(cs->t, off, &line, &col);
	cs->err = kv_fail(cs->err ? cs->err : KV_ERR_INVALID, "%s: line %d column %d: %s", cs->t->what, line,
			  col, msg);
	longjmp(cs->jb, 1);
}

static void __attribute__((noreturn)) cnomem(struct cstate *cs)
{
	cs->err = kv_fail(KV_ERR_NOMEM, "%s: out of memory while compiling", cs->t->what);
	longjmp(cs->jb, 1);
}

static void *calloc_c(struct cstate *cs, size_t n)
{
	void *p = ar_alloc_raw(&cs->t->ar, n);
	if (!p)
		cnomem(cs);
	memset(p, 0, n);
	return p;
}

static struct tok *push_tok(struct cstate *cs, int t, size_t off)
{
	if (cs->nt == cs->cap) {
		size_t nc = cs->cap ? cs->cap * 2 : 256;
		struct tok *n = ar_alloc_raw(&cs->t->ar, nc * sizeof *n);
		if (!n)
			cnomem(cs);
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
	int l = u8_dec(s + pos, n - pos, &cp);
	return l && py_isspace(cp) ? l : 0;
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
		if (!u8_dec(p + b, len - b, &cp) || !py_isspace(cp))
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

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Decode a string literal body the way Jinja does (Python's
 * unicode-escape after backslashreplace). */
static void decode_string(struct cstate *cs, struct tok *k, const char *p, size_t n, size_t off)
{
	char *out = calloc_c(cs, n * 3 + 4), *o = out;
	size_t i = 0;
	while (i < n) {
		if (p[i] != '\\') {
			*o++ = p[i++];
			continue;
		}
		i++;
		if (i >= n)
			cfail(cs, off, "string literal ends with a backslash");
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
		case 'N': cfail(cs, off, "\\N{...} escapes are not supported");
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
				int l = u8_dec(p + i, n - i, &u);
				if (!l)
					cfail(cs, off, "invalid UTF-8 in string literal");
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
				int h = i < n ? hexval((unsigned char)p[i]) : -1;
				if (h < 0)
					cfail(cs, off, "truncated \\%c escape in string literal", c);
				cp = cp * 16 + h;
				i++;
			}
		}
		if (cp > 0x10FFFF || cp < 0)
			cfail(cs, off, "illegal Unicode character in string literal");
		if (cp >= 0xD800 && cp <= 0xDFFF)
			cfail(cs, off, "surrogate code point U+%04X in string literal cannot be rendered", (unsigned)cp);
		o += u8_enc(cp, o);
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
					int h = r < n ? hexval((unsigned char)s[r]) : -1;
					if (h < 0 || h >= base)
						break;
					acc = acc * (unsigned)base + (unsigned)h;
					if (acc > (unsigned __int128)INT64_MAX)
						cfail(cs, pos, "integer literal too large (beyond 64 bits)");
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
						cfail(cs, pos, "integer literal too large (beyond 64 bits)");
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
				cfail(cs, pos, "non-ASCII identifiers are not supported");
			struct tok *k = push_tok(cs, K_NAME, pos);
			k->p = s + pos;
			k->n = q - pos;
			pos = q;
			continue;
		}
		if (c >= 0x80)
			cfail(cs, pos, "unexpected character in tag (non-ASCII identifiers are not supported)");
		if (c == '\'' || c == '"') {
			size_t q = pos + 1;
			while (q < n && s[q] != (char)c) {
				if (s[q] == '\\' && q + 1 < n)
					q++;
				q++;
			}
			if (q >= n)
				cfail(cs, pos, "unexpected char '%c' (unterminated string literal)", c);
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
			if (pos + 1 < n && s[pos] == op_text[two[j]][0] && s[pos + 1] == op_text[two[j]][1]) {
				op = two[j];
				ol = 2;
				break;
			}
		if (op < 0)
			for (int j = 0; j <= O_SEMICOLON; j++)
				if (op_text[j][1] == 0 && s[pos] == op_text[j][0]) {
					op = j;
					break;
				}
		if (op < 0)
			cfail(cs, pos, "unexpected char '%c'", c >= 0x20 && c < 0x7f ? c : '?');
		if (op == O_LBRACE || op == O_LPAREN || op == O_LBRACKET) {
			if (sp >= (int)sizeof stack)
				cfail(cs, pos, "brackets nested deeper than %d", TM_MAX_PARSE_DEPTH);
			stack[sp++] = op == O_LBRACE ? '}' : op == O_LPAREN ? ')' : ']';
		} else if (op == O_RBRACE || op == O_RPAREN || op == O_RBRACKET) {
			if (!sp)
				cfail(cs, pos, "unexpected '%c'", c);
			if (stack[--sp] != (char)c)
				cfail(cs, pos, "unexpected '%c', expected '%c'", c, stack[sp]);
		}
		struct tok *k = push_tok(cs, K_OP, pos);
		k->op = (uint8_t)op;
		pos += ol;
	}
	(void)tag_off;
}

static void lex(struct cstate *cs)
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
					cfail(cs, q, "missing end of raw directive");
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
					cfail(cs, q, "missing end of comment tag");
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

/* ------------------------------------------------------------------------
 * Parser (jinja2.parser's grammar and precedence)
 * ---------------------------------------------------------------------- */

struct nvec {
	struct node **v;
	int n, cap;
};

static void nv_push(struct cstate *cs, struct nvec *nv, struct node *x)
{
	if (nv->n == nv->cap) {
		int nc = nv->cap ? nv->cap * 2 : 8;
		struct node **p = ar_alloc_raw(&cs->t->ar, (size_t)nc * sizeof *p);
		if (!p)
			cnomem(cs);
		if (nv->n)
			memcpy(p, nv->v, (size_t)nv->n * sizeof *p);
		nv->v = p;
		nv->cap = nc;
	}
	nv->v[nv->n++] = x;
}

static struct tok *cur(struct cstate *cs)
{
	return &cs->tk[cs->i];
}

static struct tok *look(struct cstate *cs)
{
	return cs->i + 1 < cs->nt ? &cs->tk[cs->i + 1] : &cs->tk[cs->nt - 1];
}

static struct tok *next_tok(struct cstate *cs)
{
	struct tok *k = &cs->tk[cs->i];
	if (cs->i + 1 < cs->nt)
		cs->i++;
	return k;
}

static int tok_is_name(const struct tok *k, const char *name)
{
	return k->t == K_NAME && k->n == strlen(name) && !memcmp(k->p, name, k->n);
}

static int tok_is_op(const struct tok *k, int op)
{
	return k->t == K_OP && k->op == op;
}

static const char *describe(const struct tok *k, char *buf, size_t cap)
{
	switch (k->t) {
	case K_EOF: return "end of template";
	case K_DATA: return "template data";
	case K_VBEGIN: return "begin of print statement";
	case K_VEND: return "end of print statement";
	case K_BBEGIN: return "begin of statement block";
	case K_BEND: return "end of statement block";
	case K_NAME: snprintf(buf, cap, "%.*s", (int)(k->n > 60 ? 60 : k->n), k->p); return buf;
	case K_STR: return "string";
	case K_INT: return "integer";
	case K_FLOAT: return "float";
	case K_OP: return op_text[k->op];
	}
	return "?";
}

static void __attribute__((noreturn)) unexpected(struct cstate *cs, const char *expected)
{
	char b[80];
	struct tok *k = cur(cs);
	if (k->t == K_EOF)
		cfail(cs, k->off, "unexpected end of template%s%s", expected ? ", expected " : "",
		      expected ? expected : "");
	cfail(cs, k->off, "unexpected '%s'%s%s", describe(k, b, sizeof b), expected ? ", expected " : "",
	      expected ? expected : "");
}

static void expect_op(struct cstate *cs, int op)
{
	char want[16];
	if (!tok_is_op(cur(cs), op)) {
		snprintf(want, sizeof want, "'%s'", op_text[op]);
		unexpected(cs, want);
	}
	next_tok(cs);
}

static void expect_kind(struct cstate *cs, int kind, const char *what)
{
	if (cur(cs)->t != kind)
		unexpected(cs, what);
	next_tok(cs);
}

static struct tok *expect_name(struct cstate *cs)
{
	if (cur(cs)->t != K_NAME)
		unexpected(cs, "a name");
	return next_tok(cs);
}

static struct node *mk(struct cstate *cs, int kind, const struct tok *at)
{
	struct node *x = calloc_c(cs, sizeof *x);
	x->kind = (uint8_t)kind;
	pos_of(cs->t, at->off, &x->line, &x->col);
	return x;
}

static const char *dup_name(struct cstate *cs, const char *p, size_t n)
{
	char *s = calloc_c(cs, n + 1);
	memcpy(s, p, n);
	return s;
}

static int intern(struct cstate *cs, const char *p, size_t n)
{
	struct kv_tmpl *t = cs->t;
	uint64_t id;
	if (kv_map_get(t->syms, p, n, &id))
		return (int)id;
	if (t->n_syms == t->cap_syms) {
		int nc = t->cap_syms ? t->cap_syms * 2 : 32;
		const char **v = ar_alloc_raw(&t->ar, (size_t)nc * sizeof *v);
		if (!v)
			cnomem(cs);
		if (t->n_syms)
			memcpy(v, t->sym_names, (size_t)t->n_syms * sizeof *v);
		t->sym_names = v;
		t->cap_syms = nc;
	}
	t->sym_names[t->n_syms] = dup_name(cs, p, n);
	if (kv_map_put(t->syms, p, n, (uint64_t)t->n_syms))
		cnomem(cs);
	return t->n_syms++;
}

static void depth_in(struct cstate *cs)
{
	if (++cs->depth > TM_MAX_PARSE_DEPTH)
		cfail(cs, cur(cs)->off, "expression or blocks nested deeper than %d", TM_MAX_PARSE_DEPTH);
}

static struct node *p_expression(struct cstate *cs, int with_condexpr);
static struct node *p_tuple(struct cstate *cs, int simplified, int with_condexpr, const char *extra_end,
			    int explicit_paren);
static struct node *p_unary(struct cstate *cs, int with_filter);
static struct node *p_primary(struct cstate *cs);
static struct node *p_postfix(struct cstate *cs, struct node *x);
static struct node *p_filter(struct cstate *cs, struct node *x, int start_inline);

/* Call arguments: positional, then keyword ones (star-args and
 * double-star-kwargs are not supported). Fills v/nv (positional) and w/nw/kwn (keywords). */
static void p_call_args(struct cstate *cs, struct node *x)
{
	struct nvec pos = {0}, kw = {0};
	const char *names[64];
	int nk = 0, need_comma = 0;
	expect_op(cs, O_LPAREN);
	while (!tok_is_op(cur(cs), O_RPAREN)) {
		if (need_comma) {
			expect_op(cs, O_COMMA);
			if (tok_is_op(cur(cs), O_RPAREN))
				break;
		}
		if (tok_is_op(cur(cs), O_MUL) || tok_is_op(cur(cs), O_POW))
			cs->err = KV_ERR_UNSUPPORTED,
			cfail(cs, cur(cs)->off, "*args and **kwargs in calls are not supported");
		if (cur(cs)->t == K_NAME && tok_is_op(look(cs), O_ASSIGN)) {
			struct tok *k = next_tok(cs);
			next_tok(cs);
			if (nk == 64)
				cfail(cs, k->off, "too many keyword arguments");
			names[nk++] = dup_name(cs, k->p, k->n);
			nv_push(cs, &kw, p_expression(cs, 1));
		} else {
			if (kw.n)
				cfail(cs, cur(cs)->off, "invalid syntax for function call expression");
			nv_push(cs, &pos, p_expression(cs, 1));
		}
		need_comma = 1;
	}
	expect_op(cs, O_RPAREN);
	x->v = pos.v;
	x->nv = pos.n;
	x->w = kw.v;
	x->nw = kw.n;
	if (nk) {
		x->kwn = calloc_c(cs, (size_t)nk * sizeof *x->kwn);
		memcpy(x->kwn, names, (size_t)nk * sizeof *names);
	}
}

static struct node *p_filter(struct cstate *cs, struct node *x, int start_inline)
{
	while (tok_is_op(cur(cs), O_PIPE) || start_inline) {
		if (!start_inline)
			next_tok(cs);
		struct tok *k = expect_name(cs);
		struct node *f = mk(cs, N_FILTER, k);
		int id = find_name(filt_names, F__COUNT, k->p, k->n);
		if (tok_is_op(cur(cs), O_DOT) || id < 0)
			cfail(cs, k->off, "no filter named '%.*s'", (int)(k->n > 60 ? 60 : k->n), k->p);
		if (id >= F_FIRST_UNSUPPORTED) {
			cs->err = KV_ERR_UNSUPPORTED;
			cfail(cs, k->off, "filter '%s' is not supported", filt_names[id]);
		}
		f->fid = (uint16_t)id;
		f->s = filt_names[id];
		f->a = x;
		if (tok_is_op(cur(cs), O_LPAREN))
			p_call_args(cs, f);
		x = f;
		start_inline = 0;
	}
	return x;
}

static struct node *p_test(struct cstate *cs, struct node *x)
{
	struct tok *is = next_tok(cs);
	int negated = 0;
	if (tok_is_name(cur(cs), "not")) {
		next_tok(cs);
		negated = 1;
	}
	struct tok *k = expect_name(cs);
	int id = find_name(test_names, T__COUNT, k->p, k->n);
	if (tok_is_op(cur(cs), O_DOT) || id < 0)
		cfail(cs, k->off, "no test named '%.*s'", (int)(k->n > 60 ? 60 : k->n), k->p);
	struct node *t = mk(cs, N_TEST, is);
	t->fid = (uint16_t)id;
	t->s = test_names[id];
	t->a = x;
	struct tok *c = cur(cs);
	if (tok_is_op(c, O_LPAREN)) {
		p_call_args(cs, t);
	} else if ((c->t == K_NAME || c->t == K_STR || c->t == K_INT || c->t == K_FLOAT ||
		    tok_is_op(c, O_LBRACKET) || tok_is_op(c, O_LBRACE)) &&
		   !tok_is_name(c, "else") && !tok_is_name(c, "or") && !tok_is_name(c, "and")) {
		if (tok_is_name(c, "is"))
			cfail(cs, c->off, "you cannot chain multiple tests with is");
		struct node *arg = p_postfix(cs, p_primary(cs));
		t->v = calloc_c(cs, sizeof *t->v);
		t->v[0] = arg;
		t->nv = 1;
	}
	if (negated) {
		struct node *n = mk(cs, N_NOT, is);
		n->a = t;
		return n;
	}
	return t;
}

static struct node *p_subscribed(struct cstate *cs)
{
	struct tok *at = cur(cs);
	struct node *args[3] = {NULL, NULL, NULL};
	if (tok_is_op(cur(cs), O_COLON)) {
		next_tok(cs);
	} else {
		struct node *e = p_expression(cs, 1);
		if (!tok_is_op(cur(cs), O_COLON))
			return e;
		next_tok(cs);
		args[0] = e;
	}
	if (tok_is_op(cur(cs), O_COLON)) {
		/* stop omitted */
	} else if (!tok_is_op(cur(cs), O_RBRACKET) && !tok_is_op(cur(cs), O_COMMA)) {
		args[1] = p_expression(cs, 1);
	}
	if (tok_is_op(cur(cs), O_COLON)) {
		next_tok(cs);
		if (!tok_is_op(cur(cs), O_RBRACKET) && !tok_is_op(cur(cs), O_COMMA))
			args[2] = p_expression(cs, 1);
	}
	struct node *s = mk(cs, N_SLICE, at);
	s->a = args[0];
	s->b = args[1];
	s->c = args[2];
	return s;
}

static struct node *p_subscript(struct cstate *cs, struct node *x)
{
	struct tok *k = next_tok(cs);
	if (k->op == O_DOT) {
		struct tok *a = next_tok(cs);
		if (a->t == K_NAME) {
			struct node *g = mk(cs, N_GETATTR, k);
			g->a = x;
			g->s = dup_name(cs, a->p, a->n);
			g->sn = a->n;
			g->mid[0] = (int16_t)meth_lookup(V_STR, 0, a->p, a->n);
			g->mid[1] = (int16_t)meth_lookup(V_DICT, 0, a->p, a->n);
			g->mid[2] = (int16_t)meth_lookup(V_LIST, L_LIST, a->p, a->n);
			g->mid[3] = (int16_t)meth_lookup(V_LIST, L_TUPLE, a->p, a->n);
			g->mid[4] = (int16_t)meth_lookup(V_LOOP, 0, a->p, a->n);
			return g;
		}
		if (a->t != K_INT)
			cfail(cs, a->off, "expected a name or number after '.'");
		struct node *g = mk(cs, N_GETITEM, k), *c = mk(cs, N_CONST, a);
		c->k = vint(a->i);
		g->a = x;
		g->b = c;
		return g;
	}
	/* '[' */
	struct nvec args = {0};
	while (!tok_is_op(cur(cs), O_RBRACKET)) {
		if (args.n)
			expect_op(cs, O_COMMA);
		nv_push(cs, &args, p_subscribed(cs));
	}
	expect_op(cs, O_RBRACKET);
	struct node *g = mk(cs, N_GETITEM, k);
	g->a = x;
	if (args.n == 1) {
		g->b = args.v[0];
	} else {
		struct node *t = mk(cs, N_TUPLE, k);
		for (int i = 0; i < args.n; i++)
			if (args.v[i]->kind == N_SLICE)
				cfail(cs, k->off, "slices inside tuple subscripts are not supported");
		t->v = args.v;
		t->nv = args.n;
		g->b = t;
	}
	return g;
}

static struct node *p_postfix(struct cstate *cs, struct node *x)
{
	for (;;) {
		struct tok *k = cur(cs);
		if (tok_is_op(k, O_DOT) || tok_is_op(k, O_LBRACKET)) {
			x = p_subscript(cs, x);
		} else if (tok_is_op(k, O_LPAREN)) {
			struct node *c = mk(cs, N_CALL, k);
			c->a = x;
			p_call_args(cs, c);
			x = c;
		} else {
			return x;
		}
	}
}

static struct node *p_filter_expr(struct cstate *cs, struct node *x)
{
	for (;;) {
		struct tok *k = cur(cs);
		if (tok_is_op(k, O_PIPE)) {
			x = p_filter(cs, x, 0);
		} else if (tok_is_name(k, "is")) {
			x = p_test(cs, x);
		} else if (tok_is_op(k, O_LPAREN)) {
			struct node *c = mk(cs, N_CALL, k);
			c->a = x;
			p_call_args(cs, c);
			x = c;
		} else {
			return x;
		}
	}
}

static struct node *p_primary(struct cstate *cs)
{
	struct tok *k = cur(cs);
	struct node *x;
	depth_in(cs);
	if (k->t == K_NAME) {
		if (tok_is_name(k, "true") || tok_is_name(k, "True") || tok_is_name(k, "false") ||
		    tok_is_name(k, "False")) {
			x = mk(cs, N_CONST, k);
			x->k = vbool(k->p[0] == 't' || k->p[0] == 'T');
		} else if (tok_is_name(k, "none") || tok_is_name(k, "None")) {
			x = mk(cs, N_CONST, k);
			x->k = VNONE;
		} else {
			x = mk(cs, N_NAME, k);
			x->s = dup_name(cs, k->p, k->n);
			x->sn = k->n;
			x->sym = intern(cs, k->p, k->n);
			x->fid = (uint16_t)(find_name(gfn_names, G__COUNT, k->p, k->n) + 1);
		}
		next_tok(cs);
	} else if (k->t == K_STR) {
		/* adjacent string literals concatenate */
		size_t total = 0, j = cs->i;
		while (j < cs->nt && cs->tk[j].t == K_STR)
			total += cs->tk[j++].n;
		char *buf = calloc_c(cs, total + 1), *o = buf;
		x = mk(cs, N_CONST, k);
		while (cur(cs)->t == K_STR) {
			memcpy(o, cur(cs)->p, cur(cs)->n);
			o += cur(cs)->n;
			next_tok(cs);
		}
		x->k = vstr(buf, total);
	} else if (k->t == K_INT || k->t == K_FLOAT) {
		x = mk(cs, N_CONST, k);
		x->k = k->t == K_INT ? vint(k->i) : vfloat(k->f);
		next_tok(cs);
	} else if (tok_is_op(k, O_LPAREN)) {
		next_tok(cs);
		x = p_tuple(cs, 0, 1, NULL, 1);
		expect_op(cs, O_RPAREN);
	} else if (tok_is_op(k, O_LBRACKET)) {
		struct nvec items = {0};
		next_tok(cs);
		while (!tok_is_op(cur(cs), O_RBRACKET)) {
			if (items.n)
				expect_op(cs, O_COMMA);
			if (tok_is_op(cur(cs), O_RBRACKET))
				break;
			nv_push(cs, &items, p_expression(cs, 1));
		}
		expect_op(cs, O_RBRACKET);
		x = mk(cs, N_LIST, k);
		x->v = items.v;
		x->nv = items.n;
	} else if (tok_is_op(k, O_LBRACE)) {
		struct nvec keys = {0}, vals = {0};
		next_tok(cs);
		while (!tok_is_op(cur(cs), O_RBRACE)) {
			if (keys.n)
				expect_op(cs, O_COMMA);
			if (tok_is_op(cur(cs), O_RBRACE))
				break;
			nv_push(cs, &keys, p_expression(cs, 1));
			expect_op(cs, O_COLON);
			nv_push(cs, &vals, p_expression(cs, 1));
		}
		expect_op(cs, O_RBRACE);
		x = mk(cs, N_DICT, k);
		x->v = keys.v;
		x->nv = keys.n;
		x->w = vals.v;
		x->nw = vals.n;
	} else {
		unexpected(cs, NULL);
	}
	cs->depth--;
	return x;
}

static struct node *p_unary(struct cstate *cs, int with_filter)
{
	struct tok *k = cur(cs);
	struct node *x;
	depth_in(cs);
	if (tok_is_op(k, O_SUB) || tok_is_op(k, O_ADD)) {
		next_tok(cs);
		x = mk(cs, k->op == O_SUB ? N_NEG : N_POS, k);
		x->a = p_unary(cs, 0);
	} else {
		x = p_primary(cs);
	}
	x = p_postfix(cs, x);
	if (with_filter)
		x = p_filter_expr(cs, x);
	cs->depth--;
	return x;
}

static struct node *bin(struct cstate *cs, const struct tok *at, int op, struct node *a, struct node *b)
{
	struct node *x = mk(cs, N_BIN, at);
	x->op = (uint8_t)op;
	x->a = a;
	x->b = b;
	return x;
}

static struct node *p_pow(struct cstate *cs)
{
	struct node *l = p_unary(cs, 1);
	while (tok_is_op(cur(cs), O_POW)) {
		struct tok *k = next_tok(cs);
		l = bin(cs, k, B_POW, l, p_unary(cs, 1));
	}
	return l;
}

static struct node *p_math2(struct cstate *cs)
{
	struct node *l = p_pow(cs);
	for (;;) {
		struct tok *k = cur(cs);
		int op = tok_is_op(k, O_MUL) ? B_MUL : tok_is_op(k, O_DIV) ? B_DIV
			 : tok_is_op(k, O_FLOORDIV) ? B_FLOORDIV : tok_is_op(k, O_MOD) ? B_MOD : -1;
		if (op < 0)
			return l;
		next_tok(cs);
		l = bin(cs, k, op, l, p_pow(cs));
	}
}

static struct node *p_concat(struct cstate *cs)
{
	struct tok *at = cur(cs);
	struct node *first = p_math2(cs);
	if (!tok_is_op(cur(cs), O_TILDE))
		return first;
	struct nvec args = {0};
	nv_push(cs, &args, first);
	while (tok_is_op(cur(cs), O_TILDE)) {
		next_tok(cs);
		nv_push(cs, &args, p_math2(cs));
	}
	struct node *x = mk(cs, N_CONCAT, at);
	x->v = args.v;
	x->nv = args.n;
	return x;
}

static struct node *p_math1(struct cstate *cs)
{
	struct node *l = p_concat(cs);
	for (;;) {
		struct tok *k = cur(cs);
		int op = tok_is_op(k, O_ADD) ? B_ADD : tok_is_op(k, O_SUB) ? B_SUB : -1;
		if (op < 0)
			return l;
		next_tok(cs);
		l = bin(cs, k, op, l, p_concat(cs));
	}
}

static struct node *p_compare(struct cstate *cs)
{
	struct tok *at = cur(cs);
	struct node *first = p_math1(cs);
	struct nvec opnds = {0};
	uint8_t ops[64];
	for (;;) {
		struct tok *k = cur(cs);
		int op = -1;
		if (k->t == K_OP) {
			op = k->op == O_EQ ? C_EQ : k->op == O_NE ? C_NE : k->op == O_LT ? C_LT : k->op == O_LTEQ ? C_LE
			     : k->op == O_GT ? C_GT : k->op == O_GTEQ ? C_GE : -1;
			if (op >= 0)
				next_tok(cs);
		} else if (tok_is_name(k, "in")) {
			op = C_IN;
			next_tok(cs);
		} else if (tok_is_name(k, "not") && tok_is_name(look(cs), "in")) {
			op = C_NOTIN;
			next_tok(cs);
			next_tok(cs);
		}
		if (op < 0)
			break;
		if (opnds.n == 64)
			cfail(cs, k->off, "too many chained comparisons");
		ops[opnds.n] = (uint8_t)op;
		nv_push(cs, &opnds, p_math1(cs));
	}
	if (!opnds.n)
		return first;
	struct node *x = mk(cs, N_CMP, at);
	x->a = first;
	x->v = opnds.v;
	x->nv = opnds.n;
	x->ops = calloc_c(cs, (size_t)opnds.n);
	memcpy(x->ops, ops, (size_t)opnds.n);
	return x;
}

static struct node *p_not(struct cstate *cs)
{
	if (tok_is_name(cur(cs), "not")) {
		struct tok *k = next_tok(cs);
		struct node *x = mk(cs, N_NOT, k);
		depth_in(cs);
		x->a = p_not(cs);
		cs->depth--;
		return x;
	}
	return p_compare(cs);
}

static struct node *p_and(struct cstate *cs)
{
	struct node *l = p_not(cs);
	while (tok_is_name(cur(cs), "and")) {
		struct tok *k = next_tok(cs);
		struct node *x = mk(cs, N_AND, k);
		x->a = l;
		x->b = p_not(cs);
		l = x;
	}
	return l;
}

static struct node *p_or(struct cstate *cs)
{
	struct node *l = p_and(cs);
	while (tok_is_name(cur(cs), "or")) {
		struct tok *k = next_tok(cs);
		struct node *x = mk(cs, N_OR, k);
		x->a = l;
		x->b = p_and(cs);
		l = x;
	}
	return l;
}

static struct node *p_condexpr(struct cstate *cs)
{
	struct node *e1 = p_or(cs);
	while (tok_is_name(cur(cs), "if")) {
		struct tok *k = next_tok(cs);
		struct node *x = mk(cs, N_COND, k);
		depth_in(cs);
		x->a = p_or(cs);
		x->b = e1;
		if (tok_is_name(cur(cs), "else")) {
			next_tok(cs);
			x->c = p_condexpr(cs);
		}
		cs->depth--;
		e1 = x;
	}
	return e1;
}

static struct node *p_expression(struct cstate *cs, int with_condexpr)
{
	return with_condexpr ? p_condexpr(cs) : p_or(cs);
}

static int tuple_end(struct cstate *cs, const char *extra_end)
{
	struct tok *k = cur(cs);
	if (k->t == K_VEND || k->t == K_BEND || tok_is_op(k, O_RPAREN))
		return 1;
	return extra_end && tok_is_name(k, extra_end);
}

static struct node *p_tuple(struct cstate *cs, int simplified, int with_condexpr, const char *extra_end,
			    int explicit_paren)
{
	struct tok *at = cur(cs);
	struct nvec args = {0};
	int is_tuple = 0;
	for (;;) {
		if (args.n)
			expect_op(cs, O_COMMA);
		if (tuple_end(cs, extra_end))
			break;
		nv_push(cs, &args, simplified ? p_primary(cs) : p_expression(cs, with_condexpr));
		if (tok_is_op(cur(cs), O_COMMA))
			is_tuple = 1;
		else
			break;
	}
	if (!is_tuple) {
		if (args.n)
			return args.v[0];
		if (!explicit_paren)
			unexpected(cs, "an expression");
	}
	struct node *x = mk(cs, N_TUPLE, at);
	x->v = args.v;
	x->nv = args.n;
	return x;
}

/* --- statements ---------------------------------------------------------- */

static struct node **p_subparse(struct cstate *cs, const char *const *ends, int n_ends, int *n_out);

/* An assignment target: a name, a tuple of names, or (with_ns) ns.attr. */
static struct target *p_target(struct cstate *cs, int with_ns, const char *extra_end, int name_only)
{
	struct target *tg = calloc_c(cs, sizeof *tg);
	struct tok *at = cur(cs);
	if (with_ns && at->t == K_NAME && tok_is_op(look(cs), O_DOT)) {
		struct tok *k = next_tok(cs);
		next_tok(cs);
		struct tok *a = expect_name(cs);
		tg->n = 1;
		tg->syms = calloc_c(cs, sizeof(int));
		tg->names = calloc_c(cs, sizeof(char *));
		tg->syms[0] = intern(cs, k->p, k->n);
		tg->names[0] = dup_name(cs, k->p, k->n);
		tg->ns_attr = 1;
		tg->attr = dup_name(cs, a->p, a->n);
		return tg;
	}
	struct node *x = name_only ? p_primary(cs) : p_tuple(cs, 1, 1, extra_end, 0);
	struct node **v = &x;
	int n = 1;
	if (x->kind == N_TUPLE) {
		v = x->v;
		n = x->nv;
		tg->tuple = 1;
	}
	tg->n = n;
	tg->syms = calloc_c(cs, (size_t)(n ? n : 1) * sizeof(int));
	tg->names = calloc_c(cs, (size_t)(n ? n : 1) * sizeof(char *));
	for (int i = 0; i < n; i++) {
		if (v[i]->kind != N_NAME)
			cfail(cs, at->off, "can't assign to this expression (only names%s are supported)",
			      with_ns ? " and namespace attributes" : "");
		tg->syms[i] = v[i]->sym;
		tg->names[i] = v[i]->s;
	}
	return tg;
}

/* Skip an optional ':' and the block end, then parse a body up to one of
 * `ends` (left as the current token). */
static struct node **p_body(struct cstate *cs, const char *const *ends, int n_ends, int *n_out,
			    const char *tag, size_t tag_off)
{
	if (tok_is_op(cur(cs), O_COLON))
		next_tok(cs);
	expect_kind(cs, K_BEND, "end of statement block");
	struct node **b = p_subparse(cs, ends, n_ends, n_out);
	if (cur(cs)->t == K_EOF) {
		char want[200] = "";
		size_t l = 0;
		for (int i = 0; i < n_ends; i++)
			l += (size_t)snprintf(want + l, sizeof want - l, "%s'%s'", i ? " or " : "", ends[i]);
		cfail(cs, tag_off, "unexpected end of template: the '%s' block is not closed (looking for %s)",
		      tag, want);
	}
	return b;
}

static void end_tag(struct cstate *cs)
{
	next_tok(cs); /* the end name */
}

static struct node *p_statement(struct cstate *cs);

static struct node *p_for(struct cstate *cs, struct tok *k)
{
	static const char *const ends1[] = {"endfor", "else"}, *const ends2[] = {"endfor"};
	struct node *x = mk(cs, N_FOR, k);
	x->tg = p_target(cs, 0, "in", 0);
	if (!tok_is_name(cur(cs), "in"))
		unexpected(cs, "'in'");
	next_tok(cs);
	x->a = p_tuple(cs, 0, 0, "recursive", 0);
	if (tok_is_name(cur(cs), "if")) {
		next_tok(cs);
		x->b = p_expression(cs, 1);
	}
	if (tok_is_name(cur(cs), "recursive")) {
		cs->err = KV_ERR_UNSUPPORTED;
		cfail(cs, cur(cs)->off, "recursive for loops are not supported");
	}
	cs->loops++;
	x->v = p_body(cs, ends1, 2, &x->nv, "for", k->off);
	cs->loops--;
	if (tok_is_name(cur(cs), "else")) {
		end_tag(cs);
		x->w = p_body(cs, ends2, 1, &x->nw, "for", k->off);
	}
	end_tag(cs);
	return x;
}

static struct node *p_if(struct cstate *cs, struct tok *k)
{
	static const char *const ends1[] = {"elif", "else", "endif"}, *const ends2[] = {"endif"};
	struct node *top = mk(cs, N_IF, k), *x = top;
	for (;;) {
		x->a = p_tuple(cs, 0, 0, NULL, 0);
		x->v = p_body(cs, ends1, 3, &x->nv, "if", k->off);
		if (tok_is_name(cur(cs), "elif")) {
			struct tok *e = next_tok(cs);
			struct node *y = mk(cs, N_IF, e);
			x->w = calloc_c(cs, sizeof *x->w);
			x->w[0] = y;
			x->nw = 1;
			x = y;
			continue;
		}
		if (tok_is_name(cur(cs), "else")) {
			end_tag(cs);
			x->w = p_body(cs, ends2, 1, &x->nw, "if", k->off);
		}
		break;
	}
	end_tag(cs);
	return top;
}

static struct node *p_set(struct cstate *cs, struct tok *k)
{
	static const char *const ends[] = {"endset"};
	struct target *tg = p_target(cs, 1, NULL, 0);
	if (tok_is_op(cur(cs), O_ASSIGN)) {
		next_tok(cs);
		struct node *x = mk(cs, N_SET, k);
		x->tg = tg;
		x->a = p_tuple(cs, 0, 1, NULL, 0);
		return x;
	}
	struct node *x = mk(cs, N_SETBLOCK, k);
	x->tg = tg;
	if (tg->n != 1)
		cfail(cs, k->off, "a set block assigns to one name");
	if (tok_is_op(cur(cs), O_PIPE))
		x->c = p_filter(cs, mk(cs, N_BLOCKVAL, k), 0);
	x->v = p_body(cs, ends, 1, &x->nv, "set", k->off);
	end_tag(cs);
	return x;
}

static int body_uses(const struct node *const *v, int n, int sym);

static int node_uses(const struct node *x, int sym)
{
	if (!x)
		return 0;
	if (x->kind == N_NAME && x->sym == sym)
		return 1;
	if (x->kind == N_MACRO)
		return 0; /* a nested macro has its own varargs */
	if (node_uses(x->a, sym) || node_uses(x->b, sym) || node_uses(x->c, sym))
		return 1;
	if (body_uses((const struct node *const *)x->v, x->nv, sym) ||
	    body_uses((const struct node *const *)x->w, x->nw, sym))
		return 1;
	return 0;
}

static int body_uses(const struct node *const *v, int n, int sym)
{
	for (int i = 0; i < n; i++)
		if (node_uses(v[i], sym))
			return 1;
	return 0;
}

static struct node *p_macro(struct cstate *cs, struct tok *k)
{
	static const char *const ends[] = {"endmacro"};
	struct node *x = mk(cs, N_MACRO, k);
	struct tok *name = expect_name(cs);
	struct nvec defs = {0};
	int syms[256];
	const char *names[256];
	int np = 0;
	x->sym = intern(cs, name->p, name->n);
	x->s = dup_name(cs, name->p, name->n);
	expect_op(cs, O_LPAREN);
	while (!tok_is_op(cur(cs), O_RPAREN)) {
		if (np)
			expect_op(cs, O_COMMA);
		struct tok *a = expect_name(cs);
		if (np == 256)
			cfail(cs, a->off, "too many macro parameters");
		syms[np] = intern(cs, a->p, a->n);
		names[np++] = dup_name(cs, a->p, a->n);
		if (tok_is_op(cur(cs), O_ASSIGN)) {
			next_tok(cs);
			nv_push(cs, &defs, p_expression(cs, 1));
		} else if (defs.n) {
			cfail(cs, a->off, "non-default argument follows default argument");
		}
	}
	expect_op(cs, O_RPAREN);
	x->tg = calloc_c(cs, sizeof *x->tg);
	x->tg->n = np;
	x->tg->syms = calloc_c(cs, (size_t)(np ? np : 1) * sizeof(int));
	x->tg->names = calloc_c(cs, (size_t)(np ? np : 1) * sizeof(char *));
	memcpy(x->tg->syms, syms, (size_t)np * sizeof(int));
	memcpy(x->tg->names, names, (size_t)np * sizeof(char *));
	x->w = defs.v;
	x->nw = defs.n;
	int saved_loops = cs->loops;
	cs->loops = 0;
	cs->macros++;
	x->v = p_body(cs, ends, 1, &x->nv, "macro", k->off);
	cs->macros--;
	cs->loops = saved_loops;
	end_tag(cs);
	x->varargs = (uint8_t)body_uses((const struct node *const *)x->v, x->nv, cs->t->sym_varargs);
	x->kwargs = (uint8_t)body_uses((const struct node *const *)x->v, x->nv, cs->t->sym_kwargs);
	return x;
}

static struct node *p_statement(struct cstate *cs)
{
	struct tok *k = cur(cs);
	if (k->t != K_NAME)
		cfail(cs, k->off, "tag name expected");
	depth_in(cs);
	next_tok(cs);
	struct node *x;
	if (tok_is_name(k, "for")) {
		x = p_for(cs, k);
	} else if (tok_is_name(k, "if")) {
		x = p_if(cs, k);
	} else if (tok_is_name(k, "set")) {
		x = p_set(cs, k);
	} else if (tok_is_name(k, "macro")) {
		x = p_macro(cs, k);
	} else if (tok_is_name(k, "print")) {
		/* {% print a, b %}: each expression printed in turn */
		struct nvec items = {0};
		while (cur(cs)->t != K_BEND) {
			if (items.n)
				expect_op(cs, O_COMMA);
			struct node *p = mk(cs, N_PRINT, k);
			p->a = p_expression(cs, 1);
			nv_push(cs, &items, p);
		}
		x = mk(cs, N_SCOPE, k);
		x->op = 1; /* no new scope: just a sequence */
		x->v = items.v;
		x->nv = items.n;
	} else if (tok_is_name(k, "filter")) {
		static const char *const ends[] = {"endfilter"};
		x = mk(cs, N_FILTERBLK, k);
		x->c = p_filter(cs, mk(cs, N_BLOCKVAL, k), 1);
		x->v = p_body(cs, ends, 1, &x->nv, "filter", k->off);
		end_tag(cs);
	} else if (tok_is_name(k, "with")) {
		static const char *const ends[] = {"endwith"};
		struct nvec vals = {0};
		int syms[64];
		const char *names[64];
		int n = 0;
		x = mk(cs, N_WITH, k);
		while (cur(cs)->t != K_BEND) {
			if (n)
				expect_op(cs, O_COMMA);
			struct tok *a = expect_name(cs);
			if (n == 64)
				cfail(cs, a->off, "too many with targets");
			syms[n] = intern(cs, a->p, a->n);
			names[n++] = dup_name(cs, a->p, a->n);
			expect_op(cs, O_ASSIGN);
			nv_push(cs, &vals, p_expression(cs, 1));
		}
		x->tg = calloc_c(cs, sizeof *x->tg);
		x->tg->n = n;
		x->tg->syms = calloc_c(cs, (size_t)(n ? n : 1) * sizeof(int));
		x->tg->names = calloc_c(cs, (size_t)(n ? n : 1) * sizeof(char *));
		memcpy(x->tg->syms, syms, (size_t)n * sizeof(int));
		memcpy(x->tg->names, names, (size_t)n * sizeof(char *));
		x->w = vals.v;
		x->nw = vals.n;
		x->v = p_body(cs, ends, 1, &x->nv, "with", k->off);
		end_tag(cs);
	} else if (tok_is_name(k, "generation")) {
		/* transformers' AssistantTracker tag: renders its body */
		static const char *const ends[] = {"endgeneration"};
		x = mk(cs, N_SCOPE, k);
		x->v = p_body(cs, ends, 1, &x->nv, "generation", k->off);
		end_tag(cs);
	} else if (tok_is_name(k, "break") || tok_is_name(k, "continue")) {
		if (!cs->loops)
			cfail(cs, k->off, "'%.*s' outside of a loop", (int)k->n, k->p);
		x = mk(cs, k->p[0] == 'b' ? N_BREAK : N_CONTINUE, k);
	} else if (tok_is_name(k, "block") || tok_is_name(k, "extends") || tok_is_name(k, "include") ||
		   tok_is_name(k, "import") || tok_is_name(k, "from") || tok_is_name(k, "autoescape") ||
		   tok_is_name(k, "call") || tok_is_name(k, "do") || tok_is_name(k, "trans")) {
		cs->err = KV_ERR_UNSUPPORTED;
		cfail(cs, k->off, "the '%.*s' tag is not supported in chat templates", (int)k->n, k->p);
	} else {
		cfail(cs, k->off, "unknown tag '%.*s'", (int)(k->n > 60 ? 60 : k->n), k->p);
	}
	cs->depth--;
	return x;
}

static struct node **p_subparse(struct cstate *cs, const char *const *ends, int n_ends, int *n_out)
{
	struct nvec body = {0};
	for (;;) {
		struct tok *k = cur(cs);
		if (k->t == K_EOF)
			break;
		if (k->t == K_DATA) {
			struct node *x = mk(cs, N_DATA, k);
			x->s = k->p;
			x->sn = k->n;
			nv_push(cs, &body, x);
			next_tok(cs);
		} else if (k->t == K_VBEGIN) {
			next_tok(cs);
			struct node *x = mk(cs, N_PRINT, k);
			x->a = p_tuple(cs, 0, 1, NULL, 0);
			expect_kind(cs, K_VEND, "end of print statement");
			nv_push(cs, &body, x);
		} else if (k->t == K_BBEGIN) {
			next_tok(cs);
			for (int i = 0; i < n_ends; i++)
				if (tok_is_name(cur(cs), ends[i])) {
					*n_out = body.n;
					return body.v;
				}
			struct tok *nm = cur(cs);
			if (nm->t == K_NAME && nm->n > 3 && (!memcmp(nm->p, "end", 3) || tok_is_name(nm, "else") ||
							     tok_is_name(nm, "elif")))
				cfail(cs, nm->off, "unexpected '%.*s' (no open block expects it)",
				      (int)(nm->n > 60 ? 60 : nm->n), nm->p);
			if (tok_is_name(nm, "else") || tok_is_name(nm, "elif"))
				cfail(cs, nm->off, "unexpected '%.*s' (no open block expects it)", (int)nm->n, nm->p);
			nv_push(cs, &body, p_statement(cs));
			expect_kind(cs, K_BEND, "end of statement block");
		} else {
			unexpected(cs, NULL);
		}
	}
	*n_out = body.n;
	return body.v;
}

/* ------------------------------------------------------------------------
 * Compile
 * ---------------------------------------------------------------------- */

void kv_tmpl_free(struct kv_tmpl *t)
{
	if (!t)
		return;
	kv_map_destroy(t->syms);
	ar_free(&t->ar);
	free(t);
}

int kv_tmpl_compile(const char *src, size_t len, const char *what, struct kv_tmpl **out)
{
	struct kv_tmpl *t;
	struct cstate *cs;
	long bad;

	*out = NULL;
	if (!what)
		what = "template";
	if (!src && len)
		return kv_fail(KV_ERR_INVALID, "%s: no source", what);
	if (len > TM_MAX_SOURCE)
		return kv_fail(KV_ERR_INVALID, "%s: %zu bytes, larger than the %u byte limit", what, len,
			       (unsigned)TM_MAX_SOURCE);
	if ((bad = u8_invalid_at(src, len)) >= 0)
		return kv_fail(KV_ERR_INVALID, "%s: invalid UTF-8 at byte %ld", what, bad);
	t = calloc(1, sizeof *t);
	cs = calloc(1, sizeof *cs);
	if (!t || !cs) {
		free(t);
		free(cs);
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
	}
	snprintf(t->what, sizeof t->what, "%s", what);
	t->syms = kv_map_create(64);
	cs->t = t;
	if (setjmp(cs->jb)) {
		int err = cs->err ? cs->err : KV_ERR_INVALID;
		free(cs);
		kv_tmpl_free(t);
		return err;
	}
	if (!t->syms)
		cnomem(cs);

	/* newlines -> \n, one trailing newline dropped */
	char *s = calloc_c(cs, len + 1);
	size_t n = 0;
	for (size_t i = 0; i < len; i++) {
		if (src[i] == '\r') {
			s[n++] = '\n';
			if (i + 1 < len && src[i + 1] == '\n')
				i++;
		} else {
			s[n++] = src[i];
		}
	}
	if (n > 0 && s[n - 1] == '\n')
		n--;
	s[n] = 0;
	t->src = s;
	t->src_len = n;
	size_t nl = 1;
	for (size_t i = 0; i < n; i++)
		nl += s[i] == '\n';
	t->lines = calloc_c(cs, nl * sizeof *t->lines);
	t->n_lines = 1;
	for (size_t i = 0; i < n; i++)
		if (s[i] == '\n')
			t->lines[t->n_lines++] = i + 1;

	t->sym_loop = intern(cs, "loop", 4);
	t->sym_varargs = intern(cs, "varargs", 7);
	t->sym_kwargs = intern(cs, "kwargs", 6);
	lex(cs);
	t->body = p_subparse(cs, NULL, 0, &t->n_body);
	if (cur(cs)->t != K_EOF)
		unexpected(cs, NULL);
	free(cs);
	*out = t;
	return KV_OK;
}

/* ------------------------------------------------------------------------
 * Runtime state
 * ---------------------------------------------------------------------- */

struct scope {
	struct scope *parent;
	int captured;           /* a macro closes over it: never recycled */
	int n, cap;
	int *syms;
	struct val *vals;
};

struct outbuf {             /* a growable string in the render arena */
	char *p;
	size_t n, cap;
};

/*
 * tojson results of context containers, kept across the renders of one
 * kv_chat_render: the prefix renders serialize the same 30 tool schemas
 * again and again. Only containers in `ar` (the converted context, alive
 * and immutable for the whole job) are memoized, so a key can never be a
 * recycled address.
 */
#define TJ_MEMO 128
struct tj_memo {
	struct arena *ar;
	const void *key[TJ_MEMO];
	const char *p[TJ_MEMO];
	size_t n[TJ_MEMO];
};

struct rt {
	const struct kv_tmpl *t;
	struct tj_memo *memo;   /* or NULL */
	struct arena *ar;
	jmp_buf jb;
	int err;                /* kv_err of the failure that unwound */
	int diverged;           /* verify mode: output left the expected text */
	/* the main output: a kv_buf, or a comparison against expected text */
	struct kv_buf *out;
	const char *expect;
	size_t expect_len, out_len;
	struct outbuf *cap;     /* innermost capture (macro, set block), or NULL */
	struct val *globals;    /* per symbol: a context value, V_MISSING if none */
	struct scope *root;
	struct val blockval;    /* N_BLOCKVAL */
	uint64_t steps, max_steps;
	size_t max_out;
	int depth, macro_depth;
	int loop_depth;
};

#define RT_DIVERGED 1000    /* internal: verify-mode mismatch, not an error */

static void __attribute__((noreturn, format(printf, 4, 5)))
rfail(struct rt *rt, const struct node *at, int code, const char *fmt, ...)
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

#define TYPE_ERR(rt, at, ...) rfail(rt, at, KV_ERR_INVALID, __VA_ARGS__)
#define UNSUP(rt, at, ...) rfail(rt, at, KV_ERR_UNSUPPORTED, __VA_ARGS__)

static void *ralloc(struct rt *rt, const struct node *at, size_t n)
{
	void *p = ar_alloc_raw(rt->ar, n ? n : 1);
	if (!p)
		rfail(rt, at, KV_ERR_NOMEM, "render used more than %zu bytes of memory (template memory cap)",
		      rt->ar->cap);
	return p;
}

static void step(struct rt *rt, const struct node *at, uint64_t n)
{
	rt->steps += n;
	if (rt->steps > rt->max_steps)
		rfail(rt, at, KV_ERR_INVALID,
		      "template ran more than %llu steps (statements and loop iterations); it may never end",
		      (unsigned long long)rt->max_steps);
}

/* --- strings under construction ----------------------------------------- */

static void ob_add(struct rt *rt, const struct node *at, struct outbuf *b, const char *p, size_t n)
{
	if (b->n + n > rt->max_out)
		rfail(rt, at, KV_ERR_INVALID, "string longer than the %zu byte output cap", rt->max_out);
	if (b->n + n + 1 > b->cap) {
		size_t nc = b->cap ? b->cap * 2 : 64;
		while (nc < b->n + n + 1)
			nc *= 2;
		char *np = ralloc(rt, at, nc);
		if (b->n)
			memcpy(np, b->p, b->n);
		b->p = np;
		b->cap = nc;
	}
	if (n)
		memcpy(b->p + b->n, p, n);
	b->n += n;
}

static void ob_adds(struct rt *rt, const struct node *at, struct outbuf *b, const char *s)
{
	ob_add(rt, at, b, s, strlen(s));
}

static void ob_addc(struct rt *rt, const struct node *at, struct outbuf *b, char c)
{
	ob_add(rt, at, b, &c, 1);
}

static void ob_cp(struct rt *rt, const struct node *at, struct outbuf *b, int32_t cp)
{
	char e[4];
	ob_add(rt, at, b, e, (size_t)u8_enc(cp, e));
}

static struct val ob_val(struct outbuf *b)
{
	return vstr(b->p ? b->p : "", b->n);
}

static struct val str_copy(struct rt *rt, const struct node *at, const char *p, size_t n)
{
	char *d = ralloc(rt, at, n + 1);
	if (n)
		memcpy(d, p, n);
	d[n] = 0;
	return vstr(d, n);
}

/* --- output ---------------------------------------------------------------- */

static void emit(struct rt *rt, const struct node *at, const char *p, size_t n)
{
	if (!n)
		return;
	if (rt->cap) {
		ob_add(rt, at, rt->cap, p, n);
		return;
	}
	if (rt->out_len + n > rt->max_out)
		rfail(rt, at, KV_ERR_INVALID, "rendered text longer than the %zu byte output cap", rt->max_out);
	if (rt->expect) {
		if (rt->out_len + n > rt->expect_len || memcmp(rt->expect + rt->out_len, p, n)) {
			rt->diverged = 1;
			rt->err = RT_DIVERGED;
			longjmp(rt->jb, 1);
		}
	} else {
		kv_buf_add(rt->out, p, n);
		if (rt->out->oom)
			rfail(rt, at, KV_ERR_NOMEM, "out of memory for the rendered text");
	}
	rt->out_len += n;
}

/* --- scopes ---------------------------------------------------------------- */

static struct scope *scope_new(struct rt *rt, const struct node *at, struct scope *parent)
{
	struct scope *s = ralloc(rt, at, sizeof *s);
	memset(s, 0, sizeof *s);
	s->parent = parent;
	return s;
}

static void scope_set(struct rt *rt, const struct node *at, struct scope *s, int sym, struct val v)
{
	for (int i = 0; i < s->n; i++)
		if (s->syms[i] == sym) {
			s->vals[i] = v;
			return;
		}
	if (s->n == s->cap) {
		int nc = s->cap ? s->cap * 2 : 8;
		int *ns = ralloc(rt, at, (size_t)nc * sizeof *ns);
		struct val *nv = ralloc(rt, at, (size_t)nc * sizeof *nv);
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

static const struct val *scope_get(const struct scope *s, int sym)
{
	for (; s; s = s->parent)
		for (int i = s->n - 1; i >= 0; i--)
			if (s->syms[i] == sym)
				return &s->vals[i];
	return NULL;
}

/* --- lists and dicts ------------------------------------------------------- */

static struct list *list_new(struct rt *rt, const struct node *at, size_t n, int kind)
{
	if (n > ((size_t)1 << 32))
		rfail(rt, at, KV_ERR_INVALID, "list of %zu items is too large", n);
	struct list *l = ralloc(rt, at, sizeof *l + n * sizeof(struct val));
	memset(l, 0, sizeof *l);
	l->n = n;
	l->kind = (uint8_t)kind;
	return l;
}

struct lbuild {
	struct val *v;
	size_t n, cap;
};

static void lb_push(struct rt *rt, const struct node *at, struct lbuild *b, struct val v)
{
	if (b->n == b->cap) {
		size_t nc = b->cap ? b->cap * 2 : 8;
		struct val *nv = ralloc(rt, at, nc * sizeof *nv);
		if (b->n)
			memcpy(nv, b->v, b->n * sizeof *nv);
		b->v = nv;
		b->cap = nc;
	}
	b->v[b->n++] = v;
}

static struct val lb_done(struct rt *rt, const struct node *at, struct lbuild *b, int kind)
{
	struct list *l = list_new(rt, at, b->n, kind);
	if (b->n)
		memcpy(l->v, b->v, b->n * sizeof *b->v);
	return vlist(l);
}

static int val_eq(struct rt *rt, const struct node *at, const struct val *a, const struct val *b, int depth);

static struct dict *dict_new(struct rt *rt, const struct node *at, size_t cap)
{
	struct dict *d = ralloc(rt, at, sizeof *d);
	memset(d, 0, sizeof *d);
	if (cap) {
		d->k = ralloc(rt, at, cap * sizeof *d->k);
		d->v = ralloc(rt, at, cap * sizeof *d->v);
		d->cap = cap;
	}
	return d;
}

static void dict_reindex(struct rt *rt, const struct node *at, struct dict *d)
{
	size_t ic = 16;
	while (ic < d->n * 2)
		ic *= 2;
	d->idx = ralloc(rt, at, ic * sizeof *d->idx);
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
static long dict_find(struct rt *rt, const struct node *at, const struct dict *d, const struct val *key)
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
		TYPE_ERR(rt, at, "unhashable type: '%s'", kind_name(key));
	if (d->idx) {
		size_t m = d->idx_cap - 1, i = (size_t)h & m;
		while (d->idx[i]) {
			size_t j = d->idx[i] - 1;
			if (val_eq(rt, at, &d->k[j], key, 0))
				return (long)j;
			i = (i + 1) & m;
		}
		return -1;
	}
	for (size_t j = 0; j < d->n; j++)
		if (val_eq(rt, at, &d->k[j], key, 0))
			return (long)j;
	return -1;
}

/* Insert or overwrite (Python: the first key object is kept). */
static void dict_set(struct rt *rt, const struct node *at, struct dict *d, struct val key, struct val v)
{
	long i = dict_find(rt, at, d, &key);
	if (i >= 0) {
		d->v[i] = v;
		return;
	}
	if (d->n == d->cap) {
		size_t nc = d->cap ? d->cap * 2 : 8;
		struct val *nk = ralloc(rt, at, nc * sizeof *nk), *nv = ralloc(rt, at, nc * sizeof *nv);
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

static const struct val *dict_get_str(struct rt *rt, const struct node *at, const struct dict *d, const char *s,
				      size_t n)
{
	struct val k = vstr(s, n);
	long i = dict_find(rt, at, d, &k);
	return i >= 0 ? &d->v[i] : NULL;
}

/* --- JSON -> values -------------------------------------------------------- */

static struct val from_json(struct rt *rt, const json_t *j, int depth)
{
	if (depth > TM_MAX_VALUE_DEPTH)
		rfail(rt, NULL, KV_ERR_INVALID, "context value nested deeper than %d", TM_MAX_VALUE_DEPTH);
	switch (json_typeof(j)) {
	case JSON_NULL: return VNONE;
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
		struct list *l = list_new(rt, NULL, n, L_LIST);
		for (size_t i = 0; i < n; i++)
			l->v[i] = from_json(rt, json_array_get(j, i), depth + 1);
		return vlist(l);
	}
	case JSON_OBJECT: {
		struct dict *d = dict_new(rt, NULL, json_object_size(j));
		const char *k;
		json_t *v;
		json_object_foreach((json_t *)j, k, v) {
			struct val key = vstr(k, strlen(k));
			struct val val = from_json(rt, v, depth + 1);
			/* keys are unique in a json object: append */
			d->k[d->n] = key;
			d->v[d->n++] = val;
		}
		if (d->n > 8)
			dict_reindex(rt, NULL, d);
		return vdict(d);
	}
	}
	return VNONE;
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

static void to_repr(struct rt *rt, const struct node *at, const struct val *v, struct outbuf *b, int depth);

static void repr_str(struct rt *rt, const struct node *at, const char *p, size_t n, struct outbuf *b)
{
	int has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
	char q = has_sq && !has_dq ? '"' : '\'';
	ob_addc(rt, at, b, q);
	size_t i = 0;
	while (i < n) {
		int32_t c;
		int l = u8_dec(p + i, n - i, &c);
		if (!l) {
			c = (unsigned char)p[i];
			l = 1;
		}
		char e[16];
		if (c == '\\' || c == q) {
			e[0] = '\\';
			e[1] = (char)c;
			ob_add(rt, at, b, e, 2);
		} else if (c == '\n') {
			ob_add(rt, at, b, "\\n", 2);
		} else if (c == '\r') {
			ob_add(rt, at, b, "\\r", 2);
		} else if (c == '\t') {
			ob_add(rt, at, b, "\\t", 2);
		} else if (!py_isprintable(c)) {
			int w = snprintf(e, sizeof e, c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" : "\\U%08x",
					 (unsigned)c);
			ob_add(rt, at, b, e, (size_t)w);
		} else {
			ob_add(rt, at, b, p + i, (size_t)l);
		}
		i += (size_t)l;
	}
	ob_addc(rt, at, b, q);
}

static void value_depth(struct rt *rt, const struct node *at, int depth)
{
	if (depth > TM_MAX_VALUE_DEPTH)
		rfail(rt, at, KV_ERR_INVALID, "value nested deeper than %d", TM_MAX_VALUE_DEPTH);
}

static void repr_seq(struct rt *rt, const struct node *at, const struct list *l, struct outbuf *b, int depth,
		     const char *open, const char *close)
{
	ob_adds(rt, at, b, open);
	for (size_t i = 0; i < l->n; i++) {
		if (i)
			ob_add(rt, at, b, ", ", 2);
		to_repr(rt, at, &l->v[i], b, depth + 1);
	}
	ob_adds(rt, at, b, close);
}

static void repr_dict(struct rt *rt, const struct node *at, const struct dict *d, struct outbuf *b, int depth)
{
	ob_addc(rt, at, b, '{');
	for (size_t i = 0; i < d->n; i++) {
		if (i)
			ob_add(rt, at, b, ", ", 2);
		to_repr(rt, at, &d->k[i], b, depth + 1);
		ob_add(rt, at, b, ": ", 2);
		to_repr(rt, at, &d->v[i], b, depth + 1);
	}
	ob_addc(rt, at, b, '}');
}

/* str(v) appended to b. */
static void to_str(struct rt *rt, const struct node *at, const struct val *v, struct outbuf *b, int depth)
{
	char num[64];
	value_depth(rt, at, depth);
	switch (v->t) {
	case V_UNDEF:
	case V_MISSING:
		return;
	case V_NONE:
		ob_add(rt, at, b, "None", 4);
		return;
	case V_BOOL:
		ob_adds(rt, at, b, v->u.i ? "True" : "False");
		return;
	case V_INT:
		snprintf(num, sizeof num, "%lld", (long long)v->u.i);
		ob_adds(rt, at, b, num);
		return;
	case V_FLOAT:
		fmt_float(v->u.f, num, sizeof num);
		ob_adds(rt, at, b, num);
		return;
	case V_STR:
		ob_add(rt, at, b, v->u.s.p, v->u.s.n);
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
			ob_adds(rt, at, b, num);
			return;
		}
		UNSUP(rt, at, "printing a generator or iterator (Python would print its address); "
			      "convert it with |list or |join first");
	}
	case V_DICT:
		repr_dict(rt, at, v->u.d, b, depth);
		return;
	case V_NS:
		ob_adds(rt, at, b, "<Namespace ");
		repr_dict(rt, at, v->u.ns->d, b, depth);
		ob_addc(rt, at, b, '>');
		return;
	case V_MACRO:
		ob_adds(rt, at, b, "<Macro ");
		repr_str(rt, at, v->u.m->def->s, strlen(v->u.m->def->s), b);
		ob_addc(rt, at, b, '>');
		return;
	case V_LOOP:
		snprintf(num, sizeof num, "<LoopContext %zu/%zu>", v->u.lo->i + 1, v->u.lo->items->n);
		ob_adds(rt, at, b, num);
		return;
	}
	UNSUP(rt, at, "printing a %s (Python would print its address)", kind_name(v));
}

static void to_repr(struct rt *rt, const struct node *at, const struct val *v, struct outbuf *b, int depth)
{
	value_depth(rt, at, depth);
	if (v->t == V_STR) {
		if (v->bigint) {
			ob_add(rt, at, b, v->u.s.p, v->u.s.n);
		} else if (v->safe) {
			ob_adds(rt, at, b, "Markup(");
			repr_str(rt, at, v->u.s.p, v->u.s.n, b);
			ob_addc(rt, at, b, ')');
		} else {
			repr_str(rt, at, v->u.s.p, v->u.s.n, b);
		}
	} else if (v->t == V_UNDEF) {
		ob_adds(rt, at, b, "Undefined");
	} else {
		to_str(rt, at, v, b, depth);
	}
}

/* str(v) as a value (v itself when it is a string). */
static struct val str_of(struct rt *rt, const struct node *at, const struct val *v)
{
	if (v->t == V_STR)
		return *v;
	struct outbuf b = {0};
	to_str(rt, at, v, &b, 0);
	return ob_val(&b);
}

struct jopts {
	int ensure_ascii;
	const char *indent;     /* NULL: one line */
	size_t indent_n;
	const char *item_sep, *key_sep;
	int sort_keys;
};

static void json_str(struct rt *rt, const struct node *at, const char *p, size_t n, int ensure_ascii,
		     struct outbuf *b)
{
	ob_addc(rt, at, b, '"');
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
			l = u8_dec(p + i, n - i, &cp);
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
				ob_add(rt, at, b, p + i - run, run);
			run = 0;
			ob_adds(rt, at, b, esc);
			i += (size_t)l;
		} else {
			run++;
			i++;
		}
	}
	if (run)
		ob_add(rt, at, b, p + n - run, run);
	ob_addc(rt, at, b, '"');
}

static void json_newline(struct rt *rt, const struct node *at, const struct jopts *o, int level, struct outbuf *b)
{
	ob_addc(rt, at, b, '\n');
	for (int i = 0; i < level; i++)
		ob_add(rt, at, b, o->indent, o->indent_n);
}

static int str_cmp(const struct val *a, const struct val *b)
{
	size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
	int c = memcmp(a->u.s.p, b->u.s.p, n);
	if (c)
		return c;
	return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
}

static void to_json(struct rt *rt, const struct node *at, const struct val *v, const struct jopts *o, int level,
		    struct outbuf *b)
{
	char num[64];
	value_depth(rt, at, level);
	switch (v->t) {
	case V_NONE:
		ob_add(rt, at, b, "null", 4);
		return;
	case V_BOOL:
		ob_adds(rt, at, b, v->u.i ? "true" : "false");
		return;
	case V_INT:
		snprintf(num, sizeof num, "%lld", (long long)v->u.i);
		ob_adds(rt, at, b, num);
		return;
	case V_FLOAT:
		if (isnan(v->u.f))
			ob_adds(rt, at, b, "NaN");
		else if (isinf(v->u.f))
			ob_adds(rt, at, b, v->u.f < 0 ? "-Infinity" : "Infinity");
		else {
			fmt_float(v->u.f, num, sizeof num);
			ob_adds(rt, at, b, num);
		}
		return;
	case V_STR:
		if (v->bigint)
			ob_add(rt, at, b, v->u.s.p, v->u.s.n);
		else
			json_str(rt, at, v->u.s.p, v->u.s.n, o->ensure_ascii, b);
		return;
	case V_LIST:
		if (v->u.l->kind == L_LIST || v->u.l->kind == L_TUPLE) {
			const struct list *l = v->u.l;
			if (!l->n) {
				ob_add(rt, at, b, "[]", 2);
				return;
			}
			ob_addc(rt, at, b, '[');
			for (size_t i = 0; i < l->n; i++) {
				if (i)
					ob_adds(rt, at, b, o->item_sep);
				if (o->indent)
					json_newline(rt, at, o, level + 1, b);
				to_json(rt, at, &l->v[i], o, level + 1, b);
			}
			if (o->indent)
				json_newline(rt, at, o, level, b);
			ob_addc(rt, at, b, ']');
			return;
		}
		break;
	case V_DICT: {
		const struct dict *d = v->u.d;
		size_t *order = NULL;
		if (!d->n) {
			ob_add(rt, at, b, "{}", 2);
			return;
		}
		if (o->sort_keys) {
			order = ralloc(rt, at, d->n * sizeof *order);
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
		ob_addc(rt, at, b, '{');
		for (size_t ii = 0; ii < d->n; ii++) {
			size_t i = order ? order[ii] : ii;
			const struct val *k = &d->k[i];
			if (ii)
				ob_adds(rt, at, b, o->item_sep);
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
				to_json(rt, at, k, o, level + 1, &kb);
				json_str(rt, at, kb.p, kb.n, 0, b);
				break;
			}
			default:
				TYPE_ERR(rt, at, "tojson: keys must be str, int, float, bool or None, not %s", kind_name(k));
			}
			ob_adds(rt, at, b, o->key_sep);
			to_json(rt, at, &d->v[i], o, level + 1, b);
		}
		if (o->indent)
			json_newline(rt, at, o, level, b);
		ob_addc(rt, at, b, '}');
		return;
	}
	default:
		break;
	}
	TYPE_ERR(rt, at, "tojson: object of type %s is not JSON serializable", kind_name(v));
}

/* ------------------------------------------------------------------------
 * Truth, equality, ordering, arithmetic (Python semantics)
 * ---------------------------------------------------------------------- */

static int truthy(const struct val *v)
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

static int val_eq(struct rt *rt, const struct node *at, const struct val *a, const struct val *b, int depth)
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
			if (!val_eq(rt, at, &x->v[i], &y->v[i], depth + 1))
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
			long j = dict_find(rt, at, y, &x->k[i]);
			if (j < 0 || !val_eq(rt, at, &x->v[i], &y->v[j], depth + 1))
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
static int val_cmp(struct rt *rt, const struct node *at, const struct val *a, const struct val *b, const char *op,
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
			if (!val_eq(rt, at, &x->v[i], &y->v[i], depth + 1))
				return val_cmp(rt, at, &x->v[i], &y->v[i], op, depth + 1);
		return x->n < y->n ? -1 : x->n > y->n;
	}
	if (a->t == V_UNDEF || b->t == V_UNDEF)
		TYPE_ERR(rt, at, "'%s' on an undefined value", op);
	TYPE_ERR(rt, at, "'%s' not supported between instances of '%s' and '%s'", op, kind_name(a), kind_name(b));
}

static int contains(struct rt *rt, const struct node *at, const struct val *needle, const struct val *hay)
{
	switch (hay->t) {
	case V_STR:
		if (needle->t != V_STR)
			TYPE_ERR(rt, at, "'in <string>' requires string as left operand, not %s", kind_name(needle));
		if (!needle->u.s.n)
			return 1;
		return memmem(hay->u.s.p, hay->u.s.n, needle->u.s.p, needle->u.s.n) != NULL;
	case V_LIST:
		for (size_t i = 0; i < hay->u.l->n; i++)
			if (val_eq(rt, at, needle, &hay->u.l->v[i], 0))
				return 1;
		return 0;
	case V_DICT:
		return dict_find(rt, at, hay->u.d, needle) >= 0;
	case V_UNDEF:
		return 0;
	}
	TYPE_ERR(rt, at, "argument of type '%s' is not iterable", kind_name(hay));
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
		return seq->t == V_STR ? vstr("", 0) : vlist(list_new(rt, at, 0, seq->u.l->kind));
	if (seq->t == V_STR) {
		if (seq->u.s.n && (uint64_t)k > rt->max_out / seq->u.s.n)
			rfail(rt, at, KV_ERR_INVALID, "string repetition larger than the %zu byte output cap", rt->max_out);
		struct outbuf b = {0};
		for (int64_t i = 0; i < k; i++)
			ob_add(rt, at, &b, seq->u.s.p, seq->u.s.n);
		struct val r = ob_val(&b);
		r.safe = seq->safe;
		return r;
	}
	const struct list *l = seq->u.l;
	if (l->n && (uint64_t)k > (uint64_t)(1u << 24) / l->n)
		rfail(rt, at, KV_ERR_INVALID, "list repetition too large");
	struct list *r = list_new(rt, at, l->n * (size_t)k, l->kind);
	for (int64_t i = 0; i < k; i++)
		memcpy(r->v + (size_t)i * l->n, l->v, l->n * sizeof *l->v);
	return vlist(r);
}

static struct val markup_escape(struct rt *rt, const struct node *at, const struct val *v);

static struct val binop(struct rt *rt, const struct node *at, int op, const struct val *a, const struct val *b)
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
				y = markup_escape(rt, at, b);
			else if (b->safe && !a->safe)
				x = markup_escape(rt, at, a);
			if (!x.u.s.n) {
				y.safe = a->safe | b->safe;
				return y;
			}
			if (!y.u.s.n) {
				x.safe = a->safe | b->safe;
				return x;
			}
			if (x.u.s.n + y.u.s.n > rt->max_out)
				rfail(rt, at, KV_ERR_INVALID, "string longer than the %zu byte output cap", rt->max_out);
			char *p = ralloc(rt, at, x.u.s.n + y.u.s.n + 1);
			memcpy(p, x.u.s.p, x.u.s.n);
			memcpy(p + x.u.s.n, y.u.s.p, y.u.s.n);
			struct val v = vstr(p, x.u.s.n + y.u.s.n);
			v.safe = a->safe | b->safe;
			return v;
		}
		if (a->t == V_LIST && b->t == V_LIST && a->u.l->kind == b->u.l->kind &&
		    (a->u.l->kind == L_LIST || a->u.l->kind == L_TUPLE)) {
			struct list *l = list_new(rt, at, a->u.l->n + b->u.l->n, a->u.l->kind);
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
	TYPE_ERR(rt, at, "unsupported operand type(s) for %s: '%s' and '%s'", names[op], kind_name(a), kind_name(b));
}

/* ------------------------------------------------------------------------
 * Undefined, attribute and item access, slicing, iteration
 * ---------------------------------------------------------------------- */

/* An Undefined for a missing attribute/item of a value of kind `parent`. */
static struct val undef_of(const char *name, size_t n, int parent_kind, int is_item)
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

static void __attribute__((noreturn)) fail_undef(struct rt *rt, const struct node *at, const struct val *u)
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

static struct val method_val(struct rt *rt, const struct node *at, const struct val *self, int id)
{
	struct method *me = ralloc(rt, at, sizeof *me);
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
	int m = meth_lookup(V_LOOP, 0, s, n);
	if (m >= 0)
		return method_val(rt, at, lv, m);
	return undef_of(s, n, V_LOOP, 0);
}

/* obj.name (Jinja: Python attribute first, then obj[name]). */
static struct val get_attr(struct rt *rt, const struct node *at, const struct val *obj, const char *s, size_t n)
{
	if (obj->t == V_UNDEF)
		fail_undef(rt, at, obj);
	if (n >= 1 && s[0] == '_' && obj->t != V_DICT)
		return undef_of(s, n, obj->t, 0); /* sandbox: private attributes */
	switch (obj->t) {
	case V_DICT: {
		int m = meth_lookup(V_DICT, 0, s, n);
		if (m >= 0)
			return method_val(rt, at, obj, m);
		const struct val *v = dict_get_str(rt, at, obj->u.d, s, n);
		return v ? *v : undef_of(s, n, V_DICT, 0);
	}
	case V_STR:
	case V_LIST: {
		int m = meth_lookup(obj->t, obj->t == V_LIST ? obj->u.l->kind : 0, s, n);
		if (m >= 0)
			return method_val(rt, at, obj, m);
		return undef_of(s, n, obj->t, 0);
	}
	case V_NS: {
		const struct val *v = dict_get_str(rt, at, obj->u.ns->d, s, n);
		return v ? *v : undef_of(s, n, V_NS, 0);
	}
	case V_LOOP:
		return loop_attr(rt, at, obj, s, n);
	}
	return undef_of(s, n, obj->t, 0);
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
static size_t cp_offsets(struct rt *rt, const struct node *at, const char *p, size_t n, size_t **offs)
{
	if (is_ascii(p, n)) {
		*offs = NULL;
		return n;
	}
	size_t cnt = u8_count(p, n), k = 0;
	size_t *o = ralloc(rt, at, (cnt + 1) * sizeof *o);
	for (size_t i = 0; i < n; i += (size_t)u8_len(p + i, n - i))
		o[k++] = i;
	o[k] = n;
	*offs = o;
	return k;
}

#define OFF(offs, i) ((offs) ? (offs)[i] : (size_t)(i))

static struct val get_item(struct rt *rt, const struct node *at, const struct val *obj, const struct val *key)
{
	if (obj->t == V_UNDEF)
		fail_undef(rt, at, obj);
	switch (obj->t) {
	case V_LIST:
		if (is_seq_list(obj) && is_intlike(key)) {
			int64_t i = key->u.i, len = (int64_t)obj->u.l->n;
			if (i < 0)
				i += len;
			if (i >= 0 && i < len)
				return obj->u.l->v[i];
			return undef_of(NULL, 0, V_LIST, 1);
		}
		break;
	case V_STR:
		if (is_intlike(key)) {
			size_t *offs;
			size_t cnt = cp_offsets(rt, at, obj->u.s.p, obj->u.s.n, &offs);
			int64_t i = key->u.i;
			if (i < 0)
				i += (int64_t)cnt;
			if (i >= 0 && (size_t)i < cnt) {
				struct val r = vstr(obj->u.s.p + OFF(offs, i), OFF(offs, i + 1) - OFF(offs, i));
				r.safe = obj->safe;
				return r;
			}
			return undef_of(NULL, 0, V_STR, 1);
		}
		break;
	case V_DICT: {
		long i = dict_find(rt, at, obj->u.d, key);
		if (i >= 0)
			return obj->u.d->v[i];
		break;
	}
	}
	if (key->t == V_STR)
		return get_attr(rt, at, obj, key->u.s.p, key->u.s.n);
	return undef_of(NULL, 0, obj->t, 1);
}

static int slice_index(struct rt *rt, const struct node *at, const struct val *v, int64_t *out)
{
	if (v->t == V_MISSING || v->t == V_NONE)
		return 0;
	if (!is_intlike(v))
		TYPE_ERR(rt, at, "slice indices must be integers or None, not %s", kind_name(v));
	*out = v->u.i;
	return 1;
}

/* Python's PySlice_AdjustIndices; returns the slice length. */
static int64_t slice_adjust(struct rt *rt, const struct node *at, int64_t len, const struct val *a,
			    const struct val *b, const struct val *c, int64_t *start, int64_t *stop, int64_t *stepp)
{
	int64_t step = 1;
	if (slice_index(rt, at, c, &step) && step == 0)
		TYPE_ERR(rt, at, "slice step cannot be zero");
	int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? len : len - 1;
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
		s0 = step > 0 ? lower : upper;
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
		s1 = step > 0 ? upper : lower;
	}
	*start = s0;
	*stop = s1;
	*stepp = step;
	if (step > 0)
		return s0 < s1 ? (s1 - s0 - 1) / step + 1 : 0;
	return s1 < s0 ? (s0 - s1 - 1) / (-step) + 1 : 0;
}

static struct val do_slice(struct rt *rt, const struct node *at, const struct val *obj, const struct val *a,
			   const struct val *b, const struct val *c)
{
	int64_t start, stop, step, cnt;
	if (obj->t == V_UNDEF)
		fail_undef(rt, at, obj);
	if (obj->t == V_STR) {
		size_t *offs;
		size_t ncp = cp_offsets(rt, at, obj->u.s.p, obj->u.s.n, &offs);
		cnt = slice_adjust(rt, at, (int64_t)ncp, a, b, c, &start, &stop, &step);
		struct val r;
		if (step == 1) {
			r = cnt ? vstr(obj->u.s.p + OFF(offs, start), OFF(offs, start + cnt) - OFF(offs, start))
				: vstr("", 0);
		} else {
			struct outbuf ob = {0};
			for (int64_t i = 0, k = start; i < cnt; i++, k += step)
				ob_add(rt, at, &ob, obj->u.s.p + OFF(offs, k), OFF(offs, k + 1) - OFF(offs, k));
			r = ob_val(&ob);
		}
		r.safe = obj->safe;
		return r;
	}
	if (is_seq_list(obj)) {
		const struct list *l = obj->u.l;
		cnt = slice_adjust(rt, at, (int64_t)l->n, a, b, c, &start, &stop, &step);
		struct list *r = list_new(rt, at, (size_t)cnt, l->kind);
		for (int64_t i = 0, k = start; i < cnt; i++, k += step)
			r->v[i] = l->v[k];
		if (l->kind == L_RANGE) {
			r->r0 = l->r0 + start * l->rs;
			r->r1 = l->r0 + stop * l->rs;
			r->rs = l->rs * step;
		}
		return vlist(r);
	}
	return undef_of(NULL, 0, obj->t, 1);
}

/* The items a for loop (or a filter) iterates over. */
static const struct list *iter_items(struct rt *rt, const struct node *at, const struct val *v)
{
	switch (v->t) {
	case V_LIST:
		return v->u.l;
	case V_DICT: {
		struct list *l = list_new(rt, at, v->u.d->n, L_LIST);
		if (v->u.d->n)
			memcpy(l->v, v->u.d->k, v->u.d->n * sizeof *l->v);
		return l;
	}
	case V_STR: {
		size_t *offs;
		size_t cnt = cp_offsets(rt, at, v->u.s.p, v->u.s.n, &offs);
		struct list *l = list_new(rt, at, cnt, L_LIST);
		for (size_t i = 0; i < cnt; i++) {
			l->v[i] = vstr(v->u.s.p + OFF(offs, i), OFF(offs, i + 1) - OFF(offs, i));
			l->v[i].safe = v->safe;
		}
		return l;
	}
	case V_UNDEF:
		return list_new(rt, at, 0, L_LIST);
	}
	TYPE_ERR(rt, at, "'%s' object is not iterable", kind_name(v));
}

/* len(v), or a TypeError. */
static int64_t val_len(struct rt *rt, const struct node *at, const struct val *v)
{
	switch (v->t) {
	case V_STR:
		return (int64_t)u8_count(v->u.s.p, v->u.s.n);
	case V_LIST:
		if (v->u.l->kind != L_ITER)
			return (int64_t)v->u.l->n;
		break;
	case V_DICT:
		return (int64_t)v->u.d->n;
	case V_UNDEF:
		return 0;
	}
	TYPE_ERR(rt, at, "object of type '%s' has no len()", kind_name(v));
}

/* ------------------------------------------------------------------------
 * Calls: argument binding, str/dict/list methods, globals, macros
 * ---------------------------------------------------------------------- */

struct args {
	const struct val *v;    /* positional */
	int n;
	const char *const *kwn; /* keyword names */
	const struct val *kwv;
	int nkw;
};

/* Bind args to parameter names pn[0..np). out[i] is V_MISSING when not
 * given; the first nreq parameters are required. */
static void bind(struct rt *rt, const struct node *at, const char *fname, const char *const *pn, int np, int nreq,
		 const struct args *a, struct val *out)
{
	if (a->n > np)
		TYPE_ERR(rt, at, "%s() takes at most %d argument%s (%d given)", fname, np, np == 1 ? "" : "s", a->n);
	for (int i = 0; i < np; i++)
		out[i] = i < a->n ? a->v[i] : VMISSING;
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
		TYPE_ERR(rt, at, "%s(): '%s' object cannot be interpreted as an integer", fname, kind_name(v));
	return v->u.i;
}

static const struct val *want_str(struct rt *rt, const struct node *at, const char *fname, const struct val *v)
{
	if (v->t != V_STR)
		TYPE_ERR(rt, at, "%s(): expected a string, got %s", fname, kind_name(v));
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
		int l = u8_dec(p + i, n - i, &c);
		if (!l) {
			c = (unsigned char)p[i];
			l = 1;
		}
		if (special_casing(c))
			UNSUP(rt, at, "case mapping of U+%04X (it maps to several characters; not supported)",
			      (unsigned)c);
		int32_t r = c;
		switch (mode) {
		case CASE_LOWER: r = utf8proc_tolower(c); break;
		case CASE_UPPER: r = utf8proc_toupper(c); break;
		case CASE_TITLE:
			r = prev_cased ? utf8proc_tolower(c) : utf8proc_totitle(c);
			prev_cased = py_iscased(c);
			break;
		case CASE_CAPITALIZE:
			r = first ? utf8proc_totitle(c) : utf8proc_tolower(c);
			break;
		}
		first = 0;
		ob_cp(rt, at, &b, r);
		i += (size_t)l;
	}
	struct val v = ob_val(&b);
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
		int l = u8_dec(s->u.s.p + i, s->u.s.n - i, &c);
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
			int l = u8_dec(chars->u.s.p + i, chars->u.s.n - i, &c);
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
#define IN_SET(c) (nset < 0 ? py_isspace(c) : in_set(set, nset, c))
	if (which & 1) {
		while (a < b) {
			int32_t c;
			int l = u8_dec(p + a, b - a, &c);
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
			int l = u8_dec(p + q, b - q, &c);
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
			while (i < n && (l = u8_dec(p + i, n - i, &c)) && py_isspace(c))
				i += (size_t)l;
			if (i >= n)
				break;
			size_t st = i;
			while (i < n) {
				l = u8_dec(p + i, n - i, &c);
				if (!l)
					l = 1, c = 0;
				if (py_isspace(c))
					break;
				i += (size_t)l;
			}
			struct val w = vstr(p + st, i - st);
			w.safe = s->safe;
			lb_push(rt, at, &parts, w);
		}
		if (maxsplit < 0 || (size_t)maxsplit + 1 >= parts.n)
			return lb_done(rt, at, &parts, L_LIST);
		/* with maxsplit the remainder keeps its inner whitespace */
		if (!right) {
			for (size_t k = 0; k < (size_t)maxsplit; k++)
				lb_push(rt, at, &lb, parts.v[k]);
			const char *rest = parts.v[maxsplit].u.s.p;
			struct val w = vstr(rest, (size_t)(p + n - rest));
			w = str_strip(rt, at, &w, NULL, 2);
			lb_push(rt, at, &lb, w);
		} else {
			size_t keep = parts.n - (size_t)maxsplit;
			const struct val *lastk = &parts.v[keep - 1];
			struct val w = vstr(p, (size_t)(lastk->u.s.p + lastk->u.s.n - p));
			w = str_strip(rt, at, &w, NULL, 1);
			lb_push(rt, at, &lb, w);
			for (size_t k = keep; k < parts.n; k++)
				lb_push(rt, at, &lb, parts.v[k]);
		}
		return lb_done(rt, at, &lb, L_LIST);
	}
	if (sep->t != V_STR)
		TYPE_ERR(rt, at, "must be str or None, not %s", kind_name(sep));
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
				lb_push(rt, at, &lb, w);
				break;
			}
			struct val w = vstr(p + i, (size_t)(hit - (p + i)));
			w.safe = s->safe;
			lb_push(rt, at, &lb, w);
			i = (size_t)(hit - p) + m;
			done++;
			step(rt, at, 1);
		}
		return lb_done(rt, at, &lb, L_LIST);
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
			lb_push(rt, at, &lb, w);
			break;
		}
		struct val w = vstr(hit + m, (size_t)(p + end - (hit + m)));
		w.safe = s->safe;
		lb_push(rt, at, &lb, w);
		end = (size_t)(hit - p);
		done++;
		step(rt, at, 1);
	}
	for (size_t a = 0, b = lb.n ? lb.n - 1 : 0; a < b; a++, b--) {
		struct val t = lb.v[a];
		lb.v[a] = lb.v[b];
		lb.v[b] = t;
	}
	return lb_done(rt, at, &lb, L_LIST);
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
		size_t cnt = cp_offsets(rt, at, p, n, &offs);
		for (size_t k = 0; k <= cnt; k++) {
			if (count < 0 || done < count) {
				ob_add(rt, at, &b, new->u.s.p, new->u.s.n);
				done++;
			}
			if (k < cnt)
				ob_add(rt, at, &b, p + OFF(offs, k), OFF(offs, k + 1) - OFF(offs, k));
		}
		return ob_val(&b);
	}
	for (;;) {
		const char *hit = count >= 0 && done >= count ? NULL : memmem(p + i, n - i, old->u.s.p, old->u.s.n);
		if (!hit) {
			if (i == 0)
				return *s; /* nothing replaced: the same string */
			ob_add(rt, at, &b, p + i, n - i);
			break;
		}
		ob_add(rt, at, &b, p + i, (size_t)(hit - (p + i)));
		ob_add(rt, at, &b, new->u.s.p, new->u.s.n);
		i = (size_t)(hit - p) + old->u.s.n;
		done++;
	}
	return ob_val(&b);
}

static struct val str_pad(struct rt *rt, const struct node *at, const struct val *s, int64_t width,
			  const struct val *fill, int mode /* 0 center, 1 ljust, 2 rjust */)
{
	int64_t len = (int64_t)u8_count(s->u.s.p, s->u.s.n);
	const char *f = " ";
	size_t fl = 1;
	if (fill && fill->t != V_MISSING) {
		if (fill->t != V_STR || u8_count(fill->u.s.p, fill->u.s.n) != 1)
			TYPE_ERR(rt, at, "the fill character must be exactly one character long");
		f = fill->u.s.p;
		fl = fill->u.s.n;
	}
	if (width <= len)
		return *s;
	if (width > (int64_t)rt->max_out)
		rfail(rt, at, KV_ERR_INVALID, "padding wider than the output cap");
	int64_t marg = width - len, left;
	if (mode == 0)
		left = marg / 2 + (marg & width & 1);
	else if (mode == 1)
		left = 0;
	else
		left = marg;
	struct outbuf b = {0};
	for (int64_t i = 0; i < left; i++)
		ob_add(rt, at, &b, f, fl);
	ob_add(rt, at, &b, s->u.s.p, s->u.s.n);
	for (int64_t i = 0; i < marg - left; i++)
		ob_add(rt, at, &b, f, fl);
	struct val r = ob_val(&b);
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
		int l = u8_dec(p + i, n - i, &c);
		if (!l)
			l = 1, c = 0;
		if (is_line_break(c)) {
			size_t e = i + (size_t)l;
			if (c == '\r' && e < n && p[e] == '\n')
				e++;
			struct val w = vstr(p + st, (keepends ? e : i) - st);
			w.safe = s->safe;
			lb_push(rt, at, &lb, w);
			i = st = e;
			continue;
		}
		i += (size_t)l;
	}
	if (st < n) {
		struct val w = vstr(p + st, n - st);
		w.safe = s->safe;
		lb_push(rt, at, &lb, w);
	}
	return lb_done(rt, at, &lb, L_LIST);
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
	return hit ? (int64_t)u8_count(p, (size_t)(hit - p)) : -1;
}

static struct val str_join(struct rt *rt, const struct node *at, const struct val *sep, const struct list *items,
			   int strict)
{
	struct outbuf b = {0};
	for (size_t i = 0; i < items->n; i++) {
		if (i)
			ob_add(rt, at, &b, sep->u.s.p, sep->u.s.n);
		if (items->v[i].t == V_STR) {
			ob_add(rt, at, &b, items->v[i].u.s.p, items->v[i].u.s.n);
		} else if (strict) {
			TYPE_ERR(rt, at, "sequence item %zu: expected str instance, %s found", i, kind_name(&items->v[i]));
		} else {
			to_str(rt, at, &items->v[i], &b, 0);
		}
	}
	return ob_val(&b);
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
			ob_addc(rt, at, &b, '{');
			i += 2;
			continue;
		}
		if (c == '}' && i + 1 < n && p[i + 1] == '}') {
			ob_addc(rt, at, &b, '}');
			i += 2;
			continue;
		}
		if (c == '}')
			TYPE_ERR(rt, at, "single '}' encountered in format string");
		if (c != '{') {
			ob_addc(rt, at, &b, c);
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
			to_repr(rt, at, v, &b, 0);
		else
			to_str(rt, at, v, &b, 0);
		i = j + 1;
	}
	return ob_val(&b);
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
			 kind_name(x));
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
		int l = u8_dec(s->u.s.p + i, s->u.s.n - i, &c);
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
		return markup_escape(rt, at, v);
	return *v;
}

static struct val call_method(struct rt *rt, const struct node *at, const struct val *self, int id,
			      const struct args *a)
{
	struct val p[4];
	const char *name = meth_names[id];
	char fname[48];
	snprintf(fname, sizeof fname, "%s.%s", kind_name(self), name);
	if (!meth_supported(id)) {
		if ((id > M_D__UNSUPPORTED && id < M_L_COUNT) || (id > M_L__UNSUPPORTED && id < M_LOOP_CYCLE))
			TYPE_ERR(rt, at, "access to attribute '%s' of '%s' object is unsafe (templates cannot modify "
					 "lists or dicts)", name, kind_name(self));
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
			int64_t w = want_int(rt, at, fname, &p[0]), len = (int64_t)u8_count(self->u.s.p, self->u.s.n);
			if (w <= len)
				return *self;
			if (w > (int64_t)rt->max_out)
				rfail(rt, at, KV_ERR_INVALID, "padding wider than the output cap");
			struct outbuf b = {0};
			size_t sign = self->u.s.n && (self->u.s.p[0] == '-' || self->u.s.p[0] == '+');
			ob_add(rt, at, &b, self->u.s.p, sign);
			for (int64_t i = 0; i < w - len; i++)
				ob_addc(rt, at, &b, '0');
			ob_add(rt, at, &b, self->u.s.p + sign, self->u.s.n - sign);
			return ob_val(&b);
		}
		case M_S_COUNT: {
			if (a->n != 1 || a->nkw)
				UNSUP(rt, at, "%s() with start/end arguments", fname);
			want_str(rt, at, fname, &a->v[0]);
			if (!a->v[0].u.s.n)
				return vint((int64_t)u8_count(self->u.s.p, self->u.s.n) + 1);
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
			struct list *l = list_new(rt, at, 3, L_TUPLE);
			int64_t k = str_find(self, &p[0], id == M_S_RPARTITION);
			if (k < 0) {
				l->v[0] = id == M_S_PARTITION ? *self : vstr("", 0);
				l->v[1] = vstr("", 0);
				l->v[2] = id == M_S_PARTITION ? vstr("", 0) : *self;
			} else {
				size_t *offs;
				cp_offsets(rt, at, self->u.s.p, self->u.s.n, &offs);
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
			return str_splitlines(rt, at, self, p[0].t != V_MISSING && truthy(&p[0]));
		case M_S_JOIN: {
			bind(rt, at, fname, nx, 1, 1, a, p);
			return str_join(rt, at, self, iter_items(rt, at, &p[0]), 1);
		}
		case M_S_FORMAT:
			return str_format(rt, at, self, a);
		case M_S_ISALNUM: bind(rt, at, fname, NULL, 0, 0, a, p); return vbool(str_all(self, py_isalnum));
		case M_S_ISALPHA: bind(rt, at, fname, NULL, 0, 0, a, p); return vbool(str_all(self, py_isalpha));
		case M_S_ISDIGIT:
		case M_S_ISDECIMAL: bind(rt, at, fname, NULL, 0, 0, a, p); return vbool(str_all(self, py_isdigit));
		case M_S_ISNUMERIC: bind(rt, at, fname, NULL, 0, 0, a, p); return vbool(str_all(self, py_isnumeric_cp));
		case M_S_ISSPACE: bind(rt, at, fname, NULL, 0, 0, a, p); return vbool(str_all(self, py_isspace));
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
			long i = dict_find(rt, at, d, &p[0]);
			return i >= 0 ? d->v[i] : p[1].t == V_MISSING ? VNONE : p[1];
		}
		case M_D_ITEMS: {
			bind(rt, at, fname, NULL, 0, 0, a, p);
			struct list *l = list_new(rt, at, d->n, L_ITEMS);
			for (size_t i = 0; i < d->n; i++) {
				struct list *pair = list_new(rt, at, 2, L_TUPLE);
				pair->v[0] = d->k[i];
				pair->v[1] = d->v[i];
				l->v[i] = vlist(pair);
			}
			return vlist(l);
		}
		case M_D_KEYS:
		case M_D_VALUES: {
			bind(rt, at, fname, NULL, 0, 0, a, p);
			struct list *l = list_new(rt, at, d->n, id == M_D_KEYS ? L_KEYS : L_VALUES);
			if (d->n)
				memcpy(l->v, id == M_D_KEYS ? d->k : d->v, d->n * sizeof *l->v);
			return vlist(l);
		}
		case M_D_COPY: {
			bind(rt, at, fname, NULL, 0, 0, a, p);
			struct dict *c = dict_new(rt, at, d->n);
			for (size_t i = 0; i < d->n; i++)
				dict_set(rt, at, c, d->k[i], d->v[i]);
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
				c += val_eq(rt, at, &l->v[i], &p[0], 0);
			return vint(c);
		}
		case M_L_INDEX:
			if (a->n != 1 || a->nkw)
				UNSUP(rt, at, "%s() with start/end arguments", fname);
			for (size_t i = 0; i < l->n; i++)
				if (val_eq(rt, at, &l->v[i], &a->v[0], 0))
					return vint((int64_t)i);
			TYPE_ERR(rt, at, "%s(): value is not in the list", fname);
		case M_L_COPY: {
			bind(rt, at, fname, NULL, 0, 0, a, p);
			struct list *c = list_new(rt, at, l->n, l->kind);
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

/* --- globals ------------------------------------------------------------------ */

static void exec_body(struct rt *rt, struct node *const *v, int n, struct scope *sc, int *ctl);
static struct val eval(struct rt *rt, const struct node *x, struct scope *sc);

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
		struct list *l = list_new(rt, at, (size_t)cnt, L_RANGE);
		l->r0 = r0;
		l->r1 = r1;
		l->rs = rs;
		for (int64_t i = 0; i < cnt; i++)
			l->v[i] = vint(r0 + i * rs);
		return vlist(l);
	}
	case G_NAMESPACE:
	case G_DICT: {
		struct dict *d = dict_new(rt, at, 0);
		if (a->n > 1)
			TYPE_ERR(rt, at, "%s() expected at most 1 positional argument", gfn_names[fn]);
		if (a->n == 1) {
			const struct val *src = &a->v[0];
			if (src->t == V_DICT) {
				for (size_t i = 0; i < src->u.d->n; i++)
					dict_set(rt, at, d, src->u.d->k[i], src->u.d->v[i]);
			} else {
				const struct list *l = iter_items(rt, at, src);
				for (size_t i = 0; i < l->n; i++) {
					const struct val *e = &l->v[i];
					if (!is_seq_list(e) || e->u.l->n != 2)
						TYPE_ERR(rt, at, "%s(): sequence element %zu is not a pair", gfn_names[fn], i);
					dict_set(rt, at, d, e->u.l->v[0], e->u.l->v[1]);
				}
			}
		}
		for (int k = 0; k < a->nkw; k++)
			dict_set(rt, at, d, vstr(a->kwn[k], strlen(a->kwn[k])), a->kwv[k]);
		if (fn == G_DICT)
			return vdict(d);
		struct ns *ns = ralloc(rt, at, sizeof *ns);
		ns->d = d;
		struct val v = {.t = V_NS};
		v.u.ns = ns;
		return v;
	}
	case G_RAISE: {
		static const char *const pn[] = {"message"};
		bind(rt, at, "raise_exception", pn, 1, 1, a, p);
		struct val m = str_of(rt, at, &p[0]);
		rfail(rt, at, KV_ERR_INVALID, "template error: %.*s", (int)(m.u.s.n > 500 ? 500 : m.u.s.n), m.u.s.p);
	}
	case G_STRFTIME: {
		static const char *const pn[] = {"format"};
		char buf[512];
		bind(rt, at, "strftime_now", pn, 1, 1, a, p);
		want_str(rt, at, "strftime_now", &p[0]);
		time_t now = time(NULL);
		struct tm tmv;
		localtime_r(&now, &tmv);
		char *f = ralloc(rt, at, p[0].u.s.n + 1);
		memcpy(f, p[0].u.s.p, p[0].u.s.n);
		f[p[0].u.s.n] = 0;
		size_t w = p[0].u.s.n ? strftime(buf, sizeof buf, f, &tmv) : 0;
		if (p[0].u.s.n && !w)
			UNSUP(rt, at, "strftime_now(): format produced no output or more than %zu bytes", sizeof buf);
		return str_copy(rt, at, buf, w);
	}
	}
	UNSUP(rt, at, "the global function '%s' is not supported", gfn_names[fn]);
}

static struct val call_macro(struct rt *rt, const struct node *at, const struct macro *m, const struct args *a)
{
	const struct node *def = m->def;
	int np = def->tg->n, ndef = def->nw;
	if (++rt->macro_depth > TM_MAX_MACRO_DEPTH)
		rfail(rt, at, KV_ERR_INVALID, "macros nested deeper than %d calls (runaway recursion?)",
		      TM_MAX_MACRO_DEPTH);
	step(rt, at, 1);
	struct scope *sc = scope_new(rt, at, m->closure);
	if (a->n > np && !def->varargs)
		TYPE_ERR(rt, at, "macro '%s' takes not more than %d argument(s)", def->s, np);
	uint8_t *used = ralloc(rt, at, (size_t)a->nkw + 1);
	memset(used, 0, (size_t)a->nkw + 1);
	for (int i = 0; i < np; i++) {
		struct val v = i < a->n ? a->v[i] : VMISSING;
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
			v = di >= 0 ? eval(rt, def->w[di], sc) : vundef(def->tg->names[i]);
		}
		scope_set(rt, at, sc, def->tg->syms[i], v);
	}
	struct dict *kw = dict_new(rt, at, 0);
	for (int k = 0; k < a->nkw; k++)
		if (!used[k]) {
			if (!def->kwargs)
				TYPE_ERR(rt, at, "macro '%s' takes no keyword argument '%s'", def->s, a->kwn[k]);
			dict_set(rt, at, kw, vstr(a->kwn[k], strlen(a->kwn[k])), a->kwv[k]);
		}
	if (def->varargs) {
		int extra = a->n > np ? a->n - np : 0;
		struct list *l = list_new(rt, at, (size_t)extra, L_TUPLE);
		for (int i = 0; i < extra; i++)
			l->v[i] = a->v[np + i];
		scope_set(rt, at, sc, rt->t->sym_varargs, vlist(l));
	}
	if (def->kwargs)
		scope_set(rt, at, sc, rt->t->sym_kwargs, vdict(kw));
	struct outbuf *saved = rt->cap, ob = {0};
	int ctl = 0;
	rt->cap = &ob;
	exec_body(rt, def->v, def->nv, sc, &ctl);
	rt->cap = saved;
	rt->macro_depth--;
	return ob_val(&ob);
}

static struct val call_value(struct rt *rt, const struct node *at, const struct val *f, const struct args *a)
{
	switch (f->t) {
	case V_METHOD:
		return call_method(rt, at, &f->u.me->self, f->fn, a);
	case V_FUNC:
		return call_global(rt, at, f->fn, a);
	case V_MACRO:
		return call_macro(rt, at, f->u.m, a);
	case V_UNDEF:
		fail_undef(rt, at, f);
	}
	TYPE_ERR(rt, at, "'%s' object is not callable", kind_name(f));
}

/* ------------------------------------------------------------------------
 * Filters and tests
 * ---------------------------------------------------------------------- */

static struct val markup_escape(struct rt *rt, const struct node *at, const struct val *v)
{
	if (v->t == V_STR && v->safe)
		return *v;
	struct val s = str_of(rt, at, v);
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
		ob_add(rt, at, &b, s.u.s.p + i - run, run);
		run = 0;
		ob_adds(rt, at, &b, e);
	}
	struct val r;
	if (!b.n) {
		r = s;
	} else {
		ob_add(rt, at, &b, s.u.s.p + s.u.s.n - run, run);
		r = ob_val(&b);
	}
	r.safe = 1;
	return r;
}

static int test_value(struct rt *rt, const struct node *at, int id, const struct val *v, const struct args *a);
static struct val call_filter(struct rt *rt, const struct node *at, int id, const struct val *v,
			      const struct args *a);

/* Attribute path lookup for map/sort/selectattr ("a.b.0"). */
static struct val attr_path(struct rt *rt, const struct node *at, const struct val *item, const struct val *path)
{
	if (path->t == V_MISSING || path->t == V_NONE)
		return *item;
	if (is_intlike(path))
		return get_item(rt, at, item, path);
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
		cur = get_item(rt, at, &cur, &key);
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
	struct val *ti = ralloc(rt, at, n * sizeof *ti), *tk = ralloc(rt, at, n * sizeof *tk);
	for (size_t w = 1; w < n; w *= 2) {
		for (size_t lo = 0; lo < n; lo += 2 * w) {
			size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
			size_t i = lo, j = mid, o = lo;
			while (i < mid && j < hi) {
				int c = reverse ? val_cmp(rt, at, &keys[j], &keys[i], "<", 0) > 0
						: val_cmp(rt, at, &keys[j], &keys[i], "<", 0) < 0;
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
		step(rt, at, n);
	}
}

static int find_test(struct rt *rt, const struct node *at, const struct val *name)
{
	if (name->t != V_STR)
		TYPE_ERR(rt, at, "test name must be a string");
	int id = find_name(test_names, T__COUNT, name->u.s.p, name->u.s.n);
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
	const struct list *items = iter_items(rt, at, v);
	step(rt, at, items->n);
	for (size_t i = 0; i < items->n; i++) {
		struct val x = by_attr ? attr_path(rt, at, &items->v[i], &a->v[0]) : items->v[i];
		int r = tid >= 0 ? test_value(rt, at, tid, &x, &ta) : truthy(&x);
		if (r == want)
			lb_push(rt, at, &lb, items->v[i]);
	}
	return lb_done(rt, at, &lb, L_ITER);
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
		int l = u8_dec(p + i, n - i, &c);
		if (!l)
			l = 1, c = (unsigned char)p[i];
		int sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c);
		if (sep) {
			ob_add(rt, at, &b, p + i, (size_t)l);
			at_start = 1;
		} else {
			if (special_casing(c))
				UNSUP(rt, at, "case mapping of U+%04X (several characters) is not supported", (unsigned)c);
			ob_cp(rt, at, &b, at_start ? utf8proc_toupper(c) : utf8proc_tolower(c));
			at_start = 0;
		}
		i += (size_t)l;
	}
	return ob_val(&b);
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
			ob_addc(rt, at, &b, c);
			continue;
		}
		if (++i >= fmt->u.s.n)
			TYPE_ERR(rt, at, "incomplete format");
		c = fmt->u.s.p[i];
		if (c == '%') {
			ob_addc(rt, at, &b, '%');
			continue;
		}
		if (k >= a->n)
			TYPE_ERR(rt, at, "not enough arguments for format string");
		const struct val *v = &a->v[k++];
		if (c == 's') {
			to_str(rt, at, v, &b, 0);
		} else if (c == 'r') {
			to_repr(rt, at, v, &b, 0);
		} else if (c == 'd' || c == 'i') {
			if (!is_num(v))
				TYPE_ERR(rt, at, "%%%c format: a real number is required, not %s", c, kind_name(v));
			struct val iv = v->t == V_FLOAT ? py_int(rt, at, v, &VNONE, 10) : vint(v->u.i);
			if (iv.t != V_INT)
				TYPE_ERR(rt, at, "cannot convert float to integer");
			to_str(rt, at, &iv, &b, 0);
		} else {
			UNSUP(rt, at, "format(): only %%s, %%r, %%d, %%i and %%%% are supported");
		}
	}
	if (k < a->n)
		TYPE_ERR(rt, at, "not all arguments converted during string formatting");
	return ob_val(&b);
}

static struct val call_filter(struct rt *rt, const struct node *at, int id, const struct val *v,
			      const struct args *a)
{
	struct val p[6];
	const char *fname = filt_names[id];
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
		TYPE_ERR(rt, at, "bad operand type for abs(): '%s'", kind_name(v));
	case F_ATTR: {
		static const char *const pn[] = {"name"};
		bind(rt, at, fname, pn, 1, 1, a, p);
		want_str(rt, at, fname, &p[0]);
		if (v->t == V_DICT) {
			int m = meth_lookup(V_DICT, 0, p[0].u.s.p, p[0].u.s.n);
			return m >= 0 ? method_val(rt, at, v, m) : undef_of(p[0].u.s.p, p[0].u.s.n, V_DICT, 0);
		}
		return get_attr(rt, at, v, p[0].u.s.p, p[0].u.s.n);
	}
	case F_BATCH: {
		static const char *const pn[] = {"linecount", "fill_with"};
		bind(rt, at, fname, pn, 2, 1, a, p);
		int64_t k = want_int(rt, at, fname, &p[0]);
		if (k <= 0)
			TYPE_ERR(rt, at, "batch(): linecount must be positive");
		const struct list *items = iter_items(rt, at, v);
		struct lbuild out = {0};
		for (size_t i = 0; i < items->n; i += (size_t)k) {
			size_t m = items->n - i < (size_t)k ? items->n - i : (size_t)k;
			int fill = m < (size_t)k && p[1].t != V_MISSING && p[1].t != V_NONE;
			struct list *row = list_new(rt, at, fill ? (size_t)k : m, L_LIST);
			memcpy(row->v, items->v + i, m * sizeof *row->v);
			for (size_t j = m; fill && j < (size_t)k; j++)
				row->v[j] = p[1];
			lb_push(rt, at, &out, vlist(row));
		}
		return lb_done(rt, at, &out, L_ITER);
	}
	case F_CAPITALIZE:
	case F_LOWER:
	case F_UPPER: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		struct val s = str_of(rt, at, v);
		s.safe = v->t == V_STR && v->safe;
		return str_case(rt, at, &s, id == F_CAPITALIZE ? CASE_CAPITALIZE : id == F_LOWER ? CASE_LOWER : CASE_UPPER);
	}
	case F_TITLE: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		struct val s = str_of(rt, at, v);
		return jinja_title(rt, at, &s);
	}
	case F_CENTER: {
		static const char *const pn[] = {"width"};
		bind(rt, at, fname, pn, 1, 0, a, p);
		struct val s = str_of(rt, at, v);
		return str_pad(rt, at, &s, p[0].t == V_MISSING ? 80 : want_int(rt, at, fname, &p[0]), NULL, 0);
	}
	case F_COUNT:
	case F_LENGTH:
		bind(rt, at, fname, NULL, 0, 0, a, p);
		return vint(val_len(rt, at, v));
	case F_D:
	case F_DEFAULT: {
		static const char *const pn[] = {"default_value", "boolean"};
		bind(rt, at, fname, pn, 2, 0, a, p);
		int boolean = p[1].t != V_MISSING && truthy(&p[1]);
		if (v->t == V_UNDEF || (boolean && !truthy(v)))
			return p[0].t == V_MISSING ? vstr("", 0) : p[0];
		return *v;
	}
	case F_DICTSORT: {
		static const char *const pn[] = {"case_sensitive", "by", "reverse"};
		bind(rt, at, fname, pn, 3, 0, a, p);
		if (v->t != V_DICT)
			TYPE_ERR(rt, at, "dictsort(): expected a mapping, got %s", kind_name(v));
		int by = 0;
		if (p[1].t != V_MISSING) {
			want_str(rt, at, fname, &p[1]);
			if (p[1].u.s.n == 5 && !memcmp(p[1].u.s.p, "value", 5))
				by = 1;
			else if (!(p[1].u.s.n == 3 && !memcmp(p[1].u.s.p, "key", 3)))
				TYPE_ERR(rt, at, "dictsort(): you can only sort by either \"key\" or \"value\"");
		}
		const struct dict *d = v->u.d;
		struct list *l = list_new(rt, at, d->n, L_LIST);
		struct val *keys = ralloc(rt, at, (d->n ? d->n : 1) * sizeof *keys);
		int cs = p[0].t != V_MISSING && truthy(&p[0]);
		for (size_t i = 0; i < d->n; i++) {
			struct list *pair = list_new(rt, at, 2, L_TUPLE);
			pair->v[0] = d->k[i];
			pair->v[1] = d->v[i];
			l->v[i] = vlist(pair);
			keys[i] = lower_key(rt, at, by ? &d->v[i] : &d->k[i], cs);
		}
		sort_vals(rt, at, l->v, keys, d->n, p[2].t != V_MISSING && truthy(&p[2]));
		return vlist(l);
	}
	case F_E:
	case F_ESCAPE:
	case F_FORCEESCAPE:
		bind(rt, at, fname, NULL, 0, 0, a, p);
		if (id == F_FORCEESCAPE && v->t == V_STR && v->safe) {
			struct val s = *v;
			s.safe = 0;
			return markup_escape(rt, at, &s);
		}
		return markup_escape(rt, at, v);
	case F_FIRST: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		const struct list *l = iter_items(rt, at, v);
		return l->n ? l->v[0] : vundef("no first item, sequence was empty");
	}
	case F_LAST: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		if (v->t == V_LIST && v->u.l->kind == L_ITER)
			TYPE_ERR(rt, at, "last(): a generator cannot be reversed (use |list first)");
		const struct list *l = iter_items(rt, at, v);
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
			TYPE_ERR(rt, at, "indent(): can only indent a string, not %s", kind_name(v));
		struct val ind;
		if (p[0].t == V_STR) {
			ind = p[0];
		} else {
			int64_t w = p[0].t == V_MISSING ? 4 : want_int(rt, at, fname, &p[0]);
			if (w > 4096)
				UNSUP(rt, at, "indent wider than 4096");
			char *sp = ralloc(rt, at, w > 0 ? (size_t)w : 1);
			memset(sp, ' ', w > 0 ? (size_t)w : 0);
			ind = vstr(sp, w > 0 ? (size_t)w : 0);
		}
		int first = p[1].t != V_MISSING && truthy(&p[1]), blank = p[2].t != V_MISSING && truthy(&p[2]);
		/* s += "\n"; lines = s.splitlines() */
		struct outbuf sb = {0};
		ob_add(rt, at, &sb, v->u.s.p, v->u.s.n);
		ob_addc(rt, at, &sb, '\n');
		struct val sv = ob_val(&sb);
		const struct list *lines = str_splitlines(rt, at, &sv, 0).u.l;
		struct outbuf b = {0};
		if (first)
			ob_add(rt, at, &b, ind.u.s.p, ind.u.s.n);
		for (size_t i = 0; i < lines->n; i++) {
			const struct val *ln = &lines->v[i];
			if (i) {
				ob_addc(rt, at, &b, '\n');
				if (blank || ln->u.s.n)
					ob_add(rt, at, &b, ind.u.s.p, ind.u.s.n);
			}
			ob_add(rt, at, &b, ln->u.s.p, ln->u.s.n);
		}
		struct val r = ob_val(&b);
		r.safe = v->safe;
		return r;
	}
	case F_ITEMS: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		if (v->t == V_UNDEF)
			return vlist(list_new(rt, at, 0, L_ITER));
		if (v->t != V_DICT)
			TYPE_ERR(rt, at, "items(): can only get item pairs from a mapping");
		struct list *l = list_new(rt, at, v->u.d->n, L_ITER);
		for (size_t i = 0; i < v->u.d->n; i++) {
			struct list *pair = list_new(rt, at, 2, L_TUPLE);
			pair->v[0] = v->u.d->k[i];
			pair->v[1] = v->u.d->v[i];
			l->v[i] = vlist(pair);
		}
		return vlist(l);
	}
	case F_JOIN: {
		static const char *const pn[] = {"d", "attribute"};
		bind(rt, at, fname, pn, 2, 0, a, p);
		struct val sep = p[0].t == V_MISSING ? vstr("", 0) : str_of(rt, at, &p[0]);
		const struct list *items = iter_items(rt, at, v);
		if (p[1].t != V_MISSING && p[1].t != V_NONE) {
			struct list *m = list_new(rt, at, items->n, L_LIST);
			for (size_t i = 0; i < items->n; i++)
				m->v[i] = attr_path(rt, at, &items->v[i], &p[1]);
			items = m;
		}
		step(rt, at, items->n);
		return str_join(rt, at, &sep, items, 0);
	}
	case F_LIST: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		const struct list *items = iter_items(rt, at, v);
		struct list *l = list_new(rt, at, items->n, L_LIST);
		memcpy(l->v, items->v, items->n * sizeof *l->v);
		return vlist(l);
	}
	case F_MAP: {
		struct lbuild lb = {0};
		if (!truthy(v))
			return vlist(list_new(rt, at, 0, L_ITER));
		const struct list *items = iter_items(rt, at, v);
		step(rt, at, items->n);
		if (a->n == 0) {
			struct val attr = VMISSING, def = VNONE;
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
				lb_push(rt, at, &lb, x);
			}
			return lb_done(rt, at, &lb, L_ITER);
		}
		if (a->v[0].t != V_STR)
			TYPE_ERR(rt, at, "map(): the filter name must be a string");
		int fid = find_name(filt_names, F__COUNT, a->v[0].u.s.p, a->v[0].u.s.n);
		if (fid < 0)
			TYPE_ERR(rt, at, "no filter named '%.*s'", (int)(a->v[0].u.s.n > 60 ? 60 : a->v[0].u.s.n),
				 a->v[0].u.s.p);
		if (fid >= F_FIRST_UNSUPPORTED)
			UNSUP(rt, at, "filter '%s' is not supported", filt_names[fid]);
		struct args fa = {a->v + 1, a->n - 1, a->kwn, a->kwv, a->nkw};
		for (size_t i = 0; i < items->n; i++)
			lb_push(rt, at, &lb, call_filter(rt, at, fid, &items->v[i], &fa));
		return lb_done(rt, at, &lb, L_ITER);
	}
	case F_MAX:
	case F_MIN: {
		static const char *const pn[] = {"case_sensitive", "attribute"};
		bind(rt, at, fname, pn, 2, 0, a, p);
		const struct list *items = iter_items(rt, at, v);
		if (!items->n)
			return vundef("no aggregated item, sequence was empty");
		int cs = p[0].t != V_MISSING && truthy(&p[0]);
		size_t best = 0;
		struct val bk = lower_key(rt, at, &items->v[0], cs);
		if (p[1].t != V_MISSING) {
			struct val x = attr_path(rt, at, &items->v[0], &p[1]);
			bk = lower_key(rt, at, &x, cs);
		}
		for (size_t i = 1; i < items->n; i++) {
			struct val x = p[1].t != V_MISSING ? attr_path(rt, at, &items->v[i], &p[1]) : items->v[i];
			struct val k = lower_key(rt, at, &x, cs);
			int c = val_cmp(rt, at, &k, &bk, id == F_MAX ? ">" : "<", 0);
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
		struct val s = str_of(rt, at, v), o = str_of(rt, at, &p[0]), nw = str_of(rt, at, &p[1]);
		int64_t cnt = p[2].t == V_MISSING || p[2].t == V_NONE ? -1 : want_int(rt, at, fname, &p[2]);
		struct val r = str_replace(rt, at, &s, &o, &nw, cnt);
		r.safe = 0;
		return r;
	}
	case F_REVERSE: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		if (v->t == V_STR) {
			struct val neg = vint(-1);
			return do_slice(rt, at, v, &VMISSING, &VMISSING, &neg);
		}
		const struct list *items = iter_items(rt, at, v);
		int kind = v->t == V_LIST && v->u.l->kind == L_ITER ? L_LIST : L_ITER;
		if (v->t == V_LIST && (v->u.l->kind == L_ITEMS || v->u.l->kind == L_KEYS || v->u.l->kind == L_VALUES))
			kind = L_ITER;
		struct list *l = list_new(rt, at, items->n, kind);
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
			TYPE_ERR(rt, at, "round(): expected a number, got %s", kind_name(v));
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
		struct val s = str_of(rt, at, v);
		s.safe = 1;
		return s;
	}
	case F_SORT: {
		static const char *const pn[] = {"reverse", "case_sensitive", "attribute"};
		bind(rt, at, fname, pn, 3, 0, a, p);
		const struct list *items = iter_items(rt, at, v);
		struct list *l = list_new(rt, at, items->n, L_LIST);
		memcpy(l->v, items->v, items->n * sizeof *l->v);
		struct val *keys = ralloc(rt, at, (items->n ? items->n : 1) * sizeof *keys);
		int cs = p[1].t != V_MISSING && truthy(&p[1]);
		for (size_t i = 0; i < items->n; i++) {
			/* "a,b" sorts by a tuple of attributes */
			if (p[2].t == V_STR && memchr(p[2].u.s.p, ',', p[2].u.s.n)) {
				struct val parts = str_split(rt, at, &p[2], &(struct val){.t = V_STR, .u.s = {",", 1}}, -1, 0);
				struct list *kt = list_new(rt, at, parts.u.l->n, L_TUPLE);
				for (size_t j = 0; j < parts.u.l->n; j++) {
					struct val x = attr_path(rt, at, &items->v[i], &parts.u.l->v[j]);
					kt->v[j] = lower_key(rt, at, &x, cs);
				}
				keys[i] = vlist(kt);
			} else {
				struct val x = attr_path(rt, at, &items->v[i], p[2].t == V_MISSING ? &VMISSING : &p[2]);
				keys[i] = lower_key(rt, at, &x, cs);
			}
		}
		sort_vals(rt, at, l->v, keys, items->n, p[0].t != V_MISSING && truthy(&p[0]));
		return vlist(l);
	}
	case F_STRING: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		return str_of(rt, at, v);
	}
	case F_SUM: {
		static const char *const pn[] = {"attribute", "start"};
		bind(rt, at, fname, pn, 2, 0, a, p);
		struct val acc = p[1].t == V_MISSING ? vint(0) : p[1];
		const struct list *items = iter_items(rt, at, v);
		step(rt, at, items->n);
		for (size_t i = 0; i < items->n; i++) {
			struct val x = p[0].t != V_MISSING ? attr_path(rt, at, &items->v[i], &p[0]) : items->v[i];
			acc = binop(rt, at, B_ADD, &acc, &x);
		}
		return acc;
	}
	case F_TOJSON: {
		static const char *const pn[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
		bind(rt, at, fname, pn, 4, 0, a, p);
		struct jopts o = {0, NULL, 0, ", ", ": ", 0};
		o.ensure_ascii = p[0].t != V_MISSING && truthy(&p[0]);
		if (p[1].t == V_STR) {
			o.indent = p[1].u.s.p;
			o.indent_n = p[1].u.s.n;
		} else if (is_intlike(&p[1])) {
			int64_t w = p[1].u.i < 0 ? 0 : p[1].u.i;
			if (w > 4096)
				UNSUP(rt, at, "tojson indent wider than 4096");
			char *sp = ralloc(rt, at, (size_t)w + 1);
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
			struct val s0 = str_copy(rt, at, p[2].u.l->v[0].u.s.p, p[2].u.l->v[0].u.s.n);
			struct val s1 = str_copy(rt, at, p[2].u.l->v[1].u.s.p, p[2].u.l->v[1].u.s.n);
			o.item_sep = s0.u.s.p;
			o.key_sep = s1.u.s.p;
		}
		o.sort_keys = p[3].t != V_MISSING && truthy(&p[3]);
		const void *key = v->t == V_DICT ? (const void *)v->u.d : v->t == V_LIST ? (const void *)v->u.l : NULL;
		int memo = rt->memo && key && !o.ensure_ascii && !o.indent && p[2].t != V_LIST && !o.sort_keys &&
			   ar_contains(rt->memo->ar, key);
		size_t slot = memo ? ((uintptr_t)key >> 4) % TJ_MEMO : 0;
		if (memo) {
			for (size_t k = 0; k < TJ_MEMO && rt->memo->key[slot]; k++, slot = (slot + 1) % TJ_MEMO)
				if (rt->memo->key[slot] == key)
					return vstr(rt->memo->p[slot], rt->memo->n[slot]);
		}
		struct outbuf b = {0};
		to_json(rt, at, v, &o, 0, &b);
		if (memo && !rt->memo->key[slot]) {
			char *copy = ar_alloc_raw(rt->memo->ar, b.n + 1);
			if (copy) {
				if (b.n)
					memcpy(copy, b.p, b.n);
				copy[b.n] = 0;
				rt->memo->key[slot] = key;
				rt->memo->p[slot] = copy;
				rt->memo->n[slot] = b.n;
			}
		}
		return ob_val(&b);
	}
	case F_TRIM: {
		static const char *const pn[] = {"chars"};
		bind(rt, at, fname, pn, 1, 0, a, p);
		struct val s = str_of(rt, at, v);
		s.safe = v->t == V_STR && v->safe;
		return str_strip(rt, at, &s, &p[0], 3);
	}
	case F_TRUNCATE: {
		static const char *const pn[] = {"length", "killwords", "end", "leeway"};
		bind(rt, at, fname, pn, 4, 0, a, p);
		if (v->t != V_STR)
			TYPE_ERR(rt, at, "truncate(): expected a string");
		int64_t length = p[0].t == V_MISSING ? 255 : want_int(rt, at, fname, &p[0]);
		int kill = p[1].t != V_MISSING && truthy(&p[1]);
		struct val end = p[2].t == V_MISSING ? vstr("...", 3) : *want_str(rt, at, fname, &p[2]);
		int64_t leeway = p[3].t == V_MISSING || p[3].t == V_NONE ? 5 : want_int(rt, at, fname, &p[3]);
		int64_t elen = (int64_t)u8_count(end.u.s.p, end.u.s.n), slen = (int64_t)u8_count(v->u.s.p, v->u.s.n);
		if (length < elen || leeway < 0)
			TYPE_ERR(rt, at, "truncate(): expected length >= %lld and leeway >= 0", (long long)elen);
		if (slen <= length + leeway)
			return *v;
		struct val cut = vint(length - elen);
		struct val head = do_slice(rt, at, v, &VMISSING, &cut, &VMISSING);
		if (!kill) {
			struct val sp = vstr(" ", 1);
			struct val parts = str_split(rt, at, &head, &sp, 1, 1);
			head = parts.u.l->v[0];
		}
		struct val r = binop(rt, at, B_ADD, &head, &end);
		return r;
	}
	case F_UNIQUE: {
		static const char *const pn[] = {"case_sensitive", "attribute"};
		bind(rt, at, fname, pn, 2, 0, a, p);
		const struct list *items = iter_items(rt, at, v);
		int cs = p[0].t != V_MISSING && truthy(&p[0]);
		struct lbuild lb = {0};
		struct dict *seen = dict_new(rt, at, 0);
		step(rt, at, items->n);
		for (size_t i = 0; i < items->n; i++) {
			struct val x = p[1].t != V_MISSING ? attr_path(rt, at, &items->v[i], &p[1]) : items->v[i];
			struct val k = lower_key(rt, at, &x, cs);
			if (dict_find(rt, at, seen, &k) < 0) {
				dict_set(rt, at, seen, k, VNONE);
				lb_push(rt, at, &lb, items->v[i]);
			}
		}
		return lb_done(rt, at, &lb, L_ITER);
	}
	case F_WORDCOUNT: {
		bind(rt, at, fname, NULL, 0, 0, a, p);
		struct val s = str_of(rt, at, v);
		int64_t words = 0;
		int in = 0;
		for (size_t i = 0; i < s.u.s.n;) {
			int32_t c;
			int l = u8_dec(s.u.s.p + i, s.u.s.n - i, &c);
			if (!l)
				l = 1, c = 0;
			int w = c == '_' || py_isalnum(c);
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

static int test_value(struct rt *rt, const struct node *at, int id, const struct val *v, const struct args *a)
{
	struct val p[1];
	static const char *const pn_other[] = {"other"}, *const pn_num[] = {"num"}, *const pn_seq[] = {"seq"},
			  *const pn_b[] = {"b"};
	const char *tname = test_names[id];
	switch (id) {
	case T_ODD:
	case T_EVEN: {
		bind(rt, at, tname, NULL, 0, 0, a, p);
		struct val two = vint(2), r = binop(rt, at, B_MOD, v, &two), want = vint(id == T_ODD);
		return val_eq(rt, at, &r, &want, 0);
	}
	case T_DIVISIBLEBY: {
		bind(rt, at, tname, pn_num, 1, 1, a, p);
		struct val r = binop(rt, at, B_MOD, v, &p[0]), z = vint(0);
		return val_eq(rt, at, &r, &z, 0);
	}
	case T_DEFINED: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t != V_UNDEF;
	case T_UNDEFINED: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_UNDEF;
	case T_FILTER:
	case T_TEST:
		bind(rt, at, tname, NULL, 0, 0, a, p);
		if (v->t != V_STR)
			return 0;
		return id == T_FILTER ? find_name(filt_names, F_FIRST_UNSUPPORTED, v->u.s.p, v->u.s.n) >= 0
				      : find_name(test_names, T__COUNT, v->u.s.p, v->u.s.n) >= 0;
	case T_NONE: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_NONE;
	case T_BOOLEAN: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_BOOL;
	case T_FALSE: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_BOOL && !v->u.i;
	case T_TRUE: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_BOOL && v->u.i;
	case T_INTEGER: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_INT;
	case T_FLOAT: bind(rt, at, tname, NULL, 0, 0, a, p); return v->t == V_FLOAT;
	case T_LOWER:
	case T_UPPER: {
		bind(rt, at, tname, NULL, 0, 0, a, p);
		struct val s = str_of(rt, at, v);
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
	case T_IN: bind(rt, at, tname, pn_seq, 1, 1, a, p); return contains(rt, at, v, &p[0]);
	case T_EQ1: case T_EQ2: case T_EQ3:
		bind(rt, at, tname, pn_b, 1, 1, a, p);
		return val_eq(rt, at, v, &p[0], 0);
	case T_NE1: case T_NE2:
		bind(rt, at, tname, pn_b, 1, 1, a, p);
		return !val_eq(rt, at, v, &p[0], 0);
	case T_GT1: case T_GT2: case T_GT3:
		bind(rt, at, tname, pn_b, 1, 1, a, p);
		return val_cmp(rt, at, v, &p[0], ">", 0) > 0;
	case T_GE1: case T_GE2:
		bind(rt, at, tname, pn_b, 1, 1, a, p);
		return val_cmp(rt, at, v, &p[0], ">=", 0) >= 0;
	case T_LT1: case T_LT2: case T_LT3:
		bind(rt, at, tname, pn_b, 1, 1, a, p);
		return val_cmp(rt, at, v, &p[0], "<", 0) < 0;
	case T_LE1: case T_LE2:
		bind(rt, at, tname, pn_b, 1, 1, a, p);
		return val_cmp(rt, at, v, &p[0], "<=", 0) <= 0;
	}
	UNSUP(rt, at, "test '%s' is not supported", tname);
}

/* ------------------------------------------------------------------------
 * Evaluation
 * ---------------------------------------------------------------------- */

static void depth_enter(struct rt *rt, const struct node *at)
{
	if (++rt->depth > TM_MAX_EVAL_DEPTH)
		rfail(rt, at, KV_ERR_INVALID, "evaluation nested deeper than %d levels", TM_MAX_EVAL_DEPTH);
}

static struct val lookup(struct rt *rt, const struct node *x, struct scope *sc)
{
	const struct val *v = scope_get(sc, x->sym);
	if (v)
		return *v;
	if (rt->globals[x->sym].t != V_MISSING)
		return rt->globals[x->sym];
	if (x->fid) {
		struct val f = {.t = V_FUNC};
		f.fn = (uint16_t)(x->fid - 1);
		return f;
	}
	return vundef(x->s);
}

/* obj.name with the method ids the parser looked up (get_attr's rules). */
static struct val get_attr_node(struct rt *rt, const struct node *x, const struct val *obj)
{
	int m = -1;
	switch (obj->t) {
	case V_DICT:
		m = x->mid[1];
		if (m < 0) {
			const struct val *v = dict_get_str(rt, x, obj->u.d, x->s, x->sn);
			return v ? *v : undef_of(x->s, x->sn, V_DICT, 0);
		}
		break;
	case V_STR:
		m = x->mid[0];
		break;
	case V_LIST:
		m = obj->u.l->kind == L_LIST ? x->mid[2] : obj->u.l->kind == L_TUPLE ? x->mid[3] : -1;
		break;
	default:
		return get_attr(rt, x, obj, x->s, x->sn);
	}
	if (m >= 0 && !(x->sn >= 1 && x->s[0] == '_' && obj->t != V_DICT))
		return method_val(rt, x, obj, m);
	return get_attr(rt, x, obj, x->s, x->sn);
}

static void eval_args(struct rt *rt, const struct node *x, struct scope *sc, struct args *a)
{
	struct val *pv = x->nv ? ralloc(rt, x, (size_t)x->nv * sizeof *pv) : NULL;
	struct val *kv = x->nw ? ralloc(rt, x, (size_t)x->nw * sizeof *kv) : NULL;
	for (int i = 0; i < x->nv; i++)
		pv[i] = eval(rt, x->v[i], sc);
	for (int i = 0; i < x->nw; i++)
		kv[i] = eval(rt, x->w[i], sc);
	a->v = pv;
	a->n = x->nv;
	a->kwn = x->kwn;
	a->kwv = kv;
	a->nkw = x->nw;
}


/*
 * A left-deep chain of + (templates write '<|im_start|>' + role + '\n' +
 * content + ...). Plain strings are collected and joined once, or emitted
 * one by one when the chain is printed, instead of being copied at every
 * +. Operands are evaluated in Python's order and a non-string operand
 * falls back to binop at the same point, so results and errors are the
 * same as evaluating the additions one by one.
 */
#define ADD_CHAIN_MAX 64

static struct val eval_add(struct rt *rt, const struct node *x, struct scope *sc, int print)
{
	const struct node *ops[ADD_CHAIN_MAX];
	struct val parts[ADD_CHAIN_MAX], acc = VNONE;
	int n = 0, np = 0, pending = 1;
	size_t total = 0;
	const struct node *cur = x;
	while (cur->kind == N_BIN && cur->op == B_ADD && n < ADD_CHAIN_MAX - 1) {
		ops[n++] = cur->b;
		cur = cur->a;
	}
	ops[n++] = cur;
	for (int i = n - 1; i >= 0; i--) {
		struct val v = eval(rt, ops[i], sc);
		if (pending && v.t == V_STR && !v.safe) {
			total += v.u.s.n;
			if (total > rt->max_out)
				rfail(rt, ops[i], KV_ERR_INVALID, "string longer than the %zu byte output cap", rt->max_out);
			parts[np++] = v;
			continue;
		}
		if (pending) {
			if (np == 0) { /* the leftmost operand is not a plain string */
				acc = v;
				pending = 0;
				continue;
			}
			struct outbuf b = {0};
			for (int k = 0; k < np; k++)
				ob_add(rt, x, &b, parts[k].u.s.p, parts[k].u.s.n);
			acc = np == 1 ? parts[0] : ob_val(&b);
			pending = 0;
		}
		/* the + whose right operand is ops[i] */
		const struct node *at = x;
		for (const struct node *c = x; c->kind == N_BIN && c->op == B_ADD; c = c->a)
			if (c->b == ops[i])
				at = c;
		acc = binop(rt, at, B_ADD, &acc, &v);
		if (acc.t == V_STR && !acc.safe) {
			parts[0] = acc;
			np = 1;
			total = acc.u.s.n;
			pending = 1;
		}
	}
	if (pending) {
		if (print) {
			for (int k = 0; k < np; k++)
				emit(rt, x, parts[k].u.s.p, parts[k].u.s.n);
			return VNONE;
		}
		if (np == 1)
			return parts[0];
		char *p = ralloc(rt, x, total + 1);
		size_t o = 0;
		for (int k = 0; k < np; k++) {
			memcpy(p + o, parts[k].u.s.p, parts[k].u.s.n);
			o += parts[k].u.s.n;
		}
		p[o] = 0;
		return vstr(p, o);
	}
	if (print) {
		if (acc.t == V_STR) {
			emit(rt, x, acc.u.s.p, acc.u.s.n);
		} else {
			struct outbuf b = {0};
			to_str(rt, x, &acc, &b, 0);
			emit(rt, x, b.p, b.n);
		}
		return VNONE;
	}
	return acc;
}

static struct val eval(struct rt *rt, const struct node *x, struct scope *sc)
{
	struct val r, l, rv;
	struct args a;
	depth_enter(rt, x);
	switch (x->kind) {
	case N_CONST:
		r = x->k;
		break;
	case N_NAME:
		r = lookup(rt, x, sc);
		break;
	case N_GETATTR:
		l = eval(rt, x->a, sc);
		r = get_attr_node(rt, x, &l);
		break;
	case N_GETITEM:
		l = eval(rt, x->a, sc);
		if (x->b->kind == N_SLICE) {
			struct val s0 = x->b->a ? eval(rt, x->b->a, sc) : VMISSING;
			struct val s1 = x->b->b ? eval(rt, x->b->b, sc) : VMISSING;
			struct val s2 = x->b->c ? eval(rt, x->b->c, sc) : VMISSING;
			r = do_slice(rt, x, &l, &s0, &s1, &s2);
		} else {
			rv = eval(rt, x->b, sc);
			r = get_item(rt, x, &l, &rv);
		}
		break;
	case N_CALL:
		l = eval(rt, x->a, sc);
		eval_args(rt, x, sc, &a);
		r = call_value(rt, x, &l, &a);
		break;
	case N_FILTER:
		l = x->a->kind == N_BLOCKVAL ? rt->blockval : eval(rt, x->a, sc);
		eval_args(rt, x, sc, &a);
		r = call_filter(rt, x, x->fid, &l, &a);
		break;
	case N_TEST:
		l = eval(rt, x->a, sc);
		eval_args(rt, x, sc, &a);
		r = vbool(test_value(rt, x, x->fid, &l, &a));
		break;
	case N_NOT:
		l = eval(rt, x->a, sc);
		r = vbool(!truthy(&l));
		break;
	case N_NEG:
	case N_POS:
		l = eval(rt, x->a, sc);
		if (l.t == V_UNDEF)
			fail_undef(rt, x, &l);
		if (l.t == V_FLOAT)
			r = vfloat(x->kind == N_NEG ? -l.u.f : l.u.f);
		else if (is_intlike(&l)) {
			if (x->kind == N_NEG && l.u.i == INT64_MIN)
				UNSUP(rt, x, "integer overflow");
			r = vint(x->kind == N_NEG ? -l.u.i : l.u.i);
		} else
			TYPE_ERR(rt, x, "bad operand type for unary %c: '%s'", x->kind == N_NEG ? '-' : '+', kind_name(&l));
		break;
	case N_BIN:
		if (x->op == B_ADD) {
			r = eval_add(rt, x, sc, 0);
			break;
		}
		l = eval(rt, x->a, sc);
		rv = eval(rt, x->b, sc);
		r = binop(rt, x, x->op, &l, &rv);
		break;
	case N_CONCAT: {
		struct outbuf b = {0};
		for (int i = 0; i < x->nv; i++) {
			l = eval(rt, x->v[i], sc);
			to_str(rt, x, &l, &b, 0);
		}
		r = ob_val(&b);
		break;
	}
	case N_CMP: {
		l = eval(rt, x->a, sc);
		r = vbool(1);
		for (int i = 0; i < x->nv; i++) {
			int ok;
			rv = eval(rt, x->v[i], sc);
			switch (x->ops[i]) {
			case C_EQ: ok = val_eq(rt, x, &l, &rv, 0); break;
			case C_NE: ok = !val_eq(rt, x, &l, &rv, 0); break;
			case C_LT: ok = val_cmp(rt, x, &l, &rv, "<", 0) < 0; break;
			case C_LE: ok = val_cmp(rt, x, &l, &rv, "<=", 0) <= 0; break;
			case C_GT: ok = val_cmp(rt, x, &l, &rv, ">", 0) > 0; break;
			case C_GE: ok = val_cmp(rt, x, &l, &rv, ">=", 0) >= 0; break;
			case C_IN: ok = contains(rt, x, &l, &rv); break;
			default: ok = !contains(rt, x, &l, &rv); break;
			}
			if (!ok) {
				r = vbool(0);
				break;
			}
			l = rv;
		}
		break;
	}
	case N_AND:
		l = eval(rt, x->a, sc);
		r = truthy(&l) ? eval(rt, x->b, sc) : l;
		break;
	case N_OR:
		l = eval(rt, x->a, sc);
		r = truthy(&l) ? l : eval(rt, x->b, sc);
		break;
	case N_COND:
		l = eval(rt, x->a, sc);
		if (truthy(&l))
			r = eval(rt, x->b, sc);
		else if (x->c)
			r = eval(rt, x->c, sc);
		else
			r = vundef("the inline if-expression evaluated to false and has no else");
		break;
	case N_LIST:
	case N_TUPLE: {
		struct list *lst = list_new(rt, x, (size_t)x->nv, x->kind == N_LIST ? L_LIST : L_TUPLE);
		for (int i = 0; i < x->nv; i++)
			lst->v[i] = eval(rt, x->v[i], sc);
		r = vlist(lst);
		break;
	}
	case N_DICT: {
		struct dict *d = dict_new(rt, x, (size_t)x->nv);
		for (int i = 0; i < x->nv; i++) {
			struct val k = eval(rt, x->v[i], sc);
			struct val v = eval(rt, x->w[i], sc);
			dict_set(rt, x, d, k, v);
		}
		r = vdict(d);
		break;
	}
	case N_BLOCKVAL:
		r = rt->blockval;
		break;
	default:
		rfail(rt, x, KV_ERR_INVALID, "internal error: node %d is not an expression", x->kind);
	}
	rt->depth--;
	return r;
}

/* ------------------------------------------------------------------------
 * Statements
 * ---------------------------------------------------------------------- */

enum { CTL_NONE = 0, CTL_BREAK, CTL_CONTINUE };

static void assign(struct rt *rt, const struct node *at, const struct target *tg, struct scope *sc, struct val v)
{
	if (tg->ns_attr) {
		const struct val *nsv = scope_get(sc, tg->syms[0]);
		if (!nsv && rt->globals[tg->syms[0]].t != V_MISSING)
			nsv = &rt->globals[tg->syms[0]];
		if (!nsv || nsv->t != V_NS)
			TYPE_ERR(rt, at, "can only set attributes on namespace objects ('%s' is %s)", tg->names[0],
				 nsv ? kind_name(nsv) : "undefined");
		dict_set(rt, at, nsv->u.ns->d, vstr(tg->attr, strlen(tg->attr)), v);
		return;
	}
	if (tg->n == 1 && !tg->tuple) {
		scope_set(rt, at, sc, tg->syms[0], v);
		return;
	}
	const struct list *items = iter_items(rt, at, &v);
	if (items->n != (size_t)tg->n)
		TYPE_ERR(rt, at, "%s values to unpack (expected %d, got %zu)",
			 items->n < (size_t)tg->n ? "not enough" : "too many", tg->n, items->n);
	for (int i = 0; i < tg->n; i++)
		scope_set(rt, at, sc, tg->syms[i], items->v[i]);
}

static struct val capture_body(struct rt *rt, const struct node *x, struct scope *sc)
{
	struct outbuf *saved = rt->cap, ob = {0};
	int ctl = 0;
	rt->cap = &ob;
	exec_body(rt, x->v, x->nv, sc, &ctl);
	rt->cap = saved;
	return ob_val(&ob);
}

static void exec_for(struct rt *rt, const struct node *x, struct scope *sc)
{
	struct val itv = eval(rt, x->a, sc);
	const struct list *items = iter_items(rt, x, &itv);
	if (x->b) {
		/* `for x in xs if cond`: filter first; loop.* counts what is left */
		struct lbuild kept = {0};
		struct scope *fs = scope_new(rt, x, sc);
		for (size_t i = 0; i < items->n; i++) {
			step(rt, x, 1);
			fs->n = 0;
			assign(rt, x, x->tg, fs, items->v[i]);
			struct val c = eval(rt, x->b, fs);
			if (truthy(&c))
				lb_push(rt, x, &kept, items->v[i]);
		}
		items = lb_done(rt, x, &kept, L_LIST).u.l;
	}
	if (!items->n) {
		int ctl = 0;
		if (x->nw)
			exec_body(rt, x->w, x->nw, scope_new(rt, x, sc), &ctl);
		return;
	}
	struct loopobj *lo = ralloc(rt, x, sizeof *lo);
	lo->items = items;
	lo->depth = 1;
	struct val lv = {.t = V_LOOP};
	lv.u.lo = lo;
	struct scope *is = NULL;
	for (size_t i = 0; i < items->n; i++) {
		step(rt, x, 1);
		/* each iteration starts with a fresh scope (Jinja: assignments
		 * in the body do not carry over to the next iteration); reuse
		 * it unless a macro captured it */
		if (!is || is->captured)
			is = scope_new(rt, x, sc);
		is->n = 0;
		lo->i = i;
		scope_set(rt, x, is, rt->t->sym_loop, lv);
		assign(rt, x, x->tg, is, items->v[i]);
		int ctl = CTL_NONE;
		exec_body(rt, x->v, x->nv, is, &ctl);
		if (ctl == CTL_BREAK)
			break;
	}
}

static void exec_body(struct rt *rt, struct node *const *v, int n, struct scope *sc, int *ctl)
{
	for (int i = 0; i < n && *ctl == CTL_NONE; i++) {
		const struct node *x = v[i];
		depth_enter(rt, x);
		step(rt, x, 1);
		switch (x->kind) {
		case N_DATA:
			emit(rt, x, x->s, x->sn);
			break;
		case N_PRINT: {
			if (x->a->kind == N_BIN && x->a->op == B_ADD) {
				eval_add(rt, x->a, sc, 1);
				break;
			}
			struct val r = eval(rt, x->a, sc);
			if (r.t == V_STR) {
				emit(rt, x, r.u.s.p, r.u.s.n);
			} else {
				struct outbuf b = {0};
				to_str(rt, x, &r, &b, 0);
				emit(rt, x, b.p, b.n);
			}
			break;
		}
		case N_IF: {
			struct val c = eval(rt, x->a, sc);
			if (truthy(&c))
				exec_body(rt, x->v, x->nv, sc, ctl);
			else
				exec_body(rt, x->w, x->nw, sc, ctl);
			break;
		}
		case N_FOR:
			rt->loop_depth++;
			exec_for(rt, x, sc);
			rt->loop_depth--;
			break;
		case N_SET:
			assign(rt, x, x->tg, sc, eval(rt, x->a, sc));
			break;
		case N_SETBLOCK: {
			struct val body = capture_body(rt, x, scope_new(rt, x, sc));
			if (x->c) {
				struct val saved = rt->blockval;
				rt->blockval = body;
				body = eval(rt, x->c, sc);
				rt->blockval = saved;
			}
			assign(rt, x, x->tg, sc, body);
			break;
		}
		case N_MACRO: {
			struct macro *m = ralloc(rt, x, sizeof *m);
			m->def = x;
			m->closure = sc;
			struct val mv = {.t = V_MACRO};
			mv.u.m = m;
			scope_set(rt, x, sc, x->sym, mv);
			sc->captured = 1;
			break;
		}
		case N_BREAK:
			*ctl = CTL_BREAK;
			break;
		case N_CONTINUE:
			*ctl = CTL_CONTINUE;
			break;
		case N_FILTERBLK: {
			struct val body = capture_body(rt, x, scope_new(rt, x, sc));
			struct val saved = rt->blockval;
			rt->blockval = body;
			struct val r = eval(rt, x->c, sc);
			rt->blockval = saved;
			struct outbuf b = {0};
			to_str(rt, x, &r, &b, 0);
			emit(rt, x, b.p, b.n);
			break;
		}
		case N_WITH: {
			struct scope *ws = scope_new(rt, x, sc);
			struct val *vals = ralloc(rt, x, (size_t)(x->nw ? x->nw : 1) * sizeof *vals);
			for (int k = 0; k < x->nw; k++)
				vals[k] = eval(rt, x->w[k], sc);
			for (int k = 0; k < x->nw; k++)
				scope_set(rt, x, ws, x->tg->syms[k], vals[k]);
			exec_body(rt, x->v, x->nv, ws, ctl);
			break;
		}
		case N_SCOPE:
			exec_body(rt, x->v, x->nv, x->op ? sc : scope_new(rt, x, sc), ctl);
			break;
		default:
			rfail(rt, x, KV_ERR_INVALID, "internal error: node %d is not a statement", x->kind);
		}
		rt->depth--;
	}
}

/* ------------------------------------------------------------------------
 * Render entry points
 * ---------------------------------------------------------------------- */

static void limits_fill(struct kv_tmpl_limits *l, const struct kv_tmpl_limits *in)
{
	l->max_steps = in && in->max_steps ? in->max_steps : TM_DEFAULT_MAX_STEPS;
	l->max_output = in && in->max_output ? in->max_output : TM_DEFAULT_MAX_OUTPUT;
	l->max_memory = in && in->max_memory ? in->max_memory : TM_DEFAULT_MAX_MEMORY;
}

/* One global for the render: a name and a value (which may live in
 * another arena that outlives the render). */
struct gval {
	const char *name;
	struct val v;
};

/*
 * Render t with the given globals. With `expect` set nothing is stored:
 * the output is compared with expect as it is produced and the render
 * stops at the first difference (returns RT_DIVERGED). *out_len gets
 * the number of bytes produced. Returns KV_OK, RT_DIVERGED or a kv_err.
 */
static int render_core(const struct kv_tmpl *t, const struct gval *g, int ng, const struct kv_tmpl_limits *lim,
		       struct kv_buf *out, const char *expect, size_t expect_len, size_t *out_len, struct tj_memo *memo)
{
	struct kv_tmpl_limits L;
	struct arena ar = {0};
	struct rt *rt = calloc(1, sizeof *rt);
	int rc;

	if (!rt)
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", t->what);
	limits_fill(&L, lim);
	ar.cap = L.max_memory;
	rt->t = t;
	rt->memo = memo;
	rt->ar = &ar;
	rt->out = out;
	rt->expect = expect;
	rt->expect_len = expect_len;
	rt->max_steps = L.max_steps;
	rt->max_out = L.max_output;
	if (setjmp(rt->jb)) {
		rc = rt->err ? rt->err : KV_ERR_INVALID;
		goto done;
	}
	rt->globals = ralloc(rt, NULL, (size_t)(t->n_syms ? t->n_syms : 1) * sizeof *rt->globals);
	for (int i = 0; i < t->n_syms; i++)
		rt->globals[i] = VMISSING;
	for (int i = 0; i < ng; i++) {
		uint64_t id;
		if (kv_map_get(t->syms, g[i].name, strlen(g[i].name), &id))
			rt->globals[id] = g[i].v;
	}
	rt->root = scope_new(rt, NULL, NULL);
	int ctl = CTL_NONE;
	exec_body(rt, t->body, t->n_body, rt->root, &ctl);
	rc = KV_OK;
done:
	if (out_len)
		*out_len = rt->out_len;
	ar_free(&ar);
	free(rt);
	return rc;
}

/* Convert a JSON value into values held by `ar` (which outlives them). */
static int convert_json(const struct kv_tmpl *t, struct arena *ar, const json_t *j, struct val *out)
{
	struct rt *rt = calloc(1, sizeof *rt);
	int rc = KV_OK;
	if (!rt)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	rt->t = t;
	rt->ar = ar;
	rt->max_out = TM_DEFAULT_MAX_OUTPUT;
	if (setjmp(rt->jb)) {
		rc = rt->err ? rt->err : KV_ERR_INVALID;
	} else {
		*out = from_json(rt, j, 0);
	}
	free(rt);
	return rc;
}

int kv_tmpl_render_ex(const struct kv_tmpl *t, const json_t *ctx, const struct kv_tmpl_limits *lim, char **out,
		      size_t *len)
{
	struct arena base = {0};
	struct gval *g = NULL;
	struct kv_buf b = KV_BUF_INIT;
	size_t ng = 0;
	int rc = KV_OK;

	*out = NULL;
	if (len)
		*len = 0;
	if (ctx && !json_is_object(ctx))
		return kv_fail(KV_ERR_INVALID, "%s: the render context must be a JSON object", t->what);
	base.cap = lim && lim->max_memory ? lim->max_memory : TM_DEFAULT_MAX_MEMORY;
	if (ctx && json_object_size(ctx)) {
		const char *k;
		json_t *v;
		g = calloc(json_object_size(ctx), sizeof *g);
		if (!g)
			return kv_fail(KV_ERR_NOMEM, "out of memory");
		json_object_foreach((json_t *)ctx, k, v) {
			if (!kv_map_get(t->syms, k, strlen(k), NULL))
				continue; /* the template never names it */
			g[ng].name = k;
			if ((rc = convert_json(t, &base, v, &g[ng].v)))
				goto done;
			ng++;
		}
	}
	rc = render_core(t, g, (int)ng, lim, &b, NULL, 0, NULL, NULL);
	if (rc == KV_OK) {
		if (b.oom) {
			rc = kv_fail(KV_ERR_NOMEM, "%s: out of memory for the output", t->what);
			goto done;
		}
		if (len)
			*len = b.len;
		*out = b.p ? kv_buf_take(&b) : strdup("");
		if (!*out)
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
	}
done:
	kv_buf_free(&b);
	free(g);
	ar_free(&base);
	return rc;
}

int kv_tmpl_render(const struct kv_tmpl *t, const json_t *ctx, char **out, size_t *len)
{
	return kv_tmpl_render_ex(t, ctx, NULL, out, len);
}

/* ------------------------------------------------------------------------
 * The chat layer
 * ---------------------------------------------------------------------- */

#define CHAT_MAX_CONFIG (64u << 20)
#define CHAT_PROBE "\x01kvkeep-probe\x01"

struct added_tok {
	char *s;
	size_t n;
	int cut;                /* may start a boundary: no lstrip/rstrip/normalized */
};

struct kv_chat {
	struct kv_tmpl *tmpl;           /* "default" (or the only) template */
	struct kv_tmpl *tmpl_tools;     /* "tool_use" template when the config has one */
	char *src, *src_tools;          /* their sources (NUL-terminated) */
	const struct kv_tok *tok;       /* borrowed */
	json_t *special;                /* object: bos_token, eos_token, ... */
	struct added_tok *added;
	size_t n_added;
	size_t max_added;               /* longest added token, bytes */
	int xml_tools;
};

static const char *const special_keys[] = {
	"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
};

/* A token given as "text" or as an AddedToken object {"content": ...}. */
static const char *token_text(const json_t *v)
{
	if (json_is_string(v))
		return json_string_value(v);
	if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
		return json_string_value(json_object_get(v, "content"));
	return NULL;
}

void kv_chat_free(struct kv_chat *c)
{
	if (!c)
		return;
	kv_tmpl_free(c->tmpl);
	kv_tmpl_free(c->tmpl_tools);
	free(c->src);
	free(c->src_tools);
	json_decref(c->special);
	for (size_t i = 0; i < c->n_added; i++)
		free(c->added[i].s);
	free(c->added);
	free(c);
}

static int add_added(struct kv_chat *c, const char *s, int cut)
{
	size_t n = strlen(s);
	if (!n)
		return KV_OK;
	for (size_t i = 0; i < c->n_added; i++)
		if (c->added[i].n == n && !memcmp(c->added[i].s, s, n)) {
			c->added[i].cut &= cut;
			return KV_OK;
		}
	struct added_tok *v = realloc(c->added, (c->n_added + 1) * sizeof *v);
	if (!v)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	c->added = v;
	v[c->n_added].s = strdup(s);
	if (!v[c->n_added].s)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	v[c->n_added].n = n;
	v[c->n_added].cut = cut;
	c->n_added++;
	if (n > c->max_added)
		c->max_added = n;
	return KV_OK;
}

/* Added tokens from an added_tokens_decoder object or added_tokens array. */
static int collect_added(struct kv_chat *c, const json_t *list)
{
	const char *key;
	json_t *v;
	size_t i;
	int rc;
	if (json_is_object(list)) {
		json_object_foreach((json_t *)list, key, v) {
			const char *s = token_text(v);
			if (!s)
				continue;
			int cut = !json_is_true(json_object_get(v, "lstrip")) && !json_is_true(json_object_get(v, "rstrip")) &&
				  !json_is_true(json_object_get(v, "single_word")) &&
				  !json_is_true(json_object_get(v, "normalized"));
			if ((rc = add_added(c, s, cut)))
				return rc;
		}
	} else if (json_is_array(list)) {
		json_array_foreach(list, i, v) {
			const char *s = token_text(v);
			if (!s)
				continue;
			int sp = json_is_true(json_object_get(v, "special"));
			json_t *nz = json_object_get(v, "normalized");
			int normalized = nz ? json_is_true(nz) : !sp;
			int cut = !json_is_true(json_object_get(v, "lstrip")) && !json_is_true(json_object_get(v, "rstrip")) &&
				  !json_is_true(json_object_get(v, "single_word")) && !normalized;
			if ((rc = add_added(c, s, cut)))
				return rc;
		}
	}
	return KV_OK;
}

static int compile_named(const char *src, const char *what, char **copy, struct kv_tmpl **out)
{
	int rc = kv_tmpl_compile(src, strlen(src), what, out);
	if (rc)
		return rc;
	*copy = strdup(src);
	if (!*copy) {
		kv_tmpl_free(*out);
		*out = NULL;
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	return KV_OK;
}

/* Build a chat from a parsed tokenizer_config.json and optionally the
 * text of a chat_template.jinja file (which wins over the config). */
static int chat_build(const json_t *cfg, const char *jinja_src, const char *what, const struct kv_tok *tok,
		      struct kv_chat **out)
{
	struct kv_chat *c = calloc(1, sizeof *c);
	char wbuf[300];
	int rc = KV_OK;
	if (!c)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	c->tok = tok;
	c->special = json_object();
	if (!c->special) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto fail;
	}
	if (jinja_src) {
		snprintf(wbuf, sizeof wbuf, "%s (chat_template.jinja)", what);
		if ((rc = compile_named(jinja_src, wbuf, &c->src, &c->tmpl)))
			goto fail;
	} else {
		json_t *ct = json_object_get(cfg, "chat_template");
		if (json_is_string(ct)) {
			snprintf(wbuf, sizeof wbuf, "%s: chat_template", what);
			if ((rc = compile_named(json_string_value(ct), wbuf, &c->src, &c->tmpl)))
				goto fail;
		} else if (json_is_array(ct)) {
			size_t i;
			json_t *e;
			json_array_foreach(ct, i, e) {
				const char *name = json_string_value(json_object_get(e, "name"));
				const char *t = json_string_value(json_object_get(e, "template"));
				if (!name || !t) {
					rc = kv_fail(KV_ERR_INVALID, "%s: chat_template[%zu] needs \"name\" and \"template\" strings",
						     what, i);
					goto fail;
				}
				snprintf(wbuf, sizeof wbuf, "%s: chat_template '%s'", what, name);
				if (!strcmp(name, "default") && !c->tmpl)
					rc = compile_named(t, wbuf, &c->src, &c->tmpl);
				else if (!strcmp(name, "tool_use") && !c->tmpl_tools)
					rc = compile_named(t, wbuf, &c->src_tools, &c->tmpl_tools);
				if (rc)
					goto fail;
			}
			if (!c->tmpl) {
				rc = kv_fail(KV_ERR_INVALID, "%s: chat_template list has no \"default\" template", what);
				goto fail;
			}
		} else {
			rc = kv_fail(KV_ERR_NOT_FOUND, "%s: no chat_template (string or list of named templates)", what);
			goto fail;
		}
	}
	for (size_t i = 0; i < sizeof special_keys / sizeof special_keys[0]; i++) {
		const char *s = token_text(json_object_get(cfg, special_keys[i]));
		if (s) {
			json_object_set_new(c->special, special_keys[i], json_string(s));
			if ((rc = add_added(c, s, 1)))
				goto fail;
		}
	}
	json_t *extra = json_object_get(cfg, "additional_special_tokens");
	if (json_is_array(extra) && json_array_size(extra)) {
		json_t *arr = json_array(), *e;
		size_t i;
		json_array_foreach(extra, i, e) {
			const char *s = token_text(e);
			if (s) {
				json_array_append_new(arr, json_string(s));
				if ((rc = add_added(c, s, 1))) {
					json_decref(arr);
					goto fail;
				}
			}
		}
		json_object_set_new(c->special, "additional_special_tokens", arr);
	}
	if ((rc = collect_added(c, json_object_get(cfg, "added_tokens_decoder"))))
		goto fail;
	/* only tokens the tokenizer knows as single ids may mark a cut */
	if (tok)
		for (size_t i = 0; i < c->n_added; i++)
			if (c->added[i].cut && kv_tok_id(tok, c->added[i].s) < 0)
				c->added[i].cut = 0;
	c->xml_tools = strstr(c->src, "<function=") != NULL ||
		       (c->src_tools && strstr(c->src_tools, "<function=") != NULL);
	*out = c;
	return KV_OK;
fail:
	kv_chat_free(c);
	return rc;
}

int kv_chat_load_mem(const char *tokenizer_config_json, size_t len, const struct kv_tok *tok, struct kv_chat **out)
{
	json_t *cfg;
	int rc;
	*out = NULL;
	if ((rc = kv_json_parse("tokenizer_config.json", tokenizer_config_json, len, KV_JSON_MAX_DEPTH, &cfg)))
		return rc;
	if (!json_is_object(cfg)) {
		json_decref(cfg);
		return kv_fail(KV_ERR_INVALID, "tokenizer_config.json: not a JSON object");
	}
	rc = chat_build(cfg, NULL, "tokenizer_config.json", tok, out);
	json_decref(cfg);
	return rc;
}

int kv_chat_load(const char *model_dir, const struct kv_tok *tok, struct kv_chat **out)
{
	char path[4096], jpath[4096];
	char *buf = NULL, *jsrc = NULL;
	size_t len = 0, jlen = 0;
	json_t *cfg = NULL;
	int rc;

	*out = NULL;
	if (kv_gguf_is_model_path(model_dir)) {
		/* tokenizer.chat_template and the special tokens of a GGUF file */
		struct kv_gguf *g = NULL;
		if (!(rc = kv_gguf_open(model_dir, &g)) && !(rc = kv_gguf_tokenizer_config_json(g, &buf, &len)))
			rc = kv_chat_load_mem(buf, len, tok, out);
		free(buf);
		kv_gguf_close(g);
		return rc;
	}
	snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
	snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", model_dir);
	rc = kv_io_read_file(jpath, CHAT_MAX_CONFIG, &jsrc, &jlen);
	if (rc && rc != KV_ERR_NOT_FOUND)
		return rc;
	if (rc == KV_OK && memchr(jsrc, 0, jlen)) {
		free(jsrc);
		return kv_fail(KV_ERR_INVALID, "%s: contains a NUL byte", jpath);
	}
	if ((rc = kv_io_read_file(path, CHAT_MAX_CONFIG, &buf, &len))) {
		if (rc != KV_ERR_NOT_FOUND || !jsrc)
			goto done;
		cfg = json_object(); /* only chat_template.jinja: no special tokens */
	} else if ((rc = kv_json_parse(path, buf, len, KV_JSON_MAX_DEPTH, &cfg))) {
		goto done;
	}
	if (!json_is_object(cfg)) {
		rc = kv_fail(KV_ERR_INVALID, "%s: not a JSON object", path);
		goto done;
	}
	rc = chat_build(cfg, jsrc, path, tok, out);
done:
	json_decref(cfg);
	free(buf);
	free(jsrc);
	return rc;
}

int kv_chat_set_template(struct kv_chat *c, const char *src, size_t len, const char *what)
{
	struct kv_tmpl *t;
	char *copy;
	int rc;
	if (memchr(src, 0, len))
		return kv_fail(KV_ERR_INVALID, "%s: the template contains a NUL byte", what ? what : "template");
	if ((rc = kv_tmpl_compile(src, len, what, &t)))
		return rc;
	copy = malloc(len + 1);
	if (!copy) {
		kv_tmpl_free(t);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	memcpy(copy, src, len);
	copy[len] = 0;
	kv_tmpl_free(c->tmpl);
	kv_tmpl_free(c->tmpl_tools);
	free(c->src);
	free(c->src_tools);
	c->tmpl = t;
	c->src = copy;
	c->tmpl_tools = NULL;
	c->src_tools = NULL;
	c->xml_tools = strstr(copy, "<function=") != NULL;
	return KV_OK;
}

int kv_chat_xml_tools(const struct kv_chat *c)
{
	return c->xml_tools;
}

const char *kv_chat_template_source(const struct kv_chat *c, int tool_use)
{
	return tool_use && c->src_tools ? c->src_tools : c->src;
}

/* --- preparation ------------------------------------------------------------ */

int kv_chat_prepare_messages(const json_t *messages, json_t **out)
{
	json_t *res, *m;
	size_t i;
	*out = NULL;
	if (!json_is_array(messages) || json_array_size(messages) == 0)
		return kv_fail(KV_ERR_INVALID, "messages must be a non-empty array");
	res = json_array();
	if (!res)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	json_array_foreach(messages, i, m) {
		const char *role;
		json_t *content, *copy;
		if (!json_is_object(m)) {
			json_decref(res);
			return kv_fail(KV_ERR_INVALID, "messages[%zu] must be an object", i);
		}
		role = json_string_value(json_object_get(m, "role"));
		if (!role) {
			json_decref(res);
			return kv_fail(KV_ERR_INVALID, "messages[%zu] needs a \"role\" string", i);
		}
		int developer = !strcmp(role, "developer");
		if (strcmp(role, "system") && !developer && strcmp(role, "user") && strcmp(role, "assistant") &&
		    strcmp(role, "tool")) {
			json_decref(res);
			return kv_fail(KV_ERR_INVALID, "messages[%zu]: unknown role '%.40s' (expected system, developer, "
						       "user, assistant or tool)", i, role);
		}
		content = json_object_get(m, "content");
		if (content && !json_is_string(content) && !json_is_null(content) && !json_is_array(content)) {
			json_decref(res);
			return kv_fail(KV_ERR_INVALID, "messages[%zu].content must be a string, an array of text parts or "
						       "null", i);
		}
		json_t *tc = json_object_get(m, "tool_calls");
		if (tc && !json_is_null(tc)) {
			size_t j;
			json_t *call;
			if (!json_is_array(tc)) {
				json_decref(res);
				return kv_fail(KV_ERR_INVALID, "messages[%zu].tool_calls must be an array", i);
			}
			json_array_foreach(tc, j, call) {
				json_t *fn = json_object_get(call, "function"), *args;
				if (!json_is_object(call) || !json_is_object(fn) ||
				    !json_is_string(json_object_get(fn, "name"))) {
					json_decref(res);
					return kv_fail(KV_ERR_INVALID, "messages[%zu].tool_calls[%zu] needs a \"function\" object "
								       "with a \"name\" string", i, j);
				}
				args = json_object_get(fn, "arguments");
				if (args && !json_is_string(args) && !json_is_object(args)) {
					json_decref(res);
					return kv_fail(KV_ERR_INVALID, "messages[%zu].tool_calls[%zu].function.arguments must be a "
								       "JSON string or an object", i, j);
				}
			}
		}
		copy = json_copy(m); /* shallow: values are shared, never modified */
		if (!copy) {
			json_decref(res);
			return kv_fail(KV_ERR_NOMEM, "out of memory");
		}
		/* OpenAI's "developer" role is the system role of these templates. */
		if (developer)
			json_object_set_new(copy, "role", json_string("system"));
		/* A turn that only calls tools has null (or no) content; the
		 * templates test and concatenate it as a string (Qwen3's fails on
		 * null), so it becomes "" as in vLLM's preparation. */
		if (!content || json_is_null(content))
			json_object_set_new(copy, "content", json_string(""));
		if (json_is_array(content)) {
			struct kv_buf b = KV_BUF_INIT;
			size_t j;
			json_t *part;
			json_array_foreach(content, j, part) {
				const char *type = json_string_value(json_object_get(part, "type"));
				json_t *text = json_object_get(part, "text");
				if (!json_is_object(part) || !type) {
					kv_buf_free(&b);
					json_decref(copy);
					json_decref(res);
					return kv_fail(KV_ERR_INVALID, "messages[%zu].content[%zu] must be an object with a "
								       "\"type\"", i, j);
				}
				if (strcmp(type, "text")) {
					kv_buf_free(&b);
					json_decref(copy);
					json_decref(res);
					return kv_fail(KV_ERR_UNSUPPORTED, "messages[%zu].content[%zu]: part type '%.40s' is not "
									   "supported (text only)", i, j, type);
				}
				if (!json_is_string(text)) {
					kv_buf_free(&b);
					json_decref(copy);
					json_decref(res);
					return kv_fail(KV_ERR_INVALID, "messages[%zu].content[%zu] needs a \"text\" string", i, j);
				}
				kv_buf_add(&b, json_string_value(text), json_string_length(text));
			}
			if (b.oom) {
				kv_buf_free(&b);
				json_decref(copy);
				json_decref(res);
				return kv_fail(KV_ERR_NOMEM, "out of memory");
			}
			json_object_set_new(copy, "content", json_stringn(b.p ? b.p : "", b.len));
			kv_buf_free(&b);
		}
		json_array_append_new(res, copy);
	}
	*out = res;
	return KV_OK;
}

/* --- rendering with boundaries ---------------------------------------------- */

/* May the token sequence be cut at byte c of text (see kv_chat_render)? */
static int clean_cut(const struct kv_chat *c, const char *text, size_t len, size_t at)
{
	int starts = 0;
	if (at == 0 || at > len)
		return 0;
	if (at == len)
		return 1;
	for (size_t i = 0; i < c->n_added; i++) {
		const struct added_tok *a = &c->added[i];
		if (a->cut && a->n <= len - at && !memcmp(text + at, a->s, a->n))
			starts = 1;
		/* no added token may straddle the cut */
		for (size_t o = 1; o < a->n && o <= at; o++)
			if (at - o + a->n <= len && !memcmp(text + at - o, a->s, a->n))
				return 0;
	}
	return starts;
}

struct chat_job {
	const struct kv_chat *c;
	const struct kv_tmpl *t;
	struct arena base;          /* converted context values */
	struct gval *g;
	int ng;
	int i_messages, i_agp;      /* indexes in g */
	const struct list *msgs;    /* the prepared messages */
	struct tj_memo memo;        /* tojson of context values, in base */
};

static int job_set(struct chat_job *j, const char *name, struct val v)
{
	for (int i = 0; i < j->ng; i++)
		if (!strcmp(j->g[i].name, name)) {
			j->g[i].v = v;
			return i;
		}
	j->g[j->ng].name = name;
	j->g[j->ng].v = v;
	return j->ng++;
}

static int job_set_json(struct chat_job *j, const char *name, const json_t *v, int *idx)
{
	struct val x;
	int rc = convert_json(j->t, &j->base, v, &x);
	if (rc)
		return rc;
	int i = job_set(j, name, x);
	if (idx)
		*idx = i;
	return KV_OK;
}

/* Render messages[:k] (+ extra message) without storing: compare with
 * full. Returns the prefix length when the render is a prefix of full,
 * else 0. */
static size_t prefix_len(struct chat_job *j, size_t k, const char *full, size_t full_len)
{
	struct list *l = ar_alloc_raw(&j->base, sizeof *l + k * sizeof(struct val));
	size_t got = 0;
	if (!l)
		return 0;
	memset(l, 0, sizeof *l);
	l->n = k;
	l->kind = L_LIST;
	memcpy(l->v, j->msgs->v, k * sizeof(struct val));
	struct val saved_m = j->g[j->i_messages].v, saved_a = j->g[j->i_agp].v;
	j->g[j->i_messages].v = vlist(l);
	j->g[j->i_agp].v = vbool(0);
	int rc = render_core(j->t, j->g, j->ng, NULL, NULL, full, full_len, &got, &j->memo);
	j->g[j->i_messages].v = saved_m;
	j->g[j->i_agp].v = saved_a;
	return rc == KV_OK ? got : 0;
}

/* The end of system + tools when rendering the head alone fails or is
 * not a prefix (templates that insist on a user message): render the head
 * plus a probe user message and take the last clean cut before the two
 * renders part. Both conversations share the tokens up to there. */
static size_t probe_anchor(struct chat_job *j, size_t h, const char *full, size_t full_len)
{
	struct kv_buf b = KV_BUF_INIT;
	size_t res = 0;
	json_t *pm = json_pack("{s:s,s:s}", "role", "user", "content", CHAT_PROBE);
	struct val pv;
	struct list *l = ar_alloc_raw(&j->base, sizeof *l + (h + 1) * sizeof(struct val));
	/* pv borrows its strings from pm: keep pm until the render is done */
	if (!pm || !l || convert_json(j->t, &j->base, pm, &pv)) {
		json_decref(pm);
		return 0;
	}
	memset(l, 0, sizeof *l);
	l->n = h + 1;
	l->kind = L_LIST;
	memcpy(l->v, j->msgs->v, h * sizeof(struct val));
	l->v[h] = pv;
	struct val saved_m = j->g[j->i_messages].v, saved_a = j->g[j->i_agp].v;
	j->g[j->i_messages].v = vlist(l);
	j->g[j->i_agp].v = vbool(0);
	int rc = render_core(j->t, j->g, j->ng, NULL, &b, NULL, 0, NULL, &j->memo);
	j->g[j->i_messages].v = saved_m;
	j->g[j->i_agp].v = saved_a;
	if (rc == KV_OK && !b.oom && b.p) {
		size_t lcp = 0, n = b.len < full_len ? b.len : full_len;
		while (lcp < n && b.p[lcp] == full[lcp])
			lcp++;
		for (size_t cpos = lcp; cpos > 0; cpos--)
			if (cpos < full_len && cpos < b.len && clean_cut(j->c, full, full_len, cpos) &&
			    clean_cut(j->c, b.p, b.len, cpos)) {
				res = cpos;
				break;
			}
	}
	kv_buf_free(&b);
	json_decref(pm);
	return res;
}

void kv_chat_render_free(struct kv_chat_render *r)
{
	if (!r)
		return;
	free(r->text);
	free(r->tokens);
	free(r->boundaries);
	free(r->boundary_bytes);
	free(r->boundary_msgs);
	memset(r, 0, sizeof *r);
}

/* --- special-token literals in request strings (template.h) -------------- */

static pthread_once_t g_lit_once = PTHREAD_ONCE_INIT;
static char g_lit_tag[32]; /* "[kvsp<16 hex>." */
static size_t g_lit_tag_n;

static void lit_tag_init(void)
{
	uint64_t r = 0;
	if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
		r = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&r;
	g_lit_tag_n = (size_t)snprintf(g_lit_tag, sizeof g_lit_tag, "[kvsp%016llx.", (unsigned long long)r);
}

struct lits {
	const struct added_tok **t; /* the special added tokens (borrowed from the chat) */
	size_t n;
};

static int lits_collect(const struct kv_chat *c, struct lits *L)
{
	L->t = calloc(c->n_added ? c->n_added : 1, sizeof *L->t);
	L->n = 0;
	if (!L->t)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < c->n_added; i++) {
		int32_t id = kv_tok_id(c->tok, c->added[i].s);
		if (id >= 0 && kv_tok_is_special(c->tok, id))
			L->t[L->n++] = &c->added[i];
	}
	return KV_OK;
}

/* Longest special literal at p (n bytes left), or -1. */
static int lit_at(const struct lits *L, const char *p, size_t n)
{
	int best = -1;
	for (size_t k = 0; k < L->n; k++)
		if (L->t[k]->n <= n && p[0] == L->t[k]->s[0] && !memcmp(p, L->t[k]->s, L->t[k]->n) &&
		    (best < 0 || L->t[k]->n > L->t[best]->n))
			best = (int)k;
	return best;
}

static int json_has_lit(const json_t *v, const struct lits *L)
{
	size_t i;
	const char *k;
	json_t *e;
	if (json_is_string(v)) {
		const char *p = json_string_value(v);
		size_t n = json_string_length(v);
		for (size_t x = 0; x < n; x++)
			if (lit_at(L, p + x, n - x) >= 0)
				return 1;
		return 0;
	}
	if (json_is_array(v))
		json_array_foreach((json_t *)v, i, e) if (json_has_lit(e, L)) return 1;
	if (json_is_object(v))
		json_object_foreach((json_t *)v, k, e) if (json_has_lit(e, L)) return 1;
	return 0;
}

/* Replace the literals in every string of v (a private deep copy) by
 * placeholders. */
static int json_sub_lits(json_t *v, const struct lits *L)
{
	size_t i;
	const char *k;
	json_t *e;
	int rc = KV_OK;
	if (json_is_string(v)) {
		const char *p = json_string_value(v);
		size_t n = json_string_length(v);
		struct kv_buf b = KV_BUF_INIT;
		int any = 0;
		for (size_t x = 0; x < n;) {
			int l = lit_at(L, p + x, n - x);
			if (l < 0) {
				kv_buf_addc(&b, p[x++]);
				continue;
			}
			kv_buf_add(&b, g_lit_tag, g_lit_tag_n);
			kv_buf_printf(&b, "%d]", l);
			x += L->t[l]->n;
			any = 1;
		}
		if (b.oom)
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		else if (any && json_string_setn(v, b.p, b.len))
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		kv_buf_free(&b);
		return rc;
	}
	if (json_is_array(v))
		json_array_foreach(v, i, e) if ((rc = json_sub_lits(e, L))) return rc;
	if (json_is_object(v))
		json_object_foreach(v, k, e) if ((rc = json_sub_lits(e, L))) return rc;
	return rc;
}

/* A deep copy of v with the literals replaced (NULL stays NULL). */
static int json_sub_copy(const json_t *v, const struct lits *L, json_t **out)
{
	*out = NULL;
	if (!v)
		return KV_OK;
	*out = json_deep_copy(v);
	if (!*out)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	return json_sub_lits(*out, L);
}

/* The rendered text with the placeholders put back: *spans gets the
 * [start, end) byte ranges of the literals (pairs, ascending), and the
 * cuts (positions in t, ascending) are moved to the same places in the
 * new text. */
static int lits_restore(const char *t, size_t n, const struct lits *L, struct kv_buf *out, size_t **spans,
			size_t *n_spans, size_t *cuts, size_t n_cuts)
{
	struct kv_buf sp = KV_BUF_INIT;
	size_t ci = 0;
	for (size_t x = 0; x < n;) {
		while (ci < n_cuts && cuts[ci] <= x)
			cuts[ci++] = out->len;
		if (t[x] == '[' && n - x > g_lit_tag_n && !memcmp(t + x, g_lit_tag, g_lit_tag_n)) {
			size_t y = x + g_lit_tag_n, k = 0;
			while (y < n && y - x < g_lit_tag_n + 6 && t[y] >= '0' && t[y] <= '9')
				k = k * 10 + (size_t)(t[y++] - '0');
			if (y < n && t[y] == ']' && y > x + g_lit_tag_n && k < L->n) {
				size_t span[2] = {out->len, out->len + L->t[k]->n};
				kv_buf_add(out, L->t[k]->s, L->t[k]->n);
				kv_buf_add(&sp, span, sizeof span);
				x = y + 1;
				continue;
			}
		}
		kv_buf_addc(out, t[x++]);
	}
	while (ci < n_cuts)
		cuts[ci++] = out->len;
	if (out->oom || sp.oom) {
		kv_buf_free(&sp);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	*n_spans = sp.len / (2 * sizeof(size_t));
	*spans = (size_t *)kv_buf_take(&sp);
	return KV_OK;
}

/* Tokens of text[start, end) where the spans are request literals: the
 * template's special tokens outside them are control tokens, everything
 * else is encoded with allow_special = 0. */
static int encode_mixed(const struct kv_chat *c, const struct lits *L, const char *text, size_t start, size_t end,
			const size_t *spans, size_t n_spans, struct kv_buf *ids)
{
	size_t si = 0, piece = start;
	int rc;
	for (size_t x = start; x <= end;) {
		while (si < n_spans && spans[2 * si + 1] <= x)
			si++;
		int in_span = si < n_spans && spans[2 * si] <= x;
		int l = x < end && !in_span ? lit_at(L, text + x, end - x) : -1;
		if (l >= 0 && si < n_spans && spans[2 * si] < x + L->t[l]->n)
			l = -1; /* would run into a request literal */
		if (x < end && l < 0) {
			x++;
			continue;
		}
		for (int part = 0; part < 2; part++) {
			size_t a = part ? x : piece, b = part ? (l >= 0 ? x + L->t[l]->n : x) : x;
			if (b > a) {
				int32_t *seg;
				size_t ns;
				if ((rc = kv_tok_encode(c->tok, text + a, b - a, part, &seg, &ns)))
					return rc;
				kv_buf_add(ids, seg, ns * sizeof *seg);
				free(seg);
			}
		}
		if (l < 0)
			break; /* x == end */
		x += L->t[l]->n;
		piece = x;
	}
	return KV_OK;
}

int kv_chat_render(const struct kv_chat *c, const json_t *messages, const json_t *tools,
		   const struct kv_chat_opts *opts, struct kv_chat_render *out)
{
	struct chat_job j = {0};
	json_t *prep = NULL;
	struct kv_buf text = KV_BUF_INIT;
	size_t *cuts = NULL, *cut_k = NULL, n_cuts = 0;
	int first_is_head = 0, from_probe = 0;
	int rc;
	struct kv_chat_opts o = {1, -1, NULL, 0, 0};

	memset(out, 0, sizeof *out);
	if (opts)
		o = *opts;
	if (tools && !json_is_null(tools) && !json_is_array(tools))
		return kv_fail(KV_ERR_INVALID, "tools must be an array");
	if (o.kwargs && !json_is_object(o.kwargs))
		return kv_fail(KV_ERR_INVALID, "chat_template_kwargs must be an object");
	if ((rc = kv_chat_prepare_messages(messages, &prep)))
		return rc;
	/* special-token literals in the request: placeholders (see template.h) */
	struct lits lits = {0};
	json_t *tools_sub = NULL, *kw_sub = NULL;
	size_t *spans = NULL, n_spans = 0;
	int subst = 0;
	if (!o.request_specials && c->tok) {
		pthread_once(&g_lit_once, lit_tag_init);
		if ((rc = lits_collect(c, &lits)))
			goto done;
		if (lits.n && (json_has_lit(prep, &lits) || (tools && json_has_lit(tools, &lits)) ||
			       (o.kwargs && json_has_lit(o.kwargs, &lits)))) {
			json_t *p2 = NULL;
			subst = 1;
			rc = json_sub_copy(prep, &lits, &p2);
			json_decref(prep);
			prep = p2;
			if (rc || (rc = json_sub_copy(tools, &lits, &tools_sub)) ||
			    (rc = json_sub_copy(o.kwargs, &lits, &kw_sub)))
				goto done;
			if (tools)
				tools = tools_sub;
			if (o.kwargs)
				o.kwargs = kw_sub;
		}
	}
	int has_tools = tools && json_is_array(tools) && json_array_size(tools) > 0;
	j.c = c;
	j.t = has_tools && c->tmpl_tools ? c->tmpl_tools : c->tmpl;
	j.base.cap = TM_DEFAULT_MAX_MEMORY;
	j.memo.ar = &j.base;
	j.g = calloc(32 + (o.kwargs ? json_object_size(o.kwargs) : 0), sizeof *j.g);
	if (!j.g) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto done;
	}
	/* variables, later ones winning as in HF: special tokens, then the
	 * caller's template kwargs, then messages/tools/... */
	{
		const char *k;
		json_t *v;
		json_object_foreach(c->special, k, v)
			if ((rc = job_set_json(&j, k, v, NULL)))
				goto done;
		if (o.kwargs)
			json_object_foreach((json_t *)o.kwargs, k, v)
				if ((rc = job_set_json(&j, k, v, NULL)))
					goto done;
	}
	if (o.enable_thinking >= 0)
		job_set(&j, "enable_thinking", vbool(o.enable_thinking));
	if ((rc = job_set_json(&j, "messages", prep, &j.i_messages)))
		goto done;
	j.msgs = j.g[j.i_messages].v.u.l;
	if (has_tools) {
		if ((rc = job_set_json(&j, "tools", tools, NULL)))
			goto done;
	} else {
		job_set(&j, "tools", VNONE);
	}
	job_set(&j, "documents", VNONE);
	j.i_agp = job_set(&j, "add_generation_prompt", vbool(o.add_generation_prompt));

	if ((rc = render_core(j.t, j.g, j.ng, NULL, &text, NULL, 0, NULL, &j.memo)))
		goto done;
	if (text.oom) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory for the rendered prompt");
		goto done;
	}
	const char *full = text.p ? text.p : "";
	size_t full_len = text.len;
	if (u8_invalid_at(full, full_len) >= 0) {
		rc = kv_fail(KV_ERR_INVALID, "the rendered prompt is not valid UTF-8");
		goto done;
	}

	/* boundaries in bytes */
	size_t n = j.msgs->n;
	if (c->tok && !o.skip_boundaries) {
		cuts = calloc(n + 2, sizeof *cuts);
		cut_k = calloc(n + 2, sizeof *cut_k);
		if (!cuts || !cut_k) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto done;
		}
		size_t h = 0;
		const char *role0 = json_string_value(json_object_get(json_array_get(prep, 0), "role"));
		if (role0 && !strcmp(role0, "system"))
			h = 1;
		size_t k0 = 1;
		if (h || has_tools) {
			size_t a = prefix_len(&j, h, full, full_len);
			if (!(a > 0 && clean_cut(c, full, full_len, a))) {
				a = probe_anchor(&j, h, full, full_len);
				from_probe = a > 0;
			}
			if (a > 0) {
				cut_k[n_cuts] = h;
				cuts[n_cuts++] = a;
				first_is_head = 1;
			}
			k0 = h + 1;
		}
		if (o.max_message_boundaries > 0 && n >= (size_t)o.max_message_boundaries &&
		    n + 1 - (size_t)o.max_message_boundaries > k0)
			k0 = n + 1 - (size_t)o.max_message_boundaries;
		for (size_t k = k0; k <= n; k++) {
			size_t l = prefix_len(&j, k, full, full_len);
			if (l > 0 && (!n_cuts || l > cuts[n_cuts - 1]) && clean_cut(c, full, full_len, l)) {
				cut_k[n_cuts] = k;
				cuts[n_cuts++] = l;
			}
		}
		kv_errclear();
	}
	if (subst) {
		struct kv_buf fin = KV_BUF_INIT;
		if ((rc = lits_restore(full, full_len, &lits, &fin, &spans, &n_spans, cuts, n_cuts))) {
			kv_buf_free(&fin);
			goto done;
		}
		kv_buf_free(&text);
		text = fin;
		full = text.p ? text.p : "";
		full_len = text.len;
	}

	/* tokens, segment by segment: every cut is at the start of an added
	 * token (or the end), where the tokenizer starts a new segment anyway,
	 * so the concatenation is the tokenization of the whole text and the
	 * tokens up to a cut are exactly the tokens of the text up to it */
	if (c->tok) {
		struct kv_buf ids = KV_BUF_INIT;
		size_t start = 0;
		out->boundaries = calloc(n_cuts ? n_cuts : 1, sizeof *out->boundaries);
		out->boundary_bytes = calloc(n_cuts ? n_cuts : 1, sizeof *out->boundary_bytes);
		out->boundary_msgs = calloc(n_cuts ? n_cuts : 1, sizeof *out->boundary_msgs);
		if (!out->boundaries || !out->boundary_bytes || !out->boundary_msgs) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto done;
		}
		for (size_t s = 0; s <= n_cuts; s++) {
			size_t end = s < n_cuts ? cuts[s] : full_len;
			if (end > start && n_spans) {
				if ((rc = encode_mixed(c, &lits, full, start, end, spans, n_spans, &ids))) {
					kv_buf_free(&ids);
					goto done;
				}
			} else if (end > start) {
				int32_t *seg;
				size_t ns;
				if ((rc = kv_tok_encode(c->tok, full + start, end - start, 1, &seg, &ns))) {
					kv_buf_free(&ids);
					goto done;
				}
				kv_buf_add(&ids, seg, ns * sizeof *seg);
				free(seg);
			}
			if (s < n_cuts) {
				out->boundaries[s] = (int32_t)(ids.len / sizeof(int32_t));
				out->boundary_bytes[s] = cuts[s];
				out->boundary_msgs[s] = (uint32_t)cut_k[s];
			}
			start = end;
		}
		if (ids.oom) {
			kv_buf_free(&ids);
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto done;
		}
		out->n_tokens = ids.len / sizeof(int32_t);
		out->tokens = (int32_t *)kv_buf_take(&ids);
		if (!out->tokens)
			out->tokens = calloc(1, sizeof(int32_t));
		out->n_boundaries = n_cuts;
		out->first_is_system = first_is_head;
		out->first_from_probe = from_probe;
	}
	out->text_len = full_len;
	out->text = text.p ? kv_buf_take(&text) : strdup("");
	if (!out->text)
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
done:
	if (rc)
		kv_chat_render_free(out);
	kv_buf_free(&text);
	free(cuts);
	free(cut_k);
	free(j.g);
	ar_free(&j.base);
	json_decref(prep);
	json_decref(tools_sub);
	json_decref(kw_sub);
	free(lits.t);
	free(spans);
	return rc;
}
