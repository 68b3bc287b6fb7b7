// forge launch (launch.h): plan the ranks, start them, relay their output, forward signals,
// and stop the job when one rank fails.
//
// Note [launcher loop]: the launcher is one thread. It polls the ranks' stdout/stderr pipes and
// a self-pipe its signal handlers write to (20 ms timeout), reaps children with
// waitpid(WNOHANG) after every wake-up, and keeps the stop deadline (SIGTERM, then SIGKILL
// after the grace period). No thread means nothing to join when a rank's orphaned
// grandchild keeps a pipe open: once every child is reaped, the pipes are drained for at most
// half a second and closed.
#include "forge/parallel/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <string_view>
#include <iterator>

#include "forge/core/error.h"
#include "forge/ops/creation.h"
#include "forge/parallel/launch_output.h"

#ifdef FORGE_WITH_CUDA
#include "forge/parallel/nccl_group.h"
#endif

extern char** environ;

namespace forge::parallel {

namespace fs = std::filesystem;

LaunchDevice parse_launch_device(const std::string& s) {
  if (s == "auto") return LaunchDevice::auto_;
  if (s == "cpu") return LaunchDevice::cpu;
  if (s == "cuda") return LaunchDevice::cuda;
  FORGE_THROW("unknown launch device '", s, "'; expected auto, cpu or cuda");
}

SpawnMode parse_spawn_mode(const std::string& s) {
  if (s == "auto") return SpawnMode::auto_;
  if (s == "direct") return SpawnMode::direct;
  if (s == "mpirun") return SpawnMode::mpirun;
  FORGE_THROW("unknown spawn mode '", s, "'; expected auto, direct or mpirun");
}

const char* launch_device_name(LaunchDevice d) {
  switch (d) {
    case LaunchDevice::auto_: return "auto";
    case LaunchDevice::cpu: return "cpu";
    case LaunchDevice::cuda: return "cuda";
  }
  return "?";
}

const char* spawn_mode_name(SpawnMode s) {
  switch (s) {
    case SpawnMode::auto_: return "auto";
    case SpawnMode::direct: return "direct";
    case SpawnMode::mpirun: return "mpirun";
  }
  return "?";
}

namespace {

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string make_nccl_id_hex() {
#ifdef FORGE_WITH_CUDA
  return parallel::new_nccl_id_hex();
#else
  FORGE_THROW("forge launch: GPU ranks need NCCL, and this forge was built without CUDA");
#endif
}

int allowed_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

// The first line `cmd` prints (stdout and stderr), "" when it cannot be run.
std::string first_output(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  ::pclose(p);
  return out;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v) s += (s.empty() ? "" : " ") + a;
  return s;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGPIPE: return "SIGPIPE";
    case SIGTERM: return "SIGTERM";
    default: return "signal";
  }
}

}  // namespace

std::string find_executable(const std::string& name, const std::string& what) {
  FORGE_CHECK(!name.empty(), "forge launch: ", what, " is empty");
  if (name.find('/') != std::string::npos) {
    FORGE_CHECK(is_executable_file(name), "forge launch: ", what, " '", name, "' is not an executable file",
                fs::exists(name) ? " (chmod +x it?)" : " (no such file)");
    return fs::absolute(name).string();
  }
  const char* path_env = std::getenv("PATH");
  const std::string path = path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t end = path.find(':', pos);
    if (end == std::string::npos) end = path.size();
    const std::string dir = end > pos ? path.substr(pos, end - pos) : ".";
    const std::string cand = dir + "/" + name;
    if (is_executable_file(cand)) return fs::absolute(cand).string();
    pos = end + 1;
  }
  FORGE_THROW("forge launch: ", what, " '", name, "' is not found on PATH (", path, "); give its path");
}

