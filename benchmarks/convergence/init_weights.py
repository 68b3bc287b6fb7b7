#!/usr/bin/env python3
"""The initial weights both sides of a convergence run start from.

    python3 init_weights.py --config configs/gpt2-124m.toml --out init/ [--tokenizer tokenizer.json]
                            [--vocab_size N] [--seed 1337] [--tiny]

Builds the PyTorch peer's model (benchmarks/step/torch_peer.py: the nanoGPT-layout GPT-2 or the
LLaMA, each with its usual initialisation) from the forge config's [model] section, seeded, and
writes
  OUT/peer_init.pt        its state_dict, which reference.py loads;
  OUT/config.json,        the same tensors as a Hugging Face model directory (GPT2LMHeadModel or
  OUT/model.safetensors   LlamaForCausalLM names; GPT-2's Conv1D weights transposed), which forge
                          loads through model.init_from;
  OUT/tokenizer.json      a copy of --tokenizer, when given (init_from's directory is complete).
Both are f32 and hold the same numbers: forge and PyTorch start from identical weights.
"""
import argparse
import json
import os
import shutil
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "step"))
sys.path.insert(0, os.path.join(HERE, "..", "gpt2_124m"))
import shapes  # noqa: E402
import torch_peer  # noqa: E402


def peer_shape(config, overrides):
    cfg = shapes.load_config(config)
    return cfg, shapes.model_shape(cfg, overrides)


def hf_tensors(model, s):
    """The peer's parameters under Hugging Face's names (f32, contiguous)."""
    sd = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    out = {}
    if s["type"] == "llama":
        for k, v in sd.items():
            if k in ("cos", "sin"):
                continue
            out[k if k == "lm_head.weight" else "model." + k] = v
        return out
    conv1d = ("c_attn", "c_proj", "c_fc", "mlp_proj")  # nn.Linear here, Conv1D ([in, out]) in HF's GPT-2
    for k, v in sd.items():
        if k == "lm_head.weight":
            continue  # tied to wte
        if k.startswith("blocks."):
            _, i, mod, what = k.split(".")
            name = {"ln_1": "ln_1", "ln_2": "ln_2", "c_attn": "attn.c_attn", "c_proj": "attn.c_proj",
                    "c_fc": "mlp.c_fc", "mlp_proj": "mlp.c_proj"}[mod]
            if mod in conv1d and what == "weight":
                v = v.t().contiguous()
            out[f"transformer.h.{i}.{name}.{what}"] = v
        else:
            out["transformer." + k] = v
    return out


def hf_config(s):
    if s["type"] == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": s["vocab"],
                "hidden_size": s["width"], "intermediate_size": s["ffn"], "num_hidden_layers": s["layers"],
                "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"],
                "max_position_embeddings": s["ctx"], "rope_theta": s["rope_theta"], "rms_norm_eps": s["norm_eps"],
                "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32"}
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": s["vocab"],
            "n_positions": s["ctx"], "n_ctx": s["ctx"], "n_embd": s["width"], "n_layer": s["layers"],
            "n_head": s["heads"], "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": True,
            "torch_dtype": "float32"}


def write_safetensors(path, tensors):
    """A safetensors file (8-byte little-endian header length, the JSON header, the data), f32."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        t = tensors[name]
        data = t.cpu().numpy().astype("<f4", copy=False).tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="the forge run config whose [model] both sides train")
    ap.add_argument("--out", required=True, help="the directory to write")
    ap.add_argument("--tokenizer", default="", help="a tokenizer.json to copy beside the weights")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--tiny", action="store_true", help="a small shape of the same family (smoke tests on a CPU)")
    for k in ("n_layer", "n_head", "n_kv_head", "n_embd", "dim", "ffn_hidden", "vocab_size", "block_size"):
        ap.add_argument("--" + k, type=int, default=None, help=f"override model.{k}")
    a = ap.parse_args()
    over = {k: getattr(a, k) for k in ("n_layer", "n_head", "n_kv_head", "n_embd", "dim", "ffn_hidden", "vocab_size",
                                       "block_size")}
    cfg, _ = peer_shape(a.config, {})
    if a.tiny:
        tiny = {"n_layer": 2, "n_head": 4, "n_embd": 64, "dim": 64, "block_size": 64,
                "n_kv_head": 2 if cfg["model"].get("type") == "llama" else None, "ffn_hidden": 160}
        over = {k: (v if v is not None else tiny.get(k)) for k, v in over.items()}
    over["seq"] = None
    _, s = peer_shape(a.config, over)
    torch.manual_seed(a.seed)
    model = torch_peer.build(s)
    os.makedirs(a.out, exist_ok=True)
    torch.save({"state_dict": model.state_dict(), "shape": s, "seed": a.seed}, os.path.join(a.out, "peer_init.pt"))
    write_safetensors(os.path.join(a.out, "model.safetensors"), hf_tensors(model, s))
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(hf_config(s), f, indent=2)
    if a.tokenizer:
        shutil.copyfile(a.tokenizer, os.path.join(a.out, "tokenizer.json"))
    n = sum(p.numel() for p in model.parameters())
    print(f"init_weights: {s['type']} of {n:,} parameters (seed {a.seed}) -> {a.out}")


if __name__ == "__main__":
    main()
