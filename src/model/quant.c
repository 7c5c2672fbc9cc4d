/*
 * quant.c - see quant.h. Block formats of ggml, scalar code only: the
 * engine's quantized products dequantize rows with these functions and
 * then run the f32 kernels (engine/qgemm.c), so this file is the one
 * place that decides what a quantized weight's value is.
 *
 * The dequantizers mirror ggml's reference loops operation by operation:
 * products are formed in the order ggml writes them (d * sc * q is
 * (d * sc) * q) and every `a * b - c` is a product rounded to float and
 * then a subtraction (this file is compiled without FMA contraction:
 * no -mfma, and the explicit volatile-free temporaries below keep the
 * two roundings even if a compiler contracted).
 */
#include "model/quant.h"
#include "model/dtype.h"
#include "base/err.h"

#include <math.h>
#include <string.h>

#pragma GCC optimize("fp-contract=off")

/* --- type tables ----------------------------------------------------------- */

static const char *const g_ggml_names[KQ_GGML__COUNT] = {
	[0] = "F32", [1] = "F16", [2] = "Q4_0", [3] = "Q4_1", [6] = "Q5_0", [7] = "Q5_1", [8] = "Q8_0",
	[9] = "Q8_1", [10] = "Q2_K", [11] = "Q3_K", [12] = "Q4_K", [13] = "Q5_K", [14] = "Q6_K",
	[15] = "Q8_K", [16] = "IQ2_XXS", [17] = "IQ2_XS", [18] = "IQ3_XXS", [19] = "IQ1_S", [20] = "IQ4_NL",
	[21] = "IQ3_S", [22] = "IQ2_S", [23] = "IQ4_XS", [24] = "I8", [25] = "I16", [26] = "I32",
	[27] = "I64", [28] = "F64", [29] = "IQ1_M", [30] = "BF16", [34] = "TQ1_0", [35] = "TQ2_0",
	[39] = "MXFP4",
};

/* ggml type <-> kv_dtype, for the types kvkeep runs (model/dtype.c has
 * their sizes). */
static const struct {
	int ggml, dtype;
} g_map[] = {
	{KQ_GGML_F32, KV_DT_F32},   {KQ_GGML_F16, KV_DT_F16},   {KQ_GGML_BF16, KV_DT_BF16}, {KQ_GGML_F64, KV_DT_F64},
	{KQ_GGML_I8, KV_DT_I8},     {KQ_GGML_I16, KV_DT_I16},   {KQ_GGML_I32, KV_DT_I32},   {KQ_GGML_I64, KV_DT_I64},
	{KQ_GGML_Q4_0, KV_DT_Q4_0}, {KQ_GGML_Q4_1, KV_DT_Q4_1}, {KQ_GGML_Q5_0, KV_DT_Q5_0}, {KQ_GGML_Q5_1, KV_DT_Q5_1},
	{KQ_GGML_Q8_0, KV_DT_Q8_0}, {KQ_GGML_Q2_K, KV_DT_Q2_K}, {KQ_GGML_Q3_K, KV_DT_Q3_K}, {KQ_GGML_Q4_K, KV_DT_Q4_K},
	{KQ_GGML_Q5_K, KV_DT_Q5_K}, {KQ_GGML_Q6_K, KV_DT_Q6_K}, {KQ_GGML_Q8_K, KV_DT_Q8_K},
	{KQ_GGML_MXFP4, KV_DT_MXFP4},
};
#define N_MAP (sizeof g_map / sizeof g_map[0])

int kq_dtype_from_ggml(int ggml_type)
{
	for (size_t i = 0; i < N_MAP; i++)
		if (g_map[i].ggml == ggml_type)
			return g_map[i].dtype;
	return -1;
}

int kq_ggml_from_dtype(int dtype)
{
	for (size_t i = 0; i < N_MAP; i++)
		if (g_map[i].dtype == dtype)
			return g_map[i].ggml;
	return -1;
}

const char *kq_ggml_name(int t)
{
	return t >= 0 && t < KQ_GGML__COUNT ? g_ggml_names[t] : NULL;
}

/* --- helpers --------------------------------------------------------------- */

static inline float h2f(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return kv_f16_to_f32(h);
}

static inline void f2h(uint8_t *p, float f)
{
	uint16_t h = kv_f32_to_f16(f);
	memcpy(p, &h, 2);
}

/* --- dequantization (one block each) ---------------------------------------- */

static void dq_q4_0(const uint8_t *b, float *y)
{
	const float d = h2f(b);
	for (int j = 0; j < 16; j++) {
		const int x0 = (b[2 + j] & 0x0F) - 8, x1 = (b[2 + j] >> 4) - 8;
		y[j] = (float)x0 * d;
		y[j + 16] = (float)x1 * d;
	}
}

static void dq_q4_1(const uint8_t *b, float *y)
{
	const float d = h2f(b), m = h2f(b + 2);
	for (int j = 0; j < 16; j++) {
		const int x0 = b[4 + j] & 0x0F, x1 = b[4 + j] >> 4;
		float p0 = (float)x0 * d, p1 = (float)x1 * d;
		y[j] = p0 + m;
		y[j + 16] = p1 + m;
	}
}

static void dq_q5_0(const uint8_t *b, float *y)
{
	const float d = h2f(b);
	uint32_t qh;
	memcpy(&qh, b + 2, 4);
	for (int j = 0; j < 16; j++) {
		const uint8_t xh0 = (uint8_t)(((qh >> (j + 0)) << 4) & 0x10);
		const uint8_t xh1 = (uint8_t)(((qh >> (j + 12))) & 0x10);
		const int x0 = ((b[6 + j] & 0x0F) | xh0) - 16, x1 = ((b[6 + j] >> 4) | xh1) - 16;
		y[j] = (float)x0 * d;
		y[j + 16] = (float)x1 * d;
	}
}

