#!/usr/bin/env python3
"""Turns the raw outputs of the former benchmarks/gpt2_124m/run.sh (forge-b<B>.jsonl, pytorch-<mode>-b<B>.json,
forge-ncu.csv) into the Markdown table of benchmarks/results/gpt2_124m_<gpu>.md. Superseded by
benchmarks/step/report.py (run.sh beside this file now runs benchmarks/step/run.sh); kept to re-read
the raw directories of that time. Its kernel table divides a window of launches by nothing: per
window, not per step."""
import argparse
import csv
import json
import os
import re
import subprocess


def forge_row(path, warmup, batch, seq=1024):
    recs = [json.loads(l) for l in open(path) if l.strip()]
    timed = [r for r in recs if "ms_per_step" in r and r["step"] > warmup and not r.get("skipped")]
    if not timed:
        return None
    # Each record averages the steps since the previous one: weight by the steps it covers.
    steps = [r["step"] for r in recs if "ms_per_step" in r]
    total_ms, total_steps = 0.0, 0
    for r in timed:
        prev = max(s for s in steps if s < r["step"])
        total_ms += r["ms_per_step"] * (r["step"] - prev)
        total_steps += r["step"] - prev
    ms = total_ms / total_steps
    mfus = [r["mfu"] for r in timed if "mfu" in r]
    return {"ms_per_step": ms, "tokens_per_s": batch * seq / (ms / 1e3),
            "mfu": sum(mfus) / len(mfus) if mfus else None,
            "peak_mem_bytes": max(r["mem_bytes"] for r in recs if "mem_bytes" in r), "steps": total_steps,
            "last_loss": timed[-1]["loss"]}


def kernel_family(name):
    """A readable bucket for a kernel name (cuBLASLt GEMMs by their prefixes)."""
    n = name.lower()
    for key, fam in (("flash", "attention (flash)"), ("gemm", "GEMM (cuBLASLt)"), ("nvjet", "GEMM (cuBLASLt)"), ("sm90_xmma", "GEMM (cuBLASLt)"),
                     ("cutlass", "GEMM (cuBLASLt)"), ("attention", "attention softmax"), ("softmax", "softmax"),
                     ("cross_entropy", "cross-entropy"), ("layer_norm", "layer norm"), ("norm", "norms"),
                     ("adamw", "AdamW"), ("grad_norm", "grad norm / clip"), ("clip", "grad norm / clip"),
                     ("embedding", "embedding"), ("radix", "embedding (sort)"), ("reduce", "reductions"),
                     ("gelu", "GELU"), ("binary", "elementwise"), ("unary", "elementwise"),
                     ("elementwise", "elementwise"), ("copy", "copies"), ("fill", "fill")):
        if key in n:
            return fam
    return "other"


def print_kernel_breakdown(path):
    rows = []
    with open(path) as fh:
        lines = [l for l in fh if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") == "gpu__time_duration.sum":
            rows.append((r["Kernel Name"], float(r["Metric Value"].replace(",", ""))))
    if not rows:
        return
    total = sum(t for _, t in rows)
    fams, kern = {}, {}
    for name, t in rows:
        f = kernel_family(name)
        fams[f] = fams.get(f, 0) + t
        k = kern.setdefault(name, [0.0, 0])
        k[0] += t
        k[1] += 1
    print(f"\n## Where forge's GPU time goes (Nsight Compute, batch 16, a window of {len(rows)} kernel launches "
          f"from step 3 on, {total / 1e6:.1f} ms of kernel time; each kernel timed alone)\n")
    print("| family | share | ms in the window |")
    print("|---|---|---|")
    for f, t in sorted(fams.items(), key=lambda x: -x[1]):
        print(f"| {f} | {100 * t / total:.1f}% | {t / 1e6:.2f} |")
    print("\n| kernel | share | calls in the window | ms in the window |")
    print("|---|---|---|---|")
    for name, (t, c) in sorted(kern.items(), key=lambda x: -x[1][0])[:20]:
        print(f"| `{name[:100].replace('|', '/')}` | {100 * t / total:.1f}% | {c} | {t / 1e6:.2f} |")


def gib(b):
    return f"{b / 2**30:.2f} GiB" if b is not None else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--command", default="benchmarks/gpt2_124m/run.sh")
    a = ap.parse_args()
    batches = sorted({int(m.group(1)) for f in os.listdir(a.raw) for m in [re.match(r".*-b(\d+)\.(json|jsonl)$", f)] if m})
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    torch_v = None
    print("# GPT-2 124M training: forge vs PyTorch\n")
    print(f"- Device: {gpu}")
    rows = []
    for b in batches:
        f = forge_row(os.path.join(a.raw, f"forge-b{b}.jsonl"), a.warmup, b) if os.path.exists(os.path.join(a.raw, f"forge-b{b}.jsonl")) else None
        peers = {}
        for mode in ("eager", "compile"):
            p = os.path.join(a.raw, f"pytorch-{mode}-b{b}.json")
            if os.path.exists(p):
                peers[mode] = json.load(open(p))
                torch_v = peers[mode].get("torch")
        rows.append((b, f, peers))
    print(f"- PyTorch: {torch_v} (bf16 autocast, F.scaled_dot_product_attention, fused AdamW; "
          "benchmarks/gpt2_124m/pytorch_gpt2.py)")
    print(f"- Command: `{a.command}`")
    print("- Workload: GPT-2 124M (12 x 768, 12 heads, vocab 50304, context 1024), uniform random tokens, "
          f"AdamW + clipping; the first {a.warmup} steps are warm-up and not timed; ms/step is the mean of the timed steps.")
    print("- MFU: (6·N + 12·L·T·d) FLOPs per token × tokens/s over the dense bf16 peak (989.4 TFLOP/s for H100 SXM); "
          "Note [MFU] in src/forge/telemetry/mfu.h.\n")
    print("| batch | run | tokens/s | ms/step | MFU | peak memory | forge / this (tokens/s) | forge / this (memory) |")
    print("|---|---|---|---|---|---|---|---|")
    for b, f, peers in rows:
        if f:
            mfu = f"{100 * f['mfu']:.1f}%" if f["mfu"] is not None else "-"
            print(f"| {b} | forge | {f['tokens_per_s']:,.0f} | {f['ms_per_step']:.1f} | {mfu} | {gib(f['peak_mem_bytes'])} | | |")
        else:
            print(f"| {b} | forge | failed (see raw log) | | | | | |")
        for mode, p in peers.items():
            r_tps = f"{f['tokens_per_s'] / p['tokens_per_s']:.3f}" if f else "-"
            r_mem = f"{f['peak_mem_bytes'] / p['peak_mem_bytes']:.3f}" if f else "-"
            print(f"| {b} | PyTorch {mode} | {p['tokens_per_s']:,.0f} | {p['ms_per_step']:.1f} | {100 * p['mfu']:.1f}% | "
                  f"{gib(p['peak_mem_bytes'])} | {r_tps} | {r_mem} |")
    ncu = os.path.join(a.raw, "forge-ncu.csv")
    if os.path.exists(ncu):
        print_kernel_breakdown(ncu)

if __name__ == "__main__":
    main()
