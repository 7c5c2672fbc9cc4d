/*
 * utf8.h - UTF-8 validation, decoding, encoding and lossy repair: the one
 * implementation the tokenizer, the chat templates, the tool-call parser,
 * the safetensors reader, the synthetic model writer and the server's
 * JSON output share.
 *
 * Valid means what Unicode (and Python, Rust, jansson) call valid: the
 * shortest form only (no overlongs: C0, C1, E0 80..9F, F0 80..8F), no
 * surrogates (ED A0..BF), nothing past U+10FFFF (F4 90..BF, F5..FF), no
 * stray continuation bytes, no sequence cut short.
 *
 * What happens to invalid bytes is each caller's policy, and they differ
 * on purpose:
 *   - the tokenizer's decode replaces each maximal subpart with one U+FFFD
 *     (Rust's String::from_utf8_lossy, what Hugging Face returns):
 *     kv_utf8_lossy_append;
 *   - the server's JSON strings (ksv_json_text) replace each bad byte
 *     with one U+FFFD: kv_utf8_seq, one byte at a time;
 *   - chat templates, tool calls and safetensors names refuse the text:
 *     kv_utf8_valid, kv_utf8_decode.
 */
#ifndef KV_BASE_UTF8_H
#define KV_BASE_UTF8_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

#define KV_UTF8_FFFD "\xEF\xBF\xBD" /* U+FFFD REPLACEMENT CHARACTER */

/* The value of one hexadecimal digit (either case), -1 if c is not one. */
static inline int kv_hex_digit(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/*
 * The sequence at p[0..n), n >= 1: its length 1..4 when valid; 0 when
 * p[0..n) is a valid but incomplete start of one (it runs into the end);
 * else minus the length of its "maximal subpart" (-1..-3), the bytes
 * Unicode's "U+FFFD substitution of maximal subparts" replaces with one
 * U+FFFD.
 */
int kv_utf8_seq(const void *p, size_t n);
/* Offset of the first byte of p[0..n) that does not start a complete
 * valid sequence, or n when all of it is valid. */
size_t kv_utf8_valid_prefix(const void *p, size_t n);
/* 1 when all of p[0..n) is valid UTF-8. */
static inline int kv_utf8_valid(const void *p, size_t n)
{
	return kv_utf8_valid_prefix(p, n) == n;
}
/* Decode one code point at p (n bytes left, 0 allowed): its length 1..4,
 * or 0 when the bytes there are not a complete valid sequence. */
int kv_utf8_decode(const void *p, size_t n, int32_t *cp);
/* Decode one code point of text already known to be valid (no checks);
 * *len gets its length. */
static inline int32_t kv_utf8_get(const void *s, int *len)
{
	const uint8_t *p = s;
	uint8_t b = p[0];
	if (b < 0x80) {
		*len = 1;
		return b;
	}
	if (b < 0xE0) {
		*len = 2;
		return ((b & 0x1F) << 6) | (p[1] & 0x3F);
	}
	if (b < 0xF0) {
		*len = 3;
		return ((b & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
	}
	*len = 4;
	return ((b & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}
/* Encode cp (<= U+10FFFF; callers check surrogates where they matter)
 * into out, which has room for 4 bytes. Returns the length, 1..4. */
int kv_utf8_encode(uint32_t cp, void *out);
/* Code points in p[0..n): the bytes that are not continuation bytes. */
size_t kv_utf8_count(const void *p, size_t n);
/*
 * Append p[0..n) to out with each maximal subpart of invalid bytes
 * replaced by one U+FFFD. When `final` is 0, a valid but incomplete
 * sequence at the very end is not appended; its length is returned (0..3)
 * so the caller can hold it back until more bytes come. Returns 0 when
 * final.
 */
size_t kv_utf8_lossy_append(struct kv_buf *out, const void *p, size_t n, int final);

#endif
