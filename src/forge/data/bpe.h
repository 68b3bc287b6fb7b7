#pragma once
// Byte-level byte-pair-encoding (BPE) tokenizer: training, encoding, decoding, save/load.
//
// Vocabulary layout (ids are int32):
//   0 .. 255                 the 256 single bytes (so any byte string is encodable: lossless
//                            on invalid UTF-8, NULs, anything);
//   256 .. 256 + M - 1       merge i (0-based) makes id 256 + i from the pair (left, right);
//                            its bytes are bytes(left) + bytes(right);
//   256 + M .. vocab - 1     the special tokens, in the order given (e.g. "<|endoftext|>").
//
// Training (`train`): the text is cut at special tokens, pre-tokenised with GPT-2's rules
// (pretokenize.h), and the unique pre-tokens counted; then, repeatedly, the most frequent
// adjacent pair inside words is merged everywhere, with the pair counts updated
// incrementally (only around the merge sites) and the best pair kept in a lazy max-heap.
// Ties are broken by the smaller (left, right) id pair, so training is deterministic (it
// depends neither on hash order nor on the order of files). Training stops early, with a
// smaller vocabulary, if no pair occurs min_frequency times.
//
// Encoding applies the merges to each pre-token in rank order (lowest merge id first,
// left to right within a rank), which reproduces exactly what training did to that word;
// pre-token -> ids results are cached per thread (Note [per-thread word cache]) so repeated
// words cost a hash lookup; encoding is safe from several threads at once.
// `encode` also recognises special-token strings in the text; `encode_ordinary` treats
// them as plain text. decode(encode(s)) == s for every byte string s.
//
// File format (`save`/`load`; save writes atomically like write_shard): JSON, one object:
//   {"format": "forge-bpe", "version": 1, "pretokenizer": "gpt2",
//    "vocab_size": V, "merges": [[left, right], ...],          // merge i -> id 256 + i
//    "special_tokens": [{"id": 4095, "content": "<|endoftext|>"}, ...]}
// Merges are stored as id pairs, so the file is valid JSON whatever bytes tokens hold.
// Special tokens must be non-empty valid UTF-8.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "forge/data/tokenizer.h"

namespace forge::data {

struct BpeTrainOptions {
  int64_t vocab_size = 4096;                // total: 256 bytes + merges + special tokens
  std::vector<std::string> special_tokens;  // e.g. {"<|endoftext|>"}
  int64_t min_frequency = 1;                // a pair must occur this often to be merged
  bool verbose = false;                     // print progress to stderr
  std::string text_key = "text";            // train_files: each .jsonl line's text (Note [documents])
};

class BpeTokenizer final : public Tokenizer {
 public:
  // The byte-level tokenizer with no merges and no special tokens (vocab 256).
  BpeTokenizer();
  // From merges (merge i makes id 256 + i) and special tokens (ids after the merges).
  BpeTokenizer(std::vector<std::pair<int32_t, int32_t>> merges, std::vector<std::string> special_tokens);
  BpeTokenizer(const BpeTokenizer& other);
  BpeTokenizer& operator=(const BpeTokenizer& other);
  BpeTokenizer(BpeTokenizer&&) noexcept;  // a moved-from tokenizer may only be assigned or destroyed
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  // Trains on one text or on the contents of files (each file is read whole, one at a
  // time, and is a separate text: no pre-token spans two files). Throws forge::Error when
  // vocab_size is below 256 + number of special tokens, or a file cannot be read.
  static BpeTokenizer train(std::string_view text, const BpeTrainOptions& opt);
  static BpeTokenizer train(std::string_view text, int64_t vocab_size, std::vector<std::string> special_tokens = {});
  static BpeTokenizer train_files(const std::vector<std::string>& paths, const BpeTrainOptions& opt);

  // Text -> ids. `encode` maps special-token strings to their ids; `encode_ordinary`
  // treats them as ordinary text.
  std::vector<int32_t> encode(std::string_view text) const override;
  std::vector<int32_t> encode_ordinary(std::string_view text) const;
  // Appends the ids of `text` (ordinary text only) to `out`.
  void encode_ordinary_into(std::string_view text, std::vector<int32_t>& out) const override;
  // Ids -> bytes. Throws forge::Error for an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids) const override;

  std::string kind() const override { return "forge-bpe"; }
  std::string describe() const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  int64_t num_merges() const { return static_cast<int64_t>(merges_.size()); }
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }
  std::vector<std::string> special_tokens() const override { return specials_; }
  std::optional<int32_t> token_id(std::string_view special) const override;
  // The id of a special token; throws forge::Error if `token` is not one.
  int32_t special_id(std::string_view token) const;
  // The bytes of one token.
  const std::string& token_bytes(int32_t id) const;

  void save(const std::string& path) const override;
  static BpeTokenizer load(const std::string& path);
  std::string to_json() const;
  std::string serialized() const override { return to_json(); }
  static BpeTokenizer from_json(std::string_view json, const std::string& origin = "<string>");

 private:
  struct Impl;
  void build();
  std::vector<int32_t> encode_word(std::string_view word) const;
  void encode_word_into(std::string_view word, std::vector<int32_t>& out) const;

  std::vector<std::pair<int32_t, int32_t>> merges_;
  std::vector<std::string> specials_;
  std::vector<std::string> tokens_;  // bytes of each id
  std::unique_ptr<Impl> impl_;       // merge-rank table and the encode cache
};

}  // namespace forge::data
