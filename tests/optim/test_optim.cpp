// forge::optim: SGD and AdamW against their update rules computed by hand (scalar doubles),
// momentum/Nesterov sequences, bf16/f16 master weights, state_dict round trips, the
// hyper-parameter checks, LR schedules at their key steps, gradient clipping, the
// nanoGPT weight-decay split, and gradient accumulation over micro-batches.
//
// The update rules checked here (see src/forge/optim/sgd.h and adamw.h):
//   SGD    d = g + wd p;  b = d (first) | mu b + (1 - tau) d;  d = nesterov ? d + mu b : b;  p -= lr d
//   AdamW  p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//          p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// Parity with torch.optim itself is checked by tests/python/torch_reference.py
// (cases adamw_10_steps, sgd_nesterov_10_steps).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

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
using optim::AdamWOptions;
using optim::LRSchedule;
using optim::ParamGroup;
using optim::ScheduleKind;
using optim::SGD;
using optim::SGDOptions;
using ::testing::HasSubstr;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor f64(const std::vector<double>& v, const Shape& shape) { return from_vector<double>(v, shape); }
Tensor f64(const std::vector<double>& v) { return f64(v, {static_cast<int64_t>(v.size())}); }

// A leaf parameter (requires grad) holding `v`, converted to `dtype`.
void expect_near_rel(const std::vector<double>& got, const std::vector<double>& want, double rtol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], rtol * std::max(1.0, std::abs(want[i]))) << "element " << i;
}

// ---- scalar references --------------------------------------------------------------

struct SGDRef {
  double lr, momentum = 0, dampening = 0, wd = 0;
  bool nesterov = false;
  std::vector<double> buf = {};
  void step(std::vector<double>& p, const std::vector<double>& g) {
    const bool first = buf.empty();
    if (first) buf.resize(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + wd * p[i];
      if (momentum != 0) {
        buf[i] = first ? d : momentum * buf[i] + (1 - dampening) * d;
        d = nesterov ? d + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * d;
    }
  }
};

struct AdamWRef {
  double lr, b1, b2, eps, wd;
  std::vector<double> m = {}, v = {};
  int t = 0;
  void step(std::vector<double>& p, const std::vector<double>& g) {
    if (m.empty()) m.assign(p.size(), 0.0), v.assign(p.size(), 0.0);
    ++t;
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
    }
  }
};

// Deterministic pseudo-random gradients: sin of a running index, scaled.
std::vector<double> wavy(size_t n, double phase, double scale = 1.0) {
  std::vector<double> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = scale * std::sin(1.7 * static_cast<double>(i) + phase) + 0.1 * phase;
  return g;
}

// ---- SGD ----------------------------------------------------------------------------

TEST(SGD, OneStepClosedForm) {
  Tensor p = param({1.0, -2.0, 3.0});
  SGD opt({p}, {.lr = 0.1, .weight_decay = 0.01});
  set_grad(p, {0.5, 0.25, -1.0});
  opt.step();
  // p - lr * (g + wd * p)
  expect_near_rel(vals(p), {1.0 - 0.1 * (0.5 + 0.01), -2.0 - 0.1 * (0.25 - 0.02), 3.0 - 0.1 * (-1.0 + 0.03)}, 1e-15);
  EXPECT_EQ(opt.step_count(), 1);
  EXPECT_EQ(opt.state(p)->step, 1);
  EXPECT_TRUE(opt.state(p)->tensors.empty());  // no momentum: no buffer
}

TEST(SGD, MomentumWithDampeningSequence) {
  Tensor p = param({0.3, -1.2, 2.0, 0.0});
  SGD opt({p}, {.lr = 0.05, .momentum = 0.9, .dampening = 0.25, .weight_decay = 0.1});
  SGDRef ref{.lr = 0.05, .momentum = 0.9, .dampening = 0.25, .wd = 0.1};
  std::vector<double> want = vals(p);
  // Step 1 by hand: the buffer starts as d itself (no dampening on the first step).
  set_grad(p, {1.0, 2.0, -1.0, 0.5});
  opt.step();
  ref.step(want, {1.0, 2.0, -1.0, 0.5});
  EXPECT_NEAR(vals(p)[0], 0.3 - 0.05 * (1.0 + 0.1 * 0.3), 1e-15);
  for (int s = 1; s < 6; ++s) {
    const auto g = wavy(4, s);
    set_grad(p, g);
    opt.step();
    ref.step(want, g);
    expect_near_rel(vals(p), want, 1e-14);
  }
  expect_near_rel(vals(opt.state(p)->tensors.at("momentum_buffer")), ref.buf, 1e-14);
}

TEST(SGD, NesterovSequence) {
  Tensor p = param({1.0, -0.5, 0.25});
  SGD opt({p}, {.lr = 0.1, .momentum = 0.8, .nesterov = true});
  SGDRef ref{.lr = 0.1, .momentum = 0.8, .nesterov = true};
  std::vector<double> want = vals(p);
  // First step by hand: b = g, d = g + mu * g.
  set_grad(p, {0.5, -1.0, 2.0});
  opt.step();
  ref.step(want, {0.5, -1.0, 2.0});
  expect_near_rel(vals(p), {1.0 - 0.1 * 1.8 * 0.5, -0.5 + 0.1 * 1.8, 0.25 - 0.1 * 1.8 * 2.0}, 1e-15);
  // Second step by hand: b = 0.8 b + g, d = g + 0.8 b.
  set_grad(p, {1.0, 1.0, 1.0});
  opt.step();
  ref.step(want, {1.0, 1.0, 1.0});
  const double b0 = 0.8 * 0.5 + 1.0;
  EXPECT_NEAR(vals(p)[0], 1.0 - 0.1 * 1.8 * 0.5 - 0.1 * (1.0 + 0.8 * b0), 1e-15);
  for (int s = 0; s < 5; ++s) {
    const auto g = wavy(3, 0.3 * s, 2.0);
    set_grad(p, g);
    opt.step();
    ref.step(want, g);
  }
  expect_near_rel(vals(p), want, 1e-14);
}

