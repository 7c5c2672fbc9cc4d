/*
 * cmd_generate.c - `kvkeep generate`: run the engine on a prompt from the
 * command line (no server, no cache).
 *
 *   kvkeep generate --model DIR (--prompt TEXT | --tokens 1,2,3)
 *       [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]
 *       [--min-p P] [--seed S] [--logits-out FILE]
 *
 * Prints the generated ids on one line ("ids: 1 2 3") and, when the folder
 * has a tokenizer, the text of prompt + completion after "text: ". Timing
 * goes to stderr. Generation stops at max-tokens or an EOS id of
 * config.json (unless --ignore-eos).
 *
 * Files (raw little-endian f32, for the reference tests in tests/ref):
 *   --logits-out F      vocab_size floats: logits of the last prompt position
 *   --all-logits-out F  n_prompt x vocab_size floats: every prompt position
 *   --state-out F       the recurrent snapshot after the prompt (hybrid
 *                       models; layout.h snapshot format)
 * --prompt encodes with the folder's tokenizer.json (special tokens such
 * as <|im_start|> are recognised).
 */
#include "base/clock.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/mem.h"
#include "cli/cli.h"
#include "engine/isa.h"
#include "engine/sample.h"
#include "engine/seq.h"
#include "model/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int write_f32(const char *path, const void *p, size_t bytes)
{
	if (kv_durable_write(path, p, bytes, KV_DW_NO_SYNC)) {
		fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
		return -1;
	}
	return 0;
}

