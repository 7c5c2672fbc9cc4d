#!/usr/bin/env bash
# tests/ref/sampling_ref.sh - the sampler's kept sets and probabilities
# against a NumPy implementation of Hugging Face's logits processors.
#
# build/tests/test_sample (case dump_cases) writes 600 random cases (fixed
# logits, random temperature / top_k / top_p / min_p / presence, frequency
# and repetition penalties, prompt and generated history) with what
# ke_sampler_dist kept; tests/ref/sampling_ref.py (Debian's
# /usr/bin/python3 with NumPy) recomputes them processor by processor and
# compares: kept sets exactly, probabilities within 1e-9 relative.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${KT_BUILD:-$ROOT/build}
PY=/usr/bin/python3
T=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-sref.XXXXXX")
trap 'rm -rf "$T"' EXIT

if ! "$PY" -c 'import numpy' 2>/dev/null; then
	echo "skip ref_sampling:all: $PY cannot import numpy (apt-get install python3-numpy)"
	exit 0
fi
if [ ! -x "$BUILD/tests/test_sample" ]; then
	echo "FAIL ref_sampling:setup: no $BUILD/tests/test_sample (make tests)"
	exit 1
fi
if ! KT_SAMPLE_DUMP="$T/cases.jsonl" "$BUILD/tests/test_sample" dump_cases >"$T/dump.log" 2>&1; then
	echo "FAIL ref_sampling:dump: test_sample dump_cases failed: $(tail -n 3 "$T/dump.log" | tr '\n' ' ')"
	exit 1
fi
"$PY" "$ROOT/tests/ref/sampling_ref.py" "$T/cases.jsonl"
