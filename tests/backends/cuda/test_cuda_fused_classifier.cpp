// Note [dlogits in the forward] (backends/cuda/loss.cu): ops::cross_entropy_consuming with
// FORGE_FUSED_CLASSIFIER=1 against the two kernels it replaces (the switch off), on fresh random
// inputs: the same loss and, for an upstream gradient of 1 (or the 1 / K a LossGradDivisor scope
// announced), the same gradient bits through a head GEMM; close for another upstream gradient and
// for a retained graph's second backward; the two
// kernels wherever it does not apply; and a GPT's training loss and gradients, bit for bit.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/cuda/cuda_testing.h"
#include "forge/core/env.h"
#include "forge/forge.h"
#include "forge/nn/gpt.h"
#include "testing/tiny_models.h"

namespace forge {
namespace {

using namespace cuda_testing;

struct HeadRun {
  Tensor loss, dx, dw;
};

// loss(linear(x, w), targets) on the GPU with the switch `fused`, then backward(upstream) (twice
// with retain_graph when `twice`); targets with every 7th row ignored. divisor > 0: the forward
// under ops::LossGradDivisor(divisor) (Note [expected loss gradient]); `divide`: the backward of
// loss / divisor instead (upstream unused), as a training loop runs it.
HeadRun run_head(const Tensor& x_host, const Tensor& w_host, const Tensor& t_host, ops::Reduction red, bool fused,
                 double upstream, bool twice, int64_t divisor = 0, bool divide = false,
                 const Tensor& loss_scale = Tensor()) {
  env::Override o("FORGE_FUSED_CLASSIFIER", fused ? "1" : "0");
  Tensor x = x_host.to(kGpu).detach().requires_grad_(), w = w_host.to(kGpu).detach().requires_grad_();
  Tensor loss;
  {
    const ops::LossGradDivisor expect(divisor > 0 ? divisor : 1, loss_scale);
    loss = ops::cross_entropy_consuming(ops::linear(x, w), t_host.to(kGpu), -100, red);
  }
  Tensor scaled = divide           ? (divisor == 1 ? loss : loss / static_cast<double>(divisor))
                  : upstream == 1.0 ? loss
                                    : ops::mul(loss, upstream);
  if (loss_scale.defined()) scaled = ops::mul(scaled, loss_scale);  // as LossScaler::scale_loss
  scaled.backward(Tensor(), twice);
  if (twice) scaled.backward();
  return {loss, x.grad(), w.grad()};
}

Tensor targets_for(int64_t N, int64_t V, uint64_t seed) {
  std::vector<int64_t> t(static_cast<size_t>(N));
  uint64_t s = seed;
  for (int64_t i = 0; i < N; ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    t[static_cast<size_t>(i)] = i % 7 == 3 ? -100 : static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(V));
  }
  return from_vector(t, {N});
}

TEST(CudaFusedClassifier, SameLossAndGradientBitsAsTheTwoKernels) {
  FORGE_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t N, K, V;
    DType dtype;
  };
  uint64_t seed = 9500;
  // GPT-2's vocabulary (a 100 KB bf16 row in shared memory), LLaMA's, and a small f32 one.
  // FORGE_CE_WIDE_ROWS=1 (Note [wide cross-entropy rows]): 1024-thread rows in both paths for the
  // two vocabularies, the small one unchanged.
  for (const char* wide : {"0", "1"})
  for (const Case& c : {Case{300, 64, 50304, DType::bf16}, Case{130, 64, 32000, DType::f16}, Case{257, 32, 1000, DType::f32}})
    for (ops::Reduction red : {ops::Reduction::mean, ops::Reduction::sum}) {
      env::Override wide_rows("FORGE_CE_WIDE_ROWS", wide);
      const std::string what = std::string(dtype_name(c.dtype)) + " V=" + std::to_string(c.V) + " " +
                               ops::reduction_name(red) + " FORGE_CE_WIDE_ROWS=" + wide;
      const Tensor x = host_input({c.N, c.K}, Domain::real, c.dtype, ++seed);
      const Tensor w = ops::mul(host_input({c.V, c.K}, Domain::real, DType::f32, ++seed), 0.5).to(c.dtype);
      const Tensor t = targets_for(c.N, c.V, ++seed);
      const int64_t before = ops::cross_entropy_fused_forwards();
      const HeadRun two = run_head(x, w, t, red, false, 1.0, false);
      EXPECT_EQ(ops::cross_entropy_fused_forwards(), before) << what;
      const HeadRun one = run_head(x, w, t, red, true, 1.0, false);
      EXPECT_EQ(ops::cross_entropy_fused_forwards(), before + 1) << what;
      expect_equal(one.loss, two.loss, what + ": loss");
      expect_equal(one.dx, two.dx, what + ": dx");
      expect_equal(one.dw, two.dw, what + ": dw");
    }
}

