/*
 * test_grammar.c - the constraint engine's core (text/gram.h, gbnf.h,
 * gpda.h, gvocab.h, gmatch.h): GBNF parsing and its errors, what a
 * compiled grammar accepts, and the token masks: the cached mask must
 * equal a brute-force check of every token of a small vocabulary, on
 * random walks through several grammars (recursive ones included, where
 * the stack-dependent tokens are checked at run time).
 */
#include "kt.h"

#include "base/buf.h"
#include "base/err.h"
#include "text/gbnf.h"
#include "text/gcache.h"
#include "text/gmatch.h"
#include "text/gpda.h"
#include "text/gram.h"
#include "text/gvocab.h"
#include "text/jschema.h"
#include "text/tcgram.h"
#include "text/toolcall.h"
#include "text/tokbytes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A small vocabulary: every byte 0x20..0x7E and \n alone, then pieces
 * that cross rule boundaries in the grammars below, UTF-8 pieces (whole
 * and cut inside a character) and one special token (id 1, never
 * allowed: it plays end-of-sequence). */
static struct kv_gvocab *small_vocab(void)
{
	static const char *extra[] = {
	    "\"",   "\":",   "\",",   "\"}",   "{\"",   "[\"",    "\"]",   "},",   "}]",    "]}",   "12",   "3.5",
	    "true", "false", "null",  "nul",   ", ",    ": ",     "ab",    "abc",  "a\"",   "b\"}", "\\n",  "\\u00",
	    "é",    "\xC3",  "\xA9",  "日本",  "\xE6\x97", "\xA5", "()",   "(a",   "a)",    "))",   "+1",   "*2",
	    "1. ",  "e4 ",   "O-O",   "x1",    "\n- ",  "- ",     "aa",    "aaa",  "b,",    "\"a\"", "[[",   "]]",
	    "{}",   "[]",    "\"\"",  " \"",   "\\\"",  "-1",     "0.",    "1e",   "E+",    "Nf",   "\t",   "  ",
	};
	int n_extra = (int)(sizeof extra / sizeof extra[0]);
	int n = 2 + 96 + n_extra;
	const char **s = calloc((size_t)n, sizeof *s);
	size_t *len = calloc((size_t)n, sizeof *len);
	uint8_t *sp = calloc((size_t)n, 1);
	static char bytes[96];
	s[0] = "";
	len[0] = 0; /* an id without text */
	s[1] = "<|end|>";
	len[1] = 7;
	sp[1] = 1;
	for (int i = 0; i < 95; i++) {
		bytes[i] = (char)(0x20 + i);
		s[2 + i] = &bytes[i];
		len[2 + i] = 1;
	}
	bytes[95] = '\n';
	s[2 + 95] = &bytes[95];
	len[2 + 95] = 1;
	for (int i = 0; i < n_extra; i++) {
		s[2 + 96 + i] = extra[i];
		len[2 + 96 + i] = strlen(extra[i]);
	}
	struct kv_tok_bytes *b;
	struct kv_gvocab *v = NULL;
	if (!kv_tok_bytes_from(s, len, sp, n, &b))
		kv_gvocab_from_bytes(b, &v);
	free(s);
	free(len);
	free(sp);
	return v;
}

static struct kv_grammar *compile(const char *text, const struct kv_gvocab *v)
{
	struct kv_gram *g;
	struct kv_grammar *G = NULL;
	if (kv_gbnf_parse(text, strlen(text), &g)) {
		kt_fail(__FILE__, __LINE__, "parse: %s", kv_errmsg());
		return NULL;
	}
	if (kv_grammar_create(g, v, NULL, &G))
		kt_fail(__FILE__, __LINE__, "compile: %s", kv_errmsg());
	kv_gram_free(g);
	return G;
}

/* 1 when the whole string s is a complete sentence of G. */
static int matches(struct kv_grammar *G, const char *s)
{
	struct kv_gmatch *m;
	if (kv_gmatch_create(G, NULL, 0, &m))
		return -1;
	int ok = kv_gmatch_accept_bytes(m, s, strlen(s)) == KV_OK && kv_gmatch_can_end(m);
	kv_gmatch_free(m);
	return ok;
}

static const char *G_ARITH = "root  ::= (expr \"=\" ws term \"\\n\")+\n"
			     "expr  ::= term ([-+*/] term)*\n"
			     "term  ::= ident | num | \"(\" ws expr \")\" ws\n"
			     "ident ::= [a-z] [a-z0-9_]* ws\n"
			     "num   ::= [0-9]+ ws\n"
			     "ws    ::= [ \\t\\n]*\n";