TEST(SGD, PerGroupHyperParametersOverrideTheOptions) {
  Tensor a = param({1.0}), b = param({1.0});
  SGD opt(std::vector<ParamGroup>{{.params = {a}}, {.params = {b}, .lr = 0.5, .weight_decay = 1.0}}, {.lr = 0.1});
  EXPECT_EQ(*opt.param_groups()[0].lr, 0.1);
  EXPECT_EQ(*opt.param_groups()[0].weight_decay, 0.0);
  EXPECT_EQ(*opt.param_groups()[1].lr, 0.5);
  set_grad(a, {1.0});
  set_grad(b, {1.0});
  opt.step();
  EXPECT_DOUBLE_EQ(vals(a)[0], 0.9);
  EXPECT_DOUBLE_EQ(vals(b)[0], 1.0 - 0.5 * (1.0 + 1.0));
}

// ---- AdamW --------------------------------------------------------------------------

TEST(AdamW, OneStepClosedForm) {
  // At t = 1: m / (1 - b1) = g and v / (1 - b2) = g^2, so
  //   p1 = p (1 - lr wd) - lr g / (|g| + eps).
  const double lr = 0.01, wd = 0.1, eps = 1e-8;
  Tensor p = param({1.0, -2.0, 0.5, 3.0});
  AdamW opt({p}, {.lr = lr, .beta1 = 0.9, .beta2 = 0.95, .eps = eps, .weight_decay = wd});
  const std::vector<double> g{0.5, -0.25, 1e-3, 4.0};
  set_grad(p, g);
  opt.step();
  const std::vector<double> p0{1.0, -2.0, 0.5, 3.0};
  std::vector<double> want(4);
  for (size_t i = 0; i < 4; ++i) want[i] = p0[i] * (1 - lr * wd) - lr * g[i] / (std::abs(g[i]) + eps);
  expect_near_rel(vals(p), want, 1e-15);
  // The moments: m = (1 - b1) g, v = (1 - b2) g^2.
  const auto& st = opt.state(p)->tensors;
  expect_near_rel(vals(st.at("exp_avg")), {0.05, -0.025, 1e-4, 0.4}, 1e-15);
  EXPECT_NEAR(vals(st.at("exp_avg_sq"))[3], 0.05 * 16.0, 1e-15);
  EXPECT_EQ(st.at("exp_avg").dtype(), DType::f64);
}

TEST(AdamW, TwoStepsByHand) {
  // One element, p = 1, g1 = 1, g2 = -2, lr 0.1, b1 0.5, b2 0.75, eps 0, wd 0:
  //   t=1: m = 0.5, v = 0.25, mhat = 1, vhat = 1  -> p = 1 - 0.1 = 0.9
  //   t=2: m = 0.25 - 1 = -0.75, v = 0.1875 + 1 = 1.1875; mhat = -0.75 / 0.75 = -1,
  //        vhat = 1.1875 / 0.4375  -> p = 0.9 + 0.1 / sqrt(1.1875 / 0.4375)
  Tensor p = param({1.0});
  AdamW opt({p}, {.lr = 0.1, .beta1 = 0.5, .beta2 = 0.75, .eps = 1e-300, .weight_decay = 0.0});
  set_grad(p, {1.0});
  opt.step();
  EXPECT_NEAR(vals(p)[0], 0.9, 1e-15);
  set_grad(p, {-2.0});
  opt.step();
  EXPECT_NEAR(vals(p)[0], 0.9 + 0.1 / std::sqrt(1.1875 / 0.4375), 1e-15);
}

TEST(AdamW, LongSequenceMatchesScalarReferenceAcrossThreads) {
  // 40000 elements: above the parallel grain, so the OpenMP path runs.
  const size_t n = 40000;
  std::vector<double> p0 = wavy(n, 0.7);
  Tensor p = param(p0);
  AdamW opt({p}, {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.05});
  AdamWRef ref{.lr = 3e-3, .b1 = 0.9, .b2 = 0.99, .eps = 1e-8, .wd = 0.05};
  for (int s = 0; s < 7; ++s) {
    const auto g = wavy(n, 1.0 + s, 0.5);
    set_grad(p, g);
    opt.step();
    ref.step(p0, g);
  }
  expect_near_rel(vals(p), p0, 1e-14);
  expect_near_rel(vals(opt.state(p)->tensors.at("exp_avg_sq")), ref.v, 1e-14);
}

