// Token-window samplers and the DataLoader: shapes and contents of windows, seed
// reproducibility, save/restore of state, disjoint train/val splits, sequential coverage,
// and the loader's equivalence to its source, shutdown and error propagation.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "data/data_testing.h"
#include "forge/forge.h"
#include "testing/tensor_testing.h"

namespace forge::data {
namespace {

using forge::testing::error_of;
using forge::testing::TempDir;

// A shard whose token i is `offset + i`: every token tells where it came from.
std::shared_ptr<const TokenShard> position_shard(const TempDir& dir, const std::string& name, int64_t n,
                                                 int32_t offset = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = offset + static_cast<int32_t>(i);
  write_shard(dir.file(name), t, 65536);
  return std::make_shared<const TokenShard>(dir.file(name));
}

std::vector<int64_t> ints(const Tensor& t) { return t.to_vector<int64_t>(); }

void expect_same(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.inputs.shape(), b.inputs.shape());
  EXPECT_EQ(ints(a.inputs), ints(b.inputs));
  EXPECT_EQ(ints(a.targets), ints(b.targets));
}

TEST(TokenSampler, WindowsAreContiguousAndShifted) {
  TempDir dir;
  const auto shard = position_shard(dir, "s.bin", 5000);
  RandomWindowSampler sampler(whole_shards({shard}), 8, 32, 42);
  EXPECT_EQ(sampler.num_window_starts(), 5000 - 32);
  for (int k = 0; k < 20; ++k) {
    const Batch b = sampler.sample();
    ASSERT_EQ(b.inputs.shape(), (Shape{8, 32}));
    ASSERT_EQ(b.targets.shape(), (Shape{8, 32}));
    EXPECT_EQ(b.inputs.dtype(), DType::i64);
    EXPECT_EQ(b.targets.dtype(), DType::i64);
    const auto in = ints(b.inputs), tg = ints(b.targets);
    for (int r = 0; r < 8; ++r) {
      const int64_t start = in[r * 32];
      ASSERT_LE(start + 32, 4999);  // the target window ends inside the shard
      for (int t = 0; t < 32; ++t) {
        ASSERT_EQ(in[r * 32 + t], start + t);
        ASSERT_EQ(tg[r * 32 + t], start + t + 1);
      }
    }
  }
}

TEST(TokenSampler, SeedReproducibility) {
  TempDir dir;
  const auto ranges = whole_shards({position_shard(dir, "a", 3000), position_shard(dir, "b", 2000, 3000)});
  RandomWindowSampler a(ranges, 4, 16, 7), b(ranges, 4, 16, 7), c(ranges, 4, 16, 8);
  bool differs = false;
  for (int k = 0; k < 10; ++k) {
    const Batch x = a.sample(), y = b.sample(), z = c.sample();
    expect_same(x, y);
    differs |= ints(x.inputs) != ints(z.inputs);
  }
  EXPECT_TRUE(differs);
}

TEST(TokenSampler, SaveAndRestoreState) {
  TempDir dir;
  const auto ranges = whole_shards({position_shard(dir, "a", 4000)});
  RandomWindowSampler sampler(ranges, 3, 10, 99);
  for (int k = 0; k < 5; ++k) sampler.sample();
  const SamplerState saved = sampler.state();
  EXPECT_EQ(saved.position, 5);
  EXPECT_EQ(saved.seed, 99u);
  std::vector<Batch> expected;
  for (int k = 0; k < 6; ++k) expected.push_back(sampler.sample());
  // A fresh sampler (another seed even) restored from the JSON form of the state.
  RandomWindowSampler resumed(ranges, 3, 10, 12345);
  resumed.set_state(SamplerState::from_json(saved.to_json()));
  EXPECT_EQ(resumed.state(), saved);
  for (const auto& e : expected) expect_same(resumed.sample(), e);
  EXPECT_EQ(resumed.state(), sampler.state());
  EXPECT_NE(error_of([] { SamplerState::from_json("{\"seed\": 1}"); }).find("rng_offset"), std::string::npos);
}

TEST(TokenSampler, DrawsFromEveryShardInProportion) {
  TempDir dir;
  const auto ranges = whole_shards({position_shard(dir, "a", 1000), position_shard(dir, "b", 3000, 10000)});
  RandomWindowSampler sampler(ranges, 100, 8, 3);
  int64_t from_b = 0, total = 0;
  for (int k = 0; k < 40; ++k) {
    const auto in = ints(sampler.sample().inputs);
    for (int r = 0; r < 100; ++r) {
      const int64_t start = in[r * 8];
      const bool in_b = start >= 10000;
      ASSERT_LE(start + 8, in_b ? 10000 + 2999 : 999);  // never crosses a shard end
      from_b += in_b;
      ++total;
    }
  }
  const double frac = static_cast<double>(from_b) / static_cast<double>(total);  // expected 2992/3984 = 0.751
  EXPECT_GT(frac, 0.72);
  EXPECT_LT(frac, 0.78);
}

TEST(TokenSampler, TooShortDataErrors) {
  TempDir dir;
  const auto ranges = whole_shards({position_shard(dir, "a", 10)});
  const std::string msg = error_of([&] { RandomWindowSampler s(ranges, 2, 10, 0); });
  EXPECT_NE(msg.find("seq_len + 1 = 11"), std::string::npos) << msg;
  RandomWindowSampler ok(ranges, 2, 9, 0);  // exactly one window
  EXPECT_EQ(ints(ok.sample().inputs)[0], 0);
  EXPECT_NE(error_of([&] { RandomWindowSampler s(ranges, 0, 4, 0); }).find("batch_size 0"), std::string::npos);
}

TEST(TokenSampler, ValSplitDisjointFromTrain) {
  TempDir dir;
  const auto shards = std::vector{position_shard(dir, "a", 10000), position_shard(dir, "b", 5000, 20000)};
  const TrainValRanges split = split_train_val(shards, 0.1);
  ASSERT_EQ(split.train.size(), 2u);
  EXPECT_EQ(split.train[0].end, 9000);
  EXPECT_EQ(split.val[0].begin, 9000);
  EXPECT_EQ(split.val[0].end, 10000);
  EXPECT_EQ(split.train[1].end, 4500);
  EXPECT_EQ(split.val[1].begin, 4500);
  auto is_val_token = [](int64_t tok) { return (tok >= 9000 && tok < 10000) || tok >= 24500; };
  RandomWindowSampler train(split.train, 64, 50, 5);
  for (int k = 0; k < 50; ++k) {
    const Batch b = train.sample();
    for (int64_t t : ints(b.inputs)) ASSERT_FALSE(is_val_token(t)) << t;
    for (int64_t t : ints(b.targets)) ASSERT_FALSE(is_val_token(t)) << t;
  }
  SequentialWindows val(split.val, 7, 50);
  int64_t rows = 0;
  while (auto b = val.next()) {
    for (int64_t t : ints(b->inputs)) ASSERT_TRUE(is_val_token(t)) << t;
    for (int64_t t : ints(b->targets)) ASSERT_TRUE(is_val_token(t)) << t;
    rows += b->inputs.size(0);
  }
  EXPECT_EQ(rows, val.num_windows());
  EXPECT_NE(error_of([&] { split_train_val(shards, 1.0); }).find("val_fraction 1"), std::string::npos);
}

TEST(TokenSampler, SequentialCoversEveryTargetOnce) {
  TempDir dir;
  const auto ranges = whole_shards({position_shard(dir, "a", 1001), position_shard(dir, "b", 337, 5000)});
  SequentialWindows seq(ranges, 4, 50);
  EXPECT_EQ(seq.num_windows(), 20 + 6);  // (1001 - 1) / 50 and (337 - 1) / 50
  EXPECT_EQ(seq.num_batches(), 7);
  std::multiset<int64_t> targets;
  std::vector<int64_t> rows;
  while (auto b = seq.next()) {
    rows.push_back(b->inputs.size(0));
    for (int64_t t : ints(b->targets)) targets.insert(t);
  }
  EXPECT_EQ(rows, (std::vector<int64_t>{4, 4, 4, 4, 4, 4, 2}));
  for (int64_t t = 1; t <= 1000; ++t) ASSERT_EQ(targets.count(t), 1u) << t;
  for (int64_t t = 5001; t <= 5300; ++t) ASSERT_EQ(targets.count(t), 1u) << t;
  EXPECT_EQ(targets.size(), 1300u);
  EXPECT_FALSE(seq.next().has_value());
  // Deterministic, resettable and resumable.
  seq.reset();
  const Batch first = *seq.next();
  const SamplerState st = seq.state();
  const Batch second = *seq.next();
  SequentialWindows again(ranges, 4, 50);
  expect_same(*again.next(), first);
  SequentialWindows resumed(ranges, 4, 50);
  resumed.set_state(st);
  expect_same(*resumed.next(), second);
  SequentialWindows dropped(ranges, 4, 50, /*drop_last=*/true);
  int64_t n = 0;
  while (dropped.next()) ++n;
  EXPECT_EQ(n, 6);
}

// data.order = "sequential": the windows of SequentialWindows in order, full batches only, then
// again from the first; resumable at any batch, also across an epoch's end.
TEST(TokenSampler, SequentialTrainingWindowsGoRoundInOrder) {
  TempDir dir;
  const auto ranges = whole_shards({position_shard(dir, "a", 1001), position_shard(dir, "b", 337, 5000)});
  SequentialTrainWindows train(ranges, 4, 50);
  EXPECT_EQ(train.batches_per_epoch(), 6);  // 26 windows: the last 2 dropped
  SequentialWindows plain(ranges, 4, 50, /*drop_last=*/true);
  std::vector<Batch> epoch;
  while (auto b = plain.next()) epoch.push_back(*b);
  ASSERT_EQ(epoch.size(), 6u);
  std::vector<SamplerState> states;
  for (int64_t k = 0; k < 15; ++k) {  // two epochs and a half
    states.push_back(train.state());
    const Batch b = *train.next();
    expect_same(b, epoch[static_cast<size_t>(k % 6)]);
  }
  EXPECT_EQ(train.state().position, 15);
  EXPECT_EQ(train.state().epoch, 2);
  EXPECT_EQ(ints(epoch[0].inputs)[0], 0);  // the first window starts at the first token
  // Restored at any batch (the epoch's first, its last, the middle), the next batches are the same.
  for (int64_t at : {0, 5, 6, 9, 12}) {
    SequentialTrainWindows resumed(ranges, 4, 50);
    resumed.set_state(states[static_cast<size_t>(at)]);
    for (int64_t k = at; k < 15; ++k) expect_same(*resumed.next(), epoch[static_cast<size_t>(k % 6)]);
  }
  // Fewer windows than one batch: an error naming the fix.
  EXPECT_NE(error_of([&] { SequentialTrainWindows(ranges, 64, 50); }).find("fewer than one micro-batch of 64"),
            std::string::npos);
}

// A source that counts its batches and can fail or be slow on demand.
class ScriptedSource : public BatchSource {
 public:
  ScriptedSource(int64_t fail_at, int64_t end_at, std::chrono::milliseconds delay = {})
      : fail_at_(fail_at), end_at_(end_at), delay_(delay) {}
  std::optional<Batch> next() override {
    std::this_thread::sleep_for(delay_);
    if (n_ == fail_at_) throw Error("ScriptedSource: batch " + std::to_string(n_) + " failed");
    if (n_ == end_at_) return std::nullopt;
    Batch b{full({1}, static_cast<double>(n_), {.dtype = DType::i64}), full({1}, 0.0, {.dtype = DType::i64})};
    ++n_;
    return b;
  }
  SamplerState state() const override { return {.seed = 0, .rng_offset = 0, .position = n_, .epoch = 0}; }
  void set_state(const SamplerState& s) override { n_ = s.position; }

