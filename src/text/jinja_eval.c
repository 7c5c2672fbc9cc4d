/*
 * jinja_eval.c - evaluation of expressions and statements over the AST,
 * and the render entry points kv_tmpl_render / kv_tmpl_render_ex
 * (template.h): limits, the arena, the longjmp that unwinds an error.
 */
#include "text/jinja_int.h"

/* ------------------------------------------------------------------------
 * Evaluation
 * ---------------------------------------------------------------------- */

static void depth_enter(struct rt *rt, const struct node *at)
{
	if (++rt->depth > TM_MAX_EVAL_DEPTH)
		kj_rfail(rt, at, KV_ERR_INVALID, "evaluation nested deeper than %d levels", TM_MAX_EVAL_DEPTH);
}

static struct val lookup(struct rt *rt, const struct node *x, struct scope *sc)
{
	const struct val *v = kj_scope_get(sc, x->sym);
	if (v)
		return *v;
	if (rt->globals[x->sym].t != V_MISSING)
		return rt->globals[x->sym];
	if (x->fid) {
		struct val f = {.t = V_FUNC};
		f.fn = (uint16_t)(x->fid - 1);
		return f;
	}
	return vundef(x->s);
}

/* obj.name with the method ids the parser looked up (get_attr's rules). */
static struct val get_attr_node(struct rt *rt, const struct node *x, const struct val *obj)
{
	int m = -1;
	switch (obj->t) {
	case V_DICT:
		m = x->mid[1];
		if (m < 0) {
			const struct val *v = kj_dict_get_str(rt, x, obj->u.d, x->s, x->sn);
			return v ? *v : kj_undef_of(x->s, x->sn, V_DICT, 0);
		}
		break;
	case V_STR:
		m = x->mid[0];
		break;
	case V_LIST:
		m = obj->u.l->kind == L_LIST ? x->mid[2] : obj->u.l->kind == L_TUPLE ? x->mid[3] : -1;
		break;
	default:
		return kj_get_attr(rt, x, obj, x->s, x->sn);
	}
	if (m >= 0 && !(x->sn >= 1 && x->s[0] == '_' && obj->t != V_DICT))
		return kj_method_val(rt, x, obj, m);
	return kj_get_attr(rt, x, obj, x->s, x->sn);
}

static void eval_args(struct rt *rt, const struct node *x, struct scope *sc, struct args *a)
{
	struct val *pv = x->nv ? kj_ralloc(rt, x, (size_t)x->nv * sizeof *pv) : NULL;
	struct val *kv = x->nw ? kj_ralloc(rt, x, (size_t)x->nw * sizeof *kv) : NULL;
	for (int i = 0; i < x->nv; i++)
		pv[i] = kj_eval(rt, x->v[i], sc);
	for (int i = 0; i < x->nw; i++)
		kv[i] = kj_eval(rt, x->w[i], sc);
	a->v = pv;
	a->n = x->nv;
	a->kwn = x->kwn;
	a->kwv = kv;
	a->nkw = x->nw;
}


/*
 * A left-deep chain of + (templates write '<|im_start|>' + role + '\n' +
 * content + ...). Plain strings are collected and joined once, or emitted
 * one by one when the chain is printed, instead of being copied at every
 * +. Operands are evaluated in Python's order and a non-string operand
 * falls back to binop at the same point, so results and errors are the
 * same as evaluating the additions one by one.
 */
#define ADD_CHAIN_MAX 64

