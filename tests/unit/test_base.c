/*
 * test_base.c - src/base: errors, hashes, buffers, maps, pool, memory
 * accounting, the I/O fault hook and the durable write protocol.
 */
#include "kt.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/corrupt.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/json.h"
#include "base/log.h"
#include "base/map.h"
#include "base/mem.h"
#include "base/pages.h"
#include "base/pool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

KT_CASE(errors_have_names)
{
	KT_EQ_STR(kv_strerror(KV_OK), "ok");
	KT_EQ_STR(kv_strerror(KV_ERR_CORRUPT), "corrupt");
	KT_EQ_STR(kv_strerror(12345), "unknown error");
	KT_EQ_INT(kv_fail(KV_ERR_INVALID, "x=%d", 5), KV_ERR_INVALID);
	KT_EQ_STR(kv_errmsg(), "x=5");
	kv_fail_ctx(KV_ERR_INVALID, "loading %s", "f");
	KT_EQ_STR(kv_errmsg(), "loading f: x=5");
	uint64_t before = kv_corrupt_count();
	kv_log_set_level(KV_LOG_OFF);
	KT_EQ_INT(KV_CORRUPT("a.bin", 17, "bad %s", "magic"), KV_ERR_CORRUPT);
	kv_log_set_level(KV_LOG_WARN);
	KT_EQ_U64(kv_corrupt_count(), before + 1);
	KT_CHECK(strstr(kv_errmsg(), "a.bin") && strstr(kv_errmsg(), "offset 17"));
	KT_EQ_INT(kv_log_parse_level("debug"), KV_LOG_DEBUG);
	KT_EQ_INT(kv_log_parse_level("bogus"), -1);
}

/* The child half of log_invalid_level_warns_once, in a fresh process (the
 * logger reads KVKEEP_LOG once per process): five threads log at once. */
static void *log_probe(void *arg)
{
	kv_log(KV_LOG_INFO, "test.probe", "thread=%d", (int)(intptr_t)arg);
	return NULL;
}

static int count_of(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

/* KVKEEP_LOG=bogus once hung every program that logged: the logger's
 * one-time initialisation reported the bad value through kv_log, which
 * waited on the same pthread_once (issue 37). Now it warns exactly once,
 * from whichever thread logs first, and logs at the default level (info). */
KT_CASE(log_invalid_level_warns_once)
{
	if (getenv("KT_LOG_CHILD")) {
		pthread_t t[4];
		for (int i = 0; i < 4; i++)
			pthread_create(&t[i], NULL, log_probe, (void *)(intptr_t)(i + 1));
		log_probe(0);
		for (int i = 0; i < 4; i++)
			pthread_join(t[i], NULL);
		return;
	}
	int fd[2];
	KT_REQUIRE(pipe(fd) == 0);
	pid_t pid = fork();
	KT_REQUIRE(pid >= 0);
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);
		dup2(null, 1);
		dup2(fd[1], 2);
		close(fd[0]);
		setenv("KVKEEP_LOG", "bo\"gus", 1);
		setenv("KT_LOG_CHILD", "1", 1);
		execl("/proc/self/exe", "test_base", "log_invalid_level_warns_once", (char *)NULL);
		_exit(127);
	}
	close(fd[1]);
	char out[8192];
	size_t n = 0;
	int hung = 0;
	for (;;) {
		struct pollfd p = {fd[0], POLLIN, 0};
		int r = poll(&p, 1, 10000);
		if (r == 0) {
			hung = 1;
			break;
		}
		ssize_t k = r > 0 ? read(fd[0], out + n, sizeof out - 1 - n) : -1;
		if (k <= 0 || n + (size_t)k >= sizeof out - 1) {
			if (k > 0)
				n += (size_t)k;
			break;
		}
		n += (size_t)k;
	}
	out[n] = 0;
	close(fd[0]);
	if (hung)
		kill(pid, SIGKILL);
	int st = 0;
	waitpid(pid, &st, 0);
	KT_CHECKF(!hung, "a program with KVKEEP_LOG=bogus still hangs in its first log call");
	KT_CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d: %s", st, out);
	KT_EQ_INT(count_of(out, "event=log.level_invalid"), 1);
	/* the value is quoted with its quote escaped, so it cannot end the field */
	KT_CHECKF(strstr(out, "level=warn event=log.level_invalid value=\"bo\\\"gus\" using=info"), "%s", out);
	KT_EQ_INT(count_of(out, "level=info event=test.probe"), 5);
}