LaunchPlan plan_launch(const LaunchOptions& opt, bool make_nccl_id) {
  FORGE_CHECK(!opt.command.empty(),
              "forge launch: no command to run; e.g. forge launch --nproc-per-node 2 -- forge train configs/tiny.toml");
  FORGE_CHECK(opt.grace_seconds >= 0, "forge launch: --grace-seconds ", opt.grace_seconds, " is negative");
  const int gpus = opt.visible_gpus >= 0 ? opt.visible_gpus : cuda_device_count();
  LaunchPlan plan;
  plan.device = opt.device == LaunchDevice::auto_ ? (gpus > 0 ? LaunchDevice::cuda : LaunchDevice::cpu) : opt.device;
#ifdef FORGE_WITH_CUDA
  constexpr const char* kNoGpuFix = "check nvidia-smi and CUDA_VISIBLE_DEVICES";
#else
  constexpr const char* kNoGpuFix = "this forge was built without CUDA";
#endif
  if (plan.device == LaunchDevice::cuda)
    FORGE_CHECK(gpus > 0, "forge launch: --device cuda, but no GPU is visible (", kNoGpuFix,
                "); use --device cpu for CPU ranks");

  if (opt.nproc_per_node == "gpu") {
    FORGE_CHECK(plan.device == LaunchDevice::cuda, "forge launch: --nproc-per-node gpu starts one rank per GPU, but ",
                gpus == 0 ? "no GPU is visible" : "the ranks are CPU ranks (--device cpu)",
                "; give the number of ranks, e.g. --nproc-per-node 2");
    plan.nproc = gpus;
  } else {
    const std::string& s = opt.nproc_per_node;
    int n = 0;
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
    FORGE_CHECK(!s.empty() && ec == std::errc() && p == s.data() + s.size(), "forge launch: --nproc-per-node '", s,
                "' is neither a number nor 'gpu'");
    FORGE_CHECK(n >= 1, "forge launch: --nproc-per-node ", n, " must be at least 1");
    plan.nproc = n;
  }
  if (plan.device == LaunchDevice::cuda)
    FORGE_CHECK(plan.nproc <= gpus, "forge launch: ", plan.nproc, " GPU ranks, but ", gpus, " GPU",
                gpus == 1 ? " is" : "s are", " visible (one rank per GPU); use --nproc-per-node ", gpus,
                " (or gpu), or --device cpu for CPU ranks");
  plan.spawn = opt.spawn != SpawnMode::auto_ ? opt.spawn
               : plan.device == LaunchDevice::cuda || plan.nproc == 1 ? SpawnMode::direct
                                                                      : SpawnMode::mpirun;

  // The command: `forge` is this executable.
  std::vector<std::string> command = opt.command;
  if (command[0] == "forge") {
    command[0] = !opt.forge_executable.empty() ? opt.forge_executable : fs::read_symlink("/proc/self/exe").string();
    FORGE_CHECK(is_executable_file(command[0]), "forge launch: the forge executable '", command[0],
                "' is not an executable file");
  } else {
    command[0] = find_executable(command[0], "the command");
  }

  // Every rank's environment.
  plan.env["FORGE_BIND"] = bind_mode_name(opt.bind);
  plan.env["FORGE_RESTART_COUNT"] = std::to_string(opt.restart_count);
  plan.env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
  std::string threads_note;
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int threads = std::max(1, allowed_cpu_count() / plan.nproc);
    plan.env["OMP_NUM_THREADS"] = std::to_string(threads);
    threads_note = ", OMP_NUM_THREADS=" + std::to_string(threads);
  }
  const char* what = plan.device == LaunchDevice::cuda ? "GPU" : "CPU";
  std::ostringstream summary;
  summary << "forge launch: " << plan.nproc << " " << what << " rank" << (plan.nproc == 1 ? "" : "s") << " ("
          << spawn_mode_name(plan.spawn) << " spawn), NUMA binding " << bind_mode_name(opt.bind) << threads_note;

  if (plan.spawn == SpawnMode::direct) {
    plan.executable = command[0];
    plan.argv = command;
    plan.env["FORGE_LAUNCHER"] = "forge";
    plan.env["WORLD_SIZE"] = std::to_string(plan.nproc);
    plan.env["LOCAL_WORLD_SIZE"] = std::to_string(plan.nproc);
    // Variables that would outrank ours in launch_env() (forge launch started inside an MPI job).
    plan.unset_env = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                      "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                      "FORGE_NCCL_ID"};
    if (plan.device == LaunchDevice::cuda && make_nccl_id) {
      plan.env["FORGE_NCCL_ID"] = make_nccl_id_hex();
      summary << ", NCCL id made here";
    }
    for (int r = 0; r < plan.nproc; ++r)
      plan.rank_env.push_back({{"RANK", std::to_string(r)}, {"LOCAL_RANK", std::to_string(r)}});
    if (plan.device == LaunchDevice::cpu && plan.nproc > 1)
      summary << " (CPU ranks started directly have no MPI: a CPU job needs --spawn mpirun)";
  } else {
    const std::string mpirun = [&] {
      try {
        return find_executable("mpirun", "mpirun");
      } catch (const Error&) {
        FORGE_THROW("forge launch: mpirun is not found on PATH: ", plan.device == LaunchDevice::cpu ? "CPU ranks" : "the ranks",
                    " talk over MPI and are started with mpirun; install Open MPI (apt install openmpi-bin) or put "
                    "its bin directory on PATH", plan.device == LaunchDevice::cpu ? "" : ", or use --spawn direct");
      }
    }();
    // Note [stopping under mpirun]: mpirun answers SIGTERM and SIGINT by killing the ranks within
    // seconds, but forwards SIGUSR1 and SIGUSR2; the launcher relays a stop as SIGUSR2, which the
    // ranks treat as one (forge train: Note [preemption]).
    plan.env["FORGE_LAUNCH_STOP_SIGNAL"] = "USR2";
    const std::string version = first_output(shell_quote(mpirun) + " --version 2>&1");
    const bool open_mpi = version.find("Open MPI") != std::string::npos || version.find("OpenRTE") != std::string::npos;
    plan.executable = mpirun;
    plan.argv = {mpirun};
    if (open_mpi) {
      // Binding is forge's (FORGE_BIND, numa.h) in every rank, the same as for direct ranks.
      // --tag-output: each line names its rank (Note [launch output]).
      plan.argv.insert(plan.argv.end(),
                       {"-np", std::to_string(plan.nproc), "--oversubscribe", "--bind-to", "none", "--tag-output"});
      plan.mpirun_tags = true;
      const size_t v = version.find(") ");  // "mpirun (Open MPI) 4.1.4"
      plan.tag_space = v != std::string::npos && v + 2 < version.size() && version[v + 2] >= '5' && version[v + 2] <= '9';
      if (::getuid() == 0) plan.argv.push_back("--allow-run-as-root");
      for (const auto& [k, v] : plan.env) plan.argv.insert(plan.argv.end(), {"-x", k});
    } else {
      // MPICH's Hydra passes the whole environment; it binds nothing by default.
      plan.argv.insert(plan.argv.end(), {"-n", std::to_string(plan.nproc)});
    }
    plan.argv.insert(plan.argv.end(), command.begin(), command.end());
    summary << " through " << (open_mpi ? "Open MPI's " : "") << mpirun;
  }
  summary << ": " << join(command);
  plan.summary = summary.str();
  return plan;
}

