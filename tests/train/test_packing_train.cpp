// data.packing = "documents" end to end (Note [packed documents]): a corpus of many short
// documents trains with attention and positions restarting at every end-of-text token; the run
// says so, resumes bit-identically, and every layout (DDP, tensor + sequence parallel, pipeline,
// context parallel: ring and Ulysses) trains to the one-process losses of the same packed batches, as test_data_parallel.cpp and
// test_tensor_parallel_train.cpp hold the unpacked layouts. Refusals name the key and the fix.
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "forge/run/config.h"
#include "forge/train/strategy.h"
#include "forge/train/trainer.h"
#include "testing/cli_testing.h"
#include "testing/tensor_testing.h"
#include "train/dist_train_testing.h"
#include "train/train_testing.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
namespace dtt = forge::dist_train_testing;
using forge::testing::error_of;
using train_testing::Scratch;

constexpr auto npos = std::string::npos;

// A JSON Lines corpus of `n` short documents (one sentence to a few each) in `dir`/docs.jsonl.
fs::path write_documents(const fs::path& dir, int n, uint64_t seed) {
  fs::create_directories(dir);
  const fs::path p = dir / "docs.jsonl";
  std::ofstream out(p);
  for (int i = 0; i < n; ++i) {
    std::string text = train_testing::synthetic_text(30 + static_cast<size_t>((i * 37) % 120), seed + static_cast<uint64_t>(i));
    for (char& ch : text)
      if (ch == '\n') ch = ' ';
    out << "{\"text\": \"" << text << "\"}\n";
  }
  return p;
}

// Note [token weights on the device]: the weights a CUDA graph's replay computes from its batches'
// targets (device tensors) are the host's doubles rounded to the loss's dtype, bit for bit, and
// weighted() by them gives the host path's values, here for micro-batches of different counts, a
// micro-batch that counts nothing (w = 0: a 0, not a NaN) and two data-parallel ranks' halves.
TEST(TokenWeights, TheDevicesWeightsAreTheHostsBitForBit) {
  Generator gen(9);
  auto targets = [&](int64_t rows, int64_t cols, double drop) {
    const std::vector<double> u = uniform({rows * cols}, 0, 1, {.dtype = DType::f64}, &gen).to_vector<double>();
    std::vector<int64_t> t(u.size());
    for (size_t i = 0; i < u.size(); ++i) t[i] = u[i] < drop ? -100 : static_cast<int64_t>(i % 7);
    return from_vector(t, {rows, cols});
  };
  std::vector<data::Batch> mbs(3);
  mbs[0].targets = targets(4, 16, 0.3);
  mbs[1].targets = targets(4, 16, 0.7);
  mbs[2].targets = full({4, 16}, -100.0, {.dtype = DType::i64});  // nothing counts
  const Tensor counted = strategy_detail::counted_targets(mbs);
  for (int64_t dp : {1, 2}) {
    const int64_t rows = 4 / dp;
    for (int64_t r = 0; r < dp; ++r) {
      const std::vector<double> host = strategy_detail::token_weights(mbs, r * rows, rows, dp);
      ASSERT_EQ(host.size(), 3u);
      for (size_t k = 0; k < 3; ++k) {
        const Tensor local = mbs[k].targets.narrow(0, r * rows, rows);
        const Tensor w = strategy_detail::device_token_weight(local, counted, 3, dp, DType::f32);
        EXPECT_EQ(w.item<float>(), static_cast<float>(host[k])) << "dp " << dp << " rank " << r << " micro-batch " << k;
        const Tensor loss = k == 2 ? full({}, std::numeric_limits<double>::quiet_NaN()) : full({}, 2.718281828);
        const float a = strategy_detail::weighted(loss, w).item<float>(), b = strategy_detail::weighted(loss, host[k]).item<float>();
        EXPECT_EQ(a, b) << k;
        if (k == 2) {
          EXPECT_EQ(a, 0.0f);
        }
      }
    }
  }
}

class PackingTrain : public ::testing::Test {
 protected:
  void SetUp() override { write_documents(scratch.path() / "corpus", 400, 3); }
  RunConfig config(const std::string& name, int64_t steps, std::vector<std::string> overrides = {}) {
    overrides.insert(overrides.begin(), "--data.packing=documents");
    return parse_config(train_testing::tiny_toml(scratch.path(), name, steps), name + ".toml", overrides);
  }
  TrainResult train(const RunConfig& c, TrainOptions o = {}) {
    std::ostringstream log;
    TrainResult r = run_training(c, o, log);
    last_log = log.str();
    return r;
  }
  Scratch scratch;
  std::string last_log;
};