KT_CASE(crc32c_vectors)
{
	KT_EQ_U64(kv_crc32c(0, "123456789", 9), 0xE3069283u);
	KT_EQ_U64(kv_crc32c_sw(0, "123456789", 9), 0xE3069283u);
	KT_EQ_U64(kv_crc32c(0, "", 0), 0);
	/* chaining equals one pass; hw equals table at every length/offset */
	uint8_t buf[300];
	uint64_t s = 1;
	for (size_t i = 0; i < sizeof buf; i++)
		buf[i] = (uint8_t)kt_rand(&s);
	for (size_t n = 0; n < sizeof buf; n += 7) {
		uint32_t a = kv_crc32c(0, buf + 1, n);
		KT_EQ_U64(a, kv_crc32c_sw(0, buf + 1, n));
		uint32_t c = kv_crc32c(kv_crc32c(0, buf + 1, n / 3), buf + 1 + n / 3, n - n / 3);
		KT_EQ_U64(a, c);
	}
}

KT_CASE(xxh3_basics)
{
	struct kv_h128 a = kv_xxh3_128("abcdef", 6, 0);
	struct kv_h128 b = kv_xxh3_128_cat("abc", 3, "def", 3);
	KT_CHECK(kv_h128_eq(a, b));
	char hex[33];
	struct kv_h128 c;
	kv_h128_hex(a, hex);
	KT_EQ_INT(strlen(hex), 32);
	KT_EQ_INT(kv_h128_parse(hex, &c), 0);
	KT_CHECK(kv_h128_eq(a, c));
	KT_EQ_INT(kv_h128_parse("zz", &c), -1);
	KT_CHECK(kv_xxh3_64("a", 1, 0) != kv_xxh3_64("b", 1, 0));
	/* XXH3_64 of the empty input with seed 0 is a published constant */
	KT_EQ_U64(kv_xxh3_64("", 0, 0), 0x2D06800538D394C2ull);
}

KT_CASE(buf_appends)
{
	struct kv_buf b = KV_BUF_INIT;
	for (int i = 0; i < 1000; i++)
		kv_buf_printf(&b, "%d,", i);
	KT_CHECK(!b.oom);
	KT_CHECK(!strncmp(b.p, "0,1,2,", 6));
	KT_EQ_INT(b.p[b.len], 0);
	kv_buf_reset(&b);
	kv_buf_adds(&b, "x");
	KT_EQ_STR(b.p, "x");
	char *t = kv_buf_take(&b);
	KT_EQ_STR(t, "x");
	free(t);
	KT_CHECK(b.p == NULL);
}

KT_CASE(map_matches_a_model)
{
	/* Random puts/dels against a plain array model. */
	struct kv_map *m = kv_map_create(0);
	enum { K = 2000 };
	static int64_t model[K];
	uint64_t s = 7;
	for (int i = 0; i < K; i++)
		model[i] = -1;
	for (int step = 0; step < 50000; step++) {
		int k = (int)(kt_rand(&s) % K);
		char key[32];
		int kl = snprintf(key, sizeof key, "key-%d-%s", k, (k % 3) ? "long-suffix-here" : "");
		int op = (int)(kt_rand(&s) % 3);
		if (op == 0) {
			uint64_t v = kt_rand(&s) >> 2;
			KT_OK(kv_map_put(m, key, (size_t)kl, v));
			model[k] = (int64_t)v;
		} else if (op == 1) {
			int r = kv_map_del(m, key, (size_t)kl);
			KT_EQ_INT(r, model[k] >= 0);
			model[k] = -1;
		} else {
			uint64_t v = 0;
			int r = kv_map_get(m, key, (size_t)kl, &v);
			KT_EQ_INT(r, model[k] >= 0);
			if (r && model[k] >= 0)
				KT_EQ_U64(v, (uint64_t)model[k]);
		}
	}
	size_t live = 0, it = 0, seen = 0;
	for (int i = 0; i < K; i++)
		live += model[i] >= 0;
	KT_EQ_U64(kv_map_count(m), live);
	while (kv_map_next(m, &it, NULL, NULL, NULL))
		seen++;
	KT_EQ_U64(seen, live);
	kv_map_destroy(m);
}

