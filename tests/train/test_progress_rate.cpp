// Issue 19, item 7: the progress line's (and metrics.jsonl's) tokens/s of the last step must be
// a true rate. A run was once seen reporting "8.08M tok/s" at its final step on this kind of
// machine; the run shapes that change how the last interval is timed (an evaluation at or just
// before the end, a checkpoint just before it, gradient accumulation, a resumed run) each end
// with a rate within a factor of the run's others. (The factor is loose, and the batch is 48
// sequences so that a step takes tens of milliseconds: with the tiny model's 4 ms steps, a
// scheduler's pause on a loaded 2-core CI machine put a single-step interval 10x below the
// median. The reported fault was hundreds of times too high.)
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "forge/telemetry/metrics.h"
#include "forge/run/config.h"
#include "forge/train/trainer.h"
#include "train_testing.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;

// (step, tokens_per_s) of every training record.
std::vector<std::pair<int64_t, double>> rates(const fs::path& run_dir) {
  std::vector<std::pair<int64_t, double>> out;
  for (const auto& j : telemetry::read_jsonl(run_dir / "metrics.jsonl"))
    if (j.contains("tokens_per_s")) out.emplace_back(j["step"].get<int64_t>(), j["tokens_per_s"].get<double>());
  return out;
}

void expect_last_rate_true(const std::vector<std::pair<int64_t, double>>& r, int64_t last_step, const std::string& what) {
  ASSERT_GE(r.size(), 3u) << what;
  EXPECT_EQ(r.back().first, last_step) << what;
  std::vector<double> others;
  for (size_t i = 1; i + 1 < r.size(); ++i) others.push_back(r[i].second);  // not the first (warm-up) nor the last
  std::sort(others.begin(), others.end());
  const double median = others[others.size() / 2], last = r.back().second;
  EXPECT_GT(last, 0) << what;
  EXPECT_LT(last, 10 * median) << what << ": the last step's " << last << " tok/s against a median of " << median;
  EXPECT_GT(last, median / 10) << what << ": the last step's " << last << " tok/s against a median of " << median;
}

TEST(ProgressRate, TheLastStepReportsATrueRate) {
  train_testing::Scratch scratch;
  train_testing::write_corpus(scratch.path() / "corpus");
  const std::vector<std::pair<std::string, std::vector<std::string>>> shapes = {
      {"plain", {"--eval.every=0"}},
      {"eval_at_end", {"--eval.every=13"}},
      {"eval_before_end", {"--eval.every=6"}},
      {"checkpoint_before_end", {"--eval.every=0", "--checkpoint.every=12"}},
      {"grad_accum", {"--eval.every=0", "--train.grad_accum=2"}},
  };
  for (const auto& [name, extra] : shapes) {
    std::vector<std::string> o = {"--train.log_every=2", "--train.batch_size=48"};
    o.insert(o.end(), extra.begin(), extra.end());
    const RunConfig c = parse_config(train_testing::tiny_toml(scratch.path(), name, 13), name + ".toml", o);
    std::ostringstream log;
    const TrainResult res = run_training(c, {}, log);
    expect_last_rate_true(rates(res.run_dir), 13, name);
  }
  // A resumed run: 6 steps with a checkpoint, then on to 13.
  const std::vector<std::string> o = {"--train.log_every=2", "--train.batch_size=48", "--eval.every=0",
                                      "--checkpoint.every=6"};
  std::ostringstream log;
  run_training(parse_config(train_testing::tiny_toml(scratch.path(), "resumed", 6), "r.toml", o), {}, log);
  TrainOptions resume;
  resume.resume = true;
  const TrainResult res =
      run_training(parse_config(train_testing::tiny_toml(scratch.path(), "resumed", 13), "r.toml", o), resume, log);
  expect_last_rate_true(rates(res.run_dir), 13, "resumed");
}

}  // namespace
}  // namespace forge::train
