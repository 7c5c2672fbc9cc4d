/*
 * qgemm.h - products with quantized (ggml block types) and F16 weights.
 *
 * Numerics: a panel of weight rows is dequantized exactly as
 * model/quant.c defines (bit-identical to ggml's to_float) into f32, and
 * the f32 kernel of engine/gemm.c multiplies it with the canonical 16-lane
 * reduction of gemm.h. So every output equals, bit for bit, the f32 engine
 * run on the dequantized weights, whatever M, the panel, the thread or
 * the ISA path (activations stay f32: nothing is quantized per row).
 */
#ifndef KV_ENGINE_QGEMM_H
#define KV_ENGINE_QGEMM_H

#include "engine/gemm.h"

/* Largest row length (K) of a quantized matrix: the per-thread panel
 * holds at least one dequantized row. */
#define KE_QGEMM_MAX_K 65536

/* 1 if w is a matrix this module multiplies (block types, F16). */
int ke_qgemm_handles(const struct ke_mat *w);
/* ke_gemm_range for such a matrix (same contract). */
void ke_qgemm_range(int isa, const struct ke_mat *w, const float *x, size_t ldx, int m, float *y, size_t ldy,
		    unsigned flags, int n0, int n1);
/* Row r of w dequantized into out[cols] (embedding lookups). */
void ke_qgemm_row(const struct ke_mat *w, int r, float *out);

#endif
