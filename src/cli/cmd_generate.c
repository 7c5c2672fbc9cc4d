/*
 * cmd_generate.c - `kvkeep generate`: run the engine on a prompt from the
 * command line (no server, no cache).
 *
 *   kvkeep generate --model DIR (--prompt TEXT | --tokens 1,2,3)
 *       [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]
 *       [--min-p P] [--presence-penalty X] [--frequency-penalty X]
 *       [--repetition-penalty X] [--seed S] [--generation-config none|auto|DIR]
 *       [--stop TEXT] [--logits-out FILE]
 *       [--grammar FILE.gbnf | --json-schema FILE [--strict] | --json-object |
 *        --tools FILE --tool-choice required|auto|none|NAME [--tool-format json|xml|list]
 *        [--parallel-tool-calls]] [--grammar-close N] [--completion-out FILE]
 *
 * Prints the generated ids on one line ("ids: 1 2 3") and, when the folder
 * has a tokenizer, the text of prompt + completion after "text: ". Timing
 * goes to stderr. Generation stops at max-tokens, at --stop TEXT (matched
 * in the decoded text across token boundaries) or at a stop id: the same
 * set the server uses (kv_gencfg_stop_ids: config.json and
 * generation_config.json eos_token_id, the chat template's end-of-turn
 * token such as <|im_end|>, <|endoftext|>), unless --ignore-eos. So a
 * prompt rendered with the chat template (`kvkeep render`) ends where the
 * server's answer would.
 *
 * Sampling: the flags, else (with --generation-config auto or DIR) the
 * model's generation_config.json, else greedy (temperature 0) and no
 * filter or penalty. The default is --generation-config none: generate is
 * a deterministic debugging tool unless asked otherwise.
 *
 * Files (raw little-endian f32, for the reference tests in tests/ref):
 *   --logits-out F      vocab_size floats: logits of the last prompt position
 *   --all-logits-out F  n_prompt x vocab_size floats: every prompt position
 *   --state-out F       the recurrent snapshot after the prompt (hybrid
 *                       models; layout.h snapshot format)
 * --prompt encodes with the folder's tokenizer.json (special tokens such
 * as <|im_start|> are recognised).
 *
 * Constraints (docs/constrain.md): --grammar (GBNF), --json-schema (a JSON
 * Schema file; --strict makes an unsupported keyword an error),
 * --json-object (any JSON object) or --tools with --tool-choice (the
 * model's tool-call syntax, --tool-format json for Qwen3 and Granite
 * 4.0-H, xml for Qwen3.5, list for Nemotron-H) mask every sampled token (ke_sample_masked) with the grammar's
 * allowed tokens; the stop ids are allowed exactly when the grammar can
 * end. --grammar-close N closes the output after N tokens with the
 * grammar's shortest completion (forced tokens), so a random model's
 * output is complete within a budget: the corpus test relies on it.
 * --completion-out writes the completion's bytes (the end-of-sequence
 * token left out) to FILE.
 */
#include "base/clock.h"
#include "base/buf.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/mem.h"
#include "cli/cli.h"
#include "cli/gen_spec.h"
#include "engine/isa.h"
#include "engine/mtp.h"
#include "engine/sample.h"
#include "engine/seq.h"
#include "model/genconfig.h"
#include "session/spec.h"
#include "base/io.h"
#include "base/json.h"
#include "text/gbnf.h"
#include "text/gmatch.h"
#include "text/jschema.h"
#include "text/tcgram.h"
#include "text/toolcall.h"
#include "text/template.h"
#include "text/tokenizer.h"
#include "text/stop.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int write_f32(const char *path, const void *p, size_t bytes)
{
	if (kv_durable_write(path, p, bytes, KV_DW_NO_SYNC | KV_DW_PUBLIC)) {
		fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
		return -1;
	}
	return 0;
}

/* Read a whole file (at most 16 MB) through the I/O table. */
static char *read_all(const char *path, size_t *len)
{
	char *p = NULL;
	if (kv_io_read_file(path, 16u << 20, &p, len)) {
		fprintf(stderr, "kvkeep generate: %s\n", kv_errmsg());
		return NULL;
	}
	return p;
}

struct cons_flags {
	const char *grammar, *schema, *tools, *tool_choice, *tool_format;
	int json_object, strict, parallel, print;
};

/* --tool-format: json (Qwen3, Granite 4.0-H), xml (Qwen3.5), list
 * (Nemotron-H); -1 for anything else. */
static int tool_format_of(const struct cons_flags *cf)
{
	const char *f = cf->tool_format ? cf->tool_format : "json";
	return !strcmp(f, "json") ? KV_TC_JSON : !strcmp(f, "xml") ? KV_TC_XML : !strcmp(f, "list") ? KV_TC_LIST : -1;
}

