#include "forge/ops/creation.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <cstring>

#include "forge/backends/cpu/tensor_kernels.h"
#include "forge/ops/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/view.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/memory.h"
#endif

namespace forge {

namespace ops::detail {

void throw_no_cuda(const char* op) {
  FORGE_THROW(op, ": this forge was built without CUDA support, so tensors cannot live on a GPU; "
                  "rebuild with -DFORGE_CUDA=ON (needs nvcc) or use the CPU");
}

void throw_not_on_cuda(const char* op) {
  FORGE_THROW(op, ": has no CUDA kernel yet; move the inputs to the CPU with .to(Device::cpu())");
}

void check_same_device(const char* op, const TensorList& ts) {
  const Tensor* first = nullptr;
  for (const auto& t : ts) {
    if (!t.defined()) continue;
    if (!first) {
      first = &t;
      continue;
    }
    FORGE_CHECK(t.device() == first->device(), op, ": expected all tensors on one device, got ",
                first->device().str(), " (shape ", first->shape(), ") and ", t.device().str(), " (shape ", t.shape(),
                "); move them with .to(device)");
  }
}

}  // namespace ops::detail

Allocator* allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
#ifdef FORGE_WITH_CUDA
  const int n = cuda::device_count();
  FORGE_CHECK(device.index < n, "device ", device.str(), " is not available: ", n, " CUDA device(s) visible");
  return cuda::allocator(device.index);
#else
  ops::detail::throw_no_cuda(("allocate on " + device.str()).c_str());
#endif
}