static const char *G_JSON = "root   ::= object\n"
			    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
			    "object ::=\n"
			    "  \"{\" ws (\n"
			    "            string \":\" ws value\n"
			    "    (\",\" ws string \":\" ws value)*\n"
			    "  )? \"}\" ws\n"
			    "array  ::=\n"
			    "  \"[\" ws (\n"
			    "            value\n"
			    "    (\",\" ws value)*\n"
			    "  )? \"]\" ws\n"
			    "string ::=\n"
			    "  \"\\\"\" (\n"
			    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
			    "    \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
			    "  )* \"\\\"\" ws\n"
			    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
			    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const char *G_CHESS = "root    ::= \"1. \" move \" \" move \"\\n\" ([1-9] [0-9]? \". \" move \" \" move \"\\n\")+\n"
			     "move    ::= (pawn | nonpawn | castle) [+#]?\n"
			     "nonpawn ::= [NBKQR] [a-h]? [1-8]? \"x\"? [a-h] [1-8]\n"
			     "pawn    ::= ([a-h] \"x\")? [a-h] [1-8] (\"=\" [NBKQR])?\n"
			     "castle  ::= \"O-O\" \"-O\"?\n";

/* Balanced parentheses: recursion that is not a loop. */
static const char *G_PARENS = "root ::= p+\np ::= \"(\" p* \")\" | \"a\"\n";

/* Right recursion (a loop) and a nullable repetition of a rule. */
static const char *G_LOOP = "root ::= item\nitem ::= \"a\" item | \"b\" rest\nrest ::= (x)* \"!\"\nx ::= \"\" | \"c\"\n";

/* Unicode classes and '.' */
static const char *G_UTF8 = "root ::= [à-ÿ]+ \" \" [日本]+ \".\" . [^a-z]\n";

KT_CASE(gbnf_accepts_and_rejects)
{
	struct kv_gvocab *v = small_vocab();
	KT_REQUIRE(v);
	struct kv_grammar *G = compile(G_ARITH, v);
	KT_REQUIRE(G);
	KT_EQ_INT(matches(G, "a=b\n"), 1);
	KT_EQ_INT(matches(G, "x1+(y*2)= 7\n"), 1);
	KT_EQ_INT(matches(G, "(a+(b))=c\nd=3\n"), 1);
	KT_EQ_INT(matches(G, "a=b"), 0);
	KT_EQ_INT(matches(G, "(a=b\n"), 0);
	KT_EQ_INT(matches(G, "a)=b\n"), 0);
	kv_grammar_unref(G);
	G = compile(G_JSON, v);
	KT_REQUIRE(G);
	KT_EQ_INT(matches(G, "{}"), 1);
	KT_EQ_INT(matches(G, "{\"a\": [1, 2.5, {\"b\": null}], \"c\": \"x\\n\\u00e9\"}"), 1);
	KT_EQ_INT(matches(G, "{\"a\": [1,]}"), 0);
	KT_EQ_INT(matches(G, "{\"a\" 1}"), 0);
	KT_EQ_INT(matches(G, "[1]"), 0);
	KT_EQ_INT(matches(G, "{\"a\": 01}"), 0);
	kv_grammar_unref(G);
	G = compile(G_CHESS, v);
	KT_REQUIRE(G);
	KT_EQ_INT(matches(G, "1. e4 e5\n2. Nf3 Nc6\n"), 1);
	KT_EQ_INT(matches(G, "1. e4 e5\n2. O-O-O Qxd8+\n"), 1);
	KT_EQ_INT(matches(G, "1. e4 e5\n"), 0);
	KT_EQ_INT(matches(G, "1. e9 e5\n2. a3 a4\n"), 0);
	kv_grammar_unref(G);
	G = compile(G_PARENS, v);
	KT_REQUIRE(G);
	KT_EQ_INT(matches(G, "a"), 1);
	KT_EQ_INT(matches(G, "(a(aa)())a"), 1);
	KT_EQ_INT(matches(G, "(()"), 0);
	KT_EQ_INT(matches(G, "())"), 0);
	kv_grammar_unref(G);
	G = compile(G_LOOP, v);
	KT_REQUIRE(G);
	KT_EQ_INT(matches(G, "aaab!"), 1);
	KT_EQ_INT(matches(G, "bccc!"), 1);
	KT_EQ_INT(matches(G, "ab"), 0);
	KT_EQ_INT(matches(G, "aa!"), 0);
	kv_grammar_unref(G);
	G = compile(G_UTF8, v);
	KT_REQUIRE(G);
	KT_EQ_INT(matches(G, "éÿ 日本日.xZ"), 1);
	KT_EQ_INT(matches(G, "é 本.日日"), 1);
	KT_EQ_INT(matches(G, "e 本.xZ"), 0);
	KT_EQ_INT(matches(G, "é 本.xz"), 0);
	KT_EQ_INT(matches(G, "é \xE6\x97.xZ"), 0); /* a cut character */
	kv_grammar_unref(G);
	kv_gvocab_free(v);
}

