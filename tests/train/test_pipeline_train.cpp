// Pipeline parallelism (dist.pp, dist.pp_schedule) on CPU ranks (MPI), end to end through
// `forge train` under mpirun: every layout must reproduce the run of the same config without a
// pipeline, and its checkpoint must be the whole model that every other layout reads.
//
// As in test_data_parallel.cpp and test_tensor_parallel_train.cpp: each test starts real
// processes (`mpirun --oversubscribe -np W forge train ...`, one OpenMP thread per rank) and
// compares the loss of every step (metrics.jsonl, written by rank 0) and every parameter of the
// final checkpoint (model.safetensors) with a reference run.
//
// A pipeline splits the model by whole blocks: stage s of P runs blocks [a, b) of the 4, the first
// stage the embeddings too, the last the final norm and the head (GPT's tied wte on both, its
// gradient summed between them). Each step runs train.grad_accum = 4 micro-batches through the
// stages in the order of the schedule (1F1B or GPipe); the micro-batches, and so every block's
// arithmetic, are those of one process at the same grad_accum. What changes is the order of a
// few sums (the tied embedding's two gradient halves, the squared norms of the stages), so the
// bounds are the data-parallel tests': SGD within 1e-6 of one process for losses and weights.
// AdamW: losses within 1e-6; the weights within 5e-5 of one process at dp = 1 (Note [AdamW and
// summation order] in test_data_parallel.cpp). With dp > 1 the data-parallel averaging adds its
// own rounding, which AdamW can turn into more than 5e-5 (seen 6.1e-5 for a dp 2 LLaMA), so there
// the weights are held to 1e-6 against the pure data-parallel run at the same dp, grad_accum and
// ZeRO stage (seen up to 6.3e-7), and only the losses to one process's. A stage boundary in the wrong
// place (activations or their gradients of another micro-batch, a stage's blocks run twice, the
// tied embedding's half lost) moves the first losses or the weights by far more than that.
//
// The models are tiny (width 32, 4 heads, 4 blocks, vocabulary 256, context 16, global batch 8 as
// 4 micro-batches): pp 4 gives each stage one block.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "forge/io/hf_names.h"
#include "forge/io/safetensors.h"
#include "testing/cli_testing.h"
#include "train/dist_train_testing.h"
#include "train/train_testing.h"

namespace fs = std::filesystem;
using forge::testing::forge_binary;
using forge::testing::shell_quote;

