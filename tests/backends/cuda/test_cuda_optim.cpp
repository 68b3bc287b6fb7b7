// The CUDA optimizer kernels against the CPU backend: multi-tensor AdamW and SGD over many
// parameters of mixed sizes and dtypes (f32, bf16 and f16 with f32 masters, f64), with a
// learning rate that changes every step, non-contiguous parameters and lists longer than
// one launch; the gradient norm and clipping (tensor and double forms, non-contiguous
// gradients, lists longer than one launch); the non-finite guard; skipped steps on the
// device (parameters, moments and step counts unchanged, the first step of a momentum
// buffer included); and the loss scaler.
//
// Both backends run the same element code (backends/optim_functors.h, Note [optimizer
// rounding]), so AdamW and SGD are expected to agree bit for bit; the checks allow what the
// task allows (f32 and the f32 state within 1e-6 relative per element, 16-bit parameters
// within one unit in the last place, f64 within 1e-12) and print how many elements differ
// at all. Gradient norms are sums in a different order on the two backends: the f32 norms
// agree to one rounding, so clipped gradients agree to one unit in the last place.
//
// Without a GPU every test reports SKIPPED (never passed): CTest's label is `cuda`.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "forge/core/env.h"
#include "forge/forge.h"
#include "forge/optim/loss_scale.h"
#include "backends/cuda/cuda_testing.h"

namespace forge {
namespace {

using namespace cuda_testing;
using optim::AdamW;
using optim::AdamWOptions;
using optim::LossScaler;
using optim::ParamGroup;
using optim::SGD;
using optim::SGDOptions;

constexpr double kInf = std::numeric_limits<double>::infinity();
const Device kCpu = Device::cpu();

// ---- comparisons ---------------------------------------------------------------------------

// A 16-bit value's bits as a signed integer that counts representable values in order.
int ordered16(uint16_t b) { return (b & 0x8000u) ? -static_cast<int>(b & 0x7fffu) : static_cast<int>(b); }

std::vector<int> ordered_bits(const Tensor& t) {
  std::vector<int> out;
  if (t.dtype() == DType::bf16) {
    for (bf16 x : t.to_vector<bf16>()) out.push_back(ordered16(x.bits));
  } else {
    for (f16 x : t.to_vector<f16>()) out.push_back(ordered16(x.bits));
  }
  return out;
}

// Element by element, `got` (any device) against the CPU reference `ref`: 16-bit within
// one unit in the last place, f32 within 1e-6 relative, f64 within 1e-12 relative.
void expect_matches(const Tensor& got, const Tensor& ref, const std::string& what) {
  ASSERT_TRUE(got.defined() && ref.defined()) << what;
  ASSERT_EQ(got.shape(), ref.shape()) << what;
  ASSERT_EQ(got.dtype(), ref.dtype()) << what;
  const std::vector<double> g = got.to_vector<double>(), r = ref.to_vector<double>();
  const bool half = ref.dtype() == DType::bf16 || ref.dtype() == DType::f16;
  const std::vector<int> gb = half ? ordered_bits(got.to(kCpu)) : std::vector<int>();
  const std::vector<int> rb = half ? ordered_bits(ref) : std::vector<int>();
  const double rtol = ref.dtype() == DType::f64 ? 1e-12 : 1e-6;
  size_t differ = 0, bad = 0, first_bad = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    differ += g[i] != r[i];
    const bool ok = half ? std::abs(gb[i] - rb[i]) <= 1 : std::abs(g[i] - r[i]) <= rtol * std::abs(r[i]) + 1e-37;
    if (!ok && bad++ == 0) first_bad = i;
  }
  EXPECT_EQ(bad, 0u) << what << " (" << dtype_name(ref.dtype()) << "): " << bad << " of " << r.size()
                     << " elements out of tolerance, first at " << first_bad << ": "
                     << (bad ? g[first_bad] : 0.0) << " vs " << (bad ? r[first_bad] : 0.0);
  if (differ > 0)
    std::cout << "[   info   ] " << what << ": " << differ << " of " << r.size() << " elements not bit-identical\n";
}

// ---- inputs --------------------------------------------------------------------------------

// The same leaf parameter on both devices (random values of `dtype`).
struct Twin {
  std::vector<Tensor> cpu, gpu;
  void add(const Shape& shape, DType dtype, uint64_t seed) {
    const Tensor h = host_input(shape, Domain::real, dtype, seed);
    Tensor c = h.clone(), g = h.to(kGpu);
    c.requires_grad_(true);
    g.requires_grad_(true);
    cpu.push_back(c);
    gpu.push_back(g);
  }
  // A transposed (non-contiguous) view of a fresh (rows, cols) f32 tensor, as a leaf.
  void add_transposed(int64_t rows, int64_t cols, uint64_t seed) {
    const Tensor h = host_input({rows, cols}, Domain::real, DType::f32, seed);
    Tensor c = h.clone().t(), g = h.to(kGpu).t();
    c.requires_grad_(true);
    g.requires_grad_(true);
    cpu.push_back(c);
    gpu.push_back(g);
  }
  // The same fresh random gradient for every parameter (scaled by `scale`).
  void set_grads(uint64_t seed, double scale = 1.0) {
    for (size_t i = 0; i < cpu.size(); ++i) {
      Tensor h = host_input(cpu[i].shape(), Domain::real, DType::f32, seed * 1000 + i);
      if (scale != 1.0) h = h * scale;
      h = h.to(cpu[i].dtype());
      cpu[i].set_grad(h);
      gpu[i].set_grad(h.to(kGpu));
    }
  }
  size_t size() const { return cpu.size(); }
};

std::vector<ParamGroup> two_groups(const std::vector<Tensor>& v, size_t split, double wd0) {
  return {{.params = std::vector<Tensor>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(split)), .weight_decay = wd0},
          {.params = std::vector<Tensor>(v.begin() + static_cast<std::ptrdiff_t>(split), v.end()), .weight_decay = 0.0}};
}

