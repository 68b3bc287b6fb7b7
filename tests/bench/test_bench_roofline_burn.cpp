// forge bench roofline (ridge point, roofs, points from the other benchmarks' JSON, the SVG) and
// forge bench burn on the CPU (checking, the injected corruption, rows), with their CLI.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>
#include <string>

#include "forge/bench/burn.h"
#include "forge/bench/roofline.h"
#include "forge/core/error.h"
#include "testing/cli_testing.h"

namespace forge::bench {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::run_forge;
using testing::Stderr;

nlohmann::json gemm_doc() {
  return nlohmann::json::parse(R"({"benchmark": "gemm", "device": "cuda:0", "device_name": "Test GPU", "results": [
    {"dtype": "bf16", "m": 4096, "n": 4096, "k": 4096, "flops": 137438953472.0, "median_ms": 0.2},
    {"dtype": "bf16", "m": 1024, "n": 1024, "k": 1024, "flops": 2147483648.0, "median_ms": 0.01},
    {"dtype": "f32", "m": 4096, "n": 4096, "k": 4096, "flops": 137438953472.0, "median_ms": 2.5}]})");
}

nlohmann::json memory_doc() {
  return nlohmann::json::parse(R"({"benchmark": "memory", "device": "cuda:0", "device_name": "Test GPU", "results": [
    {"kernel": "copy", "dtype": "f32", "elements": 1073741824, "bytes": 8589934592.0, "flops": 0, "median_ms": 2.86,
     "gbs": 3000.0, "note": "kernel"},
    {"kernel": "copy_memcpy", "dtype": "f32", "elements": 1073741824, "bytes": 8589934592.0, "flops": 0,
     "median_ms": 2.7, "gbs": 3180.0, "note": ""},
    {"kernel": "multiply", "dtype": "f32", "elements": 1048576, "bytes": 12582912.0, "flops": 1048576.0,
     "median_ms": 0.01, "gbs": 1258.0}]})");
}

TEST(BenchRoofline, RidgeAndRoof) {
  EXPECT_DOUBLE_EQ(ridge_point(1000, 2000), 500);  // 1e15 FLOP/s / 2e12 B/s
  EXPECT_DOUBLE_EQ(ridge_point(1000, 0), 0);
  EXPECT_DOUBLE_EQ(attainable_tflops(100, 1000, 2000), 200);   // below the ridge: bandwidth x intensity
  EXPECT_DOUBLE_EQ(attainable_tflops(1000, 1000, 2000), 1000);  // above: the peak
}

TEST(BenchRoofline, FromJsonDocuments) {
  const Roofline r = roofline_from({gemm_doc(), memory_doc(), nlohmann::json{{"benchmark", "burn"}}});
  EXPECT_EQ(r.device, "cuda:0");
  EXPECT_EQ(r.device_name, "Test GPU");
  EXPECT_DOUBLE_EQ(r.bandwidth_gbs, 3000.0);  // "copy" only, copy_memcpy is a detail row
  EXPECT_EQ(r.bandwidth_from, "copy 1G (kernel)");
  ASSERT_EQ(r.compute.size(), 2u);
  EXPECT_EQ(r.compute[0].dtype, "bf16");  // best first
  EXPECT_NEAR(r.compute[0].tflops, 137438953472.0 / 0.2e-3 / 1e12, 1e-9);
  EXPECT_EQ(r.compute[0].from, "gemm bf16 4096");
  ASSERT_EQ(r.points.size(), 4u);  // 3 GEMMs + multiply (the copies have no FLOPs)
  EXPECT_DOUBLE_EQ(r.points[0].bytes, 3.0 * 4096 * 4096 * 2);
  EXPECT_NEAR(r.points[0].intensity(), 4096.0 / 3, 1e-9);
  const RooflinePoint& mul = r.points[3];
  EXPECT_EQ(mul.name, "multiply 1M");
  EXPECT_NEAR(mul.intensity(), 1.0 / 12, 1e-12);
  EXPECT_EQ(ceiling_for(r, "f32")->dtype, "f32");
  EXPECT_EQ(ceiling_for(r, "f16")->dtype, "f32");  // no f16 roof: f32's
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j["points"].size(), 4u);
  EXPECT_EQ(j["points"][3]["bound"], "memory");
  EXPECT_EQ(j["points"][0]["bound"], "compute");
  EXPECT_NEAR(j["compute_ceilings"][0]["ridge_flop_per_byte"].get<double>(), ridge_point(r.compute[0].tflops, 3000), 1e-9);
}

