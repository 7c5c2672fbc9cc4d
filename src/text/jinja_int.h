/*
 * jinja_int.h - internal to src/text/: what the pieces of the Jinja
 * interpreter behind text/template.h share (jinja_lex.c, jinja_parse.c,
 * jinja_value.c, jinja_builtins.c, jinja_filters.c, jinja_eval.c) and what
 * the chat layer (chat.c) uses of them. Names shared between the pieces
 * carry the kj_ prefix; everything else stays static in its piece.
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
#ifndef KV_TEXT_JINJA_INT_H
#define KV_TEXT_JINJA_INT_H

#include "text/template.h"
#include "base/buf.h"
#include "base/err.h"
#include "base/json.h"
#include "base/map.h"
#include "base/mem.h"
#include "base/utf8.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------
 * Limits
 * ---------------------------------------------------------------------- */

#define TM_DEFAULT_MAX_STEPS   (4u * 1000 * 1000)   /* statements + iterations */
#define TM_DEFAULT_MAX_OUTPUT  (64u << 20)          /* bytes of rendered text */
#define TM_DEFAULT_MAX_MEMORY  (512u << 20)         /* arena bytes per render */
#define TM_MAX_EVAL_DEPTH      1000                 /* nested eval/exec calls */
#define TM_MAX_MACRO_DEPTH     100                  /* nested macro calls */
#define TM_MAX_PARSE_DEPTH     200                  /* nested expressions/blocks */
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
#define F_FIRST_UNSUPPORTED F_STRIPTAGS

enum test {
	T_ODD, T_EVEN, T_DIVISIBLEBY, T_DEFINED, T_UNDEFINED, T_FILTER, T_TEST, T_NONE, T_BOOLEAN, T_FALSE,
	T_TRUE, T_INTEGER, T_FLOAT, T_LOWER, T_UPPER, T_STRING, T_MAPPING, T_NUMBER, T_SEQUENCE,
	T_ITERABLE, T_CALLABLE, T_SAMEAS, T_ESCAPED, T_IN, T_EQ1, T_EQ2, T_EQ3, T_NE1, T_NE2, T_GT1, T_GT2,
	T_GT3, T_GE1, T_GE2, T_LT1, T_LT2, T_LT3, T_LE1, T_LE2,
	T__COUNT
};

enum gfn { G_RANGE, G_NAMESPACE, G_RAISE, G_STRFTIME, G_DICT, G_LIPSUM, G_CYCLER, G_JOINER, G__COUNT };

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

/* str case conversions (kj_str_case). */
enum { CASE_LOWER, CASE_UPPER, CASE_TITLE, CASE_CAPITALIZE };

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

#define TYPE_ERR(rt, at, ...) kj_rfail(rt, at, KV_ERR_INVALID, __VA_ARGS__)
#define UNSUP(rt, at, ...) kj_rfail(rt, at, KV_ERR_UNSUPPORTED, __VA_ARGS__)

struct lbuild {
	struct val *v;
	size_t n, cap;
};

struct jopts {
	int ensure_ascii;
	const char *indent;     /* NULL: one line */
	size_t indent_n;
	const char *item_sep, *key_sep;
	int sort_keys;
};

#define OFF(offs, i) ((offs) ? (offs)[i] : (size_t)(i))

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

/* One global for the render: a name and a value (which may live in
 * another arena that outlives the render). */
struct gval {
	const char *name;
	struct val v;
};

/* ------------------------------------------------------------------------
 * Shared functions and tables, by the piece that defines them (each one
 * is described where it is defined)
 * ---------------------------------------------------------------------- */

/* --- jinja_lex.c --- */
extern const char *const kj_op_text[];
void __attribute__((noreturn, format(printf, 3, 4)))
kj_cfail(struct cstate *cs, size_t off, const char *fmt, ...);
void __attribute__((noreturn)) kj_cnomem(struct cstate *cs);
void *kj_calloc_c(struct cstate *cs, size_t n);
void kj_lex(struct cstate *cs);
void kj_pos_of(const struct kv_tmpl *t, size_t off, int *line, int *col);

