// IDX reader (gzip or plain, through zlib), Fashion-MNIST loading and shuffled image
// mini-batches (contracts in idx.h).
#include "forge/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "forge/core/error.h"
#include "forge/core/philox.h"
#include "forge/ops/creation.h"

namespace forge::data {

namespace {

// A gzFile that reads gzip streams and, transparently, plain files.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    FORGE_CHECK(std::filesystem::is_regular_file(path), "read_idx: '", path, "' does not exist or is not a file");
    f_ = gzopen(path.c_str(), "rb");
    FORGE_CHECK(f_ != nullptr, "read_idx: cannot open '", path, "'");
    gzbuffer(f_, 1 << 17);
  }
  ~GzReader() {
    if (f_) gzclose(f_);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to n bytes; returns how many were read (fewer only at the end of the data).
  size_t read(void* out, size_t n) {
    size_t done = 0;
    auto* p = static_cast<unsigned char*>(out);
    while (done < n) {
      const auto chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      const int got = gzread(f_, p + done, chunk);
      if (got < 0) {
        int errnum = 0;
        const char* msg = gzerror(f_, &errnum);
        FORGE_THROW("read_idx: '", path_, "' is corrupt or unreadable: ", msg ? msg : "zlib error");
      }
      if (got == 0) {
        int errnum = 0;
        const char* msg = gzerror(f_, &errnum);
        FORGE_CHECK(errnum == Z_OK, "read_idx: '", path_, "' is corrupt or truncated: ", msg ? msg : "zlib error");
        break;
      }
      done += static_cast<size_t>(got);
    }
    return done;
  }

 private:
  std::string path_;
  gzFile f_ = nullptr;
};

uint32_t be32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

std::string find_file(const std::string& dir, const std::string& name) {
  const auto base = std::filesystem::path(dir) / name;
  const std::string gz = base.string() + ".gz";
  if (std::filesystem::exists(gz)) return gz;
  if (std::filesystem::exists(base)) return base.string();
  FORGE_THROW("load_fashion_mnist: cannot find '", gz, "' or '", base.string(),
              "'; install the Debian package dataset-fashion-mnist or set FashionMnistOptions::dir");
}

}  // namespace

IdxArray read_idx(const std::string& path, int expected_dims) {
  GzReader in(path);
  unsigned char magic[4];
  FORGE_CHECK(in.read(magic, 4) == 4, "read_idx: '", path, "' is truncated: shorter than the 4-byte IDX magic");
  FORGE_CHECK(magic[0] == 0 && magic[1] == 0, "read_idx: '", path, "' is not an IDX file (magic ",
              be32(magic), " does not start with two zero bytes)");
  FORGE_CHECK(magic[2] == 0x08, "read_idx: '", path, "' has element type 0x", std::hex, int(magic[2]), std::dec,
              "; only unsigned bytes (0x08) are supported");
  const int ndims = magic[3];
  FORGE_CHECK(ndims >= 1, "read_idx: '", path, "' declares 0 dimensions");
  FORGE_CHECK(expected_dims <= 0 || ndims == expected_dims, "read_idx: '", path, "' has ", ndims,
              " dimensions (magic 0x0000080", ndims, "), expected ", expected_dims, " (magic 0x0000080", expected_dims,
              ")");
  IdxArray a;
  std::vector<unsigned char> hdr(static_cast<size_t>(4 * ndims));
  FORGE_CHECK(in.read(hdr.data(), hdr.size()) == hdr.size(), "read_idx: '", path,
              "' is truncated inside its header (", ndims, " dimension sizes)");
  uint64_t total = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint32_t n = be32(hdr.data() + 4 * d);
    a.dims.push_back(n);
    // Checked before the product, which could wrap (2^40 x 2^32): Note [checked sizes].
    FORGE_CHECK(n == 0 || total <= (uint64_t{1} << 40) / n, "read_idx: '", path, "' declares an implausible size ",
                shape_str(a.dims), " (more than 2^40 bytes)");
    total *= n;
  }
  // Grow as data arrives, so a corrupt header cannot make us allocate more than the file holds.
  constexpr size_t kChunk = size_t{16} << 20;
  while (a.data.size() < total) {
    const size_t want = std::min<size_t>(kChunk, total - a.data.size());
    const size_t old = a.data.size();
    a.data.resize(old + want);
    const size_t got = in.read(a.data.data() + old, want);
    FORGE_CHECK(got == want, "read_idx: '", path, "' is truncated: its header ", shape_str(a.dims), " needs ", total,
                " bytes of data, the file has ", old + got);
  }
  unsigned char extra;
  FORGE_CHECK(in.read(&extra, 1) == 0, "read_idx: '", path, "' is longer than its header ", shape_str(a.dims),
              " says (trailing bytes after ", total, " bytes of data)");
  return a;
}

