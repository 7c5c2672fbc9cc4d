/*
 * fingerprint.c - see fingerprint.h.
 */
#include "server/fingerprint.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/io.h"
#include "base/log.h"
#include "engine/model.h"
#include "model/gguf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MEMO_MAGIC "kvkeep-weights-1"
#define READ_CHUNK (8u << 20)

static void hash_file(struct kv_buf *acc, const char *dir, const char *name, size_t max)
{
	char path[4096];
	char *buf = NULL;
	size_t len = 0;
	snprintf(path, sizeof path, "%s/%s", dir, name);
	kv_buf_adds(acc, name);
	kv_buf_addc(acc, 0);
	if (kv_io_read_file(path, max, &buf, &len) == KV_OK) {
		struct kv_h128 h = kv_xxh3_128(buf, len, 0);
		kv_buf_add(acc, &h, sizeof h);
		free(buf);
	}
}

static int64_t ns_of(struct timespec t)
{
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void memo_path(const char *memo_dir, const struct stat *sb, char *out, size_t cap)
{
	snprintf(out, cap, "%s/%llx-%llx", memo_dir, (unsigned long long)sb->st_dev, (unsigned long long)sb->st_ino);
}

/* The memo's text for a file of this stat and content hash. */
static void memo_text(const struct stat *sb, struct kv_h128 h, char *out, size_t cap)
{
	char hex[33];
	kv_h128_hex(h, hex);
	snprintf(out, cap, MEMO_MAGIC " size=%lld mtime_ns=%" PRId64 " ctime_ns=%" PRId64 " xxh3=%s\n",
		 (long long)sb->st_size, ns_of(sb->st_mtim), ns_of(sb->st_ctim), hex);
}

/* 0 and *h when a memo for exactly this stat exists. */
static int memo_get(const char *memo_dir, const struct stat *sb, struct kv_h128 *h)
{
	char path[4096], want[256], *buf = NULL;
	size_t len = 0;
	int rc = -1;
	if (!memo_dir)
		return -1;
	memo_path(memo_dir, sb, path, sizeof path);
	if (kv_io_read_file(path, 4096, &buf, &len) != KV_OK)
		return -1;
	/* compare everything but the hash, then parse the hash */
	memo_text(sb, (struct kv_h128){0, 0}, want, sizeof want);
	size_t pre = strlen(want) - 33; /* up to "xxh3=" inclusive */
	if (len == strlen(want) && !memcmp(buf, want, pre) && buf[len - 1] == '\n') {
		buf[len - 1] = 0;
		rc = kv_h128_parse(buf + pre, h) ? -1 : 0;
	}
	free(buf);
	return rc;
}

static void memo_put(const char *memo_dir, const struct stat *sb, struct kv_h128 h)
{
	char path[4096], text[256];
	if (!memo_dir || kv_io_mkdirs(memo_dir, 0700))
		return;
	memo_path(memo_dir, sb, path, sizeof path);
	memo_text(sb, h, text, sizeof text);
	if (kv_durable_write(path, text, strlen(text), 0) != KV_OK)
		KV_DEBUG("fingerprint.memo", "path=%s err=\"%s\"", path, kv_errmsg());
}

/* XXH3-128 of every byte of a weight file, from the memo when its stat
 * matches. 0 on success. */
static int hash_weights(const char *path, const char *memo_dir, struct kv_h128 *out, struct ksv_fp_stats *st)
{
	struct stat sb, sb2;
	int fd = kv_io_open(path, O_RDONLY | O_CLOEXEC, 0);
	int rc = -1;
	if (fd < 0)
		return -1;
	if (kv_io_fstat(fd, &sb) || !S_ISREG(sb.st_mode))
		goto out;
	if (memo_get(memo_dir, &sb, out) == 0) {
		st->memo_hits++;
		rc = 0;
		goto out;
	}
	struct kv_xxh3_stream *x = kv_xxh3_stream_create();
	char *buf = malloc(READ_CHUNK);
	uint64_t off = 0, size = (uint64_t)sb.st_size;
	if (x && buf) {
		rc = 0;
		while (off < size) {
			size_t n = size - off < READ_CHUNK ? (size_t)(size - off) : READ_CHUNK;
			if (kv_io_pread_full(fd, buf, n, off, path) != KV_OK) {
				rc = -1;
				break;
			}
			kv_xxh3_stream_update(x, buf, n);
			off += n;
		}
		st->bytes_hashed += off;
		*out = kv_xxh3_stream_digest(x);
	}
	kv_xxh3_stream_free(x);
	free(buf);
	/* a file that changed while we read it is not memoised (its hash may
	 * mix two versions; the next start hashes it again) */
	if (rc == 0 && !kv_io_fstat(fd, &sb2) && sb2.st_size == sb.st_size && ns_of(sb2.st_mtim) == ns_of(sb.st_mtim) &&
	    ns_of(sb2.st_ctim) == ns_of(sb.st_ctim))
		memo_put(memo_dir, &sb, *out);
out:
	kv_io_close(fd);
	return rc;
}

/* File i of n of the GGUF set whose first file is `first`: split sets are
 * "<stem>-0000k-of-0000N.gguf" (gguf.h). KV_ERR_INVALID when the path does
 * not fit or k has more than the five digits of the name. */
static int gguf_file_path(const char *first, size_t i, size_t n, char *out, size_t cap)
{
	int rc = kv_path_fmt(out, cap, "%s", first);
	if (rc || n < 2)
		return rc;
	if (i + 1 > 99999)
		return kv_fail(KV_ERR_INVALID, "%s: file %zu of a split set has no five-digit name", first, i + 1);
	char *of = NULL;
	for (char *q = strstr(out, "-of-"); q; q = strstr(q + 1, "-of-"))
		of = q;
	if (of && of - out >= 5) {
		char d[8];
		if (snprintf(d, sizeof d, "%05zu", i + 1) != 5) /* five digits: checked above */
			return kv_fail(KV_ERR_INVALID, "%s: bad split file number", first);
		memcpy(of - 5, d, 5);
	}
	return KV_OK;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

struct kv_h128 ksv_model_fingerprint(const struct ksv_fp_params *p, struct ksv_fp_stats *stats)
{
	struct ksv_fp_stats st = {0};
	struct kv_buf acc = KV_BUF_INIT;
	const char *dir = p->model_dir;
	uint64_t t0 = kv_now_ns();
	kv_buf_printf(&acc, "kvkeep-ns-2|%s|%s|B=%d|", KE_NUMERICS_VERSION, p->kv_dtype, p->page_tokens);
	if (p->quant_act) /* absent for f32 numerics: their namespaces stay what they were */
		kv_buf_printf(&acc, "qa=%s|", p->quant_act);
	if (kv_gguf_is_model_path(dir)) {
		/* A GGUF's header holds the metadata (hyperparameters, tokenizer,
		 * template) and the tensor table with every tensor's type, so
		 * Q4_K_M and Q8_0 of one model never share cache entries; the
		 * files' content hash (memoised like safetensors files) covers
		 * every weight byte, so a re-quantisation or fine-tune with the
		 * same header does not either. */
		struct kv_gguf *g = NULL;
		kv_buf_adds(&acc, "gguf|");
		if (kv_gguf_open(dir, &g) == KV_OK) {
			for (size_t i = 0; i < kv_gguf_nfiles(g); i++) {
				const void *hp;
				size_t hn;
				if (kv_gguf_header(g, i, &hp, &hn) == KV_OK) {
					struct kv_h128 x = kv_xxh3_128(hp, hn, 0);
					kv_buf_add(&acc, &x, sizeof x);
				}
				char path[4096];
				struct kv_h128 h;
				int have_path = gguf_file_path(kv_gguf_path(g), i, kv_gguf_nfiles(g), path, sizeof path) == KV_OK;
				st.weight_files++;
				if (have_path && !p->skip_weights && hash_weights(path, p->memo_dir, &h, &st) == 0)
					kv_buf_add(&acc, &h, sizeof h);
			}
			kv_gguf_close(g);
		}
		goto done;
	}
	hash_file(&acc, dir, "config.json", 16u << 20);
	hash_file(&acc, dir, "tokenizer.json", 256u << 20);
	hash_file(&acc, dir, "tokenizer_config.json", 64u << 20);
	hash_file(&acc, dir, "chat_template.jinja", 16u << 20);
	hash_file(&acc, dir, "model.safetensors.index.json", 64u << 20);
	DIR *d = opendir(dir);
	if (d) {
		char *names[4096];
		size_t n = 0;
		struct dirent *e;
		while ((e = readdir(d)) && n < 4096) {
			size_t l = strlen(e->d_name);
			if (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors"))
				names[n++] = strdup(e->d_name);
		}
		closedir(d);
		qsort(names, n, sizeof *names, cmp_str);
		for (size_t i = 0; i < n; i++) {
			char path[4096];
			struct kv_h128 h;
			if (!names[i])
				continue;
			snprintf(path, sizeof path, "%s/%s", dir, names[i]);
			st.weight_files++;
			kv_buf_adds(&acc, names[i]);
			kv_buf_addc(&acc, 0);
			if (!p->skip_weights && hash_weights(path, p->memo_dir, &h, &st) == 0)
				kv_buf_add(&acc, &h, sizeof h);
			free(names[i]);
		}
	}
done:;
	struct kv_h128 h = kv_xxh3_128(acc.p ? acc.p : "", acc.len, 0);
	kv_buf_free(&acc);
	st.seconds = (double)(kv_now_ns() - t0) / 1e9;
	KV_INFO("serve.fingerprint", "weight_files=%u memo_hits=%u hashed_mb=%.1f ms=%.1f", st.weight_files, st.memo_hits,
		(double)st.bytes_hashed / (1 << 20), st.seconds * 1e3);
	if (stats)
		*stats = st;
	return h;
}
