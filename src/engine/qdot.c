/*
 * qdot.c - see qdot.h. The scalar functions are the definition; the AVX2
 * and AVX-512 (VNNI) kernels compute the same integers (exact, in any
 * order) and the same float operations in the same order. This file has
 * the activation quantizers, the 4-row kernels (few activation rows:
 * decode) and the dispatch; the repacked panels for many rows are
 * engine/qpanel.c, and the helpers both decode with are qdot_int.h.
 */
#include "engine/qdot.h"
#include "engine/qdot_int.h"
#include "engine/qpanel.h"
#include "engine/isa.h"
#include "model/quant.h"
#include "model/safetensors.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* The float operations are the ones written: no contraction into FMAs. */
#pragma GCC optimize("fp-contract=off")

int ke_qdot_block(int dt)
{
	return q_block(dt);
}

size_t ke_qact_row_bytes(int block, int K)
{
	size_t b = (size_t)K + (size_t)(K / block) * 4 + (block == 256 ? (size_t)(K / 16) * 2 + (size_t)(K / 32) * 2
								     : (size_t)(K / 32) * 4);
	return (b + 63) & ~(size_t)63;
}

/* Where the scales and sums of a row start. */
static inline float *row_d(uint8_t *row, int K)
{
	return (float *)(row + K);
}

/* ns (B = 32, int32) or bs (B = 256, int16; b2 follows at bs + K / 16) */
static inline uint8_t *row_sums(const uint8_t *row, int block, int K)
{
	return (uint8_t *)row + K + (size_t)(K / block) * 4;
}

/* An f16 scale as f32: exact; a NaN comes back quiet, as F16C's vcvtph2ps
 * gives it on the SIMD paths. */
static inline float h2f(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	float f = kv_f16_to_f32(h);
	if (f != f) {
		uint32_t u;
		memcpy(&u, &f, 4);
		u |= 0x00400000u;
		memcpy(&f, &u, 4);
	}
	return f;
}

/* A 32-block's scale: the f16 at its start, or MXFP4's E8M0 byte. */
static inline float q0_d(int dt, const uint8_t *blk)
{
	return dt == KV_DT_MXFP4 ? kq_e8m0_half(blk[0]) : h2f(blk);
}

/* The block's scale from the exact |x| maximum (as bits); 0 when the codes
 * are all zero, with *id the multiplier for the codes. */
static inline float block_scale(uint32_t mb, float *id, int *zero)
{
	float d;
	*zero = 1;
	*id = 0.0f;
	if (mb >= 0x7f800000u) { /* inf or NaN in the block */
		uint32_t nan = 0x7fc00000u;
		memcpy(&d, &nan, 4);
		return d;
	}
	if (mb < 0x00800000u) /* zero or subnormal: nothing worth a code */
		return 0.0f;
	float amax;
	memcpy(&amax, &mb, 4);
	*zero = 0;
	*id = 127.0f / amax;
	return amax / 127.0f;
}

static void quant_scalar(int block, const float *x, int K, uint8_t *row)
{
	int8_t *q = (int8_t *)row;
	float *d = row_d(row, K);
	for (int b = 0; b < K / block; b++) {
		const float *xb = x + (size_t)b * block;
		uint32_t mb = 0;
		for (int k = 0; k < block; k++) {
			uint32_t u;
			memcpy(&u, &xb[k], 4);
			u &= 0x7fffffffu;
			mb = u > mb ? u : mb;
		}
		float id;
		int zero;
		d[b] = block_scale(mb, &id, &zero);
		for (int k = 0; k < block; k++) {
			long r = zero ? 0 : lrintf(xb[k] * id);
			q[(size_t)b * block + k] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
		}
	}
}

static void fill_sums(int block, int K, uint8_t *row)
{
	const int8_t *q = (const int8_t *)row;
	uint8_t *sums = row_sums(row, block, K);
	if (block == 32) {
		for (int b = 0; b < K / 32; b++) {
			int32_t s = 0;
			for (int k = 0; k < 32; k++)
				s += q[32 * b + k];
			s *= -128;
			memcpy(sums + 4 * (size_t)b, &s, 4);
		}
		return;
	}
	int16_t *bs = (int16_t *)sums, *b2 = bs + K / 16;
	for (int g = 0; g < K / 16; g++) {
		int s = 0;
		for (int k = 0; k < 16; k++)
			s += q[16 * g + k];
		bs[g] = (int16_t)s;
	}
	for (int t = 0; t < K / 32; t++)
		b2[t] = (int16_t)(bs[2 * t] + bs[2 * t + 1]);
}

#if defined(__x86_64__)

/* Same as quant_scalar: integer max of the magnitudes' bits, the scalar
 * divisions, products rounded to nearest even by cvtps (the default MXCSR
 * mode, what lrintf uses), clamped to [-127, 127]. */
TGT2 static void quant_avx2(int block, const float *x, int K, uint8_t *row)
{
	int8_t *q = (int8_t *)row;
	float *d = row_d(row, K);
	const __m256i mask = _mm256_set1_epi32(0x7fffffff), lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
	const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
	for (int b = 0; b < K / block; b++) {
		const float *xb = x + (size_t)b * block;
		__m256i m = _mm256_setzero_si256();
		for (int k = 0; k < block; k += 8)
			m = _mm256_max_epi32(m, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(xb + k)), mask));
		__m128i m4 = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
		m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0x4e));
		m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0xb1));
		float id;
		int zero;
		d[b] = block_scale((uint32_t)_mm_cvtsi128_si32(m4), &id, &zero);
		int8_t *qb = q + (size_t)b * block;
		if (zero) {
			memset(qb, 0, (size_t)block);
			continue;
		}
		const __m256 idv = _mm256_set1_ps(id);
		for (int k = 0; k < block; k += 32) {
			__m256i v[4];
			for (int t = 0; t < 4; t++) {
				__m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + k + 8 * t), idv));
				v[t] = _mm256_min_epi32(_mm256_max_epi32(r, lo), hi);
			}
			__m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
			_mm256_storeu_si256((__m256i *)(qb + k), _mm256_permutevar8x32_epi32(p, perm));
		}
	}
}

TGT2 static inline __m256i dot4_avx2(__m256i u, __m256i s)
{
	return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* [sum v0, sum v1, sum v2, sum v3] of four int32 vectors (exact). */
TGT2 static inline __m128i hsum4_i32(__m256i v0, __m256i v1, __m256i v2, __m256i v3)
{
	__m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
	return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

static inline uint16_t u16_at(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}

TGT2 static inline __m128 h2f4(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3)
{
	__m128i h = _mm_cvtsi32_si128((int)((uint32_t)u16_at(p0) | ((uint32_t)u16_at(p1) << 16)));
	h = _mm_insert_epi32(h, (int)((uint32_t)u16_at(p2) | ((uint32_t)u16_at(p3) << 16)), 1);
	return _mm_cvtph_ps(h);
}

/* Four MXFP4 scales (kq_e8m0_half, exact): 0x00200000 << e below 2,
 * (e - 1) << 23 from 2 on. */
TGT2 static inline __m128 e8m0_4(uint8_t e0, uint8_t e1, uint8_t e2, uint8_t e3)
{
	const __m128i e = _mm_cvtepu8_epi32(
		_mm_cvtsi32_si128((int)((uint32_t)e0 | (uint32_t)e1 << 8 | (uint32_t)e2 << 16 | (uint32_t)e3 << 24)));
	const __m128i lo = _mm_sllv_epi32(_mm_set1_epi32(0x00200000), e);
	const __m128i hi = _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(1)), 23);
	return _mm_castsi128_ps(_mm_blendv_epi8(hi, lo, _mm_cmplt_epi32(e, _mm_set1_epi32(2))));
}

/*
 * AVX2 kernels: 4 weight rows against mr <= 4 activation rows; each weight
 * block is decoded once for the mr rows. Lane r of a float accumulator is
 * the output of weight row r, so the per-output chain of qdot.h runs as
 * one vector FMA per block.
 */
/* Decode (one activation row) is a stream over the weights: the 32-block
 * kernels prefetch the same bytes of the rows whole 4-row panels ahead, the first
 * panel at least PF_BYTES on (the rows of a matrix are contiguous, so that
 * is the stream's next stretch; a prefetch is a hint, past the end it
 * never faults). */
/* M = 1 streams, single thread (N rows x K): Q8_0 131072 x 256 went 68
 * -> 35 ns per 4 rows from 2 panels (2.2 KB) to 16 KB ahead, Q4_K 262144 x
 * 256 30 -> 23, Q6_K 131072 x 256 32 -> 28; 8 KB and 32 KB measured the
 * same or worse. */
#define PF_BYTES 16384

