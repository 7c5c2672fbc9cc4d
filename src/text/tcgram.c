/*
 * tcgram.c - tool-call grammars (tcgram.h).
 *
 * The call syntax lives here and in toolcall.c only: this file writes the
 * grammar of what toolcall.c reads back, byte for byte the layout the
 * chat templates use for earlier calls.
 */
#include "text/tcgram.h"
#include "base/err.h"
#include "text/harmony.h"
#include "text/jschema.h"

#include <stdlib.h>
#include <string.h>

static const char *const JSON_WORDS[] = {"</tool_call>", NULL};
static const char *const XML_WORDS[] = {"</tool_call>", "</function>", "</parameter>", "<parameter=", NULL};
static const char *const LIST_WORDS[] = {"</TOOLCALL>", NULL};

static const json_t *fn_of(const json_t *tool)
{
	const json_t *f = json_object_get(tool, "function");
	return json_is_object(f) ? f : tool;
}

/* A name the XML form can carry: no '<', '>' or newline, at most 256 bytes. */
static int xml_name_ok(const char *s)
{
	size_t n = strlen(s);
	return n && n <= 256 && !strpbrk(s, "<>\n\r");
}

/* The arguments of one function in the JSON form. */
static int json_args(struct kv_gram *g, const json_t *params, int strict, const char *const *forbid, int *x)
{
	struct kv_js_opts o = {.strict = strict, .forbid = forbid};
	if (!params || json_is_null(params)) {
		json_t *obj = json_pack("{s:s}", "type", "object");
		int rc = kv_jschema_expr(g, obj, &o, x);
		json_decref(obj);
		return rc;
	}
	return kv_jschema_expr(g, params, &o, x);
}

/* The parameter blocks of one function in the XML form. */
static int xml_params(struct kv_gram *g, const json_t *params, int strict, int *x)
{
	struct kv_js_opts o = {.strict = strict, .forbid = XML_WORDS, .raw_strings = 1};
	const json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
	const json_t *addl = json_object_get(params, "additionalProperties");
	if (params && !json_is_null(params) && !json_is_object(params))
		return kv_fail(KV_ERR_INVALID, "parameters must be a JSON Schema object");
	if (!props || !json_object_size(props)) {
		if (json_is_false(addl)) {
			*x = kv_gram_empty(g);
			return *x < 0 ? kv_gram_error(g) : KV_OK;
		}
		/* free parameters: any names, raw text values */
		static const uint32_t kc[] = {'-', '-', '0', '9', 'A', 'Z', '_', '_', 'a', 'z'};
		int val;
		int rc = kv_jschema_text_without(g, XML_WORDS, &val);
		if (rc)
			return rc;
		int blk = kv_gram_seq(g, (int[]){kv_gram_lits(g, "<parameter="), kv_gram_rep(g, kv_gram_cps(g, kc, 5, 0), 1, 64),
						 kv_gram_lits(g, ">\n"), val, kv_gram_lits(g, "\n</parameter>\n")},
				      5);
		*x = kv_gram_star(g, blk);
		return *x < 0 ? kv_gram_error(g) : KV_OK;
	}
	if (!json_is_object(props))
		return kv_fail(KV_ERR_INVALID, "parameters.properties must be an object");
	size_t n = json_object_size(props);
	int *blocks = calloc(n + 1, sizeof *blocks), nb = 0, rc = KV_OK;
	if (!blocks)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	const char *k;
	json_t *v;
	json_object_foreach((json_t *)props, k, v) {
		if (!xml_name_ok(k)) {
			rc = kv_fail(KV_ERR_UNSUPPORTED, "parameter name \"%.100s\" cannot be written in the XML tool-call form", k);
			break;
		}
		int required = 0;
		size_t i;
		json_t *r;
		if (json_is_array(req))
			json_array_foreach(req, i, r) required |= json_is_string(r) && !strcmp(json_string_value(r), k);
		if (json_is_false(v)) {
			if (required) {
				rc = kv_fail(KV_ERR_INVALID, "required parameter \"%.100s\" has the schema false", k);
				break;
			}
			continue;
		}
		int val;
		if ((rc = kv_jschema_expr(g, v, &o, &val))) {
			kv_fail_ctx(rc, "parameter \"%.100s\"", k);
			break;
		}
		struct kv_buf open = KV_BUF_INIT;
		kv_buf_printf(&open, "<parameter=%s>\n", k);
		int blk = kv_gram_seq3(g, kv_gram_lit(g, open.p, open.len), val, kv_gram_lits(g, "\n</parameter>\n"));
		kv_buf_free(&open);
		blocks[nb++] = required ? blk : kv_gram_opt(g, blk);
	}
	if (!rc) {
		*x = kv_gram_seq(g, blocks, nb);
		if (*x < 0)
			rc = kv_gram_error(g);
	}
	free(blocks);
	return rc;
}

