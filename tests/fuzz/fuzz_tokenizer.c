/*
 * fuzz_tokenizer.c - libFuzzer target for the tokenizer (text/tokenizer.c).
 *
 * Input: byte 0 picks the mode, the rest is the payload.
 *   even: encode the payload with a small built-in tokenizer (the Qwen3
 *         structure: NFC, the Qwen3 Split regex, ByteLevel, all 256 byte
 *         tokens, a few merges and added tokens; bit 1 = allow_special).
 *         Checks: the encoder accepts exactly the payloads a reference
 *         UTF-8 validator accepts; ids are in range; the cached and the
 *         uncached encoder agree; encode(decode(encode(x))) == encode(x)
 *         (decode gives NFC(x) and NFC is idempotent); the streaming
 *         decoder gives the batch decoder's text.
 *   odd:  load the payload as a tokenizer.json; when it loads, encode and
 *         decode a fixed text and the payload itself (ids checked as above).
 * Any failed check aborts. tests/fuzz/corpus/tokenizer holds the seeds
 * (texts and small tokenizer.json documents); `make test` replays them.
 */
#include "base/buf.h"
#include "base/err.h"
#include "base/log.h"
#include "text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                      \
	do {                                                                              \
		if (!(c)) {                                                                   \
			fprintf(stderr, "fuzz_tokenizer: check failed at line %d: %s (%s)\n", __LINE__, #c, \
				kv_errmsg());                                                      \
			abort();                                                                  \
		}                                                                             \
	} while (0)

static const char BUILTIN_HEAD[] =
	"{\"added_tokens\":["
	"{\"id\":265,\"content\":\"<|im_end|>\",\"special\":true,\"normalized\":false},"
	"{\"id\":266,\"content\":\"<|im_start|>\",\"special\":true,\"normalized\":false},"
	"{\"id\":267,\"content\":\"<think>\",\"special\":false,\"normalized\":false},"
	"{\"id\":268,\"content\":\"<|im\",\"special\":false,\"normalized\":false}],"
	"\"normalizer\":{\"type\":\"NFC\"},"
	"\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
	"\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+"
	"[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
	"{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
	"\"decoder\":{\"type\":\"ByteLevel\"},"
	"\"model\":{\"type\":\"BPE\",\"merges\":[\"Ġ Ġ\",\"e r\",\"Ġ t\",\"h e\",\"Ġt he\",\"ĠĠ ĠĠ\","
	"\"ĠĠĠĠ ĠĠĠĠ\",\"ĠĠĠĠĠĠĠĠ Ġ\",\"ĠĠĠĠĠĠĠĠ ĠĠĠĠĠĠĠĠ\"],\"vocab\":{";

static struct kv_tok *builtin(void)
{
	static struct kv_tok *t;
	if (t)
		return t;
	struct kv_buf b = KV_BUF_INIT;
	kv_buf_adds(&b, BUILTIN_HEAD);
	for (int i = 0; i < 256; i++) {
		/* GPT-2 byte-level char of byte i */
		int cp = i, n = 0;
		if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255))) {
			for (int x = 0; x < i; x++)
				if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
					n++;
			cp = 256 + n;
		}
		if (cp == '"' || cp == '\\')
			kv_buf_printf(&b, "%s\"\\%c\":%d", i ? "," : "", cp, i);
		else if (cp < 0x80)
			kv_buf_printf(&b, "%s\"%c\":%d", i ? "," : "", cp, i);
		else
			kv_buf_printf(&b, "%s\"%c%c\":%d", i ? "," : "", 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F), i);
	}
	/* merged tokens, the space runs longer than 8 bytes included (the piece
	 * cache stores keys past 8 bytes differently) */
	kv_buf_adds(&b, ",\"ĠĠ\":256,\"er\":257,\"Ġt\":258,\"he\":259,\"Ġthe\":260,\"ĠĠĠĠ\":261,"
			"\"ĠĠĠĠĠĠĠĠ\":262,\"ĠĠĠĠĠĠĠĠĠ\":263,\"ĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠ\":264}}}");
	CHECK(!b.oom);
	CHECK(kv_tok_load_mem(b.p, b.len, "builtin", &t) == KV_OK);
	kv_buf_free(&b);
	return t;
}

