#pragma once
// forge's byte-level BPE (bpe.h) as a Hugging Face tokenizer.json, so `forge export` hands
// transformers (AutoTokenizer / PreTrainedTokenizerFast) the run's own tokenizer.
//
// Note [forge BPE as tokenizer.json]: forge's BPE is GPT-2's scheme, so the file is GPT-2's
// layout: a ByteLevel pre-tokenizer (add_prefix_space false, use_regex: GPT-2's pattern, the
// one pretokenize.h implements), a BPE model whose vocabulary spells each token's bytes in
// GPT-2's byte-to-unicode alphabet (hf_tokenizer.h: byte_level_char) with forge's ids (bytes
// 0..255 first, then merge i as id 256 + i), its merges in forge's order (merge rank = id
// order, "left right" strings: the alphabet has no space), the special tokens as added tokens
// (special, not normalised; also in the vocabulary, as GPT-2's "<|endoftext|>" is), a
// ByteLevel decoder. Hugging Face's BPE applies the lowest-rank merge first, as forge does, so
// both encode every text the same way (ASCII exactly; pretokenize.h approximates \p{L} and
// \p{N} outside the main scripts).
#include <string>

#include "forge/data/bpe.h"

namespace forge::data {

std::string bpe_to_hf_tokenizer_json(const BpeTokenizer& tok);

}  // namespace forge::data
