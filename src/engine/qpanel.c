/*
 * qpanel.c - see qpanel.h: the repacked panel GEMMs of the integer path,
 * taken when several activation rows share each weight row (prefill). The
 * 4-row kernels and the definition they must match bit for bit are in
 * qdot.c; the helpers both use are in qdot_int.h.
 */
#include "engine/qpanel.h"
#include "engine/qdot_int.h"
#include "base/mem.h"
#include "engine/isa.h"
#include "model/quant.h"
#include "model/safetensors.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* The float operations are the ones written: no contraction into FMAs. */
#pragma GCC optimize("fp-contract=off")

#if defined(__x86_64__)

/*
 * AVX2 GEMM for the K types with many activation rows (prefill): a panel
 * of 8 weight rows is repacked once per product so that dword lane r of a
 * register holds 4 consecutive codes of row r; an activation word (4
 * codes) broadcast to all lanes then gives, with vpmaddubsw, the pair sums
 * of 8 outputs at once. The pair sums of a slice (Q4_K: 8 words; Q5_K and
 * Q6_K fewer, see below) add up in int16 before one vpmaddwd by the
 * slice's scales: one multiply per 32 products instead of the 4-row
 * kernels' two, and no per-row decode or lane reduction. The int16 sums
 * cannot overflow: a pair sum is at most 2 * 15 * 127 = 3810 in Q4_K (8 of
 * them 30480), 2 * 31 * 127 = 7874 in Q5_K (4: 31496), 2 * 63 * 127 =
 * 16002 in Q6_K (2: 32004), and nothing saturates. Same integers, same
 * float operations per output as the 4-row kernels and the definition.
 *
 * Panel layout, per super-block (8 rows):
 *   Q4_K / Q5_K: u8 w[8 slices][8 words][8 rows][4], i32 sc[8][8]
 *     (sc | sc << 16 as int16, for vpmaddwd), i32 mp[4][8] (mins m_{2t} |
 *     m_{2t+1} << 16, against the activation's slice sums b2), f32 d[8],
 *     f32 dmin[8];
 *   Q6_K: u8 w[8][8][8][4] (codes 0..63), i32 sc[16 groups][8] (signed,
 *     both int16 halves), i32 sp[8][8] (sc_{2t} | sc_{2t+1} << 16, against
 *     the 16-sums bs), f32 d[8].
 */
#define PR2 8 /* weight rows per AVX2 panel */
#define P4A_BLK (2048 + 256 + 128 + 64)
#define P6A_BLK (2048 + 512 + 256 + 64)

/* 8 rows of 32 bytes (row r at src[r]) to 8 registers: out + 32 g holds
 * word g (bytes 4g..4g+3) of rows 0..7. An 8 x 8 transpose of dwords. */
TGT2 static inline void transpose8x8(const uint8_t *const *src, uint8_t *out)
{
	__m256i A[8], t[8], u[8];
#pragma GCC unroll 8
	for (int j = 0; j < 8; j++)
		A[j] = _mm256_loadu_si256((const __m256i *)src[j]);
#pragma GCC unroll 4
	for (int j = 0; j < 8; j += 2) {
		t[j] = _mm256_unpacklo_epi32(A[j], A[j + 1]);
		t[j + 1] = _mm256_unpackhi_epi32(A[j], A[j + 1]);
	}
#pragma GCC unroll 2
	for (int j = 0; j < 8; j += 4) {
		u[j] = _mm256_unpacklo_epi64(t[j], t[j + 2]);
		u[j + 1] = _mm256_unpackhi_epi64(t[j], t[j + 2]);
		u[j + 2] = _mm256_unpacklo_epi64(t[j + 1], t[j + 3]);
		u[j + 3] = _mm256_unpackhi_epi64(t[j + 1], t[j + 3]);
	}
#pragma GCC unroll 4
	for (int k = 0; k < 4; k++) {
		_mm256_store_si256((__m256i *)(out + 32 * k), _mm256_permute2x128_si256(u[k], u[k + 4], 0x20));
		_mm256_store_si256((__m256i *)(out + 32 * (k + 4)), _mm256_permute2x128_si256(u[k], u[k + 4], 0x31));
	}
}

/* The 256 codes of a Q4_K / Q5_K super-block in element order. */
TGT2 static inline void q45_k_codes(const int q5, const uint8_t *blk, uint8_t *codes)
{
	const __m256i m4 = _mm256_set1_epi8(0x0F);
	const uint8_t *qs = blk + (q5 ? 48 : 16);
	const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
#pragma GCC unroll 4
	for (int ch = 0; ch < 4; ch++) {
		const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * ch));
		__m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
		if (q5) {
			lo = _mm256_or_si256(lo, bit_to(qh, 2 * ch, 4));
			hi = _mm256_or_si256(hi, bit_to(qh, 2 * ch + 1, 4));
		}
		_mm256_store_si256((__m256i *)(codes + 64 * ch), lo);
		_mm256_store_si256((__m256i *)(codes + 64 * ch + 32), hi);
	}
}

/* The 256 codes (0..63) of a Q6_K super-block in element order. */
TGT2 static inline void q6_k_codes(const uint8_t *blk, uint8_t *codes)
{
	const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
#pragma GCC unroll 2
	for (int n = 0; n < 2; n++) {
		const uint8_t *ql = blk + 64 * n;
		const __m256i hb = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
#pragma GCC unroll 4
		for (int part = 0; part < 4; part++) {
			const __m256i lo = _mm256_loadu_si256((const __m256i *)(ql + ((part & 1) ? 32 : 0)));
			const __m256i low = part < 2 ? _mm256_and_si256(lo, m4) : _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4);
			const __m256i hi2 = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * part), m3);
			_mm256_store_si256((__m256i *)(codes + 128 * n + 32 * part), _mm256_or_si256(low, _mm256_slli_epi16(hi2, 4)));
		}
	}
}

static inline int32_t pair16(int lo, int hi)
{
	return (int32_t)((uint32_t)(uint16_t)lo | ((uint32_t)(uint16_t)hi << 16));
}

/* 8 f16 scales to f32 with one vcvtph2ps: exact, a NaN quieted as h2f()
 * gives it (no scalar call in the packers: docs/engine.md). */
TGT2 static inline void scales8(const uint16_t *h, float *d)
{
	_mm256_storeu_ps(d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)));
}

/* Codes of 8 rows (element order, codes[r]) into the panel's words. */
TGT2 static void pack8_words(uint8_t (*codes)[256], uint8_t *o)
{
	for (int s = 0; s < 8; s++) {
		const uint8_t *src[PR2];
		for (int r = 0; r < PR2; r++)
			src[r] = codes[r] + 32 * s;
		transpose8x8(src, o + 256 * s);
	}
}

