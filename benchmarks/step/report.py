#!/usr/bin/env python3
"""Writes benchmarks/results/step_<gpu>.md from the raw directory of benchmarks/step/run.sh.

    python3 benchmarks/step/report.py --raw benchmarks/results/raw/step_<gpu> > step_<gpu>.md
    python3 benchmarks/step/report.py --line-forge RUN/metrics.jsonl --warmup 10 --tokens-per-step 16384
    python3 benchmarks/step/report.py --line-peer row1_compile.json

The raw directory holds (every file optional: a row with none of its files reads "not run", with
the reason run.sh left in row<N>_skip.txt):
  meta.json                       GPU, driver, clocks, commit, PyTorch, command, STEPS, WARMUP
  row<N>_def.json                 the row: config, global batch, GPUs, sequence length
  row<N>_forge.jsonl / .log       forge's metrics.jsonl (rank 0) and its output
  row<N>_forge_plan.txt           `forge plan --config`: forge's parameter count
  row<N>_{eager,compile}.json     torch_peer.py's result (and .log)
  kernels_row<N>_{forge,compile}.csv.gz + .json   a kernel trace of a short run, its source and steps
  row<N>_{forge,eager,compile}_power.csv   nvidia-smi every 100 ms during that run: timestamp, power
                                  draw and limit (W), SM clock (MHz), utilisation (%) of rank 0's GPU
Every MFU here is computed from the model's shape by shapes.py (6·N + 12·L·T·d per token over the
dense bf16 peak of the GPU times the GPUs), the same for forge and PyTorch.
"""
import argparse
import datetime
import glob
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kernels  # noqa: E402
import shapes  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
TARGET = 1.10  # DESIGN.md / issue 15: forge at least 1.10x torch.compile's tokens/s
TITLES = {
    1: "GPT-2 124M, batch 16, 1 GPU",
    2: "GPT-2 124M, batch 32, 1 GPU",
    3: "LLaMA 0.85B, batch 4 x 2048, 1 GPU",
    4: "GPT-2 124M, DDP on 2 GPUs, 16 per GPU (global batch 32)",
}
PEER_NAMES = {"eager": "PyTorch eager", "compile": "PyTorch compile"}
DDP_PEER_NAMES = {"eager": "PyTorch DDP eager (torchrun)", "compile": "PyTorch DDP + compile (torchrun)"}


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def forge_figures(path, warmup, tokens_per_step):
    """Mean ms/step of forge's steps after `warmup` from metrics.jsonl (each progress record
    averages the steps since the previous one: weighted by the steps it covers)."""
    try:
        recs = [json.loads(l) for l in open(path) if l.strip()]
    except (OSError, ValueError):
        return None
    prog = sorted((r for r in recs if "ms_per_step" in r and not r.get("final")), key=lambda r: r["step"])
    prev, total_ms, total_steps, per_step = 0, 0.0, 0, []
    for r in prog:
        covered = r["step"] - prev
        if r["step"] > warmup and prev >= warmup and not r.get("skipped"):
            total_ms += r["ms_per_step"] * covered
            total_steps += covered
            if covered == 1:
                per_step.append(r["ms_per_step"])
        prev = r["step"]
    if total_steps == 0:
        return None
    ms = total_ms / total_steps
    mfus = [r["mfu"] for r in prog if r["step"] > warmup and "mfu" in r]
    q = statistics.quantiles(per_step, n=4, method="inclusive") if len(per_step) >= 2 else [None, None, None]
    return {"ms_per_step": ms, "ms_per_step_median": statistics.median(per_step) if per_step else None,
            "ms_per_step_p25": q[0], "ms_per_step_p75": q[2],
            "tokens_per_s": tokens_per_step / (ms / 1e3), "steps": total_steps,
            "peak_mem_bytes": max((r["mem_bytes"] for r in prog if "mem_bytes" in r), default=None),
            "forge_mfu": statistics.fmean(mfus) if mfus else None,
            "last_loss": prog[-1].get("loss") if prog else None,
            "skipped_steps": sum(1 for r in recs if r.get("skipped"))}