/* Rows outer (the K types' kernels). A 4-row pass reads its 4 rows one
 * after another, each whole: the blocks' integer sums wait in ro_buf for
 * the float steps, which then run block by block as before (same
 * integers, same float steps). Block by block, the 4 rows were 4
 * interleaved streams: M = 1 GEMVs on 2 threads, 262144 x 2816 from
 * memory, went Q6_K 20-23 -> 28-29 GB/s and Q4_K 17-18 -> 25-28 on 512
 * bits, Q6_K 20-23 -> 27-28 and Q4_K 21 -> 28-29 on AVX2 (a plain read of
 * the bytes 29-34 in the same runs). A row read in pieces is worse than
 * either (Q8_0 at K = 4096 in two chunks per row: 28-29 -> 13-15), so a
 * chunk is a whole row whenever ro_buf holds the sums of mr x 4 rows of
 * it; only rows longer than 64 super-blocks (K 16384) at 4 activation rows,
 * 256 at one, come in pieces. The 32-blocks keep the block-by-block order and its prefetch:
 * their dot is so cheap that storing the sums cost more than the order
 * gained (Q8_0 2816 wide: 31-38 -> 28-31 GB/s in L2, 22-24 -> 13-19 from
 * memory). */
#define RO_BYTES 65536
static _Thread_local __m512i ro_buf[RO_BYTES / 64];
#define RO_AT(bi, mr, i, r) ((((bi) * (mr) + (i)) << 2) + (r))
/* Blocks per chunk: narr arrays of vbytes-byte vectors, mr x 4 per block. */
static inline int ro_cb(int mr, int vbytes, int narr)
{
	return RO_BYTES / (narr * vbytes * 4 * mr);
}

static inline ptrdiff_t pf_dist(const uint8_t *const *wr)
{
	const ptrdiff_t p = 4 * (wr[1] - wr[0]); /* 0 in a one-row pass */
	return p > 0 ? p * ((PF_BYTES + p - 1) / p) : 0;
}

static AINL2 void pf_ahead(const uint8_t *blk, ptrdiff_t ahead, int bytes)
{
	for (int o = 0; o < bytes; o += 64)
		_mm_prefetch((const char *)blk + ahead + o, _MM_HINT_T0);
}

/* The f16 pairs (d, dmin) at p0..p3 (the K types with a min keep them
 * adjacent) as [d0 d1 d2 d3 dmin0 dmin1 dmin2 dmin3]: one 32-bit load per
 * row, the same exact conversion as h2f4. */
TGT2 static inline __m256 h2f4x2(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3)
{
	uint32_t u[4];
	memcpy(&u[0], p0, 4);
	memcpy(&u[1], p1, 4);
	memcpy(&u[2], p2, 4);
	memcpy(&u[3], p3, 4);
	const __m128i h = _mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]);
	return _mm256_cvtph_ps(_mm_shuffle_epi8(h, _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15)));
}

/* [sum S0 .. sum S3, sum C0 .. sum C3] of eight int32 vectors (exact). */
TGT2 static inline __m256i hsum8_i32(const __m256i *S, const __m256i *C)
{
	const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(S[0], S[1]), _mm256_hadd_epi32(S[2], S[3]));
	const __m256i c = _mm256_hadd_epi32(_mm256_hadd_epi32(C[0], C[1]), _mm256_hadd_epi32(C[2], C[3]));
	return _mm256_add_epi32(_mm256_permute2x128_si256(s, c, 0x20), _mm256_permute2x128_si256(s, c, 0x31));
}

/* The float steps of one super-block for 4 weight rows and mr activation
 * rows: acc = fmaf(d dx, S, acc) and c = fmaf(dmin dx, C, c) (qdot.h), S
 * and C the lane sums of the rows' four integer vectors. Both chains run
 * in one register, acc in lanes 0-3 and c in 4-7 (lane r: weight row r),
 * dd = [d, dmin] (h2f4x2): the same operations per lane as two 128-bit
 * chains, with one reduction tree and one FMA for both. Shared by the
 * AVX2 and 512-bit 4-row kernels. */
TGT2 static AINL2 void fin_block(const int mr, const uint8_t *a, size_t astride, int K, int b, __m256 dd,
				 __m256i (*S)[4], __m256i (*C)[4], __m256 *ac)
{
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++) {
		float dx;
		memcpy(&dx, a + (size_t)i * astride + K + 4 * (size_t)b, 4);
		ac[i] = _mm256_fmadd_ps(_mm256_mul_ps(dd, _mm256_set1_ps(dx)), _mm256_cvtepi32_ps(hsum8_i32(S[i], C[i])),
					ac[i]);
	}
}

/* acc = fmaf(d dx, S, acc) alone (Q6_K, Q3_K). */
TGT2 static AINL2 void fin_block1(const int mr, const uint8_t *a, size_t astride, int K, int b, __m128 d,
				  __m256i (*S)[4], __m128 *acc)
{
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++) {
		float dx;
		memcpy(&dx, a + (size_t)i * astride + K + 4 * (size_t)b, 4);
		acc[i] = _mm_fmadd_ps(_mm_mul_ps(d, _mm_set1_ps(dx)),
				      _mm_cvtepi32_ps(hsum4_i32(S[i][0], S[i][1], S[i][2], S[i][3])), acc[i]);
	}
}

/* y = acc - c of fin_block's register. */
TGT2 static inline __m128 fin_out(__m256 ac)
{
	return _mm_sub_ps(_mm256_castps256_ps128(ac), _mm256_extractf128_ps(ac, 1));
}

TGT2 static AINL2 void q8_0_k4(const uint8_t *const *wr, int K, const uint8_t *a, size_t astride, const int mr,
			       float *out)
{
	const int nb = K / 32;
	const ptrdiff_t ahead = pf_dist(wr);
	__m128 acc[AMR];
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		acc[i] = _mm_setzero_ps();
	for (int b = 0; b < nb; b++) {
		__m256i p[AMR][4];
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++) {
			pf_ahead(wr[r] + 34 * (size_t)b, ahead, 34);
			const __m256i w = _mm256_loadu_si256((const __m256i *)(wr[r] + 34 * (size_t)b + 2));
			const __m256i aw = _mm256_abs_epi8(w);
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++) {
				const __m256i x = _mm256_load_si256((const __m256i *)(a + (size_t)i * astride + 32 * (size_t)b));
				p[i][r] = dot4_avx2(aw, _mm256_sign_epi8(x, w));
			}
		}
		const size_t o = 34 * (size_t)b;
		const __m128 dw = h2f4(wr[0] + o, wr[1] + o, wr[2] + o, wr[3] + o);
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			float dx;
			memcpy(&dx, a + (size_t)i * astride + K + 4 * (size_t)b, 4);
			__m128i is = hsum4_i32(p[i][0], p[i][1], p[i][2], p[i][3]);
			acc[i] = _mm_fmadd_ps(_mm_mul_ps(dw, _mm_set1_ps(dx)), _mm_cvtepi32_ps(is), acc[i]);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		_mm_storeu_ps(out + 4 * i, acc[i]);
}

TGT2 static AINL2 void q0_k4(int dt, const uint8_t *const *wr, int K, const uint8_t *a, size_t astride, const int mr,
			     float *out)
{
	const int nb = K / 32, bb = q0_bytes(dt), sh = q0_shift(dt);
	const uint8_t *ns = a + K + (size_t)nb * 4;
	const ptrdiff_t ahead = pf_dist(wr);
	__m128 acc[AMR];
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		acc[i] = _mm_setzero_ps();
	for (int b = 0; b < nb; b++) {
		__m256i p[AMR][4];
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++) {
			pf_ahead(wr[r] + (size_t)bb * b, ahead, bb);
			const __m256i u = q0_codes_avx2(dt, wr[r] + (size_t)bb * b);
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++) {
				const __m256i x = _mm256_load_si256((const __m256i *)(a + (size_t)i * astride + 32 * (size_t)b));
				p[i][r] = dot4_avx2(u, x);
			}
		}
		const size_t o = (size_t)bb * b;
		const __m128 dw = dt == KV_DT_MXFP4 ? e8m0_4(wr[0][o], wr[1][o], wr[2][o], wr[3][o])
						    : h2f4(wr[0] + o, wr[1] + o, wr[2] + o, wr[3] + o);
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			float dx;
			int32_t n;
			memcpy(&dx, a + (size_t)i * astride + K + 4 * (size_t)b, 4);
			memcpy(&n, ns + (size_t)i * astride + 4 * (size_t)b, 4);
			/* minus offset * sum q, exactly */
			__m128i is = _mm_add_epi32(hsum4_i32(p[i][0], p[i][1], p[i][2], p[i][3]), _mm_set1_epi32(n >> sh));
			acc[i] = _mm_fmadd_ps(_mm_mul_ps(dw, _mm_set1_ps(dx)), _mm_cvtepi32_ps(is), acc[i]);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		_mm_storeu_ps(out + 4 * i, acc[i]);
}