// Parameters, state tensors and (folded) step counts of two optimizers over twin parameters.
void expect_same_state(const optim::Optimizer& gpu, const optim::Optimizer& cpu, const Twin& t, const std::string& what) {
  for (size_t i = 0; i < t.size(); ++i) {
    const std::string w = what + " parameter " + std::to_string(i) + " " + shape_str(t.cpu[i].shape());
    expect_matches(t.gpu[i], t.cpu[i], w);
    const optim::ParamState* sg = gpu.state(t.gpu[i]);
    const optim::ParamState* sc = cpu.state(t.cpu[i]);
    ASSERT_EQ(sg == nullptr, sc == nullptr) << w;
    if (!sc) continue;
    EXPECT_EQ(sg->step, sc->step) << w;
    ASSERT_EQ(sg->tensors.size(), sc->tensors.size()) << w;
    for (const auto& [name, ref] : sc->tensors) {
      ASSERT_TRUE(sg->tensors.count(name)) << w << " " << name;
      EXPECT_TRUE(sg->tensors.at(name).is_cuda()) << w << " " << name;
      expect_matches(sg->tensors.at(name), ref, w + " " + name);
    }
  }
}

const std::vector<Shape> kShapes = {{1},     {7},   {4099}, {1 << 20}, {3, 5}, {64},   {127},  {1000}, {16384}, {16385},
                                    {32773}, {2},   {5},    {300},     {64, 64}, {511}, {8},   {9},    {33},    {65537}};

// ---- AdamW ---------------------------------------------------------------------------------

