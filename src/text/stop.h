/*
 * stop.h - the stop-token set every generation uses (the server and
 * `kvkeep generate` alike), from the model's config.json and
 * generation_config.json (model/config.h, model/genconfig.h), the chat
 * template and the tokenizer. The name keeps its kv_gencfg_ prefix from
 * the time it lived in model/genconfig.c.
 */
#ifndef KV_TEXT_STOP_H
#define KV_TEXT_STOP_H

#include <stdint.h>

#include "model/config.h"
#include "model/genconfig.h"
#include "text/template.h"
#include "text/tokenizer.h"

/*
 * The ids that end a generation (the server and `kvkeep generate` use the
 * same set), without duplicates, in this order:
 *   1. config.json eos_token_id;
 *   2. generation_config.json eos_token_id (gc may be NULL);
 *   3. the chat template's end-of-turn token: the first of <|im_end|>,
 *      <|eot_id|>, <|end|>, <end_of_turn>, <|im_end_of_turn|> that the
 *      template writes and the tokenizer knows as one token (chat may be
 *      NULL);
 *   4. <|endoftext|>, when the tokenizer has it as a special token (the
 *      Qwen document end, which base models emit at the end of an answer).
 * tok may be NULL (3 and 4 are skipped). Returns the count (<= cap).
 */
int kv_gencfg_stop_ids(const struct kv_model_config *cfg, const struct kv_gencfg *gc, const struct kv_tok *tok,
		       const struct kv_chat *chat, int32_t *ids, int cap);

#endif
