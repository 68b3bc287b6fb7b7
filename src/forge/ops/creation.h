#pragma once
// Creating tensors: empty, zeros, ones, full, arange, rand, randn, from host data.
//
//   auto w = forge::randn({768, 768}, {.dtype = DType::bf16, .device = Device::cuda(0)});
#include <initializer_list>
#include <vector>

#include "forge/core/generator.h"
#include "forge/core/tensor.h"

namespace forge {

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool requires_grad = false;
};

Tensor empty(const Shape& shape, const TensorOptions& opt = {});
// A new tensor of `shape` (like's rank) with like's dtype and device, laid out in like's memory
// order (dims sorted by like's strides, outermost first) and returned as a view with `shape`:
// e.g. dense (B, T, H, D) memory seen as (B, H, T, D) for a permuted like. Kernels that write
// through strides then keep their inputs' layout, and the views after them stay views.
Tensor empty_in_order_of(const Tensor& like, const Shape& shape);
Tensor zeros(const Shape& shape, const TensorOptions& opt = {});
Tensor ones(const Shape& shape, const TensorOptions& opt = {});
Tensor full(const Shape& shape, double value, const TensorOptions& opt = {});
// [start, end) in steps of `step` (PyTorch's length rule: ceil((end - start) / step)).
Tensor arange(double start, double end, double step = 1.0, const TensorOptions& opt = {.dtype = DType::i64});
Tensor arange(int64_t end, const TensorOptions& opt = {.dtype = DType::i64});
// Uniform on [lo, hi) / normal(mean, std), from `gen` or the default generator
// (Note [RNG streams]: the same numbers on every device).
Tensor rand(const Shape& shape, const TensorOptions& opt = {}, Generator* gen = nullptr);
Tensor randn(const Shape& shape, const TensorOptions& opt = {}, Generator* gen = nullptr);
Tensor uniform(const Shape& shape, double lo, double hi, const TensorOptions& opt = {}, Generator* gen = nullptr);
Tensor normal(const Shape& shape, double mean, double std, const TensorOptions& opt = {}, Generator* gen = nullptr);
// Random integers in [lo, hi).
Tensor randint(int64_t lo, int64_t hi, const Shape& shape, const TensorOptions& opt = {.dtype = DType::i64},
               Generator* gen = nullptr);

// Copies host data (row-major) into a new tensor of `shape`. Without options the tensor
// has T's dtype (like torch.tensor infers it); with options the values are converted to
// opt.dtype.
template <class T> Tensor from_vector(const std::vector<T>& data, const Shape& shape);
template <class T> Tensor from_vector(const std::vector<T>& data, const Shape& shape, const TensorOptions& opt);
Tensor from_blob(const void* data, DType src_dtype, const Shape& shape, const TensorOptions& opt = {});
// A 0-d tensor.
Tensor scalar_tensor(double value, const TensorOptions& opt = {});

Tensor empty_like(const Tensor& t);  // same shape/dtype/device, contiguous
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);

// The allocator that backs storages on `device`.
Allocator* allocator_for(Device device);
// Number of CUDA devices visible (0 without CUDA support or without a GPU).
int cuda_device_count();
// The CUDA caching allocator of `device`, without a backend header (backends/cuda/memory.h,
// docs/cuda.md): bytes in live tensors, bytes held from the driver, their peaks, and
// releasing cached segments nothing uses. cuda_synchronize waits for all work queued on the
// device (needed before reading the result of a non_blocking copy to the CPU). Each throws
// for a device that is not visible (always, in a build without CUDA).
MemoryStats cuda_memory_stats(int device = 0);
int64_t cuda_memory_allocated(int device = 0);
int64_t cuda_memory_reserved(int device = 0);
int64_t cuda_max_memory_allocated(int device = 0);
int64_t cuda_max_memory_reserved(int device = 0);
void cuda_reset_peak_memory_stats(int device = 0);
void cuda_empty_cache(int device = 0);
void cuda_synchronize(int device = 0);

}  // namespace forge