TEST(CudaAdamW, MultiTensorStepMatchesTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16};
  Twin t;
  for (size_t i = 0; i < kShapes.size(); ++i) t.add(kShapes[i], dtypes[i % 3], 100 + i);
  t.add_transposed(37, 129, 99);  // strided: updated in a contiguous copy, written back
  const AdamWOptions o{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
  AdamW oc(two_groups(t.cpu, 12, 0.1), o), og(two_groups(t.gpu, 12, 0.1), o);
  for (int s = 0; s < 5; ++s) {
    t.set_grads(10 + static_cast<uint64_t>(s));
    for (optim::Optimizer* opt : {static_cast<optim::Optimizer*>(&oc), static_cast<optim::Optimizer*>(&og)}) {
      opt->param_groups()[0].lr = 1e-3 * (1.0 + s);  // a schedule: a new lr every step
      opt->param_groups()[1].lr = 3e-4 / (1.0 + s);
    }
    oc.step();
    og.step();
  }
  EXPECT_FALSE(t.gpu.back().is_contiguous());
  expect_same_state(og, oc, t, "AdamW");
  // The state_dict layout is the CPU's: same keys and scalars.
  const optim::StateDict sc = oc.state_dict(), sg = og.state_dict();
  EXPECT_EQ(sg.scalars, sc.scalars);
  ASSERT_EQ(sg.tensors.size(), sc.tensors.size());
  for (const auto& [k, v] : sc.tensors) EXPECT_TRUE(sg.tensors.count(k)) << k;
}

TEST(CudaAdamW, ManyTensorsTakeSeveralLaunchesAndF64Works) {
  FORGE_SKIP_WITHOUT_GPU();
  Twin t;
  for (int i = 0; i < 130; ++i) t.add({(i * 37) % 3001 + 1}, i % 2 ? DType::bf16 : DType::f32, 500 + i);
  for (int i = 0; i < 3; ++i) t.add({(i + 1) * 1000 + 3}, DType::f64, 700 + i);
  AdamW oc(t.cpu, {.lr = 2e-3, .weight_decay = 0.05}), og(t.gpu, {.lr = 2e-3, .weight_decay = 0.05});
  for (int s = 0; s < 3; ++s) {
    t.set_grads(40 + static_cast<uint64_t>(s));
    oc.step();
    og.step();
  }
  expect_same_state(og, oc, t, "AdamW, 133 tensors");
}

// The parameters after five clipped AdamW steps with the switch `name` set to `value`: bf16
// parameters with their f32 masters (the mixed-precision path), f32 and f16, sizes that leave
// every kind of tail in a chunk, two of several chunks, several launches' worth.
std::vector<Tensor> adamw_under(const char* name, const char* value) {
  env::Override o(name, value);
  std::vector<Tensor> ps;
  for (int i = 0; i < 60; ++i) {
    const DType dt = i % 3 == 0 ? DType::f32 : (i % 3 == 1 ? DType::bf16 : DType::f16);
    Tensor p = host_input({(i * 53) % 4099 + 17}, Domain::real, dt, 900 + static_cast<uint64_t>(i)).to(kGpu);
    p.requires_grad_(true);
    ps.push_back(p);
  }
  // Two of several chunks (16384 elements a block), where a thread runs several pairs.
  for (const DType dt : {DType::bf16, DType::f16}) {
    Tensor p = host_input({2 * 16384 + 777}, Domain::real, dt, 990 + ps.size()).to(kGpu);
    p.requires_grad_(true);
    ps.push_back(p);
  }
  AdamW opt(ps, {.lr = 1e-3, .weight_decay = 0.1});
  for (int s = 0; s < 5; ++s) {
    for (size_t i = 0; i < ps.size(); ++i)
      ps[i].set_grad(
          host_input(ps[i].shape(), Domain::real, ps[i].dtype(), 5000 + 100 * static_cast<uint64_t>(s) + i).to(kGpu));
    optim::clip_grad_norm_(ps, 1.0);
    opt.step();
  }
  return ps;
}

void expect_same_parameters(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    expect_equal(got[i], want[i], what + ": parameter " + std::to_string(i) + " " + dtype_name(want[i].dtype()));
}

// Note [AdamW register cap] (FORGE_ADAMW_REGISTER_CAP=1): the capped kernel writes the same bits
// as the default one.
TEST(CudaAdamW, RegisterCapChangesNoBit) {
  FORGE_SKIP_WITHOUT_GPU();
  expect_same_parameters(adamw_under("FORGE_ADAMW_REGISTER_CAP", "1"), adamw_under("FORGE_ADAMW_REGISTER_CAP", "0"),
                         "register cap");
}