TEST(BenchRoofline, Svg) {
  Roofline r = roofline_from({gemm_doc(), memory_doc()});
  r.points.push_back(RooflinePoint{"a<b>&\"c\"", "norm", "bf16", 1e6, 1e6, 0.01});
  const std::string svg = roofline_svg(r);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("TFLOP/s"), std::string::npos);
  EXPECT_NE(svg.find("3000 GB/s (best copy)"), std::string::npos);
  EXPECT_NE(svg.find("bf16 peak"), std::string::npos);
  EXPECT_NE(svg.find("ridge"), std::string::npos);
  EXPECT_NE(svg.find(">gemm bf16 4096<"), std::string::npos);
  EXPECT_NE(svg.find("a&lt;b&gt;&amp;&quot;c&quot;"), std::string::npos);  // escaped
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  EXPECT_NE(roofline_svg(Roofline{}).find("</svg>"), std::string::npos);  // empty: still a valid plot
}

TEST(BenchBurn, CpuCleanAndInjected) {
  BurnOptions o;
  o.device = Device::cpu();
  o.seconds = 0.15;
  o.size = 64;
  o.interval_s = 0.05;
  o.chunk_s = 0.01;
  int rows = 0;
  const BurnReport r = run_burn(o, [&](const BurnRow&) { ++rows; });
  EXPECT_EQ(r.errors, 0);
  EXPECT_GT(r.checks, 1);
  EXPECT_GT(r.iterations, r.checks - 1);
  EXPECT_GE(r.seconds, 0.15);
  EXPECT_EQ(rows, static_cast<int>(r.rows.size()));
  ASSERT_GE(r.rows.size(), 2u);
  EXPECT_GT(r.rows.back().tflops, 0);
  EXPECT_EQ(r.rows.back().sm_clock_mhz, -1);
  EXPECT_DOUBLE_EQ(r.flops_per_gemm, 2.0 * 64 * 64 * 64);
  EXPECT_GT(r.mean_tflops, 0);

  o.inject_error_at_check = 1;
  const BurnReport bad = run_burn(o);
  EXPECT_EQ(bad.errors, 1);  // one flipped bit = one word; later checks see fresh products
  const nlohmann::json j = to_json(bad);
  EXPECT_EQ(j["errors"], 1);
  EXPECT_TRUE(j["rows"][0]["power_w"].is_null());
  EXPECT_EQ(j["dtype"], "f32");

  o.dtype = DType::bf16;
  EXPECT_THROW(run_burn(o), Error);  // not on the CPU
  EXPECT_EQ(default_burn_size(Device::cuda(0)), 8192);
  EXPECT_EQ(default_burn_dtype(Device::cuda(0)), DType::bf16);
}

// ---- the forge binary ---------------------------------------------------------------------

using BenchRooflineBurnCliTest = testing::ForgeCliTest;

TEST_F(BenchRooflineBurnCliTest, RooflineFromFiles) {
  const fs::path dir = fs::temp_directory_path() / ("forge_roofline_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "g.json") << gemm_doc().dump();
  std::ofstream(dir / "m.json") << memory_doc().dump();
  const std::string svg = (dir / "plot.svg").string();
  const CliRun r = run_forge({"bench", "roofline", "--from", (dir / "g.json").string(), "--from", (dir / "m.json").string(),
                              "--svg", svg, "--json"},
                             Stderr::dropped);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["benchmark"], "roofline");
  EXPECT_EQ(j["svg"], svg);
  EXPECT_EQ(j["points"].size(), 4u);
  std::ifstream in(svg);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("</svg>"), std::string::npos);
  const CliRun t = run_forge({"bench", "roofline", "--from", (dir / "g.json").string(), "--svg", svg}, Stderr::dropped);
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_NE(t.out.find("ridge point"), std::string::npos) << t.out;
  std::ofstream(dir / "bad.json") << "not json";
  EXPECT_EQ(run_forge({"bench", "roofline", "--from", (dir / "bad.json").string(), "--svg", svg}, Stderr::dropped).status, 1);
  EXPECT_EQ(run_forge({"bench", "roofline", "--from", (dir / "missing.json").string()}, Stderr::dropped).status, 2);
  fs::remove_all(dir);
}

TEST_F(BenchRooflineBurnCliTest, BurnExitStatus) {
  const CliRun ok = run_forge({"bench", "burn", "--device", "cpu", "--seconds", "0.2", "--size", "64", "--interval", "0.1"},
                              Stderr::dropped);
  ASSERT_EQ(ok.status, 0) << ok.out;
  EXPECT_NE(ok.out.find("errors"), std::string::npos) << ok.out;
  const CliRun bad = run_forge({"bench", "burn", "--device", "cpu", "--seconds", "0.2", "--size", "64", "--interval", "0.1",
                                "--inject-error", "0", "--json"});
  EXPECT_EQ(bad.status, 1) << bad.out;
  EXPECT_NE(bad.out.find("mismatching words"), std::string::npos) << bad.out;
  EXPECT_EQ(run_forge({"bench", "burn", "--seconds", "0"}, Stderr::dropped).status, 2);
}

}  // namespace
}  // namespace forge::bench
