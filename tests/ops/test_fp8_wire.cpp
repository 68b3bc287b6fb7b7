// fp8::encode_blocks / decode_blocks (Note [FP8 wire blocks] in ops/fp8_wire.h) against an
// independent reference: each value scaled by the row's scale and matched to the nearest of the 256
// codes' values by exhaustive search (ties to the even code), not by core/fp8.h's rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "forge/core/error.h"
#include "forge/ops/creation.h"
#include "forge/ops/fp8_wire.h"

namespace forge::fp8 {
namespace {

// The code a value x rounds to, by search over every finite code (nearest; a tie to the even
// mantissa, i.e. the code whose lowest bit is clear; beyond the largest finite value: saturated).
uint8_t nearest_code(double x, Format f) {
  if (std::isnan(x)) return info(f).nan_code;
  int best = -1;
  double best_d = 0;
  for (int c = 0; c < 256; ++c) {
    const double v = decode(static_cast<uint8_t>(c), f);
    if (!std::isfinite(v) || std::signbit(v) != std::signbit(x)) continue;
    const double d = std::fabs(v - x);
    if (best < 0 || d < best_d || (d == best_d && (c & 1) == 0 && (best & 1) != 0)) best = c, best_d = d;
  }
  return static_cast<uint8_t>(best);
}

// Rows of 128: random magnitudes spanning 2^-30 .. 2^20 from row to row, one row of zeros, one
// row with a NaN, one with an infinity, one whose values span 2^-20 of its largest (subnormals).
Tensor sample_rows(int64_t rows, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1, 1), e(-30, 20);
  std::vector<float> v(static_cast<size_t>(rows * kWireBlock));
  for (int64_t r = 0; r < rows; ++r) {
    const double mag = std::exp2(e(gen));
    for (int64_t j = 0; j < kWireBlock; ++j) {
      double x = u(gen) * mag;
      if (r == 3) x = u(gen) * std::exp2(-20.0 * static_cast<double>(j) / kWireBlock);
      v[static_cast<size_t>(r * kWireBlock + j)] = static_cast<float>(x);
    }
  }
  for (int64_t j = 0; j < kWireBlock; ++j) v[static_cast<size_t>(kWireBlock + j)] = 0.0f;  // row 1
  v[static_cast<size_t>(2 * kWireBlock + 5)] = std::numeric_limits<float>::quiet_NaN();   // row 2
  v[static_cast<size_t>(4 * kWireBlock + 9)] = -std::numeric_limits<float>::infinity();   // row 4
  return from_vector(v, {rows, kWireBlock});
}

TEST(Fp8Wire, CodesAreTheNearestValuesOfTheRowsScaleAndDecodeBack) {
  for (Format f : {Format::e4m3, Format::e5m2}) {
    const int64_t rows = 40;
    const Tensor x = sample_rows(rows, 11 + static_cast<uint32_t>(f));
    const WireBlocks b = encode_blocks(x, f);
    ASSERT_EQ(b.codes.shape(), Shape({rows, kWireBlock}));
    ASSERT_EQ(b.inv_scales.shape(), Shape({rows}));
    const std::vector<float> xv = x.to_vector<float>(), inv = b.inv_scales.to_vector<float>();
    const std::vector<uint8_t> codes = b.codes.to_vector<uint8_t>();
    const std::vector<float> back = decode_blocks(b.codes, b.inv_scales, f).to_vector<float>();
    const float fmax = static_cast<float>(info(f).max);
    for (int64_t r = 0; r < rows; ++r) {
      float amax = 0;
      bool finite = true;
      for (int64_t j = 0; j < kWireBlock; ++j) {
        const float a = xv[static_cast<size_t>(r * kWireBlock + j)];
        finite = finite && std::isfinite(a);
        amax = std::max(amax, std::fabs(a));
      }
      if (!finite) {  // the whole row decodes to NaN
        EXPECT_TRUE(std::isnan(inv[static_cast<size_t>(r)])) << "row " << r;
        for (int64_t j = 0; j < kWireBlock; ++j) EXPECT_TRUE(std::isnan(back[static_cast<size_t>(r * kWireBlock + j)]));
        continue;
      }
      const float s = amax == 0 ? 1.0f : fmax / amax;
      EXPECT_EQ(inv[static_cast<size_t>(r)], 1.0f / s) << "row " << r;
      for (int64_t j = 0; j < kWireBlock; ++j) {
        const size_t i = static_cast<size_t>(r * kWireBlock + j);
        const uint8_t want = nearest_code(static_cast<double>(xv[i] * s), f);
        ASSERT_EQ(codes[i], want) << format_name(f) << " row " << r << " col " << j << " x " << xv[i];
        const float v = static_cast<float>(decode(want, f)) * (1.0f / s);
        ASSERT_EQ(back[i], v) << "row " << r << " col " << j;
        // Within half a quantum: 2^-(mantissa + 1) relative in the normal range.
        if (std::fabs(xv[i] * s) >= std::ldexp(1.0, 1 - info(f).bias)) {
          EXPECT_LE(std::fabs(back[i] - xv[i]), std::ldexp(std::fabs(xv[i]), -info(f).mantissa_bits - 1) * 1.0001)
              << "row " << r << " col " << j;
        }
      }
    }
  }
}

// core/fp8.h's encode_float (the codec's loop) is encode() for every float tried: each code's value,
// the midpoints between neighbouring codes (the ties) and a float either side of each, the
// saturation edges, 4M random bit patterns (every exponent, NaNs and infinities included) and 2M
// random values across the formats' own range.
TEST(Fp8Wire, EncodeFloatIsEncodeForEveryFloatTried) {
  std::vector<float> xs;
  for (Format f : {Format::e4m3, Format::e5m2})
    for (int c = 0; c < 256; ++c) {
      const double v = decode(static_cast<uint8_t>(c), f), next = decode(static_cast<uint8_t>(c + 1), f);
      for (double y : {v, (v + next) / 2}) {
        if (!std::isfinite(y)) continue;
        const float fy = static_cast<float>(y);
        xs.insert(xs.end(), {fy, std::nextafter(fy, 1e30f), std::nextafter(fy, -1e30f), -fy});
      }
    }
  for (float edge : {448.0f, 464.0f, 480.0f, 57344.0f, 61440.0f, 1e30f, std::numeric_limits<float>::infinity(),
                     std::numeric_limits<float>::denorm_min(), 0.0f, std::ldexp(1.0f, -6), std::ldexp(1.0f, -14)})
    xs.insert(xs.end(), {edge, -edge, std::nextafter(edge, 0.0f), std::nextafter(edge, 1e38f)});
  std::mt19937 gen(17);
  for (int i = 0; i < 4'000'000; ++i) {
    const uint32_t bits = gen();
    float x = 0;
    std::memcpy(&x, &bits, sizeof x);
    xs.push_back(x);
  }
  std::uniform_real_distribution<float> u(-1, 1), e(-24, 20);  // and 2M in the formats' own range
  for (int i = 0; i < 2'000'000; ++i) xs.push_back(std::ldexp(u(gen), static_cast<int>(e(gen))));
  for (Format f : {Format::e4m3, Format::e5m2})
    for (float x : xs) ASSERT_EQ(encode_float(x, f), encode(static_cast<double>(x), f)) << format_name(f) << " x " << x;
}

TEST(Fp8Wire, TheLookupDecodeIsTheLoopsBitForBit) {
  const Tensor x = sample_rows(16, 5);
  for (Format f : {Format::e4m3, Format::e5m2}) {
    const WireBlocks b = encode_blocks(x, f);
    const std::vector<float> a = decode_blocks(b.codes, b.inv_scales, f).to_vector<float>(),
                             c = decode_blocks_by_lookup(b.codes, b.inv_scales, f).to_vector<float>();
    ASSERT_EQ(a.size(), c.size());
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(a[i])) EXPECT_TRUE(std::isnan(c[i])) << i;
      else EXPECT_EQ(a[i], c[i]) << i;
    }
  }
}

TEST(Fp8Wire, BadShapesAreRefusedNamingThem) {
  auto expect_error = [](auto fn, const std::string& part) {
    try {
      fn();
      FAIL() << "expected an error naming " << part;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_error([] { encode_blocks(zeros({4, 64}), Format::e4m3); }, "(rows, 128)");
  expect_error([] { encode_blocks(zeros({4, 128}, {.dtype = DType::bf16}), Format::e4m3); }, "f32");
  expect_error([] { encode_blocks(zeros({8, 256}).narrow(1, 0, 128), Format::e4m3); }, "not contiguous");
  const WireBlocks b = encode_blocks(zeros({4, 128}), Format::e4m3);
  expect_error([&] { decode_blocks(b.codes, zeros({3}), Format::e4m3); }, "4 rows");
}

}  // namespace
}  // namespace forge::fp8
