/*
 * jinja_parse.c - the Jinja parser (jinja2.parser's grammar and
 * precedence) from tokens to the AST, and kv_tmpl_compile / kv_tmpl_free
 * (template.h). Parse errors name the template, line and column.
 */
#include "text/jinja_int.h"

/* ------------------------------------------------------------------------
 * Parser (jinja2.parser's grammar and precedence)
 * ---------------------------------------------------------------------- */

struct nvec {
	struct node **v;
	int n, cap;
};

static void nv_push(struct cstate *cs, struct nvec *nv, struct node *x)
{
	if (nv->n == nv->cap) {
		int nc = nv->cap ? nv->cap * 2 : 8;
		struct node **p = kj_ar_alloc_raw(&cs->t->ar, (size_t)nc * sizeof *p);
		if (!p)
			kj_cnomem(cs);
		if (nv->n)
			memcpy(p, nv->v, (size_t)nv->n * sizeof *p);
		nv->v = p;
		nv->cap = nc;
	}
	nv->v[nv->n++] = x;
}

static struct tok *cur(struct cstate *cs)
{
	return &cs->tk[cs->i];
}

static struct tok *look(struct cstate *cs)
{
	return cs->i + 1 < cs->nt ? &cs->tk[cs->i + 1] : &cs->tk[cs->nt - 1];
}

static struct tok *next_tok(struct cstate *cs)
{
	struct tok *k = &cs->tk[cs->i];
	if (cs->i + 1 < cs->nt)
		cs->i++;
	return k;
}

static int tok_is_name(const struct tok *k, const char *name)
{
	return k->t == K_NAME && k->n == strlen(name) && !memcmp(k->p, name, k->n);
}

static int tok_is_op(const struct tok *k, int op)
{
	return k->t == K_OP && k->op == op;
}

static const char *describe(const struct tok *k, char *buf, size_t cap)
{
	switch (k->t) {
	case K_EOF: return "end of template";
	case K_DATA: return "template data";
	case K_VBEGIN: return "begin of print statement";
	case K_VEND: return "end of print statement";
	case K_BBEGIN: return "begin of statement block";
	case K_BEND: return "end of statement block";
	case K_NAME: snprintf(buf, cap, "%.*s", (int)(k->n > 60 ? 60 : k->n), k->p); return buf;
	case K_STR: return "string";
	case K_INT: return "integer";
	case K_FLOAT: return "float";
	case K_OP: return kj_op_text[k->op];
	}
	return "?";
}

static void __attribute__((noreturn)) unexpected(struct cstate *cs, const char *expected)
{
	char b[80];
	struct tok *k = cur(cs);
	if (k->t == K_EOF)
		kj_cfail(cs, k->off, "unexpected end of template%s%s", expected ? ", expected " : "",
		      expected ? expected : "");
	kj_cfail(cs, k->off, "unexpected '%s'%s%s", describe(k, b, sizeof b), expected ? ", expected " : "",
	      expected ? expected : "");
}

static void expect_op(struct cstate *cs, int op)
{
	char want[16];
	if (!tok_is_op(cur(cs), op)) {
		snprintf(want, sizeof want, "'%s'", kj_op_text[op]);
		unexpected(cs, want);
	}
	next_tok(cs);
}

static void expect_kind(struct cstate *cs, int kind, const char *what)
{
	if (cur(cs)->t != kind)
		unexpected(cs, what);
	next_tok(cs);
}

static struct tok *expect_name(struct cstate *cs)
{
	if (cur(cs)->t != K_NAME)
		unexpected(cs, "a name");
	return next_tok(cs);
}

static struct node *mk(struct cstate *cs, int kind, const struct tok *at)
{
	struct node *x = kj_calloc_c(cs, sizeof *x);
	x->kind = (uint8_t)kind;
	kj_pos_of(cs->t, at->off, &x->line, &x->col);
	return x;
}

static const char *dup_name(struct cstate *cs, const char *p, size_t n)
{
	char *s = kj_calloc_c(cs, n + 1);
	memcpy(s, p, n);
	return s;
}

static int intern(struct cstate *cs, const char *p, size_t n)
{
	struct kv_tmpl *t = cs->t;
	uint64_t id;
	if (kv_map_get(t->syms, p, n, &id))
		return (int)id;
	if (t->n_syms == t->cap_syms) {
		int nc = t->cap_syms ? t->cap_syms * 2 : 32;
		const char **v = kj_ar_alloc_raw(&t->ar, (size_t)nc * sizeof *v);
		if (!v)
			kj_cnomem(cs);
		if (t->n_syms)
			memcpy(v, t->sym_names, (size_t)t->n_syms * sizeof *v);
		t->sym_names = v;
		t->cap_syms = nc;
	}
	t->sym_names[t->n_syms] = dup_name(cs, p, n);
	if (kv_map_put(t->syms, p, n, (uint64_t)t->n_syms))
		kj_cnomem(cs);
	return t->n_syms++;
}

static void depth_in(struct cstate *cs)
{
	if (++cs->depth > TM_MAX_PARSE_DEPTH)
		kj_cfail(cs, cur(cs)->off, "expression or blocks nested deeper than %d", TM_MAX_PARSE_DEPTH);
}

static struct node *p_expression(struct cstate *cs, int with_condexpr);
static struct node *p_tuple(struct cstate *cs, int simplified, int with_condexpr, const char *extra_end,
			    int explicit_paren);
