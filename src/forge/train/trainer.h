#pragma once
// The trainer behind `forge train`: a RunConfig (config.h) in, a trained model, its
// checkpoints and metrics out. This header also gathers the pieces it shares with the other
// commands: sampling (sample.h), export (export.h), tokenisation into shards (run_data.h).
//
// The files of train/, one concern each:
//   config        the run config: schema, TOML, overrides, checks
//   layout        the config's [dist] and [train] keys as a dist::Layout, checked against the world
//   run_data      tokenizer, token shards, random tokens, the bigram baseline
//   language_model  GPT / LLaMA behind one interface
//   strategy      Strategy: what a parallel layout changes (single_process, data_parallel_strategy)
//   run_checkpoint  checkpoint plumbing every layout shares (optimizer slots, ranged state)
//   phase_marks   FORGE_TRAIN_PHASES
//   trainer       the loop (this header's run_training)
//   sample, export, image_trainer
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
//   5. the model (seeded by run.seed) and the LR schedule; with --resume the model, RNG,
//      data-sampler position and step are restored from the checkpoint (after
//      io::check_compatible on the shapes); then the layout's Strategy (strategy.h) wraps the
//      model and its optimizer (AdamW or SGD over optim::decay_groups) and restores the
//      optimizer state;
//   6. steps: lr from the schedule; train.grad_accum global micro-batches of
//      batch_size / grad_accum sequences (Note [global batch]) drawn on every rank; the
//      strategy's train_step (forward, backward, reductions, clip, update); a progress line and
//      a metrics.jsonl record every log_every steps; a validation pass every eval.every steps;
//      a checkpoint every checkpoint.every steps (keeping checkpoint.keep_last);
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

#include "forge/train/config.h"
#include "forge/train/export.h"
#include "forge/train/image_trainer.h"
#include "forge/train/language_model.h"
#include "forge/train/run_data.h"
#include "forge/train/sample.h"

namespace forge::train {

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

}  // namespace forge::train
