#!/usr/bin/python3
"""eos_bias.py MODEL_DIR TOKEN_ID - make a synthetic model end its turns.

A model with random weights almost never samples its end-of-turn token, so
an agent CLI driven by it runs every answer to max_tokens (Claude Code then
fails the turn). This test fixture rewrites one row of lm_head.weight in
place: row TOKEN_ID becomes 8.0 in every column, so that token's logit is
8 x the sum of the final normalised hidden state - large and positive at
about half the positions - and the model ends a turn after a few tokens.
Only that row's bytes change; the file stays a valid safetensors file.
"""
import json
import struct
import sys

import numpy as np

model_dir, tok = sys.argv[1], int(sys.argv[2])
path = f"{model_dir}/model.safetensors"
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    t = header["lm_head.weight"]
    rows, cols = t["shape"]
    assert 0 <= tok < rows, f"token {tok} outside {rows} rows"
    size = {"BF16": 2, "F32": 4}[t["dtype"]]
    f.seek(8 + n + t["data_offsets"][0] + tok * cols * size)
    if t["dtype"] == "F32":
        f.write(np.full(cols, 8.0, dtype="<f4").tobytes())
    else:
        f.write(np.full(cols, 0x4100, dtype="<u2").tobytes())  # bf16 8.0
