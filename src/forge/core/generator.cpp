#include "forge/core/generator.h"

namespace forge {

void Generator::manual_seed(uint64_t seed) { set_state(seed, 0); }

void Generator::set_state(uint64_t seed, uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  seed_ = seed;
  offset_ = offset;
}

uint64_t Generator::reserve(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t start = offset_;
  offset_ += (static_cast<uint64_t>(n) + 3) / 4;
  return start;
}

Generator& default_generator() {
  static Generator g;
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace forge
