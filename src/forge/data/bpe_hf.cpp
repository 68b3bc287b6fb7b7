// forge's byte-level BPE as a Hugging Face tokenizer.json (Note [forge BPE as tokenizer.json]
// in bpe_hf.h).
#include "forge/data/bpe_hf.h"

#include <nlohmann/json.hpp>

#include "forge/data/hf_tokenizer.h"

namespace forge::data {

namespace {

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else {  // the byte-level alphabet stays below U+0800
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

std::string byte_level(const std::string& bytes) {
  std::string s;
  for (unsigned char b : bytes) s += utf8(byte_level_char(b));
  return s;
}

}  // namespace

std::string bpe_to_hf_tokenizer_json(const BpeTokenizer& tok) {
  using nlohmann::ordered_json;
  const int32_t n_merged = 256 + static_cast<int32_t>(tok.num_merges());
  ordered_json vocab = ordered_json::object();
  for (int32_t id = 0; id < n_merged; ++id) vocab[byte_level(tok.token_bytes(id))] = id;
  ordered_json merges = ordered_json::array();
  for (const auto& [left, right] : tok.merges())
    merges.push_back(byte_level(tok.token_bytes(left)) + " " + byte_level(tok.token_bytes(right)));
  ordered_json added = ordered_json::array();
  for (const std::string& sp : tok.special_tokens()) {
    const int32_t id = tok.special_id(sp);
    vocab[sp] = id;
    added.push_back({{"id", id}, {"content", sp}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  }
  const ordered_json byte_level_step = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                        {"use_regex", true}};
  ordered_json j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added},
                    {"normalizer", nullptr}, {"pre_tokenizer", byte_level_step}, {"post_processor", byte_level_step},
                    {"decoder", byte_level_step}};
  j["model"] = {{"type", "BPE"},          {"dropout", nullptr},         {"unk_token", nullptr},
                {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
                {"byte_fallback", false}, {"ignore_merges", false},     {"vocab", vocab},
                {"merges", merges}};
  return j.dump(2) + "\n";
}

}  // namespace forge::data
