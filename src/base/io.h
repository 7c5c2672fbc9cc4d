/*
 * io.h - all file I/O goes through this table (docs/style.md).
 *
 * The default table calls the system. Tests swap single entries
 * (kv_io_set_ops) or, more often, arm a fault plan (kv_io_fault_set) that
 * makes matching calls fail with an errno (EIO, ENOSPC, EROFS), makes
 * pwrite short, slows writes down to a given bandwidth, or "crashes" after
 * the k-th mutating step:
 *   KV_IO_CRASH_EXIT    the process calls _exit(KV_IO_CRASH_STATUS) right
 *                       after step k completed (for child-process tests);
 *   KV_IO_CRASH_FREEZE  every later call fails with EIO and changes nothing,
 *                       which is what the disk looks like to a process
 *                       that died there (for in-process tests).
 * Steps are the calls that change the disk: open with O_CREAT or write
 * access, pwrite, fsync, fdatasync, close of a written fd, rename, unlink,
 * mkdir, folder fsync. Reads are never steps.
 *
 * All wrappers return what the syscall returns (-1 and errno on failure).
 */
#ifndef KV_BASE_IO_H
#define KV_BASE_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

enum kv_io_op {
	KV_IO_OPEN = 0,
	KV_IO_CLOSE,
	KV_IO_PREAD,
	KV_IO_PWRITE,
	KV_IO_FSYNC,
	KV_IO_FDATASYNC,
	KV_IO_RENAME,
	KV_IO_UNLINK,
	KV_IO_MKDIR,
	KV_IO_FSYNC_DIR,
	KV_IO_FSTAT,
	KV_IO_FTRUNCATE,
	KV_IO__COUNT
};
#define KV_IO_BIT(op) (1u << (op))

struct kv_io_ops {
	int (*open)(const char *path, int flags, mode_t mode);
	int (*close)(int fd);
	ssize_t (*pread)(int fd, void *buf, size_t n, off_t off);
	ssize_t (*pwrite)(int fd, const void *buf, size_t n, off_t off);
	int (*fsync)(int fd);
	int (*fdatasync)(int fd);
	int (*rename)(const char *from, const char *to);
	int (*unlink)(const char *path);
	int (*mkdir)(const char *path, mode_t mode);
	int (*fstat)(int fd, struct stat *st);
	int (*ftruncate)(int fd, off_t len);
};

/* Replace the table (NULL restores the system calls). Not thread-safe:
 * call before threads that do I/O start. */
void kv_io_set_ops(const struct kv_io_ops *ops);

enum { KV_IO_CRASH_NONE = 0, KV_IO_CRASH_EXIT = 1, KV_IO_CRASH_FREEZE = 2 };
#define KV_IO_CRASH_STATUS 77

struct kv_io_fault {
	uint32_t ops;              /* KV_IO_BIT mask the error applies to (0 = none) */
	int err;                   /* errno to fail with, e.g. EIO, ENOSPC */
	int64_t after;             /* let this many matching calls pass first */
	int64_t count;             /* then fail this many (<= 0: forever) */
	int short_write;           /* matching pwrite writes half, no errno */
	const char *path_substr;   /* if set, path ops match only such paths */
	int64_t crash_after_step;  /* >= 1: crash after this mutating step */
	int crash_mode;            /* KV_IO_CRASH_* */
	uint64_t write_bytes_per_s;/* > 0: pwrite sleeps to emulate this rate */
	uint64_t sync_delay_us;    /* > 0: each fsync/fdatasync sleeps this long */
};

/* Arm a fault plan (copied; path_substr must outlive it). NULL disarms and
 * resets the step counter and the crashed state. */
void kv_io_fault_set(const struct kv_io_fault *f);
/* Calls failed by the plan since it was armed. */
uint64_t kv_io_faults_injected(void);
/* 1 after a FREEZE crash happened. */
int kv_io_crashed(void);

int kv_io_open(const char *path, int flags, mode_t mode);
int kv_io_close(int fd);
ssize_t kv_io_pread(int fd, void *buf, size_t n, uint64_t off);
ssize_t kv_io_pwrite(int fd, const void *buf, size_t n, uint64_t off);
int kv_io_fsync(int fd);
int kv_io_fdatasync(int fd);
int kv_io_rename(const char *from, const char *to);
int kv_io_unlink(const char *path);
int kv_io_mkdir(const char *path, mode_t mode);
int kv_io_fstat(int fd, struct stat *st);
int kv_io_ftruncate(int fd, uint64_t len);
/* Open the folder read-only and fsync it. */
int kv_io_fsync_dir(const char *dir);

/* Helpers returning KV_OK or a kv_err code with a kv_fail message. */
/* Read exactly n bytes at off; a short file is KV_ERR_CORRUPT. */
int kv_io_pread_full(int fd, void *buf, size_t n, uint64_t off, const char *path);
/* Write all n bytes at off (loops on short writes). ENOSPC -> KV_ERR_FULL. */
int kv_io_pwrite_full(int fd, const void *buf, size_t n, uint64_t off, const char *path);
/* Whole file into a malloc'd buffer (NUL-terminated, *len excludes it);
 * files over max_len are KV_ERR_INVALID. Caller frees with free(). */
int kv_io_read_file(const char *path, size_t max_len, char **out, size_t *len);
/* A small file (a /proc or /sys one: read to the end, whatever its size
 * says) into buf, at most cap - 1 bytes, NUL-terminated. */
int kv_io_read_small(const char *path, char *buf, size_t cap);
/* mkdir -p with mode for each created folder. */
int kv_io_mkdirs(const char *path, mode_t mode);
/*
 * Format a path (or URL) into out[cap]: KV_OK, or KV_ERR_INVALID ("path too
 * long: ...") when it does not fit. A path cut short names another file,
 * so on failure out is "" and must not be used.
 */
int kv_path_fmt(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Map an errno to a kv_err code (ENOSPC/EDQUOT -> FULL, ENOENT -> NOT_FOUND,
 * ENOMEM -> NOMEM, else IO). */
int kv_io_errno_code(int e);

#endif