static struct val eval_add(struct rt *rt, const struct node *x, struct scope *sc, int print)
{
	const struct node *ops[ADD_CHAIN_MAX];
	struct val parts[ADD_CHAIN_MAX], acc = KJ_NONE;
	int n = 0, np = 0, pending = 1;
	size_t total = 0;
	const struct node *cur = x;
	while (cur->kind == N_BIN && cur->op == B_ADD && n < ADD_CHAIN_MAX - 1) {
		ops[n++] = cur->b;
		cur = cur->a;
	}
	ops[n++] = cur;
	for (int i = n - 1; i >= 0; i--) {
		struct val v = kj_eval(rt, ops[i], sc);
		if (pending && v.t == V_STR && !v.safe) {
			total += v.u.s.n;
			if (total > rt->max_out)
				kj_rfail(rt, ops[i], KV_ERR_INVALID, "string longer than the %zu byte output cap", rt->max_out);
			parts[np++] = v;
			continue;
		}
		if (pending) {
			if (np == 0) { /* the leftmost operand is not a plain string */
				acc = v;
				pending = 0;
				continue;
			}
			struct outbuf b = {0};
			for (int k = 0; k < np; k++)
				kj_ob_add(rt, x, &b, parts[k].u.s.p, parts[k].u.s.n);
			acc = np == 1 ? parts[0] : kj_ob_val(&b);
			pending = 0;
		}
		/* the + whose right operand is ops[i] */
		const struct node *at = x;
		for (const struct node *c = x; c->kind == N_BIN && c->op == B_ADD; c = c->a)
			if (c->b == ops[i])
				at = c;
		acc = kj_binop(rt, at, B_ADD, &acc, &v);
		if (acc.t == V_STR && !acc.safe) {
			parts[0] = acc;
			np = 1;
			total = acc.u.s.n;
			pending = 1;
		}
	}
	if (pending) {
		if (print) {
			for (int k = 0; k < np; k++)
				kj_emit(rt, x, parts[k].u.s.p, parts[k].u.s.n);
			return KJ_NONE;
		}
		if (np == 1)
			return parts[0];
		char *p = kj_ralloc(rt, x, total + 1);
		size_t o = 0;
		for (int k = 0; k < np; k++) {
			memcpy(p + o, parts[k].u.s.p, parts[k].u.s.n);
			o += parts[k].u.s.n;
		}
		p[o] = 0;
		return vstr(p, o);
	}
	if (print) {
		if (acc.t == V_STR) {
			kj_emit(rt, x, acc.u.s.p, acc.u.s.n);
		} else {
			struct outbuf b = {0};
			kj_to_str(rt, x, &acc, &b, 0);
			kj_emit(rt, x, b.p, b.n);
		}
		return KJ_NONE;
	}
	return acc;
}

