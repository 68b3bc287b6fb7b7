#pragma once
// Philox4x32-10 counter-based random numbers (Salmon et al., "Parallel random numbers:
// as easy as 1, 2, 3", SC'11), shared by the CPU and CUDA backends.
//
// Note [RNG streams]: element i of a random tensor drawn at generator offset `o` (in
// blocks of four 32-bit words) takes word i % 4 of philox(key = seed, counter = o + i / 4).
// Uniforms use that word alone; normals pair words (0,1) and (2,3) of a block through
// Box-Muller. So one seed gives the same numbers on every device and for every dtype (up
// to the dtype's rounding), whatever the launch shape or thread count.
#include <cmath>
#include <cstdint>

#include "forge/core/macros.h"

namespace forge {

struct Philox4 {
  uint32_t v[4];
};

FORGE_HD_INLINE void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

FORGE_HD_INLINE Philox4 philox4x32_10(uint64_t seed, uint64_t block) {
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c0, hi0, lo0);
    philox_mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// [0, 1) with 24 random bits.
FORGE_HD_INLINE float philox_uniform(uint32_t x) { return static_cast<float>(x >> 8) * 5.9604644775390625e-08f; }

// Standard normal for element i (lane = i % 4) of a block.
FORGE_HD_INLINE float philox_normal(const Philox4& b, int lane) {
  const int pair = lane & 2;
  const float u1 = (static_cast<float>(b.v[pair] >> 8) + 1.0f) * 5.9604644775390625e-08f;  // (0, 1]
  const float u2 = philox_uniform(b.v[pair + 1]);
  const float r = sqrtf(-2.0f * logf(u1));
  const float theta = 6.2831853071795864f * u2;
  return (lane & 1) ? r * sinf(theta) : r * cosf(theta);
}

}  // namespace forge
