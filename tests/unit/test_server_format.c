/*
 * test_server_format.c - the pure parts of the server: request validation
 * (every refusal names its field), the OpenAI response and SSE chunk
 * formats (checked by parsing them back), the stop-string matcher and the
 * reasoning splitter fed at every split point, the metrics text format.
 */
#include "kt.h"
#include "base/buf.h"
#include "base/err.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/wire.h"
#include "text/output.h"
#include "text/toolcall.h"
#include "server/request.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>

static int parse(int api, const char *body, struct ksv_req *r)
{
	return ksv_req_parse(api, body, strlen(body), 64, r);
}

/* Expect KV_ERR_INVALID naming `param` in both the message and err_param. */
static void expect_bad(int api, const char *body, const char *param, int line)
{
	struct ksv_req r;
	int rc = parse(api, body, &r);
	if (rc != KV_ERR_INVALID)
		kt_fail(__FILE__, line, "accepted (rc %d): %s", rc, body);
	else if (strcmp(r.err_param, param) || !strstr(kv_errmsg(), param))
		kt_fail(__FILE__, line, "param '%s' (message '%s'), wanted '%s'", r.err_param, kv_errmsg(), param);
	ksv_req_free(&r);
}
#define BAD(api, body, param) expect_bad(api, body, param, __LINE__)

KT_CASE(request_agent_shapes)
{
	const char *body =
		"{\"model\":\"m\",\"stream\":true,\"stream_options\":{\"include_usage\":true},"
		"\"messages\":["
		"{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"be brief\"}]},"
		"{\"role\":\"developer\",\"content\":\"dev\"},"
		"{\"role\":\"user\",\"content\":\"hi\"},"
		"{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
		"\"function\":{\"name\":\"read\",\"arguments\":\"{\\\"p\\\":1}\"}}]},"
		"{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]},"
		"{\"role\":\"tool\",\"tool_call_id\":\"call_2\",\"content\":\"ok2\"}],"
		"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"read\",\"parameters\":{\"type\":\"object\"}}}],"
		"\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"read\"}},"
		"\"max_tokens\":5,\"max_completion_tokens\":7,\"temperature\":0,\"top_p\":0.5,\"top_k\":-1,\"min_p\":0.1,"
		"\"seed\":-3,\"stop\":[\"a\",\"bb\"],\"logprobs\":true,\"top_logprobs\":20,\"n\":1,"
		"\"presence_penalty\":0.5,\"frequency_penalty\":-2,\"repetition_penalty\":1.1,\"parallel_tool_calls\":true,\"user\":\"u\",\"some_extension\":{\"x\":[1]},"
		"\"chat_template_kwargs\":{\"enable_thinking\":false}}";
	struct ksv_req r;
	KT_OK(parse(KSV_API_CHAT, body, &r));
	KT_EQ_STR(r.model, "m");
	KT_EQ_INT(r.stream, 1);
	KT_EQ_INT(r.include_usage, 1);
	KT_EQ_INT(json_array_size(r.messages), 6);
	/* accepted as sent; kv_chat_prepare_messages maps it to system at render */
	KT_EQ_STR(json_string_value(json_object_get(json_array_get(r.messages, 1), "role")), "developer");
	KT_EQ_INT(r.tool_choice, KSV_TC_NAMED);
	KT_EQ_STR(r.tool_name, "read");
	KT_EQ_INT(r.max_tokens, 7);
	KT_CHECK(r.sp.v[KV_GC_TEMPERATURE] == 0 && r.sp.v[KV_GC_TOP_P] == 0.5 && r.sp.v[KV_GC_TOP_K] == 0 &&
		 r.sp.v[KV_GC_MIN_P] == 0.1);
	KT_CHECK(r.sp.v[KV_GC_PRESENCE_PENALTY] == 0.5 && r.sp.v[KV_GC_FREQUENCY_PENALTY] == -2 &&
		 r.sp.v[KV_GC_REPETITION_PENALTY] == 1.1);
	KT_EQ_INT(r.sp.set, (1u << KV_GC_N) - 1 + KSV_SP_SEED); /* every field given */
	KT_EQ_U64(r.sp.seed, (uint64_t)-3);
	/* the request wins field by field; the rest comes from the defaults */
	struct kv_gencfg d;
	kv_gencfg_openai(&d);
	d.v[KV_GC_TEMPERATURE] = 0.6;
	d.v[KV_GC_TOP_K] = 20;
	struct ke_sample_params sp;
	ksv_sampling_resolve(&r.sp, &d, 99, &sp);
	KT_CHECK(sp.temperature == 0 && sp.top_k == 0 && sp.top_p == 0.5 && sp.presence_penalty == 0.5 &&
		 sp.frequency_penalty == -2 && sp.repetition_penalty == 1.1 && sp.seed == (uint64_t)-3);
	KT_EQ_INT(r.n_stop, 2);
	KT_EQ_INT(r.logprobs, 1);
	KT_EQ_INT(r.top_logprobs, 20);
	KT_EQ_INT(r.enable_thinking, 0);
	ksv_req_free(&r);

	KT_OK(parse(KSV_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[],\"stop\":\"s\"}", &r));
	KT_CHECK(r.tools == NULL);
	KT_EQ_INT(r.max_tokens, -1);
	KT_EQ_INT(r.sp.set, 0); /* nothing given: every field from the defaults */
	ksv_sampling_resolve(&r.sp, &d, 99, &sp);
	KT_CHECK(sp.temperature == 0.6 && sp.top_k == 20 && sp.top_p == 1 && sp.min_p == 0 && sp.presence_penalty == 0 &&
		 sp.frequency_penalty == 0 && sp.repetition_penalty == 1 && sp.seed == 99);
	KT_EQ_INT(r.n_stop, 1);
	ksv_req_free(&r);
}

