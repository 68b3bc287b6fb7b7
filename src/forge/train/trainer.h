#pragma once
// The trainer behind `forge train`: a RunConfig (config.h) in, a trained model, its
// checkpoints and metrics out. Also sampling (`forge sample`) and tokenisation of files
// into shards (`forge tokenize`), which share its pieces.
//
// Language models (model.type = "gpt" | "llama"), in order:
//   1. the run directory <run.dir>/<run.name>; a fresh run refuses to overwrite an earlier
//      run's checkpoints unless run.overwrite (or --resume continues it);
//   2. the tokenizer: data.tokenizer, or one trained on data.files (data.vocab_size),
//      saved as <run dir>/tokenizer.json and reused while the files and vocab_size are the
//      same (a resumed run uses the tokenizer.json of its checkpoint's run);
//   3. token shards, one per data file (data/shards.h), in data.shards_dir (default
//      <run dir>/data) with a manifest; reused while the tokenizer and files are the same;
//   4. train/val split: the last data.val_fraction of each shard is validation;
//   5. the model (seeded by run.seed), AdamW (or SGD) over optim::decay_groups, the LR
//      schedule; with --resume the model, optimizer, RNG, data-sampler position and step
//      are restored from the checkpoint (after io::check_compatible on the shapes);
//   6. steps: lr from the schedule; grad_accum micro-batches, each loss / grad_accum
//      backward; clip; step; a progress line and a metrics.jsonl record every log_every
//      steps; a validation pass every eval.every steps; a checkpoint every
//      checkpoint.every steps (keeping checkpoint.keep_last);
//   7. at the end: validation, the bigram baseline (eval.bigram_baseline) on the same
//      windows, a final checkpoint.
// Determinism: on the CPU with the same thread count, a run resumed from a checkpoint at
// step k gives bit-identical losses at every step after k to the uninterrupted run: every
// source of randomness (init, data order, dropout) is a Philox stream whose position the
// checkpoint records, the schedule is a function of the step, and the optimizer state is
// saved exactly.
//
// model.type = "lenet" is delegated to train_image_classifier (image_trainer.h).
//
// metrics.jsonl records (one JSON object per line):
//   {"step", "loss", "lr", "grad_norm", "tokens_per_s", "tokens", "elapsed_s", "mem_bytes"}
//   {"step", "val_loss", "elapsed_s"}                                 every validation pass
//   {"step", "final": true, "val_loss", "bigram_val_loss", "train_loss", "elapsed_s"}   at the end
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "forge/core/tensor.h"
#include "forge/data/bpe.h"
#include "forge/data/loader.h"
#include "forge/nn/module.h"
#include "forge/train/config.h"
#include "forge/nn/block_hooks.h"
#include "forge/train/image_trainer.h"