TGT2 static void pack8_q45_k(const int q5, const uint8_t *const *wr, int nb, uint8_t *pk)
{
	const size_t bb = q5 ? 176 : 144;
	uint8_t codes[PR2][256] __attribute__((aligned(32)));
	for (int b = 0; b < nb; b++) {
		uint8_t *o = pk + (size_t)b * P4A_BLK;
		int32_t *sc = (int32_t *)(o + 2048), *mp = sc + 8 * PR2;
		float *d = (float *)(mp + 4 * PR2), *dm = d + PR2;
		uint16_t hd[PR2], hm[PR2];
		for (int r = 0; r < PR2; r++) {
			const uint8_t *blk = wr[r] + bb * (size_t)b;
			uint8_t s6[8], m[8];
			for (int s = 0; s < 8; s++) {
				kq_scale_min_k4(blk + 4, s, &s6[s], &m[s]);
				sc[PR2 * s + r] = pair16(s6[s], s6[s]);
			}
			for (int t = 0; t < 4; t++)
				mp[PR2 * t + r] = pair16(m[2 * t], m[2 * t + 1]);
			memcpy(&hd[r], blk, 2);
			memcpy(&hm[r], blk + 2, 2);
			q45_k_codes(q5, blk, codes[r]);
		}
		scales8(hd, d);
		scales8(hm, dm);
		pack8_words(codes, o);
	}
}

TGT2 static void pack8_q6_k(const uint8_t *const *wr, int nb, uint8_t *pk)
{
	uint8_t codes[PR2][256] __attribute__((aligned(32)));
	for (int b = 0; b < nb; b++) {
		uint8_t *o = pk + (size_t)b * P6A_BLK;
		int32_t *sc = (int32_t *)(o + 2048), *sp = sc + 16 * PR2;
		float *d = (float *)(sp + 8 * PR2);
		uint16_t hd[PR2];
		for (int r = 0; r < PR2; r++) {
			const uint8_t *blk = wr[r] + 210 * (size_t)b;
			const int8_t *s8 = (const int8_t *)(blk + 192);
			for (int g = 0; g < 16; g++)
				sc[PR2 * g + r] = pair16(s8[g], s8[g]);
			for (int t = 0; t < 8; t++)
				sp[PR2 * t + r] = pair16(s8[2 * t], s8[2 * t + 1]);
			memcpy(&hd[r], blk + 208, 2);
			q6_k_codes(blk, codes[r]);
		}
		scales8(hd, d);
		pack8_words(codes, o);
	}
}

/* The activation word at p broadcast to the 8 lanes. */
TGT2 static inline __m256i xword(const uint8_t *p)
{
	int32_t v;
	memcpy(&v, p, 4);
	return _mm256_set1_epi32(v);
}

/* Q4_K (q5 = 0) and Q5_K (q5 = 1): 8 outputs for each of mr <= 4
 * activation rows; the chains acc and c of qdot.h, lane r: weight row r. */
TGT2 static AINL2 void q45_k_gemm8_t(const uint8_t *pk, int K, const uint8_t *a, size_t astride, const int mr,
				     const int q5, float *out)
{
	const int nb = K / 256;
	const uint8_t *b2p = a + K + (size_t)nb * 4 + (size_t)(K / 16) * 2, *dxp = a + K;
	__m256 acc[AMR], c[AMR];
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		acc[i] = c[i] = _mm256_setzero_ps();
	for (int b = 0; b < nb; b++) {
		const uint8_t *o = pk + (size_t)b * P4A_BLK;
		const int32_t *sc = (const int32_t *)(o + 2048), *mp = sc + 8 * PR2;
		const float *d = (const float *)(mp + 4 * PR2);
		const uint8_t *xb = a + 256 * (size_t)b;
		__m256i S[AMR], C[AMR];
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++)
			S[i] = C[i] = _mm256_setzero_si256();
		for (int s = 0; s < 8; s++) {
			const __m256i scv = _mm256_load_si256((const __m256i *)(sc + PR2 * s));
			__m256i t[AMR];
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++)
				t[i] = _mm256_setzero_si256();
#pragma GCC unroll 4
			for (int g = 0; g < 8; g++) {
				const __m256i w = _mm256_load_si256((const __m256i *)(o + 256 * s + 32 * g));
#pragma GCC unroll 4
				for (int i = 0; i < mr; i++)
					t[i] = _mm256_add_epi16(t[i],
								_mm256_maddubs_epi16(w, xword(xb + (size_t)i * astride + 32 * s + 4 * g)));
				if (g == 7 || (q5 && g == 3)) { /* Q5_K: 4 pair sums at most in int16 */
#pragma GCC unroll 4
					for (int i = 0; i < mr; i++) {
						S[i] = _mm256_add_epi32(S[i], _mm256_madd_epi16(t[i], scv));
						t[i] = _mm256_setzero_si256();
					}
				}
			}
		}
#pragma GCC unroll 4
		for (int tp = 0; tp < 4; tp++) {
			const __m256i mv = _mm256_load_si256((const __m256i *)(mp + PR2 * tp));
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++)
				C[i] = _mm256_add_epi32(
					C[i], _mm256_madd_epi16(mv, xword(b2p + (size_t)i * astride + 2 * (8 * (size_t)b + 2 * tp))));
		}
		const __m256 dv = _mm256_load_ps(d), dmv = _mm256_load_ps(d + PR2);
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			float dx;
			memcpy(&dx, dxp + (size_t)i * astride + 4 * (size_t)b, 4);
			const __m256 dxv = _mm256_set1_ps(dx);
			acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dv, dxv), _mm256_cvtepi32_ps(S[i]), acc[i]);
			c[i] = _mm256_fmadd_ps(_mm256_mul_ps(dmv, dxv), _mm256_cvtepi32_ps(C[i]), c[i]);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		_mm256_storeu_ps(out + PR2 * i, _mm256_sub_ps(acc[i], c[i]));
}

/* Q6_K: S = sum_g sc_g (u . x)_g - 32 sum_g sc_g bs_g, acc alone. */
TGT2 static AINL2 void q6_k_gemm8_t(const uint8_t *pk, int K, const uint8_t *a, size_t astride, const int mr,
				    float *out)
{
	const int nb = K / 256;
	const uint8_t *bsp = a + K + (size_t)nb * 4, *dxp = a + K;
	__m256 acc[AMR];
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		acc[i] = _mm256_setzero_ps();
	for (int b = 0; b < nb; b++) {
		const uint8_t *o = pk + (size_t)b * P6A_BLK;
		const int32_t *sc = (const int32_t *)(o + 2048), *sp = sc + 16 * PR2;
		const float *d = (const float *)(sp + 8 * PR2);
		const uint8_t *xb = a + 256 * (size_t)b;
		__m256i S[AMR], O[AMR];
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++)
			S[i] = O[i] = _mm256_setzero_si256();
		/* pairs of words h: half of group h / 2; words 2h and 2h + 1 of
		 * the block sit at o + 64 h, their activation codes at xb + 8 h */
#pragma GCC unroll 1
		for (int h = 0; h < 32; h++) {
			const __m256i scv = _mm256_load_si256((const __m256i *)(sc + PR2 * (h >> 1)));
			const __m256i w0 = _mm256_load_si256((const __m256i *)(o + 64 * h));
			const __m256i w1 = _mm256_load_si256((const __m256i *)(o + 64 * h + 32));
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++) {
				const uint8_t *x = xb + (size_t)i * astride + 8 * h;
				const __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(w0, xword(x)),
								   _mm256_maddubs_epi16(w1, xword(x + 4)));
				S[i] = _mm256_add_epi32(S[i], _mm256_madd_epi16(t, scv));
			}
		}
