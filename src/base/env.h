/*
 * env.h - every environment variable kvkeep reads, in one table.
 *
 * Each variable has an id, its name, the kind of value, the default and a
 * one-line meaning (kv_env_info). The values are read once, on the first
 * kv_env() call, for the whole process: a variable changed later (setenv)
 * is not seen, and every reader sees the same value. The table holds the
 * raw text only; the module that owns a variable parses it and says what
 * it did with an invalid value (a warning line and its default), as it
 * did before the table existed:
 *
 *   KVKEEP_LOG                      base/log.c (kv_log_parse_level)
 *   KVKEEP_THREADS                  base/pool.c
 *   KVKEEP_ISA                      engine/isa.c
 *   KVKEEP_PREPACK                  engine/model.c (prepack)
 *   KVKEEP_PREFIX_CACHE_MAX_BYTES   cache/budget.c (kc_budget_compute)
 *   KVKEEP_HYBRID_CHECKPOINT_*      cache/storage_policy.c (kc_policy_env)
 *   KVKEEP_CACHE_DIR, XDG_CACHE_HOME, HOME   store/dir.c (ks_dir_root_from)
 *   KVKEEP_KV_CHECKPOINT_MAX_BYTES  store/store.c (ks_ckpt_cap_parse)
 *   KVKEEP_SHUTDOWN_BUDGET          store/store.c (ks_store_budget_parse)
 *   KVKEEP_API_KEY, KVKEEP_ADMIN_KEY server/options.c, cli (chat, bench)
 *   KVKEEP_REMOTE_CACHE_PASSWORD    server/options.c -> store/remote.c
 *   HF_HUB_CACHE, HF_HOME, OLLAMA_MODELS  model/locate.c (kv_locate_roots_env)
 *
 * docs/operations.md ("Environment") shows the table kv_env_markdown()
 * writes; tests/unit/test_env.c fails when the two differ.
 */
#ifndef KV_BASE_ENV_H
#define KV_BASE_ENV_H

#include <stddef.h>

#include "base/buf.h"

enum kv_env_id {
	KV_ENV_PREFIX_CACHE_MAX_BYTES = 0,
	KV_ENV_HYBRID_CHECKPOINT_STRIDE,
	KV_ENV_HYBRID_CHECKPOINT_MAX,
	KV_ENV_LOG,
	KV_ENV_THREADS,
	KV_ENV_ISA,
	KV_ENV_PREPACK,
	KV_ENV_CACHE_DIR,
	KV_ENV_API_KEY,
	KV_ENV_ADMIN_KEY,
	KV_ENV_SHUTDOWN_BUDGET,
	KV_ENV_KV_CHECKPOINT_MAX_BYTES,
	KV_ENV_BENCH_BATCH_DEBUG,
	KV_ENV_REMOTE_CACHE_PASSWORD,
	/* not ours, read for the same reasons every program does */
	KV_ENV_XDG_CACHE_HOME,
	KV_ENV_HOME,
	KV_ENV_TMPDIR,
	KV_ENV_OPENBLAS_CORETYPE,
	KV_ENV_HF_HUB_CACHE,
	KV_ENV_HF_HOME,
	KV_ENV_OLLAMA_MODELS,
	KV_ENV__COUNT
};

struct kv_env_info {
	const char *name;  /* "KVKEEP_LOG" */
	const char *kind;  /* what the text means: "bytes", "integer", "level", ... */
	const char *def;   /* what unset means, for people */
	const char *doc;   /* one line: what it does, invalid values */
};

/* The variable's text as it was at the first call; NULL when unset ("" when
 * set to nothing: readers that care tell the two apart). id out of range:
 * NULL. Thread-safe. */
const char *kv_env(int id);

/* The table entry of id (NULL out of range). */
const struct kv_env_info *kv_env_info(int id);

/* The Markdown table of every variable (docs/operations.md). KV_OK or
 * KV_ERR_NOMEM. */
int kv_env_markdown(struct kv_buf *out);

#endif
