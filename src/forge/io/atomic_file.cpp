// Crash-safe file and directory replacement; the contract is in atomic_file.h.
#include "forge/io/atomic_file.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <mutex>
#include <random>
#include <system_error>
#include <vector>

#include "forge/core/error.h"

namespace forge::io {

namespace fs = std::filesystem;

namespace {

// A failed syscall. Its message already names the path(s) and the errno text, so the
// catch blocks below rethrow it unchanged instead of wrapping it again.
class SysError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void throw_sys(const std::string& what, int err) {
  throw SysError(forge::detail::concat(what, ": ", std::system_category().message(err), " (errno ", err, ")"));
}

std::string quoted(const fs::path& p) {
  // Built by appending: GCC 12 warns falsely (-Wrestrict) on "'" + std::string&&.
  std::string s(1, '\'');
  s += p.native();
  s += '\'';
  return s;
}

uint64_t random_u64() {
  static std::mutex mu;
  static std::mt19937_64 rng = [] {
    std::random_device rd;
    const uint64_t t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::seed_seq seq{rd(), rd(), static_cast<unsigned>(t), static_cast<unsigned>(t >> 32),
                      static_cast<unsigned>(::getpid())};
    return std::mt19937_64(seq);
  }();
  std::lock_guard<std::mutex> lock(mu);
  return rng();
}

// "<dir>/<name>.<kind>.<pid>.<16 hex digits>" next to `target`.
fs::path sibling_name(const fs::path& target, const char* kind) {
  char suffix[64];
  std::snprintf(suffix, sizeof(suffix), ".%s.%ld.%016" PRIx64, kind, static_cast<long>(::getpid()), random_u64());
  return target.parent_path() / (target.filename().string() + suffix);
}

fs::path directory_of(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); }

// "a/b/" names the directory "a/b": drop the empty last component.
fs::path normalized_target(const fs::path& p) {
  FORGE_CHECK(!p.empty(), "atomic write: empty path");
  fs::path n = p.lexically_normal();
  if (!n.has_filename() && n.has_parent_path()) n = n.parent_path();
  FORGE_CHECK(n.has_filename() && n.filename() != "." && n.filename() != "..",
              "atomic write: '", p.string(), "' does not name a file or directory");
  return n;
}

void fsync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw_sys("cannot open " + quoted(p) + " to fsync it", errno);
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    throw_sys("fsync of " + quoted(p) + " failed", err);
  }
  ::close(fd);
}

// fsync every regular file and directory below `root`, children before parents.
void fsync_tree(const fs::path& root) {
  std::error_code ec;
  std::vector<fs::path> dirs{root};
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::file_status st = it->symlink_status(ec);
    if (ec) break;
    if (fs::is_regular_file(st)) fsync_path(it->path(), false);
    else if (fs::is_directory(st)) dirs.push_back(it->path());
  }
  if (ec) throw_sys("cannot list " + quoted(root), ec.value());
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) fsync_path(*it, true);
}

void remove_tree_quietly(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
}

// True if `name` is "<base>.<kind>.<digits>.<16 hex digits>".
bool matches_sibling(const std::string& name, const std::string& base, const std::string& kind) {
  const std::string prefix = base + "." + kind + ".";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return false;
  const std::string rest = name.substr(prefix.size());
  const size_t dot = rest.find('.');
  if (dot == 0 || dot == std::string::npos) return false;
  for (size_t i = 0; i < dot; ++i)
    if (rest[i] < '0' || rest[i] > '9') return false;
  const std::string hex = rest.substr(dot + 1);
  if (hex.size() != 16) return false;
  for (char c : hex)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

// ---- OutputFile ----------------------------------------------------------------------------

void OutputFile::write(const void* data, size_t nbytes) {
  const char* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    const ssize_t n = ::write(fd_, p, nbytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_sys("write to " + quoted(target_) + " failed after " + std::to_string(written_) + " bytes", errno);
    }
    p += n;
    nbytes -= static_cast<size_t>(n);
    written_ += static_cast<uint64_t>(n);
  }
}

// ---- files ---------------------------------------------------------------------------------

void fsync_directory(const fs::path& dir) { fsync_path(dir, true); }

AtomicFile::AtomicFile(const fs::path& path_in) : path_(normalized_target(path_in)), tmp_(sibling_name(path_, "tmp")) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd_ < 0) throw_sys("cannot write " + quoted(path_) + ": cannot create its temporary " + quoted(tmp_), errno);
  out_ = std::make_unique<OutputFile>(fd_, path_);
}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  if (fd_ >= 0) ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t nbytes) {
  const char* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    const ssize_t n = ::pwrite(fd_, p, nbytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_sys("write to " + quoted(path_) + " at byte " + std::to_string(offset) + " failed", errno);
    }
    p += n, offset += static_cast<uint64_t>(n);
    nbytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  FORGE_CHECK(!committed_, "AtomicFile: ", quoted(path_), " is already committed");
  if (::fsync(fd_) != 0) throw_sys("fsync of " + quoted(tmp_) + " (for " + quoted(path_) + ") failed", errno);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) throw_sys("close of " + quoted(tmp_) + " (for " + quoted(path_) + ") failed", errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw_sys("cannot rename " + quoted(tmp_) + " to " + quoted(path_), errno);
  committed_ = true;
  fsync_directory(directory_of(path_));
}

void write_file_atomic(const fs::path& path_in, const FileWriter& writer) {
  AtomicFile file(path_in);  // (destroyed uncommitted on any error: the temporary goes)
  try {
    writer(file.out());
  } catch (const SysError&) {
    throw;
  } catch (const std::exception& e) {
    FORGE_THROW("writing ", quoted(file.out().target()), " failed (the file is unchanged): ", e.what());
  }
  file.commit();
}