#pragma GCC unroll 8
		for (int tp = 0; tp < 8; tp++) {
			const __m256i sv = _mm256_load_si256((const __m256i *)(sp + PR2 * tp));
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++)
				O[i] = _mm256_add_epi32(
					O[i], _mm256_madd_epi16(sv, xword(bsp + (size_t)i * astride + 2 * (16 * (size_t)b + 2 * tp))));
		}
		const __m256 dv = _mm256_load_ps(d);
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			float dx;
			memcpy(&dx, dxp + (size_t)i * astride + 4 * (size_t)b, 4);
			acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dv, _mm256_set1_ps(dx)),
						 _mm256_cvtepi32_ps(_mm256_sub_epi32(S[i], _mm256_slli_epi32(O[i], 5))), acc[i]);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		_mm256_storeu_ps(out + PR2 * i, acc[i]);
}

/* One call per activation tile of mr <= 4 rows: 8 outputs a row. */
TGT2 static void k_gemm8(const int dt, const uint8_t *pk, int K, const uint8_t *a, size_t astride, int mr,
			 float *out)
{
	switch (dt * 4 + mr - 1) {
#define K8_CASE(DT, MR, CALL)                                                                                    \
	case DT * 4 + MR - 1: CALL; break;
	K8_CASE(KV_DT_Q4_K, 1, q45_k_gemm8_t(pk, K, a, astride, 1, 0, out))
	K8_CASE(KV_DT_Q4_K, 2, q45_k_gemm8_t(pk, K, a, astride, 2, 0, out))
	K8_CASE(KV_DT_Q4_K, 3, q45_k_gemm8_t(pk, K, a, astride, 3, 0, out))
	K8_CASE(KV_DT_Q4_K, 4, q45_k_gemm8_t(pk, K, a, astride, 4, 0, out))
	K8_CASE(KV_DT_Q5_K, 1, q45_k_gemm8_t(pk, K, a, astride, 1, 1, out))
	K8_CASE(KV_DT_Q5_K, 2, q45_k_gemm8_t(pk, K, a, astride, 2, 1, out))
	K8_CASE(KV_DT_Q5_K, 3, q45_k_gemm8_t(pk, K, a, astride, 3, 1, out))
	K8_CASE(KV_DT_Q5_K, 4, q45_k_gemm8_t(pk, K, a, astride, 4, 1, out))
	K8_CASE(KV_DT_Q6_K, 1, q6_k_gemm8_t(pk, K, a, astride, 1, out))
	K8_CASE(KV_DT_Q6_K, 2, q6_k_gemm8_t(pk, K, a, astride, 2, out))
	K8_CASE(KV_DT_Q6_K, 3, q6_k_gemm8_t(pk, K, a, astride, 3, out))
	K8_CASE(KV_DT_Q6_K, 4, q6_k_gemm8_t(pk, K, a, astride, 4, out))
#undef K8_CASE
	default: break;
	}
}

/*
 * AVX-512 VNNI GEMM: a panel of 16 weight rows is repacked once so that
 * lane r of a register holds 4 consecutive codes of row r; an activation
 * word (4 codes) broadcast to all lanes then gives, with vpdpbusd, the
 * integer dot of 16 outputs at once, and the float step of qdot.h is one
 * vector FMA per block for 16 outputs. Same integers, same float
 * operations per output as the GEMV kernels and the scalar definition.
 */
#define PR 16  /* weight rows per panel */
#define GMR 4  /* activation rows per kernel call */

/* Repacked panel, per block (Q8_0) or super-block (Q4_K):
 *   Q8_0: u8 w[8][16][4] (code + 128), f32 d[16]
 *   Q4_K: u8 w[8 slices][8 words][16][4] (codes 0..15), i32 sc[8][16],
 *         i32 mp[4][16] (mins m_{2t} | m_{2t+1} << 16, for vpdpwssd),
 *         f32 d[16], f32 dmin[16]
 *   Q6_K: u8 w[8 slices][8 words][16][4] (codes 0..63), i32 sc[16 groups][16],
 *         i32 sp[8][16] (scales sc_{2t} | sc_{2t+1} << 16, int16, for
 *         vpdpwssd with the activation's 16-sums), f32 d[16] */
#define P8_BLK (8 * 64 + 64)
#define P6_BLK (64 * 64 + 16 * 64 + 8 * 64 + 64)
#define P4_BLK (64 * 64 + 8 * 64 + 4 * 64 + 64 + 64)
/* Q4_1 / Q5_1: Q4_0's panel (unsigned codes, f32 d[16]), then f32 m[16].
 * Q5_K: Q4_K's (codes 0..31). Q3_K: Q6_K's (codes 0..7, scales minus 32
 * in sc and sp). Q2_K: Q6_K's with the mins' pairs in sp (codes 0..3),
 * then f32 dmin[16]. */
#define P1_BLK (P8_BLK + 64)
#define P2_BLK (P6_BLK + 64)
/* Prepacked Q8_0 (ke_qpanel_pre_*): u8 w[8][16][4] (code + 128), then the
 * 16 rows' f16 scales as the file stores them: the 544 bytes of the 16
 * rows' blocks, so a product streams no more than the rows themselves. */
#define PP8_BLK (512 + 32)
/* Prepacked Q4_0 / Q5_0 / MXFP4: the codes stay nibbles. ggml's byte j
 * of a block holds element j (low nibble) and j + 16 (high), so word h < 4
 * of the 16 rows' qs, transposed, holds word h of the codes in its low
 * nibbles and word h + 4 in its high ones: u8 qs[4 words][16 rows][4],
 * then the scales as stored (Q4_0, Q5_0: f16 [16]; MXFP4: E8M0 [16]), and
 * Q5_0's 5th bits as 8 byte masks, one per code register g (bit 4r + j:
 * row r's element 4g + j): 288 / 352 / 272 bytes, the 16 rows' blocks
 * again. */
#define PP4_BLK(dt) ((dt) == KV_DT_MXFP4 ? 256 + 16 : (dt) == KV_DT_Q5_0 ? 256 + 32 + 64 : 256 + 32)

/* 16 rows of 32 bytes (row r at src[r]) to 8 registers of 64 bytes:
 * out + 64 g holds word g (bytes 4g..4g+3) of rows 0..15, xor-ed with
 * flip. Two 8 x 8 transposes of 4-byte words side by side (rows 0-7 in
 * the low halves of the registers, 8-15 in the high halves). */
TGT5 static inline void transpose16x8(const uint8_t *const *src, uint8_t *out, __m512i flip)
{
	const __m512i lo_idx = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
	const __m512i hi_idx = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
	__m512i A[8], t[8], u[8];
#pragma GCC unroll 8
	for (int j = 0; j < 8; j++)
		A[j] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)src[j])),
					  _mm256_loadu_si256((const __m256i *)src[j + 8]), 1);
#pragma GCC unroll 4
	for (int j = 0; j < 8; j += 2) {
		t[j] = _mm512_unpacklo_epi32(A[j], A[j + 1]);
		t[j + 1] = _mm512_unpackhi_epi32(A[j], A[j + 1]);
	}
