/*
 * test_store.c - the disk tier end to end without a model: entries stored
 * in a RAM cache are written by the store, the process "restarts" (a new
 * cache and store on the same folder), and lookups must resume where the
 * rules say, byte for byte what a cold run holds (test_cache_util.h makes
 * every KV row and snapshot a function of its token prefix).
 *
 * Also: lookups before the scan (direct file probes), corrupt and
 * missing files (a shorter hit or a miss, the file quarantined),
 * namespaces (never read across, aged out after 7 days), the disk cap,
 * interval checkpoints and their cap, I/O faults (ENOSPC, EIO, failed
 * fsync, read-only folder), and the write-behind thread.
 */
#include "base/clock.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/io.h"
#include "base/log.h"
#include "cache/names.h"
#include "store/catalog.h"
#include "store/dir.h"
#include "store/ns.h"
#include "store/store.h"
#include "kt.h"
#include "test_store_util.h"

#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <utime.h>
#include <unistd.h>

/*
 * A hybrid agent session in miniature (B = 8): system + tools end at
 * b0 = 20 (the anchor), user 1 ends at b1 = 37, the prompt is 40 tokens
 * (b1 + "<|im_start|>assistant\n"). The boundary entry ends at b1 with
 * checkpoints 16 (stride), 20 (anchor), 32 (stride); the completion entry
 * ends at 46.
 */
#define N_PROMPT 40
#define B0 20
#define B1 37
#define N_DONE 46

static void session(struct ts_env *e, const int32_t *tok)
{
	uint32_t ck1[] = {16, B0, 32};
	ts_put(e, tok, B1, ck1, 3, B0);
	uint32_t ck2[] = {B0, 32, B1};
	ts_put(e, tok, N_DONE, ck2, 3, B0);
}

static const char *root_dir(void)
{
	static char r[4096];
	snprintf(r, sizeof r, "%s/cache", kt_tmpdir());
	return r;
}

KT_CASE(hybrid_restart_resumes_at_boundary)
{
	struct ts_env e;
	int32_t tok[64];
	uint32_t bounds[] = {B0, B1}, anchor = 0;
	struct ks_fetch f;
	ts_tokens(tok, 64, 64, 1);
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	session(&e, tok);
	KT_CHECK(ks_store_drain(e.s) > 0);
	struct ks_stats st;
	ks_store_stats(e.s, &st);
	KT_EQ_U64(st.written[KS_ENTRY], 2);
	KT_CHECK(st.written[KS_BLOCK] == 5); /* 46 tokens: 5 full blocks, shared by both entries */
	ts_close(&e);

	/* restart: turn 1 replayed resumes at the last boundary, anchor kept */
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	ks_store_start_scan(e.s);
	KT_CHECK(ks_store_scan_done(e.s));
	uint32_t pos = ts_lookup(&e, tok, N_PROMPT, bounds, 2, &anchor, &f);
	KT_EQ_INT(pos, B1);
	KT_EQ_INT(f.direct, 0);
	KT_EQ_INT(anchor, B0);
	KT_EQ_INT(f.anchor, B0);
	/* a second lookup is a RAM hit: nothing more read */
	pos = ts_lookup(&e, tok, N_PROMPT, bounds, 2, NULL, &f);
	KT_EQ_INT(pos, B1);
	KT_EQ_INT(f.pos, 0);
	/* a new turn on the restored session goes further */
	pos = ts_lookup(&e, tok, 60, bounds, 2, NULL, &f);
	KT_EQ_INT(pos, N_DONE);
	/* a prompt that leaves the session inside user 1 snaps to the anchor */
	int32_t other[64];
	memcpy(other, tok, sizeof other);
	other[25] += 1;
	ts_close(&e);
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	ks_store_start_scan(e.s);
	pos = ts_lookup(&e, other, 40, bounds, 1, &anchor, NULL);
	KT_EQ_INT(pos, B0);
	KT_EQ_INT(anchor, B0);
	ts_close(&e);
}

KT_CASE(direct_lookup_before_the_scan)
{
	struct ts_env e;
	int32_t tok[64];
	uint32_t bounds[] = {B0, B1}, anchor = 0;
	struct ks_fetch f;
	ts_tokens(tok, 64, 64, 2);
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	session(&e, tok);
	ks_store_drain(e.s);
	ts_close(&e);
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	KT_CHECK(!ks_store_scan_done(e.s));
	KT_EQ_INT(ks_store_probe(e.s, tok, N_PROMPT, bounds, 2), B1);
	KT_EQ_INT(ks_store_probe(e.s, tok, N_PROMPT, NULL, 0), 32); /* stride multiples only */
	uint32_t pos = ts_lookup(&e, tok, N_PROMPT, bounds, 2, &anchor, &f);
	KT_EQ_INT(pos, B1);
	KT_EQ_INT(f.direct, 1);
	KT_EQ_INT(anchor, B0);
	ts_close(&e);
	/* without boundaries the stride multiples still find the checkpoint at 32 */
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	pos = ts_lookup(&e, tok, N_PROMPT, NULL, 0, NULL, &f);
	KT_EQ_INT(pos, 32);
	ts_close(&e);
}

