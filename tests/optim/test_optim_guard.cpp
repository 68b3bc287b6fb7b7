// forge::optim on the CPU: the primitives of the non-finite guard and of device-side
// clipping. Optimizer::step(skip_if) leaves parameters, state and per-parameter step
// counts untouched; the tensor forms of clipping (total_grad_norm, clip_grad_norm_,
// clip_grads_with_norm_) agree with the double forms; found_non_finite flags inf/NaN
// gradients exactly (the squares are summed in double, so large finite values are not
// flagged); and the shared element math (backends/optim_functors.h) is the documented rule:
// AdamW's scalars, and SGD's element rule bit for bit equal to the ops the CPU SGD runs
// (the CUDA SGD kernel runs that rule).
// The same behaviour on a GPU is checked by tests/backends/cuda/test_cuda_optim.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "forge/backends/optim_functors.h"
#include "forge/core/convert.h"
#include "forge/forge.h"
#include "optim_testing.h"
#include "testing/tensor_testing.h"

namespace forge {
namespace {

using optim_testing::param;
using optim_testing::set_grad;

using forge::testing::error_of;
using forge::testing::vals;
using optim::AdamW;
using optim::ParamGroup;
using optim::SGD;
using optim::SGDOptions;
using ::testing::HasSubstr;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> wavy(size_t n, double phase, double scale = 1.0) {
  std::vector<double> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = scale * std::sin(1.3 * static_cast<double>(i) + phase) + 0.05 * phase;
  return g;
}

Tensor flag(double v) { return scalar_tensor(v); }

// ---- Optimizer::step(skip_if) --------------------------------------------------------------

// Runs `steps` steps on two identical setups; `a` is given the flag sequence, `b` steps
// only where the flag is clear. Both must end bit-identical.
template <class Opt, class Options>
void check_skips_match_not_stepping(const Options& options, const std::vector<double>& flags) {
  const std::vector<DType> dtypes{DType::f64, DType::f32, DType::bf16};
  std::vector<Tensor> pa, pb;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    pa.push_back(param(wavy(6 + i, 0.3 * static_cast<double>(i)), dtypes[i]));
    pb.push_back(param(wavy(6 + i, 0.3 * static_cast<double>(i)), dtypes[i]));
  }
  Opt a(pa, options), b(pb, options);
  int64_t applied = 0;
  for (size_t s = 0; s < flags.size(); ++s) {
    for (size_t i = 0; i < pa.size(); ++i) {
      const auto g = wavy(pa[i].numel(), 1.0 + static_cast<double>(s) + 0.1 * static_cast<double>(i));
      set_grad(pa[i], g);
      set_grad(pb[i], g);
    }
    std::vector<std::vector<double>> before;
    for (const Tensor& p : pa) before.push_back(vals(p));
    a.step(flag(flags[s]));
    if (flags[s] == 0) {
      b.step();
      ++applied;
    } else {
      for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(vals(pa[i]), before[i]) << "skipped step " << s;
    }
  }
  EXPECT_EQ(a.step_count(), static_cast<int64_t>(flags.size()));  // skipped calls count
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(vals(pa[i]), vals(pb[i])) << "parameter " << i;
    const optim::ParamState* sa = a.state(pa[i]);
    const optim::ParamState* sb = b.state(pb[i]);
    ASSERT_EQ(sa == nullptr, sb == nullptr);
    if (!sa) continue;
    EXPECT_EQ(sa->step, applied);
    EXPECT_EQ(sa->step, sb->step);
    ASSERT_EQ(sa->tensors.size(), sb->tensors.size());
    for (const auto& [name, t] : sb->tensors) EXPECT_EQ(vals(sa->tensors.at(name)), vals(t)) << name;
  }
}

TEST(OptimSkip, AdamWSkippedStepsChangeNothing) {
  check_skips_match_not_stepping<AdamW>(optim::AdamWOptions{.lr = 0.05, .weight_decay = 0.1}, {1, 0, 0, 1, 1, 0, 0});
}