#pragma GCC unroll 2
	for (int j = 0; j < 8; j += 4) {
		u[j] = _mm512_unpacklo_epi64(t[j], t[j + 2]);
		u[j + 1] = _mm512_unpackhi_epi64(t[j], t[j + 2]);
		u[j + 2] = _mm512_unpacklo_epi64(t[j + 1], t[j + 3]);
		u[j + 3] = _mm512_unpackhi_epi64(t[j + 1], t[j + 3]);
	}
#pragma GCC unroll 4
	for (int k = 0; k < 4; k++) {
		_mm512_storeu_si512((void *)(out + 64 * k),
				    _mm512_xor_si512(_mm512_permutex2var_epi64(u[k], lo_idx, u[k + 4]), flip));
		_mm512_storeu_si512((void *)(out + 64 * (k + 4)),
				   _mm512_xor_si512(_mm512_permutex2var_epi64(u[k], hi_idx, u[k + 4]), flip));
	}
}

/* 16 f16 scales to f32 with vcvtph2ps: exact, a NaN quieted as h2f()
 * gives it. (The scalar h2f() here, an SSE call in AVX-512 code, cost a
 * Q8_0 panel's pack four times the kernel.) */
TGT5 static inline void scales16(const uint16_t *h, float *d)
{
	_mm512_storeu_ps(d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)));
}

/* Q8_0 panels; pre: the prepacked layout (PP8_BLK, the f16 scales as
 * stored), else P8_BLK's f32 scales. */
TGT5 static void pack_q8_0_t(const uint8_t *const *wr, int nb, uint8_t *pk, const int pre)
{
	const __m512i flip = _mm512_set1_epi8((char)0x80); /* codes + 128: the unsigned operand of vpdpbusd */
	for (int b = 0; b < nb; b++) {
		uint8_t *o = pk + (size_t)b * (pre ? PP8_BLK : P8_BLK);
		const uint8_t *src[PR];
		uint16_t h[PR];
		for (int r = 0; r < PR; r++) {
			src[r] = wr[r] + 34 * (size_t)b + 2;
			memcpy(&h[r], src[r] - 2, 2);
		}
		if (pre)
			memcpy(o + 512, h, sizeof h);
		else
			scales16(h, (float *)(o + 512));
		transpose16x8(src, o, flip);
	}
}

TGT5 static void pack_q8_0(const uint8_t *const *wr, int nb, uint8_t *pk)
{
	pack_q8_0_t(wr, nb, pk, 0);
}

/* Q4_0 / Q5_0 / MXFP4 panel: the layout of Q8_0's, unsigned codes (no
 * flip); Q4_1 / Q5_1 add their mins. */
TGT5 static void pack_q0(int dt, const uint8_t *const *wr, int nb, uint8_t *pk)
{
	const int bb = q0_bytes(dt), q1 = q0_is1(dt);
	const size_t pb = q1 ? P1_BLK : P8_BLK;
	uint8_t codes[PR][32] __attribute__((aligned(32)));
	for (int b = 0; b < nb; b++) {
		uint8_t *o = pk + (size_t)b * pb;
		const uint8_t *src[PR];
		uint16_t h[PR], hm[PR];
		for (int r = 0; r < PR; r++) {
			const uint8_t *blk = wr[r] + (size_t)bb * b;
			_mm256_store_si256((__m256i *)codes[r], q0_codes_avx2(dt, blk));
			src[r] = codes[r];
			memcpy(&h[r], blk, 2);
			memcpy(&hm[r], blk + 2, 2);
		}
		if (dt == KV_DT_MXFP4) /* E8M0 bytes, not f16 */
			for (int r = 0; r < PR; r++)
				((float *)(o + 512))[r] = kq_e8m0_half(wr[r][(size_t)bb * b]);
		else
			scales16(h, (float *)(o + 512));
		if (q1)
			scales16(hm, (float *)(o + 576));
		transpose16x8(src, o, _mm512_setzero_si512());
	}
}

/* Q4_K and Q5_K (q5: the 5th bit of slice s from bit s of qh). */
TGT5 static void pack_q45_k(const int q5, const uint8_t *const *wr, int nb, uint8_t *pk)
{
	const size_t bb = q5 ? 176 : 144;
	uint8_t codes[PR][256] __attribute__((aligned(32))); /* element order */
	for (int b = 0; b < nb; b++) {
		uint8_t *o = pk + (size_t)b * P4_BLK;
		int32_t *sc = (int32_t *)(o + 4096), *mp = sc + 8 * 16;
		float *d = (float *)(mp + 4 * 16), *dm = d + 16;
		uint16_t hd[PR], hm[PR];
		for (int r = 0; r < PR; r++) {
			const uint8_t *blk = wr[r] + bb * (size_t)b;
			uint8_t m[8];
			for (int s = 0; s < 8; s++) {
				uint8_t s6;
				kq_scale_min_k4(blk + 4, s, &s6, &m[s]);
				sc[16 * s + r] = s6;
			}
			q45_k_codes(q5, blk, codes[r]);
			for (int t = 0; t < 4; t++)
				mp[16 * t + r] = pair16(m[2 * t], m[2 * t + 1]);
			memcpy(&hd[r], blk, 2);
			memcpy(&hm[r], blk + 2, 2);
		}
		scales16(hd, d);
		scales16(hm, dm);
		for (int s = 0; s < 8; s++) {
			const uint8_t *src[PR];
			for (int r = 0; r < PR; r++)
				src[r] = codes[r] + 32 * s;
			transpose16x8(src, o + 512 * s, _mm512_setzero_si512());
		}
	}
}

TGT5 static void pack_q6_k(const uint8_t *const *wr, int nb, uint8_t *pk)
{
	uint8_t codes[PR][256] __attribute__((aligned(32))); /* element order */
	for (int b = 0; b < nb; b++) {
		uint8_t *o = pk + (size_t)b * P6_BLK;
		int32_t *sc = (int32_t *)(o + 4096), *sp = sc + 16 * 16;
		float *d = (float *)(sp + 8 * 16);
		uint16_t hd[PR];
		for (int r = 0; r < PR; r++) {
			const uint8_t *blk = wr[r] + 210 * (size_t)b;
			const int8_t *s8 = (const int8_t *)(blk + 192);
			q6_k_codes(blk, codes[r]);
			for (int g = 0; g < 16; g++)
				sc[16 * g + r] = s8[g];
			for (int t = 0; t < 8; t++)
				sp[16 * t + r] = pair16(s8[2 * t], s8[2 * t + 1]);
			memcpy(&hd[r], blk + 208, 2);
		}
		scales16(hd, d);
		for (int s = 0; s < 8; s++) {
			const uint8_t *src[PR];
			for (int r = 0; r < PR; r++)
				src[r] = codes[r] + 32 * s;
			transpose16x8(src, o + 512 * s, _mm512_setzero_si512());
		}
	}
}

