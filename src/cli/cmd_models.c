/*
 * cmd_models.c - `kvkeep models`: the models already on this machine that
 * `kvkeep serve -m NAME` can serve by name, from the Hugging Face hub
 * cache and Ollama's store (model/locate.h). Reads folders and file
 * headers only; never opens a network connection.
 */
#include "cli/cli.h"
#include "base/err.h"
#include "model/locate.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void human(uint64_t b, char *out, size_t cap)
{
	static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)b;
	int i = 0;
	while (v >= 1024 && i < 4) {
		v /= 1024;
		i++;
	}
	snprintf(out, cap, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

static int cmd_models(int argc, char **argv)
{
	int as_json = 0;
	struct kv_flag flags[] = {
		{"json", KV_FLAG_BOOL, &as_json, NULL, "print one JSON object"},
		{0},
	};
	int rc = kv_flags_parse("usage: kvkeep models [--json]\n\n"
				"The models the Hugging Face hub and Ollama already downloaded, by the name `kvkeep serve -m "
				"NAME` takes.\nRead from HF_HUB_CACHE (else HF_HOME/hub, else ~/.cache/huggingface/hub) and "
				"OLLAMA_MODELS (else\n~/.ollama/models); nothing is downloaded.",
				flags, argc, argv, NULL, 0, NULL);
	if (rc == 1)
		return 0;
	if (rc)
		return 2;
	struct kv_locate_roots roots;
	struct kv_local_model *v = NULL;
	size_t n = 0;
	kv_locate_roots_env(&roots);
	if (kv_locate_list(&roots, &v, &n)) {
		fprintf(stderr, "kvkeep models: %s\n", kv_errmsg());
		return 1;
	}
	if (as_json) {
		json_t *o = json_object(), *a = json_array();
		json_object_set_new(o, "huggingface_hub", json_string(roots.hf_hub));
		json_object_set_new(o, "ollama", json_string(roots.ollama));
		for (size_t i = 0; i < n; i++) {
			json_t *m = json_pack("{s:s, s:s, s:s, s:b}", "name", v[i].name, "source", v[i].source, "path", v[i].path,
					      "ok", v[i].ok);
			if (v[i].ok) {
				json_object_set_new(m, "format", json_string(kv_model_kind_name(v[i].probe.kind)));
				json_object_set_new(m, "architecture", json_string(v[i].probe.arch));
				json_object_set_new(m, "bytes", json_integer((json_int_t)v[i].probe.weight_bytes));
			} else {
				json_object_set_new(m, "error", json_string(v[i].err));
			}
			json_array_append_new(a, m);
		}
		json_object_set_new(o, "models", a);
		char *s = json_dumps(o, JSON_INDENT(2));
		printf("%s\n", s ? s : "{}");
		free(s);
		json_decref(o);
	} else {
		printf("Hugging Face cache: %s\nOllama store:       %s\n\n", *roots.hf_hub ? roots.hf_hub : "(none)",
		       *roots.ollama ? roots.ollama : "(none)");
		if (!n)
			printf("no models found: download one with the Hugging Face CLI (hf download ORG/NAME) or `ollama pull "
			       "NAME`, or give kvkeep serve a file or folder\n");
		else
			printf("%-44s %-12s %-12s %-10s %s\n", "NAME (kvkeep serve -m NAME)", "SOURCE", "FORMAT", "SIZE",
			       "ARCHITECTURE");
		for (size_t i = 0; i < n; i++) {
			char sz[32];
			if (!v[i].ok) {
				printf("%-44s %-12s %s\n", v[i].name, v[i].source, "cannot be served:");
				printf("    %s\n", v[i].err);
				continue;
			}
			human(v[i].probe.weight_bytes, sz, sizeof sz);
			printf("%-44s %-12s %-12s %-10s %s\n", v[i].name, v[i].source, kv_model_kind_name(v[i].probe.kind), sz,
			       v[i].probe.arch[0] ? v[i].probe.arch : "?");
		}
	}
	free(v);
	return 0;
}
KV_COMMAND(models, "models", "list the models the Hugging Face hub and Ollama already downloaded (offline)",
	   cmd_models);