KT_CASE(dense_restart_longest_prefix)
{
	struct ts_env e;
	int32_t tok[80];
	struct ks_fetch f;
	ts_tokens(tok, 80, 80, 3);
	KT_OK(ts_open(&e, root_dir(), 0, NULL));
	ts_put(&e, tok, 45, NULL, 0, 0);
	ks_store_drain(e.s);
	ts_close(&e);
	for (uint32_t n = 2; n <= 60; n++) {
		KT_OK(ts_open(&e, root_dir(), 0, NULL));
		ks_store_start_scan(e.s);
		uint32_t pos = ts_lookup(&e, tok, n, NULL, 0, NULL, &f);
		uint32_t want = n - 1 < 45 ? n - 1 : 45;
		KT_CHECKF(pos == want, "prompt of %u: resumed at %u, the longest stored prefix is %u", n, pos, want);
		ts_close(&e);
	}
	/* a prompt that diverges inside the tail keeps the shared rows only */
	int32_t other[80];
	memcpy(other, tok, sizeof other);
	other[43] += 7;
	KT_OK(ts_open(&e, root_dir(), 0, NULL));
	ks_store_start_scan(e.s);
	KT_EQ_INT(ts_lookup(&e, other, 70, NULL, 0, NULL, NULL), 43);
	ts_close(&e);
}

/* Path of one object of the main area. */
static void obj_file(const struct ts_env *e, int kind, struct kv_h128 id, char *out, size_t cap)
{
	char base[4096];
	KT_OK(ks_dir_ns_path(e->root, e->ns, KS_AREA_MAIN, base, sizeof base));
	KT_OK(ks_dir_obj_path(base, kind, id, out, cap));
}

static void flip_byte(const char *path, long from_end)
{
	FILE *f = fopen(path, "r+b");
	KT_REQUIRE(f);
	fseek(f, -from_end, SEEK_END);
	int c = fgetc(f);
	fseek(f, -from_end, SEEK_END);
	fputc(c ^ 0x40, f);
	fclose(f);
}

KT_CASE(corrupt_files_give_shorter_hits)
{
	struct ts_env e;
	int32_t tok[64];
	uint32_t bounds[] = {B0, B1};
	char path[4096];
	struct ks_stats st;
	ts_tokens(tok, 64, 64, 4);
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	session(&e, tok);
	ks_store_drain(e.s);
	ts_close(&e);

	/* the snapshot at b1: one flipped data byte -> the checkpoint at 32 */
	struct kv_h128 h[8];
	h[0] = (struct kv_h128){0x1111, 0x2222};
	for (int k = 1; k < 8; k++)
		h[k] = kc_chain_hash(h[k - 1], tok + (k - 1) * TS_B, TS_B);
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	obj_file(&e, KS_SNAP, kc_rp_id(h[4], tok + 32, 5), path, sizeof path);
	KT_REQUIRE(access(path, F_OK) == 0);
	flip_byte(path, 3);
	ks_store_start_scan(e.s);
	KT_EQ_INT(ts_lookup(&e, tok, N_PROMPT, bounds, 2, NULL, NULL), 32);
	ks_store_stats(e.s, &st);
	KT_EQ_U64(st.bad[KS_BAD_CRC], 1);
	KT_EQ_U64(st.quarantined, 1);
	KT_EQ_INT(access(path, F_OK), -1);
	ts_close(&e);
	char q[4200];
	snprintf(q, sizeof q, "%s/quarantine", root_dir());
	KT_EQ_INT(ts_count_files(q, ".snap."), 1);

	/* block 3 truncated: everything past 24 depends on it; the anchor at
	 * 20 does not (its tail file holds rows 16..19) */
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	obj_file(&e, KS_BLOCK, h[3], path, sizeof path);
	KT_REQUIRE(truncate(path, 100) == 0);
	ks_store_start_scan(e.s); /* the scan itself catches the short file */
	KT_EQ_INT(access(path, F_OK), -1);
	KT_EQ_INT(ts_lookup(&e, tok, N_PROMPT, bounds, 2, NULL, NULL), B0);
	ts_close(&e);

	/* block 2 with a flipped KV byte, found at load time (before the scan) */
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	obj_file(&e, KS_BLOCK, h[2], path, sizeof path);
	flip_byte(path, 10);
	KT_EQ_INT(ts_lookup(&e, tok, N_PROMPT, bounds, 2, NULL, NULL), 0);
	ks_store_stats(e.s, &st);
	KT_EQ_U64(st.quarantined, 1);
	ts_close(&e);
}

KT_CASE(other_namespaces_are_never_hits)
{
	struct ts_env a, b;
	int32_t tok[64];
	uint32_t bounds[] = {B0, B1};
	struct ks_params pb = {.no_threads = 1, .ns = {0x3333, 0x4444}};
	ts_tokens(tok, 64, 64, 5);
	KT_OK(ts_open(&a, root_dir(), 1, NULL));
	session(&a, tok);
	ks_store_drain(a.s);
	char adir[4096], bdir[4096];
	snprintf(adir, sizeof adir, "%s", ks_store_ns_dir(a.s));
	ts_close(&a);

	KT_OK(ts_open(&b, root_dir(), 1, &pb));
	snprintf(bdir, sizeof bdir, "%s", ks_store_ns_dir(b.s));
	ks_store_start_scan(b.s);
	KT_EQ_INT(ts_lookup(&b, tok, N_PROMPT, bounds, 2, NULL, NULL), 0);
	ts_close(&b);
	/* copy A's objects into B's folder: still never a hit, never deleted */
	int n_before = ts_count_files(adir, ".safetensors") - 1; /* minus the marker */
	KT_EQ_INT(kt_sh("cp -r '%s'/[0-9a-f][0-9a-f] '%s'/", adir, bdir), 0);
	KT_OK(ts_open(&b, root_dir(), 1, &pb));
	ks_store_start_scan(b.s);
	KT_EQ_INT(ts_lookup(&b, tok, N_PROMPT, bounds, 2, NULL, NULL), 0);
	struct ks_stats st;
	ks_store_stats(b.s, &st);
	KT_CHECK(st.bad[KS_BAD_NS] >= 1);
	KT_EQ_U64(st.quarantined, 0);
	KT_EQ_U64(st.files[0], 0);
	ts_close(&b);
	KT_EQ_INT(ts_count_files(bdir, ".safetensors") - 1, n_before);
	/* and A still hits its own */
	KT_OK(ts_open(&a, root_dir(), 1, NULL));
	ks_store_start_scan(a.s);
	KT_EQ_INT(ts_lookup(&a, tok, N_PROMPT, bounds, 2, NULL, NULL), B1);
	ts_close(&a);
}

