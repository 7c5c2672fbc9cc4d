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
#include "text/harmony.h"
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
	/* harmony (the tokenizer has its markers; the vocabulary spells them
	 * as bytes, harmony.h) */
	int harmony;
	int32_t hm_id[KV_HM_N_MARKERS];  /* marker ids by byte - KV_HM_B_START */
	int32_t hm_eos[KSS_MAX_EOS_IDS]; /* eos without <|call|>, <|return|> (grammar bytes) */
	int n_hm_eos;
	uint32_t *hm_free;               /* the analysis body's mask */
	struct kv_grammar *g_an;         /* <|channel|>analysis<|message|> */
	struct kv_grammar *g_re;         /* <|start|>assistant */
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
	if (c->g_an)
		kv_grammar_unref(c->g_an);
	if (c->g_re)
		kv_grammar_unref(c->g_re);
	kv_gvocab_free(c->gv);
	free(c->ws);
	free(c->hm_free);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

/* A grammar of one literal (markers as their bytes), compiled. */
static int literal(struct kss_cons *c, const char *lit, size_t n, struct kv_grammar **out)
{
	struct kv_gram *g;
	int rc = kv_gram_create(&g);
	if (rc)
		return rc;
	int root = kv_gram_rule(g, "root", 4);
	if (!(rc = kv_gram_define(g, root, kv_gram_lit(g, lit, n))) && !(rc = kv_gram_error(g))) {
		kv_gram_set_root(g, root);
		rc = kv_grammar_create(g, c->gv, NULL, out);
	}
	kv_gram_free(g);
	return rc;
}

/* The harmony parts: the ids the grammars must not end on, the analysis
 * body's mask, the two fixed pieces around an analysis message. */
static int harmony_ready(struct kss_cons *c)
{
	for (int i = 0; i < c->p.n_eos; i++)
		if (c->eos[i] != c->hm_id[KV_HM_B_CALL - KV_HM_B_START] &&
		    c->eos[i] != c->hm_id[KV_HM_B_RETURN - KV_HM_B_START])
			c->hm_eos[c->n_hm_eos++] = c->eos[i];
	c->hm_free = malloc((size_t)c->words * sizeof *c->hm_free);
	if (!c->hm_free)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	memset(c->hm_free, 0xff, (size_t)c->words * sizeof *c->hm_free);
	if (c->p.vocab % 32)
		c->hm_free[c->words - 1] = (1u << (c->p.vocab % 32)) - 1;
	for (int i = 0; i < KV_HM_N_MARKERS; i++)
		if (KV_HM_B_START + i != KV_HM_B_END)
			c->hm_free[c->hm_id[i] / 32] &= ~(1u << (c->hm_id[i] % 32));
	for (int i = 0; i < c->p.n_eos; i++)
		if (c->eos[i] >= 0 && c->eos[i] < c->p.vocab)
			c->hm_free[c->eos[i] / 32] &= ~(1u << (c->eos[i] % 32));
	static const char an[] = {(char)KV_HM_B_CHANNEL, 'a', 'n', 'a', 'l', 'y', 's', 'i', 's', (char)KV_HM_B_MESSAGE};
	static const char re[] = {(char)KV_HM_B_START, 'a', 's', 's', 'i', 's', 't', 'a', 'n', 't'};
	int rc = literal(c, an, sizeof an, &c->g_an);
	return rc ? rc : literal(c, re, sizeof re, &c->g_re);
}

/* The vocabulary trie, the grammar cache and the whitespace tokens, made
 * at the first constrained request (a server that never sees one pays
 * nothing). Caller holds mu. */
static int ready_locked(struct kss_cons *c)
{
	if (c->gc)
		return KV_OK;
	/* from scratch: an earlier try may have failed half-way (the
	 * grammars first: they hold the vocabulary) */
	if (c->g_an)
		kv_grammar_unref(c->g_an);
	if (c->g_re)
		kv_grammar_unref(c->g_re);
	c->g_an = c->g_re = NULL;
	kv_gvocab_free(c->gv);
	c->gv = NULL;
	free(c->ws);
	free(c->hm_free);
	c->ws = c->hm_free = NULL;
	c->n_hm_eos = 0;
	uint64_t t0 = kv_now_ns();
	struct kv_tok_bytes *tb;
	int nt = kv_tok_vocab_size(c->p.tok);
	int rc = kv_tok_bytes_build(c->p.tok, c->p.vocab > nt ? c->p.vocab : nt, &tb);
	if (rc)
		return rc;
	c->harmony = kv_hm_vocab_mark(tb, c->p.tok, c->hm_id);
	if ((rc = kv_gvocab_from_bytes(tb, &c->gv)))
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
	if (c->harmony && (rc = harmony_ready(c)))
		return rc;
	struct kv_gcache_params gp = {.max_entries = c->p.max_grammars};
	if ((rc = kv_gcache_create(c->gv, &gp, &c->gc)))
		return rc;
	KV_INFO("constrain.ready", "vocab=%d trie_nodes=%d harmony=%d ms=%.1f", c->p.vocab, c->gv->n_nodes, c->harmony,
		(double)(kv_now_ns() - t0) / 1e6);
	return KV_OK;
}

