// libFuzzer's entry points for forge's fuzz targets (fuzz_targets.h); built by scripts/fuzz.sh
// with clang (-fsanitize=fuzzer,address,undefined). The target is chosen by FORGE_FUZZ_TARGET.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/fuzz_targets.h"

namespace {
const forge::fuzz::FuzzTarget* g_target = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* name = std::getenv("FORGE_FUZZ_TARGET");
  g_target = name ? forge::fuzz::find_fuzz_target(name) : nullptr;
  if (g_target == nullptr) {
    std::fprintf(stderr, "forge_libfuzzer: set FORGE_FUZZ_TARGET to one of:");
    for (const auto& t : forge::fuzz::fuzz_targets()) std::fprintf(stderr, " %s", t.name);
    std::fprintf(stderr, "\n");
    std::exit(2);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  forge::fuzz::run_fuzz_target(*g_target, data, size);
  return 0;
}
