/*
 * test_replay.c - server/replay: the trace reader (JSONL with bad lines,
 * folder mode order), body preparation, SSE usage extraction, one request
 * against a canned in-process HTTP server, and the statistics.
 */
#include "kt.h"
#include "base/err.h"
#include "base/io.h"
#include "base/log.h"
#include "client/http_client.h"
#include "client/replay.h"

#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* --- trace reader ----------------------------------------------------------- */

KT_CASE(jsonl_keeps_bad_lines_in_place)
{
	const char *text = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}\n"
			   "\n"
			   "   \t\n"
			   "{\"model\": broken\n"
			   "[1,2,3]\r\n"
			   "{\"messages\":[],\"x\":1}\r\n"
			   "\"just a string\"\n"
			   "{\"last\":true}"; /* no newline at the end */
	struct kcl_replay_trace *t = NULL;
	KT_OK(kcl_replay_load_jsonl_mem("t.jsonl", text, strlen(text), &t));
	KT_REQUIRE(t != NULL);
	KT_EQ_INT(t->n, 6);
	KT_REQUIRE(t->n == 6);
	KT_EQ_STR(t->items[0].source, "t.jsonl:1");
	KT_CHECK(t->items[0].body && !t->items[0].error);
	/* blank and whitespace-only lines are skipped but still counted as lines */
	KT_EQ_STR(t->items[1].source, "t.jsonl:4");
	KT_CHECK(!t->items[1].body && t->items[1].error && strstr(t->items[1].error, "t.jsonl:4"));
	KT_EQ_STR(t->items[2].source, "t.jsonl:5");
	KT_CHECK(!t->items[2].body && t->items[2].error && strstr(t->items[2].error, "not a JSON object"));
	KT_EQ_STR(t->items[3].source, "t.jsonl:6");
	KT_CHECK(t->items[3].body && json_integer_value(json_object_get(t->items[3].body, "x")) == 1);
	KT_CHECK(!t->items[4].body && t->items[4].error);
	KT_EQ_STR(t->items[5].source, "t.jsonl:8");
	KT_CHECK(t->items[5].body && json_is_true(json_object_get(t->items[5].body, "last")));
	kcl_replay_trace_free(t);

	/* an empty trace is no items, not an error */
	KT_OK(kcl_replay_load_jsonl_mem("e", "\n\n", 2, &t));
	KT_EQ_INT(t->n, 0);
	kcl_replay_trace_free(t);
}

KT_CASE(jsonl_rejects_deep_nesting_without_crashing)
{
	char buf[5000];
	size_t n = 0;
	for (int i = 0; i < 2000; i++)
		buf[n++] = '[';
	buf[n++] = '\n';
	memcpy(buf + n, "{\"ok\":1}\n", 9);
	n += 9;
	struct kcl_replay_trace *t = NULL;
	KT_OK(kcl_replay_load_jsonl_mem("deep", buf, n, &t));
	KT_REQUIRE(t && t->n == 2);
	KT_CHECK(!t->items[0].body && strstr(t->items[0].error, "deep"));
	KT_CHECK(t->items[1].body != NULL);
	kcl_replay_trace_free(t);
}