/* Q3_K / Q2_K panels (layouts above). */
TGT5 static void pack_g16(const int dt, const uint8_t *const *wr, int nb, uint8_t *pk)
{
	const int q3 = dt == KV_DT_Q3_K;
	const size_t bb = q3 ? 110 : 84, pb = q3 ? P6_BLK : P2_BLK;
	uint8_t codes[PR][256] __attribute__((aligned(32))); /* element order */
	for (int b = 0; b < nb; b++) {
		uint8_t *o = pk + (size_t)b * pb;
		int32_t *sc = (int32_t *)(o + 4096), *sp = sc + 16 * 16;
		float *d = (float *)(sp + 8 * 16), *dm = d + 16;
		uint16_t hd[PR], hm[PR];
		for (int r = 0; r < PR; r++) {
			const uint8_t *blk = wr[r] + bb * (size_t)b;
#pragma GCC unroll 8
			for (int s = 0; s < 8; s++)
				_mm256_store_si256((__m256i *)(codes[r] + 32 * s), g16_codes(dt, blk, s));
			int16_t s16[16], p16[16];
			if (q3) {
				int8_t s8[16];
				q3k_scales(blk, s8);
				for (int g = 0; g < 16; g++)
					s16[g] = p16[g] = s8[g];
				memcpy(&hd[r], blk + 108, 2);
			} else {
				for (int g = 0; g < 16; g++) {
					s16[g] = (int16_t)(blk[g] & 15);
					p16[g] = (int16_t)(blk[g] >> 4);
				}
				memcpy(&hd[r], blk + 80, 2);
				memcpy(&hm[r], blk + 82, 2);
			}
			for (int g = 0; g < 16; g++)
				sc[16 * g + r] = s16[g];
			for (int t = 0; t < 8; t++)
				sp[16 * t + r] = (int32_t)((uint32_t)(uint16_t)p16[2 * t] | ((uint32_t)(uint16_t)p16[2 * t + 1] << 16));
		}
		scales16(hd, d);
		if (!q3)
			scales16(hm, dm);
		for (int s = 0; s < 8; s++) {
			const uint8_t *src[PR];
			for (int r = 0; r < PR; r++)
				src[r] = codes[r] + 32 * s;
			transpose16x8(src, o + 512 * s, _mm512_setzero_si512());
		}
	}
}



/* Q8_0 (sh = 0: codes + 128 against -128 sum q) and Q4_0 / Q5_0 (sh = 4 / 3:
 * unsigned codes against -8 / -16 sum q). */
/* Sixteen MXFP4 scales (kq_e8m0_half, exact): 0x00200000 << e below 2,
 * (e - 1) << 23 from 2 on. */
TGT5 static inline __m512 e8m0_16(const uint8_t *p)
{
	const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
	const __m512i lo = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
	const __m512i hi = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
	return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2)), hi, lo));
}

/* pre: the panels' layout, PRE_NONE (P8_BLK / P1_BLK, packed per call)
 * or a prepacked one (PP8_BLK; PP4_BLK, whose registers of nibbles give
 * two code words each by mask and shift, MXFP4's through its table of
 * unsigned codes as q0_codes gives them). */
enum { PRE_NONE, PRE_Q8_0, PRE_Q4_0, PRE_Q5_0, PRE_MXFP4 };

TGT5 static AINL void q8_0_gemm16_t(const uint8_t *pk, int K, const uint8_t *a, size_t astride, const int mr,
				    const int sh, const int q1, const int pre, float *out)
{
	const int nb = K / 32, nib = pre == PRE_Q4_0 || pre == PRE_Q5_0 || pre == PRE_MXFP4;
	const size_t pb = pre == PRE_Q8_0 ? PP8_BLK
			  : nib	       ? (size_t)PP4_BLK(pre == PRE_MXFP4 ? KV_DT_MXFP4 : pre == PRE_Q5_0 ? KV_DT_Q5_0 : KV_DT_Q4_0)
			  : q1	       ? P1_BLK
					 : P8_BLK;
	const uint8_t *ns = a + K + (size_t)(K / 32) * 4, *dxp = a + K;
	const __m512i m4 = _mm512_set1_epi8(0x0f);
	const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)q_mxfp4_u));
	__m512 acc[GMR];
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		acc[i] = _mm512_setzero_ps();
	for (int b = 0; b < nb; b++) {
		const uint8_t *o = pk + (size_t)b * pb;
		/* two integer chains per row (even / odd words): half the latency */
		__m512i t[GMR], t2[GMR];
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) { /* -128 sum q cancels the +128 of the weights' codes */
			t[i] = q1 ? _mm512_setzero_si512()
				  : _mm512_set1_epi32(word_at(ns + (size_t)i * astride + 4 * (size_t)b) >> sh);
			t2[i] = _mm512_setzero_si512();
		}
#pragma GCC unroll 8
		for (int g = 0; g < 8; g++) {
			__m512i w;
			if (nib && g >= 4) /* word g - 4's high nibbles */
				w = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512((const void *)(o + 64 * (g - 4))), 4), m4);
			else if (nib)
				w = _mm512_and_si512(_mm512_loadu_si512((const void *)(o + 64 * g)), m4);
			else
				w = pre ? _mm512_loadu_si512((const void *)(o + 64 * g)) : _mm512_load_si512((const void *)(o + 64 * g));
			if (pre == PRE_MXFP4)
				w = _mm512_shuffle_epi8(lut, w);
			if (pre == PRE_Q5_0) { /* + 16 where the 5th bit is set */
				uint64_t hm;
				memcpy(&hm, o + 288 + 8 * g, 8);
				w = _mm512_mask_add_epi8(w, (__mmask64)hm, w, _mm512_set1_epi8(16));
			}
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++) {
				const __m512i xw = _mm512_set1_epi32(word_at(a + (size_t)i * astride + 32 * (size_t)b + 4 * g));
				if (g & 1)
					t2[i] = _mm512_dpbusd_epi32(t2[i], w, xw);
				else
					t[i] = _mm512_dpbusd_epi32(t[i], w, xw);
			}
		}
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++)
			t[i] = _mm512_add_epi32(t[i], t2[i]);
		/* the scales as stored: f16 through vcvtph2ps (exact, a NaN quieted
		 * as scales16 gives it), E8M0 through e8m0_16 */
		const __m512 dw = pre == PRE_MXFP4 ? e8m0_16(o + 256)
				  : nib		     ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + 256)))
				  : pre		     ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + 512)))
						     : _mm512_load_ps((const float *)(o + 512));
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			float dx;
			memcpy(&dx, dxp + (size_t)i * astride + 4 * (size_t)b, 4);
			acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(dx)), _mm512_cvtepi32_ps(t[i]), acc[i]);
			if (q1) { /* the min times sum qx = -ns / 128 */
				const float sq = (float)(-(word_at(ns + (size_t)i * astride + 4 * (size_t)b) / 128));
				acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps((const float *)(o + 576)), _mm512_set1_ps(dx)),
							 _mm512_set1_ps(sq), acc[i]);
			}
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		_mm512_storeu_ps(out + PR * i, acc[i]);
}

