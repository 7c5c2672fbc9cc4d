/*
 * decode.h - the decode phase of one request (session/run.h step 5):
 * plain, or speculative (session/spec.h decides the drafts).
 *
 * Plain decoding picks a token from the logits, feeds it, and repeats.
 * Speculative decoding feeds the picked token together with a draft of k
 * tokens in one speculative forward (engine/seq.h ke_batch_item.spec) and
 * then picks at each row in order, exactly as plain decoding would pick
 * there: the same pick callback (the request's sampler, its logprobs and
 * output pipeline; a grammar's token mask would apply here), the same
 * logits bit for bit, the same random draw (the sampler draws once per
 * pick). A row's pick that equals the next draft token keeps that token
 * and goes on to the next row; the first that differs is the next token,
 * as in plain decoding, and the rows after it are taken back
 * (ke_seq_accept). So the tokens, their logprobs and the sequence's state
 * are what plain decoding gives, and only the number of forwards changes.
 *
 * Limits kept as plain decoding keeps them: at most max_new picks (a draft
 * is cut so that its picks cannot pass it), a stop id or a pick that ends
 * generation ends it at that row, and a verification never steps over a
 * multiple of the run's checkpoint interval (`every`), so that on_every
 * still sees the sequence at exactly that position. Only kept tokens ever
 * reach the sequence the cache stores.
 */
#ifndef KV_SESSION_DECODE_H
#define KV_SESSION_DECODE_H

#include <stdint.h>

#include "session/run.h"

struct kss_decode {
	const struct kss_run_params *p;   /* max_new, forced / pick, stop ids, out, sched, cancel, speculation */
	struct ke_seq *s;                 /* at the end of the prompt */
	float *logits;                    /* in: the prompt's last logits (vocab floats); scratch after */
	int32_t *all;                     /* the sequence's tokens, room for n + max_new + 1 */
	uint32_t total;                   /* in: tokens in all (the prompt); out: after decoding */
	uint32_t every;                   /* checkpoint interval (0: none) and its callback */
	void (*on_every)(void *ctx, struct ke_seq *s, int pos);
	void *every_ctx;
	/* the MTP head's context from the prompt (kss_decode_ctx_rows): the
	 * final hidden states of the prompt's last n_ctx positions (n_ctx x
	 * hidden floats), or NULL */
	const float *ctx_hidden;
	int n_ctx;
	/* out */
	uint32_t generated;               /* tokens picked (kss_run_result.generated) */
	struct kss_run_spec spec;         /* what speculation did */
};

/* Decode into d; KV_OK, or the engine's error (the sequence then holds
 * what was fed before it). */
int kss_decode_run(struct kss_decode *d);
/* How many of the prompt's last positions' hidden states the decode of p
 * on m wants as the MTP head's context (0: none; the head is not used). */
int kss_decode_ctx_rows(const struct kss_run_params *p, const struct ke_model *m);

#endif
