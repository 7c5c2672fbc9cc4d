/*
 * cmd_bench_restart.c - `kvkeep bench restart`: what a restart costs with
 * the disk tier, measured in one process with the server's own engine,
 * cache (session/run.h) and store (store/store.h).
 *
 *   kvkeep bench restart [--model DIR] [--trace FILE] [--system-tokens N]
 *                        [--tools N] [--cache-dir DIR] [--kv-dtype T] [--json]
 *
 * Steps (an agent session from `kvkeep bench mktrace`, or --trace: the
 * first two request bodies are turn 1 and turn 2):
 *   1. cold turn 1: empty cache, prefill the whole prompt, first token
 *      -> cold_ttft_s (its logits kept in a file);
 *   2. shutdown flush of everything turn 1 stored -> flush bandwidth
 *      (its writes; the 16 MiB probe is reported apart), and the same
 *      number of bytes written to one file with one fsync ->
 *      flush_bw_ratio = flush / one-file;
 *   3. the restart: the page cache of every file dropped (posix_fadvise
 *      DONTNEED), then a new process (`--phase replay`, so no memory of
 *      the first one is reused) opens a cache and store on the folder and
 *      runs the startup scan;
 *   4. replay of turn 1: disk lookup + load, resume, prefill the rest,
 *      first token -> replay_ttft_s, the restore bytes and time (restore
 *      bandwidth), and whether the logits equal the cold run's bit for bit;
 *   5. the files that restore read, page cache dropped again, read in
 *      order with plain read() into one buffer -> sequential bandwidth;
 *      restore_bw_ratio = restore / sequential; restore_vs_bound = restore
 *      time / (bytes / sequential bandwidth) (the restore target: at most 1.25).
 *      The same read into fresh memory is reported too: on virtual
 *      machines where page faults are costly it shows how much of the gap
 *      is the memory, not the disk;
 *   6. a live turn 2 on the restored session: the disk check, lookup and
 *      restore overhead in ms (the restore target: under 5 ms).
 * With --json the summary is one JSON object on stdout (restore_bw_ratio,
 * flush_bw_ratio, replay_ttft_s, cold_ttft_s and the rest), the table goes
 * to stderr. Numbers are wall-clock on this machine: run it on an idle
 * one. It is a benchmark, not a test: nothing here asserts a time.
 *
 * Exit status: 0 done, 1 it could not run, 2 bad flags.
 */
#include "cli/cli.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/durable.h"
#include "base/env.h"
#include "base/err.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/json.h"
#include "base/log.h"
#include "base/mem.h"
#include "cache/cache.h"
#include "cache/names.h"
#include "cache/storage_policy.h"
#include "session/run.h"
#include "engine/model.h"
#include "text/template.h"
#include "text/tokenizer.h"
#include "store/dir.h"
#include "store/ns.h"
#include "store/obj.h"
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

struct turn {
	int32_t *tok;
	uint32_t n;
	uint32_t *bounds;
	size_t n_bounds;
};

static void turn_free(struct turn *t)
{
	free(t->tok);
	free(t->bounds);
}

/* Run `kvkeep bench mktrace` (this very binary) into path. */
static int make_trace(const char *path, int64_t sys_tokens, int64_t tools)
{
	char st[32], tl[32];
	snprintf(st, sizeof st, "%lld", (long long)sys_tokens);
	snprintf(tl, sizeof tl, "%lld", (long long)tools);
	pid_t pid = fork();
	if (pid < 0)
		return kv_fail(KV_ERR_IO, "fork: %s", strerror(errno));
	if (pid == 0) {
		execl("/proc/self/exe", "kvkeep", "bench", "mktrace", "--turns", "2", "--system-tokens", st, "--tools", tl,
		      "--out", path, "--quiet", (char *)NULL);
		_exit(127);
	}
	int status;
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
		return kv_fail(KV_ERR_IO, "kvkeep bench mktrace failed");
	return KV_OK;
}

