// Data parallel and ZeRO on CPU ranks (MPI), end to end through `forge train` under mpirun:
// every layout must reproduce the single-process run with the same global batch.
//
// Each test starts real processes: `mpirun --oversubscribe -np W forge train ...` with one
// OpenMP thread per rank. The reference is a plain `forge train` of the same config (one
// process, no dist). Compared: the loss of every step (metrics.jsonl, written by rank 0) and
// every parameter of the final checkpoint (model.safetensors), as max |a - b| / max |b| per
// tensor, which must be <= 1e-6 (f32).
//
// Note [AdamW and summation order]. With SGD every layout matches the single process to
// ~5e-8. With AdamW the losses do too, but a few weights differ by up to ~1.5e-5 (relative
// to their tensor's largest entry, lr 3e-4, 20 steps): AdamW divides each gradient element
// by its own running RMS, so an element whose gradient is mostly cancellation (near zero,
// dominated by f32 rounding) takes a ±lr step whose sign follows the rounding. The same
// happens WITHOUT any parallelism: one process at batch 4 x 2 accumulated micro-batches
// differs from batch 8 by 4.3e-6 in the same way. So for AdamW the parameters are held to
// 1e-6 against DDP at the same world size (ZeRO's sharding must change no arithmetic), and
// to 5e-5 against the single process; SGD checks the gradient averaging itself at 1e-6.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
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
using dtt::shell;
using dtt::ShellRun;

// This file's scratch and Open MPI session directories: /tmp/forge_dp_<pid>, /tmp/forge_dp_ompi_<pid>.
const dtt::Runs runs{"forge_dp_"};

class DataParallelTrain : public forge::testing::ForgeCliTest {
 protected:
  static void SetUpTestSuite() { root_ = runs.test_root(); }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  void SetUp() override {
    ForgeCliTest::SetUp();
    ASSERT_EQ(shell("command -v mpirun").status, 0) << "mpirun is missing: run scripts/install-deps.sh (openmpi-bin)";
  }
  // A reference run, made once per test process when first needed (ctest runs each test in
  // its own process): one process without dist (ranks = 0), or DDP on `ranks` ranks.
  static fs::path reference(const std::string& optim, int64_t grad_accum, int ranks = 0) {
    const std::string name = "ref_" + optim + (grad_accum > 1 ? "_accum" : "") +
                             (ranks > 0 ? "_ddp_np" + std::to_string(ranks) : std::string());
    if (!fs::exists(root_ / name / "metrics.jsonl")) {
      auto a = base_args(root_, name, 20, optim);
      if (grad_accum > 1) a.push_back("--train.grad_accum=" + std::to_string(grad_accum));
      const ShellRun r = ranks > 0 ? runs.run_mpi(ranks, a) : runs.run_single(a);
      EXPECT_EQ(r.status, 0) << r.out;
    }
    return root_ / name;
  }
  static fs::path root_;
};
fs::path DataParallelTrain::root_;

struct Layout {
  const char* optim;
  int ranks;
  int zero_stage;
  bool offload;
  int grad_accum = 1;
};

std::string layout_name(const Layout& l) {
  return std::string(l.optim) + "_np" + std::to_string(l.ranks) + "_" + (l.zero_stage == 0 ? std::string("ddp") : "zero" + std::to_string(l.zero_stage)) +
         (l.offload ? "_offload" : "") + (l.grad_accum > 1 ? "_accum" + std::to_string(l.grad_accum) : "");
}

void PrintTo(const Layout& l, std::ostream* os) { *os << layout_name(l); }

class DataParallelLayouts : public DataParallelTrain, public ::testing::WithParamInterface<Layout> {};

TEST_P(DataParallelLayouts, MatchesTheSingleProcessRun) {
  const Layout l = GetParam();
  const std::string name = layout_name(l);
  const std::string o = l.optim;
  auto args = base_args(root_, name, 20, o);
  args.push_back("--dist.zero_stage=" + std::to_string(l.zero_stage));
  args.push_back(std::string("--dist.offload_optimizer=") + (l.offload ? "true" : "false"));
  if (l.grad_accum > 1) args.push_back("--train.grad_accum=" + std::to_string(l.grad_accum));
  const ShellRun r = runs.run_mpi(l.ranks, args);
  ASSERT_EQ(r.status, 0) << r.out;
  if (l.ranks > 1 || l.zero_stage > 0) {  // (one rank without ZeRO is a plain run)
    EXPECT_NE(r.out.find("data parallel: " + std::to_string(l.ranks) + " rank(s)"), std::string::npos) << r.out;
  }
  const fs::path single = reference(o, l.grad_accum);
  if (o == "sgd") {
    expect_same_run(root_ / name, single, 1, 1e-6, 1e-6, name);
  } else {
    expect_same_run(root_ / name, single, 1, 1e-6, 5e-5, name + " vs one process");
    if (l.ranks > 1 && l.grad_accum == 1)
      expect_same_run(root_ / name, reference(o, 1, l.ranks), 1, 1e-6, 1e-6,
                      name + " vs DDP");
  }
}

