#!/usr/bin/env python3
"""forge's GPT and LLaMA against the same models written in plain PyTorch, in f32.

Run by CTest (test `model_reference`) with Debian's PyTorch:

    /usr/bin/python3 tests/python/model_reference.py --forge-bin build/tests/forge_model_ref

The forge driver (tests/python/forge_model_ref.cpp, which documents the files) builds a GPT
(GPT-2 layout) and a LLaMA with fixed seeds, writes their weights and a batch as safetensors,
and then, on a model loaded back from those files, writes the logits, the loss and every
parameter's gradient, and the losses and final weights of 10 AdamW steps on that batch.

This script reads the files (safetensors_check.py's reader: standard library + numpy), rebuilds
each model in plain torch from the weights (nothing of forge's; the config comes from the
weights file's metadata), and checks, printing one line per check with the worst error:

  <m>.names          the weights file holds exactly the parameters of the torch model, under
                     nanoGPT / Hugging Face names, with the same shapes
  <m>.logits         ||forge - torch|| / ||torch||           <= 1e-5
  <m>.loss           |forge - torch| / |torch|                <= 1e-5
  <m>.grads          every parameter's gradient, by norm     <= 1e-5 (the worst is printed)
  <m>.decay_groups   forge's decay_groups split = this script's rule (>= 2-D and not an
                     embedding table: decay 0.1; everything else 0)
  <m>.adamw_losses   the loss before each of the 10 torch.optim.AdamW steps  <= 1e-5 each
  <m>.adamw_params   every parameter after the 10 steps, by norm             <= 1e-4
                     (GPT's key biases excepted; they are checked by gpt.key_bias)
  gpt.key_bias       the key third of each attn.c_attn.bias. Its exact gradient is zero at
                     every step (adding q . b_k to every score of a row leaves the softmax
                     unchanged), so what both sides compute is rounding noise (~1e-10) and what
                     AdamW makes of it, lr * g / (|g| + eps) with |g| << eps, is noise too, not
                     comparable between implementations. Checked instead: the gradient is at
                     rounding level (<= 1e-6 of the whole bias gradient) in forge and torch, and
                     after the steps every key bias is within 0.1 * steps * lr of its start (0)
                     in both -- a tenth of what Adam moves a weight with a real gradient.

The torch models, written out op by op:
  GPT-2: wte[idx] + wpe[:T]; per block x += c_proj(attn(ln_1(x))), x += mlp(ln_2(x)) with
         LayerNorm (biased variance, eps 1e-5), causal attention by explicit softmax over
         q k^T / sqrt(D) with -inf above the diagonal, MLP c_proj(gelu_tanh(c_fc(h))); ln_f;
         logits = x wte^T (tied head: wte's gradient collects both uses).
  LLaMA: embed_tokens[idx]; per block x += o_proj(attn(rms(x))), x += down(silu(gate(h)) *
         up(h)) with RMSNorm (x / sqrt(mean(x^2) + eps) * w), rotary embeddings on q and k in
         Hugging Face's rotate_half layout (theta 10000), kv heads repeated with
         repeat_interleave (GQA); final RMSNorm; untied lm_head.
  loss: torch.nn.functional.cross_entropy over (B*T, V).
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_check import parse_safetensors  # noqa: E402 (the spec-following reader)

TOL_FORWARD = 1e-5  # logits, loss, gradients, per-step losses
TOL_PARAMS = 1e-4  # parameters after the AdamW steps
EMBEDDING_TABLES = {"transformer.wte.weight", "transformer.wpe.weight", "model.embed_tokens.weight"}


# ------------------------------------------------------------------------------ files

def read_file(path):
    """-> (dict name -> torch tensor (a copy), metadata dict, names in file order)."""
    with open(path, "rb") as f:
        tensors, metadata, _ = parse_safetensors(f.read())
    out = {}
    for name, dtype, _shape, arr in tensors:
        if dtype not in ("F32", "I64"):
            raise ValueError("%s: tensor %s has dtype %s, expected F32 or I64" % (path, name, dtype))
        out[name] = torch.from_numpy(np.array(arr, copy=True))
    return out, metadata, [t[0] for t in tensors]


# ------------------------------------------------------------------------------ torch models

def linear(x, w, b=None):
    y = x @ w.t()
    return y + b if b is not None else y


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def causal_attention(q, k, v):
    """q (B, H, T, D), k and v (B, H, T, D) -> (B, H, T, D)."""
    T, D = q.shape[2], q.shape[3]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x, theta):
    """x (B, H, T, D): Hugging Face's apply_rotary_pos_emb at positions 0..T-1."""
    T, D = x.shape[2], x.shape[3]
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)  # (T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, D)
    return x * emb.cos() + rotate_half(x) * emb.sin()


