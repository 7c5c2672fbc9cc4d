/*
 * qdot_int.h - what the integer path's two files share (engine/qdot.c:
 * the definition, activation quantization and the 4-row kernels;
 * engine/qpanel.c: the repacked panels): the block layouts' accessors,
 * the code decoders both must decode alike, and the target attributes.
 * Included by those two files only.
 */
#ifndef KV_ENGINE_QDOT_INT_H
#define KV_ENGINE_QDOT_INT_H

#include <stdint.h>
#include <string.h>

#include "engine/qdot.h"
#include "model/quant.h"
#include "model/safetensors.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ke_qdot_block (qdot.h): the activation block length of a weight type,
 * here so that qpanel.c asks it without calling back into qdot.c. */
static inline int q_block(int dt)
{
	if (dt == KV_DT_Q8_0 || dt == KV_DT_Q4_0 || dt == KV_DT_Q5_0 || dt == KV_DT_Q4_1 || dt == KV_DT_Q5_1 ||
	    dt == KV_DT_MXFP4)
		return 32;
	if (dt == KV_DT_Q4_K || dt == KV_DT_Q6_K || dt == KV_DT_Q5_K || dt == KV_DT_Q3_K || dt == KV_DT_Q2_K)
		return 256;
	return 0;
}

/* The 32-blocks with 4/5-bit unsigned codes: Q4_0 / Q5_0 (w = d (q - 8 |
 * 16)), Q4_1 / Q5_1 (w = d q + m) and MXFP4 (w = d (u - 16), u = 16 + the
 * doubled E2M1 value of the 4-bit code, 4..28: a table lookup, then
 * Q5_0's arithmetic; d = 2^(e - 128) from the E8M0 byte, not an f16).
 * Bytes per block, where qh and qs start (qh: 0 if none), and for Q4_0 /
 * Q5_0 / MXFP4 the shift that turns a row's ns (-128 sum q) into -offset
 * sum q. */
static inline int q0_bytes(int dt)
{
	return dt == KV_DT_Q4_0 ? 18 : dt == KV_DT_Q5_0 ? 22 : dt == KV_DT_Q4_1 ? 20 : dt == KV_DT_MXFP4 ? 17 : 24;
}

static inline int q0_qs(int dt)
{
	return dt == KV_DT_Q4_0 ? 2 : dt == KV_DT_Q5_0 ? 6 : dt == KV_DT_Q4_1 ? 4 : dt == KV_DT_MXFP4 ? 1 : 8;
}

/* MXFP4's codes as unsigned bytes: 16 + kq_mxfp4_values[code]. */
static const uint8_t q_mxfp4_u[16] = {16, 17, 18, 19, 20, 22, 24, 28, 16, 15, 14, 13, 12, 10, 8, 4};

static inline int q0_qh(int dt)
{
	return dt == KV_DT_Q5_0 ? 2 : dt == KV_DT_Q5_1 ? 4 : 0;
}

static inline int q0_is1(int dt) /* Q4_1 / Q5_1: a min instead of an offset */
{
	return dt == KV_DT_Q4_1 || dt == KV_DT_Q5_1;
}

static inline int q0_shift(int dt)
{
	return dt == KV_DT_Q4_0 ? 4 : 3; /* offset 8, or 16 (Q5_0, MXFP4) */
}

