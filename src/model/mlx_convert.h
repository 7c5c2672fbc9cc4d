/*
 * mlx_convert.h - `kvkeep convert-mlx` (`kvkeep convert --mlx-bits`): a
 * Hugging Face folder written as an MLX quantized folder (the layout
 * model/mlx.h reads).
 */
#ifndef KV_MODEL_MLX_CONVERT_H
#define KV_MODEL_MLX_CONVERT_H

/* Options of kv_mlx_write. */
struct kv_mlx_write_opts {
	const char *hf_dir;  /* source Hugging Face folder (F32/BF16/F16) */
	const char *out_dir; /* created if missing */
	int bits;            /* 4 or 8 */
	int group_size;      /* 32, 64 or 128 */
	unsigned dw_flags;   /* KV_DW_* (base/durable.h) */
	/* Per-module overrides, "MODULE=BITS:GROUP" or "MODULE=float", comma
	 * separated (MODULE is the output module path, e.g.
	 * "model.layers.0.mlp.down_proj"); NULL for none. Written into the
	 * quantization block as mlx-lm does for mixed recipes. */
	const char *overrides;
};

/*
 * Write an MLX quantized folder: model.safetensors with mlx-lm's names
 * ("language_model.model.*" / "language_model.lm_head" for qwen3_5,
 * "model.*" / "lm_head" otherwise), every matrix whose input dimension the
 * group divides quantized (embedding included), conv1d in mlx-lm's
 * sanitized [C, K, 1] shape and the (1 + w) norms of the hybrids stored
 * shifted (1 + w, in the source dtype) as mlx-lm's sanitize() does,
 * config.json with the quantization block, tokenizer files copied.
 */
int kv_mlx_write(const struct kv_mlx_write_opts *o);

#endif