TEST(AdamW, SkipsParametersWithoutGradient) {
  Tensor a = param({1.0, 2.0}), b = param({3.0});
  AdamW opt({a, b}, {.lr = 0.1, .weight_decay = 0.5});
  AdamWRef ra{.lr = 0.1, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8, .wd = 0.5};
  AdamWRef rb = ra;
  std::vector<double> wa = vals(a), wb = vals(b);
  set_grad(a, {0.5, -0.5});
  opt.step();  // b has no gradient: untouched (no weight decay either), no state
  ra.step(wa, {0.5, -0.5});
  EXPECT_EQ(vals(b), std::vector<double>{3.0});
  EXPECT_EQ(opt.state(b), nullptr);
  set_grad(b, {1.0});
  opt.step();  // b's first update: its own step count is 1
  ra.step(wa, {0.5, -0.5});
  rb.step(wb, {1.0});
  expect_near_rel(vals(a), wa, 1e-15);
  expect_near_rel(vals(b), wb, 1e-15);
  EXPECT_EQ(opt.state(a)->step, 2);
  EXPECT_EQ(opt.state(b)->step, 1);
  EXPECT_EQ(opt.step_count(), 2);
}

TEST(AdamW, F32ParameterKeepsF32StateAndTracksTheDoubleRule) {
  std::vector<double> p0 = wavy(300, 0.2);
  Tensor p = param(p0, DType::f32);
  AdamW opt({p}, {.lr = 1e-2});
  AdamWRef ref{.lr = 1e-2, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8, .wd = 1e-2};
  for (int s = 0; s < 5; ++s) {
    auto g = wavy(300, 3.0 + s);
    for (auto& x : g) x = static_cast<float>(x);  // the f32 gradient forge sees
    set_grad(p, g);
    opt.step();
    ref.step(p0, g);
  }
  EXPECT_EQ(p.dtype(), DType::f32);
  EXPECT_EQ(opt.state(p)->tensors.at("exp_avg").dtype(), DType::f32);
  EXPECT_EQ(opt.state(p)->tensors.count("master"), 0u);
  expect_near_rel(vals(p), p0, 2e-6);
}

// Note [bf16 master weights]: the update lands in the f32 master; p == round(master).
void check_master_weights(DType dtype) {
  SCOPED_TRACE(dtype_name(dtype));
  // A weight of 1 with lr 1e-4: each update (about lr) is below half the 16-bit spacing
  // near 1, so a 16-bit weight updated in place would never move.
  const size_t n = 64;
  std::vector<double> init(n);
  for (size_t i = 0; i < n; ++i) init[i] = 1.0 + static_cast<double>(i) / 64.0;
  Tensor p = param(init, dtype);
  const std::vector<double> p0 = vals(p);  // the 16-bit values
  AdamW opt({p}, {.lr = 1e-4, .weight_decay = 0.0});
  // The f32 reference of the master: the same rule in float.
  std::vector<float> x(p0.begin(), p0.end()), m(n, 0.f), v(n, 0.f);
  for (int t = 1; t <= 40; ++t) {
    std::vector<double> g(n, 1.0);  // constant gradient: every update is about -lr
    set_grad(p, g);
    opt.step();
    const double step_size = 1e-4 / (1 - std::pow(0.9, t)), bc2 = std::sqrt(1 - std::pow(0.999, t));
    for (size_t i = 0; i < n; ++i) {
      m[i] = 0.9f * m[i] + 0.1f * 1.0f;
      v[i] = 0.999f * v[i] + static_cast<float>(1.0 - 0.999) * 1.0f;
      x[i] -= static_cast<float>(step_size) * m[i] / (std::sqrt(v[i]) / static_cast<float>(bc2) + 1e-8f);
    }
    const Tensor& master = opt.state(p)->tensors.at("master");
    ASSERT_EQ(master.dtype(), DType::f32);
    // p is exactly the master rounded to the parameter's dtype.
    EXPECT_EQ(vals(p), vals(master.to(dtype)));
    if (t == 1) {
      // After one step the master moved by about lr, the 16-bit weight did not.
      EXPECT_EQ(vals(p), p0);
      EXPECT_NEAR(vals(master)[0], p0[0] - 1e-4, 1e-7);
    }
  }
  const Tensor& master = opt.state(p)->tensors.at("master");
  const std::vector<double> mv = vals(master);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(mv[i], x[i], 2e-6 * std::abs(x[i])) << "element " << i;
  // 40 updates of ~1e-4 accumulated in the master: a 4e-3 drop, visible in bf16 and f16.
  EXPECT_NEAR(mv[0], 1.0 - 40 * 1e-4, 1e-4);
  EXPECT_NE(vals(p)[0], 1.0);
  EXPECT_EQ(opt.state(p)->tensors.at("exp_avg").dtype(), DType::f32);
}

TEST(AdamW, Bf16MasterWeights) { check_master_weights(DType::bf16); }
TEST(AdamW, F16MasterWeights) { check_master_weights(DType::f16); }

TEST(AdamW, NonContiguousParameterIsUpdatedThroughItsView) {
  // A leaf that is a transposed view: the update is written back through the view.
  const std::vector<double> v0 = wavy(6, 0.5);
  Tensor base = f64(v0, {2, 3});
  Tensor pt = base.t();  // (3, 2), strides (1, 3)
  pt.requires_grad_(true);
  Tensor pc = base.t().contiguous();
  pc.requires_grad_(true);
  AdamW a({pt}, {.lr = 0.1}), b({pc}, {.lr = 0.1});
  for (int s = 0; s < 3; ++s) {
    const Tensor g = f64(wavy(6, 2.0 + s), {3, 2});
    pt.set_grad(g);
    pc.set_grad(g);
    a.step();
    b.step();
  }
  EXPECT_FALSE(pt.is_contiguous());
  EXPECT_EQ(vals(pt), vals(pc));
  EXPECT_EQ(vals(base), vals(pc.t()));  // the storage behind the view changed
}

