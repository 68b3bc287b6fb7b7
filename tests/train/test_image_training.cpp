// Image classification (model.type = "lenet") through the one training loop, run_training: a
// short run on a slice of Fashion-MNIST learns (the loss falls, test accuracy well above chance),
// writes metrics.jsonl and a loadable checkpoint; bad keys are rejected before any work with
// messages that name the key; the same seed gives the same losses bit for bit; a run resumed from a
// mid-epoch checkpoint is bit-identical to the uninterrupted one. (Data parallel LeNet against one
// process: tests/train/test_data_parallel.cpp.)
//
// The full recipe of configs/fashion-mnist.toml (>= 88% test accuracy, ~30 s on 2 cores)
// is DISABLED_ here; run it with
//   ./build/tests/forge_tests --gtest_filter='*ImageTraining*Full*' --gtest_also_run_disabled_tests
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "forge/data/idx.h"
#include "forge/forge.h"
#include "forge/nn/cnn.h"
#include "forge/telemetry/metrics.h"
#include "forge/train/trainer.h"
#include "testing/tensor_testing.h"
#include "train/train_testing.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using forge::testing::error_of;
using train_testing::Scratch;

bool have_fashion_mnist() { return data::missing_fashion_mnist_file(data::kFashionMnistDir).empty(); }

#define REQUIRE_FASHION_MNIST() \
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST not installed in " << data::kFashionMnistDir

double mean_of(const std::vector<double>& v, size_t begin, size_t end) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(begin), v.begin() + static_cast<std::ptrdiff_t>(end),
                         0.0) /
         static_cast<double>(end - begin);
}

// A lenet run in `root`/runs/<name> on the CPU: SGD with momentum and a cosine decay (the recipe
// of configs/fashion-mnist.toml) unless overridden.
std::string lenet_toml(const fs::path& root, const std::string& name) {
  return "[run]\nname = \"" + name + "\"\ndir = \"" + (root / "runs").string() +
         "\"\nseed = 0\ndevice = \"cpu\"\n"
         "[model]\ntype = \"lenet\"\n"
         "[data]\ndir = \"" + std::string(data::kFashionMnistDir) + "\"\n"
         "[optim]\nname = \"sgd\"\nlr = 0.025\nmomentum = 0.9\nweight_decay = 5e-4\ngrad_clip = 0.0\n"
         "[schedule]\nkind = \"cosine\"\n"
         "[train]\nepochs = 2\nbatch_size = 32\neval_batch_size = 1000\nlog_every = 100\n";
}

RunConfig lenet_config(const fs::path& root, const std::string& name, const std::vector<std::string>& overrides = {}) {
  return parse_config(lenet_toml(root, name), name + ".toml", overrides);
}

TrainResult train(const RunConfig& c, std::string* log_text = nullptr, const TrainOptions& opt = {}) {
  std::ostringstream log;
  TrainResult r = run_training(c, opt, log);
  if (log_text) *log_text = log.str();
  return r;
}

// 2000 training images, 1 epoch of 64-image batches (32 steps), 1000 test images, AdamW.
std::vector<std::string> smoke_overrides() {
  return {"--data.max_train_samples=2000", "--data.max_test_samples=1000", "--train.epochs=1",
          "--train.batch_size=64", "--optim.name=adamw", "--optim.lr=3e-3", "--optim.weight_decay=1e-2",
          "--schedule.kind=constant", "--train.log_every=10"};
}

