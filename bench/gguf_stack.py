#!/usr/bin/python3
"""bench/gguf_stack.py - a model of a real depth from a cut of it, for
benchmarks on a disk too small for the real-size BF16 folder (docs/peer.md).

  gguf_stack.py gguf IN.gguf N OUT.gguf
      IN (a Q4_K_M file `kvkeep convert` wrote) with its layers repeated to
      N. Output layer i takes each tensor from an input layer of the same
      attention kind (its place in the per-layer pattern) whose type is the
      one `kvkeep convert --type q4_k_m` gives that tensor at layer i of N
      (llama.cpp's use_more_bits: ffn_down by layer, attn_v by its count in
      file order; the 8-expert bump; the fallbacks of rows that are not
      whole 256- or 32-blocks). Per-layer metadata arrays repeat with IN's
      period, block_count becomes N. The rule is checked against IN's own
      types first. N equal to IN's depth gives IN byte for byte.
  gguf_stack.py hf IN_DIR N OUT_DIR
      a Hugging Face folder (one model.safetensors) with its layers
      repeated the same way (layer i = layer i mod n), config.json's
      num_hidden_layers and layer_types to match: what `kvkeep convert`
      of the deep model would see (tests/peer/peer_stack.sh compares).

Synthetic weights are random either way; the file's geometry, tensor types
and bytes per token are the real model's. Needs only the standard library.
"""
import json, os, re, struct, sys

T_FMT = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}
F16, Q5_0, Q8_0, Q4_K, Q6_K = 1, 6, 8, 12, 14
FTYPE_Q4_K_M = 15


def die(msg):
    sys.stderr.write('gguf_stack: %s\n' % msg)
    sys.exit(1)


class Reader:
    def __init__(self, f):
        self.f = f

    def take(self, n):
        b = self.f.read(n)
        if len(b) != n:
            die('truncated GGUF header')
        return b

    def u32(self):
        return struct.unpack('<I', self.take(4))[0]

    def u64(self):
        return struct.unpack('<Q', self.take(8))[0]

    def string(self):
        return self.take(self.u64()).decode()

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.u32(), self.u64()
            return (et, [self.value(et) for _ in range(n)])
        if t not in T_FMT:
            die('unknown GGUF value type %d' % t)
        fmt = '<' + T_FMT[t]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]


def read_gguf(path):
    f = open(path, 'rb')
    r = Reader(f)
    if r.take(4) != b'GGUF':
        die('%s is not a GGUF file' % path)
    ver, nt, nkv = r.u32(), r.u64(), r.u64()
    kv = []
    for _ in range(nkv):
        k = r.string()
        t = r.u32()
        kv.append((k, t, r.value(t)))
    ts = []
    for _ in range(nt):
        name, nd = r.string(), r.u32()
        dims = [r.u64() for _ in range(nd)]
        ts.append((name, dims, r.u32(), r.u64()))
    return f, ver, kv, ts, f.tell()


def w_str(o, s):
    b = s.encode()
    o.write(struct.pack('<Q', len(b)))
    o.write(b)


def w_value(o, t, v):
    if t == 8:
        w_str(o, v)
    elif t == 9:
        o.write(struct.pack('<IQ', v[0], len(v[1])))
        for x in v[1]:
            w_value(o, v[0], x)
    else:
        o.write(struct.pack('<' + T_FMT[t], v))


def more_bits(i, n):  # llama.cpp's use_more_bits
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(rest, layer, i_v, n, row, ndim, e8):
    """The type kvkeep convert (llama.cpp's rule) gives a per-layer tensor
    whose type depends on the layer; None for the others."""
    if ndim < 2:
        return None
    if 'attn_v.' in rest or 'attn_qkv.' in rest:
        t = Q8_0 if e8 else Q6_K if more_bits(i_v, n) else Q4_K
    elif 'ffn_down' in rest:
        t = Q6_K if more_bits(layer, n) else Q4_K
    else:
        return None
    if row % (256 if t in (Q4_K, Q6_K) else 32):
        t = {Q6_K: Q8_0, Q4_K: Q5_0}.get(t, t)
        if row % 32:
            t = F16
    return t


def layer_of(name):
    m = re.match(r'blk\.(\d+)\.', name)
    return int(m.group(1)) if m else -1


