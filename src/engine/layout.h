/*
 * layout.h - how an engine's per-sequence state looks in bytes.
 *
 * The engine fills one ke_layout per loaded model; the prefix cache and
 * the disk tier move bytes according to it and never interpret them
 * beyond it (docs/cache.md), so another engine with the same kind of state
 * can be served by the same cache.
 *
 * KV page (B = page_tokens tokens, all attention layers):
 *   n_segments = n_attn_layers x 2 (K, V) x n_kv_heads segments, in order
 *   s = (l * 2 + kv) * n_kv_heads + h   (l: attention layer index among
 *   the attention layers, kv: 0 = K, 1 = V, h: KV head). Segment s holds
 *   B rows of row_bytes (head_dim elements of kv_dtype: F32, BF16, or
 *   Q8_0 blocks of 32 elements in 34 bytes, engine/kvq8.h); row t of segment
 *   s starts at byte (s * B + t) * row_bytes. K rows are stored after the
 *   k norm and RoPE. So the first n tokens of a page ("a tail of n") are
 *   the first n rows of every segment.
 *
 * Snapshot: the state a sequence carries that the KV pages above do not
 *   hold, valid only at the exact position p it was taken. These two
 *   tables are the one list of it (which layers, where, how many bytes):
 *   - rec[]: each DeltaNet layer in layer order, conv state [conv_dim][K-1]
 *     f32 then S [Hv][dk][dv] f32 (rec_bytes in all);
 *   - win[]: each sliding-window attention layer in layer order (after
 *     the recurrent part), its K rows then its V rows of the W - 1
 *     positions before p, [kv_heads][W - 1][row_bytes] each (the window
 *     layer's own geometry: Gemma 4's sliding layers have other head
 *     sizes and KV head counts than its global ones), in the KV dtype:
 *     row i holds position p - (W - 1) + i, zero bytes for positions
 *     below 0. These layers' KV is never in the pages above (a sequence
 *     keeps only its window, in window pages of the same segment layout
 *     over the window layers, with their geometry: engine/seq.c).
 *   snapshot_bytes is the sum. A model with a snapshot cannot be cut back
 *   to an earlier position without one taken there: its cache entries are
 *   non-trimmable (ke_layout_nontrim).
 */
#ifndef KV_ENGINE_LAYOUT_H
#define KV_ENGINE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kvq8.h"
#include "model/config.h"
#include "model/safetensors.h"

struct ke_rec_layer {
	int layer;             /* model layer index */
	size_t conv_off;       /* byte offset of the conv state in a snapshot */
	size_t conv_bytes;     /* conv_dim x (K-1) x 4 */
	int conv_dims[2];      /* {conv_dim, K-1} */
	size_t state_off;      /* byte offset of S in a snapshot */
	size_t state_bytes;    /* Hv x dk x dv x 4 */
	int state_dims[3];     /* {Hv, dk, dv} */
};

struct ke_win_layer {
	int layer;             /* model layer index */
	int idx;               /* index among the window layers (its segments in window pages) */
	int rows;              /* W - 1 */
	int kv_heads;          /* KV heads of the layer (the layout's n_kv_heads unless gemma4) */
	int head_dim;          /* its head size (the layout's head_dim unless gemma4) */
	size_t row_bytes;      /* ke_layout_row_bytes(kv_dtype, head_dim) */
	size_t k_off, v_off;   /* byte offsets of the K and V rows in a snapshot */
	size_t bytes;          /* both: 2 x kv_heads x rows x row_bytes */
};

struct ke_layout {
	int page_tokens;         /* B: tokens per KV page (default 256) */
	int kv_dtype;            /* enum kv_dtype: KV_DT_BF16, KV_DT_F32 or KV_DT_Q8_0 */
	int n_attn_layers;
	int n_kv_heads;
	int head_dim;
	int n_segments;          /* n_attn_layers x 2 x n_kv_heads */
	size_t row_bytes;        /* ke_layout_row_bytes(kv_dtype, head_dim) */
	size_t page_bytes;       /* n_segments x page_tokens x row_bytes */
	size_t kv_bytes_per_token; /* n_segments x row_bytes */
	int n_rec_layers;        /* DeltaNet layers (0 for dense) */
	struct ke_rec_layer rec[KV_MAX_LAYERS];
	size_t rec_bytes;        /* the recurrent part of a snapshot, f32 */
	int window;              /* W of the sliding layers (0: none) */
	int n_win_layers;        /* sliding-window attention layers (not in the pages) */
	struct ke_win_layer win[KV_MAX_LAYERS];
	size_t snapshot_bytes;   /* rec_bytes + the windows */
};

/* 1 when a sequence's state at p is more than its KV pages (recurrent
 * layers, sliding windows): then resuming at p needs a snapshot taken at
 * exactly p, and a cache entry cannot be trimmed to a shorter prefix. The
 * cache, the disk tier and the session ask this, never a layer kind. */
static inline int ke_layout_nontrim(const struct ke_layout *l)
{
	return l->snapshot_bytes > 0;
}

/* Bytes of one KV row of head_dim elements of kv_dtype: 4 or 2 per
 * element for F32 / BF16, 34 per 32 elements for Q8_0; 0 when the dtype
 * cannot hold such a row (Q8_0 with head_dim not a multiple of 32). Every
 * size of the KV (page, tail, bytes per token, the budget's and the disk
 * tier's arithmetic) derives from it. */
static inline size_t ke_layout_row_bytes(int kv_dtype, int head_dim)
{
	if (head_dim <= 0)
		return 0;
	switch (kv_dtype) {
	case KV_DT_F32:
		return (size_t)head_dim * 4;
	case KV_DT_BF16:
	case KV_DT_F16:
		return (size_t)head_dim * 2;
	case KV_DT_Q8_0:
		return head_dim % KE_KVQ8_BLOCK ? 0 : ke_kvq8_row_bytes(head_dim);
	default:
		return 0;
	}
}

/* KV bytes of one token: K and V rows of every KV head of every attention
 * layer (layout.kv_bytes_per_token; `kvkeep model info` before a load). */
static inline uint64_t ke_layout_token_bytes(int kv_dtype, int n_attn_layers, int n_kv_heads, int head_dim)
{
	return (uint64_t)n_attn_layers * 2u * (uint64_t)n_kv_heads * ke_layout_row_bytes(kv_dtype, head_dim);
}

/*
 * Helpers (additive): addressing and copying rows of the page format, for
 * the cache and the disk tier, which move tails without interpreting them.
 */

/* Byte offset of row t of segment s in a buffer holding `stride` rows per
 * segment (stride = page_tokens for a page, or n for a compact tail). */
static inline size_t ke_layout_row_off(const struct ke_layout *l, int s, int t, int stride)
{
	return ((size_t)s * (size_t)stride + (size_t)t) * l->row_bytes;
}

/* Copy the first n rows of every segment from src (src_stride rows per
 * segment) to dst (dst_stride rows per segment). n <= both strides. */
static inline void ke_layout_copy_rows(const struct ke_layout *l, void *dst, int dst_stride, const void *src,
				       int src_stride, int n)
{
	for (int s = 0; s < l->n_segments; s++)
		__builtin_memcpy((char *)dst + ke_layout_row_off(l, s, 0, dst_stride),
				 (const char *)src + ke_layout_row_off(l, s, 0, src_stride), (size_t)n * l->row_bytes);
}

/* Bytes of a compact tail of n rows (n rows per segment). */
static inline size_t ke_layout_tail_bytes(const struct ke_layout *l, int n)
{
	return (size_t)l->n_segments * (size_t)n * l->row_bytes;
}

#endif
