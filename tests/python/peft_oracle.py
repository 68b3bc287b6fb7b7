#!/usr/bin/env python3
"""forge's LoRA against Hugging Face PEFT (issue 40): an adapter forge trains loads in PEFT and gives
forge's logits.

    peft_oracle.py --forge build/forge --init-from-bin build/tests/forge_hf_init_from [--device cuda:0]

For each base below, transformers builds it (random init, seed 0, f32) and saves it; forge trains
LoRA adapters on it (model.init_from = that directory, random tokens, 20 AdamW steps at lr 1e-2 so
that B moves well away from zero), then `forge export` writes the PEFT adapter and `forge export
--merge` the merged model. Checks, for every base:
  1. PEFT loads the adapter: PeftModel.from_pretrained(base, adapter) and its logits on a fixed
     batch against forge's logits of the same weights (forge_hf_init_from on the merged export:
     forge's forward; tests/nn/test_lora.cpp holds the merged forward equal to the LoRA forward
     to 1e-12): ||forge - peft|| / ||peft|| <= 1e-4;
  2. PEFT's own merge (merge_and_unload) against forge's --merge weights, tensor by tensor:
     max |diff| / max |peft| <= 1e-5.
  gpt2     GPT2LMHeadModel, 2 layers, 4 heads, width 64 (Conv1D: fan_in_fan_out), targets c_attn,
           c_proj, c_fc
  llama3   LlamaForCausalLM, 2 layers, 4 heads / 2 kv-heads, width 64, untied head, every target
Exits 77 (skipped) without transformers and peft, 0 when every check holds, 1 otherwise.
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
    import peft
    from safetensors.torch import load_file, save_file
except ImportError as e:
    print(f"SKIPPED: {e}")
    sys.exit(SKIP)

VOCAB, B, T = 512, 2, 48


def bases():
    gpt2 = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=VOCAB, n_positions=128,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                                   activation_function="gelu_new")
    llama = transformers.LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                     max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False)
    return [("gpt2", transformers.GPT2LMHeadModel, gpt2, "c_attn,c_proj,c_fc"),
            ("llama3", transformers.LlamaForCausalLM, llama, "q,k,v,o,gate,up,down")]


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--forge", required=True)
    ap.add_argument("--init-from-bin", required=True)
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--keep", default="", help="a directory to keep the models in (default: a temporary one)")
    a = ap.parse_args()
    ok = True
    tokens = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as tmp:
        d = a.keep or tmp
        os.makedirs(d, exist_ok=True)
        empty = os.path.join(d, "empty.toml")
        open(empty, "w").write("# every key on the command line\n")
        save_file({"idx": tokens.contiguous()}, os.path.join(d, "batch.safetensors"))
        for name, cls, cfg, targets in bases():
            torch.manual_seed(0)
            base_dir, run_dir = os.path.join(d, "base_" + name), os.path.join(d, "runs")
            cls(cfg).eval().save_pretrained(base_dir, safe_serialization=True)
            dev = "cuda" if a.device.startswith("cuda") else "cpu"
            run([a.forge, "train", empty, f"--model.init_from={base_dir}", "--data.source=random",
                 f"--lora.targets={targets}", "--lora.rank=4", "--lora.alpha=8", "--train.steps=20",
                 "--train.batch_size=4", "--train.seq_len=32", "--optim.lr=1e-2", "--run.dtype=f32",
                 f"--run.device={dev}", f"--run.dir={run_dir}", f"--run.name=lora_{name}", "--run.overwrite=true",
                 "--eval.every=0", "--train.log_every=10"])
            adapter, merged = os.path.join(d, "adapter_" + name), os.path.join(d, "merged_" + name)
            run([a.forge, "export", "--checkpoint", os.path.join(run_dir, "lora_" + name), "--out", adapter, "--force"])
            run([a.forge, "export", "--checkpoint", os.path.join(run_dir, "lora_" + name), "--out", merged, "--merge",
                 "--force"])
            out = os.path.join(d, name + "_forge.safetensors")
            run([a.init_from_bin, merged, os.path.join(d, "batch.safetensors"), out, a.device])
            base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
            model = peft.PeftModel.from_pretrained(base, adapter).eval().to(a.device)
            with torch.no_grad():
                ref = model(tokens.to(a.device)).logits.float().cpu()
            got = load_file(out)["logits"]
            rel = ((got - ref).norm() / ref.norm()).item()
            # How far the adapters moved the model (a check that would pass with B = 0 proves nothing).
            with torch.no_grad(), model.disable_adapter():
                plain = model(tokens.to(a.device)).logits.float().cpu()
            moved = ((ref - plain).norm() / ref.norm()).item()
            merged_ref = model.merge_and_unload().state_dict()
            mine = {}
            for f in os.listdir(merged):
                if f.endswith(".safetensors"):
                    mine.update(load_file(os.path.join(merged, f)))
            worst, worst_name = 0.0, ""
            for k, v in merged_ref.items():
                if k not in mine:
                    continue  # (tied or buffer names the export leaves out)
                e = ((mine[k].float() - v.float().cpu()).abs().max() / v.float().abs().max().clamp_min(1e-30)).item()
                if e > worst:
                    worst, worst_name = e, k
            print(f"{name}: PEFT loads forge's adapter; logits relative difference {rel:.2e} (limit 1e-4); "
                  f"the adapters move the logits by {moved:.2e}; merged weights vs PEFT's merge_and_unload: "
                  f"worst {worst:.2e} ({worst_name}; limit 1e-5)")
            ok &= rel <= 1e-4 and worst <= 1e-5 and moved > 1e-3
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
