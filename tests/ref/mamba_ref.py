#!/usr/bin/python3
"""tests/ref/mamba_ref.py - a PyTorch reference of the Mamba-2 hybrids
(Granite 4.0-H: granitemoehybrid; Nemotron-H: nemotron_h), written from
the model definitions (docs/engine.md "Mamba-2"), for tests/ref/mamba_ref.sh.

The SSD scan runs in two forms:
  recurrent  token by token: S = S exp(dt A) + dt x B^T, y = S C + D x
  chunked    the state-space-duality form transformers' torch_forward uses
             for prefill: chunks of L tokens, the intra-chunk part as a
             masked matrix product with exp(segment sums of dt A), the
             inter-chunk part through the chunk states, an initial state
kvkeep's engine always runs the recurrent order (one kernel for prefill and
decode, docs/engine.md). --chunk-sizes checks the chunked form against the
recurrent one at each size (their difference is rounding only) and writes
the logits of the whole model run with the chunked scan too.

Outputs: --logits-out (every position, f32 [n][vocab]), --state-out (per
Mamba layer conv state [C][K-1] then S [H][P][N], f32: kvkeep's snapshot
layout).
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_model import load_weights, write_safetensors, compare_logits, compare_state  # noqa: E402


def load_cfg(d):
    with open(os.path.join(d, "config.json")) as f:
        text = f.read()
    # Python's json reads its own bare Infinity
    return json.loads(text)


def rms(x, w, eps):
    x = x.float()
    v = x.pow(2).mean(-1, keepdim=True)
    return (x * torch.rsqrt(v + eps)) * w


# --- the scan -------------------------------------------------------------------

def scan_recurrent(x, dt, A, B, C, D, S0):
    """x [T,H,P], dt [T,H], A [H], B/C [T,H,N] (per head), D [H], S0 [H,P,N]."""
    S = S0.clone()
    ys = []
    for t in range(x.shape[0]):
        dA = torch.exp(dt[t] * A)                                    # [H]
        dBx = (dt[t][:, None, None] * B[t][:, None, :]) * x[t][:, :, None]  # [H,P,N]
        S = S * dA[:, None, None] + dBx
        y = torch.einsum("hpn,hn->hp", S, C[t]) + D[:, None] * x[t]
        ys.append(y)
    return torch.stack(ys), S


def segsum(a):
    """a [..., L] -> [..., L, L]: sum of a[j+1..i] for i >= j, -inf above."""
    L = a.shape[-1]
    a = a[..., None].expand(*a.shape, L)
    mask = torch.tril(torch.ones(L, L, dtype=torch.bool), diagonal=-1)
    a = a.masked_fill(~mask, 0)
    s = torch.cumsum(a, dim=-2)
    mask = torch.tril(torch.ones(L, L, dtype=torch.bool), diagonal=0)
    return s.masked_fill(~mask, -torch.inf)


def scan_chunked(x, dt, A, B, C, D, S0, L):
    """The SSD form over chunks of L tokens (mathematically the recurrence)."""
    T, H, P = x.shape
    N = B.shape[-1]
    pad = (-T) % L
    X = x * dt[..., None]
    Adt = A[None, :] * dt                                      # [T,H]
    if pad:
        X = F.pad(X, (0, 0, 0, 0, 0, pad))
        Adt = F.pad(Adt, (0, 0, 0, pad))
        B = F.pad(B, (0, 0, 0, 0, 0, pad))
        C = F.pad(C, (0, 0, 0, 0, 0, pad))
    c = X.shape[0] // L
    X = X.reshape(c, L, H, P)
    Bc = B.reshape(c, L, H, N)
    Cc = C.reshape(c, L, H, N)
    Ac = Adt.reshape(c, L, H).permute(2, 0, 1)                 # [H,c,L]
    Acum = torch.cumsum(Ac, dim=-1)
    Lm = torch.exp(segsum(Ac))                                 # [H,c,L,L]
    Ydiag = torch.einsum("clhn,cshn,hcls,cshp->clhp", Cc, Bc, Lm, X)
    decay = torch.exp(Acum[:, :, -1:] - Acum)                  # [H,c,L]
    states = torch.einsum("clhn,hcl,clhp->chpn", Bc, decay, X)  # [c,H,P,N]
    states = torch.cat([S0[None], states], dim=0)
    dchunk = torch.exp(segsum(F.pad(Acum[:, :, -1], (1, 0))))  # [H,c+1,c+1]
    new = torch.einsum("hzc,chpn->zhpn", dchunk, states)
    states, final = new[:-1], new[-1]
    Yoff = torch.einsum("clhn,chpn,hcl->clhp", Cc, states, torch.exp(Acum))
    Y = (Ydiag + Yoff).reshape(c * L, H, P)[:T]
    return Y + D[None, :, None] * x, final


# --- the model ----------------------------------------------------------------------

class Model:
    def __init__(self, d):
        j = load_cfg(d)
        self.j = j
        self.W = load_weights(d)
        self.granite = j["model_type"] == "granitemoehybrid"
        g = self.granite
        self.D = j["hidden_size"]
        self.n_layers = j["num_hidden_layers"]
        self.heads = j["num_attention_heads"]
        self.kv = j["num_key_value_heads"]
        if g:
            self.types = ["M" if t == "mamba" else "*" for t in j["layer_types"]]
            self.hd = self.D // self.heads
            self.eps = j["rms_norm_eps"]
            self.H = j["mamba_n_heads"]
            self.P = j["mamba_d_head"]
            self.N = j["mamba_d_state"]
            self.G = j["mamba_n_groups"]
            self.K = j["mamba_d_conv"]
            self.norm_groups = 1
            self.pre = "model."
            self.scale = j["attention_multiplier"]
        else:
            self.types = list(j["hybrid_override_pattern"])
            self.hd = j["head_dim"]
            self.eps = j["layer_norm_epsilon"]
            self.H = j["mamba_num_heads"]
            self.P = j["mamba_head_dim"]
            self.N = j["ssm_state_size"]
            self.G = j["n_groups"]
            self.K = j["conv_kernel"]
            self.norm_groups = self.G
            self.pre = "backbone."
            self.scale = self.hd ** -0.5

    def w(self, name):
        return self.W[self.pre + name].float()

    def attention(self, l, h):
        a = "self_attn" if self.granite else "mixer"
        T = h.shape[0]
        q = (h @ self.w(f"layers.{l}.{a}.q_proj.weight").T).view(T, self.heads, self.hd)
        k = (h @ self.w(f"layers.{l}.{a}.k_proj.weight").T).view(T, self.kv, self.hd)
        v = (h @ self.w(f"layers.{l}.{a}.v_proj.weight").T).view(T, self.kv, self.hd)
        rep = self.heads // self.kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = torch.einsum("thd,shd->hts", q, k) * self.scale
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        s = s.masked_fill(mask, -torch.inf)
        p = torch.softmax(s, dim=-1)
        o = torch.einsum("hts,shd->thd", p, v).reshape(T, self.heads * self.hd)
        return o @ self.w(f"layers.{l}.{a}.o_proj.weight").T

    def mamba(self, l, h, chunk, stats):
        m = "mamba" if self.granite else "mixer"
        T = h.shape[0]
        H, P, N, G, K = self.H, self.P, self.N, self.G, self.K
        Wd = H * P
        C = Wd + 2 * G * N
        proj = h @ self.w(f"layers.{l}.{m}.in_proj.weight").T
        z, xbc, dt = proj[:, :Wd], proj[:, Wd:Wd + C], proj[:, Wd + C:]
        cw = self.w(f"layers.{l}.{m}.conv1d.weight").reshape(C, K)
        pad = torch.cat([torch.zeros(K - 1, C), xbc], dim=0)   # [T+K-1, C]
        conv = torch.zeros(T, C)
        for k in range(K):
            conv = conv + pad[k:k + T] * cw[:, k]
        bname = self.pre + f"layers.{l}.{m}.conv1d.bias"
        if bname in self.W:
            conv = conv + self.W[bname].float()
        conv_state = pad[-(K - 1):].T.contiguous()              # [C, K-1], oldest first
        xbc = F.silu(conv)
        x = xbc[:, :Wd].view(T, H, P)
        B = xbc[:, Wd:Wd + G * N].view(T, G, N).repeat_interleave(H // G, dim=1)
        Cm = xbc[:, Wd + G * N:].view(T, G, N).repeat_interleave(H // G, dim=1)
        dt = F.softplus(dt + self.w(f"layers.{l}.{m}.dt_bias"))
        A = -torch.exp(self.w(f"layers.{l}.{m}.A_log"))
        D = self.w(f"layers.{l}.{m}.D")
        S0 = torch.zeros(H, P, N)
        y, S = scan_recurrent(x, dt, A, B, Cm, D, S0)
        for L in stats["chunks"]:
            yc, Sc = scan_chunked(x, dt, A, B, Cm, D, S0, L)
            e = max((yc - y).abs().max().item() / max(y.abs().max().item(), 1e-30),
                    (Sc - S).abs().max().item() / max(S.abs().max().item(), 1e-30))
            stats["diff"][L] = max(stats["diff"].get(L, 0.0), e)
        if chunk:
            y, S = scan_chunked(x, dt, A, B, Cm, D, S0, chunk)
        g = y.reshape(T, Wd) * F.silu(z)
        gs = Wd // self.norm_groups
        nw = self.w(f"layers.{l}.{m}.norm.weight")
        g = torch.cat([rms(g[:, i * gs:(i + 1) * gs], nw[i * gs:(i + 1) * gs], self.eps)
                       for i in range(self.norm_groups)], dim=1)
        out = g @ self.w(f"layers.{l}.{m}.out_proj.weight").T
        stats["states"].append((conv_state, S))
        return out

    def granite_ffn(self, l, h):
        j = self.j
        Is = j["shared_intermediate_size"]
        si = self.w(f"layers.{l}.shared_mlp.input_linear.weight")
        so = self.w(f"layers.{l}.shared_mlp.output_linear.weight")
        gu = h @ si.T
        shared = (F.silu(gu[:, :Is]) * gu[:, Is:]) @ so.T
        E = j.get("num_local_experts", 0)
        if not E:
            return shared
        k = j["num_experts_per_tok"]
        I = j["intermediate_size"]
        logits = h @ self.w(f"layers.{l}.block_sparse_moe.router.layer.weight").T
        tl, ti = logits.topk(k, dim=-1)
        gates = torch.softmax(tl, dim=-1)
        inp = self.w(f"layers.{l}.block_sparse_moe.input_linear.weight")   # [E, 2I, D]
        outw = self.w(f"layers.{l}.block_sparse_moe.output_linear.weight")  # [E, D, I]
        y = torch.zeros_like(h)
        for t in range(h.shape[0]):
            order = torch.argsort(ti[t])   # experts in ascending id, as index_add sums them
            for r in order.tolist():
                e = int(ti[t, r])
                a = inp[e] @ h[t]
                o = outw[e] @ (F.silu(a[:I]) * a[I:])
                y[t] = y[t] + o * gates[t, r]
        return y + shared

    def forward(self, toks, chunk, stats):
        g = self.granite
        emb = self.w("embed_tokens.weight" if g else "embeddings.weight")
        x = emb[torch.tensor(toks)]
        rm = self.j.get("residual_multiplier", 1.0) if g else 1.0
        if g:
            x = x * self.j["embedding_multiplier"]
        for l in range(self.n_layers):
            t = self.types[l]
            h = rms(x, self.w(f"layers.{l}.input_layernorm.weight" if g else f"layers.{l}.norm.weight"), self.eps)
            if t == "M":
                o = self.mamba(l, h, chunk, stats)
            elif t == "*":
                o = self.attention(l, h)
            else:
                u = h @ self.w(f"layers.{l}.mixer.up_proj.weight").T
                o = torch.relu(u) ** 2 @ self.w(f"layers.{l}.mixer.down_proj.weight").T
            x = x + o * rm
            if g:
                h = rms(x, self.w(f"layers.{l}.post_attention_layernorm.weight"), self.eps)
                x = x + self.granite_ffn(l, h) * rm
        x = rms(x, self.w("norm.weight" if g else "norm_f.weight"), self.eps)
        head = self.W.get("lm_head.weight")
        head = emb if head is None else head.float()
        logits = x @ head.T
        if g:
            logits = logits / self.j["logits_scaling"]
        return logits


def dequant_mlx(src, dst):
    """An MLX affine folder as kvkeep (mlx-lm's names) writes these families
    -> a float32 Hugging Face folder of the same values: codes * scale +
    bias per group, the conv back to [C, 1, K], Granite's switch_mlp stacks
    back into block_sparse_moe.input_linear / output_linear and a dense
    Granite's mlp.* back into shared_mlp."""
    with open(os.path.join(src, "config.json")) as f:
        j = json.load(f)
    q = j["quantization"]
    W = load_weights(src)
    out = {}
    for name, t in W.items():
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        if isinstance(t, np.ndarray):  # U32 codes
            base = name[:-len(".weight")]
            o = q.get(base, q)
            bits, gs = o["bits"], o["group_size"]
            per = 32 // bits
            lead = t.shape[:-1]
            t2 = t.reshape(-1, t.shape[-1])
            rows, packed = t2.shape
            codes = np.zeros((rows, packed * per), dtype=np.int64)
            for i in range(per):
                codes[:, i::per] = (t2.astype(np.int64) >> (bits * i)) & ((1 << bits) - 1)
            sc = W[base + ".scales"].numpy().astype(np.float64).reshape(rows, -1)
            bi = W[base + ".biases"].numpy().astype(np.float64).reshape(rows, -1)
            g = np.repeat(np.arange(codes.shape[1] // gs), gs)
            t = torch.from_numpy((sc[:, g] * codes + bi[:, g]).astype(np.float32).reshape(*lead, codes.shape[1]))
        elif name.endswith("conv1d.weight") and t.ndim == 3 and t.shape[-1] == 1:
            t = t.permute(0, 2, 1).contiguous()
        out[name] = t.float()
    res = {}
    for name, t in out.items():
        if ".block_sparse_moe.switch_mlp.gate_proj." in name:
            up = out[name.replace("gate_proj", "up_proj")]
            res[name.replace("switch_mlp.gate_proj", "input_linear")] = torch.cat([t, up], dim=1)
        elif ".block_sparse_moe.switch_mlp.down_proj." in name:
            res[name.replace("switch_mlp.down_proj", "output_linear")] = t
        elif ".block_sparse_moe.switch_mlp.up_proj." in name:
            pass
        elif ".mlp.gate_proj." in name and "mixer" not in name:
            up = out[name.replace("gate_proj", "up_proj")]
            res[name.replace("mlp.gate_proj", "shared_mlp.input_linear")] = torch.cat([t, up], dim=0)
        elif ".mlp.down_proj." in name and "mixer" not in name:
            res[name.replace("mlp.down_proj", "shared_mlp.output_linear")] = t
        elif ".mlp.up_proj." in name and "mixer" not in name:
            pass
        else:
            res[name] = t
    os.makedirs(dst, exist_ok=True)
    write_safetensors(os.path.join(dst, "model.safetensors"), res)
    j.pop("quantization", None)
    j.pop("quantization_config", None)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(j, f, indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--tokens")
    ap.add_argument("--logits-out")
    ap.add_argument("--state-out")
    ap.add_argument("--ssd-chunk", type=int, default=0,
                    help="run the whole model with the chunked scan of this size (0: recurrent)")
    ap.add_argument("--chunk-sizes", default="",
                    help="comma list: check the chunked scan against the recurrent one at each size")
    ap.add_argument("--compare", nargs=2)
    ap.add_argument("--compare-state", nargs=2)
    ap.add_argument("--dequant-mlx", nargs=2)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.dequant_mlx:
        dequant_mlx(*a.dequant_mlx)
        return 0
    if a.compare:
        return compare_logits(a.compare[0], a.compare[1], a.vocab, a.tol)
    if a.compare_state:
        return compare_state(a.compare_state[0], a.compare_state[1], a.tol)
    m = Model(a.model)
    toks = [int(t) for t in a.tokens.split(",") if t.strip()]
    stats = {"chunks": [int(s) for s in a.chunk_sizes.split(",") if s.strip()], "diff": {}, "states": []}
    with torch.no_grad():
        logits = m.forward(toks, a.ssd_chunk, stats)
    logits.to(torch.float32).numpy().astype("<f4").tofile(a.logits_out)
    if a.state_out:
        parts = []
        for cs, S in stats["states"]:
            parts.append(cs.to(torch.float32).numpy().ravel())
            parts.append(S.to(torch.float32).numpy().ravel())
        np.concatenate(parts).astype("<f4").tofile(a.state_out)
    bad = 0
    for L, e in sorted(stats["diff"].items()):
        print(f"chunked SSD (chunk {L}) vs recurrent: max rel diff {e:.3e}")
        if e > 1e-4:
            bad = 1
    return bad


if __name__ == "__main__":
    sys.exit(main())
