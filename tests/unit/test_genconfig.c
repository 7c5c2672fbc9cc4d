/*
 * test_genconfig.c - generation_config.json, the GGUF setter, the layering
 * of defaults and the stop-token set (model/genconfig.h).
 */
#include "base/err.h"
#include "model/genconfig.h"
#include "model/synth.h"
#include "text/template.h"
#include "text/tokenizer.h"
#include "text/stop.h"
#include "kt.h"

#include <stdio.h>
#include <stdlib.h>

static int parse(const char *s, struct kv_gencfg *g)
{
	return kv_gencfg_parse(s, strlen(s), "generation_config.json", g);
}

KT_CASE(parse_fields_and_do_sample)
{
	struct kv_gencfg g;
	/* the Qwen3 file, plus the fields Qwen3.5 adds */
	KT_OK(parse("{\"bos_token_id\":151643,\"do_sample\":true,\"eos_token_id\":[151645,151643],"
		    "\"pad_token_id\":151643,\"temperature\":0.6,\"top_k\":20,\"top_p\":0.95,\"min_p\":0,"
		    "\"presence_penalty\":1.5,\"repetition_penalty\":1.0,\"transformers_version\":\"4.51.0\"}",
		    &g));
	KT_CHECK(g.v[KV_GC_TEMPERATURE] == 0.6 && g.v[KV_GC_TOP_K] == 20 && g.v[KV_GC_TOP_P] == 0.95);
	KT_CHECK(g.v[KV_GC_PRESENCE_PENALTY] == 1.5 && g.v[KV_GC_REPETITION_PENALTY] == 1.0 && g.v[KV_GC_MIN_P] == 0);
	KT_EQ_STR(g.src[KV_GC_TEMPERATURE], "generation_config");
	KT_CHECK(g.src[KV_GC_FREQUENCY_PENALTY] == NULL); /* absent: not set */
	KT_EQ_INT(g.n_eos, 2);
	KT_EQ_INT(g.eos_ids[0], 151645);
	KT_EQ_INT(g.eos_ids[1], 151643);
	/* do_sample false: greedy whatever the temperature says (HF) */
	KT_OK(parse("{\"do_sample\":false,\"temperature\":0.7,\"eos_token_id\":5,\"top_p\":null}", &g));
	KT_CHECK(g.v[KV_GC_TEMPERATURE] == 0 && g.src[KV_GC_TEMPERATURE]);
	KT_CHECK(g.src[KV_GC_TOP_P] == NULL);
	KT_EQ_INT(g.n_eos, 1);
	KT_EQ_INT(g.eos_ids[0], 5);
	/* top_k -1 is "off" */
	KT_OK(parse("{\"top_k\":-1}", &g));
	KT_CHECK(g.v[KV_GC_TOP_K] == 0 && g.src[KV_GC_TOP_K]);
}

