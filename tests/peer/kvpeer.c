/*
 * kvpeer.c - llama.cpp (release v0.5.0, the prebuilt libraries of the npm
 * package @node-llama-cpp/linux-x64 3.22.1) as an oracle and a yardstick
 * for kvkeep. A test tool, not part of kvkeep: it is built by `make peer`
 * (tests/peer/build.sh) against headers checked out of the release's source
 * bundle at build time, and links the package's shared libraries by rpath.
 *
 *   kvpeer info FILE.gguf
 *   kvpeer logits FILE.gguf --tokens 1,2,3|--tokens-file F --out OUT.f32
 *   kvpeer tofloat TYPE IN OUT         (ggml type traits to_float)
 *   kvpeer fromfloat TYPE IN OUT       (ggml_quantize_chunk / from_float_ref)
 *   kvpeer quantize IN.gguf OUT.gguf FTYPE
 *   kvpeer tokenize FILE.gguf --text TEXT [--special] [--add-special]
 *   kvpeer bench FILE.gguf --prefill N --ctx C --decode D --threads T --reps R
 *
 * Results go to stdout as one JSON object (or to the --out / OUT file as raw
 * little-endian f32 / blocks); errors are one "kvpeer: ..." line on stderr
 * and exit status 1 (2 for a usage error). Input files are checked before
 * they reach ggml, whose own checks abort the process: a bad file is an
 * error exit, never a crash. llama.cpp's log is shown from warnings up
 * (KVPEER_VERBOSE=1: everything).
 *
 * The CPU backend is picked the way llama.cpp's tools do it: every
 * libggml-cpu-*.so variant in the package's folder is scored against this
 * CPU and the best one is loaded (ggml_backend_load_all_from_path).
 * KVPEER_CPU=haswell (a variant name) loads that one instead, to compare
 * instruction sets.
 */
#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <link.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#define MAX_FILE_BYTES ((size_t)1 << 34) /* raw block files: 16 GiB is plenty */

static int fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("kvpeer: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	return 1;
}

/* ---- llama.cpp's log: warnings and errors only, unless KVPEER_VERBOSE ---- */

static int g_verbose;
static enum ggml_log_level g_last_level = GGML_LOG_LEVEL_INFO;

static void log_cb(enum ggml_log_level level, const char *text, void *user)
{
	(void)user;
	if (level != GGML_LOG_LEVEL_CONT)
		g_last_level = level;
	if (g_verbose || g_last_level >= GGML_LOG_LEVEL_WARN)
		fputs(text, stderr);
}

/* ---- backends ---- */

static char g_libdir[PATH_MAX];
static char g_cpu_variant[128] = "?";

static int find_variant(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	(void)data;
	const char *p = info->dlpi_name ? strstr(info->dlpi_name, "libggml-cpu-") : NULL;
	if (p) {
		p += strlen("libggml-cpu-");
		size_t n = strcspn(p, ".");
		if (n >= sizeof g_cpu_variant)
			n = sizeof g_cpu_variant - 1;
		memcpy(g_cpu_variant, p, n);
		g_cpu_variant[n] = 0;
	}
	return 0;
}

/* the folder of libllama: the package's bins folder, where the CPU backend
 * variants lie beside it */
static int lib_dir(void)
{
	Dl_info di;
	if (!dladdr((void *)llama_backend_init, &di) || !di.dli_fname)
		return fail("cannot locate libllama (dladdr)");
	snprintf(g_libdir, sizeof g_libdir, "%s", di.dli_fname);
	char *slash = strrchr(g_libdir, '/');
	if (!slash)
		snprintf(g_libdir, sizeof g_libdir, ".");
	else
		*slash = 0;
	return 0;
}

static int backends_init(void)
{
	if (lib_dir())
		return 1;
	const char *want = getenv("KVPEER_CPU");
	if (want && *want) {
		char path[PATH_MAX + 64];
		snprintf(path, sizeof path, "%s/libggml-cpu-%s.so", g_libdir, want);
		if (!ggml_backend_load(path))
			return fail("KVPEER_CPU=%s: cannot load %s (not there, or this CPU lacks its instructions)", want,
				    path);
	} else {
		ggml_backend_load_all_from_path(g_libdir);
	}
	llama_backend_init();
	if (ggml_backend_dev_count() == 0)
		return fail("no ggml backend could be loaded from %s", g_libdir);
	dl_iterate_phdr(find_variant, NULL);
	return 0;
}

/* ---- small helpers ---- */

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

static int read_file(const char *path, void **out, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return fail("%s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
		fclose(f);
		return fail("%s: not a regular file", path);
	}
	if ((uint64_t)st.st_size > MAX_FILE_BYTES) {
		fclose(f);
		return fail("%s: too large (%lld bytes)", path, (long long)st.st_size);
	}
	size_t n = (size_t)st.st_size;
	void *buf = malloc(n ? n : 1);
	if (!buf) {
		fclose(f);
		return fail("%s: out of memory for %zu bytes", path, n);
	}
	if (n && fread(buf, 1, n, f) != n) {
		free(buf);
		fclose(f);
		return fail("%s: read error", path);
	}
	fclose(f);
	*out = buf;
	*len = n;
	return 0;
}

