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
		else if (n)
			return kv_fail(KV_ERR_INVALID, "--prompt-normalize: unknown rule \"%.*s\" (rules: billing-header, "
				       "all, none)", (int)n, p);
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

int ksv_norm_apply(json_t *chat, unsigned rules, json_t **report)
{
	*report = NULL;
	if (!(rules & KSV_NORM_BILLING_HEADER))
		return 0;
	json_t *msgs = json_object_get(chat, "messages");
	int changes = 0;
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
