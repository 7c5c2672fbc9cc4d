/*
 * cmd_model.c - `kvkeep mkmodel` (write a synthetic model folder) and
 * `kvkeep model info` (what a model folder holds and what it costs per
 * token of context).
 *
 * Exit status: 0 done, 1 the operation failed (message on stderr), 2 bad
 * usage.
 */
#include "cli/cli.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "model/synth.h"
#include "base/durable.h"
#include "base/err.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void list_presets(FILE *f)
{
	fprintf(f, "presets:\n");
	for (size_t i = 0; i < kv_synth_preset_count(); i++) {
		const struct kv_synth_preset *p = kv_synth_preset_at(i);
		fprintf(f, "  %-14s %s\n", p->name, p->summary);
	}
}

static int cmd_mkmodel(int argc, char **argv)
{
	const char *preset = NULL, *out = NULL, *tok = NULL, *dtype = "bf16";
	int64_t seed = 0;
	int config_only = 0, list = 0, no_sync = 0, rc;
	struct kv_flag flags[] = {
		{"preset", KV_FLAG_STR, &preset, "NAME", "preset to write (see --list)"},
		{"out", KV_FLAG_STR, &out, "DIR", "output folder, created if missing"},
		{"tokenizer", KV_FLAG_STR, &tok, "DIR",
		 "copy tokenizer.json and tokenizer_config.json from DIR (default: the built-in tokenizer)"},
		{"seed", KV_FLAG_INT, &seed, "N", "weights seed (default 0); same seed, same bytes"},
		{"dtype", KV_FLAG_STR, &dtype, "bf16|f32", "weight dtype (default bf16)"},
		{"config-only", KV_FLAG_BOOL, &config_only, NULL, "write config.json and tokenizer files, no weights"},
		{"no-sync", KV_FLAG_BOOL, &no_sync, NULL, "skip fsync (throwaway test folders)"},
		{"list", KV_FLAG_BOOL, &list, NULL, "list the presets and exit"},
		{0},
	};
	const char *usage = "usage: kvkeep mkmodel --preset NAME --out DIR [--tokenizer DIR] [--seed N] "
			    "[--dtype bf16|f32] [--config-only]";

	rc = kv_flags_parse(usage, flags, argc, argv, NULL, 0, NULL);
	if (rc == 1) {
		list_presets(stdout);
		return 0;
	}
	if (rc)
		return 2;
	if (list) {
		list_presets(stdout);
		return 0;
	}
	if (!preset || !out) {
		fprintf(stderr, "kvkeep mkmodel: --preset and --out are required\n%s\n", usage);
		list_presets(stderr);
		return 2;
	}
	if (!kv_synth_preset_find(preset)) {
		fprintf(stderr, "kvkeep mkmodel: unknown preset '%s'\n", preset);
		list_presets(stderr);
		return 2;
	}
	if (strcmp(dtype, "bf16") && strcmp(dtype, "f32")) {
		fprintf(stderr, "kvkeep mkmodel: --dtype must be bf16 or f32, got '%s'\n", dtype);
		return 2;
	}
	if (seed < 0) {
		fprintf(stderr, "kvkeep mkmodel: --seed must be >= 0\n");
		return 2;
	}
	struct kv_synth_opts o = {
		.preset = preset,
		.out_dir = out,
		.tokenizer_dir = tok,
		.seed = (uint64_t)seed,
		.dtype = strcmp(dtype, "f32") ? KV_DT_BF16 : KV_DT_F32,
		.config_only = config_only,
		.dw_flags = no_sync ? KV_DW_NO_SYNC : 0,
	};
	rc = kv_synth_write(&o);
	if (rc) {
		fprintf(stderr, "kvkeep mkmodel: %s\n", kv_errmsg());
		return 1;
	}
	struct kv_model_config c;
	if (kv_config_load(out, &c) == KV_OK)
		printf("wrote %s: preset %s, %s, %d layers, vocab %d, %llu parameters%s\n", out, preset,
		       kv_arch_name(c.arch), c.n_layers, c.vocab, (unsigned long long)kv_config_param_count(&c),
		       config_only ? " (config only, no weights)" : "");
	return 0;
}
KV_COMMAND(mkmodel, "mkmodel", "write a synthetic model folder (Hugging Face layout)", cmd_mkmodel);

static const char *layer_letter(int t)
{
	return t == KV_LAYER_ATTN ? "A" : "D";
}

