// Context parallelism (dist.cp, dist.cp_kind) on CPU ranks (MPI), end to end through `forge
// train` under mpirun: every layout must reproduce the one-process run of the same config, alone
// and composed with data parallelism (DDP, ZeRO-1, ZeRO-3) and tensor parallelism (with and
// without sequence parallelism), for GPT and LLaMA with grouped-query attention, ring and
// Ulysses; its checkpoint is the whole model and optimizer that one process resumes; and it
// evaluates on text as one process does.
//
// What cp changes in the arithmetic: attention over the whole sequence is assembled from blocks
// combined by their logsumexp (ring) or computed whole after an all-to-all (Ulysses), each
// rank's loss is the mean over its part of the sequences and the gradients are averaged over the
// dp x cp ranks. That is rounding, as in the data- and tensor-parallel tests, so their bounds
// hold: SGD within 1e-6 for losses and weights; AdamW losses within 1e-6 and weights within 5e-5
// (Note [AdamW and summation order] in test_data_parallel.cpp). A layout mistake (a chunk at the
// wrong position, a missing key block, a gradient averaged over the wrong ranks) moves the first
// loss or the weights by far more.
//
// The models are base_args' (width 32, 2 blocks, vocabulary 256, context 16) with 4 heads; the
// LLaMA has 2 key/value heads. train.seq_len 16 cuts into 2 x cp chunks for cp 2 and 4.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "testing/cli_testing.h"
#include "train/dist_train_testing.h"
#include "train/train_testing.h"

namespace fs = std::filesystem;
using forge::testing::shell_quote;

namespace {

namespace dtt = forge::dist_train_testing;
using dtt::base_args;
using dtt::expect_same_run;
using dtt::set_arg;
using dtt::shell;
using dtt::ShellRun;
using dtt::val_losses;

const dtt::Runs runs{"forge_cp_"};
constexpr auto npos = std::string::npos;

std::vector<std::string> model_args(const fs::path& dir, const std::string& name, int64_t steps,
                                    const std::string& model, const std::string& optim = "sgd") {
  auto a = base_args(dir, name, steps, optim);
  set_arg(a, "model.n_head", "4");
  if (model == "llama") {
    set_arg(a, "model.type", "llama");
    set_arg(a, "model.dim", "32");
    set_arg(a, "model.n_kv_head", "2");
  }
  return a;
}

struct CpCase {
  const char* model;  // "gpt" or "llama" (n_kv_head 2)
  const char* optim;  // "sgd" or "adamw"
  const char* kind;   // "ring" or "ulysses"
  int world, cp, tp;  // dp = world / (cp x tp)
  bool sp;
  int zero_stage;
};

std::string case_name(const CpCase& c) {
  std::string s = std::string(c.model) + "_" + c.optim + "_" + c.kind + "_np" + std::to_string(c.world) + "_cp" +
                  std::to_string(c.cp);
  if (c.tp > 1) s += "_tp" + std::to_string(c.tp) + (c.sp ? "_sp" : "");
  if (c.world > c.cp * c.tp) s += c.zero_stage == 0 ? std::string("_ddp") : "_zero" + std::to_string(c.zero_stage);
  return s;
}

void PrintTo(const CpCase& c, std::ostream* os) { *os << case_name(c); }

void add_cp(std::vector<std::string>& a, const CpCase& c) {
  set_arg(a, "dist.cp", std::to_string(c.cp));
  set_arg(a, "dist.cp_kind", c.kind);
  if (c.tp > 1) set_arg(a, "dist.tp", std::to_string(c.tp));
  if (c.sp) set_arg(a, "dist.sequence_parallel", "true");
  set_arg(a, "dist.zero_stage", std::to_string(c.zero_stage));
}

class ContextParallelTrain : public forge::testing::ForgeCliTest {
 protected:
  static void SetUpTestSuite() { root_ = runs.test_root(); }
  static void TearDownTestSuite() { dtt::remove_scratch(runs, root_); }
  void SetUp() override {
    ForgeCliTest::SetUp();
    ASSERT_EQ(shell("command -v mpirun").status, 0) << "mpirun is missing: run scripts/install-deps.sh (openmpi-bin)";
  }
  static fs::path reference(const std::string& model, const std::string& optim) {
    const std::string name = "ref_" + model + "_" + optim;
    if (!fs::exists(root_ / name / "metrics.jsonl")) {
      const ShellRun r = runs.run_single(model_args(root_, name, 20, model, optim));
      EXPECT_EQ(r.status, 0) << "the one-process reference failed: " << r.out;
    }
    return root_ / name;
  }
  static fs::path root_;
};
fs::path ContextParallelTrain::root_;

class ContextParallelLayouts : public ContextParallelTrain, public ::testing::WithParamInterface<CpCase> {};

TEST_P(ContextParallelLayouts, MatchesTheSingleProcessRun) {
  const CpCase c = GetParam();
  const std::string name = case_name(c), o = c.optim;
  const fs::path single = reference(c.model, o);
  auto args = model_args(root_, name, 20, c.model, o);
  add_cp(args, c);
  const ShellRun r = runs.run_mpi(c.world, args);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("context parallel: " + std::to_string(c.cp) + " rank(s) per group (" + c.kind + ")"), npos)
      << r.out;
  if (c.tp > 1) {
    EXPECT_NE(r.out.find("tensor parallel: " + std::to_string(c.tp) + " rank(s)"), npos) << r.out;
  }
  expect_same_run(root_ / name, single, 1, 1e-6, o == "sgd" ? 1e-6 : 5e-5, name + " vs one process");
}

