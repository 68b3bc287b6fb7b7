// Note [one process is a data-parallel group of one] (parallel/self_group.h): a run of one
// process without ZeRO trains through the data-parallel executor over a self group. It must
// stay what a one-process run was: no communication engine started (no world group, so no MPI
// and no NCCL), the one-process log line, and the one-process checkpoint (the whole optimizer in
// optimizer.safetensors, no shard files, no extra.dist), which a ZeRO layout resumes.
#include <gtest/gtest.h>

#include <sstream>

#include "forge/io/checkpoint.h"
#include "forge/parallel/world.h"
#include "forge/run/config.h"
#include "forge/train/trainer.h"
#include "train_testing.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using train_testing::Scratch;

TEST(OneProcessExecutor, StartsNoEngineAndWritesTheOneProcessCheckpoint) {
  Scratch scratch;
  train_testing::write_corpus(scratch.path() / "corpus");
  const RunConfig c = parse_config(train_testing::tiny_toml(scratch.path(), "solo", 4), "solo.toml",
                                   {"--eval.every=0", "--checkpoint.at_end=true"});
  std::ostringstream log;
  const TrainResult r = run_training(c, {}, log);
  EXPECT_EQ(parallel::world(), nullptr) << "a one-process run started a world group";
  EXPECT_NE(log.str().find("layout: one process on cpu"), std::string::npos) << log.str();
  EXPECT_EQ(log.str().find("data parallel:"), std::string::npos) << log.str();

  const fs::path ck = r.last_checkpoint;
  for (const auto& e : fs::directory_iterator(ck))
    EXPECT_EQ(e.path().filename().string().find("optimizer.rank"), std::string::npos) << e.path();
  const io::CheckpointData d = io::load_checkpoint(ck);
  EXPECT_FALSE(d.extra.contains("dist"));
  ASSERT_TRUE(d.extra.contains("optimizer"));
  EXPECT_EQ(d.extra["optimizer"]["name"], "AdamW");
  // The whole optimizer: both moments (and nothing else in f32) of every trained parameter.
  int64_t moments = 0, elements = 0;
  for (const auto& [name, t] : d.optimizer) {
    ASSERT_EQ(name.rfind("state.", 0), 0u) << name;
    if (name.find(".exp_avg") != std::string::npos) ++moments, elements += t.numel();
  }
  int64_t params = 0, trained = 0;
  for (const auto& [name, t] : d.model) ++params, trained += t.numel();
  EXPECT_GT(moments, 0);
  EXPECT_EQ(moments, 2 * params);  // exp_avg and exp_avg_sq of each (tiny GPT: tied head, one entry)
  EXPECT_EQ(elements, 2 * trained);

  // ZeRO-1 on a world of one (the sharded path, a real process group) resumes it and finishes.
  std::ostringstream log2;
  const RunConfig z = parse_config(train_testing::tiny_toml(scratch.path(), "solo", 6), "solo.toml",
                                   {"--eval.every=0", "--checkpoint.at_end=true", "--dist.zero_stage=1"});
  TrainOptions o;
  o.resume = true;
  const TrainResult r2 = run_training(z, o, log2);
  parallel::shutdown();
  EXPECT_EQ(r2.start_step, 4) << log2.str();
  EXPECT_EQ(r2.final_step, 6) << log2.str();
  EXPECT_NE(log2.str().find("ZeRO-1"), std::string::npos) << log2.str();
}

}  // namespace
}  // namespace forge::train
