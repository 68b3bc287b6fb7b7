#!/usr/bin/env python3
"""Golden ids of forge's tokenizer tests from the Python references, for a machine that has them
(the GPU machine: `tokenizers`, `tiktoken`, `sentencepiece`); a cross-check of the goldens that
oracle_node.mjs (npm references) and oracle_spm.py (Debian's sentencepiece) wrote.

    python3 benchmarks/tokenizers/oracle.py <fixtures dir> tests/data/tokenizers --check   # compare
    python3 benchmarks/tokenizers/oracle.py <fixtures dir> tests/data/tokenizers --write   # overwrite
    python3 benchmarks/tokenizers/oracle.py <fixtures dir> tests/data/tokenizers --check FILLS.json
        # also writes the Python references' ids of the texts whose golden is null (the npm
        # reference could not be trusted there) to FILLS.json; `--fill FILLS.json` puts them in

<fixtures dir> is what scripts/fetch-tokenizer-fixtures.sh lays out (.fixtures/tokenizers; carry it
with the run). With --check, prints one line per golden file and every text whose ids differ,
and exits 1 if any does; a null golden entry (a text the npm reference got wrong) is not a
difference: its ids from the Python reference go to FILLS.json.
"""
import json
import os
import sys

fixtures, data_dir, mode = sys.argv[1], sys.argv[2], (sys.argv[3] if len(sys.argv) > 3 else "--check")
fills_path = sys.argv[4] if len(sys.argv) > 4 else None
corpus = json.load(open(os.path.join(data_dir, "corpus.json"), encoding="utf-8"))
failed = False
fills = {}  # golden file -> key -> {index: ids}

if mode == "--fill":  # (no references needed: the ids come from a --check run elsewhere)
    for golden_name, keys in json.load(open(fills_path)).items():
        path = os.path.join(data_dir, "golden", golden_name)
        g = json.load(open(path))
        by = keys.pop("_oracle", "the Python reference")
        for key, entries in keys.items():
            for i, ids in entries.items():
                assert g[key][int(i)] is None, f"{golden_name} {key}[{i}] is not null"
                g[key][int(i)] = ids
        g["oracle"] += f"; entries {', '.join(sorted({i for e in keys.values() for i in e}, key=int))} by {by}"
        open(path, "w").write(json.dumps(g) + "\n")
        print(f"{path}: filled {sum(len(v) for v in keys.values())} entries")
    sys.exit(0)

# The public definitions of OpenAI's encodings (as in tiktoken_ext/openai_public.py).
PATTERNS = {
    "cl100k_base": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "o200k_base": "|".join([
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+"""]),
}
SPECIALS = {
    "cl100k_base": {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                    "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276},
    "o200k_base": {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
}


def emit(golden_name, oracle, result):
    global failed
    path = os.path.join(data_dir, "golden", golden_name)
    if mode == "--write":
        out = {"tokenizer": golden_name, "oracle": oracle, "corpus": "corpus.json", **result}
        open(path, "w").write(json.dumps(out) + "\n")
        print(f"{path}: written ({oracle})")
        return
    old = json.load(open(path))
    bad = 0
    for key, ids in result.items():
        for i, (a, b) in enumerate(zip(ids, old.get(key, []))):
            if b is None:  # (the npm reference was not trusted here: the Python one fills it)
                fills.setdefault(golden_name, {"_oracle": oracle}).setdefault(key, {})[i] = a
                continue
            if a != b:
                bad += 1
                print(f"  {golden_name} {key}[{i}] {corpus[i][:50]!r}: {oracle} {a[:20]} vs golden {(b or [])[:20]}")
    print(f"{golden_name}: {oracle}: {'identical' if bad == 0 else f'{bad} difference(s)'}")
    failed = failed or bad > 0


from tokenizers import Tokenizer  # noqa: E402
import tokenizers  # noqa: E402

for name in ["gpt2", "llama2", "llama3", "qwen2_5"]:
    tok = Tokenizer.from_file(os.path.join(fixtures, name, "tokenizer.json"))
    ids = [tok.encode(t, add_special_tokens=False).ids for t in corpus]
    emit(f"{name}_tokenizer_json.json", f"tokenizers {tokenizers.__version__}", {"encode": ids})

import tiktoken  # noqa: E402
from tiktoken.load import load_tiktoken_bpe  # noqa: E402

for name in ["cl100k_base", "o200k_base"]:
    ranks = load_tiktoken_bpe(os.path.join(fixtures, f"{name}.tiktoken"))
    enc = tiktoken.Encoding(name, pat_str=PATTERNS[name], mergeable_ranks=ranks, special_tokens=SPECIALS[name])
    emit(f"{name}_tiktoken.json", f"tiktoken {tiktoken.__version__}",
         {"encode": [enc.encode(t, allowed_special="all") for t in corpus],
          "encode_ordinary": [enc.encode_ordinary(t) for t in corpus]})

import sentencepiece as spm  # noqa: E402

sp = spm.SentencePieceProcessor(model_file=os.path.join(fixtures, "llama2-model", "tokenizer.model"))
emit("llama2-model_tokenizer_model.json", f"sentencepiece {spm.__version__}",
     {"encode_ordinary": [sp.encode(t) for t in corpus]})
if fills_path and fills:
    open(fills_path, "w").write(json.dumps(fills) + "\n")
    print(f"the references' ids of {sum(len(v) for f in fills.values() for k, v in f.items() if k != '_oracle')} "
          f"null golden entries: {fills_path}")
sys.exit(1 if failed else 0)
