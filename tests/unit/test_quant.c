/*
 * test_quant.c - ggml block types (model/quant.h): sizes, quantize ->
 * dequantize error bounds, hand-computed blocks, and, when llama.cpp's
 * package is installed (tests/peer), dequantization bit-identical to
 * ggml's own to_float on random blocks of every type with edge values
 * (zero, largest and subnormal scales, extreme mins).
 */
#include "kt.h"
#include "base/err.h"
#include "model/quant.h"
#include "model/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int g_types[] = {KV_DT_Q4_0, KV_DT_Q4_1, KV_DT_Q5_0, KV_DT_Q5_1, KV_DT_Q8_0, KV_DT_Q2_K,
			      KV_DT_Q3_K, KV_DT_Q4_K, KV_DT_Q5_K, KV_DT_Q6_K, KV_DT_Q8_K};
#define N_TYPES (sizeof g_types / sizeof g_types[0])

KT_CASE(block_sizes)
{
	const int qk[] = {32, 32, 32, 32, 32, 256, 256, 256, 256, 256, 256};
	const size_t bytes[] = {18, 20, 22, 24, 34, 84, 110, 144, 176, 210, 292};
	for (size_t i = 0; i < N_TYPES; i++) {
		KT_EQ_INT(kv_dtype_block_elems(g_types[i]), qk[i]);
		KT_EQ_U64(kv_dtype_block_bytes(g_types[i]), bytes[i]);
		KT_CHECK(kv_dtype_is_quant(g_types[i]));
		KT_EQ_INT(kq_dtype_from_ggml(kq_ggml_from_dtype(g_types[i])), g_types[i]);
	}
	KT_CHECK(!kv_dtype_is_quant(KV_DT_F32));
	KT_EQ_INT(kq_dtype_from_ggml(16), -1); /* IQ2_XXS: not read */
	KT_EQ_STR(kq_ggml_name(16), "IQ2_XXS");
	KT_CHECK(kq_ggml_name(4) == NULL);
	float y[32];
	KT_EQ_INT(kq_dequant_row(KV_DT_Q8_0, "", y, 31), KV_ERR_INVALID);
}

/* Hand-made blocks with known values. */
KT_CASE(known_blocks)
{
	uint8_t b[34] = {0};
	float y[256];
	b[1] = 0x3c; /* f16 1.0 */
	for (int j = 0; j < 32; j++)
		b[2 + j] = (uint8_t)(int8_t)(j - 16);
	KT_OK(kq_dequant_row(KV_DT_Q8_0, b, y, 32));
	for (int j = 0; j < 32; j++)
		KT_CHECK(y[j] == (float)(j - 16));
	uint8_t q4[18] = {0, 0x40}; /* d = 2.0 */
	q4[2] = 0x9f;               /* lo 15 -> 7 * 2, hi 9 -> 1 * 2 */
	KT_OK(kq_dequant_row(KV_DT_Q4_0, q4, y, 32));
	KT_CHECK(y[0] == 14.0f && y[16] == 2.0f && y[1] == -16.0f);
	/* Q6_K: d = 1, every scale 2, every quant 32 + 3 -> 6 */
	uint8_t q6[210];
	memset(q6, 0, sizeof q6);
	for (int i = 0; i < 128; i++)
		q6[i] = 0x33;
	for (int i = 128; i < 192; i++)
		q6[i] = 0xaa; /* high bits 2 of each -> +32 */
	for (int i = 192; i < 208; i++)
		q6[i] = 2;
	q6[209] = 0x3c;
	KT_OK(kq_dequant_row(KV_DT_Q6_K, q6, y, 256));
	for (int j = 0; j < 256; j++)
		KT_CHECKF(y[j] == 6.0f, "q6_k[%d] = %g", j, y[j]);
}

static void rand_row(float *x, int n, uint64_t *s, float scale)
{
	for (int i = 0; i < n; i++)
		x[i] = scale * ((float)(kt_rand(s) % 20001) / 10000.0f - 1.0f);
}

/* quantize -> dequantize: RMS error within a per-type bound of the row's
 * RMS (the K types minimise a weighted squared error, as ggml's do, so the
 * bound is on the RMS, not on the largest error); zero rows are exact. */
