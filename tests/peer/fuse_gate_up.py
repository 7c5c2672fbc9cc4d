#!/usr/bin/env python3
"""tests/peer/fuse_gate_up.py IN.gguf OUT.gguf - rewrites an F32 MoE GGUF with
each layer's ffn_gate_exps and ffn_up_exps [E][I][D] stacks fused into
llama.cpp's ffn_gate_up_exps [E][2I][D] (expert e: its gate rows, then its up
rows), everything else byte for byte. Needs llama.cpp's gguf-py on
PYTHONPATH (build/peer/gguf-py, tests/peer/build.sh)."""
import sys, struct, numpy as np
from gguf import GGUFReader
src, dst = sys.argv[1], sys.argv[2]
r = GGUFReader(src)
raw = open(src, "rb").read()
ts = list(r.tensors)
kv_end = min(t.field.offset for t in ts)
by = {t.name: t for t in ts}
out = []  # (name, ne list, type, bytes)
for t in ts:
    if t.name.endswith("ffn_up_exps.weight"):
        continue
    if t.name.endswith("ffn_gate_exps.weight"):
        u = by[t.name.replace("ffn_gate_exps", "ffn_up_exps")]
        assert t.tensor_type == 0 and u.tensor_type == 0  # F32 stacks
        g, up = np.asarray(t.data), np.asarray(u.data)  # (E, I, D)
        f = np.concatenate([g, up], axis=1)
        out.append((t.name.replace("ffn_gate_exps", "ffn_gate_up_exps"), [f.shape[2], f.shape[1], f.shape[0]], 0,
                    f.astype("<f4").tobytes()))
        continue
    out.append((t.name, [int(x) for x in t.shape], int(t.tensor_type), np.asarray(t.data).tobytes()))
A = r.alignment
hdr = bytearray(raw[:kv_end])
struct.pack_into("<Q", hdr, 8, len(out))
infos, data, off = b"", b"", 0
for name, ne, ty, b in out:
    n = name.encode()
    infos += struct.pack("<Q", len(n)) + n + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", x) for x in ne)
    infos += struct.pack("<IQ", ty, off)
    pad = (-len(b)) % A
    data += b + b"\0" * pad
    off += len(b) + pad
body = bytes(hdr) + infos
body += b"\0" * ((-len(body)) % A)
open(dst, "wb").write(body + data)
