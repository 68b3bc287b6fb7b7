// Tokenizer files of other projects (data/tokenizer.h): ids identical to the reference
// implementations on real published files (golden ids in tests/data/tokenizers/golden, made by
// benchmarks/tokenizers/oracle_node.mjs and oracle_spm.py), lossless round trips, invalid
// UTF-8, threads, the run-directory wrapper, sidecars and errors.
//
// The real files come from scripts/fetch-tokenizer-fixtures.sh (run by scripts/install-deps.sh,
// so by `make test`) into FORGE_TOKENIZER_FIXTURES (default .fixtures/tokenizers).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "data/data_testing.h"
#include "forge/forge.h"
#include "forge/run/run_data.h"
#include "testing/tensor_testing.h"

namespace forge::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using forge::testing::error_of;
using forge::testing::TempDir;

std::string fixtures_dir() {
  const char* env = std::getenv("FORGE_TOKENIZER_FIXTURES");
  return env && *env ? env : FORGE_TOKENIZER_FIXTURES;
}
std::string fixture(const std::string& name) { return fixtures_dir() + "/" + name; }
std::string testdata(const std::string& name) { return std::string(FORGE_TOKENIZER_TESTDATA) + "/" + name; }

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}
std::vector<std::string> corpus() { return read_json(testdata("corpus.json")).get<std::vector<std::string>>(); }

// A missing fixture fails the test (a skip would count as a pass): the fixtures are part of the
// test, fetched by scripts/install-deps.sh, which the README's test command runs.
#define REQUIRE_FIXTURE(path)                                                                                \
  if (!fs::exists(path))                                                                                     \
  FAIL() << path << " is missing: run scripts/fetch-tokenizer-fixtures.sh (scripts/install-deps.sh does)"

struct Case {
  const char* file;    // under the fixtures directory
  const char* golden;  // under tests/data/tokenizers/golden
};
const Case kCases[] = {
    {"gpt2/tokenizer.json", "gpt2_tokenizer_json.json"},
    {"llama2/tokenizer.json", "llama2_tokenizer_json.json"},
    {"llama3/tokenizer.json", "llama3_tokenizer_json.json"},
    {"qwen2_5/tokenizer.json", "qwen2_5_tokenizer_json.json"},
    {"cl100k_base.tiktoken", "cl100k_base_tiktoken.json"},
    {"o200k_base.tiktoken", "o200k_base_tiktoken.json"},
    {"llama2-model/tokenizer.model", "llama2-model_tokenizer_model.json"},
};

std::shared_ptr<const Tokenizer> load_case(const Case& c) {
  static std::map<std::string, std::shared_ptr<const Tokenizer>> cache;
  auto& t = cache[c.file];
  if (!t) t = load_tokenizer(fixture(c.file));
  return t;
}

class TokenizerFiles : public ::testing::TestWithParam<Case> {};

// The ids of every corpus text are the reference implementation's.
TEST_P(TokenizerFiles, IdsMatchTheReference) {
  const Case& c = GetParam();
  REQUIRE_FIXTURE(fixture(c.file));
  const auto tok = load_case(c);
  const auto texts = corpus();
  const json golden = read_json(testdata(std::string("golden/") + c.golden));
  int compared = 0;
  for (const char* key : {"encode", "encode_ordinary"}) {
    if (!golden.contains(key)) continue;
    const auto& want = golden[key];
    ASSERT_EQ(want.size(), texts.size()) << c.golden << " was made from another corpus: regenerate it";
    for (size_t i = 0; i < texts.size(); ++i) {
      if (want[i].is_null()) continue;  // the oracle is known to differ from the Rust reference there
      const auto ids = std::string(key) == "encode" ? tok->encode(texts[i]) : tok->encode_ordinary(texts[i]);
      EXPECT_EQ(ids, want[i].get<std::vector<int32_t>>()) << c.file << " " << key << " of text " << i << ": \""
                                                          << texts[i] << "\"";
      ++compared;
    }
  }
  EXPECT_GT(compared, 40) << c.golden;
}

