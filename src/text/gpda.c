/*
 * gpda.c - grammar IR -> pushdown automaton of byte DFAs (gpda.h).
 *
 * Steps, in the order kv_gpda_compile runs them:
 *   scan      rules reachable from the root, their references (count and
 *             referrer), strongly connected components (Tarjan, without
 *             recursion), and which cyclic components are "regular": every
 *             reference inside the component is in tail position, so the
 *             recursion is a loop;
 *   callable  the root and the rules of non-regular cyclic components,
 *             minus those used exactly once from a callable rule (inlined
 *             there; that rule then stays callable);
 *   classes   the byte classes: the partition of 0..255 by every BYTES
 *             range in the grammar;
 *   nfa       per callable rule, a Thompson NFA (byte-class-range edges,
 *             epsilon edges, call edges), inlining what is not callable;
 *             a regular component is inlined as one "instance" whose tail
 *             references are jumps to the other rules' fragments;
 *   dfa       subset construction per rule (classes swept in order, so
 *             runs of classes with the same targets are closed once);
 *   checks    nullable rules, left recursion (a call reachable from a
 *             rule's start through nullable calls only, back to the rule),
 *             fewest bytes to the end of each state (Dijkstra over the
 *             reversed edges, repeated until the rules' minimum lengths
 *             settle), then cut states that cannot reach an end.
 */
#include "text/gpda.h"
#include "base/buf.h"
#include "base/err.h"
#include "base/map.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define INF INT32_MAX
#define MAX_BUILD_DEPTH 20000

/* --- small vectors ----------------------------------------------------------- */

struct ivec {
	int32_t *v;
	int n, c;
};

static int iv_push(struct ivec *a, int32_t x)
{
	if (a->n == a->c) {
		int c = a->c ? 2 * a->c : 16;
		int32_t *v = realloc(a->v, (size_t)c * sizeof *v);
		if (!v)
			return kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		a->v = v;
		a->c = c;
	}
	a->v[a->n++] = x;
	return 0;
}

static void iv_free(struct ivec *a)
{
	free(a->v);
	a->v = NULL;
	a->n = a->c = 0;
}

static int cmp_i32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return x < y ? -1 : x > y;
}

/* --- the compiler's working state ---------------------------------------- */

enum { E_EPS = 0, E_BYTES = 1, E_CALL = 2 };

struct nedge {
	int32_t to, next;
	int32_t a, b;     /* BYTES: class lo, hi; CALL: callable rule */
	uint8_t kind;
};

struct inst {
	int scc;
	int32_t exit;
	struct ivec rules, entries; /* rule -> entry state, in parallel */
};

struct cc {
	const struct kv_gram *g;
	int nr;                    /* IR rules */
	int max_nfa, max_dfa;
	/* scan */
	uint8_t *reach;            /* [nr] */
	int32_t *nref;             /* [nr] references from reachable rules */
	int32_t *referrer;         /* [nr] the (last) rule that references it */
	int32_t *scc;              /* [nr] component id */
	uint8_t *cyclic;           /* [n components] */
	uint8_t *irregular;        /* [n components] a non-tail reference inside */
	int n_scc;
	int32_t *callable;         /* [nr] callable index or -1 */
	int n_callable;
	int32_t *callable_rule;    /* [n_callable] IR rule */
	/* classes */
	uint8_t cls[256];
	int n_cls;
	/* NFA of the rule being built */
	int32_t *head;             /* [n_nfa] first edge */
	int n_nfa, c_nfa;
	struct nedge *e;
	int n_e, c_e;
	int depth;
	/* DFA being grown (all rules) */
	struct ivec dset_off;      /* per DFA state: offset into dset */
	struct ivec dset_len;
	struct ivec dset;          /* NFA state sets, concatenated (of the current rule) */
	struct kv_map *dmap;       /* set bytes -> DFA state (current rule) */
	int32_t *d_rule;           /* per DFA state (global) */
	uint8_t *d_acc;
	int32_t *d_trans;          /* [n_dfa * n_cls] */
	struct ivec d_call_off, d_call_n;
	struct ivec call_rule, call_ret;
	int n_dfa, c_dfa;
	/* closure scratch */
	uint32_t *mark;            /* [c_nfa] stamps */
	uint32_t stamp;
	struct ivec stk, tmp;
	struct kv_map *frag;       /* (rule, exit state) -> fragment entry: an
				    * inlined rule with the same exit is built once */
};

/* --- scan: reachability, references, components --------------------------- */

/* Visit every REF under expr: fn(cc, owner, ref_rule, tail). Iterative on
 * an explicit stack of (expr, tail). */
typedef int (*ref_fn)(struct cc *c, int owner, int rule, int tail);

static int walk_refs(struct cc *c, int owner, int expr, ref_fn fn)
{
	struct ivec st = {0};
	int rc = 0;
	if (iv_push(&st, expr) || iv_push(&st, 1))
		return KV_ERR_NOMEM;
	while (st.n && !rc) {
		int tail = st.v[--st.n];
		int x = st.v[--st.n];
		const struct kv_gx *n = kv_gram_node(c->g, x);
		const int32_t *k = kv_gram_kids(c->g, x);
		switch (n->kind) {
		case KV_GX_REF:
			rc = fn(c, owner, n->a, tail);
			break;
		case KV_GX_SEQ:
			for (int i = 0; i < n->n_kids && !rc; i++)
				rc = iv_push(&st, k[i]) || iv_push(&st, tail && i == n->n_kids - 1) ? KV_ERR_NOMEM : 0;
			break;
		case KV_GX_ALT:
			for (int i = 0; i < n->n_kids && !rc; i++)
				rc = iv_push(&st, k[i]) || iv_push(&st, tail) ? KV_ERR_NOMEM : 0;
			break;
		case KV_GX_REP:
			rc = iv_push(&st, k[0]) || iv_push(&st, tail && n->b == 1) ? KV_ERR_NOMEM : 0;
			break;
		default:
			break;
		}
	}
	iv_free(&st);
	return rc;
}

static int ref_count(struct cc *c, int owner, int rule, int tail)
{
	(void)tail;
	c->nref[rule]++;
	c->referrer[rule] = owner;
	return 0;
}

static int ref_tail(struct cc *c, int owner, int rule, int tail)
{
	if (c->scc[rule] == c->scc[owner]) {
		c->cyclic[c->scc[owner]] = 1;
		if (!tail)
			c->irregular[c->scc[owner]] = 1;
	}
	return 0;
}

/* Successors of a rule (deduplicated is not needed for Tarjan). */
static int succ_collect(struct cc *c, int owner, int rule, int tail)
{
	(void)tail;
	(void)owner;
	return iv_push(&c->tmp, rule);
}

/* --- big rules used many times stay rules of their own ----------------------- */

#define BIG_RULE 400          /* estimated NFA states */
#define EST_CAP 1000000000LL

struct est {
	struct cc *c;
	int64_t *size;            /* [nr] estimate, -1 unknown, -2 being computed */
	int64_t *w;               /* [nr] weighted uses */
};

