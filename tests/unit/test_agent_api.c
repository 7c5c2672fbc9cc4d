/*
 * test_agent_api.c - the Anthropic Messages and OpenAI Responses
 * translations (anthropic.h, responses.h): bodies as Claude Code and Codex
 * send them become chat bodies that request.c accepts, with the right
 * messages; malformed bodies are refused naming the field; the event
 * formatters produce the documented event order and bodies.
 */
#include "kt.h"
#include "base/buf.h"
#include "base/err.h"
#include "server/anthropic.h"
#include "server/normalize.h"
#include "server/request.h"
#include "server/responses.h"
#include "server/wire.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static json_t *J(const char *s)
{
	json_error_t e;
	json_t *j = json_loads(s, JSON_ALLOW_NUL, &e);
	if (!j)
		fprintf(stderr, "bad test json: %s: %s\n", s, e.text);
	return j;
}

/* The chat body is accepted by the chat route's own parser. */
static int chat_parses(json_t *chat, struct ksv_req *req)
{
	char *s = json_dumps(chat, JSON_COMPACT);
	memset(req, 0, sizeof *req);
	int rc = ksv_req_parse(KSV_API_CHAT, s, strlen(s), 64, req);
	free(s);
	return rc;
}

static const char *role_at(json_t *chat, size_t i)
{
	return json_string_value(json_object_get(json_array_get(json_object_get(chat, "messages"), i), "role"));
}

static const char *content_at(json_t *chat, size_t i)
{
	return json_string_value(json_object_get(json_array_get(json_object_get(chat, "messages"), i), "content"));
}

KT_CASE(anthropic_claude_code_body)
{
	json_t *body = J("{\"model\":\"m\",\"max_tokens\":64,\"stream\":true,"
			 "\"system\":[{\"type\":\"text\",\"text\":\"x-anthropic-billing-header: cc_version=1.2;\"},"
			 "{\"type\":\"text\",\"text\":\"You are Claude Code.\",\"cache_control\":{\"type\":\"ephemeral\"}}],"
			 "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"list files\"}]},"
			 "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\",\"signature\":\"\"},"
			 "{\"type\":\"text\",\"text\":\"I will run ls.\"},"
			 "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"Bash\",\"input\":{\"command\":\"ls\"}}]},"
			 "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
			 "\"content\":[{\"type\":\"text\",\"text\":\"a.c\"}],\"is_error\":false},"
			 "{\"type\":\"text\",\"text\":\"thanks\"}]},"
			 "{\"role\":\"system\",\"content\":\"be brief\"}],"
			 "\"tools\":[{\"name\":\"Bash\",\"description\":\"run\",\"input_schema\":{\"type\":\"object\"}},"
			 "{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}],"
			 "\"tool_choice\":{\"type\":\"any\"},\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024},"
			 "\"stop_sequences\":[\"END\"],\"temperature\":0,\"top_k\":5,\"presence_penalty\":0.5,\"seed\":7,"
			 "\"metadata\":{\"user_id\":\"u\"},\"context_management\":{}}");
	KT_REQUIRE(body);
	json_t *chat = NULL;
	char param[96];
	KT_OK(ksv_anth_to_chat(body, 0, &chat, param, sizeof param));
	KT_REQUIRE(chat);
	KT_EQ_STR(role_at(chat, 0), "system");
	KT_EQ_STR(content_at(chat, 0), "x-anthropic-billing-header: cc_version=1.2;\nYou are Claude Code.");
	KT_EQ_STR(role_at(chat, 1), "user");
	KT_EQ_STR(role_at(chat, 2), "assistant");
	json_t *a = json_array_get(json_object_get(chat, "messages"), 2);
	KT_EQ_STR(json_string_value(json_object_get(a, "reasoning_content")), "hmm");
	KT_EQ_STR(json_string_value(json_object_get(a, "content")), "I will run ls.");
	json_t *call = json_array_get(json_object_get(a, "tool_calls"), 0);
	KT_EQ_STR(json_string_value(json_object_get(call, "id")), "toolu_1");
	KT_EQ_STR(role_at(chat, 3), "tool");
	KT_EQ_STR(content_at(chat, 3), "a.c");
	KT_EQ_STR(role_at(chat, 4), "user");
	KT_EQ_STR(content_at(chat, 4), "thanks");
	KT_EQ_STR(role_at(chat, 5), "system");
	KT_EQ_INT(json_array_size(json_object_get(chat, "tools")), 1); /* the server tool is left out */
	KT_EQ_STR(json_string_value(json_object_get(chat, "tool_choice")), "required");
	KT_CHECK(json_is_true(json_object_get(json_object_get(chat, "chat_template_kwargs"), "enable_thinking")));
	struct ksv_req req;
	KT_OK(chat_parses(chat, &req));
	KT_EQ_INT(req.max_tokens, 64);
	KT_EQ_INT((int)req.sp.v[KV_GC_TOP_K], 5);
	KT_CHECK(req.sp.v[KV_GC_PRESENCE_PENALTY] == 0.5);
	KT_EQ_U64(req.sp.seed, 7);
	KT_EQ_INT(req.n_stop, 1);
	KT_EQ_INT(req.stream, 1);
	KT_EQ_INT(req.tool_choice, KSV_TC_REQUIRED);
	ksv_req_free(&req);
	json_decref(chat);
	json_decref(body);
}

