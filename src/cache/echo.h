/*
 * echo.h - the server's own answers, remembered exactly.
 *
 * When a client sends the server's answer back in its history (every agent
 * does), the chat template renders it again from the message fields: the
 * text may differ from what was generated (reasoning dropped, tool-call
 * arguments re-serialized, whitespace normalised) and even equal text may
 * tokenize differently than the model sampled it. Either way the prompt
 * departs from the cached sequence at that message and the answer is
 * prefilled a second time. An echo store remembers, per answer, the exact
 * text and tokens the model produced (from the generation prompt on), so
 * the next request can use them in place of the re-rendered message
 * (text/template.h kv_chat_splice) and hit the cache through it.
 *
 * A record is found by its key: the canonical form of what the client sends
 * back (session/echo.h builds it: content, tool-call ids, names and
 * arguments as parsed JSON). The key bytes are kept and compared in full,
 * never trusted from a hash. The reasoning is kept beside it: a message
 * that carries reasoning matches only the record with the same reasoning;
 * one without any (the client dropped it) matches the most recently used
 * record of its key. Records that differ only in their reasoning (an
 * answer that is reasoning alone, say) are kept side by side.
 *
 * One store per cache namespace (it lives in its kc_cache), so salts and
 * models never share records. Bounded in bytes: the least recently used
 * record leaves first. Thread-safe (one mutex).
 *
 * Records written since the last kc_echo_take_dirty are handed to the disk
 * tier (store/echo.c), which saves them and loads them back after a
 * restart (kc_echo_put with dirty = 0).
 */
#ifndef KV_CACHE_ECHO_H
#define KV_CACHE_ECHO_H

#include <stddef.h>
#include <stdint.h>

#include "base/hash.h"

struct kc_echo;

/* One record, as given to put or copied out by get/take. */
struct kc_echo_rec {
	const char *key;          /* canonical key bytes */
	size_t key_len;
	const char *reasoning;    /* the reasoning as returned ("" if none) */
	size_t reasoning_len;
	const char *text;         /* generation prompt + generated text */
	size_t text_len;
	const int32_t *tokens;    /* their tokens, exactly */
	uint32_t n_tokens;
};

/* budget: bytes for records (0: the store keeps nothing). */
int kc_echo_create(uint64_t budget, struct kc_echo **out);
void kc_echo_destroy(struct kc_echo *e);

/* Store a record (copied); a record with the same key and reasoning is
 * replaced. dirty:
 * the disk tier should save it. A record larger than the whole budget is
 * not stored. */
int kc_echo_put(struct kc_echo *e, const struct kc_echo_rec *r, int dirty);

/*
 * The record for key whose reasoning agrees (reasoning NULL or empty:
 * any), copied into *out as one malloc'd block (free(*out_block)); 0 found,
 * KV_ERR_NOT_FOUND, KV_ERR_NOMEM.
 */
int kc_echo_get(struct kc_echo *e, const char *key, size_t key_len, const char *reasoning, size_t reasoning_len,
		struct kc_echo_rec *out, void **out_block);

/* Up to max records written since the last call (copies, one malloc'd
 * block each in blocks[i]: free()); returns how many. */
size_t kc_echo_take_dirty(struct kc_echo *e, struct kc_echo_rec *out, void **blocks, size_t max);

/* The record's name on disk: a hash of its key. */
struct kv_h128 kc_echo_id(const char *key, size_t key_len);

struct kc_echo_stats {
	uint64_t records, bytes, budget;
	uint64_t puts, hits, misses, evictions;
};
void kc_echo_stats(struct kc_echo *e, struct kc_echo_stats *out);
/* Drop every record (POST /v1/cache/clear). */
void kc_echo_clear(struct kc_echo *e);

#endif