namespace {

namespace dtt = forge::dist_train_testing;
using dtt::base_args;
using dtt::expect_same_run;
using dtt::final_params;
using dtt::max_rel;
using dtt::parameter_lines;
using dtt::val_losses;
using dtt::set_arg;
using dtt::shell;
using dtt::ShellRun;

// This file's scratch and Open MPI session directories: /tmp/forge_pp_<pid>, /tmp/forge_pp_ompi_<pid>.
const dtt::Runs runs{"forge_pp_"};
std::string mpirun(int ranks) {
  return runs.rank_env() + "mpirun --oversubscribe --bind-to none -np " + std::to_string(ranks) + " ";
}

constexpr auto npos = std::string::npos;

// The run of base_args with 4 heads, 4 blocks and 4 micro-batches per step, as `model`: "gpt" or
// "llama" (model.dim 32, n_kv_head 2).
std::vector<std::string> model_args(const fs::path& dir, const std::string& name, int64_t steps,
                                    const std::string& model, const std::string& optim = "sgd") {
  auto a = base_args(dir, name, steps, optim);
  set_arg(a, "model.n_head", "4");
  set_arg(a, "model.n_layer", "4");
  set_arg(a, "train.grad_accum", "4");
  if (model == "llama") {
    set_arg(a, "model.type", "llama");
    set_arg(a, "model.dim", "32");
    set_arg(a, "model.n_kv_head", "2");
  }
  return a;
}

// The dist keys of a pipeline layout. dist.pp_schedule is given only for GPipe, so the 1F1B runs
// take the default.
void add_pp(std::vector<std::string>& a, int pp, const std::string& schedule, int zero_stage = 0) {
  set_arg(a, "dist.pp", std::to_string(pp));
  set_arg(a, "dist.zero_stage", std::to_string(zero_stage));
  if (schedule != "1f1b") set_arg(a, "dist.pp_schedule", schedule);
  if (schedule == "interleaved") set_arg(a, "dist.pp_virtual_stages", "2");
}

// What the run logs (the contract; rank 0, the first stage of the first replica, speaks for the
// job): the model's split, "pipeline parallel: P stages (schedule), stage 0 runs blocks [0, b)",
// with `n_layer` blocks split evenly (the first stages one more: the tiny models' head costs less
// than a block, so the balanced split is the even one); the strategy's "pipeline
// parallel: stage 0 of P on each of dp data-parallel rank(s)"; and the layout.
void expect_pp_log(const ShellRun& r, int pp, const std::string& schedule, int dp, int n_layer = 4) {
  const int parts = schedule == "interleaved" ? 2 * pp : pp;  // (interleaved: 2 chunks per rank)
  const int end = n_layer / parts + (n_layer % parts > 0 ? 1 : 0);
  const std::string split = "pipeline parallel: " + std::to_string(pp) + " stages (" + schedule +
                            "), stage 0 runs blocks [0, " + std::to_string(end) + ")";
  EXPECT_NE(r.out.find(split), npos) << split << "\n" << r.out;
  const std::string stage = "pipeline parallel: stage 0 of " + std::to_string(pp) + " on each of " +
                            std::to_string(dp) + " data-parallel rank(s)";
  EXPECT_NE(r.out.find(stage), npos) << stage << "\n" << r.out;
  const std::string layout = "layout: dp " + std::to_string(dp) + ", tp 1, pp " + std::to_string(pp);
  EXPECT_NE(r.out.find(layout), npos) << layout << "\n" << r.out;
}

// Every step's loss of run `got` within `tol` (relative) of `want`'s, and as many steps.
void expect_same_losses(const fs::path& got, const fs::path& want, double tol, const std::string& what) {
  const auto lg = dtt::losses(got), lw = dtt::losses(want);
  ASSERT_FALSE(lw.empty()) << what << ": no losses in " << want;
  ASSERT_EQ(lg.size(), lw.size()) << what;
  for (const auto& [step, l] : lw) {
    ASSERT_TRUE(lg.count(step)) << what << ": no loss at step " << step;
    EXPECT_LE(std::abs(lg.at(step) - l) / std::abs(l), tol)
        << what << ": loss at step " << step << " is " << lg.at(step) << ", the reference's " << l;
  }
}

class PipelineTrain : public forge::testing::ForgeCliTest {
 protected:
  static void SetUpTestSuite() { root_ = runs.test_root(); }
  static void TearDownTestSuite() { dtt::remove_scratch(runs, root_); }
  void SetUp() override {
    ForgeCliTest::SetUp();
    ASSERT_EQ(shell("command -v mpirun").status, 0) << "mpirun is missing: run scripts/install-deps.sh (openmpi-bin)";
  }
  // The run of `model` with `optim` for 20 steps without a pipeline: in one process (ranks = 0),
  // or data parallel on `ranks` ranks with ZeRO stage `zero_stage`. Made once per test process
  // when first needed (ctest runs each test in its own process).
  static fs::path reference(const std::string& model, const std::string& optim, int ranks = 0, int zero_stage = 0) {
    const std::string name = "ref_" + model + "_" + optim +
                             (ranks > 0 ? "_np" + std::to_string(ranks) + "_zero" + std::to_string(zero_stage) : "");
    if (!fs::exists(root_ / name / "metrics.jsonl")) {
      auto a = model_args(root_, name, 20, model, optim);
      if (ranks > 0) set_arg(a, "dist.zero_stage", std::to_string(zero_stage));
      const ShellRun r = ranks > 0 ? runs.run_mpi(ranks, a) : runs.run_single(a);
      EXPECT_EQ(r.status, 0) << "the reference " << name << " failed: " << r.out;
    }
    return root_ / name;
  }
  static fs::path root_;
};
fs::path PipelineTrain::root_;

struct PpCase {
  const char* model;     // "gpt" or "llama"
  const char* optim;     // "sgd" or "adamw"
  int world;
  int pp;                // dp = world / pp
  const char* schedule;  // "1f1b", "gpipe" or "zb-h1"
  int zero_stage;        // on each stage's data-parallel group
};

std::string case_name(const PpCase& c) {
  std::string dp_layout;  // only where there is a dp group to lay out
  if (c.world > c.pp) dp_layout = c.zero_stage == 0 ? std::string("_ddp") : "_zero" + std::to_string(c.zero_stage);
  std::string schedule = c.schedule;
  schedule.erase(std::remove(schedule.begin(), schedule.end(), '-'), schedule.end());  // (a test name's characters)
  return std::string(c.model) + "_" + c.optim + "_np" + std::to_string(c.world) + "_pp" + std::to_string(c.pp) + "_" +
         schedule + dp_layout;
}

void PrintTo(const PpCase& c, std::ostream* os) { *os << case_name(c); }

class PipelineLayouts : public PipelineTrain, public ::testing::WithParamInterface<PpCase> {};

TEST_P(PipelineLayouts, MatchesTheRunWithoutAPipeline) {
  const PpCase c = GetParam();
  const std::string name = case_name(c), o = c.optim;
  const int dp = c.world / c.pp;
  const fs::path single = reference(c.model, o);  // first: a failure of the pp run is then never the config's
  auto args = model_args(root_, name, 20, c.model, o);
  add_pp(args, c.pp, c.schedule, c.zero_stage);
  const ShellRun r = runs.run_mpi(c.world, args);
  ASSERT_EQ(r.status, 0) << r.out;
  expect_pp_log(r, c.pp, c.schedule, dp);
  {  // the job's memory: per GPU and per stage, in the final record and the log
    std::ifstream in(root_ / name / "metrics.jsonl");
    nlohmann::json last;
    for (std::string line; std::getline(in, line);) last = nlohmann::json::parse(line);
    ASSERT_TRUE(last.value("final", false)) << last.dump();
    ASSERT_EQ(last["mem_bytes_per_stage"].size(), static_cast<size_t>(c.pp)) << last.dump();
    for (const auto& m : last["mem_bytes_per_stage"]) EXPECT_GT(m.get<double>(), 0) << last.dump();
    EXPECT_GE(last["mem_bytes_max"].get<double>(), last["mem_bytes_per_stage"][0].get<double>());
    EXPECT_NE(r.out.find("per pipeline stage 0: "), npos) << r.out;
    EXPECT_NE(r.out.find("memory: peak per process "), npos) << r.out;  // CPU ranks: no "per GPU"
    const size_t header = r.out.find("forge train ");  // the job's header once, from rank 0
    EXPECT_NE(header, npos) << r.out;
    EXPECT_EQ(r.out.find("forge train ", header + 1), npos) << r.out;
  }
  if (o == "sgd") {
    expect_same_run(root_ / name, single, 1, 1e-6, 1e-6, name);
  } else if (dp == 1) {
    expect_same_run(root_ / name, single, 1, 1e-6, 5e-5, name + " vs one process");
  } else {
    expect_same_losses(root_ / name, single, 1e-6, name + " vs one process");
    const fs::path data_parallel = reference(c.model, o, dp, c.zero_stage);
    expect_same_run(root_ / name, data_parallel, 1, 1e-6, 1e-6, name + " vs data parallel at dp " + std::to_string(dp));
  }
}

// pp 2, pp 3 (uneven stages) and pp 4 (dp 1), and pp 2 x dp 2; every schedule; GPT (tied head)
// and LLaMA; SGD and AdamW; DDP, ZeRO-1 and ZeRO-2 (LLaMA: GPT's tied head is refused with
// ZeRO-2) on the data-parallel groups, without running the full product.
INSTANTIATE_TEST_SUITE_P(, PipelineLayouts,
                         ::testing::Values(
                             // pp 2 (dp 1)
                             PpCase{"gpt", "sgd", 2, 2, "1f1b", 0}, PpCase{"gpt", "adamw", 2, 2, "gpipe", 0},
                             PpCase{"llama", "sgd", 2, 2, "gpipe", 0}, PpCase{"llama", "adamw", 2, 2, "1f1b", 0},
                             // pp 4 (dp 1): one block per stage
                             PpCase{"gpt", "sgd", 4, 4, "gpipe", 0}, PpCase{"gpt", "adamw", 4, 4, "1f1b", 0},
                             PpCase{"llama", "sgd", 4, 4, "1f1b", 0}, PpCase{"llama", "adamw", 4, 4, "gpipe", 0},
                             // pp 3: blocks [0, 2), [2, 3), [3, 4)
                             PpCase{"gpt", "sgd", 3, 3, "gpipe", 0}, PpCase{"llama", "adamw", 3, 3, "1f1b", 0},
                             // pp 2 x dp 2
                             PpCase{"gpt", "sgd", 4, 2, "1f1b", 0}, PpCase{"gpt", "sgd", 4, 2, "gpipe", 1},
                             PpCase{"gpt", "adamw", 4, 2, "gpipe", 0}, PpCase{"gpt", "adamw", 4, 2, "1f1b", 1},
                             PpCase{"llama", "sgd", 4, 2, "1f1b", 2}, PpCase{"llama", "adamw", 4, 2, "1f1b", 0},
                             PpCase{"llama", "adamw", 4, 2, "gpipe", 2},
                             // ZB-H1: the weight passes queued and run late (pp 2, 3, 4; DDP and ZeRO-1)
                             PpCase{"gpt", "sgd", 2, 2, "zb-h1", 0}, PpCase{"llama", "sgd", 3, 3, "zb-h1", 0},
                             PpCase{"llama", "adamw", 4, 4, "zb-h1", 0}, PpCase{"gpt", "adamw", 4, 2, "zb-h1", 1},
                             PpCase{"llama", "sgd", 4, 2, "zb-h1", 0},
                             // Interleaved: 2 chunks per rank (virtual stages 0 2 on rank 0, 1 3 on rank 1)
                             PpCase{"gpt", "sgd", 2, 2, "interleaved", 0}, PpCase{"llama", "adamw", 2, 2, "interleaved", 0},
                             PpCase{"gpt", "adamw", 4, 2, "interleaved", 1}, PpCase{"llama", "sgd", 4, 2, "interleaved", 2}),
                         [](const ::testing::TestParamInfo<PpCase>& i) { return case_name(i.param); });

// A checkpoint written by pp 2 x dp 2 (4 ranks, ZeRO-1, AdamW) at step 10 of 20 resumes at pp 4 on
// 4 ranks (dp 1, DDP) and in one process without dist; each continues with the losses and weights
// of the uninterrupted 4-rank run. GPT, whose tied embedding lives on the first and the last stage
// (both copies must come back from the one tensor of the checkpoint), and whose ZeRO-1 optimizer
// state is written as each stage's data-parallel shards of whole parameters.
TEST_F(PipelineTrain, PpTwoByDpTwoCheckpointResumesAtPpFourAndInOneProcess) {
  const std::string full = "pp2dp2_full", resumed = "pp2dp2_then_pp4", single = "pp2dp2_then_single";
  auto a = model_args(root_, full, 20, "gpt", "adamw");
  add_pp(a, 2, "1f1b", 1);
  const ShellRun r = runs.run_mpi(4, a);
  ASSERT_EQ(r.status, 0) << r.out;
  expect_pp_log(r, 2, "1f1b", 2);

  auto first = model_args(root_, resumed, 20, "gpt", "adamw");
  add_pp(first, 2, "1f1b", 1);
  set_arg(first, "checkpoint.every", "10");
  set_arg(first, "train.steps", "10");
  const ShellRun b = runs.run_mpi(4, first);
  ASSERT_EQ(b.status, 0) << b.out;
  const fs::path ck = root_ / resumed / "checkpoints" / "step_00000010";
  ASSERT_TRUE(fs::exists(ck / "model.safetensors")) << "no checkpoint at step 10: " << b.out;

  auto second = model_args(root_, resumed, 20, "gpt", "adamw");
  add_pp(second, 4, "gpipe", 0);
  set_arg(second, "run.overwrite", "false");
  const ShellRun c = shell(mpirun(4) + runs.forge_cmd(second) + " --resume");
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_NE(c.out.find("resume: from"), npos) << c.out;
  expect_pp_log(c, 4, "gpipe", 1);
  expect_same_run(root_ / resumed, root_ / full, 11, 1e-6, 1e-6, "pp2 x dp2 -> pp4");

  auto one = model_args(root_, single, 20, "gpt", "adamw");
  set_arg(one, "run.overwrite", "false");
  const ShellRun d = shell(runs.rank_env() + runs.forge_cmd(one) + " --resume " + shell_quote(ck.string()));
  ASSERT_EQ(d.status, 0) << d.out;
  EXPECT_NE(d.out.find("resume: from"), npos) << d.out;
  expect_same_run(root_ / single, root_ / full, 11, 1e-6, 1e-6, "pp2 x dp2 -> one process");
}

// The other way: a one-process checkpoint (LLaMA, AdamW) resumes at pp 2, each stage taking its
// blocks' weights and AdamW moments from the whole ones, and continues as the one process does.
// (Moments lost or given to the wrong block would move the weights by ~lr, orders of magnitude
// beyond the tolerance.) A one-process checkpoint's optimizer state is keyed by slot, in the order
// of optim::decay_groups (matrices first): the stage's emptied tensors keep their rank, so the
// stage rebuilds that order (it once did not: the slots landed on other parameters).
// pp 2 x dp 2 on 4 simulated nodes of one rank (dist.node_size = 1), every stage-to-stage transfer
// and data-parallel reduction paced by a 20 Gb/s link, the data-parallel one hierarchical (here one
// rank per node: the flat ring, paced): the numbers of the unpaced run (Note [paced link] delays,
// never changes, what arrives).
TEST_F(PipelineTrain, PacedLinksBetweenSimulatedNodesChangeNoNumber) {
  auto a = model_args(root_, "pp2dp2_paced", 20, "gpt", "adamw");
  add_pp(a, 2, "1f1b", 1);
  set_arg(a, "dist.node_size", "1");
  set_arg(a, "dist.link_gbps", "20");
  set_arg(a, "dist.dp_reduce", "hierarchical");
  const ShellRun r = runs.run_mpi(4, a);
  ASSERT_EQ(r.status, 0) << r.out;
  expect_pp_log(r, 2, "1f1b", 2);
  if (!fs::exists(root_ / "pp2dp2_full" / "metrics.jsonl")) {
    auto b = model_args(root_, "pp2dp2_full", 20, "gpt", "adamw");
    add_pp(b, 2, "1f1b", 1);
    const ShellRun s = runs.run_mpi(4, b);
    ASSERT_EQ(s.status, 0) << s.out;
  }
  expect_same_run(root_ / "pp2dp2_paced", root_ / "pp2dp2_full", 1, 0, 0, "paced vs not");
}

// dist.grad_compression = "fp8" on the stages' data-parallel groups (pp 2 x dp 2, ZeRO-1): it
// says so, and the losses stay within 0.5% of the uncompressed run's at every step (the coded
// reductions change the numbers a little, so not bit for bit: Note [FP8 gradient reduction]).
TEST_F(PipelineTrain, Fp8GradientReductionOnTheStagesDataParallelGroups) {
  auto a = model_args(root_, "pp2dp2_fp8", 20, "gpt", "adamw");
  add_pp(a, 2, "1f1b", 1);
  set_arg(a, "dist.grad_compression", "fp8");
  const ShellRun r = runs.run_mpi(4, a);
  ASSERT_EQ(r.status, 0) << r.out;
  expect_pp_log(r, 2, "1f1b", 2);
  EXPECT_NE(r.out.find("(ZeRO-1, gradients sent in FP8)"), std::string::npos) << r.out;
  if (!fs::exists(root_ / "pp2dp2_full" / "metrics.jsonl")) {
    auto b = model_args(root_, "pp2dp2_full", 20, "gpt", "adamw");
    add_pp(b, 2, "1f1b", 1);
    const ShellRun s = runs.run_mpi(4, b);
    ASSERT_EQ(s.status, 0) << s.out;
  }
  const auto lf = dtt::losses(root_ / "pp2dp2_fp8"), lp = dtt::losses(root_ / "pp2dp2_full");
  ASSERT_EQ(lf.size(), lp.size());
  bool differs = false;
  for (const auto& [step, l] : lf) {
    EXPECT_LT(std::abs(l - lp.at(step)) / lp.at(step), 0.005) << "step " << step;
    differs = differs || l != lp.at(step);
  }
  EXPECT_TRUE(differs) << "bit for bit the uncompressed run: nothing was coded";
}

TEST_F(PipelineTrain, OneProcessCheckpointResumesAtPpTwo) {
  const fs::path want = reference("llama", "adamw");
  const std::string name = "llama_single_then_pp2";
  auto first = model_args(root_, name, 20, "llama", "adamw");
  set_arg(first, "checkpoint.every", "10");
  set_arg(first, "train.steps", "10");
  const ShellRun a = runs.run_single(first);
  ASSERT_EQ(a.status, 0) << a.out;
  ASSERT_TRUE(fs::exists(root_ / name / "checkpoints" / "step_00000010" / "model.safetensors")) << a.out;

  auto second = model_args(root_, name, 20, "llama", "adamw");
  add_pp(second, 2, "1f1b", 0);
  set_arg(second, "run.overwrite", "false");
  const ShellRun b = shell(mpirun(2) + runs.forge_cmd(second) + " --resume");
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_NE(b.out.find("resume: from"), npos) << b.out;
  expect_pp_log(b, 2, "1f1b", 1);
  expect_same_run(root_ / name, want, 11, 1e-6, 5e-5, "one process -> pp2");
}

// A data-parallel checkpoint (2 ranks, ZeRO-1, no pipeline; LLaMA, AdamW) resumes at pp 2 x dp 2
// with ZeRO-2 on 4 ranks, each stage's data-parallel ranks taking their shards of their blocks'
// moments from the whole-parameter ranges, and continues as the uninterrupted data-parallel run
// (same dp, so AdamW is held to 1e-6 there).
TEST_F(PipelineTrain, DataParallelCheckpointResumesAtPpTwoByDpTwo) {
  const fs::path want = reference("llama", "adamw", 2, 1);
  const std::string name = "llama_dp2_then_pp2dp2";
  auto first = model_args(root_, name, 20, "llama", "adamw");
  set_arg(first, "dist.zero_stage", "1");
  set_arg(first, "checkpoint.every", "10");
  set_arg(first, "train.steps", "10");
  const ShellRun a = runs.run_mpi(2, first);
  ASSERT_EQ(a.status, 0) << a.out;
  ASSERT_TRUE(fs::exists(root_ / name / "checkpoints" / "step_00000010" / "model.safetensors")) << a.out;

  auto second = model_args(root_, name, 20, "llama", "adamw");
  add_pp(second, 2, "gpipe", 2);
  set_arg(second, "run.overwrite", "false");
  const ShellRun b = shell(mpirun(4) + runs.forge_cmd(second) + " --resume");
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_NE(b.out.find("resume: from"), npos) << b.out;
  expect_pp_log(b, 2, "gpipe", 2);
  expect_same_run(root_ / name, want, 11, 1e-6, 1e-6, "dp2 -> pp2 x dp2");
}

// A LLaMA on text at pp 2 (3 blocks: stage 0 runs two, stage 1 one), evaluated every 5 steps
// through the pipeline (the first stage embeds, the last computes the loss); then at pp 2 x dp 2,
// where the first replica's stages evaluate and the second's wait. Training losses, validation
// losses and weights as in one process.
TEST_F(PipelineTrain, LlamaEvaluatesOnTextAsInOneProcess) {
  auto args = model_args(root_, "pp_llama_single", 12, "llama");
  set_arg(args, "model.n_layer", "3");
  dtt::use_text_with_evaluation(args, root_ / "pp_corpus");
  const ShellRun single = runs.run_single(args);
  ASSERT_EQ(single.status, 0) << single.out;
  const auto vs = val_losses(root_ / "pp_llama_single");
  ASSERT_EQ(vs.size(), 3u) << "evaluations at steps 5, 10 and the end";
  for (const int world : {2, 4}) {
    const std::string name = "pp_llama_np" + std::to_string(world);
    set_arg(args, "run.name", name);
    add_pp(args, 2, "1f1b");
    const ShellRun pp = runs.run_mpi(world, args);
    ASSERT_EQ(pp.status, 0) << pp.out;
    expect_pp_log(pp, 2, "1f1b", world / 2, 3);
    expect_same_run(root_ / name, root_ / "pp_llama_single", 1, 1e-6, 1e-6, "pp2 llama on text, " + name);
    const auto vp = val_losses(root_ / name);
    ASSERT_EQ(vp.size(), vs.size()) << name;
    for (size_t i = 0; i < vp.size(); ++i)
      EXPECT_NEAR(vp[i], vs[i], 1e-6 * std::abs(vs[i])) << name << ", evaluation " << i;
  }
}

// Fewer micro-batches than stages (train.grad_accum 1 and 2 at pp 4): 1F1B's warm-up is cut to
// the micro-batches there are, most stages idle; still one process's run at the same grad_accum.
TEST_F(PipelineTrain, FewerMicroBatchesThanStagesMatchOneProcess) {
  for (const int k : {1, 2}) {
    const std::string single = "accum" + std::to_string(k) + "_single", pp = "accum" + std::to_string(k) + "_pp4";
    auto args = model_args(root_, single, 10, "llama");
    set_arg(args, "train.grad_accum", std::to_string(k));
    const ShellRun a = runs.run_single(args);
    ASSERT_EQ(a.status, 0) << a.out;
    set_arg(args, "run.name", pp);
    add_pp(args, 4, "1f1b");
    const ShellRun b = runs.run_mpi(4, args);
    ASSERT_EQ(b.status, 0) << b.out;
    expect_pp_log(b, 4, "1f1b", 1);
    const std::string split = std::to_string(k) + " micro-batch(es) of " + std::to_string(8 / k) + " row(s)";
    EXPECT_NE(b.out.find(split), npos) << split << "\n" << b.out;
    expect_same_run(root_ / pp, root_ / single, 1, 1e-6, 1e-6, "pp4 at grad_accum " + std::to_string(k));
  }
}

// f16 with dynamic loss scaling and activation checkpointing at pp 2 x dp 2 with ZeRO-2 (LLaMA):
// the activations and their gradients travel between the stages in f16, the unscaled gradient
// norm is summed over the pipeline, the overflow verdict agreed by every stage, and the
// checkpointed blocks recompute in backward. The losses follow the one-process f16 run (the
// reductions' order differs: 1e-5), the f16 weights to 1e-3 of their largest entry.
TEST_F(PipelineTrain, F16WithCheckpointedActivationsMatchesOneProcess) {
  auto args = model_args(root_, "f16_single", 10, "llama");
  set_arg(args, "run.dtype", "f16");
  set_arg(args, "model.checkpoint_activations", "true");
  const ShellRun single = runs.run_single(args);
  ASSERT_EQ(single.status, 0) << single.out;
  set_arg(args, "run.name", "f16_pp2_dp2");
  add_pp(args, 2, "1f1b", 2);
  const ShellRun pp = runs.run_mpi(4, args);
  ASSERT_EQ(pp.status, 0) << pp.out;
  expect_pp_log(pp, 2, "1f1b", 2);
  expect_same_run(root_ / "f16_pp2_dp2", root_ / "f16_single", 1, 1e-5, 1e-3, "f16 pp2 x dp2");
}

// forge export and forge sample read a pp checkpoint like any other (the model is whole in it,
// gathered from the stages): export writes HF names and layouts that import back to the
// checkpoint's weights exactly, with the whole model's shapes and config; sample generates from
// it. A GPT with biases on text (so that the run has a tokenizer), at pp 2.
TEST_F(PipelineTrain, ExportAndSampleReadAPipelineCheckpoint) {
  const fs::path corpus = root_ / "export_corpus";
  forge::train_testing::write_corpus(corpus);
  auto args = model_args(root_, "export_pp2", 3, "gpt");
  set_arg(args, "model.bias", "true");
  set_arg(args, "model.vocab_size", "0");
  set_arg(args, "data.source", "files");
  set_arg(args, "data.files", "[\"" + corpus.string() + "\"]");
  set_arg(args, "data.vocab_size", "300");
  set_arg(args, "data.val_fraction", "0.1");
  add_pp(args, 2, "1f1b");
  const ShellRun r = runs.run_mpi(2, args);
  ASSERT_EQ(r.status, 0) << r.out;
  expect_pp_log(r, 2, "1f1b", 1);

  const fs::path run = root_ / "export_pp2", out = root_ / "export_pp2_hf";
  const auto ck = final_params(run);
  ASSERT_FALSE(ck.empty());
  for (const auto& [name, t] : ck) EXPECT_GT(t.numel(), 0) << name << " is empty: a stage's tensor was not gathered";
  const ShellRun e = shell(shell_quote(forge_binary().string()) + " export --checkpoint " + shell_quote(run.string()) +
                           " --out " + shell_quote(out.string()));
  ASSERT_EQ(e.status, 0) << e.out;
  const auto hf = forge::io::load_safetensors(out / "model.safetensors").tensors;
  for (const std::string block : {"0", "3"}) {  // the first stage's and the last stage's
    const forge::Tensor* w = hf.find("transformer.h." + block + ".attn.c_attn.weight");
    ASSERT_NE(w, nullptr) << "block " << block;
    EXPECT_EQ(w->shape(), (forge::Shape{32, 96})) << "block " << block;
  }
  const forge::Tensor* wte = hf.find("transformer.wte.weight");
  ASSERT_NE(wte, nullptr);
  EXPECT_EQ(wte->shape(), (forge::Shape{300, 32}));
  const forge::Tensor* lnf = hf.find("transformer.ln_f.weight");  // the last stage's
  ASSERT_NE(lnf, nullptr);
  EXPECT_EQ(lnf->shape(), (forge::Shape{32}));
  std::ifstream cfg(out / "config.json");
  const auto j = nlohmann::json::parse(cfg);
  EXPECT_EQ(j["n_layer"], 4);
  EXPECT_EQ(j["n_head"], 4);
  EXPECT_EQ(j["n_embd"], 32);
  EXPECT_EQ(j["vocab_size"], 300);
  const auto back = forge::io::gpt2_from_hf(hf.items());
  EXPECT_EQ(back.size(), ck.size());
  for (const auto& [name, t] : back) {
    const forge::Tensor* o = ck.find(name);
    ASSERT_NE(o, nullptr) << name;
    ASSERT_EQ(o->shape(), t.shape()) << name;
    EXPECT_EQ(max_rel(t, *o), 0.0) << name;
  }

  const ShellRun s = shell(shell_quote(forge_binary().string()) + " sample --checkpoint " + shell_quote(run.string()) +
                           " --prompt 'A dog' --tokens 10 --seed 3");
  ASSERT_EQ(s.status, 0) << s.out;
  EXPECT_NE(s.out.find("A dog"), npos) << s.out;
}

// The log reports the whole model's parameter count, not one stage's: the same line as one
// process's, for a GPT (its tied embedding held by two stages, counted once) and a LLaMA, at pp 2
// and pp 4.
TEST_F(PipelineTrain, TheLogReportsTheWholeModelsParameterCount) {
  for (const std::string model : {"gpt", "llama"}) {
    const ShellRun single = runs.run_single(model_args(root_, "count_single_" + model, 2, model));
    ASSERT_EQ(single.status, 0) << single.out;
    const auto want = parameter_lines(single.out, model);
    ASSERT_EQ(want.size(), 1u) << single.out;
    for (const int pp : {2, 4}) {
      auto args = model_args(root_, "count_pp" + std::to_string(pp) + "_" + model, 2, model);
      add_pp(args, pp, "1f1b");
      const ShellRun r = runs.run_mpi(pp, args);
      ASSERT_EQ(r.status, 0) << r.out;
      const auto got = parameter_lines(r.out, model);
      ASSERT_FALSE(got.empty()) << r.out;
      for (const auto& line : got) EXPECT_EQ(line, want[0]) << model << " at pp " << pp;
    }
  }
}

// 3D: pipeline x tensor parallelism, and dp x tp x pp = 2 x 2 x 2 on 8 ranks. Each stage's model
// is split over its tensor-parallel group (GPT's tied embedding too: its vocabulary shards summed
// between the first and last stage per tensor-parallel rank); the gradient norm sums over the
// tp x pp ranks of a replica; sequence parallelism sends the stages' sequence slices. SGD against
// one process (1e-6). Then a pp 2 x tp 2 AdamW checkpoint resumed in one process and at tp 4,
// each continuing as the uninterrupted run.
TEST_F(PipelineTrain, PipelineByTensorParallelMatchesOneProcess) {
  struct Case {
    const char* name;
    const char* model;
    int ranks, tp;
    bool sp;
    const char* schedule;
    int zero_stage;
  };
  for (const Case& c : {Case{"gpt_pp2_tp2", "gpt", 4, 2, false, "1f1b", 0},
                        Case{"gpt_pp2_tp2_sp_gpipe", "gpt", 4, 2, true, "gpipe", 0},
                        Case{"llama_pp2_tp2_sp_zbh1", "llama", 4, 2, true, "zb-h1", 0},
                        Case{"llama_dp2_tp2_pp2_sp_zero1", "llama", 8, 2, true, "1f1b", 1},
                        Case{"gpt_dp2_tp2_pp2", "gpt", 8, 2, false, "zb-h1", 1},
                        Case{"llama_pp2_tp2_sp_interleaved", "llama", 4, 2, true, "interleaved", 0}}) {
    const fs::path single = reference(c.model, "sgd");
    auto args = model_args(root_, c.name, 20, c.model, "sgd");
    add_pp(args, 2, c.schedule, c.zero_stage);
    set_arg(args, "dist.tp", std::to_string(c.tp));
    if (c.sp) set_arg(args, "dist.sequence_parallel", "true");
    const ShellRun r = runs.run_mpi(c.ranks, args);
    ASSERT_EQ(r.status, 0) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find("tensor parallel: 2 rank(s) per group"), npos) << r.out;
    EXPECT_NE(r.out.find("pipeline parallel: 2 stages (" + std::string(c.schedule) + ")"), npos) << r.out;
    EXPECT_NE(r.out.find("layout: dp " + std::to_string(c.ranks / 4) + ", tp 2" + (c.sp ? " (+sp)" : "") + ", pp 2"),
              npos)
        << r.out;
    expect_same_run(root_ / c.name, single, 1, 1e-6, 1e-6, c.name);
  }
  // A pp 2 x tp 2 checkpoint (AdamW) resumes in one process and at tp 4.
  auto full = model_args(root_, "pp2_tp2_full", 20, "gpt", "adamw");
  add_pp(full, 2, "1f1b", 0);
  set_arg(full, "dist.tp", "2");
  ASSERT_EQ(runs.run_mpi(4, full).status, 0);
  auto half = full;
  set_arg(half, "run.name", "pp2_tp2_half");
  set_arg(half, "train.steps", "10");
  set_arg(half, "checkpoint.every", "10");
  ASSERT_EQ(runs.run_mpi(4, half).status, 0);
  const fs::path ck = root_ / "pp2_tp2_half" / "checkpoints" / "step_00000010";
  for (const std::string then : {"one", "tp4"}) {
    auto next = model_args(root_, "pp2_tp2_then_" + then, 20, "gpt", "adamw");
    set_arg(next, "run.overwrite", "false");
    if (then == "tp4") set_arg(next, "dist.tp", "4");
    const ShellRun r = then == "one" ? shell(runs.rank_env() + runs.forge_cmd(next) + " --resume " + ck.string())
                                     : shell(mpirun(4) + runs.forge_cmd(next) + " --resume " + ck.string());
    ASSERT_EQ(r.status, 0) << r.out;
    expect_same_run(root_ / ("pp2_tp2_then_" + then), root_ / "pp2_tp2_full", 11, 1e-6, 1e-6,
                    "pp2 x tp2 -> " + then);
  }
}

