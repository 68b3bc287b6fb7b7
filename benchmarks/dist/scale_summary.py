#!/usr/bin/env python3
"""Medians of the GPT-2 124M scaling rounds (run_dist.sh, phase scale).

    python3 benchmarks/dist/scale_summary.py benchmarks/results/raw/dist

Reads gpt2_<variant>_r<round>.json (the summary of each run: tokens/s and ms/step over the
last two logging intervals) and prints, per variant, the median tokens/s and ms/step over the
rounds, and for 2-GPU variants the scaling efficiency against the median 1-GPU figure
(tokens/s / (2 x 1-GPU tokens/s)) with the per-round efficiencies (each round's 2-GPU run
against the same round's 1-GPU run).
"""
import json
import pathlib
import re
import statistics
import sys


def main() -> int:
    raw = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/raw/dist")
    runs: dict[str, dict[int, dict]] = {}
    for f in sorted(raw.glob("gpt2_*_r*.json")):
        m = re.fullmatch(r"gpt2_(.+)_r(\d+)\.json", f.name)
        if not m or m.group(1).endswith("_b"):
            continue
        runs.setdefault(m.group(1), {})[int(m.group(2))] = json.loads(f.read_text())
    if "1gpu" not in runs:
        print("scale_summary: no gpt2_1gpu_r*.json in", raw)
        return 1
    base = statistics.median(r["tokens_per_s"] for r in runs["1gpu"].values())
    print(f"{'variant':<16}{'rounds':>7}{'tokens/s':>12}{'ms/step':>10}{'efficiency':>12}  per round")
    for name in sorted(runs, key=lambda n: (not n.startswith("1"), n)):
        rs = runs[name]
        tps = statistics.median(r["tokens_per_s"] for r in rs.values())
        ms = statistics.median(r["ms_per_step"] for r in rs.values())
        if name.startswith("2gpu"):
            eff = f"{tps / (2 * base):.4f}"
            per = " ".join(f"{rs[k]['tokens_per_s'] / (2 * runs['1gpu'][k]['tokens_per_s']):.3f}"
                           for k in sorted(rs) if k in runs["1gpu"])
        else:
            eff, per = f"{tps / base:.4f}", ""
        print(f"{name:<16}{len(rs):>7}{tps:>12,.0f}{ms:>10.2f}{eff:>12}  {per}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