INSTANTIATE_TEST_SUITE_P(, DataParallelLayouts,
                         ::testing::ValuesIn([] {
                           std::vector<Layout> v;
                           for (const char* o : {"sgd", "adamw"}) {
                             for (int stage : {0, 1, 2})
                               for (int w : {1, 2, 4})
                                 if (!(o == std::string("adamw") && stage == 0 && w > 1)) v.push_back({o, w, stage, false});
                             for (int w : {1, 2, 4}) v.push_back({o, w, 3, false});
                             for (int stage : {1, 2, 3})
                               for (int w : {1, 2, 4}) v.push_back({o, w, stage, true});
                             v.push_back({o, 2, 0, false, 2});
                             v.push_back({o, 4, 2, false, 2});
                             v.push_back({o, 4, 3, false, 2});
                           }
                           return v;
                         }()),
                         [](const ::testing::TestParamInfo<Layout>& i) { return layout_name(i.param); });

// dist.dp_reduce = "hierarchical" on 4 ranks split into 2 simulated nodes of 2 (dist.node_size; for
// ZeRO-2 also paced by a simulated 50 Gb/s link, dist.link_gbps):
// every reduction goes within the node, across nodes, and back (parallel/hierarchical_group.h).
// DDP, ZeRO-2 (reduce-scatter: each rank's slice must be its own) and ZeRO-3 (all-gathers too)
// train to the one-process run's losses and weights as the flat layouts do; the log says so.
TEST_F(DataParallelTrain, HierarchicalReductionOverSimulatedNodesTrainsLikeOneProcess) {
  for (int stage : {0, 2, 3}) {
    const std::string o = stage == 0 ? "sgd" : "adamw";
    const std::string name = "hier_np4_zero" + std::to_string(stage);
    auto args = base_args(root_, name, 20, o);
    args.push_back("--dist.zero_stage=" + std::to_string(stage));
    args.push_back("--dist.dp_reduce=hierarchical");
    args.push_back("--dist.node_size=2");
    if (stage == 2) args.push_back("--dist.link_gbps=50");  // paced (Note [paced link]): the same numbers
    const ShellRun r = runs.run_mpi(4, args);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("reduced within each node first"), std::string::npos) << r.out;
    if (stage == 2) {
      EXPECT_NE(r.out.find("a simulated link of 50 Gb/s between nodes"), std::string::npos) << r.out;
    }
    expect_same_run(root_ / name, reference(o, 1), 1, 1e-6, o == "sgd" ? 1e-6 : 5e-5, name + " vs one process");
  }
}

