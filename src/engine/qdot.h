/*
 * qdot.h - integer dot products of ggml block weights with activations
 * quantized per row to int8 (the `--quant-act q8` mode, docs/engine.md).
 *
 * Activation rows. A row x[0..K) is cut into blocks of B elements, B = 32
 * for Q8_0 / Q4_0 / Q5_0 / Q4_1 / Q5_1 / MXFP4 weights and B = 256 for the K types
 * (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K); each block
 * is quantized on its own, from its own values only:
 *   amax = max |x[k]| over the block, found exactly on the bit patterns
 *          (bits & 0x7fffffff, an integer max: order-free);
 *   amax inf or NaN           -> d = NaN, all codes 0 (the outputs that
 *                                read the block become NaN, as in f32);
 *   amax < FLT_MIN (0 or subnormal) -> d = 0, all codes 0;
 *   otherwise d = amax / 127.0f, id = 127.0f / amax (two IEEE divisions)
 *          and q[k] = rint(x[k] * id) (one rounded product, then round to
 *          nearest even), clamped to [-127, 127] (so never -128).
 * Rows also keep integer sums of their codes: for 32-blocks ns[b] =
 * -128 sum q (int32), for 256-blocks bs[g] (int16, each group of 16) and
 * b2[s] = bs[2s] + bs[2s+1] (int16, each slice of 32). This is a function of the row alone: the same on every
 * path (the SIMD quantizers use the same float operations) and whatever
 * M, tile or thread the row is in.
 *
 * Dots (the canonical order). Integer parts are exact int32 (they cannot
 * overflow), so SIMD code may sum them in any order; the float operations
 * below are the only rounding ones, and every path does exactly these, per
 * output, in block order (dw, d, dmin: the weight block's f16 scales as
 * f32; dx: the activation block's scale):
 *
 *   Q8_0 (w = dw qw, blocks of 32):  acc = +0; for each block b:
 *        isum = sum_k qw[k] qx[k]                               (int32)
 *        acc  = fmaf(dw_b * dx_b, (float)isum, acc)
 *     y = acc. Q4_0 / Q5_0 (w = dw (q - 8 | 16)) the same with
 *     isum = sum_k (q[k] - 8 | 16) qx[k]. MXFP4 (w = d v, v the doubled
 *     E2M1 value of the 4-bit code, -12..12; dw = 2^(e - 128) from the
 *     E8M0 byte, exact) the same with isum = sum_k v[k] qx[k].
 *   Q4_1 / Q5_1 (w = dw q + m, codes 0..15 / 0..31, blocks of 32):
 *     acc = +0; for each block b, two steps in this order:
 *        isum = sum_k q[k] qx[k],  sumq = sum_k qx[k] = -ns[b] / 128 (int32)
 *        acc  = fmaf(dw_b * dx_b, (float)isum, acc)
 *        acc  = fmaf(m_b * dx_b, (float)sumq, acc)
 *     y = acc (one chain: the min's term cancels against its own block's
 *     codes term before the sum grows).
 *   Q4_K (w = d sc q - dmin m, super-blocks of 256, slices s of 32):
 *     acc = c = +0; for each super-block b:
 *        S = sum_s sc_s sum_{k in s} q[k] qx[k]                 (int32)
 *        C = sum_s m_s (bs[2s] + bs[2s+1])                      (int32)
 *        acc = fmaf(d_b * dx_b, (float)S, acc)
 *        c   = fmaf(dmin_b * dx_b, (float)C, c)
 *     y = acc - c. Q5_K (codes 0..31, the 5th bit from qh) exactly the same.
 *   Q2_K (w = d sc_g q - dmin m_g, 4-bit sc and m, codes 0..3, groups g
 *     of 16): the same two chains with
 *        S = sum_g sc_g sum_{k in g} q[k] qx[k],  C = sum_g m_g bs[g].
 *   Q6_K (w = d sc_g (q - 32), groups g of 16):  acc = +0; for each b:
 *        S = sum_g sc_g (sum_{k in g} q[k] qx[k] - 32 bs[g])    (int32)
 *        acc = fmaf(d_b * dx_b, (float)S, acc)
 *     y = acc. Q3_K (w = d sc_g (q - 4), sc_g = 6-bit scale - 32, q = 2 low
 *     bits | hmask bit << 2 in 0..7) the same with -4 bs[g] for -32 bs[g].
 * (float)i rounds to nearest even, as cvtdq2ps does.
 * Each output depends only on its weight row and its activation row.
 */
#ifndef KV_ENGINE_QDOT_H
#define KV_ENGINE_QDOT_H

/* The integer path's definition, named in the cache namespace (qa=...):
 * bump it whenever some matrix's numbers under --quant-act q8 change.
 * "q8" until 2026-12-01; "q8.2" from the types Q4_1, Q5_1, Q2_K, Q3_K,
 * Q5_K (a Q4_K_M file's Q5_1 matrices moved to the integer path, under
 * the same tag, which would have served old entries as valid); "q8.3"
 * from MXFP4 (GPT-OSS's experts moved from the f32 path to this one). */
#define KE_QDOT_VERSION "q8.3"

#include <stddef.h>
#include <stdint.h>

/* Activation block length for weight dtype dt (32 or 256), 0 if the
 * integer path does not take dt. */
int ke_qdot_block(int dt);

/* Bytes of one quantized activation row of K elements (a multiple of 64):
 * int8 q[K], f32 d[K / B], then int32 ns[K / 32] (B = 32) or int16
 * bs[K / 16] and b2[K / 32] (B = 256). */
size_t ke_qact_row_bytes(int block, int K);
/* Quantize x[0..K) (K a multiple of block) into row (64-byte aligned). */
void ke_qact_quant(int isa, int block, const float *x, int K, void *row);

/* y[i * ldy + n] (= or += with accum) for the weight rows n in [n0, n1)
 * of w (row n at w + n * wstride, dtype dt, K elements) and the m
 * activation rows a + i * astride, on path isa. Single-threaded. */
void ke_qdot_gemm(int isa, int dt, const uint8_t *w, size_t wstride, int K, const uint8_t *a, size_t astride, int m,
		  float *y, size_t ldy, int accum, int n0, int n1);
/* The definition above, scalar, one output (tests). */
float ke_qdot_ref(int dt, const uint8_t *wrow, int K, const uint8_t *arow);

#endif
