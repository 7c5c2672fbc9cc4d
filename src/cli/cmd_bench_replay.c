/*
 * cmd_bench_replay.c - `kvkeep bench replay`: replay recorded agent
 * sessions against a server and report cache reuse and latency.
 *
 *   kvkeep bench replay (--base-url URL | --spawn "kvkeep serve ARGS")
 *                       (--trace FILE.jsonl | --dir DIR) [--json] [--repeat N]
 *                       [--max-tokens N] [--restart-after K] [--compare-cold]
 *
 * Each recorded body is sent in order, streamed, with only stream,
 * stream_options.include_usage, temperature and the token cap changed
 * (and "model" with --model; client/replay.h says exactly how). Per request it records the HTTP
 * status, prompt / cached / generated tokens, time to first token and
 * total time; bad trace lines and rejected bodies are reported on their
 * row and the replay goes on.
 *
 * Spawn mode starts the server itself: the --spawn string is split like a
 * shell would split words (single and double quotes, backslash), a leading
 * "kvkeep" means this very binary, and "--port P" is appended with a free
 * loopback port. It waits for GET /health to answer 200, then reads GET
 * /v1/cache/info (kept in the report, so a reader can tell which cache
 * tiers the server has). With --restart-after K it sends SIGTERM after the
 * K-th request, waits for the process to exit, starts it again with the
 * same arguments and goes on; the rows after that show what survived.
 * With --compare-cold every request is sent once more to a server started
 * with --disable-prefix-cache added, and the speedup of each is reported.
 * The server's stdout and stderr go to our stderr, or to --server-log.
 *
 * Output: a table on stdout; with --json the table goes to stderr and
 * stdout carries JSON Lines instead: one {"type":"request"} object per
 * request (in order), one {"type":"restart"} object per restart, and a
 * final {"type":"summary"} object (docs/bench-replay.md lists the fields).
 *
 * Exit status: 0 when every request succeeded, 3 when the replay ran but
 * some lines were bad or requests failed, 1 when it could not run (trace
 * unreadable, server did not start), 2 for bad flags.
 */
#include "cli/cli.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/err.h"
#include "base/json.h"
#include "client/child.h"
#include "client/http_client.h"
#include "client/replay.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* --- the spawned server ---------------------------------------------------- */

static volatile pid_t g_child; /* for the signal handler */

static void on_signal(int sig)
{
	pid_t p = g_child;
	if (p > 0)
		kill(p, SIGTERM);
	_exit(128 + sig);
}

/* Split a command line into words: blanks separate, '...' is literal,
 * "..." allows \" and \\, a backslash outside quotes escapes one char.
 * Returns the word count or -1 (unterminated quote, no memory). */
static int split_words(const char *s, char ***out)
{
	char **v = NULL;
	int n = 0;
	struct kv_buf w = KV_BUF_INIT;
	*out = NULL;
	while (*s) {
		while (*s == ' ' || *s == '\t' || *s == '\n')
			s++;
		if (!*s)
			break;
		kv_buf_reset(&w);
		kv_buf_reserve(&w, 1);
		while (*s && *s != ' ' && *s != '\t' && *s != '\n') {
			if (*s == '\'') {
				const char *e = strchr(s + 1, '\'');
				if (!e)
					goto bad;
				kv_buf_add(&w, s + 1, (size_t)(e - s - 1));
				s = e + 1;
			} else if (*s == '"') {
				s++;
				while (*s && *s != '"') {
					if (*s == '\\' && (s[1] == '"' || s[1] == '\\'))
						s++;
					kv_buf_addc(&w, *s++);
				}
				if (*s != '"')
					goto bad;
				s++;
			} else if (*s == '\\' && s[1]) {
				kv_buf_addc(&w, s[1]);
				s += 2;
			} else {
				kv_buf_addc(&w, *s++);
			}
		}
		char **nv = realloc(v, (size_t)(n + 2) * sizeof *v);
		if (!nv || w.oom)
			goto bad;
		v = nv;
		v[n++] = strdup(w.p ? w.p : "");
		v[n] = NULL;
		if (!v[n - 1])
			goto bad;
	}
	kv_buf_free(&w);
	*out = v;
	return n;
bad:
	for (int i = 0; i < n; i++)
		free(v[i]);
	free(v);
	kv_buf_free(&w);
	return -1;
}

static void free_words(char **v)
{
	for (int i = 0; v && v[i]; i++)
		free(v[i]);
	free(v);
}

/*
 * The spawned server: the words of the --spawn command ("kvkeep" = this
 * binary), then `extra` (NULL: none); client/child.h adds --port.
 */
