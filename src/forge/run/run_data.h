#pragma once
// The data a language-model run trains on, prepared before the first step (train/trainer.h
// steps 2-3): the tokenizer, token shards, and the random-token shard of benchmark runs; and
// the bigram baseline the end of a run compares against.
//
//   tokenizer   data.tokenizer, or a byte-level BPE trained on data.files (data.vocab_size),
//               saved as <run dir>/tokenizer.json with tokenizer.source.json recording what it
//               came from; reused while the files and vocab_size are the same. A resumed run
//               uses the tokenizer.json of its checkpoint's run.
//   shards      one per data file (data/shards.h) in data.shards_dir (default <run dir>/data),
//               with manifest.json; reused while the tokenizer and the files are the same.
//   random      data.source = "random": 8 Mi uniform tokens of model.vocab_size from the run's
//               seed, in one shard (rank 0 writes it; the others read the same path).
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "forge/data/bpe.h"
#include "forge/data/tokenizer.h"
#include "forge/data/loader.h"
#include "forge/run/config.h"

namespace forge::train {

inline constexpr const char* kTokenizerFile = "tokenizer.json";
// Note [end-of-text token]: every document ends with one end-of-text token in the shards
// (data.eos_token), so the model sees where a document stops and no sequence runs from one
// document into the next unmarked. data.eos_token = "auto" (the default) takes the tokenizer's
// own: a tokenizer trained on data.files gets kDefaultEosToken as a special token; a given one
// names its own (data::Tokenizer::eos_token: sentencepiece's eos piece, else "<|endoftext|>",
// "<|end_of_text|>", "</s>" or "<eos>", whichever it has), and one that has none joins documents
// as they are, which the log says. "" = no token; any other string must be one of its tokens.
inline constexpr const char* kAutoEosToken = "auto";
inline constexpr const char* kDefaultEosToken = "<|endoftext|>";
// The data order is seeded apart from the model's initialisation (which uses run.seed itself),
// so changing one never shifts the other.
inline constexpr uint64_t kDataSeedSalt = 0x9e3779b97f4a7c15ULL;

// FNV-1a, 64 bits, as 16 hex digits: a stable fingerprint of a tokenizer's JSON.
std::string fnv1a_hex(const std::string& s);

// The run's tokenizer (see above); `resume_tokenizer` is the checkpoint run's tokenizer.json.
std::shared_ptr<const data::Tokenizer> load_or_train_tokenizer(const RunConfig& cfg, const std::vector<std::string>& files,
                                           const std::optional<std::filesystem::path>& resume_tokenizer,
                                           std::ostream& log);
// The shards of `files` under `tok` (see above), made or reused, in data_shards_dir(cfg) or `dir`.
std::vector<std::string> prepare_shards(const RunConfig& cfg, const data::Tokenizer& tok,
                                        const std::vector<std::string>& files, std::ostream& log);
std::vector<std::string> prepare_shards(const RunConfig& cfg, const data::Tokenizer& tok,
                                        const std::vector<std::string>& files, std::ostream& log,
                                        const std::filesystem::path& dir);
// Where the run's token shards go: data.shards_dir, or <run dir>/data. data.val_files' shards go
// beside it, in the same name with "_val" added.
std::filesystem::path data_shards_dir(const RunConfig& cfg);
// Note [pre-encoded corpora]: when every file of data.files is a token shard (forge's, llm.c's
// or Megatron-LM's: data/shards.h, Note [token shard formats]), the corpus is already encoded:
// the files are the shards, read as they are (no tokenizer is trained; a Megatron .bin's .idx
// beside it is its index, not a corpus file). Returns those shards in order; empty when no file
// is a shard; throws forge::Error naming a file when text files and shards are mixed.
std::vector<std::string> pre_encoded_shards(const std::vector<std::string>& files);
// Every token of `shards` below `vocab`, checked before training (a full read of each shard,
// over the cores); throws naming the shard, its largest id and the fix. Logs the time taken.
void check_shard_vocabulary(const std::vector<std::shared_ptr<const data::TokenShard>>& shards, int64_t vocab,
                            std::ostream& log);
// data.source = "random": the shard's path, written when `write` (rank 0).
std::string write_random_shard(const RunConfig& cfg, std::ostream& log, bool write = true);

// Encodes the files into shards (out_dir/shard_00000.bin, ...; out_dir created), each file
// into one shard or, past `tokens_per_shard` tokens, several, streamed over the cores (Note
// [streaming encoder]); returns the shard paths in order. Each document of a file (Note
// [documents]: a text file is one, a .jsonl line one, its `text_key`) is followed by `eos` (a
// special token of `tok`) unless it is "". Prints one line per file to `log` when given.
// Whether `path` is named as encode_files_to_shards names its shards (shard_NNNNN.bin).
bool is_shard_file_name(const std::filesystem::path& path);

// Note [shard manifests]: a directory of shards made by a run keeps manifest.json, what they were
// made from (`want`: the tokenizer's hash, the files' fingerprints, the options that change the
// tokens) and the shards' names. A later run (another rank of the job, a resume) whose `want` is
// the same reuses them instead of writing them again; anything else rebuilds them. The shard
// paths of `dir`'s manifest when it holds `want` and every shard listed is there, else nullopt.
std::optional<std::vector<std::string>> manifest_shards(const std::filesystem::path& dir,
                                                        const nlohmann::json& want);
// Whether `entry` may be in a shards directory: a shard (shard_NNNNN.bin), a chat run's flags
// beside it (shard_NNNNN.flags.bin), manifest.json, random_tokens.bin, or the temporary of one of
// those (io::is_temporary_name: what a writer killed mid-write leaves).
bool is_shards_dir_entry(const std::filesystem::path& entry);
// Before shards are written into `dir`: refuses a directory holding anything else (Note [nothing
// deletes what it did not write]; data.shards_dir), and removes the temporaries whose writer
// process is gone (a run killed while encoding), saying so in `log`.
void claim_shards_dir(const std::filesystem::path& dir, std::ostream& log);
// Writes `dir`/manifest.json: `want`, the shards' file names and `extra` (e.g. what encoding them
// logged, said again when they are reused).
void write_manifest(const std::filesystem::path& dir, const nlohmann::json& want,
                    const std::vector<std::string>& shards, const nlohmann::json& extra = nlohmann::json::object());
// Path, size and modification time of each file: what decides whether cached tokens are stale.
nlohmann::json files_fingerprint(const std::vector<std::string>& files);

std::vector<std::string> encode_files_to_shards(const data::Tokenizer& tok, const std::vector<std::string>& files,
                                                const std::string& out_dir, std::ostream* log = nullptr,
                                                const std::string& text_key = "text", const std::string& eos = "",
                                                int64_t tokens_per_shard = int64_t{1} << 28);

// Mean negative log-likelihood of the targets of `windows` under an add-one-smoothed
// bigram model counted on the consecutive token pairs of `train` (vocabulary `vocab`):
//   p(b | a) = (count(a, b) + 1) / (count(a) + vocab)
// `max_batches` as eval.batches (0 = all). Windows are consumed from their current position.
double bigram_baseline(const std::vector<data::TokenRange>& train, data::SequentialWindows& windows,
                       int64_t max_batches, int64_t vocab);

}  // namespace forge::train
