#pragma once
// The run config's values that are written as text and parsed: durations, signals and step ranges,
// each parsed where the config is checked (run/config_checks.cpp: before any work) and again by
// what uses it (train/preemption.h, train/step_trace.h).
#include <cstdint>
#include <string>
#include <utility>

namespace forge::train {

// "23h50m", "90m", "1d12h", "45s", "1h30m15s" (units d, h, m, s; at least one) -> seconds;
// "" -> 0 (none). Throws a forge::Error naming `key` and the accepted forms.
double parse_duration(const std::string& text, const char* key);
// "USR1", "SIGUSR1", "usr2", "HUP", a number -> the signal; "" -> 0 (none). SIGKILL, SIGSTOP and
// the crash signals (SEGV, BUS, FPE, ILL, ABRT) are refused. Throws a forge::Error naming `key`.
int parse_stop_signal(const std::string& text, const char* key);
// "SIGTERM", "SIGUSR1", ... ("signal N" for others).
std::string signal_name(int sig);
// "SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT", "SIGALRM", "SIGXCPU", else nullptr:
// static strings, so a signal handler may call it (async-signal-safe).
const char* short_signal_name(int sig);
// "A:B" -> {A, B} with 1 <= A <= B; throws a forge::Error naming `key` and the fix.
std::pair<int64_t, int64_t> parse_step_range(const std::string& spec, const char* key);

}  // namespace forge::train
