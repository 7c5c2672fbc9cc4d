/*
 * cmd_chat.c - `kvkeep chat`: a terminal chat against a kvkeep server
 * (or any OpenAI-compatible one).
 *
 *   kvkeep chat --base-url http://127.0.0.1:8000/v1
 *   kvkeep chat --model DIR [--disable-prefix-cache] [serve flags after --]
 *
 * With --model it starts `kvkeep serve` itself on a free loopback port
 * (this binary, /proc/self/exe), waits for /health, and stops it (SIGTERM,
 * then SIGKILL after 5 s) when the chat ends, however it ends.
 * --disable-prefix-cache is handed to that server, which then keeps
 * nothing: no RAM entries and no disk files.
 *
 * The REPL keeps the conversation and sends it whole each turn (so the
 * server's prefix cache does the work), streams the answer as it comes,
 * and understands /reset (forget the conversation), /system TEXT (set the
 * system prompt and reset), /quit. Line editing and history come from
 * libedit. Ctrl-C while an answer streams stops that answer; at the prompt
 * it leaves.
 */
#include "cli/cli.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/err.h"
#include "base/io.h"
#include "client/child.h"
#include "client/http_client.h"

#include <editline/readline.h>
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct kcl_child g_srv;              /* the server started with --model */
static volatile pid_t g_child = -1;         /* its pid, for the signal handlers */
static struct kcl_http *volatile g_active; /* connection of the answer streaming now */
static volatile sig_atomic_t g_interrupted;

static void stop_child(void)
{
	kcl_child_free(&g_srv); /* SIGTERM, SIGKILL after 5 s */
	g_child = -1;
}

static void on_sigint(int sig)
{
	(void)sig;
	struct kcl_http *h = g_active;
	if (h) { /* stop the answer, keep the chat */
		g_interrupted = 1;
		kcl_http_abort(h);
		return;
	}
	if (g_child > 0)
		kill(g_child, SIGTERM);
	_exit(130);
}

static void on_sigterm(int sig)
{
	(void)sig;
	if (g_child > 0)
		kill(g_child, SIGTERM);
	_exit(143);
}

/* Start `kvkeep serve` on a free loopback port and wait until /health
 * answers 200 (client/child.h). */
static int spawn_server(const char *model, int disable_cache, char **extra, int n_extra, const char *log_path,
			char *base_url, size_t cap)
{
	char *av[64];
	int ac = 0;
	av[ac++] = "kvkeep";
	av[ac++] = "serve";
	av[ac++] = "--model";
	av[ac++] = (char *)model;
	av[ac++] = "--host";
	av[ac++] = "127.0.0.1";
	if (disable_cache)
		av[ac++] = "--disable-prefix-cache";
	for (int i = 0; i < n_extra && ac < 63; i++)
		av[ac++] = extra[i];
	int rc = kcl_child_init(&g_srv, av, ac, 0);
	if (rc)
		return rc;
	g_srv.log_path = log_path;
	g_srv.log_level = "info"; /* the file is the only trace of what the server saw: keep it all */
	g_srv.ignore_sigint = 1; /* Ctrl-C belongs to the chat, which stops the server */
	g_srv.stop_timeout_s = 5;
	rc = kcl_child_start(&g_srv, NULL);
	g_child = g_srv.pid > 0 ? g_srv.pid : -1;
	if (rc == KV_OK)
		snprintf(base_url, cap, "%s/v1", g_srv.url);
	return rc;
}

/* "Authorization: Bearer $KVKEEP_API_KEY\r\n" when the variable is set
 * (a server started with an API key, or one spawned here that inherits
 * it), else NULL. */
static const char *auth_header(void)
{
	static char h[1024];
	const char *k = kv_env(KV_ENV_API_KEY);
	if (!k || !*k || strpbrk(k, "\r\n") || strlen(k) > 900)
		return NULL;
	snprintf(h, sizeof h, "Authorization: Bearer %s\r\n", k);
	return h;
}

/* The server's first model id (malloc'd), or NULL after saying on stderr
 * what is wrong and what to do: nothing listening, a base URL without
 * /v1, a key required. A server still loading its model is waited for. */
