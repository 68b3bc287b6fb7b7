// forge bench memory and layer: element-count parsing, byte/FLOP counting, the layer's FLOP
// formulas and parts, the CPU benchmarks on tiny sizes, and their CLI (runs <build>/forge).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "forge/bench/layer.h"
#include "forge/bench/memory.h"
#include "forge/core/error.h"
#include "testing/cli_testing.h"
#include "testing/tensor_testing.h"

namespace forge::bench {
namespace {

using testing::CliRun;
using testing::run_forge;
using testing::Stderr;

using testing::error_of;

TEST(BenchMemoryParse, ElementCounts) {
  EXPECT_EQ(parse_element_count("65536"), 65536);
  EXPECT_EQ(parse_element_count("64K"), 65536);
  EXPECT_EQ(parse_element_count("16m"), 16 << 20);
  EXPECT_EQ(parse_element_count("1G"), int64_t{1} << 30);
  EXPECT_EQ(parse_element_list("64K, 1M"), (std::vector<int64_t>{65536, 1 << 20}));
  EXPECT_EQ(parse_element_list("64K..256K"), (std::vector<int64_t>{65536, 131072, 262144}));
  for (const char* bad : {"", "K", "0", "-1", "1.5M", "64K,", "12T", "64K..100K", "1M..64K"}) {
    const std::string msg = error_of([&] { parse_element_list(bad); });
    EXPECT_NE(msg.find("bad size"), std::string::npos) << "'" << bad << "': " << msg;
  }
  EXPECT_EQ(element_count_str(65536), "64K");
  EXPECT_EQ(element_count_str(int64_t{1} << 30), "1G");
  EXPECT_EQ(element_count_str(3 << 20), "3M");
  EXPECT_EQ(element_count_str(1000), "1000");
  const auto gpu = default_memory_sizes(Device::cuda(0));
  EXPECT_EQ(gpu.front(), 65536);
  EXPECT_EQ(gpu.back(), int64_t{1} << 30);
  EXPECT_EQ(gpu.size(), 8u);  // x4 steps
  EXPECT_EQ(default_memory_sizes(Device::cpu()).back(), int64_t{64} << 20);
}

TEST(BenchMemory, BytesAndFlops) {
  EXPECT_DOUBLE_EQ(memory_bytes("copy", 1000, 4), 8000);
  EXPECT_DOUBLE_EQ(memory_bytes("copy_kernel", 1000, 4), 8000);
  EXPECT_DOUBLE_EQ(memory_bytes("multiply", 1000, 4), 12000);
  EXPECT_DOUBLE_EQ(memory_bytes("stream_triad", 1000, 8), 24000);
  EXPECT_DOUBLE_EQ(memory_bytes("stream_copy", 1000, 8), 16000);
  EXPECT_DOUBLE_EQ(memory_bytes("h2d_pinned", 1000, 4), 4000);
  EXPECT_DOUBLE_EQ(memory_bytes("peer", int64_t{1} << 30, 4), 4.0 * (int64_t{1} << 30));
  EXPECT_DOUBLE_EQ(memory_flops("multiply", 1000), 1000);
  EXPECT_DOUBLE_EQ(memory_flops("stream_triad", 1000), 2000);
  EXPECT_DOUBLE_EQ(memory_flops("copy", 1000), 0);
  EXPECT_NE(error_of([] { memory_bytes("bogus", 1, 1); }).find("unknown kernel"), std::string::npos);
}

TEST(BenchMemory, CpuStreamTiny) {
  MemoryOptions o;
  o.device = Device::cpu();
  o.sizes = {4096, 65536};
  o.repeats = 3;
  o.warmup_runs = 1;
  o.warmup_ms = 0;
  const MemoryReport r = run_memory(o);
  EXPECT_EQ(r.timer, "steady_clock");
  EXPECT_GE(r.threads, 1);
  ASSERT_EQ(r.results.size(), 4u);
  EXPECT_EQ(r.results[0].kernel, "stream_copy");
  EXPECT_EQ(r.results[1].kernel, "stream_triad");
  for (const auto& x : r.results) {
    EXPECT_GT(x.median_ms, 0);
    EXPECT_GT(x.gbs, 0);
    EXPECT_NEAR(x.gbs, x.bytes / (x.median_ms * 1e-3) / 1e9, 1e-9 * x.gbs);
    EXPECT_DOUBLE_EQ(x.bytes, memory_bytes(x.kernel, x.elements, 8));
  }
  EXPECT_GT(r.results[1].tflops, 0);
  EXPECT_EQ(r.results[0].tflops, 0);
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j["benchmark"], "memory");
  EXPECT_EQ(j["results"].size(), 4u);
  o.sizes.clear();
  EXPECT_NE(error_of([&] { run_memory(o); }).find("no sizes"), std::string::npos);
}

TEST(BenchLayer, FlopFormulas) {
  const LayerConfig c{4, 1024, 768, 12, DType::bf16};
  const double b = 4, s = 1024, h = 768;
  EXPECT_DOUBLE_EQ(layer_ffn_flops(c), 16 * b * s * h * h);
  EXPECT_DOUBLE_EQ(layer_attention_flops(c), 8 * b * s * h * h + 4 * b * s * s * h);
  EXPECT_DOUBLE_EQ(layer_training_flops(c), 3 * (layer_ffn_flops(c) + layer_attention_flops(c)));
  for (bool fused : {false, true}) {
    double fwd = 0, bwd = 0;
    for (const LayerPart& p : layer_parts(c, fused)) {
      fwd += p.flops_fwd;
      bwd += p.flops_bwd;
      if (p.kind == "gemm" || p.kind == "attention") {
        EXPECT_GT(p.flops_fwd, 0) << p.name;
        EXPECT_DOUBLE_EQ(p.flops_bwd, 2 * p.flops_fwd) << p.name;
        EXPECT_DOUBLE_EQ(p.op_flops_fwd, p.flops_fwd) << p.name;
      } else {
        EXPECT_EQ(p.flops_fwd, 0) << p.name;
        EXPECT_GT(p.bytes_fwd, 0) << p.name;
      }
    }
    EXPECT_DOUBLE_EQ(fwd, layer_forward_flops(c)) << fused;  // the parts add up to the formula
    EXPECT_DOUBLE_EQ(bwd, 2 * layer_forward_flops(c)) << fused;
  }
  const auto unfused = layer_parts(c, false);
  const auto fused = layer_parts(c, true);
  EXPECT_EQ(unfused.size(), fused.size() + 1);  // mlp_fc + gelu vs mlp_fc_gelu
  EXPECT_EQ(unfused[0].name, "ln_1");
  EXPECT_DOUBLE_EQ(unfused[0].bytes_fwd, 2 * 4 * 1024 * 768 * 2.0);  // read x, write y, bf16
  EXPECT_DOUBLE_EQ(unfused[1].flops_fwd, 2 * b * s * h * 3 * h);      // qkv
  EXPECT_NE(error_of([] { validate(LayerConfig{1, 8, 30, 4, DType::f32}); }).find("must divide"), std::string::npos);
  EXPECT_NE(error_of([] { validate(LayerConfig{0, 8, 32, 4, DType::f32}); }).find("positive"), std::string::npos);
  EXPECT_EQ(default_layer_config(Device::cuda(0)).dtype, DType::bf16);
  EXPECT_EQ(default_layer_config(Device::cpu()).dtype, DType::f32);
}

TEST(BenchLayer, CpuTinyBlock) {
  LayerOptions o;
  o.device = Device::cpu();
  o.config = {1, 16, 32, 2, DType::f32};
  o.repeats = 2;
  o.warmup_runs = 1;
  o.warmup_ms = 0;
  const LayerReport r = run_layer(o);
  EXPECT_FALSE(r.fused_gelu);
  EXPECT_GT(r.block.fwd_ms, 0);
  EXPECT_GT(r.block.bwd_ms, 0);
  EXPECT_GT(r.block_tflops, 0);
  EXPECT_DOUBLE_EQ(r.block_flops, layer_training_flops(o.config));
  ASSERT_EQ(r.parts.size(), layer_parts(o.config, false).size());
  for (const auto& p : r.parts) {
    EXPECT_GT(p.time.fwd_ms, 0) << p.part.name;
    EXPECT_GE(p.time.bwd_ms, 0) << p.part.name;
    EXPECT_GT(p.share, 0) << p.part.name;
    if (p.part.flops_fwd > 0) {
      EXPECT_GT(p.tflops, 0) << p.part.name;
    } else {
      EXPECT_EQ(p.tflops, 0) << p.part.name;
    }
  }
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j["benchmark"], "layer");
  EXPECT_EQ(j["config"]["dtype"], "f32");
  EXPECT_EQ(j["parts"].size(), r.parts.size());
  for (const char* k : {"fwd_ms", "bwd_ms", "total_ms", "flops", "tflops"}) EXPECT_TRUE(j["block"].contains(k)) << k;
}

