/*
 * cmd_convert_mlx.c - `kvkeep convert-mlx`: write an MLX quantized folder
 * (mlx-community layout, model/mlx.h) from a Hugging Face folder.
 *
 * Exit status: 0 done, 1 the conversion failed (message on stderr), 2 bad
 * usage.
 */
#include "cli/cli.h"
#include "model/mlx_convert.h"
#include "base/durable.h"
#include "base/err.h"

#include <stdio.h>

int cmd_convert_mlx(int argc, char **argv);

int cmd_convert_mlx(int argc, char **argv)
{
	const char *model = NULL, *out = NULL, *overrides = NULL;
	int64_t bits = 4, group = 64;
	int no_sync = 0, rc;
	struct kv_flag flags[] = {
		{"model", KV_FLAG_STR, &model, "HF_DIR", "Hugging Face folder to convert (F32/BF16/F16 safetensors)"},
		{"out", KV_FLAG_STR, &out, "DIR", "output folder, created if missing"},
		{"mlx-bits", KV_FLAG_INT, &bits, "4|8", "bits per weight (default 4)"},
		{"group-size", KV_FLAG_INT, &group, "32|64|128", "weights per scale/bias group (default 64)"},
		{"mlx-overrides", KV_FLAG_STR, &overrides, "LIST",
		 "per-module formats, e.g. model.layers.0.mlp.down_proj=8:32,lm_head=float (default none)"},
		{"no-sync", KV_FLAG_BOOL, &no_sync, NULL, "skip fsync (throwaway test folders)"},
		{0},
	};
	const char *usage = "usage: kvkeep convert-mlx --model HF_DIR --out DIR [--mlx-bits 4|8] [--group-size 64] "
			    "[--mlx-overrides M=B:G,M=float]";

	rc = kv_flags_parse(usage, flags, argc, argv, NULL, 0, NULL);
	if (rc == 1)
		return 0;
	if (rc)
		return 2;
	if (!model || !out) {
		fprintf(stderr, "kvkeep convert-mlx: --model and --out are required\n%s\n", usage);
		return 2;
	}
	if (bits != 4 && bits != 8) {
		fprintf(stderr, "kvkeep convert-mlx: --mlx-bits must be 4 or 8, got %lld\n", (long long)bits);
		return 2;
	}
	if (group != 32 && group != 64 && group != 128) {
		fprintf(stderr, "kvkeep convert-mlx: --group-size must be 32, 64 or 128, got %lld\n", (long long)group);
		return 2;
	}
	struct kv_mlx_write_opts o = {
		.hf_dir = model,
		.out_dir = out,
		.bits = (int)bits,
		.group_size = (int)group,
		.dw_flags = no_sync ? KV_DW_NO_SYNC : 0,
		.overrides = overrides,
	};
	if ((rc = kv_mlx_write(&o))) {
		fprintf(stderr, "kvkeep convert-mlx: %s\n", kv_errmsg());
		return 1;
	}
	printf("wrote %s: MLX %lld-bit, group size %lld, from %s\n", out, (long long)bits, (long long)group, model);
	return 0;
}
KV_COMMAND(convert_mlx, "convert-mlx", "write an MLX quantized folder (4/8-bit affine) from a Hugging Face folder",
	   cmd_convert_mlx);
