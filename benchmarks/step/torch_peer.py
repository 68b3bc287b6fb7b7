#!/usr/bin/env python3
"""The PyTorch peer of `forge train CONFIG`: the same model, data kind, optimizer and timing.

    python3 torch_peer.py --config configs/gpt2-124m.toml --mode compile --batch 16 --json out.json
    python3 torch_peer.py --config configs/llama-0.85b.toml --mode eager --batch 4 --json out.json
    torchrun --standalone --nproc-per-node 2 torch_peer.py --config configs/gpt2-124m.toml --mode compile --batch 16
    python3 torch_peer.py --config configs/llama-0.85b.toml --device cpu --tiny --steps 2 --warmup 1   # smoke test

It reads the forge config itself ([model], [optim], train.seq_len), so both sides train the same
shape with the same hyper-parameters:
- GPT (model.type = "gpt"): benchmarks/gpt2_124m/pytorch_gpt2.py's model (nanoGPT layout: fused
  qkv, tanh GELU, LayerNorm with biases, learned positions, head tied to the token embedding).
- LLaMA (model.type = "llama"): the layout of src/forge/nn/llama.cpp and layers.cpp: token
  embedding; per block x + attn(rms(x)), then + swiglu(rms(x)); q/k/v/o projections without
  biases, 8 kv-heads shared by the 32 query heads (F.scaled_dot_product_attention(is_causal=True,
  enable_gqa=True)); rotary positions in Hugging Face's rotate_half layout (base model.rope_theta)
  on q and k; SwiGLU down(silu(gate(x)) * up(x)); RMSNorm (eps model.norm_eps); a final RMSNorm and
  an untied head; weights N(0, model.init_std), norms 1.
Both: f32 parameters under torch.autocast(bfloat16) (f32 master weights, as forge keeps), the
cross-entropy in f32, AdamW(fused=True) with optim.lr/beta1/beta2/eps and weight decay
optim.weight_decay on the matmul weights only (not embeddings, norms or biases: forge's
optim::decay_groups), clipping the global gradient norm to optim.grad_clip, TF32 allowed for the
few f32 matmuls left. --mode compile wraps the model (with its loss) in torch.compile (default mode).
Under torchrun (WORLD_SIZE > 1): DistributedDataParallel (NCCL, default 25 MB buckets), then
torch.compile of the DDP module; each rank draws its own random batch of --batch sequences, and the
loss is all-reduced for the host to read, as forge's data-parallel step does. --fsdp zero2|zero3
instead shards with FSDP2 (torch.distributed.fsdp.fully_shard on every block and the root, bf16
parameters for the compute and f32 gradient reduction, as torchtitan configures it): zero3 frees
each block's gathered parameters after its forward (reshard_after_forward, ZeRO-3), zero2 keeps
them to the backward (ZeRO-2's memory for parameters, sharded gradients and optimizer state);
with --mode compile each block is compiled in place before sharding (torchtitan's order).

Timing, as forge's trainer times itself (Note [deferred step read] in src/forge/train/trainer.cpp):
the host queues step i, then reads step i-1's loss (copied to pinned memory behind an event), so the
device never drains between steps; a step's time is the interval between two such reads. The first
--warmup steps are not timed (compilation, cuBLAS heuristics, allocator growth); ms/step is the mean
of the --steps timed intervals (median beside it). Peak memory: torch.cuda.max_memory_allocated()
since the end of the warm-up (bytes in live tensors, not the allocator's reserve).
Prints one JSON line (and writes it to --json): ms_per_step, tokens_per_s (all ranks), params (the
module's count and shapes.py's formula for forge's module), peak_mem_bytes (rank 0), last_loss.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.utils.checkpoint
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "gpt2_124m"))
import shapes  # noqa: E402


# ---- compatibility with old PyTorch builds (the CPU smoke test; the GPU runs use PyTorch 2.11) ----


def quantile(v, q):
    """The q-quantile of v by linear interpolation between order statistics (numpy's default)."""
    x = sorted(v)
    if not x:
        return float("nan")
    pos = q * (len(x) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(x) - 1)
    return x[lo] + (x[hi] - x[lo]) * (pos - lo)

def _sdpa_reference(q, k, v, is_causal=False, enable_gqa=False, **_):
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if is_causal:
        T = q.shape[-2]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s.float(), dim=-1).to(v.dtype) @ v


