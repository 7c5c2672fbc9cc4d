/*
 * test_store_crash.c - the disk tier under crashes and a slow disk.
 *
 *   crash matrix    a child process writing two sessions exits (as if
 *                   killed) right after mutating step k of the write
 *                   protocol, for every k until it completes
 *                   (KV_IO_CRASH_EXIT); then a SIGKILL at random moments
 *                   of the write-behind thread and of the shutdown flush.
 *                   After each, a new process must find no temp debris
 *                   after its scan and every lookup must be a correct hit
 *                   or a miss - before and after the scan.
 *   flush budget    with writes slowed to 1 MB/s through the I/O table,
 *                   the shutdown flush ends within its budget and saves
 *                   the newest message-boundary entry first.
 */
#include "base/clock.h"
#include "base/err.h"
#include "base/io.h"
#include "base/log.h"
#include "store/store.h"
#include "kt.h"
#include "test_store_util.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_SESS 3

static const char *root_dir(void)
{
	static char r[4096];
	snprintf(r, sizeof r, "%s/cache", kt_tmpdir());
	return r;
}

/* Session i: prompt 40 tokens sharing 20 with the others (a common system
 * prompt), boundaries 20 and 37, entries at 37 and 46. */
static void sess_tokens(int i, int32_t *tok)
{
	ts_tokens(tok, 64, 20, 1000 + (uint64_t)i);
}

static void put_session(struct ts_env *e, int i)
{
	int32_t tok[64];
	uint32_t bounds[] = {20, 37};
	struct ks_fetch f;
	sess_tokens(i, tok);
	/* the request start: the store learns the boundaries */
	struct ks_req rq = {.tokens = tok, .n = 40, .bounds = bounds, .n_bounds = 2};
	ks_store_fetch(e->s, &rq, &f);
	uint32_t ck1[] = {16, 20, 32};
	ts_put(e, tok, 37, ck1, 3, 20);
	uint32_t ck2[] = {20, 32, 37};
	ts_put(e, tok, 46, ck2, 3, 20);
}

/* Every session's turn-1 replay and next turn: a correct hit or a miss. */
static int g_n_sess = N_SESS; /* sessions the child writes (the crash matrix uses 2) */

static void check_all(const char *when)
{
	struct ts_env e;
	uint32_t bounds[] = {20, 37};
	for (int scan = 0; scan <= 1; scan++) {
		KT_OK(ts_open(&e, root_dir(), 1, NULL));
		if (scan) {
			ks_store_start_scan(e.s);
			int debris = ts_count_files(root_dir(), ".tmp.");
			KT_CHECKF(debris == 0, "%s: %d temp files survived the scan", when, debris);
		}
		for (int i = 0; i < g_n_sess; i++) {
			int32_t tok[64];
			sess_tokens(i, tok);
			uint32_t p1 = ts_lookup(&e, tok, 40, bounds, 2, NULL, NULL);
			uint32_t p2 = ts_lookup(&e, tok, 60, bounds, 2, NULL, NULL);
			KT_CHECKF(p1 == 0 || p1 == 16 || p1 == 20 || p1 == 32 || p1 == 37, "%s: session %d resumed at %u",
				  when, i, p1);
			KT_CHECKF(p2 >= p1, "%s: the longer prompt resumed earlier (%u < %u)", when, p2, p1);
		}
		struct ks_stats st;
		ks_store_stats(e.s, &st);
		KT_CHECKF(st.quarantined == 0, "%s: %llu files quarantined after a crash (a torn file was visible)",
			  when, (unsigned long long)st.quarantined);
		ts_close(&e);
	}
}

/*
 * A process kill leaves the page cache intact, so the syncs add nothing
 * to what these tests can observe - but they make every run pay for real
 * disk flushes. They are replaced by no-ops here; the I/O table still
 * counts them as steps (and the crash matrix stops after them too).
 */
static int nosync(int fd)
{
	(void)fd;
	return 0;
}

static int open3(const char *p, int flags, mode_t mode)
{
	return open(p, flags, mode);
}