static int write_file(const char *path, const void *buf, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return fail("%s: %s", path, strerror(errno));
	int bad = n && fwrite(buf, 1, n, f) != n;
	bad |= fclose(f) != 0;
	return bad ? fail("%s: write error", path) : 0;
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return 1;
	*out = v;
	return 0;
}

/* the ggml type named as ggml_type_name prints it (q4_K, bf16, ...),
 * case-insensitive; -1 when unknown or removed */
static int type_by_name(const char *name)
{
	for (int t = 0; t < GGML_TYPE_COUNT; t++) {
		const struct ggml_type_traits *tr = ggml_get_type_traits((enum ggml_type)t);
		if (tr && tr->type_name && tr->blck_size > 0 && strcasecmp(tr->type_name, name) == 0)
			return t;
	}
	return -1;
}

static void list_types(void)
{
	fputs("kvpeer: known types:", stderr);
	for (int t = 0; t < GGML_TYPE_COUNT; t++) {
		const struct ggml_type_traits *tr = ggml_get_type_traits((enum ggml_type)t);
		if (tr && tr->type_name && tr->blck_size > 0)
			fprintf(stderr, " %s", tr->type_name);
	}
	fputc('\n', stderr);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long long peak_rss_bytes(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (long long)ru.ru_maxrss * 1024;
}

static long long rss_bytes(void)
{
	long long pages = 0, res = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (f) {
		if (fscanf(f, "%lld %lld", &pages, &res) != 2)
			res = 0;
		fclose(f);
	}
	return res * 4096;
}

/* a GGUF header check before llama.cpp sees the file, so that "not a GGUF"
 * is one clear line (the loader would say it too, at length) */
static struct gguf_context *open_gguf(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fail("%s: %s", path, strerror(errno));
		return NULL;
	}
	char magic[4] = {0};
	size_t got = fread(magic, 1, 4, f);
	fclose(f);
	if (got != 4 || memcmp(magic, "GGUF", 4) != 0) {
		fail("%s: not a GGUF file (bad magic)", path);
		return NULL;
	}
	struct gguf_init_params gp = {.no_alloc = true, .ctx = NULL};
	struct gguf_context *g = gguf_init_from_file(path, gp);
	if (!g)
		fail("%s: llama.cpp's GGUF reader rejects the file (see above)", path);
	return g;
}

static struct llama_model *load_model(const char *path, int vocab_only)
{
	struct gguf_context *g = open_gguf(path);
	if (!g)
		return NULL;
	gguf_free(g);
	struct llama_model_params mp = llama_model_default_params();
	mp.vocab_only = vocab_only != 0;
	mp.n_gpu_layers = 0;
	struct llama_model *m = llama_model_load_from_file(path, mp);
	if (!m)
		fail("%s: llama_model_load_from_file failed (see llama.cpp's message above)", path);
	return m;
}

static int kv_type(const char *name, enum ggml_type *out)
{
	int t = type_by_name(name);
	if (t != GGML_TYPE_F32 && t != GGML_TYPE_F16 && t != GGML_TYPE_BF16 && t != GGML_TYPE_Q8_0 &&
	    t != GGML_TYPE_Q4_0)
		return fail("--kv %s: use f32, f16, bf16, q8_0 or q4_0", name);
	*out = (enum ggml_type)t;
	return 0;
}

static int fa_type(const char *name, enum llama_flash_attn_type *out)
{
	if (!strcmp(name, "on"))
		*out = LLAMA_FLASH_ATTN_TYPE_ENABLED;
	else if (!strcmp(name, "off"))
		*out = LLAMA_FLASH_ATTN_TYPE_DISABLED;
	else if (!strcmp(name, "auto"))
		*out = LLAMA_FLASH_ATTN_TYPE_AUTO;
	else
		return fail("--fa %s: use on, off or auto", name);
	return 0;
}

/* ---- info ---- */

