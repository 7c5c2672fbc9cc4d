/*
 * io.c - the I/O table and its fault plan. See io.h.
 */
#include "base/io.h"
#include "base/err.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int sys_open(const char *p, int f, mode_t m) { return open(p, f | O_CLOEXEC, m); }
static ssize_t sys_pread(int fd, void *b, size_t n, off_t o) { return pread(fd, b, n, o); }
static ssize_t sys_pwrite(int fd, const void *b, size_t n, off_t o) { return pwrite(fd, b, n, o); }
static int sys_mkdir(const char *p, mode_t m) { return mkdir(p, m); }

static const struct kv_io_ops g_sys = {
	.open = sys_open,
	.close = close,
	.pread = sys_pread,
	.pwrite = sys_pwrite,
	.fsync = fsync,
	.fdatasync = fdatasync,
	.rename = rename,
	.unlink = unlink,
	.mkdir = sys_mkdir,
	.fstat = fstat,
	.ftruncate = ftruncate,
};
static struct kv_io_ops g_ops = {
	.open = sys_open,
	.close = close,
	.pread = sys_pread,
	.pwrite = sys_pwrite,
	.fsync = fsync,
	.fdatasync = fdatasync,
	.rename = rename,
	.unlink = unlink,
	.mkdir = sys_mkdir,
	.fstat = fstat,
	.ftruncate = ftruncate,
};

void kv_io_set_ops(const struct kv_io_ops *ops)
{
	g_ops = ops ? *ops : g_sys;
}

/* Fault plan state. g_armed is read without the lock on the fast path. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_armed;
static struct kv_io_fault g_plan;
static int64_t g_matched;
static uint64_t g_steps;
static uint64_t g_injected;
static int g_crashed;

void kv_io_fault_set(const struct kv_io_fault *f)
{
	pthread_mutex_lock(&g_lock);
	if (f)
		g_plan = *f;
	else
		memset(&g_plan, 0, sizeof g_plan);
	g_matched = 0;
	g_steps = 0;
	g_injected = 0;
	g_crashed = 0;
	__atomic_store_n(&g_armed, f != NULL, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&g_lock);
}

uint64_t kv_io_faults_injected(void) { return __atomic_load_n(&g_injected, __ATOMIC_RELAXED); }
int kv_io_crashed(void) { return __atomic_load_n(&g_crashed, __ATOMIC_RELAXED); }

enum { PASS = 0, FAIL = 1, SHORT = 2 };

/*
 * Decide what happens to one call before it runs. Returns PASS, FAIL (errno
 * set) or SHORT. `mut` says whether the call is a mutating step.
 */
static int pre_call(int op, const char *path, int mut)
{
	int r = PASS;

	if (!__atomic_load_n(&g_armed, __ATOMIC_ACQUIRE))
		return PASS;
	pthread_mutex_lock(&g_lock);
	if (g_crashed) {
		pthread_mutex_unlock(&g_lock);
		errno = EIO;
		return FAIL;
	}
	if ((g_plan.ops & KV_IO_BIT(op)) &&
	    (!g_plan.path_substr || !path || strstr(path, g_plan.path_substr))) {
		int64_t k = g_matched++;
		if (k >= g_plan.after && (g_plan.count <= 0 || k < g_plan.after + g_plan.count)) {
			if (op == KV_IO_PWRITE && g_plan.short_write) {
				r = SHORT;
			} else {
				r = FAIL;
				errno = g_plan.err ? g_plan.err : EIO;
			}
			g_injected++;
		}
	}
	(void)mut;
	pthread_mutex_unlock(&g_lock);
	return r;
}