static void fast_syncs(int on)
{
	static struct kv_io_ops ops;
	if (!on) {
		kv_io_set_ops(NULL);
		return;
	}
	ops = (struct kv_io_ops){.open = open3, .close = close, .pread = pread, .pwrite = pwrite, .fsync = nosync,
				 .fdatasync = nosync, .rename = rename, .unlink = unlink, .mkdir = mkdir,
				 .fstat = fstat, .ftruncate = ftruncate};
	kv_io_set_ops(&ops);
}

/* Child: write the sessions with a crash after step k. */
static void child_steps(int64_t k)
{
	struct ts_env e;
	kv_log_set_level(KV_LOG_OFF);
	if (ts_open(&e, root_dir(), 1, NULL))
		_exit(3);
	for (int i = 0; i < g_n_sess; i++)
		put_session(&e, i);
	struct kv_io_fault f = {.crash_after_step = k, .crash_mode = KV_IO_CRASH_EXIT};
	kv_io_fault_set(&f);
	ks_store_drain(e.s);
	kv_io_fault_set(NULL);
	_exit(0);
}

KT_CASE(crash_after_every_step)
{
	int64_t k;
	int crashes = 0;
	g_n_sess = 2;
	fast_syncs(1);
	for (k = 1; k < 2000; k++) {
		KT_REQUIRE(ts_rmrf(root_dir()) == 0);
		fflush(stdout);
		fflush(stderr);
		pid_t pid = fork();
		KT_REQUIRE(pid >= 0);
		if (pid == 0)
			child_steps(k);
		int st = 0;
		KT_REQUIRE(waitpid(pid, &st, 0) == pid);
		KT_REQUIRE(WIFEXITED(st));
		if (WEXITSTATUS(st) == 0)
			break; /* all steps done without reaching k */
		KT_REQUIRE(WEXITSTATUS(st) == KV_IO_CRASH_STATUS);
		crashes++;
		char when[64];
		snprintf(when, sizeof when, "crash after step %lld", (long long)k);
		check_all(when);
		if (kt_failed_checks)
			break;
	}
	fast_syncs(0);
	if (kt_failed_checks)
		return;
	KT_CHECKF(crashes > 50, "only %d crash points: the writes took fewer steps than expected", crashes);
	printf("# crash matrix: %d crash points\n", crashes);
	/* the complete run: every session whole */
	check_all("no crash");
	struct ts_env e;
	uint32_t bounds[] = {20, 37};
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	ks_store_start_scan(e.s);
	for (int i = 0; i < g_n_sess; i++) {
		int32_t tok[64];
		sess_tokens(i, tok);
		KT_EQ_INT(ts_lookup(&e, tok, 40, bounds, 2, NULL, NULL), 37);
	}
	ts_close(&e);
	g_n_sess = N_SESS;
}

/* Child: keeps storing sessions with the writer thread on a slow disk
 * (mode 0) or stores them and runs the shutdown flush (mode 1); the
 * parent kills it. */
static void child_kill(int mode)
{
	struct ts_env e;
	struct ks_params p = {.no_threads = mode == 1};
	kv_log_set_level(KV_LOG_OFF);
	if (ts_open(&e, root_dir(), 1, &p))
		_exit(3);
	struct kv_io_fault f = {.write_bytes_per_s = 200000, .sync_delay_us = 300};
	kv_io_fault_set(&f);
	for (int i = 0; i < N_SESS; i++) {
		put_session(&e, i);
		ks_store_kick(e.s);
	}
	if (mode == 1)
		ks_store_flush(e.s, 5.0, NULL);
	else
		kv_sleep_ms(5000);
	_exit(0);
}

