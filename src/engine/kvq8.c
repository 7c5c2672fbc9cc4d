/*
 * kvq8.c - see kvq8.h.
 *
 * Plain C on purpose: a K/V row is quantized once, when the forward pass
 * writes it (n_kv_heads x head_dim x 2 values per token and attention
 * layer, nothing next to the products and attention that token costs),
 * and one implementation means the stored bytes cannot depend on the CPU
 * path. The baseline x86-64 target fuses nothing, and the divisions and
 * rint are correctly rounded, so the bytes are the same on every machine.
 */
#include "engine/kvq8.h"
#include "model/safetensors.h"

#include <math.h>
#include <string.h>

#define HALF_MAX_BITS 0x7bffu /* 65504 */
#define HALF_QNAN 0x7e00u

static void quant_block(uint8_t *b, const float *x)
{
	float amax = 0.0f;
	int finite = 1;
	for (int j = 0; j < KE_KVQ8_BLOCK; j++) {
		float a = fabsf(x[j]);
		if (!isfinite(a))
			finite = 0;
		else if (a > amax)
			amax = a;
	}
	uint16_t h;
	if (!finite) {
		h = HALF_QNAN;
	} else {
		h = kv_f32_to_f16(amax / 127.0f);
		if (h == 0x7c00u) /* amax / 127 past the half range */
			h = HALF_MAX_BITS;
	}
	b[0] = (uint8_t)(h & 0xff);
	b[1] = (uint8_t)(h >> 8);
	float d = ke_kvq8_scale(b);
	for (int j = 0; j < KE_KVQ8_BLOCK; j++) {
		int q = 0;
		if (finite && d != 0.0f) {
			float r = rintf(x[j] / d);
			q = r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r;
		}
		b[2 + j] = (uint8_t)(int8_t)q;
	}
}

void ke_kvq8_quant_row(void *dst, const float *x, int n)
{
	uint8_t *b = dst;
	for (int i = 0; i < n; i += KE_KVQ8_BLOCK, b += KE_KVQ8_BLOCK_BYTES)
		quant_block(b, x + i);
}

void ke_kvq8_dequant_row(float *y, const void *row, int n)
{
	const uint8_t *b = row;
	for (int i = 0; i < n; i += KE_KVQ8_BLOCK, b += KE_KVQ8_BLOCK_BYTES) {
		float d = ke_kvq8_scale(b);
		for (int j = 0; j < KE_KVQ8_BLOCK; j++)
			y[i + j] = (float)(int8_t)b[2 + j] * d;
	}
}