/* A name the harmony header can carry: the parser reads it up to a blank
 * or '<' (harmony.c), at most 256 bytes. */
static int harmony_name_ok(const char *s)
{
	size_t n = strlen(s);
	return n && n <= 256 && !strpbrk(s, "<> \t\n\r");
}

/* One harmony call: the template's form of an assistant tool call. */
static int harmony_call(struct kv_gram *g, const char *name, const json_t *params, int strict, int *x)
{
	int body, rc;
	if (!harmony_name_ok(name))
		return kv_fail(KV_ERR_UNSUPPORTED, "function name \"%.100s\" cannot be written in a harmony header", name);
	if ((rc = json_args(g, params, strict, kv_hm_body_words, &body)))
		return kv_fail_ctx(rc, "tool '%.100s'", name);
	struct kv_buf h = KV_BUF_INIT;
	kv_buf_printf(&h, "%c to=functions.%s%ccommentary json%c", KV_HM_B_FRAME, name, KV_HM_B_CHANNEL, KV_HM_B_MESSAGE);
	static const char close[] = {(char)KV_HM_B_CALL};
	*x = kv_gram_seq3(g, h.oom ? -1 : kv_gram_lit(g, h.p, h.len), body, kv_gram_lit(g, close, 1));
	kv_buf_free(&h);
	return *x < 0 ? kv_gram_error(g) : KV_OK;
}

/* One call of one function. */
static int one_call(struct kv_gram *g, const json_t *fn, const struct kv_tcg_params *p, int *x)
{
	const char *name = json_string_value(json_object_get(fn, "name"));
	const json_t *params = json_object_get(fn, "parameters");
	int body, rc;
	if (!name || !*name)
		return kv_fail(KV_ERR_INVALID, "a tool has no function name");
	if (p->harmony)
		return harmony_call(g, name, params, p->strict, x);
	if (p->format == KV_TC_XML) {
		if (!xml_name_ok(name))
			return kv_fail(KV_ERR_UNSUPPORTED, "function name \"%.100s\" cannot be written in the XML tool-call form",
				       name);
		if ((rc = xml_params(g, params, p->strict, &body)))
			return kv_fail_ctx(rc, "tool '%.100s'", name);
		struct kv_buf h = KV_BUF_INIT;
		kv_buf_printf(&h, "<tool_call>\n<function=%s>\n", name);
		*x = kv_gram_seq3(g, kv_gram_lit(g, h.p, h.len), body, kv_gram_lits(g, "</function>\n</tool_call>"));
		kv_buf_free(&h);
	} else {
		int list = p->format == KV_TC_LIST;
		if ((rc = json_args(g, params, p->strict, list ? LIST_WORDS : JSON_WORDS, &body)))
			return kv_fail_ctx(rc, "tool '%.100s'", name);
		json_t *ns = json_string(name);
		char *nt = json_dumps(ns, JSON_ENCODE_ANY);
		json_decref(ns);
		if (!nt)
			return kv_fail(KV_ERR_NOMEM, "out of memory");
		struct kv_buf h = KV_BUF_INIT;
		/* the list form's element is the object alone: the block around
		 * all the calls is written by kv_tcg_build */
		kv_buf_printf(&h, list ? "{\"name\": %s, \"arguments\": " : "<tool_call>\n{\"name\": %s, \"arguments\": ", nt);
		free(nt);
		*x = kv_gram_seq3(g, kv_gram_lit(g, h.p, h.len), body, kv_gram_lits(g, list ? "}" : "}\n</tool_call>"));
		kv_buf_free(&h);
	}
	return *x < 0 ? kv_gram_error(g) : KV_OK;
}

