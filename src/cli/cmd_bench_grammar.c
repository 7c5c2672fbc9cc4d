/*
 * cmd_bench_grammar.c - `kvkeep bench grammar`: the constraint engine's
 * costs (docs/constrain.md). A benchmark, not a test: it asserts nothing
 * (the targets of issue 30 are printed next to the numbers).
 *
 *   kvkeep bench grammar --tokenizer DIR [--schemas DIR] [--match PREFIX,...]
 *       [--tokens N] [--seed S] [--vocab qwen3|qwen35|synth248k|all] [--tools-format json|xml]
 *
 * For every schema file of --schemas (default tests/data/schemas/json) whose
 * name starts with one of --match (default the agent tool schemas:
 * claude_code__, codex__, opencode__, qwen_code__), on each vocabulary:
 *   compile     JSON Schema -> grammar -> automaton (kv_jschema_compile +
 *               kv_grammar_create): what a request with a new schema waits
 *               before its first token, plus its first mask ("first");
 *               target < 50 ms per agent tool schema;
 *   all states  with --all-states, every state's mask entry computed up
 *               front (for scale: the engine computes an entry the first
 *               time a state is reached);
 *   per token   a generation of --tokens (200) tokens that picks uniformly
 *               among the allowed tokens (a random model under the
 *               constraint), then closes the output: the time of
 *               kv_gmatch_fill_mask per token, mean / p99 / max, on a fresh
 *               grammar ("cold": states met for the first time pay their
 *               trie walk) and again with the grammar's cache warm (a later
 *               request with the same tools); target: microseconds.
 * Vocabularies: qwen3 = the real Qwen3 tokenizer (151,643 + 26 added ids,
 * logits padded to 151,936); qwen35 = the same tokenizer in the qwen35-9b
 * preset's 248,320 logits (what `kvkeep mkmodel --preset qwen35-9b` with this
 * tokenizer serves); synth248k = 248,320 distinct tokens: Qwen3's plus
 * 96,651 more made by joining random pairs of Qwen3 tokens (a vocabulary of
 * the largest size kvkeep supports with every id a real string).
 * Timings come from a shared machine: run it twice and read them as
 * indicative.
 */
#include "base/buf.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/io.h"
#include "base/map.h"
#include "cli/cli.h"
#include "text/gmatch.h"
#include "text/jschema.h"
#include "text/tcgram.h"
#include "text/tokbytes.h"
#include "text/tokenizer.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Wall time, or with --cpu-time the thread's CPU time: on a shared,
 * overloaded machine the CPU time leaves out the time the thread waited
 * for a core. */
static int g_cpu;

