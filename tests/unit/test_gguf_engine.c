/*
 * test_gguf_engine.c - GGUF models in the engine: `kvkeep convert` of the
 * tiny presets loads with ke_model_load and gives
 *   F32 GGUF: logits memcmp-equal to the Hugging Face folder it came from;
 *   Q8_0 / Q4_K_M: logits equal (memcmp, or 1e-4 where llama.cpp's tiled
 *     out_proj changes the summation order) to the f32 engine run on a
 *     folder holding the exactly dequantized weights;
 *   quantized products: same logits for whole vs chunked prefill and on
 *     every ISA path (bit for bit).
 * The MoE presets too: tiny-moe (qwen35moe) and tiny-next-moe (qwen3next)
 * F32 files equal their folders; tiny-moe's quantized expert stacks, viewed
 * per expert in the mapping, equal the dequantized f32 stacks; a file with
 * an expert tensor missing or misshapen fails naming the GGUF tensor.
 */
#include "kt.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/io.h"
#include "base/mem.h"
#include "engine/isa.h"
#include "engine/qpanel.h"
#include "engine/matmul.h"
#include "engine/gemm.h"
#include "base/clock.h"
#include "engine/model.h"
#include "engine/qgemm.h"
#include "engine/seq.h"
#include "model/config.h"
#include "model/gguf_convert.h"
#include "model/gguf_model.h"
#include "model/open.h"
#include "model/quant.h"
#include "model/safetensors.h"
#include "model/weights.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NTOK 37

/* f32 activations: the exact numerics these tests compare bit for bit */
static struct ke_model *load_qa(const char *path, int qa)
{
	struct ke_model_params p = {.kv = KE_KV_F32, .quant_act = qa};
	struct ke_model *m = NULL;
	if (ke_model_load(path, &p, &m))
		kt_fail(__FILE__, __LINE__, "load %s: %s", path, kv_errmsg());
	return m;
}

static struct ke_model *load(const char *path)
{
	return load_qa(path, KE_QACT_F32);
}

/* Logits of every position; chunk sets the prefill chunk. */
static float *logits(struct ke_model *m, const int32_t *tok, int n, int chunk)
{
	int V = ke_model_config(m)->vocab;
	float *all = calloc((size_t)n * V, sizeof *all);
	struct ke_seq *s = NULL;
	struct ke_seq_params sp = {.chunk = chunk};
	struct ke_prefill_opts o = {.logits_all = all};
	if (ke_seq_create(m, &sp, &s) || ke_seq_prefill(s, tok, n, &o, NULL))
		kt_fail(__FILE__, __LINE__, "prefill: %s", kv_errmsg());
	ke_seq_destroy(s);
	return all;
}

static void tokens(int32_t *t, int n, int vocab)
{
	uint64_t seed = 7;
	for (int i = 0; i < n; i++)
		t[i] = (int32_t)(kt_rand(&seed) % (uint64_t)vocab);
}

static double max_rel(const float *a, const float *b, size_t n)
{
	double m = 0, scale = 0;
	for (size_t i = 0; i < n; i++)
		scale = fmax(scale, fabs((double)b[i]));
	for (size_t i = 0; i < n; i++)
		m = fmax(m, fabs((double)a[i] - (double)b[i]) / (scale > 0 ? scale : 1));
	return m;
}

static int make(const char *d, const char *preset, char *hf, size_t cap)
{
	snprintf(hf, cap, "%s/%s", d, preset);
	return kt_sh("'%s' mkmodel --preset %s --dtype f32 --out '%s' --no-sync >/dev/null", kt_bin(), preset, hf);
}