// Note [AdamW pairs] (FORGE_ADAMW_PAIRS=1): two vectors a thread, every element once, with the same
// operations: the same bits, including the elements left single and the unvectorized tails.
TEST(CudaAdamW, PairsChangeNoBit) {
  FORGE_SKIP_WITHOUT_GPU();
  expect_same_parameters(adamw_under("FORGE_ADAMW_PAIRS", "1"), adamw_under("FORGE_ADAMW_PAIRS", "0"), "pairs");
}

// ---- SGD -----------------------------------------------------------------------------------

TEST(CudaSGD, MultiTensorStepMatchesTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16, DType::f64};
  Twin t;
  for (size_t i = 0; i < kShapes.size(); ++i) t.add(kShapes[i], dtypes[i % 4], 200 + i);
  t.add_transposed(129, 37, 98);
  auto groups = [](const std::vector<Tensor>& v) {
    auto span = [&](size_t a, size_t b) {
      return std::vector<Tensor>(v.begin() + static_cast<std::ptrdiff_t>(a), v.begin() + static_cast<std::ptrdiff_t>(b));
    };
    return std::vector<ParamGroup>{
        {.params = span(0, 8)},  // the options: momentum 0.9 with dampening 0.1, L2 0.01
        {.params = span(8, 15), .weight_decay = 0.0, .momentum = 0.8, .dampening = 0.0, .nesterov = true},
        {.params = span(15, v.size()), .weight_decay = 0.05, .momentum = 0.0}};
  };
  const SGDOptions o{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01};
  SGD oc(groups(t.cpu), o), og(groups(t.gpu), o);
  for (int s = 0; s < 5; ++s) {
    t.set_grads(20 + static_cast<uint64_t>(s));
    for (optim::Optimizer* opt : {static_cast<optim::Optimizer*>(&oc), static_cast<optim::Optimizer*>(&og)})
      for (ParamGroup& g : opt->param_groups()) g.lr = 0.05 / (1.0 + s);
    oc.step();
    og.step();
  }
  expect_same_state(og, oc, t, "SGD");
}

// ---- skipped steps on the device -------------------------------------------------------------

// Steps both optimizers with the flag sequence: the GPU one reads a device flag, the CPU one
// a host flag (the reference semantics: a flagged step does nothing).
void run_flagged(optim::Optimizer& oc, optim::Optimizer& og, Twin& t, const std::vector<double>& flags, uint64_t seed,
                 bool fold_after_first = false) {
  for (size_t s = 0; s < flags.size(); ++s) {
    t.set_grads(seed + s);
    std::vector<Tensor> before;
    for (const Tensor& p : t.gpu) before.push_back(p.to(kCpu));
    og.step(scalar_tensor(flags[s], {.device = kGpu}));
    oc.step(scalar_tensor(flags[s]));
    if (flags[s] != 0) {
      for (size_t i = 0; i < t.size(); ++i) expect_equal(t.gpu[i].to(kCpu), before[i], "skipped step, parameter " + std::to_string(i));
    }
    if (s == 0 && fold_after_first) {
      // state() folds the device's skip counts: a parameter whose every update was skipped has no state.
      for (size_t i = 0; i < t.size(); ++i)
        EXPECT_EQ(og.state(t.gpu[i]) == nullptr, oc.state(t.cpu[i]) == nullptr) << "parameter " << i;
    }
  }
  EXPECT_EQ(og.step_count(), oc.step_count());
}