static int cmd_model_info(int argc, char **argv)
{
	int as_json = 0, rc, n_pos = 0, w_rc = KV_OK;
	char *pos[1], prefix[64] = "", werr[1024] = "";
	struct kv_flag flags[] = {
		{"json", KV_FLAG_BOOL, &as_json, NULL, "print one JSON object"},
		{0},
	};
	const char *usage = "usage: kvkeep model info DIR [--json]";
	struct kv_model_config c;
	struct kv_weights *w = NULL;
	char wpath[4096], ipath[4096];
	struct stat sb;
	int has_weights;

	rc = kv_flags_parse(usage, flags, argc, argv, pos, 1, &n_pos);
	if (rc == 1)
		return 0;
	if (rc)
		return 2;
	if (n_pos != 1) {
		fprintf(stderr, "kvkeep model info: a model folder is required\n%s\n", usage);
		return 2;
	}
	if ((rc = kv_config_load(pos[0], &c))) {
		fprintf(stderr, "kvkeep model info: %s\n", kv_errmsg());
		return 1;
	}
	snprintf(wpath, sizeof wpath, "%s/model.safetensors", pos[0]);
	snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", pos[0]);
	has_weights = stat(wpath, &sb) == 0 || stat(ipath, &sb) == 0 || kv_gguf_is_model_path(pos[0]);
	if (has_weights) {
		w_rc = kv_weights_open(pos[0], &w);
		if (!w_rc)
			w_rc = kv_config_check_weights(&c, w, prefix, sizeof prefix);
		if (w_rc)
			snprintf(werr, sizeof werr, "%s", kv_errmsg());
	}

	/* Tensor types as stored: a GGUF's own table (per-tensor types), else
	 * the safetensors dtypes. */
	uint64_t by_n[KV_DT__COUNT] = {0}, by_b[KV_DT__COUNT] = {0}, file_b = 0, owned_b = 0;
	if (w) {
		const struct kv_gguf *g = kv_weights_gguf(w);
		size_t nt = g ? kv_gguf_tensor_count(g) : kv_weights_count(w);
		for (size_t i = 0; i < nt; i++) {
			const struct kv_tensor *t = g ? kv_gguf_tensor_at(g, i) : kv_weights_at(w, i);
			if (t->dtype >= 0 && t->dtype < KV_DT__COUNT) {
				by_n[t->dtype]++;
				by_b[t->dtype] += t->nbytes;
			}
		}
		file_b = g ? kv_gguf_file_bytes(g) : kv_weights_bytes(w);
		owned_b = kv_weights_owned_bytes(w);
	}
	uint64_t params = kv_config_param_count(&c);
	uint64_t kvb = kv_config_kv_bytes_per_token(&c, 2);
	uint64_t rsb = kv_config_recurrent_state_bytes(&c);
	uint64_t csb = kv_config_conv_state_bytes(&c);
	if (as_json) {
		json_t *o = json_object(), *lt = json_array();
		json_object_set_new(o, "architecture", json_string(kv_arch_name(c.arch)));
		json_object_set_new(o, "model_type", json_string(c.model_type));
		json_object_set_new(o, "hf_architecture", json_string(c.architecture));
		json_object_set_new(o, "n_layers", json_integer(c.n_layers));
		json_object_set_new(o, "n_attention_layers", json_integer(c.n_attn_layers));
		json_object_set_new(o, "n_recurrent_layers", json_integer(c.n_deltanet_layers));
		for (int l = 0; l < c.n_layers; l++)
			json_array_append_new(lt, json_string(c.layer_type[l] == KV_LAYER_ATTN ? "full_attention"
											: "linear_attention"));
		json_object_set_new(o, "layer_types", lt);
		json_object_set_new(o, "hidden", json_integer(c.hidden));
		json_object_set_new(o, "vocab", json_integer(c.vocab));
		json_object_set_new(o, "params", json_integer((json_int_t)params));
		json_object_set_new(o, "kv_bytes_per_token", json_integer((json_int_t)kvb));
		json_object_set_new(o, "recurrent_state_bytes_per_layer", json_integer((json_int_t)rsb));
		json_object_set_new(o, "conv_state_bytes_per_layer", json_integer((json_int_t)csb));
		if (!has_weights) {
			json_object_set_new(o, "weights", json_null());
		} else {
			json_t *wo = json_object();
			json_object_set_new(wo, "ok", json_boolean(!w_rc));
			if (w) {
				json_object_set_new(wo, "files", json_integer((json_int_t)kv_weights_nfiles(w)));
				json_object_set_new(wo, "tensors", json_integer((json_int_t)kv_weights_count(w)));
				json_object_set_new(wo, "bytes", json_integer((json_int_t)kv_weights_bytes(w)));
				json_object_set_new(wo, "format", json_string(kv_weights_gguf(w) ? "gguf" : "safetensors"));
				json_t *ty = json_object();
				for (int d = 0; d < KV_DT__COUNT; d++)
					if (by_n[d]) {
						json_t *e = json_object();
						json_object_set_new(e, "tensors", json_integer((json_int_t)by_n[d]));
						json_object_set_new(e, "bytes", json_integer((json_int_t)by_b[d]));
						json_object_set_new(ty, kv_dtype_name(d), e);
					}
				json_object_set_new(wo, "types", ty);
				json_object_set_new(wo, "resident_bytes", json_integer((json_int_t)(file_b + owned_b)));
			}
			if (!w_rc)
				json_object_set_new(wo, "prefix", json_string(prefix));
			else
				json_object_set_new(wo, "error", json_string(werr));
			json_object_set_new(o, "weights", wo);
		}
		char *s = json_dumps(o, JSON_INDENT(2));
		printf("%s\n", s ? s : "{}");
		free(s);
		json_decref(o);
	} else {
		printf("model        %s\n", pos[0]);
		printf("architecture %s (model_type %s%s%s)\n", kv_arch_name(c.arch), c.model_type,
		       c.architecture[0] ? ", " : "", c.architecture);
		printf("layers       %d: %d attention, %d recurrent (Gated DeltaNet)\n              ", c.n_layers,
		       c.n_attn_layers, c.n_deltanet_layers);
		for (int l = 0; l < c.n_layers; l++)
			printf("%s", layer_letter(c.layer_type[l]));
		printf("  (A attention, D DeltaNet)\n");
		printf("shape        hidden %d, intermediate %d, vocab %d, heads %d/%d kv x %d", c.hidden, c.intermediate,
		       c.vocab, c.n_heads, c.n_kv_heads, c.head_dim);
		if (c.hybrid)
			printf(", rotary %d; DeltaNet Hk %d Hv %d dk %d dv %d K %d", c.rotary_dim, c.lin_k_heads,
			       c.lin_v_heads, c.lin_k_dim, c.lin_v_dim, c.conv_kernel);
		printf("\n");
		printf("params       %llu (%.2f M)%s\n", (unsigned long long)params, (double)params / 1e6,
		       c.tie_embeddings ? ", embeddings tied" : "");
		printf("kv/token     %llu bytes (16-bit KV)\n", (unsigned long long)kvb);
		if (c.hybrid)
			printf("recurrent    %llu bytes of delta-rule state + %llu bytes of conv state per DeltaNet "
			       "layer\n",
			       (unsigned long long)rsb, (unsigned long long)csb);
		if (!has_weights)
			printf("weights      none (config only)\n");
		else if (w_rc)
			printf("weights      INCOMPATIBLE: %s\n", werr);
		else {
			printf("weights      %zu tensors in %zu %s file(s), %llu bytes, prefix %s\n", kv_weights_count(w),
			       kv_weights_nfiles(w), kv_weights_gguf(w) ? "GGUF" : "safetensors",
			       (unsigned long long)kv_weights_bytes(w), prefix);
			for (int d = 0; d < KV_DT__COUNT; d++)
				if (by_n[d])
					printf("  %-9s %4llu tensors %12llu bytes\n", kv_dtype_name(d),
					       (unsigned long long)by_n[d], (unsigned long long)by_b[d]);
			printf("resident     %.1f MiB (%.1f MiB mapped from the file%s, %.1f MiB of copies)\n",
			       (double)(file_b + owned_b) / 1048576.0, (double)file_b / 1048576.0,
			       kv_weights_gguf(w) ? "s" : "", (double)owned_b / 1048576.0);
		}
	}
	kv_weights_close(w);
	if (w_rc) {
		fprintf(stderr, "kvkeep model info: %s\n", werr);
		return 1;
	}
	return 0;
}
KV_COMMAND(model_info, "model info", "describe a model folder (layers, parameters, bytes per token)",
	   cmd_model_info);