// dist.grad_compression = "powersgd" (Note [PowerSGD]) on 4 ranks at rank 2, on text: it sends a fraction of
// the values (said in the log) and still trains: the loss falls as the uncompressed run's does,
// within a few percent at the end, never diverging. (That the reduction is the exact average when
// the rank spans the gradients: PowerSgdMpi in tests/parallel/mpi.)
TEST_F(DataParallelTrain, PowerSgdAtLowRankTrainsLikeTheUncompressedRun) {
  auto low = base_args(root_, "psgd_r2", 60, "adamw");
  low.push_back("--dist.grad_compression=powersgd");
  low.push_back("--dist.powersgd_rank=2");
  low.push_back("--optim.lr=3e-3");
  dtt::use_text_with_evaluation(low, root_ / "psgd_corpus");
  const ShellRun b = runs.run_mpi(4, low);
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_NE(b.out.find("PowerSGD rank 2 ("), std::string::npos) << b.out;
  auto plain = base_args(root_, "psgd_plain", 60, "adamw");
  plain.push_back("--optim.lr=3e-3");
  dtt::use_text_with_evaluation(plain, root_ / "psgd_corpus");
  const ShellRun c = runs.run_mpi(4, plain);
  ASSERT_EQ(c.status, 0) << c.out;
  const auto lb = dtt::losses(root_ / "psgd_r2"), lc = dtt::losses(root_ / "psgd_plain");
  ASSERT_FALSE(lb.empty());
  const double first = lb.begin()->second, last_b = lb.rbegin()->second, last_c = lc.rbegin()->second;
  EXPECT_LT(last_b, first - 0.5) << "PowerSGD rank 2 did not train";
  EXPECT_LT(std::abs(last_b - last_c) / last_c, 0.05) << "PowerSGD rank 2: " << last_b << ", uncompressed " << last_c;
  for (const auto& [step, l] : lb) EXPECT_TRUE(std::isfinite(l)) << "step " << step;
  // dist.powersgd_start_step = 5: the first 5 steps are the uncompressed run's, bit for bit; later
  // ones are not.
  auto later = low;
  dtt::set_arg(later, "run.name", "psgd_r2_from5");
  later.push_back("--dist.powersgd_start_step=5");
  const ShellRun d = runs.run_mpi(4, later);
  ASSERT_EQ(d.status, 0) << d.out;
  EXPECT_NE(d.out.find("from step 6"), std::string::npos) << d.out;
  const auto ld = dtt::losses(root_ / "psgd_r2_from5");
  for (int64_t step = 1; step <= 6; ++step) EXPECT_EQ(ld.at(step), lc.at(step)) << "step " << step;
  EXPECT_NE(ld.at(8), lc.at(8));
}

// dist.grad_compression = "fp8" (Note [FP8 gradient reduction]) on 4 ranks, on text: DDP with the
// flat group (error feedback), ZeRO-3 reduced within each node of 2 first (only the stage between
// the nodes coded; no error feedback, "auto"'s choice for ZeRO-2/3) and ZeRO-2 with the feedback
// asked for: each says so in the log (f32 gradients: ~26% of their bytes sent) and trains as the
// uncompressed run does, step for step within 0.5%, never diverging. (The reductions against a reference: Fp8ReduceMpi.)
TEST_F(DataParallelTrain, Fp8GradientReductionTrainsLikeTheUncompressedRun) {
  auto plain = base_args(root_, "fp8r_plain", 60, "adamw");
  plain.push_back("--optim.lr=3e-3");
  dtt::use_text_with_evaluation(plain, root_ / "fp8r_corpus");
  const ShellRun c = runs.run_mpi(4, plain);
  ASSERT_EQ(c.status, 0) << c.out;
  const auto lc = dtt::losses(root_ / "fp8r_plain");
  ASSERT_FALSE(lc.empty());
  struct Case {
    const char* name;
    std::vector<std::string> extra;
    const char* said;
  };
  const Case cases[] = {
      {"fp8r_ddp", {"--dist.grad_compression=fp8"}, "gradients sent in FP8 (e4m3 blocks of 128, error feedback; 2"},
      {"fp8r_z3_hier",
       {"--dist.grad_compression=fp8", "--dist.zero_stage=3", "--dist.dp_reduce=hierarchical", "--dist.node_size=2"},
       "gradients sent in FP8 (e4m3 blocks of 128, no error feedback; between nodes only; 2"},
      {"fp8r_z2_feedback", {"--dist.grad_compression=fp8", "--dist.zero_stage=2", "--dist.fp8_error_feedback=on"},
       "gradients sent in FP8 (e4m3 blocks of 128, error feedback; 2"},
  };
  for (const Case& k : cases) {
    auto args = plain;
    dtt::set_arg(args, "run.name", k.name);
    for (const auto& e : k.extra) args.push_back(e);
    const ShellRun r = runs.run_mpi(4, args);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find(k.said), std::string::npos) << r.out;
    const auto l = dtt::losses(root_ / k.name);
    ASSERT_EQ(l.size(), lc.size()) << k.name;
    double worst = 0;
    for (const auto& [step, loss] : l) {
      ASSERT_TRUE(std::isfinite(loss)) << k.name << " step " << step;
      worst = std::max(worst, std::abs(loss - lc.at(step)) / lc.at(step));
    }
    std::cout << k.name << ": worst relative loss difference " << worst << ", final " << l.rbegin()->second
              << " vs " << lc.rbegin()->second << "\n";
    EXPECT_LT(l.rbegin()->second, l.begin()->second - 0.5) << k.name << " did not train";
    EXPECT_LT(worst, 0.005) << k.name;
    EXPECT_GT(worst, 0) << k.name << ": bit for bit the uncompressed run: nothing was coded";
  }
}

