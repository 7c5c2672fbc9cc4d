/*
 * tokenizer.c - byte-level BPE tokenizer read from a Hugging Face
 * tokenizer.json (see tokenizer.h for the API, docs/tokenizer.md for the
 * user-facing description).
 *
 * What kv_tok_encode computes is Hugging Face's
 * `tokenizer.encode(text, add_special_tokens=False)`: the post-processor,
 * truncation and padding sections are not applied (the chat template adds
 * every special token itself). With allow_special = 0 it is the same with
 * `encode_special_tokens = True` (special literals are encoded as text).
 *
 * Format read (tokenizer.json; fields not listed are ignored because they
 * cannot change the ids, anything else that could is rejected):
 *
 *   "model": {                        type "BPE" (or no type with merges)
 *     "vocab": {"token": id, ...},    ids >= 0, unique, not too sparse
 *     "merges": ["a b", ...] | [["a", "b"], ...]   rank = index; a, b and
 *                                     a+b must be in the vocab; a later
 *                                     duplicate overrides (as in HF)
 *     "ignore_merges": bool,          a piece that is a whole vocab token
 *                                     skips the merges
 *     "unk_token": null | "tok",      used for bytes without a vocab entry
 *     "dropout": null | 0, "continuing_subword_prefix": null | "",
 *     "end_of_word_suffix": null | "", "byte_fallback": false,
 *     "fuse_unk": false unless unk_token is null     (else unsupported)
 *   },
 *   "added_tokens": [{"id", "content", "special", "lstrip", "rstrip",
 *                     "normalized", "single_word": false}],
 *                                     ids must be what HF assigns: the vocab
 *                                     id when content is a vocab token, else
 *                                     the next id after vocab and earlier
 *                                     added tokens (HF renumbers otherwise)
 *   "normalizer": null | {"type": "NFC"} | {"type": "Sequence",
 *                 "normalizers": [NFC...]}
 *   "pre_tokenizer": a ByteLevel, or a Sequence of Split... then one
 *                 ByteLevel last. Split: {"pattern": {"Regex": r} |
 *                 {"String": s}, "behavior": "Isolated", "invert": false}.
 *                 ByteLevel: add_prefix_space false; use_regex true adds
 *                 the GPT-2 split pattern.
 *   "decoder": {"type": "ByteLevel"}
 *
 * Encode pipeline (HF's order):
 *   1. added tokens whose "normalized" is false are matched on the raw
 *      text, leftmost-longest (a trie walk per candidate position);
 *      a special match is skipped when !allow_special (HF skips the match,
 *      the text under it becomes ordinary text);
 *   2. every gap is NFC-normalised, then added tokens with "normalized"
 *      true are matched in the normalised gap;
 *   3. each remaining gap goes through the Split stages (PCRE2, UTF + UCP,
 *      JIT; each stage sees one piece of the previous stage as its whole
 *      subject, as in HF) and each final piece through byte-level BPE.
 *      The regex runs verbatim, but over a copy of the gap in which the
 *      code points that PCRE2's Unicode 14 tables class differently from
 *      HF's Oniguruma (Unicode 16) are replaced by same-length stand-ins
 *      of the oracle's class (tokenizer_ucd.h, generated); the pieces are
 *      cut from the real text at the same offsets.
 *
 * Loading: model.vocab and model.merges (nearly all of an 11 MB file) are
 * streamed by a small strict JSON reader into flat arrays; every other
 * value goes through jansson (tokjson.c).
 *
 * BPE: the bytes of a piece start as the ids of their byte-level chars;
 * the adjacent pair with the lowest merge rank (leftmost on ties) is
 * merged until no pair has a merge. Short pieces use a linear scan over an
 * array, long ones a 4-ary heap over a linked list (O(n log n), HF's
 * algorithm). The results of pieces up to PC_MAX_KEY bytes are cached in
 * two levels: a lock-free table per encode call (repeats within a long
 * prompt) in front of a table shared by all threads (16 shards, one mutex
 * each: repeats across requests).
 *
 * Decode: each id has its bytes precomputed: the token string mapped back
 * through the byte-level table, or, when a char of it is not in the table
 * (added tokens such as "<a>\n"), its raw UTF-8 (HF's ByteLevel decoder
 * does the same). Invalid UTF-8 in the joined bytes becomes U+FFFD per
 * maximal subpart (Rust's String::from_utf8_lossy).
 *
 * Errors: malformed files are KV_ERR_INVALID naming the field, features
 * we do not implement are KV_ERR_UNSUPPORTED naming the feature.
 */
#include "text/tokenizer.h"
#include "model/gguf_model.h"
#include "text/tokenizer_ucd.h"
#include "text/tokjson.h"
#include "base/err.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/json.h"
#include "base/log.h"
#include "base/map.h"
#include "base/mem.h"
#include "base/utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define KV_TOK_MAX_FILE (512u << 20)  /* tokenizer.json larger than this is refused */
#define KV_TOK_MAX_ID (1 << 24)       /* ids above this are refused (16M) */
#define KV_TOK_MAX_SPLITS 8           /* Split stages in the pre-tokenizer */
#define BPE_SMALL 48                  /* pieces up to this many bytes use the array scan */

