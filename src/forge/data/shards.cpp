// Token shards: atomic writer and memory-mapped reader (format in shards.h).
#include "forge/data/shards.h"

#include "forge/io/atomic_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "forge/core/error.h"

namespace forge::data {

namespace {

constexpr bool kLittle = std::endian::native == std::endian::little;

void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string errno_str() { return std::strerror(errno); }

}  // namespace

void write_shard(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size) {
  FORGE_CHECK(vocab_size > 0 && vocab_size <= (int64_t{1} << 32), "write_shard('", path, "'): vocab_size ", vocab_size,
              " must be in [1, 2^32]");
  for (size_t i = 0; i < tokens.size(); ++i)
    FORGE_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size, "write_shard('", path, "'): token ", tokens[i],
                " at position ", i, " is outside the vocabulary [0, ", vocab_size, ")");
  const uint32_t dtype = vocab_size <= 65536 ? 2 : 4;

  io::write_file_atomic(path, [&](io::OutputFile& out) {
    auto write = [&](const void* data, size_t n) { out.write(data, n); };
    unsigned char header[kShardHeaderBytes];
    std::memcpy(header, kShardMagic, 8);
    put_u32(header + 8, kShardVersion);
    put_u32(header + 12, dtype);
    put_u64(header + 16, tokens.size());
    write(header, sizeof header);

    constexpr size_t kChunk = 1 << 18;  // tokens per write
    std::vector<unsigned char> buf(kChunk * dtype);
    for (size_t begin = 0; begin < tokens.size(); begin += kChunk) {
      const size_t n = std::min(kChunk, tokens.size() - begin);
      unsigned char* p = buf.data();
      for (size_t i = 0; i < n; ++i) {
        const auto v = static_cast<uint32_t>(tokens[begin + i]);
        p[0] = static_cast<unsigned char>(v);
        p[1] = static_cast<unsigned char>(v >> 8);
        if (dtype == 4) {
          p[2] = static_cast<unsigned char>(v >> 16);
          p[3] = static_cast<unsigned char>(v >> 24);
        }
        p += dtype;
      }
      write(buf.data(), n * dtype);
    }
  });
}

TokenShard::TokenShard(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FORGE_CHECK(fd >= 0, "TokenShard: cannot open '", path, "': ", errno_str());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string err = errno_str();
    ::close(fd);
    FORGE_THROW("TokenShard: cannot stat '", path, "': ", err);
  }
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    FORGE_THROW("TokenShard: '", path, "' is truncated: ", file_bytes, " bytes, shorter than the ", kShardHeaderBytes,
                "-byte header");
  }
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd, 0);
  const std::string map_err = map == MAP_FAILED ? errno_str() : "";
  ::close(fd);  // the mapping keeps the file alive
  FORGE_CHECK(map != MAP_FAILED, "TokenShard: cannot mmap '", path, "': ", map_err);
  map_ = map;
  map_bytes_ = file_bytes;
  const auto* base = static_cast<const unsigned char*>(map);
  try {
    FORGE_CHECK(std::memcmp(base, kShardMagic, 8) == 0, "TokenShard: '", path,
                "' is not a forge token shard (bad magic; expected \"FRGTOK\\0\\0\")");
    const uint32_t version = get_u32(base + 8);
    FORGE_CHECK(version == kShardVersion, "TokenShard: '", path, "' has version ", version, "; this forge reads version ",
                kShardVersion);
    const uint32_t dtype = get_u32(base + 12);
    FORGE_CHECK(dtype == 2 || dtype == 4, "TokenShard: '", path, "' has dtype ", dtype,
                "; expected 2 (uint16) or 4 (uint32)");
    const uint64_t count = get_u64(base + 16);
    const uint64_t payload = file_bytes - kShardHeaderBytes;
    FORGE_CHECK(count <= payload / dtype, "TokenShard: '", path, "' is truncated: header says ", count, " tokens of ",
                dtype, " bytes but only ", payload, " bytes follow the header");
    FORGE_CHECK(payload == count * dtype, "TokenShard: '", path, "' is longer than its header says: ", count,
                " tokens of ", dtype, " bytes (", count * dtype, " bytes) but ", payload, " bytes follow the header");
    count_ = static_cast<int64_t>(count);
    dtype_bytes_ = static_cast<int>(dtype);
    payload_ = base + kShardHeaderBytes;
  } catch (...) {
    release();
    throw;
  }
}

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      payload_(std::exchange(other.payload_, nullptr)),
      count_(std::exchange(other.count_, 0)),
      dtype_bytes_(other.dtype_bytes_) {}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    payload_ = std::exchange(other.payload_, nullptr);
    count_ = std::exchange(other.count_, 0);
    dtype_bytes_ = other.dtype_bytes_;
  }
  return *this;
}

TokenShard::~TokenShard() { release(); }

void TokenShard::release() {
  if (map_) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  payload_ = nullptr;
  count_ = 0;
}

uint16_t TokenShard::load_u16(int64_t i) const {
  uint16_t v;
  std::memcpy(&v, payload_ + 2 * i, 2);
  if constexpr (!kLittle) v = __builtin_bswap16(v);
  return v;
}

uint32_t TokenShard::load_u32(int64_t i) const {
  uint32_t v;
  std::memcpy(&v, payload_ + 4 * i, 4);
  if constexpr (!kLittle) v = __builtin_bswap32(v);
  return v;
}

int32_t TokenShard::at(int64_t i) const {
  FORGE_CHECK(i >= 0 && i < count_, "TokenShard('", path_, "'): index ", i, " is outside [0, ", count_, ")");
  return (*this)[i];
}

void TokenShard::copy(int64_t start, int64_t n, int32_t* out) const {
  FORGE_CHECK(start >= 0 && n >= 0 && start <= count_ && n <= count_ - start, "TokenShard('", path_,
              "')::copy: range [", start, ", ", start + n, ") is outside [0, ", count_, ")");
  if (dtype_bytes_ == 2) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(load_u16(start + i));
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(load_u32(start + i));
  }
}

std::vector<int32_t> TokenShard::to_vector() const {
  std::vector<int32_t> out(static_cast<size_t>(count_));
  copy(0, count_, out.data());
  return out;
}

}  // namespace forge::data