TEST(ImageTraining, SmokeRunLearnsAndWritesMetricsAndCheckpoint) {
  REQUIRE_FASHION_MNIST();
  Scratch dir;
  const RunConfig c = lenet_config(dir.path(), "smoke", smoke_overrides());
  std::string text;
  const TrainResult r = train(c, &text);

  EXPECT_EQ(r.final_step, 32);  // ceil(2000 / 64)
  ASSERT_EQ(r.losses.size(), 32u);
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_NEAR(r.losses.front(), std::log(10.0), 0.3);  // a fresh classifier is close to uniform
  EXPECT_LT(mean_of(r.losses, 27, 32), mean_of(r.losses, 0, 5) - 0.5);
  ASSERT_TRUE(r.image.has_value());
  const ImageResult& im = *r.image;
  EXPECT_EQ(im.train_images, 2000);
  EXPECT_EQ(im.test_images, 1000);
  EXPECT_EQ(im.steps_per_epoch, 32);
  EXPECT_LT(im.final_train_loss, std::log(10.0));
  EXPECT_GT(im.test_accuracy, 0.5) << text;  // chance is 0.1
  ASSERT_EQ(im.epoch_test_accuracy.size(), 1u);
  EXPECT_EQ(im.epoch_test_accuracy[0], im.test_accuracy);
  ASSERT_EQ(r.evals.size(), 1u);
  EXPECT_EQ(r.evals[0].step, 32);
  EXPECT_EQ(r.evals[0].val_loss, im.test_loss);
  EXPECT_GT(r.seconds, 0.0);
  EXPECT_GT(im.images_per_s, 0.0);
  EXPECT_TRUE(std::isnan(r.final_val_loss));  // a language model's figure

  // Progress: lines at steps 1, 10, 20, 30 and at the end of the epoch, then the evaluation.
  EXPECT_NE(text.find("epoch 1/1 | step 10/32 | loss "), std::string::npos) << text;
  EXPECT_NE(text.find("epoch 1/1 | step 32/32 | loss "), std::string::npos) << text;
  EXPECT_NE(text.find("img/s"), std::string::npos) << text;
  EXPECT_EQ(text.find("MFU"), std::string::npos) << text;
  EXPECT_NE(text.find("epoch 1/1 done: train loss "), std::string::npos) << text;
  EXPECT_NE(text.find("test accuracy"), std::string::npos) << text;
  EXPECT_NE(text.find("2000 training / 1000 test images"), std::string::npos) << text;

  // metrics.jsonl: 5 step records (1, 10, 20, 30, 32), the epoch's evaluation, the final record;
  // and the final checkpoint's two (its stall, then its write: Note [async checkpoints]).
  std::vector<nlohmann::json> lines, checkpoint_lines;
  for (auto& j : telemetry::read_jsonl(fs::path(r.run_dir) / "metrics.jsonl"))
    (j.contains("checkpoint") || j.contains("checkpoint_write_s") ? checkpoint_lines : lines).push_back(std::move(j));
  ASSERT_EQ(lines.size(), 7u);
  ASSERT_EQ(checkpoint_lines.size(), 2u);
  EXPECT_EQ(checkpoint_lines[0].at("step").get<int64_t>(), 32);
  EXPECT_TRUE(checkpoint_lines[0].at("async").get<bool>());
  EXPECT_EQ(checkpoint_lines[1].at("step").get<int64_t>(), 32);
  EXPECT_GE(checkpoint_lines[1].at("checkpoint_write_s").get<double>(), 0.0);
  const std::vector<int64_t> logged_steps = {1, 10, 20, 30, 32};
  for (size_t i = 0; i < logged_steps.size(); ++i) {
    const auto& j = lines[i];
    EXPECT_EQ(j.at("step").get<int64_t>(), logged_steps[i]);
    EXPECT_EQ(j.at("epoch").get<int64_t>(), 1);
    EXPECT_DOUBLE_EQ(j.at("loss").get<double>(), r.losses[static_cast<size_t>(logged_steps[i] - 1)]);
    EXPECT_DOUBLE_EQ(j.at("lr").get<double>(), 3e-3);
    EXPECT_GT(j.at("images_per_s").get<double>(), 0.0);
    EXPECT_EQ(j.at("images").get<int64_t>(), std::min<int64_t>(logged_steps[i] * 64, 2000));
    EXPECT_TRUE(j.contains("elapsed_s"));
    EXPECT_TRUE(j.contains("grad_norm"));
    EXPECT_FALSE(j.contains("tokens_per_s"));
    EXPECT_FALSE(j.contains("mfu"));
  }
  const auto& epoch_line = lines[5];
  EXPECT_EQ(epoch_line.at("step").get<int64_t>(), 32);
  EXPECT_EQ(epoch_line.at("epoch").get<int64_t>(), 1);
  EXPECT_DOUBLE_EQ(epoch_line.at("test_accuracy").get<double>(), im.test_accuracy);
  EXPECT_DOUBLE_EQ(epoch_line.at("test_loss").get<double>(), im.test_loss);
  EXPECT_DOUBLE_EQ(epoch_line.at("train_loss").get<double>(), im.final_train_loss);
  const auto& final_line = lines[6];
  EXPECT_TRUE(final_line.at("final").get<bool>());
  EXPECT_DOUBLE_EQ(final_line.at("test_accuracy").get<double>(), im.test_accuracy);
  EXPECT_GT(final_line.at("images_per_s").get<double>(), 0.0);

  // The final checkpoint: LeNet's parameters, AdamW's moments, the config and the metrics.
  ASSERT_EQ(r.last_checkpoint, io::checkpoint_path(r.run_dir, 32).string());
  EXPECT_TRUE(fs::is_regular_file(fs::path(r.run_dir) / "config.toml"));
  const io::CheckpointData ck = io::load_checkpoint(r.last_checkpoint);
  EXPECT_EQ(ck.step, 32);
  nn::LeNet reference;
  ASSERT_EQ(ck.model.size(), reference.state_dict().size());
  for (const auto& [name, t] : reference.state_dict()) {
    ASSERT_TRUE(ck.model.contains(name)) << name;
    EXPECT_EQ(ck.model.at(name).shape(), t.shape()) << name;
  }
  EXPECT_TRUE(ck.optimizer.contains("state.0.exp_avg"));
  EXPECT_EQ(ck.config.at("optim").at("name"), "adamw");
  EXPECT_EQ(ck.config.at("train").at("batch_size"), 64);
  EXPECT_DOUBLE_EQ(ck.extra.at("test_accuracy").get<double>(), im.test_accuracy);
  EXPECT_GT(ck.extra.at("normalization").at("std").get<double>(), 0.0);
  EXPECT_EQ(ck.extra.at("images").get<int64_t>(), 2000);
  EXPECT_EQ(ck.data_loader.at("epoch"), 0);
  EXPECT_EQ(ck.data_loader.at("position"), 2000);

  // The saved weights are the trained ones: loaded into a fresh LeNet they classify the
  // (normalised) test images as well as the run reported.
  nn::LeNet restored;
  restored.load_state_dict(ck.model.items());
  restored.eval();
  data::FashionMnistOptions fo;
  fo.normalize = true;
  fo.mean = static_cast<float>(ck.extra.at("normalization").at("mean").get<double>());
  fo.std = static_cast<float>(ck.extra.at("normalization").at("std").get<double>());
  const data::ImageDataset test = data::load_fashion_mnist("test", fo);
  NoGradGuard no_grad;
  const Tensor logits = restored.forward(test.images.narrow(0, 0, 1000));
  const double acc = ops::sum(ops::eq(ops::argmax(logits, 1), test.labels.narrow(0, 0, 1000))).item<double>() / 1000.0;
  EXPECT_NEAR(acc, im.test_accuracy, 1e-9);
}

