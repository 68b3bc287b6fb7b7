// sentencepiece .model files through libsentencepiece (sentencepiece.h); compiled in with
// FORGE_WITH_SENTENCEPIECE.
#include "forge/data/sentencepiece.h"

#include <nlohmann/json.hpp>
#include <optional>

#include "forge/core/error.h"
#include "forge/data/added_tokens.h"
#include "forge/data/base64.h"
#include "forge/data/regex.h"

#if FORGE_WITH_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace forge::data {

namespace {

// ---- the protobuf wire format, just enough to read and set add_dummy_prefix ------------

bool read_varint(std::string_view s, size_t& pos, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && pos < s.size(); shift += 7) {
    const auto b = static_cast<unsigned char>(s[pos++]);
    v |= uint64_t(b & 0x7F) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

void write_varint(std::string& out, uint64_t v) {
  do {
    const auto b = static_cast<unsigned char>(v & 0x7F);
    v >>= 7;
    out += static_cast<char>(v ? (b | 0x80) : b);
  } while (v);
}

// Calls f(field, wire type, begin, end) for each field of a message ([begin, end) is the
// payload of a length-delimited field, else the value's bytes). False on malformed input.
template <class F> bool for_each_field(std::string_view s, F&& f) {
  size_t pos = 0;
  while (pos < s.size()) {
    uint64_t key = 0, v = 0;
    if (!read_varint(s, pos, key)) return false;
    const auto field = static_cast<uint32_t>(key >> 3);
    const auto wire = static_cast<uint32_t>(key & 7);
    const size_t start = pos;
    if (wire == 0) {
      if (!read_varint(s, pos, v)) return false;
      f(field, wire, start, pos);
    } else if (wire == 1 || wire == 5) {
      pos += wire == 1 ? 8 : 4;
      if (pos > s.size()) return false;
      f(field, wire, start, pos);
    } else if (wire == 2) {
      if (!read_varint(s, pos, v) || v > s.size() - pos) return false;
      f(field, wire, pos, pos + v);
      pos += v;
    } else {
      return false;
    }
  }
  return true;
}

constexpr uint32_t kNormalizerSpec = 3;  // ModelProto.normalizer_spec
constexpr uint32_t kAddDummyPrefix = 3;  // NormalizerSpec.add_dummy_prefix (default true)

bool add_dummy_prefix(std::string_view model) {
  bool value = true;
  for_each_field(model, [&](uint32_t field, uint32_t wire, size_t b, size_t e) {
    if (field != kNormalizerSpec || wire != 2) return;
    for_each_field(model.substr(b, e - b), [&](uint32_t f2, uint32_t w2, size_t b2, size_t) {
      if (f2 == kAddDummyPrefix && w2 == 0) value = model[b + b2] != 0;
    });
  });
  return value;
}

// The model with normalizer_spec.add_dummy_prefix = false (a later field value wins).
std::string without_dummy_prefix(const std::string& model) {
  std::string out;
  bool done = false;
  size_t copied = 0;
  for_each_field(model, [&](uint32_t field, uint32_t wire, size_t b, size_t e) {
    if (done || field != kNormalizerSpec || wire != 2) return;
    size_t key_start = b - 1;  // back over the length varint and the one-byte key
    while (key_start > 0 && (static_cast<unsigned char>(model[key_start - 1]) & 0x80)) --key_start;
    --key_start;
    out.append(model, copied, key_start - copied);
    std::string spec = model.substr(b, e - b) + std::string("\x18\x00", 2);
    out += static_cast<char>((kNormalizerSpec << 3) | 2);
    write_varint(out, spec.size());
    out += spec;
    copied = e;
    done = true;
  });
  out.append(model, copied);
  if (!done) {
    out += static_cast<char>((kNormalizerSpec << 3) | 2);
    out += std::string("\x02\x18\x00", 3);
  }
  return out;
}

}  // namespace

bool looks_like_sentencepiece(const std::string& bytes) {
  // ModelProto starts with its pieces (field 1), each a message whose first field is the
  // piece string (field 1).
  if (bytes.size() < 4 || bytes[0] != 0x0A) return false;
  size_t pos = 1;
  uint64_t len = 0;
  return read_varint(bytes, pos, len) && len <= bytes.size() - pos && pos < bytes.size() && bytes[pos] == 0x0A;
}

#if FORGE_WITH_SENTENCEPIECE

bool have_sentencepiece_support() { return true; }

namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::string model, const std::string& name, const std::string& origin)
      : model_(std::move(model)) {
    const std::string where = "sentencepiece model '" + origin + "'";
    const auto st = sp_.LoadFromSerializedProto(model_);
    FORGE_CHECK(st.ok(), where, ": libsentencepiece cannot read it: ", st.ToString());
    const auto st2 = sp_cont_.LoadFromSerializedProto(without_dummy_prefix(model_));
    FORGE_CHECK(st2.ok(), where, ": libsentencepiece cannot read it without its dummy prefix: ", st2.ToString());
    dummy_prefix_ = add_dummy_prefix(model_);
    const int n = sp_.GetPieceSize();
    pieces_.resize(static_cast<size_t>(n));
    std::vector<AddedToken> controls;
    for (int id = 0; id < n; ++id) {
      std::string p = sp_.IdToPiece(id);
      unsigned v = 0;
      if (sp_.IsControl(id)) {
        if (!p.empty()) controls.push_back({p, id, true, false, false, false});
        p.clear();
      } else if (sp_.IsUnknown(id)) {
        p = " \xE2\x81\x87 ";  // " ⁇ ", sentencepiece's rendering of the unknown piece
      } else if (sp_.IsByte(id) && std::sscanf(p.c_str(), "<0x%2X>", &v) == 1) {
        p = std::string(1, static_cast<char>(v));
        byte_ids_[v] = id;
      } else {
        std::string spaced;  // "▁" -> " "
        for (size_t k = 0; k < p.size(); ++k) {
          if (p.compare(k, 3, "\xE2\x96\x81") == 0) {
            spaced += ' ';
            k += 2;
          } else {
            spaced += p[k];
          }
        }
        p = std::move(spaced);
      }
      pieces_[static_cast<size_t>(id)] = std::move(p);
    }
    controls_ = AddedTokenMatcher(std::move(controls));
    nlohmann::json wrapper = {{"format", "forge-tokenizer-file"},
                              {"version", 1},
                              {"kind", "sentencepiece"},
                              {"name", name},
                              {"base64", base64_encode(model_)}};
    serialized_ = wrapper.dump() + "\n";
  }

  std::string kind() const override { return "sentencepiece"; }
  std::string describe() const override { return "sentencepiece model, " + std::to_string(vocab_size()) + " pieces"; }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    for (const auto& s : controls_.split(text, true)) {
      if (s.id >= 0) out.push_back(s.id);
      else encode_ordinary_into(s.text, out);
    }
    return out;
  }
  void encode_ordinary_into(std::string_view text, std::vector<int32_t>& out) const override {
    bool first = true;
    std::vector<int> ids;
    for_each_utf8_run(text, [&](std::string_view run, bool valid) {
      if (valid) {
        const auto st = (first ? sp_ : sp_cont_).Encode(run, &ids);
        FORGE_CHECK(st.ok(), "sentencepiece: encoding failed: ", st.ToString());
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        for (const unsigned char c : run) out.push_back(byte_ids_[c] >= 0 ? byte_ids_[c] : sp_.unk_id());
      }
      first = false;
    });
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      FORGE_CHECK(ids[i] >= 0 && ids[i] < vocab_size(), "decode: id ", ids[i], " at position ", i,
                  " is outside the sentencepiece vocabulary [0, ", vocab_size(), ")");
      out += pieces_[static_cast<size_t>(ids[i])];
    }
    if (dummy_prefix_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
  }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  std::optional<int32_t> token_id(std::string_view special) const override {
    for (const auto& t : controls_.tokens())
      if (t.content == special) return t.id;
    return std::nullopt;
  }
  std::vector<std::string> special_tokens() const override {
    std::vector<std::string> out;
    for (const auto& t : controls_.tokens()) out.push_back(t.content);
    return out;
  }
  std::optional<int32_t> bos_id() const override {
    return sp_.bos_id() >= 0 ? std::optional<int32_t>(sp_.bos_id()) : std::nullopt;
  }
  std::optional<std::string> eos_token() const override {
    if (sp_.eos_id() >= 0 && token_id(sp_.IdToPiece(sp_.eos_id()))) return sp_.IdToPiece(sp_.eos_id());
    return Tokenizer::eos_token();
  }
  std::string serialized() const override { return serialized_; }

 private:
  std::string model_, serialized_;
  sentencepiece::SentencePieceProcessor sp_, sp_cont_;  // as in the file; without the dummy prefix
  bool dummy_prefix_ = true;
  std::vector<std::string> pieces_;  // id -> decoded bytes
  std::array<int32_t, 256> byte_ids_ = [] {
    std::array<int32_t, 256> a{};
    a.fill(-1);
    return a;
  }();
  AddedTokenMatcher controls_;
};

}  // namespace

std::shared_ptr<const Tokenizer> load_sentencepiece(std::string model, const std::string& name,
                                                    const std::string& origin) {
  return std::make_shared<SentencePieceTokenizer>(std::move(model), name, origin);
}

#else

bool have_sentencepiece_support() { return false; }

std::shared_ptr<const Tokenizer> load_sentencepiece(std::string, const std::string&, const std::string& origin) {
  FORGE_THROW("sentencepiece model '", origin, "': reading .model files needs libsentencepiece, and this forge was "
              "built without it: install libsentencepiece-dev (scripts/install-deps.sh) and configure again");
}

#endif

}  // namespace forge::data
