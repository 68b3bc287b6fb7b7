#pragma once
// Indexing ops. Index tensors are i64 or i32; out-of-range indices are an error naming
// the op, the index and the dim size (negative indices are out of range, as in torch). On
// CUDA the kernels check indices instead and fail with a device-side assertion (Note
// [device-side index checks] in backends/cuda/reduce.cuh).
#include "forge/core/tensor.h"

namespace forge::ops {

// out = x.index_select(dim, index): index is 1-D.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// out[i][j][k] = x[index[i][j][k]][j][k] (dim 0), like torch.gather.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// gather and scatter_add: index has as many dims as x, and index.size(d) <= x.size(d) for
// d != dim (src must be at least as large as index on every dim). Repeated indices
// accumulate in scatter_add and in every backward.
// out = x.clone(); out[index[i][j][k]][j][k] += src[i][j][k] (dim 0), like torch.scatter_add.
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);

}  // namespace forge::ops