static int64_t capmul(int64_t a, int64_t b)
{
	return a > EST_CAP / (b ? b : 1) ? EST_CAP : a * b;
}

/* NFA states an expression inlines into (refs to callable or cyclic
 * rules count 1: they are calls or built once). */
static int64_t est_expr(struct est *E, int x, int depth);

static int64_t est_rule(struct est *E, int r, int depth)
{
	struct cc *c = E->c;
	if (c->callable[r] >= 0 || c->cyclic[c->scc[r]])
		return 1;
	if (E->size[r] >= 0)
		return E->size[r];
	if (E->size[r] == -2 || depth > 2000)
		return EST_CAP;
	E->size[r] = -2;
	E->size[r] = est_expr(E, kv_gram_rule_expr(c->g, r), depth + 1);
	return E->size[r];
}

static int64_t est_expr(struct est *E, int x, int depth)
{
	const struct kv_gx *n = kv_gram_node(E->c->g, x);
	const int32_t *k = kv_gram_kids(E->c->g, x);
	int64_t t = 1;
	if (depth > 4000)
		return EST_CAP;
	switch (n->kind) {
	case KV_GX_SEQ:
	case KV_GX_ALT:
		for (int i = 0; i < n->n_kids; i++) {
			t += est_expr(E, k[i], depth + 1);
			if (t > EST_CAP)
				return EST_CAP;
		}
		return t;
	case KV_GX_REP:
		return capmul(est_expr(E, k[0], depth + 1), n->b < 0 ? n->a + 1 : n->b);
	case KV_GX_REF:
		return est_rule(E, n->a, depth + 1);
	default:
		return 1;
	}
}

/* Add w x (how often each site is built) to the uses of the rules that
 * expression x references. */
static void add_uses(struct est *E, int x, int64_t w, int depth)
{
	const struct kv_gx *n = kv_gram_node(E->c->g, x);
	const int32_t *k = kv_gram_kids(E->c->g, x);
	if (depth > 4000)
		return;
	switch (n->kind) {
	case KV_GX_SEQ:
	case KV_GX_ALT:
		for (int i = 0; i < n->n_kids; i++)
			add_uses(E, k[i], w, depth + 1);
		break;
	case KV_GX_REP:
		add_uses(E, k[0], capmul(w, n->b < 0 ? n->a + 1 : n->b), depth + 1);
		break;
	case KV_GX_REF:
		E->w[n->a] = E->w[n->a] + w > EST_CAP ? EST_CAP : E->w[n->a] + w;
		break;
	default:
		break;
	}
}

/*
 * A rule that is not recursive but large, and built more than once (a
 * $def used in many places, the item of an array with maxItems 32), is
 * compiled once as a rule of its own and called, instead of copied into
 * every place: the automaton stays small and its states' masks are
 * shared. Rules are visited from the root down (a topological order of
 * the references between rules that are not recursive), so a rule's uses
 * are known when it is decided.
 */
static int big_callables(struct cc *c)
{
	int nr = c->nr, rc = 0;
	struct est E = {c, malloc((size_t)nr * sizeof *E.size), calloc((size_t)nr, sizeof *E.w)};
	int32_t *order = malloc((size_t)nr * sizeof *order), *st = malloc(((size_t)nr + 1) * 2 * sizeof *st);
	uint8_t *seen = calloc((size_t)nr, 1);
	if (!E.size || !E.w || !order || !st || !seen) {
		rc = kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		goto out;
	}
	for (int r = 0; r < nr; r++)
		E.size[r] = -1;
	/* post-order DFS over references to rules that are not recursive */
	int no = 0;
	for (int r0 = 0; r0 < nr; r0++) {
		if (!c->reach[r0] || seen[r0])
			continue;
		int sp = 0;
		st[0] = r0;
		st[1] = 0;
		sp = 1;
		seen[r0] = 1;
		while (sp) {
			int r = st[2 * (sp - 1)];
			c->tmp.n = 0;
			if (walk_refs(c, r, kv_gram_rule_expr(c->g, r), succ_collect)) {
				rc = KV_ERR_NOMEM;
				goto out;
			}
			int i = st[2 * (sp - 1) + 1];
			if (i < c->tmp.n) {
				st[2 * (sp - 1) + 1]++;
				int q = c->tmp.v[i];
				if (!seen[q] && !c->cyclic[c->scc[q]]) {
					seen[q] = 1;
					st[2 * sp] = q;
					st[2 * sp + 1] = 0;
					sp++;
				}
				continue;
			}
			order[no++] = r;
			sp--;
		}
	}
	/* from the root down: reverse post-order */
	for (int i = no - 1; i >= 0; i--) {
		int r = order[i];
		if (c->callable[r] < 0 && !c->cyclic[c->scc[r]] && E.w[r] >= 2 && est_rule(&E, r, 0) >= BIG_RULE) {
			c->callable[r] = c->n_callable;
			c->callable_rule[c->n_callable++] = r;
			for (int k = 0; k < nr; k++)
				if (E.size[k] != -1 && k != r)
					E.size[k] = -1; /* estimates through r are stale */
		}
		int64_t w = c->callable[r] >= 0 || c->cyclic[c->scc[r]] ? 1 : E.w[r];
		if (r == kv_gram_root(c->g))
			w = 1;
		add_uses(&E, kv_gram_rule_expr(c->g, r), w ? w : 1, 0);
	}
out:
	free(E.size);
	free(E.w);
	free(order);
	free(st);
	free(seen);
	return rc;
}

