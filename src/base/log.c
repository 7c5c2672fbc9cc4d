/*
 * log.c - see log.h.
 */
#include "base/env.h"
#include "base/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static int g_level = -1;
static int g_fd = 2;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

int kv_log_parse_level(const char *s)
{
	if (!s)
		return -1;
	if (!strcasecmp(s, "debug")) return KV_LOG_DEBUG;
	if (!strcasecmp(s, "info")) return KV_LOG_INFO;
	if (!strcasecmp(s, "warn") || !strcasecmp(s, "warning")) return KV_LOG_WARN;
	if (!strcasecmp(s, "error")) return KV_LOG_ERROR;
	if (!strcasecmp(s, "off") || !strcasecmp(s, "none")) return KV_LOG_OFF;
	return -1;
}

/*
 * The level is read once, under g_once. An invalid KVKEEP_LOG is not
 * reported from inside init_level: kv_log calls kv_log_enabled, which
 * would wait on the same pthread_once forever (a self-deadlock that hung
 * `KVKEEP_LOG=bogus kvkeep serve`, issue 37). init_level only records the
 * bad text; the first kv_log_enabled after it takes the record (one
 * exchange, so exactly one caller) and warns through the ordinary path.
 */
static const char *g_bad_level; /* set by init_level, taken once by report_bad_level */

static void init_level(void)
{
	const char *e = kv_env(KV_ENV_LOG);
	int l = kv_log_parse_level(e);
	if (__atomic_load_n(&g_level, __ATOMIC_RELAXED) < 0)
		__atomic_store_n(&g_level, l < 0 ? KV_LOG_INFO : l, __ATOMIC_RELAXED);
	if (e && *e && l < 0)
		__atomic_store_n(&g_bad_level, e, __ATOMIC_RELEASE);
}

static void report_bad_level(void)
{
	const char *e = __atomic_exchange_n(&g_bad_level, NULL, __ATOMIC_ACQ_REL);
	char v[128];
	if (!e)
		return;
	kv_log_escape(e, v, sizeof v);
	kv_log(KV_LOG_WARN, "log.level_invalid", "value=\"%s\" using=info", v);
}

int kv_log_enabled(int level)
{
	pthread_once(&g_once, init_level);
	if (__builtin_expect(__atomic_load_n(&g_bad_level, __ATOMIC_RELAXED) != NULL, 0))
		report_bad_level();
	return level >= __atomic_load_n(&g_level, __ATOMIC_RELAXED);
}

void kv_log_set_level(int level)
{
	pthread_once(&g_once, init_level);
	__atomic_store_n(&g_level, level, __ATOMIC_RELAXED);
}

void kv_log_set_fd(int fd)
{
	g_fd = fd;
}

void kv_log_escape(const char *in, char *out, size_t cap)
{
	size_t n = 0;
	if (!cap)
		return;
	for (; in && *in && n + 5 < cap; in++) {
		unsigned char ch = (unsigned char)*in;
		if (ch == '"' || ch == '\\') {
			out[n++] = '\\';
			out[n++] = (char)ch;
		} else if (ch < 0x20 || ch == 0x7f) {
			n += (size_t)snprintf(out + n, cap - n, "\\x%02x", ch);
		} else {
			out[n++] = (char)ch;
		}
	}
	out[n] = 0;
}

void kv_log(int level, const char *event, const char *fields, ...)
{
	static const char *names[] = {"debug", "info", "warn", "error", "off"};
	char line[4096];
	struct timespec ts;
	struct tm tm;
	size_t n;
	int k;

	if (!kv_log_enabled(level))
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	k = snprintf(line, sizeof line, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s event=%s",
		     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
		     ts.tv_nsec / 1000000, names[level < 0 ? 0 : level > 4 ? 4 : level], event);
	n = k < 0 ? 0 : (size_t)k;
	if (fields && n < sizeof line - 2) {
		va_list ap;
		line[n++] = ' ';
		va_start(ap, fields);
		k = vsnprintf(line + n, sizeof line - n, fields, ap);
		va_end(ap);
		if (k > 0)
			n += (size_t)k;
	}
	if (n > sizeof line - 2)
		n = sizeof line - 2;
	line[n++] = '\n';
	ssize_t w = write(g_fd, line, n);
	(void)w;
}
