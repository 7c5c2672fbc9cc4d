/*
 * replay.c - see replay.h.
 *
 * Nothing here trusts the trace or the server: a trace line or an event
 * that is not what we expect becomes a counted, reported problem, never an
 * abort, and every wait is bounded by the HTTP client's per-call timeout
 * plus a total deadline per request.
 */
#include "client/replay.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/err.h"
#include "base/io.h"
#include "base/json.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* --- traces --------------------------------------------------------------- */

static int trace_push(struct kcl_replay_trace *t, size_t *cap, char *source, json_t *body, char *error)
{
	if (!source || (!body && !error)) {
		free(source);
		free(error);
		json_decref(body);
		return kv_fail(KV_ERR_NOMEM, "replay: out of memory");
	}
	if (t->n == *cap) {
		size_t nc = *cap ? *cap * 2 : 64;
		struct kcl_replay_item *ni = realloc(t->items, nc * sizeof *ni);
		if (!ni) {
			free(source);
			free(error);
			json_decref(body);
			return kv_fail(KV_ERR_NOMEM, "replay: out of memory");
		}
		t->items = ni;
		*cap = nc;
	}
	t->items[t->n++] = (struct kcl_replay_item){source, body, error};
	return KV_OK;
}

/* Parse one body; on failure *err gets a malloc'd reason. */
static json_t *parse_body(const char *what, const char *p, size_t n, char **err)
{
	json_t *v = NULL;
	*err = NULL;
	if (kv_json_parse(what, p, n, KV_JSON_MAX_DEPTH, &v)) {
		*err = strdup(kv_errmsg());
		return NULL;
	}
	if (!json_is_object(v)) {
		json_decref(v);
		char msg[300];
		snprintf(msg, sizeof msg, "%s: not a JSON object (a request body must be one)", what);
		*err = strdup(msg);
		return NULL;
	}
	return v;
}

int kcl_replay_load_jsonl_mem(const char *what, const char *p, size_t n, struct kcl_replay_trace **out)
{
	struct kcl_replay_trace *t = calloc(1, sizeof *t);
	size_t cap = 0, line_no = 0, i = 0;
	int rc = KV_OK;

	*out = NULL;
	if (!t)
		return kv_fail(KV_ERR_NOMEM, "replay: out of memory");
	while (i < n && rc == KV_OK) {
		const char *nl = memchr(p + i, '\n', n - i);
		size_t end = nl ? (size_t)(nl - p) : n, len = end - i;
		const char *line = p + i;
		line_no++;
		i = nl ? end + 1 : n;
		if (len && line[len - 1] == '\r')
			len--;
		size_t k = 0;
		while (k < len && (line[k] == ' ' || line[k] == '\t'))
			k++;
		if (k == len)
			continue; /* blank */
		char src[600];
		char *err = NULL;
		snprintf(src, sizeof src, "%s:%zu", what, line_no);
		json_t *body = parse_body(src, line, len, &err);
		rc = trace_push(t, &cap, strdup(src), body, err);
	}
	if (rc) {
		kcl_replay_trace_free(t);
		return rc;
	}
	*out = t;
	return KV_OK;
}

int kcl_replay_load_jsonl(const char *path, struct kcl_replay_trace **out)
{
	char *buf;
	size_t len;
	int rc = kv_io_read_file(path, KSV_REPLAY_MAX_TRACE, &buf, &len);
	*out = NULL;
	if (rc)
		return rc;
	rc = kcl_replay_load_jsonl_mem(path, buf, len, out);
	free(buf);
	return rc;
}

static int cmp_names(const void *a, const void *b)
{
	return strverscmp(*(char *const *)a, *(char *const *)b);
}

