/*
 * store_int.h - the store's state, shared by its modules. Internal to
 * src/store. Calls go one way, from the facade down:
 *
 *   store.c    the facade (store.h): open/close, the checkpoint queue,
 *              counters; calls the workers
 *   writer.c   write-behind and object writes     \
 *   fetch.c    disk lookups and loads              |  the workers: call
 *   scan.c     the startup scan                    |  evict.c and core.c
 *   flush.c    the shutdown flush (calls writer.c) |
 *   echo.c     the answer records' files           |
 *   rwrite.c   the remote writer: views the disk  /
 *              writer hands on, to the remote tier
 *   evict.c    disk eviction: caps, reserve, prune order; calls core.c
 *   core.c     paths, rejects and quarantine, write failures, the
 *              namespace claim, chain hashes, the rate, ks_par_run
 *
 * and below them catalog.c, dir.c, ns.c, obj.c and remote.c (the remote
 * tier's client side: keys, values, validation, its up/down state).
 *
 * Locking: `mu` guards the catalog, the counters, the checkpoint queue,
 * the boundary ring and the flags below it. File I/O never runs under it.
 * `wmu` serialises object writers (the writer thread, ks_store_drain and
 * the flush), so the folder-sync batch has one owner at a time.
 */
#ifndef KV_STORE_STORE_INT_H
#define KV_STORE_STORE_INT_H

#include "store/catalog.h"
#include "store/dir.h"
#include "store/store.h"

#include <pthread.h>
#include <stdatomic.h>

#define KS_BOUNDARY_RING 1024
#define KS_BATCH 32
#define KS_MAX_PENDING_SYNC 512
#define KS_MAX_STAGED 16                 /* objects written before one batched data sync */
#define KS_STAGE_BYTES (32ull << 20)     /* ... or this many bytes */

/* An interval checkpoint waiting for the writer. */
struct ks_ckpt_job {
	int32_t *tokens;               /* n (malloc'd copy) */
	uint32_t n;
	struct kv_page **pages;        /* floor(n / B) full pages, one reference each */
	uint32_t n_pages;
	void *tail;                    /* n mod B rows per segment, compact (kv_alloc), or NULL */
	void *snap;                    /* snapshot_bytes (kv_alloc), or NULL for dense */
	int64_t created;
	struct ks_ckpt_job *next;
};

/* A cache view the disk writer handed to the remote writer (rwrite.c). */
struct ks_rjob {
	struct kc_view v;              /* owned: released once written or dropped */
	uint64_t bytes;                /* its objects' data bytes */
	struct ks_rjob *next;
};

/* One object an entry manifest names (ks_entry_needs). */
struct ks_need {
	int kind;
	struct kv_h128 id;
};

/* Written objects whose folder has not been synced yet. */
struct ks_pending {
	char path[4096];
	int area, kind;
	struct kv_h128 id;
};

/* An object written to its temp file, waiting for the batched sync. */
struct ks_stage_rec {
	struct ks_obj_staged st;
	char path[4096];
	struct ks_rec rec;           /* what the catalog gets once it is durable */
};

/* The observed write rate (bytes over seconds of whole object writes). */
struct ks_rate {
	uint64_t bytes;
	uint64_t ns;
	uint32_t n;
};

struct ks_store {
	struct ks_params p;
	struct ke_layout L;
	char root[4096];
	char dir[KS_AREA__COUNT][4096];   /* namespace folders: main, checkpoints */
	char label[128];
	uint32_t B;
	int hybrid;

	pthread_mutex_t mu;
	pthread_cond_t cv;               /* writer wake-up */
	struct ks_cat *cat;
	int kicked;
	int stop;                        /* writer: leave the loop */
	int writer_busy;                 /* writer: inside a batch */
	int writer_running;
	pthread_t writer;
	pthread_t scanner;
	int scan_started, scan_running;
	atomic_int scan_done;
	int writable;                    /* 0: read-only folder, no writes */
	int lock_fd;                     /* the namespace lock (ns.h), -1 until held */
	int ns_busy;                     /* another server holds the lock: write and delete nothing */
	int unclaimed;                   /* folders/lock/marker not made yet (a full disk at open):
					    the writer tries again before its next write (under wmu) */
	int64_t touched_ns;              /* last marker touch (writer thread) */
	int logged_werr[KS_WERR__COUNT]; /* logged once */
	uint64_t cap_bytes, reserve_bytes, ckpt_cap_bytes;
	size_t max_files;                /* object cap (both areas) */
	int64_t last_enforce_ns;

	struct ks_ckpt_job *q_head, *q_tail;
	uint32_t q_len;

