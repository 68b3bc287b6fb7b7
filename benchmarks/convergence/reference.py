#!/usr/bin/env python3
"""The PyTorch side of a convergence run: the peer model trained on forge's own token shards, in
forge's order, with forge's schedule, so the two loss curves can be laid side by side.

    python3 reference.py --config configs/gpt2-124m.toml --init init/ --train 'corpus/gpt2/train/shard_*.bin' \
        --val 'corpus/gpt2/val/shard_*.bin' --steps 5000 --batch 16 --seq 1024 --warmup 250 \
        --eval-every 250 --eval-batches 40 --mode compile --out ref.jsonl

What it mirrors of `forge train ... --data.order=sequential --data.val_files=...` (docs/train.md):
- the model: benchmarks/step/torch_peer.py's (the tuned peer of the step benchmark: nanoGPT-layout
  GPT-2, or the LLaMA), loaded from init_weights.py's peer_init.pt, which forge loads too (as a
  Hugging Face directory through model.init_from);
- the data: forge's token shards (FRGTOK v1) in the order forge lists them (sorted glob matches),
  every window of seq + 1 tokens at starts 0, seq, 2 seq, ... of each shard, a batch the next
  `batch` windows, the partial batch at the end dropped, then the next epoch
  (data::SequentialTrainWindows);
- validation: the first `eval-batches` batches of the same windows of the validation shards
  (the last one may be partial), the mean cross-entropy over their target tokens, after every
  `eval-every` steps and after the last (data::SequentialWindows, the LanguageTask's evaluation);
- the optimizer: AdamW (fused) with the config's lr, betas, eps and weight decay on matmul weights
  other than embeddings, the global gradient norm clipped at optim.grad_clip, the learning rate of
  step k (0-based) warmup lr (k + 1) / W, then cosine to min_lr at decay steps (optim::LRSchedule);
- precision: f32 parameters under bf16 autocast, the loss in f32 (forge keeps bf16 parameters with
  f32 master weights: the two differ by bf16 rounding, which is what the comparison measures).

Writes one JSON line per step ({"step", "loss", "lr", "grad_norm", "elapsed_s"}) and per
validation ({"step", "val_loss", "elapsed_s"}); elapsed_s counts from the script's start (model
build, loading and compilation included) and leaves the validation passes out; forge's records
count from its start too and give each pass's eval_s, which report.py subtracts.
"""
import argparse
import glob
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "step"))
sys.path.insert(0, os.path.join(HERE, "..", "gpt2_124m"))
import torch_peer  # noqa: E402

SHARD_MAGIC = b"FRGTOK\0\0"


