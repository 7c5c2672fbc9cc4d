/*
 * constrain.c - see constrain.h.
 */
#include "session/constrain.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "text/gbnf.h"
#include "text/gcache.h"
#include "text/jschema.h"
#include "text/tcgram.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define KSS_MAX_EOS_IDS 16

struct kss_cons {
	struct kss_cons_params p;
	int32_t eos[KSS_MAX_EOS_IDS];
	int32_t think_open, think_close; /* -1: the tokenizer has none */
	int words;                       /* mask words */
	pthread_mutex_t mu;              /* the lazy parts below */
	struct kv_gvocab *gv;
	struct kv_gcache *gc;
	uint32_t *ws;                    /* newline-only tokens */
};

int kss_cons_create(const struct kss_cons_params *p, struct kss_cons **out)
{
	struct kss_cons *c = calloc(1, sizeof *c);
	*out = NULL;
	if (!c)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	c->p = *p;
	c->p.n_eos = p->n_eos < KSS_MAX_EOS_IDS ? p->n_eos : KSS_MAX_EOS_IDS;
	memcpy(c->eos, p->eos, (size_t)c->p.n_eos * sizeof *c->eos);
	c->p.eos = c->eos;
	c->think_open = kv_tok_id(p->tok, "<think>");
	c->think_close = kv_tok_id(p->tok, "</think>");
	c->words = (p->vocab + 31) / 32;
	pthread_mutex_init(&c->mu, NULL);
	*out = c;
	return KV_OK;
}