KT_CASE(request_errors_name_the_field)
{
	const int C = KSV_API_CHAT;
	BAD(C, "[1,2]", "body");
	BAD(C, "{}", "messages");
	BAD(C, "{\"messages\":{}}", "messages");
	BAD(C, "{\"messages\":[]}", "messages");
	BAD(C, "{\"messages\":[1]}", "messages[0]");
	BAD(C, "{\"messages\":[{\"content\":\"x\"}]}", "messages[0].role");
	BAD(C, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages[0].role");
	BAD(C, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content");
	BAD(C, "{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content");
	BAD(C, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", "messages[0].content[0]");
	BAD(C, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":3}]}]}",
	    "messages[0].content[0].text");
	BAD(C, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages[0].tool_call_id");
	BAD(C, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":1}}]}]}",
	    "messages[0].tool_calls[0].function.name");
	BAD(C, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":1}}]}]}",
	    "messages[0].tool_calls[0].function.arguments");
	BAD(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}", "messages[0].tool_calls");
	const char *M = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
	char b[512];
#define B(extra, param) do { snprintf(b, sizeof b, "{%s,%s}", M, extra); BAD(C, b, param); } while (0)
	B("\"model\":3", "model");
	B("\"stream\":\"yes\"", "stream");
	B("\"stream_options\":{\"include_usage\":1}", "stream_options.include_usage");
	B("\"max_tokens\":\"5\"", "max_tokens");
	B("\"max_tokens\":0", "max_tokens");
	B("\"max_tokens\":1.5", "max_tokens");
	B("\"max_completion_tokens\":-1", "max_completion_tokens");
	B("\"temperature\":3", "temperature");
	B("\"temperature\":\"hot\"", "temperature");
	B("\"top_p\":0", "top_p");
	B("\"top_k\":-2", "top_k");
	B("\"min_p\":2", "min_p");
	B("\"seed\":1.5", "seed");
	B("\"stop\":5", "stop");
	B("\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]", "stop");
	B("\"stop\":[\"\"]", "stop");
	B("\"logprobs\":1", "logprobs");
	B("\"logprobs\":true,\"top_logprobs\":21", "top_logprobs");
	B("\"top_logprobs\":2", "top_logprobs");
	B("\"n\":2", "n");
	B("\"presence_penalty\":2.5", "presence_penalty");
	B("\"presence_penalty\":\"x\"", "presence_penalty");
	B("\"frequency_penalty\":-2.01", "frequency_penalty");
	B("\"repetition_penalty\":0", "repetition_penalty");
	B("\"repetition_penalty\":-1", "repetition_penalty");
	B("\"min_p\":-0.1", "min_p");
	B("\"top_k\":2.5", "top_k");
	B("\"logit_bias\":{\"1\":5}", "logit_bias");
	B("\"response_format\":{\"type\":\"yaml\"}", "response_format.type");
	B("\"response_format\":{\"type\":\"json_schema\"}", "response_format.json_schema");
	B("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":3}}", "response_format.json_schema.schema");
	B("\"response_format\":{\"type\":\"json_object\"},\"grammar\":\"root ::= \\\"a\\\"\"", "grammar");
	B("\"grammar\":5", "grammar");
	B("\"json_schema\":[]", "json_schema");
	B("\"parallel_tool_calls\":\"yes\"", "parallel_tool_calls");
	B("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":1}}]", "tools[0].function.strict");
	B("\"tools\":{}", "tools");
	B("\"tools\":[{\"type\":\"function\"}]", "tools[0].function");
	B("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]", "tools[0].function.parameters");
	B("\"tool_choice\":\"sometimes\"", "tool_choice");
	B("\"tool_choice\":\"required\"", "tool_choice");
	B("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
	  "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}", "tool_choice");
	B("\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}", "chat_template_kwargs.enable_thinking");
#undef B
	/* malformed and deeply nested JSON */
	struct ksv_req r;
	KT_EQ_INT(parse(C, "{\"messages\":[", &r), KV_ERR_INVALID);
	ksv_req_free(&r);
	char deep[600];
	memset(deep, '[', 300);
	memset(deep + 300, ']', 300);
	KT_EQ_INT(ksv_req_parse(C, deep, 600, 64, &r), KV_ERR_INVALID);
	KT_CHECK(strstr(kv_errmsg(), "nested") != NULL);
	ksv_req_free(&r);
}

KT_CASE(request_completions)
{
	struct ksv_req r;
	KT_OK(parse(KSV_API_COMPLETION, "{\"prompt\":\"hello\",\"logprobs\":3}", &r));
	KT_EQ_STR(r.prompt, "hello");
	KT_EQ_INT(r.logprobs, 1);
	KT_EQ_INT(r.top_logprobs, 3);
	ksv_req_free(&r);
	KT_OK(parse(KSV_API_COMPLETION, "{\"prompt\":[[1,2,3]]}", &r));
	KT_EQ_INT(r.n_prompt_ids, 3);
	KT_EQ_INT(r.prompt_ids[2], 3);
	ksv_req_free(&r);
	KT_OK(parse(KSV_API_COMPLETION, "{\"prompt\":[\"one\"]}", &r));
	KT_EQ_STR(r.prompt, "one");
	ksv_req_free(&r);
	BAD(KSV_API_COMPLETION, "{}", "prompt");
	BAD(KSV_API_COMPLETION, "{\"prompt\":\"\"}", "prompt");
	BAD(KSV_API_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", "prompt");
	BAD(KSV_API_COMPLETION, "{\"prompt\":[1,-2]}", "prompt");
	BAD(KSV_API_COMPLETION, "{\"prompt\":\"x\",\"echo\":true}", "echo");
	BAD(KSV_API_COMPLETION, "{\"prompt\":\"x\",\"best_of\":3}", "best_of");
	BAD(KSV_API_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":true}", "logprobs");
}

/* Split an SSE text into its JSON events (parsed); returns the count. */
static int sse_events(const char *text, json_t **ev, int cap, int *done)
{
	int n = 0;
	*done = 0;
	const char *p = text;
	while ((p = strstr(p, "data: "))) {
		p += 6;
		const char *e = strstr(p, "\n\n");
		if (!e)
			break;
		if ((size_t)(e - p) == 6 && !strncmp(p, "[DONE]", 6))
			*done = 1;
		else if (n < cap)
			ev[n++] = json_loadb(p, (size_t)(e - p), 0, NULL);
		p = e + 2;
	}
	return n;
}

#define JS(obj, path) json_string_value(json_object_get(obj, path))

/* A token table of four tokens: 0 "\xe4\xbd", 1 "a", 2 "\xff", 3 "ab", 4 "c". */
static struct kv_tok_bytes tiny_tb(void)
{
	static uint32_t off[] = {0, 2, 3, 4, 6};
	static uint32_t len[] = {2, 1, 1, 2, 1};
	static char data[] = "\xe4\xbd" "a" "\xff" "ab" "c";
	struct kv_tok_bytes t = {.n = 5, .off = off, .len = len, .data = data};
	return t;
}

static void feed_ev(struct ksv_answer *a, int kind, const char *text, const char *name, struct kv_buf *out)
{
	struct kv_out_ev e = {.kind = kind, .text = text, .len = text ? strlen(text) : 0, .name = name};
	ksv_answer_event(a, &e, out);
}

KT_CASE(chat_stream_chunks)
{
	struct ksv_answer o;
	struct kv_buf b = KV_BUF_INIT;
	struct kv_tok_bytes tb = tiny_tb();
	ksv_answer_init(&o, &ksv_wire_openai, KSV_API_CHAT, "tiny", 1);
	o.tb = &tb;
	o.include_usage = 1;
	o.logprobs = 1;
	KT_CHECK(!strncmp(o.id, "chatcmpl-", 9));
	o.w->start(&o, &b);
	struct kss_token t = {.id = 0, .logprob = -0.25f, .n_top = 2, .top_id = {1, 2}, .top_lp = {-0.25f, -1.5f}};
	ksv_answer_token(&o, &t);
	feed_ev(&o, KV_OUT_CONTENT, "Hel", NULL, &b);
	o.w->step(&o, &b);
	feed_ev(&o, KV_OUT_TOOL_START, NULL, "read_file", &b);
	feed_ev(&o, KV_OUT_TOOL_ARGS, "{\"pa", NULL, &b);
	feed_ev(&o, KV_OUT_TOOL_ARGS, "th\": 1}", NULL, &b);
	feed_ev(&o, KV_OUT_TOOL_END, NULL, NULL, &b);
	o.usage = (struct kss_usage){.prompt_tokens = 10, .completion_tokens = 4, .cached_tokens = 8};
	o.finish = "tool_calls";
	o.w->finish(&o, &b);
	KT_REQUIRE(!b.oom);
	json_t *ev[16];
	int done;
	int n = sse_events(b.p, ev, 16, &done);
	KT_EQ_INT(n, 7);
	KT_EQ_INT(done, 1);
	for (int i = 0; i < n; i++) {
		KT_REQUIRE(ev[i]);
		KT_EQ_STR(JS(ev[i], "id"), o.id);
		KT_EQ_STR(JS(ev[i], "object"), "chat.completion.chunk");
		KT_EQ_STR(JS(ev[i], "model"), "tiny");
		KT_CHECK(json_is_integer(json_object_get(ev[i], "created")));
		KT_CHECK(json_object_get(ev[i], "usage") != NULL); /* null except the last */
	}
	json_t *d0 = json_object_get(json_array_get(json_object_get(ev[0], "choices"), 0), "delta");
	KT_EQ_STR(JS(d0, "role"), "assistant");
	KT_EQ_STR(JS(d0, "content"), "");
	json_t *c1 = json_array_get(json_object_get(ev[1], "choices"), 0);
	KT_EQ_STR(JS(json_object_get(c1, "delta"), "content"), "Hel");
	KT_CHECK(json_is_null(json_object_get(c1, "finish_reason")));
	json_t *lpc = json_array_get(json_object_get(json_object_get(c1, "logprobs"), "content"), 0);
	KT_REQUIRE(lpc);
	KT_CHECK(json_real_value(json_object_get(lpc, "logprob")) == -0.25);
	KT_EQ_INT(json_array_size(json_object_get(lpc, "bytes")), 2);
	KT_EQ_INT(json_integer_value(json_array_get(json_object_get(lpc, "bytes"), 0)), 0xe4);
	KT_EQ_STR(JS(lpc, "token"), "\xEF\xBF\xBD\xEF\xBF\xBD"); /* invalid alone: U+FFFD each */
	json_t *top = json_object_get(lpc, "top_logprobs");
	KT_EQ_INT(json_array_size(top), 2);
	KT_CHECK(json_real_value(json_object_get(json_array_get(top, 1), "logprob")) == -1.5);
	json_t *tc = json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(ev[2], "choices"), 0),
									"delta"), "tool_calls"), 0);
	KT_EQ_INT(json_integer_value(json_object_get(tc, "index")), 0);
	KT_CHECK(!strncmp(JS(tc, "id"), "call_", 5) && strlen(JS(tc, "id")) == 29);
	KT_EQ_STR(JS(tc, "type"), "function");
	KT_EQ_STR(JS(json_object_get(tc, "function"), "name"), "read_file");
	KT_EQ_STR(JS(json_object_get(tc, "function"), "arguments"), "");
	/* argument pieces concatenate to the JSON */
	char args[64] = "";
	for (int i = 3; i <= 4; i++) {
		json_t *t = json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(ev[i], "choices"), 0),
									   "delta"), "tool_calls"), 0);
		KT_CHECK(json_object_get(t, "id") == NULL);
		strcat(args, JS(json_object_get(t, "function"), "arguments"));
	}
	KT_EQ_STR(args, "{\"path\": 1}");
	json_t *c5 = json_array_get(json_object_get(ev[5], "choices"), 0);
	KT_EQ_STR(JS(c5, "finish_reason"), "tool_calls");
	KT_EQ_INT(json_array_size(json_object_get(ev[6], "choices")), 0);
	json_t *us = json_object_get(ev[6], "usage");
	KT_EQ_INT(json_integer_value(json_object_get(us, "prompt_tokens")), 10);
	KT_EQ_INT(json_integer_value(json_object_get(us, "completion_tokens")), 4);
	KT_EQ_INT(json_integer_value(json_object_get(us, "total_tokens")), 14);
	KT_EQ_INT(json_integer_value(json_object_get(json_object_get(us, "prompt_tokens_details"), "cached_tokens")), 8);
	for (int i = 0; i < n; i++)
		json_decref(ev[i]);
	kv_buf_free(&b);
	ksv_answer_free(&o);

	/* without include_usage there is no usage key and no usage chunk */
	ksv_answer_init(&o, &ksv_wire_openai, KSV_API_CHAT, "tiny", 1);
	o.w->start(&o, &b);
	feed_ev(&o, KV_OUT_CONTENT, "x", NULL, &b);
	n = sse_events(b.p, ev, 16, &done);
	KT_EQ_INT(n, 2);
	for (int i = 0; i < n; i++) {
		KT_CHECK(json_object_get(ev[i], "usage") == NULL);
		json_decref(ev[i]);
	}
	kv_buf_free(&b);
	ksv_answer_free(&o);
}

