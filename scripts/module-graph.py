#!/usr/bin/env python3
"""Prints the router's module dependency graph and fails on an import cycle.

An edge `a -> b` means code in the top-level module `a` (router/src/a.rs or router/src/a/**) names
`crate::b` (in a `use`, a path or a grouped `use crate::{...}`); the router names other modules only
through `crate::` (a `super::` path stays inside its module). Comments are ignored; `#[cfg(test)]`
code counts like any other. The crate roots (lib.rs, main.rs) are not modules and are left out.

With the layer table of docs/architecture.md (`| layer | module | path | owns |`), a module may
depend only on modules of lower layers: an edge that points up or sideways fails too, and so does a
module the table does not name.

Usage: scripts/module-graph.py [--dot] [--src DIR] [--layers FILE]
Exit status: 0 when the graph is acyclic and follows the layers, 1 with what breaks it printed.
"""

import argparse
import pathlib
import re
import sys

ROOTS = {"lib", "main"}


def strip_comments(text: str) -> str:
    """Removes // and /* */ comments, leaving string literals alone (good enough for Rust source)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif c == "r" and re.match(r'r#*"', text[i:]):
            m = re.match(r'r(#*)"', text[i:])
            close = '"' + m.group(1)
            j = text.find(close, i + len(m.group(0)))
            j = n if j < 0 else j + len(close)
            out.append(text[i:j])
            i = j
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:]):
            m = re.match(r"'(\\.|[^\\'])'", text[i:])
            out.append(m.group(0))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def group_names(text: str, start: int) -> list[str]:
    """The first path segment of each item of a `{...}` group starting at text[start] == '{'."""
    depth, j, names, item = 0, start, [], ""
    while j < len(text):
        c = text[j]
        if c == "{":
            depth += 1
            if depth == 1:
                item = ""
                j += 1
                continue
        elif c == "}":
            depth -= 1
            if depth == 0:
                names.append(item)
                break
        elif c == "," and depth == 1:
            names.append(item)
            item = ""
            j += 1
            continue
        if depth == 1:
            item += c
        j += 1
    out = []
    for it in names:
        m = re.match(r"\s*(\w+)", it)
        if m and m.group(1) != "self":
            out.append(m.group(1))
    return out


def module_of(path: pathlib.Path, src: pathlib.Path) -> str:
    rel = path.relative_to(src)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def graph(src: pathlib.Path) -> tuple[set[str], dict[str, set[str]]]:
    modules, edges = set(), {}
    for path in sorted(src.rglob("*.rs")):
        me = module_of(path, src)
        if me in ROOTS:
            continue
        modules.add(me)
        text = strip_comments(path.read_text())
        for m in re.finditer(r"\bcrate::(\{|\w+)", text):
            targets = group_names(text, m.start(1)) if m.group(1) == "{" else [m.group(1)]
            for t in targets:
                if t != me:
                    edges.setdefault(me, set()).add(t)
    for a in list(edges):
        edges[a] = {b for b in edges[a] if b in modules}
    return modules, edges


def cycles(modules: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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

    sys.setrecursionlimit(10_000)
    for v in sorted(modules):
        if v not in index:
            visit(v)
    return out


def layers(doc: pathlib.Path) -> dict[str, int]:
    """Module → layer from the rows `| <n> | `module` | ...` of `doc`."""
    out = {}
    for line in doc.read_text().splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|\s*`(\w+)`\s*\|", line)
        if m:
            out[m.group(2)] = int(m.group(1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=str(pathlib.Path(__file__).resolve().parent.parent / "router" / "src"))
    ap.add_argument("--dot", action="store_true", help="print Graphviz dot instead of a list")
    ap.add_argument(
        "--layers",
        default=str(pathlib.Path(__file__).resolve().parent.parent / "docs" / "architecture.md"),
        help="the document whose layer table the graph must follow ('' to skip)",
    )
    args = ap.parse_args()
    modules, edges = graph(pathlib.Path(args.src))
    if args.dot:
        print("digraph router {")
        for a in sorted(modules):
            for b in sorted(edges.get(a, ())):
                print(f'  "{a}" -> "{b}";')
        print("}")
    else:
        for a in sorted(modules):
            print(f"{a:<12} -> {', '.join(sorted(edges.get(a, ()))) or '(nothing)'}")
    found = cycles(modules, edges)
    for comp in found:
        print(f"import cycle among: {', '.join(comp)}", file=sys.stderr)
        for a in comp:
            inside = sorted(b for b in edges.get(a, ()) if b in comp)
            print(f"  {a} -> {', '.join(inside)}", file=sys.stderr)
    broken = bool(found)
    if args.layers:
        table = layers(pathlib.Path(args.layers))
        for a in sorted(modules):
            if a not in table:
                print(f"module {a} is not in the layer table of {args.layers}", file=sys.stderr)
                broken = True
                continue
            for b in sorted(edges.get(a, ())):
                if b in table and table[b] >= table[a]:
                    print(
                        f"{a} (layer {table[a]}) depends on {b} (layer {table[b]}): dependencies "
                        "point down only",
                        file=sys.stderr,
                    )
                    broken = True
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