static int scan(struct cc *c)
{
	const struct kv_gram *g = c->g;
	int nr = c->nr, root = kv_gram_root(g);
	c->reach = calloc((size_t)nr, 1);
	c->nref = calloc((size_t)nr, sizeof *c->nref);
	c->referrer = malloc((size_t)nr * sizeof *c->referrer);
	c->scc = malloc((size_t)nr * sizeof *c->scc);
	c->callable = malloc((size_t)nr * sizeof *c->callable);
	if (!c->reach || !c->nref || !c->referrer || !c->scc || !c->callable)
		return kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
	/* reachability and definitions */
	struct ivec q = {0};
	int rc = iv_push(&q, root);
	c->reach[root] = 1;
	for (int h = 0; h < q.n && !rc; h++) {
		int r = q.v[h];
		if (kv_gram_rule_expr(g, r) < 0) {
			rc = kv_fail(KV_ERR_INVALID, "grammar: rule '%s' is used but never defined", kv_gram_rule_name(g, r));
			break;
		}
		c->tmp.n = 0;
		if ((rc = walk_refs(c, r, kv_gram_rule_expr(g, r), succ_collect)))
			break;
		for (int i = 0; i < c->tmp.n && !rc; i++)
			if (!c->reach[c->tmp.v[i]]) {
				c->reach[c->tmp.v[i]] = 1;
				rc = iv_push(&q, c->tmp.v[i]);
			}
	}
	iv_free(&q);
	if (rc)
		return rc;
	for (int r = 0; r < nr; r++)
		if (c->reach[r] && (rc = walk_refs(c, r, kv_gram_rule_expr(g, r), ref_count)))
			return rc;
	/* Tarjan's components, iteratively */
	int32_t *idx = malloc((size_t)nr * sizeof *idx), *low = malloc((size_t)nr * sizeof *low);
	uint8_t *on = calloc((size_t)nr, 1);
	int32_t *soff = malloc(((size_t)nr + 1) * sizeof *soff);
	struct ivec succ = {0}, tstack = {0}, cstack = {0}, cpos = {0};
	if (!idx || !low || !on || !soff) {
		rc = kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		goto tdone;
	}
	/* successor lists in CSR form */
	for (int r = 0; r < nr; r++) {
		soff[r] = succ.n;
		if (!c->reach[r])
			continue;
		c->tmp.n = 0;
		if ((rc = walk_refs(c, r, kv_gram_rule_expr(g, r), succ_collect)))
			goto tdone;
		for (int i = 0; i < c->tmp.n; i++)
			if ((rc = iv_push(&succ, c->tmp.v[i])))
				goto tdone;
	}
	soff[nr] = succ.n;
	for (int r = 0; r < nr; r++)
		idx[r] = -1;
	int counter = 0;
	c->n_scc = 0;
	for (int r0 = 0; r0 < nr; r0++) {
		if (!c->reach[r0] || idx[r0] >= 0)
			continue;
		if ((rc = iv_push(&cstack, r0)) || (rc = iv_push(&cpos, soff[r0])))
			goto tdone;
		idx[r0] = low[r0] = counter++;
		if ((rc = iv_push(&tstack, r0)))
			goto tdone;
		on[r0] = 1;
		while (cstack.n) {
			int v = cstack.v[cstack.n - 1];
			int p = cpos.v[cpos.n - 1];
			if (p < soff[v + 1]) {
				cpos.v[cpos.n - 1]++;
				int w = succ.v[p];
				if (idx[w] < 0) {
					idx[w] = low[w] = counter++;
					if ((rc = iv_push(&tstack, w)) || (rc = iv_push(&cstack, w)) || (rc = iv_push(&cpos, soff[w])))
						goto tdone;
					on[w] = 1;
				} else if (on[w] && idx[w] < low[v]) {
					low[v] = idx[w];
				}
				continue;
			}
			cstack.n--;
			cpos.n--;
			if (cstack.n) {
				int u = cstack.v[cstack.n - 1];
				if (low[v] < low[u])
					low[u] = low[v];
			}
			if (low[v] == idx[v]) {
				int w;
				do {
					w = tstack.v[--tstack.n];
					on[w] = 0;
					c->scc[w] = c->n_scc;
				} while (w != v);
				c->n_scc++;
			}
		}
	}
	c->cyclic = calloc((size_t)c->n_scc + 1, 1);
	c->irregular = calloc((size_t)c->n_scc + 1, 1);
	if (!c->cyclic || !c->irregular) {
		rc = kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		goto tdone;
	}
	for (int r = 0; r < nr; r++)
		if (c->reach[r] && (rc = walk_refs(c, r, kv_gram_rule_expr(g, r), ref_tail)))
			goto tdone;
	/* callable rules */
	for (int r = 0; r < nr; r++)
		c->callable[r] = -1;
	uint8_t *pin = calloc((size_t)nr, 1), *inl = calloc((size_t)nr, 1);
	if (!pin || !inl) {
		free(pin);
		free(inl);
		rc = kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		goto tdone;
	}
	for (int r = 0; r < nr; r++) {
		if (!c->reach[r] || r == root || !c->cyclic[c->scc[r]] || !c->irregular[c->scc[r]])
			continue;
		int q2 = c->referrer[r];
		int q_callable = q2 == root || (c->cyclic[c->scc[q2]] && c->irregular[c->scc[q2]] && !inl[q2]);
		if (c->nref[r] == 1 && q2 != r && q_callable && !pin[r]) {
			inl[r] = 1;
			pin[q2] = 1;
		}
	}
	c->callable_rule = malloc((size_t)nr * sizeof *c->callable_rule);
	if (!c->callable_rule) {
		free(pin);
		free(inl);
		rc = kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		goto tdone;
	}
	c->n_callable = 0;
	c->callable[root] = c->n_callable;
	c->callable_rule[c->n_callable++] = root;
	for (int r = 0; r < nr; r++)
		if (c->reach[r] && r != root && c->cyclic[c->scc[r]] && c->irregular[c->scc[r]] && !inl[r]) {
			c->callable[r] = c->n_callable;
			c->callable_rule[c->n_callable++] = r;
		}
	free(pin);
	free(inl);
	rc = big_callables(c);
tdone:
	free(idx);
	free(low);
	free(on);
	free(soff);
	iv_free(&succ);
	iv_free(&tstack);
	iv_free(&cstack);
	iv_free(&cpos);
	return rc;
}

/* --- byte classes ------------------------------------------------------------ */

static void classes(struct cc *c)
{
	uint8_t cut[257] = {0};
	cut[0] = 1;
	for (int x = 0; x < kv_gram_n_exprs(c->g); x++) {
		const struct kv_gx *n = kv_gram_node(c->g, x);
		if (n->kind == KV_GX_BYTES) {
			cut[n->a] = 1;
			cut[n->b + 1] = 1;
		}
	}
	int k = -1;
	for (int b = 0; b < 256; b++) {
		if (cut[b])
			k++;
		c->cls[b] = (uint8_t)k;
	}
	c->n_cls = k + 1;
}

/* --- NFA construction ---------------------------------------------------------- */

static int32_t nfa_state(struct cc *c)
{
	if (c->n_nfa >= c->max_nfa) {
		kv_fail(KV_ERR_INVALID, "grammar is too large: more than %d NFA states after inlining "
				       "(large repetition counts or a rule used in many places)", c->max_nfa);
		return -1;
	}
	if (c->n_nfa == c->c_nfa) {
		int n = c->c_nfa ? 2 * c->c_nfa : 1024;
		int32_t *h = realloc(c->head, (size_t)n * sizeof *h);
		uint32_t *m = realloc(c->mark, (size_t)n * sizeof *m);
		if (h)
			c->head = h;
		if (m)
			c->mark = m;
		if (!h || !m) {
			kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
			return -1;
		}
		memset(c->mark + c->c_nfa, 0, (size_t)(n - c->c_nfa) * sizeof *m);
		c->c_nfa = n;
	}
	c->head[c->n_nfa] = -1;
	return c->n_nfa++;
}

static int nfa_edge(struct cc *c, int kind, int32_t from, int32_t to, int32_t a, int32_t b)
{
	if (c->n_e >= 4 * c->max_nfa)
		return kv_fail(KV_ERR_INVALID, "grammar is too large: more than %d NFA edges", 4 * c->max_nfa);
	if (c->n_e == c->c_e) {
		int n = c->c_e ? 2 * c->c_e : 2048;
		struct nedge *e = realloc(c->e, (size_t)n * sizeof *e);
		if (!e)
			return kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		c->e = e;
		c->c_e = n;
	}
	c->e[c->n_e] = (struct nedge){to, c->head[from], a, b, (uint8_t)kind};
	c->head[from] = c->n_e++;
	return 0;
}

