/*
 * chat.c - the chat layer of template.h: loading a tokenizer_config.json
 * (or a GGUF's) chat template, preparing the messages, rendering with the
 * message boundaries the prefix cache resumes at, and the special-token
 * literals of request strings.
 */
#include "text/jinja_int.h"
#include "text/toolcall.h"
#include "model/gguf_model.h"
#include "base/hash.h"
#include "base/io.h"

#include <pthread.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* The tool-call syntax a template renders (enum kv_tc_format):
 * Nemotron-H's <TOOLCALL>[...] list, Qwen3.5's <function=...> XML, else
 * the <tool_call> JSON of Qwen3 and Granite 4.0-H. */
static int tool_format(const char *src, const char *src_tools)
{
	if (strstr(src, "<TOOLCALL>") || (src_tools && strstr(src_tools, "<TOOLCALL>")))
		return KV_TC_LIST;
	if (strstr(src, "<function=") || (src_tools && strstr(src_tools, "<function=")))
		return KV_TC_XML;
	return KV_TC_JSON;
}

/* ------------------------------------------------------------------------
 * The chat layer
 * ---------------------------------------------------------------------- */

#define CHAT_MAX_CONFIG (64u << 20)
#define CHAT_PROBE "\x01kvkeep-probe\x01"

struct added_tok {
	char *s;
	size_t n;
	int cut;                /* may start a boundary: no lstrip/rstrip/normalized */
};

struct kv_chat {
	struct kv_tmpl *tmpl;           /* "default" (or the only) template */
	struct kv_tmpl *tmpl_tools;     /* "tool_use" template when the config has one */
	char *src, *src_tools;          /* their sources (NUL-terminated) */
	const struct kv_tok *tok;       /* borrowed */
	json_t *special;                /* object: bos_token, eos_token, ... */
	struct added_tok *added;
	size_t n_added;
	size_t max_added;               /* longest added token, bytes */
	int xml_tools;
	int harmony;                    /* GPT-OSS harmony template (see harmony_messages) */
	struct keep_memo *memo;         /* renders of earlier user turns (keep_reasoning) */
};

/*
 * The keep_reasoning memo: what rendering an earlier user turn produced,
 * by the content of every message up to it (and the template, tools and
 * variables), so the next request of the same conversation does not
 * render it again. Entries are small (one turn's text); LRU, bounded in
 * bytes. One mutex: renders run on many threads.
 */
#define KEEP_MEMO_BYTES (16u << 20)
#define KEEP_MEMO_SLOTS 512

struct keep_ent {
	struct kv_h128 key;
	int kind;                /* 1: d (where a message starts), 2: a turn's text */
	size_t d;
	struct kv_h128 before;   /* kind 2: hash of the render's text before d */
	char *text;              /* kind 2 (owned) */
	size_t len;
	uint64_t used;           /* LRU tick; 0: free slot */
};

struct keep_memo {
	pthread_mutex_t mu;
	struct keep_ent e[KEEP_MEMO_SLOTS];
	size_t bytes;
	uint64_t tick;
};

static const char *const special_keys[] = {
	"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
};

/* A token given as "text" or as an AddedToken object {"content": ...}. */
static const char *token_text(const json_t *v)
{
	if (json_is_string(v))
		return json_string_value(v);
	if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
		return json_string_value(json_object_get(v, "content"));
	return NULL;
}

void kv_chat_free(struct kv_chat *c)
{
	if (!c)
		return;
	kv_tmpl_free(c->tmpl);
	kv_tmpl_free(c->tmpl_tools);
	free(c->src);
	free(c->src_tools);
	json_decref(c->special);
	for (size_t i = 0; i < c->n_added; i++)
		free(c->added[i].s);
	free(c->added);
	if (c->memo) {
		for (size_t i = 0; i < KEEP_MEMO_SLOTS; i++)
			free(c->memo->e[i].text);
		pthread_mutex_destroy(&c->memo->mu);
		free(c->memo);
	}
	free(c);
}

static int add_added(struct kv_chat *c, const char *s, int cut)
{
	size_t n = strlen(s);
	if (!n)
		return KV_OK;
	for (size_t i = 0; i < c->n_added; i++)
		if (c->added[i].n == n && !memcmp(c->added[i].s, s, n)) {
			c->added[i].cut &= cut;
			return KV_OK;
		}
	struct added_tok *v = realloc(c->added, (c->n_added + 1) * sizeof *v);
	if (!v)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	c->added = v;
	v[c->n_added].s = strdup(s);
	if (!v[c->n_added].s)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	v[c->n_added].n = n;
	v[c->n_added].cut = cut;
	c->n_added++;
	if (n > c->max_added)
		c->max_added = n;
	return KV_OK;
}

/* Added tokens from an added_tokens_decoder object or added_tokens array. */
static int collect_added(struct kv_chat *c, const json_t *list)
{
	const char *key;
	json_t *v;
	size_t i;
	int rc;
	if (json_is_object(list)) {
		json_object_foreach((json_t *)list, key, v) {
			const char *s = token_text(v);
			if (!s)
				continue;
			int cut = !json_is_true(json_object_get(v, "lstrip")) && !json_is_true(json_object_get(v, "rstrip")) &&
				  !json_is_true(json_object_get(v, "single_word")) &&
				  !json_is_true(json_object_get(v, "normalized"));
			if ((rc = add_added(c, s, cut)))
				return rc;
		}
	} else if (json_is_array(list)) {
		json_array_foreach(list, i, v) {
			const char *s = token_text(v);
			if (!s)
				continue;
			int sp = json_is_true(json_object_get(v, "special"));
			json_t *nz = json_object_get(v, "normalized");
			int normalized = nz ? json_is_true(nz) : !sp;
			int cut = !json_is_true(json_object_get(v, "lstrip")) && !json_is_true(json_object_get(v, "rstrip")) &&
				  !json_is_true(json_object_get(v, "single_word")) && !normalized;
			if ((rc = add_added(c, s, cut)))
				return rc;
		}
	}
	return KV_OK;
}

/* GPT-OSS's template writes harmony messages: channels and message markers. */
static int is_harmony(const char *src)
{
	return strstr(src, "<|channel|>") && strstr(src, "<|message|>") && strstr(src, "<|start|>");
}