TEST(OptimSkip, SGDSkippedStepsChangeNothingIncludingTheFirstMomentumStep) {
  // A skipped first step must not make the momentum buffer: the next step still starts it from d.
  check_skips_match_not_stepping<SGD>(optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.3},
                                      {1, 0, 1, 0, 0});
}

TEST(OptimSkip, FlagOfAnyDtypeAndShapeOneElement) {
  Tensor p = param({1.0, 2.0});
  AdamW opt({p}, {.lr = 0.1});
  set_grad(p, {1.0, 1.0});
  opt.step(scalar_tensor(1.0, {.dtype = DType::boolean}));
  opt.step(full({1}, kNaN));  // NaN != 0: skip
  EXPECT_EQ(vals(p), (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(opt.state(p), nullptr);
  opt.step(zeros({1, 1}, {.dtype = DType::i32}));
  EXPECT_NE(vals(p), (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(opt.state(p)->step, 1);
  EXPECT_EQ(opt.step_count(), 3);
  EXPECT_THAT(error_of([&] { opt.step(zeros({2})); }), HasSubstr("AdamW: skip_if must be a one-element tensor"));
}

TEST(OptimSkip, GuardFromTheGradientNorm) {
  // The guard as the trainer wires it: norm -> flag -> step.
  Tensor a = param({1.0, 2.0}, DType::f32), b = param({3.0}, DType::f32);
  AdamW opt({a, b}, {.lr = 0.1});
  set_grad(a, {1.0, kInf});
  set_grad(b, {1.0});
  const Tensor norm = optim::clip_grad_norm_({a, b}, 1.0);
  opt.step(optim::found_non_finite(norm));
  EXPECT_EQ(vals(a), (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(vals(b), std::vector<double>{3.0});
  EXPECT_EQ(vals(a.grad())[0], 1.0);  // a non-finite norm clips nothing
  set_grad(a, {1.0, 1.0});
  opt.step(optim::found_non_finite({a, b}));
  EXPECT_NE(vals(b), std::vector<double>{3.0});
}

// ---- clipping: tensor forms --------------------------------------------------------------

TEST(ClipGradNormTensor, AgreesWithTheDoubleForm) {
  Tensor a = param(wavy(300, 0.1), DType::f32), b = param(wavy(40001, 0.7), DType::bf16), c = param({5.0});
  for (double max_norm : {kInf, 1e6, 3.0, 0.5}) {
    SCOPED_TRACE(max_norm);
    const auto ga = wavy(300, 2.0), gb = wavy(40001, 3.0);
    set_grad(a, ga);
    set_grad(b, gb);
    Tensor a2 = param(vals(a), DType::f32), b2 = param(vals(b), DType::bf16);
    set_grad(a2, ga);
    set_grad(b2, gb);
    const double want = optim::clip_grad_norm({a2, b2, c}, max_norm);
    const Tensor norm = optim::clip_grad_norm_({a, b, c}, max_norm);
    EXPECT_EQ(norm.dim(), 0);
    EXPECT_EQ(norm.dtype(), DType::f32);
    EXPECT_TRUE(norm.is_cpu());
    EXPECT_EQ(norm.item<double>(), static_cast<double>(static_cast<float>(want)));
    // The clip coefficient comes from the f32 norm here and from the double norm there:
    // the same to 1e-7 relative, so at most one rounding apart.
    const auto va = vals(a.grad()), wa = vals(a2.grad());
    for (size_t i = 0; i < va.size(); ++i) EXPECT_NEAR(va[i], wa[i], 2e-7 * std::abs(wa[i])) << i;
    const auto vb = vals(b.grad()), wb = vals(b2.grad());
    for (size_t i = 0; i < vb.size(); ++i) EXPECT_NEAR(vb[i], wb[i], 8e-3 * std::abs(wb[i])) << i;
  }
}

TEST(ClipGradNormTensor, ClipsOnlyAboveMaxNormAndKeepsNonFiniteGradients) {
  Tensor a = param({0.0, 0.0}), b = param({0.0});
  set_grad(a, {3.0, 4.0});
  set_grad(b, {12.0});
  EXPECT_EQ(optim::total_grad_norm({a, b}).item<double>(), 13.0);
  EXPECT_EQ(optim::clip_grad_norm_({a, b}, 13.0).item<double>(), 13.0);  // at max_norm: untouched
  EXPECT_EQ(vals(a.grad()), (std::vector<double>{3.0, 4.0}));
  optim::clip_grads_with_norm_({a, b}, 6.5, scalar_tensor(13.0));
  const double coef = 6.5 / (13.0 + 1e-6);
  EXPECT_DOUBLE_EQ(vals(a.grad())[1], 4.0 * coef);
  EXPECT_DOUBLE_EQ(vals(b.grad())[0], 12.0 * coef);
  set_grad(b, {kNaN});
  EXPECT_TRUE(std::isnan(optim::clip_grad_norm_({a, b}, 1.0).item<double>()));
  EXPECT_DOUBLE_EQ(vals(a.grad())[1], 4.0 * coef);
  set_grad(b, {-kInf});
  EXPECT_EQ(optim::clip_grad_norm_({a, b}, 1.0).item<double>(), kInf);
  EXPECT_DOUBLE_EQ(vals(a.grad())[1], 4.0 * coef);
  // No gradients: a zero norm on the parameters' device.
  Tensor c = param({1.0});
  EXPECT_EQ(optim::clip_grad_norm_({c}, 1.0).item<double>(), 0.0);
  EXPECT_THAT(error_of([&] { optim::clip_grad_norm_({a}, -1.0); }), HasSubstr("clip_grad_norm_: max_norm must be >= 0"));
  EXPECT_THAT(error_of([&] { optim::clip_grads_with_norm_({a}, 1.0, zeros({2})); }),
              HasSubstr("the norm must be a one-element floating-point tensor"));
}

TEST(ClipGradNormTensor, NonContiguousGradientIsWrittenBackThroughItsView) {
  Tensor p = zeros({2, 3}, {.dtype = DType::f32});
  p.requires_grad_(true);
  p.set_grad(from_vector<double>({3.0, 0.0, 0.0, 4.0, 0.0, 0.0}, {3, 2}, {.dtype = DType::f32}).t());
  EXPECT_EQ(optim::clip_grad_norm_({p}, 2.5).item<double>(), 5.0);
  EXPECT_FALSE(p.grad().is_contiguous());
  EXPECT_NEAR(vals(p.grad())[0], 3.0 * 2.5 / (5.0 + 1e-6), 1e-6);
  EXPECT_NEAR(vals(p.grad())[4], 4.0 * 2.5 / (5.0 + 1e-6), 1e-6);
}

// ---- found_non_finite ------------------------------------------------------------------------

TEST(FoundNonFinite, FlagsExactlyInfAndNaN) {
  EXPECT_EQ(optim::found_non_finite(scalar_tensor(1.5)).item<double>(), 0.0);
  EXPECT_EQ(optim::found_non_finite(scalar_tensor(kInf)).item<double>(), 1.0);
  EXPECT_EQ(optim::found_non_finite(scalar_tensor(-kInf)).item<double>(), 1.0);
  EXPECT_EQ(optim::found_non_finite(scalar_tensor(kNaN, {.dtype = DType::bf16})).item<double>(), 1.0);
  const Tensor f = optim::found_non_finite(scalar_tensor(0.0, {.dtype = DType::f64}));
  EXPECT_EQ(f.dim(), 0);
  EXPECT_EQ(f.dtype(), DType::f32);

  Tensor a = param({0.0, 0.0}, DType::f32), b = param({0.0}, DType::f16);
  set_grad(a, {1e30, -1e30});  // squares of 1e60: fine in double, no false alarm
  set_grad(b, {65504.0});
  EXPECT_EQ(optim::found_non_finite({a, b}).item<double>(), 0.0);
  set_grad(b, {kInf});
  EXPECT_EQ(optim::found_non_finite({a, b}).item<double>(), 1.0);
  set_grad(b, {kNaN});
  EXPECT_EQ(optim::found_non_finite({a, b}).item<double>(), 1.0);
}

// ---- the shared element math ------------------------------------------------------------------

TEST(OptimFunctors, PowIntIsAccurate) {
  for (double b : {0.9, 0.95, 0.99, 0.999, 0.9999}) {
    for (int64_t t : {0, 1, 2, 3, 7, 10, 100, 1000, 12345, 1000000}) {
      // Squaring doubles the relative error of what it squares: about t rounding errors in all.
      const double want = std::pow(b, static_cast<double>(t));
      EXPECT_NEAR(fn::pow_int(b, t), want, (static_cast<double>(t) + 4) * 2.3e-16 * want) << b << "^" << t;
    }
  }
  EXPECT_EQ(fn::pow_int(0.5, 3), 0.125);
}

TEST(OptimFunctors, AdamWScalarsAreTheDocumentedRule) {
  const fn::AdamWHyper h{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const auto c = fn::adamw_scalars<double>(h, 3);
  EXPECT_DOUBLE_EQ(c.decay, 1 - 1e-4);
  EXPECT_DOUBLE_EQ(c.step_size, 1e-3 / (1 - std::pow(0.9, 3)));
  EXPECT_DOUBLE_EQ(c.bias_correction2_sqrt, std::sqrt(1 - std::pow(0.95, 3)));
  EXPECT_DOUBLE_EQ(c.one_minus_beta2, 1 - 0.95);
  const auto f = fn::adamw_scalars<float>(h, 3);
  EXPECT_EQ(f.step_size, static_cast<float>(c.step_size));
}

// The CUDA SGD kernel runs fn::sgd_update; it must compute exactly what the CPU SGD's ops
// compute (each op rounded to the parameter's dtype). Checked here on the host, bit for bit.
template <class T> void check_sgd_element_rule(const SGDOptions& o) {
  using A = acc_t<T>;
  const DType dtype = dtype_v<T>;
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " momentum " + std::to_string(o.momentum) +
               (o.nesterov ? " nesterov" : ""));
  const size_t n = 50;
  Tensor p = param(wavy(n, 0.4, 3.0), dtype);
  SGD opt({p}, o);
  std::vector<A> x, b(n, A(0));
  for (double v : vals(p)) x.push_back(static_cast<A>(v));
  const fn::SGDScalars<A> c{static_cast<A>(o.weight_decay), static_cast<A>(convert<T>(o.momentum)),
                            static_cast<A>(o.momentum),     static_cast<A>(1.0 - o.dampening),
                            static_cast<A>(-o.lr),          o.weight_decay != 0,
                            o.momentum != 0,                o.nesterov};
  for (int s = 0; s < 5; ++s) {
    std::vector<double> g = wavy(n, 1.0 + s, 2.0);
    set_grad(p, g);
    opt.step();
    for (size_t i = 0; i < n; ++i)
      fn::sgd_update<T, A>(x[i], static_cast<A>(convert<T>(g[i])), b[i], /*first=*/s == 0, c);
    const std::vector<double> got = vals(p);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], static_cast<double>(x[i])) << "step " << s << " element " << i;
    if (o.momentum != 0) {
      const std::vector<double> buf = vals(opt.state(p)->tensors.at("momentum_buffer"));
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(buf[i], static_cast<double>(b[i])) << "step " << s << " element " << i;
    }
  }
}

TEST(OptimFunctors, SGDElementRuleIsTheOpsSequence) {
  const SGDOptions configs[] = {{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01},
                                {.lr = 0.1, .momentum = 0.8, .nesterov = true},
                                {.lr = 0.03, .weight_decay = 0.05}};
  for (const SGDOptions& o : configs) {
    check_sgd_element_rule<float>(o);
    check_sgd_element_rule<double>(o);
    check_sgd_element_rule<bf16>(o);
    check_sgd_element_rule<f16>(o);
  }
}

}  // namespace
}  // namespace forge
