#pragma once
// Pre-tokenizer regexes (Hugging Face Split/ByteLevel, tiktoken patterns) on PCRE2.
//
// A pattern is compiled once with PCRE2_UTF | PCRE2_UCP (\p{L}, \p{N}, \s, \w and case-folding
// by the Unicode database of the PCRE2 build, 10.42 on Debian 12: Unicode 14) and
// PCRE2_MATCH_INVALID_UTF, and JIT-compiled when the library has a JIT. Matching is
// leftmost-first with backtracking, like the references' engines (Oniguruma for Hugging Face
// tokenizers, fancy-regex for tiktoken), so the pieces are theirs on valid UTF-8.
//
// Note [invalid UTF-8]: the references take Python/JS strings, so invalid UTF-8 never reaches
// them (a caller decodes first, usually replacing it by U+FFFD, which loses the bytes). forge
// encodes bytes, and keeps every byte: a match never includes or crosses an invalid UTF-8
// sequence (PCRE2_MATCH_INVALID_UTF: there it behaves as at the end of the text, e.g. `\s+(?!\S)`
// takes a whitespace run before it whole), and each maximal run of bytes that are not valid
// UTF-8 (RFC 3629: stray continuation bytes, overlong forms, surrogates, truncated sequences,
// bytes F5..FF) is a piece of its own, which byte-level BPE encodes with its byte tokens and
// sentencepiece-style BPE with its <0xNN> byte-fallback tokens. So text = a + invalid + b
// encodes as encode(a), then the bytes' tokens, then encode(b): on the valid parts the ids are
// exactly the references'.
//
// Thread-safe: a compiled pattern is shared; each thread matches with its own match data.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace forge::data {

class Regex {
 public:
  // Throws forge::Error naming `origin`, the pattern, PCRE2's message and the offset when the
  // pattern does not compile, or when this forge was built without PCRE2.
  Regex(std::string_view pattern, const std::string& origin);

  const std::string& pattern() const;

  // Calls f(piece) for every piece of `text`, in order: each match, and each maximal run of
  // invalid UTF-8 between matches (Note [invalid UTF-8]); the valid text between matches too
  // when keep_gaps (Hugging Face's Split "Isolated"), not otherwise (tiktoken, which keeps
  // only matches; its patterns match all valid text anyway). Empty matches are skipped.
  template <class F> void split(std::string_view text, bool keep_gaps, F&& f) const;

 private:
  // The first match at or after `start`: [begin, end), or begin = npos when there is none.
  void find(std::string_view text, size_t start, size_t& begin, size_t& end) const;
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// The length of the valid UTF-8 character at text[pos], 0 if the bytes there are not one.
size_t utf8_char_len(std::string_view text, size_t pos);

// Calls f(run, valid) for the maximal runs of valid and of invalid UTF-8 in `text`.
template <class F> void for_each_utf8_run(std::string_view text, F&& f) {
  size_t pos = 0;
  while (pos < text.size()) {
    const bool valid = utf8_char_len(text, pos) > 0;
    size_t end = pos;
    while (end < text.size()) {
      const size_t n = utf8_char_len(text, end);
      if ((n > 0) != valid) break;
      end += valid ? n : 1;
    }
    f(text.substr(pos, end - pos), valid);
    pos = end;
  }
}

template <class F> void Regex::split(std::string_view text, bool keep_gaps, F&& f) const {
  auto gap = [&](std::string_view g) {
    if (g.empty()) return;
    for_each_utf8_run(g, [&](std::string_view run, bool valid) {
      if (!valid || keep_gaps) f(run);
    });
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t b = 0, e = 0;
    find(text, pos, b, e);
    if (b == std::string_view::npos) break;
    if (e == b) {  // an empty match: move on by one character (or invalid byte)
      const size_t n = utf8_char_len(text, b);
      const size_t next = b + (n > 0 ? n : 1);
      gap(text.substr(pos, next - pos));
      pos = next;
      continue;
    }
    gap(text.substr(pos, b - pos));
    f(text.substr(b, e - b));
    pos = e;
  }
  gap(text.substr(pos));
}

}  // namespace forge::data
