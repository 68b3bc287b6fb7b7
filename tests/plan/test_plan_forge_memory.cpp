// The planner's forge activation model against forge itself: build a small GPT or LLaMA,
// train a few steps with AdamW on the CPU, and compare the CPU allocator's peak (what the
// trainer logs as mem_bytes) with memory_per_gpu() for the same shape and batch.
//
// If one of these fails after a change to what forge's autograd keeps (say, binary ops
// stop holding their output), update the saved-tensor lists in src/forge/plan/activations.cpp
// and the table in docs/plan.md.
#include <gtest/gtest.h>

#include <functional>

#include "forge/core/allocator.h"
#include "forge/core/generator.h"
#include "forge/nn/gpt.h"
#include "forge/nn/llama.h"
#include "forge/ops/binary.h"
#include "forge/ops/creation.h"
#include "forge/ops/loss.h"
#include "forge/optim/adamw.h"
#include "forge/plan/plan.h"

namespace forge::plan {
namespace {

struct Case {
  const char* name;
  bool llama;
  bool checkpointing;
  int64_t grad_accum;
};

// Peak bytes above what was allocated before the model existed, over the third optimizer
// step (AdamW's moments exist from the first).
int64_t measured_peak(const Case& c, int64_t B, int64_t T, int64_t V) {
  const int64_t base = cpu_memory_stats().allocated;
  std::shared_ptr<nn::Module> model;
  std::function<Tensor(const Tensor&)> forward;
  if (!c.llama) {
    nn::GPTConfig g;
    g.vocab_size = V, g.block_size = T, g.n_layer = 4, g.n_head = 4, g.n_embd = 128;
    g.checkpoint_activations = c.checkpointing;
    auto m = std::make_shared<nn::GPT>(g, 1);
    model = m;
    forward = [m](const Tensor& x) { return m->forward(x); };
  } else {
    nn::LlamaConfig l;
    l.vocab_size = V, l.block_size = T, l.n_layer = 4, l.n_head = 4, l.n_kv_head = 2, l.dim = 128, l.ffn_hidden = 352;
    l.checkpoint_activations = c.checkpointing;
    auto m = std::make_shared<nn::Llama>(l, 1);
    model = m;
    forward = [m](const Tensor& x) { return m->forward(x); };
  }
  model->train();
  optim::AdamW opt(model->parameters(), {});
  Generator gen(7);
  int64_t peak = 0;
  for (int step = 0; step < 3; ++step) {
    reset_cpu_peak_memory();
    for (int64_t k = 0; k < c.grad_accum; ++k) {
      const Tensor idx = randint(0, V, {B, T}, {.dtype = DType::i64}, &gen);
      const Tensor tgt = randint(0, V, {B, T}, {.dtype = DType::i64}, &gen);
      const Tensor loss = ops::cross_entropy(forward(idx), tgt);
      (c.grad_accum == 1 ? loss : loss / static_cast<double>(c.grad_accum)).backward();
    }
    opt.step();
    opt.zero_grad();
    peak = cpu_memory_stats().peak_allocated - base;
  }
  return peak;
}

double planned_peak(const Case& c, int64_t B, int64_t T, int64_t V) {
  ModelSpec m;
  m.arch = c.llama ? Arch::llama : Arch::gpt;
  m.n_layer = 4, m.d_model = 128, m.n_head = 4, m.n_kv_head = c.llama ? 2 : 4;
  m.ffn_hidden = c.llama ? 352 : 512;
  m.vocab_size = V, m.block_size = T, m.seq_len = T, m.bias = !c.llama;
  TrainingSetup setup;
  setup.precision = Precision::fp32;
  setup.activations.model = ActivationModel::forge;
  setup.margin = 0;
  setup.reserve_bytes = 0;
  Layout l;
  l.micro_batch = B;
  l.grad_accum = c.grad_accum;
  l.checkpointing = c.checkpointing ? Checkpointing::full : Checkpointing::none;
  return memory_per_gpu(m, setup, l, 1e12).total;
}

class ForgeMemory : public ::testing::TestWithParam<Case> {};

TEST_P(ForgeMemory, PlannedPeakIsWithinFivePercentOfMeasured) {
  const Case c = GetParam();
  const int64_t B = 16, T = 64, V = 1024;
  const double measured = static_cast<double>(measured_peak(c, B, T, V));
  const double planned = planned_peak(c, B, T, V);
  const double error = (planned - measured) / measured;
  ::testing::Test::RecordProperty("measured_bytes", std::to_string(static_cast<int64_t>(measured)));
  ::testing::Test::RecordProperty("planned_bytes", std::to_string(static_cast<int64_t>(planned)));
  EXPECT_NEAR(error, 0.0, 0.05) << c.name << ": planned " << planned << " bytes, measured " << measured;
}

INSTANTIATE_TEST_SUITE_P(Plan, ForgeMemory,
                         ::testing::Values(Case{"gpt", false, false, 1}, Case{"gpt_checkpointed", false, true, 1},
                                           Case{"gpt_accumulating", false, false, 2}, Case{"llama", true, false, 1},
                                           Case{"llama_checkpointed", true, true, 1}),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace forge::plan