KT_CASE(namespaces_age_out)
{
	struct ts_env e;
	char old[4096], fresh[4096], oldck[4200];
	struct ke_layout L;
	ts_layout(&L, 0);
	KT_OK(kv_path_fmt(old, sizeof old, "%s/%032x", root_dir(), 0xa));
	KT_OK(kv_path_fmt(fresh, sizeof fresh, "%s/%032x", root_dir(), 0xb));
	KT_OK(kv_path_fmt(oldck, sizeof oldck, "%s/kv_checkpoints/%032x", root_dir(), 0xa));
	KT_OK(ks_ns_mark(old, (struct kv_h128){0xa, 0}, "old", 0, &L));
	KT_OK(ks_ns_mark(fresh, (struct kv_h128){0xb, 0}, "fresh", 0, &L));
	KT_OK(ks_dir_ensure(oldck));
	char f[4300];
	snprintf(f, sizeof f, "%s/namespace.safetensors", old);
	struct utimbuf ut = {.actime = time(NULL) - 8 * 86400, .modtime = time(NULL) - 8 * 86400};
	KT_REQUIRE(utime(f, &ut) == 0);
	KT_OK(ts_open(&e, root_dir(), 0, NULL));
	ks_store_start_scan(e.s);
	struct ks_stats st;
	ks_store_stats(e.s, &st);
	KT_EQ_U64(st.ns_removed, 1);
	ts_close(&e);
	KT_EQ_INT(access(old, F_OK), -1);
	KT_EQ_INT(access(oldck, F_OK), -1);
	KT_EQ_INT(access(fresh, F_OK), 0);
}

KT_CASE(disk_cap_evicts_least_recently_used)
{
	struct ts_env e;
	int32_t tok[10][40];
	/* each session: 4 blocks + 1 tail + manifest, about 4 KiB */
	struct ks_params p = {.no_threads = 1, .max_bytes = 14000};
	KT_OK(ts_open(&e, root_dir(), 0, &p));
	for (int i = 0; i < 10; i++) {
		ts_tokens(tok[i], 40, 0, 100 + (uint64_t)i);
		ts_put(&e, tok[i], 35, NULL, 0, 0);
		ks_store_drain(e.s);
		struct ks_stats st;
		ks_store_stats(e.s, &st);
		KT_CHECKF(st.bytes[0] + st.bytes[1] <= 14000, "after session %d: %llu bytes on disk, cap 14000", i,
			  (unsigned long long)(st.bytes[0] + st.bytes[1]));
	}
	ts_close(&e);
	KT_OK(ts_open(&e, root_dir(), 0, &p));
	ks_store_start_scan(e.s);
	/* the newest session is whole, the oldest is gone */
	KT_EQ_INT(ts_lookup(&e, tok[9], 36, NULL, 0, NULL, NULL), 35);
	KT_EQ_INT(ts_lookup(&e, tok[0], 36, NULL, 0, NULL, NULL), 0);
	struct ks_stats st;
	ks_store_stats(e.s, &st);
	KT_CHECK(st.files[0] > 0);
	ts_close(&e);
}

static int fill_snap(void *ctx, void *dst, size_t len)
{
	const int32_t *tok = ((const int32_t **)ctx)[0];
	uint32_t n = (uint32_t)(uintptr_t)((void **)ctx)[1];
	struct ke_layout L;
	ts_layout(&L, 1);
	if (len != L.snapshot_bytes)
		return KV_ERR_INVALID;
	tc_snap_bytes(&L, tok, n, dst);
	return KV_OK;
}

KT_CASE(interval_checkpoints_serve_hits)
{
	struct ts_env e;
	int32_t tok[64];
	struct kv_page *pg[16];
	struct ks_params p = {.no_threads = 1, .ckpt_interval = 12, .env_ckpt_max = "0"};
	ts_tokens(tok, 64, 64, 6);
	KT_OK(ts_open(&e, root_dir(), 1, &p));
	int np = tc_pages(e.pool, &e.L, tok, 36, pg);
	KT_REQUIRE(np == 5);
	for (uint32_t at = 12; at <= 36; at += 12) {
		void *ctx[2] = {tok, (void *)(uintptr_t)at};
		KT_OK(ks_store_ckpt(e.s, tok, at, pg, fill_snap, ctx));
	}
	for (int i = 0; i < np; i++)
		kv_page_unref(pg[i]);
	ks_store_drain(e.s);
	struct ks_stats st;
	ks_store_stats(e.s, &st);
	KT_EQ_U64(st.ckpts_written, 3);
	KT_CHECK(st.files[1] >= 6); /* tails, snapshots, manifests */
	ts_close(&e);
	char ck[4200];
	snprintf(ck, sizeof ck, "%s/kv_checkpoints", root_dir());
	KT_CHECK(ts_count_files(ck, ".snap.") == 3);

	/* after a restart they are loaded back and serve hits */
	KT_OK(ts_open(&e, root_dir(), 1, &p));
	ks_store_start_scan(e.s);
	KT_EQ_INT(ts_lookup(&e, tok, 50, NULL, 0, NULL, NULL), 36);
	KT_EQ_INT(ts_lookup(&e, tok, 30, NULL, 0, NULL, NULL), 24);
	ts_close(&e);
	/* and before the scan, by their names (interval multiples) */
	KT_OK(ts_open(&e, root_dir(), 1, &p));
	KT_EQ_INT(ts_lookup(&e, tok, 50, NULL, 0, NULL, NULL), 36);
	ts_close(&e);

	/* the cap, read again at the scan: oldest files go first */
	struct ks_params p2 = p;
	p2.env_ckpt_max = "600";
	KT_OK(ts_open(&e, root_dir(), 1, &p2));
	ks_store_start_scan(e.s);
	ks_store_stats(e.s, &st);
	KT_CHECKF(st.bytes[1] <= 600, "checkpoint folder holds %llu bytes, cap 600", (unsigned long long)st.bytes[1]);
	KT_CHECK(st.ckpt_evictions > 0);
	ts_close(&e);
}

