// FP8 training on the GPU (backends/cuda/fp8.h, Note [FP8 on the GPU] in ops/fp8.h) against the CPU
// emulation of the recipes (ops/fp8.h), which its own tests check against an independent f64
// reference: the casts code for code and factor for factor, each recipe's scaled GEMMs against the
// product of the dequantized operands (which also checks the factors' layouts cuBLASLt reads),
// fp8::linear's forward and gradients against the emulation's, the guardrail slots, the measured
// GEMM choice, and a training run with and without its CUDA graph.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cuda/cuda_testing.h"
#include "forge/backends/cuda/fp8.h"
#include "forge/backends/cuda/gemm_fp8.h"
#include "forge/forge.h"
#include "forge/io/safetensors.h"
#include "forge/ops/fp8.h"
#include "forge/run/config.h"
#include "forge/train/trainer.h"
#include "train/train_testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using cuda_testing::kGpu;
using fp8::Format;
using fp8::Operand;
using fp8::Recipe;
using M = cuda::Fp8ScaleMode;

constexpr Recipe kRecipes[] = {Recipe::tensorwise, Recipe::rowwise, Recipe::blockwise};

bool can_run(Recipe r) {
  return cuda::fp8_scale_mode_supported(0, r == Recipe::tensorwise ? M::scalar : r == Recipe::rowwise ? M::outer : M::vec128);
}

#define FORGE_SKIP_WITHOUT_RECIPE(r)                                                                  \
  do {                                                                                                \
    FORGE_SKIP_WITHOUT_GPU();                                                                         \
    if (!can_run(r)) GTEST_SKIP() << "cuda:0 has no " << fp8::recipe_name(r) << " FP8 GEMM";          \
  } while (0)

// (rows, cols) of normal values times a per-row magnitude over 2^-6 .. 2^6, a few outliers, and a
// row of zeros (three rows or more): every group kind sees different amaxes. bf16 values (what a bf16 run casts), f32.
Tensor matrix(int64_t rows, int64_t cols, uint64_t seed) {
  Generator gen(seed);
  std::vector<float> v = randn({rows, cols}, {}, &gen).to_vector<float>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v[static_cast<size_t>(i * cols + j)] *= std::ldexp(1.0f, static_cast<int>(i % 13) - 6);
  if (rows >= 3 && cols >= 4) {  // (a vector, such as a bias, keeps its normal values)
    v[static_cast<size_t>(cols + 3)] = 900.0f;
    v[v.size() / 2] = -3000.0f;  // (-3008 in bf16)
    for (int64_t j = 0; j < cols; ++j) v[static_cast<size_t>(2 * cols + j)] = 0.0f;
  }
  return from_vector(v, {rows, cols}).to(DType::bf16).to(DType::f32);
}

struct Groups {
  cuda::Fp8Groups plain, trans;
  M plain_mode, trans_mode;
};
Groups groups_of(Recipe r, Operand op, int64_t R, int64_t C) {
  switch (r) {
    case Recipe::tensorwise: return {{R, C}, {R, C}, M::scalar, M::scalar};
    case Recipe::rowwise: return {{1, C}, {R, 1}, M::outer, M::outer};
    case Recipe::blockwise:
      if (op == Operand::weight) return {{128, 128}, {128, 128}, M::blk128, M::blk128};
      return {{1, 128}, {128, 1}, M::vec128, M::vec128};
  }
  return {};
}

// The factors the emulation's scales give in `mode`'s layout (Note [FP8 GEMM scales]) for codes of
// (rows, k).
std::vector<float> expected_factors(const fp8::Quantized& q, M mode) {
  const std::vector<float> s = q.scales.to_vector<float>();
  const int64_t rows = q.codes.size(0), k = q.codes.size(1), kb = (k + 127) / 128;
  switch (mode) {
    case M::scalar: return {1.0f / s[0]};
    case M::outer: {
      std::vector<float> f(static_cast<size_t>(rows));
      for (int64_t i = 0; i < rows; ++i) f[static_cast<size_t>(i)] = 1.0f / s[static_cast<size_t>(i)];
      return f;
    }
    case M::vec128: {  // emulation (rows, kb) row-major -> kb * rows + row
      std::vector<float> f(static_cast<size_t>(rows * kb));
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t b = 0; b < kb; ++b) f[static_cast<size_t>(b * rows + i)] = 1.0f / s[static_cast<size_t>(i * kb + b)];
      return f;
    }
    case M::blk128: {  // emulation (rb, kb) row-major -> rb * ceil4(kb) + kb
      const int64_t rb = (rows + 127) / 128, pad = (kb + 3) / 4 * 4;
      std::vector<float> f(static_cast<size_t>(rb * pad), 0.0f);
      for (int64_t i = 0; i < rb; ++i)
        for (int64_t b = 0; b < kb; ++b) f[static_cast<size_t>(i * pad + b)] = 1.0f / s[static_cast<size_t>(i * kb + b)];
      return f;
    }
  }
  return {};
}