static void write_file(const char *dir, const char *name, const char *text)
{
	char p[1024];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	FILE *f = fopen(p, "w");
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

KT_CASE(folder_mode_sorts_by_name_with_numbers)
{
	char dir[600];
	snprintf(dir, sizeof dir, "%s/bodies", kt_tmpdir());
	KT_REQUIRE(mkdir(dir, 0700) == 0);
	write_file(dir, "10.json", "{\"n\":10}");
	write_file(dir, "2.json", "{\"n\":2}");
	write_file(dir, "1.json", "{\"n\":1}");
	write_file(dir, "req-003.json", "{\"n\":103}");
	write_file(dir, "bad.json", "{nope");
	write_file(dir, "notes.txt", "{\"n\":-1}");
	write_file(dir, ".hidden.json", "{\"n\":-2}");
	char sub[700];
	snprintf(sub, sizeof sub, "%s/sub.json", dir);
	KT_REQUIRE(mkdir(sub, 0700) == 0);

	struct kcl_replay_trace *t = NULL;
	KT_OK(kcl_replay_load_dir(dir, &t));
	KT_REQUIRE(t != NULL);
	KT_EQ_INT(t->n, 5);
	KT_REQUIRE(t->n == 5);
	/* digit runs compare as numbers: 1, 2, 10; then letters */
	int64_t want[] = {1, 2, 10};
	for (int i = 0; i < 3; i++)
		KT_EQ_INT(json_integer_value(json_object_get(t->items[i].body, "n")), want[i]);
	KT_CHECK(strstr(t->items[0].source, "/1.json") != NULL);
	KT_CHECK(strstr(t->items[3].source, "bad.json") != NULL);
	KT_CHECK(!t->items[3].body && t->items[3].error);
	KT_EQ_INT(json_integer_value(json_object_get(t->items[4].body, "n")), 103);
	kcl_replay_trace_free(t);

	char empty[600];
	snprintf(empty, sizeof empty, "%s/empty", kt_tmpdir());
	KT_REQUIRE(mkdir(empty, 0700) == 0);
	KT_EQ_INT(kcl_replay_load_dir(empty, &t), KV_ERR_NOT_FOUND);
	KT_CHECK(t == NULL);
	KT_CHECK(kcl_replay_load_dir("/nonexistent/kvkeep/dir", &t) != KV_OK);
}

/* --- body preparation --------------------------------------------------------- */

static json_t *prep_model(const char *in, int64_t cap, const char *model)
{
	json_t *b = json_loads(in, 0, NULL), *o = NULL;
	char *s = NULL;
	if (b && kcl_replay_prepare(b, cap, model, &s, NULL) == KV_OK)
		o = json_loads(s, 0, NULL);
	free(s);
	json_decref(b);
	return o;
}

static json_t *prep(const char *in, int64_t cap)
{
	return prep_model(in, cap, NULL);
}

KT_CASE(prepare_changes_only_the_documented_fields)
{
	const char *in = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}],"
			 "\"stream\":false,\"stream_options\":{\"continuous_usage_stats\":true},\"max_tokens\":4096,"
			 "\"temperature\":0.7,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
			 "\"provider\":{\"order\":[\"a\"]},\"top_p\":0.9}";
	json_t *o = prep(in, 16), *orig = json_loads(in, 0, NULL);
	KT_REQUIRE(o && orig);
	KT_CHECK(json_is_true(json_object_get(o, "stream")));
	json_t *so = json_object_get(o, "stream_options");
	KT_CHECK(json_is_true(json_object_get(so, "include_usage")));
	KT_CHECK(json_is_true(json_object_get(so, "continuous_usage_stats")));
	KT_EQ_INT(json_integer_value(json_object_get(o, "max_tokens")), 16);
	KT_CHECK(json_number_value(json_object_get(o, "temperature")) == 0.0);
	KT_CHECK(json_object_get(o, "max_completion_tokens") == NULL);
	/* everything else is unchanged, key order included */
	const char *keep[] = {"model", "messages", "tools", "provider", "top_p"};
	for (size_t i = 0; i < 5; i++)
		KT_CHECKF(json_equal(json_object_get(o, keep[i]), json_object_get(orig, keep[i])), "field %s changed", keep[i]);
	const char *key;
	json_t *v;
	const char *order[16];
	size_t k = 0;
	json_object_foreach(o, key, v) if (k < 16) order[k++] = key;
	KT_EQ_INT(k, 9);
	KT_EQ_STR(order[0], "model");
	KT_EQ_STR(order[1], "messages");
	KT_EQ_STR(order[8], "top_p");
	json_decref(o);
	json_decref(orig);

	/* a smaller limit is kept; max_completion_tokens is capped, nothing added */
	o = prep("{\"messages\":[],\"max_tokens\":8}", 16);
	KT_EQ_INT(json_integer_value(json_object_get(o, "max_tokens")), 8);
	json_decref(o);
	o = prep("{\"messages\":[],\"max_completion_tokens\":9000}", 16);
	KT_EQ_INT(json_integer_value(json_object_get(o, "max_completion_tokens")), 16);
	KT_CHECK(json_object_get(o, "max_tokens") == NULL);
	json_decref(o);
	o = prep("{\"messages\":[],\"stream_options\":null,\"max_tokens\":\"lots\"}", 5);
	KT_EQ_INT(json_integer_value(json_object_get(o, "max_tokens")), 5);
	KT_CHECK(json_is_true(json_object_get(json_object_get(o, "stream_options"), "include_usage")));
	json_decref(o);
	o = prep("{\"messages\":[]}", 16);
	KT_EQ_INT(json_integer_value(json_object_get(o, "max_tokens")), 16);
	json_decref(o);
	/* --model replaces the recorded model name, in place */
	o = prep_model("{\"model\":\"gpt-4o\",\"messages\":[]}", 16, "tiny");
	KT_EQ_STR(json_string_value(json_object_get(o, "model")), "tiny");
	KT_EQ_STR(json_object_iter_key(json_object_iter(o)), "model");
	json_decref(o);

	char *s = NULL;
	json_t *arr = json_array();
	KT_EQ_INT(kcl_replay_prepare(arr, 16, NULL, &s, NULL), KV_ERR_INVALID);
	KT_CHECK(s == NULL);
	json_decref(arr);
}

