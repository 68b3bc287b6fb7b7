// The CUDA conv2d / max_pool2d kernels (backends/cuda/conv.cu) against the CPU backend,
// forward and backward through autograd, in f32, bf16 and f16 (f64 for one shape): LeNet's
// layers (1 -> 6 channels 5x5 with padding 2 on 28x28, 6 -> 16 channels 5x5 on 14x14, 2x2
// pooling), stride 2, rectangular kernels, no bias, a channels-last (non-contiguous) input, a
// batch of 256, and overlapping pooling windows with ties (integral values) whose indices and
// gradients must match the CPU exactly.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/cuda_testing.h"
#include "forge/forge.h"

namespace forge {
namespace {

using namespace cuda_testing;

struct ConvCase {
  const char* name;
  Shape x, w;
  bool bias;
  ops::Size2 stride, padding;
  bool channels_last;  // x given as the (N, H, W, C) permute of a contiguous tensor
};

// conv2d on device d over fresh leaves; returns {out, dx, dw, db}.
TensorList run_conv(Device d, const ConvCase& c, const Tensor& xh, const Tensor& wh, const Tensor& bh,
                    const Tensor& gh) {
  auto leaf = [d](const Tensor& h) {
    if (!h.defined()) return Tensor();
    Tensor t = h.to(d).detach();
    t.requires_grad_();
    return t;
  };
  Tensor x = leaf(xh), w = leaf(wh), b = leaf(bh);
  const Tensor xin = c.channels_last ? x.permute({0, 3, 1, 2}) : x;
  Tensor y = ops::conv2d(xin, w, b, c.stride, c.padding);
  y.backward(gh.to(d));
  return {y.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : Tensor()};
}

void expect_conv_matches(const ConvCase& c, DType dt, double tol, uint64_t seed) {
  SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
  const Shape xs = c.channels_last ? Shape{c.x[0], c.x[2], c.x[3], c.x[1]} : c.x;
  const Tensor xh = host_input(xs, Domain::real, dt, seed);
  const Tensor wh = host_input(c.w, Domain::real, dt, seed + 1);
  const Tensor bh = c.bias ? host_input({c.w[0]}, Domain::real, dt, seed + 2) : Tensor();
  Shape out_shape;
  {
    NoGradGuard no_grad;
    const Tensor xin = c.channels_last ? xh.permute({0, 3, 1, 2}) : xh;
    out_shape = ops::conv2d(xin, wh, bh, c.stride, c.padding).shape();
  }
  const Tensor gh = host_input(out_shape, Domain::real, dt, seed + 3);
  const TensorList cpu = run_conv(Device::cpu(), c, xh, wh, bh, gh);
  const TensorList gpu = run_conv(kGpu, c, xh, wh, bh, gh);
  const char* names[] = {"out", "dx", "dweight", "dbias"};
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_EQ(cpu[i].defined(), gpu[i].defined()) << names[i];
    if (cpu[i].defined()) expect_close(gpu[i], cpu[i], tol, std::string(c.name) + ": " + names[i]);
  }
}

const ConvCase kConvCases[] = {
    {"LeNet conv1: (16, 1, 28, 28) * (6, 1, 5, 5), padding 2", {16, 1, 28, 28}, {6, 1, 5, 5}, true, {1, 1}, {2, 2},
     false},
    {"LeNet conv2: (16, 6, 14, 14) * (16, 6, 5, 5)", {16, 6, 14, 14}, {16, 6, 5, 5}, true, {1, 1}, {0, 0}, false},
    {"stride 2, padding 1, 3x3: (4, 3, 15, 16) * (5, 3, 3, 3)", {4, 3, 15, 16}, {5, 3, 3, 3}, true, {2, 2}, {1, 1},
     false},
    {"rectangular 2x4 kernel, stride (1, 3), no bias", {3, 2, 9, 13}, {4, 2, 2, 4}, false, {1, 3}, {0, 1}, false},
    {"channels-last x: (8, 4, 12, 12) * (6, 4, 3, 3)", {8, 4, 12, 12}, {6, 4, 3, 3}, true, {1, 1}, {1, 1}, true},
};

class CudaConv : public ::testing::TestWithParam<DType> {};

TEST_P(CudaConv, MatchesTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  uint64_t seed = 10;
  for (const ConvCase& c : kConvCases) {
    // f32: dweight sums N * Ho * Wo products (12544 for conv1), which the CPU's f32 GEMMs
    // accumulate with ~1e-6 relative error; the GPU sums in f64.
    expect_conv_matches(c, dt, tolerance(dt), seed);
    seed += 4;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaConv, ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

TEST(CudaConv, F64) {
  FORGE_SKIP_WITHOUT_GPU();
  expect_conv_matches(kConvCases[2], DType::f64, 1e-12, 50);
}

TEST(CudaConv, LeNetBatchOf256) {
  FORGE_SKIP_WITHOUT_GPU();
  const ConvCase c{"LeNet conv1, batch 256", {256, 1, 28, 28}, {6, 1, 5, 5}, true, {1, 1}, {2, 2}, false};
  // dweight/dbias sum 256 * 28 * 28 = 200704 products per element; the CPU accumulates them in
  // f32 (per-sample GEMMs, then per-thread partials): its own error reaches ~1e-5.
  expect_conv_matches(c, DType::f32, 1e-4, 60);
  expect_conv_matches(c, DType::bf16, tolerance(DType::bf16), 64);
}

// ---- max_pool2d ------------------------------------------------------------------------

struct PoolCase {
  const char* name;
  Shape x;
  ops::Size2 kernel, stride, padding;
  bool transposed;  // x given as the (N, C, W, H) transpose of a contiguous tensor
};

const PoolCase kPoolCases[] = {
    {"LeNet 2x2: (16, 6, 28, 28)", {16, 6, 28, 28}, {2, 2}, {0, 0}, {0, 0}, false},
    {"overlapping 3x3 stride 2 padding 1: (4, 3, 15, 17)", {4, 3, 15, 17}, {3, 3}, {2, 2}, {1, 1}, false},
    {"3x2 stride 1 (heavily overlapping): (2, 2, 9, 7)", {2, 2, 9, 7}, {3, 2}, {1, 1}, {0, 0}, false},
    {"transposed x, 2x2: (3, 4, 10, 12)", {3, 4, 10, 12}, {2, 2}, {0, 0}, {0, 0}, true},
};

// Integral values make many ties: the first maximum in row-major window order must win on both.
TEST(CudaMaxPool, ValuesIndicesAndGradientsEqualTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  uint64_t seed = 70;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64})
    for (const PoolCase& c : kPoolCases)
      for (Domain dom : {Domain::real, Domain::integral}) {
        const std::string what = std::string(c.name) + " " + dtype_name(dt) +
                                 (dom == Domain::integral ? " (ties)" : "");
        SCOPED_TRACE(what);
        const Shape xs = c.transposed ? Shape{c.x[0], c.x[1], c.x[3], c.x[2]} : c.x;
        const Tensor xh = host_input(xs, dom, dt, seed++);
        auto run = [&](Device d, const Tensor& gh) {
          Tensor leaf = xh.to(d).detach();
          leaf.requires_grad_();
          const Tensor xin = c.transposed ? leaf.transpose(2, 3) : leaf;
          const ops::ValuesIndices r = ops::max_pool2d_with_indices(xin, c.kernel, c.stride, c.padding);
          if (gh.defined()) r.values.backward(gh.to(d));
          return TensorList{r.values.detach(), r.indices, gh.defined() ? leaf.grad() : Tensor()};
        };
        Tensor gh;
        {
          NoGradGuard no_grad;
          gh = host_input(run(Device::cpu(), Tensor())[0].shape(), Domain::real, dt, seed++);
        }
        const TensorList cpu = run(Device::cpu(), gh), gpu = run(kGpu, gh);
        expect_equal(gpu[0], cpu[0], what + ": values");
        expect_equal(gpu[1], cpu[1], what + ": indices");
        // Each input element sums the same outputs in the same order, in f64 on both.
        expect_equal(gpu[2], cpu[2], what + ": dx");
      }
}

}  // namespace
}  // namespace forge