cuda::Fp8Operand cast(const Tensor& x, Recipe r, Operand op, bool transposed) {
  const Tensor g = x.to(DType::bf16).to(kGpu);
  const Groups gs = groups_of(r, op, x.size(0), x.size(1));
  const cuda::Fp8Groups gg = transposed ? gs.trans : gs.plain;
  const Tensor amax = cuda::fp8_group_amax(g, gg);
  return cuda::fp8_cast(g, fp8::format_of(r, op), amax, gg, transposed ? gs.trans_mode : gs.plain_mode, transposed);
}

// Note [FP8 cast groups]: each recipe's casts of each operand, plain and transposed (the transposed
// codes are the emulation's quantization of x^T), code for code and factor for factor; the shapes
// have partial 32-wide tiles (rowwise, tensorwise) and more than one 128-block (blockwise). The
// one-pass pair (fp8_cast2, fp8_group_amax2) writes the same bytes.
TEST(CudaFp8, CastsMatchTheEmulationCodeForCode) {
  for (Recipe r : kRecipes) {
    FORGE_SKIP_WITHOUT_RECIPE(Recipe::tensorwise);
    const bool block = r == Recipe::blockwise;
    const int64_t R = block ? 384 : 208, C = block ? 256 : 80;
    for (Operand op : {Operand::activation, Operand::weight, Operand::gradient}) {
      const Tensor x = matrix(R, C, 11 + static_cast<uint64_t>(op));
      for (bool transposed : {false, true}) {
        const std::string what = std::string(fp8::recipe_name(r)) + " " + fp8::operand_name(op) + (transposed ? " transposed" : "");
        const Tensor src = transposed ? ops::transpose(x, 0, 1).contiguous() : x;
        const fp8::Quantized q = fp8::quantize(src, fp8::format_of(r, op), r, op);
        const cuda::Fp8Operand c = cast(x, r, op, transposed);
        ASSERT_EQ(c.codes.shape(), q.codes.shape()) << what;
        const std::vector<uint8_t> got = c.codes.to(Device::cpu()).to_vector<uint8_t>(), want = q.codes.to_vector<uint8_t>();
        int64_t differ = 0;
        for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i] ? 1 : 0;
        EXPECT_EQ(differ, 0) << what << ": codes differ";
        const Groups gs = groups_of(r, op, R, C);
        const std::vector<float> f = c.inv_scales.to(Device::cpu()).to_vector<float>(),
                                 ef = expected_factors(q, transposed ? gs.trans_mode : gs.plain_mode);
        ASSERT_EQ(f.size(), ef.size()) << what;
        for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(f[i], ef[i]) << what << " factor " << i;
      }
      // Both orientations in one pass.
      const Groups gs = groups_of(r, op, R, C);
      const Tensor g = x.to(DType::bf16).to(kGpu);
      Tensor a0, a1;
      cuda::fp8_group_amax2(g, gs.plain, a0, gs.trans, a1);
      cuda::Fp8Operand p, t;
      cuda::fp8_cast2(g, fp8::format_of(r, op), a0, gs.plain, gs.plain_mode, p, a1, gs.trans, gs.trans_mode, t);
      EXPECT_TRUE(p.codes.to(Device::cpu()).to_vector<uint8_t>() == cast(x, r, op, false).codes.to(Device::cpu()).to_vector<uint8_t>());
      EXPECT_TRUE(t.codes.to(Device::cpu()).to_vector<uint8_t>() == cast(x, r, op, true).codes.to(Device::cpu()).to_vector<uint8_t>());
    }
  }
}

