/*
 * test_store_echo.c - the answer records on disk (store/echo.c): they
 * survive a restart byte for byte; a corrupted, truncated or out-of-
 * vocabulary file is refused and quarantined, never loaded; another
 * namespace's file is left alone; the folder keeps to the records' budget.
 */
#include "cache/echo.h"
#include "test_store_util.h"

#include <dirent.h>
#include <fcntl.h>

static char g_root[4096];

static struct kc_echo_rec mk(const char *key, const char *reasoning, const char *text, const int32_t *tok, uint32_t n)
{
	return (struct kc_echo_rec){.key = key, .key_len = strlen(key), .reasoning = reasoning,
				    .reasoning_len = strlen(reasoning), .text = text, .text_len = strlen(text),
				    .tokens = tok, .n_tokens = n};
}

/* The record files of the namespace's echo/ folder (paths into out). */
static int echo_files(const struct ts_env *e, char out[][4400], int max)
{
	char dir[4200];
	int n = 0;
	snprintf(dir, sizeof dir, "%.4000s/echo", ks_store_ns_dir(e->s));
	DIR *d = opendir(dir);
	struct dirent *de;
	if (!d)
		return 0;
	while ((de = readdir(d)) && n < max)
		if (strstr(de->d_name, ".echo.safetensors") && !strstr(de->d_name, ".tmp."))
			snprintf(out[n++], 4400, "%.4200s/%.150s", dir, de->d_name);
	closedir(d);
	return n;
}

static int have(struct ts_env *e, const char *key, const char *reasoning, uint32_t n_tokens)
{
	struct kc_echo_rec r;
	void *b = NULL;
	int rc = kc_echo_get(kc_cache_echo(e->c), key, strlen(key), reasoning, strlen(reasoning), &r, &b);
	int ok = rc == KV_OK && r.n_tokens == n_tokens;
	free(b);
	return ok;
}

#define KEY(s) "kvkeep-echo-1|" s

KT_CASE(records_survive_a_restart)
{
	struct ts_env e;
	int32_t t1[5] = {1, 2, 3, 4, 5}, t2[3] = {9, 8, 7};
	ts_echo_bytes = 1 << 20;
	KT_OK(ts_open(&e, g_root, 0, NULL));
	struct kc_echo_rec a = mk(KEY("a"), "thought", "<gp>hello", t1, 5), b = mk(KEY("b"), "", "<gp>bye", t2, 3);
	KT_OK(kc_echo_put(kc_cache_echo(e.c), &a, 1));
	KT_OK(kc_echo_put(kc_cache_echo(e.c), &b, 1));
	ks_store_drain(e.s);
	char files[8][4400];
	KT_EQ_INT(echo_files(&e, files, 8), 2);
	ts_close(&e);
	KT_OK(ts_open(&e, g_root, 0, NULL));
	KT_CHECK(have(&e, KEY("a"), "thought", 5));
	KT_CHECK(have(&e, KEY("b"), "", 3));
	struct kc_echo_rec r;
	void *blk;
	KT_OK(kc_echo_get(kc_cache_echo(e.c), KEY("a"), strlen(KEY("a")), "", 0, &r, &blk));
	KT_CHECK(!memcmp(r.tokens, t1, sizeof t1) && !strcmp(r.text, "<gp>hello") && !strcmp(r.reasoning, "thought"));
	free(blk);
	struct ks_stats st;
	ks_store_stats(e.s, &st);
	KT_EQ_U64(st.echo_loaded, 2);
	/* loaded records are not written again */
	ks_store_drain(e.s);
	ks_store_stats(e.s, &st);
	KT_EQ_U64(st.echo_written, 0);
	ts_close(&e);
}

/* Change one byte of a file at offset from its end. */
static void poke(const char *path, long from_end)
{
	int fd = open(path, O_RDWR);
	off_t end = lseek(fd, 0, SEEK_END);
	char c;
	KT_CHECK(pread(fd, &c, 1, end - from_end) == 1);
	c ^= 0x20;
	KT_CHECK(pwrite(fd, &c, 1, end - from_end) == 1);
	close(fd);
}