/* The error message of parsing (or compiling) text must contain want. */
static void expect_error(const char *text, const char *want)
{
	struct kv_gram *g = NULL;
	struct kv_gpda *a = NULL;
	int rc = kv_gbnf_parse(text, strlen(text), &g);
	if (!rc) {
		rc = kv_gpda_compile(g, NULL, &a);
		kv_gpda_free(a);
		kv_gram_free(g);
	}
	if (!rc) {
		kt_fail(__FILE__, __LINE__, "grammar %s: no error (wanted '%s')", text, want);
		return;
	}
	if (!strstr(kv_errmsg(), want))
		kt_fail(__FILE__, __LINE__, "grammar %s: error '%s' does not say '%s'", text, kv_errmsg(), want);
}

KT_CASE(gbnf_errors_name_the_problem)
{
	expect_error("root ::= \"a\" \"b", "line 1 column 14: unclosed string literal");
	expect_error("root ::= [a-", "unclosed character class");
	expect_error("root ::= (\"a\" | \"b\"\n", "unclosed group");
	expect_error("root ::= \"a\"\nroot ::= \"b\"\n", "line 2 column 1: rule 'root' is defined twice");
	expect_error("root ::= foo \"x\"\n", "rule 'foo' is used but never defined");
	expect_error("root ::= \"a\" \\q", "unexpected character");
	expect_error("root ::= \"\\q\"", "unknown escape \\q");
	expect_error("root ::= \"\\xZZ\"", "escape \\x needs hexadecimal digits");
	expect_error("root ::= [z-a]", "backwards");
	expect_error("root ::= \"a\"{3,2}", "n < m");
	expect_error("root ::= \"a\"{1000000}", "larger than 100000");
	expect_error("foo ::= \"a\"\n", "no 'root' rule");
	expect_error("root ::= <[123]>", "token references");
	expect_error("root ::= \"a\" )", "unmatched ')'");
	expect_error("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]\n",
		     "left recursion: rule 'expr' can reach itself");
	expect_error("root ::= a\na ::= b* \"z\"\nb ::= a | \"\"\n", "left recursion");
	expect_error("root ::= \"a\" root\n", "matches no string");
	expect_error("root ::= x\nx ::= \"(\" x \")\"\n", "matches no string");
	expect_error("root ::= [a-z]{100000} [a-z]{100000} [0-9]{100000}", "too large");
	/* a deep nest of groups */
	struct kv_buf b = KV_BUF_INIT;
	kv_buf_adds(&b, "root ::= ");
	for (int i = 0; i < 300; i++)
		kv_buf_addc(&b, '(');
	expect_error(b.p, "nest too deeply");
	kv_buf_free(&b);
}

/* Compare the cached mask with brute force along random walks. */
static void random_walks(const char *grammar, int walks, int steps, uint64_t seed)
{
	struct kv_gvocab *v = small_vocab();
	KT_REQUIRE(v);
	struct kv_grammar *G = compile(grammar, v);
	if (!G) {
		kv_gvocab_free(v);
		return;
	}
	int32_t eos = 1;
	struct kv_gmatch *m;
	KT_OK(kv_gmatch_create(G, &eos, 1, &m));
	int W = kv_gmatch_mask_words(m);
	uint32_t *a = calloc((size_t)W, 4), *b = calloc((size_t)W, 4);
	uint64_t rs = seed;
	for (int w = 0; w < walks; w++) {
		kv_gmatch_reset(m);
		for (int s = 0; s < steps; s++) {
			KT_OK(kv_gmatch_fill_mask(m, a));
			KT_OK(kv_gmatch_fill_mask_slow(m, b));
			if (memcmp(a, b, (size_t)W * 4)) {
				for (int t = 0; t < v->n_ids; t++) {
					int x = (a[t >> 5] >> (t & 31)) & 1, y = (b[t >> 5] >> (t & 31)) & 1;
					if (x != y) {
						size_t l;
						const char *p = kv_tok_bytes_get(v->bytes, t, &l);
						kt_fail(__FILE__, __LINE__, "walk %d step %d: token %d '%.*s' cached %d brute %d", w,
							s, t, (int)l, p, x, y);
						break;
					}
				}
				goto done;
			}
			/* pick a random allowed token; prefer not ending early */
			int cand[512], nc = 0;
			for (int t = 0; t < v->n_ids && nc < 512; t++)
				if (((a[t >> 5] >> (t & 31)) & 1) && t != eos)
					cand[nc++] = t;
			if (!nc) {
				KT_CHECK(kv_gmatch_can_end(m));
				break;
			}
			int t = cand[kt_rand(&rs) % (uint64_t)nc];
			KT_OK(kv_gmatch_accept(m, t));
		}
		/* the shortest completion must end the output */
		struct kv_buf c = KV_BUF_INIT;
		KT_OK(kv_gmatch_complete(m, &c));
		if (c.len)
			KT_OK(kv_gmatch_accept_bytes(m, c.p, c.len));
		KT_CHECK(kv_gmatch_can_end(m));
		KT_OK(kv_gmatch_accept(m, eos));
		KT_CHECK(kv_gmatch_ended(m));
		kv_buf_free(&c);
	}
done:
	if (getenv("KT_VERBOSE")) {
		struct kv_grammar_stats st;
		struct kv_gmatch_stats ms;
		kv_grammar_get_stats(G, &st);
		kv_gmatch_get_stats(m, &ms);
		fprintf(stderr, "states %d rules %d entries %llu dependent %llu masks %llu dep_checked %llu hits %llu\n",
			st.n_states, st.n_rules, (unsigned long long)st.entries_computed,
			(unsigned long long)st.dependent_total, (unsigned long long)ms.masks,
			(unsigned long long)ms.dep_checked, (unsigned long long)ms.dep_cache_hits);
	}
	free(a);
	free(b);
	kv_gmatch_free(m);
	kv_grammar_unref(G);
	kv_gvocab_free(v);
}

