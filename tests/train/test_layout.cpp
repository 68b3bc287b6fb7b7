// train::run_layout: the config's [dist] and [train] keys against the world size, as the one
// parallel::Layout type `forge plan` prices; every check names the key and the fix, before any work.
#include <gtest/gtest.h>

#include <string>

#include "forge/core/error.h"
#include "forge/run/layout.h"

namespace forge::train {
namespace {

RunConfig gpt() {
  RunConfig c;
  c.model.type = "gpt";
  c.model.n_layer = 4;
  c.model.n_head = 4;
  c.model.n_embd = 64;
  c.model.vocab_size = 512;
  c.train.batch_size = 16;
  return c;
}

std::string error_of(const RunConfig& c, int world) {
  try {
    run_layout(c, world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RunLayout, DataParallelDegreeAndMicroBatchFollowTheGlobalBatch) {
  RunConfig c = gpt();
  c.train.grad_accum = 2;
  c.dist.zero_stage = 2;
  c.dist.offload_optimizer = true;
  const parallel::Layout l = run_layout(c, 4);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.tp, 1);
  EXPECT_EQ(l.pp, 1);
  EXPECT_EQ(l.grad_accum, 2);
  EXPECT_EQ(l.micro_batch, 2);  // 16 / (4 ranks x 2 micro-batches)
  EXPECT_EQ(l.global_batch(), 16);
  EXPECT_EQ(l.zero, 2);
  EXPECT_TRUE(l.offload);
  EXPECT_EQ(l.describe(), "dp 4, tp 1, pp 1, micro-batch 2 x 2, ZeRO-2 + offload, checkpointing none");
}

TEST(RunLayout, ABatchThatDoesNotSplitNamesTheWorldAndTheAccumulation) {
  RunConfig c = gpt();
  c.train.batch_size = 8;
  EXPECT_NE(error_of(c, 3).find("train.batch_size = 8 is not divisible by the world size 3"), std::string::npos);
  c.train.grad_accum = 4;
  const std::string e = error_of(c, 4);
  EXPECT_NE(e.find("train.batch_size = 8 is not divisible by the world size 4 x train.grad_accum = 4"),
            std::string::npos) << e;
  EXPECT_NE(e.find("make it a multiple of 16"), std::string::npos) << e;
}

TEST(RunLayout, TensorParallelOnOneProcessNamesTheWorldSizeAndTheFix) {
  RunConfig c = gpt();
  c.dist.tp = 2;
  const std::string e = error_of(c, 1);
  EXPECT_NE(e.find("dist.tp = 2 x dist.pp = 1 = 2 ranks per model replica, but the world has 1 process"),
            std::string::npos) << e;
  EXPECT_NE(e.find("forge launch --nproc-per-node 2"), std::string::npos) << e;
}

TEST(RunLayout, ShapesThatDoNotSplitOverTheDegreesAreRefused) {
  RunConfig c = gpt();
  c.dist.tp = 8;  // 4 heads
  EXPECT_NE(error_of(c, 8).find("model.n_head = 4 is not divisible by dist.tp = 8"), std::string::npos);
  c = gpt();
  c.dist.tp = 2;
  c.model.vocab_size = 513;
  EXPECT_NE(error_of(c, 2).find("model.vocab_size = 513 is not divisible by dist.tp = 2"), std::string::npos);
  c = gpt();
  c.dist.pp = 8;
  EXPECT_NE(error_of(c, 8).find("dist.pp = 8 pipeline stages need at least as many blocks, but model.n_layer = 4"),
            std::string::npos);
  RunConfig l;
  l.model.type = "llama";
  l.model.n_layer = 2;
  l.model.n_head = 8;
  l.model.n_kv_head = 2;
  l.model.dim = 64;
  l.model.ffn_hidden = 102;
  l.model.vocab_size = 512;
  l.dist.tp = 4;
  l.train.batch_size = 4;
  EXPECT_NE(error_of(l, 4).find("the FFN width 102 (model.ffn_hidden) is not divisible by dist.tp = 4"),
            std::string::npos) << error_of(l, 4);
  l.model.ffn_hidden = 128;
  l.model.n_kv_head = 8;
  l.model.n_head = 24;
  l.model.dim = 96;
  l.dist.tp = 3;
  EXPECT_NE(error_of(l, 3).find("key/value heads (model.n_kv_head) and dist.tp = 3 do not split"), std::string::npos)
      << error_of(l, 3);
}

// dist.pp > 1 is a layout: pp x dp ranks, the schedule recorded.
TEST(RunLayout, PipelineParallelismSplitsTheWorldIntoPpTimesDp) {
  RunConfig c = gpt();
  c.dist.pp = 2;
  c.dist.pp_schedule = "gpipe";
  const parallel::Layout l = run_layout(c, 4);
  EXPECT_EQ(l.pp, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.schedule, parallel::PipelineSchedule::gpipe);
  c.dist.pp_schedule = "1f1b";
  EXPECT_EQ(run_layout(c, 4).schedule, parallel::PipelineSchedule::one_f_one_b);
}

// dist.tp > 1 is a layout: tp x dp ranks, the micro-batch split over dp only, sequence
// parallelism recorded; what it does not support yet is refused by name.
TEST(RunLayout, TensorParallelismSplitsTheWorldIntoTpTimesDp) {
  RunConfig c = gpt();
  c.dist.tp = 2;
  c.dist.sequence_parallel = true;
  const parallel::Layout l = run_layout(c, 4);
  EXPECT_EQ(l.tp, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_TRUE(l.sequence_parallel);
  EXPECT_EQ(l.micro_batch, c.train.batch_size / 2);
  EXPECT_NE(l.describe().find("tp 2 (+sp)"), std::string::npos) << l.describe();
  c.dist.zero_stage = 1;
  c.dist.offload_optimizer = true;
  EXPECT_NE(error_of(c, 4).find("dist.offload_optimizer = true with dist.tp = 2 is not supported yet"),
            std::string::npos)
      << error_of(c, 4);
}

}  // namespace
}  // namespace forge::train
