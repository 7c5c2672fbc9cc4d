/*
 * remote.h - the remote tier of the prefix cache: the disk tier's objects
 * shared between servers through Redis Cluster (docs/cluster.md).
 *
 * What it holds. Exactly the disk tier's objects (obj.h: KV blocks,
 * tails, recurrent snapshots, entry manifests with their anchor), byte
 * for byte the file ks_obj_write would write, under a content-addressed
 * key:
 *
 *   <prefix><namespace hex>:<id hex>.<kind>.safetensors
 *
 * (the object's file name, obj.h ks_obj_name). The namespace is the model
 * fingerprint and the salt (ns.h) and also the seed of every chain hash,
 * so a salt or a fine-tune never names another's key, and a value copied
 * under another key fails its checks. The tier is kind-agnostic: it moves
 * the bytes of whatever (kind, id) the store's workers ask for, so a new
 * object kind of the disk tier needs nothing here.
 *
 * Reading (store/fetch.c with the remote as its source). A big value is
 * read in ranges (STRLEN and GETRANGE, pipelined a window at a time,
 * straight into one buffer; remote.c says why), a small one with a GET;
 * the store's read threads have several objects in flight at once, on
 * the nodes that own them. Every value goes
 * through the disk tier's own validation (ks_obj_open_mem + ks_obj_read:
 * size, header, version, namespace, checksums, the tokens against the
 * prompt's, shapes, positions, coverage) plus the key's own id, parent and
 * position. A value that fails is a miss for that part, counted by reason,
 * and deleted (so the writer that has the right bytes can put them back);
 * the lookup goes on at the longest valid prefix, as on disk.
 *
 * Writing (store/rwrite.c). Write-behind, fed by the disk writer: each
 * cache view it has written goes on to a bounded queue of the store's
 * remote writer, which SETs the view's objects (a TOUCH first for the big
 * ones: an object another server already put is only marked used) and an
 * entry manifest only once every object it names answers EXISTS: no
 * reader sees an entry whose parts were never written. Parts that Redis
 * evicts later (maxmemory + allkeys-lru does the tier's eviction) are
 * misses for those parts.
 *
 * Faults. Every call has a deadline: timeout_ms (default 200 ms), plus, for
 * a call that moves an object, the time its bytes take at 100 MB/s (a
 * 50 MiB snapshot is not cut by a deadline sized for a lookup); the
 * writers' calls get five times the timeout, since no request waits on
 * them. A transport failure (timeout,
 * no node, a lost connection) marks the tier down: lookups skip it and
 * the writers drop their queue (counted) while a background thread probes
 * the cluster with backoff (100 ms doubling to 5 s) and marks it up again
 * once every slot's master answers. Going down and coming back are logged
 * once each (remote.down, remote.up). At shutdown ks_remote_abort cuts
 * every call in flight: pending writes are dropped, never waited for past
 * the SIGTERM budget.
 *
 * Threads: every function may be called from any thread.
 */
#ifndef KV_STORE_REMOTE_H
#define KV_STORE_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "base/hash.h"
#include "engine/layout.h"
#include "store/obj.h"

#define KS_REMOTE_PREFIX_DEFAULT "kvkeep:"
#define KS_REMOTE_QUEUE_DEFAULT (512ull << 20) /* bytes of views a store's remote writer may hold */
#define KS_REMOTE_BIG (64u << 10)              /* objects at least this big are TOUCHed before a SET */

struct ks_remote_params {
	const char *url;           /* redis://[user:pass@]host:port[,host:port...] (copied) */
	const char *user;          /* overrides the URL's (NULL: the URL's) */
	const char *password;      /* overrides the URL's: from a file or the environment */
	const char *prefix;        /* key prefix (copied); NULL: KS_REMOTE_PREFIX_DEFAULT */
	int timeout_ms;            /* per call; 0: 200 */
	int to_disk;               /* a remote hit is also written to the local disk tier */
	uint64_t queue_bytes;      /* per store; 0: KS_REMOTE_QUEUE_DEFAULT */
	const struct ke_layout *layout; /* the largest object bounds a reply (copied) */
	int no_thread;             /* tests: no background probe (ks_remote_probe_now) */
	/* objects expected at least range_min bytes are read in ranges of
	 * range_chunk bytes, range_window of them per call (remote.c; 0: the
	 * defaults, 4 MiB, 1 MiB and 10; tests make them small) */
	size_t range_min, range_chunk;
	int range_window;
};

struct ks_remote;

/* Make the client and probe once (a cluster down at start is not an
 * error: the tier starts down and the probe thread keeps trying).
 * KV_ERR_INVALID for a bad URL or prefix, KV_ERR_NOMEM. */
int ks_remote_create(const struct ks_remote_params *p, struct ks_remote **out);
/* After every store that uses it is closed. */
void ks_remote_destroy(struct ks_remote *r);
/* Shutdown: every call in flight and later fails at once, writers drop
 * what they hold. Logs what was dropped. */
void ks_remote_abort(struct ks_remote *r);