struct val kj_eval(struct rt *rt, const struct node *x, struct scope *sc)
{
	struct val r, l, rv;
	struct args a;
	depth_enter(rt, x);
	switch (x->kind) {
	case N_CONST:
		r = x->k;
		break;
	case N_NAME:
		r = lookup(rt, x, sc);
		break;
	case N_GETATTR:
		l = kj_eval(rt, x->a, sc);
		r = get_attr_node(rt, x, &l);
		break;
	case N_GETITEM:
		l = kj_eval(rt, x->a, sc);
		if (x->b->kind == N_SLICE) {
			struct val s0 = x->b->a ? kj_eval(rt, x->b->a, sc) : KJ_MISSING;
			struct val s1 = x->b->b ? kj_eval(rt, x->b->b, sc) : KJ_MISSING;
			struct val s2 = x->b->c ? kj_eval(rt, x->b->c, sc) : KJ_MISSING;
			r = kj_do_slice(rt, x, &l, &s0, &s1, &s2);
		} else {
			rv = kj_eval(rt, x->b, sc);
			r = kj_get_item(rt, x, &l, &rv);
		}
		break;
	case N_CALL:
		l = kj_eval(rt, x->a, sc);
		eval_args(rt, x, sc, &a);
		r = kj_call_value(rt, x, &l, &a);
		break;
	case N_FILTER:
		l = x->a->kind == N_BLOCKVAL ? rt->blockval : kj_eval(rt, x->a, sc);
		eval_args(rt, x, sc, &a);
		r = kj_call_filter(rt, x, x->fid, &l, &a);
		break;
	case N_TEST:
		l = kj_eval(rt, x->a, sc);
		eval_args(rt, x, sc, &a);
		r = vbool(kj_test_value(rt, x, x->fid, &l, &a));
		break;
	case N_NOT:
		l = kj_eval(rt, x->a, sc);
		r = vbool(!kj_truthy(&l));
		break;
	case N_NEG:
	case N_POS:
		l = kj_eval(rt, x->a, sc);
		if (l.t == V_UNDEF)
			kj_fail_undef(rt, x, &l);
		if (l.t == V_FLOAT)
			r = vfloat(x->kind == N_NEG ? -l.u.f : l.u.f);
		else if (is_intlike(&l)) {
			if (x->kind == N_NEG && l.u.i == INT64_MIN)
				UNSUP(rt, x, "integer overflow");
			r = vint(x->kind == N_NEG ? -l.u.i : l.u.i);
		} else
			TYPE_ERR(rt, x, "bad operand type for unary %c: '%s'", x->kind == N_NEG ? '-' : '+', kj_kind_name(&l));
		break;
	case N_BIN:
		if (x->op == B_ADD) {
			r = eval_add(rt, x, sc, 0);
			break;
		}
		l = kj_eval(rt, x->a, sc);
		rv = kj_eval(rt, x->b, sc);
		r = kj_binop(rt, x, x->op, &l, &rv);
		break;
	case N_CONCAT: {
		struct outbuf b = {0};
		for (int i = 0; i < x->nv; i++) {
			l = kj_eval(rt, x->v[i], sc);
			kj_to_str(rt, x, &l, &b, 0);
		}
		r = kj_ob_val(&b);
		break;
	}
	case N_CMP: {
		l = kj_eval(rt, x->a, sc);
		r = vbool(1);
		for (int i = 0; i < x->nv; i++) {
			int ok;
			rv = kj_eval(rt, x->v[i], sc);
			switch (x->ops[i]) {
			case C_EQ: ok = kj_val_eq(rt, x, &l, &rv, 0); break;
			case C_NE: ok = !kj_val_eq(rt, x, &l, &rv, 0); break;
			case C_LT: ok = kj_val_cmp(rt, x, &l, &rv, "<", 0) < 0; break;
			case C_LE: ok = kj_val_cmp(rt, x, &l, &rv, "<=", 0) <= 0; break;
			case C_GT: ok = kj_val_cmp(rt, x, &l, &rv, ">", 0) > 0; break;
			case C_GE: ok = kj_val_cmp(rt, x, &l, &rv, ">=", 0) >= 0; break;
			case C_IN: ok = kj_contains(rt, x, &l, &rv); break;
			default: ok = !kj_contains(rt, x, &l, &rv); break;
			}
			if (!ok) {
				r = vbool(0);
				break;
			}
			l = rv;
		}
		break;
	}
	case N_AND:
		l = kj_eval(rt, x->a, sc);
		r = kj_truthy(&l) ? kj_eval(rt, x->b, sc) : l;
		break;
	case N_OR:
		l = kj_eval(rt, x->a, sc);
		r = kj_truthy(&l) ? l : kj_eval(rt, x->b, sc);
		break;
	case N_COND:
		l = kj_eval(rt, x->a, sc);
		if (kj_truthy(&l))
			r = kj_eval(rt, x->b, sc);
		else if (x->c)
			r = kj_eval(rt, x->c, sc);
		else
			r = vundef("the inline if-expression evaluated to false and has no else");
		break;
	case N_LIST:
	case N_TUPLE: {
		struct list *lst = kj_list_new(rt, x, (size_t)x->nv, x->kind == N_LIST ? L_LIST : L_TUPLE);
		for (int i = 0; i < x->nv; i++)
			lst->v[i] = kj_eval(rt, x->v[i], sc);
		r = vlist(lst);
		break;
	}
	case N_DICT: {
		struct dict *d = kj_dict_new(rt, x, (size_t)x->nv);
		for (int i = 0; i < x->nv; i++) {
			struct val k = kj_eval(rt, x->v[i], sc);
			struct val v = kj_eval(rt, x->w[i], sc);
			kj_dict_set(rt, x, d, k, v);
		}
		r = vdict(d);
		break;
	}
	case N_BLOCKVAL:
		r = rt->blockval;
		break;
	default:
		kj_rfail(rt, x, KV_ERR_INVALID, "internal error: node %d is not an expression", x->kind);
	}
	rt->depth--;
	return r;
}