// decode(encode(x)) == x on the corpus (but for Qwen's NFC, which changes decomposed text, and
// a literal "▁" in sentencepiece-style text, which decodes as the space it stands for).
TEST_P(TokenizerFiles, RoundTripsTheCorpus) {
  const Case& c = GetParam();
  REQUIRE_FIXTURE(fixture(c.file));
  const auto tok = load_case(c);
  for (const auto& text : corpus()) {
    if (std::string(c.file).rfind("qwen", 0) == 0 && text.find("\xCC") != std::string::npos) continue;
    if (std::string(c.file).find("llama2") != std::string::npos && text.find("\xE2\x96\x81") != std::string::npos)
      continue;
    EXPECT_EQ(tok->decode(tok->encode_ordinary(text)), text) << c.file;
  }
}

// Any bytes survive encode -> decode, invalid UTF-8 included (Note [invalid UTF-8]).
TEST_P(TokenizerFiles, RoundTripsInvalidUtf8AndRandomBytes) {
  const Case& c = GetParam();
  REQUIRE_FIXTURE(fixture(c.file));
  const auto tok = load_case(c);
  const std::vector<std::string> cases = {"\xFF", "Hello\xFF\xFEworld", "caf\xC3", "\xE4\xBD", " \xED\xA0\x80 x",
                                          "\xC0\xAF overlong", "a\x80\x80\x80 b", std::string("nul\0byte", 8)};
  for (const auto& s : cases) EXPECT_EQ(tok->decode(tok->encode_ordinary(s)), s) << c.file;
  std::mt19937 rng(7);
  for (int k = 0; k < 50; ++k) {
    std::string s(static_cast<size_t>(rng() % 64), '\0');
    for (auto& ch : s) ch = static_cast<char>(rng() % 256);
    if (std::string(c.file).find("llama2") != std::string::npos && !s.empty() && s[0] == ' ') s[0] = 'x';
    EXPECT_EQ(tok->decode(tok->encode_ordinary(s)), s) << c.file << " random bytes " << k;
  }
}

// Several threads encoding at once get the same ids as one (the streaming encoder's use).
TEST_P(TokenizerFiles, EncodesFromSeveralThreads) {
  const Case& c = GetParam();
  REQUIRE_FIXTURE(fixture(c.file));
  const auto tok = load_case(c);
  std::string text;
  for (const auto& t : corpus()) text += t + "\n";
  const auto want = tok->encode_ordinary(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < 3; ++r) got[t] = tok->encode_ordinary(text);
    });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, want) << c.file;
}

// What a run directory keeps (serialized(), saved as tokenizer.json) loads back the same.
TEST_P(TokenizerFiles, SerializedFormLoadsBackTheSame) {
  const Case& c = GetParam();
  REQUIRE_FIXTURE(fixture(c.file));
  const auto tok = load_case(c);
  TempDir dir;
  tok->save(dir.file("tokenizer.json"));
  const auto back = load_tokenizer(dir.file("tokenizer.json"));
  EXPECT_EQ(back->kind(), tok->kind());
  EXPECT_EQ(back->vocab_size(), tok->vocab_size());
  EXPECT_EQ(back->serialized(), tok->serialized());
  const std::string text = corpus()[7] + "<|endoftext|></s>";
  EXPECT_EQ(back->encode(text), tok->encode(text));
}