static int cmd_info(int argc, char **argv)
{
	if (argc != 1)
		return fail("usage: kvpeer info FILE.gguf"), 2;
	const char *path = argv[0];
	struct stat st;
	if (stat(path, &st))
		return fail("%s: %s", path, strerror(errno));
	struct gguf_context *g = open_gguf(path);
	if (!g)
		return 1;
	int64_t counts[GGML_TYPE_COUNT] = {0};
	int64_t nt = gguf_get_n_tensors(g);
	for (int64_t i = 0; i < nt; i++) {
		int t = gguf_get_tensor_type(g, i);
		if (t >= 0 && t < GGML_TYPE_COUNT)
			counts[t]++;
	}
	char arch[128] = "?";
	int64_t k = gguf_find_key(g, "general.architecture");
	if (k >= 0 && gguf_get_kv_type(g, k) == GGUF_TYPE_STRING)
		snprintf(arch, sizeof arch, "%s", gguf_get_val_str(g, k));
	uint32_t version = gguf_get_version(g);
	int64_t n_kv = gguf_get_n_kv(g);
	gguf_free(g);

	if (backends_init())
		return 1;
	struct llama_model *m = load_model(path, 0);
	if (!m)
		return 1;
	char desc[256];
	llama_model_desc(m, desc, sizeof desc);
	printf("{\"file\": ");
	json_str(stdout, path);
	printf(", \"file_bytes\": %lld, \"gguf_version\": %u, \"n_kv\": %" PRId64 ", \"n_tensors\": %" PRId64
	       ", \"architecture\": ",
	       (long long)st.st_size, version, n_kv, nt);
	json_str(stdout, arch);
	printf(", \"desc\": ");
	json_str(stdout, desc);
	printf(", \"n_layer\": %d, \"n_embd\": %d, \"n_head\": %d, \"n_head_kv\": %d, \"n_vocab\": %d, "
	       "\"n_ctx_train\": %d, \"n_params\": %" PRIu64 ", \"model_bytes\": %" PRIu64
	       ", \"recurrent\": %s, \"hybrid\": %s, \"cpu_backend\": ",
	       llama_model_n_layer(m), llama_model_n_embd(m), llama_model_n_head(m), llama_model_n_head_kv(m),
	       llama_vocab_n_tokens(llama_model_get_vocab(m)), llama_model_n_ctx_train(m), llama_model_n_params(m),
	       llama_model_size(m), llama_model_is_recurrent(m) ? "true" : "false",
	       llama_model_is_hybrid(m) ? "true" : "false");
	json_str(stdout, g_cpu_variant);
	printf(", \"tensor_types\": {");
	int first = 1;
	for (int t = 0; t < GGML_TYPE_COUNT; t++)
		if (counts[t]) {
			printf("%s\"%s\": %" PRId64, first ? "" : ", ", ggml_type_name((enum ggml_type)t), counts[t]);
			first = 0;
		}
	printf("}}\n");
	llama_model_free(m);
	return 0;
}

/* ---- logits ---- */

/* ids separated by commas and/or white space */
static int parse_ids(const char *s, int32_t **out, int *n)
{
	size_t cap = 64, len = 0;
	int32_t *v = malloc(cap * sizeof *v);
	if (!v)
		return fail("out of memory");
	const char *p = s;
	for (;;) {
		while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
			p++;
		if (!*p)
			break;
		char *end;
		errno = 0;
		long x = strtol(p, &end, 10);
		if (end == p || errno || x < 0 || x > INT32_MAX) {
			free(v);
			return fail("bad token id near \"%.20s\"", p);
		}
		if (len == cap) {
			if (cap > (size_t)1 << 26) {
				free(v);
				return fail("too many token ids");
			}
			cap *= 2;
			int32_t *nv = realloc(v, cap * sizeof *v);
			if (!nv) {
				free(v);
				return fail("out of memory");
			}
			v = nv;
		}
		v[len++] = (int32_t)x;
		p = end;
	}
	*out = v;
	*n = (int)len;
	return 0;
}

static struct llama_context *make_ctx(struct llama_model *m, uint32_t n_ctx, uint32_t n_batch, uint32_t n_ubatch,
				      int threads, enum ggml_type kv, enum llama_flash_attn_type fa)
{
	struct llama_context_params cp = llama_context_default_params();
	cp.n_ctx = n_ctx;
	cp.n_batch = n_batch;
	cp.n_ubatch = n_ubatch;
	cp.n_seq_max = 1;
	cp.n_threads = threads;
	cp.n_threads_batch = threads;
	cp.type_k = kv;
	cp.type_v = kv;
	cp.flash_attn_type = fa;
	cp.no_perf = true;
	struct llama_context *c = llama_init_from_model(m, cp);
	if (!c)
		fail("llama_init_from_model failed (see llama.cpp's message above)");
	return c;
}

