/*
 * tokbytes.h - the raw bytes of every token id: what a token adds to the
 * text, as the byte-level decoder produces it (GPT-2 byte alphabet pieces
 * mapped back to bytes; added tokens as their literal content).
 *
 * The constraint engine matches grammars against these bytes (gvocab.h),
 * and the server's logprobs report them; ids past the tokenizer's (a
 * model's padded vocabulary: the qwen35-9b preset has 248,320 logits for
 * 151,669 ids) have no bytes.
 */
#ifndef KV_TEXT_TOKBYTES_H
#define KV_TEXT_TOKBYTES_H

#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

struct kv_tok_bytes {
	int n;             /* ids covered: the model's vocabulary size */
	uint32_t *off;     /* [n] offset into data */
	uint32_t *len;     /* [n] byte length; 0 for ids the tokenizer lacks */
	uint8_t *special;  /* [n] 1 for special added tokens (<|im_end|>, ...) */
	char *data;        /* all bytes, concatenated (owned) */
	size_t data_len;
};

/* Build the table for ids 0..n_ids-1 (n_ids may exceed the tokenizer's
 * size). *out is freed with kv_tok_bytes_free. */
int kv_tok_bytes_build(const struct kv_tok *t, int n_ids, struct kv_tok_bytes **out);
void kv_tok_bytes_free(struct kv_tok_bytes *b);
/* A table from n byte strings (s[i], len[i]; len 0 = an id without text):
 * tests and benchmarks build vocabularies with it. special may be NULL. */
int kv_tok_bytes_from(const char *const *s, const size_t *len, const uint8_t *special, int n,
		      struct kv_tok_bytes **out);

static inline const char *kv_tok_bytes_get(const struct kv_tok_bytes *b, int32_t id, size_t *len)
{
	if (id < 0 || id >= b->n) {
		*len = 0;
		return "";
	}
	*len = b->len[id];
	return b->data + b->off[id];
}

#endif