KT_CASE(chat_response_body)
{
	struct ksv_answer o;
	ksv_answer_init(&o, &ksv_wire_openai, KSV_API_CHAT, "tiny", 0);
	feed_ev(&o, KV_OUT_TOOL_START, NULL, "f", NULL);
	feed_ev(&o, KV_OUT_TOOL_ARGS, "{\"a\": 1}", NULL, NULL);
	feed_ev(&o, KV_OUT_TOOL_END, NULL, NULL, NULL);
	o.finish = "tool_calls";
	o.usage = (struct kss_usage){.prompt_tokens = 5, .completion_tokens = 3, .cached_tokens = 2};
	size_t len;
	char *s = o.w->body(&o, &len);
	KT_REQUIRE(s);
	json_t *j = json_loads(s, 0, NULL);
	KT_REQUIRE(j);
	KT_EQ_STR(JS(j, "object"), "chat.completion");
	json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
	json_t *m = json_object_get(ch, "message");
	KT_EQ_STR(JS(m, "role"), "assistant");
	KT_CHECK(json_is_null(json_object_get(m, "content")));
	json_t *tc = json_array_get(json_object_get(m, "tool_calls"), 0);
	KT_EQ_STR(JS(tc, "id"), o.blk[0].call_id);
	KT_EQ_INT(strlen(JS(tc, "id")), 29);
	KT_CHECK(!strncmp(JS(tc, "id"), "call_", 5));
	KT_EQ_STR(JS(json_object_get(tc, "function"), "arguments"), "{\"a\": 1}");
	KT_CHECK(json_is_null(json_object_get(ch, "logprobs")));
	KT_EQ_STR(JS(ch, "finish_reason"), "tool_calls");
	KT_EQ_INT(json_integer_value(json_object_get(json_object_get(json_object_get(j, "usage"), "prompt_tokens_details"),
						     "cached_tokens")), 2);
	json_decref(j);
	free(s);
	ksv_answer_free(&o);
}

