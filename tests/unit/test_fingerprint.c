/*
 * test_fingerprint.c - the model fingerprint (server/fingerprint.h): every
 * weight byte names the namespace, and the memo keeps later starts cheap.
 *
 * KVKEEP_FP_BENCH_GB=N runs bench_startup on an N GB sparse weight file
 * (cold hash, then a memo hit) and prints the times; otherwise that case
 * is reported as skipped.
 */
#include "kt.h"
#include "base/err.h"
#include "base/io.h"
#include "base/clock.h"
#include "server/fingerprint.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void put(const char *dir, const char *name, const void *p, size_t n)
{
	char path[4096];
	KT_OK(kv_path_fmt(path, sizeof path, "%s/%s", dir, name));
	FILE *f = fopen(path, "wb");
	if (f) {
		fwrite(p, 1, n, f);
		fclose(f);
	}
}

/* A "model": config.json and one weight file of 3 MiB (header + values). */
static void make_model(const char *dir)
{
	static char w[3u << 20];
	const char *hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[786430],\"data_offsets\":[0,3145720]}}";
	uint64_t n = 64;
	memset(w, ' ', 72);
	memcpy(w, &n, 8);
	memcpy(w + 8, hdr, strlen(hdr));
	for (size_t i = 72; i < sizeof w; i++)
		w[i] = (char)(i * 7);
	put(dir, "config.json", "{\"a\":1}", 7);
	put(dir, "model.safetensors", w, sizeof w);
}

static struct kv_h128 fp(const char *model, const char *memo, struct ksv_fp_stats *st)
{
	struct ksv_fp_params p = {.model_dir = model, .kv_dtype = "bf16", .page_tokens = 16, .memo_dir = memo};
	return ksv_model_fingerprint(&p, st);
}

/* A weight byte changes, size and mtime stay (a fine-tune written over the
 * old file, then touch -d): the namespace changes. */
KT_CASE(weight_byte_changes_namespace)
{
	char model[4096], memo[4096], path[4200];
	struct ksv_fp_stats st;
	snprintf(model, sizeof model, "%s/m", kt_tmpdir());
	snprintf(memo, sizeof memo, "%s/memo", kt_tmpdir());
	mkdir(model, 0700);
	make_model(model);
	struct kv_h128 a = fp(model, memo, &st);
	KT_EQ_INT(st.weight_files, 1);
	KT_EQ_INT(st.memo_hits, 0);
	KT_EQ_U64(st.bytes_hashed, 3u << 20);

	snprintf(path, sizeof path, "%s/model.safetensors", model);
	struct stat sb;
	KT_REQUIRE(stat(path, &sb) == 0);
	int fd = open(path, O_WRONLY);
	KT_REQUIRE(fd >= 0);
	char c = 0x55;
	KT_REQUIRE(pwrite(fd, &c, 1, 2u << 20) == 1);
	struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
	KT_REQUIRE(futimens(fd, ts) == 0);
	close(fd);
	struct stat sb2;
	KT_REQUIRE(stat(path, &sb2) == 0);
	KT_EQ_INT(sb2.st_size, sb.st_size);
	KT_CHECK(sb2.st_mtim.tv_sec == sb.st_mtim.tv_sec && sb2.st_mtim.tv_nsec == sb.st_mtim.tv_nsec);

	struct kv_h128 b = fp(model, memo, &st);
	KT_CHECK(!kv_h128_eq(a, b));
	KT_EQ_INT(st.memo_hits, 0);
	/* without a memo, the same values */
	struct kv_h128 b2 = fp(model, NULL, &st);
	KT_CHECK(kv_h128_eq(b, b2));
	KT_EQ_U64(st.bytes_hashed, 3u << 20);
}

/* int8-activation numerics (--quant-act q8 on a quantized model) get a
 * namespace of their own; f32 numerics keep the one they always had. */
KT_CASE(quant_act_changes_namespace)
{
	char model[4096];
	snprintf(model, sizeof model, "%s/m", kt_tmpdir());
	mkdir(model, 0700);
	make_model(model);
	struct ksv_fp_params p = {.model_dir = model, .kv_dtype = "bf16", .page_tokens = 16, .skip_weights = 1};
	struct kv_h128 f = ksv_model_fingerprint(&p, NULL);
	p.quant_act = "q8";
	struct kv_h128 q = ksv_model_fingerprint(&p, NULL);
	KT_CHECK(!kv_h128_eq(f, q));
	p.quant_act = NULL;
	KT_CHECK(kv_h128_eq(f, ksv_model_fingerprint(&p, NULL)));
}

