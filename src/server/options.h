/*
 * options.h - everything `kvkeep serve` can be told, in one struct.
 *
 * The command line (src/cli/cmd_serve.c) fills it from flags; the
 * environment variables are read here (ksv_opts_env) so the server and
 * the tests see the same rules. Defaults come from ksv_opts_default().
 * Flags and variables keep the names operators of other local servers know (docs/operations.md);
 * docs/operations.md lists them all.
 *
 * String fields are borrowed (argv or kv_env, base/env.h): they must outlive the
 * server.
 */
#ifndef KV_SERVER_OPTIONS_H
#define KV_SERVER_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "model/genconfig.h"

struct ksv_opts {
	/* model and network */
	const char *model_dir;            /* --model PATH (required): a .gguf file or a model folder */
	const char *host;                 /* --host, default 127.0.0.1 */
	int64_t port;                     /* --port, default 8000 (0: any free port) */
	const char *served_model_name;    /* --served-model-name, default: the folder's name */

	/* prefix cache, RAM tier (docs/cache.md) */
	int prefix_cache;                 /* --enable-prefix-cache (default) / --disable-prefix-cache */
	const char *prefix_cache_index;   /* --prefix-cache-index radix|hash, default radix */
	int64_t prefix_cache_size;        /* --prefix-cache-size N: legacy count mode; -1 = off (default) */
	int64_t cache_memory_mb;          /* --cache-memory-mb; -1 = not given */
	double cache_memory_percent;      /* --cache-memory-percent (fraction); -1 = not given (0.20) */
	int64_t memory_cap_mb;            /* --memory-cap-mb; -1 = the cgroup limit, if any */
	int64_t hybrid_cache_entries;     /* --hybrid-cache-entries; -1 = automatic (8 for hybrid) */
	int64_t kv_disk_checkpoint_interval; /* --kv-disk-checkpoint-interval N; 0 = off (disk tier) */
	const char *env_prefix_cache_max_bytes; /* KVKEEP_PREFIX_CACHE_MAX_BYTES */
	const char *env_checkpoint_stride;      /* KVKEEP_HYBRID_CHECKPOINT_STRIDE (2048) */
	const char *env_checkpoint_max;         /* KVKEEP_HYBRID_CHECKPOINT_MAX (4) */

	/* disk tier (store/store.h, docs/persistence.md) */
	const char *cache_dir;            /* --cache-dir; KVKEEP_CACHE_DIR */
	int64_t disk_cache_max_mb;        /* --disk-cache-max-mb; -1 = 10% of the filesystem */
	int64_t disk_cache_max_files;     /* --disk-cache-max-files; -1 = KS_MAX_FILES_DEFAULT (100K) */
	const char *cache_salt;           /* --cache-salt */
	int allow_request_salt;           /* --allow-request-salt */
	const char *env_cache_dir;        /* KVKEEP_CACHE_DIR */
	const char *env_shutdown_budget;  /* KVKEEP_SHUTDOWN_BUDGET (3.5 s) */
	const char *env_kv_checkpoint_max_bytes; /* KVKEEP_KV_CHECKPOINT_MAX_BYTES (20 GiB) */

	/* remote tier (store/remote.h, docs/cluster.md) */
	const char *remote_cache;         /* --remote-cache redis://[user:pass@]host:port[,...]; NULL: none */
	const char *remote_cache_prefix;  /* --remote-cache-prefix, default "kvkeep:" */
	const char *remote_cache_user;    /* --remote-cache-user (overrides the URL's) */
	const char *remote_cache_password_file; /* --remote-cache-password-file FILE */
	int64_t remote_cache_timeout_ms;  /* --remote-cache-timeout-ms, default 200 (per call) */
	const char *remote_cache_to_disk; /* --remote-cache-to-disk on|off, default on */
	int64_t remote_cache_queue_mb;    /* --remote-cache-queue-mb per namespace, default 512 */
	const char *env_remote_cache_password; /* KVKEEP_REMOTE_CACHE_PASSWORD */

	/* engine */
	int64_t threads;                  /* --threads / -t: engine threads; 0 = KVKEEP_THREADS, else one per core */
	const char *kv_dtype;             /* --kv-dtype bf16|f32, default bf16 */
	const char *quant_act;            /* --quant-act q8|f32, default q8 (engine/model.h) */
	int64_t page_tokens;              /* --page-tokens B, default 256 */
	int64_t prefill_chunk;            /* --prefill-chunk, default 256 */
	int64_t max_model_len;            /* --max-model-len; 0 = the config's max_position_embeddings */
	int64_t default_max_tokens;       /* --default-max-tokens, when a request gives none: 2048 */
	int split_reasoning;              /* 1 unless --no-reasoning-split */
	const char *reasoning_history;    /* --reasoning-history keep|template, default keep */
	const char *echo_generated;       /* --echo-generated on|off, default on (session/echo.h) */
	int64_t echo_generated_mb;        /* --echo-generated-mb: its memory per namespace, default 32 */
	const char *prompt_normalize;     /* --prompt-normalize RULES (normalize.h), default "billing-header" */
	int special_tokens_in_request;    /* --special-tokens-in-request: literals in request text become
					     control tokens (Hugging Face); default 0: plain text */
	const char *speculative;          /* --speculative off|lookup|mtp|auto, default auto (session/spec.h) */
	int64_t speculative_draft;        /* --speculative-draft N: longest draft a step verifies, default 8 */

	/* sampling defaults (docs/api.md "Sampling"): request > flag >
	 * generation_config.json > the OpenAI defaults */
	const char *generation_config;    /* --generation-config auto|none|DIR, default auto */
	double default_sp[KV_GC_N];       /* --default-temperature, ... by enum kv_gencfg_field; NaN: not given */

	/* HTTP limits */
	int64_t max_body_mb;              /* --max-body-mb, default 32 */
	int64_t max_connections;          /* --max-connections, default 512 */
	int64_t header_timeout_ms;        /* --header-timeout-ms, default 10000 */
	int64_t stall_timeout_s;          /* --stall-timeout-s, default 300 */
	int64_t max_queue;                /* --max-queue: requests waiting for the engine, default 64 */
	int64_t max_running;              /* --max-running: sequences decoding together; 0 = from the memory budget (<= 4) */
	int64_t max_batch_tokens;         /* --max-batch-tokens: tokens per engine step; 0 = prefill_chunk + max_running */
	int64_t retry_after_s;            /* --retry-after-s sent with 503 / 429, default 2 */

	/* access (server/auth.h) */
	const char *api_key;              /* --api-key (NULL: KVKEEP_API_KEY, else open) */
	const char *admin_key;            /* --admin-key (NULL: KVKEEP_ADMIN_KEY, else loopback only) */
	const char *env_api_key;          /* KVKEEP_API_KEY */
	const char *env_admin_key;        /* KVKEEP_ADMIN_KEY */

	/* browsers (server/browser.h) */
	const char *allowed_origin;       /* --allowed-origin: web origins that may call, comma-separated, or "*" */
	const char *allowed_host;         /* --allowed-host: Host names a keyless server answers to, or "*" */
};

/* Defaults of every field (environment not read). */
void ksv_opts_default(struct ksv_opts *o);
/* Fill the env_* fields from the environment table (base/env.h; unset -> NULL). */
void ksv_opts_env(struct ksv_opts *o);
/* Range checks; KV_ERR_INVALID naming the flag. */
int ksv_opts_check(const struct ksv_opts *o);
/* "--default-temperature", ... for a field (static string). */
const char *ksv_opts_default_flag(int field);

#endif