INSTANTIATE_TEST_SUITE_P(Real, TokenizerFiles, ::testing::ValuesIn(kCases), [](const auto& info) {
  std::string n = info.param.golden;
  n = n.substr(0, n.size() - 5);
  for (auto& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
});

// On byte-level files, text = a + invalid + b encodes as a, the bytes, b (Note [invalid UTF-8]).
TEST(TokenizerFilesInvalidUtf8, ValidPartsEncodeAsTheReferenceWould) {
  for (const char* file : {"gpt2/tokenizer.json", "llama3/tokenizer.json", "cl100k_base.tiktoken"}) {
    REQUIRE_FIXTURE(fixture(file));
    const auto tok = load_tokenizer(fixture(file));
    const std::string a = "Hello world, this is   ", b = "  more text's here 123";
    auto ids = tok->encode_ordinary(a);
    for (const char* bad : {"\xFF", "\xE4\xBD"}) {
      auto want = ids;
      const auto mid = tok->encode_ordinary(bad);
      EXPECT_EQ(tok->decode(mid), bad);
      want.insert(want.end(), mid.begin(), mid.end());
      const auto tail = tok->encode_ordinary(b);
      want.insert(want.end(), tail.begin(), tail.end());
      EXPECT_EQ(tok->encode_ordinary(a + bad + b), want) << file;
    }
  }
}

TEST(TokenizerFilesSpecials, EncodeSplitsThemEncodeOrdinaryDoesNot) {
  REQUIRE_FIXTURE(fixture("gpt2/tokenizer.json"));
  const auto tok = load_tokenizer(fixture("gpt2/tokenizer.json"));
  EXPECT_EQ(tok->special_id("<|endoftext|>"), 50256);
  EXPECT_EQ(tok->encode("a<|endoftext|>b"), (std::vector<int32_t>{64, 50256, 65}));
  EXPECT_NE(tok->encode_ordinary("a<|endoftext|>b"), tok->encode("a<|endoftext|>b"));
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_NE(error_of([&] { tok->special_id("</s>"); }).find("is not a special token"), std::string::npos);
  REQUIRE_FIXTURE(fixture("llama2/tokenizer.json"));
  const auto sp = load_tokenizer(fixture("llama2/tokenizer.json"));
  EXPECT_EQ(sp->bos_id(), std::optional<int32_t>(1));  // its TemplateProcessing's <s>
  EXPECT_EQ(sp->special_id("</s>"), 2);
}

// Merges written as ["a", "b"] pairs (newer tokenizer.json files) read like "a b" strings.
TEST(TokenizerFilesHf, MergesAsPairs) {
  REQUIRE_FIXTURE(fixture("gpt2/tokenizer.json"));
  json j = read_json(fixture("gpt2/tokenizer.json"));
  for (auto& m : j["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    m = json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  const auto pairs = tokenizer_from_bytes(j.dump(), "tokenizer.json");
  const auto strings = load_tokenizer(fixture("gpt2/tokenizer.json"));
  for (const auto& t : corpus()) EXPECT_EQ(pairs->encode(t), strings->encode(t));
}

// Hugging Face's added-token flags: lstrip/rstrip take the whitespace around the token.
TEST(TokenizerFilesHf, AddedTokenFlags) {
  const json j = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {" ", 2}}}, {"merges", json::array()}}},
                  {"added_tokens", json::array({{{"id", 3}, {"content", "<m>"}, {"special", true}, {"lstrip", true},
                                                 {"rstrip", true}}})}};
  const auto tok = tokenizer_from_bytes(j.dump(), "tokenizer.json");
  EXPECT_EQ(tok->encode("a  <m>  b"), (std::vector<int32_t>{0, 3, 1}));
  EXPECT_EQ(tok->encode("a <m>b"), (std::vector<int32_t>{0, 3, 1}));
}

TEST(TokenizerFilesTiktoken, SidecarGivesPatternAndSpecials) {
  REQUIRE_FIXTURE(fixture("cl100k_base.tiktoken"));
  TempDir dir;
  fs::copy_file(fixture("cl100k_base.tiktoken"), dir.file("ranks.tiktoken"));
  EXPECT_NE(error_of([&] { load_tokenizer(dir.file("ranks.tiktoken")); }).find("sidecar"), std::string::npos);
  forge::testing::write_bytes(dir.file("ranks.tiktoken.json"),
                             R"({"pattern": "cl100k_base", "special_tokens": {"<|endoftext|>": 100257}})");
  const auto tok = load_tokenizer(dir.file("ranks.tiktoken"));
  const auto ref = load_tokenizer(fixture("cl100k_base.tiktoken"));
  const std::string text = corpus()[8] + "<|endoftext|>";
  EXPECT_EQ(tok->encode(text), ref->encode(text));
  EXPECT_EQ(tok->special_tokens(), std::vector<std::string>{"<|endoftext|>"});
}