/* Q4_1 / Q5_1: per block acc = fma(d dx, isum, acc), then
 * acc = fma(m dx, sum qx, acc) (sum qx = -ns / 128). */
TGT2 static AINL2 void q1_k4(int dt, const uint8_t *const *wr, int K, const uint8_t *a, size_t astride, const int mr,
			     float *out)
{
	const int nb = K / 32, bb = q0_bytes(dt);
	const uint8_t *ns = a + K + (size_t)nb * 4;
	const ptrdiff_t ahead = pf_dist(wr);
	__m128 acc[AMR];
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		acc[i] = _mm_setzero_ps();
	for (int b = 0; b < nb; b++) {
		__m256i p[AMR][4];
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++) {
			pf_ahead(wr[r] + (size_t)bb * b, ahead, bb);
			const __m256i u = q0_codes_avx2(dt, wr[r] + (size_t)bb * b);
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++) {
				const __m256i x = _mm256_load_si256((const __m256i *)(a + (size_t)i * astride + 32 * (size_t)b));
				p[i][r] = dot4_avx2(u, x);
			}
		}
		const size_t o = (size_t)bb * b;
		const __m128 dw = h2f4(wr[0] + o, wr[1] + o, wr[2] + o, wr[3] + o);
		const __m128 mw = h2f4(wr[0] + o + 2, wr[1] + o + 2, wr[2] + o + 2, wr[3] + o + 2);
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			float dx;
			int32_t n;
			memcpy(&dx, a + (size_t)i * astride + K + 4 * (size_t)b, 4);
			memcpy(&n, ns + (size_t)i * astride + 4 * (size_t)b, 4);
			const __m128 dxv = _mm_set1_ps(dx);
			__m128i is = hsum4_i32(p[i][0], p[i][1], p[i][2], p[i][3]);
			acc[i] = _mm_fmadd_ps(_mm_mul_ps(dw, dxv), _mm_cvtepi32_ps(is), acc[i]);
			acc[i] = _mm_fmadd_ps(_mm_mul_ps(mw, dxv), _mm_set1_ps((float)(-(n / 128))), acc[i]);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		_mm_storeu_ps(out + 4 * i, acc[i]);
}

/* Q4_K (q5 = 0) and Q5_K (q5 = 1: the 5th bit of slice s is bit s of qh). */
TGT2 static AINL2 void q45_k4(const uint8_t *const *wr, int K, const uint8_t *a, size_t astride, const int mr,
			      const int q5, float *out)
{
	const int nb = K / 256;
	const size_t bb = q5 ? 176 : 144;
	const size_t bso = (size_t)K + (size_t)nb * 4;
	const __m256i m4 = _mm256_set1_epi8(0x0F);
	__m256 ac[AMR]; /* [acc | c] (fin_block) */
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		ac[i] = _mm256_setzero_ps();
	const int cb = ro_cb(mr, 32, 2);
	__m256i *const Sv = (__m256i *)ro_buf;
	__m256i *const Cv = Sv + RO_BYTES / 64;
	for (int b0 = 0; b0 < nb; b0 += cb) {
		const int b1 = nb - b0 < cb ? nb : b0 + cb;
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++)
			for (int b = b0; b < b1; b++) {
				const uint8_t *blk = wr[r] + bb * (size_t)b, *qs = blk + (q5 ? 48 : 16);
				uint32_t scw[2], mnw[2];
				kq_scale_min_k4_words(blk + 4, scw, mnw);
				const __m128i mb = _mm_set_epi32(0, 0, (int)mnw[1], (int)mnw[0]);
				const __m256i mv = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mb, mb)); /* m0 m0 m1 m1 ... */
				const __m256i sv = _mm256_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)scw[1], (int)scw[0]));
				const __m256i lo16 = _mm256_permute2x128_si256(sv, sv, 0x00);
				__m256i t[AMR];
#pragma GCC unroll 4
				for (int i = 0; i < mr; i++)
					t[i] = _mm256_setzero_si256();
#pragma GCC unroll 4
				for (int ch = 0; ch < 4; ch++) {
					const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * ch));
					__m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
					if (q5) {
						const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
						lo = _mm256_or_si256(lo, bit_to(qh, 2 * ch, 4));
						hi = _mm256_or_si256(hi, bit_to(qh, 2 * ch + 1, 4));
					}
					/* scales 2ch and 2ch + 1 in every int16 lane */
					const __m256i s0 = _mm256_shuffle_epi8(lo16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * 2 * ch)));
					const __m256i s1 = _mm256_shuffle_epi8(lo16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * ch + 1))));
#pragma GCC unroll 4
					for (int i = 0; i < mr; i++) {
						const uint8_t *xq = a + (size_t)i * astride + 256 * (size_t)b + 64 * ch;
						__m256i x0 = _mm256_load_si256((const __m256i *)xq);
						__m256i x1 = _mm256_load_si256((const __m256i *)(xq + 32));
						t[i] = _mm256_add_epi32(t[i], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), s0));
						t[i] = _mm256_add_epi32(t[i], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), s1));
					}
				}
#pragma GCC unroll 4
				for (int i = 0; i < mr; i++) {
					Sv[RO_AT(b - b0, mr, i, r)] = t[i];
					Cv[RO_AT(b - b0, mr, i, r)] = _mm256_madd_epi16(
						mv, _mm256_loadu_si256((const __m256i *)(a + (size_t)i * astride + bso + 32 * (size_t)b)));
				}
			}
		for (int b = b0; b < b1; b++) {
			__m256i(*S)[4] = (__m256i(*)[4])(Sv + RO_AT(b - b0, mr, 0, 0));
			__m256i(*C)[4] = (__m256i(*)[4])(Cv + RO_AT(b - b0, mr, 0, 0));
			const size_t o = bb * (size_t)b;
			fin_block(mr, a, astride, K, b, h2f4x2(wr[0] + o, wr[1] + o, wr[2] + o, wr[3] + o), S, C, ac);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		_mm_storeu_ps(out + 4 * i, fin_out(ac[i]));
}

TGT2 static AINL2 void q6_k_k4(const uint8_t *const *wr, int K, const uint8_t *a, size_t astride, const int mr,
			       float *out)
{
	const int nb = K / 256;
	const size_t bso = (size_t)K + (size_t)nb * 4;
	const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
	__m128 acc[AMR];
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		acc[i] = _mm_setzero_ps();
	const int cb = ro_cb(mr, 32, 1);
	__m256i *const Sv = (__m256i *)ro_buf;
	for (int b0 = 0; b0 < nb; b0 += cb) {
		const int b1 = nb - b0 < cb ? nb : b0 + cb;
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++)
			for (int b = b0; b < b1; b++) {
				const uint8_t *blk = wr[r] + 210 * (size_t)b;
				const int8_t *sc = (const int8_t *)(blk + 192);
				const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
				__m256i t[AMR];
#pragma GCC unroll 4
				for (int i = 0; i < mr; i++)
					t[i] = _mm256_setzero_si256();
#pragma GCC unroll 2
				for (int n = 0; n < 2; n++) {
					const uint8_t *ql = blk + 64 * n;
					/* scales 8n..8n+7 in both halves, picked per slice by a shuffle */
					const __m256i sdup = n ? _mm256_permute2x128_si256(s16, s16, 0x11)
							       : _mm256_permute2x128_si256(s16, s16, 0x00);
					const __m256i hb = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
#pragma GCC unroll 4
					for (int part = 0; part < 4; part++) {
						__m256i lo = _mm256_loadu_si256((const __m256i *)(ql + ((part & 1) ? 32 : 0)));
						__m256i low = part < 2 ? _mm256_and_si256(lo, m4)
								       : _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4);
						__m256i hi2 = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * part), m3);
						const __m256i u = _mm256_or_si256(low, _mm256_slli_epi16(hi2, 4));
						const int s = 4 * n + part;
						const __m256i scv = _mm256_shuffle_epi8(
							sdup, _mm256_set_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * part + 1))),
									       _mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * part)))));
#pragma GCC unroll 4
						for (int i = 0; i < mr; i++) {
							__m256i xv = _mm256_load_si256(
								(const __m256i *)(a + (size_t)i * astride + 256 * (size_t)b + 32 * s));
							t[i] = _mm256_add_epi32(t[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), scv));
						}
					}
				}
				/* minus 32 sum_g sc_g bs_g */