if not hasattr(F, "scaled_dot_product_attention"):  # PyTorch < 2.0
    F.scaled_dot_product_attention = _sdpa_reference
TORCH_VERSION = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
SDPA_HAS_GQA = TORCH_VERSION >= (2, 5) or F.scaled_dot_product_attention is _sdpa_reference


class _RMSNormReference(nn.Module):  # nn.RMSNorm arrived in PyTorch 2.4
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


RMSNorm = getattr(nn, "RMSNorm", _RMSNormReference)


# ---- LLaMA: the layout of src/forge/nn/llama.cpp --------------------------------------------------

def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, s):
        super().__init__()
        d, hd = s["width"], s["head_dim"]
        self.h, self.kv, self.hd = s["heads"], s["kv_heads"], hd
        self.q_proj = nn.Linear(d, self.h * hd, bias=False)
        self.k_proj = nn.Linear(d, self.kv * hd, bias=False)
        self.v_proj = nn.Linear(d, self.kv * hd, bias=False)
        self.o_proj = nn.Linear(self.h * hd, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # (T, hd), as transformers' apply_rotary_pos_emb
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if SDPA_HAS_GQA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.h)
        else:  # PyTorch 2.0-2.4: the same arithmetic with the kv-heads repeated
            rep = self.h // self.kv
            y = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.h * self.hd))