KT_CASE(mask_equals_brute_force_arith)
{
	random_walks(G_ARITH, 20, 40, 1);
}

KT_CASE(mask_equals_brute_force_json)
{
	random_walks(G_JSON, 20, 60, 2);
}

KT_CASE(mask_equals_brute_force_parens)
{
	random_walks(G_PARENS, 20, 40, 3);
}

KT_CASE(mask_equals_brute_force_small_grammars)
{
	random_walks(G_CHESS, 10, 30, 4);
	random_walks(G_LOOP, 10, 30, 5);
	random_walks(G_UTF8, 10, 30, 6);
	random_walks("root ::= (\"ab\" | \"a\" \"bc\"?)+ \"\\n\"\n", 10, 30, 7);
	random_walks("root ::= x \"}\"\nx ::= \"{\" (x | \"a\")* \"}\" | \"b\"\n", 10, 30, 8);
}


/* A compiled grammar (any front end) and whether it accepts s whole. */
static int gram_matches(struct kv_gram *ir, const char *s)
{
	struct kv_gvocab *v = small_vocab();
	struct kv_grammar *G = NULL;
	int ok = -1;
	if (v && !kv_grammar_create(ir, v, NULL, &G))
		ok = matches(G, s);
	kv_grammar_unref(G);
	kv_gvocab_free(v);
	return ok;
}

static int schema_matches(const char *schema, const char *s)
{
	json_error_t e;
	json_t *j = json_loads(schema, JSON_DECODE_ANY, &e);
	struct kv_gram *ir = NULL;
	struct kv_js_opts o = {0};
	int ok = -1;
	if (j && !kv_jschema_compile(j, &o, &ir))
		ok = gram_matches(ir, s);
	else
		kt_fail(__FILE__, __LINE__, "schema %s: %s", schema, kv_errmsg());
	kv_gram_free(ir);
	json_decref(j);
	return ok;
}