/* GPT-2's byte-level split pattern (ByteLevel with use_regex true). */
static const char GPT2_PATTERN[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ------------------------------------------------------------------------ */
/* Structures                                                               */

struct added {
	char *content;       /* malloc'd, len bytes (+NUL) */
	uint32_t len;
	int32_t id;
	uint8_t special, lstrip, rstrip, normalized;
};

/* Trie over added-token contents: first-child / next-sibling lists. */
struct trie_node {
	int32_t child;   /* first child, -1 none */
	int32_t sib;     /* next sibling, -1 none */
	int32_t tok;     /* index into t->added ending here, -1 none */
	uint8_t byte;
};

struct trie {
	struct trie_node *n;
	int32_t nn, cap;
	int32_t root[256];   /* node of the first byte, -1 none */
};

/* Merge table: open addressing, key = a << 32 | b (a, b < 2^24). */
struct mslot {
	uint64_t key;    /* MKEY_EMPTY when free */
	uint32_t rank;
	int32_t id;      /* id of the merged token */
};
#define MKEY_EMPTY UINT64_MAX

struct split {
	pcre2_code *re;
	int jit;         /* JIT compiled */
};

/*
 * Piece cache: PC_SHARDS shards picked by the top bits of the hash, each
 * a fixed table of PC_SLOTS slots (linear probing) and a PC_ARENA byte
 * arena. A slot holds the first 8 key bytes and, for one-id pieces (most
 * of them), the id itself, so a hit on a short word touches one cache
 * line; longer keys and id lists continue in the arena. A full shard is
 * simply emptied: the cache only ever changes speed, never the ids. HF
 * caches words up to 256 chars; so do we (bytes).
 */
#define PC_SHARDS 16
#define PC_SLOTS 2048
#define PC_ARENA (64u << 10)
#define PC_MAX_KEY 256
#define PC_MAX_IDS 256

struct pc_slot {
	uint64_t h;      /* 0 = empty */
	uint8_t key[8];  /* first min(klen, 8) key bytes */
	uint32_t off;    /* arena: key bytes after the 8th, then the ids when nids > 1 (4-aligned) */
	uint16_t klen;
	uint16_t nids;
	int32_t id0;     /* the id when nids == 1 */
	uint32_t pad;
};

/* One hash table of pieces: nslots (power of two) slots + an arena. */
struct pc_tab {
	struct pc_slot *slots;   /* NULL until first use */
	uint8_t *arena;
	uint32_t nslots;
	uint32_t arena_cap;      /* bytes */
	uint32_t used;           /* arena bytes used */
	uint32_t count;          /* live slots */
};

struct pc_shard {
	pthread_mutex_t mu;
	struct pc_tab tab;       /* PC_SLOTS slots, PC_ARENA bytes, kv_alloc'd lazily */
	uint64_t hits, misses;
	char pad[64];            /* keep shards on separate cache lines */
};

/* The per-call table: no lock. Created after LC_AFTER pieces, so short
 * texts never pay for it; it is what makes a long prompt's repeats cheap
 * (the shared cache's mutex costs more than a hit). */
#define LC_SLOTS 4096
#define LC_ARENA (64u << 10)
#define LC_AFTER 64

struct kv_tok {
	char *what;               /* source name for messages */
	int32_t n_ids;            /* max id + 1 */
	/* per id */
	uint32_t *piece_off;      /* [n_ids] offset into pieces */
	uint32_t *piece_len;
	char *pieces;             /* token strings, each NUL-terminated */
	uint32_t *dec_off;        /* [n_ids] offset into dec */
	uint32_t *dec_len;
	uint8_t *dec;             /* decoded bytes of every id */
	uint8_t *flags;           /* [n_ids] TF_* */
	struct kv_map *vocab;     /* model token string -> id */
	struct kv_map *raw_vocab; /* decoded bytes -> id (ignore_merges only) */
	/* added tokens */
	struct added *added;
	int32_t n_added;
	struct trie trie_raw;     /* normalized == false */
	struct trie trie_norm;    /* normalized == true (content NFC'd) */
	int has_norm_added;
	/* model */
	int32_t byte_id[256];     /* id of each byte's byte-level char, -1 none */
	int32_t unk_id;           /* -1 none */
	int ignore_merges;
	struct mslot *merges;     /* kv_alloc'd, mcap slots */
	uint64_t mmask;
	int mshift;
	/* normalizer / pre-tokenizer */
	int nfc;
	struct split splits[KV_TOK_MAX_SPLITS];
	int n_splits;
	/* cache */
	struct pc_shard cache[PC_SHARDS];
};

enum { TF_VALID = 1, TF_ADDED = 2, TF_SPECIAL = 4 };

/* ------------------------------------------------------------------------ */
/* Unicode whitespace (UTF-8 itself: base/utf8.h)                          */

/* Rust's char::is_whitespace (Unicode White_Space), for lstrip/rstrip. */
static int is_white(int32_t c)
{
	return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
	       (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
	       c == 0x3000;
}

/* ------------------------------------------------------------------------ */
/* GPT-2 byte-level mapping                                                 */

/* Code point of the byte-level char of each byte (GPT-2 bytes_to_unicode:
 * printable bytes map to themselves, the other 68 to U+0100.. in order). */
static uint32_t g_b2u[256];
static int16_t g_u2b[324];   /* code point (< 324) -> byte, -1 if none */
static pthread_once_t g_b2u_once = PTHREAD_ONCE_INIT;

static void b2u_init(void)
{
	int k = 0;
	for (int i = 0; i < 324; i++)
		g_u2b[i] = -1;
	for (int b = 0; b < 256; b++) {
		int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
		g_b2u[b] = keep ? (uint32_t)b : (uint32_t)(256 + k++);
		g_u2b[g_b2u[b]] = (int16_t)b;
	}
}

/* ------------------------------------------------------------------------ */
/* NFC                                                                      */

/*
 * A fast NFC that only calls utf8proc where it can change something.
 * For every code point we precompute two bits:
 *   trig:  NFC may change text around it (a non-zero combining class, a
 *          canonical decomposition that does not compose back, a char that
 *          can be the second of a composition, a Hangul V/T jamo);
 *   inert: NFC never looks across it (combining class 0, no
 *          decomposition, composes with nothing on either side).
 * Text without a trig char is already NFC (the UAX 15 quick check).
 * Otherwise every maximal run of non-inert chars that holds a trig char
 * is normalised on its own: NFC(A x B) = NFC(A) x NFC(B) for inert x.
 */
static uint8_t *g_trig, *g_inert;  /* bitmaps over 0..0x10FFFF */
static uint8_t *g_fix;             /* code points of KV_TOK_UCD_FIX (pretok_gap) */
static pthread_once_t g_nfc_once = PTHREAD_ONCE_INIT;

static inline int bit(const uint8_t *m, int32_t c)
{
	return (m[c >> 3] >> (c & 7)) & 1;
}

static void nfc_init(void)
{
	size_t nb = 0x110000 / 8;
	g_trig = calloc(1, nb);
	g_inert = calloc(1, nb);
	g_fix = calloc(1, nb);
	if (!g_trig || !g_inert || !g_fix) {
		free(g_trig);
		free(g_inert);
		free(g_fix);
		g_trig = g_inert = g_fix = NULL;
		return;
	}
	for (size_t k = 0; k < sizeof KV_TOK_UCD_FIX / sizeof KV_TOK_UCD_FIX[0]; k++)
		for (uint32_t c = KV_TOK_UCD_FIX[k].lo; c <= KV_TOK_UCD_FIX[k].hi; c++)
			g_fix[c >> 3] |= (uint8_t)(1u << (c & 7));
	for (int32_t c = 0; c < 0x110000; c++) {
		const utf8proc_property_t *p;
		int trig, inert;
		if (c >= 0xD800 && c <= 0xDFFF)
			continue;
		p = utf8proc_get_property(c);
		trig = p->combining_class != 0 || (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000) ||
		       (c >= 0x1160 && c <= 0x11FF);
		if (!trig && p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0) {
			/* canonical decomposition: trig unless NFC(c) == c */
			uint8_t in[4], *outp = NULL;
			int l = kv_utf8_encode((uint32_t)c, in);
			utf8proc_ssize_t r = utf8proc_map(in, l, &outp, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
			trig = r != l || memcmp(outp, in, (size_t)l) != 0;
			free(outp);
		}
		inert = !trig && p->combining_class == 0 && p->decomp_seqindex == UINT16_MAX &&
			p->comb_index == UINT16_MAX && !(c >= 0x1100 && c <= 0x11FF) && !(c >= 0xAC00 && c <= 0xD7A3);
		/* HF's normaliser never composes U+11935 U+11930 into U+11938
		 * (DIVES AKURU VOWEL SIGN O), which Unicode does. The model saw
		 * HF's ids, so U+11930 is a boundary here: nothing composes with
		 * it (it has combining class 0 and composes with nothing else). */
		if (c == 0x11930) {
			trig = 0;
			inert = 1;
		}
		if (trig)
			g_trig[c >> 3] |= (uint8_t)(1u << (c & 7));
		if (inert)
			g_inert[c >> 3] |= (uint8_t)(1u << (c & 7));
	}
}

/* 1 if p[0..n) (valid UTF-8) may change under NFC. */
static int nfc_needed(const uint8_t *p, size_t n)
{
	size_t i = 0;
	while (i < n) {
		if (p[i] < 0x80) {
			i++;
			continue;
		}
		int l;
		int32_t c = kv_utf8_get(p + i, &l);
		if (bit(g_trig, c))
			return 1;
		i += (size_t)l;
	}
	return 0;
}

/* NFC of p[0..n) (valid UTF-8) into out (reset first). */
static int nfc_run(const uint8_t *p, size_t n, struct kv_buf *out)
{
	size_t i = 0, run = 0;
	int has_trig = 0;
	kv_buf_reset(out);
	while (i <= n) {
		int l = 1, inert = 1;
		int32_t c = 0;
		if (i < n) {
			c = kv_utf8_get(p + i, &l);
			inert = bit(g_inert, c);
		}
		if (inert) {
			if (has_trig) {
				uint8_t *o = NULL;
				utf8proc_ssize_t r = utf8proc_map(p + run, (utf8proc_ssize_t)(i - run), &o,
								  UTF8PROC_STABLE | UTF8PROC_COMPOSE);
				if (r < 0) {
					free(o);
					return kv_fail(r == UTF8PROC_ERROR_NOMEM ? KV_ERR_NOMEM : KV_ERR_INVALID,
						       "NFC: %s", utf8proc_errmsg(r));
				}
				kv_buf_add(out, o, (size_t)r);
				free(o);
			} else
				kv_buf_add(out, p + run, i - run);
			if (i < n)
				kv_buf_add(out, p + i, (size_t)l);
			run = i + (size_t)l;
			has_trig = 0;
		} else if (bit(g_trig, c))
			has_trig = 1;
		i += (size_t)l;
	}
	return out->oom ? kv_fail(KV_ERR_NOMEM, "NFC: out of memory") : KV_OK;
}

/* ------------------------------------------------------------------------ */
/* Trie of added tokens                                                     */

static void trie_init(struct trie *tr)
{
	memset(tr, 0, sizeof *tr);
	for (int i = 0; i < 256; i++)
		tr->root[i] = -1;
}

static void trie_free(struct trie *tr)
{
	free(tr->n);
	tr->n = NULL;
}

static int32_t trie_new(struct trie *tr, uint8_t b)
{
	if (tr->nn == tr->cap) {
		int32_t nc = tr->cap ? tr->cap * 2 : 64;
		struct trie_node *nn = realloc(tr->n, (size_t)nc * sizeof *nn);
		if (!nn)
			return -1;
		tr->n = nn;
		tr->cap = nc;
	}
	tr->n[tr->nn] = (struct trie_node){-1, -1, -1, b};
	return tr->nn++;
}

/* Add content -> tok. Returns the previous tok at that node (-1 if none),
 * or -2 on allocation failure. */
static int32_t trie_add(struct trie *tr, const uint8_t *s, size_t n, int32_t tok)
{
	int32_t cur = tr->root[s[0]];
	if (cur < 0) {
		if ((cur = trie_new(tr, s[0])) < 0)
			return -2;
		tr->root[s[0]] = cur;
	}
	for (size_t i = 1; i < n; i++) {
		int32_t c = tr->n[cur].child, prev = -1;
		while (c >= 0 && tr->n[c].byte != s[i]) {
			prev = c;
			c = tr->n[c].sib;
		}
		if (c < 0) {
			if ((c = trie_new(tr, s[i])) < 0)
				return -2;
			if (prev < 0)
				tr->n[cur].child = c;
			else
				tr->n[prev].sib = c;
		}
		cur = c;
	}
	int32_t old = tr->n[cur].tok;
	tr->n[cur].tok = tok;
	return old;
}

/*
 * Leftmost-longest match in p[from..n): returns the added index and sets
 * *ms, *me, or -1 when there is none (Aho-Corasick's LeftmostLongest, as
 * HF uses).
 */
static int32_t trie_find(const struct trie *tr, const uint8_t *p, size_t n, size_t from, size_t *ms, size_t *me)
{
	for (size_t i = from; i < n; i++) {
		int32_t cur = tr->root[p[i]];
		if (cur < 0)
			continue;
		int32_t best = tr->n[cur].tok;
		size_t bend = i + 1;
		for (size_t j = i + 1; j < n; j++) {
			int32_t c = tr->n[cur].child;
			while (c >= 0 && tr->n[c].byte != p[j])
				c = tr->n[c].sib;
			if (c < 0)
				break;
			cur = c;
			if (tr->n[cur].tok >= 0) {
				best = tr->n[cur].tok;
				bend = j + 1;
			}
		}
		if (best >= 0) {
			*ms = i;
			*me = bend;
			return best;
		}
	}
	return -1;
}

/* ------------------------------------------------------------------------ */
/* Merge table                                                              */

static inline uint64_t mhash(uint64_t key, int shift)
{
	return (key * 0x9E3779B97F4A7C15ull) >> shift;
}

static inline int merge_get(const struct kv_tok *t, int32_t a, int32_t b, uint32_t *rank, int32_t *id)
{
	uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	uint64_t i = mhash(key, t->mshift);
	for (;;) {
		const struct mslot *s = &t->merges[i];
		if (s->key == key) {
			*rank = s->rank;
			*id = s->id;
			return 1;
		}
		if (s->key == MKEY_EMPTY)
			return 0;
		i = (i + 1) & t->mmask;
	}
}

static void merge_put(struct kv_tok *t, int32_t a, int32_t b, uint32_t rank, int32_t id)
{
	uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	uint64_t i = mhash(key, t->mshift);
	while (t->merges[i].key != MKEY_EMPTY && t->merges[i].key != key)
		i = (i + 1) & t->mmask;
	t->merges[i] = (struct mslot){key, rank, id};
}

/* ------------------------------------------------------------------------ */
/* Loading                                                                  */

/* A JSON string's bytes (NUL allowed). */
static const char *jstr(const json_t *v, size_t *len)
{
	*len = json_string_length(v);
	return json_string_value(v);
}

/* Optional bool field: absent/null -> def. */
static int opt_bool(const json_t *o, const char *key, int def, int *out, const char *what, const char *ctx)
{
	json_t *v = json_object_get(o, key);
	*out = def;
	if (!v || json_is_null(v))
		return KV_OK;
	if (!json_is_boolean(v))
		return kv_fail(KV_ERR_INVALID, "%s: %s.%s must be true or false", what, ctx, key);
	*out = json_is_true(v);
	return KV_OK;
}

/* Optional string field that must be null or equal to one of the
 * accepted values; anything else is unsupported. */
static int expect_empty_str(const json_t *o, const char *key, const char *what)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return KV_OK;
	if (!json_is_string(v))
		return kv_fail(KV_ERR_INVALID, "%s: model.%s must be a string or null", what, key);
	if (json_string_length(v) != 0)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: model.%s \"%s\" is not supported (only empty)", what, key,
			       json_string_value(v));
	return KV_OK;
}

static const char *type_of(const json_t *o)
{
	json_t *ty = json_object_get(o, "type");
	return json_is_string(ty) ? json_string_value(ty) : NULL;
}

static int add_split(struct kv_tok *t, const char *pattern, size_t plen, int literal, const char *what)
{
	int errcode;
	PCRE2_SIZE erroff;
	pcre2_code *re;
	if (t->n_splits >= KV_TOK_MAX_SPLITS)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: more than %d Split pre-tokenizers", what, KV_TOK_MAX_SPLITS);
	/* PCRE2_LITERAL refuses UCP (which only matters to classes anyway) */
	re = pcre2_compile((PCRE2_SPTR)pattern, plen, PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP), &errcode,
			   &erroff, NULL);
	if (!re) {
		PCRE2_UCHAR msg[256];
		pcre2_get_error_message(errcode, msg, sizeof msg);
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: pre_tokenizer regex does not compile at offset %zu: %s", what,
			       (size_t)erroff, (const char *)msg);
	}
	t->splits[t->n_splits].re = re;
	t->splits[t->n_splits].jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
	if (!t->splits[t->n_splits].jit)
		KV_DEBUG("tok.nojit", "what=%s", what);
	t->n_splits++;
	return KV_OK;
}

