/*
 * cmd_serve.c - `kvkeep serve`: flags, environment, signals; the server
 * itself is src/server/server.c.
 *
 * Signals: the first SIGTERM or SIGINT asks the server to stop gracefully
 * (stop accepting, end streams, flush); a second one exits at once.
 */
#include "cli/cli.h"
#include "base/err.h"
#include "base/log.h"
#include "model/locate.h"
#include "server/server.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static struct ksv_server *volatile g_srv;
static volatile sig_atomic_t g_signals;

static void on_signal(int sig)
{
	if (++g_signals > 1)
		_exit(130); /* second signal: leave now */
	struct ksv_server *s = g_srv;
	if (s && ksv_server_ready(s)) {
		ksv_server_request_stop(s);
		return;
	}
	_exit(128 + sig); /* still loading: nothing to answer or flush yet */
}

static const char *USAGE =
	"usage: kvkeep serve MODEL [flags]        (or --model / -m MODEL; llama-server's -c, -t, -np, -a work too)\n"
	"\n"
	"Serve the OpenAI (chat completions, responses), Anthropic (messages) APIs and the cache dashboard\n"
	"for one model, with the prefix cache in the loop. MODEL is a .gguf file, a Hugging Face or MLX\n"
	"model folder, or the name of a model the Hugging Face hub or Ollama already downloaded\n"
	"(`kvkeep models` lists them; nothing is ever downloaded).\n"
	"\n"
	"quick start (README.md has the same, docs/api.md the details):\n"
	"  kvkeep serve Qwen3-8B-Q4_K_M.gguf -a qwen     a GGUF file; clients ask for the model 'qwen'\n"
	"  kvkeep serve Qwen3-8B -a qwen                 a Hugging Face folder (config.json, *.safetensors)\n"
	"  kvkeep serve Qwen3-8B-MLX-4bit -a qwen        an MLX folder (mlx-lm, 4 or 8 bits)\n"
	"  kvkeep serve -m Qwen/Qwen3-8B -a qwen         from the Hugging Face cache (or -m qwen3:8b from Ollama)\n"
	"then, on http://127.0.0.1:8000 (/health answers 200 once the model is loaded):\n"
	"  Claude Code  ANTHROPIC_BASE_URL=http://127.0.0.1:8000 ANTHROPIC_API_KEY=none \\\n"
	"               ANTHROPIC_MODEL=qwen ANTHROPIC_DEFAULT_HAIKU_MODEL=qwen claude\n"
	"  Codex        codex -c model_provider=kvkeep -c model=qwen -c 'model_providers.kvkeep={name=\"kvkeep\",\n"
	"               base_url=\"http://127.0.0.1:8000/v1\", wire_api=\"responses\"}'\n"
	"  opencode     opencode.json: {\"provider\": {\"kvkeep\": {\"npm\": \"@ai-sdk/openai-compatible\",\n"
	"               \"options\": {\"baseURL\": \"http://127.0.0.1:8000/v1\"}, \"models\": {\"qwen\": {}}}},\n"
	"               \"model\": \"kvkeep/qwen\"}\n"
	"  qwen-code    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=none OPENAI_MODEL=qwen qwen\n"
	"  OpenAI SDK   OpenAI(base_url=\"http://127.0.0.1:8000/v1\", api_key=\"none\"), model=\"qwen\"\n"
	"  curl         curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\\n"
	"                 -d '{\"model\": \"qwen\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}'\n"
	"  the browser  http://127.0.0.1:8000/dashboard";

