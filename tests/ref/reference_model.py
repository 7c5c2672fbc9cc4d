#!/usr/bin/python3
"""Reference forward pass of kvkeep's model families, in PyTorch.

Implements the math of Hugging Face transformers' modeling code
(models/qwen3/modeling_qwen3.py, models/qwen3_next/modeling_qwen3_next.py,
models/qwen3_5/modular_qwen3_5.py, models/qwen3_5_moe/modeling_qwen3_5_moe.py,
including the sparse MoE blocks) from scratch, for one unbatched prompt
without a cache, and loads the same safetensors folder the C engine loads.
It is the oracle of tests/ref/engine_ref.sh; it shares no code with the
engine.

    reference_model.py --model DIR --tokens 1,2,3 --logits-out F [--state-out F]
        [--dtype float32|float64] [--check-chunked]
    reference_model.py --make-next SRC DST
        write a qwen3_next folder (fused in_proj_qkvz / in_proj_ba) holding
        the same weights as the qwen3_5 folder SRC.
    reference_model.py --split-experts SRC DST
        rewrite stacked experts (mlp.experts.gate_up_proj / down_proj) as
        per-expert tensors (mlp.experts.N.{gate,up,down}_proj.weight).
    reference_model.py --switch-experts SRC DST
        the same as mlx-lm's stacks (mlp.switch_mlp.{gate,up,down}_proj.weight).
    reference_model.py --dequant-mlx SRC DST
        write a float32 Hugging Face folder holding the exactly dequantized
        weights of the MLX quantized folder SRC (w = scale * q + bias per
        group, evaluated in float64 and rounded once to float32, i.e. a
        fused multiply-add; mlx-lm's names, conv shape and shifted norms
        mapped back to Hugging Face's).
    reference_model.py --to-f16 SRC DST
        the folder SRC with every 2-D matrix stored as F16 (rounded once).
    reference_model.py --compare A B --vocab V [--tol T]
    reference_model.py --compare-state A B [--tol T]

Outputs are raw little-endian float32: logits [n_tokens][vocab]; the state
is, per DeltaNet layer in order, conv state [conv_dim][K-1] (the last K-1
inputs of each channel, oldest first) then S [Hv][dk][dv] -- the snapshot
format of src/engine/layout.h.

Must run under Debian's /usr/bin/python3 (python3-torch, python3-numpy).
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

# --- safetensors ------------------------------------------------------------

def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        buf = raw[base + b: base + end]
        shape = e["shape"]
        dt = e["dtype"]
        if dt == "F32":
            a = np.frombuffer(buf, dtype="<f4").astype(np.float32)
        elif dt == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            a = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif dt == "U32":
            out[name] = np.frombuffer(buf, dtype="<u4").reshape(shape).copy()
            continue
        else:
            raise SystemExit(f"{path}: tensor {name}: dtype {dt} not handled by the reference")
        out[name] = torch.from_numpy(a.reshape(shape).copy())
    return out


def write_safetensors(path, tensors):
    header = {}
    off = 0
    blobs = []
    for name, t in tensors.items():
        a = t.detach().to(torch.float32).contiguous().numpy().astype("<f4")
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_weights(d):
    single = os.path.join(d, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        idx = json.load(f)
    w = {}
    for shard in sorted(set(idx["weight_map"].values())):
        w.update(read_safetensors(os.path.join(d, shard)))
    return w

# --- config -----------------------------------------------------------------

class Cfg:
    pass


def load_config(d):
    with open(os.path.join(d, "config.json")) as f:
        j = json.load(f)
    mt = j["model_type"]
    t = j.get("text_config", j) if mt in ("qwen3_5", "qwen3_5_moe") else j
    c = Cfg()
    c.model_type = mt
    c.hybrid = mt in ("qwen3_5", "qwen3_5_text", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text")
    c.fused = mt == "qwen3_next"
    c.hidden = t["hidden_size"]
    c.n_layers = t["num_hidden_layers"]
    c.n_heads = t["num_attention_heads"]
    c.n_kv = t.get("num_key_value_heads", c.n_heads)
    c.head_dim = t.get("head_dim", 256 if c.hybrid else 128)
    c.inter = t["intermediate_size"]
    c.vocab = t["vocab_size"]
    c.eps = t.get("rms_norm_eps", 1e-6)
    rp = t.get("rope_parameters") or {}
    c.theta = rp.get("rope_theta", t.get("rope_theta", 10000.0))
    c.partial = rp.get("partial_rotary_factor", t.get("partial_rotary_factor", 0.25 if c.hybrid else 1.0))
    c.tie = t.get("tie_word_embeddings", j.get("tie_word_embeddings", False))
    c.max_pos = t.get("max_position_embeddings", 32768)
    # RoPE scaling: the object (rope_parameters or rope_scaling) whose
    # rope_type is not default/mrope carries the keys.
    c.rope = {"rope_type": "default"}
    for o in (t.get("rope_parameters"), t.get("rope_scaling")):
        if o and o.get("rope_type", o.get("type", "default")) not in ("default", "mrope"):
            c.rope = dict(o)
            c.rope["rope_type"] = o.get("rope_type", o.get("type"))
    if c.hybrid:
        lt = t.get("layer_types")
        if lt is None:
            iv = t.get("full_attention_interval", 4)
            lt = ["full_attention" if (i + 1) % iv == 0 else "linear_attention" for i in range(c.n_layers)]
        c.layer_types = lt
        c.Hk = t["linear_num_key_heads"]
        c.Hv = t["linear_num_value_heads"]
        c.dk = t["linear_key_head_dim"]
        c.dv = t["linear_value_head_dim"]
        c.K = t["linear_conv_kernel_dim"]
    else:
        c.layer_types = ["full_attention"] * c.n_layers
    # Mixture of experts, as the decoder layers of modeling_qwen3_next.py
    # and modeling_qwen3_5_moe.py decide it.
    c.moe = [False] * c.n_layers
    if mt in ("qwen3_5_moe", "qwen3_5_moe_text"):
        c.moe = [True] * c.n_layers
        c.norm_topk = True
    elif mt == "qwen3_next" and t.get("num_experts", 512) > 0:
        mol = t.get("mlp_only_layers") or []
        step = t.get("decoder_sparse_step", 1)
        c.moe = [l not in mol and (l + 1) % step == 0 for l in range(c.n_layers)]
        c.norm_topk = t.get("norm_topk_prob", True)
    if any(c.moe):
        c.E = t.get("num_experts", 512 if mt == "qwen3_next" else 256)
        c.topk = t.get("num_experts_per_tok", 10 if mt == "qwen3_next" else 8)
    return c

# --- model ------------------------------------------------------------------

def rmsnorm(x, w, eps, plus_one):
    # Qwen3RMSNorm: w * (x * rsqrt(mean(x^2) + eps)); the hybrids' zero-centred
    # norm: (x * rsqrt(...)) * (1 + w)
    v = x.pow(2).mean(-1, keepdim=True)
    h = x * torch.rsqrt(v + eps)
    return h * (1.0 + w) if plus_one else w * h


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_inv_freq(c):
    """Inverse frequencies and the cos/sin factor, after transformers'
    modeling_rope_utils.py (_compute_default / _linear_scaling / _yarn)."""
    dim = int(c.head_dim * c.partial)
    base = c.theta
    r = c.rope
    kind = r["rope_type"]
    if kind == "default":
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))
        return inv, 1.0
    if kind == "linear":
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))
        return inv / r["factor"], 1.0
    assert kind == "yarn", kind
    orig = r.get("original_max_position_embeddings") or c.max_pos
    factor = r.get("factor")
    if factor is None:
        factor = c.max_pos / orig
    attention_factor = r.get("attention_factor")
    mscale, mscale_all_dim = r.get("mscale"), r.get("mscale_all_dim")

    def get_mscale(scale, m=1):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = r.get("beta_fast") or 32
    beta_slow = r.get("beta_slow") or 1

    def corr_dim(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if r.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    e = 1 - ramp
    return inter * (1 - e) + extra * e, attention_factor


def rope_cos_sin(c, n, dt):
    inv, af = rope_inv_freq(c)
    pos = torch.arange(n, dtype=torch.float32)
    freqs = torch.outer(pos, inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * af).to(dt), (emb.sin() * af).to(dt)


def attention(c, W, p, h, cos, sin, dt):
    n = h.shape[0]
    hd, H, Hkv = c.head_dim, c.n_heads, c.n_kv
    q = h @ W[p + "self_attn.q_proj.weight"].T
    if c.hybrid:
        q, gate = torch.chunk(q.view(n, H, 2 * hd), 2, dim=-1)
        gate = gate.reshape(n, H * hd)
    else:
        q = q.view(n, H, hd)
    k = (h @ W[p + "self_attn.k_proj.weight"].T).view(n, Hkv, hd)
    v = (h @ W[p + "self_attn.v_proj.weight"].T).view(n, Hkv, hd)
    q = rmsnorm(q, W[p + "self_attn.q_norm.weight"], c.eps, c.hybrid)
    k = rmsnorm(k, W[p + "self_attn.k_norm.weight"], c.eps, c.hybrid)
    rot = cos.shape[-1]
    cs, sn = cos[:, None, :], sin[:, None, :]
    q = torch.cat([q[..., :rot] * cs + rotate_half(q[..., :rot]) * sn, q[..., rot:]], dim=-1)
    k = torch.cat([k[..., :rot] * cs + rotate_half(k[..., :rot]) * sn, k[..., rot:]], dim=-1)
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)   # [heads, n, hd]
    rep = H // Hkv
    k = k.repeat_interleave(rep, dim=0)
    v = v.repeat_interleave(rep, dim=0)
    scores = (q @ k.transpose(1, 2)) * (hd ** -0.5)
    mask = torch.full((n, n), float("-inf"), dtype=dt).triu(1)
    probs = torch.softmax(scores + mask, dim=-1, dtype=dt)
    o = (probs @ v).transpose(0, 1).reshape(n, H * hd)
    if c.hybrid:
        o = o * torch.sigmoid(gate)
    return o @ W[p + "self_attn.o_proj.weight"].T


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def recurrent_rule(q, k, v, g, beta):
    # torch_recurrent_gated_delta_rule, one head group at a time: [n, Hv, d]
    n, Hv, dk = k.shape
    dv = v.shape[-1]
    S = torch.zeros(Hv, dk, dv, dtype=q.dtype)
    out = torch.zeros(n, Hv, dv, dtype=q.dtype)
    for t in range(n):
        S = S * g[t].exp()[:, None, None]
        kv_mem = (S * k[t][:, :, None]).sum(dim=-2)
        delta = (v[t] - kv_mem) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = (S * q[t][:, :, None]).sum(dim=-2)
    return out, S


def chunk_rule(q, k, v, g, beta, chunk=64):
    # torch_chunk_gated_delta_rule (Hugging Face's prefill algorithm), for the
    # cross-check of the recurrent form: q already scaled, [n, Hv, d].
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))   # [Hv, n, d]
    beta, g = beta.transpose(0, 1), g.transpose(0, 1)   # [Hv, n]
    Hv, n, dk = k.shape
    dv = v.shape[-1]
    pad = (chunk - n % chunk) % chunk
    q = F.pad(q, (0, 0, 0, pad)); k = F.pad(k, (0, 0, 0, pad)); v = F.pad(v, (0, 0, 0, pad))
    beta = F.pad(beta, (0, pad)); g = F.pad(g, (0, pad))
    T = n + pad
    vb = v * beta[..., None]
    kb = k * beta[..., None]
    q, k, v, kb, vb = (x.reshape(Hv, -1, chunk, x.shape[-1]) for x in (q, k, v, kb, vb))
    g = g.reshape(Hv, -1, chunk).cumsum(dim=-1)
    decay = ((g[..., :, None] - g[..., None, :]).tril().exp()).tril()
    mask = torch.triu(torch.ones(chunk, chunk, dtype=torch.bool), diagonal=0)
    attn = -((kb @ k.transpose(-1, -2)) * decay).masked_fill(mask, 0)
    for i in range(1, chunk):
        row = attn[..., i, :i].clone()
        sub = attn[..., :i, :i].clone()
        attn[..., i, :i] = row + (row[..., None] * sub).sum(-2)
    attn = attn + torch.eye(chunk, dtype=attn.dtype)
    value = attn @ vb
    kcum = attn @ (kb * g.exp()[..., None])
    S = torch.zeros(Hv, dk, dv, dtype=q.dtype)
    out = torch.zeros_like(value)
    mask = torch.triu(torch.ones(chunk, chunk, dtype=torch.bool), diagonal=1)
    for i in range(T // chunk):
        qi, ki, vi = q[:, i], k[:, i], value[:, i]
        a = (qi @ ki.transpose(-1, -2) * decay[:, i]).masked_fill_(mask, 0)
        vnew = vi - kcum[:, i] @ S
        out[:, i] = (qi * g[:, i, :, None].exp()) @ S + a @ vnew
        S = S * g[:, i, -1, None, None].exp() + (ki * (g[:, i, -1, None] - g[:, i]).exp()[..., None]).transpose(-1, -2) @ vnew
    out = out.reshape(Hv, -1, dv)[:, :n].transpose(0, 1)
    return out, S


def deltanet(c, W, p, h, dt, check_chunked, stats):
    n = h.shape[0]
    Hk, Hv, dk, dv, K = c.Hk, c.Hv, c.dk, c.dv, c.K
    r = Hv // Hk
    kd, vd = Hk * dk, Hv * dv
    if c.fused:
        # fix_query_key_value_ordering: per key head g, [q_g | k_g | v_g (r dv) | z_g (r dv)], [b_g (r) | a_g (r)]
        qkvz = (h @ W[p + "linear_attn.in_proj_qkvz.weight"].T).view(n, Hk, 2 * dk + 2 * r * dv)
        ba = (h @ W[p + "linear_attn.in_proj_ba.weight"].T).view(n, Hk, 2 * r)
        qq, kk, vv, z = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=2)
        b, a = torch.split(ba, [r, r], dim=2)
        mixed = torch.cat([qq.reshape(n, kd), kk.reshape(n, kd), vv.reshape(n, vd)], dim=-1)
        z = z.reshape(n, Hv, dv)
        b = b.reshape(n, Hv)
        a = a.reshape(n, Hv)
    else:
        mixed = h @ W[p + "linear_attn.in_proj_qkv.weight"].T
        z = (h @ W[p + "linear_attn.in_proj_z.weight"].T).view(n, Hv, dv)
        b = h @ W[p + "linear_attn.in_proj_b.weight"].T
        a = h @ W[p + "linear_attn.in_proj_a.weight"].T
    C = mixed.shape[-1]
    x = mixed.T[None]                                   # [1, C, n]
    conv_state = F.pad(x, (K - 1, 0))[0, :, -(K - 1):] if K > 1 else x[0, :, :0]
    w = W[p + "linear_attn.conv1d.weight"]              # [C, 1, K]
    y = F.silu(F.conv1d(x, w, None, padding=K - 1, groups=C)[:, :, :n])[0].T   # [n, C]
    q, k, v = torch.split(y, [kd, kd, vd], dim=-1)
    q = l2norm(q.reshape(n, Hk, dk))
    k = l2norm(k.reshape(n, Hk, dk))
    v = v.reshape(n, Hv, dv)
    beta = b.sigmoid()
    g = -W[p + "linear_attn.A_log"].exp() * F.softplus(a + W[p + "linear_attn.dt_bias"])
    q = q.repeat_interleave(r, dim=1) * (1.0 / dk ** 0.5)
    k = k.repeat_interleave(r, dim=1)
    core, S = recurrent_rule(q, k, v, g, beta)
    if check_chunked:
        core2, S2 = chunk_rule(q, k, v, g, beta)
        stats.append(max(float((core - core2).abs().max() / core.abs().max()),
                         float((S - S2).abs().max() / S.abs().max())))
    nw = W[p + "linear_attn.norm.weight"]
    vv = core.reshape(n * Hv, dv)
    hn = vv * torch.rsqrt(vv.pow(2).mean(-1, keepdim=True) + c.eps)
    hn = (nw * hn) * F.silu(z.reshape(n * Hv, dv))
    out = hn.reshape(n, vd) @ W[p + "linear_attn.out_proj.weight"].T
    return out, conv_state, S


def sparse_moe(c, W, p, h):
    # Qwen3NextSparseMoeBlock / Qwen3_5MoeSparseMoeBlock: softmax router,
    # top-k, optional renormalisation, experts summed by index_add_ in
    # ascending expert id, plus the sigmoid-gated shared expert. Experts
    # are read from the stacked tensors (experts.gate_up_proj / down_proj)
    # or the per-expert ones (experts.N.{gate,up,down}_proj.weight).
    n, D = h.shape
    logits = h @ W[p + "gate.weight"].T
    probs = F.softmax(logits, dim=-1, dtype=torch.float)
    top_w, top_i = torch.topk(probs, c.topk, dim=-1)
    if c.norm_topk:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    top_w = top_w.to(h.dtype)
    out = torch.zeros_like(h)
    stacked = (p + "experts.gate_up_proj") in W
    switch = (p + "switch_mlp.gate_proj.weight") in W
    for e in range(c.E):
        tok, pos = torch.where(top_i == e)
        if tok.numel() == 0:
            continue
        xs = h[tok]
        if stacked:
            gate, up = (xs @ W[p + "experts.gate_up_proj"][e].T).chunk(2, dim=-1)
            y = (F.silu(gate) * up) @ W[p + "experts.down_proj"][e].T
        elif switch:
            q = p + "switch_mlp."
            y = (F.silu(xs @ W[q + "gate_proj.weight"][e].T) * (xs @ W[q + "up_proj.weight"][e].T)) @ W[q + "down_proj.weight"][e].T
        else:
            q = f"{p}experts.{e}."
            y = (F.silu(xs @ W[q + "gate_proj.weight"].T) * (xs @ W[q + "up_proj.weight"].T)) @ W[q + "down_proj.weight"].T
        out.index_add_(0, tok, y * top_w[tok, pos, None])
    s = F.silu(h @ W[p + "shared_expert.gate_proj.weight"].T) * (h @ W[p + "shared_expert.up_proj.weight"].T)
    s = s @ W[p + "shared_expert.down_proj.weight"].T
    s = torch.sigmoid(h @ W[p + "shared_expert_gate.weight"].T) * s
    return out + s


def forward(c, W, tokens, dt, check_chunked=False):
    pre = "model.language_model." if "model.language_model.embed_tokens.weight" in W else "model."
    W = {k: v.to(dt) for k, v in W.items()}
    n = len(tokens)
    x = W[pre + "embed_tokens.weight"][torch.tensor(tokens)]
    cos, sin = rope_cos_sin(c, n, dt)
    states = []
    stats = []
    for l in range(c.n_layers):
        p = f"{pre}layers.{l}."
        h = rmsnorm(x, W[p + "input_layernorm.weight"], c.eps, c.hybrid)
        if c.layer_types[l] == "full_attention":
            x = x + attention(c, W, p, h, cos, sin, dt)
        else:
            o, cs, S = deltanet(c, W, p, h, dt, check_chunked, stats)
            states.append((cs, S))
            x = x + o
        h = rmsnorm(x, W[p + "post_attention_layernorm.weight"], c.eps, c.hybrid)
        if c.moe[l]:
            x = x + sparse_moe(c, W, p + "mlp.", h)
            continue
        m = F.silu(h @ W[p + "mlp.gate_proj.weight"].T) * (h @ W[p + "mlp.up_proj.weight"].T)
        x = x + m @ W[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, W[pre + "norm.weight"], c.eps, c.hybrid)
    head = W[pre + "embed_tokens.weight"] if c.tie else W["lm_head.weight"]
    return x @ head.T, states, stats, x


def mtp(c, W, hidden, tokens, dt):
    # The multi-token-prediction head (Qwen3.5 / Qwen3-Next mtp.*), written
    # from its definition: row t takes the model's final (normed) hidden
    # state at t and the embedding of token t + 1, fc([norm(e) | norm(h)]),
    # one full-attention decoder layer over positions 0..n-1, its own
    # final norm, the model's lm_head: the logits of token t + 2.
    pre = "model.language_model." if "model.language_model.embed_tokens.weight" in W else "model."
    W = {k: v.to(dt) for k, v in W.items()}
    n = len(tokens) - 1
    e = W[pre + "embed_tokens.weight"][torch.tensor(tokens[1:])]
    h = hidden[:n].to(dt)
    cat = torch.cat([rmsnorm(e, W["mtp.pre_fc_norm_embedding.weight"], c.eps, c.hybrid),
                     rmsnorm(h, W["mtp.pre_fc_norm_hidden.weight"], c.eps, c.hybrid)], dim=-1)
    x = cat @ W["mtp.fc.weight"].T
    cos, sin = rope_cos_sin(c, n, dt)
    p = "mtp.layers.0."
    x = x + attention(c, W, p, rmsnorm(x, W[p + "input_layernorm.weight"], c.eps, c.hybrid), cos, sin, dt)
    hh = rmsnorm(x, W[p + "post_attention_layernorm.weight"], c.eps, c.hybrid)
    if (p + "mlp.gate.weight") in W:
        x = x + sparse_moe(c, W, p + "mlp.", hh)
    else:
        x = x + (F.silu(hh @ W[p + "mlp.gate_proj.weight"].T) * (hh @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
    g = rmsnorm(x, W["mtp.norm.weight"], c.eps, c.hybrid)
    head = W[pre + "embed_tokens.weight"] if c.tie else W["lm_head.weight"]
    return g @ head.T

# --- tools ------------------------------------------------------------------

def split_experts(src, dst, switch=False):
    """stacked experts.gate_up_proj / down_proj -> experts.N.{gate,up,down}_proj.weight
    (or, switch, mlx-lm's switch_mlp.{gate,up,down}_proj.weight stacks)."""
    W = load_weights(src)
    out = {}
    for name, t in W.items():
        if switch and name.endswith(".mlp.experts.gate_up_proj"):
            base = name[: -len("experts.gate_up_proj")] + "switch_mlp."
            I = t.shape[1] // 2
            out[base + "gate_proj.weight"] = t[:, :I].contiguous()
            out[base + "up_proj.weight"] = t[:, I:].contiguous()
        elif switch and name.endswith(".mlp.experts.down_proj"):
            out[name[: -len("experts.down_proj")] + "switch_mlp.down_proj.weight"] = t.contiguous()
        elif name.endswith(".mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            I = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :I].contiguous()
                out[f"{base}{e}.up_proj.weight"] = t[e, I:].contiguous()
        elif name.endswith(".mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[name] = t
    os.makedirs(dst, exist_ok=True)
    write_safetensors(os.path.join(dst, "model.safetensors"), out)
    for fn in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        s = os.path.join(src, fn)
        if os.path.exists(s):
            with open(s, "rb") as f, open(os.path.join(dst, fn), "wb") as g:
                g.write(f.read())


def make_next(src, dst):
    """qwen3_5 folder -> qwen3_next folder with fused projections, same math."""
    c = load_config(src)
    W = load_weights(src)
    pre = "model.language_model." if "model.language_model.embed_tokens.weight" in W else "model."
    Hk, Hv, dk, dv = c.Hk, c.Hv, c.dk, c.dv
    r = Hv // Hk
    kd, vd = Hk * dk, Hv * dv
    out = {}
    for name, t in W.items():
        nn = "model." + name[len(pre):] if name.startswith(pre) else name
        if ".linear_attn.in_proj_" in name:
            continue
        out[nn] = t
    for l in range(c.n_layers):
        if c.layer_types[l] != "linear_attention":
            continue
        p = f"{pre}layers.{l}.linear_attn."
        qkv, z = W[p + "in_proj_qkv.weight"], W[p + "in_proj_z.weight"]
        b, a = W[p + "in_proj_b.weight"], W[p + "in_proj_a.weight"]
        rows, ba = [], []
        for g in range(Hk):
            rows += [qkv[g * dk:(g + 1) * dk], qkv[kd + g * dk: kd + (g + 1) * dk],
                     qkv[2 * kd + g * r * dv: 2 * kd + (g + 1) * r * dv], z[g * r * dv:(g + 1) * r * dv]]
            ba += [b[g * r:(g + 1) * r], a[g * r:(g + 1) * r]]
        q = f"model.layers.{l}.linear_attn."
        out[q + "in_proj_qkvz.weight"] = torch.cat(rows, 0)
        out[q + "in_proj_ba.weight"] = torch.cat(ba, 0)
    os.makedirs(dst, exist_ok=True)
    write_safetensors(os.path.join(dst, "model.safetensors"), out)
    with open(os.path.join(src, "config.json")) as f:
        j = json.load(f)
    t = dict(j.get("text_config", j))
    t["model_type"] = "qwen3_next"
    t["architectures"] = ["Qwen3NextForCausalLM"]
    t["num_experts"] = 0
    t["layer_types"] = c.layer_types
    t.pop("text_config", None)
    for k in ("eos_token_id", "bos_token_id", "tie_word_embeddings"):
        if k in j and k not in t:
            t[k] = j[k]
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(t, f, indent=2)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        s = os.path.join(src, fn)
        if os.path.exists(s):
            with open(s, "rb") as f, open(os.path.join(dst, fn), "wb") as g:
                g.write(f.read())


def dequant_mlx(src, dst):
    """MLX affine folder -> float32 Hugging Face folder, same values."""
    with open(os.path.join(src, "config.json")) as f:
        j = json.load(f)
    q = j["quantization"]
    W = load_weights(src)
    out = {}
    sanitized = any(k.endswith("conv1d.weight") and tuple(v.shape)[-1] == 1 and v.ndim == 3 for k, v in W.items())
    norm_sfx = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                ".q_norm.weight", ".k_norm.weight")
    for name, t in W.items():
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        if isinstance(t, np.ndarray):  # U32 codes
            base = name[:-len(".weight")]
            o = q.get(base, q)
            bits, gs = o["bits"], o["group_size"]
            per = 32 // bits
            lead = t.shape[:-1]  # [rows] or mlx-lm's SwitchGLU [E, rows]
            t2 = t.reshape(-1, t.shape[-1])
            rows, packed = t2.shape
            codes = np.zeros((rows, packed * per), dtype=np.int64)
            for i in range(per):
                codes[:, i::per] = (t2.astype(np.int64) >> (bits * i)) & ((1 << bits) - 1)
            sc = W[base + ".scales"].numpy().astype(np.float64).reshape(rows, -1)
            bi = W[base + ".biases"].numpy().astype(np.float64).reshape(rows, -1)
            g = np.repeat(np.arange(codes.shape[1] // gs), gs)
            w = (sc[:, g] * codes + bi[:, g]).astype(np.float32)
            t = torch.from_numpy(w.reshape(*lead, codes.shape[1]))
        elif name.endswith("conv1d.weight") and sanitized:
            t = t.permute(0, 2, 1).contiguous()
        if sanitized and any(name.endswith(x) for x in norm_sfx) and t.ndim == 1:
            t = t - 1.0  # exact for the weights near 1 that norms hold
        if name.startswith("language_model.model."):
            name = "model.language_model." + name[len("language_model.model."):]
        elif name.startswith("language_model."):
            name = name[len("language_model."):]
        out[name] = t
    os.makedirs(dst, exist_ok=True)
    write_safetensors(os.path.join(dst, "model.safetensors"), out)
    j.pop("quantization", None)
    j.pop("quantization_config", None)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(j, f, indent=2)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        s = os.path.join(src, fn)
        if os.path.exists(s):
            with open(s, "rb") as f, open(os.path.join(dst, fn), "wb") as g:
                g.write(f.read())


def to_f16(src, dst):
    """Copy a folder with its matrices as F16 (vectors stay F32)."""
    W = load_weights(src)
    header, blobs, off = {}, [], 0
    for name, t in W.items():
        a = t.numpy()
        if a.ndim == 2:
            b, dt = a.astype("<f2").tobytes(), "F16"
        else:
            b, dt = a.astype("<f4").tobytes(), "F32"
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    os.makedirs(dst, exist_ok=True)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    for fn in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        s = os.path.join(src, fn)
        if os.path.exists(s):
            with open(s, "rb") as f, open(os.path.join(dst, fn), "wb") as g:
                g.write(f.read())


def compare_logits(a, b, vocab, tol):
    x = np.fromfile(a, dtype="<f4")
    y = np.fromfile(b, dtype="<f4")
    if x.size != y.size or x.size % vocab:
        print(f"size mismatch: {a} has {x.size} floats, {b} has {y.size} (vocab {vocab})")
        return 1
    x = x.reshape(-1, vocab).astype(np.float64)
    y = y.reshape(-1, vocab).astype(np.float64)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        print("non-finite logits")
        return 1
    # per position: max |engine - ref| / max |ref|
    err = np.abs(x - y).max(axis=1) / np.maximum(np.abs(y).max(axis=1), 1e-30)
    agree = int((x.argmax(axis=1) == y.argmax(axis=1)).sum())
    print(f"positions {x.shape[0]}: max rel err {err.max():.3e} (worst at {int(err.argmax())}), "
          f"mean {err.mean():.3e}, argmax agrees at {agree}/{x.shape[0]}, tol {tol:g}")
    return 0 if err.max() <= tol else 1


def compare_state(a, b, tol):
    x = np.fromfile(a, dtype="<f4").astype(np.float64)
    y = np.fromfile(b, dtype="<f4").astype(np.float64)
    if x.size != y.size or x.size == 0:
        print(f"state size mismatch: {x.size} vs {y.size} floats")
        return 1
    err = np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)
    print(f"state floats {x.size}: max rel err {err:.3e}, tol {tol:g}")
    return 0 if err <= tol else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--tokens")
    ap.add_argument("--logits-out")
    ap.add_argument("--state-out")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--check-chunked", action="store_true")
    ap.add_argument("--make-next", nargs=2)
    ap.add_argument("--split-experts", nargs=2)
    ap.add_argument("--switch-experts", nargs=2)
    ap.add_argument("--compare", nargs=2)
    ap.add_argument("--dequant-mlx", nargs=2)
    ap.add_argument("--to-f16", nargs=2)
    ap.add_argument("--compare-state", nargs=2)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--mtp-logits-out")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.make_next:
        make_next(*a.make_next)
        return 0
    if a.split_experts:
        split_experts(*a.split_experts)
        return 0
    if a.switch_experts:
        split_experts(*a.switch_experts, switch=True)
        return 0
    if a.to_f16:
        to_f16(*a.to_f16)
        return 0
    if a.dequant_mlx:
        dequant_mlx(*a.dequant_mlx)
        return 0
    if a.compare:
        return compare_logits(a.compare[0], a.compare[1], a.vocab, a.tol)
    if a.compare_state:
        return compare_state(a.compare_state[0], a.compare_state[1], a.tol)
    c = load_config(a.model)
    W = load_weights(a.model)
    toks = [int(t) for t in a.tokens.split(",") if t.strip()]
    dt = torch.float64 if a.dtype == "float64" else torch.float32
    with torch.no_grad():
        logits, states, stats, hidden = forward(c, W, toks, dt, a.check_chunked)
        if a.mtp_logits_out:
            mtp(c, W, hidden, toks, dt).to(torch.float32).numpy().astype("<f4").tofile(a.mtp_logits_out)
    logits.to(torch.float32).numpy().astype("<f4").tofile(a.logits_out)
    if a.state_out:
        parts = []
        for cs, S in states:
            parts.append(cs.to(torch.float32).numpy().ravel())
            parts.append(S.to(torch.float32).numpy().ravel())
        (np.concatenate(parts) if parts else np.zeros(0, np.float32)).astype("<f4").tofile(a.state_out)
    if a.check_chunked and stats:
        worst = max(stats)
        print(f"chunked vs recurrent delta rule: max rel diff {worst:.3e}")
        if worst > 1e-4:
            print("the chunked and recurrent forms disagree")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
