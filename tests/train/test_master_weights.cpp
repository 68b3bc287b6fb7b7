// Note [masters from the f32 initial weights] (train/strategy.h): a 16-bit run's f32 master
// weights start from the f32 weights its parameters were rounded from (the random
// initialisation's, or model.init_from's), not from the rounded parameters. Checked on the CPU
// against an f32 run of the same config: after one step at a learning rate far below half the
// bf16 spacing of the weights, every master is within a few learning rates of the f32 run's
// weights; masters made from the bf16 parameters would be up to half a bf16 spacing away
// (2^-9 of |w|: 1e-4 for the largest weights here, 1000 learning rates).
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <unordered_map>

#include "forge/io/checkpoint.h"
#include "forge/optim/optimizer.h"
#include "forge/run/config.h"
#include "forge/run/model.h"
#include "forge/interop/export.h"
#include "forge/train/trainer.h"
#include "train_testing.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using train_testing::Scratch;

class MasterWeights : public ::testing::Test {
 protected:
  void SetUp() override { train_testing::write_corpus(scratch.path() / "corpus"); }

  RunConfig config(const std::string& name, const std::string& dtype, std::vector<std::string> more = {}) {
    std::vector<std::string> o = {"--run.dtype=" + dtype, "--optim.lr=1e-7", "--schedule.kind=constant",
                                  "--schedule.warmup_steps=0", "--schedule.min_lr=0", "--eval.every=0",
                                  "--checkpoint.at_end=true"};
    o.insert(o.end(), more.begin(), more.end());
    return parse_config(train_testing::tiny_toml(scratch.path(), name, 1), name + ".toml", o);
  }
  io::CheckpointData train_one_step(const RunConfig& c) {
    std::ostringstream log;
    const TrainResult r = run_training(c, {}, log);
    last_log = log.str();
    return io::load_checkpoint(r.last_checkpoint);
  }
  Scratch scratch;
  std::string last_log;
};

// The names of the optimizer's slots (state.<k>.*) of a single-process run: its parameters in
// the order of optim::decay_groups, as the one-process executor's (DDP's) optimizer keeps them.
std::vector<std::string> slot_names(const RunConfig& c) {
  const LanguageModel m = build_language_model(c);
  std::unordered_map<const TensorImpl*, std::string> name_of;
  const auto named = m.module->named_parameters();
  for (const auto& [n, t] : named) name_of.emplace(t.impl(), n);
  std::vector<std::string> out;
  for (const auto& g : optim::decay_groups(named, c.optim.weight_decay))
    for (const Tensor& p : g.params) out.push_back(name_of.at(p.impl()));
  return out;
}

// The largest distance between a bf16 run's masters and an f32 run's weights, after one step
// of each; and the largest weight.
std::pair<double, double> master_distance(const io::CheckpointData& ck_b, const io::CheckpointData& ck_f) {
  std::unordered_map<std::string, Tensor> weights(ck_f.model.begin(), ck_f.model.end());
  std::unordered_map<std::string, Tensor> state(ck_b.optimizer.begin(), ck_b.optimizer.end());
  const std::vector<std::string> names = slot_names(config_from_json(ck_b.config, "bf16 checkpoint"));
  EXPECT_FALSE(names.empty());
  double worst = 0.0, largest_weight = 0.0;
  for (size_t k = 0; k < names.size(); ++k) {
    const auto m = state.find("state." + std::to_string(k) + ".master");
    EXPECT_NE(m, state.end()) << "no master for " << names[k];
    EXPECT_TRUE(weights.count(names[k])) << names[k];
    if (m == state.end() || !weights.count(names[k])) return {1e9, 0.0};
    const std::vector<float> master = m->second.to(DType::f32).to_vector<float>();
    const std::vector<float> w = weights.at(names[k]).to(DType::f32).to_vector<float>();
    EXPECT_EQ(master.size(), w.size()) << names[k];
    for (size_t i = 0; i < std::min(w.size(), master.size()); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(master[i]) - w[i]));
      largest_weight = std::max(largest_weight, std::abs(static_cast<double>(w[i])));
    }
  }
  return {worst, largest_weight};
}

// Both runs moved by at most lr (Adam's first step: |m / (sqrt(v) + eps)| <= 1; weight decay
// 0.1 x lr x |w| is far smaller) from the same f32 initial weights, in either direction; half a
// bf16 spacing of the largest weight, where masters made from the bf16 parameters could be, is
// far beyond that.
constexpr double kLr = 1e-7;

TEST_F(MasterWeights, Bf16MastersStartFromTheF32InitialWeights) {
  const RunConfig f = config("f32", "f32"), b = config("bf16", "bf16");
  const io::CheckpointData ck_f = train_one_step(f), ck_b = train_one_step(b);
  EXPECT_NE(last_log.find("master weights: f32, from the initial weights"), std::string::npos) << last_log;
  const auto [worst, largest] = master_distance(ck_b, ck_f);
  EXPECT_LE(worst, 2.5 * kLr) << "largest weight " << largest;
  EXPECT_GT(largest * std::ldexp(1.0, -9), 100 * 2.5 * kLr);
  // The negative control: masters from the bf16 parameters are that far off.
  const io::CheckpointData ck_r = train_one_step(config("rounded", "bf16", {"--debug.masters_from_rounded=true"}));
  EXPECT_NE(last_log.find("master weights: from the bf16 parameters"), std::string::npos) << last_log;
  EXPECT_GT(master_distance(ck_r, ck_f).first, 100 * 2.5 * kLr);
}

// model.init_from: the masters start from the file's f32 values (loaded before the cast). The
// file: an f32 run trained for 3 steps at the tiny config's lr (its weights off the initial
// ones), exported as a Hugging Face directory in f32.
TEST_F(MasterWeights, InitFromMastersAreTheFilesF32Weights) {
  std::ostringstream log;
  run_training(parse_config(train_testing::tiny_toml(scratch.path(), "source", 3), "source.toml", {}), {}, log);
  const fs::path hf = scratch.path() / "source_hf";
  export_model({.checkpoint = (scratch.path() / "runs" / "source").string(), .out = hf.string(), .dtype = ""});
  const std::string from = "--model.init_from=" + hf.string();
  const RunConfig f = config("init_f32", "f32", {from}), b = config("init_bf16", "bf16", {from});
  const io::CheckpointData ck_f = train_one_step(f), ck_b = train_one_step(b);
  const auto [worst, largest] = master_distance(ck_b, ck_f);
  EXPECT_LE(worst, 2.5 * kLr) << "largest weight " << largest;
  EXPECT_GT(largest * std::ldexp(1.0, -9), 100 * 2.5 * kLr);
}

}  // namespace
}  // namespace forge::train