// PowerSGD compresses DDP's all-reduces only: with ZeRO it is refused before any step.
TEST_F(DataParallelTrain, PowerSgdWithZeroIsRefusedNamingTheSettings) {
  auto args = base_args(root_, "psgd_zero", 5, "adamw");
  args.push_back("--dist.grad_compression=powersgd");
  args.push_back("--dist.zero_stage=1");
  const ShellRun r = runs.run_mpi(2, args);
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("dist.zero_stage = 0"), std::string::npos) << r.out;
}

// A node size that does not split the data-parallel group evenly is refused before any step,
// naming the setting.
TEST_F(DataParallelTrain, HierarchicalReductionWithANodeSizeThatDoesNotSplitTheGroupIsRefused) {
  auto args = base_args(root_, "hier_bad_node", 5);
  args.push_back("--dist.dp_reduce=hierarchical");
  args.push_back("--dist.node_size=3");
  const ShellRun r = runs.run_mpi(4, args);
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("dist.node_size"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 1 "), std::string::npos) << r.out;
}

// A checkpoint written by 4 ranks at stage `before` (step 10 of 20) resumes on 2 ranks at stage
// `after` (resharded on load), and in one process without dist; each continues with the losses
// and weights of the uninterrupted 4-rank run.
void expect_resumes_across_layouts(const fs::path& root, int before, int after) {
  const std::string tag = "z" + std::to_string(before) + "_np4";
  auto full = base_args(root, tag + "_full", 20);
  full.push_back("--dist.zero_stage=" + std::to_string(before));
  const ShellRun a = runs.run_mpi(4, full);
  ASSERT_EQ(a.status, 0) << a.out;
  EXPECT_NE(a.out.find("ZeRO-" + std::to_string(before)), std::string::npos) << a.out;

  const std::string resumed = tag + "_then_z" + std::to_string(after) + "_np2";
  auto first = base_args(root, resumed, 20);
  first.push_back("--dist.zero_stage=" + std::to_string(before));
  first.push_back("--checkpoint.every=10");
  first.push_back("--train.steps=10");
  const ShellRun b = runs.run_mpi(4, first);
  ASSERT_EQ(b.status, 0) << b.out;
  const fs::path ck = root / resumed / "checkpoints" / "step_00000010";
  ASSERT_TRUE(fs::exists(ck / "optimizer.rank00003.safetensors")) << "no shard file of rank 3 in " << ck;

  auto second = base_args(root, resumed, 20);
  second.push_back("--dist.zero_stage=" + std::to_string(after));
  second.push_back("--run.overwrite=false");
  const ShellRun c = shell(runs.rank_env() + "mpirun --oversubscribe --bind-to none -np 2 " + runs.forge_cmd(second) + " --resume");
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_NE(c.out.find("resume: from"), std::string::npos) << c.out;
  expect_same_run(root / resumed, root / (tag + "_full"), 11, 1e-6, 1e-6, resumed);
  // And one process (no dist) resumes the same sharded checkpoint.
  auto single = base_args(root, tag + "_then_single", 20);
  single.push_back("--run.overwrite=false");
  const ShellRun d = shell(runs.rank_env() + runs.forge_cmd(single) + " --resume " + shell_quote(ck.string()));
  ASSERT_EQ(d.status, 0) << d.out;
  expect_same_run(root / (tag + "_then_single"), root / (tag + "_full"), 11, 1e-6, 1e-6, tag + " -> one process");
}

TEST_F(DataParallelTrain, ZeroTwoOnFourRanksResumesAsZeroOneOnTwo) { expect_resumes_across_layouts(root_, 2, 1); }

// ZeRO-3 (sharded parameters): its checkpoint holds the whole model like every other stage's.
TEST_F(DataParallelTrain, ZeroThreeOnFourRanksResumesOnTwoAndInOneProcess) { expect_resumes_across_layouts(root_, 3, 3); }

// ZeRO-3 on a LLaMA with activation checkpointing (each block's parameters are gathered again
// for its recomputation in backward) and evaluation every 5 steps on text (every rank runs the
// evaluation's forward: its gathers are collectives): losses, validation losses and weights as
// in one process.
TEST_F(DataParallelTrain, ZeroThreeLlamaWithActivationCheckpointingAndEvaluation) {
  const fs::path corpus = root_ / "z3_corpus";
  forge::train_testing::write_corpus(corpus);
  auto args = base_args(root_, "z3_llama_single", 12);
  auto set = [&](const std::string& key, const std::string& value) { dtt::set_arg(args, key, value); };
  set("model.type", "llama");
  set("model.dim", "32");
  set("model.n_layer", "3");
  set("model.vocab_size", "0");
  set("model.checkpoint_activations", "true");
  set("data.source", "files");
  set("data.files", "[\"" + corpus.string() + "\"]");
  set("data.vocab_size", "300");
  set("data.val_fraction", "0.1");
  set("eval.every", "5");
  set("eval.batches", "2");
  const ShellRun single = runs.run_single(args);
  ASSERT_EQ(single.status, 0) << single.out;
  set("run.name", "z3_llama_np2");
  set("dist.zero_stage", "3");
  const ShellRun z3 = runs.run_mpi(2, args);
  ASSERT_EQ(z3.status, 0) << z3.out;
  EXPECT_NE(z3.out.find("ZeRO-3"), std::string::npos) << z3.out;
  expect_same_run(root_ / "z3_llama_np2", root_ / "z3_llama_single", 1, 1e-6, 1e-6, "zero3 llama np2");
  auto val_losses = [](const fs::path& run) {
    std::vector<double> v;
    std::ifstream in(run / "metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("val_loss")) v.push_back(j["val_loss"].get<double>());
    }
    return v;
  };
  const auto vz = val_losses(root_ / "z3_llama_np2"), vs = val_losses(root_ / "z3_llama_single");
  ASSERT_EQ(vz.size(), 3u) << "evaluations at steps 5, 10 and the end";
  ASSERT_EQ(vz.size(), vs.size());
  for (size_t i = 0; i < vz.size(); ++i) EXPECT_NEAR(vz[i], vs[i], 1e-6 * std::abs(vs[i])) << "evaluation " << i;
}

// forge export reads the sharded checkpoint (the model is whole in it) and writes HF names and
// layouts: importing them back gives the checkpoint's weights exactly.
TEST_F(DataParallelTrain, ExportWritesAHuggingFaceModelFromAShardedCheckpoint) {
  auto args = base_args(root_, "export_z2_np2", 3);
  args.push_back("--dist.zero_stage=2");
  args[std::find(args.begin(), args.end(), "--model.bias=false") - args.begin()] = "--model.bias=true";
  const ShellRun r = runs.run_mpi(2, args);
  ASSERT_EQ(r.status, 0) << r.out;
  const fs::path out = root_ / "export_z2_np2_hf";
  const ShellRun e = shell(shell_quote(forge_binary().string()) + " export --checkpoint " +
                           shell_quote((root_ / "export_z2_np2").string()) + " --out " + shell_quote(out.string()));
  ASSERT_EQ(e.status, 0) << e.out;
  const auto hf = forge::io::load_safetensors(out / "model.safetensors").tensors;
  const forge::Tensor* w = hf.find("transformer.h.0.attn.c_attn.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape(), (forge::Shape{32, 96})) << "GPT-2's Conv1D layout is (in, out)";
  EXPECT_EQ(hf.find("lm_head.weight"), nullptr) << "the tied head is not written";
  std::ifstream cfg(out / "config.json");
  const auto j = nlohmann::json::parse(cfg);
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["n_embd"], 32);
  EXPECT_EQ(j["n_layer"], 2);
  const auto ck = final_params(root_ / "export_z2_np2");
  const auto back = forge::io::gpt2_from_hf(hf.items());
  for (const auto& [name, t] : back) {
    const forge::Tensor* o = ck.find(name);
    ASSERT_NE(o, nullptr) << name;
    EXPECT_EQ(max_rel(t, *o), 0.0) << name;
  }
  const ShellRun bad = shell(shell_quote(forge_binary().string()) + " export --checkpoint " +
                             shell_quote((root_ / "export_z2_np2").string()) + " --out " +
                             shell_quote((root_ / "x").string()) + " --dtype f8");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("--dtype 'f8' is not one of f32, bf16, f16"), std::string::npos) << bad.out;
}