static struct node *p_unary(struct cstate *cs, int with_filter);
static struct node *p_primary(struct cstate *cs);
static struct node *p_postfix(struct cstate *cs, struct node *x);
static struct node *p_filter(struct cstate *cs, struct node *x, int start_inline);

/* Call arguments: positional, then keyword ones (star-args and
 * double-star-kwargs are not supported). Fills v/nv (positional) and w/nw/kwn (keywords). */
static void p_call_args(struct cstate *cs, struct node *x)
{
	struct nvec pos = {0}, kw = {0};
	const char *names[64];
	int nk = 0, need_comma = 0;
	expect_op(cs, O_LPAREN);
	while (!tok_is_op(cur(cs), O_RPAREN)) {
		if (need_comma) {
			expect_op(cs, O_COMMA);
			if (tok_is_op(cur(cs), O_RPAREN))
				break;
		}
		if (tok_is_op(cur(cs), O_MUL) || tok_is_op(cur(cs), O_POW))
			cs->err = KV_ERR_UNSUPPORTED,
			kj_cfail(cs, cur(cs)->off, "*args and **kwargs in calls are not supported");
		if (cur(cs)->t == K_NAME && tok_is_op(look(cs), O_ASSIGN)) {
			struct tok *k = next_tok(cs);
			next_tok(cs);
			if (nk == 64)
				kj_cfail(cs, k->off, "too many keyword arguments");
			names[nk++] = dup_name(cs, k->p, k->n);
			nv_push(cs, &kw, p_expression(cs, 1));
		} else {
			if (kw.n)
				kj_cfail(cs, cur(cs)->off, "invalid syntax for function call expression");
			nv_push(cs, &pos, p_expression(cs, 1));
		}
		need_comma = 1;
	}
	expect_op(cs, O_RPAREN);
	x->v = pos.v;
	x->nv = pos.n;
	x->w = kw.v;
	x->nw = kw.n;
	if (nk) {
		x->kwn = kj_calloc_c(cs, (size_t)nk * sizeof *x->kwn);
		memcpy(x->kwn, names, (size_t)nk * sizeof *names);
	}
}

static struct node *p_filter(struct cstate *cs, struct node *x, int start_inline)
{
	while (tok_is_op(cur(cs), O_PIPE) || start_inline) {
		if (!start_inline)
			next_tok(cs);
		struct tok *k = expect_name(cs);
		struct node *f = mk(cs, N_FILTER, k);
		int id = kj_find_name(kj_filt_names, F__COUNT, k->p, k->n);
		if (tok_is_op(cur(cs), O_DOT) || id < 0)
			kj_cfail(cs, k->off, "no filter named '%.*s'", (int)(k->n > 60 ? 60 : k->n), k->p);
		if (id >= F_FIRST_UNSUPPORTED) {
			cs->err = KV_ERR_UNSUPPORTED;
			kj_cfail(cs, k->off, "filter '%s' is not supported", kj_filt_names[id]);
		}
		f->fid = (uint16_t)id;
		f->s = kj_filt_names[id];
		f->a = x;
		if (tok_is_op(cur(cs), O_LPAREN))
			p_call_args(cs, f);
		x = f;
		start_inline = 0;
	}
	return x;
}

static struct node *p_test(struct cstate *cs, struct node *x)
{
	struct tok *is = next_tok(cs);
	int negated = 0;
	if (tok_is_name(cur(cs), "not")) {
		next_tok(cs);
		negated = 1;
	}
	struct tok *k = expect_name(cs);
	int id = kj_find_name(kj_test_names, T__COUNT, k->p, k->n);
	if (tok_is_op(cur(cs), O_DOT) || id < 0)
		kj_cfail(cs, k->off, "no test named '%.*s'", (int)(k->n > 60 ? 60 : k->n), k->p);
	struct node *t = mk(cs, N_TEST, is);
	t->fid = (uint16_t)id;
	t->s = kj_test_names[id];
	t->a = x;
	struct tok *c = cur(cs);
	if (tok_is_op(c, O_LPAREN)) {
		p_call_args(cs, t);
	} else if ((c->t == K_NAME || c->t == K_STR || c->t == K_INT || c->t == K_FLOAT ||
		    tok_is_op(c, O_LBRACKET) || tok_is_op(c, O_LBRACE)) &&
		   !tok_is_name(c, "else") && !tok_is_name(c, "or") && !tok_is_name(c, "and")) {
		if (tok_is_name(c, "is"))
			kj_cfail(cs, c->off, "you cannot chain multiple tests with is");
		struct node *arg = p_postfix(cs, p_primary(cs));
		t->v = kj_calloc_c(cs, sizeof *t->v);
		t->v[0] = arg;
		t->nv = 1;
	}
	if (negated) {
		struct node *n = mk(cs, N_NOT, is);
		n->a = t;
		return n;
	}
	return t;
}