/* ------------------------------------------------------------------------
 * Statements
 * ---------------------------------------------------------------------- */

enum { CTL_NONE = 0, CTL_BREAK, CTL_CONTINUE };

static void assign(struct rt *rt, const struct node *at, const struct target *tg, struct scope *sc, struct val v)
{
	if (tg->ns_attr) {
		const struct val *nsv = kj_scope_get(sc, tg->syms[0]);
		if (!nsv && rt->globals[tg->syms[0]].t != V_MISSING)
			nsv = &rt->globals[tg->syms[0]];
		if (!nsv || nsv->t != V_NS)
			TYPE_ERR(rt, at, "can only set attributes on namespace objects ('%s' is %s)", tg->names[0],
				 nsv ? kj_kind_name(nsv) : "undefined");
		kj_dict_set(rt, at, nsv->u.ns->d, vstr(tg->attr, strlen(tg->attr)), v);
		return;
	}
	if (tg->n == 1 && !tg->tuple) {
		kj_scope_set(rt, at, sc, tg->syms[0], v);
		return;
	}
	const struct list *items = kj_iter_items(rt, at, &v);
	if (items->n != (size_t)tg->n)
		TYPE_ERR(rt, at, "%s values to unpack (expected %d, got %zu)",
			 items->n < (size_t)tg->n ? "not enough" : "too many", tg->n, items->n);
	for (int i = 0; i < tg->n; i++)
		kj_scope_set(rt, at, sc, tg->syms[i], items->v[i]);
}

static struct val capture_body(struct rt *rt, const struct node *x, struct scope *sc)
{
	struct outbuf *saved = rt->cap, ob = {0};
	int ctl = 0;
	rt->cap = &ob;
	kj_exec_body(rt, x->v, x->nv, sc, &ctl);
	rt->cap = saved;
	return kj_ob_val(&ob);
}

static void exec_for(struct rt *rt, const struct node *x, struct scope *sc)
{
	struct val itv = kj_eval(rt, x->a, sc);
	const struct list *items = kj_iter_items(rt, x, &itv);
	if (x->b) {
		/* `for x in xs if cond`: filter first; loop.* counts what is left */
		struct lbuild kept = {0};
		struct scope *fs = kj_scope_new(rt, x, sc);
		for (size_t i = 0; i < items->n; i++) {
			kj_step(rt, x, 1);
			fs->n = 0;
			assign(rt, x, x->tg, fs, items->v[i]);
			struct val c = kj_eval(rt, x->b, fs);
			if (kj_truthy(&c))
				kj_lb_push(rt, x, &kept, items->v[i]);
		}
		items = kj_lb_done(rt, x, &kept, L_LIST).u.l;
	}
	if (!items->n) {
		int ctl = 0;
		if (x->nw)
			kj_exec_body(rt, x->w, x->nw, kj_scope_new(rt, x, sc), &ctl);
		return;
	}
	struct loopobj *lo = kj_ralloc(rt, x, sizeof *lo);
	lo->items = items;
	lo->depth = 1;
	struct val lv = {.t = V_LOOP};
	lv.u.lo = lo;
	struct scope *is = NULL;
	for (size_t i = 0; i < items->n; i++) {
		kj_step(rt, x, 1);
		/* each iteration starts with a fresh scope (Jinja: assignments
		 * in the body do not carry over to the next iteration); reuse
		 * it unless a macro captured it */
		if (!is || is->captured)
			is = kj_scope_new(rt, x, sc);
		is->n = 0;
		lo->i = i;
		kj_scope_set(rt, x, is, rt->t->sym_loop, lv);
		assign(rt, x, x->tg, is, items->v[i]);
		int ctl = CTL_NONE;
		kj_exec_body(rt, x->v, x->nv, is, &ctl);
		if (ctl == CTL_BREAK)
			break;
	}
}