// debug.skip_reductions = true (a diagnostic for benchmarks) really skips the averaging: each
// rank then trains on its own rows only, so the weights leave DDP's; ZeRO-2/3 refuse it. It
// changes what the run computes, so the run's config records it.
TEST_F(DataParallelTrain, SkipReductionsDiagnosticSkipsTheAveraging) {
  auto args = base_args(root_, "skip_reductions", 20);
  args.push_back("--debug.skip_reductions=true");
  const ShellRun r = shell(runs.rank_env() + "mpirun --oversubscribe --bind-to none -np 2 " + runs.forge_cmd(args));
  ASSERT_EQ(r.status, 0) << r.out;
  {
    std::ifstream f(root_ / "skip_reductions" / "config.toml");
    std::stringstream ss;
    ss << f.rdbuf();
    EXPECT_NE(ss.str().find("skip_reductions = true"), std::string::npos) << ss.str();
  }
  const auto got = final_params(root_ / "skip_reductions"), ddp = final_params(reference("sgd", 1, 2));
  double worst = 0;
  for (const auto& [name, t] : ddp) worst = std::max(worst, max_rel(*got.find(name), t));
  EXPECT_GT(worst, 1e-4) << "the run without reductions matches DDP: the reductions were not skipped";
  auto z2 = base_args(root_, "skip_reductions_z2", 2);
  z2.push_back("--dist.zero_stage=2");
  z2.push_back("--debug.skip_reductions=true");
  const ShellRun bad = shell(runs.rank_env() + "mpirun --oversubscribe --bind-to none -np 2 " + runs.forge_cmd(z2));
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("debug.skip_reductions = true works with dist.zero_stage = 0 or 1 only"), std::string::npos)
      << bad.out;
}

