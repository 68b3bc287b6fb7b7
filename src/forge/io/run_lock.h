#pragma once
// One writer per run directory.
//
// Note [run directory lock]: `forge train` holds <run dir>/forge.lock for as long as it runs
// (its rank 0 does, for the whole job). The lock is an flock(2) on that file, so the kernel
// releases it when the holder dies in any way (kill -9 included): a lock left by a dead process
// is never in the way. While held, the file names the holder (JSON: pid, host, start time, the
// command); a second writer is refused at once with an error that names it. The file stays
// after the holder ends (emptied), as a file this module owns.
//
// Shared file systems: on NFS (v4, or v3 with lockd) Linux maps flock to the server's byte-range
// locks, so holders on different machines exclude each other, and a dead machine's lock ends
// with its lease (NFSv4: about 90 s). Lustre gives cluster-wide flock only when mounted with
// `-o flock` (`localflock` excludes only within one machine); where flock is refused (ENOLCK,
// EOPNOTSUPP, ENOSYS, EINVAL) forge falls back to the file's contents: a holder on this machine
// whose process is alive, or on another machine whose heartbeat (the file's modification time,
// renewed every minute by heartbeat()) is younger than kStaleSeconds, keeps the lock; anything
// older is taken over with a warning. That fallback cannot exclude two starts in the same
// instant; docs/train.md ("Long runs") says so.
#include <filesystem>
#include <string>

namespace forge::io {

class RunLock {
 public:
  static constexpr double kStaleSeconds = 600;  // the fallback's heartbeat age that frees a lock
  static constexpr const char* kFileName = "forge.lock";

  // Takes the lock of `run_dir` (which must exist) for `command` (recorded for whoever is
  // refused). Throws a forge::Error naming the holder (pid, host, since, command) and the fix.
  // `warning` gets a line when the fallback took over a stale lock.
  RunLock(const std::filesystem::path& run_dir, const std::string& command, std::string* warning = nullptr);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  // The fallback's heartbeat: renews the file's modification time at most once a minute (a
  // no-op where flock holds the lock).
  void heartbeat();
  // Whether the kernel holds the lock (flock) rather than the fallback.
  bool kernel_lock() const { return flocked_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  bool flocked_ = false;
  double last_beat_ = 0;
};

// The holder a lock file names ("pid 4242 on host gpu7 since 2026-12-06 10:11:12 UTC: forge train
// configs/x.toml"), or "" when it names none.
std::string describe_lock_holder(const std::filesystem::path& lock_file);

}  // namespace forge::io
