// IDX reading (gzip and plain) and Fashion-MNIST: sizes, label ranges, pixel scaling,
// normalisation, validation errors that name the file, and shuffled mini-batches that are
// reproducible and resumable.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "data/data_testing.h"
#include "forge/forge.h"
#include "testing/tensor_testing.h"

namespace forge::data {
namespace {

using forge::testing::error_of;
using forge::testing::read_bytes;
using forge::testing::TempDir;
using forge::testing::write_bytes;

bool have_fashion_mnist() {
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                        "t10k-labels-idx1-ubyte"}) {
    const auto p = std::filesystem::path(kFashionMnistDir) / f;
    if (!std::filesystem::exists(p.string() + ".gz") && !std::filesystem::exists(p)) return false;
  }
  return true;
}

#define REQUIRE_FASHION_MNIST() \
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST not installed in " << kFashionMnistDir

// The test set, loaded once.
const ImageDataset& test_set() {
  static const ImageDataset ds = load_fashion_mnist("test");
  return ds;
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

TEST(FashionMnist, LoadsTrainAndTest) {
  REQUIRE_FASHION_MNIST();
  const ImageDataset train = load_fashion_mnist("train");
  const ImageDataset& test = test_set();
  EXPECT_EQ(train.images.shape(), (Shape{60000, 1, 28, 28}));
  EXPECT_EQ(train.labels.shape(), (Shape{60000}));
  EXPECT_EQ(test.images.shape(), (Shape{10000, 1, 28, 28}));
  EXPECT_EQ(test.labels.shape(), (Shape{10000}));
  EXPECT_EQ(train.images.dtype(), DType::f32);
  EXPECT_EQ(train.labels.dtype(), DType::i64);
  EXPECT_EQ(train.num_classes, 10);
  // Fashion-MNIST is balanced: 6000 / 1000 images of each class.
  for (const auto* ds : {&train, &test}) {
    std::vector<int64_t> per_class(10, 0);
    for (int64_t l : ds->labels.to_vector<int64_t>()) {
      ASSERT_TRUE(l >= 0 && l < 10) << l;
      ++per_class[static_cast<size_t>(l)];
    }
    for (int64_t c : per_class) EXPECT_EQ(c, ds->size() / 10);
  }
  EXPECT_DOUBLE_EQ(ops::amin(train.images).item<double>(), 0.0);
  EXPECT_DOUBLE_EQ(ops::amax(train.images).item<double>(), 1.0);
  EXPECT_NEAR(train.images.mean().item<double>(), 0.2860, 1e-3);  // the published training mean
}

TEST(FashionMnist, Normalize) {
  REQUIRE_FASHION_MNIST();
  FashionMnistOptions opt;
  opt.normalize = true;
  const ImageDataset ds = load_fashion_mnist("train", opt);
  const Tensor x = ds.images.to(DType::f64);
  const double mean = x.mean().item<double>();
  const double std = (x - mean).pow(2.0).mean().pow(0.5).item<double>();
  EXPECT_NEAR(mean, 0.0, 2e-3);
  EXPECT_NEAR(std, 1.0, 2e-3);
}

TEST(FashionMnist, ShuffledBatchesCoverEpochOnce) {
  REQUIRE_FASHION_MNIST();
  ImageBatches batches(test_set(), 256, 11);
  EXPECT_EQ(batches.batches_per_epoch(), 40);
  const std::vector<int64_t> order = batches.order();
  std::set<int64_t> seen(order.begin(), order.end());
  EXPECT_EQ(seen.size(), 10000u);
  EXPECT_NE(order, [] {
    std::vector<int64_t> id(10000);
    for (int64_t i = 0; i < 10000; ++i) id[static_cast<size_t>(i)] = i;
    return id;
  }());
  const float* all = test_set().images.data<float>();
  const int64_t* labels = test_set().labels.data<int64_t>();
  int64_t pos = 0, n = 0;
  while (auto b = batches.next()) {
    const int64_t rows = b->inputs.size(0);
    ASSERT_EQ(b->inputs.shape(), (Shape{rows, 1, 28, 28}));
    ASSERT_EQ(b->targets.shape(), (Shape{rows}));
    for (int64_t r = 0; r < rows; r += 37) {
      const int64_t idx = order[static_cast<size_t>(pos + r)];
      EXPECT_EQ(b->targets.data<int64_t>()[r], labels[idx]);
      EXPECT_EQ(std::memcmp(b->inputs.data<float>() + r * 784, all + idx * 784, 784 * sizeof(float)), 0);
    }
    pos += rows;
    ++n;
  }
  EXPECT_EQ(pos, 10000);
  EXPECT_EQ(n, 40);
}

TEST(FashionMnist, BatchesReproducibleAndResumable) {
  REQUIRE_FASHION_MNIST();
  ImageBatches a(test_set(), 1000, 5, true, false, /*epochs=*/3);
  ImageBatches b(test_set(), 1000, 5, true, false, 3);
  ImageBatches c(test_set(), 1000, 6, true, false, 3);
  EXPECT_EQ(a.order(), b.order());
  EXPECT_NE(a.order(), c.order());
  std::vector<Batch> from_a;
  std::vector<SamplerState> states;
  while (auto x = a.next()) {
    from_a.push_back(*x);
    states.push_back(a.state());
  }
  ASSERT_EQ(from_a.size(), 30u);
  for (size_t k = 0; k < from_a.size(); ++k) {
    const Batch y = *b.next();
    ASSERT_EQ(y.targets.to_vector<int64_t>(), from_a[k].targets.to_vector<int64_t>());
  }
  // Epochs reshuffle; a restored iterator continues identically, mid-epoch and across epochs.
  EXPECT_NE(from_a[0].targets.to_vector<int64_t>(), from_a[10].targets.to_vector<int64_t>());
  for (size_t at : {size_t{4}, size_t{9}, size_t{17}}) {
    ImageBatches resumed(test_set(), 1000, 77, true, false, 3);
    resumed.set_state(SamplerState::from_json(states[at].to_json()));
    for (size_t k = at + 1; k < from_a.size(); ++k) {
      const Batch y = *resumed.next();
      ASSERT_EQ(y.targets.to_vector<int64_t>(), from_a[k].targets.to_vector<int64_t>()) << at << " " << k;
      ASSERT_EQ(y.inputs.to_vector<float>(), from_a[k].inputs.to_vector<float>());
    }
    EXPECT_FALSE(resumed.next().has_value());
  }
  // Through the prefetching DataLoader: the same batches.
  DataLoader loader(std::make_unique<ImageBatches>(test_set(), 1000, 5, true, false, 3), 2);
  for (const auto& x : from_a) EXPECT_EQ(loader.next()->targets.to_vector<int64_t>(), x.targets.to_vector<int64_t>());
  EXPECT_FALSE(loader.next().has_value());
}

TEST(IdxReader, PlainAndGzipFiles) {
  TempDir dir;
  const std::string images = be32(0x803) + be32(2) + be32(2) + be32(3) + std::string("\x00\x01\x02\x03\x04\xFF"
                                                                                      "\x10\x20\x30\x40\x50\x60", 12);
  write_bytes(dir.file("img"), images);
  write_gz(dir.file("img.gz"), images);
  for (const char* name : {"img", "img.gz"}) {
    const IdxArray a = read_idx(dir.file(name), 3);
    EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 2, 3}));
    EXPECT_EQ(a.data.size(), 12u);
    EXPECT_EQ(a.data[5], 255);
    const Tensor t = read_idx_images(dir.file(name));
    EXPECT_EQ(t.shape(), (Shape{2, 1, 2, 3}));
    EXPECT_FLOAT_EQ(t.data<float>()[5], 1.0f);
    EXPECT_FLOAT_EQ(t.data<float>()[1], 1.0f / 255.0f);
  }
  const std::string labels = be32(0x801) + be32(3) + std::string("\x07\x00\x09", 3);
  write_gz(dir.file("lab.gz"), labels);
  EXPECT_EQ(read_idx_labels(dir.file("lab.gz")).to_vector<int64_t>(), (std::vector<int64_t>{7, 0, 9}));
}

