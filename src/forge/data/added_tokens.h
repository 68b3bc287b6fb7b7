#pragma once
// Special and added tokens of loaded tokenizers: found in the text before normalisation and
// pre-tokenisation, as Hugging Face tokenizers and tiktoken do.
//
// Matching is leftmost-longest: the earliest position where some token occurs wins, and
// there the longest token. Hugging Face's flags: `lstrip` / `rstrip` make the token take the
// whitespace before / after it (that whitespace is not encoded); `single_word` matches only
// when the token is not preceded or followed by a word character (ASCII letters, digits and
// '_', and every non-ASCII character). `special` tokens are split out by encode only;
// the others (Hugging Face's non-special added tokens) by encode_ordinary too.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace forge::data {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = true;
  bool lstrip = false, rstrip = false, single_word = false;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  struct Segment {
    std::string_view text;  // text between tokens (id == -1)
    int32_t id;             // or a token
  };
  // The text cut at the tokens (only non-special ones unless with_special); text segments
  // are never empty.
  std::vector<Segment> split(std::string_view text, bool with_special) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool empty() const { return tokens_.empty(); }

 private:
  std::vector<AddedToken> tokens_;
  std::array<std::vector<uint32_t>, 256> by_first_;  // indices of tokens by first byte, longest first
};

}  // namespace forge::data