int kcl_replay_load_dir(const char *dir, struct kcl_replay_trace **out)
{
	DIR *d = opendir(dir);
	char **names = NULL;
	size_t n = 0, cap = 0, tcap = 0;
	struct dirent *e;
	int rc = KV_OK;

	*out = NULL;
	if (!d)
		return kv_fail(kv_io_errno_code(errno), "%s: %s", dir, strerror(errno));
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name);
		if (e->d_name[0] == '.' || l < 6 || strcmp(e->d_name + l - 5, ".json"))
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 64;
			char **nn = realloc(names, nc * sizeof *nn);
			if (!nn) {
				rc = kv_fail(KV_ERR_NOMEM, "replay: out of memory");
				break;
			}
			names = nn;
			cap = nc;
		}
		if (!(names[n] = strdup(e->d_name))) {
			rc = kv_fail(KV_ERR_NOMEM, "replay: out of memory");
			break;
		}
		n++;
	}
	closedir(d);
	struct kcl_replay_trace *t = rc ? NULL : calloc(1, sizeof *t);
	if (!rc && !t)
		rc = kv_fail(KV_ERR_NOMEM, "replay: out of memory");
	if (!rc && n == 0)
		rc = kv_fail(KV_ERR_NOT_FOUND, "%s: no *.json files in this folder", dir);
	if (!rc)
		qsort(names, n, sizeof *names, cmp_names);
	for (size_t i = 0; i < n && !rc; i++) {
		char path[4200];
		struct stat st;
		snprintf(path, sizeof path, "%s/%s", dir, names[i]);
		if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
			continue; /* a folder or fifo named *.json is not a body */
		char *buf = NULL, *err = NULL;
		size_t len = 0;
		json_t *body = NULL;
		if (kv_io_read_file(path, KSV_REPLAY_MAX_BODY, &buf, &len))
			err = strdup(kv_errmsg());
		else
			body = parse_body(path, buf, len, &err);
		free(buf);
		rc = trace_push(t, &tcap, strdup(path), body, err);
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	if (rc) {
		kcl_replay_trace_free(t);
		return rc;
	}
	*out = t;
	return KV_OK;
}

void kcl_replay_trace_free(struct kcl_replay_trace *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < t->n; i++) {
		free(t->items[i].source);
		free(t->items[i].error);
		json_decref(t->items[i].body);
	}
	free(t->items);
	free(t);
}

/* --- body preparation ----------------------------------------------------- */

static int cap_int_field(json_t *o, const char *key, int64_t cap)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return 0;
	if (json_is_integer(v) && json_integer_value(v) <= cap)
		return 1;
	/* larger, or not an integer at all: the cap is what we send */
	json_object_set_new(o, key, json_integer(cap));
	return 1;
}

int kcl_replay_prepare(const json_t *body, int64_t max_tokens, const char *model, char **out, size_t *len)
{
	json_t *b, *so;
	*out = NULL;
	if (len)
		*len = 0;
	if (!json_is_object(body))
		return kv_fail(KV_ERR_INVALID, "replay: the body is not a JSON object");
	/* deep copy: the trace is replayed again by --repeat and --compare-cold */
	b = json_deep_copy(body);
	if (!b)
		return kv_fail(KV_ERR_NOMEM, "replay: out of memory");
	if (model)
		json_object_set_new(b, "model", json_string(model));
	json_object_set_new(b, "stream", json_true());
	so = json_object_get(b, "stream_options");
	if (json_is_object(so))
		json_object_set_new(so, "include_usage", json_true());
	else
		json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
	json_object_set_new(b, "temperature", json_integer(0));
	int a = cap_int_field(b, "max_tokens", max_tokens);
	int c = cap_int_field(b, "max_completion_tokens", max_tokens);
	if (!a && !c)
		json_object_set_new(b, "max_tokens", json_integer(max_tokens));
	char *s = json_dumps(b, JSON_COMPACT);
	json_decref(b);
	if (!s)
		return kv_fail(KV_ERR_NOMEM, "replay: cannot serialise the body");
	*out = s;
	if (len)
		*len = strlen(s);
	return KV_OK;
}

/* --- stream accounting ------------------------------------------------------ */

void kcl_replay_stream_init(struct kcl_replay_stream *s)
{
	memset(s, 0, sizeof *s);
	s->prompt_tokens = s->cached_tokens = s->completion_tokens = -1;
	s->t_first = -1;
}

static int nonempty_str(const json_t *v)
{
	return json_is_string(v) && json_string_length(v) > 0;
}

/* A delta that carries output the user sees: text, reasoning, a tool call. */
static int delta_has_token(const json_t *d)
{
	if (!json_is_object(d))
		return 0;
	if (nonempty_str(json_object_get(d, "content")) || nonempty_str(json_object_get(d, "reasoning_content")) ||
	    nonempty_str(json_object_get(d, "reasoning")))
		return 1;
	json_t *tc = json_object_get(d, "tool_calls");
	return json_is_array(tc) && json_array_size(tc) > 0;
}

static int64_t usage_int(const json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	if (json_is_integer(v) && json_integer_value(v) >= 0)
		return json_integer_value(v);
	return -1;
}