static int spawn_init(struct kcl_child *c, const char *cmd, const char *extra, const char *log_path,
		      double ready_timeout_s, double stop_timeout_s)
{
	char **w = NULL;
	int n = split_words(cmd, &w);
	if (n <= 0) {
		free_words(w);
		return kv_fail(KV_ERR_INVALID, "--spawn: cannot split '%s' into words (unbalanced quote?)", cmd);
	}
	char **v = realloc(w, (size_t)(n + 2) * sizeof *v);
	if (!v) {
		free_words(w);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	w = v;
	if (extra)
		w[n++] = strdup(extra);
	w[n] = NULL;
	int rc = kcl_child_init(c, w, n, 0);
	free_words(w);
	c->log_path = log_path;
	c->ready_timeout_s = ready_timeout_s;
	c->stop_timeout_s = stop_timeout_s;
	return rc;
}

/* Start it (and make it the one the signal handler stops). */
static int spawn_start(struct kcl_child *c, double *ready_s)
{
	int rc = kcl_child_start(c, ready_s);
	g_child = c->pid;
	return rc;
}

static int spawn_stop(struct kcl_child *c, double *stop_s, char *desc, size_t cap)
{
	int rc = kcl_child_stop(c, stop_s, desc, cap);
	g_child = 0;
	return rc;
}

/* GET url+path; 0 and *body (malloc'd) when 200. */
static int get_json(const char *url, const char *path, int timeout_ms, json_t **out)
{
	char full[300];
	char *b = NULL;
	size_t bl = 0;
	int status = 0;
	*out = NULL;
	snprintf(full, sizeof full, "%s%s", url, path);
	/* a server with keys: the admin key opens every route, the API key
	 * the admin routes on loopback (server/auth.h) */
	char hdr[1024] = "";
	const char *k = kv_env(KV_ENV_ADMIN_KEY);
	if (!k || !*k)
		k = kv_env(KV_ENV_API_KEY);
	if (k && *k && strlen(k) < 900 && !strpbrk(k, "\r\n"))
		snprintf(hdr, sizeof hdr, "Authorization: Bearer %s\r\n", k);
	int rc = kcl_http_fetch_h(full, "GET", NULL, 0, timeout_ms, *hdr ? hdr : NULL, &status, &b, &bl);
	if (rc == KV_OK && status == 200)
		rc = kv_json_parse(full, b, bl, KV_JSON_MAX_DEPTH, out);
	else if (rc == KV_OK)
		rc = kv_fail(KV_ERR_NOT_FOUND, "%s: HTTP %d", full, status);
	free(b);
	return rc;
}

/* --- rows and output -------------------------------------------------------- */

struct rp_row {
	size_t item;                  /* trace index */
	int pass;                     /* 1-based */
	int server_start;             /* which start of the server answered (1-based; 0: --base-url) */
	int first_after_restart;
	struct kcl_replay_result r;
	int have_cold;
	struct kcl_replay_result cold;
};

struct rp_out {
	FILE *table;   /* stdout, or stderr with --json */
	int json;
};

static const char *short_source(const char *s)
{
	const char *b = strrchr(s, '/');
	return b ? b + 1 : s;
}

static void fmt_ms(char *o, size_t cap, double s)
{
	if (s < 0 || isnan(s))
		snprintf(o, cap, "-");
	else
		snprintf(o, cap, "%.1f", s * 1000.0);
}

static void fmt_i(char *o, size_t cap, int64_t v)
{
	if (v < 0)
		snprintf(o, cap, "-");
	else
		snprintf(o, cap, "%lld", (long long)v);
}

static void table_head(const struct rp_out *o)
{
	fprintf(o->table, "%4s %4s  %-24s %6s %8s %8s %7s %10s %10s %5s  %s\n", "#", "pass", "source", "status", "prompt",
		"cached", "reuse", "ttft_ms", "total_ms", "gen", "note");
}

static void table_row(const struct rp_out *o, size_t n, const struct rp_row *w, const struct kcl_replay_item *it,
		      const char *tag)
{
	const struct kcl_replay_result *r = &w->r;
	char p[24], c[24], re[16], tt[24], to[24], g[24];
	fmt_i(p, sizeof p, r->prompt_tokens);
	fmt_i(c, sizeof c, r->cached_tokens);
	if (r->prompt_tokens > 0 && r->cached_tokens >= 0)
		snprintf(re, sizeof re, "%.1f%%", 100.0 * (double)r->cached_tokens / (double)r->prompt_tokens);
	else
		snprintf(re, sizeof re, "-");
	fmt_ms(tt, sizeof tt, r->ttft_s);
	fmt_ms(to, sizeof to, r->total_s);
	fmt_i(g, sizeof g, it->body ? r->generated_tokens : -1);
	char note[600];
	snprintf(note, sizeof note, "%s%s%s", tag ? tag : "", tag && r->error[0] ? "; " : "", r->error);
	fprintf(o->table, "%4zu %4d  %-24.24s %6d %8s %8s %7s %10s %10s %5s  %s\n", n, w->pass, short_source(it->source),
		r->status, p, c, re, tt, to, g, note);
	fflush(o->table);
}

static json_t *jnum_or_null(double v)
{
	return isnan(v) || isinf(v) ? json_null() : json_real(v);
}

static json_t *jms(double s)
{
	return s < 0 || isnan(s) ? json_null() : json_real(round(s * 1e6) / 1e3);
}

static json_t *jint(int64_t v)
{
	return v < 0 ? json_null() : json_integer(v);
}

static json_t *result_json(const struct kcl_replay_result *r)
{
	json_t *o = json_object();
	json_object_set_new(o, "ok", json_boolean(r->ok));
	json_object_set_new(o, "status", json_integer(r->status));
	json_object_set_new(o, "prompt_tokens", jint(r->prompt_tokens));
	json_object_set_new(o, "cached_tokens", jint(r->cached_tokens));
	json_object_set_new(o, "reuse", r->prompt_tokens > 0 && r->cached_tokens >= 0
						  ? json_real((double)r->cached_tokens / (double)r->prompt_tokens)
						  : json_null());
	json_object_set_new(o, "generated_tokens", jint(r->generated_tokens));
	json_object_set_new(o, "ttft_ms", jms(r->ttft_s));
	json_object_set_new(o, "total_ms", jms(r->total_s));
	json_object_set_new(o, "error", r->error[0] ? json_string(r->error) : json_null());
	return o;
}

static void emit_json(json_t *o)
{
	char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10));
	if (s) {
		fputs(s, stdout);
		fputc('\n', stdout);
		free(s);
	}
	fflush(stdout);
	json_decref(o);
}

