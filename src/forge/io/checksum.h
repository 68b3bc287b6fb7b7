#pragma once
// File checksums for checkpoint manifests (io/checkpoint.h): XXH3-64 from the xxHash library
// (Debian: libxxhash-dev, used header-only), which hashes at memory speed (tens of GB/s with
// SSE2/AVX2), so verifying a checkpoint costs about what reading it costs.
//
//   const io::FileDigest d = io::file_digest("model.safetensors");   // {bytes, "xxh3:0123abcd..."}
//
// A digest is written as "xxh3:" and the 16 lower-case hex digits of the 64-bit hash (the
// canonical big-endian form `xxhsum -H3` prints), so a manifest says which hash it holds.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace forge::io {

struct FileDigest {
  uint64_t bytes = 0;
  std::string hash;  // "xxh3:<16 hex digits>"
  friend bool operator==(const FileDigest&, const FileDigest&) = default;
};

// Reads the whole file once (buffered, not mapped); throws a forge::Error naming the path on
// failure.
FileDigest file_digest(const std::filesystem::path& path);
// The digests of several files, up to 8 at a time on threads of their own (a checkpoint's shard
// files); in the order given. Throws the first error.
std::vector<FileDigest> digest_files(const std::vector<std::filesystem::path>& paths);
// The digest of bytes in memory (tests, and small files already read).
std::string bytes_digest(std::string_view bytes);

}  // namespace forge::io
