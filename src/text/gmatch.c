/*
 * gmatch.c - grammar matcher and token masks (gmatch.h).
 *
 * Pieces:
 *   gss       the graph-structured stack: nodes (state, parent) interned
 *             in an open-addressing table; parent P_END is the bottom of a
 *             real stack, P_CTX the unknown stack below a state during a
 *             trie walk. Each node carries a stamp so one step visits a
 *             (state, parent) pair once.
 *   closure   from pairs whose state was just entered: report the pairs
 *             at states that read bytes, follow ACCEPT (pop to the parent)
 *             and calls (push the return state, unless it only returns:
 *             then the call is a tail call and pushes nothing).
 *   step      one byte class from a set of tops: the DFA transition of
 *             each, then closure.
 *   walk      a state's mask entry: the trie in pre-order, one
 *             configuration (a set of pairs) per depth, a fast path for a
 *             single pair at a SIMPLE state (a table lookup per byte:
 *             string contents, literals), subtrees skipped when nothing
 *             is alive.
 */
#include "text/gmatch.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/map.h"
#include "base/mem.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define P_END (-1)
#define P_CTX (-2)
#define P_ESC (-3)
enum { F_END = 1, F_CTX = 2, F_ESCEND = 4 };

/*
 * Where a rule may return to, for walks: when a path pops the bottom of a
 * walk (P_CTX) or of an escaped path (P_ESC), it goes on from every state
 * some call of that rule returns to, with the stack below unknown (P_ESC):
 * a context-insensitive over-approximation that lets a walk reject the
 * tokens no context can take (a space followed by a word, after a JSON
 * value) instead of leaving them all to the run-time check.
 */
struct rets {
	int32_t *off;      /* [n_rules + 1] into st */
	int32_t *st;
	uint8_t *end_ok;   /* [n_rules] the rule may be the bottom of a stack */
};

struct pair {
	int32_t s, p;
};

struct pvec {
	struct pair *v;
	int n, c;
};

static int pv_push(struct pvec *a, int32_t s, int32_t p)
{
	if (a->n == a->c) {
		int c = a->c ? 2 * a->c : 64;
		struct pair *v = realloc(a->v, (size_t)c * sizeof *v);
		if (!v)
			return kv_fail(KV_ERR_NOMEM, "grammar matcher: out of memory");
		a->v = v;
		a->c = c;
	}
	a->v[a->n].s = s;
	a->v[a->n].p = p;
	a->n++;
	return 0;
}

struct i32v {
	int32_t *v;
	int n, c;
};

static int i32_push(struct i32v *a, int32_t x)
{
	if (a->n == a->c) {
		int c = a->c ? 2 * a->c : 256;
		int32_t *v = realloc(a->v, (size_t)c * sizeof *v);
		if (!v)
			return kv_fail(KV_ERR_NOMEM, "grammar matcher: out of memory");
		a->v = v;
		a->c = c;
	}
	a->v[a->n++] = x;
	return 0;
}

/* --- the graph-structured stack ------------------------------------------- */

struct gss {
	int32_t *st, *par, *depth;
	uint8_t *esc;     /* the chain below ends in P_ESC (walks only) */
	uint32_t *stamp;
	int n, c;
	int32_t *ht;
	uint32_t hmask;   /* table size - 1 */
	uint32_t cur;     /* the current step's stamp */
};

static void gss_free(struct gss *g)
{
	free(g->st);
	free(g->par);
	free(g->depth);
	free(g->esc);
	free(g->stamp);
	free(g->ht);
	memset(g, 0, sizeof *g);
}

static uint32_t hmix(int32_t s, int32_t p)
{
	uint64_t x = ((uint64_t)(uint32_t)s << 32) | (uint32_t)p;
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return (uint32_t)x;
}

static int gss_rehash(struct gss *g, uint32_t size)
{
	int32_t *ht = malloc((size_t)size * sizeof *ht);
	if (!ht)
		return kv_fail(KV_ERR_NOMEM, "grammar matcher: out of memory");
	memset(ht, 0xFF, (size_t)size * sizeof *ht);
	for (int i = 0; i < g->n; i++) {
		uint32_t h = hmix(g->st[i], g->par[i]) & (size - 1);
		while (ht[h] >= 0)
			h = (h + 1) & (size - 1);
		ht[h] = i;
	}
	free(g->ht);
	g->ht = ht;
	g->hmask = size - 1;
	return 0;
}

static void gss_reset(struct gss *g)
{
	g->n = 0;
	if (g->ht)
		memset(g->ht, 0xFF, ((size_t)g->hmask + 1) * sizeof *g->ht);
}