KT_CASE(completion_bodies)
{
	struct ksv_answer o;
	struct kv_buf b = KV_BUF_INIT;
	struct kv_tok_bytes tb = tiny_tb();
	ksv_answer_init(&o, &ksv_wire_openai, KSV_API_COMPLETION, "tiny", 1);
	o.tb = &tb;
	o.logprobs = 1;
	o.w->start(&o, &b);
	struct kss_token t0 = {.id = 3, .logprob = -0.5f, .n_top = 1, .top_id = {3}, .top_lp = {-0.5f}};
	struct kss_token t1 = {.id = 4, .logprob = -2.0f};
	ksv_answer_token(&o, &t0);
	feed_ev(&o, KV_OUT_CONTENT, "ab", NULL, &b);
	ksv_answer_token(&o, &t1);
	feed_ev(&o, KV_OUT_CONTENT, "c", NULL, &b);
	o.finish = "length";
	o.w->finish(&o, &b);
	json_t *ev[4];
	int done;
	KT_EQ_INT(sse_events(b.p, ev, 4, &done), 3);
	json_t *c = json_array_get(json_object_get(ev[0], "choices"), 0);
	KT_EQ_STR(JS(ev[0], "object"), "text_completion");
	KT_EQ_STR(JS(c, "text"), "ab");
	json_t *lp = json_object_get(c, "logprobs");
	KT_EQ_INT(json_array_size(json_object_get(lp, "tokens")), 1);
	KT_CHECK(json_real_value(json_object_get(json_array_get(json_object_get(lp, "top_logprobs"), 0), "ab")) == -0.5);
	json_t *c2 = json_array_get(json_object_get(ev[1], "choices"), 0);
	KT_EQ_STR(JS(c2, "text"), "c");
	/* text offsets run on across chunks */
	KT_EQ_INT(json_integer_value(json_array_get(json_object_get(json_object_get(c2, "logprobs"), "text_offset"), 0)), 2);
	KT_EQ_STR(JS(json_array_get(json_object_get(ev[2], "choices"), 0), "finish_reason"), "length");
	for (int i = 0; i < 3; i++)
		json_decref(ev[i]);
	kv_buf_free(&b);
	ksv_answer_free(&o);
}