static int build(struct cc *c, int x, int32_t in, int32_t out, int tail, struct inst *I);

static int32_t inst_entry(struct cc *c, struct inst *I, int rule)
{
	for (int i = 0; i < I->rules.n; i++)
		if (I->rules.v[i] == rule)
			return I->entries.v[i];
	int32_t e = nfa_state(c);
	if (e < 0 || iv_push(&I->rules, rule) || iv_push(&I->entries, e))
		return -1;
	if (build(c, kv_gram_rule_expr(c->g, rule), e, I->exit, 1, I))
		return -1;
	return e;
}

static int build_ref(struct cc *c, int rule, int32_t in, int32_t out, struct inst *I)
{
	if (c->callable[rule] >= 0)
		return nfa_edge(c, E_CALL, in, out, c->callable[rule], 0);
	int s = c->scc[rule];
	if (I && I->scc == s) { /* a tail reference inside the loop: a jump */
		int32_t e = inst_entry(c, I, rule);
		return e < 0 ? -1 : nfa_edge(c, E_EPS, in, e, 0, 0);
	}
	if (c->cyclic[s] && !c->irregular[s]) { /* a regular component: a new instance of it */
		struct inst J = {.scc = s, .exit = out};
		int32_t e = inst_entry(c, &J, rule);
		iv_free(&J.rules);
		iv_free(&J.entries);
		return e < 0 ? -1 : nfa_edge(c, E_EPS, in, e, 0, 0);
	}
	/* a plain inlined rule: one fragment per (rule, exit); a second use
	 * with the same exit (alternatives that end at the same point, such
	 * as the optional properties of an object) jumps into it */
	uint64_t key = ((uint64_t)(uint32_t)rule << 32) | (uint32_t)out, v;
	if (kv_map_get(c->frag, &key, sizeof key, &v))
		return nfa_edge(c, E_EPS, in, (int32_t)v, 0, 0);
	int32_t e = nfa_state(c);
	if (e < 0)
		return -1;
	if (kv_map_put(c->frag, &key, sizeof key, (uint64_t)e))
		return kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
	if (build(c, kv_gram_rule_expr(c->g, rule), e, out, 0, NULL))
		return -1;
	return nfa_edge(c, E_EPS, in, e, 0, 0);
}

static int build(struct cc *c, int x, int32_t in, int32_t out, int tail, struct inst *I)
{
	const struct kv_gx *n = kv_gram_node(c->g, x);
	const int32_t *k = kv_gram_kids(c->g, x);
	int rc = 0;
	if (++c->depth > MAX_BUILD_DEPTH) {
		c->depth--;
		return kv_fail(KV_ERR_INVALID, "grammar nests too deeply (more than %d levels of rules and groups)",
			       MAX_BUILD_DEPTH);
	}
	switch (n->kind) {
	case KV_GX_EMPTY:
		rc = nfa_edge(c, E_EPS, in, out, 0, 0);
		break;
	case KV_GX_FAIL:
		break;
	case KV_GX_BYTES:
		rc = nfa_edge(c, E_BYTES, in, out, c->cls[n->a], c->cls[n->b]);
		break;
	case KV_GX_SEQ: {
		int32_t cur = in;
		for (int i = 0; i < n->n_kids && !rc; i++) {
			int last = i == n->n_kids - 1;
			int32_t nx = last ? out : nfa_state(c);
			if (nx < 0) {
				rc = -1;
				break;
			}
			rc = build(c, k[i], cur, nx, tail && last, I);
			cur = nx;
		}
		break;
	}
	case KV_GX_ALT:
		for (int i = 0; i < n->n_kids && !rc; i++)
			rc = build(c, k[i], in, out, tail, I);
		break;
	case KV_GX_REP: {
		int mn = n->a, mx = n->b;
		int32_t cur = in;
		for (int i = 0; i < mn && !rc; i++) {
			int last = i == mn - 1 && mx == mn;
			int32_t nx = last ? out : nfa_state(c);
			if (nx < 0) {
				rc = -1;
				break;
			}
			rc = build(c, k[0], cur, nx, 0, I);
			cur = nx;
		}
		if (rc || mx == mn)
			break;
		if (mx < 0) {
			int32_t m = nfa_state(c);
			if (m < 0 || nfa_edge(c, E_EPS, cur, m, 0, 0) || build(c, k[0], m, m, 0, I) ||
			    nfa_edge(c, E_EPS, m, out, 0, 0))
				rc = -1;
			break;
		}
		for (int j = 0; j < mx - mn && !rc; j++) {
			int last = j == mx - mn - 1;
			int32_t nx = last ? out : nfa_state(c);
			if (nx < 0 || nfa_edge(c, E_EPS, cur, out, 0, 0)) {
				rc = -1;
				break;
			}
			rc = build(c, k[0], cur, nx, tail && mx == 1, I);
			cur = nx;
		}
		break;
	}
	case KV_GX_REF:
		rc = build_ref(c, n->a, in, out, I);
		break;
	}
	c->depth--;
	return rc ? -1 : 0;
}

/* --- subset construction ------------------------------------------------------ */

/* Epsilon closure of the NFA states in c->stk (consumed) into out, sorted. */
static int closure(struct cc *c, struct ivec *out)
{
	out->n = 0;
	if (++c->stamp == 0) {
		memset(c->mark, 0, (size_t)c->c_nfa * sizeof *c->mark);
		c->stamp = 1;
	}
	int w = 0;
	for (int i = 0; i < c->stk.n; i++)
		if (c->mark[c->stk.v[i]] != c->stamp) { /* the seeds may repeat */
			c->mark[c->stk.v[i]] = c->stamp;
			c->stk.v[w++] = c->stk.v[i];
		}
	c->stk.n = w;
	while (c->stk.n) {
		int32_t s = c->stk.v[--c->stk.n];
		if (iv_push(out, s))
			return -1;
		for (int32_t e = c->head[s]; e >= 0; e = c->e[e].next)
			if (c->e[e].kind == E_EPS && c->mark[c->e[e].to] != c->stamp) {
				c->mark[c->e[e].to] = c->stamp;
				if (iv_push(&c->stk, c->e[e].to))
					return -1;
			}
	}
	if (out->n)
		qsort(out->v, (size_t)out->n, sizeof *out->v, cmp_i32);
	return 0;
}

static int dfa_grow(struct cc *c)
{
	int n = c->c_dfa ? 2 * c->c_dfa : 256;
	int32_t *r = realloc(c->d_rule, (size_t)n * sizeof *r);
	if (r)
		c->d_rule = r;
	uint8_t *a = realloc(c->d_acc, (size_t)n);
	if (a)
		c->d_acc = a;
	int32_t *t = realloc(c->d_trans, (size_t)n * (size_t)c->n_cls * sizeof *t);
	if (t)
		c->d_trans = t;
	if (!r || !a || !t)
		return kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
	c->c_dfa = n;
	return 0;
}