static void kill_at_random(int mode, const char *what)
{
	uint64_t seed = 99 + (uint64_t)mode;
	fast_syncs(1);
	for (int it = 0; it < 12; it++) {
		KT_REQUIRE(ts_rmrf(root_dir()) == 0);
		fflush(stdout);
		fflush(stderr);
		pid_t pid = fork();
		KT_REQUIRE(pid >= 0);
		if (pid == 0)
			child_kill(mode);
		kv_sleep_ms(20 + kt_rand(&seed) % 250);
		kill(pid, SIGKILL);
		int st;
		KT_REQUIRE(waitpid(pid, &st, 0) == pid);
		char when[64];
		snprintf(when, sizeof when, "SIGKILL during %s, try %d", what, it);
		check_all(when);
		if (kt_failed_checks)
			break;
	}
	fast_syncs(0);
}

KT_CASE(kill_during_write_behind)
{
	kill_at_random(0, "write-behind");
}

KT_CASE(kill_during_shutdown_flush)
{
	kill_at_random(1, "the shutdown flush");
}

KT_CASE(flush_keeps_its_budget)
{
	struct ts_env e;
	const int n_sess = 12;
	uint32_t bounds[] = {20, 37};
	/* bigger objects: 32 KiB pages */
	ts_attn_layers = 32;
	ts_kv_heads = 8;
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	for (int i = 0; i < n_sess; i++)
		put_session(&e, i);
	struct kv_io_fault f = {.write_bytes_per_s = 1000000, .sync_delay_us = 500};
	kv_io_fault_set(&f);
	struct ks_flush_report rep;
	double budget = 1.0;
	uint64_t t0 = kv_now_ns();
	KT_OK(ks_store_flush(e.s, budget, &rep));
	double took = (double)(kv_now_ns() - t0) / 1e9;
	kv_io_fault_set(NULL);
	KT_CHECKF(took <= budget, "the flush took %.3f s, budget %.3f s", took, budget);
	KT_CHECKF(rep.seconds <= budget, "reported %.3f s", rep.seconds);
	KT_CHECK(rep.probed);
	KT_CHECK(rep.first_bps >= 150e6 && rep.first_bps <= 600e6);
	KT_CHECKF(rep.entries_saved >= 1, "saved %u entries", rep.entries_saved);
	KT_CHECKF(rep.entries_skipped >= 1, "nothing skipped: the test disk is too fast to test the budget");
	KT_EQ_INT(rep.first_entry_boundary, 1);
	KT_EQ_INT(rep.first_entry_len, 37);
	ts_close(&e);

	/* what was saved: the newest session's boundary entry */
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	ks_store_start_scan(e.s);
	int32_t tok[64];
	sess_tokens(n_sess - 1, tok);
	KT_EQ_INT(ts_lookup(&e, tok, 40, bounds, 2, NULL, NULL), 37);
	sess_tokens(0, tok);
	KT_CHECK(ts_lookup(&e, tok, 40, bounds, 2, NULL, NULL) < 37);
	ts_close(&e);
	ts_attn_layers = 2;
	ts_kv_heads = 2;
}

KT_CASE(flush_saves_everything_with_time)
{
	struct ts_env e;
	uint32_t bounds[] = {20, 37};
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	for (int i = 0; i < N_SESS; i++)
		put_session(&e, i);
	struct ks_flush_report rep;
	KT_OK(ks_store_flush(e.s, 3.5, &rep));
	KT_EQ_INT(rep.entries_saved, 2 * N_SESS);
	KT_EQ_INT(rep.entries_skipped, 0);
	KT_EQ_INT(rep.first_entry_boundary, 1);
	ts_close(&e);
	KT_OK(ts_open(&e, root_dir(), 1, NULL));
	ks_store_start_scan(e.s);
	for (int i = 0; i < N_SESS; i++) {
		int32_t tok[64];
		sess_tokens(i, tok);
		KT_EQ_INT(ts_lookup(&e, tok, 40, bounds, 2, NULL, NULL), 37);
		KT_EQ_INT(ts_lookup(&e, tok, 60, bounds, 2, NULL, NULL), 46);
	}
	ts_close(&e);
}

KT_MAIN(crash_after_every_step, kill_during_write_behind, kill_during_shutdown_flush, flush_keeps_its_budget,
	flush_saves_everything_with_time)