TEST(CudaOptimSkip, AdamWDeviceFlagChangesNothingAndStepsDoNotAdvance) {
  FORGE_SKIP_WITHOUT_GPU();
  Twin t;
  t.add({4099}, DType::f32, 1);
  t.add({1000}, DType::bf16, 2);
  t.add({7}, DType::f16, 3);
  t.add({(1 << 16) + 3}, DType::f32, 4);
  const AdamWOptions o{.lr = 1e-2, .weight_decay = 0.1};
  {
    // The first step skipped, folded at once (state() -> no state), then a skip left unfolded
    // until the end: the kernels compute t from the device's counts.
    AdamW oc(t.cpu, o), og(t.gpu, o);
    run_flagged(oc, og, t, {1, 0, 0, 1, 0, 1, 0}, 60, /*fold_after_first=*/true);
    expect_same_state(og, oc, t, "AdamW with skips");
    EXPECT_EQ(og.state(t.gpu[0])->step, 4);
    const optim::StateDict sg = og.state_dict(), sc = oc.state_dict();
    EXPECT_EQ(sg.scalars, sc.scalars);  // "state.<k>.step" counts applied updates only
  }
  {
    // Never folded in between: first step skipped, the counts only read by the kernels.
    Twin u;
    u.add({333}, DType::bf16, 5);
    u.add({17}, DType::f32, 6);
    AdamW oc(u.cpu, o), og(u.gpu, o);
    run_flagged(oc, og, u, {1, 1, 0, 0, 1, 0}, 80);
    expect_same_state(og, oc, u, "AdamW, skips folded at the end");
  }
}

TEST(CudaOptimSkip, SGDMomentumBufferStartsAtTheFirstAppliedStep) {
  FORGE_SKIP_WITHOUT_GPU();
  const SGDOptions o{.lr = 0.1, .momentum = 0.9, .dampening = 0.3, .weight_decay = 0.01};
  {
    Twin t;
    t.add({4099}, DType::f32, 7);
    t.add({100}, DType::bf16, 8);
    SGD oc(t.cpu, o), og(t.gpu, o);
    // The buffer is made at the skipped first step; the next applied step must start it from d.
    run_flagged(oc, og, t, {1, 0, 1, 0, 0}, 90);
    expect_same_state(og, oc, t, "SGD with skips");
  }
  {
    // Momentum switched on after a skipped step: the buffer is made for parameters with
    // unfolded skips (the optimizer folds them first, one sync).
    Twin t;
    t.add({513}, DType::f32, 9);
    SGD oc(t.cpu, {.lr = 0.1, .momentum = 0.0}), og(t.gpu, {.lr = 0.1, .momentum = 0.0});
    run_flagged(oc, og, t, {0, 1}, 95);
    for (optim::Optimizer* opt : {static_cast<optim::Optimizer*>(&oc), static_cast<optim::Optimizer*>(&og)})
      opt->param_groups()[0].momentum = 0.9;
    run_flagged(oc, og, t, {0, 1, 0}, 97);
    expect_same_state(og, oc, t, "SGD, momentum switched on");
  }
}

TEST(CudaOptimSkip, GuardOnTheGradientNormWithoutSync) {
  FORGE_SKIP_WITHOUT_GPU();
  Twin t;
  t.add({4099}, DType::bf16, 11);
  t.add({300}, DType::f32, 12);
  AdamW og(t.gpu, {.lr = 1e-2});
  for (double bad : {kInf, std::numeric_limits<double>::quiet_NaN()}) {
    t.set_grads(70);
    Tensor g1 = t.gpu[1].grad().to(kCpu);
    g1.narrow(0, 5, 1).fill_(bad);
    t.gpu[1].set_grad(g1.to(kGpu));
    const Tensor g0 = t.gpu[0].grad().to(kCpu);
    std::vector<Tensor> before;
    for (const Tensor& p : t.gpu) before.push_back(p.to(kCpu));
    const Tensor norm = optim::clip_grad_norm_(t.gpu, 1.0);
    const Tensor found = optim::found_non_finite(norm);
    EXPECT_TRUE(norm.is_cuda() && found.is_cuda());
    og.step(found);
    EXPECT_EQ(found.item<double>(), 1.0);
    EXPECT_FALSE(std::isfinite(norm.item<double>()));
    expect_equal(t.gpu[0].grad().to(kCpu), g0, "a non-finite norm clips nothing");
    for (size_t i = 0; i < t.size(); ++i) expect_equal(t.gpu[i].to(kCpu), before[i], "guarded step");
  }
  EXPECT_EQ(og.state(t.gpu[0]), nullptr);
  t.set_grads(71);
  og.step(optim::found_non_finite(t.gpu));
  EXPECT_EQ(og.state(t.gpu[0])->step, 1);
}

