// forge bench gemm on a GPU: the cuBLASLt path timed with CUDA events gives positive, sane
// throughput in every dtype (fp8 where the GPU has FP8 GEMMs, else reported as skipped), and
// allow_tf32 is restored; --compare-tuning times the heuristic's and the tuned algorithm.
#include <gtest/gtest.h>

#include <map>

#include "cuda_testing.h"
#include "forge/backends/cuda/event_timer.h"
#include "forge/backends/cuda/fp8.h"
#include "forge/backends/cuda/gemm_fp8.h"
#include "forge/backends/cuda/matmul.h"
#include "forge/bench/gemm.h"

namespace forge {
namespace {

TEST(CudaBenchGemm, AllDtypesOnSmallSizes) {
  FORGE_SKIP_WITHOUT_GPU();
  const bool tf32_before = cuda::allow_tf32();
  bench::GemmOptions o;
  o.device = Device::cuda(0);
  o.shapes = bench::square_shapes({256, 1024});
  o.shapes.push_back({512, 768, 384});
  o.dtypes = bench::default_dtypes(o.device);  // f32 tf32 bf16 f16 fp8
  o.repeats = 5;
  o.warmup_ms = 5;
  const bench::GemmReport r = bench::run_gemm(o);
  EXPECT_EQ(cuda::allow_tf32(), tf32_before);
  EXPECT_EQ(r.timer, "cuda events");
  EXPECT_FALSE(r.device_name.empty());
  if (cuda::fp8_gemm_supported(0)) {
    ASSERT_EQ(r.results.size(), 15u);  // 5 dtypes x 3 shapes (all multiples of 16)
    EXPECT_TRUE(r.skipped.empty());
    EXPECT_EQ(r.results.back().dtype, "fp8");
  } else {
    ASSERT_EQ(r.results.size(), 12u);  // 4 dtypes x 3 shapes
    ASSERT_EQ(r.skipped.size(), 1u);
    EXPECT_EQ(r.skipped[0].dtype, "fp8");
    EXPECT_NE(r.skipped[0].reason.find("compute capability >= 8.9"), std::string::npos);
  }
  for (const auto& x : r.results) {
    EXPECT_GT(x.median_ms, 0) << x.dtype << " " << x.shape.m;
    EXPECT_GT(x.tflops, 0) << x.dtype;
    EXPECT_LT(x.tflops, 5000) << x.dtype;  // beyond any GPU: a timing bug
    EXPECT_EQ(x.input_sets, 3);
    if (!r.catalogue.empty()) {
      EXPECT_GT(x.peak_tflops, 0) << x.dtype;
      EXPECT_LT(x.peak_pct, 150) << x.dtype;
    }
  }
}

// The FP8 recipes' GEMM rates (fp8-rowwise: outer-vector scales, fp8-blockwise: 1 x 128 by
// 128 x 128 blocks; Hopper with cuBLASLt 12.9), beside tensorwise's; a size that is not a multiple
// of 128 is skipped for blockwise with the reason.
TEST(CudaBenchGemm, Fp8RecipesRates) {
  FORGE_SKIP_WITHOUT_GPU();
  if (!cuda::fp8_gemm_supported(0)) GTEST_SKIP() << "cuda:0 has no FP8 GEMMs";
  bench::GemmOptions o;
  o.device = Device::cuda(0);
  o.shapes = {{1024, 1024, 1024}, {512, 768, 384}, {256, 256, 272}};
  o.dtypes = {"fp8", "fp8-rowwise", "fp8-blockwise"};
  o.repeats = 3;
  o.warmup_ms = 2;
  const bench::GemmReport r = bench::run_gemm(o);
  int blockwise_skips = 0;
  for (const auto& s : r.skipped) {
    if (s.dtype == "fp8-blockwise" && s.reason.find("multiples of 128") != std::string::npos) ++blockwise_skips;
  }
  EXPECT_EQ(blockwise_skips, 1) << "256 x 256 x 272 for blockwise";
  std::map<std::string, int> measured;
  for (const auto& x : r.results) {
    ++measured[x.dtype];
    EXPECT_GT(x.tflops, 0) << x.dtype;
    EXPECT_LT(x.tflops, 5000) << x.dtype;
  }
  EXPECT_EQ(measured["fp8"], 3);
  if (cuda::fp8_scale_mode_supported(0, cuda::Fp8ScaleMode::outer)) {
    EXPECT_EQ(measured["fp8-rowwise"], 3);
    EXPECT_EQ(measured["fp8-blockwise"], 2);
  } else {
    EXPECT_EQ(measured["fp8-rowwise"], 0);
    EXPECT_EQ(measured["fp8-blockwise"], 0);
  }
}

TEST(CudaBenchGemm, CompareTuningTimesTheHeuristicAndTheTunedAlgorithm) {
  FORGE_SKIP_WITHOUT_GPU();
  const bool tuning_before = cuda::gemm_tuning();
  bench::GemmOptions o;
  o.device = Device::cuda(0);
  o.shapes = {{512, 768, 384}};
  o.dtypes = {"f32", "bf16"};
  o.repeats = 3;
  o.warmup_ms = 2;
  o.compare_tuning = true;
  const bench::GemmReport r = bench::run_gemm(o);
  EXPECT_EQ(cuda::gemm_tuning(), tuning_before);
  EXPECT_EQ(r.gemm_tuning, "compare");
  ASSERT_EQ(r.results.size(), 2u);
  for (const auto& x : r.results) {
    EXPECT_GT(x.heuristic_median_ms, 0) << x.dtype;
    EXPECT_GT(x.median_ms, 0) << x.dtype;
  }
  const nlohmann::json j = bench::to_json(r);
  EXPECT_EQ(j["method"]["gemm_tuning"], "compare");
  EXPECT_TRUE(j["results"][0].contains("heuristic_median_ms"));
  EXPECT_TRUE(j.contains("gemm_fallback_shapes"));
  o.compare_tuning = false;
  EXPECT_EQ(bench::run_gemm(o).gemm_tuning, tuning_before ? "cached" : "off");
}

TEST(CudaBenchGemm, EventTimerMeasuresEachRun) {
  FORGE_SKIP_WITHOUT_GPU();
  int calls = 0;
  const auto ms = cuda::time_with_events(0, 4, [&] { ++calls; });
  EXPECT_EQ(calls, 4);
  ASSERT_EQ(ms.size(), 4u);
  for (double m : ms) EXPECT_GE(m, 0);
  EXPECT_TRUE(cuda::time_with_events(0, 0, [] {}).empty());
}

}  // namespace
}  // namespace forge