/* One pre-tokenizer object; *seen_bl is set once a ByteLevel was read,
 * after which nothing may follow. */
static int load_pretok(struct kv_tok *t, const json_t *pt, int *seen_bl, const char *what)
{
	const char *ty = type_of(pt);
	if (!json_is_object(pt) || !ty)
		return kv_fail(KV_ERR_INVALID, "%s: pre_tokenizer entries must be objects with a \"type\"", what);
	if (*seen_bl)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: pre_tokenizer %s after ByteLevel is not supported", what, ty);
	if (!strcmp(ty, "Sequence")) {
		json_t *arr = json_object_get(pt, "pretokenizers");
		size_t i;
		json_t *v;
		if (!json_is_array(arr))
			return kv_fail(KV_ERR_INVALID, "%s: pre_tokenizer Sequence needs a \"pretokenizers\" array", what);
		json_array_foreach(arr, i, v)
		{
			int rc = load_pretok(t, v, seen_bl, what);
			if (rc)
				return rc;
		}
		return KV_OK;
	}
	if (!strcmp(ty, "Split")) {
		json_t *pat = json_object_get(pt, "pattern"), *beh = json_object_get(pt, "behavior"), *s;
		int invert, rc;
		if ((rc = opt_bool(pt, "invert", 0, &invert, what, "pre_tokenizer.Split")))
			return rc;
		if (invert)
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: Split with invert true is not supported", what);
		if (!json_is_string(beh))
			return kv_fail(KV_ERR_INVALID, "%s: Split needs a \"behavior\" string", what);
		if (strcmp(json_string_value(beh), "Isolated"))
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: Split behavior \"%s\" is not supported (only Isolated)",
				       what, json_string_value(beh));
		if (!json_is_object(pat))
			return kv_fail(KV_ERR_INVALID, "%s: Split needs a \"pattern\" object", what);
		if ((s = json_object_get(pat, "Regex")) && json_is_string(s)) {
			size_t l;
			const char *p = jstr(s, &l);
			return add_split(t, p, l, 0, what);
		}
		if ((s = json_object_get(pat, "String")) && json_is_string(s)) {
			size_t l;
			const char *p = jstr(s, &l);
			if (l == 0)
				return kv_fail(KV_ERR_UNSUPPORTED, "%s: Split with an empty String pattern", what);
			return add_split(t, p, l, 1, what);
		}
		return kv_fail(KV_ERR_INVALID, "%s: Split pattern must be {\"Regex\": ...} or {\"String\": ...}", what);
	}
	if (!strcmp(ty, "ByteLevel")) {
		int aps, use_regex, rc;
		if ((rc = opt_bool(pt, "add_prefix_space", 0, &aps, what, "pre_tokenizer.ByteLevel")) ||
		    (rc = opt_bool(pt, "use_regex", 1, &use_regex, what, "pre_tokenizer.ByteLevel")))
			return rc;
		if (aps)
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: ByteLevel add_prefix_space true is not supported", what);
		if (use_regex && (rc = add_split(t, GPT2_PATTERN, sizeof GPT2_PATTERN - 1, 0, what)))
			return rc;
		*seen_bl = 1;
		return KV_OK;
	}
	return kv_fail(KV_ERR_UNSUPPORTED, "%s: pre_tokenizer type \"%s\" is not supported", what, ty);
}

static int load_normalizer(struct kv_tok *t, const json_t *n, const char *what)
{
	const char *ty;
	if (!n || json_is_null(n))
		return KV_OK;
	ty = type_of(n);
	if (!json_is_object(n) || !ty)
		return kv_fail(KV_ERR_INVALID, "%s: normalizer must be null or an object with a \"type\"", what);
	if (!strcmp(ty, "NFC")) {
		t->nfc = 1;
		return KV_OK;
	}
	if (!strcmp(ty, "Sequence")) {
		json_t *arr = json_object_get(n, "normalizers"), *v;
		size_t i;
		if (!json_is_array(arr))
			return kv_fail(KV_ERR_INVALID, "%s: normalizer Sequence needs a \"normalizers\" array", what);
		json_array_foreach(arr, i, v)
		{
			int rc = load_normalizer(t, v, what);
			if (rc)
				return rc;
		}
		return KV_OK;
	}
	return kv_fail(KV_ERR_UNSUPPORTED, "%s: normalizer \"%s\" is not supported (only NFC)", what, ty);
}

/* Decoded bytes of a token string: through the byte-level table, or its
 * raw UTF-8 when a char is not in the table (HF's ByteLevel decoder). */
static void decode_piece(const char *s, size_t n, struct kv_buf *out)
{
	size_t start = out->len, i = 0;
	while (i < n) {
		int l;
		int32_t c = kv_utf8_get((const uint8_t *)s + i, &l);
		if (c >= 324 || g_u2b[c] < 0) {
			out->len = start;
			kv_buf_add(out, s, n);
			return;
		}
		kv_buf_addc(out, (char)g_u2b[c]);
		i += (size_t)l;
	}
}