/* --- jinja_value.c --- */
void kj_ar_free(struct arena *a);
void *kj_ar_alloc_raw(struct arena *a, size_t n);
int kj_ar_contains(const struct arena *a, const void *p);
int kj_py_isspace(int32_t c);
int kj_py_isalpha(int32_t c);
int kj_py_isdigit(int32_t c);
int kj_py_isalnum(int32_t c);
int kj_py_iscased(int32_t c);
int kj_special_casing(int32_t c);
extern const struct val KJ_NONE;
extern const struct val KJ_MISSING;
const char *kj_kind_name(const struct val *v);
void __attribute__((noreturn, format(printf, 4, 5)))
kj_rfail(struct rt *rt, const struct node *at, int code, const char *fmt, ...);
void *kj_ralloc(struct rt *rt, const struct node *at, size_t n);
void kj_step(struct rt *rt, const struct node *at, uint64_t n);
void kj_ob_add(struct rt *rt, const struct node *at, struct outbuf *b, const char *p, size_t n);
void kj_ob_adds(struct rt *rt, const struct node *at, struct outbuf *b, const char *s);
void kj_ob_addc(struct rt *rt, const struct node *at, struct outbuf *b, char c);
void kj_ob_cp(struct rt *rt, const struct node *at, struct outbuf *b, int32_t cp);
struct val kj_ob_val(struct outbuf *b);
struct val kj_str_copy(struct rt *rt, const struct node *at, const char *p, size_t n);
void kj_emit(struct rt *rt, const struct node *at, const char *p, size_t n);
struct scope *kj_scope_new(struct rt *rt, const struct node *at, struct scope *parent);
void kj_scope_set(struct rt *rt, const struct node *at, struct scope *s, int sym, struct val v);
const struct val *kj_scope_get(const struct scope *s, int sym);
struct list *kj_list_new(struct rt *rt, const struct node *at, size_t n, int kind);
void kj_lb_push(struct rt *rt, const struct node *at, struct lbuild *b, struct val v);
struct val kj_lb_done(struct rt *rt, const struct node *at, struct lbuild *b, int kind);
struct dict *kj_dict_new(struct rt *rt, const struct node *at, size_t cap);
long kj_dict_find(struct rt *rt, const struct node *at, const struct dict *d, const struct val *key);
void kj_dict_set(struct rt *rt, const struct node *at, struct dict *d, struct val key, struct val v);
const struct val *kj_dict_get_str(struct rt *rt, const struct node *at, const struct dict *d, const char *s,
				      size_t n);
struct val kj_from_json(struct rt *rt, const json_t *j, int depth);
void kj_to_str(struct rt *rt, const struct node *at, const struct val *v, struct outbuf *b, int depth);
void kj_to_repr(struct rt *rt, const struct node *at, const struct val *v, struct outbuf *b, int depth);
struct val kj_str_of(struct rt *rt, const struct node *at, const struct val *v);
void kj_to_json(struct rt *rt, const struct node *at, const struct val *v, const struct jopts *o, int level,
		    struct outbuf *b);
int kj_truthy(const struct val *v);
int kj_val_eq(struct rt *rt, const struct node *at, const struct val *a, const struct val *b, int depth);
int kj_val_cmp(struct rt *rt, const struct node *at, const struct val *a, const struct val *b, const char *op,
		   int depth);