KT_CASE(error_bodies)
{
	static const int st[] = {400, 404, 413, 500, 503};
	static const char *types[] = {"invalid_request_error", "invalid_request_error", "invalid_request_error",
				      "server_error", "overloaded_error"};
	for (int i = 0; i < 5; i++) {
		size_t len;
		char *s = ksv_oai_error(st[i], "bad \"thing\"", i == 0 ? "messages[0].role" : NULL, &len);
		json_t *j = json_loads(s, 0, NULL);
		KT_REQUIRE(j);
		json_t *e = json_object_get(j, "error");
		KT_EQ_STR(JS(e, "message"), "bad \"thing\"");
		KT_EQ_STR(JS(e, "type"), types[i]);
		KT_CHECK(json_is_string(json_object_get(e, "code")));
		if (i == 0)
			KT_EQ_STR(JS(e, "param"), "messages[0].role");
		else
			KT_CHECK(json_is_null(json_object_get(e, "param")));
		json_decref(j);
		free(s);
	}
	json_t *t = ksv_json_text("a\xc3\x28z", 4);
	KT_EQ_STR(json_string_value(t), "a\xEF\xBF\xBD(z");
	json_decref(t);
}

/* --- output pipeline ---------------------------------------------------- */

struct collect {
	struct kv_buf content, reasoning, calls; /* calls: "name(args);" per call */
	int starts, ends;
};

static void collect_fn(void *ctx, const struct kv_out_ev *e)
{
	struct collect *c = ctx;
	if (e->kind == KV_OUT_CONTENT)
		kv_buf_add(&c->content, e->text, e->len);
	else if (e->kind == KV_OUT_REASONING)
		kv_buf_add(&c->reasoning, e->text, e->len);
	else if (e->kind == KV_OUT_TOOL_START) {
		kv_buf_printf(&c->calls, "%d:%s(", e->index, e->name);
		c->starts++;
	} else if (e->kind == KV_OUT_TOOL_ARGS)
		kv_buf_add(&c->calls, e->text, e->len);
	else if (e->kind == KV_OUT_TOOL_END) {
		kv_buf_adds(&c->calls, ");");
		c->ends++;
	}
}

/* Run text through the pipeline split at one point; return stop flag. */
static int run_split(const char *text, size_t split, const char *const *stop, size_t n_stop, int split_reasoning,
		     int in_think, struct collect *c)
{
	struct kv_out *o;
	struct kv_out_params p = {.stop = stop, .n_stop = n_stop, .split_reasoning = split_reasoning,
				   .in_think = in_think, .fn = collect_fn, .ctx = c};
	memset(c, 0, sizeof *c);
	if (kv_out_create(&p, &o))
		return -1;
	int hit = kv_out_feed(o, text, split);
	if (!hit)
		hit = kv_out_feed(o, text + split, strlen(text) - split);
	kv_out_finish(o);
	kv_out_destroy(o);
	return hit;
}

static const char *cs(struct kv_buf *b)
{
	return b->p ? b->p : "";
}

KT_CASE(stop_strings_every_split)
{
	const char *stop[] = {"END", "ab\xc3\xa9"};
	const char *text = "xxaEN ab\xc3 ab\xc3\xa9 tail END more";
	for (size_t s = 0; s <= strlen(text); s++) {
		struct collect c;
		int hit = run_split(text, s, stop, 2, 0, 0, &c);
		KT_EQ_INT(hit, 1);
		KT_CHECKF(!strcmp(cs(&c.content), "xxaEN ab\xc3 "), "split %zu: '%s'", s, cs(&c.content));
		kv_buf_free(&c.content);
		kv_buf_free(&c.reasoning);
	}
	/* no match: everything comes out, including a held partial "EN" */
	struct collect c;
	KT_EQ_INT(run_split("abcEN", 3, stop, 2, 0, 0, &c), 0);
	KT_EQ_STR(cs(&c.content), "abcEN");
	kv_buf_free(&c.content);
	int hit;
	KT_EQ_U64(kv_out_stop_scan("helloEN", 7, stop, 2, &hit), 5);
	KT_EQ_INT(hit, 0);
	KT_EQ_U64(kv_out_stop_scan("heENDlo", 7, stop, 2, &hit), 2);
	KT_EQ_INT(hit, 1);
}

