#!/usr/bin/env python3
"""The peer of benchmarks/sample/run.sh: transformers' generate() on the model forge exported.

Greedy, a KV cache or not (use_cache), N copies of one prompt, NEW tokens each; prints one JSON line
{"tokens_per_s": ..., "completion": "the first row's new text"}. tokens/s counts every row's new tokens
over generate()'s wall time after one untimed warm-up call, as forge sample counts its own.
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
a = ap.parse_args()

tok = AutoTokenizer.from_pretrained(a.model_dir)
model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32).to(a.device).eval()
ids = torch.tensor([tok(a.prompt)["input_ids"]] * a.prompts, device=a.device)
kw = dict(max_new_tokens=a.tokens, min_new_tokens=a.tokens, do_sample=False, use_cache=not a.no_kv_cache,
          attention_mask=torch.ones_like(ids), pad_token_id=tok.eos_token_id or 0)


def run():
    if a.device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, **kw)
    if a.device.startswith("cuda"):
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


run()  # warm-up: kernels, allocator
out, dt = run()
new = out[:, ids.shape[1]:]
print(json.dumps({"tokens_per_s": new.numel() / dt, "completion": tok.decode(new[0].tolist()), "seconds": dt}))