class GPT2:
    def __init__(self, meta):
        self.V, self.block = int(meta["vocab_size"]), int(meta["block_size"])
        self.L, self.H, self.C = int(meta["n_layer"]), int(meta["n_head"]), int(meta["n_embd"])
        self.eps = float(meta["layer_norm_eps"])

    def shapes(self):
        """nanoGPT's named_parameters() (the tied lm_head is wte and listed once)."""
        C = self.C
        out = [("transformer.wte.weight", (self.V, C)), ("transformer.wpe.weight", (self.block, C))]
        for i in range(self.L):
            p = "transformer.h.%d." % i
            out += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
                    (p + "attn.c_attn.weight", (3 * C, C)), (p + "attn.c_attn.bias", (3 * C,)),
                    (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
                    (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
                    (p + "mlp.c_fc.weight", (4 * C, C)), (p + "mlp.c_fc.bias", (4 * C,)),
                    (p + "mlp.c_proj.weight", (C, 4 * C)), (p + "mlp.c_proj.bias", (C,))]
        return out + [("transformer.ln_f.weight", (C,)), ("transformer.ln_f.bias", (C,))]

    def forward(self, P, idx):
        B, T = idx.shape
        H, C = self.H, self.C
        D = C // H
        x = P["transformer.wte.weight"][idx] + P["transformer.wpe.weight"][:T]
        for i in range(self.L):
            p = "transformer.h.%d." % i
            h = layer_norm(x, P[p + "ln_1.weight"], P[p + "ln_1.bias"], self.eps)
            q, k, v = linear(h, P[p + "attn.c_attn.weight"], P[p + "attn.c_attn.bias"]).split(C, dim=-1)
            q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
            y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
            x = x + linear(y, P[p + "attn.c_proj.weight"], P[p + "attn.c_proj.bias"])
            h = layer_norm(x, P[p + "ln_2.weight"], P[p + "ln_2.bias"], self.eps)
            h = gelu_tanh(linear(h, P[p + "mlp.c_fc.weight"], P[p + "mlp.c_fc.bias"]))
            x = x + linear(h, P[p + "mlp.c_proj.weight"], P[p + "mlp.c_proj.bias"])
        x = layer_norm(x, P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], self.eps)
        return x @ P["transformer.wte.weight"].t()


