/*
 * harmony.h - GPT-OSS's harmony format in generated text, turned into
 * reasoning, content and tool calls (the events of text/output.h).
 *
 * The chat template ends the prompt with "<|start|>assistant"; the model
 * then writes one or more messages, each a header, "<|message|>", a body
 * and an end marker:
 *
 *   <|channel|>analysis<|message|>Need the weather.<|end|>
 *   <|start|>assistant<|channel|>commentary to=functions.get_weather
 *     <|constrain|>json<|message|>{"city":"Paris"}<|call|>
 *   ... or ...
 *   <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>
 *
 * The text arrives with its special tokens (the decoder keeps them for
 * harmony models; session/request.c). The header names the channel
 * ("<|channel|>NAME"), the recipient ("to=NAME", before or after the
 * channel) and the content type ("<|constrain|>TYPE", ignored). Bodies:
 *   analysis                reasoning (content when split_reasoning = 0)
 *   final, commentary       content (commentary without a recipient is a
 *                           preamble the user may see)
 *   to=functions.NAME       a tool call NAME (tools on), its body the
 *                           arguments as the model wrote them; with tools
 *                           off the body is content
 * "<|call|>" and "<|return|>" end the generation (they are stop tokens, so
 * a call usually ends with the output itself: kv_hm_finish reports it).
 *
 * Streaming: reasoning and content come out as they arrive, except a
 * suffix that may be the start of a marker; a tool call comes out whole
 * (start, arguments, end) when its message ends. A header that does not
 * reach "<|message|>" within KV_HM_MAX_HEADER bytes, or by the end, is not
 * harmony: it and everything after it come out as content, unparsed.
 * Nothing is dropped but the markers themselves, the headers and the
 * blanks between messages.
 */
#ifndef KV_TEXT_HARMONY_H
#define KV_TEXT_HARMONY_H

#include <stddef.h>

#include "text/output.h"

#define KV_HM_MAX_HEADER 512

struct kv_hm_params {
	int split_reasoning;  /* 1: analysis is reasoning, 0: content */
	int tools;            /* 1: to=functions.NAME messages are tool calls */
	kv_out_fn fn;         /* the events (text/output.h) */
	void *ctx;
};

struct kv_hm;

int kv_hm_create(const struct kv_hm_params *p, struct kv_hm **out);
void kv_hm_destroy(struct kv_hm *h);
/* Generated text, any split. 0 or a negative kv_err (out of memory). */
int kv_hm_feed(struct kv_hm *h, const char *text, size_t n);
/* End of the output: what is held back comes out, an open tool call is
 * reported. */
int kv_hm_finish(struct kv_hm *h);
/* Tool calls reported so far. */
int kv_hm_n_calls(const struct kv_hm *h);

#endif
