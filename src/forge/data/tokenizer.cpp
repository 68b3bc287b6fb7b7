// The Tokenizer interface's shared parts and load_tokenizer's file sniffing (tokenizer.h).
#include "forge/data/tokenizer.h"

#include <filesystem>
#include <new>
#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/data/base64.h"
#include "forge/data/bpe.h"
#include "forge/data/hf_tokenizer.h"
#include "forge/data/sentencepiece.h"
#include "forge/data/tiktoken.h"
#include "forge/io/atomic_file.h"
#include "forge/io/json_input.h"

namespace forge::data {

namespace fs = std::filesystem;

std::vector<int32_t> Tokenizer::encode_ordinary(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 16);
  encode_ordinary_into(text, out);
  return out;
}

int32_t Tokenizer::special_id(std::string_view special) const {
  if (const auto id = token_id(special)) return *id;
  const auto all = special_tokens();
  std::string some;
  for (size_t i = 0; i < all.size() && i < 8; ++i) some += (i ? ", \"" : "\"") + all[i] + "\"";
  if (all.size() > 8) some += ", ...";
  FORGE_THROW("\"", special, "\" is not a special token of this tokenizer (", describe(), "; its ", all.size(),
              " special token(s): ", all.empty() ? std::string("none") : some, ")");
}

std::optional<std::string> Tokenizer::eos_token() const {
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"})
    if (token_id(name)) return std::string(name);
  return std::nullopt;
}

void Tokenizer::save(const std::string& path) const { io::write_file_atomic(path, serialized()); }

std::string supported_tokenizer_kinds() {
  std::string s = "forge-bpe";
  if (have_regex_support()) s += ", hf, tiktoken";
  if (have_sentencepiece_support()) s += ", sentencepiece";
  return s;
}

namespace {

const char* kAccepted =
    "forge reads: a forge BPE JSON (`forge tokenize train`), a Hugging Face tokenizer.json with a BPE model, a "
    "tiktoken rank file (e.g. cl100k_base.tiktoken) and a sentencepiece .model";

// Note [tokenizer files]: the kind of a tokenizer file is told by its content, never by its
// name alone: a JSON object with "format": "forge-bpe" is forge's BPE; with "format":
// "forge-tokenizer-file", forge's wrapper around another kind's file (what a run directory
// keeps as tokenizer.json for tiktoken and sentencepiece: the file in base64 with its name
// and options, so the run is self-contained); with "model", a Hugging Face tokenizer.json.
// Not JSON: a first line "<base64> <number>" is a tiktoken rank file; bytes that start like a
// ModelProto (0x0A, a length, 0x0A) a sentencepiece model.
std::shared_ptr<const Tokenizer> from_wrapper(const nlohmann::json& j, const std::string& origin) {
  const std::string where = "tokenizer '" + origin + "'";
  const std::string kind = j.value("kind", "");
  const auto bytes = base64_decode(j.value("base64", ""));
  FORGE_CHECK(bytes.has_value(), where, ": its \"base64\" payload is not base64");
  const std::string name = j.value("name", "");
  if (kind == "tiktoken") {
    nlohmann::json options = nlohmann::json::object();
    if (j.contains("pattern")) options["pattern"] = j["pattern"];
    if (j.contains("special_tokens")) options["special_tokens"] = j["special_tokens"];
    return load_tiktoken(*bytes, name, options.dump(), origin);
  }
  if (kind == "sentencepiece") return load_sentencepiece(*bytes, name, origin);
  FORGE_THROW(where, ": unknown kind \"", kind, "\" in a forge tokenizer wrapper (expected tiktoken or sentencepiece)");
}

}  // namespace

namespace {

std::shared_ptr<const Tokenizer> tokenizer_of_kind(std::string bytes, const std::string& name, const std::string& origin,
                                                   const std::optional<std::string>& sidecar) {
  size_t first = 0;
  while (first < bytes.size() && (bytes[first] == ' ' || bytes[first] == '\n' || bytes[first] == '\r' ||
                                  bytes[first] == '\t'))
    ++first;
  if (first < bytes.size() && bytes[first] == '{') {
    nlohmann::json j;
    try {
      j = io::parse_json(bytes, "tokenizer '" + origin + "': it starts like JSON but does not parse");  // Note [untrusted JSON]
    } catch (const Error& e) {
      FORGE_THROW(e.what(), "; ", kAccepted);
    }
    const std::string format = j.is_object() ? j.value("format", "") : "";
    if (format == "forge-bpe") return std::make_shared<BpeTokenizer>(BpeTokenizer::from_json(bytes, origin));
    if (format == "forge-tokenizer-file") return from_wrapper(j, origin);
    if (j.is_object() && j.contains("model")) return load_hf_tokenizer(std::move(bytes), origin);
    FORGE_THROW("tokenizer '", origin, "': a JSON file that is neither forge's (\"format\": \"forge-bpe\") nor a ",
                "Hugging Face tokenizer.json (it has no \"model\"); ", kAccepted);
  }
  if (looks_like_tiktoken(bytes)) return load_tiktoken(std::move(bytes), name, sidecar, origin);
  if (looks_like_sentencepiece(bytes)) return load_sentencepiece(std::move(bytes), name, origin);
  FORGE_THROW("tokenizer '", origin, "' is not a tokenizer file forge knows (", bytes.empty() ? "it is empty" : "",
              bytes.empty() ? "; " : "", kAccepted, ")");
}

}  // namespace

std::shared_ptr<const Tokenizer> tokenizer_from_bytes(std::string bytes, const std::string& name,
                                                      const std::string& origin_or_empty,
                                                      const std::optional<std::string>& sidecar) {
  const std::string origin = origin_or_empty.empty() ? name : origin_or_empty;
  // A tokenizer file is untrusted input (issue 43): whatever a reader or a library under it throws
  // about the file (a JSON field of the wrong type, libsentencepiece's trie builder refusing an
  // empty piece) is a forge::Error naming the file, never an "internal error".
  try {
    return tokenizer_of_kind(std::move(bytes), name, origin, sidecar);
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const nlohmann::json::exception& e) {
    io::throw_json_error("tokenizer '" + origin + "'", e);
  } catch (const std::exception& e) {
    FORGE_THROW("tokenizer '", origin, "' cannot be read: ", e.what());
  }
}

std::shared_ptr<const Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  FORGE_CHECK(fs::is_regular_file(path, ec), "tokenizer '", path, "' does not exist or is not a file; ", kAccepted);
  std::string bytes;
  try {
    bytes = io::read_file(path);
  } catch (const std::exception& e) {
    FORGE_THROW("tokenizer '", path, "' cannot be read: ", e.what());
  }
  std::optional<std::string> sidecar;  // tiktoken's options (tiktoken.h)
  if (fs::is_regular_file(path + ".json", ec)) sidecar = io::read_file(path + ".json");
  return tokenizer_from_bytes(std::move(bytes), fs::path(path).filename().string(), path, sidecar);
}

void check_vocabulary_size(int64_t size, int64_t listed, const std::string& where) {
  FORGE_CHECK(size <= kMaxVocabSize, where, ": its largest id is ", size - 1, "; forge reads vocabularies of up to ",
              kMaxVocabSize, " ids (Note [tokenizer file limits])");
  FORGE_CHECK(size <= 2 * listed + kVocabSlack, where, ": its largest id is ", size - 1, " but it lists only ", listed,
              " tokens; ids so sparse are refused (Note [tokenizer file limits]: at most twice the tokens plus ",
              kVocabSlack, ")");
}

}  // namespace forge::data