void kss_cons_free(struct kss_cons *c)
{
	if (!c)
		return;
	kv_gcache_free(c->gc);
	kv_gvocab_free(c->gv);
	free(c->ws);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

/* The vocabulary trie, the grammar cache and the whitespace tokens, made
 * at the first constrained request (a server that never sees one pays
 * nothing). Caller holds mu. */
static int ready_locked(struct kss_cons *c)
{
	if (c->gc)
		return KV_OK;
	uint64_t t0 = kv_now_ns();
	int rc = kv_gvocab_create(c->p.tok, c->p.vocab, &c->gv);
	if (rc)
		return rc;
	c->ws = calloc((size_t)c->words, sizeof *c->ws);
	if (!c->ws)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	for (int id = 0; id < c->p.vocab; id++) {
		size_t n;
		const char *b = kv_tok_bytes_get(c->gv->bytes, id, &n);
		if (!n || c->gv->bytes->special[id])
			continue;
		size_t k = 0;
		while (k < n && b[k] == '\n')
			k++;
		if (k == n)
			c->ws[id / 32] |= 1u << (id % 32);
	}
	struct kv_gcache_params gp = {.max_entries = c->p.max_grammars};
	if ((rc = kv_gcache_create(c->gv, &gp, &c->gc)))
		return rc;
	KV_INFO("constrain.ready", "vocab=%d trie_nodes=%d ms=%.1f", c->p.vocab, c->gv->n_nodes,
		(double)(kv_now_ns() - t0) / 1e6);
	return KV_OK;
}

static int build(void *ctx, struct kv_gram **ir)
{
	const struct kss_cons_spec *sp = ctx;
	struct kv_js_opts jo = {.strict = sp->strict};
	switch (sp->kind) {
	case KSS_CONS_SCHEMA:
		return kv_jschema_compile(sp->schema, &jo, ir);
	case KSS_CONS_JSON_OBJECT:
		return kv_jschema_any_object(&jo, ir);
	case KSS_CONS_GBNF:
		return kv_gbnf_parse(sp->gbnf, sp->gbnf_len, ir);
	case KSS_CONS_TOOLS: {
		struct kv_tcg_params tp = {.format = sp->xml,
					   .choice = sp->choice,
					   .name = sp->name,
					   .parallel = sp->parallel,
					   .strict = sp->strict};
		return kv_tcg_build(sp->tools, &tp, ir);
	}
	default:
		return kv_fail(KV_ERR_INVALID, "no constraint");
	}
}

/* The key of a spec: every option, then the text the grammar comes from
 * (JSON as it was sent: property order is part of the grammar). */
static int spec_key(const struct kss_cons_spec *sp, struct kv_buf *k)
{
	char head[64];
	int n = snprintf(head, sizeof head, "%d/%d/%d/%d/%d/", sp->kind, sp->strict, sp->choice, sp->parallel, sp->xml);
	kv_buf_add(k, head, (size_t)n);
	if (sp->name)
		kv_buf_add(k, sp->name, strlen(sp->name) + 1);
	kv_buf_addc(k, 0);
	const json_t *j = sp->kind == KSS_CONS_SCHEMA ? sp->schema : sp->kind == KSS_CONS_TOOLS ? sp->tools : NULL;
	if (j) {
		char *t = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
		if (!t)
			return kv_fail(KV_ERR_NOMEM, "out of memory");
		kv_buf_adds(k, t);
		free(t);
	} else if (sp->kind == KSS_CONS_GBNF) {
		kv_buf_add(k, sp->gbnf, sp->gbnf_len);
	}
	return k->oom ? kv_fail(KV_ERR_NOMEM, "out of memory") : KV_OK;
}

int kss_cons_get(struct kss_cons *c, const struct kss_cons_spec *spec, struct kv_grammar **out, int *hit)
{
	*out = NULL;
	pthread_mutex_lock(&c->mu);
	int rc = ready_locked(c);
	pthread_mutex_unlock(&c->mu);
	if (rc)
		return rc;
	struct kv_buf key = KV_BUF_INIT;
	if (!(rc = spec_key(spec, &key)))
		rc = kv_gcache_get(c->gc, key.p, key.len, build, (void *)spec, out, hit);
	kv_buf_free(&key);
	return rc;
}

/* --- one generation ------------------------------------------------------------ */

enum { PH_FREE = 0, PH_LEAD, PH_GRAMMAR };

struct kss_cmatch {
	struct kss_cons *c;
	struct kv_gmatch *gm;
	uint32_t *mask;
	int phase;
	int first;        /* no token sampled yet */
	int may_think;
	int lead_ws;      /* newline tokens the lead may still take */
};

int kss_cmatch_create(struct kss_cons *c, struct kv_grammar *g, int in_think, int may_think, struct kss_cmatch **out)
{
	struct kss_cmatch *m = calloc(1, sizeof *m);
	*out = NULL;
	if (!m)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	m->c = c;
	m->mask = malloc((size_t)c->words * sizeof *m->mask);
	int rc = m->mask ? kv_gmatch_create(g, c->eos, c->p.n_eos, &m->gm) : kv_fail(KV_ERR_NOMEM, "out of memory");
	if (rc) {
		kss_cmatch_free(m);
		return rc;
	}
	/* reasoning needs its end token to ever reach the constraint */
	int thinks = c->think_close >= 0;
	m->phase = in_think && thinks ? PH_FREE : PH_LEAD;
	m->lead_ws = 0; /* newlines only after a reasoning block */
	m->may_think = may_think && thinks && c->think_open >= 0 && !in_think;
	m->first = 1;
	*out = m;
	return KV_OK;
}

void kss_cmatch_free(struct kss_cmatch *m)
{
	if (!m)
		return;
	kv_gmatch_free(m->gm);
	free(m->mask);
	free(m);
}

int kss_cmatch_mask(struct kss_cmatch *m, const uint32_t **mask)
{
	*mask = NULL;
	if (m->phase == PH_FREE)
		return KV_OK;
	int rc = kv_gmatch_fill_mask(m->gm, m->mask);
	if (rc)
		return rc;
	if (m->phase == PH_LEAD) {
		const struct kss_cons *c = m->c;
		if (m->lead_ws > 0)
			for (int i = 0; i < c->words; i++)
				m->mask[i] |= c->ws[i];
		if (m->first && m->may_think)
			m->mask[c->think_open / 32] |= 1u << (c->think_open % 32);
	}
	*mask = m->mask;
	return KV_OK;
}

int kss_cmatch_accept(struct kss_cmatch *m, int32_t t)
{
	const struct kss_cons *c = m->c;
	int first = m->first;
	m->first = 0;
	switch (m->phase) {
	case PH_FREE:
		if (t == c->think_close) {
			m->phase = PH_LEAD;
			m->lead_ws = KSS_LEAD_WS;
		}
		return KV_OK;
	case PH_LEAD:
		if (first && m->may_think && t == c->think_open) {
			m->phase = PH_FREE;
			return KV_OK;
		}
		if (!kv_gmatch_accept(m->gm, t)) {
			m->phase = PH_GRAMMAR;
			return KV_OK;
		}
		if (t >= 0 && t < c->p.vocab && m->lead_ws > 0 && (c->ws[t / 32] >> (t % 32) & 1)) {
			m->lead_ws--;
			return KV_OK;
		}
		return kv_fail(KV_ERR_INVALID, "token %d is not allowed before the constrained output", t);
	default:
		return kv_gmatch_accept(m->gm, t);
	}
}

int kss_cmatch_done(const struct kss_cmatch *m)
{
	return m->phase == PH_GRAMMAR && kv_gmatch_done(m->gm);
}
