#!/usr/bin/env bash
# bench/peer_bench.sh - kvkeep next to llama.cpp v0.5.0 on the same weights,
# same machine, alternating in one run (docs/peer.md).
#
#   bash bench/peer_bench.sh --hf DIR --gguf FILE.gguf [--kvkeep-model PATH]
#       [--threads 2] [--reps 3] [--contexts 1024,8192] [--decode-contexts 1024,8192]
#       [--long] [--decode-tokens 32] [--kv f32|q8_0] [--json OUT.json] [--no-rss]
#
# Each repetition runs, for every context C, `kvkeep bench engine --contexts C`
# (prefill of C tokens, then --decode-tokens steps) and `kvpeer bench
# --prefill C --ctx C --decode N` (the same on llama.cpp), the order of the
# two swapped every repetition so that a slow drift of the machine hits both.
# Then, once per context in --decode-contexts, each side's resident memory
# (peak RSS, /usr/bin/time) is taken in a plain run at that context:
# `kvkeep generate` (prefill C + N steps) and `kvpeer bench --reps 1`. The
# table has medians (min-max) of the repetitions and kvkeep/llama.cpp ratios.
#
# kvkeep reads --kvkeep-model (default: the --hf folder; pass the GGUF once
# kvkeep loads GGUF files); llama.cpp always reads --gguf. --long adds 32768
# to the prefill contexts. KV: kvkeep's default (bf16) against llama.cpp's
# default (f16, flash attention auto); --kv f32 (or --kv-f32) puts both on
# f32 KV with llama.cpp's flash attention off; --kv q8_0 puts both on 8-bit
# KV (kvkeep --kv-dtype q8_0, llama.cpp -ctk q8_0 -ctv q8_0 with flash
# attention on, which its quantized V cache requires).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KVKEEP=${KVKEEP:-$ROOT/build/kvkeep}
KVPEER=${KVPEER:-$ROOT/build/peer/kvpeer}
hf="" gguf="" kmodel="" threads=2 reps=3 ctxs="1024,8192" dctxs="1024,8192" long=0 ntok=32 kv="" json="" rss=1
usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
	case $1 in
	--hf) hf=$2; shift 2 ;;
	--gguf) gguf=$2; shift 2 ;;
	--kvkeep-model) kmodel=$2; shift 2 ;;
	--threads) threads=$2; shift 2 ;;
	--reps) reps=$2; shift 2 ;;
	--contexts) ctxs=$2; shift 2 ;;
	--decode-contexts) dctxs=$2; shift 2 ;;
	--long) long=1; shift ;;
	--decode-tokens) ntok=$2; shift 2 ;;
	--kv-f32) kv=f32; shift ;;
	--kv) kv=$2; shift 2 ;;
	--json) json=$2; shift 2 ;;
	--no-rss) rss=0; shift ;;
	-h | --help) usage 0 ;;
	*) echo "peer_bench: unknown argument $1" >&2; usage ;;
	esac
done
[ -n "$hf" ] && [ -n "$gguf" ] || { echo "peer_bench: --hf and --gguf are required" >&2; usage; }
[ -n "$kmodel" ] || kmodel=$hf
for v in "$threads" "$reps" "$ntok"; do
	[[ $v =~ ^[1-9][0-9]*$ ]] || { echo "peer_bench: $v is not a positive number" >&2; exit 2; }
done
[ "$long" = 1 ] && ctxs="$ctxs,32768"
[ -x "$KVKEEP" ] || { echo "peer_bench: $KVKEEP missing (make build/kvkeep)" >&2; exit 1; }
if [ ! -x "$KVPEER" ]; then
	bash "$ROOT/tests/peer/build.sh" "$(dirname "$(dirname "$KVPEER")")" >&2 ||
		{ echo "peer_bench: cannot build kvpeer (make peer)" >&2; exit 1; }
fi
TIME=/usr/bin/time
if [ "$rss" = 1 ] && [ ! -x $TIME ]; then
	echo "peer_bench: $TIME missing (apt-get install time): resident memory not measured" >&2
	rss=0
fi

kflags=() pflags=()
case $kv in
"") ;;
f32) kflags=(--kv-dtype f32); pflags=(--kv f32 --fa off) ;;
q8_0) kflags=(--kv-dtype q8_0); pflags=(--kv q8_0 --fa on) ;;
*) echo "peer_bench: --kv $kv: use f32 or q8_0" >&2; exit 2 ;;
esac
export KVKEEP_THREADS=$threads KVKEEP_LOG=${KVKEEP_LOG:-warn}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
# every context measured (prefill list, plus decode contexts not in it)
all=$(echo "$ctxs,$dctxs" | tr ',' '\n' | awk 'NF && !seen[$1]++' | sort -n | tr '\n' ' ')

run_kvkeep() { # ctx rep
	"$KVKEEP" bench engine --model "$kmodel" --json --contexts "$1" --decode-tokens "$ntok" --repeat 1 \
		"${kflags[@]}" >"$W/k.$1.$2.json" 2>"$W/k.err" ||
		{ echo "peer_bench: kvkeep bench engine failed:" >&2; tail -5 "$W/k.err" >&2; exit 1; }
}
run_peer() { # ctx rep
	"$KVPEER" bench "$gguf" --prefill "$1" --ctx "$1" --decode "$ntok" --threads "$threads" --reps 1 \
		"${pflags[@]}" >"$W/p.$1.$2.json" 2>"$W/p.err" ||
		{ echo "peer_bench: kvpeer bench failed:" >&2; tail -5 "$W/p.err" >&2; exit 1; }
}