// The whole tensor's amax lands in the slot (as float bits, NaN winning), for the guardrails.
TEST(CudaFp8, AmaxSlotHoldsTheLargestMagnitudeAndNaN) {
  FORGE_SKIP_WITHOUT_GPU();
  Tensor x = matrix(96, 160, 3);
  const Tensor slot = zeros({2}, {.dtype = DType::f32, .device = kGpu});
  (void)cuda::fp8_group_amax(x.to(kGpu), {96, 160}, static_cast<float*>(slot.data_ptr()));
  EXPECT_EQ(slot.to(Device::cpu()).to_vector<float>()[0], 3008.0f);  // (the outlier -3000 in bf16)
  std::vector<float> v = x.to_vector<float>();
  v[77] = NAN;
  (void)cuda::fp8_group_amax(from_vector(v, {96, 160}).to(kGpu), {1, 160}, static_cast<float*>(slot.data_ptr()) + 1);
  EXPECT_TRUE(std::isnan(slot.to(Device::cpu()).to_vector<float>()[1]));
}

// Each recipe's three GEMMs (forward x w^T; dx = dy w; dw = dy^T x, in the formats and factor layouts
// fp8::linear uses) against the f32 product of the emulation's dequantized operands. A wrong factor
// layout (vec128's row order, blk128's padding) scales whole rows or blocks wrongly: errors of
// order 1, far above the bound (bf16 output rounding).
TEST(CudaFp8, ScaledGemmsMatchTheDequantizedProducts) {
  for (Recipe r : kRecipes) {
    FORGE_SKIP_WITHOUT_RECIPE(Recipe::tensorwise);
    if (!can_run(r)) continue;
    const int64_t m = 256, n = 384, k = 512;
    const Tensor x = matrix(m, k, 21), w = matrix(n, k, 22), dy = matrix(m, n, 23);
    const Tensor xt = ops::transpose(x, 0, 1).contiguous(), wt = ops::transpose(w, 0, 1).contiguous(),
                 dyt = ops::transpose(dy, 0, 1).contiguous();
    struct Case {
      const char* name;
      Tensor a, b_t;
      Operand ar, br;
      cuda::Fp8Operand ga, gb;
    };
    const Case cases[] = {
        {"forward", x, w, Operand::activation, Operand::weight, cast(x, r, Operand::activation, false),
         cast(w, r, Operand::weight, false)},
        {"dx", dy, wt, Operand::gradient, Operand::weight, cast(dy, r, Operand::gradient, false),
         cast(w, r, Operand::weight, true)},
        {"dw", dyt, xt, Operand::gradient, Operand::activation, cast(dy, r, Operand::gradient, true),
         cast(x, r, Operand::activation, true)},
    };
    for (const Case& c : cases) {
      const Tensor ref = fp8::quantized_matmul(c.a, c.ar, c.b_t, c.br, r);
      for (DType out : {DType::bf16, DType::f32}) {
        Tensor d = empty({c.a.size(0), c.b_t.size(0)}, {.dtype = out, .device = kGpu});
        cuda::fp8_scaled_gemm(c.ga, c.gb, d);
        const double err = cuda_testing::rel_err(d.to(Device::cpu()).to(DType::f32), ref);
        // (f32 out: the tensor cores' FP8 products accumulate with a few bits fewer than f32 between
        // promotions: 1.2e-4 .. 3.0e-4 measured on an H100)
        EXPECT_LE(err, out == DType::bf16 ? 4e-3 : 1e-3) << fp8::recipe_name(r) << " " << c.name << " -> " << dtype_name(out);
      }
    }
  }
}

