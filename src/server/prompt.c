/*
 * prompt.c - a request's prompt: the chat template rendered into tokens
 * and message boundaries (text/template.h), or a completion's prompt
 * tokenized, with the context-length check.
 */
#include "server/server_int.h"
#include "base/err.h"
#include "base/log.h"
#include "session/echo.h"

#include <stdlib.h>
#include <string.h>

/*
 * Boundaries searched per request: the end of system + tools plus the
 * ends of the newest messages. The search renders the template once per
 * message searched, so an unbounded search costs O(messages^2) (0.1 s at
 * 400 messages); the snapshots a turn needs are at the newest boundaries
 * (what the next turn resumes from) and at the anchor, which is always
 * searched.
 */
#define KSV_MAX_MESSAGE_BOUNDARIES 16

void ksv_prompt_free(struct ksv_prompt *pr)
{
	free(pr->tokens);
	free(pr->bounds);
	free(pr->gp_text);
	free(pr->restored);
	memset(pr, 0, sizeof *pr);
}

/* The generation prompt: after the boundary that ends the last message. */
static void keep_gp(struct ksv_prompt *pr, const struct kv_chat_render *rr, size_t n_messages)
{
	if (!rr->n_boundaries || rr->boundary_msgs[rr->n_boundaries - 1] != n_messages)
		return; /* the template's last message end is not a clean cut */
	size_t b = rr->boundary_bytes[rr->n_boundaries - 1];
	pr->gp_tok = (uint32_t)rr->boundaries[rr->n_boundaries - 1];
	pr->gp_len = rr->text_len - b;
	pr->gp_text = malloc(pr->gp_len + 1);
	if (pr->gp_text) {
		memcpy(pr->gp_text, rr->text + b, pr->gp_len);
		pr->gp_text[pr->gp_len] = 0;
	}
}

static int render_chat(struct ksv_server *s, const struct ksv_req *r, const char *salt, struct ksv_prompt *pr,
		       char *param, size_t cap)
{
	if (!s->chat) {
		kv_fail(KV_ERR_UNSUPPORTED, "chat templates are not available in this build");
		return 500;
	}
	const json_t *kw = json_object_get(r->body, "chat_template_kwargs");
	struct kv_chat_opts co = {.add_generation_prompt = 1,
				  .enable_thinking = r->enable_thinking,
				  .kwargs = json_is_object(kw) ? kw : NULL,
				  .max_message_boundaries = KSV_MAX_MESSAGE_BOUNDARIES,
				  .keep_reasoning = !strcmp(s->o.reasoning_history, "keep"),
				  .request_specials = s->o.special_tokens_in_request,
				  .reasoning_effort = json_string_value(json_object_get(r->body, "reasoning_effort"))};
	/* the server's own answers the client sent back: their exact tokens
	 * (only with keep: the template's letter renders them its own way) */
	struct kss_echo_found ef = {0};
	if (co.keep_reasoning && !strcmp(s->o.echo_generated, "on") &&
	    kss_echo_find(s->svc, salt, r->messages, &ef) == KV_OK) {
		co.splices = ef.splices;
		co.n_splices = ef.n;
	}
	struct kv_chat_render rr;
	memset(&rr, 0, sizeof rr);
	int rc = kv_chat_render(s->chat, r->messages, r->tools, &co, &rr);
	if (rc) {
		snprintf(param, cap, "messages");
		kv_chat_render_free(&rr);
		kss_echo_found_free(&ef);
		return rc == KV_ERR_NOMEM ? 500 : 400;
	}
	if (rr.n_spliced && (pr->restored = malloc(rr.n_spliced * sizeof *pr->restored)))
		for (size_t i = 0; i < ef.n; i++)
			if (rr.splice_at[i] >= 0)
				pr->restored[pr->n_restored++] = (uint32_t)ef.splices[i].message;
	kss_echo_found_free(&ef);
	keep_gp(pr, &rr, json_array_size(r->messages));
	pr->n_tokens = (uint32_t)rr.n_tokens;
	pr->tokens = malloc((rr.n_tokens ? rr.n_tokens : 1) * sizeof *pr->tokens);
	pr->bounds = malloc((rr.n_boundaries ? rr.n_boundaries : 1) * sizeof *pr->bounds);
	if (!pr->tokens || !pr->bounds) {
		kv_chat_render_free(&rr);
		kv_fail(KV_ERR_NOMEM, "out of memory");
		return 500;
	}
	memcpy(pr->tokens, rr.tokens, rr.n_tokens * sizeof *pr->tokens);
	for (size_t i = 0; i < rr.n_boundaries; i++)
		if (rr.boundaries[i] > 0 && (uint32_t)rr.boundaries[i] < pr->n_tokens)
			pr->bounds[pr->n_bounds++] = (uint32_t)rr.boundaries[i];
	/* the generation prompt may open a think block (Qwen3.5-style) */
	static const char open_think[] = "<think>\n";
	size_t ol = sizeof open_think - 1;
	pr->in_think = rr.text_len >= ol && !memcmp(rr.text + rr.text_len - ol, open_think, ol);
	kv_chat_render_free(&rr);
	return 0;
}

