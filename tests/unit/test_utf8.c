/*
 * test_utf8.c - base/utf8: the one UTF-8 validator, decoder, encoder and
 * lossy repair. Valid and invalid input of every kind (overlong,
 * surrogate, past U+10FFFF, stray continuation, cut short), the maximal
 * subparts of Unicode's U+FFFD rule, and agreement with jansson's own
 * check (which the tool-call parser used before) over every 1..3 byte
 * string and a sample of 4 byte ones.
 */
#include "base/buf.h"
#include "base/utf8.h"
#include "kt.h"

#include <jansson.h>
#include <stdlib.h>

static int seq(const char *s)
{
	return kv_utf8_seq(s, strlen(s));
}

static int valid(const char *s)
{
	return kv_utf8_valid(s, strlen(s));
}

KT_CASE(valid_lengths_and_boundaries)
{
	static const struct {
		uint32_t cp;
		const char *s;
	} v[] = {
		{0x41, "A"}, {0x7F, "\x7F"}, {0x80, "\xC2\x80"}, {0x7FF, "\xDF\xBF"}, {0x800, "\xE0\xA0\x80"},
		{0xD7FF, "\xED\x9F\xBF"}, {0xE000, "\xEE\x80\x80"}, {0xFFFD, "\xEF\xBF\xBD"},
		{0xFFFF, "\xEF\xBF\xBF"}, {0x10000, "\xF0\x90\x80\x80"}, {0x10FFFF, "\xF4\x8F\xBF\xBF"},
	};
	for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
		size_t n = strlen(v[i].s);
		int32_t cp = -1;
		char out[4];
		int len = 0;
		KT_EQ_INT(seq(v[i].s), (int)n);
		KT_EQ_INT(kv_utf8_decode(v[i].s, n, &cp), (int)n);
		KT_EQ_INT(cp, v[i].cp);
		KT_EQ_INT(kv_utf8_get(v[i].s, &len), v[i].cp);
		KT_EQ_INT(len, (int)n);
		KT_EQ_INT(kv_utf8_encode(v[i].cp, out), (int)n);
		KT_CHECK(!memcmp(out, v[i].s, n));
		KT_CHECK(valid(v[i].s));
		KT_EQ_INT(kv_utf8_count(v[i].s, n), 1);
	}
	/* NUL is a valid one-byte character when the length says so */
	KT_CHECK(kv_utf8_valid("a\0b", 3));
	KT_CHECK(kv_utf8_valid("", 0));
	int32_t cp = 7;
	KT_EQ_INT(kv_utf8_decode("", 0, &cp), 0);
	KT_EQ_INT(kv_utf8_count("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", 10), 4);
}

KT_CASE(invalid_overlong_surrogate_beyond)
{
	/* each: the bytes and kv_utf8_seq's answer (minus the maximal subpart) */
	static const struct {
		const char *s;
		int seq;
	} v[] = {
		{"\xC0\x80", -1},             /* overlong NUL */
		{"\xC1\xBF", -1},             /* overlong U+007F */
		{"\xE0\x80\x80", -1},         /* overlong U+0000 */
		{"\xE0\x9F\xBF", -1},         /* overlong U+07FF */
		{"\xF0\x80\x80\x80", -1},     /* overlong U+0000 */
		{"\xF0\x8F\xBF\xBF", -1},     /* overlong U+FFFF */
		{"\xED\xA0\x80", -1},         /* U+D800, a surrogate */
		{"\xED\xBF\xBF", -1},         /* U+DFFF */
		{"\xF4\x90\x80\x80", -1},     /* U+110000 */
		{"\xF5\x80\x80\x80", -1},     /* no such lead byte */
		{"\xFF", -1},
		{"\x80", -1},                 /* stray continuation byte */
		{"\xBF\x80", -1},
		{"\xC2\x41", -1},             /* lead byte, then ASCII */
		{"\xE2\x82\x41", -2},         /* two bytes of a three-byte form */
		{"\xF0\x9F\x98\x41", -3},     /* three bytes of a four-byte form */
	};
	for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
		size_t n = strlen(v[i].s);
		int32_t cp = 0;
		KT_CHECKF(seq(v[i].s) == v[i].seq, "case %zu: seq %d, want %d", i, seq(v[i].s), v[i].seq);
		KT_EQ_INT(kv_utf8_decode(v[i].s, n, &cp), 0);
		KT_CHECK(!valid(v[i].s));
		KT_EQ_INT(kv_utf8_valid_prefix(v[i].s, n), 0);
	}
	/* the offset of the first bad byte, past a run of valid text longer
	 * than the 8-byte ASCII step */
	const char *s = "abcdefghij\xC3\xA9kl\xED\xA0\x80mn";
	KT_EQ_INT(kv_utf8_valid_prefix(s, strlen(s)), 14);
}

