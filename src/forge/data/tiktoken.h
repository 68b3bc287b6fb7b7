#pragma once
// A tiktoken rank file: one token per line, its bytes in base64, a space, its rank (= its
// id), e.g. cl100k_base.tiktoken and o200k_base.tiktoken as OpenAI publishes them.
//
// The file holds neither the pre-tokenizer pattern nor the special tokens. forge takes them
//   1. from a sidecar JSON next to it, <file>.json (e.g. cl100k_base.tiktoken.json):
//        {"pattern": "cl100k_base" | "<a regex>", "special_tokens": {"<|endoftext|>": 100257}}
//      ("pattern" is an encoding's name below or a regex; "special_tokens" replaces the
//      encoding's set; either may be left out when the file's name is an encoding's);
//   2. else from the file's name when it starts with an encoding's name: cl100k_base,
//      o200k_base, p50k_base, r50k_base (GPT-2's pattern for the last two), with that
//      encoding's special tokens;
//   3. else the file is refused with a message that asks for the sidecar.
// Encoding is tiktoken's: the text cut at special tokens (encode) or not (encode_ordinary),
// split by the pattern keeping only its matches (Note [invalid UTF-8] in regex.h for the
// bytes between), a piece that is a token is that token, else byte-pair merges by rank
// (bpe_model.h says why id-pair merges give tiktoken's result).
#include <memory>
#include <optional>
#include <string>

#include "forge/data/tokenizer.h"

namespace forge::data {

// `ranks` is the rank file's text; `name` its file name; `sidecar` the sidecar's JSON text.
std::shared_ptr<const Tokenizer> load_tiktoken(std::string ranks, const std::string& name,
                                               const std::optional<std::string>& sidecar, const std::string& origin);

// True when `bytes` starts like a rank file (a base64 token, a space, a number).
bool looks_like_tiktoken(const std::string& bytes);

// The pattern of a named encoding ("cl100k_base", ...), or nullopt.
std::optional<std::string> tiktoken_pattern(const std::string& encoding);

}  // namespace forge::data