static json_t *summary_json(const struct kcl_replay_summary *s)
{
	json_t *o = json_object();
	json_object_set_new(o, "requests", json_integer((json_int_t)s->requests));
	json_object_set_new(o, "ok", json_integer((json_int_t)s->ok));
	json_object_set_new(o, "failed", json_integer((json_int_t)s->failed));
	json_object_set_new(o, "prompt_tokens", json_integer(s->prompt_tokens));
	json_object_set_new(o, "cached_tokens", json_integer(s->cached_tokens));
	json_object_set_new(o, "generated_tokens", json_integer(s->generated_tokens));
	json_object_set_new(o, "reuse_ratio", jnum_or_null(s->reuse_ratio));
	json_object_set_new(o, "ttft_p50_ms", jms(s->ttft_p50_s));
	json_object_set_new(o, "ttft_p90_ms", jms(s->ttft_p90_s));
	json_object_set_new(o, "total_p50_ms", jms(s->total_p50_s));
	json_object_set_new(o, "total_p90_ms", jms(s->total_p90_s));
	return o;
}

static void summary_line(FILE *f, const char *label, const struct kcl_replay_summary *s)
{
	char t50[24], t90[24], o50[24], o90[24];
	fmt_ms(t50, sizeof t50, s->ttft_p50_s);
	fmt_ms(t90, sizeof t90, s->ttft_p90_s);
	fmt_ms(o50, sizeof o50, s->total_p50_s);
	fmt_ms(o90, sizeof o90, s->total_p90_s);
	fprintf(f,
		"%s: %zu requests (%zu ok, %zu failed), prompt %lld, cached %lld, reuse %s%.1f%%, generated %lld, "
		"ttft p50 %s ms p90 %s ms, total p50 %s ms p90 %s ms\n",
		label, s->requests, s->ok, s->failed, (long long)s->prompt_tokens, (long long)s->cached_tokens,
		isnan(s->reuse_ratio) ? "n/a " : "", isnan(s->reuse_ratio) ? 0.0 : 100.0 * s->reuse_ratio,
		(long long)s->generated_tokens, t50, t90, o50, o90);
}

/* Send one item (or record why it cannot be sent). */
static void run_item(const struct kcl_url *u, const struct kcl_replay_item *it, int64_t max_tokens, const char *model,
		     int timeout_ms, struct kcl_replay_result *r)
{
	memset(r, 0, sizeof *r);
	r->prompt_tokens = r->cached_tokens = r->generated_tokens = -1;
	r->ttft_s = -1;
	r->total_s = -1; /* nothing was sent */
	if (!it->body) {
		snprintf(r->error, sizeof r->error, "bad trace line: %s", it->error);
		return;
	}
	char *body = NULL;
	size_t len = 0;
	if (kcl_replay_prepare(it->body, max_tokens, model, &body, &len)) {
		snprintf(r->error, sizeof r->error, "%s", kv_errmsg());
		return;
	}
	kcl_replay_send(u, body, len, timeout_ms, r);
	free(body);
}

/* --concurrency N: N threads take the next request of a pass, so N of
 * them are in flight together (an agent's subagents); rows are filled in
 * place and printed in trace order when the pass is over. */
struct pool {
	const struct kcl_url *u;
	const struct kcl_replay_trace *tr;
	struct rp_row *rows;          /* this pass's rows, tr->n of them */
	int64_t max_tokens;
	const char *model;
	int timeout_ms;
	atomic_size_t next;
};

static void *pool_main(void *arg)
{
	struct pool *p = arg;
	for (;;) {
		size_t i = atomic_fetch_add(&p->next, 1);
		if (i >= p->tr->n)
			break;
		run_item(p->u, &p->tr->items[i], p->max_tokens, p->model, p->timeout_ms, &p->rows[i].r);
	}
	return NULL;
}

