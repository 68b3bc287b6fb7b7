// Rows of packed conversations (Note [chat shards], Note [chat rows] in chat_rows.h).
#include "forge/data/chat_rows.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "forge/core/error.h"
#include "forge/core/philox.h"
#include "forge/ops/creation.h"

namespace forge::data {

std::string chat_flags_path(const std::string& path) {
  const size_t dot = path.rfind('.');
  const size_t slash = path.rfind('/');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  return (has_ext ? path.substr(0, dot) : path) + ".flags.bin";
}

std::vector<ChatSpan> chat_conversations(std::shared_ptr<const TokenShard> tokens,
                                         std::shared_ptr<const TokenShard> flags) {
  FORGE_CHECK(tokens && flags, "chat_conversations: no shard");
  FORGE_CHECK(tokens->size() == flags->size(), "chat shards: '", tokens->path(), "' holds ", tokens->size(),
              " tokens but its flags '", flags->path(), "' ", flags->size(),
              "; they are written together (Note [chat shards]): delete both and encode them again");
  std::vector<ChatSpan> out;
  const int64_t n = tokens->size();
  for (int64_t i = 0; i < n; ++i) {
    const int32_t f = (*flags)[i];
    FORGE_CHECK(f >= 0 && f < kChatFlagsVocab, "chat shards: flag ", f, " at token ", i, " of '", flags->path(),
                "' is not one of 0..3 (Note [chat shards])");
    if (f & kChatStart) {
      if (!out.empty()) out.back().end = i;
      out.push_back({tokens, flags, i, n});
    } else {
      FORGE_CHECK(!out.empty(), "chat shards: '", flags->path(), "' does not start with a conversation's first token");
    }
  }
  return out;
}

ChatSplit split_chat(const std::vector<std::vector<ChatSpan>>& per_shard, double val_fraction) {
  FORGE_CHECK(val_fraction >= 0 && val_fraction < 1, "split_chat: val_fraction must be in [0, 1), got ", val_fraction);
  ChatSplit s;
  for (const auto& convs : per_shard) {
    const auto n = static_cast<int64_t>(convs.size());
    const auto v = static_cast<int64_t>(std::floor(static_cast<double>(n) * val_fraction));
    s.train.insert(s.train.end(), convs.begin(), convs.end() - v);
    s.val.insert(s.val.end(), convs.end() - v, convs.end());
  }
  return s;
}

ChatRows::ChatRows(const std::vector<ChatSpan>& conversations, int64_t batch_size, int64_t seq_len, Order order,
                   uint64_t seed)
    : conversations_(conversations), batch_size_(batch_size), seq_len_(seq_len), order_(order), gen_(seed) {
  FORGE_CHECK(batch_size > 0 && seq_len > 0, "ChatRows: batch size and sequence length must be > 0, got ", batch_size,
              " and ", seq_len);
  int64_t used = seq_len;  // positions taken in the current row (a full row: none yet)
  for (size_t i = 0; i < conversations_.size(); ++i) {
    const ChatSpan& c = conversations_[i];
    FORGE_CHECK(c.size() >= 2 && c.size() <= seq_len + 1, "ChatRows: conversation ", i, " has ", c.size(),
                " tokens; rows of train.seq_len = ", seq_len, " take conversations of 2 to ", seq_len + 1,
                " (they are cut when encoded: Note [chat shards])");
    const int64_t need = c.size() - 1;
    if (used + need > seq_len) {
      row_begin_.push_back(static_cast<int64_t>(i));
      used = 0;
    }
    used += need;
    for (int64_t j = c.begin + 1; j < c.end; ++j) trained_ += ((*c.flags)[j] & kChatTrained) ? 1 : 0;
  }
  row_begin_.push_back(static_cast<int64_t>(conversations_.size()));
}

void ChatRows::fill_row(int64_t r, int64_t b, int64_t* x, int64_t* y, int32_t* d, int64_t* p) const {
  const int64_t T = seq_len_, o = b * T;
  int64_t t = 0;
  int32_t doc = 0;
  for (int64_t i = row_begin_[static_cast<size_t>(r)]; i < row_begin_[static_cast<size_t>(r) + 1]; ++i, ++doc) {
    const ChatSpan& c = conversations_[static_cast<size_t>(i)];
    for (int64_t j = c.begin; j + 1 < c.end; ++j, ++t) {
      x[o + t] = (*c.tokens)[j];
      y[o + t] = ((*c.flags)[j + 1] & kChatTrained) ? (*c.tokens)[j + 1] : -100;
      d[o + t] = doc;
      p[o + t] = j - c.begin;
    }
  }
  for (int64_t start = t; t < T; ++t) {  // padding: a document of its own, never a target
    x[o + t] = 0;
    y[o + t] = -100;
    d[o + t] = doc;
    p[o + t] = t - start;
  }
}

std::optional<Batch> ChatRows::next() {
  const int64_t R = num_rows();
  int64_t rows = batch_size_;
  if (order_ == Order::evaluation) rows = std::min(batch_size_, R - position_);
  if (rows <= 0 || R == 0) return std::nullopt;
  if (order_ == Order::sequential && R < batch_size_) return std::nullopt;
  Batch batch{empty({rows, seq_len_}, {.dtype = DType::i64}), empty({rows, seq_len_}, {.dtype = DType::i64}),
              empty({rows, seq_len_}, {.dtype = DType::i32}), empty({rows, seq_len_}, {.dtype = DType::i64})};
  int64_t* x = batch.inputs.data<int64_t>();
  int64_t* y = batch.targets.data<int64_t>();
  int32_t* d = batch.documents.data<int32_t>();
  int64_t* p = batch.positions.data<int64_t>();
  if (order_ == Order::random) {  // Note [Data RNG]: 2 words per row, as RandomWindowSampler
    const uint64_t block0 = gen_.reserve(2 * rows);
    Philox4 words{};
    for (int64_t b = 0; b < rows; ++b) {
      const auto word = static_cast<uint64_t>(2 * b);
      if (word % 4 == 0) words = philox4x32_10(gen_.seed(), block0 + word / 4);
      const uint64_t u = (static_cast<uint64_t>(words.v[word % 4 + 1]) << 32) | words.v[word % 4];
      fill_row(static_cast<int64_t>((static_cast<unsigned __int128>(u) * static_cast<uint64_t>(R)) >> 64), b, x, y, d,
               p);
    }
  } else if (order_ == Order::sequential) {
    const int64_t per_epoch = R / batch_size_;
    const int64_t first = (position_ % per_epoch) * batch_size_;
    for (int64_t b = 0; b < rows; ++b) fill_row(first + b, b, x, y, d, p);
  } else {
    for (int64_t b = 0; b < rows; ++b) fill_row(position_ + b, b, x, y, d, p);
  }
  position_ += order_ == Order::evaluation ? rows : 1;
  return batch;
}

SamplerState ChatRows::state() const {
  const int64_t per_epoch = order_ == Order::sequential ? std::max<int64_t>(1, num_rows() / batch_size_) : 1;
  return {.seed = gen_.seed(),
          .rng_offset = gen_.offset(),
          .position = position_,
          .epoch = order_ == Order::sequential ? position_ / per_epoch : 0};
}

void ChatRows::set_state(const SamplerState& s) {
  FORGE_CHECK(s.position >= 0, "ChatRows::set_state: position ", s.position, " is negative");
  gen_.set_state(s.seed, s.rng_offset);
  position_ = s.position;
}

}  // namespace forge::data