/* The node (s, p): existing or new. -1 on out of memory. */
static int32_t gss_get(struct gss *g, int32_t s, int32_t p)
{
	if (!g->ht && gss_rehash(g, 1024))
		return -1;
	uint32_t h = hmix(s, p) & g->hmask;
	for (;;) {
		int32_t i = g->ht[h];
		if (i < 0)
			break;
		if (g->st[i] == s && g->par[i] == p)
			return i;
		h = (h + 1) & g->hmask;
	}
	if (g->n == g->c) {
		int c = g->c ? 2 * g->c : 1024;
		int32_t *a = realloc(g->st, (size_t)c * sizeof *a);
		if (a)
			g->st = a;
		int32_t *b = realloc(g->par, (size_t)c * sizeof *b);
		if (b)
			g->par = b;
		int32_t *d = realloc(g->depth, (size_t)c * sizeof *d);
		if (d)
			g->depth = d;
		uint32_t *e = realloc(g->stamp, (size_t)c * sizeof *e);
		if (e)
			g->stamp = e;
		uint8_t *f = realloc(g->esc, (size_t)c);
		if (f)
			g->esc = f;
		if (!a || !b || !d || !e || !f)
			return kv_fail(KV_ERR_NOMEM, "grammar matcher: out of memory"), -1;
		g->c = c;
	}
	int32_t i = g->n++;
	g->st[i] = s;
	g->par[i] = p;
	g->depth[i] = p < 0 ? 1 : g->depth[p] + 1;
	g->esc[i] = (uint8_t)(p == P_ESC || (p >= 0 && g->esc[p]));
	g->stamp[i] = 0;
	g->ht[h] = i;
	if ((uint32_t)g->n * 2 > g->hmask + 1 && gss_rehash(g, (g->hmask + 1) * 2))
		return -1;
	return i;
}

static void gss_new_step(struct gss *g)
{
	if (++g->cur == 0) {
		for (int i = 0; i < g->n; i++)
			g->stamp[i] = 0;
		g->cur = 1;
	}
}

/* --- closure and step ------------------------------------------------------ */

/* Drain work: byte-reading pairs to out, F_* into *fl. rt (walks only)
 * says where a rule returns to when its stack below is unknown. */
static int closure(const struct kv_gpda *a, struct gss *g, struct pvec *work, struct pvec *out, int *fl,
		   const struct rets *rt)
{
	while (work->n) {
		struct pair x = work->v[--work->n];
		int32_t id = gss_get(g, x.s, x.p);
		if (id < 0)
			return -1;
		if (g->stamp[id] == g->cur)
			continue;
		g->stamp[id] = g->cur;
		const struct kv_gps *st = &a->st[x.s];
		if ((st->flags & KV_GS_BYTES) && pv_push(out, x.s, x.p))
			return -1;
		if (st->flags & KV_GS_ACCEPT) {
			if (x.p == P_END) {
				*fl |= F_END;
			} else if (x.p == P_CTX || x.p == P_ESC) {
				if (x.p == P_CTX)
					*fl |= F_CTX;
				int r = st->rule;
				if (rt->end_ok[r])
					*fl |= F_ESCEND;
				for (int k = rt->off[r]; k < rt->off[r + 1]; k++)
					if (pv_push(work, rt->st[k], P_ESC))
						return -1;
			} else if (pv_push(work, g->st[x.p], g->par[x.p])) {
				return -1;
			}
		}
		for (int i = 0; i < st->n_calls; i++) {
			int e = st->call0 + i;
			int32_t r = a->call_ret[e], start = a->rule_start[a->call_rule[e]];
			if (a->st[r].flags & KV_GS_TAILRET) {
				if (pv_push(work, start, x.p))
					return -1;
				continue;
			}
			if ((x.p >= 0 ? g->depth[x.p] : 0) + 1 > KV_GM_MAX_DEPTH)
				continue; /* nesting past the bound is not allowed */
			int32_t q = gss_get(g, r, x.p);
			if (q < 0 || pv_push(work, start, q))
				return -1;
		}
	}
	return 0;
}

/* One byte from in[0..n) (read fully before out grows; out may be the
 * same vector as in's storage only if in lies before out->n). */
static int step(const struct kv_gpda *a, struct gss *g, struct pvec *work, const struct pair *in, int n, int byte,
		struct pvec *out, int *fl, const struct rets *rt)
{
	gss_new_step(g);
	*fl = 0;
	work->n = 0;
	for (int i = 0; i < n; i++) {
		int32_t t = kv_gpda_next(a, in[i].s, byte);
		if (t >= 0 && pv_push(work, t, in[i].p))
			return -1;
	}
	return closure(a, g, work, out, fl, rt);
}

/* --- mask entries ---------------------------------------------------------- */

enum { PE_LIST = 0, PE_BITS = 1 };

struct pent {
	int32_t state;
	int kind;
	int32_t n_acc;
	uint32_t *acc;        /* LIST: ids; BITS: bitmap */
	int32_t n_cd;
	int32_t *cd;          /* dependent ids, walk order (stable) */
	size_t bytes;
	struct pent *prev, *next;
};

struct kv_grammar {
	atomic_int refs;
	struct kv_gpda *a;
	const struct kv_gvocab *v;
	pthread_mutex_t mu;
	struct pent **ent;    /* [n_states] */
	struct pent lru;      /* sentinel: next = most recent */
	size_t bytes, limit;
	int words;
	/* walk scratch (under mu) */
	struct gss wg;
	struct pvec cfg, work;
	int32_t *off, *len;
	struct i32v acc, cd;
	struct rets rt;
	uint32_t *accbits;    /* [words] the walk's accepted ids */
	int n_acc;
	uint64_t (*loop)[4];  /* [n_states] bytes on which a SIMPLE state goes to itself */
	/* stats */
	uint64_t computed, evicted, dep_total;
	double walk_ms;
};

static void pent_free(struct pent *e)
{
	if (!e)
		return;
	kv_free(e->acc);
	kv_free(e->cd);
	free(e);
}

static void lru_unlink(struct pent *e)
{
	e->prev->next = e->next;
	e->next->prev = e->prev;
}

static void lru_front(struct kv_grammar *G, struct pent *e)
{
	e->next = G->lru.next;
	e->prev = &G->lru;
	G->lru.next->prev = e;
	G->lru.next = e;
}

