#!/usr/bin/env python3
"""Where two training runs part: the mean training loss per window of steps for several runs
(forge's metrics.jsonl, reference.py's jsonl), each forge run's relative difference from each
PyTorch run per window and over the windows after --after, and the validation losses side by side.

    python3 ab_windows.py --run "forge bf16=RAW/gpt2_b1000/forge/metrics.jsonl" \
        --run "forge f32=RAW/gpt2_f32/forge/metrics.jsonl" \
        --ref "PyTorch compile=RAW/gpt2_b1000/ref_compile.jsonl" [--window 100] [--after 500] > ab.md

For the A/B of issue 37 (scripts/gpu-convergence.sh, PHASE=ab-forge then ab-ref): forge in bf16,
in f32 and with its fused kernels off, beside PyTorch with f32 parameters under autocast, in pure
f32, and with bf16 parameters; a path that explains forge's systematic gap makes it vanish.
A record counts as a training loss when it has "step" and "loss", no "val_loss" and is not "final"
(forge's last record repeats the last step); validation losses are the records with "val_loss".
"""
import argparse
import json


def read(path):
    train, val = {}, {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if r.get("final") or "step" not in r:
                continue
            s = int(r["step"])
            if isinstance(r.get("val_loss"), (int, float)):
                val[s] = float(r["val_loss"])
            elif isinstance(r.get("loss"), (int, float)):
                train[s] = float(r["loss"])
    return train, val


def named(spec):
    if "=" not in spec:
        raise SystemExit(f"ab_windows.py: expected NAME=PATH, got '{spec}'")
    name, path = spec.split("=", 1)
    return name, path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", action="append", default=[], help="NAME=forge metrics.jsonl (repeatable)")
    ap.add_argument("--ref", action="append", default=[], help="NAME=reference.py jsonl (repeatable)")
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--after", type=int, default=500, help="the mean difference over the windows starting after this step")
    a = ap.parse_args()
    if not a.run or not a.ref:
        raise SystemExit("ab_windows.py: give at least one --run and one --ref")
    series = {}
    for spec in a.run + a.ref:
        name, path = named(spec)
        series[name] = read(path)
    runs = [named(s)[0] for s in a.run]
    refs = [named(s)[0] for s in a.ref]
    last = max(max(t) for t, _ in series.values() if t)
    windows = [(lo, min(lo + a.window - 1, last)) for lo in range(1, last + 1, a.window)]

    def mean(name, w):
        xs = [series[name][0][s] for s in range(w[0], w[1] + 1) if s in series[name][0]]
        return sum(xs) / len(xs) if xs else None

    out = [f"### Mean training loss per {a.window}-step window\n", "| window | " + " | ".join(runs + refs) + " |",
           "|---|" + "---:|" * len(runs + refs)]
    for w in windows:
        out.append(f"| {w[0]}-{w[1]} | " + " | ".join("-" if mean(n, w) is None else f"{mean(n, w):.4f}" for n in runs + refs) + " |")
    pairs = [(r, p) for r in runs for p in refs]

    def diff(r, p, w):
        x, y = mean(r, w), mean(p, w)
        return None if x is None or y is None else 100.0 * (x - y) / y

    out += ["", "### (run - reference) / reference, % of the window's mean training loss\n",
            "| window | " + " | ".join(f"{r} vs {p}" for r, p in pairs) + " |", "|---|" + "---:|" * len(pairs)]
    for w in windows:
        out.append(f"| {w[0]}-{w[1]} | " + " | ".join("-" if diff(r, p, w) is None else f"{diff(r, p, w):+.3f}" for r, p in pairs) + " |")
    cells = []
    for r, p in pairs:
        xs = [d for w in windows if w[0] > a.after for d in [diff(r, p, w)] if d is not None]
        cells.append(f"**{sum(xs) / len(xs):+.3f}** ({len(xs)})" if xs else "-")
    out.append(f"| mean after step {a.after} | " + " | ".join(cells) + " |")
    steps = sorted({s for n in runs + refs for s in series[n][1]})
    if steps:
        out += ["", "### Validation loss\n", "| step | " + " | ".join(runs + refs) + " |", "|---:|" + "---:|" * len(runs + refs)]
        for s in steps:
            out.append(f"| {s} | " + " | ".join(f"{series[n][1][s]:.4f}" if s in series[n][1] else "-" for n in runs + refs) + " |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