KT_CASE(bad_files_are_refused)
{
	struct ts_env e;
	int32_t t[4] = {1, 2, 3, 4}, big[2] = {1, 700000};
	ts_echo_bytes = 1 << 20;
	kt_sh("rm -rf %s", g_root);
	struct ks_params p = {.no_threads = 1, .vocab = 5000};
	KT_OK(ts_open(&e, g_root, 0, &p));
	struct kc_echo_rec r1 = mk(KEY("crc"), "", "text one", t, 4), r2 = mk(KEY("short"), "", "text two", t, 4),
			   r3 = mk(KEY("vocab"), "", "text three", big, 2), r4 = mk(KEY("good"), "", "text four", t, 4);
	KT_OK(kc_echo_put(kc_cache_echo(e.c), &r1, 1));
	ks_store_drain(e.s);
	char f[8][4400];
	KT_EQ_INT(echo_files(&e, f, 8), 1);
	poke(f[0], 3); /* a byte of the text: the data checksum fails */
	KT_OK(kc_echo_put(kc_cache_echo(e.c), &r2, 1));
	ks_store_drain(e.s);
	int n = echo_files(&e, f, 8);
	for (int i = 0; i < n; i++) { /* the other file: cut short */
		struct stat sb;
		stat(f[i], &sb);
		FILE *x = fopen(f[i], "rb");
		char hdr[9] = {0};
		KT_CHECK(fread(hdr, 1, 8, x) == 8);
		fclose(x);
		if (kt_sh("grep -q 'text two' %s", f[i]) == 0)
			KT_CHECK(truncate(f[i], sb.st_size - 2) == 0);
	}
	KT_OK(kc_echo_put(kc_cache_echo(e.c), &r3, 1));
	KT_OK(kc_echo_put(kc_cache_echo(e.c), &r4, 1));
	ks_store_drain(e.s);
	ts_close(&e);
	KT_OK(ts_open(&e, g_root, 0, &p));
	KT_CHECK(!have(&e, KEY("crc"), "", 4));
	KT_CHECK(!have(&e, KEY("short"), "", 4));
	KT_CHECK(!have(&e, KEY("vocab"), "", 2));
	KT_CHECK(have(&e, KEY("good"), "", 4));
	struct ks_stats st;
	ks_store_stats(e.s, &st);
	KT_EQ_U64(st.echo_rejected, 3);
	KT_EQ_U64(st.echo_loaded, 1);
	KT_EQ_INT(echo_files(&e, f, 8), 1); /* the bad ones left for quarantine */
	KT_CHECK(kt_sh("ls %s/quarantine | grep -q echo", g_root) == 0);
	ts_close(&e);
	/* another namespace's file in our folder: left alone, not loaded */
	KT_OK(ts_open(&e, g_root, 0, &p));
	char mine[8][4400];
	KT_EQ_INT(echo_files(&e, mine, 8), 1);
	ts_close(&e);
	struct ks_params q = {.no_threads = 1, .vocab = 5000, .ns = {0x3333, 0x4444}};
	KT_OK(ts_open(&e, g_root, 0, &q));
	char dir[4400];
	snprintf(dir, sizeof dir, "%.4000s/echo", ks_store_ns_dir(e.s));
	kt_sh("mkdir -p %s && cp %s %s/", dir, mine[0], dir);
	ts_close(&e);
	KT_OK(ts_open(&e, g_root, 0, &q));
	KT_CHECK(!have(&e, KEY("good"), "", 4));
	ks_store_stats(e.s, &st);
	KT_EQ_U64(st.echo_rejected, 0);
	KT_EQ_INT(echo_files(&e, f, 8), 1);
	ts_close(&e);
}

KT_CASE(folder_keeps_to_the_budget)
{
	struct ts_env e;
	int32_t t[64] = {0};
	char key[64], text[2000];
	memset(text, 'z', sizeof text - 1);
	text[sizeof text - 1] = 0;
	ts_echo_bytes = 16 * 1024;
	kt_sh("rm -rf %s", g_root);
	KT_OK(ts_open(&e, g_root, 0, NULL));
	for (int i = 0; i < 40; i++) {
		snprintf(key, sizeof key, KEY("r%d"), i);
		struct kc_echo_rec r = mk(key, "", text, t, 64);
		KT_OK(kc_echo_put(kc_cache_echo(e.c), &r, 1));
		ks_store_drain(e.s);
	}
	char f[64][4400];
	int n = echo_files(&e, f, 64);
	uint64_t total = 0;
	for (int i = 0; i < n; i++) {
		struct stat sb;
		stat(f[i], &sb);
		total += (uint64_t)sb.st_size;
	}
	KT_CHECKF(total <= 16 * 1024 && n >= 3 && n < 40, "%d files, %llu bytes", n, (unsigned long long)total);
	ts_close(&e);
	ts_echo_bytes = 0;
}

int main(int argc, char **argv)
{
	snprintf(g_root, sizeof g_root, "%s/kvkeep-echo-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
	void (*fns[])(void) = {records_survive_a_restart, bad_files_are_refused, folder_keeps_to_the_budget};
	int rc = kt_main_list(argc, argv, __FILE__, fns, 3,
			      "records_survive_a_restart, bad_files_are_refused, folder_keeps_to_the_budget");
	kt_sh("rm -rf %s", g_root);
	return rc;
}
