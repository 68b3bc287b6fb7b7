#!/usr/bin/env python3
"""Per-kernel breakdown of a training step from a kernel trace (benchmarks/step).

    python3 kernels.py TRACE.csv[.gz] --steps 8 --skip 3          # a summary on stdout
    python3 kernels.py --from-nsys report.sqlite --out trace.csv.gz
    python3 kernels.py --from-ncu ncu.csv --out trace.csv.gz

A trace is a CSV of start_ns,end_ns,device,stream,name: one line per kernel (and memcpy/memset)
of a short training run, as ktrace.cpp writes it. Nsight Systems' SQLite export and Nsight
Compute's CSV are converted to it (ncu times each kernel alone, one after the other, so its trace
is a back-to-back timeline in launch order: no overlap, no gaps).

Steps are found in the trace itself, with no help from the program: the marker is a kernel that
runs the same number of times (m = 1, else 2, 3, 4) in every step of the run, so it occurs
exactly m x steps times; of those, the one whose every m-th occurrence is most evenly spaced.
Successive occurrences cut the timeline into step-long periods (each holds every kernel of one
step, whatever the phase of the cut), and the window is the periods after the first `skip`
(start-up, first-step heuristics, allocator growth) up to the last occurrence (what runs after it,
the end of the run, is left out). Every figure is divided by the number of periods in the window,
so it is per step.
"""
import argparse
import collections
import csv
import gzip
import statistics

# Kernel families, first match wins (lower-cased substrings of the demangled name).
FAMILIES = [
    ("NCCL", ("nccl",)),
    ("copies (memcpy, memset, layout copies)", ("[memcpy", "[memset", "copy_bytes_kernel", "copy16_kernel",
                                                "copy_kernel", "catarraybatchedcopy")),
    ("attention (flash / cuDNN / fmha)", ("flash", "fmha", "cudnn", "sdpa", "attention", "mha_", "_mha")),
    ("GEMM (cuBLASLt / nvjet / CUTLASS)", ("nvjet", "gemm", "gemv", "cutlass", "xmma", "cublas", "globalkernelbgrad",
                                         "splitkreduce", "epilogue::", "triton_tem")),
    ("cross-entropy / softmax", ("cross_entropy", "softmax", "nll_loss", "log_softmax")),
    ("AdamW / optimizer / clipping", ("adam", "sgd_kernel", "clip_kernel", "non_finite",
                                      "update_scale", "multi_tensor", "foreach")),
    ("norms (LayerNorm / RMSNorm)", ("norm",)),
    ("embedding", ("embedding", "scatter_add", "radix", "run_ends", "indexselect", "index_select", "take_kernel")),
    ("reductions", ("reduce", "column_sum", "finish_partials", "lanes", "triton_red", "triton_per")),
    ("elementwise (GELU, SwiGLU, RoPE, adds, casts)", ("elementwise", "binary", "unary", "gelu", "silu", "rope",
                                                       "philox", "fill", "vectorized", "triton_poi", "arange")),
]
OTHER = "other"


def family(name):
    n = name.lower()
    for fam, keys in FAMILIES:
        if any(k in n for k in keys):
            return fam
    return OTHER


def _open(path, mode):
    """mode "rt" or "wt"; gzip for a .gz path."""
    return gzip.open(path, mode, newline="") if path.endswith(".gz") else open(path, mode[0], newline="")


def read_trace(path, device=None):
    """[(start, end, stream, name)] sorted by start; device: keep only that device's records
    (default: the device of the first kernel)."""
    recs = []
    with _open(path, "rt") as f:
        for r in csv.DictReader(f):
            recs.append((int(r["start_ns"]), int(r["end_ns"]), int(r["device"]), int(r["stream"]), r["name"]))
    if not recs:
        return []
    recs.sort()
    dev = recs[0][2] if device is None else device
    return [(s, e, st, n) for s, e, d, st, n in recs if d == dev]


def write_trace(path, rows):
    """rows: (start, end, device, stream, name)."""
    with _open(path, "wt") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["start_ns", "end_ns", "device", "stream", "name"])
        for r in rows:
            w.writerow(r)


def from_nsys(sqlite_path):
    """Kernels, memcpys and memsets from Nsight Systems' SQLite export."""
    import sqlite3
    db = sqlite3.connect(sqlite_path)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    rows = []
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        q = ("SELECT k.start, k.end, k.deviceId, k.streamId, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
             "JOIN StringIds s ON s.id = k.demangledName")
        rows += list(db.execute(q))
    kinds = {1: "[memcpy HtoD]", 2: "[memcpy DtoH]", 8: "[memcpy DtoD]", 10: "[memcpy PtoP]"}
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        rows += [(s, e, d, st, kinds.get(k, "[memcpy]")) for s, e, d, st, k in
                 db.execute("SELECT start, end, deviceId, streamId, copyKind FROM CUPTI_ACTIVITY_KIND_MEMCPY")]
    if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
        rows += [(s, e, d, st, "[memset]") for s, e, d, st in
                 db.execute("SELECT start, end, deviceId, streamId FROM CUPTI_ACTIVITY_KIND_MEMSET")]
    return sorted(rows)


