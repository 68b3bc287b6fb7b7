#pragma once
// A Hugging Face tokenizer.json whose model is BPE (tokenizer.h lists the kinds).
//
// What forge reads of the file (anything else is refused with a message that names it):
//   normalizer      null, NFC, NFD, NFKC, NFKD (utf8proc), Prepend, Replace (string pattern),
//                   Sequence of those;
//   pre_tokenizer   null, ByteLevel (add_prefix_space; use_regex: GPT-2's pattern), Split (a
//                   Regex or String pattern; behavior "Isolated", or "Removed" with invert),
//                   Metaspace (replacement, prepend_scheme, split), Sequence of those;
//   model           BPE: vocab, merges ("a b" strings or ["a", "b"] pairs), byte_fallback,
//                   unk_token, fuse_unk, ignore_merges (dropout is a training option: ignored);
//   added_tokens    split out of the text before normalisation (added_tokens.h), with their
//                   lstrip / rstrip / single_word flags; encode_ordinary leaves the special
//                   ones as text (Hugging Face's split_special_tokens);
//   decoder         ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence;
//   post_processor  TemplateProcessing names the bos token (bos_id()); forge never adds it.
// Symbols are bytes when a ByteLevel pre-tokenizer is present (GPT-2, LLaMA-3, Qwen: the
// vocabulary's GPT-2 byte-to-unicode alphabet is mapped back to bytes once, at load), UTF-8
// characters otherwise (LLaMA-2's sentencepiece-style BPE with <0xNN> byte fallback).
// Decoding returns bytes: Hugging Face's ByteLevel decoder would replace invalid UTF-8 by
// U+FFFD, forge keeps the bytes (so decode(encode(s)) == s).
#include <memory>
#include <string>

#include "forge/data/tokenizer.h"

namespace forge::data {

// `json` is the file's text; `origin` names it in errors.
std::shared_ptr<const Tokenizer> load_hf_tokenizer(std::string json, const std::string& origin);

// GPT-2's byte-to-unicode alphabet: the code point that stands for byte b in byte-level
// vocabularies (printable Latin-1 bytes stand for themselves, the others for 256 + n).
char32_t byte_level_char(unsigned char b);

}  // namespace forge::data
