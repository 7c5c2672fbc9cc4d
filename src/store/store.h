/*
 * store.h - the persistent disk tier of the prefix cache (docs/persistence.md).
 *
 * One store serves one namespace (ns.h) of one cache folder (dir.h). It
 * moves the RAM cache's objects (cache/cache.h) to disk and back:
 *
 *   write-behind   a background thread takes the cache's new ("dirty")
 *                  objects soon after a request stores them and writes
 *                  each as a safetensors file (obj.h) with the durable
 *                  protocol, one folder sync per batch. Interval
 *                  checkpoints (--kv-disk-checkpoint-interval) go through
 *                  the same thread from a bounded queue (full: dropped and
 *                  counted).
 *   startup scan   after the server reports ready: temp debris deleted,
 *                  every object header read into the catalog (catalog.h),
 *                  corrupt files quarantined, namespaces unused for 7 days
 *                  removed, the disk caps applied. Capped in time. Until it
 *                  is done a lookup checks the disk directly: the prompt's
 *                  chain hashes and its boundaries name the files to try.
 *   fetch          before a request runs: when the disk holds a longer
 *                  resume point than the RAM tier, its blocks, tail and
 *                  snapshot (and the entry's anchor snapshot) are read,
 *                  validated and handed to the cache with kc_cache_put
 *                  (clean = 1), so the normal RAM lookup then finds them.
 *                  A file that fails validation is quarantined and the
 *                  lookup falls back to what remains: a miss or a shorter
 *                  hit, never a wrong one.
 *   disk caps      --disk-cache-max-mb (default 10% of the filesystem),
 *                  --disk-cache-max-files (default 100K objects) and
 *                  a free-space reserve, least recently used first (leaves
 *                  before the prefixes they extend); the checkpoint folder
 *                  separately, KVKEEP_KV_CHECKPOINT_MAX_BYTES, oldest first.
 *   shutdown flush what is still dirty, newest message-boundary entries
 *                  first, within a time budget (see ks_store_flush).
 *
 * I/O errors (ENOSPC, EIO, a failed fsync, a read-only folder) never fail
 * a request: the object is not written, the error is counted and logged
 * once per kind, and the server goes on serving from RAM.
 *
 * Threads: every function may be called from any thread; the store's
 * mutex guards the catalog and counters, file reads and writes run
 * outside it.
 */
#ifndef KV_STORE_STORE_H
#define KV_STORE_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "base/hash.h"
#include "base/pages.h"
#include "cache/cache.h"
#include "engine/layout.h"
#include "store/obj.h"
#include "store/remote.h"

#define KS_SHUTDOWN_BUDGET_DEFAULT 3.5            /* seconds (KVKEEP_SHUTDOWN_BUDGET) */
#define KS_CKPT_MAX_BYTES_DEFAULT (20ull << 30)   /* KVKEEP_KV_CHECKPOINT_MAX_BYTES */
/* Objects per namespace (--disk-cache-max-files): the index costs about
 * 300 heap bytes and the startup scan 0.1-0.3 ms per object
 * (docs/persistence.md), so 100K objects stay near 30 MB and a background
 * scan of tens of seconds at worst, whatever the byte cap allows. */
#define KS_MAX_FILES_DEFAULT 100000
#define KS_PROBE_BYTES (16u << 20)                /* the flush's fsynced probe */
#define KS_PROBE_MIN_BPS 150e6                    /* first prediction clamp */
#define KS_PROBE_MAX_BPS 600e6

struct ks_params {
	const char *root;              /* cache root folder (copied) */
	struct kv_h128 ns;             /* namespace (ks_ns_derive) */
	const char *label;             /* served model name, for the marker (copied) */
	int salted;                    /* a salt went into ns */
	const struct ke_layout *layout;/* copied */
	struct kc_cache *cache;        /* the RAM tier (borrowed; outlives the store) */
	struct kv_pages *pages;        /* pool for pages read from disk (borrowed) */
	uint32_t stride;               /* checkpoint stride (direct lookups try its multiples) */
	uint64_t max_bytes;            /* disk cap; 0 = 10% of the filesystem */
	uint64_t max_files;            /* object cap of the namespace; 0 = KS_MAX_FILES_DEFAULT */
	uint64_t reserve_bytes;        /* free space kept; 0 = min(5% of the filesystem, 4 GiB) */
	uint64_t quarantine_bytes;     /* 0 = KS_QUARANTINE_MAX_DEFAULT */
	const char *env_ckpt_max;      /* KVKEEP_KV_CHECKPOINT_MAX_BYTES text; NULL: the environment's (base/env.h) */
	uint32_t ckpt_interval;        /* --kv-disk-checkpoint-interval (0 = off) */
	uint32_t queue_cap;            /* checkpoint jobs waiting; 0 = 4 */
	int no_threads;                /* tests: no writer thread (ks_store_drain writes), the
					  scan runs in the caller of ks_store_start_scan */
	double scan_max_s;             /* scan time cap; 0 = 120 */
	int64_t ns_max_age_s;          /* 0 = KS_NS_MAX_AGE_S (7 days) */
	int tool;                      /* offline tools: write no marker, start no thread; the scan
					  only catalogs (no age-out, no caps, nothing quarantined) */
	int vocab;                     /* token ids of answer records must be below it (0: unchecked) */
	struct ks_remote *remote;      /* the remote tier (borrowed, shared by every store; outlives
					  them), or NULL: views the disk writer has written go on to it,
					  and ks_store_fetch_remote reads from it */
};

