/*
 * echo.h - the server's own answers sent back by the client, restored to
 * the exact tokens the model generated (cache/echo.h holds them).
 *
 * Key. What a client sends back of an answer, in the chat request's
 * terms (the Messages and Responses bodies are translated to it first):
 * the content (text parts joined; null is ""), and per tool call its id,
 * its name and its arguments as parsed JSON, written again with sorted
 * keys and no spaces, so re-serialized arguments still match. Tool-call
 * ids are random per answer, so an answer with tool calls cannot be taken
 * for another's. The reasoning is not part of the key: a message that
 * carries reasoning must carry exactly the reasoning returned, and one
 * without (a client that drops it) matches too. An edited message (other
 * content, other arguments, other reasoning) never matches.
 *
 * Record. From the generation prompt on (the tokens after the last
 * message boundary of the request that generated it: "<|im_start|>
 * assistant\n", a think opening), then every
 * generated token (not the end-of-turn token): text and tokens. A later
 * request whose messages hold the answer renders it from these
 * (text/template.h kv_chat_splice), so its prompt is the previous prompt
 * plus what was generated, token for token, and the cache hits through it.
 *
 * Records live in the namespace's cache (salted namespaces apart) and go
 * to its disk tier with the other objects, so they survive a restart.
 */
#ifndef KV_SESSION_ECHO_H
#define KV_SESSION_ECHO_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "cache/echo.h"
#include "session/request.h"
#include "text/template.h"

/* The key of a chat message (an assistant message as the request holds
 * it) into key; its reasoning into reasoning (empty: none). */
int kss_echo_key_message(const json_t *msg, struct kv_buf *key, struct kv_buf *reasoning);

/* One tool call of an answer, as returned. */
struct kss_echo_call {
	const char *id;
	const char *name;
	const char *args;          /* arguments JSON text */
	size_t args_len;
};
/* The key of an answer as the server returned it. */
int kss_echo_key_answer(const char *content, size_t content_len, const struct kss_echo_call *calls, size_t n,
			struct kv_buf *key);

/* The answers of a request's messages that the namespace remembers. */
struct kss_echo_found {
	struct kv_chat_splice *splices;   /* ascending message index */
	size_t n;
	void **blocks;                    /* the records' copies (kc_echo_get) */
};

/* Look every assistant message of messages up in the namespace of salt
 * (NULL: the default); *out filled (free with kss_echo_found_free). A
 * namespace that is not open has nothing. Errors only for memory. */
int kss_echo_find(struct kss_service *s, const char *salt, const json_t *messages, struct kss_echo_found *out);
void kss_echo_found_free(struct kss_echo_found *f);

/* Remember a record in the namespace of salt. */
int kss_echo_remember(struct kss_service *s, const char *salt, const struct kc_echo_rec *r);

/* An answer as it was generated and returned. */
struct kss_echo_answer {
	const char *gp_text;             /* the generation prompt's text */
	size_t gp_len;
	const int32_t *prefix;           /* the tokens of both: the prompt after its last message */
	size_t n_prefix;
	const int32_t *gen;              /* the generated tokens (not the end-of-turn token) */
	size_t n_gen;
	const char *content;             /* what the answer returned: text, */
	size_t content_len;
	const char *reasoning;           /* reasoning (NULL: none), */
	size_t reasoning_len;
	const struct kss_echo_call *calls; /* tool calls */
	size_t n_calls;
};
/* Build the answer's record (key, the generated text decoded) and
 * remember it. Errors are only memory or an undecodable token. */
int kss_echo_remember_answer(struct kss_service *s, const char *salt, const struct kss_echo_answer *a);

#endif
