#pragma once
// CUDA counterparts of backends/cpu/tensor_kernels.h, plus the device runtime entry points
// the ops layer needs. Plain C++ declarations: the definitions live in .cu files.
#include <cstdint>

#include "forge/core/allocator.h"
#include "forge/core/tensor.h"

namespace forge::cuda {

int device_count();  // 0 when the driver or GPU is absent (never throws)
Allocator* allocator(int device);

// dst <- src, same shape; either side may be on the CPU (host<->device) or on any GPU;
// converts the element type; any strides. Runs on the current stream of the GPU involved.
// Returns once the host side may be read, reused or freed, unless `non_blocking` and the
// host side is pinned memory (Tensor::pin_memory): then the copy is only queued, the pinned
// block is kept from reuse until it completed, and the caller synchronises (a stream or
// event, or cuda::synchronize) before reading a host destination.
void copy(Tensor& dst, const Tensor& src, bool non_blocking = false);
void fill(Tensor& t, double value);
void arange(Tensor& t, double start, double step);
void uniform(Tensor& t, double lo, double hi, uint64_t seed, uint64_t block_offset);
void normal(Tensor& t, double mean, double std, uint64_t seed, uint64_t block_offset);
void synchronize(int device);

}  // namespace forge::cuda
