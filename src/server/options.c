/*
 * options.c - see options.h.
 */
#include "server/options.h"
#include "server/browser.h"
#include "base/env.h"
#include "base/err.h"
#include "base/redis.h"
#include "engine/model.h"
#include "engine/seq.h"
#include "session/spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ksv_opts_default(struct ksv_opts *o)
{
	memset(o, 0, sizeof *o);
	o->host = "127.0.0.1";
	o->port = 8000;
	o->prefix_cache = 1;
	o->prefix_cache_index = "radix";
	o->prefix_cache_size = -1;
	o->cache_memory_mb = -1;
	o->cache_memory_percent = -1;
	o->memory_cap_mb = -1;
	o->hybrid_cache_entries = -1;
	o->kv_disk_checkpoint_interval = 0;
	o->disk_cache_max_mb = -1;
	o->disk_cache_max_files = -1;
	o->remote_cache_prefix = "kvkeep:";
	o->remote_cache_timeout_ms = 200;
	o->remote_cache_to_disk = "on";
	o->remote_cache_queue_mb = 512;
	o->kv_dtype = "bf16";
	o->quant_act = "q8";
	o->page_tokens = 256;
	o->prefill_chunk = 256;
	o->max_model_len = 0;
	o->default_max_tokens = 2048;
	o->split_reasoning = 1;
	o->reasoning_history = "keep";
	o->echo_generated = "on";
	o->echo_generated_mb = 32;
	o->prompt_normalize = "billing-header";
	o->speculative = "auto";
	o->speculative_draft = 8;
	o->generation_config = "auto";
	for (int i = 0; i < KV_GC_N; i++)
		o->default_sp[i] = NAN;
	o->max_body_mb = 32;
	o->max_connections = 512;
	o->header_timeout_ms = 10000;
	o->stall_timeout_s = 300;
	o->max_queue = 64;
	o->retry_after_s = 2;
}

void ksv_opts_env(struct ksv_opts *o)
{
	o->env_prefix_cache_max_bytes = kv_env(KV_ENV_PREFIX_CACHE_MAX_BYTES);
	o->env_checkpoint_stride = kv_env(KV_ENV_HYBRID_CHECKPOINT_STRIDE);
	o->env_checkpoint_max = kv_env(KV_ENV_HYBRID_CHECKPOINT_MAX);
	o->env_cache_dir = kv_env(KV_ENV_CACHE_DIR);
	o->env_shutdown_budget = kv_env(KV_ENV_SHUTDOWN_BUDGET);
	o->env_kv_checkpoint_max_bytes = kv_env(KV_ENV_KV_CHECKPOINT_MAX_BYTES);
	o->env_api_key = kv_env(KV_ENV_API_KEY);
	o->env_admin_key = kv_env(KV_ENV_ADMIN_KEY);
	o->env_remote_cache_password = kv_env(KV_ENV_REMOTE_CACHE_PASSWORD);
}