/* --- SSE usage extraction ----------------------------------------------------- */

/* Feed raw SSE text to the parser in pieces of `step` bytes; event k is
 * stamped with time k+1. */
static void feed_sse(struct kcl_replay_stream *st, const char *text, size_t step)
{
	struct kcl_sse sse;
	struct kcl_sse_event ev;
	size_t n = strlen(text), off = 0;
	int k = 0;
	kcl_sse_init(&sse);
	while (off < n) {
		size_t end = off + step < n ? off + step : n, pos = off;
		while (pos < end) {
			int got = 0;
			size_t used = kcl_sse_feed(&sse, text + pos, end - pos, &ev, &got);
			if (used == (size_t)-1)
				break;
			pos += used;
			if (got)
				kcl_replay_stream_event(st, ev.data, ev.data_len, ++k);
		}
		off = end;
	}
	kcl_sse_free(&sse);
}

static const char *SSE_OPENAI =
	"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n"
	": keep-alive comment\n\n"
	"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}],\"usage\":null}\r\n\r\n"
	"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":null}]}\n\n"
	"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"
	"data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":17220,\"completion_tokens\":2,"
	"\"total_tokens\":17222,\"prompt_tokens_details\":{\"cached_tokens\":17205}}}\n\n"
	"data: [DONE]\n\n";

KT_CASE(sse_usage_and_first_token)
{
	size_t steps[] = {1, 7, 64, 100000};
	for (size_t i = 0; i < 4; i++) {
		struct kcl_replay_stream st;
		kcl_replay_stream_init(&st);
		feed_sse(&st, SSE_OPENAI, steps[i]);
		KT_EQ_INT(st.prompt_tokens, 17220);
		KT_EQ_INT(st.cached_tokens, 17205);
		KT_EQ_INT(st.completion_tokens, 2);
		KT_EQ_INT(st.n_token_chunks, 2);
		/* the role chunk with empty content is not the first token */
		KT_CHECKF(st.t_first == 2.0, "step %zu: t_first %g", steps[i], st.t_first);
		KT_CHECK(st.done);
		KT_EQ_INT(st.n_bad, 0);
		KT_EQ_STR(st.finish_reason, "length");
		KT_EQ_STR(st.error, "");
	}
}

