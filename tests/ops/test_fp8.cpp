// FP8 on the CPU (issue 39, item 4): the e4m3 / e5m2 codec (core/fp8.h) against a brute-force
// nearest-value search over all 256 codes in f64, and the recipes (ops/fp8.h, Note [FP8 recipes])
// against scales and products computed independently here in f64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>
#include <string>
#include <vector>

#include "forge/core/error.h"
#include "forge/core/fp8.h"
#include "forge/forge.h"
#include "forge/ops/fp8.h"

namespace forge {
namespace {

using fp8::Format;
using fp8::Operand;
using fp8::Recipe;

bool finite_code(uint8_t c, Format f) { return std::isfinite(fp8::decode(c, f)); }

// The nearest finite value by search, ties to the code with an even mantissa, saturating (the
// reference of Note [FP8 rounding], independent of encode's arithmetic).
double nearest(double x, Format f) {
  const double mx = fp8::info(f).max;
  if (std::fabs(x) >= mx) return std::copysign(mx, x);
  double best = 0, best_d = INFINITY;
  int best_code = -1;
  for (int c = 0; c < 256; ++c) {
    if (!finite_code(static_cast<uint8_t>(c), f)) continue;
    const double v = fp8::decode(static_cast<uint8_t>(c), f), d = std::fabs(v - x);
    const bool even = (c & 1) == 0;
    if (d < best_d || (d == best_d && even && (best_code & 1) == 1)) best = v, best_d = d, best_code = c;
  }
  return best;
}

TEST(Fp8Codec, TheFormatsValues) {
  EXPECT_EQ(fp8::decode(0x38, Format::e4m3), 1.0);
  EXPECT_EQ(fp8::decode(0x7e, Format::e4m3), 448.0);
  EXPECT_EQ(fp8::decode(0x08, Format::e4m3), std::ldexp(1.0, -6));
  EXPECT_EQ(fp8::decode(0x01, Format::e4m3), std::ldexp(1.0, -9));
  EXPECT_EQ(fp8::decode(0x3c, Format::e5m2), 1.0);
  EXPECT_EQ(fp8::decode(0x7b, Format::e5m2), 57344.0);
  EXPECT_EQ(fp8::decode(0x01, Format::e5m2), std::ldexp(1.0, -16));
  EXPECT_TRUE(std::isinf(fp8::decode(0x7c, Format::e5m2)));
  int nan4 = 0, nan5 = 0;
  for (int c = 0; c < 256; ++c) {
    nan4 += std::isnan(fp8::decode(static_cast<uint8_t>(c), Format::e4m3)) ? 1 : 0;
    nan5 += std::isnan(fp8::decode(static_cast<uint8_t>(c), Format::e5m2)) ? 1 : 0;
  }
  EXPECT_EQ(nan4, 2);  // S.1111.111
  EXPECT_EQ(nan5, 6);  // S.11111.{01,10,11}
}

TEST(Fp8Codec, EveryFiniteCodeRoundTrips) {
  for (Format f : {Format::e4m3, Format::e5m2})
    for (int c = 0; c < 256; ++c) {
      const auto code = static_cast<uint8_t>(c);
      if (!finite_code(code, f)) continue;
      EXPECT_EQ(fp8::encode(fp8::decode(code, f), f), code) << fp8::format_name(f) << " code " << c;
    }
}

TEST(Fp8Codec, RoundsToNearestEvenAndSaturatesAsTheSearchDoes) {
  Generator gen(5);
  for (Format f : {Format::e4m3, Format::e5m2}) {
    const double mx = fp8::info(f).max;
    std::vector<double> xs = {0.0, -0.0, mx, -mx, mx * 1.01, -mx * 3, INFINITY, -INFINITY, 1e-30, -1e-30};
    // Every midpoint between neighbouring codes (the ties), and just either side of it.
    for (int c = 0; c < 255; ++c) {
      const auto a = static_cast<uint8_t>(c), b = static_cast<uint8_t>(c + 1);
      if (!finite_code(a, f) || !finite_code(b, f) || (c & 0x7f) == 0x7f) continue;
      const double mid = (fp8::decode(a, f) + fp8::decode(b, f)) / 2;
      xs.insert(xs.end(), {mid, std::nextafter(mid, INFINITY), std::nextafter(mid, -INFINITY)});
    }
    // Random magnitudes over the whole range and beyond it, both signs.
    const std::vector<double> u = uniform({4000}, -1.0, 1.0, {.dtype = DType::f64}, &gen).to_vector<double>();
    for (size_t i = 0; i < u.size(); i += 2) xs.push_back(std::copysign(std::exp2(u[i + 1] * 24.0 - 4.0), u[i]));
    for (double x : xs) {
      const double got = fp8::round_to(x, f), want = nearest(x, f);
      EXPECT_EQ(got, want) << fp8::format_name(f) << " x = " << x;
      if (x == 0) {
        EXPECT_EQ(std::signbit(got), std::signbit(x)) << "the sign of zero";
      }
    }
    EXPECT_TRUE(std::isnan(fp8::round_to(NAN, f)));
  }
}

// The groups of each recipe, computed here: each entry's group amax of |x| (x widened to f32).
std::vector<double> entry_amax(const std::vector<float>& x, int64_t rows, int64_t cols, Recipe r, Operand op) {
  auto key = [&](int64_t i, int64_t j) -> std::pair<int64_t, int64_t> {
    if (r == Recipe::tensorwise) return {0, 0};
    if (r == Recipe::rowwise) return {i, 0};
    return {op == Operand::weight ? i / 128 : i, j / 128};  // 128 x 128 weight blocks, 1 x 128 tiles
  };
  std::map<std::pair<int64_t, int64_t>, double> amax;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      double& a = amax[key(i, j)];
      a = std::max(a, static_cast<double>(std::fabs(x[static_cast<size_t>(i * cols + j)])));
    }
  std::vector<double> out(x.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[static_cast<size_t>(i * cols + j)] = amax[key(i, j)];
  return out;
}

Tensor outlier_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  Generator gen(seed);
  std::vector<float> v = randn({rows, cols}, {.dtype = DType::f32}, &gen).to_vector<float>();
  for (int64_t i = 0; i < rows; i += 7) v[static_cast<size_t>(i * cols + (i * 13) % cols)] *= 300.0f;  // outliers
  for (int64_t j = 0; j < cols; ++j) v[static_cast<size_t>(5 * cols + j)] *= 1e-3f;                   // a quiet row
  return from_vector(v, {rows, cols});
}

TEST(Fp8Recipes, ScalesAndCodesAreTheRecipesGroups) {
  const int64_t rows = 200, cols = 300;  // not multiples of 128: partial tiles and blocks
  const Tensor x = outlier_matrix(rows, cols, 3);
  const std::vector<float> xv = x.to_vector<float>();
  for (Recipe r : {Recipe::tensorwise, Recipe::rowwise, Recipe::blockwise})
    for (Operand op : {Operand::activation, Operand::weight, Operand::gradient}) {
      const Format f = fp8::format_of(r, op);
      const fp8::Quantized q = fp8::quantize(x, f, r, op);
      const std::vector<float> back = fp8::dequantize(q).to_vector<float>();
      const std::string what = std::string(fp8::recipe_name(r)) + " operand " + std::to_string(static_cast<int>(op));
      const Shape want_scales = r == Recipe::tensorwise ? Shape{1}
                                : r == Recipe::rowwise  ? Shape{rows}
                                : op == Operand::weight ? Shape{2, 3}
                                                        : Shape{rows, 3};
      EXPECT_EQ(q.scales.shape(), want_scales) << what;
      EXPECT_EQ(q.codes.dtype(), DType::u8) << what;
      double worst = 0;
      const std::vector<double> am = entry_amax(xv, rows, cols, r, op);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const size_t at = static_cast<size_t>(i * cols + j);
          const float s = static_cast<float>(fp8::info(f).max / am[at]);
          const double expect = nearest(static_cast<double>(xv[at] * s), f) / s;
          ASSERT_NEAR(back[at], expect, 1e-6 * std::fabs(expect) + 1e-30) << what << " (" << i << ", " << j << ")";
          worst = std::max(worst, std::fabs(back[at] - xv[at]) / am[at]);
        }
      // Relative to its group's amax, no entry moves by more than half the format's spacing at the top.
      EXPECT_LE(worst, f == Format::e4m3 ? 1.0 / 16 : 1.0 / 8) << what;
    }
}
// The emulated forward GEMM is the product of the dequantized operands (each tile pair's
// products scaled together equal the scaled products summed), and the recipes rank as they should
// on activations with outliers: a per-tensor scale crushes a quiet row to the format's bottom,
// per-row and per-tile scales keep it.
TEST(Fp8Recipes, ScaledMatmulIsTheDequantizedProduct) {
  const int64_t m = 70, n = 40, k = 300;
  const Tensor x = outlier_matrix(m, k, 8);
  Generator gen(9);
  const Tensor w = randn({n, k}, {.dtype = DType::f32}, &gen) * 0.02;
  const Tensor exact = ops::matmul(x.to(DType::f64), ops::transpose(w.to(DType::f64), 0, 1));
  std::vector<double> err;
  for (Recipe r : {Recipe::tensorwise, Recipe::rowwise, Recipe::blockwise}) {
    const Tensor y = fp8::scaled_matmul(x, w, r);
    const Tensor xq = fp8::dequantize(fp8::quantize(x, Format::e4m3, r, Operand::activation)).to(DType::f64);
    const Tensor wq = fp8::dequantize(fp8::quantize(w, Format::e4m3, r, Operand::weight)).to(DType::f64);
    const std::vector<double> want = ops::matmul(xq, ops::transpose(wq, 0, 1)).to_vector<double>();
    // The dequantized operands are f32 roundings of code / scale: the bound is relative to the
    // sum of the products' magnitudes, not to a result that cancels.
    const std::vector<double> mag = ops::matmul(ops::abs(xq), ops::transpose(ops::abs(wq), 0, 1)).to_vector<double>();
    const std::vector<double> got = y.to(DType::f64).to_vector<double>(), ex = exact.to_vector<double>();
    double quiet = 0, quiet_scale = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-6 * mag[i]) << fp8::recipe_name(r) << " entry " << i;
      if (static_cast<int64_t>(i) / n == 5) quiet = std::max(quiet, std::fabs(got[i] - ex[i])), quiet_scale = std::max(quiet_scale, std::fabs(ex[i]));
    }
    err.push_back(quiet / quiet_scale);  // the quiet row's error relative to its own outputs
  }
  EXPECT_GT(err[0], 10 * err[1]) << "tensorwise " << err[0] << " vs rowwise " << err[1];
  EXPECT_LT(err[1], 0.1);
  EXPECT_LT(err[2], 0.1);
}

