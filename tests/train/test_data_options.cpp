// The data keys that let another trainer follow a forge run: data.val_files (validation data
// of their own) and data.order = "sequential" (every window in order, epoch after epoch), and
// their refusals.
#include <gtest/gtest.h>

#include <sstream>

#include "forge/data/shards.h"
#include "forge/telemetry/metrics.h"
#include "forge/run/config.h"
#include "forge/train/trainer.h"
#include "testing/tensor_testing.h"
#include "train_testing.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using forge::testing::error_of;
using train_testing::Scratch;

class DataOptions : public ::testing::Test {
 protected:
  void SetUp() override {
    train_testing::write_corpus(scratch.path() / "corpus");
    fs::create_directories(scratch.path() / "held_out");
    train_testing::write_text(scratch.path() / "held_out" / "val.txt", train_testing::synthetic_text(6000, 9));
  }
  RunConfig config(const std::string& name, int64_t steps, std::vector<std::string> overrides = {}) {
    overrides.push_back("--eval.every=0");
    return parse_config(train_testing::tiny_toml(scratch.path(), name, steps), name + ".toml", overrides);
  }
  TrainResult train(const RunConfig& c, TrainOptions o = {}) {
    std::ostringstream log;
    TrainResult r = run_training(c, o, log);
    last_log = log.str();
    return r;
  }
  std::string val_file() const { return (scratch.path() / "held_out" / "val.txt").string(); }
  Scratch scratch;
  std::string last_log;
};

TEST_F(DataOptions, ValFilesAreTheValidationAndDataFilesTrainWhole) {
  const TrainResult split = train(config("split", 3));  // data.val_fraction = 0.1 of each file
  const TrainResult held = train(config("held", 3, {"--data.val_files=" + val_file()}));
  EXPECT_NE(last_log.find("data: validation on data.val_files (1 shard(s)); data.files train whole"), std::string::npos)
      << last_log;
  // The training files whole: more training tokens than with the split, and the validation
  // tokens are the held-out file's (its own shard, beside the run's data directory).
  EXPECT_GT(held.train_tokens, split.train_tokens);
  const fs::path val_dir = fs::path(held.run_dir) / "data_val";
  ASSERT_TRUE(fs::is_regular_file(val_dir / "shard_00000.bin")) << val_dir;
  EXPECT_EQ(held.val_tokens, data::TokenShard((val_dir / "shard_00000.bin").string()).size());
  EXPECT_TRUE(std::isfinite(held.final_val_loss));
  // Every training record says how long its steps waited for data (data_wait_ms).
  int records = 0;
  for (const auto& j : telemetry::read_jsonl(fs::path(held.run_dir) / "metrics.jsonl")) {
    if (!j.contains("tokens_per_s") || j.contains("final")) continue;
    ++records;
    ASSERT_TRUE(j.contains("data_wait_ms")) << j.dump();
    EXPECT_GE(j["data_wait_ms"].get<double>(), 0.0);
    EXPECT_LE(j["data_wait_ms"].get<double>(), j["ms_per_step"].get<double>() + 1000.0) << j.dump();
  }
  EXPECT_GE(records, 1);
  EXPECT_NE(held.final_val_loss, split.final_val_loss);

  // Pre-encoded shards for both: the same validation loss as from the text.
  const fs::path train_shards = fs::path(held.run_dir) / "data";
  const TrainResult shards = train(config("shards", 3, {"--data.files=" + (train_shards / "shard_*.bin").string(),
                                                        "--data.val_files=" + (val_dir / "shard_*.bin").string(),
                                                        "--data.tokenizer=" + (fs::path(held.run_dir) / "tokenizer.json").string()}));
  EXPECT_EQ(shards.val_tokens, held.val_tokens);
  EXPECT_EQ(shards.final_val_loss, held.final_val_loss);
  EXPECT_EQ(shards.losses, held.losses);

  // Text for one, shards for the other: refused, naming both.
  const std::string e =
      error_of([&] { train(config("mixed", 3, {"--data.val_files=" + (val_dir / "shard_*.bin").string()})); });
  EXPECT_NE(e.find("data.val_files are token shards but data.files are text files"), std::string::npos) << e;
  // A missing file is named as data.val_files'.
  const std::string m = error_of([&] { config("missing", 3, {"--data.val_files=/nowhere/val.txt"}); });
  EXPECT_NE(m.find("data.val_files: '/nowhere/val.txt' does not exist; fix the path in data.val_files"),
            std::string::npos) << m;
}

TEST_F(DataOptions, SequentialOrderResumesBitIdenticallyAndDiffersFromRandom) {
  const std::vector<std::string> seq = {"--data.order=sequential", "--checkpoint.every=4", "--schedule.decay_steps=8"};
  const TrainResult full = train(config("seq_full", 8, seq));
  ASSERT_EQ(full.losses.size(), 8u);
  train(config("seq_split", 4, seq));
  const TrainResult resumed = train(config("seq_split", 8, seq), {.resume = true});
  ASSERT_EQ(resumed.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed.losses[i], full.losses[4 + i]) << "step " << 5 + i;
  const TrainResult random = train(config("rnd", 8, {"--checkpoint.every=4", "--schedule.decay_steps=8"}));
  EXPECT_NE(random.losses, full.losses);
  // The order does not depend on the run's length: a 1-step run's loss is the first step's.
  const TrainResult first = train(config("seq_first", 1, {"--data.order=sequential"}));
  EXPECT_EQ(first.losses.front(), full.losses.front());
}

TEST_F(DataOptions, MistakesAreRefusedNamingTheFix) {
  const std::string o = error_of([&] { config("o", 3, {"--data.order=sequentail"}); });
  EXPECT_NE(o.find("data.order = 'sequentail' is unknown"), std::string::npos) << o;
  EXPECT_NE(o.find("(did you mean \"sequential\"?)"), std::string::npos) << o;
  const std::string r = error_of([&] {
    config("r", 3, {"--data.source=random", "--model.vocab_size=300", "--data.val_files=" + val_file()});
  });
  EXPECT_NE(r.find("data.val_files is set with data.source = \"random\""), std::string::npos) << r;
  // Too little data for one sequential batch.
  const std::string t = error_of([&] { train(config("t", 3, {"--data.order=sequential", "--train.batch_size=4096"})); });
  EXPECT_NE(t.find("fewer than one micro-batch of 4096"), std::string::npos) << t;
}

}  // namespace
}  // namespace forge::train
