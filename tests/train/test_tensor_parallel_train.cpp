// Tensor parallelism (dist.tp, dist.sequence_parallel) on CPU ranks (MPI), end to end through
// `forge train` under mpirun: every layout must reproduce the single-process run of the same
// config, and its checkpoint must be the whole model that every other layout reads.
//
// As in test_data_parallel.cpp: each test starts real processes (`mpirun --oversubscribe -np W
// forge train ...`, one OpenMP thread per rank) and compares the loss of every step
// (metrics.jsonl, written by rank 0) and every parameter of the final checkpoint
// (model.safetensors) with a plain one-process `forge train` of the same config.
//
// What a tp run changes in the arithmetic is the order of sums: a row-parallel linear's
// partial products are added over the tp ranks by an all-reduce (or reduce-scatter with
// sequence parallelism), and the vocab-parallel cross-entropy's log-sum-exp is split in the
// same way. That is rounding, the kind the data-parallel tests already tolerate, so the same
// bounds hold: SGD within 1e-6 for losses and weights; AdamW losses within 1e-6 and weights
// within 5e-5 of one process, since AdamW turns rounding in a near-zero gradient into a
// ±lr step (Note [AdamW and summation order] in test_data_parallel.cpp). A sharding mistake
// (a head or vocabulary slice on the wrong rank, a missing reduction, a replicated weight
// counted twice) moves the first loss or the weights by far more than that.
//
// The models are tiny (width 32, 4 heads, 2 blocks, vocabulary 256, context 16): dist.tp = 4
// needs n_head and the vocabulary divisible by 4, and sequence parallelism needs train.seq_len
// divisible by tp. LLaMA has n_kv_head = 2 (grouped-query attention): at tp 2 each rank holds one
// key/value head, at tp 4 the two are replicated (two ranks share each); "llama_kv1" (one
// key/value head) replicates it at tp 2 as well.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
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

// This file's scratch and Open MPI session directories: /tmp/forge_tp_<pid>, /tmp/forge_tp_ompi_<pid>.
const dtt::Runs runs{"forge_tp_"};
std::string mpirun(int ranks) {
  return runs.rank_env() + "mpirun --oversubscribe --bind-to none -np " + std::to_string(ranks) + " ";
}

constexpr auto npos = std::string::npos;

// The run of base_args with 4 heads, as `model`: "gpt", "llama" (n_kv_head 2) or "llama_kv1"
// (n_kv_head 1). The LLaMA keeps base_args' width (model.dim 32) and its derived FFN width
// (96: divisible by 4).
std::vector<std::string> model_args(const fs::path& dir, const std::string& name, int64_t steps,
                                    const std::string& model, const std::string& optim = "sgd") {
  auto a = base_args(dir, name, steps, optim);
  set_arg(a, "model.n_head", "4");
  if (model != "gpt") {
    set_arg(a, "model.type", "llama");
    set_arg(a, "model.dim", "32");
    set_arg(a, "model.n_kv_head", model == "llama_kv1" ? "1" : "2");
  }
  return a;
}

// The dist keys of a tp layout. dist.sequence_parallel is given only to turn it on (false is its
// default), so the runs without it do not depend on the key.
void add_tp(std::vector<std::string>& a, int tp, bool sp, int zero_stage = 0) {
  set_arg(a, "dist.tp", std::to_string(tp));
  set_arg(a, "dist.zero_stage", std::to_string(zero_stage));
  if (sp) set_arg(a, "dist.sequence_parallel", "true");
}

// What the strategy logs for the layout (the contract: "tensor parallel: T rank(s)", and
// "sequence parallel" when it is on).
void expect_tp_log(const ShellRun& r, int tp, bool sp) {
  EXPECT_NE(r.out.find("tensor parallel: " + std::to_string(tp) + " rank(s)"), npos) << r.out;
  if (sp) {
    EXPECT_NE(r.out.find("sequence parallel"), npos) << r.out;
  }
}