static struct node *p_subscribed(struct cstate *cs)
{
	struct tok *at = cur(cs);
	struct node *args[3] = {NULL, NULL, NULL};
	if (tok_is_op(cur(cs), O_COLON)) {
		next_tok(cs);
	} else {
		struct node *e = p_expression(cs, 1);
		if (!tok_is_op(cur(cs), O_COLON))
			return e;
		next_tok(cs);
		args[0] = e;
	}
	if (tok_is_op(cur(cs), O_COLON)) {
		/* stop omitted */
	} else if (!tok_is_op(cur(cs), O_RBRACKET) && !tok_is_op(cur(cs), O_COMMA)) {
		args[1] = p_expression(cs, 1);
	}
	if (tok_is_op(cur(cs), O_COLON)) {
		next_tok(cs);
		if (!tok_is_op(cur(cs), O_RBRACKET) && !tok_is_op(cur(cs), O_COMMA))
			args[2] = p_expression(cs, 1);
	}
	struct node *s = mk(cs, N_SLICE, at);
	s->a = args[0];
	s->b = args[1];
	s->c = args[2];
	return s;
}

static struct node *p_subscript(struct cstate *cs, struct node *x)
{
	struct tok *k = next_tok(cs);
	if (k->op == O_DOT) {
		struct tok *a = next_tok(cs);
		if (a->t == K_NAME) {
			struct node *g = mk(cs, N_GETATTR, k);
			g->a = x;
			g->s = dup_name(cs, a->p, a->n);
			g->sn = a->n;
			g->mid[0] = (int16_t)kj_meth_lookup(V_STR, 0, a->p, a->n);
			g->mid[1] = (int16_t)kj_meth_lookup(V_DICT, 0, a->p, a->n);
			g->mid[2] = (int16_t)kj_meth_lookup(V_LIST, L_LIST, a->p, a->n);
			g->mid[3] = (int16_t)kj_meth_lookup(V_LIST, L_TUPLE, a->p, a->n);
			g->mid[4] = (int16_t)kj_meth_lookup(V_LOOP, 0, a->p, a->n);
			return g;
		}
		if (a->t != K_INT)
			kj_cfail(cs, a->off, "expected a name or number after '.'");
		struct node *g = mk(cs, N_GETITEM, k), *c = mk(cs, N_CONST, a);
		c->k = vint(a->i);
		g->a = x;
		g->b = c;
		return g;
	}
	/* '[' */
	struct nvec args = {0};
	while (!tok_is_op(cur(cs), O_RBRACKET)) {
		if (args.n)
			expect_op(cs, O_COMMA);
		nv_push(cs, &args, p_subscribed(cs));
	}
	expect_op(cs, O_RBRACKET);
	struct node *g = mk(cs, N_GETITEM, k);
	g->a = x;
	if (args.n == 1) {
		g->b = args.v[0];
	} else {
		struct node *t = mk(cs, N_TUPLE, k);
		for (int i = 0; i < args.n; i++)
			if (args.v[i]->kind == N_SLICE)
				kj_cfail(cs, k->off, "slices inside tuple subscripts are not supported");
		t->v = args.v;
		t->nv = args.n;
		g->b = t;
	}
	return g;
}

static struct node *p_postfix(struct cstate *cs, struct node *x)
{
	for (;;) {
		struct tok *k = cur(cs);
		if (tok_is_op(k, O_DOT) || tok_is_op(k, O_LBRACKET)) {
			x = p_subscript(cs, x);
		} else if (tok_is_op(k, O_LPAREN)) {
			struct node *c = mk(cs, N_CALL, k);
			c->a = x;
			p_call_args(cs, c);
			x = c;
		} else {
			return x;
		}
	}
}

static struct node *p_filter_expr(struct cstate *cs, struct node *x)
{
	for (;;) {
		struct tok *k = cur(cs);
		if (tok_is_op(k, O_PIPE)) {
			x = p_filter(cs, x, 0);
		} else if (tok_is_name(k, "is")) {
			x = p_test(cs, x);
		} else if (tok_is_op(k, O_LPAREN)) {
			struct node *c = mk(cs, N_CALL, k);
			c->a = x;
			p_call_args(cs, c);
			x = c;
		} else {
			return x;
		}
	}
}

