/*
 * buf.c - see buf.h.
 */
#include "base/buf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kv_buf_free(struct kv_buf *b)
{
	free(b->p);
	b->p = NULL;
	b->len = b->cap = 0;
	b->oom = 0;
}

void kv_buf_reset(struct kv_buf *b)
{
	b->len = 0;
	if (b->p)
		b->p[0] = 0;
}

int kv_buf_reserve(struct kv_buf *b, size_t extra)
{
	size_t need, nc;
	char *np;
	if (b->oom)
		return -1;
	if (extra > ((size_t)-1) / 2 - b->len) {
		b->oom = 1;
		return -1;
	}
	need = b->len + extra + 1;
	if (need <= b->cap)
		return 0;
	nc = b->cap ? b->cap : 64;
	while (nc < need)
		nc *= 2;
	np = realloc(b->p, nc);
	if (!np) {
		b->oom = 1;
		return -1;
	}
	b->p = np;
	b->cap = nc;
	return 0;
}

void kv_buf_add(struct kv_buf *b, const void *p, size_t n)
{
	if (kv_buf_reserve(b, n))
		return;
	if (n)
		memcpy(b->p + b->len, p, n);
	b->len += n;
	b->p[b->len] = 0;
}

void kv_buf_adds(struct kv_buf *b, const char *s)
{
	kv_buf_add(b, s, strlen(s));
}

void kv_buf_addc(struct kv_buf *b, char c)
{
	kv_buf_add(b, &c, 1);
}

void kv_buf_vprintf(struct kv_buf *b, const char *fmt, va_list ap)
{
	va_list ap2;
	int n;
	va_copy(ap2, ap);
	n = vsnprintf(NULL, 0, fmt, ap2);
	va_end(ap2);
	if (n < 0 || kv_buf_reserve(b, (size_t)n))
		return;
	vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
	b->len += (size_t)n;
}

void kv_buf_printf(struct kv_buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	kv_buf_vprintf(b, fmt, ap);
	va_end(ap);
}

char *kv_buf_take(struct kv_buf *b)
{
	char *p = b->p;
	if (!p)
		p = calloc(1, 1);
	b->p = NULL;
	b->len = b->cap = 0;
	b->oom = 0;
	return p;
}