/* Render request body line `k` (0-based) of a JSONL trace. */
static int render(const struct kv_chat *chat, const char *text, size_t len, int k, struct turn *out)
{
	const char *p = text, *end = text + len;
	memset(out, 0, sizeof *out);
	for (int i = 0; i < k && p < end; i++) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		p = nl ? nl + 1 : end;
	}
	const char *nl = memchr(p, '\n', (size_t)(end - p));
	size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
	if (!n)
		return kv_fail(KV_ERR_INVALID, "trace has no request %d", k + 1);
	json_t *body;
	int rc = kv_json_parse("trace line", p, n, KV_JSON_MAX_DEPTH, &body);
	if (rc)
		return rc;
	/* content null (an assistant message that only calls tools) becomes
	 * "", as OpenAI-compatible servers do: the real Qwen3 template tests
	 * `'</think>' in message.content`, which fails on None */
	size_t mi;
	json_t *msg;
	json_array_foreach(json_object_get(body, "messages"), mi, msg)
		if (json_is_object(msg) && json_is_null(json_object_get(msg, "content")))
			json_object_set_new(msg, "content", json_string(""));
	struct kv_chat_opts o = {.add_generation_prompt = 1, .enable_thinking = -1};
	struct kv_chat_render r;
	rc = kv_chat_render(chat, json_object_get(body, "messages"), json_object_get(body, "tools"), &o, &r);
	json_decref(body);
	if (rc)
		return rc;
	out->n = (uint32_t)r.n_tokens;
	out->tok = malloc((r.n_tokens + 1) * sizeof *out->tok);
	out->bounds = malloc((r.n_boundaries + 1) * sizeof *out->bounds);
	if (!out->tok || !out->bounds) {
		kv_chat_render_free(&r);
		turn_free(out);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	memcpy(out->tok, r.tokens, r.n_tokens * sizeof *out->tok);
	for (size_t i = 0; i < r.n_boundaries; i++)
		if (r.boundaries[i] > 0 && (uint32_t)r.boundaries[i] < out->n)
			out->bounds[out->n_bounds++] = (uint32_t)r.boundaries[i];
	kv_chat_render_free(&r);
	return KV_OK;
}

struct rig {
	struct ke_model *m;
	const struct ke_layout *L;
	struct kc_cache *c;
	struct ks_store *s;
	struct kv_h128 ns;
	char root[4096];
};

static int rig_open(struct rig *g)
{
	struct kc_policy pol;
	kc_policy_default(&pol, ke_layout_nontrim(g->L));
	kc_policy_from_env(&pol);
	struct kc_params cp = {.layout = g->L, .ns = g->ns, .policy = &pol};
	int rc = kc_cache_create(&cp, &g->c);
	if (rc)
		return rc;
	struct ks_params sp = {.root = g->root,
			       .ns = g->ns,
			       .label = "bench-restart",
			       .layout = g->L,
			       .cache = g->c,
			       .pages = ke_model_pages(g->m),
			       .stride = pol.stride,
			       .no_threads = 1};
	return ks_store_open(&sp, &g->s);
}

static void rig_close(struct rig *g)
{
	ks_store_close(g->s);
	kc_cache_destroy(g->c);
	g->s = NULL;
	g->c = NULL;
}

struct file_list {
	char (*path)[4096];
	size_t n;
};

static void fl_add(struct file_list *f, const char *p)
{
	struct stat sb;
	if (stat(p, &sb) != 0)
		return;
	void *np = realloc(f->path, (f->n + 1) * sizeof *f->path);
	if (!np)
		return;
	f->path = np;
	snprintf(f->path[f->n++], sizeof f->path[0], "%s", p);
}

/* The files a restore at `pos` (anchor `anchor`) of tok reads: the same
 * names fetch.c derives. */
