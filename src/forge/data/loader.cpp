// Token windows (random and sequential), train/val splits, sampler state and the
// prefetching DataLoader (contracts in loader.h).
#include "forge/data/loader.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/core/philox.h"
#include "forge/ops/creation.h"

namespace forge::data {

// ---- state -----------------------------------------------------------------------------

std::string SamplerState::to_json() const {
  nlohmann::json j;
  j["seed"] = seed;
  j["rng_offset"] = rng_offset;
  j["position"] = position;
  j["epoch"] = epoch;
  return j.dump();
}

SamplerState SamplerState::from_json(std::string_view json) {
  try {
    const auto j = nlohmann::json::parse(json);
    SamplerState s;
    s.seed = j.at("seed").get<uint64_t>();
    s.rng_offset = j.at("rng_offset").get<uint64_t>();
    s.position = j.at("position").get<int64_t>();
    s.epoch = j.at("epoch").get<int64_t>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    FORGE_THROW("SamplerState::from_json: expected {\"seed\", \"rng_offset\", \"position\", \"epoch\"}: ", e.what());
  }
}

// ---- ranges ----------------------------------------------------------------------------

std::vector<std::shared_ptr<const TokenShard>> open_shards(const std::vector<std::string>& paths) {
  std::vector<std::shared_ptr<const TokenShard>> out;
  out.reserve(paths.size());
  for (const auto& p : paths) out.push_back(std::make_shared<const TokenShard>(p));
  return out;
}

std::vector<TokenRange> whole_shards(const std::vector<std::shared_ptr<const TokenShard>>& shards) {
  std::vector<TokenRange> out;
  for (const auto& s : shards) out.push_back({s, 0, s->size()});
  return out;
}

TrainValRanges split_train_val(const std::vector<std::shared_ptr<const TokenShard>>& shards, double val_fraction) {
  FORGE_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "split_train_val: val_fraction ", val_fraction,
              " must be in [0, 1)");
  TrainValRanges out;
  for (const auto& s : shards) {
    const int64_t n = s->size();
    const auto v = static_cast<int64_t>(static_cast<double>(n) * val_fraction);
    out.train.push_back({s, 0, n - v});
    out.val.push_back({s, n - v, n});
  }
  return out;
}

namespace {

void check_ranges(const std::vector<TokenRange>& ranges, int64_t batch_size, int64_t seq_len, const char* who) {
  FORGE_CHECK(batch_size >= 1, who, ": batch_size ", batch_size, " must be >= 1");
  FORGE_CHECK(seq_len >= 1, who, ": seq_len ", seq_len, " must be >= 1");
  for (const auto& r : ranges) {
    FORGE_CHECK(r.shard != nullptr, who, ": a token range has no shard");
    FORGE_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= r.shard->size(), who, ": range [", r.begin, ", ", r.end,
                ") is outside shard '", r.shard->path(), "' of ", r.shard->size(), " tokens");
  }
}

std::string describe(const std::vector<TokenRange>& ranges) {
  int64_t total = 0, longest = 0;
  for (const auto& r : ranges) {
    total += r.size();
    longest = std::max(longest, r.size());
  }
  return forge::detail::concat(ranges.size(), " range(s), ", total, " tokens, the longest ", longest);
}

// The range holding window `w` given cumulative counts, and w's index inside it.
std::pair<size_t, int64_t> locate(const std::vector<int64_t>& cum, int64_t w) {
  const auto it = std::upper_bound(cum.begin(), cum.end(), w);
  const auto i = static_cast<size_t>(it - cum.begin()) - 1;
  return {i, w - cum[i]};
}

}  // namespace