// The diagnostics that restore the older paths (gradients copied into the bucket views instead
// of written there by backward, Note [claimed grad buffer]; the step's figures read at once
// instead of one step late, Note [deferred step read]) give the same run, bit for bit: the
// faster paths change no arithmetic.
TEST_F(DataParallelTrain, ClaimedBuffersAndTheDeferredReadChangeNoArithmetic) {
  const ShellRun r = shell("FORGE_NO_GRAD_BUFFER_CLAIM=1 FORGE_TRAIN_SYNC_EACH_STEP=1 " + runs.rank_env() +
                           "mpirun --oversubscribe --bind-to none -np 2 " +
                           runs.forge_cmd(base_args(root_, "copied_grads", 20, "adamw")));
  ASSERT_EQ(r.status, 0) << r.out;
  expect_same_run(root_ / "copied_grads", reference("adamw", 1, 2), 1, 0.0, 0.0, "copied vs claimed gradients");
}

// f16 with dynamic loss scaling under data parallelism: every rank agrees on the overflow
// verdict (DDP: the same reduced gradients; ZeRO-2: the flag all-reduced with the norm), so
// DDP and ZeRO-2 follow the single f16 process within f16 rounding, and the scale is logged.
// SGD without clipping, so that gradients left scaled (or unscaled twice) would show in the
// weights (AdamW and a clipped norm would hide a constant factor).
TEST_F(DataParallelTrain, HalfPrecisionWithLossScalingTrainsUnderDataParallelism) {
  auto f16 = [](std::vector<std::string> a) {
    a.push_back("--run.dtype=f16");
    a.push_back("--optim.grad_clip=0");
    return a;
  };
  const ShellRun single = runs.run_single(f16(base_args(root_, "f16_single", 20, "sgd")));
  ASSERT_EQ(single.status, 0) << single.out;
  for (int stage : {0, 2}) {
    const std::string name = "f16_np2_zero" + std::to_string(stage);
    auto args = f16(base_args(root_, name, 20, "sgd"));
    args.push_back("--dist.zero_stage=" + std::to_string(stage));
    const ShellRun r = runs.run_mpi(2, args);
    ASSERT_EQ(r.status, 0) << r.out;
    expect_same_run(root_ / name, root_ / "f16_single", 1, 5e-3, 1e-2, name + " vs one f16 process");
    std::ifstream metrics(root_ / name / "metrics.jsonl");
    std::string line;
    std::getline(metrics, line);
    EXPECT_NE(line.find("\"loss_scale\":65536"), std::string::npos) << line;
  }
  auto offload = f16(base_args(root_, "f16_offload", 2, "adamw"));
  offload.push_back("--dist.zero_stage=2");
  offload.push_back("--dist.offload_optimizer=true");
  const ShellRun bad = runs.run_mpi(2, offload);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("run.dtype = \"f16\" with dist.offload_optimizer = true is not supported"), std::string::npos)
      << bad.out;
}

