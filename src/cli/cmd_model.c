/*
 * cmd_model.c - `kvkeep mkmodel` (write a synthetic model folder) and
 * `kvkeep model info` (what a model folder holds and what it costs per
 * token of context).
 *
 * Exit status: 0 done, 1 the operation failed (message on stderr), 2 bad
 * usage.
 */
#include "cli/cli.h"
#include "engine/isa.h"
#include "engine/layout.h"
#include "engine/qpanel.h"
#include "model/config.h"
#include "model/mlx.h"
#include "model/gguf.h"
#include "model/open.h"
#include "model/safetensors.h"
#include "model/synth.h"
#include "model/weights.h"
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
	int config_only = 0, large = 0, list = 0, no_sync = 0, mtp = 0, rc;
	struct kv_flag flags[] = {
		{"preset", KV_FLAG_STR, &preset, "NAME", "preset to write (see --list)"},
		{"out", KV_FLAG_STR, &out, "DIR", "output folder, created if missing"},
		{"tokenizer", KV_FLAG_STR, &tok, "DIR",
		 "copy tokenizer.json and tokenizer_config.json from DIR (default: the built-in tokenizer)"},
		{"seed", KV_FLAG_INT, &seed, "N", "weights seed (default 0); same seed, same bytes"},
		{"dtype", KV_FLAG_STR, &dtype, "bf16|f32", "weight dtype (default bf16)"},
		{"config-only", KV_FLAG_BOOL, &config_only, NULL, "write config.json and tokenizer files, no weights"},
		{"large", KV_FLAG_BOOL, &large, NULL,
		 "write the weights of a real-size preset too (qwen3-1.7b 4 GB, qwen3-8b 16 GB, qwen35-9b 18 GB in "
		 "bf16; for benchmarks)"},
		{"mtp", KV_FLAG_BOOL, &mtp, NULL,
		 "hybrid presets: add the multi-token-prediction head as the releases ship it (mtp.* tensors, "
		 "mtp_num_hidden_layers 1): a draft source for speculative decoding"},
		{"no-sync", KV_FLAG_BOOL, &no_sync, NULL, "skip fsync (throwaway test folders)"},
		{"list", KV_FLAG_BOOL, &list, NULL, "list the presets and exit"},
		{0},
	};
	const char *usage = "usage: kvkeep mkmodel --preset NAME --out DIR [--tokenizer DIR] [--seed N] "
			    "[--dtype bf16|f32] [--config-only | --large]";

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
		.large = large,
		.mtp = mtp,
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

/* Per-format tensor counts and bytes (an MLX matrix's codes, scales and
 * biases count as one "MLX<bits>" entry) and the bytes of the tensors the
 * engine reads (what stays resident once touched; extra tensors such as
 * mtp.* are mapped but never read). */
struct wtypes {
	char name[12][16];
	uint64_t count[12], bytes[12], resident;
	uint64_t packed; /* the prepacked panels this CPU's products add (engine/qpanel.h) */
	int n;
};

/* Whether this CPU's products keep prepacked panels of dtype dt. */
static int packs(int dt)
{
	return ke_qpanel_pre_bytes(ke_isa(), dt, 16, 32) > 0;
}

static void wtypes_add(struct wtypes *t, const char *name, uint64_t bytes)
{
	int i = 0;
	while (i < t->n && strcmp(t->name[i], name))
		i++;
	if (i == t->n) {
		if (t->n == 12)
			return; /* more formats than any real file has */
		snprintf(t->name[t->n++], sizeof t->name[0], "%s", name);
	}
	t->count[i]++;
	t->bytes[i] += bytes;
}