KT_CASE(f32_gguf_equals_hf)
{
	const char *d = kt_tmpdir();
	const char *presets[] = {"tiny-dense", "tiny-hybrid", "tiny-moe", "tiny-next-moe"};
	for (int i = 0; i < 4; i++) {
		char hf[1024], gg[1024];
		KT_REQUIRE(make(d, presets[i], hf, sizeof hf) == 0);
		snprintf(gg, sizeof gg, "%s/%s-f32.gguf", d, presets[i]);
		struct kv_gguf_convert_params p = {hf, gg, KQ_FTYPE_F32, KV_DW_NO_SYNC};
		KT_OK(kv_gguf_convert(&p, NULL, NULL));
		struct ke_model *a = load(hf), *b = load(gg);
		KT_REQUIRE(a && b);
		int V = ke_model_config(a)->vocab;
		KT_EQ_INT(ke_model_config(b)->vocab, V);
		int32_t tok[NTOK];
		tokens(tok, NTOK, V);
		float *la = logits(a, tok, NTOK, 512), *lb = logits(b, tok, NTOK, 512);
		KT_CHECKF(!memcmp(la, lb, (size_t)NTOK * V * 4), "%s: F32 GGUF logits differ from HF (max rel %.3g)",
			  presets[i], max_rel(lb, la, (size_t)NTOK * V));
		free(la);
		free(lb);
		ke_model_destroy(a);
		ke_model_destroy(b);
	}
}

/* An HF folder with the GGUF's matrices dequantized (out_proj's columns
 * put back in HF order) and the original small tensors. */
static int dequant_folder(const char *hf, const char *gg, const char *out)
{
	struct kv_weights *wq = NULL, *wh = NULL;
	struct kv_model_config c;
	struct kv_stw *w = kv_stw_create();
	float **bufs = NULL;
	size_t n = 0;
	int rc, nested = 0;
	if (kt_sh("mkdir -p '%s' && cp '%s'/config.json '%s'/tokenizer.json '%s'/tokenizer_config.json '%s'/", out, hf,
		  hf, hf, out))
		return -1;
	if ((rc = kv_config_load(gg, &c)) || (rc = kv_weights_open(gg, &wq)) || (rc = kv_weights_open(hf, &wh)))
		goto out;
	n = kv_weights_count(wh);
	bufs = calloc(n, sizeof *bufs);
	for (size_t i = 0; i < n && !rc; i++) {
		const struct kv_tensor *th = kv_weights_at(wh, i);
		char nm[256];
		const char *lm = "model.language_model.";
		if (!strncmp(th->name, lm, strlen(lm)))
			nested = 1, snprintf(nm, sizeof nm, "model.%s", th->name + strlen(lm));
		else
			snprintf(nm, sizeof nm, "%s", th->name);
		const struct kv_tensor *tq = kv_weights_find(wq, nm);
		if (!tq && strstr(nm, ".mlp.experts."))
			continue; /* HF's expert stacks: the GGUF's switch_mlp stacks are added below */
		if (!tq) {
			rc = kv_fail(KV_ERR_NOT_FOUND, "%s missing in the GGUF", th->name);
			break;
		}
		bufs[i] = malloc(th->numel * 4);
		int mat = th->ndim >= 2 && kv_dtype_is_quant(tq->dtype);
		const struct kv_tensor *src = mat || tq->dtype != KV_DT_F32 ? tq : th;
		if (!mat && tq->dtype == KV_DT_F32)
			src = th; /* norms, A: the original values (what the GGUF holds, +1 / -exp aside) */
		if ((rc = kv_tensor_to_f32(src, bufs[i], 0, th->numel)))
			break;
		if (src == tq && th->ndim == 2 && c.vrows_tiled &&
		    (strstr(th->name, "in_proj_qkv") || strstr(th->name, "in_proj_z") || strstr(th->name, "in_proj_b") ||
		     strstr(th->name, "in_proj_a"))) {
			/* rows stay tiled in the GGUF view: put HF's order back */
			int Hk = c.lin_k_heads, Hv = c.lin_v_heads, r = Hv / Hk;
			int64_t cols = th->shape[1], w = strstr(th->name, "in_proj_b") || strstr(th->name, "in_proj_a") ? 1 : c.lin_v_dim;
			int64_t off = strstr(th->name, "in_proj_qkv") ? 2ll * Hk * c.lin_k_dim : 0;
			float *tmp = malloc((size_t)(Hv * w * cols) * 4), *v = bufs[i] + off * cols;
			memcpy(tmp, v, (size_t)(Hv * w * cols) * 4);
			for (int g = 0; g < Hv; g++)
				memcpy(v + (size_t)(g * w * cols), tmp + (size_t)(((g % r) * Hk + g / r) * w * cols),
				       (size_t)(w * cols) * 4);
			free(tmp);
		}
		if (mat && c.out_proj_tiled && strstr(th->name, "out_proj")) {
			int Hk = c.lin_k_heads, Hv = c.lin_v_heads, dv = c.lin_v_dim, r = Hv / Hk;
			int64_t cols = th->shape[1];
			float *tmp = malloc((size_t)cols * 4);
			for (int64_t row = 0; row < th->shape[0]; row++) {
				float *x = bufs[i] + row * cols;
				memcpy(tmp, x, (size_t)cols * 4);
				for (int g = 0; g < Hv; g++) /* HF head g sits at tiled (g % r) Hk + g / r */
					memcpy(x + (size_t)g * dv, tmp + (size_t)((g % r) * Hk + g / r) * dv, (size_t)dv * 4);
			}
			free(tmp);
		}
		rc = kv_stw_add(w, th->name, KV_DT_F32, th->ndim, th->shape, bufs[i], th->numel * 4);
	}
	/* the GGUF's routed-expert stacks (ffn_*_exps as mlp.switch_mlp.*),
	 * dequantized under their names: the engine reads that layout too */
	size_t nq = rc ? 0 : kv_weights_count(wq);
	float **qb = calloc(nq + 1, sizeof *qb);
	for (size_t i = 0; i < nq && !rc; i++) {
		const struct kv_tensor *tq = kv_weights_at(wq, i);
		if (!strstr(tq->name, ".mlp.switch_mlp."))
			continue;
		char nm[256];
		/* under the folder's prefix (nested qwen3_5 configs: model.language_model.) */
		snprintf(nm, sizeof nm, "%s%s", nested ? "model.language_model." : "model.",
			 tq->name + strlen("model."));
		qb[i] = malloc(tq->numel * 4);
		if (!(rc = kv_tensor_to_f32(tq, qb[i], 0, tq->numel)))
			rc = kv_stw_add(w, nm, KV_DT_F32, tq->ndim, tq->shape, qb[i], tq->numel * 4);
	}
	if (!rc) {
		char path[1100];
		rc = kv_path_fmt(path, sizeof path, "%s/model.safetensors", out);
		if (!rc)
			rc = kv_stw_write(w, path, KV_DW_NO_SYNC);
	}
	for (size_t i = 0; i < nq; i++)
		free(qb[i]);
	free(qb);
out:
	for (size_t i = 0; bufs && i < n; i++)
		free(bufs[i]);
	free(bufs);
	kv_stw_destroy(w);
	kv_weights_close(wq);
	kv_weights_close(wh);
	return rc;
}

