#pragma once
// 16-bit floating types: bf16 (1-8-7) and f16 (IEEE binary16, 1-5-10).
//
// Note [16-bit conversions]: float -> 16-bit rounds to nearest, ties to even, exactly as
// the IEEE formats define it: overflow goes to +-inf, values below the smallest
// subnormal go to +-0, subnormals are produced and read back exactly. NaN maps to a
// quiet NaN: bf16 0x7FC0 (sign dropped, as PyTorch's c10::BFloat16 does) and f16
// sign|0x7E00. 16-bit -> float is exact. Both are __host__ __device__ so the CPU and
// CUDA backends round identically.
#include <cstdint>
#include <cstring>

#include "forge/core/macros.h"

namespace forge {

FORGE_HD_INLINE uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

FORGE_HD_INLINE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

FORGE_HD_INLINE uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;  // round to nearest even; carries into the exponent (-> inf) correctly
  return static_cast<uint16_t>(u >> 16);
}

FORGE_HD_INLINE float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

FORGE_HD_INLINE uint16_t float_to_f16_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 -> inf
  if (a < 0x38800000u) {
    // |f| < 2^-14: the f16 result is subnormal (or zero): round(|f| / 2^-24).
    const uint32_t e = a >> 23;
    if (e < 102) return static_cast<uint16_t>(sign);  // |f| < 2^-25 -> 0
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;   // |f| = m * 2^(e-150)
    const uint32_t shift = 126 - e;                   // 14..24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t r = a - (112u << 23);  // rebias the exponent from 127 to 15
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

FORGE_HD_INLINE float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    // zero or subnormal: m * 2^-24, exact in float
    const float v = static_cast<float>(m) * 5.9604644775390625e-08f;
    return bits_float(float_bits(v) | sign);
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  FORGE_HD_INLINE bf16(float f) : bits(float_to_bf16_bits(f)) {}  // NOLINT: implicit like a float type
  FORGE_HD_INLINE operator float() const { return bf16_bits_to_float(bits); }
  FORGE_HD_INLINE static bf16 from_bits(uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }
};

struct f16 {
  uint16_t bits = 0;
  f16() = default;
  FORGE_HD_INLINE f16(float f) : bits(float_to_f16_bits(f)) {}  // NOLINT
  FORGE_HD_INLINE operator float() const { return f16_bits_to_float(bits); }
  FORGE_HD_INLINE static f16 from_bits(uint16_t b) {
    f16 r;
    r.bits = b;
    return r;
  }
};

}  // namespace forge
