#!/usr/bin/env python3
"""Merges `forge bench attention --json` and torch_sdpa.py's JSON into one markdown table:
TFLOP/s forward and backward per shape and back-end, and the ratios of forge's fastest back-end
to PyTorch's fastest (and to PyTorch's cuDNN back-end)."""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--forge", required=True)
    ap.add_argument("--torch", required=True)
    ap.add_argument("--command", default="")
    ap.add_argument("--commit", default="")
    a = ap.parse_args()
    fj, tj = json.load(open(a.forge)), json.load(open(a.torch))
    rows = fj["results"] + tj["results"]
    shapes = []
    for r in rows:
        if r["shape"] not in shapes:
            shapes.append(r["shape"])
    backends = []
    for r in rows:
        if r["backend"] not in backends:
            backends.append(r["backend"])
    by = {(r["shape"], r["backend"]): r for r in rows}
    print("# Attention: forge's back-ends beside PyTorch SDPA\n")
    print(f'- Device: {fj["device_name"]}; forge {a.commit}, cuDNN {fj.get("cudnn_version", "?")} (forge), '
          f'PyTorch {tj["meta"]["torch"]} (its cuDNN {tj["meta"]["cudnn"]})')
    print(f'- Command: `{a.command}`')
    layout = fj.get("layout", "bhsd")
    lay = {"bhsd": "every tensor (B, H, T, D)-contiguous",
           "bshd": "(B, T, H, D) memory viewed as (B, H, T, D), as forge's models hand it to attention"}
    print(f'- Layout: {layout}, {lay.get(layout, layout)} (forge and PyTorch alike: '
          f'{tj["meta"].get("layout", "bhsd")})')
    print(f'- dtype {fj["dtype"]}; {fj["method"]["statistic"]} of {fj["method"]["repeats"]} runs after '
          f'{fj["method"]["warmup_runs"]} warm-up, {fj["method"]["timer"]}; backward timed alone')
    print(f'- FLOPs: {fj["method"]["flops"]} (shape B x H x Hkv x T x D, T = S, causal)')
    print("- forge back-ends: `cudnn` (cuDNN fused attention via its graph API), `cudnn-det` (its deterministic "
          "backward), `flash` (forge's FlashAttention-2 kernels, mma.sync); PyTorch: `torch-cudnn`, `torch-flash` "
          "(F.scaled_dot_product_attention under sdpa_kernel)\n")
    print("TFLOP/s, forward / backward:\n")
    print("| shape | " + " | ".join(backends) + " | forge best / torch best (fwd, bwd) |")
    print("|---|" + "---|" * len(backends) + "---|")
    worst = [9.0, 9.0]
    for s in shapes:
        cells = []
        best = {"forge": [0, 0], "torch": [0, 0]}
        for b in backends:
            r = by.get((s, b))
            if r is None:
                cells.append("-")
            elif "skipped" in r:
                cells.append("skipped")
            else:
                cells.append(f'{r["fwd_tflops"]:.0f} / {r["bwd_tflops"]:.0f}')
                side = "torch" if b.startswith("torch") else "forge"
                if b == "cudnn-det":
                    continue
                best[side][0] = max(best[side][0], r["fwd_tflops"])
                best[side][1] = max(best[side][1], r["bwd_tflops"])
        ratio = "-"
        if best["torch"][0] > 0 and best["forge"][0] > 0:
            rf, rb = best["forge"][0] / best["torch"][0], best["forge"][1] / best["torch"][1]
            worst = [min(worst[0], rf), min(worst[1], rb)]
            ratio = f"{rf:.2f}, {rb:.2f}"
        print(f"| {s} | " + " | ".join(cells) + f" | {ratio} |")
    print(f"\nWorst ratio over the shapes (forge's fastest non-deterministic back-end / PyTorch's fastest): "
          f"forward {worst[0]:.2f}, backward {worst[1]:.2f}.")
    skipped = [r for r in rows if "skipped" in r]
    if skipped:
        print("\nSkipped:\n")
        for r in skipped:
            print(f'- {r["shape"]} {r["backend"]}: {r["skipped"]}')


if __name__ == "__main__":
    main()