KT_CASE(quantized_equals_dequantized_f32)
{
	const char *d = kt_tmpdir();
	const char *presets[] = {"tiny-dense", "tiny-hybrid", "tiny-moe"};
	const int types[] = {KQ_FTYPE_Q8_0, KQ_FTYPE_Q4_K_M, KQ_FTYPE_BF16};
	for (int i = 0; i < 3; i++) {
		char hf[1024];
		KT_REQUIRE(make(d, presets[i], hf, sizeof hf) == 0);
		for (int k = 0; k < 3; k++) {
			char gg[1100], dq[1100];
			snprintf(gg, sizeof gg, "%s/%s-%s.gguf", d, presets[i], kq_ftype_name(types[k]));
			snprintf(dq, sizeof dq, "%s/%s-%s-dq", d, presets[i], kq_ftype_name(types[k]));
			struct kv_gguf_convert_params p = {hf, gg, types[k], KV_DW_NO_SYNC};
			KT_OK(kv_gguf_convert(&p, NULL, NULL));
			KT_OK(dequant_folder(hf, gg, dq));
			struct ke_model *a = load(dq), *b = load(gg);
			KT_REQUIRE(a && b);
			const struct kv_model_config *c = ke_model_config(b);
			int V = c->vocab;
			int32_t tok[NTOK];
			tokens(tok, NTOK, V);
			float *la = logits(a, tok, NTOK, 512), *lb = logits(b, tok, NTOK, 512);
			double e = max_rel(lb, la, (size_t)NTOK * V);
			if (c->out_proj_tiled)
				KT_CHECKF(e <= 1e-4, "%s %s: max rel %.3g", presets[i], kq_ftype_name(types[k]), e);
			else
				KT_CHECKF(!memcmp(la, lb, (size_t)NTOK * V * 4), "%s %s: not bit-identical (max rel %.3g)",
					  presets[i], kq_ftype_name(types[k]), e);
			fprintf(stderr, "  %s %s: max rel vs dequantized f32 %.3g%s\n", presets[i], kq_ftype_name(types[k]),
				e, c->out_proj_tiled ? " (tiled out_proj)" : "");
			/* batch invariance and ISA paths on the quantized model */
			float *lc = logits(b, tok, NTOK, 5);
			KT_CHECKF(!memcmp(lb, lc, (size_t)NTOK * V * 4), "%s %s: chunked prefill differs", presets[i],
				  kq_ftype_name(types[k]));
			free(lc);
			int saved = ke_isa();
			for (int isa = KE_ISA_SCALAR; isa <= ke_isa_best(); isa++) {
				ke_isa_set(isa);
				float *li = logits(b, tok, NTOK, 7);
				KT_CHECKF(!memcmp(lb, li, (size_t)NTOK * V * 4), "%s %s: ISA %s differs", presets[i],
					  kq_ftype_name(types[k]), ke_isa_name(isa));
				free(li);
			}
			ke_isa_set(saved);
			/* the default mode (int8 activations): invariant the same way,
			 * and close to the exact logits */
			struct ke_model *q = load_qa(gg, KE_QACT_Q8);
			KT_REQUIRE(q);
			/* a Q8_0 file on a CPU whose path keeps prepacked panels has
			 * them (the ISA loop below then compares them with the rows) */
			if (types[k] == KQ_FTYPE_Q8_0 && ke_qpanel_pre_bytes(ke_isa(), KV_DT_Q8_0, 16, 32))
				KT_CHECKF(ke_model_packed_bytes(q) > 0, "%s Q8_0: no prepacked panels", presets[i]);
			if (types[k] == KQ_FTYPE_BF16)
				KT_CHECK(ke_model_packed_bytes(q) == 0);
			float *lq = logits(q, tok, NTOK, 512), *lq5 = logits(q, tok, NTOK, 5);
			KT_CHECKF(!memcmp(lq, lq5, (size_t)NTOK * V * 4), "%s %s q8: chunked prefill differs", presets[i],
				  kq_ftype_name(types[k]));
			for (int isa = KE_ISA_SCALAR; isa <= ke_isa_best(); isa++) {
				ke_isa_set(isa);
				float *li = logits(q, tok, NTOK, 7);
				KT_CHECKF(!memcmp(lq, li, (size_t)NTOK * V * 4), "%s %s q8: ISA %s differs", presets[i],
					  kq_ftype_name(types[k]), ke_isa_name(isa));
				free(li);
			}
			ke_isa_set(saved);
			double se = 0, sn = 0;
			for (size_t t = 0; t < (size_t)NTOK * V; t++) {
				se += ((double)lq[t] - lb[t]) * ((double)lq[t] - lb[t]);
				sn += (double)lb[t] * lb[t];
			}
			KT_CHECKF(sqrt(se / sn) < 0.05, "%s %s q8: rms rel error vs f32 mode %.3g", presets[i],
				  kq_ftype_name(types[k]), sqrt(se / sn));
			fprintf(stderr, "  %s %s: q8 activations vs f32 mode: rms rel %.3g\n", presets[i],
				kq_ftype_name(types[k]), sqrt(se / sn));
			free(lq);
			free(lq5);
			ke_model_destroy(q);
			free(la);
			free(lb);
			ke_model_destroy(a);
			ke_model_destroy(b);
		}
	}
}