/* The KV dtype is part of the namespace: bf16, f32 and q8_0 servers of
 * one model never share cache entries, in RAM or on disk (a q8_0 entry
 * served to a bf16 server would be a lossy answer where an exact one was
 * promised, and the other way round the bytes would not even be KV of
 * the layout). */
KT_CASE(kv_dtype_changes_namespace)
{
	char model[4096];
	snprintf(model, sizeof model, "%s/m", kt_tmpdir());
	mkdir(model, 0700);
	make_model(model);
	struct ksv_fp_params p = {.model_dir = model, .kv_dtype = "bf16", .page_tokens = 16, .skip_weights = 1};
	struct kv_h128 b = ksv_model_fingerprint(&p, NULL);
	p.kv_dtype = "q8_0";
	struct kv_h128 q = ksv_model_fingerprint(&p, NULL);
	p.kv_dtype = "f32";
	struct kv_h128 f = ksv_model_fingerprint(&p, NULL);
	KT_CHECK(!kv_h128_eq(b, q) && !kv_h128_eq(b, f) && !kv_h128_eq(q, f));
	p.kv_dtype = "q8_0";
	KT_CHECK(kv_h128_eq(q, ksv_model_fingerprint(&p, NULL)));
}

/* The second start reads no weight byte; a damaged memo is rehashed. */
KT_CASE(memo_hit_and_damaged_memo)
{
	char model[4096], memo[4096];
	struct ksv_fp_stats st;
	snprintf(model, sizeof model, "%s/m", kt_tmpdir());
	snprintf(memo, sizeof memo, "%s/memo", kt_tmpdir());
	mkdir(model, 0700);
	make_model(model);
	struct kv_h128 a = fp(model, memo, &st);
	KT_EQ_U64(st.bytes_hashed, 3u << 20);
	struct kv_h128 b = fp(model, memo, &st);
	KT_CHECK(kv_h128_eq(a, b));
	KT_EQ_INT(st.memo_hits, 1);
	KT_EQ_U64(st.bytes_hashed, 0);
	/* every memo file overwritten with a wrong hash of the right length */
	KT_EQ_INT(kt_sh("for f in %s/*; do sed -i 's/xxh3=./xxh3=g/' \"$f\"; done", memo), 0);
	struct kv_h128 c = fp(model, memo, &st);
	KT_CHECK(kv_h128_eq(a, c));
	KT_EQ_INT(st.memo_hits, 0);
	KT_EQ_U64(st.bytes_hashed, 3u << 20);
	/* an unwritable memo folder: still the same fingerprint */
	struct kv_h128 d = fp(model, "/proc/no-such-memo", &st);
	KT_CHECK(kv_h128_eq(a, d));
	/* a config change changes it too */
	put(model, "config.json", "{\"a\":2}", 7);
	KT_CHECK(!kv_h128_eq(a, fp(model, memo, &st)));
}

/* Startup cost, cold and with the memo, for KVKEEP_FP_BENCH_GB of weights. */
KT_CASE(bench_startup)
{
	const char *e = getenv("KVKEEP_FP_BENCH_GB");
	if (!e || atoi(e) <= 0) {
		kt_skip("set KVKEEP_FP_BENCH_GB=N to time an N GB weight file");
		return;
	}
	char model[4096], memo[4096], path[4200];
	struct ksv_fp_stats st;
	snprintf(model, sizeof model, "%s/m", kt_tmpdir());
	snprintf(memo, sizeof memo, "%s/memo", kt_tmpdir());
	mkdir(model, 0700);
	make_model(model);
	snprintf(path, sizeof path, "%s/model.safetensors", model);
	KT_REQUIRE(truncate(path, (off_t)atoi(e) << 30) == 0); /* sparse beyond 3 MiB */
	struct kv_h128 a = fp(model, memo, &st);
	printf("# %s GB: cold %.3f s (%.2f GB/s), ", e, st.seconds, (double)st.bytes_hashed / 1e9 / st.seconds);
	struct kv_h128 b = fp(model, memo, &st);
	printf("memo hit %.3f ms\n", st.seconds * 1e3);
	KT_CHECK(kv_h128_eq(a, b));
	KT_EQ_INT(st.memo_hits, 1);
}

KT_MAIN(weight_byte_changes_namespace, quant_act_changes_namespace, memo_hit_and_damaged_memo, bench_startup, kv_dtype_changes_namespace)