// ---- hyper-parameter checks ---------------------------------------------------------

TEST(Optimizer, BadHyperParametersNameTheOptimizerAndTheValue) {
  Tensor p = param({1.0});
  EXPECT_THAT(error_of([&] { AdamW({p}, {.lr = -0.1}); }), HasSubstr("AdamW: invalid lr -0.1 in param group 0"));
  EXPECT_THAT(error_of([&] { AdamW({p}, {.beta1 = 1.0}); }), HasSubstr("AdamW: invalid beta1 1 in param group 0"));
  EXPECT_THAT(error_of([&] { AdamW({p}, {.beta1 = -0.5}); }), HasSubstr("AdamW: invalid beta1 -0.5"));
  EXPECT_THAT(error_of([&] { AdamW({p}, {.beta2 = 1.5}); }), HasSubstr("AdamW: invalid beta2 1.5"));
  EXPECT_THAT(error_of([&] { AdamW({p}, {.beta2 = kNaN}); }), HasSubstr("AdamW: invalid beta2 nan"));
  EXPECT_THAT(error_of([&] { AdamW({p}, {.eps = 0.0}); }), HasSubstr("AdamW: invalid eps 0"));
  EXPECT_THAT(error_of([&] { AdamW({p}, {.eps = -1e-8}); }), HasSubstr("AdamW: invalid eps -1e-08"));
  EXPECT_THAT(error_of([&] { AdamW({p}, {.weight_decay = -0.01}); }), HasSubstr("AdamW: invalid weight_decay -0.01"));
  EXPECT_THAT(error_of([&] { SGD({p}, {.lr = -1.0}); }), HasSubstr("SGD: invalid lr -1 in param group 0"));
  EXPECT_THAT(error_of([&] { SGD({p}, {.lr = kInf}); }), HasSubstr("SGD: invalid lr inf"));
  EXPECT_THAT(error_of([&] { SGD({p}, {.momentum = -0.9}); }), HasSubstr("SGD: invalid momentum -0.9"));
  EXPECT_THAT(error_of([&] { SGD({p}, {.dampening = 2.0}); }), HasSubstr("SGD: invalid dampening 2"));
  EXPECT_THAT(error_of([&] { SGD({p}, {.nesterov = true}); }), HasSubstr("Nesterov momentum needs momentum > 0"));
  EXPECT_THAT(error_of([&] { SGD({p}, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}); }),
              HasSubstr("Nesterov momentum needs dampening 0"));
  // The group index is named; another optimizer's field is refused.
  Tensor q = param({2.0});
  EXPECT_THAT(error_of([&] { AdamW(std::vector<ParamGroup>{{.params = {p}}, {.params = {q}, .beta1 = 2.0}}); }),
              HasSubstr("AdamW: invalid beta1 2 in param group 1"));
  EXPECT_THAT(error_of([&] { SGD(std::vector<ParamGroup>{{.params = {p}, .beta1 = 0.9}}); }),
              HasSubstr("SGD: param group 0 sets beta1, which SGD does not use"));
  EXPECT_THAT(error_of([&] { AdamW(std::vector<ParamGroup>{{.params = {p}, .momentum = 0.9}}); }),
              HasSubstr("AdamW: param group 0 sets momentum"));
}

TEST(Optimizer, BadLrSetLaterIsCaughtBeforeAnyParameterChanges) {
  Tensor a = param({1.0}), b = param({2.0});
  AdamW opt(std::vector<ParamGroup>{{.params = {a}}, {.params = {b}}}, {.lr = 0.1});
  set_grad(a, {1.0});
  set_grad(b, {1.0});
  opt.param_groups()[1].lr = -3.0;
  EXPECT_THAT(error_of([&] { opt.step(); }), HasSubstr("AdamW: invalid lr -3 in param group 1"));
  EXPECT_EQ(vals(a), std::vector<double>{1.0});
  EXPECT_EQ(opt.step_count(), 0);
  EXPECT_EQ(opt.state(a), nullptr);
}

TEST(Optimizer, ParameterListChecks) {
  Tensor p = param({1.0});
  EXPECT_THAT(error_of([&] { SGD({p, p}); }), HasSubstr("appears more than once"));
  EXPECT_THAT(error_of([&] { SGD(std::vector<Tensor>{}); }), HasSubstr("SGD: got no parameters to optimize"));
  Tensor nonleaf = p * 2.0;
  EXPECT_THAT(error_of([&] { AdamW({nonleaf}); }), HasSubstr("is not a leaf"));
  EXPECT_THAT(error_of([&] { AdamW({Tensor()}); }), HasSubstr("undefined tensor"));
  EXPECT_THAT(error_of([&] { AdamW({from_vector<int64_t>({1, 2}, {2})}); }), HasSubstr("only floating-point"));
}

TEST(Optimizer, ZeroGradDropsGradients) {
  Tensor a = param({1.0}), b = param({2.0});
  SGD opt({a, b});
  set_grad(a, {1.0});
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  opt.step();  // nothing has a gradient: nothing moves
  EXPECT_EQ(vals(a), std::vector<double>{1.0});
}

TEST(Optimizer, StepRunsWithoutRecordingHistoryWhileGradModeIsOn) {
  Tensor p = param({1.0, 2.0});
  AdamW opt({p});
  Tensor loss = (p * p).sum();
  loss.backward();
  ASSERT_TRUE(grad_enabled());
  opt.step();  // in-place updates of a leaf that requires grad: allowed inside step()
  EXPECT_TRUE(p.is_leaf());
  EXPECT_TRUE(p.requires_grad());
}