/* Count a completed mutating step and crash if the plan says so. */
static void post_step(void)
{
	int crash = 0;
	if (!__atomic_load_n(&g_armed, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&g_lock);
	g_steps++;
	if (g_plan.crash_after_step > 0 && (int64_t)g_steps >= g_plan.crash_after_step && !g_crashed) {
		crash = g_plan.crash_mode;
		if (crash == KV_IO_CRASH_FREEZE)
			g_crashed = 1;
	}
	pthread_mutex_unlock(&g_lock);
	if (crash == KV_IO_CRASH_EXIT)
		_exit(KV_IO_CRASH_STATUS);
}

static void sleep_us(uint64_t us)
{
	struct timespec ts = {.tv_sec = (time_t)(us / 1000000), .tv_nsec = (long)(us % 1000000) * 1000};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

int kv_io_open(const char *path, int flags, mode_t mode)
{
	int mut = (flags & (O_CREAT | O_WRONLY | O_RDWR | O_TRUNC)) != 0;
	if (pre_call(KV_IO_OPEN, path, mut) == FAIL)
		return -1;
	int fd = g_ops.open(path, flags, mode);
	if (fd >= 0 && mut)
		post_step();
	return fd;
}

int kv_io_close(int fd)
{
	/* close always releases the descriptor, even in a simulated crash,
	 * so tests do not leak fds. */
	int frozen = kv_io_crashed();
	int r = g_ops.close(fd);
	if (frozen) {
		errno = EIO;
		return -1;
	}
	return r;
}

ssize_t kv_io_pread(int fd, void *buf, size_t n, uint64_t off)
{
	if (pre_call(KV_IO_PREAD, NULL, 0) == FAIL)
		return -1;
	return g_ops.pread(fd, buf, n, (off_t)off);
}

ssize_t kv_io_pwrite(int fd, const void *buf, size_t n, uint64_t off)
{
	int r = pre_call(KV_IO_PWRITE, NULL, 1);
	ssize_t w;
	if (r == FAIL)
		return -1;
	if (r == SHORT && n > 1)
		n /= 2;
	if (__atomic_load_n(&g_armed, __ATOMIC_ACQUIRE) && g_plan.write_bytes_per_s)
		sleep_us((uint64_t)((double)n * 1e6 / (double)g_plan.write_bytes_per_s));
	w = g_ops.pwrite(fd, buf, n, (off_t)off);
	if (w >= 0)
		post_step();
	return w;
}

static int sync_common(int op, int fd, int (*fn)(int))
{
	if (pre_call(op, NULL, 1) == FAIL)
		return -1;
	if (__atomic_load_n(&g_armed, __ATOMIC_ACQUIRE) && g_plan.sync_delay_us)
		sleep_us(g_plan.sync_delay_us);
	int r = fn(fd);
	if (r == 0)
		post_step();
	return r;
}

int kv_io_fsync(int fd) { return sync_common(KV_IO_FSYNC, fd, g_ops.fsync); }
int kv_io_fdatasync(int fd) { return sync_common(KV_IO_FDATASYNC, fd, g_ops.fdatasync); }

int kv_io_rename(const char *from, const char *to)
{
	if (pre_call(KV_IO_RENAME, to, 1) == FAIL)
		return -1;
	int r = g_ops.rename(from, to);
	if (r == 0)
		post_step();
	return r;
}

int kv_io_unlink(const char *path)
{
	if (pre_call(KV_IO_UNLINK, path, 1) == FAIL)
		return -1;
	int r = g_ops.unlink(path);
	if (r == 0)
		post_step();
	return r;
}

int kv_io_mkdir(const char *path, mode_t mode)
{
	if (pre_call(KV_IO_MKDIR, path, 1) == FAIL)
		return -1;
	int r = g_ops.mkdir(path, mode);
	if (r == 0)
		post_step();
	return r;
}

int kv_io_fstat(int fd, struct stat *st)
{
	if (pre_call(KV_IO_FSTAT, NULL, 0) == FAIL)
		return -1;
	return g_ops.fstat(fd, st);
}

int kv_io_ftruncate(int fd, uint64_t len)
{
	if (pre_call(KV_IO_FTRUNCATE, NULL, 1) == FAIL)
		return -1;
	int r = g_ops.ftruncate(fd, (off_t)len);
	if (r == 0)
		post_step();
	return r;
}

int kv_io_fsync_dir(const char *dir)
{
	int fd, r, e;
	if (pre_call(KV_IO_FSYNC_DIR, dir, 1) == FAIL)
		return -1;
	fd = g_ops.open(dir, O_RDONLY | O_DIRECTORY, 0);
	if (fd < 0)
		return -1;
	if (__atomic_load_n(&g_armed, __ATOMIC_ACQUIRE) && g_plan.sync_delay_us)
		sleep_us(g_plan.sync_delay_us);
	r = g_ops.fsync(fd);
	e = errno;
	g_ops.close(fd);
	errno = e;
	if (r == 0)
		post_step();
	return r;
}

int kv_io_errno_code(int e)
{
	switch (e) {
	case ENOSPC:
	case EDQUOT:
		return KV_ERR_FULL;
	case ENOENT:
		return KV_ERR_NOT_FOUND;
	case ENOMEM:
		return KV_ERR_NOMEM;
	default:
		return KV_ERR_IO;
	}
}

int kv_io_pread_full(int fd, void *buf, size_t n, uint64_t off, const char *path)
{
	char *p = buf;
	while (n) {
		ssize_t r = kv_io_pread(fd, p, n, off);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return kv_fail(kv_io_errno_code(errno), "%s: read at %llu: %s", path ? path : "?",
				       (unsigned long long)off, strerror(errno));
		}
		if (r == 0)
			return kv_fail(KV_ERR_CORRUPT, "%s: file ends at %llu, %zu bytes short",
				       path ? path : "?", (unsigned long long)off, n);
		p += r;
		n -= (size_t)r;
		off += (uint64_t)r;
	}
	return KV_OK;
}

int kv_io_pwrite_full(int fd, const void *buf, size_t n, uint64_t off, const char *path)
{
	const char *p = buf;
	while (n) {
		ssize_t w = kv_io_pwrite(fd, p, n, off);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return kv_fail(kv_io_errno_code(errno), "%s: write at %llu: %s", path ? path : "?",
				       (unsigned long long)off, strerror(errno));
		}
		if (w == 0)
			return kv_fail(KV_ERR_IO, "%s: write at %llu made no progress", path ? path : "?",
				       (unsigned long long)off);
		p += w;
		n -= (size_t)w;
		off += (uint64_t)w;
	}
	return KV_OK;
}