static int compile_named(const char *src, const char *what, char **copy, struct kv_tmpl **out)
{
	int rc = kv_tmpl_compile(src, strlen(src), what, out);
	if (rc)
		return rc;
	*copy = strdup(src);
	if (!*copy) {
		kv_tmpl_free(*out);
		*out = NULL;
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	return KV_OK;
}

/* Build a chat from a parsed tokenizer_config.json and optionally the
 * text of a chat_template.jinja file (which wins over the config). */
static int chat_build(const json_t *cfg, const char *jinja_src, const char *what, const struct kv_tok *tok,
		      struct kv_chat **out)
{
	struct kv_chat *c = calloc(1, sizeof *c);
	char wbuf[300];
	int rc = KV_OK;
	if (!c)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	c->tok = tok;
	c->special = json_object();
	c->memo = calloc(1, sizeof *c->memo);
	if (c->memo)
		pthread_mutex_init(&c->memo->mu, NULL);
	if (!c->special || !c->memo) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto fail;
	}
	if (jinja_src) {
		snprintf(wbuf, sizeof wbuf, "%s (chat_template.jinja)", what);
		if ((rc = compile_named(jinja_src, wbuf, &c->src, &c->tmpl)))
			goto fail;
	} else {
		json_t *ct = json_object_get(cfg, "chat_template");
		if (json_is_string(ct)) {
			snprintf(wbuf, sizeof wbuf, "%s: chat_template", what);
			if ((rc = compile_named(json_string_value(ct), wbuf, &c->src, &c->tmpl)))
				goto fail;
		} else if (json_is_array(ct)) {
			size_t i;
			json_t *e;
			json_array_foreach(ct, i, e) {
				const char *name = json_string_value(json_object_get(e, "name"));
				const char *t = json_string_value(json_object_get(e, "template"));
				if (!name || !t) {
					rc = kv_fail(KV_ERR_INVALID, "%s: chat_template[%zu] needs \"name\" and \"template\" strings",
						     what, i);
					goto fail;
				}
				snprintf(wbuf, sizeof wbuf, "%s: chat_template '%s'", what, name);
				if (!strcmp(name, "default") && !c->tmpl)
					rc = compile_named(t, wbuf, &c->src, &c->tmpl);
				else if (!strcmp(name, "tool_use") && !c->tmpl_tools)
					rc = compile_named(t, wbuf, &c->src_tools, &c->tmpl_tools);
				if (rc)
					goto fail;
			}
			if (!c->tmpl) {
				rc = kv_fail(KV_ERR_INVALID, "%s: chat_template list has no \"default\" template", what);
				goto fail;
			}
		} else {
			rc = kv_fail(KV_ERR_NOT_FOUND, "%s: no chat_template (string or list of named templates)", what);
			goto fail;
		}
	}
	for (size_t i = 0; i < sizeof special_keys / sizeof special_keys[0]; i++) {
		const char *s = token_text(json_object_get(cfg, special_keys[i]));
		if (s) {
			json_object_set_new(c->special, special_keys[i], json_string(s));
			if ((rc = add_added(c, s, 1)))
				goto fail;
		}
	}
	json_t *extra = json_object_get(cfg, "additional_special_tokens");
	if (json_is_array(extra) && json_array_size(extra)) {
		json_t *arr = json_array(), *e;
		size_t i;
		json_array_foreach(extra, i, e) {
			const char *s = token_text(e);
			if (s) {
				json_array_append_new(arr, json_string(s));
				if ((rc = add_added(c, s, 1))) {
					json_decref(arr);
					goto fail;
				}
			}
		}
		json_object_set_new(c->special, "additional_special_tokens", arr);
	}
	if ((rc = collect_added(c, json_object_get(cfg, "added_tokens_decoder"))))
		goto fail;
	/* only tokens the tokenizer knows as single ids may mark a cut */
	if (tok)
		for (size_t i = 0; i < c->n_added; i++)
			if (c->added[i].cut && kv_tok_id(tok, c->added[i].s) < 0)
				c->added[i].cut = 0;
	c->xml_tools = tool_format(c->src, c->src_tools);
	c->harmony = is_harmony(c->src);
	*out = c;
	return KV_OK;
fail:
	kv_chat_free(c);
	return rc;
}

int kv_chat_load_mem(const char *tokenizer_config_json, size_t len, const struct kv_tok *tok, struct kv_chat **out)
{
	json_t *cfg;
	int rc;
	*out = NULL;
	if ((rc = kv_json_parse("tokenizer_config.json", tokenizer_config_json, len, KV_JSON_MAX_DEPTH, &cfg)))
		return rc;
	if (!json_is_object(cfg)) {
		json_decref(cfg);
		return kv_fail(KV_ERR_INVALID, "tokenizer_config.json: not a JSON object");
	}
	rc = chat_build(cfg, NULL, "tokenizer_config.json", tok, out);
	json_decref(cfg);
	return rc;
}

int kv_chat_load(const char *model_dir, const struct kv_tok *tok, struct kv_chat **out)
{
	char path[4096], jpath[4096];
	char *buf = NULL, *jsrc = NULL;
	size_t len = 0, jlen = 0;
	json_t *cfg = NULL;
	int rc;

	*out = NULL;
	if (kv_gguf_is_model_path(model_dir)) {
		/* tokenizer.chat_template and the special tokens of a GGUF file */
		struct kv_gguf *g = NULL;
		if (!(rc = kv_gguf_open(model_dir, &g)) && !(rc = kv_gguf_tokenizer_config_json(g, &buf, &len)))
			rc = kv_chat_load_mem(buf, len, tok, out);
		free(buf);
		kv_gguf_close(g);
		return rc;
	}
	snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
	snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", model_dir);
	rc = kv_io_read_file(jpath, CHAT_MAX_CONFIG, &jsrc, &jlen);
	if (rc && rc != KV_ERR_NOT_FOUND)
		return rc;
	if (rc == KV_OK && memchr(jsrc, 0, jlen)) {
		free(jsrc);
		return kv_fail(KV_ERR_INVALID, "%s: contains a NUL byte", jpath);
	}
	if ((rc = kv_io_read_file(path, CHAT_MAX_CONFIG, &buf, &len))) {
		if (rc != KV_ERR_NOT_FOUND || !jsrc)
			goto done;
		cfg = json_object(); /* only chat_template.jinja: no special tokens */
	} else if ((rc = kv_json_parse(path, buf, len, KV_JSON_MAX_DEPTH, &cfg))) {
		goto done;
	}
	if (!json_is_object(cfg)) {
		rc = kv_fail(KV_ERR_INVALID, "%s: not a JSON object", path);
		goto done;
	}
	rc = chat_build(cfg, jsrc, path, tok, out);
done:
	json_decref(cfg);
	free(buf);
	free(jsrc);
	return rc;
}

