// The CUDA rope kernel (backends/cuda/rope.cu) against the CPU backend, forward and backward
// (the inverse rotation) through autograd, in f32, bf16, f16 and f64: position offsets 0, 7 and
// 100000 (angles of 10^5 radians: the f64 angle reduction keeps f32 accuracy), the attention
// layout (B, T, H, D) viewed as (B, H, T, D) (16-byte vector path), a strided last dim and a
// head size whose half is not a multiple of the vector width (scalar path), and D = 2.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "backends/cuda/cuda_testing.h"
#include "forge/core/env.h"
#include "forge/forge.h"

namespace forge {
namespace {

using namespace cuda_testing;

// rope(view(leaf)) on device d; returns the output and the leaf's gradient for upstream g.
std::pair<Tensor, Tensor> run_rope(Device d, const Tensor& host, const std::function<Tensor(const Tensor&)>& view,
                                   int64_t offset, const Tensor& g_host) {
  Tensor leaf = host.to(d).detach();
  leaf.requires_grad_();
  Tensor y = ops::rope(view(leaf), offset, 10000.0);
  y.backward(g_host.to(d));
  return {y.detach(), leaf.grad()};
}

struct Layout {
  const char* name;
  Shape host;  // the leaf's shape
  std::function<Tensor(const Tensor&)> view;
};

class CudaRope : public ::testing::TestWithParam<DType> {};

TEST_P(CudaRope, MatchesTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const Layout layouts[] = {
      {"contiguous (2, 3, 17, 64)", {2, 3, 17, 64}, [](const Tensor& t) { return t; }},
      {"(B, T, H, D) as (B, H, T, D): (2, 17, 4, 32)", {2, 17, 4, 32},
       [](const Tensor& t) { return t.transpose(1, 2); }},
      {"every other element of D: (1, 2, 9, 16) from (1, 2, 9, 32)", {1, 2, 9, 32},
       [](const Tensor& t) { return t.slice(3, 0, 32, 2); }},
      {"D = 12 (half not a multiple of 8 or 4)", {2, 2, 5, 12}, [](const Tensor& t) { return t; }},
      {"D = 2", {1, 3, 6, 2}, [](const Tensor& t) { return t; }},
      {"one batch, one head: (1, 1, 33, 128)", {1, 1, 33, 128}, [](const Tensor& t) { return t; }},
  };
  uint64_t seed = 10;
  for (const Layout& l : layouts)
    for (int64_t offset : {0, 7, 100000}) {
      const std::string what = std::string(l.name) + ", offset " + std::to_string(offset);
      SCOPED_TRACE(what);
      const Tensor x = host_input(l.host, Domain::real, dt, seed++);
      const Shape out_shape = l.view(x).shape();
      const Tensor g = host_input(out_shape, Domain::real, dt, seed++);
      const auto [y_cpu, dx_cpu] = run_rope(Device::cpu(), x, l.view, offset, g);
      const auto [y_gpu, dx_gpu] = run_rope(kGpu, x, l.view, offset, g);
      // f64: the device's pow may differ from the host's by an ulp in theta^(-2i/D), which an
      // angle of 10^5 rad turns into ~1e-11; f32/bf16/f16 round far above that.
      const double tol = dt == DType::f64 ? 1e-9 : tolerance(dt);
      expect_close(y_gpu, y_cpu, tol, what + ": y");
      expect_close(dx_gpu, dx_cpu, tol, what + ": dx");
    }
}

// Note [packed positions]: per-token positions (B, T), restarting per packed document, on the
// plane kernel (vector rows) and the grid-stride one (a head size off the vector width).
TEST_P(CudaRope, PositionsMatchTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  uint64_t seed = 40;
  for (const Layout& l : {Layout{"(B, T, H, D) as (B, H, T, D): (2, 17, 4, 64)", {2, 17, 4, 64},
                                 [](const Tensor& t) { return t.transpose(1, 2); }},
                          Layout{"D = 12", {2, 2, 17, 12}, [](const Tensor& t) { return t; }}}) {
    SCOPED_TRACE(l.name);
    std::vector<int64_t> pos;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = 0; t < 17; ++t) pos.push_back(b == 0 ? t % 5 : (t < 9 ? t + 3 : t - 9));
    const Tensor p = from_vector(pos, {2, 17});
    const Tensor x = host_input(l.host, Domain::real, dt, seed++);
    const Tensor g = host_input(l.view(x).shape(), Domain::real, dt, seed++);
    auto run = [&](Device d) {
      Tensor leaf = x.to(d).detach();
      leaf.requires_grad_();
      Tensor y = ops::rope(l.view(leaf), p.to(d), 20, 10000.0);
      y.backward(g.to(d));
      return std::pair{y.detach(), leaf.grad()};
    };
    const auto [y_cpu, dx_cpu] = run(Device::cpu());
    const auto [y_gpu, dx_gpu] = run(kGpu);
    const double tol = dt == DType::f64 ? 1e-9 : tolerance(dt);
    expect_close(y_gpu, y_cpu, tol, std::string(l.name) + ": y");
    expect_close(dx_gpu, dx_cpu, tol, std::string(l.name) + ": dx");
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaRope, ::testing::Values(DType::f32, DType::bf16, DType::f16, DType::f64),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

// LLaMA-3 scaling (backends/rope_functors.h): the device's frequency table is the host's formula.
TEST(CudaRope, Llama3ScalingMatchesTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const ops::RopeScaling s{.factor = 32.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0, .original_context = 8192.0};
  const Tensor x = host_input({2, 4, 33, 64}, Domain::real, DType::f32, 97);
  for (int64_t offset : {0, 5000}) {
    const Tensor y_cpu = ops::rope(x, offset, 500000.0, s);
    const Tensor y_gpu = ops::rope(x.to(kGpu), offset, 500000.0, s);
    expect_close(y_gpu, y_cpu, tolerance(DType::f32), "llama3 offset " + std::to_string(offset));
  }
}

// The output (and the gradient) keep the input's memory order: LLaMA's (B, T, H, D)
// projections viewed as (B, H, T, D) stay (B, T, H, D) through rope, so the head merge after
// attention is a view; the strided D case (last stride 2) is written contiguous.
TEST(CudaRope, OutputKeepsTheInputsMemoryOrder) {
  FORGE_SKIP_WITHOUT_GPU();
  Tensor leaf = host_input({2, 17, 4, 32}, Domain::real, DType::bf16, 95).to(kGpu).detach().requires_grad_();
  Tensor y = ops::rope(leaf.transpose(1, 2), 3);
  EXPECT_TRUE(y.transpose(1, 2).is_contiguous());
  y.backward(ones_like(y));
  EXPECT_TRUE(leaf.grad().is_contiguous());
  const Tensor strided = host_input({1, 2, 9, 32}, Domain::real, DType::bf16, 96).to(kGpu).slice(3, 0, 32, 2);
  EXPECT_TRUE(ops::rope(strided).is_contiguous());
}

TEST(CudaRope, InverseUndoesTheRotation) {
  FORGE_SKIP_WITHOUT_GPU();
  // The backward of rope is the inverse rotation: rope^T(rope(x)) = x, so the gradient of
  // <rope(x), rope(x)> / 2 is x itself.
  const Tensor x = host_input({2, 4, 31, 64}, Domain::real, DType::f32, 90).to(kGpu).detach();
  Tensor leaf = x.detach();
  leaf.requires_grad_();
  Tensor y = ops::rope(leaf, 123, 10000.0);
  y.backward(y.detach());
  expect_close(leaf.grad(), x, 1e-6, "rope^-1(rope(x)) = x");
}

// Note [rope planes] (FORGE_ROPE_PLANES=1): the 2-D grid writes the bits of the grid-stride kernel,
// forward and backward, wherever it runs (16-byte rows in f32, bf16 and f16; LLaMA's attention
// layout, contiguous heads, D = 64 and 128, a plane whose items are not a multiple of the block, a
// position offset), and the paths it leaves alone (a strided last dim, D = 12) are unchanged.
TEST(CudaRope, PlanesAreTheGridStrideKernelsBits) {
  FORGE_SKIP_WITHOUT_GPU();
  const Layout layouts[] = {
      {"LLaMA's (B, T, H, D) as (B, H, T, D): (2, 300, 8, 64)", {2, 300, 8, 64},
       [](const Tensor& t) { return t.transpose(1, 2); }},
      {"contiguous (3, 5, 33, 128)", {3, 5, 33, 128}, [](const Tensor& t) { return t; }},
      {"every other element of D: (1, 2, 9, 16) from (1, 2, 9, 32)", {1, 2, 9, 32},
       [](const Tensor& t) { return t.slice(3, 0, 32, 2); }},
      {"D = 12", {2, 2, 5, 12}, [](const Tensor& t) { return t; }},
  };
  uint64_t seed = 9500;
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (const Layout& l : layouts)
      for (int64_t offset : {0, 11}) {
        const std::string what = std::string(dtype_name(dt)) + " " + l.name + ", offset " + std::to_string(offset);
        SCOPED_TRACE(what);
        const Tensor x = host_input(l.host, Domain::real, dt, seed++);
        const Tensor g = host_input(l.view(x).shape(), Domain::real, dt, seed++);
        auto run = [&](const char* planes) {
          env::Override o("FORGE_ROPE_PLANES", planes);
          return run_rope(kGpu, x, l.view, offset, g);
        };
        const auto [y_stride, dx_stride] = run("0");
        const auto [y_planes, dx_planes] = run("1");
        expect_equal(y_planes, y_stride, what + ": y");
        expect_equal(dx_planes, dx_stride, what + ": dx");
        const auto [y_cpu, dx_cpu] = run_rope(Device::cpu(), x, l.view, offset, g);
        expect_close(y_planes, y_cpu, tolerance(dt), what + ": y against the CPU");
      }
}

}  // namespace
}  // namespace forge
