/*
 * names.h - how the prefix cache names what it stores, for the layers
 * that keep the same objects elsewhere (store/: file names on disk) and
 * the tools that read them (cli/). The rest of the cache's objects stay
 * internal (index.h); this is the part of their format that is public.
 *
 *   block i of a sequence   h_i = XXH3_128(h_{i-1} as 16 bytes (lo, hi,
 *                           little endian) || its B tokens as int32 LE),
 *                           h_{-1} = the namespace
 *   resume point at p       kc_rp_id(h_{floor(p/B)-1}, the p mod B tail
 *                           tokens): XXH3_128(node hash || tail tokens);
 *                           the input lengths differ from a block's, so
 *                           names never coincide
 */
#ifndef KV_CACHE_NAMES_H
#define KV_CACHE_NAMES_H

#include <stdint.h>

#include "base/hash.h"

/* Kinds of cache objects (cache.h kc_view.kind). */
enum kc_obj_kind { KC_OBJ_BLOCK = 1, KC_OBJ_RP = 2, KC_OBJ_ENTRY = 3 };

/* Token blocks compare as byte strings (int32 little endian): a total
 * order in which the first differing token decides. */
int kc_tok_cmp(const int32_t *a, const int32_t *b, uint32_t n);
/* Length of the common prefix of a and b (both at least n long). */
uint32_t kc_tok_lcp(const int32_t *a, const int32_t *b, uint32_t n);
/* h_i from h_{i-1} and B tokens. */
struct kv_h128 kc_chain_hash(struct kv_h128 prev, const int32_t *blk, uint32_t B);
/* The name of a resume point. */
struct kv_h128 kc_rp_id(struct kv_h128 node_hash, const int32_t *tail, uint32_t t);

#endif
