/*
 * gcache.h - compiled grammars kept across requests, by the text of their
 * constraint. An agent sends the same tools (and often the same response
 * schema) on every turn: the second request finds the grammar compiled
 * and its token-mask cache already filled for the states the first one
 * visited, so its masks cost a bitmap copy from the first token.
 *
 * The key is any byte string that identifies the constraint and its
 * options (say "tools\0xml\0required\0" + the tools JSON text); equal keys
 * must mean equal grammars. At most max_entries grammars are kept, least
 * recently used first out; each grammar's mask cache is bounded by
 * grammar_cache_bytes, so the whole cache holds at most their product plus
 * the automata. Thread-safe: one mutex; a grammar is compiled outside it
 * (two requests that miss at once both compile, the first insert wins).
 */
#ifndef KV_TEXT_GCACHE_H
#define KV_TEXT_GCACHE_H

#include <stddef.h>

#include "text/gmatch.h"
#include "text/gram.h"
#include "text/gvocab.h"

struct kv_gcache;

struct kv_gcache_params {
	int max_entries;             /* 0: 64 */
	size_t grammar_cache_bytes;  /* each grammar's mask cache; 0: 16 MiB */
};

/* v is borrowed and must outlive the cache. */
int kv_gcache_create(const struct kv_gvocab *v, const struct kv_gcache_params *p, struct kv_gcache **out);
void kv_gcache_free(struct kv_gcache *c);

/* Builds the grammar IR on a miss (the callback returns a kv_err and sets
 * *ir, which the cache frees). */
typedef int (*kv_gcache_build_fn)(void *ctx, struct kv_gram **ir);

/*
 * The grammar for key[0..klen): from the cache, or built, compiled and
 * inserted. *out is a new reference (kv_grammar_unref). *hit (may be NULL)
 * says whether it was found. Errors are the builder's or the compiler's;
 * a failed build is not cached.
 */
int kv_gcache_get(struct kv_gcache *c, const void *key, size_t klen, kv_gcache_build_fn build, void *ctx,
		  struct kv_grammar **out, int *hit);

#endif
