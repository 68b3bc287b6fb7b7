#pragma once
// GPT-2 pre-tokenisation, written by hand (no regex library).
//
// Before byte-pair merges, text is cut into "pre-tokens" that merges never cross. The
// rule is GPT-2's pattern, tried alternative by alternative at each position (leftmost
// alternative that matches wins; each alternative is greedy):
//
//     's|'t|'re|'ve|'m|'ll|'d | ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ | \s+(?!\S) | \s+
//
//   1. the ASCII contractions 's 't 're 've 'm 'll 'd (case-sensitive, apostrophe U+0027);
//   2. an optional single space (U+0020) then a run of letters;
//   3. an optional single space then a run of numbers;
//   4. an optional single space then a run of anything that is not whitespace, letter or number;
//   5. a run of whitespace not followed by a non-whitespace character: a whitespace run
//      that reaches the end of the text is taken whole, one that is followed by something
//      else gives up its last character (which then opens the next pre-token, e.g. " x");
//   6. otherwise a lone whitespace character.
//
// Example: "Hello world's 123  \n x" -> "Hello" " world" "'s" " 123" "  \n" " x".
//
// Character classes come from decoding UTF-8 (see Note [Unicode classes] in
// pretokenize.cpp): ASCII is classified exactly; non-ASCII code points are classified with
// a compact range table of the main alphabetic and numeric blocks (an approximation of
// \p{L} and \p{N}: combining marks inside those blocks may count as letters, and rare
// scripts outside them count as "other"); the Unicode White_Space code points are
// whitespace; bytes that are not valid UTF-8 (stray continuation bytes, overlong forms,
// surrogates, truncated sequences, > U+10FFFF) are single-byte "other" characters.
//
// The pieces always tile the input exactly (concatenating them gives the text back), so
// byte-level BPE on top stays lossless for any bytes.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace forge::data {

enum class CharClass : uint8_t { letter, number, space, other };

// The class of the character that starts at text[pos] and its length in bytes (1..4).
// Invalid UTF-8 gives {other, 1}.
struct CharInfo {
  CharClass cls;
  uint8_t len;
};
CharInfo classify_at(std::string_view text, size_t pos);

// The class of a Unicode code point (the range-table approximation described above).
CharClass classify_code_point(uint32_t cp);

// Calls f(std::string_view piece) for each pre-token of `text`, in order.
template <class F> void for_each_pretoken(std::string_view text, F&& f);

// True when `text` is well-formed UTF-8 (RFC 3629).
bool is_valid_utf8(std::string_view text);

// All pre-tokens of `text` (views into it).
std::vector<std::string_view> pretokenize(std::string_view text);

// The end (exclusive) of the pre-token that starts at `pos` (pos < text.size()).
size_t pretoken_end(std::string_view text, size_t pos);

template <class F> void for_each_pretoken(std::string_view text, F&& f) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = pretoken_end(text, pos);
    f(text.substr(pos, end - pos));
    pos = end;
  }
}

}  // namespace forge::data
