/*
 * stop.c - the ids that end a generation (stop.h). It sits in the text
 * layer, not beside genconfig.c in model/, because it asks the tokenizer
 * and the chat template which end-of-turn token is in use.
 */
#include "text/stop.h"

#include <string.h>

static int add_id(int32_t *ids, int n, int cap, int32_t id)
{
	if (id < 0)
		return n;
	for (int i = 0; i < n; i++)
		if (ids[i] == id)
			return n;
	if (n < cap)
		ids[n++] = id;
	return n;
}

int kv_gencfg_stop_ids(const struct kv_model_config *cfg, const struct kv_gencfg *gc, const struct kv_tok *tok,
		       const struct kv_chat *chat, int32_t *ids, int cap)
{
	/* end-of-turn markers of the chat formats in use (ChatML, Llama 3,
	 * Phi, Gemma), most common first */
	static const char *const eot[] = {"<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|im_end_of_turn|>"};
	int n = 0;
	for (int i = 0; cfg && i < cfg->n_eos; i++)
		n = add_id(ids, n, cap, cfg->eos_ids[i]);
	for (int i = 0; gc && i < gc->n_eos; i++)
		n = add_id(ids, n, cap, gc->eos_ids[i]);
	if (!tok)
		return n;
	const char *src = chat ? kv_chat_template_source(chat, 0) : NULL;
	if (chat && kv_chat_harmony(chat)) {
		/* harmony: "<|end|>" ends a message, not the answer (the final
		 * answer comes after the analysis); "<|return|>" and "<|call|>"
		 * end the generation */
		n = add_id(ids, n, cap, kv_tok_id(tok, "<|return|>"));
		n = add_id(ids, n, cap, kv_tok_id(tok, "<|call|>"));
		src = NULL;
	}
	for (size_t i = 0; src && i < sizeof eot / sizeof eot[0]; i++) {
		int32_t id = kv_tok_id(tok, eot[i]);
		if (id >= 0 && strstr(src, eot[i])) {
			n = add_id(ids, n, cap, id);
			break;
		}
	}
	int32_t et = kv_tok_id(tok, "<|endoftext|>");
	if (et >= 0 && kv_tok_is_special(tok, et))
		n = add_id(ids, n, cap, et);
	return n;
}