TEST(TokenizerFilesErrors, BadFilesNameTheFileAndTheKinds) {
  TempDir dir;
  auto err = [&](const std::string& name, const std::string& content) {
    forge::testing::write_bytes(dir.file(name), content);
    return error_of([&] { load_tokenizer(dir.file(name)); });
  };
  auto has = [](const std::string& msg, const std::string& what) {
    EXPECT_NE(msg.find(what), std::string::npos) << "'" << what << "' not in: " << msg;
  };
  has(error_of([&] { load_tokenizer(dir.file("missing.json")); }), "does not exist");
  has(err("empty.bin", ""), "is not a tokenizer file forge knows");
  has(err("junk.bin", "\x01\x02garbage"), "a Hugging Face tokenizer.json");
  has(err("other.json", R"({"vocab": {}})"), "has no \"model\"");
  has(err("broken.json", R"({"model": )"), "does not parse");
  has(err("wordpiece.json", R"({"model": {"type": "WordPiece", "vocab": {}}})"), "model type \"WordPiece\"");
  has(err("lower.json", R"({"normalizer": {"type": "Lowercase"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})"),
      "normalizer \"Lowercase\" is not supported");
  has(err("regex.json",
          R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"},
              "model": {"type": "BPE", "vocab": {}, "merges": []}})"),
      "does not compile");
  has(err("merge.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})"),
      "names a token that is not in the vocabulary");
  has(err("cl100k_base.tiktoken", "IQ== 0\nnot base64 at all\n"), "line 2");
  has(err("custom.tiktoken", "IQ== 0\nIg== 1\n"), "sidecar");
  has(err("bad.model", std::string("\x0A\x05\x0A\x03\x61\x62\x63\xFF\xFF", 9)), "sentencepiece");
}

}  // namespace
}  // namespace forge::data

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using forge::testing::TempDir;

// The trainer's data path with a Hugging Face file: data.tokenizer is loaded (and kept in the
// run directory as tokenizer.json), data.eos_token is one of its added tokens, and the
// streaming encoder writes the reference's ids followed by the eos id per document.
TEST(TokenizerFilesTrainer, DataPathWithAHuggingFaceTokenizer) {
  const std::string file = data::fixture("gpt2/tokenizer.json");
  REQUIRE_FIXTURE(file);
  TempDir dir;
  RunConfig cfg;
  cfg.run.dir = dir.path().string();
  fs::create_directories(dir.file("run"));
  cfg.data.tokenizer = file;
  cfg.data.eos_token = "<|endoftext|>";
  std::ostringstream log;
  const auto tok = load_or_train_tokenizer(cfg, {}, std::nullopt, log);
  EXPECT_NE(log.str().find("Hugging Face byte-level BPE, 50257 tokens"), std::string::npos) << log.str();
  EXPECT_EQ(data::load_tokenizer(dir.file("run/tokenizer.json"))->serialized(), tok->serialized());
  const auto texts = data::corpus();
  forge::testing::write_bytes(dir.file("a.txt"), texts[4]);
  const auto shards = encode_files_to_shards(*tok, {dir.file("a.txt")}, dir.file("shards"), nullptr, "text",
                                             cfg.data.eos_token);
  ASSERT_EQ(shards.size(), 1u);
  auto want = data::read_json(data::testdata("golden/gpt2_tokenizer_json.json"))["encode"][4].get<std::vector<int32_t>>();
  want.push_back(50256);
  EXPECT_EQ(data::TokenShard(shards[0]).to_vector(), want);
}

}  // namespace
}  // namespace forge::train
