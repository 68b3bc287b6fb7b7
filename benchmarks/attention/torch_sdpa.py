#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the shapes of `forge bench attention`, forward and
backward, per SDPA back-end (cuDNN, flash), timed as forge times its own: CUDA events around
each run, the median of --repeats after --warmup runs, the backward alone (from one forward's
graph, retain_graph=True); with --graph N, N calls captured in a CUDA graph and each replay timed
(no Python dispatch inside the timing, issue 41). Same FLOP convention: forward 4 B H T S D (halved when causal),
backward 2.5 x forward. --layout bshd makes q, k, v and the upstream gradient (B, T, H, D)
memory viewed as (B, H, T, D), as `forge bench attention --layout bshd` does (and as a model's
`view(B, T, H, D).transpose(1, 2)` hands them to SDPA).

  python3 benchmarks/attention/torch_sdpa.py --json out.json --shape 16x12x12x1024x64 ...
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def parse_shape(spec):
    dims, _, mode = spec.partition(",")
    b, h, hkv, t, d = (int(x) for x in dims.split("x"))
    return dict(batch=b, heads=h, kv_heads=hkv, seq=t, head_dim=d, causal=(mode != "full"))


def fwd_flops(s):
    f = 4.0 * s["batch"] * s["heads"] * s["seq"] * s["seq"] * s["head_dim"]
    return f / 2 if s["causal"] else f


def time_ms(fn, warmup, repeats):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def time_ms_graph(fn, warmup, repeats, calls):
    """--graph: `calls` runs of fn captured in one CUDA graph, each replay timed with CUDA events and
    divided by `calls`, so that no Python dispatch is inside the timing (forge queues its runs from
    C++). The median over `repeats` replays, after warm-up runs on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 3)):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return statistics.median(times)


def run(s, backend, dtype, warmup, repeats, layout="bhsd", graph=0):
    gen = torch.Generator(device="cuda").manual_seed(1234)
    B, H, Hkv, T, D = s["batch"], s["heads"], s["kv_heads"], s["seq"], s["head_dim"]

    def mk(h):  # (B, h, T, D), contiguous or a view of (B, T, h, D) memory
        if layout == "bshd":
            return torch.randn(B, T, h, D, device="cuda", dtype=dtype, generator=gen).transpose(1, 2)
        return torch.randn(B, h, T, D, device="cuda", dtype=dtype, generator=gen)
    q, k, v = mk(H).requires_grad_(), mk(Hkv).requires_grad_(), mk(Hkv).requires_grad_()
    dout = mk(H)
    gqa = H != Hkv
    row = dict(shape=shape_str(s), backend="torch-" + backend, **s)
    try:
        with sdpa_kernel([BACKENDS[backend]]):
            call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=s["causal"], enable_gqa=gqa)
            timer = (lambda fn: time_ms_graph(fn, warmup, repeats, graph)) if graph else \
                (lambda fn: time_ms(fn, warmup, repeats))
            with torch.no_grad():
                fwd_ms = timer(call)
            if graph:
                # A captured backward must follow its forward on the capture stream (autograd runs
                # each backward op on its forward op's stream): forward + backward captured together,
                # the forward's time taken off.
                fwd_bwd = lambda: torch.autograd.grad(call(), (q, k, v), dout)
                bwd_ms = timer(fwd_bwd) - fwd_ms
            else:
                out = call()
                bwd = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                bwd_ms = timer(bwd)
    except Exception as e:  # a back-end that refuses the shape
        row["skipped"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        return row
    row.update(fwd_ms=fwd_ms, bwd_ms=bwd_ms, fwd_tflops=fwd_flops(s) / (fwd_ms * 1e-3) / 1e12,
               bwd_tflops=2.5 * fwd_flops(s) / (bwd_ms * 1e-3) / 1e12)
    return row


def shape_str(s):
    return f'{s["batch"]}x{s["heads"]}x{s["kv_heads"]}x{s["seq"]}x{s["head_dim"]}' + ("" if s["causal"] else ",full")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", action="append", required=True)
    ap.add_argument("--backends", default="cudnn,flash")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--layout", default="bhsd", choices=["bhsd", "bshd"])
    ap.add_argument("--graph", type=int, default=0,
                    help="time N calls captured in a CUDA graph per replay (0: CUDA events around each call)")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    rows = []
    for spec in a.shape:
        s = parse_shape(spec)
        for b in a.backends.split(","):
            rows.append(run(s, b, dtype, a.warmup, a.repeats, a.layout, a.graph))
            r = rows[-1]
            print(f'{r["shape"]:22s} {r["backend"]:12s} ' +
                  (f'fwd {r["fwd_ms"]:.3f} ms {r["fwd_tflops"]:.1f} TF/s  bwd {r["bwd_ms"]:.3f} ms {r["bwd_tflops"]:.1f} TF/s'
                   if "skipped" not in r else "skipped: " + r["skipped"]), flush=True)
    meta = dict(torch=torch.__version__, cudnn=torch.backends.cudnn.version(), device=torch.cuda.get_device_name(),
                layout=a.layout, timer=(f"CUDA graph of {a.graph} calls per replay" if a.graph else "CUDA events per call"))
    with open(a.json, "w") as f:
        json.dump(dict(meta=meta, results=rows), f, indent=1)


if __name__ == "__main__":
    main()