static int cmd_logits(int argc, char **argv)
{
	const char *path = NULL, *toks = NULL, *tokfile = NULL, *out = NULL, *kvs = "f32", *fas = "off";
	long threads = 2, batch = 0;
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--tokens") && v)
			toks = v, i++;
		else if (!strcmp(a, "--tokens-file") && v)
			tokfile = v, i++;
		else if (!strcmp(a, "--out") && v)
			out = v, i++;
		else if (!strcmp(a, "--kv") && v)
			kvs = v, i++;
		else if (!strcmp(a, "--fa") && v)
			fas = v, i++;
		else if (!strcmp(a, "--threads") && v) {
			if (parse_long(v, 1, 512, &threads))
				return fail("--threads %s: 1..512", v), 2;
			i++;
		} else if (!strcmp(a, "--batch") && v) {
			if (parse_long(v, 1, 1 << 20, &batch))
				return fail("--batch %s: 1..1048576", v), 2;
			i++;
		} else if (a[0] != '-' && !path)
			path = a;
		else
			return fail("logits: unexpected argument %s", a), 2;
	}
	if (!path || !out || !toks == !tokfile)
		return fail("usage: kvpeer logits FILE.gguf --tokens 1,2,3|--tokens-file F --out OUT.f32 [--threads 2] "
			    "[--batch N] [--kv f32] [--fa off]"),
		       2;
	enum ggml_type kv;
	enum llama_flash_attn_type fa;
	if (kv_type(kvs, &kv) || fa_type(fas, &fa))
		return 2;
	int32_t *ids = NULL;
	int n = 0;
	if (tokfile) {
		void *buf;
		size_t len;
		if (read_file(tokfile, &buf, &len))
			return 1;
		char *s = realloc(buf, len + 1);
		if (!s) {
			free(buf);
			return fail("out of memory");
		}
		s[len] = 0;
		int rc = strlen(s) != len ? fail("%s: not a text file of token ids", tokfile) : parse_ids(s, &ids, &n);
		free(s);
		if (rc)
			return 1;
	} else if (parse_ids(toks, &ids, &n)) {
		return 1;
	}
	if (n == 0) {
		free(ids);
		return fail("no tokens");
	}
	if (backends_init()) {
		free(ids);
		return 1;
	}
	struct llama_model *m = load_model(path, 0);
	if (!m) {
		free(ids);
		return 1;
	}
	int V = llama_vocab_n_tokens(llama_model_get_vocab(m));
	int status = 1;
	float *logits = NULL;
	struct llama_context *c = NULL;
	for (int i = 0; i < n; i++)
		if (ids[i] >= V) {
			fail("token id %d at position %d is not below n_vocab %d", ids[i], i, V);
			goto done;
		}
	if (batch == 0 || batch > n)
		batch = n;
	c = make_ctx(m, (uint32_t)n, (uint32_t)batch, (uint32_t)batch, (int)threads, kv, fa);
	if (!c)
		goto done;
	logits = malloc((size_t)n * (size_t)V * sizeof *logits);
	if (!logits) {
		fail("out of memory for %d x %d logits", n, V);
		goto done;
	}
	struct llama_batch b = llama_batch_init((int32_t)batch, 0, 1);
	for (int off = 0; off < n; off += (int)batch) {
		int nb = n - off < batch ? n - off : (int)batch;
		b.n_tokens = nb;
		for (int i = 0; i < nb; i++) {
			b.token[i] = ids[off + i];
			b.pos[i] = off + i;
			b.n_seq_id[i] = 1;
			b.seq_id[i][0] = 0;
			b.logits[i] = 1;
		}
		int rc = llama_decode(c, b);
		if (rc) {
			llama_batch_free(b);
			fail("llama_decode failed with %d at position %d", rc, off);
			goto done;
		}
		for (int i = 0; i < nb; i++) {
			const float *row = llama_get_logits_ith(c, i);
			if (!row) {
				llama_batch_free(b);
				fail("no logits for position %d", off + i);
				goto done;
			}
			memcpy(logits + (size_t)(off + i) * V, row, (size_t)V * sizeof *row);
		}
	}
	llama_batch_free(b);
	if (write_file(out, logits, (size_t)n * V * sizeof *logits))
		goto done;
	printf("{\"n_tokens\": %d, \"n_vocab\": %d, \"out\": ", n, V);
	json_str(stdout, out);
	printf(", \"kv\": \"%s\", \"flash_attn\": \"%s\", \"batch\": %ld, \"threads\": %ld, \"cpu_backend\": ", kvs, fas,
	       batch, threads);
	json_str(stdout, g_cpu_variant);
	printf("}\n");
	status = 0;
done:
	free(logits);
	free(ids);
	if (c)
		llama_free(c);
	llama_model_free(m);
	return status;
}

/* ---- tofloat / fromfloat ---- */

static int cmd_tofloat(int argc, char **argv)
{
	if (argc != 3)
		return fail("usage: kvpeer tofloat TYPE IN OUT (TYPE as ggml names it: q4_0, q4_K, q6_K, bf16, ...)"), 2;
	int t = type_by_name(argv[0]);
	if (t < 0) {
		list_types();
		return fail("unknown type %s", argv[0]), 2;
	}
	const struct ggml_type_traits *tr = ggml_get_type_traits((enum ggml_type)t);
	if (!tr->to_float && t != GGML_TYPE_F32)
		return fail("type %s has no to_float in ggml", argv[0]);
	void *in;
	size_t len;
	if (read_file(argv[1], &in, &len))
		return 1;
	if (len % tr->type_size) {
		free(in);
		return fail("%s: %zu bytes is not a whole number of %s blocks (%zu bytes each)", argv[1], len, argv[0],
			    tr->type_size);
	}
	size_t n = len / tr->type_size * (size_t)tr->blck_size;
	float *outv = malloc(n ? n * sizeof *outv : 1);
	if (!outv) {
		free(in);
		return fail("out of memory");
	}
	if (t == GGML_TYPE_F32)
		memcpy(outv, in, len);
	else if (n)
		tr->to_float(in, outv, (int64_t)n);
	int rc = write_file(argv[2], outv, n * sizeof *outv);
	free(in);
	free(outv);
	if (!rc)
		printf("{\"type\": \"%s\", \"blocks\": %zu, \"values\": %zu}\n", tr->type_name, len / tr->type_size, n);
	return rc;
}