TEST(ImageTraining, SameSeedSameLosses) {
  REQUIRE_FASHION_MNIST();
  Scratch dir;
  // SGD with momentum, cosine schedule (the config's recipe), on a slice: 2 epochs x 10 steps.
  const std::vector<std::string> slice = {"--data.max_train_samples=640", "--data.max_test_samples=200",
                                          "--train.batch_size=64", "--run.seed=7"};
  const TrainResult a = train(lenet_config(dir.path(), "a", slice));
  const TrainResult b = train(lenet_config(dir.path(), "b", slice));
  ASSERT_EQ(a.losses.size(), 20u);
  EXPECT_EQ(a.losses, b.losses);  // bit for bit
  EXPECT_EQ(a.image->test_accuracy, b.image->test_accuracy);
  EXPECT_EQ(a.image->final_train_loss, b.image->final_train_loss);
  EXPECT_EQ(a.image->epoch_test_accuracy.size(), 2u);
  EXPECT_LT(mean_of(a.losses, 15, 20), mean_of(a.losses, 0, 5));

  auto other_seed = slice;
  other_seed.back() = "--run.seed=8";
  const TrainResult c = train(lenet_config(dir.path(), "c", other_seed));
  ASSERT_EQ(c.losses.size(), 20u);
  EXPECT_NE(a.losses, c.losses);
}