KT_CASE(reasoning_split_every_split)
{
	const char *text = "\n<think>\nplan: a<b</think>\n\nanswer </thin";
	for (size_t s = 0; s <= strlen(text); s++) {
		struct collect c;
		run_split(text, s, NULL, 0, 1, 0, &c);
		KT_CHECKF(!strcmp(cs(&c.reasoning), "\nplan: a<b"), "split %zu reasoning '%s'", s, cs(&c.reasoning));
		KT_CHECKF(!strcmp(cs(&c.content), "answer </thin"), "split %zu content '%s'", s, cs(&c.content));
		kv_buf_free(&c.content);
		kv_buf_free(&c.reasoning);
	}
	/* no think block: all content, even "<thi" at the very start */
	struct collect c;
	run_split("<thinker>", 2, NULL, 0, 1, 0, &c);
	KT_EQ_STR(cs(&c.content), "<thinker>");
	KT_EQ_STR(cs(&c.reasoning), "");
	kv_buf_free(&c.content);
	kv_buf_free(&c.reasoning);
	/* prompt opened the block */
	run_split("deep</think>out", 5, NULL, 0, 1, 1, &c);
	KT_EQ_STR(cs(&c.reasoning), "deep");
	KT_EQ_STR(cs(&c.content), "out");
	kv_buf_free(&c.content);
	kv_buf_free(&c.reasoning);
	/* split off: raw text */
	run_split("<think>x</think>y", 3, NULL, 0, 0, 0, &c);
	KT_EQ_STR(cs(&c.content), "<think>x</think>y");
	kv_buf_free(&c.content);
	kv_buf_free(&c.reasoning);
	/* unfinished think at the end stays reasoning */
	run_split("<think>abc</th", 9, NULL, 0, 1, 0, &c);
	KT_EQ_STR(cs(&c.reasoning), "abc</th");
	kv_buf_free(&c.content);
	kv_buf_free(&c.reasoning);
}

/* --- metrics -------------------------------------------------------------- */

static void scrape_cb(void *ctx, struct ksv_metrics *m)
{
	(void)m;
	ksv_metrics_set(ctx, 42);
}

KT_CASE(metrics_text_format)
{
	struct ksv_metrics *m = ksv_metrics_create();
	KT_REQUIRE(m);
	struct ksv_family *req = ksv_metrics_family(m, "kvkeep_requests_total", "Requests.", KSV_COUNTER, NULL, 0);
	static const double bk[] = {0.1, 1};
	struct ksv_family *h = ksv_metrics_family(m, "kvkeep_ttft_seconds", "TTFT\nline", KSV_HISTOGRAM, bk, 2);
	struct ksv_family *g = ksv_metrics_family(m, "kvkeep_gauge", "G.", KSV_GAUGE, NULL, 0);
	KT_CHECK(ksv_metrics_family(m, "bad name", "x", KSV_GAUGE, NULL, 0) == NULL);
	KT_CHECK(ksv_metrics_family(m, "kvkeep_requests_total", "again", KSV_COUNTER, NULL, 0) == req);
	ksv_metrics_on_scrape(m, scrape_cb, g);
	ksv_series_add(ksv_series_get(req, "route", "/v1/x", "status", "200", NULL), 2);
	ksv_series_add(ksv_series_get(req, "route", "/v1/x", "status", "200", NULL), 1);
	ksv_series_add(ksv_series_get(req, "route", "we\"ird\\", "status", "4\n", NULL), 1);
	ksv_series_add(ksv_series_get(req, "route", "/v1/x", "status", "200", NULL), -5); /* ignored */
	ksv_metrics_observe(h, 0.05);
	ksv_metrics_observe(h, 0.5);
	ksv_metrics_observe(h, 7);
	struct kv_buf b = KV_BUF_INIT;
	ksv_metrics_render(m, &b);
	const char *want[] = {
		"# HELP kvkeep_requests_total Requests.\n# TYPE kvkeep_requests_total counter\n",
		"kvkeep_requests_total{route=\"/v1/x\",status=\"200\"} 3\n",
		"kvkeep_requests_total{route=\"we\\\"ird\\\\\",status=\"4\\n\"} 1\n",
		"# HELP kvkeep_ttft_seconds TTFT\\nline\n# TYPE kvkeep_ttft_seconds histogram\n",
		"kvkeep_ttft_seconds_bucket{le=\"0.10000000000000001\"} 1\n",
		"kvkeep_ttft_seconds_bucket{le=\"1\"} 2\n",
		"kvkeep_ttft_seconds_bucket{le=\"+Inf\"} 3\n",
		"kvkeep_ttft_seconds_sum 7.5499999999999998\n",
		"kvkeep_ttft_seconds_count 3\n",
		"kvkeep_gauge 42\n",
	};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
		KT_CHECKF(strstr(cs(&b), want[i]) != NULL, "missing: %s\n--- got:\n%s", want[i], cs(&b));
	kv_buf_free(&b);
	ksv_metrics_destroy(m);
}

static void free_collect(struct collect *c)
{
	kv_buf_free(&c->content);
	kv_buf_free(&c->reasoning);
	kv_buf_free(&c->calls);
}

/* Text through stop matcher, reasoning splitter and tool-call parser, split
 * at every byte: the same content, reasoning and calls come out. */