static double now_s(void)
{
	if (!g_cpu)
		return kv_now_s();
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct stat_acc {
	double *v;
	size_t n, c;
};

static void acc_add(struct stat_acc *a, double x)
{
	if (a->n == a->c) {
		size_t c = a->c ? 2 * a->c : 1024;
		double *v = realloc(a->v, c * sizeof *v);
		if (!v)
			return;
		a->v = v;
		a->c = c;
	}
	a->v[a->n++] = x;
}

static int dcmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void acc_report(const char *what, struct stat_acc *a, double scale, const char *unit)
{
	if (!a->n) {
		printf("  %-28s (none)\n", what);
		return;
	}
	qsort(a->v, a->n, sizeof *a->v, dcmp);
	double s = 0;
	for (size_t i = 0; i < a->n; i++)
		s += a->v[i];
	size_t p99 = (size_t)((double)(a->n - 1) * 0.99);
	printf("  %-28s mean %9.2f %s   p50 %9.2f   p99 %9.2f   max %9.2f   (n=%zu)\n", what, s / (double)a->n * scale,
	       unit, a->v[a->n / 2] * scale, a->v[p99] * scale, a->v[a->n - 1] * scale, a->n);
	a->n = 0;
}

static uint64_t rnd(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* The qwen35-9b shape with every id a real string: Qwen3's table plus
 * joined pairs, all distinct. */
static int synth_vocab(const struct kv_tok *t, int n_ids, struct kv_gvocab **out)
{
	struct kv_tok_bytes *b;
	int nt = kv_tok_vocab_size(t);
	int rc = kv_tok_bytes_build(t, nt, &b);
	if (rc)
		return rc;
	const char **s = calloc((size_t)n_ids, sizeof *s);
	size_t *len = calloc((size_t)n_ids, sizeof *len);
	uint8_t *sp = calloc((size_t)n_ids, 1);
	char *pool = NULL;
	struct kv_buf all = KV_BUF_INIT;
	uint64_t seed = 12345;
	if (!s || !len || !sp) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	struct { size_t off, len; } *ex = calloc((size_t)n_ids, sizeof *ex);
	if (!ex) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	/* existing strings, to keep the joined ones distinct */
	struct kv_map *seen = kv_map_create((size_t)n_ids);
	for (int i = 0; i < nt; i++)
		if (b->len[i])
			kv_map_put(seen, b->data + b->off[i], b->len[i], 1);
	for (int i = nt; i < n_ids;) {
		int32_t x = (int32_t)(rnd(&seed) % (uint64_t)nt), y = (int32_t)(rnd(&seed) % (uint64_t)nt);
		if (!b->len[x] || !b->len[y] || b->special[x] || b->special[y] || b->len[x] + b->len[y] > 24)
			continue;
		size_t at = all.len;
		kv_buf_add(&all, b->data + b->off[x], b->len[x]);
		kv_buf_add(&all, b->data + b->off[y], b->len[y]);
		if (all.oom || kv_map_get(seen, all.p + at, all.len - at, NULL)) {
			all.len = at;
			continue;
		}
		kv_map_put(seen, all.p + at, all.len - at, 1);
		ex[i].off = at;
		ex[i].len = all.len - at;
		i++;
	}
	kv_map_destroy(seen);
	for (int i = 0; i < n_ids; i++) {
		if (i < nt) {
			s[i] = b->data + b->off[i];
			len[i] = b->len[i];
			sp[i] = b->special[i];
		} else {
			s[i] = all.p + ex[i].off;
			len[i] = ex[i].len;
		}
	}
	struct kv_tok_bytes *nb;
	rc = kv_tok_bytes_from(s, len, sp, n_ids, &nb);
	free(ex);
	if (!rc)
		rc = kv_gvocab_from_bytes(nb, out);
out:
	kv_tok_bytes_free(b);
	kv_buf_free(&all);
	free(pool);
	free(s);
	free(len);
	free(sp);
	return rc;
}

/* One random generation under G; mask times into acc. */
static int one_walk(struct kv_grammar *G, const int32_t *eos, int n_eos, int tokens, uint64_t *seed,
		    struct stat_acc *acc, int *n_steps)
{
	struct kv_gmatch *m;
	int rc = kv_gmatch_create(G, eos, n_eos, &m);
	if (rc)
		return rc;
	int W = kv_gmatch_mask_words(m);
	uint32_t *mask = malloc((size_t)W * sizeof *mask);
	int32_t *cand = malloc((size_t)W * 32 * sizeof *cand);
	if (!mask || !cand) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	for (int i = 0; i < tokens && !kv_gmatch_done(m); i++) {
		double t0 = now_s();
		if ((rc = kv_gmatch_fill_mask(m, mask)))
			goto out;
		acc_add(acc, now_s() - t0);
		(*n_steps)++;
		int nc = 0;
		for (int w = 0; w < W; w++)
			for (uint32_t x = mask[w]; x; x &= x - 1)
				cand[nc++] = w * 32 + __builtin_ctz(x);
		/* leave the end-of-sequence ids out while something else is allowed */
		int pick = -1;
		for (int tries = 0; tries < 8 && nc; tries++) {
			int32_t t = cand[rnd(seed) % (uint64_t)nc];
			int is_eos = 0;
			for (int e = 0; e < n_eos; e++)
				is_eos |= eos[e] == t;
			if (!is_eos || nc <= n_eos) {
				pick = t;
				break;
			}
		}
		if (pick < 0)
			break;
		if ((rc = kv_gmatch_accept(m, pick)))
			goto out;
	}
out:
	free(mask);
	free(cand);
	kv_gmatch_free(m);
	return rc;
}

static int starts_any(const char *name, const char *list)
{
	const char *p = list;
	while (*p) {
		const char *e = strchr(p, ',');
		size_t l = e ? (size_t)(e - p) : strlen(p);
		if (l && !strncmp(name, p, l))
			return 1;
		if (!e)
			break;
		p = e + 1;
	}
	return 0;
}

static int by_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmd_bench_grammar(int argc, char **argv)
{
	const char *tokdir = NULL, *schemas = "tests/data/schemas/json", *match = "claude_code__,codex__,opencode__,qwen_code__";
	const char *which = "all";
	int64_t tokens = 200, seed = 1;
	int all_states = 0;
	struct kv_flag flags[] = {
		{"tokenizer", KV_FLAG_STR, &tokdir, "DIR", "folder with tokenizer.json (the real Qwen3 one)"},
		{"schemas", KV_FLAG_STR, &schemas, "DIR", "JSON Schema files (default tests/data/schemas/json)"},
		{"match", KV_FLAG_STR, &match, "P1,P2", "file name prefixes to run (default: the agent tool schemas)"},
		{"tokens", KV_FLAG_INT, &tokens, "N", "tokens per generation (default 200)"},
		{"seed", KV_FLAG_INT, &seed, "S", "random choices (default 1)"},
		{"vocab", KV_FLAG_STR, &which, "qwen3|qwen35|synth248k|all", "vocabularies to run (default all)"},
		{"cpu-time", KV_FLAG_BOOL, &g_cpu, NULL, "time with the thread's CPU time instead of the wall clock"},
		{"all-states", KV_FLAG_BOOL, &all_states, NULL,
		 "also time every state's mask up front (slow: a trie walk per state)"},
		{0},
	};
	const char *usage = "usage: kvkeep bench grammar --tokenizer DIR [--schemas DIR] [--match P,...] [--tokens N]";
	int rc = kv_flags_parse(usage, flags, argc, argv, NULL, 0, NULL);
	if (rc == 1)
		return 0;
	if (rc)
		return 2;
	if (!tokdir || tokens <= 0 || tokens > 100000) {
		fprintf(stderr, "kvkeep bench grammar: --tokenizer DIR is required (tokens 1..100000)\n");
		return 2;
	}
	char path[4096];
	struct kv_tok *tok = NULL;
	if (kv_path_fmt(path, sizeof path, "%s/tokenizer.json", tokdir) || kv_tok_load(path, &tok)) {
		fprintf(stderr, "kvkeep bench grammar: %s\n", kv_errmsg());
		return 1;
	}
	/* the schemas */
	DIR *d = opendir(schemas);
	if (!d) {
		fprintf(stderr, "kvkeep bench grammar: cannot open %s\n", schemas);
		kv_tok_free(tok);
		return 1;
	}
	char **names = NULL;
	size_t nn = 0, cn = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name);
		if (l < 6 || strcmp(e->d_name + l - 5, ".json") || !starts_any(e->d_name, match))
			continue;
		if (nn == cn) {
			cn = cn ? 2 * cn : 64;
			names = realloc(names, cn * sizeof *names);
		}
		names[nn++] = strdup(e->d_name);
	}
	closedir(d);
	qsort(names, nn, sizeof *names, by_str);
	json_t **sch = calloc(nn + 1, sizeof *sch);
	for (size_t i = 0; i < nn; i++) {
		json_error_t je;
		if (kv_path_fmt(path, sizeof path, "%s/%s", schemas, names[i]) || !(sch[i] = json_load_file(path, JSON_DECODE_ANY, &je)))
			fprintf(stderr, "kvkeep bench grammar: %s: %s\n", names[i], je.text);
	}
	int32_t eos[2] = {kv_tok_id(tok, "<|im_end|>"), kv_tok_id(tok, "<|endoftext|>")};
	static const struct {
		const char *name;
		int ids;
		int synth;
	} vocabs[] = {{"qwen3", 151936, 0}, {"qwen35", 248320, 0}, {"synth248k", 248320, 1}};
	printf("kvkeep bench grammar: %zu schemas (%s), %lld tokens per generation, %s; a shared machine: indicative\n",
	       nn, match, (long long)tokens, g_cpu ? "thread CPU time" : "wall time");
	for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++) {
		if (strcmp(which, "all") && strcmp(which, vocabs[vi].name))
			continue;
		struct kv_gvocab *v = NULL;
		double t0 = now_s();
		rc = vocabs[vi].synth ? synth_vocab(tok, vocabs[vi].ids, &v) : kv_gvocab_create(tok, vocabs[vi].ids, &v);
		if (rc) {
			fprintf(stderr, "kvkeep bench grammar: %s\n", kv_errmsg());
			continue;
		}
		printf("\nvocabulary %s: %d ids, %d tokens in the trie (%d nodes), built in %.0f ms\n", vocabs[vi].name,
		       v->n_ids, v->n_tokens, v->n_nodes, (now_s() - t0) * 1e3);
		struct stat_acc compile = {0}, first = {0}, allst = {0}, cold = {0}, warm = {0};
		double worst_compile = 0;
		const char *worst_name = "";
		uint64_t rs = (uint64_t)seed, dep = 0;
		int steps = 0, nfail = 0;
		for (size_t i = 0; i < nn; i++) {
			if (!sch[i])
				continue;
			struct kv_gram *ir = NULL;
			struct kv_grammar *G = NULL;
			struct kv_js_opts o = {0};
			double a = now_s();
			if (kv_jschema_compile(sch[i], &o, &ir) || kv_grammar_create(ir, v, NULL, &G)) {
				printf("  %s: %s\n", names[i], kv_errmsg());
				nfail++;
				kv_gram_free(ir);
				continue;
			}
			double b = now_s();
			/* the first mask: the start state's walk */
			struct kv_gmatch *m;
			uint32_t *mask = malloc(((size_t)v->n_ids + 31) / 32 * 4);
			if (!kv_gmatch_create(G, eos, 2, &m)) {
				kv_gmatch_fill_mask(m, mask);
				kv_gmatch_free(m);
			}
			free(mask);
			double c = now_s();
			acc_add(&compile, b - a);
			acc_add(&first, c - a);
			if (c - a > worst_compile) {
				worst_compile = c - a;
				worst_name = names[i];
			}
			one_walk(G, eos, 2, (int)tokens, &rs, &cold, &steps);
			uint64_t rs2 = rs;
			one_walk(G, eos, 2, (int)tokens, &rs2, &warm, &steps);
			struct kv_grammar_stats st;
			kv_grammar_get_stats(G, &st);
			dep += st.dependent_total;
			kv_grammar_unref(G);
			/* every state up front, on a fresh grammar */
			if (all_states && !kv_grammar_create(ir, v, NULL, &G)) {
				double p0 = now_s();
				kv_grammar_precompute(G);
				acc_add(&allst, now_s() - p0);
				kv_grammar_unref(G);
			}
			kv_gram_free(ir);
		}
		printf("  compile (schema -> automaton)  target < 50 ms per agent tool schema\n");
		acc_report("compile", &compile, 1e3, "ms");
		acc_report("compile + first mask", &first, 1e3, "ms");
		printf("  %-28s %s (%.2f ms)\n", "slowest compile + first", worst_name, worst_compile * 1e3);
		if (all_states)
			acc_report("all states' masks", &allst, 1e3, "ms");
		printf("  mask per decoded token  target: microseconds (%d masks; %llu dependent tokens in all walks)\n", steps,
		       (unsigned long long)dep);
		acc_report("cold (first request)", &cold, 1e6, "us");
		acc_report("warm (cached states)", &warm, 1e6, "us");
		if (nfail)
			printf("  %d schemas failed to compile\n", nfail);
		kv_gvocab_free(v);
	}
	for (size_t i = 0; i < nn; i++) {
		json_decref(sch[i]);
		free(names[i]);
	}
	free(sch);
	free(names);
	kv_tok_free(tok);
	return 0;
}
KV_COMMAND(bench_grammar, "bench grammar", "constraint engine: schema compile time and token-mask cost per token",
	   cmd_bench_grammar);
