/*
 * mlxgemm.h - GEMM of F16 and MLX affine weight matrices (mlxgemm.c), the
 * hook ke_gemm_range (engine/matmul.c) calls for those dtypes, and the
 * dequantizer the tests and the embedding lookup share. Numerics: gemm.h,
 * mlxgemm.c.
 */
#ifndef KV_ENGINE_MLXGEMM_H
#define KV_ENGINE_MLXGEMM_H

#include <stddef.h>

struct ke_mat;

/* 1 when ke_gemm_range must hand w to ke_gemm_range_dq. */
#define KE_MAT_IS_DQ(w) ((w)->dtype == KV_DT_F16 || (w)->dtype == KV_DT_MLX_AFFINE)

/* ke_gemm_range for an F16 or KV_DT_MLX_AFFINE matrix. */
void ke_gemm_range_dq(int isa, const struct ke_mat *w, const float *x, size_t ldx, int m, float *y, size_t ldy,
		      unsigned flags, int n0, int n1);
/* Rows [r0, r1) of an F16 or MLX matrix as f32 (row-major, cols floats
 * each) on a given path (clamped to the CPU): the values the GEMM uses. */
void ke_mat_dequant_rows(int isa, const struct ke_mat *w, int r0, int r1, float *out);

#endif
