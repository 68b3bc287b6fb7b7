#pragma once
// Training rows of conversations (data.format = "chat").
//
// Note [chat shards]: a chat corpus file is encoded into two token shards of equal length
// (shards.h's FRGTOK format, so writing, reading and checking are the text corpora's): the
// conversations' tokens back to back (shard_NNNNN.bin), and a flag per token (shard_NNNNN.flags.bin,
// values 0..3 in a shard of vocabulary 4): kChatTrained when the token is a trained target (Note
// [chat masks], chat_encoding.h), kChatStart on each conversation's first token. A parallel shard
// rather than bits folded into the ids: the token shard stays an ordinary one (forge tokenize,
// another tool, the vocabulary check read it as it is), and the flags cost 2 bytes a token, little
// next to what fine-tuning corpora weigh. Conversations are cut to train.seq_len + 1 tokens when
// they are written, so a shard holds what is trained (run/run_chat_data.h reports the cuts).
//
// Note [chat rows]: conversations are packed whole into rows of T = train.seq_len positions, in
// the order of the files, a conversation that does not fit in what is left of a row starting the
// next one: a conversation of n tokens takes n - 1 positions (inputs c_0..c_{n-2}, targets
// c_1..c_{n-1}: its last token is never an input). Each row is marked as data.packing = "documents"
// marks windows (Note [packed documents]): a conversation is a document (attention stays in it, its
// positions start at 0), so the model sees each conversation as if alone. The targets of untrained
// tokens (prompts, under train_on = "assistant") and of the row's padding are -100; padding inputs
// are token 0, in a document of their own. The rows are fixed once built; which rows a batch takes:
//   random      (data.order = "random") a row per batch row, drawn with replacement by Philox
//               from the run's seed as RandomWindowSampler draws windows (Note [Data RNG]);
//   sequential  (data.order = "sequential") every row in order, the partial batch at the end
//               dropped, epoch after epoch;
//   evaluation  every row in order once, the last batch possibly shorter.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "forge/core/generator.h"
#include "forge/data/loader.h"
#include "forge/data/shards.h"

namespace forge::data {

inline constexpr int32_t kChatTrained = 1, kChatStart = 2;
inline constexpr int64_t kChatFlagsVocab = 4;

// Where the flags of the token shard `path` live: "<stem>.flags.bin" beside it.
std::string chat_flags_path(const std::string& path);

// One conversation: tokens [begin, end) of a token shard and its flags shard.
struct ChatSpan {
  std::shared_ptr<const TokenShard> tokens, flags;
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// The conversations of a shard pair, in order; throws naming the shards when their lengths differ,
// a flag is outside 0..3, or the first token does not start a conversation.
std::vector<ChatSpan> chat_conversations(std::shared_ptr<const TokenShard> tokens,
                                         std::shared_ptr<const TokenShard> flags);

struct ChatSplit {
  std::vector<ChatSpan> train, val;
};
// Of each shard's n conversations, the last floor(n * val_fraction) validate, the rest train.
ChatSplit split_chat(const std::vector<std::vector<ChatSpan>>& per_shard, double val_fraction);

class ChatRows : public BatchSource {
 public:
  enum class Order { random, sequential, evaluation };
  // `conversations` each at most seq_len + 1 tokens (and at least 2).
  ChatRows(const std::vector<ChatSpan>& conversations, int64_t batch_size, int64_t seq_len, Order order,
           uint64_t seed = 0);
  std::optional<Batch> next() override;
  SamplerState state() const override;
  void set_state(const SamplerState& state) override;
  void reset() { position_ = 0; }
  int64_t num_rows() const { return static_cast<int64_t>(row_begin_.size()) - 1; }
  int64_t trained_targets() const { return trained_; }  // over all rows

 private:
  void fill_row(int64_t r, int64_t b, int64_t* x, int64_t* y, int32_t* d, int64_t* p) const;

  std::vector<ChatSpan> conversations_;
  std::vector<int64_t> row_begin_;  // row r = conversations [row_begin_[r], row_begin_[r + 1]); R + 1 entries
  int64_t batch_size_, seq_len_;
  Order order_;
  Generator gen_;
  int64_t position_ = 0;  // random: batches drawn; sequential: batches since the first; evaluation: next row
  int64_t trained_ = 0;
};

}  // namespace forge::data