def stack_gguf(src, n, out):
    f, ver, kv, ts, pos = read_gguf(src)
    meta = {k: v for k, t, v in kv}
    arch = meta.get('general.architecture')
    n0 = meta.get('%s.block_count' % arch)
    if not arch or not n0:
        die('%s: no general.architecture / block_count' % src)
    if meta.get('general.file_type') != FTYPE_Q4_K_M:
        die('%s: file type %s; the layer rule here is Q4_K_M\'s (15)' % (src, meta.get('general.file_type')))
    align = meta.get('general.alignment', 32)
    pat = meta.get('%s.attention.sliding_window_pattern' % arch, (0, [0] * n0))[1]
    e8 = meta.get('%s.expert_count' % arch) == 8
    data0 = (pos + align - 1) // align * align
    by = {name: (dims, tt, off) for name, dims, tt, off in ts}
    order = [x[0] for x in ts]
    end = os.path.getsize(src) - data0
    size = {}
    for i, name in enumerate(order):
        size[name] = (ts[i + 1][3] if i + 1 < len(ts) else end) - by[name][2]
    has_v = lambda L: any(('blk.%d.%s.weight' % (L, x)) in by for x in ('attn_v', 'attn_qkv'))
    iv0 = [sum(has_v(j) for j in range(L)) for L in range(n0)]
    for name, (dims, tt, off) in by.items():  # the rule reproduces IN's types
        L = layer_of(name)
        if L >= 0:
            e = q4_k_m_type(name.split('.', 2)[2], L, iv0[L], n0, dims[0], len(dims), e8)
            if e is not None and e != tt:
                die('%s: %s is type %d where the Q4_K_M rule gives %d' % (src, name, tt, e))
    ivn = [sum(has_v(j % n0) for j in range(i)) for i in range(n)]
    outs = [(x, x) for x in order if layer_of(x) < 0 and not x.startswith('output') and x != 'rope_freqs.weight']
    for i in range(n):
        twin = i % n0
        for name in [x for x in order if layer_of(x) == twin]:
            rest = name.split('.', 2)[2]
            dims = by[name][0]
            e = q4_k_m_type(rest, i, ivn[i], n, dims[0], len(dims), e8)
            cands = [j for j in range(n0) if pat[j] == pat[twin] and ('blk.%d.%s' % (j, rest)) in by and
                     (e is None or by['blk.%d.%s' % (j, rest)][1] == e)]
            if not cands:
                die('no layer of %s has %s in type %s for layer %d of %d' % (src, rest, e, i, n))
            j = twin if twin in cands else cands[i % len(cands)]
            outs.append(('blk.%d.%s' % (i, rest), 'blk.%d.%s' % (j, rest)))
    outs += [(x, x) for x in order if x.startswith('output') or x == 'rope_freqs.weight']
    okv = []
    for k, t, v in kv:
        if k == '%s.block_count' % arch:
            v = n
        elif t == 9 and k.startswith(arch + '.') and len(v[1]) == n0:
            v = (v[0], [v[1][i % n0] for i in range(n)])
        okv.append((k, t, v))
    tmp = out + '.tmp'
    with open(tmp, 'wb') as o:
        o.write(b'GGUF' + struct.pack('<IQQ', ver, len(outs), len(okv)))
        for k, t, v in okv:
            w_str(o, k)
            o.write(struct.pack('<I', t))
            w_value(o, t, v)
        off, offs = 0, []
        for name, s in outs:
            dims, tt, _ = by[s]
            w_str(o, name)
            o.write(struct.pack('<I', len(dims)) + b''.join(struct.pack('<Q', d) for d in dims))
            o.write(struct.pack('<IQ', tt, off))
            offs.append(off)
            off = (off + size[s] + align - 1) // align * align
        o.write(b'\0' * (-o.tell() % align))
        base = o.tell()
        for (name, s), ofs in zip(outs, offs):
            o.seek(base + ofs)
            f.seek(data0 + by[s][2])
            left = size[s]
            while left:
                b = f.read(min(left, 1 << 26))
                if not b:
                    die('%s: truncated tensor data' % src)
                o.write(b)
                left -= len(b)
        o.truncate(base + off)
    os.replace(tmp, out)
    print('wrote %s: %d layers from %d, %d tensors' % (out, n, n0, len(outs)))


def stack_hf(src, n, dst):
    with open(os.path.join(src, 'model.safetensors'), 'rb') as f:
        hl = struct.unpack('<Q', f.read(8))[0]
        hdr = json.loads(f.read(hl))
        base = 8 + hl
        meta = hdr.pop('__metadata__', None)
        cfg = json.load(open(os.path.join(src, 'config.json')))
        tc = cfg.get('text_config', cfg)
        n0 = tc['num_hidden_layers']
        out, parts, off = {}, [], 0
        lay = lambda k: int(re.search(r'\.layers\.(\d+)\.', k).group(1)) if re.search(r'\.layers\.\d+\.', k) else -1
        names = [(k, k) for k in hdr if lay(k) < 0]
        for i in range(n):
            names += [(k.replace('.layers.%d.' % (i % n0), '.layers.%d.' % i), k) for k in hdr if lay(k) == i % n0]
        for new, k in names:
            a, b = hdr[k]['data_offsets']
            out[new] = dict(dtype=hdr[k]['dtype'], shape=hdr[k]['shape'], data_offsets=[off, off + b - a])
            parts.append((a, b))
            off += b - a
        if meta:
            out['__metadata__'] = meta
        hb = json.dumps(out).encode()
        hb += b' ' * (-len(hb) % 8)
        os.makedirs(dst, exist_ok=True)
        with open(os.path.join(dst, 'model.safetensors'), 'wb') as o:
            o.write(struct.pack('<Q', len(hb)) + hb)
            for a, b in parts:
                f.seek(base + a)
                o.write(f.read(b - a))
    tc['num_hidden_layers'] = n
    if 'layer_types' in tc:
        tc['layer_types'] = [tc['layer_types'][i % n0] for i in range(n)]
    with open(os.path.join(dst, 'config.json'), 'w') as o:
        json.dump(cfg, o, indent=1)
    for x in os.listdir(src):
        if x not in ('config.json', 'model.safetensors') and os.path.isfile(os.path.join(src, x)):
            with open(os.path.join(src, x), 'rb') as a, open(os.path.join(dst, x), 'wb') as b:
                b.write(a.read())
    print('wrote %s: %d layers from %d' % (dst, n, n0))


if __name__ == '__main__':
    if len(sys.argv) != 5 or sys.argv[1] not in ('gguf', 'hf') or not sys.argv[3].isdigit() or int(sys.argv[3]) < 1:
        sys.stderr.write(__doc__)
        sys.exit(2)
    (stack_gguf if sys.argv[1] == 'gguf' else stack_hf)(sys.argv[2], int(sys.argv[3]), sys.argv[4])
