/*
 * corrupt.c - see corrupt.h: the message, the log line and the counter of
 * a corruption report.
 */
#include "base/corrupt.h"
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>

static uint64_t g_corrupt;

int kv_corrupt_report(const char *src, int line, const char *datafile, uint64_t offset,
		      const char *fmt, ...)
{
	char why[768];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	__atomic_add_fetch(&g_corrupt, 1, __ATOMIC_RELAXED);
	kv_fail(KV_ERR_CORRUPT, "%s: %s (offset %llu)", datafile ? datafile : "?", why,
		(unsigned long long)offset);
	kv_log(KV_LOG_WARN, "corrupt", "file=%s offset=%llu src=%s:%d why=\"%s\"",
	       datafile ? datafile : "?", (unsigned long long)offset, src, line, why);
	return KV_ERR_CORRUPT;
}

uint64_t kv_corrupt_count(void)
{
	return __atomic_load_n(&g_corrupt, __ATOMIC_RELAXED);
}
