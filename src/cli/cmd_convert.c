/*
 * cmd_convert.c - `kvkeep convert`: a Hugging Face folder to a GGUF file
 * that llama.cpp and kvkeep both load (model/gguf_model.h does the work).
 */
#include "cli/cli.h"
#include "model/gguf_model.h"
#include "model/quant.h"
#include "base/durable.h"
#include "base/err.h"

#include <stdio.h>
#include <string.h>

int cmd_convert_mlx(int argc, char **argv); /* cmd_convert_mlx.c */

static int cmd_convert(int argc, char **argv)
{
	/* --mlx-bits: an MLX quantized folder instead of a GGUF file (the
	 * flags of `kvkeep convert-mlx`, which is the same command) */
	for (int i = 1; i < argc; i++)
		if (!strncmp(argv[i], "--mlx-bits", 10))
			return cmd_convert_mlx(argc, argv);
	const char *usage = "usage: kvkeep convert --model HF_DIR --out FILE.gguf [--type TYPE]\n"
			    "       kvkeep convert --model HF_DIR --out DIR --mlx-bits 4|8 [--group-size 64] "
			    "(an MLX folder: see kvkeep convert-mlx --help)";
	const char *model = NULL, *out = NULL, *type = "f16";
	int no_sync = 0;
	const struct kv_flag flags[] = {
		{"model", KV_FLAG_STR, &model, "DIR", "Hugging Face model folder (config.json, *.safetensors, tokenizer.json)"},
		{"out", KV_FLAG_STR, &out, "FILE", "output .gguf file"},
		{"type", KV_FLAG_STR, &type, "TYPE",
		 "f32|f16|bf16|q8_0|q4_0|q4_k_m|q5_k_m|q6_k (default f16); the K mixes pick types per tensor like llama.cpp"},
		{"no-sync", KV_FLAG_BOOL, &no_sync, NULL, "skip fdatasync (tests, throwaway output)"},
		{0},
	};
	int rc = kv_flags_parse(usage, flags, argc, argv, NULL, 0, NULL);
	if (rc)
		return rc == 1 ? 0 : 2;
	if (!model || !out) {
		fprintf(stderr, "kvkeep convert: --model and --out are required\n%s\n", usage);
		return 2;
	}
	int ft = kq_ftype_parse(type);
	if (ft < 0) {
		fprintf(stderr, "kvkeep convert: unknown --type '%s' (f32, f16, bf16, q8_0, q4_0, q4_k_m, q5_k_m, q6_k)\n",
			type);
		return 2;
	}
	struct kv_gguf_convert_params p = {model, out, ft, no_sync ? KV_DW_NO_SYNC : 0};
	size_t n = 0;
	uint64_t bytes = 0;
	if ((rc = kv_gguf_convert(&p, &n, &bytes))) {
		fprintf(stderr, "kvkeep convert: %s\n", kv_errmsg());
		return 1;
	}
	printf("wrote %s: %s, %zu tensors, %llu bytes of tensor data\n", out, kq_ftype_name(ft), n,
	       (unsigned long long)bytes);
	return 0;
}
KV_COMMAND(convert, "convert",
	   "write a GGUF file (f16, bf16, q8_0, q4_k_m, ...) or, with --mlx-bits, an MLX folder from a Hugging Face folder",
	   cmd_convert);