static struct node *p_primary(struct cstate *cs)
{
	struct tok *k = cur(cs);
	struct node *x;
	depth_in(cs);
	if (k->t == K_NAME) {
		if (tok_is_name(k, "true") || tok_is_name(k, "True") || tok_is_name(k, "false") ||
		    tok_is_name(k, "False")) {
			x = mk(cs, N_CONST, k);
			x->k = vbool(k->p[0] == 't' || k->p[0] == 'T');
		} else if (tok_is_name(k, "none") || tok_is_name(k, "None")) {
			x = mk(cs, N_CONST, k);
			x->k = KJ_NONE;
		} else {
			x = mk(cs, N_NAME, k);
			x->s = dup_name(cs, k->p, k->n);
			x->sn = k->n;
			x->sym = intern(cs, k->p, k->n);
			x->fid = (uint16_t)(kj_find_name(kj_gfn_names, G__COUNT, k->p, k->n) + 1);
		}
		next_tok(cs);
	} else if (k->t == K_STR) {
		/* adjacent string literals concatenate */
		size_t total = 0, j = cs->i;
		while (j < cs->nt && cs->tk[j].t == K_STR)
			total += cs->tk[j++].n;
		char *buf = kj_calloc_c(cs, total + 1), *o = buf;
		x = mk(cs, N_CONST, k);
		while (cur(cs)->t == K_STR) {
			memcpy(o, cur(cs)->p, cur(cs)->n);
			o += cur(cs)->n;
			next_tok(cs);
		}
		x->k = vstr(buf, total);
	} else if (k->t == K_INT || k->t == K_FLOAT) {
		x = mk(cs, N_CONST, k);
		x->k = k->t == K_INT ? vint(k->i) : vfloat(k->f);
		next_tok(cs);
	} else if (tok_is_op(k, O_LPAREN)) {
		next_tok(cs);
		x = p_tuple(cs, 0, 1, NULL, 1);
		expect_op(cs, O_RPAREN);
	} else if (tok_is_op(k, O_LBRACKET)) {
		struct nvec items = {0};
		next_tok(cs);
		while (!tok_is_op(cur(cs), O_RBRACKET)) {
			if (items.n)
				expect_op(cs, O_COMMA);
			if (tok_is_op(cur(cs), O_RBRACKET))
				break;
			nv_push(cs, &items, p_expression(cs, 1));
		}
		expect_op(cs, O_RBRACKET);
		x = mk(cs, N_LIST, k);
		x->v = items.v;
		x->nv = items.n;
	} else if (tok_is_op(k, O_LBRACE)) {
		struct nvec keys = {0}, vals = {0};
		next_tok(cs);
		while (!tok_is_op(cur(cs), O_RBRACE)) {
			if (keys.n)
				expect_op(cs, O_COMMA);
			if (tok_is_op(cur(cs), O_RBRACE))
				break;
			nv_push(cs, &keys, p_expression(cs, 1));
			expect_op(cs, O_COLON);
			nv_push(cs, &vals, p_expression(cs, 1));
		}
		expect_op(cs, O_RBRACE);
		x = mk(cs, N_DICT, k);
		x->v = keys.v;
		x->nv = keys.n;
		x->w = vals.v;
		x->nw = vals.n;
	} else {
		unexpected(cs, NULL);
	}
	cs->depth--;
	return x;
}

static struct node *p_unary(struct cstate *cs, int with_filter)
{
	struct tok *k = cur(cs);
	struct node *x;
	depth_in(cs);
	if (tok_is_op(k, O_SUB) || tok_is_op(k, O_ADD)) {
		next_tok(cs);
		x = mk(cs, k->op == O_SUB ? N_NEG : N_POS, k);
		x->a = p_unary(cs, 0);
	} else {
		x = p_primary(cs);
	}
	x = p_postfix(cs, x);
	if (with_filter)
		x = p_filter_expr(cs, x);
	cs->depth--;
	return x;
}

static struct node *bin(struct cstate *cs, const struct tok *at, int op, struct node *a, struct node *b)
{
	struct node *x = mk(cs, N_BIN, at);
	x->op = (uint8_t)op;
	x->a = a;
	x->b = b;
	return x;
}

static struct node *p_pow(struct cstate *cs)
{
	struct node *l = p_unary(cs, 1);
	while (tok_is_op(cur(cs), O_POW)) {
		struct tok *k = next_tok(cs);
		l = bin(cs, k, B_POW, l, p_unary(cs, 1));
	}
	return l;
}

static struct node *p_math2(struct cstate *cs)
{
	struct node *l = p_pow(cs);
	for (;;) {
		struct tok *k = cur(cs);
		int op = tok_is_op(k, O_MUL) ? B_MUL : tok_is_op(k, O_DIV) ? B_DIV
			 : tok_is_op(k, O_FLOORDIV) ? B_FLOORDIV : tok_is_op(k, O_MOD) ? B_MOD : -1;
		if (op < 0)
			return l;
		next_tok(cs);
		l = bin(cs, k, op, l, p_pow(cs));
	}
}

static struct node *p_concat(struct cstate *cs)
{
	struct tok *at = cur(cs);
	struct node *first = p_math2(cs);
	if (!tok_is_op(cur(cs), O_TILDE))
		return first;
	struct nvec args = {0};
	nv_push(cs, &args, first);
	while (tok_is_op(cur(cs), O_TILDE)) {
		next_tok(cs);
		nv_push(cs, &args, p_math2(cs));
	}
	struct node *x = mk(cs, N_CONCAT, at);
	x->v = args.v;
	x->nv = args.n;
	return x;
}

static struct node *p_math1(struct cstate *cs)
{
	struct node *l = p_concat(cs);
	for (;;) {
		struct tok *k = cur(cs);
		int op = tok_is_op(k, O_ADD) ? B_ADD : tok_is_op(k, O_SUB) ? B_SUB : -1;
		if (op < 0)
			return l;
		next_tok(cs);
		l = bin(cs, k, op, l, p_concat(cs));
	}
}

static struct node *p_compare(struct cstate *cs)
{
	struct tok *at = cur(cs);
	struct node *first = p_math1(cs);
	struct nvec opnds = {0};
	uint8_t ops[64];
	for (;;) {
		struct tok *k = cur(cs);
		int op = -1;
		if (k->t == K_OP) {
			op = k->op == O_EQ ? C_EQ : k->op == O_NE ? C_NE : k->op == O_LT ? C_LT : k->op == O_LTEQ ? C_LE
			     : k->op == O_GT ? C_GT : k->op == O_GTEQ ? C_GE : -1;
			if (op >= 0)
				next_tok(cs);
		} else if (tok_is_name(k, "in")) {
			op = C_IN;
			next_tok(cs);
		} else if (tok_is_name(k, "not") && tok_is_name(look(cs), "in")) {
			op = C_NOTIN;
			next_tok(cs);
			next_tok(cs);
		}
		if (op < 0)
			break;
		if (opnds.n == 64)
			kj_cfail(cs, k->off, "too many chained comparisons");
		ops[opnds.n] = (uint8_t)op;
		nv_push(cs, &opnds, p_math1(cs));
	}
	if (!opnds.n)
		return first;
	struct node *x = mk(cs, N_CMP, at);
	x->a = first;
	x->v = opnds.v;
	x->nv = opnds.n;
	x->ops = kj_calloc_c(cs, (size_t)opnds.n);
	memcpy(x->ops, ops, (size_t)opnds.n);
	return x;
}

