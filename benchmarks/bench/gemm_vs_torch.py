#!/usr/bin/env python3
"""torch.matmul GEMM throughput, timed the way `forge bench gemm` times forge (docs/bench.md).

C = A @ B with row-major A (M x K), B (K x N), randn inputs (rotating among up to 3 (A, B) pairs
when 3 pairs take <= 2 GiB), warm-up (>= WARMUP runs and >= 50 ms, synchronising after each),
then REPEATS runs back to back, each between two torch.cuda.Event(enable_timing=True); the median
is reported. --graph N instead captures N products in one CUDA graph and times each replay (/ N):
no Python dispatch inside the timing (issue 41: small shapes otherwise time torch's dispatch). FLOPs = 2*M*N*K. tf32 = f32 storage with torch.backends.cuda.matmul.allow_tf32.
fp8 (sm_89+, torch._scaled_mm): D (M x N) bf16 = A (M x K) @ B_t (N x K)^T with A, B_t e4m3 row-major
(uniform [-2, 2) rounded to e4m3), per-tensor f32 scales of 1, use_fast_accum=False: the layout,
scales and accumulation of forge's fp8 GEMM (cuBLASLt "TN"); same FLOPs as A @ B.

  python3 benchmarks/bench/gemm_vs_torch.py --sizes 128,1024 --dtype bf16,f32 > torch.json
"""
import argparse
import json
import statistics
import time

import torch

DTYPES = {"f32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
FP8_ALIASES = ("fp8", "e4m3", "fp8_e4m3")


def fp8_skip_reason():
    """Why this torch/GPU cannot time the fp8 GEMM (None when it can)."""
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no torch._scaled_mm / float8_e4m3fn"
    if torch.cuda.get_device_capability(0) < (8, 9):
        return "fp8 (e4m3) GEMMs need compute capability >= 8.9 (Ada, Hopper)"
    return None


def fp8_operand(rows, cols):
    return (torch.rand(rows, cols, device="cuda") * 4 - 2).to(torch.float8_e4m3fn)


def sizes_arg(spec):
    out = []
    for item in spec.split(","):
        if ".." in item:
            lo, hi = (int(x) for x in item.split(".."))
            v = lo
            while v <= hi:
                out.append(v)
                v *= 2
        else:
            out.append(int(item))
    return out


def bench(m, n, k, name, repeats, warmup, warmup_ms, graph=0):
    fp8 = name == "fp8"
    bits = 8 if fp8 else torch.finfo(DTYPES[name]).bits
    set_bytes = (m * k + k * n) * bits // 8
    sets = 3 if 3 * set_bytes <= 2 * 2**30 else 1
    if fp8:
        a = [fp8_operand(m, k) for _ in range(sets)]
        b = [fp8_operand(n, k).t() for _ in range(sets)]  # (K x N) column-major, as _scaled_mm wants
        one = torch.ones((), device="cuda", dtype=torch.float32)

        def run(i):
            torch._scaled_mm(a[i % sets], b[i % sets], scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                             use_fast_accum=False)
    else:
        dt = DTYPES[name]
        a = [torch.randn(m, k, device="cuda", dtype=dt) for _ in range(sets)]
        b = [torch.randn(k, n, device="cuda", dtype=dt) for _ in range(sets)]
        out = torch.empty(m, n, device="cuda", dtype=dt)

        def run(i):
            torch.matmul(a[i % sets], b[i % sets], out=out)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
    try:
        i = 0
        t0 = time.perf_counter()
        while i < warmup or (time.perf_counter() - t0) * 1e3 < warmup_ms:
            run(i)
            torch.cuda.synchronize()
            i += 1
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        if graph:  # --graph N: N products captured in a CUDA graph, each replay timed (no Python inside)
            g = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                run(0)
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(g):
                for j in range(graph):
                    run(j)
            g.replay()
            torch.cuda.synchronize()
            for r in range(repeats):
                starts[r].record()
                g.replay()
                stops[r].record()
            stops[-1].synchronize()
            ms = [s.elapsed_time(e) / graph for s, e in zip(starts, stops)]
        else:
            for r in range(repeats):
                starts[r].record()
                run(r)
                stops[r].record()
            stops[-1].synchronize()
            ms = [s.elapsed_time(e) for s, e in zip(starts, stops)]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    med = statistics.median(ms)
    flops = 2.0 * m * n * k
    return {"dtype": name, "m": m, "n": n, "k": k, "flops": flops, "median_ms": med, "min_ms": min(ms),
            "max_ms": max(ms), "tflops": flops / (med * 1e-3) / 1e12, "input_sets": sets}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="128..16384", help="square sizes: 128,1024 or 128..16384 (powers of two)")
    p.add_argument("--mnk", action="append", default=[], help="MxNxK (repeatable)")
    p.add_argument("--dtype", default="f32,tf32,bf16,f16")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--warmup-ms", type=float, default=50)
    p.add_argument("--graph", type=int, default=0,
                   help="time N products captured in one CUDA graph per replay (0: CUDA events around each call)")
    args = p.parse_args()
    shapes = [(s, s, s) for s in sizes_arg(args.sizes)] if args.sizes else []
    shapes += [tuple(int(x) for x in s.lower().split("x")) for s in args.mnk]
    results, skipped = [], []
    for name in args.dtype.split(","):
        name = name.strip().lower()
        if name in FP8_ALIASES:
            name = "fp8"
            why = fp8_skip_reason()
            if why is not None:
                skipped.append({"dtype": name, "shape": "", "reason": why})
                continue
        elif name not in DTYPES:
            skipped.append({"dtype": name, "shape": "", "reason": "not timed by this script"})
            continue
        for m, n, k in shapes:
            if name == "fp8" and (m % 16 or n % 16 or k % 16):
                skipped.append({"dtype": name, "shape": f"{m}x{n}x{k}", "reason": "fp8 GEMMs need M, N, K multiples of 16"})
                continue
            try:
                results.append(bench(m, n, k, name, args.repeats, args.warmup, args.warmup_ms, args.graph))
            except torch.cuda.OutOfMemoryError as e:
                skipped.append({"dtype": name, "shape": f"{m}x{n}x{k}", "reason": str(e).splitlines()[0]})
            torch.cuda.empty_cache()
    print(json.dumps({"benchmark": "gemm", "framework": "torch " + torch.__version__,
                      "device_name": torch.cuda.get_device_name(0),
                      "method": {"timer": (f"CUDA graph of {args.graph} products per replay" if args.graph else "torch.cuda.Event"), "warmup_runs": args.warmup, "warmup_ms": args.warmup_ms,
                                 "repeats": args.repeats, "statistic": "median", "flops": "2*M*N*K"},
                      "results": results, "skipped": skipped}, indent=2))


if __name__ == "__main__":
    main()
