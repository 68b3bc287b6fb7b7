// Note [checked sizes] (core/shape.h): element and byte counts never wrap, and a model's shape keys
// are bounded wherever they come from (a TOML file, a Hugging Face config.json, a checkpoint's
// state.json). Issue 43's regression: n_embd = 2^62 wrapped the byte count of a tensor to 0, so a
// 64-byte block was filled past its end (SIGSEGV in LayerNorm).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "forge/forge.h"
#include "forge/nn/model_registry.h"
#include "forge/run/config.h"
#include "testing/tensor_testing.h"

namespace forge::testing {
namespace {

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "looked for: " << (needle) << "\nin: " << (haystack)

TEST(CheckedSizes, ShapeProductsAndByteCountsDoNotWrap) {
  EXPECT_EQ(shape_numel({3, 4, 5}), 60);
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({7, 0, int64_t{1} << 62}), 0);
  const int64_t big = int64_t{1} << 62;
  EXPECT_HAS(error_of([&] { (void)shape_numel({big, 4}); }), "has more elements than an int64 holds");
  EXPECT_HAS(error_of([&] { (void)shape_numel({big, big}); }), "has more elements than an int64 holds");
  EXPECT_EQ(checked_nbytes({3, 4}, 4), 48u);
  EXPECT_HAS(error_of([&] { (void)checked_nbytes({int64_t{1} << 60, 4}, 4); }), "needs more bytes than an int64 holds");
  // An allocation of such a shape is an error before any memory is touched; the wrapped count of
  // the issue (2^62 * 4 bytes = 0 mod 2^64) is among them.
  EXPECT_HAS(error_of([&] { (void)empty({big}, {.dtype = DType::f32}); }), "needs more bytes than an int64 holds");
  EXPECT_HAS(error_of([&] { (void)zeros({big, 2}); }), "more elements than an int64 holds");
  // Large but representable: the allocator's own out-of-memory error, not a crash.
  EXPECT_HAS(error_of([&] { (void)empty({int64_t{1} << 50}, {.dtype = DType::f32}); }), "out of memory");
}

TEST(CheckedSizes, ModelShapeKeysAreBoundedWhereverTheyComeFrom) {
  const std::string huge = std::to_string(int64_t{1} << 62);
  // TOML / the command line.
  std::string e = error_of([&] {
    train::parse_config("[model]\ntype = \"gpt\"\nvocab_size = 256\n", "x.toml", {"--model.n_embd=" + huge});
  });
  EXPECT_HAS(e, "model.n_embd = 4611686018427387904 is above forge's limit of 1048576");
  for (const char* key : {"block_size", "n_layer", "n_head", "vocab_size"}) {
    e = error_of([&] {
      train::parse_config("[model]\ntype = \"gpt\"\n", "x.toml", {std::string("--model.") + key + "=" + huge});
    });
    EXPECT_HAS(e, std::string("model.") + key + " = " + huge + " is above forge's limit");
  }
  e = error_of([&] { train::parse_config("[model]\ntype = \"llama\"\n", "x.toml", {"--model.ffn_hidden=" + huge}); });
  EXPECT_HAS(e, "model.ffn_hidden = " + huge + " is above forge's limit");
  // A checkpoint's config (state.json "config"), as export, sample and eval rebuild the model from it.
  nlohmann::json cfg = {{"model", {{"type", "gpt"}, {"vocab_size", 256}, {"n_embd", int64_t{1} << 62}, {"n_head", 1}}}};
  e = error_of([&] { train::config_from_json(cfg, "checkpoint 'c/state.json' (config)"); });
  EXPECT_HAS(e, "checkpoint 'c/state.json' (config): model.n_embd = 4611686018427387904 is above forge's limit");
}

}  // namespace
}  // namespace forge::testing