static int add_ids(struct kv_grammar *G, struct i32v *to, int32_t id)
{
	for (; id >= 0; id = G->v->same_next[id])
		if (i32_push(to, id))
			return -1;
	return 0;
}

/* 1 when pair x lies on a path that has left the walk's rule. */
static int escaped(const struct gss *g, struct pair x)
{
	return x.p == P_ESC || (x.p >= 0 && g->esc[x.p]);
}

static int cfg_reserve(struct pvec *v, int n)
{
	if (n <= v->c)
		return 0;
	int c = v->c ? v->c : 64;
	while (c < n)
		c *= 2;
	struct pair *q = realloc(v->v, (size_t)c * sizeof *q);
	if (!q)
		return kv_fail(KV_ERR_NOMEM, "grammar matcher: out of memory");
	v->v = q;
	v->c = c;
	return 0;
}

static inline void acc_set(struct kv_grammar *G, int32_t id)
{
	for (; id >= 0; id = G->v->same_next[id]) {
		uint32_t bit = 1u << (id & 31);
		if (!(G->accbits[id >> 5] & bit)) {
			G->accbits[id >> 5] |= bit;
			G->n_acc++;
		}
	}
}

/*
 * The trie walk for state s0 (under G->mu). The hot loop is the fast path:
 * one pair at a SIMPLE state (string contents, literals, digits) steps by
 * one table lookup and writes the next configuration in place; anything
 * else (a state that can end its rule, call or pop, several pairs) goes
 * through step() and closure(). Accepted ids go straight into a bitmap.
 */
static struct pent *walk(struct kv_grammar *G, int32_t s0)
{
	const struct kv_gpda *a = G->a;
	const struct kv_gvocab *v = G->v;
	const struct kv_gps *st = a->st;
	const uint8_t *bytes = v->byte;
	const uint16_t *depth = v->depth;
	const int32_t *tok = v->tok, *end = v->end;
	double t0 = kv_now_s();
	gss_reset(&G->wg);
	G->cd.n = 0;
	G->n_acc = 0;
	memset(G->accbits, 0, (size_t)G->words * sizeof *G->accbits);
	int32_t bottom = st[s0].rule == a->root && !a->rule_called[a->root] ? P_END : P_CTX;
	if (cfg_reserve(&G->cfg, 64))
		return NULL;
	G->cfg.v[0].s = s0;
	G->cfg.v[0].p = bottom;
	G->cfg.n = 1;
	G->off[0] = 0;
	G->len[0] = 1;
	int i = 0, nn = v->n_nodes;
	while (i < nn) {
		int d = depth[i];
		int32_t po = G->off[d - 1], pl = G->len[d - 1];
		int32_t no = po + pl;
		int fl = 0, in = 0, esc = 0;
		if (cfg_reserve(&G->cfg, no + 1))
			return NULL;
		G->cfg.n = no;
		struct pair x = G->cfg.v[po];
		if (pl == 1 && (st[x.s].flags & KV_GS_SIMPLE)) {
			int32_t t = a->trans[(size_t)st[x.s].row * (size_t)a->n_cls + a->cls[bytes[i]]];
			if (t < 0) {
				i = end[i];
				continue;
			}
			if (t == x.s) {
				/* a state that loops on every byte of the subtree: all
				 * its tokens end here, accepted (or all dependent) */
				const uint64_t *lp = G->loop[t], *sb = v->sub[i];
				if (!(sb[0] & ~lp[0]) && !(sb[1] & ~lp[1]) && !(sb[2] & ~lp[2]) && !(sb[3] & ~lp[3])) {
					int esc = escaped(&G->wg, x);
					for (int j = i; j < end[i]; j++)
						if (tok[j] >= 0) {
							if (!esc)
								acc_set(G, tok[j]);
							else if (add_ids(G, &G->cd, tok[j]))
								return NULL;
						}
					i = end[i];
					continue;
				}
			}
			if (st[t].flags & KV_GS_SIMPLE) {
				G->cfg.v[no].s = t;
				G->cfg.v[no].p = x.p;
				G->off[d] = no;
				G->len[d] = 1;
				if (tok[i] >= 0) {
					if (!escaped(&G->wg, x))
						acc_set(G, tok[i]);
					else if (add_ids(G, &G->cd, tok[i]))
						return NULL;
				}
				i++;
				continue;
			}
			gss_new_step(&G->wg);
			G->work.n = 0;
			if (pv_push(&G->work, t, x.p) || closure(a, &G->wg, &G->work, &G->cfg, &fl, &G->rt))
				return NULL;
		} else if (step(a, &G->wg, &G->work, G->cfg.v + po, pl, bytes[i], &G->cfg, &fl, &G->rt)) {
			return NULL;
		}
		int32_t nl = G->cfg.n - no;
		G->off[d] = no;
		G->len[d] = nl;
		if (tok[i] >= 0) {
			in = (fl & (F_END | F_CTX)) != 0;
			esc = (fl & F_ESCEND) != 0;
			for (int k = no; k < no + nl && !in; k++) {
				if (escaped(&G->wg, G->cfg.v[k]))
					esc = 1;
				else
					in = 1;
			}
			if (in)
				acc_set(G, tok[i]);
			else if (esc && add_ids(G, &G->cd, tok[i]))
				return NULL;
		}
		i = nl ? i + 1 : end[i];
	}
	struct pent *e = calloc(1, sizeof *e);
	if (!e) {
		kv_fail(KV_ERR_NOMEM, "grammar matcher: out of memory");
		return NULL;
	}
	e->state = s0;
	e->n_acc = G->n_acc;
	if ((size_t)G->n_acc * 32 < (size_t)v->n_ids) {
		e->kind = PE_LIST;
		e->acc = kv_alloc(KV_MEM_OTHER, ((size_t)G->n_acc + 1) * sizeof *e->acc);
		int k = 0;
		if (e->acc)
			for (int w = 0; w < G->words; w++)
				for (uint32_t m = G->accbits[w]; m; m &= m - 1)
					e->acc[k++] = (uint32_t)(w * 32 + __builtin_ctz(m));
		e->bytes = (size_t)G->n_acc * 4;
	} else {
		e->kind = PE_BITS;
		e->acc = kv_alloc(KV_MEM_OTHER, (size_t)G->words * sizeof *e->acc);
		if (e->acc)
			memcpy(e->acc, G->accbits, (size_t)G->words * sizeof *e->acc);
		e->bytes = (size_t)G->words * 4;
	}
	e->n_cd = G->cd.n;
	e->cd = kv_alloc(KV_MEM_OTHER, ((size_t)G->cd.n + 1) * sizeof *e->cd);
	if (!e->acc || !e->cd) {
		pent_free(e);
		kv_fail(KV_ERR_NOMEM, "grammar matcher: out of memory");
		return NULL;
	}
	if (G->cd.n)
		memcpy(e->cd, G->cd.v, (size_t)G->cd.n * sizeof *e->cd);
	e->bytes += (size_t)G->cd.n * 4 + sizeof *e;
	G->computed++;
	G->dep_total += (uint64_t)G->cd.n;
	G->walk_ms += (kv_now_s() - t0) * 1e3;
	if (getenv("KV_GM_DEBUG"))
		fprintf(stderr, "walk s%d rule %d flags %d acc %d cd %d %.3f ms\n", s0, st[s0].rule, st[s0].flags, G->n_acc,
			G->cd.n, (kv_now_s() - t0) * 1e3);
	return e;
}