/* llama-server flags with no kvkeep equivalent: a sentence, not "unknown". */
static const struct kv_flag_hint HINTS[] = {
	{"-ngl --n-gpu-layers --gpu-layers", "kvkeep runs on the CPU (no GPU offload): leave it out"},
	{"-hf --hf-repo -hff --hf-file -mu --model-url",
	 "kvkeep never downloads: give a local file or folder, or a model the Hugging Face hub or Ollama already "
	 "downloaded (-m ORG/NAME, -m NAME:TAG; `kvkeep models` lists them)"},
	{"--jinja", "kvkeep always renders the model's own Jinja chat template: leave it out"},
	{"-fa --flash-attn -cb --cont-batching",
	 "kvkeep's attention and continuous batching are always on (--max-running sets the batch): leave it out"},
	{"-b --batch-size -ub --ubatch-size", "use --prefill-chunk N (prefill tokens per step) or --max-batch-tokens N"},
	{"--chat-template --chat-template-file", "kvkeep uses the model's own chat template (docs/templates.md)"},
	{"-n --n-predict", "use --default-max-tokens N (clients usually send max_tokens themselves)"},
	{"--temp", "use --default-temperature T"},
	{"-md --model-draft -hfd --hf-repo-draft -ngld --gpu-layers-draft -cd --ctx-size-draft",
	 "kvkeep needs no draft model: it drafts from the prompt and the output so far, and from the model's own MTP "
	 "head when it has one (--speculative off|lookup|mtp|auto, auto by default)"},
	{"--draft --draft-n --draft-max", "use --speculative-draft N (the longest draft; the length adapts to what is "
					  "accepted)"},
	{"--draft-min --draft-n-min --draft-p-min",
	 "kvkeep picks the draft length from the measured acceptance and cost: leave it out (--speculative-draft N caps it)"},
	{NULL, NULL},
};

static const char *ENV_HELP =
	"\nenvironment:\n"
	"  KVKEEP_PREFIX_CACHE_MAX_BYTES=N     hard byte cap of the RAM prefix cache; wins over\n"
	"                                      --cache-memory-mb/percent (default: unset; blank or\n"
	"                                      invalid is ignored with one log line)\n"
	"  KVKEEP_HYBRID_CHECKPOINT_STRIDE=N   tokens between stride checkpoints of hybrid models\n"
	"                                      (default 2048)\n"
	"  KVKEEP_HYBRID_CHECKPOINT_MAX=N      checkpoints kept per entry, 0 disables (default 4)\n"
	"  KVKEEP_LOG=debug|info|warn|error    log level (default info)\n"
	"  KVKEEP_THREADS=N                    engine threads when -t is not given (default: one per core)\n"
	"  KVKEEP_CACHE_DIR=DIR                disk cache folder when --cache-dir is not given\n"
	"  KVKEEP_SHUTDOWN_BUDGET=S            seconds the SIGTERM flush may take (default 3.5)\n"
	"  KVKEEP_KV_CHECKPOINT_MAX_BYTES=N    cap of kv_checkpoints/, oldest files first; 0 = no cap\n"
	"                                      (default 20 GiB; read again at every startup scan)\n"
	"  KVKEEP_REMOTE_CACHE_PASSWORD=PW     Redis password of --remote-cache (keeps it out of ps)\n"
	"  HF_HUB_CACHE, HF_HOME               where -m ORG/NAME looks (default ~/.cache/huggingface/hub)\n"
	"  OLLAMA_MODELS                       where -m NAME:TAG looks (default ~/.ollama/models)\n";

/*
 * MODEL as given: a path that exists is used as it is; anything else is
 * looked up by name in the Hugging Face cache and Ollama's store
 * (model/locate.h, offline). A name found that way becomes the default
 * served name. The buffers are static: the options borrow them.
 */
