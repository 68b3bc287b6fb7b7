// telemetry.profile_steps (Note [step trace], train/step_trace.h): a CPU run writes a Chrome trace
// of exactly the steps asked for, each step's data and phases inside its span in order, and the
// blocks' forward and backward ranges and the optimizer's inside it too; a bad
// range is refused with the key's name before any work.
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "forge/core/error.h"
#include "forge/telemetry/metrics.h"
#include "forge/run/config.h"
#include "forge/train/step_trace.h"
#include "forge/train/trainer.h"
#include "train_testing.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;

TEST(StepTrace, ACpuRunTracesTheStepsAskedFor) {
  train_testing::Scratch scratch;
  train_testing::write_corpus(scratch.path() / "corpus");
  const RunConfig c = parse_config(train_testing::tiny_toml(scratch.path(), "trace", 8), "t.toml",
                                   {"--telemetry.profile_steps=3:5", "--eval.every=0", "--train.grad_accum=2"});
  std::ostringstream log;
  const TrainResult r = run_training(c, {}, log);
  const fs::path f = fs::path(r.run_dir) / "trace.rank0.json";
  ASSERT_TRUE(fs::exists(f)) << log.str();
  EXPECT_NE(log.str().find("trace: " + f.string()), std::string::npos) << log.str();
  const auto j = nlohmann::json::parse(train_testing::read_text(f));
  std::map<int64_t, nlohmann::json> steps;                 // step -> its span
  std::map<int64_t, std::vector<nlohmann::json>> inside;   // step -> data and phases
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    EXPECT_EQ(e["pid"], 0);
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    const int64_t s = e["args"]["step"].get<int64_t>();
    if (e["name"].get<std::string>().rfind("step ", 0) == 0) steps[s] = e;
    else inside[s].push_back(e);
  }
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps.begin()->first, 3);
  EXPECT_EQ(steps.rbegin()->first, 5);
  for (const auto& [s, span] : steps) {
    std::vector<std::string> names;
    double at = span["ts"].get<double>();
    const double end = at + span["dur"].get<double>();
    std::map<std::string, int> ranges;  // core/trace_range.h: blocks' forward and backward, the optimizer
    for (const auto& e : inside[s]) {
      const std::string name = e["name"];
      if (name.rfind("forward: ", 0) == 0 || name.rfind("backward: ", 0) == 0 || name == "optimizer") {
        ++ranges[name];
        EXPECT_GE(e["ts"].get<double>(), span["ts"].get<double>() - 1e-6) << name;
        EXPECT_LE(e["ts"].get<double>() + e["dur"].get<double>(), end + 1e-6) << name;
        continue;
      }
      names.push_back(e["name"]);
      EXPECT_GE(e["ts"].get<double>(), at - 1e-6) << e["name"];  // in order, inside the step
      at = e["ts"].get<double>() + e["dur"].get<double>();
      EXPECT_LE(at, end + 1e-6) << e["name"];
    }
    EXPECT_EQ(names, (std::vector<std::string>{"data", "forward (last micro-batch)", "backward (last micro-batch)",
                                               "gradient reductions (wait)", "loss, norm and clip", "update"}))
        << "step " << s;
    // Two micro-batches through the tiny GPT's 2 blocks, forward and backward; one update.
    EXPECT_EQ(ranges, (std::map<std::string, int>{{"forward: block 0", 2}, {"forward: block 1", 2},
                                                  {"backward: block 0", 2}, {"backward: block 1", 2}, {"optimizer", 1}}))
        << "step " << s;
  }
  // A bad range names the key and the fix, before any work.
  for (const char* bad : {"5:3", "0:2", "x", "3"}) {
    try {
      parse_config(train_testing::tiny_toml(scratch.path(), "bad", 2), "t.toml", {std::string("--telemetry.profile_steps=") + bad});
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("telemetry.profile_steps"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace forge::train

namespace forge::train {
namespace {

// Instants (a gradient bucket's collective launched) and nested ranges go into the traced step
// only, and only while a step is traced (the thread's sink is removed at the end of the step).
TEST(StepTrace, InstantsAndRangesOfATracedStep) {
  train_testing::Scratch scratch;
  const fs::path out = scratch.path() / "t.json";
  StepTrace t(Device::cpu(), "2:2", out, 0);
  t.begin_step(1);  // not traced
  EXPECT_EQ(trace::sink(), nullptr);
  trace::instant("all-reduce bucket 9");
  t.end_step();
  t.begin_step(2);
  EXPECT_EQ(trace::sink(), &t);
  {
    trace::Range outer("forward: block 0");
    trace::instant("all-reduce bucket 0");
    trace::Range inner("optimizer");
  }
  t.end_step();
  EXPECT_EQ(trace::sink(), nullptr);
  ASSERT_EQ(t.write(), out.string());
  const auto j = nlohmann::json::parse(train_testing::read_text(out));
  std::map<std::string, std::string> kinds;
  for (const auto& e : j["traceEvents"]) kinds[e["name"]] = e["ph"];
  EXPECT_EQ(kinds["all-reduce bucket 0"], "i");
  EXPECT_EQ(kinds["forward: block 0"], "X");
  EXPECT_EQ(kinds["optimizer"], "X");
  EXPECT_EQ(kinds.count("all-reduce bucket 9"), 0u);
}

}  // namespace
}  // namespace forge::train
