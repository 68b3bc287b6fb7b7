#!/usr/bin/env python3
"""Writes the seed corpora of forge's fuzz targets (tests/fuzz/fuzz_targets.h) into
tests/fuzz/corpus/<target>/seed_*: small, valid inputs of every format, cut from the real files
(scripts/fetch-tokenizer-fixtures.sh puts GPT-2's, LLaMA-2's, LLaMA-3's, Qwen2.5's and tiktoken's
tokenizers in .fixtures/tokenizers) or written by forge itself.

    python3 tests/fuzz/make_seeds.py --forge build/forge --replay build/tests/forge_fuzz_replay

Needs spm_train (Debian: sentencepiece) for the sentencepiece models. Only seed_* files are
rewritten; the regressions (crash_*: inputs that once crashed forge, kept forever) are left alone.
Seeds are kept under 64 KiB so that the fuzzer's executions stay fast.
"""
import argparse
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fuzz" / "corpus"
FIXTURES = ROOT / ".fixtures" / "tokenizers"
MAX_SEED = 64 * 1024

SAMPLE_TEXT = (
    "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times.\n"
    "Numbers 0 12 345 6789, punctuation!? (brackets) [square] {curly} 'quotes' \"double\" -- dashes.\n"
    "Unicode: café naïve résumé, 你好世界, こんにちは, привет, emoji 😀🎉, tabs\tand  spaces.\n"
    "def main():\n    return 42  # code\n\n"
) * 4


def seed(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    assert len(data) <= MAX_SEED, f"{target}/{name}: {len(data)} bytes is over the {MAX_SEED}-byte seed limit"
    (d / f"seed_{name}").write_bytes(data)


def clear_seeds():
    if CORPUS.exists():
        for f in CORPUS.glob("*/seed_*"):
            f.unlink()


# ---- JSON, config.json, TOML ----------------------------------------------------------------------

def json_seeds():
    seed("json", "object", json.dumps({"a": [1, 2.5, -3e10, "x\u00e9\\n", None, True, False], "b": {"c": {}}}))
    seed("json", "nested", "[" * 60 + "1" + "]" * 60)
    seed("json", "escapes", '{"s": "\\u0000\\ud83d\\ude00\\t\\"", "n": 18446744073709551615, "f": 1e308}')
    seed("json", "array", json.dumps(list(range(100))))


GPT2_CONFIG = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024,
    "n_ctx": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None, "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-05, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
    "initializer_range": 0.02, "bos_token_id": 50256, "eos_token_id": 50256, "tie_word_embeddings": True,
    "torch_dtype": "float32", "transformers_version": "4.46.0",
}
LLAMA32_1B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True, "bos_token_id": 128000,
    "eos_token_id": 128001, "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0",
}
LLAMA2_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
    "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "rope_scaling": None, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}


