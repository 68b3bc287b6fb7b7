// LLaMA-3 rope scaling (backends/rope_functors.h, Note [llama3 rope scaling]) against values worked out
// by hand, and ops::rope with it against a rotation written out here. (Gradients and the CUDA
// kernel: the op table's "rope" llama3 case, tests/ops/op_cases_attention.cpp, and CudaRope.)
#include <gtest/gtest.h>

#include <cmath>

#include "forge/forge.h"

namespace forge {
namespace {

// D = 8, theta = 500000, LLaMA-3.1's factor 8, low/high frequency factors 1 and 4, original
// context 8192: the band edges are wavelengths 8192 / 4 = 2048 and 8192 / 1 = 8192.
const ops::RopeScaling kLlama3{.factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                               .original_context = 8192.0};

// i  freq = 500000^(-i/4)      wavelength 2 pi / freq   band
// 0  1                         6.28                     < 2048: unchanged
// 1  0.037606030930863933      167.08                   < 2048: unchanged
// 2  0.0014142135623730950     4442.88                  between: s = (8192 / 4442.88 - 1) / (4 - 1)
//                                                        = 0.28128260516325104,
//                                                        (1 - s) freq / 8 + s freq = 0.00052484616099295
// 3  5.3182958969449884e-05    118142.8                 > 8192: freq / 8 = 6.6478698711812350e-06
const double kScaled[4] = {1.0, 0.037606030930863933, 0.00052484616099295470, 6.6478698711812350e-06};

TEST(RopeScaling, Llama3FrequenciesMatchTheHandComputedBands) {
  for (int64_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    EXPECT_NEAR(fn::rope_frequency(i, 8, 500000.0, kLlama3), kScaled[i], 1e-15 * std::max(1.0, kScaled[i]) + 1e-20);
    // Without scaling: the plain theta^(-2i/D).
    EXPECT_DOUBLE_EQ(fn::rope_frequency(i, 8, 500000.0, ops::RopeScaling::none()), std::pow(500000.0, -i / 4.0));
  }
  EXPECT_FALSE(ops::RopeScaling::none().enabled());
  EXPECT_TRUE(kLlama3.enabled());
}

TEST(RopeScaling, RopeRotatesByTheScaledFrequencies) {
  const int64_t B = 1, H = 2, T = 5, D = 8, offset = 3000;  // positions where the low bands matter
  const Tensor x = randn({B, H, T, D}, {.dtype = DType::f64});
  const Tensor y = ops::rope(x, offset, 500000.0, kLlama3);
  const Tensor plain = ops::rope(x, offset, 500000.0);
  const double* xp = x.data<double>();
  const double* yp = y.data<double>();
  const double* pp = plain.data<double>();
  double differs = 0.0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < D / 2; ++i) {
        const int64_t row = (h * T + t) * D;
        const double a = static_cast<double>(offset + t) * kScaled[i];
        const double x1 = xp[row + i], x2 = xp[row + i + D / 2];
        EXPECT_NEAR(yp[row + i], x1 * std::cos(a) - x2 * std::sin(a), 1e-12);
        EXPECT_NEAR(yp[row + i + D / 2], x2 * std::cos(a) + x1 * std::sin(a), 1e-12);
        differs = std::max(differs, std::abs(yp[row + i] - pp[row + i]));
      }
  EXPECT_GT(differs, 1e-3) << "the scaling changed nothing";
}

TEST(RopeScaling, BadParametersAreRejected) {
  const Tensor x = randn({1, 1, 2, 8});
  try {
    ops::rope(x, 0, 500000.0, {.factor = 8.0, .low_freq_factor = 4.0, .high_freq_factor = 1.0});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("low_freq_factor < high_freq_factor"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace forge