static int cmd_generate(int argc, char **argv)
{
	const char *model = NULL, *prompt = NULL, *tokens_s = NULL, *logits_out = NULL, *all_out = NULL,
		   *state_out = NULL;
	int64_t max_tokens = 32, top_k = 0, seed = 0, chunk = 0, page_tokens = 0;
	double temperature = 0.0, top_p = 1.0, min_p = 0.0;
	int kv_f32 = 0, ignore_eos = 0, quiet = 0;
	struct kv_flag flags[] = {
		{"model", KV_FLAG_STR, &model, "DIR", "model folder (config.json + safetensors)"},
		{"prompt", KV_FLAG_STR, &prompt, "TEXT", "prompt text (needs the folder's tokenizer.json)"},
		{"tokens", KV_FLAG_STR, &tokens_s, "1,2,3", "prompt as token ids"},
		{"max-tokens", KV_FLAG_INT, &max_tokens, "N", "tokens to generate (default 32, 0 = prefill only)"},
		{"temperature", KV_FLAG_DOUBLE, &temperature, "T", "sampling temperature (default 0 = greedy)"},
		{"top-k", KV_FLAG_INT, &top_k, "K", "keep the K most likely tokens (default 0 = off)"},
		{"top-p", KV_FLAG_DOUBLE, &top_p, "P", "nucleus sampling mass (default 1 = off)"},
		{"min-p", KV_FLAG_DOUBLE, &min_p, "P", "drop tokens below P x the top probability (default 0)"},
		{"seed", KV_FLAG_INT, &seed, "S", "sampling seed (default 0)"},
		{"logits-out", KV_FLAG_STR, &logits_out, "FILE", "write the last prompt position's logits (f32 LE)"},
		{"all-logits-out", KV_FLAG_STR, &all_out, "FILE", "write every prompt position's logits (f32 LE)"},
		{"state-out", KV_FLAG_STR, &state_out, "FILE", "write the recurrent snapshot after the prompt"},
		{"kv-f32", KV_FLAG_BOOL, &kv_f32, NULL, "keep KV in f32 (default bf16)"},
		{"chunk", KV_FLAG_INT, &chunk, "N", "prefill chunk in tokens (default 256)"},
		{"page-tokens", KV_FLAG_INT, &page_tokens, "N", "tokens per KV page (default 256)"},
		{"ignore-eos", KV_FLAG_BOOL, &ignore_eos, NULL, "do not stop at an EOS token"},
		{"quiet", KV_FLAG_BOOL, &quiet, NULL, "no timing line on stderr"},
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
	if (max_tokens < 0 || max_tokens > 1000000 || chunk < 0 || chunk > 8192 || page_tokens < 0 ||
	    page_tokens > 65536 || top_k < 0 || top_k > INT32_MAX) {
		fprintf(stderr, "kvkeep generate: a numeric flag is out of range (see --help)\n");
		return 2;
	}

	struct ke_model *m = NULL;
	struct ke_seq *s = NULL;
	struct ke_sampler *smp = NULL;
	struct kv_tok *tok = NULL;
	int32_t *ids = NULL, *out_ids = NULL;
	size_t n_ids = 0;
	float *logits = NULL, *all = NULL;
	void *snap = NULL;
	int status = 1;

	struct ke_model_params mp = {.kv_f32 = kv_f32, .page_tokens = (int)page_tokens};
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
	struct ke_sample_params pp = {.temperature = temperature, .top_k = (int)top_k, .top_p = top_p,
				      .min_p = min_p, .seed = (uint64_t)seed};
	if (ke_sampler_create(V, &pp, &smp)) {
		fprintf(stderr, "kvkeep generate: %s\n", kv_errmsg());
		status = 2;
		goto out;
	}
	logits = kv_alloc(KV_MEM_SCRATCH, (size_t)V * sizeof *logits);
	out_ids = malloc(((size_t)max_tokens + 1) * sizeof *out_ids);
	if (all_out)
		all = kv_alloc(KV_MEM_SCRATCH, n_ids * (size_t)V * sizeof *all);
	if (!logits || !out_ids || (all_out && !all)) {
		fprintf(stderr, "kvkeep: out of memory\n");
		goto out;
	}
	struct ke_prefill_opts po = {.logits_all = all};
	double t0 = kv_now_s();
	if (ke_seq_prefill(s, ids, (int)n_ids, &po, logits)) {
		fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
		goto out;
	}
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
	int n_out = 0;
	for (int i = 0; i < max_tokens; i++) {
		int32_t t = ke_sample(smp, logits);
		out_ids[n_out++] = t;
		int eos = 0;
		for (int e = 0; e < c->n_eos; e++)
			eos |= c->eos_ids[e] == t;
		if ((eos && !ignore_eos) || i + 1 == max_tokens)
			break;
		if (ke_seq_decode(s, t, logits)) {
			fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
			goto out;
		}
	}
	double t2 = kv_now_s();
	printf("ids:");
	for (int i = 0; i < n_out; i++)
		printf(" %d", out_ids[i]);
	printf("\n");
	if (tok) {
		char *text = NULL;
		size_t tl;
		int32_t *both = malloc((n_ids + (size_t)n_out) * sizeof *both);
		if (both) {
			memcpy(both, ids, n_ids * sizeof *both);
			memcpy(both + n_ids, out_ids, (size_t)n_out * sizeof *both);
			if (!kv_tok_decode(tok, both, n_ids + (size_t)n_out, 0, &text, &tl))
				printf("text: %s\n", text);
			free(text);
			free(both);
		}
	}
	if (!quiet)
		fprintf(stderr, "prompt %zu tokens in %.3f s (%.1f tok/s), %d generated in %.3f s (%.1f tok/s), isa=%s\n",
			n_ids, t1 - t0, (double)n_ids / (t1 - t0 > 0 ? t1 - t0 : 1e-9), n_out, t2 - t1,
			n_out > 1 ? (double)(n_out - 1) / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0, ke_isa_name(ke_isa()));
	status = 0;
out:
	free(snap);
	kv_free(all);
	kv_free(logits);
	free(out_ids);
	free(ids);
	ke_sampler_destroy(smp);
	kv_tok_free(tok);
	ke_seq_destroy(s);
	ke_model_destroy(m);
	return status;
}
KV_COMMAND(generate, "generate", "run the engine on a prompt (prefill + decode, no server)", cmd_generate);