static int resolve_model(struct ksv_opts *o, const char *model)
{
	static char path[4096], name[1100];
	struct stat sb;
	if (stat(model, &sb) == 0 || strchr(model, '/') == model || !strncmp(model, "./", 2) ||
	    !strncmp(model, "../", 3) || !strncmp(model, "~/", 2)) {
		o->model_dir = model; /* a path (kv_model_probe says what is wrong with it) */
		return 0;
	}
	struct kv_locate_roots roots;
	struct kv_local_model m;
	kv_locate_roots_env(&roots);
	int rc = kv_locate_find(&roots, model, &m);
	if (rc == KV_ERR_NOT_FOUND) {
		fprintf(stderr, "kvkeep serve: %s: no such file or folder, and %s. `kvkeep models` lists the models found "
				"on this machine; kvkeep never downloads\n",
			model, kv_errmsg());
		return 1;
	}
	if (rc) {
		fprintf(stderr, "kvkeep serve: %s\n", kv_errmsg());
		return 1;
	}
	snprintf(path, sizeof path, "%s", m.path);
	/* clients may ask for the name as typed ("qwen3") and as found
	 * ("qwen3:latest") */
	if (strcmp(model, m.name) && !strchr(model, ',') && strlen(model) < 512)
		snprintf(name, sizeof name, "%.511s,%.511s", model, m.name);
	else
		snprintf(name, sizeof name, "%s", m.name);
	o->model_dir = path;
	if (!o->served_model_name)
		o->served_model_name = name;
	fprintf(stderr, "kvkeep serve: %s is %s (%s)\n", model, path, m.source);
	return 0;
}