#pragma GCC unroll 4
				for (int i = 0; i < mr; i++) {
					__m256i bsv = _mm256_loadu_si256((const __m256i *)(a + (size_t)i * astride + bso + 32 * (size_t)b));
					Sv[RO_AT(b - b0, mr, i, r)] = _mm256_sub_epi32(t[i], _mm256_slli_epi32(_mm256_madd_epi16(s16, bsv), 5));
				}
			}
		for (int b = b0; b < b1; b++) {
			__m256i(*S)[4] = (__m256i(*)[4])(Sv + RO_AT(b - b0, mr, 0, 0));
			const size_t o = 210 * (size_t)b + 208;
			const __m128 d = h2f4(wr[0] + o, wr[1] + o, wr[2] + o, wr[3] + o);
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++) {
				float dx;
				memcpy(&dx, a + (size_t)i * astride + K + 4 * (size_t)b, 4);
				acc[i] = _mm_fmadd_ps(_mm_mul_ps(d, _mm_set1_ps(dx)),
						      _mm_cvtepi32_ps(hsum4_i32(S[i][0], S[i][1], S[i][2], S[i][3])), acc[i]);
			}
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		_mm_storeu_ps(out + 4 * i, acc[i]);
}

/* Their 16 group scales (Q3_K: minus 32, signed) and Q2_K's mins as int16. */
TGT2 static inline void g16_scales(int dt, const uint8_t *blk, __m256i *s16, __m256i *m16)
{
	if (dt == KV_DT_Q3_K) {
		int8_t sc[16];
		q3k_scales(blk, sc);
		*s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
		*m16 = _mm256_setzero_si256();
		return;
	}
	const __m128i raw = _mm_loadu_si128((const __m128i *)blk), m4 = _mm_set1_epi8(0x0F);
	*s16 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4));
	*m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
}

/* Q3_K: acc = fma(d dx, S, acc) with S = sum_g sc_g (u . x - 4 bs_g);
 * Q2_K: S = sum_g sc_g u . x, C = sum_g m_g bs_g, two chains, acc - c. */
TGT2 static AINL2 void g16_k4(const int dt, const uint8_t *const *wr, int K, const uint8_t *a, size_t astride,
			      const int mr, float *out)
{
	const int nb = K / 256, q3 = dt == KV_DT_Q3_K;
	const size_t bso = (size_t)K + (size_t)nb * 4, bb = q3 ? 110 : 84;
	__m128 acc[AMR]; /* Q3_K */
	__m256 ac[AMR];  /* Q2_K: [acc | c] (fin_block) */
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++) {
		acc[i] = _mm_setzero_ps();
		ac[i] = _mm256_setzero_ps();
	}
	const int cb = ro_cb(mr, 32, 2);
	__m256i *const Sv = (__m256i *)ro_buf;
	__m256i *const Cv = Sv + RO_BYTES / 64;
	for (int b0 = 0; b0 < nb; b0 += cb) {
		const int b1 = nb - b0 < cb ? nb : b0 + cb;
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++)
			for (int b = b0; b < b1; b++) {
				const uint8_t *blk = wr[r] + bb * (size_t)b;
				__m256i s16, m16;
				g16_scales(dt, blk, &s16, &m16);
				__m256i t[AMR];
#pragma GCC unroll 4
				for (int i = 0; i < mr; i++)
					t[i] = _mm256_setzero_si256();
#pragma GCC unroll 2
				for (int n = 0; n < 2; n++) {
					const __m256i sdup = n ? _mm256_permute2x128_si256(s16, s16, 0x11)
							       : _mm256_permute2x128_si256(s16, s16, 0x00);
#pragma GCC unroll 4
					for (int j = 0; j < 4; j++) {
						const int s = 4 * n + j;
						const __m256i u = g16_codes(dt, blk, s);
						const __m256i scv = _mm256_shuffle_epi8(
							sdup, _mm256_set_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * j + 1))),
									       _mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * j)))));
#pragma GCC unroll 4
						for (int i = 0; i < mr; i++) {
							__m256i xv = _mm256_load_si256(
								(const __m256i *)(a + (size_t)i * astride + 256 * (size_t)b + 32 * s));
							t[i] = _mm256_add_epi32(t[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), scv));
						}
					}
				}
#pragma GCC unroll 4
				for (int i = 0; i < mr; i++) {
					__m256i bsv = _mm256_loadu_si256((const __m256i *)(a + (size_t)i * astride + bso + 32 * (size_t)b));
					if (q3) {
						Sv[RO_AT(b - b0, mr, i, r)] = _mm256_sub_epi32(t[i], _mm256_slli_epi32(_mm256_madd_epi16(s16, bsv), 2));
					} else {
						Sv[RO_AT(b - b0, mr, i, r)] = t[i];
						Cv[RO_AT(b - b0, mr, i, r)] = _mm256_madd_epi16(m16, bsv);
					}
				}
			}
		for (int b = b0; b < b1; b++) {
			__m256i(*S)[4] = (__m256i(*)[4])(Sv + RO_AT(b - b0, mr, 0, 0));
			__m256i(*C)[4] = (__m256i(*)[4])(Cv + RO_AT(b - b0, mr, 0, 0));
			const size_t o = bb * (size_t)b + (q3 ? 108 : 80);
			if (q3)
				fin_block1(mr, a, astride, K, b, h2f4(wr[0] + o, wr[1] + o, wr[2] + o, wr[3] + o), S, acc);
			else
				fin_block(mr, a, astride, K, b, h2f4x2(wr[0] + o, wr[1] + o, wr[2] + o, wr[3] + o), S, C, ac);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		_mm_storeu_ps(out + 4 * i, q3 ? acc[i] : fin_out(ac[i]));
}

/* Outputs of one 4-row pass: o[4 t + r] -> y[t * ldy + r] for mr
 * activation rows t and nr weight rows r. */
static inline void gemv_put(float *y, size_t ldy, int accum, int mr, int nr, const float *o)
{
	for (int t = 0; t < mr; t++) {
		float *yo = y + (size_t)t * ldy;
		if (nr == 4 && !accum)
			memcpy(yo, o + 4 * t, 4 * sizeof(float));
		else
			for (int r = 0; r < nr; r++)
				yo[r] = accum ? yo[r] + o[4 * t + r] : o[4 * t + r];
	}
}

/* A GEMV over weight rows [n0, n1) of w against m activation rows: one
 * 4-row kernel FN (a short pass repeats its last row), AMR activation
 * rows at a time. The row loop lives in the same function as the inlined
 * kernel, so its constants stay in registers across passes: the loop
 * outside cost 18% of a Q4_K M = 1, K = 256 GEMV (perf, cpu-clock). */
typedef void gemv_fn(const uint8_t *w, size_t wstride, int K, const uint8_t *a, size_t astride, int m, float *y,
		     size_t ldy, int accum, int n0, int n1);
#define GEMV_LOOP(TGT, NAME, FN)                                                                                \
	TGT static void NAME(const uint8_t *w, size_t wstride, int K, const uint8_t *a, size_t astride, int m, float *y, \
			     size_t ldy, int accum, int n0, int n1)                                                 \
	{                                                                                                       \
		for (int n = n0; n < n1; n += 4) {                                                              \
			const int nr = n1 - n < 4 ? n1 - n : 4;                                                 \
			const uint8_t *wr[4];                                                                   \
			for (int r = 0; r < 4; r++)                                                             \
				wr[r] = w + (size_t)(n + (r < nr ? r : nr - 1)) * wstride;                      \
			for (int i = 0; i < m; i += AMR) {                                                      \
				const int mr = m - i < AMR ? m - i : AMR;                                       \
				const uint8_t *xr = a + (size_t)i * astride;                                    \
				float o[4 * AMR];                                                               \
				switch (mr) {                                                                   \
				case 1: FN(wr, K, xr, astride, 1, o); break;                                    \
				case 2: FN(wr, K, xr, astride, 2, o); break;                                    \
				case 3: FN(wr, K, xr, astride, 3, o); break;                                    \
				default: FN(wr, K, xr, astride, 4, o); break;                                   \
				}                                                                               \
				gemv_put(y + (size_t)i * ldy + n, ldy, accum, mr, nr, o);                       \
			}                                                                                       \
		}                                                                                               \
	}

#define Q0_K4(NAME, FN, DT)                                                                                     \
	TGT2 static AINL2 void NAME(const uint8_t *const *wr, int K, const uint8_t *a, size_t astride, const int mr, \
				    float *out)                                                                 \
	{                                                                                                       \
		FN(DT, wr, K, a, astride, mr, out);                                                             \
	}