// Note [masters from the f32 initial weights] (train/strategy.h) in every data-parallel layout:
// one bf16 AdamW step at a learning rate far below half the bf16 spacing of most weights moves a
// weight only where its f32 master, seeded from the f32 initialisation, sits close enough to a
// rounding boundary; each rank seeds the masters of its own pieces (ZeRO), or the offloaded CPU
// masters; tensor parallelism its slices, pipeline parallelism its stage's parameters. So DDP,
// ZeRO-1/2/3, the offloaded optimizer, tp = 2 and pp = 2 end the step with the one-process
// run's weights; masters started from the bf16 weights (debug.masters_from_rounded, the negative
// control) move a different set.
TEST_F(DataParallelTrain, Bf16MastersStartFromTheF32WeightsInEveryLayout) {
  auto bf16 = [](std::vector<std::string> a) {
    for (const char* o : {"--run.dtype=bf16", "--optim.lr=2e-6", "--schedule.kind=constant", "--schedule.warmup_steps=0",
                          "--schedule.min_lr=0", "--checkpoint.at_end=true"})
      a.push_back(o);
    return a;
  };
  // Elements of the final weights that differ from the one-process run's, and all elements.
  auto differing = [&](const std::string& name) {
    const auto want = final_params(root_ / "masters_single"), got = final_params(root_ / name);
    EXPECT_EQ(got.size(), want.size()) << name;
    std::map<std::string, forge::Tensor> by_name(got.begin(), got.end());
    int64_t diff = 0, all = 0;
    for (const auto& [n, w] : want) {
      EXPECT_TRUE(by_name.count(n)) << name << ": no " << n;
      if (!by_name.count(n)) continue;
      const auto a = by_name.at(n).to(forge::DType::f32).to_vector<float>(), b = w.to(forge::DType::f32).to_vector<float>();
      for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) diff += a[i] != b[i];
      all += static_cast<int64_t>(b.size());
    }
    return std::pair{diff, all};
  };
  const ShellRun single = runs.run_single(bf16(base_args(root_, "masters_single", 1, "adamw")));
  ASSERT_EQ(single.status, 0) << single.out;
  EXPECT_NE(single.out.find("master weights: f32, from the initial weights"), std::string::npos) << single.out;
  for (const auto& [name, extra] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"masters_ddp", {"--dist.zero_stage=0"}},
           {"masters_zero1", {"--dist.zero_stage=1"}},
           {"masters_zero2", {"--dist.zero_stage=2"}},
           {"masters_zero3", {"--dist.zero_stage=3"}},
           {"masters_zero2_offload", {"--dist.zero_stage=2", "--dist.offload_optimizer=true"}},
           {"masters_tp2", {"--dist.tp=2"}},
           {"masters_pp2", {"--dist.pp=2"}}}) {
    auto args = bf16(base_args(root_, name, 1, "adamw"));
    args.insert(args.end(), extra.begin(), extra.end());
    const ShellRun r = runs.run_mpi(2, args);
    ASSERT_EQ(r.status, 0) << name << "\n" << r.out;
    const auto [diff, all] = differing(name);
    std::cout << name << ": " << diff << " of " << all << " weights differ from one process's\n";
    EXPECT_LE(diff * 1000, all) << name << ": " << diff << " of " << all << " weights differ from one process's";
  }
  // The negative control, in one process: a different set of weights moved.
  auto rounded = bf16(base_args(root_, "masters_rounded", 1, "adamw"));
  rounded.push_back("--debug.masters_from_rounded=true");
  const ShellRun r = runs.run_single(rounded);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto [diff, all] = differing("masters_rounded");
  std::cout << "masters_rounded: " << diff << " of " << all << " weights differ from one process's\n";
  EXPECT_GE(diff * 200, all) << diff << " of " << all << " weights differ: the control should move far more";
}

// LeNet on a slice of Fashion-MNIST through the same loop and strategies: 599 training images in
// batches of 32 leave a last batch of 23 in each epoch, split 11 + 12 over two ranks (Note [uneven
// rows]). DDP and ZeRO-2 on two ranks follow the one-process run (losses, weights, test accuracy),
// and a DDP checkpoint taken mid-epoch resumes in one process as the one-process run continues.
std::vector<std::string> lenet_args(const fs::path& dir, const std::string& name) {
  return {"--run.dir=" + dir.string(), "--run.name=" + name, "--run.device=cpu", "--run.overwrite=true",
          "--model.type=lenet", "--data.max_train_samples=599", "--data.max_test_samples=500", "--train.epochs=2",
          "--train.batch_size=32", "--train.eval_batch_size=200", "--train.log_every=1", "--optim.name=sgd",
          "--optim.lr=0.025", "--optim.momentum=0.9", "--checkpoint.every=10", "--checkpoint.keep_last=5"};
}

