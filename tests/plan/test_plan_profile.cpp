// Efficiency profiles (plan/gpu_profile.h, Note [efficiency profiles]) and the step priced kernel
// by kernel from one (Note [profiled step] in plan/time_model.h): the GEMM formula by hand (wave
// quantisation, k_half, measured points), the attention rates' interpolation, the profile's JSON
// as untrusted input, the fit, and a GPT step's seconds against a count made here from the
// architecture (not from the planner's code).
#include <gtest/gtest.h>

#include <cmath>

#include "forge/core/error.h"
#include "forge/plan/gpu_profile.h"
#include "forge/plan/memory_model.h"
#include "forge/plan/model_spec.h"
#include "forge/plan/time_model.h"

namespace forge::plan {
namespace {

// A GPU of `sms` SMs whose GEMMs run at `tflops` in 128 x 128 tiles with no fixed costs.
GpuProfile toy(int64_t sms, double tflops, double k_half = 0, double memory_gbs = 1000) {
  GpuProfile p;
  p.gpu = "H100 SXM";
  p.sms = sms;
  GemmEfficiency g;
  g.sustained_tflops = tflops;
  g.tile_m = 128;
  g.tile_n = 128;
  g.k_half = k_half;
  g.fixed_us = 0;
  p.gemm[Precision::bf16] = g;
  p.attention = {{1024, 64, 100, 50}, {4096, 64, 300, 150}, {1024, 128, 200, 100}};
  p.memory_gbs = memory_gbs;
  return p;
}

TEST(PlanProfile, GemmSecondsByHand) {
  const GpuProfile p = toy(4, 100, 0, 1e9);
  // 2 x 2 tiles on 4 SMs: one full wave.
  EXPECT_DOUBLE_EQ(gemm_seconds(p, Precision::bf16, 256, 256, 1024), 2.0 * 256 * 256 * 1024 / 100e12);
  // 5 x 2 = 10 tiles: 3 waves of 4, the last half empty: 10 / 12 of the rate.
  EXPECT_DOUBLE_EQ(gemm_seconds(p, Precision::bf16, 640, 256, 1024), 2.0 * 640 * 256 * 1024 / (100e12 * 10.0 / 12.0));
  // k_half = k: half the rate.
  const GpuProfile h = toy(4, 100, 1024, 1e9);
  EXPECT_DOUBLE_EQ(gemm_seconds(h, Precision::bf16, 256, 256, 1024), 2.0 * 2.0 * 256 * 256 * 1024 / 100e12);
  // A product too thin to be compute-bound: its bytes at the memory's rate (16-bit operands and output).
  const GpuProfile slow = toy(4, 100, 0, 1);  // 1 GB/s
  EXPECT_DOUBLE_EQ(gemm_seconds(slow, Precision::bf16, 256, 256, 8), 2.0 * (256.0 * 8 + 8 * 256 + 256 * 256) / 1e9);
  // fp16 runs on bf16's rate; a precision the profile lacks is an error naming it.
  EXPECT_DOUBLE_EQ(gemm_seconds(p, Precision::fp16, 256, 256, 1024), gemm_seconds(p, Precision::bf16, 256, 256, 1024));
  try {
    gemm_seconds(p, Precision::fp8, 256, 256, 1024);
    ADD_FAILURE() << "no fp8 rate";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8"), std::string::npos) << e.what();
  }
}

TEST(PlanProfile, AMeasuredPointReplacesTheFormula) {
  GpuProfile p = toy(4, 100);
  p.gemm[Precision::bf16].points = {{512, 512, 512, 25.0}};
  EXPECT_DOUBLE_EQ(gemm_seconds(p, Precision::bf16, 512, 512, 512), 2.0 * 512 * 512 * 512 / 25e12);
  EXPECT_DOUBLE_EQ(gemm_seconds(p, Precision::bf16, 512, 512, 1024), 2.0 * 512 * 512 * 1024 / 100e12);
}

TEST(PlanProfile, AttentionRatesInterpolateInLogSequenceAtTheNearestHeadSize) {
  const GpuProfile p = toy(4, 100);
  EXPECT_DOUBLE_EQ(attention_rate(p, 2048, 64).fwd, 200e12);  // halfway from 1024 to 4096 in log2
  EXPECT_DOUBLE_EQ(attention_rate(p, 2048, 64).bwd, 100e12);
  EXPECT_DOUBLE_EQ(attention_rate(p, 512, 64).fwd, 100e12);    // below: the first
  EXPECT_DOUBLE_EQ(attention_rate(p, 65536, 64).fwd, 300e12);  // above: the last
  EXPECT_DOUBLE_EQ(attention_rate(p, 2048, 120).fwd, 200e12);  // 128 is nearest: its only point
}

TEST(PlanProfile, JsonRoundTripsAndBadInputNamesTheField) {
  for (const GpuProfile& p : shipped_profiles()) {
    const GpuProfile q = profile_from_json(to_json(p), "test");
    EXPECT_EQ(q.gpu, p.gpu);
    EXPECT_EQ(q.source, p.source);
    for (auto [m, n, k] : {std::tuple{16384, 768, 2304}, {4096, 8192, 3072}, {1024, 1024, 1024}})
      EXPECT_DOUBLE_EQ(gemm_seconds(q, Precision::bf16, m, n, k), gemm_seconds(p, Precision::bf16, m, n, k)) << p.gpu;
    EXPECT_DOUBLE_EQ(attention_rate(q, 2048, 128).bwd, attention_rate(p, 2048, 128).bwd);
    EXPECT_DOUBLE_EQ(q.memory_gbs, p.memory_gbs);
  }
  const nlohmann::json good = to_json(toy(4, 100));
  auto expect_error = [&](nlohmann::json j, const std::string& names) {
    try {
      profile_from_json(j, "p.json");
      ADD_FAILURE() << "accepted: " << j.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("p.json"), std::string::npos) << e.what();
    }
  };
  nlohmann::json j = good;
  j.erase("sms");
  expect_error(j, "sms");
  j = good;
  j["memory_gbs"] = -3;
  expect_error(j, "memory_gbs");
  j = good;
  j["gemm"]["bf16"]["sustained_tflops"] = 0;
  expect_error(j, "sustained_tflops");
  j = good;
  j["gemm"]["bf16"]["tile_n"] = 1.5;
  expect_error(j, "tile_n");
  j = good;
  j["gemm"]["int4"] = j["gemm"]["bf16"];
  expect_error(j, "int4");
  j = good;
  j["attention"] = nlohmann::json::array();
  expect_error(j, "attention");
  expect_error(nlohmann::json::array(), "object");
}

TEST(PlanProfile, TheFitRecoversAModelsConstants) {
  GpuProfile truth = toy(132, 500, 128, 1e9);  // (compute-bound: the fit models no memory limit)
  truth.gemm[Precision::bf16].tile_n = 256;
  truth.gemm[Precision::bf16].fixed_us = 1;
  std::vector<GemmPoint> pts;
  for (int64_t m : {4096, 16384})
    for (int64_t n : {768, 3072, 8192})
      for (int64_t k : {768, 2048, 8192}) {
        const double t = gemm_seconds(truth, Precision::bf16, m, n, k);
        pts.push_back({m, n, k, 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / t / 1e12});
      }
  const GemmEfficiency e = fit_gemm(pts, 132, 128, 256);
  EXPECT_EQ(e.k_half, 128);
  EXPECT_NEAR(e.sustained_tflops, 500, 0.5);
  EXPECT_EQ(e.points.size(), pts.size());
  // A peak above the truth changes nothing; one below it bounds the rate (and k_half moves to make
  // up what it can), never above the peak.
  const GemmEfficiency loose = fit_gemm(pts, 132, 128, 256, 600);
  EXPECT_EQ(loose.k_half, 128);
  EXPECT_NEAR(loose.sustained_tflops, 500, 0.5);
  const GemmEfficiency bound = fit_gemm(pts, 132, 128, 256, 450);
  EXPECT_LE(bound.sustained_tflops, 450);
  EXPECT_GT(bound.sustained_tflops, 440);
  EXPECT_LT(bound.k_half, 128);
}

// GPT-2 124M's step on one GPU of a profile whose GEMMs run at exactly R (one SM, one huge tile:
// every product one full wave, no k_half, no fixed time): the seconds are the FLOPs counted here
// from the architecture over R, the attention FLOPs over its rates, and the bytes counted here
// over the bandwidth.
TEST(PlanProfile, AGptStepIsItsKernelsByHand) {
  GpuProfile p = toy(1, 400, 0, 2000);
  p.gemm[Precision::bf16].tile_m = 1 << 20;
  p.gemm[Precision::bf16].tile_n = 1 << 20;
  p.attention = {{1024, 64, 200, 100}};
  ModelSpec m;  // GPT-2 small: 12 x 768, 12 heads, ffn 3072, vocab 50257 -> 50304 below, seq 1024
  m.vocab_size = 50304;
  TrainingSetup s;
  Layout l;
  l.micro_batch = 8;
  const double M = 8 * 1024, h = 768, f = 3072, V = 50304, L = 12, T = 1024;
  const StageKernels k = profiled_stage(m, s, l, p, 12, true, true);
  const double block_weights = 3 * h * h + h * h + f * h + h * f;  // c_attn, c_proj, c_fc, mlp c_proj
  const double gemm_flops = 3 * 2 * M * (L * block_weights + V * h);  // forward, input and weight gradients
  EXPECT_NEAR(k.gemm, gemm_flops / 400e12, 1e-12 * k.gemm + 1e-15);
  const double attn = L * M * 2 * T * h;  // causal: half of 4 T h per token and layer
  EXPECT_NEAR(k.attention, attn / 200e12 + 2.5 * attn / 100e12, 1e-12 * k.attention);
  const double elements = M * (L * (20 * h + 2 * f) + 7 * h + 10 * h + 2 * V);
  EXPECT_NEAR(k.memory, elements * 2 / 2000e9, 1e-12 * k.memory);
  EXPECT_EQ(k.recompute, 0);
  // Full recomputation: the forward once more (its GEMMs, attention and bytes of every block).
  l.checkpointing = Checkpointing::full;
  const StageKernels c = profiled_stage(m, s, l, p, 12, true, true);
  EXPECT_NEAR(c.recompute, L * (2 * M * block_weights / 400e12 + M * 2 * T * h / 200e12 + M * (8 * h + f) * 2 / 2000e9),
              1e-12 * c.recompute);
  // LoRA: the frozen base has no weight-gradient products.
  l.checkpointing = Checkpointing::none;
  m.lora_rank = 8;
  m.lora_roles = {};
  const StageKernels lo = profiled_stage(m, s, l, p, 12, true, true);
  EXPECT_NEAR(lo.gemm, 2 * 2 * M * (L * block_weights + V * h) / 400e12, 1e-12 * lo.gemm);
}

TEST(PlanProfile, TheStepTimeUsesTheProfileWhenGivenAndTheMfuOtherwise) {
  ModelSpec m;
  m.vocab_size = 50304;
  TrainingSetup s;
  Layout l;
  l.micro_batch = 16;
  Cluster c;
  c.gpu = find_gpu("h100");
  const GpuProfile& p = *shipped_profile(find_gpu("h100"));
  const TimeBreakdown a = step_time(m, s, l, c, 0.4, 1e9);
  const TimeBreakdown b = step_time(m, s, l, c, 0.4, 1e9, &p);
  const TimeBreakdown b2 = step_time(m, s, l, c, 0.9, 1e9, &p);
  EXPECT_DOUBLE_EQ(b.step, b2.step);  // the MFU is not used
  EXPECT_NE(a.step, b.step);
  EXPECT_DOUBLE_EQ(b.compute, b.gemm + b.attention + b.memory_bound);
  EXPECT_EQ(a.gemm, 0);
  EXPECT_NE(shipped_profile(find_gpu("a100-80gb")), nullptr);
  EXPECT_NE(shipped_profile(find_gpu("rtx4090")), nullptr);
  EXPECT_NE(shipped_profile(find_gpu("rtx3090ti")), nullptr);
  EXPECT_NE(shipped_profile(find_gpu("h200")), nullptr);
}

}  // namespace
}  // namespace forge::plan