TEST(CudaFusedClassifier, OtherUpstreamGradientsAndARetainedGraph) {
  FORGE_SKIP_WITHOUT_GPU();
  const int64_t N = 200, K = 48, V = 4096;
  const Tensor x = host_input({N, K}, Domain::real, DType::bf16, 9600);
  const Tensor w = host_input({V, K}, Domain::real, DType::bf16, 9601);
  const Tensor t = targets_for(N, V, 9602);
  for (bool twice : {false, true}) {
    const std::string what = std::string("upstream 0.25") + (twice ? ", two backwards of a retained graph" : "");
    const HeadRun two = run_head(x, w, t, ops::Reduction::mean, false, 0.25, twice);
    const HeadRun one = run_head(x, w, t, ops::Reduction::mean, true, 0.25, twice);
    expect_equal(one.loss, two.loss, what + ": loss");
    // dlogits rounded to bf16 before the multiplication: not the same bits, within bf16's rounding.
    expect_close(one.dx, two.dx, tolerance(DType::bf16), what + ": dx");
    expect_close(one.dw, two.dw, tolerance(DType::bf16), what + ": dw");
  }
}

// Gradient accumulation: under LossGradDivisor(K) the forward writes dlogits for 1 / K, and the
// backward of loss / K (what a training loop with K micro-batches runs) has nothing left to do:
// the two kernels' bits (a multiplying pass would round twice and differ); likewise with f16's
// loss scale S on the device, (loss / K) * S. A divisor that does not match the gradient that
// comes is still right, within bf16's rounding.
TEST(CudaFusedClassifier, GradientAccumulationGetsTheTwoKernelsBits) {
  FORGE_SKIP_WITHOUT_GPU();
  const int64_t N = 300, K = 64, V = 50304;
  const Tensor x = host_input({N, K}, Domain::real, DType::bf16, 9650);
  const Tensor w = ops::mul(host_input({V, K}, Domain::real, DType::f32, 9651), 0.5).to(DType::bf16);
  const Tensor t = targets_for(N, V, 9652);
  for (const int64_t divisor : {2, 3, 7}) {
    const std::string what = "divisor " + std::to_string(divisor);
    const HeadRun two = run_head(x, w, t, ops::Reduction::mean, false, 0.0, false, divisor, true);
    const int64_t before = ops::cross_entropy_fused_forwards();
    const HeadRun one = run_head(x, w, t, ops::Reduction::mean, true, 0.0, false, divisor, true);
    EXPECT_EQ(ops::cross_entropy_fused_forwards(), before + 1) << what;
    expect_equal(one.loss, two.loss, what + ": loss");
    expect_equal(one.dx, two.dx, what + ": dx");
    expect_equal(one.dw, two.dw, what + ": dw");
  }
  // f16's loss scale, held on the device: (loss / K) * S, the gradient S / K formed on the device in
  // both kernels of the fused path, the two kernels' bits again (f16 logits, as an f16 run has).
  const Tensor xh = host_input({N, K}, Domain::real, DType::f16, 9655);
  const Tensor wh = ops::mul(host_input({V, K}, Domain::real, DType::f32, 9656), 0.5).to(DType::f16);
  const Tensor scale = full({}, 32768.0, {.dtype = DType::f32, .device = kGpu});
  for (const int64_t divisor : {1, 3}) {
    const std::string what = "loss scale 32768, divisor " + std::to_string(divisor);
    const HeadRun two = run_head(xh, wh, t, ops::Reduction::mean, false, 0.0, false, divisor, true, scale);
    const int64_t before = ops::cross_entropy_fused_forwards();
    const HeadRun one = run_head(xh, wh, t, ops::Reduction::mean, true, 0.0, false, divisor, true, scale);
    EXPECT_EQ(ops::cross_entropy_fused_forwards(), before + 1) << what;
    expect_equal(one.loss, two.loss, what + ": loss");
    expect_equal(one.dx, two.dx, what + ": dx");
    expect_equal(one.dw, two.dw, what + ": dw");
  }
  // A scale that is not on the logits' device (a scaler not bound yet): the two kernels.
  {
    const int64_t before = ops::cross_entropy_fused_forwards();
    env::Override o("FORGE_FUSED_CLASSIFIER", "1");
    const ops::LossGradDivisor elsewhere(2, full({}, 8.0, {.dtype = DType::f32}));
    Tensor l = host_input({16, 64}, Domain::real, DType::bf16, 9653).to(kGpu).requires_grad_();
    (ops::cross_entropy_consuming(l, targets_for(16, 64, 9654).to(kGpu)) / 2.0).backward();
    EXPECT_EQ(ops::cross_entropy_fused_forwards(), before) << "a CPU scale: not fused";
  }
  // Expected 1 / 3, given 0.25.
  const HeadRun two = run_head(x, w, t, ops::Reduction::mean, false, 0.25, false);
  const HeadRun one = run_head(x, w, t, ops::Reduction::mean, true, 0.25, false, 3);
  expect_equal(one.loss, two.loss, "divisor 3, upstream 0.25: loss");
  expect_close(one.dx, two.dx, tolerance(DType::bf16), "divisor 3, upstream 0.25: dx");
  expect_close(one.dw, two.dw, tolerance(DType::bf16), "divisor 3, upstream 0.25: dw");
}

