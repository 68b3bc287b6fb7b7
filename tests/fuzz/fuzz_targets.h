#pragma once
// Fuzz targets (issue 43, SECURITY.md): one function per untrusted input format forge reads.
// Each takes arbitrary bytes and feeds them to the same code a command would (through a file
// in a scratch directory where the reader takes a path), then uses what was read. A clean
// forge::Error is the expected answer to bad bytes; anything else is a finding: a signal, a
// sanitizer report, another exception (run_fuzz_target aborts on it), a hang or a huge
// allocation (libFuzzer's -timeout and -rss_limit_mb).
//
// Two drivers run them: tests/fuzz/replay_main.cpp (`forge_fuzz_replay TARGET FILE|DIR...`,
// built with every build, replaying the corpora of tests/fuzz/corpus/ in `make test`, under
// ASan + UBSan in the sanitizer build) and tests/fuzz/libfuzzer_main.cpp (libFuzzer through
// clang, scripts/fuzz.sh).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace forge::fuzz {

struct FuzzTarget {
  const char* name;   // the corpus directory's name too: tests/fuzz/corpus/<name>/
  const char* what;   // the format and the reader
  void (*run)(const uint8_t* data, size_t size);
};

const std::vector<FuzzTarget>& fuzz_targets();
const FuzzTarget* find_fuzz_target(const std::string& name);

// Writes the small checkpoint the checkpoint targets start from (fixed values) to `dir`; its
// state.json and manifest.json are those targets' seeds (tests/fuzz/make_seeds.py).
void write_base_checkpoint(const std::string& dir);

// Runs one input: returns true when it was read, false when it was refused with a
// forge::Error; prints the input's description and aborts on any other exception.
bool run_fuzz_target(const FuzzTarget& t, const uint8_t* data, size_t size);

}  // namespace forge::fuzz
