// Hugging Face tokenizer.json with a BPE model (hf_tokenizer.h): parsing, and the
// added tokens -> normalizer -> pre-tokenizer -> BPE -> decoder pipeline.
#include "forge/data/hf_tokenizer.h"

#include <nlohmann/json.hpp>
#include <optional>
#include <variant>

#include "forge/core/error.h"
#include "forge/data/added_tokens.h"
#include "forge/data/bpe_model.h"
#include "forge/data/bpe_tables.h"
#include "forge/data/regex.h"
#include "forge/data/unicode_normalize.h"
#include "forge/io/json_input.h"

namespace forge::data {

namespace {

using nlohmann::json;

// GPT-2's pattern: what a ByteLevel pre-tokenizer with use_regex splits with.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kMetaspace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK, sentencepiece's space

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  FORGE_CHECK(!from.empty(), "replace_all: an empty pattern");  // (refused when the file is read)
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string_view::npos; pos = hit + from.size()) {
    out.append(s.substr(pos, hit - pos));
    out.append(to);
  }
  out.append(s.substr(pos));
  return out;
}

std::string string_pattern(const json& pattern, const std::string& where) {
  FORGE_CHECK(pattern.is_object() && pattern.contains("String"), where,
              ": only string patterns are supported here (got ", pattern.dump(), ")");
  return pattern.at("String").get<std::string>();
}

std::string regex_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}-").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

// ---- normalizers -----------------------------------------------------------------------

struct Normalizer {
  enum class Kind { unicode, prepend, replace } kind;
  UnicodeForm form = UnicodeForm::nfc;
  std::string a, b;  // prepend: a; replace: a -> b
};

void parse_normalizer(const json& n, std::vector<Normalizer>& out, const std::string& where) {
  if (n.is_null()) return;
  const std::string type = n.at("type").get<std::string>();
  const std::pair<const char*, UnicodeForm> forms[] = {
      {"NFC", UnicodeForm::nfc}, {"NFD", UnicodeForm::nfd}, {"NFKC", UnicodeForm::nfkc}, {"NFKD", UnicodeForm::nfkd}};
  for (const auto& [name, form] : forms) {
    if (type == name) {
      check_unicode_normalization(form, where);
      out.push_back({Normalizer::Kind::unicode, form, "", ""});
      return;
    }
  }
  if (type == "Sequence") {
    for (const auto& m : n.at("normalizers")) parse_normalizer(m, out, where);
  } else if (type == "Prepend") {
    const std::string prepend = n.at("prepend").get<std::string>();
    FORGE_CHECK(prepend.size() <= 256, where, ": normalizer Prepend of ", prepend.size(),
                " bytes; forge reads up to 256 (real files prepend one character)");
    out.push_back({Normalizer::Kind::prepend, UnicodeForm::nfc, prepend, ""});
  } else if (type == "Replace") {
    // An empty pattern matches everywhere (replace_all would never advance); a long content makes
    // every match grow the text: both refused (real files replace one character by another).
    const std::string pattern = string_pattern(n.at("pattern"), where + ": Replace");
    const std::string content = n.at("content").get<std::string>();
    FORGE_CHECK(!pattern.empty(), where, ": normalizer Replace has an empty pattern (it would match everywhere)");
    FORGE_CHECK(pattern.size() <= 256 && content.size() <= 256, where, ": normalizer Replace of ", pattern.size(),
                " bytes by ", content.size(), " bytes; forge reads patterns and contents of up to 256 bytes");
    out.push_back({Normalizer::Kind::replace, UnicodeForm::nfc, pattern, content});
  } else {
    FORGE_THROW(where, ": normalizer \"", type,
                "\" is not supported (forge reads NFC, NFD, NFKC, NFKD, Prepend, Replace with a string pattern, and "
                "Sequence of those)");
  }
}

// ---- pre-tokenizers --------------------------------------------------------------------

struct PreStep {
  enum class Kind { split, prefix_space, metaspace } kind;
  std::optional<Regex> regex;  // split
  bool keep_gaps = true;       // split: "Isolated" keeps the text between matches
  std::string replacement;     // metaspace
  std::string prepend;         // metaspace: "always" | "first" | "never"
  bool split_words = false;    // metaspace: split before each replacement
};

