#pragma once
// Batches for training and evaluation: random token windows, sequential evaluation
// windows, train/val splits of token shards, resumable sampler state, and a DataLoader
// that prefetches batches on a background thread.
//
// Language-model batches: a window of T + 1 consecutive tokens w[0..T] gives one row,
// inputs = w[0..T-1] and targets = w[1..T]; B rows make a Batch of two (B, T) i64 CPU
// tensors. A window never crosses the end of a token range (shards are independent
// streams; a range is a shard or a part of one).
//
// Randomness (Note [Data RNG]): RandomWindowSampler draws from a forge::Generator
// (Philox4x32-10, core/philox.h). Batch k reserves 2·B 32-bit words of the stream; row b
// takes words 2b (low half) and 2b+1 (high half) as a 64-bit number u and picks window
// floor(u · W / 2^64) out of the W valid window starts of all ranges together (every start
// equally likely, up to a bias below W / 2^64). So (seed, offset) fixes every later batch:
// SamplerState records them, and a sampler restored from a saved state draws exactly the
// batches the original would have drawn next, on any machine.
//
// Train/val split: split_train_val gives each shard's last `val_fraction` of tokens to
// validation and the rest to training (disjoint token ranges, so no window of one split
// can read a token of the other); separate validation shards are simply other ranges.
//
// DataLoader: one worker thread calls source.next() ahead of the consumer into a bounded
// queue (`prefetch` batches). The destructor stops and joins the worker (it waits for at
// most the batch being made); an exception thrown by the source is re-thrown by the
// consumer's next(), after the batches made before it; the end of the source (nullopt)
// is passed through. state() is the source state right after the last batch next()
// returned, so it is what a checkpoint stores to resume exactly (prefetched but unused
// batches are not lost: they are drawn again after the restore).
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "forge/core/generator.h"
#include "forge/core/tensor.h"
#include "forge/data/shards.h"

namespace forge::data {

struct Batch {
  Tensor inputs;   // (B, T) i64 tokens, or (B, C, H, W) f32 images
  Tensor targets;  // (B, T) i64 next tokens, or (B) i64 labels
  // Rows that pack documents (data.packing = "documents": data/packing.h): each token's document
  // within its row (B, T) i32, and its position in that document (B, T) i64; else undefined.
  Tensor documents = {}, positions = {};

  // The batch with f applied to each defined tensor (rows cut, moved to a device, ...).
  template <class F> Batch map(F&& f) const {
    auto g = [&](const Tensor& t) { return t.defined() ? f(t) : t; };
    return {g(inputs), g(targets), g(documents), g(positions)};
  }
};

// Where a batch source stands; enough to resume it exactly.
struct SamplerState {
  uint64_t seed = 0;        // generator seed
  uint64_t rng_offset = 0;  // generator offset (Philox blocks), see Note [Data RNG]
  int64_t position = 0;     // batches drawn (random), next window (sequential), next sample (images)
  int64_t epoch = 0;        // epochs completed (image batches)
  bool operator==(const SamplerState&) const = default;
  // {"seed": ..., "rng_offset": ..., "position": ..., "epoch": ...}
  std::string to_json() const;
  static SamplerState from_json(std::string_view json);
};

// Anything that yields batches and can be saved and restored.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The next batch, or nullopt when the source is exhausted.
  virtual std::optional<Batch> next() = 0;
  virtual SamplerState state() const = 0;
  virtual void set_state(const SamplerState& state) = 0;
};