void kcl_replay_stream_event(struct kcl_replay_stream *s, const char *data, size_t n, double t)
{
	json_t *v = NULL, *x;
	size_t i;

	while (n && (data[n - 1] == ' ' || data[n - 1] == '\n'))
		n--;
	if (n == 6 && !memcmp(data, "[DONE]", 6)) {
		s->done = 1;
		return;
	}
	if (kv_json_parse("sse event", data, n, KV_JSON_MAX_DEPTH, &v) || !json_is_object(v)) {
		json_decref(v);
		s->n_bad++;
		return;
	}
	x = json_object_get(v, "error");
	if (x && !json_is_null(x)) {
		const char *m = json_string_value(json_object_get(x, "message"));
		if (!m)
			m = json_string_value(x);
		snprintf(s->error, sizeof s->error, "stream error: %s", m ? m : "(no message)");
	}
	json_t *choices = json_object_get(v, "choices");
	json_array_foreach(choices, i, x)
	{
		json_t *fr = json_object_get(x, "finish_reason");
		if (json_is_string(fr))
			snprintf(s->finish_reason, sizeof s->finish_reason, "%s", json_string_value(fr));
		if (delta_has_token(json_object_get(x, "delta"))) {
			s->n_token_chunks++;
			if (s->t_first < 0)
				s->t_first = t;
		}
	}
	x = json_object_get(v, "usage");
	if (json_is_object(x)) {
		int64_t p = usage_int(x, "prompt_tokens"), c = usage_int(x, "completion_tokens");
		if (p >= 0)
			s->prompt_tokens = p;
		if (c >= 0)
			s->completion_tokens = c;
		int64_t ct = usage_int(json_object_get(x, "prompt_tokens_details"), "cached_tokens");
		if (ct >= 0)
			s->cached_tokens = ct;
	}
	json_decref(v);
}

/* --- one request ---------------------------------------------------------------- */

/* The error message of a non-200 body: OpenAI's error.message, else the
 * first line of the body. */
static void error_of_body(const char *b, size_t n, char *out, size_t cap)
{
	json_t *v = NULL;
	if (kv_json_parse("error body", b, n, KV_JSON_MAX_DEPTH, &v) == KV_OK) {
		json_t *e = json_object_get(v, "error");
		const char *m = json_string_value(json_object_get(e, "message"));
		if (!m)
			m = json_string_value(e);
		if (m) {
			snprintf(out, cap, "%s", m);
			json_decref(v);
			return;
		}
		json_decref(v);
	}
	size_t k = 0;
	while (k < n && k + 1 < cap && b[k] != '\n' && b[k] != '\r') {
		out[k] = (unsigned char)b[k] < 0x20 ? ' ' : b[k];
		k++;
	}
	out[k] = 0;
	if (!k)
		snprintf(out, cap, "(empty body)");
}

int kcl_replay_send(const struct kcl_url *base, const char *body, size_t len, int timeout_ms,
		    struct kcl_replay_result *res)
{
	struct kcl_http *h = NULL;
	struct kcl_http_resp r = {0};
	struct kcl_sse sse;
	struct kcl_sse_event ev;
	struct kcl_replay_stream st;
	char path[1200];
	int rc;
	double t0 = kv_now_s();
	uint64_t deadline = timeout_ms > 0 ? kv_now_ns() + (uint64_t)timeout_ms * 1000000ull : 0;