void parse_pre_tokenizer(const json& p, std::vector<PreStep>& out, bool& byte_level, const std::string& where) {
  if (p.is_null()) return;
  const std::string type = p.at("type").get<std::string>();
  if (type == "Sequence") {
    for (const auto& q : p.at("pretokenizers")) parse_pre_tokenizer(q, out, byte_level, where);
  } else if (type == "ByteLevel") {
    byte_level = true;
    if (p.value("add_prefix_space", false)) out.push_back({PreStep::Kind::prefix_space, std::nullopt, true, "", "", false});
    if (p.value("use_regex", true))
      out.push_back({PreStep::Kind::split, Regex(kGpt2Pattern, where + ": ByteLevel"), true, "", "", false});
  } else if (type == "Split") {
    const json& pat = p.at("pattern");
    const std::string pattern = pat.contains("Regex") ? pat.at("Regex").get<std::string>()
                                                      : regex_escape(string_pattern(pat, where + ": Split"));
    const std::string behavior = p.value("behavior", "Isolated");
    const bool invert = p.value("invert", false);
    bool keep_gaps = true;
    if (behavior == "Isolated" && !invert) keep_gaps = true;
    else if (behavior == "Removed" && invert) keep_gaps = false;
    else
      FORGE_THROW(where, ": Split with behavior \"", behavior, "\" and invert ", invert,
                  " is not supported (forge reads \"Isolated\" without invert and \"Removed\" with invert)");
    out.push_back({PreStep::Kind::split, Regex(pattern, where + ": Split"), keep_gaps, "", "", false});
  } else if (type == "Metaspace") {
    std::string scheme = p.value("prepend_scheme", "");
    if (scheme.empty()) scheme = p.value("add_prefix_space", true) ? "always" : "never";
    FORGE_CHECK(scheme == "always" || scheme == "first" || scheme == "never", where, ": Metaspace prepend_scheme \"",
                scheme, "\" is not one of always, first, never");
    out.push_back({PreStep::Kind::metaspace, std::nullopt, true, p.value("replacement", std::string(kMetaspace)), scheme,
                   p.value("split", true)});
  } else {
    FORGE_THROW(where, ": pre-tokenizer \"", type,
                "\" is not supported (forge reads ByteLevel, Split, Metaspace and Sequence of those)");
  }
}

// ---- the tokenizer ---------------------------------------------------------------------

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(std::string file, const std::string& origin);

  std::string kind() const override { return "hf"; }
  std::string describe() const override {
    return std::string("Hugging Face ") + (byte_level_ ? "byte-level BPE" : "BPE") + ", " +
           std::to_string(vocab_size()) + " tokens";
  }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    encode_into(text, true, out);
    return out;
  }
  void encode_ordinary_into(std::string_view text, std::vector<int32_t>& out) const override {
    encode_into(text, false, out);
  }
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(decoded_.size()); }
  std::optional<int32_t> token_id(std::string_view special) const override {
    for (const auto& t : added_.tokens())
      if (t.content == special) return t.id;
    return std::nullopt;
  }
  std::vector<std::string> special_tokens() const override {
    std::vector<std::string> out;
    for (const auto& t : added_.tokens()) out.push_back(t.content);
    return out;
  }
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::string serialized() const override { return file_; }

 private:
  void encode_into(std::string_view text, bool with_special, std::vector<int32_t>& out) const;
  std::string normalize(std::string_view text) const;
  template <class F> void pre_tokenize(size_t step, std::string_view piece, bool first, F&& emit) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::string file_;
  std::vector<Normalizer> normalizers_;
  std::vector<PreStep> steps_;
  bool byte_level_ = false;
  bool split_at_metaspace_ = false;  // Note [sentencepiece-style words]
  std::optional<BpeModel> model_;
  AddedTokenMatcher added_;
  std::vector<std::string> decoded_;  // id -> bytes
  std::vector<bool> is_token_;        // id -> in the vocabulary or added
  size_t strip_spaces_ = 0;           // decoder: spaces stripped from the start of the output
  std::optional<int32_t> bos_;
};

