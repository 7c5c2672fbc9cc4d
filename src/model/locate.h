/*
 * locate.h - models already on this machine, found by name, offline.
 *
 * Users of the Hugging Face hub and of Ollama already have models on
 * disk. `kvkeep serve -m NAME` and `kvkeep models` read the two stores
 * where those tools keep them; nothing here opens a network connection.
 *
 * Hugging Face hub cache (huggingface_hub's layout), root HF_HUB_CACHE,
 * else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
 * ~/.cache/huggingface/hub:
 *
 *   models--ORG--NAME/refs/main              the commit the repository's main is at
 *   models--ORG--NAME/snapshots/COMMIT/...   the files (symlinks into blobs/)
 *   models--ORG--NAME/blobs/SHA              the bytes
 *
 * A snapshot with config.json is one model, "ORG/NAME" (safetensors or
 * MLX). Each .gguf file of a snapshot (top level or one folder down; of a
 * split set the first part) is one model "ORG/NAME:TAG", TAG being the
 * last '-' or '.' separated word of its name ("Qwen3-8B-Q4_K_M.gguf" ->
 * "Q4_K_M"); a request "ORG/NAME:T" takes the GGUF whose name contains T
 * (case-insensitively, as llama.cpp's -hf REPO:QUANT does), "ORG/NAME"
 * alone the repository's only GGUF. Without refs/main the newest snapshot
 * is used.
 *
 * Ollama's store, root OLLAMA_MODELS, else ~/.ollama/models:
 *
 *   manifests/HOST/NAMESPACE/MODEL/TAG       JSON: {"layers": [{"mediaType", "digest", "size"}, ...]}
 *   blobs/sha256-HEX                         a layer's bytes
 *
 * The layer of media type application/vnd.ollama.image.model is the GGUF
 * file (a blob without a suffix: model/gguf.h knows it by its magic). Its
 * names: "MODEL:TAG" for registry.ollama.ai/library, "NAMESPACE/MODEL:TAG"
 * for another namespace there, "HOST/NAMESPACE/MODEL:TAG" otherwise (e.g.
 * hf.co/ORG/REPO:TAG); a name without a tag means ":latest".
 *
 * Lookup order for a name: the Hugging Face cache, then Ollama; a name
 * without '/' that Ollama does not have may still name a unique Hugging
 * Face repository by its NAME part.
 */
#ifndef KV_MODEL_LOCATE_H
#define KV_MODEL_LOCATE_H

#include <stddef.h>
#include <stdint.h>

#include "model/probe.h"

struct kv_locate_roots {
	char hf_hub[4096];        /* the hub cache folder ("" none) */
	char ollama[4096];        /* Ollama's models folder ("" none) */
};

/* The roots from the environment (base/env.h: HF_HUB_CACHE, HF_HOME,
 * XDG_CACHE_HOME, HOME, OLLAMA_MODELS). */
void kv_locate_roots_env(struct kv_locate_roots *r);

struct kv_local_model {
	char name[512];           /* what -m accepts ("Qwen/Qwen3-0.6B", "ORG/NAME:Q4_K_M", "qwen3:8b") */
	char path[4096];          /* what serve loads: a folder or a GGUF file */
	const char *source;       /* "huggingface" or "ollama" (static) */
	int ok;                   /* kv_model_probe passed */
	struct kv_model_probe probe; /* when ok */
	char err[300];            /* when not ok: why it cannot be served */
};

/*
 * Every model of both stores, sorted by source then name (*out malloc'd,
 * free()). A store that does not exist lists nothing. Each is probed
 * (model/probe.h); one that fails is listed with ok = 0 and its reason.
 * KV_OK or KV_ERR_NOMEM.
 */
int kv_locate_list(const struct kv_locate_roots *r, struct kv_local_model **out, size_t *n);

/*
 * The model a name means (see above), not probed. KV_ERR_NOT_FOUND with a
 * message naming the stores that were searched; KV_ERR_INVALID when the
 * name is ambiguous (the message lists the choices).
 */
int kv_locate_find(const struct kv_locate_roots *r, const char *name, struct kv_local_model *out);

#endif
