#pragma once
// The trainer behind `forge train`: a RunConfig (config.h) in, a trained model, its
// checkpoints and metrics out. This header also gathers the pieces it shares with the other
// commands: sampling (sample.h), export (export.h), tokenisation into shards (run_data.h).
//
// The files of train/, one concern each:
//   config        the run config: schema, TOML, overrides; config_checks: validate()
//   layout        the config's [dist] and [train] keys as a parallel::Layout, checked against the world
//   task          Task: what a kind of model changes (language_task: GPT/LLaMA; image_task: LeNet)
//   run_data      tokenizer, token shards, random tokens, the bigram baseline
//   model, language_model  what the loop and strategies need of a model; GPT / LLaMA behind it
//   strategy      Strategy: what a parallel layout changes (data_parallel_strategy, pipeline_strategy)
//   run_checkpoint  checkpoint plumbing every layout shares (optimizer slots, ranged state)
//   phase_marks   FORGE_TRAIN_PHASES
//   train_result  TrainResult
//   trainer       the loop (this header's run_training)
//   sample, export
//
// One loop for every model: the run's Task (task.h, from model.type) supplies the data, the model,
// the number of steps, the evaluation and the end-of-run extras; the layout's Strategy
// (strategy.h) wraps the model and optimizer and trains each step. In order:
//   1. the run directory <run.dir>/<run.name>, locked by rank 0 for the whole run (Note [run
//      directory lock]); the same command continues from its latest valid checkpoint, or
//      starts when there is none (Note [one command starts or continues]: run.overwrite starts
//      afresh, --resume insists on a checkpoint); a run already at its last step says so and
//      returns;
//   2. the task's data: language models: the tokenizer (data.tokenizer, or one trained on
//      data.files, saved as <run dir>/tokenizer.json and reused while the files and
//      data.vocab_size are the same; a resumed run uses its checkpoint run's); images: the
//      Fashion-MNIST IDX files of data.dir, their first data.max_train_samples /
//      data.max_test_samples images, normalised with the training images' mean and std;
//   3. the model (seeded by run.seed: GPT / LLaMA, or LeNet), checked against the checkpoint
//      on resume; then the training batches: token shards, one per data file (data/shards.h),
//      in data.shards_dir (default <run dir>/data) with a manifest, reused while the tokenizer
//      and files are the same, the last data.val_fraction of each shard held out for
//      validation; or the training images, reshuffled every epoch;
//   4. with --resume the model, RNG, data position, step and the task's state are restored
//      from the checkpoint; then the layout's Strategy (strategy.h) wraps the model and its
//      optimizer (AdamW or SGD over optim::decay_groups: make_optimizer_for) and restores the
//      optimizer state;
//   5. steps (language models: train.steps; images: train.epochs x ceil(N / train.batch_size)):
//      lr from the schedule; the task's micro-batches (language models: train.grad_accum
//      global micro-batches of batch_size / grad_accum windows, Note [global batch]; images:
//      one batch of batch_size images, the last of an epoch smaller) drawn on every rank; the
//      strategy's train_step (forward, backward, reductions, clip, update); a progress line and
//      a metrics.jsonl record every log_every steps (and at the end of each epoch); an evaluation
//      when the task calls for one (language models: every eval.every steps; images: after every
//      epoch, test loss and accuracy over the whole test set); a checkpoint every
//      checkpoint.every steps (keeping checkpoint.keep_last);
//   6. at the end: the task's last evaluation (validation, and the bigram baseline with
//      eval.bigram_baseline, on the same windows; images: the last epoch's test accuracy), a
//      final checkpoint. A stop (a signal, run.time_limit: Note [preemption]) ends the loop
//      early with a checkpoint of that step instead, and TrainResult::stopped.
// Checkpoints are taken at the step boundary and written while training goes on
// (checkpoint.async, Note [async checkpoints]); every checkpoint.every steps and every
// checkpoint.interval_minutes (agreed between ranks like a stop).
// Determinism: on the CPU with the same thread count, a run resumed from a checkpoint at
// step k gives bit-identical losses at every step after k to the uninterrupted run: every
// source of randomness (init, data order, dropout) is a Philox stream whose position the
// checkpoint records, the schedule is a function of the step, and the optimizer state is
// saved exactly.
//
// metrics.jsonl records (one JSON object per line; <units> is "tokens" for language models and
// "images" for image runs):
//   {"step", "loss", "lr", "grad_norm", "<units>_per_s", "ms_per_step", "<units>", "elapsed_s",
//    "mem_bytes", ("mfu"), ("loss_scale"), ("epoch": image runs)}  every log_every steps, the
//                                                                     first, the last, and each epoch's last
//   {"step", "skipped": true, "loss", "grad_norm"}                   a step skipped by the non-finite guard
//   {"step", "val_loss", "elapsed_s"}                                every validation pass (language models)
//   {"step", "epoch", "train_loss", "test_loss", "test_accuracy", "elapsed_s"}   after every epoch (images;
//                                                                     train_loss: the epoch's mean)
//   {"step", "final": true, "train_loss", "<units>_per_s", "elapsed_s", and "val_loss",
//    "bigram_val_loss" (language models) or "test_loss", "test_accuracy" (images)}   at the end
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "forge/run/config.h"
#include "forge/interop/export.h"
#include "forge/run/language_model.h"
#include "forge/run/run_data.h"
#include "forge/interop/sample.h"
#include "forge/train/train_result.h"

namespace forge::train {

struct TrainOptions {
  bool resume = false;
  std::string resume_from = {};  // with resume: a checkpoint directory or a run directory ("" = this run's latest)
  std::string command = "forge train";  // recorded in the run directory's lock (Note [run directory lock])
};

// Runs the training cfg describes; progress goes to `log`. Throws forge::Error (naming the
// config key where one is at fault) before any training step for every bad input.
TrainResult run_training(const RunConfig& cfg, const TrainOptions& opt, std::ostream& log);

}  // namespace forge::train
