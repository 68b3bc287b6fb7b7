#!/usr/bin/env python3
"""The PyTorch peer of `forge train CONFIG --dist.pp=P`: the same LLaMA, pipelined by PyTorch's own
torch.distributed.pipelining, with the same schedule, micro-batches and stage split.

    torchrun --standalone --nproc-per-node 2 benchmarks/pp/torch_pp_peer.py --config configs/llama-0.85b.toml \
        --schedule 1f1b --micro 2 --grad-accum 8 --layers 9,7 --json out.json

The model is benchmarks/step/torch_peer.py's LLaMA (forge's layout; f32 weights under bf16
autocast, the loss in f32, fused AdamW with forge's decay groups, the global gradient norm clipped
to optim.grad_clip over all stages). Each rank builds the whole model on its GPU (one seed), keeps
its stage's blocks (stage 0 also the embedding, the last stage the final norm and head) and frees the
rest; --mode compile compiles each block (as torchtitan does under pipelining). A step runs
--grad-accum micro-batches of --micro sequences through the schedule:
  1f1b         Schedule1F1B          (one stage per rank)
  gpipe        ScheduleGPipe         (one stage per rank)
  interleaved  ScheduleInterleaved1F1B, --virtual-stages chunks per rank (stage r, r + P, ...)
  zb           ScheduleInterleavedZeroBubble with one stage per rank (its backward split into input-
               and weight-gradient work: the zero-bubble class of forge's zb-h1)
--layers gives the blocks of each (virtual) stage, e.g. forge's balanced split (the forge log's
"stage s runs blocks [a, b)"); default as even as possible.

Timing: --warmup steps untimed, then --steps steps between two device synchronisations and barriers
(every rank); ms/step their mean. Peak memory per rank: torch.cuda.max_memory_allocated() since
the warm-up. Rank 0 prints one JSON line (and writes --json).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "step"))
import shapes  # noqa: E402
from torch_peer import EMBEDDINGS, Llama  # noqa: E402


class Stage(nn.Module):
    """Blocks [begin, end) of the whole model; the embedding on the first stage, the final norm
    and head on the last."""

    def __init__(self, whole, begin, end, first, last):
        super().__init__()
        self.embed_tokens = whole.embed_tokens if first else None
        self.layers = nn.ModuleList(whole.layers[begin:end])
        self.norm = whole.norm if last else None
        self.lm_head = whole.lm_head if last else None
        self.register_buffer("cos", whole.cos, persistent=False)
        self.register_buffer("sin", whole.sin, persistent=False)

    def forward(self, x):
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
        T = x.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        for b in self.layers:
            x = b(x, cos, sin)
        if self.lm_head is not None:
            x = self.lm_head(self.norm(x))
        return x


def split(n_blocks, parts, given):
    if given:
        layers = [int(x) for x in given.split(",")]
        if len(layers) != parts or sum(layers) != n_blocks or min(layers) < 1:
            raise SystemExit(f"torch_pp_peer.py: --layers {given} must be {parts} counts >= 1 summing to {n_blocks}")
    else:
        base, extra = divmod(n_blocks, parts)
        layers = [base + (1 if i < extra else 0) for i in range(parts)]
    starts = [sum(layers[:i]) for i in range(parts)]
    return [(starts[i], starts[i] + layers[i]) for i in range(parts)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="the forge run config (TOML) to mirror (a LLaMA)")
    ap.add_argument("--mode", choices=["eager", "compile"], default="compile")
    ap.add_argument("--schedule", choices=["1f1b", "gpipe", "interleaved", "zb"], default="1f1b")
    ap.add_argument("--virtual-stages", type=int, default=2, help="--schedule interleaved: chunks per rank")
    ap.add_argument("--micro", type=int, required=True, help="sequences per micro-batch")
    ap.add_argument("--grad-accum", type=int, required=True, help="micro-batches per step")
    ap.add_argument("--layers", default="", help="blocks per (virtual) stage, e.g. 9,7 (default: even)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    for k in ("n_layer", "n_head", "n_kv_head", "dim", "ffn_hidden", "vocab_size"):
        ap.add_argument("--" + k, type=int, default=None, help=f"override model.{k}")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                              ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble)

    cfg = shapes.load_config(a.config)
    if cfg["model"].get("type") != "llama":
        raise SystemExit("torch_pp_peer.py: a LLaMA config, please")
    over = {k: getattr(a, k) for k in ("n_layer", "n_head", "n_kv_head", "dim", "ffn_hidden", "vocab_size")}
    over["seq"] = None
    s = shapes.model_shape(cfg, over)
    opt_cfg = cfg.get("optim", {})

    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    P = world
    chunks = a.virtual_stages if a.schedule == "interleaved" else 1
    n_stages = P * chunks
    bounds = split(s["layers"], n_stages, a.layers)
    mine = [rank + c * P for c in range(chunks)]  # this rank's (virtual) stages

    torch.manual_seed(1337)
    with torch.device(dev):
        whole = Llama(s)
    n_params = sum(p.numel() for p in whole.parameters())
    modules = []
    for idx in mine:
        b, e = bounds[idx]
        st = Stage(whole, b, e, idx == 0, idx == n_stages - 1)
        if a.mode == "compile":
            for i, blk in enumerate(st.layers):
                st.layers[i] = torch.compile(blk)
        modules.append((idx, st))
    del whole
    torch.cuda.empty_cache()

    params = [(n, p) for _, m in modules for n, p in m.named_parameters()]
    stage_params = sum(p.numel() for _, p in params)
    decay = [p for n, p in params if p.dim() >= 2 and n not in EMBEDDINGS]
    no_decay = [p for n, p in params if not (p.dim() >= 2 and n not in EMBEDDINGS)]
    wd = float(opt_cfg.get("weight_decay", 0.1))
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=float(opt_cfg.get("lr", 6e-4)),
                            betas=(float(opt_cfg.get("beta1", 0.9)), float(opt_cfg.get("beta2", 0.95))),
                            eps=float(opt_cfg.get("eps", 1e-8)), fused=True)
    clip = float(opt_cfg.get("grad_clip", 1.0))

    V = s["vocab"]

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, V).float(), target.reshape(-1))

    stages = [PipelineStage(m, idx, n_stages, dev) for idx, m in modules]
    K = a.grad_accum
    if a.schedule == "1f1b":
        sched = Schedule1F1B(stages[0], K, loss_fn=loss_fn)
    elif a.schedule == "gpipe":
        sched = ScheduleGPipe(stages[0], K, loss_fn=loss_fn)
    elif a.schedule == "interleaved":
        sched = ScheduleInterleaved1F1B(stages, K, loss_fn=loss_fn)
    else:
        sched = ScheduleInterleavedZeroBubble(stages, K, loss_fn=loss_fn)
    first = 0 in mine
    last = (n_stages - 1) in mine
    gen = torch.Generator(device=dev).manual_seed(1)  # every rank draws the same batch; each uses its part
    amp = torch.autocast("cuda", dtype=torch.bfloat16)
    grads = [p for _, p in params]

    def one_step():
        t = torch.randint(0, V, (a.micro * K, s["seq"] + 1), device=dev, generator=gen)
        x, y = t[:, :-1].contiguous(), t[:, 1:].contiguous()  # (the stages check strides too)
        losses = []
        with amp:
            if first and last:
                sched.step(x, target=y, losses=losses)
            elif first:
                sched.step(x)
            elif last:
                sched.step(target=y, losses=losses)
            else:
                sched.step()
        if clip > 0:  # the global norm over every stage
            sq = torch.zeros((), device=dev)
            gs = [p.grad for p in grads if p.grad is not None]
            if gs:
                sq = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in gs])) ** 2
            dist.all_reduce(sq)
            coef = torch.clamp(clip / (sq.sqrt() + 1e-6), max=1.0)
            torch._foreach_mul_(gs, coef)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return torch.stack(losses).mean() if losses else None

    t0 = time.perf_counter()
    for _ in range(a.warmup):
        one_step()
    torch.cuda.synchronize()
    dist.barrier()
    warmup_s = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    last_loss = None
    for _ in range(a.steps):
        last_loss = one_step()
    torch.cuda.synchronize()
    dist.barrier()
    ms = 1e3 * (time.perf_counter() - t0) / a.steps
    mine_out = {"rank": rank, "stages": mine, "blocks": [list(bounds[i]) for i in mine], "params": stage_params,
                "peak_mem_bytes": torch.cuda.max_memory_allocated(dev),
                "reserved_bytes": torch.cuda.max_memory_reserved(dev),
                "loss": float(last_loss) if last_loss is not None else None}
    every = [None] * world
    dist.all_gather_object(every, mine_out)
    tokens = a.micro * K * s["seq"]
    out = {"peer": f"pytorch-{a.mode}-pp{P}-{a.schedule}", "torch": torch.__version__,
           "device": torch.cuda.get_device_name(dev), "world_size": world, "schedule": a.schedule,
           "virtual_stages": chunks, "micro": a.micro, "grad_accum": K, "seq": s["seq"], "steps": a.steps,
           "warmup": a.warmup, "warmup_s": warmup_s, "params": n_params, "ms_per_step": ms,
           "tokens_per_s": tokens / (ms / 1e3), "flops_per_token": shapes.flops_per_token(s),
           "peak_mem_bytes": max(r["peak_mem_bytes"] for r in every),
           "per_rank": every, "last_loss": next((r["loss"] for r in every if r["loss"] is not None), None)}
    if rank == 0:
        print(json.dumps(out), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
