/*
 * open.h - a model path of any format (a Hugging Face or MLX folder, a
 * GGUF file, split set or folder holding one): its config, and its
 * weights checked against that config.
 *
 * These complete config.h's API (hence their kv_config_ names) and live
 * here, above the format readers, because they need them: config.c is
 * only the config.json parser, which model/gguf_model.c also uses to turn
 * GGUF metadata into a config, so it must not call back into the readers.
 */
#ifndef KV_MODEL_OPEN_H
#define KV_MODEL_OPEN_H

#include <stddef.h>

#include "model/config.h"

struct kv_weights;

/* Read <model_dir>/config.json, or the metadata of a GGUF model (a .gguf
 * file or a folder holding one: model/gguf_model.h). */
int kv_config_load(const char *model_dir, struct kv_model_config *out);

/*
 * Check that every tensor the config implies is present with its shape
 * and a float dtype (F32, BF16, F16), or as an MLX quantized matrix
 * (model/mlx.h). The prefix is found from the weights
 * ("model.language_model." or mlx-lm's "language_model.model." if its
 * embed_tokens is there, else "model.") and copied into prefix (may be
 * NULL). Extra tensors (mtp.*,
 * model.visual.*) are ignored. KV_ERR_INCOMPATIBLE names the first
 * missing or mismatched tensor. For MoE configs the expert layout is the
 * one the weights hold, see kv_config_detect_experts. Also accepted:
 * mlx-lm's sanitized conv1d shape [C, K, 1].
 */
int kv_config_check_weights(const struct kv_model_config *c, const struct kv_weights *w, char *prefix,
			    size_t cap);

/* Set c->expert_layout from the weights: STACKED when the first MoE
 * layer's "<prefix>layers.L.mlp.experts.gate_up_proj" exists, SWITCH when
 * its "mlp.switch_mlp.gate_proj.weight" does, else SPLIT.
 * No-op for dense configs. */
void kv_config_detect_experts(struct kv_model_config *c, const struct kv_weights *w, const char *prefix);

#endif
