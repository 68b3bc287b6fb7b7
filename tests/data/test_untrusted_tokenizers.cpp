// Note [tokenizer file limits] (data/tokenizer.h): tokenizer files are untrusted input. Issue 43's
// regressions, each of which used to write out of bounds, allocate gigabytes or take seconds from
// a file of a few bytes, now a clean error naming the file and the field, at once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>

#include "forge/data/base64.h"
#include "forge/data/tokenizer.h"
#include "testing/tensor_testing.h"

namespace forge::testing {
namespace {

namespace fs = std::filesystem;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "looked for: " << (needle) << "\nin: " << (haystack)

class UntrustedTokenizers : public ::testing::Test {
 protected:
  fs::path dir_ = fs::temp_directory_path() / ("forge_untrusted_tok_" + std::to_string(::getpid()));
  void SetUp() override { fs::create_directories(dir_); }
  void TearDown() override { fs::remove_all(dir_); }
  // Loads `bytes` as the tokenizer file `name`: the error message, quickly ("<no error>" if none).
  std::string load(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e = error_of([&] { data::load_tokenizer((dir_ / name).string()); });
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0) << name;
    return e;
  }
};

// The 59-byte tokenizer.json of the issue wrote 8 bytes before a heap block; every bad id now is
// an error naming the token and the value.
TEST_F(UntrustedTokenizers, HuggingFaceIdsAreIntegersInRange) {
  for (const char* id : {"-1", "-2147483648", "9223372036854775807", "18446744073709551615", "1e39", "-1.5", "\"3\"",
                         "null", "2.0"}) {
    SCOPED_TRACE(id);
    const std::string e =
        load("tokenizer.json", std::string(R"({"model":{"type":"BPE","vocab":{"a":0,"b":)") + id + R"(},"merges":[]}})");
    EXPECT_HAS(e, "tokenizer.json");
    EXPECT_HAS(e, "model.vocab[\"b\"] must be an integer in [0, 16777215]");
  }
  // An id of 1e8 in a 2-token file asked for 7 GB.
  std::string e = load("sparse.json", R"({"model":{"type":"BPE","vocab":{"a":0,"b":100000000},"merges":[]}})");
  EXPECT_HAS(e, "model.vocab[\"b\"] must be an integer in [0, 16777215], got 100000000");
  e = load("sparse2.json", R"({"model":{"type":"BPE","vocab":{"a":0,"b":5000000},"merges":[]}})");
  EXPECT_HAS(e, "its largest id is 5000000 but it lists only 2 tokens");
  e = load("added.json", R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[{"content":"<x>","id":-7}]})");
  EXPECT_HAS(e, "the id of added token \"<x>\" must be an integer in [0, 16777215], got -7");
  e = load("added2.json", R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[{"id":3}]})");
  EXPECT_HAS(e, "an added token is not an object with a string \"content\"");
  e = load("vocab_array.json", R"({"model":{"type":"BPE","vocab":[1,2],"merges":[]}})");
  EXPECT_HAS(e, "model.vocab is a JSON array, not an object");
  // A good one still loads.
  EXPECT_EQ(load("good.json", R"({"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}})"), "<no error>");
}

// A Replace normalizer with an empty pattern looped forever (or grew to 4 GB).
TEST_F(UntrustedTokenizers, AnEmptyReplacePatternIsRefused) {
  auto with = [](const std::string& normalizer) {
    return R"({"normalizer":)" + normalizer + R"(,"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":[]}})";
  };
  std::string e = load("empty.json", with(R"({"type":"Replace","pattern":{"String":""},"content":"x"})"));
  EXPECT_HAS(e, "normalizer Replace has an empty pattern");
  e = load("seq.json", with(R"({"type":"Sequence","normalizers":[{"type":"Replace","pattern":{"String":""},"content":"y"}]})"));
  EXPECT_HAS(e, "normalizer Replace has an empty pattern");
  e = load("long.json", with(R"({"type":"Replace","pattern":{"String":"a"},"content":")" + std::string(1000, 'z') + R"("})"));
  EXPECT_HAS(e, "normalizer Replace of 1 bytes by 1000 bytes");
  EXPECT_EQ(load("fine.json", with(R"({"type":"Replace","pattern":{"String":" "},"content":"a"})")), "<no error>");
}