/* Replace every occurrence of `from` by `to` (same length) in a file. */
static int patch_file(const char *path, const char *from, const char *to)
{
	FILE *f = fopen(path, "r+b");
	if (!f)
		return -1;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	char *b = malloc((size_t)n);
	fseek(f, 0, SEEK_SET);
	int hits = 0;
	if (fread(b, 1, (size_t)n, f) == (size_t)n) {
		size_t L = strlen(from);
		for (long i = 0; i + (long)L <= n; i++)
			if (!memcmp(b + i, from, L)) {
				memcpy(b + i, to, L);
				hits++;
			}
		fseek(f, 0, SEEK_SET);
		if (fwrite(b, 1, (size_t)n, f) != (size_t)n)
			hits = 0;
	}
	free(b);
	fclose(f);
	return hits ? 0 : -1;
}

/* A qwen35moe GGUF with an expert tensor renamed away, or two expert
 * stacks' names swapped (a misshapen down_exps): the load fails naming
 * the GGUF tensor. */
KT_CASE(moe_gguf_bad_expert_tensors)
{
	const char *d = kt_tmpdir();
	char hf[1024], gg[1100], bad[1100];
	KT_REQUIRE(make(d, "tiny-moe", hf, sizeof hf) == 0);
	snprintf(gg, sizeof gg, "%s/moe-q8.gguf", d);
	struct kv_gguf_convert_params p = {hf, gg, KQ_FTYPE_Q8_0, KV_DW_NO_SYNC};
	KT_OK(kv_gguf_convert(&p, NULL, NULL));
	static const struct {
		const char *from, *to, *want;
	} cases[] = {
		{"blk.2.ffn_up_exps.weight", "blk.2.ffn_up_exps.weighX", "lacks expert tensor 'blk.2.ffn_up_exps.weight'"},
		{"blk.1.ffn_gate_inp.weight", "blk.1.ffn_gate_inp.weighX", "lacks expert tensor 'blk.1.ffn_gate_inp.weight'"},
		{"blk.0.ffn_down_shexp.weight", "blk.0.ffn_down_shexp.weighX", "'blk.0.ffn_down_shexp.weight'"},
		{"blk.3.ffn_gate_exps.weight", "blk.3.ffn_gate_exps.weighY",
		 "expert tensor 'blk.3.ffn_gate_exps.weight' has shape [8, 64, 32], expected [8, 32, 64]"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		snprintf(bad, sizeof bad, "%s/moe-bad%zu.gguf", d, i);
		KT_REQUIRE(kt_sh("cp '%s' '%s'", gg, bad) == 0);
		KT_REQUIRE(patch_file(bad, cases[i].from, cases[i].to) == 0);
		if (i == 3) { /* gate_exps and down_exps swap names */
			KT_REQUIRE(patch_file(bad, "blk.3.ffn_down_exps.weight", "blk.3.ffn_gate_exps.weight") == 0);
			KT_REQUIRE(patch_file(bad, "blk.3.ffn_gate_exps.weighY", "blk.3.ffn_down_exps.weight") == 0);
		}
		struct ke_model_params mp = {.kv = KE_KV_F32};
		struct ke_model *m = NULL;
		int rc = ke_model_load(bad, &mp, &m);
		KT_CHECKF(rc == KV_ERR_INCOMPATIBLE, "case %zu: rc %d (%s)", i, rc, kv_errmsg());
		KT_CHECKF(strstr(kv_errmsg(), cases[i].want) != NULL, "case %zu: message '%s' lacks \"%s\"", i, kv_errmsg(),
			  cases[i].want);
		ke_model_destroy(m);
	}
	/* the expert stacks stay in the mapping: the only copies are the small
	 * permuted conv / dt / A tensors, far below one layer's stacks */
	{
		struct kv_weights *w = NULL;
		KT_OK(kv_weights_open(gg, &w));
		const struct kv_tensor *st = kv_weights_find(w, "model.layers.0.mlp.switch_mlp.gate_proj.weight");
		KT_REQUIRE(st);
		const uint8_t *lo = st->data;
		uint64_t owned = kv_weights_owned_bytes(w);
		KT_CHECKF(owned < st->nbytes, "%llu bytes copied, one gate stack is %llu", (unsigned long long)owned,
			  (unsigned long long)st->nbytes);
		/* the stack is the file's bytes: blk.0.ffn_gate_exps read back raw */
		struct kv_gguf *g = NULL;
		KT_OK(kv_gguf_open(gg, &g));
		const struct kv_tensor *raw = kv_gguf_tensor_find(g, "blk.0.ffn_gate_exps.weight");
		KT_REQUIRE(raw);
		KT_CHECK(raw->nbytes == st->nbytes && !memcmp(raw->data, lo, (size_t)st->nbytes));
		kv_gguf_close(g);
		kv_weights_close(w);
	}
	/* real Qwen3.5-MoE text configs have no dense intermediate_size: a file
	 * without feed_forward_length loads; without the expert size it falls
	 * back to llama.cpp's n_ff / k (16 here), which the stacks contradict */
	snprintf(bad, sizeof bad, "%s/moe-noff.gguf", d);
	KT_REQUIRE(kt_sh("cp '%s' '%s'", gg, bad) == 0);
	KT_REQUIRE(patch_file(bad, "qwen35moe.feed_forward_length", "qwen35moe.feed_forward_lengtX") == 0);
	{
		struct ke_model_params mp = {.kv = KE_KV_F32};
		struct ke_model *m = NULL;
		KT_CHECKF(ke_model_load(bad, &mp, &m) == KV_OK, "no feed_forward_length: %s", kv_errmsg());
		ke_model_destroy(m);
	}
	KT_REQUIRE(patch_file(bad, "qwen35moe.expert_feed_forward_length", "qwen35moe.expert_feed_forward_lengtX") == 0);
	KT_REQUIRE(patch_file(bad, "qwen35moe.feed_forward_lengtX", "qwen35moe.feed_forward_length") == 0);
	{
		struct ke_model_params mp = {.kv = KE_KV_F32};
		struct ke_model *m = NULL;
		int rc = ke_model_load(bad, &mp, &m);
		KT_CHECKF(rc == KV_ERR_INCOMPATIBLE && strstr(kv_errmsg(), "expected [8, 16, 64]"), "rc %d: %s", rc,
			  kv_errmsg());
		ke_model_destroy(m);
	}
}

/* What llama.cpp's qwen3next cannot hold is refused naming the field:
 * tiny-next has a dense layer and norm_topk_prob false. */
KT_CASE(moe_convert_refuses_what_llama_cannot_run)
{
	const char *d = kt_tmpdir();
	char hf[1024], gg[1100];
	KT_REQUIRE(make(d, "tiny-next", hf, sizeof hf) == 0);
	snprintf(gg, sizeof gg, "%s/next.gguf", d);
	struct kv_gguf_convert_params p = {hf, gg, KQ_FTYPE_F32, KV_DW_NO_SYNC};
	int rc = kv_gguf_convert(&p, NULL, NULL);
	KT_CHECKF(rc == KV_ERR_UNSUPPORTED && strstr(kv_errmsg(), "mlp_only_layers"), "rc %d: %s", rc, kv_errmsg());
	KT_REQUIRE(kt_sh("/usr/bin/python3 -c \"import json,sys; p=sys.argv[1]; c=json.load(open(p)); "
			 "c['mlp_only_layers']=[]; json.dump(c, open(p,'w'))\" '%s/config.json'", hf) == 0);
	rc = kv_gguf_convert(&p, NULL, NULL);
	KT_CHECKF(rc == KV_ERR_UNSUPPORTED && strstr(kv_errmsg(), "norm_topk_prob"), "rc %d: %s", rc, kv_errmsg());
}

/* Quantized products on random matrices of every block type with a
 * quantizer: the row of an output never depends on M (1..9 rows: the fused
 * small-M kernels and the panel path), on the column range or on the ISA;
 * and it equals the f32 product with the dequantized matrix. */
KT_CASE(qgemm_invariance_all_types)
{
	const int types[] = {KV_DT_Q8_0, KV_DT_Q4_K, KV_DT_Q6_K, KV_DT_Q5_K, KV_DT_Q4_0, KV_DT_Q4_1, KV_DT_Q5_0,
			     KV_DT_Q5_1, KV_DT_Q2_K, KV_DT_Q3_K, KV_DT_F16};
	const int N = 37, K = 512, M = 9;
	uint64_t seed = 5;
	float *wf = malloc((size_t)N * K * 4), *wd = malloc((size_t)N * K * 4), *x = malloc((size_t)M * K * 4);
	float *ref = malloc((size_t)M * N * 4), *y = malloc((size_t)M * N * 4);
	uint8_t *wq = malloc((size_t)N * K * 4);
	for (int i = 0; i < N * K; i++)
		wf[i] = (float)((double)(kt_rand(&seed) % 20001) / 10000.0 - 1.0) * 0.1f;
	for (int i = 0; i < M * K; i++)
		x[i] = (float)((double)(kt_rand(&seed) % 20001) / 10000.0 - 1.0);
	int saved = ke_isa();
	for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
		int dt = types[t];
		size_t rb = (size_t)kv_dtype_row_bytes(dt, (uint64_t)K);
		for (int r = 0; r < N; r++) {
			KT_OK(kq_quant_row(dt, wf + (size_t)r * K, wq + (size_t)r * rb, (size_t)K));
			KT_OK(kq_dequant_row(dt, wq + (size_t)r * rb, wd + (size_t)r * K, (size_t)K));
		}
		struct ke_mat q = {wq, dt, N, K, (size_t)K}, f = {wd, KV_DT_F32, N, K, (size_t)K};
		ke_gemm_range(KE_ISA_SCALAR, &f, x, (size_t)K, M, ref, (size_t)N, 0, 0, N);
		for (int isa = KE_ISA_SCALAR; isa <= ke_isa_best(); isa++)
			for (int m = 1; m <= M; m++) {
				memset(y, 0, (size_t)M * N * 4);
				/* rows in groups of m, columns in two ranges */
				for (int i0 = 0; i0 < M; i0 += m) {
					int mm = M - i0 < m ? M - i0 : m;
					ke_gemm_range(isa, &q, x + (size_t)i0 * K, (size_t)K, mm, y + (size_t)i0 * N, (size_t)N, 0, 0, 13);
					ke_gemm_range(isa, &q, x + (size_t)i0 * K, (size_t)K, mm, y + (size_t)i0 * N, (size_t)N, 0, 13, N);
				}
				KT_CHECKF(!memcmp(y, ref, (size_t)M * N * 4), "%s: ISA %s, M = %d differs from f32 on dequantized",
					  kv_dtype_name(dt), ke_isa_name(isa), m);
			}
		/* decode speed of this type, informative (machine is shared) */
		uint64_t t0 = kv_now_ns();
		for (int rep = 0; rep < 200; rep++)
			ke_gemm_range(ke_isa_best(), &q, x, (size_t)K, 1, y, (size_t)N, 0, 0, N);
		double ns = (double)(kv_now_ns() - t0) / 200.0;
		fprintf(stderr, "  %-5s GEMV %d x %d: %.1f ns per weight row (%.2f GB/s of weights)\n", kv_dtype_name(dt), N,
			K, ns / N, (double)rb * N / ns);
	}
	ke_isa_set(saved);
	free(wf);
	free(wd);
	free(x);
	free(ref);
	free(y);
	free(wq);
}