static struct node *p_not(struct cstate *cs)
{
	if (tok_is_name(cur(cs), "not")) {
		struct tok *k = next_tok(cs);
		struct node *x = mk(cs, N_NOT, k);
		depth_in(cs);
		x->a = p_not(cs);
		cs->depth--;
		return x;
	}
	return p_compare(cs);
}

static struct node *p_and(struct cstate *cs)
{
	struct node *l = p_not(cs);
	while (tok_is_name(cur(cs), "and")) {
		struct tok *k = next_tok(cs);
		struct node *x = mk(cs, N_AND, k);
		x->a = l;
		x->b = p_not(cs);
		l = x;
	}
	return l;
}

static struct node *p_or(struct cstate *cs)
{
	struct node *l = p_and(cs);
	while (tok_is_name(cur(cs), "or")) {
		struct tok *k = next_tok(cs);
		struct node *x = mk(cs, N_OR, k);
		x->a = l;
		x->b = p_and(cs);
		l = x;
	}
	return l;
}

static struct node *p_condexpr(struct cstate *cs)
{
	struct node *e1 = p_or(cs);
	while (tok_is_name(cur(cs), "if")) {
		struct tok *k = next_tok(cs);
		struct node *x = mk(cs, N_COND, k);
		depth_in(cs);
		x->a = p_or(cs);
		x->b = e1;
		if (tok_is_name(cur(cs), "else")) {
			next_tok(cs);
			x->c = p_condexpr(cs);
		}
		cs->depth--;
		e1 = x;
	}
	return e1;
}

static struct node *p_expression(struct cstate *cs, int with_condexpr)
{
	return with_condexpr ? p_condexpr(cs) : p_or(cs);
}

static int tuple_end(struct cstate *cs, const char *extra_end)
{
	struct tok *k = cur(cs);
	if (k->t == K_VEND || k->t == K_BEND || tok_is_op(k, O_RPAREN))
		return 1;
	return extra_end && tok_is_name(k, extra_end);
}

static struct node *p_tuple(struct cstate *cs, int simplified, int with_condexpr, const char *extra_end,
			    int explicit_paren)
{
	struct tok *at = cur(cs);
	struct nvec args = {0};
	int is_tuple = 0;
	for (;;) {
		if (args.n)
			expect_op(cs, O_COMMA);
		if (tuple_end(cs, extra_end))
			break;
		nv_push(cs, &args, simplified ? p_primary(cs) : p_expression(cs, with_condexpr));
		if (tok_is_op(cur(cs), O_COMMA))
			is_tuple = 1;
		else
			break;
	}
	if (!is_tuple) {
		if (args.n)
			return args.v[0];
		if (!explicit_paren)
			unexpected(cs, "an expression");
	}
	struct node *x = mk(cs, N_TUPLE, at);
	x->v = args.v;
	x->nv = args.n;
	return x;
}

/* --- statements ---------------------------------------------------------- */

static struct node **p_subparse(struct cstate *cs, const char *const *ends, int n_ends, int *n_out);

/* An assignment target: a name, a tuple of names, or (with_ns) ns.attr. */
static struct target *p_target(struct cstate *cs, int with_ns, const char *extra_end, int name_only)
{
	struct target *tg = kj_calloc_c(cs, sizeof *tg);
	struct tok *at = cur(cs);
	if (with_ns && at->t == K_NAME && tok_is_op(look(cs), O_DOT)) {
		struct tok *k = next_tok(cs);
		next_tok(cs);
		struct tok *a = expect_name(cs);
		tg->n = 1;
		tg->syms = kj_calloc_c(cs, sizeof(int));
		tg->names = kj_calloc_c(cs, sizeof(char *));
		tg->syms[0] = intern(cs, k->p, k->n);
		tg->names[0] = dup_name(cs, k->p, k->n);
		tg->ns_attr = 1;
		tg->attr = dup_name(cs, a->p, a->n);
		return tg;
	}
	struct node *x = name_only ? p_primary(cs) : p_tuple(cs, 1, 1, extra_end, 0);
	struct node **v = &x;
	int n = 1;
	if (x->kind == N_TUPLE) {
		v = x->v;
		n = x->nv;
		tg->tuple = 1;
	}
	tg->n = n;
	tg->syms = kj_calloc_c(cs, (size_t)(n ? n : 1) * sizeof(int));
	tg->names = kj_calloc_c(cs, (size_t)(n ? n : 1) * sizeof(char *));
	for (int i = 0; i < n; i++) {
		if (v[i]->kind != N_NAME)
			kj_cfail(cs, at->off, "can't assign to this expression (only names%s are supported)",
			      with_ns ? " and namespace attributes" : "");
		tg->syms[i] = v[i]->sym;
		tg->names[i] = v[i]->s;
	}
	return tg;
}

