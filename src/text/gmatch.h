/*
 * gmatch.h - the constraint engine's run time: a compiled grammar bound to
 * a vocabulary (struct kv_grammar, shareable) and one generation's matcher
 * (struct kv_gmatch): accept tokens, tell which tokens may come next.
 *
 * The matcher's state is a set of stacks of the pushdown automaton
 * (gpda.h), kept as a graph-structured stack: a node is (DFA state, parent
 * node), interned, so equal stacks are one node and a set of stacks is a
 * few node ids ("tops", each at a state that reads bytes).
 *
 * The token mask (xgrammar's adaptive token mask cache, in C): for each
 * DFA state that can be a top, the vocabulary trie (gvocab.h) is walked
 * once with the stack below that state unknown, and every token falls in
 * one of three classes:
 *   accepted   its bytes are matched without leaving the state's rule, or
 *              it ends exactly where the rule ends;
 *   rejected   it fails inside the rule;
 *   dependent  it leaves the rule with bytes to spare: whether those fit
 *              depends on the stack below.
 * A grammar whose recursion is inlined away (a JSON schema without $ref
 * cycles or free-form values, a tool call) has one rule, no stack below
 * and no dependent tokens. The entry (accepted ids as a list or a bitmap,
 * dependent ids as a list) is computed the first time the state is a top
 * and cached in the grammar under a byte bound (least recently used
 * entries are dropped past it). At run time the mask is the union over
 * the tops of the cached accepted set plus the dependent tokens checked
 * against the real stack, and those checks are cached in the matcher per
 * (state, stack) pair. No step scans the vocabulary: a token costs a copy
 * of one bitmap (or a few ids) once the states it visits are cached.
 *
 * End of sequence: the caller gives the end-of-sequence ids; they are in
 * the mask exactly when the grammar can end here. After one is accepted
 * the matcher is done and nothing more is allowed.
 *
 * Thread-safety: a kv_grammar may be shared by matchers on several
 * threads (its cache has a mutex); a kv_gmatch is one generation's and
 * is not thread-safe.
 */
#ifndef KV_TEXT_GMATCH_H
#define KV_TEXT_GMATCH_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "text/gpda.h"
#include "text/gram.h"
#include "text/gvocab.h"

#define KV_GM_MAX_DEPTH 4096   /* stack frames; deeper nesting is not allowed */
#define KV_GM_MAX_TOPS 4096    /* stacks alive at once (ambiguity bound) */

struct kv_grammar;
struct kv_gmatch;

struct kv_grammar_params {
	size_t cache_bytes;          /* bound on the mask cache; 0: 64 MiB */
	struct kv_gpda_limits lim;   /* compile limits (gpda.h) */
};

/* Compile ir against vocabulary v (borrowed: it must outlive the
 * grammar). Errors as kv_gpda_compile. One reference; kv_grammar_unref. */
int kv_grammar_create(const struct kv_gram *ir, const struct kv_gvocab *v, const struct kv_grammar_params *p,
		      struct kv_grammar **out);
struct kv_grammar *kv_grammar_ref(struct kv_grammar *g);
void kv_grammar_unref(struct kv_grammar *g);
/* Compute every state's mask entry now (benchmarks; the lazy default
 * computes only the states a generation visits). */
int kv_grammar_precompute(struct kv_grammar *g);
const struct kv_gpda *kv_grammar_pda(const struct kv_grammar *g);
const struct kv_gvocab *kv_grammar_vocab(const struct kv_grammar *g);

struct kv_grammar_stats {
	int n_states;                /* DFA states */
	int n_rules;                 /* callable rules */
	uint64_t entries_computed;   /* trie walks */
	uint64_t entries_evicted;
	uint64_t dependent_total;    /* dependent tokens over all walks */
	double walk_ms;              /* time in trie walks */
	size_t cache_bytes;          /* held by entries now */
};
void kv_grammar_get_stats(struct kv_grammar *g, struct kv_grammar_stats *s);

/* A matcher at the start of the grammar. eos[0..n_eos) are the
 * end-of-sequence ids (copied). Holds a reference to g. */
int kv_gmatch_create(struct kv_grammar *g, const int32_t *eos, int n_eos, struct kv_gmatch **out);
void kv_gmatch_free(struct kv_gmatch *m);
/* Back to the start (the caches stay). */
void kv_gmatch_reset(struct kv_gmatch *m);

/* uint32 words of a mask: (vocabulary ids + 31) / 32. Bit i of word i/32
 * (least significant first) is token i. */
int kv_gmatch_mask_words(const struct kv_gmatch *m);
/* The tokens allowed next. KV_OK, or KV_ERR_NOMEM. */
int kv_gmatch_fill_mask(struct kv_gmatch *m, uint32_t *mask);
/* The same mask by checking every token of the vocabulary against the
 * state (slow: for tests that compare it with kv_gmatch_fill_mask). */
int kv_gmatch_fill_mask_slow(struct kv_gmatch *m, uint32_t *mask);

/* Advance by a token: KV_OK, or KV_ERR_INVALID (the message names the
 * token) when the grammar does not allow it; the state is then unchanged.
 * An end-of-sequence id is accepted when the grammar can end. */
int kv_gmatch_accept(struct kv_gmatch *m, int32_t token);
/* Advance by raw bytes (text the caller put in the output itself, such as
 * a forced prefix). KV_ERR_INVALID, state unchanged, when not allowed. */
int kv_gmatch_accept_bytes(struct kv_gmatch *m, const void *p, size_t n);
/* 1 when token would be accepted now (state unchanged). */
int kv_gmatch_allows(struct kv_gmatch *m, int32_t token);

int kv_gmatch_can_end(const struct kv_gmatch *m);   /* the output so far is complete */
int kv_gmatch_done(const struct kv_gmatch *m);      /* ended, or only the end may follow */
int kv_gmatch_ended(const struct kv_gmatch *m);     /* an end-of-sequence id was accepted */

/* The shortest bytes that complete the output from here (appended to out;
 * nothing when it can end already): for closing an output at a length
 * budget. KV_OK or KV_ERR_NOMEM. */
int kv_gmatch_complete(struct kv_gmatch *m, struct kv_buf *out);

/* Tokens that spell bytes p[0..n) from here, longest token first at each
 * step (each one accepted by the matcher in turn); the ids go to ids
 * (room for n). Returns how many, or -1 when the bytes are not allowed.
 * Advances the matcher. */
int kv_gmatch_force(struct kv_gmatch *m, const void *p, size_t n, int32_t *ids);

/* Matcher-side counters (benchmarks). */
struct kv_gmatch_stats {
	uint64_t masks;              /* fill_mask calls */
	uint64_t dep_checked;        /* dependent tokens checked against a stack */
	uint64_t dep_cache_hits;     /* (state, stack) pairs served from the cache */
	int tops;                    /* stacks alive now */
	int nodes;                   /* stack nodes held */
};
void kv_gmatch_get_stats(const struct kv_gmatch *m, struct kv_gmatch_stats *s);

#endif