void kj_exec_body(struct rt *rt, struct node *const *v, int n, struct scope *sc, int *ctl)
{
	for (int i = 0; i < n && *ctl == CTL_NONE; i++) {
		const struct node *x = v[i];
		depth_enter(rt, x);
		kj_step(rt, x, 1);
		switch (x->kind) {
		case N_DATA:
			kj_emit(rt, x, x->s, x->sn);
			break;
		case N_PRINT: {
			if (x->a->kind == N_BIN && x->a->op == B_ADD) {
				eval_add(rt, x->a, sc, 1);
				break;
			}
			struct val r = kj_eval(rt, x->a, sc);
			if (r.t == V_STR) {
				kj_emit(rt, x, r.u.s.p, r.u.s.n);
			} else {
				struct outbuf b = {0};
				kj_to_str(rt, x, &r, &b, 0);
				kj_emit(rt, x, b.p, b.n);
			}
			break;
		}
		case N_IF: {
			struct val c = kj_eval(rt, x->a, sc);
			if (kj_truthy(&c))
				kj_exec_body(rt, x->v, x->nv, sc, ctl);
			else
				kj_exec_body(rt, x->w, x->nw, sc, ctl);
			break;
		}
		case N_FOR:
			rt->loop_depth++;
			exec_for(rt, x, sc);
			rt->loop_depth--;
			break;
		case N_SET:
			assign(rt, x, x->tg, sc, kj_eval(rt, x->a, sc));
			break;
		case N_SETBLOCK: {
			struct val body = capture_body(rt, x, kj_scope_new(rt, x, sc));
			if (x->c) {
				struct val saved = rt->blockval;
				rt->blockval = body;
				body = kj_eval(rt, x->c, sc);
				rt->blockval = saved;
			}
			assign(rt, x, x->tg, sc, body);
			break;
		}
		case N_MACRO: {
			struct macro *m = kj_ralloc(rt, x, sizeof *m);
			m->def = x;
			m->closure = sc;
			struct val mv = {.t = V_MACRO};
			mv.u.m = m;
			kj_scope_set(rt, x, sc, x->sym, mv);
			sc->captured = 1;
			break;
		}
		case N_BREAK:
			*ctl = CTL_BREAK;
			break;
		case N_CONTINUE:
			*ctl = CTL_CONTINUE;
			break;
		case N_FILTERBLK: {
			struct val body = capture_body(rt, x, kj_scope_new(rt, x, sc));
			struct val saved = rt->blockval;
			rt->blockval = body;
			struct val r = kj_eval(rt, x->c, sc);
			rt->blockval = saved;
			struct outbuf b = {0};
			kj_to_str(rt, x, &r, &b, 0);
			kj_emit(rt, x, b.p, b.n);
			break;
		}
		case N_WITH: {
			struct scope *ws = kj_scope_new(rt, x, sc);
			struct val *vals = kj_ralloc(rt, x, (size_t)(x->nw ? x->nw : 1) * sizeof *vals);
			for (int k = 0; k < x->nw; k++)
				vals[k] = kj_eval(rt, x->w[k], sc);
			for (int k = 0; k < x->nw; k++)
				kj_scope_set(rt, x, ws, x->tg->syms[k], vals[k]);
			kj_exec_body(rt, x->v, x->nv, ws, ctl);
			break;
		}
		case N_SCOPE:
			kj_exec_body(rt, x->v, x->nv, x->op ? sc : kj_scope_new(rt, x, sc), ctl);
			break;
		default:
			kj_rfail(rt, x, KV_ERR_INVALID, "internal error: node %d is not a statement", x->kind);
		}
		rt->depth--;
	}
}

/* ------------------------------------------------------------------------
 * Render entry points
 * ---------------------------------------------------------------------- */

static void limits_fill(struct kv_tmpl_limits *l, const struct kv_tmpl_limits *in)
{
	l->max_steps = in && in->max_steps ? in->max_steps : TM_DEFAULT_MAX_STEPS;
	l->max_output = in && in->max_output ? in->max_output : TM_DEFAULT_MAX_OUTPUT;
	l->max_memory = in && in->max_memory ? in->max_memory : TM_DEFAULT_MAX_MEMORY;
}

