#!/usr/bin/env python3
"""The tensor-parallel report: benchmarks/results/tp_<gpu>.md from run_tp.sh's raw directory.

    python3 benchmarks/tp/report_tp.py benchmarks/results/raw/tp_NVIDIA_H200 > benchmarks/results/tp_NVIDIA_H200.md

Reads equivalence.jsonl (the check phase), perf.jsonl (the perf phase: forge's runs with forge
plan's prediction beside each, PyTorch's runs) and commit.txt. MFU is computed here for every run
with one formula (shapes.py: 6 N + 12 L T d FLOPs per token, over the GPUs' dense bf16 peak), so
forge and PyTorch are counted alike."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "step"))
import shapes  # noqa: E402

ROOT = os.path.join(HERE, "..", "..")
GPUS = 2
# run_tp.sh's models: the config and its overrides (keep in step with its "case $model").
MODELS = {"0.85b": {}, "wide": {"dim": 4096, "n_layer": 4, "ffn_hidden": 11008}}
VARIANTS = [("ddp", "DDP, tp 1 (2 x batch / 2)"), ("tp2", "tp 2"), ("tp2_nooverlap", "tp 2, FORGE_TP_OVERLAP=0"),
            ("tp2_sp", "tp 2 + sp"), ("tp2_sp_nooverlap", "tp 2 + sp, FORGE_TP_OVERLAP=0")]


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def gb(b):
    return f"{b / 1e9:.1f} GB" if b else "—"


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.split("\n\n")[1])
    raw = sys.argv[1]
    gpu = os.path.basename(raw.rstrip("/"))[len("tp_"):].replace("_", " ")
    commit = open(os.path.join(raw, "commit.txt")).read().strip() if os.path.exists(os.path.join(raw, "commit.txt")) else "?"
    peak = shapes.peak_tflops(gpu)
    cfg = shapes.load_config(os.path.join(ROOT, "configs", "llama-0.85b.toml"))
    out = []
    w = out.append
    w(f"# Tensor parallelism on {GPUS} x {gpu} (issue 16)\n")
    w(f"forge commit `{commit}`; `benchmarks/tp/run_tp.sh` (raw: `{os.path.relpath(raw, os.path.join(ROOT, 'benchmarks', 'results'))}/`), "
      f"written by `benchmarks/tp/report_tp.py`. Every number below comes from this one machine; the ratios are "
      f"forge beside PyTorch on the same GPUs.\n")

    eq = read_jsonl(os.path.join(raw, "equivalence.jsonl"))
    if eq:
        w("## Equivalence: tp = 2 on two GPUs (NCCL) against one GPU\n")
        w("Tiny models, f32 without TF32, 20 steps; `benchmarks/dist/compare_runs.py`: every loss and every final "
          "weight, max |a - b| / max |b| per tensor. Tolerances of the data-parallel tests: SGD 1e-6, AdamW 5e-5.\n")
        w("| model | optimizer | sequence parallel | loss max rel | weight max rel (tensor) | within |")
        w("|---|---|---|---|---|---|")
        for e in eq:
            r = e["result"]
            if "error" in r:
                w(f"| {e['model']} | {e['optim']} | {e['sequence_parallel']} | {r['error']} | | **no** |")
                continue
            tol = 1e-6 if e["optim"] == "sgd" else 5e-5
            ok = r["loss_max_rel"] <= 1e-6 and r["param_max_rel"] <= tol
            w(f"| {e['model']} | {e['optim']} | {'on' if e['sequence_parallel'] else 'off'} | {r['loss_max_rel']:.1e} | "
              f"{r['param_max_rel']:.1e} ({r.get('worst_param', '')}) | {'yes' if ok else '**no**'} |")
        w("")

    perf = read_jsonl(os.path.join(raw, "perf.jsonl"))
    for model, over in MODELS.items():
        rows = [p for p in perf if p["model"] == model]
        if not rows:
            continue
        s = shapes.model_shape(cfg, over)
        fpt = shapes.flops_per_token(s)
        w(f"## {model}: {shapes.describe(s)}\n")
        w(f"bf16, AdamW, global batch of 8 x {s['seq']} tokens. MFU = tokens/s x {fpt / 1e9:.3f} GFLOP/token / "
          f"({GPUS} x {peak} TFLOP/s).\n")
        w("| run | tokens/s | ms/step | MFU | peak memory / GPU | forge / PyTorch (same layout) |")
        w("|---|---|---|---|---|---|")
        peer = {p["variant"]: p["result"] for p in rows if p["who"] == "pytorch" and "error" not in p["result"]}
        forge = {p["variant"]: p for p in rows if p["who"] == "forge"}

        def mfu(tps):
            return f"{100 * tps * fpt / (GPUS * peak * 1e12):.1f}%" if peak else "—"

        for v, label in VARIANTS:
            if v not in forge:
                continue
            r = forge[v]["result"]
            if "error" in r:
                w(f"| forge {label} | {r['error']} | | | | |")
                continue
            base = v.replace("_nooverlap", "")
            ratio = ""
            if base in peer:
                pr = peer[base]
                ratio = (f"{r['tokens_per_s'] / pr['tokens_per_s']:.2f}x tokens/s, "
                         f"{r['mem_bytes'] / pr['peak_mem_bytes']:.2f}x memory")
            w(f"| forge {label} | {r['tokens_per_s'] / 1e3:.1f}k | {r['ms_per_step']:.1f} | {mfu(r['tokens_per_s'])} | "
              f"{gb(r['mem_bytes'])} | {ratio} |")
        for v, label in (("tp2", "tp 2"), ("tp2_sp", "tp 2 + sp")):
            if v in peer:
                pr = peer[v]
                w(f"| PyTorch {label} ({pr.get('peer', '')}) | {pr['tokens_per_s'] / 1e3:.1f}k | {pr['ms_per_step']:.1f} | "
                  f"{mfu(pr['tokens_per_s'])} | {gb(pr.get('peak_mem_bytes'))} | |")
        for v in ("tp2", "tp2_sp"):
            on, off = forge.get(v, {}).get("result", {}), forge.get(v + "_nooverlap", {}).get("result", {})
            if "tokens_per_s" in on and "tokens_per_s" in off:
                w(f"\nWeight gradients behind the collective ({v}): {on['tokens_per_s'] / off['tokens_per_s']:.3f}x "
                  f"tokens/s, memory {gb(on['mem_bytes'])} vs {gb(off['mem_bytes'])} without.")
        mfu_in = next((p["plan"].get("mfu_in") for p in forge.values() if "mfu_in" in p.get("plan", {})), None)
        how = (f"`--mfu {mfu_in:.3f}`, the MFU forge's tp 1 (DDP) run of this model measured, so that the plan "
               "tests what tensor parallelism adds (its collectives and memory) rather than the GEMMs' speed"
               if mfu_in is not None and abs(mfu_in - 0.4) > 1e-9 else "its default MFU of 40% for the compute")
        w(f"\n`forge plan` beside each forge run (`--gpu h100` or `h200` as measured, `--gpus 2`, {how}; "
          "memory without its allocator margin and runtime reserve):\n")
        w("| run | plan memory | measured peak | plan off by | plan step | measured step | off by |")
        w("|---|---|---|---|---|---|---|")
        for v, label in VARIANTS:
            p = forge.get(v)
            if not p or "error" in p["result"] or "error" in p.get("plan", {"error": 1}):
                continue
            r, pl = p["result"], p["plan"]
            w(f"| {label} | {gb(pl['mem_subtotal'])} | {gb(r['mem_bytes'])} | "
              f"{100 * (pl['mem_subtotal'] - r['mem_bytes']) / r['mem_bytes']:+.0f}% | {1e3 * pl['step_s']:.0f} ms | "
              f"{r['ms_per_step']:.0f} ms | {100 * (1e3 * pl['step_s'] - r['ms_per_step']) / r['ms_per_step']:+.0f}% |")
        w("")
    print("\n".join(out))


if __name__ == "__main__":
    main()