KT_CASE(json_schema_layout_and_keywords)
{
	const char *obj = "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"string\"}, "
			  "\"c\": {\"type\": \"boolean\"}}, \"required\": [\"b\"], \"additionalProperties\": false}";
	KT_EQ_INT(schema_matches(obj, "{\"b\":\"x\"}"), 1);
	KT_EQ_INT(schema_matches(obj, "{\"a\": 1, \"b\": \"x\", \"c\": true}"), 1);
	KT_EQ_INT(schema_matches(obj, "{\"a\":-7,\"b\":\"\"}"), 1);
	KT_EQ_INT(schema_matches(obj, "{\"b\": \"x\", \"a\": 1}"), 0);   /* schema order */
	KT_EQ_INT(schema_matches(obj, "{\"a\": 1}"), 0);                /* b is required */
	KT_EQ_INT(schema_matches(obj, "{ \"b\": \"x\"}"), 0);           /* the layout */
	KT_EQ_INT(schema_matches(obj, "{\"b\":  \"x\"}"), 0);
	KT_EQ_INT(schema_matches(obj, "{\"b\": \"x\", \"d\": 1}"), 0);
	KT_EQ_INT(schema_matches("{\"type\": \"integer\", \"minimum\": -5, \"maximum\": 120}", "120"), 1);
	KT_EQ_INT(schema_matches("{\"type\": \"integer\", \"minimum\": -5, \"maximum\": 120}", "121"), 0);
	KT_EQ_INT(schema_matches("{\"type\": \"integer\", \"minimum\": -5, \"maximum\": 120}", "-5"), 1);
	KT_EQ_INT(schema_matches("{\"type\": \"integer\", \"minimum\": -5, \"maximum\": 120}", "-6"), 0);
	KT_EQ_INT(schema_matches("{\"type\": \"integer\", \"minimum\": -5, \"maximum\": 120}", "007"), 0);
	KT_EQ_INT(schema_matches("{\"type\": \"number\", \"exclusiveMinimum\": 0, \"maximum\": 1}", "0.5"), 1);
	KT_EQ_INT(schema_matches("{\"type\": \"number\", \"exclusiveMinimum\": 0, \"maximum\": 1}", "0"), 0);
	KT_EQ_INT(schema_matches("{\"type\": \"number\", \"exclusiveMinimum\": 0, \"maximum\": 1}", "0.000"), 0);
	KT_EQ_INT(schema_matches("{\"type\": \"number\", \"exclusiveMinimum\": 0, \"maximum\": 1}", "1.0"), 1);
	KT_EQ_INT(schema_matches("{\"type\": \"number\", \"exclusiveMinimum\": 0, \"maximum\": 1}", "1.01"), 0);
	KT_EQ_INT(schema_matches("{\"type\": \"string\", \"maxLength\": 2}", "\"é\\n\""), 1);
	KT_EQ_INT(schema_matches("{\"type\": \"string\", \"maxLength\": 2}", "\"\\u001f\\\"\""), 1);
	KT_EQ_INT(schema_matches("{\"type\": \"string\", \"maxLength\": 2}", "\"abc\""), 0);
	KT_EQ_INT(schema_matches("{\"type\": \"string\", \"format\": \"date\"}", "\"2024-02-28\""), 1);
	KT_EQ_INT(schema_matches("{\"type\": \"string\", \"format\": \"date\"}", "\"2024-02-30\""), 0);
	KT_EQ_INT(schema_matches("{\"type\": \"string\", \"pattern\": \"^a+$\"}", "\"aaa\""), 1);
	KT_EQ_INT(schema_matches("{\"type\": \"string\", \"pattern\": \"b\"}", "\"xxbyy\""), 1);
	KT_EQ_INT(schema_matches("{\"type\": \"string\", \"pattern\": \"b\"}", "\"xxyy\""), 0);
	KT_EQ_INT(schema_matches("{\"enum\": [\"a\\\"b\", 1, null]}", "\"a\\\"b\""), 1);
	KT_EQ_INT(schema_matches("{\"const\": {\"k\": [1, true]}}", "{\"k\": [1, true]}"), 1);
	KT_EQ_INT(schema_matches("{\"type\": [\"string\", \"null\"]}", "null"), 1);
	KT_EQ_INT(schema_matches("{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 2, \"maxItems\": 3}",
				 "[1, 2,3]"), 1);
	KT_EQ_INT(schema_matches("{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 2, \"maxItems\": 3}",
				 "[1]"), 0);
	KT_EQ_INT(schema_matches("{\"type\": \"array\", \"prefixItems\": [{\"type\": \"string\"}], \"items\": false}", "[\"x\"]"), 1);
	KT_EQ_INT(schema_matches("{\"type\": \"array\", \"prefixItems\": [{\"type\": \"string\"}], \"items\": false}",
				 "[\"x\", 1]"), 0);
	const char *rec = "{\"$defs\": {\"n\": {\"type\": \"object\", \"properties\": {\"k\": {\"type\": \"array\", \"items\": "
			  "{\"$ref\": \"#/$defs/n\"}}}, \"additionalProperties\": false}}, \"$ref\": \"#/$defs/n\"}";
	KT_EQ_INT(schema_matches(rec, "{\"k\": [{}, {\"k\": [{\"k\": []}]}]}"), 1);
	KT_EQ_INT(schema_matches(rec, "{\"k\": [{\"j\": 1}]}"), 0);
	KT_EQ_INT(schema_matches("{\"type\": \"object\", \"additionalProperties\": {\"type\": \"integer\"}}", "{\"x\": 1, \"y-2\": 3}"), 1);
	KT_EQ_INT(schema_matches("{\"type\": \"object\", \"additionalProperties\": {\"type\": \"integer\"}}", "{\"x\": \"s\"}"), 0);
	KT_EQ_INT(schema_matches("{\"type\": \"object\"}", "{\"free\": [1, {\"n\": null}], \"s\": \"t\"}"), 1);
}

/* strict: the error names the keyword and where it is */
static void schema_error(const char *schema, int strict, int want_rc, const char *want)
{
	json_error_t e;
	json_t *j = json_loads(schema, JSON_DECODE_ANY, &e);
	struct kv_gram *ir = NULL;
	struct kv_js_opts o = {.strict = strict};
	int rc = j ? kv_jschema_compile(j, &o, &ir) : -100;
	if (!rc && ir) { /* some errors show up when the automaton is built */
		struct kv_gpda *a = NULL;
		struct kv_gpda_limits lim = {.max_dfa_states = 20000};
		rc = kv_gpda_compile(ir, &lim, &a);
		kv_gpda_free(a);
	}
	if (rc != want_rc)
		kt_fail(__FILE__, __LINE__, "schema %s: rc %d, wanted %d (%s)", schema, rc, want_rc, kv_errmsg());
	else if (want && !strstr(kv_errmsg(), want))
		kt_fail(__FILE__, __LINE__, "schema %s: error '%s' does not say '%s'", schema, kv_errmsg(), want);
	kv_gram_free(ir);
	json_decref(j);
}

