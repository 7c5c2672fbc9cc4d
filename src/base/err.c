/*
 * err.c - error strings and the thread-local message buffer.
 *
 * It calls nothing else in base/: every module reports its failures through
 * it, the environment table and the logger included (a corruption report,
 * which also logs, is base/corrupt.c).
 */
#include "base/err.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char g_msg[1024];

const char *kv_strerror(int err)
{
	switch (err) {
	case KV_OK: return "ok";
	case KV_ERR_NOT_OURS: return "not ours";
	case KV_ERR_VERSION: return "unsupported version";
	case KV_ERR_INCOMPATIBLE: return "incompatible";
	case KV_ERR_CORRUPT: return "corrupt";
	case KV_ERR_IO: return "i/o error";
	case KV_ERR_NOMEM: return "out of memory";
	case KV_ERR_FULL: return "full";
	case KV_ERR_INVALID: return "invalid argument";
	case KV_ERR_NOT_FOUND: return "not found";
	case KV_ERR_UNSUPPORTED: return "unsupported";
	case KV_ERR_CANCELLED: return "cancelled";
	case KV_ERR_TIMEOUT: return "timed out";
	}
	return "unknown error";
}

int kv_failv(int err, const char *fmt, va_list ap)
{
	vsnprintf(g_msg, sizeof g_msg, fmt, ap);
	return err;
}

int kv_fail(int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	kv_failv(err, fmt, ap);
	va_end(ap);
	return err;
}

int kv_fail_ctx(int err, const char *fmt, ...)
{
	char old[sizeof g_msg];
	char pre[512];
	va_list ap;

	memcpy(old, g_msg, sizeof old);
	va_start(ap, fmt);
	vsnprintf(pre, sizeof pre, fmt, ap);
	va_end(ap);
	int n = old[0] ? snprintf(g_msg, sizeof g_msg, "%s: %s", pre, old) : snprintf(g_msg, sizeof g_msg, "%s", pre);
	/* A context chain longer than the buffer keeps its outer part and says
	 * that the rest was cut, rather than ending mid-word silently. */
	if (n >= (int)sizeof g_msg)
		memcpy(g_msg + sizeof g_msg - 4, "...", 4);
	return err;
}

const char *kv_errmsg(void)
{
	return g_msg;
}

void kv_errclear(void)
{
	g_msg[0] = 0;
}
