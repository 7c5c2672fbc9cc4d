#!/usr/bin/python3
"""template_oracle.py - renders chat templates the way Hugging Face does.

Run with Debian's /usr/bin/python3 (python3-jinja2), not the `python3` on
PATH. The environment copies transformers' chat_template_utils: an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the
loopcontrols extension, `tojson` replaced by json.dumps (ensure_ascii
False, key order kept, optional indent/separators/sort_keys) and the
globals raise_exception and strftime_now. A `{% generation %}` tag is
accepted and renders its body, as transformers' AssistantTracker does.

Commands:
  render TEMPLATE CONTEXT.json      render a template file with a context
                                    object; prints the text, or a line
                                    "ERR: <message>" on failure
  snippets CASES.json OUTDIR        render each {"name","template","context"}
                                    case into OUTDIR/<name>.out (or .err)
  chat CONFIG REQUEST [--template FILE] [--no-generation-prompt]
       [--prefix K] [--probe]       render an OpenAI request body with the
                                    chat_template of a tokenizer_config.json,
                                    preparing messages exactly as kvkeep does
                                    (content parts joined); --prefix K keeps
                                    only messages[:K] (without generation
                                    prompt); --probe appends a probe user
                                    message after the head (system)
  chat-batch MANIFEST               each line OUT<TAB>CONFIG<TAB>REQUEST<TAB>
                                    TEMPLATE-or--<TAB>GEN(1|0)[<TAB>keep]:
                                    the chat render into OUT (OUT.err on
                                    failure); keep: keep_render below
  boundaries-batch MANIFEST TOKENIZER NODE_DIR
                                    each line NAME<TAB>CONFIG<TAB>REQUEST<TAB>
                                    TEMPLATE-or--<TAB>OURS.json[<TAB>keep]:
                                    the check below for each, one node
                                    process in all
  boundaries NAME CONFIG REQUEST OURS.json TOKENIZER NODE_DIR [--template F]
                                    check `kvkeep render --json --tokens`
                                    output (generation prompt on): the text,
                                    the token ids (Hugging Face's Rust
                                    tokenizers through node) and, for every
                                    boundary, that render(messages[:k])
                                    without generation prompt is the text up
                                    to it and its ids are the first ids of
                                    the whole; also that every k whose render
                                    is a prefix ending before "<|im_start|>"
                                    (or at the end) has a boundary. Prints
                                    one ok/FAIL line.
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


def render(source, ctx):
    return ENV.from_string(source).render(**ctx)


PROBE = "\u0001kvkeep-probe\u0001"
TURN = "<|im_start|>"


def turn_marker(src):
    """The token that opens a turn in a template (kvkeep's C code finds any
    clean cut; the oracle looks for this one): ChatML's, harmony's (GPT-OSS),
    Llama 3's or Gemma's."""
    for m in ("<|im_start|>", "<|start|>", "<|start_header_id|>", "<start_of_turn>"):
        if m in src:
            return m
    return "<|im_start|>"


def keep_render(tmpl, ctx, turn=TURN, harmony=False):
    """kvkeep's --reasoning-history keep, written again from its definition
    (src/text/template.h "Reasoning history"): each user turn j (messages
    q_j up to q_{j+1}) is the text of render(messages[:q_{j+1}]) from where
    message q_j starts; that start is where a render of messages[:q_j] plus
    a probe user message parts from the whole render, backed off to the
    turn opener. The newest turn and what comes before the first user
    message are the whole render's."""
    msgs = ctx["messages"]
    full = tmpl.render(**ctx)
    q = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    if len(q) < 2:
        return full

    def start(k):
        if k == 0:
            return 0
        probe = tmpl.render(**dict(ctx, add_generation_prompt=False,
                                   messages=msgs[:k] + [{"role": "user", "content": PROBE}]))
        n = 0
        while n < min(len(probe), len(full)) and probe[n] == full[n]:
            n += 1
        p = full.rfind(turn, 0, n + 1)
        if p <= 0 or not probe.startswith(full[:p]):
            raise ValueError("no turn start for message %d" % k)
        return p

    d = [start(k) for k in q]
    out = full[:d[0]]
    for i in range(len(q) - 1):
        r = tmpl.render(**dict(ctx, add_generation_prompt=False, messages=msgs[:q[i + 1]]))
        if not r.startswith(full[:d[i]]):
            return full  # the rule fails: the template's own text
        if harmony and r.endswith("<|return|>"):
            r = r[:-len("<|return|>")] + "<|end|>"  # harmony: a history goes on after it
        out += r[d[i]:]
    return out + full[d[-1]:]


