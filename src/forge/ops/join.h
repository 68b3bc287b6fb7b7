#pragma once
// Joining and splitting along a dim.
#include <vector>

#include "forge/core/tensor.h"

namespace forge::ops {

// Shapes must match except on dim; dtypes promote as torch.cat; a 1-D tensor of size 0
// is skipped (torch's legacy rule). A new tensor.
Tensor cat(const TensorList& xs, int64_t dim = 0);
// All shapes equal; a new dim at `dim` (0 <= dim <= ndim, or negative).
Tensor stack(const TensorList& xs, int64_t dim = 0);
// Pieces of `split_size` along dim (the last may be smaller); views, differentiable.
TensorList split(const Tensor& x, int64_t split_size, int64_t dim = 0);
TensorList split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
// Pieces of ceil(size / chunks) (so possibly fewer than `chunks`, as torch.chunk); views.
TensorList chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

}  // namespace forge::ops
