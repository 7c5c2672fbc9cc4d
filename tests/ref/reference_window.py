#!/usr/bin/python3
"""Reference forward pass of the sliding-window families, in PyTorch.

Llama 3.x (models/llama/modeling_llama.py with the "llama3" rope of
modeling_rope_utils.py), Gemma 3 (models/gemma3/modeling_gemma3.py,
Gemma3ForCausalLM), GPT-OSS (models/gpt_oss/modeling_gpt_oss.py) and the
dense Gemma 4 (llama.cpp's gemma4 graph: per-layer-type head sizes and KV
heads, K = V on the global layers, V normed without a weight, softmax
scale 1, "proportional" RoPE on the global layers, layer_scalar),
written from the definitions in docs/engine.md for one unbatched prompt
without a cache, and reading the safetensors folder the C engine reads
(GPT-OSS experts in the MXFP4 release layout, dequantized here on their
own). Sliding layers use an explicit mask (query p sees keys p - W + 1 ..
p); GPT-OSS's sinks join the softmax as one more column that is dropped.
It shares no code with the engine (and none with reference_model.py but
the idea).

    reference_window.py --model DIR --tokens 1,2,3 --logits-out F [--dtype float32|float64]

Output: raw little-endian float32 logits [n_tokens][vocab]; compare them
with reference_model.py --compare. Must run under Debian's /usr/bin/python3.
"""
import argparse
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F


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
        shape, dt = e["shape"], e["dtype"]
        if dt == "F32":
            a = np.frombuffer(buf, dtype="<f4").astype(np.float32)
        elif dt == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            a = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif dt == "U8":
            out[name] = np.frombuffer(buf, dtype=np.uint8).reshape(shape).copy()
            continue
        else:
            raise SystemExit(f"{path}: tensor {name}: dtype {dt} not handled")
        out[name] = torch.from_numpy(a.reshape(shape).copy())
    return out


def load(d):
    with open(os.path.join(d, "config.json")) as f:
        j = json.load(f)
    single = os.path.join(d, "model.safetensors")
    if os.path.exists(single):
        W = read_safetensors(single)
    else:
        with open(os.path.join(d, "model.safetensors.index.json")) as f:
            idx = json.load(f)
        W = {}
        for shard in sorted(set(idx["weight_map"].values())):
            W.update(read_safetensors(os.path.join(d, shard)))
    return j, W


FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4(blocks, scales):
    """[.., rows, nb, 16] codes (element 2j low nibble of byte j) and
    [.., rows, nb] E8M0 scales -> float [.., rows, nb * 32]."""
    lut = np.array(FP4, dtype=np.float64)
    lo = lut[blocks & 15]
    hi = lut[blocks >> 4]
    v = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)
    v = v * np.exp2(scales.astype(np.float64) - 127)[..., None]
    return torch.from_numpy(v.reshape(*blocks.shape[:-2], -1).astype(np.float32))


def rms(x, w, eps, plus_one):
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return h * (1.0 + w) if plus_one else h * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def inv_freq(theta, dim, rs, max_pos):
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))
    if not rs or rs.get("rope_type", rs.get("type")) in (None, "default"):
        return inv, 1.0
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return inv / rs["factor"], 1.0
    if kind == "llama3":
        fac, lo, hi, om = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
        wl = 2 * math.pi / inv
        out = torch.where(wl > om / lo, inv / fac, inv)
        sm = (om / wl - lo) / (hi - lo)
        mid = (1 - sm) * out / fac + sm * out
        is_mid = ~(wl < om / hi) * ~(wl > om / lo)
        return torch.where(is_mid, mid, out), 1.0
    assert kind == "yarn", kind
    orig = rs.get("original_max_position_embeddings") or max_pos
    factor = rs["factor"]
    af = rs.get("attention_factor") or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)

    def corr(r):
        return dim * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(theta))

    low, high = corr(rs.get("beta_fast") or 32), corr(rs.get("beta_slow") or 1)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pf = theta ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    e = 1 - ramp
    return (1.0 / (factor * pf)) * (1 - e) + (1.0 / pf) * e, af


def cos_sin(theta, hd, rs, max_pos, n, dt):
    inv, af = inv_freq(theta, hd, rs, max_pos)
    f = torch.outer(torch.arange(n, dtype=torch.float32), inv)
    emb = torch.cat((f, f), dim=-1)
    return (emb.cos() * af).to(dt), (emb.sin() * af).to(dt)


