#pragma once
// Crash-safe writes: a file or a whole directory is either the old one or the new one,
// never a torn mix, whatever moment the process (or the machine) dies.
//
// Contract — files (write_file_atomic):
//   1. create PATH.tmp.<pid>.<random hex> in PATH's directory (O_EXCL, so two writers never
//      share a temporary);
//   2. the caller's writer fills it through an OutputFile;
//   3. fsync the file, close it, rename() it over PATH (atomic on POSIX file systems);
//   4. fsync PATH's directory so the rename itself is durable.
//   On any error (a failing syscall, or the writer throwing) the temporary is removed and a
//   forge::Error naming the path (and, for a syscall, the errno text) is thrown; PATH is
//   untouched.
//
// Contract — directories (replace_directory_atomic):
//   1. create DIR.tmp.<pid>.<random hex> next to DIR; the caller's filler writes into it;
//   2. fsync every regular file in it and the directory itself;
//   3. if DIR does not exist: rename the temporary to DIR. If it does: swap the two
//      atomically (renameat2 RENAME_EXCHANGE, Linux >= 3.15), or, on a file system that
//      cannot, rename DIR aside to DIR.old.<pid>.<random hex> and the temporary to DIR;
//   4. fsync the parent directory, then remove the old contents.
//   Crash analysis: before step 3 DIR is the old checkpoint; the exchange is one atomic
//   step; in the two-rename fallback a crash between the renames leaves DIR missing but
//   both DIR.old.* (old, complete) and DIR.tmp.* (new, complete) on disk, and
//   recover_directory(DIR) puts the old one back. Leftover DIR.tmp.* / DIR.old.* names are
//   never mistaken for a checkpoint (is_temporary_name) and recover_directory removes them.
//   If the filler throws, the temporary directory is removed and DIR is untouched.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace forge::io {

// A file open for writing by write_file_atomic. write() writes everything or throws a
// forge::Error naming the final path and the errno text (EINTR and short writes are retried).
class OutputFile {
 public:
  OutputFile(int fd, std::filesystem::path target) : fd_(fd), target_(std::move(target)) {}
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t nbytes);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // Bytes written so far.
  uint64_t size() const { return written_; }
  // The path the file will have once committed (not the temporary's).
  const std::filesystem::path& target() const { return target_; }

 private:
  int fd_;
  std::filesystem::path target_;
  uint64_t written_ = 0;
};

// A file being written atomically, step by step: the temporary of the contract above is
// created by the constructor, filled through out() (and write_at, which overwrites bytes
// already written: a header whose counts are known last), and committed (fsync, rename,
// fsync of the directory) by commit(). Destroyed uncommitted (an error, an exception), it
// removes the temporary and PATH is untouched. write_file_atomic is this with one writer.
class AtomicFile {
 public:
  explicit AtomicFile(const std::filesystem::path& path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();
  OutputFile& out() { return *out_; }
  void write_at(uint64_t offset, const void* data, size_t nbytes);
  void commit();

 private:
  std::filesystem::path path_, tmp_;
  int fd_ = -1;
  std::unique_ptr<OutputFile> out_;
  bool committed_ = false;
};

using FileWriter = std::function<void(OutputFile&)>;
// Receives the temporary directory to fill.
using DirectoryFiller = std::function<void(const std::filesystem::path& tmp_dir)>;

// Writes `path` atomically (see the contract above). The parent directory must exist.
void write_file_atomic(const std::filesystem::path& path, const FileWriter& writer);
void write_file_atomic(const std::filesystem::path& path, std::string_view contents);

// Replaces (or creates) directory `dir` atomically (see the contract above). The parent
// directory is created if missing.
void replace_directory_atomic(const std::filesystem::path& dir, const DirectoryFiller& filler);

// After a crash: if `dir` is missing but an aside copy DIR.old.* exists, renames the newest
// such copy back to `dir`; then removes every DIR.tmp.* and DIR.old.* left next to it.
// Returns true if `dir` exists afterwards. Call it only when no other process is writing
// `dir` (its temporaries would be removed).
bool recover_directory(const std::filesystem::path& dir);

// True for names this module gives temporaries and aside copies: "<name>.tmp.<pid>.<hex>"
// or "<name>.old.<pid>.<hex>".
bool is_temporary_name(const std::string& filename);

// Reads a whole file; throws a forge::Error naming the path on failure.
std::string read_file(const std::filesystem::path& path);

// fsync of a directory (makes renames and creations inside it durable).
void fsync_directory(const std::filesystem::path& dir);

namespace detail {
// replace_directory_atomic with the RENAME_EXCHANGE step switched off, so tests can drive
// the two-rename fallback on file systems that support the exchange.
void replace_directory_atomic(const std::filesystem::path& dir, const DirectoryFiller& filler,
                              bool allow_exchange);
}  // namespace detail

}  // namespace forge::io
