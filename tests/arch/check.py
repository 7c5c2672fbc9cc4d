#!/usr/bin/python3
"""
tests/arch/check.py [--root DIR] [--ctags PROG]

The architecture check of docs/style.md, run by tests/arch/check.sh in
`make test`. It reads the includes and the calls of DIR/src (DIR defaults to
the repository) and prints one line per rule and folder:

    ok arch_<rule>_<folder>
    FAIL arch_<rule>_<folder>: what is wrong

Rules (each one says why it exists next to its code below):
  layers    a file includes a header of its own layer or of a lower one
  circles   the files of one folder do not call each other in a circle
  filesize  no file in src/ is over MAX_FILE_LINES lines
  funcsize  no function is over MAX_FUNC_LINES lines

Function definitions come from Universal Ctags (the Debian package
universal-ctags, installed by `scripts/deps.sh test`); the uses come from
the file's text with comments, strings and character literals removed.
Exit status: 0 when every line is ok, 1 when one is FAIL, 2 on a usage or
tool error (no ctags: a clear message, never a silent pass).
"""
import os
import re
import shutil
import subprocess
import sys

# The layers, lowest first (docs/architecture.md section 1). client/ holds
# code only the CLI uses (an HTTP client, child processes, replay): it sits
# above server/ and below cli/, and the check accepts its absence.
LAYERS = ["base", "model", "text", "engine", "cache", "store", "session", "server", "client", "cli"]

MAX_FILE_LINES = 2000
MAX_FUNC_LINES = 250

# Circles accepted inside a folder: (folder, files, where it is explained).
# A strongly connected component is accepted when its files are a subset
# of one entry's. None: the Jinja interpreter's recursion lives in one file
# (docs/style.md), so no folder needs an exception.
ALLOWED_CIRCLES = []

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def strip_c(text):
    """Removes comments, string and character literals (keeps newlines so
    line numbers stay right): a name in a comment or a log message is not
    a call."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(" ")
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_includes_safe(t):
    """Comments removed but strings kept, so #include "x" survives while a
    commented-out include does not count."""
    out, i, n = [], 0, len(t)
    while i < n:
        if t.startswith("/*", i):
            j = t.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * t.count("\n", i, j)); i = j
        elif t.startswith("//", i):
            j = t.find("\n", i); i = n if j < 0 else j
        elif t[i] == '"':
            j = i + 1
            while j < n and t[j] != '"' and t[j] != "\n":
                j += 2 if t[j] == "\\" else 1
            out.append(t[i:j + 1]); i = j + 1
        else:
            out.append(t[i]); i += 1
    return "".join(out)


def find_ctags(prog):
    for p in ([prog] if prog else ["ctags-universal", "universal-ctags", "ctags"]):
        path = shutil.which(p)
        if not path:
            continue
        try:
            v = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
        except OSError:
            continue
        if "Universal Ctags" in v:
            return path
    return None


def ctags_functions(ctags, files):
    """[(file, name, line, end, static)] for every function definition."""
    if not files:
        return []
    r = subprocess.run(
        [ctags, "--langmap=C:.c.h", "--languages=C", "--c-kinds=f", "--fields=+nef", "-o", "-"] + files,
        capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(2)
    out = []
    for ln in r.stdout.splitlines():
        col = ln.split("\t")
        if len(col) < 4:
            continue
        f = {}
        static = False
        for c in col[3:]:
            if c == "file:":
                static = True
            elif ":" in c:
                k, v = c.split(":", 1)
                f[k] = v
        if "line" in f and "end" in f:
            out.append((col[1], col[0], int(f["line"]), int(f["end"]), static))
    return out


def sccs(nodes, edges):
    """Tarjan's strongly connected components (iterative), each sorted."""
    index, low, on, stack, comps = {}, {}, set(), [], []
    counter = [0]
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]; counter[0] += 1
                    stack.append(nxt); on.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                comps.append(sorted(comp))
    return comps


def cycle_path(comp, edges):
    """One circle through the component, for the message: a -> b -> a
    (the shortest one through its first file, found breadth-first)."""
    members = set(comp)
    start = comp[0]
    prev = {start: None}
    frontier = [start]
    while frontier:
        nf = []
        for v in frontier:
            for w in sorted(edges.get(v, ())):
                if w not in members:
                    continue
                if w == start:
                    path = []
                    while v is not None:
                        path.append(v)
                        v = prev[v]
                    return list(reversed(path)) + [start]
                if w not in prev:
                    prev[w] = v
                    nf.append(w)
        frontier = nf
    return comp


