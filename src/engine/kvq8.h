/*
 * kvq8.h - the 8-bit KV row format (--kv-dtype q8_0): how a K or V row is
 * quantized once, when it is written, and what value each element has
 * when attention reads it.
 *
 * A row of head_dim elements (a multiple of 32) is head_dim / 32 blocks of
 * ggml's Q8_0 layout, 34 bytes each, one after another:
 *   bytes 0-1   d, an IEEE half (little endian): the block's scale
 *   bytes 2-33  q[0..31], int8 codes in [-127, 127]
 * so row_bytes = head_dim / 32 x 34 (0.53x a bf16 row). Element j of the
 * block has the value (float)q[j] x f32(d): exact in f32 (an 11-bit
 * significand times a 7-bit integer fits in 24 bits), so "dequantizing" is
 * not a rounding step and every reader of the row -- each CPU path of
 * attn.c, in registers or through a small f32 buffer -- sees the same
 * floats, and attention over a q8 row is attention over f32 rows holding
 * these values, bit for bit (tests/unit/test_kernels.c checks both).
 *
 * Quantization of a block x[0..31] (plain C, one path, no fused
 * operations: the bytes do not depend on the CPU):
 *   amax = max |x_j|; d = f16(amax / 127) (round to nearest even; an amax
 *   past the half range saturates d at 65504); q_j = rint(x_j / f32(d))
 *   clamped to [-127, 127], or 0 when d is 0. Dividing by the scale that
 *   is stored (ggml multiplies by 1 / (amax / 127) before d is rounded to
 *   a half) makes q_j x d the nearest code to x_j for the d the reader
 *   will use. A block holding an inf or a NaN gets d = NaN and q = 0: all
 *   32 values read back as NaN, as the f32 or bf16 row would have carried
 *   a non-finite value into attention.
 */
#ifndef KV_ENGINE_KVQ8_H
#define KV_ENGINE_KVQ8_H

#include <stddef.h>
#include <stdint.h>

#define KE_KVQ8_BLOCK 32       /* elements per block */
#define KE_KVQ8_BLOCK_BYTES 34 /* 2 (half scale) + 32 (codes) */

/* Bytes of a row of n elements (n a multiple of KE_KVQ8_BLOCK). */
static inline size_t ke_kvq8_row_bytes(int n)
{
	return (size_t)(n / KE_KVQ8_BLOCK) * KE_KVQ8_BLOCK_BYTES;
}

/* Quantize n floats (a multiple of 32) into dst (ke_kvq8_row_bytes(n)
 * bytes, any alignment). */
void ke_kvq8_quant_row(void *dst, const float *x, int n);

/* The f32 scale of the block at b: the half widened exactly, a NaN made
 * quiet as F16C's vcvtph2ps does (the AVX-512 kernels use it; the other
 * readers call this), so every path reads the same float. Inline: the
 * AVX2 kernels call it once per block in their loops. */
static inline float ke_kvq8_scale(const void *b)
{
	const uint8_t *p = (const uint8_t *)b;
	uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
	uint32_t s = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
	float f;
	if (e == 0) { /* zero or subnormal: m x 2^-24, exact */
		f = (float)m * 0x1p-24f;
		return s ? -f : f;
	}
	if (e == 31)
		x = s | 0x7f800000u | m << 13 | (m ? 0x00400000u : 0);
	else
		x = s | (e + 112) << 23 | m << 13;
	__builtin_memcpy(&f, &x, 4);
	return f;
}

/* The exact values of a row: y[i] = q[i] x scale, n a multiple of 32. */
void ke_kvq8_dequant_row(float *y, const void *row, int n);

#endif