TEST(Fp8Recipes, NamesFormatsAndBadInput) {
  EXPECT_EQ(fp8::recipe_from_name("rowwise"), Recipe::rowwise);
  EXPECT_EQ(fp8::recipe_from_name("blockwise"), Recipe::blockwise);
  try {
    (void)fp8::recipe_from_name("delayed");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run.fp8 = 'delayed'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fp8::format_of(Recipe::tensorwise, Operand::gradient), Format::e5m2);
  EXPECT_EQ(fp8::format_of(Recipe::rowwise, Operand::gradient), Format::e5m2);
  EXPECT_EQ(fp8::format_of(Recipe::blockwise, Operand::gradient), Format::e4m3);
  EXPECT_EQ(fp8::format_of(Recipe::tensorwise, Operand::weight), Format::e4m3);
  EXPECT_THROW(fp8::quantize(zeros({2, 3, 4}), Format::e4m3, Recipe::rowwise, Operand::activation), Error);
  // A group of zeros takes scale 1; a NaN makes its group's scale NaN (what a guardrail must catch).
  const fp8::Quantized z = fp8::quantize(zeros({2, 4}), Format::e4m3, Recipe::rowwise, Operand::activation);
  EXPECT_EQ(z.scales.to_vector<float>(), (std::vector<float>{1.0f, 1.0f}));
  const fp8::Quantized bad = fp8::quantize(from_vector(std::vector<float>{1, NAN, 2, 3}, {2, 2}), Format::e4m3,
                                           Recipe::rowwise, Operand::activation);
  const std::vector<float> sc = bad.scales.to_vector<float>();
  EXPECT_TRUE(std::isnan(sc[0]));
  EXPECT_FLOAT_EQ(sc[1], 448.0f / 3.0f);
}

}  // namespace
}  // namespace forge