int ksv_opts_check(const struct ksv_opts *o)
{
	if (!o->model_dir || !*o->model_dir)
		return kv_fail(KV_ERR_INVALID, "a model is required: kvkeep serve MODEL (a .gguf file, a Hugging Face or MLX "
					       "folder, or a name from `kvkeep models`)");
	if (o->port < 0 || o->port > 65535)
		return kv_fail(KV_ERR_INVALID, "--port must be 0-65535");
	if (ksv_browser_check_flags(o->allowed_origin, o->allowed_host))
		return KV_ERR_INVALID;
	if (strcmp(o->prefix_cache_index, "radix") && strcmp(o->prefix_cache_index, "hash"))
		return kv_fail(KV_ERR_INVALID, "--prefix-cache-index must be radix or hash");
	if (o->prefix_cache_size == 0 || o->prefix_cache_size < -1)
		return kv_fail(KV_ERR_INVALID, "--prefix-cache-size must be >= 1");
	if (o->cache_memory_mb < -1)
		return kv_fail(KV_ERR_INVALID, "--cache-memory-mb must be >= 0");
	if (o->cache_memory_percent != -1 && !(o->cache_memory_percent > 0 && o->cache_memory_percent <= 1))
		return kv_fail(KV_ERR_INVALID, "--cache-memory-percent must be a fraction in (0, 1]");
	if (o->memory_cap_mb == 0 || o->memory_cap_mb < -1)
		return kv_fail(KV_ERR_INVALID, "--memory-cap-mb must be >= 1");
	if (o->hybrid_cache_entries < -1)
		return kv_fail(KV_ERR_INVALID, "--hybrid-cache-entries must be >= 0");
	if (o->kv_disk_checkpoint_interval < 0)
		return kv_fail(KV_ERR_INVALID, "--kv-disk-checkpoint-interval must be >= 0");
	if (ke_kv_parse(o->kv_dtype) < 0)
		return kv_fail(KV_ERR_INVALID, "--kv-dtype must be bf16, f32 or q8_0");
	if (ke_quant_act_parse(o->quant_act) < 0)
		return kv_fail(KV_ERR_INVALID, "--quant-act must be q8 or f32");
	if (o->threads < 0 || o->threads > 4096)
		return kv_fail(KV_ERR_INVALID, "--threads must be 1-4096 (0: KVKEEP_THREADS, else one per core)");
	if (o->page_tokens < 1 || o->page_tokens > 65536)
		return kv_fail(KV_ERR_INVALID, "--page-tokens must be 1-65536");
	if (kss_spec_mode_parse(o->speculative) < 0)
		return kv_fail(KV_ERR_INVALID, "--speculative must be off, lookup, mtp or auto");
	if (o->speculative_draft < 1 || o->speculative_draft > KE_SPEC_MAX_ROWS - 1)
		return kv_fail(KV_ERR_INVALID, "--speculative-draft must be 1-%d", KE_SPEC_MAX_ROWS - 1);
	if (o->prefill_chunk < 1 || o->prefill_chunk > 65536)
		return kv_fail(KV_ERR_INVALID, "--prefill-chunk must be 1-65536");
	if (o->max_model_len < 0 || o->max_model_len > (1 << 24))
		return kv_fail(KV_ERR_INVALID, "--max-model-len must be 0-16777216");
	if (o->default_max_tokens < 1)
		return kv_fail(KV_ERR_INVALID, "--default-max-tokens must be >= 1");
	if (strcmp(o->reasoning_history, "keep") && strcmp(o->reasoning_history, "template"))
		return kv_fail(KV_ERR_INVALID, "--reasoning-history must be keep or template");
	if (strcmp(o->echo_generated, "on") && strcmp(o->echo_generated, "off"))
		return kv_fail(KV_ERR_INVALID, "--echo-generated must be on or off");
	if (o->echo_generated_mb < 1 || o->echo_generated_mb > 1 << 20)
		return kv_fail(KV_ERR_INVALID, "--echo-generated-mb must be 1-1048576");
	if (!o->generation_config || !*o->generation_config)
		return kv_fail(KV_ERR_INVALID, "--generation-config must be auto, none or a folder");
	for (int i = 0; i < KV_GC_N; i++) {
		double v = o->default_sp[i];
		if (!isnan(v) && kv_gencfg_check(i, &v))
			return kv_fail_ctx(KV_ERR_INVALID, "%s", ksv_opts_default_flag(i));
	}
	if (o->max_body_mb < 1 || o->max_body_mb > 4096)
		return kv_fail(KV_ERR_INVALID, "--max-body-mb must be 1-4096");
	if (o->max_connections < 4 || o->max_connections > 100000)
		return kv_fail(KV_ERR_INVALID, "--max-connections must be 4-100000");
	if (o->header_timeout_ms < 100)
		return kv_fail(KV_ERR_INVALID, "--header-timeout-ms must be >= 100");
	if (o->stall_timeout_s < 0)
		return kv_fail(KV_ERR_INVALID, "--stall-timeout-s must be >= 0");
	if (o->cache_salt && !*o->cache_salt)
		return kv_fail(KV_ERR_INVALID, "--cache-salt must not be empty (leave it out for no salt)");
	if (o->max_running < 0 || o->max_running > 256)
		return kv_fail(KV_ERR_INVALID, "--max-running must be in [1, 256] (0: automatic)");
	if (o->max_batch_tokens < 0 || o->max_batch_tokens > 8192)
		return kv_fail(KV_ERR_INVALID, "--max-batch-tokens must be in [1, 8192] (0: automatic)");
	if (o->max_batch_tokens && o->max_running && o->max_batch_tokens < o->max_running)
		return kv_fail(KV_ERR_INVALID, "--max-batch-tokens must be at least --max-running");
	if (o->max_queue < 0 || o->max_queue > 100000)
		return kv_fail(KV_ERR_INVALID, "--max-queue must be 0-100000");
	if (o->retry_after_s < 1)
		return kv_fail(KV_ERR_INVALID, "--retry-after-s must be >= 1");
	if (o->disk_cache_max_files == 0 || o->disk_cache_max_files < -1)
		return kv_fail(KV_ERR_INVALID, "--disk-cache-max-files must be >= 1");
	if (o->remote_cache && !*o->remote_cache)
		return kv_fail(KV_ERR_INVALID, "--remote-cache must not be empty (leave it out for no remote tier)");
	if (o->remote_cache) {
		struct kv_redis_url u;
		int rc = kv_redis_url_parse(o->remote_cache, &u);
		memset(&u, 0, sizeof u); /* it may hold a password */
		if (rc)
			return kv_fail_ctx(rc, "--remote-cache");
	}
	if (o->remote_cache_timeout_ms < 1 || o->remote_cache_timeout_ms > 60000)
		return kv_fail(KV_ERR_INVALID, "--remote-cache-timeout-ms must be 1-60000");
	if (strcmp(o->remote_cache_to_disk, "on") && strcmp(o->remote_cache_to_disk, "off"))
		return kv_fail(KV_ERR_INVALID, "--remote-cache-to-disk must be on or off");
	if (o->remote_cache_queue_mb < 1 || o->remote_cache_queue_mb > 1 << 20)
		return kv_fail(KV_ERR_INVALID, "--remote-cache-queue-mb must be 1-1048576");
	if ((o->remote_cache_password_file || o->remote_cache_user) && !o->remote_cache)
		return kv_fail(KV_ERR_INVALID, "--remote-cache-password-file and --remote-cache-user need --remote-cache");
	if (o->api_key && !*o->api_key)
		return kv_fail(KV_ERR_INVALID, "--api-key must not be empty");
	if (o->admin_key && !*o->admin_key)
		return kv_fail(KV_ERR_INVALID, "--admin-key must not be empty");
	return KV_OK;
}

const char *ksv_opts_default_flag(int field)
{
	static const char *const names[KV_GC_N] = {
		"--default-temperature",      "--default-top-p",
		"--default-top-k",            "--default-min-p",
		"--default-presence-penalty", "--default-frequency-penalty",
		"--default-repetition-penalty"};
	return field >= 0 && field < KV_GC_N ? names[field] : "?";
}