static int cmd_serve(int argc, char **argv)
{
	struct ksv_opts o;
	const char *model = NULL;
	char *pos[1];
	int no_split = 0, n_pos = 0;
	ksv_opts_default(&o);
	struct kv_flag flags[] = {
		{"model", KV_FLAG_STR, &model, "MODEL",
		 "a .gguf file, a Hugging Face or MLX folder, or a name from `kvkeep models` (or give it first, without "
		 "the flag)", NULL, "-m"},
		{"host", KV_FLAG_STR, &o.host, "ADDR", "address to listen on (default 127.0.0.1)"},
		{"port", KV_FLAG_INT, &o.port, "N", "port (default 8000; 0 picks a free one)"},
		{"served-model-name", KV_FLAG_STR, &o.served_model_name, "NAME[,NAME...]",
		 "model ids in the API, comma-separated: every name reaches this model (Claude Code sends its main and "
		 "its small/fast model's); answers report the name the request used (default: the file or folder name, "
		 "without .gguf)", NULL, "-a --alias"},
		{"enable-prefix-cache", KV_FLAG_BOOL, &o.prefix_cache, NULL, "use the prefix cache (default: on)"},
		{"disable-prefix-cache", KV_FLAG_CLEAR, &o.prefix_cache, NULL,
		 "keep nothing: no lookups, nothing stored (RAM or disk)"},
		{"prefix-cache-index", KV_FLAG_STR, &o.prefix_cache_index, "radix|hash",
		 "index of cached blocks (default radix)"},
		{"prefix-cache-size", KV_FLAG_INT, &o.prefix_cache_size, "N",
		 "legacy mode: bound the cache by entry count (default: off, by bytes; other servers default to 100 entries in this mode)"},
		{"cache-memory-mb", KV_FLAG_INT, &o.cache_memory_mb, "MB",
		 "RAM cache budget in MiB (default: auto, 20% of available RAM)"},
		{"cache-memory-percent", KV_FLAG_DOUBLE, &o.cache_memory_percent, "F",
		 "RAM cache budget as a fraction of available RAM (default 0.20)"},
		{"memory-cap-mb", KV_FLAG_INT, &o.memory_cap_mb, "MB",
		 "memory cap for admission and the budget floor (default: the cgroup limit, else none)"},
		{"hybrid-cache-entries", KV_FLAG_INT, &o.hybrid_cache_entries, "N",
		 "non-trimmable (hybrid) entries kept (default: auto, 8 for hybrid models)"},
		{"kv-disk-checkpoint-interval", KV_FLAG_INT, &o.kv_disk_checkpoint_interval, "N",
		 "every N tokens of a long prefill or decode save a resume point to disk (default 0 = off)"},
		{"cache-dir", KV_FLAG_STR, &o.cache_dir, "DIR",
		 "disk cache folder (default: KVKEEP_CACHE_DIR, else XDG_CACHE_HOME/kvkeep, else ~/.cache/kvkeep)"},
		{"disk-cache-max-mb", KV_FLAG_INT, &o.disk_cache_max_mb, "MB",
		 "disk cache cap, least recently used out first (default: 10% of the filesystem)"},
		{"disk-cache-max-files", KV_FLAG_INT, &o.disk_cache_max_files, "N",
		 "disk cache object cap per namespace, least recently used out first (default 100000)"},
		{"cache-salt", KV_FLAG_STR, &o.cache_salt, "S",
		 "fold S into the cache namespace: another salt never shares cached prefixes (default: none)"},
		{"remote-cache", KV_FLAG_STR, &o.remote_cache, "redis://[user:pass@]host:port[,host:port...]",
		 "share the disk tier's objects with other servers through Redis Cluster (docs/cluster.md); put the "
		 "password in --remote-cache-password-file or KVKEEP_REMOTE_CACHE_PASSWORD, not here (default: none)"},
		{"remote-cache-prefix", KV_FLAG_STR, &o.remote_cache_prefix, "P", "key prefix in Redis (default kvkeep:)"},
		{"remote-cache-user", KV_FLAG_STR, &o.remote_cache_user, "USER", "Redis ACL user (default: the URL's, else default)"},
		{"remote-cache-password-file", KV_FLAG_STR, &o.remote_cache_password_file, "FILE",
		 "read the Redis password from FILE (first line); wins over KVKEEP_REMOTE_CACHE_PASSWORD and the URL"},
		{"remote-cache-timeout-ms", KV_FLAG_INT, &o.remote_cache_timeout_ms, "MS",
		 "longest a request waits for one Redis call (plus, for a call that moves an object, its bytes at "
		 "100 MB/s); a failure takes the tier down until a probe brings it back (default 200)"},
		{"remote-cache-to-disk", KV_FLAG_STR, &o.remote_cache_to_disk, "on|off",
		 "a remote hit is also written to the local disk tier (default on)"},
		{"remote-cache-queue-mb", KV_FLAG_INT, &o.remote_cache_queue_mb, "MB",
		 "objects waiting to be sent to Redis per namespace; more are dropped and counted (default 512)"},
		{"api-key", KV_FLAG_STR, &o.api_key, "KEY",
		 "require 'Authorization: Bearer KEY' or 'x-api-key: KEY' on the API routes (default: KVKEEP_API_KEY, else open)"},
		{"admin-key", KV_FLAG_STR, &o.admin_key, "KEY",
		 "require this key on /v1/cache/info, clear, probe (default: KVKEEP_ADMIN_KEY, else loopback only)"},
		{"allowed-origin", KV_FLAG_STR, &o.allowed_origin, "ORIGIN[,ORIGIN...]",
		 "web pages that may call the server from a browser (scheme://host[:port], or *); pages on localhost "
		 "and the server's own (the dashboard) always may (default: no others)"},
		{"allowed-host", KV_FLAG_STR, &o.allowed_host, "NAME[,NAME...]",
		 "host names a server without --api-key answers to besides IP addresses, localhost and --host (DNS "
		 "rebinding protection; * turns it off) (default: none)"},
		{"allow-request-salt", KV_FLAG_BOOL, &o.allow_request_salt, NULL,
		 "accept a request's cache_salt field: requests with the same salt share a namespace of their own (default: refused)"},
		{"prompt-normalize", KV_FLAG_STR, &o.prompt_normalize, "RULES",
		 "volatile-prefix rules applied before rendering, comma-separated: billing-header (Claude Code's "
		 "per-session header line), tools-order (tools rendered sorted by name: MCP clients reorder them; this "
		 "changes what the model sees), all, none (default billing-header)"},
		{"special-tokens-in-request", KV_FLAG_BOOL, &o.special_tokens_in_request, NULL,
		 "special-token literals (<|im_start|>...) in request text become control tokens, as in Hugging Face "
		 "(default: they are tokenized as the text they are)"},
		{"kv-dtype", KV_FLAG_STR, &o.kv_dtype, "bf16|f32|q8_0",
		 "KV cache element type (default bf16; q8_0: int8 blocks, half the bytes, lossy)"},
		{"quant-act", KV_FLAG_STR, &o.quant_act, "q8|f32", "products with Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/MXFP4 weights: q8 (default) quantizes each activation row to int8 for integer dots, f32 keeps activations f32 against the exactly dequantized weights"},
		{"page-tokens", KV_FLAG_INT, &o.page_tokens, "B", "tokens per KV page / cache block (default 256)"},
		{"prefill-chunk", KV_FLAG_INT, &o.prefill_chunk, "N", "prefill tokens per forward step (default 256)"},
		{"max-model-len", KV_FLAG_INT, &o.max_model_len, "N",
		 "context length (default: the model's max_position_embeddings, lowered to what half the memory left "
		 "after the weights holds; logged at start)", NULL, "-c --ctx-size"},
		{"threads", KV_FLAG_INT, &o.threads, "N",
		 "engine threads (default: KVKEEP_THREADS, else one per core; logged at start)", NULL, "-t"},
		{"default-max-tokens", KV_FLAG_INT, &o.default_max_tokens, "N",
		 "tokens generated when a request sets no max_tokens (default 2048)"},
		{"generation-config", KV_FLAG_STR, &o.generation_config, "auto|none|DIR",
		 "sampling defaults from the model folder's generation_config.json (auto), from DIR's, or none "
		 "(the OpenAI defaults); its eos_token_id always stops generation (default auto)"},
		{"default-temperature", KV_FLAG_DOUBLE, &o.default_sp[KV_GC_TEMPERATURE], "T",
		 "temperature of requests that set none (default: generation_config, else 1)"},
		{"default-top-p", KV_FLAG_DOUBLE, &o.default_sp[KV_GC_TOP_P], "P",
		 "top_p of requests that set none (default: generation_config, else 1)"},
		{"default-top-k", KV_FLAG_DOUBLE, &o.default_sp[KV_GC_TOP_K], "K",
		 "top_k of requests that set none, 0 = off (default: generation_config, else 0)"},
		{"default-min-p", KV_FLAG_DOUBLE, &o.default_sp[KV_GC_MIN_P], "P",
		 "min_p of requests that set none (default: generation_config, else 0)"},
		{"default-presence-penalty", KV_FLAG_DOUBLE, &o.default_sp[KV_GC_PRESENCE_PENALTY], "X",
		 "presence_penalty of requests that set none, -2..2 (default: generation_config, else 0)"},
		{"default-frequency-penalty", KV_FLAG_DOUBLE, &o.default_sp[KV_GC_FREQUENCY_PENALTY], "X",
		 "frequency_penalty of requests that set none, -2..2 (default: generation_config, else 0)"},
		{"default-repetition-penalty", KV_FLAG_DOUBLE, &o.default_sp[KV_GC_REPETITION_PENALTY], "X",
		 "repetition_penalty of requests that set none, > 0 (default: generation_config, else 1)"},
		{"no-reasoning-split", KV_FLAG_BOOL, &no_split, NULL,
		 "leave <think>...</think> in content instead of reasoning_content (default: split)"},
		{"reasoning-history", KV_FLAG_STR, &o.reasoning_history, "keep|template",
		 "keep: render the reasoning of every assistant turn a request carries, also where the template "
		 "drops it, so the history stays what was generated and cached; template: the template to the letter "
		 "(no reasoning kept, no answers restored) (default keep)"},
		{"echo-generated", KV_FLAG_STR, &o.echo_generated, "on|off",
		 "remember the exact tokens of every answer and use them when a client sends the answer back "
		 "(default on)"},
		{"echo-generated-mb", KV_FLAG_INT, &o.echo_generated_mb, "MB",
		 "memory for those answers per cache namespace, least recently used out (default 32)"},
		{"max-body-mb", KV_FLAG_INT, &o.max_body_mb, "MB", "largest request body, else 413 (default 32)"},
		{"max-connections", KV_FLAG_INT, &o.max_connections, "N", "concurrent connections (default 512)"},
		{"header-timeout-ms", KV_FLAG_INT, &o.header_timeout_ms, "MS",
		 "a request head must arrive within this; also the keep-alive idle limit (default 10000)"},
		{"stall-timeout-s", KV_FLAG_INT, &o.stall_timeout_s, "S",
		 "close a stream whose client reads nothing for this long (default 300, 0 = never)"},
		{"max-queue", KV_FLAG_INT, &o.max_queue, "N",
		 "requests that may wait for the engine; more get 429 (default 64)"},
		{"retry-after-s", KV_FLAG_INT, &o.retry_after_s, "S", "Retry-After of 503 and 429 answers (default 2)"},
		{"max-running", KV_FLAG_INT, &o.max_running, "N",
		 "requests generating together, batched into one engine step (default: 4, fewer when memory is short)",
		 NULL, "-np --parallel"},
		{"max-batch-tokens", KV_FLAG_INT, &o.max_batch_tokens, "N",
		 "tokens per engine step: decode tokens, verifications and prefill chunks (default: prefill chunk + "
		 "max running x (speculative draft + 1))"},
		{"speculative", KV_FLAG_STR, &o.speculative, "off|lookup|mtp|auto",
		 "speculative decoding: drafts from the prompt and the output so far (lookup), from the model's MTP "
		 "head (mtp), or either (auto, the default); the output is the same as without, only the speed changes"},
		{"speculative-draft", KV_FLAG_INT, &o.speculative_draft, "N",
		 "longest draft one step verifies, 1-15 (default 8)"},
		{NULL, 0, NULL, NULL, NULL},
	};
	int rc = kv_flags_parse_hints(USAGE, flags, HINTS, argc, argv, pos, 1, &n_pos);
	if (rc == 1) {
		fputs(ENV_HELP, stdout);
		return 0;
	}
	if (rc)
		return 2;
	if (n_pos && model) {
		fprintf(stderr, "kvkeep serve: two models: '%s' and --model '%s' (give one)\n", pos[0], model);
		return 2;
	}
	if (n_pos)
		model = pos[0];
	if (!model) {
		fprintf(stderr, "kvkeep serve: which model? kvkeep serve MODEL (a .gguf file, a Hugging Face or MLX folder, "
				"or a name from `kvkeep models`); kvkeep serve --help has a quick start\n");
		return 2;
	}
	if (resolve_model(&o, model))
		return 1;
	o.split_reasoning = !no_split;
	ksv_opts_env(&o);
	if (ksv_opts_check(&o)) {
		fprintf(stderr, "kvkeep serve: %s\n", kv_errmsg());
		return 2;
	}

	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = SIG_IGN;
	sigaction(SIGPIPE, &sa, NULL);

	/* the handlers go in before the server exists: a signal while it
	 * loads leaves at once (nothing to flush yet), one after it is ready
	 * stops it (serve.ready is logged after it is ready) */
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	/* listen first (a busy port fails before the model loads), then load */
	struct ksv_server *srv;
	if (ksv_server_create(&o, &srv)) {
		fprintf(stderr, "kvkeep serve: %s\n", kv_errmsg());
		return 1;
	}
	g_srv = srv;
	if (ksv_server_load(srv)) {
		fprintf(stderr, "kvkeep serve: %s\n", kv_errmsg());
		g_srv = NULL;
		ksv_server_destroy(srv);
		return 1;
	}
	rc = ksv_server_run(srv);
	g_srv = NULL;
	ksv_server_destroy(srv);
	return rc ? 1 : 0;
}
KV_COMMAND(serve, "serve", "serve the OpenAI and Anthropic APIs for a GGUF file, a model folder or a local model name",
	   cmd_serve);
