// The image-classification training loop (contract in image_trainer.h).
#include "forge/train/image_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/data/idx.h"
#include "forge/io/checkpoint.h"
#include "forge/nn/cnn.h"
#include "forge/ops/binary.h"
#include "forge/ops/loss.h"
#include "forge/ops/reduce.h"
#include "forge/ops/view.h"
#include "forge/optim/adamw.h"
#include "forge/optim/clip.h"
#include "forge/optim/schedule.h"
#include "forge/optim/sgd.h"

namespace forge::train {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

// The shuffling stream is seeded apart from the model's initialisation (which uses `seed`
// itself), so that changing one never shifts the other.
constexpr uint64_t kDataSeedSalt = 0x9e3779b97f4a7c15ULL;

constexpr const char* kDataFiles[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                                      "t10k-labels-idx1-ubyte"};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

optim::ScheduleKind schedule_kind(const std::string& name) {
  if (name == "cosine") return optim::ScheduleKind::cosine;
  if (name == "linear") return optim::ScheduleKind::linear;
  return optim::ScheduleKind::constant;
}

json options_json(const ImageTrainOptions& o) {
  return json{
      {"data",
       {{"dir", o.data_dir}, {"max_train_samples", o.max_train_samples}, {"max_test_samples", o.max_test_samples}}},
      {"model", {{"type", o.model}}},
      {"optim",
       {{"name", o.optimizer},
        {"lr", o.lr},
        {"momentum", o.momentum},
        {"nesterov", o.nesterov},
        {"beta1", o.beta1},
        {"beta2", o.beta2},
        {"eps", o.eps},
        {"weight_decay", o.weight_decay},
        {"grad_clip", o.grad_clip}}},
      {"schedule", {{"kind", o.schedule}, {"warmup_steps", o.warmup_steps}, {"min_lr", o.min_lr}}},
      {"train",
       {{"epochs", o.epochs},
        {"batch_size", o.batch_size},
        {"eval_batch_size", o.eval_batch_size},
        {"log_every", o.log_every}}},
      {"run", {{"seed", o.seed}, {"dir", o.run_dir}}}};
}

// The first `n` items of a dataset (all of them when n is 0), as their own contiguous copy.
data::ImageDataset take_first(data::ImageDataset ds, int64_t n, const char* key) {
  if (n == 0 || n == ds.size()) return ds;
  FORGE_CHECK(n <= ds.size(), key, " is ", n, " but the dataset has only ", ds.size(), " images");
  ds.images = ds.images.narrow(0, 0, n).clone();
  ds.labels = ds.labels.narrow(0, 0, n).clone();
  return ds;
}

struct Normalization {
  double mean = 0.0;
  double std = 1.0;
};

// Mean and (population) standard deviation of every pixel of `images` (f32, contiguous).
Normalization pixel_statistics(const Tensor& images) {
  const float* p = images.data<float>();
  const int64_t n = images.numel();
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += p[i];
  const double mean = sum / static_cast<double>(n);
  double sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sq += (p[i] - mean) * (p[i] - mean);
  return {mean, std::sqrt(sq / static_cast<double>(n))};
}

// (x - mean) / std in f32, rounded exactly as data::load_fashion_mnist's `normalize` does, so
// that a checkpoint's recorded mean/std reproduce the training inputs bit for bit.
void normalize_in_place(Tensor& images, const Normalization& norm) {
  float* p = images.data<float>();
  const auto mean = static_cast<float>(norm.mean);
  const float inv = 1.0f / static_cast<float>(norm.std);
  const int64_t n = images.numel();
  for (int64_t i = 0; i < n; ++i) p[i] = (p[i] - mean) * inv;
}

struct Evaluation {
  double accuracy = 0.0;
  double loss = 0.0;
};

// Accuracy and mean cross-entropy over the whole set, in batches of `batch_size`.
Evaluation evaluate(nn::LeNet& model, const data::ImageDataset& ds, int64_t batch_size) {
  model.eval();
  NoGradGuard no_grad;
  int64_t correct = 0;
  double loss_sum = 0.0;
  const int64_t n = ds.size();
  for (int64_t start = 0; start < n; start += batch_size) {
    const int64_t len = std::min(batch_size, n - start);
    const Device device = model.parameters().front().device();
    const Tensor x = ds.images.narrow(0, start, len).to(device);  // (len, 1, 28, 28)
    const Tensor y = ds.labels.narrow(0, start, len).to(device);  // (len)
    const Tensor logits = model.forward(x);            // (len, 10)
    loss_sum += ops::cross_entropy(logits, y, -100, ops::Reduction::sum).item<double>();
    correct += ops::sum(ops::eq(ops::argmax(logits, 1), y)).item<int64_t>();
  }
  model.train();
  return {static_cast<double>(correct) / static_cast<double>(n), loss_sum / static_cast<double>(n)};
}

std::unique_ptr<optim::Optimizer> make_optimizer(const ImageTrainOptions& o, const nn::Module& model) {
  auto groups = optim::decay_groups(model.named_parameters(), o.weight_decay);
  if (o.optimizer == "adamw")
    return std::make_unique<optim::AdamW>(
        std::move(groups),
        optim::AdamWOptions{
            .lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay});
  return std::make_unique<optim::SGD>(
      std::move(groups),
      optim::SGDOptions{.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay, .nesterov = o.nesterov});
}

// Appends JSON lines to <run_dir>/metrics.jsonl (or does nothing without a run dir).
class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& run_dir) {
    if (run_dir.empty()) return;
    path_ = (fs::path(run_dir) / "metrics.jsonl").string();
    out_.open(path_, std::ios::out | std::ios::trunc);
    FORGE_CHECK(out_.good(), "train: cannot write '", path_, "' (run.dir '", run_dir, "')");
  }
  void write(const json& line) {
    if (path_.empty()) return;
    out_ << line.dump() << '\n';
    out_.flush();
    FORGE_CHECK(out_.good(), "train: writing '", path_, "' failed (disk full?)");
  }

 private:
  std::string path_;
  std::ofstream out_;
};