/* The 32 unsigned codes (0..15 / 0..31 / MXFP4's 4..28) of such a block. */
static inline void q0_codes(int dt, const uint8_t *blk, uint8_t *u)
{
	const uint8_t *qs = blk + q0_qs(dt);
	if (dt == KV_DT_MXFP4) {
		for (int j = 0; j < 16; j++) {
			u[j] = q_mxfp4_u[qs[j] & 15];
			u[j + 16] = q_mxfp4_u[qs[j] >> 4];
		}
		return;
	}
	uint32_t qh = 0;
	if (q0_qh(dt))
		memcpy(&qh, blk + q0_qh(dt), 4);
	for (int j = 0; j < 16; j++) {
		u[j] = (uint8_t)((qs[j] & 15) | (((qh >> j) & 1) << 4));
		u[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
	}
}

/* Q3_K's 16 6-bit scales minus 32 (ggml's unpacking of scales[12]). */
static inline void q3k_scales(const uint8_t *blk, int8_t *sc)
{
	const uint32_t m1 = 0x03030303u, m2 = 0x0f0f0f0fu;
	uint32_t a[4];
	memcpy(a, blk + 96, 12);
	uint32_t t = a[2];
	a[2] = ((a[0] >> 4) & m2) | (((t >> 4) & m1) << 4);
	a[3] = ((a[1] >> 4) & m2) | (((t >> 6) & m1) << 4);
	a[0] = (a[0] & m2) | (((t >> 0) & m1) << 4);
	a[1] = (a[1] & m2) | (((t >> 2) & m1) << 4);
	memcpy(sc, a, 16);
	for (int g = 0; g < 16; g++)
		sc[g] = (int8_t)(sc[g] - 32);
}

static inline int have_vnni(void)
{
#if defined(__x86_64__)
	/* reads the CPU model gcc's runtime filled in at start: no state here */
	return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
	       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
#else
	return 0;
#endif
}

static inline void put(float *y, int accum, float v)
{
	*y = accum ? *y + v : v;
}

#if defined(__x86_64__)
#define TGT2 __attribute__((target("avx2,fma,f16c")))
#define TGT5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define AINL2 __attribute__((always_inline)) inline
#define AINL __attribute__((always_inline)) inline
/* Activation rows per kernel call: the 4-row kernels and the panels alike. */
#define AMR 4

static inline int32_t word_at(const uint8_t *p)
{
	int32_t v;
	memcpy(&v, p, 4);
	return v;
}

/* Bit s of every byte of v moved to bit t (s, t in 0..7), other bits 0: a
 * 16-bit shift keeps each byte's bit within its byte, the mask drops the
 * rest (one shift and one and). */
TGT2 static inline __m256i bit_to(__m256i v, int s, int t)
{
	const __m256i sh = s > t ? _mm256_srli_epi16(v, s - t) : _mm256_slli_epi16(v, t - s);
	return _mm256_and_si256(sh, _mm256_set1_epi8((char)(1 << t)));
}

/* The codes of a Q4_0 / Q5_0 / Q4_1 / Q5_1 / MXFP4 block as 32 unsigned bytes. */
TGT2 static inline __m256i q0_codes_avx2(int dt, const uint8_t *blk)
{
	const __m128i m4 = _mm_set1_epi8(0x0F);
	const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + q0_qs(dt)));
	__m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
	if (dt == KV_DT_MXFP4) /* the table in both lanes: one shuffle */
		return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q_mxfp4_u)), u);
	if (q0_qh(dt)) { /* bit j of qh -> 0x10 in byte j */
		uint32_t qh;
		memcpy(&qh, blk + q0_qh(dt), 4);
		const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
						     3, 3, 3, 3, 3, 3, 3, 3);
		const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
		__m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), sel);
		hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, bit), bit), _mm256_set1_epi8(0x10));
		u = _mm256_or_si256(u, hb);
	}
	return u;
}

/* Q3_K / Q2_K: the 32 codes of slice s (groups 2s and 2s + 1 in the low
 * and high 128-bit halves), Q3_K's as u = low bits | hmask bit << 2. */
TGT2 static inline __m256i g16_codes(int dt, const uint8_t *blk, int s)
{
	const int n = s >> 2, j = s & 3;
	const __m256i m3 = _mm256_set1_epi8(3);
	if (dt == KV_DT_Q3_K) {
		const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * n));
		const __m256i hm = _mm256_loadu_si256((const __m256i *)blk);
		return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3), bit_to(hm, s, 2));
	}
	const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * n));
	return _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
}
#endif

#endif
