#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks strata's layering: no source file includes a header of a folder
above its own, and no include cycle exists between files.

The layers (docs/design.md, "Layers"), lowest first; a folder may include its
own headers and those of the folders listed for it:

    base     -
    tiers    base          (tiers/nvme/ is part of tiers)
    swap     base tiers
    kernels  base
    optim    base
    comm     base
    models   base kernels
    engine   base tiers swap kernels optim comm models
    bench, tests, examples: any

Usage: scripts/check_layers.py [ROOT]   (exit 0: clean; 1: violations, listed)
"""
import os
import re
import sys

ALLOWED = {
    "base": set(),
    "tiers": {"base"},
    "swap": {"base", "tiers"},
    "kernels": {"base"},
    "optim": {"base"},
    "comm": {"base"},
    "models": {"base", "kernels"},
    "engine": {"base", "tiers", "swap", "kernels", "optim", "comm", "models"},
}
LIBRARY = set(ALLOWED)
ANY = {"bench", "tests", "examples"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = (".h", ".cc", ".cu", ".cuh", ".c")


def sources(root):
    for top in sorted(LIBRARY | ANY):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if f.endswith(SOURCES):
                    yield os.path.relpath(os.path.join(dirpath, f), root)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    problems = []
    graph = {}
    for path in sources(root):
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
        folder = path.split(os.sep)[0]
        deps = []
        for inc in INCLUDE.findall(text):
            target = inc.split("/")[0]
            if target not in LIBRARY | ANY:
                continue  # a system or third-party header
            if not os.path.exists(os.path.join(root, inc)):
                problems.append(f"{path}: includes \"{inc}\", which does not exist")
                continue
            deps.append(inc)
            if folder in ANY or target == folder:
                continue
            if target in ANY:
                problems.append(f"{path}: includes \"{inc}\" ({target}/ is not a library)")
            elif target not in ALLOWED[folder]:
                problems.append(f"{path}: includes \"{inc}\": {folder}/ may include only "
                                f"{', '.join(sorted(ALLOWED[folder] | {folder}))}")
        graph[path] = deps
    # File-level include cycles (iterative DFS).
    state = {}
    for start in graph:
        if state.get(start):
            continue
        stack = [(start, iter(graph[start]))]
        state[start] = 1
        chain = [start]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                chain.pop()
                continue
            if state.get(nxt) == 1:
                cyc = chain[chain.index(nxt):] + [nxt]
                problems.append("include cycle: " + " -> ".join(cyc))
            elif not state.get(nxt) and nxt in graph:
                state[nxt] = 1
                stack.append((nxt, iter(graph[nxt])))
                chain.append(nxt)
    for p in problems:
        print(p)
    print(f"{len(graph)} files checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