// ---- state_dict ---------------------------------------------------------------------

// Runs `steps` steps of `opt` over `params` with gradients derived from `seed`.
void run_steps(optim::Optimizer& opt, const std::vector<Tensor>& params, int first, int steps) {
  for (int s = first; s < first + steps; ++s) {
    for (size_t i = 0; i < params.size(); ++i) {
      if ((s + i) % 5 == 3) {
        params[i].zero_grad();  // now and then a parameter has no gradient
        continue;
      }
      set_grad(params[i], wavy(static_cast<size_t>(params[i].numel()), 0.37 * s + static_cast<double>(i)));
    }
    opt.step();
  }
}

std::vector<Tensor> fresh_copies(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const Tensor& p : ps) {
    Tensor c = p.detach().clone();
    c.requires_grad_(true);
    out.push_back(c);
  }
  return out;
}

template <class Opt, class Options>
void check_round_trip(const std::vector<DType>& dtypes, const Options& options) {
  std::vector<Tensor> ps;
  for (size_t i = 0; i < dtypes.size(); ++i) ps.push_back(param(wavy(5 + i, 0.1 * static_cast<double>(i)), dtypes[i]));
  auto groups = [](const std::vector<Tensor>& v) {
    return std::vector<ParamGroup>{{.params = {v[0], v[1]}, .weight_decay = 0.1},
                                   {.params = std::vector<Tensor>(v.begin() + 2, v.end()), .lr = 0.02, .weight_decay = 0.0}};
  };
  Opt a(groups(ps), options);
  run_steps(a, ps, 0, 4);
  const optim::StateDict saved = a.state_dict().clone();
  const std::vector<Tensor> resumed = fresh_copies(ps);
  run_steps(a, ps, 4, 5);

  std::vector<Tensor> copies = resumed;
  Opt b(groups(copies), options);
  b.param_groups()[1].lr = 123.0;  // restored by load_state_dict
  b.load_state_dict(saved);
  EXPECT_EQ(b.step_count(), 4);
  EXPECT_EQ(*b.param_groups()[1].lr, 0.02);
  run_steps(b, copies, 4, 5);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(vals(copies[i]), vals(ps[i])) << "parameter " << i;  // bit-identical continuation
    ASSERT_NE(b.state(copies[i]), nullptr);
    EXPECT_EQ(b.state(copies[i])->step, a.state(ps[i])->step);
    for (const auto& [name, t] : a.state(ps[i])->tensors) EXPECT_EQ(vals(b.state(copies[i])->tensors.at(name)), vals(t));
  }
  const optim::StateDict sd = a.state_dict();
  EXPECT_EQ(sd.scalars.at("step"), 9.0);
  EXPECT_EQ(sd.scalars.at("group.1.lr"), 0.02);
  EXPECT_EQ(sd.scalars.at("group.0.num_params"), 2.0);
}

TEST(OptimStateDict, AdamWRoundTripContinuesIdentically) {
  check_round_trip<AdamW>({DType::f64, DType::f32, DType::bf16, DType::f16}, AdamWOptions{.lr = 0.05, .beta2 = 0.95});
}

TEST(OptimStateDict, SGDRoundTripContinuesIdentically) {
  check_round_trip<SGD>({DType::f64, DType::f32, DType::f64}, SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true});
}

TEST(OptimStateDict, NamesAndContents) {
  Tensor a = param({1.0, 2.0}, DType::bf16), b = param({3.0});
  AdamW opt({a, b});
  set_grad(a, {1.0, 1.0});
  opt.step();
  const optim::StateDict sd = opt.state_dict();
  EXPECT_EQ(sd.tensors.size(), 3u);  // exp_avg, exp_avg_sq, master of parameter 0; none for 1
  EXPECT_TRUE(sd.tensors.count("state.0.master"));
  EXPECT_EQ(sd.tensors.at("state.0.exp_avg").dtype(), DType::f32);
  EXPECT_EQ(sd.scalars.at("state.0.step"), 1.0);
  EXPECT_FALSE(sd.scalars.count("state.1.step"));
  for (const char* k : {"step", "group.0.lr", "group.0.weight_decay", "group.0.beta1", "group.0.beta2", "group.0.eps"})
    EXPECT_TRUE(sd.scalars.count(k)) << k;
  // state_dict aliases the live state; clone() does not.
  const optim::StateDict copy = sd.clone();
  set_grad(a, {1.0, 1.0});
  opt.step();
  EXPECT_EQ(vals(sd.tensors.at("state.0.exp_avg")), vals(opt.state(a)->tensors.at("exp_avg")));
  EXPECT_NE(vals(copy.tensors.at("state.0.exp_avg")), vals(opt.state(a)->tensors.at("exp_avg")));
}