static void restore_files(const struct rig *g, const int32_t *tok, uint32_t pos, uint32_t anchor,
			  struct file_list *fl)
{
	uint32_t B = (uint32_t)g->L->page_tokens;
	char base[2][4096], p[4096];
	if (ks_dir_ns_path(g->root, g->ns, KS_AREA_MAIN, base[0], sizeof base[0]) ||
	    ks_dir_ns_path(g->root, g->ns, KS_AREA_CKPT, base[1], sizeof base[1]))
		return; /* the store could not have opened there either */
	struct kv_h128 *h = malloc(((size_t)pos / B + 1) * sizeof *h);
	if (!h)
		return;
	h[0] = g->ns;
	for (uint32_t k = 1; k <= pos / B; k++) {
		h[k] = kc_chain_hash(h[k - 1], tok + (size_t)(k - 1) * B, B);
		if (ks_dir_obj_path(base[0], KS_BLOCK, h[k], p, sizeof p) == KV_OK)
			fl_add(fl, p);
	}
	struct kv_h128 id = kc_rp_id(h[pos / B], tok + (size_t)(pos / B) * B, pos % B);
	for (int a = 0; a < 2; a++) {
		if (pos % B) {
			if (ks_dir_obj_path(base[a], KS_TAIL, id, p, sizeof p) == KV_OK)
				fl_add(fl, p);
		}
		if (ke_layout_nontrim(g->L)) {
			if (ks_dir_obj_path(base[a], KS_SNAP, id, p, sizeof p) == KV_OK)
				fl_add(fl, p);
			/* the manifest is read when the snapshot is not itself the anchor */
			if (anchor != pos) {
				if (ks_dir_obj_path(base[a], KS_ENTRY, id, p, sizeof p) == KV_OK)
					fl_add(fl, p);
			}
		}
		if (anchor && anchor < pos) {
			struct kv_h128 aid = kc_rp_id(h[anchor / B], tok + (size_t)(anchor / B) * B, anchor % B);
			if (ks_dir_obj_path(base[a], KS_SNAP, aid, p, sizeof p) == KV_OK)
				fl_add(fl, p);
		}
	}
	free(h);
}

static int drop_fn(void *ctx, const char *path, const char *name, uint64_t size, int64_t mtime)
{
	(void)ctx;
	(void)name;
	(void)size;
	(void)mtime;
	ks_obj_drop_cache(path);
	return 0;
}

/* Read the files in order with plain read(); bytes/s. */
static double seq_read_bps(const struct file_list *fl, uint64_t *bytes)
{
	size_t cap = 4u << 20;
	char *buf = malloc(cap);
	uint64_t t0, total = 0;
	if (!buf)
		return 0;
	for (size_t i = 0; i < fl->n; i++)
		ks_obj_drop_cache(fl->path[i]);
	t0 = kv_now_ns();
	for (size_t i = 0; i < fl->n; i++) {
		int fd = open(fl->path[i], O_RDONLY | O_CLOEXEC);
		ssize_t r;
		if (fd < 0)
			continue;
		while ((r = read(fd, buf, cap)) > 0)
			total += (uint64_t)r;
		close(fd);
	}
	double dt = (double)(kv_now_ns() - t0) / 1e9;
	free(buf);
	*bytes = total;
	return dt > 0 ? (double)total / dt : 0;
}

/* Write n bytes to one file with one fsync at the end; bytes/s. */
static double one_fsync_bps(const char *dir, uint64_t n)
{
	char path[4200];
	size_t cap = 4u << 20;
	char *buf = calloc(1, cap);
	snprintf(path, sizeof path, "%s/one-fsync.bench", dir);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || !buf) {
		free(buf);
		if (fd >= 0)
			close(fd);
		return 0;
	}
	for (size_t i = 0; i < cap; i++)
		buf[i] = (char)(i * 131);
	uint64_t t0 = kv_now_ns(), left = n;
	while (left) {
		size_t k = left < cap ? (size_t)left : cap;
		if (write(fd, buf, k) != (ssize_t)k)
			break;
		left -= k;
	}
	fsync(fd);
	double dt = (double)(kv_now_ns() - t0) / 1e9;
	close(fd);
	unlink(path);
	free(buf);
	return dt > 0 ? (double)(n - left) / dt : 0;
}

/* Read the files in order with plain read() into fresh memory (what a new
 * process restoring them would also pay for); bytes/s. */