KT_CASE(sse_reasoning_and_tool_calls_count_as_tokens)
{
	struct kcl_replay_stream st;
	kcl_replay_stream_init(&st);
	feed_sse(&st,
		 "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"
		 "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hmm\"}}]}\n\n"
		 "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"
		 "data: [DONE]\n\n",
		 5);
	KT_CHECK(st.t_first == 2.0);
	KT_EQ_INT(st.prompt_tokens, -1); /* no usage chunk at all */
	KT_EQ_INT(st.cached_tokens, -1);

	kcl_replay_stream_init(&st);
	feed_sse(&st,
		 "data: {\"choices\":[{\"delta\":{\"content\":null,\"tool_calls\":[]}}]}\n\n"
		 "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"function\":"
		 "{\"name\":\"grep\",\"arguments\":\"\"}}]}}]}\n\n"
		 "data: {\"choices\":[{\"delta\":{\"reasoning\":\"r\"}}]}\n\n"
		 "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3}}\n\n"
		 "data: [DONE]\n\n",
		 3);
	KT_CHECK(st.t_first == 2.0);
	KT_EQ_INT(st.n_token_chunks, 2);
	KT_EQ_INT(st.prompt_tokens, 10);
	KT_EQ_INT(st.cached_tokens, -1); /* the server did not report details */
}

KT_CASE(sse_last_usage_wins_and_bad_events_are_counted)
{
	struct kcl_replay_stream st;
	kcl_replay_stream_init(&st);
	feed_sse(&st,
		 "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,"
		 "\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n"
		 "data: not json at all\n\n"
		 "data: [1,2]\n\n"
		 "data: {\"choices\":\"weird\",\"usage\":{\"prompt_tokens\":-4,\"completion_tokens\":\"x\"}}\n\n"
		 "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":4,"
		 "\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\n"
		 "data: {\"error\":{\"message\":\"engine overloaded\"}}\n\n",
		 11);
	KT_EQ_INT(st.n_bad, 2);
	KT_EQ_INT(st.prompt_tokens, 5);
	KT_EQ_INT(st.completion_tokens, 4);
	KT_EQ_INT(st.cached_tokens, 3);
	KT_CHECK(!st.done);
	KT_CHECK(strstr(st.error, "engine overloaded") != NULL);
}

/* --- one request against a canned server ----------------------------------------- */

struct canned {
	int lfd;
	const char *response;   /* written after the request is read */
	char request[65536];    /* what the client sent */
	size_t req_len;
};

static void *canned_main(void *arg)
{
	struct canned *c = arg;
	int fd = accept(c->lfd, NULL, NULL);
	if (fd < 0)
		return NULL;
	/* read the head and Content-Length bytes of body */
	size_t n = 0, need = 0;
	for (;;) {
		ssize_t r = recv(fd, c->request + n, sizeof c->request - 1 - n, 0);
		if (r <= 0)
			break;
		n += (size_t)r;
		c->request[n] = 0;
		char *e = strstr(c->request, "\r\n\r\n");
		if (e && !need) {
			char *cl = strcasestr(c->request, "content-length:");
			need = (size_t)(e + 4 - c->request) + (cl ? strtoul(cl + 15, NULL, 10) : 0);
		}
		if (need && n >= need)
			break;
	}
	c->req_len = n;
	if (send(fd, c->response, strlen(c->response), MSG_NOSIGNAL) < 0) {
		/* the client hung up: nothing to do */
	}
	close(fd);
	return NULL;
}

static int canned_start(struct canned *c, pthread_t *th, struct kcl_url *u)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof a;
	c->lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (c->lfd < 0 || bind(c->lfd, (struct sockaddr *)&a, sizeof a) || listen(c->lfd, 4) ||
	    getsockname(c->lfd, (struct sockaddr *)&a, &al))
		return -1;
	char url[100];
	snprintf(url, sizeof url, "http://127.0.0.1:%d/v1", ntohs(a.sin_port));
	if (kcl_url_parse(url, u))
		return -1;
	return pthread_create(th, NULL, canned_main, c);
}