/* The integer path (--quant-act q8) on files made of the other block
 * types (Q5_K_M, Q3_K_M, Q2_K, Q4_1, Q5_1 of tiny-dense-k, whose rows are
 * whole 256-blocks): every Q4_1 / Q5_1 / Q2_K / Q3_K / Q5_K matrix takes
 * it (ke_mat.qdot, ke_qgemm_int), the logits are chunk- and ISA-invariant
 * bit for bit and close to the f32 mode's. */
KT_CASE(q8_path_takes_the_other_block_types)
{
	const char *d = kt_tmpdir();
	char hf[1024];
	KT_REQUIRE(make(d, "tiny-dense-k", hf, sizeof hf) == 0);
	const int types[] = {KQ_FTYPE_Q5_K_M, KQ_FTYPE_Q3_K_M, KQ_FTYPE_Q2_K, KQ_FTYPE_Q4_1, KQ_FTYPE_Q5_1};
	for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
		char gg[1100];
		snprintf(gg, sizeof gg, "%s/dk-%s.gguf", d, kq_ftype_name(types[k]));
		struct kv_gguf_convert_params p = {hf, gg, types[k], KV_DW_NO_SYNC};
		KT_OK(kv_gguf_convert(&p, NULL, NULL));
		struct ke_model *q = load_qa(gg, KE_QACT_Q8), *f = load(gg);
		KT_REQUIRE(q && f);
		int n_new = 0, n_int = 0;
		for (int i = 0; i < ke_model_n_mats(q); i++) {
			const char *nm;
			const struct ke_mat *w = ke_model_mat(q, i, &nm);
			int dt = w->dtype;
			if (dt == KV_DT_Q4_1 || dt == KV_DT_Q5_1 || dt == KV_DT_Q2_K || dt == KV_DT_Q3_K || dt == KV_DT_Q5_K) {
				n_new++;
				n_int += ke_qgemm_int(w);
				KT_CHECKF(ke_qgemm_int(w), "%s: %s (%s) is not on the integer path", kq_ftype_name(types[k]), nm,
					  kv_dtype_name(dt));
			}
			KT_CHECKF(!ke_qgemm_int(ke_model_mat(f, i, &nm)), "%s: %s on the integer path in f32 mode",
				  kq_ftype_name(types[k]), nm);
		}
		KT_CHECKF(n_new > 0 && ke_model_qdot(q), "%s: %d matrices of the new types", kq_ftype_name(types[k]),
			  n_new);
		const int V = ke_model_config(q)->vocab;
		int32_t tok[NTOK];
		tokens(tok, NTOK, V);
		float *lq = logits(q, tok, NTOK, 512), *lq5 = logits(q, tok, NTOK, 5), *lf = logits(f, tok, NTOK, 512);
		KT_CHECKF(!memcmp(lq, lq5, (size_t)NTOK * V * 4), "%s q8: chunked prefill differs", kq_ftype_name(types[k]));
		int saved = ke_isa();
		for (int isa = KE_ISA_SCALAR; isa <= ke_isa_best(); isa++) {
			ke_isa_set(isa);
			float *li = logits(q, tok, NTOK, 7);
			KT_CHECKF(!memcmp(lq, li, (size_t)NTOK * V * 4), "%s q8: ISA %s differs", kq_ftype_name(types[k]),
				  ke_isa_name(isa));
			free(li);
		}
		ke_isa_set(saved);
		double se = 0, sn = 0;
		for (size_t t = 0; t < (size_t)NTOK * V; t++) {
			se += ((double)lq[t] - lf[t]) * ((double)lq[t] - lf[t]);
			sn += (double)lf[t] * lf[t];
		}
		KT_CHECKF(se > 0 && sqrt(se / sn) < 0.05, "%s q8: rms rel error vs f32 mode %.3g", kq_ftype_name(types[k]),
			  sqrt(se / sn));
		fprintf(stderr, "  tiny-dense-k %s: %d/%d new-type matrices on the integer path, q8 vs f32 mode rms rel %.3g\n",
			kq_ftype_name(types[k]), n_int, n_new, sqrt(se / sn));
		free(lq);
		free(lq5);
		free(lf);
		ke_model_destroy(q);
		ke_model_destroy(f);
	}
}

KT_MAIN(f32_gguf_equals_hf, quantized_equals_dequantized_f32, moe_gguf_bad_expert_tensors, moe_convert_refuses_what_llama_cannot_run,
	qgemm_invariance_all_types, q8_path_takes_the_other_block_types)
