/*
 * ns.h - cache namespaces: which model (and tenant) a file belongs to.
 *
 * A namespace is XXH3-128 over "kvkeep-ns|" + the model fingerprint (16
 * bytes, little endian lo then hi) + "|" + the cache salt. The fingerprint
 * is the server's hash of config.json, every byte of the weights,
 * tokenizer.json, the chat template, the KV dtype, the page size and the
 * engine's numerics version (server/fingerprint.h). The salt is --cache-salt,
 * or a request's cache_salt when --allow-request-salt is on; an empty
 * salt is no salt. Another namespace's files are never read as hits: the
 * loader checks every file's "namespace" metadata (obj.h step 4), and the
 * namespace is also h_{-1} of every chain hash, so even a copied file
 * cannot name a block of ours.
 *
 * The marker file <root>/<ns>/namespace.safetensors is a safetensors file
 * without tensors. Its __metadata__:
 *   "format" "kvkeep-disk", "version" "1", "kind" "namespace",
 *   "namespace"  32 hex,
 *   "label"      free text (the served model name), for `kvkeep cache ls`,
 *   "salted"     "1" when a salt went into the namespace, else "0",
 *   "layout"     the engine layout (below), so `kvkeep cache verify` can
 *                run the server's loader without loading the model,
 *   "created"    unix seconds.
 * The server rewrites it at every start (durably) and touches it every
 * hour while it serves, so its modification time is the namespace's last
 * use; the startup scan removes namespaces whose marker (or, without one,
 * folder) is older than 7 days, unless the namespace's lock is held.
 *
 * The lock file <root>/<ns>/lock: a serving store holds an exclusive
 * flock(2) on it for its whole life (released by the kernel when the
 * process dies, kill -9 included) and writes its pid into it (decimal and
 * a newline, for the message a second server prints). The age-out takes
 * the same lock (non-blocking) before removing a namespace and keeps it
 * until the folder is gone, so a live namespace is never removed and a
 * server starting meanwhile waits, then finds its lock file unlinked and
 * makes a new one.
 *
 * Layout text: "v1 B=256 dt=BF16 attn=8 kvh=4 hd=256" (dt F32, BF16, F16
 * or Q8_0, the row bytes following from it: engine/layout.h) followed by one
 * " rec=L:conv_off:cd:k1:state_off:hv:dk:dv" per recurrent layer, where
 * conv_bytes = cd x k1 x 4 and state_bytes = hv x dk x dv x 4. Parsing
 * checks every number and rebuilds the derived fields.
 */
#ifndef KV_STORE_NS_H
#define KV_STORE_NS_H

#include <stddef.h>
#include <stdint.h>

#include "base/hash.h"
#include "engine/layout.h"

#define KS_NS_MAX_AGE_S (7 * 24 * 3600)
#define KS_NS_LOCK_FILE "lock"
#define KS_NS_TOUCH_S 3600 /* a serving store touches its marker this often */

struct kv_h128 ks_ns_derive(struct kv_h128 model_fp, const char *salt);

/* Layout to text (NUL-terminated; KV_ERR_INVALID if it does not fit) and
 * back (KV_ERR_CORRUPT naming what is wrong). */
int ks_ns_layout_str(const struct ke_layout *L, char *out, size_t cap);
int ks_ns_layout_parse(const char *s, struct ke_layout *L);

/* Write the marker into ns_dir (created 0700 if missing). */
int ks_ns_mark(const char *ns_dir, struct kv_h128 ns, const char *label, int salted, const struct ke_layout *L);

struct ks_ns_info {
	struct kv_h128 ns;
	char label[128];
	int salted;
	int has_layout;
	struct ke_layout layout;
	int64_t created;
	int64_t mtime;            /* the marker's modification time (last use) */
};
/* Read a marker file. KV_ERR_NOT_FOUND when there is none, KV_ERR_CORRUPT. */
int ks_ns_read(const char *ns_dir, struct ks_ns_info *out);

/*
 * Take the namespace's lock for a serving store (the folder must exist).
 * KV_OK and *fd (keep it open; close releases); KV_ERR_NOT_OURS when
 * another process holds it (*holder_pid its pid, 0 if unknown), after
 * waiting up to wait_s for an age-out that may hold it briefly; the I/O
 * error of creating the file otherwise (KV_ERR_FULL on a full disk).
 */
int ks_ns_lock(const char *ns_dir, double wait_s, int *fd, long *holder_pid);
/* For the age-out: 1 when a live process holds the lock (leave the
 * namespace alone); else 0 and *fd holds the lock (-1 when there is no
 * lock file); close it after the folder is removed. */
int ks_ns_lock_for_removal(const char *ns_dir, int *fd);

#endif
