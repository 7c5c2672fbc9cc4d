/*
 * gpda.h - a grammar (gram.h) compiled into a pushdown automaton whose
 * rules are byte DFAs: the form the matcher (gmatch.h) runs.
 *
 * Compilation:
 *   1. Rules that are not recursive are inlined into their users, and so
 *      are rules whose recursion is only in tail position (x ::= "a" x |
 *      "b" is a loop, not a stack). What stays a rule of its own
 *      ("callable") is the root and the rules of genuinely nested
 *      recursion (a JSON value inside an array inside a value); a callable
 *      rule used in one place only is inlined into that place too.
 *   2. Each callable rule becomes a Thompson NFA over byte ranges and
 *      "call R" edges, then a DFA by subset construction. Bytes are
 *      grouped into classes (bytes no range tells apart), so a DFA row is
 *      n_cls entries.
 *   3. Checks: left recursion (a rule that can reach a call of itself
 *      without reading a byte) is an error naming the cycle; so is a
 *      grammar that matches nothing. States from which no end can be
 *      reached are cut off (so every prefix the matcher allows can be
 *      finished), and the fewest bytes from each state to the end of its
 *      rule are kept for kv_gmatch_complete.
 * Every step is bounded (NFA and DFA states, see kv_gpda_limits): a
 * grammar too large or too ambiguous to determinize is an error, never a
 * hang.
 *
 * The result is immutable and may be shared between threads.
 */
#ifndef KV_TEXT_GPDA_H
#define KV_TEXT_GPDA_H

#include <stddef.h>
#include <stdint.h>

#include "text/gram.h"

/* State flags. */
enum {
	KV_GS_ACCEPT = 1,  /* the rule may end here */
	KV_GS_BYTES = 2,   /* has byte transitions (row >= 0) */
	KV_GS_CALLS = 4,   /* has call edges */
	KV_GS_SIMPLE = 8,  /* BYTES, not ACCEPT, no calls: its closure is itself */
	KV_GS_TAILRET = 16 /* ACCEPT and nothing else: returning here is returning further */
};

struct kv_gps {
	int32_t rule;      /* callable rule index */
	uint8_t flags;     /* KV_GS_* */
	int32_t row;       /* row of trans, or -1 */
	int32_t call0;     /* first call edge */
	int32_t n_calls;
	int32_t dist;      /* fewest bytes to reach ACCEPT in this rule (calls included) */
};

struct kv_gpda {
	int n_states;
	struct kv_gps *st;       /* [n_states] */
	int n_cls;               /* byte classes */
	uint8_t cls[256];        /* byte -> class */
	uint8_t cls_byte[256];   /* class -> its smallest byte */
	int n_rows;
	int32_t *trans;          /* [n_rows * n_cls]: next state, -1 none */
	int n_call_edges;
	int32_t *call_rule;      /* [n_call_edges] callee (callable rule index) */
	int32_t *call_ret;       /* [n_call_edges] state to continue at after it */
	int n_rules;             /* callable rules */
	int32_t *rule_start;     /* [n_rules] start state */
	int32_t *rule_minlen;    /* [n_rules] fewest bytes a call of it reads */
	uint8_t *rule_called;    /* [n_rules] some call edge targets it */
	char **rule_name;        /* [n_rules] owned copies of the names */
	int root;                /* callable index of the root rule */
	size_t bytes;            /* memory held, for the caller's accounting */
};

struct kv_gpda_limits {
	int max_nfa_states;      /* 0: 2,000,000 */
	int max_dfa_states;      /* 0: 200,000 */
};

/* Compile g (not modified) into *out (kv_gpda_free). KV_ERR_INVALID with
 * a message naming the rule for left recursion, an undefined rule, an
 * empty language or a size limit. */
int kv_gpda_compile(const struct kv_gram *g, const struct kv_gpda_limits *lim, struct kv_gpda **out);
void kv_gpda_free(struct kv_gpda *a);

static inline int32_t kv_gpda_next(const struct kv_gpda *a, int32_t s, int byte)
{
	int32_t row = a->st[s].row;
	return row < 0 ? -1 : a->trans[(size_t)row * (size_t)a->n_cls + a->cls[byte]];
}

#endif
