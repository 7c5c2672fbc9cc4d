/*
 * test_toolcall.c - tool calls in generated text (text/toolcall.h): both
 * wire forms, several calls, text around them, every chunking of the
 * input, malformed and hostile output (which must come back as content,
 * byte for byte), schema coercion of XML parameters.
 */
#include "kt.h"
#include "base/buf.h"
#include "base/err.h"
#include "text/toolcall.h"

#include <stdlib.h>
#include <string.h>

/* Events as one canonical string; adjacent content is merged, since how
 * content is split into events depends on the chunking. */
struct log {
	struct kv_buf s;
	struct kv_buf pending;  /* content not yet written */
	int stop_after;         /* return 1 on this event (0: never) */
	int n;
};

static void flush(struct log *l)
{
	if (l->pending.len) {
		kv_buf_adds(&l->s, "C[");
		kv_buf_add(&l->s, l->pending.p, l->pending.len);
		kv_buf_adds(&l->s, "]");
		kv_buf_reset(&l->pending);
	}
}

static int on_ev(void *ud, const struct kv_tc_event *ev)
{
	struct log *l = ud;
	l->n++;
	if (ev->kind == KV_TC_CONTENT) {
		kv_buf_add(&l->pending, ev->text, ev->len);
	} else {
		flush(l);
		if (ev->kind == KV_TC_CALL_START)
			kv_buf_printf(&l->s, "S%d[%.*s]", ev->index, (int)ev->len, ev->text);
		else if (ev->kind == KV_TC_ARGS_DELTA)
			kv_buf_printf(&l->s, "A%d[%.*s]", ev->index, (int)ev->len, ev->text);
		else
			kv_buf_printf(&l->s, "E%d", ev->index);
	}
	return l->stop_after && l->n == l->stop_after;
}

/* Feed `text` in chunks of the given sizes (cycled); returns the log. */
static char *run_chunks(const char *text, const struct kv_tc_params *prm, const size_t *sizes, int nsizes)
{
	struct kv_tc_parser *p;
	struct log l = {KV_BUF_INIT, KV_BUF_INIT, 0, 0};
	size_t n = strlen(text), at = 0;
	if (kv_tc_parser_create(prm, &p))
		return NULL;
	for (int k = 0; at < n; k++) {
		size_t c = sizes[k % nsizes];
		if (c > n - at)
			c = n - at;
		if (kv_tc_feed(p, text + at, c, on_ev, &l))
			break;
		at += c;
	}
	kv_tc_finish(p, on_ev, &l);
	kv_tc_parser_free(p);
	flush(&l);
	kv_buf_free(&l.pending);
	return l.s.p ? kv_buf_take(&l.s) : strdup("");
}

static char *run(const char *text, const struct kv_tc_params *prm)
{
	size_t all = strlen(text) + 1;
	return run_chunks(text, prm, &all, 1);
}

/* Every split into two chunks, byte-by-byte feeding and random chunkings
 * give the same events as feeding the text at once. */
static void check_chunkings(const char *text, const struct kv_tc_params *prm, const char *want)
{
	char *whole = run(text, prm);
	KT_EQ_STR(whole, want);
	size_t n = strlen(text);
	for (size_t cut = 1; cut < n; cut++) {
		size_t sizes[2] = {cut, n};
		char *got = run_chunks(text, prm, sizes, 2);
		KT_CHECKF(got && !strcmp(got, whole), "split at byte %zu: %s", cut, got ? got : "(null)");
		free(got);
	}
	size_t one = 1;
	char *bytes = run_chunks(text, prm, &one, 1);
	KT_CHECKF(!strcmp(bytes, whole), "byte by byte: %s", bytes);
	free(bytes);
	uint64_t seed = 42;
	for (int r = 0; r < 20; r++) {
		size_t sizes[8];
		for (int i = 0; i < 8; i++)
			sizes[i] = 1 + kt_rand(&seed) % 13;
		char *got = run_chunks(text, prm, sizes, 8);
		KT_CHECKF(!strcmp(got, whole), "random chunking %d: %s", r, got);
		free(got);
	}
	free(whole);
}

static const struct kv_tc_params JSONP = {.format = KV_TC_JSON};
static const struct kv_tc_params XMLP = {.format = KV_TC_XML};