int ksv_prompt_make(struct ksv_server *s, const struct ksv_req *r, const char *salt, struct ksv_prompt *pr,
		    char *param, size_t cap)
{
	int status;
	memset(pr, 0, sizeof *pr);
	param[0] = 0;
	if (r->api == KSV_API_CHAT) {
		if ((status = render_chat(s, r, salt, pr, param, cap)))
			return status;
	} else if (r->prompt) {
		int32_t *ids = NULL;
		size_t n = 0;
		if (kv_tok_encode(s->tok, r->prompt, r->prompt_len, 1, &ids, &n)) {
			snprintf(param, cap, "prompt");
			return 400;
		}
		pr->tokens = ids;
		pr->n_tokens = (uint32_t)n;
	} else {
		for (size_t i = 0; i < r->n_prompt_ids; i++)
			if (r->prompt_ids[i] >= s->vocab) {
				snprintf(param, cap, "prompt");
				kv_fail(KV_ERR_INVALID, "token id %d is outside the vocabulary (%d)", r->prompt_ids[i], s->vocab);
				return 400;
			}
		pr->tokens = malloc((r->n_prompt_ids ? r->n_prompt_ids : 1) * sizeof *pr->tokens);
		if (!pr->tokens) {
			kv_fail(KV_ERR_NOMEM, "out of memory");
			return 500;
		}
		memcpy(pr->tokens, r->prompt_ids, r->n_prompt_ids * sizeof *pr->tokens);
		pr->n_tokens = (uint32_t)r->n_prompt_ids;
	}
	const char *field = r->api == KSV_API_CHAT ? "messages" : "prompt";
	if (pr->n_tokens == 0) {
		snprintf(param, cap, "%s", field);
		kv_fail(KV_ERR_INVALID, "the prompt is empty");
		return 400;
	}
	if ((int64_t)pr->n_tokens >= s->ctx_len) {
		snprintf(param, cap, "%s", field);
		kv_fail(KV_ERR_INVALID, "the prompt is %u tokens; this model's context is %d tokens", pr->n_tokens, s->ctx_len);
		return 400;
	}
	return 0;
}

int ksv_prompt_append(struct ksv_server *s, struct ksv_prompt *pr, const char *text, uint32_t *n_out)
{
	int32_t *ids = NULL;
	size_t n = 0;
	*n_out = 0;
	int rc = kv_tok_encode(s->tok, text, strlen(text), 1, &ids, &n);
	if (rc)
		return rc;
	int32_t *np = realloc(pr->tokens, (pr->n_tokens + n) * sizeof *np);
	if (!np) {
		free(ids);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	memcpy(np + pr->n_tokens, ids, n * sizeof *ids);
	free(ids);
	pr->tokens = np;
	pr->n_tokens += (uint32_t)n;
	*n_out = (uint32_t)n;
	return KV_OK;
}
