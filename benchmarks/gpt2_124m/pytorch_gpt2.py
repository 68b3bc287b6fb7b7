#!/usr/bin/env python3
"""The PyTorch peer of `forge train configs/gpt2-124m.toml`: GPT-2 124M, same shapes, same data
kind (uniform random tokens), same optimizer settings, timed the same way.

    python3 pytorch_gpt2.py --mode eager   --batch 16 --steps 30 --json out.json
    python3 pytorch_gpt2.py --mode compile --batch 32 --steps 30 --json out.json

The model is GPT-2 small in the nanoGPT layout (pre-norm blocks, fused qkv projection, tanh GELU,
tied input/output embedding, vocabulary padded to 50304), trained the way a PyTorch user would
train it fast: f32 parameters, bf16 autocast, F.scaled_dot_product_attention (causal: flash
attention on an H100), fused AdamW (lr 6e-4, betas 0.9/0.95, weight decay 0.1 on matmul
weights), gradient clipping at 1.0, TF32 allowed for the few f32 matmuls left. Each step reads
the loss on the host (as forge's trainer does), so both sides include that synchronisation.
Reported: ms/step (mean and median of the timed steps), tokens/s, MFU by the formula forge uses
(Note [MFU] in src/forge/telemetry/mfu.h), peak memory (torch.cuda.max_memory_allocated).
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab=50304, ctx=1024, layers=12, heads=12, d=768):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="dense bf16 peak of the GPU (H100 SXM: 989.4)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = "cuda"
    model = GPT(ctx=a.seq).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    n_matmul = n_params - model.wpe.weight.numel()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_fn = torch.compile(model) if a.mode == "compile" else model
    gen = torch.Generator(device=dev).manual_seed(1)

    def batch():
        t = torch.randint(0, 50304, (a.batch, a.seq + 1), device=dev, generator=gen)
        return t[:, :-1], t[:, 1:]

    times = []
    for i in range(a.warmup + a.steps):
        x, y = batch()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_v = loss.item()
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
        if i == a.warmup - 1:
            torch.cuda.reset_peak_memory_stats()
    ms = 1e3 * statistics.fmean(times)  # the mean, as forge's trainer reports it
    ms_median = 1e3 * statistics.median(times)
    tps = a.batch * a.seq / (ms / 1e3)
    flops_per_token = 6 * n_matmul + 12 * 12 * a.seq * 768
    out = {"peer": f"pytorch-{a.mode}", "torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "batch": a.batch, "seq": a.seq, "steps": a.steps, "params": n_params, "ms_per_step": ms, "ms_per_step_median": ms_median,
           "tokens_per_s": tps, "mfu": tps * flops_per_token / (a.peak_tflops * 1e12),
           "peak_mem_bytes": torch.cuda.max_memory_allocated(), "last_loss": loss_v}
    print(json.dumps(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
