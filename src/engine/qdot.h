/*
 * qdot.h - integer dot products of ggml block weights with activations
 * quantized per row to int8 (the `--quant-act q8` mode, docs/engine.md).
 *
 * Activation rows. A row x[0..K) is cut into blocks of B elements, B = 32
 * for Q8_0 weights and B = 256 for the K types (Q4_K, Q6_K); each block
 * is quantized on its own, from its own values only:
 *   amax = max |x[k]| over the block, found exactly on the bit patterns
 *          (bits & 0x7fffffff, an integer max: order-free);
 *   amax inf or NaN           -> d = NaN, all codes 0 (the outputs that
 *                                read the block become NaN, as in f32);
 *   amax < FLT_MIN (0 or subnormal) -> d = 0, all codes 0;
 *   otherwise d = amax / 127.0f, id = 127.0f / amax (two IEEE divisions)
 *          and q[k] = rint(x[k] * id) (one rounded product, then round to
 *          nearest even), clamped to [-127, 127] (so never -128).
 * K-type rows also keep bs[g], the int16 sum of the codes of each group of
 * 16 elements. This is a function of the row alone: the same on every
 * path (the SIMD quantizers use the same float operations) and whatever
 * M, tile or thread the row is in.
 *
 * Dots (the canonical order; integer parts are exact int32, so SIMD code
 * may sum them in any order; the float operations below are the only
 * rounding ones, and every path does exactly these):
 *
 *   Q8_0 (w = dw qw, qw int8, blocks of 32): 16 float lanes a[0..15] = +0;
 *     for each block b in order, for l = 0..7:
 *        p = sum_{t<4} qw[32b+4l+t] qx[32b+4l+t]            (int32)
 *        a[8 (b & 1) + l] = fmaf(dw_b * dx_b, (float)p, a[8 (b & 1) + l])
 *     then gemm.h's tree: a[j] += a[j+8] (j<8); a[j] += a[j+4] (j<4);
 *     a[j] += a[j+2] (j<2); y = a[0] + a[1].
 *
 *   K types (super-blocks of 256, slices s = 0..7 of 32 elements):
 *     8 float lanes a[0..7] = +0 and a correction c = +0; for each
 *     super-block b in order:
 *        S_l = sum_s sc(s, l) * sum_{t<4} u[32s+4l+t] qx[32s+4l+t]  (int32)
 *        a[l] = fmaf(d_b * dx_b, (float)S_l, a[l])          (l = 0..7)
 *        c    = fmaf(e_b * dx_b, (float)C_b, c)
 *     y = ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7)) - c, i.e. a[j] += a[j+4]
 *     (j<4); a[j] += a[j+2] (j<2); y = (a[0] + a[1]) - c. Where:
 *       Q4_K: u = the 4-bit code (0..15), sc(s, l) = the slice's 6-bit
 *             scale, e_b = dmin_b, C_b = sum_s m_s (bs[2s] + bs[2s+1]);
 *       Q6_K: u = the 6-bit code (0..63, not minus 32), sc(s, l) = the
 *             int8 scale of the 16-group 2s + (l >= 4), e_b = d_b,
 *             C_b = 32 sum_g sc_g bs[g] (the -32 offset, exactly).
 * Each output depends only on its weight row and its activation row.
 */
#ifndef KV_ENGINE_QDOT_H
#define KV_ENGINE_QDOT_H

#include <stddef.h>
#include <stdint.h>

/* Activation block length for weight dtype dt (32 or 256), 0 if the
 * integer path does not take dt. */
int ke_qdot_block(int dt);

/* Bytes of one quantized activation row of K elements (a multiple of 64):
 * int8 q[K], then f32 d[K / B], then (B = 256) int16 bs[K / 16]. */
size_t ke_qact_row_bytes(int block, int K);
/* Quantize x[0..K) (K a multiple of block) into row (64-byte aligned). */
void ke_qact_quant(int isa, int block, const float *x, int K, void *row);

/* out[i] = dot of weight row wrow (dtype dt, K elements) with activation
 * rows arow + i * astride, i < mr (mr <= KE_QDOT_MR), on path isa. */
#define KE_QDOT_MR 4
void ke_qdot_rows(int isa, int dt, const uint8_t *wrow, int K, const uint8_t *arow, size_t astride, int mr,
		  float *out);

#endif