TEST(CudaFusedClassifier, TheTwoKernelsWhereItDoesNotApply) {
  FORGE_SKIP_WITHOUT_GPU();
  env::Override o("FORGE_FUSED_CLASSIFIER", "1");
  const int64_t before = ops::cross_entropy_fused_forwards();
  // 1001 classes: not whole 16-byte vectors. f64. Per-row losses. No gradient wanted.
  const Tensor l1 = host_input({16, 1001}, Domain::real, DType::bf16, 9700).to(kGpu).requires_grad_();
  ops::cross_entropy_consuming(l1, targets_for(16, 1001, 9701).to(kGpu)).backward();
  const Tensor l2 = host_input({16, 64}, Domain::real, DType::f64, 9702).to(kGpu).requires_grad_();
  ops::cross_entropy_consuming(l2, targets_for(16, 64, 9703).to(kGpu)).backward();
  const Tensor l3 = host_input({16, 64}, Domain::real, DType::bf16, 9704).to(kGpu).requires_grad_();
  ops::sum(ops::cross_entropy_consuming(l3, targets_for(16, 64, 9705).to(kGpu), -100, ops::Reduction::none)).backward();
  const Tensor l4 = host_input({16, 64}, Domain::real, DType::bf16, 9706).to(kGpu);
  const Tensor before_values = l4.to(Device::cpu());
  {
    NoGradGuard no_grad;
    ops::cross_entropy_consuming(l4, targets_for(16, 64, 9707).to(kGpu));
  }
  EXPECT_EQ(ops::cross_entropy_fused_forwards(), before);
  expect_equal(l4, before_values.to(kGpu), "logits left alone without a gradient");
}

// A GPT's training step through CausalLM::head_loss: the loss and every parameter's gradient,
// bit for bit with the switch on and off.
TEST(CudaFusedClassifier, GptLossAndGradientsBitForBit) {
  FORGE_SKIP_WITHOUT_GPU();
  const nn::GPTConfig c = testing::tiny_gpt_config();  // 64 classes: whole 16-byte vectors
  const int64_t B = 4, T = c.block_size, V = c.vocab_size;
  std::vector<int64_t> iv(static_cast<size_t>(B * T)), tv(static_cast<size_t>(B * T));
  for (int64_t i = 0; i < B * T; ++i) {
    iv[static_cast<size_t>(i)] = (i * 101 + 7) % V;
    tv[static_cast<size_t>(i)] = (i * 37 + 11) % V;
  }
  const Tensor idx = from_vector(iv, {B, T}), tgt = from_vector(tv, {B, T});
  auto run = [&](bool fused) {
    env::Override o("FORGE_FUSED_CLASSIFIER", fused ? "1" : "0");
    nn::GPT model(c, 1234);
    model.to(kGpu, DType::bf16);
    const Tensor loss = model.loss(idx.to(kGpu), tgt.to(kGpu));
    loss.backward();
    std::vector<Tensor> out{loss};
    for (auto& [name, p] : model.named_parameters()) out.push_back(p.grad());
    return out;
  };
  const int64_t before = ops::cross_entropy_fused_forwards();
  const auto two = run(false), one = run(true);
  EXPECT_EQ(ops::cross_entropy_fused_forwards(), before + 1);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) expect_equal(one[i], two[i], "GPT output " + std::to_string(i));
}

}  // namespace
}  // namespace forge
