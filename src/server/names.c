/*
 * names.c - the model names a server answers to (--served-model-name
 * a,b): the requests' way in checks them, /v1/models lists them.
 */
#include "server/server_int.h"

#include <stdio.h>
#include <string.h>

int ksv_server_serves(const struct ksv_server *s, const char *name)
{
	for (int i = 0; i < s->n_names; i++)
		if (!strcmp(s->names[i], name))
			return 1;
	return 0;
}

void ksv_server_names_text(const struct ksv_server *s, char *out, size_t cap)
{
	size_t at = 0;
	out[0] = 0;
	for (int i = 0; i < s->n_names && at < cap; i++)
		at += (size_t)snprintf(out + at, cap - at, "%s'%s'", i ? ", " : "", s->names[i]);
}

