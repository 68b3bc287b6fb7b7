#!/usr/bin/env python3
"""forge's neural-network ops against torch.nn.functional, values and gradients in f64.

Run by CTest (test `nn_reference`) with Debian's PyTorch:

    /usr/bin/python3 tests/python/nn_reference.py --forge-bin build/tests/forge_nn_ref

Covers layer_norm (F.layer_norm), rms_norm (written out in torch: x * rsqrt(mean(x^2) + eps)
* w, as LLaMA), embedding (F.embedding, repeated ids, i32/i64), cross_entropy
(F.cross_entropy with ignore_index, mean/sum/none, (B, T, V) logits) and a tiny language
model built from them. dropout is not compared: torch draws its mask from another RNG
(tests/ops/test_nn_ops.cpp checks forge's mask against forge's Philox stream instead).

For every case this script makes f64 inputs (torch, seeded by the case name), computes the
outputs with torch, draws a random upstream gradient for every output that requires grad,
runs torch's backward, and writes inputs and upstream gradients to a file. The forge binary
(tests/python/forge_nn_ref.cpp) runs the case of the same name (forward, then one backward
from all outputs) and writes its outputs and the inputs' gradients. Each value and
gradient must satisfy ||forge - torch|| / ||torch|| <= 1e-10 and, elementwise,
|forge - torch| <= 1e-12 + 1e-10 |torch|, with NaN exactly where torch has NaN.

Prints one line per case (with its worst relative error) and `N passed, N failed`; exits
non-zero if any case failed. Nothing expected is stored: torch computes it at test time.

Exchange format (text; shared with forge_nn_ref.cpp, keep the two in step)
-------------------------------------------------------------------------
Whitespace-separated records:
  case <case>                                          a case to run, in order (inputs only)
  tensor <name> <dtype> <requires_grad> <ndim> <dims...>
  <numel values>                                       dtype f64 (repr decimals, nan, inf,
                                                       -inf), i64 or i32 (decimal)
  error <name> <nbytes>
  <nbytes bytes, then one newline>                     a case's exception (outputs only)
Names: `<case>/<input>`, `<case>/gout/<output>`; outputs `<case>/out/<output>`,
`<case>/grad/<input>`, `<case>/error`.
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile
import zlib

import torch
import torch.nn.functional as F

RTOL, ATOL, NORM_TOL = 1e-10, 1e-12, 1e-10
DTYPE_NAMES = {torch.float64: "f64", torch.int64: "i64", torch.int32: "i32"}

CASES = []  # (name, builder)


def case(name):
    def deco(builder):
        CASES.append((name, builder))
        return builder

    return deco


def randn(g, *shape):
    return torch.randn(shape, generator=g, dtype=torch.float64)


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def rms_norm(x, w, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


# ---------------------------------------------------------------------------- cases


@case("layer_norm_affine")
def _(g):
    ins = dict(x=leaf(randn(g, 6, 10) * 2 + 1), w=leaf(randn(g, 10)), b=leaf(randn(g, 10)))
    return ins, lambda t: dict(y=F.layer_norm(t["x"], (10,), t["w"], t["b"], 1e-5))


@case("layer_norm_3d_plain")
def _(g):
    ins = dict(x=leaf(randn(g, 2, 3, 8)))
    return ins, lambda t: dict(y=F.layer_norm(t["x"], (8,)))


@case("layer_norm_weight_only_transposed")
def _(g):
    ins = dict(x=leaf(randn(g, 12, 5)), w=leaf(randn(g, 12)))  # forge normalises x.t(): (5, 12)
    return ins, lambda t: dict(y=F.layer_norm(t["x"].t(), (12,), t["w"], None, 1e-3))


@case("layer_norm_bias_only_offset")
def _(g):
    ins = dict(x=leaf(randn(g, 4, 16)), b=leaf(randn(g, 16)))
    return ins, lambda t: dict(y=F.layer_norm(t["x"] + 100.0, (16,), None, t["b"], 1e-5))


@case("rms_norm_weight")
def _(g):
    ins = dict(x=leaf(randn(g, 2, 5, 16)), w=leaf(randn(g, 16)))
    return ins, lambda t: dict(y=rms_norm(t["x"], t["w"], 1e-6))


@case("rms_norm_plain_strided")
def _(g):
    ins = dict(x=leaf(randn(g, 3, 18)))  # forge normalises x[:, ::2]: (3, 9)
    return ins, lambda t: dict(y=rms_norm(t["x"][:, ::2], None, 1e-5))


@case("embedding_repeats")
def _(g):
    ids = torch.tensor([[1, 7, 1, 9], [0, 1, 7, 3], [9, 9, 2, 1]], dtype=torch.int64)
    ins = dict(weight=leaf(randn(g, 10, 6)), ids=ids)
    return ins, lambda t: dict(out=F.embedding(t["ids"], t["weight"]))


@case("embedding_i32_transposed")
def _(g):
    ids = torch.randint(0, 8, (20,), generator=g).to(torch.int32)
    ins = dict(weight=leaf(randn(g, 5, 8)), ids=ids)  # forge looks up rows of weight.t(): (8, 5)
    return ins, lambda t: dict(out=F.embedding(t["ids"].long(), t["weight"].t()))


def _targets(g, n, v, ignored):
    t = torch.randint(0, v, (n,), generator=g)
    for i in ignored:
        t[i] = -100
    return t


@case("cross_entropy_reductions")
def _(g):
    ins = dict(logits=leaf(randn(g, 12, 7) * 2), targets=_targets(g, 12, 7, [2, 5, 11]))

    def forward(t):
        lg, tg = t["logits"], t["targets"]
        return dict(mean=F.cross_entropy(lg, tg, ignore_index=-100),
                    sum=F.cross_entropy(lg, tg, ignore_index=-100, reduction="sum"),
                    none=F.cross_entropy(lg, tg, ignore_index=-100, reduction="none"))

    return ins, forward


@case("cross_entropy_3d")
def _(g):
    ins = dict(logits=leaf(randn(g, 2, 4, 11)), targets=_targets(g, 8, 11, [0, 6]).reshape(2, 4).to(torch.int32))

    def forward(t):
        # forge takes the class dim last; torch's (N, C, d1) layout puts it at dim 1.
        lg, tg = t["logits"].transpose(1, 2), t["targets"].long()
        return dict(mean=F.cross_entropy(lg, tg), none=F.cross_entropy(lg, tg, reduction="none"))

    return ins, forward


@case("cross_entropy_custom_ignore")
def _(g):
    tg = torch.tensor([3, 0, 3, 5, 1, 3, 2], dtype=torch.int64)  # class 3 is ignored
    ins = dict(logits=leaf(randn(g, 7, 6)), targets=tg)
    return ins, lambda t: dict(mean=F.cross_entropy(t["logits"], t["targets"], ignore_index=3))


@case("cross_entropy_large_logits")
def _(g):
    ins = dict(logits=leaf(randn(g, 5, 9)), targets=torch.randint(0, 9, (5,), generator=g))
    return ins, lambda t: dict(mean=F.cross_entropy(t["logits"] * 200.0, t["targets"]))


@case("cross_entropy_all_ignored")
def _(g):
    ins = dict(logits=leaf(randn(g, 3, 4)), targets=torch.full((3,), -100, dtype=torch.int64))

    def forward(t):
        return dict(mean=F.cross_entropy(t["logits"], t["targets"]),
                    sum=F.cross_entropy(t["logits"], t["targets"], reduction="sum"))

    return ins, forward


@case("tiny_lm")
def _(g):
    B, T, C, V, H = 2, 5, 8, 13, 16
    idx = torch.randint(0, V, (B, T), generator=g)
    targets = torch.cat([idx[:, 1:], torch.full((B, 1), -100, dtype=torch.int64)], 1)  # next token, last ignored
    ins = dict(wte=leaf(randn(g, V, C) * 0.5), wpe=leaf(randn(g, T, C) * 0.1), idx=idx, targets=targets,
               rms_w=leaf(1 + 0.1 * randn(g, C)), w1=leaf(randn(g, C, H) / math.sqrt(C)),
               w2=leaf(randn(g, H, C) / math.sqrt(H)), ln_w=leaf(1 + 0.1 * randn(g, C)), ln_b=leaf(0.1 * randn(g, C)))

    def forward(t):
        h = F.embedding(t["idx"], t["wte"]) + F.embedding(torch.arange(T), t["wpe"])
        a = rms_norm(h, t["rms_w"], 1e-6)
        h = h + F.gelu(a @ t["w1"], approximate="tanh") @ t["w2"]
        f = F.layer_norm(h, (C,), t["ln_w"], t["ln_b"], 1e-5)
        logits = f @ t["wte"].t()
        return dict(logits=logits, loss=F.cross_entropy(logits.reshape(-1, V), t["targets"].reshape(-1)))

    return ins, forward


# ---------------------------------------------------------------------------- exchange


def write_tensor(f, name, t):
    requires_grad = int(t.requires_grad)
    t = t.detach()
    dims = list(t.shape)
    f.write(f"tensor {name} {DTYPE_NAMES[t.dtype]} {requires_grad} {len(dims)} {' '.join(map(str, dims))}\n")
    if t.dtype == torch.float64:
        vals = [repr(float(v)) for v in t.reshape(-1).tolist()]
    else:
        vals = [str(int(v)) for v in t.reshape(-1).tolist()]
    for i in range(0, len(vals), 8):
        f.write(" ".join(vals[i : i + 8]) + "\n")


def read_outputs(path):
    """Returns {name: torch.Tensor (f64 or i64) or str (an error message)}."""
    with open(path, "rb") as fh:
        data = fh.read()
    pos, n, out = 0, len(data), {}

    def token():
        nonlocal pos
        while pos < n and data[pos] in b" \t\r\n":
            pos += 1
        start = pos
        while pos < n and data[pos] not in b" \t\r\n":
            pos += 1
        if start == pos:
            raise ValueError(f"{path}: unexpected end of file")
        return data[start:pos].decode()

    while True:
        while pos < n and data[pos] in b" \t\r\n":
            pos += 1
        if pos >= n:
            return out
        kind = token()
        if kind == "error":
            name, nbytes = token(), int(token())
            pos += 1
            out[name] = data[pos : pos + nbytes].decode()
            pos += nbytes
        elif kind == "tensor":
            name, dt, _rg, ndim = token(), token(), token(), int(token())
            shape = [int(token()) for _ in range(ndim)]
            toks = [token() for _ in range(math.prod(shape))]
            if dt == "f64":
                out[name] = torch.tensor([float(x) for x in toks], dtype=torch.float64).reshape(shape)
            else:
                out[name] = torch.tensor([int(x) for x in toks], dtype=torch.int64).reshape(shape)
        else:
            raise ValueError(f"{path}: unknown record kind {kind!r}")


# ---------------------------------------------------------------------------- driver


def build_expected(selected):
    built = []
    for name, builder in selected:
        g = torch.Generator()
        g.manual_seed(zlib.crc32(name.encode()))
        ins, forward = builder(g)
        outs = forward(ins)
        gouts = {k: torch.randn(o.shape, generator=g, dtype=o.dtype) for k, o in outs.items() if o.requires_grad}
        if gouts:
            torch.autograd.backward([outs[k] for k in gouts], list(gouts.values()))
        grads = {k: v.grad for k, v in ins.items() if v.requires_grad}
        built.append((name, ins, outs, gouts, grads))
    return built


def compare(got, want):
    """Returns (problem or None, relative error)."""
    if not isinstance(got, torch.Tensor):
        return "forge wrote no tensor", None
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {list(got.shape)} != torch's {list(want.shape)}", None
    want = want.detach().double()
    gn, wn = torch.isnan(got), torch.isnan(want)
    if not torch.equal(gn, wn):
        bad = (gn != wn).nonzero()[0].tolist()
        return f"NaN mismatch at {bad}: {got[tuple(bad)].item()} vs {want[tuple(bad)].item()}", None
    ok = ~wn
    d = (got[ok] - want[ok]).norm().item()
    ref = want[ok].norm().item()
    rel = d / ref if ref > 0 else d
    close = torch.isclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True)
    if rel > NORM_TOL or not bool(close.all()):
        bad = (~close).nonzero()
        where = f", first bad element {bad[0].tolist()}: {got[tuple(bad[0])].item()!r} vs " \
                f"{want[tuple(bad[0])].item()!r}" if len(bad) else ""
        return f"relative error {rel:.3e} (tolerance {NORM_TOL:g}){where}", rel
    return None, rel


def check_case(name, outs, grads, got):
    err = got.get(f"{name}/error")
    if err is not None:
        return [f"forge threw: {err.strip()}"], None
    problems, worst = [], 0.0
    expected = [(f"out/{k}", v) for k, v in outs.items()] + [(f"grad/{k}", v) for k, v in grads.items()]
    for key, want in expected:
        have = got.get(f"{name}/{key}")
        if want is None:
            if isinstance(have, torch.Tensor) and bool((have != 0).any()):
                problems.append(f"{key}: torch has no gradient, forge has a nonzero one")
            continue
        if have is None:
            problems.append(f"{key}: missing from forge's output")
            continue
        problem, rel = compare(have, want)
        if problem:
            problems.append(f"{key}: {problem}")
        if rel is not None:
            worst = max(worst, rel)
    return problems, worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--forge-bin", required=True, help="path of the forge_nn_ref executable")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--keep", help="directory to keep the exchange files in")
    args = ap.parse_args()

    selected = CASES
    if args.cases:
        wanted = args.cases.split(",")
        unknown = sorted(set(wanted) - {n for n, _ in CASES})
        if unknown:
            sys.exit(f"unknown case(s): {', '.join(unknown)}; known: {', '.join(n for n, _ in CASES)}")
        selected = [c for c in CASES if c[0] in wanted]

    torch.set_default_dtype(torch.float64)
    print(f"torch {torch.__version__}, forge binary {args.forge_bin}")
    built = build_expected(selected)
    with tempfile.TemporaryDirectory(prefix="forge_nn_ref.") as tmp:
        workdir = args.keep or tmp
        os.makedirs(workdir, exist_ok=True)
        in_path, out_path = os.path.join(workdir, "inputs.txt"), os.path.join(workdir, "outputs.txt")
        with open(in_path, "w") as f:
            for name, ins, _outs, gouts, _grads in built:
                f.write(f"case {name}\n")
                for iname, t in ins.items():
                    write_tensor(f, f"{name}/{iname}", t)
                for oname, t in gouts.items():
                    write_tensor(f, f"{name}/gout/{oname}", t)
        try:
            proc = subprocess.run([args.forge_bin, in_path, out_path], capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"could not run {args.forge_bin}: {e}")
            print(f"0 passed, {len(built)} failed")
            return 1
        if proc.returncode != 0:
            print(f"forge_nn_ref exited with status {proc.returncode}:\n{proc.stderr[-4000:]}")
        try:
            got = read_outputs(out_path) if os.path.exists(out_path) else {}
        except ValueError as e:
            print(f"could not read forge's outputs: {e}")
            got = {}

    passed = failed = 0
    for name, _ins, outs, _gouts, grads in built:
        problems, worst = check_case(name, outs, grads, got)
        if problems:
            failed += 1
            print(f"FAIL  {name}")
            for p in problems:
                print(f"      {p}")
        else:
            passed += 1
            print(f"ok    {name}  (worst relative error {worst:.2e})")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
