#!/usr/bin/env python3
"""The package's shape in numbers: files and lines per folder, the longest functions, the
import circles (module-level and function-local imports alike) and the upward imports
against the levels of docs/extending.md.

    .venv/bin/python scripts/layout_report.py [--root DIR] [--top N]

The levels come from tests/test_levels.py's parser of the page (it imports pytest: run it
with the workflow env); the rest is the standard library. The tool behind the
before/after figures of the layout redesign (issue 31). Exit status 1 when there is a
circle or an upward import, 0 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def checker(root: Path):
    """tests/test_levels.py of ``root``: the one parser of the page's levels and of the
    package's modules and imports, shared with the test that enforces them."""
    sys.path.insert(0, str(root / "tests"))
    try:
        import test_levels
    finally:
        sys.path.pop(0)
    return test_levels


def graph(mods: dict[str, Path], tl) -> dict[str, set[str]]:
    """Module -> the modules it imports, function-local imports included."""
    g = {}
    for mod, path in mods.items():
        names = [n for n, _ in tl.imports(path, top_level_only=False)]
        targets = {tl.resolve(n, mods) for n in names} - {None, mod}
        # a package's own __init__ is not an edge to its children
        g[mod] = {t for t in targets if not mod.startswith(t + ".")}
    return g


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                strong(w)
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

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            strong(v)
    return out


def longest_functions(mods: dict[str, Path], top: int) -> list[tuple[int, str]]:
    found = []
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((node.end_lineno - node.lineno + 1, f"{mod}.{node.name}"))
    return sorted(found, reverse=True)[:top]


def folder_lines(root: Path, dirs: list[str]) -> list[tuple[str, int, int]]:
    per = defaultdict(lambda: [0, 0])
    for d in dirs:
        base = root / d
        if not base.exists():
            continue
        for p in base.rglob("*.py"):
            if "__pycache__" in p.parts:
                continue
            key = str(p.parent.relative_to(root))
            per[key][0] += 1
            per[key][1] += len(p.read_text().splitlines())
    return sorted((k, v[0], v[1]) for k, v in per.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    ap.add_argument("--top", type=int, default=5, help="how many longest functions to list")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    src = root / "src" / "hvdscale"
    tl = checker(root)
    mods = tl.modules(src)

    print("## Files and lines per folder")
    print("| folder | files | lines |\n|---|---:|---:|")
    total = [0, 0]
    for folder, n, lines in folder_lines(root, ["src", "benchmarks", "scripts", "tests"]):
        print(f"| {folder} | {n} | {lines} |")
        total[0] += n
        total[1] += lines
    print(f"| all | {total[0]} | {total[1]} |")

    print(f"\n## The {args.top} longest functions (lines)")
    for n, name in longest_functions(mods, args.top):
        print(f"- {name}: {n}")

    g = graph(mods, tl)
    found = circles(g)
    print("\n## Import circles (function-local imports included)")
    print("\n".join(f"- {' <-> '.join(c)}" for c in found) or "none")

    levels = tl.doc_levels((root / "docs" / "extending.md").read_text())
    level_of = tl.level_of
    upward = []
    for mod, targets in sorted(g.items()):
        mine = level_of(mod, levels)
        for t in sorted(targets):
            theirs = level_of(t, levels)
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{mod} ({mine}) -> {t} ({theirs})")
    unlisted = [m for m in mods if level_of(m, levels) is None]
    print("\n## Upward imports (docs/extending.md levels)")
    print("\n".join(f"- {u}" for u in upward) or "none")
    if unlisted:
        print(f"\nmodules without a level: {', '.join(unlisted)}")
    return 1 if found or upward else 0


if __name__ == "__main__":
    sys.exit(main())