// ---- the forge binary ---------------------------------------------------------------------

using BenchMemoryLayerCliTest = testing::ForgeCliTest;

TEST_F(BenchMemoryLayerCliTest, MemoryJsonAndTable) {
  const CliRun r = run_forge({"bench", "memory", "--device", "cpu", "--sizes", "4K,64K", "--repeats", "2", "--warmup-ms",
                              "0", "--json"},
                             Stderr::dropped);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* k : {"benchmark", "device", "device_name", "method", "results", "skipped", "threads", "forge_version"})
    EXPECT_TRUE(j.contains(k)) << k;
  ASSERT_EQ(j["results"].size(), 4u);
  EXPECT_EQ(j["results"][3]["kernel"], "stream_triad");
  EXPECT_EQ(j["results"][3]["elements"], 65536);
  const CliRun t = run_forge({"bench", "memory", "--device", "cpu", "--sizes", "4K", "--repeats", "2", "--warmup-ms", "0"},
                             Stderr::dropped);
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_NE(t.out.find("stream_triad"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("GB/s"), std::string::npos) << t.out;
  EXPECT_EQ(run_forge({"bench", "memory", "--sizes", "12x"}, Stderr::dropped).status, 2);
  EXPECT_EQ(run_forge({"bench", "memory", "--repeats", "0"}, Stderr::dropped).status, 2);
}

