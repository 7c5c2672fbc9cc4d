/*
 * probe.h - what is at a model path, checked cheaply before anything is
 * loaded, with errors that name the cause and the fix.
 *
 * `kvkeep serve --model PATH` used to load the tokenizer first, so a
 * missing file, a truncated GGUF or a file of another format all failed
 * as "tokenizer: PATH/tokenizer.json: No such file". The probe looks at
 * the path the way a person would, in this order, and stops at the first
 * thing wrong:
 *
 *   1. does it exist, can this user read it (KV_ERR_NOT_FOUND, KV_ERR_IO)
 *   2. a file: its first bytes say its format. GGUF (magic "GGUF"; the
 *      suffix does not matter, an Ollama blob has none) is opened and its
 *      structure checked (kv_gguf_open: header, tensor table, every
 *      tensor inside the file), so a truncated download is KV_ERR_CORRUPT
 *      "damaged or incomplete" before anything else. Other formats are
 *      named (a single safetensors file, a PyTorch zip or pickle, an old
 *      GGML file, JSON, a web page saved by a failed download) with what
 *      to give instead (KV_ERR_UNSUPPORTED); an empty file is
 *      KV_ERR_CORRUPT.
 *   3. a folder with config.json: a Hugging Face folder (MLX when
 *      config.json has a "quantization" block). Its weights are opened
 *      (kv_weights_open: every safetensors header and size checked), and
 *      tokenizer.json must be there: its absence is the one error that
 *      names the tokenizer.
 *   4. a folder without config.json: one .gguf file or one split set
 *      (as 2), else "no model here".
 *
 * Nothing is mapped or allocated once it returns: the probe's handles are
 * closed. The full loaders run afterwards and still check everything.
 */
#ifndef KV_MODEL_PROBE_H
#define KV_MODEL_PROBE_H

#include <stddef.h>
#include <stdint.h>

enum kv_model_kind {
	KV_MODEL_GGUF = 1,        /* a .gguf file, a split set, or a folder holding one */
	KV_MODEL_HF,              /* config.json + safetensors + tokenizer.json */
	KV_MODEL_MLX,             /* the same with config.json "quantization" (mlx-lm) */
};

struct kv_model_probe {
	int kind;                 /* enum kv_model_kind */
	uint64_t weight_bytes;    /* bytes of tensor data in the weight files */
	char arch[64];            /* config.json model_type, or GGUF general.architecture ("" unknown) */
};

/* "gguf", "safetensors", "mlx" (static). */
const char *kv_model_kind_name(int kind);

/*
 * Check what is at path (see above). KV_OK with *out filled, or an error
 * whose message (kv_errmsg) names the path, the cause and what to do.
 */
int kv_model_probe(const char *path, struct kv_model_probe *out);

#endif