TEST(IdxReader, ErrorsNameTheFile) {
  TempDir dir;
  auto err = [&](const std::string& name, const std::string& bytes, bool gz, int dims) {
    const std::string p = dir.file(name);
    if (gz) write_gz(p, bytes);
    else write_bytes(p, bytes);
    return error_of([&] { read_idx(p, dims); });
  };
  auto expect_has = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << msg << "' lacks '" << part << "'";
  };
  const std::string labels = be32(0x801) + be32(4) + std::string("\x01\x02\x03\x04", 4);
  std::string m = err("labels_as_images", labels, false, 3);
  expect_has(m, "labels_as_images");
  expect_has(m, "has 1 dimensions");
  m = err("short.gz", labels.substr(0, labels.size() - 1), true, 1);
  expect_has(m, "short.gz");
  expect_has(m, "truncated");
  m = err("long", labels + "x", false, 1);
  expect_has(m, "long");
  expect_has(m, "longer than its header");
  m = err("magic", "\x01\x02\x08\x01" + be32(1) + "x", false, 1);
  expect_has(m, "not an IDX file");
  m = err("floats", std::string("\x00\x00\x0D\x01", 4) + be32(1) + "abcd", false, 1);
  expect_has(m, "element type 0xd");
  m = err("tiny", std::string("\x00\x00", 2), false, 1);
  expect_has(m, "tiny");
  expect_has(m, "truncated");
  m = err("huge", be32(0x803) + be32(1000000) + be32(1000) + be32(1000) + "abc", false, 3);
  expect_has(m, "truncated");
  // Issue 43: sizes whose product wraps 64 bits (2^24 x 2^16 x 2^32 = 2^72) are refused before the
  // product, not read as 0 bytes of data.
  m = err("wraps", be32(0x803) + be32(1u << 24) + be32(1u << 16) + be32(0xFFFFFFFFu), false, 3);
  expect_has(m, "implausible size");
  m = err("wraps2", be32(0x804) + be32(1u << 20) + be32(1u << 20) + be32(1u << 24) + be32(1u << 24), false, 4);
  expect_has(m, "implausible size");
  // A gzip stream cut in the middle.
  const std::string big = be32(0x801) + be32(100000) + std::string(100000, '\x05');
  write_gz(dir.file("full.gz"), big);
  const std::string gz = read_bytes(dir.file("full.gz"));
  m = err("cut.gz", gz.substr(0, gz.size() / 2), false, 1);
  expect_has(m, "cut.gz");
  m = error_of([&] { read_idx(dir.file("absent.gz")); });
  expect_has(m, "absent.gz");
  FashionMnistOptions opt;
  opt.dir = dir.file("nowhere");
  m = error_of([&] { load_fashion_mnist("train", opt); });
  expect_has(m, "dataset-fashion-mnist");
  expect_has(error_of([] { load_fashion_mnist("validation"); }), "\"train\" or \"test\"");
}

TEST(IdxReader, MismatchedImagesAndLabels) {
  TempDir dir;
  write_gz(dir.file("train-images-idx3-ubyte.gz"), be32(0x803) + be32(2) + be32(1) + be32(1) + "ab");
  write_gz(dir.file("train-labels-idx1-ubyte.gz"), be32(0x801) + be32(3) + std::string("\x01\x02\x03", 3));
  FashionMnistOptions opt;
  opt.dir = dir.path().string();
  const std::string m = error_of([&] { load_fashion_mnist("train", opt); });
  EXPECT_NE(m.find("has 2 images"), std::string::npos) << m;
  write_gz(dir.file("train-labels-idx1-ubyte.gz"), be32(0x801) + be32(2) + std::string("\x01\x0B", 2));
  const std::string m2 = error_of([&] { load_fashion_mnist("train", opt); });
  EXPECT_NE(m2.find("label 11 at index 1"), std::string::npos) << m2;
}

}  // namespace
}  // namespace forge::data
