// The task of image classification (model.type = "lenet"; train/task.h): LeNet on Fashion-MNIST.
// What the loop does with it: train/trainer.h.
//
//   data      the IDX files of data.dir (data/idx.h), the first data.max_train_samples /
//             data.max_test_samples images of each set, both normalised to (x - mean) / std with
//             the mean and standard deviation of the training images used (recorded in every
//             checkpoint; a resume must find the same);
//   batches   data::ImageBatches over the training images: batches of train.batch_size, the last
//             of an epoch smaller when batch_size does not divide N, reshuffled every epoch from
//             run.seed's data stream; train.epochs x ceil(N / batch_size) steps;
//   model     nn::LeNet initialised from run.seed, in f32;
//   evaluate  after every epoch: the mean cross-entropy and the accuracy over the whole test set,
//             in batches of train.eval_batch_size, with the mean training loss of the epoch's
//             batches (image-weighted);
//   units     images (images per second; no MFU).
#include <cmath>
#include <cstdio>
#include <limits>
#include <ostream>
#include <string>

#include "forge/core/error.h"
#include "forge/data/idx.h"
#include "forge/nn/cnn.h"
#include "forge/telemetry/metrics.h"
#include "forge/run/run_data.h"
#include "forge/train/task.h"

namespace forge::train {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string printf_string(const char* fmt, auto... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

// The first `n` items of a dataset (all of them when n is 0), as their own contiguous copy.
data::ImageDataset take_first(data::ImageDataset ds, int64_t n, const char* key) {
  if (n == 0 || n == ds.size()) return ds;
  FORGE_CHECK(n <= ds.size(), key, " is ", n, " but the dataset has only ", ds.size(), " images; lower ", key,
              " (0 = all)");
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

class ImageTask final : public Task {
 public:
  ImageTask(RunConfig& cfg, const parallel::Layout& layout) : cfg_(cfg), dp_(layout.dp) {}

  Units units() const override { return {"images", "img"}; }
  DType compute_dtype(Device) const override { return DType::f32; }  // the config refuses other dtypes

  void prepare_data(const std::optional<io::CheckpointData>&, const fs::path&, std::ostream&) override {
    data::FashionMnistOptions o;
    o.dir = cfg_.data.dir;
    o.normalize = false;  // normalised below with the statistics of the images actually used
    train_set_ =
        take_first(data::load_fashion_mnist("train", o), cfg_.data.max_train_samples, "data.max_train_samples");
    test_set_ = take_first(data::load_fashion_mnist("test", o), cfg_.data.max_test_samples, "data.max_test_samples");
    FORGE_CHECK(train_set_.size() > 0 && test_set_.size() > 0, "data.dir: the Fashion-MNIST files in '", o.dir,
                "' hold ", train_set_.size(), " training and ", test_set_.size(),
                " test images; both must be non-empty");
    norm_ = pixel_statistics(train_set_.images);
    FORGE_CHECK(norm_.std > 0, "data.dir: the training images in '", o.dir, "' are all equal (std 0)");
    normalize_in_place(train_set_.images, norm_);
    normalize_in_place(test_set_.images, norm_);

    const int64_t n = train_set_.size(), B = cfg_.train.batch_size;
    steps_per_epoch_ = (n + B - 1) / B;
    FORGE_CHECK(cfg_.schedule.warmup_steps <= total_steps(), "schedule.warmup_steps (", cfg_.schedule.warmup_steps,
                ") must not exceed the run's ", total_steps(), " steps (train.epochs ", cfg_.train.epochs, " x ",
                steps_per_epoch_, " batches of ", B, "); lower schedule.warmup_steps");
    // Note [uneven rows]: the last batch of an epoch is split over the ranks as evenly as it goes;
    // each needs a row of it.
    const int64_t rest = n % B;
    FORGE_CHECK(rest == 0 || rest >= dp_, "data.max_train_samples: ", n, " training images in batches of ", B,
                " leave a last batch of ", rest, " image(s) in each epoch, fewer than the ", dp_,
                " data-parallel ranks; choose data.max_train_samples (or train.batch_size) so that N mod batch_size is "
                "0 or >= ", dp_);
  }

  Model& model() override {
    if (!model_.module) {
      auto lenet = std::make_shared<nn::LeNet>(train_set_.num_classes, static_cast<uint64_t>(cfg_.run.seed));
      model_.forward = [l = lenet.get()](const Tensor& x) { return l->forward(x); };  // (B, 1, 28, 28) -> (B, classes)
      model_.set_block_hooks = [](std::shared_ptr<nn::BlockHooks>) {};               // no blocks
      model_.block_of = [](const std::string&) { return -1; };
      model_.module = lenet;
    }
    return model_;
  }

  void check_resume(const io::CheckpointData& ck, const fs::path& ck_path) const override {
    FORGE_CHECK(ck.step < total_steps(), "--resume: checkpoint '", ck_path.string(), "' is at step ", ck.step,
                ", and the run has ", total_steps(), " steps (train.epochs ", cfg_.train.epochs, " x ",
                steps_per_epoch_,
                " batches); raise train.epochs to train further");
    const json& n = ck.extra.is_object() && ck.extra.contains("normalization") ? ck.extra["normalization"] : json();
    FORGE_CHECK(n.is_object() && n.value("mean", 0.0) == norm_.mean && n.value("std", 0.0) == norm_.std,
                "--resume: checkpoint '", ck_path.string(), "' was trained on images normalised with ",
                n.is_object() ? printf_string("mean %.6f std %.6f", n.value("mean", 0.0), n.value("std", 0.0))
                              : std::string("another normalisation"),
                ", but this run's training images give mean ", printf_string("%.6f std %.6f", norm_.mean, norm_.std),
                "; resume with the [data] keys (data.dir, data.max_train_samples) the checkpoint was trained with");
  }

  std::unique_ptr<data::BatchSource> train_batches(std::ostream&) override {
    return std::make_unique<data::ImageBatches>(train_set_, cfg_.train.batch_size,
                                                static_cast<uint64_t>(cfg_.run.seed) ^ kDataSeedSalt,
                                                /*shuffle=*/true, /*drop_last=*/false, cfg_.train.epochs);
  }

  void restore(const io::CheckpointData& ck) override {
    if (!ck.extra.is_object() || !ck.extra.contains("epoch_sums")) return;
    const json& s = ck.extra["epoch_sums"];
    sums_epoch_ = s.value("epoch", int64_t{-1});
    epoch_loss_sum_ = s.value("loss_sum", 0.0);
    epoch_images_ = s.value("images", int64_t{0});
  }

  int64_t micro_batches_per_step() const override { return 1; }
  int64_t total_steps() const override { return cfg_.train.epochs * steps_per_epoch_; }

  std::string describe() const override {
    return "model: lenet, " + telemetry::format_count(static_cast<double>(model_.module->num_parameters())) +
           " parameters (2 convolutions, 3 linear layers, " + std::to_string(train_set_.num_classes) + " classes)\n" +
           "data: " + std::to_string(train_set_.size()) + " training / " + std::to_string(test_set_.size()) +
           " test images from " + cfg_.data.dir +
           printf_string(", pixels normalised with mean %.4f std %.4f; ", norm_.mean, norm_.std) + "batch " +
           std::to_string(cfg_.train.batch_size) + " images per step, " + std::to_string(steps_per_epoch_) +
           " steps per epoch x " + std::to_string(cfg_.train.epochs) +
           (cfg_.train.epochs == 1 ? " epoch\n" : " epochs\n");
  }

  std::optional<double> flops_per_unit() const override { return std::nullopt; }
  std::optional<EpochPlace> epoch_of(int64_t step) const override {
    return EpochPlace{(step - 1) / steps_per_epoch_ + 1, cfg_.train.epochs, step % steps_per_epoch_ == 0};
  }

  void on_step(int64_t step, double loss, int64_t units) override {
    const int64_t e = (step - 1) / steps_per_epoch_;
    if (e != sums_epoch_) sums_epoch_ = e, epoch_loss_sum_ = 0.0, epoch_images_ = 0;
    epoch_loss_sum_ += loss * static_cast<double>(units);
    epoch_images_ += units;
  }

  bool eval_due(int64_t step) const override { return step % steps_per_epoch_ == 0; }

  Evaluation evaluate(Strategy& strategy, int64_t step) override {
    const int64_t epoch = (step - 1) / steps_per_epoch_ + 1;
    data::ImageBatches test(test_set_, cfg_.train.eval_batch_size, 0, /*shuffle=*/false, /*drop_last=*/false, 1);
    const EvalSums sums = strategy.evaluate(test, 0, /*count_correct=*/true);
    test_loss_ = sums.mean_loss();
    test_accuracy_ = sums.accuracy();
    train_loss_ = sums_epoch_ == epoch - 1 && epoch_images_ > 0
                      ? epoch_loss_sum_ / static_cast<double>(epoch_images_)
                      : std::numeric_limits<double>::quiet_NaN();
    epoch_accuracy_.push_back(test_accuracy_);
    evaluated_ = true;
    return {test_loss_,
            json{{"epoch", epoch},
                 {"train_loss", train_loss_},
                 {"test_loss", test_loss_},
                 {"test_accuracy", test_accuracy_}},
            printf_string("epoch %lld/%lld done: train loss %.4f | test loss %.4f | test accuracy %.2f%%",
                          static_cast<long long>(epoch), static_cast<long long>(cfg_.train.epochs), train_loss_,
                          test_loss_, 100.0 * test_accuracy_)};
  }

  json checkpoint_extra() const override {
    json extra = {{"data", "fashion-mnist"},
                  {"normalization", {{"mean", norm_.mean}, {"std", norm_.std}}},
                  {"epoch_sums", {{"epoch", sums_epoch_}, {"loss_sum", epoch_loss_sum_}, {"images", epoch_images_}}}};
    if (evaluated_) {
      extra["test_accuracy"] = test_accuracy_;
      extra["test_loss"] = test_loss_;
      extra["final_train_loss"] = train_loss_;
    }
    return extra;
  }

  void finish(Strategy&, bool evaluates, int64_t step, double units_per_s, TrainResult& result, json& final_record,
              std::ostream& log) override {
    ImageResult r;
    r.images_per_s = units_per_s;
    r.train_images = train_set_.size();
    r.test_images = test_set_.size();
    r.steps_per_epoch = steps_per_epoch_;
    r.epoch_test_accuracy = epoch_accuracy_;
    if (evaluates && evaluated_) {
      r.test_accuracy = test_accuracy_;
      r.test_loss = test_loss_;
      r.final_train_loss = train_loss_;
      final_record["test_accuracy"] = test_accuracy_;
      final_record["test_loss"] = test_loss_;
      log << printf_string("test accuracy %.2f%%, test loss %.4f (step %lld)", 100.0 * test_accuracy_, test_loss_,
                           static_cast<long long>(step))
          << std::endl;
    }
    result.image = std::move(r);
  }

 private:
  RunConfig& cfg_;
  const int64_t dp_;
  data::ImageDataset train_set_, test_set_;
  Normalization norm_;
  int64_t steps_per_epoch_ = 1;
  Model model_;
  // The running sums of the epoch `sums_epoch_` (0-based) over the steps read so far.
  int64_t sums_epoch_ = -1;
  double epoch_loss_sum_ = 0.0;
  int64_t epoch_images_ = 0;
  // The last evaluation.
  bool evaluated_ = false;
  double test_accuracy_ = 0.0, test_loss_ = 0.0, train_loss_ = 0.0;
  std::vector<double> epoch_accuracy_;
};

}  // namespace

std::unique_ptr<Task> make_image_task(RunConfig& cfg, const parallel::Layout& layout, bool) {
  return std::make_unique<ImageTask>(cfg, layout);
}

}  // namespace forge::train