HfTokenizer::HfTokenizer(std::string file, const std::string& origin) : file_(std::move(file)) {
  const std::string where = "Hugging Face tokenizer '" + origin + "'";
  const json j = io::parse_json(file_, where);  // Note [untrusted JSON]
  try {
    const json& model = j.at("model");
    const std::string type = model.value("type", "BPE");
    FORGE_CHECK(type == "BPE", where, ": model type \"", type,
                "\" is not supported (forge reads BPE models: GPT-2, LLaMA, Qwen, Mistral, ...)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      FORGE_CHECK(!model.contains(key) || model[key].is_null() || model[key].get<std::string>().empty(), where,
                  ": BPE ", key, " \"", model[key].get<std::string>(), "\" is not supported");
    parse_normalizer(j.value("normalizer", json()), normalizers_, where);
    parse_pre_tokenizer(j.value("pre_tokenizer", json()), steps_, byte_level_, where);

    // Vocabulary: ids, the key each token has in the text the model sees, and its bytes.
    // Note [tokenizer file limits]: every id an integer in range, the vocabulary not too sparse,
    // before anything is allocated by id.
    const json& vocab = model.at("vocab");
    FORGE_CHECK(vocab.is_object(), where, ": model.vocab is a JSON ", vocab.type_name(),
                ", not an object of token -> id");
    auto shown = [](const std::string& tok) { return tok.size() > 40 ? tok.substr(0, 37) + "..." : tok; };
    int64_t size = 0;
    for (const auto& [tok, id] : vocab.items())
      size = std::max<int64_t>(size, io::json_integer(id, 0, kMaxVocabSize - 1,
                                                      where + ": model.vocab[\"" + shown(tok) + "\"]") + 1);
    std::vector<AddedToken> added;
    const json added_json = j.value("added_tokens", json::array());
    FORGE_CHECK(added_json.is_array(), where, ": added_tokens is not an array");
    for (const auto& a : added_json) {
      FORGE_CHECK(a.is_object() && a.contains("content") && a["content"].is_string(), where,
                  ": an added token is not an object with a string \"content\"");
      const std::string content = a["content"].get<std::string>();
      const auto id = io::json_integer(a.contains("id") ? a["id"] : json(), 0, kMaxVocabSize - 1,
                                       where + ": the id of added token \"" + shown(content) + "\"");
      AddedToken t{content, static_cast<int32_t>(id), a.value("special", false),
                   a.value("lstrip", false), a.value("rstrip", false), a.value("single_word", false)};
      FORGE_CHECK(!t.content.empty(), where, ": an added token (id ", t.id, ") is empty");
      size = std::max<int64_t>(size, int64_t{t.id} + 1);
      added.push_back(std::move(t));
    }
    check_vocabulary_size(size, static_cast<int64_t>(vocab.size() + added.size()), where);
    std::vector<std::string> keys(static_cast<size_t>(size));
    decoded_.assign(static_cast<size_t>(size), "");
    is_token_.assign(static_cast<size_t>(size), false);
    StringMap<int32_t> unicode_to_byte;  // byte-level: the alphabet's characters -> bytes
    if (byte_level_)
      for (int b = 0; b < 256; ++b) unicode_to_byte.emplace(utf8(byte_level_char(static_cast<unsigned char>(b))), b);
    auto to_bytes = [&](const std::string& tok, std::string& bytes) {  // false: not in the alphabet
      bytes.clear();
      for (size_t pos = 0; pos < tok.size();) {
        const size_t n = std::max<size_t>(utf8_char_len(tok, pos), 1);
        const auto it = unicode_to_byte.find(std::string_view(tok).substr(pos, n));
        if (it == unicode_to_byte.end()) return false;
        bytes += static_cast<char>(it->second);
        pos += n;
      }
      return true;
    };
    std::string bytes;
    for (const auto& [tok, idj] : vocab.items()) {
      const auto id = static_cast<size_t>(idj.get<int32_t>());
      FORGE_CHECK(!is_token_[id], where, ": id ", id, " is given to two tokens");
      is_token_[id] = true;
      if (byte_level_) {
        if (to_bytes(tok, bytes)) keys[id] = decoded_[id] = bytes;
        else decoded_[id] = tok;  // no byte-level spelling: reachable only as an added token
      } else {
        keys[id] = tok;
        decoded_[id] = tok;
      }
    }

    // Merges: "a b" or ["a", "b"]; merge i has rank i and makes the token a + b.
    std::vector<BpeMerge> merges;
    const json& mj = model.value("merges", json::array());
    merges.reserve(mj.size());
    for (const auto& m : mj) {
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        FORGE_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, where, ": merge ",
                    merges.size(), " \"", s, "\" is not two tokens separated by one space");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        FORGE_CHECK(m.is_array() && m.size() == 2, where, ": merge ", merges.size(), " is not a pair");
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      }
      const auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
      FORGE_CHECK(ia != vocab.end() && ib != vocab.end() && iab != vocab.end(), where, ": merge ", merges.size(), " (\"",
                  a, "\", \"", b, "\") names a token that is not in the vocabulary");
      merges.push_back({ia->get<int32_t>(), ib->get<int32_t>(), iab->get<int32_t>(), static_cast<int32_t>(merges.size())});
    }

    BpeModel::Options opt;
    opt.symbols = byte_level_ ? BpeModel::Symbols::bytes : BpeModel::Symbols::chars;
    opt.ignore_merges = model.value("ignore_merges", false);
    opt.byte_fallback = model.value("byte_fallback", false);
    opt.fuse_unk = model.value("fuse_unk", false);
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      const auto it = vocab.find(model["unk_token"].get<std::string>());
      FORGE_CHECK(it != vocab.end(), where, ": unk_token \"", model["unk_token"].get<std::string>(),
                  "\" is not in the vocabulary");
      opt.unk_id = it->get<int32_t>();
    }

    // Note [sentencepiece-style words]: without a pre-tokenizer the model sees the whole
    // normalised text as one word (LLaMA-2). When no merge joins a token that ends in another
    // character to one that starts with the metaspace "▁", no merge can cross such a boundary,
    // so cutting the text there gives the same ids, and words short enough for the cache.
    if (steps_.empty() && !byte_level_ && !opt.ignore_merges) {
      bool crosses = false;
      for (const BpeMerge& m : merges) {
        const std::string& l = keys[static_cast<size_t>(m.left)];
        const std::string& r = keys[static_cast<size_t>(m.right)];
        const bool l_ends = l.size() >= 3 && l.compare(l.size() - 3, 3, kMetaspace) == 0;
        crosses = crosses || (r.rfind(kMetaspace, 0) == 0 && !l_ends);
      }
      split_at_metaspace_ = !crosses;
    }
    model_.emplace(std::move(keys), merges, opt, where);

    for (const auto& t : added) {
      decoded_[static_cast<size_t>(t.id)] = t.content;
      is_token_[static_cast<size_t>(t.id)] = true;
    }
    added_ = AddedTokenMatcher(std::move(added));

    // Decoder: which transformations the token strings get (folded into decoded_).
    bool space = false, bytes_fallback = false;
    std::function<void(const json&)> decoder = [&](const json& d) {
      if (d.is_null()) return;
      const std::string dt = d.at("type").get<std::string>();
      if (dt == "Sequence") {
        for (const auto& e : d.at("decoders")) decoder(e);
      } else if (dt == "Replace") {
        FORGE_CHECK(string_pattern(d.at("pattern"), where + ": decoder Replace") == kMetaspace &&
                        d.at("content").get<std::string>() == " ",
                    where, ": decoder Replace is supported as \"", kMetaspace, "\" -> \" \" only");
        space = true;
      } else if (dt == "ByteFallback") {
        bytes_fallback = true;
      } else if (dt == "Strip") {
        FORGE_CHECK(d.value("content", " ") == " " && d.value("stop", 0) == 0, where,
                    ": decoder Strip is supported for leading spaces only");
        strip_spaces_ += d.value("start", 0);
      } else if (dt == "Metaspace") {
        space = true;
        std::string scheme = d.value("prepend_scheme", "");
        if (scheme.empty()) scheme = d.value("add_prefix_space", true) ? "always" : "never";
        if (scheme != "never") strip_spaces_ += 1;
      } else if (dt != "ByteLevel" && dt != "Fuse") {
        FORGE_THROW(where, ": decoder \"", dt,
                    "\" is not supported (forge reads ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace)");
      }
    };
    decoder(j.value("decoder", json()));
    if (!byte_level_) {
      for (size_t id = 0; id < decoded_.size(); ++id) {
        std::string& s = decoded_[id];
        unsigned v = 0;
        if (bytes_fallback && s.size() == 6 && s.rfind("<0x", 0) == 0 && s[5] == '>' &&
            std::sscanf(s.c_str() + 3, "%2X", &v) == 1)
          s = std::string(1, static_cast<char>(v));
        else if (space)
          s = replace_all(s, kMetaspace, " ");
      }
    }

    // Post-processor: the bos token of the single-sequence template, if any.
    const json post = j.value("post_processor", json());
    if (post.is_object() && post.value("type", "") == "TemplateProcessing") {
      const json& single = post.at("single");
      if (!single.empty() && single[0].contains("SpecialToken"))
        bos_ = token_id(single[0]["SpecialToken"].at("id").get<std::string>());
    }
  } catch (const json::exception& e) {
    FORGE_THROW(where, ": malformed tokenizer file: ", e.what());
  }
}

