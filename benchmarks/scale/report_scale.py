#!/usr/bin/env python3
"""benchmarks/results/scale_<gpu>_x<N>.md from benchmarks/scale/run_scale.sh's raw directory.

    python3 benchmarks/scale/report_scale.py RAW_DIR > benchmarks/results/scale_<gpu>_x<N>.md
    python3 benchmarks/scale/report_scale.py --collectives RAW_DIR     # the collectives table alone

Every figure is read from RAW_DIR (JSON lines per phase, forge bench collectives' JSON, nccl-tests'
output); nothing is typed in. MFU of a PyTorch run uses forge's formula (Note [MFU]): tokens/s x
model FLOPs per token / (GPUs x the GPU's dense bf16 peak), the peak of the catalogue (989.4 TFLOP/s
for the H100 SXM and the H200).
"""
import argparse
import glob
import json
import os
import sys

PEAK = 989.4e12
GB = 1e9


def rows(raw, phase):
    path = os.path.join(raw, phase + ".jsonl")
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def ok(r):
    return isinstance(r.get("result"), dict) and "tokens_per_s" in r["result"]


def mem_of(res):
    """The peak memory of a forge run (largest rank) or a PyTorch run (rank 0), bytes."""
    return res.get("mem_bytes_max") or res.get("mem_bytes") or res.get("peak_mem_bytes")


def fmt_tok(x):
    return f"{x / 1e3:,.1f}k" if x is not None else "-"


def fmt_gb(x):
    return f"{x / GB:.1f}" if x else "-"


def pct(a, b):
    return f"{100 * (a / b - 1):+.0f}%" if a and b else "-"


def failed(r):
    e = r.get("result", {}).get("error", "failed")
    return ("OOM: " if r.get("result", {}).get("oom") else "") + e[:90]


def peer_mfu(res, gpus):
    f = res.get("flops_per_token")
    return res["tokens_per_s"] * f / (gpus * PEAK) if f else None


def plan_mem(plan, measured):
    """forge plan's bytes in tensors (its subtotal: what a peak of allocated bytes measures) with its
    error against the measurement, then its total (with the allocator margin and the reserve)."""
    sub, tot = plan.get("mem_subtotal"), plan.get("mem_total")
    return f"{fmt_gb(sub)} ({pct(sub, measured)}); {fmt_gb(tot)}"


def fmt_mfu(x):
    return f"{100 * x:.1f}%" if x is not None else "-"


# ---- collectives -----------------------------------------------------------------------------------
def nccl_tests(path):
    """nccl-tests' table -> {bytes: out-of-place busbw GB/s}."""
    out = {}
    if not os.path.exists(path):
        return out
    for line in open(path):
        f = line.split()
        if not f or line.lstrip().startswith("#") or not f[0].isdigit() or len(f) < 8:
            continue
        try:
            out[int(f[0])] = float(f[7])
        except ValueError:
            pass
    return out