// ---- launch ------------------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> g_launch_active{false};
int g_signal_pipe[2] = {-1, -1};

extern "C" void forge_launch_on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};

// Handlers for the forwarded signals and SIGPIPE ignored, for the lifetime of a launch.
class SignalScope {
 public:
  SignalScope() {
    FORGE_CHECK(!g_launch_active.exchange(true), "forge launch: another launch is running in this process");
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
      g_launch_active = false;
      FORGE_THROW("forge launch: pipe2 failed: ", std::strerror(errno));
    }
    struct sigaction sa {};
    sa.sa_handler = forge_launch_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < std::size(kForwarded); ++i) ::sigaction(kForwarded[i], &sa, &old_[i]);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    ::sigaction(SIGPIPE, &ign, &old_pipe_);
  }
  ~SignalScope() {
    for (size_t i = 0; i < std::size(kForwarded); ++i) ::sigaction(kForwarded[i], &old_[i], nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
    g_signal_pipe[0] = g_signal_pipe[1] = -1;
    g_launch_active = false;
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;
  // Whether SIGPIPE was ignored before the launch (children inherit that, not our SIG_IGN).
  bool sigpipe_was_ignored() const { return old_pipe_.sa_handler == SIG_IGN; }

 private:
  struct sigaction old_[std::size(kForwarded)] {};
  struct sigaction old_pipe_ {};
};

struct Stream {
  int fd = -1;
  size_t child = 0;
  bool is_err = false;
  std::string buf;
};

struct Child {
  pid_t pid = -1;
  int rank = 0;
  bool alive = true;
};

// KEY=VALUE strings of the process environment with `plan`'s changes for rank `rank`.
std::vector<std::string> child_environment(const LaunchPlan& plan, int rank) {
  std::map<std::string, std::string> env;
  for (char** p = environ; p != nullptr && *p != nullptr; ++p) {
    const std::string kv(*p);
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& k : plan.unset_env) env.erase(k);
  for (const auto& [k, v] : plan.env) env[k] = v;
  if (rank < static_cast<int>(plan.rank_env.size()))
    for (const auto& [k, v] : plan.rank_env[static_cast<size_t>(rank)]) env[k] = v;
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
    } else {
      return;  // EPIPE and the like: the reader is gone, drop the output
    }
  }
}