static int quantize_chunk_supports(int t)
{
	switch (t) {
	case GGML_TYPE_F32:
	case GGML_TYPE_F16:
	case GGML_TYPE_BF16:
	case GGML_TYPE_Q1_0:
	case GGML_TYPE_Q2_0:
	case GGML_TYPE_Q4_0:
	case GGML_TYPE_Q4_1:
	case GGML_TYPE_Q5_0:
	case GGML_TYPE_Q5_1:
	case GGML_TYPE_Q8_0:
	case GGML_TYPE_MXFP4:
	case GGML_TYPE_NVFP4:
	case GGML_TYPE_Q2_K:
	case GGML_TYPE_Q3_K:
	case GGML_TYPE_Q4_K:
	case GGML_TYPE_Q5_K:
	case GGML_TYPE_Q6_K:
	case GGML_TYPE_TQ1_0:
	case GGML_TYPE_TQ2_0:
	case GGML_TYPE_IQ2_XXS:
	case GGML_TYPE_IQ2_XS:
	case GGML_TYPE_IQ3_XXS:
	case GGML_TYPE_IQ3_S:
	case GGML_TYPE_IQ2_S:
	case GGML_TYPE_IQ1_S:
	case GGML_TYPE_IQ1_M:
	case GGML_TYPE_IQ4_NL:
	case GGML_TYPE_IQ4_XS:
		return 1;
	default:
		return 0;
	}
}

static int cmd_fromfloat(int argc, char **argv)
{
	const char *pos[3];
	int np = 0, ref = 0;
	long row = 0;
	const char *imf = NULL;
	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--ref"))
			ref = 1;
		else if (!strcmp(argv[i], "--row") && i + 1 < argc) {
			if (parse_long(argv[++i], 1, 1L << 30, &row))
				return fail("--row %s: 1..2^30", argv[i]), 2;
		} else if (!strcmp(argv[i], "--imatrix") && i + 1 < argc)
			imf = argv[++i];
		else if (argv[i][0] != '-' && np < 3)
			pos[np++] = argv[i];
		else
			return fail("fromfloat: unexpected argument %s", argv[i]), 2;
	}
	if (np != 3)
		return fail("usage: kvpeer fromfloat TYPE IN.f32 OUT [--row N] [--ref] [--imatrix W.f32]\n"
			    "  default: ggml_quantize_chunk (rows of N values, N = all by default);\n"
			    "  --ref: the type's from_float_ref, row by row"),
		       2;
	int t = type_by_name(pos[0]);
	if (t < 0) {
		list_types();
		return fail("unknown type %s", pos[0]), 2;
	}
	const struct ggml_type_traits *tr = ggml_get_type_traits((enum ggml_type)t);
	if (ref ? !tr->from_float_ref : !quantize_chunk_supports(t))
		return fail("type %s has no %s in ggml", pos[0], ref ? "from_float_ref" : "ggml_quantize_chunk");
	void *in = NULL, *im = NULL;
	size_t len, imlen = 0;
	if (read_file(pos[1], &in, &len))
		return 1;
	int status = 1;
	void *outb = NULL;
	if (len % 4) {
		fail("%s: %zu bytes is not a whole number of f32 values", pos[1], len);
		goto done;
	}
	size_t n = len / 4;
	if (row == 0)
		row = (long)n;
	if (n == 0 || n % (size_t)row) {
		fail("%s: %zu values is not a positive multiple of the row length %ld", pos[1], n, row);
		goto done;
	}
	if (row % tr->blck_size) {
		fail("row length %ld is not a multiple of the %s block size %" PRId64, row, pos[0], tr->blck_size);
		goto done;
	}
	if (imf) {
		if (read_file(imf, &im, &imlen))
			goto done;
		if (imlen != (size_t)row * 4) {
			fail("%s: an importance matrix has one f32 per row element (%ld), not %zu bytes", imf, row, imlen);
			goto done;
		}
	} else if (!ref && ggml_quantize_requires_imatrix((enum ggml_type)t)) {
		fail("type %s needs an importance matrix (--imatrix)", pos[0]);
		goto done;
	}
	size_t nrows = n / (size_t)row, rs = ggml_row_size((enum ggml_type)t, row);
	outb = malloc(rs * nrows);
	if (!outb) {
		fail("out of memory");
		goto done;
	}
	if (ref)
		for (size_t r = 0; r < nrows; r++)
			tr->from_float_ref((const float *)in + r * row, (char *)outb + r * rs, row);
	else
		ggml_quantize_chunk((enum ggml_type)t, in, outb, 0, (int64_t)nrows, row, im);
	if (write_file(pos[2], outb, rs * nrows))
		goto done;
	printf("{\"type\": \"%s\", \"values\": %zu, \"rows\": %zu, \"bytes\": %zu, \"method\": \"%s\"}\n", tr->type_name,
	       n, nrows, rs * nrows, ref ? "from_float_ref" : "ggml_quantize_chunk");
	status = 0;
