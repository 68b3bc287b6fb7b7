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
#include <fstream>
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

ShardWriter::ShardWriter(const std::string& path, int64_t vocab_size)
    : path_(path), vocab_size_(vocab_size), dtype_(vocab_size <= 65536 ? 2 : 4) {
  FORGE_CHECK(vocab_size > 0 && vocab_size <= (int64_t{1} << 32), "write_shard('", path, "'): vocab_size ", vocab_size,
              " must be in [1, 2^32]");
  file_ = std::make_unique<io::AtomicFile>(path);
  unsigned char header[kShardHeaderBytes];
  std::memcpy(header, kShardMagic, 8);
  put_u32(header + 8, kShardVersion);
  put_u32(header + 12, dtype_);
  put_u64(header + 16, 0);  // the count, filled in by commit()
  file_->out().write(header, sizeof header);
}

ShardWriter::~ShardWriter() = default;

void ShardWriter::append(std::span<const int32_t> tokens) {
  FORGE_CHECK(file_ != nullptr, "write_shard('", path_, "'): the shard is already committed");
  constexpr size_t kChunk = 1 << 18;  // tokens per write
  buf_.resize(kChunk * dtype_);
  for (size_t begin = 0; begin < tokens.size(); begin += kChunk) {
    const size_t n = std::min(kChunk, tokens.size() - begin);
    unsigned char* p = buf_.data();
    for (size_t i = 0; i < n; ++i) {
      const int32_t t = tokens[begin + i];
      FORGE_CHECK(t >= 0 && t < vocab_size_, "write_shard('", path_, "'): token ", t, " at position ",
                  static_cast<size_t>(count_) + begin + i, " is outside the vocabulary [0, ", vocab_size_, ")");
      const auto v = static_cast<uint32_t>(t);
      p[0] = static_cast<unsigned char>(v);
      p[1] = static_cast<unsigned char>(v >> 8);
      if (dtype_ == 4) {
        p[2] = static_cast<unsigned char>(v >> 16);
        p[3] = static_cast<unsigned char>(v >> 24);
      }
      p += dtype_;
    }
    file_->out().write(buf_.data(), n * dtype_);
  }
  count_ += static_cast<int64_t>(tokens.size());
}

void ShardWriter::commit() {
  FORGE_CHECK(file_ != nullptr, "write_shard('", path_, "'): the shard is already committed");
  unsigned char count[8];
  put_u64(count, static_cast<uint64_t>(count_));
  file_->write_at(16, count, sizeof count);
  file_->commit();
  file_.reset();
}

void write_shard(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size) {
  ShardWriter w(path, vocab_size);
  w.append(tokens);
  w.commit();
}