double final_test_accuracy(const fs::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  std::string line;
  double acc = -1;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("final") && j.contains("test_accuracy")) acc = j["test_accuracy"].get<double>();
  }
  return acc;
}

TEST_F(DataParallelTrain, LenetTrainsUnderDataParallelismAsInOneProcess) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST (Debian package dataset-fashion-mnist) is not installed";
  const ShellRun single = runs.run_single(lenet_args(root_, "lenet_single"));
  ASSERT_EQ(single.status, 0) << single.out;
  const double acc = final_test_accuracy(root_ / "lenet_single");
  EXPECT_GT(acc, 0.15) << single.out;  // chance is 0.1; 38 steps of SGD only begin to learn
  for (int stage : {0, 2}) {
    const std::string name = "lenet_np2_zero" + std::to_string(stage);
    auto args = lenet_args(root_, name);
    args.push_back("--dist.zero_stage=" + std::to_string(stage));
    const ShellRun r = runs.run_mpi(2, args);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("data parallel: 2 rank(s)"), std::string::npos) << r.out;
    expect_same_run(root_ / name, root_ / "lenet_single", 1, 1e-6, 1e-6, name + " vs one process");
    EXPECT_NEAR(final_test_accuracy(root_ / name), acc, 0.0021) << "one test image either way of 500";
  }
  // The DDP run's checkpoint at step 10 (mid-epoch) resumes in one process.
  auto resumed = lenet_args(root_, "lenet_np2_then_single");
  resumed.push_back("--run.overwrite=false");
  const ShellRun d = shell(runs.rank_env() + runs.forge_cmd(resumed) + " --resume " +
                           shell_quote((root_ / "lenet_np2_zero0" / "checkpoints" / "step_00000010").string()));
  ASSERT_EQ(d.status, 0) << d.out;
  expect_same_run(root_ / "lenet_np2_then_single", root_ / "lenet_single", 11, 1e-6, 1e-6, "lenet DDP -> one process");

  // A last batch smaller than the world is refused before training, naming the keys.
  auto small = lenet_args(root_, "lenet_np2_small");
  small.push_back("--data.max_train_samples=101");
  small.push_back("--train.batch_size=50");
  const ShellRun bad = runs.run_mpi(2, small);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("leave a last batch of 1 image(s) in each epoch, fewer than the 2 data-parallel ranks"),
            std::string::npos)
      << bad.out;
}

TEST_F(DataParallelTrain, AWorldSizeThatDoesNotDivideTheBatchIsRejectedBeforeStart) {
  const ShellRun r = runs.run_mpi(3, base_args(root_, "np3", 5));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("train.batch_size = 8 is not divisible by the world size 3"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(root_ / "np3" / "checkpoints")) << "work was done before the check";
}

// A rank that dies mid-run ends the whole job quickly, naming what happened, never a hang.
TEST_F(DataParallelTrain, ARankThatDiesEndsTheJobWithinSeconds) {
  auto args = base_args(root_, "dies", 2000);
  args.push_back("--debug.abort_at=1:5");
  const ShellRun r = shell(runs.rank_env() + "timeout 60 mpirun --oversubscribe --bind-to none -np 2 " + runs.forge_cmd(args));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.status, 124) << "the job hung until the test's timeout: " << r.out;
  EXPECT_LT(r.seconds, 30.0) << r.out;
  EXPECT_NE(r.out.find("rank 1"), std::string::npos) << r.out;
}

// A rank that stops without exiting (stuck, or unreachable while alive) must not hang the job:
// the others' waits time out (FORGE_DIST_TIMEOUT) and abort it, naming the operation.
TEST_F(DataParallelTrain, AStuckPeerEndsTheJobAfterTheTimeout) {
  auto args = base_args(root_, "stuck", 2000);
  args.push_back("--debug.hang_at=1:4");
  const ShellRun r = shell(runs.rank_env() + "FORGE_DIST_TIMEOUT=3 timeout 60 mpirun --oversubscribe --bind-to none -np 2 " +
                           runs.forge_cmd(args));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.status, 124) << "the job hung until the test's timeout: " << r.out;
  EXPECT_LT(r.seconds, 30.0) << r.out;
  EXPECT_NE(r.out.find("on rank 0 of 2 did not complete within 3 s (FORGE_DIST_TIMEOUT)"), std::string::npos) << r.out;
}

}  // namespace