KT_CASE(json_form)
{
	check_chunkings("Let me look.\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"src/a.c\", "
			"\"end_line\": 20}}\n</tool_call>",
			&JSONP,
			"C[Let me look.\n]S0[read_file]A0[{\"path\": \"src/a.c\", \"end_line\": 20}]E0");
	/* the arguments are the model's own bytes, spacing included */
	check_chunkings("<tool_call>\n{\"arguments\":{\"x\":[1,2, {\"y\":\"é\\n\"}]} , \"name\":\"f\"}\n</tool_call>", &JSONP,
			"S0[f]A0[{\"x\":[1,2, {\"y\":\"é\\n\"}]}]E0");
	/* arguments given as a JSON string holding an object; no arguments */
	check_chunkings("<tool_call>{\"name\": \"g\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>"
			"<tool_call>{\"name\": \"h\"}</tool_call>",
			&JSONP, "S0[g]A0[{\"a\": 1}]E0S1[h]A1[{}]E1");
}

KT_CASE(several_calls_and_text_around)
{
	check_chunkings("I'll run both.\n<tool_call>\n{\"name\": \"git_status\", \"arguments\": {}}\n</tool_call>\n"
			"<tool_call>\n{\"name\": \"git_log\", \"arguments\": {\"max_count\": 3}}\n</tool_call>\n",
			&JSONP,
			"C[I'll run both.\n]S0[git_status]A0[{}]E0S1[git_log]A1[{\"max_count\": 3}]E1");
	/* text after the calls is kept, with the whitespace before it */
	check_chunkings("<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n\nDone, see above.", &JSONP,
			"S0[a]A0[{}]E0C[\n\nDone, see above.]");
	/* things that look like the tag but are not */
	check_chunkings("a <tool> b <tool_cal c < tool_call> d <tool_call", &JSONP,
			"C[a <tool> b <tool_cal c < tool_call> d <tool_call]");
}

KT_CASE(held_back_prefix)
{
	struct kv_tc_parser *p;
	struct log l = {KV_BUF_INIT, KV_BUF_INIT, 0, 0};
	KT_OK(kv_tc_parser_create(&JSONP, &p));
	KT_OK(kv_tc_feed(p, "Hello <tool_", 12, on_ev, &l));
	KT_EQ_STR(l.pending.p, "Hello ");          /* "<tool_" is held back */
	KT_OK(kv_tc_feed(p, "ca", 2, on_ev, &l));
	KT_EQ_STR(l.pending.p, "Hello ");
	KT_OK(kv_tc_feed(p, "r", 1, on_ev, &l));   /* "<tool_car" cannot be the tag */
	KT_EQ_STR(l.pending.p, "Hello <tool_car");
	KT_OK(kv_tc_finish(p, on_ev, &l));
	KT_EQ_INT(kv_tc_count(p), 0);
	kv_tc_parser_free(p);
	kv_buf_free(&l.s);
	kv_buf_free(&l.pending);
}

