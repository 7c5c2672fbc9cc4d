/*
 * durable.c - see durable.h.
 */
#include "base/durable.h"
#include "base/err.h"
#include "base/io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t g_seq;

static void dir_of(const char *path, char *out, size_t cap)
{
	const char *s = strrchr(path, '/');
	if (!s) {
		snprintf(out, cap, ".");
	} else if (s == path) {
		snprintf(out, cap, "/");
	} else {
		size_t n = (size_t)(s - path);
		if (n >= cap)
			n = cap - 1;
		memcpy(out, path, n);
		out[n] = 0;
	}
}

/* The umask without changing it (umask(2) sets it too, for every thread):
 * the "Umask:" line of /proc/self/status (Linux 4.7), else the usual 022. */
static mode_t process_umask(void)
{
	char buf[4096];
	size_t n = 0;
	int fd = kv_io_open("/proc/self/status", O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return 022;
	while (n < sizeof buf - 1) { /* procfs reports size 0: read to the end */
		ssize_t r = kv_io_pread(fd, buf + n, sizeof buf - 1 - n, n);
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	kv_io_close(fd);
	buf[n] = 0;
	const char *u = strstr(buf, "\nUmask:");
	unsigned v;
	if (!u || sscanf(u + 7, "%o", &v) != 1)
		return 022;
	return (mode_t)(v & 0777);
}

int kv_dw_begin(struct kv_dw *w, const char *final_path)
{
	size_t n = strlen(final_path);

	w->fd = -1;
	w->off = 0;
	w->failed = 0;
	w->tmp[0] = 0;
	if (n == 0 || n >= sizeof w->final)
		return kv_fail(KV_ERR_INVALID, "bad output path (length %zu)", n);
	memcpy(w->final, final_path, n + 1);
	snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%d.%llu", final_path, (int)getpid(),
		 (unsigned long long)__atomic_add_fetch(&g_seq, 1, __ATOMIC_RELAXED));
	w->fd = kv_io_open(w->tmp, O_WRONLY | O_CREAT | O_EXCL, 0600);
	if (w->fd < 0) {
		int e = errno;
		w->tmp[0] = 0;
		return kv_fail(kv_io_errno_code(e), "%s: create temp file: %s", final_path, strerror(e));
	}
	return KV_OK;
}

int kv_dw_write(struct kv_dw *w, const void *p, size_t n)
{
	int rc;
	if (w->fd < 0 || w->failed)
		return kv_fail(KV_ERR_INVALID, "%s: write on a failed or closed writer", w->final);
	rc = kv_io_pwrite_full(w->fd, p, n, w->off, w->tmp);
	if (rc) {
		w->failed = 1;
		return rc;
	}
	w->off += n;
	return KV_OK;
}

void kv_dw_abort(struct kv_dw *w)
{
	if (w->fd >= 0) {
		kv_io_close(w->fd);
		w->fd = -1;
	}
	if (w->tmp[0]) {
		kv_io_unlink(w->tmp);
		w->tmp[0] = 0;
	}
}

int kv_dw_commit(struct kv_dw *w, unsigned flags)
{
	const char *op;
	int e = 0, rc;
	char dir[4096];

	if (w->fd < 0 || w->failed) {
		kv_dw_abort(w);
		return kv_fail(KV_ERR_IO, "%s: commit after a failed write", w->final);
	}
	if (flags & KV_DW_PUBLIC)
		(void)fchmod(w->fd, 0666 & ~process_umask()); /* the data is there either way */
	op = "fdatasync";
	if (!(flags & KV_DW_NO_SYNC) && kv_io_fdatasync(w->fd) != 0)
		goto fail;
	op = "close";
	rc = kv_io_close(w->fd);
	w->fd = -1;
	if (rc != 0)
		goto fail;
	op = "rename";
	if (kv_io_rename(w->tmp, w->final) != 0)
		goto fail;
	w->tmp[0] = 0;
	if (!(flags & (KV_DW_NO_DIRSYNC | KV_DW_NO_SYNC))) {
		op = "fsync folder";
		dir_of(w->final, dir, sizeof dir);
		if (kv_io_fsync_dir(dir) != 0) {
			/* The rename may not be durable and we never retry a failed
			 * fsync: remove the final name so the object does not exist. */
			e = errno;
			kv_io_unlink(w->final);
			errno = e;
			goto fail;
		}
	}
	return KV_OK;
fail:
	e = errno;
	kv_dw_abort(w);
	return kv_fail(kv_io_errno_code(e), "%s: %s: %s", w->final, op, strerror(e));
}

int kv_durable_writev(const char *path, const struct iovec *iov, int iovcnt, unsigned flags)
{
	struct kv_dw w;
	int rc = kv_dw_begin(&w, path);
	if (rc)
		return rc;
	for (int i = 0; i < iovcnt; i++) {
		rc = kv_dw_write(&w, iov[i].iov_base, iov[i].iov_len);
		if (rc) {
			kv_dw_abort(&w);
			return rc;
		}
	}
	return kv_dw_commit(&w, flags);
}

int kv_durable_write(const char *path, const void *p, size_t n, unsigned flags)
{
	struct iovec v = {.iov_base = (void *)p, .iov_len = n};
	return kv_durable_writev(path, &v, 1, flags);
}

int kv_dw_is_temp_name(const char *name)
{
	return strstr(name, ".tmp.") != NULL;
}
