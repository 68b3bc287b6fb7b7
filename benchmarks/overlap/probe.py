#!/usr/bin/env python3
"""Can an optimizer update hide behind the next forward's GEMMs? (issue 15, docs/performance.md item 25)

Runs, on one GPU, the GEMMs of a LLaMA 0.85B forward (16 layers, 8192 tokens: qkv 2048->3072,
o 2048->2048, gate+up 2048->11264, down 5632->2048) and an AdamW update of the same model's
852M parameters (PyTorch's fused AdamW, f32 state: ~28 bytes a parameter, as forge's), first one
after the other, then at once: the update on a side stream, layer by layer, each layer's forward
GEMMs waiting for that layer's update (an event), as a deferred update would run. Prints the
three times and the share of the update that was hidden: (gemm + adamw - together) / adamw.

  python3 benchmarks/overlap/probe.py [--reps 20]
"""
import argparse, statistics, torch

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=8192)
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    L, d, f, kv = 16, 2048, 5632, 512
    shapes = [(d, d + 2 * kv), (d, d), (d, 2 * f), (f, d)]
    x = {k: torch.randn(a.tokens, k, device=dev, dtype=torch.bfloat16) for k in (d, f)}
    W = [[torch.randn(k, n, device=dev, dtype=torch.bfloat16) * 0.02 for k, n in shapes] for _ in range(L)]
    out = {n: torch.empty(a.tokens, n, device=dev, dtype=torch.bfloat16) for _, n in shapes}
    # optimizer groups in forward order: embedding, 16 layers, head (32000 x 2048 each end)
    sizes = [32000 * d] + [sum(k * n for k, n in shapes) + 2 * d] * L + [32000 * d + d]
    groups = []
    for s in sizes:
        p = torch.randn(s, device=dev); g = torch.randn(s, device=dev) * 1e-3
        m = torch.zeros(s, device=dev); v = torch.zeros(s, device=dev)
        groups.append(([p], [g], [m], [v], [torch.tensor(1.0, device=dev)]))

    def adamw(i):
        p, g, m, v, st = groups[i]
        torch._fused_adamw_(p, g, m, v, [], st, lr=1e-4, beta1=0.9, beta2=0.95, weight_decay=0.1, eps=1e-8,
                            amsgrad=False, maximize=False)

    def gemms(i):
        for (k, n), w in zip(shapes, W[i]):
            torch.matmul(x[k], w, out=out[n])

    hi = torch.cuda.Stream(priority=-1)
    lo = torch.cuda.Stream(priority=0)
    same = torch.cuda.Stream(priority=-1)

    def timed(fn):
        ts = []
        for r in range(a.reps + 3):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            s.record(hi)
            fn()
            e.record(hi)
            torch.cuda.synchronize()
            if r >= 3: ts.append(s.elapsed_time(e))
        return statistics.median(ts)

    def only_gemm():
        with torch.cuda.stream(hi):
            for i in range(L): gemms(i)

    def only_adam():
        with torch.cuda.stream(hi):
            for i in range(len(groups)): adamw(i)

    def serial():
        only_adam(); only_gemm()

    def together(side):
        def run():
            start = torch.cuda.Event(); start.record(hi)
            side.wait_event(start)
            ev = []
            with torch.cuda.stream(side):
                for i in range(len(groups)):
                    adamw(i); e = torch.cuda.Event(); e.record(side); ev.append(e)
            with torch.cuda.stream(hi):
                hi.wait_event(ev[0])          # the embedding's update before layer 0
                for i in range(L):
                    hi.wait_event(ev[i + 1]); gemms(i)
                hi.wait_event(ev[-1])         # the head's, before the forward's end
        return run

    tg, ta, ts = timed(only_gemm), timed(only_adam), timed(serial)
    tl, tsame = timed(together(lo)), timed(together(same))
    print(f"device {torch.cuda.get_device_name()}, tokens {a.tokens}, {sum(sizes)/1e6:.1f}M parameters, median of {a.reps}")
    print(f"forward GEMMs alone       {tg:8.3f} ms ({2*a.tokens*sum(k*n for k,n in shapes)*L/tg/1e9:.0f} TFLOP/s)")
    print(f"AdamW alone               {ta:8.3f} ms ({28*sum(sizes)/ta/1e9:.2f} TB/s at 28 B a parameter)")
    print(f"one after the other       {ts:8.3f} ms")
    for name, t in (("side stream, low priority", tl), ("side stream, same priority", tsame)):
        print(f"together, {name:27s} {t:8.3f} ms: hidden {(tg + ta - t) / ta * 100:5.1f}% of AdamW, saves {ts - t:6.3f} ms")

if __name__ == "__main__":
    main()