def from_ncu(csv_path):
    """Nsight Compute's --csv output of gpu__time_duration.sum: a back-to-back timeline in launch order."""
    with open(csv_path, errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]
    rows, t = [], 0
    recs = []
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        dur = float(r["Metric Value"].replace(",", ""))
        if r.get("Metric Unit", "ns") in ("usecond", "us"):
            dur *= 1e3
        elif r.get("Metric Unit") in ("msecond", "ms"):
            dur *= 1e6
        recs.append((int(r.get("ID", len(recs))), r["Kernel Name"], int(dur), r.get("Device", "0")))
    for _, name, dur, dev in sorted(recs):
        rows.append((t, t + dur, int(dev) if str(dev).isdigit() else 0, 0, name))
        t += dur
    return rows


def find_marker(recs, steps):
    """(marker name, m, occurrence starts (every m-th)) or None."""
    counts = collections.Counter(n for _, _, _, n in recs)
    for m in (1, 2, 3, 4):
        cands = [n for n, c in counts.items() if c == m * steps and not n.startswith("[")]
        best = None
        for n in cands:
            idx = [i for i, r in enumerate(recs) if r[3] == n][::m]
            occ = [recs[i][0] for i in idx]
            gaps = [b - a for a, b in zip(occ, occ[1:])]
            if len(gaps) < 1 or min(gaps) <= 0:
                continue
            # A kernel of the steps runs until the last step: start-up kernels that happen to
            # run m x steps times end early. And every later period holds the same launches.
            if idx[-1] < len(recs) // 2:
                continue
            per = [b - a for a, b in zip(idx, idx[1:])][len(idx) // 2:]
            if per and max(per) > 1.1 * min(per):
                continue
            # evenness of the later periods (the first steps may be slower)
            tail = gaps[len(gaps) // 2:] if len(gaps) > 2 else gaps
            cv = statistics.pstdev(tail) / statistics.fmean(tail)
            if best is None or cv < best[0]:
                best = (cv, n, occ)
        if best:
            return best[1], m, best[2]
    return None


def union_ns(intervals):
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def analyse(path, steps, skip, source="ktrace"):
    """The per-step breakdown of a trace of a run of `steps` steps, or {'error': ...}."""
    recs = read_trace(path)
    if not recs:
        return {"error": "the trace is empty"}
    mk = find_marker(recs, steps)
    if mk is None:
        return {"error": f"no kernel runs the same number of times in each of the {steps} steps"}
    marker, m, occ = mk
    skip = min(skip, len(occ) - 2) if len(occ) >= 2 else 0
    lo, hi = occ[skip], occ[-1]
    n = len(occ) - 1 - skip
    if n <= 0:
        return {"error": "too few steps in the trace for a window"}
    win = [r for r in recs if lo <= r[0] < hi]
    kern_ns = sum(e - s for s, e, _, _ in win)
    fams, kerns = collections.defaultdict(lambda: [0, 0]), collections.defaultdict(lambda: [0, 0])
    for s, e, _, name in win:
        f = fams[family(name)]
        f[0] += e - s
        f[1] += 1
        k = kerns[name]
        k[0] += e - s
        k[1] += 1
    out = {
        "source": source, "steps_in_trace": steps, "window_steps": n, "skipped_steps": skip,
        "marker": marker, "marker_per_step": m, "launches_per_step": len(win) / n,
        "kernel_ms_per_step": kern_ns / n / 1e6,
        "families": sorted(((f, t / n / 1e6, c / n) for f, (t, c) in fams.items()), key=lambda x: -x[1]),
        "kernels": sorted(((k, family(k), t / n / 1e6, c / n) for k, (t, c) in kerns.items()), key=lambda x: -x[2]),
    }
    if source != "ncu":  # a real timeline: the step's wall time and the GPU's busy time in it
        out["wall_ms_per_step"] = (hi - lo) / n / 1e6
        out["busy_ms_per_step"] = union_ns([(s, min(e, hi)) for s, e, _, _ in win]) / n / 1e6
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", nargs="?")
    ap.add_argument("--steps", type=int, default=8, help="steps of the traced run")
    ap.add_argument("--skip", type=int, default=3, help="step periods left out at the start")
    ap.add_argument("--source", default="ktrace")
    ap.add_argument("--from-nsys", help="convert an Nsight Systems SQLite export to a trace (--out)")
    ap.add_argument("--from-ncu", help="convert Nsight Compute CSV to a trace (--out)")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.from_nsys or a.from_ncu:
        rows = from_nsys(a.from_nsys) if a.from_nsys else from_ncu(a.from_ncu)
        write_trace(a.out, rows)
        print(f"kernels.py: {len(rows)} records -> {a.out}")
        return
    r = analyse(a.trace, a.steps, a.skip, a.source)
    if "error" in r:
        raise SystemExit("kernels.py: " + r["error"])
    print(f"{r['window_steps']} steps (marker {r['marker'][:60]} x{r['marker_per_step']}), "
          f"{r['launches_per_step']:.0f} launches/step, kernels {r['kernel_ms_per_step']:.2f} ms/step"
          + (f", wall {r['wall_ms_per_step']:.2f}, busy {r['busy_ms_per_step']:.2f}" if "wall_ms_per_step" in r else ""))
    for f, t, c in r["families"]:
        print(f"  {t:8.3f} ms  {c:7.1f}  {f}")
    for k, f, t, c in r["kernels"][:20]:
        print(f"  {t:8.3f} ms  {c:7.1f}  {k[:110]}")


if __name__ == "__main__":
    main()