/* Reference UTF-8 validator: decode each scalar value and check its range. */
static int ref_valid(const uint8_t *p, size_t n)
{
	size_t i = 0;
	while (i < n) {
		uint32_t c = p[i], need, min;
		if (c < 0x80) {
			i++;
			continue;
		}
		if ((c & 0xE0) == 0xC0) {
			need = 1;
			min = 0x80;
			c &= 0x1F;
		} else if ((c & 0xF0) == 0xE0) {
			need = 2;
			min = 0x800;
			c &= 0x0F;
		} else if ((c & 0xF8) == 0xF0) {
			need = 3;
			min = 0x10000;
			c &= 0x07;
		} else
			return 0;
		if (i + need >= n)
			return 0; /* runs into the end */
		for (uint32_t k = 1; k <= need; k++) {
			if ((p[i + k] & 0xC0) != 0x80)
				return 0;
			c = (c << 6) | (p[i + k] & 0x3F);
		}
		if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
			return 0;
		i += need + 1;
	}
	return 1;
}

static void check_text(const struct kv_tok *t, const uint8_t *p, size_t n, int allow_special)
{
	int32_t *a = NULL, *b = NULL, *c = NULL;
	size_t na, nb, nc, tl;
	char *txt = NULL;
	int rc = kv_tok_encode(t, (const char *)p, n, allow_special, &a, &na);
	CHECK((rc == KV_OK) == ref_valid(p, n));
	if (rc) {
		CHECK(rc == KV_ERR_INVALID && a == NULL);
		return;
	}
	for (size_t i = 0; i < na; i++)
		CHECK(a[i] >= 0 && a[i] < kv_tok_vocab_size(t) && kv_tok_piece(t, a[i]));
	CHECK(kv_tok_encode_opt(t, (const char *)p, n, allow_special, 0, &b, &nb) == KV_OK);
	CHECK(na == nb && !memcmp(a, b, na * sizeof *a));
	CHECK(kv_tok_decode(t, a, na, 0, &txt, &tl) == KV_OK);
	CHECK(kv_tok_encode(t, txt, tl, allow_special, &c, &nc) == KV_OK);
	CHECK(nc == na && !memcmp(a, c, na * sizeof *a));
	{
		struct kv_tok_stream s;
		struct kv_buf out = KV_BUF_INIT;
		kv_tok_stream_init(&s, t, 0);
		for (size_t i = 0; i < na; i++)
			CHECK(kv_tok_stream_feed(&s, a[i], &out) == KV_OK);
		CHECK(kv_tok_stream_finish(&s, &out) == KV_OK);
		CHECK(out.len == tl && (tl == 0 || !memcmp(out.p, txt, tl)));
		kv_buf_free(&out);
	}
	free(a);
	free(b);
	free(c);
	free(txt);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int init;
	if (!init) {
		kv_log_set_level(KV_LOG_OFF); /* loaded documents may warn */
		init = 1;
	}
	if (size < 1)
		return 0;
	if (!(data[0] & 1)) {
		check_text(builtin(), data + 1, size - 1, (data[0] >> 1) & 1);
		return 0;
	}
	struct kv_tok *t = NULL;
	if (kv_tok_load_mem((const char *)data + 1, size - 1, "fuzz", &t) != KV_OK) {
		CHECK(t == NULL);
		return 0;
	}
	static const char sample[] = "Hello world <|im_end|> it's 12345 \xc3\xa9t\xc3\xa9 e\xcc\x81 \xf0\x9f\x98\x80\n\n  x";
	/* any loaded tokenizer: encode must not crash and ids must be known */
	int32_t *ids;
	size_t n;
	if (kv_tok_encode(t, sample, sizeof sample - 1, 1, &ids, &n) == KV_OK) {
		char *txt;
		size_t tl;
		for (size_t i = 0; i < n; i++)
			CHECK(kv_tok_piece(t, ids[i]) != NULL);
		CHECK(kv_tok_decode(t, ids, n, 0, &txt, &tl) == KV_OK);
		free(txt);
		free(ids);
	}
	if (kv_tok_encode(t, (const char *)data + 1, size - 1, 0, &ids, &n) == KV_OK)
		free(ids);
	kv_tok_free(t);
	return 0;
}