KT_CASE(mem_accounting)
{
	uint64_t before = kv_mem_used(KV_MEM_KV);
	void *p = kv_alloc(KV_MEM_KV, 1000);
	KT_REQUIRE(p);
	KT_EQ_INT(((uintptr_t)p) & 63, 0);
	KT_EQ_U64(kv_mem_used(KV_MEM_KV), before + 1000);
	p = kv_realloc(KV_MEM_KV, p, 5000);
	KT_REQUIRE(p);
	KT_EQ_U64(kv_alloc_size(p), 5000);
	KT_EQ_U64(kv_mem_used(KV_MEM_KV), before + 5000);
	kv_free(p);
	KT_EQ_U64(kv_mem_used(KV_MEM_KV), before);
	KT_CHECK(kv_mem_peak(KV_MEM_KV) >= before + 5000);
	kv_mem_note(KV_MEM_WEIGHTS, 123);
	KT_CHECK(kv_mem_used(KV_MEM_WEIGHTS) >= 123);
	kv_mem_note(KV_MEM_WEIGHTS, -123);
	KT_EQ_STR(kv_mem_cat_name(KV_MEM_KV), "kv_pages");
}

/* A thread's scratch grows, keeps its address while big enough, and is
 * given back when the thread exits (a scheduler's engine thread used to
 * leak its kernels' buffers). */
static void *tls_thread(void *arg)
{
	uint64_t *seen = arg;
	char *a = kv_tls_scratch(KV_TLS_GEMM_WIDE, 1000);
	char *b = kv_tls_scratch(KV_TLS_GEMM_WIDE, 500);
	char *c = kv_tls_scratch(KV_TLS_QDOT_PACK, 3000);
	seen[0] = a && a == b && c && c != a && !((uintptr_t)a & 63) && !((uintptr_t)c & 63);
	seen[1] = kv_mem_used(KV_MEM_SCRATCH);
	memset(a, 1, 1000);
	memset(c, 2, 3000);
	return NULL;
}

KT_CASE(tls_scratch_freed_at_thread_exit)
{
	uint64_t before = kv_mem_used(KV_MEM_SCRATCH), seen[2] = {0, 0};
	pthread_t th;
	KT_EQ_INT(pthread_create(&th, NULL, tls_thread, seen), 0);
	pthread_join(th, NULL);
	KT_CHECK(seen[0]);
	KT_CHECK(seen[1] >= before + 4000);
	KT_EQ_U64(kv_mem_used(KV_MEM_SCRATCH), before);
	KT_CHECK(kv_tls_scratch(KV_TLS__COUNT, 16) == NULL);
}

struct sum_ctx {
	uint64_t *out;
	int *hits;
};

static void sum_range(void *ctx, size_t b, size_t e, int t)
{
	struct sum_ctx *c = ctx;
	(void)t;
	for (size_t i = b; i < e; i++) {
		c->out[i] = i * i;
		__atomic_add_fetch(&c->hits[i], 1, __ATOMIC_RELAXED);
	}
}