static int load_model(struct kv_tok *t, struct tj *tj, const char *what)
{
	const json_t *root = tj->root, *model = json_object_get(root, "model");
	json_t *added, *v;
	const char *ty, *key;
	int rc, fuse_unk, byte_fallback;
	int64_t max_id = -1;
	size_t n_vocab, i, total_piece = 0, klen;
	struct kv_buf dec = KV_BUF_INIT;
	uint64_t next_added_id;

	if (!json_is_object(model))
		return kv_fail(KV_ERR_INVALID, "%s: no \"model\" object", what);
	ty = type_of(model);
	if (ty ? strcmp(ty, "BPE") != 0 : !(tj->has_merges || json_object_get(model, "merges")))
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: model type \"%s\" is not supported (only BPE)", what,
			       ty ? ty : "(none)");
	if (!tj->has_vocab)
		return kv_fail(KV_ERR_INVALID, "%s: model.vocab must be an object", what);
	if (!tj->has_merges)
		return kv_fail(KV_ERR_INVALID, "%s: model.merges must be an array", what);
	v = json_object_get(model, "dropout");
	if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0))
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: model.dropout is not supported", what);
	if ((rc = expect_empty_str(model, "continuing_subword_prefix", what)) ||
	    (rc = expect_empty_str(model, "end_of_word_suffix", what)) ||
	    (rc = opt_bool(model, "fuse_unk", 0, &fuse_unk, what, "model")) ||
	    (rc = opt_bool(model, "byte_fallback", 0, &byte_fallback, what, "model")) ||
	    (rc = opt_bool(model, "ignore_merges", 0, &t->ignore_merges, what, "model")))
		return rc;
	if (byte_fallback)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: model.byte_fallback true is not supported", what);

	/* ids */
	n_vocab = tj->n_vocab;
	t->vocab = kv_map_create(n_vocab);
	if (!t->vocab)
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
	for (i = 0; i < n_vocab; i++) {
		const struct tj_vocab *e = &tj->vocab[i];
		if (e->id < 0 || e->id >= KV_TOK_MAX_ID)
			return kv_fail(KV_ERR_INVALID, "%s: model.vocab[\"%.*s\"] must be an id in [0, %d)", what,
				       (int)(e->s.len < 60 ? e->s.len : 60), tj->arena.p + e->s.off, KV_TOK_MAX_ID);
		if (e->id > max_id)
			max_id = e->id;
	}
	added = json_object_get(root, "added_tokens");
	if (added && !json_is_null(added) && !json_is_array(added))
		return kv_fail(KV_ERR_INVALID, "%s: added_tokens must be an array", what);
	if (json_is_array(added)) {
		json_array_foreach(added, i, v)
		{
			json_t *id = json_object_get(v, "id");
			if (!json_is_object(v) || !json_is_integer(id) || json_integer_value(id) < 0 ||
			    json_integer_value(id) >= KV_TOK_MAX_ID)
				return kv_fail(KV_ERR_INVALID, "%s: added_tokens[%zu] needs an \"id\" in [0, %d)", what, i,
					       KV_TOK_MAX_ID);
			if (json_integer_value(id) > max_id)
				max_id = json_integer_value(id);
		}
	}
	if (max_id < 0)
		return kv_fail(KV_ERR_INVALID, "%s: the vocabulary is empty", what);
	/* ids index arrays: a huge id with few tokens would only waste memory */
	if ((uint64_t)max_id >= 4 * (n_vocab + json_array_size(added)) + 65536)
		return kv_fail(KV_ERR_INVALID, "%s: id %lld is far beyond the %zu tokens (ids must be dense)", what,
			       (long long)max_id, n_vocab + json_array_size(added));
	t->n_ids = (int32_t)max_id + 1;
	t->piece_off = calloc((size_t)t->n_ids, sizeof *t->piece_off);
	t->piece_len = calloc((size_t)t->n_ids, sizeof *t->piece_len);
	t->flags = calloc((size_t)t->n_ids, 1);
	if (!t->piece_off || !t->piece_len || !t->flags)
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);

	/* vocab: token strings, map */
	for (i = 0; i < n_vocab; i++) {
		int32_t id = (int32_t)tj->vocab[i].id;
		key = tj->arena.p + tj->vocab[i].s.off;
		klen = tj->vocab[i].s.len;
		if (klen == 0)
			return kv_fail(KV_ERR_INVALID, "%s: model.vocab has an empty token", what);
		if (t->flags[id])
			return kv_fail(KV_ERR_INVALID, "%s: model.vocab: id %d is used by two tokens (\"%.*s\")", what, id,
				       (int)(klen < 40 ? klen : 40), key);
		if (kv_map_get(t->vocab, key, klen, NULL))
			return kv_fail(KV_ERR_INVALID, "%s: model.vocab has the key \"%.*s\" twice", what,
				       (int)(klen < 40 ? klen : 40), key);
		t->flags[id] = TF_VALID;
		if (kv_map_put(t->vocab, key, klen, (uint64_t)id))
			return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
		total_piece += klen + 1;
	}

	/* added tokens: HF assigns the vocab id to a content that is a vocab
	 * token and the next free id otherwise; a file that says anything else
	 * would get other ids in HF, so it is refused */
	next_added_id = n_vocab;
	if (json_is_array(added) && json_array_size(added)) {
		t->added = calloc(json_array_size(added), sizeof *t->added);
		if (!t->added)
			return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
		json_array_foreach(added, i, v)
		{
			json_t *c = json_object_get(v, "content");
			struct added *a = &t->added[t->n_added];
			int32_t id = (int32_t)json_integer_value(json_object_get(v, "id"));
			int sw, sp;
			uint64_t vid;
			size_t cl;
			const char *cs;
			if (!json_is_string(c) || json_string_length(c) == 0)
				return kv_fail(KV_ERR_INVALID, "%s: added_tokens[%zu] needs a non-empty \"content\"", what, i);
			cs = jstr(c, &cl);
			if ((rc = opt_bool(v, "special", 0, &sp, what, "added_tokens[]")) ||
			    (rc = opt_bool(v, "single_word", 0, &sw, what, "added_tokens[]")))
				return rc;
			int ls, rs, nz;
			if ((rc = opt_bool(v, "lstrip", 0, &ls, what, "added_tokens[]")) ||
			    (rc = opt_bool(v, "rstrip", 0, &rs, what, "added_tokens[]")) ||
			    (rc = opt_bool(v, "normalized", !sp, &nz, what, "added_tokens[]")))
				return rc;
			if (sw)
				return kv_fail(KV_ERR_UNSUPPORTED,
					       "%s: added_tokens[%zu] \"%.40s\": single_word true is not supported", what, i, cs);
			if (kv_utf8_valid_prefix((const uint8_t *)cs, cl) != cl)
				return kv_fail(KV_ERR_INVALID, "%s: added_tokens[%zu] content is not UTF-8", what, i);
			for (int32_t k = 0; k < t->n_added; k++)
				if (t->added[k].len == cl && !memcmp(t->added[k].content, cs, cl))
					return kv_fail(KV_ERR_INVALID, "%s: added_tokens[%zu] \"%.40s\" appears twice", what, i,
						       cs);
			if (kv_map_get(t->vocab, cs, cl, &vid)) {
				if ((int64_t)vid != id)
					return kv_fail(KV_ERR_INVALID,
						       "%s: added_tokens[%zu] \"%.40s\" has id %d but is vocab token %llu", what,
						       i, cs, id, (unsigned long long)vid);
			} else {
				if ((uint64_t)id != next_added_id)
					return kv_fail(KV_ERR_INVALID,
						       "%s: added_tokens[%zu] \"%.40s\" has id %d where Hugging Face assigns %llu "
						       "(added ids continue the vocab in order)",
						       what, i, cs, id, (unsigned long long)next_added_id);
				next_added_id++;
				if (t->flags[id])
					return kv_fail(KV_ERR_INVALID, "%s: added_tokens[%zu]: id %d is already used", what,
						       i, id);
				total_piece += cl + 1;
			}
			a->content = malloc(cl + 1);
			if (!a->content)
				return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
			memcpy(a->content, cs, cl);
			a->content[cl] = 0;
			a->len = (uint32_t)cl;
			a->id = id;
			a->special = (uint8_t)sp;
			a->lstrip = (uint8_t)ls;
			a->rstrip = (uint8_t)rs;
			a->normalized = (uint8_t)nz;
			t->n_added++;
			t->flags[id] |= TF_VALID | TF_ADDED | (sp ? TF_SPECIAL : 0);
		}
	}

	/* token strings and decoded bytes, by id */
	t->pieces = malloc(total_piece + 1);
	t->dec_off = calloc((size_t)t->n_ids, sizeof *t->dec_off);
	t->dec_len = calloc((size_t)t->n_ids, sizeof *t->dec_len);
	if (!t->pieces || !t->dec_off || !t->dec_len)
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
	{
		size_t off = 0;
		for (i = 0; i < n_vocab; i++) {
			int32_t id = (int32_t)tj->vocab[i].id;
			klen = tj->vocab[i].s.len;
			memcpy(t->pieces + off, tj->arena.p + tj->vocab[i].s.off, klen);
			t->pieces[off + klen] = 0;
			t->piece_off[id] = (uint32_t)off;
			t->piece_len[id] = (uint32_t)klen;
			off += klen + 1;
		}
		for (int32_t k = 0; k < t->n_added; k++) {
			struct added *a = &t->added[k];
			uint64_t vid;
			if (kv_map_get(t->vocab, a->content, a->len, &vid))
				continue;
			memcpy(t->pieces + off, a->content, a->len + 1);
			t->piece_off[a->id] = (uint32_t)off;
			t->piece_len[a->id] = a->len;
			off += a->len + 1;
		}
		if (off > UINT32_MAX)
			return kv_fail(KV_ERR_INVALID, "%s: vocabulary strings too large", what);
	}
	for (int32_t id = 0; id < t->n_ids; id++) {
		if (!t->flags[id])
			continue;
		t->dec_off[id] = (uint32_t)dec.len;
		decode_piece(t->pieces + t->piece_off[id], t->piece_len[id], &dec);
		t->dec_len[id] = (uint32_t)(dec.len - t->dec_off[id]);
	}
	if (dec.oom || dec.len > UINT32_MAX) {
		kv_buf_free(&dec);
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
	}
	t->dec = (uint8_t *)kv_buf_take(&dec);
	if (!t->dec)
		t->dec = calloc(1, 1);

	/* byte-level symbols */
	for (int b = 0; b < 256; b++) {
		uint8_t u[4];
		uint64_t id;
		int l = kv_utf8_encode(g_b2u[b], u);
		t->byte_id[b] = kv_map_get(t->vocab, u, (size_t)l, &id) ? (int32_t)id : -1;
	}
	t->unk_id = -1;
	v = json_object_get(model, "unk_token");
	if (v && !json_is_null(v)) {
		uint64_t id;
		if (!json_is_string(v))
			return kv_fail(KV_ERR_INVALID, "%s: model.unk_token must be a string or null", what);
		if (!kv_map_get(t->vocab, json_string_value(v), json_string_length(v), &id))
			return kv_fail(KV_ERR_INVALID, "%s: model.unk_token \"%.40s\" is not in the vocab", what,
				       json_string_value(v));
		t->unk_id = (int32_t)id;
		if (fuse_unk)
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: model.fuse_unk true is not supported", what);
	}
	for (int b = 0; b < 256; b++)
		if (t->byte_id[b] < 0 && t->unk_id < 0) {
			KV_WARN("tok.missing_bytes", "what=%s first_missing_byte=%d note=\"such bytes are dropped, as "
						     "Hugging Face does\"",
				what, b);
			break;
		}

	/* merges */
	{
		size_t nm = tj->n_merges, cap = 16;
		int shift = 64 - 4;
		struct kv_buf cat = KV_BUF_INIT;
		while (cap < 2 * nm + 16) {
			cap *= 2;
			shift--;
		}
		t->merges = kv_alloc(KV_MEM_OTHER, cap * sizeof *t->merges);
		if (!t->merges)
			return kv_fail(KV_ERR_NOMEM, "%s: out of memory for %zu merges", what, nm);
		for (size_t k = 0; k < cap; k++)
			t->merges[k].key = MKEY_EMPTY;
		t->mmask = cap - 1;
		t->mshift = shift;
		for (i = 0; i < nm; i++) {
			const struct tj_merge *m = &tj->merges[i];
			const char *a, *b, *bad;
			uint64_t ia, ib, inew;
			if (m->a.len == UINT32_MAX) {
				kv_buf_free(&cat);
				return kv_fail(KV_ERR_INVALID, "%s: model.merges[%zu] must be \"a b\" or [\"a\", \"b\"]", what,
					       i);
			}
			a = tj->arena.p + m->a.off;
			b = tj->arena.p + m->b.off;
			kv_buf_reset(&cat);
			kv_buf_add(&cat, a, m->a.len);
			kv_buf_add(&cat, b, m->b.len);
			if (cat.oom) {
				kv_buf_free(&cat);
				return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
			}
			bad = !kv_map_get(t->vocab, a, m->a.len, &ia)   ? a
			      : !kv_map_get(t->vocab, b, m->b.len, &ib) ? b
			      : !kv_map_get(t->vocab, cat.p, cat.len, &inew) ? cat.p
									   : NULL;
			if (bad) {
				size_t bl = bad == a ? m->a.len : bad == b ? m->b.len : cat.len;
				rc = kv_fail(KV_ERR_INVALID, "%s: model.merges[%zu]: \"%.*s\" is not in the vocab", what, i,
					     (int)(bl < 40 ? bl : 40), bad);
				kv_buf_free(&cat);
				return rc;
			}
			merge_put(t, (int32_t)ia, (int32_t)ib, (uint32_t)i, (int32_t)inew);
		}
		kv_buf_free(&cat);
	}

	/* ignore_merges needs "is this piece a whole token" by its bytes */
	if (t->ignore_merges) {
		t->raw_vocab = kv_map_create(n_vocab);
		if (!t->raw_vocab)
			return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
		for (i = 0; i < n_vocab; i++) {
			int32_t id = (int32_t)tj->vocab[i].id;
			if (kv_map_put(t->raw_vocab, t->dec + t->dec_off[id], t->dec_len[id], (uint64_t)id))
				return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
		}
	}
	return KV_OK;
}