done:
	free(in);
	free(im);
	free(outb);
	return status;
}

/* ---- quantize ---- */

static const struct {
	const char *name;
	enum llama_ftype ftype;
} g_ftypes[] = {
	{"F32", LLAMA_FTYPE_ALL_F32},		{"F16", LLAMA_FTYPE_MOSTLY_F16},
	{"BF16", LLAMA_FTYPE_MOSTLY_BF16},	{"Q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},
	{"Q4_1", LLAMA_FTYPE_MOSTLY_Q4_1},	{"Q5_0", LLAMA_FTYPE_MOSTLY_Q5_0},
	{"Q5_1", LLAMA_FTYPE_MOSTLY_Q5_1},	{"Q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},
	{"Q2_K", LLAMA_FTYPE_MOSTLY_Q2_K},	{"Q3_K_S", LLAMA_FTYPE_MOSTLY_Q3_K_S},
	{"Q3_K_M", LLAMA_FTYPE_MOSTLY_Q3_K_M},	{"Q3_K_L", LLAMA_FTYPE_MOSTLY_Q3_K_L},
	{"Q4_K_S", LLAMA_FTYPE_MOSTLY_Q4_K_S},	{"Q4_K_M", LLAMA_FTYPE_MOSTLY_Q4_K_M},
	{"Q5_K_S", LLAMA_FTYPE_MOSTLY_Q5_K_S},	{"Q5_K_M", LLAMA_FTYPE_MOSTLY_Q5_K_M},
	{"Q6_K", LLAMA_FTYPE_MOSTLY_Q6_K},	{"IQ4_NL", LLAMA_FTYPE_MOSTLY_IQ4_NL},
	{"IQ4_XS", LLAMA_FTYPE_MOSTLY_IQ4_XS}, {"TQ1_0", LLAMA_FTYPE_MOSTLY_TQ1_0},
	{"TQ2_0", LLAMA_FTYPE_MOSTLY_TQ2_0},
};

static int cmd_quantize(int argc, char **argv)
{
	const char *pos[3];
	int np = 0, pure = 0;
	long threads = 2;
	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--pure"))
			pure = 1;
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
			if (parse_long(argv[++i], 1, 512, &threads))
				return fail("--threads %s: 1..512", argv[i]), 2;
		} else if (argv[i][0] != '-' && np < 3)
			pos[np++] = argv[i];
		else
			return fail("quantize: unexpected argument %s", argv[i]), 2;
	}
	if (np != 3)
		return fail("usage: kvpeer quantize IN.gguf OUT.gguf FTYPE [--pure] [--threads N]"), 2;
	int f = -1;
	for (size_t i = 0; i < sizeof g_ftypes / sizeof g_ftypes[0]; i++)
		if (!strcasecmp(pos[2], g_ftypes[i].name))
			f = (int)i;
	if (f < 0) {
		fputs("kvpeer: ftypes:", stderr);
		for (size_t i = 0; i < sizeof g_ftypes / sizeof g_ftypes[0]; i++)
			fprintf(stderr, " %s", g_ftypes[i].name);
		fputc('\n', stderr);
		return fail("unknown ftype %s", pos[2]), 2;
	}
	struct gguf_context *g = open_gguf(pos[0]);
	if (!g)
		return 1;
	gguf_free(g);
	if (backends_init())
		return 1;
	struct llama_model_quantize_params qp = llama_model_quantize_default_params();
	qp.ftype = g_ftypes[f].ftype;
	qp.nthread = (int32_t)threads;
	qp.pure = pure != 0;
	double t0 = now_s();
	if (llama_model_quantize(pos[0], pos[1], &qp))
		return fail("llama_model_quantize %s -> %s (%s) failed (see llama.cpp's message above)", pos[0], pos[1],
			    g_ftypes[f].name);
	struct stat st;
	long long sz = stat(pos[1], &st) ? -1 : (long long)st.st_size;
	printf("{\"in\": ");
	json_str(stdout, pos[0]);
	printf(", \"out\": ");
	json_str(stdout, pos[1]);
	printf(", \"ftype\": \"%s\", \"pure\": %s, \"out_bytes\": %lld, \"seconds\": %.3f}\n", g_ftypes[f].name,
	       pure ? "true" : "false", sz, now_s() - t0);
	return 0;
}

/* ---- tokenize ---- */