/* Skip an optional ':' and the block end, then parse a body up to one of
 * `ends` (left as the current token). */
static struct node **p_body(struct cstate *cs, const char *const *ends, int n_ends, int *n_out,
			    const char *tag, size_t tag_off)
{
	if (tok_is_op(cur(cs), O_COLON))
		next_tok(cs);
	expect_kind(cs, K_BEND, "end of statement block");
	struct node **b = p_subparse(cs, ends, n_ends, n_out);
	if (cur(cs)->t == K_EOF) {
		char want[200] = "";
		size_t l = 0;
		for (int i = 0; i < n_ends; i++)
			l += (size_t)snprintf(want + l, sizeof want - l, "%s'%s'", i ? " or " : "", ends[i]);
		kj_cfail(cs, tag_off, "unexpected end of template: the '%s' block is not closed (looking for %s)",
		      tag, want);
	}
	return b;
}

static void end_tag(struct cstate *cs)
{
	next_tok(cs); /* the end name */
}

static struct node *p_statement(struct cstate *cs);

static struct node *p_for(struct cstate *cs, struct tok *k)
{
	static const char *const ends1[] = {"endfor", "else"}, *const ends2[] = {"endfor"};
	struct node *x = mk(cs, N_FOR, k);
	x->tg = p_target(cs, 0, "in", 0);
	if (!tok_is_name(cur(cs), "in"))
		unexpected(cs, "'in'");
	next_tok(cs);
	x->a = p_tuple(cs, 0, 0, "recursive", 0);
	if (tok_is_name(cur(cs), "if")) {
		next_tok(cs);
		x->b = p_expression(cs, 1);
	}
	if (tok_is_name(cur(cs), "recursive")) {
		cs->err = KV_ERR_UNSUPPORTED;
		kj_cfail(cs, cur(cs)->off, "recursive for loops are not supported");
	}
	cs->loops++;
	x->v = p_body(cs, ends1, 2, &x->nv, "for", k->off);
	cs->loops--;
	if (tok_is_name(cur(cs), "else")) {
		end_tag(cs);
		x->w = p_body(cs, ends2, 1, &x->nw, "for", k->off);
	}
	end_tag(cs);
	return x;
}

static struct node *p_if(struct cstate *cs, struct tok *k)
{
	static const char *const ends1[] = {"elif", "else", "endif"}, *const ends2[] = {"endif"};
	struct node *top = mk(cs, N_IF, k), *x = top;
	for (;;) {
		x->a = p_tuple(cs, 0, 0, NULL, 0);
		x->v = p_body(cs, ends1, 3, &x->nv, "if", k->off);
		if (tok_is_name(cur(cs), "elif")) {
			struct tok *e = next_tok(cs);
			struct node *y = mk(cs, N_IF, e);
			x->w = kj_calloc_c(cs, sizeof *x->w);
			x->w[0] = y;
			x->nw = 1;
			x = y;
			continue;
		}
		if (tok_is_name(cur(cs), "else")) {
			end_tag(cs);
			x->w = p_body(cs, ends2, 1, &x->nw, "if", k->off);
		}
		break;
	}
	end_tag(cs);
	return top;
}

static struct node *p_set(struct cstate *cs, struct tok *k)
{
	static const char *const ends[] = {"endset"};
	struct target *tg = p_target(cs, 1, NULL, 0);
	if (tok_is_op(cur(cs), O_ASSIGN)) {
		next_tok(cs);
		struct node *x = mk(cs, N_SET, k);
		x->tg = tg;
		x->a = p_tuple(cs, 0, 1, NULL, 0);
		return x;
	}
	struct node *x = mk(cs, N_SETBLOCK, k);
	x->tg = tg;
	if (tg->n != 1)
		kj_cfail(cs, k->off, "a set block assigns to one name");
	if (tok_is_op(cur(cs), O_PIPE))
		x->c = p_filter(cs, mk(cs, N_BLOCKVAL, k), 0);
	x->v = p_body(cs, ends, 1, &x->nv, "set", k->off);
	end_tag(cs);
	return x;
}

static int body_uses(const struct node *const *v, int n, int sym);

static int node_uses(const struct node *x, int sym)
{
	if (!x)
		return 0;
	if (x->kind == N_NAME && x->sym == sym)
		return 1;
	if (x->kind == N_MACRO)
		return 0; /* a nested macro has its own varargs */
	if (node_uses(x->a, sym) || node_uses(x->b, sym) || node_uses(x->c, sym))
		return 1;
	if (body_uses((const struct node *const *)x->v, x->nv, sym) ||
	    body_uses((const struct node *const *)x->w, x->nw, sym))
		return 1;
	return 0;
}

static int body_uses(const struct node *const *v, int n, int sym)
{
	for (int i = 0; i < n; i++)
		if (node_uses(v[i], sym))
			return 1;
	return 0;
}