/* The DFA state for the NFA set in set (sorted): existing or new. */
static int32_t dfa_intern(struct cc *c, const struct ivec *set, int rule, int32_t final)
{
	uint64_t v;
	if (kv_map_get(c->dmap, set->v, (size_t)set->n * sizeof *set->v, &v))
		return (int32_t)v;
	if (c->n_dfa >= c->max_dfa || c->dset.n > 16 * c->max_dfa) {
		kv_fail(KV_ERR_INVALID, "grammar is too large or too ambiguous: more than %d DFA states (rule '%s')",
			c->max_dfa, kv_gram_rule_name(c->g, c->callable_rule[rule]));
		return -1;
	}
	if (c->n_dfa == c->c_dfa && dfa_grow(c))
		return -1;
	int32_t d = c->n_dfa++;
	if (kv_map_put(c->dmap, set->v, (size_t)set->n * sizeof *set->v, (uint64_t)d) ||
	    iv_push(&c->dset_off, c->dset.n) || iv_push(&c->dset_len, set->n)) {
		kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		return -1;
	}
	int acc = 0;
	for (int i = 0; i < set->n; i++) {
		if (iv_push(&c->dset, set->v[i]))
			return -1;
		acc |= set->v[i] == final;
	}
	c->d_rule[d] = rule;
	c->d_acc[d] = (uint8_t)acc;
	return d;
}

struct bedge {
	int32_t lo, hi, to;
};