// Resumed from a checkpoint in the middle of the first epoch (step 7 of 10 per epoch), a run
// continues with the losses, the epochs' mean training losses, the test accuracies and the
// weights of the uninterrupted run, bit for bit (CPU).
TEST(ImageTraining, ResumeIsBitIdenticalToTheUninterruptedRun) {
  REQUIRE_FASHION_MNIST();
  Scratch dir;
  const std::vector<std::string> slice = {"--data.max_train_samples=630", "--data.max_test_samples=200",
                                          "--train.batch_size=64", "--train.log_every=1",
                                          "--checkpoint.every=7", "--checkpoint.keep_last=10"};
  const TrainResult full = train(lenet_config(dir.path(), "full", slice));
  ASSERT_EQ(full.losses.size(), 20u);  // 2 epochs of ceil(630 / 64) = 10 batches, the last of 54 images
  const fs::path ck7 = io::checkpoint_path(full.run_dir, 7);
  ASSERT_TRUE(fs::exists(ck7));

  std::string text;
  const TrainResult resumed = train(lenet_config(dir.path(), "resumed", slice), &text,
                                    {.resume = true, .resume_from = ck7.string()});
  EXPECT_NE(text.find("resume: from " + ck7.string() + " at step 7"), std::string::npos) << text;
  EXPECT_EQ(resumed.start_step, 7);
  EXPECT_EQ(resumed.final_step, 20);
  ASSERT_EQ(resumed.losses.size(), 13u);
  for (size_t i = 0; i < 13; ++i) EXPECT_EQ(resumed.losses[i], full.losses[i + 7]) << "step " << i + 8;
  EXPECT_EQ(resumed.image->epoch_test_accuracy, full.image->epoch_test_accuracy);
  EXPECT_EQ(resumed.image->test_loss, full.image->test_loss);
  EXPECT_EQ(resumed.image->final_train_loss, full.image->final_train_loss);
  // The first epoch's mean training loss spans the checkpoint (steps 1-7 before, 8-10 after).
  const auto epoch_records = [](const std::string& run_dir) {
    std::vector<double> v;
    for (const auto& j : telemetry::read_jsonl(fs::path(run_dir) / "metrics.jsonl"))
      if (j.contains("test_accuracy") && !j.contains("final")) v.push_back(j.at("train_loss").get<double>());
    return v;
  };
  EXPECT_EQ(epoch_records(resumed.run_dir), epoch_records(full.run_dir));
  const io::CheckpointData a = io::load_checkpoint(full.last_checkpoint), b = io::load_checkpoint(resumed.last_checkpoint);
  for (const auto& [name, t] : a.model) EXPECT_EQ(b.model.at(name).to_vector<float>(), t.to_vector<float>()) << name;

  // A checkpoint of other training images (another normalisation) is refused, naming the keys.
  auto other = slice;
  other.push_back("--data.max_train_samples=600");
  const std::string e = error_of([&] {
    train(lenet_config(dir.path(), "other", other), nullptr, {.resume = true, .resume_from = ck7.string()});
  });
  EXPECT_NE(e.find("data.max_train_samples"), std::string::npos) << e;
  EXPECT_NE(e.find("normalised with mean"), std::string::npos) << e;
  // And at the run's end: finished, nothing to do (raise train.epochs to go on).
  std::string end;
  const TrainResult done = train(lenet_config(dir.path(), "full", slice), &end, {.resume = true});
  EXPECT_TRUE(done.already_finished);
  EXPECT_NE(end.find("is at step 20 of 20; nothing to train (raise train.epochs"), std::string::npos) << end;
}

TEST(ImageTraining, RejectsBadKeysByName) {
  struct Case {
    std::vector<std::string> overrides;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--train.batch_size=0"}, "train.batch_size must be > 0, got 0"},
      {{"--train.epochs=-1"}, "train.epochs must be > 0, got -1"},
      {{"--train.eval_batch_size=0"}, "train.eval_batch_size must be > 0, got 0"},
      {{"--train.log_every=-5"}, "train.log_every must be > 0"},
      {{"--train.grad_accum=2"}, "train.grad_accum = 2: model.type = 'lenet' trains one batch"},
      {{"--data.max_train_samples=-1"}, "data.max_train_samples must be >= 0"},
      {{"--data.max_test_samples=-1"}, "data.max_test_samples must be >= 0"},
      {{"--model.type=resnet"}, "model.type = 'resnet' is not a model forge trains"},
      {{"--optim.name=adam"}, "optim.name = 'adam' is unknown; use \"adamw\" or \"sgd\""},
      {{"--optim.lr=0"}, "optim.lr must be > 0, got 0"},
      {{"--optim.lr=nan"}, "optim.lr"},
      {{"--optim.weight_decay=-0.1"}, "optim.weight_decay must be >= 0"},
      {{"--optim.grad_clip=-1"}, "optim.grad_clip must be >= 0"},
      {{"--optim.momentum=1.0"}, "optim.momentum must be in [0, 1), got 1"},
      {{"--optim.momentum=0", "--optim.nesterov=true"}, "optim.nesterov = true needs optim.momentum > 0"},
      {{"--optim.name=adamw", "--optim.beta1=1.0"}, "optim.beta1 must be in [0, 1), got 1"},
      {{"--optim.name=adamw", "--optim.beta2=-0.5"}, "optim.beta2 must be in [0, 1), got -0.5"},
      {{"--optim.name=adamw", "--optim.eps=0"}, "optim.eps must be > 0"},
      {{"--schedule.kind=step"}, "schedule.kind = 'step' is unknown"},
      {{"--schedule.warmup_steps=-1"}, "schedule.warmup_steps must be >= 0, got -1"},
      {{"--schedule.min_lr=1.0"}, "schedule.min_lr = 1 must be in [0, optim.lr = 0.025]"},
      {{"--data.dir="}, "data.dir is empty"},
      {{"--run.dtype=bf16"}, "run.dtype = 'bf16': model.type = 'lenet' trains in f32"},
      {{"--dist.zero_stage=3"}, "dist.zero_stage = 3 shards the blocks of a GPT or LLaMA"},
  };
  for (const auto& c : cases) {
    const std::string e = error_of([&] { lenet_config("/tmp", "x", c.overrides); });
    EXPECT_NE(e.find(c.message), std::string::npos) << "expected \"" << c.message << "\" in \"" << e << "\"";
  }
  // Momentum and Nesterov belong to SGD: AdamW ignores them.
  if (have_fashion_mnist()) {
    EXPECT_EQ(error_of([&] {
                lenet_config("/tmp", "x", {"--optim.name=adamw", "--optim.momentum=5", "--optim.nesterov=true"});
              }),
              "<no error>");
  }
}

