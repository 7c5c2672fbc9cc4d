/*
 * gguf_ssm.h - llama.cpp's granitehybrid and nemotron_h GGUF metadata read
 * as the Hugging Face config it came from (gguf_ssm.c). Internal to
 * src/model: kv_gguf_config (gguf_model.h) hands these architectures on.
 */
#ifndef KV_MODEL_GGUF_SSM_H
#define KV_MODEL_GGUF_SSM_H

#include "model/config.h"
#include "model/gguf.h"

/* 1 for "granitehybrid" and "nemotron_h". */
int kv_gguf_is_ssm_arch(const char *arch);
int kv_gguf_config_ssm(const struct kv_gguf *g, const char *arch, struct kv_model_config *out);

#endif
