/*
 * test_cache_util.h - fakes for the prefix-cache tests and fuzzer: a tiny
 * layout, and "engine" pages and snapshots whose bytes are a function of
 * the token prefix, so a restore can be checked byte for byte against what
 * a cold run would have produced without any model.
 *
 *   row at position i, segment s   = bytes of mix(H(tok[0..i]), s)
 *   snapshot at position p         = bytes of mix(H(tok[0..p)), 0x5a...)
 * where H is a rolling 64-bit hash over the prefix.
 */
#ifndef KV_TESTS_CACHE_UTIL_H
#define KV_TESTS_CACHE_UTIL_H

#include "base/pages.h"
#include "base/mem.h"
#include "cache/cache.h"
#include "engine/layout.h"
#include "model/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TC_ROW 8   /* bytes per row (head_dim 2, f32) */
#define TC_SEGS 2  /* 1 attention layer x K,V x 1 head */

static inline void tc_layout(struct ke_layout *L, int B, int hybrid, size_t snap_bytes)
{
	memset(L, 0, sizeof *L);
	L->page_tokens = B;
	L->kv_dtype = KV_DT_F32;
	L->n_attn_layers = 1;
	L->n_kv_heads = 1;
	L->head_dim = 2;
	L->n_segments = TC_SEGS;
	L->row_bytes = TC_ROW;
	L->page_bytes = (size_t)TC_SEGS * (size_t)B * TC_ROW;
	L->kv_bytes_per_token = TC_SEGS * TC_ROW;
	if (hybrid) {
		L->n_rec_layers = 1;
		L->rec[0].layer = 0;
		L->rec[0].state_bytes = snap_bytes;
		L->snapshot_bytes = snap_bytes;
	}
}

static inline uint64_t tc_mix(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

/* H(tok[0..i]) for every i < n into h (h[i] covers tokens 0..i). */
static inline void tc_prefix_hashes(const int32_t *tok, uint32_t n, uint64_t *h)
{
	uint64_t x = 0x1234567;
	for (uint32_t i = 0; i < n; i++) {
		x = tc_mix(x ^ (uint64_t)(uint32_t)tok[i] ^ ((uint64_t)i << 40));
		h[i] = x;
	}
}

static inline void tc_fill(void *dst, size_t n, uint64_t seed)
{
	uint8_t *d = dst;
	for (size_t i = 0; i < n; i++) {
		if (i % 8 == 0)
			seed = tc_mix(seed + i);
		d[i] = (uint8_t)(seed >> (8 * (i % 8)));
	}
}

/* Write the rows of positions [from, to) of a sequence into its pages. */
static inline void tc_rows(const struct ke_layout *L, struct kv_page **pg, const uint64_t *h, uint32_t from,
			   uint32_t to)
{
	uint32_t B = (uint32_t)L->page_tokens;
	for (uint32_t i = from; i < to; i++)
		for (int s = 0; s < L->n_segments; s++)
			tc_fill((char *)pg[i / B]->data + ((size_t)s * B + i % B) * L->row_bytes, L->row_bytes,
				h[i] * 31 + (uint64_t)s);
}

/* Pages for tok[0..n): ceil(n/B) new pages (caller unrefs each). */
static inline int tc_pages(struct kv_pages *pool, const struct ke_layout *L, const int32_t *tok, uint32_t n,
			   struct kv_page **pg)
{
	uint32_t B = (uint32_t)L->page_tokens, np = (n + B - 1) / B;
	uint64_t *h = malloc(((size_t)n + 1) * sizeof *h);
	if (!h)
		return -1;
	tc_prefix_hashes(tok, n, h);
	for (uint32_t i = 0; i < np; i++) {
		pg[i] = kv_page_alloc(pool);
		if (!pg[i]) {
			free(h);
			return -1;
		}
		memset(pg[i]->data, 0xee, L->page_bytes);
	}
	tc_rows(L, pg, h, 0, n);
	free(h);
	return (int)np;
}

/* The snapshot a cold run would have at p. */
static inline void tc_snap_bytes(const struct ke_layout *L, const int32_t *tok, uint32_t p, void *dst)
{
	uint64_t x = 0x1234567;
	for (uint32_t i = 0; i < p; i++)
		x = tc_mix(x ^ (uint64_t)(uint32_t)tok[i] ^ ((uint64_t)i << 40));
	tc_fill(dst, L->snapshot_bytes, x ^ 0x5a5a5a5a5a5a5a5aull);
}

static inline void *tc_snap(struct kc_cache *c, const int32_t *tok, uint32_t p)
{
	void *s = kc_cache_snap_alloc(c);
	if (s)
		tc_snap_bytes(kc_cache_layout(c), tok, p, s);
	return s;
}

/*
 * Check a hit against the prompt: every row of the shared pages and the
 * tail, and the snapshot, equal what a cold run over tok would hold.
 * Returns 0 if all equal, else the first bad position + 1.
 */
static inline uint32_t tc_verify_hit(struct kc_cache *c, const struct kc_hit *hit, const int32_t *tok)
{
	const struct ke_layout *L = kc_cache_layout(c);
	uint32_t B = (uint32_t)L->page_tokens, p = hit->pos;
	uint64_t *h;
	struct kv_page **pg;
	uint8_t want[64], *tail;
	uint32_t bad = 0;

	if (!p)
		return 0;
	h = malloc((size_t)p * sizeof *h);
	pg = malloc(((size_t)hit->n_pages + 1) * sizeof *pg);
	tail = malloc(L->page_bytes);
	if (!h || !pg || !tail) {
		free(h);
		free(pg);
		free(tail);
		return p;
	}
	tc_prefix_hashes(tok, p, h);
	kc_hit_pages(hit, pg);
	memset(tail, 0, L->page_bytes);
	kc_hit_copy_tail(c, hit, tail);
	for (uint32_t i = 0; i < p && !bad; i++)
		for (int s = 0; s < L->n_segments && !bad; s++) {
			const uint8_t *got = i / B < hit->n_pages
						     ? (const uint8_t *)pg[i / B]->data + ((size_t)s * B + i % B) * L->row_bytes
						     : tail + ((size_t)s * B + i % B) * L->row_bytes;
			tc_fill(want, L->row_bytes, h[i] * 31 + (uint64_t)s);
			if (memcmp(got, want, L->row_bytes))
				bad = i + 1;
		}
	if (!bad && L->snapshot_bytes) {
		uint8_t *ws = malloc(L->snapshot_bytes);
		if (!ws || !hit->snap)
			bad = p;
		else {
			tc_snap_bytes(L, tok, p, ws);
			if (memcmp(ws, hit->snap, L->snapshot_bytes))
				bad = p;
		}
		free(ws);
	}
	free(h);
	free(pg);
	free(tail);
	return bad;
}

#endif
