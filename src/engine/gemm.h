/*
 * gemm.h - the batch-invariant matrix product of the engine: the weight
 * matrix (struct ke_mat), the numerics contract every product keeps, and
 * the dense (F32, BF16) kernels. engine/matmul.h multiplies any matrix.
 *
 *   y[i][n] = sum_k x[i][k] * w[n][k]      x: [M x K] f32 activations
 *                                           w: [N x K] f32 or bf16 weights
 *                                              (nn.Linear layout: output n
 *                                              reads row n)
 *
 * Numerics (the contract every path keeps, docs/engine.md): each output is
 * reduced in one fixed order that depends only on K, never on M, N, the
 * tile it was computed in, the thread that computed it or the CPU path:
 *   1. 16 lane accumulators a[0..15] start at +0;
 *   2. for each block b of 16 columns (the last one zero-padded):
 *        a[j] = fma(x[16b + j], w[16b + j], a[j])     (one rounding)
 *   3. fixed tree: a[j] += a[j+8] (j<8); a[j] += a[j+4] (j<4);
 *      a[j] += a[j+2] (j<2); y = a[0] + a[1].
 * So decode (M = 1) and prefill (M = 2048) give bit-identical rows, and the
 * scalar, AVX2 and AVX-512 paths give bit-identical results (tested).
 * bf16 weights are widened exactly (bits << 16) in registers, f16 weights
 * exactly (F16C / the scalar conversion), and MLX affine weights are
 * dequantized in registers to w = fmaf(scale, q, bias) in f32 before the
 * same FMA (engine/mlxgemm.c, docs/engine.md), so quantization changes
 * what w is, never the reduction order.
 *
 * Threads split N (output columns) through the global pool; the reduction
 * over K is never split.
 */
#ifndef KV_ENGINE_GEMM_H
#define KV_ENGINE_GEMM_H

#include <stddef.h>
#include <stdint.h>

/* A read-only weight matrix: `rows` rows of `cols` elements, row r at
 * element offset r * ld. Data may be unaligned (mmap'd safetensors). */
struct ke_mat {
	const void *data;
	int dtype;        /* KV_DT_F32, KV_DT_BF16; F16 and ggml block types go to engine/qgemm.h,
			     KV_DT_MLX_AFFINE to engine/mlxgemm.h */
	int rows;         /* N */
	int cols;         /* K */
	size_t ld;        /* elements from one row to the next (>= cols) */
	/* KV_DT_MLX_AFFINE only (zero otherwise): data holds `bits`-bit codes
	 * packed little end first (row r at byte r * ld * bits / 8), element
	 * k of row r is scale * q + bias with the group g = k / group of
	 * scales/biases row r (row stride cols / group elements). */
	const void *scales;
	const void *biases;
	int sb_dtype;     /* KV_DT_F32, KV_DT_BF16 or KV_DT_F16 */
	int bits;         /* 4 or 8 */
	int group;        /* 32, 64 or 128 */
	/* ggml block types only: 1 = products with int8 per-row quantized
	 * activations (engine/qgemm.h, --quant-act q8), 0 = exact f32. */
	int qdot;
	/* qdot matrices whose path takes them (Q8_0 on AVX-512 VNNI): the
	 * rows prepacked into 16-row panels at model load (engine/qpanel.h),
	 * or NULL. data stays the rows. */
	const void *panels;
};

/* Bytes of one matrix as stored (codes + scales + biases for MLX). */
size_t ke_mat_bytes(const struct ke_mat *w);
/* "F32", "BF16", "F16", "MLX4 g64" ... into buf; returns buf. */
const char *ke_mat_format(const struct ke_mat *w, char *buf, size_t cap);

/* Multiply-adds below which a kernel call stays on the calling thread. */
#define KE_PAR_MIN_WORK 262144.0

#define KE_GEMM_ACCUM 1u  /* y += product instead of y = product */

/* The dense kernels: ke_gemm_range (engine/matmul.h) of an F32 or BF16
 * matrix, single-threaded, output columns [n0, n1), on a given path
 * (clamped to what the CPU has). engine/qgemm.c and engine/mlxgemm.c call
 * it on the f32 rows they dequantize. */
void ke_gemm_dense_range(int isa, const struct ke_mat *w, const float *x, size_t ldx, int m, float *y, size_t ldy,
			 unsigned flags, int n0, int n1);

/* The canonical dot product above for one pair of f32 vectors (scalar). */
float ke_dot_ref(const float *a, const float *b, int n);

#endif
