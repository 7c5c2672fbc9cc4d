/*
 * gen_spec.h - `kvkeep generate --speculative`: the decode loop of
 * cmd_generate.c through the session's decoder (session/decode.h), so that
 * the command's output with speculative decoding can be compared with its
 * output without (the same ids, the same finish).
 */
#ifndef KV_CLI_GEN_SPEC_H
#define KV_CLI_GEN_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "engine/sample.h"
#include "engine/seq.h"
#include "session/run.h"
#include "text/tokenizer.h"

struct cmd_gen_spec {
	struct ke_seq *s;                 /* after the prompt */
	struct ke_sampler *smp;
	float *logits;                    /* the prompt's last logits */
	const int32_t *ids;               /* the prompt */
	size_t n_ids;
	int max_tokens;
	const int32_t *stop_ids;          /* end ids (kept in the output, as cmd_generate does) */
	int n_stop_ids;
	int ignore_eos;
	const char *stop;                 /* --stop TEXT, or NULL */
	const struct kv_tok *tok;         /* for --stop */
	int mode;                         /* session/spec.h enum kss_spec_mode */
	/* out */
	int32_t *out_ids;                 /* max_tokens slots */
	int n_out;
	const char *finish;               /* "length", "eos", "stop" */
	struct kss_run_spec spec;
};

/* KV_OK or the engine's error (message in kv_errmsg). */
int cmd_generate_spec(struct cmd_gen_spec *g);
/* What speculation did, one line on stderr. */
void cmd_generate_spec_report(const struct cmd_gen_spec *g);

#endif