// dist.pp_layers: the stages take the given blocks ([3, 1]: the head's stage lighter; [1, 1, 2]),
// with the numbers of one process.
TEST_F(PipelineTrain, GivenStageBlocksMatchOneProcess) {
  const fs::path single = reference("llama", "sgd");
  for (const auto& [ranks, layers, first] : {std::tuple<int, const char*, const char*>{2, "3,1", "[0, 3)"},
                                             std::tuple<int, const char*, const char*>{3, "1,1,2", "[0, 1)"}}) {
    const std::string name = "pp_layers_" + std::to_string(ranks);
    auto args = model_args(root_, name, 20, "llama", "sgd");
    add_pp(args, ranks, "1f1b", 0);
    set_arg(args, "dist.pp_layers", layers);
    const ShellRun r = runs.run_mpi(ranks, args);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find(std::string("stage 0 runs blocks ") + first), npos) << r.out;
    expect_same_run(root_ / name, single, 1, 1e-6, 1e-6, name);
  }
}

// Without dist.pp_layers the split is balanced by forge plan's cost (Note [balanced pipeline
// stages]): with a vocabulary of 2048 the head costs about 5 of these blocks, so of 4 blocks the
// last of 2 stages takes 1 ([0, 3) on the first), still with the numbers of one process.
TEST_F(PipelineTrain, TheDefaultSplitLeavesTheHeadsStageLighter) {
  auto single_args = model_args(root_, "ref_llama_v2048", 20, "llama", "sgd");
  set_arg(single_args, "model.vocab_size", "2048");
  ASSERT_EQ(runs.run_single(single_args).status, 0);
  auto args = model_args(root_, "balanced_v2048", 20, "llama", "sgd");
  set_arg(args, "model.vocab_size", "2048");
  add_pp(args, 2, "1f1b", 0);
  const ShellRun r = runs.run_mpi(2, args);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("stage 0 runs blocks [0, 3)"), npos) << r.out;
  expect_same_run(root_ / "balanced_v2048", root_ / "ref_llama_v2048", 1, 1e-6, 1e-6, "balanced split");
}

