/*
 * log.h - leveled logging, one line per event, key=value fields.
 *
 * Line format (stderr):
 *     ts=2026-11-29T09:00:00.123Z level=info event=serve.ready port=8000
 * The level comes from KVKEEP_LOG (debug|info|warn|error, default info),
 * read on first use; kv_log_set_level() overrides it. An invalid value
 * means info, and the first log call after reading it writes one warning
 * line (event=log.level_invalid) naming the value. A line is written
 * with one write(2) so lines from threads never interleave.
 */
#ifndef KV_BASE_LOG_H
#define KV_BASE_LOG_H

#include <stddef.h>

enum kv_log_level { KV_LOG_DEBUG = 0, KV_LOG_INFO = 1, KV_LOG_WARN = 2, KV_LOG_ERROR = 3, KV_LOG_OFF = 4 };

/* `fields` is a printf format producing "k=v k=v" (may be NULL). */
void kv_log(int level, const char *event, const char *fields, ...) __attribute__((format(printf, 3, 4)));
int kv_log_enabled(int level);
void kv_log_set_level(int level);
/* Parse "debug"/"info"/"warn"/"error"/"off"; -1 if unknown. */
int kv_log_parse_level(const char *s);
/* Copy text for a quoted field value: '"' and '\\' get a backslash,
 * control bytes become \xHH, so text from a client cannot end the field
 * or start a new line. Truncated to cap (always NUL-terminated). */
void kv_log_escape(const char *in, char *out, size_t cap);
/* Redirect log output to a file descriptor (default 2). */
void kv_log_set_fd(int fd);

#define KV_DEBUG(ev, ...) do { if (kv_log_enabled(KV_LOG_DEBUG)) kv_log(KV_LOG_DEBUG, ev, __VA_ARGS__); } while (0)
#define KV_INFO(ev, ...) kv_log(KV_LOG_INFO, ev, __VA_ARGS__)
#define KV_WARN(ev, ...) kv_log(KV_LOG_WARN, ev, __VA_ARGS__)
#define KV_ERROR(ev, ...) kv_log(KV_LOG_ERROR, ev, __VA_ARGS__)

#endif