/* The constraint's grammar from the flags: NULL and 0 when there is none. */
static int build_constraint(const struct cons_flags *cf, struct kv_gram **out)
{
	int n = !!cf->grammar + !!cf->schema + !!cf->json_object + !!cf->tools;
	*out = NULL;
	if (!n)
		return 0;
	if (n > 1) {
		fprintf(stderr, "kvkeep generate: give one of --grammar, --json-schema, --json-object, --tools\n");
		return -1;
	}
	size_t len;
	char *txt = NULL;
	json_t *j = NULL;
	int rc = 0;
	if (cf->grammar) {
		if (!(txt = read_all(cf->grammar, &len)))
			return -1;
		rc = kv_gbnf_parse(txt, len, out);
	} else if (cf->json_object) {
		struct kv_js_opts o = {.strict = cf->strict};
		rc = kv_jschema_any_object(&o, out);
	} else {
		const char *path = cf->schema ? cf->schema : cf->tools;
		if (!(txt = read_all(path, &len)))
			return -1;
		json_error_t je;
		if (!(j = json_loadb(txt, len, JSON_DECODE_ANY, &je))) {
			rc = kv_fail(KV_ERR_INVALID, "%s: line %d: %s", path, je.line, je.text);
			goto done;
		}
		if (cf->schema) {
			struct kv_js_opts o = {.strict = cf->strict};
			rc = kv_jschema_compile(j, &o, out);
		} else {
			const char *ch = cf->tool_choice ? cf->tool_choice : "required";
			struct kv_tcg_params tp = {.parallel = cf->parallel, .strict = cf->strict};
			tp.format = tool_format_of(cf);
			if (tp.format < 0) {
				fprintf(stderr, "kvkeep generate: --tool-format must be json, xml or list\n");
				rc = -1;
				goto done;
			}
			if (!strcmp(ch, "required"))
				tp.choice = KV_TCG_REQUIRED;
			else if (!strcmp(ch, "auto"))
				tp.choice = KV_TCG_AUTO;
			else if (!strcmp(ch, "none"))
				tp.choice = KV_TCG_NONE;
			else {
				tp.choice = KV_TCG_NAMED;
				tp.name = ch;
			}
			rc = kv_tcg_build(j, &tp, out);
		}
	}
done:
	if (rc > 0 || rc < -1)
		fprintf(stderr, "kvkeep generate: %s\n", kv_errmsg());
	free(txt);
	json_decref(j);
	if (!rc && cf->print) {
		struct kv_buf b = KV_BUF_INIT;
		kv_gram_dump(*out, &b);
		fprintf(stderr, "%s", b.p ? b.p : "");
		kv_buf_free(&b);
	}
	return rc ? -1 : 0;
}

/* --- corpus mode: one model load, many constraints ------------------------ */

struct corpus {
	struct ke_model *m;
	const struct kv_tok *tok;
	struct kv_gvocab *gv;
	const int32_t *ids;
	size_t n_ids;
	const int32_t *stop;
	int n_stop;
	struct ke_sample_params pp;
	struct ke_seq_params sp;
	int64_t max_tokens, close_at;
	int quiet;
	double mask_s, mask_max;
	long n_masks;
};

/* Generate once under ir; the completion's bytes to out_path; with tools,
 * the parsed calls ({"content", "tool_calls"}, text/toolcall.h) to
 * calls_path. Returns 0, or -1 with a message printed. */
