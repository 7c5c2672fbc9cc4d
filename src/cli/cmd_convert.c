/*
 * cmd_convert.c - `kvkeep convert`: a Hugging Face folder to a GGUF file
 * (or a split set of them) that llama.cpp and kvkeep both load
 * (model/gguf_model.h does the work).
 */
#include "cli/cli.h"
#include "model/gguf_convert.h"
#include "model/quant.h"
#include "base/durable.h"
#include "base/err.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_convert_mlx(int argc, char **argv); /* cmd_convert_mlx.c */

/* "50M", "2G", "1500K", "123456" -> bytes (decimal units, as llama.cpp's
 * gguf-split: M = 1000^2); 0 on a bad or non-positive size. */
static uint64_t parse_size(const char *s)
{
	char *end;
	if (!s || !isdigit((unsigned char)s[0]))
		return 0;
	unsigned long long v = strtoull(s, &end, 10);
	uint64_t mul = 1;
	if (*end == 'K' || *end == 'k')
		mul = 1000, end++;
	else if (*end == 'M' || *end == 'm')
		mul = 1000000, end++;
	else if (*end == 'G' || *end == 'g')
		mul = 1000000000, end++;
	else if (*end == 'T' || *end == 't')
		mul = 1000000000000ull, end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || v == 0 || v > UINT64_MAX / mul)
		return 0;
	return (uint64_t)v * mul;
}

static int cmd_convert(int argc, char **argv)
{
	/* --mlx-bits: an MLX quantized folder instead of a GGUF file (the
	 * flags of `kvkeep convert-mlx`, which is the same command) */
	for (int i = 1; i < argc; i++)
		if (!strncmp(argv[i], "--mlx-bits", 10))
			return cmd_convert_mlx(argc, argv);
	const char *usage = "usage: kvkeep convert --model HF_DIR --out FILE.gguf [--type TYPE] "
			    "[--split-max-size SIZE] [--split-max-tensors N]\n"
			    "       kvkeep convert --model HF_DIR --out DIR --mlx-bits 4|8 [--group-size 64] "
			    "(an MLX folder: see kvkeep convert-mlx --help)\n"
			    "TYPE: f32|f16|bf16 (plain), q8_0|q4_0|q4_1|q5_0|q5_1 (one block type),\n"
			    "      q2_k|q3_k_s|q3_k_m|q3_k_l|q4_k_s|q4_k_m|q5_k_s|q5_k_m|q6_k (llama.cpp's per-tensor mixes;\n"
			    "      tensors whose rows are not whole 256-blocks fall back to q4_0/q5_0/q5_1/q8_0 as in llama.cpp)\n"
			    "Split: FILE.gguf becomes FILE-00001-of-0000N.gguf ... (llama.cpp's gguf-split layout; load the "
			    "first file)";
	const char *model = NULL, *out = NULL, *type = "f16", *split_size = NULL;
	int64_t split_tensors = INT64_MIN; /* not given */
	int no_sync = 0;
	const struct kv_flag flags[] = {
		{"model", KV_FLAG_STR, &model, "DIR", "Hugging Face model folder (config.json, *.safetensors, tokenizer.json)"},
		{"out", KV_FLAG_STR, &out, "FILE", "output .gguf file (the name prefix of a split set)"},
		{"type", KV_FLAG_STR, &type, "TYPE",
		 "f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q2_k|q3_k_s|q3_k_m|q3_k_l|q4_k_s|q4_k_m|q5_k_s|q5_k_m|q6_k "
		 "(default f16); the K mixes pick types per tensor like llama.cpp's llama-quantize"},
		{"split-max-size", KV_FLAG_STR, &split_size, "SIZE",
		 "write a split set, at most SIZE of tensor data per file (50M, 2G; M = 10^6 bytes as gguf-split; a "
		 "bigger tensor gets a file of its own)"},
		{"split-max-tensors", KV_FLAG_INT, &split_tensors, "N", "write a split set, at most N tensors per file"},
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
		fprintf(stderr, "kvkeep convert: unknown --type '%s' (%s)\n", type, kq_ftype_list());
		return 2;
	}
	uint64_t max_bytes = 0;
	if (split_size && !(max_bytes = parse_size(split_size))) {
		fprintf(stderr, "kvkeep convert: bad --split-max-size '%s' (a positive size: 500K, 50M, 2G)\n", split_size);
		return 2;
	}
	if (split_tensors == INT64_MIN)
		split_tensors = 0;
	else if (split_tensors < 1 || split_tensors > UINT32_MAX) {
		fprintf(stderr, "kvkeep convert: bad --split-max-tensors %lld (a positive count)\n",
			(long long)split_tensors);
		return 2;
	}
	int n_files = 0;
	struct kv_gguf_convert_params p = {model, out, ft, no_sync ? KV_DW_NO_SYNC : 0, max_bytes,
					   (uint32_t)split_tensors, &n_files};
	size_t n = 0;
	uint64_t bytes = 0;
	if ((rc = kv_gguf_convert(&p, &n, &bytes))) {
		fprintf(stderr, "kvkeep convert: %s\n", kv_errmsg());
		return 1;
	}
	if (max_bytes || split_tensors) {
		size_t ol = strlen(out);
		if (ol >= 5 && !strcmp(out + ol - 5, ".gguf"))
			ol -= 5;
		printf("wrote %.*s-00001-of-%05d.gguf ... (%d files): %s, %zu tensors, %llu bytes of tensor data\n",
		       (int)ol, out, n_files, n_files, kq_ftype_name(ft), n, (unsigned long long)bytes);
	} else {
		printf("wrote %s: %s, %zu tensors, %llu bytes of tensor data\n", out, kq_ftype_name(ft), n,
		       (unsigned long long)bytes);
	}
	return 0;
}
KV_COMMAND(convert, "convert",
	   "write a GGUF file or split set (f16, bf16, q8_0, q4_k_m, q3_k_m, ...) or, with --mlx-bits, an MLX folder "
	   "from a Hugging Face folder",
	   cmd_convert);