KT_CASE(json_schema_errors_name_the_problem)
{
	schema_error("{\"not\": {\"type\": \"string\"}}", 1, KV_ERR_UNSUPPORTED, "unsupported JSON Schema keyword 'not' at #");
	schema_error("{\"not\": {\"type\": \"string\"}}", 0, 0, NULL);
	schema_error("{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"object\", \"patternProperties\": {}}}}", 1,
		     KV_ERR_UNSUPPORTED, "'patternProperties' at #/properties/x");
	schema_error("{\"type\": \"string\", \"format\": \"ipv6\"}", 1, KV_ERR_UNSUPPORTED, "format \"ipv6\"");
	schema_error("{\"type\": \"string\", \"format\": \"ipv6\"}", 0, 0, NULL);
	schema_error("{\"type\": \"string\", \"pattern\": \"^(?=a)b$\"}", 1, KV_ERR_UNSUPPORTED, "lookahead");
	schema_error("{\"type\": \"string\", \"pattern\": \"(a\"}", 0, KV_ERR_INVALID, "unclosed group");
	schema_error("{\"type\": \"array\", \"uniqueItems\": true}", 1, KV_ERR_UNSUPPORTED, "'uniqueItems'");
	schema_error("{\"type\": \"number\", \"multipleOf\": 3}", 1, KV_ERR_UNSUPPORTED, NULL);
	schema_error("{\"type\": \"strng\"}", 0, KV_ERR_INVALID, "type must be");
	schema_error("{\"$ref\": \"#/$defs/missing\"}", 0, KV_ERR_INVALID, "points to nothing");
	schema_error("{\"$ref\": \"https://example.com/s.json\"}", 0, KV_ERR_UNSUPPORTED, "'$ref'");
	schema_error("{\"enum\": 3}", 0, KV_ERR_INVALID, "enum must be an array");
	schema_error("{\"type\": \"string\", \"minLength\": 5, \"maxLength\": 2}", 0, KV_ERR_INVALID, "minLength is larger");
	schema_error("{\"type\": \"integer\", \"minimum\": 5, \"maximum\": 2}", 0, KV_ERR_INVALID, "no integer lies within");
	schema_error("false", 0, KV_ERR_INVALID, "no value can match");
	schema_error("{\"type\": \"object\", \"required\": [\"x\"], \"additionalProperties\": false}", 0, KV_ERR_INVALID,
		     "required property \"x\" is not allowed");
	schema_error("{\"enum\": [1, 2], \"type\": \"string\"}", 0, KV_ERR_INVALID, "no enum / const value fits");
	schema_error("{\"$defs\": {\"a\": {\"$ref\": \"#/$defs/a\"}}, \"$ref\": \"#/$defs/a\"}", 0, KV_ERR_INVALID, NULL);
	/* large but bounded: the automaton's limit, never a hang */
	schema_error("{\"type\": \"array\", \"items\": {\"type\": \"string\", \"pattern\": \"^(a|b)*a(a|b){18}$\"}, \"maxItems\": 3}",
		     0, KV_ERR_INVALID, "too large");
	/* deep nesting */
	struct kv_buf b = KV_BUF_INIT;
	for (int i = 0; i < 120; i++)
		kv_buf_adds(&b, "{\"type\": \"array\", \"items\": ");
	kv_buf_adds(&b, "{\"type\": \"integer\"}");
	for (int i = 0; i < 120; i++)
		kv_buf_addc(&b, '}');
	schema_error(b.p, 0, 0, NULL);
	kv_buf_free(&b);
}

/* The tool-call grammar accepts what the chat templates write and what
 * toolcall.c parses, and the parse gives back the arguments. */