TGT5 static AINL void q4_k_gemm16_t(const uint8_t *pk, int K, const uint8_t *a, size_t astride, const int mr,
				    float *out)
{
	const int nb = K / 256;
	const uint8_t *b2p = a + K + (size_t)(K / 256) * 4 + (size_t)(K / 16) * 2, *dxp = a + K;
	__m512 acc[GMR], c[GMR];
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		acc[i] = c[i] = _mm512_setzero_ps();
	for (int b = 0; b < nb; b++) {
		const uint8_t *o = pk + (size_t)b * P4_BLK;
		const int32_t *sc = (const int32_t *)(o + 4096), *mp = sc + 8 * 16;
		const float *d = (const float *)(mp + 4 * 16);
		__m512i S[GMR], C[GMR];
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++)
			S[i] = C[i] = _mm512_setzero_si512();
		for (int s = 0; s < 8; s++) {
			__m512i t[GMR], t2[GMR];
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++)
				t[i] = t2[i] = _mm512_setzero_si512();
#pragma GCC unroll 8
			for (int g = 0; g < 8; g++) {
				const __m512i w = _mm512_load_si512((const void *)(o + 512 * s + 64 * g));
#pragma GCC unroll 4
				for (int i = 0; i < mr; i++) {
					const __m512i xw =
						_mm512_set1_epi32(word_at(a + (size_t)i * astride + 256 * (size_t)b + 32 * s + 4 * g));
					if (g & 1)
						t2[i] = _mm512_dpbusd_epi32(t2[i], w, xw);
					else
						t[i] = _mm512_dpbusd_epi32(t[i], w, xw);
				}
			}
			const __m512i scv = _mm512_load_si512((const void *)(sc + 16 * s));
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++)
				S[i] = _mm512_add_epi32(S[i], _mm512_mullo_epi32(_mm512_add_epi32(t[i], t2[i]), scv));
		}
#pragma GCC unroll 4
		for (int tp = 0; tp < 4; tp++) {
			const __m512i mv = _mm512_load_si512((const void *)(mp + 16 * tp));
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++)
				C[i] = _mm512_dpwssd_epi32(C[i], mv,
							   _mm512_set1_epi32(word_at(b2p + (size_t)i * astride + 2 * (8 * (size_t)b + 2 * tp))));
		}
		const __m512 dv = _mm512_load_ps(d), dmv = _mm512_load_ps(d + 16);
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			float dx;
			memcpy(&dx, dxp + (size_t)i * astride + 4 * (size_t)b, 4);
			const __m512 dxv = _mm512_set1_ps(dx);
			acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dv, dxv), _mm512_cvtepi32_ps(S[i]), acc[i]);
			c[i] = _mm512_fmadd_ps(_mm512_mul_ps(dmv, dxv), _mm512_cvtepi32_ps(C[i]), c[i]);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		_mm512_storeu_ps(out + PR * i, _mm512_sub_ps(acc[i], c[i]));
}

/* Q6_K (mode 5: S - 32 sum sc bs), Q3_K (mode 2: S - 4 sum sc bs) and
 * Q2_K (mode 0: acc from S, c from sum m bs, acc - c). */
TGT5 static AINL void q6_k_gemm16_t(const uint8_t *pk, int K, const uint8_t *a, size_t astride, const int mr,
				    const int mode, float *out)
{
	const size_t pb = mode ? P6_BLK : P2_BLK;
	const int nb = K / 256;
	const uint8_t *bsp = a + K + (size_t)(K / 256) * 4, *dxp = a + K;
	__m512 acc[GMR], c[GMR];
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		acc[i] = c[i] = _mm512_setzero_ps();
	for (int b = 0; b < nb; b++) {
		const uint8_t *o = pk + (size_t)b * pb;
		const int32_t *sc = (const int32_t *)(o + 4096), *sp = sc + 16 * 16;
		const float *d = (const float *)(sp + 8 * 16);
		__m512i S[GMR], O[GMR];
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++)
			S[i] = O[i] = _mm512_setzero_si512();
		for (int g16 = 0; g16 < 16; g16++) {
			const int s = g16 >> 1, h = g16 & 1;
			__m512i t[GMR], t2[GMR];
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++)
				t[i] = t2[i] = _mm512_setzero_si512();
#pragma GCC unroll 4
			for (int wd = 0; wd < 4; wd++) {
				const int g = 4 * h + wd;
				const __m512i w = _mm512_load_si512((const void *)(o + 512 * s + 64 * g));
#pragma GCC unroll 4
				for (int i = 0; i < mr; i++) {
					const __m512i xw =
						_mm512_set1_epi32(word_at(a + (size_t)i * astride + 256 * (size_t)b + 32 * s + 4 * g));
					if (wd & 1)
						t2[i] = _mm512_dpbusd_epi32(t2[i], w, xw);
					else
						t[i] = _mm512_dpbusd_epi32(t[i], w, xw);
				}
			}
			const __m512i scv = _mm512_load_si512((const void *)(sc + 16 * g16));
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++)
				S[i] = _mm512_add_epi32(S[i], _mm512_mullo_epi32(_mm512_add_epi32(t[i], t2[i]), scv));
		}
#pragma GCC unroll 8
		for (int tp = 0; tp < 8; tp++) {
			const __m512i sv = _mm512_load_si512((const void *)(sp + 16 * tp));
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++)
				O[i] = _mm512_dpwssd_epi32(O[i], sv,
							   _mm512_set1_epi32(word_at(bsp + (size_t)i * astride + 2 * (16 * (size_t)b + 2 * tp))));
		}
		const __m512 dv = _mm512_load_ps(d);
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			float dx;
			memcpy(&dx, dxp + (size_t)i * astride + 4 * (size_t)b, 4);
			const __m512 dxv = _mm512_set1_ps(dx);
			if (mode) {
				__m512i St = _mm512_sub_epi32(S[i], _mm512_slli_epi32(O[i], mode)); /* the -32 / -4 offset */
				acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dv, dxv), _mm512_cvtepi32_ps(St), acc[i]);
			} else {
				acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dv, dxv), _mm512_cvtepi32_ps(S[i]), acc[i]);
				c[i] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(d + 16), dxv), _mm512_cvtepi32_ps(O[i]), c[i]);
			}
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		_mm512_storeu_ps(out + PR * i, mode ? acc[i] : _mm512_sub_ps(acc[i], c[i]));
}

#define G16_DISPATCH(NAME, MODE)                                                                        \
	TGT5 static void NAME(const uint8_t *pk, int K, const uint8_t *a, size_t astride, int mr, float *out) \
	{                                                                                               \
		switch (mr) {                                                                           \
		case 1: q6_k_gemm16_t(pk, K, a, astride, 1, MODE, out); break;                          \
		case 2: q6_k_gemm16_t(pk, K, a, astride, 2, MODE, out); break;                          \
		case 3: q6_k_gemm16_t(pk, K, a, astride, 3, MODE, out); break;                          \
		default: q6_k_gemm16_t(pk, K, a, astride, 4, MODE, out); break;                         \
		}                                                                                       \
	}
G16_DISPATCH(q6_k_gemm16, 5)
G16_DISPATCH(q3_k_gemm16, 2)
G16_DISPATCH(q2_k_gemm16, 0)

TGT5 static void q8_0_gemm16(const uint8_t *pk, int K, const uint8_t *a, size_t astride, int mr, int sh, float *out)
{
	switch (mr) {
	case 1: q8_0_gemm16_t(pk, K, a, astride, 1, sh, 0, PRE_NONE, out); break;
	case 2: q8_0_gemm16_t(pk, K, a, astride, 2, sh, 0, PRE_NONE, out); break;
	case 3: q8_0_gemm16_t(pk, K, a, astride, 3, sh, 0, PRE_NONE, out); break;
	default: q8_0_gemm16_t(pk, K, a, astride, 4, sh, 0, PRE_NONE, out); break;
	}
}

