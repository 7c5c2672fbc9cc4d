/*
 * gram.h - the grammar IR of the constraint engine (docs/constrain.md): a
 * context-free grammar over bytes.
 *
 * Every front end builds this: the GBNF parser (gbnf.h), the JSON Schema
 * compiler (jschema.h) and the tool-call grammar (tcgram.h). The compiler
 * (gpda.h) turns it into a pushdown automaton of byte DFAs.
 *
 * A grammar is a set of rules; each rule is defined by one expression; an
 * expression is a tree of
 *   EMPTY            the empty string
 *   FAIL             nothing (an alternative that never matches)
 *   BYTES lo..hi     one byte in the range
 *   SEQ k1 k2 ...    concatenation
 *   ALT k1 k2 ...    alternation
 *   REP k {min,max}  repetition, max -1 = unbounded
 *   REF rule         a rule reference (recursion allowed)
 * Text is bytes: a code point class becomes the alternation of its UTF-8
 * byte sequences (kv_gram_cps), so the automaton never decodes UTF-8 and a
 * token that ends inside a character is matched byte by byte. Surrogates
 * (U+D800..DFFF) are never produced.
 *
 * Errors are sticky: a constructor that fails (out of memory, a size
 * limit) records the message with kv_fail and returns -1, and every
 * constructor given a -1 operand returns -1, so a front end can build a
 * whole expression and check once. kv_gram_error returns the first error.
 *
 * Ids: expressions and rules are small integers into arrays the grammar
 * owns; they stay valid until kv_gram_free. Not thread-safe.
 */
#ifndef KV_TEXT_GRAM_H
#define KV_TEXT_GRAM_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

enum kv_gx_kind { KV_GX_EMPTY = 0, KV_GX_FAIL, KV_GX_BYTES, KV_GX_SEQ, KV_GX_ALT, KV_GX_REP, KV_GX_REF };

/* Hard bounds that keep a hostile grammar from using unbounded memory. */
#define KV_GRAM_MAX_EXPRS (4 << 20)  /* expression nodes in one grammar */
#define KV_GRAM_MAX_RULES (1 << 20)
#define KV_GRAM_MAX_REP 100000       /* the largest finite repetition bound */

struct kv_gram;

/* One expression node, read-only view for the compiler and tests. */
struct kv_gx {
	uint8_t kind;      /* enum kv_gx_kind */
	int32_t a, b;      /* BYTES: lo, hi; REP: min, max (-1 = unbounded); REF: rule */
	int32_t kids;      /* SEQ, ALT, REP: offset into the kid array */
	int32_t n_kids;    /* SEQ, ALT: count; REP: 1 */
};

int kv_gram_create(struct kv_gram **out);
void kv_gram_free(struct kv_gram *g);
/* KV_OK, or the first error a constructor recorded (its message is
 * restored into kv_errmsg()). */
int kv_gram_error(const struct kv_gram *g);

/* --- rules ---------------------------------------------------------------- */

/* The rule named name[0..len) (declared on first use): its id, or -1. */
int kv_gram_rule(struct kv_gram *g, const char *name, size_t len);
/* A new rule with a name that no other rule has ("hint", "hint-2", ...). */
int kv_gram_rule_new(struct kv_gram *g, const char *hint);
/* Define a rule: KV_ERR_INVALID if it has a definition already. */
int kv_gram_define(struct kv_gram *g, int rule, int expr);
/* Where a rule was defined, for messages (GBNF: line and column). */
void kv_gram_rule_pos(struct kv_gram *g, int rule, int line, int col);
void kv_gram_set_root(struct kv_gram *g, int rule);

int kv_gram_root(const struct kv_gram *g);            /* -1 if unset */
int kv_gram_n_rules(const struct kv_gram *g);
const char *kv_gram_rule_name(const struct kv_gram *g, int rule);
int kv_gram_rule_expr(const struct kv_gram *g, int rule); /* -1 if undefined */
void kv_gram_rule_where(const struct kv_gram *g, int rule, int *line, int *col); /* 0, 0 if unknown */

/* --- expressions ---------------------------------------------------------- */

int kv_gram_empty(struct kv_gram *g);
int kv_gram_fail(struct kv_gram *g);
int kv_gram_bytes(struct kv_gram *g, int lo, int hi);
/* The byte string s[0..n) (n == 0: EMPTY). */
int kv_gram_lit(struct kv_gram *g, const void *s, size_t n);
int kv_gram_lits(struct kv_gram *g, const char *s);
int kv_gram_seq(struct kv_gram *g, const int *kids, int n);
/* Appends x to the growing list (*ids)[0..*n) of capacity *cap (the parsers
 * gather a sequence's or an alternation's parts this way); -1 and KV_ERR_NOMEM
 * naming `what` when it cannot grow. */
int kv_gram_ids_push(int **ids, int *n, int *cap, int x, const char *what);
int kv_gram_alt(struct kv_gram *g, const int *kids, int n);
int kv_gram_seq2(struct kv_gram *g, int a, int b);
int kv_gram_seq3(struct kv_gram *g, int a, int b, int c);
int kv_gram_alt2(struct kv_gram *g, int a, int b);
/* x{min,max}; max -1 = unbounded; KV_ERR_INVALID when min > max or a
 * bound exceeds KV_GRAM_MAX_REP. */
int kv_gram_rep(struct kv_gram *g, int x, int min, int max);
int kv_gram_opt(struct kv_gram *g, int x);   /* x? */
int kv_gram_star(struct kv_gram *g, int x);  /* x* */
int kv_gram_ref(struct kv_gram *g, int rule);
/*
 * One code point from a class given as n sorted or unsorted, possibly
 * overlapping inclusive ranges pairs[2i]..pairs[2i+1] (code points up to
 * 0x10FFFF); negate: every code point outside them. Surrogates are always
 * left out. An empty class is FAIL.
 */
int kv_gram_cps(struct kv_gram *g, const uint32_t *pairs, int n, int negate);
/* Any one code point (U+0000..U+10FFFF minus surrogates). */
int kv_gram_any_cp(struct kv_gram *g);

/* Read-only access for the compiler: the node and its kid ids. */
const struct kv_gx *kv_gram_node(const struct kv_gram *g, int expr);
const int32_t *kv_gram_kids(const struct kv_gram *g, int expr);
int kv_gram_n_exprs(const struct kv_gram *g);

/* The grammar in GBNF (one rule a line, root first), for messages, tests
 * and `kvkeep generate --print-grammar`. Bytes that are not printable
 * ASCII come out as \xHH. */
void kv_gram_dump(const struct kv_gram *g, struct kv_buf *out);

#endif
