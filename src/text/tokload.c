/*
 * tokload.c - a Hugging Face tokenizer.json (or the one a GGUF file's
 * tokenizer.ggml.* metadata gives) read into struct kv_tok
 * (tokenizer_int.h), which tokenizer.c encodes and decodes with.
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
 * SentencePiece-style BPE (Gemma's tokenizer.json): "normalizer" Replace
 * {"String": " "} -> "\u2581" (or a Metaspace pre-tokenizer with
 * prepend_scheme "never"), "pre_tokenizer" null, that Metaspace, or
 * Split {"String": " "} MergedWithPrevious (a no-op once spaces are gone),
 * "model" with byte_fallback (every byte as a <0xXX> token) and fuse_unk,
 * "decoder" a Sequence of Replace "\u2581" -> " ", ByteFallback and Fuse
 * (or Metaspace). BPE then starts from characters instead of bytes.
 *
 * Loading: model.vocab and model.merges (nearly all of an 11 MB file) are
 * streamed by a small strict JSON reader into flat arrays; every other
 * value goes through jansson (tokjson.c).
 *
 * Every field is checked before use: malformed files are KV_ERR_INVALID
 * naming the field, features kvkeep does not implement KV_ERR_UNSUPPORTED
 * naming the feature.
 */
#include "text/tokenizer.h"
#include "text/tokenizer_int.h"
#include "text/tokjson.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "base/err.h"
#include "base/io.h"
#include "base/json.h"
#include "base/log.h"
#include "base/map.h"
#include "base/mem.h"
#include "base/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GPT-2's byte-level split pattern (ByteLevel with use_regex true). */
static const char GPT2_PATTERN[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

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
/* Tries of added tokens (tokenizer.c matches with them)                    */

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

/* ------------------------------------------------------------------------ */
/* Merge table                                                              */

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

/* "▁" (U+2581), SentencePiece's space. */
static const char SP_SPACE[] = "\xe2\x96\x81";

/* A Replace (normalizer or decoder) of exactly `from` by `to`. */
static int is_replace(const json_t *o, const char *from, const char *to)
{
	const char *ty = type_of(o);
	json_t *pat = json_object_get(o, "pattern"), *s = json_object_get(pat, "String"), *c = json_object_get(o, "content");
	return ty && !strcmp(ty, "Replace") && json_is_string(s) && !strcmp(json_string_value(s), from) &&
	       json_is_string(c) && !strcmp(json_string_value(c), to);
}

/* A Metaspace (pre-tokenizer or decoder) with SentencePiece's space and
 * no prefix; *split its "split" flag. Other variants are refused. */
static int metaspace(const json_t *o, int *split, const char *what)
{
	json_t *r = json_object_get(o, "replacement"), *ps = json_object_get(o, "prepend_scheme");
	int rc;
	if (!json_is_string(r) || strcmp(json_string_value(r), SP_SPACE))
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: Metaspace replacement other than U+2581 is not supported", what);
	if (ps && !(json_is_string(ps) && !strcmp(json_string_value(ps), "never")))
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: Metaspace prepend_scheme other than \"never\" is not supported",
			       what);
	if (json_object_get(o, "add_prefix_space") && json_is_true(json_object_get(o, "add_prefix_space")))
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: Metaspace add_prefix_space true is not supported", what);
	if ((rc = opt_bool(o, "split", 1, split, what, "Metaspace")))
		return rc;
	return KV_OK;
}