struct ks_store;

/*
 * Create the folders and the namespace marker, start the writer. A cache
 * folder that cannot be created or written is not an error: the store
 * opens read-only (writes counted as refused, logged once). KV_ERR_INVALID
 * for bad parameters, KV_ERR_NOMEM.
 */
int ks_store_open(const struct ks_params *p, struct ks_store **out);
/* Stops the threads (without flushing: call ks_store_flush first). */
void ks_store_close(struct ks_store *s);

/* Start the startup scan (in the background unless no_threads). */
void ks_store_start_scan(struct ks_store *s);
/* 1 once the scan has finished (not cut short by its time cap). */
int ks_store_scan_done(struct ks_store *s);

/* --- lookups ----------------------------------------------------------- */

struct ks_req {
	const int32_t *tokens;         /* the prompt, n tokens (borrowed) */
	uint32_t n;
	const uint32_t *bounds;        /* message boundaries, ascending (may be NULL) */
	size_t n_bounds;
	uint32_t ram_pos;              /* the RAM tier's resume point for this prompt */
	/* the RAM hit's floor(ram_pos / B) pages, still pinned by the caller
	 * (their blocks are not read again) */
	struct kv_page *const *ram_pages;
	uint32_t ram_n_pages;
};

struct ks_fetch {
	uint32_t pos;                  /* resume point now in the RAM tier (0: nothing loaded) */
	uint32_t anchor;               /* its anchor (0 none) */
	uint64_t bytes;                /* bytes read from disk */
	uint32_t files;
	double seconds;                /* plan + read + validate + put */
	int direct;                    /* 1: the scan was not done, files were probed by name */
};

/*
 * If the disk holds a resume point for the prompt beyond rq->ram_pos, load
 * it into the RAM cache. Always fills *out (pos 0 = nothing loaded).
 * KV_OK whether or not something was loaded; errors only for
 * KV_ERR_NOMEM. Also remembers the prompt's boundaries (the flush writes
 * boundary entries first).
 */
int ks_store_fetch(struct ks_store *s, const struct ks_req *rq, struct ks_fetch *out);
/*
 * The same against the remote tier (params.remote; remote.h), asked after
 * the disk (the caller's order: RAM, disk, remote): its objects are
 * validated like files and loaded into the RAM cache - queued for the
 * disk writer too when the tier's to_disk is on. While the tier is down
 * it returns at once (pos 0). The plan probes the names the prompt's
 * chain hashes, message boundaries, checkpoint stride and interval give
 * (the remote has no catalog); a transport failure ends the lookup (a
 * miss: the tier goes down, nothing waits for it).
 */
int ks_store_fetch_remote(struct ks_store *s, const struct ks_req *rq, struct ks_fetch *out);
/* 1 when the store has a remote tier (params.remote). */
int ks_store_has_remote(const struct ks_store *s);
/* The resume point the disk could give (no loading, no validation of
 * data): for POST /v1/cache/probe. bounds as in ks_req (may be NULL). */
uint32_t ks_store_probe(struct ks_store *s, const int32_t *tok, uint32_t n, const uint32_t *bounds,
			size_t n_bounds);

/* --- writing ----------------------------------------------------------- */

/* Wake the writer: the cache has new objects. Cheap; call after a store. */
void ks_store_kick(struct ks_store *s);
/* Write every dirty object and queued checkpoint now, in the calling
 * thread (tests, benchmarks, no_threads mode). Returns objects written. */
size_t ks_store_drain(struct ks_store *s);

/*
 * An interval checkpoint of a running sequence at position n: tokens
 * [0, n) (copied), its ceil(n / B) pages (full pages get a reference and
 * are never copied; the tail rows of the last one are copied) and, for
 * hybrid layouts, the recurrent state, which snap_fill writes into a
 * buffer of layout.snapshot_bytes (called at most once, before return).
 * Queued for the writer; KV_ERR_FULL when the queue is full (dropped and
 * counted), KV_ERR_NOMEM. The caller goes on immediately.
 */
typedef int (*ks_snap_fill_fn)(void *ctx, void *dst, size_t len);
int ks_store_ckpt(struct ks_store *s, const int32_t *tok, uint32_t n, struct kv_page *const *pages,
		  ks_snap_fill_fn snap_fill, void *ctx);