std::string printf_string(const char* fmt, auto... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

}  // namespace

void validate_image_train_options(const ImageTrainOptions& o) {
  auto finite = [](double v) { return std::isfinite(v); };
  FORGE_CHECK(o.model == "lenet", "model.type must be \"lenet\" (the only image model so far), got \"", o.model, "\"");
  FORGE_CHECK(o.epochs > 0, "train.epochs must be positive, got ", o.epochs);
  FORGE_CHECK(o.batch_size > 0, "train.batch_size must be positive, got ", o.batch_size);
  FORGE_CHECK(o.eval_batch_size > 0, "train.eval_batch_size must be positive, got ", o.eval_batch_size);
  FORGE_CHECK(o.log_every >= 0, "train.log_every must be >= 0 (0 logs once per epoch), got ", o.log_every);
  FORGE_CHECK(o.max_train_samples >= 0, "data.max_train_samples must be >= 0 (0 = all), got ", o.max_train_samples);
  FORGE_CHECK(o.max_test_samples >= 0, "data.max_test_samples must be >= 0 (0 = all), got ", o.max_test_samples);
  FORGE_CHECK(o.optimizer == "sgd" || o.optimizer == "adamw", "optim.name must be \"sgd\" or \"adamw\", got \"",
              o.optimizer, "\"");
  FORGE_CHECK(finite(o.lr) && o.lr > 0, "optim.lr must be positive and finite, got ", o.lr);
  FORGE_CHECK(finite(o.weight_decay) && o.weight_decay >= 0, "optim.weight_decay must be >= 0 and finite, got ",
              o.weight_decay);
  FORGE_CHECK(finite(o.grad_clip) && o.grad_clip >= 0, "optim.grad_clip must be >= 0 (0 = no clipping), got ",
              o.grad_clip);
  if (o.optimizer == "sgd") {
    FORGE_CHECK(finite(o.momentum) && o.momentum >= 0 && o.momentum < 1, "optim.momentum must be in [0, 1), got ",
                o.momentum);
    FORGE_CHECK(!o.nesterov || o.momentum > 0, "optim.nesterov needs optim.momentum > 0, got momentum ", o.momentum);
  } else {
    FORGE_CHECK(finite(o.beta1) && o.beta1 >= 0 && o.beta1 < 1, "optim.beta1 must be in [0, 1), got ", o.beta1);
    FORGE_CHECK(finite(o.beta2) && o.beta2 >= 0 && o.beta2 < 1, "optim.beta2 must be in [0, 1), got ", o.beta2);
    FORGE_CHECK(finite(o.eps) && o.eps > 0, "optim.eps must be positive and finite, got ", o.eps);
  }
  FORGE_CHECK(o.schedule == "constant" || o.schedule == "cosine" || o.schedule == "linear",
              "schedule.kind must be \"constant\", \"cosine\" or \"linear\", got \"", o.schedule, "\"");
  FORGE_CHECK(o.warmup_steps >= 0, "schedule.warmup_steps must be >= 0, got ", o.warmup_steps);
  FORGE_CHECK(finite(o.min_lr) && o.min_lr >= 0 && o.min_lr <= o.lr, "schedule.min_lr must be in [0, optim.lr = ", o.lr,
              "], got ", o.min_lr);
  if (!o.run_dir.empty()) {
    std::error_code ec;
    FORGE_CHECK(!fs::exists(o.run_dir, ec) || fs::is_directory(o.run_dir, ec), "run.dir: '", o.run_dir,
                "' exists and is not a directory");
  }
  FORGE_CHECK(!o.data_dir.empty(), "data.dir is empty; set it to the Fashion-MNIST directory (", data::kFashionMnistDir,
              ", from the Debian package dataset-fashion-mnist)");
  for (const char* name : kDataFiles) {
    const fs::path base = fs::path(o.data_dir) / name;
    const std::string gz = base.string() + ".gz";
    FORGE_CHECK(fs::is_regular_file(gz) || fs::is_regular_file(base), "data.dir: Fashion-MNIST file '", gz, "' (or '",
                base.string(),
                "') not found; install the Debian package dataset-fashion-mnist "
                "(apt-get install dataset-fashion-mnist) or point data.dir at a directory holding ",
                "{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]");
  }
}

