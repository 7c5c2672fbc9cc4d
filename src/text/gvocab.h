/*
 * gvocab.h - a tokenizer's vocabulary as the constraint engine walks it:
 * the token byte strings in a trie, laid out in pre-order.
 *
 * Node i (0..n_nodes) is one byte at depth depth[i] (1 = first byte of a
 * token); its subtree is nodes i+1 .. end[i]-1, so a walk that finds a
 * prefix dead skips every token under it in one jump. tok[i] is the
 * token whose bytes end at node i (or -1); ids with the same bytes are
 * chained through same_next. Special added tokens (<|im_end|>, ...) and
 * ids without bytes are not in the trie: a grammar never allows them
 * (end-of-sequence ids are the matcher's business, gmatch.h).
 *
 * Built once per tokenizer (a Qwen3 vocabulary: 151,643 tokens, 333,009
 * nodes, ~4 MB) and shared read-only by every grammar.
 */
#ifndef KV_TEXT_GVOCAB_H
#define KV_TEXT_GVOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "text/tokbytes.h"
#include "text/tokenizer.h"

struct kv_gvocab {
	int n_ids;              /* mask width: ids 0..n_ids-1 */
	int n_nodes;
	uint8_t *byte;          /* [n_nodes] */
	uint16_t *depth;        /* [n_nodes] 1.. */
	int32_t *end;           /* [n_nodes] one past the subtree */
	int32_t *tok;           /* [n_nodes] token ending here, or -1 */
	int32_t *same_next;     /* [n_ids] next id with the same bytes, or -1 */
	uint64_t (*sub)[4];     /* [n_nodes] the bytes that occur in the subtree
				 * (the node included), a 256-bit set: a walk
				 * accepts a whole subtree at once when a state
				 * loops on all of them (gmatch.c) */
	int max_depth;          /* longest token in bytes */
	int n_tokens;           /* ids in the trie */
	struct kv_tok_bytes *bytes; /* owned: id -> bytes */
	size_t mem;             /* bytes held */
};

/* From a tokenizer: ids 0..n_ids-1 (n_ids >= the tokenizer's size; the
 * rest have no bytes). Tokens longer than 65535 bytes are left out. */
int kv_gvocab_create(const struct kv_tok *t, int n_ids, struct kv_gvocab **out);
/* From a byte table (taken over: freed with the vocabulary). Ids with
 * len 0 or special set are left out. For tests and benchmarks. */
int kv_gvocab_from_bytes(struct kv_tok_bytes *b, struct kv_gvocab **out);
void kv_gvocab_free(struct kv_gvocab *v);

/* The longest token (not special) whose bytes are a prefix of p[0..n):
 * its id and *len, or -1. */
int32_t kv_gvocab_longest(const struct kv_gvocab *v, const void *p, size_t n, size_t *len);

#endif
