#!/usr/bin/env python3
"""forge's attention, rope, conv2d and max_pool2d against PyTorch, values and gradients in f64.

Run by CTest (test `attention_reference`) with Debian's PyTorch:

    /usr/bin/python3 tests/python/attention_reference.py --forge-bin build/tests/forge_attention_ref

Each case below makes f64 inputs (fixed seed per case), computes the outputs with torch,
draws a random upstream gradient for every output, runs torch's backward, and writes the
inputs, the case's parameters and the upstream gradients to a file. The forge binary
(tests/python/forge_attention_ref.cpp) runs the same op with the same parameters (forward,
then backward from the upstream gradients) and writes its outputs and input gradients. This
script compares them: ||forge - torch|| / ||torch|| <= 1e-10 and elementwise
allclose(rtol=1e-10, atol=1e-12), for every output and every gradient.

Torch 1.13 has no F.scaled_dot_product_attention, so the reference attention is written out
in torch ops: kv heads repeated with repeat_interleave (GQA), scores scaled, a boolean mask
and/or the bottom-right causal mask (tril(diagonal=S - T)) applied, softmax, times v. Rows
with no allowed key are set to zero, forge's documented convention (torch would give NaN).
rope is Hugging Face's apply_rotary_pos_emb (x * cos + rotate_half(x) * sin); conv2d and
max_pool2d are torch.nn.functional's.

Exchange format (text, ASCII; shared with forge_attention_ref.cpp, keep the two in step; it
is the format of torch_reference.py, restricted to f64/i64/bool tensors and strings)
-------------------------------------------------------------------------------------------
  case <case>
      (inputs file only) a case to run, in file order; <case> is <kind>.<label>, where kind
      (sdpa, rope, conv2d, max_pool2d, rope_sdpa, cnn) selects the forge code.
  tensor <name> <dtype> <requires_grad> <ndim> <d0> ... <d{ndim-1}>
  <numel values>
      dtype: f64 (Python repr / C "%.17g" decimals, exact), i64, bool (0 or 1).
  string <name> <nbytes>
  <exactly nbytes bytes, then one newline>

Names: `<case>/<input>` (leaves with requires_grad 1 get gradients), `<case>/params` (an f64
vector, its meaning per kind in PARAMS below), `<case>/gout/<output>`; forge writes
`<case>/out/<output>`, `<case>/grad/<input>` and, when the case threw, `<case>/error`.
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

# The meaning of each kind's params vector (forge_attention_ref.cpp reads them in this order).
PARAMS = {
    "sdpa": ["causal", "scale", "q_is_btHd"],  # q_is_btHd: q given as (B, T, H, D), permuted
    "rope": ["offset", "theta", "x_is_btHd"],
    "conv2d": ["sh", "sw", "ph", "pw", "x_is_nhwc"],
    "max_pool2d": ["kh", "kw", "sh", "sw", "ph", "pw"],
    "rope_sdpa": ["offset", "theta", "causal"],  # rope on q and k, then attention
    "cnn": [],  # conv2d(pad 1) -> relu -> max_pool2d(2) -> conv2d(stride 2, pad 1)
}

# ---------------------------------------------------------------------------- torch side


def ref_sdpa(q, k, v, causal, scale, mask=None):
    B, H, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    k = k.repeat_interleave(H // Hkv, dim=1)
    v = v.repeat_interleave(H // Hkv, dim=1)
    c = scale if scale != 0 else 1.0 / math.sqrt(D)
    s = (q @ k.transpose(-1, -2)) * c
    allowed = torch.ones(T, S, dtype=torch.bool)
    if causal:
        allowed = allowed.tril(diagonal=S - T)  # key j <= t + (S - T): bottom-right
    allowed = allowed.expand(B, H, T, S)
    if mask is not None:
        allowed = allowed & mask.expand(B, H, T, S)
    dead = ~allowed.any(-1, keepdim=True)  # rows with no key: zeros (forge's convention)
    p = torch.softmax(s.masked_fill(~(allowed | dead), float("-inf")), -1)
    return p.masked_fill(dead, 0.0) @ v


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def ref_rope(x, offset, theta):
    T, D = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    pos = torch.arange(offset, offset + T, dtype=torch.float64)
    emb = torch.cat((torch.outer(pos, inv_freq),) * 2, dim=-1)  # (T, D)
    return x * emb.cos() + rotate_half(x) * emb.sin()


def forward(kind, t, p):
    """The torch computation of a case: {output name: tensor}."""
    if kind == "sdpa":
        q = t["q"].permute(0, 2, 1, 3) if p[2] else t["q"]
        return {"out": ref_sdpa(q, t["k"], t["v"], bool(p[0]), p[1], t.get("mask"))}
    if kind == "rope":
        x = t["x"].permute(0, 2, 1, 3) if p[2] else t["x"]
        return {"out": ref_rope(x, int(p[0]), p[1])}
    if kind == "conv2d":
        x = t["x"].permute(0, 3, 1, 2) if p[4] else t["x"]
        return {"out": F.conv2d(x, t["w"], t.get("b"), stride=(int(p[0]), int(p[1])), padding=(int(p[2]), int(p[3])))}
    if kind == "max_pool2d":
        ip = [int(v) for v in p]
        return {"out": F.max_pool2d(t["x"], (ip[0], ip[1]), (ip[2], ip[3]), (ip[4], ip[5]))}
    if kind == "rope_sdpa":
        q, k = ref_rope(t["q"], int(p[0]), p[1]), ref_rope(t["k"], int(p[0]), p[1])
        return {"q_rot": q, "out": ref_sdpa(q, k, t["v"], bool(p[2]), 0.0)}
    if kind == "cnn":
        h = F.max_pool2d(torch.relu(F.conv2d(t["x"], t["w1"], t["b1"], padding=1)), 2)
        return {"pooled": h, "out": F.conv2d(h, t["w2"], t["b2"], stride=2, padding=1)}
    raise ValueError(f"unknown kind {kind}")


# ---------------------------------------------------------------------------- cases

CASES = []  # (name, inputs builder(g) -> {name: tensor}, params)


def randn(g, *shape):
    return torch.randn(shape, generator=g, dtype=torch.float64)


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def case(name, params, make):
    kind = name.split(".")[0]
    assert kind in PARAMS and len(params) == len(PARAMS[kind]), name
    CASES.append((name, make, [float(v) for v in params]))


def qkv(B, H, Hkv, T, S, D, mask_shape=None, q_btHd=False):
    def make(g):
        q = randn(g, B, T, H, D) if q_btHd else randn(g, B, H, T, D)
        ins = dict(q=leaf(q), k=leaf(randn(g, B, Hkv, S, D)), v=leaf(randn(g, B, Hkv, S, D)))
        if mask_shape is not None:
            m = torch.rand(mask_shape, generator=g) > 0.35
            if len(mask_shape) >= 2 and mask_shape[-2] > 1:
                m[..., 1, :] = False  # one query row sees no key at all
            ins["mask"] = m
        return ins

    return make


case("sdpa.causal_mha", [1, 0, 0], qkv(2, 3, 3, 5, 5, 4))
case("sdpa.noncausal_T_ne_S", [0, 0, 0], qkv(2, 2, 2, 4, 6, 3))
case("sdpa.gqa_h4_kv2_causal", [1, 0, 0], qkv(2, 4, 2, 6, 6, 4))
case("sdpa.mqa_h4_kv1_causal_bottom_right", [1, 0, 0], qkv(1, 4, 1, 3, 7, 5))
case("sdpa.causal_T_gt_S_rows_without_keys", [1, 0, 0], qkv(1, 2, 1, 5, 3, 3))
case("sdpa.mask_TS_gqa", [0, 0, 0], qkv(2, 4, 2, 5, 6, 3, mask_shape=(5, 6)))
case("sdpa.mask_and_causal_scale", [1, 0.3, 0], qkv(1, 4, 2, 6, 6, 3, mask_shape=(6, 6)))
case("sdpa.padding_mask_B11S", [0, 0, 0], qkv(2, 2, 2, 3, 5, 4, mask_shape=(2, 1, 1, 5)))
case("sdpa.noncontiguous_q_btHd", [1, 0, 1], qkv(2, 4, 2, 5, 5, 3, q_btHd=True))
case("sdpa.two_query_blocks_gqa", [1, 0, 0], qkv(1, 4, 2, 80, 80, 8))

case("rope.basic", [0, 10000.0, 0], lambda g: dict(x=leaf(randn(g, 2, 3, 5, 8))))
case("rope.offset_theta_noncontiguous", [7, 500.0, 1], lambda g: dict(x=leaf(randn(g, 2, 6, 3, 6))))


def conv_inputs(x, w, bias):
    def make(g):
        ins = dict(x=leaf(randn(g, *x)), w=leaf(randn(g, *w) / math.sqrt(w[1] * w[2] * w[3])))
        if bias:
            ins["b"] = leaf(randn(g, w[0]))
        return ins

    return make


case("conv2d.stride2_pad1_bias", [2, 2, 1, 1, 0], conv_inputs((2, 3, 7, 7), (4, 3, 3, 3), True))
case("conv2d.no_bias_rect_kernel", [1, 2, 0, 1, 0], conv_inputs((2, 2, 5, 8), (3, 2, 2, 3), False))
case("conv2d.one_by_one", [1, 1, 0, 0, 0], conv_inputs((3, 4, 4, 4), (5, 4, 1, 1), True))
case("conv2d.nhwc_input", [2, 1, 1, 0, 1], conv_inputs((2, 6, 5, 3), (2, 3, 3, 2), True))

case("max_pool2d.k2", [2, 2, 2, 2, 0, 0], lambda g: dict(x=leaf(randn(g, 2, 3, 6, 6))))
case("max_pool2d.k3_s2_p1", [3, 3, 2, 2, 1, 1], lambda g: dict(x=leaf(randn(g, 2, 2, 7, 8))))
case("max_pool2d.rect_overlapping", [2, 3, 1, 2, 1, 1], lambda g: dict(x=leaf(randn(g, 1, 3, 5, 7))))

case("rope_sdpa.llama_style_gqa", [3, 10000.0, 1],
     lambda g: dict(q=leaf(randn(g, 2, 4, 6, 8)), k=leaf(randn(g, 2, 2, 6, 8)), v=leaf(randn(g, 2, 2, 6, 8))))
case("cnn.conv_relu_pool_conv", [],
     lambda g: dict(x=leaf(randn(g, 2, 3, 8, 8)), w1=leaf(randn(g, 4, 3, 3, 3) / 5), b1=leaf(randn(g, 4)),
                    w2=leaf(randn(g, 6, 4, 3, 3) / 6), b2=leaf(randn(g, 6))))

# ---------------------------------------------------------------------------- exchange

DTYPE_NAMES = {torch.float64: "f64", torch.int64: "i64", torch.bool: "bool"}


def write_tensor(f, name, t, requires_grad=False):
    t = t.detach()
    dims = list(t.shape)
    f.write(f"tensor {name} {DTYPE_NAMES[t.dtype]} {int(requires_grad)} {len(dims)} {' '.join(map(str, dims))}\n")
    flat = t.reshape(-1).tolist()
    vals = [repr(float(v)) for v in flat] if t.dtype == torch.float64 else [str(int(v)) for v in flat]
    for i in range(0, len(vals), 16):
        f.write(" ".join(vals[i : i + 16]) + "\n")


def read_records(path):
    """{name: tensor (f64) or str} from forge's outputs file."""
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
        if kind == "string":
            name, nbytes = token(), int(token())
            pos += 1
            out[name] = data[pos : pos + nbytes].decode()
            pos += nbytes
        elif kind == "tensor":
            name, dt, _rg, ndim = token(), token(), token(), int(token())
            if dt != "f64":
                raise ValueError(f"{path}: {name} has dtype {dt}, expected f64")
            shape = [int(token()) for _ in range(ndim)]
            out[name] = torch.tensor([float(token()) for _ in range(math.prod(shape))], dtype=torch.float64).reshape(shape)
        else:
            raise ValueError(f"{path}: unknown record kind {kind!r}")


