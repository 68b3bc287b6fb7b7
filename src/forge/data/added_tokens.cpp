// Leftmost-longest matching of special and added tokens (added_tokens.h).
#include "forge/data/added_tokens.h"

#include <algorithm>

namespace forge::data {

namespace {
bool is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
bool is_word(unsigned char c) {
  return c >= 0x80 || c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (uint32_t i = 0; i < tokens_.size(); ++i)
    if (!tokens_[i].content.empty()) by_first_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
  for (auto& v : by_first_)
    std::stable_sort(v.begin(), v.end(),
                     [&](uint32_t a, uint32_t b) { return tokens_[a].content.size() > tokens_[b].content.size(); });
}

std::vector<AddedTokenMatcher::Segment> AddedTokenMatcher::split(std::string_view text, bool with_special) const {
  std::vector<Segment> out;
  size_t done = 0;  // text before `done` is emitted
  auto emit_text = [&](size_t end) {
    if (end > done) out.push_back({text.substr(done, end - done), -1});
  };
  for (size_t pos = 0; pos < text.size(); ++pos) {
    const auto& cands = by_first_[static_cast<unsigned char>(text[pos])];
    if (cands.empty()) continue;
    for (const uint32_t k : cands) {
      const AddedToken& t = tokens_[k];
      if (!with_special && t.special) continue;
      if (text.compare(pos, t.content.size(), t.content) != 0) continue;
      size_t begin = pos, end = pos + t.content.size();
      if (t.single_word && ((begin > 0 && is_word(static_cast<unsigned char>(text[begin - 1]))) ||
                            (end < text.size() && is_word(static_cast<unsigned char>(text[end])))))
        continue;
      if (t.lstrip)
        while (begin > done && is_space(static_cast<unsigned char>(text[begin - 1]))) --begin;
      if (t.rstrip)
        while (end < text.size() && is_space(static_cast<unsigned char>(text[end]))) ++end;
      emit_text(begin);
      out.push_back({text.substr(begin, end - begin), t.id});
      done = end;
      pos = end - 1;
      break;
    }
  }
  emit_text(text.size());
  return out;
}

}  // namespace forge::data