void fill_window(const TokenRange& range, int64_t start, int64_t seq_len, Tensor& inputs, Tensor& targets, int64_t row) {
  thread_local std::vector<int32_t> buf;
  buf.resize(static_cast<size_t>(seq_len + 1));
  range.shard->copy(start, seq_len + 1, buf.data());
  int64_t* in = inputs.data<int64_t>() + row * seq_len;
  int64_t* tg = targets.data<int64_t>() + row * seq_len;
  for (int64_t t = 0; t < seq_len; ++t) {
    in[t] = buf[static_cast<size_t>(t)];
    tg[t] = buf[static_cast<size_t>(t + 1)];
  }
}

// ---- random windows --------------------------------------------------------------------

RandomWindowSampler::RandomWindowSampler(std::vector<TokenRange> ranges, int64_t batch_size, int64_t seq_len,
                                         uint64_t seed)
    : ranges_(std::move(ranges)), batch_size_(batch_size), seq_len_(seq_len), gen_(seed) {
  check_ranges(ranges_, batch_size, seq_len, "RandomWindowSampler");
  for (const auto& r : ranges_) {
    cum_starts_.push_back(total_starts_);
    total_starts_ += std::max<int64_t>(0, r.size() - seq_len);  // starts s with s + T + 1 <= end
  }
  FORGE_CHECK(total_starts_ > 0, "RandomWindowSampler: no range holds a window of seq_len + 1 = ", seq_len + 1,
              " tokens (", describe(ranges_), "); use shorter sequences or more data");
}

Batch RandomWindowSampler::sample() {
  Batch b{empty({batch_size_, seq_len_}, {.dtype = DType::i64}), empty({batch_size_, seq_len_}, {.dtype = DType::i64})};
  const uint64_t block0 = gen_.reserve(2 * batch_size_);  // Note [Data RNG]: 2 words per row
  const uint64_t seed = gen_.seed();
  Philox4 words{};
  for (int64_t row = 0; row < batch_size_; ++row) {
    const auto word = static_cast<uint64_t>(2 * row);
    if (word % 4 == 0) words = philox4x32_10(seed, block0 + word / 4);
    const uint32_t lo = words.v[word % 4], hi = words.v[word % 4 + 1];
    const uint64_t u = (static_cast<uint64_t>(hi) << 32) | lo;
    const auto w = static_cast<int64_t>((static_cast<unsigned __int128>(u) * static_cast<uint64_t>(total_starts_)) >> 64);
    const auto [r, k] = locate(cum_starts_, w);
    fill_window(ranges_[r], ranges_[r].begin + k, seq_len_, b.inputs, b.targets, row);
  }
  ++batches_drawn_;
  return b;
}

SamplerState RandomWindowSampler::state() const {
  return {.seed = gen_.seed(), .rng_offset = gen_.offset(), .position = batches_drawn_, .epoch = 0};
}

void RandomWindowSampler::set_state(const SamplerState& s) {
  gen_.set_state(s.seed, s.rng_offset);
  batches_drawn_ = s.position;
}

// ---- sequential windows ----------------------------------------------------------------

SequentialWindows::SequentialWindows(std::vector<TokenRange> ranges, int64_t batch_size, int64_t seq_len,
                                     bool drop_last)
    : ranges_(std::move(ranges)), batch_size_(batch_size), seq_len_(seq_len), drop_last_(drop_last) {
  check_ranges(ranges_, batch_size, seq_len, "SequentialWindows");
  for (const auto& r : ranges_) {
    cum_windows_.push_back(total_windows_);
    total_windows_ += r.size() > seq_len ? (r.size() - 1) / seq_len : 0;
  }
}

int64_t SequentialWindows::num_batches() const {
  return drop_last_ ? total_windows_ / batch_size_ : (total_windows_ + batch_size_ - 1) / batch_size_;
}

std::optional<Batch> SequentialWindows::next() {
  const int64_t rows = std::min(batch_size_, total_windows_ - position_);
  if (rows <= 0 || (drop_last_ && rows < batch_size_)) return std::nullopt;
  Batch b{empty({rows, seq_len_}, {.dtype = DType::i64}), empty({rows, seq_len_}, {.dtype = DType::i64})};
  for (int64_t row = 0; row < rows; ++row) {
    const auto [r, k] = locate(cum_windows_, position_ + row);
    fill_window(ranges_[r], ranges_[r].begin + k * seq_len_, seq_len_, b.inputs, b.targets, row);
  }
  position_ += rows;
  return b;
}