/* 1 while the tier is up (lookups and writes go to it). */
int ks_remote_up(struct ks_remote *r);
/* Probe now (tests; the thread does it otherwise). Returns ks_remote_up. */
int ks_remote_probe_now(struct ks_remote *r);
/* A hit from the remote tier also goes to the disk tier (params.to_disk). */
int ks_remote_to_disk(const struct ks_remote *r);
uint64_t ks_remote_queue_cap(const struct ks_remote *r);
int ks_remote_timeout_ms(const struct ks_remote *r);

/* The key of an object into out (>= 160 bytes); its length. */
size_t ks_remote_key(const struct ks_remote *r, struct kv_h128 ns, int kind, struct kv_h128 id, char *out, size_t cap);

/* --- the objects (for the store's workers) ------------------------------ */

/*
 * Read one object (a GET, or STRLEN and GETRANGE windows for one of at
 * least range_min bytes; one deadline for the whole) and validate it like
 * a disk file (fetch.c load_obj): its
 * kind, namespace ns, id, parent and position, then ks_obj_read into dst
 * (dst->expect: the prompt's tokens). KV_OK (*bytes += its size, *info
 * filled when not NULL); KV_ERR_NOT_FOUND when the key is missing; a
 * validation error (KV_ERR_CORRUPT, KV_ERR_NOT_OURS, KV_ERR_VERSION: the
 * value is counted and deleted; a value that shrank or vanished between
 * two of its calls is KV_ERR_NOT_FOUND); a transport error (KV_ERR_TIMEOUT,
 * KV_ERR_IO, KV_ERR_CANCELLED: the tier goes down) - or KV_ERR_IO at once
 * while it is down.
 */
int ks_remote_load(struct ks_remote *r, const struct ke_layout *L, struct kv_h128 ns, int kind, struct kv_h128 id,
		   struct kv_h128 parent, uint32_t pos, const struct ks_obj_dst *dst, struct ks_obj_info *info,
		   uint64_t *bytes);
/* EXISTS of n objects in one call: have[i] = 1 / 0. KV_OK, or the
 * transport error (have[] then 0). for_write: a writer's call (five times
 * the timeout, as for ks_remote_put); else a lookup's. */
int ks_remote_have(struct ks_remote *r, struct kv_h128 ns, const int *kinds, const struct kv_h128 *ids, size_t n,
		   int for_write, uint8_t *have);
/*
 * Put one object (src->ns names its namespace). An object of at least
 * KS_REMOTE_BIG bytes is TOUCHed first and not sent again when present
 * (*sent = 0). The call's deadline is five times the timeout (no request
 * waits on a write) plus the time the bytes take at 100 MB/s. KV_OK, or the error (transport errors take the tier down).
 */
int ks_remote_put(struct ks_remote *r, const struct ke_layout *L, const struct ks_obj_src *src, int *sent);

/* --- accounting ----------------------------------------------------------- */

/* What one remote lookup did (fetch.c). */
void ks_remote_note_fetch(struct ks_remote *r, uint32_t pos, uint64_t bytes, uint32_t files, double seconds);
/* A lookup skipped because the tier is down. */
void ks_remote_note_skip(struct ks_remote *r);
/* Write-behind accounting (rwrite.c). */
enum ks_rdrop { KS_RDROP_DOWN = 0, KS_RDROP_QUEUE, KS_RDROP_SHUTDOWN, KS_RDROP_ERROR, KS_RDROP__COUNT };
const char *ks_rdrop_name(int why);
void ks_remote_note_drop(struct ks_remote *r, int why, uint64_t objects);
void ks_remote_note_incomplete(struct ks_remote *r);
void ks_remote_note_queue(struct ks_remote *r, int64_t d_len, int64_t d_bytes);

struct ks_remote_stats {
	int up;
	uint64_t lookups, hits, misses, skipped;  /* skipped: the tier was down */
	uint64_t hit_tokens, read_bytes, read_objects;
	double fetch_seconds;                     /* sum over lookups */
	double fetch_p50_ms, fetch_p99_ms;        /* over the last 1024 lookups */
	uint64_t written_objects, written_bytes, present_objects;
	uint64_t incomplete;                      /* manifests not written: a part was missing */
	uint64_t dropped[KS_RDROP__COUNT];        /* objects not written, by reason */
	uint64_t queue_len, queue_bytes;          /* views waiting, all stores */
	uint64_t bad[KS_BAD__COUNT];              /* values refused, by reason */
	uint64_t deleted;                         /* refused values deleted */
	uint64_t downs, ups;                      /* transitions */
	/* the client's (base/redis.h) */
	uint64_t calls, timeouts, io_errors, error_replies, moved, ask, tryagain, refreshes, connects;
	uint64_t nodes, masters, slots_covered;
	int standalone;
	double call_seconds;                      /* sum over the tier's calls */
};
void ks_remote_stats(struct ks_remote *r, struct ks_remote_stats *out);
/* The URL with any password replaced by "***" (for logs and /v1/cache/info). */
const char *ks_remote_url_safe(const struct ks_remote *r);
const char *ks_remote_prefix(const struct ks_remote *r);
/* Why the tier last went down ("" if never). */
void ks_remote_last_error(struct ks_remote *r, char *out, size_t cap);

#endif