// Forks one child running plan.executable with `env`; stdout/stderr go to new pipes whose read
// ends are returned. Only async-signal-safe calls between fork and exec.
pid_t spawn_child(const LaunchPlan& plan, int rank, int devnull, bool sigpipe_ignored, int& out_fd, int& err_fd) {
  std::vector<std::string> env_strings = child_environment(plan, rank);
  std::vector<char*> envp = c_strings(env_strings);
  std::vector<std::string> argv_strings = plan.argv;
  std::vector<char*> argv = c_strings(argv_strings);
  const std::string exec_fail = "forge launch: cannot execute " + plan.executable + ": errno ";
  int out[2], err[2];
  FORGE_CHECK(::pipe2(out, O_CLOEXEC) == 0, "forge launch: pipe2 failed: ", std::strerror(errno));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    FORGE_THROW("forge launch: pipe2 failed: ", std::strerror(errno));
  }
  // Block the forwarded signals across fork so the child never runs the launcher's handler.
  sigset_t block, saved;
  sigemptyset(&block);
  for (int s : kForwarded) sigaddset(&block, s);
  ::pthread_sigmask(SIG_BLOCK, &block, &saved);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int s : kForwarded) ::sigaction(s, &dfl, nullptr);
    if (!sigpipe_ignored) ::sigaction(SIGPIPE, &dfl, nullptr);
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(128 + SIGTERM);  // the launcher died before prctl
    ::dup2(devnull, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    sigset_t none;
    sigemptyset(&none);
    ::pthread_sigmask(SIG_SETMASK, &none, nullptr);
    ::execve(plan.executable.c_str(), argv.data(), envp.data());
    // exec failed: say why on the rank's stderr.
    const int e = errno;
    char num[16];
    const auto res = std::to_chars(num, num + sizeof(num), e);
    [[maybe_unused]] ssize_t n = ::write(2, exec_fail.data(), exec_fail.size());
    n = ::write(2, num, static_cast<size_t>(res.ptr - num));
    n = ::write(2, "\n", 1);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  ::close(out[1]);
  ::close(err[1]);
  if (pid < 0) {
    ::close(out[0]);
    ::close(err[0]);
    FORGE_THROW("forge launch: fork failed: ", std::strerror(fork_errno));
  }
  ::setpgid(pid, pid);  // also in the child: whichever runs first (errors once it has exec'd are fine)
  ::fcntl(out[0], F_SETFL, ::fcntl(out[0], F_GETFL) | O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, ::fcntl(err[0], F_GETFL) | O_NONBLOCK);
  out_fd = out[0];
  err_fd = err[0];
  return pid;
}

