// Note [untrusted JSON] (io/json_input.h): JSON read from files is bounded and strict. Issue 43's
// regressions: 200k levels of nesting inside a safetensors header, a tokenizer.json or a
// checkpoint's state.json ended in a bare SIGSEGV (stack overflow); a NUL byte ended parsing
// silently (what followed was dropped); type errors surfaced as "internal error".
#include <gtest/gtest.h>

#include <string>

#include "forge/data/tokenizer.h"
#include "forge/io/checkpoint.h"
#include "forge/io/json_input.h"
#include "forge/io/safetensors.h"
#include "io/io_testing.h"
#include "testing/tensor_testing.h"

namespace forge::testing {
namespace {

using nlohmann::json;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "looked for: " << (needle) << "\nin: " << (haystack)

std::string nested(const std::string& open, const std::string& inner, const std::string& close, int depth) {
  std::string s;
  s.reserve((open.size() + close.size()) * static_cast<size_t>(depth) + inner.size());
  for (int i = 0; i < depth; ++i) s += open;
  s += inner;
  for (int i = 0; i < depth; ++i) s += close;
  return s;
}

TEST(UntrustedJson, DepthNulAndTrailingDataAreRefusedNamingTheSource) {
  EXPECT_EQ(io::parse_json(R"({"a": [1, {"b": null}]})", "x")["a"][1]["b"], nullptr);
  // The limit is on arrays and objects inside each other: 64 parse, 65 do not.
  EXPECT_NO_THROW(io::parse_json(nested("[", "1", "]", io::kMaxJsonDepth), "x"));
  std::string e = error_of([] { io::parse_json(nested("[", "1", "]", io::kMaxJsonDepth + 1), "file 'a.json'"); });
  EXPECT_HAS(e, "file 'a.json': JSON nested deeper than 64 levels");
  e = error_of([] { io::parse_json(nested("{\"k\":", "1", "}", 200000), "file 'b.json'"); });
  EXPECT_HAS(e, "file 'b.json': JSON nested deeper than 64 levels");
  e = error_of([] { io::parse_json(std::string("{\"a\": 1}\0{\"b\": 2}", 17), "file 'c.json'"); });
  EXPECT_HAS(e, "file 'c.json': not valid JSON: a NUL byte at offset 8");
  e = error_of([] { io::parse_json(std::string("{\"a\": \"x\0y\"}", 12), "d"); });
  EXPECT_HAS(e, "a NUL byte at offset 8");
  e = error_of([] { io::parse_json("{\"a\": 1} trailing", "file 'e.json'"); });
  EXPECT_HAS(e, "file 'e.json': not valid JSON");
  EXPECT_NO_THROW(io::parse_json("  {\"a\": 1}\n\n", "whitespace around is fine"));
  const auto o = io::parse_ordered_json(R"({"z": 1, "a": 2})", "x");
  EXPECT_EQ(o.begin().key(), "z");
}

TEST(UntrustedJson, DeepFilesOfEveryKindGetACleanError) {
  ScratchDir dir;
  // A tokenizer.json whose added token's content nests 200k arrays (this one used to crash).
  const std::string tok = R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[{"content":)" +
                          nested("[", "", "]", 200000) + R"(,"id":1}]})";
  spit(dir / "tokenizer.json", tok);
  std::string e = error_of([&] { data::load_tokenizer((dir / "tokenizer.json").string()); });
  EXPECT_HAS(e, "JSON nested deeper than 64 levels");
  EXPECT_HAS(e, "tokenizer.json");
  // A safetensors header nesting a tensor's shape 200k deep (this one used to crash).
  const std::string header = R"({"t":{"dtype":"F32","shape":)" + nested("[", "", "]", 200000) + R"(,"data_offsets":[0,0]}})";
  spit(dir / "deep.safetensors", raw_safetensors(header, ""));
  e = error_of([&] { io::load_safetensors(dir / "deep.safetensors"); });
  EXPECT_HAS(e, "deep.safetensors");
  EXPECT_HAS(e, "nests deeper than 64 levels");
  e = error_of([&] { io::read_safetensors_header(dir / "deep.safetensors"); });
  EXPECT_HAS(e, "nests deeper than 64 levels");
  // A NUL inside a header.
  spit(dir / "nul.safetensors", raw_safetensors(std::string("{\"__metadata__\":{\"a\":\"b\0c\"}}", 28), ""));
  EXPECT_HAS(error_of([&] { io::load_safetensors(dir / "nul.safetensors"); }), "the header holds a NUL byte");
  // A checkpoint whose state.json nests 200k objects.
  io::CheckpointData d;
  d.step = 3;
  io::save_checkpoint(dir / "ck", d);
  spit(dir / "ck" / "state.json", "{\"step\": 3, \"format_version\": 2, \"extra\": " + nested("{\"a\":", "1", "}", 200000) + "}");
  e = error_of([&] { io::load_checkpoint(dir / "ck"); });
  EXPECT_HAS(e, "state.json");
  EXPECT_HAS(e, "nested deeper than 64 levels");
}

}  // namespace
}  // namespace forge::testing