/*
 * Render t with the given globals. With `expect` set nothing is stored:
 * the output is compared with expect as it is produced and the render
 * stops at the first difference (returns RT_DIVERGED). *out_len gets
 * the number of bytes produced. Returns KV_OK, RT_DIVERGED or a kv_err.
 */
int kj_render_core(const struct kv_tmpl *t, const struct gval *g, int ng, const struct kv_tmpl_limits *lim,
		       struct kv_buf *out, const char *expect, size_t expect_len, size_t *out_len, struct tj_memo *memo)
{
	struct kv_tmpl_limits L;
	struct arena ar = {0};
	struct rt *rt = calloc(1, sizeof *rt);
	int rc;

	if (!rt)
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", t->what);
	limits_fill(&L, lim);
	ar.cap = L.max_memory;
	rt->t = t;
	rt->memo = memo;
	rt->ar = &ar;
	rt->out = out;
	rt->expect = expect;
	rt->expect_len = expect_len;
	rt->max_steps = L.max_steps;
	rt->max_out = L.max_output;
	if (setjmp(rt->jb)) {
		rc = rt->err ? rt->err : KV_ERR_INVALID;
		goto done;
	}
	rt->globals = kj_ralloc(rt, NULL, (size_t)(t->n_syms ? t->n_syms : 1) * sizeof *rt->globals);
	for (int i = 0; i < t->n_syms; i++)
		rt->globals[i] = KJ_MISSING;
	for (int i = 0; i < ng; i++) {
		uint64_t id;
		if (kv_map_get(t->syms, g[i].name, strlen(g[i].name), &id))
			rt->globals[id] = g[i].v;
	}
	rt->root = kj_scope_new(rt, NULL, NULL);
	int ctl = CTL_NONE;
	kj_exec_body(rt, t->body, t->n_body, rt->root, &ctl);
	rc = KV_OK;
done:
	if (out_len)
		*out_len = rt->out_len;
	kj_ar_free(&ar);
	free(rt);
	return rc;
}

/* Convert a JSON value into values held by `ar` (which outlives them). */
int kj_convert_json(const struct kv_tmpl *t, struct arena *ar, const json_t *j, struct val *out)
{
	struct rt *rt = calloc(1, sizeof *rt);
	int rc = KV_OK;
	if (!rt)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	rt->t = t;
	rt->ar = ar;
	rt->max_out = TM_DEFAULT_MAX_OUTPUT;
	if (setjmp(rt->jb)) {
		rc = rt->err ? rt->err : KV_ERR_INVALID;
	} else {
		*out = kj_from_json(rt, j, 0);
	}
	free(rt);
	return rc;
}

int kv_tmpl_render_ex(const struct kv_tmpl *t, const json_t *ctx, const struct kv_tmpl_limits *lim, char **out,
		      size_t *len)
{
	struct arena base = {0};
	struct gval *g = NULL;
	struct kv_buf b = KV_BUF_INIT;
	size_t ng = 0;
	int rc = KV_OK;

	*out = NULL;
	if (len)
		*len = 0;
	if (ctx && !json_is_object(ctx))
		return kv_fail(KV_ERR_INVALID, "%s: the render context must be a JSON object", t->what);
	base.cap = lim && lim->max_memory ? lim->max_memory : TM_DEFAULT_MAX_MEMORY;
	if (ctx && json_object_size(ctx)) {
		const char *k;
		json_t *v;
		g = calloc(json_object_size(ctx), sizeof *g);
		if (!g)
			return kv_fail(KV_ERR_NOMEM, "out of memory");
		json_object_foreach((json_t *)ctx, k, v) {
			if (!kv_map_get(t->syms, k, strlen(k), NULL))
				continue; /* the template never names it */
			g[ng].name = k;
			if ((rc = kj_convert_json(t, &base, v, &g[ng].v)))
				goto done;
			ng++;
		}
	}
	rc = kj_render_core(t, g, (int)ng, lim, &b, NULL, 0, NULL, NULL);
	if (rc == KV_OK) {
		if (b.oom) {
			rc = kv_fail(KV_ERR_NOMEM, "%s: out of memory for the output", t->what);
			goto done;
		}
		if (len)
			*len = b.len;
		*out = b.p ? kv_buf_take(&b) : strdup("");
		if (!*out)
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
	}
done:
	kv_buf_free(&b);
	free(g);
	kj_ar_free(&base);
	return rc;
}