static void anth_refused(const char *body_text, const char *want_param)
{
	json_t *body = J(body_text), *chat = NULL;
	char param[96] = "";
	int rc = ksv_anth_to_chat(body, 0, &chat, param, sizeof param);
	KT_CHECKF(rc == KV_ERR_INVALID, "%s: rc %d", body_text, rc);
	KT_CHECKF(!chat, "%s: a chat body on error", body_text);
	KT_CHECKF(!strcmp(param, want_param), "%s: param \"%s\", want \"%s\"", body_text, param, want_param);
	json_decref(body);
}

KT_CASE(anthropic_refusals)
{
	anth_refused("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "max_tokens");
	anth_refused("{\"max_tokens\":5,\"messages\":[]}", "messages");
	anth_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\","
		     "\"source\":{}}]}]}", "messages[0].content[0]");
	anth_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\\u0000\",\"content\":\"hi\"}]}",
		     "messages[0].role");
	anth_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\"}]}]}",
		     "messages[0].content[0]");
	anth_refused("{\"max_tokens\":5,\"tool_choice\":{\"type\":\"sometimes\"},"
		     "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "tool_choice.type");
	anth_refused("{\"max_tokens\":5,\"thinking\":{\"type\":\"maybe\"},"
		     "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "thinking.type");
	/* count_tokens needs no max_tokens */
	json_t *body = J("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"), *chat = NULL;
	char param[96];
	KT_OK(ksv_anth_to_chat(body, 1, &chat, param, sizeof param));
	json_decref(chat);
	json_decref(body);
	/* an error body in Anthropic's shape */
	size_t n;
	char *e = ksv_anth_error(400, "bad", &n);
	KT_EQ_STR(e, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"bad\"}}");
	free(e);
}

/* The event names of an SSE text, in order, joined by ",". */
static void event_names(const char *sse, char *out, size_t cap)
{
	out[0] = 0;
	for (const char *p = sse; (p = strstr(p, "event: ")); ) {
		p += 7;
		const char *e = strchr(p, '\n');
		if (!e)
			break;
		if (out[0])
			strncat(out, ",", cap - strlen(out) - 1);
		strncat(out, p, (size_t)(e - p) < cap - strlen(out) - 1 ? (size_t)(e - p) : cap - strlen(out) - 1);
		p = e;
	}
}

static void feed(struct ksv_answer *a, int kind, const char *text, const char *name, struct kv_buf *out)
{
	struct kv_out_ev e = {.kind = kind, .text = text, .len = text ? strlen(text) : 0, .name = name};
	ksv_answer_event(a, &e, out);
}

/* The stream's end as the server writes it: close what is open, finish. */
static void finish(struct ksv_answer *a, const char *reason, struct kv_buf *out)
{
	a->finish = reason;
	ksv_answer_close(a, out);
	a->w->finish(a, out);
}

KT_CASE(anthropic_stream_order)
{
	struct ksv_answer a;
	struct kv_buf out = KV_BUF_INIT;
	ksv_answer_init(&a, &ksv_wire_anthropic, KSV_API_CHAT, "m", 1);
	a.usage = (struct kss_usage){.prompt_tokens = 110, .cached_tokens = 90, .cache_creation_tokens = 10,
				     .completion_tokens = 7};
	a.w->start(&a, &out);
	feed(&a, KV_OUT_REASONING, "think", NULL, &out);
	feed(&a, KV_OUT_CONTENT, "Hello", NULL, &out);
	feed(&a, KV_OUT_CONTENT, " world", NULL, &out);
	feed(&a, KV_OUT_TOOL_START, NULL, "Bash", &out);
	feed(&a, KV_OUT_TOOL_ARGS, "{\"command\":", NULL, &out);
	feed(&a, KV_OUT_TOOL_ARGS, "\"ls\"}", NULL, &out);
	feed(&a, KV_OUT_TOOL_END, NULL, NULL, &out);
	finish(&a, "tool_calls", &out);
	kv_buf_addc(&out, 0);
	char names[1024];
	event_names(out.p, names, sizeof names);
	KT_EQ_STR(names, "message_start,ping,content_block_start,content_block_delta,content_block_delta,content_block_stop,"
			 "content_block_start,content_block_delta,content_block_delta,content_block_stop,"
			 "content_block_start,content_block_delta,content_block_delta,content_block_stop,"
			 "message_delta,message_stop");
	KT_CHECK(strstr(out.p, "\"signature_delta\""));
	KT_CHECK(strstr(out.p, "\"stop_reason\":\"tool_use\""));
	KT_CHECK(strstr(out.p, "\"cache_read_input_tokens\":90"));
	/* the three input fields add up to the prompt */
	KT_CHECK(strstr(out.p, "\"input_tokens\":10,\"cache_creation_input_tokens\":10,\"cache_read_input_tokens\":90"));
	/* the whole message from the same state */
	size_t n;
	char *body = a.w->body(&a, &n);
	json_t *j = J(body);
	KT_REQUIRE(j);
	json_t *c = json_object_get(j, "content");
	KT_EQ_INT(json_array_size(c), 3);
	KT_EQ_STR(json_string_value(json_object_get(json_array_get(c, 0), "thinking")), "think");
	KT_EQ_STR(json_string_value(json_object_get(json_array_get(c, 1), "text")), "Hello world");
	json_t *tu = json_array_get(c, 2);
	KT_EQ_STR(json_string_value(json_object_get(tu, "type")), "tool_use");
	KT_CHECK(!strncmp(json_string_value(json_object_get(tu, "id")), "toolu_", 6));
	KT_EQ_STR(json_string_value(json_object_get(json_object_get(tu, "input"), "command")), "ls");
	KT_EQ_STR(json_string_value(json_object_get(j, "stop_reason")), "tool_use");
	json_decref(j);
	free(body);
	kv_buf_free(&out);
	ksv_answer_free(&a);
}

KT_CASE(responses_codex_body)
{
	json_t *body = J("{\"model\":\"m\",\"instructions\":\"You are Codex.\",\"store\":false,\"stream\":true,"
			 "\"include\":[\"reasoning.encrypted_content\"],\"prompt_cache_key\":\"abc\",\"parallel_tool_calls\":false,"
			 "\"reasoning\":{\"effort\":\"medium\",\"summary\":\"auto\"},"
			 "\"input\":[{\"type\":\"message\",\"role\":\"developer\",\"content\":[{\"type\":\"input_text\",\"text\":\"env\"}]},"
			 "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"fix it\"}]},"
			 "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"plan\"}],"
			 "\"encrypted_content\":null},"
			 "{\"type\":\"function_call\",\"id\":\"fc_1\",\"status\":\"completed\",\"call_id\":\"c1\",\"name\":\"shell\","
			 "\"arguments\":\"{\\\"cmd\\\":[\\\"ls\\\"]}\"},"
			 "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"a.c\"},"
			 "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"done\"}]}],"
			 "\"tools\":[{\"type\":\"function\",\"name\":\"shell\",\"parameters\":{\"type\":\"object\"},\"strict\":false},"
			 "{\"type\":\"namespace\",\"name\":\"mcp\",\"tools\":[{\"type\":\"function\",\"name\":\"read\"}]},"
			 "{\"type\":\"web_search\"}],"
			 "\"tool_choice\":\"auto\",\"max_output_tokens\":50}");
	KT_REQUIRE(body);
	json_t *chat = NULL;
	char param[96];
	KT_OK(ksv_resp_to_chat(body, &chat, param, sizeof param));
	KT_REQUIRE(chat);
	KT_EQ_STR(role_at(chat, 0), "system");
	KT_EQ_STR(content_at(chat, 0), "You are Codex.");
	KT_EQ_STR(role_at(chat, 1), "system");
	KT_EQ_STR(role_at(chat, 2), "user");
	KT_EQ_STR(role_at(chat, 3), "assistant");
	json_t *a = json_array_get(json_object_get(chat, "messages"), 3);
	KT_EQ_STR(json_string_value(json_object_get(a, "reasoning_content")), "plan");
	KT_EQ_STR(json_string_value(json_object_get(json_array_get(json_object_get(a, "tool_calls"), 0), "id")), "c1");
	KT_EQ_STR(role_at(chat, 4), "tool");
	KT_EQ_STR(role_at(chat, 5), "assistant");
	KT_EQ_STR(content_at(chat, 5), "done");
	KT_EQ_INT(json_array_size(json_object_get(chat, "tools")), 2);
	struct ksv_req req;
	KT_OK(chat_parses(chat, &req));
	KT_EQ_INT(req.max_tokens, 50);
	KT_EQ_INT(req.enable_thinking, 1);
	ksv_req_free(&req);
	json_decref(chat);
	json_decref(body);

	/* refusals */
	static const char *const bad[][2] = {
		{"{\"input\":\"hi\",\"previous_response_id\":\"resp_1\"}", "previous_response_id"},
		{"{\"model\":\"m\"}", "input"},
		{"{\"input\":[{\"type\":\"message\",\"role\":\"robot\",\"content\":\"x\"}]}", "input[0].role"},
		{"{\"input\":[{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_image\"}]}]}",
		 "input[0].content[0]"},
		{"{\"input\":[{\"type\":\"teleport\"}]}", "input[0]"},
		{"{\"input\":[{\"type\":\"function_call_output\",\"output\":\"x\"}]}", "input[0].call_id"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		json_t *b = J(bad[i][0]), *c = NULL;
		char p[96] = "";
		int rc = ksv_resp_to_chat(b, &c, p, sizeof p);
		KT_CHECKF(rc == KV_ERR_INVALID && !c && !strcmp(p, bad[i][1]), "%s: rc %d param %s", bad[i][0], rc, p);
		json_decref(b);
		json_decref(c);
	}
}

KT_CASE(responses_stream_order)
{
	struct ksv_answer r;
	struct kv_buf out = KV_BUF_INIT;
	ksv_answer_init(&r, &ksv_wire_responses, KSV_API_CHAT, "m", 1);
	r.usage = (struct kss_usage){.prompt_tokens = 100, .cached_tokens = 80, .completion_tokens = 9};
	r.w->start(&r, &out);
	feed(&r, KV_OUT_REASONING, "plan", NULL, &out);
	feed(&r, KV_OUT_CONTENT, "ok", NULL, &out);
	feed(&r, KV_OUT_TOOL_START, NULL, "shell", &out);
	feed(&r, KV_OUT_TOOL_ARGS, "{}", NULL, &out);
	feed(&r, KV_OUT_TOOL_END, NULL, NULL, &out);
	finish(&r, "tool_calls", &out);
	kv_buf_addc(&out, 0);
	char names[2048];
	event_names(out.p, names, sizeof names);
	KT_EQ_STR(names, "response.created,response.in_progress,"
			 "response.output_item.added,response.reasoning_text.delta,response.reasoning_text.done,"
			 "response.output_item.done,"
			 "response.output_item.added,response.content_part.added,response.output_text.delta,"
			 "response.output_text.done,response.content_part.done,response.output_item.done,"
			 "response.output_item.added,response.function_call_arguments.delta,"
			 "response.function_call_arguments.done,response.output_item.done,response.completed");
	/* sequence numbers count up from 0 */
	int64_t want = 0;
	for (const char *p = out.p; (p = strstr(p, "\"sequence_number\":")); p++)
		KT_CHECK(strtoll(p + 18, NULL, 10) == want++);
	KT_EQ_INT(want, 17);
	KT_CHECK(strstr(out.p, "\"cached_tokens\":80"));
	size_t n;
	char *body = r.w->body(&r, &n);
	json_t *j = J(body);
	KT_REQUIRE(j);
	KT_EQ_STR(json_string_value(json_object_get(j, "status")), "completed");
	json_t *items = json_object_get(j, "output");
	KT_EQ_INT(json_array_size(items), 3);
	KT_EQ_STR(json_string_value(json_object_get(json_array_get(items, 2), "type")), "function_call");
	KT_EQ_STR(json_string_value(json_object_get(json_array_get(items, 2), "arguments")), "{}");
	json_decref(j);
	free(body);
	kv_buf_free(&out);
	ksv_answer_free(&r);
}

KT_CASE(normalize_billing_header)
{
	unsigned rules;
	KT_OK(ksv_norm_parse("billing-header", &rules));
	KT_EQ_INT(rules, KSV_NORM_BILLING_HEADER);
	KT_OK(ksv_norm_parse("none", &rules));
	KT_EQ_INT(rules, 0);
	KT_CHECK(ksv_norm_parse("dates", &rules) == KV_ERR_INVALID);
	/* two sessions differ only in the header line: after the rule their
	 * system messages are byte for byte the same */
	const char *s1 = "{\"messages\":[{\"role\":\"system\",\"content\":\"x-anthropic-billing-header: cc_version=1.0.1; "
			 "cc_entrypoint=cli; cch=aa11;\\nYou are Claude Code.\"},{\"role\":\"user\",\"content\":"
			 "\"x-anthropic-billing-header: keep me\"}]}";
	const char *s2 = "{\"messages\":[{\"role\":\"system\",\"content\":\"x-anthropic-billing-header: cc_version=1.0.2; "
			 "cc_entrypoint=cli; cch=bb22;\\nYou are Claude Code.\"},{\"role\":\"user\",\"content\":"
			 "\"x-anthropic-billing-header: keep me\"}]}";
	json_t *a = J(s1), *b = J(s2), *ra = NULL, *rb = NULL;
	KT_REQUIRE(a && b);
	KT_EQ_INT(ksv_norm_apply(a, NULL, KSV_NORM_BILLING_HEADER, &ra), 1);
	KT_EQ_INT(ksv_norm_apply(b, NULL, KSV_NORM_BILLING_HEADER, &rb), 1);
	KT_EQ_STR(content_at(a, 0), "You are Claude Code.");
	KT_CHECK(json_equal(a, b));
	/* user text is never touched */
	KT_EQ_STR(content_at(a, 1), "x-anthropic-billing-header: keep me");
	KT_REQUIRE(ra);
	KT_EQ_STR(json_string_value(json_object_get(json_array_get(ra, 0), "rule")), "billing-header");
	KT_CHECK(strstr(json_string_value(json_object_get(json_array_get(ra, 0), "removed")), "cch=aa11"));
	json_decref(ra);
	json_decref(rb);
	/* rules off: nothing changes */
	json_t *c = J(s1), *rc = NULL;
	KT_EQ_INT(ksv_norm_apply(c, NULL, 0, &rc), 0);
	KT_CHECK(!rc);
	KT_CHECK(strstr(content_at(c, 0), "cc_version=1.0.1"));
	json_decref(a);
	json_decref(b);
	json_decref(c);
}

KT_CASE(normalize_tools_order)
{
	unsigned rules;
	KT_OK(ksv_norm_parse("billing-header,tools-order", &rules));
	KT_EQ_INT(rules, KSV_NORM_BILLING_HEADER | KSV_NORM_TOOLS_ORDER);
	KT_OK(ksv_norm_parse("all", &rules));
	KT_CHECK(rules & KSV_NORM_TOOLS_ORDER);
	KT_OK(ksv_norm_parse("billing-header", &rules));
	KT_CHECK(!(rules & KSV_NORM_TOOLS_ORDER)); /* opt-in: it changes what the model sees */
	/* two requests with the same tools in another order render the same */
	json_t *ta = J("[{\"type\":\"function\",\"function\":{\"name\":\"write\"}},"
		       "{\"type\":\"function\",\"function\":{\"name\":\"bash\"}},"
		       "{\"type\":\"function\",\"function\":{\"name\":\"read\",\"description\":\"1\"}},"
		       "{\"type\":\"function\",\"function\":{\"name\":\"read\",\"description\":\"2\"}}]");
	json_t *tb = J("[{\"type\":\"function\",\"function\":{\"name\":\"bash\"}},"
		       "{\"type\":\"function\",\"function\":{\"name\":\"read\",\"description\":\"1\"}},"
		       "{\"type\":\"function\",\"function\":{\"name\":\"write\"}},"
		       "{\"type\":\"function\",\"function\":{\"name\":\"read\",\"description\":\"2\"}}]");
	json_t *chat = J("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"), *ra = NULL, *rb = NULL;
	KT_REQUIRE(ta && tb && chat);
	KT_EQ_INT(ksv_norm_apply(chat, &ta, KSV_NORM_TOOLS_ORDER, &ra), 1);
	KT_EQ_INT(ksv_norm_apply(chat, &tb, KSV_NORM_TOOLS_ORDER, &rb), 1);
	KT_CHECK(json_equal(ta, tb));
	/* sorted by name, equal names in their order */
	static const char *const want[] = {"bash", "read", "read", "write"};
	for (int i = 0; i < 4; i++)
		KT_EQ_STR(json_string_value(json_object_get(json_object_get(json_array_get(ta, i), "function"), "name")),
			  want[i]);
	KT_EQ_STR(json_string_value(json_object_get(json_object_get(json_array_get(ta, 1), "function"), "description")),
		  "1");
	KT_EQ_STR(json_string_value(json_object_get(json_array_get(ra, 0), "rule")), "tools-order");
	/* already sorted: nothing to report */
	json_t *rc = NULL;
	KT_EQ_INT(ksv_norm_apply(chat, &ta, KSV_NORM_TOOLS_ORDER, &rc), 0);
	KT_CHECK(!rc);
	json_decref(ra);
	json_decref(rb);
	json_decref(ta);
	json_decref(tb);
	json_decref(chat);
}

KT_MAIN(anthropic_claude_code_body, normalize_billing_header, normalize_tools_order, anthropic_refusals, anthropic_stream_order, responses_codex_body,
	responses_stream_order)
