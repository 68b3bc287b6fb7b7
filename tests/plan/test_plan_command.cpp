// The forge train command of a planned layout (plan/command.h): what `forge plan --search` prints
// for its best layout must run that layout unchanged. Each command's `forge train` part is
// loaded as forge train loads it (the config and its overrides, checked), and the layout it gives
// at the command's world size is the planned one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "forge/plan/command.h"
#include "forge/plan/gpu_catalog.h"
#include "forge/run/config.h"
#include "forge/run/layout.h"
#include "forge/run/run_model_spec.h"

namespace forge::plan {
namespace {

namespace fs = std::filesystem;

// A LLaMA config on random tokens (what the command's config stands for).
fs::path llama_config() {
  const fs::path p = fs::temp_directory_path() / ("forge_plan_command_" + std::to_string(::getpid()) + ".toml");
  std::ofstream(p) << "[model]\ntype = \"llama\"\nvocab_size = 32000\nblock_size = 2048\nn_layer = 16\nn_head = 32\n"
                      "n_kv_head = 8\ndim = 2048\nffn_hidden = 5632\n[data]\nsource = \"random\"\n"
                      "[train]\nbatch_size = 16\nseq_len = 2048\n";
  return p;
}

struct Parsed {
  std::string launcher;
  int64_t ranks = 0;
  std::string config;
  std::vector<std::string> overrides;
};

Parsed parse(const std::string& cmd) {
  std::istringstream in(cmd);
  std::vector<std::string> w;
  for (std::string t; in >> t;) w.push_back(t);
  Parsed p;
  p.launcher = w.at(0);
  size_t i = 0;
  if (w[0] == "forge") p.ranks = std::stoll(w.at(3));
  else p.ranks = std::stoll(w.at(2)) * std::stoll(w.at(4));  // srun -N nodes --ntasks-per-node G
  while (i < w.size() && w[i] != "train") ++i;
  p.config = w.at(i + 1);
  p.overrides.assign(w.begin() + static_cast<std::ptrdiff_t>(i) + 2, w.end());
  return p;
}

PlanInput input(const fs::path& config, int64_t gpus) {
  PlanInput in;
  in.model = train::model_spec_of(train::load_config(config.string()));
  in.model.name = config.string();
  in.global_batch = 16;
  in.cluster = make_cluster(find_gpu("h100"), gpus);
  in.setup.precision = Precision::bf16;
  in.tokens = 1e9;
  return in;
}

// The command with its placeholders filled in: a text file for CORPUS, a tokenizer file for
// TOKENIZER.
std::string filled(std::string cmd) {
  const fs::path dir = fs::temp_directory_path() / ("forge_plan_command_data_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "corpus.txt") << "Some text to train on.\n";
  std::ofstream(dir / "tokenizer.json") << "{}";
  for (const auto& [from, to] : {std::pair<std::string, fs::path>{"CORPUS", dir / "corpus.txt"},
                                 std::pair<std::string, fs::path>{"TOKENIZER", dir / "tokenizer.json"}}) {
    const size_t at = cmd.find("=" + from);
    if (at != std::string::npos) cmd.replace(at + 1, from.size(), to.string());
  }
  return cmd;
}

void expect_runs_unchanged(const PlanInput& in, const Layout& l) {
  const TrainCommand c = train_command(in, l);
  ASSERT_TRUE(c.unsupported.empty()) << c.unsupported << ": " << c.command;
  const Parsed p = parse(filled(c.command));
  EXPECT_EQ(p.ranks, l.dp * l.tp * l.pp) << c.command;
  const train::RunConfig cfg = train::load_config(p.config, p.overrides);  // throws on a bad key
  const parallel::Layout got = train::run_layout(cfg, static_cast<int>(p.ranks));
  EXPECT_EQ(got.dp, l.dp) << c.command;
  EXPECT_EQ(got.tp, l.tp) << c.command;
  EXPECT_EQ(got.pp, l.pp) << c.command;
  EXPECT_EQ(got.micro_batch, l.micro_batch) << c.command;
  EXPECT_EQ(got.grad_accum, l.grad_accum) << c.command;
  EXPECT_EQ(got.zero, l.zero) << c.command;
  EXPECT_EQ(got.sequence_parallel, l.sequence_parallel && l.tp > 1) << c.command;
  if (l.pp > 1) {
    EXPECT_EQ(got.schedule, l.schedule) << c.command;
  }
  EXPECT_EQ(got.checkpointing, l.checkpointing) << c.command;
  EXPECT_EQ(cfg.run.dtype, "bf16");
  // The planned tokens, the data to fill in.
  const int64_t per_step = l.global_batch() * in.model.seq_len;
  EXPECT_EQ(cfg.train.steps, static_cast<int64_t>((in.tokens + per_step - 1) / per_step)) << c.command;
  EXPECT_EQ(cfg.data.source, "files") << c.command;
  EXPECT_NE(c.fill_in.find("CORPUS = your training data"), std::string::npos) << c.fill_in;
  EXPECT_NE(c.fill_in.find("TOKENIZER = a tokenizer file of 32000 tokens"), std::string::npos) << c.fill_in;
}

TEST(PlanCommand, TheBestLayoutsCommandRunsItUnchanged) {
  const fs::path cfg = llama_config();
  Layout ddp;
  ddp.dp = 8, ddp.micro_batch = 1, ddp.grad_accum = 2, ddp.zero = 1;
  expect_runs_unchanged(input(cfg, 8), ddp);
  Layout tp;
  tp.dp = 2, tp.tp = 4, tp.sequence_parallel = true, tp.micro_batch = 2, tp.grad_accum = 4;
  expect_runs_unchanged(input(cfg, 8), tp);
  Layout pp;
  pp.dp = 4, pp.pp = 4, pp.micro_batch = 1, pp.grad_accum = 4, pp.zero = 2, pp.schedule = parallel::PipelineSchedule::gpipe,
  pp.checkpointing = parallel::Checkpointing::full;
  expect_runs_unchanged(input(cfg, 16), pp);  // two hosts of 8: srun
  Layout three;
  three.dp = 2, three.tp = 2, three.pp = 2, three.sequence_parallel = true, three.micro_batch = 2, three.grad_accum = 4,
  three.zero = 1, three.schedule = parallel::PipelineSchedule::zb_h1;
  expect_runs_unchanged(input(cfg, 8), three);
  EXPECT_EQ(train_command(input(cfg, 16), pp).command.rfind("srun -N 2 --ntasks-per-node 8 forge train", 0), 0u);
  fs::remove(cfg);
}

// A config that names its own data keeps it: nothing to fill in.
TEST(PlanCommand, AConfigWithItsDataNeedsNothingFilledIn) {
  PlanInput in = input(llama_config(), 8);
  in.data_given = true;
  Layout ddp;
  ddp.dp = 8, ddp.micro_batch = 2, ddp.grad_accum = 1;
  const TrainCommand c = train_command(in, ddp);
  EXPECT_EQ(c.fill_in, "");
  EXPECT_EQ(c.command.find("--data."), std::string::npos) << c.command;
  EXPECT_NE(c.command.find("--train.steps=30518 "), std::string::npos) << c.command;  // 1e9 / (16 x 2048), up
}

TEST(PlanCommand, LayoutsForgeTrainDoesNotRunAreSaid) {
  const fs::path cfg = llama_config();
  Layout l;
  l.dp = 2, l.tp = 1, l.pp = 4, l.micro_batch = 2, l.grad_accum = 4, l.zero = 3;
  EXPECT_NE(train_command(input(cfg, 8), l).unsupported.find("ZeRO-3"), std::string::npos);
  l.zero = 0, l.tp = 1, l.pp = 1, l.dp = 8, l.grad_accum = 1, l.checkpointing = parallel::Checkpointing::selective;
  EXPECT_NE(train_command(input(cfg, 8), l).unsupported.find("selective"), std::string::npos);
  fs::remove(cfg);
}

}  // namespace
}  // namespace forge::plan