static int build_tries(struct kv_tok *t, const char *what)
{
	struct kv_buf nb = KV_BUF_INIT;
	trie_init(&t->trie_raw);
	trie_init(&t->trie_norm);
	for (int32_t k = 0; k < t->n_added; k++) {
		struct added *a = &t->added[k];
		const uint8_t *s = (const uint8_t *)a->content;
		size_t n = a->len;
		struct trie *tr = &t->trie_raw;
		int32_t old;
		if (a->normalized) {
			/* matched in normalised text, so its own content is normalised */
			tr = &t->trie_norm;
			t->has_norm_added = 1;
			if (t->nfc && nfc_needed(s, n)) {
				if (nfc_run(s, n, &nb)) {
					kv_buf_free(&nb);
					return kv_fail_ctx(KV_ERR_NOMEM, "%s", what);
				}
				s = (const uint8_t *)nb.p;
				n = nb.len;
			}
		}
		old = trie_add(tr, s, n, k);
		if (old == -2) {
			kv_buf_free(&nb);
			return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
		}
		if (old >= 0) {
			kv_buf_free(&nb);
			return kv_fail(KV_ERR_INVALID, "%s: added tokens \"%.40s\" and \"%.40s\" are the same after NFC", what,
				       t->added[old].content, a->content);
		}
	}
	kv_buf_free(&nb);
	return KV_OK;
}

int kv_tok_load_mem(const char *json, size_t len, const char *what, struct kv_tok **out)
{
	struct kv_tok *t;
	struct tj tj = {0};
	json_t *root = NULL, *dec;
	int rc, seen_bl = 0;
	const char *ty;

	*out = NULL;
	pthread_once(&g_b2u_once, b2u_init);
	pthread_once(&g_nfc_once, nfc_init);
	if (!g_trig)
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory (NFC tables)", what);
	t = calloc(1, sizeof *t);
	if (!t)
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
	for (int s = 0; s < PC_SHARDS; s++)
		pthread_mutex_init(&t->cache[s].mu, NULL);
	t->what = strdup(what ? what : "tokenizer.json");
	if (!t->what) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto fail;
	}
	what = t->what;
	if (!json && len) {
		rc = kv_fail(KV_ERR_INVALID, "%s: no data", what);
		goto fail;
	}
	if ((rc = kv_tokjson_read(&tj, json ? json : "", len, what)))
		goto fail;
	root = tj.root;
	if ((rc = load_model(t, &tj, what)))
		goto fail;
	if ((rc = load_normalizer(t, json_object_get(root, "normalizer"), what)))
		goto fail;
	{
		json_t *pt = json_object_get(root, "pre_tokenizer");
		if (pt && !json_is_null(pt) && (rc = load_pretok(t, pt, &seen_bl, what)))
			goto fail;
	}
	if (!seen_bl) {
		rc = kv_fail(KV_ERR_UNSUPPORTED, "%s: pre_tokenizer has no ByteLevel (only byte-level BPE is supported)",
			     what);
		goto fail;
	}
	dec = json_object_get(root, "decoder");
	ty = json_is_object(dec) ? type_of(dec) : NULL;
	if (!ty || strcmp(ty, "ByteLevel")) {
		rc = kv_fail(KV_ERR_UNSUPPORTED, "%s: decoder \"%s\" is not supported (only ByteLevel)", what,
			     ty ? ty : "(none)");
		goto fail;
	}
	if ((rc = build_tries(t, what)))
		goto fail;
	kv_tokjson_free(&tj);
	*out = t;
	return KV_OK;
fail:
	kv_tokjson_free(&tj);
	kv_tok_free(t);
	return rc;
}

int kv_tok_load(const char *path, struct kv_tok **out)
{
	char *buf;
	size_t len;
	int rc;
	*out = NULL;
	if ((rc = kv_io_read_file(path, KV_TOK_MAX_FILE, &buf, &len)))
		return rc;
	rc = kv_tok_load_mem(buf, len, path, out);
	free(buf);
	return rc;
}

int kv_tok_load_model(const char *model_path, struct kv_tok **out)
{
	char path[4200];
	*out = NULL;
	if (kv_gguf_is_model_path(model_path)) {
		struct kv_gguf *g = NULL;
		char *json = NULL;
		size_t len = 0;
		int rc = kv_gguf_open(model_path, &g);
		if (!rc)
			rc = kv_gguf_tokenizer_json(g, &json, &len);
		if (!rc) {
			snprintf(path, sizeof path, "%s (tokenizer.ggml)", kv_gguf_path(g));
			rc = kv_tok_load_mem(json, len, path, out);
		}
		free(json);
		kv_gguf_close(g);
		return rc;
	}
	snprintf(path, sizeof path, "%s/tokenizer.json", model_path);
	return kv_tok_load(path, out);
}

void kv_tok_free(struct kv_tok *t)
{
	if (!t)
		return;
	for (int s = 0; s < PC_SHARDS; s++) {
		kv_free(t->cache[s].tab.slots);
		kv_free(t->cache[s].tab.arena);
		pthread_mutex_destroy(&t->cache[s].mu);
	}
	for (int i = 0; i < t->n_splits; i++)
		pcre2_code_free(t->splits[i].re);
	for (int32_t k = 0; k < t->n_added; k++)
		free(t->added[k].content);
	free(t->added);
	trie_free(&t->trie_raw);
	trie_free(&t->trie_norm);
	kv_free(t->merges);
	kv_map_destroy(t->vocab);
	kv_map_destroy(t->raw_vocab);
	free(t->piece_off);
	free(t->piece_len);
	free(t->pieces);
	free(t->dec_off);
	free(t->dec_len);
	free(t->dec);
	free(t->flags);
	free(t->what);
	free(t);
}

/* ------------------------------------------------------------------------ */
/* Piece cache                                                              */

static inline int tab_match(const struct pc_tab *tb, const struct pc_slot *sl, uint64_t h, const uint8_t *p, size_t n)
{
	if (sl->h != h || sl->klen != n)
		return 0;
	if (n <= 8)
		return !memcmp(sl->key, p, n);
	return !memcmp(sl->key, p, 8) && !memcmp(tb->arena + sl->off, p + 8, n - 8);
}

/* Arena layout of one entry at `at`: the key bytes after the 8th, then,
 * for more than one id, the ids at the next 4-byte boundary. Returns the
 * offset of the ids and sets *end to the first byte after the entry. */
static uint32_t tab_layout(uint32_t at, size_t tail, size_t nids, uint32_t *end)
{
	uint32_t ids_at = (uint32_t)((at + tail + 3) & ~(size_t)3);
	*end = nids > 1 ? ids_at + (uint32_t)(nids * sizeof(int32_t)) : at + (uint32_t)tail;
	return ids_at;
}

/* Ids of piece p[0..n) with hash h into ids[], their count, or -1. */
static int tab_get(const struct pc_tab *tb, uint64_t h, const uint8_t *p, size_t n, int32_t *ids)
{
	uint32_t i = (uint32_t)h & (tb->nslots - 1);
	for (;;) {
		const struct pc_slot *sl = &tb->slots[i];
		if (!sl->h)
			return -1;
		if (tab_match(tb, sl, h, p, n)) {
			uint32_t end;
			if (sl->nids == 1)
				ids[0] = sl->id0;
			else if (sl->nids > 1)
				memcpy(ids, tb->arena + tab_layout(sl->off, n > 8 ? n - 8 : 0, sl->nids, &end),
				       sl->nids * sizeof *ids);
			return sl->nids;
		}
		i = (i + 1) & (tb->nslots - 1);
	}
}