def chat_render(src, ctx, keep):
    tmpl = ENV.from_string(src)
    return keep_render(tmpl, ctx, turn_marker(src), is_harmony(src)) if keep else tmpl.render(**ctx)


def prepare_messages(messages):
    """kvkeep's preparation (kv_chat_prepare_messages): content given as a
    list of text parts becomes one string, parts joined with no separator;
    null or absent content becomes ""; the developer role becomes system;
    nothing else changes."""
    out = []
    for m in messages:
        m = dict(m)
        c = m.get("content")
        if isinstance(c, list):
            m["content"] = "".join(p["text"] for p in c)
        elif c is None:
            m["content"] = ""
        if m.get("role") == "developer":
            m["role"] = "system"
        out.append(m)
    return out


SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def token_str(v):
    if isinstance(v, dict):
        return v.get("content")
    return v


def is_harmony(src):
    return "<|channel|>" in src and "<|message|>" in src and "<|start|>" in src


def harmony_messages(messages):
    """kvkeep's harmony preparation (chat.c harmony_messages): an assistant
    message's reasoning_content becomes "thinking" (not beside content in
    a tool-call message), and tool-call arguments given as JSON text of an
    object become the object."""
    out = []
    for m in messages:
        if m.get("role") != "assistant":
            out.append(m)
            continue
        m = dict(m)
        calls = m.get("tool_calls") or []
        rc = m.get("reasoning_content")
        if isinstance(rc, str) and rc and "thinking" not in m and not (calls and m.get("content")):
            m["thinking"] = rc
        if calls:
            new = []
            for c in calls:
                c = dict(c)
                fn = dict(c["function"])
                a = fn.get("arguments")
                if isinstance(a, str):
                    try:
                        o = json.loads(a)
                    except ValueError:
                        o = None
                    if isinstance(o, dict):
                        fn["arguments"] = o
                c["function"] = fn
                new.append(c)
            m["tool_calls"] = new
        out.append(m)
    return out


def chat_context(config, request, add_generation_prompt, src=None):
    ctx = {}
    for k in SPECIAL_KEYS:
        v = token_str(config.get(k))
        if v is not None:
            ctx[k] = v
    extra = config.get("additional_special_tokens")
    if extra:
        ctx["additional_special_tokens"] = [token_str(x) for x in extra]
    kwargs = request.get("chat_template_kwargs") or {}
    ctx.update(kwargs)
    ctx["messages"] = prepare_messages(request["messages"])
    if src is not None and is_harmony(src):
        ctx["messages"] = harmony_messages(ctx["messages"])
    ctx["tools"] = request.get("tools") or None
    ctx["documents"] = None
    ctx["add_generation_prompt"] = add_generation_prompt
    return ctx


def pick_template(config, has_tools):
    t = config.get("chat_template")
    if isinstance(t, list):
        named = {x["name"]: x["template"] for x in t}
        if has_tools and "tool_use" in named:
            return named["tool_use"]
        return named["default"]
    return t


NODE_ENCODE = r"""
const fs = require('fs');
const { Tokenizer } = require('@anush008/tokenizers');
(async () => {
  const tok = Tokenizer.fromFile(process.argv[1]);
  const texts = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  const encs = await tok.encodeBatch(texts, { addSpecialTokens: false });
  fs.writeFileSync(process.argv[3], JSON.stringify(encs.map(e => e.getIds())));
})().catch(e => { console.error(e); process.exit(1); });
"""


def hf_encode(texts, tokenizer, node_dir):
    import os
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        inp, outp = os.path.join(d, "in.json"), os.path.join(d, "out.json")
        with open(inp, "w", encoding="utf-8") as f:
            json.dump(texts, f, ensure_ascii=False)
        env = dict(os.environ, NODE_PATH=os.path.join(node_dir, "node_modules"))
        subprocess.run(["node", "-e", NODE_ENCODE, tokenizer, inp, outp], check=True, env=env)
        return json.load(open(outp, encoding="utf-8"))


def check_boundaries(name, config, request, ours, tokenizer, node_dir, src, keep=False):
    """Returns an "ok ..." or "FAIL ..." line."""
    st = boundary_texts(name, config, request, ours, src, keep)
    if isinstance(st, str):
        return st
    return boundary_verdict(name, ours, hf_encode(st, tokenizer, node_dir))