/* The entry of state s, computed if missing (under G->mu). */
static struct pent *entry(struct kv_grammar *G, int32_t s)
{
	struct pent *e = G->ent[s];
	if (e) {
		if (G->lru.next != e) {
			lru_unlink(e);
			lru_front(G, e);
		}
		return e;
	}
	e = walk(G, s);
	if (!e)
		return NULL;
	G->ent[s] = e;
	lru_front(G, e);
	G->bytes += e->bytes;
	while (G->bytes > G->limit && G->lru.prev != e) {
		struct pent *old = G->lru.prev;
		lru_unlink(old);
		G->ent[old->state] = NULL;
		G->bytes -= old->bytes;
		G->evicted++;
		pent_free(old);
	}
	return e;
}

/* Return states of every rule (struct rets): a tail call returns where its
 * caller returns, so tail callers are followed to their own returns. */
static int rets_build(const struct kv_gpda *a, struct rets *rt)
{
	int R = a->n_rules, rc = -1;
	struct i32v st = {0};
	uint8_t *in = calloc((size_t)R + 1, 1), *seen = calloc((size_t)a->n_states + 1, 1);
	int32_t *q = malloc(((size_t)R + 1) * sizeof *q);
	int32_t *caller = malloc(((size_t)a->n_call_edges + 1) * sizeof *caller);
	rt->off = malloc(((size_t)R + 1) * sizeof *rt->off);
	rt->end_ok = calloc((size_t)R + 1, 1);
	if (!in || !seen || !q || !caller || !rt->off || !rt->end_ok)
		goto out;
	for (int s = 0; s < a->n_states; s++)
		for (int k = 0; k < a->st[s].n_calls; k++)
			caller[a->st[s].call0 + k] = s;
	for (int r = 0; r < R; r++) {
		rt->off[r] = st.n;
		memset(in, 0, (size_t)R);
		int qn = 0;
		q[qn++] = r;
		in[r] = 1;
		int first = st.n;
		for (int h = 0; h < qn; h++) {
			int x = q[h];
			if (x == a->root)
				rt->end_ok[r] = 1;
			for (int e = 0; e < a->n_call_edges; e++) {
				if (a->call_rule[e] != x)
					continue;
				int32_t ret = a->call_ret[e];
				if (a->st[ret].flags & KV_GS_TAILRET) {
					int cr = a->st[caller[e]].rule;
					if (!in[cr]) {
						in[cr] = 1;
						q[qn++] = cr;
					}
				} else if (!seen[ret]) {
					seen[ret] = 1;
					if (i32_push(&st, ret))
						goto out;
				}
			}
		}
		for (int k = first; k < st.n; k++)
			seen[st.v[k]] = 0;
	}
	rt->off[R] = st.n;
	rt->st = st.v;
	st.v = NULL;
	if (!rt->st)
		rt->st = malloc(sizeof *rt->st);
	rc = rt->st ? 0 : -1;
out:
	free(st.v);
	free(in);
	free(seen);
	free(q);
	free(caller);
	if (rc)
		kv_fail(KV_ERR_NOMEM, "grammar: out of memory");
	return rc;
}