KT_CASE(cut_short)
{
	/* a valid start that runs into the end: 0, not an error length */
	KT_EQ_INT(seq("\xC3"), 0);
	KT_EQ_INT(seq("\xE2\x82"), 0);
	KT_EQ_INT(seq("\xF0\x9F\x98"), 0);
	int32_t cp;
	KT_EQ_INT(kv_utf8_decode("\xE2\x82", 2, &cp), 0);
	KT_EQ_INT(kv_utf8_valid_prefix("ab\xE2\x82", 4), 2);
	/* but a wrong byte inside is found before the end is reached */
	KT_EQ_INT(seq("\xE0\x80"), -1);
	KT_EQ_INT(seq("\xF4\x90"), -1);
}

KT_CASE(lossy_maximal_subparts)
{
	/* Unicode's own example (chapter 3, U+FFFD substitution of maximal
	 * subparts): 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 */
	const char in[] = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
	struct kv_buf b = KV_BUF_INIT;
	KT_EQ_INT(kv_utf8_lossy_append(&b, in, sizeof in - 1, 1), 0);
	kv_buf_addc(&b, 0);
	KT_EQ_STR(b.p, "a" KV_UTF8_FFFD KV_UTF8_FFFD KV_UTF8_FFFD "b" KV_UTF8_FFFD "c" KV_UTF8_FFFD KV_UTF8_FFFD "d");
	/* not final: an incomplete tail is held back, its length returned */
	b.len = 0;
	KT_EQ_INT(kv_utf8_lossy_append(&b, "ok\xE2\x82", 4, 0), 2);
	KT_EQ_INT(b.len, 2);
	KT_CHECK(!memcmp(b.p, "ok", 2));
	/* final: the same tail is one U+FFFD */
	b.len = 0;
	KT_EQ_INT(kv_utf8_lossy_append(&b, "ok\xE2\x82", 4, 1), 0);
	KT_EQ_INT(b.len, 5);
	KT_CHECK(!memcmp(b.p, "ok" KV_UTF8_FFFD, 5));
	/* valid text passes unchanged */
	b.len = 0;
	KT_EQ_INT(kv_utf8_lossy_append(&b, "h\xC3\xA9llo", 6, 1), 0);
	KT_EQ_INT(b.len, 6);
	KT_CHECK(!memcmp(b.p, "h\xC3\xA9llo", 6));
	kv_buf_free(&b);
}

KT_CASE(round_trip_every_code_point)
{
	long bad = 0;
	for (uint32_t c = 0; c <= 0x10FFFF; c++) {
		char o[4];
		int32_t back = -1;
		int n = kv_utf8_encode(c, o);
		int want = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
		int sur = c >= 0xD800 && c <= 0xDFFF;
		int d = kv_utf8_decode(o, (size_t)n, &back);
		if (n != want || (sur ? d != 0 : (d != n || back != (int32_t)c)))
			bad++;
	}
	KT_EQ_INT(bad, 0);
}

/* jansson's json_stringn accepts exactly valid UTF-8: the rule the
 * tool-call parser used before base/utf8, and the one the template and
 * the safetensors reader had as their own code. */
static int jansson_ok(const char *s, size_t n)
{
	json_t *j = json_stringn(s, n);
	json_decref(j);
	return j != NULL;
}

KT_CASE(agrees_with_jansson)
{
	long diff = 0, tried = 0;
	unsigned char s[4];
	for (int a = 0; a < 256; a++) {
		s[0] = (unsigned char)a;
		diff += kv_utf8_valid(s, 1) != jansson_ok((char *)s, 1), tried++;
		for (int b = 0; b < 256; b++) {
			s[1] = (unsigned char)b;
			diff += kv_utf8_valid(s, 2) != jansson_ok((char *)s, 2), tried++;
			if (a < 0xC0)
				continue; /* an ASCII or continuation first byte decides alone */
			for (int c = 0; c < 256; c++) {
				s[2] = (unsigned char)c;
				diff += kv_utf8_valid(s, 3) != jansson_ok((char *)s, 3), tried++;
			}
		}
	}
	uint64_t st = 16;
	for (int i = 0; i < 400000; i++) {
		uint64_t r = kt_rand(&st);
		s[0] = (unsigned char)(0xEC + (r & 15));  /* ED .. FB: surrogates, 4-byte forms, past the end */
		s[1] = (unsigned char)(0x70 + ((r >> 8) & 0x5F));
		s[2] = (unsigned char)(r >> 16);
		s[3] = (unsigned char)(0x70 + ((r >> 24) & 0x5F));
		diff += kv_utf8_valid(s, 4) != jansson_ok((char *)s, 4), tried++;
	}
	KT_CHECKF(diff == 0, "%ld of %ld strings differ from jansson", diff, tried);
}

KT_MAIN(valid_lengths_and_boundaries, invalid_overlong_surrogate_beyond, cut_short, lossy_maximal_subparts,
	round_trip_every_code_point, agrees_with_jansson)