class TensorParallelTrain : public forge::testing::ForgeCliTest {
 protected:
  static void SetUpTestSuite() { root_ = runs.test_root(); }
  static void TearDownTestSuite() { dtt::remove_scratch(runs, root_); }
  void SetUp() override {
    ForgeCliTest::SetUp();
    ASSERT_EQ(shell("command -v mpirun").status, 0) << "mpirun is missing: run scripts/install-deps.sh (openmpi-bin)";
  }
  // The one-process run of `model` with `optim` for 20 steps, made once per test process when
  // first needed (ctest runs each test in its own process).
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
fs::path TensorParallelTrain::root_;

struct TpCase {
  const char* model;  // "gpt", "llama" (n_kv_head 2) or "llama_kv1"
  const char* optim;  // "sgd" or "adamw"
  int world;
  int tp;  // dp = world / tp
  bool sp;
  int zero_stage;  // on the dp groups
};

std::string case_name(const TpCase& c) {
  std::string dp_layout;  // only where there is a dp group to lay out
  if (c.world > c.tp) dp_layout = c.zero_stage == 0 ? std::string("_ddp") : "_zero" + std::to_string(c.zero_stage);
  return std::string(c.model) + "_" + c.optim + "_np" + std::to_string(c.world) + "_tp" + std::to_string(c.tp) +
         (c.sp ? "_sp" : "") + dp_layout;
}

void PrintTo(const TpCase& c, std::ostream* os) { *os << case_name(c); }

class TensorParallelLayouts : public TensorParallelTrain, public ::testing::WithParamInterface<TpCase> {};

TEST_P(TensorParallelLayouts, MatchesTheSingleProcessRun) {
  const TpCase c = GetParam();
  const std::string name = case_name(c), o = c.optim;
  const fs::path single = reference(c.model, o);  // first: a failure of the tp run is then never the config's
  auto args = model_args(root_, name, 20, c.model, o);
  add_tp(args, c.tp, c.sp, c.zero_stage);
  const ShellRun r = runs.run_mpi(c.world, args);
  ASSERT_EQ(r.status, 0) << r.out;
  expect_tp_log(r, c.tp, c.sp);
  if (o == "sgd") {
    expect_same_run(root_ / name, single, 1, 1e-6, 1e-6, name);
    return;
  }
  expect_same_run(root_ / name, single, 1, 1e-6, 5e-5, name + " vs one process");
  // ZeRO on the dp groups only moves where the optimizer state (and gradients) live: against
  // DDP over the same tp x dp mesh it changes no arithmetic, so AdamW is held to 1e-6 there, as
  // test_data_parallel.cpp holds ZeRO to DDP.
  if (c.zero_stage > 0) {
    const std::string ddp = name + "_vs_ddp";
    auto d = model_args(root_, ddp, 20, c.model, o);
    add_tp(d, c.tp, c.sp, 0);
    const ShellRun rd = runs.run_mpi(c.world, d);
    ASSERT_EQ(rd.status, 0) << rd.out;
    expect_same_run(root_ / name, root_ / ddp, 1, 1e-6, 1e-6, name + " vs DDP on the same mesh");
  }
}

// Each of tp 2, tp 4 and tp 2 x dp 2; sequence parallelism on and off; GPT, LLaMA with GQA
// (split and replicated key/value heads); SGD and AdamW; DDP, ZeRO-1 and ZeRO-2 on the dp
// groups, without running the full product.
INSTANTIATE_TEST_SUITE_P(, TensorParallelLayouts,
                         ::testing::Values(
                             // tp 2 (dp 1)
                             TpCase{"gpt", "sgd", 2, 2, false, 0}, TpCase{"gpt", "sgd", 2, 2, true, 0},
                             TpCase{"gpt", "adamw", 2, 2, false, 0}, TpCase{"gpt", "adamw", 2, 2, true, 0},
                             TpCase{"llama", "sgd", 2, 2, false, 0}, TpCase{"llama", "adamw", 2, 2, true, 0},
                             TpCase{"llama_kv1", "sgd", 2, 2, true, 0}, TpCase{"llama_kv1", "adamw", 2, 2, false, 0},
                             // tp 4 (dp 1): LLaMA's 2 key/value heads replicated over pairs of ranks
                             TpCase{"gpt", "sgd", 4, 4, false, 0}, TpCase{"gpt", "adamw", 4, 4, true, 0},
                             TpCase{"llama", "sgd", 4, 4, true, 0}, TpCase{"llama", "adamw", 4, 4, false, 0},
                             // tp 2 x dp 2
                             TpCase{"gpt", "sgd", 4, 2, false, 0}, TpCase{"gpt", "sgd", 4, 2, true, 2},
                             TpCase{"gpt", "adamw", 4, 2, true, 1}, TpCase{"gpt", "adamw", 4, 2, false, 2},
                             TpCase{"llama", "sgd", 4, 2, false, 1}, TpCase{"llama", "adamw", 4, 2, true, 0},
                             TpCase{"llama", "adamw", 4, 2, true, 2}),
                         [](const ::testing::TestParamInfo<TpCase>& i) { return case_name(i.param); });

// A checkpoint written by tp 2 x dp 2 (4 ranks, ZeRO-1, AdamW) at step 10 of 20 resumes at tp 2
// on 2 ranks (dp 1, DDP) and in one process without dist; each continues with the losses and
// weights of the uninterrupted 4-rank run. GPT, whose fused query/key/value weight is the one a
// wrong split of the whole checkpoint would scramble.
TEST_F(TensorParallelTrain, TpTwoByDpTwoCheckpointResumesAtTpTwoAndInOneProcess) {
  const std::string full = "tp2dp2_full", resumed = "tp2dp2_then_tp2", single = "tp2dp2_then_single";
  auto a = model_args(root_, full, 20, "gpt", "adamw");
  add_tp(a, 2, false, 1);
  const ShellRun r = runs.run_mpi(4, a);
  ASSERT_EQ(r.status, 0) << r.out;
  expect_tp_log(r, 2, false);

  auto first = model_args(root_, resumed, 20, "gpt", "adamw");
  add_tp(first, 2, false, 1);
  set_arg(first, "checkpoint.every", "10");
  set_arg(first, "train.steps", "10");
  const ShellRun b = runs.run_mpi(4, first);
  ASSERT_EQ(b.status, 0) << b.out;
  const fs::path ck = root_ / resumed / "checkpoints" / "step_00000010";
  ASSERT_TRUE(fs::exists(ck / "model.safetensors")) << "no checkpoint at step 10: " << b.out;

  auto second = model_args(root_, resumed, 20, "gpt", "adamw");
  add_tp(second, 2, false, 0);
  set_arg(second, "run.overwrite", "false");
  const ShellRun c = shell(mpirun(2) + runs.forge_cmd(second) + " --resume");
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_NE(c.out.find("resume: from"), npos) << c.out;
  expect_tp_log(c, 2, false);
  expect_same_run(root_ / resumed, root_ / full, 11, 1e-6, 5e-5, "tp2 x dp2 -> tp2");

  auto one = model_args(root_, single, 20, "gpt", "adamw");
  set_arg(one, "run.overwrite", "false");
  const ShellRun d = shell(runs.rank_env() + runs.forge_cmd(one) + " --resume " + shell_quote(ck.string()));
  ASSERT_EQ(d.status, 0) << d.out;
  EXPECT_NE(d.out.find("resume: from"), npos) << d.out;
  expect_same_run(root_ / single, root_ / full, 11, 1e-6, 5e-5, "tp2 x dp2 -> one process");
}

// The other way: a one-process checkpoint (LLaMA with GQA, AdamW) resumes at tp 2 with sequence
// parallelism, each rank taking its slice of the whole weights and AdamW moments, and continues
// as the one process does. (Moments lost or misplaced on load would move the weights by ~lr,
// orders of magnitude beyond the tolerance.)
TEST_F(TensorParallelTrain, OneProcessCheckpointResumesAtTpTwo) {
  const fs::path want = reference("llama", "adamw");
  const std::string name = "llama_single_then_tp2";
  auto first = model_args(root_, name, 20, "llama", "adamw");
  set_arg(first, "checkpoint.every", "10");
  set_arg(first, "train.steps", "10");
  const ShellRun a = runs.run_single(first);
  ASSERT_EQ(a.status, 0) << a.out;
  ASSERT_TRUE(fs::exists(root_ / name / "checkpoints" / "step_00000010" / "model.safetensors")) << a.out;

  auto second = model_args(root_, name, 20, "llama", "adamw");
  add_tp(second, 2, true, 0);
  set_arg(second, "run.overwrite", "false");
  const ShellRun b = shell(mpirun(2) + runs.forge_cmd(second) + " --resume");
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_NE(b.out.find("resume: from"), npos) << b.out;
  expect_tp_log(b, 2, true);
  expect_same_run(root_ / name, want, 11, 1e-6, 5e-5, "one process -> tp2 + sp");
}

// f16 with dynamic loss scaling and activation checkpointing at tp 2 x dp 2 with sequence
// parallelism and ZeRO-2: the unscaled gradient norm is summed over the tensor-parallel group
// (Note [split gradient norm]), the overflow verdict agreed over both groups, and the recomputed
// blocks re-run their tensor-parallel collectives in backward; the 16-bit reduce-scatters land in
// (B, T / tp, C) slices. The losses follow the one-process f16 run (the reductions' order differs:
// 1e-5), the f16 weights to 1e-3 of their largest entry (seen: 1.2e-4).
TEST_F(TensorParallelTrain, F16WithCheckpointedActivationsMatchesOneProcess) {
  auto args = model_args(root_, "f16_single", 10, "llama");
  set_arg(args, "run.dtype", "f16");
  set_arg(args, "model.checkpoint_activations", "true");
  const ShellRun single = runs.run_single(args);
  ASSERT_EQ(single.status, 0) << single.out;
  set_arg(args, "run.name", "f16_tp2_dp2");
  add_tp(args, 2, true, 2);
  const ShellRun tp = runs.run_mpi(4, args);
  ASSERT_EQ(tp.status, 0) << tp.out;
  expect_tp_log(tp, 2, true);
  expect_same_run(root_ / "f16_tp2_dp2", root_ / "f16_single", 1, 1e-5, 1e-3, "f16 tp2 x dp2");
}

// A LLaMA on text at tp 2 with sequence parallelism, evaluated every 5 steps (every rank runs
// the evaluation's forward: its tp collectives are collectives): training losses, validation
// losses and weights as in one process.
TEST_F(TensorParallelTrain, LlamaEvaluatesOnTextAsInOneProcess) {
  auto args = model_args(root_, "tp_llama_single", 12, "llama");
  set_arg(args, "model.n_layer", "3");
  dtt::use_text_with_evaluation(args, root_ / "tp_corpus");
  const ShellRun single = runs.run_single(args);
  ASSERT_EQ(single.status, 0) << single.out;
  set_arg(args, "run.name", "tp_llama_np2");
  add_tp(args, 2, true);
  const ShellRun tp = runs.run_mpi(2, args);
  ASSERT_EQ(tp.status, 0) << tp.out;
  expect_tp_log(tp, 2, true);
  expect_same_run(root_ / "tp_llama_np2", root_ / "tp_llama_single", 1, 1e-6, 1e-6, "tp2 llama on text");
  dtt::expect_same_val_losses(root_ / "tp_llama_np2", root_ / "tp_llama_single", 3);
}

// Note [FP8 under tensor parallelism] (ops/fp8.h): run.fp8 under tp 2 casts every split linear as
// the whole one (the amaxes of the scale groups that span a split dimension maxed over the tp
// group), so the FP8 run at tp 2 reproduces the one-process FP8 run (see the tolerances below): GPT (column-parallel fused
// c_attn, row-parallel projections) and LLaMA with replicated key-value heads under sequence
// parallelism; tensorwise and rowwise. Without the reduction each rank would scale its shard by
// its own amax and the first loss would already differ. Blockwise needs shards of whole 128-wide
// tiles, and says so.
TEST_F(TensorParallelTrain, Fp8CastsEachSplitLinearAsTheWholeOne) {
  for (const char* recipe : {"tensorwise", "rowwise"})
    for (const char* model : {"gpt", "llama_kv1"}) {
      const std::string base = std::string("fp8_") + recipe + "_" + model;
      auto args = model_args(root_, base + "_single", 8, model, "sgd");
      set_arg(args, "run.fp8", recipe);
      const ShellRun single = runs.run_single(args);
      ASSERT_EQ(single.status, 0) << single.out;
      set_arg(args, "run.name", base + "_tp2");
      add_tp(args, 2, std::string(model) != "gpt");
      const ShellRun tp = runs.run_mpi(2, args);
      ASSERT_EQ(tp.status, 0) << tp.out;
      // Step 1's loss, before any update: the same casts, so the same loss but for the order of
      // sums (without the reduction: 3e-5 to 7e-5 relative). Later, an order-of-sums difference
      // can move a value across an FP8 rounding boundary (a step of 1/16 in e4m3): the runs then
      // agree to 2e-5 (GPT: 1e-6 throughout).
      const auto lt = dtt::losses(root_ / (base + "_tp2")), ls = dtt::losses(root_ / (base + "_single"));
      ASSERT_TRUE(lt.count(1) && ls.count(1)) << base;
      EXPECT_NEAR(lt.at(1), ls.at(1), 1e-6 * std::abs(ls.at(1))) << base << ": the first loss";
      expect_same_run(root_ / (base + "_tp2"), root_ / (base + "_single"), 1, 2e-5, 5e-4, base + " tp2 vs one process");
    }
  // The first update (SGD at lr 0.1: the gradient itself, through every backward cast) where no
  // key-value head is replicated: the same to f32 rounding (measured <= 5.4e-6 of each tensor's
  // update). Replicated heads (llama_kv1) are not held to it: each rank casts its part of their
  // gradient before the parts are summed (docs/fp8.md).
  for (const char* model : {"gpt", "llama"}) {
    const std::string base = std::string("fp8_first_update_") + model;
    auto args = model_args(root_, base + "_single", 1, model, "sgd");
    set_arg(args, "run.fp8", "tensorwise");
    set_arg(args, "optim.lr", "0.1");
    set_arg(args, "optim.grad_clip", "0");
    set_arg(args, "schedule.warmup_steps", "0");
    ASSERT_EQ(runs.run_single(args).status, 0) << base;
    auto zero = args;  // the initial weights (an update of 1e-30)
    set_arg(zero, "run.name", base + "_init");
    set_arg(zero, "optim.lr", "1e-30");
    ASSERT_EQ(runs.run_single(zero).status, 0) << base;
    set_arg(args, "run.name", base + "_tp2");
    add_tp(args, 2, std::string(model) != "gpt");
    const ShellRun tp = runs.run_mpi(2, args);
    ASSERT_EQ(tp.status, 0) << tp.out;
    const auto single = dtt::final_params(root_ / (base + "_single")), tp2 = dtt::final_params(root_ / (base + "_tp2")),
               init = dtt::final_params(root_ / (base + "_init"));
    auto find = [](const forge::io::NamedTensors& ts, const std::string& n) {
      for (const auto& [k, t] : ts)
        if (k == n) return t.to_vector<double>();
      ADD_FAILURE() << n << " missing";
      return std::vector<double>();
    };
    for (const auto& [name, t] : single) {
      const std::vector<double> w = t.to_vector<double>(), w0 = find(init, name), w2 = find(tp2, name);
      if (w0.size() != w.size() || w2.size() != w.size()) continue;
      double update = 0, diff = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        update = std::max(update, std::abs(w[i] - w0[i]));
        diff = std::max(diff, std::abs(w[i] - w2[i]));
      }
      if (update > 0) {
        EXPECT_LE(diff / update, 2e-5) << base << " " << name;
      }
    }
  }
  auto args = model_args(root_, "fp8_blockwise_tp2", 2, "gpt", "sgd");
  set_arg(args, "run.fp8", "blockwise");
  add_tp(args, 2, false);
  const ShellRun r = runs.run_mpi(2, args);
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("run.fp8 = \"blockwise\" under tensor parallelism needs"), npos) << r.out;
}