Tensor read_idx_images(const std::string& path) {
  const IdxArray a = read_idx(path, 3);
  Tensor t = empty({a.dims[0], 1, a.dims[1], a.dims[2]}, {.dtype = DType::f32});
  float* p = t.data<float>();
  for (size_t i = 0; i < a.data.size(); ++i) p[i] = static_cast<float>(a.data[i]) * (1.0f / 255.0f);
  return t;
}

Tensor read_idx_labels(const std::string& path) {
  const IdxArray a = read_idx(path, 1);
  Tensor t = empty({a.dims[0]}, {.dtype = DType::i64});
  int64_t* p = t.data<int64_t>();
  for (size_t i = 0; i < a.data.size(); ++i) p[i] = a.data[i];
  return t;
}

std::string missing_fashion_mnist_file(const std::string& dir) {
  for (const char* name :
       {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    const auto base = std::filesystem::path(dir) / name;
    const std::string gz = base.string() + ".gz";
    std::error_code ec;
    if (!std::filesystem::is_regular_file(gz, ec) && !std::filesystem::is_regular_file(base, ec)) return gz;
  }
  return "";
}

ImageDataset load_fashion_mnist(const std::string& split, const FashionMnistOptions& opt) {
  FORGE_CHECK(split == "train" || split == "test", "load_fashion_mnist: split \"", split,
              "\" must be \"train\" or \"test\"");
  const std::string prefix = split == "train" ? "train" : "t10k";
  const std::string images_path = find_file(opt.dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(opt.dir, prefix + "-labels-idx1-ubyte");
  ImageDataset ds;
  ds.images = read_idx_images(images_path);
  ds.labels = read_idx_labels(labels_path);
  ds.num_classes = 10;
  FORGE_CHECK(ds.images.size(0) == ds.labels.size(0), "load_fashion_mnist: '", images_path, "' has ",
              ds.images.size(0), " images but '", labels_path, "' has ", ds.labels.size(0), " labels");
  const int64_t* lab = ds.labels.data<int64_t>();
  for (int64_t i = 0; i < ds.labels.numel(); ++i)
    FORGE_CHECK(lab[i] >= 0 && lab[i] < ds.num_classes, "load_fashion_mnist: '", labels_path, "' has label ", lab[i],
                " at index ", i, "; Fashion-MNIST has classes 0..9");
  if (opt.normalize) {
    FORGE_CHECK(opt.std > 0.0f, "load_fashion_mnist: std ", opt.std, " must be positive");
    float* p = ds.images.data<float>();
    const float inv = 1.0f / opt.std;
    for (int64_t i = 0; i < ds.images.numel(); ++i) p[i] = (p[i] - opt.mean) * inv;
  }
  return ds;
}

// ---- mini-batches ------------------------------------------------------------------------

ImageBatches::ImageBatches(ImageDataset data, int64_t batch_size, uint64_t seed, bool shuffle, bool drop_last,
                           int64_t epochs)
    : data_(std::move(data)), batch_size_(batch_size), shuffle_(shuffle), drop_last_(drop_last), epochs_(epochs),
      gen_(seed) {
  FORGE_CHECK(data_.images.defined() && data_.labels.defined(), "ImageBatches: the dataset has no images or labels");
  FORGE_CHECK(data_.images.dim() >= 2 && data_.labels.dim() == 1 && data_.images.size(0) == data_.labels.size(0),
              "ImageBatches: images ", data_.images.shape(), " and labels ", data_.labels.shape(),
              " must be (N, ...) and (N)");
  FORGE_CHECK(data_.images.dtype() == DType::f32 && data_.labels.dtype() == DType::i64, "ImageBatches: images must be f32 "
              "and labels i64, got ", dtype_name(data_.images.dtype()), " and ", dtype_name(data_.labels.dtype()));
  FORGE_CHECK(batch_size >= 1, "ImageBatches: batch_size ", batch_size, " must be >= 1");
  FORGE_CHECK(data_.size() > 0 && (!drop_last || data_.size() >= batch_size), "ImageBatches: ", data_.size(),
              " samples cannot fill a batch of ", batch_size, drop_last ? " with drop_last" : "");
  data_.images = data_.images.contiguous();
  data_.labels = data_.labels.contiguous();
  start_epoch();
}

int64_t ImageBatches::batches_per_epoch() const {
  const int64_t n = data_.size();
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

void ImageBatches::start_epoch() {
  const int64_t n = data_.size();
  epoch_offset_ = gen_.offset();
  order_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order_[static_cast<size_t>(i)] = i;
  if (!shuffle_ || n < 2) return;
  const uint64_t block0 = gen_.reserve(n - 1);
  const uint64_t seed = gen_.seed();
  Philox4 words{};
  for (int64_t k = 0; k < n - 1; ++k) {
    if (k % 4 == 0) words = philox4x32_10(seed, block0 + static_cast<uint64_t>(k / 4));
    const int64_t i = n - 1 - k;
    const auto j = static_cast<int64_t>((static_cast<uint64_t>(words.v[k % 4]) * static_cast<uint64_t>(i + 1)) >> 32);
    std::swap(order_[static_cast<size_t>(i)], order_[static_cast<size_t>(j)]);
  }
}

std::optional<Batch> ImageBatches::next() {
  const int64_t n = data_.size();
  if (epochs_ > 0 && epoch_ >= epochs_) return std::nullopt;
  if (n - position_ <= 0 || (drop_last_ && n - position_ < batch_size_)) {
    ++epoch_;
    if (epochs_ > 0 && epoch_ >= epochs_) return std::nullopt;
    start_epoch();
    position_ = 0;
  }
  const int64_t rows = std::min(batch_size_, n - position_);
  Shape shape = data_.images.shape();
  shape[0] = rows;
  const int64_t per = data_.images.numel() / n;
  Batch b{empty(shape, {.dtype = DType::f32}), empty({rows}, {.dtype = DType::i64})};
  const float* src = data_.images.data<float>();
  const int64_t* lab = data_.labels.data<int64_t>();
  float* dst = b.inputs.data<float>();
  int64_t* tg = b.targets.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t idx = order_[static_cast<size_t>(position_ + r)];
    std::memcpy(dst + r * per, src + idx * per, static_cast<size_t>(per) * sizeof(float));
    tg[r] = lab[idx];
  }
  position_ += rows;
  return b;
}

SamplerState ImageBatches::state() const {
  return {.seed = gen_.seed(), .rng_offset = epoch_offset_, .position = position_, .epoch = epoch_};
}

void ImageBatches::set_state(const SamplerState& s) {
  FORGE_CHECK(s.position >= 0 && s.position <= data_.size() && s.epoch >= 0, "ImageBatches::set_state: position ",
              s.position, " / epoch ", s.epoch, " do not fit a dataset of ", data_.size(), " samples");
  gen_.set_state(s.seed, s.rng_offset);
  epoch_ = s.epoch;
  start_epoch();
  position_ = s.position;
}

}  // namespace forge::data
