// forge bench gemm: size/shape/dtype parsing, FLOP counting, the median, a CPU run on tiny
// sizes, and `forge bench gemm --json` run on this machine (runs <build>/forge).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "forge/bench/gemm.h"
#include "forge/core/error.h"
#include "testing/cli_testing.h"
#include "testing/tensor_testing.h"

namespace forge::bench {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::run_forge;
using testing::Stderr;

using testing::error_of;

TEST(BenchGemmParse, SizeLists) {
  EXPECT_EQ(parse_size_list("128,1024"), (std::vector<int64_t>{128, 1024}));
  EXPECT_EQ(parse_size_list(" 96 , 100 "), (std::vector<int64_t>{96, 100}));
  EXPECT_EQ(parse_size_list("128..1024"), (std::vector<int64_t>{128, 256, 512, 1024}));
  EXPECT_EQ(parse_size_list("64,256..512"), (std::vector<int64_t>{64, 256, 512}));
  EXPECT_EQ(parse_size_list("4..4"), (std::vector<int64_t>{4}));
  EXPECT_EQ(powers_of_two(128, 16384).size(), 8u);
  EXPECT_EQ(default_sizes(Device::cpu()), (std::vector<int64_t>{128, 256, 512, 1024, 2048}));
  EXPECT_EQ(default_sizes(Device::cuda(0)).back(), 16384);
  EXPECT_EQ(default_sizes(Device::cuda(0)).front(), 128);
}

TEST(BenchGemmParse, SizeListErrors) {
  for (const char* bad : {"", "128,", "abc", "0", "-5", "12.5", "128,,256", "100..200", "512..128", "1x2"}) {
    const std::string msg = error_of([&] { parse_size_list(bad); });
    EXPECT_FALSE(msg.empty()) << "'" << bad << "' was accepted";
    EXPECT_NE(msg.find("bad size"), std::string::npos) << msg;
  }
  EXPECT_NE(error_of([] { parse_size_list("128,abc"); }).find("'abc'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_size_list("100..200"); }).find("powers of two"), std::string::npos);
}

TEST(BenchGemmParse, Mnk) {
  EXPECT_EQ(parse_mnk("4096x4096x1024"), (GemmShape{4096, 4096, 1024}));
  EXPECT_EQ(parse_mnk("1X2X3"), (GemmShape{1, 2, 3}));
  for (const char* bad : {"", "4096x4096", "4096x4096x1024x2", "ax1x2", "0x1x2", "4096*4096*1024", "1x2x"}) {
    const std::string msg = error_of([&] { parse_mnk(bad); });
    EXPECT_NE(msg.find("expected MxNxK"), std::string::npos) << "'" << bad << "': " << msg;
  }
}

TEST(BenchGemmParse, Dtypes) {
  EXPECT_EQ(parse_dtype_list("f32,bf16,tf32", Device::cuda(0)), (std::vector<std::string>{"f32", "bf16", "tf32"}));
  EXPECT_EQ(parse_dtype_list("F16,f16,e4m3", Device::cuda(0)), (std::vector<std::string>{"f16", "fp8"}));
  EXPECT_EQ(parse_dtype_list("f64, f32", Device::cpu()), (std::vector<std::string>{"f64", "f32"}));
  // fp8 parses everywhere (run_gemm reports it as skipped where it cannot run).
  EXPECT_EQ(parse_dtype_list("fp8,FP8_E4M3,f32", Device::cpu()), (std::vector<std::string>{"fp8", "f32"}));
  EXPECT_EQ(parse_dtype_list("E4M3", Device::cuda(0)), (std::vector<std::string>{"fp8"}));
  // The FP8 recipes' GEMMs (Note [FP8 GEMM scales]): tensorwise is fp8.
  EXPECT_EQ(parse_dtype_list("fp8-tensorwise,fp8-rowwise,FP8-BLOCKWISE", Device::cuda(0)),
            (std::vector<std::string>{"fp8", "fp8-rowwise", "fp8-blockwise"}));
  EXPECT_NE(error_of([] { parse_dtype_list("f32,int8", Device::cuda(0)); }).find("unknown dtype 'int8'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_dtype_list("bf16", Device::cpu()); }).find("not benchmarked on the CPU"),
            std::string::npos);
  EXPECT_EQ(default_dtypes(Device::cpu()), (std::vector<std::string>{"f32", "f64"}));
  EXPECT_EQ(default_dtypes(Device::cuda(0)), (std::vector<std::string>{"f32", "tf32", "bf16", "f16", "fp8"}));
}

TEST(BenchGemm, FlopsAndMedian) {
  EXPECT_DOUBLE_EQ(gemm_flops({2, 3, 4}), 48.0);
  EXPECT_DOUBLE_EQ(gemm_flops({16384, 16384, 16384}), 2.0 * 16384.0 * 16384.0 * 16384.0);  // no int overflow
  EXPECT_DOUBLE_EQ(gemm_flops({4096, 4096, 1024}), 2.0 * 4096 * 4096 * 1024);
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2.0);
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(median({}), 0.0);
}

TEST(BenchGemm, CpuTinySizes) {
  GemmOptions o;
  o.device = Device::cpu();
  o.shapes = square_shapes({64, 128});
  o.shapes.push_back({32, 48, 16});
  o.dtypes = {"f32", "f64"};
  o.repeats = 3;
  o.warmup_runs = 1;
  o.warmup_ms = 0;
  const GemmReport r = run_gemm(o);
  EXPECT_EQ(r.device, "cpu");
  EXPECT_EQ(r.timer, "steady_clock");
  EXPECT_TRUE(r.skipped.empty());
  ASSERT_EQ(r.results.size(), 6u);
  for (const GemmResult& x : r.results) {
    EXPECT_GT(x.median_ms, 0) << x.dtype;
    EXPECT_GT(x.tflops, 0) << x.dtype;
    EXPECT_LE(x.min_ms, x.median_ms);
    EXPECT_LE(x.median_ms, x.max_ms);
    EXPECT_DOUBLE_EQ(x.flops, gemm_flops(x.shape));
    EXPECT_NEAR(x.tflops, x.flops / (x.median_ms * 1e-3) / 1e12, 1e-9 * x.tflops);
    EXPECT_EQ(x.peak_tflops, 0);  // no CPU peaks in the catalogue
  }
  EXPECT_EQ(r.results[2].shape, (GemmShape{32, 48, 16}));
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j["results"].size(), 6u);
  EXPECT_TRUE(j["results"][0]["peak_pct"].is_null());

  o.repeats = 0;
  EXPECT_NE(error_of([&] { run_gemm(o); }).find("--repeats"), std::string::npos);
}

TEST(BenchGemm, CpuSkipsFp8WithAReason) {
  GemmOptions o;
  o.device = Device::cpu();
  o.shapes = square_shapes({32});
  o.dtypes = parse_dtype_list("e4m3,f32", o.device);
  o.repeats = 1;
  o.warmup_runs = 0;
  o.warmup_ms = 0;
  const GemmReport r = run_gemm(o);
  ASSERT_EQ(r.results.size(), 1u);
  EXPECT_EQ(r.results[0].dtype, "f32");
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0].dtype, "fp8");
  EXPECT_EQ(r.skipped[0].shape, "");
  EXPECT_NE(r.skipped[0].reason.find("CUDA GPUs only"), std::string::npos) << r.skipped[0].reason;
  const nlohmann::json j = to_json(r);
  ASSERT_EQ(j["skipped"].size(), 1u);
  EXPECT_EQ(j["skipped"][0]["dtype"], "fp8");
}