def open_shard(path):
    """A forge token shard (src/forge/data/shards.h, version 1) as a read-only numpy array."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) != 24 or head[:8] != SHARD_MAGIC:
        raise SystemExit(f"reference.py: {path} is not a forge token shard (FRGTOK)")
    version, width, count = struct.unpack("<IIQ", head[8:])
    if version != 1 or width not in (2, 4) or os.path.getsize(path) != 24 + count * width:
        raise SystemExit(f"reference.py: {path}: version {version}, {width} bytes per token, {count} tokens: not a "
                         "well-formed shard")
    return np.memmap(path, dtype="<u2" if width == 2 else "<u4", mode="r", offset=24, shape=(count,))


def shards(pattern):
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise SystemExit(f"reference.py: no file matches {pattern}")
    return [open_shard(p) for p in paths]


class Windows:
    """forge's sequential windows over whole shards: window j of shard r is tokens
    [j T, j T + T] (T + 1 tokens; inputs the first T, targets the last T)."""

    def __init__(self, arrays, seq):
        self.arrays, self.seq = arrays, seq
        self.index = [(r, j) for r, a in enumerate(arrays) for j in range((len(a) - 1) // seq if len(a) > seq else 0)]

    def batch(self, first, rows, device):
        T = self.seq
        buf = np.empty((rows, T + 1), dtype=np.int64)
        for i in range(rows):
            r, j = self.index[first + i]
            buf[i] = self.arrays[r][j * T: j * T + T + 1]
        t = torch.from_numpy(buf).to(device, non_blocking=True)
        return t[:, :-1], t[:, 1:]


def lr_at(step, lr, min_lr, warmup, total):
    """optim::LRSchedule (cosine): the learning rate of 0-based step `step`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    r = (step - warmup) / (total - warmup)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * r))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="the forge run config (its [optim]; the model is --init's)")
    ap.add_argument("--init", required=True, help="init_weights.py's directory (peer_init.pt)")
    ap.add_argument("--train", required=True, help="glob of the training shards")
    ap.add_argument("--val", required=True, help="glob of the validation shards")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True, help="sequences per step")
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--lr", type=float, default=None, help="default: optim.lr")
    ap.add_argument("--min-lr", type=float, default=None, help="default: schedule.min_lr")
    ap.add_argument("--decay-steps", type=int, default=0, help="the cosine's length (0: --steps)")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-batches", type=int, default=40)
    ap.add_argument("--mode", choices=["eager", "compile"], default="compile")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--params", choices=["f32", "f32-full", "bf16", "bf16-grid"], default="f32",
                    help="f32: f32 parameters under bf16 autocast (PyTorch's usual recipe); f32-full: f32 "
                         "parameters and f32 arithmetic, no autocast (TF32 matrix products on a GPU: the peer of "
                         "forge's --run.dtype=f32 --run.allow_tf32=true); bf16: forge's recipe "
                         "emulated - the forward and backward run on a bf16 copy of f32 master weights (so the "
                         "embeddings, norms and residual stream are bf16), gradients copied to the master, AdamW "
                         "on the master, the copy rounded from it after each step. On a CPU the copy holds the "
                         "bf16-rounded values in f32 (the arithmetic stays f32); bf16-grid: bf16 with the masters "
                         "first rounded to bf16, as forge's AdamW creates them from the bf16 parameters")
    ap.add_argument("--out", required=True, help="metrics, one JSON object per line")
    ap.add_argument("--save-final", default="", help="write the final state_dict here (parity.py compares it)")
    ap.add_argument("--decay-embeddings", action="store_true",
                    help="a deliberate mistake for parity.py's negative control: weight decay on the embeddings too")
    a = ap.parse_args()
    start = time.perf_counter()  # start-up counts, as forge's elapsed_s counts its own (model, data, graphs)

    import tomllib
    with open(a.config, "rb") as f:
        cfg = tomllib.load(f)
    opt_cfg, sched = cfg.get("optim", {}), cfg.get("schedule", {})
    lr = a.lr if a.lr is not None else float(opt_cfg.get("lr", 6e-4))
    min_lr = a.min_lr if a.min_lr is not None else float(sched.get("min_lr", lr / 10))
    total = a.decay_steps or a.steps

    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    init = torch.load(os.path.join(a.init, "peer_init.pt"), map_location="cpu")
    s = init["shape"]
    model = torch_peer.build(s)
    model.load_state_dict(init["state_dict"])
    model.to(dev).train()
    embeddings = () if a.decay_embeddings else torch_peer.EMBEDDINGS
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and n not in embeddings]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and n not in embeddings)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": float(opt_cfg.get("weight_decay", 0.1))},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(float(opt_cfg.get("beta1", 0.9)), float(opt_cfg.get("beta2", 0.95))),
                            eps=float(opt_cfg.get("eps", 1e-8)), **({"fused": True} if cuda else {}))
    clip = float(opt_cfg.get("grad_clip", 1.0))
    # --params bf16: `work` runs forward and backward; `model` holds the f32 master weights.
    work = model
    if a.params in ("bf16", "bf16-grid"):
        work = torch_peer.build(s).to(dev).train()
        if cuda:
            work.to(torch.bfloat16)
        masters = list(model.parameters())
        copies = list(work.parameters())

        def round_copy():
            with torch.no_grad():
                for c, m in zip(copies, masters):
                    c.copy_(m.to(torch.bfloat16).to(c.dtype))
        if a.params == "bf16-grid":
            with torch.no_grad():
                for m in masters:
                    m.copy_(m.to(torch.bfloat16).float())
        round_copy()
    step_fn = torch.compile(work) if a.mode == "compile" else work
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda and a.params != "f32-full")

    train = Windows(shards(a.train), a.seq)
    val = Windows(shards(a.val), a.seq)
    per_epoch = len(train.index) // a.batch
    if per_epoch == 0:
        raise SystemExit(f"reference.py: {len(train.index)} training windows, fewer than one batch of {a.batch}")
    val_batches = math.ceil(len(val.index) / a.batch)
    if a.eval_batches > 0:
        val_batches = min(val_batches, a.eval_batches)

    def validation():
        work.eval()
        total_loss, tokens = 0.0, 0
        with torch.no_grad(), amp:
            for b in range(val_batches):
                rows = min(a.batch, len(val.index) - b * a.batch)
                x, y = val.batch(b * a.batch, rows, dev)
                loss = work(x, y)  # eager (a partial last batch would recompile); mean over rows x seq
                total_loss += float(loss) * y.numel()
                tokens += y.numel()
        work.train()
        return total_loss / tokens

    out = open(a.out, "w")

    def record(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    record({"config": a.config, "mode": a.mode, "params": a.params, "steps": a.steps, "batch": a.batch, "seq": a.seq,
            "torch": torch.__version__, "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
            "train_windows": len(train.index), "val_windows": len(val.index), "val_batches": val_batches})
    # The host reads step k's loss after queueing step k + 1 (torch_peer.py's and forge's deferred
    # read), so the device does not drain between steps; a validation pass drains it (its time is
    # left out of elapsed_s).
    eval_s, pending = 0.0, None

    def read(p):
        n, loss_t, norm_t, cur = p
        record({"step": n, "loss": float(loss_t), "lr": cur, "grad_norm": float(norm_t),
                "elapsed_s": time.perf_counter() - start - eval_s})

    for step in range(a.steps):
        k = step % per_epoch
        x, y = train.batch(k * a.batch, a.batch, dev)
        cur = lr_at(step, lr, min_lr, a.warmup, total)
        for g in opt.param_groups:
            g["lr"] = cur
        with amp:
            loss = step_fn(x, y)
        loss.backward()
        if work is not model:
            for c, m in zip(copies, masters):
                m.grad = c.grad.float()
                c.grad = None
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip) if clip > 0 else torch.zeros(())
        opt.step()
        opt.zero_grad(set_to_none=True)
        if work is not model:
            round_copy()
        if pending is not None:
            read(pending)
        pending = (step + 1, loss.detach(), norm.detach(), cur)
        if (a.eval_every > 0 and (step + 1) % a.eval_every == 0) or step + 1 == a.steps:
            read(pending)
            pending = None
            t = time.perf_counter()
            v = validation()
            record({"step": step + 1, "val_loss": v, "elapsed_s": t - start - eval_s})
            eval_s += time.perf_counter() - t
    out.close()
    if a.save_final:
        torch.save({"state_dict": model.state_dict(), "shape": s}, a.save_final)


if __name__ == "__main__":
    main()
