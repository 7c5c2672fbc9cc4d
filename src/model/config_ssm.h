/*
 * config_ssm.h - the Mamba-2 hybrids' part of config.c (config_ssm.c):
 * granitemoehybrid and nemotron_h. Internal to src/model; the public
 * entry points are config.h's.
 */
#ifndef KV_MODEL_CONFIG_SSM_H
#define KV_MODEL_CONFIG_SSM_H

#include <jansson.h>

#include "model/config.h"

/* Fill c (zeroed by the caller) from a granitemoehybrid / nemotron_h
 * config.json object; messages name `what` and the field. */
int kv_config_parse_ssm(json_t *root, const char *what, struct kv_model_config *c);
/* Weight-name prefix: "backbone." for nemotron_h, "model." for granite. */
const char *kv_config_ssm_prefix(const struct kv_model_config *c);
/* kv_config_tensors for the two families, names under prefix p. */
int kv_config_tensors_ssm(const struct kv_model_config *c, const char *p, struct kv_tensor_spec **out, size_t *n);

#endif
