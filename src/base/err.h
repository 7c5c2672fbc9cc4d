/*
 * err.h - the one error enum of kvkeep and the thread-local error message.
 *
 * Every fallible function returns an int: KV_OK (0) or one of the codes
 * below. The codes keep apart what callers treat differently (a file from
 * another namespace is a miss, a corrupt file is quarantined, ENOSPC stops
 * the writer, ...). The human-readable reason ("model.safetensors: tensor
 * 'x' data_offsets end 40 past data section of 32 bytes") is kept in a
 * thread-local buffer set by kv_fail() and read by kv_errmsg(); it stays
 * valid until the next kv_fail() on the same thread.
 */
#ifndef KV_BASE_ERR_H
#define KV_BASE_ERR_H

#include <stdarg.h>
#include <stdint.h>

enum kv_err {
	KV_OK = 0,
	KV_ERR_NOT_OURS = -1,     /* valid, but belongs to another namespace/owner */
	KV_ERR_VERSION = -2,      /* format version we do not read */
	KV_ERR_INCOMPATIBLE = -3, /* well-formed but does not fit (shape, layout) */
	KV_ERR_CORRUPT = -4,      /* bytes that break a format rule */
	KV_ERR_IO = -5,           /* the OS said no (EIO, EACCES, ...) */
	KV_ERR_NOMEM = -6,        /* allocation or budget refused */
	KV_ERR_FULL = -7,         /* queue, disk (ENOSPC) or cache full */
	KV_ERR_INVALID = -8,      /* bad argument, flag or request */
	KV_ERR_NOT_FOUND = -9,    /* no such file, key, tensor, route */
	KV_ERR_UNSUPPORTED = -10, /* understood, not implemented (MoE, syntax) */
	KV_ERR_CANCELLED = -11,   /* caller asked to stop (disconnect, signal) */
	KV_ERR_TIMEOUT = -12,     /* a deadline passed */
};

/* Static string naming the code ("corrupt", "i/o error", ...). */
const char *kv_strerror(int err);

/*
 * Record a message for the calling thread and return `err` so callers can
 * write `return kv_fail(KV_ERR_CORRUPT, "%s: bad header", path);`.
 */
int kv_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int kv_failv(int err, const char *fmt, va_list ap);

/* Last message recorded on this thread ("" if none). Valid until the next
 * kv_fail on this thread. */
const char *kv_errmsg(void);

/* Prefix the current message: "ctx: <old message>". Returns err. */
int kv_fail_ctx(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clear the thread's message. */
void kv_errclear(void);

#endif