std::string seconds_text(double s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

// One start of the job's ranks, watched to their end (launch() may restart it). `user_signal` is
// set when the launcher got a signal to pass on.
int run_attempt(const LaunchOptions& opt, const LaunchPlan& plan, const SignalScope& signals, std::ostream& log,
                int& user_signal) {
  const bool direct = plan.spawn == SpawnMode::direct;
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  FORGE_CHECK(devnull >= 0, "forge launch: cannot open /dev/null: ", std::strerror(errno));

  std::vector<Child> children;
  std::vector<Stream> streams;
  const int n_children = direct ? plan.nproc : 1;
  auto name = [&](const Child& c) {
    return (direct ? "rank " + std::to_string(c.rank) : std::string("mpirun")) + " (pid " + std::to_string(c.pid) + ")";
  };
  auto signal_all = [&](int sig) {
    for (const auto& c : children)
      if (c.alive) ::kill(-c.pid, sig);  // its process group: the rank and what it started
  };
  try {
    for (int r = 0; r < n_children; ++r) {
      int out_fd = -1, err_fd = -1;
      const pid_t pid = spawn_child(plan, r, devnull, signals.sigpipe_was_ignored(), out_fd, err_fd);
      children.push_back({pid, r, true});
      streams.push_back({out_fd, children.size() - 1, false, {}});
      streams.push_back({err_fd, children.size() - 1, true, {}});
    }
  } catch (...) {
    signal_all(SIGKILL);
    for (auto& c : children) ::waitpid(c.pid, nullptr, 0);
    for (auto& s : streams) ::close(s.fd);
    ::close(devnull);
    throw;
  }
  ::close(devnull);

  LaunchOutput out({.prefix = opt.prefix_output, .mpirun_tags = plan.mpirun_tags, .tag_space = plan.tag_space,
                    .world = plan.nproc},
                   [&](bool is_err, const std::string& text) {
                     if (opt.output != nullptr) *opt.output << text << std::flush;
                     else write_all(is_err ? 2 : 1, text);
                   });
  auto emit = [&](const Stream& s, std::string_view line) {
    out.line(direct ? children[s.child].rank : -1, s.is_err, line);
  };
  // Reads what is there; returns false at end of file (the stream is then closed).
  auto pump = [&](Stream& s) {
    char buf[65536];
    while (true) {
      const ssize_t n = ::read(s.fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return true;  // EAGAIN: nothing more now
      if (n == 0) {
        if (!s.buf.empty()) emit(s, s.buf);
        s.buf.clear();
        ::close(s.fd);
        s.fd = -1;
        return false;
      }
      s.buf.append(buf, static_cast<size_t>(n));
      size_t start = 0, nl;
      while ((nl = s.buf.find('\n', start)) != std::string::npos) {
        emit(s, std::string_view(s.buf).substr(start, nl - start));
        start = nl + 1;
      }
      s.buf.erase(0, start);
      if (s.buf.size() > (1u << 20)) {  // a megabyte without a newline: pass it on as it is
        emit(s, s.buf);
        s.buf.clear();
      }
    }
  };

  int alive = n_children;
  bool stopping = false, killed = false, failed = false;
  int result = 0, got_signal = 0, signals_seen = 0, stopped_ranks = 0;
  Clock::time_point stop_deadline{}, drain_deadline{}, first_signal_at{};
  std::string deadline_reason;  // what the stop deadline waits after, for the SIGKILL message
  std::string mpirun_failed;    // how mpirun ended, when it failed (reported once its output is read)
  auto after = [](double seconds) {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  };
  // Sends a stop to the ranks: each rank's process group (direct), or mpirun (Note [stopping
  // under mpirun]): the first stop relayed as SIGUSR2 (SIGUSR1/2 as they are), a second as
  // SIGTERM, on which mpirun kills the job.
  auto relay = [&](int sig) {
    if (direct) return signal_all(sig);
    const int relayed = signals_seen > 1 ? SIGTERM : (sig == SIGUSR1 || sig == SIGUSR2) ? sig : SIGUSR2;
    for (const auto& c : children)
      if (c.alive) ::kill(c.pid, relayed);
  };
  std::vector<pollfd> pfds;
  while (true) {
    const auto now = Clock::now();
    bool open_streams = false;
    for (const auto& s : streams) open_streams |= s.fd >= 0;
    if (alive == 0) {
      if (!open_streams) break;
      if (drain_deadline == Clock::time_point{}) drain_deadline = now + std::chrono::milliseconds(500);
      else if (now >= drain_deadline) break;
    }
    pfds.clear();
    pfds.push_back({g_signal_pipe[0], POLLIN, 0});
    for (const auto& s : streams)
      if (s.fd >= 0) pfds.push_back({s.fd, POLLIN, 0});
    ::poll(pfds.data(), pfds.size(), 20);

    // Signals to forward.
    unsigned char sigs[16];
    ssize_t ns;
    while ((ns = ::read(g_signal_pipe[0], sigs, sizeof(sigs))) > 0) {
      for (ssize_t i = 0; i < ns; ++i) {
        // One event may reach the launcher twice (Slurm signals every process of the job step, and
        // a batch script passes its own signal on): a second within a second counts once, as in
        // forge train (Note [preemption]).
        if (signals_seen > 0 && Clock::now() - first_signal_at < std::chrono::seconds(1)) continue;
        if (signals_seen == 0) first_signal_at = Clock::now();
        got_signal = sigs[i];
        user_signal = got_signal;
        ++signals_seen;
        // Note [preemption] (train/preemption.h): the first stop lets forge train finish its step and
        // write a checkpoint (up to --stop-timeout); a second one stops the ranks at once.
        log << "forge launch: got " << signal_name(got_signal) << ", forwarding it to the " << alive << " running "
            << (direct ? (alive == 1 ? "rank" : "ranks") : "mpirun")
            << (signals_seen == 1 ? " (forge train stops after its current step with a checkpoint; a second signal "
                                    "stops the ranks at once)"
                                  : "")
            << std::endl;
        relay(got_signal);
        if (signals_seen == 1) {
          stopping = true;
          stop_deadline = after(opt.stop_timeout);
          deadline_reason = seconds_text(opt.stop_timeout) + " s (--stop-timeout) after the stop signal";
        } else if (after(opt.grace_seconds) < stop_deadline) {
          stop_deadline = after(opt.grace_seconds);
          deadline_reason = seconds_text(opt.grace_seconds) + " s after the second signal";
        }
      }
    }
    for (auto& s : streams)
      if (s.fd >= 0) pump(s);
    out.tick();

    // Reap.
    for (auto& c : children) {
      if (!c.alive) continue;
      int st = 0;
      const pid_t w = ::waitpid(c.pid, &st, WNOHANG);
      if (w == 0 || (w < 0 && errno == EINTR)) continue;
      c.alive = false;
      --alive;
      if (w < 0) continue;  // not our child any more (cannot happen): count it as gone
      const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      // A rank that stopped with its checkpoint (a signal, run.time_limit: kStoppedExitCode) is no
      // failure: the others are stopping at the same step; they get --stop-timeout to finish.
      if (WIFEXITED(st) && WEXITSTATUS(st) == kStoppedExitCode) {
        ++stopped_ranks;
        if (!stopping) {
          stopping = true;
          stop_deadline = after(opt.stop_timeout);
          deadline_reason = seconds_text(opt.stop_timeout) + " s (--stop-timeout) after a rank stopped with its checkpoint";
        }
        continue;
      }
      if (ok || failed || got_signal != 0) continue;
      failed = true;
      if (!direct) {  // mpirun ended the job; its text, read to the end, names the rank (below)
        result = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : SIGKILL);
        mpirun_failed = WIFEXITED(st) ? "exited with code " + std::to_string(result)
                                      : "was killed by signal " + std::to_string(result - 128);
        continue;
      }
      std::ostringstream msg;
      msg << "forge launch: " << name(c);
      if (WIFEXITED(st)) {
        result = WEXITSTATUS(st);
        msg << " exited with code " << result;
      } else {
        const int sig = WIFSIGNALED(st) ? WTERMSIG(st) : SIGKILL;
        result = 128 + sig;
        msg << " was killed by signal " << sig << " (" << signal_name(sig) << ")";
      }
      if (direct && alive > 0)
        msg << "; stopping the other " << alive << " rank" << (alive == 1 ? "" : "s");
      log << msg.str() << std::endl;
      signal_all(SIGTERM);
      stopping = true;
      stop_deadline = after(opt.grace_seconds);
      deadline_reason = seconds_text(opt.grace_seconds) + " s after SIGTERM";
    }
    if (stopping && !killed && alive > 0 && Clock::now() >= stop_deadline) {
      log << "forge launch: " << alive << (direct ? (alive == 1 ? " rank" : " ranks") : " mpirun") << " still running "
          << deadline_reason << "; sending SIGKILL" << std::endl;
      signal_all(SIGKILL);
      killed = true;
    }
  }
  for (auto& s : streams) {
    if (s.fd < 0) continue;
    if (!s.buf.empty()) emit(s, s.buf);
    ::close(s.fd);
  }
  out.finish();
  if (!mpirun_failed.empty()) {
    log << "forge launch: ";
    if (const auto& f = out.first_failure())
      log << "rank " << f->rank
          << (f->signal > 0 ? " was killed by signal " + std::to_string(f->signal) + " (" + signal_name(f->signal) + ")"
                            : " exited with code " + std::to_string(f->exit_code))
          << " first; mpirun stopped the job and " << mpirun_failed << std::endl;
    else if (out.a_rank_failed())
      log << "a rank exited with a non-zero code first (Open MPI's report did not name it; the ranks' last lines "
             "above may); mpirun stopped the job and "
          << mpirun_failed << std::endl;
    else
      log << "mpirun " << mpirun_failed << std::endl;
  }
  if (failed) return result;
  if (stopped_ranks > 0) return kStoppedExitCode;
  if (got_signal != 0) return 128 + got_signal;
  return 0;
}

}  // namespace