def hf_config_seeds():
    seed("hf_config", "gpt2.json", json.dumps(GPT2_CONFIG, indent=2))
    seed("hf_config", "llama-3.2-1b.json", json.dumps(LLAMA32_1B_CONFIG, indent=2))
    seed("hf_config", "llama-2-7b.json", json.dumps(LLAMA2_CONFIG, indent=2))
    tiny = dict(GPT2_CONFIG, vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    seed("hf_config", "gpt2-tiny.json", json.dumps(tiny))


def toml_seeds():
    for f in sorted((ROOT / "configs").glob("*.toml")):
        if f.stat().st_size <= MAX_SEED:
            seed("toml", f.name, f.read_bytes())


# ---- safetensors ----------------------------------------------------------------------------------

def safetensors_bytes(tensors, metadata=None):
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def safetensors_seeds():
    f32 = lambda vals: struct.pack(f"<{len(vals)}f", *vals)
    seed("safetensors", "f32.safetensors", safetensors_bytes(
        {"wte.weight": ("F32", [4, 3], f32([0.5 * i for i in range(12)])),
         "ln_f.bias": ("F32", [3], f32([1.0, -2.0, 3.5]))}, {"format": "pt"}))
    seed("safetensors", "mixed.safetensors", safetensors_bytes(
        {"a": ("BF16", [2, 2], struct.pack("<4H", 0x3F80, 0x4000, 0xBF80, 0x0000)),
         "b": ("F16", [3], struct.pack("<3H", 0x3C00, 0x4000, 0x7C00)),
         "c": ("I64", [2], struct.pack("<2q", 7, -9)),
         "d": ("F64", [], struct.pack("<d", 2.25)),
         "e": ("F32", [0, 4], b""),
         "f": ("U8", [5], bytes(range(5)))}))
    seed("safetensors", "empty.safetensors", safetensors_bytes({}))


# ---- tokenizers -----------------------------------------------------------------------------------

def reduce_hf_tokenizer(path, keep):
    """A Hugging Face tokenizer.json cut to the vocabulary ids below `keep` (and the merges among
    them); added tokens are renumbered after them, so the file stays valid and small."""
    d = json.loads(path.read_text(encoding="utf-8"))
    m = d["model"]
    vocab = {t: i for t, i in m["vocab"].items() if i < keep}
    m["vocab"] = vocab
    merges = []
    for mg in m.get("merges", []):
        a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
        if a in vocab and b in vocab and (a + b) in vocab:
            merges.append(mg)
    m["merges"] = merges
    remap = {}
    for k, tok in enumerate(d.get("added_tokens", [])):
        if tok["id"] >= keep:
            remap[tok["id"]] = keep + k
            tok["id"] = keep + k
    pp = d.get("post_processor") or {}
    procs = pp.get("processors", [pp]) if pp else []
    for p in procs:
        for st in (p.get("special_tokens") or {}).values():
            if "ids" in st:
                st["ids"] = [remap.get(i, i) for i in st["ids"]]
    return json.dumps(d, ensure_ascii=False).encode()


def tokenizer_seeds(forge, tmp):
    for name, keep in [("gpt2", 400), ("llama3", 400), ("qwen2_5", 400), ("llama2", 400)]:
        p = FIXTURES / name / "tokenizer.json"
        if not p.exists():
            sys.exit(f"make_seeds: {p} is missing; run scripts/fetch-tokenizer-fixtures.sh first")
        seed("tokenizer_json", f"{name}.json", reduce_hf_tokenizer(p, keep))
    for name in ["cl100k_base", "o200k_base"]:
        lines = (FIXTURES / f"{name}.tiktoken").read_bytes().splitlines(keepends=True)
        seed("tiktoken", f"{name}.tiktoken", b"".join(lines[:700]))
    # forge's own BPE, trained by forge on the sample text
    text = Path(tmp) / "sample.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    for vocab, special in [(300, []), (400, ["<|endoftext|>"])]:
        out = Path(tmp) / f"forge_bpe_{vocab}.json"
        cmd = [forge, "tokenize", "train", str(text), "--vocab-size", str(vocab), "--out", str(out)]
        for s in special:
            cmd += ["--special-token", s]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        seed("forge_bpe", f"forge_bpe_{vocab}.json", out.read_bytes())
    # sentencepiece models trained by spm_train on the sample text
    spm = shutil.which("spm_train")
    if spm is None:
        sys.exit("make_seeds: spm_train is missing (Debian: apt-get install sentencepiece)")
    big = Path(tmp) / "spm.txt"
    big.write_text(SAMPLE_TEXT * 8, encoding="utf-8")
    # (identity normalization: nmt_nfkc's precompiled character map alone is 240 KB)
    for kind, vocab, extra in [("bpe", 400, ["--byte_fallback=true"]), ("unigram", 100, [])]:
        prefix = Path(tmp) / f"spm_{kind}"
        subprocess.run([spm, f"--input={big}", f"--model_prefix={prefix}", f"--vocab_size={vocab}", f"--model_type={kind}",
                        "--character_coverage=1.0", "--normalization_rule_name=identity", "--minloglevel=2", *extra], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seed("sentencepiece", f"{kind}.model", (Path(f"{prefix}.model")).read_bytes())


# ---- corpora and shards ---------------------------------------------------------------------------

def corpus_seeds(forge, tmp):
    docs = [{"text": line, "id": i} for i, line in enumerate(SAMPLE_TEXT.split("\n")[:8])]
    jsonl = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)
    seed("jsonl", "docs.jsonl", jsonl)
    seed("jsonl", "escapes.jsonl", '{"text": "a\\u0000b\\n\\ud83d\\ude00"}\n\n{"text": ""}\r\n{"meta": 1, "text": "x"}')
    seed("jsonl_gz", "docs.jsonl.gz", gzip.compress(jsonl.encode(), mtime=0))
    seed("jsonl_gz", "two_members.jsonl.gz", gzip.compress(b'{"text": "one"}\n', mtime=0) +
         gzip.compress(b'{"text": "two"}\n', mtime=0))
    seed("text", "sample.txt", SAMPLE_TEXT)
    seed("text", "crlf.txt", "line one\r\nline two\r\n\r\n\xef\xbb\xbfbom")
    # forge shards written by forge (u16 and u32 tokens)
    text = Path(tmp) / "c.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    tok = Path(tmp) / "t300.json"
    subprocess.run([forge, "tokenize", "train", str(text), "--vocab-size", "300", "--out", str(tok)],
                   check=True, stdout=subprocess.DEVNULL)
    out = Path(tmp) / "shards"
    subprocess.run([forge, "tokenize", "encode", str(text), "--tokenizer", str(tok), "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shards = sorted(p for p in out.iterdir() if p.is_file() and p.read_bytes()[:6] == b"FRGTOK")
    if not shards:
        sys.exit("make_seeds: forge tokenize encode wrote no shard")
    for i, f in enumerate(shards):
        seed("shard_forge", f"forge_u16_{i}.tok", f.read_bytes())
    toks = list(range(0, 600, 3))
    seed("shard_forge", "forge_u32.tok", b"FRGTOK\0\0" + struct.pack("<IIQ", 1, 4, len(toks)) +
         struct.pack(f"<{len(toks)}I", *[t * 1000 for t in toks]))
    # llm.c: GPT-2 (uint16) and LLaMA-3 (uint32)
    def llmc(magic, version, fmt, tokens):
        head = struct.pack("<256i", magic, version, len(tokens), *([0] * 253))
        return head + struct.pack(f"<{len(tokens)}{fmt}", *tokens)
    seed("shard_llmc", "gpt2.bin", llmc(20240520, 1, "H", [50256] + toks))
    seed("shard_llmc", "llama3.bin", llmc(20240801, 7, "I", [128000] + [t * 200 for t in toks]))
    # Megatron: u32 .idx length, the .idx, the .bin (fuzz_shard_megatron's layout)
    def megatron(dtype_code, fmt, width, seqs, docs):
        lengths = [len(s) for s in seqs]
        offsets, at = [], 0
        for n in lengths:
            offsets.append(at)
            at += n * width
        idx = (b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, dtype_code, len(seqs), len(docs)) +
               struct.pack(f"<{len(seqs)}i", *lengths) + struct.pack(f"<{len(seqs)}q", *offsets) +
               struct.pack(f"<{len(docs)}q", *docs))
        binary = b"".join(struct.pack(f"<{len(s)}{fmt}", *s) for s in seqs)
        return struct.pack("<I", len(idx)) + idx + binary
    seqs = [toks[:50], toks[50:51], [], toks[51:120]]
    seed("shard_megatron", "uint16", megatron(8, "H", 2, seqs, [0, 1, 3, 4]))
    seed("shard_megatron", "int32", megatron(4, "i", 4, seqs, [0, 2, 4]))
    seed("shard_megatron", "int16", megatron(3, "h", 2, seqs[:2], [0, 2]))
    # IDX (Fashion-MNIST's format): images (ubyte, 3 dims) and labels (1 dim)
    seed("idx", "images-idx3-ubyte", struct.pack(">IIII", 0x803, 2, 3, 3) + bytes(range(18)))
    seed("idx", "labels-idx1-ubyte", struct.pack(">II", 0x801, 5) + bytes([0, 9, 3, 1, 4]))
    seed("idx", "images.gz", gzip.compress(struct.pack(">IIII", 0x803, 1, 2, 2) + bytes([1, 2, 3, 4]), mtime=0))


def checkpoint_seeds(forge, replay, tmp):
    # The fuzz targets' own base checkpoint: its state.json and manifest.json as seeds.
    base = Path(tmp) / "base"
    subprocess.run([replay, "--emit-base-checkpoint", str(base)], check=True, stdout=subprocess.DEVNULL)
    seed("checkpoint_state", "base_state.json", (base / "state.json").read_bytes())
    seed("checkpoint_manifest", "base_manifest.json", (base / "manifest.json").read_bytes())
    # A real run's state.json: configs/tiny.toml, two steps.
    run = Path(tmp) / "runs"
    subprocess.run([forge, "train", str(ROOT / "configs" / "tiny.toml"), f"--run.dir={run}", "--run.name=tiny",
                    "--train.steps=2", "--train.log_every=1"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    states = sorted(run.glob("tiny/checkpoints/*/state.json"))
    if not states:
        sys.exit("make_seeds: the tiny run wrote no checkpoint")
    seed("checkpoint_state", "tiny_state.json", states[-1].read_bytes())
    seed("checkpoint_manifest", "tiny_manifest.json", (states[-1].parent / "manifest.json").read_bytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--forge", default=str(ROOT / "build" / "forge"))
    ap.add_argument("--replay", default=str(ROOT / "build" / "tests" / "forge_fuzz_replay"))
    a = ap.parse_args()
    clear_seeds()
    with tempfile.TemporaryDirectory() as tmp:
        json_seeds()
        hf_config_seeds()
        toml_seeds()
        safetensors_seeds()
        tokenizer_seeds(a.forge, tmp)
        corpus_seeds(a.forge, tmp)
        checkpoint_seeds(a.forge, a.replay, tmp)
    n = sum(1 for _ in CORPUS.glob("*/seed_*"))
    size = sum(f.stat().st_size for f in CORPUS.glob("*/seed_*"))
    print(f"make_seeds: {n} seeds, {size} bytes, in {CORPUS}")


if __name__ == "__main__":
    main()