echo "peer_bench: kvkeep $kmodel vs llama.cpp $gguf, $threads threads, $reps reps, contexts $all" >&2
for r in $(seq 1 "$reps"); do
	for c in $all; do
		echo "  rep $r/$reps context $c" >&2
		if [ $((r % 2)) = 1 ]; then run_kvkeep "$c" "$r"; run_peer "$c" "$r"
		else run_peer "$c" "$r"; run_kvkeep "$c" "$r"; fi
	done
done

if [ "$rss" = 1 ]; then
	for c in $(echo "$dctxs" | tr ',' ' '); do
		echo "  resident memory at context $c" >&2
		ids=$(awk -v n="$c" 'BEGIN { for (i = 0; i < n; i++) printf "%s%d", (i ? "," : ""), (i * 7 + 3) % 100 }')
		$TIME -f %M -o "$W/krss.$c" "$KVKEEP" generate --model "$kmodel" --tokens "$ids" --max-tokens "$ntok" \
			--ignore-eos --quiet "${kflags[@]}" >/dev/null 2>"$W/k.err" ||
			{ echo "peer_bench: kvkeep generate failed:" >&2; tail -5 "$W/k.err" >&2; exit 1; }
		$TIME -f %M -o "$W/prss.$c" "$KVPEER" bench "$gguf" --prefill 0 --ctx "$c" --decode "$ntok" \
			--threads "$threads" --reps 1 "${pflags[@]}" >/dev/null 2>"$W/p.err" ||
			{ echo "peer_bench: kvpeer bench failed:" >&2; tail -5 "$W/p.err" >&2; exit 1; }
	done
fi

python3 - "$W" "$reps" "$ctxs" "$dctxs" "$rss" "$json" "$kmodel" "$gguf" "$threads" <<'EOF'
import json, os, statistics, sys
W, reps, ctxs, dctxs, rss, out, kmodel, gguf, threads = sys.argv[1:]
reps = int(reps)
ctxs = [int(x) for x in ctxs.split(",") if x]
dctxs = [int(x) for x in dctxs.split(",") if x]
def load(p):
    with open(p) as f:
        return json.load(f)
rows, raw = [], {"kvkeep_model": kmodel, "gguf": gguf, "threads": int(threads), "reps": reps, "cells": []}
k0 = load(f"{W}/k.{(ctxs + dctxs)[0]}.1.json")
p0 = load(f"{W}/p.{(ctxs + dctxs)[0]}.1.json")
def cell(name, ks, ps, unit):
    km, pm = statistics.median(ks), statistics.median(ps)
    raw["cells"].append({"name": name, "unit": unit, "kvkeep": ks, "llama_cpp": ps,
                         "kvkeep_median": km, "llama_cpp_median": pm, "ratio": km / pm if pm else None})
    rows.append((name, f"{km:.1f} ({min(ks):.1f}-{max(ks):.1f})", f"{pm:.1f} ({min(ps):.1f}-{max(ps):.1f})",
                 f"{km / pm:.2f}x" if pm else "-"))
def series(side, c, key):
    v = []
    for r in range(1, reps + 1):
        j = load(f"{W}/{side}.{c}.{r}.json")
        if side == "k":
            v.append(j["contexts"][0][key + "_tokens_per_s"])
        else:
            v.append(j[key]["tok_s_median"])
    return v
for c in ctxs:
    cell(f"prefill {c}", series("k", c, "prefill"), series("p", c, "prefill"), "tok/s")
for c in dctxs:
    cell(f"decode @{c}", series("k", c, "decode"), series("p", c, "decode"), "tok/s")
print(f"kvkeep {kmodel} ({k0['weight_dtype']} weights, {k0['kv_dtype']} KV, isa {k0['isa']})")
print(f"llama.cpp v0.5.0 {gguf} ({p0['kv']} KV, flash attention {p0['flash_attn']}, cpu backend {p0['cpu_backend']})")
print(f"{threads} threads, {reps} repetitions alternating; tok/s median (min-max)")
print()
w = [max(len(r[i]) for r in rows + [("cell", "kvkeep", "llama.cpp", "kvkeep/llama.cpp")]) for i in range(4)]
fmt = lambda r: "  ".join(s.ljust(w[i]) if i == 0 else s.rjust(w[i]) for i, s in enumerate(r))
print(fmt(("cell", "kvkeep", "llama.cpp", "kvkeep/llama.cpp")))
for r in rows:
    print(fmt(r))
if rss == "1":
    print()
    for c in dctxs:
        km = int(open(f"{W}/krss.{c}").read().split()[-1]) / 1024
        pm = int(open(f"{W}/prss.{c}").read().split()[-1]) / 1024
        raw["cells"].append({"name": f"peak RSS @{c}", "unit": "MiB", "kvkeep": [km], "llama_cpp": [pm]})
        print(f"peak resident memory, {c}-token prompt + decode: "
              f"kvkeep {km:.0f} MiB, llama.cpp {pm:.0f} MiB ({km / pm:.2f}x)")
if out:
    with open(out, "w") as f:
        json.dump(raw, f, indent=1)
EOF