static void tool_pipeline_case(const char *text, int xml, const char *const *stop, size_t n_stop, const char *want_content,
			       const char *want_reasoning, const char *want_calls, int line)
{
	json_t *tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"read_file\", \"parameters\": "
				   "{\"type\": \"object\", \"properties\": {\"path\": {\"type\": \"string\"}, "
				   "\"n\": {\"type\": \"integer\"}}}}}]", 0, NULL);
	for (size_t split = 0; split <= strlen(text); split++) {
		struct collect c;
		struct kv_out *o;
		struct kv_out_params p = {.stop = stop, .n_stop = n_stop, .split_reasoning = 1, .tools = tools,
					   .xml_tools = xml, .fn = collect_fn, .ctx = &c};
		memset(&c, 0, sizeof c);
		if (kv_out_create(&p, &o)) {
			kt_fail(__FILE__, line, "create: %s", kv_errmsg());
			break;
		}
		if (kv_out_feed(o, text, split) != 1)
			kv_out_feed(o, text + split, strlen(text) - split);
		kv_out_finish(o);
		int ok = !strcmp(cs(&c.content), want_content) && !strcmp(cs(&c.reasoning), want_reasoning) &&
			 !strcmp(cs(&c.calls), want_calls) && c.starts == c.ends && c.starts == kv_out_n_tool_calls(o);
		if (!ok) {
			kt_fail(__FILE__, line, "split %zu: content '%s' reasoning '%s' calls '%s' (%d/%d)", split,
				cs(&c.content), cs(&c.reasoning), cs(&c.calls), c.starts, c.ends);
			kv_out_destroy(o);
			free_collect(&c);
			break;
		}
		kv_out_destroy(o);
		free_collect(&c);
	}
	json_decref(tools);
}

KT_CASE(tool_calls_through_the_pipeline)
{
	/* Qwen3 JSON form, two calls, text before, reasoning first */
	tool_pipeline_case("<think>look</think>\n\nLet me look.\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": "
			   "{\"path\": \"a.c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"grep\", \"arguments\": {}}\n"
			   "</tool_call>",
			   0, NULL, 0, "Let me look.\n", "look", "0:read_file({\"path\": \"a.c\"});1:grep({});", __LINE__);
	/* Qwen3.5 XML form: parameters coerced with the schema */
	tool_pipeline_case("<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/x.c\n</parameter>\n<parameter=n>\n"
			   "12\n</parameter>\n</function>\n</tool_call>",
			   1, NULL, 0, "", "", "0:read_file({\"path\": \"src/x.c\", \"n\": 12});", __LINE__);
	/* malformed call: returned as content, nothing dropped */
	tool_pipeline_case("<tool_call>\n{\"name\": oops}\n</tool_call>", 0, NULL, 0,
			   "<tool_call>\n{\"name\": oops}\n</tool_call>", "", "", __LINE__);
	/* a stop string inside the text ends it before the call */
	const char *stop[] = {"STOP"};
	tool_pipeline_case("abc STOP <tool_call>\n{\"name\": \"read_file\", \"arguments\": {}}\n</tool_call>", 0, stop, 1,
			   "abc ", "", "", __LINE__);
}

/* The SSE shape of a streamed tool call, from the events the pipeline
 * makes: start chunk with id/type/name, then argument pieces. */
KT_CASE(tool_call_sse_from_pipeline)
{
	json_t *tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]", 0, NULL);
	struct collect c;
	struct kv_out *o;
	memset(&c, 0, sizeof c);
	struct kv_out_params p = {.tools = tools, .fn = collect_fn, .ctx = &c};
	KT_OK(kv_out_create(&p, &o));
	const char *t = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>";
	for (size_t i = 0; t[i]; i++)
		kv_out_feed(o, t + i, 1);
	kv_out_finish(o);
	KT_EQ_INT(kv_out_n_tool_calls(o), 1);
	KT_EQ_STR(cs(&c.calls), "0:f({\"x\": [1, 2]});");
	kv_out_destroy(o);
	free_collect(&c);
	json_decref(tools);
}