def main(argv):
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    prog = None
    i = 1
    while i < len(argv):
        if argv[i] == "--root" and i + 1 < len(argv):
            root = os.path.abspath(argv[i + 1]); i += 2
        elif argv[i] == "--ctags" and i + 1 < len(argv):
            prog = argv[i + 1]; i += 2
        else:
            sys.stderr.write(__doc__); return 2
    src = os.path.join(root, "src")
    if not os.path.isdir(src):
        sys.stderr.write("check.py: no folder %s\n" % src); return 2
    ctags = find_ctags(prog)
    if not ctags:
        sys.stderr.write("check.py: Universal Ctags not found (Debian package universal-ctags; "
                         "scripts/deps.sh test installs it)\n")
        return 2

    folders = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    files = {}  # folder -> sorted file names (every file, any type)
    for d in folders:
        names = []
        for dp, _, fns in os.walk(os.path.join(src, d)):
            for fn in fns:
                names.append(os.path.relpath(os.path.join(dp, fn), os.path.join(src, d)))
        files[d] = sorted(names)
    text = {}
    for d in folders:
        for fn in files[d]:
            with open(os.path.join(src, d, fn), "rb") as f:
                text[(d, fn)] = f.read().decode("utf-8", "replace")

    results = []  # (name, [problems])

    # Rule: layers. A lower layer that includes a higher one ties the
    # foundations to what is built on them: a change in the server would
    # reach the cache, and no layer could be tested or reused without the
    # ones above it. A folder that is not in LAYERS fails too: a new folder
    # takes a place in the order before it takes code.
    rank = {l: k for k, l in enumerate(LAYERS)}
    for d in folders:
        bad = []
        if d not in rank:
            bad.append("src/%s/ is not a layer (add it to LAYERS in tests/arch/check.py and docs/style.md)" % d)
        else:
            for fn in files[d]:
                if not fn.endswith((".c", ".h")):
                    continue
                for inc in INCLUDE_RE.findall(strip_includes_safe(text[(d, fn)])):
                    # "x.h" without a folder, or a folder that is not a
                    # layer (reported above when it is in src/), is not
                    # a layer crossing
                    top = inc.split("/", 1)[0] if "/" in inc else None
                    if top in rank and rank[top] > rank[d]:
                        bad.append("%s/%s includes %s (%s is above %s)" % (d, fn, inc, top, d))
        results.append(("layers_" + d, bad))

    # Rule: circles. Files of one folder that call each other in a circle
    # are one module in several files: none of them can be read, tested or
    # replaced alone, and the order in which to understand them is lost.
    # The graph: a .c file uses another when it names one of the other's
    # non-static functions (called, or taken as a pointer); comments and
    # strings do not count.
    allc = [os.path.join(src, d, fn) for d in folders for fn in files[d] if fn.endswith(".c")]
    funcs = ctags_functions(ctags, allc)
    for d in folders:
        cfiles = [fn for fn in files[d] if fn.endswith(".c")]
        owner = {}
        for (path, name, _, _, static) in funcs:
            rel = os.path.relpath(path, os.path.join(src, d))
            if static or rel.startswith("..") or rel not in cfiles:
                continue
            owner.setdefault(name, set()).add(rel)
        edges = {}
        for fn in cfiles:
            used = set(IDENT_RE.findall(strip_c(text[(d, fn)])))
            tgt = set()
            for name in used:
                for o in owner.get(name, ()):
                    if o != fn:
                        tgt.add(o)
            edges[fn] = tgt
        bad = []
        for comp in sccs(cfiles, edges):
            if len(comp) < 2:
                continue
            if any(ad == d and set(comp) <= af for (ad, af, _) in ALLOWED_CIRCLES):
                continue
            bad.append("circle %s (in {%s})" % (" -> ".join(cycle_path(comp, edges)), ", ".join(comp)))
        results.append(("circles_" + d, bad))

    # Rule: file size. A file past 2,000 lines holds more than one concern
    # (docs/style.md: one concern per module) and is read in pieces.
    for d in folders:
        bad = []
        for fn in files[d]:
            n = text[(d, fn)].count("\n") + (0 if text[(d, fn)].endswith("\n") or not text[(d, fn)] else 1)
            if n > MAX_FILE_LINES:
                bad.append("%s/%s: %d lines (max %d)" % (d, fn, n, MAX_FILE_LINES))
        results.append(("filesize_" + d, bad))

    # Rule: function size. A function past 250 lines mixes concerns
    # (parsing, running, reporting) that are easier to read, test and
    # change apart. Counted from its first line to its closing brace.
    allch = [os.path.join(src, d, fn) for d in folders for fn in files[d] if fn.endswith((".c", ".h"))]
    long_fn = {}
    for (path, name, line, end, _) in ctags_functions(ctags, allch):
        rel = os.path.relpath(path, src)
        d = rel.split(os.sep, 1)[0]
        if end - line + 1 > MAX_FUNC_LINES:
            long_fn.setdefault(d, []).append("%s:%d %s: %d lines (max %d)" % (rel, line, name, end - line + 1,
                                                                               MAX_FUNC_LINES))
    for d in folders:
        results.append(("funcsize_" + d, sorted(long_fn.get(d, []))))

    failed = 0
    for name, bad in results:
        if bad:
            failed += 1
            print("FAIL arch_%s: %s" % (name, "; ".join(bad)))
        else:
            print("ok arch_%s" % name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