static void dq_q5_1(const uint8_t *b, float *y)
{
	const float d = h2f(b), m = h2f(b + 2);
	uint32_t qh;
	memcpy(&qh, b + 4, 4);
	for (int j = 0; j < 16; j++) {
		const uint8_t xh0 = (uint8_t)(((qh >> (j + 0)) << 4) & 0x10);
		const uint8_t xh1 = (uint8_t)(((qh >> (j + 12))) & 0x10);
		const int x0 = (b[8 + j] & 0x0F) | xh0, x1 = (b[8 + j] >> 4) | xh1;
		float p0 = (float)x0 * d, p1 = (float)x1 * d;
		y[j] = p0 + m;
		y[j + 16] = p1 + m;
	}
}

static void dq_q8_0(const uint8_t *b, float *y)
{
	const float d = h2f(b);
	for (int j = 0; j < 32; j++)
		y[j] = (float)(int8_t)b[2 + j] * d;
}

static void dq_q2_k(const uint8_t *b, float *y)
{
	const uint8_t *sc = b, *q = b + 16;
	const float d = h2f(b + 80), min = h2f(b + 82);
	int is = 0;
	for (int n = 0; n < KQ_QK_K; n += 128) {
		int shift = 0;
		for (int j = 0; j < 4; ++j) {
			uint8_t s = sc[is++];
			float dl = d * (float)(s & 0xF), ml = min * (float)(s >> 4);
			for (int l = 0; l < 16; ++l) {
				float p = dl * (float)(int8_t)((q[l] >> shift) & 3);
				*y++ = p - ml;
			}
			s = sc[is++];
			dl = d * (float)(s & 0xF);
			ml = min * (float)(s >> 4);
			for (int l = 0; l < 16; ++l) {
				float p = dl * (float)(int8_t)((q[l + 16] >> shift) & 3);
				*y++ = p - ml;
			}
			shift += 2;
		}
		q += 32;
	}
}

static void dq_q3_k(const uint8_t *b, float *y)
{
	const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
	const uint8_t *hm = b, *q = b + 32;
	const float d_all = h2f(b + 108);
	uint32_t aux[4];
	uint8_t m = 1;
	memcpy(aux, b + 96, 12);
	uint32_t tmp = aux[2];
	aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
	aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
	aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
	aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
	int8_t scales[16];
	memcpy(scales, aux, 16);
	int is = 0;
	for (int n = 0; n < KQ_QK_K; n += 128) {
		int shift = 0;
		for (int j = 0; j < 4; ++j) {
			float dl = d_all * (float)(scales[is++] - 32);
			for (int l = 0; l < 16; ++l)
				*y++ = dl * (float)((int8_t)((q[l + 0] >> shift) & 3) - ((hm[l + 0] & m) ? 0 : 4));
			dl = d_all * (float)(scales[is++] - 32);
			for (int l = 0; l < 16; ++l)
				*y++ = dl * (float)((int8_t)((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
			shift += 2;
			m <<= 1;
		}
		q += 32;
	}
}

static void dq_q4_k(const uint8_t *b, float *y)
{
	const float d = h2f(b), min = h2f(b + 2);
	const uint8_t *scales = b + 4, *q = b + 16;
	int is = 0;
	uint8_t sc, m;
	for (int j = 0; j < KQ_QK_K; j += 64) {
		kq_scale_min_k4(scales, is + 0, &sc, &m);
		const float d1 = d * (float)sc, m1 = min * (float)m;
		kq_scale_min_k4(scales, is + 1, &sc, &m);
		const float d2 = d * (float)sc, m2 = min * (float)m;
		for (int l = 0; l < 32; ++l) {
			float p = d1 * (float)(q[l] & 0xF);
			*y++ = p - m1;
		}
		for (int l = 0; l < 32; ++l) {
			float p = d2 * (float)(q[l] >> 4);
			*y++ = p - m2;
		}
		q += 32;
		is += 2;
	}
}

static void dq_q5_k(const uint8_t *b, float *y)
{
	const float d = h2f(b), min = h2f(b + 2);
	const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
	int is = 0;
	uint8_t sc, m, u1 = 1, u2 = 2;
	for (int j = 0; j < KQ_QK_K; j += 64) {
		kq_scale_min_k4(scales, is + 0, &sc, &m);
		const float d1 = d * (float)sc, m1 = min * (float)m;
		kq_scale_min_k4(scales, is + 1, &sc, &m);
		const float d2 = d * (float)sc, m2 = min * (float)m;
		for (int l = 0; l < 32; ++l) {
			float p = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0));
			*y++ = p - m1;
		}
		for (int l = 0; l < 32; ++l) {
			float p = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0));
			*y++ = p - m2;
		}
		ql += 32;
		is += 2;
		u1 = (uint8_t)(u1 << 2);
		u2 = (uint8_t)(u2 << 2);
	}
}

static void dq_q6_k(const uint8_t *b, float *y)
{
	const uint8_t *ql = b, *qh = b + 128;
	const int8_t *sc = (const int8_t *)(b + 192);
	const float d = h2f(b + 208);
	for (int n = 0; n < KQ_QK_K; n += 128) {
		for (int l = 0; l < 32; ++l) {
			int is = l / 16;
			const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
			const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
			const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
			const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
			y[l + 0] = d * (float)sc[is + 0] * (float)q1;
			y[l + 32] = d * (float)sc[is + 2] * (float)q2;
			y[l + 64] = d * (float)sc[is + 4] * (float)q3;
			y[l + 96] = d * (float)sc[is + 6] * (float)q4;
		}
		y += 128;
		ql += 64;
		qh += 32;
		sc += 8;
	}
}