int kv_grammar_create(const struct kv_gram *ir, const struct kv_gvocab *v, const struct kv_grammar_params *p,
		      struct kv_grammar **out)
{
	struct kv_gpda *a;
	*out = NULL;
	int rc = kv_gpda_compile(ir, p ? &p->lim : NULL, &a);
	if (rc)
		return rc;
	struct kv_grammar *G = calloc(1, sizeof *G);
	if (!G) {
		kv_gpda_free(a);
		return kv_fail(KV_ERR_NOMEM, "grammar: out of memory");
	}
	atomic_init(&G->refs, 1);
	G->a = a;
	G->v = v;
	G->limit = p && p->cache_bytes ? p->cache_bytes : (size_t)64 << 20;
	G->words = (v->n_ids + 31) / 32;
	G->lru.next = G->lru.prev = &G->lru;
	pthread_mutex_init(&G->mu, NULL);
	G->ent = calloc((size_t)a->n_states + 1, sizeof *G->ent);
	G->off = malloc(((size_t)v->max_depth + 2) * sizeof *G->off);
	G->len = malloc(((size_t)v->max_depth + 2) * sizeof *G->len);
	G->accbits = malloc(((size_t)G->words + 1) * sizeof *G->accbits);
	G->loop = calloc((size_t)a->n_states + 1, sizeof *G->loop);
	if (G->loop)
		for (int s = 0; s < a->n_states; s++)
			if (a->st[s].flags & KV_GS_SIMPLE)
				for (int b = 0; b < 256; b++)
					if (kv_gpda_next(a, s, b) == s)
						G->loop[s][b >> 6] |= 1ull << (b & 63);
	if (!G->ent || !G->off || !G->len || !G->accbits || !G->loop || rets_build(a, &G->rt)) {
		kv_grammar_unref(G);
		return kv_fail(KV_ERR_NOMEM, "grammar: out of memory");
	}
	*out = G;
	return KV_OK;
}

struct kv_grammar *kv_grammar_ref(struct kv_grammar *g)
{
	atomic_fetch_add(&g->refs, 1);
	return g;
}

void kv_grammar_unref(struct kv_grammar *G)
{
	if (!G || atomic_fetch_sub(&G->refs, 1) != 1)
		return;
	if (G->ent)
		for (int s = 0; s < G->a->n_states; s++)
			pent_free(G->ent[s]);
	free(G->ent);
	kv_gpda_free(G->a);
	gss_free(&G->wg);
	free(G->cfg.v);
	free(G->work.v);
	free(G->off);
	free(G->len);
	free(G->accbits);
	free(G->loop);
	free(G->rt.off);
	free(G->rt.st);
	free(G->rt.end_ok);
	free(G->acc.v);
	free(G->cd.v);
	pthread_mutex_destroy(&G->mu);
	free(G);
}

int kv_grammar_precompute(struct kv_grammar *G)
{
	int rc = KV_OK;
	pthread_mutex_lock(&G->mu);
	for (int s = 0; s < G->a->n_states && !rc; s++)
		if ((G->a->st[s].flags & KV_GS_BYTES) && !entry(G, s))
			rc = KV_ERR_NOMEM;
	pthread_mutex_unlock(&G->mu);
	return rc;
}

const struct kv_gpda *kv_grammar_pda(const struct kv_grammar *g)
{
	return g->a;
}

const struct kv_gvocab *kv_grammar_vocab(const struct kv_grammar *g)
{
	return g->v;
}

void kv_grammar_get_stats(struct kv_grammar *G, struct kv_grammar_stats *s)
{
	pthread_mutex_lock(&G->mu);
	s->n_states = G->a->n_states;
	s->n_rules = G->a->n_rules;
	s->entries_computed = G->computed;
	s->entries_evicted = G->evicted;
	s->dependent_total = G->dep_total;
	s->walk_ms = G->walk_ms;
	s->cache_bytes = G->bytes;
	pthread_mutex_unlock(&G->mu);
}

/* --- the matcher ------------------------------------------------------------ */

struct kv_gmatch {
	struct kv_grammar *G;
	int32_t *eos;
	int n_eos;
	struct gss g;
	struct pvec cur, nxt, work, t1, t2;
	int can_end, ended;
	/* dependent-token results per (state, stack) pair */
	struct kv_map *dep;   /* 8-byte key -> offset in dep_bits */
	struct kv_buf dep_bits;
	struct i32v cdcopy;
	uint32_t *scratch;    /* [words] */
	uint64_t n_masks, dep_checked, dep_hits;
};

#define DEP_CACHE_MAX (16u << 20)
#define GSS_COMPACT_AT (1 << 20)

static int start_state(struct kv_gmatch *m)
{
	const struct kv_gpda *a = m->G->a;
	int fl = 0;
	gss_reset(&m->g);
	kv_map_clear(m->dep);
	kv_buf_reset(&m->dep_bits);
	gss_new_step(&m->g);
	m->cur.n = 0;
	m->work.n = 0;
	if (pv_push(&m->work, a->rule_start[a->root], P_END) || closure(a, &m->g, &m->work, &m->cur, &fl, NULL))
		return KV_ERR_NOMEM;
	m->can_end = (fl & F_END) != 0;
	m->ended = 0;
	return KV_OK;
}

int kv_gmatch_create(struct kv_grammar *G, const int32_t *eos, int n_eos, struct kv_gmatch **out)
{
	struct kv_gmatch *m = calloc(1, sizeof *m);
	*out = NULL;
	if (!m)
		return kv_fail(KV_ERR_NOMEM, "grammar matcher: out of memory");
	m->G = kv_grammar_ref(G);
	m->eos = malloc(((size_t)(n_eos > 0 ? n_eos : 0) + 1) * sizeof *m->eos);
	m->dep = kv_map_create(256);
	m->scratch = malloc(((size_t)G->words + 1) * sizeof *m->scratch);
	if (!m->eos || !m->dep || !m->scratch) {
		kv_gmatch_free(m);
		return kv_fail(KV_ERR_NOMEM, "grammar matcher: out of memory");
	}
	for (int i = 0; i < n_eos; i++)
		m->eos[m->n_eos++] = eos[i];
	if (start_state(m)) {
		kv_gmatch_free(m);
		return KV_ERR_NOMEM;
	}
	*out = m;
	return KV_OK;
}