 private:
  int64_t n_ = 0, fail_at_, end_at_;
  std::chrono::milliseconds delay_;
};

TEST(DataLoader, YieldsTheSamplersBatches) {
  TempDir dir;
  const auto ranges = whole_shards({position_shard(dir, "a", 6000), position_shard(dir, "b", 900, 7000)});
  RandomWindowSampler reference(ranges, 5, 20, 2024);
  DataLoader loader(std::make_unique<RandomWindowSampler>(ranges, 5, 20, 2024), 3);
  for (int k = 0; k < 25; ++k) {
    const auto b = loader.next();
    ASSERT_TRUE(b.has_value());
    expect_same(*b, reference.sample());
    ASSERT_EQ(loader.state(), reference.state());  // not the worker's (prefetched) state
  }
  // Resume from the loader's state: the next batches are the ones the loader would give.
  const SamplerState saved = loader.state();
  auto restored = std::make_unique<RandomWindowSampler>(ranges, 5, 20, 1);
  restored->set_state(saved);
  DataLoader resumed(std::move(restored), 2);
  for (int k = 0; k < 10; ++k) expect_same(*resumed.next(), *loader.next());
}

TEST(DataLoader, PassesThroughTheEnd) {
  TempDir dir;
  const auto ranges = whole_shards({position_shard(dir, "a", 2000)});
  SequentialWindows reference(ranges, 8, 30);
  DataLoader loader(std::make_unique<SequentialWindows>(ranges, 8, 30), 4);
  int64_t n = 0;
  while (auto b = loader.next()) {
    expect_same(*b, *reference.next());
    ++n;
  }
  EXPECT_EQ(n, reference.num_batches());
  EXPECT_FALSE(loader.next().has_value());  // stays at the end
  EXPECT_EQ(loader.state().position, reference.num_windows());
}

TEST(DataLoader, SurvivesEarlyDestruction) {
  TempDir dir;
  const auto ranges = whole_shards({position_shard(dir, "a", 3000)});
  for (int i = 0; i < 20; ++i) {
    DataLoader loader(std::make_unique<RandomWindowSampler>(ranges, 4, 16, 1), 2);
    if (i % 2) loader.next();  // destroyed with a full queue, or before the first batch
  }
  {
    DataLoader slow(std::make_unique<ScriptedSource>(-1, -1, std::chrono::milliseconds(20)), 1);
    EXPECT_EQ(slow.next()->inputs.item<int64_t>(), 0);
  }  // destroyed while the worker sleeps inside next(): joins after that batch
  SUCCEED();
}

TEST(DataLoader, PropagatesErrors) {
  DataLoader loader(std::make_unique<ScriptedSource>(3, -1), 2);
  for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(loader.next()->inputs.item<int64_t>(), k);
  const std::string msg = error_of([&] { loader.next(); });
  EXPECT_NE(msg.find("batch 3 failed"), std::string::npos) << msg;
  EXPECT_EQ(error_of([&] { loader.next(); }), msg);  // and again, never a hang
  EXPECT_EQ(loader.state().position, 3);
  DataLoader immediately(std::make_unique<ScriptedSource>(0, -1), 2);
  EXPECT_THROW(immediately.next(), Error);
  DataLoader ends(std::make_unique<ScriptedSource>(-1, 2), 8);
  EXPECT_TRUE(ends.next().has_value());
  EXPECT_TRUE(ends.next().has_value());
  EXPECT_FALSE(ends.next().has_value());
  EXPECT_NE(error_of([] { DataLoader l(nullptr); }).find("no batch source"), std::string::npos);
}

}  // namespace
}  // namespace forge::data
