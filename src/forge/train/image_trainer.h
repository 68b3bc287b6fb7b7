#pragma once
// Image classification: LeNet on Fashion-MNIST, the loop behind
// `forge train configs/fashion-mnist.toml` ([model] type = "lenet").
//
//   forge::train::ImageTrainOptions opt;
//   opt.run_dir = "runs/fashion-mnist";
//   auto r = forge::train::train_image_classifier(opt, std::cout);
//   // r.test_accuracy, r.final_train_loss, r.seconds, r.steps
//
// What one run does, in order:
//  1. validate_image_train_options(): every option, then that the four IDX files exist
//     (name.gz or name under data_dir), before any work. A bad value is a forge::Error
//     naming its config key ("train.batch_size must be positive, got 0").
//  2. Loads the training and test sets (data/idx.h), takes the first max_train_samples /
//     max_test_samples of each when set, and normalises both to (x - mean) / std with the
//     mean and standard deviation of the training images used.
//  3. Builds nn::LeNet initialised from `seed`, and the optimizer over
//     optim::decay_groups (weight decay on conv/linear weights, none on biases).
//  4. epochs × ceil(N / batch_size) steps over mini-batches reshuffled every epoch
//     (data::ImageBatches, seeded from `seed`); each step: lr from the schedule, forward,
//     mean cross-entropy, backward, optional gradient clipping, optimizer step. A loss
//     that is not finite stops the run with a forge::Error naming the step.
//  5. After each epoch: test accuracy and mean test loss (model.eval(), NoGradGuard,
//     batches of eval_batch_size).
//  6. With run_dir set: <run_dir>/metrics.jsonl (created afresh) gets one JSON line per
//     logged step {"step", "epoch", "loss", "lr", "images_per_s", "elapsed_s"} and one
//     per epoch {"step", "epoch", "train_loss", "test_loss", "test_accuracy",
//     "elapsed_s"}; at the end a checkpoint (io/checkpoint.h) at
//     <run_dir>/checkpoints/step_<steps>: model and optimizer state, RNG and data-order
//     state, these options as "config", and the final metrics under "extra".
//
// Progress goes to `log`: a header, one line every log_every steps and at the end of each
// epoch (images/s over the steps since the previous line; seconds of training so far and
// the estimated seconds of training left), one per epoch with the evaluation, and a summary:
//   epoch 1/2  step 250/3750  loss 0.6494  lr 2.47e-02  5456 img/s  1.5 s  eta 21 s
//   epoch 1/2 done: train loss 0.5149  test loss 0.3520  test accuracy 87.00%  (12.6 s in all)
//
// Determinism: the same options on the same machine (and OpenMP thread count) give the
// same losses, bit for bit: the initialisation and the shuffling each draw from their
// own Philox stream, and nothing else is random.
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "forge/core/device.h"

namespace forge::train {

// Each field names the config key it comes from. The defaults are the recipe of
// configs/fashion-mnist.toml (about 89% test accuracy after 2 epochs on the CPU).
struct ImageTrainOptions {
  // [data]
  std::string data_dir = "/usr/share/datasets/fashion-mnist";  // data.dir
  int64_t max_train_samples = 0;  // data.max_train_samples: first N training images (0 = all 60000)
  int64_t max_test_samples = 0;   // data.max_test_samples: first N test images (0 = all 10000)
  // [model]
  std::string model = "lenet";  // model.type; the only one so far
  // [optim]
  std::string optimizer = "sgd";  // optim.name: "sgd" (with momentum) or "adamw"
  double lr = 0.025;              // optim.lr: the peak learning rate
  double momentum = 0.9;          // optim.momentum (sgd), in [0, 1)
  bool nesterov = false;          // optim.nesterov (sgd; needs momentum > 0)
  double beta1 = 0.9;             // optim.beta1 (adamw)
  double beta2 = 0.999;           // optim.beta2 (adamw)
  double eps = 1e-8;              // optim.eps (adamw)
  double weight_decay = 5e-4;     // optim.weight_decay: sgd L2, adamw decoupled; weights only
  double grad_clip = 0.0;         // optim.grad_clip: max global gradient norm (0 = no clipping)
  // [schedule] (the decay runs over the whole run: epochs x ceil(samples / batch_size) steps)
  std::string schedule = "cosine";  // schedule.kind: "constant", "cosine" or "linear"
  int64_t warmup_steps = 0;         // schedule.warmup_steps: linear warmup to lr
  double min_lr = 0.0;              // schedule.min_lr: where cosine/linear decay ends, in [0, lr]
  // [train]
  int64_t epochs = 2;              // train.epochs
  int64_t batch_size = 32;         // train.batch_size
  int64_t eval_batch_size = 1000;  // train.eval_batch_size: test images per forward pass
  int64_t log_every = 100;         // train.log_every: steps between progress lines (0 = per epoch only)
  // [run]
  uint64_t seed = 0;    // run.seed: model initialisation and data order
  Device device = Device::cpu();      // run.device (resolved); the model trains in f32 on it
  std::string run_dir;  // <run.dir>/<run.name>: metrics.jsonl and the final checkpoint ("" = none)
};

struct ImageTrainResult {
  double test_accuracy = 0.0;               // after the last epoch, in [0, 1]
  double test_loss = 0.0;                   // mean cross-entropy over the test images, after the last epoch
  double final_train_loss = 0.0;            // mean training loss over the last epoch's batches (sample-weighted)
  double seconds = 0.0;                     // wall time of the whole call (loading, training, evaluation, saving)
  double train_seconds = 0.0;               // of which the training steps alone
  double images_per_s = 0.0;                // training images per second of train_seconds
  int64_t steps = 0;                        // optimizer steps taken
  std::vector<double> losses;               // the training loss of every step, in order
  std::vector<double> epoch_test_accuracy;  // test accuracy after each epoch
  std::string checkpoint;                   // the checkpoint directory written ("" without run_dir)
};

// Throws forge::Error naming the first bad option by its config key, or a missing data file
// by its path (and the Debian package that provides it). Does no other work.
void validate_image_train_options(const ImageTrainOptions& opt);

// Trains and evaluates as described above; progress lines go to `log`.
ImageTrainResult train_image_classifier(const ImageTrainOptions& opt, std::ostream& log);

}  // namespace forge::train
