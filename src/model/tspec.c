/*
 * tspec.c - see tspec.h.
 */
#include "model/tspec.h"
#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kv_tspec(struct kv_tspecs *s, int layer, int role, int ndim, int64_t d0, int64_t d1, int64_t d2,
	      const char *fmt, ...)
{
	va_list ap;
	if (s->oom)
		return;
	if (s->n == s->cap) {
		size_t nc = s->cap ? s->cap * 2 : 64;
		struct kv_tensor_spec *nv = realloc(s->v, nc * sizeof *nv);
		if (!nv) {
			s->oom = 1;
			return;
		}
		s->v = nv;
		s->cap = nc;
	}
	struct kv_tensor_spec *t = &s->v[s->n++];
	memset(t, 0, sizeof *t);
	va_start(ap, fmt);
	vsnprintf(t->name, sizeof t->name, fmt, ap);
	va_end(ap);
	t->ndim = ndim;
	t->shape[0] = d0;
	t->shape[1] = d1;
	t->shape[2] = d2;
	t->role = role;
	t->layer = layer;
	t->expert = -1;
}

int kv_tspec_finish(struct kv_tspecs *s, struct kv_tensor_spec **out, size_t *n)
{
	*out = NULL;
	*n = 0;
	if (s->oom) {
		free(s->v);
		s->v = NULL;
		return kv_fail(KV_ERR_NOMEM, "out of memory listing tensors");
	}
	*out = s->v;
	*n = s->n;
	return KV_OK;
}
