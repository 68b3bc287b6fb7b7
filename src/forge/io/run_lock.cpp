// One writer per run directory (Note [run directory lock] in run_lock.h).
#include "forge/io/run_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/io/json_input.h"

namespace forge::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string utc_time(double unix_s) {
  const auto t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string read_fd(int fd) {
  std::string out;
  char buf[4096];
  off_t off = 0;
  while (out.size() < (1u << 16)) {  // a lock file is a line of JSON; never read more than 64 KiB
    const ssize_t n = ::pread(fd, buf, sizeof(buf), off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    off += n;
  }
  return out;
}

json parse_holder(const std::string& text) {
  try {
    json j = parse_json(text, "run lock");
    if (j.is_object() && j.contains("pid") && j["pid"].is_number_integer() && j.contains("host") && j["host"].is_string())
      return j;
  } catch (const Error&) {
  }
  return json();
}

std::string describe(const json& h) {
  if (h.is_null()) return "";
  std::string s = "pid " + std::to_string(h["pid"].get<long long>()) + " on host " + h["host"].get<std::string>();
  if (h.contains("started_unix") && h["started_unix"].is_number()) s += " since " + utc_time(h["started_unix"].get<double>());
  if (h.contains("command") && h["command"].is_string()) s += " (" + h["command"].get<std::string>() + ")";
  return s;
}

void write_holder(int fd, const fs::path& path, const std::string& command) {
  const double now = unix_now();
  const std::string text = json{{"pid", static_cast<long long>(::getpid())}, {"host", host_name()},
                                {"started_unix", now}, {"started", utc_time(now)}, {"command", command}}
                               .dump() + "\n";
  FORGE_CHECK(::ftruncate(fd, 0) == 0, "run lock '", path.string(), "': cannot write it: ", std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::pwrite(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    FORGE_CHECK(n > 0, "run lock '", path.string(), "': cannot write it: ", std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  ::fsync(fd);
}

[[noreturn]] void refuse(const fs::path& path, const json& holder) {
  FORGE_THROW("run directory '", path.parent_path().string(), "' is in use: ", path.filename().string(),
              " is held by ", holder.is_null() ? std::string("another process") : describe(holder),
              ". One run directory takes one writer: wait for that run to end or stop it, or choose another "
              "run.name (or run.dir)");
}

}  // namespace

RunLock::RunLock(const fs::path& run_dir, const std::string& command, std::string* warning)
    : path_(run_dir / kFileName) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  FORGE_CHECK(fd_ >= 0, "run lock: cannot open '", path_.string(), "': ", std::strerror(errno),
              " (the run directory must be writable)");
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
    flocked_ = true;
    try {
      write_holder(fd_, path_, command);
    } catch (...) {
      ::close(fd_);
      throw;
    }
    return;
  }
  const int err = errno;
  if (err == EWOULDBLOCK || err == EINTR) {
    const json holder = parse_holder(read_fd(fd_));
    ::close(fd_);
    fd_ = -1;
    refuse(path_, holder);
  }
  if (err != ENOLCK && err != EOPNOTSUPP && err != ENOSYS && err != EINVAL) {
    ::close(fd_);
    FORGE_THROW("run lock: cannot lock '", path_.string(), "': ", std::strerror(err));
  }
  // The fallback (Note [run directory lock]): the holder the file names, if it still lives.
  const json holder = parse_holder(read_fd(fd_));
  if (!holder.is_null()) {
    const auto pid = static_cast<pid_t>(holder["pid"].get<long long>());
    bool alive;
    if (holder["host"].get<std::string>() == host_name()) {
      alive = pid != ::getpid() && (::kill(pid, 0) == 0 || errno == EPERM);
    } else {
      struct stat st {};
      alive = ::fstat(fd_, &st) == 0 && unix_now() - static_cast<double>(st.st_mtime) < kStaleSeconds;
    }
    if (alive) {
      ::close(fd_);
      fd_ = -1;
      refuse(path_, holder);
    }
    if (warning != nullptr)
      *warning = "run lock: this file system refuses flock; taking over '" + path_.string() + "' from " +
                 describe(holder) + ", which no longer runs (or sent no heartbeat for " +
                 std::to_string(static_cast<int>(kStaleSeconds)) + " s)";
  }
  try {
    write_holder(fd_, path_, command);
  } catch (...) {
    ::close(fd_);
    throw;
  }
  last_beat_ = unix_now();
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  // Emptied while still held, so nobody reads a holder that has gone; closing releases the flock.
  [[maybe_unused]] const int rc = ::ftruncate(fd_, 0);
  ::close(fd_);
}

void RunLock::heartbeat() {
  if (flocked_ || fd_ < 0) return;
  const double now = unix_now();
  if (now - last_beat_ < 60) return;
  last_beat_ = now;
  ::futimens(fd_, nullptr);
}

std::string describe_lock_holder(const fs::path& lock_file) {
  const int fd = ::open(lock_file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  const std::string text = read_fd(fd);
  ::close(fd);
  return describe(parse_holder(text));
}

}  // namespace forge::io
