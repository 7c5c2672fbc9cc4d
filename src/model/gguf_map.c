/*
 * gguf_map.c - see gguf_map.h. One table per kind of name serves both
 * directions, so conversion and loading cannot drift apart.
 */
#include "model/gguf_map.h"

#include <stdio.h>
#include <string.h>

/* Pre-tokenizer regexes by tokenizer.ggml.pre (the Split patterns of the
 * real tokenizer.json files). */
static const char g_re_qwen2[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
	"\\s+(?!\\S)|\\s+";
/* Llama 3's (tokenizer.ggml.pre "llama-bpe") and o200k's (GPT-OSS,
 * "gpt-4o") Split patterns, as their tokenizer.json files write them */
static const char g_re_llama3[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
	"\\s+(?!\\S)|\\s+";
static const char g_re_gpt4o[] =
	"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
	"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
	"\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char g_re_qwen35[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
	"\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct name_map {
	const char *hf;       /* suffix after "model.layers.N." (or full top-level name) */
	const char *gg;       /* suffix after "blk.N." */
	int hybrid_only;      /* 1 hybrid, 0 both, -1 dense only */
	int xf;
};

static const struct name_map g_layer[] = {
	{"input_layernorm.weight", "attn_norm.weight", 0, KV_GGUF_XF_NORM1},
	{"post_attention_layernorm.weight", "ffn_norm.weight", -1, KV_GGUF_XF_NONE},
	{"post_attention_layernorm.weight", "post_attention_norm.weight", 1, KV_GGUF_XF_NORM1},
	{"self_attn.q_proj.weight", "attn_q.weight", 0, KV_GGUF_XF_NONE},
	{"self_attn.k_proj.weight", "attn_k.weight", 0, KV_GGUF_XF_NONE},
	{"self_attn.v_proj.weight", "attn_v.weight", 0, KV_GGUF_XF_NONE},
	{"self_attn.o_proj.weight", "attn_output.weight", 0, KV_GGUF_XF_NONE},
	{"self_attn.q_norm.weight", "attn_q_norm.weight", 0, KV_GGUF_XF_NORM1},
	{"self_attn.k_norm.weight", "attn_k_norm.weight", 0, KV_GGUF_XF_NORM1},
	{"mlp.gate_proj.weight", "ffn_gate.weight", 0, KV_GGUF_XF_NONE},
	{"mlp.up_proj.weight", "ffn_up.weight", 0, KV_GGUF_XF_NONE},
	{"mlp.down_proj.weight", "ffn_down.weight", 0, KV_GGUF_XF_NONE},
	{"linear_attn.in_proj_qkv.weight", "attn_qkv.weight", 1, KV_GGUF_XF_VROWS},
	{"linear_attn.in_proj_z.weight", "attn_gate.weight", 1, KV_GGUF_XF_VROWS},
	{"linear_attn.in_proj_b.weight", "ssm_beta.weight", 1, KV_GGUF_XF_VROWS},
	{"linear_attn.in_proj_a.weight", "ssm_alpha.weight", 1, KV_GGUF_XF_VROWS},
	{"linear_attn.conv1d.weight", "ssm_conv1d.weight", 1, KV_GGUF_XF_VROWS},
	{"linear_attn.dt_bias", "ssm_dt.bias", 1, KV_GGUF_XF_VROWS},
	{"linear_attn.A_log", "ssm_a", 1, KV_GGUF_XF_NEGEXP},
	{"linear_attn.norm.weight", "ssm_norm.weight", 1, KV_GGUF_XF_NONE},
	{"linear_attn.out_proj.weight", "ssm_out.weight", 1, KV_GGUF_XF_VCOLS},
};
#define N_LAYER_MAP (sizeof g_layer / sizeof g_layer[0])

/* llama (L), gemma3 (G), gpt-oss (O) and gemma4 (4): llama.cpp's names
 * per family (gemma4's norms are stored as they are, not 1 + w). */
struct win_map {
	const char *hf, *gg;
	const char *archs;   /* the families it applies to */
	int xf;
};

static const struct win_map g_win[] = {
	{"input_layernorm.weight", "attn_norm.weight", "LGO4", KV_GGUF_XF_NORM1},
	{"post_attention_layernorm.weight", "ffn_norm.weight", "L", KV_GGUF_XF_NONE},
	{"post_attention_layernorm.weight", "post_attention_norm.weight", "GO4", KV_GGUF_XF_NORM1},
	{"pre_feedforward_layernorm.weight", "ffn_norm.weight", "G4", KV_GGUF_XF_NORM1},
	{"post_feedforward_layernorm.weight", "post_ffw_norm.weight", "G4", KV_GGUF_XF_NORM1},
	{"self_attn.q_proj.weight", "attn_q.weight", "LGO4", KV_GGUF_XF_PERMQK},
	{"self_attn.k_proj.weight", "attn_k.weight", "LGO4", KV_GGUF_XF_PERMQK},
	{"self_attn.v_proj.weight", "attn_v.weight", "LGO4", KV_GGUF_XF_NONE},
	{"self_attn.o_proj.weight", "attn_output.weight", "LGO4", KV_GGUF_XF_NONE},
	{"self_attn.q_proj.bias", "attn_q.bias", "O", KV_GGUF_XF_NONE},
	{"self_attn.k_proj.bias", "attn_k.bias", "O", KV_GGUF_XF_NONE},
	{"self_attn.v_proj.bias", "attn_v.bias", "O", KV_GGUF_XF_NONE},
	{"self_attn.o_proj.bias", "attn_output.bias", "O", KV_GGUF_XF_NONE},
	{"self_attn.sinks", "attn_sinks.weight", "O", KV_GGUF_XF_NONE},
	{"self_attn.q_norm.weight", "attn_q_norm.weight", "G4", KV_GGUF_XF_NORM1},
	{"self_attn.k_norm.weight", "attn_k_norm.weight", "G4", KV_GGUF_XF_NORM1},
	{"mlp.gate_proj.weight", "ffn_gate.weight", "LG4", KV_GGUF_XF_NONE},
	{"mlp.up_proj.weight", "ffn_up.weight", "LG4", KV_GGUF_XF_NONE},
	{"mlp.down_proj.weight", "ffn_down.weight", "LG4", KV_GGUF_XF_NONE},
	{"layer_scalar", "layer_output_scale.weight", "4", KV_GGUF_XF_NONE},
	/* gemma4 E2B / E4B: the per-layer embedding block */
	{"per_layer_input_gate.weight", "inp_gate.weight", "4", KV_GGUF_XF_NONE},
	{"per_layer_projection.weight", "proj.weight", "4", KV_GGUF_XF_NONE},
	{"post_per_layer_input_norm.weight", "post_norm.weight", "4", KV_GGUF_XF_NONE},
	/* gemma4's MoE (26B-A4B): experts beside the dense MLP */
	{"pre_feedforward_layernorm_2.weight", "pre_ffw_norm_2.weight", "4", KV_GGUF_XF_NONE},
	{"post_feedforward_layernorm_1.weight", "post_ffw_norm_1.weight", "4", KV_GGUF_XF_NONE},
	{"post_feedforward_layernorm_2.weight", "post_ffw_norm_2.weight", "4", KV_GGUF_XF_NONE},
	{"router.proj.weight", "ffn_gate_inp.weight", "4", KV_GGUF_XF_NONE},
	{"router.scale", "ffn_gate_inp.scale", "4", KV_GGUF_XF_NONE},
	{"router.per_expert_scale", "ffn_down_exps.scale", "4", KV_GGUF_XF_NONE},
	{"experts.gate_up_proj", "ffn_gate_up_exps.weight", "4", KV_GGUF_XF_NONE},
	{"experts.down_proj", "ffn_down_exps.weight", "4", KV_GGUF_XF_NONE},
	/* gpt-oss's MoE: the router and the expert stacks with their biases */
	{"mlp.router.weight", "ffn_gate_inp.weight", "O", KV_GGUF_XF_NONE},
	{"mlp.router.bias", "ffn_gate_inp.bias", "O", KV_GGUF_XF_NONE},
	{"mlp.switch_mlp.gate_proj.weight", "ffn_gate_exps.weight", "O", KV_GGUF_XF_NONE},
	{"mlp.switch_mlp.up_proj.weight", "ffn_up_exps.weight", "O", KV_GGUF_XF_NONE},
	{"mlp.switch_mlp.down_proj.weight", "ffn_down_exps.weight", "O", KV_GGUF_XF_NONE},
	{"mlp.switch_mlp.gate_proj.bias", "ffn_gate_exps.bias", "O", KV_GGUF_XF_NONE},
	{"mlp.switch_mlp.up_proj.bias", "ffn_up_exps.bias", "O", KV_GGUF_XF_NONE},
	{"mlp.switch_mlp.down_proj.bias", "ffn_down_exps.bias", "O", KV_GGUF_XF_NONE},
};
#define N_WIN_MAP (sizeof g_win / sizeof g_win[0])

static const struct win_map *win_find(const struct kv_model_config *c, const char *hf, const char *gg)
{
	char f = c->arch == KV_ARCH_LLAMA ? 'L' : c->arch == KV_ARCH_GEMMA3 ? 'G' : c->arch == KV_ARCH_GEMMA4 ? '4' : 'O';
	for (size_t i = 0; i < N_WIN_MAP; i++)
		if (strchr(g_win[i].archs, f) && (hf ? !strcmp(hf, g_win[i].hf) : !strcmp(gg, g_win[i].gg)))
			return &g_win[i];
	return NULL;
}

/* The Mamba-2 hybrids (llama.cpp's granitehybrid and nemotron_h). Granite
 * names its layers model.layers.N.{mamba,self_attn,...}, Nemotron-H
 * backbone.layers.N.mixer.*; both map to llama.cpp's ssm_* / attn_* /
 * ffn_* names. Where two HF names share a GGUF name the first row is the
 * one a GGUF loads as (the engine's names for a GGUF: switch_mlp stacks,
 * the shared expert's split gate / up, the dense MLP as mlp.*); the
 * converter writes the stacked and fused HF tensors itself
 * (gguf_convert.c). arch 1 granite, 2 nemotron_h. */
static const struct ssm_map {
	const char *hf, *gg;
	int arch, xf;
} g_ssm[] = {
	{"input_layernorm.weight", "attn_norm.weight", 1, KV_GGUF_XF_NONE},
	{"post_attention_layernorm.weight", "ffn_norm.weight", 1, KV_GGUF_XF_NONE},
	{"norm.weight", "attn_norm.weight", 2, KV_GGUF_XF_NONE},
	{"mamba.in_proj.weight", "ssm_in.weight", 1, KV_GGUF_XF_NONE},
	{"mamba.conv1d.weight", "ssm_conv1d.weight", 1, KV_GGUF_XF_F32},
	{"mamba.conv1d.bias", "ssm_conv1d.bias", 1, KV_GGUF_XF_F32},
	{"mamba.dt_bias", "ssm_dt.bias", 1, KV_GGUF_XF_F32},
	{"mamba.A_log", "ssm_a", 1, KV_GGUF_XF_NEGEXP},
	{"mamba.D", "ssm_d", 1, KV_GGUF_XF_F32},
	{"mamba.norm.weight", "ssm_norm.weight", 1, KV_GGUF_XF_NONE},
	{"mamba.out_proj.weight", "ssm_out.weight", 1, KV_GGUF_XF_NONE},
	{"mixer.in_proj.weight", "ssm_in.weight", 2, KV_GGUF_XF_NONE},
	{"mixer.conv1d.weight", "ssm_conv1d.weight", 2, KV_GGUF_XF_F32},
	{"mixer.conv1d.bias", "ssm_conv1d.bias", 2, KV_GGUF_XF_F32},
	{"mixer.dt_bias", "ssm_dt.bias", 2, KV_GGUF_XF_F32},
	{"mixer.A_log", "ssm_a", 2, KV_GGUF_XF_NEGEXP},
	{"mixer.D", "ssm_d", 2, KV_GGUF_XF_F32},
	{"mixer.norm.weight", "ssm_norm.weight", 2, KV_GGUF_XF_NONE},
	{"mixer.out_proj.weight", "ssm_out.weight", 2, KV_GGUF_XF_NONE},
	{"self_attn.q_proj.weight", "attn_q.weight", 1, KV_GGUF_XF_NONE},
	{"self_attn.k_proj.weight", "attn_k.weight", 1, KV_GGUF_XF_NONE},
	{"self_attn.v_proj.weight", "attn_v.weight", 1, KV_GGUF_XF_NONE},
	{"self_attn.o_proj.weight", "attn_output.weight", 1, KV_GGUF_XF_NONE},
	{"mixer.q_proj.weight", "attn_q.weight", 2, KV_GGUF_XF_NONE},
	{"mixer.k_proj.weight", "attn_k.weight", 2, KV_GGUF_XF_NONE},
	{"mixer.v_proj.weight", "attn_v.weight", 2, KV_GGUF_XF_NONE},
	{"mixer.o_proj.weight", "attn_output.weight", 2, KV_GGUF_XF_NONE},
	{"mixer.up_proj.weight", "ffn_up.weight", 2, KV_GGUF_XF_NONE},
	{"mixer.down_proj.weight", "ffn_down.weight", 2, KV_GGUF_XF_NONE},
	{"block_sparse_moe.router.layer.weight", "ffn_gate_inp.weight", 1, KV_GGUF_XF_F32},
	{"block_sparse_moe.switch_mlp.gate_proj.weight", "ffn_gate_exps.weight", 1, KV_GGUF_XF_NONE},
	{"block_sparse_moe.switch_mlp.up_proj.weight", "ffn_up_exps.weight", 1, KV_GGUF_XF_NONE},
	{"block_sparse_moe.switch_mlp.down_proj.weight", "ffn_down_exps.weight", 1, KV_GGUF_XF_NONE},
	{"block_sparse_moe.output_linear.weight", "ffn_down_exps.weight", 1, KV_GGUF_XF_NONE},
	{"shared_mlp.gate_proj.weight", "ffn_gate_shexp.weight", 1, KV_GGUF_XF_NONE},
	{"shared_mlp.up_proj.weight", "ffn_up_shexp.weight", 1, KV_GGUF_XF_NONE},
	{"shared_mlp.output_linear.weight", "ffn_down_shexp.weight", 1, KV_GGUF_XF_NONE},
	{"mlp.gate_proj.weight", "ffn_gate.weight", 1, KV_GGUF_XF_NONE},
	{"mlp.up_proj.weight", "ffn_up.weight", 1, KV_GGUF_XF_NONE},
	{"mlp.down_proj.weight", "ffn_down.weight", 1, KV_GGUF_XF_NONE},
};
#define N_SSM_MAP (sizeof g_ssm / sizeof g_ssm[0])

static int ssm_arch(const struct kv_model_config *c)
{
	return c->arch == KV_ARCH_NEMOTRON_H ? 2 : 1;
}

const char *kv_gguf_ssm_top_hf(const struct kv_model_config *c, const char *gg)
{
	int nem = ssm_arch(c) == 2;
	if (!strcmp(gg, "token_embd.weight"))
		return nem ? "backbone.embeddings.weight" : "model.embed_tokens.weight";
	if (!strcmp(gg, "output_norm.weight"))
		return nem ? "backbone.norm_f.weight" : "model.norm.weight";
	if (!strcmp(gg, "output.weight"))
		return "lm_head.weight";
	return NULL;
}

/* hf: "<prefix>layers.N.<suffix>" or a top-level name, any prefix */
static int ssm_name_from_hf(const struct kv_model_config *c, const char *hf, char *buf, size_t cap)
{
	const char *r = hf, *l;
	int layer;
	if (!strcmp(hf, "lm_head.weight"))
		return snprintf(buf, cap, "output.weight"), 1;
	if (!strncmp(r, "model.", 6))
		r += 6;
	else if (!strncmp(r, "backbone.", 9))
		r += 9;
	if (!strcmp(r, "embed_tokens.weight") || !strcmp(r, "embeddings.weight"))
		return snprintf(buf, cap, "token_embd.weight"), 1;
	if (!strcmp(r, "norm.weight") || !strcmp(r, "norm_f.weight"))
		return snprintf(buf, cap, "output_norm.weight"), 1;
	if (sscanf(r, "layers.%d.", &layer) != 1 || !(l = strchr(r + 7, '.')))
		return 0;
	l++;
	for (size_t i = 0; i < N_SSM_MAP; i++)
		if (g_ssm[i].arch == ssm_arch(c) && !strcmp(l, g_ssm[i].hf))
			return snprintf(buf, cap, "blk.%d.%s", layer, g_ssm[i].gg), 1;
	return 0;
}

/* gemma4's per-layer embedding tensors outside the layers: HF, GGUF. */
const char *const kv_gguf_g4_top[3][2] = {
	{"model.embed_tokens_per_layer.weight", "per_layer_token_embd.weight"},
	{"model.per_layer_model_projection.weight", "per_layer_model_proj.weight"},
	{"model.per_layer_projection_norm.weight", "per_layer_proj_norm.weight"},
};

const char *kv_gguf_arch(const struct kv_model_config *c)
{
	if (c->arch == KV_ARCH_LLAMA)
		return "llama";
	if (c->arch == KV_ARCH_GEMMA3)
		return "gemma3";
	if (c->arch == KV_ARCH_GEMMA4)
		return "gemma4";
	if (c->arch == KV_ARCH_GPT_OSS)
		return "gpt-oss";
	if (c->ssm)
		return c->arch == KV_ARCH_NEMOTRON_H ? "nemotron_h" : "granitehybrid";
	if (c->arch == KV_ARCH_QWEN3_NEXT)
		return "qwen3next";
	if (c->hybrid)
		return c->n_moe_layers ? "qwen35moe" : "qwen35";
	return "qwen3";
}

/* The MoE tensors of a layer (llama.cpp's qwen35moe / qwen3next names).
 * The routed experts are stacks [E][rows][cols]: ffn_gate_exps and
 * ffn_up_exps [E][I][D], ffn_down_exps [E][D][I] (or llama.cpp's fused
 * ffn_gate_up_exps [E][2I][D], read only). They load under mlx-lm's
 * SwitchGLU names (or the HF stacked names for the fused one), which the
 * engine views per expert (engine/moe.c). ffn_gate_inp_shexp is 1-D [D]
 * where HF's shared_expert_gate is [1, D]. */
static const struct {
	const char *hf, *gg;
} g_moe[] = {
	{"mlp.gate.weight", "ffn_gate_inp.weight"},
	{"mlp.switch_mlp.gate_proj.weight", "ffn_gate_exps.weight"},
	{"mlp.switch_mlp.up_proj.weight", "ffn_up_exps.weight"},
	{"mlp.switch_mlp.down_proj.weight", "ffn_down_exps.weight"},
	{"mlp.experts.gate_up_proj", "ffn_gate_up_exps.weight"},
	{"mlp.experts.down_proj", "ffn_down_exps.weight"},
	{"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
	{"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
	{"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
	{"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
	/* qwen3next's fused DeltaNet projections: llama.cpp's converter splits
	 * in_proj_qkvz into attn_qkv + attn_gate; old files have ssm_in */
	{"linear_attn.in_proj_qkvz.weight", "ssm_in.weight"},
	{"linear_attn.in_proj_ba.weight", "ssm_ba.weight"},
};
#define N_MOE_MAP (sizeof g_moe / sizeof g_moe[0])

/* The MTP head's own tensors (Hugging Face `mtp.*`, llama.cpp's
 * blk.<n_layers>.nextn.*). */
static const struct {
	const char *hf, *gg;
	int xf;
} g_nextn[] = {
	{"mtp.fc.weight", "nextn.eh_proj.weight", KV_GGUF_XF_NONE},
	{"mtp.pre_fc_norm_embedding.weight", "nextn.enorm.weight", KV_GGUF_XF_NORM1},
	{"mtp.pre_fc_norm_hidden.weight", "nextn.hnorm.weight", KV_GGUF_XF_NORM1},
	{"mtp.norm.weight", "nextn.shared_head_norm.weight", KV_GGUF_XF_NORM1},
};
#define N_NEXTN_MAP (sizeof g_nextn / sizeof g_nextn[0])

const char *kv_gguf_nextn_gg(const char *hf, int *xf)
{
	for (size_t m = 0; m < N_NEXTN_MAP; m++)
		if (!strcmp(hf, g_nextn[m].hf)) {
			if (xf)
				*xf = g_nextn[m].xf;
			return g_nextn[m].gg;
		}
	return NULL;
}

const char *kv_gguf_nextn_hf(const char *gg)
{
	for (size_t m = 0; m < N_NEXTN_MAP; m++)
		if (!strcmp(gg, g_nextn[m].gg))
			return g_nextn[m].hf;
	return NULL;
}

static int applies(const struct name_map *m, const struct kv_model_config *c)
{
	return m->hybrid_only == 0 || (m->hybrid_only == 1) == (c->hybrid != 0);
}

int kv_gguf_name_from_hf(const struct kv_model_config *c, const char *hf, char *buf, size_t cap)
{
	const char *p = "model.";
	int layer;
	if (c->ssm)
		return ssm_name_from_hf(c, hf, buf, cap);
	if (!strcmp(hf, "model.embed_tokens.weight"))
		return snprintf(buf, cap, "token_embd.weight"), 1;
	if (!strcmp(hf, "model.norm.weight"))
		return snprintf(buf, cap, "output_norm.weight"), 1;
	if (!strcmp(hf, "lm_head.weight"))
		return snprintf(buf, cap, "output.weight"), 1;
	for (int i = 0; c->arch == KV_ARCH_GEMMA4 && i < 3; i++)
		if (!strcmp(hf, kv_gguf_g4_top[i][0]))
			return snprintf(buf, cap, "%s", kv_gguf_g4_top[i][1]), 1;
	if (strncmp(hf, p, strlen(p)) || sscanf(hf + strlen(p), "layers.%d.", &layer) != 1)
		return 0;
	const char *rest = strchr(hf + strlen(p) + 7, '.');
	if (!rest)
		return 0;
	rest++;
	if (kv_arch_window_family(c->arch)) {
		const struct win_map *w = win_find(c, rest, NULL);
		return w ? (snprintf(buf, cap, "blk.%d.%s", layer, w->gg), 1) : 0;
	}
	for (size_t i = 0; i < N_LAYER_MAP; i++)
		if (applies(&g_layer[i], c) && !strcmp(rest, g_layer[i].hf))
			return snprintf(buf, cap, "blk.%d.%s", layer, g_layer[i].gg), 1;
	for (size_t i = 0; i < N_MOE_MAP; i++)
		if (!strcmp(rest, g_moe[i].hf))
			return snprintf(buf, cap, "blk.%d.%s", layer, g_moe[i].gg), 1;
	return 0;
}

const char *kv_gguf_layer_hf(const struct kv_model_config *c, const char *gg, int *xf)
{
	if (kv_arch_window_family(c->arch)) {
		const struct win_map *w = win_find(c, NULL, gg);
		if (w && xf)
			*xf = w->xf;
		return w ? w->hf : NULL;
	}
	if (c->ssm) {
		for (size_t m = 0; m < N_SSM_MAP; m++)
			if (g_ssm[m].arch == ssm_arch(c) && !strcmp(gg, g_ssm[m].gg)) {
				if (xf)
					*xf = g_ssm[m].xf;
				return g_ssm[m].hf;
			}
		return NULL;
	}
	for (size_t m = 0; m < N_LAYER_MAP; m++)
		if (applies(&g_layer[m], c) && !strcmp(gg, g_layer[m].gg)) {
			if (xf)
				*xf = g_layer[m].xf;
			return g_layer[m].hf;
		}
	return NULL;
}

const char *kv_gguf_moe_hf(const char *gg)
{
	for (size_t m = 0; m < N_MOE_MAP; m++)
		if (!strcmp(gg, g_moe[m].gg))
			return g_moe[m].hf;
	return NULL;
}

/* --- value-head order -------------------------------------------------------- */

/* HF head of tiled position h (toward GGUF) or tiled position of HF head
 * h (from GGUF). Hk | Hv is checked by the config. */
static int vhead_src(const struct kv_model_config *c, int h, int to_gguf)
{
	int Hk = c->lin_k_heads, per = c->lin_v_heads / c->lin_k_heads;
	if (to_gguf)
		return (h % Hk) * per + h / Hk;
	return (h % per) * Hk + h / per;
}

/* llama.cpp's qwen35 / qwen35moe converter tiles the value heads; its
 * qwen3next converter keeps Hugging Face's grouped order. */
int kv_gguf_vperm(const struct kv_model_config *c)
{
	return c->hybrid && c->arch != KV_ARCH_QWEN3_NEXT && c->lin_k_heads != c->lin_v_heads;
}

/* Where the value heads sit in a tensor's rows: first row and rows per head. */
void kv_gguf_vrows(const struct kv_model_config *c, const char *gg, int64_t *voff, int64_t *vrow)
{
	int64_t kd = 2ll * c->lin_k_heads * c->lin_k_dim;
	if (!strncmp(gg, "blk.", 4) && strchr(gg + 4, '.'))
		gg = strchr(gg + 4, '.') + 1;
	*voff = 0;
	*vrow = c->lin_v_dim;
	if (strstr(gg, "attn_qkv") || strstr(gg, "ssm_conv1d"))
		*voff = kd;
	else if (strstr(gg, "ssm_beta") || strstr(gg, "ssm_alpha") || strstr(gg, "ssm_dt") || !strcmp(gg, "ssm_a"))
		*vrow = 1;
}

/* Permute value-head rows of a row-major byte matrix in place via tmp. */
void kv_gguf_perm_rows(const struct kv_model_config *c, uint8_t *p, size_t row_bytes, int64_t voff, int64_t vrow,
		       int to_gguf, uint8_t *tmp)
{
	size_t blk = (size_t)vrow * row_bytes;
	uint8_t *v = p + (size_t)voff * row_bytes;
	memcpy(tmp, v, blk * (size_t)c->lin_v_heads);
	for (int h = 0; h < c->lin_v_heads; h++)
		memcpy(v + (size_t)h * blk, tmp + (size_t)vhead_src(c, h, to_gguf) * blk, blk);
}

/* Permute value-head column blocks of each row (block = dv elements of
 * elem_bytes, or whole quant blocks: bytes per head). */
void kv_gguf_perm_cols(const struct kv_model_config *c, uint8_t *p, int64_t rows, size_t row_bytes,
		       size_t head_bytes, int to_gguf, uint8_t *tmp)
{
	for (int64_t r = 0; r < rows; r++) {
		uint8_t *row = p + (size_t)r * row_bytes;
		memcpy(tmp, row, row_bytes);
		for (int h = 0; h < c->lin_v_heads; h++)
			memcpy(row + (size_t)h * head_bytes, tmp + (size_t)vhead_src(c, h, to_gguf) * head_bytes,
			       head_bytes);
	}
}

/* --- the pre-tokenizer ------------------------------------------------------- */

const char *kv_gguf_pre_regex(const char *pre)
{
	if (pre && !strcmp(pre, "qwen2"))
		return g_re_qwen2;
	if (pre && !strcmp(pre, "qwen35"))
		return g_re_qwen35;
	if (pre && !strcmp(pre, "llama-bpe"))
		return g_re_llama3;
	if (pre && !strcmp(pre, "gpt-4o"))
		return g_re_gpt4o;
	return NULL;
}

const char *kv_gguf_pre_name(const char *re)
{
	if (re && !strcmp(re, g_re_qwen2))
		return "qwen2";
	if (re && !strcmp(re, g_re_qwen35))
		return "qwen35";
	if (re && !strcmp(re, g_re_llama3))
		return "llama-bpe";
	if (re && !strcmp(re, g_re_gpt4o))
		return "gpt-4o";
	return NULL;
}
