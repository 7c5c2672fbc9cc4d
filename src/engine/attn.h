/*
 * attn.h - causal GQA attention of a chunk of queries over paged KV.
 *
 * Numerics (batch invariance, docs/engine.md): each (query token, KV head)
 * pair is computed on its own, over keys 0..pos in blocks of KE_ATTN_BLOCK
 * keys aligned to absolute positions (0, 64, 128, ...), the blocks grouped
 * in chunks of KE_ATTN_SPLIT keys (0, 512, 1024, ...), so its result does
 * not depend on which chunk of queries it came in, on the page size, or on
 * the thread that ran it. Each chunk c keeps its own softmax state
 * (m_c, l_c, acc_c), starting from m = -FLT_MAX, l = 0, acc = 0; per block:
 *   s_j = gemm-dot(q, k_j) * scale          (canonical order of gemm.h)
 *   m' = max(m, max_j s_j); c = exp(m - m'); p_j = exp(s_j - m')
 *   l = l * c + sum_j p_j (j ascending); acc = acc * c; acc += p_j v_j
 *   (j ascending, one fma per element)
 * The chunks are merged left to right, chunk 0 taken as it is:
 *   M = max(M, m_c); a = exp(M_old - M); b = exp(m_c - M)
 *   L = fma(l_c, b, L * a); ACC = fma(b, acc_c, ACC * a)
 * and at the end out = ACC * (1 / L). The G query heads that share a KV
 * head, for a tile of consecutive query tokens, are the rows of one small
 * gemm against the block's keys, and share its loads of V rows: which rows
 * are computed together never changes a row's operations. A decode step
 * (one tile per head) over more than one chunk computes the chunks of all
 * heads in parallel and merges them in the same order, so decode gives
 * the bits of prefill whatever the thread count (KE_NUMERICS_VERSION 2).
 *
 * KV rows are read in the page format of layout.h: f32, bf16 (widened
 * exactly) or q8_0 (engine/kvq8.h: code x scale, exact in f32), always
 * in place or a few rows at a time, never copied whole. Each element has
 * one f32 value whatever path reads it, so the order above is the whole
 * contract for every dtype: attention over q8_0 rows gives the bits of
 * attention over f32 rows holding their values.
 *
 * Sliding windows (window = W > 0): the query at position p attends keys
 * [lo, p], lo = max(0, p - W + 1). The blocks and chunks stay aligned to
 * absolute positions; a key below lo gets the score -inf before the block
 * maximum and the weight exactly 0 after the exp (so it adds exact zeros
 * to l and acc), a row's first chunk is the one holding lo (taken as it
 * is, like chunk 0 above), chunks below it are not visited by that row,
 * and the final merge happens when lo and p lie in different chunks.
 * Keys below the first block a tile (or a decode chunk) needs are never
 * read, so a sequence may drop the pages of positions before
 * floor(lo / KE_ATTN_BLOCK) * KE_ATTN_BLOCK; the rows between that and
 * lo are read but weigh 0 (they must be finite: a resumed sequence zeroes
 * them).
 *
 * Sinks (gpt_oss): a learned logit s_h per query head joins the softmax
 * as one more key with no value: after the chunks are merged,
 *   M' = max(M, s); a = exp(M - M'); b = exp(s - M');
 *   L = fma(1, b, L * a); ACC = ACC * a; out = ACC * (1 / L).
 */
#ifndef KV_ENGINE_ATTN_H
#define KV_ENGINE_ATTN_H

#include <stddef.h>

#include "base/pages.h"
#include "engine/layout.h"

#define KE_ATTN_BLOCK 64
/* Keys per chunk of the fixed split (a multiple of KE_ATTN_BLOCK). */
#define KE_ATTN_SPLIT 512
/* Query rows (tokens x G) computed together against each loaded key
 * block at head_dim <= 128 (half at 256, 32 rows on AVX-512): a speed knob only (the results
 * do not depend on it). */
#define KE_ATTN_TILE_ROWS 48

struct ke_attn_args {
	const struct ke_layout *lay;
	struct kv_page *const *pages; /* page i holds positions [i B, (i+1) B) */
	int layer;                    /* index among the attention layers */
	int n_heads;                  /* query heads H (multiple of n_kv_heads) */
	const float *q;               /* [n_tok][H][head_dim] */
	float *out;                   /* [n_tok][H][head_dim] */
	int pos0;                     /* absolute position of query 0 */
	int n_tok;
	float scale;                  /* 1 / sqrt(head_dim), or the model's softmax scale */
	float *scratch;               /* n_threads x ke_attn_scratch_floats() */
	int scratch_threads;          /* threads the scratch is sized for */
	int window;                   /* W keys (sliding layer), 0: every earlier key */
	const float *sinks;           /* [n_heads] sink logits, or NULL */
};

/* Floats of scratch one thread needs. */
size_t ke_attn_scratch_floats(int group, int head_dim);
/* Runs on the global pool (one unit per (token, KV head)). KV rows for
 * positions [0, pos0 + n_tok) must be written already (with a window:
 * from the first block of the first query's window on). */
void ke_attn(const struct ke_attn_args *a);

#endif