	struct kv_h128 bring[KS_BOUNDARY_RING]; /* rp ids at recent message boundaries */
	uint32_t bring_n, bring_next;

	struct ks_rate rate;
	struct ks_stats st;              /* counters (the catalog fields filled on read) */

	pthread_mutex_t wmu;             /* one object writer at a time */
	struct ks_pending *pend;         /* written, folder not synced yet (under wmu) */
	size_t n_pend;
	struct ks_stage_rec *stg;        /* staged objects (under wmu) */
	size_t n_stg;
	uint64_t stg_bytes, stg_t0;
	uint8_t shard_made[KS_AREA__COUNT][256]; /* shard folders known to exist (under wmu) */
	int ns_dir_dirty[KS_AREA__COUNT];        /* a shard was created: sync the ns folder */

	uint64_t echo_bytes;             /* answer records on disk (echo.c), under mu */

	/* the remote writer (rwrite.c); the queue under mu */
	struct ks_rjob *rq_head, *rq_tail;
	uint32_t rq_len;
	uint64_t rq_bytes;
	int r_inited, r_running, r_stop, r_halt, r_busy;
	pthread_t rwriter;
	pthread_cond_t rcv;
	int32_t *tool_order;             /* prune: eviction order, built once */
	size_t tool_n, tool_i;
};

/* echo.c: the namespace's answer records (cache/echo.h) in its echo/ folder */
/* Write the records remembered since the last call (the writer thread and
 * the shutdown flush); keeps the folder within the records' budget. */
void ks_echo_save(struct ks_store *s);
/* Load the folder's records into the cache's store (at open). */
void ks_echo_load(struct ks_store *s);

/* core.c ------------------------------------------------------------------- */

/* KVKEEP_KV_CHECKPOINT_MAX_BYTES (read at open and at every scan): bytes,
 * 0 = no cap; unset or blank: 20 GiB; invalid: 20 GiB with a warning. */
uint64_t ks_ckpt_cap_parse(const char *v);
/* Path of an object: KV_OK, or KV_ERR_INVALID when it does not fit cap
 * (never for a cap of 4096: ks_store_open checks the longest). */
int ks_store_path(const struct ks_store *s, int area, int kind, struct kv_h128 id, char *out, size_t cap);
/* 1 if the object is on disk: the catalog, or (scan not done) the file. */
int ks_store_has(struct ks_store *s, int area, int kind, struct kv_h128 id);
/* Count a refused file and move it to quarantine when it is corrupt
 * (other namespace / version: left alone). Drops it from the catalog. */
void ks_store_reject(struct ks_store *s, const char *path, int area, int kind, struct kv_h128 id, int bad);
/* Folders, lock and marker of the namespace (at open, and again from the
 * writer while `unclaimed`). KV_OK; KV_ERR_NOT_OURS (another server:
 * ns_busy set, writes off); another error leaves `unclaimed` set. */
int ks_store_claim(struct ks_store *s);
/* Classify a failed write, count it, log its kind once; a read-only
 * folder turns writes off. */
void ks_store_write_failed(struct ks_store *s, int rc, const char *what);
/* 1 if id names an rp at a message boundary seen recently (caller holds mu). */
int ks_store_is_boundary_locked(const struct ks_store *s, struct kv_h128 id);
/* Run fn(ctx, i) for i in [0, n) on up to max_threads (<= KS_PAR_MAX)
 * threads, the caller included. */
#define KS_PAR_MAX 16
#define KS_SYNC_THREADS 8
#define KS_READ_THREADS 4
void ks_par_run(size_t n, size_t max_threads, void (*fn)(void *ctx, size_t i), void *ctx);
/* Prefix chain hashes: h[0] = ns, h[k] = hash through block k (k <= n / B). */
struct kv_h128 *ks_store_chain(const struct ks_store *s, const int32_t *tok, uint32_t n, uint32_t *nh);
/*
 * The objects one cache view is written as, in write order: a block; a
 * tail (t > 0) then a snapshot (hybrid); an entry manifest. The sources
 * borrow the view's memory and carry the store's namespace. The one list
 * of what a view becomes, for the disk writer and the remote writer alike
 * (a new object kind is added here). Returns how many (<= KS_VIEW_OBJS).
 */
#define KS_VIEW_OBJS 4
size_t ks_view_objs(const struct ks_store *s, const struct kc_view *v, struct ks_obj_src *out);
/* Every object the manifest of entry (tok, n, checkpoints ck) names:
 * its blocks, then each resume point's tail and snapshot (*out malloc'd,
 * *count of them). KV_OK or KV_ERR_NOMEM. */
