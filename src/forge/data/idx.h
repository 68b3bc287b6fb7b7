#pragma once
// IDX files (the MNIST / Fashion-MNIST format) and Fashion-MNIST mini-batches.
//
// IDX format (big-endian): bytes 0-1 zero, byte 2 the element type (0x08 = unsigned byte,
// the only type read here), byte 3 the number of dimensions d, then d u32 sizes, then the
// elements row-major. Image files are IDX3 ubyte (magic 0x00000803: N, rows, cols), label
// files IDX1 ubyte (magic 0x00000801: N). Files may be gzip-compressed (detected by
// content, not by name) or plain. Every mismatch — magic, element type, number of
// dimensions, a file shorter or longer than its header says, a corrupt gzip stream, images
// and labels of different counts, a label outside [0, num_classes) — is a forge::Error
// that names the file.
//
// Fashion-MNIST (Debian package dataset-fashion-mnist) lives in
// /usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz:
// 60000 training and 10000 test 28x28 grey images in 10 classes. Images load as f32
// (N, 1, 28, 28) in [0, 1] (pixel / 255), optionally normalised to (x - mean) / std;
// labels as i64 (N).
//
// ImageBatches yields (images (B, 1, H, W) f32, labels (B) i64) mini-batches, reshuffled
// each epoch by a Fisher-Yates permutation drawn from a forge::Generator: the epoch's
// permutation takes N - 1 32-bit Philox words from the generator (word k picks
// j = floor(word · (i + 1) / 2^32) for i = N - 1 - k). Its SamplerState is {seed,
// generator offset at the start of the current epoch, next sample within the epoch,
// epoch}, so a restored iterator continues with the identical batches.
#include <cstdint>
#include <string>
#include <vector>

#include "forge/core/generator.h"
#include "forge/core/tensor.h"
#include "forge/data/loader.h"

namespace forge::data {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// An IDX ubyte array: its dimensions and its bytes.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

// Reads an IDX ubyte file (gzip or plain). `expected_dims` > 0 requires that many dimensions.
IdxArray read_idx(const std::string& path, int expected_dims = 0);

// Images of an IDX3 file as f32 (N, 1, rows, cols) in [0, 1].
Tensor read_idx_images(const std::string& path);
// Labels of an IDX1 file as i64 (N).
Tensor read_idx_labels(const std::string& path);

struct ImageDataset {
  Tensor images;  // (N, C, H, W) f32
  Tensor labels;  // (N) i64
  int64_t num_classes = 0;
  int64_t size() const { return images.defined() ? images.size(0) : 0; }
};

struct FashionMnistOptions {
  std::string dir = kFashionMnistDir;
  bool normalize = false;  // (x - mean) / std with the training set's statistics below
  float mean = 0.2860f;
  float std = 0.3530f;
};

// The first of the four Fashion-MNIST files ({train,t10k}-{images-idx3,labels-idx1}-ubyte, each
// name.gz or name) that `dir` lacks, as the name.gz path; "" when all four are there. Reads
// nothing but directory entries.
std::string missing_fashion_mnist_file(const std::string& dir);

// split: "train" (60000) or "test" (10000, the t10k files). Finds name.gz, else name.
ImageDataset load_fashion_mnist(const std::string& split, const FashionMnistOptions& opt = {});

// Shuffled (or in-order) mini-batches over an ImageDataset for `epochs` epochs (<= 0: endless).
class ImageBatches : public BatchSource {
 public:
  ImageBatches(ImageDataset data, int64_t batch_size, uint64_t seed, bool shuffle = true, bool drop_last = false,
               int64_t epochs = 1);
  std::optional<Batch> next() override;
  SamplerState state() const override;
  void set_state(const SamplerState& state) override;
  int64_t batches_per_epoch() const;
  // The order of the current epoch (indices into the dataset).
  const std::vector<int64_t>& order() const { return order_; }

 private:
  void start_epoch();  // draws the permutation from the generator's current offset

  ImageDataset data_;
  int64_t batch_size_;
  bool shuffle_, drop_last_;
  int64_t epochs_;
  Generator gen_;
  uint64_t epoch_offset_ = 0;
  int64_t epoch_ = 0, position_ = 0;
  std::vector<int64_t> order_;
};

}  // namespace forge::data