/* The decoder: ByteLevel (byte-level BPE) or SentencePiece's (t->sp). */
static int load_decoder(struct kv_tok *t, const json_t *dec, const char *what)
{
	const char *ty = json_is_object(dec) ? type_of(dec) : NULL;
	int split;
	if (ty && !strcmp(ty, "ByteLevel"))
		return KV_OK;
	if (ty && !strcmp(ty, "Metaspace")) {
		t->sp = 1;
		return metaspace(dec, &split, what);
	}
	if (ty && !strcmp(ty, "Sequence")) {
		json_t *arr = json_object_get(dec, "decoders"), *v;
		size_t i;
		int rep = 0;
		json_array_foreach(arr, i, v) {
			const char *vt = type_of(v);
			if (is_replace(v, SP_SPACE, " "))
				rep = 1;
			else if (!vt || (strcmp(vt, "ByteFallback") && strcmp(vt, "Fuse")))
				return kv_fail(KV_ERR_UNSUPPORTED, "%s: decoder %s in a Sequence is not supported (Replace "
					       "U+2581 -> space, ByteFallback, Fuse)", what, vt ? vt : "(none)");
		}
		if (rep) {
			t->sp = 1;
			return KV_OK;
		}
	}
	return kv_fail(KV_ERR_UNSUPPORTED, "%s: decoder \"%s\" is not supported (ByteLevel, or SentencePiece's "
		       "Replace + ByteFallback + Fuse / Metaspace)", what, ty ? ty : "(none)");
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
	if (!strcmp(ty, "Metaspace") && t->sp) {
		t->sp_space = 1;
		return metaspace(pt, &t->sp_split, what);
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
		/* Gemma: split at " " after the normalizer turned every space
		 * into U+2581, so it never splits */
		s = json_object_get(pat, "String");
		if (t->sp_space && !strcmp(json_string_value(beh), "MergedWithPrevious") && json_is_string(s) &&
		    !strcmp(json_string_value(s), " "))
			return KV_OK;
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
	if (is_replace(n, " ", SP_SPACE) && t->sp) {
		t->sp_space = 1;
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

/* Decoded bytes of a SentencePiece token: <0xXX> is the byte XX (with
 * byte_fallback), U+2581 is a space, the rest as it is. */
static void decode_sp(const struct kv_tok *t, const char *s, size_t n, struct kv_buf *out)
{
	unsigned b;
	if (t->byte_fallback && n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && sscanf(s + 3, "%2X", &b) == 1) {
		kv_buf_addc(out, (char)b);
		return;
	}
	for (size_t i = 0; i < n;) {
		if (i + 3 <= n && !memcmp(s + i, SP_SPACE, 3)) {
			kv_buf_addc(out, ' ');
			i += 3;
		} else {
			kv_buf_addc(out, s[i++]);
		}
	}
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

/* model: its type, and the options kvkeep does not implement refused by
 * name; *fuse_unk is kept for the unk_token check. */
static int check_model(struct kv_tok *t, const struct tj *tj, const json_t *model, int *fuse_unk, const char *what)
{
	const char *ty;
	json_t *v;
	int rc, byte_fallback;

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
	    (rc = opt_bool(model, "fuse_unk", 0, fuse_unk, what, "model")) ||
	    (rc = opt_bool(model, "byte_fallback", 0, &byte_fallback, what, "model")) ||
	    (rc = opt_bool(model, "ignore_merges", 0, &t->ignore_merges, what, "model")))
		return rc;
	t->byte_fallback = byte_fallback;
	t->fuse_unk = *fuse_unk;
	if (byte_fallback && !t->sp)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: model.byte_fallback true needs a SentencePiece-style decoder "
			       "(Replace + ByteFallback, or Metaspace)", what);
	return KV_OK;
}


/* The per-id arrays, sized by the largest id of model.vocab and
 * added_tokens (ids index arrays, so they must be dense). */
static int size_ids(struct kv_tok *t, const struct tj *tj, const json_t *added, const char *what)
{
	size_t n_vocab = tj->n_vocab, i;
	int64_t max_id = -1;
	json_t *v;

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
	return KV_OK;
}

/* model.vocab: the token -> id map and the ids' flags; *total grows by
 * the bytes of the token strings (NUL included). */
static int load_vocab(struct kv_tok *t, const struct tj *tj, size_t *total, const char *what)
{
	for (size_t i = 0; i < tj->n_vocab; i++) {
		int32_t id = (int32_t)tj->vocab[i].id;
		const char *key = tj->arena.p + tj->vocab[i].s.off;
		size_t klen = tj->vocab[i].s.len;
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
		*total += klen + 1;
	}
	return KV_OK;
}

/* added_tokens: HF assigns the vocab id to a content that is a vocab
 * token and the next free id otherwise; a file that says anything else
 * would get other ids in HF, so it is refused. *total grows by the
 * strings of the tokens that are not vocab tokens. */
static int load_added(struct kv_tok *t, const json_t *added, size_t n_vocab, size_t *total, const char *what)
{
	uint64_t next_added_id = n_vocab;
	size_t i;
	json_t *v;
	int rc;

	if (!json_is_array(added) || !json_array_size(added))
		return KV_OK;
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
			*total += cl + 1;
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
	return KV_OK;
}

/* The token string and the decoded bytes of every id (total: the bytes
 * of all strings, NULs included). */
static int build_pieces(struct kv_tok *t, const struct tj *tj, size_t total, const char *what)
{
	struct kv_buf dec = KV_BUF_INIT;
	size_t off = 0;

	t->pieces = malloc(total + 1);
	t->dec_off = calloc((size_t)t->n_ids, sizeof *t->dec_off);
	t->dec_len = calloc((size_t)t->n_ids, sizeof *t->dec_len);
	if (!t->pieces || !t->dec_off || !t->dec_len)
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
	for (size_t i = 0; i < tj->n_vocab; i++) {
		int32_t id = (int32_t)tj->vocab[i].id;
		size_t klen = tj->vocab[i].s.len;
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
	for (int32_t id = 0; id < t->n_ids; id++) {
		if (!t->flags[id])
			continue;
		t->dec_off[id] = (uint32_t)dec.len;
		if (t->sp)
			decode_sp(t, t->pieces + t->piece_off[id], t->piece_len[id], &dec);
		else
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
	return KV_OK;
}

/* The id of each byte's byte-level char, and model.unk_token for the
 * bytes without one. */
static int load_bytes(struct kv_tok *t, const json_t *model, int fuse_unk, const char *what)
{
	json_t *v;

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
		if (fuse_unk && !t->sp)
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: model.fuse_unk true is not supported", what);
	}
	for (int b = 0; b < 256; b++) {
		char nm[8];
		uint64_t id;
		snprintf(nm, sizeof nm, "<0x%02X>", b);
		t->fb_id[b] = t->byte_fallback && kv_map_get(t->vocab, nm, 6, &id) ? (int32_t)id : -1;
	}
	if (t->sp) /* SentencePiece starts from characters: the byte-level table is not used */
		return KV_OK;
	for (int b = 0; b < 256; b++)
		if (t->byte_id[b] < 0 && t->unk_id < 0) {
			KV_WARN("tok.missing_bytes", "what=%s first_missing_byte=%d note=\"such bytes are dropped, as "
						     "Hugging Face does\"",
				what, b);
			break;
		}
	return KV_OK;
}

/* model.merges into the merge table: rank = index; a, b and a + b must be
 * vocab tokens. */
static int load_merges(struct kv_tok *t, const struct tj *tj, const char *what)
{
	size_t nm = tj->n_merges, cap = 16;
	int shift = 64 - 4, rc;
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
	for (size_t i = 0; i < nm; i++) {
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
	return KV_OK;
}

/* ignore_merges needs "is this piece a whole token" by its bytes. */
static int load_raw_vocab(struct kv_tok *t, const struct tj *tj, const char *what)
{
	t->raw_vocab = kv_map_create(tj->n_vocab);
	if (!t->raw_vocab)
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
	for (size_t i = 0; i < tj->n_vocab; i++) {
		int32_t id = (int32_t)tj->vocab[i].id;
		if (kv_map_put(t->raw_vocab, t->dec + t->dec_off[id], t->dec_len[id], (uint64_t)id))
			return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
	}
	return KV_OK;
}

/* The model section and added_tokens, checked in the order of the steps
 * below (the first failure is the message). */
static int load_model(struct kv_tok *t, struct tj *tj, const char *what)
{
	const json_t *model = json_object_get(tj->root, "model");
	const json_t *added = json_object_get(tj->root, "added_tokens");
	size_t total = 0;
	int rc, fuse_unk = 0;

	if ((rc = check_model(t, tj, model, &fuse_unk, what)) || (rc = size_ids(t, tj, added, what)) ||
	    (rc = load_vocab(t, tj, &total, what)) || (rc = load_added(t, added, tj->n_vocab, &total, what)) ||
	    (rc = build_pieces(t, tj, total, what)) || (rc = load_bytes(t, model, fuse_unk, what)) ||
	    (rc = load_merges(t, tj, what)))
		return rc;
	return t->ignore_merges ? load_raw_vocab(t, tj, what) : KV_OK;
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
			if (t->nfc && kv_tok_nfc_needed(s, n)) {
				if (kv_tok_nfc_run(s, n, &nb)) {
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
	if (kv_tok_unicode_init())
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
	/* the decoder says which BPE this is (checked in full below, after the
	 * model, so a file's first problem is the one reported) */
	{
		const json_t *d = json_object_get(root, "decoder");
		const char *dt = json_is_object(d) ? type_of(d) : NULL;
		json_t *dv;
		size_t di;
		if (dt && !strcmp(dt, "Metaspace"))
			t->sp = 1;
		json_array_foreach(json_object_get(d, "decoders"), di, dv)
			if (is_replace(dv, SP_SPACE, " "))
				t->sp = 1;
	}
	if ((rc = load_model(t, &tj, what)))
		goto fail;
	if ((rc = load_normalizer(t, json_object_get(root, "normalizer"), what)))
		goto fail;
	{
		json_t *pt = json_object_get(root, "pre_tokenizer");
		if (pt && !json_is_null(pt) && (rc = load_pretok(t, pt, &seen_bl, what)))
			goto fail;
	}
	if (t->sp ? !t->sp_space || seen_bl || t->n_splits : !seen_bl) {
		rc = kv_fail(KV_ERR_UNSUPPORTED, t->sp ? "%s: a SentencePiece-style decoder needs the U+2581 normalizer "
			     "(Replace or Metaspace) and no byte-level or regex pre-tokenizer"
			     : "%s: pre_tokenizer has no ByteLevel (byte-level BPE, or SentencePiece-style BPE)", what);
		goto fail;
	}
	dec = json_object_get(root, "decoder");
	ty = NULL;
	if ((rc = load_decoder(t, dec, what)))
		goto fail;
	(void)ty;
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