int cuda_device_count() {
#ifdef FORGE_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

MemoryStats cuda_memory_stats([[maybe_unused]] int device) {
  FORGE_ON_CUDA("cuda_memory_stats", return cuda::memory_stats(device));
}
int64_t cuda_memory_allocated(int device) { return cuda_memory_stats(device).allocated; }
int64_t cuda_memory_reserved(int device) { return cuda_memory_stats(device).reserved; }
int64_t cuda_max_memory_allocated(int device) { return cuda_memory_stats(device).peak_allocated; }
int64_t cuda_max_memory_reserved(int device) { return cuda_memory_stats(device).peak_reserved; }
void cuda_reset_peak_memory_stats([[maybe_unused]] int device) {
  FORGE_ON_CUDA("cuda_reset_peak_memory_stats", cuda::reset_peak_memory_stats(device));
}
void cuda_empty_cache([[maybe_unused]] int device) { FORGE_ON_CUDA("cuda_empty_cache", cuda::empty_cache(device)); }
void cuda_synchronize([[maybe_unused]] int device) { FORGE_ON_CUDA("cuda_synchronize", cuda::synchronize(device)); }

Tensor empty(const Shape& shape, const TensorOptions& opt) {
  for (int64_t s : shape) FORGE_CHECK(s >= 0, "empty: negative dimension in shape ", shape);
  auto storage = std::make_shared<Storage>(checked_nbytes(shape, element_size(opt.dtype)), allocator_for(opt.device));
  Tensor t = Tensor::make(std::move(storage), shape, contiguous_strides(shape), 0, opt.dtype);
  if (opt.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor empty_in_order_of(const Tensor& like, const Shape& shape) {
  FORGE_CHECK(static_cast<int64_t>(shape.size()) == like.dim(), "empty_in_order_of: shape ", shape, " has ",
              shape.size(), " dims, the tensor to follow ", like.dim());
  std::vector<int64_t> order(static_cast<size_t>(like.dim()));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
  Shape dense, inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    dense.push_back(shape[static_cast<size_t>(order[i])]);
    inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  }
  return ops::permute(empty(dense, {.dtype = like.dtype(), .device = like.device()}), inverse);
}

Tensor full(const Shape& shape, double value, const TensorOptions& opt) {
  TensorOptions o = opt;
  o.requires_grad = false;
  Tensor t = empty(shape, o);
  ops::fill_(t, value);
  if (opt.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor zeros(const Shape& shape, const TensorOptions& opt) { return full(shape, 0.0, opt); }
Tensor ones(const Shape& shape, const TensorOptions& opt) { return full(shape, 1.0, opt); }

Tensor arange(double start, double end, double step, const TensorOptions& opt) {
  FORGE_CHECK(step != 0, "arange: step must be nonzero");
  FORGE_CHECK((end - start) / step >= 0, "arange: the range [", start, ", ", end, ") with step ", step,
              " is inconsistent (the step points away from the end)");
  const auto n = static_cast<int64_t>(std::ceil((end - start) / step));
  TensorOptions o = opt;
  o.requires_grad = false;
  Tensor t = empty({n}, o);
  if (t.is_cpu()) cpu::arange(t, start, step);
  else FORGE_ON_CUDA("arange", cuda::arange(t, start, step));
  if (opt.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor arange(int64_t end, const TensorOptions& opt) { return arange(0.0, static_cast<double>(end), 1.0, opt); }

namespace {

// A random tensor drawn from `gen` (or the default generator) by `fill(t, seed, offset)`.
template <class Fill>
Tensor random_tensor(const Shape& shape, const TensorOptions& opt, Generator* gen, const char* op, Fill fill) {
  FORGE_CHECK(is_floating(opt.dtype), op, ": needs a floating dtype, got ", dtype_name(opt.dtype));
  TensorOptions o = opt;
  o.requires_grad = false;
  Tensor t = empty(shape, o);
  Generator& g = gen ? *gen : default_generator();
  const uint64_t seed = g.seed();
  const uint64_t offset = g.reserve(t.numel());
  fill(t, seed, offset);
  if (opt.requires_grad) t.requires_grad_(true);
  return t;
}

}  // namespace

Tensor uniform(const Shape& shape, double lo, double hi, const TensorOptions& opt, Generator* gen) {
  return random_tensor(shape, opt, gen, "rand", [&](Tensor& t, uint64_t seed, uint64_t off) {
    if (t.is_cpu()) cpu::uniform(t, lo, hi, seed, off);
    else FORGE_ON_CUDA("rand", cuda::uniform(t, lo, hi, seed, off));
  });
}

Tensor normal(const Shape& shape, double mean, double std, const TensorOptions& opt, Generator* gen) {
  return random_tensor(shape, opt, gen, "randn", [&](Tensor& t, uint64_t seed, uint64_t off) {
    if (t.is_cpu()) cpu::normal(t, mean, std, seed, off);
    else FORGE_ON_CUDA("randn", cuda::normal(t, mean, std, seed, off));
  });
}

Tensor rand(const Shape& shape, const TensorOptions& opt, Generator* gen) { return uniform(shape, 0.0, 1.0, opt, gen); }
Tensor randn(const Shape& shape, const TensorOptions& opt, Generator* gen) { return normal(shape, 0.0, 1.0, opt, gen); }

Tensor randint(int64_t lo, int64_t hi, const Shape& shape, const TensorOptions& opt, Generator* gen) {
  FORGE_CHECK(hi > lo, "randint: empty range [", lo, ", ", hi, ")");
  FORGE_CHECK(hi - lo <= (int64_t{1} << 24), "randint: range [", lo, ", ", hi, ") is wider than 2^24, the resolution "
              "of forge's uniform stream");
  // floor(u) for u uniform in [0, hi - lo): truncation is floor for non-negative values.
  Tensor u = uniform(shape, 0.0, static_cast<double>(hi - lo), {.dtype = DType::f64, .device = opt.device}, gen);
  Tensor r = ops::to(u, DType::i64);
  if (lo != 0) r = ops::add(r, static_cast<double>(lo));
  return ops::to(r, opt.dtype);
}

Tensor from_blob(const void* data, DType src_dtype, const Shape& shape, const TensorOptions& opt) {
  Tensor host = empty(shape, {.dtype = src_dtype});
  if (host.nbytes()) std::memcpy(host.data_ptr(), data, host.nbytes());
  Tensor t = ops::to(host, opt.device, opt.dtype);
  if (opt.requires_grad) t.requires_grad_(true);
  return t;
}

template <class T> Tensor from_vector(const std::vector<T>& data, const Shape& shape, const TensorOptions& opt) {
  FORGE_CHECK(static_cast<int64_t>(data.size()) == shape_numel(shape), "from_vector: ", data.size(),
              " values do not fill shape ", shape, " (", shape_numel(shape), " elements)");
  return from_blob(data.data(), dtype_v<T>, shape, opt);
}
template <class T> Tensor from_vector(const std::vector<T>& data, const Shape& shape) {
  return from_vector(data, shape, {.dtype = dtype_v<T>});
}
template Tensor from_vector(const std::vector<float>&, const Shape&);
template Tensor from_vector(const std::vector<double>&, const Shape&);
template Tensor from_vector(const std::vector<int32_t>&, const Shape&);
template Tensor from_vector(const std::vector<int64_t>&, const Shape&);
template Tensor from_vector(const std::vector<uint8_t>&, const Shape&);
template Tensor from_vector(const std::vector<bf16>&, const Shape&);
template Tensor from_vector(const std::vector<f16>&, const Shape&);
template Tensor from_vector(const std::vector<float>&, const Shape&, const TensorOptions&);
template Tensor from_vector(const std::vector<double>&, const Shape&, const TensorOptions&);
template Tensor from_vector(const std::vector<int32_t>&, const Shape&, const TensorOptions&);
template Tensor from_vector(const std::vector<int64_t>&, const Shape&, const TensorOptions&);
template Tensor from_vector(const std::vector<uint8_t>&, const Shape&, const TensorOptions&);
template Tensor from_vector(const std::vector<bf16>&, const Shape&, const TensorOptions&);
template Tensor from_vector(const std::vector<f16>&, const Shape&, const TensorOptions&);

Tensor scalar_tensor(double value, const TensorOptions& opt) { return full({}, value, opt); }

Tensor empty_like(const Tensor& t) { return empty(t.shape(), {.dtype = t.dtype(), .device = t.device()}); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), {.dtype = t.dtype(), .device = t.device()}); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), {.dtype = t.dtype(), .device = t.device()}); }
Tensor full_like(const Tensor& t, double value) {
  return full(t.shape(), value, {.dtype = t.dtype(), .device = t.device()});
}

}  // namespace forge