KT_CASE(tool_call_grammars_round_trip)
{
	json_error_t e;
	json_t *tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"read\", \"parameters\": {\"type\": "
				   "\"object\", \"properties\": {\"path\": {\"type\": \"string\"}, \"limit\": {\"type\": "
				   "\"integer\", \"minimum\": 1}, \"flags\": {\"type\": \"array\", \"items\": {\"type\": "
				   "\"string\"}}}, \"required\": [\"path\"], \"additionalProperties\": false}}}, "
				   "{\"type\": \"function\", \"function\": {\"name\": \"stop\", \"parameters\": {\"type\": "
				   "\"object\", \"properties\": {}}}}]",
				   0, &e);
	KT_REQUIRE(tools);
	struct kv_gram *ir;
	struct kv_tcg_params p = {.format = KV_TC_JSON, .choice = KV_TCG_REQUIRED};
	KT_OK(kv_tcg_build(tools, &p, &ir));
	const char *jcall = "<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"a</b>.c\", \"limit\": 3}}\n</tool_call>";
	KT_EQ_INT(gram_matches(ir, jcall), 1);
	KT_EQ_INT(gram_matches(ir, "<tool_call>\n{\"name\": \"stop\", \"arguments\": {}}\n</tool_call>"), 1);
	KT_EQ_INT(gram_matches(ir, "<tool_call>\n{\"name\": \"read\", \"arguments\": {\"limit\": 3}}\n</tool_call>"), 0);
	/* a string may not close the call early */
	KT_EQ_INT(gram_matches(ir, "<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"x</tool_call>\"}}\n</tool_call>"), 0);
	KT_EQ_INT(gram_matches(ir, "hello <tool_call>\n{\"name\": \"stop\", \"arguments\": {}}\n</tool_call>"), 0);
	kv_gram_free(ir);
	p.parallel = 1;
	KT_OK(kv_tcg_build(tools, &p, &ir));
	KT_EQ_INT(gram_matches(ir, "<tool_call>\n{\"name\": \"stop\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": "
				   "\"stop\", \"arguments\": {}}\n</tool_call>"), 1);
	kv_gram_free(ir);
	/* auto: text without an opener, then maybe calls */
	p = (struct kv_tcg_params){.format = KV_TC_JSON, .choice = KV_TCG_AUTO};
	KT_OK(kv_tcg_build(tools, &p, &ir));
	KT_EQ_INT(gram_matches(ir, "Let me look.\n\n<tool_call>\n{\"name\": \"stop\", \"arguments\": {}}\n</tool_call>"), 1);
	KT_EQ_INT(gram_matches(ir, "Just text, no call."), 1);
	KT_EQ_INT(gram_matches(ir, "text <tool_call> more"), 0);
	kv_gram_free(ir);
	/* the XML form, and what the parser makes of it */
	p = (struct kv_tcg_params){.format = KV_TC_XML, .choice = KV_TCG_NAMED, .name = "read"};
	KT_OK(kv_tcg_build(tools, &p, &ir));
	const char *xcall = "<tool_call>\n<function=read>\n<parameter=path>\nsrc/a <b>.c\n</parameter>\n<parameter=flags>\n"
			    "[\"-n\"]\n</parameter>\n</function>\n</tool_call>";
	KT_EQ_INT(gram_matches(ir, xcall), 1);
	KT_EQ_INT(gram_matches(ir, "<tool_call>\n<function=stop>\n</function>\n</tool_call>"), 0);
	KT_EQ_INT(gram_matches(ir, "<tool_call>\n<function=read>\n<parameter=path>\nx</parameter>y\n</parameter>\n</function>\n"
				   "</tool_call>"), 0);
	kv_gram_free(ir);
	struct kv_tc_params tp = {.format = KV_TC_XML, .tools = tools};
	char *content;
	size_t cl;
	json_t *calls;
	KT_OK(kv_tc_parse(xcall, strlen(xcall), &tp, NULL, &content, &cl, &calls));
	KT_EQ_INT(json_array_size(calls), 1);
	KT_EQ_STR(json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments")),
		  "{\"path\": \"src/a <b>.c\", \"flags\": [\"-n\"]}");
	free(content);
	json_decref(calls);
	/* Nemotron-H's list form: one <TOOLCALL>[...] block, ", " between
	 * calls, the JSON form's object as each element; the parser gives the
	 * calls back */
	p = (struct kv_tcg_params){.format = KV_TC_LIST, .choice = KV_TCG_REQUIRED, .parallel = 1};
	KT_OK(kv_tcg_build(tools, &p, &ir));
	const char *lcall = "<TOOLCALL>[{\"name\": \"read\", \"arguments\": {\"path\": \"a</b>.c\"}}, {\"name\": \"stop\", "
			    "\"arguments\": {}}]</TOOLCALL>";
	KT_EQ_INT(gram_matches(ir, lcall), 1);
	KT_EQ_INT(gram_matches(ir, "<TOOLCALL>[{\"name\": \"stop\", \"arguments\": {}}]</TOOLCALL>"), 1);
	KT_EQ_INT(gram_matches(ir, "<TOOLCALL>[]</TOOLCALL>"), 0);
	KT_EQ_INT(gram_matches(ir, "<tool_call>\n{\"name\": \"stop\", \"arguments\": {}}\n</tool_call>"), 0);
	KT_EQ_INT(gram_matches(ir, "<TOOLCALL>[{\"name\": \"read\", \"arguments\": {\"path\": \"x</TOOLCALL>\"}}]</TOOLCALL>"), 0);
	kv_gram_free(ir);
	tp = (struct kv_tc_params){.format = KV_TC_LIST, .tools = tools};
	KT_OK(kv_tc_parse(lcall, strlen(lcall), &tp, NULL, &content, &cl, &calls));
	KT_EQ_INT(json_array_size(calls), 2);
	KT_EQ_INT(cl, 0);
	KT_EQ_STR(json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments")),
		  "{\"path\": \"a</b>.c\"}");
	free(content);
	json_decref(calls);
	p = (struct kv_tcg_params){.format = KV_TC_LIST, .choice = KV_TCG_NAMED, .name = "stop"};
	KT_OK(kv_tcg_build(tools, &p, &ir));
	KT_EQ_INT(gram_matches(ir, "<TOOLCALL>[{\"name\": \"stop\", \"arguments\": {}}]</TOOLCALL>"), 1);
	KT_EQ_INT(gram_matches(ir, "<TOOLCALL>[{\"name\": \"stop\", \"arguments\": {}}, {\"name\": \"stop\", \"arguments\": {}}]"
				   "</TOOLCALL>"), 0);
	kv_gram_free(ir);
	p = (struct kv_tcg_params){.format = KV_TC_LIST, .choice = KV_TCG_AUTO};
	KT_OK(kv_tcg_build(tools, &p, &ir));
	KT_EQ_INT(gram_matches(ir, "Looking.<TOOLCALL>[{\"name\": \"stop\", \"arguments\": {}}]</TOOLCALL>"), 1);
	KT_EQ_INT(gram_matches(ir, "text <TOOLCALL> more"), 0);
	kv_gram_free(ir);
	/* errors */
	p = (struct kv_tcg_params){.format = KV_TC_JSON, .choice = KV_TCG_NAMED, .name = "nope"};
	KT_CHECK(kv_tcg_build(tools, &p, &ir) == KV_ERR_INVALID && strstr(kv_errmsg(), "'nope', which is not in tools"));
	json_decref(tools);
}