static struct node *p_macro(struct cstate *cs, struct tok *k)
{
	static const char *const ends[] = {"endmacro"};
	struct node *x = mk(cs, N_MACRO, k);
	struct tok *name = expect_name(cs);
	struct nvec defs = {0};
	int syms[256];
	const char *names[256];
	int np = 0;
	x->sym = intern(cs, name->p, name->n);
	x->s = dup_name(cs, name->p, name->n);
	expect_op(cs, O_LPAREN);
	while (!tok_is_op(cur(cs), O_RPAREN)) {
		if (np)
			expect_op(cs, O_COMMA);
		struct tok *a = expect_name(cs);
		if (np == 256)
			kj_cfail(cs, a->off, "too many macro parameters");
		syms[np] = intern(cs, a->p, a->n);
		names[np++] = dup_name(cs, a->p, a->n);
		if (tok_is_op(cur(cs), O_ASSIGN)) {
			next_tok(cs);
			nv_push(cs, &defs, p_expression(cs, 1));
		} else if (defs.n) {
			kj_cfail(cs, a->off, "non-default argument follows default argument");
		}
	}
	expect_op(cs, O_RPAREN);
	x->tg = kj_calloc_c(cs, sizeof *x->tg);
	x->tg->n = np;
	x->tg->syms = kj_calloc_c(cs, (size_t)(np ? np : 1) * sizeof(int));
	x->tg->names = kj_calloc_c(cs, (size_t)(np ? np : 1) * sizeof(char *));
	memcpy(x->tg->syms, syms, (size_t)np * sizeof(int));
	memcpy(x->tg->names, names, (size_t)np * sizeof(char *));
	x->w = defs.v;
	x->nw = defs.n;
	int saved_loops = cs->loops;
	cs->loops = 0;
	cs->macros++;
	x->v = p_body(cs, ends, 1, &x->nv, "macro", k->off);
	cs->macros--;
	cs->loops = saved_loops;
	end_tag(cs);
	x->varargs = (uint8_t)body_uses((const struct node *const *)x->v, x->nv, cs->t->sym_varargs);
	x->kwargs = (uint8_t)body_uses((const struct node *const *)x->v, x->nv, cs->t->sym_kwargs);
	return x;
}

static struct node *p_statement(struct cstate *cs)
{
	struct tok *k = cur(cs);
	if (k->t != K_NAME)
		kj_cfail(cs, k->off, "tag name expected");
	depth_in(cs);
	next_tok(cs);
	struct node *x;
	if (tok_is_name(k, "for")) {
		x = p_for(cs, k);
	} else if (tok_is_name(k, "if")) {
		x = p_if(cs, k);
	} else if (tok_is_name(k, "set")) {
		x = p_set(cs, k);
	} else if (tok_is_name(k, "macro")) {
		x = p_macro(cs, k);
	} else if (tok_is_name(k, "print")) {
		/* {% print a, b %}: each expression printed in turn */
		struct nvec items = {0};
		while (cur(cs)->t != K_BEND) {
			if (items.n)
				expect_op(cs, O_COMMA);
			struct node *p = mk(cs, N_PRINT, k);
			p->a = p_expression(cs, 1);
			nv_push(cs, &items, p);
		}
		x = mk(cs, N_SCOPE, k);
		x->op = 1; /* no new scope: just a sequence */
		x->v = items.v;
		x->nv = items.n;
	} else if (tok_is_name(k, "filter")) {
		static const char *const ends[] = {"endfilter"};
		x = mk(cs, N_FILTERBLK, k);
		x->c = p_filter(cs, mk(cs, N_BLOCKVAL, k), 1);
		x->v = p_body(cs, ends, 1, &x->nv, "filter", k->off);
		end_tag(cs);
	} else if (tok_is_name(k, "with")) {
		static const char *const ends[] = {"endwith"};
		struct nvec vals = {0};
		int syms[64];
		const char *names[64];
		int n = 0;
		x = mk(cs, N_WITH, k);
		while (cur(cs)->t != K_BEND) {
			if (n)
				expect_op(cs, O_COMMA);
			struct tok *a = expect_name(cs);
			if (n == 64)
				kj_cfail(cs, a->off, "too many with targets");
			syms[n] = intern(cs, a->p, a->n);
			names[n++] = dup_name(cs, a->p, a->n);
			expect_op(cs, O_ASSIGN);
			nv_push(cs, &vals, p_expression(cs, 1));
		}
		x->tg = kj_calloc_c(cs, sizeof *x->tg);
		x->tg->n = n;
		x->tg->syms = kj_calloc_c(cs, (size_t)(n ? n : 1) * sizeof(int));
		x->tg->names = kj_calloc_c(cs, (size_t)(n ? n : 1) * sizeof(char *));
		memcpy(x->tg->syms, syms, (size_t)n * sizeof(int));
		memcpy(x->tg->names, names, (size_t)n * sizeof(char *));
		x->w = vals.v;
		x->nw = vals.n;
		x->v = p_body(cs, ends, 1, &x->nv, "with", k->off);
		end_tag(cs);
	} else if (tok_is_name(k, "generation")) {
		/* transformers' AssistantTracker tag: renders its body */
		static const char *const ends[] = {"endgeneration"};
		x = mk(cs, N_SCOPE, k);
		x->v = p_body(cs, ends, 1, &x->nv, "generation", k->off);
		end_tag(cs);
	} else if (tok_is_name(k, "break") || tok_is_name(k, "continue")) {
		if (!cs->loops)
			kj_cfail(cs, k->off, "'%.*s' outside of a loop", (int)k->n, k->p);
		x = mk(cs, k->p[0] == 'b' ? N_BREAK : N_CONTINUE, k);
	} else if (tok_is_name(k, "block") || tok_is_name(k, "extends") || tok_is_name(k, "include") ||
		   tok_is_name(k, "import") || tok_is_name(k, "from") || tok_is_name(k, "autoescape") ||
		   tok_is_name(k, "call") || tok_is_name(k, "do") || tok_is_name(k, "trans")) {
		cs->err = KV_ERR_UNSUPPORTED;
		kj_cfail(cs, k->off, "the '%.*s' tag is not supported in chat templates", (int)k->n, k->p);
	} else {
		kj_cfail(cs, k->off, "unknown tag '%.*s'", (int)(k->n > 60 ? 60 : k->n), k->p);
	}
	cs->depth--;
	return x;
}