KT_CASE(xml_form_with_coercion)
{
	const char *tools_json =
		"[{\"type\": \"function\", \"function\": {\"name\": \"edit\", \"parameters\": {\"type\": \"object\", "
		"\"properties\": {\"path\": {\"type\": \"string\"}, \"count\": {\"type\": \"integer\"}, \"ratio\": "
		"{\"type\": \"number\"}, \"all\": {\"type\": \"boolean\"}, \"opts\": {\"type\": \"object\"}, \"ids\": "
		"{\"type\": \"array\"}, \"maybe\": {\"type\": [\"integer\", \"null\"]}, \"alt\": {\"anyOf\": [{\"type\": "
		"\"boolean\"}, {\"type\": \"string\"}]}}}}}]";
	json_error_t e;
	json_t *tools = json_loads(tools_json, 0, &e);
	KT_REQUIRE(tools);
	struct kv_tc_params prm = {.format = KV_TC_XML, .tools = tools};
	check_chunkings("Editing now.\n\n<tool_call>\n<function=edit>\n<parameter=path>\nsrc/é \"q\".c\n</parameter>\n"
			"<parameter=count>\n 42 \n</parameter>\n<parameter=ratio>\n0.5e1\n</parameter>\n"
			"<parameter=all>\nTrue\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n"
			"<parameter=ids>\n[3,4]\n</parameter>\n<parameter=maybe>\nnull\n</parameter>\n"
			"<parameter=alt>\nfalse\n</parameter>\n<parameter=extra>\n7\n</parameter>\n</function>\n</tool_call>",
			&prm,
			"C[Editing now.\n\n]S0[edit]A0[{\"path\": \"src/é \\\"q\\\".c\", \"count\": 42, \"ratio\": 0.5e1, "
			"\"all\": true, \"opts\": {\"a\": [1, 2]}, \"ids\": [3,4], \"maybe\": null, \"alt\": false, "
			"\"extra\": \"7\"}]E0");
	/* values that do not fit the type stay strings; multi-line values keep
	 * their inner newlines */
	check_chunkings("<tool_call>\n<function=edit>\n<parameter=count>\nmany\n</parameter>\n<parameter=opts>\n[1]\n"
			"</parameter>\n<parameter=path>\nline1\n\nline3\n</parameter>\n</function>\n</tool_call>",
			&prm, "S0[edit]A0[{\"count\": \"many\", \"opts\": \"[1]\", \"path\": \"line1\\n\\nline3\"}]E0");
	/* an unknown tool is still returned; its values stay strings */
	check_chunkings("<tool_call>\n<function=nope>\n<parameter=n>\n1\n</parameter>\n</function>\n</tool_call>", &prm,
			"S0[nope]A0[{\"n\": \"1\"}]E0");
	/* two calls, no parameters, bare <function=...> without the wrapper */
	check_chunkings("<tool_call>\n<function=git_status>\n</function>\n</tool_call>\n<function=edit>\n"
			"<parameter=count>\n-3\n</parameter>\n</function>",
			&prm, "S0[git_status]A0[{}]E0S1[edit]A1[{\"count\": -3}]E1");
	/* the JSON form does not know the bare tag */
	char *got = run("<function=edit>\n</function>", &JSONP);
	KT_EQ_STR(got, "C[<function=edit>\n</function>]");
	free(got);
	json_decref(tools);
}

KT_CASE(malformed_comes_back_as_content)
{
	static const char *const json_bad[] = {
		"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>",          /* bad JSON */
		"<tool_call>\n{\"arguments\": {}}\n</tool_call>",                                   /* no name */
		"<tool_call>\n{\"name\": \"\", \"arguments\": {}}\n</tool_call>",                    /* empty name */
		"<tool_call>\n{\"name\": 5}\n</tool_call>",                                          /* name type */
		"<tool_call>\n[\"f\"]\n</tool_call>",                                                /* not an object */
		"<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",                  /* args type */
		"<tool_call>\n{\"name\": \"f\", \"arguments\": \"not json\"}\n</tool_call>",         /* args string */
		"<tool_call>\n{\"name\": \"f\"} trailing\n</tool_call>",                             /* extra text */
		"<tool_call>\n{\"name\": \"f\", \"name\": \"g\"}\n</tool_call>",                    /* duplicate key */
		"text <tool_call>\n{\"name\": \"f\", \"arguments\": {",                             /* cut off */
		"<tool_call></tool_call>",
	};
	for (size_t i = 0; i < sizeof json_bad / sizeof json_bad[0]; i++) {
		struct kv_buf want = KV_BUF_INIT;
		kv_buf_printf(&want, "C[%s]", json_bad[i]);
		check_chunkings(json_bad[i], &JSONP, want.p);
		kv_buf_free(&want);
	}
	static const char *const xml_bad[] = {
		"<tool_call>\n<function=>\n</function>\n</tool_call>",
		"<tool_call>\n<function=f\n</function>\n</tool_call>",
		"<tool_call>\nhello <function=f>\n</function>\n</tool_call>",
		"<tool_call>\n<function=f>\n<parameter=>\nx\n</parameter>\n</function>\n</tool_call>",
		"<tool_call>\n<function=f>\nstray text\n</function>\n</tool_call>",
		"<tool_call>\n<function=f>\n</function>\nafter\n</tool_call>",
		"<tool_call>\n{\"name\": \"f\"}\n</tool_call>", /* JSON inside the XML form */
	};
	for (size_t i = 0; i < sizeof xml_bad / sizeof xml_bad[0]; i++) {
		struct kv_buf want = KV_BUF_INIT;
		kv_buf_printf(&want, "C[%s]", xml_bad[i]);
		check_chunkings(xml_bad[i], &XMLP, want.p);
		kv_buf_free(&want);
	}
	/* a good call next to a bad one: the good one is still a call */
	check_chunkings("<tool_call>{\"name\": \"ok\"}</tool_call><tool_call>{bad}</tool_call>", &JSONP,
			"S0[ok]A0[{}]E0C[<tool_call>{bad}</tool_call>]");
}

