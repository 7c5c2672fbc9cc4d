/*
 * cache.c - the RAM prefix cache's facade (cache.h): create/destroy,
 * lookup, put, counters, the check, and the disk tier's views. Eviction
 * is in evict.c, the objects' making and collecting in tree.c, the state
 * they share in cache_int.h (objects drawn in index.h).
 *
 * Invariants (kc_cache_check verifies all of them):
 *   - node.refs = children + resume points + pins; a non-root node with
 *     refs 0 does not exist. node.hash = kc_chain_hash(parent.hash, tokens).
 *   - rp.refs = entries naming it (end or checkpoint); an rp with refs 0
 *     and pins 0 does not exist. rp.entry, when set, is the entry ending at
 *     it and entry.end points back.
 *   - node.through = entries whose end lies at or below the node;
 *     dedup = sum over nodes of max(0, through - 1) x page_bytes.
 *   - bytes = nodes x (page_bytes + 4B) + sum over rps of t (kv_bytes_per_
 *     token + 4) + snapshots x snapshot_bytes (kc_policy_node_bytes /
 *     kc_policy_rp_bytes, so the policy's entry estimate is exact).
 * Nothing here allocates per token: a put allocates per new block and per
 * new resume point; a lookup allocates nothing.
 */
#include "cache/cache_int.h"
#include "cache/echo.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

const char *kc_index_name(int kind)
{
	return kind == KC_INDEX_HASH ? "hash" : "radix";
}

int kc_index_parse(const char *s, int *kind)
{
	if (s && !strcmp(s, "radix")) {
		*kind = KC_INDEX_RADIX;
		return KV_OK;
	}
	if (s && !strcmp(s, "hash")) {
		*kind = KC_INDEX_HASH;
		return KV_OK;
	}
	return kv_fail(KV_ERR_INVALID, "--prefix-cache-index '%s': expected radix or hash", s ? s : "");
}

/* --- create / destroy ------------------------------------------------------ */

int kc_cache_create(const struct kc_params *p, struct kc_cache **out)
{
	struct kc_cache *c;
	const struct ke_layout *L = p->layout;

	*out = NULL;
	if (!L || L->page_tokens <= 0 || L->n_segments <= 0 || !L->row_bytes ||
	    L->page_bytes != (size_t)L->n_segments * (size_t)L->page_tokens * L->row_bytes ||
	    L->kv_bytes_per_token != (size_t)L->n_segments * L->row_bytes)
		return kv_fail(KV_ERR_INVALID, "prefix cache: inconsistent layout (page %zu bytes, %d segments of %d rows x %zu)",
			       L ? L->page_bytes : 0, L ? L->n_segments : 0, L ? L->page_tokens : 0,
			       L ? L->row_bytes : 0);
	if (L->n_rec_layers + L->n_win_layers > 0 && !L->snapshot_bytes)
		return kv_fail(KV_ERR_INVALID, "prefix cache: recurrent layers without snapshot bytes");
	if (p->index != KC_INDEX_RADIX && p->index != KC_INDEX_HASH)
		return kv_fail(KV_ERR_INVALID, "prefix cache: unknown index kind %d", p->index);
	c = calloc(1, sizeof *c);
	if (!c)
		return kv_fail(KV_ERR_NOMEM, "prefix cache: cannot allocate");
	pthread_mutex_init(&c->mu, NULL);
	c->L = *L;
	c->B = (uint32_t)L->page_tokens;
	c->hybrid = ke_layout_nontrim(L); /* recurrent or sliding-window state: entries are not trimmable */
	if (p->policy) {
		c->pol = *p->policy;
		c->pol.hybrid = c->hybrid;
	} else {
		kc_policy_default(&c->pol, c->hybrid);
		kc_policy_from_env(&c->pol);
	}
	c->ops = p->index == KC_INDEX_HASH ? &kc_hashidx_ops : &kc_radix_ops;
	c->ix = c->ops->create(c->B);
	if (!c->ix) {
		const char *name = c->ops->name;
		pthread_mutex_destroy(&c->mu);
		free(c);
		return kv_fail(KV_ERR_NOMEM, "prefix cache: cannot create the %s index", name);
	}
	c->root.hash = p->ns;
	c->root.obj.kind = KC_OBJ_BLOCK;
	c->disabled = p->disabled;
	c->budget = p->budget_bytes;
	c->max_entries = p->max_entries;
	c->max_hyb = p->max_hybrid_entries == 0 ? KC_HYBRID_ENTRIES_AUTO
		     : p->max_hybrid_entries < 0 ? 0 : p->max_hybrid_entries;
	c->mem_cap = p->mem_cap;
	c->mem_used = p->mem_used;
	c->mem_ctx = p->mem_ctx;
	c->tf = p->transient_factor > 0 ? p->transient_factor : KC_TRANSIENT_FACTOR_DEFAULT;
	if (c->tf < 0)
		c->tf = 0;
	c->on_evict = p->on_evict;
	c->evict_ctx = p->evict_ctx;
	/* with the cache disabled too: answers render as generated either way,
	 * so a prompt does not depend on whether the KV is cached */
	if (p->echo_bytes && kc_echo_create(p->echo_bytes, &c->echo)) {
		kc_cache_destroy(c);
		return KV_ERR_NOMEM;
	}
	*out = c;
	return KV_OK;
}