int kj_contains(struct rt *rt, const struct node *at, const struct val *needle, const struct val *hay);
struct val kj_binop(struct rt *rt, const struct node *at, int op, const struct val *a, const struct val *b);
struct val kj_undef_of(const char *name, size_t n, int parent_kind, int is_item);
void __attribute__((noreturn)) kj_fail_undef(struct rt *rt, const struct node *at, const struct val *u);
struct val kj_method_val(struct rt *rt, const struct node *at, const struct val *self, int id);
struct val kj_get_attr(struct rt *rt, const struct node *at, const struct val *obj, const char *s, size_t n);
size_t kj_cp_offsets(struct rt *rt, const struct node *at, const char *p, size_t n, size_t **offs);
struct val kj_get_item(struct rt *rt, const struct node *at, const struct val *obj, const struct val *key);
struct val kj_do_slice(struct rt *rt, const struct node *at, const struct val *obj, const struct val *a,
			   const struct val *b, const struct val *c);
const struct list *kj_iter_items(struct rt *rt, const struct node *at, const struct val *v);
int64_t kj_val_len(struct rt *rt, const struct node *at, const struct val *v);

/* --- jinja_value.c: method names and markup --- */
extern const char *const kj_meth_names[M__COUNT];
int kj_meth_lookup(int vkind, int lkind, const char *s, size_t n);
struct val kj_markup_escape(struct rt *rt, const struct node *at, const struct val *v);

/* --- jinja_builtins.c --- */
extern const char *const kj_gfn_names[G__COUNT];
int kj_find_name(const char *const *tab, int n, const char *s, size_t len);
void kj_bind(struct rt *rt, const struct node *at, const char *fname, const char *const *pn, int np, int nreq,
		 const struct args *a, struct val *out);
int64_t kj_want_int(struct rt *rt, const struct node *at, const char *fname, const struct val *v);
const struct val *kj_want_str(struct rt *rt, const struct node *at, const char *fname, const struct val *v);
struct val kj_str_case(struct rt *rt, const struct node *at, const struct val *s, int mode);
int kj_str_is_case(const struct val *s, int upper);
struct val kj_str_strip(struct rt *rt, const struct node *at, const struct val *s, const struct val *chars,
			    int which);
struct val kj_str_split(struct rt *rt, const struct node *at, const struct val *s, const struct val *sep,
			    int64_t maxsplit, int right);
struct val kj_str_replace(struct rt *rt, const struct node *at, const struct val *s, const struct val *old,
			      const struct val *new, int64_t count);
struct val kj_str_pad(struct rt *rt, const struct node *at, const struct val *s, int64_t width,
			  const struct val *fill, int mode /* 0 center, 1 ljust, 2 rjust */);
struct val kj_str_splitlines(struct rt *rt, const struct node *at, const struct val *s, int keepends);
struct val kj_str_join(struct rt *rt, const struct node *at, const struct val *sep, const struct list *items,
			   int strict);
struct val kj_call_method(struct rt *rt, const struct node *at, const struct val *self, int id,
			  const struct args *a);
struct val kj_call_global(struct rt *rt, const struct node *at, int fn, const struct args *a);

/* --- jinja_filters.c --- */
extern const char *const kj_filt_names[F__COUNT];
extern const char *const kj_test_names[T__COUNT];
struct val kj_call_filter(struct rt *rt, const struct node *at, int id, const struct val *v,
			      const struct args *a);
int kj_test_value(struct rt *rt, const struct node *at, int id, const struct val *v, const struct args *a);

/* --- jinja_eval.c --- */
struct val kj_call_value(struct rt *rt, const struct node *at, const struct val *f, const struct args *a);
struct val kj_eval(struct rt *rt, const struct node *x, struct scope *sc);
void kj_exec_body(struct rt *rt, struct node *const *v, int n, struct scope *sc, int *ctl);
int kj_render_core(const struct kv_tmpl *t, const struct gval *g, int ng, const struct kv_tmpl_limits *lim,
		       struct kv_buf *out, const char *expect, size_t expect_len, size_t *out_len, struct tj_memo *memo);
int kj_convert_json(const struct kv_tmpl *t, struct arena *ar, const json_t *j, struct val *out);

/* --- chat.c --- */

/* ------------------------------------------------------------------------
 * Small value helpers
 * ---------------------------------------------------------------------- */

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

#endif
