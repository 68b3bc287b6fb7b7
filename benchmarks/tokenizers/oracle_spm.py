#!/usr/bin/env python3
"""Golden ids of a sentencepiece .model for forge's tests, from Debian's python3-sentencepiece
(libsentencepiece 0.1.97, the library forge links): encode_ordinary of each corpus text.

    /usr/bin/python3 benchmarks/tokenizers/oracle_spm.py <fixtures dir> tests/data/tokenizers
"""
import json
import os
import sys

import sentencepiece as spm

fixtures, out_dir = sys.argv[1:3]
corpus = json.load(open(os.path.join(out_dir, "corpus.json"), encoding="utf-8"))
sp = spm.SentencePieceProcessor(model_file=os.path.join(fixtures, "llama2-model", "tokenizer.model"))
golden = {"tokenizer": "llama2-model/tokenizer.model", "oracle": "python3-sentencepiece 0.1.97 (Debian)",
          "corpus": "corpus.json", "encode_ordinary": [sp.encode(t) for t in corpus]}
path = os.path.join(out_dir, "golden", "llama2-model_tokenizer_model.json")
with open(path, "w") as f:
    f.write(json.dumps(golden) + "\n")
print(f"{path}: {len(corpus)} texts")
