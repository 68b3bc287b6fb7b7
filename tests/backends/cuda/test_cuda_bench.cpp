// forge bench memory, layer, roofline and burn on a GPU, on tiny sizes: the copy kernels copy,
// the multiply multiplies, the mismatch counter counts, burn catches an injected corruption, the
// layer bench runs with the fused GELU, and NVML answers where the driver has it.
#include <gtest/gtest.h>

#include "cuda_testing.h"
#include "forge/backends/cuda/bench_kernels.h"
#include "forge/backends/cuda/elementwise.h"
#include "forge/backends/binary_functors.h"
#include "forge/bench/burn.h"
#include "forge/bench/layer.h"
#include "forge/bench/memory.h"
#include "forge/bench/nvml.h"
#include "forge/bench/roofline.h"

namespace forge {
namespace {

using cuda_testing::expect_equal;
using cuda_testing::kGpu;

TEST(CudaBench, CopyKernelsCopyExactly) {
  FORGE_SKIP_WITHOUT_GPU();
  // Sizes around the 16-byte words and the 4x unrolled grid-stride loop, and a tail.
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{1000}, int64_t{65536 + 3}, int64_t{3 << 20}}) {
    Tensor src = randn({n}, {.dtype = DType::f32, .device = kGpu});
    Tensor a = zeros({n}, {.dtype = DType::f32, .device = kGpu});
    Tensor b = zeros({n}, {.dtype = DType::f32, .device = kGpu});
    cuda::bench_copy_kernel(src, a);
    cuda::bench_copy_memcpy(src, b);
    expect_equal(a, src, "copy kernel n=" + std::to_string(n));
    expect_equal(b, src, "copy memcpy n=" + std::to_string(n));
  }
  // Unaligned (byte path): a view starting one bf16 element in.
  Tensor src = randn({1001}, {.dtype = DType::bf16, .device = kGpu});
  Tensor dst = zeros({1001}, {.dtype = DType::bf16, .device = kGpu});
  Tensor s1 = src.narrow(0, 1, 1000), d1 = dst.narrow(0, 1, 1000);
  cuda::bench_copy_kernel(s1, d1);
  expect_equal(d1, s1, "copy kernel, unaligned");
  // Host copies round trip.
  std::vector<float> host(4096, 0.0f);
  Tensor g = randn({4096}, {.dtype = DType::f32, .device = kGpu});
  cuda::bench_copy_to_host(g, host.data(), host.size() * 4);
  Tensor back = empty({4096}, {.dtype = DType::f32, .device = kGpu});
  cuda::bench_copy_to_device(host.data(), back, host.size() * 4);
  expect_equal(back, g, "host round trip");
}

TEST(CudaBench, MismatchCounterAndFlip) {
  FORGE_SKIP_WITHOUT_GPU();
  Tensor a = randn({1 << 20}, {.dtype = DType::bf16, .device = kGpu});
  Tensor b = a.clone();
  Tensor counter = zeros({1}, {.dtype = DType::i64, .device = kGpu});
  cuda::bench_count_mismatches(a, b, counter);
  EXPECT_EQ(counter.to(Device::cpu()).item<int64_t>(), 0);
  cuda::bench_flip_bit(b, 12345);
  cuda::bench_flip_bit(b, 12346);  // the same 32-bit word: one mismatch
  cuda::bench_flip_bit(b, int64_t{2 << 20} - 1);  // the last byte
  cuda::bench_count_mismatches(a, b, counter);
  EXPECT_EQ(counter.to(Device::cpu()).item<int64_t>(), 2);
  cuda::bench_count_mismatches(a, b, counter);  // accumulates
  EXPECT_EQ(counter.to(Device::cpu()).item<int64_t>(), 4);
  // A trailing partial word: 3 bf16 = 6 bytes.
  Tensor c = randn({3}, {.dtype = DType::bf16, .device = kGpu});
  Tensor d = c.clone();
  Tensor k2 = zeros({1}, {.dtype = DType::i64, .device = kGpu});
  cuda::bench_flip_bit(d, 5);
  cuda::bench_count_mismatches(c, d, k2);
  EXPECT_EQ(k2.to(Device::cpu()).item<int64_t>(), 1);
}