void kv_gmatch_free(struct kv_gmatch *m)
{
	if (!m)
		return;
	kv_grammar_unref(m->G);
	free(m->eos);
	gss_free(&m->g);
	free(m->cur.v);
	free(m->nxt.v);
	free(m->work.v);
	free(m->t1.v);
	free(m->t2.v);
	kv_map_destroy(m->dep);
	kv_buf_free(&m->dep_bits);
	free(m->cdcopy.v);
	free(m->scratch);
	free(m);
}

void kv_gmatch_reset(struct kv_gmatch *m)
{
	start_state(m);
}

int kv_gmatch_mask_words(const struct kv_gmatch *m)
{
	return m->G->words;
}

int kv_gmatch_can_end(const struct kv_gmatch *m)
{
	return m->can_end && !m->ended;
}

int kv_gmatch_ended(const struct kv_gmatch *m)
{
	return m->ended;
}

int kv_gmatch_done(const struct kv_gmatch *m)
{
	return m->ended || m->cur.n == 0;
}

static int is_eos(const struct kv_gmatch *m, int32_t t)
{
	for (int i = 0; i < m->n_eos; i++)
		if (m->eos[i] == t)
			return 1;
	return 0;
}

/* Keep only the nodes the current tops reach (the table grows with every
 * push, and dependent-token checks leave nodes behind). */
static int compact(struct kv_gmatch *m)
{
	struct gss ng = {0};
	int32_t *map = malloc(((size_t)m->g.n + 1) * sizeof *map);
	if (!map)
		return kv_fail(KV_ERR_NOMEM, "grammar matcher: out of memory");
	for (int i = 0; i < m->g.n; i++)
		map[i] = -1;
	/* copy parent chains bottom-up with a small explicit stack */
	struct i32v chain = {0};
	for (int t = 0; t < m->cur.n; t++) {
		int32_t p = m->cur.v[t].p;
		chain.n = 0;
		while (p >= 0 && map[p] < 0) {
			if (i32_push(&chain, p))
				goto nomem;
			p = m->g.par[p];
		}
		while (chain.n) {
			int32_t o = chain.v[--chain.n];
			int32_t np = m->g.par[o] < 0 ? m->g.par[o] : map[m->g.par[o]];
			int32_t id = gss_get(&ng, m->g.st[o], np);
			if (id < 0)
				goto nomem;
			map[o] = id;
		}
		if (m->cur.v[t].p >= 0)
			m->cur.v[t].p = map[m->cur.v[t].p];
	}
	free(chain.v);
	free(map);
	gss_free(&m->g);
	m->g = ng;
	kv_map_clear(m->dep);
	kv_buf_reset(&m->dep_bits);
	return KV_OK;
nomem:
	free(chain.v);
	free(map);
	gss_free(&ng);
	return kv_fail(KV_ERR_NOMEM, "grammar matcher: out of memory");
}

/* Run bytes from the pairs in[0..n): the final pairs in res (t1/t2 used
 * as scratch), *fl the flags of the last byte. 1 if alive at the end
 * (pairs left or END reached), 0 if not, -1 on out of memory. */
static int run_bytes(struct kv_gmatch *m, const struct pair *in, int n, const uint8_t *p, size_t len, struct pvec **res,
		     int *fl)
{
	const struct kv_gpda *a = m->G->a;
	struct pvec *src = &m->t1, *dst = &m->t2;
	src->n = 0;
	for (int i = 0; i < n; i++)
		if (pv_push(src, in[i].s, in[i].p))
			return -1;
	*fl = 0;
	for (size_t k = 0; k < len; k++) {
		dst->n = 0;
		if (step(a, &m->g, &m->work, src->v, src->n, p[k], dst, fl, NULL))
			return -1;
		if (dst->n > KV_GM_MAX_TOPS)
			dst->n = KV_GM_MAX_TOPS; /* ambiguity bound: the rest are dropped */
		struct pvec *t = src;
		src = dst;
		dst = t;
		if (!src->n && !(k + 1 == len && (*fl & F_END)))
			return 0;
	}
	*res = src;
	return src->n > 0 || (*fl & F_END) || len == 0;
}

int kv_gmatch_accept_bytes(struct kv_gmatch *m, const void *p, size_t n)
{
	struct pvec *res;
	int fl;
	if (m->ended)
		return kv_fail(KV_ERR_INVALID, "grammar: the output has ended; no more text is allowed");
	if (!n)
		return KV_OK;
	int ok = run_bytes(m, m->cur.v, m->cur.n, p, n, &res, &fl);
	if (ok < 0)
		return KV_ERR_NOMEM;
	if (!ok)
		return KV_ERR_INVALID;
	struct pvec t = m->cur;
	m->cur = *res;
	*res = t;
	m->can_end = (fl & F_END) != 0;
	if (m->g.n > GSS_COMPACT_AT)
		return compact(m);
	return KV_OK;
}