KT_CASE(pool_covers_every_index_once)
{
	struct kv_pool *p = kv_pool_create(3);
	KT_REQUIRE(p);
	for (size_t n = 1; n < 3000; n = n * 3 + 1) {
		for (size_t grain = 1; grain <= 64; grain *= 8) {
			uint64_t *out = calloc(n, sizeof *out);
			int *hits = calloc(n, sizeof *hits);
			struct sum_ctx c = {out, hits};
			kv_pool_for(p, n, grain, sum_range, &c);
			for (size_t i = 0; i < n; i++) {
				KT_EQ_INT(hits[i], 1);
				KT_EQ_U64(out[i], i * i);
			}
			free(out);
			free(hits);
		}
	}
	/* many small dispatches back to back */
	uint64_t out[8];
	int hits[8] = {0};
	struct sum_ctx c = {out, hits};
	for (int r = 0; r < 20000; r++)
		kv_pool_for(p, 8, 1, sum_range, &c);
	for (int i = 0; i < 8; i++)
		KT_EQ_INT(hits[i], 20000);
	kv_pool_destroy(p);
	KT_CHECK(kv_pool_global() != NULL);
	KT_CHECK(kv_ncores() >= 1);
}

KT_CASE(clock_moves)
{
	uint64_t a = kv_now_ns();
	kv_sleep_ms(2);
	uint64_t b = kv_now_ns();
	KT_CHECK(b - a >= 2000000);
	KT_CHECK(kv_wall_s() > 1700000000);
}

static int count_files(const char *dir, const char *substr)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;
	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.' && (!substr || strstr(e->d_name, substr)))
			n++;
	closedir(d);
	return n;
}

static int file_equals(const char *path, const void *p, size_t n)
{
	char *buf;
	size_t len;
	if (kv_io_read_file(path, 1 << 26, &buf, &len))
		return 0;
	int eq = len == n && !memcmp(buf, p, n);
	free(buf);
	return eq;
}

KT_CASE(durable_write_basic)
{
	char path[512];
	struct stat st;
	snprintf(path, sizeof path, "%s/obj.bin", kt_tmpdir());
	KT_OK(kv_durable_write(path, "hello", 5, 0));
	KT_CHECK(file_equals(path, "hello", 5));
	KT_EQ_INT(stat(path, &st), 0);
	KT_EQ_INT(st.st_mode & 0777, 0600);
	/* overwrite is atomic too */
	KT_OK(kv_durable_write(path, "bye", 3, 0));
	KT_CHECK(file_equals(path, "bye", 3));
	KT_EQ_INT(count_files(kt_tmpdir(), ".tmp."), 0);
	KT_CHECK(kv_dw_is_temp_name("x.tmp.12.3"));
	KT_CHECK(!kv_dw_is_temp_name("x.safetensors"));
	/* a missing folder is a clean error */
	KT_EQ_INT(kv_durable_write("/nonexistent-dir/x", "a", 1, 0), KV_ERR_NOT_FOUND);
}

/* A file for the user gets 0666 minus the umask (what cp or a shell
 * redirect would give it), never more: a 077 umask keeps it private. */
KT_CASE(durable_write_public_follows_the_umask)
{
	char path[512];
	struct stat st;
	mode_t old = umask(022);
	snprintf(path, sizeof path, "%s/model.gguf", kt_tmpdir());
	KT_OK(kv_durable_write(path, "gguf", 4, KV_DW_PUBLIC));
	KT_EQ_INT(stat(path, &st), 0);
	KT_EQ_INT(st.st_mode & 0777, 0644);
	umask(077);
	KT_OK(kv_durable_write(path, "gguf", 4, KV_DW_PUBLIC | KV_DW_NO_SYNC));
	KT_EQ_INT(stat(path, &st), 0);
	KT_EQ_INT(st.st_mode & 0777, 0600);
	umask(old);
	KT_CHECK(file_equals(path, "gguf", 4));
}