static void weight_types(const struct kv_model_config *c, const struct kv_weights *w, const char *prefix,
			 const struct kv_mlx_qcfg *q, struct wtypes *t)
{
	char nm[224];
	memset(t, 0, sizeof *t);
	for (size_t i = 0; i < kv_weights_count(w); i++) {
		const struct kv_tensor *x = kv_weights_at(w, i);
		size_t L = strlen(x->name);
		if (L > 7 && (!strcmp(x->name + L - 7, ".scales") || !strcmp(x->name + L - 7, ".biases"))) {
			snprintf(nm, sizeof nm, "%.*s.weight", (int)(L - 7), x->name);
			const struct kv_tensor *q = kv_weights_find(w, nm);
			if (q && q->dtype == KV_DT_U32)
				continue; /* counted with its codes */
		}
		if (x->dtype == KV_DT_U32 && L > 7 && !strcmp(x->name + L - 7, ".weight")) {
			char sn[240];
			uint64_t b = x->nbytes;
			int bits = 0, group = 0;
			static const char *const sfx[2] = {"scales", "biases"};
			for (int k = 0; k < 2; k++) {
				snprintf(sn, sizeof sn, "%.*s.%s", (int)(L - 7), x->name, sfx[k]);
				const struct kv_tensor *s = kv_weights_find(w, sn);
				b += s ? s->nbytes : 0;
			}
			snprintf(nm, sizeof nm, "%.*s", (int)(L - 7), x->name);
			if (q && kv_mlx_qcfg_lookup(q, nm, &bits, &group))
				snprintf(sn, sizeof sn, "MLX%d g%d", bits, group);
			else
				snprintf(sn, sizeof sn, "U32");
			wtypes_add(t, sn, b);
			continue;
		}
		wtypes_add(t, kv_dtype_name(x->dtype) ? kv_dtype_name(x->dtype) : "?", x->nbytes);
	}
	struct kv_tensor_spec *v;
	size_t n;
	if (kv_config_tensors(c, prefix, &v, &n))
		return;
	for (size_t i = 0; i < n; i++) {
		const char *name = v[i].role == KV_ROLE_LM_HEAD ? kv_config_lm_head_name(prefix) : v[i].name;
		const struct kv_tensor *x = kv_weights_find(w, name);
		if (!x)
			continue;
		t->resident += x->nbytes;
		/* the products' matrices (not the embedding table, a lookup) of a
		 * type with panels, and GPT-OSS's MXFP4 expert codes and scales */
		if ((v[i].role != KV_ROLE_EMBED && packs(x->dtype)) ||
		    ((v[i].role == KV_ROLE_MXFP4_BLOCKS || v[i].role == KV_ROLE_MXFP4_SCALES) && packs(KV_DT_MXFP4)))
			t->packed += x->nbytes;
		if (x->dtype == KV_DT_U32) {
			size_t L = strlen(name);
			static const char *const sfx[2] = {"scales", "biases"};
			for (int k = 0; k < 2; k++) {
				snprintf(nm, sizeof nm, "%.*s.%s", (int)(L - 7), name, sfx[k]);
				const struct kv_tensor *s = kv_weights_find(w, nm);
				t->resident += s ? s->nbytes : 0;
			}
		}
	}
	free(v);
}

static const char *layer_letter(int t)
{
	return t == KV_LAYER_ATTN ? "A" : t == KV_LAYER_MAMBA ? "M" : t == KV_LAYER_MLP ? "-" : "D";
}

/* layer_types as config.json names them */
static const char *layer_name(int t)
{
	return t == KV_LAYER_ATTN ? "full_attention" : t == KV_LAYER_MAMBA ? "mamba" : t == KV_LAYER_MLP ? "mlp"
												      : "linear_attention";
}

/* model info's lines on sliding windows, shared KV layers and per-type
 * head geometry (Gemma 3 / 4, GPT-OSS). */
static void print_window_lines(const struct kv_model_config *c)
{
	if (c->n_swa_layers)
		printf("window       %d tokens on %d sliding layers: %llu bytes per sequence (16-bit KV)\n",
		       c->sliding_window, kv_config_kv_layers(c, 1), (unsigned long long)kv_config_window_bytes(c, 2));
	if (c->n_kv_shared)
		printf("shared KV    the last %d layers read earlier layers' KV (no KV of their own)\n", c->n_kv_shared);
	if (c->swa_head_dim && c->swa_head_dim != c->head_dim)
		printf("heads        global layers %d KV heads of %d, sliding layers %d of %d\n", c->n_kv_heads,
		       c->head_dim, kv_config_swa_kv_heads(c), c->swa_head_dim);
}

