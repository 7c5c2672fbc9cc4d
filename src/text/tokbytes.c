/*
 * tokbytes.c - see tokbytes.h.
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
		int k = (int)cp - 256, b;
		for (b = 0; b < 256; b++) {
			int direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
			if (!direct && k-- == 0)
				return b;
		}
	}
	return -1;
}

/* Raw bytes of one token from its vocabulary piece; falls back to the
 * tokenizer's decode for pieces outside the byte-level alphabet. */
static int piece_bytes(const struct kv_tok *t, int32_t id, struct kv_buf *out)
{
	const char *p = kv_tok_piece(t, id);
	size_t start = out->len;
	if (p) {
		const unsigned char *u = (const unsigned char *)p;
		size_t left = strlen(p);
		int ok = 1;
		while (left && ok) {
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

int kv_tokbytes_build(const struct kv_tok *t, int n_vocab, struct kv_tokbytes *out)
{
	struct kv_buf b = KV_BUF_INIT;
	memset(out, 0, sizeof *out);
	if (n_vocab < 0)
		n_vocab = 0;
	out->off = malloc(((size_t)n_vocab + 1) * sizeof *out->off);
	out->len = malloc(((size_t)n_vocab + 1) * sizeof *out->len);
	if (!out->off || !out->len) {
		kv_tokbytes_free(out);
		return kv_fail(KV_ERR_NOMEM, "out of memory for the token byte table");
	}
	for (int i = 0; i < n_vocab; i++) {
		size_t at = b.len;
		if (i < kv_tok_vocab_size(t) && kv_tok_piece(t, i))
			piece_bytes(t, i, &b);
		if (b.len - at > 65535)
			b.len = at + 65535;
		out->off[i] = (uint32_t)at;
		out->len[i] = (uint16_t)(b.len - at);
	}
	if (b.oom) {
		kv_buf_free(&b);
		kv_tokbytes_free(out);
		return kv_fail(KV_ERR_NOMEM, "out of memory for the token byte table");
	}
	out->data = b.p ? kv_buf_take(&b) : calloc(1, 1);
	if (!out->data) {
		kv_tokbytes_free(out);
		return kv_fail(KV_ERR_NOMEM, "out of memory for the token byte table");
	}
	out->n = n_vocab;
	return KV_OK;
}

void kv_tokbytes_free(struct kv_tokbytes *b)
{
	if (!b)
		return;
	free(b->off);
	free(b->len);
	free(b->data);
	memset(b, 0, sizeof *b);
}