namespace forge {
namespace {

// Note [FP8 linear]: the output and the three gradients are the quantized GEMMs the note names
// (checked against quantized_matmul), and they stay close to the exact f64 linear's: within the
// formats' precision relative to each result's norm.
TEST(Fp8Linear, GradientsAreTheQuantizedGemmsAndCloseToTheExactOnes) {
  Generator gen(21);
  const TensorOptions f32{.dtype = DType::f32};
  const Tensor x = randn({3, 5, 40}, f32, &gen), w = randn({24, 40}, f32, &gen) * 0.1, b = randn({24}, f32, &gen);
  const Tensor dy = randn({3, 5, 24}, f32, &gen);
  auto frob_rel = [](const Tensor& got, const Tensor& want) {
    const auto a = got.to(DType::f64).to_vector<double>(), c = want.to(DType::f64).to_vector<double>();
    double d = 0, n = 0;
    for (size_t i = 0; i < a.size(); ++i) d += (a[i] - c[i]) * (a[i] - c[i]), n += c[i] * c[i];
    return std::sqrt(d / n);
  };
  // The exact linear in f64.
  Tensor xe = x.to(DType::f64).requires_grad_(), we = w.to(DType::f64).requires_grad_(), be = b.to(DType::f64).requires_grad_();
  ops::sum(ops::mul(ops::linear(xe, we, be), dy.to(DType::f64))).backward();
  for (Recipe r : {Recipe::tensorwise, Recipe::rowwise, Recipe::blockwise}) {
    const std::string what = fp8::recipe_name(r);
    Tensor xq = x.clone().requires_grad_(), wq = w.clone().requires_grad_(), bq = b.clone().requires_grad_();
    const Tensor y = fp8::linear(xq, wq, bq, r);
    ASSERT_EQ(y.shape(), (Shape{3, 5, 24})) << what;
    ops::sum(ops::mul(y, dy)).backward();
    const Tensor x2 = x.reshape({15, 40}), dy2 = dy.reshape({15, 24});
    const Tensor want_y = ops::add(fp8::quantized_matmul(x2, Operand::activation, w, Operand::weight, r), b);
    const Tensor want_dx = fp8::quantized_matmul(dy2, Operand::gradient, ops::transpose(w, 0, 1).contiguous(), Operand::weight, r);
    const Tensor want_dw = fp8::quantized_matmul(ops::transpose(dy2, 0, 1).contiguous(), Operand::gradient,
                                                 ops::transpose(x2, 0, 1).contiguous(), Operand::activation, r);
    EXPECT_EQ(frob_rel(y.reshape({15, 24}), want_y), 0.0) << what;
    EXPECT_EQ(frob_rel(xq.grad().reshape({15, 40}), want_dx), 0.0) << what;
    EXPECT_EQ(frob_rel(wq.grad(), want_dw), 0.0) << what;
    EXPECT_LT(frob_rel(bq.grad(), be.grad()), 1e-6) << what << ": the bias gradient is exact";
    // e4m3 keeps 3 mantissa bits, e5m2 2: a few percent of each result's norm.
    EXPECT_LT(frob_rel(y, ops::linear(x.to(DType::f64), w.to(DType::f64), b.to(DType::f64))), 0.05) << what;
    EXPECT_LT(frob_rel(xq.grad(), xe.grad()), r == Recipe::blockwise ? 0.05 : 0.1) << what;
    EXPECT_LT(frob_rel(wq.grad(), we.grad()), r == Recipe::blockwise ? 0.05 : 0.1) << what;
  }
}

// bf16 inputs (a bf16 run's), the GPU tests' reference shapes: the emulation's forward and
// gradients in bf16, each the quantized GEMM of its f32 values.
TEST(Fp8Linear, Bf16InputsGiveTheQuantizedGemmsInBf16) {
  Generator gen(23);
  const TensorOptions bf{.dtype = DType::bf16};
  for (Recipe r : {Recipe::tensorwise, Recipe::rowwise, Recipe::blockwise}) {
    Tensor x = randn({4, 64, 256}, bf, &gen), w = randn({384, 256}, bf, &gen), b = randn({384}, bf, &gen);
    const Tensor dy = randn({4, 64, 384}, bf, &gen);
    x.requires_grad_(true);
    w.requires_grad_(true);
    b.requires_grad_(true);
    const Tensor y = fp8::linear(x, w, b, r, "bf16.layer");
    y.backward(dy);
    ASSERT_EQ(y.dtype(), DType::bf16);
    ASSERT_EQ(x.grad().dtype(), DType::bf16);
    ASSERT_EQ(w.grad().dtype(), DType::bf16);
    const Tensor x2 = x.detach().reshape({256, 256}).to(DType::f32), w2 = w.detach().to(DType::f32);
    const Tensor want_y = ops::add(fp8::quantized_matmul(x2, Operand::activation, w2, Operand::weight, r),
                                   b.detach().to(DType::f32))
                              .to(DType::bf16);
    EXPECT_EQ(y.detach().reshape({256, 384}).to(DType::f32).to_vector<float>(), want_y.to(DType::f32).to_vector<float>())
        << fp8::recipe_name(r);
  }
}

// Note [FP8 guardrails]: a non-finite entry is reported with the layer and the operand whose cast
// met it; finite tensors report nothing.
TEST(Fp8Linear, NonFiniteAmaxIsReportedByLayerAndOperand) {
  (void)fp8::take_guard_events();
  Generator gen(4);
  const TensorOptions f32{.dtype = DType::f32};
  Tensor x = randn({4, 16}, f32, &gen), w = randn({8, 16}, f32, &gen);
  Tensor y = fp8::linear(x.clone().requires_grad_(), w, Tensor(), Recipe::rowwise, "blocks.0.mlp.up");
  ops::sum(y).backward();
  EXPECT_TRUE(fp8::take_guard_events().empty());
  std::vector<float> xv = x.to_vector<float>();
  xv[5] = INFINITY;
  y = fp8::linear(from_vector(xv, {4, 16}).requires_grad_(), w, Tensor(), Recipe::rowwise, "blocks.0.mlp.up");
  auto events = fp8::take_guard_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].layer, "blocks.0.mlp.up");
  EXPECT_EQ(events[0].operand, Operand::activation);
  // A NaN reaching the layer's output gradient: the gradient's cast reports it.
  Tensor xg = randn({4, 16}, f32, &gen).requires_grad_();
  y = fp8::linear(xg, w, Tensor(), Recipe::blockwise, "head.proj");
  std::vector<float> g(32, 1.0f);
  g[3] = NAN;
  y.backward(from_vector(g, {4, 8}));
  events = fp8::take_guard_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].layer, "head.proj");
  EXPECT_EQ(events[0].operand, Operand::gradient);
  EXPECT_STREQ(fp8::operand_name(Operand::gradient), "gradient");
}