/* The interval (0 = off) and whether position pos is an interval point. */
uint32_t ks_store_ckpt_interval(const struct ks_store *s);

/* --- shutdown ------------------------------------------------------------ */

struct ks_flush_report {
	uint32_t entries_saved, entries_skipped;
	uint32_t objects_saved, objects_skipped;
	uint64_t bytes_saved, bytes_skipped;
	double seconds;                /* wall time of the whole flush */
	double write_seconds;          /* of which writing units (folder syncs included) */
	double probe_seconds;          /* of which the probe */
	double budget_s;               /* what it was given (minus nothing) */
	double first_bps;              /* the first prediction's rate (probe or observed) */
	int probed;                    /* 1: the 16 MiB probe ran */
	int deadline_hit;              /* a write was cut at the deadline */
	uint32_t first_entry_len;      /* length of the first entry saved (0 none) */
	int first_entry_boundary;      /* ... and whether it ended at a message boundary */
};

/*
 * The shutdown flush. Stops the writer, then writes what is still dirty
 * within budget_s seconds minus commit headroom (min(0.5 s, 10%)):
 * message-boundary entries first, newest first, each with the blocks and
 * resume points it needs, then other entries, then loose objects. Every
 * unit's time is predicted from the write rate: with no write sample yet
 * a 16 MiB fsynced probe is measured and halved, and that first rate is
 * clamped to 150-600 MB/s; later predictions use the rate observed on the
 * real writes. A unit predicted to overrun is skipped and smaller ones
 * are tried; a write that reaches the deadline is abandoned (its temp
 * file removed). Logs what was saved and skipped. rep may be NULL.
 */
int ks_store_flush(struct ks_store *s, double budget_s, struct ks_flush_report *rep);
/* KVKEEP_SHUTDOWN_BUDGET text -> seconds (default 3.5; invalid: default). */
double ks_store_budget_parse(const char *env);

/* --- caps and counters -------------------------------------------------- */

enum ks_werr { KS_WERR_ENOSPC = 0, KS_WERR_EIO, KS_WERR_FSYNC, KS_WERR_READONLY, KS_WERR_CAP, KS_WERR__COUNT };
const char *ks_werr_name(int w);

struct ks_stats {
	int writable;                  /* 0 once writes are refused for good (read-only folder) */
	int scan_done;
	uint64_t files[2], bytes[2];   /* known to the catalog: main area, checkpoint area */
	uint64_t cap_bytes, reserve_bytes, ckpt_cap_bytes;
	uint64_t written[KS_KIND__END];/* objects written, by kind */
	uint64_t written_bytes;
	uint64_t write_errors[KS_WERR__COUNT];
	uint64_t incomplete;           /* manifests not written: a dependency was missing */
	uint64_t drops;                /* checkpoints dropped: queue full */
	uint64_t bad[KS_BAD__COUNT];   /* files refused, by reason (namespace/version: skipped) */
	uint64_t quarantined;
	uint64_t echo_written, echo_loaded, echo_rejected; /* answer records (echo.c) */
	uint64_t loads, load_bytes, load_tokens, load_files;
	double load_seconds;
	uint64_t direct_lookups;       /* lookups served before the scan was done */
	uint64_t evictions, ckpt_evictions, ns_removed, debris_removed;
	uint64_t ckpts_queued, ckpts_written;
	uint64_t scan_files;
	double scan_seconds;
	uint64_t flush_entries_saved, flush_entries_skipped, flush_bytes;
	double flush_seconds;
	uint64_t queue_len;
	double write_bps;              /* observed write rate (0 = no sample) */
};
void ks_store_stats(struct ks_store *s, struct ks_stats *out);
/*
 * Offline pruning (`kvkeep cache prune`, tool mode after a scan): bytes on
 * disk, the eviction key of the next victim (least recently used, leaves
 * before the prefixes they extend; INT64_MAX when nothing is left) and
 * evicting it (returns the bytes freed).
 */
uint64_t ks_store_disk_bytes(struct ks_store *s);

/* One entry manifest on disk, for displays (the dashboard). */
struct ks_entry_info {
	uint32_t tokens;              /* the entry's length */
	uint32_t anchor;              /* 0 = none */
	int64_t last_use_ms;          /* the file's last use (wall clock) */
	uint64_t bytes;               /* its files: manifest, end tail / snapshot and the blocks before it */
	struct kv_h128 id;            /* its resume point's name */
};
/* Up to max entries of the main area, in catalog order; returns how many
 * there are in all. */
size_t ks_store_list_entries(struct ks_store *s, struct ks_entry_info *out, size_t max);
int64_t ks_store_next_victim(struct ks_store *s);
uint64_t ks_store_evict_next(struct ks_store *s);

/* The root and the namespace folder of the main area (valid for the store's life). */
const char *ks_store_root(const struct ks_store *s);
const char *ks_store_ns_dir(const struct ks_store *s);

#endif