TEST(CudaBench, MemoryBenchTiny) {
  FORGE_SKIP_WITHOUT_GPU();
  bench::MemoryOptions o;
  o.device = kGpu;
  o.sizes = {65536, 1 << 20};
  o.repeats = 3;
  o.warmup_ms = 1;
  const bench::MemoryReport r = bench::run_memory(o);
  EXPECT_EQ(r.timer, "cuda events");
  EXPECT_TRUE(r.skipped.empty()) << r.skipped[0].reason;
  int copies = 0, multiplies = 0, host = 0;
  for (const auto& x : r.results) {
    EXPECT_GT(x.median_ms, 0) << x.kernel;
    EXPECT_GT(x.gbs, 0) << x.kernel;
    EXPECT_LT(x.gbs, 100000) << x.kernel;  // beyond any GPU's L2: a timing bug
    copies += x.kernel == "copy";
    multiplies += x.kernel == "multiply";
    host += x.kernel.rfind("h2d", 0) == 0 || x.kernel.rfind("d2h", 0) == 0;
    if (x.kernel == "copy") {
      EXPECT_TRUE(x.note == "kernel" || x.note == "memcpy") << x.note;
    }
  }
  EXPECT_EQ(copies, 2);
  EXPECT_EQ(multiplies, 2);
  EXPECT_EQ(host, 4);
  // The multiply the bench times (cuda::binary mul) against the CPU.
  Tensor a = randn({1 << 20}, {.dtype = DType::f32});
  Tensor b = randn({1 << 20}, {.dtype = DType::f32});
  Tensor c = empty({1 << 20}, {.dtype = DType::f32, .device = kGpu});
  cuda::binary(BinaryOp::mul, a.to(kGpu), b.to(kGpu), c);
  expect_equal(c.to(Device::cpu()), ops::mul(a, b), "multiply");
}

TEST(CudaBench, BurnDetectsInjectedCorruption) {
  FORGE_SKIP_WITHOUT_GPU();
  bench::BurnOptions o;
  o.device = kGpu;
  o.dtype = DType::bf16;
  o.size = 512;
  o.seconds = 0.3;
  o.interval_s = 0.1;
  o.chunk_s = 0.02;
  const bench::BurnReport clean = bench::run_burn(o);
  EXPECT_EQ(clean.errors, 0);
  EXPECT_GT(clean.checks, 2);
  EXPECT_GT(clean.mean_tflops, 0);
  ASSERT_FALSE(clean.rows.empty());
  if (clean.nvml) {
    EXPECT_GT(clean.rows.back().sm_clock_mhz, 0);
    EXPECT_GT(clean.rows.back().temperature_c, 0);
    EXPECT_GT(clean.rows.back().power_w, 0);
  }
  o.inject_error_at_check = 2;
  const bench::BurnReport bad = bench::run_burn(o);
  EXPECT_EQ(bad.errors, 1);
}

TEST(CudaBench, LayerBenchRunsFused) {
  FORGE_SKIP_WITHOUT_GPU();
  bench::LayerOptions o;
  o.device = kGpu;
  o.config = {2, 128, 256, 4, DType::bf16};
  o.repeats = 3;
  o.warmup_ms = 1;
  const bench::LayerReport r = bench::run_layer(o);
  EXPECT_TRUE(r.fused_gelu);  // unless FORGE_GELU_FUSION=0 in the environment
  EXPECT_GT(r.block.fwd_ms, 0);
  EXPECT_GT(r.block.bwd_ms, 0);
  EXPECT_GT(r.block_tflops, 0);
  EXPECT_LT(r.block_tflops, 5000);
  ASSERT_EQ(r.parts.size(), bench::layer_parts(o.config, true).size());
  for (const auto& p : r.parts) {
    EXPECT_GT(p.time.total_ms(), 0) << p.part.name;
    EXPECT_GT(p.share, 0) << p.part.name;
  }
  // The roofline from it plus a tiny gemm/memory document.
  bench::Roofline roof = bench::roofline_from({bench::to_json(r)});
  EXPECT_FALSE(roof.points.empty());
  EXPECT_NE(bench::roofline_svg(roof).find("</svg>"), std::string::npos);
}

TEST(CudaBench, NvmlSample) {
  FORGE_SKIP_WITHOUT_GPU();
  const bench::Nvml nv;
  if (!nv.ok()) GTEST_SKIP() << nv.note();
  const bench::NvmlSample s = nv.sample(nv.device("", 0));
  EXPECT_GT(s.sm_clock_mhz, 0);
  EXPECT_GT(s.temperature_c, 0);
  EXPECT_LT(s.temperature_c, 120);
  EXPECT_GT(s.power_w, 0);
}

}  // namespace
}  // namespace forge