int ks_entry_needs(const struct ks_store *s, const int32_t *tok, uint32_t n, const uint32_t *ck, uint32_t n_ck,
		   struct ks_need **out, size_t *count);

/* The observed write rate: ks_rate_add adds one sample, ks_rate_bps gives
 * bytes/s (0 before the first sample). s->rate is under mu. */
void ks_rate_add(struct ks_rate *r, uint64_t bytes, uint64_t ns);
double ks_rate_bps(const struct ks_rate *r);

/* evict.c ------------------------------------------------------------------ */

/* Make room for `need` more bytes (disk cap, reserve). KV_OK or KV_ERR_FULL. */
int ks_evict_make_room(struct ks_store *s, uint64_t need);
/* Delete one record's file and forget it. Caller holds mu. */
void ks_evict_locked(struct ks_store *s, int32_t i, int ckpt_rule);
/* Cap enforcement (takes mu). */
void ks_evict_enforce_caps(struct ks_store *s);

/* writer.c ----------------------------------------------------------------- */

/*
 * Write one object (caller holds wmu): shard folder, room, the object
 * written to its temp file and staged; every KS_MAX_STAGED objects (or
 * KS_STAGE_BYTES) the batch is settled: data syncs, renames, catalog
 * records, counters, a rate sample; the folder syncs wait for
 * ks_writer_commit. deadline_ns as in ks_obj_write. KV_OK (staged, maybe
 * not settled yet), KV_ERR_TIMEOUT, or the write error (already counted).
 */
int ks_writer_put(struct ks_store *s, int area, const struct ks_obj_src *src, uint64_t deadline_ns);
/* Settle the staged batch (caller holds wmu). Past a nonzero deadline the
 * staged objects are abandoned instead (KV_ERR_TIMEOUT). */
int ks_writer_settle(struct ks_store *s, uint64_t deadline_ns);
/* Settle, then sync the folders of everything settled and forget it
 * (caller holds wmu). A failed folder sync unlinks that folder's new
 * objects (a failed fsync is never retried). */
void ks_writer_commit(struct ks_store *s);
/* One cache view -> its object files (caller holds wmu). */
int ks_writer_view(struct ks_store *s, const struct kc_view *v, uint64_t deadline_ns);
/* One interval checkpoint -> blocks, tail, snapshot, manifest. */
int ks_writer_ckpt(struct ks_store *s, const struct ks_ckpt_job *j, uint64_t deadline_ns);
void ks_writer_job_free(struct ks_ckpt_job *j);
/* Write every dirty object and queued checkpoint (takes wmu). With
 * honor_stop, returns early once a stop is requested. Returns objects written. */
size_t ks_writer_drain(struct ks_store *s, int honor_stop);
/* The write-behind thread. */
void *ks_writer_main(void *arg);
/* Bytes an object of this view would take on disk (flush predictions). */
uint64_t ks_writer_view_bytes(const struct ks_store *s, const struct kc_view *v);

/* rwrite.c ----------------------------------------------------------------- */

/* Start the store's remote writer (ks_store_open, with p.remote). */
int ks_rwrite_start(struct ks_store *s);
/* Take a view the disk writer is done with (ownership passes): queued
 * for the remote tier, or released at once and counted as dropped (the
 * tier down, the queue full, the store stopping). */
void ks_rwrite_offer(struct ks_store *s, struct kc_view *v);
/* Shutdown flush: take nothing more, drop what is queued. */
void ks_rwrite_halt(struct ks_store *s);
/* ks_store_close: stop the thread, release the queue. */
void ks_rwrite_stop(struct ks_store *s);
/* no_threads mode (tests): write the queue in the caller. Returns views written. */
size_t ks_rwrite_drain(struct ks_store *s);

/* scan.c ------------------------------------------------------------------- */

void ks_scan_run(struct ks_store *s);
void *ks_scan_main(void *arg);

/* fetch.c ------------------------------------------------------------------ */

int ks_fetch_run(struct ks_store *s, const struct ks_req *rq, struct ks_fetch *out);
/* The same lookup against the remote tier (store.h ks_store_fetch_remote). */
int ks_fetch_remote(struct ks_store *s, const struct ks_req *rq, struct ks_fetch *out);
uint32_t ks_fetch_probe(struct ks_store *s, const int32_t *tok, uint32_t n, const uint32_t *bounds, size_t n_bounds);

/* flush.c ------------------------------------------------------------------ */

int ks_flush_run(struct ks_store *s, double budget_s, struct ks_flush_report *rep);

#endif