Q0_K4(q4_0_k4, q0_k4, KV_DT_Q4_0)
Q0_K4(q5_0_k4, q0_k4, KV_DT_Q5_0)
Q0_K4(mxfp4_k4, q0_k4, KV_DT_MXFP4)
Q0_K4(q4_1_k4, q1_k4, KV_DT_Q4_1)
Q0_K4(q5_1_k4, q1_k4, KV_DT_Q5_1)
GEMV_LOOP(TGT2, q8_0_gemv, q8_0_k4)
GEMV_LOOP(TGT2, q4_0_gemv, q4_0_k4)
GEMV_LOOP(TGT2, q5_0_gemv, q5_0_k4)
GEMV_LOOP(TGT2, mxfp4_gemv, mxfp4_k4)
GEMV_LOOP(TGT2, q4_1_gemv, q4_1_k4)
GEMV_LOOP(TGT2, q5_1_gemv, q5_1_k4)

TGT2 static AINL2 void q4_k_k4(const uint8_t *const *wr, int K, const uint8_t *a, size_t astride, const int mr,
			       float *out)
{
	q45_k4(wr, K, a, astride, mr, 0, out);
}

TGT2 static AINL2 void q5_k_k4(const uint8_t *const *wr, int K, const uint8_t *a, size_t astride, const int mr,
			       float *out)
{
	q45_k4(wr, K, a, astride, mr, 1, out);
}

TGT2 static AINL2 void q3_k_k4(const uint8_t *const *wr, int K, const uint8_t *a, size_t astride, const int mr,
			       float *out)
{
	g16_k4(KV_DT_Q3_K, wr, K, a, astride, mr, out);
}

TGT2 static AINL2 void q2_k_k4(const uint8_t *const *wr, int K, const uint8_t *a, size_t astride, const int mr,
			       float *out)
{
	g16_k4(KV_DT_Q2_K, wr, K, a, astride, mr, out);
}
GEMV_LOOP(TGT2, q4_k_gemv, q4_k_k4)
GEMV_LOOP(TGT2, q5_k_gemv, q5_k_k4)
GEMV_LOOP(TGT2, q6_k_gemv, q6_k_k4)
GEMV_LOOP(TGT2, q3_k_gemv, q3_k_k4)
GEMV_LOOP(TGT2, q2_k_gemv, q2_k_k4)

/*
 * AVX-512 VNNI GEMV (M < 8: no repack): the AVX2 4-row kernels' structure
 * with a slice pair (64 codes) per register. vpdpbusd gives per-dword sums
 * of 4 code products (|z| <= 4 * 31 * 127 < 2^15, so z fits its low 16
 * bits), and vpdpwssd with the dword scale (high word 0) adds z * sc
 * exactly. Same integers, same float steps as q45_k4.
 */
TGT5 static inline __m512i bit_to5(__m512i v, int s, int t)
{
	const __m512i sh = s > t ? _mm512_srli_epi16(v, s - t) : _mm512_slli_epi16(v, t - s);
	return _mm512_and_si512(sh, _mm512_set1_epi8((char)(1 << t)));
}

TGT5 static AINL void q45_k4_512(const uint8_t *const *wr, int K, const uint8_t *a, size_t astride, const int mr,
				 const int q5, float *out)
{
	const int nb = K / 256;
	const size_t bso = (size_t)K + (size_t)nb * 4, bb = q5 ? 176 : 144;
	const __m512i m4 = _mm512_set1_epi8(0x0F);
	__m256 ac[AMR]; /* [acc | c] (fin_block) */
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		ac[i] = _mm256_setzero_ps();
	const int cb = ro_cb(mr, 32, 2);
	__m256i *const Sv = (__m256i *)ro_buf;
	__m256i *const Cv = Sv + RO_BYTES / 64;
	for (int b0 = 0; b0 < nb; b0 += cb) {
		const int b1 = nb - b0 < cb ? nb : b0 + cb;
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++)
			for (int b = b0; b < b1; b++) {
				const uint8_t *blk = wr[r] + bb * (size_t)b, *qs = blk + (q5 ? 48 : 16);
				uint32_t scw[2], mnw[2];
				kq_scale_min_k4_words(blk + 4, scw, mnw);
				const __m128i mb = _mm_set_epi32(0, 0, (int)mnw[1], (int)mnw[0]);
				const __m256i mv = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mb, mb)); /* m0 m0 m1 m1 ... */
				/* the 8 scale bytes in every 128-bit lane, picked per dword by vpshufb */
				const __m512i scb = _mm512_set1_epi64((long long)(((uint64_t)scw[1] << 32) | scw[0]));
				__m512i qh2 = _mm512_setzero_si512();
				if (q5) { /* qh in the low half, qh >> 1 in the high: bits 2ch of both halves */
					const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
					qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 1), 1);
				}
				__m512i t[AMR];
#pragma GCC unroll 4
				for (int i = 0; i < mr; i++)
					t[i] = _mm512_setzero_si512();
#pragma GCC unroll 4
				for (int ch = 0; ch < 4; ch++) {
					/* the 32 bytes in both halves (a broadcast load: no shuffle),
					 * the high half shifted to its high nibbles under a mask */
					const __m512i raw = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * ch)));
					__m512i w = _mm512_and_si512(_mm512_mask_srli_epi16(raw, (__mmask32)0xFFFF0000u, raw, 4), m4);
					if (q5)
						w = _mm512_or_si512(w, bit_to5(qh2, 2 * ch, 4));
					/* scale 2ch in dwords 0-7, 2ch + 1 in 8-15 (bytes 1-3 zero) */
					const int j0 = (int)0x80808000 | (2 * ch), j1 = j0 + 1;
					const __m512i scv = _mm512_shuffle_epi8(
						scb, _mm512_set_epi32(j1, j1, j1, j1, j1, j1, j1, j1, j0, j0, j0, j0, j0, j0, j0, j0));
#pragma GCC unroll 4
					for (int i = 0; i < mr; i++) {
						const __m512i x = _mm512_load_si512((const void *)(a + (size_t)i * astride + 256 * (size_t)b + 64 * ch));
						t[i] = _mm512_dpwssd_epi32(t[i], _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x), scv);
					}
				}
#pragma GCC unroll 4
				for (int i = 0; i < mr; i++) {
					const int v = ((b - b0) * mr + i) * 4 + r;
					Sv[v] = _mm256_add_epi32(_mm512_castsi512_si256(t[i]), _mm512_extracti64x4_epi64(t[i], 1));
					Cv[v] = _mm256_madd_epi16(
						mv, _mm256_loadu_si256((const __m256i *)(a + (size_t)i * astride + bso + 32 * (size_t)b)));
				}
		}
		for (int b = b0; b < b1; b++) {
			const size_t o = bb * (size_t)b;
			fin_block(mr, a, astride, K, b, h2f4x2(wr[0] + o, wr[1] + o, wr[2] + o, wr[3] + o),
				  (__m256i(*)[4])(Sv + (b - b0) * mr * 4), (__m256i(*)[4])(Cv + (b - b0) * mr * 4), ac);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		_mm_storeu_ps(out + 4 * i, fin_out(ac[i]));
}

/* Q6_K: codes 0..63 (|z| <= 4 * 63 * 127 < 2^15), a group scale per 4
 * dwords (signed, high word cleared for vpdpwssd); the -32 offset as in
 * q6_k_k4. Same integers, same float steps. */
TGT5 static AINL void q6_k4_512(const uint8_t *const *wr, int K, const uint8_t *a, size_t astride, const int mr,
				float *out)
{
	const int nb = K / 256;
	const size_t bso = (size_t)K + (size_t)nb * 4;
	const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3), lo16 = _mm512_set1_epi32(0xFFFF);
	__m128 acc[AMR];
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		acc[i] = _mm_setzero_ps();
	const int cb = ro_cb(mr, 32, 1);
	__m256i *const Sv = (__m256i *)ro_buf;
	for (int b0 = 0; b0 < nb; b0 += cb) {
		const int b1 = nb - b0 < cb ? nb : b0 + cb;
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++)
			for (int b = b0; b < b1; b++) {
				const uint8_t *blk = wr[r] + 210 * (size_t)b;
				const __m128i s8 = _mm_loadu_si128((const __m128i *)(blk + 192));
				const __m256i s16 = _mm256_cvtepi8_epi16(s8);
				const __m512i sc32 = _mm512_and_si512(_mm512_cvtepi8_epi32(s8), lo16);
				__m512i t[AMR];
#pragma GCC unroll 4
				for (int i = 0; i < mr; i++)
					t[i] = _mm512_setzero_si512();
#pragma GCC unroll 2
				for (int n = 0; n < 2; n++) {
					const __m512i ql = _mm512_loadu_si512((const void *)(blk + 64 * n));
					const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
					const __m512i qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
#pragma GCC unroll 2
					for (int pp = 0; pp < 2; pp++) { /* slices 4n + 2pp, 4n + 2pp + 1 */
						const __m512i low = pp ? _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4) : _mm512_and_si512(ql, m4);
						const __m512i hi = _mm512_and_si512(pp ? _mm512_srli_epi16(qh2, 4) : qh2, m3);
						const __m512i w = _mm512_or_si512(low, _mm512_slli_epi16(hi, 4));
						const int g = 8 * n + 4 * pp; /* groups g .. g + 3, 4 dwords each */
						const __m512i scv = _mm512_permutexvar_epi32(
							_mm512_set_epi32(g + 3, g + 3, g + 3, g + 3, g + 2, g + 2, g + 2, g + 2, g + 1, g + 1, g + 1, g + 1, g,
									 g, g, g),
							sc32);
#pragma GCC unroll 4
						for (int i = 0; i < mr; i++) {
							const __m512i x = _mm512_load_si512(
								(const void *)(a + (size_t)i * astride + 256 * (size_t)b + 128 * n + 64 * pp));
							t[i] = _mm512_dpwssd_epi32(t[i], _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x), scv);
						}
					}
				}
