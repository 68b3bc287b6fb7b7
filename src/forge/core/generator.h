#pragma once
// Random-number generator state: a seed and an offset into its Philox stream.
#include <cstdint>
#include <mutex>

namespace forge {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0x5eed) : seed_(seed) {}
  void manual_seed(uint64_t seed);
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset);
  // Reserves the blocks for `n` random elements; returns the first block's counter.
  uint64_t reserve(int64_t n);

 private:
  std::mutex mu_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The process-wide generator used when an op is given none.
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace forge