def collectives(raw):
    path = os.path.join(raw, "collectives_forge.json")
    if not os.path.exists(path):
        return ["(no forge bench collectives result)"]
    j = json.load(open(path))
    lines = [f"forge bench collectives on {j.get('world')} GPUs ({j.get('backend')}, {j.get('dtype')}, "
             f"{j.get('iters')} timed after {j.get('warmup')} warm-up operations, the slowest rank's time) beside "
             "NCCL's own nccl-tests (out-of-place, one process driving every GPU, the same sizes and iteration "
             "counts). Bus bandwidth in GB/s (nccl-tests' definition: algbw x 2(W-1)/W for all_reduce, "
             "x (W-1)/W for the others).", ""]
    ops = []
    for r in j["results"]:
        if r["op"] not in ops:
            ops.append(r["op"])
    show = {8, 1024, 65536, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30}
    for op in ops:
        ref = nccl_tests(os.path.join(raw, f"nccltests_{op}.txt"))
        mpi = nccl_tests(os.path.join(raw, f"nccltests_mpi_{op}.txt"))  # one process per GPU, where run
        lines += [f"**{op}**", "", "| bytes | forge busbw | nccl-tests busbw | forge / nccl-tests |"
                  + (" nccl-tests, a process per GPU |" if mpi else ""), "|---:|---:|---:|---:|" + ("---:|" if mpi else "")]
        for r in j["results"]:
            if r["op"] != op:
                continue
            b = r["bytes"]
            near = min(ref, key=lambda k: abs(k - b)) if ref else None
            if b not in show and not (near and near in show and abs(near - b) < max(64, b // 64)):
                continue
            nt = ref.get(near) if near is not None and abs(near - b) <= max(64, b // 64) else None
            ratio = f"{r['busbw_gbs'] / nt:.2f}" if nt else "-"
            extra = f" {mpi.get(near, '-')} |" if mpi else ""
            lines.append(f"| {b:,} | {r['busbw_gbs']:.2f} | {nt if nt is not None else '-'} | {ratio} |{extra}")
        lines.append("")
    return lines


# ---- the training phases ----------------------------------------------------------------------------
def ddp(raw):
    R = rows(raw, "ddp")
    if not R:
        return []
    forge = {r["gpus"]: r for r in R if r["who"] == "forge"}
    peer = {r["gpus"]: r for r in R if r["who"] == "pytorch"}
    one_f = forge.get(1, {}).get("result", {}).get("tokens_per_s")
    one_p = peer.get(1, {}).get("result", {}).get("tokens_per_s")
    out = ["| GPUs | forge tok/s | scaling eff. | MFU | peak mem GB; plan in tensors (error); plan total | plan tok/s | PyTorch DDP+compile tok/s | "
           "its eff. | forge / PyTorch |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for g in sorted(set(forge) | set(peer)):
        f, p = forge.get(g), peer.get(g)
        fr = f["result"] if f and ok(f) else None
        pr = p["result"] if p and ok(p) else None
        cells = [str(g)]
        if fr:
            cells += [fmt_tok(fr["tokens_per_s"]), f"{fr['tokens_per_s'] / (g * one_f):.3f}" if one_f else "-",
                      fmt_mfu(fr.get("mfu")), f"{fmt_gb(mem_of(fr))}; {plan_mem(f['plan'], mem_of(fr))}",
                      fmt_tok(f["plan"].get("tokens_per_s"))]
        else:
            cells += [failed(f) if f else "-", "-", "-", "-", "-"]
        if pr:
            cells += [fmt_tok(pr["tokens_per_s"]), f"{pr['tokens_per_s'] / (g * one_p):.3f}" if one_p else "-"]
        else:
            cells += [failed(p) if p else "not run", "-"]
        cells.append(f"{fr['tokens_per_s'] / pr['tokens_per_s']:.2f}" if fr and pr else "-")
        out.append("| " + " | ".join(cells) + " |")
    return out


def zero(raw):
    R = rows(raw, "zero")
    if not R:
        return []
    one_f = next((r["result"]["tokens_per_s"] for r in R if r["who"] == "forge" and r["gpus"] == 1 and ok(r)), None)
    one_p = next((r["result"]["tokens_per_s"] for r in R if r["who"] == "pytorch" and r["gpus"] == 1 and ok(r)), None)
    peer_of = {"1gpu": "1gpu", "zero0": "ddp", "zero1": "ddp", "zero2": "fsdp2_zero2", "zero3": "fsdp2_zero3"}
    peers = {r["layout"]: r for r in R if r["who"] == "pytorch"}
    out = ["| layout | GPUs | forge tok/s | scaling eff. | MFU | peak mem GB | plan GB in tensors (error); total | plan tok/s | "
           "PyTorch (same memory layout) | tok/s | peak mem GB | forge / PyTorch |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in R:
        if r["who"] != "forge":
            continue
        g = r["gpus"]
        p = peers.get(peer_of.get(r["layout"], ""))
        pr = p["result"] if p and ok(p) else None
        if ok(r):
            fr = r["result"]
            m = mem_of(fr)
            cells = [r["layout"], str(g), fmt_tok(fr["tokens_per_s"]),
                     f"{fr['tokens_per_s'] / (g * one_f):.3f}" if one_f else "-", fmt_mfu(fr.get("mfu")), fmt_gb(m),
                     plan_mem(r["plan"], m), fmt_tok(r["plan"].get("tokens_per_s"))]
        else:
            fr = None
            cells = [r["layout"], str(g), failed(r), "-", "-", "-", "-", "-"]
        if p:
            name = {"1gpu": "1 GPU", "ddp": "DDP", "fsdp2_zero2": "FSDP2, no reshard (ZeRO-2)",
                    "fsdp2_zero3": "FSDP2, reshard (ZeRO-3)"}.get(p["layout"], p["layout"])
            if pr:
                eff = f" (eff. {pr['tokens_per_s'] / (p['gpus'] * one_p):.3f})" if one_p and p["gpus"] > 1 else ""
                cells += [name, fmt_tok(pr["tokens_per_s"]) + eff, fmt_gb(mem_of(pr)),
                          f"{fr['tokens_per_s'] / pr['tokens_per_s']:.2f}" if fr else "-"]
            else:
                cells += [name, failed(p), "-", "-"]
        else:
            cells += ["-", "-", "-", "-"]
        out.append("| " + " | ".join(cells) + " |")
    return out


def tp(raw):
    R = rows(raw, "tp")
    if not R:
        return []
    peers = {r["layout"]: r for r in R if r["who"] == "pytorch"}
    out = ["| layout | GPUs | forge tok/s | MFU | peak mem GB | plan GB in tensors (error); total | plan tok/s | PyTorch tok/s | "
           "PyTorch mem GB | forge / PyTorch |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in R:
        if r["who"] != "forge":
            continue
        p = peers.get(r["layout"])
        pr = p["result"] if p and ok(p) else None
        if ok(r):
            fr = r["result"]
            m = mem_of(fr)
            cells = [r["layout"], str(r["gpus"]), fmt_tok(fr["tokens_per_s"]), fmt_mfu(fr.get("mfu")), fmt_gb(m),
                     plan_mem(r["plan"], m), fmt_tok(r["plan"].get("tokens_per_s"))]
        else:
            fr = None
            cells = [r["layout"], str(r["gpus"]), failed(r), "-", "-", "-", "-"]
        if pr:
            cells += [fmt_tok(pr["tokens_per_s"]), fmt_gb(mem_of(pr)),
                      f"{fr['tokens_per_s'] / pr['tokens_per_s']:.2f}" if fr else "-"]
        else:
            cells += [failed(p) if p else "-", "-", "-"]
        out.append("| " + " | ".join(cells) + " |")
    return out


def pp(raw):
    R = [r for r in rows(raw, "pp") if r["who"] == "forge"]
    if not R:
        return []
    out = ["| schedule | P | K | ms/step (plan) | tok/s | MFU | fitted bubble | theory | peak mem GB per stage | "
           "plan GB in tensors per stage |", "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for sched in dict.fromkeys(r["schedule"] for r in R):
        pts = [r for r in R if r["schedule"] == sched and ok(r)]
        a = b = None
        if len(pts) >= 2:
            n = len(pts)
            xs = [r["K"] for r in pts]
            ys = [r["result"]["ms_per_step"] for r in pts]
            sx, sy = sum(xs), sum(ys)
            sxx, sxy = sum(x * x for x in xs), sum(x * y for x, y in zip(xs, ys))
            den = n * sxx - sx * sx
            if den:
                a = (n * sxy - sx * sy) / den
                b = (sy - a * sx) / n
        for r in [x for x in R if x["schedule"] == sched]:
            P, K = r["pp"], r["K"]
            factor = {"zb-h1": 1 / 3, "interleaved": 1 / 2}.get(sched, 1)
            theory = (P - 1) / (K + P - 1) * factor
            if not ok(r):
                out.append(f"| {sched} | {P} | {K} | {failed(r)} | | | | {theory:.3f} | | |")
                continue
            fr, pl = r["result"], r["plan"]
            fit = f"{b / (a * K + b):.3f}" if a is not None else "-"
            stages = fr.get("mem_bytes_per_stage") or []
            out.append(f"| {sched} | {P} | {K} | {fr['ms_per_step']:.1f} ({1e3 * pl.get('step_s', float('nan')):.1f}) | "
                       f"{fmt_tok(fr['tokens_per_s'])} | {fmt_mfu(fr.get('mfu'))} | {fit} | {theory:.3f} | "
                       f"{' / '.join(fmt_gb(x) for x in stages)} | "
                       f"{' / '.join(fmt_gb(x) for x in pl.get('mem_subtotal_per_stage', []))} |")
    return out


def three_d(raw):
    R = rows(raw, "3d")
    if not R:
        return []
    out = ["| layout (dp.tp.pp) | micro x K | forge tok/s | MFU | peak mem GB | plan GB in tensors (error); total | plan tok/s |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for r in R:
        if not ok(r):
            out.append(f"| {r['layout']} | {r['micro']} x {r['K']} | {failed(r)} | | | | |")
            continue
        fr, pl = r["result"], r["plan"]
        m = mem_of(fr)
        out.append(f"| {r['layout']} | {r['micro']} x {r['K']} | {fmt_tok(fr['tokens_per_s'])} | {fmt_mfu(fr.get('mfu'))} | "
                   f"{fmt_gb(m)} | {plan_mem(pl, m)} | {fmt_tok(pl.get('tokens_per_s'))} |")
    return out


def largest(raw):
    R = rows(raw, "largest")
    if not R:
        return []
    out = ["| layout | layers | parameters | forge plan | trained? | peak mem GB | plan GB | tok/s | MFU |",
           "|---|---:|---:|---|---|---:|---:|---:|---:|"]
    for r in R:
        pl = r["plan"]
        params = pl.get("params")
        verdict = "fits" if pl.get("fits") else "does not fit"
        if ok(r):
            fr = r["result"]
            out.append(f"| {r['layout']} | {r['layers']} | {params / 1e9:.1f}B | {verdict} | yes | {fmt_gb(mem_of(fr))} | "
                       f"{fmt_gb(pl.get('mem_total'))} | {fmt_tok(fr['tokens_per_s'])} | {fmt_mfu(fr.get('mfu'))} |")
        else:
            out.append(f"| {r['layout']} | {r['layers']} | {params / 1e9 if params else 0:.1f}B | {verdict} | no: "
                       f"{failed(r)} | - | {fmt_gb(pl.get('mem_total'))} | - | - |")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("raw")
    ap.add_argument("--collectives", action="store_true", help="print the collectives table only")
    a = ap.parse_args()
    if a.collectives:
        print("\n".join(collectives(a.raw)))
        return
    commit = open(os.path.join(a.raw, "commit.txt")).read().strip() if os.path.exists(os.path.join(a.raw, "commit.txt")) else "?"
    gpus = open(os.path.join(a.raw, "gpus.csv")).read().strip().splitlines() if os.path.exists(os.path.join(a.raw, "gpus.csv")) else []
    n = max(0, len(gpus) - 1)
    name = gpus[1].split(",")[1].strip() if len(gpus) > 1 else "?"
    doc = [f"# Scaling on {n} x {name} (one host)", "",
           f"forge commit `{commit}`; raw results in `{a.raw}`; written by `benchmarks/scale/report_scale.py` from "
           "`benchmarks/scale/run_scale.sh`'s output. Peak memory is the largest rank's (bytes in live tensors, "
           "PyTorch's `max_memory_allocated` on rank 0), set beside forge plan's bytes in tensors (its subtotal) "
           "with the error, then plan's total, which adds the allocator margin (10%) and the runtime reserve (1 GB) "
           "and decides whether a layout fits.", ""]
    for title, lines in (("Collectives", collectives(a.raw)),
                         ("Data parallel: GPT-2 124M, 16 x 1024 tokens per GPU", ddp(a.raw)),
                         ("ZeRO: LLaMA 0.85B, 4 x 2048 tokens per GPU", zero(a.raw)),
                         ("Tensor parallel: LLaMA 0.85B, 8 x 2048 tokens per step", tp(a.raw)),
                         ("Pipeline parallel: LLaMA 0.85B, micro-batches of 2 x 2048", pp(a.raw)),
                         ("3D layouts: LLaMA 0.85B, 16 x 2048 tokens per step", three_d(a.raw)),
                         ("The largest model that trains: LLaMA 4096 wide, full checkpointing", largest(a.raw))):
        if lines:
            doc += [f"## {title}", ""] + lines + [""]
    print("\n".join(doc))


if __name__ == "__main__":
    main()