static void name_token(const struct kv_gmatch *m, int32_t tok, char *buf, size_t cap)
{
	size_t len;
	const char *s = kv_tok_bytes_get(m->G->v->bytes, tok, &len);
	size_t o = 0;
	o += (size_t)snprintf(buf, cap, "token %d \"", tok);
	for (size_t i = 0; i < len && o + 8 < cap; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\')
			buf[o++] = (char)c;
		else
			o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
	}
	snprintf(buf + o, cap - o, "\"");
}

int kv_gmatch_accept(struct kv_gmatch *m, int32_t tok)
{
	char nm[160];
	if (m->ended)
		return kv_fail(KV_ERR_INVALID, "grammar: the output has ended; token %d is not allowed", tok);
	if (is_eos(m, tok)) {
		if (!m->can_end)
			return kv_fail(KV_ERR_INVALID, "grammar: end of sequence (token %d) before the output is complete", tok);
		m->ended = 1;
		return KV_OK;
	}
	const struct kv_gvocab *v = m->G->v;
	size_t len;
	const char *s = kv_tok_bytes_get(v->bytes, tok, &len);
	if (tok < 0 || tok >= v->n_ids || !len || v->bytes->special[tok])
		return kv_fail(KV_ERR_INVALID, "grammar: token %d has no text the grammar can match", tok);
	int rc = kv_gmatch_accept_bytes(m, s, len);
	if (rc == KV_ERR_INVALID) {
		name_token(m, tok, nm, sizeof nm);
		return kv_fail(KV_ERR_INVALID, "grammar: %s is not allowed here", nm);
	}
	return rc;
}

static int token_ok_from(struct kv_gmatch *m, const struct pair *in, int n, int32_t tok)
{
	size_t len;
	const char *s = kv_tok_bytes_get(m->G->v->bytes, tok, &len);
	struct pvec *res;
	int fl;
	if (!len || m->G->v->bytes->special[tok])
		return 0;
	return run_bytes(m, in, n, (const uint8_t *)s, len, &res, &fl);
}

int kv_gmatch_allows(struct kv_gmatch *m, int32_t tok)
{
	if (m->ended)
		return 0;
	if (is_eos(m, tok))
		return m->can_end;
	if (tok < 0 || tok >= m->G->v->n_ids)
		return 0;
	return token_ok_from(m, m->cur.v, m->cur.n, tok) == 1;
}

static void set_bit(uint32_t *mask, int32_t id)
{
	mask[id >> 5] |= 1u << (id & 31);
}

/* Dependent tokens of entry e checked from pair x: a bitset over e->cd,
 * from the matcher's cache or computed. Returns a pointer into
 * dep_bits (valid until it grows) or NULL on out of memory. */
static const uint64_t *dep_bits(struct kv_gmatch *m, struct pair x, const int32_t *cd, int n_cd)
{
	uint64_t key = ((uint64_t)(uint32_t)x.s << 32) | (uint32_t)x.p, off;
	size_t nw = ((size_t)n_cd + 63) / 64;
	if (kv_map_get(m->dep, &key, sizeof key, &off)) {
		m->dep_hits++;
		return (const uint64_t *)(m->dep_bits.p + off);
	}
	if (m->dep_bits.len + nw * 8 > DEP_CACHE_MAX) {
		kv_map_clear(m->dep);
		kv_buf_reset(&m->dep_bits);
	}
	/* align to 8 */
	while (m->dep_bits.len % 8)
		kv_buf_addc(&m->dep_bits, 0);
	off = m->dep_bits.len;
	if (kv_buf_reserve(&m->dep_bits, nw * 8 + 8))
		return NULL;
	memset(m->dep_bits.p + off, 0, nw * 8);
	m->dep_bits.len += nw * 8;
	for (int i = 0; i < n_cd; i++) {
		int ok = token_ok_from(m, &x, 1, cd[i]);
		if (ok < 0)
			return NULL;
		if (ok)
			((uint64_t *)(m->dep_bits.p + off))[i >> 6] |= 1ull << (i & 63);
	}
	m->dep_checked += (uint64_t)n_cd;
	if (kv_map_put(m->dep, &key, sizeof key, off))
		return NULL;
	return (const uint64_t *)(m->dep_bits.p + off);
}

int kv_gmatch_fill_mask(struct kv_gmatch *m, uint32_t *mask)
{
	struct kv_grammar *G = m->G;
	int W = G->words, first = 1;
	m->n_masks++;
	if (m->ended) {
		memset(mask, 0, (size_t)W * sizeof *mask);
		return KV_OK;
	}
	for (int t = 0; t < m->cur.n; t++) {
		struct pair x = m->cur.v[t];
		pthread_mutex_lock(&G->mu);
		struct pent *e = entry(G, x.s);
		if (!e) {
			pthread_mutex_unlock(&G->mu);
			return KV_ERR_NOMEM;
		}
		if (e->kind == PE_BITS) {
			if (first)
				memcpy(mask, e->acc, (size_t)W * sizeof *mask);
			else
				for (int w = 0; w < W; w++)
					mask[w] |= e->acc[w];
		} else {
			if (first)
				memset(mask, 0, (size_t)W * sizeof *mask);
			for (int k = 0; k < e->n_acc; k++)
				set_bit(mask, (int32_t)e->acc[k]);
		}
		first = 0;
		/* the dependent list is copied out: the entry may be evicted by
		 * another matcher once the lock is released */
		m->cdcopy.n = 0;
		for (int k = 0; k < e->n_cd; k++)
			if (i32_push(&m->cdcopy, e->cd[k])) {
				pthread_mutex_unlock(&G->mu);
				return KV_ERR_NOMEM;
			}
		pthread_mutex_unlock(&G->mu);
		if (m->cdcopy.n) {
			const uint64_t *b = dep_bits(m, x, m->cdcopy.v, m->cdcopy.n);
			if (!b)
				return KV_ERR_NOMEM;
			for (int k = 0; k < m->cdcopy.n; k++)
				if (b[k >> 6] & (1ull << (k & 63)))
					set_bit(mask, m->cdcopy.v[k]);
		}
	}
	if (first)
		memset(mask, 0, (size_t)W * sizeof *mask);
	if (m->can_end)
		for (int i = 0; i < m->n_eos; i++)
			if (m->eos[i] >= 0 && m->eos[i] < G->v->n_ids)
				set_bit(mask, m->eos[i]);
	if (m->g.n > GSS_COMPACT_AT)
		return compact(m);
	return KV_OK;
}