int kv_io_read_file(const char *path, size_t max_len, char **out, size_t *len)
{
	struct stat st;
	char *buf;
	int fd, rc;

	*out = NULL;
	if (len)
		*len = 0;
	fd = kv_io_open(path, O_RDONLY, 0);
	if (fd < 0)
		return kv_fail(kv_io_errno_code(errno), "%s: %s", path, strerror(errno));
	if (kv_io_fstat(fd, &st) != 0) {
		rc = kv_fail(KV_ERR_IO, "%s: stat: %s", path, strerror(errno));
		kv_io_close(fd);
		return rc;
	}
	if (!S_ISREG(st.st_mode)) {
		kv_io_close(fd);
		return kv_fail(KV_ERR_INVALID, "%s: not a regular file", path);
	}
	if ((uint64_t)st.st_size > max_len) {
		kv_io_close(fd);
		return kv_fail(KV_ERR_INVALID, "%s: %lld bytes, more than the limit of %zu", path,
			       (long long)st.st_size, max_len);
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		kv_io_close(fd);
		return kv_fail(KV_ERR_NOMEM, "%s: cannot allocate %lld bytes", path, (long long)st.st_size);
	}
	rc = kv_io_pread_full(fd, buf, (size_t)st.st_size, 0, path);
	kv_io_close(fd);
	if (rc) {
		free(buf);
		return rc;
	}
	buf[st.st_size] = 0;
	*out = buf;
	if (len)
		*len = (size_t)st.st_size;
	return KV_OK;
}

int kv_io_mkdirs(const char *path, mode_t mode)
{
	char buf[4096];
	size_t n = strlen(path);
	struct stat st;

	if (n == 0 || n >= sizeof buf)
		return kv_fail(KV_ERR_INVALID, "bad folder path '%s'", path);
	memcpy(buf, path, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (buf[i] != '/' && buf[i] != 0)
			continue;
		char c = buf[i];
		buf[i] = 0;
		if (stat(buf, &st) != 0) {
			if (kv_io_mkdir(buf, mode) != 0 && errno != EEXIST)
				return kv_fail(kv_io_errno_code(errno), "mkdir %s: %s", buf, strerror(errno));
		} else if (!S_ISDIR(st.st_mode)) {
			return kv_fail(KV_ERR_INVALID, "%s exists and is not a folder", buf);
		}
		buf[i] = c;
	}
	return KV_OK;
}

int kv_path_fmt(char *out, size_t cap, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = cap ? vsnprintf(out, cap, fmt, ap) : -1;
	va_end(ap);
	if (n >= 0 && (size_t)n < cap)
		return KV_OK;
	/* what fitted names the path in the message; then it is dropped */
	int rc = kv_fail(KV_ERR_INVALID, "path too long (%d bytes, room for %zu): %.64s...", n, cap ? cap - 1 : 0,
			 cap ? out : "");
	if (cap)
		out[0] = 0;
	return rc;
}

int kv_io_read_small(const char *path, char *buf, size_t cap)
{
	size_t len = 0;
	int fd = kv_io_open(path, O_RDONLY, 0);
	if (fd < 0)
		return kv_fail(kv_io_errno_code(errno), "%s: %s", path, strerror(errno));
	while (len + 1 < cap) {
		ssize_t r = kv_io_pread(fd, buf + len, cap - 1 - len, len);
		if (r < 0) {
			int e = errno;
			kv_io_close(fd);
			return kv_fail(KV_ERR_IO, "%s: read: %s", path, strerror(e));
		}
		if (r == 0)
			break;
		len += (size_t)r;
	}
	kv_io_close(fd);
	buf[len] = 0;
	return KV_OK;
}
