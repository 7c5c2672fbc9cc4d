/*
 * mlx.h - MLX quantized model folders (the mlx-community layout written by
 * mlx-lm): reading their quantization block and quantized matrices, and
 * the affine quantization of a group (model/mlx_convert.h writes such a
 * folder from a Hugging Face one). docs/models.md has the format.
 *
 * A quantized matrix X (an nn.Linear or the embedding, [out, in] in
 * floats) is three tensors:
 *   X.weight  U32 [out, in * bits / 32]  codes, 32 / bits per u32, the
 *                                        first value in the low bits
 *   X.scales  F32|BF16|F16 [out, in / group]
 *   X.biases  same dtype and shape as X.scales
 * and element k of row r is scales[r][k / group] * q + biases[r][k / group].
 * config.json says "quantization": {"group_size": G, "bits": B} (also
 * copied to "quantization_config"), with optional per-module entries keyed
 * by the module path (the tensor name without ".weight"): an object with
 * its own group_size / bits, or false for a module left in floats.
 * The engine runs bits 4 and 8, groups 32, 64 and 128.
 */
#ifndef KV_MODEL_MLX_H
#define KV_MODEL_MLX_H

#include <stddef.h>
#include <stdint.h>

struct kv_weights;
struct kv_tensor;

/* The "quantization" block of a config.json. */
struct kv_mlx_qcfg;

/* Parse <dir>/config.json's "quantization" (or "quantization_config"
 * with mode "affine" / bits and group_size). *out is NULL when the config
 * has neither (a float model). KV_ERR_INVALID / KV_ERR_UNSUPPORTED naming
 * the field for a malformed block, a mode other than affine, bits other
 * than 4 or 8, a group other than 32, 64 or 128. */
int kv_mlx_qcfg_load(const char *dir, struct kv_mlx_qcfg **out);
int kv_mlx_qcfg_parse(const char *text, size_t len, const char *what, struct kv_mlx_qcfg **out);
void kv_mlx_qcfg_free(struct kv_mlx_qcfg *q);
/* bits/group for a module path ("model.layers.0.mlp.up_proj"): 1 when the
 * module is quantized, 0 when an override says false. */
int kv_mlx_qcfg_lookup(const struct kv_mlx_qcfg *q, const char *module, int *bits, int *group);
/* The default bits / group_size. */
void kv_mlx_qcfg_default(const struct kv_mlx_qcfg *q, int *bits, int *group);

/* A quantized matrix found in a weights handle. */
struct kv_mlx_qmat {
	const struct kv_tensor *codes, *scales, *biases;
	int bits, group;
	int64_t rows, cols; /* the float shape */
};

/*
 * The matrix stored as `weight_name` ("....weight"), when it is quantized
 * (its dtype is U32). Returns KV_OK with out->codes NULL when the tensor
 * is not U32 (a float matrix: the caller checks it). With q, bits and
 * group come from the config (lookup of the module path) and rows / cols
 * (the float shape) may be -1 to derive them; without q, rows and cols are
 * required and bits / group are derived from the shapes. Every mismatch
 * is KV_ERR_INCOMPATIBLE naming the tensor and both shapes: missing
 * .scales / .biases, codes not [rows, cols * bits / 32], scales or biases
 * not [rows, cols / group], scales and biases of different or non-float
 * dtypes, a module the config says is not quantized.
 */
int kv_mlx_matrix(const struct kv_weights *w, const char *weight_name, const struct kv_mlx_qcfg *q, int64_t rows,
		  int64_t cols, struct kv_mlx_qmat *out);

/*
 * Affine quantization of one group of n floats (mlx's scheme: the
 * endpoint of larger magnitude is represented exactly, q in [0, 2^bits)).
 * codes[i] gets q of x[i]; *scale and *bias are the group's f32 values
 * before rounding to the output dtype (the caller rounds them first and
 * passes the rounded pair to kv_mlx_quant_codes).
 */
void kv_mlx_quant_params(const float *x, int n, int bits, float *scale, float *bias);
void kv_mlx_quant_codes(const float *x, int n, int bits, float scale, float bias, uint8_t *codes);
/* Pack n codes (n a multiple of 32 / bits) into n * bits / 8 bytes. */
void kv_mlx_pack(const uint8_t *codes, int n, int bits, uint8_t *out);

#endif
