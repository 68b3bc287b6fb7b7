// Token shards: byte layout, uint16/uint32 round trips through mmap, atomic writes, and
// errors for truncated, overlong or foreign files.
#include <gtest/gtest.h>

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
  expect_has(m, "bad magic");
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

}  // namespace
}  // namespace forge::data
