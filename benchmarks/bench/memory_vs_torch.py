#!/usr/bin/env python3
"""PyTorch device-to-device copy and elementwise multiply, timed the way `forge bench memory` times
forge (docs/bench.md): f32 tensors of N elements (randn), warm-up (>= WARMUP runs and >= 50 ms,
synchronising after each), then REPEATS runs back to back, each between two
torch.cuda.Event(enable_timing=True); the median is reported.
  copy      dst.copy_(src)            GB/s = 2 * 4N bytes / time
  multiply  torch.mul(a, b, out=c)     GB/s = 3 * 4N bytes / time, TFLOP/s = N / time

  python3 benchmarks/bench/memory_vs_torch.py --sizes 65536,1048576 > torch_memory.json
"""
import argparse
import json
import statistics
import time

import torch


def timed(fn, repeats, warmup, warmup_ms):
    i = 0
    t0 = time.perf_counter()
    while i < warmup or (time.perf_counter() - t0) * 1e3 < warmup_ms:
        fn()
        torch.cuda.synchronize()
        i += 1
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for r in range(repeats):
        starts[r].record()
        fn()
        stops[r].record()
    stops[-1].synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, stops)]


def row(kernel, n, bytes_, flops, ms):
    med = statistics.median(ms)
    return {"kernel": kernel, "dtype": "f32", "elements": n, "bytes": bytes_, "flops": flops, "median_ms": med,
            "min_ms": min(ms), "max_ms": max(ms), "gbs": bytes_ / (med * 1e-3) / 1e9,
            "tflops": flops / (med * 1e-3) / 1e12}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", required=True, help="element counts, comma-separated (as forge's JSON lists them)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--warmup-ms", type=float, default=50)
    args = p.parse_args()
    results, skipped = [], []
    for n in (int(s) for s in args.sizes.split(",")):
        try:
            src = torch.randn(n, device="cuda")
            dst = torch.empty_like(src)
            results.append(row("copy", n, 8.0 * n, 0.0,
                               timed(lambda: dst.copy_(src), args.repeats, args.warmup, args.warmup_ms)))
            del src, dst
            a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
            c = torch.empty_like(a)
            results.append(row("multiply", n, 12.0 * n, float(n),
                               timed(lambda: torch.mul(a, b, out=c), args.repeats, args.warmup, args.warmup_ms)))
            del a, b, c
        except torch.cuda.OutOfMemoryError as e:
            skipped.append({"kernel": "copy/multiply", "size": str(n), "reason": str(e).splitlines()[0]})
        torch.cuda.empty_cache()
    print(json.dumps({"benchmark": "memory", "framework": "torch " + torch.__version__,
                      "device_name": torch.cuda.get_device_name(0),
                      "method": {"timer": "torch.cuda.Event", "warmup_runs": args.warmup, "warmup_ms": args.warmup_ms,
                                 "repeats": args.repeats, "statistic": "median",
                                 "bytes": "copy 2*4N, multiply 3*4N"},
                      "results": results, "skipped": skipped}, indent=2))


if __name__ == "__main__":
    main()
