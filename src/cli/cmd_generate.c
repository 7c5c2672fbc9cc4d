/*
 * cmd_generate.c - `kvkeep generate`: run the engine on a prompt from the
 * command line (no server, no cache).
 *
 *   kvkeep generate --model DIR (--prompt TEXT | --tokens 1,2,3)
 *       [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]
 *       [--min-p P] [--presence-penalty X] [--frequency-penalty X]
 *       [--repetition-penalty X] [--seed S] [--generation-config none|auto|DIR]
 *       [--stop TEXT] [--logits-out FILE]
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
#include "text/template.h"
#include "text/tokenizer.h"
#include "text/stop.h"

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

/* The ids, the text of prompt + completion (with a tokenizer), the finish. */
static void print_result(const struct kv_tok *tok, const int32_t *ids, size_t n_ids, const int32_t *out_ids, int n_out,
			 const char *finish)
{
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
	printf("finish: %s\n", finish);
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

static int cmd_generate(int argc, char **argv)
{
	const char *model = NULL, *prompt = NULL, *tokens_s = NULL, *logits_out = NULL, *all_out = NULL,
		   *state_out = NULL;
	const char *gc_mode = "none", *stop = NULL;
	int64_t max_tokens = 32, seed = 0, chunk = 0, page_tokens = 0;
	/* sampling flags by enum kv_gencfg_field; NaN: not given */
	double sv[KV_GC_N] = {NAN, NAN, NAN, NAN, NAN, NAN, NAN};
	int kv_f32 = 0, ignore_eos = 0, quiet = 0;
	const char *quant_act = "q8", *spec_s = "auto", *mtp_out = NULL;
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
		{"mtp-logits-out", KV_FLAG_STR, &mtp_out, "FILE",
		 "the MTP head's logits at prompt positions 0..n-2 (it sees the prompt's tokens, at most 64), f32 LE"},
		{"kv-f32", KV_FLAG_BOOL, &kv_f32, NULL, "keep KV in f32 (default bf16)"},
		{"quant-act", KV_FLAG_STR, &quant_act, "q8|f32", "products with Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K weights: q8 (default) quantizes each activation row to int8 for integer dots, f32 keeps activations f32 against the exactly dequantized weights"},
		{"chunk", KV_FLAG_INT, &chunk, "N", "prefill chunk in tokens (default 256)"},
		{"page-tokens", KV_FLAG_INT, &page_tokens, "N", "tokens per KV page (default 256)"},
		{"ignore-eos", KV_FLAG_BOOL, &ignore_eos, NULL, "do not stop at an EOS token"},
		{"quiet", KV_FLAG_BOOL, &quiet, NULL, "no timing line on stderr"},
		{"speculative", KV_FLAG_STR, &spec_s, "off|lookup|mtp|auto",
		 "speculative decoding (default auto): the same ids, fewer forwards when drafts are right"},
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
	if (max_tokens < 0 || kss_spec_mode_parse(spec_s) < 0 || max_tokens > 1000000 || chunk < 0 || chunk > 8192 ||
	    page_tokens < 0 || page_tokens > 65536 || (stop && !*stop)) {
		fprintf(stderr, "kvkeep generate: a flag is out of range (see --help)\n");
		return 2;
	}
	/* sampling: flag > generation_config (auto/DIR) > greedy */
	struct kv_gencfg sd, file, fl;
	kv_gencfg_openai(&sd);
	sd.v[KV_GC_TEMPERATURE] = 0.0;
	kv_gencfg_init(&fl);
	for (int i = 0; i < KV_GC_N; i++)
		if (!isnan(sv[i]) && kv_gencfg_set(&fl, i, sv[i], "flag")) {
			fprintf(stderr, "kvkeep generate: %s\n", kv_errmsg());
			return 2;
		}
	int gc_none = !strcmp(gc_mode, "none"), gc_auto = !strcmp(gc_mode, "auto");
	int grc = kv_gencfg_load(gc_auto || gc_none ? model : gc_mode, &file);
	if (grc && (grc != KV_ERR_NOT_FOUND || (!gc_auto && !gc_none)))
		fprintf(stderr, "kvkeep generate: warning: generation_config.json ignored: %s\n", kv_errmsg());
	if (!gc_none)
		kv_gencfg_overlay(&sd, &file);
	kv_gencfg_overlay(&sd, &fl);

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

	struct ke_model_params mp = {.kv_f32 = kv_f32, .page_tokens = (int)page_tokens,
				     .quant_act = ke_quant_act_parse(quant_act)};
	if (mp.quant_act < 0) {
		fprintf(stderr, "kvkeep generate: --quant-act must be q8 or f32\n");
		goto out;
	}
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
	struct ke_sample_params pp = {.temperature = sd.v[KV_GC_TEMPERATURE],
				      .top_k = (int)sd.v[KV_GC_TOP_K],
				      .top_p = sd.v[KV_GC_TOP_P],
				      .min_p = sd.v[KV_GC_MIN_P],
				      .presence_penalty = sd.v[KV_GC_PRESENCE_PENALTY],
				      .frequency_penalty = sd.v[KV_GC_FREQUENCY_PENALTY],
				      .repetition_penalty = sd.v[KV_GC_REPETITION_PENALTY],
				      .seed = (uint64_t)seed};
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
	logits = kv_alloc(KV_MEM_SCRATCH, (size_t)V * sizeof *logits);
	out_ids = malloc(((size_t)max_tokens + 1) * sizeof *out_ids);
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
	int n_out = 0;
	const char *finish = "length";
	struct cmd_gen_spec gs = {.s = s, .smp = smp, .logits = logits, .ids = ids, .n_ids = n_ids,
				  .max_tokens = (int)max_tokens, .stop_ids = stop_ids, .n_stop_ids = n_stop_ids,
				  .ignore_eos = ignore_eos, .stop = stop, .tok = tok, .mode = kss_spec_mode_parse(spec_s),
				  .out_ids = out_ids};
	if (gs.mode > 0) { /* gen_spec.h: the loop below, through the speculative decoder */
		if (cmd_generate_spec(&gs)) {
			fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
			goto out;
		}
		n_out = gs.n_out;
		finish = gs.finish;
		max_tokens = 0;
	}
	for (int i = 0; i < max_tokens; i++) {
		int32_t t = ke_sample(smp, logits);
		out_ids[n_out++] = t;
		int eos = 0;
		for (int e = 0; e < n_stop_ids; e++)
			eos |= stop_ids[e] == t;
		if (eos && !ignore_eos) {
			finish = "eos";
			break;
		}
		if (stop) { /* the text so far, searched where the new piece could complete a match */
			size_t before = gen_text.len, L = strlen(stop);
			kv_buf_reset(&piece);
			kv_tok_stream_feed(&ds, t, &piece);
			kv_buf_add(&gen_text, piece.p ? piece.p : "", piece.len);
			size_t from = before >= L ? before - L + 1 : 0;
			if (gen_text.len >= L && memmem(gen_text.p + from, gen_text.len - from, stop, L)) {
				finish = "stop";
				break;
			}
		}
		if (i + 1 == max_tokens)
			break;
		if (ke_seq_decode(s, t, logits)) {
			fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
			goto out;
		}
	}
	double t2 = kv_now_s();
	print_result(tok, ids, n_ids, out_ids, n_out, finish);
	if (!quiet)
		fprintf(stderr, "prompt %zu tokens in %.3f s (%.1f tok/s), %d generated in %.3f s (%.1f tok/s), isa=%s\n",
			n_ids, t1 - t0, (double)n_ids / (t1 - t0 > 0 ? t1 - t0 : 1e-9), n_out, t2 - t1,
			n_out > 1 ? (double)(n_out - 1) / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0, ke_isa_name(ke_isa()));
	if (!quiet && gs.mode > 0)
		cmd_generate_spec_report(&gs);
	status = 0;
out:
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
