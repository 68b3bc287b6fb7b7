// forge bench attention (bench/attention.h) on the CPU: shape and back-end parsing with their
// errors, the FLOP count, a run on the CPU kernel and its JSON. The GPU back-ends are covered by
// tests/backends/cuda (CudaCudnnAttention, CudaFlashAttention) and run by
// benchmarks/attention/run.sh.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "forge/bench/attention.h"
#include "forge/core/error.h"

namespace forge::bench {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BenchAttention, ParsesShapes) {
  const AttentionShape s = parse_attention_shape("4x32x8x2048x128");
  EXPECT_EQ(s.batch, 4);
  EXPECT_EQ(s.heads, 32);
  EXPECT_EQ(s.kv_heads, 8);
  EXPECT_EQ(s.seq, 2048);
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_TRUE(s.causal);
  EXPECT_FALSE(parse_attention_shape("1x2x2x16x64,full").causal);
  EXPECT_EQ(shape_str(parse_attention_shape("1x2x2x16x64,full")), "1x2x2x16x64,full");
  EXPECT_NE(error_of([] { parse_attention_shape("4x32x8x2048"); }).find("BxHxHKVxTxD"), std::string::npos);
  EXPECT_NE(error_of([] { parse_attention_shape("4x32x5x2048x128"); }).find("must divide heads"), std::string::npos);
  EXPECT_NE(error_of([] { parse_attention_shape("4x0x1x2048x128"); }).find("positive integer"), std::string::npos);
  EXPECT_NE(error_of([] { parse_attention_shape("1x2x2x16x64,sideways"); }).find("'full'"), std::string::npos);
}

TEST(BenchAttention, BackendsAreCheckedAgainstTheDevice) {
  EXPECT_EQ(parse_attention_backends("cpu", Device::cpu()), std::vector<std::string>{"cpu"});
  EXPECT_NE(error_of([] { parse_attention_backends("cudnn", Device::cpu()); }).find("not one of cpu"),
            std::string::npos);
  EXPECT_EQ(default_attention_backends(Device::cpu()), std::vector<std::string>{"cpu"});
}

TEST(BenchAttention, FlopsFollowTheFlashAttentionConvention) {
  AttentionShape s{2, 4, 2, 128, 64, false};
  EXPECT_DOUBLE_EQ(attention_forward_flops(s), 4.0 * 2 * 4 * 128 * 128 * 64);
  s.causal = true;
  EXPECT_DOUBLE_EQ(attention_forward_flops(s), 2.0 * 2 * 4 * 128 * 128 * 64);
  EXPECT_DOUBLE_EQ(attention_backward_flops(s), 2.5 * attention_forward_flops(s));
}

// The CPU back-end on one shape, f32.
AttentionOptions cpu_options(const std::string& shape, int repeats, int warmup) {
  AttentionOptions o;
  o.device = Device::cpu();
  o.dtype = DType::f32;
  o.shapes = {parse_attention_shape(shape)};
  o.backends = {"cpu"};
  o.repeats = repeats;
  o.warmup_runs = warmup;
  return o;
}

TEST(BenchAttention, RunsTheCpuKernelAndReportsJson) {
  AttentionOptions o = cpu_options("1x2x1x64x16", 2, 1);
  const AttentionReport r = run_attention(o);
  ASSERT_EQ(r.results.size(), 1u);
  EXPECT_TRUE(r.results[0].skipped.empty());
  EXPECT_GT(r.results[0].fwd_ms, 0);
  EXPECT_GT(r.results[0].bwd_ms, 0);
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j["bench"], "attention");
  EXPECT_EQ(j["results"][0]["shape"], "1x2x1x64x16");
  EXPECT_GT(j["results"][0]["fwd_tflops"].get<double>(), 0);
  EXPECT_EQ(j["layout"], "bhsd");
  o.dtype = DType::bf16;
  EXPECT_NE(error_of([&] { run_attention(o); }).find("use f32 or f64"), std::string::npos);
}

// --layout bshd: q, k, v and dout are (B, T, H, D) memory viewed as (B, H, T, D) (Note [attention
// layouts]); the CPU kernel reads them as they are. A name it does not know is refused up front.
TEST(BenchAttention, TimesTheTokenMajorLayoutAndRefusesAnUnknownOne) {
  AttentionOptions o = cpu_options("2x4x2x48x16", 1, 0);
  o.layout = "bshd";
  const AttentionReport r = run_attention(o);
  ASSERT_EQ(r.results.size(), 1u);
  EXPECT_TRUE(r.results[0].skipped.empty()) << r.results[0].skipped;
  EXPECT_GT(r.results[0].fwd_ms, 0);
  EXPECT_GT(r.results[0].bwd_ms, 0);
  EXPECT_EQ(to_json(r)["layout"], "bshd");
  o.layout = "sbhd";
  const std::string e = error_of([&] { run_attention(o); });
  EXPECT_NE(e.find("--layout is bhsd or bshd, got 'sbhd'"), std::string::npos) << e;
}

}  // namespace
}  // namespace forge::bench