TEST(ImageTraining, MissingDataNamesThePathAndThePackage) {
  Scratch dir;
  const fs::path nowhere = dir.path() / "nowhere";
  const std::string e = error_of([&] { lenet_config(dir.path(), "run", {"--data.dir=" + nowhere.string()}); });
  EXPECT_NE(e.find("data.dir"), std::string::npos) << e;
  EXPECT_NE(e.find((nowhere / "train-images-idx3-ubyte.gz").string()), std::string::npos) << e;
  EXPECT_NE(e.find("dataset-fashion-mnist"), std::string::npos) << e;
  // run_training checks the config again before any work: nothing is created or logged.
  RunConfig c;
  c.model.type = "lenet";
  c.run.dir = (dir.path() / "runs").string();
  c.data.dir = nowhere.string();
  std::ostringstream log;
  const std::string e2 = error_of([&] { run_training(c, {}, log); });
  EXPECT_NE(e2.find((nowhere / "train-images-idx3-ubyte.gz").string()), std::string::npos) << e2;
  EXPECT_FALSE(fs::exists(dir.path() / "runs"));
  EXPECT_EQ(log.str(), "");
}

TEST(ImageTraining, RunDirThatIsAFileIsRejected) {
  REQUIRE_FASHION_MNIST();
  Scratch dir;
  fs::create_directories(dir.path() / "runs");
  const fs::path file = dir.path() / "runs" / "a_file";
  std::ofstream(file) << "x";
  const std::string e = error_of([&] { train(lenet_config(dir.path(), "a_file")); });
  EXPECT_NE(e.find("run.dir: the run directory '" + file.string() + "' exists and is not a directory"),
            std::string::npos)
      << e;
}

TEST(ImageTraining, KeysThatDependOnTheDataAreCheckedBeforeTraining) {
  REQUIRE_FASHION_MNIST();
  Scratch dir;
  std::string text;
  const std::string e = error_of([&] {
    train(lenet_config(dir.path(), "warmup",
                       {"--data.max_train_samples=100", "--data.max_test_samples=100", "--train.batch_size=50",
                        "--schedule.warmup_steps=5"}),  // the run has only 4 steps
          &text);
  });
  EXPECT_NE(e.find("schedule.warmup_steps (5) must not exceed the run's 4 steps (train.epochs 2 x 2 batches of 50)"),
            std::string::npos)
      << e;
  EXPECT_FALSE(fs::exists(dir.path() / "runs" / "warmup" / "metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir.path() / "runs" / "warmup" / "checkpoints"));

  const std::string e2 = error_of([&] {
    train(lenet_config(dir.path(), "too_many", {"--data.max_test_samples=20000"}));
  });
  EXPECT_NE(e2.find("data.max_test_samples is 20000 but the dataset has only 10000 images"), std::string::npos) << e2;
}

// The recipe of configs/fashion-mnist.toml (lenet_toml's keys) on all 60000 images.
TEST(ImageTraining, DISABLED_FullConfigReaches88Percent) {
  REQUIRE_FASHION_MNIST();
  Scratch dir;
  const TrainResult r = run_training(lenet_config(dir.path(), "full", {"--train.log_every=250"}), {}, std::cout);
  EXPECT_EQ(r.final_step, 3750);
  EXPECT_GE(r.image->test_accuracy, 0.88);
}

}  // namespace
}  // namespace forge::train
