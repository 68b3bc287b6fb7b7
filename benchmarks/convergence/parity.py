#!/usr/bin/env python3
"""forge's training against PyTorch's, step for step, on real text, on the CPU in f32: a check that
an optimizer or gradient mistake cannot pass (a CTest test: convergence_parity).

    python3 parity.py --forge build/forge [--work DIR] [--steps 30]

1. A corpus of real text: Debian's fortunes (the `fortunes` package) through GPT-2's tokenizer
   (forge tokenize encode): files a-l for training, s-z for validation.
2. The initial weights (init_weights.py --tiny: a 2-layer, 64-wide GPT-2 with GPT-2's vocabulary).
3. forge train from them (model.init_from), f32 on the CPU, data.order = sequential, data.val_files,
   a learning rate high enough (1e-2, warmup 5, cosine to 1e-3) that every step moves every weight,
   weight decay 0.1, clipping at 1.0; then forge export of the final checkpoint.
4. reference.py: the same run in PyTorch (the peer's model, torch.optim.AdamW, clip_grad_norm_).
5. The comparison: every step's loss and gradient norm, every validation loss, and every final
   parameter (forge export's tensors against PyTorch's under the same names), each within its
   tolerance; and a negative control: the same comparison against a PyTorch run with one mistake
   (weight decay on the embeddings too) must fail, so the tolerances are tight enough to catch it.
Exit status 0 when all holds, 1 otherwise; the figures are printed either way.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from safetensors_np import load_safetensors  # noqa: E402
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "step"))
sys.path.insert(0, os.path.join(HERE, "..", "gpt2_124m"))
import init_weights  # noqa: E402
import torch_peer  # noqa: E402

# Tolerances (f32 on the CPU, 30 steps at lr 2e-3; measured worst on 2026-12-06 beside each). The
# negative control (weight decay on the embeddings too) moved the loss by 3.4e-4 and the embeddings
# by 3.4e-3: a mistake of that size cannot pass.
LOSS_RTOL = 2e-5        # every step's training loss, every validation loss (measured: 1.3e-6)
NORM_RTOL = 2e-3        # every step's gradient norm, before clipping (measured: 5.2e-4)
PARAM_TOL = 3e-4        # every final parameter: |forge - torch| / |torch| (Frobenius norms) of each tensor


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"parity.py: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


def read_safetensors(path):
    try:
        return load_safetensors(path, dtypes={"F32"})
    except ValueError as e:
        sys.exit(f"parity.py: {e}")


def jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def compare(forge_metrics, ref_metrics, forge_weights, ref_final):
    """(problems, figures): every disagreement beyond the tolerances, and the worst of each kind."""
    f = {(r["step"], k): r[k] for r in jsonl(forge_metrics) if "step" in r and not r.get("final")
         for k in ("loss", "grad_norm", "val_loss") if k in r}
    for r in jsonl(forge_metrics):  # the last validation is in the final record
        if r.get("final") and "val_loss" in r:
            f[(r["step"], "val_loss")] = r["val_loss"]
    g = {(r["step"], k): r[k] for r in jsonl(ref_metrics) if "step" in r for k in ("loss", "grad_norm", "val_loss")
         if k in r}
    problems, worst = [], {"loss": 0.0, "grad_norm": 0.0, "val_loss": 0.0, "param": 0.0}
    for key, rv in sorted(g.items()):
        if key not in f:
            problems.append(f"forge has no {key[1]} at step {key[0]}")
            continue
        rel = abs(f[key] - rv) / max(abs(rv), 1e-12)
        worst[key[1]] = max(worst[key[1]], rel)
        tol = NORM_RTOL if key[1] == "grad_norm" else LOSS_RTOL
        if rel > tol:
            problems.append(f"step {key[0]} {key[1]}: forge {f[key]:.8g}, PyTorch {rv:.8g} (relative {rel:.2e} > {tol})")
    state = torch.load(ref_final, map_location="cpu")
    model = torch_peer.build(state["shape"])
    model.load_state_dict(state["state_dict"])
    ref = init_weights.hf_tensors(model, state["shape"])
    mine = read_safetensors(forge_weights)
    for name, t in sorted(ref.items()):
        if name not in mine:
            problems.append(f"forge export has no {name}")
            continue
        a, b = mine[name], t.numpy()
        if a.shape != b.shape:
            problems.append(f"{name}: forge {a.shape}, PyTorch {b.shape}")
            continue
        if name.endswith("attn.c_attn.bias"):
            # The key projection's bias has no gradient (q . b_k is the same for every key: the
            # softmax does not see it); both sides' float noise there, which Adam turns into steps
            # of the learning rate's size, differs by nature. The query and value parts are compared.
            d = b.shape[0] // 3
            a, b = np.concatenate([a[:d], a[2 * d:]]), np.concatenate([b[:d], b[2 * d:]])
        rel = float(np.linalg.norm((a - b).ravel()) / max(np.linalg.norm(b.ravel()), 1e-12))
        worst["param"] = max(worst["param"], rel)
        if rel > PARAM_TOL:
            problems.append(f"final {name}: |forge - PyTorch| / |PyTorch| = {rel:.2e} > {PARAM_TOL}")
    return problems, worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--forge", required=True)
    ap.add_argument("--work", default="")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--fortunes", default="/usr/share/games/fortunes")
    ap.add_argument("--tokenizer", default=os.environ.get("FORGE_TOKENIZER_FIXTURES", os.path.join(REPO, ".fixtures",
                                                                                                   "tokenizers"))
                    + "/gpt2/tokenizer.json")
    a = ap.parse_args()
    forge = os.path.abspath(a.forge)
    for need, fix in ((a.tokenizer, "scripts/fetch-tokenizer-fixtures.sh"), (a.fortunes, "apt install fortunes")):
        if not os.path.exists(need):
            sys.exit(f"parity.py: {need} is missing ({fix})")
    work = a.work or tempfile.mkdtemp(prefix="forge_parity_")
    os.makedirs(work, exist_ok=True)
    try:
        corpus = os.path.join(work, "corpus")
        for split, pattern in (("train", "[a-l]*"), ("val", "[s-z]*")):
            files = sorted(p for p in glob.glob(os.path.join(a.fortunes, pattern))
                           if os.path.isfile(p) and not os.path.islink(p) and not p.endswith((".dat", ".u8")))
            run([forge, "tokenize", "encode", "--tokenizer", a.tokenizer, "--out", os.path.join(corpus, split)] + files)
        init = os.path.join(work, "init")
        config = os.path.join(REPO, "configs", "gpt2-124m.toml")
        run([sys.executable, os.path.join(HERE, "init_weights.py"), "--config", config, "--out", init, "--tiny",
             "--vocab_size", "50304", "--tokenizer", a.tokenizer])
        train, val = os.path.join(corpus, "train", "shard_*.bin"), os.path.join(corpus, "val", "shard_*.bin")
        common = dict(steps=a.steps, batch=4, seq=32, warmup=5, lr=a.lr, min_lr=a.lr / 10, every=10, batches=4)
        run([forge, "train", config, f"--model.init_from={init}", "--model.n_layer=2", "--model.n_head=4",
             "--model.n_embd=64", "--model.block_size=64", "--run.device=cpu", "--run.dtype=f32",
             "--data.source=files", f"--data.files={train}", f"--data.val_files={val}", "--data.order=sequential",
             f"--train.steps={common['steps']}", f"--train.batch_size={common['batch']}",
             f"--train.seq_len={common['seq']}", "--train.log_every=1", f"--schedule.warmup_steps={common['warmup']}",
             f"--optim.lr={common['lr']}", f"--schedule.min_lr={common['min_lr']}", f"--eval.every={common['every']}",
             f"--eval.batches={common['batches']}", "--eval.bigram_baseline=false", "--checkpoint.every=0",
             "--checkpoint.at_end=true", f"--run.dir={work}", "--run.name=forge", "--run.overwrite=true"])
        export = os.path.join(work, "export")
        shutil.rmtree(export, ignore_errors=True)
        run([forge, "export", "--checkpoint", os.path.join(work, "forge"), "--out", export, "--dtype", "f32"])
        results = {}
        for name, extra in (("reference", []), ("mistake", ["--decay-embeddings"])):
            out, final = os.path.join(work, f"{name}.jsonl"), os.path.join(work, f"{name}.pt")
            run([sys.executable, os.path.join(HERE, "reference.py"), "--config", config, "--init", init,
                 "--train", train, "--val", val, "--steps", str(common["steps"]), "--batch", str(common["batch"]),
                 "--seq", str(common["seq"]), "--warmup", str(common["warmup"]), "--lr", str(common["lr"]),
                 "--min-lr", str(common["min_lr"]), "--eval-every", str(common["every"]), "--eval-batches",
                 str(common["batches"]), "--mode", "eager", "--device", "cpu", "--out", out, "--save-final", final]
                + extra)
            results[name] = compare(os.path.join(work, "forge", "metrics.jsonl"), out,
                                    os.path.join(export, "model.safetensors"), final)
        problems, worst = results["reference"]
        caught, caught_worst = results["mistake"]
        print(f"parity: {a.steps} steps of 4 x 32 tokens of real text, f32 on the CPU; worst relative differences: "
              f"loss {worst['loss']:.2e} (tolerance {LOSS_RTOL}), validation loss {worst['val_loss']:.2e}, "
              f"gradient norm {worst['grad_norm']:.2e} (tolerance {NORM_RTOL}), final parameters {worst['param']:.2e} "
              f"(tolerance {PARAM_TOL})")
        print(f"parity: negative control (weight decay on the embeddings too): {len(caught)} disagreement(s), worst "
              f"final parameter {caught_worst['param']:.2e}, worst loss {caught_worst['loss']:.2e}")
        for p in problems[:20]:
            print("  " + p)
        ok = not problems and bool(caught)
        if not caught:
            print("parity: the negative control passed the comparison: the tolerances are too loose to catch a mistake")
        print("parity: " + ("PASS" if ok else "FAIL"))
        return 0 if ok else 1
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