std::string HfTokenizer::normalize(std::string_view text) const {
  std::string s(text);
  for (const Normalizer& n : normalizers_) {
    switch (n.kind) {
      case Normalizer::Kind::unicode: s = unicode_normalize(s, n.form); break;
      case Normalizer::Kind::prepend:
        if (!s.empty()) s.insert(0, n.a);
        break;
      case Normalizer::Kind::replace: s = replace_all(s, n.a, n.b); break;
    }
  }
  return s;
}

template <class F> void HfTokenizer::pre_tokenize(size_t k, std::string_view piece, bool first, F&& emit) const {
  if (piece.empty()) return;
  if (k == steps_.size()) {
    emit(piece);
    return;
  }
  const PreStep& st = steps_[k];
  switch (st.kind) {
    case PreStep::Kind::split:
      st.regex->split(piece, st.keep_gaps, [&](std::string_view p) { pre_tokenize(k + 1, p, first, emit); });
      return;
    case PreStep::Kind::prefix_space:
      if (piece[0] != ' ') {
        const std::string s = " " + std::string(piece);
        pre_tokenize(k + 1, s, first, emit);
      } else {
        pre_tokenize(k + 1, piece, first, emit);
      }
      return;
    case PreStep::Kind::metaspace: {
      std::string s = replace_all(piece, " ", st.replacement);
      if (st.prepend == "always" || (st.prepend == "first" && first))
        if (s.rfind(st.replacement, 0) != 0) s.insert(0, st.replacement);
      if (!st.split_words) {
        pre_tokenize(k + 1, s, first, emit);
        return;
      }
      size_t start = 0;
      for (size_t hit; (hit = s.find(st.replacement, start + 1)) != std::string::npos; start = hit)
        pre_tokenize(k + 1, std::string_view(s).substr(start, hit - start), first, emit);
      pre_tokenize(k + 1, std::string_view(s).substr(start), first, emit);
      return;
    }
  }
}

void HfTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (!split_at_metaspace_) {
    model_->encode_piece(word, out);
    return;
  }
  // Note [sentencepiece-style words]: cut before each "▁" that follows another character.
  constexpr std::string_view ms = kMetaspace;
  size_t start = 0, pos = 0;
  while ((pos = word.find(ms, pos)) != std::string_view::npos) {
    const bool after_other = pos > start && !(pos >= 3 && word.substr(pos - 3, 3) == ms);
    if (after_other) {
      model_->encode_piece(word.substr(start, pos - start), out);
      start = pos;
    }
    pos += ms.size();
  }
  if (start < word.size()) model_->encode_piece(word.substr(start), out);
}

void HfTokenizer::encode_into(std::string_view text, bool with_special, std::vector<int32_t>& out) const {
  bool first = true;
  auto encode_segment = [&](std::string_view seg) {
    auto emit = [&](std::string_view piece) { encode_word(piece, out); };
    if (normalizers_.empty()) {
      pre_tokenize(0, seg, first, emit);
    } else {
      const std::string norm = normalize(seg);
      pre_tokenize(0, norm, first, emit);
    }
  };
  if (added_.empty()) {
    encode_segment(text);
    return;
  }
  for (const auto& s : added_.split(text, with_special)) {
    if (s.id >= 0) out.push_back(s.id);
    else encode_segment(s.text);
    first = false;
  }
}

std::string HfTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    FORGE_CHECK(id >= 0 && id < vocab_size() && is_token_[static_cast<size_t>(id)], "decode: id ", id, " at position ",
                i, " is not a token of this Hugging Face tokenizer (vocabulary of ", vocab_size(), ")");
    out += decoded_[static_cast<size_t>(id)];
  }
  size_t n = 0;
  while (n < strip_spaces_ && n < out.size() && out[n] == ' ') ++n;
  out.erase(0, n);
  return out;
}

}  // namespace

char32_t byte_level_char(unsigned char b) {
  auto printable = [](unsigned c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174); };
  if (printable(b)) return b;
  char32_t n = 0;  // the others take 256, 257, ... in byte order
  for (unsigned c = 0; c < b; ++c)
    if (!printable(c)) ++n;
  return 256 + n;
}

std::shared_ptr<const Tokenizer> load_hf_tokenizer(std::string json, const std::string& origin) {
  return std::make_shared<HfTokenizer>(std::move(json), origin);
}

}  // namespace forge::data
