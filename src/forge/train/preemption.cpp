// Preemption signals and durations (Note [preemption] in preemption.h).
#include "forge/train/preemption.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

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


// Async-signal-safe: atomics, clock_gettime, write, _exit.
extern "C" void forge_on_stop_signal(int sig) {
  const int64_t now = monotonic_ns();
  int expected = 0;
  const char* name = short_signal_name(sig);
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

}  // namespace

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
