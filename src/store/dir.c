/*
 * dir.c - see dir.h.
 *
 * Directory listing (opendir/readdir) and rmdir are not in the I/O table:
 * listing reads nothing from files and rmdir removes only empty folders,
 * so neither is a step a fault plan needs to cut. Everything that creates,
 * renames or deletes a file goes through kv_io_*.
 */
#include "store/dir.h"
#include "base/durable.h"
#include "base/env.h"
#include "base/err.h"
#include "base/io.h"
#include "base/log.h"
#include "store/obj.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

static int set(const char *s)
{
	return s && *s;
}

int ks_dir_root_from(const char *flag, const char *env_cache_dir, const char *env_xdg, const char *env_home,
		     char *out, size_t cap)
{
	int n;
	if (set(flag))
		n = snprintf(out, cap, "%s", flag);
	else if (set(env_cache_dir))
		n = snprintf(out, cap, "%s", env_cache_dir);
	else if (set(env_xdg))
		n = snprintf(out, cap, "%s/kvkeep", env_xdg);
	else if (set(env_home))
		n = snprintf(out, cap, "%s/.cache/kvkeep", env_home);
	else
		return kv_fail(KV_ERR_INVALID, "no cache folder: set --cache-dir, KVKEEP_CACHE_DIR, XDG_CACHE_HOME or HOME");
	if (n < 0 || (size_t)n >= cap)
		return kv_fail(KV_ERR_INVALID, "cache folder path is too long");
	/* "a/b/" and "a/b" name the same folder: keep one spelling */
	while (n > 1 && out[n - 1] == '/')
		out[--n] = 0;
	return KV_OK;
}

int ks_dir_root(const char *flag, char *out, size_t cap)
{
	return ks_dir_root_from(flag, kv_env(KV_ENV_CACHE_DIR), kv_env(KV_ENV_XDG_CACHE_HOME), kv_env(KV_ENV_HOME), out, cap);
}

int ks_dir_ns_path(const char *root, struct kv_h128 ns, int area, char *out, size_t cap)
{
	char hex[33];
	kv_h128_hex(ns, hex);
	if (area == KS_AREA_CKPT)
		return kv_path_fmt(out, cap, "%s/%s/%s", root, KS_CKPT_DIR, hex);
	return kv_path_fmt(out, cap, "%s/%s", root, hex);
}

int ks_dir_shard_path(const char *base, struct kv_h128 id, char *out, size_t cap)
{
	char hex[33];
	kv_h128_hex(id, hex);
	return kv_path_fmt(out, cap, "%s/%.2s", base, hex);
}

int ks_dir_obj_path(const char *base, int kind, struct kv_h128 id, char *out, size_t cap)
{
	char hex[33], name[64];
	kv_h128_hex(id, hex);
	ks_obj_name(kind, id, name);
	return kv_path_fmt(out, cap, "%s/%.2s/%s", base, hex, name);
}

int ks_dir_ensure(const char *path)
{
	return kv_io_mkdirs(path, 0700);
}

static int walk(const char *dir, int depth, ks_dir_file_fn fn, void *ctx)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int rc = 0;
	if (!d)
		return errno == ENOENT || errno == ENOTDIR ? 0 : kv_fail(kv_io_errno_code(errno), "%s: %s", dir, strerror(errno));
	while (!rc && (e = readdir(d))) {
		char p[4096];
		struct stat st;
		if (e->d_name[0] == '.')
			continue;
		if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p)
			continue;
		if (lstat(p, &st) != 0)
			continue;
		if (S_ISDIR(st.st_mode)) {
			/* only shard folders (two hex digits) are walked into */
			if (depth == 0 && strlen(e->d_name) == 2)
				rc = walk(p, 1, fn, ctx);
		} else if (S_ISREG(st.st_mode)) {
			rc = fn(ctx, p, e->d_name, (uint64_t)st.st_size,
				(int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec);
		}
	}
	closedir(d);
	return rc;
}

int ks_dir_walk(const char *dir, ks_dir_file_fn fn, void *ctx)
{
	return walk(dir, 0, fn, ctx);
}

static int temp_fn(void *ctx, const char *path, const char *name, uint64_t size, int64_t mtime)
{
	(void)size;
	(void)mtime;
	if (kv_dw_is_temp_name(name) && kv_io_unlink(path) == 0)
		(*(size_t *)ctx)++;
	return 0;
}

size_t ks_dir_clean_temp(const char *dir)
{
	size_t n = 0;
	ks_dir_walk(dir, temp_fn, &n);
	return n;
}

struct qfile {
	char name[256];
	uint64_t size;
	int64_t mtime;
};