/* --- the command ------------------------------------------------------------- */

struct rp_opts {
	const char *base_url, *trace_path, *dir, *spawn, *server_log, *model;
	int json, compare_cold;
	int64_t concurrency, repeat, max_tokens, restart_after, timeout_s, ready_timeout_s, stop_timeout_s;
};

/* One replay: the options, the trace, the server, and every row. */
struct replay {
	struct rp_opts o;
	struct kcl_replay_trace *tr;
	size_t bad_lines;
	struct rp_out out;
	struct kcl_child srv;
	struct kcl_url u;
	json_t *starts;            /* one object per server start (cache info) */
	json_t *restart_events;    /* one {"type":"restart"} object per restart */
	int fatal;                 /* 1: could not go on; 2: a bad --base-url */
	int restarts, server_start_no;
	int timeout_ms;
	size_t total, seq;         /* rows allocated (requests x passes), rows done */
	struct rp_row *rows;
	double t_run;
	int after_restart_pending;
	struct kcl_replay_summary sum, cold_sum;
	int have_cold;
	double *speed_ttft, *speed_total;
	size_t n_sp_ttft, n_sp_total;
};

/* Flags into o: 0 to run, 1 for --help (exit 0), 2 for a usage error
 * (already reported). */
static int parse_opts(int argc, char **argv, struct rp_opts *o)
{
	*o = (struct rp_opts){.concurrency = 1, .repeat = 1, .max_tokens = 16, .timeout_s = 600,
			      .ready_timeout_s = 300, .stop_timeout_s = 30};
	const struct kv_flag flags[] = {
		{"base-url", KV_FLAG_STR, &o->base_url, "URL", "server to replay against, e.g. http://127.0.0.1:8000/v1"},
		{"trace", KV_FLAG_STR, &o->trace_path, "FILE", "JSONL trace: one request body per line"},
		{"dir", KV_FLAG_STR, &o->dir, "DIR", "folder of *.json request bodies, replayed in name order"},
		{"json", KV_FLAG_BOOL, &o->json, NULL, "JSON Lines on stdout (requests, restarts, summary); table to stderr"},
		{"repeat", KV_FLAG_INT, &o->repeat, "N", "replay the whole trace N times (default 1)"},
		{"max-tokens", KV_FLAG_INT, &o->max_tokens, "N", "cap on generated tokens per request (default 16)"},
		{"model", KV_FLAG_STR, &o->model, "NAME", "send this as every body's \"model\" (default: as recorded)"},
		{"spawn", KV_FLAG_STR, &o->spawn, "CMD", "start this server command (\"kvkeep serve ARGS\"), --port is added"},
		{"restart-after", KV_FLAG_INT, &o->restart_after, "K",
		 "spawn mode: SIGTERM + restart after request K (0: never)"},
		{"compare-cold", KV_FLAG_BOOL, &o->compare_cold, NULL,
		 "spawn mode: resend every request to a --disable-prefix-cache server, report speedups"},
		{"server-log", KV_FLAG_STR, &o->server_log, "FILE",
		 "spawn mode: append the server's output here (default stderr)"},
		{"timeout", KV_FLAG_INT, &o->timeout_s, "S", "per-request time limit in seconds (default 600)"},
		{"concurrency", KV_FLAG_INT, &o->concurrency, "N",
		 "keep N requests in flight at once, in trace order (default 1: one after another)"},
		{"ready-timeout", KV_FLAG_INT, &o->ready_timeout_s, "S", "spawn mode: wait this long for /health (default 300)"},
		{"stop-timeout", KV_FLAG_INT, &o->stop_timeout_s, "S", "spawn mode: SIGKILL if SIGTERM takes longer (default 30)"},
		{0}};
	const char *usage = "usage: kvkeep bench replay (--base-url URL | --spawn \"kvkeep serve ARGS\")\n"
			    "                           (--trace FILE.jsonl | --dir DIR) [--json] [--repeat N]\n"
			    "                           [--max-tokens N] [--restart-after K] [--compare-cold]\n"
			    "                           [--concurrency N]\n\n"
			    "Replays recorded chat requests in order (streaming) and reports prompt, cached and\n"
			    "generated tokens, time to first token and total time per request, plus a summary.\n"
			    "Exit status: 0 all requests ok, 3 some failed or bad lines, 1 could not run, 2 usage.";
	int rc = kv_flags_parse(usage, flags, argc, argv, NULL, 0, NULL);
	if (rc)
		return rc == 1 ? 1 : 2;
	const char *why = NULL;
	if (o->concurrency < 1 || o->concurrency > 256)
		why = "--concurrency must be in [1, 256]";
	else if (o->concurrency > 1 && o->restart_after)
		why = "--restart-after needs --concurrency 1 (a restart falls between two requests)";
	else if (!!o->trace_path == !!o->dir)
		why = "give exactly one of --trace FILE and --dir DIR";
	else if (!!o->base_url == !!o->spawn)
		why = "give exactly one of --base-url URL and --spawn CMD";
	else if (o->repeat < 1 || o->repeat > 1000000)
		why = "--repeat must be at least 1";
	else if (o->max_tokens < 1)
		why = "--max-tokens must be at least 1";
	else if (o->restart_after < 0)
		why = "--restart-after must be >= 0";
	else if (o->restart_after && !o->spawn)
		why = "--restart-after needs --spawn (a server we did not start cannot be restarted)";
	else if (o->compare_cold && !o->spawn)
		why = "--compare-cold needs --spawn (it starts a server with --disable-prefix-cache)";
	else if (o->server_log && !o->spawn)
		why = "--server-log needs --spawn";
	else if (o->timeout_s < 1 || o->ready_timeout_s < 1 || o->stop_timeout_s < 1)
		why = "--timeout, --ready-timeout and --stop-timeout must be at least 1 second";
	if (why) {
		fprintf(stderr, "kvkeep bench replay: %s (see --help)\n", why);
		return 2;
	}
	return 0;
}