static int cmd_tokenize(int argc, char **argv)
{
	const char *path = NULL, *text = NULL, *textfile = NULL;
	int special = 0, add_special = 0;
	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--text") && i + 1 < argc)
			text = argv[++i];
		else if (!strcmp(argv[i], "--text-file") && i + 1 < argc)
			textfile = argv[++i];
		else if (!strcmp(argv[i], "--special"))
			special = 1;
		else if (!strcmp(argv[i], "--add-special"))
			add_special = 1;
		else if (argv[i][0] != '-' && !path)
			path = argv[i];
		else
			return fail("tokenize: unexpected argument %s", argv[i]), 2;
	}
	if (!path || !text == !textfile)
		return fail("usage: kvpeer tokenize FILE.gguf --text TEXT|--text-file F [--special] [--add-special]\n"
			    "  --special: parse special tokens (<|im_start|> ...); --add-special: add BOS/EOS "
			    "if the model asks"),
		       2;
	void *buf = NULL;
	size_t len;
	if (textfile) {
		if (read_file(textfile, &buf, &len))
			return 1;
		if (len > INT32_MAX / 2) {
			free(buf);
			return fail("%s: too long", textfile);
		}
		text = buf;
	} else {
		len = strlen(text);
	}
	if (backends_init()) {
		free(buf);
		return 1;
	}
	struct llama_model *m = load_model(path, 1);
	if (!m) {
		free(buf);
		return 1;
	}
	const struct llama_vocab *v = llama_model_get_vocab(m);
	int32_t cap = (int32_t)len + 16;
	llama_token *ids = malloc((size_t)cap * sizeof *ids);
	int32_t n = ids ? llama_tokenize(v, text, (int32_t)len, ids, cap, add_special, special) : INT32_MIN;
	if (ids && n < 0 && n != INT32_MIN) {
		cap = -n;
		llama_token *ni = realloc(ids, (size_t)cap * sizeof *ids);
		ids = ni ? ni : ids;
		n = ni ? llama_tokenize(v, text, (int32_t)len, ids, cap, add_special, special) : INT32_MIN;
	}
	int status = 1;
	if (n < 0) {
		fail("llama_tokenize failed (%d)", n);
	} else {
		printf("{\"n\": %d, \"ids\": [", n);
		for (int32_t i = 0; i < n; i++)
			printf("%s%d", i ? "," : "", ids[i]);
		printf("]}\n");
		status = 0;
	}
	free(ids);
	free(buf);
	llama_model_free(m);
	return status;
}

/* ---- bench ---- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void print_stats(const char *name, int n, const double *v, int reps)
{
	double s[64];
	memcpy(s, v, (size_t)reps * sizeof *v);
	qsort(s, (size_t)reps, sizeof *s, cmp_double);
	double med = reps % 2 ? s[reps / 2] : 0.5 * (s[reps / 2 - 1] + s[reps / 2]);
	printf("\"%s\": {\"tokens\": %d, \"tok_s_median\": %.3f, \"tok_s_min\": %.3f, \"tok_s_max\": %.3f, \"runs\": [",
	       name, n, med, s[0], s[reps - 1]);
	for (int i = 0; i < reps; i++)
		printf("%s%.3f", i ? ", " : "", v[i]);
	printf("]}");
}

/* the prompt in n_batch chunks, as llama-bench does (only the last token
 * asks for logits) */
static int feed(struct llama_context *c, llama_token *tok, int n, int n_batch)
{
	for (int off = 0; off < n; off += n_batch) {
		int nb = n - off < n_batch ? n - off : n_batch;
		int rc = llama_decode(c, llama_batch_get_one(tok + off, nb));
		if (rc)
			return fail("llama_decode failed with %d at position %d", rc, off);
	}
	llama_synchronize(c);
	return 0;
}