static double seq_read_fresh_bps(const struct file_list *fl)
{
	uint64_t t0, total = 0;
	char **keep = calloc(fl->n + 1, sizeof *keep);
	if (!keep)
		return 0;
	for (size_t i = 0; i < fl->n; i++)
		ks_obj_drop_cache(fl->path[i]);
	t0 = kv_now_ns();
	for (size_t i = 0; i < fl->n; i++) {
		struct stat sb;
		int fd = open(fl->path[i], O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		if (fstat(fd, &sb) == 0 && sb.st_size > 0) {
			/* kept until the end: freed memory would come back already
			 * mapped and hide what a new process pays */
			char *buf = keep[i] = malloc((size_t)sb.st_size);
			ssize_t r;
			size_t off = 0;
			while (buf && off < (size_t)sb.st_size && (r = read(fd, buf + off, (size_t)sb.st_size - off)) > 0)
				off += (size_t)r;
			total += off;
		}
		close(fd);
	}
	double dt = (double)(kv_now_ns() - t0) / 1e9;
	for (size_t i = 0; i < fl->n; i++)
		free(keep[i]);
	free(keep);
	return dt > 0 ? (double)total / dt : 0;
}

static int write_floats(const char *path, const float *v, size_t n)
{
	return kv_durable_write(path, v, n * sizeof *v, KV_DW_NO_SYNC);
}

/* Load everything both phases need. */
static int load_all(const char *model_dir, const char *trace, int kv, int need_t2, struct kv_tok **tok,
		    struct kv_chat **chat, struct rig *g, struct turn *t1, struct turn *t2)
{
	char path[4200], *text = NULL, *cfg = NULL;
	size_t text_len = 0, cl = 0;
	int rc;
	if ((rc = kv_tok_load_model(model_dir, tok)) || (rc = kv_chat_load(model_dir, *tok, chat)))
		return kv_fail_ctx(rc, "%s (make the model with `make demo` or `kvkeep mkmodel`)", model_dir);
	struct ke_model_params mp = {.kv = kv};
	if ((rc = ke_model_load(model_dir, &mp, &g->m)))
		return rc;
	g->L = ke_model_layout(g->m);
	/* a namespace for this benchmark: the model's config, numerics and
	 * KV dtype */
	snprintf(path, sizeof path, "%s/config.json", model_dir);
	if ((rc = kv_io_read_file(path, 16u << 20, &cfg, &cl)))
		return rc;
	char salt[64];
	snprintf(salt, sizeof salt, "bench-restart|%s", ke_kv_name(kv));
	g->ns = ks_ns_derive(kv_xxh3_128_cat(KE_NUMERICS_VERSION, strlen(KE_NUMERICS_VERSION), cfg, cl), salt);
	free(cfg);
	if ((rc = kv_io_read_file(trace, 256u << 20, &text, &text_len)) == KV_OK &&
	    (rc = render(*chat, text, text_len, 0, t1)) == KV_OK && need_t2)
		rc = render(*chat, text, text_len, 1, t2);
	free(text);
	return rc ? kv_fail_ctx(rc, "%s", trace) : KV_OK;
}

/*
 * The replay phase runs in a new process (`--phase replay`), like a real
 * restart: nothing of the first process's memory (freed pages glibc would
 * hand back already mapped, the page pool's free list) helps it. It prints
 * its measurements as one JSON object.
 */
static int phase_replay(const char *model_dir, const char *trace, int kv, const char *root, const char *logits_path)
{
	struct rig g = {0};
	struct kv_tok *tok = NULL;
	struct kv_chat *chat = NULL;
	struct turn t1 = {0}, t2 = {0};
	float *cold = NULL, *warm = NULL;
	size_t cold_len = 0;
	int rc, ret = 1;

	if ((rc = load_all(model_dir, trace, kv, 1, &tok, &chat, &g, &t1, &t2)))
		goto fail;
	snprintf(g.root, sizeof g.root, "%s", root);
	int V = ke_model_config(g.m)->vocab;
	warm = malloc((size_t)V * sizeof *warm);
	if (!warm || (rc = kv_io_read_file(logits_path, 64u << 20, (char **)&cold, &cold_len)))
		goto fail;
	if ((rc = rig_open(&g)))
		goto fail;
	uint64_t t0 = kv_now_ns();
	ks_store_start_scan(g.s);
	double scan_s = (double)(kv_now_ns() - t0) / 1e9;

	/* replay of turn 1: disk lookup + load, then the normal run */
	struct ks_fetch fo;
	struct ks_req rq = {.tokens = t1.tok, .n = t1.n, .bounds = t1.bounds, .n_bounds = t1.n_bounds};
	t0 = kv_now_ns();
	if ((rc = ks_store_fetch(g.s, &rq, &fo)))
		goto fail;
	struct kss_run_params rp = {.prompt = t1.tok, .n = t1.n, .bounds = t1.bounds, .n_bounds = t1.n_bounds,
				   .max_new = 1, .logits = warm};
	struct kss_run_result rr;
	if ((rc = kss_run(g.c, g.m, &rp, &rr)))
		goto fail;
	double replay_ttft = (double)(kv_now_ns() - t0) / 1e9;
	int identical = cold_len == (size_t)V * sizeof *warm && !memcmp(cold, warm, cold_len);

	/* the same files, read in order: into one buffer, and into fresh memory */
	struct file_list fl = {0};
	uint64_t seq_bytes = 0;
	restore_files(&g, t1.tok, fo.pos, fo.anchor, &fl);
	double seq_bps = seq_read_bps(&fl, &seq_bytes);
	double fresh_bps = seq_read_fresh_bps(&fl);
	free(fl.path);

	/* a live turn 2 on the restored session */
	struct ks_fetch fo2;
	struct kc_hit h;
	kc_cache_peek(g.c, t2.tok, t2.n, &h);
	struct ks_req rq2 = {.tokens = t2.tok, .n = t2.n, .bounds = t2.bounds, .n_bounds = t2.n_bounds, .ram_pos = h.pos};
	kc_hit_release(g.c, &h);
	t0 = kv_now_ns();
	ks_store_fetch(g.s, &rq2, &fo2);
	double check_ms = (double)(kv_now_ns() - t0) / 1e6;
	struct kss_run_params rp2 = {.prompt = t2.tok, .n = t2.n, .bounds = t2.bounds, .n_bounds = t2.n_bounds,
				    .max_new = 1};
	struct kss_run_result rr3;
	t0 = kv_now_ns();
	if ((rc = kss_run(g.c, g.m, &rp2, &rr3)))
		goto fail;
	double t2_ttft = (double)(kv_now_ns() - t0) / 1e9 + check_ms / 1e3;

	json_t *j = json_object();
	double restore_bps = fo.seconds > 0 ? (double)fo.bytes / fo.seconds : 0;
	json_object_set_new(j, "scan_s", json_real(scan_s));
	json_object_set_new(j, "replay_ttft_s", json_real(replay_ttft));
	json_object_set_new(j, "replay_resumed_at", json_integer(rr.resumed));
	json_object_set_new(j, "replay_anchor", json_integer(fo.anchor));
	json_object_set_new(j, "replay_prefilled", json_integer(rr.prefilled));
	json_object_set_new(j, "identical_logits", json_boolean(identical));
	json_object_set_new(j, "restore_bytes", json_integer((json_int_t)fo.bytes));
	json_object_set_new(j, "restore_files", json_integer(fo.files));
	json_object_set_new(j, "restore_s", json_real(fo.seconds));
	json_object_set_new(j, "restore_bw_mbps", json_real(restore_bps / 1e6));
	json_object_set_new(j, "seq_read_bytes", json_integer((json_int_t)seq_bytes));
	json_object_set_new(j, "seq_read_bw_mbps", json_real(seq_bps / 1e6));
	json_object_set_new(j, "seq_read_fresh_bw_mbps", json_real(fresh_bps / 1e6));
	json_object_set_new(j, "restore_bw_ratio", json_real(seq_bps > 0 ? restore_bps / seq_bps : 0));
	json_object_set_new(j, "restore_vs_fresh_read", json_real(fresh_bps > 0 ? restore_bps / fresh_bps : 0));
	json_object_set_new(j, "restore_vs_bound", json_real(restore_bps > 0 ? seq_bps / restore_bps : 0));
	json_object_set_new(j, "turn2_prompt_tokens", json_integer(t2.n));
	json_object_set_new(j, "turn2_cached_tokens", json_integer(rr3.resumed));
	json_object_set_new(j, "turn2_ttft_s", json_real(t2_ttft));
	json_object_set_new(j, "live_disk_check_ms", json_real(check_ms));
	json_object_set_new(j, "live_lookup_ms", json_real(rr3.lookup_ms));
	json_object_set_new(j, "live_restore_ms", json_real(rr3.restore_ms));
	json_object_set_new(j, "live_overhead_ms", json_real(check_ms + rr3.lookup_ms + rr3.restore_ms));
	char *out = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
	printf("%s\n", out ? out : "{}");
	free(out);
	json_decref(j);
	ret = 0;
	goto out;
fail:
	fprintf(stderr, "kvkeep bench restart (replay phase): %s\n", kv_errmsg());
out:
	rig_close(&g);
	ke_model_destroy(g.m);
	if (chat)
		kv_chat_free(chat);
	kv_tok_free(tok);
	turn_free(&t1);
	turn_free(&t2);
	free(cold);
	free(warm);
	return ret;
}

/* Run the replay phase as a new process; its JSON into *out. */
static int spawn_replay(const char *model_dir, const char *trace, int kv, const char *root, const char *logits,
			json_t **out)
{
	int pfd[2];
	*out = NULL;
	if (pipe(pfd))
		return kv_fail(KV_ERR_IO, "pipe: %s", strerror(errno));
	pid_t pid = fork();
	if (pid < 0)
		return kv_fail(KV_ERR_IO, "fork: %s", strerror(errno));
	if (pid == 0) {
		dup2(pfd[1], 1);
		close(pfd[0]);
		close(pfd[1]);
		execl("/proc/self/exe", "kvkeep", "bench", "restart", "--phase", "replay", "--model", model_dir, "--trace",
		      trace, "--cache-dir", root, "--logits", logits, "--kv-dtype", ke_kv_name(kv), (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	struct kv_buf b = KV_BUF_INIT;
	char tmp[4096];
	ssize_t r;
	while ((r = read(pfd[0], tmp, sizeof tmp)) > 0)
		kv_buf_add(&b, tmp, (size_t)r);
	close(pfd[0]);
	int status;
	waitpid(pid, &status, 0);
	int rc = KV_ERR_IO;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && b.p)
		rc = kv_json_parse("replay phase", b.p, b.len, KV_JSON_MAX_DEPTH, out);
	else
		kv_fail(KV_ERR_IO, "the replay phase failed");
	kv_buf_free(&b);
	return rc;
}

static double jnum(const json_t *j, const char *k)
{
	return json_number_value(json_object_get(j, k));
}

static int cmd_bench_restart(int argc, char **argv)
{
	const char *model_dir = "models/bench-hybrid", *trace = NULL, *cache_dir = NULL, *phase = NULL, *logits = NULL,
		   *kv_dtype = NULL;
	int64_t sys_tokens = 8000, tools = 30;
	int json = 0, rc;
	struct kv_flag flags[] = {
		{"model", KV_FLAG_STR, &model_dir, "DIR", "model folder (default models/bench-hybrid, made by `make demo`)"},
		{"trace", KV_FLAG_STR, &trace, "FILE", "JSONL trace: line 1 is turn 1, line 2 turn 2 (default: bench mktrace)"},
		{"system-tokens", KV_FLAG_INT, &sys_tokens, "N", "mktrace system prompt size (default 8000)"},
		{"tools", KV_FLAG_INT, &tools, "N", "mktrace tool count (default 30)"},
		{"cache-dir", KV_FLAG_STR, &cache_dir, "DIR", "cache folder to use (default: a new temp folder, removed)"},
		{"kv-dtype", KV_FLAG_STR, &kv_dtype, "bf16|f32|q8_0", "KV element type of the entries (default bf16)"},
		{"json", KV_FLAG_BOOL, &json, NULL, "one JSON object on stdout, the table on stderr"},
		{"phase", KV_FLAG_STR, &phase, "replay", "internal: run the replay phase (the restarted process)"},
		{"logits", KV_FLAG_STR, &logits, "FILE", "internal: the cold run's logits (replay phase)"},
		{0},
	};
	rc = kv_flags_parse("usage: kvkeep bench restart [--model DIR] [--trace FILE] [--json] [--cache-dir DIR]", flags,
			    argc, argv, NULL, 0, NULL);
	if (rc)
		return rc == 1 ? 0 : 2;
	if (!kv_env(KV_ENV_LOG))
		kv_log_set_level(KV_LOG_WARN);
	int kv = ke_kv_parse(kv_dtype);
	if (kv < 0) {
		fprintf(stderr, "kvkeep bench restart: --kv-dtype must be bf16, f32 or q8_0\n");
		return 2;
	}
	if (phase) {
		if (strcmp(phase, "replay") || !trace || !cache_dir || !logits) {
			fprintf(stderr, "kvkeep bench restart: --phase replay needs --trace, --cache-dir and --logits\n");
			return 2;
		}
		return phase_replay(model_dir, trace, kv, cache_dir, logits);
	}
	FILE *tbl = json ? stderr : stdout;

	struct rig g = {0};
	struct kv_tok *tok = NULL;
	struct kv_chat *chat = NULL;
	struct turn t1 = {0}, t2 = {0};
	char tmpdir[4096] = "", trace_path[4200], logits_path[4200];
	float *cold = NULL;
	json_t *rj = NULL;
	int ret = 1, made_dir = 0;

	const char *td = kv_env(KV_ENV_TMPDIR);
	snprintf(tmpdir, sizeof tmpdir, "%s/kvkeep-bench-restart.XXXXXX", td && *td ? td : "/tmp");
	if (!mkdtemp(tmpdir)) {
		fprintf(stderr, "kvkeep bench restart: mkdtemp: %s\n", strerror(errno));
		goto out;
	}
	made_dir = 1;
	if (!trace) {
		snprintf(trace_path, sizeof trace_path, "%s/trace.jsonl", tmpdir);
		if ((rc = make_trace(trace_path, sys_tokens, tools)))
			goto fail;
		trace = trace_path;
	}
	if ((rc = load_all(model_dir, trace, kv, 0, &tok, &chat, &g, &t1, &t2)))
		goto fail;
	size_t kv_token_bytes = g.L->kv_bytes_per_token; /* the model is gone before the report */
	snprintf(g.root, sizeof g.root, "%s", cache_dir ? cache_dir : tmpdir);
	int V = ke_model_config(g.m)->vocab;
	cold = malloc((size_t)V * sizeof *cold);
	if (!cold)
		goto out;

	/* 1. cold turn 1 */
	if ((rc = rig_open(&g)))
		goto fail;
	struct kss_run_params rp = {.prompt = t1.tok, .n = t1.n, .bounds = t1.bounds, .n_bounds = t1.n_bounds,
				   .max_new = 1, .logits = cold};
	struct kss_run_result rr;
	uint64_t t0 = kv_now_ns();
	if ((rc = kss_run(g.c, g.m, &rp, &rr)))
		goto fail;
	double cold_ttft = (double)(kv_now_ns() - t0) / 1e9;

	/* 2. the shutdown flush, and one file with one fsync */
	struct ks_flush_report fr;
	if ((rc = ks_store_flush(g.s, 600, &fr)))
		goto fail;
	double flush_bps = fr.write_seconds > 0 ? (double)fr.bytes_saved / fr.write_seconds : 0;
	double one_bps = one_fsync_bps(tmpdir, fr.bytes_saved);
	rig_close(&g);
	snprintf(logits_path, sizeof logits_path, "%s/cold.logits", tmpdir);
	if ((rc = write_floats(logits_path, cold, (size_t)V)))
		goto fail;
	ke_model_destroy(g.m);
	g.m = NULL;

	/* 3-6. the restart: a new process, every file's page cache dropped */
	char nsdir[4096];
	if ((rc = ks_dir_ns_path(g.root, g.ns, KS_AREA_MAIN, nsdir, sizeof nsdir)))
		goto fail;
	ks_dir_walk(nsdir, drop_fn, NULL);
	if ((rc = spawn_replay(model_dir, trace, kv, g.root, logits_path, &rj)))
		goto fail;

	json_t *j = json_object();
	json_object_set_new(j, "model", json_string(model_dir));
	json_object_set_new(j, "kv_dtype", json_string(ke_kv_name(kv)));
	json_object_set_new(j, "kv_bytes_per_token", json_integer((json_int_t)kv_token_bytes));
	json_object_set_new(j, "prompt_tokens", json_integer(t1.n));
	json_object_set_new(j, "boundaries", json_integer((json_int_t)t1.n_bounds));
	json_object_set_new(j, "first_boundary", json_integer(t1.n_bounds ? t1.bounds[0] : 0));
	json_object_set_new(j, "cold_ttft_s", json_real(cold_ttft));
	json_object_set_new(j, "flush_bytes", json_integer((json_int_t)fr.bytes_saved));
	json_object_set_new(j, "flush_s", json_real(fr.seconds));
	json_object_set_new(j, "flush_write_s", json_real(fr.write_seconds));
	json_object_set_new(j, "flush_probe_s", json_real(fr.probe_seconds));
	json_object_set_new(j, "flush_bw_mbps", json_real(flush_bps / 1e6));
	json_object_set_new(j, "one_fsync_bw_mbps", json_real(one_bps / 1e6));
	json_object_set_new(j, "flush_bw_ratio", json_real(one_bps > 0 ? flush_bps / one_bps : 0));
	json_object_update(j, rj);

	fprintf(tbl, "kvkeep bench restart: %s (%s KV, %zu bytes a token), turn 1 = %u tokens (%zu boundaries, first at %u)\n",
		model_dir, ke_kv_name(kv), kv_token_bytes, t1.n, t1.n_bounds, t1.n_bounds ? t1.bounds[0] : 0);
	fprintf(tbl, "  cold turn 1      ttft %8.3f s\n", cold_ttft);
	fprintf(tbl, "  shutdown flush   %.1f MB in %.3f s (probe %.3f s, writes %.3f s): %.1f MB/s; same bytes to one "
		     "file + one fsync %.1f MB/s; ratio %.2f\n",
		(double)fr.bytes_saved / 1e6, fr.seconds, fr.probe_seconds, fr.write_seconds, flush_bps / 1e6,
		one_bps / 1e6, one_bps > 0 ? flush_bps / one_bps : 0);
	fprintf(tbl, "  restart          new process, page cache dropped; startup scan %.3f s\n", jnum(j, "scan_s"));
	fprintf(tbl, "  replay turn 1    ttft %8.3f s  resumed at %lld (anchor %lld), prefilled %lld, logits %s\n",
		jnum(j, "replay_ttft_s"), (long long)json_integer_value(json_object_get(j, "replay_resumed_at")),
		(long long)json_integer_value(json_object_get(j, "replay_anchor")),
		(long long)json_integer_value(json_object_get(j, "replay_prefilled")),
		json_is_true(json_object_get(j, "identical_logits")) ? "bit-identical to the cold run" : "DIFFER");
	fprintf(tbl, "  restore          %.1f MB, %lld files in %.4f s: %.1f MB/s; the same files read in order: %.1f "
		     "MB/s (into fresh memory: %.1f MB/s, ratio %.2f); ratio %.2f; restore time = %.2fx bytes/read-bw\n",
		jnum(j, "restore_bytes") / 1e6, (long long)json_integer_value(json_object_get(j, "restore_files")),
		jnum(j, "restore_s"), jnum(j, "restore_bw_mbps"), jnum(j, "seq_read_bw_mbps"),
		jnum(j, "seq_read_fresh_bw_mbps"), jnum(j, "restore_vs_fresh_read"), jnum(j, "restore_bw_ratio"),
		jnum(j, "restore_vs_bound"));
	fprintf(tbl, "  live turn 2      %lld tokens, %lld cached; disk check %.3f + lookup %.3f + restore %.3f = %.3f ms; "
		     "ttft %.3f s\n",
		(long long)json_integer_value(json_object_get(j, "turn2_prompt_tokens")),
		(long long)json_integer_value(json_object_get(j, "turn2_cached_tokens")), jnum(j, "live_disk_check_ms"),
		jnum(j, "live_lookup_ms"), jnum(j, "live_restore_ms"), jnum(j, "live_overhead_ms"),
		jnum(j, "turn2_ttft_s"));
	if (json) {
		char *s = json_dumps(j, JSON_INDENT(1) | JSON_REAL_PRECISION(6));
		printf("%s\n", s ? s : "{}");
		free(s);
	}
	json_decref(j);
	ret = 0;
	goto out;
fail:
	fprintf(stderr, "kvkeep bench restart: %s\n", kv_errmsg());
out:
	json_decref(rj);
	rig_close(&g);
	ke_model_destroy(g.m);
	if (chat)
		kv_chat_free(chat);
	kv_tok_free(tok);
	turn_free(&t1);
	turn_free(&t2);
	free(cold);
	if (made_dir) {
		char cmd[4300];
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
		if (system(cmd) != 0)
			fprintf(stderr, "kvkeep bench restart: could not remove %s\n", tmpdir);
	}
	return ret;
}

KV_COMMAND(bench_restart, "bench restart", "restart cost with the disk tier: flush, restore, replay TTFT",
	   cmd_bench_restart);
