#!/usr/bin/env python3
"""The peer of benchmarks/sample/run.sh: transformers' generate() on the model forge exported.

Greedy, a KV cache or not (use_cache), N copies of one prompt, NEW tokens each; prints one JSON line
{"tokens_per_s", "decode_tokens_per_s", "first_token_seconds", "completion", "seconds"}. tokens/s
counts every row's new tokens over generate()'s wall time; decode_tokens_per_s the tokens after the
first over the time after it (a generate() of one new token timed apart and subtracted), which is
how forge sample reports its rate after the first token. Each timed call follows untimed warm-ups.

Tuned as transformers' own documentation tunes decoding (issue 41): --dtype bf16, --cache static
(a StaticCache: fixed shapes) and --compile (torch.compile of the forward, mode "reduce-overhead":
CUDA graphs); the defaults are those. --dtype f32 --cache dynamic without --compile is the plain
eager generate().
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ap = argparse.ArgumentParser()
ap.add_argument("model_dir")
ap.add_argument("--prompt", default="The")
ap.add_argument("--prompts", type=int, default=1)
ap.add_argument("--tokens", type=int, default=64)
ap.add_argument("--device", default="cuda")
ap.add_argument("--no-kv-cache", action="store_true")
ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
ap.add_argument("--cache", choices=["static", "dynamic"], default="static", help="with the KV cache: its kind")
ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                help="torch.compile the forward (mode reduce-overhead); --no-compile: eager")
a = ap.parse_args()

dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
tok = AutoTokenizer.from_pretrained(a.model_dir)
model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=dtype).to(a.device).eval()
ids = torch.tensor([tok(a.prompt)["input_ids"]] * a.prompts, device=a.device)
kw = dict(min_new_tokens=a.tokens, do_sample=False, use_cache=not a.no_kv_cache,
          attention_mask=torch.ones_like(ids), pad_token_id=tok.eos_token_id or 0)
static = not a.no_kv_cache and a.cache == "static"
if static:
    kw["cache_implementation"] = "static"
if a.compile:
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=False)


def run(new):
    k = dict(kw, max_new_tokens=new, min_new_tokens=min(new, a.tokens))
    if a.device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, **k)
    if a.device.startswith("cuda"):
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


for _ in range(3 if a.compile else 1):  # warm-up: kernels, allocator, compilation and graph capture
    run(a.tokens)
    run(1)
_, t1 = run(1)
out, dt = run(a.tokens)
new = out[:, ids.shape[1]:]
rows = new.shape[0]
decode = rows * (new.shape[1] - 1) / (dt - t1) if dt > t1 and new.shape[1] > 1 else float("nan")
print(json.dumps({"tokens_per_s": new.numel() / dt, "decode_tokens_per_s": decode, "first_token_seconds": t1,
                  "completion": tok.decode(new[0].tolist()), "seconds": dt, "dtype": a.dtype,
                  "cache": ("none" if a.no_kv_cache else a.cache), "compile": a.compile}))
