// forge_fuzz_replay: runs fuzz targets (fuzz_targets.h) over files, without libFuzzer. `make test`
// replays tests/fuzz/corpus/<target>/ (the seeds and every input that ever crashed forge) with it,
// under ASan + UBSan in the sanitizer build.
//
//   forge_fuzz_replay --list
//   forge_fuzz_replay --check-corpora DIR     # DIR/<target>/ holds inputs for every target, and no stray dirs
//   forge_fuzz_replay TARGET FILE|DIR...     # every file (recursively), in name order
//
// Exit 0 when every input was read or refused with a forge::Error; a finding aborts (or the
// sanitizer reports and exits non-zero), naming the input first.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/fuzz_targets.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  using forge::fuzz::fuzz_targets;
  if (argc == 2 && std::string(argv[1]) == "--list") {
    for (const auto& t : fuzz_targets()) std::printf("%-20s %s\n", t.name, t.what);
    return 0;
  }
  if (argc == 3 && std::string(argv[1]) == "--emit-base-checkpoint") {  // tests/fuzz/make_seeds.py
    forge::fuzz::write_base_checkpoint(argv[2]);
    return 0;
  }
  if (argc == 3 && std::string(argv[1]) == "--check-corpora") {
    int bad = 0;
    for (const auto& t : fuzz_targets()) {
      const fs::path d = fs::path(argv[2]) / t.name;
      size_t n = 0;
      if (fs::is_directory(d))
        for (const auto& e : fs::recursive_directory_iterator(d)) n += e.is_regular_file() ? 1 : 0;
      if (n == 0) {
        std::fprintf(stderr, "forge_fuzz_replay: target %s has no corpus in %s\n", t.name, d.c_str());
        ++bad;
      }
    }
    for (const auto& e : fs::directory_iterator(argv[2]))
      if (e.is_directory() && forge::fuzz::find_fuzz_target(e.path().filename().string()) == nullptr) {
        std::fprintf(stderr, "forge_fuzz_replay: %s is the corpus of no target\n", e.path().c_str());
        ++bad;
      }
    if (bad == 0) std::printf("forge_fuzz_replay: every one of the %zu targets has a corpus\n", fuzz_targets().size());
    return bad == 0 ? 0 : 1;
  }
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s --list | TARGET FILE|DIR...\n", argv[0]);
    return 2;
  }
  const auto* target = forge::fuzz::find_fuzz_target(argv[1]);
  if (target == nullptr) {
    std::fprintf(stderr, "forge_fuzz_replay: no target '%s'; --list names them\n", argv[1]);
    return 2;
  }
  std::vector<fs::path> files;
  for (int i = 2; i < argc; ++i) {
    const fs::path p = argv[i];
    if (fs::is_directory(p)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "forge_fuzz_replay: '%s' is neither a file nor a directory\n", argv[i]);
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "forge_fuzz_replay: no inputs for %s (an empty corpus replays nothing)\n", target->name);
    return 2;
  }
  int read = 0, refused = 0;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "%s: %s (%zu bytes)\n", target->name, f.c_str(), bytes.size());
    const bool ok = forge::fuzz::run_fuzz_target(*target, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    (ok ? read : refused) += 1;
  }
  std::printf("forge_fuzz_replay %s: %zu inputs, %d read, %d refused with an error, no finding\n", target->name,
              files.size(), read, refused);
  return 0;
}