static int cmd_bench(int argc, char **argv)
{
	const char *path = NULL, *kvs = NULL, *fas = NULL;
	long prefill = 512, ctxlen = 0, decode = 0, threads = 2, reps = 3, batch = 512, ubatch = 512;
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		long *dst = NULL, lo = 0, hi = 1 << 20;
		if (!strcmp(a, "--prefill"))
			dst = &prefill;
		else if (!strcmp(a, "--ctx"))
			dst = &ctxlen;
		else if (!strcmp(a, "--decode"))
			dst = &decode;
		else if (!strcmp(a, "--threads"))
			dst = &threads, lo = 1, hi = 512;
		else if (!strcmp(a, "--reps"))
			dst = &reps, lo = 1, hi = 64;
		else if (!strcmp(a, "--batch"))
			dst = &batch, lo = 1;
		else if (!strcmp(a, "--ubatch"))
			dst = &ubatch, lo = 1;
		if (dst) {
			if (!v || parse_long(v, lo, hi, dst))
				return fail("%s %s: %ld..%ld", a, v ? v : "(missing)", lo, hi), 2;
			i++;
		} else if (!strcmp(a, "--kv") && v)
			kvs = v, i++;
		else if (!strcmp(a, "--fa") && v)
			fas = v, i++;
		else if (a[0] != '-' && !path)
			path = a;
		else
			return fail("bench: unexpected argument %s", a), 2;
	}
	if (!path || (prefill == 0 && decode == 0))
		return fail("usage: kvpeer bench FILE.gguf [--prefill N] [--ctx C --decode D] [--threads 2] [--reps 3]\n"
			    "    [--batch 512] [--ubatch 512] [--kv f16] [--fa auto]\n"
			    "  prefill: tok/s of an N-token prompt fed in --batch chunks (0: skip);\n"
			    "  decode: tok/s of D single-token steps after an untimed C-token prefill (0: skip;\n"
			    "    with --ctx equal to --prefill the steps follow the timed prefill, as kvkeep bench engine);\n"
			    "  --kv / --fa default to llama.cpp's own defaults (f16 KV, flash attention auto)"),
		       2;
	if (ubatch > batch)
		ubatch = batch;
	struct llama_context_params dp = llama_context_default_params();
	enum ggml_type kv = dp.type_k;
	enum llama_flash_attn_type fa = dp.flash_attn_type;
	if ((kvs && kv_type(kvs, &kv)) || (fas && fa_type(fas, &fa)))
		return 2;
	if (backends_init())
		return 1;
	struct llama_model *m = load_model(path, 0);
	if (!m)
		return 1;
	long long rss_load = rss_bytes();
	int V = llama_vocab_n_tokens(llama_model_get_vocab(m));
	long need = prefill > ctxlen + decode ? prefill : ctxlen + decode;
	int status = 1;
	struct llama_context *c = make_ctx(m, (uint32_t)(need + 1), (uint32_t)batch, (uint32_t)ubatch, (int)threads, kv, fa);
	llama_token *tok = malloc((size_t)(need + 1) * sizeof *tok);
	double tp[64], td[64];
	if (!c || !tok)
		goto done;
	/* random tokens, as llama-bench uses */
	uint64_t seed = 7;
	for (long i = 0; i <= need; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		tok[i] = (llama_token)((seed >> 33) % (uint64_t)V);
	}
	llama_memory_t mem = llama_get_memory(c);
	/* warm-up: a short prompt and one step, untimed */
	if (feed(c, tok, need < 32 ? (int)need : 32, (int)batch) || feed(c, tok + need, 1, 1))
		goto done;
	for (int r = 0; r < reps; r++) {
		if (prefill) {
			llama_memory_clear(mem, true);
			double t0 = now_s();
			if (feed(c, tok, (int)prefill, (int)batch))
				goto done;
			tp[r] = (double)prefill / (now_s() - t0);
		}
		if (decode && !(prefill && ctxlen == prefill)) {
			llama_memory_clear(mem, true);
			if (ctxlen && feed(c, tok, (int)ctxlen, (int)batch))
				goto done;
		}
		if (decode) {
			double t0 = now_s();
			for (long k = 0; k < decode; k++)
				if (feed(c, tok + ctxlen + k, 1, 1))
					goto done;
			td[r] = (double)decode / (now_s() - t0);
		}
	}
	printf("{\"file\": ");
	json_str(stdout, path);
	printf(", \"llama_cpp\": \"v0.5.0\", \"cpu_backend\": ");
	json_str(stdout, g_cpu_variant);
	printf(", \"threads\": %ld, \"reps\": %ld, \"batch\": %ld, \"ubatch\": %ld, \"kv\": \"%s\", \"flash_attn\": \"%s\", "
	       "\"n_params\": %" PRIu64 ", \"model_bytes\": %" PRIu64 ",\n ",
	       threads, reps, batch, ubatch, ggml_type_name(kv), llama_flash_attn_type_name(fa), llama_model_n_params(m),
	       llama_model_size(m));
	if (prefill) {
		print_stats("prefill", (int)prefill, tp, (int)reps);
		printf(",\n ");
	}
	if (decode) {
		print_stats("decode", (int)decode, td, (int)reps);
		printf(", \"decode_context\": %ld,\n ", ctxlen);
	}
	printf("\"rss_after_load_bytes\": %lld, \"peak_rss_bytes\": %lld}\n", rss_load, peak_rss_bytes());
	status = 0;
done:
	free(tok);
	if (c)
		llama_free(c);
	llama_model_free(m);
	return status;
}

/* ---- main ---- */

int main(int argc, char **argv)
{
	const char *v = getenv("KVPEER_VERBOSE");
	g_verbose = v && *v && strcmp(v, "0");
	llama_log_set(log_cb, NULL);
	ggml_log_set(log_cb, NULL);
	const char *usage = "usage: kvpeer info|logits|tofloat|fromfloat|quantize|tokenize|bench ... (see tests/peer/README.md)";
	if (argc < 2)
		return fail("%s", usage), 2;
	const char *cmd = argv[1];
	argc -= 2;
	argv += 2;
	if (!strcmp(cmd, "info"))
		return cmd_info(argc, argv);
	if (!strcmp(cmd, "logits"))
		return cmd_logits(argc, argv);
	if (!strcmp(cmd, "tofloat"))
		return cmd_tofloat(argc, argv);
	if (!strcmp(cmd, "fromfloat"))
		return cmd_fromfloat(argc, argv);
	if (!strcmp(cmd, "quantize"))
		return cmd_quantize(argc, argv);
	if (!strcmp(cmd, "tokenize"))
		return cmd_tokenize(argc, argv);
	if (!strcmp(cmd, "bench"))
		return cmd_bench(argc, argv);
	if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
		puts(usage);
		return 0;
	}
	return fail("unknown command %s; %s", cmd, usage), 2;
}