#pragma GCC unroll 4
				for (int i = 0; i < mr; i++) {
					__m256i bsv = _mm256_loadu_si256((const __m256i *)(a + (size_t)i * astride + bso + 32 * (size_t)b));
					__m256i tt = _mm256_add_epi32(_mm512_castsi512_si256(t[i]), _mm512_extracti64x4_epi64(t[i], 1));
					Sv[((b - b0) * mr + i) * 4 + r] = _mm256_sub_epi32(tt, _mm256_slli_epi32(_mm256_madd_epi16(s16, bsv), 5));
				}
		}
		for (int b = b0; b < b1; b++) {
			const size_t o = 210 * (size_t)b + 208;
			fin_block1(mr, a, astride, K, b, h2f4(wr[0] + o, wr[1] + o, wr[2] + o, wr[3] + o),
				   (__m256i(*)[4])(Sv + (b - b0) * mr * 4), acc);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		_mm_storeu_ps(out + 4 * i, acc[i]);
}

GEMV_LOOP(TGT5, q6_k_gemv5, q6_k4_512)

/* Q2_K: g16_k4 with a slice pair per register (codes 0..3, group scales
 * per 4 dwords as in q6_k4_512). Same integers, same float steps as
 * g16_k4. (Q3_K measured slower this way than its AVX2 kernel: it keeps
 * that one.) */
TGT5 static AINL void q2_k4_512(const uint8_t *const *wr, int K, const uint8_t *a, size_t astride, const int mr,
				float *out)
{
	const int nb = K / 256;
	const size_t bso = (size_t)K + (size_t)nb * 4;
	const __m512i m3 = _mm512_set1_epi8(3);
	__m256 ac[AMR]; /* [acc | c] (fin_block) */
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		ac[i] = _mm256_setzero_ps();
	const int cb = ro_cb(mr, 32, 2);
	__m256i *const Sv = (__m256i *)ro_buf;
	__m256i *const Cv = Sv + RO_BYTES / 64;
	for (int b0 = 0; b0 < nb; b0 += cb) {
		const int b1 = nb - b0 < cb ? nb : b0 + cb;
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++)
			for (int b = b0; b < b1; b++) {
				const uint8_t *blk = wr[r] + 84 * (size_t)b, *qs = blk + 16;
				__m256i s16, m16;
				g16_scales(KV_DT_Q2_K, blk, &s16, &m16);
				const __m512i sc32 = _mm512_cvtepi16_epi32(s16); /* 0..15: high words 0 */
				__m512i t[AMR];
#pragma GCC unroll 4
				for (int i = 0; i < mr; i++)
					t[i] = _mm512_setzero_si512();
#pragma GCC unroll 2
				for (int n = 0; n < 2; n++) {
					const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * n));
					const __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 2), 1);
#pragma GCC unroll 2
					for (int pp = 0; pp < 2; pp++) { /* slices s0 = 4n + 2pp and s0 + 1 */
						const int s0 = 4 * n + 2 * pp, g = 2 * s0;
						const __m512i w = _mm512_and_si512(pp ? _mm512_srli_epi16(qq, 4) : qq, m3);
						const __m512i scv = _mm512_permutexvar_epi32(
							_mm512_set_epi32(g + 3, g + 3, g + 3, g + 3, g + 2, g + 2, g + 2, g + 2, g + 1, g + 1, g + 1, g + 1, g,
									 g, g, g),
							sc32);
#pragma GCC unroll 4
						for (int i = 0; i < mr; i++) {
							const __m512i x =
								_mm512_load_si512((const void *)(a + (size_t)i * astride + 256 * (size_t)b + 32 * s0));
							t[i] = _mm512_dpwssd_epi32(t[i], _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x), scv);
						}
					}
				}
#pragma GCC unroll 4
				for (int i = 0; i < mr; i++) {
					__m256i bsv = _mm256_loadu_si256((const __m256i *)(a + (size_t)i * astride + bso + 32 * (size_t)b));
					Sv[RO_AT(b - b0, mr, i, r)] = _mm256_add_epi32(_mm512_castsi512_si256(t[i]), _mm512_extracti64x4_epi64(t[i], 1));
					Cv[RO_AT(b - b0, mr, i, r)] = _mm256_madd_epi16(m16, bsv);
				}
			}
		for (int b = b0; b < b1; b++) {
			__m256i(*S)[4] = (__m256i(*)[4])(Sv + RO_AT(b - b0, mr, 0, 0));
			__m256i(*C)[4] = (__m256i(*)[4])(Cv + RO_AT(b - b0, mr, 0, 0));
			const size_t o = 84 * (size_t)b + 80;
			fin_block(mr, a, astride, K, b, h2f4x2(wr[0] + o, wr[1] + o, wr[2] + o, wr[3] + o), S, C, ac);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		_mm_storeu_ps(out + 4 * i, fin_out(ac[i]));
}

TGT5 static AINL void q4_k4_512(const uint8_t *const *wr, int K, const uint8_t *a, size_t astride, const int mr,
				float *out)
{
	q45_k4_512(wr, K, a, astride, mr, 0, out);
}

TGT5 static AINL void q5_k4_512(const uint8_t *const *wr, int K, const uint8_t *a, size_t astride, const int mr,
				float *out)
{
	q45_k4_512(wr, K, a, astride, mr, 1, out);
}
GEMV_LOOP(TGT5, q2_k_gemv5, q2_k4_512)
GEMV_LOOP(TGT5, q4_k_gemv5, q4_k4_512)
GEMV_LOOP(TGT5, q5_k_gemv5, q5_k4_512)

/*
 * The 32-blocks with one scale (Q8_0, Q4_0, Q5_0, MXFP4) on 512 bits: a
 * register holds two blocks of a weight row (unsigned codes: Q8_0's + 128,
 * the others' as q0_codes_avx2 gives them), one vpdpbusd per activation
 * row gives 8 dword sums per block, and one reduction tree turns the 4
 * rows' registers into [S_r(b)] and [S_r(b+1)]. The offset (128 / 8 / 16
 * times the activation codes' sum) comes off exactly through the row's ns,
 * and the float steps are q0_k4's, block b before b + 1. An odd last block
 * takes the same steps on 256 bits.
 */
/* The 32 unsigned codes of block blk. */
TGT5 static AINL __m256i b32_codes(const int dt, const uint8_t *blk)
{
	if (dt == KV_DT_Q8_0)
		return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)), _mm256_set1_epi8((char)0x80));
	return q0_codes_avx2(dt, blk);
}

/* The 4 rows' scales of the block at byte offset o. */
TGT5 static AINL __m128 b32_scales(const int dt, const uint8_t *const *wr, size_t o)
{
	if (dt == KV_DT_MXFP4)
		return e8m0_4(wr[0][o], wr[1][o], wr[2][o], wr[3][o]);
	return h2f4(wr[0] + o, wr[1] + o, wr[2] + o, wr[3] + o);
}

/* [sum p_r over lanes 0-7] (block b) and [sum p_r over lanes 8-15] (block
 * b + 1) for the 4 rows r: exact int32 sums in a fixed tree. */
TGT5 static AINL void hsum4x2_i32(const __m512i *p, __m128i *sb, __m128i *sb1)
{
	const __m512i a01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
	const __m512i a23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
	const __m512i q = _mm512_add_epi32(_mm512_unpacklo_epi64(a01, a23), _mm512_unpackhi_epi64(a01, a23));
	const __m512i t = _mm512_add_epi32(q, _mm512_shuffle_i32x4(q, q, _MM_SHUFFLE(2, 3, 0, 1)));
	*sb = _mm512_castsi512_si128(t);
	*sb1 = _mm512_extracti32x4_epi32(t, 2);
}