static char *model_id(const char *base_url)
{
	char url[1200], *body = NULL;
	int st = 0;
	if (kv_path_fmt(url, sizeof url, "%s/models", base_url)) {
		fprintf(stderr, "kvkeep chat: %s\n", kv_errmsg());
		return NULL;
	}
	for (int waited = 0;; waited++) {
		free(body);
		body = NULL;
		if (kcl_http_fetch_h(url, "GET", NULL, 0, 10000, auth_header(), &st, &body, NULL)) {
			fprintf(stderr, "kvkeep chat: nothing answers at %s (%s): is `kvkeep serve` running there? (it listens on "
					"127.0.0.1:8000 unless told --host / --port)\n",
				base_url, kv_errmsg());
			return NULL;
		}
		if (st != 503 || waited >= 600)
			break;
		if (!waited)
			fprintf(stderr, "waiting for the server to load its model...\n");
		kv_sleep_ms(500);
	}
	if (st != 200) {
		size_t bl = strlen(base_url);
		int v1 = bl >= 3 && !strcmp(base_url + bl - 3, "/v1");
		if (st == 404 && !v1)
			fprintf(stderr, "kvkeep chat: %s answered 404: the base URL ends in /v1 (--base-url %s/v1)\n", url,
				base_url);
		else if (st == 401)
			fprintf(stderr, "kvkeep chat: %s wants an API key: set KVKEEP_API_KEY to the server's --api-key\n",
				base_url);
		else
			fprintf(stderr, "kvkeep chat: %s answered %d: %.200s\n", url, st, body ? body : "");
		free(body);
		return NULL;
	}
	json_t *j = json_loads(body, 0, NULL);
	free(body);
	const char *id = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
	char *r = id ? strdup(id) : NULL;
	json_decref(j);
	if (!r)
		fprintf(stderr, "kvkeep chat: %s lists no model (is it an OpenAI-compatible server?)\n", url);
	return r;
}

/* One streamed answer: prints deltas, returns the assistant text (malloc'd)
 * or NULL on error. */
static char *ask(const struct kcl_url *u, const char *model, json_t *messages, int64_t max_tokens, double temperature,
		 int *interrupted)
{
	json_t *body = json_object();
	json_object_set_new(body, "model", json_string(model ? model : ""));
	json_object_set(body, "messages", messages);
	json_object_set_new(body, "stream", json_true());
	if (max_tokens > 0)
		json_object_set_new(body, "max_tokens", json_integer(max_tokens));
	if (temperature >= 0)
		json_object_set_new(body, "temperature", json_real(temperature));
	char *txt = json_dumps(body, JSON_COMPACT);
	json_decref(body);
	if (!txt)
		return NULL;
	struct kcl_http *h = NULL;
	struct kcl_http_resp r = {0};
	struct kcl_sse sse;
	struct kcl_sse_event ev;
	struct kv_buf answer = KV_BUF_INIT;
	char path[1200];
	int rc, in_reasoning = 0, reported = 0;
	*interrupted = 0;
	snprintf(path, sizeof path, "%s/chat/completions", u->path);
	rc = kcl_http_connect(u->host, u->port, 10000, &h);
	if (rc) {
		free(txt);
		fprintf(stderr, "kvkeep chat: %s\n", kv_errmsg());
		return NULL;
	}
	kcl_http_set_timeout(h, 600000);
	g_interrupted = 0;
	g_active = h;
	rc = kcl_http_send(h, "POST", path, "application/json", txt, strlen(txt), auth_header());
	free(txt);
	if (!rc)
		rc = kcl_http_read_head(h, &r);
	if (!rc && r.status != 200) {
		char *eb = NULL;
		size_t el;
		kcl_http_read_all(h, &r, 1 << 20, &eb, &el);
		json_t *ej = eb ? json_loads(eb, 0, NULL) : NULL;
		const char *msg = json_string_value(json_object_get(json_object_get(ej, "error"), "message"));
		fprintf(stderr, "kvkeep chat: server answered %d: %s\n", r.status, msg ? msg : (eb ? eb : ""));
		json_decref(ej);
		free(eb);
		rc = KV_ERR_IO;
		reported = 1;
	}
	kcl_sse_init(&sse);
	while (!rc && (rc = kcl_http_next_event(h, &r, &sse, &ev)) == 1) {
		rc = 0;
		if (!strcmp(ev.data, "[DONE]"))
			break;
		json_t *j = json_loadb(ev.data, ev.data_len, 0, NULL);
		json_t *err = json_object_get(j, "error");
		if (err) {
			fprintf(stderr, "\nkvkeep chat: %s\n", json_string_value(json_object_get(err, "message")));
			json_decref(j);
			break;
		}
		json_t *d = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
		const char *rs = json_string_value(json_object_get(d, "reasoning_content"));
		const char *cs = json_string_value(json_object_get(d, "content"));
		if (rs && *rs) {
			if (!in_reasoning) {
				fputs("\033[2m", stdout); /* dim: thinking */
				in_reasoning = 1;
			}
			fputs(rs, stdout);
		}
		if (cs && *cs) {
			if (in_reasoning) {
				fputs("\033[0m\n", stdout);
				in_reasoning = 0;
			}
			fputs(cs, stdout);
			kv_buf_adds(&answer, cs);
		}
		json_t *tcs = json_object_get(d, "tool_calls");
		for (size_t i = 0; i < json_array_size(tcs); i++) {
			json_t *fn = json_object_get(json_array_get(tcs, i), "function");
			const char *name = json_string_value(json_object_get(fn, "name"));
			const char *args = json_string_value(json_object_get(fn, "arguments"));
			if (name)
				printf("\n[tool call %s] ", name);
			if (args)
				fputs(args, stdout);
		}
		fflush(stdout);
		json_decref(j);
	}
	if (in_reasoning)
		fputs("\033[0m", stdout);
	g_active = NULL;
	*interrupted = g_interrupted;
	if (*interrupted)
		fputs(" [stopped]", stdout);
	fputs("\n", stdout);
	fflush(stdout);
	if (rc < 0 && !*interrupted && !reported)
		fprintf(stderr, "kvkeep chat: %s\n", kv_errmsg());
	kcl_sse_free(&sse);
	kcl_http_resp_free(&r);
	kcl_http_close(h);
	if (rc < 0 && !*interrupted) {
		kv_buf_free(&answer);
		return NULL;
	}
	if (!answer.p)
		return strdup("");
	return kv_buf_take(&answer);
}