def power_samples(path):
    """(seconds, power W, limit W, SM MHz, utilisation %) of each well-formed line of a
    row<N>_<run>_power.csv; lines nvidia-smi could not fill ([N/A], errors) are left out."""
    out = []
    for line in (read_text(path) or "").splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) != 5:
            continue
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((t, float(parts[1]), float(parts[2]), float(parts[3]), float(parts[4])))
        except ValueError:
            continue
    return out


def power_figures(path, timed_s, busy_pct=50.0, cap_share=0.97):
    """Power and SM clock over a run's timed steps: the last `timed_s` seconds of samples up to
    the run's last busy one (utilisation >= busy_pct; the timed steps end the run, and what
    follows them, the process's exit, is idle), busy samples only. None without such samples."""
    samples = power_samples(path)
    busy = [x for x in samples if x[4] >= busy_pct]
    if not busy or not timed_s or timed_s <= 0:
        return None
    end = busy[-1][0]
    win = [x for x in busy if x[0] >= end - timed_s]
    clocks = sorted(x[3] for x in win)
    limit = statistics.median(x[2] for x in win)
    return {"samples": len(win), "power_w": statistics.fmean(x[1] for x in win), "limit_w": limit,
            "clock_mean": statistics.fmean(clocks), "clock_median": statistics.median(clocks),
            "clock_min": clocks[0], "at_cap": sum(1 for x in win if x[1] >= cap_share * limit) / len(win)}


def power_section(rows, raw, out):
    """The table of power and SM clocks during each run's timed steps, when any run was sampled."""
    lines = []
    for r in rows:
        if not r.ran():
            continue
        names = dict(DDP_PEER_NAMES if r.gpus > 1 else PEER_NAMES, forge="forge")
        for who, fig in [("forge", r.forge)] + [(m, r.peers.get(m)) for m in ("eager", "compile")]:
            if not fig:
                continue
            pf = power_figures(os.path.join(raw, f"row{r.n}_{who}_power.csv"), fig["steps"] * fig["ms_per_step"] / 1e3)
            if not pf:
                continue
            lines.append(f"| {r.n} | {names[who]} | {pf['samples']} | {pf['power_w']:.0f} of {pf['limit_w']:.0f} | "
                         f"{pf['clock_mean']:.0f} | {pf['clock_median']:.0f} | {pf['clock_min']:.0f} | "
                         f"{100 * pf['at_cap']:.0f}% |")
    if not lines:
        return
    out.append("## Power and SM clock during the timed steps\n")
    out.append("nvidia-smi every 100 ms on rank 0's GPU during each run (`SAMPLE_POWER=1`); the window is the "
               "run's busy samples (utilisation >= 50%) in the last (steps x mean ms/step) seconds up to its last "
               "busy one: its timed steps. Under the power cap the SM clock falls, so a step that keeps the GPU "
               "busier runs its compute-bound kernels at a lower clock.\n")
    out.append("| row | run | samples | power W (mean, of the limit) | SM MHz mean | median | lowest | "
               "samples at >= 97% of the limit |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|")
    out += lines
    out.append("")


def gib(b):
    return f"{b / 2**30:.2f} GiB" if b else "-"


def ratio(a, b, fmt="{:.3f}"):
    return fmt.format(a / b) if a and b else "-"


def plan_params(text):
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "parameters" and parts[1].replace(",", "").isdigit():
            return int(parts[1].replace(",", ""))
    return None


def log_tail(path, n=3):
    t = read_text(path)
    if not t:
        return ""
    lines = [l.strip() for l in t.splitlines() if l.strip()]
    return " / ".join(lines[-n:])[:400]