struct kc_echo *kc_cache_echo(const struct kc_cache *c)
{
	return c ? c->echo : NULL;
}

void kc_cache_destroy(struct kc_cache *c)
{
	uint64_t rel = 0;
	if (!c)
		return;
	c->on_evict = NULL;
	while (c->lru_tail)
		kc_tree_entry_free(c, c->lru_tail, &rel);
	/* Anything left is pinned by a hit or view that was not released: a
	 * caller bug; leak it rather than free memory someone still reads. */
	if (c->n_nodes || c->n_rps)
		KV_WARN("cache.destroy_pinned", "nodes=%llu rps=%llu", (unsigned long long)c->n_nodes,
			(unsigned long long)c->n_rps);
	c->ops->destroy(c->ix);
	kc_echo_destroy(c->echo);
	free(c->root.rx_kids);
	free(c->path);
	free(c->rpv);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

const struct ke_layout *kc_cache_layout(const struct kc_cache *c)
{
	return &c->L;
}

const struct kc_policy *kc_cache_policy(const struct kc_cache *c)
{
	return &c->pol;
}

int kc_cache_enabled(const struct kc_cache *c)
{
	return c && !c->disabled; /* set at create, never changed */
}

void *kc_cache_snap_alloc(struct kc_cache *c)
{
	if (!c->L.snapshot_bytes) {
		kv_fail(KV_ERR_INVALID, "prefix cache: this layout has no recurrent state");
		return NULL;
	}
	return kv_alloc(KV_MEM_CACHE, c->L.snapshot_bytes);
}

void kc_cache_snap_free(struct kc_cache *c, void *snap)
{
	(void)c;
	kv_free(snap);
}

/* --- lookup ---------------------------------------------------------------- */

static int rp_matches(const struct kc_cache *c, const struct kc_rp *r, const int32_t *tok, uint32_t n)
{
	uint32_t base = r->node->depth * c->B;
	if (r->pos > n)
		return 0;
	return !r->t || !kc_tok_cmp(r->tail_tok, tok + base, r->t);
}

static int grow_rpv(struct kc_cache *c, size_t need)
{
	if (need <= c->rpv_cap)
		return 0;
	size_t cap = c->rpv_cap ? c->rpv_cap : 64;
	while (cap < need)
		cap *= 2;
	struct kc_rp **v = realloc(c->rpv, cap * sizeof *v);
	if (!v)
		return -1;
	c->rpv = v;
	c->rpv_cap = cap;
	return 0;
}

static struct kc_node *ancestor(struct kc_node *x, uint32_t depth)
{
	while (x->depth > depth)
		x = x->parent;
	return x;
}

/* Length of some stored sequence reaching through x (for the snap log). */
static uint32_t reach_len(const struct kc_cache *c, const struct kc_node *x)
{
	uint32_t best;
	while (x->kid)
		x = x->kid;
	best = x->depth * c->B;
	for (const struct kc_rp *r = x->rps; r; r = r->next)
		if (r->pos > best)
			best = r->pos;
	return best;
}

static void lat_record(struct kc_cache *c, uint64_t ns)
{
	c->lat[c->lat_i] = ns;
	c->lat_i = (c->lat_i + 1) % LAT_RING;
	if (c->lat_n < LAT_RING)
		c->lat_n++;
}

/* Hybrid: the thinned snapshot positions below the resume point on this
 * prompt's path, pinned into the hit. */
static void collect_inherited(struct kc_cache *c, struct kc_hit *h, struct kc_rp *at, const int32_t *tok,
			      uint32_t n)
{
	size_t k = 0;
	uint32_t anchor = at->anchor ? at->pos : 0;
	struct kc_ckpts set;

	for (struct kc_node *x = at->node;; x = x->parent) {
		for (struct kc_rp *r = x->rps; r; r = r->next) {
			if (!r->snap || r->pos >= at->pos || !rp_matches(c, r, tok, n))
				continue;
			if (grow_rpv(c, k + 1))
				goto done; /* out of memory: inherit fewer, still correct */
			c->rpv[k++] = r;
		}
		if (x == &c->root)
			break;
	}
done:
	/* Sort ascending by position (positions are unique on one path). */
	for (size_t i = 1; i < k; i++) {
		struct kc_rp *r = c->rpv[i];
		size_t j = i;
		while (j && c->rpv[j - 1]->pos > r->pos) {
			c->rpv[j] = c->rpv[j - 1];
			j--;
		}
		c->rpv[j] = r;
	}
	for (size_t i = 0; i < k; i++)
		if (c->rpv[i]->anchor) {
			anchor = c->rpv[i]->pos; /* the lowest one: the session's first boundary */
			break;
		}
	memset(&set, 0, sizeof set);
	set.anchor = anchor;
	for (size_t i = 0; i < k; i++)
		kc_policy_ckpt_add(&c->pol, &set, c->rpv[i]->pos);
	h->anchor = anchor;
	h->n_inh = 0;
	for (uint32_t i = 0, j = 0; i < set.n; i++) {
		while (j < k && c->rpv[j]->pos != set.pos[i])
			j++;
		if (j == k)
			break;
		h->inh[h->n_inh] = set.pos[i];
		h->inh_rp_[h->n_inh] = c->rpv[j];
		c->rpv[j]->pins++;
		h->n_inh++;
	}
}

/* peek (the disk tier's "how far does RAM go"): no counters, no LRU
 * touch, no log line; the hit is pinned all the same. */
static int lookup(struct kc_cache *c, const int32_t *tok, uint32_t n, struct kc_hit *h, int peek);

uint64_t kc_cache_struct_bytes(const struct kc_stats *st)
{
	return st->nodes * sizeof(struct kc_node) + st->rps * sizeof(struct kc_rp) +
	       st->entries * (sizeof(struct kc_entry) + sizeof(void *));
}

int kc_cache_lookup(struct kc_cache *c, const int32_t *tok, uint32_t n, struct kc_hit *h)
{
	return lookup(c, tok, n, h, 0);
}

int kc_cache_peek(struct kc_cache *c, const int32_t *tok, uint32_t n, struct kc_hit *h)
{
	return lookup(c, tok, n, h, 1);
}

static int lookup(struct kc_cache *c, const int32_t *tok, uint32_t n, struct kc_hit *h, int peek)
{
	uint64_t t0 = kv_now_ns();
	uint32_t B = c->B, base, qn, lcp_kid = 0, lcp_rp = 0, shared, p = 0;
	struct kc_node *d, *kid = NULL;
	struct kc_rp *trp = NULL;

	memset(h, 0, sizeof *h);
	if (!tok && n)
		return kv_fail(KV_ERR_INVALID, "prefix cache lookup: NULL tokens");
	pthread_mutex_lock(&c->mu);
	if (c->disabled || !n) {
		if (!c->disabled && !peek) {
			c->st.lookups++;
			c->st.misses++;
		}
		pthread_mutex_unlock(&c->mu);
		return KV_OK;
	}
	/* Shared prefix: full blocks, then the best partial block among the
	 * children's first rows and the tails stored at the deepest node. */
	d = c->ops->walk(c->ix, &c->root, tok, n / B);
	base = d->depth * B;
	qn = n - base < B ? n - base : B;
	if (qn) {
		kid = c->ops->best_kid(c->ix, d, tok + base, qn, &lcp_kid);
		for (struct kc_rp *r = d->rps; r; r = r->next) {
			uint32_t l;
			if (!r->t)
				continue;
			l = kc_tok_lcp(r->tail_tok, tok + base, r->t < qn ? r->t : qn);
			if (l > lcp_rp) {
				lcp_rp = l;
				trp = r;
			}
		}
	}
	shared = base + (lcp_kid > lcp_rp ? lcp_kid : lcp_rp);
	if (shared < n) {
		/* the stored tokens the prompt departs from */
		const int32_t *nt = NULL;
		uint32_t nn = 0;
		if (kid && lcp_kid >= lcp_rp) {
			nt = kid->tokens + lcp_kid;
			nn = B - lcp_kid;
		} else if (trp) {
			nt = trp->tail_tok + lcp_rp;
			nn = trp->t - lcp_rp;
		}
		h->n_next = nn < KC_NEXT_TOKENS ? nn : KC_NEXT_TOKENS;
		if (h->n_next)
			memcpy(h->next, nt, h->n_next * sizeof *nt);
	}

	if (c->hybrid) {
		struct kc_rp *best = NULL;
		for (struct kc_node *x = d;; x = x->parent) {
			for (struct kc_rp *r = x->rps; r; r = r->next)
				if (r->snap && r->pos <= n - 1 && (!best || r->pos > best->pos) && rp_matches(c, r, tok, n))
					best = r;
			if (best || x == &c->root)
				break;
		}
		if (best) {
			p = best->pos;
			h->src_rp_ = best;
			best->pins++;
			h->node_ = best->node;
			h->snap = best->snap;
			collect_inherited(c, h, best, tok, n);
			if (!peek)
				kc_tree_touch(c, best->entry);
			if (shared > p && !peek) {
				uint32_t elen = lcp_kid >= lcp_rp && kid ? reach_len(c, kid)
						: trp && lcp_rp ? (trp->entry ? trp->pos : reach_len(c, d))
								: reach_len(c, d);
				c->st.snaps++;
				KV_INFO("cache.lcp_snapped",
					"msg=\"LCP snapped to checkpoint: shared=%u entry_len=%u resumed_at=%u\"", shared,
					elen, p);
			}
		}
	} else if (shared) {
		p = shared < n - 1 ? shared : n - 1;
		h->node_ = ancestor(d, p / B);
		if (p % B) {
			if (p / B < d->depth) {
				/* p fell inside the last full block of the path (the
				 * whole prompt is stored): its first rows are the tail. */
				h->src_node_ = ancestor(d, p / B + 1);
			} else if (lcp_kid >= lcp_rp) {
				h->src_node_ = kid;
			} else {
				h->src_rp_ = trp;
			}
		}
		/* Entries whose KV this hit used up to their end become most
		 * recently used, deepest first so shallower ones end up newer. */
		if (h->src_rp_ && !peek)
			kc_tree_touch(c, h->src_rp_->entry);
		for (struct kc_node *x = h->node_; !peek; x = x->parent) {
			for (struct kc_rp *r = x->rps; r; r = r->next)
				if (!r->t && r->entry)
					kc_tree_touch(c, r->entry);
			if (x == &c->root)
				break;
		}
		if (h->src_rp_)
			h->src_rp_->pins++;
	}
	if (p) {
		h->node_->refs++;
		h->node_->pins++;
		if (h->src_node_) {
			h->src_node_->refs++;
			h->src_node_->pins++;
		}
		h->pos = p;
		h->n_pages = p / B;
		h->tail_rows = p % B;
		if (h->tail_rows) {
			h->tail = h->src_node_ ? h->src_node_->page->data : h->src_rp_->tail_kv;
			h->tail_stride = h->src_node_ ? B : h->src_rp_->t;
		}
		if (!peek) {
			c->st.hits++;
			c->st.tokens_saved += p;
		}
	} else if (!peek) {
		c->st.misses++;
	}
	h->shared = shared;
	if (!peek) {
		c->st.lookups++;
		lat_record(c, kv_now_ns() - t0);
	}
	pthread_mutex_unlock(&c->mu);
	return KV_OK;
}

void kc_hit_pages(const struct kc_hit *h, struct kv_page **out)
{
	const struct kc_node *x = h->node_;
	if (!x)
		return;
	for (uint32_t i = h->n_pages; i-- > 0; x = x->parent)
		out[i] = x->page;
}

void kc_hit_copy_tail(const struct kc_cache *c, const struct kc_hit *h, void *page_data)
{
	size_t rb = c->L.row_bytes;
	uint32_t r = h->tail_rows, stride = h->tail_stride;
	const char *src = h->tail;
	if (!r)
		return;
	for (int s = 0; s < c->L.n_segments; s++)
		memcpy((char *)page_data + (size_t)s * c->B * rb, src + (size_t)s * stride * rb, (size_t)r * rb);
}

static void node_unpin(struct kc_cache *c, struct kc_node *x, uint64_t *rel)
{
	x->pins--;
	x->refs--;
	kc_tree_node_gc(c, x, rel);
}

void kc_hit_release(struct kc_cache *c, struct kc_hit *h)
{
	uint64_t rel = 0;
	if (!h->node_ && !h->src_rp_ && !h->n_inh)
		return;
	pthread_mutex_lock(&c->mu);
	for (uint32_t i = 0; i < h->n_inh; i++) {
		h->inh_rp_[i]->pins--;
		kc_tree_rp_gc(c, h->inh_rp_[i], &rel);
	}
	if (h->src_rp_) {
		h->src_rp_->pins--;
		kc_tree_rp_gc(c, h->src_rp_, &rel);
	}
	if (h->src_node_)
		node_unpin(c, h->src_node_, &rel);
	if (h->node_)
		node_unpin(c, h->node_, &rel);
	kc_evict_enforce(c);
	pthread_mutex_unlock(&c->mu);
	h->node_ = h->src_node_ = NULL;
	h->src_rp_ = NULL;
	h->n_inh = 0;
	h->snap = NULL;
	h->tail = NULL;
}

/* --- put -------------------------------------------------------------------- */

static void free_put_snaps(const struct kc_put *p)
{
	kv_free(p->snap);
	for (uint32_t i = 0; i < p->n_ckpt; i++)
		kv_free(p->ckpt[i].snap);
}

static int check_put(const struct kc_cache *c, const struct kc_put *p)
{
	if (!p->tokens || !p->n)
		return kv_fail(KV_ERR_INVALID, "prefix cache put: empty sequence");
	if (!p->pages)
		return kv_fail(KV_ERR_INVALID, "prefix cache put: no pages");
	if (p->n_ckpt > KC_CKPT_HARD || (p->n_ckpt && !p->ckpt))
		return kv_fail(KV_ERR_INVALID, "prefix cache put: %u checkpoints (at most %d)", p->n_ckpt, KC_CKPT_HARD);
	for (uint32_t i = 0; i < p->n_ckpt; i++)
		if (!p->ckpt[i].pos || p->ckpt[i].pos >= p->n || (i && p->ckpt[i].pos <= p->ckpt[i - 1].pos))
			return kv_fail(KV_ERR_INVALID,
				       "prefix cache put: checkpoint %u at %u is not ascending inside (0, %u)", i,
				       p->ckpt[i].pos, p->n);
	if (p->anchor && p->anchor != p->n) {
		uint32_t i;
		for (i = 0; i < p->n_ckpt && p->ckpt[i].pos != p->anchor; i++)
			;
		if (i == p->n_ckpt)
			return kv_fail(KV_ERR_INVALID, "prefix cache put: anchor %u is not a checkpoint", p->anchor);
	}
	(void)c;
	return KV_OK;
}

/* The rp at pos on the put's path, created if missing. */
static int rp_get(struct kc_cache *c, const struct kc_put *p, uint32_t pos, struct kc_rp **out)
{
	struct kc_node *x = c->path[pos / c->B];
	uint32_t t = pos % c->B;
	const int32_t *tail = p->tokens + (size_t)(pos / c->B) * c->B;
	struct kc_rp *r = kc_tree_rp_find(x, tail, t);
	*out = r;
	if (r)
		return KV_OK;
	if (t && !p->pages[pos / c->B])
		return kv_fail(KV_ERR_INVALID, "prefix cache put: no page for the tail at %u", pos);
	r = kc_tree_rp_new(c, x, tail, t, t ? p->pages[pos / c->B] : NULL, p->clean);
	if (!r)
		return KV_ERR_NOMEM;
	*out = r;
	return KV_OK;
}

/*
 * Dense models resume anywhere their KV covers, so an entry whose whole
 * sequence is a strict prefix of the one just stored offers nothing the
 * new one does not, and its tail duplicates rows of the new one's pages:
 * it is dropped (not counted as an eviction). Hybrid entries keep their
 * end snapshot, which the new entry does not have.
 */
static int redundant(const struct kc_cache *c, const struct kc_rp *r, const struct kc_put *p, uint32_t d,
		     const struct kc_rp *end)
{
	return r != end && r->entry && !r->pins && r->pos <= p->n &&
	       (!r->t || !kc_tok_cmp(r->tail_tok, p->tokens + (size_t)d * c->B, r->t));
}

static void supersede(struct kc_cache *c, const struct kc_put *p, uint32_t nb, struct kc_rp *end)
{
	uint64_t rel = 0;
	/* Nodes on the new path stay: the new end holds them. */
	for (uint32_t d = 0; d <= nb; d++) {
		for (;;) {
			struct kc_rp *r = c->path[d]->rps;
			while (r && !redundant(c, r, p, d, end))
				r = r->next;
			if (!r)
				break;
			c->st.superseded++;
			kc_tree_entry_free(c, r->entry, &rel);
		}
	}
}

int kc_cache_put(struct kc_cache *c, const struct kc_put *p, uint64_t *entry_id)
{
	struct kc_rp *end = NULL, *ck[KC_CKPT_HARD];
	uint8_t used[KC_CKPT_HARD] = {0}; /* checkpoint snapshots now owned by the cache */
	uint32_t nb, n_ck = 0;
	int rc = KV_OK;
	uint64_t rel = 0;
	struct kc_entry *e = NULL;
	void *end_snap = p->snap;

	if (entry_id)
		*entry_id = 0;
	rc = check_put(c, p);
	if (rc != KV_OK) {
		free_put_snaps(p);
		return rc;
	}
	pthread_mutex_lock(&c->mu);
	if (c->disabled || (c->hybrid && c->max_hyb == 0))
		goto out; /* nothing stored, not an error */
	nb = p->n / c->B;
	if (c->path_cap < (size_t)nb + 1) {
		struct kc_node **v = realloc(c->path, ((size_t)nb + 1) * sizeof *v);
		if (!v) {
			rc = kv_fail(KV_ERR_NOMEM, "prefix cache put: path of %u blocks", nb);
			goto out;
		}
		c->path = v;
		c->path_cap = (size_t)nb + 1;
	}
	c->path[0] = &c->root;
	for (uint32_t i = 0; i < nb; i++) {
		struct kc_node *x = c->path[i], *k;
		const int32_t *blk = p->tokens + (size_t)i * c->B;
		struct kv_h128 h = kc_chain_hash(x->hash, blk, c->B);
		k = c->ops->child(c->ix, x, blk, h);
		if (!k) {
			if (!p->pages[i])
				rc = kv_fail(KV_ERR_INVALID, "prefix cache put: block %u is new but has no page", i);
			else if (!(k = kc_tree_node_new(c, x, blk, h, p->pages[i], p->clean)))
				rc = KV_ERR_NOMEM;
			if (rc) {
				kc_tree_node_gc(c, x, &rel); /* drop the new blocks made so far */
				goto out;
			}
		}
		c->path[i + 1] = k;
	}

	rc = rp_get(c, p, p->n, &end);
	if (rc) {
		kc_tree_node_gc(c, c->path[nb], &rel);
		goto out;
	}
	end->refs++; /* hold it while the checkpoints are made */
	if (c->hybrid) {
		if (!end->snap) {
			if (!end_snap) {
				rc = kv_fail(KV_ERR_INVALID, "prefix cache put: hybrid entry without a snapshot at %u", p->n);
				end->refs--;
				kc_tree_rp_gc(c, end, &rel);
				goto out;
			}
			kc_tree_rp_set_snap(c, end, end_snap);
			end_snap = NULL;
		}
		/* Checkpoints that cannot be made (no snapshot, no tail page, no
		 * memory) are dropped: fewer checkpoints is still correct. */
		for (uint32_t i = 0; i < p->n_ckpt; i++) {
			struct kc_rp *r;
			if (rp_get(c, p, p->ckpt[i].pos, &r) != KV_OK)
				continue;
			if (!r->snap && p->ckpt[i].snap) {
				kc_tree_rp_set_snap(c, r, p->ckpt[i].snap);
				used[i] = 1;
			}
			if (!r->snap) {
				kc_tree_rp_gc(c, r, &rel);
				continue;
			}
			r->refs++;
			ck[n_ck++] = r;
		}
	}

	if (end->entry) {
		/* The same end is stored already: that entry wins, made MRU. */
		for (uint32_t i = 0; i < n_ck; i++) {
			ck[i]->refs--;
			kc_tree_rp_gc(c, ck[i], &rel);
		}
		end->refs--;
		kc_tree_touch(c, end->entry);
		if (entry_id)
			*entry_id = end->entry->id;
		goto out;
	}
	e = calloc(1, sizeof *e);
	if (e && n_ck && !(e->ckpt = malloc(n_ck * sizeof *e->ckpt))) {
		free(e);
		e = NULL;
	}
	if (!e) {
		rc = kv_fail(KV_ERR_NOMEM, "prefix cache put: cannot allocate an entry");
		for (uint32_t i = 0; i < n_ck; i++) {
			ck[i]->refs--;
			kc_tree_rp_gc(c, ck[i], &rel);
		}
		end->refs--;
		kc_tree_rp_gc(c, end, &rel);
		goto out;
	}
	e->obj.kind = KC_OBJ_ENTRY;
	e->id = ++c->next_id;
	e->end = end; /* keeps the reference taken above */
	end->entry = e;
	for (uint32_t i = 0; i < n_ck; i++) {
		e->ckpt[i] = ck[i]; /* keeps the reference taken above */
		if (p->anchor && ck[i]->pos == p->anchor) {
			ck[i]->anchor = 1;
			e->anchor = p->anchor;
		}
	}
	e->n_ckpt = n_ck;
	if (c->hybrid && p->anchor && p->anchor == p->n) {
		end->anchor = 1;
		e->anchor = p->n;
	}
	kc_tree_through_add(c, end->node, +1);
	kc_tree_lru_front(c, e);
	if (!p->clean)
		kc_tree_dirty_push(c, &e->obj);
	c->n_entries++;
	c->st.stores++;
	if (entry_id)
		*entry_id = e->id;
	if (!c->hybrid)
		supersede(c, p, nb, end);
	kc_evict_enforce(c);
out:
	pthread_mutex_unlock(&c->mu);
	kv_free(end_snap);
	for (uint32_t i = 0; i < p->n_ckpt; i++)
		if (!used[i])
			kv_free(p->ckpt[i].snap);
	return rc;
}

/* --- counters ----------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

void kc_cache_stats(struct kc_cache *c, struct kc_stats *out)
{
	uint64_t tmp[LAT_RING];
	uint32_t n;
	pthread_mutex_lock(&c->mu);
	*out = c->st;
	out->bytes_in_use = c->bytes;
	out->cap_bytes = c->budget;
	out->entries = c->n_entries;
	out->nodes = c->n_nodes;
	out->rps = c->n_rps;
	out->snapshots = c->n_snaps;
	out->dedup_bytes_saved = c->dedup;
	n = c->lat_n;
	memcpy(tmp, c->lat, n * sizeof tmp[0]);
	pthread_mutex_unlock(&c->mu);
	if (n) {
		qsort(tmp, n, sizeof tmp[0], cmp_u64);
		out->lookup_p50_ms = (double)tmp[(n - 1) / 2] / 1e6;
		out->lookup_p99_ms = (double)tmp[(uint32_t)((uint64_t)(n - 1) * 99 / 100)] / 1e6;
	}
}

void kc_cache_note_skip(struct kc_cache *c)
{
	pthread_mutex_lock(&c->mu);
	c->st.nontrim_skips++;
	pthread_mutex_unlock(&c->mu);
}

/* --- check -------------------------------------------------------------------- */

struct chk {
	uint64_t bytes, nodes, rps, snaps, dedup;
};

static int check_node(struct kc_cache *c, struct kc_node *x, struct chk *k)
{
	uint32_t nk = 0, nr = 0, through = 0;
	if (x != &c->root) {
		struct kv_h128 h = kc_chain_hash(x->parent->hash, x->tokens, c->B);
		if (!kv_h128_eq(h, x->hash))
			return kv_fail(KV_ERR_CORRUPT, "node at depth %u: chain hash mismatch", x->depth);
		if (x->depth != x->parent->depth + 1)
			return kv_fail(KV_ERR_CORRUPT, "node depth %u under %u", x->depth, x->parent->depth);
		if (c->ops->child(c->ix, x->parent, x->tokens, x->hash) != x &&
		    !(c->ops == &kc_hashidx_ops && !x->hx_indexed))
			return kv_fail(KV_ERR_CORRUPT, "node at depth %u: not found through the %s index", x->depth,
				       c->ops->name);
		if (!x->page || kv_page_refs(x->page) < 1)
			return kv_fail(KV_ERR_CORRUPT, "node at depth %u: no page", x->depth);
		k->bytes += node_bytes(c);
		k->nodes++;
	}
	for (struct kc_rp *r = x->rps; r; r = r->next) {
		if (r->node != x || r->pos != x->depth * c->B + r->t || r->t >= c->B)
			return kv_fail(KV_ERR_CORRUPT, "rp at %u: bad position/node", r->pos);
		if (!r->refs && !r->pins)
			return kv_fail(KV_ERR_CORRUPT, "rp at %u: unreferenced", r->pos);
		if (r->entry && r->entry->end != r)
			return kv_fail(KV_ERR_CORRUPT, "rp at %u: entry link broken", r->pos);
		if (c->hybrid && !r->snap)
			return kv_fail(KV_ERR_CORRUPT, "rp at %u: hybrid without snapshot", r->pos);
		for (struct kc_rp *q = r->next; q; q = q->next)
			if (q->t == r->t && (!r->t || !kc_tok_cmp(q->tail_tok, r->tail_tok, r->t)))
				return kv_fail(KV_ERR_CORRUPT, "rp at %u: duplicate", r->pos);
		k->bytes += rp_tail_bytes(c, r->t) + (r->snap ? c->L.snapshot_bytes : 0);
		k->rps++;
		k->snaps += r->snap ? 1 : 0;
		nr++;
	}
	for (struct kc_node *y = x->kid; y; y = y->sib) {
		int rc;
		if (y->parent != x || (y->sib && y->sib->sib_prev != y))
			return kv_fail(KV_ERR_CORRUPT, "node at depth %u: sibling links broken", y->depth);
		rc = check_node(c, y, k);
		if (rc)
			return rc;
		nk++;
		through += y->through;
	}
	if (nk != x->n_kids)
		return kv_fail(KV_ERR_CORRUPT, "node at depth %u: %u kids counted %u", x->depth, nk, x->n_kids);
	if (c->ops == &kc_radix_ops && x->rx_n != nk)
		return kv_fail(KV_ERR_CORRUPT, "node at depth %u: radix holds %u of %u kids", x->depth, x->rx_n, nk);
	if (x->refs != nk + nr + x->pins)
		return kv_fail(KV_ERR_CORRUPT, "node at depth %u: refs %u != kids %u + rps %u + pins %u", x->depth,
			       x->refs, nk, nr, x->pins);
	if (x != &c->root && x->refs == 0)
		return kv_fail(KV_ERR_CORRUPT, "node at depth %u: unreferenced", x->depth);
	for (struct kc_rp *r = x->rps; r; r = r->next)
		if (r->entry)
			through++;
	if (x != &c->root) {
		if (x->through != through)
			return kv_fail(KV_ERR_CORRUPT, "node at depth %u: through %u, counted %u", x->depth, x->through,
				       through);
		if (through > 1)
			k->dedup += (uint64_t)(through - 1) * c->L.page_bytes;
	}
	return KV_OK;
}

int kc_cache_check(struct kc_cache *c)
{
	struct chk k = {0};
	uint64_t ne = 0;
	int rc;

	pthread_mutex_lock(&c->mu);
	rc = check_node(c, &c->root, &k);
	if (!rc && (k.bytes != c->bytes || k.nodes != c->n_nodes || k.rps != c->n_rps || k.snaps != c->n_snaps ||
		    k.dedup != c->dedup))
		rc = kv_fail(KV_ERR_CORRUPT,
			     "totals: bytes %llu/%llu nodes %llu/%llu rps %llu/%llu snaps %llu/%llu dedup %llu/%llu",
			     (unsigned long long)k.bytes, (unsigned long long)c->bytes, (unsigned long long)k.nodes,
			     (unsigned long long)c->n_nodes, (unsigned long long)k.rps, (unsigned long long)c->n_rps,
			     (unsigned long long)k.snaps, (unsigned long long)c->n_snaps, (unsigned long long)k.dedup,
			     (unsigned long long)c->dedup);
	for (struct kc_entry *e = c->lru_head; !rc && e; e = e->next) {
		ne++;
		if (e->next && e->next->prev != e)
			rc = kv_fail(KV_ERR_CORRUPT, "LRU links broken at entry %llu", (unsigned long long)e->id);
		if (e->end->entry != e)
			rc = kv_fail(KV_ERR_CORRUPT, "entry %llu: end does not point back", (unsigned long long)e->id);
		for (uint32_t i = 0; !rc && i < e->n_ckpt; i++) {
			struct kc_rp *r = e->ckpt[i];
			struct kc_node *x = e->end->node;
			if (r->pos >= e->end->pos || (i && r->pos <= e->ckpt[i - 1]->pos))
				rc = kv_fail(KV_ERR_CORRUPT, "entry %llu: checkpoint order", (unsigned long long)e->id);
			while (!rc && x->depth > r->node->depth)
				x = x->parent;
			if (!rc && x != r->node)
				rc = kv_fail(KV_ERR_CORRUPT, "entry %llu: checkpoint %u off its path",
					     (unsigned long long)e->id, r->pos);
			/* The checkpoint's tail must be the entry's own tokens there:
			 * the next block on the path, or the end's tail. */
			if (!rc && r->t) {
				const int32_t *want = NULL;
				if (r->node == e->end->node)
					want = e->end->t >= r->t ? e->end->tail_tok : NULL;
				else {
					struct kc_node *y = e->end->node;
					while (y->parent != r->node)
						y = y->parent;
					want = y->tokens;
				}
				if (!want || kc_tok_cmp(want, r->tail_tok, r->t))
					rc = kv_fail(KV_ERR_CORRUPT, "entry %llu: checkpoint %u tokens differ",
						     (unsigned long long)e->id, r->pos);
			}
		}
	}
	if (!rc && ne != c->n_entries)
		rc = kv_fail(KV_ERR_CORRUPT, "entries: list %llu, counted %llu", (unsigned long long)ne,
			     (unsigned long long)c->n_entries);
	pthread_mutex_unlock(&c->mu);
	return rc;
}

/* --- disk-tier hooks -------------------------------------------------------------- */

static int32_t *entry_tokens(const struct kc_cache *c, const struct kc_entry *e)
{
	const struct kc_rp *end = e->end;
	int32_t *t = malloc(((size_t)end->pos + 1) * sizeof *t);
	if (!t)
		return NULL;
	for (const struct kc_node *x = end->node; x != &c->root; x = x->parent)
		memcpy(t + (size_t)(x->depth - 1) * c->B, x->tokens, (size_t)c->B * sizeof *t);
	if (end->t)
		memcpy(t + (size_t)end->node->depth * c->B, end->tail_tok, (size_t)end->t * sizeof *t);
	return t;
}

size_t kc_cache_take_dirty(struct kc_cache *c, struct kc_view *out, size_t max)
{
	size_t k = 0;
	pthread_mutex_lock(&c->mu);
	while (k < max && c->dirty_head) {
		struct kc_obj *o = c->dirty_head;
		struct kc_view *v = &out[k];
		memset(v, 0, sizeof *v);
		v->kind = o->kind;
		if (o->kind == KC_OBJ_BLOCK) {
			struct kc_node *x = (struct kc_node *)o;
			v->tokens = malloc((size_t)c->B * sizeof(int32_t));
			if (!v->tokens)
				break;
			memcpy(v->tokens, x->tokens, (size_t)c->B * sizeof(int32_t));
			v->n_tokens = c->B;
			v->id = x->hash;
			v->parent = x->parent->hash;
			v->pos = x->depth * c->B;
			kv_page_ref(x->page);
			v->page = x->page;
		} else if (o->kind == KC_OBJ_RP) {
			struct kc_rp *r = (struct kc_rp *)o;
			if (r->t) {
				v->tokens = malloc((size_t)r->t * sizeof(int32_t));
				if (!v->tokens)
					break;
				memcpy(v->tokens, r->tail_tok, (size_t)r->t * sizeof(int32_t));
			}
			v->n_tokens = r->t;
			v->id = r->id;
			v->parent = r->node->hash;
			v->pos = r->pos;
			v->tail_kv = r->tail_kv;
			v->tail_bytes = (size_t)r->t * c->L.kv_bytes_per_token;
			v->snap = r->snap;
			v->snap_bytes = r->snap ? c->L.snapshot_bytes : 0;
			v->anchor = r->anchor;
			r->pins++;
			v->priv_ = r;
		} else {
			struct kc_entry *e = (struct kc_entry *)o;
			v->tokens = entry_tokens(c, e);
			if (!v->tokens)
				break;
			v->n_tokens = e->end->pos;
			v->id = e->end->id;
			v->parent = e->end->node->hash;
			v->pos = e->end->pos;
			for (uint32_t i = 0; i < e->n_ckpt && i < KC_CKPT_HARD; i++)
				v->ckpt[v->n_ckpt++] = e->ckpt[i]->pos;
			v->anchor_pos = e->anchor;
		}
		kc_tree_dirty_unlink(c, o);
		k++;
	}
	pthread_mutex_unlock(&c->mu);
	return k;
}

void kc_cache_view_release(struct kc_cache *c, struct kc_view *v)
{
	free(v->tokens);
	v->tokens = NULL;
	if (v->page) {
		kv_page_unref(v->page);
		v->page = NULL;
	}
	if (v->priv_) {
		uint64_t rel = 0;
		struct kc_rp *r = v->priv_;
		pthread_mutex_lock(&c->mu);
		r->pins--;
		kc_tree_rp_gc(c, r, &rel);
		kc_evict_enforce(c);
		pthread_mutex_unlock(&c->mu);
		v->priv_ = NULL;
	}
}

size_t kc_cache_dirty_count(struct kc_cache *c)
{
	pthread_mutex_lock(&c->mu);
	size_t n = c->n_dirty;
	pthread_mutex_unlock(&c->mu);
	return n;
}

size_t kc_cache_list(struct kc_cache *c, struct kc_entry_info *out, size_t max)
{
	size_t n = 0;
	pthread_mutex_lock(&c->mu);
	for (struct kc_entry *e = c->lru_head; e; e = e->next, n++) {
		if (n >= max)
			continue;
		struct kc_entry_info *o = &out[n];
		memset(o, 0, sizeof *o);
		o->id = e->id;
		o->tokens = e->end ? e->end->pos : 0;
		o->anchor = e->anchor;
		for (uint32_t i = 0; i < e->n_ckpt && i < KC_CKPT_HARD; i++)
			o->ckpt[o->n_ckpt++] = e->ckpt[i]->pos;
		o->last_use_ms = e->last_use_ms;
		o->bytes = (uint64_t)o->tokens * c->L.kv_bytes_per_token +
			   (uint64_t)((e->end && e->end->snap ? 1 : 0) + o->n_ckpt) * c->L.snapshot_bytes;
		o->dirty = e->obj.dirty;
	}
	pthread_mutex_unlock(&c->mu);
	return n;
}