class Llama:
    def __init__(self, meta):
        self.V, self.L = int(meta["vocab_size"]), int(meta["n_layer"])
        self.H, self.Hkv = int(meta["n_head"]), int(meta["n_kv_head"])
        self.C, self.F = int(meta["dim"]), int(meta["ffn_hidden"])
        self.eps, self.theta = float(meta["norm_eps"]), float(meta["rope_theta"])

    def shapes(self):
        """Hugging Face LlamaForCausalLM's named_parameters()."""
        C, F_, kv = self.C, self.F, self.Hkv * (self.C // self.H)
        out = [("model.embed_tokens.weight", (self.V, C))]
        for i in range(self.L):
            p = "model.layers.%d." % i
            out += [(p + "self_attn.q_proj.weight", (C, C)), (p + "self_attn.k_proj.weight", (kv, C)),
                    (p + "self_attn.v_proj.weight", (kv, C)), (p + "self_attn.o_proj.weight", (C, C)),
                    (p + "mlp.gate_proj.weight", (F_, C)), (p + "mlp.up_proj.weight", (F_, C)),
                    (p + "mlp.down_proj.weight", (C, F_)),
                    (p + "input_layernorm.weight", (C,)), (p + "post_attention_layernorm.weight", (C,))]
        return out + [("model.norm.weight", (C,)), ("lm_head.weight", (self.V, C))]

    def forward(self, P, idx):
        B, T = idx.shape
        H, Hkv, C = self.H, self.Hkv, self.C
        D = C // H
        x = P["model.embed_tokens.weight"][idx]
        for i in range(self.L):
            p = "model.layers.%d." % i
            h = rms_norm(x, P[p + "input_layernorm.weight"], self.eps)
            q = linear(h, P[p + "self_attn.q_proj.weight"]).view(B, T, H, D).transpose(1, 2)
            k = linear(h, P[p + "self_attn.k_proj.weight"]).view(B, T, Hkv, D).transpose(1, 2)
            v = linear(h, P[p + "self_attn.v_proj.weight"]).view(B, T, Hkv, D).transpose(1, 2)
            q, k = rope(q, self.theta), rope(k, self.theta)
            k = k.repeat_interleave(H // Hkv, dim=1)
            v = v.repeat_interleave(H // Hkv, dim=1)
            y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
            x = x + linear(y, P[p + "self_attn.o_proj.weight"])
            h = rms_norm(x, P[p + "post_attention_layernorm.weight"], self.eps)
            h = F.silu(linear(h, P[p + "mlp.gate_proj.weight"])) * linear(h, P[p + "mlp.up_proj.weight"])
            x = x + linear(h, P[p + "mlp.down_proj.weight"])
        x = rms_norm(x, P["model.norm.weight"], self.eps)
        return linear(x, P["lm_head.weight"])


MODELS = {"gpt": GPT2, "llama": Llama}


def loss_of(model, P, idx, targets):
    logits = model.forward(P, idx)
    return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ------------------------------------------------------------------------------ checks

def rel(a, b):
    """||a - b|| / ||b|| in f64 (0 when both are zero)."""
    a, b = a.double(), b.double()
    den = b.norm().item()
    num = (a - b).norm().item()
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


class Checker:
    def __init__(self):
        self.passed, self.failed = 0, 0

    def check(self, name, fn):
        try:
            detail = fn()
        except Exception as e:  # noqa: BLE001 - every failure is reported, then the next check runs
            self.failed += 1
            print("FAIL %-20s %s: %s" % (name, type(e).__name__, e))
        else:
            self.passed += 1
            print("ok   %-20s %s" % (name, detail or ""))
        sys.stdout.flush()


def worst(pairs, tol, what):
    """pairs: list of (name, rel error). Raises if any exceeds tol; returns a summary."""
    bad = [(n, r) for n, r in pairs if not r <= tol]
    name, err = max(pairs, key=lambda p: p[1])
    if bad:
        raise AssertionError("%d of %d %s above %g: %s" % (len(bad), len(pairs), what, tol,
                                                           ", ".join("%s %.3g" % p for p in bad[:6])))
    return "max rel %.3g over %d %s (%s), tol %g" % (err, len(pairs), what, name, tol)


def zero_gradient_slices(kind, model, name):
    """Parts of a parameter whose exact gradient is zero: (start, end) along dim 0."""
    if kind == "gpt" and name.endswith(".attn.c_attn.bias"):
        return [(model.C, 2 * model.C)]  # the key bias (c_attn's outputs are q | k | v)
    return []


def without(t, slices):
    """t with the given dim-0 ranges removed (flattened)."""
    keep = torch.ones(t.shape[0], dtype=torch.bool)
    for a, b in slices:
        keep[a:b] = False
    return t[keep].reshape(-1)


def check_model(c, workdir, kind):
    path = lambda suffix: os.path.join(workdir, "%s.%s.safetensors" % (kind, suffix))  # noqa: E731
    weights, meta, order = read_file(path("weights"))
    batch, _, _ = read_file(path("batch"))
    grads_file, _, _ = read_file(path("grad"))
    train, train_meta, _ = read_file(path("train"))
    assert meta.get("model") == kind, meta
    model = MODELS[kind](meta)
    idx, targets = batch["idx"], batch["targets"]
    print("---- %s: %s; batch %s" % (kind, ", ".join("%s=%s" % kv for kv in sorted(meta.items()) if kv[0] != "model"),
                                    tuple(idx.shape)))

    def names():
        want = model.shapes()
        got = [(n, tuple(weights[n].shape)) for n in order]
        assert [n for n, _ in got] == [n for n, _ in want], "forge %r\ntorch %r" % (got, want)
        assert got == want, "shapes: forge %r, torch %r" % (got, want)
        return "%d parameters, %d values" % (len(want), sum(weights[n].numel() for n, _ in want))
    c.check(kind + ".names", names)

    def leaves(values):
        return {n: values[n].clone().requires_grad_(True) for n, _ in model.shapes()}

    P = leaves(weights)
    logits, loss = loss_of(model, P, idx, targets)
    loss.backward()
    first_grads = {n: P[n].grad for n, _ in model.shapes()}

    def logits_check():
        err = rel(grads_file["logits"], logits.detach())
        assert err <= TOL_FORWARD, "rel %.3g > %g" % (err, TOL_FORWARD)
        return "rel %.3g, tol %g" % (err, TOL_FORWARD)
    c.check(kind + ".logits", logits_check)

    def loss_check():
        f, t = grads_file["loss"].item(), loss.item()
        err = abs(f - t) / abs(t)
        assert err <= TOL_FORWARD, "forge %.9g torch %.9g: rel %.3g" % (f, t, err)
        return "forge %.7f torch %.7f (log V = %.4f): rel %.3g, tol %g" % (f, t, math.log(model.V), err, TOL_FORWARD)
    c.check(kind + ".loss", loss_check)

    def grads_check():
        pairs = []
        for n, _ in model.shapes():
            g = P[n].grad
            assert g is not None and g.norm().item() > 0, "torch gives %s no gradient" % n
            pairs.append((n, rel(grads_file["grad." + n], g)))
        return worst(pairs, TOL_FORWARD, "gradients")
    c.check(kind + ".grads", grads_check)

    hp = {k: float(train_meta[k]) for k in ("lr", "beta1", "beta2", "eps", "weight_decay", "steps")}
    decay = [n for n, shape in model.shapes() if len(shape) >= 2 and n not in EMBEDDING_TABLES]
    no_decay = [n for n, _ in model.shapes() if n not in decay]

    def decay_check():
        got_decay = [n for n in train_meta["decay"].split(",") if n]
        got_no_decay = [n for n in train_meta["no_decay"].split(",") if n]
        assert sorted(got_decay) == sorted(decay), "forge decays %r, expected %r" % (got_decay, decay)
        assert sorted(got_no_decay) == sorted(no_decay), "forge does not decay %r, expected %r" % (
            got_no_decay, no_decay)
        return "%d decayed (wd %g), %d not" % (len(decay), hp["weight_decay"], len(no_decay))
    c.check(kind + ".decay_groups", decay_check)

    # 10 AdamW steps from the initial weights, on the same batch.
    P = leaves(weights)
    opt = torch.optim.AdamW([{"params": [P[n] for n in decay], "weight_decay": hp["weight_decay"]},
                             {"params": [P[n] for n in no_decay], "weight_decay": 0.0}],
                            lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"])
    losses = []
    for _ in range(int(hp["steps"])):
        opt.zero_grad()
        _, loss = loss_of(model, P, idx, targets)
        losses.append(loss.item())
        loss.backward()
        opt.step()

    def losses_check():
        f = train["losses"].double().tolist()
        assert len(f) == len(losses), (len(f), len(losses))
        pairs = [("step %d" % i, abs(a - b) / abs(b)) for i, (a, b) in enumerate(zip(f, losses))]
        summary = worst(pairs, TOL_FORWARD, "step losses")
        assert losses[-1] < losses[0] - 0.01, "torch's loss did not fall: %r" % losses
        return "%s; loss %.4f -> %.4f" % (summary, losses[0], losses[-1])
    c.check(kind + ".adamw_losses", losses_check)

    def params_check():
        pairs = []
        for n, _ in model.shapes():
            moved = rel(P[n].detach(), weights[n])
            assert moved > 0, "%s did not change in torch" % n
            zero = zero_gradient_slices(kind, model, n)
            label = n + (" (less its zero-gradient part)" if zero else "")
            pairs.append((label, rel(without(train["param." + n], zero), without(P[n].detach(), zero))))
        return worst(pairs, TOL_PARAMS, "parameters")
    c.check(kind + ".adamw_params", params_check)

    def key_bias_check():
        bound = 0.1 * hp["steps"] * hp["lr"]
        lines = []
        for n, _ in model.shapes():
            for a, b in zero_gradient_slices(kind, model, n):
                g_forge, g_torch = grads_file["grad." + n], first_grads[n]
                for who, g in (("forge", g_forge), ("torch", g_torch)):
                    r = g[a:b].norm().item() / g.norm().item()
                    assert r <= 1e-6, "%s: %s's key-bias gradient is %.3g of the bias gradient" % (n, who, r)
                for who, p in (("forge", train["param." + n]), ("torch", P[n].detach())):
                    d = (p[a:b] - weights[n][a:b]).abs().max().item()
                    assert d <= bound, "%s: %s moved a key bias by %.3g > %.3g" % (n, who, d, bound)
                lines.append("%s: |g| %.2g/%.2g of the bias gradient, max |moved| %.2g/%.2g (bound %g)" % (
                    n.replace("transformer.", ""),
                    g_forge[a:b].norm().item() / g_forge.norm().item(),
                    g_torch[a:b].norm().item() / g_torch.norm().item(),
                    (train["param." + n][a:b] - weights[n][a:b]).abs().max().item(),
                    (P[n].detach()[a:b] - weights[n][a:b]).abs().max().item(), bound))
        return "forge/torch: " + "; ".join(lines)
    if any(zero_gradient_slices(kind, model, n) for n, _ in model.shapes()):
        c.check(kind + ".key_bias", key_bias_check)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forge-bin", required=True, help="path to forge_model_ref")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))  # tiny models: more threads only contend
    print("torch %s, numpy %s" % (torch.__version__, np.__version__))
    c = Checker()
    with tempfile.TemporaryDirectory(prefix="forge_model_ref_") as workdir:
        r = subprocess.run([os.path.abspath(args.forge_bin), workdir], capture_output=True, text=True)
        if r.returncode != 0:
            print("FAIL forge_model_ref exited %d\n%s%s" % (r.returncode, r.stdout, r.stderr))
            print("0 passed, 1 failed")
            return 1
        for kind in ("gpt", "llama"):
            try:
                check_model(c, workdir, kind)
            except Exception as e:  # noqa: BLE001 - a model whose files cannot be read fails as a whole
                c.failed += 1
                print("FAIL %-20s %s: %s" % (kind, type(e).__name__, e))
    print("%d passed, %d failed" % (c.passed, c.failed))
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
