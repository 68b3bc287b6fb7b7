// Note [streaming encoder]: encode_files_to_shards gives the ids of encoding each document in
// turn (each followed by the end-of-text token when asked), whatever the batch, the number of
// threads and the shard size: shards cut at tokens_per_shard concatenate to the one-shard ids.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "forge/data/bpe.h"
#include "forge/data/shards.h"
#include "forge/run/run_data.h"
#include "testing/tensor_testing.h"
#include "train_testing.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;

TEST(StreamingEncoder, ShardsHoldEveryDocumentInOrderWhateverTheirSize) {
  train_testing::Scratch scratch;
  const std::string text = train_testing::synthetic_text(30000, 3);
  data::BpeTrainOptions opt;
  opt.vocab_size = 400;
  opt.special_tokens = {"<|endoftext|>"};
  const auto tok = data::BpeTokenizer::train(text, opt.vocab_size, opt.special_tokens);
  const int32_t eos = tok.special_id("<|endoftext|>");
  // 60 documents of varied length in a .jsonl file, and a plain text file after it.
  std::string jsonl;
  std::vector<int32_t> want;
  size_t at = 0;
  for (int k = 0; k < 60; ++k) {
    const size_t n = 50 + static_cast<size_t>(k * 37 % 400);
    const std::string doc = text.substr(at, n);
    at += n;
    jsonl += nlohmann::json{{"text", doc}}.dump() + "\n";
    for (int32_t id : tok.encode_ordinary(doc)) want.push_back(id);
    want.push_back(eos);
  }
  train_testing::write_text(scratch.path() / "a.jsonl", jsonl);
  const std::string tail = text.substr(at, 5000);
  train_testing::write_text(scratch.path() / "b.txt", tail);
  std::vector<int32_t> want_b = tok.encode_ordinary(tail);
  want_b.push_back(eos);
  const std::vector<std::string> files = {(scratch.path() / "a.jsonl").string(), (scratch.path() / "b.txt").string()};
  auto read_all = [](const std::vector<std::string>& paths, size_t from, size_t to) {
    std::vector<int32_t> out;
    for (size_t i = from; i < to; ++i)
      for (int32_t id : data::TokenShard(paths[i]).to_vector()) out.push_back(id);
    return out;
  };
  // One shard per file.
  const auto one = encode_files_to_shards(tok, files, (scratch.path() / "one").string(), nullptr, "text", "<|endoftext|>");
  ASSERT_EQ(one.size(), 2u);
  EXPECT_EQ(data::TokenShard(one[0]).to_vector(), want);
  EXPECT_EQ(data::TokenShard(one[1]).to_vector(), want_b);
  // Shards of 97 tokens: many per file, cut through documents, in order.
  const auto cut = encode_files_to_shards(tok, files, (scratch.path() / "cut").string(), nullptr, "text",
                                          "<|endoftext|>", 97);
  const size_t na = (want.size() + 96) / 97, nb = (want_b.size() + 96) / 97;
  ASSERT_EQ(cut.size(), na + nb);
  for (size_t i = 0; i + 1 < na; ++i) EXPECT_EQ(data::TokenShard(cut[i]).size(), 97) << i;
  EXPECT_EQ(read_all(cut, 0, na), want);
  EXPECT_EQ(read_all(cut, na, na + nb), want_b);
  // Without the end-of-text token: the documents' ids only.
  const auto plain = encode_files_to_shards(tok, {files[1]}, (scratch.path() / "plain").string());
  EXPECT_EQ(data::TokenShard(plain[0]).to_vector(), tok.encode_ordinary(tail));
}

// Issue 43: formats by content, never by luck. A forge or llm.c shard with one flipped magic byte,
// or a Megatron .bin whose .idx is missing or truncated, used to be taken for text (a BPE trained
// on the binary, exit 0): a file named as a shard that is none is an error naming the magic.
TEST(PreEncodedShards, AFileNamedAsAShardThatIsNoneIsAnError) {
  using forge::testing::error_of;
  const fs::path d = fs::temp_directory_path() / ("forge_pre_bad_" + std::to_string(::getpid()));
  fs::create_directories(d);
  std::vector<int32_t> toks = {1, 2, 3, 4, 5, 6, 7, 8};
  data::write_shard((d / "good.bin").string(), toks, 300);
  std::string bytes = train_testing::read_text(d / "good.bin");
  bytes[2] ^= 0x01;  // "FRGTOK" -> "FRFTOK"
  train_testing::write_text(d / "flipped.bin", bytes);
  std::string e = error_of([&] { pre_encoded_shards({(d / "flipped.bin").string()}); });
  EXPECT_NE(e.find("flipped.bin' is named as a token shard (.bin) but is none forge reads"), std::string::npos) << e;
  EXPECT_NE(e.find("FRGTOK"), std::string::npos) << e;
  // A Megatron .bin without its index, and with a truncated one.
  train_testing::write_text(d / "mega.bin", std::string(16, '\x01'));
  e = error_of([&] { pre_encoded_shards({(d / "mega.bin").string()}); });
  EXPECT_NE(e.find("mega.bin' is named as a token shard (.bin)"), std::string::npos) << e;
  EXPECT_NE(e.find("MMIDIDX"), std::string::npos) << e;
  train_testing::write_text(d / "mega.idx", std::string("MMIDIDX\0", 8));
  e = error_of([&] { pre_encoded_shards({(d / "mega.bin").string(), (d / "mega.idx").string()}); });
  EXPECT_NE(e.find("mega.bin' is named as a token shard (.bin)"), std::string::npos) << e;
  // The good shard still is one.
  EXPECT_EQ(pre_encoded_shards({(d / "good.bin").string()}).size(), 1u);
  fs::remove_all(d);
}

}  // namespace
}  // namespace forge::train