/* The shortest completion and forced tokens close any prefix. */
KT_CASE(completion_closes_the_output)
{
	struct kv_gvocab *v = small_vocab();
	KT_REQUIRE(v);
	struct kv_grammar *G = compile(G_JSON, v);
	KT_REQUIRE(G);
	struct kv_gmatch *m;
	KT_OK(kv_gmatch_create(G, NULL, 0, &m));
	const char *pre = "{\"a\": [1, {\"b\": \"x";
	KT_OK(kv_gmatch_accept_bytes(m, pre, strlen(pre)));
	KT_CHECK(!kv_gmatch_can_end(m));
	struct kv_buf c = KV_BUF_INIT;
	KT_OK(kv_gmatch_complete(m, &c));
	KT_EQ_STR(c.p, "\"}]}");
	int32_t ids[16];
	int n = kv_gmatch_force(m, c.p, c.len, ids);
	KT_CHECK(n > 0 && n <= 4);
	KT_CHECK(kv_gmatch_can_end(m));
	kv_buf_free(&c);
	kv_gmatch_free(m);
	kv_grammar_unref(G);
	kv_gvocab_free(v);
}

static int build_gbnf(void *ctx, struct kv_gram **ir)
{
	const char *t = ctx;
	return kv_gbnf_parse(t, strlen(t), ir);
}

/* Compiled grammars are found again by key, the least recently used one
 * leaves first, a failed build is not kept. */
KT_CASE(grammar_cache_by_key)
{
	struct kv_gvocab *v = small_vocab();
	KT_REQUIRE(v);
	struct kv_gcache *c;
	struct kv_gcache_params p = {.max_entries = 2};
	KT_OK(kv_gcache_create(v, &p, &c));
	struct kv_grammar *a, *a2, *b, *d;
	int hit;
	KT_OK(kv_gcache_get(c, "A", 1, build_gbnf, "root ::= \"a\"+", &a, &hit));
	KT_EQ_INT(hit, 0);
	KT_OK(kv_gcache_get(c, "A", 1, build_gbnf, "root ::= \"never built\"", &a2, &hit));
	KT_EQ_INT(hit, 1);
	KT_CHECK(a == a2);
	KT_EQ_INT(matches(a2, "aaa"), 1);
	KT_OK(kv_gcache_get(c, "B", 1, build_gbnf, "root ::= \"b\"", &b, &hit));
	KT_EQ_INT(hit, 0);
	KT_CHECK(kv_gcache_get(c, "E", 1, build_gbnf, "root ::= root \"x\" | \"y\"", &d, &hit) == KV_ERR_INVALID);
	KT_CHECK(strstr(kv_errmsg(), "left recursion") != NULL);
	/* A was used before B: a third key evicts A, whose reference we hold */
	KT_OK(kv_gcache_get(c, "C", 1, build_gbnf, "root ::= \"c\"", &d, &hit));
	kv_grammar_unref(d);
	KT_OK(kv_gcache_get(c, "B", 1, build_gbnf, "root ::= \"x\"", &d, &hit));
	KT_EQ_INT(hit, 1);
	kv_grammar_unref(d);
	KT_OK(kv_gcache_get(c, "A", 1, build_gbnf, "root ::= \"z\"", &d, &hit));
	KT_EQ_INT(hit, 0);
	KT_EQ_INT(matches(d, "z"), 1);
	KT_EQ_INT(matches(a, "a"), 1); /* the evicted grammar still works for its holder */
	kv_grammar_unref(d);
	kv_grammar_unref(a);
	kv_grammar_unref(a2);
	kv_grammar_unref(b);
	kv_gcache_free(c);
	kv_gvocab_free(v);
}

KT_MAIN(gbnf_accepts_and_rejects, grammar_cache_by_key, json_schema_layout_and_keywords, json_schema_errors_name_the_problem,
	tool_call_grammars_round_trip, completion_closes_the_output, gbnf_errors_name_the_problem, mask_equals_brute_force_arith,
	mask_equals_brute_force_json, mask_equals_brute_force_parens, mask_equals_brute_force_small_grammars)