TEST(CudaOptimSkip, CpuParametersWithADeviceFlagReadItOnTheHost) {
  FORGE_SKIP_WITHOUT_GPU();
  Twin t;
  t.add({10}, DType::f32, 13);
  std::vector<Tensor> mixed{t.cpu[0], t.gpu[0]};
  AdamW opt(mixed, {.lr = 0.1});
  t.set_grads(3);
  opt.step(scalar_tensor(1.0, {.device = kGpu}));
  EXPECT_EQ(opt.state(t.cpu[0]), nullptr);
  EXPECT_EQ(opt.state(t.gpu[0]), nullptr);
  opt.step(scalar_tensor(0.0, {.device = kGpu}));
  EXPECT_EQ(opt.state(t.cpu[0])->step, 1);
  expect_matches(t.gpu[0], t.cpu[0], "the same update on both devices");
}

// ---- gradient norm and clipping --------------------------------------------------------------

TEST(CudaClipGradNorm, NormAndClippingMatchTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16};
  Twin t;
  for (int i = 0; i < 170; ++i) t.add({(i * 53) % 2000 + 1}, dtypes[i % 3], 300 + i);  // > one launch
  t.add({(1 << 20) + 3}, DType::f32, 299);
  t.add({64, 33}, DType::f32, 298);
  t.set_grads(5);
  // A strided gradient: read through a contiguous copy, written back through the view.
  {
    const Tensor h = host_input({33, 64}, Domain::real, DType::f32, 297);
    t.cpu.back().set_grad(h.t());
    t.gpu.back().set_grad(h.to(kGpu).t());
  }
  const Tensor nc = optim::total_grad_norm(t.cpu), ng = optim::total_grad_norm(t.gpu);
  EXPECT_TRUE(ng.is_cuda());
  EXPECT_EQ(ng.dim(), 0);
  EXPECT_NEAR(ng.item<double>(), nc.item<double>(), 2.4e-7 * nc.item<double>());  // one f32 rounding apart
  EXPECT_NEAR(optim::grad_norm(t.gpu), optim::grad_norm(t.cpu), 2.4e-7 * nc.item<double>());
  // Above the norm: untouched.
  optim::clip_grad_norm_(t.gpu, 10 * nc.item<double>());
  for (size_t i = 0; i < t.size(); ++i) expect_equal(t.gpu[i].grad().to(kCpu), t.cpu[i].grad(), "no clipping");
  // Below it: every gradient scaled by max_norm / (norm + 1e-6).
  const double max_norm = nc.item<double>() / 3;
  const Tensor before = optim::clip_grad_norm_(t.cpu, max_norm);
  const double got = optim::clip_grad_norm(t.gpu, max_norm);  // the double form: one sync
  EXPECT_NEAR(got, before.item<double>(), 2.4e-7 * before.item<double>());
  for (size_t i = 0; i < t.size(); ++i)
    expect_matches(t.gpu[i].grad(), t.cpu[i].grad(), "clipped gradient " + std::to_string(i));
  EXPECT_FALSE(t.gpu.back().grad().is_contiguous());
  // (the 16-bit gradients were rounded after scaling: the new norm is max_norm to ~1e-5)
  EXPECT_NEAR(optim::total_grad_norm(t.gpu).item<double>(), max_norm, 1e-4 * max_norm);
  // Deterministic: the same list gives the same bits.
  EXPECT_EQ(optim::total_grad_norm(t.gpu).item<double>(), optim::total_grad_norm(t.gpu).item<double>());
}