/* NUL inside a name: the full string is compared, so each is a 400. */
KT_CASE(request_nul_in_names)
{
	const int C = KSV_API_CHAT;
	BAD(C, "{\"messages\":[{\"role\":\"user\\u0000\",\"content\":\"x\"}]}", "messages[0].role");
	BAD(C, "{\"messages\":[{\"role\":\"user\\u0000x\",\"content\":\"x\"}]}", "messages[0].role");
	BAD(C, "{\"model\":\"m\\u0000x\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "model");
	BAD(C, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\\u0000\",\"text\":\"a\"}]}]}",
	    "messages[0].content[0]");
	BAD(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\\u0000\","
	       "\"function\":{\"name\":\"f\"}}]}", "tools[0].type");
	BAD(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
	       "\"function\":{\"name\":\"f\\u0000g\"}}]}", "tools[0].function.name");
	BAD(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"auto\\u0000\"}", "tool_choice");
	/* NUL inside content is text, and stays accepted */
	struct ksv_req r;
	KT_OK(parse(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", &r));
	ksv_req_free(&r);
}

/* Tool schemas with numbers beyond int64 or double are valid requests. */
KT_CASE(request_big_numbers_in_tools)
{
	struct ksv_req r;
	KT_OK(parse(KSV_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
				  "\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"n\":"
				  "{\"type\":\"integer\",\"maximum\":18446744073709551615,\"minimum\":-1e400}}}}}]}",
		    &r));
	KT_CHECK(r.tools != NULL);
	ksv_req_free(&r);
	/* where a number is wanted, such a literal is still a 400 */
	BAD(KSV_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":18446744073709551616}",
	    "max_tokens");
}

/* GPT-OSS harmony output through the pipeline, cut into two pieces at
 * one point (tools on when tools != 0). */
static int run_hm(const char *text, size_t split, const char *const *stop, size_t n_stop, int split_reasoning,
		  int tools, struct collect *c)
{
	struct kv_out *o;
	json_t *t = tools ? json_array() : NULL;
	struct kv_out_params p = {.stop = stop, .n_stop = n_stop, .split_reasoning = split_reasoning, .harmony = 1,
				  .tools = t, .fn = collect_fn, .ctx = c};
	memset(c, 0, sizeof *c);
	if (kv_out_create(&p, &o)) {
		json_decref(t);
		return -1;
	}
	int hit = kv_out_feed(o, text, split);
	if (!hit)
		hit = kv_out_feed(o, text + split, strlen(text) - split);
	kv_out_finish(o);
	if (hit >= 0)
		hit = hit * 100 + kv_out_n_tool_calls(o);
	kv_out_destroy(o);
	json_decref(t);
	return hit;
}

static void collect_free(struct collect *c)
{
	kv_buf_free(&c->content);
	kv_buf_free(&c->reasoning);
	kv_buf_free(&c->calls);
}

struct hm_case {
	const char *text;
	int split_reasoning, tools;
	const char *reasoning, *content, *calls;
	int n_calls;
};

KT_CASE(harmony_channels_every_split)
{
	static const struct hm_case cases[] = {
		/* analysis, then a call in the model's header form, ended by the
		 * stop token <|call|> (never fed): the end of the output closes it */
		{"<|channel|>analysis<|message|>Need <|w|> a<b.<|end|><|start|>assistant<|channel|>commentary "
		 "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
		 1, 1, "Need <|w|> a<b.", "", "0:get_weather({\"city\": \"Paris\"});", 1},
		/* analysis then final; a literal <|call|> closes a call too */
		{"<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>Hello "
		 "<b>x</b><|return|>",
		 1, 1, "think", "Hello <b>x</b>", "", 0},
		{"<|channel|>commentary to=functions.a <|constrain|>json<|message|>{}<|call|>\n<|start|>assistant to=b"
		 "<|channel|>commentary json<|message|> {\"k\":[1]} <|call|>",
		 1, 1, "", "", "0:a({});1:b({\"k\":[1]});", 2},
		/* commentary without a recipient is content; tools off: a call's body too */
		{"<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant<|channel|>commentary "
		 "to=functions.f<|message|>{\"q\":1}<|call|>",
		 1, 0, "", "Let me look.{\"q\":1}", "", 0},
		/* split_reasoning off: analysis is content */
		{"<|channel|>analysis<|message|>A<|end|><|start|>assistant<|channel|>final<|message|>B", 0, 1, "", "AB",
		 "", 0},
		/* not harmony: everything is content, markers and all */
		{"plain <|message text", 1, 1, "", "plain <|message text", "", 0},
		{"<|channel|>final<|message|>ok<|end|> stray <|end|>", 1, 1, "", "okstray <|end|>", "", 0},
	};
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		const struct hm_case *hc = &cases[k];
		for (size_t s = 0; s <= strlen(hc->text); s++) {
			struct collect c;
			int r = run_hm(hc->text, s, NULL, 0, hc->split_reasoning, hc->tools, &c);
			KT_CHECKF(r == hc->n_calls, "case %zu split %zu: %d calls", k, s, r);
			KT_CHECKF(!strcmp(cs(&c.reasoning), hc->reasoning), "case %zu split %zu reasoning '%s'", k, s,
				  cs(&c.reasoning));
			KT_CHECKF(!strcmp(cs(&c.content), hc->content), "case %zu split %zu content '%s'", k, s,
				  cs(&c.content));
			KT_CHECKF(!strcmp(cs(&c.calls), hc->calls), "case %zu split %zu calls '%s'", k, s, cs(&c.calls));
			collect_free(&c);
		}
	}
}

KT_CASE(harmony_long_header_and_stop)
{
	/* a header that never reaches <|message|> is given up after
	 * KV_HM_MAX_HEADER bytes: the text is content, nothing lost */
	char big[2000];
	for (size_t i = 0; i < sizeof big - 1; i++)
		big[i] = (char)('a' + i % 26);
	big[sizeof big - 1] = 0;
	struct collect c;
	KT_EQ_INT(run_hm(big, 700, NULL, 0, 1, 1, &c), 0);
	KT_EQ_STR(cs(&c.content), big);
	collect_free(&c);
	/* stop strings see the whole text, markers included */
	const char *stop[] = {"STOP"};
	KT_EQ_INT(run_hm("<|channel|>analysis<|message|>ab STOP cd", 5, stop, 1, 1, 1, &c), 100);
	KT_EQ_STR(cs(&c.reasoning), "ab ");
	collect_free(&c);
	/* a commentary call split anywhere in its header */
	const char *op = "<|channel|>commentary to=functions.read_file <|constrain|>json<|message|>";
	struct kv_buf t = KV_BUF_INIT;
	kv_buf_adds(&t, op);
	kv_buf_adds(&t, "{\"path\":\"a.c\"}");
	KT_EQ_INT(run_hm(t.p, strlen(op), NULL, 0, 1, 1, &c), 1);
	KT_EQ_STR(cs(&c.calls), "0:read_file({\"path\":\"a.c\"});");
	collect_free(&c);
	kv_buf_reset(&t);
	kv_buf_adds(&t, "<|channel|>commentary to=functions.ls <|constrain|>json<|message|>{}");
	KT_EQ_INT(run_hm(t.p, 3, NULL, 0, 1, 1, &c), 1);
	KT_EQ_STR(cs(&c.calls), "0:ls({});");
	collect_free(&c);
	kv_buf_free(&t);
}

KT_MAIN(request_agent_shapes, request_errors_name_the_field, request_completions, chat_stream_chunks,
	chat_response_body, completion_bodies, error_bodies, stop_strings_every_split, reasoning_split_every_split,
	tool_calls_through_the_pipeline, tool_call_sse_from_pipeline, metrics_text_format, request_nul_in_names,
	request_big_numbers_in_tools, harmony_channels_every_split, harmony_long_header_and_stop)