TGT5 static AINL void b32_k4_512(const int dt, const uint8_t *const *wr, int K, const uint8_t *a, size_t astride,
				 const int mr, float *out)
{
	const int nb = K / 32, bb = dt == KV_DT_Q8_0 ? 34 : q0_bytes(dt), sh = dt == KV_DT_Q8_0 ? 0 : q0_shift(dt);
	const uint8_t *ns = a + K + (size_t)nb * 4;
	const ptrdiff_t ahead = pf_dist(wr);
	__m128 acc[AMR];
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		acc[i] = _mm_setzero_ps();
	int b = 0;
	for (; b + 2 <= nb; b += 2) {
		__m512i p[AMR][4];
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++) {
			const uint8_t *blk = wr[r] + (size_t)bb * b;
			pf_ahead(blk, ahead, 2 * bb);
			const __m512i u =
				_mm512_inserti64x4(_mm512_castsi256_si512(b32_codes(dt, blk)), b32_codes(dt, blk + bb), 1);
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++)
				p[i][r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u,
							      _mm512_load_si512((const void *)(a + (size_t)i * astride + 32 * (size_t)b)));
		}
		const __m128 d0 = b32_scales(dt, wr, (size_t)bb * b), d1 = b32_scales(dt, wr, (size_t)bb * (b + 1));
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			float dx[2];
			int32_t n[2];
			memcpy(dx, a + (size_t)i * astride + K + 4 * (size_t)b, 8);
			memcpy(n, ns + (size_t)i * astride + 4 * (size_t)b, 8);
			__m128i s0, s1;
			hsum4x2_i32(p[i], &s0, &s1);
			s0 = _mm_add_epi32(s0, _mm_set1_epi32(n[0] >> sh));
			s1 = _mm_add_epi32(s1, _mm_set1_epi32(n[1] >> sh));
			acc[i] = _mm_fmadd_ps(_mm_mul_ps(d0, _mm_set1_ps(dx[0])), _mm_cvtepi32_ps(s0), acc[i]);
			acc[i] = _mm_fmadd_ps(_mm_mul_ps(d1, _mm_set1_ps(dx[1])), _mm_cvtepi32_ps(s1), acc[i]);
		}
	}
	if (b < nb) { /* the odd last block */
		__m256i p[AMR][4];
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++) {
			const __m256i u = b32_codes(dt, wr[r] + (size_t)bb * b);
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++)
				p[i][r] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u,
							      _mm256_load_si256((const __m256i *)(a + (size_t)i * astride + 32 * (size_t)b)));
		}
		const __m128 d0 = b32_scales(dt, wr, (size_t)bb * b);
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			float dx;
			int32_t n;
			memcpy(&dx, a + (size_t)i * astride + K + 4 * (size_t)b, 4);
			memcpy(&n, ns + (size_t)i * astride + 4 * (size_t)b, 4);
			const __m128i s0 = _mm_add_epi32(hsum4_i32(p[i][0], p[i][1], p[i][2], p[i][3]), _mm_set1_epi32(n >> sh));
			acc[i] = _mm_fmadd_ps(_mm_mul_ps(d0, _mm_set1_ps(dx)), _mm_cvtepi32_ps(s0), acc[i]);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		_mm_storeu_ps(out + 4 * i, acc[i]);
}

#define B32_K4_512(NAME, DT)                                                                                      \
	TGT5 static AINL void NAME(const uint8_t *const *wr, int K, const uint8_t *a, size_t astride, const int mr, \
				   float *out)                                                                    \
	{                                                                                                         \
		b32_k4_512(DT, wr, K, a, astride, mr, out);                                                       \
	}
B32_K4_512(q8_0_k4_512, KV_DT_Q8_0)
B32_K4_512(q4_0_k4_512, KV_DT_Q4_0)
B32_K4_512(q5_0_k4_512, KV_DT_Q5_0)
B32_K4_512(mxfp4_k4_512, KV_DT_MXFP4)
GEMV_LOOP(TGT5, q8_0_gemv5, q8_0_k4_512)
GEMV_LOOP(TGT5, q4_0_gemv5, q4_0_k4_512)
GEMV_LOOP(TGT5, q5_0_gemv5, q5_0_k4_512)
GEMV_LOOP(TGT5, mxfp4_gemv5, mxfp4_k4_512)

#endif

/* ---- scalar: the definition ---- */

static float q8_0_scalar(const uint8_t *wrow, int K, const uint8_t *xr)
{
	const int8_t *xq = (const int8_t *)xr;
	const float *dx = (const float *)(xr + K);
	float acc = 0.0f;
	for (int b = 0; b < K / 32; b++) {
		const uint8_t *blk = wrow + (size_t)b * 34;
		const int8_t *qw = (const int8_t *)(blk + 2), *qx = xq + 32 * (size_t)b;
		int32_t isum = 0;
		for (int k = 0; k < 32; k++)
			isum += qw[k] * qx[k];
		acc = fmaf(h2f(blk) * dx[b], (float)isum, acc);
	}
	return acc;
}

static float q0_scalar(int dt, const uint8_t *wrow, int K, const uint8_t *xr)
{
	const int8_t *xq = (const int8_t *)xr;
	const float *dx = (const float *)(xr + K);
	const int bb = q0_bytes(dt), off = dt == KV_DT_Q4_0 ? 8 : 16;
	float acc = 0.0f;
	for (int b = 0; b < K / 32; b++) {
		const uint8_t *blk = wrow + (size_t)bb * b;
		uint8_t u[32];
		q0_codes(dt, blk, u);
		const int8_t *qx = xq + 32 * (size_t)b;
		int32_t isum = 0;
		for (int k = 0; k < 32; k++)
			isum += (u[k] - off) * qx[k];
		acc = fmaf(q0_d(dt, blk) * dx[b], (float)isum, acc);
	}
	return acc;
}

static float q4_k_scalar(const uint8_t *wrow, int K, const uint8_t *xr)
{
	const int nb = K / 256;
	const float *dx = (const float *)(xr + K);
	const int16_t *bs = (const int16_t *)row_sums(xr, 256, K);
	float acc = 0.0f, c = 0.0f;
	for (int b = 0; b < nb; b++) {
		const uint8_t *blk = wrow + (size_t)b * 144, *qs = blk + 16;
		const int8_t *qx = (const int8_t *)xr + 256 * (size_t)b;
		int32_t S = 0, C = 0;
		for (int s = 0; s < 8; s++) {
			uint8_t sc, mm;
			kq_scale_min_k4(blk + 4, s, &sc, &mm);
			int32_t p = 0;
			for (int e = 0; e < 32; e++) {
				int v = qs[32 * (s / 2) + e];
				p += ((s & 1) ? v >> 4 : v & 15) * qx[32 * s + e];
			}
			S += sc * p;
			C += mm * (bs[16 * b + 2 * s] + bs[16 * b + 2 * s + 1]);
		}
		acc = fmaf(h2f(blk) * dx[b], (float)S, acc);
		c = fmaf(h2f(blk + 2) * dx[b], (float)C, c);
	}
	return acc - c;
}

static float q6_k_scalar(const uint8_t *wrow, int K, const uint8_t *xr)
{
	const int nb = K / 256;
	const float *dx = (const float *)(xr + K);
	const int16_t *bs = (const int16_t *)row_sums(xr, 256, K);
	float acc = 0.0f;
	for (int b = 0; b < nb; b++) {
		const uint8_t *blk = wrow + (size_t)b * 210;
		const int8_t *sc = (const int8_t *)(blk + 192);
		const int8_t *qx = (const int8_t *)xr + 256 * (size_t)b;
		int32_t S = 0;
		for (int s = 0; s < 8; s++) {
			int n = s / 4, part = s % 4;
			const uint8_t *ql = blk + 64 * n + ((part & 1) ? 32 : 0), *qh = blk + 128 + 32 * n;
			for (int h = 0; h < 2; h++) {
				int32_t p = 0;
				for (int e = 16 * h; e < 16 * h + 16; e++) {
					int low = part < 2 ? ql[e] & 15 : ql[e] >> 4;
					p += (low | (((qh[e] >> (2 * part)) & 3) << 4)) * qx[32 * s + e];
				}
				int g = 2 * s + h;
				S += sc[g] * (p - 32 * bs[16 * b + g]);
			}
		}
		acc = fmaf(h2f(blk + 208) * dx[b], (float)S, acc);
	}
	return acc;
}

