#pragma once
// The two 8-bit float formats of FP8 training (OCP 8-bit floating point, as Hopper's tensor cores
// and PyTorch's float8_e4m3fn / float8_e5m2 define them), converted to and from float on the host:
// the reference of the FP8 recipes (ops/fp8.h) and of their GPU kernels.
//
//   e4m3  sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities: S.1111.111 is NaN, so
//         the largest finite value is S.1111.110 = 448; subnormals down to 2^-9.
//   e5m2  sign, 5 exponent bits (bias 15), 2 mantissa bits; IEEE-like: S.11111.00 is infinity,
//         S.11111.xx (xx != 0) NaN; the largest finite value is 57344; subnormals down to 2^-16.
//
// Note [FP8 rounding]: float -> fp8 rounds to the nearest representable value, ties to the even
// mantissa, and saturates: a finite magnitude above the format's largest (infinities included)
// becomes +-max, as the training recipes cast (torch's clamp-then-cast, cuBLASLt's satfinite). NaN
// stays NaN. The sign of zero is kept.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace forge::fp8 {

enum class Format : uint8_t { e4m3, e5m2 };

struct FormatInfo {
  int exponent_bits, mantissa_bits, bias;
  double max;          // the largest finite magnitude
  uint8_t max_code;    // its code (sign bit clear)
  uint8_t nan_code;    // a NaN (sign bit clear)
};

constexpr FormatInfo info(Format f) {
  return f == Format::e4m3 ? FormatInfo{4, 3, 7, 448.0, 0x7e, 0x7f} : FormatInfo{5, 2, 15, 57344.0, 0x7b, 0x7e};
}

inline const char* format_name(Format f) { return f == Format::e4m3 ? "e4m3" : "e5m2"; }

// The value of a code (NaN for NaN codes; +-inf for e5m2's infinities).
inline double decode(uint8_t code, Format f) {
  const FormatInfo fi = info(f);
  const bool negative = (code & 0x80) != 0;
  const int exponent = (code >> fi.mantissa_bits) & ((1 << fi.exponent_bits) - 1);
  const int mantissa = code & ((1 << fi.mantissa_bits) - 1);
  const int top = (1 << fi.exponent_bits) - 1;
  double v = 0;
  if (f == Format::e4m3 && exponent == top && mantissa == (1 << fi.mantissa_bits) - 1) return std::nan("");
  if (f == Format::e5m2 && exponent == top) {
    if (mantissa != 0) return std::nan("");
    v = INFINITY;
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<double>(mantissa), 1 - fi.bias - fi.mantissa_bits);
  } else {
    v = std::ldexp(1.0 + static_cast<double>(mantissa) / (1 << fi.mantissa_bits), exponent - fi.bias);
  }
  return negative ? -v : v;
}

// x rounded to the format (Note [FP8 rounding]), as its code.
inline uint8_t encode(double x, Format f) {
  const FormatInfo fi = info(f);
  if (std::isnan(x)) return fi.nan_code;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(x);
  if (a >= fi.max) return sign | fi.max_code;
  if (a == 0) return sign;
  // The spacing of the format at a's binade (the subnormals' below the smallest normal).
  int e = 0;
  (void)std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1): a's binade is 2^(e - 1)
  const int min_normal_exponent = 1 - fi.bias;
  const int binade = std::max(e - 1, min_normal_exponent);
  const double quantum = std::ldexp(1.0, binade - fi.mantissa_bits);
  const double q = a / quantum;  // exact: a power-of-two scaling
  double r = std::floor(q);        // to the nearest multiple of the quantum, ties to the even one
  const double frac = q - r;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(r, 2.0) != 0)) r += 1;
  const double v = r * quantum;
  if (v >= fi.max) return sign | fi.max_code;
  if (v == 0) return sign;
  int ve = 0;
  (void)std::frexp(v, &ve);
  const int vbinade = ve - 1;
  if (vbinade < min_normal_exponent) {  // subnormal: exponent field 0
    return sign | static_cast<uint8_t>(std::ldexp(v, fi.bias - 1 + fi.mantissa_bits));
  }
  const int mantissa = static_cast<int>(std::ldexp(v, fi.mantissa_bits - vbinade)) - (1 << fi.mantissa_bits);
  return sign | static_cast<uint8_t>(((vbinade + fi.bias) << fi.mantissa_bits) | mantissa);
}

// encode() of a float, by its bits (the FP8 wire codec's loop, ops/fp8_wire.h): the same code for
// every float (tests/ops/test_fp8_wire.cpp checks it against encode() over every code's neighbours
// and millions of random bit patterns). Normal results: the mantissa rounded to the nearest even
// at the format's width by an integer add on the bits (a carry steps the exponent, as it should);
// subnormal ones: the value in units of the format's smallest quantum, rounded by nearbyint.
inline uint8_t encode_float(float x, Format f) {
  const FormatInfo fi = info(f);
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return fi.nan_code;
  const float fmax = static_cast<float>(fi.max);
  uint32_t max_bits = 0;
  std::memcpy(&max_bits, &fmax, sizeof max_bits);
  if (a >= max_bits) return sign | fi.max_code;  // (infinities too: saturated)
  const uint32_t min_normal_bits = static_cast<uint32_t>(127 + 1 - fi.bias) << 23;
  if (a < min_normal_bits) {
    float v = 0;
    std::memcpy(&v, &a, sizeof v);
    const float units = std::ldexp(1.0f, fi.bias - 1 + fi.mantissa_bits);  // 1 / the subnormal quantum
    return sign | static_cast<uint8_t>(std::nearbyint(v * units));        // (exact product: a power of two)
  }
  const int shift = 23 - fi.mantissa_bits;
  const uint32_t r = (a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u)) >> shift;
  const int32_t code = static_cast<int32_t>(r) - ((127 - fi.bias) << fi.mantissa_bits);
  return sign | static_cast<uint8_t>(std::min<int32_t>(code, fi.max_code));
}

// x rounded to the format and back (Note [FP8 rounding]).
inline double round_to(double x, Format f) { return decode(encode(x, f), f); }

}  // namespace forge::fp8