static struct node **p_subparse(struct cstate *cs, const char *const *ends, int n_ends, int *n_out)
{
	struct nvec body = {0};
	for (;;) {
		struct tok *k = cur(cs);
		if (k->t == K_EOF)
			break;
		if (k->t == K_DATA) {
			struct node *x = mk(cs, N_DATA, k);
			x->s = k->p;
			x->sn = k->n;
			nv_push(cs, &body, x);
			next_tok(cs);
		} else if (k->t == K_VBEGIN) {
			next_tok(cs);
			struct node *x = mk(cs, N_PRINT, k);
			x->a = p_tuple(cs, 0, 1, NULL, 0);
			expect_kind(cs, K_VEND, "end of print statement");
			nv_push(cs, &body, x);
		} else if (k->t == K_BBEGIN) {
			next_tok(cs);
			for (int i = 0; i < n_ends; i++)
				if (tok_is_name(cur(cs), ends[i])) {
					*n_out = body.n;
					return body.v;
				}
			struct tok *nm = cur(cs);
			if (nm->t == K_NAME && nm->n > 3 && (!memcmp(nm->p, "end", 3) || tok_is_name(nm, "else") ||
							     tok_is_name(nm, "elif")))
				kj_cfail(cs, nm->off, "unexpected '%.*s' (no open block expects it)",
				      (int)(nm->n > 60 ? 60 : nm->n), nm->p);
			if (tok_is_name(nm, "else") || tok_is_name(nm, "elif"))
				kj_cfail(cs, nm->off, "unexpected '%.*s' (no open block expects it)", (int)nm->n, nm->p);
			nv_push(cs, &body, p_statement(cs));
			expect_kind(cs, K_BEND, "end of statement block");
		} else {
			unexpected(cs, NULL);
		}
	}
	*n_out = body.n;
	return body.v;
}

/* ------------------------------------------------------------------------
 * Compile
 * ---------------------------------------------------------------------- */

void kv_tmpl_free(struct kv_tmpl *t)
{
	if (!t)
		return;
	kv_map_destroy(t->syms);
	kj_ar_free(&t->ar);
	free(t);
}

int kv_tmpl_compile(const char *src, size_t len, const char *what, struct kv_tmpl **out)
{
	struct kv_tmpl *t;
	struct cstate *cs;
	size_t bad;

	*out = NULL;
	if (!what)
		what = "template";
	if (!src && len)
		return kv_fail(KV_ERR_INVALID, "%s: no source", what);
	if (len > TM_MAX_SOURCE)
		return kv_fail(KV_ERR_INVALID, "%s: %zu bytes, larger than the %u byte limit", what, len,
			       (unsigned)TM_MAX_SOURCE);
	if ((bad = kv_utf8_valid_prefix(src, len)) < len)
		return kv_fail(KV_ERR_INVALID, "%s: invalid UTF-8 at byte %zu", what, bad);
	t = calloc(1, sizeof *t);
	cs = calloc(1, sizeof *cs);
	if (!t || !cs) {
		free(t);
		free(cs);
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", what);
	}
	snprintf(t->what, sizeof t->what, "%s", what);
	t->syms = kv_map_create(64);
	cs->t = t;
	if (setjmp(cs->jb)) {
		int err = cs->err ? cs->err : KV_ERR_INVALID;
		free(cs);
		kv_tmpl_free(t);
		return err;
	}
	if (!t->syms)
		kj_cnomem(cs);

	/* newlines -> \n, one trailing newline dropped */
	char *s = kj_calloc_c(cs, len + 1);
	size_t n = 0;
	for (size_t i = 0; i < len; i++) {
		if (src[i] == '\r') {
			s[n++] = '\n';
			if (i + 1 < len && src[i + 1] == '\n')
				i++;
		} else {
			s[n++] = src[i];
		}
	}
	if (n > 0 && s[n - 1] == '\n')
		n--;
	s[n] = 0;
	t->src = s;
	t->src_len = n;
	size_t nl = 1;
	for (size_t i = 0; i < n; i++)
		nl += s[i] == '\n';
	t->lines = kj_calloc_c(cs, nl * sizeof *t->lines);
	t->n_lines = 1;
	for (size_t i = 0; i < n; i++)
		if (s[i] == '\n')
			t->lines[t->n_lines++] = i + 1;

	t->sym_loop = intern(cs, "loop", 4);
	t->sym_varargs = intern(cs, "varargs", 7);
	t->sym_kwargs = intern(cs, "kwargs", 6);
	kj_lex(cs);
	t->body = p_subparse(cs, NULL, 0, &t->n_body);
	if (cur(cs)->t != K_EOF)
		unexpected(cs, NULL);
	free(cs);
	*out = t;
	return KV_OK;
}
