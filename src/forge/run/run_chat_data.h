#pragma once
// The data of a chat run (data.format = "chat", docs/chat.md), prepared before the first step:
//
//   template    data.chat_template: "auto" = the "chat_template" of the tokenizer_config.json beside
//               data.tokenizer, else in model.init_from's directory (an error naming
//               data.chat_template when neither has one); a built-in name ("chatml", "llama3"); a
//               tokenizer_config.json; a .jinja file (no bos / eos tokens). Note [chat templates].
//   tokenizer   data.tokenizer, with the template's special tokens it lacks added as special tokens
//               (data::with_special_tokens; the log names them and the vocabulary's growth), saved
//               as <run dir>/tokenizer.json so a resumed run reads the same ids.
//   shards      each .jsonl file's conversations rendered, tokenized and masked (Note [chat masks])
//               into a token shard and its flags (Note [chat shards]) in data_shards_dir(cfg),
//               encoded again each run (fine-tuning corpora are small). A conversation longer than
//               train.seq_len + 1 tokens is cut there, and the trained tokens cut off are counted
//               and logged; a conversation with no trained token left (cut off entirely, or with no
//               assistant message) is skipped and logged with its file and line: never trained at
//               zero loss.
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "forge/data/chat_encoding.h"
#include "forge/data/chat_template.h"
#include "forge/data/tokenizer.h"
#include "forge/run/config.h"

namespace forge::train {

// The run's chat template (see above); logs where it came from.
data::ChatTemplate resolve_chat_template(const RunConfig& cfg, std::ostream& log);

// `tok` with the template's special tokens (see above); logs what was added; saves the grown
// tokenizer in the run directory unless `save` is false (forge plan writes nothing).
std::shared_ptr<const data::Tokenizer> chat_tokenizer(const RunConfig& cfg, std::shared_ptr<const data::Tokenizer> tok,
                                                      const data::ChatTemplate& tmpl, std::ostream& log, bool save = true);

// What encoding a chat file did.
struct ChatEncodeStats {
  int64_t conversations = 0;  // read
  int64_t written = 0;        // into the shard
  int64_t tokens = 0;         // written
  int64_t trained = 0;        // trained targets written
  int64_t cut = 0;            // conversations cut to seq_len + 1 tokens
  int64_t trained_cut = 0;    // trained tokens lost to the cuts
  std::vector<int64_t> skipped_lines;  // conversations with no trained token left
};

// One chat file into the token shard `out` and its flags (chat_flags_path(out)), conversations cut
// to `max_tokens` tokens (see above).
ChatEncodeStats encode_chat_file(const data::ChatTemplate& tmpl, const data::Tokenizer& tok, data::ChatTrainOn train_on,
                                 int64_t max_tokens, int64_t vocab_size, const std::string& path,
                                 const std::string& out);

// Every file of `files` encoded into `dir` (shard_NNNNN.bin and .flags.bin); returns the token
// shards' paths; logs a line per file and every skipped conversation.
std::vector<std::string> prepare_chat_shards(const RunConfig& cfg, const data::Tokenizer& tok,
                                             const data::ChatTemplate& tmpl, const std::vector<std::string>& files,
                                             const std::string& dir, std::ostream& log);

// What a chat run's data come to (forge plan for SFT): each file encoded as the run will encode it,
// into a temporary directory of its own (removed before returning), the conversations split into
// training and validation as the run splits them and the training ones packed into rows of
// train.seq_len (Note [chat rows]). Nothing else is written.
struct ChatDataSummary {
  int64_t files = 0;
  ChatEncodeStats encoded;          // every file's, summed (skipped_lines: their count only)
  int64_t skipped = 0;              // conversations with no trained token left
  int64_t train_conversations = 0, val_conversations = 0;
  int64_t train_tokens = 0;         // tokens of the training conversations
  int64_t rows = 0, seq_len = 0;    // rows of seq_len positions the training conversations fill
  int64_t trained_targets = 0;      // trained targets in those rows
};
ChatDataSummary summarize_chat_data(const RunConfig& cfg, std::ostream& log);
// summarize_chat_data's directories are "<tmp>/forge-plan-chat-<pid>-<n>"; one whose process is
// gone (a plan killed mid-way) and that holds nothing but shards is removed (logged).
inline constexpr const char* kPlanDirPrefix = "forge-plan-chat-";
void remove_stale_plan_dirs(const std::filesystem::path& tmp, std::ostream& log);

}  // namespace forge::train