TEST(OptimStateDict, MismatchesAreRejectedAndLeaveTheOptimizerUnchanged) {
  Tensor a = param({1.0, 2.0}), b = param({3.0});
  AdamW src({a, b}, {.lr = 0.1});
  set_grad(a, {1.0, -1.0});
  set_grad(b, {0.5});
  src.step();
  const optim::StateDict sd = src.state_dict().clone();

  Tensor c = param({1.0, 2.0}), d = param({3.0});
  AdamW dst({c, d}, {.lr = 0.7});
  // Another optimizer's state.
  SGD sgd({c, d}, {.momentum = 0.9});
  EXPECT_THAT(error_of([&] { sgd.load_state_dict(sd); }), HasSubstr("SGD: load_state_dict: missing scalar 'group.0.momentum'"));
  // Other parameter counts / shapes.
  AdamW one({c});
  EXPECT_THAT(error_of([&] { one.load_state_dict(sd); }), HasSubstr("param group 0 was saved with 2 parameters but has 1"));
  Tensor wide = param({1.0, 2.0, 3.0});
  AdamW shaped({wide, d});
  EXPECT_THAT(error_of([&] { shaped.load_state_dict(sd); }), HasSubstr("has shape [2] but parameter 0 has shape [3]"));
  // Missing moment, bad values, unknown keys.
  optim::StateDict broken = sd;
  broken.tensors.erase("state.1.exp_avg_sq");
  EXPECT_THAT(error_of([&] { dst.load_state_dict(broken); }), HasSubstr("missing tensor 'state.1.exp_avg_sq'"));
  broken = sd;
  broken.scalars["group.0.beta2"] = 1.0;
  EXPECT_THAT(error_of([&] { dst.load_state_dict(broken); }), HasSubstr("AdamW: invalid beta2 1 in param group 0"));
  broken = sd;
  broken.tensors["state.0.momentum_buffer"] = zeros({2}, {.dtype = DType::f64});
  EXPECT_THAT(error_of([&] { dst.load_state_dict(broken); }), HasSubstr("'state.0.momentum_buffer' is not state"));
  broken = sd;
  broken.scalars["lr_scale"] = 2.0;
  EXPECT_THAT(error_of([&] { dst.load_state_dict(broken); }), HasSubstr("unknown scalar 'lr_scale'"));
  // None of that changed dst.
  EXPECT_EQ(*dst.param_groups()[0].lr, 0.7);
  EXPECT_EQ(dst.state(c), nullptr);
  EXPECT_EQ(dst.step_count(), 0);
  dst.load_state_dict(sd);
  EXPECT_EQ(*dst.param_groups()[0].lr, 0.1);
  EXPECT_EQ(dst.state(c)->step, 1);
}

// ---- decay_groups -------------------------------------------------------------------

TEST(OptimDecayGroups, GPT2Convention) {
  auto w = [](const Shape& s, bool rg = true) {
    Tensor t = zeros(s, {.dtype = DType::f32});
    t.requires_grad_(rg);
    return t;
  };
  Tensor wte = w({50, 8}), wpe = w({16, 8}), attn = w({8, 24}), attn_b = w({24}), ln_w = w({8}), ln_b = w({8});
  Tensor embed_tokens = w({50, 8}), tok = w({50, 8}), conv = w({4, 3, 3, 3}), frozen = w({8, 8}, false);
  const std::vector<std::pair<std::string, Tensor>> named{
      {"transformer.wte.weight", wte},
      {"transformer.wpe.weight", wpe},
      {"transformer.h.0.ln_1.weight", ln_w},
      {"transformer.h.0.ln_1.bias", ln_b},
      {"transformer.h.0.attn.c_attn.weight", attn},
      {"transformer.h.0.attn.c_attn.bias", attn_b},
      {"model.embed_tokens.weight", embed_tokens},
      {"tok_embeddings.weight", tok},
      {"features.0.weight", conv},
      {"frozen.weight", frozen},
      {"lm_head.weight", wte},  // tied to wte: listed once, and not decayed
  };
  const auto groups = optim::decay_groups(named, 0.1);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].weight_decay, 0.1);
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  EXPECT_FALSE(groups[0].lr.has_value());
  auto has = [](const ParamGroup& g, const Tensor& t) {
    for (const Tensor& p : g.params)
      if (p.is_same(t)) return true;
    return false;
  };
  ASSERT_EQ(groups[0].params.size(), 2u);
  EXPECT_TRUE(has(groups[0], attn));
  EXPECT_TRUE(has(groups[0], conv));
  ASSERT_EQ(groups[1].params.size(), 7u);
  for (const Tensor& t : {wte, wpe, ln_w, ln_b, attn_b, embed_tokens, tok}) EXPECT_TRUE(has(groups[1], t));
  EXPECT_FALSE(has(groups[0], frozen) || has(groups[1], frozen));
  // The groups feed an optimizer directly; the lr comes from its options.
  AdamW opt(groups, {.lr = 6e-4, .beta2 = 0.95});
  EXPECT_EQ(*opt.param_groups()[0].weight_decay, 0.1);
  EXPECT_EQ(*opt.param_groups()[1].weight_decay, 0.0);
  EXPECT_EQ(*opt.param_groups()[1].lr, 6e-4);
  EXPECT_THAT(error_of([&] { optim::decay_groups(named, -1.0); }), HasSubstr("decay_groups: weight_decay must be"));
}

// ---- schedules ----------------------------------------------------------------------

TEST(LRSchedule, WarmupThenCosineAtKeySteps) {
  const LRSchedule s{.kind = ScheduleKind::cosine, .lr = 1.0, .min_lr = 0.1, .warmup_steps = 10, .total_steps = 110};
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);   // (0 + 1) / 10
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1.0);   // warmup end
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1.0);  // decay start: cos(0)
  EXPECT_DOUBLE_EQ(s.lr_at(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi / 4)));
  EXPECT_NEAR(s.lr_at(60), 0.55, 1e-15);  // mid: half way between lr and min_lr
  EXPECT_DOUBLE_EQ(s.lr_at(110), 0.1);    // end
  EXPECT_DOUBLE_EQ(s.lr_at(111), 0.1);    // beyond
  EXPECT_DOUBLE_EQ(s.lr_at(1000000), 0.1);
  for (int64_t k = 10; k < 110; ++k) EXPECT_GE(s.lr_at(k), s.lr_at(k + 1)) << k;  // monotone decay
}

