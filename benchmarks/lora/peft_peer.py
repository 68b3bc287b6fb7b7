#!/usr/bin/env python3
"""The PEFT peer of a forge LoRA run (issue 40): Hugging Face transformers' LlamaForCausalLM with
PEFT's LoRA on the same shape, batch, sequence, targets, rank and optimizer, timed as
benchmarks/step/torch_peer.py times itself.

    python3 peft_peer.py --mode eager|compile --batch 4 --seq 2048 --json out.json

The model: LLaMA-3.2-1B's shape (width 2048, 16 layers, 32 heads over 8 key/value heads, SwiGLU
8192 wide, vocabulary 128256, rope theta 500000), the head UNTIED (forge's LLaMA has its own head;
both sides carry it, frozen), random init, the base in bf16 and frozen (requires_grad false: PEFT's
default), SDPA attention (transformers' "sdpa"). LoRA as PEFT's users configure it: r 16, alpha 32,
no dropout, on q, k, v, o, gate, up and down (PEFT keeps the adapters in f32 by default,
autocast_adapter_dtype). AdamW(fused=True) over the adapters, lr 1e-4, grad norm clipped to 1.
Random tokens; the loss is transformers' (labels = inputs, shifted inside). --mode compile wraps the
PEFT model in torch.compile (default mode). The first --warmup steps are not timed; a step is timed
from the previous step's loss read to this one's (the host waits for each loss: what a training
loop logging every step does). Peak memory: torch.cuda.max_memory_allocated() after the warm-up.
Prints one JSON line (and writes --json): ms_per_step, tokens_per_s, peak_mem_bytes, trainable,
total, last_loss.
"""
import argparse
import json
import statistics
import sys
import time

import torch

try:
    import transformers
    import peft
except ImportError as e:
    print(f"SKIPPED: {e}")
    sys.exit(77)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    cfg = transformers.LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                   num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                   max_position_embeddings=max(a.seq, 2048), rope_theta=500000.0, rms_norm_eps=1e-5,
                                   tie_word_embeddings=False, attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    with torch.device("cuda"):
        base = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    lcfg = peft.LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = peft.get_peft_model(base, lcfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    trainable = sum(p.numel() for p in params)
    total = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, fused=True)
    fwd = torch.compile(model) if a.mode == "compile" else model
    gen = torch.Generator(device="cuda").manual_seed(1)

    def step():
        ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device="cuda", generator=gen)
        loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    for _ in range(a.warmup):
        step().item()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times, last = [], None
    t0 = time.perf_counter()
    for _ in range(a.steps):
        last = step().item()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    ms = 1e3 * statistics.fmean(times)
    out = {"mode": a.mode, "ms_per_step": ms, "ms_per_step_median": 1e3 * statistics.median(times),
           "tokens_per_s": a.batch * a.seq / (ms / 1e3), "peak_mem_bytes": torch.cuda.max_memory_allocated(),
           "trainable": trainable, "total": total, "last_loss": last, "torch": torch.__version__,
           "transformers": transformers.__version__, "peft": peft.__version__}
    print(json.dumps(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
