// LoRA (nn/lora.h) under the parallel layouts on CPU ranks (MPI), end to end through `forge train`
// under mpirun, as test_data_parallel.cpp and test_tensor_parallel_train.cpp do for whole models:
// DDP, ZeRO-1, ZeRO-2 and ZeRO-3 (the frozen base sharded with its blocks: Note [frozen block
// shards]) over 2 ranks, two pipeline stages (GPT's tied embedding frozen on both), and tensor
// parallelism (tp 2, with and without sequence
// parallelism; the adapters split like their base: Note [tensor-parallel LoRA]) reproduce the
// one-process run's losses at every step and its final weights, the frozen base included.
//
// Tolerances are the data- and tensor-parallel tests' (AdamW: losses 1e-6, weights 5e-5; their
// Note [AdamW and summation order]): what changes is the order of sums. A factor split on the
// wrong dim, a replicated factor's partial gradient not summed over the group, or a base weight
// updated moves the first losses or the weights by far more.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "testing/cli_testing.h"
#include "train/dist_train_testing.h"

namespace fs = std::filesystem;

namespace {

namespace dtt = forge::dist_train_testing;
using dtt::base_args;
using dtt::expect_same_run;
using dtt::set_arg;
using dtt::shell;
using dtt::ShellRun;

const dtt::Runs runs{"forge_lora_"};
constexpr auto npos = std::string::npos;

// base_args' tiny model (4 heads, vocabulary 256, context 16) with adapters of rank 4 on `targets`;
// AdamW. "llama" has 2 key-value heads (one per rank at tp 2), "llama_kv1" one (replicated at tp 2).
std::vector<std::string> lora_args(const fs::path& dir, const std::string& name, const std::string& model,
                                   const std::string& targets) {
  auto a = base_args(dir, name, 12, "adamw");
  set_arg(a, "model.n_head", "4");
  if (model != "gpt") {
    set_arg(a, "model.type", "llama");
    set_arg(a, "model.dim", "32");
    set_arg(a, "model.n_kv_head", model == "llama_kv1" ? "1" : "2");
  }
  set_arg(a, "optim.lr", "1e-2");
  set_arg(a, "lora.targets", targets);
  set_arg(a, "lora.rank", "4");
  set_arg(a, "lora.alpha", "8");
  return a;
}

struct LoraCase {
  const char* model;
  const char* targets;
  int tp;          // world = 2: dp = 2 / tp
  bool sp;
  int zero_stage;  // dp 2 only
  int pp = 1;      // 2: two pipeline stages (tp 1, dp 1), 2 micro-batches
};

std::string case_name(const LoraCase& c) {
  std::string s = std::string(c.model) + "_tp" + std::to_string(c.tp) + (c.sp ? "_sp" : "");
  if (c.pp > 1) return std::string(c.model) + "_pp" + std::to_string(c.pp);
  if (c.tp == 1) s += c.zero_stage == 0 ? "_ddp" : "_zero" + std::to_string(c.zero_stage);
  return s;
}
void PrintTo(const LoraCase& c, std::ostream* os) { *os << case_name(c); }

class LoraParallelTrain : public forge::testing::ForgeCliTest, public ::testing::WithParamInterface<LoraCase> {
 protected:
  static void SetUpTestSuite() { root_ = runs.test_root(); }
  static void TearDownTestSuite() { dtt::remove_scratch(runs, root_); }
  void SetUp() override {
    ForgeCliTest::SetUp();
    ASSERT_EQ(shell("command -v mpirun").status, 0) << "mpirun is missing: run scripts/install-deps.sh (openmpi-bin)";
  }
  static fs::path root_;
};
fs::path LoraParallelTrain::root_;

TEST_P(LoraParallelTrain, MatchesTheSingleProcessRun) {
  const LoraCase& c = GetParam();
  const std::string name = case_name(c), ref = name + "_single";
  auto one = lora_args(root_, ref, c.model, c.targets);
  if (c.pp > 1) set_arg(one, "train.grad_accum", "2");  // (the same micro-batches as the pipeline's)
  const ShellRun single = runs.run_single(one);
  ASSERT_EQ(single.status, 0) << single.out;
  EXPECT_NE(single.out.find("lora: rank 4, alpha 8.00"), npos) << single.out;
  auto a = lora_args(root_, name, c.model, c.targets);
  set_arg(a, "dist.tp", std::to_string(c.tp));
  set_arg(a, "dist.zero_stage", std::to_string(c.zero_stage));
  if (c.sp) set_arg(a, "dist.sequence_parallel", "true");
  if (c.pp > 1) {
    set_arg(a, "dist.pp", std::to_string(c.pp));
    set_arg(a, "train.grad_accum", "2");
  }
  const ShellRun r = runs.run_mpi(2, a);
  ASSERT_EQ(r.status, 0) << r.out;
  // The same trainable count, of the whole model, whatever the layout.
  const size_t at = single.out.find("lora: ");
  ASSERT_NE(at, npos);
  const std::string line = single.out.substr(at, single.out.find('\n', at) - at);
  EXPECT_NE(r.out.find(line), npos) << "expected \"" << line << "\" in\n" << r.out;
  if (c.tp > 1) {
    EXPECT_NE(r.out.find("tensor parallel: 2 rank(s)"), npos) << r.out;
  }
  if (c.zero_stage == 3) {  // Note [frozen block shards]: the base's block weights sharded too
    EXPECT_NE(r.out.find("ZeRO-3 also shards the blocks' "), npos) << r.out;
  }
  expect_same_run(root_ / name, root_ / ref, 1, 1e-6, 5e-5, name + " vs one process");
}

// LoRA over an FP8 base under tensor parallelism (Note [FP8 under tensor parallelism]): the frozen
// base's shards cast as the whole linear (amaxes over the tp group), the adapters' products added
// unfused; tp 2 reproduces the one-process LoRA run with the same recipe, losses and adapters
// (SGD, whose first update is the gradient itself: a wrong scale in a backward cast shows at
// once), GPT and LLaMA with sequence parallelism, tensorwise and rowwise. (Key-value heads
// replicated over the ranks are not: each rank casts its part of their gradient before the parts
// are summed, a different rounding from the whole one's; docs/fp8.md.)
TEST_F(LoraParallelTrain, Fp8BaseUnderTensorParallelismMatchesTheSingleProcessRun) {
  for (const char* recipe : {"tensorwise", "rowwise"})
    for (const char* model : {"gpt", "llama"})
      for (const int steps : {1, 12}) {
        const std::string name = std::string("fp8_") + recipe + "_" + model + "_" + std::to_string(steps),
                          ref = name + "_single";
        auto one = lora_args(root_, ref, model, std::string(model) == "gpt" ? "c_attn,c_proj,c_fc" : "q,k,v,o,down");
        set_arg(one, "run.fp8", recipe);
        set_arg(one, "optim.name", "sgd");
        set_arg(one, "optim.lr", "0.1");
        set_arg(one, "train.steps", std::to_string(steps));
        const ShellRun single = runs.run_single(one);
        ASSERT_EQ(single.status, 0) << single.out;
        auto a = one;
        set_arg(a, "run.name", name);
        set_arg(a, "dist.tp", "2");
        if (std::string(model) != "gpt") set_arg(a, "dist.sequence_parallel", "true");
        const ShellRun r = runs.run_mpi(2, a);
        ASSERT_EQ(r.status, 0) << r.out;
        EXPECT_NE(r.out.find("tensor parallel: 2 rank(s)"), npos) << r.out;
        // One step: the adapters' first update is their gradient, through every FP8 backward cast:
        // the same to f32 rounding (measured: <= 9e-7). Twelve: an order-of-sums difference can move
        // a value across an FP8 rounding boundary (a step of 1/16 in e4m3, 1/8 in e5m2) and the
        // runs part a little (measured: losses <= 2e-5; adapters <= 0.6% of their largest entry).
        if (steps == 1) expect_same_run(root_ / name, root_ / ref, 1, 1e-6, 1e-5, name + " tp2 vs one process");
        else expect_same_run(root_ / name, root_ / ref, 1, 2e-5, 1e-2, name + " tp2 vs one process");
      }
}

INSTANTIATE_TEST_SUITE_P(, LoraParallelTrain,
                         ::testing::Values(LoraCase{"gpt", "c_attn,c_proj,c_fc", 1, false, 0},
                                           LoraCase{"gpt", "c_attn,c_proj,c_fc", 1, false, 1},
                                           LoraCase{"llama", "q,k,v,o,gate,up,down", 1, false, 2},
                                           LoraCase{"gpt", "c_attn,c_proj,c_fc", 1, false, 3},
                                           LoraCase{"llama", "q,v", 1, false, 3},
                                           LoraCase{"gpt", "c_attn,c_proj,c_fc", 2, false, 0},
                                           LoraCase{"llama", "q,k,v,o,gate,up,down", 2, false, 0},
                                           LoraCase{"llama", "q,v,o,down", 2, true, 0},
                                           LoraCase{"llama_kv1", "q,k,v,o", 2, false, 0},
                                           LoraCase{"gpt", "c_attn,c_proj,c_fc", 1, false, 0, 2},
                                           LoraCase{"llama", "q,k,v,o,gate,up,down", 1, false, 0, 2}),
                         [](const ::testing::TestParamInfo<LoraCase>& i) { return case_name(i.param); });

}  // namespace
