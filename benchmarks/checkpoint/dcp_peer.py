#!/usr/bin/env python3
"""PyTorch DCP on the state forge checkpoints, on one GPU: dcp.save and dcp.async_save.

The state is built tensor for tensor as forge holds it for a LLaMA of the given shape (what
forge's checkpoint writes: bf16 parameters and, per parameter, f32 master weights and AdamW's
two moments; 14 bytes a parameter), on the GPU, filled with random values. No model runs: the
checkpoint's cost is a function of the tensors alone.

Timed, each REPEATS times (the first of each mode reported apart: it allocates):
  sync   dcp.save(state) until it returns (copy to the host and write).
  async  dcp.async_save(state) until it returns (the stall a training loop sees), and until its
         staging is complete where staging runs in the background (a training loop must wait for
         that before its next optimizer step), then until the write is done. Each save starts after
         the previous one is written and its directory removed (the disk holds one checkpoint).
The async mode is tuned as its documentation advises: pinned host memory for the staged copy,
reused between saves (DefaultStager(StagingOptions(use_pinned_memory=True, ...)) on recent
PyTorch; StorageWriter(cache_staged_state_dict=True) on older), a gloo process group of one for
DCP's coordination. Which API ran is in the output.

  python3 dcp_peer.py --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 --vocab 32000 \\
      --dir /tmp/dcp --repeats 3 --json out.json
"""
import argparse
import json
import os
import shutil
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp


def llama_shapes(dim, layers, heads, kv_heads, ffn, vocab):
    hd = dim // heads
    shapes = {"model.embed_tokens.weight": (vocab, dim), "model.norm.weight": (dim,), "lm_head.weight": (vocab, dim)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (dim,), p + "post_attention_layernorm.weight": (dim,),
            p + "self_attn.q_proj.weight": (heads * hd, dim), p + "self_attn.k_proj.weight": (kv_heads * hd, dim),
            p + "self_attn.v_proj.weight": (kv_heads * hd, dim), p + "self_attn.o_proj.weight": (dim, heads * hd),
            p + "mlp.gate_proj.weight": (ffn, dim), p + "mlp.up_proj.weight": (ffn, dim),
            p + "mlp.down_proj.weight": (dim, ffn)})
    return shapes


def make_state(shapes, device):
    g = torch.Generator(device=device).manual_seed(0)
    model, optim = {}, {}
    for name, s in shapes.items():
        model[name] = torch.randn(s, device=device, dtype=torch.bfloat16, generator=g)
        for k in ("master", "exp_avg", "exp_avg_sq"):
            optim[f"{k}.{name}"] = torch.randn(s, device=device, dtype=torch.float32, generator=g)
    return {"model": model, "optimizer": optim}


def nbytes(state):
    return sum(t.numel() * t.element_size() for part in state.values() for t in part.values())


def async_saver(path_of):
    """A function (step) -> (response, api name) for the best async_save this PyTorch has."""
    if os.environ.get("DCP_PLAIN") == "1":  # async_save as it comes (its default stager)
        return (lambda state, i: dcp.async_save(state, checkpoint_id=path_of(i))), "async_save (defaults)"
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        stager = DefaultStager(StagingOptions(use_pinned_memory=True, use_shared_memory=False,
                                              use_async_staging=True, use_non_blocking_copy=True))

        def save(state, i):
            return dcp.async_save(state, checkpoint_id=path_of(i), async_stager=stager)
        return save, "async_save + DefaultStager(pinned, async staging, non-blocking copy)"
    except (ImportError, TypeError):
        pass
    from torch.distributed.checkpoint import FileSystemWriter
    writers = {}

    def save(state, i):
        w = FileSystemWriter(path_of(i), cache_staged_state_dict=True)
        return dcp.async_save(state, storage_writer=w, checkpoint_id=path_of(i))
    return save, "async_save + FileSystemWriter(cache_staged_state_dict=True)"


def wait_staged(resp):
    """Blocks until the response's staging is complete (a no-op where async_save staged already)."""
    sc = getattr(resp, "staging_completion", None)
    if sc is not None:
        sc.result()


def wait_written(resp):
    uc = getattr(resp, "upload_completion", None)
    (uc if uc is not None else resp).result()


def main():
    ap = argparse.ArgumentParser()
    for k in ("dim", "layers", "heads", "kv-heads", "ffn", "vocab"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sync-repeats", type=int, default=None, help="dcp.save runs (default: --repeats)")
    ap.add_argument("--json", required=True)
    ap.add_argument("--modes", default="sync,async")
    a = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    dist.init_process_group("cpu:gloo,cuda:nccl", rank=0, world_size=1)
    dev = torch.device("cuda", 0)
    state = make_state(llama_shapes(a.dim, a.layers, a.heads, a.kv_heads, a.ffn, a.vocab), dev)
    torch.cuda.synchronize()
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "state_bytes": nbytes(state),
           "tensors": sum(len(p) for p in state.values()), "sync": [], "async": []}
    os.makedirs(a.dir, exist_ok=True)
    path_of = lambda i: os.path.join(a.dir, f"step_{i:04d}")

    def clear():
        for n in os.listdir(a.dir):
            shutil.rmtree(os.path.join(a.dir, n), ignore_errors=True)

    if "sync" in a.modes.split(","):
        for i in range(a.repeats if a.sync_repeats is None else a.sync_repeats):
            clear()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dcp.save(state, checkpoint_id=path_of(i))
            out["sync"].append({"stall_s": time.perf_counter() - t0})
            print(f"dcp sync {i}: {out['sync'][-1]['stall_s']:.3f} s", flush=True)
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    if "async" in a.modes.split(","):
        save, api = async_saver(path_of)
        out["async_api"] = api
        for i in range(a.repeats):
            clear()  # each save after the previous one's write (the disk holds one checkpoint)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            try:
                resp = save(state, i)
            except Exception as e:  # this PyTorch's DefaultStager refused the state: the older tuned path
                if i > 0 or "FileSystemWriter" in api:
                    raise
                out["async_api_error"] = repr(e)[:300]
                from torch.distributed.checkpoint import FileSystemWriter
                api = "async_save + FileSystemWriter(cache_staged_state_dict=True) (DefaultStager failed)"
                out["async_api"] = api
                save = lambda st, j: dcp.async_save(st, storage_writer=FileSystemWriter(path_of(j), cache_staged_state_dict=True),
                                                    checkpoint_id=path_of(j))
                clear()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                resp = save(state, i)
            t1 = time.perf_counter()
            wait_staged(resp)
            t2 = time.perf_counter()
            wait_written(resp)
            t3 = time.perf_counter()
            out["async"].append({"returned_s": t1 - t0, "staged_s": t2 - t0, "written_s": t3 - t0})
            print(f"dcp async {i}: returned {t1 - t0:.3f} s, staged {t2 - t0:.3f} s, written {t3 - t0:.3f} s", flush=True)
        clear()
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