KT_CASE(roundtrip_bounds)
{
	const int types[] = {KV_DT_Q4_0, KV_DT_Q4_1, KV_DT_Q5_0, KV_DT_Q5_1, KV_DT_Q8_0, KV_DT_Q2_K, KV_DT_Q3_K,
			     KV_DT_Q4_K, KV_DT_Q5_K, KV_DT_Q6_K, KV_DT_F16, KV_DT_BF16};
	const double bound[] = {0.12, 0.08, 0.06, 0.04, 0.008, 0.30, 0.17, 0.08, 0.04, 0.02, 0.001, 0.005};
	uint64_t s = 3;
	static float x[1024], y[1024];
	static uint8_t q[1024 * 4];
	for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
		double worst = 0;
		for (int rep = 0; rep < 20; rep++) {
			rand_row(x, 1024, &s, rep == 0 ? 1e-2f : rep == 1 ? 50.0f : 1.0f);
			if (rep == 2)
				memset(x, 0, sizeof x);
			KT_OK(kq_quant_row(types[t], x, q, 1024));
			KT_OK(kq_dequant_row(types[t], q, y, 1024));
			double e2 = 0, x2 = 0;
			for (int i = 0; i < 1024; i++) {
				e2 += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
				x2 += (double)x[i] * x[i];
			}
			if (rep == 2)
				KT_CHECKF(e2 == 0, "%s: zero row dequantizes to %g", kv_dtype_name(types[t]), e2);
			else
				worst = fmax(worst, sqrt(e2 / x2));
		}
		KT_CHECKF(worst <= bound[t], "%s: RMS error %.4g of the row's RMS (bound %.4g)", kv_dtype_name(types[t]),
			  worst, bound[t]);
		fprintf(stderr, "  %-5s RMS error %.4f of the row's RMS\n", kv_dtype_name(types[t]), worst);
	}
}

/* --- ggml oracle -------------------------------------------------------------- */

static const char *ggml_lower(int dt)
{
	switch (dt) {
	case KV_DT_Q4_0: return "q4_0";
	case KV_DT_Q4_1: return "q4_1";
	case KV_DT_Q5_0: return "q5_0";
	case KV_DT_Q5_1: return "q5_1";
	case KV_DT_Q8_0: return "q8_0";
	case KV_DT_Q2_K: return "q2_K";
	case KV_DT_Q3_K: return "q3_K";
	case KV_DT_Q4_K: return "q4_K";
	case KV_DT_Q5_K: return "q5_K";
	case KV_DT_Q6_K: return "q6_K";
	case KV_DT_Q8_K: return "q8_K";
	case KV_DT_F16: return "f16";
	case KV_DT_BF16: return "bf16";
	}
	return "?";
}

/* Offsets of the f16 scale fields of a block (-1 ends). */
static void scale_fields(int dt, int *f)
{
	f[0] = f[1] = -1;
	switch (dt) {
	case KV_DT_Q4_0: case KV_DT_Q5_0: case KV_DT_Q8_0: f[0] = 0; break;
	case KV_DT_Q4_1: case KV_DT_Q5_1: case KV_DT_Q4_K: case KV_DT_Q5_K: f[0] = 0, f[1] = 2; break;
	case KV_DT_Q2_K: f[0] = 80, f[1] = 82; break;
	case KV_DT_Q3_K: f[0] = 108; break;
	case KV_DT_Q6_K: f[0] = 208; break;
	}
}

/* A finite random f16 (any exponent), or an edge value. */
static uint16_t f16_pick(uint64_t *s, int k)
{
	static const uint16_t edge[] = {0x0000, 0x8000, 0x7bff, 0xfbff, 0x0001, 0x8001, 0x03ff, 0x3c00, 0x0400};
	if (k < (int)(sizeof edge / sizeof edge[0]))
		return edge[k];
	uint16_t h;
	do
		h = (uint16_t)kt_rand(s);
	while (((h >> 10) & 0x1f) == 0x1f);
	return h;
}

