/*
 * mtp.h - the multi-token-prediction head of Qwen3.5 / Qwen3-Next as a
 * draft source for speculative decoding (session/spec.h).
 *
 * The head (Hugging Face `mtp.*`, llama.cpp's `blk.N.nextn.*`) predicts
 * the token after next: at position t it takes the main model's final
 * hidden state h_t (after the final norm) and the embedding of token
 * x_{t+1}, computes
 *     x = fc([norm_e(embed(x_{t+1})) | norm_h(h_t)])
 * then one full-attention decoder layer (gated attention with the model's
 * geometry, its own KV; the dense MLP or the sparse MoE block), then
 * g = norm(x) and logits = lm_head(g), whose argmax drafts x_{t+2}. The
 * head chains: g at t and the drafted x_{t+2} give the row at t + 1, and
 * so on (docs/engine.md, "Speculative decoding").
 *
 * Per sequence, a ke_mtp_seq keeps the head's KV over a stretch of the
 * sequence's positions, the context: the rows added with their hidden
 * states and next tokens, in order. The context starts where the caller
 * first adds rows (or restarts: ke_mtp_seq_draft with a position that does
 * not continue it) and is counted from 0 there: RoPE makes attention a
 * function of relative positions, so the head sees the same geometry. A
 * draft's chained rows are taken back afterwards. Drafts never change
 * an output (verification does), so none of this has to match anything
 * bit for bit; the head runs the engine's kernels all the same.
 *
 * Memory: the head's KV pages (its pool, KV_MEM_KV) and a scratch for
 * KE_MTP_ROWS rows (KV_MEM_SCRATCH). Threads: one call at a time per
 * ke_mtp_seq; kernels on the global pool.
 */
#ifndef KV_ENGINE_MTP_H
#define KV_ENGINE_MTP_H

#include <stdint.h>

#include "engine/model.h"

#define KE_MTP_ROWS 64        /* rows one call adds at most (more restart the context) */

struct ke_mtp_seq;

/* KV_ERR_UNSUPPORTED when the model has no head (ke_model_has_mtp). */
int ke_mtp_seq_create(struct ke_model *m, struct ke_mtp_seq **out);
void ke_mtp_seq_destroy(struct ke_mtp_seq *ms);

/*
 * Add n context rows (1 <= n <= KE_MTP_ROWS) at the sequence's positions
 * pos .. pos + n - 1: hidden (n x hidden floats, the main model's final
 * hidden states there) and next (the token after each position). A pos
 * that does not continue the context restarts it at pos. Then draft up to
 * k tokens (0 <= k <= 15) greedily after the last row into out. Returns
 * how many were drafted (k), or a negative error (KV_ERR_FULL: no KV page;
 * the context is then empty).
 */
int ke_mtp_seq_draft(struct ke_mtp_seq *ms, int pos, const float *hidden, const int32_t *next, int n, int k,
		     int32_t *out);
/* The head's logits at every row of a new context from position 0:
 * hidden and next as for ke_mtp_seq_draft (n <= KE_MTP_ROWS rows), logits
 * n x vocab floats (row t: the head's prediction of token t + 2). For the
 * reference check (tests/ref) and `kvkeep generate --mtp-logits-out`. */
int ke_mtp_seq_logits(struct ke_mtp_seq *ms, const float *hidden, const int32_t *next, int n, float *logits);
/* Rows of context the head holds (for tests). */
int ke_mtp_seq_context(const struct ke_mtp_seq *ms);

#endif