TEST_F(BenchMemoryLayerCliTest, LayerJsonAndTable) {
  const CliRun r = run_forge({"bench", "layer", "--device", "cpu", "--batch", "1", "--seq", "8", "--width", "16", "--heads",
                              "2", "--repeats", "2", "--warmup-ms", "0", "--json"},
                             Stderr::dropped);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["config"]["width"], 16);
  EXPECT_EQ(j["parts"][0]["name"], "ln_1");
  EXPECT_GT(j["block"]["tflops"].get<double>(), 0);
  const CliRun t = run_forge({"bench", "layer", "--device", "cpu", "--batch", "1", "--seq", "8", "--width", "16", "--heads",
                              "2", "--repeats", "1", "--warmup-ms", "0"},
                             Stderr::dropped);
  ASSERT_EQ(t.status, 0) << t.out;
  for (const char* k : {"attention", "mlp_proj", "gelu", "sum of parts", "block", "GFLOP/s"})
    EXPECT_NE(t.out.find(k), std::string::npos) << k << "\n" << t.out;
  // heads must divide the width: a forge::Error, exit 1
  EXPECT_EQ(run_forge({"bench", "layer", "--device", "cpu", "--width", "30", "--heads", "4"}, Stderr::dropped).status, 1);
  EXPECT_EQ(run_forge({"bench", "layer", "--batch", "0"}, Stderr::dropped).status, 2);
}

}  // namespace
}  // namespace forge::bench
