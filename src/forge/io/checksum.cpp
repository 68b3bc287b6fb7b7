// XXH3-64 digests of files (contracts in checksum.h).
#include "forge/io/checksum.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#define XXH_INLINE_ALL  // header-only: no library to link, every call inlined
#include <xxhash.h>

#include "forge/core/error.h"

namespace forge::io {

namespace {

std::string hex_of(XXH64_hash_t h) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return std::string("xxh3:") + buf;
}

struct StateDeleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};

}  // namespace

FileDigest file_digest(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FORGE_CHECK(fd >= 0, "cannot open '", path.string(), "' to checksum it: ", std::strerror(errno));
  std::unique_ptr<XXH3_state_t, StateDeleter> state(XXH3_createState());
  if (!state || XXH3_64bits_reset(state.get()) == XXH_ERROR) {
    ::close(fd);
    FORGE_THROW("cannot checksum '", path.string(), "': out of memory");
  }
  // Sequential reads of 8 MiB: the kernel's read-ahead keeps the disk busy while the hash runs.
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<char> buf(size_t{8} << 20);
  FileDigest d;
  while (true) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      FORGE_THROW("cannot read '", path.string(), "' to checksum it: ", std::strerror(err));
    }
    if (n == 0) break;
    XXH3_64bits_update(state.get(), buf.data(), static_cast<size_t>(n));
    d.bytes += static_cast<uint64_t>(n);
  }
  ::close(fd);
  d.hash = hex_of(XXH3_64bits_digest(state.get()));
  return d;
}

std::vector<FileDigest> digest_files(const std::vector<std::filesystem::path>& paths) {
  std::vector<FileDigest> out(paths.size());
  if (paths.size() <= 1) {
    for (size_t i = 0; i < paths.size(); ++i) out[i] = file_digest(paths[i]);
    return out;
  }
  // Threads take the next file in turn; the first error is rethrown after all have stopped.
  std::atomic<size_t> next{0};
  std::mutex m;
  std::exception_ptr error;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < paths.size();) {
      try {
        out[i] = file_digest(paths[i]);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(m);
        if (!error) error = std::current_exception();
      }
    }
  };
  const size_t n = std::min<size_t>({paths.size(), 8, std::max(1u, std::thread::hardware_concurrency())});
  std::vector<std::thread> threads;
  for (size_t t = 0; t < n; ++t) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  return out;
}

std::string bytes_digest(std::string_view bytes) { return hex_of(XXH3_64bits(bytes.data(), bytes.size())); }

}  // namespace forge::io