static void reset(json_t *messages, const char *system)
{
	json_array_clear(messages);
	if (system && *system) {
		json_t *m = json_object();
		json_object_set_new(m, "role", json_string("system"));
		json_object_set_new(m, "content", json_string(system));
		json_array_append_new(messages, m);
	}
}

static int cmd_chat(int argc, char **argv)
{
	const char *base = NULL, *model = NULL, *system = NULL, *name = NULL;
	int disable_cache = 0;
	int64_t max_tokens = 0;
	double temperature = -1;
	char *extra[32];
	int n_extra = 0;
	struct kv_flag flags[] = {
		{"base-url", KV_FLAG_STR, &base, "URL", "server to talk to, e.g. http://127.0.0.1:8000/v1"},
		{"model", KV_FLAG_STR, &model, "DIR", "start `kvkeep serve --model DIR` on a free loopback port instead"},
		{"disable-prefix-cache", KV_FLAG_BOOL, &disable_cache, NULL,
		 "with --model: the spawned server keeps no prefix cache (nothing in RAM, nothing on disk)"},
		{"system", KV_FLAG_STR, &system, "TEXT", "system prompt (default: none)"},
		{"model-name", KV_FLAG_STR, &name, "NAME", "model id to send (default: the server's first model)"},
		{"max-tokens", KV_FLAG_INT, &max_tokens, "N", "answer length cap (default: the server's)"},
		{"temperature", KV_FLAG_DOUBLE, &temperature, "T",
		 "sampling temperature (default: the server's: --default-temperature, generation_config.json, else 1.0)"},
		{NULL, 0, NULL, NULL, NULL},
	};
	int rc = kv_flags_parse("usage: kvkeep chat (--base-url URL | --model DIR) [flags] [-- serve flags]\n\n"
				"A terminal chat. Commands: /reset, /system TEXT, /quit (or Ctrl-D).",
				flags, argc, argv, extra, 32, &n_extra);
	if (rc == 1)
		return 0;
	if (rc)
		return 2;
	if (!!base == !!model) {
		fprintf(stderr, "kvkeep chat: give exactly one of --base-url and --model\n");
		return 2;
	}
	if (n_extra && !model) {
		fprintf(stderr, "kvkeep chat: extra serve flags need --model\n");
		return 2;
	}
	char url[1200];
	char log_path[512] = "";
	if (model) {
		const char *tmp = kv_env(KV_ENV_TMPDIR);
		snprintf(log_path, sizeof log_path, "%s/kvkeep-chat-serve.%d.log", tmp && *tmp ? tmp : "/tmp", (int)getpid());
		struct sigaction sa;
		memset(&sa, 0, sizeof sa);
		sa.sa_handler = on_sigterm;
		sigaction(SIGTERM, &sa, NULL);
		sigaction(SIGHUP, &sa, NULL);
		sa.sa_handler = on_sigint;
		sigaction(SIGINT, &sa, NULL);
		fprintf(stderr, "starting kvkeep serve --model %s%s (log: %s)...\n", model,
			disable_cache ? " --disable-prefix-cache" : "", log_path);
		if (spawn_server(model, disable_cache, extra, n_extra, log_path, url, sizeof url)) {
			fprintf(stderr, "kvkeep chat: %s\n", kv_errmsg());
			return 1;
		}
		fprintf(stderr, "server ready at %s\n", url);
	} else {
		snprintf(url, sizeof url, "%s", base);
		struct sigaction sa;
		memset(&sa, 0, sizeof sa);
		sa.sa_handler = on_sigint;
		sigaction(SIGINT, &sa, NULL);
	}
	signal(SIGPIPE, SIG_IGN);
	struct kcl_url u;
	if (kcl_url_parse(url, &u)) {
		fprintf(stderr, "kvkeep chat: %s\n", kv_errmsg());
		stop_child();
		return 2;
	}
	char *mid = name ? strdup(name) : model_id(url);
	if (!mid) {
		stop_child();
		return 1;
	}
	fprintf(stderr, "model %s - /reset, /system TEXT, /quit\n", mid);
	json_t *messages = json_array();
	char *sys = system ? strdup(system) : NULL;
	reset(messages, sys);
	int interactive = isatty(0);
	for (;;) {
		char *line = interactive ? readline("> ") : NULL;
		if (!interactive) {
			/* piped input: plain lines, no prompt echo games */
			static char buf[65536];
			if (!fgets(buf, sizeof buf, stdin))
				break;
			buf[strcspn(buf, "\n")] = 0;
			line = strdup(buf);
		}
		if (!line)
			break;
		char *l = line;
		while (*l == ' ' || *l == '\t')
			l++;
		if (!*l) {
			free(line);
			continue;
		}
		if (interactive)
			add_history(l);
		if (!strcmp(l, "/quit") || !strcmp(l, "/exit")) {
			free(line);
			break;
		}
		if (!strcmp(l, "/reset")) {
			reset(messages, sys);
			puts("(conversation reset)");
			free(line);
			continue;
		}
		if (!strncmp(l, "/system", 7) && (l[7] == ' ' || !l[7])) {
			free(sys);
			const char *t = l + 7;
			while (*t == ' ')
				t++;
			sys = *t ? strdup(t) : NULL;
			reset(messages, sys);
			puts(sys ? "(system prompt set, conversation reset)" : "(system prompt cleared, conversation reset)");
			free(line);
			continue;
		}
		if (l[0] == '/') {
			printf("unknown command %s (/reset, /system TEXT, /quit)\n", l);
			free(line);
			continue;
		}
		json_t *um = json_object();
		json_object_set_new(um, "role", json_string("user"));
		json_object_set_new(um, "content", json_string(l));
		json_array_append_new(messages, um);
		free(line);
		int intr = 0;
		char *ans = ask(&u, mid, messages, max_tokens, temperature, &intr);
		if (!ans) {
			/* keep the conversation as it was before this turn */
			json_array_remove(messages, json_array_size(messages) - 1);
			continue;
		}
		json_t *am = json_object();
		json_object_set_new(am, "role", json_string("assistant"));
		json_object_set_new(am, "content", json_string(ans));
		json_array_append_new(messages, am);
		free(ans);
	}
	json_decref(messages);
	free(sys);
	free(mid);
	stop_child();
	return 0;
}
KV_COMMAND(chat, "chat", "terminal chat with a server (or one it starts with --model)", cmd_chat);
