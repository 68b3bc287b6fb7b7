// Preemption signals and durations (Note [preemption] in preemption.h).
#include "forge/train/preemption.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <map>

#include "forge/core/error.h"

namespace forge::train {

namespace {

std::atomic<int> g_first_signal{0};
std::atomic<int64_t> g_first_ns{0};
struct sigaction g_previous[65];
bool g_installed = false;

int64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void say(const char* s) { [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, s, std::strlen(s)); }

const char* short_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGQUIT: return "SIGQUIT";
    case SIGALRM: return "SIGALRM";
    case SIGXCPU: return "SIGXCPU";
    default: return nullptr;
  }
}

// Async-signal-safe: atomics, clock_gettime, write, _exit.
extern "C" void forge_on_stop_signal(int sig) {
  const int64_t now = monotonic_ns();
  int expected = 0;
  const char* name = short_name(sig);
  if (g_first_signal.compare_exchange_strong(expected, sig)) {
    g_first_ns.store(now);
    say("forge train: got ");
    say(name != nullptr ? name : "a stop signal");
    say(": stopping after this step with a checkpoint on every rank (exit code 75); a second signal stops at once\n");
    return;
  }
  if (now - g_first_ns.load() < static_cast<int64_t>(kSameSignalWindow * 1e9)) return;  // the same event twice
  say("forge train: got ");
  say(name != nullptr ? name : "a stop signal");
  say(" again: stopping at once, without the checkpoint (the previous one is kept)\n");
  ::_exit(128 + sig);
}

const std::map<std::string, int>& signal_table() {
  static const std::map<std::string, int> t = {{"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT},
                                               {"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2},
                                               {"ALRM", SIGALRM}, {"XCPU", SIGXCPU}, {"CONT", SIGCONT},
                                               {"URG", SIGURG},   {"WINCH", SIGWINCH}};
  return t;
}

}  // namespace

double parse_duration(const std::string& text, const char* key) {
  if (text.empty()) return 0.0;
  double total = 0.0;
  size_t i = 0;
  int parts = 0;
  auto bad = [&]() {
    FORGE_THROW(key, " = \"", text, "\" is not a duration; write it like \"23h50m\", \"90m\", \"1d12h\" or \"45s\" "
                "(units d, h, m, s), or \"\" for none");
  };
  while (i < text.size()) {
    const size_t start = i;
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
    if (i == start || i == text.size()) bad();
    double v = 0.0;
    const auto [ptr, ec] = std::from_chars(text.data() + start, text.data() + i, v);
    if (ec != std::errc() || ptr != text.data() + i || !(v >= 0)) bad();
    switch (text[i]) {
      case 'd': total += v * 86400; break;
      case 'h': total += v * 3600; break;
      case 'm': total += v * 60; break;
      case 's': total += v; break;
      default: bad();
    }
    ++i;
    ++parts;
  }
  if (parts == 0 || !(total > 0)) bad();
  return total;
}

int parse_stop_signal(const std::string& text, const char* key) {
  if (text.empty()) return 0;
  std::string s = text;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (s.rfind("SIG", 0) == 0) s = s.substr(3);
  int sig = 0;
  if (auto it = signal_table().find(s); it != signal_table().end()) {
    sig = it->second;
  } else {
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), sig);
    if (ec != std::errc() || ptr != s.data() + s.size() || sig <= 0 || sig > 64) sig = 0;
  }
  FORGE_CHECK(sig != 0 && sig != SIGKILL && sig != SIGSTOP && sig != SIGSEGV && sig != SIGBUS && sig != SIGFPE &&
                  sig != SIGILL && sig != SIGABRT && sig != SIGCHLD && sig != SIGPIPE,
              key, " = \"", text, "\" is not a signal forge can stop on; use \"USR1\", \"USR2\", \"HUP\" (or another "
              "catchable signal's name or number), or \"\" for none");
  return sig;
}

std::string signal_name(int sig) {
  if (const char* n = short_name(sig)) return n;
  for (const auto& [name, s] : signal_table())
    if (s == sig) return "SIG" + name;
  return "signal " + std::to_string(sig);
}

StopSignals::StopSignals(const std::vector<int>& extra) {
  FORGE_CHECK(!g_installed, "StopSignals: the stop handlers are installed already");
  signals_ = {SIGTERM, SIGINT};
  for (int sig : extra)
    if (sig != 0 && std::find(signals_.begin(), signals_.end(), sig) == signals_.end()) signals_.push_back(sig);
  reset();
  struct sigaction sa {};
  sa.sa_handler = forge_on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads, writes and waits go on after the handler
  for (int sig : signals_) ::sigaction(sig, &sa, &g_previous[sig]);
  g_installed = true;
}

StopSignals::~StopSignals() {
  for (int sig : signals_) ::sigaction(sig, &g_previous[sig], nullptr);
  g_installed = false;
}

int StopSignals::received() { return g_first_signal.load(); }

void StopSignals::reset() {
  g_first_signal.store(0);
  g_first_ns.store(0);
}

}  // namespace forge::train
