/*
 * dtype.c - see dtype.h: the table of names and sizes, and the exact
 * half-precision conversions (bf16 rounds to nearest even, NaN kept).
 */
#include "model/dtype.h"

#include <string.h>

/* Name, element size (0 for block types), and for block types the
 * elements and bytes of one block (ggml's sizes, model/quant.h). */
static const struct {
	const char *name;
	size_t size;
	int qk;
	size_t block;
} g_dt[KV_DT__COUNT] = {
	[KV_DT_F32] = {"F32", 4},	  [KV_DT_F16] = {"F16", 2},	     [KV_DT_BF16] = {"BF16", 2},
	[KV_DT_F64] = {"F64", 8},	  [KV_DT_I8] = {"I8", 1},	     [KV_DT_U8] = {"U8", 1},
	[KV_DT_I16] = {"I16", 2},	  [KV_DT_U16] = {"U16", 2},	     [KV_DT_I32] = {"I32", 4},
	[KV_DT_U32] = {"U32", 4},	  [KV_DT_I64] = {"I64", 8},	     [KV_DT_U64] = {"U64", 8},
	[KV_DT_BOOL] = {"BOOL", 1},	  [KV_DT_F8_E4M3] = {"F8_E4M3", 1}, [KV_DT_F8_E5M2] = {"F8_E5M2", 1},
	[KV_DT_Q4_0] = {"Q4_0", 0, 32, 18},   [KV_DT_Q4_1] = {"Q4_1", 0, 32, 20},   [KV_DT_Q5_0] = {"Q5_0", 0, 32, 22},
	[KV_DT_Q5_1] = {"Q5_1", 0, 32, 24},   [KV_DT_Q8_0] = {"Q8_0", 0, 32, 34},   [KV_DT_Q2_K] = {"Q2_K", 0, 256, 84},
	[KV_DT_Q3_K] = {"Q3_K", 0, 256, 110}, [KV_DT_Q4_K] = {"Q4_K", 0, 256, 144}, [KV_DT_Q5_K] = {"Q5_K", 0, 256, 176},
	[KV_DT_Q6_K] = {"Q6_K", 0, 256, 210}, [KV_DT_Q8_K] = {"Q8_K", 0, 256, 292},
	[KV_DT_MXFP4] = {"MXFP4", 0, 32, 17},
};

static int known(int dt)
{
	return dt >= 0 && dt < KV_DT__COUNT;
}

size_t kv_dtype_size(int dt)
{
	return known(dt) ? g_dt[dt].size : 0;
}

const char *kv_dtype_name(int dt)
{
	return known(dt) ? g_dt[dt].name : NULL;
}

int kv_dtype_block_elems(int dt)
{
	if (!known(dt))
		return 0;
	return g_dt[dt].qk ? g_dt[dt].qk : g_dt[dt].size ? 1 : 0;
}

size_t kv_dtype_block_bytes(int dt)
{
	if (!known(dt))
		return 0;
	return g_dt[dt].qk ? g_dt[dt].block : g_dt[dt].size;
}

int kv_dtype_is_quant(int dt)
{
	return (dt >= KV_DT_Q4_0 && dt <= KV_DT_Q8_K) || dt == KV_DT_MXFP4;
}

uint64_t kv_dtype_row_bytes(int dt, uint64_t n)
{
	int qk = kv_dtype_block_elems(dt);
	if (qk <= 0 || n % (uint64_t)qk)
		return 0;
	return n / (uint64_t)qk * kv_dtype_block_bytes(dt);
}

int kv_dtype_parse(const char *s)
{
	for (int i = 0; s && i <= KV_DT_F8_E5M2; i++)
		if (!strcmp(s, g_dt[i].name))
			return i;
	return -1;
}

/* --- half-precision conversions ----------------------------------------- */

float kv_bf16_to_f32(uint16_t h)
{
	uint32_t x = (uint32_t)h << 16;
	float f;
	memcpy(&f, &x, 4);
	return f;
}

uint16_t kv_f32_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign, force quiet */
		return (uint16_t)((x >> 16) | 0x40);
	x += 0x7fffu + ((x >> 16) & 1);
	return (uint16_t)(x >> 16);
}

float kv_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, x;
	float f;
	if (e == 0) {
		f = (float)m * 0x1p-24f; /* zero or subnormal, exact */
		return sign ? -f : f;
	}
	if (e == 31)
		x = sign | 0x7f800000u | (m << 13);
	else
		x = sign | ((e + 112) << 23) | (m << 13);
	memcpy(&f, &x, 4);
	return f;
}

uint16_t kv_f32_to_f16(float f)
{
	uint32_t x, sign, e, m, r, rem;
	int32_t ne;
	memcpy(&x, &f, 4);
	sign = (x >> 16) & 0x8000;
	e = (x >> 23) & 0xff;
	m = x & 0x7fffff;
	if (e == 0xff)
		return (uint16_t)(sign | 0x7c00 | (m ? 0x200 | (m >> 13) : 0));
	ne = (int32_t)e - 112;
	if (ne >= 0x1f)
		return (uint16_t)(sign | 0x7c00);
	if (ne <= 0) {
		/* Subnormal (or zero) in f16: shift the 24-bit significand. */
		if (ne < -10)
			return (uint16_t)sign;
		uint32_t shift = (uint32_t)(14 - ne), half = 1u << (shift - 1);
		m |= 0x800000;
		r = m >> shift;
		rem = m & ((1u << shift) - 1);
		if (rem > half || (rem == half && (r & 1)))
			r++;
		return (uint16_t)(sign | r);
	}
	r = ((uint32_t)ne << 10) | (m >> 13);
	rem = m & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (r & 1)))
		r++; /* a carry into the exponent is the right answer, up to inf */
	return (uint16_t)(sign | r);
}
