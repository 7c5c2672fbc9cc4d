/*
 * qgemm.h - products with quantized (ggml block types) and F16 weights.
 *
 * Two modes, chosen per matrix at model load (ke_mat.qdot, the model's
 * --quant-act; it is part of the cache namespace):
 *
 * q8 (qdot = 1; the default for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
 * Q4_K, Q5_K and Q6_K): each activation row is quantized on its own to
 * int8 blocks (32 elements for the 32-block types, 256 with 16-sums for
 * the K types) and multiplied with the weight
 * codes in exact int32 dot products; the float combination of those
 * integers has one canonical order, written out in engine/qdot.h. An
 * output depends only on its activation row and weight row: never on M,
 * the tile, the thread or the ISA path (scalar, AVX2, AVX-512 VNNI agree
 * bit for bit, tested).
 *
 * f32 (qdot = 0, and Q8_K and F16 in both modes): a panel of weight
 * rows is dequantized exactly as model/quant.c defines (bit-identical to
 * ggml's to_float) into f32, and the f32 kernel of engine/gemm.c
 * multiplies it with the canonical 16-lane reduction of gemm.h. So every output equals, bit for bit, the f32 engine
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
/* 1 if w takes the integer path (w->qdot and a type qdot.h has). */
int ke_qgemm_int(const struct ke_mat *w);
/* ke_gemm for such a matrix: activations quantized once per call (in
 * pieces of rows), then the weight rows split over the global pool. */
void ke_qgemm(const struct ke_mat *w, const float *x, size_t ldx, int m, float *y, size_t ldy, unsigned flags);
/* Row r of w dequantized into out[cols] (embedding lookups). */
void ke_qgemm_row(const struct ke_mat *w, int r, float *out);

#endif
