/*
 * attn.h - causal GQA attention of a chunk of queries over paged KV.
 *
 * Numerics (batch invariance, docs/engine.md): each (query token, KV head)
 * pair is computed on its own, over keys 0..pos in blocks of KE_ATTN_BLOCK
 * keys aligned to absolute positions (0, 64, 128, ...), so its result does
 * not depend on which chunk the query came in, on the page size, or on
 * the thread that ran it. Per block:
 *   s_j = gemm-dot(q, k_j) * scale          (canonical order of gemm.h)
 *   m' = max(m, max_j s_j); c = exp(m - m'); p_j = exp(s_j - m')
 *   l = l * c + sum_j p_j (j ascending); acc = acc * c; acc += p_j v_j
 *   (j ascending, one fma per element)
 * and at the end out = acc / l. The G query heads that share a KV head,
 * for a tile of consecutive query tokens, are the rows of one small gemm
 * against the block's keys, and share its loads of V rows: which rows are
 * computed together never changes a row's operations.
 *
 * KV rows are read in the page format of layout.h (bf16 or f32).
 */
#ifndef KV_ENGINE_ATTN_H
#define KV_ENGINE_ATTN_H

#include <stddef.h>

#include "base/pages.h"
#include "engine/layout.h"

#define KE_ATTN_BLOCK 64
/* Query rows (tokens x G) computed together against each loaded key
 * block: a speed knob only (the results do not depend on it). */
#define KE_ATTN_TILE_ROWS 32

struct ke_attn_args {
	const struct ke_layout *lay;
	struct kv_page *const *pages; /* page i holds positions [i B, (i+1) B) */
	int layer;                    /* index among the attention layers */
	int n_heads;                  /* query heads H (multiple of n_kv_heads) */
	const float *q;               /* [n_tok][H][head_dim] */
	float *out;                   /* [n_tok][H][head_dim] */
	int pos0;                     /* absolute position of query 0 */
	int n_tok;
	float scale;                  /* 1 / sqrt(head_dim) */
	float *scratch;               /* n_threads x ke_attn_scratch_floats() */
	int scratch_threads;          /* threads the scratch is sized for */
};

/* Floats of scratch one thread needs. */
size_t ke_attn_scratch_floats(int group, int head_dim);
/* Runs on the global pool (one unit per (token, KV head)). KV rows for
 * positions [0, pos0 + n_tok) must be written already. */
void ke_attn(const struct ke_attn_args *a);

#endif
