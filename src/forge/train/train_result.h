#pragma once
// TrainResult: what `run_training` (train/trainer.h) reports of a run, whatever its model; the
// task of the run (train/task.h) fills in what is its own (ImageResult for image runs; the
// validation and bigram losses and token counts for language models).
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace forge::train {

struct EvalRecord {
  int64_t step = 0;
  double val_loss = 0.0;  // the held-out mean cross-entropy: validation windows, or an image run's test set
};

// An image-classification run (model.type = "lenet").
struct ImageResult {
  double test_accuracy = 0.0;               // after the last epoch, in [0, 1]
  double test_loss = 0.0;                   // mean cross-entropy over the test images, after the last epoch
  double final_train_loss = 0.0;            // mean training loss over the last epoch's batches (image-weighted)
  double images_per_s = 0.0;                // training images per second of the training steps
  std::vector<double> epoch_test_accuracy;  // test accuracy after each epoch (of this call)
  int64_t train_images = 0, test_images = 0;  // the images used (after data.max_*_samples)
  int64_t steps_per_epoch = 0;              // ceil(train_images / train.batch_size)
};

struct TrainResult {
  std::string run_dir;
  int64_t start_step = 0;      // steps already done when the call began (the checkpoint's, on resume)
  int64_t final_step = 0;
  std::vector<double> losses;  // losses[i]: the training loss of step start_step + i + 1 (non-finite: skipped)
  std::vector<EvalRecord> evals;
  double final_val_loss = std::numeric_limits<double>::quiet_NaN();   // language models
  double bigram_val_loss = std::numeric_limits<double>::quiet_NaN();  // NaN unless eval.bigram_baseline
  std::string last_checkpoint;
  int64_t num_parameters = 0;
  int64_t train_tokens = 0, val_tokens = 0;  // language models
  double seconds = 0.0;        // the whole call
  double tokens_per_s = 0.0;   // language models: training tokens per second of the training steps
  int64_t skipped_steps = 0;   // steps skipped for a non-finite loss or gradient norm (Note [non-finite guard])
  std::optional<ImageResult> image;  // model.type = "lenet"
  // Note [preemption]: the run stopped early (a signal, run.time_limit) after writing the
  // checkpoint of final_step; the same command continues it. stop_reason says why.
  bool stopped = false;
  std::string stop_reason;
  // The latest valid checkpoint was at the run's last step already: nothing was trained.
  bool already_finished = false;
};

}  // namespace forge::train