/* Start the server (spawn mode) or parse --base-url, and keep the
 * server's /v1/cache/info. 0, or sets r->fatal. */
static int start_server(struct replay *r)
{
	const struct rp_opts *o = &r->o;
	if (o->spawn) {
		double ready_s = 0;
		if (spawn_init(&r->srv, o->spawn, NULL, o->server_log, o->ready_timeout_s, o->stop_timeout_s) ||
		    spawn_start(&r->srv, &ready_s)) {
			fprintf(stderr, "kvkeep bench replay: %s\n", kv_errmsg());
			r->fatal = 1;
			return -1;
		}
		r->server_start_no = 1;
		fprintf(r->out.table, "server: %s ready on %s in %.2f s\n", r->srv.argv[0], r->srv.url, ready_s);
		json_t *ci = NULL;
		get_json(r->srv.url, "/v1/cache/info", 5000, &ci);
		json_array_append_new(r->starts, json_pack("{s:i, s:f, s:o}", "start", 1, "ready_s", ready_s, "cache_info",
							   ci ? ci : json_null()));
		char b[200];
		snprintf(b, sizeof b, "%s/v1", r->srv.url);
		kcl_url_parse(b, &r->u);
	} else {
		if (kcl_url_parse(o->base_url, &r->u)) {
			fprintf(stderr, "kvkeep bench replay: %s\n", kv_errmsg());
			r->fatal = 2;
			return -1;
		}
		char root[400];
		snprintf(root, sizeof root, "http://%s:%d", r->u.host, r->u.port);
		json_t *ci = NULL;
		get_json(root, "/v1/cache/info", 5000, &ci);
		json_array_append_new(r->starts, json_pack("{s:i, s:n, s:o}", "start", 0, "ready_s", "cache_info",
							   ci ? ci : json_null()));
	}
	return 0;
}

/* --concurrency N > 1: each pass keeps N requests in flight, in trace
 * order, and prints its rows once the pass is done. */
static void run_concurrent_passes(struct replay *r)
{
	const struct rp_opts *o = &r->o;
	const struct kcl_replay_trace *tr = r->tr;
	for (int64_t pass = 1; pass <= o->repeat && !r->fatal; pass++) {
		struct pool pl = {.u = &r->u, .tr = tr, .rows = r->rows + r->seq, .max_tokens = o->max_tokens,
				  .model = o->model, .timeout_ms = r->timeout_ms};
		pthread_t th[256];
		int n_th = 0;
		for (size_t i = 0; i < tr->n; i++) {
			r->rows[r->seq + i].item = i;
			r->rows[r->seq + i].pass = (int)pass;
			r->rows[r->seq + i].server_start = r->server_start_no;
		}
		double t_pass = kv_now_s();
		for (int k = 0; k < o->concurrency && (size_t)k < tr->n; k++)
			if (!pthread_create(&th[n_th], NULL, pool_main, &pl))
				n_th++;
		if (!n_th)
			pool_main(&pl);
		for (int k = 0; k < n_th; k++)
			pthread_join(th[k], NULL);
		double wall = kv_now_s() - t_pass;
		for (size_t i = 0; i < tr->n; i++) {
			r->seq++;
			table_row(&r->out, r->seq, &r->rows[r->seq - 1], &tr->items[i], NULL);
		}
		/* what concurrency is for: the pass's wall time (compare with
		 * --concurrency 1) */
		fprintf(r->out.table, "pass %lld: %zu requests, %lld at a time, in %.3f s\n", (long long)pass, tr->n,
			(long long)o->concurrency, wall);
	}
}

/* --restart-after: SIGTERM the server after request r->seq, wait for it,
 * start it again and note the restart. 0, or sets r->fatal. */