int kv_gmatch_fill_mask_slow(struct kv_gmatch *m, uint32_t *mask)
{
	int W = m->G->words;
	memset(mask, 0, (size_t)W * sizeof *mask);
	for (int32_t t = 0; t < m->G->v->n_ids; t++) {
		int ok = kv_gmatch_allows(m, t);
		if (ok)
			set_bit(mask, t);
	}
	return KV_OK;
}

void kv_gmatch_get_stats(const struct kv_gmatch *m, struct kv_gmatch_stats *s)
{
	s->masks = m->n_masks;
	s->dep_checked = m->dep_checked;
	s->dep_cache_hits = m->dep_hits;
	s->tops = m->cur.n;
	s->nodes = m->g.n;
}

/* --- completion ---------------------------------------------------------------- */

static int64_t stack_dist(const struct kv_gmatch *m, struct pair x)
{
	const struct kv_gpda *a = m->G->a;
	int64_t d = a->st[x.s].dist;
	for (int32_t p = x.p; p >= 0; p = m->g.par[p])
		d += a->st[m->g.st[p]].dist;
	return d;
}

/* A byte of class k to write in a completion: printable ASCII if the
 * class has one, else its smallest byte. */
static int class_byte(const struct kv_gpda *a, int k)
{
	for (int b = 0x20; b < 0x7F; b++)
		if (a->cls[b] == k)
			return b;
	return a->cls_byte[k];
}

int kv_gmatch_complete(struct kv_gmatch *m, struct kv_buf *out)
{
	const struct kv_gpda *a = m->G->a;
	if (m->ended || m->can_end || !m->cur.n)
		return KV_OK;
	int best = 0;
	int64_t bd = stack_dist(m, m->cur.v[0]);
	for (int t = 1; t < m->cur.n; t++) {
		int64_t d = stack_dist(m, m->cur.v[t]);
		if (d < bd) {
			bd = d;
			best = t;
		}
	}
	int32_t s = m->cur.v[best].s, p = m->cur.v[best].p;
	/* follow the edges that realise the distances; bounded by bd plus
	 * the pushes and pops along the way */
	for (int64_t guard = 0; guard < 4 * bd + 4 * KV_GM_MAX_DEPTH + 16; guard++) {
		const struct kv_gps *st = &a->st[s];
		if (st->dist == 0) {
			if (p < 0)
				return out->oom ? KV_ERR_NOMEM : KV_OK;
			s = m->g.st[p];
			p = m->g.par[p];
			continue;
		}
		int moved = 0;
		if (st->row >= 0) {
			const int32_t *row = a->trans + (size_t)st->row * (size_t)a->n_cls;
			int pick = -1, printable = 0;
			for (int k = 0; k < a->n_cls; k++) {
				int32_t t = row[k];
				if (t < 0 || (int64_t)a->st[t].dist + 1 != st->dist)
					continue;
				int b = class_byte(a, k);
				int pr = b >= 0x20 && b < 0x7F;
				if (pick < 0 || (pr && !printable)) {
					pick = k;
					printable = pr;
				}
			}
			if (pick >= 0) {
				kv_buf_addc(out, (char)class_byte(a, pick));
				s = row[pick];
				moved = 1;
			}
		}
		for (int i = 0; !moved && i < st->n_calls; i++) {
			int e = st->call0 + i;
			int32_t r = a->call_ret[e], R = a->call_rule[e];
			if ((int64_t)a->rule_minlen[R] + a->st[r].dist != st->dist)
				continue;
			if (!(a->st[r].flags & KV_GS_TAILRET)) {
				int32_t q = gss_get(&m->g, r, p);
				if (q < 0)
					return KV_ERR_NOMEM;
				p = q;
			}
			s = a->rule_start[R];
			moved = 1;
		}
		if (!moved)
			break;
	}
	return kv_fail(KV_ERR_INVALID, "grammar: no completion found (internal inconsistency)");
}

int kv_gmatch_force(struct kv_gmatch *m, const void *p, size_t n, int32_t *ids)
{
	const uint8_t *s = p;
	int k = 0;
	while (n) {
		size_t len;
		int32_t t = kv_gvocab_longest(m->G->v, s, n, &len);
		/* a longest token may be refused where a shorter one fits (a
		 * token that ends inside a character is fine, bytes are bytes) */
		while (t >= 0 && kv_gmatch_accept(m, t) != KV_OK) {
			if (len <= 1)
				return -1;
			t = kv_gvocab_longest(m->G->v, s, len - 1, &len);
		}
		if (t < 0)
			return -1;
		ids[k++] = t;
		s += len;
		n -= len;
	}
	return k;
}