class SwiGLU(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.input_layernorm = RMSNorm(s["width"], eps=s["norm_eps"])
        self.self_attn = LlamaAttention(s)
        self.post_attention_layernorm = RMSNorm(s["width"], eps=s["norm_eps"])
        self.mlp = SwiGLU(s["width"], s["ffn"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, s):
        super().__init__()
        d = s["width"]
        self.embed_tokens = nn.Embedding(s["vocab"], d)
        self.layers = nn.ModuleList(LlamaBlock(s) for _ in range(s["layers"]))
        self.norm = RMSNorm(d, eps=s["norm_eps"])
        self.lm_head = nn.Linear(d, s["vocab"], bias=False)
        # rotary angles of positions 0..ctx-1: dim i pairs with i + hd/2, frequency theta^(-2i/hd)
        hd = s["head_dim"]
        inv = 1.0 / (s["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.outer(torch.arange(s["ctx"], dtype=torch.float64), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)
        for name, p in self.named_parameters():  # Hugging Face's init, as forge's Llama
            if "norm" not in name:
                nn.init.normal_(p, 0.0, s["init_std"])

    def forward(self, idx, targets):
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.embed_tokens(idx)
        for b in self.layers:
            if getattr(self, "checkpoint_blocks", False):  # --checkpoint: each block recomputed in backward
                x = torch.utils.checkpoint.checkpoint(b, x, cos, sin, use_reentrant=False)
            else:
                x = b(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


EMBEDDINGS = ("wte.weight", "wpe.weight", "embed_tokens.weight")


def tensor_parallel(model, tp, sp, dev):
    """Megatron's layout through torch.distributed.tensor.parallel: q/k/v, gate and up column-wise,
    o and down row-wise, the embedding row-wise over the vocabulary, the head column-wise with its
    logits left sharded for loss_parallel(); with sp, the norms on sequence shards."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    mesh = init_device_mesh(dev.type, (tp,))
    seq = Shard(1) if sp else Replicate()
    parallelize_module(model, mesh, {
        "embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False),
        **({"norm": SequenceParallel()} if sp else {}),
    })
    for block in model.layers:
        plan = {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(output_layouts=seq),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=seq),
        }
        if sp:
            plan.update({
                "input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel(),
                "self_attn": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                desired_input_layouts=(Replicate(), None, None)),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(block, mesh, plan)
        block.self_attn.h //= tp  # the local heads
        block.self_attn.kv //= tp
    return model


def clip_tensor_parallel(model, clip):
    """clip_grad_norm_ over a model whose sharded parameters are DTensors and whose norms (without
    sequence parallelism) are plain replicated tensors, which clip_grad_norm_ cannot mix: the two
    groups' norms combined (the replicated ones counted once), each group clipped with the total."""
    from torch.distributed.tensor import DTensor, Replicate
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    dt = [g for g in grads if isinstance(g, DTensor)]
    plain = [g for g in grads if not isinstance(g, DTensor)]
    total_sq = 0.0
    if dt:
        n = torch.nn.utils.get_total_norm(dt)
        total_sq = total_sq + (n.full_tensor() if isinstance(n, DTensor) else n) ** 2
    if plain:
        total_sq = total_sq + torch.nn.utils.get_total_norm(plain) ** 2
    total = total_sq ** 0.5
    coef = torch.clamp(clip / (total + 1e-6), max=1.0)
    if dt:
        c = DTensor.from_local(coef, dt[0].device_mesh, [Replicate()], run_check=False)
        for g in dt:
            g.mul_(c)
    if plain:
        torch._foreach_mul_(plain, coef)


# --fp8: the blocks' linears through torch._scaled_mm, as torchao's float8 training does (its
# Float8Linear with dynamic scaling), written out here since torchao is not installed on the GPU
# machine: current scaling from each cast's amax, e4m3 for x and w; tensorwise casts dy in e5m2
# and runs the forward GEMM with fast accumulation (torchao's defaults for that recipe); rowwise
# keeps every operand in e4m3 with one scale per row of each GEMM operand (torchao's "rowwise"
# recipe). Under --mode compile, torch.compile fuses the amaxes and casts into its kernels.
def _fp8_cast(t, dtype, rowwise):
    fmax = torch.finfo(dtype).max
    a = t.abs().amax(dim=-1, keepdim=True) if rowwise else t.abs().amax()
    scale = fmax / torch.clamp(a.float(), min=1e-12)
    return (t.float() * scale).clamp(-fmax, fmax).to(dtype), scale.reciprocal()


class _Fp8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, rowwise):
        x2 = x.reshape(-1, x.shape[-1])
        xq, xs = _fp8_cast(x2, torch.float8_e4m3fn, rowwise)
        wq, ws = _fp8_cast(w, torch.float8_e4m3fn, rowwise)
        y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t() if rowwise else ws, out_dtype=torch.bfloat16,
                             use_fast_accum=not rowwise)
        ctx.save_for_backward(x2, w)
        ctx.rowwise = rowwise
        ctx.x_shape = x.shape
        ctx.x_dtype = x.dtype
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2, w = ctx.saved_tensors
        rw = ctx.rowwise
        gd = torch.float8_e4m3fn if rw else torch.float8_e5m2
        dy2 = dy.reshape(-1, dy.shape[-1])
        # dx (m, k) = dy (m, n) w (n, k): w as a column-major (n, k), cast along n
        gq, gs = _fp8_cast(dy2, gd, rw)
        wtq, wts = _fp8_cast(w.t().contiguous(), torch.float8_e4m3fn, rw)
        dx = torch._scaled_mm(gq, wtq.t(), scale_a=gs, scale_b=wts.t() if rw else wts, out_dtype=torch.bfloat16)
        # dw (n, k) = dy^T (n, m) x (m, k): both cast along the tokens
        gtq, gts = _fp8_cast(dy2.t().contiguous(), gd, rw)
        xtq, xts = _fp8_cast(x2.t().contiguous(), torch.float8_e4m3fn, rw)
        dw = torch._scaled_mm(gtq, xtq.t(), scale_a=gts, scale_b=xts.t() if rw else xts, out_dtype=torch.bfloat16)
        return dx.reshape(ctx.x_shape).to(ctx.x_dtype), dw.to(w.dtype), None


class Fp8Linear(nn.Module):
    def __init__(self, lin, rowwise):
        super().__init__()
        self.weight = lin.weight
        self.bias = lin.bias
        self.rowwise = rowwise

    def forward(self, x):
        y = _Fp8Matmul.apply(x, self.weight, self.rowwise)
        return y + self.bias.to(y.dtype) if self.bias is not None else y


def to_fp8(model, recipe):
    """Every nn.Linear of the blocks (not the head) through _Fp8Matmul."""
    blocks = model.layers if hasattr(model, "layers") else model.blocks
    n = 0
    for block in blocks:
        for name, m in list(block.named_modules()):
            for cname, child in list(m.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(m, cname, Fp8Linear(child, recipe == "rowwise"))
                    n += 1
    return n


def build(s):
    if s["type"] == "llama":
        return Llama(s)
    from pytorch_gpt2 import GPT  # benchmarks/gpt2_124m: the GPT-2 peer's model
    if not s["bias"]:
        raise SystemExit("torch_peer.py: the GPT peer has biases (model.bias = true)")
    return GPT(vocab=s["vocab"], ctx=s["ctx"], layers=s["layers"], heads=s["heads"], d=s["width"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="the forge run config (TOML) to mirror")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--batch", type=int, required=True, help="sequences per step per GPU (rank)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: train.seq_len)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a small shape of the same family (smoke tests on a CPU)")
    for k in ("n_layer", "n_head", "n_kv_head", "n_embd", "dim", "ffn_hidden", "vocab_size", "block_size"):
        ap.add_argument("--" + k, type=int, default=None, help=f"override model.{k}")
    ap.add_argument("--sync-each-step", action="store_true",
                    help="read each step's loss at once (the device drains every step) instead of one step late")
    ap.add_argument("--tp", type=int, default=1,
                    help="tensor parallelism over the torchrun ranks (torch.distributed.tensor.parallel; LLaMA only): "
                         "every rank trains the same batch, each on its shard of every layer")
    ap.add_argument("--sp", action="store_true", help="with --tp: sequence parallelism (norms on sequence shards)")
    ap.add_argument("--fsdp", choices=["", "zero2", "zero3"], default="",
                    help="under torchrun: FSDP2 (fully_shard) instead of DDP; zero3 reshards after the forward")
    ap.add_argument("--checkpoint", action="store_true",
                    help="LLaMA: activation checkpointing of every block (torch.utils.checkpoint, non-reentrant), "
                         "as forge's model.checkpoint_activations")
    ap.add_argument("--ddp-hook", choices=["none", "bf16"], default="none",
                    help="DDP (several ranks): bf16 gradient compression (torch's bf16_compress_hook), forge's bf16 "
                         "reduction's like (issue 41: the second DDP row)")
    ap.add_argument("--fsdp-reduce", choices=["f32", "bf16"], default="f32",
                    help="FSDP2: MixedPrecisionPolicy reduce_dtype (forge reduces bf16 gradients in bf16)")
    ap.add_argument("--fp8", choices=["", "tensorwise", "rowwise"], default="",
                    help="the blocks' linears in FP8 through torch._scaled_mm (torchao's float8 recipes; one GPU)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    cfg = shapes.load_config(a.config)
    over = {k: getattr(a, k) for k in ("n_layer", "n_head", "n_kv_head", "n_embd", "dim", "ffn_hidden",
                                       "vocab_size", "block_size")}
    if a.tiny:
        tiny = {"n_layer": 2, "n_head": 4, "n_embd": 64, "dim": 64, "vocab_size": 512, "block_size": 64,
                "n_kv_head": 2 if cfg["model"].get("type") == "llama" else None, "ffn_hidden": 160}
        over = {k: (v if v is not None else tiny.get(k)) for k, v in over.items()}
    over["seq"] = a.seq or (min(64, int(cfg["train"]["seq_len"])) if a.tiny else None)
    s = shapes.model_shape(cfg, over)
    opt_cfg = cfg.get("optim", {})

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    tp = a.tp
    if tp > 1 and (tp != world or cfg["model"].get("type") != "llama"):
        raise SystemExit("torch_peer.py: --tp must equal the torchrun world size, for a LLaMA")
    if a.fsdp and (world == 1 or tp > 1):
        raise SystemExit("torch_peer.py: --fsdp needs torchrun with several ranks and no --tp")
    ddp = world > 1 and tp == 1 and not a.fsdp
    data_parallel = world > 1 and tp == 1  # each rank its own batch (DDP or FSDP)
    if world > 1 and a.device != "cpu":
        import torch.distributed as dist
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        dev = torch.device("cuda", local)
    elif world > 1:  # --device cpu under torchrun: gloo (a smoke test of this script)
        import torch.distributed as dist
        dist.init_process_group("gloo")
        dev = torch.device("cpu")
    else:
        dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    model = build(s).to(dev)
    if a.checkpoint:
        if s["type"] != "llama":
            raise SystemExit("torch_peer.py: --checkpoint is for a LLaMA")
        model.checkpoint_blocks = True
    n_params = sum(p.numel() for p in model.parameters())
    if a.fp8:
        if world > 1:
            raise SystemExit("torch_peer.py: --fp8 runs on one GPU")
        print(f"fp8: {to_fp8(model, a.fp8)} linears through torch._scaled_mm ({a.fp8})", flush=True)
    if tp > 1:
        model = tensor_parallel(model, tp, a.sp, dev)
    if a.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                  reduce_dtype=torch.bfloat16 if a.fsdp_reduce == "bf16" else torch.float32)
        blocks = model.layers if hasattr(model, "layers") else model.blocks
        for block in blocks:
            if a.mode == "compile":
                block.compile()  # in place: the module stays what fully_shard wraps
            fully_shard(block, mp_policy=mp, reshard_after_forward=a.fsdp == "zero3")
        fully_shard(model, mp_policy=mp, reshard_after_forward=a.fsdp == "zero3")
    want_total, want_matmul = shapes.param_count(s)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and n not in EMBEDDINGS]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and n not in EMBEDDINGS)]
    fused = {"fused": True} if cuda and tp == 1 else {}  # (DTensor parameters: the foreach AdamW)
    wd = float(opt_cfg.get("weight_decay", 0.1))
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    if tp > 1:  # the foreach AdamW cannot mix DTensors and the plain (replicated) norm weights in one group
        from torch.distributed.tensor import DTensor
        groups = [{"params": [p for p in g["params"] if isinstance(p, DTensor) == d], "weight_decay": g["weight_decay"]}
                  for g in groups for d in (True, False)]
        groups = [g for g in groups if g["params"]]
    opt = torch.optim.AdamW(groups,
                            lr=float(opt_cfg.get("lr", 6e-4)),
                            betas=(float(opt_cfg.get("beta1", 0.9)), float(opt_cfg.get("beta2", 0.95))),
                            eps=float(opt_cfg.get("eps", 1e-8)), **fused)
    clip = float(opt_cfg.get("grad_clip", 1.0))
    net = model
    if ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP
        net = DDP(model, device_ids=[dev.index] if cuda else None, bucket_cap_mb=25,
                  broadcast_buffers=False)  # forge broadcasts no buffers; 25 MB buckets as forge's
        if a.ddp_hook == "bf16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            net.register_comm_hook(None, default_hooks.bf16_compress_hook)
    if a.fsdp:
        step_fn = model  # blocks compiled above, before sharding
    elif a.mode == "compile" and tp > 1:
        # Each block compiled (as torchtitan compiles tensor-parallel models); the embedding, head
        # and the vocabulary-parallel loss run eagerly under loss_parallel().
        for i, block in enumerate(model.layers):
            model.layers[i] = torch.compile(block)
        step_fn = net
    else:
        step_fn = torch.compile(net) if a.mode == "compile" else net
    if rank == 0:
        print(f"torch_peer: {shapes.describe(s)}", flush=True)
        print(f"torch_peer: parameters: module {n_params:,}, forge's formula {want_total:,}"
              f"{'' if n_params == want_total else '  MISMATCH'}", flush=True)
    gen = torch.Generator(device=dev).manual_seed(1 + (0 if tp > 1 else rank))  # tp: one batch for the group
    amp = torch.autocast(dev.type, dtype=torch.bfloat16)

    def one_step():
        t = torch.randint(0, s["vocab"], (a.batch, s["seq"] + 1), device=dev, generator=gen)
        if tp > 1:  # the vocabulary-parallel cross-entropy (the logits stay sharded), forward and backward
            from torch.distributed.tensor.parallel import loss_parallel
            with loss_parallel():
                with amp:
                    loss = step_fn(t[:, :-1], t[:, 1:])
                loss.backward()
        else:
            with amp:
                loss = step_fn(t[:, :-1], t[:, 1:])
            loss.backward()
        if clip > 0 and tp > 1:
            clip_tensor_parallel(model, clip)
        elif clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.detach()
        if tp > 1 and hasattr(loss, "full_tensor"):
            loss = loss.full_tensor()
        if data_parallel:  # the mean loss over the ranks, for the host (forge's step does the same)
            dist.all_reduce(loss)
            loss /= world
        return loss

    # The host reads step i-1's loss after queuing step i (Note [deferred step read]).
    slots = [torch.zeros((), dtype=torch.float32, pin_memory=cuda) for _ in range(2)]
    events = [torch.cuda.Event() if cuda else None for _ in range(2)]
    times, last, warmup_s = [], None, None
    t_mark = time.perf_counter()
    t_start = t_mark

    def finish(i):
        nonlocal t_mark, last, warmup_s
        if cuda:
            events[i % 2].synchronize()
        last = slots[i % 2].item()
        now = time.perf_counter()
        if i >= a.warmup:
            times.append(now - t_mark)
        t_mark = now
        if i == a.warmup - 1:
            warmup_s = now - t_start
            if cuda:
                torch.cuda.reset_peak_memory_stats(dev)
            if rank == 0:
                print(f"torch_peer: warm-up ({a.warmup} steps) took {now - t_start:.1f} s", flush=True)

    pending = None
    total = a.warmup + a.steps
    for i in range(total):
        loss = one_step()
        slots[i % 2].copy_(loss, non_blocking=cuda)
        if cuda:
            events[i % 2].record()
        if a.sync_each_step:
            finish(i)
            continue
        if pending is not None:
            finish(pending)
        pending = i
    if pending is not None:
        finish(pending)

    ms = 1e3 * statistics.fmean(times)
    tokens_per_step = (1 if tp > 1 else world) * a.batch * s["seq"]
    out = {"peer": f"pytorch-{a.mode}" + ("-ddp" if ddp else "") + ("-bf16hook" if ddp and a.ddp_hook == "bf16" else "")
                   + ("-bf16reduce" if a.fsdp and a.fsdp_reduce == "bf16" else "") + (f"-fsdp2-{a.fsdp}" if a.fsdp else "") + (f"-tp{tp}" + ("-sp" if a.sp else "") if tp > 1 else ""), "torch": torch.__version__,
           "device": torch.cuda.get_device_name(dev) if cuda else "cpu", "world_size": world,
           "model": s["type"], "batch_per_gpu": a.batch, "seq": s["seq"], "steps": a.steps, "warmup": a.warmup,
           "params": n_params, "params_formula": want_total, "matmul_params_formula": want_matmul,
           "flops_per_token": shapes.flops_per_token(s), "ms_per_step": ms,
           "ms_per_step_median": 1e3 * statistics.median(times), "ms_per_step_min": 1e3 * min(times),
           "ms_per_step_p25": 1e3 * quantile(times, 0.25), "ms_per_step_p75": 1e3 * quantile(times, 0.75),
           "ddp_hook": a.ddp_hook if ddp else None, "fsdp_reduce": a.fsdp_reduce if a.fsdp else None,
           "tokens_per_s": tokens_per_step / (ms / 1e3),
           "peak_mem_bytes": torch.cuda.max_memory_allocated(dev) if cuda else None,
           "reserved_bytes": torch.cuda.max_memory_reserved(dev) if cuda else None,
           "last_loss": last, "sync_each_step": a.sync_each_step, "sdpa_enable_gqa": SDPA_HAS_GQA,
           "warmup_s": warmup_s}
    if rank == 0:
        print(json.dumps(out), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