static int restart_server(struct replay *r)
{
	double stop_s = 0, ready_s = 0;
	char desc[64];
	int src = spawn_stop(&r->srv, &stop_s, desc, sizeof desc);
	fprintf(r->out.table, "---- restart after request %zu: SIGTERM, server %s after %.2f s%s%s\n", r->seq, desc,
		stop_s, src ? "; " : "", src ? kv_errmsg() : "");
	if (spawn_start(&r->srv, &ready_s)) {
		fprintf(stderr, "kvkeep bench replay: restart failed: %s\n", kv_errmsg());
		r->fatal = 1;
		return -1;
	}
	r->restarts++;
	r->server_start_no++;
	r->after_restart_pending = 1;
	fprintf(r->out.table, "---- server ready again in %.2f s\n", ready_s);
	json_t *ci = NULL;
	get_json(r->srv.url, "/v1/cache/info", 5000, &ci);
	json_array_append_new(r->starts, json_pack("{s:i, s:f, s:o}", "start", r->server_start_no, "ready_s", ready_s,
						   "cache_info", ci ? json_incref(ci) : json_null()));
	json_array_append_new(r->restart_events,
			      json_pack("{s:s, s:I, s:s, s:s, s:f, s:b, s:f, s:o}", "type", "restart", "after_request",
					(json_int_t)r->seq, "signal", "SIGTERM", "exit", desc, "stop_s", stop_s,
					"stop_timed_out", src != 0, "ready_s", ready_s, "cache_info",
					ci ? ci : json_null()));
	return 0;
}

/* --concurrency 1: one request after another, a row as each ends, and the
 * restart after request K. */
static void run_serial_passes(struct replay *r)
{
	const struct rp_opts *o = &r->o;
	const struct kcl_replay_trace *tr = r->tr;
	for (int64_t pass = 1; pass <= o->repeat && !r->fatal; pass++) {
		double t_pass1 = kv_now_s();
		for (size_t i = 0; i < tr->n && !r->fatal; i++) {
			struct rp_row *w = &r->rows[r->seq];
			w->item = i;
			w->pass = (int)pass;
			w->server_start = r->server_start_no;
			w->first_after_restart = r->after_restart_pending && tr->items[i].body;
			if (w->first_after_restart)
				r->after_restart_pending = 0;
			run_item(&r->u, &tr->items[i], o->max_tokens, o->model, r->timeout_ms, &w->r);
			r->seq++;
			table_row(&r->out, r->seq, w, &tr->items[i], w->first_after_restart ? "first after restart" : NULL);
			if (o->restart_after > 0 && (int64_t)r->seq == o->restart_after && r->seq < r->total &&
			    restart_server(r))
				break;
		}
		if (!r->fatal && !o->restart_after)
			fprintf(r->out.table, "pass %lld: %zu requests, 1 at a time, in %.3f s\n", (long long)pass, tr->n,
				kv_now_s() - t_pass1);
	}
}

/* --compare-cold: every request once more to a --disable-prefix-cache
 * server, set against the first pass's row of the same item. */
static void run_cold(struct replay *r)
{
	const struct rp_opts *o = &r->o;
	const struct kcl_replay_trace *tr = r->tr;
	struct rp_row *rows = r->rows;
	double stop_s = 0, ready_s = 0;
	char desc[64];
	spawn_stop(&r->srv, &stop_s, desc, sizeof desc);
	kcl_child_free(&r->srv);
	if (spawn_init(&r->srv, o->spawn, "--disable-prefix-cache", o->server_log, o->ready_timeout_s,
		       o->stop_timeout_s) ||
	    spawn_start(&r->srv, &ready_s)) {
		fprintf(stderr, "kvkeep bench replay: cold server: %s\n", kv_errmsg());
		r->fatal = 1;
		return;
	}
	char b[200];
	snprintf(b, sizeof b, "%s/v1", r->srv.url);
	kcl_url_parse(b, &r->u);
	fprintf(r->out.table, "\ncold server (--disable-prefix-cache) ready on %s in %.2f s\n", r->srv.url, ready_s);
	struct kcl_replay_result *cold = calloc(tr->n, sizeof *cold);
	r->speed_ttft = calloc(r->total, sizeof *r->speed_ttft);
	r->speed_total = calloc(r->total, sizeof *r->speed_total);
	if (!cold || !r->speed_ttft || !r->speed_total) {
		free(cold);
		fprintf(stderr, "kvkeep bench replay: out of memory\n");
		r->fatal = 1;
		return;
	}
	fprintf(r->out.table, "%4s  %-24s %6s %8s %8s %13s %13s %8s %14s %14s %8s  %s\n", "#", "source", "status",
		"prompt", "cached", "warm_ttft_ms", "cold_ttft_ms", "speedup", "warm_total_ms", "cold_total_ms", "speedup",
		"note");
	for (size_t i = 0; i < tr->n; i++) {
		run_item(&r->u, &tr->items[i], o->max_tokens, o->model, r->timeout_ms, &cold[i]);
		/* the first pass's row of this item is what the cold one is set against */
		const struct kcl_replay_result *wr = &rows[i].r;
		char wt[24], ct[24], wo[24], co[24], s1[24] = "-", s2[24] = "-", p[24], c[24];
		fmt_ms(wt, sizeof wt, wr->ttft_s);
		fmt_ms(ct, sizeof ct, cold[i].ttft_s);
		fmt_ms(wo, sizeof wo, wr->ok ? wr->total_s : -1);
		fmt_ms(co, sizeof co, cold[i].ok ? cold[i].total_s : -1);
		fmt_i(p, sizeof p, cold[i].prompt_tokens);
		fmt_i(c, sizeof c, cold[i].cached_tokens);
		if (wr->ok && cold[i].ok && wr->ttft_s > 0 && cold[i].ttft_s > 0)
			snprintf(s1, sizeof s1, "%.2fx", cold[i].ttft_s / wr->ttft_s);
		if (wr->ok && cold[i].ok && wr->total_s > 0)
			snprintf(s2, sizeof s2, "%.2fx", cold[i].total_s / wr->total_s);
		fprintf(r->out.table, "%4zu  %-24.24s %6d %8s %8s %13s %13s %8s %14s %14s %8s  %s\n", i + 1,
			short_source(tr->items[i].source), cold[i].status, p, c, wt, ct, s1, wo, co, s2, cold[i].error);
		fflush(r->out.table);
	}
	for (size_t k = 0; k < r->seq; k++) {
		const struct kcl_replay_result *cr = &cold[rows[k].item];
		rows[k].have_cold = 1;
		rows[k].cold = *cr;
		if (rows[k].r.ok && cr->ok && rows[k].r.ttft_s > 0 && cr->ttft_s > 0)
			r->speed_ttft[r->n_sp_ttft++] = cr->ttft_s / rows[k].r.ttft_s;
		if (rows[k].r.ok && cr->ok && rows[k].r.total_s > 0)
			r->speed_total[r->n_sp_total++] = cr->total_s / rows[k].r.total_s;
	}
	kcl_replay_summarize(cold, tr->n, &r->cold_sum);
	r->have_cold = 1;
	free(cold);
}

