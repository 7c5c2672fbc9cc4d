/*
 * hashidx.c - the hash block index (--prefix-cache-index hash).
 *
 * A flat map from chain hash to node: a prompt's block i is looked up by
 * its chain hash h_i, computed from h_{i-1} as the walk goes, and the
 * candidate is accepted only if it hangs under the node found for block
 * i-1 and its tokens are equal (a hash match is never trusted alone).
 * Partial blocks have no hash, so the longest common prefix with the
 * children of the last node is a linear check of those children.
 *
 * Two different prefixes with the same 128-bit hash (never observed;
 * would need a collision of XXH3-128) are handled without a wrong hit: the
 * second node is simply not in the map (hx_indexed = 0), so this index
 * misses where the radix index would hit.
 */
#include "cache/index.h"
#include "base/err.h"
#include "base/map.h"

#include <stdlib.h>
#include <string.h>

struct hashidx {
	uint32_t B;
	struct kv_map *map;        /* 16-byte chain hash -> struct kc_node * */
};

static void *hx_create(uint32_t B)
{
	struct hashidx *h = calloc(1, sizeof *h);
	if (!h)
		return NULL;
	h->B = B;
	h->map = kv_map_create(1024);
	if (!h->map) {
		free(h);
		return NULL;
	}
	return h;
}

static void hx_destroy(void *ix)
{
	struct hashidx *h = ix;
	if (!h)
		return;
	kv_map_destroy(h->map);
	free(h);
}

static int hx_add(void *ix, struct kc_node *n)
{
	struct hashidx *h = ix;
	uint64_t v;
	if (kv_map_get(h->map, &n->hash, sizeof n->hash, &v))
		return KV_OK; /* a collision: keep the first, see the header */
	if (kv_map_put(h->map, &n->hash, sizeof n->hash, (uint64_t)(uintptr_t)n) != KV_OK)
		return kv_fail(KV_ERR_NOMEM, "hash index: cannot grow the map");
	n->hx_indexed = 1;
	return KV_OK;
}

static void hx_del(void *ix, struct kc_node *n)
{
	struct hashidx *h = ix;
	if (n->hx_indexed)
		kv_map_del(h->map, &n->hash, sizeof n->hash);
	n->hx_indexed = 0;
}

static struct kc_node *hx_child(void *ix, struct kc_node *parent, const int32_t *blk, struct kv_h128 hash)
{
	struct hashidx *h = ix;
	uint64_t v;
	struct kc_node *k;
	if (!kv_map_get(h->map, &hash, sizeof hash, &v))
		return NULL;
	k = (struct kc_node *)(uintptr_t)v;
	if (k->parent != parent || kc_tok_cmp(k->tokens, blk, h->B))
		return NULL;
	return k;
}

static struct kc_node *hx_walk(void *ix, struct kc_node *root, const int32_t *tok, uint32_t max_blocks)
{
	struct hashidx *h = ix;
	struct kc_node *x = root;
	for (uint32_t d = 0; d < max_blocks; d++) {
		const int32_t *blk = tok + (size_t)d * h->B;
		struct kc_node *k = hx_child(ix, x, blk, kc_chain_hash(x->hash, blk, h->B));
		if (!k)
			break;
		x = k;
	}
	return x;
}

static struct kc_node *hx_best_kid(void *ix, struct kc_node *n, const int32_t *q, uint32_t qn, uint32_t *lcp)
{
	struct kc_node *best = NULL;
	uint32_t bl = 0;
	(void)ix;
	*lcp = 0;
	if (!qn)
		return NULL;
	for (struct kc_node *k = n->kid; k; k = k->sib) {
		uint32_t l;
		if (k->tokens[0] != q[0])
			continue;
		l = kc_tok_lcp(k->tokens, q, qn);
		if (l > bl) {
			bl = l;
			best = k;
		}
	}
	*lcp = bl;
	return best;
}

const struct kc_index_ops kc_hashidx_ops = {
	.name = "hash",
	.create = hx_create,
	.destroy = hx_destroy,
	.add = hx_add,
	.del = hx_del,
	.child = hx_child,
	.walk = hx_walk,
	.best_kid = hx_best_kid,
};
