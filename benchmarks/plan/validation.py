#!/usr/bin/env python3
"""forge plan's predictions for every layout forge has measured on H100s (issue 41), at the plan's
defaults (the shipped H100 SXM efficiency profile), beside the measurements.

    python3 benchmarks/plan/validation.py --forge build/forge [--measured FILE.json] > table.md

Each row: the plan command, its predicted tokens/s, and, where known, the measured tokens/s and
the error (prediction / measurement - 1). --measured adds a column of new measurements (JSON
{row name: tokens/s}); the rows' earlier measurements are the results files named in each row.
"""
import argparse
import json
import subprocess
import sys

L085 = ["--config", "configs/llama-0.85b.toml"]
GPT2 = ["--config", "configs/gpt2-124m.toml"]
L36 = ["--config", "configs/llama-3.6b.toml"]
S = "step_NVIDIA_H100_80GB_HBM3.md"
X4 = "scale_NVIDIA_H100_80GB_HBM3_x4.md"
F8 = "fp8_NVIDIA_H100_80GB_HBM3.md"
ROWS = [
    # name, plan arguments, earlier measurement (tokens/s), its file
    ("gpt2 1 GPU, 16 x 1024", GPT2 + ["--batch", "16", "--micro-batch", "16"], 498571, S),
    ("gpt2 1 GPU, 32 x 1024", GPT2 + ["--batch", "32", "--micro-batch", "32"], 511763, S),
    ("llama-0.85b 1 GPU, 4 x 2048", L085 + ["--batch", "4", "--micro-batch", "4"], 85468, S),
    ("llama-3.6b 1 GPU, 2 x 2048", L36 + ["--batch", "2", "--micro-batch", "2"], 23005, F8),
    ("gpt2 DDP 2 GPUs, 16 x 1024 each", GPT2 + ["--gpus", "2", "--batch", "32", "--micro-batch", "16"], 939600, X4),
    ("gpt2 DDP 4 GPUs, 16 x 1024 each", GPT2 + ["--gpus", "4", "--batch", "64", "--micro-batch", "16"], 1871100, X4),
] + [
    (f"llama-0.85b ZeRO-{z} 4 GPUs, 4 x 2048 each", L085 + ["--gpus", "4", "--batch", "16", "--micro-batch", "4", "--zero", str(z)], v, X4)
    for z, v in [(0, 315800), (1, 325000), (2, 331800), (3, 329800)]
] + [
    (f"llama-0.85b tp {t}{' + sp' if sp else ''}, 8 x 2048", L085 + ["--gpus", str(t), "--tp", str(t), "--batch", "8", "--micro-batch", "8", "--sp" if sp else "--no-sp"], v, X4)
    for t, sp, v in [(2, False, 120800), (2, True, 91500), (4, False, 151000), (4, True, 109300)]
] + [
    (f"llama-0.85b pp 4 {s}, {k} x (2 x 2048)", L085 + ["--gpus", "4", "--pp", "4", "--batch", str(2 * k), "--micro-batch", "2", "--schedule", s] + (["--virtual-stages", "2"] if s == "interleaved" else []), v, X4)
    for s, k, v in [("1f1b", 8, 259500), ("1f1b", 16, 291800), ("gpipe", 8, 245600), ("gpipe", 16, 284500),
                    ("zb-h1", 8, 279900), ("zb-h1", 16, 301000), ("interleaved", 8, 290500), ("interleaved", 16, 307200)]
] + [
    ("llama-0.85b dp2.tp2, 8 x 2048 x 1", L085 + ["--gpus", "4", "--dp", "2", "--tp", "2", "--batch", "16", "--micro-batch", "8"], 236600, X4),
    ("llama-0.85b tp2.pp2, 2 x 2048 x 8", L085 + ["--gpus", "4", "--tp", "2", "--pp", "2", "--batch", "16", "--micro-batch", "2"], 193900, X4),
    ("llama-0.85b dp2.pp2, 2 x 2048 x 4", L085 + ["--gpus", "4", "--dp", "2", "--pp", "2", "--batch", "16", "--micro-batch", "2"], 275100, X4),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--forge", default="build/forge")
    ap.add_argument("--measured", help="JSON {row: tokens/s} of new measurements")
    ap.add_argument("--check-rows", type=int, help="(make test) exit 1 unless this many rows were planned")
    ap.add_argument("--extra", action="append", default=[], help="an argument added to every plan (repeat: --extra=--profile --extra=FILE)")
    a = ap.parse_args()
    new = json.load(open(a.measured)) if a.measured else {}
    print("| row | plan command (forge plan ... --gpu h100) | predicted tok/s | step ms | GEMM / attention / memory / optimizer / comm ms |"
          " earlier measured tok/s (file) | error | new measured tok/s | error |")
    print("|---|---|---:|---:|---|---:|---:|---:|---:|")
    errs = []
    for name, args, earlier, src in ROWS:
        cmd = [a.forge, "plan"] + args + ["--gpu", "h100", "--json"] + a.extra
        j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        t = j["time"]
        tok = t["tokens_per_s"]
        comm = t["tp_comm"] + t["pp_p2p"] + t["dp_exposed"] + t["bubble"] + t["cp_comm"]
        e = tok / earlier - 1
        errs.append(e)
        m = new.get(name)
        print(f"| {name} | `{' '.join(args)}` | {tok:,.0f} | {t['step'] * 1e3:.1f} | "
              f"{t['gemm'] * 1e3:.1f} / {t['attention'] * 1e3:.1f} / {t['memory_bound'] * 1e3:.1f} / "
              f"{(t['optimizer'] + t['offload']) * 1e3:.1f} / {comm * 1e3:.1f} | {earlier:,} ({src}) | {e:+.1%} | "
              + (f"{m:,.0f} | {tok / m - 1:+.1%} |" if m else "| |"))
    if a.check_rows is not None and len(errs) != a.check_rows:
        print(f"validation.py: {len(errs)} rows planned, expected {a.check_rows}", file=sys.stderr)
        return 1
    within = sum(abs(e) <= 0.10 for e in errs)
    print(f"\nAgainst the earlier measurements: {within} of {len(errs)} rows within ±10%; "
          f"median |error| {sorted(abs(e) for e in errs)[len(errs) // 2]:.1%}, largest {max(errs, key=abs):+.1%}.")


if __name__ == "__main__":
    sys.exit(main())
