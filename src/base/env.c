/*
 * env.c - the environment table. See env.h.
 */
#include "base/env.h"
#include "base/err.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const struct kv_env_info g_info[KV_ENV__COUNT] = {
	[KV_ENV_PREFIX_CACHE_MAX_BYTES] = {"KVKEEP_PREFIX_CACHE_MAX_BYTES", "bytes", "unset",
					   "hard byte cap of the RAM cache, wins over the flags; blank or invalid: "
					   "ignored with one warning line"},
	[KV_ENV_HYBRID_CHECKPOINT_STRIDE] = {"KVKEEP_HYBRID_CHECKPOINT_STRIDE", "tokens", "2048",
					     "tokens between stride checkpoints (hybrid models); invalid or 0: 2048 "
					     "with one warning"},
	[KV_ENV_HYBRID_CHECKPOINT_MAX] = {"KVKEEP_HYBRID_CHECKPOINT_MAX", "integer", "4",
					  "checkpoints per entry, 0 disables; invalid: 4 with one warning"},
	[KV_ENV_LOG] = {"KVKEEP_LOG", "level", "info",
			"debug, info, warn, error, off; invalid: info with one warning"},
	[KV_ENV_THREADS] = {"KVKEEP_THREADS", "integer", "one per core",
			    "engine threads when `serve --threads` / `-t` is not given; unset, 0 or not a number: one "
			    "per core"},
	[KV_ENV_ISA] = {"KVKEEP_ISA", "scalar\\|avx2\\|avx512", "the best the CPU has",
			"forces a lower kernel path (engine.md); unknown or above the CPU: one warning"},
	[KV_ENV_PREPACK] = {"KVKEEP_PREPACK", "0\\|1", "1",
			    "0: no prepacked panels of Q8_0 / Q4_0 / Q5_0 / MXFP4 matrices on AVX-512 VNNI (engine.md): a "
			    "faster load and one copy of those weights less, slower decode, the same numbers; "
			    "anything else: 1 (with one warning unless unset)"},
	[KV_ENV_CACHE_DIR] = {"KVKEEP_CACHE_DIR", "path", "unset",
			      "cache root when `--cache-dir` is not given"},
	[KV_ENV_API_KEY] = {"KVKEEP_API_KEY", "text", "unset",
			    "the API key when `--api-key` is not given (keeps it out of `ps`); `kvkeep chat` and "
			    "`kvkeep bench replay` send it as `Authorization: Bearer`, so a server they spawn (which "
			    "inherits it) or one started with it keeps working"},
	[KV_ENV_ADMIN_KEY] = {"KVKEEP_ADMIN_KEY", "text", "unset",
			      "the admin key when `--admin-key` is not given; `kvkeep bench replay` sends it "
			      "(before the API key) for the cache routes"},
	[KV_ENV_SHUTDOWN_BUDGET] = {"KVKEEP_SHUTDOWN_BUDGET", "seconds", "3.5",
				    "seconds the SIGTERM flush may take (never overrun); invalid: 3.5"},
	[KV_ENV_KV_CHECKPOINT_MAX_BYTES] = {"KVKEEP_KV_CHECKPOINT_MAX_BYTES", "bytes", "21474836480 (20 GiB)",
					    "cap of `kv_checkpoints/`, oldest first; 0 = no cap; invalid: 20 GiB "
					    "with one warning; applied at open and at every startup scan"},
	[KV_ENV_BENCH_BATCH_DEBUG] = {"KVKEEP_BENCH_BATCH_DEBUG", "any", "unset",
				      "set (to anything): `kvkeep bench batch` prints each measurement's step "
				      "count, mean batch and step times"},
	[KV_ENV_REMOTE_CACHE_PASSWORD] = {"KVKEEP_REMOTE_CACHE_PASSWORD", "text", "unset",
					  "the Redis password of `--remote-cache` when `--remote-cache-password-file` is "
					  "not given (keeps it out of `ps`); wins over a password in the URL"},
	[KV_ENV_XDG_CACHE_HOME] = {"XDG_CACHE_HOME", "path", "unset",
				   "cache root `$XDG_CACHE_HOME/kvkeep` when neither `--cache-dir` nor "
				   "`KVKEEP_CACHE_DIR` is set"},
	[KV_ENV_HOME] = {"HOME", "path", "unset", "cache root `~/.cache/kvkeep` as the last resort"},
	[KV_ENV_TMPDIR] = {"TMPDIR", "path", "/tmp",
			   "temporary folders of the benchmarks and `kvkeep chat`'s server log"},
	[KV_ENV_OPENBLAS_CORETYPE] = {"OPENBLAS_CORETYPE", "text", "set by `kvkeep bench engine`",
				      "OpenBLAS kernel of the benchmark's yardstick; unset: the bench sets the one "
				      "of the engine's path (Haswell, SkylakeX)"},
	[KV_ENV_HF_HUB_CACHE] = {"HF_HUB_CACHE", "path", "unset",
				 "the Hugging Face hub cache `serve -m ORG/NAME` and `kvkeep models` read (never "
				 "download); unset: `$HF_HOME/hub`"},
	[KV_ENV_HF_HOME] = {"HF_HOME", "path", "unset",
			    "Hugging Face's folder: the hub cache is `$HF_HOME/hub`; unset: "
			    "`$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`"},
	[KV_ENV_OLLAMA_MODELS] = {"OLLAMA_MODELS", "path", "unset",
				  "Ollama's model store `serve -m NAME:TAG` and `kvkeep models` read; unset: "
				  "`~/.ollama/models`"},
};

static const char *g_val[KV_ENV__COUNT];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void read_all(void)
{
	for (int i = 0; i < KV_ENV__COUNT; i++) {
		const char *v = getenv(g_info[i].name);
		/* a copy: a later setenv of the same name cannot move it */
		char *c = v ? strdup(v) : NULL;
		g_val[i] = c ? c : v;
	}
}

const char *kv_env(int id)
{
	if (id < 0 || id >= KV_ENV__COUNT)
		return NULL;
	pthread_once(&g_once, read_all);
	return g_val[id];
}

const struct kv_env_info *kv_env_info(int id)
{
	return id >= 0 && id < KV_ENV__COUNT ? &g_info[id] : NULL;
}

int kv_env_markdown(struct kv_buf *out)
{
	kv_buf_adds(out, "| variable | value | default | meaning |\n|---|---|---|---|\n");
	for (int i = 0; i < KV_ENV__COUNT; i++)
		kv_buf_printf(out, "| `%s` | %s | %s | %s |\n", g_info[i].name, g_info[i].kind, g_info[i].def, g_info[i].doc);
	return out->oom ? kv_fail(KV_ERR_NOMEM, "environment table: out of memory") : KV_OK;
}
