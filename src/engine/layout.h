/*
 * layout.h - how an engine's per-sequence state looks in bytes.
 *
 * The engine fills one ke_layout per loaded model; the prefix cache and
 * the disk tier move bytes according to it and never interpret them
 * beyond it (DESIGN.md 4), so another engine with the same kind of state
 * can be served by the same cache.
 *
 * KV page (B = page_tokens tokens, all attention layers):
 *   n_segments = n_attn_layers x 2 (K, V) x n_kv_heads segments, in order
 *   s = (l * 2 + kv) * n_kv_heads + h   (l: attention layer index among
 *   the attention layers, kv: 0 = K, 1 = V, h: KV head). Segment s holds
 *   B rows of row_bytes (head_dim elements of kv_dtype); row t of segment
 *   s starts at byte (s * B + t) * row_bytes. K rows are stored after the
 *   k norm and RoPE. So the first n tokens of a page ("a tail of n") are
 *   the first n rows of every segment.
 *
 * Recurrent snapshot (hybrid models): for each DeltaNet layer in layer
 *   order, conv state [conv_dim][K-1] f32 then S [Hv][dk][dv] f32,
 *   concatenated; snapshot_bytes in total. A snapshot is valid only at the
 *   exact position it was taken.
 */
#ifndef KV_ENGINE_LAYOUT_H
#define KV_ENGINE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

struct ke_rec_layer {
	int layer;             /* model layer index */
	size_t conv_off;       /* byte offset of the conv state in a snapshot */
	size_t conv_bytes;     /* conv_dim x (K-1) x 4 */
	int conv_dims[2];      /* {conv_dim, K-1} */
	size_t state_off;      /* byte offset of S in a snapshot */
	size_t state_bytes;    /* Hv x dk x dv x 4 */
	int state_dims[3];     /* {Hv, dk, dv} */
};

struct ke_layout {
	int page_tokens;         /* B: tokens per KV page (default 256) */
	int kv_dtype;            /* enum kv_dtype: KV_DT_BF16 or KV_DT_F32 */
	int n_attn_layers;
	int n_kv_heads;
	int head_dim;
	int n_segments;          /* n_attn_layers x 2 x n_kv_heads */
	size_t row_bytes;        /* head_dim x element size */
	size_t page_bytes;       /* n_segments x page_tokens x row_bytes */
	size_t kv_bytes_per_token; /* n_segments x row_bytes */
	int n_rec_layers;        /* DeltaNet layers (0 for dense) */
	struct ke_rec_layer rec[KV_MAX_LAYERS];
	size_t snapshot_bytes;   /* all recurrent state, f32 */
};

#endif