namespace {

// Megatron-LM's index next to `path` (X.bin -> X.idx): the token width from its dtype code, 0 when
// there is no such index.
int megatron_token_bytes(const std::string& path) {
  if (path.size() < 4 || path.compare(path.size() - 4, 4, ".bin") != 0) return 0;
  const std::string idx = path.substr(0, path.size() - 4) + ".idx";
  std::ifstream in(idx, std::ios::binary);
  if (!in) return 0;
  unsigned char h[18] = {};
  in.read(reinterpret_cast<char*>(h), sizeof h);
  if (in.gcount() != static_cast<std::streamsize>(sizeof h) || std::memcmp(h, kMegatronIndexMagic, 9) != 0) return 0;
  FORGE_CHECK(get_u64(h + 9) == 1, "TokenShard: '", idx, "' is a Megatron index of version ", get_u64(h + 9),
              "; this forge reads version 1");
  switch (h[17]) {  // Megatron's DType codes: 3 int16, 4 int32, 8 uint16 (token ids are never negative)
    case 3:
    case 8: return 2;
    case 4: return 4;
    default:
      FORGE_THROW("TokenShard: '", idx, "' gives dtype code ", static_cast<int>(h[17]),
                  "; forge reads token ids of int16 (3), int32 (4) or uint16 (8)");
  }
}

// Issue 43: the index beside a Megatron .bin is untrusted too. Megatron-LM's layout: the 9-byte
// magic, version u64, dtype u8, sequence count u64, document count u64, then int32 lengths and
// int64 byte offsets of every sequence and int64 document indices (and, in multimodal indices, a
// byte per sequence). Its size must be exactly that, its sequences must tile the .bin from byte 0
// (offset i = the bytes of sequences before i) and cover it exactly, and its document indices must
// rise within [0, sequences]: a missing, truncated or foreign index is an error, never a guess.
void check_megatron_index(const std::string& bin, uint64_t bin_bytes, uint32_t dtype) {
  const std::string idx = bin.substr(0, bin.size() - 4) + ".idx";
  std::ifstream in(idx, std::ios::binary | std::ios::ate);
  FORGE_CHECK(in, "TokenShard: cannot read '", idx, "'");
  const auto idx_bytes = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  constexpr uint64_t kHeader = 9 + 8 + 1 + 8 + 8;
  FORGE_CHECK(idx_bytes >= kHeader, "TokenShard: '", idx, "' is truncated: ", idx_bytes,
              " bytes, shorter than a Megatron index's ", kHeader, "-byte header");
  unsigned char h[kHeader];
  in.read(reinterpret_cast<char*>(h), kHeader);
  const uint64_t n = get_u64(h + 18), docs = get_u64(h + 26);
  const std::string where = "TokenShard: '" + idx + "' (the index of '" + bin + "')";
  // Sizes first, each product checked: counts from the file must fit the file.
  FORGE_CHECK(n <= idx_bytes / 12 && docs <= idx_bytes / 8, where, ": it claims ", n, " sequences and ", docs,
              " documents, more than its ", idx_bytes, " bytes can hold");
  const uint64_t expected = kHeader + 12 * n + 8 * docs;
  FORGE_CHECK(idx_bytes == expected || idx_bytes == expected + n, where, ": ", idx_bytes, " bytes, but ", n,
              " sequences and ", docs, " documents make ", expected, " (", expected + n,
              " with sequence modes): a truncated or foreign index");
  std::vector<int32_t> lengths(n);
  std::vector<int64_t> offsets(n), doc_idx(docs);
  in.read(reinterpret_cast<char*>(lengths.data()), static_cast<std::streamsize>(4 * n));
  in.read(reinterpret_cast<char*>(offsets.data()), static_cast<std::streamsize>(8 * n));
  in.read(reinterpret_cast<char*>(doc_idx.data()), static_cast<std::streamsize>(8 * docs));
  FORGE_CHECK(in, where, ": cannot read its arrays");
  uint64_t at = 0;  // bytes of the sequences so far
  for (uint64_t i = 0; i < n; ++i) {
    FORGE_CHECK(lengths[i] >= 0, where, ": sequence ", i, " has a negative length ", lengths[i]);
    FORGE_CHECK(offsets[i] >= 0 && static_cast<uint64_t>(offsets[i]) == at, where, ": sequence ", i,
                " starts at byte ", offsets[i], " of the .bin, expected ", at, " (the sequences are back to back)");
    at += static_cast<uint64_t>(lengths[i]) * dtype;
    FORGE_CHECK(at <= bin_bytes, where, ": sequence ", i, " ends at byte ", at, ", past the .bin's ", bin_bytes);
  }
  FORGE_CHECK(at == bin_bytes, where, ": its sequences cover ", at, " bytes of the .bin, which holds ", bin_bytes);
  for (uint64_t d = 0; d < docs; ++d)
    FORGE_CHECK(doc_idx[d] >= 0 && static_cast<uint64_t>(doc_idx[d]) <= n && (d == 0 || doc_idx[d] >= doc_idx[d - 1]),
                where, ": document index ", d, " is ", doc_idx[d], ", not a rising sequence number in [0, ", n, "]");
}

}  // namespace

