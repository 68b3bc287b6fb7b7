#pragma once
// `forge eval`: a checkpoint's loss and perplexity on text files, and its accuracy on
// multiple-choice tasks in the HellaSwag JSON Lines layout.
//
//   forge eval --checkpoint runs/gpt2 --files val.txt --tasks hellaswag_val.jsonl
//
// Loss (Note [held-out loss]): the files' documents are encoded with the run's tokenizer, each
// followed by its end-of-text token (data.eos_token, "auto" resolved as in training), joined,
// and cut into windows of train.seq_len + 1 tokens with no overlap (the last, shorter one
// included); loss = the mean next-token cross-entropy over every predicted token of every
// window, perplexity = exp(loss).
//
// Multiple choice (Note [multiple-choice scoring]): one example per line,
//   {"ctx": "A man is sitting on a roof. he", "endings": ["is using wrap ...", ...], "label": 3}
// ("ctx_a" and "ctx_b" joined by a space stand for "ctx" when "ctx" is absent, as in the original
// HellaSwag files; "label" is an integer or a string of one). Each ending is scored by the sum of
// its tokens' log-probabilities after the context (the context's tokens, then " " + ending's);
// acc: the highest sum picks the answer; acc_norm: the highest sum divided by the ending's length
// in bytes (lm-evaluation-harness's two figures). A context and ending longer than the model's
// context keep their last block_size tokens. Every ending of an example runs in one batch.
#include <cstdint>
#include <string>
#include <vector>

#include "forge/data/tokenizer.h"
#include "forge/run/language_model.h"

namespace forge::train {

struct FileLoss {
  std::string file;
  int64_t documents = 0;
  int64_t tokens = 0;  // predicted tokens
  double loss = 0;     // mean cross-entropy, nats per token
  double perplexity = 0;
};

struct TaskScore {
  std::string task;    // the file's name without its extensions
  std::string file;
  int64_t examples = 0;
  double acc = 0, acc_norm = 0;
};

// The held-out loss of `file` (Note [held-out loss] above); `eos` "" = none.
FileLoss file_loss(const LanguageModel& model, const data::Tokenizer& tok, const std::string& file,
                   const std::string& text_key, const std::string& eos, int64_t seq_len, int64_t batch);

// Multiple-choice accuracy on `file` (above); max_examples > 0 scores the first ones only.
TaskScore multiple_choice(const LanguageModel& model, const data::Tokenizer& tok, const std::string& file,
                          int64_t max_examples);

// The sum of log p(ids[i] | ids[< i]) over i in [from, ids.size()) for each sequence of a
// batch (the sequences may differ in length; each at most model.block_size), in f64.
std::vector<double> continuation_logprobs(const LanguageModel& model, const std::vector<std::vector<int32_t>>& seqs,
                                          const std::vector<size_t>& from);

struct EvalOptions {
  std::string checkpoint;            // a checkpoint directory, or a run directory (its latest)
  std::string adapter = "";          // a PEFT LoRA directory applied to the checkpoint's model ("" = none)
  std::vector<std::string> files;    // text / JSON Lines files: loss and perplexity
  std::vector<std::string> tasks;    // multiple-choice files in the HellaSwag layout
  int64_t max_examples = 0;          // per task; 0 = all
  int64_t batch = 8;                 // windows per forward pass (files)
  std::string device = "auto";       // where the model runs (run.device's forms)
  std::string dtype = "f32";         // the weights' dtype there: f32, bf16, f16
};

struct EvalResult {
  std::string checkpoint;
  int64_t step = 0;
  std::vector<FileLoss> files;
  std::vector<TaskScore> tasks;
};

// Loads the checkpoint, its run's config and tokenizer (as forge sample does), and evaluates.
// Bad arguments (no files and no tasks, a missing file) throw forge::Error before the model loads.
EvalResult evaluate(const EvalOptions& opt);

}  // namespace forge::train
