/*
 * index.c - token comparison and chain hashing shared by both indexes and
 * the cache core (see index.h).
 */
#include "cache/index.h"

#include <string.h>

int kc_tok_cmp(const int32_t *a, const int32_t *b, uint32_t n)
{
	return memcmp(a, b, (size_t)n * sizeof(int32_t));
}

uint32_t kc_tok_lcp(const int32_t *a, const int32_t *b, uint32_t n)
{
	uint32_t i = 0;
	/* Compare 8 tokens at a time while they agree, then finish one by one. */
	while (i + 8 <= n && !memcmp(a + i, b + i, 8 * sizeof(int32_t)))
		i += 8;
	while (i < n && a[i] == b[i])
		i++;
	return i;
}

/* Fixed byte order so names are the same on every machine. */
static void h128_bytes(struct kv_h128 v, uint8_t h[16])
{
	for (int i = 0; i < 8; i++) {
		h[i] = (uint8_t)(v.lo >> (8 * i));
		h[8 + i] = (uint8_t)(v.hi >> (8 * i));
	}
}

struct kv_h128 kc_chain_hash(struct kv_h128 prev, const int32_t *blk, uint32_t B)
{
	uint8_t h[16];
	h128_bytes(prev, h);
	return kv_xxh3_128_cat(h, sizeof h, blk, (size_t)B * sizeof(int32_t));
}

struct kv_h128 kc_rp_id(struct kv_h128 node_hash, const int32_t *tail, uint32_t t)
{
	uint8_t h[16];
	h128_bytes(node_hash, h);
	return kv_xxh3_128_cat(h, sizeof h, tail, (size_t)t * sizeof(int32_t));
}