KT_CASE(dequant_bit_identical_to_ggml)
{
	const char *bld = getenv("KT_BUILD") ? getenv("KT_BUILD") : "build";
	char kvpeer[1024];
	snprintf(kvpeer, sizeof kvpeer, "%s/peer/kvpeer", bld);
	if (kt_sh("bash tests/peer/build.sh '%s' >/dev/null 2>&1", bld) != 0) {
		kt_skip("llama.cpp's package is not installed (tests/peer; run make npm)");
		return;
	}
	const char *d = kt_tmpdir();
	/* Q8_K has no to_float in ggml (it is only a dot-product operand) */
	const int types[] = {KV_DT_Q4_0, KV_DT_Q4_1, KV_DT_Q5_0, KV_DT_Q5_1, KV_DT_Q8_0, KV_DT_Q2_K, KV_DT_Q3_K,
			     KV_DT_Q4_K, KV_DT_Q5_K, KV_DT_Q6_K, KV_DT_F16, KV_DT_BF16};
	uint64_t s = 11;
	for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
		int dt = types[t], qk = kv_dtype_block_elems(dt);
		size_t bb = kv_dtype_block_bytes(dt), nblk = 400 * 256 / (size_t)qk, n = nblk * (size_t)qk;
		uint8_t *b = malloc(nblk * bb);
		float *mine = malloc(n * 4), *theirs = malloc(n * 4);
		for (size_t i = 0; i < nblk * bb; i++)
			b[i] = (uint8_t)kt_rand(&s);
		for (size_t k = 0; k < nblk; k++) {
			uint8_t *blk = b + k * bb;
			int f[2];
			scale_fields(dt, f);
			for (int j = 0; j < 2 && f[j] >= 0; j++) {
				/* the first blocks: every edge value, on d and on the min */
				uint16_t h = f16_pick(&s, (int)(j == 0 ? k : k / 9 + (k % 2 ? 0 : 100)));
				memcpy(blk + f[j], &h, 2);
			}
			if (dt == KV_DT_Q8_K) {
				float fd = k == 0 ? 0.0f : k == 1 ? 3.4e38f : (float)((double)(kt_rand(&s) % 2000) - 1000) * 1e-3f;
				memcpy(blk, &fd, 4);
			}
			if (dt == KV_DT_F16 || dt == KV_DT_BF16) {
				uint16_t h = (uint16_t)kt_rand(&s);
				if (dt == KV_DT_F16 && ((h >> 10) & 0x1f) == 0x1f)
					h &= 0x83ff; /* finite */
				if (dt == KV_DT_BF16 && ((h >> 7) & 0xff) == 0xff)
					h &= 0x807f;
				memcpy(blk, &h, 2);
			}
		}
		char in[1100], out[1100];
		snprintf(in, sizeof in, "%s/%s.bin", d, ggml_lower(dt));
		snprintf(out, sizeof out, "%s/%s.f32", d, ggml_lower(dt));
		FILE *fp = fopen(in, "wb");
		KT_REQUIRE(fp && fwrite(b, bb, nblk, fp) == nblk);
		fclose(fp);
		KT_OK(kq_dequant_row(dt, b, mine, n));
		int rc = kt_sh("'%s' tofloat %s '%s' '%s' >/dev/null", kvpeer, ggml_lower(dt), in, out);
		KT_CHECKF(rc == 0, "kvpeer tofloat %s failed", ggml_lower(dt));
		fp = fopen(out, "rb");
		size_t got = fp ? fread(theirs, 4, n, fp) : 0;
		if (fp)
			fclose(fp);
		KT_CHECKF(got == n, "%s: %zu of %zu floats from ggml", ggml_lower(dt), got, n);
		size_t diff = 0, first = n;
		for (size_t i = 0; got == n && i < n; i++) {
			uint32_t x, y;
			memcpy(&x, mine + i, 4);
			memcpy(&y, theirs + i, 4);
			if (x != y && !(isnan(mine[i]) && isnan(theirs[i]))) {
				if (first == n)
					first = i;
				diff++;
			}
		}
		KT_CHECKF(diff == 0, "%s: %zu of %zu floats differ from ggml's to_float (first at %zu: %.9g vs %.9g)",
			  ggml_lower(dt), diff, n, first, first < n ? mine[first] : 0.0, first < n ? theirs[first] : 0.0);
		free(b);
		free(mine);
		free(theirs);
	}
}

/* kvkeep's quantizers give ggml's reference bytes (from_float_ref through
 * kvpeer fromfloat) on rows of several scales, with zero and tiny
 * sub-blocks. */