/* Flip one byte of every snapshot file under a folder (nftw callback). */
static int flip_snap_fn(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
	(void)sb;
	if (type == FTW_F && strstr(path + ftw->base, ".snap."))
		flip_byte(path, 3);
	return 0;
}

/*
 * More corrupt resume points on one prompt than a fetch plans again for
 * (16 rounds): every round's snapshot fails its CRC. The fetch must end
 * in a miss, never hand its last, failed plan to the RAM cache. Here that
 * plan is at 24, a block end whose blocks the RAM tree already holds (an
 * entry of another prompt sharing 28 tokens), so nothing else would stop
 * the snapshot that failed its check from being stored and served.
 */
KT_CASE(more_corrupt_snapshots_than_replans_give_a_miss)
{
	struct ts_env e;
	int32_t tok[64], other[64];
	struct kv_page *pg[16];
	struct ks_params p = {.no_threads = 1, .ckpt_interval = 1, .queue_cap = 64, .env_ckpt_max = "0"};
	ts_tokens(tok, 64, 64, 9);
	ts_tokens(other, 64, 28, 10);
	KT_OK(ts_open(&e, root_dir(), 1, &p));
	int np = tc_pages(e.pool, &e.L, tok, 40, pg);
	KT_REQUIRE(np == 5);
	for (uint32_t at = 17; at <= 39; at++) {
		void *ctx[2] = {tok, (void *)(uintptr_t)at};
		KT_OK(ks_store_ckpt(e.s, tok, at, pg, fill_snap, ctx));
		ks_store_drain(e.s);
	}
	for (int i = 0; i < np; i++)
		kv_page_unref(pg[i]);
	ts_close(&e);
	char ck[4200];
	snprintf(ck, sizeof ck, "%s/kv_checkpoints", root_dir());
	KT_EQ_INT(ts_count_files(ck, ".snap."), 23);
	KT_REQUIRE(nftw(ck, flip_snap_fn, 16, FTW_PHYS) == 0);

	KT_OK(ts_open(&e, root_dir(), 1, &p));
	ks_store_start_scan(e.s);
	ts_put(&e, tok, 16, NULL, 0, 0);   /* RAM resumes tok at 16 ... */
	ts_put(&e, other, 30, NULL, 0, 0); /* ... and holds blocks 0-2 */
	struct ks_fetch f;
	KT_EQ_INT(ts_lookup(&e, tok, 50, NULL, 0, NULL, &f), 16);
	KT_EQ_INT(f.pos, 0);
	struct ks_stats st;
	ks_store_stats(e.s, &st);
	KT_EQ_U64(st.bad[KS_BAD_CRC], 16);
	ts_close(&e);
}

KT_CASE(checkpoint_queue_drops_when_full)
{
	struct ts_env e;
	int32_t tok[16];
	struct kv_page *pg[2];
	struct ks_params p = {.no_threads = 1, .ckpt_interval = 4, .queue_cap = 2};
	ts_tokens(tok, 16, 16, 7);
	KT_OK(ts_open(&e, root_dir(), 0, &p));
	int np = tc_pages(e.pool, &e.L, tok, 12, pg);
	KT_OK(ks_store_ckpt(e.s, tok, 4, pg, NULL, NULL));
	KT_OK(ks_store_ckpt(e.s, tok, 8, pg, NULL, NULL));
	KT_EQ_INT(ks_store_ckpt(e.s, tok, 12, pg, NULL, NULL), KV_ERR_FULL);
	struct ks_stats st;
	ks_store_stats(e.s, &st);
	KT_EQ_U64(st.drops, 1);
	KT_EQ_U64(st.queue_len, 2);
	for (int i = 0; i < np; i++)
		kv_page_unref(pg[i]);
	KT_EQ_U64(ks_store_drain(e.s), 2);
	ts_close(&e);
}

/* One I/O fault during the writes: counted, nothing half-written, and
 * what was not written is a miss (never wrong) after a restart. */
static void fault_case(int err, uint32_t ops, int werr, const char *what)
{
	struct ts_env e;
	int32_t tok[64];
	uint32_t bounds[] = {B0, B1};
	ts_tokens(tok, 64, 64, 8);
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	session(&e, tok);
	struct kv_io_fault fl = {.ops = ops, .err = err, .after = 3, .count = 0, .path_substr = root_dir()};
	kv_io_fault_set(&fl);
	ks_store_drain(e.s);
	kv_io_fault_set(NULL);
	struct ks_stats st;
	ks_store_stats(e.s, &st);
	KT_CHECKF(st.write_errors[werr] >= 1, "%s: counted %llu", what, (unsigned long long)st.write_errors[werr]);
	/* the RAM tier still serves */
	struct kc_hit h;
	kc_cache_lookup(e.c, tok, N_PROMPT, &h);
	KT_EQ_INT(h.pos, B1);
	kc_hit_release(e.c, &h);
	ts_close(&e);
	KT_EQ_INT(ts_count_files(root_dir(), ".tmp."), 0);
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	ks_store_start_scan(e.s);
	uint32_t pos = ts_lookup(&e, tok, N_PROMPT, bounds, 2, NULL, NULL);
	KT_CHECKF(pos == 0 || pos == 16 || pos == B0 || pos == 32 || pos == B1, "%s: resumed at %u", what, pos);
	ks_store_stats(e.s, &st);
	KT_EQ_U64(st.quarantined, 0);
	ts_close(&e);
	KT_EQ_INT(ts_rmrf(root_dir()), 0);
}