/* The answer's grammar in harmony's final channel: the body's root rule
 * inside the frame. */
static int harmony_final(struct kv_gram *g)
{
	int root = kv_gram_root(g), r = kv_gram_rule_new(g, "harmony-final");
	int rc = kv_gram_define(g, r, kv_hm_gram_final(g, kv_gram_ref(g, root)));
	if (!rc && !(rc = kv_gram_error(g)))
		kv_gram_set_root(g, r);
	return rc;
}

static int build_plain(const struct kss_cons_spec *sp, struct kv_gram **ir);

static int build(void *ctx, struct kv_gram **ir)
{
	const struct kss_cons_spec *sp = ctx;
	int rc = build_plain(sp, ir);
	if (rc || !sp->harmony || sp->kind == KSS_CONS_TOOLS)
		return rc;
	if ((rc = harmony_final(*ir))) {
		kv_gram_free(*ir);
		*ir = NULL;
	}
	return rc;
}

static int build_plain(const struct kss_cons_spec *sp, struct kv_gram **ir)
{
	/* harmony: strings keep clear of the texts that end a message body */
	struct kv_js_opts jo = {.strict = sp->strict, .forbid = sp->harmony ? kv_hm_body_words : NULL};
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
					   .strict = sp->strict,
					   .harmony = sp->harmony};
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
	int n = snprintf(head, sizeof head, "%d/%d/%d/%d/%d/%d/", sp->kind, sp->strict, sp->choice, sp->parallel, sp->xml,
			 sp->harmony);
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
	if (spec->harmony && !c->harmony)
		return kv_fail(KV_ERR_UNSUPPORTED, "the harmony format needs a tokenizer with its markers (<|channel|>, ...)");
	struct kv_buf key = KV_BUF_INIT;
	if (!(rc = spec_key(spec, &key)))
		rc = kv_gcache_get(c->gc, key.p, key.len, build, (void *)spec, out, hit);
	kv_buf_free(&key);
	return rc;
}

/* --- one generation ------------------------------------------------------------ */

enum { PH_FREE = 0, PH_LEAD, PH_GRAMMAR, PH_RESTART };

struct kss_cmatch {
	struct kss_cons *c;
	struct kv_gmatch *gm;
	uint32_t *mask;
	int phase;
	int first;        /* no token sampled yet */
	int may_think;
	int lead_ws;      /* newline tokens the lead may still take */
	/* harmony (the grammar is framed): the analysis gate while it may
	 * still open, the "<|start|>assistant" after it */
	int hm;
	int g_off;        /* the lead left the answer's grammar for the analysis */
	struct kv_gmatch *an, *re;
	uint32_t *mask2;
};

/* The frame's first byte: a grammar that takes it is harmony-framed. */
static int take_frame(struct kv_gmatch *gm)
{
	static const char fr[] = {(char)KV_HM_B_FRAME};
	return kv_gmatch_accept_bytes(gm, fr, 1);
}

static int harmony_create(struct kss_cmatch *m, struct kv_grammar *g, int may_think)
{
	struct kss_cons *c = m->c;
	int rc = kv_gmatch_create(g, c->hm_eos, c->n_hm_eos, &m->gm);
	if (rc)
		return rc;
	if (take_frame(m->gm)) { /* a grammar of another format */
		kv_gmatch_free(m->gm);
		m->gm = NULL;
		return KV_OK;
	}
	m->hm = 1;
	if (may_think && (rc = kv_gmatch_create(c->g_an, NULL, 0, &m->an)))
		return rc;
	if (may_think && !(m->mask2 = malloc((size_t)c->words * sizeof *m->mask2)))
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	m->phase = PH_LEAD;
	return KV_OK;
}