static int corpus_one(struct corpus *c, struct kv_gram *ir, const char *name, const char *out_path,
		      const char *calls_path, const json_t *tools, int format)
{
	struct kv_grammar *gram = NULL;
	struct kv_gmatch *gm = NULL;
	struct ke_seq *s = NULL;
	struct ke_sampler *smp = NULL;
	uint32_t *mask = NULL;
	float *logits = NULL;
	int32_t *forced = NULL;
	struct kv_buf comp = KV_BUF_INIT;
	int rc = -1, V = ke_model_config(c->m)->vocab, n_out = 0;
	const char *finish = "length";
	if (kv_grammar_create(ir, c->gv, NULL, &gram) || kv_gmatch_create(gram, c->stop, c->n_stop, &gm)) {
		printf("corpus %s: error: %s\n", name, kv_errmsg());
		goto out;
	}
	mask = malloc((size_t)kv_gmatch_mask_words(gm) * sizeof *mask);
	logits = kv_alloc(KV_MEM_SCRATCH, (size_t)V * sizeof *logits);
	forced = malloc(4097 * sizeof *forced);
	if (!mask || !logits || !forced || ke_seq_create(c->m, &c->sp, &s) || ke_sampler_create(V, &c->pp, &smp)) {
		printf("corpus %s: error: %s\n", name, kv_errmsg());
		goto out;
	}
	ke_sampler_prompt(smp, c->ids, c->n_ids);
	struct ke_prefill_opts po = {0};
	if (ke_seq_prefill(s, c->ids, (int)c->n_ids, &po, logits)) {
		printf("corpus %s: error: %s\n", name, kv_errmsg());
		goto out;
	}
	for (int64_t i = 0; i < c->max_tokens; i++) {
		if (c->close_at >= 0 && i >= c->close_at && !kv_gmatch_can_end(gm)) {
			struct kv_buf cb = KV_BUF_INIT;
			int k = -1;
			if (!kv_gmatch_complete(gm, &cb) && cb.len <= 4096)
				k = kv_gmatch_force(gm, cb.p, cb.len, forced);
			kv_buf_free(&cb);
			if (k < 0) {
				printf("corpus %s: error: could not close the output: %s\n", name, kv_errmsg());
				goto out;
			}
			for (int q = 0; q < k; q++) {
				size_t bl;
				const char *bp = kv_tok_bytes_get(c->gv->bytes, forced[q], &bl);
				kv_buf_add(&comp, bp, bl);
			}
			n_out += k;
			finish = "closed";
			break;
		}
		if (kv_gmatch_done(gm) && !c->n_stop) {
			finish = "grammar";
			break;
		}
		double m0 = kv_now_s();
		if (kv_gmatch_fill_mask(gm, mask)) {
			printf("corpus %s: error: %s\n", name, kv_errmsg());
			goto out;
		}
		double dt = kv_now_s() - m0;
		c->mask_s += dt;
		if (dt > c->mask_max)
			c->mask_max = dt;
		c->n_masks++;
		int32_t t = ke_sample_masked(smp, logits, mask);
		if (kv_gmatch_accept(gm, t)) {
			printf("corpus %s: error: the sampler chose a refused token: %s\n", name, kv_errmsg());
			goto out;
		}
		n_out++;
		if (kv_gmatch_ended(gm)) {
			finish = "eos";
			break;
		}
		size_t bl;
		const char *bp = kv_tok_bytes_get(c->gv->bytes, t, &bl);
		kv_buf_add(&comp, bp, bl);
		if (i + 1 < c->max_tokens && ke_seq_decode(s, t, logits)) {
			printf("corpus %s: error: %s\n", name, kv_errmsg());
			goto out;
		}
	}
	if (kv_durable_write(out_path, comp.p ? comp.p : "", comp.len, KV_DW_NO_SYNC | KV_DW_PUBLIC)) {
		printf("corpus %s: error: %s\n", name, kv_errmsg());
		goto out;
	}
	if (calls_path) {
		struct kv_tc_params tp = {.format = format, .tools = tools};
		char *content = NULL;
		size_t cl = 0;
		json_t *calls = NULL;
		if (kv_tc_parse(comp.p ? comp.p : "", comp.len, &tp, "call_", &content, &cl, &calls)) {
			printf("corpus %s: error: tool-call parse: %s\n", name, kv_errmsg());
			goto out;
		}
		json_t *o = json_pack("{s:s%,s:o}", "content", content ? content : "", cl, "tool_calls", calls);
		char *txt = json_dumps(o, JSON_ENCODE_ANY);
		int wr = txt ? kv_durable_write(calls_path, txt, strlen(txt), KV_DW_NO_SYNC | KV_DW_PUBLIC) : -1;
		free(txt);
		free(content);
		json_decref(o);
		if (wr) {
			printf("corpus %s: error: cannot write %s\n", name, calls_path);
			goto out;
		}
	}
	printf("corpus %s: finish=%s tokens=%d grammar=%s\n", name, finish, n_out,
	       kv_gmatch_ended(gm) || kv_gmatch_can_end(gm) ? "complete" : "incomplete");
	rc = 0;
out:
	kv_buf_free(&comp);
	free(mask);
	free(forced);
	kv_free(logits);
	ke_sampler_destroy(smp);
	ke_seq_destroy(s);
	kv_gmatch_free(gm);
	kv_grammar_unref(gram);
	return rc;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every *.json schema of a folder, or every tool of a tools file. */
static int corpus_run(struct corpus *c, const struct cons_flags *cf, const char *out_dir)
{
	int bad = 0;
	char path[4096], outp[4096], callp[4096];
	if (cf->schema) {
		DIR *d = opendir(cf->schema);
		struct dirent *e;
		char **names = NULL;
		size_t n = 0, cap = 0;
		if (!d) {
			fprintf(stderr, "kvkeep generate: cannot open %s\n", cf->schema);
			return -1;
		}
		while ((e = readdir(d))) {
			size_t l = strlen(e->d_name);
			if (l < 6 || strcmp(e->d_name + l - 5, ".json"))
				continue;
			if (n == cap) {
				cap = cap ? 2 * cap : 64;
				char **q = realloc(names, cap * sizeof *q);
				if (!q)
					break;
				names = q;
			}
			names[n++] = strdup(e->d_name);
		}
		closedir(d);
		qsort(names, n, sizeof *names, by_name);
		for (size_t i = 0; i < n; i++) {
			struct kv_gram *ir = NULL;
			json_t *j = NULL;
			char *txt = NULL;
			size_t len;
			if (kv_path_fmt(path, sizeof path, "%s/%s", cf->schema, names[i]) ||
			    kv_path_fmt(outp, sizeof outp, "%s/%s", out_dir, names[i])) {
				bad++;
				continue;
			}
			struct kv_js_opts o = {.strict = cf->strict};
			json_error_t je;
			if (!(txt = read_all(path, &len))) {
				bad++;
				free(names[i]);
				continue;
			}
			if (!(j = json_loadb(txt, len, JSON_DECODE_ANY, &je)))
				kv_fail(KV_ERR_INVALID, "%s: line %d: %s", path, je.line, je.text);
			if (!j || kv_jschema_compile(j, &o, &ir)) {
				printf("corpus %s: error: %s\n", names[i], kv_errmsg());
				bad++;
			} else if (corpus_one(c, ir, names[i], outp, NULL, NULL, 0)) {
				bad++;
			}
			kv_gram_free(ir);
			json_decref(j);
			free(txt);
			free(names[i]);
		}
		free(names);
		return bad ? -1 : 0;
	}
	/* --tools FILE --tool-choice each */
	size_t len;
	char *txt = read_all(cf->tools, &len);
	json_t *tools = NULL;
	if (!txt || kv_json_parse(cf->tools, txt, len, KV_JSON_MAX_DEPTH, &tools) || !json_is_array(tools)) {
		fprintf(stderr, "kvkeep generate: %s: not a tools array\n", cf->tools);
		free(txt);
		json_decref(tools);
		return -1;
	}
	int format = tool_format_of(cf);
	if (format < 0) {
		fprintf(stderr, "kvkeep generate: --tool-format must be json, xml or list\n");
		free(txt);
		json_decref(tools);
		return -1;
	}
	size_t i;
	json_t *t;
	json_array_foreach(tools, i, t) {
		const json_t *fn = json_object_get(t, "function") ? json_object_get(t, "function") : t;
		const char *name = json_string_value(json_object_get(fn, "name"));
		struct kv_gram *ir = NULL;
		if (!name)
			continue;
		struct kv_tcg_params tp = {.format = format, .choice = KV_TCG_NAMED, .name = name,
					   .parallel = cf->parallel, .strict = cf->strict};
		if (kv_path_fmt(outp, sizeof outp, "%s/%s.txt", out_dir, name) ||
		    kv_path_fmt(callp, sizeof callp, "%s/%s.calls.json", out_dir, name)) {
			bad++;
			continue;
		}
		if (kv_tcg_build(tools, &tp, &ir)) {
			printf("corpus %s: error: %s\n", name, kv_errmsg());
			bad++;
		} else if (corpus_one(c, ir, name, outp, callp, tools, format)) {
			bad++;
		}
		kv_gram_free(ir);
	}
	json_decref(tools);
	free(txt);
	return bad ? -1 : 0;
}

/* Sampling: flag > generation_config (auto/DIR) > greedy. *file: the
 * generation_config read (its stop ids matter too). 0, or 2 for a bad
 * flag. */
static int sampling_defaults(const char *model, const char *gc_mode, const double *sv, struct kv_gencfg *sd,
			     struct kv_gencfg *file)
{
	struct kv_gencfg fl;
	kv_gencfg_openai(sd);
	sd->v[KV_GC_TEMPERATURE] = 0.0;
	kv_gencfg_init(&fl);
	for (int i = 0; i < KV_GC_N; i++)
		if (!isnan(sv[i]) && kv_gencfg_set(&fl, i, sv[i], "flag")) {
			fprintf(stderr, "kvkeep generate: %s\n", kv_errmsg());
			return 2;
		}
	int gc_none = !strcmp(gc_mode, "none"), gc_auto = !strcmp(gc_mode, "auto");
	int grc = kv_gencfg_load(gc_auto || gc_none ? model : gc_mode, file);
	if (grc && (grc != KV_ERR_NOT_FOUND || (!gc_auto && !gc_none)))
		fprintf(stderr, "kvkeep generate: warning: generation_config.json ignored: %s\n", kv_errmsg());
	if (!gc_none)
		kv_gencfg_overlay(sd, file);
	kv_gencfg_overlay(sd, &fl);

	return 0;
}

/* The engine's sampling parameters from the resolved defaults. */
static struct ke_sample_params sample_params(const struct kv_gencfg *sd, uint64_t seed)
{
	return (struct ke_sample_params){.temperature = sd->v[KV_GC_TEMPERATURE],
					 .top_k = (int)sd->v[KV_GC_TOP_K],
					 .top_p = sd->v[KV_GC_TOP_P],
					 .min_p = sd->v[KV_GC_MIN_P],
					 .presence_penalty = sd->v[KV_GC_PRESENCE_PENALTY],
					 .frequency_penalty = sd->v[KV_GC_FREQUENCY_PENALTY],
					 .repetition_penalty = sd->v[KV_GC_REPETITION_PENALTY],
					 .seed = seed};
}

/* The constraint of ir bound to the model's vocabulary: its trie, the
 * compiled grammar, the matcher and a mask buffer. 0, 1 (out of memory,
 * a load error) or 2 (a bad constraint), the error printed. */
static int constraint_setup(const struct kv_gram *ir, const struct kv_tok *tok, int V, const int32_t *stop_ids,
			    int n_stop_ids, int quiet, struct kv_gvocab **gv, struct kv_grammar **gram,
			    struct kv_gmatch **gm, uint32_t **mask)
{
	if (!tok) {
		fprintf(stderr, "kvkeep generate: a constraint needs the folder's tokenizer\n");
		return 2;
	}
	double c0 = kv_now_s();
	if (kv_gvocab_create(tok, V, gv)) {
		fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
		return 1;
	}
	double c1 = kv_now_s();
	if (kv_grammar_create(ir, *gv, NULL, gram) || kv_gmatch_create(*gram, stop_ids, n_stop_ids, gm)) {
		fprintf(stderr, "kvkeep generate: %s\n", kv_errmsg());
		return 2;
	}
	if (!quiet)
		fprintf(stderr, "constraint: vocabulary trie %.1f ms, grammar compiled in %.2f ms (%d states)\n",
			(c1 - c0) * 1e3, (kv_now_s() - c1) * 1e3, kv_grammar_pda(*gram)->n_states);
	*mask = malloc((size_t)kv_gmatch_mask_words(*gm) * sizeof **mask);
	if (!*mask) {
		fprintf(stderr, "kvkeep: out of memory\n");
		return 1;
	}
	return 0;
}

/* The decode loop of one generation (the constraint's mask before each
 * token when there is one); the tokens in d->out_ids, why it ended in
 * d->finish. 0, or 1 after printing the error. */
struct dec {
	struct ke_seq *s;
	struct ke_sampler *smp;
	float *logits;
	struct kv_gmatch *gm;             /* NULL: no constraint */
	const struct kv_gvocab *gv;
	uint32_t *mask;
	const int32_t *stop_ids;
	int n_stop_ids, ignore_eos;
	const char *stop;                 /* --stop text, or NULL */
	struct kv_tok_stream *ds;
	struct kv_buf *piece, *gen_text, *comp;
	int64_t max_tokens, close_at;
	int32_t *out_ids;
	int n_out;
	const char *finish;
	double mask_s, mask_max;
	int n_masks;
};

static int decode(struct dec *d)
{
	for (int i = 0; i < d->max_tokens; i++) {
		int32_t t;
		if (d->gm) {
			if (d->close_at >= 0 && i >= d->close_at && !kv_gmatch_can_end(d->gm)) {
				/* the budget is spent: d->finish with the shortest completion */
				struct kv_buf cb = KV_BUF_INIT;
				int k = -1;
				if (!kv_gmatch_complete(d->gm, &cb) && cb.len <= 4096)
					k = kv_gmatch_force(d->gm, cb.p, cb.len, d->out_ids + d->n_out);
				kv_buf_free(&cb);
				if (k < 0) {
					fprintf(stderr, "kvkeep generate: could not close the output: %s\n", kv_errmsg());
					return 1;
				}
				for (int q = 0; q < k; q++) {
					size_t bl;
					const char *bp = kv_tok_bytes_get(d->gv->bytes, d->out_ids[d->n_out + q], &bl);
					kv_buf_add(d->comp, bp, bl);
				}
				d->n_out += k;
				d->finish = "closed";
				break;
			}
			if (kv_gmatch_done(d->gm) && !d->n_stop_ids) {
				d->finish = "grammar";
				break;
			}
			double m0 = kv_now_s();
			if (kv_gmatch_fill_mask(d->gm, d->mask)) {
				fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
				return 1;
			}
			double m1 = kv_now_s();
			d->mask_s += m1 - m0;
			if (m1 - m0 > d->mask_max)
				d->mask_max = m1 - m0;
			d->n_masks++;
			t = ke_sample_masked(d->smp, d->logits, d->mask);
			if (kv_gmatch_accept(d->gm, t)) {
				fprintf(stderr, "kvkeep generate: the sampler chose a token the grammar refuses: %s\n", kv_errmsg());
				return 1;
			}
		} else {
			t = ke_sample(d->smp, d->logits);
		}
		d->out_ids[d->n_out++] = t;
		int eos = 0;
		for (int e = 0; e < d->n_stop_ids; e++)
			eos |= d->stop_ids[e] == t;
		if (eos && (!d->ignore_eos || d->gm)) {
			d->finish = "eos";
			break;
		}
		if (d->gm) {
			size_t bl;
			const char *bp = kv_tok_bytes_get(d->gv->bytes, t, &bl);
			kv_buf_add(d->comp, bp, bl);
		}
		if (d->stop) { /* the text so far, searched where the new d->piece could complete a match */
			size_t before = d->gen_text->len, L = strlen(d->stop);
			kv_buf_reset(d->piece);
			kv_tok_stream_feed(d->ds, t, d->piece);
			kv_buf_add(d->gen_text, d->piece->p ? d->piece->p : "", d->piece->len);
			size_t from = before >= L ? before - L + 1 : 0;
			if (d->gen_text->len >= L && memmem(d->gen_text->p + from, d->gen_text->len - from, d->stop, L)) {
				d->finish = "stop";
				break;
			}
		}
		if (i + 1 == d->max_tokens)
			break;
		if (ke_seq_decode(d->s, t, d->logits)) {
			fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
			return 1;
		}
	}
	return 0;
}

/* The ids, the text, why it ended and the completion file. 0 or 1. */
static int report(struct dec *d, const struct kv_tok *tok, const int32_t *ids, size_t n_ids, int quiet,
		  const char *completion_out)
{
	printf("ids:");
	for (int i = 0; i < d->n_out; i++)
		printf(" %d", d->out_ids[i]);
	printf("\n");
	if (tok) {
		char *text = NULL;
		size_t tl;
		int32_t *both = malloc((n_ids + (size_t)d->n_out) * sizeof *both);
		if (both) {
			memcpy(both, ids, n_ids * sizeof *both);
			memcpy(both + n_ids, d->out_ids, (size_t)d->n_out * sizeof *both);
			if (!kv_tok_decode(tok, both, n_ids + (size_t)d->n_out, 0, &text, &tl))
				printf("text: %s\n", text);
			free(text);
			free(both);
		}
	}
	printf("finish: %s\n", d->finish);
	if (d->gm) {
		printf("grammar: %s\n", kv_gmatch_ended(d->gm) || kv_gmatch_can_end(d->gm) ? "complete" : "incomplete");
		if (!quiet && d->n_masks)
			fprintf(stderr, "constraint: %d masks, mean %.1f us, max %.1f us\n", d->n_masks, d->mask_s / d->n_masks * 1e6,
				d->mask_max * 1e6);
	}
	if (completion_out) {
		if (!d->gm) { /* no constraint: the decoded completion */
			char *text = NULL;
			size_t tl = 0;
			if (tok && !kv_tok_decode(tok, d->out_ids, (size_t)d->n_out, 1, &text, &tl))
				kv_buf_add(d->comp, text, tl);
			free(text);
		}
		if (kv_durable_write(completion_out, d->comp->p ? d->comp->p : "", d->comp->len, KV_DW_NO_SYNC | KV_DW_PUBLIC)) {
			fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
			return 1;
		}
	}
	return 0;
}

/* The engine's parameters from the flags (--kv-f32 is the older spelling
 * of --kv-dtype f32). -1, reported, on a bad value. */
static int engine_params(int kv_f32, const char *kv_dtype, const char *quant_act, int64_t page_tokens,
			 struct ke_model_params *mp)
{
	*mp = (struct ke_model_params){.kv = kv_f32 ? KE_KV_F32 : ke_kv_parse(kv_dtype),
				       .page_tokens = (int)page_tokens,
				       .quant_act = ke_quant_act_parse(quant_act)};
	if (mp->quant_act < 0) {
		fprintf(stderr, "kvkeep generate: --quant-act must be q8 or f32\n");
		return -1;
	}
	if (mp->kv < 0 || (kv_f32 && kv_dtype && strcmp(kv_dtype, "f32"))) {
		fprintf(stderr, "kvkeep generate: --kv-dtype must be bf16, f32 or q8_0 (and agree with --kv-f32)\n");
		return -1;
	}
	return 0;
}

/* --mtp-logits-out: the MTP head over the prompt (position t: the hidden
 * state there and token t + 1), every row's logits. */
static int write_mtp_logits(struct ke_model *m, const float *hidden, const int32_t *ids, size_t n, const char *path)
{
	struct ke_mtp_seq *ms = NULL;
	size_t V = (size_t)ke_model_config(m)->vocab;
	float *lg = kv_alloc(KV_MEM_SCRATCH, (n - 1) * V * sizeof *lg);
	int rc = !lg || ke_mtp_seq_create(m, &ms) || ke_mtp_seq_logits(ms, hidden, ids + 1, (int)n - 1, lg);
	if (rc)
		fprintf(stderr, "kvkeep: MTP head: %s\n", lg ? kv_errmsg() : "out of memory");
	else
		rc = write_f32(path, lg, (n - 1) * V * sizeof *lg);
	ke_mtp_seq_destroy(ms);
	kv_free(lg);
	return rc;
}

/* The prompt's prefill (every position's logits into all, if set), and
 * with mtp_out the MTP head's logits over it. */
static int prefill(struct ke_model *m, struct ke_seq *s, const int32_t *ids, size_t n_ids, float *all, float *logits,
		   const char *mtp_out)
{
	struct ke_prefill_opts po = {.logits_all = all};
	int rc = -1;
	if (mtp_out && (n_ids < 2 || n_ids > 65 || !ke_model_has_mtp(m))) {
		fprintf(stderr, "kvkeep generate: --mtp-logits-out needs a model with an MTP head and 2-65 prompt tokens\n");
		return -1;
	}
	if (mtp_out &&
	    !(po.hidden_all = kv_alloc(KV_MEM_SCRATCH, n_ids * (size_t)ke_model_config(m)->hidden * sizeof(float)))) {
		fprintf(stderr, "kvkeep: out of memory\n");
		return -1;
	}
	if (ke_seq_prefill(s, ids, (int)n_ids, &po, logits))
		fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
	else
		rc = mtp_out ? write_mtp_logits(m, po.hidden_all, ids, n_ids, mtp_out) : 0;
	kv_free(po.hidden_all);
	return rc;
}

/* decode(), or with --speculative (and no constraint) the same loop
 * through the session's speculative decoder (gen_spec.h): the same ids. */
static int decode_any(struct dec *d, const struct kv_tok *tok, const int32_t *ids, size_t n_ids, int mode,
		      struct cmd_gen_spec *gs)
{
	if (mode <= 0 || d->gm)
		return decode(d);
	*gs = (struct cmd_gen_spec){.s = d->s, .smp = d->smp, .logits = d->logits, .ids = ids, .n_ids = n_ids,
				    .max_tokens = (int)d->max_tokens, .stop_ids = d->stop_ids, .n_stop_ids = d->n_stop_ids,
				    .ignore_eos = d->ignore_eos, .stop = d->stop, .tok = tok, .mode = mode,
				    .out_ids = d->out_ids};
	if (cmd_generate_spec(gs)) {
		fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
		return 1;
	}
	d->n_out = gs->n_out;
	d->finish = gs->finish;
	return 0;
}

/* report(), then what speculation did. */
static int report_all(struct dec *d, const struct cmd_gen_spec *gs, const struct kv_tok *tok, const int32_t *ids,
		      size_t n_ids, int quiet, const char *completion_out)
{
	int rc = report(d, tok, ids, n_ids, quiet, completion_out);
	if (!rc && !quiet && gs->mode > 0)
		cmd_generate_spec_report(gs);
	return rc;
}

static int cmd_generate(int argc, char **argv)
{
	const char *model = NULL, *prompt = NULL, *tokens_s = NULL, *logits_out = NULL, *all_out = NULL,
		   *state_out = NULL;
	const char *gc_mode = "none", *stop = NULL;
	int64_t max_tokens = 32, seed = 0, chunk = 0, page_tokens = 0;
	/* sampling flags by enum kv_gencfg_field; NaN: not given */
	double sv[KV_GC_N] = {NAN, NAN, NAN, NAN, NAN, NAN, NAN};
	int kv_f32 = 0, ignore_eos = 0, quiet = 0;
	const char *quant_act = "q8", *kv_dtype = NULL, *spec_s = "auto", *mtp_out = NULL;
	struct cons_flags cf = {0};
	const char *completion_out = NULL, *out_dir = NULL;
	int64_t close_at = -1;
	struct kv_flag flags[] = {
		{"model", KV_FLAG_STR, &model, "DIR", "model folder (config.json + safetensors)"},
		{"prompt", KV_FLAG_STR, &prompt, "TEXT", "prompt text (needs the folder's tokenizer.json)"},
		{"tokens", KV_FLAG_STR, &tokens_s, "1,2,3", "prompt as token ids"},
		{"max-tokens", KV_FLAG_INT, &max_tokens, "N", "tokens to generate (default 32, 0 = prefill only)"},
		{"temperature", KV_FLAG_DOUBLE, &sv[KV_GC_TEMPERATURE], "T", "sampling temperature (default 0 = greedy)"},
		{"top-k", KV_FLAG_DOUBLE, &sv[KV_GC_TOP_K], "K", "keep the K most likely tokens (default 0 = off)"},
		{"top-p", KV_FLAG_DOUBLE, &sv[KV_GC_TOP_P], "P", "nucleus sampling mass (default 1 = off)"},
		{"min-p", KV_FLAG_DOUBLE, &sv[KV_GC_MIN_P], "P", "drop tokens below P x the top probability (default 0)"},
		{"presence-penalty", KV_FLAG_DOUBLE, &sv[KV_GC_PRESENCE_PENALTY], "X",
		 "subtract X from tokens generated before, -2..2 (default 0)"},
		{"frequency-penalty", KV_FLAG_DOUBLE, &sv[KV_GC_FREQUENCY_PENALTY], "X",
		 "subtract X per earlier occurrence in the output, -2..2 (default 0)"},
		{"repetition-penalty", KV_FLAG_DOUBLE, &sv[KV_GC_REPETITION_PENALTY], "X",
		 "Hugging Face's penalty on prompt + output tokens, > 0 (default 1 = off)"},
		{"generation-config", KV_FLAG_STR, &gc_mode, "none|auto|DIR",
		 "sampling defaults for the flags not given: none (greedy), the model's generation_config.json, or "
		 "DIR's (default none)"},
		{"stop", KV_FLAG_STR, &stop, "TEXT", "stop when the output text contains TEXT (default: none)"},
		{"seed", KV_FLAG_INT, &seed, "S", "sampling seed (default 0)"},
		{"logits-out", KV_FLAG_STR, &logits_out, "FILE", "write the last prompt position's logits (f32 LE)"},
		{"all-logits-out", KV_FLAG_STR, &all_out, "FILE", "write every prompt position's logits (f32 LE)"},
		{"state-out", KV_FLAG_STR, &state_out, "FILE", "write the recurrent snapshot after the prompt"},
		{"kv-dtype", KV_FLAG_STR, &kv_dtype, "bf16|f32|q8_0", "KV element type (default bf16; q8_0: int8 blocks, half the bytes, lossy)"},
		{"kv-f32", KV_FLAG_BOOL, &kv_f32, NULL, "keep KV in f32 (the same as --kv-dtype f32)"},
		{"quant-act", KV_FLAG_STR, &quant_act, "q8|f32", "products with Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/MXFP4 weights: q8 (default) quantizes each activation row to int8 for integer dots, f32 keeps activations f32 against the exactly dequantized weights"},
		{"chunk", KV_FLAG_INT, &chunk, "N", "prefill chunk in tokens (default 256)"},
		{"page-tokens", KV_FLAG_INT, &page_tokens, "N", "tokens per KV page (default 256)"},
		{"ignore-eos", KV_FLAG_BOOL, &ignore_eos, NULL, "do not stop at an EOS token"},
		{"quiet", KV_FLAG_BOOL, &quiet, NULL, "no timing line on stderr"},
		{"speculative", KV_FLAG_STR, &spec_s, "off|lookup|mtp|auto",
		 "speculative decoding without a constraint (default auto): the same ids, fewer forwards"},
		{"mtp-logits-out", KV_FLAG_STR, &mtp_out, "FILE",
		 "the MTP head's logits at prompt positions 0..n-2 (it sees the prompt's tokens, at most 64), f32 LE"},
		{"grammar", KV_FLAG_STR, &cf.grammar, "FILE", "constrain the output to a GBNF grammar (llama.cpp syntax)"},
		{"json-schema", KV_FLAG_STR, &cf.schema, "FILE", "constrain the output to JSON valid under the JSON Schema in FILE"},
		{"json-object", KV_FLAG_BOOL, &cf.json_object, NULL, "constrain the output to any JSON object"},
		{"strict", KV_FLAG_BOOL, &cf.strict, NULL, "an unsupported JSON Schema keyword is an error (default: ignored)"},
		{"tools", KV_FLAG_STR, &cf.tools, "FILE", "an OpenAI tools array: constrain the output to tool calls"},
		{"tool-choice", KV_FLAG_STR, &cf.tool_choice, "required|auto|none|NAME",
		 "with --tools: which calls are allowed (default required)"},
		{"tool-format", KV_FLAG_STR, &cf.tool_format, "json|xml|list",
		 "with --tools: Qwen3 JSON (default) or Qwen3.5 XML tool-call syntax"},
		{"parallel-tool-calls", KV_FLAG_BOOL, &cf.parallel, NULL, "with --tools: several calls may follow each other"},
		{"print-grammar", KV_FLAG_BOOL, &cf.print, NULL, "print the constraint's grammar (GBNF-like) to stderr"},
		{"grammar-close", KV_FLAG_INT, &close_at, "N",
		 "after N tokens, finish the constrained output with its shortest completion (default: never)"},
		{"completion-out", KV_FLAG_STR, &completion_out, "FILE", "write the completion's bytes to FILE"},
		{"out-dir", KV_FLAG_STR, &out_dir, "DIR",
		 "corpus mode (--json-schema DIR, or --tools FILE --tool-choice each): one completion per schema or tool "
		 "into DIR"},
		{0},
	};
	const char *usage = "usage: kvkeep generate --model DIR (--prompt TEXT | --tokens 1,2,3) [--max-tokens N] "
			    "[--temperature T] [--seed S] [--logits-out FILE]";
	int rc = kv_flags_parse(usage, flags, argc, argv, NULL, 0, NULL);
	if (rc == 1)
		return 0;
	if (rc)
		return 2;
	if (!model || (!prompt == !tokens_s)) {
		fprintf(stderr, "kvkeep generate: --model and exactly one of --prompt / --tokens are required\n");
		return 2;
	}
	int spec_mode = kss_spec_mode_parse(spec_s);
	if (max_tokens < 0 || max_tokens > 1000000 || chunk < 0 || chunk > 8192 || page_tokens < 0 ||
	    page_tokens > 65536 || (stop && !*stop) || spec_mode < 0) {
		fprintf(stderr, "kvkeep generate: a flag is out of range (see --help)\n");
		return 2;
	}
	struct kv_gencfg sd, file;
	if (sampling_defaults(model, gc_mode, sv, &sd, &file))
		return 2;
	struct ke_model *m = NULL;
	struct ke_seq *s = NULL;
	struct ke_sampler *smp = NULL;
	struct kv_tok *tok = NULL;
	struct kv_chat *chat = NULL;
	struct kv_buf gen_text = KV_BUF_INIT, piece = KV_BUF_INIT;
	struct kv_tok_stream ds;
	int32_t *ids = NULL, *out_ids = NULL;
	size_t n_ids = 0;
	float *logits = NULL, *all = NULL;
	void *snap = NULL;
	int status = 1;
	struct kv_gram *ir = NULL;
	struct kv_gvocab *gv = NULL;
	struct kv_grammar *gram = NULL;
	struct kv_gmatch *gm = NULL;
	uint32_t *mask = NULL;
	struct kv_buf comp = KV_BUF_INIT;

	if (!out_dir && build_constraint(&cf, &ir)) {
		status = 2;
		goto out;
	}

	struct ke_model_params mp;
	if (engine_params(kv_f32, kv_dtype, quant_act, page_tokens, &mp))
		goto out;
	if (ke_model_load(model, &mp, &m)) {
		fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
		goto out;
	}
	if (kv_tok_load_model(model, &tok)) {
		tok = NULL;
		if (prompt) {
			fprintf(stderr, "kvkeep: --prompt needs a tokenizer: %s\n", kv_errmsg());
			goto out;
		}
	}
	if (prompt) {
		size_t n;
		if (kv_tok_encode(tok, prompt, strlen(prompt), 1, &ids, &n)) {
			fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
			goto out;
		}
		n_ids = n;
	} else if (kv_parse_int_list(tokens_s, &ids, &n_ids)) {
		goto out;
	}
	if (n_ids == 0 || n_ids > INT32_MAX / 2) {
		fprintf(stderr, "kvkeep generate: the prompt has no tokens\n");
		goto out;
	}
	const struct kv_model_config *c = ke_model_config(m);
	int V = c->vocab;
	struct ke_seq_params sp = {.chunk = (int)chunk};
	if (ke_seq_create(m, &sp, &s)) {
		fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
		goto out;
	}
	struct ke_sample_params pp = sample_params(&sd, (uint64_t)seed);
	if (ke_sampler_create(V, &pp, &smp)) {
		fprintf(stderr, "kvkeep generate: %s\n", kv_errmsg());
		status = 2;
		goto out;
	}
	ke_sampler_prompt(smp, ids, n_ids);
	/* the server's stop ids; the template (for its end-of-turn token) is
	 * optional here: a folder without one still generates */
	if (tok && kv_chat_load(model, tok, &chat))
		chat = NULL;
	int32_t stop_ids[16];
	int n_stop_ids = kv_gencfg_stop_ids(c, &file, tok, chat, stop_ids, 16);
	if (stop && !tok) {
		fprintf(stderr, "kvkeep generate: --stop needs the folder's tokenizer\n");
		status = 2;
		goto out;
	}
	if (tok)
		kv_tok_stream_init(&ds, tok, 1);
	if (out_dir) {
		if (!tok || !(cf.schema || (cf.tools && cf.tool_choice && !strcmp(cf.tool_choice, "each")))) {
			fprintf(stderr, "kvkeep generate: --out-dir needs the tokenizer and --json-schema DIR or --tools FILE "
					"--tool-choice each\n");
			status = 2;
			goto out;
		}
		struct corpus cp = {.m = m, .tok = tok, .ids = ids, .n_ids = n_ids, .stop = stop_ids, .n_stop = n_stop_ids,
				    .pp = pp, .sp = sp, .max_tokens = max_tokens, .close_at = close_at, .quiet = quiet};
		double c0 = kv_now_s();
		if (kv_gvocab_create(tok, V, &cp.gv)) {
			fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
			goto out;
		}
		int crc = corpus_run(&cp, &cf, out_dir);
		if (!quiet)
			fprintf(stderr, "corpus: %.1f s, %ld masks, mean %.1f us, max %.1f us\n", kv_now_s() - c0, cp.n_masks,
				cp.n_masks ? cp.mask_s / (double)cp.n_masks * 1e6 : 0.0, cp.mask_max * 1e6);
		kv_gvocab_free(cp.gv);
		status = crc ? 1 : 0;
		goto out;
	}
	if (ir && (status = constraint_setup(ir, tok, V, stop_ids, n_stop_ids, quiet, &gv, &gram, &gm, &mask)))
		goto out;
	status = 1;
	logits = kv_alloc(KV_MEM_SCRATCH, (size_t)V * sizeof *logits);
	out_ids = malloc(((size_t)max_tokens + 4096 + 1) * sizeof *out_ids);
	if (all_out)
		all = kv_alloc(KV_MEM_SCRATCH, n_ids * (size_t)V * sizeof *all);
	if (!logits || !out_ids || (all_out && !all)) {
		fprintf(stderr, "kvkeep: out of memory\n");
		goto out;
	}
	double t0 = kv_now_s();
	if (prefill(m, s, ids, n_ids, all, logits, mtp_out))
		goto out;
	double t1 = kv_now_s();
	if (logits_out && write_f32(logits_out, logits, (size_t)V * sizeof *logits))
		goto out;
	if (all_out && write_f32(all_out, all, n_ids * (size_t)V * sizeof *all))
		goto out;
	if (state_out) {
		size_t sb = ke_seq_snapshot_bytes(s);
		snap = malloc(sb ? sb : 1);
		if (!snap || ke_seq_snapshot(s, snap, sb) || write_f32(state_out, snap, sb))
			goto out;
	}
	struct dec d = {.s = s, .smp = smp, .logits = logits, .gm = gm, .gv = gv, .mask = mask, .stop_ids = stop_ids,
			.n_stop_ids = n_stop_ids, .ignore_eos = ignore_eos, .stop = stop, .ds = &ds, .piece = &piece,
			.gen_text = &gen_text, .comp = &comp, .max_tokens = max_tokens, .close_at = close_at,
			.out_ids = out_ids, .finish = "length"};
	struct cmd_gen_spec gs = {0};
	if (decode_any(&d, tok, ids, n_ids, spec_mode, &gs))
		goto out;
	double t2 = kv_now_s();
	if (report_all(&d, &gs, tok, ids, n_ids, quiet, completion_out))
		goto out;
	if (!quiet)
		fprintf(stderr, "prompt %zu tokens in %.3f s (%.1f tok/s), %d generated in %.3f s (%.1f tok/s), isa=%s\n",
			n_ids, t1 - t0, (double)n_ids / (t1 - t0 > 0 ? t1 - t0 : 1e-9), d.n_out, t2 - t1,
			d.n_out > 1 ? (double)(d.n_out - 1) / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0, ke_isa_name(ke_isa()));
	status = 0;
out:
	free(mask);
	kv_buf_free(&comp);
	kv_gmatch_free(gm);
	kv_grammar_unref(gram);
	kv_gvocab_free(gv);
	kv_gram_free(ir);
	free(snap);
	kv_free(all);
	kv_free(logits);
	free(out_ids);
	free(ids);
	ke_sampler_destroy(smp);
	kv_buf_free(&gen_text);
	kv_buf_free(&piece);
	kv_chat_free(chat);
	kv_tok_free(tok);
	ke_seq_destroy(s);
	ke_model_destroy(m);
	return status;
}
KV_COMMAND(generate, "generate", "run the engine on a prompt (prefill + decode, no server)", cmd_generate);
