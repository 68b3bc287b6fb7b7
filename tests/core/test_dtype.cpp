// DTypes, 16-bit conversions (exhaustive round trips) and promotion.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "forge/forge.h"

namespace forge {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(element_size(DType::f32), 4u);
  EXPECT_EQ(element_size(DType::f64), 8u);
  EXPECT_EQ(element_size(DType::bf16), 2u);
  EXPECT_EQ(element_size(DType::f16), 2u);
  EXPECT_EQ(element_size(DType::i32), 4u);
  EXPECT_EQ(element_size(DType::i64), 8u);
  EXPECT_EQ(element_size(DType::u8), 1u);
  EXPECT_EQ(element_size(DType::boolean), 1u);
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8, DType::boolean})
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("float16"), DType::f16);
  try {
    parse_dtype("float8");
    FAIL() << "expected forge::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("float8"), std::string::npos);
  }
}

TEST(DType, PromotionFollowsPyTorch) {
  EXPECT_EQ(promote_types(DType::i32, DType::i64), DType::i64);
  EXPECT_EQ(promote_types(DType::u8, DType::i32), DType::i32);
  EXPECT_EQ(promote_types(DType::boolean, DType::u8), DType::u8);
  EXPECT_EQ(promote_types(DType::i64, DType::f16), DType::f16);
  EXPECT_EQ(promote_types(DType::f16, DType::bf16), DType::f32);
  EXPECT_EQ(promote_types(DType::bf16, DType::f32), DType::f32);
  EXPECT_EQ(promote_types(DType::f32, DType::f64), DType::f64);
}

// Reference: round-to-nearest-even computed in double arithmetic, independent of the
// bit-twiddling implementation.
double round_to_format(double v, int mant_bits, int min_exp, int max_exp) {
  if (std::isnan(v) || std::isinf(v) || v == 0) return v;
  const double a = std::abs(v);
  int e = std::ilogb(a);
  if (e < min_exp) e = min_exp;  // subnormal spacing
  const double ulp = std::ldexp(1.0, e - mant_bits);
  double q = a / ulp;
  double r = std::nearbyint(q);  // default rounding mode: ties to even
  double out = r * ulp;
  const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, -mant_bits), max_exp);
  // overflow: values >= max + ulp/2 round to inf
  if (out > max_finite) out = std::numeric_limits<double>::infinity();
  return std::copysign(out, v);
}

TEST(Half, Bf16RoundTripIsExactForEveryPattern) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16_bits_to_float(static_cast<uint16_t>(b));
    const uint16_t back = float_to_bf16_bits(f);
    if (std::isnan(f)) {
      EXPECT_EQ(back, 0x7fc0) << b;
    } else {
      ASSERT_EQ(back, b) << "bf16 pattern " << b;
    }
  }
}

TEST(Half, F16RoundTripIsExactForEveryPattern) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = f16_bits_to_float(static_cast<uint16_t>(b));
    const uint16_t back = float_to_f16_bits(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(((back & 0x7c00) == 0x7c00) && (back & 0x3ff)) << b;
    } else {
      ASSERT_EQ(back, b) << "f16 pattern " << b;
      ASSERT_EQ(static_cast<double>(f), round_to_format(f, 10, -14, 15)) << b;  // decoding is exact
    }
  }
}

TEST(Half, RoundingMatchesReferenceOnRandomAndEdgeFloats) {
  Generator g(99);
  std::vector<float> vals = {0.0f, -0.0f, 1.0f, 65504.0f, 65519.99f, 65520.0f, 1e-8f, 5.9604645e-08f,
                             2.9802322e-08f, 2.9802326e-08f, 6.1035156e-05f, 1.0f + 1.0f / 256, 1.0f + 1.0f / 2048,
                             3.0e38f, -3.4028235e38f, 1e-40f, std::numeric_limits<float>::infinity()};
  // random bit patterns across the whole float range
  Tensor r = rand({4096}, {.dtype = DType::f64}, &g);
  for (double u : r.to_vector<double>()) {
    uint32_t bits = static_cast<uint32_t>(u * 4294967295.0);
    float f;
    std::memcpy(&f, &bits, 4);
    if (!std::isnan(f)) vals.push_back(f);
  }
  for (float f : vals) {
    const double ref16 = round_to_format(f, 10, -14, 15);
    EXPECT_EQ(static_cast<double>(f16_bits_to_float(float_to_f16_bits(f))), ref16) << f;
    const double refb = round_to_format(f, 7, -126, 127);
    EXPECT_EQ(static_cast<double>(bf16_bits_to_float(float_to_bf16_bits(f))), refb) << f;
  }
  EXPECT_TRUE(std::isnan(f16_bits_to_float(float_to_f16_bits(std::nanf("")))));
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::nanf("")))));
  EXPECT_EQ(float_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
}

TEST(Half, TensorConversionUsesTheSameRounding) {
  Tensor x = from_vector<float>({1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 65520.0f, 1e-8f}, {4});
  std::vector<bf16> b = x.to(DType::bf16).to_vector<bf16>();
  EXPECT_EQ(b[0].bits, float_to_bf16_bits(1.0f + 1.0f / 256));
  EXPECT_EQ(b[0].bits, 0x3f80);  // tie rounds to even (down)
  EXPECT_EQ(b[1].bits, 0x3f82);  // tie rounds to even (up)
  std::vector<f16> h = x.to(DType::f16).to_vector<f16>();
  EXPECT_EQ(h[2].bits, 0x7c00);  // 65520 -> inf
  EXPECT_EQ(h[3].bits, 0x0000);  // 1e-8 -> +0
}

TEST(Convert, IntegerAndBoolConversions) {
  Tensor x = from_vector<double>({-2.7, -0.5, 0.0, 0.5, 3.9}, {5});
  EXPECT_EQ(x.to(DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{-2, 0, 0, 0, 3}));
  EXPECT_EQ(x.to(DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{-2, 0, 0, 0, 3}));
  EXPECT_EQ(x.to(DType::boolean).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 1, 0, 1, 1}));
  Tensor i = from_vector<int64_t>({-1, 0, 7}, {3});
  EXPECT_EQ(i.to(DType::f32).to_vector<float>(), (std::vector<float>{-1.f, 0.f, 7.f}));
}

}  // namespace
}  // namespace forge
