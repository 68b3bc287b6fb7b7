// Optimizer::clip_next_step on the CPU (Note [clipping inside the update], optim/optimizer.h):
// `opt.clip_next_step(max_norm, norm); opt.step()` must give exactly the parameters and state
// of `clip_grads_with_norm_(params, max_norm, norm); opt.step()`, for AdamW and SGD, f32, f64
// and bf16 parameters, whether the clip is active (norm > max_norm) or not (norm <= max_norm, a
// non-finite norm); the pending clip is consumed by the next step() (skipped or not); bad
// arguments throw naming the function. On the CPU the optimizer clips the gradients itself
// before the update (only AdamW on a GPU folds the clip into its kernel):
// tests/backends/cuda/test_cuda_fused_clip.cpp checks that path.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "forge/forge.h"
#include "optim_testing.h"
#include "testing/tensor_testing.h"

namespace forge {
namespace {

using optim_testing::param;

using forge::testing::error_of;
using forge::testing::vals;
using optim::AdamW;
using optim::ParamGroup;
using optim::SGD;
using ::testing::HasSubstr;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<double> wavy(size_t n, double phase, double scale = 1.0) {
  std::vector<double> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = scale * std::sin(1.3 * static_cast<double>(i) + phase) + 0.05 * phase;
  return g;
}

// Two identical sets of parameters of `dtype` (the last one never gets a gradient).
struct Twins {
  std::vector<Tensor> a, b;
  explicit Twins(DType dtype) {
    for (size_t i = 0; i < 4; ++i) {
      const auto v = wavy(5 + 7 * i, 0.3 * static_cast<double>(i), 2.0);
      a.push_back(param(v, dtype));
      b.push_back(param(v, dtype));
    }
  }
  void set_grads(double phase, double scale) {
    for (size_t i = 0; i + 1 < a.size(); ++i) {
      const auto g = wavy(static_cast<size_t>(a[i].numel()), phase + 0.1 * static_cast<double>(i), scale);
      a[i].set_grad(from_vector<double>(g, a[i].shape(), {.dtype = a[i].dtype()}));
      b[i].set_grad(from_vector<double>(g, b[i].shape(), {.dtype = b[i].dtype()}));
    }
  }
};

std::vector<ParamGroup> groups_of(const std::vector<Tensor>& p) {
  return {{.params = {p[0], p[1]}, .weight_decay = 0.1}, {.params = {p[2], p[3]}, .weight_decay = 0.0}};
}

// Parameters, state tensors and step counts of `oa` over t.a against `ob` over t.b: the same bits.
void expect_same(const optim::Optimizer& oa, const optim::Optimizer& ob, const Twins& t, const std::string& what) {
  EXPECT_EQ(oa.step_count(), ob.step_count()) << what;
  for (size_t i = 0; i < t.a.size(); ++i) {
    const std::string w = what + ", parameter " + std::to_string(i);
    EXPECT_EQ(vals(t.a[i]), vals(t.b[i])) << w;
    const optim::ParamState* sa = oa.state(t.a[i]);
    const optim::ParamState* sb = ob.state(t.b[i]);
    ASSERT_EQ(sa == nullptr, sb == nullptr) << w;
    if (!sa) continue;
    EXPECT_EQ(sa->step, sb->step) << w;
    ASSERT_EQ(sa->tensors.size(), sb->tensors.size()) << w;
    for (const auto& [name, ref] : sb->tensors) EXPECT_EQ(vals(sa->tensors.at(name)), vals(ref)) << w << " " << name;
  }
}

// Steps with the clip active (max_norm below the norm, max_norm = 0), inactive (max_norm at and
// above the norm) and a NaN norm, each fused on `a` and clip-then-step on `b`.
template <class Opt, class Options> void check_clip_next_step_matches_clip_then_step(const Options& options, DType dtype) {
  SCOPED_TRACE(dtype_name(dtype));
  Twins t(dtype);
  Opt a(groups_of(t.a), options), b(groups_of(t.b), options);
  const double factors[] = {0.5, 2.0, 1.0, 0.1, 0.0, kNaN, 0.7};
  for (size_t s = 0; s < std::size(factors); ++s) {
    const std::string what = "step " + std::to_string(s) + " (max_norm = norm * " + std::to_string(factors[s]) + ")";
    t.set_grads(1.0 + static_cast<double>(s), 1.0 + static_cast<double>(s));
    const Tensor norm_a = optim::total_grad_norm(t.a), norm_b = optim::total_grad_norm(t.b);
    const double norm = norm_a.item<double>();
    ASSERT_EQ(norm, norm_b.item<double>());
    // NaN: a NaN norm with max_norm 1 (never clips).
    const bool nan = std::isnan(factors[s]);
    const double max_norm = nan ? 1.0 : norm * factors[s];
    const Tensor na = nan ? scalar_tensor(kNaN) : norm_a, nb = nan ? scalar_tensor(kNaN) : norm_b;
    const std::vector<double> g_before = vals(t.b[0].grad());
    a.clip_next_step(max_norm, na);
    a.step();
    optim::clip_grads_with_norm_(t.b, max_norm, nb);
    b.step();
    const bool active = !nan && norm > max_norm;
    EXPECT_EQ(vals(t.b[0].grad()) != g_before, active) << what << ": the reference clips exactly when norm > max_norm";
    // On the CPU the optimizer clipped the gradients itself, as clip_grads_with_norm_ does.
    for (size_t i = 0; i + 1 < t.a.size(); ++i) EXPECT_EQ(vals(t.a[i].grad()), vals(t.b[i].grad())) << what;
    expect_same(a, b, t, what);
  }
}

TEST(ClipNextStep, AdamWMatchesClipThenStep) {
  for (DType d : {DType::f32, DType::f64, DType::bf16})
    check_clip_next_step_matches_clip_then_step<AdamW>(optim::AdamWOptions{.lr = 0.05, .weight_decay = 0.1}, d);
}

TEST(ClipNextStep, SGDMatchesClipThenStep) {
  for (DType d : {DType::f32, DType::f64, DType::bf16})
    check_clip_next_step_matches_clip_then_step<SGD>(optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true}, d);
}

// A pending clip is used by one step() only, also when that step is skipped.
template <class Opt, class Options> void check_consumed(const Options& options, DType dtype) {
  SCOPED_TRACE(dtype_name(dtype));
  Twins t(dtype);
  Opt a(groups_of(t.a), options), b(groups_of(t.b), options);
  // Step 1 clips; step 2 (no clip_next_step) must not.
  t.set_grads(1.0, 3.0);
  const Tensor n1 = optim::total_grad_norm(t.a);
  a.clip_next_step(0.25, n1);
  a.step();
  optim::clip_grads_with_norm_(t.b, 0.25, n1);
  b.step();
  t.set_grads(2.0, 3.0);
  a.step();
  b.step();
  expect_same(a, b, t, "the step after a clipped one");
  // A clip pending for a step skipped on the host clips nothing, and is gone afterwards.
  t.set_grads(3.0, 3.0);
  const std::vector<double> g = vals(t.a[1].grad());
  a.clip_next_step(0.25, optim::total_grad_norm(t.a));
  a.step(scalar_tensor(1.0));
  b.step(scalar_tensor(1.0));
  EXPECT_EQ(vals(t.a[1].grad()), g) << "a skipped step clips no gradient";
  a.step();
  b.step();
  expect_same(a, b, t, "a skipped step, then an unclipped one");
  // A later clip_next_step replaces an earlier one not yet used.
  t.set_grads(4.0, 3.0);
  const Tensor n4 = optim::total_grad_norm(t.a);
  a.clip_next_step(0.01, n4);
  a.clip_next_step(0.5, n4);
  a.step();
  optim::clip_grads_with_norm_(t.b, 0.5, n4);
  b.step();
  expect_same(a, b, t, "the second of two clip_next_step calls");
}

TEST(ClipNextStep, IsConsumedByTheNextStepSkippedOrNot) {
  for (DType d : {DType::f32, DType::f64}) {
    check_consumed<AdamW>(optim::AdamWOptions{.lr = 0.05, .weight_decay = 0.1}, d);
    check_consumed<SGD>(optim::SGDOptions{.lr = 0.1, .momentum = 0.9}, d);
  }
}

TEST(ClipNextStep, BadArgumentsThrowNamingTheFunction) {
  Tensor p = param({1.0, 2.0}, DType::f32);
  AdamW opt({p}, {.lr = 0.1});
  SGD sgd({param({1.0}, DType::f64)}, {.lr = 0.1});
  EXPECT_THAT(error_of([&] { opt.clip_next_step(-1.0, scalar_tensor(1.0)); }),
              HasSubstr("AdamW: clip_next_step: max_norm must be >= 0, got -1"));
  EXPECT_THAT(error_of([&] { opt.clip_next_step(kNaN, scalar_tensor(1.0)); }),
              HasSubstr("AdamW: clip_next_step: max_norm must be >= 0"));
  EXPECT_THAT(error_of([&] { opt.clip_next_step(1.0, zeros({2})); }),
              HasSubstr("AdamW: clip_next_step: the norm must be a one-element floating-point tensor"));
  EXPECT_THAT(error_of([&] { opt.clip_next_step(1.0, Tensor()); }),
              HasSubstr("clip_next_step: the norm must be a one-element floating-point tensor, got an undefined tensor"));
  EXPECT_THAT(error_of([&] { sgd.clip_next_step(1.0, scalar_tensor(3.0, {.dtype = DType::i32})); }),
              HasSubstr("SGD: clip_next_step: the norm must be a one-element floating-point tensor"));
  // A rejected call leaves nothing pending: the step is unclipped.
  p.set_grad(from_vector<double>({30.0, 40.0}, {2}, {.dtype = DType::f32}));
  Tensor q = param({1.0, 2.0}, DType::f32);
  AdamW ref({q}, {.lr = 0.1});
  q.set_grad(from_vector<double>({30.0, 40.0}, {2}, {.dtype = DType::f32}));
  opt.step();
  ref.step();
  EXPECT_EQ(vals(p), vals(q));
  EXPECT_EQ(vals(p.grad()), (std::vector<double>{30.0, 40.0}));
  // A one-element norm of any shape and floating dtype is fine (read as f32, as clip_grads_with_norm_ does).
  opt.clip_next_step(1.0, full({1, 1}, 50.0, {.dtype = DType::bf16}));
  opt.step();
  EXPECT_NEAR(vals(p.grad())[1], 40.0 / (50.0 + 1e-6), 1e-6);
}

}  // namespace
}  // namespace forge