void write_file_atomic(const fs::path& path, std::string_view contents) {
  write_file_atomic(path, [&](OutputFile& f) { f.write(contents); });
}

std::string read_file(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_sys("cannot open " + quoted(path), errno);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw_sys("cannot read " + quoted(path), err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// ---- directories ---------------------------------------------------------------------------

namespace detail {

void replace_directory_atomic(const fs::path& dir_in, const DirectoryFiller& filler, bool allow_exchange) {
  const fs::path dir = normalized_target(dir_in);
  const fs::path parent = directory_of(dir);
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) throw_sys("cannot create the parent directory " + quoted(parent) + " of " + quoted(dir), ec.value());
  const fs::file_status st = fs::symlink_status(dir, ec);
  const bool exists = fs::exists(st);
  FORGE_CHECK(!exists || fs::is_directory(st), "cannot replace ", quoted(dir),
              " with a directory: it exists and is not a directory");

  const fs::path tmp = sibling_name(dir, "tmp");
  if (::mkdir(tmp.c_str(), 0777) != 0)
    throw_sys("cannot write " + quoted(dir) + ": cannot create its temporary " + quoted(tmp), errno);
  try {
    filler(tmp);
    fsync_tree(tmp);
  } catch (const SysError&) {
    remove_tree_quietly(tmp);
    throw;
  } catch (const std::exception& e) {
    remove_tree_quietly(tmp);
    FORGE_THROW("writing directory ", quoted(dir), " failed (it is unchanged): ", e.what());
  } catch (...) {
    remove_tree_quietly(tmp);
    throw;
  }

  if (!exists) {
    if (::rename(tmp.c_str(), dir.c_str()) != 0) {
      const int err = errno;
      remove_tree_quietly(tmp);
      throw_sys("cannot rename " + quoted(tmp) + " to " + quoted(dir), err);
    }
    fsync_directory(parent);
    return;
  }

  if (allow_exchange) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
      fsync_directory(parent);  // the new contents are now durable under `dir`
      remove_tree_quietly(tmp);  // `tmp` now holds the old contents
      fsync_directory(parent);
      return;
    }
    const int err = errno;
    if (err != EINVAL && err != ENOSYS && err != ENOTSUP) {
      remove_tree_quietly(tmp);
      throw_sys("cannot exchange " + quoted(tmp) + " with " + quoted(dir), err);
    }
  }

  // Fallback: two renames; recover_directory() repairs a crash between them.
  const fs::path old = sibling_name(dir, "old");
  if (::rename(dir.c_str(), old.c_str()) != 0) {
    const int err = errno;
    remove_tree_quietly(tmp);
    throw_sys("cannot move " + quoted(dir) + " aside to " + quoted(old), err);
  }
  if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    const int err = errno;
    const bool restored = ::rename(old.c_str(), dir.c_str()) == 0;
    remove_tree_quietly(tmp);
    throw_sys("cannot rename " + quoted(tmp) + " to " + quoted(dir) +
                  (restored ? " (the old directory was put back)" : " (the old directory is at " + quoted(old) + ")"),
              err);
  }
  fsync_directory(parent);
  remove_tree_quietly(old);
  fsync_directory(parent);
}

}  // namespace detail

void replace_directory_atomic(const fs::path& dir, const DirectoryFiller& filler) {
  detail::replace_directory_atomic(dir, filler, /*allow_exchange=*/true);
}

bool recover_directory(const fs::path& dir_in) {
  const fs::path dir = normalized_target(dir_in);
  const fs::path parent = directory_of(dir);
  const std::string base = dir.filename().string();
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) return false;

  std::vector<fs::path> olds, tmps;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (matches_sibling(name, base, "old")) olds.push_back(it->path());
    else if (matches_sibling(name, base, "tmp")) tmps.push_back(it->path());
  }
  if (ec) throw_sys("cannot list " + quoted(parent), ec.value());

  bool changed = false;
  if (!fs::exists(fs::symlink_status(dir, ec)) && !olds.empty()) {
    // The newest aside copy is the one a crashed replace moved out of the way.
    auto newest = olds.begin();
    for (auto it = olds.begin(); it != olds.end(); ++it) {
      if (fs::last_write_time(*it, ec) > fs::last_write_time(*newest, ec)) newest = it;
    }
    if (::rename(newest->c_str(), dir.c_str()) != 0)
      throw_sys("cannot restore " + quoted(*newest) + " to " + quoted(dir), errno);
    olds.erase(newest);
    changed = true;
  }
  for (const auto& list : {olds, tmps}) {
    for (const auto& p : list) {
      remove_tree_quietly(p);
      changed = true;
    }
  }
  if (changed) fsync_directory(parent);
  return fs::exists(dir, ec);
}

bool is_temporary_name(const std::string& filename) {
  // "<base>.<tmp|old>.<digits>.<16 hex>": split from the right.
  const size_t hex_dot = filename.rfind('.');
  if (hex_dot == std::string::npos || hex_dot == 0) return false;
  const size_t pid_dot = filename.rfind('.', hex_dot - 1);
  if (pid_dot == std::string::npos || pid_dot == 0) return false;
  const size_t kind_dot = filename.rfind('.', pid_dot - 1);
  if (kind_dot == std::string::npos || kind_dot == 0) return false;
  const std::string kind = filename.substr(kind_dot + 1, pid_dot - kind_dot - 1);
  if (kind != "tmp" && kind != "old") return false;
  return matches_sibling(filename, filename.substr(0, kind_dot), kind);
}

}  // namespace forge::io
