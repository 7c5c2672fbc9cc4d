/*
 * fuzz_grammar.c - libFuzzer target for the constraint engine's parsers and
 * compiler: the first byte of the input picks the front end, the rest is
 *   0  a GBNF grammar (text/gbnf.h),
 *   1  a JSON Schema, not strict (text/jschema.h),
 *   2  a JSON Schema, strict,
 *   3  a tools array, compiled into both tool-call forms (text/tcgram.h),
 *   4  a regex pattern (text/jsregex.h).
 * What compiles is built into an automaton under small limits and driven
 * by a matcher over a small vocabulary for a few tokens, the cached mask
 * checked against brute force, and closed with the shortest completion.
 * Any input must end in a clean error or a consistent matcher: no crash,
 * no hang, no leak (ASan); abort() on an inconsistency.
 *
 *   make fuzz && ./build/fuzz/fuzz_grammar -max_total_time=120 tests/fuzz/corpus/grammar
 *
 * `make test` replays tests/fuzz/corpus/grammar through the same function.
 */
#include "base/buf.h"
#include "base/err.h"
#include "text/gbnf.h"
#include "text/gmatch.h"
#include "text/jschema.h"
#include "text/jsregex.h"
#include "text/tcgram.h"
#include "text/tokbytes.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct kv_gvocab *g_vocab;

static struct kv_gvocab *vocab(void)
{
	static const char *extra[] = {"\"", "\":", "{\"", "\"}", "ab", "12", "true", "null", ", ", "é", "\xC3", "<tool_call>",
				      "</tool_call>", "\n", "<function=", "</parameter>", "a\"", "[]", "{}", "\\u00", "日"};
	if (g_vocab)
		return g_vocab;
	int n = 96 + (int)(sizeof extra / sizeof extra[0]);
	const char *s[200];
	size_t len[200];
	static char b[96];
	for (int i = 0; i < 95; i++) {
		b[i] = (char)(0x20 + i);
		s[i] = &b[i];
		len[i] = 1;
	}
	b[95] = '\n';
	s[95] = &b[95];
	len[95] = 1;
	for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
		s[96 + i] = extra[i];
		len[96 + i] = strlen(extra[i]);
	}
	struct kv_tok_bytes *t;
	if (kv_tok_bytes_from(s, len, NULL, n, &t) || kv_gvocab_from_bytes(t, &g_vocab))
		abort();
	return g_vocab;
}

static void drive(struct kv_gram *ir, const uint8_t *d, size_t n)
{
	struct kv_grammar_params p = {.cache_bytes = 1 << 20, .lim = {.max_nfa_states = 20000, .max_dfa_states = 4000}};
	struct kv_grammar *G;
	if (kv_grammar_create(ir, vocab(), &p, &G))
		return;
	struct kv_gmatch *m;
	if (kv_gmatch_create(G, NULL, 0, &m)) {
		kv_grammar_unref(G);
		return;
	}
	int W = kv_gmatch_mask_words(m);
	uint32_t a[8], b[8];
	if (W > 8)
		abort();
	for (size_t step = 0; step < 6; step++) {
		if (kv_gmatch_fill_mask(m, a) || kv_gmatch_fill_mask_slow(m, b))
			break;
		if (memcmp(a, b, (size_t)W * 4)) {
			fprintf(stderr, "fuzz_grammar: cached mask differs from brute force\n");
			abort();
		}
		int cand[256], nc = 0;
		for (int t = 0; t < W * 32 && nc < 256; t++)
			if ((a[t >> 5] >> (t & 31)) & 1)
				cand[nc++] = t;
		if (!nc)
			break;
		int t = cand[(n ? d[step % n] : 0) % (unsigned)nc];
		if (kv_gmatch_accept(m, t)) {
			fprintf(stderr, "fuzz_grammar: an allowed token was refused\n");
			abort();
		}
	}
	struct kv_buf c = KV_BUF_INIT;
	if (!kv_gmatch_complete(m, &c) && c.len && c.len < 10000) {
		if (kv_gmatch_accept_bytes(m, c.p, c.len) || !kv_gmatch_can_end(m)) {
			fprintf(stderr, "fuzz_grammar: the completion does not complete\n");
			abort();
		}
	}
	kv_buf_free(&c);
	kv_gmatch_free(m);
	kv_grammar_unref(G);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > 1 << 14)
		return 0;
	int mode = data[0] % 5;
	const char *s = (const char *)data + 1;
	size_t n = size - 1;
	struct kv_gram *ir = NULL;
	json_t *j = NULL;
	json_error_t e;
	if (mode == 0) {
		if (!kv_gbnf_parse(s, n, &ir))
			drive(ir, data, size);
	} else if (mode == 1 || mode == 2) {
		struct kv_js_opts o = {.strict = mode == 2};
		if ((j = json_loadb(s, n, JSON_DECODE_ANY, &e)) && !kv_jschema_compile(j, &o, &ir))
			drive(ir, data, size);
	} else if (mode == 3) {
		if ((j = json_loadb(s, n, 0, &e)))
			for (int f = 0; f < 2; f++) {
				struct kv_tcg_params p = {.format = f ? KV_TC_XML : KV_TC_JSON, .choice = KV_TCG_REQUIRED, .parallel = 1};
				if (!kv_tcg_build(j, &p, &ir))
					drive(ir, data, size);
				kv_gram_free(ir);
				ir = NULL;
			}
	} else {
		struct kv_rx_opts o = {.mode = KV_RX_JSON};
		int x;
		if (!kv_gram_create(&ir) && !kv_rx_compile(ir, s, n, &o, &x)) {
			int r = kv_gram_rule(ir, "root", 4);
			kv_gram_define(ir, r, x);
			kv_gram_set_root(ir, r);
			drive(ir, data, size);
		}
	}
	kv_gram_free(ir);
	json_decref(j);
	return 0;
}
