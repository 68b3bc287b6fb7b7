// Note [fast SwiGLU for 16-bit data] (backends/cuda/elementwise.cu): with FORGE_SWIGLU_FAST=1
// the CUDA swiglu and its one-pass backward on bf16/f16 against the CPU and against the exact
// path, on fresh random inputs (gates from -12 to 12, so that the sigmoid's tails are in), and
// f32 unchanged bit for bit.
#include <gtest/gtest.h>

#include <string>

#include "backends/cuda/cuda_testing.h"
#include "forge/core/env.h"
#include "forge/forge.h"

namespace forge {
namespace {

using namespace cuda_testing;

struct GluResult {
  Tensor y, dgate, dup;
};

// swiglu(gate, up).backward(g) on device d with FORGE_SWIGLU_FAST = fast.
GluResult run_glu(Device d, const Tensor& gate, const Tensor& up, const Tensor& g, bool fast) {
  env::Override o("FORGE_SWIGLU_FAST", fast ? "1" : "0");
  Tensor a = gate.to(d).detach(), b = up.to(d).detach();
  a.requires_grad_();
  b.requires_grad_();
  Tensor y = ops::swiglu(a, b);
  y.backward(g.to(d));
  return {y.detach(), a.grad(), b.grad()};
}

TEST(CudaSwiGluFast, MatchesTheCpuAndTheExactPath) {
  FORGE_SKIP_WITHOUT_GPU();
  uint64_t seed = 9300;
  for (DType dt : {DType::bf16, DType::f16})
    for (const Shape& shape : {Shape{64, 5632}, Shape{33, 72}, Shape{7, 13}}) {  // vectors; a scalar tail
      const std::string what = std::string(dtype_name(dt)) + " " + shape_str(shape);
      SCOPED_TRACE(what);
      const Tensor gate = ops::mul(host_input(shape, Domain::real, DType::f32, seed++), 6.0).to(dt);
      const Tensor up = host_input(shape, Domain::real, dt, seed++);
      const Tensor g = host_input(shape, Domain::real, dt, seed++);
      const GluResult cpu = run_glu(Device::cpu(), gate, up, g, false);
      const GluResult exact = run_glu(kGpu, gate, up, g, false);
      const GluResult fast = run_glu(kGpu, gate, up, g, true);
      expect_close(fast.y, cpu.y, tolerance(dt), what + ": y against the CPU");
      expect_close(fast.dgate, cpu.dgate, tolerance(dt), what + ": dgate against the CPU");
      expect_close(fast.dup, cpu.dup, tolerance(dt), what + ": dup against the CPU");
      expect_close(fast.y, exact.y, tolerance(dt), what + ": y against the exact CUDA path");
      expect_close(fast.dgate, exact.dgate, tolerance(dt), what + ": dgate against the exact CUDA path");
      expect_close(fast.dup, exact.dup, tolerance(dt), what + ": dup against the exact CUDA path");
    }
}

TEST(CudaSwiGluFast, LeavesF32Alone) {
  FORGE_SKIP_WITHOUT_GPU();
  const Shape shape{16, 520};
  const Tensor gate = ops::mul(host_input(shape, Domain::real, DType::f32, 9400), 6.0);
  const Tensor up = host_input(shape, Domain::real, DType::f32, 9401);
  const Tensor g = host_input(shape, Domain::real, DType::f32, 9402);
  const GluResult exact = run_glu(kGpu, gate, up, g, false);
  const GluResult fast = run_glu(kGpu, gate, up, g, true);
  expect_equal(fast.y, exact.y, "f32 y");
  expect_equal(fast.dgate, exact.dgate, "f32 dgate");
  expect_equal(fast.dup, exact.dup, "f32 dup");
}

}  // namespace
}  // namespace forge
