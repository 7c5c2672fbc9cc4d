/*
 * buf.h - a growable byte buffer (always NUL-terminated).
 *
 * Allocation failures are sticky: the buffer sets `oom` and ignores later
 * appends, so code can append freely and check once at the end.
 */
#ifndef KV_BASE_BUF_H
#define KV_BASE_BUF_H

#include <stdarg.h>
#include <stddef.h>

struct kv_buf {
	char *p;      /* data, NUL-terminated when non-NULL */
	size_t len;   /* bytes used, excluding the NUL */
	size_t cap;   /* bytes allocated */
	int oom;      /* an append failed */
};

#define KV_BUF_INIT {0, 0, 0, 0}

void kv_buf_free(struct kv_buf *b);
void kv_buf_reset(struct kv_buf *b); /* len = 0, keeps memory */
int kv_buf_reserve(struct kv_buf *b, size_t extra);
void kv_buf_add(struct kv_buf *b, const void *p, size_t n);
void kv_buf_adds(struct kv_buf *b, const char *s);
void kv_buf_addc(struct kv_buf *b, char c);
void kv_buf_printf(struct kv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kv_buf_vprintf(struct kv_buf *b, const char *fmt, va_list ap);
/* Hand the data to the caller (free() it); the buffer becomes empty. */
char *kv_buf_take(struct kv_buf *b);

#endif
