/*
 * tokbytes.c - token id -> raw bytes (tokbytes.h).
 *
 * A vocabulary piece is GPT-2 byte-level text: each character stands for
 * one byte (printable Latin-1 for itself, the rest shifted to U+0100..).
 * Pieces outside that alphabet (added tokens with other characters) are
 * decoded with the tokenizer, which gives their literal text.
 */
#include "text/tokbytes.h"
#include "base/buf.h"
#include "base/err.h"
#include "base/utf8.h"

#include <stdlib.h>
#include <string.h>

/* GPT-2 byte-level alphabet: code point -> byte, or -1. */
static int bytelevel_byte(uint32_t cp)
{
	if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
		return (int)cp;
	if (cp >= 256 && cp < 256 + 68) {
		int k = (int)cp - 256;
		for (int b = 0; b < 256; b++) {
			int direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
			if (!direct && k-- == 0)
				return b;
		}
	}
	return -1;
}

static int piece_bytes(const struct kv_tok *t, int32_t id, struct kv_buf *out)
{
	const char *p = kv_tok_piece(t, id);
	size_t start = out->len;
	if (p) {
		const unsigned char *u = (const unsigned char *)p;
		size_t left = strlen(p);
		int ok = 1;
		while (left) {
			int32_t cp;
			int n = kv_utf8_decode(u, left, &cp);
			int b = n > 0 ? bytelevel_byte((uint32_t)cp) : -1;
			if (b < 0) {
				ok = 0;
				break;
			}
			kv_buf_addc(out, (char)b);
			u += n;
			left -= (size_t)n;
		}
		if (ok)
			return KV_OK;
		out->len = start;
	}
	char *txt = NULL;
	size_t len = 0;
	int rc = kv_tok_decode(t, &id, 1, 0, &txt, &len);
	if (rc)
		return rc;
	kv_buf_add(out, txt, len);
	free(txt);
	return KV_OK;
}

/* A table of n ids without data (NULL: no memory). */
static struct kv_tok_bytes *table_new(int n)
{
	struct kv_tok_bytes *b = n >= 0 ? calloc(1, sizeof *b) : NULL;
	if (!b)
		return NULL;
	b->n = n;
	b->off = malloc(((size_t)n + 1) * sizeof *b->off);
	b->len = malloc(((size_t)n + 1) * sizeof *b->len);
	b->special = calloc((size_t)n + 1, 1);
	if (!b->off || !b->len || !b->special) {
		kv_tok_bytes_free(b);
		return NULL;
	}
	return b;
}

/* The table's data from the buffer d (failed: it ran out of memory), or
 * everything freed. */
static int finish(struct kv_tok_bytes *b, struct kv_buf *d, int failed, struct kv_tok_bytes **out)
{
	if (b && !failed && !d->oom) {
		b->data_len = d->len;
		b->data = d->p ? kv_buf_take(d) : calloc(1, 1);
		if (b->data) {
			*out = b;
			return KV_OK;
		}
	}
	kv_buf_free(d);
	kv_tok_bytes_free(b);
	return kv_fail(KV_ERR_NOMEM, "token byte table: out of memory");
}

int kv_tok_bytes_build(const struct kv_tok *t, int n_ids, struct kv_tok_bytes **out)
{
	struct kv_tok_bytes *b = table_new(n_ids);
	struct kv_buf d = KV_BUF_INIT;
	*out = NULL;
	if (!b)
		return finish(b, &d, 1, out);
	int nt = kv_tok_vocab_size(t);
	for (int i = 0; i < n_ids; i++) {
		size_t at = d.len;
		if (i < nt && kv_tok_piece(t, i)) {
			int rc = piece_bytes(t, i, &d);
			if (rc) {
				kv_buf_free(&d);
				kv_tok_bytes_free(b);
				return rc;
			}
			b->special[i] = (uint8_t)kv_tok_is_special(t, i);
		}
		if (d.len > UINT32_MAX / 2)
			return finish(b, &d, 1, out);
		b->off[i] = (uint32_t)at;
		b->len[i] = (uint32_t)(d.len - at);
	}
	return finish(b, &d, 0, out);
}

void kv_tok_bytes_free(struct kv_tok_bytes *b)
{
	if (!b)
		return;
	free(b->off);
	free(b->len);
	free(b->special);
	free(b->data);
	free(b);
}

int kv_tok_bytes_from(const char *const *s, const size_t *len, const uint8_t *special, int n,
		      struct kv_tok_bytes **out)
{
	struct kv_tok_bytes *b = table_new(n);
	struct kv_buf d = KV_BUF_INIT;
	*out = NULL;
	if (!b)
		return finish(b, &d, 1, out);
	for (int i = 0; i < n; i++) {
		if (d.len + len[i] > UINT32_MAX / 2)
			return finish(b, &d, 1, out);
		b->off[i] = (uint32_t)d.len;
		b->len[i] = (uint32_t)len[i];
		if (len[i])
			kv_buf_add(&d, s[i], len[i]);
		b->special[i] = special ? special[i] : 0;
	}
	return finish(b, &d, 0, out);
}