KT_CASE(io_faults_keep_serving)
{
	kv_log_set_level(KV_LOG_ERROR);
	fault_case(ENOSPC, KV_IO_BIT(KV_IO_PWRITE), KS_WERR_ENOSPC, "ENOSPC");
	fault_case(EIO, KV_IO_BIT(KV_IO_PWRITE), KS_WERR_EIO, "EIO");
	fault_case(EIO, KV_IO_BIT(KV_IO_FDATASYNC), KS_WERR_FSYNC, "fdatasync");
	fault_case(EIO, KV_IO_BIT(KV_IO_FSYNC_DIR), KS_WERR_FSYNC, "folder fsync");
	fault_case(EROFS, KV_IO_BIT(KV_IO_OPEN), KS_WERR_READONLY, "read-only");
	kv_log_set_level(KV_LOG_WARN);
}

KT_CASE(readonly_folder_at_open)
{
	struct ts_env e;
	int32_t tok[64];
	ts_tokens(tok, 64, 64, 9);
	/* the folder cannot be created: a file sits where it should be */
	char blocker[4096];
	snprintf(blocker, sizeof blocker, "%s/blocked", kt_tmpdir());
	KT_OK(kv_durable_write(blocker, "x", 1, KV_DW_NO_SYNC));
	char root[4200];
	snprintf(root, sizeof root, "%s/sub", blocker);
	kv_log_set_level(KV_LOG_ERROR);
	KT_OK(ts_open(&e, root, 1, NULL));
	kv_log_set_level(KV_LOG_WARN);
	session(&e, tok);
	ks_store_drain(e.s);
	struct ks_stats st;
	ks_store_stats(e.s, &st);
	KT_EQ_INT(st.writable, 0);
	KT_CHECK(st.write_errors[KS_WERR_READONLY] >= 1);
	KT_EQ_U64(st.written[KS_BLOCK], 0);
	struct ks_flush_report rep;
	KT_OK(ks_store_flush(e.s, 1.0, &rep));
	KT_EQ_U64(rep.entries_saved, 0);
	ts_close(&e);
}

KT_CASE(write_behind_thread)
{
	struct ts_env e;
	int32_t tok[64];
	uint32_t bounds[] = {B0, B1};
	struct ks_params p = {0}; /* threads on */
	ts_tokens(tok, 64, 64, 10);
	KT_OK(ts_open(&e, root_dir(), 1, &p));
	session(&e, tok);
	ks_store_kick(e.s);
	struct ks_stats st;
	for (int i = 0; i < 500; i++) {
		ks_store_stats(e.s, &st);
		if (st.written[KS_ENTRY] == 2 && kc_cache_dirty_count(e.c) == 0)
			break;
		kv_sleep_ms(10);
	}
	KT_EQ_U64(st.written[KS_ENTRY], 2);
	/* nothing left for the flush */
	struct ks_flush_report rep;
	KT_OK(ks_store_flush(e.s, 1.0, &rep));
	KT_EQ_U64(rep.objects_saved, 0);
	KT_EQ_INT(rep.probed, 0);
	ts_close(&e);
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	ks_store_start_scan(e.s);
	KT_EQ_INT(ts_lookup(&e, tok, N_PROMPT, bounds, 2, NULL, NULL), B1);
	ts_close(&e);
}

