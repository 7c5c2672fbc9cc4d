/*
 * radix.c - the radix block index (--prefix-cache-index radix, default).
 *
 * A tree walk that never hashes the prompt: every node keeps its children
 * sorted by their B tokens (byte order of int32 LE, see kc_tok_cmp), so
 * the child spelling the next block is found by binary search, and the
 * child sharing the longest prefix with a partial block is one of the two
 * neighbours of the query's insertion point (in a sorted set of strings
 * the longest common prefix with a probe is reached next to where the
 * probe would go).
 */
#include "cache/index.h"
#include "base/err.h"

#include <stdlib.h>
#include <string.h>

struct radix {
	uint32_t B;
};

static void *rx_create(uint32_t B)
{
	struct radix *r = calloc(1, sizeof *r);
	if (r)
		r->B = B;
	return r;
}

static void rx_destroy(void *ix)
{
	free(ix);
}

/* Compare a child's block with a query of qn <= B tokens: a query that is
 * a proper prefix sorts first. */
static int cmp_query(const struct kc_node *k, const int32_t *q, uint32_t qn, uint32_t B)
{
	int c = kc_tok_cmp(k->tokens, q, qn);
	if (c)
		return c;
	return qn < B ? 1 : 0;
}

/* First index whose child is >= the query. */
static uint32_t lower_bound(const struct kc_node *p, const int32_t *q, uint32_t qn, uint32_t B)
{
	uint32_t lo = 0, hi = p->rx_n;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (cmp_query(p->rx_kids[mid], q, qn, B) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int rx_add(void *ix, struct kc_node *n)
{
	struct radix *r = ix;
	struct kc_node *p = n->parent;
	uint32_t at;

	if (p->rx_n == p->rx_cap) {
		uint32_t cap = p->rx_cap ? p->rx_cap * 2 : 4;
		struct kc_node **v = realloc(p->rx_kids, cap * sizeof *v);
		if (!v)
			return kv_fail(KV_ERR_NOMEM, "radix index: cannot grow a child array to %u", cap);
		p->rx_kids = v;
		p->rx_cap = cap;
	}
	at = lower_bound(p, n->tokens, r->B, r->B);
	memmove(&p->rx_kids[at + 1], &p->rx_kids[at], (p->rx_n - at) * sizeof p->rx_kids[0]);
	p->rx_kids[at] = n;
	p->rx_n++;
	return KV_OK;
}

static void rx_del(void *ix, struct kc_node *n)
{
	struct radix *r = ix;
	struct kc_node *p = n->parent;
	uint32_t at = lower_bound(p, n->tokens, r->B, r->B);

	/* Blocks are unique under a parent, so the bound lands on n itself. */
	if (at < p->rx_n && p->rx_kids[at] == n) {
		memmove(&p->rx_kids[at], &p->rx_kids[at + 1], (p->rx_n - at - 1) * sizeof p->rx_kids[0]);
		p->rx_n--;
	}
	if (!p->rx_n) {
		free(p->rx_kids);
		p->rx_kids = NULL;
		p->rx_cap = 0;
	}
	free(n->rx_kids);
	n->rx_kids = NULL;
	n->rx_n = n->rx_cap = 0;
}

static struct kc_node *rx_child(void *ix, struct kc_node *parent, const int32_t *blk, struct kv_h128 h)
{
	struct radix *r = ix;
	uint32_t at = lower_bound(parent, blk, r->B, r->B);
	(void)h;
	if (at < parent->rx_n && !kc_tok_cmp(parent->rx_kids[at]->tokens, blk, r->B))
		return parent->rx_kids[at];
	return NULL;
}

static struct kc_node *rx_walk(void *ix, struct kc_node *root, const int32_t *tok, uint32_t max_blocks)
{
	struct radix *r = ix;
	struct kc_node *x = root;
	for (uint32_t d = 0; d < max_blocks; d++) {
		struct kc_node *k = rx_child(ix, x, tok + (size_t)d * r->B, x->hash);
		if (!k)
			break;
		x = k;
	}
	return x;
}

static struct kc_node *rx_best_kid(void *ix, struct kc_node *n, const int32_t *q, uint32_t qn, uint32_t *lcp)
{
	struct radix *r = ix;
	struct kc_node *best = NULL;
	uint32_t at, bl = 0;

	*lcp = 0;
	if (!n->rx_n || !qn)
		return NULL;
	at = lower_bound(n, q, qn, r->B);
	if (at < n->rx_n) {
		uint32_t l = kc_tok_lcp(n->rx_kids[at]->tokens, q, qn);
		if (l > bl) {
			bl = l;
			best = n->rx_kids[at];
		}
	}
	if (at > 0) {
		uint32_t l = kc_tok_lcp(n->rx_kids[at - 1]->tokens, q, qn);
		if (l > bl) {
			bl = l;
			best = n->rx_kids[at - 1];
		}
	}
	*lcp = bl;
	return best;
}

const struct kc_index_ops kc_radix_ops = {
	.name = "radix",
	.create = rx_create,
	.destroy = rx_destroy,
	.add = rx_add,
	.del = rx_del,
	.child = rx_child,
	.walk = rx_walk,
	.best_kid = rx_best_kid,
};
