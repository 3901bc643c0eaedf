#!/usr/bin/env python3
"""List import cycles between sibling modules of each crate.

A module is a file (foo.rs or foo/mod.rs). Module A depends on sibling B when
A's source (test modules excluded) names `super::B` or the absolute
`crate::<path-to-parent>::B`. A cycle among siblings means neither can be
understood (or moved) without the other, which the project rules forbid.
Usage: module-cycles.py [crate_src_dir ...]   (default: every */src in the workspace)
Exit status 1 when a cycle is found.
"""
import os
import re
import sys


def modules_of(src):
    """Map module path tuple -> file, e.g. ('qp','engine') -> proxy/src/qp/engine.rs."""
    mods = {}
    for root, _dirs, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
                parts = parts[:-1]
            mods[tuple(parts)] = os.path.join(root, f)
    return mods


def strip(text):
    text = re.sub(r"//[^\n]*", "", text)
    # drop `#[cfg(test)] mod x { ... }` bodies: tests may reach anywhere
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i : m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def names_in(group):
    if group.startswith("{"):
        return re.findall(r"(?:^|[{,\s])(\w+)", group.strip("{}"))
    return [group]


def deps(mod, text, mods):
    """Yield (parent, node, sibling) edges: `mod` (or the ancestor of `mod` that is a
    child of `parent`) depends on `sibling`, a child of the same `parent`."""
    for k in range(1, len(mod) + 1):
        parent, node = mod[: k - 1], mod[k - 1]
        siblings = {m[-1] for m in mods if len(m) == k and m[:-1] == parent and m[-1] != node}
        found = set()
        if k == len(mod):
            for m in re.finditer(r"\bsuper::(\{[^;]*?\}|\w+)", text):
                found |= {n for n in names_in(m.group(1)) if n in siblings}
        prefix = "crate::" + "".join(p + "::" for p in parent)
        for m in re.finditer(re.escape(prefix) + r"(\{[^;]*?\}|\w+)", text):
            found |= {n for n in names_in(m.group(1)) if n in siblings}
        for d in found:
            yield parent, node, d


def cycles(graph):
    """Tarjan SCCs of size > 1."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main():
    srcs = sys.argv[1:] or sorted(
        os.path.join(d, "src") for d in os.listdir(".") if os.path.isdir(os.path.join(d, "src"))
    )
    bad = 0
    for src in srcs:
        mods = modules_of(src)
        by_parent = {}
        for mod, path in mods.items():
            if not mod or any(p.startswith("tests") for p in mod):
                continue
            with open(path) as fh:
                text = strip(fh.read())
            for parent, node, d in deps(mod, text, mods):
                by_parent.setdefault(parent, {}).setdefault(node, set()).add(d)
        for parent, graph in sorted(by_parent.items()):
            for comp in cycles(graph):
                bad += 1
                where = "::".join(parent) or "crate root"
                edges = [f"{a}->{b}" for a in comp for b in sorted(graph.get(a, ())) if b in comp]
                print(f"{src} [{where}]: cycle among {', '.join(comp)} ({'; '.join(edges)})")
    print(f"{bad} sibling cycle(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
