// forge::optim::LossScaler on the CPU against torch.amp.GradScaler's documented rule:
// scale_loss multiplies the gradients by s, unscale_ divides them again (and flags inf/NaN
// in the same pass), a flagged step changes no parameter, state or step count and halves
// s, growth_interval clean steps in a row double it (never past f32's range), and the
// state survives state_dict / load_state_dict. The CUDA scaler is checked against this one
// by tests/backends/cuda/test_cuda_optim.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "forge/forge.h"
#include "forge/optim/loss_scale.h"
#include "optim_testing.h"
#include "testing/tensor_testing.h"

namespace forge {
namespace {

using optim_testing::param;
using optim_testing::set_grad;

using forge::testing::error_of;
using forge::testing::vals;
using optim::AdamW;
using optim::LossScaler;
using optim::LossScalerOptions;
using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// torch._amp_update_scale_, transcribed.
struct ScalerRef {
  float scale = 65536.0f;
  int32_t tracker = 0;
  double growth = 2.0, backoff = 0.5;
  int32_t interval = 2000;
  void update(bool found) {
    if (found) {
      scale = static_cast<float>(static_cast<double>(scale) * backoff);
      tracker = 0;
    } else if (tracker + 1 == interval) {
      const float grown = static_cast<float>(static_cast<double>(scale) * growth);
      if (std::isfinite(grown)) scale = grown;
      tracker = 0;
    } else {
      ++tracker;
    }
  }
};

TEST(LossScaler, ScaleLossAndUnscaleRoundTripTheGradients) {
  Tensor p = param({1.0, -2.0, 0.5}, DType::f32);
  LossScaler scaler;  // the device is chosen at the first use
  const Tensor loss = (p * p).sum();
  const Tensor scaled = scaler.scale_loss(loss);
  EXPECT_EQ(scaled.item<double>(), 65536.0 * loss.item<double>());
  scaled.backward();
  EXPECT_EQ(vals(p.grad()), (std::vector<double>{2.0 * 65536, -4.0 * 65536, 1.0 * 65536}));
  const Tensor norm = scaler.unscale_({p});
  EXPECT_EQ(vals(p.grad()), (std::vector<double>{2.0, -4.0, 1.0}));
  EXPECT_EQ(norm.item<double>(), static_cast<double>(static_cast<float>(std::sqrt(21.0))));
  EXPECT_EQ(scaler.found_non_finite().item<double>(), 0.0);
  EXPECT_TRUE(scaler.device().is_cpu());
}

TEST(LossScaler, InfSkipsTheStepAndBacksOffThenCleanStepsApply) {
  Tensor p = param({1.0, 2.0}, DType::f16), q = param({0.5}, DType::f32);
  AdamW opt({p, q}, {.lr = 0.01});
  LossScaler scaler(Device::cpu(), {.growth_interval = 3});
  // Step 1: an overflow in q's gradient. Nothing moves, nothing is counted, s halves.
  set_grad(p, {2048.0, -2048.0});
  set_grad(q, {kInf});
  const Tensor norm = scaler.unscale_({p, q});
  EXPECT_EQ(norm.item<double>(), kInf);
  EXPECT_EQ(scaler.found_non_finite().item<double>(), 1.0);
  scaler.step(opt);
  EXPECT_EQ(vals(p), (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(vals(q), std::vector<double>{0.5});
  EXPECT_EQ(opt.state(p), nullptr);
  EXPECT_EQ(opt.state(q), nullptr);
  scaler.update();
  EXPECT_EQ(scaler.scale(), 32768.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  // Steps 2-4: clean. The third clean step in a row doubles s back.
  for (int s = 0; s < 3; ++s) {
    set_grad(p, {32768.0, -32768.0});
    set_grad(q, {16384.0});
    scaler.step(opt);  // unscales by itself
    EXPECT_EQ(vals(p.grad()), (std::vector<double>{1.0, -1.0}));
    scaler.update();
    EXPECT_EQ(scaler.growth_tracker(), s < 2 ? s + 1 : 0);
    EXPECT_EQ(scaler.scale(), s < 2 ? 32768.0 : 65536.0);
  }
  EXPECT_EQ(opt.state(p)->step, 3);
  EXPECT_EQ(opt.state(q)->step, 3);
  EXPECT_EQ(opt.step_count(), 4);  // the skipped call counts here, not in the parameters' steps
  EXPECT_NE(vals(q), std::vector<double>{0.5});
}

TEST(LossScaler, SkippedStepLeavesTheOptimizerAsIfItNeverRan) {
  // Two optimizers: one sees a NaN step in the middle through the scaler, the other does not see it.
  Tensor a = param({1.0, -1.0, 0.25}, DType::bf16), b = param({1.0, -1.0, 0.25}, DType::bf16);
  AdamW oa({a}, {.lr = 0.03, .weight_decay = 0.1}), ob({b}, {.lr = 0.03, .weight_decay = 0.1});
  LossScaler scaler(Device::cpu(), {.init_scale = 4.0});
  const std::vector<std::vector<double>> grads{{0.5, 1.0, -2.0}, {kNaN, 1.0, 1.0}, {0.25, -0.5, 1.5}, {1.0, 1.0, -1.0}};
  for (size_t s = 0; s < grads.size(); ++s) {
    std::vector<double> scaled = grads[s];
    for (double& x : scaled) x *= scaler.scale();
    set_grad(a, scaled);
    scaler.step(oa);
    scaler.update();
    if (s != 1) {
      set_grad(b, grads[s]);
      ob.step();
    }
  }
  EXPECT_EQ(vals(a), vals(b));
  EXPECT_EQ(oa.state(a)->step, 3);
  for (const auto& [name, t] : ob.state(b)->tensors) EXPECT_EQ(vals(oa.state(a)->tensors.at(name)), vals(t)) << name;
  EXPECT_EQ(scaler.scale(), 2.0);  // one backoff, no growth yet
}

TEST(LossScaler, FollowsTorchsRuleOverALongSequence) {
  LossScaler scaler(Device::cpu(), {.init_scale = 1024.0, .growth_factor = 4.0, .backoff_factor = 0.25, .growth_interval = 5});
  ScalerRef ref{.scale = 1024.0f, .growth = 4.0, .backoff = 0.25, .interval = 5};
  Tensor p = param({0.0}, DType::f32);
  uint32_t lcg = 12345;
  for (int s = 0; s < 200; ++s) {
    lcg = lcg * 1664525u + 1013904223u;
    const bool found = (lcg >> 24) % 7 == 0;
    set_grad(p, {found ? kInf : 1.0});
    scaler.unscale_({p});
    scaler.update();
    ref.update(found);
    ASSERT_EQ(scaler.scale(), static_cast<double>(ref.scale)) << "step " << s;
    ASSERT_EQ(scaler.growth_tracker(), ref.tracker) << "step " << s;
  }
}

TEST(LossScaler, NeverGrowsPastF32) {
  LossScaler scaler(Device::cpu(), {.init_scale = std::ldexp(1.0, 127), .growth_interval = 1});
  Tensor p = param({0.0}, DType::f32);
  for (int s = 0; s < 3; ++s) {
    set_grad(p, {1.0});
    scaler.unscale_({p});
    scaler.update();
    EXPECT_EQ(scaler.scale(), std::ldexp(1.0, 127));
    EXPECT_EQ(scaler.growth_tracker(), 0);
  }
}

TEST(LossScaler, HostVerdictsAddToTheDeviceFlag) {
  Tensor p = param({1.0}, DType::f32);
  AdamW opt({p}, {.lr = 0.1});
  LossScaler scaler(Device::cpu());
  set_grad(p, {65536.0});
  scaler.unscale_({p});
  scaler.step(opt, /*skip=*/true);  // e.g. the trainer read a non-finite loss
  EXPECT_EQ(vals(p), std::vector<double>{1.0});
  scaler.update(/*found_non_finite=*/true);
  EXPECT_EQ(scaler.scale(), 32768.0);
}

TEST(LossScaler, StateDictRoundTripAndChecks) {
  LossScaler a(Device::cpu(), {.growth_interval = 10});
  Tensor p = param({0.0}, DType::f32);
  for (double g : {1.0, kInf, 1.0, 1.0}) {
    set_grad(p, {g});
    a.unscale_({p});
    a.update();
  }
  const optim::StateDict sd = a.state_dict();
  EXPECT_EQ(sd.scalars.at("scale"), 32768.0);
  EXPECT_EQ(sd.scalars.at("growth_tracker"), 2.0);
  EXPECT_EQ(sd.scalars.at("growth_factor"), 2.0);
  EXPECT_EQ(sd.scalars.at("backoff_factor"), 0.5);
  EXPECT_EQ(sd.scalars.at("growth_interval"), 10.0);
  LossScaler b(Device::cpu());
  b.load_state_dict(sd);
  EXPECT_EQ(b.scale(), 32768.0);
  EXPECT_EQ(b.growth_tracker(), 2);
  EXPECT_EQ(b.options().growth_interval, 10);

  optim::StateDict bad = sd;
  bad.scalars["growth_tracker"] = 10.0;
  EXPECT_THAT(error_of([&] { b.load_state_dict(bad); }), HasSubstr("growth_tracker must be an integer in [0, growth_interval)"));
  bad = sd;
  bad.scalars["scale"] = 0.0;
  EXPECT_THAT(error_of([&] { b.load_state_dict(bad); }), HasSubstr("scale must be a positive finite f32"));
  bad = sd;
  bad.scalars.erase("scale");
  EXPECT_THAT(error_of([&] { b.load_state_dict(bad); }), HasSubstr("missing scalar 'scale'"));
  bad = sd;
  bad.scalars["_scale"] = 1.0;
  EXPECT_THAT(error_of([&] { b.load_state_dict(bad); }), HasSubstr("unknown scalar '_scale'"));
  EXPECT_EQ(b.scale(), 32768.0);  // failed loads changed nothing
}

TEST(LossScaler, MisuseAndBadOptionsAreErrors) {
  LossScaler s(Device::cpu());
  EXPECT_THAT(error_of([&] { s.update(); }), HasSubstr("LossScaler::update: no unscale_() or step()"));
  EXPECT_THAT(error_of([&] { LossScaler x(Device::cpu(), {.growth_factor = 1.0}); }), HasSubstr("growth_factor must be"));
  EXPECT_THAT(error_of([&] { LossScaler x(Device::cpu(), {.backoff_factor = 1.0}); }), HasSubstr("backoff_factor must be in (0, 1)"));
  EXPECT_THAT(error_of([&] { LossScaler x(Device::cpu(), {.growth_interval = 0}); }), HasSubstr("growth_interval must be"));
  EXPECT_THAT(error_of([&] { LossScaler x(Device::cpu(), {.init_scale = -1.0}); }), HasSubstr("init_scale must be"));
  EXPECT_THAT(error_of([&] { s.scale_loss(zeros({2})); }), HasSubstr("expected a one-element loss"));
}

}  // namespace
}  // namespace forge
