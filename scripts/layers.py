#!/usr/bin/env python3
"""Keeps agent/src layered: no cycle between files, no import back up, every module in a layer.

Reads the non-test code of agent/src (skips `#[cfg(test)]` items, tests.rs, *_tests.rs, comments
and string contents), builds the graph of `crate::`/`super::`/`self::` imports between files
(following re-exports to the file that defines the item), and fails when:
  (a) files import each other in a cycle;
  (b) a top-level module imports one in its own or a higher layer of LAYERS below;
  (c) a top-level module of agent/src is missing from LAYERS (or LAYERS names one that is gone).
Python 3, stdlib only. `--self-test` checks the checker on small trees in a temp dir; `--derive`
prints the lowest layer each module could sit in today (a start when LAYERS needs changing).
"""

import os
import re
import sys
import tempfile

# Bottom to top. A module may import only modules in lower layers; modules in one layer are
# independent of each other. The data path reads upwards: volume <- providers/cache <- resolve
# <- fetch <- publish <- csi; mirror and convert sit beside csi, cmd on top.
LAYERS = [
    ["secret", "memory", "json", "tls", "telemetry", "compute", "grpc_code"],
    ["identity", "volume"],
    ["api"],
    ["catalog", "events"],
    ["providers"],
    ["cache", "resolve", "generators"],
    ["fetch"],
    ["publish"],
    ["csi", "mirror", "convert", "generator_gc", "cluster_external_secret"],
    # push_secret acts as service accounts under the mirror's consent and token-minting rules;
    # provider_status writes conditions as the mirror's store status does (mirror::status).
    ["push_secret", "provider_status"],
    ["cmd"],
]

