#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_gguf (tests/fuzz/corpus/gguf): small valid
GGUF files (plain tensors, every block type, qwen3 / qwen35 / qwen35moe /
qwen3next model headers with a tokenizer) and one file per rule of the reader broken. Run from the
repository root: /usr/bin/python3 tests/fuzz/mk_gguf_corpus.py"""
import os, struct

OUT = "tests/fuzz/corpus/gguf"
BLOCK = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
         10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292)}


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, t, val):
    out = s(key) + struct.pack("<I", t)
    if t == 8:
        return out + s(val)
    if t == 9:
        et, items = val
        out += struct.pack("<IQ", et, len(items))
        for it in items:
            out += s(it) if et == 8 else struct.pack({4: "<I", 5: "<i", 6: "<f"}[et], it)
        return out
    return out + struct.pack({0: "<B", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 12: "<d"}[t], val)


def gguf(kvs, tensors, version=3, align=32, data_fill=0x11):
    """tensors: (name, ne list, type)"""
    body = b""
    infos = b""
    off = 0
    datas = []
    for name, ne, t in tensors:
        qk, bb = BLOCK[t]
        n = 1
        for d in ne:
            n *= d
        nbytes = n // qk * bb
        infos += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        infos += struct.pack("<IQ", t, off)
        datas.append((off, nbytes))
        off = (off + nbytes + align - 1) // align * align
    head = struct.pack("<IIQQ", 0x46554747, version, len(tensors), len(kvs)) + b"".join(kvs) + infos
    head += b"\0" * ((-len(head)) % align)
    data = bytearray(off)
    for i, (o, n) in enumerate(datas):
        for j in range(n):
            data[o + j] = (data_fill + 7 * j + i) & 0xFF
        # keep f16 scales small and finite: first two bytes of every block 0x3c00
    return head + bytes(data)


def w(name, b):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(b)


os.makedirs(OUT, exist_ok=True)
basic_kv = [kv("general.architecture", 8, "test"), kv("general.alignment", 4, 32), kv("f", 6, 1.5),
            kv("arr", 9, (5, [1, -2, 3]))]
w("ok_basic", gguf(basic_kv, [("a", [16, 2], 0), ("b", [256, 1], 12)]))
w("ok_all_types", gguf([kv("general.architecture", 8, "x")],
                       [("t%d" % t, [256, 2], t) for t in sorted(BLOCK)]))
tok = [kv("tokenizer.ggml.model", 8, "gpt2"), kv("tokenizer.ggml.pre", 8, "qwen2"),
       kv("tokenizer.ggml.tokens", 9, (8, ["a", "b", "ab", "<|im_end|>"])),
       kv("tokenizer.ggml.token_type", 9, (5, [1, 1, 1, 3])),
       kv("tokenizer.ggml.merges", 9, (8, ["a b"])), kv("tokenizer.ggml.eos_token_id", 4, 3),
       kv("tokenizer.chat_template", 8, "{% for m in messages %}{{ m.content }}<|im_end|>{% endfor %}")]
q3 = [kv("general.architecture", 8, "qwen3"), kv("qwen3.block_count", 4, 1), kv("qwen3.embedding_length", 4, 32),
      kv("qwen3.feed_forward_length", 4, 64), kv("qwen3.attention.head_count", 4, 2),
      kv("qwen3.attention.head_count_kv", 4, 1), kv("qwen3.attention.key_length", 4, 16),
      kv("qwen3.rope.freq_base", 6, 10000.0), kv("qwen3.rope.dimension_count", 4, 16),
      kv("qwen3.attention.layer_norm_rms_epsilon", 6, 1e-6)] + tok
w("ok_qwen3", gguf(q3, [("token_embd.weight", [32, 4], 8), ("output_norm.weight", [32], 0),
                        ("blk.0.attn_q.weight", [32, 32], 8), ("blk.0.attn_norm.weight", [32], 0)]))
q35 = [kv("general.architecture", 8, "qwen35"), kv("qwen35.block_count", 4, 2), kv("qwen35.embedding_length", 4, 32),
       kv("qwen35.feed_forward_length", 4, 64), kv("qwen35.attention.head_count", 4, 2),
       kv("qwen35.attention.head_count_kv", 4, 1), kv("qwen35.attention.key_length", 4, 16),
       kv("qwen35.rope.dimension_count", 4, 4), kv("qwen35.attention.layer_norm_rms_epsilon", 6, 1e-6),
       kv("qwen35.ssm.conv_kernel", 4, 4), kv("qwen35.ssm.state_size", 4, 8), kv("qwen35.ssm.group_count", 4, 1),
       kv("qwen35.ssm.time_step_rank", 4, 2), kv("qwen35.ssm.inner_size", 4, 16),
       kv("qwen35.full_attention_interval", 4, 2)] + tok
w("ok_qwen35", gguf(q35, [("token_embd.weight", [32, 4], 8), ("blk.0.attn_qkv.weight", [32, 32], 8),
                          ("blk.0.ssm_out.weight", [16, 32], 0), ("blk.0.ssm_a", [2], 0),
                          ("blk.0.ssm_conv1d.weight", [4, 32], 0), ("blk.0.ssm_dt.bias", [2], 0)]))
# MoE headers (E 4, k 2, I 32, Is 32): qwen35moe with the stacks, qwen3next
# with attn_qkv/attn_gate and ssm_ba (ne lists are ggml's, innermost first)
def moe_kv(a):
    return [kv("general.architecture", 8, a), kv(a + ".block_count", 4, 2), kv(a + ".embedding_length", 4, 32),
            kv(a + ".feed_forward_length", 4, 64), kv(a + ".attention.head_count", 4, 2),
            kv(a + ".attention.head_count_kv", 4, 1), kv(a + ".attention.key_length", 4, 16),
            kv(a + ".rope.dimension_count", 4, 4), kv(a + ".attention.layer_norm_rms_epsilon", 6, 1e-6),
            kv(a + ".ssm.conv_kernel", 4, 4), kv(a + ".ssm.state_size", 4, 8), kv(a + ".ssm.group_count", 4, 1),
            kv(a + ".ssm.time_step_rank", 4, 2), kv(a + ".ssm.inner_size", 4, 16),
            kv(a + ".full_attention_interval", 4, 2), kv(a + ".expert_count", 4, 4),
            kv(a + ".expert_used_count", 4, 2), kv(a + ".expert_feed_forward_length", 4, 32),
            kv(a + ".expert_shared_feed_forward_length", 4, 32)] + tok
def moe_t(l, t):
    b = "blk.%d." % l
    return [(b + "ffn_gate_inp.weight", [32, 4], 0), (b + "ffn_gate_exps.weight", [32, 32, 4], t),
            (b + "ffn_up_exps.weight", [32, 32, 4], t), (b + "ffn_down_exps.weight", [32, 32, 4], t),
            (b + "ffn_gate_shexp.weight", [32, 32], t), (b + "ffn_up_shexp.weight", [32, 32], t),
            (b + "ffn_down_shexp.weight", [32, 32], t), (b + "ffn_gate_inp_shexp.weight", [32], 0)]
w("ok_qwen35moe", gguf(moe_kv("qwen35moe"), [("token_embd.weight", [32, 4], 8), ("blk.0.attn_qkv.weight", [32, 32], 8)]
                       + moe_t(0, 8) + moe_t(1, 2)))
w("ok_qwen3next", gguf(moe_kv("qwen3next"), [("token_embd.weight", [32, 4], 8), ("blk.0.attn_qkv.weight", [32, 32], 8),
                                             ("blk.0.attn_gate.weight", [32, 16], 8), ("blk.0.ssm_ba.weight", [32, 4], 8)]
                       + moe_t(0, 2) + moe_t(1, 8)))
good = gguf(basic_kv, [("a", [16, 2], 0), ("b", [256, 1], 12)])
w("bad_truncated", good[: len(good) - 40])
w("bad_truncated_header", good[:30])
w("bad_magic", b"GGUX" + good[4:])
w("bad_version", good[:4] + struct.pack("<I", 4) + good[8:])
w("bad_huge_string", struct.pack("<IIQQ", 0x46554747, 3, 0, 1) + struct.pack("<Q", 1 << 62) + b"\0" * 24)
w("bad_array_bomb", struct.pack("<IIQQ", 0x46554747, 3, 0, 1) + s("bomb") + struct.pack("<IIQ", 9, 8, 1 << 40) + b"\0" * 32)
w("bad_array_bomb_u32", struct.pack("<IIQQ", 0x46554747, 3, 0, 1) + s("bomb") + struct.pack("<IIQ", 9, 4, 1 << 61) + b"\0" * 32)
w("bad_nested_array", struct.pack("<IIQQ", 0x46554747, 3, 0, 1) + s("n") + struct.pack("<IIQ", 9, 9, 1) + b"\0" * 32)
w("bad_not_dividing", gguf(basic_kv, [("q", [256, 1], 12)]).replace(s("q") + struct.pack("<IQ", 2, 256),
                                                                    s("q") + struct.pack("<IQ", 2, 100)))
w("bad_unknown_type", gguf(basic_kv, [("u", [32, 1], 0)]).replace(s("u") + struct.pack("<IQQ", 2, 32, 1) + struct.pack("<I", 0),
                                                                  s("u") + struct.pack("<IQQ", 2, 32, 1) + struct.pack("<I", 99)))
w("bad_iq_type", gguf(basic_kv, [("u", [256, 1], 0)]).replace(s("u") + struct.pack("<IQQ", 2, 256, 1) + struct.pack("<I", 0),
                                                              s("u") + struct.pack("<IQQ", 2, 256, 1) + struct.pack("<I", 16)))
big = bytearray(gguf(basic_kv, [("a", [16, 2], 0)]))
i = big.find(s("a")) + len(s("a")) + 4 + 16 + 4
big[i:i + 8] = struct.pack("<Q", 1 << 40)
w("bad_offset_past_end", bytes(big))
big[i:i + 8] = struct.pack("<Q", 4)
w("bad_misaligned", bytes(big))
w("bad_alignment_key", gguf([kv("general.alignment", 4, 3)], [("a", [8], 0)]))
w("bad_dup_key", gguf([kv("k", 4, 1), kv("k", 4, 2)], []))
w("bad_empty", b"")