def boundary_texts(name, config, request, ours, src, keep=False):
    """The texts whose ids must be checked (full text first), or a FAIL line.
    keep: the text and every prefix are keep_render's."""
    if src is None:
        src = pick_template(config, bool(request.get("tools")))
    tmpl = ENV.from_string(src)
    ctx = chat_context(config, request, True, src)
    msgs = ctx["messages"]

    class Keep:
        def render(self, **c):
            t = keep_render(tmpl, c, turn_marker(src), is_harmony(src))
            # a prefix that ends with an answer, as the history that goes on
            # carries it (harmony's "<|return|>" becomes "<|end|>")
            if is_harmony(src) and not c["add_generation_prompt"] and t.endswith("<|return|>"):
                t = t[:-len("<|return|>")] + "<|end|>"
            return t
    if keep:
        tmpl_keep = Keep()
        full = tmpl_keep.render(**ctx)
    else:
        full = tmpl.render(**ctx)
    if full != ours["text"]:
        return "FAIL %s: the full render differs from the oracle" % name
    nb = len(ours["boundaries"])
    if not (len(ours["boundary_bytes"]) == nb == len(ours["boundary_msgs"])):
        return "FAIL %s: boundary arrays of different lengths" % name
    texts = [full]
    for i in range(nb):
        k, nbytes = ours["boundary_msgs"][i], ours["boundary_bytes"][i]
        want = full.encode("utf-8")[:nbytes]
        if i == 0 and ours["first_from_probe"]:
            c2 = dict(ctx, add_generation_prompt=False,
                      messages=msgs[:k] + [{"role": "user", "content": "\u0001kvkeep-probe\u0001"}])
            probe = tmpl.render(**c2).encode("utf-8")
            if not probe.startswith(want):
                return "FAIL %s: probe anchor at byte %d is not a prefix of the probe render" % (name, nbytes)
            texts.append(want.decode("utf-8"))
            continue
        part = (tmpl_keep if keep else tmpl).render(**dict(ctx, add_generation_prompt=False, messages=msgs[:k])).encode("utf-8")
        if part != want:
            return "FAIL %s: boundary %d: render(messages[:%d]) is not the text up to byte %d" % (name, i, k, nbytes)
        texts.append(part.decode("utf-8"))
    # completeness: every message end that is a clean prefix must be reported
    have = set(ours["boundary_bytes"])
    fb = full.encode("utf-8")
    for k in range(1, len(msgs) + 1):
        try:
            part = (tmpl_keep if keep else tmpl).render(**dict(ctx, add_generation_prompt=False, messages=msgs[:k])).encode("utf-8")
        except Exception:
            continue
        if part and fb.startswith(part) and (len(part) == len(fb) or fb[len(part):].startswith(b"<|im_start|>")):
            if len(part) not in have and not (nb and len(part) < ours["boundary_bytes"][0]):
                return "FAIL %s: messages[:%d] ends cleanly at byte %d but no boundary was reported" % (name, k, len(part))
    return texts


def boundary_verdict(name, ours, ids):
    nb = len(ours["boundaries"])
    if ids[0] != ours["tokens"] or len(ids[0]) != ours["n_tokens"]:
        d = next((i for i, (a, b) in enumerate(zip(ids[0], ours["tokens"])) if a != b), min(len(ids[0]), len(ours["tokens"])))
        return "FAIL %s: token ids differ from Hugging Face's at %d (%d vs %d ids)" % (name, d, len(ours["tokens"]), len(ids[0]))
    for i in range(nb):
        b = ours["boundaries"][i]
        if ids[i + 1] != ours["tokens"][:b]:
            return "FAIL %s: boundary %d: tokens(prefix) (%d ids) are not tokens[:%d]" % (name, i, len(ids[i + 1]), b)
    return "ok %s: text, %d ids and %d boundaries (messages %s) verified%s" % (
        name, len(ids[0]), nb, ",".join(str(k) for k in ours["boundary_msgs"]),
        " (anchor from the probe)" if ours["first_from_probe"] else "")


