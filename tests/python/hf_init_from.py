#!/usr/bin/env python3
"""forge's model.init_from against Hugging Face transformers, on random small models.

    hf_init_from.py --forge-bin build/tests/forge_hf_init_from

For each model below, transformers builds it (random init, seed 0), saves it with
save_pretrained(max_shard_size=...) so that it is sharded (model-0000i-of-0000n.safetensors and
model.safetensors.index.json), and forge_hf_init_from resolves a config whose only model key is
model.init_from = that directory (shape from config.json), loads the weights through
train::load_init_from and writes the f32 logits of a fixed token batch and its first-step training
loss (the batch predicting itself shifted by one). Checks, for every model: ||forge - hf|| /
||hf|| <= 1e-4 for the logits, and |forge loss - hf loss| / hf loss <= 1e-5 against transformers'
own loss (labels = the batch).

  gpt2          GPT2LMHeadModel, 2 layers, 4 heads, 64 wide, vocabulary 1000, context 256,
                saved in bfloat16 (forge converts to f32; the reference runs the same bf16
                weights in f32)
  llama3        LlamaForCausalLM, 2 layers, 4 heads / 2 kv-heads, 64 wide, FFN 176, rope_theta
                500000 and LLaMA-3 rope_scaling (factor 8, low/high 1/4, original context 64:
                with head size 16 every band - unchanged, blended, divided - is present within
                the batch's 200 positions), tie_word_embeddings = true (no lm_head.weight)
  llama2        LlamaForCausalLM without rope_scaling, untied head, f32

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

VOCAB, B, T = 1000, 2, 200


def models():
    gpt2 = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=VOCAB, n_positions=256,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                                   activation_function="gelu_new")
    llama3 = transformers.LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                      max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=500000.0,
                                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 64},
                                      tie_word_embeddings=True)
    llama2 = transformers.LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, vocab_size=VOCAB,
                                      max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False)
    return [("gpt2", transformers.GPT2LMHeadModel, gpt2, torch.bfloat16),
            ("llama3", transformers.LlamaForCausalLM, llama3, torch.float32),
            ("llama2", transformers.LlamaForCausalLM, llama2, torch.float32)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--forge-bin", required=True)
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        sys.exit(SKIP)
    ok = True
    tokens = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as d:
        save_file({"idx": tokens.contiguous()}, os.path.join(d, "batch.safetensors"))
        for name, cls, cfg, dtype in models():
            torch.manual_seed(0)
            hf = cls(cfg).eval().to(dtype)
            mdir = os.path.join(d, name)
            hf.save_pretrained(mdir, safe_serialization=True, max_shard_size="100KB")
            sharded = os.path.exists(os.path.join(mdir, "model.safetensors.index.json"))
            out = os.path.join(d, name + "_forge.safetensors")
            r = subprocess.run([a.forge_bin, mdir, os.path.join(d, "batch.safetensors"), out, a.device],
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{name}: forge failed:\n{r.stdout}{r.stderr}")
                ok = False
                continue
            with torch.no_grad():
                on = tokens.to(a.device)
                res = hf.float().to(a.device)(on, labels=on)
                ref = res.logits.float().cpu()
                ref_loss = res.loss.float().item()
            f = load_file(out)
            got = f["logits"]
            rel = ((got - ref).norm() / ref.norm()).item()
            loss_rel = abs(f["loss"].item() - ref_loss) / abs(ref_loss)
            print(f"{name}: logits (f32, {a.device}, {'sharded' if sharded else 'one file'}, saved as {dtype}): "
                  f"relative error {rel:.2e} (limit 1e-4); first-step loss forge {f['loss'].item():.7f} "
                  f"transformers {ref_loss:.7f}, relative {loss_rel:.1e} (limit 1e-5)")
            ok &= rel <= 1e-4 and loss_rel <= 1e-5 and sharded
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
