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
#include "text/gmatch.h"
#include "text/gpda.h"
#include "text/gram.h"
#include "text/gvocab.h"
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

KT_MAIN(gbnf_accepts_and_rejects, gbnf_errors_name_the_problem, mask_equals_brute_force_arith,
	mask_equals_brute_force_json, mask_equals_brute_force_parens, mask_equals_brute_force_small_grammars)