static int bedge_cmp(const void *a, const void *b)
{
	const struct bedge *x = a, *y = b;
	return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static int determinize(struct cc *c, int rule, int32_t start, int32_t final)
{
	struct ivec set = {0}, tg = {0}, prev = {0};
	struct bedge *be = NULL;
	int c_be = 0, rc = -1;
	kv_map_clear(c->dmap);
	c->dset.n = 0;
	int first = c->n_dfa;
	c->dset_off.n = c->dset_len.n = 0;
	c->stk.n = 0;
	if (iv_push(&c->stk, start) || closure(c, &set) || dfa_intern(c, &set, rule, final) < 0)
		goto out;
	for (int d = first; d < c->n_dfa; d++) {
		int off = c->dset_off.v[d - first], len = c->dset_len.v[d - first];
		int nb = 0;
		/* byte edges of the set */
		for (int i = 0; i < len; i++)
			for (int32_t e = c->head[c->dset.v[off + i]]; e >= 0; e = c->e[e].next) {
				if (c->e[e].kind != E_BYTES)
					continue;
				if (nb == c_be) {
					c_be = c_be ? 2 * c_be : 64;
					struct bedge *q = realloc(be, (size_t)c_be * sizeof *q);
					if (!q) {
						kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
						goto out;
					}
					be = q;
				}
				be[nb++] = (struct bedge){c->e[e].a, c->e[e].b, c->e[e].to};
				off = c->dset_off.v[d - first]; /* dset may not move, but stay safe */
			}
		if (nb)
			qsort(be, (size_t)nb, sizeof *be, bedge_cmp);
		int32_t *row = c->d_trans + (size_t)d * (size_t)c->n_cls;
		int32_t last = -1;
		prev.n = 0;
		int have_prev = 0;
		for (int cl = 0; cl < c->n_cls; cl++) {
			tg.n = 0;
			for (int i = 0; i < nb && be[i].lo <= cl; i++)
				if (be[i].hi >= cl && iv_push(&tg, be[i].to))
					goto out;
			if (!tg.n) {
				row[cl] = -1;
				have_prev = 0;
				continue;
			}
			qsort(tg.v, (size_t)tg.n, sizeof *tg.v, cmp_i32); /* tg.n > 0 here */
			if (have_prev && tg.n == prev.n && !memcmp(tg.v, prev.v, (size_t)tg.n * sizeof *tg.v)) {
				row[cl] = last;
				continue;
			}
			prev.n = 0;
			for (int i = 0; i < tg.n; i++)
				if (iv_push(&prev, tg.v[i]))
					goto out;
			have_prev = 1;
			c->stk.n = 0;
			for (int i = 0; i < tg.n; i++)
				if (iv_push(&c->stk, tg.v[i]))
					goto out;
			if (closure(c, &set))
				goto out;
			last = dfa_intern(c, &set, rule, final);
			if (last < 0)
				goto out;
			row = c->d_trans + (size_t)d * (size_t)c->n_cls; /* d_trans may have moved */
			row[cl] = last;
		}
		/* call edges, grouped by callee */
		if (iv_push(&c->d_call_off, c->call_rule.n))
			goto out;
		int ncalls = 0;
		off = c->dset_off.v[d - first];
		len = c->dset_len.v[d - first];
		for (int i = 0; i < len; i++)
			for (int32_t e = c->head[c->dset.v[off + i]]; e >= 0; e = c->e[e].next) {
				if (c->e[e].kind != E_CALL)
					continue;
				int callee = c->e[e].a, seen = 0;
				for (int j = 0; j < ncalls; j++)
					seen |= c->call_rule.v[c->d_call_off.v[d] + j] == callee;
				if (seen)
					continue;
				/* every call edge of the set to this callee */
				c->stk.n = 0;
				for (int i2 = 0; i2 < len; i2++)
					for (int32_t e2 = c->head[c->dset.v[off + i2]]; e2 >= 0; e2 = c->e[e2].next)
						if (c->e[e2].kind == E_CALL && c->e[e2].a == callee && iv_push(&c->stk, c->e[e2].to))
							goto out;
				if (closure(c, &set))
					goto out;
				int32_t t = dfa_intern(c, &set, rule, final);
				if (t < 0 || iv_push(&c->call_rule, callee) || iv_push(&c->call_ret, t))
					goto out;
				ncalls++;
				off = c->dset_off.v[d - first];
			}
		if (iv_push(&c->d_call_n, ncalls))
			goto out;
	}
	rc = 0;
out:
	iv_free(&set);
	iv_free(&tg);
	iv_free(&prev);
	free(be);
	return rc;
}

/* --- checks over the automaton ----------------------------------------------- */

struct heap {
	int64_t *v; /* (dist << 32) | state */
	int n, c;
};

static int hpush(struct heap *h, int64_t x)
{
	if (h->n == h->c) {
		int c = h->c ? 2 * h->c : 1024;
		int64_t *v = realloc(h->v, (size_t)c * sizeof *v);
		if (!v)
			return kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		h->v = v;
		h->c = c;
	}
	int i = h->n++;
	h->v[i] = x;
	while (i > 0 && h->v[(i - 1) / 2] > h->v[i]) {
		int64_t t = h->v[i];
		h->v[i] = h->v[(i - 1) / 2];
		h->v[(i - 1) / 2] = t;
		i = (i - 1) / 2;
	}
	return 0;
}

static int64_t hpop(struct heap *h)
{
	int64_t top = h->v[0];
	h->v[0] = h->v[--h->n];
	int i = 0;
	for (;;) {
		int l = 2 * i + 1, r = l + 1, m = i;
		if (l < h->n && h->v[l] < h->v[m])
			m = l;
		if (r < h->n && h->v[r] < h->v[m])
			m = r;
		if (m == i)
			break;
		int64_t t = h->v[i];
		h->v[i] = h->v[m];
		h->v[m] = t;
		i = m;
	}
	return top;
}

static int64_t addsat(int64_t a, int64_t b)
{
	return a >= INF || b >= INF || a + b >= INF ? INF : a + b;
}

/*
 * dist[s]: fewest bytes from s to ACCEPT of its rule; minlen[r] = dist of
 * its start. Dijkstra from every ACCEPT state over reversed edges (byte
 * edges weigh 1, call edges the callee's current minlen), repeated while
 * a minlen drops.
 */
static int distances(struct kv_gpda *a, int32_t *dist)
{
	int n = a->n_states, rc = -1;
	/* reversed byte edges in CSR: pred of t */
	int32_t *cnt = calloc((size_t)n + 1, sizeof *cnt), *pred = NULL, *fill = NULL;
	int32_t *cpred_off = calloc((size_t)n + 1, sizeof *cpred_off), *cpred = NULL;
	struct heap h = {0};
	if (!cnt || !cpred_off)
		goto nomem;
	size_t ne = 0;
	for (int s = 0; s < n; s++) {
		if (a->st[s].row < 0)
			continue;
		const int32_t *row = a->trans + (size_t)a->st[s].row * (size_t)a->n_cls;
		for (int k = 0; k < a->n_cls; k++)
			if (row[k] >= 0 && (k == 0 || row[k] != row[k - 1])) {
				cnt[row[k]]++;
				ne++;
			}
	}
	pred = malloc((ne + 1) * sizeof *pred);
	fill = calloc((size_t)n + 1, sizeof *fill);
	if (!pred || !fill)
		goto nomem;
	for (int s = 1; s <= n; s++)
		cnt[s] += cnt[s - 1];
	/* cnt[t] is now the end of t's slice; start = cnt[t-1] */
	for (int s = 0; s < n; s++) {
		if (a->st[s].row < 0)
			continue;
		const int32_t *row = a->trans + (size_t)a->st[s].row * (size_t)a->n_cls;
		for (int k = 0; k < a->n_cls; k++)
			if (row[k] >= 0 && (k == 0 || row[k] != row[k - 1])) {
				int t = row[k];
				int start = t ? cnt[t - 1] : 0;
				pred[start + fill[t]++] = s;
			}
	}
	/* reversed call edges: ret <- s (the weight is looked up per pass) */
	for (int s = 0; s < n; s++)
		for (int i = 0; i < a->st[s].n_calls; i++)
			cpred_off[a->call_ret[a->st[s].call0 + i] + 1]++;
	for (int s = 1; s <= n; s++)
		cpred_off[s] += cpred_off[s - 1];
	cpred = malloc(((size_t)a->n_call_edges + 1) * sizeof *cpred);
	memset(fill, 0, ((size_t)n + 1) * sizeof *fill);
	if (!cpred)
		goto nomem;
	for (int s = 0; s < n; s++)
		for (int i = 0; i < a->st[s].n_calls; i++) {
			int e = a->st[s].call0 + i, t = a->call_ret[e];
			cpred[cpred_off[t] + fill[t]++] = e;
		}
	int32_t *caller = malloc(((size_t)a->n_call_edges + 1) * sizeof *caller);
	if (!caller)
		goto nomem;
	for (int s = 0; s < n; s++)
		for (int i = 0; i < a->st[s].n_calls; i++)
			caller[a->st[s].call0 + i] = s;
	for (int r = 0; r < a->n_rules; r++)
		a->rule_minlen[r] = INF;
	for (int pass = 0; pass <= a->n_rules + 1; pass++) {
		for (int s = 0; s < n; s++)
			dist[s] = INF;
		h.n = 0;
		for (int s = 0; s < n; s++)
			if (a->st[s].flags & KV_GS_ACCEPT) {
				dist[s] = 0;
				if (hpush(&h, (int64_t)s)) {
					free(caller);
					goto out;
				}
			}
		while (h.n) {
			int64_t top = hpop(&h);
			int s = (int)(top & 0xFFFFFFFF);
			int64_t d = top >> 32;
			if (d != dist[s])
				continue;
			int start = s ? cnt[s - 1] : 0;
			for (int i = start; i < cnt[s]; i++) {
				int p = pred[i];
				int64_t nd = addsat(d, 1);
				if (nd < dist[p]) {
					dist[p] = (int32_t)nd;
					if (hpush(&h, (nd << 32) | p)) {
						free(caller);
						goto out;
					}
				}
			}
			for (int i = cpred_off[s]; i < cpred_off[s + 1]; i++) {
				int e = cpred[i], p = caller[e];
				int64_t nd = addsat(d, a->rule_minlen[a->call_rule[e]]);
				if (nd < dist[p]) {
					dist[p] = (int32_t)nd;
					if (hpush(&h, (nd << 32) | p)) {
						free(caller);
						goto out;
					}
				}
			}
		}
		int changed = 0;
		for (int r = 0; r < a->n_rules; r++)
			if (dist[a->rule_start[r]] != a->rule_minlen[r]) {
				a->rule_minlen[r] = dist[a->rule_start[r]];
				changed = 1;
			}
		if (!changed)
			break;
	}
	free(caller);
	rc = 0;
	goto out;
nomem:
	kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
out:
	free(cnt);
	free(pred);
	free(fill);
	free(cpred_off);
	free(cpred);
	free(h.v);
	return rc;
}

/*
 * Nullable rules, then the left-call graph and its cycles. eps[s]: s can
 * reach ACCEPT of its rule without reading a byte (ACCEPT itself, or a
 * call of a nullable rule returning to an eps state). A worklist
 * propagates it backwards, so the cost is linear in states + call edges.
 */
static int left_recursion(struct kv_gpda *a, const struct kv_gram *g, const int32_t *callable_rule)
{
	int n = a->n_states, R = a->n_rules, E = a->n_call_edges, rc = -1;
	uint8_t *nullable = calloc((size_t)R + 1, 1), *eps = calloc((size_t)n + 1, 1);
	int32_t *caller = malloc(((size_t)E + 1) * sizeof *caller);
	int32_t *by_ret = malloc(((size_t)E + 1) * sizeof *by_ret), *by_callee = malloc(((size_t)E + 1) * sizeof *by_callee);
	int32_t *ret_off = calloc((size_t)n + 2, sizeof *ret_off), *callee_off = calloc((size_t)R + 2, sizeof *callee_off);
	int32_t *work = malloc(((size_t)n + 1) * sizeof *work), *seen = calloc((size_t)n + 1, sizeof *seen);
	struct ivec adj_to = {0}, adj_off = {0};
	int32_t *color = NULL, *path = NULL;
	if (!nullable || !eps || !caller || !by_ret || !by_callee || !ret_off || !callee_off || !work || !seen) {
		kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		goto out;
	}
	for (int s = 0; s < n; s++)
		for (int i = 0; i < a->st[s].n_calls; i++) {
			int e = a->st[s].call0 + i;
			caller[e] = s;
			ret_off[a->call_ret[e] + 1]++;
			callee_off[a->call_rule[e] + 1]++;
		}
	for (int s = 0; s < n; s++)
		ret_off[s + 1] += ret_off[s];
	for (int r = 0; r < R; r++)
		callee_off[r + 1] += callee_off[r];
	{
		int32_t *fr = calloc((size_t)n + 1, sizeof *fr), *fc = calloc((size_t)R + 1, sizeof *fc);
		if (!fr || !fc) {
			free(fr);
			free(fc);
			kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
			goto out;
		}
		for (int s = 0; s < n; s++)
			for (int i = 0; i < a->st[s].n_calls; i++) {
				int e = a->st[s].call0 + i, t = a->call_ret[e], q = a->call_rule[e];
				by_ret[ret_off[t] + fr[t]++] = e;
				by_callee[callee_off[q] + fc[q]++] = e;
			}
		free(fr);
		free(fc);
	}
	int wn = 0;
	for (int s = 0; s < n; s++)
		if (a->st[s].flags & KV_GS_ACCEPT) {
			eps[s] = 1;
			work[wn++] = s;
		}
	while (wn) {
		int s = work[--wn];
		int r = a->st[s].rule;
		if (s == a->rule_start[r] && !nullable[r]) {
			nullable[r] = 1;
			for (int i = callee_off[r]; i < callee_off[r + 1]; i++) {
				int e = by_callee[i], p = caller[e];
				if (eps[a->call_ret[e]] && !eps[p]) {
					eps[p] = 1;
					work[wn++] = p;
				}
			}
		}
		for (int i = ret_off[s]; i < ret_off[s + 1]; i++) {
			int e = by_ret[i], p = caller[e];
			if (nullable[a->call_rule[e]] && !eps[p]) {
				eps[p] = 1;
				work[wn++] = p;
			}
		}
	}
	/* left-call edges: calls reachable from a rule's start through
	 * nullable calls only */
	for (int r = 0; r < R; r++) {
		if (iv_push(&adj_off, adj_to.n))
			goto out;
		int sp = 0;
		work[sp++] = a->rule_start[r];
		seen[a->rule_start[r]] = r + 1;
		while (sp) {
			int s = work[--sp];
			for (int i = 0; i < a->st[s].n_calls; i++) {
				int e = a->st[s].call0 + i;
				if (iv_push(&adj_to, a->call_rule[e]))
					goto out;
				if (nullable[a->call_rule[e]] && seen[a->call_ret[e]] != r + 1) {
					seen[a->call_ret[e]] = r + 1;
					work[sp++] = a->call_ret[e];
				}
			}
		}
	}
	if (iv_push(&adj_off, adj_to.n))
		goto out;
	/* a cycle: iterative DFS with colours */
	color = calloc((size_t)R + 1, sizeof *color);
	path = malloc(((size_t)R + 1) * 2 * sizeof *path);
	if (!color || !path) {
		kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		goto out;
	}
	for (int r0 = 0; r0 < R; r0++) {
		if (color[r0])
			continue;
		int sp = 0;
		path[0] = r0;
		path[1] = adj_off.v[r0];
		sp = 1;
		color[r0] = 1;
		while (sp) {
			int v = path[(sp - 1) * 2], i = path[(sp - 1) * 2 + 1];
			if (i >= adj_off.v[v + 1]) {
				color[v] = 2;
				sp--;
				continue;
			}
			path[(sp - 1) * 2 + 1]++;
			int w = adj_to.v[i];
			if (color[w] == 1) {
				struct kv_buf b = KV_BUF_INIT;
				int from = 0;
				while (from < sp && path[from * 2] != w)
					from++;
				for (int k = from; k < sp; k++)
					kv_buf_printf(&b, "%s -> ", kv_gram_rule_name(g, callable_rule[path[k * 2]]));
				kv_buf_adds(&b, kv_gram_rule_name(g, callable_rule[w]));
				kv_fail(KV_ERR_INVALID, "grammar has left recursion: rule '%s' can reach itself without reading "
					"a byte (%s)", kv_gram_rule_name(g, callable_rule[w]), b.p ? b.p : "");
				kv_buf_free(&b);
				goto out;
			}
			if (!color[w]) {
				color[w] = 1;
				path[sp * 2] = w;
				path[sp * 2 + 1] = adj_off.v[w];
				sp++;
			}
		}
	}
	rc = 0;
out:
	free(nullable);
	free(eps);
	free(caller);
	free(by_ret);
	free(by_callee);
	free(ret_off);
	free(callee_off);
	free(work);
	free(seen);
	iv_free(&adj_to);
	iv_free(&adj_off);
	free(color);
	free(path);
	return rc;
}

/* --- the whole compile ---------------------------------------------------------- */

void kv_gpda_free(struct kv_gpda *a)
{
	if (!a)
		return;
	for (int r = 0; r < a->n_rules; r++)
		if (a->rule_name)
			free(a->rule_name[r]);
	free(a->rule_name);
	free(a->st);
	free(a->trans);
	free(a->call_rule);
	free(a->call_ret);
	free(a->rule_start);
	free(a->rule_minlen);
	free(a->rule_called);
	free(a);
}

static void cc_free(struct cc *c)
{
	free(c->reach);
	free(c->nref);
	free(c->referrer);
	free(c->scc);
	free(c->cyclic);
	free(c->irregular);
	free(c->callable);
	free(c->callable_rule);
	free(c->head);
	free(c->e);
	free(c->mark);
	iv_free(&c->dset_off);
	iv_free(&c->dset_len);
	iv_free(&c->dset);
	kv_map_destroy(c->dmap);
	kv_map_destroy(c->frag);
	free(c->d_rule);
	free(c->d_acc);
	free(c->d_trans);
	iv_free(&c->d_call_off);
	iv_free(&c->d_call_n);
	iv_free(&c->call_rule);
	iv_free(&c->call_ret);
	iv_free(&c->stk);
	iv_free(&c->tmp);
}

int kv_gpda_compile(const struct kv_gram *g, const struct kv_gpda_limits *lim, struct kv_gpda **out)
{
	struct cc c = {.g = g, .nr = kv_gram_n_rules(g)};
	struct kv_gpda *a = NULL;
	int32_t *dist = NULL, *remap = NULL;
	int rc;
	*out = NULL;
	if ((rc = kv_gram_error(g)))
		return rc;
	if (kv_gram_root(g) < 0)
		return kv_fail(KV_ERR_INVALID, "grammar has no root rule");
	c.max_nfa = lim && lim->max_nfa_states > 0 ? lim->max_nfa_states : 2000000;
	c.max_dfa = lim && lim->max_dfa_states > 0 ? lim->max_dfa_states : 200000;
	if ((rc = scan(&c)))
		goto fail;
	classes(&c);
	if (!(c.dmap = kv_map_create(1024)) || !(c.frag = kv_map_create(256))) {
		rc = kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		goto fail;
	}
	a = calloc(1, sizeof *a);
	if (!a) {
		rc = kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		goto fail;
	}
	a->n_rules = c.n_callable;
	a->rule_start = malloc((size_t)c.n_callable * sizeof *a->rule_start);
	a->rule_minlen = malloc((size_t)c.n_callable * sizeof *a->rule_minlen);
	a->rule_called = calloc((size_t)c.n_callable, 1);
	a->rule_name = calloc((size_t)c.n_callable, sizeof *a->rule_name);
	if (!a->rule_start || !a->rule_minlen || !a->rule_called || !a->rule_name) {
		rc = kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		goto fail;
	}
	for (int r = 0; r < c.n_callable; r++) {
		int ir = c.callable_rule[r];
		if (!(a->rule_name[r] = strdup(kv_gram_rule_name(g, ir)))) {
			rc = kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
			goto fail;
		}
		c.n_nfa = 0;
		c.n_e = 0;
		kv_map_clear(c.frag);
		int32_t s0 = nfa_state(&c), f = nfa_state(&c);
		rc = KV_ERR_INVALID;
		if (s0 < 0 || f < 0)
			goto fail;
		if (c.cyclic[c.scc[ir]] && !c.irregular[c.scc[ir]]) {
			struct inst I = {.scc = c.scc[ir], .exit = f};
			int32_t e = inst_entry(&c, &I, ir);
			iv_free(&I.rules);
			iv_free(&I.entries);
			if (e < 0 || nfa_edge(&c, E_EPS, s0, e, 0, 0))
				goto fail;
		} else if (build(&c, kv_gram_rule_expr(g, ir), s0, f, 1, NULL)) {
			goto fail;
		}
		a->rule_start[r] = c.n_dfa;
		if (determinize(&c, r, s0, f))
			goto fail;
	}
	/* the automaton */
	int n = c.n_dfa;
	a->n_states = n;
	a->n_cls = c.n_cls;
	memcpy(a->cls, c.cls, 256);
	for (int b = 255; b >= 0; b--)
		a->cls_byte[c.cls[b]] = (uint8_t)b;
	a->root = 0;
	a->st = calloc((size_t)n, sizeof *a->st);
	a->n_call_edges = c.call_rule.n;
	a->call_rule = malloc(((size_t)c.call_rule.n + 1) * sizeof *a->call_rule);
	a->call_ret = malloc(((size_t)c.call_rule.n + 1) * sizeof *a->call_ret);
	if (!a->st || !a->call_rule || !a->call_ret) {
		rc = kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		goto fail;
	}
	if (c.call_rule.n) {
		memcpy(a->call_rule, c.call_rule.v, (size_t)c.call_rule.n * sizeof *a->call_rule);
		memcpy(a->call_ret, c.call_ret.v, (size_t)c.call_rule.n * sizeof *a->call_ret);
	}
	/* rows: temporarily one per state (d_trans), compacted below */
	a->trans = c.d_trans;
	c.d_trans = NULL;
	a->n_rows = n;
	for (int s = 0; s < n; s++) {
		a->st[s].rule = c.d_rule[s];
		a->st[s].flags = c.d_acc[s] ? KV_GS_ACCEPT : 0;
		a->st[s].row = s;
		a->st[s].call0 = c.d_call_off.v[s];
		a->st[s].n_calls = c.d_call_n.v[s];
	}
	/* checks on the full automaton */
	dist = malloc(((size_t)n + 1) * sizeof *dist);
	if (!dist) {
		rc = kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		goto fail;
	}
	if ((rc = distances(a, dist) ? KV_ERR_NOMEM : 0))
		goto fail;
	if (dist[a->rule_start[a->root]] >= INF) {
		rc = kv_fail(KV_ERR_INVALID, "grammar matches no string at all (rule '%s' can never end)",
			     a->rule_name[a->root]);
		goto fail;
	}
	/* cut what cannot end: byte edges to dead states, calls of rules
	 * that cannot end or returning to dead states */
	for (int s = 0; s < n; s++) {
		int32_t *row = a->trans + (size_t)s * (size_t)a->n_cls;
		int any = 0;
		for (int k = 0; k < a->n_cls; k++) {
			if (row[k] >= 0 && dist[row[k]] >= INF)
				row[k] = -1;
			any |= row[k] >= 0;
		}
		a->st[s].row = any ? s : -1;
		int w = 0;
		int32_t c0 = a->st[s].call0;
		for (int i = 0; i < a->st[s].n_calls; i++) {
			int e = c0 + i;
			if (a->rule_minlen[a->call_rule[e]] >= INF || dist[a->call_ret[e]] >= INF)
				continue;
			a->call_rule[c0 + w] = a->call_rule[e];
			a->call_ret[c0 + w] = a->call_ret[e];
			w++;
		}
		a->st[s].n_calls = w;
		a->st[s].dist = dist[s];
	}
	if ((rc = left_recursion(a, g, c.callable_rule) ? KV_ERR_INVALID : 0))
		goto fail;
	/* compact the rows */
	remap = malloc(((size_t)n + 1) * sizeof *remap);
	if (!remap) {
		rc = kv_fail(KV_ERR_NOMEM, "grammar compiler: out of memory");
		goto fail;
	}
	int nrow = 0;
	for (int s = 0; s < n; s++) {
		if (a->st[s].row < 0)
			continue;
		if (nrow != s)
			memmove(a->trans + (size_t)nrow * (size_t)a->n_cls, a->trans + (size_t)s * (size_t)a->n_cls,
				(size_t)a->n_cls * sizeof *a->trans);
		a->st[s].row = nrow++;
	}
	a->n_rows = nrow;
	int32_t *t2 = realloc(a->trans, ((size_t)nrow * (size_t)a->n_cls + 1) * sizeof *t2);
	if (t2)
		a->trans = t2;
	for (int s = 0; s < n; s++) {
		struct kv_gps *p = &a->st[s];
		uint8_t f = p->flags & KV_GS_ACCEPT;
		if (p->row >= 0)
			f |= KV_GS_BYTES;
		if (p->n_calls)
			f |= KV_GS_CALLS;
		if ((f & KV_GS_BYTES) && !(f & (KV_GS_ACCEPT | KV_GS_CALLS)))
			f |= KV_GS_SIMPLE;
		if ((f & KV_GS_ACCEPT) && !(f & (KV_GS_BYTES | KV_GS_CALLS)))
			f |= KV_GS_TAILRET;
		p->flags = f;
		for (int i = 0; i < p->n_calls; i++)
			a->rule_called[a->call_rule[p->call0 + i]] = 1;
	}
	a->bytes = sizeof *a + (size_t)n * sizeof *a->st + (size_t)nrow * (size_t)a->n_cls * sizeof *a->trans +
		   (size_t)a->n_call_edges * 8 + (size_t)a->n_rules * 16;
	free(dist);
	free(remap);
	cc_free(&c);
	*out = a;
	return KV_OK;
fail:
	if (!rc)
		rc = KV_ERR_INVALID;
	free(dist);
	free(remap);
	cc_free(&c);
	kv_gpda_free(a);
	return rc;
}