// fp8::linear on the GPU (every shape in FP8) against the emulation on the CPU: the output and the
// three gradients of a (4, 64, 256) x (384, 256) linear with a bias, per recipe.
TEST(CudaFp8, LinearForwardAndGradientsMatchTheEmulation) {
  fp8::set_selection(fp8::Selection::all);
  for (Recipe r : kRecipes) {
    FORGE_SKIP_WITHOUT_RECIPE(Recipe::tensorwise);
    if (!can_run(r)) continue;
    const Tensor x0 = matrix(256, 256, 31).reshape({4, 64, 256}).to(DType::bf16),
                 w0 = matrix(384, 256, 32).to(DType::bf16), b0 = matrix(1, 384, 33).reshape({384}).to(DType::bf16),
                 g0 = matrix(256, 384, 34).reshape({4, 64, 384}).to(DType::bf16);
    std::map<std::string, Tensor> got, want;
    for (Device dev : {Device::cpu(), kGpu}) {
      Tensor x = x0.to(dev).detach(), w = w0.to(dev).detach(), b = b0.to(dev).detach();
      x.requires_grad_(true);
      w.requires_grad_(true);
      b.requires_grad_(true);
      const Tensor y = fp8::linear(x, w, b, r, "test.linear");
      y.backward(g0.to(dev));
      auto& out = dev.is_cuda() ? got : want;
      out["y"] = y.detach().to(Device::cpu()).to(DType::f32);
      out["dx"] = x.grad().to(Device::cpu()).to(DType::f32);
      out["dw"] = w.grad().to(Device::cpu()).to(DType::f32);
      out["db"] = b.grad().to(Device::cpu()).to(DType::f32);
    }
    for (const auto& [name, t] : want)
      EXPECT_LE(cuda_testing::rel_err(got[name], t), 1e-2) << fp8::recipe_name(r) << " " << name;
  }
  (void)fp8::take_guard_events();
  fp8::set_selection(fp8::Selection::measured);
}

// Note [FP8 cast reuse]: a second linear of the same input takes the first one's codes; its output
// and gradients are those of a fresh cast, bit for bit (the cache dropped by reading the records).
TEST(CudaFp8, ReusedInputCastGivesTheSameBits) {
  FORGE_SKIP_WITHOUT_RECIPE(Recipe::tensorwise);
  fp8::set_selection(fp8::Selection::all);
  for (Recipe r : kRecipes) {
    if (!can_run(r)) continue;
    Tensor x = matrix(256, 256, 61).to(DType::bf16).to(kGpu);
    x.requires_grad_(true);
    const Tensor w1 = matrix(128, 256, 62).to(DType::bf16).to(kGpu), w2 = matrix(384, 256, 63).to(DType::bf16).to(kGpu);
    (void)fp8::take_guard_events();
    const Tensor first = fp8::linear(x, w1, Tensor(), r, "q");
    const Tensor reused = fp8::linear(x, w2, Tensor(), r, "k");
    ops::sum(ops::add(ops::sum(first), ops::sum(reused))).backward();
    const std::vector<float> dx_reused = x.grad().to(Device::cpu()).to(DType::f32).to_vector<float>();
    (void)fp8::take_guard_events();  // drops the kept cast
    x.zero_grad();
    const Tensor fresh = fp8::linear(x, w2, Tensor(), r, "k");
    EXPECT_TRUE(fresh.to(Device::cpu()).to(DType::f32).to_vector<float>() ==
                reused.detach().to(Device::cpu()).to(DType::f32).to_vector<float>())
        << fp8::recipe_name(r);
    (void)fp8::take_guard_events();
    const Tensor first_again = fp8::linear(x, w1, Tensor(), r, "q");
    ops::sum(ops::add(ops::sum(first_again), ops::sum(fresh))).backward();
    EXPECT_TRUE(x.grad().to(Device::cpu()).to(DType::f32).to_vector<float>() == dx_reused) << fp8::recipe_name(r);
  }
  (void)fp8::take_guard_events();
  fp8::set_selection(fp8::Selection::measured);
}