	memset(res, 0, sizeof *res);
	res->prompt_tokens = res->cached_tokens = -1;
	res->ttft_s = -1;
	kcl_sse_init(&sse);
	kcl_replay_stream_init(&st);
	/* a base URL without a path means the server root; OpenAI clients put /v1 in it */
	snprintf(path, sizeof path, "%s/chat/completions", base->path[0] ? base->path : "/v1");
	rc = kcl_http_connect(base->host, base->port, timeout_ms, &h);
	if (!rc) {
		/* a server with an API key: KVKEEP_API_KEY, as kvkeep serve reads it */
		char hdr[1100] = "Accept: text/event-stream\r\n";
		const char *k = kv_env(KV_ENV_API_KEY);
		if (k && *k && strlen(k) < 900 && !strpbrk(k, "\r\n"))
			snprintf(hdr, sizeof hdr, "Accept: text/event-stream\r\nAuthorization: Bearer %s\r\n", k);
		rc = kcl_http_send(h, "POST", path, "application/json", body, len, hdr);
	}
	if (!rc)
		rc = kcl_http_read_head(h, &r);
	if (rc) {
		snprintf(res->error, sizeof res->error, "%s", kv_errmsg());
		goto out;
	}
	res->status = r.status;
	if (r.status != 200) {
		char *b = NULL;
		size_t bl = 0;
		if (kcl_http_read_all(h, &r, 1u << 20, &b, &bl) == KV_OK) {
			char msg[400];
			error_of_body(b, bl, msg, sizeof msg);
			snprintf(res->error, sizeof res->error, "HTTP %d: %s", r.status, msg);
		} else {
			snprintf(res->error, sizeof res->error, "HTTP %d (body unreadable: %s)", r.status, kv_errmsg());
		}
		free(b);
		goto out;
	}
	for (;;) {
		if (deadline && kv_now_ns() > deadline) {
			rc = kv_fail(KV_ERR_TIMEOUT, "replay: request took longer than %d ms", timeout_ms);
			break;
		}
		int g = kcl_http_next_event(h, &r, &sse, &ev);
		if (g < 0) {
			rc = g;
			break;
		}
		if (g == 0)
			break;
		kcl_replay_stream_event(&st, ev.data, ev.data_len, kv_now_s() - t0);
	}
	if (rc)
		snprintf(res->error, sizeof res->error, "stream broken after %.3f s: %s", kv_now_s() - t0, kv_errmsg());
	else if (st.error[0])
		snprintf(res->error, sizeof res->error, "%s", st.error);
	else if (!st.done)
		snprintf(res->error, sizeof res->error, "stream ended without [DONE]");
	else if (st.prompt_tokens < 0)
		snprintf(res->error, sizeof res->error, "stream carried no usage (prompt_tokens)");
	else
		res->ok = 1;
	rc = KV_OK; /* a response came; its problems are in res */
out:
	res->total_s = kv_now_s() - t0;
	res->prompt_tokens = st.prompt_tokens;
	res->cached_tokens = st.cached_tokens;
	if (res->status == 200)
		res->generated_tokens = st.completion_tokens >= 0 ? st.completion_tokens : st.n_token_chunks;
	else
		res->generated_tokens = -1;
	res->ttft_s = st.t_first;
	kcl_sse_free(&sse);
	kcl_http_resp_free(&r);
	kcl_http_close(h);
	return rc;
}

/* --- statistics ----------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

double kcl_replay_quantile(const double *v, size_t n, double q)
{
	if (n == 0 || !(q >= 0 && q <= 1))
		return NAN;
	double *s = malloc(n * sizeof *s);
	if (!s)
		return NAN;
	memcpy(s, v, n * sizeof *s);
	qsort(s, n, sizeof *s, cmp_double);
	double pos = q * (double)(n - 1);
	size_t lo = (size_t)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
	double r = s[lo] + (s[hi] - s[lo]) * (pos - (double)lo);
	free(s);
	return r;
}

void kcl_replay_summarize(const struct kcl_replay_result *r, size_t n, struct kcl_replay_summary *o)
{
	double *ttft = malloc((n ? n : 1) * sizeof *ttft), *tot = malloc((n ? n : 1) * sizeof *tot);
	size_t nt = 0, nn = 0;

	memset(o, 0, sizeof *o);
	o->requests = n;
	for (size_t i = 0; i < n; i++) {
		if (!r[i].ok) {
			o->failed++;
			continue;
		}
		o->ok++;
		if (r[i].prompt_tokens > 0)
			o->prompt_tokens += r[i].prompt_tokens;
		if (r[i].cached_tokens > 0)
			o->cached_tokens += r[i].cached_tokens;
		if (r[i].generated_tokens > 0)
			o->generated_tokens += r[i].generated_tokens;
		if (ttft && r[i].ttft_s >= 0)
			ttft[nt++] = r[i].ttft_s;
		if (tot)
			tot[nn++] = r[i].total_s;
	}
	o->reuse_ratio = o->prompt_tokens > 0 ? (double)o->cached_tokens / (double)o->prompt_tokens : NAN;
	o->ttft_p50_s = kcl_replay_quantile(ttft, nt, 0.5);
	o->ttft_p90_s = kcl_replay_quantile(ttft, nt, 0.9);
	o->total_p50_s = kcl_replay_quantile(tot, nn, 0.5);
	o->total_p90_s = kcl_replay_quantile(tot, nn, 0.9);
	free(ttft);
	free(tot);
}
