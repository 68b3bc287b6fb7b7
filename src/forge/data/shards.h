#pragma once
// Token shards: a flat binary file of token ids, written atomically and read by mmap.
//
// Format (version 1), all integers little-endian:
//   offset 0   8 bytes  magic "FRGTOK\0\0"
//   offset 8   u32      version = 1
//   offset 12  u32      dtype: bytes per token, 2 (uint16) or 4 (uint32)
//   offset 16  u64      count: number of tokens
//   offset 24  count * dtype bytes: the tokens
// The file is exactly 24 + count * dtype bytes; anything else is rejected. The payload
// starts 24 bytes in, so it is aligned for both token widths in a page-aligned mapping.
//
// write_shard picks uint16 when vocab_size <= 65536 and uint32 otherwise, checks every
// token is in [0, vocab_size), and writes atomically: a temporary file in the same
// directory, fsync, rename over the destination, fsync of the directory. A reader never
// sees a half-written shard.
//
// Note [token shard formats]: TokenShard also reads two foreign formats as they are, so a
// corpus encoded by another tool trains without conversion:
//   llm.c (dev/data/data_common.py): a 1024-byte header of 256 little-endian int32 -- magic,
//     version, token count -- then the tokens: GPT-2's uint16 (magic 20240520, version 1) or
//     LLaMA-3's uint32 (magic 20240801, version 7);
//   Megatron-LM's indexed dataset: X.bin, the tokens of every document back to back without a
//     header, beside X.idx ("MMIDIDX\0\0", version 1, a dtype code: 3 int16, 4 int32, 8 uint16);
//     the .bin is read as one token stream (the documents' end-of-document tokens, if the
//     preprocessing appended them, are in it).
// token_shard_format tells which a file is ("forge", "llm.c", "megatron", or "" for none).
//
// TokenShard maps a shard read-only (mmap, MAP_SHARED, PROT_READ): opening costs nothing
// per token and pages are shared by every process reading the same file. It is
// immutable, so one TokenShard may be read from several threads at once.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace forge::io {
class AtomicFile;
}

namespace forge::data {

inline constexpr char kShardMagic[8] = {'F', 'R', 'G', 'T', 'O', 'K', '\0', '\0'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 24;

inline constexpr uint32_t kLlmcGpt2Magic = 20240520, kLlmcLlama3Magic = 20240801;
inline constexpr size_t kLlmcHeaderBytes = 1024;
inline constexpr char kMegatronIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

// "forge", "llm.c" or "megatron" (Note [token shard formats]); "" when `path` is none of them or
// cannot be read.
std::string token_shard_format(const std::string& path);

// Writes `tokens` to `path` (see the format above). Throws forge::Error naming the path
// on an I/O failure, and the position of the first token outside [0, vocab_size).
void write_shard(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size);


// A shard written as its tokens arrive (a corpus larger than memory): the header's count is
// filled in by commit(), which makes the file appear atomically (io::AtomicFile). The token
// width is picked from vocab_size as write_shard does; every token is checked against it.
// Destroyed uncommitted, the shard does not appear.
class ShardWriter {
 public:
  ShardWriter(const std::string& path, int64_t vocab_size);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  void append(std::span<const int32_t> tokens);
  int64_t size() const { return count_; }
  void commit();

 private:
  std::string path_;
  int64_t vocab_size_;
  uint32_t dtype_;
  int64_t count_ = 0;
  std::unique_ptr<io::AtomicFile> file_;
  std::vector<unsigned char> buf_;
};

class TokenShard {
 public:
  // Maps `path` and validates its header and size; throws forge::Error naming the path
  // and what is wrong (missing, truncated, trailing bytes, unknown format, version, dtype).
  explicit TokenShard(const std::string& path);
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  ~TokenShard();

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }
  int dtype_bytes() const { return dtype_bytes_; }  // 2 or 4
  const std::string& format() const { return format_; }  // "forge", "llm.c" or "megatron"
  // The largest token id (-1 for an empty shard); reads every token (OpenMP over the cores).
  int32_t max_token() const;

  // Token i (0 <= i < size(); unchecked in release builds, use at() for a checked read).
  int32_t operator[](int64_t i) const {
    return dtype_bytes_ == 2 ? static_cast<int32_t>(load_u16(i)) : static_cast<int32_t>(load_u32(i));
  }
  int32_t at(int64_t i) const;
  // Copies tokens [start, start + n) to out; throws forge::Error if the range is outside
  // [0, size()).
  void copy(int64_t start, int64_t n, int32_t* out) const;
  std::vector<int32_t> to_vector() const;

 private:
  uint16_t load_u16(int64_t i) const;
  uint32_t load_u32(int64_t i) const;
  void release();

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* payload_ = nullptr;
  int64_t count_ = 0;
  int dtype_bytes_ = 2;
  std::string format_ = "forge";
};

}  // namespace forge::data