// tiktoken: a 22-byte file of rank 1e8 asked for 7 GB; a special id of 1e8 the same; one line of
// 270 KB took 14 s (every split of the token looked up).
TEST_F(UntrustedTokenizers, TiktokenRanksAndTokensAreBounded) {
  std::string e = load("cl100k_base.tiktoken", "YQ== 0\nYg== 100000000\n");
  EXPECT_HAS(e, "cl100k_base.tiktoken");
  EXPECT_HAS(e, "gives rank 100000000; forge reads ranks below 16777216");
  e = load("r50k_base.tiktoken", "YQ== 0\nYg== 9000000\n");
  EXPECT_HAS(e, "its largest id is 9000000 but it lists only 2 tokens");  // (a known encoding's specials are forge's)
  const std::string ranks = "YQ== 0\nYg== 1\n";
  std::ofstream(dir_ / "custom.tiktoken.json") << R"({"pattern": "cl100k_base", "special_tokens": {"<|x|>": 100000000}})";
  e = load("custom.tiktoken", ranks);
  EXPECT_HAS(e, "special token \"<|x|>\" must be an integer in [0, 16777215], got 100000000");
  std::ofstream(dir_ / "custom2.tiktoken.json") << R"({"pattern": "cl100k_base", "special_tokens": {"<|x|>": -1}})";
  EXPECT_HAS(load("custom2.tiktoken", ranks), "special token \"<|x|>\" must be an integer");
  const std::string long_token(270000, 'a');
  e = load("p50k_base.tiktoken", "YQ== 0\n" + data::base64_encode(long_token) + " 1\n");
  EXPECT_HAS(e, "line 2 holds a token of 270000 bytes; forge reads tokens of up to 4096 bytes");
  EXPECT_EQ(load("o200k_base.tiktoken", ranks), "<no error>");
}

// forge BPE: a 523-byte file whose merges each double the last token asked for 5 GB at 31 merges;
// an id beyond int32 wrapped to a small one.
TEST_F(UntrustedTokenizers, ForgeBpeMergesAreBounded) {
  auto bpe = [](const std::string& merges, int64_t n) {
    return R"({"format":"forge-bpe","version":1,"pretokenizer":"gpt2","vocab_size":)" + std::to_string(256 + n) +
           R"(,"merges":[)" + merges + R"(],"special_tokens":[]})";
  };
  std::string doubling = "[97,97]";
  for (int i = 1; i < 31; ++i) doubling += ",[" + std::to_string(255 + i) + "," + std::to_string(255 + i) + "]";
  std::string e = load("doubling.json", bpe(doubling, 31));
  EXPECT_HAS(e, "doubling.json");
  EXPECT_HAS(e, "makes a token of 8192 bytes; forge reads tokens of up to 4096 bytes");
  e = load("wrap.json", bpe("[4294967393,98]", 1));  // 2^32 + 97 used to read as 97
  EXPECT_HAS(e, "merge 0 (left) must be an integer in [0, 16777215], got 4294967393");
  e = load("float.json", bpe("[97.5,98]", 1));
  EXPECT_HAS(e, "merge 0 (left) must be an integer");
  EXPECT_EQ(load("ok.json", bpe("[97,98],[256,99]", 2)), "<no error>");
}

// Found by fuzzing (tests/fuzz/corpus/*/crash_*): a rank with a non-digit before more digits
// multiplied -1 by ten until int64 overflowed (undefined behaviour); a forge BPE field of the wrong
// type and libsentencepiece's own exception (an empty piece) were "internal errors".
TEST_F(UntrustedTokenizers, FuzzFindingsAreCleanErrors) {
  std::string e = load("cl100k_base.tiktoken", "YQ== 0\nYg== 1x" + std::string(40, '2') + "\n");
  EXPECT_HAS(e, "line 2 is not \"<base64 token> <rank>\"");
  e = load("cl100k_base.tiktoken", "YQ== 0\nYg== " + std::string(40, '9') + "\n");
  EXPECT_HAS(e, "line 2 is not \"<base64 token> <rank>\"");
  e = load("types.json", R"({"format":"forge-bpe","version":1,"pretokenizer":["gpt2"],"vocab_size":256,"merges":[],)"
                         R"("special_tokens":[]})");
  EXPECT_HAS(e, "types.json");
  EXPECT_HAS(e, "type must be string, but is array");
  auto corpus_file = [](const char* target, const char* name) {
    std::ifstream in(fs::path(FORGE_FUZZ_CORPUS) / target / name, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  for (const auto& [target, name, as] :
       {std::tuple{"forge_bpe", "crash_json_type_error", "forge.json"},
        std::tuple{"sentencepiece", "crash_empty_piece_darts", "tokenizer.model"}}) {
    const std::string bytes = corpus_file(target, name);
    ASSERT_FALSE(bytes.empty()) << target << "/" << name;
    e = load(as, bytes);
    EXPECT_HAS(e, as);
    EXPECT_NE(e, "<no error>");
    EXPECT_EQ(e.find("internal error"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace forge::testing