def forward(j, W, toks, dt):
    mt = j["model_type"]
    t = j.get("text_config", j) if mt in ("gemma3", "gemma4") else j
    g4 = mt.startswith("gemma4")
    gemma, oss = mt.startswith("gemma3") or g4, mt == "gpt_oss"
    po = gemma and not g4  # Gemma 3 norms scale by 1 + w, Gemma 4's by w
    pre = "model.language_model." if "model.language_model.embed_tokens.weight" in W else "model."
    W = {k: (v.to(dt) if isinstance(v, torch.Tensor) else v) for k, v in W.items()}
    D, L = t["hidden_size"], t["num_hidden_layers"]
    H, Hkv = t["num_attention_heads"], t.get("num_key_value_heads", t["num_attention_heads"])
    hd = t.get("head_dim", D // H)
    eps = t.get("rms_norm_eps", 1e-6)
    n = len(toks)
    W_ = t.get("sliding_window") or 0
    lt = t.get("layer_types")
    if lt is None:
        pat = t.get("sliding_window_pattern", 6 if gemma else 2)
        lt = ["sliding_attention" if W_ and (i + 1) % pat else "full_attention" for i in range(L)]
    theta = t.get("rope_theta", 10000.0)
    rs = t.get("rope_scaling")
    max_pos = t.get("max_position_embeddings", 32768)
    ghd, gkv = hd, Hkv
    if g4:
        ghd, gkv = t.get("global_head_dim", hd), t.get("num_global_key_value_heads", Hkv)
        rp = t["rope_parameters"]
        fa, sa = rp["full_attention"], rp["sliding_attention"]
        # proportional: the frequencies of the whole global head, the
        # first partial_rotary_factor of them rotating, the others 0
        inv = 1.0 / (fa["rope_theta"] ** (torch.arange(0, ghd, 2, dtype=torch.int64).to(torch.float32) / ghd))
        inv[int(ghd * fa.get("partial_rotary_factor", 1.0) / 2):] = 0.0
        f = torch.outer(torch.arange(n, dtype=torch.float32), inv)
        emb = torch.cat((f, f), dim=-1)
        cg, sg = emb.cos().to(dt), emb.sin().to(dt)
        cl, sl = cos_sin(sa.get("rope_theta", 10000.0), hd, None, max_pos, n, dt)
    else:
        cg, sg = cos_sin(theta, hd, rs, max_pos, n, dt)
        cl, sl = cg, sg
        if gemma:
            cl, sl = cos_sin(t.get("rope_local_base_freq", 10000.0), hd, None, max_pos, n, dt)
    scale = 1.0 if g4 else t.get("query_pre_attn_scalar", hd) ** -0.5 if gemma else hd ** -0.5
    x = W[pre + "embed_tokens.weight"][torch.tensor(toks)]
    if gemma:
        x = x * torch.tensor(math.sqrt(D), dtype=dt)
    ii = torch.arange(n)
    causal = ii[None, :] <= ii[:, None]
    # gemma4 E2B / E4B: per-layer inputs (llama.cpp's project_per_layer_inputs)
    P = t.get("hidden_size_per_layer_input") or 0 if g4 else 0
    if P:
        tab = W[pre + "embed_tokens_per_layer.weight"][torch.tensor(toks)] * math.sqrt(P)
        pr = (x @ W[pre + "per_layer_model_projection.weight"].T) * (1.0 / math.sqrt(D))
        pr = rms(pr.view(n, L, P), W[pre + "per_layer_projection_norm.weight"], eps, False)
        ple = (pr + tab.view(n, L, P)) * (1.0 / math.sqrt(2.0))
    # gemma4's last num_kv_shared_layers read the KV of the last earlier
    # layer of their type
    F_ = L - (t.get("num_kv_shared_layers") or 0 if g4 else 0)
    kvs = {}
    for l in range(L):
        p = f"{pre}layers.{l}."
        sliding = lt[l] == "sliding_attention"
        hd_l, kv_l = (hd, Hkv) if sliding else (ghd, gkv)
        h = rms(x, W[p + "input_layernorm.weight"], eps, po)
        q = h @ W[p + "self_attn.q_proj.weight"].T
        shared = l >= F_
        k = h @ W[p + "self_attn.k_proj.weight"].T if not shared else q[:, :kv_l * hd_l]
        # gemma4 attention_k_eq_v: a global layer without v_proj uses k_proj's output
        v = h @ W[p + "self_attn.v_proj.weight"].T if p + "self_attn.v_proj.weight" in W else k
        if oss:
            q = q + W[p + "self_attn.q_proj.bias"]
            k = k + W[p + "self_attn.k_proj.bias"]
            v = v + W[p + "self_attn.v_proj.bias"]
        q, k, v = q.view(n, H, hd_l), k.view(n, kv_l, hd_l), v.view(n, kv_l, hd_l)
        if gemma:
            q = rms(q, W[p + "self_attn.q_norm.weight"], eps, po)
            if not shared:
                k = rms(k, W[p + "self_attn.k_norm.weight"], eps, po)
        if g4:
            v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
        cs, sn = (cl, sl) if sliding else (cg, sg)
        cs, sn = cs[:, None, :], sn[:, None, :]
        q = q * cs + rotate_half(q) * sn
        k = k * cs + rotate_half(k) * sn
        if shared:
            src = max(j for j in range(F_) if lt[j] == lt[l])
            k, v = kvs[src]
        kvs[l] = (k, v)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        k = k.repeat_interleave(H // kv_l, dim=0)
        v = v.repeat_interleave(H // kv_l, dim=0)
        sc = (q @ k.transpose(1, 2)) * scale
        ok = causal & ((ii[:, None] - ii[None, :]) < W_ if sliding else causal)
        sc = sc.masked_fill(~ok, float("-inf"))
        if oss:
            sink = W[p + "self_attn.sinks"].view(H, 1, 1).expand(H, n, 1)
            comb = torch.cat([sc, sink], dim=-1)
            comb = comb - comb.max(dim=-1, keepdim=True).values
            pr = torch.softmax(comb, dim=-1)[..., :-1]
        else:
            pr = torch.softmax(sc, dim=-1)
        o = (pr @ v).transpose(0, 1).reshape(n, H * hd_l) @ W[p + "self_attn.o_proj.weight"].T
        if oss:
            o = o + W[p + "self_attn.o_proj.bias"]
        if gemma:
            o = rms(o, W[p + "post_attention_layernorm.weight"], eps, po)
        x = x + o
        if gemma:
            h = rms(x, W[p + "pre_feedforward_layernorm.weight"], eps, po)
            g = h @ W[p + "mlp.gate_proj.weight"].T
            g = 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * torch.pow(g, 3.0))))
            m = (g * (h @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
            if p + "router.proj.weight" in W:  # gemma4 MoE: the experts beside the dense MLP
                m = rms(m, W[p + "post_feedforward_layernorm_1.weight"], eps, po) + g4_moe(t, W, p, x, eps, dt)
            x = x + rms(m, W[p + "post_feedforward_layernorm.weight"], eps, po)
            if P:
                g = x @ W[p + "per_layer_input_gate.weight"].T
                g = 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * torch.pow(g, 3.0))))
                y = (g * ple[:, l, :]) @ W[p + "per_layer_projection.weight"].T
                x = x + rms(y, W[p + "post_per_layer_input_norm.weight"], eps, False)
            if g4:
                x = x * W[p + "layer_scalar"]
        elif oss:
            h = rms(x, W[p + "post_attention_layernorm.weight"], eps, False)
            x = x + oss_moe(t, W, p + "mlp.", h, dt)
        else:
            h = rms(x, W[p + "post_attention_layernorm.weight"], eps, False)
            m = F.silu(h @ W[p + "mlp.gate_proj.weight"].T) * (h @ W[p + "mlp.up_proj.weight"].T)
            x = x + m @ W[p + "mlp.down_proj.weight"].T
    x = rms(x, W[pre + "norm.weight"], eps, po)
    tie = t.get("tie_word_embeddings", j.get("tie_word_embeddings", gemma))
    logits = x @ (W[pre + "embed_tokens.weight"] if tie else W["lm_head.weight"]).T
    cap = t.get("final_logit_softcapping")
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def g4_moe(t, W, p, x, eps, dt):
    # llama.cpp's gemma4 graph: the router on rmsnorm(x) / sqrt(D) * scale,
    # softmax over all experts, top k renormalised; experts GeGLU on
    # rmsnorm(x) * pre_feedforward_layernorm_2 (gate rows then up rows of
    # gate_up_proj), each output times per_expert_scale; the weighted sum
    # normed by post_feedforward_layernorm_2.
    E, k, D = t["num_experts"], t["top_k_experts"], x.shape[-1]
    r = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    r = r * (1.0 / math.sqrt(D)) * W[p + "router.scale"]
    pr = torch.softmax(r @ W[p + "router.proj.weight"].T, dim=-1)
    tv, ti = torch.topk(pr, k, dim=-1)
    tw = tv / tv.sum(-1, keepdim=True)
    h = rms(x, W[p + "pre_feedforward_layernorm_2.weight"], eps, False)
    gu, dn, es = W[p + "experts.gate_up_proj"], W[p + "experts.down_proj"], W[p + "router.per_expert_scale"]
    I = dn.shape[-1]
    out = torch.zeros_like(x)
    for e in range(E):
        tok, pos = torch.where(ti == e)
        if tok.numel() == 0:
            continue
        a = h[tok] @ gu[e].T
        g, u = a[..., :I], a[..., I:]
        g = 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * torch.pow(g, 3.0))))
        y = ((g * u) @ dn[e].T) * es[e]
        out.index_add_(0, tok, y * tw[tok, pos, None])
    return rms(out, W[p + "post_feedforward_layernorm_2.weight"], eps, False)


