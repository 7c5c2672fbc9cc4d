/*
 * probe.c - see probe.h.
 *
 * The messages are written for a person who just typed `kvkeep serve -m
 * PATH`: each says what PATH is (or is not) and what to give instead.
 */
#include "model/probe.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/weights.h"
#include "base/err.h"
#include "base/io.h"
#include "base/json.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define WANT "give a .gguf file, or a Hugging Face or MLX model folder (config.json, *.safetensors, tokenizer.json)"

const char *kv_model_kind_name(int kind)
{
	switch (kind) {
	case KV_MODEL_GGUF: return "gguf";
	case KV_MODEL_HF: return "safetensors";
	case KV_MODEL_MLX: return "mlx";
	default: return "?";
	}
}

/* The path's trouble as an errno, in words with the fix. */
static int fail_errno(const char *path, int e, const char *what)
{
	if (e == ENOENT || e == ENOTDIR)
		return kv_fail(KV_ERR_NOT_FOUND, "%s: no such file or folder (%s; `kvkeep models` lists the models "
						 "found on this machine)", path, WANT);
	if (e == EACCES || e == EPERM)
		return kv_fail(KV_ERR_IO, "%s: permission denied: the user running kvkeep cannot %s it (check its "
					  "owner and mode, and those of the folders above it)", path, what);
	return kv_fail(kv_io_errno_code(e), "%s: cannot %s it: %s", path, what, strerror(e));
}

