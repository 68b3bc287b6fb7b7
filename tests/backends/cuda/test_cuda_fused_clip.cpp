// Note [clipping inside the update] (optim/optimizer.h, backends/cuda/optim.h) on a GPU: AdamW
// given `clip_next_step(max_norm, norm)` applies the clip inside its update kernel, to each
// gradient value it loads. Against the same parameters updated by clip_grads_with_norm_ then
// step() (the clip kernel, then the AdamW kernel) it must give the same bits in the parameters,
// the f32 masters and both moments: bf16 (with f32 masters), f16, f32 and f64 parameters, more
// than 48 tensors of a dtype (two launches), sizes with a tail that is no multiple of the vector
// width, the clip active and not (max_norm = 0 included), a NaN norm whose flag skips the step,
// a device flag with earlier skips (t = attempts - skipped), and under CUDA-graph capture. The
// fused path must leave .grad as it was; SGD (which does not fuse) clips .grad first, as before.
//
// Without a GPU every test reports SKIPPED (never passed): CTest's label is `cuda`.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "backends/cuda/cuda_testing.h"
#include "forge/backends/cuda/graph.h"
#include "forge/backends/cuda/stream.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/forge.h"

namespace forge {
namespace {

using namespace cuda_testing;
using optim::AdamW;
using optim::ParamGroup;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The same parameters twice on the GPU: `fused` steps with clip_next_step, `ref` with
// clip_grads_with_norm_ then step. `grads` keeps the host gradient of the last set_grads.
struct Twins {
  std::vector<Tensor> fused, ref, grads;
  void add(const Shape& shape, DType dtype, uint64_t seed) {
    const Tensor h = host_input(shape, Domain::real, dtype, seed);
    Tensor a = h.to(kGpu), b = h.to(kGpu);
    a.requires_grad_(true);
    b.requires_grad_(true);
    fused.push_back(a);
    ref.push_back(b);
  }
  // Fresh random gradients, times `scale`; with `nan_at_0` the first element of the first is NaN.
  void set_grads(uint64_t seed, double scale, bool nan_at_0 = false) {
    grads.clear();
    for (size_t i = 0; i < fused.size(); ++i) {
      Tensor h = host_input(fused[i].shape(), Domain::real, DType::f32, seed * 1000 + i) * scale;
      if (nan_at_0 && i == 0) {
        std::vector<double> v = h.to_vector<double>();
        v[0] = kNaN;
        h = from_vector<double>(v, h.shape(), {.dtype = DType::f32});
      }
      h = h.to(fused[i].dtype());
      grads.push_back(h);
      fused[i].set_grad(h.to(kGpu));
      ref[i].set_grad(h.to(kGpu));
    }
  }
  size_t size() const { return fused.size(); }
};

// > 48 bf16 and > 48 f32 tensors (two launches each), a few f16 and f64, sizes with odd tails.
Twins make_twins() {
  const std::vector<Shape> shapes = {{1}, {7}, {4099}, {16385}, {3, 5}, {33}, {300}, {8}, {9}, {127}, {65537}, {1000}, {64, 9}};
  Twins t;
  uint64_t seed = 1;
  for (DType d : {DType::bf16, DType::f32})
    for (int k = 0; k < 52; ++k) t.add(shapes[static_cast<size_t>(k) % shapes.size()], d, seed++);
  for (DType d : {DType::f16, DType::f64})
    for (int k = 0; k < 3; ++k) t.add(shapes[static_cast<size_t>(k + 1) % shapes.size()], d, seed++);
  return t;
}

std::vector<ParamGroup> two_groups(const std::vector<Tensor>& v) {
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 3);
  return {{.params = std::vector<Tensor>(v.begin(), mid), .weight_decay = 0.1},
          {.params = std::vector<Tensor>(mid, v.end()), .weight_decay = 0.0}};
}

// Parameters, every state tensor (exp_avg, exp_avg_sq, master) and the folded step counts: equal bits.
void expect_same_bits(const optim::Optimizer& fused, const optim::Optimizer& ref, const Twins& t, const std::string& what) {
  EXPECT_EQ(fused.step_count(), ref.step_count()) << what;
  for (size_t i = 0; i < t.size(); ++i) {
    const std::string w = what + ", parameter " + std::to_string(i) + " " + shape_str(t.ref[i].shape()) + " " +
                          dtype_name(t.ref[i].dtype());
    expect_equal(t.fused[i].detach(), t.ref[i].detach(), w);
    const optim::ParamState* sf = fused.state(t.fused[i]);
    const optim::ParamState* sr = ref.state(t.ref[i]);
    ASSERT_EQ(sf == nullptr, sr == nullptr) << w;
    if (!sr) continue;
    EXPECT_EQ(sf->step, sr->step) << w;
    ASSERT_EQ(sf->tensors.size(), sr->tensors.size()) << w;
    for (const auto& [name, r] : sr->tensors) {
      ASSERT_TRUE(sf->tensors.count(name)) << w << " " << name;
      expect_equal(sf->tensors.at(name), r, w + " " + name);
    }
  }
}

void expect_grads_untouched(const Twins& t, const std::string& what) {
  for (size_t i = 0; i < t.size(); ++i)
    expect_equal(t.fused[i].grad().to(Device::cpu()), t.grads[i], what + ": .grad of parameter " + std::to_string(i));
}

// One step of each: `fused` by clip_next_step + step, `ref` by clip_grads_with_norm_ + step;
// the norms from total_grad_norm of each side's (identical) gradients, on the device.
void step_both(AdamW& fused, AdamW& ref, Twins& t, double max_norm, const Tensor& skip_fused = {},
               const Tensor& skip_ref = {}) {
  const Tensor nf = optim::total_grad_norm(t.fused), nr = optim::total_grad_norm(t.ref);
  ASSERT_TRUE(nf.is_cuda());
  fused.clip_next_step(max_norm, nf);
  if (skip_fused.defined()) fused.step(skip_fused);
  else fused.step();
  optim::clip_grads_with_norm_(t.ref, max_norm, nr);
  if (skip_ref.defined()) ref.step(skip_ref);
  else ref.step();
}

TEST(CudaFusedClip, AdamWClipInTheUpdateMatchesClipThenStepBitForBit) {
  FORGE_SKIP_WITHOUT_GPU();
  Twins t = make_twins();
  AdamW fused(two_groups(t.fused), {.lr = 1e-2, .beta2 = 0.95, .weight_decay = 0.1});
  AdamW ref(two_groups(t.ref), {.lr = 1e-2, .beta2 = 0.95, .weight_decay = 0.1});
  // max_norm as a share of the norm: clipped, not clipped, at the norm (not clipped), max_norm 0.
  const double shares[] = {0.5, 3.0, 1.0, 0.0, 0.05};
  for (size_t s = 0; s < std::size(shares); ++s) {
    const std::string what = "step " + std::to_string(s + 1) + " (max_norm = " + std::to_string(shares[s]) + " norm)";
    t.set_grads(s + 1, 1.0 + static_cast<double>(s));
    const double norm = optim::total_grad_norm(t.fused).item<double>();
    ASSERT_TRUE(std::isfinite(norm) && norm > 0) << what;
    for (auto* o : {&fused, &ref})
      for (auto& g : o->param_groups()) g.lr = 1e-2 / static_cast<double>(s + 1);
    step_both(fused, ref, t, norm * shares[s]);
    expect_grads_untouched(t, what);
    if (shares[s] < 1.0) {  // the reference did clip
      EXPECT_NE(t.ref[5].grad().to(Device::cpu()).to_vector<double>(), t.grads[5].to_vector<double>()) << what;
    }
    expect_same_bits(fused, ref, t, what);
  }
}

TEST(CudaFusedClip, NanNormSkipsWithItsFlagAndLaterStepsCountTheSkip) {
  FORGE_SKIP_WITHOUT_GPU();
  Twins t = make_twins();
  AdamW fused(two_groups(t.fused), {.lr = 1e-2, .weight_decay = 0.1});
  AdamW ref(two_groups(t.ref), {.lr = 1e-2, .weight_decay = 0.1});
  // 1: an ordinary clipped step with a device flag (0), so the state exists.
  t.set_grads(11, 2.0);
  Tensor flag = optim::found_non_finite(t.fused);
  step_both(fused, ref, t, 1.0, flag, optim::found_non_finite(t.ref));
  expect_same_bits(fused, ref, t, "step 1");
  std::vector<std::vector<double>> before;
  for (const Tensor& p : t.fused) before.push_back(p.detach().to_vector<double>());
  // 2: a NaN gradient: NaN norm, flag 1 on the device: nothing changes on either side.
  t.set_grads(12, 2.0, /*nan_at_0=*/true);
  const Tensor nan_norm = optim::total_grad_norm(t.fused);
  EXPECT_TRUE(std::isnan(nan_norm.item<double>()));
  step_both(fused, ref, t, 1.0, optim::found_non_finite(nan_norm), optim::found_non_finite(t.ref));
  expect_grads_untouched(t, "the skipped step");
  for (size_t i = 0; i < t.size(); ++i)
    EXPECT_EQ(t.fused[i].detach().to_vector<double>(), before[i]) << "skipped step, parameter " << i;
  expect_same_bits(fused, ref, t, "step 2 (skipped)");
  EXPECT_EQ(fused.state(t.fused[0])->step, 1);
  // 3, 4: clipped and not, under a clear device flag: t = attempts - skipped in both.
  t.set_grads(13, 3.0);
  step_both(fused, ref, t, 0.5, optim::found_non_finite(t.fused), optim::found_non_finite(t.ref));
  expect_grads_untouched(t, "step 3");
  t.set_grads(14, 1e-6);
  step_both(fused, ref, t, 1e3, optim::found_non_finite(t.fused), optim::found_non_finite(t.ref));
  expect_same_bits(fused, ref, t, "steps 3 and 4");
  EXPECT_EQ(fused.state(t.fused[0])->step, 3);
  // 5: a NaN norm without a flag never clips: an unclipped update on both sides.
  t.set_grads(15, 1.0);
  fused.clip_next_step(1.0, full({}, kNaN, {.dtype = DType::f32, .device = kGpu}));
  fused.step();
  optim::clip_grads_with_norm_(t.ref, 1.0, full({}, kNaN, {.dtype = DType::f32, .device = kGpu}));
  ref.step();
  expect_grads_untouched(t, "a NaN norm");
  expect_same_bits(fused, ref, t, "step 5 (NaN norm, no flag)");
}

TEST(CudaFusedClip, SgdClipsTheGradientsFirstAsBefore) {
  FORGE_SKIP_WITHOUT_GPU();
  Twins t;
  for (uint64_t k = 0; k < 6; ++k) t.add({static_cast<int64_t>(100 + 37 * k)}, k % 2 ? DType::bf16 : DType::f32, 40 + k);
  optim::SGD fused(t.fused, {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref(t.ref, {.lr = 0.1, .momentum = 0.9});
  for (uint64_t s = 1; s <= 3; ++s) {
    t.set_grads(20 + s, 2.0);
    const Tensor nf = optim::total_grad_norm(t.fused), nr = optim::total_grad_norm(t.ref);
    fused.clip_next_step(1.0, nf);
    fused.step();
    optim::clip_grads_with_norm_(t.ref, 1.0, nr);
    ref.step();
    for (size_t i = 0; i < t.size(); ++i)  // SGD does not fuse: .grad is clipped, as by clip_grads_with_norm_
      expect_equal(t.fused[i].grad(), t.ref[i].grad(), "SGD .grad " + std::to_string(i));
    expect_same_bits(fused, ref, t, "SGD step " + std::to_string(s));
  }
}

// A stream of the test's own, current for the scope (the legacy stream cannot be captured).
struct OwnStream {
  cuda::Stream stream = cuda::Stream::create(0);
  cuda::StreamGuard guard{stream};
  OwnStream() { cuda::synchronize(0); }
  ~OwnStream() { stream.synchronize(); }
};

// The norm, the pending clip and the step captured in a CUDA graph and replayed with new
// gradients (clipped at some replays, not at others) against the same steps run eagerly
// with clip_grads_with_norm_: the same bits; the captured gradients are never written.
TEST(CudaFusedClip, CapturedInACudaGraphMatchesEagerClipThenStep) {
  FORGE_SKIP_WITHOUT_GPU();
  OwnStream s;
  Twins t;
  uint64_t seed = 60;
  for (const Shape& shape : std::vector<Shape>{{300}, {17, 9}, {4099}})
    for (DType d : {DType::bf16, DType::f32}) t.add(shape, d, seed++);
  AdamW graphed(t.fused, {.lr = 1e-2, .weight_decay = 0.1});
  AdamW eager(t.ref, {.lr = 1e-2, .weight_decay = 0.1});
  const double max_norm = 5.0;
  const Tensor no_skip = zeros({}, {.dtype = DType::f32, .device = kGpu});
  // Step 1 (state made) in both, kernel by kernel.
  t.set_grads(1, 1.0);
  step_both(graphed, eager, t, max_norm, no_skip, no_skip);
  // Step 2 captured: norm, clip_next_step and step, with the gradients written in place later.
  t.set_grads(2, 1.0);
  std::vector<Tensor> captured_grads;
  for (const Tensor& p : t.fused) captured_grads.push_back(p.grad());
  cuda::CudaGraph graph;
  graphed.begin_graph_capture(kGpu);
  graph.capture_begin(s.stream);
  {
    const Tensor norm = optim::total_grad_norm(t.fused);
    graphed.clip_next_step(max_norm, norm);
    graphed.step(no_skip);
  }
  graph.capture_end();
  graphed.end_graph_capture();
  graphed.stage_graph_inputs();
  graph.replay();
  {
    const Tensor norm = optim::total_grad_norm(t.ref);
    optim::clip_grads_with_norm_(t.ref, max_norm, norm);
    eager.step(no_skip);
  }
  // Replays: gradient scales that clip (large) and that do not (small).
  const double scales[] = {3.0, 1e-3, 10.0, 1e-2};
  for (size_t k = 0; k < std::size(scales); ++k) {
    t.set_grads(3 + k, scales[k]);
    for (size_t i = 0; i < t.size(); ++i) {
      ops::copy_(captured_grads[i], t.grads[i].to(kGpu));
      t.fused[i].set_grad(captured_grads[i]);
    }
    for (auto* o : {&graphed, &eager})
      for (auto& g : o->param_groups()) g.lr = 1e-2 / static_cast<double>(k + 2);
    const Tensor norm = optim::total_grad_norm(t.ref);
    optim::clip_grads_with_norm_(t.ref, max_norm, norm);
    eager.step(no_skip);
    graphed.count_replayed_step();
    graphed.stage_graph_inputs();
    graph.replay();
  }
  s.stream.synchronize();
  for (size_t i = 0; i < t.size(); ++i)
    expect_equal(captured_grads[i].to(Device::cpu()), t.grads[i], "captured .grad " + std::to_string(i));
  expect_same_bits(graphed, eager, t, "after 4 replays");
}

}  // namespace
}  // namespace forge
