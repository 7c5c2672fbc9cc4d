/*
 * quant.h - ggml's block formats: sizes, dequantization, quantization.
 *
 * A row of n elements of a block type is n / QK blocks laid end to end
 * (n must be a multiple of QK). Block layouts, byte by byte (little
 * endian; "f16" is an IEEE half, "f32" a float; QK_K = 256):
 *
 *   F32   4 bytes per element             F16 / BF16  2 bytes per element
 *   Q4_0  QK 32, 18 B: f16 d; u8 qs[16]   x[j] = ((qs[j] & 15) - 8) d,
 *                                          x[j+16] = ((qs[j] >> 4) - 8) d
 *   Q4_1  QK 32, 20 B: f16 d, m; u8 qs[16]  x = q d + m (q as Q4_0, no -8)
 *   Q5_0  QK 32, 22 B: f16 d; u8 qh[4]; u8 qs[16]  5th bit of element j
 *                                          is bit j of qh (u32); q - 16
 *   Q5_1  QK 32, 24 B: f16 d, m; u8 qh[4]; u8 qs[16]   x = q d + m
 *   Q8_0  QK 32, 34 B: f16 d; i8 qs[32]   x = qs d
 *   Q2_K  QK_K, 84 B: u8 scales[16] (lo nibble scale, hi nibble min);
 *                     u8 qs[64] (2 bits); f16 d, dmin
 *   Q3_K  QK_K, 110 B: u8 hmask[32]; u8 qs[64]; u8 scales[12] (16 6-bit
 *                     scales, offset 32); f16 d
 *   Q4_K  QK_K, 144 B: f16 d, dmin; u8 scales[12] (8 6-bit scales and
 *                     8 6-bit mins); u8 qs[128]   x = d sc q - dmin m
 *   Q5_K  QK_K, 176 B: f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
 *   Q6_K  QK_K, 210 B: u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d
 *                     x = d sc (q - 32)
 *   Q8_K  QK_K, 292 B: f32 d; i8 qs[256]; i16 bsums[16]   x = d qs
 *   MXFP4 QK 32, 17 B: u8 e (E8M0); u8 qs[16]   x[j] = v(qs[j] & 15) 2^(e - 128),
 *                     x[j+16] = v(qs[j] >> 4) 2^(e - 128), v = {0, 1, 2, 3, 4, 6,
 *                     8, 12} and their negatives for codes 8..15 (E2M1 doubled)
 *
 * Dequantization follows ggml's reference to_float (ggml-quants.c
 * dequantize_row_*) operation by operation, in the same order and with
 * the same float roundings (no fused multiply-adds), so the floats are
 * bit-identical to ggml's; the oracle test checks this against the real
 * library. Quantization follows ggml's reference quantizers (from_float_ref:
 * the K types' scale searches included) and gives the same bytes
 * (test_quant: quant_bytes_identical_to_ggml, through tests/peer's kvpeer).
 */
#ifndef KV_MODEL_QUANT_H
#define KV_MODEL_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ggml's get_scale_min_k4: the 6-bit scale *sc and min *m of slice j
 * (0..7) of a Q4_K / Q5_K block's scales[12] (the block's bytes 4..15).
 * The one unpacking of them: dequantization, the quantizer's check, the
 * f32-mode fused GEMVs and the integer path's kernels all call it. */