/* Insert (a table at 3/4 load or with a full arena is emptied first). */
static void tab_put(struct pc_tab *tb, uint64_t h, const uint8_t *p, size_t n, const int32_t *ids, size_t nids)
{
	size_t tail = n > 8 ? n - 8 : 0;
	uint32_t end, ids_at;
	if (tail + 3 + nids * sizeof *ids > tb->arena_cap)
		return;
	ids_at = tab_layout(tb->used, tail, nids, &end);
	if (tb->count >= tb->nslots / 4 * 3 || end > tb->arena_cap) {
		memset(tb->slots, 0, tb->nslots * sizeof *tb->slots);
		tb->count = 0;
		tb->used = 0;
		ids_at = tab_layout(0, tail, nids, &end);
	}
	uint32_t i = (uint32_t)h & (tb->nslots - 1);
	for (;;) {
		const struct pc_slot *sl = &tb->slots[i];
		if (!sl->h)
			break;
		if (tab_match(tb, sl, h, p, n))
			return; /* already there (another thread put it first) */
		i = (i + 1) & (tb->nslots - 1);
	}
	struct pc_slot *sl = &tb->slots[i];
	*sl = (struct pc_slot){.h = h, .off = tb->used, .klen = (uint16_t)n, .nids = (uint16_t)nids,
			       .id0 = nids ? ids[0] : -1};
	memcpy(sl->key, p, n < 8 ? n : 8);
	if (tail)
		memcpy(tb->arena + tb->used, p + 8, tail);
	if (nids > 1)
		memcpy(tb->arena + ids_at, ids, nids * sizeof *ids);
	tb->used = end;
	tb->count++;
}

static int pc_get(const struct kv_tok *tc, uint64_t h, const uint8_t *p, size_t n, int32_t *ids)
{
	struct pc_shard *s = (struct pc_shard *)&tc->cache[h >> 60];
	int found = -1;
	pthread_mutex_lock(&s->mu);
	if (s->tab.slots)
		found = tab_get(&s->tab, h, p, n, ids);
	if (found >= 0)
		s->hits++;
	else
		s->misses++;
	pthread_mutex_unlock(&s->mu);
	return found;
}

static void pc_put(const struct kv_tok *tc, uint64_t h, const uint8_t *p, size_t n, const int32_t *ids, size_t nids)
{
	struct pc_shard *s = (struct pc_shard *)&tc->cache[h >> 60];
	pthread_mutex_lock(&s->mu);
	if (!s->tab.slots) {
		s->tab.slots = kv_zalloc(KV_MEM_OTHER, PC_SLOTS * sizeof *s->tab.slots);
		s->tab.arena = kv_alloc(KV_MEM_OTHER, PC_ARENA);
		if (!s->tab.slots || !s->tab.arena) {
			kv_free(s->tab.slots);
			kv_free(s->tab.arena);
			s->tab.slots = NULL;
			s->tab.arena = NULL;
			pthread_mutex_unlock(&s->mu);
			return;
		}
		s->tab.nslots = PC_SLOTS;
		s->tab.arena_cap = PC_ARENA;
	}
	tab_put(&s->tab, h, p, n, ids, nids);
	pthread_mutex_unlock(&s->mu);
}

void kv_tok_cache_clear(const struct kv_tok *tc)
{
	for (int k = 0; k < PC_SHARDS; k++) {
		struct pc_shard *s = (struct pc_shard *)&tc->cache[k];
		pthread_mutex_lock(&s->mu);
		if (s->tab.slots)
			memset(s->tab.slots, 0, PC_SLOTS * sizeof *s->tab.slots);
		s->tab.count = 0;
		s->tab.used = 0;
		pthread_mutex_unlock(&s->mu);
	}
}