namespace forge::train {

// GPT or LLaMA behind one interface.
struct LanguageModel {
  std::shared_ptr<nn::Module> module;
  std::function<Tensor(const Tensor&)> forward;  // (B, T) i64 token ids -> (B, T, vocab_size) logits
  int64_t vocab_size = 0;
  int64_t block_size = 0;
  // ZeRO-3: installs the hooks the model calls around each block (nn/block_hooks.h), and the
  // block a parameter name belongs to (-1 outside the blocks).
  std::function<void(std::shared_ptr<nn::BlockHooks>)> set_block_hooks;
  std::function<int(const std::string&)> block_of;
  Device device() const;  // where its parameters are
};
// Builds the model cfg.model describes, initialised from run.seed; cfg.model.vocab_size
// must be resolved (> 0).
LanguageModel build_language_model(const RunConfig& cfg);

struct TrainOptions {
  bool resume = false;
  std::string resume_from = {};  // with resume: a checkpoint directory or a run directory ("" = this run's latest)
};

struct EvalRecord {
  int64_t step = 0;
  double val_loss = 0.0;
};

struct TrainResult {
  std::string run_dir;
  int64_t start_step = 0;      // steps already done when the call began (the checkpoint's, on resume)
  int64_t final_step = 0;
  std::vector<double> losses;  // losses[i]: the training loss of step start_step + i + 1 (non-finite: skipped)
  std::vector<EvalRecord> evals;
  double final_val_loss = std::numeric_limits<double>::quiet_NaN();
  double bigram_val_loss = std::numeric_limits<double>::quiet_NaN();  // NaN unless eval.bigram_baseline
  std::string last_checkpoint;
  int64_t num_parameters = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  double seconds = 0.0;        // the whole call
  double tokens_per_s = 0.0;   // training tokens per second of the training steps
  int64_t skipped_steps = 0;   // steps skipped for a non-finite loss or gradient norm (Note [non-finite guard])
  std::optional<ImageTrainResult> image;  // model.type = "lenet"
};

// Runs the training cfg describes; progress goes to `log`. Throws forge::Error (naming the
// config key where one is at fault) before any training step for every bad input.
TrainResult run_training(const RunConfig& cfg, const TrainOptions& opt, std::ostream& log);

// The ImageTrainOptions of a lenet config (the keys each field names in image_trainer.h).
ImageTrainOptions image_options(const RunConfig& cfg);

// ---- data ----------------------------------------------------------------------------------

// Encodes each file into a shard (out_dir/shard_00000.bin, ...; out_dir created) and
// returns the shard paths in order. Prints one line per file to `log` when given.
std::vector<std::string> encode_files_to_shards(const data::BpeTokenizer& tok, const std::vector<std::string>& files,
                                                const std::string& out_dir, std::ostream* log = nullptr);

// Mean negative log-likelihood of the targets of `windows` under an add-one-smoothed
// bigram model counted on the consecutive token pairs of `train` (vocabulary `vocab`):
//   p(b | a) = (count(a, b) + 1) / (count(a) + vocab)
// `max_batches` as eval.batches (0 = all). Windows are consumed from their current position.
double bigram_baseline(const std::vector<data::TokenRange>& train, data::SequentialWindows& windows,
                       int64_t max_batches, int64_t vocab);

// ---- sampling ------------------------------------------------------------------------------

struct SampleOptions {
  std::string checkpoint;      // a checkpoint directory, or a run directory (its latest checkpoint)
  std::string prompt;
  int64_t tokens = 200;        // new tokens to generate
  double temperature = 0.8;    // 0 = greedy (argmax)
  int64_t top_k = 0;           // sample among the k most likely tokens (0 = all)
  uint64_t seed = 0;
};

struct SampleResult {
  std::string text;            // the prompt followed by the generated text
  std::string completion;      // the generated text alone
  std::string checkpoint;      // the checkpoint directory used
  int64_t step = 0;            // its step
};

// Loads the checkpoint, its run's config (from the checkpoint) and tokenizer
// (<run dir>/tokenizer.json), and samples autoregressively under NoGradGuard with the
// model in eval mode. Deterministic for a given seed.
SampleResult sample(const SampleOptions& opt);

// `forge export`: the model of a checkpoint (any: one process, DDP or ZeRO at any world
// size — the weights are whole in every one) as a Hugging Face model directory:
//   <out>/model.safetensors   HF tensor names and layouts (io/hf_names.h: GPT2LMHeadModel or
//                             LlamaForCausalLM), in `dtype` ("" = as trained)
//   <out>/config.json         the HF config of the architecture, so from_pretrained(<out>) loads it
//   <out>/forge_tokenizer.json  the run's forge BPE tokenizer, when the run had one (forge's own
//                             format, so HF's tokenizer.json name stays free)
// Written through a temporary directory and an atomic rename: a crash leaves no half model.
struct ExportOptions {
  std::string checkpoint;  // a checkpoint directory, or a run directory (its latest)
  std::string out;         // the output directory (replaced if it exists)
  std::string dtype;       // "", "f32", "bf16" or "f16"
};
struct ExportResult {
  std::string checkpoint;
  int64_t step = 0;
  int64_t tensors = 0;
  int64_t parameters = 0;
};
ExportResult export_model(const ExportOptions& opt);

// The autoregressive loop: appends `n` tokens to `ids` (each from the last block_size
// tokens' logits), drawing from a Philox Generator seeded with `seed`.
std::vector<int32_t> generate(const LanguageModel& model, std::vector<int32_t> ids, int64_t n, double temperature,
                              int64_t top_k, uint64_t seed);

}  // namespace forge::train