/* Q4_1 / Q5_1: per block, the codes' dot, then the min times the sum of
 * the activation codes (-ns / 128, exact). */
static float q1_scalar(int dt, const uint8_t *wrow, int K, const uint8_t *xr)
{
	const int8_t *xq = (const int8_t *)xr;
	const float *dx = (const float *)(xr + K);
	const uint8_t *ns = row_sums(xr, 32, K);
	const int bb = q0_bytes(dt);
	float acc = 0.0f;
	for (int b = 0; b < K / 32; b++) {
		const uint8_t *blk = wrow + (size_t)bb * b;
		uint8_t u[32];
		q0_codes(dt, blk, u);
		const int8_t *qx = xq + 32 * (size_t)b;
		int32_t isum = 0, n;
		for (int k = 0; k < 32; k++)
			isum += u[k] * qx[k];
		memcpy(&n, ns + 4 * (size_t)b, 4);
		acc = fmaf(h2f(blk) * dx[b], (float)isum, acc);
		acc = fmaf(h2f(blk + 2) * dx[b], (float)(-(n / 128)), acc);
	}
	return acc;
}

/* Q5_K: Q4_K's formula, codes 0..31 (bit s of qh[e] is bit 4 of element e
 * of slice s). */
static float q5_k_scalar(const uint8_t *wrow, int K, const uint8_t *xr)
{
	const int nb = K / 256;
	const float *dx = (const float *)(xr + K);
	const int16_t *bs = (const int16_t *)row_sums(xr, 256, K);
	float acc = 0.0f, c = 0.0f;
	for (int b = 0; b < nb; b++) {
		const uint8_t *blk = wrow + (size_t)b * 176, *qh = blk + 16, *ql = blk + 48;
		const int8_t *qx = (const int8_t *)xr + 256 * (size_t)b;
		int32_t S = 0, C = 0;
		for (int s = 0; s < 8; s++) {
			uint8_t sc, mm;
			kq_scale_min_k4(blk + 4, s, &sc, &mm);
			int32_t p = 0;
			for (int e = 0; e < 32; e++) {
				int v = ql[32 * (s / 2) + e];
				int q = ((s & 1) ? v >> 4 : v & 15) | (((qh[e] >> s) & 1) << 4);
				p += q * qx[32 * s + e];
			}
			S += sc * p;
			C += mm * (bs[16 * b + 2 * s] + bs[16 * b + 2 * s + 1]);
		}
		acc = fmaf(h2f(blk) * dx[b], (float)S, acc);
		c = fmaf(h2f(blk + 2) * dx[b], (float)C, c);
	}
	return acc - c;
}

/* Q3_K (w = d sc_g (u - 4), u = 2 low bits | hmask bit << 2 in 0..7) and
 * Q2_K (w = d sc_g u - dmin m_g, u in 0..3): element 32 s + e of a
 * super-block (slice s = 4 n + j) takes bits 2j.. of qs[32 n + e]. */
static float q3_k_scalar(const uint8_t *wrow, int K, const uint8_t *xr)
{
	const float *dx = (const float *)(xr + K);
	const int16_t *bs = (const int16_t *)row_sums(xr, 256, K);
	float acc = 0.0f;
	for (int b = 0; b < K / 256; b++) {
		const uint8_t *blk = wrow + (size_t)b * 110, *hm = blk, *qs = blk + 32;
		const int8_t *qx = (const int8_t *)xr + 256 * (size_t)b;
		int8_t sc[16];
		q3k_scales(blk, sc);
		int32_t S = 0;
		for (int g = 0; g < 16; g++) {
			int s = g / 2, n = s / 4, j = s % 4;
			int32_t p = 0;
			for (int e = 16 * (g & 1); e < 16 * (g & 1) + 16; e++) {
				int u = ((qs[32 * n + e] >> (2 * j)) & 3) | (((hm[e] >> s) & 1) << 2);
				p += u * qx[32 * s + e];
			}
			S += sc[g] * (p - 4 * bs[16 * b + g]);
		}
		acc = fmaf(h2f(blk + 108) * dx[b], (float)S, acc);
	}
	return acc;
}

static float q2_k_scalar(const uint8_t *wrow, int K, const uint8_t *xr)
{
	const float *dx = (const float *)(xr + K);
	const int16_t *bs = (const int16_t *)row_sums(xr, 256, K);
	float acc = 0.0f, c = 0.0f;
	for (int b = 0; b < K / 256; b++) {
		const uint8_t *blk = wrow + (size_t)b * 84, *qs = blk + 16;
		const int8_t *qx = (const int8_t *)xr + 256 * (size_t)b;
		int32_t S = 0, C = 0;
		for (int g = 0; g < 16; g++) {
			int s = g / 2, n = s / 4, j = s % 4;
			int32_t p = 0;
			for (int e = 16 * (g & 1); e < 16 * (g & 1) + 16; e++)
				p += ((qs[32 * n + e] >> (2 * j)) & 3) * qx[32 * s + e];
			S += (blk[g] & 15) * p;
			C += (blk[g] >> 4) * bs[16 * b + g];
		}
		acc = fmaf(h2f(blk + 80) * dx[b], (float)S, acc);
		c = fmaf(h2f(blk + 82) * dx[b], (float)C, c);
	}
	return acc - c;
}

float ke_qdot_ref(int dt, const uint8_t *wrow, int K, const uint8_t *arow)
{
	switch (dt) {
	case KV_DT_Q4_0:
	case KV_DT_Q5_0:
	case KV_DT_MXFP4: return q0_scalar(dt, wrow, K, arow);
	case KV_DT_Q4_1:
	case KV_DT_Q5_1: return q1_scalar(dt, wrow, K, arow);
	case KV_DT_Q8_0: return q8_0_scalar(wrow, K, arow);
	case KV_DT_Q4_K: return q4_k_scalar(wrow, K, arow);
	case KV_DT_Q5_K: return q5_k_scalar(wrow, K, arow);
	case KV_DT_Q3_K: return q3_k_scalar(wrow, K, arow);
	case KV_DT_Q2_K: return q2_k_scalar(wrow, K, arow);
	default: return q6_k_scalar(wrow, K, arow);
	}
}

void ke_qact_quant(int isa, int block, const float *x, int K, void *row)
{
	if (isa > ke_isa_best())
		isa = ke_isa_best();
#if defined(__x86_64__)
	if (isa >= KE_ISA_AVX2)
		quant_avx2(block, x, K, row);
	else
#endif
		quant_scalar(block, x, K, row);
	fill_sums(block, K, row);
}

void ke_qdot_gemm(int isa, int dt, const uint8_t *w, size_t wstride, int K, const uint8_t *a, size_t astride, int m,
		  float *y, size_t ldy, int accum, int n0, int n1)
{
	if (isa > ke_isa_best())
		isa = ke_isa_best();
	if (m <= 0 || n1 <= n0)
		return;
#if defined(__x86_64__)
	/* many activation rows: the repacked panels (engine/qpanel.c) */
	if (ke_qpanel_gemm(isa, dt, w, wstride, K, a, astride, m, y, ldy, accum, n0, n1))
		return;
	if (isa >= KE_ISA_AVX2) {
		const int v5 = isa == KE_ISA_AVX512 && have_vnni(); /* the 512-bit GEMVs */
		gemv_fn *fn = dt == KV_DT_Q8_0	 ? (v5 ? q8_0_gemv5 : q8_0_gemv)
			      : dt == KV_DT_Q4_0 ? (v5 ? q4_0_gemv5 : q4_0_gemv)
			      : dt == KV_DT_Q5_0 ? (v5 ? q5_0_gemv5 : q5_0_gemv)
			      : dt == KV_DT_MXFP4 ? (v5 ? mxfp4_gemv5 : mxfp4_gemv)
			      : dt == KV_DT_Q4_1 ? q4_1_gemv
			      : dt == KV_DT_Q5_1 ? q5_1_gemv
			      : dt == KV_DT_Q4_K ? (v5 ? q4_k_gemv5 : q4_k_gemv)
			      : dt == KV_DT_Q5_K ? (v5 ? q5_k_gemv5 : q5_k_gemv)
			      : dt == KV_DT_Q6_K ? (v5 ? q6_k_gemv5 : q6_k_gemv)
			      : dt == KV_DT_Q2_K ? (v5 ? q2_k_gemv5 : q2_k_gemv)
						 : q3_k_gemv;
		fn(w, wstride, K, a, astride, m, y, ldy, accum, n0, n1);
		return;
	}
#endif
	for (int n = n0; n < n1; n++)
		for (int i = 0; i < m; i++)
			put(y + (size_t)i * ldy + n, accum, ke_qdot_ref(dt, w + (size_t)n * wstride, K, a + (size_t)i * astride));
}