# ---------------------------------------------------------------------------- driver


def build_expected(selected):
    """Runs torch: [(name, inputs, params, outputs, upstream grads, input grads)]."""
    built = []
    for name, make, params in selected:
        g = torch.Generator()
        g.manual_seed(zlib.crc32(name.encode()))
        ins = make(g)
        outs = forward(name.split(".")[0], ins, params)
        gouts = {k: torch.randn(o.shape, generator=g, dtype=o.dtype) for k, o in outs.items()}
        torch.autograd.backward(list(outs.values()), list(gouts.values()))
        grads = {k: t.grad for k, t in ins.items() if t.requires_grad}
        built.append((name, ins, params, outs, gouts, grads))
    return built


def write_inputs(path, built):
    with open(path, "w") as f:
        for name, ins, params, _outs, gouts, _grads in built:
            f.write(f"case {name}\n")
            write_tensor(f, f"{name}/params", torch.tensor(params, dtype=torch.float64))
            for k, t in ins.items():
                write_tensor(f, f"{name}/{k}", t, requires_grad=t.requires_grad)
            for k, t in gouts.items():
                write_tensor(f, f"{name}/gout/{k}", t)


def compare(got, want):
    """(ok, detail, relative error)."""
    if not isinstance(got, torch.Tensor):
        return False, "forge wrote no tensor", None
    if tuple(got.shape) != tuple(want.shape):
        return False, f"shape {list(got.shape)} != torch's {list(want.shape)}", None
    want = want.detach()
    if not bool(torch.isfinite(want).all()):
        return False, "torch's reference is not finite (a bug in the case)", None
    d, ref = (got - want).norm().item(), want.norm().item()
    rel = d / ref if ref > 0 else d
    close = torch.isclose(got, want, rtol=RTOL, atol=ATOL)
    if rel > NORM_TOL or not bool(close.all()):
        bad = (~close).nonzero()
        where = f", first bad element {bad[0].tolist()}: {got[tuple(bad[0])].item()!r} vs " \
                f"{want[tuple(bad[0])].item()!r}" if len(bad) else ""
        return False, f"relative error {rel:.3e} (tolerance {NORM_TOL:g}){where}", rel
    return True, "", rel


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--forge-bin", required=True, help="path of the forge_attention_ref executable")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--keep", help="directory to keep the exchange files in")
    args = ap.parse_args()

    selected = CASES
    if args.cases:
        wanted = args.cases.split(",")
        unknown = sorted(set(wanted) - {c[0] for c in CASES})
        if unknown:
            sys.exit(f"unknown case(s): {', '.join(unknown)}; known: {', '.join(c[0] for c in CASES)}")
        selected = [c for c in CASES if c[0] in wanted]

    print(f"torch {torch.__version__}, forge binary {args.forge_bin}")
    built = build_expected(selected)
    with tempfile.TemporaryDirectory(prefix="forge_attention_ref.") as tmp:
        workdir = args.keep or tmp
        os.makedirs(workdir, exist_ok=True)
        in_path, out_path = os.path.join(workdir, "inputs.txt"), os.path.join(workdir, "outputs.txt")
        write_inputs(in_path, built)
        try:
            proc = subprocess.run([args.forge_bin, in_path, out_path], capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"could not run {args.forge_bin}: {e}")
            print(f"0 passed, {len(built)} failed")
            return 1
        crashed = proc.returncode != 0
        try:
            got = read_records(out_path) if os.path.exists(out_path) else {}
        except ValueError as e:
            print(f"could not read forge's outputs: {e}")
            got, crashed = {}, True
        if crashed:
            print(f"forge_attention_ref exited with status {proc.returncode}:\n{proc.stderr[-4000:]}")

    passed = failed = 0
    for name, _ins, _params, outs, _gouts, grads in built:
        problems, worst = [], 0.0
        if f"{name}/error" in got:
            problems.append(f"forge threw: {got[name + '/error'].strip()}")
        else:
            expected = [(f"out/{k}", v) for k, v in outs.items()] + [(f"grad/{k}", v) for k, v in grads.items()]
            for key, want in expected:
                ok, detail, rel = compare(got.get(f"{name}/{key}"), want)
                if not ok:
                    problems.append(f"{key}: {detail}")
                else:
                    worst = max(worst, rel)
        if problems:
            failed += 1
            print(f"FAIL  {name}: " + "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""))
        else:
            passed += 1
            print(f"ok    {name} ({len(outs) + len(grads)} outputs/gradients, max rel err {worst:.1e})")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or crashed else 0


if __name__ == "__main__":
    sys.exit(main())