int kv_tcg_build(const json_t *tools, const struct kv_tcg_params *p, struct kv_gram **out)
{
	struct kv_gram *g;
	int rc, *calls = NULL, nc = 0;
	*out = NULL;
	if (!p->harmony && p->format != KV_TC_JSON && p->format != KV_TC_XML && p->format != KV_TC_LIST)
		return kv_fail(KV_ERR_INVALID, "tool-call format %d is unknown", p->format);
	if (p->harmony && p->choice != KV_TCG_REQUIRED && p->choice != KV_TCG_NAMED)
		return kv_fail(KV_ERR_UNSUPPORTED, "the harmony format constrains tool_choice required and named only");
	if (tools && !json_is_array(tools))
		return kv_fail(KV_ERR_INVALID, "tools must be an array");
	if ((rc = kv_gram_create(&g)))
		return rc;
	const char *const *words = p->format == KV_TC_XML    ? (const char *const[]){"<tool_call>", "<function=", NULL}
				   : p->format == KV_TC_LIST ? (const char *const[]){"<TOOLCALL>", NULL}
							     : (const char *const[]){"<tool_call>", NULL};
	int root = kv_gram_rule(g, "root", 4), x = -1;
	if (p->choice != KV_TCG_NONE) {
		size_t n = tools ? json_array_size(tools) : 0, i;
		json_t *t;
		calls = calloc(n + 1, sizeof *calls);
		if (!calls) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto fail;
		}
		json_array_foreach((json_t *)tools, i, t) {
			const json_t *fn = fn_of(t);
			const char *name = json_string_value(json_object_get(fn, "name"));
			if (p->choice == KV_TCG_NAMED && (!name || !p->name || strcmp(name, p->name)))
				continue;
			if ((rc = one_call(g, fn, p, &calls[nc])))
				goto fail;
			nc++;
		}
		if (!nc) {
			rc = p->choice == KV_TCG_NAMED
				     ? kv_fail(KV_ERR_INVALID, "tool_choice names function '%.100s', which is not in tools",
					       p->name ? p->name : "")
				     : kv_fail(KV_ERR_INVALID, "tool_choice asks for a tool call but tools is empty");
			goto fail;
		}
		int call = kv_gram_alt(g, calls, nc);
		int list = !p->harmony && p->format == KV_TC_LIST;
		if (p->parallel && !p->harmony) {
			int callr = kv_gram_rule_new(g, "tool-call");
			kv_gram_define(g, callr, call);
			call = kv_gram_seq2(g, kv_gram_ref(g, callr),
					    kv_gram_star(g, kv_gram_seq2(g, kv_gram_lits(g, list ? ", " : "\n"),
									 kv_gram_ref(g, callr))));
		}
		if (list) /* one block holds every call, ", " between them */
			call = kv_gram_seq3(g, kv_gram_lits(g, "<TOOLCALL>["), call, kv_gram_lits(g, "]</TOOLCALL>"));
		x = call;
	}
	if (p->choice == KV_TCG_AUTO || p->choice == KV_TCG_NONE) {
		int text;
		if ((rc = kv_jschema_text_without(g, words, &text)))
			goto fail;
		x = p->choice == KV_TCG_NONE ? text : kv_gram_seq2(g, text, kv_gram_opt(g, x));
	}
	if ((rc = kv_gram_define(g, root, x)) || (rc = kv_gram_error(g)))
		goto fail;
	kv_gram_set_root(g, root);
	free(calls);
	*out = g;
	return KV_OK;
fail:
	free(calls);
	kv_gram_free(g);
	return rc ? rc : KV_ERR_INVALID;
}