std::string token_shard_format(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  unsigned char h[8] = {};
  in.read(reinterpret_cast<char*>(h), sizeof h);
  if (in.gcount() == 8 && std::memcmp(h, kShardMagic, 8) == 0) return "forge";
  if (in.gcount() >= 4 && (get_u32(h) == kLlmcGpt2Magic || get_u32(h) == kLlmcLlama3Magic)) return "llm.c";
  if (megatron_token_bytes(path) > 0) return "megatron";
  return "";
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
  // (Megatron's .bin has no header: an empty one maps nothing.)
  void* map = file_bytes == 0 ? nullptr : ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd, 0);
  const std::string map_err = map == MAP_FAILED ? errno_str() : "";
  ::close(fd);  // the mapping keeps the file alive
  FORGE_CHECK(map != MAP_FAILED, "TokenShard: cannot mmap '", path, "': ", map_err);
  map_ = map;
  map_bytes_ = file_bytes;
  const auto* base = static_cast<const unsigned char*>(map);
  try {
    // Note [token shard formats]: forge's own, llm.c's, or Megatron-LM's (.bin beside its .idx).
    uint64_t header = 0, count = 0;
    uint32_t dtype = 0;
    const uint32_t first = file_bytes >= 4 ? get_u32(base) : 0;
    if (file_bytes >= 8 && std::memcmp(base, kShardMagic, 8) == 0) {
      FORGE_CHECK(file_bytes >= kShardHeaderBytes, "TokenShard: '", path, "' is truncated: ", file_bytes,
                  " bytes, shorter than the ", kShardHeaderBytes, "-byte header");
      const uint32_t version = get_u32(base + 8);
      FORGE_CHECK(version == kShardVersion, "TokenShard: '", path, "' has version ", version,
                  "; this forge reads version ", kShardVersion);
      dtype = get_u32(base + 12);
      FORGE_CHECK(dtype == 2 || dtype == 4, "TokenShard: '", path, "' has dtype ", dtype,
                  "; expected 2 (uint16) or 4 (uint32)");
      header = kShardHeaderBytes, count = get_u64(base + 16), format_ = "forge";
    } else if (first == kLlmcGpt2Magic || first == kLlmcLlama3Magic) {
      // llm.c (dev/data/data_common.py): 256 int32 -- magic, version, token count -- then the
      // tokens: GPT-2's uint16 (magic 20240520, version 1), LLaMA-3's uint32 (20240801, 7).
      FORGE_CHECK(file_bytes >= kLlmcHeaderBytes, "TokenShard: '", path, "' is truncated: ", file_bytes,
                  " bytes, shorter than llm.c's ", kLlmcHeaderBytes, "-byte header");
      const uint32_t version = get_u32(base + 4);
      const bool gpt2 = first == kLlmcGpt2Magic;
      FORGE_CHECK(version == (gpt2 ? 1u : 7u), "TokenShard: '", path, "' is an llm.c shard (magic ", first,
                  ") of version ", version, "; forge reads version ", gpt2 ? 1 : 7, " for that magic");
      dtype = gpt2 ? 2 : 4;
      header = kLlmcHeaderBytes, count = get_u32(base + 8), format_ = "llm.c";
    } else if (const int bytes = megatron_token_bytes(path); bytes > 0) {
      dtype = static_cast<uint32_t>(bytes);
      FORGE_CHECK(file_bytes % dtype == 0, "TokenShard: '", path, "' (Megatron, ", dtype, "-byte tokens) holds ",
                  file_bytes, " bytes, not a whole number of tokens");
      check_megatron_index(path, file_bytes, dtype);
      header = 0, count = file_bytes / dtype, format_ = "megatron";
    } else {
      FORGE_THROW("TokenShard: '", path, "' is not a token shard forge reads: not forge's (magic \"FRGTOK\\0\\0\"), ",
                  "not llm.c's (magic 20240520 or 20240801), and no Megatron index '",
                  path.size() > 4 ? path.substr(0, path.size() - 4) : path, ".idx' beside it");
    }
    const uint64_t payload = file_bytes - header;
    FORGE_CHECK(count <= payload / dtype, "TokenShard: '", path, "' is truncated: header says ", count, " tokens of ",
                dtype, " bytes but only ", payload, " bytes follow the header");
    FORGE_CHECK(payload == count * dtype, "TokenShard: '", path, "' is longer than its header says: ", count,
                " tokens of ", dtype, " bytes (", count * dtype, " bytes) but ", payload, " bytes follow the header");
    count_ = static_cast<int64_t>(count);
    dtype_bytes_ = static_cast<int>(dtype);
    payload_ = base + header;
  } catch (...) {
    release();
    throw;
  }
}

int32_t TokenShard::max_token() const {
  uint32_t most = 0;
  if (dtype_bytes_ == 2) {
#pragma omp parallel for reduction(max : most) schedule(static) if (count_ > (1 << 20))
    for (int64_t i = 0; i < count_; ++i) most = std::max<uint32_t>(most, load_u16(i));
  } else {
#pragma omp parallel for reduction(max : most) schedule(static) if (count_ > (1 << 20))
    for (int64_t i = 0; i < count_; ++i) most = std::max<uint32_t>(most, load_u32(i));
  }
  return count_ == 0 ? -1 : static_cast<int32_t>(std::min<uint32_t>(most, 0x7fffffffu));
}

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      payload_(std::exchange(other.payload_, nullptr)),
      count_(std::exchange(other.count_, 0)),
      dtype_bytes_(other.dtype_bytes_),
      format_(std::move(other.format_)) {}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    payload_ = std::exchange(other.payload_, nullptr);
    count_ = std::exchange(other.count_, 0);
    dtype_bytes_ = other.dtype_bytes_;
    format_ = std::move(other.format_);
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
