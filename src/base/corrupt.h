/*
 * corrupt.h - reporting corrupt bytes where they are found (docs/style.md).
 *
 * A report records the message (kv_fail, base/err.h), logs one line with
 * the source file and line, the data file and the byte offset, and counts
 * it for /metrics. It lives apart from err.c because it logs: err.c is
 * the bottom of base/ (env.c and the logger report their own failures
 * through it), so it must not call the logger back.
 */
#ifndef KV_BASE_CORRUPT_H
#define KV_BASE_CORRUPT_H

#include <stdint.h>

#include "base/err.h"

/* Evaluates to KV_ERR_CORRUPT:
 *     if (n > len) return KV_CORRUPT(path, off, "length %zu past end", n); */
#define KV_CORRUPT(datafile, offset, ...) \
	kv_corrupt_report(__FILE__, __LINE__, (datafile), (uint64_t)(offset), __VA_ARGS__)
int kv_corrupt_report(const char *src, int line, const char *datafile, uint64_t offset,
		      const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Process-wide count of KV_CORRUPT reports (for /metrics). */
uint64_t kv_corrupt_count(void);

#endif