/* First bytes of a file (up to cap); *n how many. */
static int head_bytes(const char *path, unsigned char *buf, size_t cap, size_t *n)
{
	int fd = kv_io_open(path, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return fail_errno(path, errno, "read");
	ssize_t r = kv_io_pread(fd, buf, cap, 0);
	int e = errno;
	kv_io_close(fd);
	if (r < 0)
		return fail_errno(path, e, "read");
	*n = (size_t)r;
	return KV_OK;
}

static int starts(const unsigned char *b, size_t n, const char *s)
{
	size_t l = strlen(s);
	return n >= l && !memcmp(b, s, l);
}

/* A file that is not GGUF: name its format and what to give instead. */
static int not_gguf(const char *path, const unsigned char *b, size_t n, int gguf_suffix)
{
	size_t i = 0;
	while (i < n && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t'))
		i++;
	uint64_t hl = 0;
	if (n >= 9)
		for (int k = 7; k >= 0; k--)
			hl = hl << 8 | b[k];
	if (n >= 9 && b[8] == '{' && hl > 1 && hl < (1ull << 32))
		return kv_fail(KV_ERR_UNSUPPORTED, "%s is a single safetensors file: give its folder, which must also "
						   "hold config.json and tokenizer.json (the files of the Hugging Face repository)",
			       path);
	if (starts(b, n, "PK\x03\x04"))
		return kv_fail(KV_ERR_UNSUPPORTED, "%s is a zip archive (a PyTorch .bin / .pt checkpoint?): kvkeep reads "
						   "GGUF and safetensors; download the model's safetensors or GGUF files instead",
			       path);
	if (n >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s is a Python pickle (a PyTorch .bin checkpoint?): kvkeep reads GGUF "
						   "and safetensors; download the model's safetensors or GGUF files instead",
			       path);
	if (starts(b, n, "lmgg") || starts(b, n, "fmgg") || starts(b, n, "tjgg") || starts(b, n, "ggml") ||
	    starts(b, n, "ggjt") || starts(b, n, "ggmf"))
		return kv_fail(KV_ERR_UNSUPPORTED, "%s is an old GGML file (before GGUF): convert it to GGUF with "
						   "llama.cpp, or download a .gguf file", path);
	if (i < n && (b[i] == '<'))
		return kv_fail(KV_ERR_UNSUPPORTED, "%s is text that looks like a web page (a download that fetched an "
						   "error or login page?): download the model file again", path);
	if (i < n && (b[i] == '{' || b[i] == '['))
		return kv_fail(KV_ERR_UNSUPPORTED, "%s is a JSON file: give the model folder that holds it", path);
	char hex[40] = "";
	for (size_t k = 0; k < n && k < 8; k++)
		snprintf(hex + (k ? 3 * k - 1 : 0), sizeof hex - 3 * k, "%s%02x", k ? " " : "", b[k]);
	return kv_fail(KV_ERR_UNSUPPORTED, "%s %s (it starts with %s): %s", path,
		       gguf_suffix ? "is named .gguf but is not a GGUF file" : "is not a model file kvkeep reads", hex, WANT);
}

/* A GGUF file, split set or folder: its structure checked (kv_gguf_open). */
static int probe_gguf(const char *path, struct kv_model_probe *out)
{
	struct kv_gguf *g = NULL;
	int rc = kv_gguf_open(path, &g);
	if (rc == KV_ERR_CORRUPT)
		return kv_fail_ctx(rc, "%s is a damaged or incomplete GGUF file (a download that did not finish?); "
				       "download it again", path);
	if (rc)
		return rc; /* its own words: unsupported tensor types, versions, split sets */
	char *arch = NULL;
	if (kv_gguf_get_str(g, "general.architecture", &arch) == KV_OK)
		snprintf(out->arch, sizeof out->arch, "%s", arch);
	free(arch);
	kv_errclear();
	out->kind = KV_MODEL_GGUF;
	out->weight_bytes = kv_gguf_file_bytes(g);
	kv_gguf_close(g);
	return KV_OK;
}

/* A folder with config.json: its model_type and whether it is MLX. */
static int read_config(const char *path, const char *cfg, struct kv_model_probe *out)
{
	char *text = NULL;
	size_t len = 0;
	json_t *j = NULL;
	int rc = kv_io_read_file(cfg, 16u << 20, &text, &len);
	if (rc)
		return rc; /* its message names the file and the reason */
	char *relaxed = NULL; /* Python's bare Infinity (Nemotron-H's time_step_limit) */
	size_t rlen = 0;
	if ((rc = kv_config_json_relax(text, len, &relaxed, &rlen))) {
		free(text);
		return rc;
	}
	rc = relaxed ? kv_json_parse(cfg, relaxed, rlen, 64, &j) : kv_json_parse(cfg, text, len, 64, &j);
	free(relaxed);
	free(text);
	if (rc)
		return kv_fail_ctx(KV_ERR_CORRUPT, "%s: config.json is not valid JSON (download it again)", path);
	const char *mt = json_string_value(json_object_get(j, "model_type"));
	snprintf(out->arch, sizeof out->arch, "%s", mt ? mt : "");
	out->kind = json_object_get(j, "quantization") ? KV_MODEL_MLX : KV_MODEL_HF;
	json_decref(j);
	return KV_OK;
}

static int probe_folder(const char *path, struct kv_model_probe *out)
{
	char cfg[4200], tok[4200];
	struct stat sb;
	int rc;
	if (access(path, R_OK | X_OK))
		return fail_errno(path, errno, "list");
	if ((rc = kv_path_fmt(cfg, sizeof cfg, "%s/config.json", path)) ||
	    (rc = kv_path_fmt(tok, sizeof tok, "%s/tokenizer.json", path)))
		return rc;
	if (stat(cfg, &sb) != 0) {
		if (kv_gguf_is_model_path(path))
			return probe_gguf(path, out);
		return kv_fail(KV_ERR_NOT_FOUND, "%s holds no model: no config.json (a Hugging Face or MLX folder) and no "
						 ".gguf file; %s", path, WANT);
	}
	if ((rc = read_config(path, cfg, out)))
		return rc;
	struct kv_weights *w = NULL;
	rc = kv_weights_open(path, &w);
	if (rc == KV_ERR_NOT_FOUND)
		return kv_fail(rc, "%s has config.json but no weights (model.safetensors, or the shards of "
				   "model.safetensors.index.json): copy every *.safetensors file of the repository", path);
	if (rc == KV_ERR_CORRUPT)
		return kv_fail_ctx(rc, "%s: a damaged or incomplete safetensors file (a download that did not finish?); "
				       "download it again", path);
	if (rc)
		return rc;
	out->weight_bytes = kv_weights_bytes(w);
	kv_weights_close(w);
	if (stat(tok, &sb) != 0)
		return kv_fail(KV_ERR_NOT_FOUND, "tokenizer: %s has no tokenizer.json: copy it from the model's repository "
						 "(a Hugging Face folder needs config.json, the *.safetensors files, "
						 "tokenizer.json and tokenizer_config.json)", path);
	if (access(tok, R_OK))
		return kv_fail_ctx(fail_errno(tok, errno, "read"), "tokenizer");
	return KV_OK;
}

int kv_model_probe(const char *path, struct kv_model_probe *out)
{
	struct stat sb;
	memset(out, 0, sizeof *out);
	if (!path || !*path)
		return kv_fail(KV_ERR_INVALID, "no model given: %s", WANT);
	if (stat(path, &sb) != 0)
		return fail_errno(path, errno, "open");
	if (S_ISDIR(sb.st_mode))
		return probe_folder(path, out);
	if (!S_ISREG(sb.st_mode))
		return kv_fail(KV_ERR_INVALID, "%s is neither a file nor a folder; %s", path, WANT);
	unsigned char b[64];
	size_t n = 0;
	int rc = head_bytes(path, b, sizeof b, &n);
	if (rc)
		return rc;
	if (n == 0)
		return kv_fail(KV_ERR_CORRUPT, "%s is empty (0 bytes): a download that did not finish? download it again",
			       path);
	if (starts(b, n, "GGUF"))
		return probe_gguf(path, out);
	if (n < 4 && !memcmp(b, "GGUF", n))
		return kv_fail(KV_ERR_CORRUPT, "%s is a damaged or incomplete GGUF file (%zu bytes); download it again",
			       path, n);
	size_t L = strlen(path);
	return not_gguf(path, b, n, L >= 5 && !strcmp(path + L - 5, ".gguf"));
}
