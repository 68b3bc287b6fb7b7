// run.fp8 on the CPU (issue 39, item 4: the recipes' emulation runs in forge train, slowly, for
// tests): a small GPT trains with each recipe, its losses beside the run without FP8 from the same
// weights and batches, and a GPU run is refused before any work.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "forge/core/error.h"
#include "forge/ops/fp8.h"
#include "forge/run/config.h"
#include "forge/train/trainer.h"
#include "train_testing.h"

namespace forge::train {
namespace {

using train_testing::Scratch;

TEST(Fp8Train, EachRecipeTrainsBesideTheRunWithoutFp8) {
  Scratch scratch;
  train_testing::write_corpus(scratch.path() / "corpus");
  auto run = [&](const std::string& fp8) {
    const RunConfig c = parse_config(train_testing::tiny_toml(scratch.path(), "fp8_" + fp8, 30), "fp8.toml",
                                     {"--run.fp8=" + fp8, "--run.dtype=f32", "--checkpoint.at_end=false"});
    std::ostringstream log;
    return run_training(c, {}, log);
  };
  const TrainResult off = run("off");
  ASSERT_EQ(off.losses.size(), 30u);
  for (const char* recipe : {"tensorwise", "rowwise", "blockwise"}) {
    const TrainResult r = run(recipe);
    ASSERT_EQ(r.losses.size(), 30u) << recipe;
    // The first step's loss: the same weights and batch, the blocks' GEMMs in e4m3.
    EXPECT_NEAR(r.losses[0], off.losses[0], 0.01 * off.losses[0]) << recipe;
    EXPECT_NE(r.losses[0], off.losses[0]) << recipe << ": the FP8 path did not run";
    // Training works: the loss falls as it does without FP8, and ends within a few percent of it.
    EXPECT_LT(r.losses.back(), r.losses.front() - 0.5) << recipe;
    EXPECT_NEAR(r.final_val_loss, off.final_val_loss, 0.05 * off.final_val_loss) << recipe;
  }
  fp8::set_training_recipe(std::nullopt);
}

// Note [FP8 guardrails] end to end: a learning rate that blows the weights up makes the casts meet
// infinities, and the log names the layer and the operand.
TEST(Fp8Train, NonFiniteAmaxIsLoggedByLayer) {
  Scratch scratch;
  train_testing::write_corpus(scratch.path() / "corpus");
  const RunConfig c = parse_config(train_testing::tiny_toml(scratch.path(), "fp8_blowup", 4), "fp8.toml",
                                   {"--run.fp8=tensorwise", "--run.dtype=f32", "--optim.lr=1e38", "--optim.grad_clip=0",
                                    "--schedule.warmup_steps=0", "--schedule.kind=constant", "--checkpoint.at_end=false",
                                    "--eval.every=0"});
  std::ostringstream log;
  try {
    (void)run_training(c, {}, log);
  } catch (const Error&) {
    // (a run whose every step is non-finite may stop; the log is what is checked)
  }
  fp8::set_training_recipe(std::nullopt);
  const std::string out = log.str();
  EXPECT_NE(out.find("fp8: step "), std::string::npos) << out;
  EXPECT_NE(out.find("non-finite amax"), std::string::npos) << out;
  EXPECT_NE(out.find("transformer.h."), std::string::npos) << "the layer's name: " << out;
}

TEST(Fp8Train, RefusedOnAGpuAndForAnUnknownRecipe) {
  Scratch scratch;
  try {
    (void)parse_config(train_testing::tiny_toml(scratch.path()), "fp8.toml", {"--run.fp8=rowwise", "--run.device=cuda"});
    FAIL() << "run.fp8 accepted on a GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CPU emulation only"), std::string::npos) << e.what();
  }
  try {
    (void)parse_config(train_testing::tiny_toml(scratch.path()), "fp8.toml", {"--run.fp8=delayed"});
    FAIL() << "an unknown recipe accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run.fp8 = 'delayed'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace forge::train