KT_CASE(unclosed_call_at_the_end)
{
	/* generation stopped on "</tool_call>" as a stop string: the body is
	 * complete, so it is still a call */
	check_chunkings("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n", &JSONP, "S0[f]A0[{\"x\": 1}]E0");
	check_chunkings("<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n", &XMLP,
			"S0[f]A0[{\"x\": \"1\"}]E0");
}

KT_CASE(hostile_input)
{
	/* deeply nested arguments: a clear refusal (content), no recursion blowup */
	struct kv_buf t = KV_BUF_INIT;
	kv_buf_adds(&t, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": ");
	for (int i = 0; i < 100000; i++)
		kv_buf_addc(&t, '[');
	for (int i = 0; i < 100000; i++)
		kv_buf_addc(&t, ']');
	kv_buf_adds(&t, "}}</tool_call>");
	char *content;
	size_t clen;
	json_t *calls;
	KT_OK(kv_tc_parse(t.p, t.len, &JSONP, NULL, &content, &clen, &calls));
	KT_EQ_INT(json_array_size(calls), 0);
	KT_EQ_INT(clen, t.len);
	KT_CHECK(!memcmp(content, t.p, t.len));
	free(content);
	json_decref(calls);
	/* nesting within the limit is fine */
	kv_buf_reset(&t);
	kv_buf_adds(&t, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": ");
	for (int i = 0; i < 30; i++)
		kv_buf_adds(&t, "{\"b\": ");
	kv_buf_adds(&t, "1");
	for (int i = 0; i < 30; i++)
		kv_buf_addc(&t, '}');
	kv_buf_adds(&t, "}}</tool_call>");
	KT_OK(kv_tc_parse(t.p, t.len, &JSONP, "x-", &content, &clen, &calls));
	KT_EQ_INT(json_array_size(calls), 1);
	KT_EQ_INT(clen, 0);
	KT_EQ_STR(json_string_value(json_object_get(json_array_get(calls, 0), "id")), "x-0");
	free(content);
	json_decref(calls);
	/* deep XML object parameter */
	kv_buf_reset(&t);
	kv_buf_adds(&t, "<tool_call>\n<function=f>\n<parameter=o>\n");
	for (int i = 0; i < 5000; i++)
		kv_buf_adds(&t, "{\"a\":");
	kv_buf_adds(&t, "\n</parameter>\n</function>\n</tool_call>");
	json_error_t e;
	json_t *tools = json_loads("[{\"function\": {\"name\": \"f\", \"parameters\": {\"properties\": {\"o\": {\"type\": "
				   "\"object\"}}}}}]", 0, &e);
	struct kv_tc_params xp = {.format = KV_TC_XML, .tools = tools};
	KT_OK(kv_tc_parse(t.p, t.len, &xp, NULL, &content, &clen, &calls));
	KT_EQ_INT(json_array_size(calls), 0);
	KT_EQ_INT(clen, t.len);
	free(content);
	json_decref(calls);
	json_decref(tools);
	/* invalid UTF-8 in a parameter: not a call, bytes kept */
	const char *bad = "<tool_call>\n<function=f>\n<parameter=p>\n\xff\xfe\n</parameter>\n</function>\n</tool_call>";
	KT_OK(kv_tc_parse(bad, strlen(bad), &XMLP, NULL, &content, &clen, &calls));
	KT_EQ_INT(json_array_size(calls), 0);
	KT_EQ_STR(content, bad);
	free(content);
	json_decref(calls);
	/* a call longer than max_call_bytes is content, and the parser goes on */
	struct kv_tc_params small = {.format = KV_TC_JSON, .max_call_bytes = 64};
	kv_buf_reset(&t);
	kv_buf_adds(&t, "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": \"");
	for (int i = 0; i < 200; i++)
		kv_buf_addc(&t, 'y');
	kv_buf_adds(&t, "\"}}</tool_call> then <tool_call>{\"name\": \"g\"}</tool_call>");
	KT_OK(kv_tc_parse(t.p, t.len, &small, NULL, &content, &clen, &calls));
	KT_EQ_INT(json_array_size(calls), 1);
	KT_EQ_STR(json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "name")), "g");
	KT_CHECK(strstr(content, "yyyy") != NULL);
	free(content);
	json_decref(calls);
	kv_buf_free(&t);
	/* bad parameters */
	struct kv_tc_parser *p;
	KT_EQ_INT(kv_tc_parser_create(&(struct kv_tc_params){.format = 9}, &p), KV_ERR_INVALID);
}