/* Each injected fault: the call fails, no final file, no temp debris. */
KT_CASE(durable_write_faults)
{
	static const struct {
		uint32_t ops;
		int err;
		int expect;
	} cases[] = {
		{KV_IO_BIT(KV_IO_PWRITE), EIO, KV_ERR_IO},
		{KV_IO_BIT(KV_IO_PWRITE), ENOSPC, KV_ERR_FULL},
		{KV_IO_BIT(KV_IO_FDATASYNC), EIO, KV_ERR_IO},
		{KV_IO_BIT(KV_IO_OPEN), EACCES, KV_ERR_IO},
		{KV_IO_BIT(KV_IO_RENAME), EIO, KV_ERR_IO},
		{KV_IO_BIT(KV_IO_FSYNC_DIR), EIO, KV_ERR_IO},
	};
	char big[100000];
	memset(big, 'x', sizeof big);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char path[512];
		snprintf(path, sizeof path, "%s/f%zu.bin", kt_tmpdir(), i);
		struct kv_io_fault f = {.ops = cases[i].ops, .err = cases[i].err};
		kv_io_fault_set(&f);
		int rc = kv_durable_write(path, big, sizeof big, 0);
		uint64_t injected = kv_io_faults_injected();
		kv_io_fault_set(NULL);
		KT_EQ_INT(rc, cases[i].expect);
		KT_CHECK(injected >= 1);
		KT_CHECKF(access(path, F_OK) != 0, "case %zu left a final file", i);
	}
	KT_EQ_INT(count_files(kt_tmpdir(), ".tmp."), 0);

	/* A failed fdatasync is not retried: exactly one attempt. */
	{
		char path[512];
		snprintf(path, sizeof path, "%s/once.bin", kt_tmpdir());
		struct kv_io_fault f = {.ops = KV_IO_BIT(KV_IO_FDATASYNC), .err = EIO, .count = 1};
		kv_io_fault_set(&f);
		KT_EQ_INT(kv_durable_write(path, "a", 1, 0), KV_ERR_IO);
		KT_EQ_U64(kv_io_faults_injected(), 1);
		kv_io_fault_set(NULL);
		KT_CHECK(access(path, F_OK) != 0);
	}

	/* Short writes are completed by the loop: the file is whole. */
	{
		char path[512];
		snprintf(path, sizeof path, "%s/short.bin", kt_tmpdir());
		struct kv_io_fault f = {.ops = KV_IO_BIT(KV_IO_PWRITE), .short_write = 1, .count = 5};
		kv_io_fault_set(&f);
		KT_OK(kv_durable_write(path, big, sizeof big, 0));
		KT_CHECK(kv_io_faults_injected() >= 1);
		kv_io_fault_set(NULL);
		KT_CHECK(file_equals(path, big, sizeof big));
	}
}

/*
 * Simulated crash after every step k of the protocol: the final file is
 * either absent or complete (old content or new), never partial.
 */
KT_CASE(durable_write_crash_each_step)
{
	char path[512];
	char newc[5000], oldc[] = "old content";
	memset(newc, 'n', sizeof newc);
	snprintf(path, sizeof path, "%s/c.bin", kt_tmpdir());
	int complete_seen = 0;
	for (int with_old = 0; with_old < 2; with_old++) {
		for (int k = 1; k < 12; k++) {
			unlink(path);
			if (with_old)
				KT_OK(kv_durable_write(path, oldc, sizeof oldc, 0));
			struct kv_dw w;
			struct kv_io_fault f = {.crash_after_step = k, .crash_mode = KV_IO_CRASH_FREEZE};
			kv_io_fault_set(&f);
			int rc = kv_dw_begin(&w, path);
			if (rc == 0) {
				/* three writes so there are several write steps */
				rc = kv_dw_write(&w, newc, 1000);
				if (!rc)
					rc = kv_dw_write(&w, newc + 1000, 2000);
				if (!rc)
					rc = kv_dw_write(&w, newc + 3000, 2000);
				if (!rc)
					rc = kv_dw_commit(&w, 0);
				else
					kv_dw_abort(&w);
			}
			int crashed = kv_io_crashed();
			kv_io_fault_set(NULL);
			if (access(path, F_OK) == 0) {
				int is_new = file_equals(path, newc, sizeof newc);
				int is_old = with_old && file_equals(path, oldc, sizeof oldc);
				KT_CHECKF(is_new || is_old, "k=%d: final file is partial", k);
				if (is_new && !crashed)
					KT_EQ_INT(rc, 0);
				complete_seen += is_new;
			} else {
				KT_CHECKF(!with_old || crashed, "k=%d: old file vanished", k);
			}
			/* clean the debris the "dead process" left */
			DIR *d = opendir(kt_tmpdir());
			struct dirent *e;
			while (d && (e = readdir(d))) {
				if (kv_dw_is_temp_name(e->d_name)) {
					char p2[1024];
					snprintf(p2, sizeof p2, "%s/%s", kt_tmpdir(), e->d_name);
					unlink(p2);
				}
			}
			if (d)
				closedir(d);
		}
	}
	KT_CHECK(complete_seen > 0);
}