// Note [FP8 delayed scaling] on the GPU: a sequence of casts of one layer whose inputs change in
// magnitude (so that the delayed scale saturates some and under-uses others) gives the emulation's
// outputs and gradients at every call, and the same histories (oldest first); an evaluation's
// forward reads them without adding; restoring histories seeds the device's.
TEST(CudaFp8, DelayedScalingFollowsTheEmulationAndItsHistories) {
  FORGE_SKIP_WITHOUT_RECIPE(Recipe::tensorwise);
  fp8::set_selection(fp8::Selection::all);
  const float mags[] = {1.0f, 8.0f, 0.25f, 2.0f, 0.5f, 16.0f};
  std::map<std::string, std::vector<Tensor>> out;
  std::map<std::string, fp8::AmaxHistories> hist;
  for (Device dev : {Device::cpu(), kGpu}) {
    fp8::set_training_scaling({.scaling = fp8::Scaling::delayed, .history = 3});
    const std::string side = dev.is_cuda() ? "gpu" : "cpu";
    Tensor w = matrix(128, 256, 71).to(DType::bf16).to(dev).detach();
    w.requires_grad_(true);
    int i = 0;
    for (float mag : mags) {
      Tensor x = ops::mul(matrix(64, 256, 72 + static_cast<uint64_t>(i)), mag).to(DType::bf16).to(dev).detach();
      x.requires_grad_(true);
      const Tensor y = fp8::linear(x, w, Tensor(), Recipe::tensorwise, "delayed.layer");
      y.backward(ops::mul(matrix(64, 128, 90 + static_cast<uint64_t>(i)), 1.0f / mag).to(DType::bf16).to(dev));
      out[side].push_back(y.detach().to(Device::cpu()).to(DType::f32));
      out[side].push_back(x.grad().to(Device::cpu()).to(DType::f32));
      ++i;
    }
    {
      NoGradGuard no_grad;  // an evaluation: reads the histories, adds nothing
      out[side].push_back(fp8::linear(matrix(64, 256, 99).to(DType::bf16).to(dev), w.detach(), Tensor(), Recipe::tensorwise,
                                      "delayed.layer").to(Device::cpu()).to(DType::f32));
    }
    out[side].push_back(w.grad().to(Device::cpu()).to(DType::f32));
    hist[side] = fp8::amax_histories();
  }
  ASSERT_EQ(out["cpu"].size(), out["gpu"].size());
  for (size_t i = 0; i < out["cpu"].size(); ++i) EXPECT_LE(cuda_testing::rel_err(out["gpu"][i], out["cpu"][i]), 1e-2) << i;
  ASSERT_TRUE(hist["gpu"].count("delayed.layer"));
  for (size_t op = 0; op < 3; ++op) {
    const auto& g = hist["gpu"]["delayed.layer"][op];
    const auto& c = hist["cpu"]["delayed.layer"][op];
    ASSERT_EQ(g.size(), c.size()) << op;
    EXPECT_EQ(g.size(), 3u) << op;  // the last three training casts
    for (size_t j = 0; j < g.size(); ++j) EXPECT_NEAR(g[j], c[j], 1e-6 * c[j]) << op << " " << j;
  }
  // Restored histories seed the device's: what they say is what a checkpoint gave back.
  fp8::restore_amax_histories(hist["cpu"]);
  Tensor w = matrix(128, 256, 71).to(DType::bf16).to(kGpu);
  (void)fp8::linear(matrix(64, 256, 100).to(DType::bf16).to(kGpu), w, Tensor(), Recipe::tensorwise, "delayed.layer");
  const fp8::AmaxHistories after = fp8::amax_histories();
  const auto& a = after.at("delayed.layer")[static_cast<size_t>(Operand::weight)];
  const auto& before = hist["cpu"]["delayed.layer"][static_cast<size_t>(Operand::weight)];
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0], before[1]);  // the oldest left, the new weight amax came in last
  EXPECT_EQ(a[1], before[2]);
  fp8::set_training_scaling({});
  (void)fp8::take_guard_events();
  fp8::set_selection(fp8::Selection::measured);
}

// Note [FP8 guardrails] on the GPU: an inf in x is reported with the layer and the operand after the
// step's read of the slots; a clean cast reports nothing; the amax record holds the finite amaxes.
TEST(CudaFp8, GuardrailNamesTheLayerAndOperand) {
  FORGE_SKIP_WITHOUT_RECIPE(Recipe::tensorwise);
  fp8::set_selection(fp8::Selection::all);
  (void)fp8::take_guard_events();
  (void)fp8::take_amax_record();
  std::vector<float> v = matrix(64, 128, 41).to_vector<float>();
  Tensor w = matrix(128, 128, 42).to(DType::bf16).to(kGpu);
  w.requires_grad_(true);
  (void)fp8::linear(from_vector(v, {64, 128}).to(DType::bf16).to(kGpu), w, Tensor(), Recipe::tensorwise, "clean.layer");
  EXPECT_TRUE(fp8::take_guard_events().empty());
  const auto record = fp8::take_amax_record();
  ASSERT_TRUE(record.count("clean.layer")) << "no amax recorded";
  EXPECT_EQ(record.at("clean.layer")[static_cast<size_t>(Operand::activation)], 3008.0);  // (-3000 in bf16)
  v[5] = INFINITY;
  (void)fp8::linear(from_vector(v, {64, 128}).to(DType::bf16).to(kGpu), w, Tensor(), Recipe::tensorwise, "bad.layer");
  const std::vector<fp8::GuardEvent> events = fp8::take_guard_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].layer, "bad.layer");
  EXPECT_EQ(events[0].operand, Operand::activation);
  EXPECT_TRUE(std::isinf(events[0].amax));
  fp8::set_selection(fp8::Selection::measured);
}

