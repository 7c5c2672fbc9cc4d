/*
 * gen_spec.c - see gen_spec.h. The pick below is cmd_generate.c's loop
 * body: sample, keep the id, end at an end id (unless --ignore-eos) or when
 * the decoded text contains --stop.
 */
#include "cli/gen_spec.h"
#include "base/buf.h"
#include "base/err.h"
#include "session/decode.h"
#include "session/spec.h"

#include <stdio.h>

#include <stdlib.h>
#include <string.h>

struct pick_ctx {
	struct cmd_gen_spec *g;
	struct kv_tok_stream ds;
	struct kv_buf text, piece;
};

static int pick(void *ctx, const float *logits, int vocab, int32_t *tok)
{
	struct pick_ctx *c = ctx;
	struct cmd_gen_spec *g = c->g;
	(void)vocab;
	int32_t t = ke_sample(g->smp, logits);
	g->out_ids[g->n_out++] = t;
	*tok = t;
	for (int e = 0; e < g->n_stop_ids; e++)
		if (g->stop_ids[e] == t && !g->ignore_eos) {
			g->finish = "eos";
			return 1;
		}
	if (g->stop) {
		size_t before = c->text.len, L = strlen(g->stop);
		kv_buf_reset(&c->piece);
		kv_tok_stream_feed(&c->ds, t, &c->piece);
		kv_buf_add(&c->text, c->piece.p ? c->piece.p : "", c->piece.len);
		size_t from = before >= L ? before - L + 1 : 0;
		if (c->text.len >= L && memmem(c->text.p + from, c->text.len - from, g->stop, L)) {
			g->finish = "stop";
			return 1;
		}
	}
	return KV_OK;
}

int cmd_generate_spec(struct cmd_gen_spec *g)
{
	struct pick_ctx c = {.g = g, .text = KV_BUF_INIT, .piece = KV_BUF_INIT};
	int32_t *all = malloc((g->n_ids + (size_t)g->max_tokens + 1) * sizeof *all);
	int rc;
	g->n_out = 0;
	g->finish = "length";
	if (!all)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	memcpy(all, g->ids, g->n_ids * sizeof *all);
	if (g->tok)
		kv_tok_stream_init(&c.ds, g->tok, 1);
	struct kss_run_params p = {.max_new = (uint32_t)g->max_tokens, .pick = pick, .pick_ctx = &c,
				   .speculative = g->mode};
	struct kss_decode d = {.p = &p, .s = g->s, .logits = g->logits, .all = all, .total = (uint32_t)g->n_ids};
	rc = kss_decode_run(&d);
	g->spec = d.spec;
	free(all);
	kv_buf_free(&c.text);
	kv_buf_free(&c.piece);
	return rc;
}

void cmd_generate_spec_report(const struct cmd_gen_spec *g)
{
	fprintf(stderr, "speculative %s: %u verifications, %u plain steps, drafted %u lookup + %u mtp, kept %u + %u\n",
		kss_spec_mode_name(g->mode), g->spec.steps, g->spec.plain, g->spec.drafted[0], g->spec.drafted[1],
		g->spec.accepted[0], g->spec.accepted[1]);
}