/* Crash in a child process with _exit after step k. */
KT_CASE(durable_write_crash_exit_child)
{
	char path[512];
	snprintf(path, sizeof path, "%s/x.bin", kt_tmpdir());
	for (int k = 1; k <= 6; k++) {
		unlink(path);
		pid_t pid = fork();
		if (pid == 0) {
			struct kv_io_fault f = {.crash_after_step = k, .crash_mode = KV_IO_CRASH_EXIT};
			kv_io_fault_set(&f);
			kv_durable_write(path, "0123456789", 10, 0);
			_exit(0);
		}
		int st = 0;
		waitpid(pid, &st, 0);
		KT_CHECK(WIFEXITED(st));
		int code = WEXITSTATUS(st);
		KT_CHECK(code == KV_IO_CRASH_STATUS || code == 0);
		if (access(path, F_OK) == 0)
			KT_CHECK(file_equals(path, "0123456789", 10));
	}
}

KT_CASE(read_only_folder)
{
	char dir[512], path[600];
	snprintf(dir, sizeof dir, "%s/ro", kt_tmpdir());
	KT_OK(kv_io_mkdirs(dir, 0700));
	snprintf(path, sizeof path, "%s/a.bin", dir);
	struct kv_io_fault f = {.ops = KV_IO_BIT(KV_IO_OPEN), .err = EROFS};
	kv_io_fault_set(&f);
	KT_EQ_INT(kv_durable_write(path, "a", 1, 0), KV_ERR_IO);
	kv_io_fault_set(NULL);
	KT_CHECK(access(path, F_OK) != 0);
}

KT_CASE(json_helpers)
{
	json_t *j = NULL;
	const char *txt = "{\"a\": 5, \"b\": \"s\", \"c\": true, \"d\": 1.5}";
	KT_OK(kv_json_parse("t", txt, strlen(txt), 64, &j));
	int64_t a;
	double d;
	int c;
	const char *b;
	KT_OK(kv_json_get_int(j, "a", 0, &a, "t"));
	KT_EQ_INT(a, 5);
	KT_OK(kv_json_get_str(j, "b", NULL, &b, "t"));
	KT_EQ_STR(b, "s");
	KT_OK(kv_json_get_bool(j, "c", 0, &c, "t"));
	KT_EQ_INT(c, 1);
	KT_OK(kv_json_get_num(j, "d", 0, &d, "t"));
	KT_CHECK(d == 1.5);
	KT_EQ_INT(kv_json_get_int(j, "b", 0, &a, "t"), KV_ERR_INVALID);
	KT_CHECK(strstr(kv_errmsg(), "'b'"));
	json_decref(j);
	char deep[600];
	memset(deep, '[', 300);
	memset(deep + 300, ']', 300);
	KT_EQ_INT(kv_json_parse("t", deep, 600, 128, &j), KV_ERR_INVALID);
	KT_EQ_INT(kv_json_parse("t", "{\"a\":", 5, 128, &j), KV_ERR_INVALID);
	KT_CHECK(strstr(kv_errmsg(), "line 1"));
}

KT_CASE(pages_refcount)
{
	uint64_t before = kv_mem_used(KV_MEM_KV);
	struct kv_pages *p = kv_pages_create(4096, 3, 1);
	struct kv_page *a = kv_page_alloc(p), *b = kv_page_alloc(p), *c = kv_page_alloc(p);
	KT_REQUIRE(a && b && c);
	KT_CHECK(kv_page_alloc(p) == NULL); /* limit */
	KT_EQ_U64(kv_pages_in_use(p), 3);
	KT_EQ_U64(kv_mem_used(KV_MEM_KV), before + 3 * 4096);
	kv_page_ref(a);
	KT_EQ_INT(kv_page_refs(a), 2);
	kv_page_unref(a);
	KT_EQ_U64(kv_pages_in_use(p), 3);
	kv_page_unref(a);
	kv_page_unref(b);
	KT_EQ_U64(kv_pages_in_use(p), 1);
	/* one kept on the free list, one returned to the system */
	KT_EQ_U64(kv_mem_used(KV_MEM_KV), before + 2 * 4096);
	struct kv_page *d = kv_page_alloc(p);
	KT_REQUIRE(d);
	kv_page_unref(c);
	kv_page_unref(d);
	kv_page_unref(NULL);
	KT_EQ_U64(kv_pages_in_use(p), 0);
	kv_pages_destroy(p);
	KT_EQ_U64(kv_mem_used(KV_MEM_KV), before);
}