// Note [FP8 guardrails one step late]: the trainer queues each step's slots behind its work and
// reads them at the next step's queue, so an inf cast in step 5 is reported (with step 5) once step
// 6 has been queued, not before; take_guard_events reads what is left.
TEST(CudaFp8, GuardrailEventsComeOneStepLateWithTheirStep) {
  FORGE_SKIP_WITHOUT_RECIPE(Recipe::tensorwise);
  fp8::set_selection(fp8::Selection::all);
  (void)fp8::take_guard_events();
  std::vector<float> v = matrix(64, 128, 43).to_vector<float>();
  Tensor w = matrix(128, 128, 44).to(DType::bf16).to(kGpu);
  w.requires_grad_(true);
  v[7] = INFINITY;
  (void)fp8::linear(from_vector(v, {64, 128}).to(DType::bf16).to(kGpu), w, Tensor(), Recipe::tensorwise, "late.layer");
  fp8::queue_step_records(5);
  EXPECT_TRUE(fp8::take_queued_guard_events().empty()) << "step 5's records read before step 6 was queued";
  v[7] = 1.0f;
  (void)fp8::linear(from_vector(v, {64, 128}).to(DType::bf16).to(kGpu), w, Tensor(), Recipe::tensorwise, "late.layer");
  fp8::queue_step_records(6);
  const std::vector<fp8::GuardEvent> events = fp8::take_queued_guard_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].layer, "late.layer");
  EXPECT_EQ(events[0].step, 5);
  v[9] = -INFINITY;
  (void)fp8::linear(from_vector(v, {64, 128}).to(DType::bf16).to(kGpu), w, Tensor(), Recipe::tensorwise, "late.layer");
  fp8::queue_step_records(7);
  const std::vector<fp8::GuardEvent> rest = fp8::take_guard_events();  // step 6 (clean) and 7
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].step, 7);
  fp8::set_selection(fp8::Selection::measured);
}

// Note [FP8 GEMM choice]: a shape is timed both ways once and the choice reported with both times;
// a shape the FP8 GEMM cannot take runs as ops::linear (the same bits) with the reason.
TEST(CudaFp8, GemmChoiceIsMeasuredOnceAndReported) {
  FORGE_SKIP_WITHOUT_RECIPE(Recipe::tensorwise);
  fp8::set_selection(fp8::Selection::measured);
  const Tensor x = matrix(64, 128, 51).to(DType::bf16).to(kGpu), w = matrix(96, 128, 52).to(DType::bf16).to(kGpu);
  (void)fp8::linear(x, w, Tensor(), Recipe::tensorwise, "a");
  (void)fp8::linear(x, w, Tensor(), Recipe::tensorwise, "b");
  const Tensor odd = matrix(10, 128, 53).to(DType::bf16).to(kGpu);
  const Tensor y = fp8::linear(odd, w, Tensor(), Recipe::tensorwise, "c");
  EXPECT_TRUE(y.to(Device::cpu()).to_vector<float>() == ops::linear(odd, w, Tensor()).to(Device::cpu()).to_vector<float>());
  const std::vector<fp8::GemmChoice> choices = fp8::gemm_choices();
  ASSERT_EQ(choices.size(), 2u);
  int measured = 0, refused = 0;
  for (const fp8::GemmChoice& c : choices) {
    if (c.m == 64) {
      ++measured;
      EXPECT_EQ(c.reason, "measured");
      EXPECT_GT(c.bf16_ms, 0.0);
      EXPECT_GT(c.fp8_ms, 0.0);
      EXPECT_EQ(c.fp8, c.fp8_ms < c.bf16_ms);
    } else {
      ++refused;
      EXPECT_EQ(c.m, 10);
      EXPECT_FALSE(c.fp8);
      EXPECT_NE(c.reason.find("multiple of 16"), std::string::npos) << c.reason;
    }
  }
  EXPECT_EQ(measured, 1);
  EXPECT_EQ(refused, 1);
  (void)fp8::take_guard_events();
}