static inline void kq_scale_min_k4(const uint8_t *scales, int j, uint8_t *sc, uint8_t *m)
{
	if (j < 4) {
		*sc = scales[j] & 63;
		*m = scales[j + 4] & 63;
	} else {
		*sc = (uint8_t)((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
		*m = (uint8_t)((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
	}
}

/* The same 8 scales (the bytes of sc[0..1], slice j in byte j) and 8 mins
 * (mn[0..1]) four at a time, for SIMD kernels. */
static inline void kq_scale_min_k4_words(const uint8_t *scales, uint32_t *sc, uint32_t *mn)
{
	uint32_t u0, u1, u2;
	memcpy(&u0, scales, 4);
	memcpy(&u1, scales + 4, 4);
	memcpy(&u2, scales + 8, 4);
	sc[0] = u0 & 0x3f3f3f3fu;
	mn[0] = u1 & 0x3f3f3f3fu;
	sc[1] = (u2 & 0x0f0f0f0fu) | (((u0 >> 6) & 0x03030303u) << 4);
	mn[1] = ((u2 >> 4) & 0x0f0f0f0fu) | (((u1 >> 6) & 0x03030303u) << 4);
}

/* ggml_type numbers as stored in GGUF tensor infos. */
enum kq_ggml_type {
	KQ_GGML_F32 = 0, KQ_GGML_F16 = 1, KQ_GGML_Q4_0 = 2, KQ_GGML_Q4_1 = 3,
	KQ_GGML_Q5_0 = 6, KQ_GGML_Q5_1 = 7, KQ_GGML_Q8_0 = 8, KQ_GGML_Q8_1 = 9,
	KQ_GGML_Q2_K = 10, KQ_GGML_Q3_K = 11, KQ_GGML_Q4_K = 12, KQ_GGML_Q5_K = 13,
	KQ_GGML_Q6_K = 14, KQ_GGML_Q8_K = 15, KQ_GGML_I8 = 24, KQ_GGML_I16 = 25,
	KQ_GGML_I32 = 26, KQ_GGML_I64 = 27, KQ_GGML_F64 = 28, KQ_GGML_BF16 = 30,
	KQ_GGML_MXFP4 = 39, KQ_GGML__COUNT = 40
};

#define KQ_QK 32
#define KQ_QK_K 256

/* kv_dtype (model/dtype.h) of a ggml type, -1 if kvkeep does not
 * run it. And back: the ggml type of a kv_dtype, -1 if none. */
int kq_dtype_from_ggml(int ggml_type);
int kq_ggml_from_dtype(int dtype);
/* ggml's name of a ggml type number ("Q4_K", "IQ2_XXS", ...) or NULL if
 * the number is not a ggml type at all. */
const char *kq_ggml_name(int ggml_type);

/* Dequantize n elements (a multiple of the block size) of a row of
 * dtype `dt` at src (any alignment) into dst. KV_ERR_INVALID for a dtype
 * without a to_float or n not a multiple. F32/F16/BF16 are accepted. */
int kq_dequant_row(int dt, const void *src, float *dst, size_t n);

/* gpt_oss's release layout (Hugging Face, U8 _blocks [rows, nb, 16] with
 * element 2j in the low nibble of byte j and 2j + 1 in the high one, and
 * _scales [rows, nb]) -> ggml MXFP4 blocks, nb per row: the same values. */
void kq_mxfp4_from_hf(const uint8_t *blocks, const uint8_t *scales, uint64_t n_blocks, uint8_t *dst);

/* MXFP4's block scale: 2^(e - 128) (ggml's GGML_E8M0_TO_FP32_HALF; the
 * element values are the doubled E2M1 codes, kq_mxfp4_values), built
 * from the bits: exact for every e, 2^-128 and 2^-127 subnormal. */
static inline float kq_e8m0_half(uint8_t e)
{
	uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
	float d;
	memcpy(&d, &bits, 4);
	return d;
}

/* The doubled E2M1 value of each 4-bit MXFP4 code. */
extern const int8_t kq_mxfp4_values[16];

/* Quantize n floats (a multiple of the block size) into dst. Supported:
 * F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
 * KV_ERR_INVALID otherwise. */
int kq_quant_row(int dt, const float *src, void *dst, size_t n);

/* The GGUF file types written by `kvkeep convert` and how a model's
 * tensors are typed under them (llama.cpp's llama_ftype numbers). */
enum kq_ftype {
	KQ_FTYPE_F32 = 0, KQ_FTYPE_F16 = 1, KQ_FTYPE_Q4_0 = 2, KQ_FTYPE_Q4_1 = 3, KQ_FTYPE_Q8_0 = 7,
	KQ_FTYPE_Q5_0 = 8, KQ_FTYPE_Q5_1 = 9, KQ_FTYPE_Q2_K = 10, KQ_FTYPE_Q3_K_S = 11, KQ_FTYPE_Q3_K_M = 12,
	KQ_FTYPE_Q3_K_L = 13, KQ_FTYPE_Q4_K_S = 14, KQ_FTYPE_Q4_K_M = 15, KQ_FTYPE_Q5_K_S = 16,
	KQ_FTYPE_Q5_K_M = 17, KQ_FTYPE_Q6_K = 18, KQ_FTYPE_BF16 = 32
};
/* "f32", "q4_k_m", ... (case-insensitive) -> ftype; -1 if unknown. */
int kq_ftype_parse(const char *s);
const char *kq_ftype_name(int ftype);
/* Every name kq_ftype_parse takes, "f32|f16|...", for help texts. */
const char *kq_ftype_list(void);

/*
 * The kv_dtype a 2-D weight gets under an ftype, llama.cpp's rule
 * (llama-quant.cpp llama_tensor_get_type, the branches that apply to
 * qwen3/qwen35/qwen35moe/qwen3next without an importance matrix; the
 * full list is in docs/gguf.md "Per-tensor types of the mixes"): the base
 * type of the ftype, except
 *   output.weight (or token_embd.weight when there is no output.weight)
 *     -> Q6_K (Q8_0 stays);
 *   attn_v.weight and attn_qkv.weight (DeltaNet in_proj_qkv), counted
 *     together in file order (i_attn_v of n_attn_v): q2_k Q3_K/Q4_K by
 *     n_gqa, q3_k_m Q5_K for the first two, q3_k_l Q5_K, q4_k_m/q5_k_m
 *     Q6_K where use_more_bits, q4_k_s Q5_K for the first four; Q8_0 with
 *     exactly 8 experts;
 *   attn_k.weight (8 experts: Q8_0), attn_output.weight (q2_k, q3_k_m,
 *     q3_k_l; 8 experts: Q5_K) and ffn_down* by layer likewise;
 * and a type whose block does not divide the row falls back as llama.cpp
 * does (Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, F16
 * when 32 does not divide). tests/peer/peer_models.sh and peer_convert.sh
 * compare whole files with llama_model_quantize's, byte for byte.
 * `name` is the GGUF tensor name, layer/n_layers its layer (-1 outside),
 * i_attn_v the index among the model's attn_v + attn_qkv tensors.
 */
struct kq_mix_ctx {
	int n_layers;
	int n_attn_v;          /* attn_v.weight tensors in the model */
	int has_output;        /* output.weight present (untied) */
	int n_expert;          /* routed experts (llama.cpp has rules for exactly 8) */
	int n_gqa;             /* query heads / KV heads (llama.cpp's n_gqa(), Q2_K's attn_v rule) */
};
int kq_ftype_tensor_dtype(int ftype, const struct kq_mix_ctx *m, const char *name, int layer, int i_attn_v,
			  int64_t row_len);

#endif