// Note [FP8 delayed scaling]: a tensorwise cast is scaled by the largest amax of the layer's last
// `history` casts of that operand, the first cast by its own; values above that amax saturate, so
// a delayed cast of x equals a current cast of x clipped to the history's amax (the clip leaves
// exactly that amax). The history keeps `history` entries, oldest out first; an evaluation's
// forward (no grad) reads the history but adds nothing; a non-finite amax is not entered.
TEST(Fp8DelayedScaling, TheHistorysLargestAmaxScalesTheNextCast) {
  auto vals = [](const Tensor& t) { return t.to(DType::f64).contiguous().to_vector<double>(); };
  auto clip = [](const Tensor& t, double a) {  // each entry clamped to [-a, a]
    std::vector<float> v = t.to(DType::f32).contiguous().to_vector<float>();
    for (float& e : v) e = std::clamp(e, static_cast<float>(-a), static_cast<float>(a));
    return from_vector(v, t.shape());
  };
  fp8::set_training_scaling({.scaling = fp8::Scaling::delayed, .history = 2});
  Generator gen(77);
  const Tensor w = uniform({5, 8}, -0.5, 0.5, {}, &gen);
  auto x_with_amax = [&](double a) {
    Tensor x = uniform({6, 8}, -0.5 * a, 0.5 * a, {}, &gen);
    NoGradGuard no_grad;
    x.narrow(0, 0, 1).narrow(1, 0, 1).fill_(a);  // its amax exactly a
    return x;
  };
  auto current = [&](const Tensor& x) {  // what current scaling gives (fp8::linear's forward GEMM)
    return fp8::quantized_matmul(x, Operand::activation, w, Operand::weight, Recipe::tensorwise);
  };
  const Tensor x1 = x_with_amax(1.0), x2 = x_with_amax(4.0), x3 = x_with_amax(3.0), x4 = x_with_amax(2.5);
  // Cast 1: no history, its own amax.
  EXPECT_EQ(vals(fp8::linear(x1, w, Tensor(), Recipe::tensorwise, "L")), vals(current(x1)));
  // Cast 2 (amax 4): scaled by the history's 1, so it saturates at 1.
  EXPECT_EQ(vals(fp8::linear(x2, w, Tensor(), Recipe::tensorwise, "L")), vals(current(clip(x2, 1.0))));
  EXPECT_NE(vals(current(x2)), vals(current(clip(x2, 1.0)))) << "the saturation shows";
  // Cast 3 (amax 3): the history holds 1 and 4, so 4: no saturation, a coarser scale than its own.
  // Reference: x3's rows quantized in a matrix whose amax is 4 (one more row holding 4).
  {
    const Tensor with4 = ops::cat({x3, full({1, 8}, 4.0)}, 0);
    const Tensor x3q = fp8::dequantize(fp8::quantize(with4, Format::e4m3, Recipe::tensorwise, Operand::activation))
                           .narrow(0, 0, 6);
    const Tensor wq = fp8::dequantize(fp8::quantize(w, Format::e4m3, Recipe::tensorwise, Operand::weight));
    const std::vector<double> got = vals(fp8::linear(x3, w, Tensor(), Recipe::tensorwise, "L")),
                              want = vals(ops::matmul(x3q, ops::transpose(wq, 0, 1)));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6 * (1 + std::fabs(want[i]))) << i;
    EXPECT_NE(got, vals(current(x3))) << "not its own scale";
  }
  auto history = [](const char* layer, Operand op) { return fp8::amax_histories().at(layer)[static_cast<size_t>(op)]; };
  EXPECT_EQ(history("L", Operand::activation), (std::vector<float>{4.0f, 3.0f})) << "two kept, the oldest out";
  EXPECT_EQ(history("L", Operand::weight).size(), 2u);
  // An evaluation's forward reads the history (max 4) and adds nothing.
  {
    NoGradGuard no_grad;
    (void)fp8::linear(x4, w, Tensor(), Recipe::tensorwise, "L");
  }
  EXPECT_EQ(history("L", Operand::activation), (std::vector<float>{4.0f, 3.0f}));
  // A non-finite tensor is not entered (the guardrail reports it).
  Tensor bad = x_with_amax(1.0);
  {
    NoGradGuard no_grad;
    bad.narrow(0, 1, 1).narrow(1, 1, 1).fill_(std::numeric_limits<double>::infinity());
  }
  (void)fp8::linear(bad, w, Tensor(), Recipe::tensorwise, "L");
  (void)fp8::take_guard_events();
  EXPECT_EQ(history("L", Operand::activation), (std::vector<float>{4.0f, 3.0f}));
  // The backward's dy cast has a history of its own.
  Tensor xg = x_with_amax(1.0).requires_grad_();
  fp8::linear(xg, w, Tensor(), Recipe::tensorwise, "G").sum().backward();
  EXPECT_EQ(history("G", Operand::gradient).size(), 1u);
  // The record for telemetry.fp8_amax: each layer's largest amax per operand, then cleared.
  const auto rec = fp8::take_amax_record();
  EXPECT_EQ(rec.at("L")[static_cast<size_t>(Operand::activation)], 4.0);
  EXPECT_TRUE(fp8::take_amax_record().empty());
  fp8::set_training_scaling({});
  EXPECT_TRUE(fp8::amax_histories().empty()) << "setting the scaling clears the histories";
}

}  // namespace
}  // namespace forge
