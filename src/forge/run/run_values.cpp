// The run config's text values (run_values.h).
#include "forge/run/run_values.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>

#include "forge/core/error.h"

namespace forge::train {

namespace {

const std::map<std::string, int>& signal_table() {
  static const std::map<std::string, int> t = {{"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT},
                                               {"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2},
                                               {"ALRM", SIGALRM}, {"XCPU", SIGXCPU}, {"CONT", SIGCONT},
                                               {"URG", SIGURG},   {"WINCH", SIGWINCH}};
  return t;
}

}  // namespace

const char* short_signal_name(int sig) {
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
  if (const char* n = short_signal_name(sig)) return n;
  for (const auto& [name, s] : signal_table())
    if (s == sig) return "SIG" + name;
  return "signal " + std::to_string(sig);
}

std::pair<int64_t, int64_t> parse_step_range(const std::string& spec, const char* key) {
  const auto colon = spec.find(':');
  int64_t a = 0, b = 0;
  bool ok = colon != std::string::npos;
  try {
    if (ok) a = std::stoll(spec.substr(0, colon)), b = std::stoll(spec.substr(colon + 1));
  } catch (const std::exception&) {
    ok = false;
  }
  FORGE_CHECK(ok && a >= 1 && b >= a, key, " = \"", spec,
              "\" is not a range of steps; write \"A:B\" with 1 <= A <= B (e.g. \"20:25\"), or \"\" for none");
  return {a, b};
}

}  // namespace forge::train