TEST(LRSchedule, WarmupThenLinearAtKeySteps) {
  const LRSchedule s{.kind = ScheduleKind::linear, .lr = 2.0, .min_lr = 0.0, .warmup_steps = 4, .total_steps = 20};
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 2.0);
  EXPECT_DOUBLE_EQ(s.lr_at(4), 2.0);
  EXPECT_DOUBLE_EQ(s.lr_at(8), 1.5);  // r = 1/4
  EXPECT_DOUBLE_EQ(s.lr_at(12), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(20), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(25), 0.0);
}

TEST(LRSchedule, ConstantAndEdgeCases) {
  const LRSchedule c{.kind = ScheduleKind::constant, .lr = 3e-4, .warmup_steps = 3};
  EXPECT_DOUBLE_EQ(c.lr_at(0), 1e-4);
  EXPECT_DOUBLE_EQ(c.lr_at(2), 3e-4);
  EXPECT_DOUBLE_EQ(c.lr_at(100000), 3e-4);
  const LRSchedule no_warmup{.kind = ScheduleKind::cosine, .lr = 1.0, .min_lr = 0.0, .warmup_steps = 0, .total_steps = 2};
  EXPECT_DOUBLE_EQ(no_warmup.lr_at(0), 1.0);
  EXPECT_NEAR(no_warmup.lr_at(1), 0.5, 1e-16);
  EXPECT_DOUBLE_EQ(no_warmup.lr_at(2), 0.0);
  const LRSchedule instant{.kind = ScheduleKind::linear, .lr = 1.0, .min_lr = 0.25, .warmup_steps = 2, .total_steps = 2};
  EXPECT_DOUBLE_EQ(instant.lr_at(1), 1.0);
  EXPECT_DOUBLE_EQ(instant.lr_at(2), 0.25);
}

TEST(LRSchedule, BadFieldsAreRejected) {
  EXPECT_THAT(error_of([] { LRSchedule{.lr = 1.0, .min_lr = 2.0, .total_steps = 5}.lr_at(0); }),
              HasSubstr("min_lr must be in [0, lr]"));
  EXPECT_THAT(error_of([] { LRSchedule{.lr = 1.0, .warmup_steps = 10, .total_steps = 5}.lr_at(0); }),
              HasSubstr("total_steps (5) must be >= warmup_steps (10)"));
  EXPECT_THAT(error_of([] { LRSchedule{.lr = -1.0}.lr_at(0); }), HasSubstr("lr must be finite and >= 0, got -1"));
  EXPECT_THAT(error_of([] { LRSchedule{.lr = 1.0, .total_steps = 5}.lr_at(-1); }), HasSubstr("step must be >= 0"));
  EXPECT_THAT(error_of([] { LRSchedule{.kind = ScheduleKind::constant, .warmup_steps = -2}.lr_at(0); }),
              HasSubstr("warmup_steps must be >= 0"));
}

TEST(LRSchedule, ApplySetsEveryGroup) {
  Tensor a = param({1.0}), b = param({1.0});
  SGD opt(std::vector<ParamGroup>{{.params = {a}}, {.params = {b}, .lr = 0.5}});
  const LRSchedule s{.kind = ScheduleKind::cosine, .lr = 0.2, .min_lr = 0.02, .warmup_steps = 2, .total_steps = 10};
  s.apply(opt, 0);
  EXPECT_DOUBLE_EQ(*opt.param_groups()[0].lr, 0.1);
  EXPECT_DOUBLE_EQ(*opt.param_groups()[1].lr, 0.1);
  set_grad(a, {1.0});
  opt.step();
  EXPECT_DOUBLE_EQ(vals(a)[0], 0.9);
  s.apply(opt, opt.step_count());
  EXPECT_DOUBLE_EQ(*opt.param_groups()[1].lr, 0.2);
}

// ---- clipping -----------------------------------------------------------------------

TEST(ClipGradNorm, ScalesOnlyAboveMaxNorm) {
  Tensor a = param({0.0, 0.0}), b = param({0.0}), c = param({5.0});
  set_grad(a, {3.0, 4.0});
  set_grad(b, {12.0});  // global norm sqrt(9 + 16 + 144) = 13; c has no gradient
  EXPECT_DOUBLE_EQ(optim::grad_norm({a, b, c}), 13.0);
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm({a, b, c}, 13.0), 13.0);  // at max_norm: untouched
  EXPECT_EQ(vals(a.grad()), (std::vector<double>{3.0, 4.0}));
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm({a, b, c}, 26.0), 13.0);
  EXPECT_EQ(vals(b.grad()), std::vector<double>{12.0});
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm({a, b, c}, 6.5), 13.0);  // returns the norm before clipping
  const double coef = 6.5 / (13.0 + 1e-6);
  expect_near_rel(vals(a.grad()), {3.0 * coef, 4.0 * coef}, 1e-15);
  expect_near_rel(vals(b.grad()), {12.0 * coef}, 1e-15);
  EXPECT_NEAR(optim::grad_norm({a, b}), 6.5, 1e-6);
  EXPECT_FALSE(c.grad().defined());
  // Listed twice: counted and scaled once.
  EXPECT_NEAR(optim::clip_grad_norm({a, a, b}, 100.0), 6.5, 1e-6);
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm({c}, 1.0), 0.0);  // no gradients at all
}

