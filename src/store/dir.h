/*
 * dir.h - the cache folder: where it is, how it is laid out, and the file
 * chores around objects (temp debris, quarantine, free space, last-use
 * times).
 *
 * Root, first match wins: --cache-dir DIR, $KVKEEP_CACHE_DIR,
 * $XDG_CACHE_HOME/kvkeep, ~/.cache/kvkeep. Layout under the root
 * (folders 0700, files 0600):
 *
 *   <root>/<ns>/namespace.safetensors        the namespace marker (ns.h)
 *   <root>/<ns>/<xx>/<id>.<kind>.safetensors objects (obj.h); <xx> = the
 *                                            first two hex digits of <id>
 *   <root>/kv_checkpoints/<ns>/<xx>/...      interval checkpoints
 *                                            (--kv-disk-checkpoint-interval):
 *                                            their tails, snapshots and
 *                                            manifests; their blocks live
 *                                            in <root>/<ns>/ like any other
 *   <root>/quarantine/<unix>-<ns8>-<name>    files that failed validation,
 *                                            kept for inspection, capped in
 *                                            bytes (oldest removed first)
 *
 * <ns> is the namespace's 32 hex digits. A file whose name holds ".tmp."
 * is debris of an interrupted durable write (base/durable.h) and is
 * deleted by the startup scan.
 */
#ifndef KV_STORE_DIR_H
#define KV_STORE_DIR_H

#include <stddef.h>
#include <stdint.h>

#include "base/hash.h"

#define KS_CKPT_DIR "kv_checkpoints"
#define KS_QUARANTINE_DIR "quarantine"
#define KS_NS_FILE "namespace.safetensors"
#define KS_QUARANTINE_MAX_DEFAULT (256ull << 20)

/* Areas of one namespace: the main objects and the interval checkpoints. */
enum ks_area { KS_AREA_MAIN = 0, KS_AREA_CKPT = 1, KS_AREA__COUNT };

/*
 * The root from the rule above. Any argument may be NULL or empty (= not
 * set). KV_ERR_INVALID when nothing is set (no HOME either) or the path
 * does not fit `cap`. Relative paths are kept as given.
 */
int ks_dir_root_from(const char *flag, const char *env_cache_dir, const char *env_xdg, const char *env_home,
		     char *out, size_t cap);
/* ks_dir_root_from with KVKEEP_CACHE_DIR, XDG_CACHE_HOME and HOME (base/env.h). */
int ks_dir_root(const char *flag, char *out, size_t cap);

/*
 * Path builders: KV_OK, or KV_ERR_INVALID when the path does not fit cap
 * (out is then "": a path cut short names another file).
 */
/* "<root>/<ns hex>" or "<root>/kv_checkpoints/<ns hex>". */
int ks_dir_ns_path(const char *root, struct kv_h128 ns, int area, char *out, size_t cap);
/* 1 if a folder name is a namespace's (32 lowercase hex digits). */
int ks_dir_is_ns_name(const char *name);
/* "<base>/<xx>" (the shard folder of id) and "<base>/<xx>/<name>". */
int ks_dir_shard_path(const char *base, struct kv_h128 id, char *out, size_t cap);
int ks_dir_obj_path(const char *base, int kind, struct kv_h128 id, char *out, size_t cap);

/* mkdir -p with 0700. */
int ks_dir_ensure(const char *path);

/*
 * Call fn for every regular file one or two levels below dir (the shards
 * and the namespace folder itself), in no particular order. fn returns 0
 * to go on, anything else to stop (returned). A missing dir is KV_OK.
 * path and name are valid during the call.
 */
typedef int (*ks_dir_file_fn)(void *ctx, const char *path, const char *name, uint64_t size, int64_t mtime_ns);
int ks_dir_walk(const char *dir, ks_dir_file_fn fn, void *ctx);

/* Delete every "*.tmp.*" file one or two levels below dir. Returns the
 * number deleted. */
size_t ks_dir_clean_temp(const char *dir);

/*
 * Move a file into <root>/quarantine/ (same filesystem: a rename), named
 * "<unix>-<tag>-<name>". Then delete the oldest quarantined files until
 * the folder holds at most cap bytes (0 = KS_QUARANTINE_MAX_DEFAULT).
 * When the move fails the file is deleted instead, so a bad file is never
 * offered twice. KV_OK or KV_ERR_IO.
 */
int ks_dir_quarantine(const char *root, const char *path, const char *tag, uint64_t cap);

/* Filesystem of path: total and available bytes. */
int ks_dir_fs(const char *path, uint64_t *total, uint64_t *avail);

/* Set a file's modification time to now (last use); errors ignored. */
void ks_dir_touch(const char *path);

/* Remove a folder tree (files, then folders). KV_OK or the first error. */
int ks_dir_rmtree(const char *path);

/* Wall clock in nanoseconds (last-use times). */
int64_t ks_dir_now_ns(void);

#endif