def main(argv):
    cmd = argv[1]
    if cmd == "render":
        src = open(argv[2], encoding="utf-8").read()
        ctx = json.load(open(argv[3], encoding="utf-8"))
        try:
            sys.stdout.write(render(src, ctx))
        except Exception as e:  # the C side prints the same marker
            sys.stdout.write("ERR: %s: %s\n" % (type(e).__name__, e))
        return 0
    if cmd == "snippets":
        cases = json.load(open(argv[2], encoding="utf-8"))
        for c in cases:
            name = c["name"]
            try:
                out = render(c["template"], c.get("context", {}))
                with open("%s/%s.out" % (argv[3], name), "w", encoding="utf-8", newline="") as f:
                    f.write(out)
            except Exception as e:
                with open("%s/%s.err" % (argv[3], name), "w", encoding="utf-8") as f:
                    f.write("%s: %s\n" % (type(e).__name__, e))
        return 0
    if cmd == "chat":
        config = json.load(open(argv[2], encoding="utf-8"))
        request = json.load(open(argv[3], encoding="utf-8"))
        args = argv[4:]
        gen = "--no-generation-prompt" not in args
        src = None
        prefix = None
        probe = "--probe" in args
        if "--template" in args:
            src = open(args[args.index("--template") + 1], encoding="utf-8").read()
        if "--prefix" in args:
            prefix = int(args[args.index("--prefix") + 1])
            gen = False
        if src is None:
            src = pick_template(config, bool(request.get("tools")))
        ctx = chat_context(config, request, gen, src)
        if prefix is not None:
            ctx["messages"] = ctx["messages"][:prefix]
        if probe:
            head = ctx["messages"][:1] if ctx["messages"] and ctx["messages"][0]["role"] == "system" else []
            ctx["messages"] = head + [{"role": "user", "content": "\u0001kvkeep-probe\u0001"}]
            ctx["add_generation_prompt"] = False
        try:
            sys.stdout.write(render(src, ctx))
        except Exception as e:
            sys.stdout.write("ERR: %s: %s\n" % (type(e).__name__, e))
            return 3
        return 0
    if cmd == "chat-batch":
        for line in open(argv[2], encoding="utf-8"):
            if not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            out, config, request, tmpl, gen = cols[:5]
            keep = len(cols) > 5 and cols[5] == "keep"
            try:
                config = json.load(open(config, encoding="utf-8"))
                request = json.load(open(request, encoding="utf-8"))
                src = open(tmpl, encoding="utf-8").read() if tmpl != "-" else pick_template(config, bool(request.get("tools")))
                text = chat_render(src, chat_context(config, request, gen == "1", src), keep)
                with open(out, "w", encoding="utf-8", newline="") as f:
                    f.write(text)
            except Exception as e:
                with open(out + ".err", "w", encoding="utf-8") as f:
                    f.write("%s: %s\n" % (type(e).__name__, e))
        return 0
    if cmd == "boundaries-batch":
        tokenizer, node_dir = argv[3], argv[4]
        jobs, texts, bad = [], [], 0
        for line in open(argv[2], encoding="utf-8"):
            if not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            name, config, request, tmpl, ours = cols[:5]
            keep = len(cols) > 5 and cols[5] == "keep"
            try:
                ours = json.load(open(ours, encoding="utf-8"))
                st = boundary_texts(name, json.load(open(config, encoding="utf-8")),
                                    json.load(open(request, encoding="utf-8")), ours,
                                    open(tmpl, encoding="utf-8").read() if tmpl != "-" else None, keep)
            except Exception as e:
                st = "FAIL %s: %s: %s" % (name, type(e).__name__, e)
            if isinstance(st, str):
                print(st)
                bad += 1
                continue
            jobs.append((name, ours, len(texts), len(st)))
            texts.extend(st)
        ids = hf_encode(texts, tokenizer, node_dir) if texts else []
        for name, ours, at, n in jobs:
            line = boundary_verdict(name, ours, ids[at:at + n])
            bad += not line.startswith("ok ")
            print(line)
        return 1 if bad else 0
    if cmd == "boundaries":
        name, config, request, ours, tokenizer, node_dir = argv[2:8]
        args = argv[8:]
        src = open(args[args.index("--template") + 1], encoding="utf-8").read() if "--template" in args else None
        try:
            line = check_boundaries(name, json.load(open(config, encoding="utf-8")),
                                    json.load(open(request, encoding="utf-8")),
                                    json.load(open(ours, encoding="utf-8")), tokenizer, node_dir, src)
        except Exception as e:
            line = "FAIL %s: %s: %s" % (name, type(e).__name__, e)
        print(line)
        return 0 if line.startswith("ok ") else 1
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
