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
#include <stdint.h>

#include "text/gram.h"
#include "text/output.h"
#include "text/tokbytes.h"
#include "text/tokenizer.h"

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

/*
 * The constraint engine's side (session/constrain.c, text/tcgram.c;
 * docs/constrain.md "Harmony"). A grammar matches bytes, and harmony's
 * markers are special tokens that no text spells; so the constraint's
 * vocabulary gives each marker token one byte that UTF-8 text never holds
 * (0xF8..0xFE, below), and a grammar writes a marker as that byte.
 * Ordinary tokens that hold such a byte are taken out of that vocabulary:
 * no UTF-8 grammar could allow them anyway.
 *
 * KV_HM_B_FRAME (0xFF) starts every harmony-framed grammar: no token has
 * it, the matcher is fed it by hand (session/constrain.c), and a grammar
 * that takes it is thereby known to be framed.
 */
enum {
	KV_HM_B_START = 0xF8,  /* <|start|> */
	KV_HM_B_CHANNEL,       /* <|channel|> */
	KV_HM_B_MESSAGE,       /* <|message|> */
	KV_HM_B_END,           /* <|end|> */
	KV_HM_B_CONSTRAIN,     /* <|constrain|> */
	KV_HM_B_CALL,          /* <|call|> */
	KV_HM_B_RETURN,        /* <|return|> */
	KV_HM_B_FRAME = 0xFF,
};
#define KV_HM_N_MARKERS 7

/* The marker of byte KV_HM_B_START + i ("<|start|>", ...). */
const char *kv_hm_marker(int i);
/* The texts at which the parser ends a message body ("<|end|>",
 * "<|call|>", "<|return|>", "<|start|>"; NULL-terminated): a string in a
 * constrained body keeps clear of them (jschema.h forbid). */
extern const char *const kv_hm_body_words[];

/* Rewrites b (built from t) into the constraint's harmony vocabulary: each
 * marker token becomes its one byte and is no longer special; ordinary
 * tokens holding a byte 0xF8..0xFF lose their bytes (len 0: no grammar
 * allows them). ids[i] gets the id of marker i (may be NULL). 1 when t has
 * all the markers (b rewritten), 0 when it is not a harmony tokenizer (b
 * untouched). */
int kv_hm_vocab_mark(struct kv_tok_bytes *b, const struct kv_tok *t, int32_t ids[KV_HM_N_MARKERS]);

/* The final answer's frame around body (an expression of g):
 *   FRAME <|channel|>final<|message|> body <|return|>
 * as the model writes it after the prompt's "<|start|>assistant". -1 with
 * the grammar's sticky error on failure. */
int kv_hm_gram_final(struct kv_gram *g, int body);

#endif