// Context parallelism with pipeline stages (cp 2 x pp 2, 4 ranks; and cp 2 x pp 2 x dp 2): every
// stage's blocks attend over the cp group on the rows' parts, the activations between stages are
// those parts, and the run trains to one process's numbers within the tolerances above.
TEST_F(ContextParallelTrain, WithPipelineStagesMatchesTheSingleProcessRun) {
  struct PpCase {
    const char *model, *optim, *kind;
    int world;
    const char* schedule;
  };
  for (const PpCase& c : {PpCase{"gpt", "adamw", "ring", 4, "1f1b"}, PpCase{"llama", "sgd", "ulysses", 4, "gpipe"},
                          PpCase{"llama", "adamw", "ring", 8, "1f1b"}}) {
    const std::string name = std::string(c.model) + "_" + c.optim + "_" + c.kind + "_np" + std::to_string(c.world) +
                             "_cp2_pp2_" + c.schedule;
    const fs::path single = reference(c.model, c.optim);
    auto args = model_args(root_, name, 20, c.model, c.optim);
    set_arg(args, "dist.cp", "2");
    set_arg(args, "dist.cp_kind", c.kind);
    set_arg(args, "dist.pp", "2");
    set_arg(args, "dist.pp_schedule", c.schedule);
    const ShellRun r = runs.run_mpi(c.world, args);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("context parallel: 2 rank(s) per group (" + std::string(c.kind) + ")"), npos) << r.out;
    EXPECT_NE(r.out.find("pipeline parallel: stage"), npos) << r.out;
    expect_same_run(root_ / name, single, 1, 1e-6, std::string(c.optim) == "sgd" ? 1e-6 : 5e-5, name + " vs one process");
  }
}

// The same layout evaluates as one process does: the first replica's stages and all its cp ranks
// run the validation windows' parts, their loss sums added over the pipeline and the cp group.
TEST_F(ContextParallelTrain, WithPipelineStagesEvaluatesOnTextAsInOneProcess) {
  auto args = model_args(root_, "cp_pp_single", 10, "llama");
  dtt::use_text_with_evaluation(args, root_ / "cp_pp_corpus");
  const ShellRun single = runs.run_single(args);
  ASSERT_EQ(single.status, 0) << single.out;
  set_arg(args, "run.name", "cp_pp_np4");
  set_arg(args, "dist.cp", "2");
  set_arg(args, "dist.pp", "2");
  const ShellRun r = runs.run_mpi(4, args);
  ASSERT_EQ(r.status, 0) << r.out;
  expect_same_run(root_ / "cp_pp_np4", root_ / "cp_pp_single", 1, 1e-6, 1e-6, "cp2 x pp2 llama on text");
  dtt::expect_same_val_losses(root_ / "cp_pp_np4", root_ / "cp_pp_single", 2);
}

// cp 2 and 4 alone, ring and Ulysses, GPT and LLaMA (GQA: at cp 2 Ulysses gives each rank one of
// the 2 key/value heads); with data parallelism (DDP, ZeRO-1, ZeRO-3 over dp x cp); with tensor
// parallelism (cp 2 x tp 2, with and without sequence parallelism), without the full product.
INSTANTIATE_TEST_SUITE_P(, ContextParallelLayouts,
                         ::testing::Values(
                             // cp alone
                             CpCase{"gpt", "sgd", "ring", 2, 2, 1, false, 0},
                             CpCase{"gpt", "adamw", "ulysses", 2, 2, 1, false, 0},
                             CpCase{"llama", "sgd", "ring", 2, 2, 1, false, 0},
                             CpCase{"llama", "adamw", "ring", 2, 2, 1, false, 0},
                             CpCase{"llama", "sgd", "ulysses", 2, 2, 1, false, 0},
                             CpCase{"gpt", "adamw", "ring", 4, 4, 1, false, 0},
                             CpCase{"llama", "sgd", "ring", 4, 4, 1, false, 0},
                             CpCase{"gpt", "sgd", "ulysses", 4, 4, 1, false, 0},
                             // cp 2 x dp 2
                             CpCase{"gpt", "sgd", "ring", 4, 2, 1, false, 0},
                             CpCase{"llama", "adamw", "ring", 4, 2, 1, false, 1},
                             CpCase{"gpt", "adamw", "ulysses", 4, 2, 1, false, 3},
                             // cp 2 x tp 2
                             CpCase{"gpt", "sgd", "ring", 4, 2, 2, false, 0},
                             CpCase{"llama", "adamw", "ring", 4, 2, 2, true, 0},
                             CpCase{"gpt", "adamw", "ulysses", 4, 2, 2, true, 0}),
                         [](const ::testing::TestParamInfo<CpCase>& i) { return case_name(i.param); });