static struct canned g_canned;

static void canned_run(const char *response, struct kcl_replay_result *res, int *rc)
{
	pthread_t th;
	struct kcl_url u;
	memset(&g_canned, 0, sizeof g_canned);
	g_canned.response = response;
	*rc = -100;
	if (canned_start(&g_canned, &th, &u))
		return;
	const char *body = "{\"messages\":[],\"stream\":true}";
	*rc = kcl_replay_send(&u, body, strlen(body), 5000, res);
	pthread_join(th, NULL);
	close(g_canned.lfd);
}

KT_CASE(send_measures_a_streamed_response)
{
	struct kcl_replay_result r;
	int rc;
	char resp[4096];
	snprintf(resp, sizeof resp,
		 "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%zx\r\n%s\r\n0\r\n\r\n",
		 strlen(SSE_OPENAI), SSE_OPENAI);
	canned_run(resp, &r, &rc);
	KT_EQ_INT(rc, KV_OK);
	KT_CHECKF(r.ok, "error: %s", r.error);
	KT_EQ_INT(r.status, 200);
	KT_EQ_INT(r.prompt_tokens, 17220);
	KT_EQ_INT(r.cached_tokens, 17205);
	KT_EQ_INT(r.generated_tokens, 2);
	KT_CHECK(r.ttft_s >= 0 && r.ttft_s <= r.total_s);
	/* the request went to the base URL's path */
	KT_CHECK(strncmp(g_canned.request, "POST /v1/chat/completions HTTP/1.1\r\n", 36) == 0);
	KT_CHECK(strstr(g_canned.request, "{\"messages\":[],\"stream\":true}") != NULL);
}

KT_CASE(send_reports_rejections_and_broken_streams)
{
	struct kcl_replay_result r;
	int rc;
	const char *ebody = "{\"error\":{\"message\":\"unknown role 'bogus'\",\"type\":\"invalid\"}}\n";
	char e400[512];
	snprintf(e400, sizeof e400, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
		 strlen(ebody), ebody);
	canned_run(e400, &r, &rc);
	KT_EQ_INT(rc, KV_OK);
	KT_CHECK(!r.ok);
	KT_EQ_INT(r.status, 400);
	KT_CHECKF(strstr(r.error, "unknown role 'bogus'") != NULL, "error: %s", r.error);
	KT_EQ_INT(r.prompt_tokens, -1);
	KT_EQ_INT(r.generated_tokens, -1);

	/* the stream stops before usage and [DONE]: connection closed */
	canned_run("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 5000\r\n\r\n"
		   "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
		   &r, &rc);
	KT_EQ_INT(rc, KV_OK);
	KT_CHECK(!r.ok);
	KT_CHECKF(strstr(r.error, "stream broken") != NULL, "error: %s", r.error);
	KT_CHECK(r.ttft_s >= 0);

	/* a complete stream without usage is not a success: nothing to measure */
	canned_run("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
		   "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n",
		   &r, &rc);
	KT_CHECK(!r.ok);
	KT_CHECKF(strstr(r.error, "no usage") != NULL, "error: %s", r.error);

	/* nobody listening */
	struct kcl_url u;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof a;
	KT_REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
		   getsockname(fd, (struct sockaddr *)&a, &al) == 0);
	char url[100];
	snprintf(url, sizeof url, "http://127.0.0.1:%d", ntohs(a.sin_port));
	close(fd);
	KT_OK(kcl_url_parse(url, &u));
	rc = kcl_replay_send(&u, "{}", 2, 2000, &r);
	KT_CHECK(rc != KV_OK);
	KT_EQ_INT(r.status, 0);
	KT_CHECK(!r.ok && r.error[0]);
}

/* --- statistics ----------------------------------------------------------------- */

