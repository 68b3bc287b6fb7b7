// The parts of the CUDA-graph training step that do not need a GPU (train/graphed_step.h): when
// a run is captured and why not, the run.cuda_graph key, a CPU run untouched by it, and the
// optimizer's refusal to capture CPU parameters. The capture itself, and that a run gives the same
// bits with and without it, are tested on the GPU (tests/backends/cuda/test_cuda_graph.cpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "forge/core/error.h"
#include "forge/ops/creation.h"
#include "forge/optim/adamw.h"
#include "forge/run/config.h"
#include "forge/train/graphed_step.h"
#include "forge/train/trainer.h"
#include "train_testing.h"

namespace forge::train {
namespace {

using train_testing::Scratch;

RunConfig config_with(const Scratch& s, const std::vector<std::string>& overrides) {
  if (!std::filesystem::exists(s.path() / "corpus")) train_testing::write_corpus(s.path() / "corpus");
  return parse_config(train_testing::tiny_toml(s.path(), "graph", 4), "graph.toml", overrides);
}

TEST(GraphedStep, TheBlockerNamesEachReasonAndIsEmptyWhenTheStepCanBeCaptured) {
  Scratch s;
  const Device gpu = Device::cuda(0);
  EXPECT_EQ(graph_blocker(config_with(s, {}), gpu, false), "");
  EXPECT_EQ(graph_blocker(config_with(s, {}), Device::cpu(), false), "not a GPU");
  EXPECT_EQ(graph_blocker(config_with(s, {"run.cuda_graph=false"}), gpu, false), "run.cuda_graph = false");
  EXPECT_NE(graph_blocker(config_with(s, {"model.dropout=0.1"}), gpu, false).find("model.dropout > 0"), std::string::npos);
  EXPECT_NE(graph_blocker(config_with(s, {}), gpu, true).find("FORGE_TRAIN_PHASES"), std::string::npos);
  // Note [token weights on the device]: packed documents' weights come from the batches on the
  // device in a replay: no blocker.
  EXPECT_EQ(graph_blocker(config_with(s, {"data.packing=documents"}), gpu, false), "");
}

TEST(GraphedStep, TheConfigKeyDefaultsOnAndRoundTrips) {
  Scratch s;
  EXPECT_TRUE(config_with(s, {}).run.cuda_graph);
  const RunConfig off = config_with(s, {"run.cuda_graph=false"});
  EXPECT_FALSE(off.run.cuda_graph);
  const RunConfig back = parse_config(config_to_toml(off), "roundtrip.toml");
  EXPECT_FALSE(back.run.cuda_graph);
  EXPECT_THROW(config_with(s, {"run.cuda_graph=maybe"}), Error);
}

TEST(GraphedStep, ACpuRunSaysNothingAboutGraphs) {
  Scratch s;
  std::ostringstream log;
  const TrainResult r = run_training(config_with(s, {}), {}, log);
  EXPECT_EQ(r.final_step, 4);
  EXPECT_EQ(log.str().find("cuda graph"), std::string::npos) << log.str();
}

TEST(GraphedStep, TheOptimizerRefusesToCaptureOffAGpu) {
  Tensor p = ones({3}).requires_grad_();
  optim::AdamW opt({p}, {});
  try {
    opt.begin_graph_capture(Device::cpu());
    FAIL() << "begin_graph_capture on the CPU must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA graphs capture updates of GPU parameters"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(opt.has_graph_step());
  EXPECT_THROW(opt.count_replayed_step(), Error);  // nothing captured
  EXPECT_THROW(opt.stage_graph_inputs(), Error);
}

}  // namespace
}  // namespace forge::train
