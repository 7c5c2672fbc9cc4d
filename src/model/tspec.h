/*
 * tspec.h - a growing list of expected tensors (struct kv_tensor_spec,
 * model/config.h), the builder behind kv_config_tensors for every family:
 * model/config.c (attention, DeltaNet, MoE, sliding windows) and
 * model/config_ssm.c (Mamba-2 hybrids) add to one list the same way.
 */
#ifndef KV_MODEL_TSPEC_H
#define KV_MODEL_TSPEC_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

struct kv_tspecs {
	struct kv_tensor_spec *v; /* malloc'd; the caller owns it once done */
	size_t n, cap;
	int oom;                  /* an append failed: the list is incomplete */
};

/* Append a tensor named by fmt (layer -1: not a layer's; expert -1), shape
 * d0 x d1 x d2 of ndim dimensions. On allocation failure sets oom and
 * ignores this and every later call. */
void kv_tspec(struct kv_tspecs *s, int layer, int role, int ndim, int64_t d0, int64_t d1, int64_t d2,
	      const char *fmt, ...) __attribute__((format(printf, 8, 9)));
/* Hand the list over: *out = the tensors (malloc'd, the caller frees),
 * *n their count; KV_ERR_NOMEM (list freed, *out NULL) when an append
 * failed. */
int kv_tspec_finish(struct kv_tspecs *s, struct kv_tensor_spec **out, size_t *n);

#endif