TEST_F(PackingTrain, DocumentsTrainEvaluateAndResumeBitIdentically) {
  const std::vector<std::string> common = {"--checkpoint.every=6", "--schedule.decay_steps=12"};
  const TrainResult full = train(config("full", 12, common));
  EXPECT_NE(last_log.find("data: packed documents: attention and positions restart after each \"<|endoftext|>\""), npos)
      << last_log;
  ASSERT_EQ(full.losses.size(), 12u);
  for (double l : full.losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(full.losses.back(), full.losses.front());
  EXPECT_TRUE(std::isfinite(full.final_val_loss));

  // The same windows unpacked train to other losses from the first step on: the documents change
  // what every token attends to (and which targets count).
  const TrainResult plain = train(config("plain", 12, {"--data.packing=none", "--checkpoint.every=6",
                                                       "--schedule.decay_steps=12"}));
  EXPECT_NE(plain.losses.front(), full.losses.front());
  EXPECT_NE(plain.final_val_loss, full.final_val_loss);

  // Stopped at 6 and resumed: bit for bit the uninterrupted run.
  train(config("split", 6, common));
  const TrainResult resumed = train(config("split", 12, common), {.resume = true});
  ASSERT_EQ(resumed.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(resumed.losses[i], full.losses[6 + i]) << "step " << 7 + i;
  EXPECT_EQ(resumed.final_val_loss, full.final_val_loss);
}

TEST_F(PackingTrain, RefusalsNameTheKeyAndTheFix) {
  std::string e = error_of([&] { config("bad", 2, {"--data.packing=docs"}); });
  EXPECT_NE(e.find("data.packing = 'docs' is unknown; use \"none\" or \"documents\""), npos) << e;
  e = error_of([&] { config("bad", 2, {"--data.source=random", "--model.vocab_size=256"}); });
  EXPECT_NE(e.find("random tokens have no documents"), npos) << e;
  e = error_of([&] { config("bad", 2, {"--data.eos_token="}); });
  EXPECT_NE(e.find("set data.eos_token (e.g. \"auto\") or data.packing = \"none\""), npos) << e;
}

// ---- Layouts on CPU ranks (mpirun), against one process -----------------------------------------

const dtt::Runs runs{"forge_packing_"};

class PackingLayouts : public forge::testing::ForgeCliTest {
 protected:
  static void SetUpTestSuite() {
    root_ = runs.test_root();
    corpus_ = write_documents(root_ / "corpus", 600, 11).parent_path();
  }
  static void TearDownTestSuite() { dtt::remove_scratch(runs, root_); }
  void SetUp() override {
    ForgeCliTest::SetUp();
    ASSERT_EQ(dtt::shell("command -v mpirun").status, 0) << "mpirun is missing: run scripts/install-deps.sh (openmpi-bin)";
  }
  // base_args on the document corpus (a 260-token BPE trained on it: the vocabulary divides by tp),
  // packed, 4 heads; "llama": n_kv_head 2.
  static std::vector<std::string> args(const std::string& name, const std::string& model) {
    auto a = dtt::base_args(root_, name, 12);
    dtt::set_arg(a, "data.source", "files");
    dtt::set_arg(a, "data.files", corpus_.string());
    dtt::set_arg(a, "data.vocab_size", "260");
    dtt::set_arg(a, "data.val_fraction", "0");
    dtt::set_arg(a, "model.vocab_size", "0");
    dtt::set_arg(a, "data.packing", "documents");
    dtt::set_arg(a, "model.n_head", "4");
    if (model == "llama") {
      dtt::set_arg(a, "model.type", "llama");
      dtt::set_arg(a, "model.dim", "32");
      dtt::set_arg(a, "model.n_kv_head", "2");
    }
    return a;
  }
  static fs::path reference(const std::string& model) {
    const std::string name = "ref_" + model;
    if (!fs::exists(root_ / name / "metrics.jsonl")) {
      const dtt::ShellRun r = runs.run_single(args(name, model));
      EXPECT_EQ(r.status, 0) << "the one-process reference failed: " << r.out;
      EXPECT_NE(r.out.find("data: packed documents"), npos) << r.out;
    }
    return root_ / name;
  }
  static fs::path root_, corpus_;
};
fs::path PackingLayouts::root_, PackingLayouts::corpus_;

TEST_F(PackingLayouts, DdpTensorPipelineAndContextParallelMatchOneProcess) {
  struct Case {
    const char* name;
    const char* model;
    int world;
    std::vector<std::pair<std::string, std::string>> keys;
  };
  const std::vector<Case> cases{
      {"gpt_ddp2", "gpt", 2, {}},
      {"llama_tp2_sp", "llama", 2, {{"dist.tp", "2"}, {"dist.sequence_parallel", "true"}}},
      {"gpt_pp2", "gpt", 2, {{"dist.pp", "2"}, {"train.grad_accum", "4"}}},
      // Context parallelism: documents across the ranks' chunks (Note [context-parallel documents]).
      {"gpt_cp2_ring", "gpt", 2, {{"dist.cp", "2"}}},
      {"llama_cp2_ulysses", "llama", 2, {{"dist.cp", "2"}, {"dist.cp_kind", "ulysses"}}},
      {"llama_cp2_ring_dp2", "llama", 4, {{"dist.cp", "2"}}},
  };
  for (const Case& c : cases) {
    const fs::path single = reference(c.model);
    auto a = args(c.name, c.model);
    for (const auto& [k, v] : c.keys) dtt::set_arg(a, k, v);
    const dtt::ShellRun r = runs.run_mpi(c.world, a);
    ASSERT_EQ(r.status, 0) << c.name << ": " << r.out;
    dtt::expect_same_run(root_ / c.name, single, 1, 1e-6, 1e-6, c.name);
  }
}

}  // namespace
}  // namespace forge::train