void kv_tok_cache_stats(const struct kv_tok *tc, uint64_t *hits, uint64_t *misses)
{
	uint64_t h = 0, m = 0;
	for (int k = 0; k < PC_SHARDS; k++) {
		struct pc_shard *s = (struct pc_shard *)&tc->cache[k];
		pthread_mutex_lock(&s->mu);
		h += s->hits;
		m += s->misses;
		pthread_mutex_unlock(&s->mu);
	}
	if (hits)
		*hits = h;
	if (misses)
		*misses = m;
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                 */

struct enc {
	const struct kv_tok *t;
	int allow_special;
	int use_cache;
	int32_t *ids;          /* malloc'd output */
	size_t n, cap;
	/* scratch sized to the longest piece seen, reused across pieces */
	int32_t *sym;          /* symbol ids */
	int32_t *nxt, *prv;    /* linked list (heap path) */
	uint32_t *prank;       /* rank of the pair starting at each symbol (heap path) */
	uint64_t *heap;        /* rank << 32 | position */
	size_t scap;
	pcre2_match_data *md[KV_TOK_MAX_SPLITS];
	struct kv_buf nfc;     /* normalised gap */
	struct kv_buf shadow;  /* gap with stand-ins for the regex (pretok_gap) */
	struct pc_tab local;   /* per-call piece cache (no lock), LC_* */
	size_t n_pieces;       /* pieces seen so far */
};

/* Room for k more ids. */
static int reserve(struct enc *e, size_t k)
{
	if (e->n + k <= e->cap)
		return KV_OK;
	size_t nc = e->cap ? e->cap * 2 : 256;
	while (nc < e->n + k)
		nc *= 2;
	int32_t *ni = realloc(e->ids, nc * sizeof *ni);
	if (!ni)
		return kv_fail(KV_ERR_NOMEM, "encode: out of memory for %zu ids", nc);
	e->ids = ni;
	e->cap = nc;
	return KV_OK;
}

static inline int emit(struct enc *e, int32_t id)
{
	if (e->n == e->cap) {
		int rc = reserve(e, 1);
		if (rc)
			return rc;
	}
	e->ids[e->n++] = id;
	return KV_OK;
}

static int scratch(struct enc *e, size_t n)
{
	if (n <= e->scap)
		return KV_OK;
	size_t c = e->scap ? e->scap : 256;
	while (c < n)
		c *= 2;
	int32_t *s = realloc(e->sym, c * sizeof *s), *nx, *pv;
	uint32_t *pr;
	uint64_t *hp;
	if (s)
		e->sym = s;
	nx = realloc(e->nxt, c * sizeof *nx);
	if (nx)
		e->nxt = nx;
	pv = realloc(e->prv, c * sizeof *pv);
	if (pv)
		e->prv = pv;
	pr = realloc(e->prank, c * sizeof *pr);
	if (pr)
		e->prank = pr;
	/* live heap entries <= n - 1 initial + 1 net per merge < 2n */
	hp = realloc(e->heap, 2 * c * sizeof *hp);
	if (hp)
		e->heap = hp;
	if (!s || !nx || !pv || !pr || !hp)
		return kv_fail(KV_ERR_NOMEM, "encode: out of memory for a %zu-byte piece", n);
	e->scap = c;
	return KV_OK;
}

/* BPE of symbols sym[0..m) in place for short pieces: linear scan for the
 * lowest rank. Returns the new count. */
static size_t bpe_small(const struct kv_tok *t, int32_t *sym, size_t m)
{
	uint32_t rank[BPE_SMALL];
	int32_t nid[BPE_SMALL];
	if (m < 2)
		return m;
	for (size_t i = 0; i + 1 < m; i++)
		if (!merge_get(t, sym[i], sym[i + 1], &rank[i], &nid[i]))
			rank[i] = UINT32_MAX;
	for (;;) {
		uint32_t best = UINT32_MAX;
		size_t bi = 0;
		for (size_t i = 0; i + 1 < m; i++)
			if (rank[i] < best) {
				best = rank[i];
				bi = i;
			}
		if (best == UINT32_MAX)
			break;
		sym[bi] = nid[bi];
		/* drop symbol bi+1 and pair (bi, bi+1) */
		for (size_t i = bi + 1; i + 1 < m; i++) {
			sym[i] = sym[i + 1];
			rank[i] = rank[i + 1];
			nid[i] = nid[i + 1];
		}
		m--;
		if (bi > 0 && !merge_get(t, sym[bi - 1], sym[bi], &rank[bi - 1], &nid[bi - 1]))
			rank[bi - 1] = UINT32_MAX;
		if (bi + 1 < m && !merge_get(t, sym[bi], sym[bi + 1], &rank[bi], &nid[bi]))
			rank[bi] = UINT32_MAX;
	}
	return m;
}

/* A 4-ary min-heap of uint64 (fewer levels than a binary one, and the
 * four children share a cache line). */
static inline void heap_up(uint64_t *h, size_t i, uint64_t v)
{
	while (i > 0) {
		size_t p = (i - 1) / 4;
		if (h[p] <= v)
			break;
		h[i] = h[p];
		i = p;
	}
	h[i] = v;
}

static inline void heap_down(uint64_t *h, size_t n, size_t i, uint64_t v)
{
	for (;;) {
		size_t c = 4 * i + 1, end = c + 4 < n ? c + 4 : n, best = c;
		if (c >= n)
			break;
		uint64_t bv = h[c];
		for (size_t k = c + 1; k < end; k++)
			if (h[k] < bv) {
				bv = h[k];
				best = k;
			}
		if (v <= bv)
			break;
		h[i] = bv;
		i = best;
	}
	h[i] = v;
}

/*
 * BPE of e->sym[0..m) for long pieces: a min-heap of (rank << 32 | left
 * position) over a linked list of symbols, which is HF's Word::merge_all.
 * prank[i] is the rank of the pair that starts at symbol i now (UINT32_MAX:
 * none); a popped entry whose rank differs is stale (its pair was changed
 * by a neighbouring merge) and is dropped. Equal ranks mean the same merge,
 * so a matching entry is always right. The root slot of a valid entry is
 * reused for the first pair its merge creates. Writes the result compacted
 * to sym[0..) and returns its count.
 */
static size_t bpe_large(const struct kv_tok *t, struct enc *e, size_t m)
{
	int32_t *sym = e->sym, *nx = e->nxt, *pv = e->prv;
	uint32_t *prank = e->prank;
	uint64_t *h = e->heap;
	size_t hn = 0, k = 0;
	uint32_t r;
	int32_t id;
	for (size_t i = 0; i < m; i++) {
		nx[i] = i + 1 < m ? (int32_t)(i + 1) : -1;
		pv[i] = (int32_t)i - 1;
		prank[i] = UINT32_MAX;
		if (i + 1 < m && merge_get(t, sym[i], sym[i + 1], &r, &id)) {
			prank[i] = r;
			h[hn++] = (uint64_t)r << 32 | i;
		}
	}
	for (size_t i = hn / 4 + 1; i-- > 0;)
		if (i < hn)
			heap_down(h, hn, i, h[i]);
	while (hn) {
		uint64_t top = h[0], add[2];
		int32_t i = (int32_t)(uint32_t)top, j = nx[i];
		int na = 0;
		if (prank[i] != (uint32_t)(top >> 32) || j < 0 || !merge_get(t, sym[i], sym[j], &r, &id)) {
			hn--;
			if (hn)
				heap_down(h, hn, 0, h[hn]);
			continue; /* stale */
		}
		sym[i] = id;
		sym[j] = -1;
		nx[i] = nx[j];
		if (nx[j] >= 0)
			pv[nx[j]] = i;
		prank[j] = UINT32_MAX;
		prank[i] = UINT32_MAX;
		if (pv[i] >= 0) {
			int32_t q = pv[i];
			prank[q] = UINT32_MAX;
			if (merge_get(t, sym[q], sym[i], &r, &id)) {
				prank[q] = r;
				add[na++] = (uint64_t)r << 32 | (uint32_t)q;
			}
		}
		if (nx[i] >= 0 && merge_get(t, sym[i], sym[nx[i]], &r, &id)) {
			prank[i] = r;
			add[na++] = (uint64_t)r << 32 | (uint32_t)i;
		}
		if (na) { /* the first new entry takes the root's place */
			heap_down(h, hn, 0, add[0]);
			if (na == 2)
				heap_up(h, hn++, add[1]);
		} else {
			hn--;
			if (hn)
				heap_down(h, hn, 0, h[hn]);
		}
	}
	for (int32_t i = 0; i >= 0 && (size_t)i < m; i = nx[i])
		sym[k++] = sym[i];
	return k;
}

/* One pre-tokenized piece -> ids. */
static int encode_piece(struct enc *e, const uint8_t *p, size_t n)
{
	const struct kv_tok *t = e->t;
	uint64_t h = 0;
	size_t m = 0;
	int rc;
	if (n == 1) {
		int32_t id = t->byte_id[p[0]] >= 0 ? t->byte_id[p[0]] : t->unk_id;
		return id >= 0 ? emit(e, id) : KV_OK;
	}
	if (t->ignore_merges) {
		uint64_t id;
		if (kv_map_get(t->raw_vocab, p, n, &id))
			return emit(e, (int32_t)id);
	}
	if (e->use_cache && n <= PC_MAX_KEY) {
		int32_t ids[PC_MAX_IDS];
		int k = -1;
		h = kv_xxh3_64(p, n, 0x746f6b);
		h |= 1; /* 0 marks an empty slot */
		if (e->local.slots)
			k = tab_get(&e->local, h, p, n, ids);
		else if (++e->n_pieces == LC_AFTER) {
			e->local.slots = calloc(LC_SLOTS, sizeof *e->local.slots);
			e->local.arena = malloc(LC_ARENA);
			if (!e->local.slots || !e->local.arena) { /* fine: just slower */
				free(e->local.slots);
				free(e->local.arena);
				e->local.slots = NULL;
				e->local.arena = NULL;
			}
			e->local.nslots = LC_SLOTS;
			e->local.arena_cap = LC_ARENA;
		}
		if (k < 0 && (k = pc_get(t, h, p, n, ids)) >= 0 && e->local.slots)
			tab_put(&e->local, h, p, n, ids, (size_t)k);
		if (k >= 0) {
			if ((rc = reserve(e, (size_t)k)))
				return rc;
			memcpy(e->ids + e->n, ids, (size_t)k * sizeof *ids);
			e->n += (size_t)k;
			return KV_OK;
		}
	}
	if ((rc = scratch(e, n)))
		return rc;
	for (size_t i = 0; i < n; i++) {
		int32_t id = t->byte_id[p[i]] >= 0 ? t->byte_id[p[i]] : t->unk_id;
		if (id >= 0)
			e->sym[m++] = id;
	}
	m = m <= BPE_SMALL ? bpe_small(t, e->sym, m) : bpe_large(t, e, m);
	if (h && m <= PC_MAX_IDS) {
		pc_put(t, h, p, n, e->sym, m);
		if (e->local.slots)
			tab_put(&e->local, h, p, n, e->sym, m);
	}
	for (size_t i = 0; i < m; i++)
		if ((rc = emit(e, e->sym[i])))
			return rc;
	return KV_OK;
}

/*
 * Split stage k over p[0..n) (its whole subject), Isolated behaviour:
 * matches and the gaps between them both become pieces. Empty matches are
 * handled the way the onig crate's find_iter does (an empty match right
 * after the previous match is skipped by one char). The regex runs over
 * subj, the pieces are taken from orig at the same offsets (subj is orig
 * with the stand-ins of tokenizer_ucd.h, or orig itself).
 */
static int pretok(struct enc *e, int k, const uint8_t *subj, const uint8_t *orig, size_t n)
{
	const uint8_t *p = subj;
	const struct kv_tok *t = e->t;
	size_t last_end = 0, prev = 0, last_match_end = 0;
	int have_last = 0, rc;

	if (n == 0)
		return KV_OK;
	if (k == t->n_splits)
		return encode_piece(e, orig, n);
	const struct split *sp = &t->splits[k];
	pcre2_match_data *md = e->md[k];
	while (last_end <= n) {
		int r = sp->jit ? pcre2_jit_match(sp->re, p, n, last_end, 0, md, NULL)
				: PCRE2_ERROR_JIT_STACKLIMIT;
		if (r == PCRE2_ERROR_JIT_STACKLIMIT)
			r = pcre2_match(sp->re, p, n, last_end, PCRE2_NO_UTF_CHECK, md, NULL);
		if (r == PCRE2_ERROR_NOMATCH)
			break;
		if (r < 0) {
			PCRE2_UCHAR msg[128];
			pcre2_get_error_message(r, msg, sizeof msg);
			return kv_fail(KV_ERR_INVALID, "encode: the pre-tokenizer regex failed near byte %zu: %s", last_end,
				       (const char *)msg);
		}
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
		size_t s = ov[0], en = ov[1];
		if (s == en && have_last && last_match_end == en) {
			if (last_end >= n)
				break;
			int l;
			kv_utf8_get(p + last_end, &l);
			last_end += (size_t)l;
			continue;
		}
		last_end = en;
		last_match_end = en;
		have_last = 1;
		if (prev < s && (rc = pretok(e, k + 1, p + prev, orig + prev, s - prev)))
			return rc;
		if (s < en && (rc = pretok(e, k + 1, p + s, orig + s, en - s)))
			return rc;
		prev = en;
	}
	if (prev < n && (rc = pretok(e, k + 1, p + prev, orig + prev, n - prev)))
		return rc;
	return KV_OK;
}

/* The stand-in of a code point of KV_TOK_UCD_FIX (binary search). */
static uint32_t ucd_standin(int32_t c)
{
	size_t lo = 0, hi = sizeof KV_TOK_UCD_FIX / sizeof KV_TOK_UCD_FIX[0];
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if ((uint32_t)c > KV_TOK_UCD_FIX[mid].hi)
			lo = mid + 1;
		else if ((uint32_t)c < KV_TOK_UCD_FIX[mid].lo)
			hi = mid;
		else
			return KV_TOK_UCD_FIX[mid].standin;
	}
	return (uint32_t)c;
}

/*
 * A gap, as the pre-tokenizer sees it. When it holds a code point that
 * PCRE2's Unicode tables class differently from the oracle's, the regex
 * runs over a copy where such code points are replaced by stand-ins of
 * the same UTF-8 length (so every offset still points into the text).
 */
static int pretok_gap(struct enc *e, const uint8_t *p, size_t n)
{
	size_t i = 0, first = n;
	while (i < n) {
		if (p[i] < 0x80) {
			i++;
			continue;
		}
		int l;
		int32_t c = kv_utf8_get(p + i, &l);
		if (bit(g_fix, c)) {
			first = i;
			break;
		}
		i += (size_t)l;
	}
	if (first == n)
		return pretok(e, 0, p, p, n);
	kv_buf_reset(&e->shadow);
	kv_buf_add(&e->shadow, p, n);
	if (e->shadow.oom)
		return kv_fail(KV_ERR_NOMEM, "encode: out of memory");
	uint8_t *q = (uint8_t *)e->shadow.p;
	for (i = first; i < n;) {
		int l;
		int32_t c = kv_utf8_get(p + i, &l);
		if (c >= 0x80 && bit(g_fix, c))
			kv_utf8_encode(ucd_standin(c), q + i); /* same length: the table says so */
		i += (size_t)l;
	}
	return pretok(e, 0, q, p, n);
}

/* Start of the whitespace run that ends at p[end] (for lstrip). */
static size_t white_start(const uint8_t *p, size_t end)
{
	size_t i = end;
	while (i > 0) {
		size_t j = i - 1;
		while (j > 0 && (p[j] & 0xC0) == 0x80)
			j--;
		int l;
		if (!is_white(kv_utf8_get(p + j, &l)))
			break;
		i = j;
	}
	return i;
}