static void dq_q8_k(const uint8_t *b, float *y)
{
	float d;
	memcpy(&d, b, 4);
	for (int j = 0; j < KQ_QK_K; j++)
		y[j] = d * (float)(int8_t)b[4 + j];
}

/* ggml's dequantize_row_mxfp4: the doubled E2M1 value times 2^(e - 128)
 * (GGML_E8M0_TO_FP32_HALF, built from the bits: exact for every e) */
const int8_t kq_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static void dq_mxfp4(const uint8_t *b, float *y)
{
	const float d = kq_e8m0_half(b[0]);
	for (int j = 0; j < 16; j++) {
		y[j] = (float)kq_mxfp4_values[b[1 + j] & 15] * d;
		y[j + 16] = (float)kq_mxfp4_values[b[1 + j] >> 4] * d;
	}
}

void kq_mxfp4_from_hf(const uint8_t *blocks, const uint8_t *scales, uint64_t n_blocks, uint8_t *dst)
{
	for (uint64_t i = 0; i < n_blocks; i++) {
		const uint8_t *q = blocks + i * 16;
		uint8_t *o = dst + i * 17;
		uint8_t c[32];
		for (int j = 0; j < 16; j++) {
			c[2 * j] = q[j] & 15;
			c[2 * j + 1] = q[j] >> 4;
		}
		o[0] = scales[i];
		for (int j = 0; j < 16; j++)
			o[1 + j] = (uint8_t)(c[j] | c[j + 16] << 4);
	}
}

typedef void (*dq_fn)(const uint8_t *, float *);

static dq_fn dq_for(int dt)
{
	switch (dt) {
	case KV_DT_Q4_0: return dq_q4_0;
	case KV_DT_Q4_1: return dq_q4_1;
	case KV_DT_Q5_0: return dq_q5_0;
	case KV_DT_Q5_1: return dq_q5_1;
	case KV_DT_Q8_0: return dq_q8_0;
	case KV_DT_Q2_K: return dq_q2_k;
	case KV_DT_Q3_K: return dq_q3_k;
	case KV_DT_Q4_K: return dq_q4_k;
	case KV_DT_Q5_K: return dq_q5_k;
	case KV_DT_Q6_K: return dq_q6_k;
	case KV_DT_Q8_K: return dq_q8_k;
	case KV_DT_MXFP4: return dq_mxfp4;
	}
	return NULL;
}

int kq_dequant_row(int dt, const void *src, float *dst, size_t n)
{
	const uint8_t *p = src;
	if (dt == KV_DT_F32) {
		memcpy(dst, src, n * 4);
		return KV_OK;
	}
	if (dt == KV_DT_F16 || dt == KV_DT_BF16) {
		for (size_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, p + 2 * i, 2);
			dst[i] = dt == KV_DT_F16 ? kv_f16_to_f32(h) : kv_bf16_to_f32(h);
		}
		return KV_OK;
	}
	dq_fn f = dq_for(dt);
	int qk = kv_dtype_block_elems(dt);
	size_t bb = kv_dtype_block_bytes(dt);
	if (!f || n % (size_t)qk)
		return kv_fail(KV_ERR_INVALID, "dequantize: %zu elements of %s", n,
			       kv_dtype_name(dt) ? kv_dtype_name(dt) : "?");
	for (size_t i = 0; i < n / (size_t)qk; i++)
		f(p + i * bb, dst + i * (size_t)qk);
	return KV_OK;
}

/* --- quantization ----------------------------------------------------------- */

static inline int nearest_int(float f)
{
	return (int)lrintf(f);
}

