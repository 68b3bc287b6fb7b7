// tiktoken rank files (tiktoken.h).
#include "forge/data/tiktoken.h"

#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/data/added_tokens.h"
#include "forge/data/base64.h"
#include "forge/data/bpe_model.h"
#include "forge/data/bpe_tables.h"
#include "forge/data/regex.h"
#include "forge/io/json_input.h"

namespace forge::data {

namespace {

using nlohmann::json;

struct Encoding {
  const char* name;
  const char* pattern;
  std::vector<std::pair<const char*, int32_t>> specials;
};

// The public definitions of OpenAI's encodings: pattern and special tokens.
const std::vector<Encoding>& encodings() {
  static const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  static const std::vector<Encoding> e = {
      {"cl100k_base",
       R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       {{"<|endoftext|>", 100257},
        {"<|fim_prefix|>", 100258},
        {"<|fim_middle|>", 100259},
        {"<|fim_suffix|>", 100260},
        {"<|endofprompt|>", 100276}}},
      {"o200k_base",
       R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}},
      {"p50k_base", kGpt2, {{"<|endoftext|>", 50256}}},
      {"r50k_base", kGpt2, {{"<|endoftext|>", 50256}}},
  };
  return e;
}

const Encoding* encoding_of_name(const std::string& file_name) {
  for (const auto& e : encodings())
    if (file_name.rfind(e.name, 0) == 0) return &e;
  return nullptr;
}

class TiktokenTokenizer final : public Tokenizer {
 public:
  TiktokenTokenizer(std::string ranks, const std::string& name, const std::optional<std::string>& sidecar,
                    const std::string& origin);
  std::string kind() const override { return "tiktoken"; }
  std::string describe() const override {
    return "tiktoken " + (encoding_.empty() ? std::string("(custom pattern)") : encoding_) + ", " +
           std::to_string(vocab_size()) + " tokens";
  }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    for (const auto& s : specials_.split(text, true)) {
      if (s.id >= 0) out.push_back(s.id);
      else encode_ordinary_into(s.text, out);
    }
    return out;
  }
  void encode_ordinary_into(std::string_view text, std::vector<int32_t>& out) const override {
    regex_->split(text, false, [&](std::string_view piece) { model_->encode_piece(piece, out); });
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t id = ids[i];
      FORGE_CHECK(id >= 0 && id < vocab_size() && !bytes_[static_cast<size_t>(id)].empty(), "decode: id ", id,
                  " at position ", i, " is not a token of this tiktoken encoding (vocabulary of ", vocab_size(), ")");
      out += bytes_[static_cast<size_t>(id)];
    }
    return out;
  }
  int64_t vocab_size() const override { return static_cast<int64_t>(bytes_.size()); }
  std::optional<int32_t> token_id(std::string_view special) const override {
    for (const auto& t : specials_.tokens())
      if (t.content == special) return t.id;
    return std::nullopt;
  }
  std::vector<std::string> special_tokens() const override {
    std::vector<std::string> out;
    for (const auto& t : specials_.tokens()) out.push_back(t.content);
    return out;
  }
  std::string serialized() const override { return serialized_; }

 private:
  std::string encoding_;
  std::optional<Regex> regex_;
  std::optional<BpeModel> model_;
  AddedTokenMatcher specials_;
  std::vector<std::string> bytes_;  // id -> bytes ("" for holes)
  std::string serialized_;
};