KT_CASE(catalog_orders_leaves_first)
{
	/* a chain b1 <- b2 <- b3 with an entry at b3, plus an old sibling
	 * branch b2' under b1: the oldest leaf goes first, a shared block
	 * only after everything built on it */
	struct ks_cat *c = ks_cat_create();
	KT_REQUIRE(c);
	struct kv_h128 ns = {1, 1}, b1 = {2, 0}, b2 = {3, 0}, b3 = {4, 0}, b2x = {5, 0}, e = {6, 0};
	struct ks_rec r1 = {.id = b1, .parent = ns, .pos = 8, .kind = KS_BLOCK, .bytes = 10, .mtime = 100};
	struct ks_rec r2 = {.id = b2, .parent = b1, .pos = 16, .kind = KS_BLOCK, .bytes = 10, .mtime = 300};
	struct ks_rec r3 = {.id = b3, .parent = b2, .pos = 24, .kind = KS_BLOCK, .bytes = 10, .mtime = 300};
	struct ks_rec rx = {.id = b2x, .parent = b1, .pos = 16, .kind = KS_BLOCK, .bytes = 10, .mtime = 200};
	struct ks_rec re = {.id = e, .parent = b3, .pos = 27, .n = 27, .kind = KS_ENTRY, .bytes = 5, .mtime = 300};
	struct ks_rec rt = {.id = e, .parent = b3, .pos = 27, .n = 3, .kind = KS_TAIL, .bytes = 5, .mtime = 250};
	/* children before parents, as a scan may find them */
	KT_CHECK(ks_cat_put(c, &re) >= 0 && ks_cat_put(c, &rt) >= 0 && ks_cat_put(c, &r3) >= 0);
	KT_CHECK(ks_cat_put(c, &rx) >= 0 && ks_cat_put(c, &r2) >= 0 && ks_cat_put(c, &r1) >= 0);
	KT_EQ_U64(ks_cat_bytes(c, -1), 50);
	int32_t *o;
	size_t n;
	KT_OK(ks_cat_order(c, -1, 0, &o, &n));
	KT_EQ_U64(n, 6);
	/* b2' (200) first; then the newest group, deepest first: entry, tail,
	 * b3, b2, and b1 (raised to 300 by its subtree) last */
	const struct kv_h128 want[6] = {b2x, e, e, b3, b2, b1};
	for (size_t i = 0; i < n && i < 6; i++)
		KT_CHECKF(kv_h128_eq(ks_cat_at(c, o[i])->id, want[i]), "position %zu holds %llx", i,
			  (unsigned long long)ks_cat_at(c, o[i])->id.lo);
	KT_EQ_INT(ks_cat_at(c, o[1])->kind, KS_ENTRY); /* a manifest never outlives its tail */
	KT_EQ_INT(ks_cat_at(c, o[0])->eff, 200);
	KT_EQ_INT(ks_cat_at(c, o[5])->eff, 300); /* b1: its own use was 100 */
	free(o);
	/* touching the old branch makes it the newest */
	ks_cat_touch(c, ks_cat_find(c, 0, KS_BLOCK, b2x), 400);
	KT_OK(ks_cat_order(c, -1, 0, &o, &n));
	KT_CHECK(kv_h128_eq(ks_cat_at(c, o[0])->id, e));
	KT_CHECK(kv_h128_eq(ks_cat_at(c, o[n - 1])->id, b1));
	free(o);
	/* children by parent, and deletion */
	int kids = 0;
	for (int32_t i = ks_cat_first_child(c, b1); i >= 0; i = ks_cat_at(c, i)->next_sib)
		kids++;
	KT_EQ_INT(kids, 2);
	ks_cat_del(c, ks_cat_find(c, 0, KS_BLOCK, b2x));
	kids = 0;
	for (int32_t i = ks_cat_first_child(c, b1); i >= 0; i = ks_cat_at(c, i)->next_sib)
		kids++;
	KT_EQ_INT(kids, 1);
	KT_EQ_U64(ks_cat_count(c, -1), 5);
	ks_cat_destroy(c);
}

KT_CASE(budget_parse)
{
	KT_CHECK(ks_store_budget_parse(NULL) == 3.5);
	KT_CHECK(ks_store_budget_parse("") == 3.5);
	KT_CHECK(ks_store_budget_parse("2.25") == 2.25);
	kv_log_set_level(KV_LOG_ERROR);
	KT_CHECK(ks_store_budget_parse("abc") == 3.5);
	KT_CHECK(ks_store_budget_parse("-1") == 3.5);
	kv_log_set_level(KV_LOG_WARN);
}

/* A namespace whose server has run for 8 days (marker 8 days old) is not
 * removed by another server's scan while the first one holds it; once it
 * has stopped, the age-out removes it. */
KT_CASE(live_namespace_survives_age_out)
{
	struct ts_env a, b, c;
	struct ks_stats st;
	struct ks_params pa = {.no_threads = 1, .ns = {0xa1, 0xa2}};
	struct ks_params pb = {.no_threads = 1, .ns = {0xb1, 0xb2}};
	struct ks_params pc = {.no_threads = 1, .ns = {0xc1, 0xc2}};
	KT_OK(ts_open(&a, root_dir(), 0, &pa));
	char mk[4300];
	snprintf(mk, sizeof mk, "%s/namespace.safetensors", ks_store_ns_dir(a.s));
	struct utimbuf ut = {.actime = time(NULL) - 8 * 86400, .modtime = time(NULL) - 8 * 86400};
	KT_REQUIRE(utime(mk, &ut) == 0);
	KT_OK(ts_open(&b, root_dir(), 0, &pb));
	ks_store_start_scan(b.s);
	ks_store_stats(b.s, &st);
	KT_EQ_U64(st.ns_removed, 0);
	KT_EQ_INT(access(mk, F_OK), 0);
	/* the live server still writes */
	int32_t tok[64];
	ts_tokens(tok, 64, 64, 21);
	session(&a, tok);
	KT_CHECK(ks_store_drain(a.s) > 0);
	ks_store_stats(a.s, &st);
	KT_EQ_U64(st.write_errors[KS_WERR_EIO], 0);
	ts_close(&b);
	ts_close(&a);
	KT_REQUIRE(utime(mk, &ut) == 0);
	KT_OK(ts_open(&c, root_dir(), 0, &pc));
	ks_store_start_scan(c.s);
	ks_store_stats(c.s, &st);
	KT_EQ_U64(st.ns_removed, 1);
	KT_EQ_INT(access(mk, F_OK), -1);
	ts_close(&c);
}

/* Two servers on one namespace: the second is told (store.ns_busy), reads
 * but writes and deletes nothing; after the first stops, a new one writes. */
