/*
 * normalize.c - see normalize.h.
 */
#include "server/normalize.h"
#include "base/buf.h"
#include "base/err.h"

#include <string.h>

#define BILLING "x-anthropic-billing-header:"

int ksv_norm_parse(const char *spec, unsigned *rules)
{
	*rules = 0;
	const char *p = spec ? spec : "";
	while (*p) {
		const char *e = strchr(p, ',');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		if (n == 4 && !memcmp(p, "none", 4))
			*rules = 0;
		else if (n == 3 && !memcmp(p, "all", 3))
			*rules |= KSV_NORM_ALL;
		else if (n == 14 && !memcmp(p, "billing-header", 14))
			*rules |= KSV_NORM_BILLING_HEADER;
		else if (n == 11 && !memcmp(p, "tools-order", 11))
			*rules |= KSV_NORM_TOOLS_ORDER;
		else if (n)
			return kv_fail(KV_ERR_INVALID, "--prompt-normalize: unknown rule \"%.*s\" (rules: billing-header, "
				       "tools-order, all, none)", (int)n, p);
		p += n + (e ? 1 : 0);
	}
	return KV_OK;
}

/* Removes the billing-header lines of one string; returns 1 if any. */
static int strip_billing(const char *s, size_t n, struct kv_buf *kept, struct kv_buf *removed)
{
	int hit = 0;
	size_t i = 0;
	while (i < n) {
		const char *nl = memchr(s + i, '\n', n - i);
		size_t end = nl ? (size_t)(nl - s) + 1 : n;
		size_t bl = sizeof BILLING - 1;
		if (end - i >= bl && !memcmp(s + i, BILLING, bl)) {
			kv_buf_add(removed, s + i, end - i);
			hit = 1;
		} else
			kv_buf_add(kept, s + i, end - i);
		i = end;
	}
	return hit;
}

static const char *tool_name(const json_t *t)
{
	const json_t *fn = json_object_get(t, "function");
	const char *n = json_string_value(json_object_get(fn ? fn : t, "name"));
	return n ? n : "";
}

/* tools-order: a copy sorted by name (insertion sort: stable, and tool
 * lists are short); *tools replaced when the order changed. */
static int sort_tools(json_t **tools, json_t **report)
{
	size_t n = json_array_size(*tools), moved = 0;
	if (n < 2)
		return 0;
	json_t *sorted = json_array();
	for (size_t i = 0; i < n; i++) {
		json_t *t = json_array_get(*tools, i);
		size_t at = json_array_size(sorted);
		while (at > 0 && strcmp(tool_name(json_array_get(sorted, at - 1)), tool_name(t)) > 0)
			at--;
		json_array_insert(sorted, at, t);
	}
	for (size_t i = 0; i < n; i++)
		moved += json_array_get(sorted, i) != json_array_get(*tools, i);
	if (!moved) {
		json_decref(sorted);
		return 0;
	}
	if (!*report)
		*report = json_array();
	json_array_append_new(*report, json_pack("{s:s, s:I}", "rule", "tools-order", "moved", (json_int_t)moved));
	json_decref(*tools);
	*tools = sorted;
	return 1;
}

int ksv_norm_apply(json_t *chat, json_t **tools, unsigned rules, json_t **report)
{
	*report = NULL;
	int changes = 0;
	if ((rules & KSV_NORM_TOOLS_ORDER) && tools && *tools)
		changes += sort_tools(tools, report);
	if (!(rules & KSV_NORM_BILLING_HEADER))
		return changes;
	json_t *msgs = json_object_get(chat, "messages");
	size_t i;
	json_t *m;
	json_array_foreach(msgs, i, m) {
		const char *role = json_string_value(json_object_get(m, "role"));
		json_t *c = json_object_get(m, "content");
		if (!role || (strcmp(role, "system") && strcmp(role, "developer")) || !json_is_string(c))
			continue;
		struct kv_buf kept = KV_BUF_INIT, removed = KV_BUF_INIT;
		if (strip_billing(json_string_value(c), json_string_length(c), &kept, &removed)) {
			if (!*report)
				*report = json_array();
			json_array_append_new(*report, json_pack("{s:s, s:I, s:s%}", "rule", "billing-header", "message",
								 (json_int_t)i, "removed", removed.p, removed.len));
			json_object_set_new(m, "content", json_stringn(kept.p ? kept.p : "", kept.len));
			changes++;
		}
		kv_buf_free(&kept);
		kv_buf_free(&removed);
	}
	return changes;
}
