#pragma once
// Task: what differs between the kinds of model that the one training loop (train/trainer.cpp)
// trains, behind one interface, so that the loop never branches on model.type (as Strategy keeps
// it from branching on the layout). Implementations, chosen by make_task from model.type:
//   language models ("gpt" | "llama"; train/language_task.cpp): the tokenizer, token shards or
//     random tokens, random windows of train.seq_len; train.steps steps; the mean validation loss
//     over sequential windows every eval.every steps and at the end; the bigram baseline; tokens
//     per second and MFU.
//   image classification ("lenet"; train/image_task.cpp): the Fashion-MNIST IDX files, their
//     first data.max_*_samples images normalised with the training images' mean and std,
//     reshuffled every epoch; train.epochs x ceil(N / train.batch_size) steps; test loss and
//     accuracy over the whole test set after every epoch; images per second.
//
// The loop calls, in order (every rank; rank 0 prepares shared files before the others start):
//   compute_dtype(device)                    the dtype the model trains in
//   prepare_data(ck, ck_path, log)           data the model depends on (the tokenizer; the images)
//   model()                                  built from run.seed on the CPU; then moved and cast
//   check_resume(ck, ck_path)                with --resume: the checkpoint fits this data and length
//   train_batches(log)                       the source of the global micro-batches (restorable)
//   restore(ck)                              with --resume: the task's own state
//   describe(), total_steps(), units(), flops_per_unit(), micro_batches_per_step()
//   per step: on_step(step, loss, units) for each step read that was not skipped, in order;
//             epoch_of(step) for progress lines; eval_due(step) -> evaluate(strategy, step);
//             checkpoint_extra() into each checkpoint's state.json "extra"
//   finish(...)                              the end: final evaluation, baselines, the result
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "forge/core/device.h"
#include "forge/core/dtype.h"
#include "forge/data/loader.h"
#include "forge/io/checkpoint.h"
#include "forge/parallel/layout.h"
#include "forge/run/config.h"
#include "forge/run/model.h"
#include "forge/train/strategy.h"
#include "forge/train/train_result.h"

namespace forge::train {

// What a step trains on: "tokens" / "tok" or "images" / "img". The metrics records' throughput
// field is "<name>_per_s" and their running count "<name>"; the progress line shows "<abbrev>/s".
struct Units {
  std::string name;
  std::string abbrev;
};

// One evaluation pass.
struct Evaluation {
  double loss = 0.0;      // the held-out mean cross-entropy (TrainResult::evals)
  nlohmann::json record;  // the metrics.jsonl record's fields (the loop adds "step" and "elapsed_s")
  std::string line;       // the log line
};

// Where a step lies in an epoch-based run (1-based epoch).
struct EpochPlace {
  int64_t epoch = 0, epochs = 0;
  bool ends_epoch = false;
};

class Task {
 public:
  virtual ~Task() = default;
  virtual Units units() const = 0;
  virtual DType compute_dtype(Device device) const = 0;

  // Before the model: the data it depends on, each bad input an error naming its key.
  virtual void prepare_data(const std::optional<io::CheckpointData>& ck, const std::filesystem::path& ck_path,
                            std::ostream& log) = 0;
  // The model (built on the first call, from run.seed, on the CPU in f32).
  virtual Model& model() = 0;
  // A checkpoint to resume from fits this run beyond its shapes (the loop checks those): the same
  // data, and a step before total_steps(). Throws naming the key to change.
  virtual void check_resume(const io::CheckpointData& ck, const std::filesystem::path& ck_path) const = 0;
  // The global micro-batches of training, in order, endless or for the whole run; its state is
  // what checkpoints record. Called once, after prepare_data.
  virtual std::unique_ptr<data::BatchSource> train_batches(std::ostream& log) = 0;
  // The task's own state from a checkpoint (after check_resume).
  virtual void restore(const io::CheckpointData& ck) = 0;

  virtual int64_t micro_batches_per_step() const = 0;
  virtual int64_t total_steps() const = 0;
  // The log's lines on the model and the data (each ending in a newline).
  virtual std::string describe() const = 0;
  // Model FLOPs per unit for MFU (Note [MFU]); nullopt: no MFU.
  virtual std::optional<double> flops_per_unit() const = 0;
  virtual std::optional<EpochPlace> epoch_of(int64_t step) const = 0;

  // Step `step` (not skipped) had mean loss `loss` over `units` units.
  virtual void on_step(int64_t step, double loss, int64_t units) = 0;
  // Whether to evaluate after step `step` (the loop asks only ranks whose strategy evaluates).
  virtual bool eval_due(int64_t step) const = 0;
  virtual Evaluation evaluate(Strategy& strategy, int64_t step) = 0;
  // Fields for a checkpoint's state.json "extra" (the data's fingerprint, the task's state).
  virtual nlohmann::json checkpoint_extra() const = 0;

  // The end of the run at `step`: a final evaluation (when `evaluates`), baselines, the task's
  // fields of `result` (with `units_per_s`, the training throughput) and of the final metrics
  // record, and its log lines.
  virtual void finish(Strategy& strategy, bool evaluates, int64_t step, double units_per_s, TrainResult& result,
                      nlohmann::json& final_record, std::ostream& log) = 0;
};

// The task of cfg.model.type. It may resolve keys of `cfg` (model.vocab_size from the tokenizer;
// data.val_fraction = 0 for random tokens), which must outlive it. `layout` is the run's (checked);
// `rank0`: this process writes the shared files (tokenizer, shards) and the bigram baseline.
std::unique_ptr<Task> make_task(RunConfig& cfg, const parallel::Layout& layout, bool rank0);

std::unique_ptr<Task> make_language_task(RunConfig& cfg, const parallel::Layout& layout, bool rank0);
std::unique_ptr<Task> make_image_task(RunConfig& cfg, const parallel::Layout& layout, bool rank0);

}  // namespace forge::train
