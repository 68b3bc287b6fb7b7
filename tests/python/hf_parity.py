#!/usr/bin/env python3
"""forge against Hugging Face transformers on a randomly initialised GPT2LMHeadModel.

    hf_parity.py --forge-bin build/tests/forge_hf_parity

1. transformers builds a GPT2LMHeadModel (random init, seed 0; 4 layers, 4 heads, 256 wide,
   vocabulary 50257, context 256; dropout off) and saves it with save_pretrained (safetensors,
   HF names, Conv1D layout); 20 random batches of 4 x 128 tokens are saved beside it.
2. forge_hf_parity loads the file by its tensor names (io::gpt2_from_hf), computes batch 0's
   logits in f32, then trains 20 AdamW steps in bf16 (one batch per step) on the GPU
   (the CPU when none is visible).
3. Checks: logits within 1e-4 relative (||forge - hf|| / ||hf||) in f32; every training loss
   within 1% of PyTorch's for the same 20 steps in bf16 (f32 parameters under
   torch.autocast(bfloat16), AdamW with forge's weight-decay groups).
Exits 77 (CTest: skipped) when transformers is missing or, on a machine meant to have a GPU,
none is visible; 0 when every check holds, 1 otherwise.
"""
import argparse
import os
import subprocess
import sys
import tempfile

SKIP = 77

try:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
except ImportError as e:  # Debian's python3-torch has no transformers: that machine cannot run this check
    print(f"SKIPPED: {e}")
    sys.exit(SKIP)

N_LAYER, N_HEAD, N_EMBD, VOCAB, CTX = 4, 4, 256, 50257, 256
STEPS, B, T = 20, 4, 128
LR, WD = 1e-3, 0.1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--forge-bin", required=True)
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    dev = a.device
    if dev.startswith("cuda") and not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        sys.exit(SKIP)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_EMBD, vocab_size=VOCAB, n_positions=CTX,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                                  activation_function="gelu_new")
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d, safe_serialization=True)
        tokens = torch.randint(0, VOCAB, (STEPS, B, T + 1), generator=torch.Generator().manual_seed(1))
        save_file({"idx": tokens[:, :, :-1].contiguous(), "targets": tokens[:, :, 1:].contiguous()},
                  os.path.join(d, "batches.safetensors"))
        r = subprocess.run([a.forge_bin, d, dev, str(N_LAYER), str(N_HEAD), str(N_EMBD), str(VOCAB), str(CTX), str(LR),
                            str(WD)], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout, r.stderr)
            sys.exit(1)
        out = load_file(os.path.join(d, "forge.safetensors"))
        from safetensors import safe_open
        with safe_open(os.path.join(d, "forge.safetensors"), "pt") as f:
            decay = set(f.metadata()["decay"].split(","))

    ok = True
    hf = hf.to(dev)
    with torch.no_grad():
        ref = hf(tokens[0, :, :-1].to(dev)).logits.float().cpu()
    rel = ((out["logits"] - ref).norm() / ref.norm()).item()
    print(f"logits (f32, {dev}): relative error {rel:.2e} (limit 1e-4)")
    ok &= rel <= 1e-4

    hf.train()
    named = dict(hf.named_parameters())  # the tied lm_head.weight is transformer.wte.weight
    dec = [p for n, p in named.items() if n in decay]
    nodec = [p for n, p in named.items() if n not in decay]
    missing = decay - set(named)
    if missing:
        print(f"forge's decayed names unknown to transformers: {sorted(missing)[:5]}")
        ok = False
    opt = torch.optim.AdamW([{"params": dec, "weight_decay": WD}, {"params": nodec, "weight_decay": 0.0}], lr=LR,
                            betas=(0.9, 0.95), eps=1e-8)
    worst = 0.0
    for s in range(STEPS):
        x, y = tokens[s, :, :-1].to(dev), tokens[s, :, 1:].to(dev)
        with torch.autocast(device_type="cuda" if dev.startswith("cuda") else "cpu", dtype=torch.bfloat16):
            logits = hf(x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, VOCAB), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        f = out["losses"][s].item()
        rel_l = abs(f - loss.item()) / abs(loss.item())
        worst = max(worst, rel_l)
        print(f"step {s + 1:2d}: loss forge {f:.4f}  pytorch {loss.item():.4f}  rel {rel_l:.2e}")
    print(f"bf16 training losses: worst relative difference {worst:.2e} (limit 1e-2)")
    ok &= worst <= 1e-2
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
