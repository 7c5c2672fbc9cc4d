/*
 * matmul.h - the engine's matrix products, whatever a weight matrix holds.
 *
 * One entry for every struct ke_mat (engine/gemm.h), dispatching on how
 * the weights are stored:
 *   F32, BF16              the dense kernels of engine/gemm.c;
 *   F16, ggml block types  engine/qgemm.c (integer dots with quantized
 *                          activations, or rows dequantized for gemm.c);
 *   MLX affine groups      engine/mlxgemm.c (dequantized in registers or
 *                          in blocks for gemm.c).
 * The dispatch sits above the three so that calls go one way: qgemm.c and
 * mlxgemm.c hand their dequantized f32 rows to ke_gemm_dense_range, never
 * back here. Every path keeps the numerics contract of gemm.h.
 */
#ifndef KV_ENGINE_MATMUL_H
#define KV_ENGINE_MATMUL_H

#include <stddef.h>

#include "engine/gemm.h"

/* y = x w^T for m rows, on the global thread pool, current ISA path. */
void ke_gemm(const struct ke_mat *w, const float *x, size_t ldx, int m, float *y, size_t ldy, unsigned flags);
/* Same, single-threaded, output columns [n0, n1) only, on a given path
 * (enum ke_isa, clamped to what the CPU has). For tests and callers that
 * parallelise at their own level (attention). */
void ke_gemm_range(int isa, const struct ke_mat *w, const float *x, size_t ldx, int m, float *y, size_t ldy,
		   unsigned flags, int n0, int n1);
/* Row r of w as f32 into out[cols] (exactly the values the GEMM uses). */
void ke_mat_row_f32(const struct ke_mat *w, int r, float *out);

#endif
