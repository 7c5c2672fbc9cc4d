/*
 * fuzz_template.c - libFuzzer target for the chat-template interpreter:
 * the input is template source, compiled and (if it compiles) rendered
 * with a fixed chat-like context under small caps. Any input must end in
 * a render or a clean error: no crash, no hang, no leak (ASan), and a
 * rendered text must be valid UTF-8 when the source was.
 *
 *   make fuzz && ./build/fuzz/fuzz_template -max_total_time=120 tests/fuzz/corpus/template
 *
 * `make test` replays tests/fuzz/corpus/template through the same function.
 */
#include "text/template.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *g_ctx;

static const char CTX[] =
	"{\"messages\": ["
	"{\"role\": \"system\", \"content\": \"You are helpful. é 😀\"},"
	"{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi\"}]},"
	"{\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\nok\", \"reasoning_content\": null,"
	" \"tool_calls\": [{\"id\": \"1\", \"type\": \"function\", \"function\": {\"name\": \"f\","
	" \"arguments\": {\"a\": [1, 2.5, true, null], \"b\": \"x\"}}},"
	" {\"type\": \"function\", \"function\": {\"name\": \"g\", \"arguments\": \"{\\\"c\\\": 1}\"}}]},"
	"{\"role\": \"tool\", \"content\": \"result\"},"
	"{\"role\": \"tool\", \"content\": \"\"}],"
	"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\","
	" \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\"}}, \"required\": [\"a\"]}}}],"
	"\"add_generation_prompt\": true, \"enable_thinking\": false, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
	"\"n\": 3, \"f\": 1.5, \"none\": null, \"empty\": {}, \"list\": []}";

static int valid_utf8(const char *p, size_t n)
{
	json_t *j = json_stringn(p, n);
	json_decref(j);
	return j != NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kv_tmpl *t;
	if (!g_ctx) {
		json_error_t e;
		g_ctx = json_loads(CTX, 0, &e);
		if (!g_ctx) {
			fprintf(stderr, "fuzz_template: bad context: %s\n", e.text);
			abort();
		}
	}
	if (size > (1u << 20))
		return 0;
	if (kv_tmpl_compile((const char *)data, size, "fuzz", &t))
		return 0;
	struct kv_tmpl_limits lim = {.max_steps = 20000, .max_output = 1u << 20, .max_memory = 64u << 20};
	char *out = NULL;
	size_t len = 0;
	if (kv_tmpl_render_ex(t, g_ctx, &lim, &out, &len) == 0) {
		/* source text passes through, strings come from valid JSON, so
		 * the output is UTF-8 unless the template builds broken escapes
		 * itself, which the lexer refuses */
		if (memchr(data, 0, size) == NULL && !valid_utf8(out, len)) {
			fprintf(stderr, "fuzz_template: render produced invalid UTF-8\n");
			abort();
		}
		free(out);
	}
	kv_tmpl_free(t);
	return 0;
}