KT_CASE(second_server_on_namespace)
{
	struct ts_env a, b;
	struct ks_stats st;
	int32_t tok[64];
	ts_tokens(tok, 64, 64, 22);
	KT_OK(ts_open(&a, root_dir(), 0, NULL));
	session(&a, tok);
	KT_CHECK(ks_store_drain(a.s) > 0);
	/* debris of the first server's write in progress */
	char tmp[4300];
	snprintf(tmp, sizeof tmp, "%s/x.tmp.1.1", ks_store_ns_dir(a.s));
	KT_OK(kv_durable_write(tmp, "x", 1, KV_DW_NO_SYNC));
	kv_log_set_level(KV_LOG_ERROR);
	KT_OK(ts_open(&b, root_dir(), 0, NULL));
	kv_log_set_level(KV_LOG_WARN);
	ks_store_start_scan(b.s);
	ks_store_stats(b.s, &st);
	KT_EQ_INT(st.writable, 0);
	KT_EQ_U64(st.debris_removed, 0);
	KT_EQ_INT(access(tmp, F_OK), 0);
	/* it reads what the first one wrote */
	uint32_t bounds[] = {B0, B1};
	KT_CHECK(ts_lookup(&b, tok, N_PROMPT, bounds, 2, NULL, NULL) >= B1);
	ts_close(&b);
	ks_store_stats(a.s, &st);
	KT_EQ_INT(st.writable, 1);
	ts_close(&a);
	KT_OK(ts_open(&b, root_dir(), 0, NULL));
	ks_store_stats(b.s, &st);
	KT_EQ_INT(st.writable, 1);
	ts_close(&b);
}

/* A full disk at open: degraded but retrying, like an ENOSPC during the
 * run; once there is room, the namespace is made and objects are written. */
KT_CASE(full_disk_at_open_retries)
{
	struct ts_env e;
	struct ks_stats st;
	int32_t tok[64];
	ts_tokens(tok, 64, 64, 23);
	struct kv_io_fault fl = {.ops = KV_IO_BIT(KV_IO_OPEN) | KV_IO_BIT(KV_IO_MKDIR) | KV_IO_BIT(KV_IO_PWRITE),
				 .err = ENOSPC,
				 .path_substr = root_dir()};
	kv_io_fault_set(&fl);
	kv_log_set_level(KV_LOG_ERROR);
	KT_OK(ts_open(&e, root_dir(), 0, NULL));
	session(&e, tok);
	ks_store_drain(e.s); /* still full */
	kv_log_set_level(KV_LOG_WARN);
	kv_io_fault_set(NULL);
	ks_store_stats(e.s, &st);
	KT_EQ_INT(st.writable, 1);
	KT_EQ_U64(st.write_errors[KS_WERR_READONLY], 0);
	KT_CHECK(st.write_errors[KS_WERR_ENOSPC] >= 1);
	/* space is back */
	ts_tokens(tok, 64, 0, 24);
	session(&e, tok);
	KT_CHECK(ks_store_drain(e.s) > 0);
	ks_store_stats(e.s, &st);
	KT_CHECK(st.written[KS_BLOCK] > 0);
	char mk[4300];
	snprintf(mk, sizeof mk, "%s/namespace.safetensors", ks_store_ns_dir(e.s));
	KT_EQ_INT(access(mk, F_OK), 0);
	ts_close(&e);
}

/* `kvkeep cache` edges: prune --max-mb 0 deletes corrupt files too (and
 * says so), verify --dir MISSING and prune --max-mb -1 are usage errors. */
KT_CASE(cache_tool_edges)
{
	struct ts_env e;
	int32_t tok[64];
	ts_tokens(tok, 64, 64, 25);
	KT_OK(ts_open(&e, root_dir(), 0, NULL));
	session(&e, tok);
	KT_CHECK(ks_store_drain(e.s) > 0);
	ts_close(&e);
	int objs = ts_count_files(root_dir(), ".safetensors") - 1; /* less the marker */
	KT_REQUIRE(objs >= 3);
	/* two corrupt objects: garbage in the header, and a truncated one */
	KT_EQ_INT(kt_sh("cd %s && set -- $(find . -name '*.safetensors' ! -name namespace.safetensors | sort | head -2) && "
			"printf garbagegarbage | dd of=$1 bs=1 seek=9 conv=notrunc 2>/dev/null && truncate -s 20 $2",
			root_dir()),
		0);
	KT_EQ_INT(kt_sh("%s cache verify --dir %s >/dev/null", kt_bin(), root_dir()), 1);
	KT_EQ_INT(kt_sh("%s cache prune --max-mb 0 --dir %s > %s/prune.txt", kt_bin(), root_dir(), kt_tmpdir()), 0);
	KT_EQ_INT(kt_sh("grep -q '2 of them corrupt); 0.0 MiB left' %s/prune.txt", kt_tmpdir()), 0);
	KT_EQ_INT(ts_count_files(root_dir(), ".safetensors"), 1);
	KT_EQ_INT(kt_sh("%s cache verify --dir %s >/dev/null", kt_bin(), root_dir()), 0);
	/* usage errors: exit 2 with a message */
	KT_EQ_INT(kt_sh("%s cache verify --dir %s/missing 2>%s/err.txt >/dev/null", kt_bin(), kt_tmpdir(), kt_tmpdir()),
		  2);
	KT_EQ_INT(kt_sh("grep -q 'No such file' %s/err.txt", kt_tmpdir()), 0);
	KT_EQ_INT(kt_sh("%s cache prune --max-mb 1 --dir %s/missing 2>/dev/null", kt_bin(), kt_tmpdir()), 2);
	KT_EQ_INT(kt_sh("%s cache prune --max-mb -1 --dir %s 2>%s/err.txt", kt_bin(), root_dir(), kt_tmpdir()), 2);
	KT_EQ_INT(kt_sh("grep -q 'must be 0 or more' %s/err.txt", kt_tmpdir()), 0);
}

/*
 * The disk index at scale: N block objects (KVKEEP_CAT_BENCH_N, default
 * 3000; docs/persistence.md has the 100K numbers) written straight into a
 * namespace folder, then a store opened on it and scanned. Prints the
 * scan time and the heap bytes the catalog holds per object, and checks
 * the latter stays under 200 bytes.
 */
