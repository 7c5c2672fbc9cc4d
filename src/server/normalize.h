/*
 * normalize.h - volatile-prefix rules (--prompt-normalize): parts of a
 * prompt that agents change between sessions at the very start of the
 * prompt, removed before the template renders, so that a new session can
 * reuse the cached system prompt + tools of the last one.
 *
 * Rules (names for --prompt-normalize, comma-separated; "none" = no rule,
 * "all" = every rule):
 *   billing-header   Claude Code's first system block is a line
 *                    "x-anthropic-billing-header: cc_version=...;
 *                    cc_entrypoint=...; [cch=...;]" whose values change per
 *                    session and per version. The rule removes every line
 *                    of a system message that starts with
 *                    "x-anthropic-billing-header:" (with its line break).
 *                    It is metadata for Anthropic's billing, not an
 *                    instruction to the model. DEFAULT: on (without it,
 *                    two Claude Code sessions share about 15 tokens
 *                    instead of the whole system prompt and tools).
 *   tools-order      MCP clients list their tools in whatever order their
 *                    servers answered, so the same tools come in another
 *                    order from one request to the next and the prompt
 *                    departs from the cache in the tools block. The rule
 *                    renders the tool definitions sorted by name (stable:
 *                    equal names keep their order). This CHANGES WHAT THE
 *                    MODEL SEES: the tools in another order than the
 *                    client sent them. Off by default; "all" includes it.
 * A rule changes nothing but what it names: other text, other messages,
 * tools and their order are left byte for byte. Each change is reported
 * (rule, message index and the bytes removed, or the tools that moved) so
 * the log and the response's "kvkeep" usage extension can say what was
 * changed.
 */
#ifndef KV_SERVER_NORMALIZE_H
#define KV_SERVER_NORMALIZE_H

#include <jansson.h>

#define KSV_NORM_BILLING_HEADER 1u
#define KSV_NORM_TOOLS_ORDER    2u
#define KSV_NORM_ALL            3u
#define KSV_NORM_DEFAULT        KSV_NORM_BILLING_HEADER

/* Parse a rule list ("billing-header", "tools-order", "none", "all",
 * comma-separated).
 * KV_ERR_INVALID naming the unknown rule. */
int ksv_norm_parse(const char *spec, unsigned *rules);

/* Apply rules to the "messages" of a chat body in place, and to its tools
 * (*tools: an array or NULL; replaced by a sorted copy when the order
 * changes, the old reference dropped). Returns the number of changes;
 * *report (new ref, or NULL when nothing changed) is a list of
 * {"rule", "message", "removed"} and {"rule", "moved"} objects. */
int ksv_norm_apply(json_t *chat, json_t **tools, unsigned rules, json_t **report);

#endif
