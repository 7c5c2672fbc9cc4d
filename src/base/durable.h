/*
 * durable.h - atomic, durable file writes.
 *
 * Protocol (docs/persistence.md): create "<final>.tmp.<pid>.<n>" in the same folder
 * with O_EXCL and mode 0600 -> write everything -> fdatasync -> close ->
 * rename onto the final name -> fsync the folder (unless the caller batches
 * folder syncs with KV_DW_NO_DIRSYNC and calls kv_io_fsync_dir itself).
 *
 * Invariants: after any failure the final path is absent (or unchanged if
 * it existed before the rename step), and the temp file is unlinked when
 * the OS lets us. A failed fsync/fdatasync is never retried: the data may
 * be gone from the page cache, so the object simply does not exist. A
 * crash leaves at most a "*.tmp.*" file, which startup scans delete.
 */
#ifndef KV_BASE_DURABLE_H
#define KV_BASE_DURABLE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define KV_DW_NO_DIRSYNC 1u /* skip the folder fsync (caller batches it) */
#define KV_DW_NO_SYNC 2u    /* skip fdatasync too (tests, throwaway output) */
/* a file for the user (a model, logits, a trace): its mode becomes
 * 0666 minus the umask at commit, like any file a tool writes; without
 * it the file keeps the temp file's 0600 (the cache store's objects) */
#define KV_DW_PUBLIC 4u

struct kv_dw {
	int fd;              /* temp file descriptor, -1 when closed */
	uint64_t off;        /* bytes written so far */
	int failed;          /* a write failed: commit will refuse */
	char final[4096];    /* destination path */
	char tmp[4200];      /* temp path in the same folder */
};

/* Create the temp file. On error nothing is left on disk. */
int kv_dw_begin(struct kv_dw *w, const char *final_path);
/* Append bytes. On error the writer is marked failed (call abort). */
int kv_dw_write(struct kv_dw *w, const void *p, size_t n);
/* Sync, close, rename, sync the folder. Always releases the writer. */
int kv_dw_commit(struct kv_dw *w, unsigned flags);
/* Close and unlink the temp file. Safe to call on a released writer. */
void kv_dw_abort(struct kv_dw *w);

/* One-shot forms. */
int kv_durable_write(const char *path, const void *p, size_t n, unsigned flags);
int kv_durable_writev(const char *path, const struct iovec *iov, int iovcnt, unsigned flags);

/* 1 if a file name looks like temp debris ("*.tmp.*"). */
int kv_dw_is_temp_name(const char *name);

#endif