TGT5 static void q1_gemm16(const uint8_t *pk, int K, const uint8_t *a, size_t astride, int mr, float *out)
{
	switch (mr) {
	case 1: q8_0_gemm16_t(pk, K, a, astride, 1, 0, 1, PRE_NONE, out); break;
	case 2: q8_0_gemm16_t(pk, K, a, astride, 2, 0, 1, PRE_NONE, out); break;
	case 3: q8_0_gemm16_t(pk, K, a, astride, 3, 0, 1, PRE_NONE, out); break;
	default: q8_0_gemm16_t(pk, K, a, astride, 4, 0, 1, PRE_NONE, out); break;
	}
}

/* Prepacked panels (PP8_BLK, PP4_BLK) */
#define PRE_CASE(SH, PRE)                                                                   \
	switch (mr) {                                                                       \
	case 1: q8_0_gemm16_t(pk, K, a, astride, 1, SH, 0, PRE, out); break;                \
	case 2: q8_0_gemm16_t(pk, K, a, astride, 2, SH, 0, PRE, out); break;                \
	case 3: q8_0_gemm16_t(pk, K, a, astride, 3, SH, 0, PRE, out); break;                \
	default: q8_0_gemm16_t(pk, K, a, astride, 4, SH, 0, PRE, out); break;               \
	}

TGT5 static void gemm16_pre(int dt, const uint8_t *pk, int K, const uint8_t *a, size_t astride, int mr, float *out)
{
	if (dt == KV_DT_MXFP4)
		PRE_CASE(3, PRE_MXFP4)
	else if (dt == KV_DT_Q4_0)
		PRE_CASE(4, PRE_Q4_0)
	else if (dt == KV_DT_Q5_0)
		PRE_CASE(3, PRE_Q5_0)
	else
		PRE_CASE(0, PRE_Q8_0)
}

TGT5 static void q4_k_gemm16(const uint8_t *pk, int K, const uint8_t *a, size_t astride, int mr, float *out)
{
	switch (mr) {
	case 1: q4_k_gemm16_t(pk, K, a, astride, 1, out); break;
	case 2: q4_k_gemm16_t(pk, K, a, astride, 2, out); break;
	case 3: q4_k_gemm16_t(pk, K, a, astride, 3, out); break;
	default: q4_k_gemm16_t(pk, K, a, astride, 4, out); break;
	}
}

/* Per-thread repack buffer, 64-byte aligned, grown as needed (base/mem.h
 * kv_tls_scratch): a panel of 16 rows, 80 KiB for K = 4096 in Q4_K. */
static uint8_t *pack_buf(size_t bytes)
{
	return kv_tls_scratch(KV_TLS_QDOT_PACK, bytes);
}

/* A panel GEMM: pack(dt, wr, nb, pk) repacks a panel of pr weight rows
 * (wr[r]: row r, nb blocks), tile(dt, pk, K, a, astride, mr, o) gives
 * o[pr * t + r] for mr <= AMR activation rows t. */
typedef void panel_pack_fn(int dt, const uint8_t *const *wr, int nb, uint8_t *pk);
typedef void panel_tile_fn(int dt, const uint8_t *pk, int K, const uint8_t *a, size_t astride, int mr, float *o);

/* VNNI: 16-row panels of every type */
TGT5 static void pack16(int dt, const uint8_t *const *wr, int nb, uint8_t *pk)
{
	if (dt == KV_DT_Q8_0)
		pack_q8_0(wr, nb, pk);
	else if (q_block(dt) == 32)
		pack_q0(dt, wr, nb, pk);
	else if (dt == KV_DT_Q4_K || dt == KV_DT_Q5_K)
		pack_q45_k(dt == KV_DT_Q5_K, wr, nb, pk);
	else if (dt == KV_DT_Q6_K)
		pack_q6_k(wr, nb, pk);
	else
		pack_g16(dt, wr, nb, pk);
}

TGT5 static void gemm16(int dt, const uint8_t *pk, int K, const uint8_t *a, size_t astride, int mr, float *o)
{
	if (dt == KV_DT_Q4_1 || dt == KV_DT_Q5_1)
		q1_gemm16(pk, K, a, astride, mr, o);
	else if (q_block(dt) == 32)
		q8_0_gemm16(pk, K, a, astride, mr, dt == KV_DT_Q8_0 ? 0 : q0_shift(dt), o);
	else if (dt == KV_DT_Q4_K || dt == KV_DT_Q5_K)
		q4_k_gemm16(pk, K, a, astride, mr, o);
	else if (dt == KV_DT_Q6_K)
		q6_k_gemm16(pk, K, a, astride, mr, o);
	else if (dt == KV_DT_Q3_K)
		q3_k_gemm16(pk, K, a, astride, mr, o);
	else
		q2_k_gemm16(pk, K, a, astride, mr, o);
}

/* AVX2: 8-row panels of Q4_K, Q5_K, Q6_K (tiles: k_gemm8) */
TGT2 static void pack8(int dt, const uint8_t *const *wr, int nb, uint8_t *pk)
{
	if (dt == KV_DT_Q6_K)
		pack8_q6_k(wr, nb, pk);
	else
		pack8_q45_k(dt == KV_DT_Q5_K, wr, nb, pk);
}

_Static_assert(GMR == AMR, "the VNNI and AVX2 tiles take the same activation rows");

/* One packed panel pk of pr rows against the m activation rows: outputs
 * y[t * ldy + r] for the panel's first nr rows r. */
static void panel_tiles(int pr, panel_tile_fn *tile, int dt, const uint8_t *pk, int K, const uint8_t *a,
			size_t astride, int m, float *y, size_t ldy, int accum, int nr)
{
	for (int i = 0; i < m; i += AMR) {
		int mr = m - i < AMR ? m - i : AMR;
		float o[AMR * PR];
		tile(dt, pk, K, a + (size_t)i * astride, astride, mr, o);
		for (int t = 0; t < mr; t++) {
			float *yo = y + (size_t)(i + t) * ldy;
			if (nr == pr && !accum)
				memcpy(yo, o + pr * t, sizeof(float) * (size_t)pr);
			else
				for (int r = 0; r < nr; r++)
					put(yo + r, accum, o[pr * t + r]);
		}
	}
}

/* Weight rows [n0, n1) against the m activation rows, panel by panel (a
 * short panel repeats its last row), each repacked once into pk. */
static void panel_gemm(int pr, panel_pack_fn *pack, panel_tile_fn *tile, int dt, const uint8_t *w, size_t wstride,
		       int K, int nb, uint8_t *pk, const uint8_t *a, size_t astride, int m, float *y, size_t ldy,
		       int accum, int n0, int n1)
{
	for (int p0 = n0; p0 < n1; p0 += pr) {
		int nr = n1 - p0 < pr ? n1 - p0 : pr;
		const uint8_t *wr[PR];
		for (int r = 0; r < pr; r++)
			wr[r] = w + (size_t)(p0 + (r < nr ? r : nr - 1)) * wstride;
		pack(dt, wr, nb, pk);
		panel_tiles(pr, tile, dt, pk, K, a, astride, m, y + p0, ldy, accum, nr);
	}
}