// A cp 2 x dp 2 checkpoint (AdamW, ZeRO-1 over the four ranks) at step 10 of 20 resumes in one
// process and continues as the uninterrupted run: the checkpoint holds the whole model and the
// whole optimizer state like every other layout's.
TEST_F(ContextParallelTrain, CheckpointResumesInOneProcess) {
  const std::string full = "cp2dp2_full", part = "cp2dp2_then_single";
  const CpCase c{"llama", "adamw", "ring", 4, 2, 1, false, 1};
  auto a = model_args(root_, full, 20, c.model, c.optim);
  add_cp(a, c);
  const ShellRun r = runs.run_mpi(4, a);
  ASSERT_EQ(r.status, 0) << r.out;

  auto first = model_args(root_, part, 20, c.model, c.optim);
  add_cp(first, c);
  set_arg(first, "checkpoint.every", "10");
  set_arg(first, "train.steps", "10");
  const ShellRun b = runs.run_mpi(4, first);
  ASSERT_EQ(b.status, 0) << b.out;
  const fs::path ck = root_ / part / "checkpoints" / "step_00000010";
  ASSERT_TRUE(fs::exists(ck / "model.safetensors")) << b.out;

  auto one = model_args(root_, part, 20, c.model, c.optim);
  set_arg(one, "run.overwrite", "false");
  const ShellRun d = shell(runs.rank_env() + runs.forge_cmd(one) + " --resume " + shell_quote(ck.string()));
  ASSERT_EQ(d.status, 0) << d.out;
  EXPECT_NE(d.out.find("resume: from"), npos) << d.out;
  expect_same_run(root_ / part, root_ / full, 11, 1e-6, 5e-5, "cp2 x dp2 -> one process");
}

// A LLaMA on text at cp 2 (ring), evaluated every 5 steps: both ranks run the evaluation, each on
// its part of every sequence, and the validation losses are one process's.
TEST_F(ContextParallelTrain, EvaluatesOnTextAsInOneProcess) {
  auto args = model_args(root_, "cp_llama_single", 12, "llama");
  set_arg(args, "model.n_layer", "3");
  dtt::use_text_with_evaluation(args, root_ / "cp_corpus");
  const ShellRun single = runs.run_single(args);
  ASSERT_EQ(single.status, 0) << single.out;
  set_arg(args, "run.name", "cp_llama_np2");
  set_arg(args, "dist.cp", "2");
  const ShellRun cp = runs.run_mpi(2, args);
  ASSERT_EQ(cp.status, 0) << cp.out;
  expect_same_run(root_ / "cp_llama_np2", root_ / "cp_llama_single", 1, 1e-6, 1e-6, "cp2 llama on text");
  dtt::expect_same_val_losses(root_ / "cp_llama_np2", root_ / "cp_llama_single", 3);
}

// Layouts that cannot work are refused before any work, naming the key and the fix.
TEST_F(ContextParallelTrain, LayoutsThatCannotWorkAreRejectedBeforeStart) {
  struct Bad {
    std::vector<std::pair<std::string, std::string>> keys;
    int world;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {{{"dist.cp", "2"}, {"train.seq_len", "14"}, {"model.block_size", "16"}}, 2, "2 x dist.cp = 4 equal chunks"},
      {{{"dist.cp", "2"}, {"dist.cp_kind", "zigzag"}}, 2, "dist.cp_kind = 'zigzag' is unknown"},
      {{{"dist.cp", "4"}, {"dist.cp_kind", "ulysses"}, {"model.type", "llama"}, {"model.dim", "32"},
        {"model.n_kv_head", "2"}},
       4, "use dist.cp_kind = \"ring\""},
      {{{"dist.cp", "4"}}, 2, "dist.cp = 4 = 4 ranks per model replica"},
  };
  for (const Bad& b : bad) {
    auto args = model_args(root_, "bad", 2, "gpt");
    for (const auto& [k, v] : b.keys) set_arg(args, k, v);
    const ShellRun r = b.world == 1 ? runs.run_single(args) : runs.run_mpi(b.world, args);
    EXPECT_NE(r.status, 0) << r.out;
    EXPECT_NE(r.out.find(b.message), npos) << "expected \"" << b.message << "\" in: " << r.out;
  }
}

}  // namespace