SamplerState SequentialWindows::state() const { return {.seed = 0, .rng_offset = 0, .position = position_, .epoch = 0}; }

void SequentialWindows::set_state(const SamplerState& s) {
  FORGE_CHECK(s.position >= 0 && s.position <= total_windows_, "SequentialWindows::set_state: position ", s.position,
              " is outside [0, ", total_windows_, "]");
  position_ = s.position;
}

// ---- sequential training windows ---------------------------------------------------------

SequentialTrainWindows::SequentialTrainWindows(std::vector<TokenRange> ranges, int64_t batch_size, int64_t seq_len)
    : windows_(std::move(ranges), batch_size, seq_len, /*drop_last=*/true),
      batch_size_(batch_size),
      batches_per_epoch_(windows_.num_batches()) {
  FORGE_CHECK(batches_per_epoch_ > 0, "data.order = \"sequential\": the training data hold ", windows_.num_windows(),
              " window(s) of train.seq_len + 1 = ", seq_len + 1, " tokens, fewer than one micro-batch of ", batch_size,
              "; add data or lower train.batch_size / train.seq_len");
}

std::optional<Batch> SequentialTrainWindows::next() {
  if (drawn_ % batches_per_epoch_ == 0) windows_.reset();  // an epoch's first batch
  std::optional<Batch> b = windows_.next();
  FORGE_CHECK(b.has_value(), "SequentialTrainWindows: no batch at position ", drawn_);  // (cannot happen)
  ++drawn_;
  return b;
}

SamplerState SequentialTrainWindows::state() const {
  return {.seed = 0, .rng_offset = 0, .position = drawn_, .epoch = drawn_ / batches_per_epoch_};
}

void SequentialTrainWindows::set_state(const SamplerState& s) {
  FORGE_CHECK(s.position >= 0, "SequentialTrainWindows::set_state: position ", s.position, " is negative");
  drawn_ = s.position;
  windows_.set_state({.seed = 0, .rng_offset = 0, .position = (drawn_ % batches_per_epoch_) * batch_size_, .epoch = 0});
}

// ---- the prefetching loader --------------------------------------------------------------

DataLoader::DataLoader(std::unique_ptr<BatchSource> source, int64_t prefetch) : source_(std::move(source)) {
  FORGE_CHECK(source_ != nullptr, "DataLoader: no batch source");
  FORGE_CHECK(prefetch >= 1, "DataLoader: prefetch ", prefetch, " must be >= 1");
  capacity_ = static_cast<size_t>(prefetch);
  state_ = source_->state();
  worker_ = std::thread([this, initial = state_] { run(initial); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void DataLoader::run(SamplerState last) {
  try {
    for (;;) {
      {  // wait for room before making the batch, so at most capacity_ are made ahead
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || queue_.size() < capacity_; });
        if (stop_) return;
      }
      Item item{source_->next(), {}, nullptr};
      item.state = last = source_->state();
      const bool end = !item.batch.has_value();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        queue_.push_back(std::move(item));
      }
      cv_.notify_all();
      if (end) return;
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({std::nullopt, last, std::current_exception()});
    }
    cv_.notify_all();
  }
}

std::optional<Batch> DataLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  if (finished_) {
    if (error_) std::rethrow_exception(error_);
    return std::nullopt;
  }
  cv_.wait(lock, [&] { return !queue_.empty(); });
  Item item = std::move(queue_.front());
  queue_.pop_front();
  lock.unlock();
  cv_.notify_all();
  if (item.error) {
    finished_ = true;
    error_ = item.error;
    std::rethrow_exception(error_);
  }
  state_ = item.state;
  if (!item.batch) finished_ = true;
  return std::move(item.batch);
}

}  // namespace forge::data