// forge export and forge sample read a tp checkpoint like any other (the model is whole in it):
// export writes HF names and layouts that import back to the checkpoint's weights exactly, with
// the whole model's shapes and config; sample generates from it. A GPT with biases (a row-parallel
// linear's bias is added once, not once per rank) on text, so that the run has a tokenizer.
TEST_F(TensorParallelTrain, ExportAndSampleReadATensorParallelCheckpoint) {
  const fs::path corpus = root_ / "export_corpus";
  forge::train_testing::write_corpus(corpus);
  auto args = model_args(root_, "export_tp2", 3, "gpt");
  set_arg(args, "model.bias", "true");
  set_arg(args, "model.vocab_size", "0");
  set_arg(args, "data.source", "files");
  set_arg(args, "data.files", "[\"" + corpus.string() + "\"]");
  set_arg(args, "data.vocab_size", "300");
  set_arg(args, "data.val_fraction", "0.1");
  add_tp(args, 2, false);
  const ShellRun r = runs.run_mpi(2, args);
  ASSERT_EQ(r.status, 0) << r.out;
  expect_tp_log(r, 2, false);

  const fs::path run = root_ / "export_tp2", out = root_ / "export_tp2_hf";
  const ShellRun e = shell(shell_quote(forge_binary().string()) + " export --checkpoint " + shell_quote(run.string()) +
                           " --out " + shell_quote(out.string()));
  ASSERT_EQ(e.status, 0) << e.out;
  const auto hf = forge::io::load_safetensors(out / "model.safetensors").tensors;
  const forge::Tensor* w = hf.find("transformer.h.0.attn.c_attn.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape(), (forge::Shape{32, 96})) << "the whole (in, out) Conv1D weight, not a tp slice";
  const forge::Tensor* wte = hf.find("transformer.wte.weight");
  ASSERT_NE(wte, nullptr);
  EXPECT_EQ(wte->shape(), (forge::Shape{300, 32})) << "the whole vocabulary";
  std::ifstream cfg(out / "config.json");
  const auto j = nlohmann::json::parse(cfg);
  EXPECT_EQ(j["n_head"], 4);
  EXPECT_EQ(j["n_embd"], 32);
  EXPECT_EQ(j["vocab_size"], 300);
  const auto ck = final_params(run);
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

// The log reports the whole model's parameter count, not one rank's slice: the same line as one
// process's, for a GPT (vocabulary and heads split) and a LLaMA whose single key/value head is
// replicated on both ranks (counted once).
TEST_F(TensorParallelTrain, TheLogReportsTheWholeModelsParameterCount) {
  for (const std::string model : {"gpt", "llama_kv1"}) {
    const std::string type = model == "gpt" ? "gpt" : "llama";
    const ShellRun single = runs.run_single(model_args(root_, "count_single_" + model, 2, model));
    ASSERT_EQ(single.status, 0) << single.out;
    auto args = model_args(root_, "count_tp2_" + model, 2, model);
    add_tp(args, 2, false);
    const ShellRun tp = runs.run_mpi(2, args);
    ASSERT_EQ(tp.status, 0) << tp.out;
    const auto want = parameter_lines(single.out, type), got = parameter_lines(tp.out, type);
    ASSERT_EQ(want.size(), 1u) << single.out;
    ASSERT_FALSE(got.empty()) << tp.out;
    for (const auto& line : got) EXPECT_EQ(line, want[0]) << model;
  }
}

// Layouts that cannot work are refused before any work, naming the keys.
TEST_F(TensorParallelTrain, LayoutsThatCannotWorkAreRejectedBeforeStart) {
  {  // 2 heads do not split over 3 ranks (a vocabulary of 258 does, so the heads are what fails)
    auto a = base_args(root_, "tp3", 5);
    set_arg(a, "model.vocab_size", "258");
    add_tp(a, 3, false);
    const ShellRun r = runs.run_mpi(3, a);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.out.find("is not divisible by dist.tp"), npos) << r.out;
    EXPECT_FALSE(fs::exists(root_ / "tp3" / "checkpoints")) << "work was done before the check";
  }
  {  // sequence parallelism splits the sequence over the tp group: without one it means nothing
    auto a = model_args(root_, "sp_tp1", 5, "gpt");
    set_arg(a, "dist.sequence_parallel", "true");
    const ShellRun r = runs.run_single(a);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.out.find("dist.sequence_parallel = true"), npos) << r.out;
    EXPECT_FALSE(fs::exists(root_ / "sp_tp1" / "checkpoints")) << "work was done before the check";
  }
  {  // ZeRO-3 gathers whole blocks; with tp they are split another way
    auto a = model_args(root_, "z3_tp2", 5, "gpt");
    add_tp(a, 2, false, 3);
    const ShellRun r = runs.run_mpi(2, a);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.out.find("dist.zero_stage = 3 with dist.tp"), npos) << r.out;
    EXPECT_FALSE(fs::exists(root_ / "z3_tp2" / "checkpoints")) << "work was done before the check";
  }
}

}  // namespace