// Tokens [begin, end) of one shard.
struct TokenRange {
  std::shared_ptr<const TokenShard> shard;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

std::vector<std::shared_ptr<const TokenShard>> open_shards(const std::vector<std::string>& paths);
// Each shard whole.
std::vector<TokenRange> whole_shards(const std::vector<std::shared_ptr<const TokenShard>>& shards);

struct TrainValRanges {
  std::vector<TokenRange> train, val;
};
// Shard of n tokens: train [0, n - v), val [n - v, n) with v = floor(n · val_fraction).
// val_fraction must be in [0, 1).
TrainValRanges split_train_val(const std::vector<std::shared_ptr<const TokenShard>>& shards, double val_fraction);

// Fills row `row` of inputs/targets ((B, T) i64, contiguous) from tokens [start, start + T + 1) of `range`.
void fill_window(const TokenRange& range, int64_t start, int64_t seq_len, Tensor& inputs, Tensor& targets, int64_t row);

// Random windows (with replacement) from all ranges; endless (next() never returns nullopt).
class RandomWindowSampler : public BatchSource {
 public:
  RandomWindowSampler(std::vector<TokenRange> ranges, int64_t batch_size, int64_t seq_len, uint64_t seed);
  Batch sample();
  std::optional<Batch> next() override { return sample(); }
  SamplerState state() const override;
  void set_state(const SamplerState& state) override;
  int64_t num_window_starts() const { return total_starts_; }

 private:
  std::vector<TokenRange> ranges_;
  std::vector<int64_t> cum_starts_;  // cum_starts_[i] = window starts in ranges [0, i)
  int64_t total_starts_ = 0;
  int64_t batch_size_, seq_len_;
  int64_t batches_drawn_ = 0;
  Generator gen_;
};

// Every non-overlapping window, in order, for evaluation: in each range, windows start at
// begin, begin + T, begin + 2T, ... while T + 1 tokens remain, so each token after a
// range's first is a target exactly once. The last batch has fewer rows unless drop_last.
class SequentialWindows : public BatchSource {
 public:
  SequentialWindows(std::vector<TokenRange> ranges, int64_t batch_size, int64_t seq_len, bool drop_last = false);
  std::optional<Batch> next() override;
  SamplerState state() const override;
  void set_state(const SamplerState& state) override;
  void reset() { position_ = 0; }
  int64_t num_windows() const { return total_windows_; }
  int64_t num_batches() const;

 private:
  std::vector<TokenRange> ranges_;
  std::vector<int64_t> cum_windows_;
  int64_t total_windows_ = 0;
  int64_t batch_size_, seq_len_;
  bool drop_last_;
  int64_t position_ = 0;  // next window
};

// Training windows in order (a run's data.order = "sequential"): the windows of
// SequentialWindows, batch after batch, the partial batch at the end of the ranges dropped, then
// again from the first (the next epoch). The order is the same on every machine and layout (a
// data-parallel rank trains on its rows of each global micro-batch), so another trainer reading
// the same shards can follow it token for token: window k of the run is tokens
// [begin + j·T, begin + j·T + T] of the range holding window k % windows-per-epoch.
// State: position = batches drawn since the first, epoch = epochs completed.
class SequentialTrainWindows : public BatchSource {
 public:
  SequentialTrainWindows(std::vector<TokenRange> ranges, int64_t batch_size, int64_t seq_len);
  std::optional<Batch> next() override;
  SamplerState state() const override;
  void set_state(const SamplerState& state) override;
  int64_t batches_per_epoch() const { return batches_per_epoch_; }

 private:
  SequentialWindows windows_;
  int64_t batch_size_;
  int64_t batches_per_epoch_;
  int64_t drawn_ = 0;
};

class DataLoader {
 public:
  // Starts the worker; `prefetch` (>= 1) is the most batches made ahead of the consumer.
  explicit DataLoader(std::unique_ptr<BatchSource> source, int64_t prefetch = 4);
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;
  ~DataLoader();

  // The next batch (blocks until it is ready); nullopt once the source is exhausted;
  // re-throws an exception the source threw. Call from one thread.
  std::optional<Batch> next();
  // The source's state after the last batch next() returned.
  SamplerState state() const { return state_; }

 private:
  struct Item {
    std::optional<Batch> batch;
    SamplerState state;
    std::exception_ptr error;
  };
  void run(SamplerState last);

  std::unique_ptr<BatchSource> source_;
  size_t capacity_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  bool finished_ = false;            // the consumer has seen the end or an error
  std::exception_ptr error_;         // re-thrown by every next() after an error
  SamplerState state_;
  std::thread worker_;               // last: started once everything above exists
};

}  // namespace forge::data