KT_CASE(quantiles_interpolate_between_ranks)
{
	double a[] = {4, 1, 3, 2};
	KT_CHECK(kcl_replay_quantile(a, 4, 0.5) == 2.5);
	KT_CHECK(a[0] == 4 && a[1] == 1); /* input untouched */
	double b[10];
	for (int i = 0; i < 10; i++)
		b[i] = 10 - i; /* 10..1 */
	KT_CHECKF(fabs(kcl_replay_quantile(b, 10, 0.9) - 9.1) < 1e-12, "p90 %g", kcl_replay_quantile(b, 10, 0.9));
	KT_CHECK(kcl_replay_quantile(b, 10, 0.5) == 5.5);
	KT_CHECK(kcl_replay_quantile(b, 10, 0.0) == 1);
	KT_CHECK(kcl_replay_quantile(b, 10, 1.0) == 10);
	double one = 7;
	KT_CHECK(kcl_replay_quantile(&one, 1, 0.9) == 7);
	KT_CHECK(isnan(kcl_replay_quantile(NULL, 0, 0.5)));
	KT_CHECK(isnan(kcl_replay_quantile(b, 10, 1.5)));
	double c[] = {1, 2, 3, 4, 5};
	KT_CHECK(kcl_replay_quantile(c, 5, 0.5) == 3);
	KT_CHECK(fabs(kcl_replay_quantile(c, 5, 0.9) - 4.6) < 1e-12);
}

KT_CASE(summary_counts_ok_requests_only)
{
	struct kcl_replay_result r[4];
	memset(r, 0, sizeof r);
	r[0] = (struct kcl_replay_result){.ok = 1, .status = 200, .prompt_tokens = 1000, .cached_tokens = 0,
					  .generated_tokens = 16, .ttft_s = 2.0, .total_s = 2.5};
	r[1] = (struct kcl_replay_result){.ok = 1, .status = 200, .prompt_tokens = 1100, .cached_tokens = 1000,
					  .generated_tokens = 16, .ttft_s = 0.2, .total_s = 0.6};
	r[2] = (struct kcl_replay_result){.ok = 0, .status = 400, .prompt_tokens = -1, .cached_tokens = -1,
					  .generated_tokens = -1, .ttft_s = -1, .total_s = 0.01};
	r[3] = (struct kcl_replay_result){.ok = 1, .status = 200, .prompt_tokens = 900, .cached_tokens = -1,
					  .generated_tokens = 0, .ttft_s = -1, .total_s = 0.4};
	struct kcl_replay_summary s;
	kcl_replay_summarize(r, 4, &s);
	KT_EQ_INT(s.requests, 4);
	KT_EQ_INT(s.ok, 3);
	KT_EQ_INT(s.failed, 1);
	KT_EQ_INT(s.prompt_tokens, 3000);
	KT_EQ_INT(s.cached_tokens, 1000);
	KT_EQ_INT(s.generated_tokens, 32);
	KT_CHECK(fabs(s.reuse_ratio - 1000.0 / 3000.0) < 1e-12);
	KT_CHECK(fabs(s.ttft_p50_s - 1.1) < 1e-12); /* of {2.0, 0.2}: the request without a token is left out */
	KT_CHECK(fabs(s.total_p50_s - 0.6) < 1e-12);
	kcl_replay_summarize(r + 2, 1, &s);
	KT_CHECK(isnan(s.reuse_ratio) && isnan(s.ttft_p50_s));
}

KT_MAIN(jsonl_keeps_bad_lines_in_place, jsonl_rejects_deep_nesting_without_crashing,
	folder_mode_sorts_by_name_with_numbers, prepare_changes_only_the_documented_fields, sse_usage_and_first_token,
	sse_reasoning_and_tool_calls_count_as_tokens, sse_last_usage_wins_and_bad_events_are_counted,
	send_measures_a_streamed_response, send_reports_rejections_and_broken_streams, quantiles_interpolate_between_ranks,
	summary_counts_ok_requests_only)
