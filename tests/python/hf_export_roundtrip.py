#!/usr/bin/env python3
"""forge export -> transformers (issue 18): a forge run's export loads with AutoTokenizer and
AutoModelForCausalLM, and greedy decoding there gives the tokens `forge sample --temperature 0`
gives.

    python3 tests/python/hf_export_roundtrip.py --forge build-gpu/forge [--work DIR]

For a tiny GPT and a tiny LLaMA (GQA) trained 40 steps on the CPU from configs/tiny.toml: forge
export (sharded: --max-shard-size 1MB), then transformers (f32, CPU) loads the directory and
greedy-decodes 24 tokens after a prompt; forge sample --temperature 0 must give the same text,
with the KV cache and without it. Exits 0 when every model agrees, 1 otherwise, 77 without
transformers.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"hf_export_roundtrip: {' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--forge", required=True)
    ap.add_argument("--work", default="")
    a = ap.parse_args()
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        print("hf_export_roundtrip: transformers missing: skipped")
        sys.exit(77)
    work = a.work or tempfile.mkdtemp(prefix="forge_hf_rt_")
    models = {
        "gpt": [],
        "llama": ["--model.type=llama", "--model.dim=64", "--model.n_head=4", "--model.n_kv_head=2",
                  "--model.n_layer=2", "--model.ffn_hidden=160"],
    }
    prompt = "The meaning of life is"
    ok = True
    # configs/tiny.toml reads Debian's fortunes; where they are elsewhere (the GPU machine unpacks
    # the package under .deps, scripts/gpu-check.sh), FORGE_FORTUNES_DIR says where.
    data = [f"--data.files={os.environ['FORGE_FORTUNES_DIR']}"] if os.environ.get("FORGE_FORTUNES_DIR") else []
    for name, extra in models.items():
        run([a.forge, "train", "configs/tiny.toml", f"--run.dir={work}", f"--run.name={name}", "--run.device=cpu",
             "--run.overwrite=true", "--train.steps=40", "--eval.every=0", *data, *extra])
        out = os.path.join(work, name + "_hf")
        run([a.forge, "export", "--checkpoint", os.path.join(work, name), "--out", out, "--dtype", "f32",
             "--max-shard-size", "1MB"])
        tok = AutoTokenizer.from_pretrained(out)
        model = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=tok.eos_token_id or 0)
        hf_text = tok.decode(gen[0, ids.shape[1]:], clean_up_tokenization_spaces=False)
        for cache in ([], ["--no-kv-cache"]):
            j = json.loads(run([a.forge, "sample", "--device", "cpu", "--checkpoint", os.path.join(work, name), "--prompt", prompt,
                                "--tokens", "24", "--temperature", "0", "--json", *cache]))
            forge_text = j["samples"][0]["completion"]
            same = forge_text == hf_text
            ok &= same
            print(f"{name}{' (no KV cache)' if cache else ''}: {'same' if same else 'DIFFERENT'}: "
                  f"forge {forge_text!r} / transformers {hf_text!r}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
