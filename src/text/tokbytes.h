/*
 * tokbytes.h - every token's raw bytes, in one table.
 *
 * Logprobs report a token's exact bytes ("bytes": [..] in the OpenAI
 * schema), and grammar masks test a token's bytes against a grammar; both
 * need them per token id, in O(1). A byte-level BPE vocabulary stores its
 * pieces in GPT-2's printable alphabet (one code point per byte): the table
 * maps them back. Pieces outside that alphabet (added tokens) fall back to
 * the tokenizer's own decode of the single id.
 *
 * Layout: one blob of all tokens' bytes, an offset and a length per id
 * (at most 65535 bytes per token: longer pieces are cut, none exists in a
 * real vocabulary). Ids the tokenizer does not know have no bytes. Built
 * once per loaded model; read-only afterwards, so any thread may read it.
 */
#ifndef KV_TEXT_TOKBYTES_H
#define KV_TEXT_TOKBYTES_H

#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

struct kv_tokbytes {
	int n;                /* ids in the table (the model's vocabulary) */
	uint32_t *off;        /* n offsets into data */
	uint16_t *len;        /* n lengths */
	char *data;           /* the bytes (not NUL-terminated per token) */
};

/* Build the table for ids [0, n_vocab) (n_vocab may exceed the
 * tokenizer's size: the rest have no bytes). KV_ERR_NOMEM. */
int kv_tokbytes_build(const struct kv_tok *t, int n_vocab, struct kv_tokbytes *out);
void kv_tokbytes_free(struct kv_tokbytes *b);

/* The bytes of id (*len 0 and "" outside the table). */
static inline const char *kv_tokbytes_get(const struct kv_tokbytes *b, int32_t id, size_t *len)
{
	if (id < 0 || id >= b->n) {
		*len = 0;
		return "";
	}
	*len = b->len[id];
	return b->data + b->off[id];
}

#endif
