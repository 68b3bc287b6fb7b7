#!/usr/bin/env python3
"""The pipeline-parallel report: benchmarks/results/pp_<gpu>.md from run_pp.sh's raw directory.

    python3 benchmarks/pp/report_pp.py benchmarks/results/raw/pp_NVIDIA_H200 > benchmarks/results/pp_NVIDIA_H200.md

Sections (each where its raw file exists): equivalence at pp = 2 (equivalence.jsonl), the bubble
of each schedule fitted from K = 4, 8, 16 beside theory and forge plan, with memory per stage
(bubble.jsonl), forge against PyTorch's torch.distributed.pipelining (peer.jsonl), and the slow
link simulated by NCCL's socket transport (socket.jsonl). Every number comes from the raw files.
"""
import json
import os
import sys

P = 2


def rows(raw, name):
    path = os.path.join(raw, name)
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.strip()]


def gb(x):
    return f"{x / 1e9:.1f} GB" if x else "—"


def fit(points):
    n = len(points)
    sx = sum(k for k, _ in points); sy = sum(t for _, t in points)
    sxx = sum(k * k for k, _ in points); sxy = sum(k * t for k, t in points)
    a = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return a, (sy - a * sx) / n


def main():
    raw = sys.argv[1]
    gpu = os.path.basename(raw.rstrip("/"))[len("pp_"):].replace("_", " ")
    commit = open(os.path.join(raw, "commit.txt")).read().strip() if os.path.exists(os.path.join(raw, "commit.txt")) else "?"
    w = print
    w(f"# Pipeline parallelism on {P} x {gpu} (issue 17)\n")
    w(f"forge commit `{commit}`; `benchmarks/pp/run_pp.sh` (raw: `raw/{os.path.basename(raw.rstrip('/'))}/`), written by "
      f"`benchmarks/pp/report_pp.py`. Every number below comes from this one machine. Model: "
      f"`configs/llama-0.85b.toml` (LLaMA, 16 blocks of width 2048, 32 / 8 heads, vocabulary 32000, sequences of 2048), "
      f"bf16 with f32 master weights, AdamW, micro-batches of 2 sequences.\n")

    eq = rows(raw, "equivalence.jsonl")
    if eq:
        w("## Equivalence: pp = 2 on two GPUs (NCCL send/recv) against one GPU\n")
        w("Tiny GPT and LLaMA (4 blocks), f32 without TF32, 20 steps of 4 micro-batches, gradient clipping; "
          "`benchmarks/dist/compare_runs.py`: every loss and every final weight, max |a - b| / max |b| per tensor. "
          "Tolerances of the data-parallel tests: SGD 1e-6, AdamW 5e-5.\n")
        w("| model | optimizer | schedule | losses | loss max rel | weight max rel | within |")
        w("|---|---|---|---|---|---|---|")
        for r in eq:
            x = r["result"]
            if "error" in x:
                w(f"| {r['model']} | {r['optim']} | {r['schedule']} | — | {x['error']} | | no |")
                continue
            tol = 1e-6 if r["optim"] == "sgd" else 5e-5
            ok = x["loss_max_rel"] <= 1e-6 and x["param_max_rel"] <= tol
            w(f"| {r['model']} | {r['optim']} | {r['schedule']} | {x['losses']} | {x['loss_max_rel']:.1e} | "
              f"{x['param_max_rel']:.1e} | {'yes' if ok else 'NO'} |")
        w("")

    bub = rows(raw, "bubble.jsonl")
    if bub:
        w("## The bubble of each schedule, against theory and forge plan\n")
        w("One step of K micro-batches takes a K + b: a is one micro-batch's forward and backward on the slower stage, "
          "b the fill and drain. a and b are fitted (least squares) from K = 4, 8, 16; the measured bubble is "
          "b / (a K + b). Theory: (P - 1) / (K + P - 1) for 1F1B and GPipe, a third of it for ZB-H1 (forward, input- "
          "and weight-gradient passes of equal cost), 1 / v of it for the interleaved schedule (v = 2 chunks per rank). "
          "ms/step is the mean of the last two logged intervals (8 steps after 4). `forge plan` is given the same layout "
          "(`--pp 2 --dp 1 --micro-batch 2 --grad-accum K --schedule S`) at its default MFU of 40%; its memory is the "
          "allocator's live bytes (without margin and reserve) against the peak the trainer gathers per stage.\n")
        w("| schedule | K | ms/step | tokens/s | MFU | bubble measured | theory | plan step | plan bubble | "
          "memory per stage (measured) | plan | split |")
        w("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for sched in ("1f1b", "gpipe", "zb-h1", "interleaved"):
            pts = [r for r in bub if r["schedule"] == sched and "ms_per_step" in r["result"]]
            if len(pts) < 2:
                continue
            a, b = fit([(r["K"], r["result"]["ms_per_step"]) for r in pts])
            for r in pts:
                k, x, p = r["K"], r["result"], r.get("plan", {})
                theory = (P - 1) / (k + P - 1) * {"zb-h1": 1 / 3, "interleaved": 1 / 2}.get(sched, 1)
                plan_bubble = p.get("bubble_s", 0) / p["step_s"] if p.get("step_s") else float("nan")
                mem = " / ".join(gb(m) for m in (x.get("mem_bytes_per_stage") or []))
                pmem = " / ".join(gb(m) for m in (p.get("mem_subtotal_per_stage") or []))
                mfu = f"{100 * x['mfu']:.1f}%" if x.get("mfu") else "—"
                w(f"| {sched} | {k} | {x['ms_per_step']:.1f} | {x['tokens_per_s'] / 1e3:.1f}k | {mfu} | "
                  f"{b / (a * k + b):.3f} | {theory:.3f} | {1e3 * p.get('step_s', float('nan')):.0f} ms | "
                  f"{plan_bubble:.3f} | {mem} | {pmem} | {x.get('stage0_blocks')} + ... (plan {p.get('stage_layers')}) |")
            w(f"| {sched} fit | | a = {a:.2f} ms, b = {b:.1f} ms (b / a = {b / a:.2f}) | | | | | | | | | |")
        w("")

    peer = rows(raw, "peer.jsonl")
    if peer:
        w("## forge against PyTorch's own pipelining at pp = 2\n")
        w("PyTorch: `benchmarks/pp/torch_pp_peer.py` under torchrun, `torch.distributed.pipelining` (PipelineStage per "
          "stage, Schedule1F1B / ScheduleGPipe / ScheduleInterleaved1F1B; ScheduleInterleavedZeroBubble with one stage "
          "per rank for the zero-bubble class), the same model, micro-batches (K = 8 of 2), stage split (forge plan's, "
          "which forge train uses) and optimizer; each block compiled (`torch.compile`) unless marked eager. forge: "
          "the bubble run of the same schedule and K above.\n")
        w("| schedule | PyTorch | PyTorch tokens/s | PyTorch peak / GPU | forge tokens/s | forge peak / GPU | forge / PyTorch |")
        w("|---|---|---|---|---|---|---|")
        for r in peer:
            x = r["result"]
            f = next((b["result"] for b in bub if b["schedule"] == r["schedule"] and b["K"] == r["K"]
                      and "tokens_per_s" in b["result"]), None)
            if "error" in x:
                w(f"| {r['schedule']} | {x.get('peer', '')} | failed: {x['error'][:120]} | | "
                  f"{f['tokens_per_s'] / 1e3:.1f}k | {gb(f.get('mem_bytes_max'))} | |" if f else f"| {r['schedule']} | failed | | | | | |")
                continue
            ratio = f"{f['tokens_per_s'] / x['tokens_per_s']:.2f}x tokens/s" if f else "—"
            w(f"| {r['schedule']} | {x['peer']} | {x['tokens_per_s'] / 1e3:.1f}k | {gb(x['peak_mem_bytes'])} | "
              f"{f['tokens_per_s'] / 1e3:.1f}k | {gb(f.get('mem_bytes_max'))} | {ratio} |" if f else
              f"| {r['schedule']} | {x['peer']} | {x['tokens_per_s'] / 1e3:.1f}k | {gb(x['peak_mem_bytes'])} | | | |")
        w("")

    sock = rows(raw, "socket.jsonl")
    if sock:
        w("## A slow link: pp = 2 against dp = 2 on NCCL's socket transport\n")
        w("`NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`: the two GPUs talk through host sockets, as two hosts on Ethernet "
          "would. The same global batch (16 sequences): pp = 2 with 1F1B over K = 8 micro-batches of 2, and dp = 2 "
          "(DDP) with 4 micro-batches of 2 per GPU. The link's bus bandwidth is measured first (`forge bench "
          "collectives`, bf16, 64 MiB) and given to `forge plan` as the GPU-GPU link (`--nvlink <busbw> "
          "--link-efficiency 1`), which then predicts both layouts.\n")
        w("| link | bus bandwidth (all_reduce / send_recv) | layout | tokens/s | ms/step | peak / GPU | plan tokens/s | "
          "plan step | plan exposed dp comm | plan p2p |")
        w("|---|---|---|---|---|---|---|---|---|---|")
        bw = {}
        for r in sock:
            if "busbw_gbs" in r:
                bw[r["link"]] = r["busbw_gbs"]
                continue
            x, p = r["result"], r.get("plan", {})
            b = bw.get(r["link"], {})
            w(f"| {r['link']} | {b.get('all_reduce', 0):.1f} / {b.get('send_recv', 0):.1f} GB/s | {r['layout']} | "
              f"{x.get('tokens_per_s', 0) / 1e3:.1f}k | {x.get('ms_per_step', 0):.0f} | {gb(x.get('mem_bytes_max'))} | "
              f"{p.get('tokens_per_s', 0) / 1e3:.1f}k | {1e3 * p.get('step_s', 0):.0f} ms | "
              f"{1e3 * p.get('dp_exposed_s', 0):.0f} ms | {1e3 * p.get('pp_p2p_s', 0):.1f} ms |")
        w("")


if __name__ == "__main__":
    main()