/* Length of the whitespace run at p[0..n) (for rstrip). */
static size_t white_len(const uint8_t *p, size_t n)
{
	size_t i = 0;
	while (i < n) {
		int l;
		if (!is_white(kv_utf8_get(p + i, &l)))
			break;
		i += (size_t)l;
	}
	return i;
}

/*
 * Split p[0..n) at the added tokens of trie `tr`; gaps go to `gap`
 * (with normalisation pending or done, see callers), tokens are emitted.
 */
static int split_added(struct enc *e, const struct trie *tr, const uint8_t *p, size_t n,
		       int (*gap)(struct enc *, const uint8_t *, size_t))
{
	size_t pos = 0, start_off = 0, ms, me;
	int32_t k;
	int rc;
	while (pos < n && (k = trie_find(tr, p, n, pos, &ms, &me)) >= 0) {
		const struct added *a = &e->t->added[k];
		size_t start = ms, stop = me;
		pos = me;
		if (a->special && !e->allow_special)
			continue;
		if (a->lstrip) {
			start = white_start(p, ms);
			if (start < start_off)
				start = start_off;
		}
		if (a->rstrip)
			stop += white_len(p + me, n - me);
		if (start_off < start && (rc = gap(e, p + start_off, start - start_off)))
			return rc;
		if ((rc = emit(e, a->id)))
			return rc;
		start_off = stop;
		pos = stop;
	}
	if (start_off < n)
		return gap(e, p + start_off, n - start_off);
	return KV_OK;
}

static int gap_normalized(struct enc *e, const uint8_t *p, size_t n)
{
	return pretok_gap(e, p, n);
}

static int gap_raw(struct enc *e, const uint8_t *p, size_t n)
{
	const struct kv_tok *t = e->t;
	if (t->nfc && nfc_needed(p, n)) {
		/* gaps are processed one at a time and nothing below normalises
		 * again, so one buffer serves them all */
		int rc = nfc_run(p, n, &e->nfc);
		if (rc)
			return rc;
		p = (const uint8_t *)e->nfc.p;
		n = e->nfc.len;
	}
	if (t->has_norm_added)
		return split_added(e, &t->trie_norm, p, n, gap_normalized);
	return pretok_gap(e, p, n);
}

int kv_tok_encode_opt(const struct kv_tok *t, const char *text, size_t len, int allow_special, int use_cache,
		      int32_t **ids, size_t *n)
{
	struct enc e = {.t = t, .allow_special = allow_special, .use_cache = use_cache, .nfc = KV_BUF_INIT,
			.shadow = KV_BUF_INIT};
	const uint8_t *p = (const uint8_t *)text;
	size_t bad;
	int rc = KV_OK;

	*ids = NULL;
	*n = 0;
	if (len && !text)
		return kv_fail(KV_ERR_INVALID, "encode: NULL text");
	bad = kv_utf8_valid_prefix(p, len);
	if (bad != len)
		return kv_fail(KV_ERR_INVALID, "encode: invalid UTF-8 at byte offset %zu (byte 0x%02X)", bad, p[bad]);
	for (int k = 0; k < t->n_splits; k++) {
		e.md[k] = pcre2_match_data_create_from_pattern(t->splits[k].re, NULL);
		if (!e.md[k]) {
			rc = kv_fail(KV_ERR_NOMEM, "encode: out of memory");
			goto done;
		}
	}
	/* ~1 id per 3-4 bytes of text: start near the final size */
	e.cap = len / 3 + 16;
	e.ids = malloc(e.cap * sizeof *e.ids);
	if (!e.ids) {
		rc = kv_fail(KV_ERR_NOMEM, "encode: out of memory");
		goto done;
	}
	rc = split_added(&e, &t->trie_raw, p, len, gap_raw);
done:
	for (int k = 0; k < t->n_splits; k++)
		pcre2_match_data_free(e.md[k]);
	free(e.sym);
	free(e.nxt);
	free(e.prv);
	free(e.prank);
	free(e.heap);
	free(e.local.slots);
	free(e.local.arena);
	kv_buf_free(&e.nfc);
	kv_buf_free(&e.shadow);
	if (rc) {
		free(e.ids);
		return rc;
	}
	*ids = e.ids;
	*n = e.n;
	return KV_OK;
}

int kv_tok_encode(const struct kv_tok *t, const char *text, size_t len, int allow_special, int32_t **ids, size_t *n)
{
	return kv_tok_encode_opt(t, text, len, allow_special, 1, ids, n);
}

/* ------------------------------------------------------------------------ */
/* Decoding and lookups                                                     */

static int check_id(const struct kv_tok *t, int32_t id)
{
	if (id < 0 || id >= t->n_ids || !t->flags[id])
		return kv_fail(KV_ERR_INVALID, "decode: unknown token id %d (vocabulary has ids 0..%d)", id,
			       t->n_ids - 1);
	return KV_OK;
}

int kv_tok_decode(const struct kv_tok *t, const int32_t *ids, size_t n, int skip_special, char **text, size_t *len)
{
	struct kv_buf raw = KV_BUF_INIT, out = KV_BUF_INIT;
	int rc;
	*text = NULL;
	if (len)
		*len = 0;
	kv_buf_reserve(&raw, n * 4 + 1);
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];
		if ((rc = check_id(t, id))) {
			kv_buf_free(&raw);
			return kv_fail_ctx(rc, "ids[%zu]", i);
		}
		if (skip_special && (t->flags[id] & TF_SPECIAL))
			continue;
		kv_buf_add(&raw, t->dec + t->dec_off[id], t->dec_len[id]);
	}
	kv_buf_add(&raw, "", 0); /* NUL-terminates even when nothing was added */
	if (raw.oom) {
		kv_buf_free(&raw);
		return kv_fail(KV_ERR_NOMEM, "decode: out of memory");
	}
	if (kv_utf8_valid_prefix((const uint8_t *)raw.p, raw.len) == raw.len) {
		if (len)
			*len = raw.len;
		*text = kv_buf_take(&raw);
		return KV_OK;
	}
	kv_buf_reserve(&out, raw.len + 16);
	kv_utf8_lossy_append(&out, (const uint8_t *)raw.p, raw.len, 1);
	kv_buf_free(&raw);
	if (out.oom) {
		kv_buf_free(&out);
		return kv_fail(KV_ERR_NOMEM, "decode: out of memory");
	}
	if (len)
		*len = out.len;
	*text = kv_buf_take(&out);
	return KV_OK;
}

int kv_tok_vocab_size(const struct kv_tok *t)
{
	return t->n_ids;
}

int32_t kv_tok_id(const struct kv_tok *t, const char *token)
{
	uint64_t id;
	size_t n = strlen(token);
	if (n && kv_map_get(t->vocab, token, n, &id))
		return (int32_t)id;
	for (int32_t k = 0; k < t->n_added; k++)
		if (t->added[k].len == n && !memcmp(t->added[k].content, token, n))
			return t->added[k].id;
	return -1;
}

const char *kv_tok_piece(const struct kv_tok *t, int32_t id)
{
	if (id < 0 || id >= t->n_ids || !t->flags[id])
		return NULL;
	return t->pieces + t->piece_off[id];
}

int kv_tok_is_special(const struct kv_tok *t, int32_t id)
{
	return id >= 0 && id < t->n_ids && (t->flags[id] & TF_SPECIAL) != 0;
}

/* ------------------------------------------------------------------------ */
/* Streaming decoder                                                        */

void kv_tok_stream_init(struct kv_tok_stream *s, const struct kv_tok *t, int skip_special)
{
	memset(s, 0, sizeof *s);
	s->t = t;
	s->skip_special = skip_special;
}

/*
 * Held-back bytes (a valid, incomplete prefix of one character) are
 * completed from the front of the new bytes; what cannot complete them
 * turns them into one U+FFFD, as the batch decoder does for the same
 * joined bytes. The rest goes through lossy_append, whose incomplete tail
 * is held back again. So the concatenated output of a stream equals
 * kv_tok_decode of all its ids.
 */
int kv_tok_stream_feed(struct kv_tok_stream *s, int32_t id, struct kv_buf *out)
{
	const struct kv_tok *t = s->t;
	const uint8_t *p;
	size_t n, i = 0, held;
	int rc;
	if ((rc = check_id(t, id)))
		return rc;
	if (s->skip_special && (t->flags[id] & TF_SPECIAL))
		return KV_OK;
	p = t->dec + t->dec_off[id];
	n = t->dec_len[id];
	while (s->n_pending > 0 && i < n) {
		uint8_t tmp[8];
		int k;
		memcpy(tmp, s->pending, (size_t)s->n_pending);
		tmp[s->n_pending] = p[i];
		k = kv_utf8_seq(tmp, (size_t)s->n_pending + 1);
		if (k == 0) { /* still incomplete */
			s->pending[s->n_pending++] = p[i++];
			continue;
		}
		if (k > 0) { /* completed */
			kv_buf_add(out, tmp, (size_t)k);
			i++;
		} else /* p[i] does not continue it: the held bytes are one maximal subpart */
			kv_buf_add(out, KV_UTF8_FFFD, 3);
		s->n_pending = 0;
	}
	held = kv_utf8_lossy_append(out, p + i, n - i, 0);
	if (held) {
		memcpy(s->pending, p + n - held, held);
		s->n_pending = (int)held;
	}
	return out->oom ? kv_fail(KV_ERR_NOMEM, "decode: out of memory") : KV_OK;
}

int kv_tok_stream_finish(struct kv_tok_stream *s, struct kv_buf *out)
{
	if (s->n_pending)
		kv_buf_add(out, KV_UTF8_FFFD, 3);
	s->n_pending = 0;
	return out->oom ? kv_fail(KV_ERR_NOMEM, "decode: out of memory") : KV_OK;
}
