#pragma once
// Running the built `forge` executable from a test, for the command-line tests of every
// subcommand (train, plan, info, bench).
//
//   const CliRun r = run_forge({"plan", "gpt2", "--json"}, Stderr::dropped);
//   ASSERT_EQ(r.status, 0) << r.out;
//
// The executable is <build>/forge: the test binaries live in <build>/tests/. Arguments are
// passed to a shell one by one, single-quoted, so spaces and quotes in them are safe.
// Environment variables for the forge process alone go in the third argument:
//
//   run_forge({"info", "--env"}, Stderr::merged, {{"FORGE_BIND", "none"}});
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace forge::testing {

inline std::filesystem::path forge_binary() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() / "forge";
}

struct CliRun {
  int status = -1;  // the exit status (-1: did not exit normally)
  std::string out;  // stdout, with stderr too unless Stderr::dropped
};

enum class Stderr { merged, dropped };

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// NAME=value pairs set in the forge process's environment (and nowhere else).
using EnvVars = std::vector<std::pair<std::string, std::string>>;

inline CliRun run_forge(const std::vector<std::string>& args, Stderr err = Stderr::merged, const EnvVars& env = {}) {
  std::string cmd;
  if (!env.empty()) {
    cmd = "env";
    for (const auto& [name, value] : env) cmd.append(" ").append(shell_quote(name + "=" + value));
    cmd.append(" ");
  }
  cmd.append(shell_quote(forge_binary().string()));
  for (const auto& a : args) cmd.append(" ").append(shell_quote(a));
  cmd.append(err == Stderr::merged ? " 2>&1" : " 2>/dev/null");
  CliRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// A fixture whose tests fail (with the fix) when the forge executable is not built.
class ForgeCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::is_regular_file(forge_binary()))
        << "the forge executable is not built at " << forge_binary() << " (build the 'forge' target)";
  }
};

}  // namespace forge::testing