ITEM_RE = re.compile(
    r"\b(?:fn|struct|enum|union|const|static|type|trait|macro_rules!)\s+([A-Za-z_][A-Za-z0-9_]*)"
)
MOD_RE = re.compile(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;")
USE_RE = re.compile(r"\buse\s+([^;]+);")
PATH_RE = re.compile(r"(?<![\w$])(crate|super|self)((?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)+)")


def strip(src):
    """Blanks comments and the contents of string/char literals, keeping line breaks."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
            continue
        m = re.match(r'b?r(#*)"', src[i:i + 260]) if c in "br" and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")) else None
        if m:
            end = '"' + m.group(1)
            j = src.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + re.sub(r"[^\n]", " ", src[i + 2:j]))
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('""' + re.sub(r"[^\n]", " ", src[i + 1:j]))
            i = j + 1
            continue
        if c == "'":
            if src.startswith("\\", i + 1):
                j = src.find("'", i + 3)
                out.append("' '")
                i = j + 1
                continue
            if i + 2 < n and src[i + 2] == "'":
                out.append("' '")
                i += 3
                continue
        out.append(c)
        i += 1
    return "".join(out)


def skip_item(code, i):
    """Index just past the item starting at i (ends at `;` or a balanced `{...}`)."""
    depth, n = 0, len(code)
    while i < n:
        c = code[i]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == ";" and depth == 0:
            return i + 1
        elif c == "{" and depth == 0:
            braces = 0
            while i < n:
                if code[i] == "{":
                    braces += 1
                elif code[i] == "}":
                    braces -= 1
                    if braces == 0:
                        return i + 1
                i += 1
        i += 1
    return n


def drop_tests(code):
    """Blanks every item under `#[cfg(test)]`, keeping line breaks."""
    while True:
        m = re.search(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]", code)
        if not m:
            return code
        i = m.end()
        while True:  # further attributes on the same item
            a = re.match(r"\s*#\s*\[", code[i:])
            if not a:
                break
            depth, j = 0, i + a.end() - 1
            while j < len(code):
                depth += {"[": 1, "]": -1}.get(code[j], 0)
                j += 1
                if depth == 0:
                    break
            i = j
        end = skip_item(code, i)
        code = code[:m.start()] + re.sub(r"[^\n]", " ", code[m.start():end]) + code[end:]


def use_leaves(tree, prefix=()):
    """Expands a use tree into (path segments, local name or None for globs)."""
    tree = tree.strip()
    # split top-level on the first `{`
    brace = tree.find("{")
    if brace < 0:
        parts = [p.strip() for p in tree.split("::")]
        last = parts[-1]
        alias = None
        am = re.match(r"(\w+)\s+as\s+(\w+)$", last)
        if am:
            parts[-1], alias = am.group(1), am.group(2)
        path = prefix + tuple(p for p in parts if p)
        if not path:
            return []
        if path[-1] == "*":
            return [(path[:-1], None)]
        if path[-1] == "self":
            path = path[:-1]
            return [(path, alias or (path[-1] if path else None))]
        return [(path, alias or path[-1])]
    head = tuple(p.strip() for p in tree[:brace].split("::") if p.strip())
    body = tree[brace + 1:tree.rfind("}")]
    items, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    items.append(cur)
    out = []
    for item in items:
        if item.strip():
            out.extend(use_leaves(item, prefix + head))
    return out


class Crate:
    def __init__(self, src):
        self.src = src
        self.files = {}  # module path (tuple) -> relative file path
        self.code = {}  # module path -> stripped non-test code
        self.children = {}  # module path -> set of child names
        self.load((), "lib.rs")

    def load(self, mod, rel):
        path = os.path.join(self.src, rel)
        with open(path, encoding="utf-8") as f:
            code = drop_tests(strip(f.read()))
        self.files[mod], self.code[mod] = rel, code
        self.children[mod] = set()
        base = os.path.dirname(rel) if (rel == "lib.rs" or rel.endswith("mod.rs")) else rel[:-3]
        for m in MOD_RE.finditer(code):
            name = m.group(1)
            if name == "tests" or name.endswith("_tests"):
                continue
            for cand in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
                if os.path.exists(os.path.join(self.src, cand)):
                    self.children[mod].add(name)
                    self.load(mod + (name,), cand)
                    break

    def absolute(self, mod, segs):
        """Turns crate/super/self-relative segments into an absolute path, or None."""
        segs = list(segs)
        if segs and segs[0] in self.children.get(mod, ()):
            segs = ["self"] + segs  # a child module, named from its parent
        if not segs or segs[0] not in ("crate", "super", "self"):
            return None
        if segs[0] == "crate":
            cur, segs = [], segs[1:]
        else:
            cur = list(mod)
            while segs and segs[0] in ("super", "self"):
                if segs.pop(0) == "super":
                    if not cur:
                        return None
                    cur.pop()
        return tuple(cur + segs)

    def target(self, path, seen=()):
        """The module whose file defines `path` (following `use` re-exports)."""
        mod = ()
        i = 0
        while i < len(path) and mod + (path[i],) in self.files:
            mod = mod + (path[i],)
            i += 1
        if i >= len(path) or path in seen:
            return mod
        name = path[i]
        code = self.code[mod]
        if any(m.group(1) == name for m in ITEM_RE.finditer(code)):
            return mod
        for m in USE_RE.finditer(code):
            for segs, local in use_leaves(m.group(1)):
                if local == name:
                    absolute = self.absolute(mod, segs)
                    if absolute is not None:
                        return self.target(absolute + tuple(path[i + 1:]), seen + (path,))
        return mod

    def imports(self, mod):
        """(target module, line, text) for every crate/super/self path in mod's file."""
        code = self.code[mod]
        found = []

        def add(segs, pos, text):
            absolute = self.absolute(mod, segs)
            if absolute is None:
                return
            t = self.target(absolute)
            # A module's own children are its parts, not imports: mod.rs declares and composes
            # them, and they may use its shared items (`super::Error`) without making a cycle.
            if t[:len(mod)] != mod and t in self.files:
                found.append((t, code.count("\n", 0, pos) + 1, " ".join(text.split())))

        aliases = {name: mod + (name,) for name in self.children[mod]}
        spans = []
        for m in USE_RE.finditer(code):
            spans.append((m.start(), m.end()))
            for segs, local in use_leaves(m.group(1)):
                add(segs, m.start(), "use " + "::".join(segs))
                absolute = self.absolute(mod, segs)
                if absolute is not None and absolute in self.files and local:
                    aliases[local] = absolute
        for m in PATH_RE.finditer(code):
            if any(a <= m.start() < b for a, b in spans):
                continue
            segs = [m.group(1)] + [s.strip() for s in m.group(2).split("::") if s.strip()]
            add(segs, m.start(), "::".join(segs))
        if aliases:
            alias_re = re.compile(
                r"(?<![\w$:])(" + "|".join(map(re.escape, aliases)) + r")((?:\s*::\s*[A-Za-z_]\w*)+)"
            )
            for m in alias_re.finditer(code):
                if any(a <= m.start() < b for a, b in spans):
                    continue
                segs = ["crate"] + list(aliases[m.group(1)])
                segs += [s.strip() for s in m.group(2).split("::") if s.strip()]
                add(segs, m.start(), "::".join(segs))
        return found


def top(mod):
    return mod[0] if mod else None


def check(src, layers):
    crate = Crate(src)
    problems = []
    layer_of = {}
    for depth, names in enumerate(layers):
        for name in names:
            layer_of[name] = depth
    tops = sorted(crate.children[()])
    for name in tops:
        if name not in layer_of:
            problems.append(f"{crate.files[(name,)]}: top-level module `{name}` is missing from LAYERS in scripts/layers.py")
    for name in layer_of:
        if name not in tops:
            problems.append(f"LAYERS in scripts/layers.py names `{name}`, which is not a module of {src}")

    graph = {}
    for mod in crate.files:
        edges = {}
        for t, line, text in crate.imports(mod):
            edges.setdefault(t, (line, text))
        graph[mod] = edges
        a, rel = top(mod), crate.files[mod]
        for t, (line, text) in sorted(edges.items()):
            b = top(t)
            if a is None or b is None or a == b or a not in layer_of or b not in layer_of:
                continue
            if layer_of[b] >= layer_of[a]:
                how = "the same layer as" if layer_of[b] == layer_of[a] else "a higher layer than"
                problems.append(
                    f"{rel}:{line}: `{text}` imports {crate.files[t]}: `{b}` (layer {layer_of[b]}) is in "
                    f"{how} `{a}` (layer {layer_of[a]}); move the shared piece below both"
                )

    cycles = find_cycles(graph)
    for cycle in cycles:
        steps = []
        for x, y in zip(cycle, cycle[1:] + cycle[:1]):
            line, text = graph[x][y]
            steps.append(f"  {crate.files[x]}:{line} `{text}` -> {crate.files[y]}")
        problems.append("import cycle between files:\n" + "\n".join(steps))
    return crate, problems, len(cycles)


def find_cycles(graph):
    """One cycle per strongly connected component with more than one file (Tarjan)."""
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for comp in comps:
        members = set(comp)
        start = min(comp)
        # shortest cycle through `start` inside the component (BFS back to start)
        prev, queue = {start: None}, [start]
        end = None
        while queue and end is None:
            v = queue.pop(0)
            for w in sorted(graph[v]):
                if w == start:
                    end = v
                    break
                if w in members and w not in prev:
                    prev[w] = v
                    queue.append(w)
        path = []
        while end is not None:
            path.append(end)
            end = prev[end]
        cycles.append(path[::-1])
    return cycles


def self_test():
    cases = {
        "clean": ({"lib.rs": "pub mod a;\npub mod b;\n", "a.rs": "pub const X: u8 = 1;\n",
                   "b.rs": "use crate::a::X;\n// use crate::b::x;\n#[cfg(test)]\nmod t { use crate::b; }\n"},
                  [["a"], ["b"]], 0),
        "upward": ({"lib.rs": "pub mod a;\npub mod b;\n", "a.rs": "fn f() { crate::b::g() }\n",
                    "b.rs": "pub fn g() {}\n"}, [["a"], ["b"]], 1),
        "same layer": ({"lib.rs": "pub mod a;\npub mod b;\n", "a.rs": "use crate::b::g;\n",
                        "b.rs": "pub fn g() {}\n"}, [["a", "b"]], 1),
        "missing": ({"lib.rs": "pub mod a;\npub mod b;\n", "a.rs": "", "b.rs": ""}, [["a"]], 1),
        "cycle": ({"lib.rs": "pub mod a;\n", "a/mod.rs": "mod x;\nmod y;\n",
                   "a/x.rs": "use super::y::{G, H as K};\npub fn f() {}\n",
                   "a/y.rs": "pub struct G;\npub struct H;\nfn g() { let s = \"super::z\"; super::x::f() }\n"},
                  [["a"]], 1),
        "re-export": ({"lib.rs": "pub mod a;\n", "a/mod.rs": "mod x;\nmod y;\npub use y::G;\n",
                       "a/x.rs": "use super::G;\npub fn f() {}\n",
                       "a/y.rs": "pub struct G;\nfn g() { super::x::f() }\n"},
                      [["a"]], 1),
    }
    failed = 0
    for name, (files, layers, want) in cases.items():
        with tempfile.TemporaryDirectory() as d:
            for rel, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
                with open(os.path.join(d, rel), "w") as f:
                    f.write(text)
            _, problems, _ = check(d, layers)
            if len(problems) != want:
                failed += 1
                print(f"self-test {name}: want {want} problem(s), got {problems}")
    print(f"layers.py self-test: {len(cases) - failed}/{len(cases)} passed")
    return 1 if failed else 0


def derive(src):
    """Prints the lowest layer each top-level module could sit in, from its imports today."""
    crate = Crate(src)
    deps = {name: set() for name in crate.children[()]}
    for mod in crate.files:
        for t, _, _ in crate.imports(mod):
            if top(mod) and top(t) and top(mod) != top(t):
                deps[top(mod)].add(top(t))
    level = {}

    def depth(name, path=()):
        if name in path:
            raise SystemExit("layers: modules import each other: " + " -> ".join(path + (name,)))
        if name not in level:
            level[name] = 1 + max((depth(d, path + (name,)) for d in deps[name]), default=-1)
        return level[name]

    for name in deps:
        depth(name)
    for i in range(max(level.values()) + 1):
        print(f"{i}: " + ", ".join(sorted(n for n in level if level[n] == i)))
    return 0


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent", "src")
    if "--self-test" in sys.argv[1:]:
        return self_test()
    if "--derive" in sys.argv[1:]:
        return derive(os.path.normpath(root))
    crate, problems, cycles = check(os.path.normpath(root), LAYERS)
    for p in problems:
        print("layers: " + p, file=sys.stderr)
    print(f"layers: {len(LAYERS)} layers deep, {len(crate.files)} files, {cycles} cycles, "
          f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
