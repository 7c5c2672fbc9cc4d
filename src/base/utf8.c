/*
 * utf8.c - UTF-8 validation, decoding, encoding and lossy repair
 * (utf8.h). The validity rule lives in one place, seq() (kv_utf8_seq); every
 * other function here is built on it.
 */
#include "base/utf8.h"

#include <string.h>

/* kv_utf8_seq, inlined into the loops below (they run over whole prompts) */
static inline int seq(const uint8_t *p, size_t n)
{
	uint8_t b = p[0], lo = 0x80, hi = 0xBF;
	int need;
	if (b < 0x80)
		return 1;
	if (b >= 0xC2 && b <= 0xDF)
		need = 1;
	else if (b >= 0xE0 && b <= 0xEF) {
		need = 2;
		if (b == 0xE0)
			lo = 0xA0; /* below: overlong */
		else if (b == 0xED)
			hi = 0x9F; /* above: a surrogate */
	} else if (b >= 0xF0 && b <= 0xF4) {
		need = 3;
		if (b == 0xF0)
			lo = 0x90; /* below: overlong */
		else if (b == 0xF4)
			hi = 0x8F; /* above: past U+10FFFF */
	} else
		return -1;
	for (int k = 1; k <= need; k++) {
		if ((size_t)k >= n)
			return 0;
		uint8_t c = p[k];
		if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF))
			return -k;
	}
	return need + 1;
}

int kv_utf8_seq(const void *p, size_t n)
{
	return seq(p, n);
}

size_t kv_utf8_valid_prefix(const void *s, size_t n)
{
	const uint8_t *p = s;
	size_t i = 0;
	while (i < n) {
		/* 8 ASCII bytes at a time: most text is mostly ASCII */
		while (i + 8 <= n) {
			uint64_t w;
			memcpy(&w, p + i, 8);
			if (w & 0x8080808080808080ull)
				break;
			i += 8;
		}
		if (i >= n)
			break;
		if (p[i] < 0x80) {
			i++;
			continue;
		}
		int k = seq(p + i, n - i);
		if (k <= 0)
			return i;
		i += (size_t)k;
	}
	return n;
}

int kv_utf8_decode(const void *p, size_t n, int32_t *cp)
{
	if (n == 0)
		return 0;
	int k = seq(p, n);
	if (k <= 0)
		return 0;
	int len;
	*cp = kv_utf8_get(p, &len);
	return k;
}

int kv_utf8_encode(uint32_t c, void *out)
{
	uint8_t *o = out;
	if (c < 0x80) {
		o[0] = (uint8_t)c;
		return 1;
	}
	if (c < 0x800) {
		o[0] = (uint8_t)(0xC0 | (c >> 6));
		o[1] = (uint8_t)(0x80 | (c & 0x3F));
		return 2;
	}
	if (c < 0x10000) {
		o[0] = (uint8_t)(0xE0 | (c >> 12));
		o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
		o[2] = (uint8_t)(0x80 | (c & 0x3F));
		return 3;
	}
	o[0] = (uint8_t)(0xF0 | (c >> 18));
	o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
	o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
	o[3] = (uint8_t)(0x80 | (c & 0x3F));
	return 4;
}

size_t kv_utf8_count(const void *s, size_t n)
{
	const uint8_t *p = s;
	size_t c = 0;
	for (size_t i = 0; i < n; i++)
		c += (p[i] & 0xC0) != 0x80;
	return c;
}

size_t kv_utf8_lossy_append(struct kv_buf *out, const void *s, size_t n, int final)
{
	const uint8_t *p = s;
	size_t i = 0, run = 0;
	while (i < n) {
		if (p[i] < 0x80) {
			i++;
			continue;
		}
		int k = seq(p + i, n - i);
		if (k > 0) {
			i += (size_t)k;
			continue;
		}
		kv_buf_add(out, p + run, i - run);
		if (k == 0) {
			if (!final)
				return n - i;
			kv_buf_add(out, KV_UTF8_FFFD, 3);
			return 0;
		}
		kv_buf_add(out, KV_UTF8_FFFD, 3);
		i += (size_t)-k;
		run = i;
	}
	kv_buf_add(out, p + run, n - run);
	return 0;
}
