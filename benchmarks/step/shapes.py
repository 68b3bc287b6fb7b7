#!/usr/bin/env python3
"""Model shapes, parameter counts, FLOPs per token and device peaks for benchmarks/step.

One copy of the arithmetic that both sides of every comparison are measured with: the PyTorch
peer (torch_peer.py) prints its module's parameter count beside param_count() below, and
report.py computes every row's MFU, forge's and PyTorch's, from flops_per_token() and peak_tflops().

    python3 benchmarks/step/shapes.py configs/llama-0.85b.toml   # the shape, N, FLOPs per token

MFU (Note [MFU] in src/forge/telemetry/mfu.h, the formula of PaLM appendix B and llm.c):
    FLOPs per trained token = 6·N + 12·L·T·d
  N   the parameters that take part in a matrix multiply: all parameters except embedding tables
      that are only looked up (GPT's learned positions wpe; LLaMA's input embedding, whose head is
      a separate matrix). GPT's tied wte/lm_head matrix counts once, as the head. Norm weights and
      biases are counted (< 0.1% of N).
  L, T, d  layers, the trained sequence length, the model width (n_head x head size).
  MFU = tokens/s x FLOPs per token / (dense bf16 peak x GPUs).
"""
import sys

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None


def load_config(path):
    """The [model], [optim] and [train] tables of a forge run config (TOML)."""
    if tomllib is None:
        raise SystemExit("shapes.py: Python 3.11+ (tomllib) is needed to read " + path)
    with open(path, "rb") as f:
        return tomllib.load(f)


def model_shape(cfg, overrides=None):
    """A dict describing the model of a forge config's [model] table (with forge's defaults),
    plus train.seq_len as 'seq'. overrides: {key: value} applied after (e.g. a tiny shape)."""
    m = dict(cfg.get("model", {}))
    m.update({k: v for k, v in (overrides or {}).items() if v is not None and k != "seq"})
    kind = m.get("type", "gpt")
    s = {"type": kind, "vocab": int(m["vocab_size"]), "ctx": int(m.get("block_size", 256)),
         "layers": int(m.get("n_layer", 4)), "heads": int(m.get("n_head", 4))}
    if kind == "gpt":
        s["width"] = int(m.get("n_embd", 128))
        s["kv_heads"] = s["heads"]
        s["ffn"] = 4 * s["width"]
        s["bias"] = bool(m.get("bias", True))
    elif kind == "llama":
        s["width"] = int(m.get("dim", 128))
        s["kv_heads"] = int(m.get("n_kv_head", 0)) or s["heads"]
        ffn = int(m.get("ffn_hidden", 0))
        s["ffn"] = ffn if ffn > 0 else (8 * s["width"] // 3 + 31) // 32 * 32  # LlamaConfig::default_ffn_hidden
        s["norm_eps"] = float(m.get("norm_eps", 1e-5))
        s["rope_theta"] = float(m.get("rope_theta", 10000.0))
        s["init_std"] = float(m.get("init_std", 0.02))
        s["bias"] = False
    else:
        raise SystemExit(f"shapes.py: model.type = '{kind}' is not a transformer this benchmark knows")
    seq = (overrides or {}).get("seq") or int(cfg.get("train", {}).get("seq_len", s["ctx"]))
    s["seq"] = int(seq)
    s["head_dim"] = s["width"] // s["heads"]
    return s


def param_count(s):
    """(total parameters, parameters in matrix products) of forge's module for shape s
    (the same arithmetic as plan::count_parameters, which a test holds equal to the module)."""
    d, V, L, F = s["width"], s["vocab"], s["layers"], s["ffn"]
    if s["type"] == "gpt":
        b = 1 if s["bias"] else 0
        norm = d * (1 + b)  # LayerNorm weight (+ bias)
        block = 2 * norm + (3 * d * d + b * 3 * d) + (d * d + b * d) + (F * d + b * F) + (d * F + b * d)
        wte, wpe = V * d, s["ctx"] * d
        total = wte + wpe + L * block + norm  # the head is tied to wte
        return total, total - wpe
    kv = s["kv_heads"] * s["head_dim"]
    block = 2 * d + d * d + 2 * d * kv + d * d + 3 * d * F  # 2 RMSNorms, q, k, v, o, gate/up/down
    embed, head = V * d, V * d
    total = embed + L * block + d + head
    return total, total - embed


def flops_per_token(s, seq=None):
    """6·N + 12·L·T·d (Note [MFU])."""
    _, n_matmul = param_count(s)
    T = seq or s["seq"]
    return 6 * n_matmul + 12 * s["layers"] * T * s["width"]


# Dense bf16 tensor-core peaks (TFLOP/s), from src/forge/plan/gpu_catalog.cpp, matched to the
# driver's device name by the rules of catalogue_entry() in src/forge/telemetry/mfu.cpp: the
# first (marker, excluded markers, peak) whose marker the lower-cased name contains and none of
# whose excluded markers it does. Form factors the catalogue does not list give None (no MFU).
_PEAKS = [
    ("h100", ("pcie", "nvl"), 989.4), ("h100", ("nvl",), 756.0),  # SXM, then PCIe
    ("h200", ("nvl",), 989.4), ("h800", ("pcie",), 989.4), ("h20", (), 148.0),
    ("a100", ("pcie",), 312.0), ("a800", ("pcie",), 312.0), ("l40", ("l40s",), 181.05),
    ("4090", (), 165.2), ("3090 ti", (), 80.0),
]


def peak_tflops(device_name):
    n = device_name.lower()
    for marker, excluded, peak in _PEAKS:
        if marker in n and not any(e in n for e in excluded):
            return peak
    return None


def describe(s):
    total, n = param_count(s)
    if s["type"] == "gpt":
        arch = (f"GPT-2: {s['layers']} layers x {s['width']}, {s['heads']} heads, MLP {s['ffn']} (GELU), "
                f"LayerNorm{'' if s['bias'] else ' (no bias)'}, learned positions, tied head")
    else:
        arch = (f"LLaMA: {s['layers']} layers x {s['width']}, {s['heads']} heads / {s['kv_heads']} kv-heads, "
                f"SwiGLU {s['ffn']}, RMSNorm (eps {s['norm_eps']:g}), RoPE (base {s['rope_theta']:g}), no biases, "
                "untied head")
    return (f"{arch}, vocabulary {s['vocab']}, context {s['ctx']}, sequence {s['seq']}; "
            f"{total:,} parameters ({n:,} in matrix products)")


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: shapes.py CONFIG.toml")
    s = model_shape(load_config(sys.argv[1]))
    total, n = param_count(s)
    print(describe(s))
    print(f"params {total} matmul_params {n} flops_per_token {flops_per_token(s)}")


if __name__ == "__main__":
    main()