/* The summary lines under the table. */
static void print_summary(const struct replay *r)
{
	FILE *t = r->out.table;
	fputc('\n', t);
	summary_line(t, "summary", &r->sum);
	if (r->have_cold) {
		summary_line(t, "cold   ", &r->cold_sum);
		double m1 = kcl_replay_quantile(r->speed_ttft, r->n_sp_ttft, 0.5),
		       m2 = kcl_replay_quantile(r->speed_total, r->n_sp_total, 0.5);
		fprintf(t, "speedup over cold: ttft p50 %.2fx, total p50 %.2fx\n", isnan(m1) ? 0.0 : m1,
			isnan(m2) ? 0.0 : m2);
	}
	if (r->bad_lines)
		fprintf(t, "%zu bad trace item%s (reported on their rows)\n", r->bad_lines, r->bad_lines == 1 ? "" : "s");
}

/* --json: one request object per row (restart events right after the
 * request they follow), then the summary object. */
static void print_json(const struct replay *r)
{
	const struct rp_row *rows = r->rows;
	size_t ev = 0;
	for (size_t k = 0; k < r->seq; k++) {
		const struct rp_row *w = &rows[k];
		const struct kcl_replay_item *it = &r->tr->items[w->item];
		json_t *o = result_json(&w->r);
		json_t *head = json_pack("{s:s, s:I, s:i, s:I, s:s, s:i, s:b, s:b}", "type", "request", "n",
					 (json_int_t)(k + 1), "pass", w->pass, "index", (json_int_t)(w->item + 1), "source",
					 it->source, "server_start", w->server_start, "first_after_restart",
					 w->first_after_restart, "bad_line", it->body == NULL);
		json_object_update(head, o);
		json_decref(o);
		if (w->have_cold) {
			json_object_set_new(head, "cold", result_json(&w->cold));
			int ok = w->r.ok && w->cold.ok;
			json_object_set_new(head, "speedup_ttft",
					    ok && w->r.ttft_s > 0 && w->cold.ttft_s > 0 ? json_real(w->cold.ttft_s / w->r.ttft_s)
											 : json_null());
			json_object_set_new(head, "speedup_total",
					    ok && w->r.total_s > 0 ? json_real(w->cold.total_s / w->r.total_s) : json_null());
		}
		emit_json(head);
		/* restart events go right after the request they follow */
		while (ev < json_array_size(r->restart_events)) {
			json_t *e = json_array_get(r->restart_events, ev);
			if ((size_t)json_integer_value(json_object_get(e, "after_request")) != k + 1)
				break;
			emit_json(json_incref(e));
			ev++;
		}
	}
	json_t *s = json_pack("{s:s}", "type", "summary");
	json_t *body = summary_json(&r->sum);
	json_object_update(s, body);
	json_decref(body);
	json_object_set_new(s, "bad_lines", json_integer((json_int_t)r->bad_lines));
	json_object_set_new(s, "passes", json_integer(r->o.repeat));
	json_object_set_new(s, "max_tokens", json_integer(r->o.max_tokens));
	json_object_set_new(s, "wall_s", json_real(kv_now_s() - r->t_run));
	json_object_set_new(s, "restarts", json_integer(r->restarts));
	json_t *ar = json_null();
	for (size_t k = 0; k < r->seq; k++)
		if (rows[k].first_after_restart) {
			json_decref(ar);
			ar = json_pack("{s:I, s:o, s:o, s:b}", "n", (json_int_t)(k + 1), "prompt_tokens",
				       jint(rows[k].r.prompt_tokens), "cached_tokens", jint(rows[k].r.cached_tokens), "ok",
				       rows[k].r.ok);
			break;
		}
	json_object_set_new(s, "first_after_restart", ar);
	json_object_set(s, "server_starts", r->starts);
	if (r->have_cold) {
		json_t *c = summary_json(&r->cold_sum);
		json_object_set_new(c, "speedup_ttft_p50", jnum_or_null(kcl_replay_quantile(r->speed_ttft, r->n_sp_ttft, 0.5)));
		json_object_set_new(c, "speedup_total_p50",
				    jnum_or_null(kcl_replay_quantile(r->speed_total, r->n_sp_total, 0.5)));
		json_object_set_new(s, "cold", c);
	} else {
		json_object_set_new(s, "cold", json_null());
	}
	json_object_set_new(s, "complete", json_boolean(!r->fatal));
	emit_json(s);
}