KT_CASE(bad_files_are_refused_naming_the_field)
{
	static const char *bad[][2] = {
		{"[1]", "object"},
		{"{\"temperature\":\"hot\"}", "temperature"},
		{"{\"temperature\":-1}", "temperature"},
		{"{\"top_p\":0}", "top_p"},
		{"{\"top_p\":1.5}", "top_p"},
		{"{\"top_k\":2.5}", "top_k"},
		{"{\"top_k\":-3}", "top_k"},
		{"{\"min_p\":2}", "min_p"},
		{"{\"repetition_penalty\":0}", "repetition_penalty"},
		{"{\"presence_penalty\":3}", "presence_penalty"},
		{"{\"do_sample\":1}", "do_sample"},
		{"{\"eos_token_id\":\"x\"}", "eos_token_id"},
		{"{\"eos_token_id\":[1,-2]}", "eos_token_id[1]"},
		{"{\"temperature\":", "generation_config.json"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct kv_gencfg g;
		int rc = parse(bad[i][0], &g);
		KT_CHECKF(rc == KV_ERR_INVALID || rc == KV_ERR_CORRUPT, "%s: rc %d", bad[i][0], rc);
		KT_CHECKF(strstr(kv_errmsg(), bad[i][1]) != NULL, "%s: message '%s' does not name %s", bad[i][0],
			  kv_errmsg(), bad[i][1]);
		KT_CHECK(g.src[KV_GC_TEMPERATURE] == NULL && g.n_eos == 0); /* nothing half-read */
	}
	/* a folder without the file */
	struct kv_gencfg g;
	KT_EQ_INT(kv_gencfg_load(kt_tmpdir(), &g), KV_ERR_NOT_FOUND);
}

KT_CASE(gguf_setter_and_layers)
{
	struct kv_gencfg d, file, gguf, flags;
	kv_gencfg_openai(&d);
	KT_CHECK(d.v[KV_GC_TEMPERATURE] == 1 && d.v[KV_GC_TOP_P] == 1 && d.v[KV_GC_TOP_K] == 0 &&
		 d.v[KV_GC_REPETITION_PENALTY] == 1);
	kv_gencfg_init(&gguf);
	KT_OK(kv_gencfg_set_gguf(&gguf, "general.sampling.temp", 0.7));
	KT_OK(kv_gencfg_set_gguf(&gguf, "general.sampling.top_k", 40));
	KT_OK(kv_gencfg_set_gguf(&gguf, "general.sampling.penalty_repeat", 1.05));
	KT_EQ_INT(kv_gencfg_set_gguf(&gguf, "general.sampling.mirostat", 1), KV_ERR_UNSUPPORTED);
	KT_EQ_INT(kv_gencfg_set_gguf(&gguf, "general.name", 1), KV_ERR_NOT_FOUND);
	KT_EQ_INT(kv_gencfg_set_gguf(&gguf, "general.sampling.top_p", 2), KV_ERR_INVALID);
	KT_EQ_STR(gguf.src[KV_GC_TOP_K], "gguf");
	KT_OK(parse("{\"temperature\":0.6,\"top_p\":0.8,\"eos_token_id\":[7,8]}", &file));
	kv_gencfg_init(&flags);
	KT_OK(kv_gencfg_set(&flags, KV_GC_TOP_P, 0.5, "flag"));
	KT_EQ_INT(kv_gencfg_set(&flags, KV_GC_MIN_P, -1, "flag"), KV_ERR_INVALID);
	kv_gencfg_overlay(&d, &gguf);
	kv_gencfg_overlay(&d, &file);
	kv_gencfg_overlay(&d, &flags);
	KT_CHECK(d.v[KV_GC_TEMPERATURE] == 0.6 && d.v[KV_GC_TOP_P] == 0.5 && d.v[KV_GC_TOP_K] == 40 &&
		 d.v[KV_GC_REPETITION_PENALTY] == 1.05 && d.v[KV_GC_MIN_P] == 0);
	KT_EQ_STR(d.src[KV_GC_TEMPERATURE], "generation_config");
	KT_EQ_STR(d.src[KV_GC_TOP_P], "flag");
	KT_EQ_STR(d.src[KV_GC_MIN_P], "openai");
	KT_EQ_INT(d.n_eos, 2);
	KT_EQ_INT(kv_gencfg_field("min_p"), KV_GC_MIN_P);
	KT_EQ_INT(kv_gencfg_field("nope"), -1);
}

KT_CASE(stop_ids_add_the_end_of_turn_token)
{
	char *tj = NULL, *cj = NULL;
	size_t tl = 0, cl = 0;
	struct kv_tok *tok = NULL;
	struct kv_chat *chat = NULL;
	KT_OK(kv_synth_tokenizer(&tj, &tl, &cj, &cl));
	KT_OK(kv_tok_load_mem(tj, tl, "synthetic", &tok));
	KT_REQUIRE(tok);
	KT_OK(kv_chat_load_mem(cj, cl, tok, &chat));
	KT_REQUIRE(chat);
	int32_t im_end = kv_tok_id(tok, "<|im_end|>"), eot = kv_tok_id(tok, "<|endoftext|>");
	KT_CHECK(im_end >= 0 && eot >= 0);
	struct kv_model_config cfg;
	memset(&cfg, 0, sizeof cfg);
	cfg.eos_ids[0] = eot; /* config.json names only <|endoftext|> */
	cfg.n_eos = 1;
	struct kv_gencfg gc;
	KT_OK(parse("{\"eos_token_id\":[3,3]}", &gc));
	int32_t ids[16];
	int n = kv_gencfg_stop_ids(&cfg, &gc, tok, chat, ids, 16);
	KT_EQ_INT(n, 3);
	KT_EQ_INT(ids[0], eot);
	KT_EQ_INT(ids[1], 3);
	KT_EQ_INT(ids[2], im_end); /* the template's end of turn */
	/* no template, no generation_config: config + <|endoftext|> */
	n = kv_gencfg_stop_ids(&cfg, NULL, tok, NULL, ids, 16);
	KT_EQ_INT(n, 1);
	kv_chat_free(chat);
	kv_tok_free(tok);
	free(tj);
	free(cj);
}

KT_MAIN(parse_fields_and_do_sample, bad_files_are_refused_naming_the_field, gguf_setter_and_layers,
	stop_ids_add_the_end_of_turn_token)