static void q_q8_0(const float *x, uint8_t *b)
{
	float amax = 0.0f;
	for (int j = 0; j < 32; j++)
		amax = fmaxf(amax, fabsf(x[j]));
	const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
	f2h(b, d);
	for (int j = 0; j < 32; j++)
		b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

/* The value of largest magnitude (sign kept), ggml's Q4_0/Q5_0 anchor. */
static float signed_max(const float *x, int n)
{
	float amax = 0.0f, max = 0.0f;
	for (int j = 0; j < n; j++)
		if (fabsf(x[j]) > amax) {
			amax = fabsf(x[j]);
			max = x[j];
		}
	return max;
}

static void q_q4_0(const float *x, uint8_t *b)
{
	const float d = signed_max(x, 32) / -8.0f, id = d ? 1.0f / d : 0.0f;
	f2h(b, d);
	for (int j = 0; j < 16; j++) {
		int x0 = (int)(x[j] * id + 8.5f), x1 = (int)(x[j + 16] * id + 8.5f);
		x0 = x0 < 0 ? 0 : x0 > 15 ? 15 : x0;
		x1 = x1 < 0 ? 0 : x1 > 15 ? 15 : x1;
		b[2 + j] = (uint8_t)(x0 | (x1 << 4));
	}
}

static void q_q4_1(const float *x, uint8_t *b)
{
	float mn = x[0], mx = x[0];
	for (int j = 1; j < 32; j++) {
		mn = fminf(mn, x[j]);
		mx = fmaxf(mx, x[j]);
	}
	const float d = (mx - mn) / 15.0f, id = d ? 1.0f / d : 0.0f;
	f2h(b, d);
	f2h(b + 2, mn);
	for (int j = 0; j < 16; j++) {
		int x0 = (int)((x[j] - mn) * id + 0.5f), x1 = (int)((x[j + 16] - mn) * id + 0.5f);
		x0 = x0 < 0 ? 0 : x0 > 15 ? 15 : x0;
		x1 = x1 < 0 ? 0 : x1 > 15 ? 15 : x1;
		b[4 + j] = (uint8_t)(x0 | (x1 << 4));
	}
}

static void q_q5_0(const float *x, uint8_t *b)
{
	const float d = signed_max(x, 32) / -16.0f, id = d ? 1.0f / d : 0.0f;
	uint32_t qh = 0;
	f2h(b, d);
	for (int j = 0; j < 16; j++) {
		int x0 = (int)(x[j] * id + 16.5f), x1 = (int)(x[j + 16] * id + 16.5f);
		x0 = x0 < 0 ? 0 : x0 > 31 ? 31 : x0;
		x1 = x1 < 0 ? 0 : x1 > 31 ? 31 : x1;
		b[6 + j] = (uint8_t)((x0 & 15) | ((x1 & 15) << 4));
		qh |= ((uint32_t)(x0 >> 4) & 1u) << j;
		qh |= ((uint32_t)(x1 >> 4) & 1u) << (j + 16);
	}
	memcpy(b + 2, &qh, 4);
}

static void q_q5_1(const float *x, uint8_t *b)
{
	float mn = x[0], mx = x[0];
	uint32_t qh = 0;
	for (int j = 1; j < 32; j++) {
		mn = fminf(mn, x[j]);
		mx = fmaxf(mx, x[j]);
	}
	const float d = (mx - mn) / 31.0f, id = d ? 1.0f / d : 0.0f;
	f2h(b, d);
	f2h(b + 2, mn);
	for (int j = 0; j < 16; j++) {
		int x0 = (int)((x[j] - mn) * id + 0.5f), x1 = (int)((x[j + 16] - mn) * id + 0.5f);
		x0 = x0 < 0 ? 0 : x0 > 31 ? 31 : x0;
		x1 = x1 < 0 ? 0 : x1 > 31 ? 31 : x1;
		b[8 + j] = (uint8_t)((x0 & 15) | ((x1 & 15) << 4));
		qh |= ((uint32_t)(x0 >> 4) & 1u) << j;
		qh |= ((uint32_t)(x1 >> 4) & 1u) << (j + 16);
	}
	memcpy(b + 4, &qh, 4);
}

/*
 * K types: the search of ggml's reference quantizers (k-quants of
 * llama.cpp, "make_qkx2_quants" / "make_qx_quants"): for each sub-block,
 * try a few grid scales around max-min / nmax, fit scale and min by
 * weighted least squares on the chosen levels and keep the best; then the
 * sub-block scales (and mins) are quantized to 6 or 8 bits against the
 * largest, and the levels are chosen again against the stored scales.
 * Weights favour large values (ggml's choice). Written from the published
 * algorithm; tests/peer compares the bytes with ggml's.
 */
#define GROUP_MAX_EPS 1e-15f

/* use_mad: the error is weighted |diff| instead of diff^2 (Q2_K's choice) */
static float fit_affine(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min, uint8_t *Laux,
			float rmin, float rdelta, int nstep, int use_mad)
{
	float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
	for (int i = 1; i < n; ++i) {
		if (x[i] < min)
			min = x[i];
		if (x[i] > max)
			max = x[i];
		float ww = w[i];
		sum_w += ww;
		sum_x += ww * x[i];
	}
	if (min > 0)
		min = 0;
	if (max == min) {
		memset(L, 0, (size_t)n);
		*the_min = -min;
		return 0.f;
	}
	float iscale = (float)nmax / (max - min), scale = 1 / iscale, best_mad = 0;
	for (int i = 0; i < n; ++i) {
		int l = nearest_int(iscale * (x[i] - min));
		L[i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
		float diff = scale * (float)L[i] + min - x[i];
		diff = use_mad ? fabsf(diff) : diff * diff;
		best_mad += w[i] * diff;
	}
	for (int is = 0; is <= nstep; ++is) {
		iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
		float sum_l = 0, sum_l2 = 0, sum_xl = 0;
		for (int i = 0; i < n; ++i) {
			int l = nearest_int(iscale * (x[i] - min));
			l = l < 0 ? 0 : l > nmax ? nmax : l;
			Laux[i] = (uint8_t)l;
			float ww = w[i];
			sum_l += ww * (float)l;
			sum_l2 += ww * (float)l * (float)l;
			sum_xl += ww * (float)l * x[i];
		}
		float D = sum_w * sum_l2 - sum_l * sum_l;
		if (D > 0) {
			float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
			float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
			if (this_min > 0) {
				this_min = 0;
				this_scale = sum_xl / sum_l2;
			}
			float mad = 0;
			for (int i = 0; i < n; ++i) {
				float diff = this_scale * (float)Laux[i] + this_min - x[i];
				diff = use_mad ? fabsf(diff) : diff * diff;
				mad += w[i] * diff;
			}
			if (mad < best_mad) {
				memcpy(L, Laux, (size_t)n);
				best_mad = mad;
				scale = this_scale;
				min = this_min;
			}
		}
	}
	*the_min = -min;
	return scale;
}

static void q_k_affine(const float *x, uint8_t *b, int nmax, uint8_t *L)
{
	float mins[8], scales[8], weights[32], max_scale = 0, max_min = 0;
	uint8_t Laux[32];
	for (int j = 0; j < 8; j++) {
		float sum_x2 = 0;
		for (int l = 0; l < 32; l++)
			sum_x2 += x[32 * j + l] * x[32 * j + l];
		float av_x = sqrtf(sum_x2 / 32);
		for (int l = 0; l < 32; l++)
			weights[l] = av_x + fabsf(x[32 * j + l]);
		scales[j] = nmax == 15 ? fit_affine(32, 15, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -1.f, 0.1f, 20, 0)
				       : fit_affine(32, 31, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -0.5f, 0.1f, 15, 0);
		if (scales[j] > max_scale)
			max_scale = scales[j];
		if (mins[j] > max_min)
			max_min = mins[j];
	}
	const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
	uint8_t *sc = b + 4;
	memset(sc, 0, 12);
	for (int j = 0; j < 8; ++j) {
		int ls = nearest_int(inv_scale * scales[j]), lm = nearest_int(inv_min * mins[j]);
		ls = ls > 63 ? 63 : ls;
		lm = lm > 63 ? 63 : lm;
		if (j < 4) {
			sc[j] = (uint8_t)ls;
			sc[j + 4] = (uint8_t)lm;
		} else {
			sc[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
			sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
			sc[j] |= (uint8_t)((lm >> 4) << 6);
		}
	}
	f2h(b, max_scale / 63.f);
	f2h(b + 2, max_min / 63.f);
	const float dd = h2f(b), dm0 = h2f(b + 2);
	for (int j = 0; j < 8; ++j) {
		uint8_t s6, m6;
		kq_scale_min_k4(sc, j, &s6, &m6);
		const float d = dd * (float)s6;
		if (!d)
			continue;
		const float dm = dm0 * (float)m6;
		for (int ii = 0; ii < 32; ++ii) {
			int l = nearest_int((x[32 * j + ii] + dm) / d);
			L[32 * j + ii] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
		}
	}
}

static void q_q4_k(const float *x, uint8_t *b)
{
	uint8_t L[256];
	q_k_affine(x, b, 15, L);
	uint8_t *q = b + 16;
	for (int j = 0; j < KQ_QK_K; j += 64) {
		for (int l = 0; l < 32; ++l)
			q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
		q += 32;
	}
}

static void q_q5_k(const float *x, uint8_t *b)
{
	uint8_t L[256];
	q_k_affine(x, b, 31, L);
	uint8_t *qh = b + 16, *ql = b + 48, m1 = 1, m2 = 2;
	memset(qh, 0, 32);
	for (int n = 0; n < KQ_QK_K; n += 64) {
		for (int j = 0; j < 32; ++j) {
			int l1 = L[n + j], l2 = L[n + j + 32];
			if (l1 > 15) {
				l1 -= 16;
				qh[j] |= m1;
			}
			if (l2 > 15) {
				l2 -= 16;
				qh[j] |= m2;
			}
			ql[j] = (uint8_t)(l1 | (l2 << 4));
		}
		m1 = (uint8_t)(m1 << 2);
		m2 = (uint8_t)(m2 << 2);
		ql += 32;
	}
}

/* Symmetric sub-block fit (levels -nmax .. nmax-1), weights x^2. */
static float fit_sym(int n, int nmax, const float *x, int8_t *L)
{
	float max = 0, amax = 0;
	for (int i = 0; i < n; ++i) {
		float ax = fabsf(x[i]);
		if (ax > amax) {
			amax = ax;
			max = x[i];
		}
	}
	if (amax < GROUP_MAX_EPS) {
		memset(L, 0, (size_t)n);
		return 0.f;
	}
	float iscale = -(float)nmax / max, sumlx = 0, suml2 = 0;
	for (int i = 0; i < n; ++i) {
		int l = nearest_int(iscale * x[i]);
		l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
		L[i] = (int8_t)(l + nmax);
		float w = x[i] * x[i];
		sumlx += w * x[i] * (float)l;
		suml2 += w * (float)l * (float)l;
	}
	float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
	for (int is = -9; is <= 9; ++is) {
		if (is == 0)
			continue;
		iscale = -((float)nmax + 0.1f * (float)is) / max;
		sumlx = suml2 = 0;
		for (int i = 0; i < n; ++i) {
			int l = nearest_int(iscale * x[i]);
			l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
			float w = x[i] * x[i];
			sumlx += w * x[i] * (float)l;
			suml2 += w * (float)l * (float)l;
		}
		if (suml2 > 0 && sumlx * sumlx > best * suml2) {
			for (int i = 0; i < n; ++i) {
				int l = nearest_int(iscale * x[i]);
				L[i] = (int8_t)(nmax + (l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l));
			}
			scale = sumlx / suml2;
			best = scale * sumlx;
		}
	}
	return scale;
}

static void q_q6_k(const float *x, uint8_t *b)
{
	float scales[16], max_scale = 0, max_abs_scale = 0;
	int8_t Ls[256];
	uint8_t L[256];
	for (int ib = 0; ib < 16; ++ib) {
		const float scale = fit_sym(16, 32, x + 16 * ib, Ls + 16 * ib);
		scales[ib] = scale;
		const float abs_scale = fabsf(scale);
		if (abs_scale > max_abs_scale) {
			max_abs_scale = abs_scale;
			max_scale = scale;
		}
	}
	memset(b, 0, 210);
	if (max_abs_scale < GROUP_MAX_EPS)
		return;
	float iscale = -128.f / max_scale;
	f2h(b + 208, 1 / iscale);
	int8_t *ys = (int8_t *)(b + 192);
	for (int ib = 0; ib < 16; ++ib) {
		int v = nearest_int(iscale * scales[ib]);
		ys[ib] = (int8_t)(v > 127 ? 127 : v);
	}
	const float d0 = h2f(b + 208);
	for (int j = 0; j < 16; ++j) {
		const float d = d0 * (float)ys[j];
		for (int ii = 0; ii < 16; ++ii) {
			if (!d) { /* a zero scale keeps the sub-block fit's levels (ggml does) */
				L[16 * j + ii] = (uint8_t)Ls[16 * j + ii];
				continue;
			}
			int l = nearest_int(x[16 * j + ii] / d);
			l = l < -32 ? -32 : l > 31 ? 31 : l;
			L[16 * j + ii] = (uint8_t)(l + 32);
		}
	}
	uint8_t *ql = b, *qh = b + 128;
	for (int j = 0; j < KQ_QK_K; j += 128) {
		for (int l = 0; l < 32; ++l) {
			const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF, q3 = L[j + l + 64] & 0xF,
				      q4 = L[j + l + 96] & 0xF;
			ql[l] = (uint8_t)(q1 | (q3 << 4));
			ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
			qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
					  ((L[j + l + 96] >> 4) << 6));
		}
		ql += 64;
		qh += 32;
	}
}

/* Q2_K (ggml's quantize_row_q2_K_ref): 16 sub-blocks of 16, each an
 * affine fit with 2-bit levels under |x| weights and an absolute-error
 * criterion; scales and mins to 4 bits against the largest. */
static void q_q2_k(const float *x, uint8_t *b)
{
	uint8_t L[256], Laux[16], *sc = b, *qs = b + 16;
	float weights[16], mins[16], scales[16], max_scale = 0, max_min = 0;
	for (int j = 0; j < 16; ++j) {
		for (int l = 0; l < 16; ++l)
			weights[l] = fabsf(x[16 * j + l]);
		scales[j] = fit_affine(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, 1);
		if (scales[j] > max_scale)
			max_scale = scales[j];
		if (mins[j] > max_min)
			max_min = mins[j];
	}
	if (max_scale > 0) {
		const float iscale = 15.f / max_scale;
		for (int j = 0; j < 16; ++j)
			sc[j] = (uint8_t)nearest_int(iscale * scales[j]);
		f2h(b + 80, max_scale / 15.f);
	} else {
		memset(sc, 0, 16);
		f2h(b + 80, 0.f);
	}
	if (max_min > 0) {
		const float iscale = 15.f / max_min;
		for (int j = 0; j < 16; ++j)
			sc[j] = (uint8_t)(sc[j] | (nearest_int(iscale * mins[j]) << 4));
		f2h(b + 82, max_min / 15.f);
	} else {
		f2h(b + 82, 0.f);
	}
	const float d0 = h2f(b + 80), m0 = h2f(b + 82);
	for (int j = 0; j < 16; ++j) {
		const float d = d0 * (float)(sc[j] & 0xF);
		if (!d)
			continue;
		const float dm = m0 * (float)(sc[j] >> 4);
		for (int ii = 0; ii < 16; ++ii) {
			int l = nearest_int((x[16 * j + ii] + dm) / d);
			L[16 * j + ii] = (uint8_t)(l < 0 ? 0 : l > 3 ? 3 : l);
		}
	}
	for (int j = 0; j < KQ_QK_K; j += 128)
		for (int l = 0; l < 32; ++l)
			qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

/* ggml's make_q3_quants(n, nmax, x, L, do_rmse = true): a symmetric fit
 * (levels -nmax .. nmax-1, weights x^2) refined by moving single levels
 * while the weighted fit improves (at most 5 passes). L gets level + nmax. */
static float fit_q3(int n, int nmax, const float *x, int8_t *L)
{
	float max = 0, amax = 0;
	for (int i = 0; i < n; ++i) {
		float ax = fabsf(x[i]);
		if (ax > amax) {
			amax = ax;
			max = x[i];
		}
	}
	if (amax < GROUP_MAX_EPS) {
		memset(L, 0, (size_t)n);
		return 0.f;
	}
	const float iscale = (float)-nmax / max;
	float sumlx = 0, suml2 = 0;
	for (int i = 0; i < n; ++i) {
		int l = nearest_int(iscale * x[i]);
		l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
		L[i] = (int8_t)l;
		float w = x[i] * x[i];
		sumlx += w * x[i] * (float)l;
		suml2 += w * (float)l * (float)l;
	}
	for (int itry = 0; itry < 5; ++itry) {
		int n_changed = 0;
		for (int i = 0; i < n; ++i) {
			float w = x[i] * x[i];
			float slx = sumlx - w * x[i] * (float)L[i];
			if (slx > 0) {
				float sl2 = suml2 - w * (float)L[i] * (float)L[i];
				int new_l = nearest_int(x[i] * sl2 / slx);
				new_l = new_l < -nmax ? -nmax : new_l > nmax - 1 ? nmax - 1 : new_l;
				if (new_l != L[i]) {
					slx += w * x[i] * (float)new_l;
					sl2 += w * (float)new_l * (float)new_l;
					if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
						L[i] = (int8_t)new_l;
						sumlx = slx;
						suml2 = sl2;
						++n_changed;
					}
				}
			}
		}
		if (!n_changed)
			break;
	}
	for (int i = 0; i < n; ++i)
		L[i] = (int8_t)(L[i] + nmax);
	return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Q3_K (ggml's quantize_row_q3_K_ref): 16 symmetric sub-blocks of 16 with
 * 3-bit levels, 6-bit signed sub-block scales against the largest. */
static void q_q3_k(const float *x, uint8_t *b)
{
	int8_t L[256];
	float scales[16], max_scale = 0, amax = 0;
	uint8_t *hmask = b, *qs = b + 32, *sc = b + 96;
	for (int j = 0; j < 16; ++j) {
		scales[j] = fit_q3(16, 4, x + 16 * j, L + 16 * j);
		float scale = fabsf(scales[j]);
		if (scale > amax) {
			amax = scale;
			max_scale = scales[j];
		}
	}
	memset(sc, 0, 12);
	if (max_scale) {
		const float iscale = -32.f / max_scale;
		for (int j = 0; j < 16; ++j) {
			int l = (int8_t)nearest_int(iscale * scales[j]);
			l = (l < -32 ? -32 : l > 31 ? 31 : l) + 32;
			if (j < 8)
				sc[j] = (uint8_t)(l & 0xF);
			else
				sc[j - 8] = (uint8_t)(sc[j - 8] | ((l & 0xF) << 4));
			l >>= 4;
			sc[j % 4 + 8] = (uint8_t)(sc[j % 4 + 8] | (l << (2 * (j / 4))));
		}
		f2h(b + 108, 1 / iscale);
	} else {
		f2h(b + 108, 0.f);
	}
	const float d0 = h2f(b + 108);
	for (int j = 0; j < 16; ++j) {
		int s = j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4;
		s = (s | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
		const float d = d0 * (float)s;
		if (!d)
			continue; /* keeps the sub-block fit's levels, as ggml does */
		for (int ii = 0; ii < 16; ++ii) {
			int l = nearest_int(x[16 * j + ii] / d);
			L[16 * j + ii] = (int8_t)((l < -4 ? -4 : l > 3 ? 3 : l) + 4);
		}
	}
	/* the high bit of element j goes to bit j / 32 of hmask[j % 32] */
	memset(hmask, 0, 32);
	for (int j = 0; j < KQ_QK_K; ++j)
		if (L[j] > 3) {
			hmask[j % 32] = (uint8_t)(hmask[j % 32] | (1u << (j / 32)));
			L[j] = (int8_t)(L[j] - 4);
		}
	for (int j = 0; j < KQ_QK_K; j += 128)
		for (int l = 0; l < 32; ++l)
			qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

typedef void (*q_fn)(const float *, uint8_t *);

int kq_quant_row(int dt, const float *src, void *dst, size_t n)
{
	uint8_t *p = dst;
	q_fn f = NULL;
	if (dt == KV_DT_F32) {
		memcpy(dst, src, n * 4);
		return KV_OK;
	}
	if (dt == KV_DT_F16 || dt == KV_DT_BF16) {
		for (size_t i = 0; i < n; i++) {
			uint16_t h = dt == KV_DT_F16 ? kv_f32_to_f16(src[i]) : kv_f32_to_bf16(src[i]);
			memcpy(p + 2 * i, &h, 2);
		}
		return KV_OK;
	}
	switch (dt) {
	case KV_DT_Q4_0: f = q_q4_0; break;
	case KV_DT_Q4_1: f = q_q4_1; break;
	case KV_DT_Q5_0: f = q_q5_0; break;
	case KV_DT_Q5_1: f = q_q5_1; break;
	case KV_DT_Q8_0: f = q_q8_0; break;
	case KV_DT_Q2_K: f = q_q2_k; break;
	case KV_DT_Q3_K: f = q_q3_k; break;
	case KV_DT_Q4_K: f = q_q4_k; break;
	case KV_DT_Q5_K: f = q_q5_k; break;
	case KV_DT_Q6_K: f = q_q6_k; break;
	}
	int qk = kv_dtype_block_elems(dt);
	size_t bb = kv_dtype_block_bytes(dt);
	if (!f || n % (size_t)qk)
		return kv_fail(KV_ERR_INVALID, "quantize: %zu elements to %s", n,
			       kv_dtype_name(dt) ? kv_dtype_name(dt) : "?");
	for (size_t i = 0; i < n / (size_t)qk; i++)
		f(src + i * (size_t)qk, p + i * bb);
	return KV_OK;
}

/* --- file types and llama.cpp's mixes --------------------------------------- */

static const struct {
	const char *name;
	int ftype, base;
} g_ft[] = {
	{"f32", KQ_FTYPE_F32, KV_DT_F32},	 {"f16", KQ_FTYPE_F16, KV_DT_F16},
	{"bf16", KQ_FTYPE_BF16, KV_DT_BF16},	 {"q8_0", KQ_FTYPE_Q8_0, KV_DT_Q8_0},
	{"q4_0", KQ_FTYPE_Q4_0, KV_DT_Q4_0},	 {"q4_1", KQ_FTYPE_Q4_1, KV_DT_Q4_1},
	{"q5_0", KQ_FTYPE_Q5_0, KV_DT_Q5_0},	 {"q5_1", KQ_FTYPE_Q5_1, KV_DT_Q5_1},
	{"q2_k", KQ_FTYPE_Q2_K, KV_DT_Q2_K},	 {"q3_k_s", KQ_FTYPE_Q3_K_S, KV_DT_Q3_K},
	{"q3_k_m", KQ_FTYPE_Q3_K_M, KV_DT_Q3_K}, {"q3_k_l", KQ_FTYPE_Q3_K_L, KV_DT_Q3_K},
	{"q4_k_s", KQ_FTYPE_Q4_K_S, KV_DT_Q4_K}, {"q4_k_m", KQ_FTYPE_Q4_K_M, KV_DT_Q4_K},
	{"q5_k_s", KQ_FTYPE_Q5_K_S, KV_DT_Q5_K}, {"q5_k_m", KQ_FTYPE_Q5_K_M, KV_DT_Q5_K},
	{"q6_k", KQ_FTYPE_Q6_K, KV_DT_Q6_K},
};

const char *kq_ftype_list(void)
{
	return "f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q2_k|q3_k_s|q3_k_m|q3_k_l|q4_k_s|q4_k_m|q5_k_s|q5_k_m|q6_k";
}

int kq_ftype_parse(const char *s)
{
	for (size_t i = 0; s && i < sizeof g_ft / sizeof g_ft[0]; i++)
		if (!strcasecmp(s, g_ft[i].name))
			return g_ft[i].ftype;
	return -1;
}

const char *kq_ftype_name(int ftype)
{
	for (size_t i = 0; i < sizeof g_ft / sizeof g_ft[0]; i++)
		if (g_ft[i].ftype == ftype)
			return g_ft[i].name;
	return NULL;
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers and
 * every third one in between get more bits. */
static int use_more_bits(int i, int n)
{
	return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* llama.cpp's tensor_type_fallback: a type whose block does not divide
 * the row length gives way to a 32-block type, and F16 if none fits. */
static int fallback(int t, int64_t row_len)
{
	if (row_len % kv_dtype_block_elems(t)) {
		switch (t) {
		case KV_DT_Q2_K: case KV_DT_Q3_K: t = KV_DT_Q4_0; break;
		case KV_DT_Q4_K: t = KV_DT_Q5_0; break;
		case KV_DT_Q5_K: t = KV_DT_Q5_1; break;
		case KV_DT_Q6_K: t = KV_DT_Q8_0; break;
		}
		if (row_len % kv_dtype_block_elems(t))
			t = KV_DT_F16;
	}
	return t;
}

int kq_ftype_tensor_dtype(int ftype, const struct kq_mix_ctx *m, const char *name, int layer, int i_attn_v,
			  int64_t row_len)
{
	int base = -1;
	for (size_t i = 0; i < sizeof g_ft / sizeof g_ft[0]; i++)
		if (g_ft[i].ftype == ftype)
			base = g_ft[i].base;
	if (base < 0)
		return -1;
	if (!kv_dtype_is_quant(base))
		return base;
	const int f = ftype, e8 = m->n_expert == 8, nl = m->n_layers;
	int t = base;
	/* the branches of llama_tensor_get_type_impl (llama.cpp v0.5.0) that
	 * can fire for these ftypes on qwen3/qwen35 (no Falcon, no 70B, no
	 * imatrix), in its order */
	if (!strcmp(name, "output.weight") || (!m->has_output && !strcmp(name, "token_embd.weight"))) {
		if (row_len % kv_dtype_block_elems(base))
			t = KV_DT_Q8_0;
		else if (t != KV_DT_Q8_0)
			t = KV_DT_Q6_K;
	} else if (strstr(name, "attn_v.weight") || strstr(name, "attn_qkv.weight")) {
		/* llama.cpp (v0.5.0) counts attn_v and attn_qkv together, in file
		 * order, and gives both the attn_v rule */
		if (f == KQ_FTYPE_Q2_K)
			t = m->n_gqa >= 4 ? KV_DT_Q4_K : KV_DT_Q3_K;
		else if (f == KQ_FTYPE_Q3_K_M)
			t = i_attn_v < 2 ? KV_DT_Q5_K : KV_DT_Q4_K;
		else if (f == KQ_FTYPE_Q3_K_L)
			t = KV_DT_Q5_K;
		else if ((f == KQ_FTYPE_Q4_K_M || f == KQ_FTYPE_Q5_K_M) && use_more_bits(i_attn_v, m->n_attn_v))
			t = KV_DT_Q6_K;
		else if (f == KQ_FTYPE_Q4_K_S && i_attn_v < 4)
			t = KV_DT_Q5_K;
		if (e8) /* its "8-expert model" bump, any ftype */
			t = KV_DT_Q8_0;
	} else if (strstr(name, "attn_k.weight")) {
		if (e8)
			t = KV_DT_Q8_0;
	} else if (strstr(name, "attn_output.weight")) {
		if (e8) {
			if (f == KQ_FTYPE_Q2_K || f == KQ_FTYPE_Q3_K_S || f == KQ_FTYPE_Q3_K_M || f == KQ_FTYPE_Q4_K_S ||
			    f == KQ_FTYPE_Q4_K_M)
				t = KV_DT_Q5_K;
		} else if (f == KQ_FTYPE_Q2_K) {
			t = KV_DT_Q3_K;
		} else if (f == KQ_FTYPE_Q3_K_M) {
			t = KV_DT_Q4_K;
		} else if (f == KQ_FTYPE_Q3_K_L) {
			t = KV_DT_Q5_K;
		}
	} else if (strstr(name, "ffn_up") || strstr(name, "ffn_gate")) {
		/* ffn_up / ffn_gate (ffn_gate_inp, ffn_gate_exps, ... included):
		 * no rule for these ftypes; they must not reach the ffn_down
		 * branch (llama.cpp tests ffn_up and ffn_gate first) */
	} else if (strstr(name, "ffn_down") && layer >= 0) {
		if (f == KQ_FTYPE_Q2_K)
			t = KV_DT_Q3_K;
		else if (f == KQ_FTYPE_Q3_K_M)
			t = layer < nl / 16 ? KV_DT_Q5_K : KV_DT_Q4_K;
		else if (f == KQ_FTYPE_Q3_K_L)
			t = KV_DT_Q5_K;
		else if ((f == KQ_FTYPE_Q4_K_M || f == KQ_FTYPE_Q5_K_M) && use_more_bits(layer, nl))
			t = KV_DT_Q6_K;
		else if (f == KQ_FTYPE_Q4_K_S && layer < nl / 8)
			t = KV_DT_Q5_K;
	}
	return fallback(t, row_len);
}
