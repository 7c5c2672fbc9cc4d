/*
 * output.h - from generated text to response events: stop strings,
 * reasoning split and tool-call extraction, all incremental.
 *
 * Pipeline, applied to the decoded text as tokens arrive:
 *
 *   text --> stop matcher --> reasoning splitter --> tool-call parser --> events
 *
 *   stop matcher   The request's stop strings are searched in all generated
 *                  text (reasoning included, like vLLM). Text that could be
 *                  the start of a stop string is held back until it is
 *                  decided; on a match the text before it is released and
 *                  the output ends (finish_reason "stop"); the stop string
 *                  itself is never sent.
 *   reasoning      If the output starts (after blanks) with "<think>", or
 *                  the prompt already opened a think block, the text up to
 *                  "</think>" is reasoning (reasoning_content), the rest is
 *                  content (its leading newlines dropped). Partial tags are
 *                  held back. Off with split_reasoning = 0.
 *   tool calls     With tools enabled, content goes through the model's
 *                  tool-call parser (text/toolcall.h): text that may be the
 *                  start of "<tool_call>" is held back, complete calls
 *                  become tool-call events (start with name, argument
 *                  pieces, end). Malformed calls come out as plain content.
 *
 * With harmony on, the stop matcher's output goes to the harmony parser
 * (text/harmony.h) instead: its channels give reasoning, content and tool
 * calls.
 *
 * Events are delivered through a callback as they become certain. Nothing
 * here allocates per token beyond the held-back buffers.
 */
#ifndef KV_TEXT_OUTPUT_H
#define KV_TEXT_OUTPUT_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

enum kv_out_kind {
	KV_OUT_CONTENT = 0,   /* text: content delta */
	KV_OUT_REASONING,     /* text: reasoning delta */
	KV_OUT_TOOL_START,    /* index, name (id made by the caller) */
	KV_OUT_TOOL_ARGS,     /* index, text: a piece of the arguments JSON */
	KV_OUT_TOOL_END,      /* index */
};

struct kv_out_ev {
	int kind;
	const char *text;     /* valid during the callback */
	size_t len;
	int index;            /* tool-call index (0, 1, ...) */
	const char *name;     /* KV_OUT_TOOL_START */
};

typedef void (*kv_out_fn)(void *ctx, const struct kv_out_ev *ev);

struct kv_out_params {
	const char *const *stop; /* stop strings (borrowed, non-empty) */
	size_t n_stop;
	int split_reasoning;     /* 1: split <think>...</think> out */
	int in_think;            /* 1: the prompt ended inside an open think block */
	const void *tools;       /* json_t array of the request's tools, NULL = no tool parsing */
	int xml_tools;           /* the tool-call syntax, enum kv_tc_format: 0 Qwen3 / Granite
				    JSON, 1 Qwen3.5 XML, 2 Nemotron-H <TOOLCALL> list */
	int harmony;             /* 1: GPT-OSS harmony messages (text/harmony.h), with
	                            their special tokens in the text: replaces the
	                            reasoning and tool-call stages */
	kv_out_fn fn;
	void *ctx;
};

struct kv_out;

int kv_out_create(const struct kv_out_params *p, struct kv_out **out);
void kv_out_destroy(struct kv_out *o);
/* Feed decoded text. Returns 1 once a stop string matched (ignore what
 * follows), 0 otherwise, or a negative kv_err. */
int kv_out_feed(struct kv_out *o, const char *text, size_t n);
/* End of generation: release everything held back (partial tags become
 * plain text, an unfinished tool call becomes content). */
int kv_out_finish(struct kv_out *o);
/* Tool calls completed so far. */
int kv_out_n_tool_calls(const struct kv_out *o);

/* --- the stop matcher alone (exposed for tests) ---------------------------- */

/*
 * Given pending text p[0, n) and the stop strings, returns the number of
 * bytes that can be released now. *hit is set to 1 when a stop string
 * starts at the returned offset (release that many bytes, then stop).
 */
size_t kv_out_stop_scan(const char *p, size_t n, const char *const *stop, size_t n_stop, int *hit);

#endif