int kv_chat_set_template(struct kv_chat *c, const char *src, size_t len, const char *what)
{
	struct kv_tmpl *t;
	char *copy;
	int rc;
	if (memchr(src, 0, len))
		return kv_fail(KV_ERR_INVALID, "%s: the template contains a NUL byte", what ? what : "template");
	if ((rc = kv_tmpl_compile(src, len, what, &t)))
		return rc;
	copy = malloc(len + 1);
	if (!copy) {
		kv_tmpl_free(t);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	memcpy(copy, src, len);
	copy[len] = 0;
	kv_tmpl_free(c->tmpl);
	kv_tmpl_free(c->tmpl_tools);
	free(c->src);
	free(c->src_tools);
	if (c->memo) { /* renders of the old template are no longer valid */
		pthread_mutex_lock(&c->memo->mu);
		for (size_t i = 0; i < KEEP_MEMO_SLOTS; i++) {
			free(c->memo->e[i].text);
			memset(&c->memo->e[i], 0, sizeof c->memo->e[i]);
		}
		c->memo->bytes = 0;
		pthread_mutex_unlock(&c->memo->mu);
	}
	c->tmpl = t;
	c->src = copy;
	c->tmpl_tools = NULL;
	c->src_tools = NULL;
	c->xml_tools = tool_format(copy, NULL);
	c->harmony = is_harmony(copy);
	return KV_OK;
}

int kv_chat_xml_tools(const struct kv_chat *c)
{
	return c->xml_tools;
}

int kv_chat_harmony(const struct kv_chat *c)
{
	return c->harmony;
}

const char *kv_chat_template_source(const struct kv_chat *c, int tool_use)
{
	return tool_use && c->src_tools ? c->src_tools : c->src;
}

/* --- preparation ------------------------------------------------------------ */

int kv_chat_prepare_messages(const json_t *messages, json_t **out)
{
	json_t *res, *m;
	size_t i;
	*out = NULL;
	if (!json_is_array(messages) || json_array_size(messages) == 0)
		return kv_fail(KV_ERR_INVALID, "messages must be a non-empty array");
	res = json_array();
	if (!res)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	json_array_foreach(messages, i, m) {
		const char *role;
		json_t *content, *copy;
		if (!json_is_object(m)) {
			json_decref(res);
			return kv_fail(KV_ERR_INVALID, "messages[%zu] must be an object", i);
		}
		role = json_string_value(json_object_get(m, "role"));
		if (!role) {
			json_decref(res);
			return kv_fail(KV_ERR_INVALID, "messages[%zu] needs a \"role\" string", i);
		}
		int developer = !strcmp(role, "developer");
		if (strcmp(role, "system") && !developer && strcmp(role, "user") && strcmp(role, "assistant") &&
		    strcmp(role, "tool")) {
			json_decref(res);
			return kv_fail(KV_ERR_INVALID, "messages[%zu]: unknown role '%.40s' (expected system, developer, "
						       "user, assistant or tool)", i, role);
		}
		content = json_object_get(m, "content");
		if (content && !json_is_string(content) && !json_is_null(content) && !json_is_array(content)) {
			json_decref(res);
			return kv_fail(KV_ERR_INVALID, "messages[%zu].content must be a string, an array of text parts or "
						       "null", i);
		}
		json_t *tc = json_object_get(m, "tool_calls");
		if (tc && !json_is_null(tc)) {
			size_t j;
			json_t *call;
			if (!json_is_array(tc)) {
				json_decref(res);
				return kv_fail(KV_ERR_INVALID, "messages[%zu].tool_calls must be an array", i);
			}
			json_array_foreach(tc, j, call) {
				json_t *fn = json_object_get(call, "function"), *args;
				if (!json_is_object(call) || !json_is_object(fn) ||
				    !json_is_string(json_object_get(fn, "name"))) {
					json_decref(res);
					return kv_fail(KV_ERR_INVALID, "messages[%zu].tool_calls[%zu] needs a \"function\" object "
								       "with a \"name\" string", i, j);
				}
				args = json_object_get(fn, "arguments");
				if (args && !json_is_string(args) && !json_is_object(args)) {
					json_decref(res);
					return kv_fail(KV_ERR_INVALID, "messages[%zu].tool_calls[%zu].function.arguments must be a "
								       "JSON string or an object", i, j);
				}
			}
		}
		copy = json_copy(m); /* shallow: values are shared, never modified */
		if (!copy) {
			json_decref(res);
			return kv_fail(KV_ERR_NOMEM, "out of memory");
		}
		/* OpenAI's "developer" role is the system role of these templates. */
		if (developer)
			json_object_set_new(copy, "role", json_string("system"));
		/* A turn that only calls tools has null (or no) content; the
		 * templates test and concatenate it as a string (Qwen3's fails on
		 * null), so it becomes "" as in vLLM's preparation. */
		if (!content || json_is_null(content))
			json_object_set_new(copy, "content", json_string(""));
		if (json_is_array(content)) {
			struct kv_buf b = KV_BUF_INIT;
			size_t j;
			json_t *part;
			json_array_foreach(content, j, part) {
				const char *type = json_string_value(json_object_get(part, "type"));
				json_t *text = json_object_get(part, "text");
				if (!json_is_object(part) || !type) {
					kv_buf_free(&b);
					json_decref(copy);
					json_decref(res);
					return kv_fail(KV_ERR_INVALID, "messages[%zu].content[%zu] must be an object with a "
								       "\"type\"", i, j);
				}
				if (strcmp(type, "text")) {
					kv_buf_free(&b);
					json_decref(copy);
					json_decref(res);
					return kv_fail(KV_ERR_UNSUPPORTED, "messages[%zu].content[%zu]: part type '%.40s' is not "
									   "supported (text only)", i, j, type);
				}
				if (!json_is_string(text)) {
					kv_buf_free(&b);
					json_decref(copy);
					json_decref(res);
					return kv_fail(KV_ERR_INVALID, "messages[%zu].content[%zu] needs a \"text\" string", i, j);
				}
				kv_buf_add(&b, json_string_value(text), json_string_length(text));
			}
			if (b.oom) {
				kv_buf_free(&b);
				json_decref(copy);
				json_decref(res);
				return kv_fail(KV_ERR_NOMEM, "out of memory");
			}
			json_object_set_new(copy, "content", json_stringn(b.p ? b.p : "", b.len));
			kv_buf_free(&b);
		}
		json_array_append_new(res, copy);
	}
	*out = res;
	return KV_OK;
}

/*
 * Harmony templates (GPT-OSS) read an assistant message's reasoning from
 * "thinking" and write a tool call's arguments with tojson, so they want
 * an object. The chat APIs send "reasoning_content" and arguments as JSON
 * text: in place on prep (a private array of shallow copies), reasoning
 * becomes "thinking" (kept out of a tool-call message that also has
 * content, which the template refuses), and arguments text that parses
 * as an object becomes that object (other text stays as it is).
 */
static int harmony_messages(json_t *prep)
{
	size_t i, j;
	json_t *m, *call;
	json_array_foreach(prep, i, m) {
		if (strcmp(json_string_value(json_object_get(m, "role")), "assistant"))
			continue;
		const json_t *rc = json_object_get(m, "reasoning_content");
		json_t *tc = json_object_get(m, "tool_calls");
		int has_calls = json_is_array(tc) && json_array_size(tc) > 0;
		const char *content = json_string_value(json_object_get(m, "content"));
		if (json_is_string(rc) && json_string_length(rc) && !json_object_get(m, "thinking") &&
		    !(has_calls && content && *content) &&
		    json_object_set(m, "thinking", (json_t *)rc))
			return kv_fail(KV_ERR_NOMEM, "out of memory");
		if (!has_calls)
			continue;
		json_t *calls = json_array();
		if (!calls)
			return kv_fail(KV_ERR_NOMEM, "out of memory");
		json_array_foreach(tc, j, call) {
			json_t *c2 = json_copy(call), *fn = json_copy(json_object_get(call, "function"));
			const json_t *args = json_object_get(fn, "arguments");
			json_t *obj = json_is_string(args)
					      ? json_loadb(json_string_value(args), json_string_length(args), 0, NULL)
					      : NULL;
			if (json_is_object(obj))
				json_object_set(fn, "arguments", obj);
			json_decref(obj);
			if (!c2 || !fn || json_object_set_new(c2, "function", fn) || json_array_append_new(calls, c2)) {
				json_decref(calls);
				return kv_fail(KV_ERR_NOMEM, "out of memory");
			}
		}
		if (json_object_set_new(m, "tool_calls", calls))
			return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	return KV_OK;
}

/* --- rendering with boundaries ---------------------------------------------- */

/* May the token sequence be cut at byte c of text (see kv_chat_render)? */
static int clean_cut(const struct kv_chat *c, const char *text, size_t len, size_t at)
{
	int starts = 0;
	if (at == 0 || at > len)
		return 0;
	if (at == len)
		return 1;
	for (size_t i = 0; i < c->n_added; i++) {
		const struct added_tok *a = &c->added[i];
		if (a->cut && a->n <= len - at && !memcmp(text + at, a->s, a->n))
			starts = 1;
		/* no added token may straddle the cut */
		for (size_t o = 1; o < a->n && o <= at; o++)
			if (at - o + a->n <= len && !memcmp(text + at - o, a->s, a->n))
				return 0;
	}
	return starts;
}

struct chat_job {
	const struct kv_chat *c;
	const struct kv_tmpl *t;
	struct arena base;          /* converted context values */
	struct gval *g;
	int ng;
	int i_messages, i_agp;      /* indexes in g */
	const struct list *msgs;    /* the prepared messages */
	struct tj_memo memo;        /* tojson of context values, in base */
};

static int job_set(struct chat_job *j, const char *name, struct val v)
{
	for (int i = 0; i < j->ng; i++)
		if (!strcmp(j->g[i].name, name)) {
			j->g[i].v = v;
			return i;
		}
	j->g[j->ng].name = name;
	j->g[j->ng].v = v;
	return j->ng++;
}

static int job_set_json(struct chat_job *j, const char *name, const json_t *v, int *idx)
{
	struct val x;
	int rc = kj_convert_json(j->t, &j->base, v, &x);
	if (rc)
		return rc;
	int i = job_set(j, name, x);
	if (idx)
		*idx = i;
	return KV_OK;
}

/* Render messages[:k] without the generation prompt: into out, or (out
 * NULL) compared with full, *got the length of the common prefix. The
 * core of prefix_len and render_prefix. */
static int render_head(struct chat_job *j, size_t k, struct kv_buf *out, const char *full, size_t full_len,
		       size_t *got)
{
	struct list *l = kj_ar_alloc_raw(&j->base, sizeof *l + k * sizeof(struct val));
	if (!l)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	memset(l, 0, sizeof *l);
	l->n = k;
	l->kind = L_LIST;
	memcpy(l->v, j->msgs->v, k * sizeof(struct val));
	struct val saved_m = j->g[j->i_messages].v, saved_a = j->g[j->i_agp].v;
	j->g[j->i_messages].v = vlist(l);
	j->g[j->i_agp].v = vbool(0);
	int rc = kj_render_core(j->t, j->g, j->ng, NULL, out, full, full_len, got, &j->memo);
	j->g[j->i_messages].v = saved_m;
	j->g[j->i_agp].v = saved_a;
	return rc;
}

/* Render messages[:k] without storing: compare with full. Returns the
 * prefix length when the render is a prefix of full, else 0. */
static size_t prefix_len(struct chat_job *j, size_t k, const char *full, size_t full_len)
{
	size_t got = 0;
	return render_head(j, k, NULL, full, full_len, &got) == KV_OK ? got : 0;
}

/* The head (the first h messages) plus a probe message of `role`,
 * rendered into b; 0 if the template refuses it. */
static int probe_render(struct chat_job *j, size_t h, const char *role, struct kv_buf *b);

/* The added token that starts at byte `at` (the longest), or NULL. */
static const struct added_tok *cut_token(const struct kv_chat *c, const char *text, size_t len, size_t at)
{
	const struct added_tok *best = NULL;
	for (size_t i = 0; i < c->n_added; i++) {
		const struct added_tok *a = &c->added[i];
		if (a->cut && a->n <= len - at && !memcmp(text + at, a->s, a->n) && (!best || a->n > best->n))
			best = a;
	}
	return best;
}

/*
 * The end of system + tools when rendering the head alone fails or is
 * not a prefix (templates that insist on a user message): render the head
 * plus a probe user message and take the last clean cut before the two
 * renders part. Both conversations share the tokens up to there. A turn
 * header may spell the role between two added tokens (harmony's
 * "<|start|>user<|message|>", Llama 3's "<|start_header_id|>user
 * <|end_header_id|>", Gemma's "<start_of_turn>user" then its "\n"
 * token): then that last cut lies inside the next message's header, and
 * the turn starts at the cut before the role.
 */
static size_t probe_anchor(struct chat_job *j, size_t h, const char *full, size_t full_len)
{
	struct kv_buf b = KV_BUF_INIT;
	size_t res = 0;
	if (probe_render(j, h, "user", &b) && !b.oom && b.p) {
		size_t lcp = 0, n = b.len < full_len ? b.len : full_len;
		while (lcp < n && b.p[lcp] == full[lcp])
			lcp++;
		for (size_t cpos = lcp; cpos > 0; cpos--) {
			if (cpos >= full_len || cpos >= b.len || !clean_cut(j->c, full, full_len, cpos) ||
			    !clean_cut(j->c, b.p, b.len, cpos))
				continue;
			if (!res) {
				res = cpos;
				continue;
			}
			/* the previous cut: is what lies between it and res the role? */
			const struct added_tok *t = cut_token(j->c, full, full_len, cpos);
			size_t a = cpos + (t ? t->n : 0), e = res;
			while (a < e && (full[a] == ' ' || full[a] == '\n'))
				a++;
			while (e > a && (full[e - 1] == ' ' || full[e - 1] == '\n'))
				e--;
			if (e - a == 4 && !memcmp(full + a, "user", 4))
				res = cpos;
			break;
		}
	}
	kv_buf_free(&b);
	return res;
}

static int probe_render(struct chat_job *j, size_t h, const char *role, struct kv_buf *b)
{
	int ok = 0;
	json_t *pm = json_pack("{s:s,s:s}", "role", role, "content", CHAT_PROBE);
	struct val pv;
	struct list *l = kj_ar_alloc_raw(&j->base, sizeof *l + (h + 1) * sizeof(struct val));
	/* pv borrows its strings from pm: keep pm until the render is done */
	if (!pm || !l || kj_convert_json(j->t, &j->base, pm, &pv)) {
		json_decref(pm);
		return 0;
	}
	memset(l, 0, sizeof *l);
	l->n = h + 1;
	l->kind = L_LIST;
	memcpy(l->v, j->msgs->v, h * sizeof(struct val));
	l->v[h] = pv;
	struct val saved_m = j->g[j->i_messages].v, saved_a = j->g[j->i_agp].v;
	j->g[j->i_messages].v = vlist(l);
	j->g[j->i_agp].v = vbool(0);
	int rc = kj_render_core(j->t, j->g, j->ng, NULL, b, NULL, 0, NULL, &j->memo);
	j->g[j->i_messages].v = saved_m;
	j->g[j->i_agp].v = saved_a;
	ok = rc == KV_OK;
	if (!ok)
		kv_errclear(); /* a template that refuses the probe: not an error */
	json_decref(pm);
	return ok;
}

void kv_chat_render_free(struct kv_chat_render *r)
{
	if (!r)
		return;
	free(r->text);
	free(r->tokens);
	free(r->boundaries);
	free(r->boundary_bytes);
	free(r->boundary_msgs);
	free(r->splice_at);
	memset(r, 0, sizeof *r);
}

/* --- special-token literals in request strings (template.h) -------------- */

static pthread_once_t g_lit_once = PTHREAD_ONCE_INIT;
static char g_lit_tag[32]; /* "[kvsp<16 hex>." */
static size_t g_lit_tag_n;

static void lit_tag_init(void)
{
	uint64_t r = 0;
	if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
		r = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&r;
	g_lit_tag_n = (size_t)snprintf(g_lit_tag, sizeof g_lit_tag, "[kvsp%016llx.", (unsigned long long)r);
}

struct lits {
	const struct added_tok **t; /* the special added tokens (borrowed from the chat) */
	size_t n;
};

static int lits_collect(const struct kv_chat *c, struct lits *L)
{
	L->t = calloc(c->n_added ? c->n_added : 1, sizeof *L->t);
	L->n = 0;
	if (!L->t)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < c->n_added; i++) {
		int32_t id = kv_tok_id(c->tok, c->added[i].s);
		if (id >= 0 && kv_tok_is_special(c->tok, id))
			L->t[L->n++] = &c->added[i];
	}
	return KV_OK;
}

/* Longest special literal at p (n bytes left), or -1. */
static int lit_at(const struct lits *L, const char *p, size_t n)
{
	int best = -1;
	for (size_t k = 0; k < L->n; k++)
		if (L->t[k]->n <= n && p[0] == L->t[k]->s[0] && !memcmp(p, L->t[k]->s, L->t[k]->n) &&
		    (best < 0 || L->t[k]->n > L->t[best]->n))
			best = (int)k;
	return best;
}

static int json_has_lit(const json_t *v, const struct lits *L)
{
	size_t i;
	const char *k;
	json_t *e;
	if (json_is_string(v)) {
		const char *p = json_string_value(v);
		size_t n = json_string_length(v);
		for (size_t x = 0; x < n; x++)
			if (lit_at(L, p + x, n - x) >= 0)
				return 1;
		return 0;
	}
	if (json_is_array(v))
		json_array_foreach((json_t *)v, i, e) if (json_has_lit(e, L)) return 1;
	if (json_is_object(v))
		json_object_foreach((json_t *)v, k, e) if (json_has_lit(e, L)) return 1;
	return 0;
}

/* Replace the literals in every string of v (a private deep copy) by
 * placeholders. */
static int json_sub_lits(json_t *v, const struct lits *L)
{
	size_t i;
	const char *k;
	json_t *e;
	int rc = KV_OK;
	if (json_is_string(v)) {
		const char *p = json_string_value(v);
		size_t n = json_string_length(v);
		struct kv_buf b = KV_BUF_INIT;
		int any = 0;
		for (size_t x = 0; x < n;) {
			int l = lit_at(L, p + x, n - x);
			if (l < 0) {
				kv_buf_addc(&b, p[x++]);
				continue;
			}
			kv_buf_add(&b, g_lit_tag, g_lit_tag_n);
			kv_buf_printf(&b, "%d]", l);
			x += L->t[l]->n;
			any = 1;
		}
		if (b.oom)
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		else if (any && json_string_setn(v, b.p, b.len))
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		kv_buf_free(&b);
		return rc;
	}
	if (json_is_array(v))
		json_array_foreach(v, i, e) if ((rc = json_sub_lits(e, L))) return rc;
	if (json_is_object(v))
		json_object_foreach(v, k, e) if ((rc = json_sub_lits(e, L))) return rc;
	return rc;
}

/* A deep copy of v with the literals replaced (NULL stays NULL). */
static int json_sub_copy(const json_t *v, const struct lits *L, json_t **out)
{
	*out = NULL;
	if (!v)
		return KV_OK;
	*out = json_deep_copy(v);
	if (!*out)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	return json_sub_lits(*out, L);
}

/* The rendered text with the placeholders put back: *spans gets the
 * [start, end) byte ranges of the literals (pairs, ascending), and the
 * cuts (positions in t, ascending) are moved to the same places in the
 * new text. */
static int lits_restore(const char *t, size_t n, const struct lits *L, struct kv_buf *out, size_t **spans,
			size_t *n_spans, size_t *cuts, size_t n_cuts)
{
	struct kv_buf sp = KV_BUF_INIT;
	size_t ci = 0;
	for (size_t x = 0; x < n;) {
		while (ci < n_cuts && cuts[ci] <= x)
			cuts[ci++] = out->len;
		if (t[x] == '[' && n - x > g_lit_tag_n && !memcmp(t + x, g_lit_tag, g_lit_tag_n)) {
			size_t y = x + g_lit_tag_n, k = 0;
			while (y < n && y - x < g_lit_tag_n + 6 && t[y] >= '0' && t[y] <= '9')
				k = k * 10 + (size_t)(t[y++] - '0');
			if (y < n && t[y] == ']' && y > x + g_lit_tag_n && k < L->n) {
				size_t span[2] = {out->len, out->len + L->t[k]->n};
				kv_buf_add(out, L->t[k]->s, L->t[k]->n);
				kv_buf_add(&sp, span, sizeof span);
				x = y + 1;
				continue;
			}
		}
		kv_buf_addc(out, t[x++]);
	}
	while (ci < n_cuts)
		cuts[ci++] = out->len;
	if (out->oom || sp.oom) {
		kv_buf_free(&sp);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	*n_spans = sp.len / (2 * sizeof(size_t));
	*spans = (size_t *)kv_buf_take(&sp);
	return KV_OK;
}

/* Tokens of text[start, end) where the spans are request literals: the
 * template's special tokens outside them are control tokens, everything
 * else is encoded with allow_special = 0. */
static int encode_mixed(const struct kv_chat *c, const struct lits *L, const char *text, size_t start, size_t end,
			const size_t *spans, size_t n_spans, struct kv_buf *ids)
{
	size_t si = 0, piece = start;
	int rc;
	for (size_t x = start; x <= end;) {
		while (si < n_spans && spans[2 * si + 1] <= x)
			si++;
		int in_span = si < n_spans && spans[2 * si] <= x;
		int l = x < end && !in_span ? lit_at(L, text + x, end - x) : -1;
		if (l >= 0 && si < n_spans && spans[2 * si] < x + L->t[l]->n)
			l = -1; /* would run into a request literal */
		if (x < end && l < 0) {
			x++;
			continue;
		}
		for (int part = 0; part < 2; part++) {
			size_t a = part ? x : piece, b = part ? (l >= 0 ? x + L->t[l]->n : x) : x;
			if (b > a) {
				int32_t *seg;
				size_t ns;
				if ((rc = kv_tok_encode(c->tok, text + a, b - a, part, &seg, &ns)))
					return rc;
				kv_buf_add(ids, seg, ns * sizeof *seg);
				free(seg);
			}
		}
		if (l < 0)
			break; /* x == end */
		x += L->t[l]->n;
		piece = x;
	}
	return KV_OK;
}

/* --- keep_reasoning (template.h "Reasoning history") --------------------- */

static struct keep_ent *memo_find(struct keep_memo *m, struct kv_h128 key, int kind)
{
	for (size_t i = 0; i < KEEP_MEMO_SLOTS; i++)
		if (m->e[i].used && m->e[i].kind == kind && kv_h128_eq(m->e[i].key, key)) {
			m->e[i].used = ++m->tick;
			return &m->e[i];
		}
	return NULL;
}

/* A free slot, evicting least recently used entries until `bytes` fit. */
static struct keep_ent *memo_slot(struct keep_memo *m, size_t bytes)
{
	for (;;) {
		struct keep_ent *lru = NULL, *free_slot = NULL;
		for (size_t i = 0; i < KEEP_MEMO_SLOTS; i++) {
			if (!m->e[i].used) {
				free_slot = free_slot ? free_slot : &m->e[i];
				continue;
			}
			if (!lru || m->e[i].used < lru->used)
				lru = &m->e[i];
		}
		if (free_slot && m->bytes + bytes <= KEEP_MEMO_BYTES)
			return free_slot;
		if (!lru)
			return NULL;
		m->bytes -= lru->len;
		free(lru->text);
		memset(lru, 0, sizeof *lru);
	}
}

static int memo_get_d(const struct kv_chat *c, struct kv_h128 key, size_t *d)
{
	int got = 0;
	pthread_mutex_lock(&c->memo->mu);
	struct keep_ent *e = memo_find(c->memo, key, 1);
	if (e) {
		*d = e->d;
		got = 1;
	}
	pthread_mutex_unlock(&c->memo->mu);
	return got;
}

static void memo_put_d(const struct kv_chat *c, struct kv_h128 key, size_t d)
{
	pthread_mutex_lock(&c->memo->mu);
	struct keep_ent *e = memo_find(c->memo, key, 1);
	if (!e && (e = memo_slot(c->memo, 0))) {
		e->key = key;
		e->kind = 1;
		e->used = ++c->memo->tick;
	}
	if (e)
		e->d = d;
	pthread_mutex_unlock(&c->memo->mu);
}

/* A turn's remembered text (copied into out) when its render agreed with
 * the text before d in the request at hand. */
static int memo_get_turn(const struct kv_chat *c, struct kv_h128 key, size_t d, struct kv_h128 before,
			 struct kv_buf *out)
{
	int got = 0;
	pthread_mutex_lock(&c->memo->mu);
	struct keep_ent *e = memo_find(c->memo, key, 2);
	if (e && e->d == d && kv_h128_eq(e->before, before)) {
		kv_buf_add(out, e->text, e->len);
		got = !out->oom;
	}
	pthread_mutex_unlock(&c->memo->mu);
	return got;
}

static void memo_put_turn(const struct kv_chat *c, struct kv_h128 key, size_t d, struct kv_h128 before, const char *t,
			  size_t n)
{
	char *copy = malloc(n ? n : 1);
	if (!copy)
		return;
	memcpy(copy, t, n);
	pthread_mutex_lock(&c->memo->mu);
	struct keep_ent *e = memo_find(c->memo, key, 2);
	if (e) {
		c->memo->bytes -= e->len;
		free(e->text);
	} else if ((e = memo_slot(c->memo, n))) {
		e->key = key;
		e->kind = 2;
		e->used = ++c->memo->tick;
	}
	if (e) {
		e->d = d;
		e->before = before;
		e->text = copy;
		e->len = n;
		c->memo->bytes += n;
		copy = NULL;
	}
	pthread_mutex_unlock(&c->memo->mu);
	free(copy);
}

/* Render messages[:k] without the generation prompt into out. */
static int render_prefix(struct chat_job *j, size_t k, struct kv_buf *out)
{
	int rc = render_head(j, k, out, NULL, 0, NULL);
	if (!rc && out->oom)
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
	return rc;
}

/* The user turns of a request, rendered as each was when it was the newest
 * (template.h "Reasoning history"). */
struct keep {
	int active;
	size_t nq;               /* user messages */
	size_t *q;               /* their indices */
	size_t *d;               /* where message q[i] starts in the full render */
	size_t *toff;            /* ... and in the kept text */
	struct kv_buf t;         /* the kept text */
};

static void keep_free(struct keep *k)
{
	free(k->q);
	free(k->d);
	free(k->toff);
	kv_buf_free(&k->t);
	memset(k, 0, sizeof *k);
}

/* Chain hashes of the messages: h[m] covers everything that decides how
 * messages[:m] render (template, tools, variables, the messages). */
static int keep_hashes(const struct kv_chat *c, const struct kv_tmpl *t, const json_t *prep, const json_t *tools,
		       const struct kv_chat_opts *o, struct kv_h128 *h)
{
	struct kv_buf b = KV_BUF_INIT;
	char *x;
	kv_buf_printf(&b, "kvkeep-keep-1 %p %d %d %s|", (const void *)t, o->enable_thinking, o->request_specials,
		      o->reasoning_effort ? o->reasoning_effort : "-");
	if (tools && (x = json_dumps(tools, JSON_COMPACT | JSON_SORT_KEYS | JSON_ALLOW_NUL))) {
		kv_buf_adds(&b, x);
		free(x);
	}
	kv_buf_adds(&b, "|");
	if (o->kwargs && (x = json_dumps(o->kwargs, JSON_COMPACT | JSON_SORT_KEYS | JSON_ALLOW_NUL))) {
		kv_buf_adds(&b, x);
		free(x);
	}
	if (b.oom) {
		kv_buf_free(&b);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	h[0] = kv_xxh3_128(b.p, b.len, 0);
	kv_buf_free(&b);
	(void)c;
	for (size_t m = 0; m < json_array_size(prep); m++) {
		x = json_dumps(json_array_get(prep, m), JSON_COMPACT | JSON_SORT_KEYS | JSON_ALLOW_NUL);
		if (!x)
			return kv_fail(KV_ERR_NOMEM, "out of memory");
		h[m + 1] = kv_xxh3_128_cat(&h[m], sizeof h[m], x, strlen(x));
		free(x);
	}
	return KV_OK;
}

/*
 * A harmony template ends a conversation whose last message is the
 * assistant's with "<|return|>", the end of a generation; in a history
 * that goes on, harmony's rule makes it "<|end|>" (what the template
 * writes for every earlier answer).
 */
static void harmony_turn_end(const struct kv_chat *c, struct kv_buf *r)
{
	static const char ret[] = "<|return|>", end[] = "<|end|>";
	size_t rl = sizeof ret - 1, el = sizeof end - 1;
	if (!c->harmony || r->len < rl || memcmp(r->p + r->len - rl, ret, rl))
		return;
	memcpy(r->p + r->len - rl, end, el);
	r->len -= rl - el;
	r->p[r->len] = 0;
}

/*
 * Build the kept text of a request whose whole render is full[0, len).
 * Leaves k->active 0 when there is nothing to keep (fewer than two user
 * messages) or when the template breaks the rule (then the request uses
 * the template's own text). Errors only for memory.
 */
static int keep_build(struct chat_job *j, const json_t *prep, const json_t *tools, const struct kv_chat_opts *o,
		      const char *full, size_t len, struct keep *k)
{
	const struct kv_chat *c = j->c;
	size_t n = json_array_size(prep), nq = 0;
	struct kv_h128 *h = NULL;
	struct kv_buf r = KV_BUF_INIT;
	int rc = KV_OK;
	memset(k, 0, sizeof *k);
	for (size_t i = 0; i < n; i++)
		nq += !strcmp(json_string_value(json_object_get(json_array_get(prep, i), "role")), "user");
	if (nq < 2)
		return KV_OK;
	k->q = calloc(nq, sizeof *k->q);
	k->d = calloc(nq, sizeof *k->d);
	k->toff = calloc(nq, sizeof *k->toff);
	h = calloc(n + 1, sizeof *h);
	if (!k->q || !k->d || !k->toff || !h) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		if (!strcmp(json_string_value(json_object_get(json_array_get(prep, i), "role")), "user"))
			k->q[k->nq++] = i;
	if ((rc = keep_hashes(c, j->t, prep, tools, o, h)))
		goto out;
	/* where each user message starts: in every render that goes past it,
	 * the messages before it render the same way (it is not the last user
	 * message of any of the renders used here but its own turn's) */
	for (size_t i = 0; i < k->nq; i++) {
		if (k->q[i] == 0) {
			k->d[i] = 0; /* the conversation starts with it */
			continue;
		}
		if (!memo_get_d(c, h[k->q[i]], &k->d[i])) {
			k->d[i] = probe_anchor(j, k->q[i], full, len);
			if (k->d[i])
				memo_put_d(c, h[k->q[i]], k->d[i]);
		}
		if (!k->d[i] || (i && k->d[i] <= k->d[i - 1]) || k->d[i] > len)
			goto out; /* not found: the template's own text */
	}
	/* every turn but the newest, as render(messages[:q[i + 1]]) shows it */
	kv_buf_add(&k->t, full, k->d[0]);
	for (size_t i = 0; i + 1 < k->nq; i++) {
		struct kv_h128 before = kv_xxh3_128(full, k->d[i], 0);
		k->toff[i] = k->t.len;
		if (memo_get_turn(c, h[k->q[i + 1]], k->d[i], before, &k->t))
			continue;
		kv_buf_reset(&r);
		if ((rc = render_prefix(j, k->q[i + 1], &r))) {
			if (rc == KV_ERR_NOMEM)
				goto out;
			rc = KV_OK;
			kv_errclear();
			goto out;
		}
		if (r.len < k->d[i] || memcmp(r.p, full, k->d[i]))
			goto out; /* the text before the turn differs: the rule fails */
		harmony_turn_end(c, &r);
		kv_buf_add(&k->t, r.p + k->d[i], r.len - k->d[i]);
		memo_put_turn(c, h[k->q[i + 1]], k->d[i], before, r.p + k->d[i], r.len - k->d[i]);
	}
	k->toff[k->nq - 1] = k->t.len;
	kv_buf_add(&k->t, full + k->d[k->nq - 1], len - k->d[k->nq - 1]);
	if (k->t.oom) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	k->active = k->t.len != len || memcmp(k->t.p, full, len);
out:
	if (!k->active || rc) {
		int keep_rc = rc;
		keep_free(k);
		rc = keep_rc;
	}
	kv_buf_free(&r);
	free(h);
	return rc;
}

/* --- splices: the server's own answers (template.h kv_chat_splice) -------- */

/* "[kvec<16 hex>.<message>]": the stand-in content of a spliced message
 * (the per-process tag of the literals, so no request text can forge it;
 * the message index keeps it the same from one request to the next). */
static void splice_tag(size_t message, char *out, size_t cap)
{
	snprintf(out, cap, "[kvec%.16s.%zu]", g_lit_tag + 5, message);
}

/* Replace the spliced messages of prep (a private array) by stand-ins. */
static int splice_stand_ins(json_t *prep, const struct kv_chat_opts *o)
{
	char tag[64];
	for (size_t i = 0; i < o->n_splices; i++) {
		const struct kv_chat_splice *sp = &o->splices[i];
		json_t *m = json_array_get(prep, sp->message);
		if (!m || strcmp(json_string_value(json_object_get(m, "role")), "assistant"))
			return kv_fail(KV_ERR_INVALID, "splice %zu: messages[%zu] is not an assistant message", i, sp->message);
		splice_tag(sp->message, tag, sizeof tag);
		json_t *stand_in = json_pack("{s:s, s:s}", "role", "assistant", "content", tag);
		if (!stand_in || json_array_set_new(prep, sp->message, stand_in))
			return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	return KV_OK;
}

/* A byte range of the text whose tokens are given. */
struct vspan {
	size_t a, b;
	const int32_t *tok;
	size_t n;
	size_t splice;           /* index in opts->splices */
};

/* Shift every position > at by delta (positions in (at, at + removed]
 * cannot occur: the caller checked). */
static void shift_positions(size_t *pos, size_t n, size_t at, ptrdiff_t delta)
{
	for (size_t i = 0; i < n; i++)
		if (pos[i] > at)
			pos[i] = (size_t)((ptrdiff_t)pos[i] + delta);
}

/*
 * Put every splice's text in place of its stand-in (from the role header
 * on). text is rewritten; cuts and the literal spans move with it; the
 * applied splices go to vs[] (ascending). *nvs: how many.
 */
static int apply_splices(const struct kv_chat *c, const struct kv_chat_opts *o, struct kv_buf *text, size_t *cuts,
			 size_t n_cuts, size_t *spans, size_t n_spans, struct vspan *vs, size_t *nvs)
{
	char tag[64];
	size_t floor_at = 0;
	*nvs = 0;
	for (size_t i = 0; i < o->n_splices; i++) {
		const struct kv_chat_splice *sp = &o->splices[i];
		splice_tag(sp->message, tag, sizeof tag);
		size_t tl = strlen(tag);
		const char *t = text->p ? text->p : "";
		const char *f = memmem(t + floor_at, text->len - floor_at, tag, tl);
		if (!f || memmem(f + 1, text->len - (size_t)(f + 1 - t), tag, tl))
			continue; /* the template dropped or repeated the stand-in */
		/* the role header: the first line of the splice's text, the
		 * last time it appears before the stand-in */
		const char *nl = memchr(sp->text, '\n', sp->text_len);
		size_t hl = nl ? (size_t)(nl - sp->text) + 1 : sp->text_len;
		size_t p = (size_t)(f - t), hdr = SIZE_MAX;
		for (size_t x = p >= hl ? p - hl + 1 : 0; x-- > floor_at;)
			if (!memcmp(t + x, sp->text, hl)) {
				hdr = x;
				break;
			}
		if (hdr == SIZE_MAX || !clean_cut(c, t, text->len, hdr))
			continue;
		size_t end = p + tl;
		int inside = 0;
		for (size_t k = 0; k < n_cuts; k++)
			inside |= cuts[k] > hdr && cuts[k] < end;
		for (size_t k = 0; k < 2 * n_spans; k++)
			inside |= spans[k] > hdr && spans[k] < end;
		if (inside)
			continue;
		/* text = t[0, hdr) + sp->text + t[end, len) */
		struct kv_buf nt = KV_BUF_INIT;
		kv_buf_add(&nt, t, hdr);
		kv_buf_add(&nt, sp->text, sp->text_len);
		kv_buf_add(&nt, t + end, text->len - end);
		if (nt.oom) {
			kv_buf_free(&nt);
			return kv_fail(KV_ERR_NOMEM, "out of memory");
		}
		ptrdiff_t delta = (ptrdiff_t)sp->text_len - (ptrdiff_t)(end - hdr);
		shift_positions(cuts, n_cuts, hdr, delta);
		shift_positions(spans, 2 * n_spans, hdr, delta);
		for (size_t k = 0; k < *nvs; k++)
			if (vs[k].a > hdr) {
				vs[k].a = (size_t)((ptrdiff_t)vs[k].a + delta);
				vs[k].b = (size_t)((ptrdiff_t)vs[k].b + delta);
			}
		kv_buf_free(text);
		*text = nt;
		vs[*nvs] = (struct vspan){.a = hdr, .b = hdr + sp->text_len, .tok = sp->tokens, .n = sp->n_tokens, .splice = i};
		(*nvs)++;
		floor_at = hdr + sp->text_len;
	}
	return KV_OK;
}

/* Tokens of text[start, end): the given tokens of the splices inside it,
 * the rest encoded (encode_mixed where request literals are). */
static int encode_segment(const struct kv_chat *c, const struct lits *L, const char *text, size_t start, size_t end,
			  const size_t *spans, size_t n_spans, const struct vspan *vs, size_t nvs, int32_t *splice_at,
			  struct kv_buf *ids)
{
	int rc;
	for (size_t v = 0; v <= nvs && start < end; v++) {
		size_t stop = end;
		if (v < nvs) {
			if (vs[v].b <= start || vs[v].a >= end)
				continue;
			stop = vs[v].a;
		}
		if (stop > start) {
			if (n_spans)
				rc = encode_mixed(c, L, text, start, stop, spans, n_spans, ids);
			else {
				int32_t *seg;
				size_t ns;
				if (!(rc = kv_tok_encode(c->tok, text + start, stop - start, 1, &seg, &ns))) {
					kv_buf_add(ids, seg, ns * sizeof *seg);
					free(seg);
				}
			}
			if (rc)
				return rc;
		}
		if (v < nvs) {
			splice_at[vs[v].splice] = (int32_t)(ids->len / sizeof(int32_t));
			kv_buf_add(ids, vs[v].tok, vs[v].n * sizeof(int32_t));
			start = vs[v].b;
		} else {
			start = end;
		}
	}
	return KV_OK;
}

/* Where messages end in the final text (the kept one when keep is
 * active), in bytes: cs->cuts[i] ends render(messages[:cs->cut_k[i]]).
 * cs->cuts and cs->cut_k have room for n + 2 entries. */
struct cut_search {
	size_t *cuts, *cut_k, n_cuts;
	int first_is_head, from_probe;
};

static int find_cuts(struct chat_job *j, const json_t *prep, int has_tools, const struct kv_chat_opts *o,
		     const char *full, size_t full_len, const struct keep *keep, struct cut_search *cs)
{
	const struct kv_chat *c = j->c;
	size_t n = j->msgs->n;
	/* prefix renders are compared with the whole render, and a position
	 * in the newest turn moves by what keeping changed before it */
	const char *fin = keep->active ? keep->t.p : full;
	size_t fin_len = keep->active ? keep->t.len : full_len;
	{
		size_t *cuts = cs->cuts, *cut_k = cs->cut_k, n_cuts = 0;
		size_t h = 0;
		const char *role0 = json_string_value(json_object_get(json_array_get(prep, 0), "role"));
		if (role0 && !strcmp(role0, "system"))
			h = 1;
		size_t k0 = 1;
		if (h || has_tools) {
			size_t a = prefix_len(j, h, full, full_len);
			if (!(a > 0 && clean_cut(c, full, full_len, a))) {
				a = probe_anchor(j, h, full, full_len);
				cs->from_probe = a > 0;
			}
			if (a > 0 && (!keep->active || a <= keep->d[0])) {
				cut_k[n_cuts] = h;
				cuts[n_cuts++] = a;
				cs->first_is_head = 1;
			}
			k0 = h + 1;
		}
		if (o->max_message_boundaries > 0 && n >= (size_t)o->max_message_boundaries &&
		    n + 1 - (size_t)o->max_message_boundaries > k0)
			k0 = n + 1 - (size_t)o->max_message_boundaries;
		size_t qi = 0, ref_turn = SIZE_MAX;
		struct kv_buf ref = KV_BUF_INIT;
		for (size_t k = k0; k <= n; k++) {
			size_t l = 0;
			if (!keep->active || k <= keep->q[0]) {
				l = prefix_len(j, k, full, full_len);
			} else if (k <= keep->q[keep->nq - 1]) {
				/* inside an earlier turn i: compared with that turn's
				 * render, render(messages[:q[i + 1]]) */
				while (qi + 1 < keep->nq && keep->q[qi + 1] < k)
					qi++;
				if (keep->q[qi + 1] == k) {
					l = keep->toff[qi + 1];
				} else {
					if (ref_turn != qi) {
						kv_buf_reset(&ref);
						kv_buf_add(&ref, full, keep->d[qi]);
						kv_buf_add(&ref, keep->t.p + keep->toff[qi], keep->toff[qi + 1] - keep->toff[qi]);
						ref_turn = qi;
					}
					size_t lr = ref.oom ? 0 : prefix_len(j, k, ref.p, ref.len);
					if (lr > keep->d[qi])
						l = lr - keep->d[qi] + keep->toff[qi];
				}
			} else {
				size_t lf = prefix_len(j, k, full, full_len);
				size_t dl = keep->d[keep->nq - 1];
				if (lf >= dl)
					l = lf - dl + keep->toff[keep->nq - 1];
			}
			if (l > 0 && (!n_cuts || l > cuts[n_cuts - 1]) && clean_cut(c, fin, fin_len, l)) {
				cut_k[n_cuts] = k;
				cuts[n_cuts++] = l;
			}
		}
		kv_buf_free(&ref);
		kv_errclear();
		cs->n_cuts = n_cuts;
	}
	return KV_OK;
}

int kv_chat_render(const struct kv_chat *c, const json_t *messages, const json_t *tools,
		   const struct kv_chat_opts *opts, struct kv_chat_render *out)
{
	struct chat_job j = {0};
	json_t *prep = NULL;
	struct kv_buf text = KV_BUF_INIT;
	size_t *cuts = NULL, *cut_k = NULL, n_cuts = 0;
	int first_is_head = 0, from_probe = 0;
	int rc;
	struct kv_chat_opts o = {1, -1, NULL, 0, 0};
	struct keep keep = {0};
	struct vspan *vs = NULL;
	size_t nvs = 0;

	memset(out, 0, sizeof *out);
	if (opts)
		o = *opts;
	if (tools && !json_is_null(tools) && !json_is_array(tools))
		return kv_fail(KV_ERR_INVALID, "tools must be an array");
	if (o.kwargs && !json_is_object(o.kwargs))
		return kv_fail(KV_ERR_INVALID, "chat_template_kwargs must be an object");
	if ((rc = kv_chat_prepare_messages(messages, &prep)))
		return rc;
	if (c->harmony) {
		if ((rc = harmony_messages(prep))) {
			json_decref(prep);
			return rc;
		}
		/* an answer's generated text holds several harmony messages
		 * (analysis, then final or a call), which the splice's one
		 * stand-in message cannot stand for */
		o.n_splices = 0;
	}
	/* special-token literals in the request: placeholders (see template.h) */
	struct lits lits = {0};
	json_t *tools_sub = NULL, *kw_sub = NULL, *effort = NULL;
	size_t *spans = NULL, n_spans = 0;
	int subst = 0;
	pthread_once(&g_lit_once, lit_tag_init);
	if (!o.request_specials && c->tok) {
		if ((rc = lits_collect(c, &lits)))
			goto done;
		if (lits.n && (json_has_lit(prep, &lits) || (tools && json_has_lit(tools, &lits)) ||
			       (o.kwargs && json_has_lit(o.kwargs, &lits)))) {
			json_t *p2 = NULL;
			subst = 1;
			rc = json_sub_copy(prep, &lits, &p2);
			json_decref(prep);
			prep = p2;
			if (rc || (rc = json_sub_copy(tools, &lits, &tools_sub)) ||
			    (rc = json_sub_copy(o.kwargs, &lits, &kw_sub)))
				goto done;
			if (tools)
				tools = tools_sub;
			if (o.kwargs)
				o.kwargs = kw_sub;
		}
	}
	/* the server's own answers: stand-ins, replaced after the render */
	if (o.n_splices) {
		if (!c->tok) {
			rc = kv_fail(KV_ERR_INVALID, "splices need a tokenizer");
			goto done;
		}
		out->splice_at = malloc(o.n_splices * sizeof *out->splice_at);
		vs = calloc(o.n_splices, sizeof *vs);
		if (!out->splice_at || !vs) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto done;
		}
		for (size_t i = 0; i < o.n_splices; i++)
			out->splice_at[i] = -1;
		if ((rc = splice_stand_ins(prep, &o)))
			goto done;
	}
	int has_tools = tools && json_is_array(tools) && json_array_size(tools) > 0;
	j.c = c;
	j.t = has_tools && c->tmpl_tools ? c->tmpl_tools : c->tmpl;
	j.base.cap = TM_DEFAULT_MAX_MEMORY;
	j.memo.ar = &j.base;
	j.g = calloc(32 + (o.kwargs ? json_object_size(o.kwargs) : 0), sizeof *j.g);
	if (!j.g) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto done;
	}
	/* variables, later ones winning as in HF: special tokens, then the
	 * caller's template kwargs, then messages/tools/... */
	{
		const char *k;
		json_t *v;
		json_object_foreach(c->special, k, v)
			if ((rc = job_set_json(&j, k, v, NULL)))
				goto done;
		if (o.kwargs)
			json_object_foreach((json_t *)o.kwargs, k, v)
				if ((rc = job_set_json(&j, k, v, NULL)))
					goto done;
	}
	if (o.enable_thinking >= 0)
		job_set(&j, "enable_thinking", vbool(o.enable_thinking));
	if (o.reasoning_effort && !(o.kwargs && json_object_get(o.kwargs, "reasoning_effort"))) {
		/* the template's value borrows the string: it lives to the end */
		effort = json_string(o.reasoning_effort);
		rc = effort ? job_set_json(&j, "reasoning_effort", effort, NULL) : kv_fail(KV_ERR_NOMEM, "out of memory");
		if (rc)
			goto done;
	}
	if ((rc = job_set_json(&j, "messages", prep, &j.i_messages)))
		goto done;
	j.msgs = j.g[j.i_messages].v.u.l;
	if (has_tools) {
		if ((rc = job_set_json(&j, "tools", tools, NULL)))
			goto done;
	} else {
		job_set(&j, "tools", KJ_NONE);
	}
	job_set(&j, "documents", KJ_NONE);
	j.i_agp = job_set(&j, "add_generation_prompt", vbool(o.add_generation_prompt));

	if ((rc = kj_render_core(j.t, j.g, j.ng, NULL, &text, NULL, 0, NULL, &j.memo)))
		goto done;
	if (text.oom) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory for the rendered prompt");
		goto done;
	}
	const char *full = text.p ? text.p : "";
	size_t full_len = text.len;
	if (!kv_utf8_valid(full, full_len)) {
		rc = kv_fail(KV_ERR_INVALID, "the rendered prompt is not valid UTF-8");
		goto done;
	}
	/* every user turn as it was rendered when it was the newest */
	if (o.keep_reasoning && c->tok && (rc = keep_build(&j, prep, tools, &o, full, full_len, &keep)))
		goto done;

	/* boundaries in bytes of the final text */
	size_t n = j.msgs->n;
	if (c->tok && !o.skip_boundaries) {
		cuts = calloc(n + 2, sizeof *cuts);
		cut_k = calloc(n + 2, sizeof *cut_k);
		if (!cuts || !cut_k) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto done;
		}
		struct cut_search cs = {.cuts = cuts, .cut_k = cut_k};
		if ((rc = find_cuts(&j, prep, has_tools, &o, full, full_len, &keep, &cs)))
			goto done;
		n_cuts = cs.n_cuts;
		first_is_head = cs.first_is_head;
		from_probe = cs.from_probe;
	}
	if (keep.active) {
		kv_buf_free(&text);
		text = keep.t;
		memset(&keep.t, 0, sizeof keep.t);
		out->kept = 1;
	}
	full = text.p ? text.p : "";
	full_len = text.len;
	if (subst) {
		struct kv_buf fin2 = KV_BUF_INIT;
		if ((rc = lits_restore(full, full_len, &lits, &fin2, &spans, &n_spans, cuts, n_cuts))) {
			kv_buf_free(&fin2);
			goto done;
		}
		kv_buf_free(&text);
		text = fin2;
	}
	if (o.n_splices && (rc = apply_splices(c, &o, &text, cuts, n_cuts, spans, n_spans, vs, &nvs)))
		goto done;
	full = text.p ? text.p : "";
	full_len = text.len;
	out->n_spliced = nvs;

	/* tokens, segment by segment: every cut is at the start of an added
	 * token (or the end), where the tokenizer starts a new segment anyway,
	 * so the concatenation is the tokenization of the whole text and the
	 * tokens up to a cut are exactly the tokens of the text up to it;
	 * a spliced answer's tokens are its own */
	if (c->tok) {
		struct kv_buf ids = KV_BUF_INIT;
		size_t start = 0;
		out->boundaries = calloc(n_cuts ? n_cuts : 1, sizeof *out->boundaries);
		out->boundary_bytes = calloc(n_cuts ? n_cuts : 1, sizeof *out->boundary_bytes);
		out->boundary_msgs = calloc(n_cuts ? n_cuts : 1, sizeof *out->boundary_msgs);
		if (!out->boundaries || !out->boundary_bytes || !out->boundary_msgs) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto done;
		}
		for (size_t s = 0; s <= n_cuts; s++) {
			size_t end = s < n_cuts ? cuts[s] : full_len;
			if (end > start &&
			    (rc = encode_segment(c, &lits, full, start, end, spans, n_spans, vs, nvs, out->splice_at, &ids))) {
				kv_buf_free(&ids);
				goto done;
			}
			if (s < n_cuts) {
				out->boundaries[s] = (int32_t)(ids.len / sizeof(int32_t));
				out->boundary_bytes[s] = cuts[s];
				out->boundary_msgs[s] = (uint32_t)cut_k[s];
			}
			start = end;
		}
		if (ids.oom) {
			kv_buf_free(&ids);
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto done;
		}
		out->n_tokens = ids.len / sizeof(int32_t);
		out->tokens = (int32_t *)kv_buf_take(&ids);
		if (!out->tokens)
			out->tokens = calloc(1, sizeof(int32_t));
		out->n_boundaries = n_cuts;
		out->first_is_system = first_is_head;
		out->first_from_probe = from_probe;
	}
	out->text_len = full_len;
	out->text = text.p ? kv_buf_take(&text) : strdup("");
	if (!out->text)
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
done:
	if (rc)
		kv_chat_render_free(out);
	keep_free(&keep);
	kv_buf_free(&text);
	free(vs);
	free(cuts);
	free(cut_k);
	free(j.g);
	kj_ar_free(&j.base);
	json_decref(prep);
	json_decref(tools_sub);
	json_decref(kw_sub);
	json_decref(effort);
	free(lits.t);
	free(spans);
	return rc;
}
