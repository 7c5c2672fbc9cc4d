/*
 * fuzz_toolcall.c - libFuzzer target for the tool-call parser: the input
 * is generated text, parsed in both wire forms at once and byte by byte.
 * The events must not depend on the chunking (abort if they do), and no
 * byte may be lost: the content plus the raw text of the calls accounts
 * for the whole input except whitespace around calls.
 *
 *   make fuzz && ./build/fuzz/fuzz_toolcall -max_total_time=60 tests/fuzz/corpus/toolcall
 */
#include "base/buf.h"
#include "text/toolcall.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct acc {
	struct kv_buf s;
	struct kv_buf content;
};

static void flush(struct acc *a)
{
	if (a->content.len) {
		kv_buf_printf(&a->s, "C%zu:", a->content.len);
		kv_buf_add(&a->s, a->content.p, a->content.len);
		kv_buf_reset(&a->content);
	}
}

static int on_ev(void *ud, const struct kv_tc_event *ev)
{
	struct acc *a = ud;
	if (ev->kind == KV_TC_CONTENT) {
		kv_buf_add(&a->content, ev->text, ev->len);
		return 0;
	}
	flush(a);
	kv_buf_printf(&a->s, "K%d/%d:%zu:", ev->kind, ev->index, ev->len);
	if (ev->len)
		kv_buf_add(&a->s, ev->text, ev->len);
	return 0;
}

static void run(const uint8_t *d, size_t n, int format, size_t chunk, struct acc *a)
{
	struct kv_tc_parser *p;
	json_error_t e;
	static json_t *tools;
	if (!tools)
		tools = json_loads("[{\"function\": {\"name\": \"f\", \"parameters\": {\"properties\": {\"i\": {\"type\": "
				   "\"integer\"}, \"o\": {\"type\": \"object\"}, \"b\": {\"type\": \"boolean\"}}}}}]", 0, &e);
	struct kv_tc_params prm = {.format = format, .tools = tools, .max_call_bytes = 512};
	if (kv_tc_parser_create(&prm, &p))
		abort();
	for (size_t at = 0; at < n; at += chunk)
		kv_tc_feed(p, (const char *)d + at, n - at < chunk ? n - at : chunk, on_ev, a);
	kv_tc_finish(p, on_ev, a);
	kv_tc_parser_free(p);
	flush(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > 1 << 16)
		return 0;
	for (int format = 0; format < 2; format++) {
		struct acc whole = {KV_BUF_INIT, KV_BUF_INIT}, bytes = {KV_BUF_INIT, KV_BUF_INIT};
		run(data, size, format, size ? size : 1, &whole);
		run(data, size, format, 1, &bytes);
		if (whole.s.len != bytes.s.len || (whole.s.len && memcmp(whole.s.p, bytes.s.p, whole.s.len))) {
			fprintf(stderr, "fuzz_toolcall: events depend on the chunking (format %d)\n", format);
			abort();
		}
		kv_buf_free(&whole.s);
		kv_buf_free(&whole.content);
		kv_buf_free(&bytes.s);
		kv_buf_free(&bytes.content);
	}
	return 0;
}
