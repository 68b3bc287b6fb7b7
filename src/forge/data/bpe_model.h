#pragma once
// The BPE model of loaded tokenizers (Hugging Face BPE, tiktoken): a piece of text -> token ids
// by rank-ordered merges over token ids.
//
// A piece starts as symbols: its bytes (byte-level: GPT-2, LLaMA-3, Qwen, tiktoken) or its
// UTF-8 characters (sentencepiece-style: LLaMA-2), each the id of the token that spells it; a
// character that is no token becomes its bytes' <0xNN> tokens (byte fallback) or the unknown
// token. Then, repeatedly, the adjacent pair of lowest rank that a merge joins is replaced by
// the merge's result, leftmost first among equal ranks (a min-heap of (rank, position) over a
// linked list of symbols; entries made stale by an earlier merge are skipped). This is Hugging
// Face's BPE exactly, and tiktoken's too when a merge (x, y) -> t with rank(t) exists for every
// split of every token t into two tokens x + y (tiktoken merges the adjacent pair whose
// concatenation has the lowest rank): tiktoken.cpp builds those merges from the ranks.
// With `ignore_merges` (tiktoken; Hugging Face's "ignore_merges": LLaMA-3) a piece that is a
// token is that token, whatever the merges would make of it.
//
// Pieces of up to kMaxCachedWordBytes are cached per thread (Note [per-thread word cache] in
// bpe.cpp); encoding is safe from several threads at once.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace forge::data {

struct BpeMerge {
  int32_t left, right, result;  // token ids
  int32_t rank;                 // lower merges first
};

class BpeModel {
 public:
  enum class Symbols : uint8_t { bytes, chars };
  struct Options {
    Symbols symbols = Symbols::bytes;
    bool ignore_merges = false;  // a piece that is a token is that token
    bool byte_fallback = false;  // chars: a character that is no token -> its bytes' <0xNN> tokens
    int32_t unk_id = -1;         // otherwise this token (-1: none, an error)
    bool fuse_unk = false;       // consecutive unknown characters make one unknown token
  };

  // keys[id] is token id as it appears in the text the model sees (raw bytes for byte symbols,
  // the vocabulary string for chars); "" for an id that is no token of the model (a hole, an
  // added token). Throws forge::Error naming `origin` for a merge of ids that are not tokens,
  // a key listed twice, or byte symbols without a token for some byte.
  BpeModel(std::vector<std::string> keys, const std::vector<BpeMerge>& merges, Options opt, const std::string& origin);
  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;
  ~BpeModel();

  // Appends the ids of one piece (non-empty) to `out`.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // The id of a token by its key, if it is one.
  std::optional<int32_t> id_of(std::string_view key) const;
  const std::string& key(int32_t id) const;
  int64_t size() const;  // the number of keys (holes included)
  const Options& options() const;

 private:
  struct Impl;
  std::vector<int32_t> merge_symbols(std::vector<int32_t> syms) const;
  void initial_symbols(std::string_view piece, std::vector<int32_t>& syms) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace forge::data
