// forge plan and LoRA (nn/lora.h): the adapters' parameter count (PEFT's figure for LLaMA-2-7B) and
// the memory of a LoRA run: the frozen base's weights only, gradients and optimizer state of the
// adapters alone.
#include <gtest/gtest.h>

#include "forge/nn/lora.h"
#include "forge/plan/gpu_catalog.h"
#include "forge/plan/plan.h"
#include "forge/plan/memory_model.h"
#include "forge/plan/model_spec.h"
#include "forge/plan/time_model.h"

namespace forge::plan {
namespace {

TEST(PlanLora, AdapterCountIsPeftsForLlama2Q_V) {
  ModelSpec m = find_preset("llama2-7b").spec;
  m.lora_rank = 8;
  m.lora_roles = nn::lora_roles(Arch::llama, {"q", "v"});
  // 32 blocks x (q 4096 -> 4096 and v 4096 -> 4096) x r (in + out): PEFT's print_trainable_parameters
  // for LoraConfig(r=8, target_modules=["q_proj", "v_proj"]) on Llama-2-7b says 4,194,304.
  EXPECT_EQ(lora_parameters(m), 32 * 2 * 8 * (4096 + 4096));
  EXPECT_EQ(lora_parameters(m), 4194304);
  // Tensor parallelism: a column-parallel linear's B is split (q, v: r (in + out / t)).
  EXPECT_EQ(lora_block_parameters(m, 2), 2 * 8 * (4096 + 2048));
  m.lora_roles = nn::lora_roles(Arch::llama, {"o", "down"});  // row-parallel: A split
  EXPECT_EQ(lora_block_parameters(m, 2), 8 * (2048 + 4096) + 8 * (11008 / 2 + 4096));
}

TEST(PlanLora, MemoryHoldsTheBaseWeightsAndTheAdaptersState) {
  ModelSpec m = find_preset("llama2-7b").spec;
  TrainingSetup setup;  // bf16, AdamW: 2 + 2 + 12 bytes per trained parameter
  Layout l;
  l.micro_batch = 1;
  l.grad_accum = 2;  // (gradients alive at the peak)
  const MemoryBreakdown whole = memory_per_gpu(m, setup, l, 80e9);
  m.lora_rank = 16;
  m.lora_roles = nn::lora_roles(Arch::llama, {"q", "v"});
  const MemoryBreakdown lora = memory_per_gpu(m, setup, l, 80e9);
  const double P = static_cast<double>(whole.params_on_gpu), A = static_cast<double>(lora_parameters(m));
  EXPECT_DOUBLE_EQ(whole.optimizer, 12 * P);
  EXPECT_DOUBLE_EQ(lora.params, 2 * (P + A));
  EXPECT_DOUBLE_EQ(lora.grads, 2 * A);
  EXPECT_DOUBLE_EQ(lora.optimizer, 12 * A);
  EXPECT_LT(lora.total, whole.total - 12 * P);
}

// The step's compute: a frozen base's matmuls run forward and their input gradients only (no
// weight gradients: 2 x forward instead of 3 x), the attention core's backward is still twice its
// forward, and the adapters cost 6 FLOPs per parameter and token; the gradient reduction covers the
// adapters alone.
TEST(PlanLora, StepTimeSkipsTheFrozenBasesWeightGradients) {
  ModelSpec m = find_preset("llama2-7b").spec;
  TrainingSetup setup;
  Layout l;
  l.dp = 8, l.micro_batch = 1, l.grad_accum = 4;
  const Cluster c = make_cluster(find_gpu("h100"), 8);
  const TimeBreakdown whole = step_time(m, setup, l, c, 0.4, 1e9);
  m.lora_rank = 16;
  m.lora_roles = nn::lora_roles(Arch::llama, {"q", "k", "v", "o", "gate", "up", "down"});
  const TimeBreakdown lora = step_time(m, setup, l, c, 0.4, 1e9);
  const FlopsPerToken F = flops_per_token(m);
  const double L = static_cast<double>(m.n_layer);
  const double full = 3.0 * (L * F.layer_forward + F.head_forward);
  const double frozen = L * (2.0 * F.layer_forward + F.attention_forward) + 2.0 * F.head_forward +
                        6.0 * static_cast<double>(lora_parameters(m));
  EXPECT_NEAR(lora.compute / whole.compute, frozen / full, 1e-9);
  EXPECT_GT(lora.compute / whole.compute, 0.6);
  EXPECT_LT(lora.compute / whole.compute, 0.75);
  // 2 bytes per adapter gradient over 8 ranks instead of the whole model's.
  EXPECT_LT(lora.dp_comm, whole.dp_comm / 50);
}

}  // namespace
}  // namespace forge::plan