class Row:
    def __init__(self, raw, n, meta):
        self.n, self.raw, self.meta = n, raw, meta
        self.title = TITLES.get(n, f"row {n}")
        self.skip = (read_text(os.path.join(raw, f"row{n}_skip.txt")) or "").strip()
        self.defn = read_json(os.path.join(raw, f"row{n}_def.json"))
        self.forge = self.shape = self.fpt = None
        self.peers = {}
        self.errors = []
        if not self.defn:
            return
        d = self.defn
        cfg = shapes.load_config(os.path.join(ROOT, d["config"]))
        self.shape = shapes.model_shape(cfg, {"seq": d["seq"]})
        self.fpt = shapes.flops_per_token(self.shape)
        self.gpus = d["gpus"]
        self.tokens_per_step = d["batch"] * d["seq"]  # the global batch
        warmup = meta.get("warmup", 10)
        fj = os.path.join(raw, f"row{n}_forge.jsonl")
        self.forge = forge_figures(fj, warmup, self.tokens_per_step) if os.path.exists(fj) else None
        if self.forge is None:
            self.errors.append("forge: no timed steps (" + (log_tail(os.path.join(raw, f"row{n}_forge.log"))
                                                             or "no log") + ")")
        for mode in ("eager", "compile"):
            p = read_json(os.path.join(raw, f"row{n}_{mode}.json"))
            if p:
                self.peers[mode] = p
            elif d.get("peers", True):
                self.errors.append(f"PyTorch {mode}: no result (" +
                                   (log_tail(os.path.join(raw, f"row{n}_{mode}.log")) or "no log") + ")")
        self.plan_params = plan_params(read_text(os.path.join(raw, f"row{n}_forge_plan.txt")))
        # REPEATS (run.sh): forge and torch.compile again, files row<N>_forge_r<k>.jsonl and
        # row<N>_compile_r<k>.json; each repeat's ratio from the two sides' median steps.
        self.repeats = []  # (k, forge / compile by median steps)
        for k in range(1, 100):
            suf = "" if k == 1 else f"_r{k}"
            fj = os.path.join(raw, f"row{n}_forge{suf}.jsonl")
            cj = os.path.join(raw, f"row{n}_compile{suf}.json")
            if k > 1 and not (os.path.exists(fj) or os.path.exists(cj)):
                break
            f = forge_figures(fj, warmup, self.tokens_per_step) if os.path.exists(fj) else None
            c = read_json(cj)
            fm, cm = f and f.get("ms_per_step_median"), c and c.get("ms_per_step_median")
            if fm and cm:
                self.repeats.append((k, cm / fm))

    def repeat_ratio(self):
        """The median of the repeats' ratios, its range, and the count (None without two repeats)."""
        if len(self.repeats) < 2:
            return None
        v = sorted(x for _, x in self.repeats)
        return statistics.median(v), v[0], v[-1], len(v)

    def mfu(self, tokens_per_s):
        peak = self.meta.get("peak_tflops")
        if not (peak and tokens_per_s and self.fpt):
            return None
        return tokens_per_s * self.fpt / (peak * 1e12 * self.gpus)

    def ran(self):
        return bool(self.forge or self.peers)

    def why_not(self):
        """Why a row has no figures."""
        if self.skip:
            return self.skip
        if self.defn:
            return "every run of it failed: " + "; ".join(self.errors)
        if str(self.n) in str(self.meta.get("rows", "")).split():
            return "selected, but the run stopped before it"
        return "not selected (ROWS)"


def fmt_pct(x):
    return f"{100 * x:.1f}%" if x is not None else "-"