/* Numbers jansson cannot hold become number literals with their exact
 * text; everything else parses as before, and no client string can pass
 * for a literal. */
KT_CASE(json_big_numbers)
{
	const char *txt = "{\"a\": 18446744073709551615, \"b\": [-9223372036854775809, 1e400, -1E+400],"
			  " \"c\": \"1e400 in a string\", \"d\": 5, \"e\": 1e-400, \"f\": 0.5,"
			  " \"g\": \"\\u0000kvnum-0123456789abcdef:7\"}";
	json_t *v = NULL;
	KT_OK(kv_json_parse("t", txt, strlen(txt), 16, &v));
	KT_REQUIRE(v);
	const char *lit;
	size_t n;
	KT_REQUIRE(kv_json_number_literal(json_object_get(v, "a"), &lit, &n));
	KT_CHECK(n == 20 && !memcmp(lit, "18446744073709551615", 20));
	json_t *b = json_object_get(v, "b");
	KT_REQUIRE(kv_json_number_literal(json_array_get(b, 0), &lit, &n));
	KT_CHECK(n == 20 && !memcmp(lit, "-9223372036854775809", 20));
	KT_REQUIRE(kv_json_number_literal(json_array_get(b, 1), &lit, &n));
	KT_CHECK(n == 5 && !memcmp(lit, "1e400", 5));
	KT_REQUIRE(kv_json_number_literal(json_array_get(b, 2), &lit, &n));
	KT_CHECK(n == 7 && !memcmp(lit, "-1E+400", 7));
	KT_EQ_STR(json_string_value(json_object_get(v, "c")), "1e400 in a string");
	KT_CHECK(!kv_json_number_literal(json_object_get(v, "c"), &lit, &n));
	KT_EQ_INT(json_integer_value(json_object_get(v, "d")), 5);
	KT_CHECK(json_is_real(json_object_get(v, "e")) && json_real_value(json_object_get(v, "e")) == 0);
	KT_CHECK(json_real_value(json_object_get(v, "f")) == 0.5);
	/* a forged literal (any tag but this process's) is a plain string */
	KT_CHECK(json_is_string(json_object_get(v, "g")));
	KT_CHECK(!kv_json_number_literal(json_object_get(v, "g"), &lit, &n));
	/* code that wants an integer refuses a literal as it refused the text */
	int64_t iv;
	KT_EQ_INT(kv_json_get_int(v, "a", 0, &iv, "t"), KV_ERR_INVALID);
	json_decref(v);
	/* other errors are still errors, with their own message */
	const char *bad = "{\"a\": 1e400, \"b\": }";
	KT_EQ_INT(kv_json_parse("t", bad, strlen(bad), 16, &v), KV_ERR_INVALID);
	KT_CHECK(v == NULL);
	KT_EQ_INT(kv_json_parse("t", "[01]", 4, 16, &v), KV_ERR_INVALID);
}

KT_MAIN(errors_have_names, log_invalid_level_warns_once, pages_refcount, crc32c_vectors, xxh3_basics, buf_appends, map_matches_a_model, mem_accounting,
	pool_covers_every_index_once, tls_scratch_freed_at_thread_exit, clock_moves, durable_write_basic, durable_write_public_follows_the_umask,
	durable_write_faults,
	durable_write_crash_each_step, durable_write_crash_exit_child, read_only_folder, json_helpers,
	json_big_numbers)
