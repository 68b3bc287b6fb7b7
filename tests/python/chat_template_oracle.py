#!/usr/bin/env python3
"""Golden chat-template renderings from transformers, for forge's C++ test to compare.

For each tokenizer_config.json fixture (tests/data/chat/<name>/tokenizer_config.json, or the
directories given), renders a fixed set of conversations with transformers' apply_chat_template
(tokenize=False, with and without add_generation_prompt) and writes them to golden.json beside
the config:
    [{"messages": [...], "add_generation_prompt": bool, "text": "..."}, ...]
tests/data/test_chat_template.cpp (ChatTemplate.MatchesTransformersGoldens) renders the same
conversations with forge (data::ChatTemplate) and compares byte for byte; it skips fixtures
without a golden.json. Run where transformers is installed (the GPU machine):

    python3 tests/python/chat_template_oracle.py            # every fixture
    python3 tests/python/chat_template_oracle.py DIR ...    # directories holding tokenizer_config.json
    ./build/tests/forge_tests --gtest_filter='ChatTemplate.MatchesTransformersGoldens'

transformers needs a tokenizer to render; the fixtures hold only tokenizer_config.json, so the
template is rendered through transformers' own renderer (the tokenizer's chat template code path,
`PreTrainedTokenizerBase.apply_chat_template` with `chat_template=` given) on a GPT-2 tokenizer
built from .fixtures/tokenizers/gpt2/tokenizer.json, with the config's bos_token and eos_token.
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "data" / "chat"

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": " Hi \n"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "And 2+2?"},
     {"role": "assistant", "content": "4"}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
]


def token(v):
    return v.get("content") if isinstance(v, dict) else v


def main(dirs):
    from transformers import PreTrainedTokenizerFast

    base = ROOT / ".fixtures" / "tokenizers" / "gpt2" / "tokenizer.json"
    for d in dirs:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        tok = PreTrainedTokenizerFast(tokenizer_file=str(base))
        tok.bos_token = token(cfg.get("bos_token")) or None
        tok.eos_token = token(cfg.get("eos_token")) or None
        out = []
        for messages in CONVERSATIONS:
            for gen in (False, True):
                if gen and messages[-1]["role"] == "assistant":
                    continue
                text = tok.apply_chat_template(messages, chat_template=cfg["chat_template"], tokenize=False,
                                               add_generation_prompt=gen)
                out.append({"messages": messages, "add_generation_prompt": gen, "text": text})
        (d / "golden.json").write_text(json.dumps(out, indent=1) + "\n")
        print(f"{d / 'golden.json'}: {len(out)} renderings")


if __name__ == "__main__":
    dirs = [pathlib.Path(a) for a in sys.argv[1:]] or sorted(p.parent for p in FIXTURES.glob("*/tokenizer_config.json"))
    main(dirs)