// A GPT trains with each recipe on the GPU (every linear shape in FP8): the log lists the choices,
// the first loss is within 1% of the bf16 run's and the last within 5%; with and without the CUDA
// graph the FP8 run gives the same losses and weights bit for bit (the casts and the slots are
// captured with the step).
class Fp8Training : public ::testing::Test {
 protected:
  void SetUp() override { train_testing::write_corpus(scratch.path() / "corpus"); }
  void TearDown() override {
    fp8::set_training_recipe(std::nullopt);
    fp8::set_training_scaling({});
    fp8::set_selection(fp8::Selection::measured);
  }
  struct Run {
    train::TrainResult result;
    std::string log;
    std::vector<double> weights;
  };
  Run train(const std::string& name, std::vector<std::string> overrides, bool resume = false) {
    overrides.insert(overrides.begin(), {"run.device=cuda", "run.dtype=bf16", "run.deterministic=true",
                                         "run.gemm_tuning=off", "train.log_every=1", "checkpoint.at_end=true",
                                         "model.n_embd=128", "model.block_size=64", "train.seq_len=64"});
    const train::RunConfig c =
        train::parse_config(train_testing::tiny_toml(scratch.path(), name, 12), name + ".toml", overrides);
    std::ostringstream log;
    Run r;
    train::TrainOptions opt;
    opt.resume = resume;
    r.result = train::run_training(c, opt, log);
    r.log = log.str();
    r.weights = train_testing::checkpoint_weights(r.result.last_checkpoint);
    return r;
  }
  train_testing::Scratch scratch;
};

TEST_F(Fp8Training, EachRecipeTrainsBesideBf16AndItsGraphGivesTheSameBits) {
  FORGE_SKIP_WITHOUT_RECIPE(Recipe::tensorwise);
  const Run base = train("bf16", {});
  for (Recipe r : kRecipes) {
    if (!can_run(r)) continue;
    const std::string name = fp8::recipe_name(r);
    const std::vector<std::string> o{"run.fp8=" + name, "run.fp8_select=all"};
    std::vector<std::string> on = o, off = o;
    on.push_back("run.cuda_graph=true");
    off.push_back("run.cuda_graph=false");
    const Run g = train(name + "_graph", on), e = train(name + "_eager", off);
    EXPECT_NE(g.log.find("linear shapes in FP8"), std::string::npos) << g.log;
    EXPECT_NE(g.log.find("cuda graph: step 2 captured"), std::string::npos) << g.log;
    ASSERT_EQ(g.result.losses.size(), base.result.losses.size());
    EXPECT_NE(g.result.losses[0], base.result.losses[0]) << name << ": FP8 changed nothing";
    EXPECT_NEAR(g.result.losses[0], base.result.losses[0], 0.01 * base.result.losses[0]) << name;
    EXPECT_NEAR(g.result.losses.back(), base.result.losses.back(), 0.05 * base.result.losses.back()) << name;
    ASSERT_EQ(g.result.losses.size(), e.result.losses.size());
    for (size_t i = 0; i < e.result.losses.size(); ++i) EXPECT_EQ(g.result.losses[i], e.result.losses[i]) << name << " step " << i + 1;
    EXPECT_TRUE(g.weights == e.weights) << name << ": the final weights differ with the graph";
  }
}

// Delayed scaling's histories are the run's state on the GPU too: a run stopped at step 6 and
// resumed gives the uninterrupted run's losses and weights bit for bit.
TEST_F(Fp8Training, DelayedScalingResumesBitIdentically) {
  FORGE_SKIP_WITHOUT_RECIPE(Recipe::tensorwise);
  const std::vector<std::string> o{"run.fp8=tensorwise", "run.fp8_select=all", "run.fp8_scaling=delayed",
                                   "run.fp8_amax_history=4", "checkpoint.every=6", "schedule.decay_steps=12"};
  const Run whole = train("delayed_whole", o);
  std::vector<std::string> first = o;
  first.push_back("train.steps=6");
  (void)train("delayed_parts", first);
  const Run resumed = train("delayed_parts", o, true);  // (the same run directory: continues from step 6)
  ASSERT_EQ(whole.result.losses.size(), 12u);
  ASSERT_EQ(resumed.result.start_step, 6) << resumed.log;
  ASSERT_EQ(resumed.result.losses.size(), 6u) << resumed.log;
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(resumed.result.losses[i], whole.result.losses[6 + i]) << "step " << 7 + i;
  EXPECT_TRUE(resumed.weights == whole.weights);
}

}  // namespace
}  // namespace forge