int kss_cmatch_create(struct kss_cons *c, struct kv_grammar *g, int in_think, int may_think, struct kss_cmatch **out)
{
	struct kss_cmatch *m = calloc(1, sizeof *m);
	*out = NULL;
	if (!m)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	m->c = c;
	m->mask = malloc((size_t)c->words * sizeof *m->mask);
	int rc = m->mask ? KV_OK : kv_fail(KV_ERR_NOMEM, "out of memory");
	if (!rc && c->harmony)
		rc = harmony_create(m, g, may_think);
	if (!rc && !m->hm)
		rc = kv_gmatch_create(g, c->eos, c->p.n_eos, &m->gm);
	if (rc) {
		kss_cmatch_free(m);
		return rc;
	}
	m->first = 1;
	if (m->hm) {
		*out = m;
		return KV_OK;
	}
	/* reasoning needs its end token to ever reach the constraint */
	int thinks = c->think_close >= 0;
	m->phase = in_think && thinks ? PH_FREE : PH_LEAD;
	m->lead_ws = 0; /* newlines only after a reasoning block */
	m->may_think = may_think && thinks && c->think_open >= 0 && !in_think;
	*out = m;
	return KV_OK;
}

void kss_cmatch_free(struct kss_cmatch *m)
{
	if (!m)
		return;
	kv_gmatch_free(m->gm);
	kv_gmatch_free(m->an);
	kv_gmatch_free(m->re);
	free(m->mask);
	free(m->mask2);
	free(m);
}

static int harmony_mask(struct kss_cmatch *m, const uint32_t **mask)
{
	const struct kss_cons *c = m->c;
	int rc = KV_OK;
	switch (m->phase) {
	case PH_FREE:
		*mask = c->hm_free;
		return KV_OK;
	case PH_RESTART:
		rc = kv_gmatch_fill_mask(m->re, m->mask);
		break;
	default:
		if (m->g_off)
			memset(m->mask, 0, (size_t)c->words * sizeof *m->mask);
		else
			rc = kv_gmatch_fill_mask(m->gm, m->mask);
		if (!rc && m->phase == PH_LEAD && m->an && !(rc = kv_gmatch_fill_mask(m->an, m->mask2)))
			for (int i = 0; i < c->words; i++)
				m->mask[i] |= m->mask2[i];
	}
	if (!rc)
		*mask = m->mask;
	return rc;
}

static int harmony_accept(struct kss_cmatch *m, int32_t t)
{
	const struct kss_cons *c = m->c;
	int rc;
	switch (m->phase) {
	case PH_FREE:
		if (t == c->hm_id[KV_HM_B_END - KV_HM_B_START]) {
			if (!m->re && (rc = kv_gmatch_create(c->g_re, NULL, 0, &m->re)))
				return rc;
			m->phase = PH_RESTART;
		}
		return KV_OK;
	case PH_RESTART:
		if ((rc = kv_gmatch_accept(m->re, t)))
			return rc;
		if (kv_gmatch_done(m->re))
			m->phase = PH_LEAD; /* the answer's message; no second analysis */
		return KV_OK;
	case PH_LEAD: {
		int to_g = !m->g_off && kv_gmatch_allows(m->gm, t), to_a = m->an && kv_gmatch_allows(m->an, t);
		if (!to_g && !to_a)
			return kv_fail(KV_ERR_INVALID, "token %d is not allowed at the start of the harmony answer", t);
		if (to_g && (rc = kv_gmatch_accept(m->gm, t)))
			return rc;
		if (to_a && (rc = kv_gmatch_accept(m->an, t)))
			return rc;
		m->g_off |= !to_g;
		if (to_a && kv_gmatch_done(m->an)) {
			/* "<|channel|>analysis<|message|>": the model reasons; the
			 * answer's grammar starts again after it */
			kv_gmatch_reset(m->gm);
			if ((rc = take_frame(m->gm)))
				return rc;
			m->g_off = 0;
			m->phase = PH_FREE;
		}
		if (!to_a || m->phase == PH_FREE) {
			kv_gmatch_free(m->an);
			m->an = NULL;
			if (!to_a)
				m->phase = PH_GRAMMAR;
		}
		return KV_OK;
	}
	default:
		return kv_gmatch_accept(m->gm, t);
	}
}

int kss_cmatch_mask(struct kss_cmatch *m, const uint32_t **mask)
{
	*mask = NULL;
	if (m->hm)
		return harmony_mask(m, mask);
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
	if (m->hm)
		return harmony_accept(m, t);
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
