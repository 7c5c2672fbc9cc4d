/*
 * weights.h - a model's weights, whatever format holds them: the one
 * handle the engine, the converters and the checks open a model through.
 *
 *   model.safetensors, or the shards model.safetensors.index.json lists
 *     ("weight_map": {tensor: file}); every shard is validated, and a
 *     tensor the index names but its shard lacks is an error;
 *   a GGUF path (a .gguf file, a split set or a folder holding one:
 *     model/gguf.h), its tensors under their Hugging Face names and layout
 *     (model/gguf_model.h).
 */
#ifndef KV_MODEL_WEIGHTS_H
#define KV_MODEL_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "model/tensor.h"

struct kv_weights;
/* Errors: KV_ERR_NOT_FOUND when the folder has neither file, KV_ERR_CORRUPT
 * for a malformed file or index (message names the file and the rule).
 * The mapped bytes are counted under KV_MEM_WEIGHTS (kv_mem_note) while
 * the handle is open. Tensor pointers stay valid until kv_weights_close. */
int kv_weights_open(const char *model_dir, struct kv_weights **out);
void kv_weights_close(struct kv_weights *w);
const struct kv_tensor *kv_weights_find(const struct kv_weights *w, const char *name);
size_t kv_weights_count(const struct kv_weights *w);
const struct kv_tensor *kv_weights_at(const struct kv_weights *w, size_t i);
/* Total bytes of tensor data (what is mapped). */
uint64_t kv_weights_bytes(const struct kv_weights *w);

/* Number of shard files (1 for a single model.safetensors). */
size_t kv_weights_nfiles(const struct kv_weights *w);
/* The GGUF file behind the weights, or NULL for safetensors. A GGUF path
 * (a .gguf file, a split set or a folder holding one: model/gguf.h) opens
 * the same way; tensors come under their Hugging Face names
 * (model/gguf_model.h). */
struct kv_gguf;
const struct kv_gguf *kv_weights_gguf(const struct kv_weights *w);
/* Bytes of tensor copies the handle owns (GGUF value-head permutations),
 * on top of the mapped files. */
uint64_t kv_weights_owned_bytes(const struct kv_weights *w);

#endif
