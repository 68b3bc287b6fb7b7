// Token shards: byte layout, uint16/uint32 round trips through mmap, atomic writes, and
// errors for truncated, overlong or foreign files.
#include <gtest/gtest.h>

#include <algorithm>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "data/data_testing.h"
#include "forge/forge.h"
#include "testing/tensor_testing.h"

namespace forge::data {
namespace {

using forge::testing::error_of;
using forge::testing::read_bytes;
using forge::testing::TempDir;
using forge::testing::write_bytes;

std::vector<int32_t> random_tokens(size_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return t;
}

uint32_t le32(const std::string& b, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(b[at + i])) << (8 * i);
  return v;
}

TEST(TokenShard, HeaderBytes) {
  TempDir dir;
  const std::string path = dir.file("a.bin");
  write_shard(path, std::vector<int32_t>{1, 258, 65535}, 65536);
  const std::string b = read_bytes(path);
  ASSERT_EQ(b.size(), 24u + 3 * 2);
  EXPECT_EQ(std::memcmp(b.data(), "FRGTOK\0\0", 8), 0);
  EXPECT_EQ(le32(b, 8), 1u);   // version
  EXPECT_EQ(le32(b, 12), 2u);  // uint16
  EXPECT_EQ(le32(b, 16), 3u);  // count, low word
  EXPECT_EQ(le32(b, 20), 0u);  // count, high word
  EXPECT_EQ(static_cast<unsigned char>(b[24 + 2]), 2);  // 258 little-endian: 02 01
  EXPECT_EQ(static_cast<unsigned char>(b[24 + 3]), 1);
}

TEST(TokenShard, RoundTripUint16) {
  TempDir dir;
  const std::string path = dir.file("u16.bin");
  const auto tokens = random_tokens(100003, 50257, 1);
  write_shard(path, tokens, 50257);
  EXPECT_EQ(std::filesystem::file_size(path), 24u + 2 * tokens.size());
  const TokenShard shard(path);
  EXPECT_EQ(shard.dtype_bytes(), 2);
  ASSERT_EQ(shard.size(), static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(shard.to_vector(), tokens);
  EXPECT_EQ(shard[12345], tokens[12345]);
  EXPECT_EQ(shard.at(100002), tokens[100002]);
  std::vector<int32_t> part(1000);
  shard.copy(5000, 1000, part.data());
  EXPECT_EQ(part, std::vector<int32_t>(tokens.begin() + 5000, tokens.begin() + 6000));
  EXPECT_NE(error_of([&] { shard.at(100003); }).find("outside [0, 100003)"), std::string::npos);
  EXPECT_NE(error_of([&] { shard.copy(100000, 4, part.data()); }).find("[100000, 100004)"), std::string::npos);
}

TEST(TokenShard, RoundTripUint32) {
  TempDir dir;
  const std::string path = dir.file("u32.bin");
  auto tokens = random_tokens(70001, 100000, 2);
  tokens[0] = 99999;
  tokens[1] = 65536;
  write_shard(path, tokens, 100000);
  EXPECT_EQ(std::filesystem::file_size(path), 24u + 4 * tokens.size());
  TokenShard shard(path);
  EXPECT_EQ(shard.dtype_bytes(), 4);
  EXPECT_EQ(shard.to_vector(), tokens);
  TokenShard moved = std::move(shard);  // the mapping moves with the object
  EXPECT_EQ(moved[0], 99999);
  EXPECT_EQ(moved[1], 65536);
  EXPECT_EQ(shard.size(), 0);
}

TEST(TokenShard, DtypeBoundaryAndEmpty) {
  TempDir dir;
  write_shard(dir.file("a"), std::vector<int32_t>{65535}, 65536);
  EXPECT_EQ(TokenShard(dir.file("a")).dtype_bytes(), 2);
  write_shard(dir.file("b"), std::vector<int32_t>{65536}, 65537);
  EXPECT_EQ(TokenShard(dir.file("b")).dtype_bytes(), 4);
  EXPECT_EQ(TokenShard(dir.file("b"))[0], 65536);
  write_shard(dir.file("e"), std::vector<int32_t>{}, 100);
  EXPECT_EQ(TokenShard(dir.file("e")).size(), 0);
}

TEST(TokenShard, WritesAtomically) {
  TempDir dir;
  const std::string path = dir.file("s.bin");
  write_shard(path, std::vector<int32_t>{1, 2, 3}, 10);
  write_shard(path, std::vector<int32_t>{4, 5}, 10);  // replaces the old file
  EXPECT_EQ(TokenShard(path).to_vector(), (std::vector<int32_t>{4, 5}));
  // A bad token: an error naming it, the old file untouched and no temporary left behind.
  const std::string msg = error_of([&] { write_shard(path, std::vector<int32_t>{1, 10, 2}, 10); });
  EXPECT_NE(msg.find("token 10 at position 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("s.bin"), std::string::npos) << msg;
  EXPECT_EQ(TokenShard(path).to_vector(), (std::vector<int32_t>{4, 5}));
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(e.path().filename(), "s.bin");
  }
  EXPECT_EQ(files, 1);
  const std::string nodir = error_of([&] { write_shard(dir.file("no/such/dir/x.bin"), std::vector<int32_t>{1}, 2); });
  EXPECT_NE(nodir.find("x.bin"), std::string::npos) << nodir;
}

TEST(TokenShard, RejectsBadFiles) {
  TempDir dir;
  const std::string good = dir.file("good.bin");
  write_shard(good, random_tokens(1000, 300, 3), 300);
  const std::string bytes = read_bytes(good);
  auto open_error = [&](const std::string& name, const std::string& content) {
    const std::string p = dir.file(name);
    write_bytes(p, content);
    return error_of([&] { TokenShard s(p); });
  };
  auto expect_has = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << msg << "' lacks '" << part << "'";
  };

  std::string m = open_error("cut.bin", bytes.substr(0, bytes.size() - 1));
  expect_has(m, "cut.bin");
  expect_has(m, "truncated");
  m = open_error("header.bin", bytes.substr(0, 10));
  expect_has(m, "header.bin");
  expect_has(m, "shorter than the 24-byte header");
  m = open_error("long.bin", bytes + "xx");
  expect_has(m, "long.bin");
  expect_has(m, "longer than its header says");
  std::string foreign = bytes;
  foreign[0] = 'P';
  m = open_error("foreign.bin", foreign);
  expect_has(m, "foreign.bin");
  expect_has(m, "not a token shard forge reads");
  expect_has(m, "foreign.idx");
  std::string v2 = bytes;
  v2[8] = 2;
  m = open_error("v2.bin", v2);
  expect_has(m, "version 2");
  std::string d3 = bytes;
  d3[12] = 3;
  m = open_error("d3.bin", d3);
  expect_has(m, "dtype 3");
  std::string huge = bytes;
  huge[23] = 0x7f;  // count ~ 2^62: must not overflow into "valid"
  m = open_error("huge.bin", huge);
  expect_has(m, "truncated");
  m = error_of([&] { TokenShard s(dir.file("missing.bin")); });
  expect_has(m, "missing.bin");
  expect_has(m, "cannot open");
}

// Note [token shard formats]: llm.c's and Megatron-LM's files read as they are, token for token.
std::string le32(uint32_t v) {
  std::string b(4, '\0');
  for (int i = 0; i < 4; ++i) b[static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
  return b;
}
std::string tokens_le(const std::vector<int32_t>& t, int bytes) {
  std::string b;
  for (int32_t v : t)
    for (int i = 0; i < bytes; ++i) b.push_back(static_cast<char>(static_cast<uint32_t>(v) >> (8 * i)));
  return b;
}

TEST(TokenShardFormats, LlmcAndMegatronReadAsForgeShardsDo) {
  TempDir dir;
  const std::vector<int32_t> small = random_tokens(3000, 50257, 11);  // GPT-2 ids: uint16
  const std::vector<int32_t> large = random_tokens(2000, 128256, 12);  // LLaMA-3 ids: uint32
  // llm.c: 256 int32 of header (magic, version, count, zeros), then the tokens.
  auto llmc = [&](uint32_t magic, uint32_t version, const std::vector<int32_t>& t, int bytes) {
    std::string h = le32(magic) + le32(version) + le32(static_cast<uint32_t>(t.size()));
    h.resize(1024, '\0');
    return h + tokens_le(t, bytes);
  };
  write_bytes(dir.file("gpt2.bin"), llmc(20240520, 1, small, 2));
  write_bytes(dir.file("llama3.bin"), llmc(20240801, 7, large, 4));
  // Megatron: X.bin (the tokens, no header) beside X.idx (magic, version, dtype code, sequence and
  // document counts, then each sequence's length and byte offset, and the document indices): one
  // sequence of `n` tokens, one document.
  auto idx = [&](unsigned char code, uint32_t n) {
    std::string h("MMIDIDX\0\0", 9);
    h += le32(1) + le32(0);  // version 1 (u64)
    h.push_back(static_cast<char>(code));
    h += le32(1) + le32(0) + le32(2) + le32(0);  // 1 sequence, 2 document indices (u64 each)
    h += le32(n);                               // lengths (int32)
    h += le32(0) + le32(0);                     // offsets (int64)
    h += le32(0) + le32(0) + le32(1) + le32(0);  // document indices (int64): 0, 1
    return h;
  };
  write_bytes(dir.file("mega16.bin"), tokens_le(small, 2));
  write_bytes(dir.file("mega16.idx"), idx(8, static_cast<uint32_t>(small.size())));
  write_bytes(dir.file("mega32.bin"), tokens_le(large, 4));
  write_bytes(dir.file("mega32.idx"), idx(4, static_cast<uint32_t>(large.size())));
  write_shard(dir.file("forge.bin"), small, 50257);
  struct Case {
    const char* file;
    const char* format;
    const std::vector<int32_t>* tokens;
    int bytes;
  };
  for (const Case& c : {Case{"gpt2.bin", "llm.c", &small, 2}, Case{"llama3.bin", "llm.c", &large, 4},
                        Case{"mega16.bin", "megatron", &small, 2}, Case{"mega32.bin", "megatron", &large, 4},
                        Case{"forge.bin", "forge", &small, 2}}) {
    EXPECT_EQ(token_shard_format(dir.file(c.file)), c.format) << c.file;
    TokenShard s(dir.file(c.file));
    EXPECT_EQ(s.format(), c.format) << c.file;
    EXPECT_EQ(s.dtype_bytes(), c.bytes) << c.file;
    EXPECT_EQ(s.to_vector(), *c.tokens) << c.file;
    EXPECT_EQ(s.max_token(), *std::max_element(c.tokens->begin(), c.tokens->end())) << c.file;
  }
  // Not a shard: plain text, and a .bin without its index.
  write_bytes(dir.file("text.txt"), "hello world, these are not tokens");
  EXPECT_EQ(token_shard_format(dir.file("text.txt")), "");
  write_bytes(dir.file("lonely.bin"), tokens_le(small, 2));
  EXPECT_EQ(token_shard_format(dir.file("lonely.bin")), "");
  EXPECT_EQ(token_shard_format(dir.file("missing.bin")), "");
  // Damaged: a token count past the end, a version of another layout, an odd Megatron size, and
  // a Megatron dtype that is not a token id.
  std::string cut = llmc(20240520, 1, small, 2);
  write_bytes(dir.file("cut.bin"), cut.substr(0, cut.size() - 2));
  auto error_for = [&](const std::string& f) { return error_of([&] { TokenShard s(dir.file(f)); }); };
  EXPECT_NE(error_for("cut.bin").find("truncated"), std::string::npos);
  write_bytes(dir.file("v9.bin"), llmc(20240520, 9, small, 2));
  EXPECT_NE(error_for("v9.bin").find("version 9"), std::string::npos);
  write_bytes(dir.file("odd.bin"), tokens_le(small, 2) + "x");
  write_bytes(dir.file("odd.idx"), idx(8, static_cast<uint32_t>(small.size())));
  EXPECT_NE(error_for("odd.bin").find("not a whole number of tokens"), std::string::npos);
  write_bytes(dir.file("f64.bin"), tokens_le(small, 2));
  write_bytes(dir.file("f64.idx"), idx(6, static_cast<uint32_t>(small.size())));
  EXPECT_NE(error_for("f64.bin").find("dtype code 6"), std::string::npos);
  // Issue 43: the index is checked against the .bin: truncated, covering more or fewer tokens than
  // the .bin holds, sequences out of place, counts larger than the file.
  const std::string good = idx(8, static_cast<uint32_t>(small.size()));
  write_bytes(dir.file("m.bin"), tokens_le(small, 2));
  write_bytes(dir.file("m.idx"), good.substr(0, good.size() - 8));
  EXPECT_NE(error_for("m.bin").find("a truncated or foreign index"), std::string::npos) << error_for("m.bin");
  write_bytes(dir.file("m.idx"), idx(8, static_cast<uint32_t>(small.size()) + 1));
  EXPECT_NE(error_for("m.bin").find("ends at byte"), std::string::npos) << error_for("m.bin");
  write_bytes(dir.file("m.idx"), idx(8, static_cast<uint32_t>(small.size()) - 1));
  EXPECT_NE(error_for("m.bin").find("its sequences cover"), std::string::npos) << error_for("m.bin");
  std::string moved = good;
  moved[38] = 2;  // sequence 0 claims to start at byte 2
  write_bytes(dir.file("m.idx"), moved);
  EXPECT_NE(error_for("m.bin").find("sequence 0 starts at byte 2 of the .bin, expected 0"), std::string::npos);
  std::string huge = good;
  huge[18 + 7] = 0x10;  // 2^60 sequences in a 62-byte file
  write_bytes(dir.file("m.idx"), huge);
  EXPECT_NE(error_for("m.bin").find("more than its 62 bytes can hold"), std::string::npos) << error_for("m.bin");
}

}  // namespace
}  // namespace forge::data