// ---- the forge binary ---------------------------------------------------------------------

using BenchGemmCliTest = testing::ForgeCliTest;

TEST_F(BenchGemmCliTest, CpuJson) {
  const CliRun r = run_forge({"bench", "gemm", "--device", "cpu", "--sizes", "64,128", "--dtype", "f32", "--repeats", "3",
                              "--warmup-ms", "0", "--json"},
                             Stderr::dropped);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* k : {"benchmark", "device", "device_name", "catalogue", "method", "results", "skipped", "forge_version"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["benchmark"], "gemm");
  EXPECT_EQ(j["device"], "cpu");
  for (const char* k : {"timer", "warmup_runs", "warmup_ms", "repeats", "statistic", "flops"})
    EXPECT_TRUE(j["method"].contains(k)) << k;
  EXPECT_EQ(j["method"]["repeats"], 3);
  ASSERT_EQ(j["results"].size(), 2u);
  for (const auto& x : j["results"]) {
    for (const char* k : {"dtype", "m", "n", "k", "flops", "median_ms", "min_ms", "max_ms", "tflops", "gflops",
                          "peak_tflops", "peak_pct", "input_sets"})
      EXPECT_TRUE(x.contains(k)) << k;
    EXPECT_GT(x["gflops"].get<double>(), 0);
    EXPECT_EQ(x["dtype"], "f32");
  }
  EXPECT_EQ(j["results"][1]["m"], 128);
  EXPECT_DOUBLE_EQ(j["results"][1]["flops"].get<double>(), 2.0 * 128 * 128 * 128);
}

TEST_F(BenchGemmCliTest, CompareTuningIsAGpuMeasurement) {
  // On the CPU there is no algorithm to tune: the flag is accepted and nothing more is timed.
  const CliRun r = run_forge({"bench", "gemm", "--device", "cpu", "--sizes", "64", "--dtype", "f32", "--repeats", "2",
                              "--warmup-ms", "0", "--compare-tuning", "--json"},
                             Stderr::dropped);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["method"].contains("gemm_tuning"));
  ASSERT_EQ(j["results"].size(), 1u);
  EXPECT_FALSE(j["results"][0].contains("heuristic_median_ms"));
}

TEST_F(BenchGemmCliTest, TableMnkAndUsageErrors) {
  const CliRun r = run_forge({"bench", "gemm", "--device", "cpu", "--mnk", "64x32x16", "--mnk", "8x8x8", "--repeats", "2",
                              "--warmup-ms", "0"},
                             Stderr::dropped);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("GFLOP/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("f64"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("     64      32      16"), std::string::npos) << r.out;
  EXPECT_EQ(run_forge({"bench", "gemm", "--sizes", "12a"}, Stderr::dropped).status, 2);
  EXPECT_EQ(run_forge({"bench", "gemm", "--mnk", "4096x4096"}, Stderr::dropped).status, 2);
  EXPECT_EQ(run_forge({"bench", "gemm", "--repeats", "0"}, Stderr::dropped).status, 2);
  EXPECT_EQ(run_forge({"bench", "gemm", "--bogus"}, Stderr::dropped).status, 2);
  EXPECT_EQ(run_forge({"bench"}, Stderr::dropped).status, 2);
  EXPECT_EQ(run_forge({"bench", "gemm", "--help"}, Stderr::dropped).status, 0);
  EXPECT_EQ(run_forge({"bench", "gemm", "--device", "cpu", "--dtype", "bf16", "--sizes", "8"}, Stderr::dropped).status, 1);  // not on the CPU
}

}  // namespace
}  // namespace forge::bench