def row_table(r, out):
    d = r.defn
    total, nmm = shapes.param_count(r.shape)
    out.append(f"`forge train {d['config']}` with train.batch_size = {d['batch']}"
               + (f" on {r.gpus} GPUs (`forge launch --nproc-per-node {r.gpus}`), {d['batch'] // r.gpus} per GPU"
                  if r.gpus > 1 else "")
               + f"; {shapes.describe(r.shape)}; {r.fpt / 1e9:.3f} GFLOP per token.\n")
    names = DDP_PEER_NAMES if r.gpus > 1 else PEER_NAMES
    out.append("| run | tokens/s | ms/step (mean) | ms/step (median) | MFU | peak memory" +
               (" per GPU (rank 0)" if r.gpus > 1 else "") + " | forge / this: tokens/s | forge / this: memory |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    f = r.forge
    if f:
        med = f"{f['ms_per_step_median']:.2f}" if f.get("ms_per_step_median") else "-"
        out.append(f"| forge | {f['tokens_per_s']:,.0f} | {f['ms_per_step']:.2f} | {med} | {fmt_pct(r.mfu(f['tokens_per_s']))} "
                   f"| {gib(f['peak_mem_bytes'])} | | |")
    else:
        out.append("| forge | not run / failed | | | | | | |")
    for mode in ("eager", "compile"):
        p = r.peers.get(mode)
        if not p:
            out.append(f"| {names[mode]} | not run / failed | | | | | | |")
            continue
        out.append(f"| {names[mode]} | {p['tokens_per_s']:,.0f} | {p['ms_per_step']:.2f} | "
                   f"{p.get('ms_per_step_median', 0):.2f} | {fmt_pct(r.mfu(p['tokens_per_s']))} | {gib(p.get('peak_mem_bytes'))} | "
                   f"{ratio(f and f['tokens_per_s'], p['tokens_per_s'])} | {ratio(f and f['peak_mem_bytes'], p.get('peak_mem_bytes'))} |")
    out.append("")
    # The checks: parameter counts and forge's own MFU against this file's.
    notes = []
    pc = [f"shapes.py {total:,}"]
    if r.plan_params is not None:
        pc.append(f"forge (`forge plan --config`) {r.plan_params:,}")
    for mode, p in r.peers.items():
        pc.append(f"PyTorch {mode} module {p.get('params', 0):,}")
    counts = {total} | ({r.plan_params} if r.plan_params is not None else set()) | {p.get("params") for p in r.peers.values()}
    notes.append("Parameters: " + ", ".join(pc) + (" (equal)" if len(counts) == 1 else " **(DIFFERENT)**")
                 + f"; N = {nmm:,} in matrix products.")
    if f and f.get("forge_mfu") is not None and r.mfu(f["tokens_per_s"]):
        mine = r.mfu(f["tokens_per_s"])
        dev = abs(f["forge_mfu"] - mine) / mine
        notes.append(f"forge's own logged MFU: {fmt_pct(f['forge_mfu'])} (this file: {fmt_pct(mine)}"
                     + (", within 2%)" if dev < 0.02 else f", **{100 * dev:.1f}% apart**: check the peak and the formula)"))
    if f:
        notes.append(f"forge: {f['steps']} timed steps, last loss {f['last_loss']:.4f}"
                     + (f", {f['skipped_steps']} skipped steps" if f["skipped_steps"] else "") + ".")
    for mode, p in r.peers.items():
        warm = f"warm-up {p['warmup_s']:.1f} s" if p.get("warmup_s") else ""
        notes.append(f"PyTorch {mode}: {p['steps']} timed steps, last loss {p.get('last_loss', float('nan')):.4f}"
                     + (f", {warm}" if warm else "") + (f", min {p['ms_per_step_min']:.2f} ms" if p.get("ms_per_step_min") else "")
                     + (", enable_gqa" if r.shape["type"] == "llama" and p.get("sdpa_enable_gqa") else "") + ".")
    for e in r.errors:
        notes.append("**" + e + "**")
    out += ["- " + n for n in notes]
    out.append("")


def kernel_section(raw, n, who, out, title):
    meta = read_json(os.path.join(raw, f"kernels_row{n}_{who}.json"))
    trace = os.path.join(raw, f"kernels_row{n}_{who}.csv.gz")
    if not meta:
        return None
    if meta.get("error") or not os.path.exists(trace):
        out.append(f"### {title}\n\nnot profiled: {meta.get('error', 'no trace')}\n")
        return None
    a = kernels.analyse(trace, meta["steps"], meta["skip"], meta["source"])
    if "error" in a:
        out.append(f"### {title}\n\nno breakdown: {a['error']}\n")
        return None
    src = {"ktrace": "a CUPTI activity trace (benchmarks/step/ktrace.cpp), kernels as they ran, overlaps included",
           "nsys": "Nsight Systems (kernels as they ran, overlaps included)",
           "ncu": "Nsight Compute (each kernel timed alone, serialised: no overlap, no gaps)"}.get(a["source"], a["source"])
    out.append(f"### {title}\n")
    line = (f"Source: {src}. A separate run of {meta['steps']} steps{meta.get('what', '')}; the window is "
            f"{a['window_steps']} steps after the first {a['skipped_steps']}, cut at every {'' if a['marker_per_step'] == 1 else str(a['marker_per_step']) + 'th '}"
            f"launch of `{a['marker'][:80]}` (it runs {a['marker_per_step']}x per step); every figure is per step "
            f"(window total / {a['window_steps']}). {a['launches_per_step']:.0f} launches per step, "
            f"{a['kernel_ms_per_step']:.2f} ms of kernel time per step")
    if "wall_ms_per_step" in a:
        line += (f"; the step took {a['wall_ms_per_step']:.2f} ms of which the GPU was busy "
                 f"{a['busy_ms_per_step']:.2f} ms ({100 * a['busy_ms_per_step'] / a['wall_ms_per_step']:.1f}%)")
    out.append(line + ".\n")
    tot = a["kernel_ms_per_step"]
    out.append("| family | ms per step | share of kernel time | launches per step |")
    out.append("|---|---:|---:|---:|")
    for fam, t, c in a["families"]:
        out.append(f"| {fam} | {t:.3f} | {100 * t / tot:.1f}% | {c:.1f} |")
    out.append(f"| **total** | **{tot:.3f}** | 100% | {a['launches_per_step']:.0f} |\n")
    out.append("| kernel (top 20 by time) | family | ms per step | calls per step | share |")
    out.append("|---|---|---:|---:|---:|")
    for k, fam, t, c in a["kernels"][:20]:
        name = k.replace("|", "/").replace("`", "'")
        name = name if len(name) <= 110 else name[:107] + "..."
        out.append(f"| `{name}` | {fam} | {t:.3f} | {c:.1f} | {100 * t / tot:.1f}% |")
    out.append("")
    return a


def family_comparison(fa, pa, out):
    fams = {f: t for f, t, _ in fa["families"]}
    pams = {f: t for f, t, _ in pa["families"]}
    out.append("forge beside torch.compile, by family (ms of kernel time per step; torch.compile's "
               "Triton kernels fuse across families, so read the totals first):\n")
    out.append("| family | forge | torch.compile | forge - compile |")
    out.append("|---|---:|---:|---:|")
    for fam in sorted(set(fams) | set(pams), key=lambda x: -max(fams.get(x, 0), pams.get(x, 0))):
        a, b = fams.get(fam, 0.0), pams.get(fam, 0.0)
        out.append(f"| {fam} | {a:.3f} | {b:.3f} | {a - b:+.3f} |")
    a, b = fa["kernel_ms_per_step"], pa["kernel_ms_per_step"]
    out.append(f"| **total** | **{a:.3f}** | **{b:.3f}** | **{a - b:+.3f}** |")
    if "wall_ms_per_step" in fa and "wall_ms_per_step" in pa:
        out.append(f"| step (wall, in the traced run) | {fa['wall_ms_per_step']:.3f} | {pa['wall_ms_per_step']:.3f} | "
                   f"{fa['wall_ms_per_step'] - pa['wall_ms_per_step']:+.3f} |")
    out.append("")


def report(raw):
    meta = read_json(os.path.join(raw, "meta.json")) or {}
    gpu = meta.get("gpu_name", "unknown GPU")
    if not meta.get("peak_tflops"):
        meta["peak_tflops"] = shapes.peak_tflops(gpu)
    rows = [Row(raw, n, meta) for n in (1, 2, 3, 4)]
    out = [f"# Training step: forge vs PyTorch eager and torch.compile ({gpu})\n"]
    out.append(f"- GPU: {meta.get('gpus_desc', gpu)}; driver {meta.get('driver', '?')}")
    if meta.get("clocks"):
        out.append(f"- Clocks (nvidia-smi, before / after the runs): {meta['clocks']}")
    out.append(f"- forge: commit {meta.get('commit', '?')}, {meta.get('forge_build', 'build-gpu/forge')}")
    out.append(f"- PyTorch: {meta.get('torch', '?')} (CUDA {meta.get('torch_cuda', '?')}), python {meta.get('python', '?')}")
    out.append(f"- Command: `{meta.get('command', 'benchmarks/step/run.sh')}`")
    out.append(f"- Date: {meta.get('date', '?')}; STEPS = {meta.get('steps', '?')} timed steps after WARMUP = "
               f"{meta.get('warmup', '?')} untimed ones, for every run")
    peak = meta.get("peak_tflops")
    out.append(f"- MFU = tokens/s x (6·N + 12·L·T·d) / ({'%.1f' % peak if peak else 'unknown'} TFLOP/s dense bf16 x GPUs), "
               "one formula for forge and PyTorch (Method, below)\n")

    out.append("## Summary: forge / torch.compile\n")
    out.append(f"| row | workload | forge tokens/s | torch.compile tokens/s | forge / compile | target {TARGET:.2f} | "
               "forge / compile, median steps | median of the repeats (range, n) | forge / eager | peak memory forge / compile |")
    out.append("|---|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        if not r.ran():
            out.append(f"| {r.n} | {r.title} | not run: {r.why_not()[:200]} | | | | | | | |")
            continue
        f, c, e = r.forge, r.peers.get("compile"), r.peers.get("eager")
        rc = f["tokens_per_s"] / c["tokens_per_s"] if f and c else None
        met = "-" if rc is None else ("met" if rc >= TARGET else f"not met (forge needs {TARGET / rc:.3f}x)")
        # The same ratio from each side's median step (the mean is the target's figure; the median
        # says how much of it the power cap's slow steps moved: benchmarks/step/README.md, Timing).
        fm, cm = f and f.get("ms_per_step_median"), c and c.get("ms_per_step_median")
        rm = f"{cm / fm:.3f}" if fm and cm else "-"
        out.append(f"| {r.n} | {r.title} | {f['tokens_per_s']:,.0f} | " if f else f"| {r.n} | {r.title} | failed | ")
        rr = r.repeat_ratio()
        rep = f"{rr[0]:.3f} ({rr[1]:.3f}-{rr[2]:.3f}, {rr[3]})" if rr else "-"
        out[-1] += (f"{c['tokens_per_s']:,.0f} | " if c else "failed | ") + (f"{rc:.3f} | " if rc else "- | ") + \
                   f"{met} | {rm} | {rep} | "
        out[-1] += f"{ratio(f and f['tokens_per_s'], e and e['tokens_per_s'])} | " \
                   f"{ratio(f and f['peak_mem_bytes'], c and c.get('peak_mem_bytes'))} |"
    out.append("\ntokens/s of the whole job (both GPUs in row 4); peak memory per GPU (rank 0).\n")

    for r in rows:
        out.append(f"## Row {r.n}: {r.title}\n")
        if not r.ran():
            out.append(f"not run: {r.why_not()}\n")
            continue
        row_table(r, out)

    power_section(rows, raw, out)

    ks = sorted({int(os.path.basename(p)[len("kernels_row"):].split("_")[0])
                 for p in glob.glob(os.path.join(raw, "kernels_row*_forge.json"))})
    if ks:
        out.append("## Where forge's step goes: per-kernel breakdown\n")
        for n in ks:
            fa = kernel_section(raw, n, "forge", out, f"Row {n}: {TITLES.get(n, '')}, forge")
            pa = kernel_section(raw, n, "compile", out, f"Row {n}: {TITLES.get(n, '')}, PyTorch compile")
            if fa and pa:
                family_comparison(fa, pa, out)
    else:
        out.append("## Per-kernel breakdown\n\nnot profiled (PROFILE_ROWS empty, or no profiler: see the run's output)\n")

    out.append("## Method\n")
    out.append(METHOD)
    notes = (read_text(os.path.join(raw, "notes.txt")) or "").splitlines()
    if notes:
        out.append("Notes of this run:\n")
        out += [f"- {n}" for n in notes if n.strip()]
    return "\n".join(out) + "\n"


METHOD = """\
- **Workloads.** bf16 (f32 master weights and AdamW moments on both sides), AdamW (betas 0.9 / 0.95,
  eps 1e-8, weight decay 0.1 on matmul weights only), gradient clipping at 1.0, uniform random tokens.
  GPT-2 rows: `configs/gpt2-124m.toml`; LLaMA row: `configs/llama-0.85b.toml`. The PyTorch peer
  (`benchmarks/step/torch_peer.py`) reads the same config file: the same shape and hyper-parameters.
  forge's learning rate follows its cosine schedule, PyTorch's is constant: no difference in work.
- **PyTorch.** f32 parameters under `torch.autocast(bfloat16)`, `F.scaled_dot_product_attention(is_causal=True)`
  (LLaMA: `enable_gqa=True`), `AdamW(fused=True)`, `clip_grad_norm_`; compile = `torch.compile(model)`
  (default mode) with the loss inside; row 4: `DistributedDataParallel` (NCCL, 25 MB buckets), then
  `torch.compile`, under `torchrun --standalone --nproc-per-node 2`, the loss all-reduced as forge does.
- **Timing.** Both sides read each step's loss on the host one step late (forge's Note [deferred step
  read]; the peer copies it to pinned memory behind an event), so neither drains the GPU between
  steps; a step's time is the interval between two reads. The first WARMUP steps are not timed
  (torch.compile's compilation, cuBLAS heuristics, allocator growth); ms/step is the mean of the
  STEPS timed intervals (the median beside it), tokens/s = global batch x sequence / (ms/step).
  Runs go one after the other on the same GPU(s), forge first, each in a fresh process.
- **MFU** (Note [MFU] in `src/forge/telemetry/mfu.h`): FLOPs per token = 6·N + 12·L·T·d, N the
  parameters in matrix products (all but looked-up embeddings: GPT's positions, LLaMA's input
  embedding; GPT's tied head once), L layers, T the sequence length, d the width; computed from the
  shape by `benchmarks/step/shapes.py` for both sides, over the dense bf16 peak of the GPU from
  forge's catalogue (`src/forge/plan/gpu_catalog.cpp`: 989.4 TFLOP/s for H100 SXM and H200) times
  the GPUs. Attention is not halved for the causal mask (PaLM's and llm.c's convention).
- **Peak memory**: the caching allocator's high-water mark of bytes in live tensors (not its reserve),
  rank 0 for DDP: forge's `mem_bytes` (since its first step, the highest of its records);
  PyTorch's `torch.cuda.max_memory_allocated()` since the end of the warm-up.
- **Ratios** are forge / PyTorch: above 1 for tokens/s means forge is faster; below 1 for memory
  means forge uses less. The target is forge / torch.compile >= 1.10 on every row.
- **Per-kernel breakdown**: a separate short run (not the timed one) under a kernel tracer; the steps
  are found in the trace (`benchmarks/step/kernels.py`) and every figure is divided by the number of
  steps in the window, so it is per step. Families by kernel name (first match): NCCL, copies,
  attention, GEMM, cross-entropy/softmax, optimizer, norms, embedding, reductions, elementwise, other.
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--raw")
    ap.add_argument("--line-forge", help="print one line of figures for a forge metrics.jsonl")
    ap.add_argument("--line-peer", help="print one line of figures for a torch_peer.py JSON")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--tokens-per-step", type=int, default=0)
    a = ap.parse_args()
    if a.line_forge:
        f = forge_figures(a.line_forge, a.warmup, a.tokens_per_step)
        print("no timed steps" if f is None else
              f"{f['tokens_per_s']:,.0f} tokens/s, {f['ms_per_step']:.2f} ms/step, peak {gib(f['peak_mem_bytes'])}")
        return
    if a.line_peer:
        p = read_json(a.line_peer)
        print("no result" if p is None else
              f"{p['tokens_per_s']:,.0f} tokens/s, {p['ms_per_step']:.2f} ms/step, peak {gib(p.get('peak_mem_bytes'))}")
        return
    if not a.raw:
        ap.error("--raw is required")
    sys.stdout.write(report(a.raw))


if __name__ == "__main__":
    main()
