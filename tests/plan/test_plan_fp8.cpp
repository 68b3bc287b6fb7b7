// forge plan and FP8 (Note [FP8 in the plan] in plan/time_model.cpp): the blocks' linear GEMMs at
// the FP8 peak and the rest at bf16's, the MFU reported against the bf16 peak, the weights'
// transposed FP8 codes in the activation memory, and the command that runs it.
#include <gtest/gtest.h>

#include "forge/plan/command.h"
#include "forge/plan/gpu_catalog.h"
#include "forge/plan/memory_model.h"
#include "forge/plan/model_spec.h"
#include "forge/plan/plan.h"
#include "forge/plan/time_model.h"

namespace forge::plan {
namespace {

TEST(PlanFp8, LinearGemmsAtTheFp8PeakTheRestAtBf16s) {
  const ModelSpec m = find_preset("llama2-7b").spec;
  Layout l;
  l.micro_batch = 1, l.grad_accum = 4;
  const Cluster c = make_cluster(find_gpu("h100"), 1);
  TrainingSetup bf16, fp8;
  fp8.precision = Precision::fp8;
  const TimeBreakdown a = step_time(m, bf16, l, c, 0.4, 1e9), b = step_time(m, fp8, l, c, 0.4, 1e9);
  const FlopsPerToken F = flops_per_token(m);
  const double L = static_cast<double>(m.n_layer);
  const double linear = 3.0 * L * (F.layer_forward - F.attention_forward), all = 3.0 * (L * F.layer_forward + F.head_forward);
  const double bf16_peak = find_gpu("h100").peak_flops(Precision::bf16), fp8_peak = find_gpu("h100").peak_flops(Precision::fp8);
  // compute = linear / (fp8 peak mfu) + rest / (bf16 peak mfu), per token of the step
  const double expected = (linear / fp8_peak + (all - linear) / bf16_peak) / (all / bf16_peak);
  EXPECT_NEAR(b.compute / a.compute, expected, 1e-9);
  EXPECT_GT(b.compute / a.compute, 0.5);   // not the naive halving: attention and the head stay bf16
  EXPECT_LT(b.compute / a.compute, 0.65);
  EXPECT_DOUBLE_EQ(b.peak_flops, bf16_peak);  // MFU against bf16's peak
  EXPECT_GT(b.mfu, a.mfu);
}

TEST(PlanFp8, WeightCodesAreStoredPerMicroBatchInFlight) {
  const ModelSpec m = find_preset("llama2-7b").spec;
  Layout l;
  l.micro_batch = 1, l.grad_accum = 1;
  TrainingSetup bf16, fp8;
  fp8.precision = Precision::fp8;
  const MemoryBreakdown a = memory_per_gpu(m, bf16, l, 80e9), b = memory_per_gpu(m, fp8, l, 80e9);
  const FlopsPerToken F = flops_per_token(m);
  const double codes = static_cast<double>(m.n_layer) * (F.layer_forward - F.attention_forward) / 2.0;  // a byte a weight
  EXPECT_NEAR(b.activations - a.activations, codes, 1.0);
  EXPECT_DOUBLE_EQ(b.params, a.params);  // bf16 weights, f32 masters and moments as bf16's
  EXPECT_DOUBLE_EQ(b.optimizer, a.optimizer);
}

}  // namespace
}  // namespace forge::plan
