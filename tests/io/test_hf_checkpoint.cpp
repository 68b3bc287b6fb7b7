// The weight files of a Hugging Face model directory (io/hf_checkpoint.h): size parsing, one
// file under the limit, shards and their index over it, and the index's errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "forge/forge.h"
#include "forge/io/hf_checkpoint.h"
#include "io_testing.h"

namespace forge::io {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfCheckpoint, ParsesByteSizes) {
  EXPECT_EQ(parse_byte_size("5GB", "x"), 5'000'000'000);
  EXPECT_EQ(parse_byte_size("500MB", "x"), 500'000'000);
  EXPECT_EQ(parse_byte_size("10kb", "x"), 10'000);
  EXPECT_EQ(parse_byte_size("2GiB", "x"), 2LL << 30);
  EXPECT_EQ(parse_byte_size("64MiB", "x"), 64LL << 20);
  EXPECT_EQ(parse_byte_size("1.5GB", "x"), 1'500'000'000);
  EXPECT_EQ(parse_byte_size("4096", "x"), 4096);
  const std::string e = error_of([] { parse_byte_size("5 parsecs", "export: --max-shard-size"); });
  EXPECT_NE(e.find("--max-shard-size"), std::string::npos) << e;
  EXPECT_NE(e.find("5GB"), std::string::npos) << e;
  EXPECT_NE(error_of([] { parse_byte_size("0", "x"); }), "");
  EXPECT_NE(error_of([] { parse_byte_size("GB", "x"); }), "");
}

class HfWeightsTest : public ::testing::Test {
 protected:
  forge::testing::ScratchDir scratch_;
  const fs::path dir_ = scratch_.path();
  // 3 tensors of 400, 400 and 1200 bytes (f32).
  TensorItems tensors() const {
    return {{"a", arange(0, 100, 1, {.dtype = DType::f32})},
            {"b", arange(100, 200, 1, {.dtype = DType::f32})},
            {"c", arange(0, 300, 1, {.dtype = DType::f32}).reshape({3, 100})}};
  }
};

TEST_F(HfWeightsTest, UnderTheLimitOneFile) {
  const auto files = save_hf_weights(dir_, tensors(), 1'000'000);
  EXPECT_EQ(files, std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(fs::exists(dir_ / kHfWeightsIndexFile));
  const NamedTensors back = load_hf_weights(dir_);
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back.at("c").shape(), (Shape{3, 100}));
}

TEST_F(HfWeightsTest, OverTheLimitShardsAndAnIndex) {
  // Limit 800: a + b fill shard 1 (800 bytes), c (1200, over the limit alone) gets shard 2.
  const auto files = save_hf_weights(dir_, tensors(), 800);
  EXPECT_EQ(files, (std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                             "model.safetensors.index.json"}));
  std::ifstream in(dir_ / kHfWeightsIndexFile);
  const auto index = nlohmann::json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"], 2000);
  EXPECT_EQ(index["weight_map"]["a"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["b"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["c"], "model-00002-of-00002.safetensors");
  const NamedTensors back = load_hf_weights(dir_);
  ASSERT_EQ(back.size(), 3u);
  for (const auto& [name, t] : tensors()) {
    const Tensor& got = back.at(name);
    ASSERT_EQ(got.shape(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(got.data<float>(), t.data<float>(), static_cast<size_t>(t.numel()) * 4), 0) << name;
  }
}

TEST_F(HfWeightsTest, IndexErrorsNameTheShardOrTensor) {
  save_hf_weights(dir_, tensors(), 800);
  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  std::string e = error_of([&] { load_hf_weights(dir_); });
  EXPECT_NE(e.find("model-00002-of-00002.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;

  std::ofstream(dir_ / kHfWeightsIndexFile) << R"({"weight_map": {"zzz": "model-00001-of-00002.safetensors"}})";
  e = error_of([&] { load_hf_weights(dir_); });
  EXPECT_NE(e.find("'zzz'"), std::string::npos) << e;

  fs::remove(dir_ / kHfWeightsIndexFile);
  e = error_of([&] { load_hf_weights(dir_); });
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_FALSE(has_hf_weights(dir_));
}

}  // namespace
}  // namespace forge::io