int ke_qpanel_gemm(int isa, int dt, const uint8_t *w, size_t wstride, int K, const uint8_t *a, size_t astride, int m,
		   float *y, size_t ldy, int accum, int n0, int n1)
{
	/* repacked 16-row panels when several activation rows share them */
	const int b32 = q_block(dt) == 32; /* Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 */
	const int nbk = b32 ? K / 32 : K / 256;
	const int q1 = b32 && q0_is1(dt), k45 = dt == KV_DT_Q4_K || dt == KV_DT_Q5_K;
	/* below the crossover the repack costs more than it saves: the 4-row
	 * kernels, same numbers; no repack buffer (NULL) the same. Crossovers
	 * on a Zen 4 (2 threads, N x K = 32768 x 4096 streamed from memory,
	 * panels and 4-row kernels alternating, docs/engine.md): 12 rows for
	 * the 32-blocks, 8 for Q4_K / Q5_K, 10 for Q3_K, 17 for Q6_K (its
	 * 4-row kernel took 0.56x the panels' time at M = 8, 0.67x at 9, 0.85x
	 * at 16 and 1.23x at 20) and 20 for Q2_K (0.84x at 16, 1.07x at 24) */
	const int vmin = b32 ? 12 : k45 ? 8 : dt == KV_DT_Q3_K ? 10 : dt == KV_DT_Q6_K ? 17 : 20;
	if (isa == KE_ISA_AVX512 && have_vnni() && m >= vmin) {
		uint8_t *pk = pack_buf((size_t)nbk * (b32		     ? (q1 ? P1_BLK : P8_BLK)
						      : k45		     ? P4_BLK
						      : dt == KV_DT_Q2_K ? P2_BLK
									 : P6_BLK));
		if (pk) {
			panel_gemm(PR, pack16, gemm16, dt, w, wstride, K, nbk, pk, a, astride, m, y, ldy, accum, n0, n1);
			return 1;
		}
	}
	/* the AVX2 panels: from 8 activation rows (Q4_K, Q5_K) or 20 (Q6_K)
	 * they beat the 4-row kernels (one thread, Zen 3, docs/engine.md) */
	if (isa >= KE_ISA_AVX2 && ((k45 && m >= 8) || (dt == KV_DT_Q6_K && m >= 20))) {
		uint8_t *pk = pack_buf((size_t)nbk * (k45 ? P4A_BLK : P6A_BLK));
		if (pk) {
			panel_gemm(PR2, pack8, k_gemm8, dt, w, wstride, K, nbk, pk, a, astride, m, y, ldy, accum, n0, n1);
			return 1;
		}
	}
	return 0;
}

static int pre_takes(int isa, int dt)
{
	return isa == KE_ISA_AVX512 && have_vnni() &&
	       (dt == KV_DT_Q8_0 || dt == KV_DT_Q4_0 || dt == KV_DT_Q5_0 || dt == KV_DT_MXFP4);
}

/* Bytes of one prepacked block of 16 rows. */
static size_t pre_blk(int dt)
{
	return dt == KV_DT_Q8_0 ? PP8_BLK : PP4_BLK(dt);
}

size_t ke_qpanel_pre_bytes(int isa, int dt, int rows, int K)
{
	if (!pre_takes(isa, dt) || rows <= 0 || K <= 0 || K % 32)
		return 0;
	return (size_t)((rows + PR - 1) / PR) * (size_t)(K / 32) * pre_blk(dt);
}

/* The 16 rows' blocks as PP4_BLK panels: a 16 x 4 transpose of the qs
 * words, the scales' bytes as they are, Q5_0's qh regrouped per code
 * register. */
static void pack4_pre(int dt, const uint8_t *const *wr, int nb, uint8_t *pk)
{
	const int bb = q0_bytes(dt), qo = q0_qs(dt), mx = dt == KV_DT_MXFP4, q5 = dt == KV_DT_Q5_0;
	for (int b = 0; b < nb; b++) {
		uint8_t *o = pk + (size_t)b * PP4_BLK(dt);
		uint64_t hm[8] = {0};
		for (int r = 0; r < PR; r++) {
			const uint8_t *blk = wr[r] + (size_t)bb * b;
			for (int h = 0; h < 4; h++)
				memcpy(o + 64 * h + 4 * r, blk + qo + 4 * h, 4);
			memcpy(o + 256 + (mx ? 1 : 2) * r, blk, mx ? 1 : 2);
			if (q5) {
				uint32_t qh;
				memcpy(&qh, blk + q0_qh(dt), 4);
				for (int g = 0; g < 8; g++)
					hm[g] |= (uint64_t)((qh >> (4 * g)) & 0xF) << (4 * r);
			}
		}
		if (q5)
			memcpy(o + 288, hm, sizeof hm);
	}
}

void ke_qpanel_pre_pack(int dt, const uint8_t *w, size_t wstride, int rows, int K, int p0, int p1, uint8_t *out)
{
	const int nb = K / 32;
	for (int p = p0; p < p1; p++) {
		const uint8_t *wr[PR];
		for (int r = 0; r < PR; r++) {
			int n = p * PR + r;
			wr[r] = w + (size_t)(n < rows ? n : rows - 1) * wstride;
		}
		uint8_t *o = out + (size_t)p * (size_t)nb * pre_blk(dt);
		if (dt == KV_DT_Q8_0)
			pack_q8_0_t(wr, nb, o, 1);
		else
			pack4_pre(dt, wr, nb, o);
	}
}

int ke_qpanel_gemm_pre(int isa, int dt, const uint8_t *pk, int K, const uint8_t *a, size_t astride, int m, float *y,
		       size_t ldy, int accum, int n0, int n1)
{
	if (!pk || !pre_takes(isa, dt) || n0 % PR)
		return 0;
	const size_t ps = (size_t)(K / 32) * pre_blk(dt);
	for (int p0 = n0; p0 < n1; p0 += PR)
		panel_tiles(PR, gemm16_pre, dt, pk + (size_t)(p0 / PR) * ps, K, a, astride, m, y + p0, ldy, accum,
			    n1 - p0 < PR ? n1 - p0 : PR);
	return 1;
}

#else

size_t ke_qpanel_pre_bytes(int isa, int dt, int rows, int K)
{
	(void)isa, (void)dt, (void)rows, (void)K;
	return 0;
}

void ke_qpanel_pre_pack(int dt, const uint8_t *w, size_t wstride, int rows, int K, int p0, int p1, uint8_t *out)
{
	(void)dt, (void)w, (void)wstride, (void)rows, (void)K, (void)p0, (void)p1, (void)out;
}

int ke_qpanel_gemm_pre(int isa, int dt, const uint8_t *pk, int K, const uint8_t *a, size_t astride, int m, float *y,
		       size_t ldy, int accum, int n0, int n1)
{
	(void)isa, (void)dt, (void)pk, (void)K, (void)a, (void)astride, (void)m, (void)y, (void)ldy, (void)accum;
	(void)n0, (void)n1;
	return 0;
}

#endif