static int cmd_bench_replay(int argc, char **argv)
{
	struct replay r = {0};
	int rc = parse_opts(argc, argv, &r.o);
	if (rc)
		return rc == 1 ? 0 : 2;
	const struct rp_opts *o = &r.o;

	rc = o->trace_path ? kcl_replay_load_jsonl(o->trace_path, &r.tr) : kcl_replay_load_dir(o->dir, &r.tr);
	if (rc) {
		fprintf(stderr, "kvkeep bench replay: %s\n", kv_errmsg());
		return 1;
	}
	if (r.tr->n == 0) {
		fprintf(stderr, "kvkeep bench replay: %s holds no requests\n", o->trace_path ? o->trace_path : o->dir);
		kcl_replay_trace_free(r.tr);
		return 1;
	}
	for (size_t i = 0; i < r.tr->n; i++)
		r.bad_lines += r.tr->items[i].body == NULL;

	r.out = (struct rp_out){o->json ? stderr : stdout, o->json};
	r.starts = json_array();
	r.timeout_ms = o->timeout_s > 2000000 ? 2000000000 : (int)(o->timeout_s * 1000);
	if (!__builtin_mul_overflow(r.tr->n, (size_t)o->repeat, &r.total) && r.total <= ((size_t)1 << 26))
		r.rows = calloc(r.total, sizeof *r.rows);
	r.t_run = kv_now_s();
	r.restart_events = json_array();
	if (!r.rows || !r.starts || !r.restart_events) {
		if (r.total == 0 || r.total > ((size_t)1 << 26))
			fprintf(stderr, "kvkeep bench replay: %zu requests x --repeat %lld is more than 2^26 rows\n",
				r.tr->n, (long long)o->repeat);
		else
			fprintf(stderr, "kvkeep bench replay: out of memory\n");
		kcl_replay_trace_free(r.tr);
		free(r.rows);
		json_decref(r.starts);
		json_decref(r.restart_events);
		return 1;
	}
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGPIPE, SIG_IGN);

	if (start_server(&r) == 0) {
		table_head(&r.out);
		if (o->concurrency > 1)
			run_concurrent_passes(&r);
		else
			run_serial_passes(&r);
		if (o->restart_after > 0 && !r.restarts && !r.fatal)
			fprintf(r.out.table,
				"note: --restart-after %lld is not before the last request; no restart happened\n",
				(long long)o->restart_after);
		if (o->compare_cold && !r.fatal)
			run_cold(&r);
	}

	double stop_s = 0;
	char desc[64];
	if (r.srv.pid > 0)
		spawn_stop(&r.srv, &stop_s, desc, sizeof desc);
	kcl_child_free(&r.srv);

	struct kcl_replay_result *flat = calloc(r.seq ? r.seq : 1, sizeof *flat);
	for (size_t k = 0; flat && k < r.seq; k++)
		flat[k] = r.rows[k].r;
	kcl_replay_summarize(flat, flat ? r.seq : 0, &r.sum);
	free(flat);
	size_t n_failed = r.sum.failed;
	if (r.seq > 0)
		print_summary(&r);
	if (o->json && r.seq > 0)
		print_json(&r);
	free(r.speed_ttft);
	free(r.speed_total);
	free(r.rows);
	json_decref(r.starts);
	json_decref(r.restart_events);
	kcl_replay_trace_free(r.tr);
	if (r.fatal)
		return r.fatal == 2 ? 2 : 1;
	return n_failed ? 3 : 0;
}
KV_COMMAND(bench_replay, "bench replay", "replay recorded agent sessions: cache reuse and latency", cmd_bench_replay);
