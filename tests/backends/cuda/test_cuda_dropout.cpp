// ops::dropout on the GPU against the CPU. Dropout is composed of device-dispatched ops
// (rand from the Philox stream, ge, mul, where: ops/dropout.cpp), and Note [RNG streams] makes
// element i's uniform depend only on (seed, offset + i / 4): so the same seed must give the
// same mask, bit for bit, on both devices, for every dtype, size (not a multiple of 4 too) and
// view, at any generator offset; and the backward must reuse that mask.
#include <gtest/gtest.h>

#include <string>

#include "backends/cuda/cuda_testing.h"
#include "forge/forge.h"

namespace forge {
namespace {

using namespace cuda_testing;

TEST(CudaDropout, SameMaskAndGradientAsTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64})
    for (const Shape& shape : {Shape{4, 1025}, Shape{3, 7, 33}, Shape{1}, Shape{1 << 20}})
      for (double p : {0.1, 0.5, 0.9}) {
        const std::string what = std::string(dtype_name(dt)) + " " + std::to_string(shape.size()) + "-d p " +
                                 std::to_string(p);
        SCOPED_TRACE(what);
        const Tensor xh = host_input(shape, Domain::away_from_zero, dt, seed);
        const Tensor gh = host_input(shape, Domain::real, dt, seed + 1);
        auto run = [&](Device d) {
          Generator gen(1000 + seed);
          (void)rand({5}, {}, &gen);  // a non-zero generator offset (two Philox blocks)
          Tensor x = xh.to(d).detach();
          x.requires_grad_();
          Tensor y = ops::dropout(x, p, true, &gen);
          y.backward(gh.to(d));
          return TensorList{y.detach(), x.grad(), rand({3}, {}, &gen)};
        };
        const TensorList cpu = run(Device::cpu()), gpu = run(kGpu);
        expect_equal(gpu[0], cpu[0], what + ": y");
        expect_equal(gpu[1], cpu[1], what + ": dx");
        // Both generators advanced by the same number of blocks.
        expect_equal(gpu[2], cpu[2], what + ": next draw");
        seed += 2;
      }
}

TEST(CudaDropout, NonContiguousInput) {
  FORGE_SKIP_WITHOUT_GPU();
  const Tensor xh = host_input({37, 130}, Domain::away_from_zero, DType::bf16, 77);
  auto run = [&](Device d) {
    Generator gen(9);
    return ops::dropout(xh.to(d).t(), 0.3, true, &gen);  // the mask follows the view's row-major order
  };
  expect_equal(run(kGpu), run(Device::cpu()), "dropout of a transpose");
}

}  // namespace
}  // namespace forge