int kv_tmpl_render(const struct kv_tmpl *t, const json_t *ctx, char **out, size_t *len)
{
	return kv_tmpl_render_ex(t, ctx, NULL, out, len);
}

/* ------------------------------------------------------------------------
 * Calls: a macro runs template code, so it is called from here; methods
 * and globals are jinja_builtins.c
 * ---------------------------------------------------------------------- */

static struct val call_macro(struct rt *rt, const struct node *at, const struct macro *m, const struct args *a)
{
	const struct node *def = m->def;
	int np = def->tg->n, ndef = def->nw;
	if (++rt->macro_depth > TM_MAX_MACRO_DEPTH)
		kj_rfail(rt, at, KV_ERR_INVALID, "macros nested deeper than %d calls (runaway recursion?)",
		      TM_MAX_MACRO_DEPTH);
	kj_step(rt, at, 1);
	struct scope *sc = kj_scope_new(rt, at, m->closure);
	if (a->n > np && !def->varargs)
		TYPE_ERR(rt, at, "macro '%s' takes not more than %d argument(s)", def->s, np);
	uint8_t *used = kj_ralloc(rt, at, (size_t)a->nkw + 1);
	memset(used, 0, (size_t)a->nkw + 1);
	for (int i = 0; i < np; i++) {
		struct val v = i < a->n ? a->v[i] : KJ_MISSING;
		for (int k = 0; k < a->nkw; k++)
			if (!strcmp(a->kwn[k], def->tg->names[i])) {
				if (v.t != V_MISSING)
					TYPE_ERR(rt, at, "macro '%s' got multiple values for argument '%s'", def->s,
						 def->tg->names[i]);
				v = a->kwv[k];
				used[k] = 1;
			}
		if (v.t == V_MISSING) {
			int di = i - (np - ndef);
			v = di >= 0 ? kj_eval(rt, def->w[di], sc) : vundef(def->tg->names[i]);
		}
		kj_scope_set(rt, at, sc, def->tg->syms[i], v);
	}
	struct dict *kw = kj_dict_new(rt, at, 0);
	for (int k = 0; k < a->nkw; k++)
		if (!used[k]) {
			if (!def->kwargs)
				TYPE_ERR(rt, at, "macro '%s' takes no keyword argument '%s'", def->s, a->kwn[k]);
			kj_dict_set(rt, at, kw, vstr(a->kwn[k], strlen(a->kwn[k])), a->kwv[k]);
		}
	if (def->varargs) {
		int extra = a->n > np ? a->n - np : 0;
		struct list *l = kj_list_new(rt, at, (size_t)extra, L_TUPLE);
		for (int i = 0; i < extra; i++)
			l->v[i] = a->v[np + i];
		kj_scope_set(rt, at, sc, rt->t->sym_varargs, vlist(l));
	}
	if (def->kwargs)
		kj_scope_set(rt, at, sc, rt->t->sym_kwargs, vdict(kw));
	struct outbuf *saved = rt->cap, ob = {0};
	int ctl = 0;
	rt->cap = &ob;
	kj_exec_body(rt, def->v, def->nv, sc, &ctl);
	rt->cap = saved;
	rt->macro_depth--;
	return kj_ob_val(&ob);
}

struct val kj_call_value(struct rt *rt, const struct node *at, const struct val *f, const struct args *a)
{
	switch (f->t) {
	case V_METHOD:
		return kj_call_method(rt, at, &f->u.me->self, f->fn, a);
	case V_FUNC:
		return kj_call_global(rt, at, f->fn, a);
	case V_MACRO:
		return call_macro(rt, at, f->u.m, a);
	case V_UNDEF:
		kj_fail_undef(rt, at, f);
	}
	TYPE_ERR(rt, at, "'%s' object is not callable", kj_kind_name(f));
}
