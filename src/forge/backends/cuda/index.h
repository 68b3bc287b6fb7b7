#pragma once
// CUDA indexing kernels: the counterparts of backends/cpu/index.h, with the same
// signatures, math and memory contract (see there and index.cu). Indices are checked on
// the device (Note [device-side index checks] in reduce.cuh): an out-of-range index fails
// the kernel instead of throwing, and is never dereferenced.
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::cuda {

// out[..., j, ...] = x[..., index[j], ...] along dim. x any strides; index (n) or 0-d, any
// stride; out contiguous; overwritten.
void index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out);

// out[p] = x[p with p[dim] replaced by index[p]], for every position p of index. x and index
// any strides; out (index's shape) contiguous; overwritten.
void gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out);

// out[p with p[dim] replaced by index[p]] += src[p], for every position p of index. out
// contiguous, accumulated in place; index and src any strides. Deterministic (in the CPU's
// order) unless the problem is too narrow to fill the GPU that way; see index.cu.
void scatter_add_(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);

}  // namespace forge::cuda
