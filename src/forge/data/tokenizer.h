#pragma once
// The tokenizer interface, and `load_tokenizer`: every tokenizer file forge reads.
//
// Kinds (load_tokenizer tells them apart by content, Note [tokenizer files] in tokenizer.cpp):
//   forge-bpe      forge's own byte-level BPE JSON (bpe.h; `forge tokenize train`);
//   hf             a Hugging Face tokenizer.json whose model is BPE: byte-level (GPT-2, LLaMA-3,
//                  Qwen: ByteLevel/Split pre-tokenizers) or sentencepiece-style with byte fallback
//                  (LLaMA-2: Prepend/Replace normalizers, <0xNN> tokens) (hf_tokenizer.h);
//   tiktoken       a tiktoken rank file (base64 token, space, rank per line: cl100k_base.tiktoken,
//                  o200k_base.tiktoken, ...), its pattern and special tokens by the file's name or
//                  a sidecar <file>.json (tiktoken.h);
//   sentencepiece  a sentencepiece .model (ModelProto), through libsentencepiece (sentencepiece.h).
//
// Every kind is lossless on any bytes: decode(encode_ordinary(s)) == s for every byte string
// s, invalid UTF-8 included (Note [invalid UTF-8] in regex.h), except where a kind's own
// normalizer changes text (NFC for Qwen, sentencepiece's normalization rules).
//
// Encoding is safe from several threads at once (the streaming encoder of run_data.cpp
// encodes documents in parallel with one tokenizer).
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace forge::data {

// Note [tokenizer file limits]: tokenizer files are untrusted input (issue 43). Every id they
// give is an integer in [0, kMaxVocabSize), and the vocabulary's size (its largest id + 1) is at
// most twice the number of tokens the file lists plus kVocabSlack, so that a few bytes cannot ask
// for gigabytes; no token is longer than kMaxTokenBytes (the longest of GPT-2, LLaMA-3 and Qwen
// are under 300 bytes). Each violation is an error naming the file, the field and the value.
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 24;
inline constexpr int64_t kVocabSlack = 4096;
inline constexpr int64_t kMaxTokenBytes = 4096;

// Checks a vocabulary of `size` ids (largest id + 1) holding `listed` tokens against Note
// [tokenizer file limits]; throws naming `where`.
void check_vocabulary_size(int64_t size, int64_t listed, const std::string& where);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // "forge-bpe", "hf", "tiktoken" or "sentencepiece".
  virtual std::string kind() const = 0;
  // A one-line description for logs, e.g. "Hugging Face byte-level BPE, 128256 tokens".
  virtual std::string describe() const = 0;

  // Text -> ids. `encode` maps special-token strings (and a Hugging Face file's added tokens)
  // to their ids; `encode_ordinary` encodes them as plain text. Neither adds a bos or eos
  // token (the trainer appends data.eos_token per document itself).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual void encode_ordinary_into(std::string_view text, std::vector<int32_t>& out) const = 0;
  std::vector<int32_t> encode_ordinary(std::string_view text) const;
  // Ids -> bytes. Throws forge::Error for an id that is not in the vocabulary.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;

  // One more than the largest id (ids may have holes, e.g. tiktoken's cl100k_base).
  virtual int64_t vocab_size() const = 0;
  // The id of a special or added token, if this tokenizer has it.
  virtual std::optional<int32_t> token_id(std::string_view special) const = 0;
  // The id of a special token; throws forge::Error naming the tokenizer's special tokens.
  int32_t special_id(std::string_view special) const;
  // The special tokens (and added tokens) this tokenizer recognises in `encode`.
  virtual std::vector<std::string> special_tokens() const = 0;
  // The token a model of this tokenizer starts a sequence with, when its file names one
  // (a Hugging Face post-processor's template, sentencepiece's bos); informational.
  virtual std::optional<int32_t> bos_id() const { return std::nullopt; }
  // The end-of-text token documents end with (data.eos_token = "auto"): sentencepiece's eos
  // piece; otherwise the first special or added token of "<|endoftext|>" (GPT-2, tiktoken,
  // Qwen, forge), "<|end_of_text|>" (LLaMA-3), "</s>" (LLaMA-2), "<eos>" that this tokenizer has.
  virtual std::optional<std::string> eos_token() const;

  // A self-contained serialisation that load_tokenizer reads back into the same tokenizer
  // (forge-bpe and hf: the file itself; tiktoken and sentencepiece: a forge JSON wrapper
  // holding the file and its options). Its hash identifies the tokenizer of a run.
  virtual std::string serialized() const = 0;
  // Writes serialized() atomically.
  virtual void save(const std::string& path) const;
};

// Reads any tokenizer file forge accepts (above). Throws forge::Error naming the file and
// the accepted kinds when it is none of them, or what is wrong with it.
std::shared_ptr<const Tokenizer> load_tokenizer(const std::string& path);
// The same from bytes: `name` is the file's name (tiktoken picks its pattern by it), `origin`
// names it in errors ("" = name), `sidecar` is a tiktoken file's options (tiktoken.h).
std::shared_ptr<const Tokenizer> tokenizer_from_bytes(std::string bytes, const std::string& name,
                                                      const std::string& origin = "",
                                                      const std::optional<std::string>& sidecar = std::nullopt);

// What this build of forge reads, e.g. "forge-bpe, hf, tiktoken, sentencepiece" (the Hugging
// Face and tiktoken kinds need PCRE2, the sentencepiece kind libsentencepiece).
std::string supported_tokenizer_kinds();
bool have_regex_support();
bool have_sentencepiece_support();

}  // namespace forge::data