KT_CASE(one_shot_and_callback_stop)
{
	const char *text = "Sure.\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>\n"
			   "<tool_call>\n{\"name\": \"unknown_tool\", \"arguments\": {}}\n</tool_call>";
	char *content;
	size_t clen;
	json_t *calls;
	KT_OK(kv_tc_parse(text, strlen(text), &JSONP, NULL, &content, &clen, &calls));
	KT_EQ_STR(content, "Sure.\n");
	KT_EQ_INT(json_array_size(calls), 2);
	json_t *c0 = json_array_get(calls, 0);
	KT_EQ_STR(json_string_value(json_object_get(c0, "id")), "call_0");
	KT_EQ_STR(json_string_value(json_object_get(c0, "type")), "function");
	KT_EQ_STR(json_string_value(json_object_get(json_object_get(c0, "function"), "arguments")), "{\"path\": \"a\"}");
	KT_EQ_STR(json_string_value(json_object_get(json_object_get(json_array_get(calls, 1), "function"), "name")),
		  "unknown_tool");
	free(content);
	json_decref(calls);
	KT_OK(kv_tc_parse("", 0, &XMLP, NULL, &content, &clen, &calls));
	KT_EQ_INT(clen, 0);
	KT_EQ_INT(json_array_size(calls), 0);
	free(content);
	json_decref(calls);
	/* a callback that says stop stops the feed */
	struct kv_tc_parser *p;
	struct log l = {KV_BUF_INIT, KV_BUF_INIT, 2, 0};
	KT_OK(kv_tc_parser_create(&JSONP, &p));
	KT_EQ_INT(kv_tc_feed(p, text, strlen(text), on_ev, &l), 1);
	KT_EQ_INT(l.n, 2);
	kv_tc_parser_free(p);
	kv_buf_free(&l.s);
	kv_buf_free(&l.pending);
}

/* Nemotron-H: one <TOOLCALL> block, a JSON array of calls. */
KT_CASE(list_form_nemotron)
{
	static const struct kv_tc_params LISTP = {.format = KV_TC_LIST};
	check_chunkings("<think></think>Checking.<TOOLCALL>[{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.c\"}}, "
			"{\"name\": \"grep\", \"arguments\": {\"q\": \"x\", \"n\": 2}}]</TOOLCALL>",
			&LISTP,
			"C[<think></think>Checking.]S0[read_file]A0[{\"path\": \"a.c\"}]E0S1[grep]A1[{\"q\": \"x\", \"n\": 2}]E1");
	/* one call, arguments double-encoded, and text after the block */
	check_chunkings("<TOOLCALL>[{\"name\": \"g\", \"arguments\": \"{\\\"a\\\": 1}\"}]</TOOLCALL> ok", &LISTP,
			"S0[g]A0[{\"a\": 1}]E0C[ ok]");
	/* malformed: an empty list, an element without a name, not a list, a
	 * NUL in a name: the block comes back as content, byte for byte */
	const char *bad[] = {"<TOOLCALL>[]</TOOLCALL>", "<TOOLCALL>[{\"arguments\": {}}]</TOOLCALL>",
			     "<TOOLCALL>{\"name\": \"f\"}</TOOLCALL>", "<TOOLCALL>[{\"name\": \"a\\u0000b\"}]</TOOLCALL>",
			     "<TOOLCALL>[{\"name\": \"f\"}] trailing</TOOLCALL>"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct kv_buf w = KV_BUF_INIT;
		kv_buf_printf(&w, "C[%s]", bad[i]);
		check_chunkings(bad[i], &LISTP, w.p);
		kv_buf_free(&w);
	}
	/* the Qwen tags are plain text in this format, and the other way round */
	check_chunkings("<tool_call>{\"name\": \"a\"}</tool_call>", &LISTP, "C[<tool_call>{\"name\": \"a\"}</tool_call>]");
	check_chunkings("<TOOLCALL>[{\"name\": \"a\"}]</TOOLCALL>", &JSONP, "C[<TOOLCALL>[{\"name\": \"a\"}]</TOOLCALL>]");
}

KT_MAIN(json_form, several_calls_and_text_around, held_back_prefix, xml_form_with_coercion,
	malformed_comes_back_as_content, unclosed_call_at_the_end, hostile_input, one_shot_and_callback_stop,
	list_form_nemotron)