// Layouts that cannot work are refused before any work (no checkpoint, no metrics), naming the keys.
TEST_F(PipelineTrain, LayoutsThatCannotWorkAreRejectedBeforeStart) {
  struct Refused {
    const char* name;
    int ranks;  // 0: one process
    std::vector<std::pair<std::string, std::string>> keys;
    const char* message;
  };
  const std::vector<Refused> cases = {
      // GPT's tied embedding: its two stages would shard its gradient differently
      {"gpt_zero2", 2, {{"dist.pp", "2"}, {"dist.zero_stage", "2"}},
       "with dist.pp = 2 and a head tied to the embedding (GPT) is not supported yet"},
      {"gpt_zero2_dp2", 4, {{"dist.pp", "2"}, {"dist.zero_stage", "2"}},
       "with dist.pp = 2 and a head tied to the embedding (GPT) is not supported yet"},
      {"pp2_tp2_one", 0, {{"dist.pp", "2"}, {"dist.tp", "2"}}, "dist.tp = 2 x dist.pp = 2 = 4 ranks per model replica"},
      {"pp2_zero3", 2, {{"dist.pp", "2"}, {"dist.zero_stage", "3"}}, "dist.zero_stage = 3 with dist.pp = 2"},
      {"pp2_dropout", 2, {{"dist.pp", "2"}, {"model.dropout", "0.1"}}, "with dist.pp = 2 is not supported yet"},
      {"pp2_schedule", 2, {{"dist.pp", "2"}, {"dist.pp_schedule", "zb"}}, "dist.pp_schedule = 'zb' is unknown"},
      {"interleaved_v1", 2, {{"dist.pp", "2"}, {"dist.pp_schedule", "interleaved"}},
       "dist.pp_schedule = \"interleaved\" needs dist.pp_virtual_stages >= 2"},
      {"interleaved_k", 2, {{"dist.pp", "2"}, {"dist.pp_schedule", "interleaved"}, {"dist.pp_virtual_stages", "2"},
                            {"train.grad_accum", "1"}},
       "the interleaved pipeline schedule needs train.grad_accum (1) a multiple of dist.pp = 2"},
      {"interleaved_blocks", 2, {{"dist.pp", "2"}, {"dist.pp_schedule", "interleaved"}, {"dist.pp_virtual_stages", "4"}},
       "model chunks need at least as many blocks"},
      {"zb_zero2", 4, {{"dist.pp", "2"}, {"dist.pp_schedule", "zb-h1"}, {"dist.zero_stage", "2"}, {"model.type", "llama"},
                       {"model.dim", "32"}, {"model.n_kv_head", "2"}},
       "dist.pp_schedule = \"zb-h1\" with dist.zero_stage = 2 is not supported"},
      {"pp4_blocks", 4, {{"dist.pp", "4"}, {"model.n_layer", "2"}},
       "dist.pp = 4 pipeline stages need at least as many blocks"},
      {"pp2_np3", 3, {{"dist.pp", "2"}}, "dist.tp = 1 x dist.pp = 2 = 2 ranks per model replica"},
      {"pp2_one", 0, {{"dist.pp", "2"}}, "dist.tp = 1 x dist.pp = 2 = 2 ranks per model replica"},
  };
  for (const Refused& c : cases) {
    auto a = model_args(root_, c.name, 5, "gpt");
    for (const auto& [k, v] : c.keys) set_arg(a, k, v);
    const ShellRun r = c.ranks > 0 ? runs.run_mpi(c.ranks, a) : runs.run_single(a);
    EXPECT_NE(r.status, 0) << c.name;
    EXPECT_NE(r.out.find(c.message), npos) << c.name << ": " << r.out;
    if (std::string(c.name) == "pp2_dropout") {
      EXPECT_NE(r.out.find("model.dropout = 0.1"), npos) << r.out;
    }
    EXPECT_FALSE(fs::exists(root_ / c.name / "checkpoints")) << c.name << ": work was done before the check";
    EXPECT_FALSE(fs::exists(root_ / c.name / "metrics.jsonl")) << c.name << ": work was done before the check";
  }
}

}  // namespace
