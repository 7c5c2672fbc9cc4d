/*
 * tcgram.h - the grammar of a model's tool calls (the constraint of
 * tool_choice), in the model's own syntax: the three wire forms that
 * toolcall.h parses.
 *
 *   Qwen3 (KV_TC_JSON)   <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
 *                        ARGS: the function's parameters schema (jschema.h)
 *   Qwen3.5 (KV_TC_XML)  <tool_call>\n<function=NAME>\n
 *                        <parameter=P>\nVALUE\n</parameter>\n ... </function>\n</tool_call>
 *                        one block per property in schema order, required
 *                        ones always, optional ones maybe; VALUE is raw text
 *                        for a string parameter and JSON text otherwise,
 *                        as toolcall.c coerces it back with the schema
 *   Nemotron-H (KV_TC_LIST)  <TOOLCALL>[{"name": "NAME", "arguments": ARGS}]</TOOLCALL>
 *                        several calls (parallel) in the one block,
 *                        separated by ", "
 * Several calls (parallel) are otherwise separated by "\n", as the chat
 * templates write them. No string inside a call may contain a closing tag the
 * parser looks for (</tool_call>; in XML also </function>, </parameter>,
 * <parameter=; in the list form </TOOLCALL>): free strings keep clear of the whole tag, constrained
 * ones write '<' as \u003c (JSON) or leave it out (raw).
 *
 * Choices:
 *   KV_TCG_REQUIRED  one call (or several with parallel) of any tool
 *   KV_TCG_NAMED     calls of the named tool only
 *   KV_TCG_AUTO      free text without "<tool_call>" (nor "<function=" in
 *                    XML; "<TOOLCALL>" in the list form), then optionally the calls: a strict function
 *                    schema under tool_choice auto
 *   KV_TCG_NONE      free text without them
 * GPT-OSS's harmony format (harmony = 1; format is then not read): one
 * call, the message the chat template writes for an earlier call, after
 * the prompt's "<|start|>assistant":
 *   FRAME " to=functions.NAME" <|channel|> "commentary json" <|message|> ARGS <|call|>
 * the markers as the bytes of text/harmony.h. The template keeps one call
 * per assistant message and <|call|> ends the generation, so parallel is
 * not read. Only required and named are grammars here (auto and none run
 * unconstrained: KV_ERR_UNSUPPORTED).
 * tools is the OpenAI tools array ([{"type": "function", "function":
 * {"name", "parameters"}}], a bare {"name", "parameters"} accepted too).
 */
#ifndef KV_TEXT_TCGRAM_H
#define KV_TEXT_TCGRAM_H

#include <jansson.h>

#include "text/gram.h"
#include "text/toolcall.h"

enum kv_tcg_choice { KV_TCG_AUTO = 0, KV_TCG_REQUIRED, KV_TCG_NAMED, KV_TCG_NONE };

struct kv_tcg_params {
	int format;        /* enum kv_tc_format */
	int choice;        /* enum kv_tcg_choice */
	const char *name;  /* KV_TCG_NAMED: the function's name */
	int parallel;      /* more than one call allowed */
	int strict;        /* unsupported schema keywords are errors (jschema.h) */
	int harmony;       /* GPT-OSS's harmony call (above) */
};

/* A new grammar (*out, kv_gram_free). KV_ERR_INVALID for a tools array
 * that is not one, a named function that is not in it, or a schema error
 * (the message names the function); KV_ERR_UNSUPPORTED as jschema.h. */
int kv_tcg_build(const json_t *tools, const struct kv_tcg_params *p, struct kv_gram **out);

#endif
