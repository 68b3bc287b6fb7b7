#!/usr/bin/env python3
"""The layering of src/forge (docs/architecture.md, Layers), checked: every `#include "forge/<dir>/..."`
of a file in src/forge/<layer>/ names its own layer or one that layer may use, the layers form no
cycle, and the `FORGE_WITH_CUDA` conditionals outside the backends do not grow.

    python3 scripts/check-layers.py [--root .]      # exit 1 and one line per violation

A new layer, or a new use of one layer by another, is a change to ALLOWED below and to
docs/architecture.md together. The conditional counts are a ratchet: lower them when code moves
behind the backend interface (issue 38 asks for none in train/), never raise them.
"""
import argparse
import os
import re
import sys

# layer -> the layers it may include (besides itself). Lower layers first.
ALLOWED = {
    "core": set(),
    "autograd": {"core"},
    "backends": {"core"},
    "ops": {"core", "autograd", "backends"},
    "io": {"core", "ops"},
    "data": {"core", "ops", "io"},
    "nn": {"core", "autograd", "ops"},
    "optim": {"core", "autograd", "ops", "backends"},
    "parallel": {"core", "autograd", "backends", "ops", "io", "nn", "optim"},
    "plan": {"core", "ops", "nn", "parallel"},
    "telemetry": {"core", "backends", "io", "plan"},
    "bench": {"core", "autograd", "backends", "ops", "io", "nn", "parallel", "plan", "telemetry"},
    # What a run is: its config, model, layout, checkpoint state, data and model.init_from.
    "run": {"core", "autograd", "backends", "ops", "io", "data", "nn", "optim", "parallel", "plan", "telemetry"},
    # What is done with a run's model besides training it: sampling, evaluation, export.
    "interop": {"core", "autograd", "backends", "ops", "io", "data", "nn", "optim", "parallel", "plan",
                "telemetry", "run"},
    "train": {"core", "autograd", "backends", "ops", "io", "data", "nn", "optim", "parallel", "plan",
              "telemetry", "bench", "run", "interop"},
}

# `#if... FORGE_WITH_CUDA` lines outside src/forge/backends, per directory: at most these.
CUDA_CONDITIONALS = {
    "src/forge/ops": 33, "src/forge/bench": 32, "src/forge/parallel": 13,
    "src/forge/optim": 6, "src/forge/core": 2, "apps/forge": 1,
}

INCLUDE = re.compile(r'\s*#\s*include\s+"forge/([A-Za-z_]+)/')
CUDA_IF = re.compile(r"\s*#\s*(if|ifdef|ifndef|elif)\b.*\bFORGE_WITH_CUDA\b")
SOURCES = (".h", ".hpp", ".cpp", ".cu", ".cuh")


def acyclic(graph):
    state = {}

    def visit(n, path):
        if state.get(n) == 1:
            return path[path.index(n):] + [n]
        if state.get(n) == 2:
            return None
        state[n] = 1
        for m in sorted(graph.get(n, ())):
            cycle = visit(m, path + [n])
            if cycle:
                return cycle
        state[n] = 2
        return None

    for n in sorted(graph):
        cycle = visit(n, [])
        if cycle:
            return cycle
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    src = os.path.join(root, "src", "forge")
    problems = []

    cycle = acyclic(ALLOWED)
    if cycle:
        problems.append("ALLOWED has a cycle: " + " -> ".join(cycle))

    layers_seen = set()
    for layer in sorted(os.listdir(src)):
        d = os.path.join(src, layer)
        if not os.path.isdir(d):
            continue
        layers_seen.add(layer)
        if layer not in ALLOWED:
            problems.append(f"src/forge/{layer}/: a layer scripts/check-layers.py does not know: add it to ALLOWED "
                            "and to docs/architecture.md")
            continue
        for base, _, files in os.walk(d):
            for f in sorted(files):
                if not f.endswith(SOURCES):
                    continue
                path = os.path.join(base, f)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        if target != layer and target not in ALLOWED[layer]:
                            problems.append(f"{rel}:{n}: {layer}/ includes forge/{target}/, which it may not use "
                                            f"({layer}/ may use: {', '.join(sorted(ALLOWED[layer])) or 'nothing'})")
    for layer in sorted(set(ALLOWED) - layers_seen):
        problems.append(f"ALLOWED names '{layer}', which is not a directory of src/forge")

    counts = {}
    for top in ("src", "apps"):
        for base, _, files in os.walk(os.path.join(root, top)):
            rel_dir = os.path.relpath(base, root)
            if rel_dir.startswith(os.path.join("src", "forge", "backends")):
                continue
            for f in files:
                if not f.endswith(SOURCES):
                    continue
                with open(os.path.join(base, f), encoding="utf-8", errors="replace") as fh:
                    k = sum(1 for line in fh if CUDA_IF.match(line))
                if k:
                    key = "/".join(rel_dir.split(os.sep)[:3])
                    counts[key] = counts.get(key, 0) + k
    for key, k in sorted(counts.items()):
        limit = CUDA_CONDITIONALS.get(key, 0)
        if k > limit:
            problems.append(f"{key}: {k} FORGE_WITH_CUDA conditionals, more than its {limit}: put CUDA-specific "
                            "code behind the backend interface (DESIGN.md, Layers)")

    for p in problems:
        print("check-layers: " + p)
    total = sum(counts.values())
    print(f"check-layers: {len(problems)} problem(s); FORGE_WITH_CUDA conditionals outside the backends: {total} "
          f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