/* The layers line of `model info` and its one letter a layer. */
static void print_layers(const struct kv_model_config *c, int n_rec)
{
	if (n_rec)
		printf("layers       %d: %d attention, %d recurrent (%s)%s\n              ", c->n_layers, c->n_attn_layers,
		       n_rec, c->ssm ? "Mamba-2" : "Gated DeltaNet", c->n_mlp_layers ? ", the rest MLP" : "");
	else /* attention only: how many of them slide */
		printf("layers       %d: %d attention, %d of them sliding-window\n              ", c->n_layers,
		       c->n_attn_layers, c->n_swa_layers);
	for (int l = 0; l < c->n_layers; l++)
		printf("%s", c->layer_type[l] == KV_LAYER_ATTN && c->layer_window[l] > 0 ? "S"
											 : layer_letter(c->layer_type[l]));
	printf("  (A attention, %s)\n", c->ssm ? "M Mamba-2, - MLP"
				     : n_rec ? "S sliding-window attention, D DeltaNet"
					     : "S sliding-window attention");
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
		if (!w_rc) /* the experts' layout, so their tensors count as resident */
			kv_config_detect_experts(&c, w, prefix);
		if (w_rc)
			snprintf(werr, sizeof werr, "%s", kv_errmsg());
	}

	struct wtypes wt = {0};
	if (w && !w_rc) {
		/* a GGUF (or a folder with a bad quantization block) has no MLX
		 * groups: its tensors are counted by their own types */
		struct kv_mlx_qcfg *q = NULL;
		if (kv_gguf_is_model_path(pos[0]) || kv_mlx_qcfg_load(pos[0], &q) != KV_OK)
			q = NULL;
		weight_types(&c, w, prefix, q, &wt);
		kv_mlx_qcfg_free(q);
		wt.resident += kv_weights_owned_bytes(w); /* f32 copies the engine makes */
	}
	uint64_t params = kv_config_param_count(&c);
	uint64_t active = kv_config_active_param_count(&c);
	/* Resident weights: every expert is mapped and counted, routed to or
	 * not (docs/models.md). BF16 = 2 bytes a parameter; a Q4_K_M GGUF is
	 * estimated at Q4KM_BITS bits a parameter over all of them (its mix of
	 * Q4_K, Q6_K and F32 norms averages about that on Qwen models). */
	const double Q4KM_BITS = 4.85;
	uint64_t bf16_bytes = params * 2, q4_bytes = (uint64_t)((double)params * Q4KM_BITS / 8.0);
	/* decode reads one row of an untied embedding table, all the rest */
	uint64_t dec = active - (c.tie_embeddings ? 0 : (uint64_t)c.vocab * (uint64_t)c.hidden);
	uint64_t kvb = kv_config_kv_bytes_per_token(&c, 2);
	/* every --kv-dtype, as the engine's layout sizes them (q8_0: 0 when
	 * head_dim is not a multiple of its 32-element blocks; the global
	 * attention layers only: a sliding layer keeps its window, below) */
	static const int kvd[3] = {KV_DT_F32, KV_DT_BF16, KV_DT_Q8_0};
	static const char *const kvn[3] = {"f32", "bf16", "q8_0"};
	uint64_t kvt[3];
	for (int i = 0; i < 3; i++)
		kvt[i] = ke_layout_token_bytes(kvd[i], kv_config_kv_layers(&c, 0), c.n_kv_heads, c.head_dim);
	/* A quantized file (a GGUF of block types, an MLX folder) leads with
	 * its own figures: what it holds, what the engine keeps resident and
	 * what decoding reads per token (the same share of it as of the
	 * parameters); the BF16 / Q4_K_M lines become estimates for other
	 * formats. */
	int quantized = 0, mlx = 0;
	char file_types[160] = "";
	for (int i = 0, at = 0; w && !w_rc && i < wt.n; i++) {
		if (strcmp(wt.name[i], "F32") && strcmp(wt.name[i], "F16") && strcmp(wt.name[i], "BF16"))
			quantized = 1;
		mlx |= !strncmp(wt.name[i], "MLX", 3);
		if (at < (int)sizeof file_types - 24)
			at += snprintf(file_types + at, sizeof file_types - (size_t)at, "%s%s", at ? ", " : "", wt.name[i]);
	}
	uint64_t file_dec = params ? (uint64_t)((double)wt.resident * (double)dec / (double)params) : 0;
	uint64_t rsb = kv_config_recurrent_state_bytes(&c);
	uint64_t csb = kv_config_conv_state_bytes(&c);
	int n_rec = c.n_deltanet_layers + c.n_ssm_layers;
	if (as_json) {
		json_t *o = json_object(), *lt = json_array();
		json_object_set_new(o, "architecture", json_string(kv_arch_name(c.arch)));
		json_object_set_new(o, "model_type", json_string(c.model_type));
		json_object_set_new(o, "hf_architecture", json_string(c.architecture));
		json_object_set_new(o, "n_layers", json_integer(c.n_layers));
		json_object_set_new(o, "n_attention_layers", json_integer(c.n_attn_layers));
		json_object_set_new(o, "n_recurrent_layers", json_integer(n_rec));
		for (int l = 0; l < c.n_layers; l++)
			json_array_append_new(lt, json_string(c.layer_type[l] == KV_LAYER_ATTN && c.layer_window[l] > 0
								      ? "sliding_attention"
								      : layer_name(c.layer_type[l])));
		json_object_set_new(o, "layer_types", lt);
		json_object_set_new(o, "hidden", json_integer(c.hidden));
		json_object_set_new(o, "vocab", json_integer(c.vocab));
		json_object_set_new(o, "params", json_integer((json_int_t)params));
		json_object_set_new(o, "active_params", json_integer((json_int_t)active));
		if (quantized) {
			json_object_set_new(o, "file", json_pack("{s:s, s:I, s:I, s:I}", "format", kv_weights_gguf(w) ? "gguf" : mlx ? "mlx" : "hf",
							       "bytes", (json_int_t)kv_weights_bytes(w), "resident_bytes",
							       (json_int_t)wt.resident, "decode_bytes_per_token_est",
							       (json_int_t)file_dec));
		}
		json_object_set_new(o, "resident_bytes_bf16", json_integer((json_int_t)bf16_bytes));
		json_object_set_new(o, "resident_bytes_q4_k_m_est", json_integer((json_int_t)q4_bytes));
		json_object_set_new(o, "decode_bytes_per_token_bf16", json_integer((json_int_t)(dec * 2)));
		json_object_set_new(o, "recurrent_bytes_per_sequence",
				    json_integer((json_int_t)((rsb + csb) * (uint64_t)n_rec)));
		if (c.n_moe_layers) {
			json_t *mo = json_object();
			json_object_set_new(mo, "n_experts", json_integer(c.n_experts));
			json_object_set_new(mo, "n_experts_per_tok", json_integer(c.n_experts_per_tok));
			json_object_set_new(mo, "moe_intermediate", json_integer(c.moe_intermediate));
			json_object_set_new(mo, "shared_intermediate", json_integer(c.shared_intermediate));
			json_object_set_new(mo, "norm_topk_prob", json_boolean(c.norm_topk_prob));
			json_object_set_new(mo, "n_moe_layers", json_integer(c.n_moe_layers));
			json_object_set_new(o, "moe", mo);
		}
		json_object_set_new(o, "kv_bytes_per_token", json_integer((json_int_t)kvb));
		/* sliding layers: their window, held once per sequence (and per
		 * window snapshot), not per token (docs/cache.md) */
		json_object_set_new(o, "sliding_window", json_integer(c.n_swa_layers ? c.sliding_window : 0));
		json_object_set_new(o, "n_sliding_layers", json_integer(c.n_swa_layers));
		json_object_set_new(o, "window_bytes_per_sequence", json_integer((json_int_t)kv_config_window_bytes(&c, 2)));
		json_t *kd = json_object();
		for (int i = 0; i < 3; i++)
			json_object_set_new(kd, kvn[i], kvt[i] || !c.n_attn_layers ? json_integer((json_int_t)kvt[i]) : json_null());
		json_object_set_new(o, "kv_bytes_per_token_by_dtype", kd);
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
			}
			if (!w_rc) {
				json_object_set_new(wo, "prefix", json_string(prefix));
				json_t *ty = json_object();
				for (int i = 0; i < wt.n; i++) {
					json_t *e = json_object();
					json_object_set_new(e, "tensors", json_integer((json_int_t)wt.count[i]));
					json_object_set_new(e, "bytes", json_integer((json_int_t)wt.bytes[i]));
					json_object_set_new(ty, wt.name[i], e);
				}
				json_object_set_new(wo, "types", ty);
				json_object_set_new(wo, "resident_bytes", json_integer((json_int_t)wt.resident));
				json_object_set_new(wo, "prepacked_bytes_est", json_integer((json_int_t)wt.packed));
			} else {
				json_object_set_new(wo, "error", json_string(werr));
			}
			json_object_set_new(o, "weights", wo);
		}
		char *s = json_dumps(o, JSON_INDENT(2));
		printf("%s\n", s ? s : "{}");
		free(s);
		json_decref(o);
	} else {
		printf("model        %s\n", pos[0]);
		if (quantized) {
			printf("this file    %s: %.2f GiB of weights (%s)\n",
			       kv_weights_gguf(w) ? "GGUF quantized" : mlx ? "MLX folder" : "Hugging Face folder",
			       (double)kv_weights_bytes(w) / 1073741824.0, file_types);
			printf("             %.2f GiB resident, decode reads ~%.1f MiB of it per token\n",
			       (double)wt.resident / 1073741824.0, (double)file_dec / 1048576.0);
			if (wt.packed)
				printf("             + ~%.2f GiB of prepacked panels of its Q8_0 / Q4_0 / Q5_0 / MXFP4 matrices on "
				       "this CPU (docs/engine.md)\n", (double)wt.packed / 1073741824.0);
		}
		printf("architecture %s (model_type %s%s%s)\n", kv_arch_name(c.arch), c.model_type,
		       c.architecture[0] ? ", " : "", c.architecture);
		print_layers(&c, n_rec);
		printf("shape        hidden %d, intermediate %d, vocab %d, heads %d/%d kv x %d", c.hidden, c.intermediate,
		       c.vocab, c.n_heads, c.n_kv_heads, c.head_dim);
		if (c.hybrid)
			printf(", rotary %d; DeltaNet Hk %d Hv %d dk %d dv %d K %d", c.rotary_dim, c.lin_k_heads,
			       c.lin_v_heads, c.lin_k_dim, c.lin_v_dim, c.conv_kernel);
		if (c.ssm)
			printf("; Mamba-2 heads %d x %d, state %d, groups %d, conv %d", c.ssm_heads, c.ssm_head_dim,
			       c.ssm_state, c.ssm_groups, c.conv_kernel);
		printf("\n");
		printf("params       %llu (%.2f M)%s\n", (unsigned long long)params, (double)params / 1e6,
		       c.tie_embeddings ? ", embeddings tied" : "");
		if (c.n_moe_layers)
			printf("experts      %d routed (top %d%s, %d x %d)%s%.0d on %d of %d layers\n"
			       "active       %llu parameters a token reads (%.2f M)\n",
			       c.n_experts, c.n_experts_per_tok, c.norm_topk_prob ? ", renormalised" : "",
			       c.moe_intermediate, c.hidden, c.shared_intermediate ? " + 1 shared of " : "",
			       c.shared_intermediate, c.n_moe_layers, c.n_layers,
			       (unsigned long long)active, (double)active / 1e6);
		printf("%s %.2f GiB as BF16, ~%.2f GiB as Q4_K_M (%.2f bits/weight, all experts resident)\n",
		       quantized ? "other formats" : "resident    ", (double)bf16_bytes / 1073741824.0,
		       (double)q4_bytes / 1073741824.0, Q4KM_BITS);
		printf("%s %.1f MiB of BF16 weights per token (~%.1f MiB as Q4_K_M)\n",
		       quantized ? "  they read  " : "decode reads", (double)dec * 2 / 1048576.0,
		       (double)dec * Q4KM_BITS / 8 / 1048576.0);
		printf("kv/token     %llu bytes with --kv-dtype bf16 (the default), %llu f32, ", (unsigned long long)kvt[1],
		       (unsigned long long)kvt[0]);
		if (kvt[2] || !c.n_attn_layers)
			printf("%llu q8_0 (%.3fx bf16)%s\n", (unsigned long long)kvt[2],
			       kvt[1] ? (double)kvt[2] / (double)kvt[1] : 0.0, c.n_swa_layers ? ", global layers only" : "");
		else
			printf("no q8_0 (head_dim %d is not a multiple of 32)\n", c.head_dim);
		print_window_lines(&c);
		if (c.hybrid || c.ssm)
			printf("recurrent    %llu bytes of %s state + %llu bytes of conv state per %s layer\n",
			       (unsigned long long)rsb, c.ssm ? "SSM" : "delta-rule", (unsigned long long)csb,
			       c.ssm ? "Mamba-2" : "DeltaNet");
		if (c.hybrid || c.ssm)
			printf("             %.2f MiB of recurrent state per sequence\n",
			       (double)((rsb + csb) * (uint64_t)n_rec) / 1048576.0);
		if (!has_weights)
			printf("weights      none (config only)\n");
		else if (w_rc)
			printf("weights      INCOMPATIBLE: %s\n", werr);
		else {
			printf("weights      %zu tensors in %zu %s file(s), %llu bytes, prefix %s\n", kv_weights_count(w),
			       kv_weights_nfiles(w), kv_weights_gguf(w) ? "GGUF" : "safetensors",
			       (unsigned long long)kv_weights_bytes(w), prefix);
			for (int i = 0; i < wt.n; i++)
				printf("  %-10s %llu %s, %llu bytes\n", wt.name[i], (unsigned long long)wt.count[i],
				       strncmp(wt.name[i], "MLX", 3) ? "tensors" : "matrices (codes + scales + biases)",
				       (unsigned long long)wt.bytes[i]);
			printf("resident     %llu bytes (%.1f MiB) of weights the engine reads\n",
			       (unsigned long long)wt.resident, (double)wt.resident / 1048576.0);
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