ImageTrainResult train_image_classifier(const ImageTrainOptions& opt, std::ostream& log) {
  const auto t_start = Clock::now();
  validate_image_train_options(opt);

  // ---- data ------------------------------------------------------------------------------
  data::FashionMnistOptions data_opt;
  data_opt.dir = opt.data_dir;
  data_opt.normalize = false;  // normalised below with the statistics of the images actually used
  data::ImageDataset train_set =
      take_first(data::load_fashion_mnist("train", data_opt), opt.max_train_samples, "data.max_train_samples");
  data::ImageDataset test_set =
      take_first(data::load_fashion_mnist("test", data_opt), opt.max_test_samples, "data.max_test_samples");
  FORGE_CHECK(train_set.size() > 0 && test_set.size() > 0, "data.dir: the Fashion-MNIST files in '", opt.data_dir,
              "' hold ", train_set.size(), " training and ", test_set.size(), " test images; both must be non-empty");
  const Normalization norm = pixel_statistics(train_set.images);
  FORGE_CHECK(norm.std > 0, "train: the training images in '", opt.data_dir, "' are all equal (std 0)");
  normalize_in_place(train_set.images, norm);
  normalize_in_place(test_set.images, norm);
  const int64_t n_train = train_set.size();
  const int64_t n_test = test_set.size();

  data::ImageBatches batches(train_set, opt.batch_size, opt.seed ^ kDataSeedSalt, /*shuffle=*/true,
                             /*drop_last=*/false, opt.epochs);
  const int64_t steps_per_epoch = batches.batches_per_epoch();
  const int64_t total_steps = steps_per_epoch * opt.epochs;
  FORGE_CHECK(opt.warmup_steps <= total_steps, "schedule.warmup_steps (", opt.warmup_steps,
              ") must not exceed the run's ", total_steps, " steps (train.epochs ", opt.epochs, " x ", steps_per_epoch,
              " batches of ", opt.batch_size, ")");

  // ---- model, optimizer, schedule ----------------------------------------------------------
  nn::LeNet model(train_set.num_classes, opt.seed);
  model.to(opt.device);
  model.train();
  std::unique_ptr<optim::Optimizer> optimizer = make_optimizer(opt, model);
  const optim::LRSchedule schedule{.kind = schedule_kind(opt.schedule),
                                   .lr = opt.lr,
                                   .min_lr = opt.min_lr,
                                   .warmup_steps = opt.warmup_steps,
                                   .total_steps = total_steps};
  schedule.validate();
  const std::vector<Tensor> params = model.parameters();

  if (!opt.run_dir.empty()) {
    std::error_code ec;
    fs::create_directories(opt.run_dir, ec);
    FORGE_CHECK(!ec, "run.dir: cannot create '", opt.run_dir, "': ", ec.message());
  }
  MetricsWriter metrics(opt.run_dir);

  log << "train: LeNet (" << model.num_parameters() << " parameters) on " << n_train << " training / " << n_test
      << " test images from " << opt.data_dir << "\n"
      << printf_string("train: pixels normalised with mean %.4f std %.4f; %s lr %.3g (%s), weight_decay %.3g; ",
                       norm.mean, norm.std, opt.optimizer.c_str(), opt.lr, opt.schedule.c_str(), opt.weight_decay)
      << opt.epochs << " epochs x " << steps_per_epoch << " steps of " << opt.batch_size << " images\n";

  // ---- training -----------------------------------------------------------------------------
  ImageTrainResult result;
  result.losses.reserve(static_cast<size_t>(total_steps));
  double train_seconds = 0.0;
  int64_t step = 0;
  Evaluation eval;
  for (int64_t epoch = 0; epoch < opt.epochs; ++epoch) {
    double epoch_loss_sum = 0.0;  // sum over batches of loss * rows
    int64_t epoch_images = 0;
    auto window_start = Clock::now();
    int64_t window_images = 0;
    const auto epoch_start = Clock::now();
    for (int64_t b = 0; b < steps_per_epoch; ++b) {
      std::optional<data::Batch> batch = batches.next();
      FORGE_CHECK(batch.has_value(), "train: the data ran out at step ", step, " (epoch ", epoch + 1, ")");
      const int64_t rows = batch->inputs.size(0);
      const double lr = schedule.lr_at(step);
      schedule.apply(*optimizer, step);

      const Tensor logits = model.forward(batch->inputs.to(opt.device));              // (B, 10)
      const Tensor loss = ops::cross_entropy(logits, batch->targets.to(opt.device));  // mean over the batch
      loss.backward();
      if (opt.grad_clip > 0) optim::clip_grad_norm(params, opt.grad_clip);
      optimizer->step();
      optimizer->zero_grad();

      const double loss_value = loss.item<double>();
      FORGE_CHECK(std::isfinite(loss_value), "train: the loss became ", loss_value, " at step ", step + 1, " (epoch ",
                  epoch + 1, ", lr ", lr, "); lower optim.lr or set optim.grad_clip");
      result.losses.push_back(loss_value);
      epoch_loss_sum += loss_value * static_cast<double>(rows);
      epoch_images += rows;
      window_images += rows;
      ++step;

      if (opt.log_every > 0 && (step % opt.log_every == 0 || b + 1 == steps_per_epoch)) {
        const double window_s = seconds_since(window_start);
        const double images_per_s = window_s > 0 ? static_cast<double>(window_images) / window_s : 0.0;
        const double elapsed = train_seconds + seconds_since(epoch_start);  // training steps only
        const double eta = elapsed / static_cast<double>(step) * static_cast<double>(total_steps - step);
        log << printf_string("epoch %lld/%lld  step %lld/%lld  loss %.4f  lr %.2e  %.0f img/s  %.1f s  eta %.0f s\n",
                             static_cast<long long>(epoch + 1), static_cast<long long>(opt.epochs),
                             static_cast<long long>(step), static_cast<long long>(total_steps), loss_value, lr,
                             images_per_s, elapsed, eta)
            << std::flush;
        metrics.write(json{{"step", step},
                           {"epoch", epoch + 1},
                           {"loss", loss_value},
                           {"lr", lr},
                           {"images_per_s", images_per_s},
                           {"elapsed_s", elapsed}});
        window_start = Clock::now();
        window_images = 0;
      }
    }
    train_seconds += seconds_since(epoch_start);
    result.final_train_loss = epoch_loss_sum / static_cast<double>(epoch_images);

    eval = evaluate(model, test_set, opt.eval_batch_size);
    result.epoch_test_accuracy.push_back(eval.accuracy);
    log << printf_string(
               "epoch %lld/%lld done: train loss %.4f  test loss %.4f  test accuracy %.2f%%  (%.1f s in all)\n",
               static_cast<long long>(epoch + 1), static_cast<long long>(opt.epochs), result.final_train_loss,
               eval.loss, 100.0 * eval.accuracy, seconds_since(t_start))
        << std::flush;
    metrics.write(json{{"step", step},
                       {"epoch", epoch + 1},
                       {"train_loss", result.final_train_loss},
                       {"test_loss", eval.loss},
                       {"test_accuracy", eval.accuracy},
                       {"elapsed_s", seconds_since(t_start)}});
  }

  result.steps = step;
  result.test_accuracy = eval.accuracy;
  result.test_loss = eval.loss;
  result.train_seconds = train_seconds;
  result.images_per_s = train_seconds > 0 ? static_cast<double>(n_train * opt.epochs) / train_seconds : 0.0;

  // ---- final checkpoint ---------------------------------------------------------------------
  if (!opt.run_dir.empty()) {
    io::CheckpointData ck;
    ck.step = step;
    ck.model = model.state_dict();
    const optim::StateDict osd = optimizer->state_dict();
    std::vector<std::pair<std::string, Tensor>> opt_tensors(osd.tensors.begin(), osd.tensors.end());
    ck.optimizer = std::move(opt_tensors);
    io::capture_rng(ck);
    ck.data_loader = json::parse(batches.state().to_json());
    ck.config = options_json(opt);
    ck.extra = json{{"optimizer", optimizer->name()},
                    {"optimizer_scalars", osd.scalars},
                    {"normalization", {{"mean", norm.mean}, {"std", norm.std}}},
                    {"test_accuracy", eval.accuracy},
                    {"test_loss", eval.loss},
                    {"final_train_loss", result.final_train_loss}};
    const fs::path dir = io::checkpoint_path(opt.run_dir, step);
    io::save_checkpoint(dir, ck);
    result.checkpoint = dir.string();
    log << "train: checkpoint saved to " << result.checkpoint << "\n";
  }
  result.seconds = seconds_since(t_start);
  log << printf_string("train: %lld steps in %.1f s (%.0f img/s training), test accuracy %.2f%%\n",
                       static_cast<long long>(step), result.seconds, result.images_per_s, 100.0 * result.test_accuracy)
      << std::flush;
  return result;
}

}  // namespace forge::train