TEST(CudaClipGradNorm, NonFiniteFlagIsExact) {
  FORGE_SKIP_WITHOUT_GPU();
  Tensor a = full({1000}, 1e30, {.device = kGpu}), b = ones({5}, {.dtype = DType::f16, .device = kGpu});
  a.requires_grad_(true);
  b.requires_grad_(true);
  a.set_grad(full({1000}, 1e30, {.device = kGpu}));  // squares of 1e60: no overflow in double
  b.set_grad(full({5}, 65504.0, {.dtype = DType::f16, .device = kGpu}));
  const Tensor norm = optim::total_grad_norm({a, b});
  EXPECT_NEAR(norm.item<double>(), std::sqrt(1000.0) * 1e30, 1e-6 * std::sqrt(1000.0) * 1e30);
  EXPECT_EQ(optim::found_non_finite(norm).item<double>(), 0.0);
  b.set_grad(full({5}, kInf, {.dtype = DType::f16, .device = kGpu}));
  EXPECT_EQ(optim::found_non_finite({a, b}).item<double>(), 1.0);
  Tensor g = zeros({1000}, {.device = kGpu});
  g.narrow(0, 999, 1).fill_(std::numeric_limits<double>::quiet_NaN());
  a.set_grad(g);
  b.set_grad(ones({5}, {.dtype = DType::f16, .device = kGpu}));
  EXPECT_EQ(optim::found_non_finite({a, b}).item<double>(), 1.0);
  EXPECT_EQ(optim::found_non_finite(scalar_tensor(3.0, {.device = kGpu})).item<double>(), 0.0);
}

// ---- loss scaling ----------------------------------------------------------------------------

TEST(CudaLossScaler, MatchesTheCpuScaler) {
  FORGE_SKIP_WITHOUT_GPU();
  Twin t;
  t.add({7}, DType::f16, 21);
  t.add({4099}, DType::f16, 22);
  t.add({1 << 16}, DType::f16, 23);
  t.add({1000}, DType::f32, 24);
  AdamW oc(t.cpu, {.lr = 1e-3}), og(t.gpu, {.lr = 1e-3});
  const optim::LossScalerOptions so{.init_scale = 1024.0, .growth_interval = 2};
  LossScaler sc(kCpu, so), sg(kGpu, so);
  for (int s = 0; s < 10; ++s) {
    // Gradients of the scaled loss: s * g, rounded to f16 (large scales overflow to inf: found).
    t.set_grads(30 + static_cast<uint64_t>(s), sc.scale());
    if (s == 3) {  // and one injected NaN
      Tensor h = t.cpu[3].grad().clone();
      h.narrow(0, 17, 1).fill_(std::numeric_limits<double>::quiet_NaN());
      t.cpu[3].set_grad(h);
      t.gpu[3].set_grad(h.to(kGpu));
    }
    const Tensor nc = sc.unscale_(t.cpu), ng = sg.unscale_(t.gpu);
    EXPECT_TRUE(ng.is_cuda());
    EXPECT_EQ(sg.found_non_finite().item<double>(), sc.found_non_finite().item<double>()) << "step " << s;
    if (std::isfinite(nc.item<double>())) {
      EXPECT_NEAR(ng.item<double>(), nc.item<double>(), 2.4e-7 * nc.item<double>());
    }
    if (s != 3) {  // (NaN != NaN)
      for (size_t i = 0; i < t.size(); ++i) expect_equal(t.gpu[i].grad().to(kCpu), t.cpu[i].grad(), "unscaled gradient");
    }
    sc.step(oc);
    sg.step(og);
    sc.update();
    sg.update();
    EXPECT_EQ(sg.scale(), sc.scale()) << "step " << s;
    EXPECT_EQ(sg.growth_tracker(), sc.growth_tracker()) << "step " << s;
  }
  EXPECT_NE(sc.scale(), 1024.0);
  expect_same_state(og, oc, t, "AdamW under the loss scaler");
  EXPECT_EQ(sg.state_dict().scalars, sc.state_dict().scalars);
}

TEST(CudaLossScaler, ScaleLossAndLazyDevice) {
  FORGE_SKIP_WITHOUT_GPU();
  LossScaler s;  // bound to the device of the first loss
  const Tensor loss = scalar_tensor(3.0, {.device = kGpu});
  const Tensor scaled = s.scale_loss(loss);
  EXPECT_TRUE(scaled.is_cuda());
  EXPECT_EQ(scaled.item<double>(), 3.0 * 65536.0);
  EXPECT_EQ(s.device(), kGpu);
  EXPECT_TRUE(s.scale_tensor().is_cuda());
  EXPECT_THROW(s.scale_loss(scalar_tensor(1.0)), Error);  // now bound: a CPU loss is an error
}

}  // namespace
}  // namespace forge
