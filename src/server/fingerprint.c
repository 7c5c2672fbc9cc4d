/*
 * fingerprint.c - see fingerprint.h.
 */
#include "server/fingerprint.h"
#include "base/buf.h"
#include "base/err.h"
#include "base/io.h"
#include "engine/model.h"
#include "model/gguf.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The header (tensor table) of a safetensors file, hashed. */
static void hash_st_header(struct kv_buf *acc, const char *dir, const char *name)
{
	char path[4096];
	uint64_t n = 0;
	snprintf(path, sizeof path, "%s/%s", dir, name);
	int fd = kv_io_open(path, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return;
	if (kv_io_pread_full(fd, &n, 8, 0, path) == KV_OK && n <= (100u << 20)) {
		char *h = malloc(n ? n : 1);
		if (h && kv_io_pread_full(fd, h, n, 8, path) == KV_OK) {
			struct kv_h128 x = kv_xxh3_128(h, n, 0);
			kv_buf_adds(acc, name);
			kv_buf_add(acc, &x, sizeof x);
		}
		free(h);
	}
	kv_io_close(fd);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

struct kv_h128 ksv_model_fingerprint(const char *dir, const char *kv_dtype, int page_tokens)
{
	struct kv_buf acc = KV_BUF_INIT;
	kv_buf_printf(&acc, "kvkeep-ns-1|%s|%s|B=%d|", KE_NUMERICS_VERSION, kv_dtype, page_tokens);
	if (kv_gguf_is_model_path(dir)) {
		/* A GGUF's header holds everything the namespace depends on: the
		 * metadata (hyperparameters, tokenizer, template) and the tensor
		 * table with every tensor's type, so Q4_K_M and Q8_0 of one model
		 * never share cache entries. */
		struct kv_gguf *g = NULL;
		kv_buf_adds(&acc, "gguf|");
		if (kv_gguf_open(dir, &g) == KV_OK) {
			for (size_t i = 0; i < kv_gguf_nfiles(g); i++) {
				const void *p;
				size_t n;
				if (kv_gguf_header(g, i, &p, &n) == KV_OK) {
					struct kv_h128 x = kv_xxh3_128(p, n, 0);
					kv_buf_add(&acc, &x, sizeof x);
				}
			}
			kv_gguf_close(g);
		}
		struct kv_h128 h = kv_xxh3_128(acc.p ? acc.p : "", acc.len, 0);
		kv_buf_free(&acc);
		return h;
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
			if (names[i])
				hash_st_header(&acc, dir, names[i]);
			free(names[i]);
		}
	}
	struct kv_h128 h = kv_xxh3_128(acc.p ? acc.p : "", acc.len, 0);
	kv_buf_free(&acc);
	return h;
}