KT_CASE(quant_bytes_identical_to_ggml)
{
	const char *bld = getenv("KT_BUILD") ? getenv("KT_BUILD") : "build";
	char kvpeer[1024];
	snprintf(kvpeer, sizeof kvpeer, "%s/peer/kvpeer", bld);
	if (kt_sh("bash tests/peer/build.sh '%s' >/dev/null 2>&1", bld) != 0) {
		kt_skip("llama.cpp's package is not installed (tests/peer; run make npm)");
		return;
	}
	const char *d = kt_tmpdir();
	const int types[] = {KV_DT_Q4_0, KV_DT_Q4_1, KV_DT_Q5_0, KV_DT_Q5_1, KV_DT_Q8_0, KV_DT_Q2_K, KV_DT_Q3_K,
			     KV_DT_Q4_K, KV_DT_Q5_K, KV_DT_Q6_K};
	const int n = 256 * 60;
	float *x = malloc((size_t)n * 4);
	uint64_t s = 21;
	for (int i = 0; i < n; i++) {
		int blk = i / 256, k = blk % 10;
		float scale = k == 0 ? 1e-3f : k == 1 ? 3.0f : k == 6 ? 2e4f : k == 7 ? 1e-30f : 0.05f;
		x[i] = (k == 5 && (i / 32) % 2) ? 0.0f : scale * ((float)(kt_rand(&s) % 20001) / 10000.0f - 1.0f);
		if (k == 8) /* a constant block (max == min: every fit's degenerate case) */
			x[i] = 0.75f;
		if (k == 9) /* all zero but one spike per sub-block of 16 */
			x[i] = i % 16 == 3 ? -1.5f * (float)(1 + (i / 16) % 5) : 0.0f;
	}
	char xin[1100];
	snprintf(xin, sizeof xin, "%s/x.f32", d);
	FILE *fp = fopen(xin, "wb");
	KT_REQUIRE(fp && fwrite(x, 4, (size_t)n, fp) == (size_t)n);
	fclose(fp);
	for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
		int dt = types[t];
		size_t rb = (size_t)kv_dtype_row_bytes(dt, (uint64_t)n);
		uint8_t *mine = malloc(rb), *theirs = malloc(rb);
		KT_OK(kq_quant_row(dt, x, mine, (size_t)n));
		char out[1100];
		snprintf(out, sizeof out, "%s/%s.bin", d, ggml_lower(dt));
		KT_CHECKF(kt_sh("'%s' fromfloat %s '%s' '%s' --ref >/dev/null", kvpeer, ggml_lower(dt), xin, out) == 0,
			  "kvpeer fromfloat %s", ggml_lower(dt));
		fp = fopen(out, "rb");
		size_t got = fp ? fread(theirs, 1, rb, fp) : 0;
		if (fp)
			fclose(fp);
		size_t diff = 0;
		for (size_t i = 0; got == rb && i < rb; i++)
			diff += mine[i] != theirs[i];
		KT_CHECKF(got == rb && diff == 0, "%s: %zu of %zu bytes differ from ggml's reference quantizer",
			  ggml_lower(dt), diff, rb);
		free(mine);
		free(theirs);
	}
	free(x);
}

/* every file type `kvkeep convert --type` lists parses, names itself back,
 * and gives its base block type to a plain mid-model matrix */
KT_CASE(ftype_names)
{
	char list[256];
	snprintf(list, sizeof list, "%s", kq_ftype_list());
	int n = 0;
	struct kq_mix_ctx m = {8, 8, 1, 0, 2};
	for (char *sv = NULL, *t = strtok_r(list, "|", &sv); t; t = strtok_r(NULL, "|", &sv), n++) {
		int ft = kq_ftype_parse(t);
		KT_CHECKF(ft >= 0, "%s does not parse", t);
		KT_EQ_STR(kq_ftype_name(ft), t);
		int dt = kq_ftype_tensor_dtype(ft, &m, "blk.3.attn_q.weight", 3, 3, 1024);
		KT_CHECKF(dt >= 0, "%s: no type for attn_q", t);
	}
	KT_EQ_INT(n, 17);
	KT_EQ_INT(kq_ftype_parse("Q3_K_M"), KQ_FTYPE_Q3_K_M);
	KT_EQ_INT(kq_ftype_parse("q3_k"), -1);
	/* the K types' fallbacks (llama.cpp's tensor_type_fallback) for rows
	 * that are not whole 256-blocks: Q2_K/Q3_K -> Q4_0, and F16 below 32 */
	KT_EQ_INT(kq_ftype_tensor_dtype(KQ_FTYPE_Q2_K, &m, "blk.3.attn_q.weight", 3, 3, 96), KV_DT_Q4_0);
	KT_EQ_INT(kq_ftype_tensor_dtype(KQ_FTYPE_Q3_K_S, &m, "blk.3.attn_q.weight", 3, 3, 96), KV_DT_Q4_0);
	KT_EQ_INT(kq_ftype_tensor_dtype(KQ_FTYPE_Q3_K_S, &m, "blk.3.attn_q.weight", 3, 3, 48), KV_DT_F16);
	KT_EQ_INT(kq_ftype_tensor_dtype(KQ_FTYPE_Q4_1, &m, "blk.3.attn_q.weight", 3, 3, 48), KV_DT_F16);
	/* Q2_K's attn_v: Q3_K, Q4_K from 4 query heads per KV head */
	KT_EQ_INT(kq_ftype_tensor_dtype(KQ_FTYPE_Q2_K, &m, "blk.3.attn_v.weight", 3, 3, 256), KV_DT_Q3_K);
	m.n_gqa = 4;
	KT_EQ_INT(kq_ftype_tensor_dtype(KQ_FTYPE_Q2_K, &m, "blk.3.attn_v.weight", 3, 3, 256), KV_DT_Q4_K);
}

KT_MAIN(block_sizes, known_blocks, roundtrip_bounds, dequant_bit_identical_to_ggml, quant_bytes_identical_to_ggml,
	ftype_names)
