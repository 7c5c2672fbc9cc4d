/*
 * gvocab.c - the vocabulary trie (gvocab.h).
 *
 * The ids are sorted by their bytes; walking them in that order, each
 * token adds one node per byte after the prefix it shares with the
 * previous token, which is exactly the pre-order of the trie. end[] is
 * filled afterwards with a stack of open nodes.
 */
#include "text/gvocab.h"
#include "base/err.h"
#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

static int by_bytes(const void *a, const void *b, void *ctx)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	const struct kv_tok_bytes *t = ctx;
	uint32_t lx = t->len[x], ly = t->len[y];
	int c = memcmp(t->data + t->off[x], t->data + t->off[y], lx < ly ? lx : ly);
	if (c)
		return c;
	if (lx != ly)
		return lx < ly ? -1 : 1;
	return x < y ? -1 : x > y;
}

void kv_gvocab_free(struct kv_gvocab *v)
{
	if (!v)
		return;
	kv_free(v->byte);
	kv_free(v->depth);
	kv_free(v->end);
	kv_free(v->tok);
	kv_free(v->sub);
	free(v->same_next);
	kv_tok_bytes_free(v->bytes);
	free(v);
}

int kv_gvocab_from_bytes(struct kv_tok_bytes *b, struct kv_gvocab **out)
{
	struct kv_gvocab *v = calloc(1, sizeof *v);
	int32_t *ids = NULL, *open = NULL;
	*out = NULL;
	if (!v) {
		kv_tok_bytes_free(b);
		return kv_fail(KV_ERR_NOMEM, "vocabulary trie: out of memory");
	}
	v->bytes = b;
	v->n_ids = b->n;
	ids = malloc(((size_t)b->n + 1) * sizeof *ids);
	v->same_next = malloc(((size_t)b->n + 1) * sizeof *v->same_next);
	if (!ids || !v->same_next)
		goto nomem;
	int m = 0;
	size_t total = 0;
	for (int i = 0; i < b->n; i++) {
		v->same_next[i] = -1;
		if (b->len[i] && b->len[i] <= 65535 && !b->special[i]) {
			ids[m++] = i;
			total += b->len[i];
		}
	}
	qsort_r(ids, (size_t)m, sizeof *ids, by_bytes, b);
	/* the trie is counted (KV_MEM_OTHER): ~4 MB for a Qwen3 vocabulary */
	v->byte = kv_alloc(KV_MEM_OTHER, total + 1);
	v->depth = kv_alloc(KV_MEM_OTHER, (total + 1) * sizeof *v->depth);
	v->end = kv_alloc(KV_MEM_OTHER, (total + 1) * sizeof *v->end);
	v->tok = kv_alloc(KV_MEM_OTHER, (total + 1) * sizeof *v->tok);
	open = malloc(65537 * sizeof *open);
	if (!v->byte || !v->depth || !v->end || !v->tok || !open)
		goto nomem;
	int n = 0, prev = -1;
	for (int k = 0; k < m; k++) {
		int id = ids[k];
		const uint8_t *p = (const uint8_t *)b->data + b->off[id];
		uint32_t len = b->len[id], l = 0;
		if (prev >= 0) {
			const uint8_t *q = (const uint8_t *)b->data + b->off[prev];
			uint32_t lq = b->len[prev];
			while (l < len && l < lq && p[l] == q[l])
				l++;
			if (l == len && l == lq) { /* same bytes: chain it */
				int32_t first = prev;
				while (v->same_next[first] >= 0)
					first = v->same_next[first];
				v->same_next[first] = id;
				continue;
			}
		}
		for (uint32_t j = l; j < len; j++) {
			v->byte[n] = p[j];
			v->depth[n] = (uint16_t)(j + 1);
			v->tok[n] = -1;
			n++;
		}
		v->tok[n - 1] = id;
		if ((int)len > v->max_depth)
			v->max_depth = (int)len;
		v->n_tokens++;
		prev = id;
	}
	/* same_next chains start at the id in the trie; make the trie id the
	 * head: tok[] holds it already */
	v->n_nodes = n;
	int sp = 0;
	for (int i = 0; i < n; i++) {
		while (sp && v->depth[open[sp - 1]] >= v->depth[i])
			v->end[open[--sp]] = i;
		open[sp++] = i;
	}
	while (sp)
		v->end[open[--sp]] = n;
	/* subtree byte sets, children before parents: pre-order reversed */
	v->sub = kv_zalloc(KV_MEM_OTHER, ((size_t)n + 1) * sizeof *v->sub);
	if (!v->sub)
		goto nomem;
	for (int i = n - 1; i >= 0; i--) {
		v->sub[i][v->byte[i] >> 6] |= 1ull << (v->byte[i] & 63);
		/* fold the children in: they start at i + 1 and follow each other
		 * by end[] */
		for (int c = i + 1; c < v->end[i]; c = v->end[c])
			for (int w = 0; w < 4; w++)
				v->sub[i][w] |= v->sub[c][w];
	}
	v->mem = sizeof *v + (size_t)n * (1 + 2 + 4 + 4 + 32) + (size_t)b->n * 4 + b->data_len + (size_t)b->n * 9;
	free(ids);
	free(open);
	*out = v;
	return KV_OK;
nomem:
	free(ids);
	free(open);
	kv_gvocab_free(v);
	return kv_fail(KV_ERR_NOMEM, "vocabulary trie: out of memory");
}

int kv_gvocab_create(const struct kv_tok *t, int n_ids, struct kv_gvocab **out)
{
	struct kv_tok_bytes *b;
	int nt = kv_tok_vocab_size(t);
	int rc = kv_tok_bytes_build(t, n_ids > nt ? n_ids : nt, &b);
	if (rc)
		return rc;
	return kv_gvocab_from_bytes(b, out);
}

int32_t kv_gvocab_longest(const struct kv_gvocab *v, const void *p, size_t n, size_t *len)
{
	const uint8_t *s = p;
	int32_t best = -1;
	size_t d = 0;
	int i = 0;
	*len = 0;
	/* descend: at depth d the children of the current node are the nodes
	 * i.. with depth d+1 up to the parent's end */
	int lim = v->n_nodes;
	while (d < n && i < lim) {
		/* find the child with byte s[d] among siblings at depth d+1 */
		int found = -1;
		while (i < lim) {
			if (v->depth[i] != d + 1)
				break;
			if (v->byte[i] == s[d]) {
				found = i;
				break;
			}
			i = v->end[i];
		}
		if (found < 0)
			break;
		d++;
		if (v->tok[found] >= 0) {
			best = v->tok[found];
			*len = d;
		}
		lim = v->end[found];
		i = found + 1;
	}
	return best;
}
