/*
 * tokenizer.h - byte-level BPE tokenizer loaded from tokenizer.json.
 *
 * Pipeline of encode (docs/models.md):
 *   1. split out added tokens (longest match first; with allow_special = 0
 *      only the non-special added tokens are split out, special literals
 *      are encoded as ordinary text);
 *   2. NFC normalisation when the normalizer asks for it (libutf8proc);
 *   3. the Split pre-tokenizer regex, run verbatim by PCRE2 (UTF + UCP, JIT;
 *      code points PCRE2 classes differently from Hugging Face's regex
 *      engine are seen through stand-ins, see tokenizer.c);
 *   4. GPT-2 byte-level mapping, BPE merges by rank, vocabulary lookup.
 * The ids are those of Hugging Face's encode(text, add_special_tokens=
 * False); docs/tokenizer.md lists what tokenizer.json may contain.
 * Decode reverses the byte-level mapping; added tokens decode to their
 * literal content. A per-piece cache makes repeated words cheap.
 *
 * Thread-safety: a loaded tokenizer is read-only and may be used from
 * several threads at once (the piece cache is a lock-free table per call
 * in front of a shared table of 16 mutex-guarded shards).
 */
#ifndef KV_TEXT_TOKENIZER_H
#define KV_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

struct kv_tok;

/* Load <path> (a tokenizer.json file). Errors name the file and the field. */
int kv_tok_load(const char *tokenizer_json_path, struct kv_tok **out);
/* The tokenizer of a model path: <dir>/tokenizer.json, or for a GGUF model
 * (a .gguf file or a folder holding one) the tokenizer.ggml.* arrays of the
 * file (model/gguf_model.h turns them into the same tokenizer.json form,
 * so one BPE implementation serves both). */
int kv_tok_load_model(const char *model_path, struct kv_tok **out);
/* Load from bytes (tests, fuzzing). `what` names the source in messages. */
int kv_tok_load_mem(const char *json, size_t len, const char *what, struct kv_tok **out);
void kv_tok_free(struct kv_tok *t);

/* Number of ids (max id + 1 over vocab and added tokens). */
int kv_tok_vocab_size(const struct kv_tok *t);

/*
 * Encode UTF-8 text. Invalid UTF-8 is KV_ERR_INVALID (with the byte
 * offset in the message). *ids is malloc'd (free()), *n its length.
 */
int kv_tok_encode(const struct kv_tok *t, const char *text, size_t len, int allow_special, int32_t **ids,
		  size_t *n);

/*
 * kv_tok_encode with the piece cache bypassed when use_cache is 0 (tests
 * compare both paths, benchmarks time the uncached path). The ids never
 * depend on the cache.
 */
int kv_tok_encode_opt(const struct kv_tok *t, const char *text, size_t len, int allow_special, int use_cache,
		      int32_t **ids, size_t *n);
/* Empty the piece cache (safe while other threads encode). */
void kv_tok_cache_clear(const struct kv_tok *t);
/* Lookups in the shared piece cache that hit / missed since load (either
 * may be NULL). Repeats within one encode call are served by a per-call
 * table first and are not counted. */
void kv_tok_cache_stats(const struct kv_tok *t, uint64_t *hits, uint64_t *misses);

/*
 * Decode ids to UTF-8 (malloc'd, NUL-terminated). Unknown ids are
 * KV_ERR_INVALID. With skip_special, special added tokens are dropped.
 * Byte sequences that are not valid UTF-8 on their own come out as
 * U+FFFD, the way Hugging Face decodes them.
 */
int kv_tok_decode(const struct kv_tok *t, const int32_t *ids, size_t n, int skip_special, char **text,
		  size_t *len);

/* Id of an exact token string (vocab or added token), or -1. */
int32_t kv_tok_id(const struct kv_tok *t, const char *token);
/* Token string of an id as stored in the vocab (byte-level form), or NULL.
 * Owned by t, valid until kv_tok_free. */
const char *kv_tok_piece(const struct kv_tok *t, int32_t id);
/* 1 if id is a special added token. */
int kv_tok_is_special(const struct kv_tok *t, int32_t id);

/*
 * Streaming decoder: feed ids one at a time, get the text that is complete
 * so far. Never emits a broken UTF-8 sequence: bytes of an incomplete
 * character are held back until the next id completes them (or flushed as
 * U+FFFD by kv_tok_stream_finish).
 */
struct kv_tok_stream {
	const struct kv_tok *t;
	int skip_special;
	uint8_t pending[8];      /* held-back bytes of an incomplete character */
	int n_pending;
};
void kv_tok_stream_init(struct kv_tok_stream *s, const struct kv_tok *t, int skip_special);
/* Appends the newly complete text to out; returns KV_OK or a kv_err
 * (unknown id). */
int kv_tok_stream_feed(struct kv_tok_stream *s, int32_t id, struct kv_buf *out);
/* Flushes held-back bytes (as U+FFFD) at the end of a stream. */
int kv_tok_stream_finish(struct kv_tok_stream *s, struct kv_buf *out);

#endif