def oss_moe(t, W, p, h, dt):
    # GptOssTopKRouter: top-k of the biased logits, softmax over the k;
    # GptOssExperts: gate_up interleaved (::2 gate, 1::2 up), clamped
    # SwiGLU with alpha 1.702, (up + 1) * glu, down with bias; summed over
    # the experts in ascending id.
    E, k = t["num_local_experts"], t.get("num_experts_per_tok", t.get("experts_per_token", 4))
    lim, alpha = t.get("swiglu_limit", 7.0), 1.702
    logits = h @ W[p + "router.weight"].T + W[p + "router.bias"]
    tv, ti = torch.topk(logits, k, dim=-1)
    tw = torch.softmax(tv, dim=-1)
    if p + "experts.gate_up_proj_blocks" in W:
        gu = mxfp4(W[p + "experts.gate_up_proj_blocks"], W[p + "experts.gate_up_proj_scales"]).to(dt)
        dn = mxfp4(W[p + "experts.down_proj_blocks"], W[p + "experts.down_proj_scales"]).to(dt)
    else:
        sw = p + "switch_mlp."
        gate, up = W[sw + "gate_proj.weight"], W[sw + "up_proj.weight"]
        gu = torch.stack([gate, up], dim=2).reshape(gate.shape[0], -1, gate.shape[2])
        dn = W[sw + "down_proj.weight"]
    gub = W[p + "experts.gate_up_proj_bias"] if p + "experts.gate_up_proj_bias" in W else torch.stack(
        [W[p + "switch_mlp.gate_proj.bias"], W[p + "switch_mlp.up_proj.bias"]], dim=2).reshape(E, -1)
    dnb = W[p + "experts.down_proj_bias"] if p + "experts.down_proj_bias" in W else W[p + "switch_mlp.down_proj.bias"]
    out = torch.zeros_like(h)
    for e in range(E):
        tok, pos = torch.where(ti == e)
        if tok.numel() == 0:
            continue
        a = h[tok] @ gu[e].T + gub[e]
        g, u = a[..., ::2].clamp(max=lim), a[..., 1::2].clamp(min=-lim, max=lim)
        y = ((u + 1) * (g * torch.sigmoid(g * alpha))) @ dn[e].T + dnb[e]
        out.index_add_(0, tok, y * tw[tok, pos, None])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--logits-out", required=True)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    a = ap.parse_args()
    j, W = load(a.model)
    dt = torch.float64 if a.dtype == "float64" else torch.float32
    toks = [int(x) for x in a.tokens.split(",")]
    with torch.no_grad():
        lg = forward(j, W, toks, dt)
    lg.to(torch.float32).numpy().astype("<f4").tofile(a.logits_out)


if __name__ == "__main__":
    main()