TiktokenTokenizer::TiktokenTokenizer(std::string ranks, const std::string& name,
                                     const std::optional<std::string>& sidecar, const std::string& origin) {
  const std::string where = "tiktoken file '" + origin + "'";
  // Pattern and special tokens: the sidecar, else the file's name (tiktoken.h).
  const Encoding* enc = encoding_of_name(name);
  std::string pattern = enc ? enc->pattern : "";
  std::vector<AddedToken> specials;
  if (enc)
    for (const auto& [content, id] : enc->specials) specials.push_back({content, id, true, false, false, false});
  json options = json::object();
  bool specials_from_file = false;
  if (sidecar) {
    try {
      options = io::parse_json(*sidecar, where + ": its sidecar JSON");  // Note [untrusted JSON]
      FORGE_CHECK(options.is_object(), where, ": its sidecar JSON is not an object");
      if (options.contains("pattern")) {
        const std::string p = options.at("pattern").get<std::string>();
        enc = nullptr;
        for (const auto& e : encodings())
          if (p == e.name) enc = &e;
        pattern = enc ? enc->pattern : p;
      }
      if (options.contains("special_tokens")) {
        specials_from_file = true;
        specials.clear();
        for (const auto& [content, id] : options.at("special_tokens").items())
          specials.push_back({content,
                              static_cast<int32_t>(io::json_integer(id, 0, kMaxVocabSize - 1,
                                                                    where + ": special token \"" + content + "\"")),
                              true, false, false, false});
      }
    } catch (const json::exception& e) {
      FORGE_THROW(where, ": its sidecar JSON is malformed: ", e.what(),
                  " (expected {\"pattern\": \"cl100k_base\" or a regex, \"special_tokens\": {\"<|endoftext|>\": id}})");
    }
  }
  FORGE_CHECK(!pattern.empty(), where,
              ": its pre-tokenizer pattern is unknown: name the file after its encoding (cl100k_base.tiktoken, "
              "o200k_base.tiktoken, p50k_base.tiktoken, r50k_base.tiktoken) or put a sidecar '",
              name, ".json' next to it: {\"pattern\": \"cl100k_base\" or a regex, \"special_tokens\": {...}}");
  encoding_ = enc ? enc->name : "";
  regex_.emplace(pattern, where);

  // Ranks: "base64 rank" per line, read whole before anything is allocated by rank (Note
  // [tokenizer file limits]).
  std::vector<std::pair<std::string, int32_t>> entries;
  int64_t size = 0;
  size_t line_no = 0;
  for (size_t pos = 0; pos < ranks.size();) {
    size_t end = ranks.find('\n', pos);
    if (end == std::string::npos) end = ranks.size();
    std::string_view line = std::string_view(ranks).substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    const auto tok = sp == std::string_view::npos ? std::nullopt : base64_decode(line.substr(0, sp));
    int64_t rank = -1;
    if (tok && !tok->empty() && sp + 1 < line.size()) {
      rank = 0;
      for (const char c : line.substr(sp + 1)) {
        if (c < '0' || c > '9' || rank >= (1 << 30)) {  // stop at once (-1 times ten, again and again, overflowed)
          rank = -1;
          break;
        }
        rank = rank * 10 + (c - '0');
      }
    }
    FORGE_CHECK(rank >= 0, where, ": line ", line_no, " is not \"<base64 token> <rank>\"");
    FORGE_CHECK(rank < kMaxVocabSize, where, ": line ", line_no, " gives rank ", rank, "; forge reads ranks below ",
                kMaxVocabSize, " (Note [tokenizer file limits])");
    // A token's every split is looked up below: a bound on its length bounds that work.
    FORGE_CHECK(static_cast<int64_t>(tok->size()) <= kMaxTokenBytes, where, ": line ", line_no, " holds a token of ",
                tok->size(), " bytes; forge reads tokens of up to ", kMaxTokenBytes, " bytes (Note [tokenizer file limits])");
    size = std::max(size, rank + 1);
    entries.emplace_back(std::move(*tok), static_cast<int32_t>(rank));
  }
  FORGE_CHECK(!entries.empty(), where, ": no ranks in the file");
  // (The special ids of a known encoding are forge's own table; a sidecar's are the file's.)
  int64_t special_max = 0;
  if (specials_from_file)
    for (const auto& s : specials) special_max = std::max<int64_t>(special_max, int64_t{s.id} + 1);
  check_vocabulary_size(std::max(size, special_max),
                        static_cast<int64_t>(entries.size() + (specials_from_file ? specials.size() : 0)), where);
  bytes_.resize(static_cast<size_t>(size));
  StringMap<int32_t> ids;
  for (auto& [tok, rank] : entries) {
    FORGE_CHECK(bytes_[static_cast<size_t>(rank)].empty(), where, ": rank ", rank, " is given twice");
    const auto [it, fresh] = ids.emplace(tok, rank);
    FORGE_CHECK(fresh, where, ": rank ", rank, " repeats the token of rank ", it->second);
    bytes_[static_cast<size_t>(rank)] = std::move(tok);
  }
  entries.clear();
  std::vector<std::string> keys = bytes_;
  // Merges: every split of a token into two tokens (bpe_model.h).
  std::vector<BpeMerge> merges;
  for (size_t id = 0; id < bytes_.size(); ++id) {
    const std::string_view t = bytes_[id];
    for (size_t i = 1; i < t.size(); ++i) {
      const auto l = ids.find(t.substr(0, i)), r = ids.find(t.substr(i));
      if (l != ids.end() && r != ids.end())
        merges.push_back({l->second, r->second, static_cast<int32_t>(id), static_cast<int32_t>(id)});
    }
  }
  for (const auto& s : specials) {
    FORGE_CHECK(s.id >= 0 && !s.content.empty(), where, ": special token \"", s.content, "\" has a bad id ", s.id);
    if (static_cast<size_t>(s.id) >= bytes_.size()) bytes_.resize(static_cast<size_t>(s.id) + 1);
    FORGE_CHECK(bytes_[static_cast<size_t>(s.id)].empty(), where, ": special token \"", s.content, "\" has id ", s.id,
                ", which a rank already has");
    bytes_[static_cast<size_t>(s.id)] = s.content;
  }
  keys.resize(bytes_.size());
  BpeModel::Options opt;
  opt.ignore_merges = true;
  model_.emplace(std::move(keys), merges, opt, where);
  json spec = json::object();
  for (const auto& s : specials) spec[s.content] = s.id;
  specials_ = AddedTokenMatcher(std::move(specials));
  // The run directory keeps a self-contained copy (Note [tokenizer files] in tokenizer.cpp).
  const json wrapper = {{"format", "forge-tokenizer-file"}, {"version", 1},   {"kind", "tiktoken"},
                        {"name", name},                     {"pattern", enc ? std::string(enc->name) : pattern},
                        {"special_tokens", spec},
                        {"base64", base64_encode(ranks)}};
  serialized_ = wrapper.dump() + "\n";
}

}  // namespace

std::optional<std::string> tiktoken_pattern(const std::string& encoding) {
  for (const auto& e : encodings())
    if (encoding == e.name) return std::string(e.pattern);
  return std::nullopt;
}

bool looks_like_tiktoken(const std::string& bytes) {
  const size_t nl = bytes.find('\n');
  const std::string_view line = std::string_view(bytes).substr(0, nl == std::string::npos ? bytes.size() : nl);
  const size_t sp = line.find(' ');
  if (sp == std::string_view::npos || sp == 0 || sp + 1 >= line.size()) return false;
  if (!base64_decode(line.substr(0, sp))) return false;
  for (const char c : line.substr(sp + 1))
    if (!(c >= '0' && c <= '9') && c != '\r') return false;
  return true;
}

std::shared_ptr<const Tokenizer> load_tiktoken(std::string ranks, const std::string& name,
                                               const std::optional<std::string>& sidecar, const std::string& origin) {
  return std::make_shared<TiktokenTokenizer>(std::move(ranks), name, sidecar, origin);
}

}  // namespace forge::data