static uint64_t rss_bytes(void)
{
	unsigned long long size = 0, res = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (f) {
		if (fscanf(f, "%llu %llu", &size, &res) != 2)
			res = 0;
		fclose(f);
	}
	return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

KT_CASE(catalog_scale)
{
	const char *e = getenv("KVKEEP_CAT_BENCH_N");
	int N = e && atoi(e) > 0 ? atoi(e) : 3000;
	struct ke_layout L;
	ts_layout(&L, 0);
	struct kv_h128 ns = {0x1111, 0x2222}, parent = ns;
	char dir[4096];
	KT_OK(ks_dir_ns_path(root_dir(), ns, KS_AREA_MAIN, dir, sizeof dir));
	static uint8_t page[1 << 16];
	KT_REQUIRE(L.page_bytes <= sizeof page);
	uint64_t t0 = kv_now_ns();
	for (int i = 0; i < N; i++) {
		int32_t tok[TS_B];
		for (int k = 0; k < TS_B; k++)
			tok[k] = k ? (i * 7 + k) % 1000 : i; /* every block distinct */
		/* chains of 64 blocks, so the parent map has real fan-in */
		if (i % 64 == 0)
			parent = ns;
		struct kv_h128 id = kc_chain_hash(parent, tok, TS_B);
		struct ks_obj_src src = {.kind = KS_BLOCK, .ns = ns, .id = id, .parent = parent,
					 .pos = (uint32_t)((i % 64 + 1) * TS_B), .tokens = tok, .n_tokens = TS_B, .kv = page};
		char sh[4096], path[4300];
		KT_OK(ks_dir_shard_path(dir, id, sh, sizeof sh));
		if (i < 256)
			KT_OK(ks_dir_ensure(sh));
		KT_OK(ks_dir_obj_path(dir, KS_BLOCK, id, path, sizeof path));
		if (ks_obj_write(path, &L, &src, KV_DW_NO_SYNC, 0, NULL)) {
			KT_OK(ks_dir_ensure(sh));
			KT_OK(ks_obj_write(path, &L, &src, KV_DW_NO_SYNC, 0, NULL));
		}
		parent = id;
	}
	double write_s = (double)(kv_now_ns() - t0) / 1e9;
	struct ts_env env;
	struct ks_params p = {.no_threads = 1, .tool = 1};
	KT_OK(ts_open(&env, root_dir(), 0, &p));
	struct mallinfo2 m0 = mallinfo2();
	uint64_t rss0 = rss_bytes();
	t0 = kv_now_ns();
	ks_store_start_scan(env.s);
	double scan_s = (double)(kv_now_ns() - t0) / 1e9;
	struct mallinfo2 m1 = mallinfo2();
	struct ks_stats st;
	ks_store_stats(env.s, &st);
	KT_EQ_U64(st.files[0], (uint64_t)N);
	double per = ((double)(m1.uordblks + m1.hblkhd) - (double)(m0.uordblks + m0.hblkhd)) / N;
	double rss = ((double)rss_bytes() - (double)rss0) / N;
	printf("# catalog_scale: %d objects: write %.2f s, scan %.3f s (%.1f us/object), index %.0f heap bytes/object, "
	       "RSS %+.0f bytes/object\n",
	       N, write_s, scan_s, scan_s * 1e6 / N, per, rss);
	KT_CHECKF(per < 200, "%.0f bytes per object", per);
	ts_close(&env);
}

/* The object cap: however small the objects, a namespace holds at most
 * max_files of them, least recently used out first. */
KT_CASE(object_cap_evicts_least_recently_used)
{
	struct ts_env e;
	int32_t tok[10][40];
	/* each session: 4 blocks + 1 tail + manifest = 6 objects */
	struct ks_params p = {.no_threads = 1, .max_files = 20};
	KT_OK(ts_open(&e, root_dir(), 0, &p));
	for (int i = 0; i < 10; i++) {
		ts_tokens(tok[i], 40, 0, 300 + (uint64_t)i);
		ts_put(&e, tok[i], 35, NULL, 0, 0);
		ks_store_drain(e.s);
		struct ks_stats st;
		ks_store_stats(e.s, &st);
		KT_CHECKF(st.files[0] + st.files[1] <= 20, "after session %d: %llu objects, cap 20", i,
			  (unsigned long long)(st.files[0] + st.files[1]));
	}
	ts_close(&e);
	KT_CHECK(ts_count_files(root_dir(), ".safetensors") <= 21); /* + the marker */
	KT_OK(ts_open(&e, root_dir(), 0, &p));
	ks_store_start_scan(e.s);
	KT_EQ_INT(ts_lookup(&e, tok[9], 36, NULL, 0, NULL, NULL), 35);
	KT_EQ_INT(ts_lookup(&e, tok[0], 36, NULL, 0, NULL, NULL), 0);
	ts_close(&e);
}

KT_MAIN(hybrid_restart_resumes_at_boundary, direct_lookup_before_the_scan, dense_restart_longest_prefix,
	corrupt_files_give_shorter_hits, other_namespaces_are_never_hits, namespaces_age_out,
	disk_cap_evicts_least_recently_used, interval_checkpoints_serve_hits,
	more_corrupt_snapshots_than_replans_give_a_miss, checkpoint_queue_drops_when_full,
	io_faults_keep_serving, readonly_folder_at_open, write_behind_thread, catalog_orders_leaves_first, budget_parse,
	live_namespace_survives_age_out, second_server_on_namespace, full_disk_at_open_retries,
	cache_tool_edges, catalog_scale, object_cap_evicts_least_recently_used)