int launch(const LaunchOptions& opt_in, std::ostream& log) {
  FORGE_CHECK(opt_in.max_restarts >= 0, "forge launch: --max-restarts must be >= 0, got ", opt_in.max_restarts);
  LaunchOptions opt = opt_in;
  opt.restart_count = 0;
  LaunchPlan plan = plan_launch(opt, /*make_nccl_id=*/true);  // every bad input is refused here, before anything starts
  const SignalScope signals;
  for (;;) {
    log << plan.summary << (opt.restart_count > 0 ? " (restart " + std::to_string(opt.restart_count) + " of " +
                                                       std::to_string(opt.max_restarts) + ")"
                                                 : std::string())
        << std::endl;
    int user_signal = 0;
    const int rc = run_attempt(opt, plan, signals, log, user_signal);
    // Done, stopped with a checkpoint, or stopped by whoever signalled the launcher: no restart.
    if (rc == 0 || rc == kStoppedExitCode || user_signal != 0) return rc;
    if (opt.restart_count >= opt.max_restarts) {
      if (opt.max_restarts > 0)
        log << "forge launch: the job failed again (code " << rc << ") after " << opt.max_restarts
            << " restart(s) (--max-restarts); giving up" << std::endl;
      return rc;
    }
    ++opt.restart_count;
    log << "forge launch: the job failed (code " << rc << "); restarting every rank (restart " << opt.restart_count
        << " of " << opt.max_restarts << "): forge train continues from the latest valid checkpoint" << std::endl;
    std::this_thread::sleep_for(std::chrono::seconds(1));
    plan = plan_launch(opt, /*make_nccl_id=*/true);  // a fresh NCCL id: the old communicators are gone
  }
}


}  // namespace forge::parallel
