/*
 * dtype.h - the element types of every weight format kvkeep reads:
 * names, sizes, block geometry and the half-precision conversions.
 *
 * The numbers are safetensors' element types, then ggml's block types
 * (a block of QK elements stored in a fixed number of bytes, model/quant.h
 * has the layouts), then formats that are neither (MLX affine groups).
 * The one table of sizes lives here so that every reader, the writers and
 * the engine size rows alike.
 */
#ifndef KV_MODEL_DTYPE_H
#define KV_MODEL_DTYPE_H

#include <stddef.h>
#include <stdint.h>

enum kv_dtype {
	KV_DT_F32 = 0,
	KV_DT_F16,
	KV_DT_BF16,
	KV_DT_F64,
	KV_DT_I8,
	KV_DT_U8,
	KV_DT_I16,
	KV_DT_U16,
	KV_DT_I32,
	KV_DT_U32,
	KV_DT_I64,
	KV_DT_U64,
	KV_DT_BOOL,
	KV_DT_F8_E4M3,
	KV_DT_F8_E5M2,
	/* ggml block types (GGUF files; model/quant.h has the layouts). They
	 * have no per-element size: kv_dtype_size is 0 for them, rows are
	 * sized by kv_dtype_row_bytes from the block geometry below. Never
	 * parsed from safetensors. */
	KV_DT_Q4_0,
	KV_DT_Q4_1,
	KV_DT_Q5_0,
	KV_DT_Q5_1,
	KV_DT_Q8_0,
	KV_DT_Q2_K,
	KV_DT_Q3_K,
	KV_DT_Q4_K,
	KV_DT_Q5_K,
	KV_DT_Q6_K,
	KV_DT_Q8_K,
	KV_DT_MXFP4,     /* ggml MXFP4: 32 elements, u8 e (E8M0) + u8 qs[16] (gpt_oss experts) */
	KV_DT__COUNT,
	/* Weight-matrix formats that are not safetensors element types (no
	 * size, no name; kv_dtype_parse never returns them): */
	KV_DT_MLX_AFFINE, /* MLX affine groups, engine/gemm.h struct ke_mat */
};

/* Bytes per element; 0 for an unknown dtype and for block types. */
size_t kv_dtype_size(int dt);
/* Elements per block and bytes per block (1 and the element size for
 * plain types); 0 for an unknown dtype. */
int kv_dtype_block_elems(int dt);
size_t kv_dtype_block_bytes(int dt);
/* 1 for a ggml block type (Q4_0 ... Q8_K, MXFP4). */
int kv_dtype_is_quant(int dt);
/* Bytes of a row of n elements of any dtype, block types included; 0 if
 * the dtype is unknown or n is not a multiple of its block. */
uint64_t kv_dtype_row_bytes(int dt, uint64_t n);
/* "F32", "BF16", "Q4_K", ... ; NULL for unknown. */
const char *kv_dtype_name(int dt);
/* Parse a safetensors dtype string; -1 if unknown (block types are not
 * safetensors dtypes and are not parsed). */
int kv_dtype_parse(const char *s);

/* bf16 / f16 conversions. */
float kv_bf16_to_f32(uint16_t h);
uint16_t kv_f32_to_bf16(float f); /* round to nearest even, NaN kept */
float kv_f16_to_f32(uint16_t h);
uint16_t kv_f32_to_f16(float f);

#endif