static int cmp_qfile(const void *a, const void *b)
{
	const struct qfile *x = a, *y = b;
	if (x->mtime != y->mtime)
		return x->mtime < y->mtime ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* Keep the quarantine folder under cap bytes, oldest first out. */
static void quarantine_cap(const char *qdir, uint64_t cap)
{
	DIR *d = opendir(qdir);
	struct dirent *e;
	struct qfile *v = NULL;
	size_t n = 0, c = 0;
	uint64_t total = 0;
	if (!d)
		return;
	while ((e = readdir(d))) {
		char p[4096];
		struct stat st;
		if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof v->name)
			continue;
		if (kv_path_fmt(p, sizeof p, "%s/%s", qdir, e->d_name) || lstat(p, &st) || !S_ISREG(st.st_mode))
			continue;
		if (n == c) {
			size_t nc = c ? 2 * c : 64;
			struct qfile *nv = realloc(v, nc * sizeof *nv);
			if (!nv)
				break;
			v = nv;
			c = nc;
		}
		memcpy(v[n].name, e->d_name, strlen(e->d_name) + 1); /* fits: checked above */
		v[n].size = (uint64_t)st.st_size;
		v[n].mtime = (int64_t)st.st_mtime;
		total += v[n].size;
		n++;
	}
	closedir(d);
	if (total > cap) {
		qsort(v, n, sizeof *v, cmp_qfile);
		for (size_t i = 0; i < n && total > cap; i++) {
			char p[4096];
			if (kv_path_fmt(p, sizeof p, "%s/%s", qdir, v[i].name) == KV_OK && kv_io_unlink(p) == 0)
				total -= v[i].size;
		}
	}
	free(v);
}

int ks_dir_quarantine(const char *root, const char *path, const char *tag, uint64_t cap)
{
	char qdir[4096], dst[4096];
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	/* a path too long to keep is deleted like one that cannot be moved */
	if (kv_path_fmt(qdir, sizeof qdir, "%s/%s", root, KS_QUARANTINE_DIR) == KV_OK && ks_dir_ensure(qdir) == KV_OK &&
	    kv_path_fmt(dst, sizeof dst, "%s/%lld-%.8s-%s", qdir, (long long)time(NULL), tag ? tag : "x", base) == KV_OK) {
		if (kv_io_rename(path, dst) == 0) {
			quarantine_cap(qdir, cap ? cap : KS_QUARANTINE_MAX_DEFAULT);
			return KV_OK;
		}
	}
	/* could not keep it: never offer it again */
	if (kv_io_unlink(path) == 0 || errno == ENOENT)
		return KV_OK;
	return kv_fail(kv_io_errno_code(errno), "%s: cannot quarantine or delete: %s", path, strerror(errno));
}

int ks_dir_fs(const char *path, uint64_t *total, uint64_t *avail)
{
	struct statvfs sv;
	if (statvfs(path, &sv) != 0)
		return kv_fail(kv_io_errno_code(errno), "%s: statvfs: %s", path, strerror(errno));
	*total = (uint64_t)sv.f_blocks * sv.f_frsize;
	*avail = (uint64_t)sv.f_bavail * sv.f_frsize;
	return KV_OK;
}

void ks_dir_touch(const char *path)
{
	int fd = kv_io_open(path, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return;
	(void)futimens(fd, NULL);
	kv_io_close(fd);
}

static int rm_fn(void *ctx, const char *path, const char *name, uint64_t size, int64_t mtime)
{
	(void)name;
	(void)size;
	(void)mtime;
	if (kv_io_unlink(path) != 0 && errno != ENOENT && !*(int *)ctx)
		*(int *)ctx = kv_fail(kv_io_errno_code(errno), "%s: %s", path, strerror(errno));
	return 0;
}

int ks_dir_rmtree(const char *path)
{
	DIR *d;
	struct dirent *e;
	int rc = 0;
	ks_dir_walk(path, rm_fn, &rc);
	d = opendir(path);
	if (d) {
		while ((e = readdir(d))) {
			char p[4096];
			if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
				continue;
			if (kv_path_fmt(p, sizeof p, "%s/%s", path, e->d_name) == KV_OK)
				rmdir(p); /* shard folders, now empty */
		}
		closedir(d);
	}
	if (rmdir(path) != 0 && errno != ENOENT && !rc)
		rc = kv_fail(kv_io_errno_code(errno), "%s: %s", path, strerror(errno));
	return rc;
}

int64_t ks_dir_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int ks_dir_is_ns_name(const char *n)
{
	if (strlen(n) != 32)
		return 0;
	for (int i = 0; i < 32; i++)
		if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f')))
			return 0;
	return 1;
}
