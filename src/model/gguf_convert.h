/*
 * gguf_convert.h - `kvkeep convert`: a Hugging Face folder (config.json,
 * safetensors, tokenizer.json) written as a GGUF file or split set that
 * llama.cpp loads, in any of the file types of model/quant.h. The names,
 * transforms and value-head order are model/gguf_map.h's, the per-tensor
 * types of the mixes llama.cpp's rule (kq_ftype_tensor_dtype).
 */
#ifndef KV_MODEL_GGUF_CONVERT_H
#define KV_MODEL_GGUF_CONVERT_H

#include <stddef.h>
#include <stdint.h>

struct kv_gguf_convert_params {
	const char *hf_dir;       /* Hugging Face folder (config.json, safetensors, tokenizer.json) */
	const char *out;          /* .gguf path */
	int ftype;                /* enum kq_ftype */
	unsigned dw_flags;        /* KV_DW_* */
	/* A split set instead of one file (either nonzero): `out` minus its
	 * ".gguf" is the prefix of "<prefix>-00001-of-0000N.gguf" ...
	 * (kv_ggufw_write_split); *n_files gets N (1 without a split). */
	uint64_t split_max_bytes;
	uint32_t split_max_tensors;
	int *n_files;
};
/* Writes the file; returns KV_OK or an error naming the step. Prints
 * nothing. *n_tensors / *bytes may be NULL. */
int kv_gguf_convert(const struct kv_gguf_convert_params *p, size_t *n_tensors, uint64_t *bytes);

#endif
