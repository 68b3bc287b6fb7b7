// Note [column sums handed to the producer] (autograd/node.h): the CUDA norm backward's column
// sums of dx (NormGrads::dx_sums, the block-per-row kernel of norm_wide.cu), and GPT's c_proj
// bias gradient taken from them through add_layer_norm (FORGE_NORM_BIAS_GRAD=1), against the
// CPU and against the path without the hand-over, on fresh random inputs.
#include <gtest/gtest.h>

#include <string>

#include "backends/cuda/cuda_testing.h"
#include "forge/autograd/node.h"
#include "forge/backends/cpu/norm.h"
#include "forge/backends/cuda/norm.h"
#include "forge/core/env.h"
#include "forge/forge.h"

namespace forge {
namespace {

using namespace cuda_testing;

// The layer norm backward of (R, C) with and without dx_sums (and with dx_add when `add`): the
// same dx, dweight and dbias bits, dx_sums done exactly where the block-per-row kernel runs, and
// then equal to the column sums of the dx it wrote.
void check_dx_sums(int64_t R, int64_t C, DType dt, bool add, bool block_rows, uint64_t seed) {
  const std::string what = "layer_norm_backward [" + std::to_string(R) + ", " + std::to_string(C) + "] " +
                           dtype_name(dt) + (add ? " with dx_add" : "") + (block_rows ? "" : " FORGE_NORM_BLOCK_ROWS=0");
  env::Override o("FORGE_NORM_BLOCK_ROWS", block_rows ? "1" : "0");
  const TensorOptions opt{.dtype = dt, .device = kGpu};
  const TensorOptions stat{.dtype = cpu::norm_stat_dtype(dt), .device = kGpu};
  const Tensor x = host_input({R, C}, Domain::real, dt, seed).to(kGpu);
  const Tensor w = host_input({C}, Domain::positive, dt, seed + 1).to(kGpu);
  const Tensor b = host_input({C}, Domain::real, dt, seed + 2).to(kGpu);
  const Tensor dy = host_input({R, C}, Domain::real, dt, seed + 3).to(kGpu);
  const Tensor residual_grad = host_input({R, C}, Domain::real, dt, seed + 4).to(kGpu);
  Tensor y = empty({R, C}, opt), mean = empty({R}, stat), rstd = empty({R}, stat);
  cuda::layer_norm_forward(x, w, b, 1e-5, y, mean, rstd);
  auto run = [&](bool sums) {
    cpu::NormGrads g;
    g.dx = empty({R, C}, opt);
    g.dweight = empty({C}, opt);
    g.dbias = empty({C}, opt);
    if (add) g.dx_add = residual_grad;
    if (sums) g.dx_sums = empty({C}, opt);
    cuda::layer_norm_backward(dy, x, w, mean, rstd, g);
    return g;
  };
  const cpu::NormGrads plain = run(false), with = run(true);
  expect_equal(with.dx, plain.dx, what + ": dx");
  expect_equal(with.dweight, plain.dweight, what + ": dweight");
  expect_equal(with.dbias, plain.dbias, what + ": dbias");
  EXPECT_FALSE(plain.dx_sums_done) << what;
  EXPECT_EQ(with.dx_sums_done, block_rows) << what;
  if (with.dx_sums_done)
    expect_close(with.dx_sums.to(DType::f64), with.dx.to(Device::cpu()).to(DType::f64).sum({0}), tolerance(dt),
                 what + ": dx_sums against the column sums of dx");
}

TEST(CudaNormColumnSums, DxSumsAreTheColumnSumsOfDx) {
  FORGE_SKIP_WITHOUT_GPU();
  uint64_t seed = 9100;
  for (DType dt : {DType::bf16, DType::f32, DType::f16})
    for (bool add : {false, true}) {
      check_dx_sums(2100, 768, dt, add, true, seed += 10);  // 128-thread blocks walking several rows
      check_dx_sums(37, 2048, dt, add, true, seed += 10);   // wider blocks, fewer rows than blocks
    }
  check_dx_sums(300, 768, DType::bf16, true, false, seed + 10);  // the warp kernel: no sums
}

// linear(a, W, b) as the residual of add_layer_norm, with the stream h used again after it (the
// pending gradient the norm kernel adds into dx, as GPT's next block does): every gradient
// against the CPU with FORGE_NORM_BIAS_GRAD on and off, the hand-over counted exactly when on.
TEST(CudaNormColumnSums, LinearBiasGradientFromTheNormMatchesTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const int64_t R = 600, K = 256, C = 768;
  for (DType dt : {DType::bf16, DType::f32}) {
    for (const char* on : {"1", "0"}) {
      env::Override o("FORGE_NORM_BIAS_GRAD", on);
      const std::string what = std::string("c_proj bias through add_layer_norm, ") + dtype_name(dt) +
                               ", FORGE_NORM_BIAS_GRAD=" + on;
      const uint64_t seed = dt == DType::bf16 ? 9300 : 9400;
      const TensorList hosts = {host_input({R, K}, Domain::real, dt, seed),
                                ops::mul(host_input({C, K}, Domain::real, DType::f32, seed + 1), 0.1).to(dt),
                                host_input({C}, Domain::real, dt, seed + 2),
                                host_input({R, C}, Domain::real, dt, seed + 3),
                                host_input({C}, Domain::positive, dt, seed + 4),
                                host_input({C}, Domain::real, dt, seed + 5)};
      const Tensor g1 = host_input({R, C}, Domain::real, dt, seed + 6), g2 = host_input({R, C}, Domain::real, dt, seed + 7);
      auto run = [&](Device d) {
        TensorList leaves;
        for (const Tensor& h : hosts) leaves.push_back(h.to(d).detach().requires_grad_());
        const Tensor proj = ops::linear(leaves[0], leaves[1], leaves[2]);
        const ops::AddLayerNorm r = ops::add_layer_norm(leaves[3], proj, leaves[4], leaves[5]);
        // y's consumer first, h's second: h's gradient is pending when the norm node runs.
        const Tensor ly = ops::sum(ops::mul(r.y, g1.to(d)));
        const Tensor lh = ops::sum(ops::mul(r.h, g2.to(d)));
        ops::add(ly, lh).backward();
        TensorList grads;
        for (const Tensor& l : leaves) grads.push_back(l.grad());
        return grads;
      };
      const int64_t before = autograd::column_sums_handed_over();
      const TensorList gpu = run(kGpu);
      EXPECT_EQ(autograd::column_sums_handed_over() - before, std::string(on) == "1" ? 1 : 0) << what;
      const TensorList cpu = run(Device::cpu());
      const char* names[] = {"da", "dW", "db", "dx", "dln_weight", "dln_bias"};
      for (size_t i = 0; i < gpu.size(); ++i)
        expect_close(gpu[i].to(DType::f64), cpu[i].to(DType::f64).to(kGpu), tolerance(dt), what + ": " + names[i]);
    }
  }
}

}  // namespace
}  // namespace forge