TEST(ClipGradNorm, NonFiniteNormLeavesGradientsUntouched) {
  Tensor a = param({0.0, 0.0}), b = param({0.0});
  set_grad(a, {3.0, 4.0});
  set_grad(b, {kNaN});
  EXPECT_TRUE(std::isnan(optim::clip_grad_norm({a, b}, 1.0)));
  EXPECT_EQ(vals(a.grad()), (std::vector<double>{3.0, 4.0}));
  set_grad(b, {-kInf});
  EXPECT_EQ(optim::clip_grad_norm({a, b}, 1.0), kInf);
  EXPECT_EQ(vals(a.grad()), (std::vector<double>{3.0, 4.0}));
  EXPECT_THAT(error_of([&] { optim::clip_grad_norm({a}, -1.0); }), HasSubstr("clip_grad_norm: max_norm must be >= 0"));
}

TEST(ClipGradNorm, LowPrecisionAndLargeGradients) {
  // bf16 gradients: the norm accumulates in double; the scale is applied in double and
  // rounded once (not rounded to bf16 first).
  Tensor h = param(std::vector<double>(4, 0.0), DType::bf16);
  set_grad(h, {1.0, 1.0, 1.0, 1.0});
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm({h}, 1.0), 2.0);
  EXPECT_EQ(vals(h.grad()), std::vector<double>(4, static_cast<double>(static_cast<float>(bf16(static_cast<float>(1.0 / (2.0 + 1e-6)))))));
  // Above the parallel grain: the blocked sum equals the sequential one to rounding.
  const size_t n = 100003;
  Tensor big = param(std::vector<double>(n, 0.0), DType::f32);
  std::vector<double> g = wavy(n, 0.1);
  for (auto& x : g) x = static_cast<float>(x);
  set_grad(big, g);
  double ss = 0;
  for (double x : g) ss += x * x;
  EXPECT_NEAR(optim::clip_grad_norm({big}, 1.0), std::sqrt(ss), 1e-12 * std::sqrt(ss));
  EXPECT_NEAR(optim::grad_norm({big}), 1.0, 1e-6);
}

TEST(ClipGradNorm, NonContiguousGradient) {
  Tensor p = zeros({2, 3}, {.dtype = DType::f64});
  p.requires_grad_(true);
  p.set_grad(f64({3.0, 0.0, 0.0, 4.0, 0.0, 0.0}, {3, 2}).t());  // strided view
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm({p}, 2.5), 5.0);
  EXPECT_NEAR(vals(p.grad())[0], 3.0 * 2.5 / (5.0 + 1e-6), 1e-15);
  EXPECT_NEAR(vals(p.grad())[4], 4.0 * 2.5 / (5.0 + 1e-6), 1e-15);  // (2, 3) row-major: [3 0 0; 0 4 0]
  EXPECT_FALSE(p.grad().is_contiguous());
}

// ---- gradient accumulation ----------------------------------------------------------

// A linear model y = x w + b with loss mean((y - t)^2), built from ops.
Tensor mse_loss(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& t) {
  return ((ops::matmul(x, w) + b) - t).pow(2.0).mean();
}

template <class Opt, class Options>
void check_accumulation(const Options& options) {
  const int64_t batch = 8, in = 3, out = 2, micro = 4;  // 4 micro-batches of 2 rows
  const Tensor x = f64(wavy(batch * in, 0.3), {batch, in});
  const Tensor t = f64(wavy(batch * out, 1.1), {batch, out});
  auto make = [&] {
    Tensor w = f64(wavy(in * out, 2.0, 0.5), {in, out}), b = f64({0.1, -0.2});
    w.requires_grad_(true);
    b.requires_grad_(true);
    return std::pair{w, b};
  };
  auto [w_big, b_big] = make();
  auto [w_acc, b_acc] = make();
  Opt big({w_big, b_big}, options), acc({w_acc, b_acc}, options);
  for (int step = 0; step < 3; ++step) {
    // One big batch.
    mse_loss(x, w_big, b_big, t).backward();
    big.step();
    big.zero_grad();
    // The same batch as `micro` micro-batches: loss / micro, backward each, then one step.
    const int64_t rows = batch / micro;
    for (int64_t k = 0; k < micro; ++k) {
      Tensor loss = mse_loss(x.narrow(0, k * rows, rows), w_acc, b_acc, t.narrow(0, k * rows, rows));
      (loss / static_cast<double>(micro)).backward();
    }
    acc.step();
    acc.zero_grad();
    expect_near_rel(vals(w_acc), vals(w_big), 1e-12);
    expect_near_rel(vals(b_acc), vals(b_big), 1e-12);
  }
  EXPECT_NE(vals(w_big), vals(make().first));  // the model did move
}

TEST(OptimGradAccumulation, MicroBatchesMatchOneBigBatchSGD) {
  check_accumulation<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
}

TEST(OptimGradAccumulation, MicroBatchesMatchOneBigBatchAdamW) {
  check_accumulation<AdamW>(AdamWOptions{.lr = 0.05, .weight_decay = 0.1});
}

}  // namespace
}  // namespace forge
