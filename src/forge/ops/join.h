#pragma once
// Joining and splitting along a dim.
#include <vector>

#include "forge/core/tensor.h"

namespace forge::ops {

Tensor cat(const TensorList& xs, int64_t dim = 0);
Tensor stack(const TensorList& xs, int64_t dim = 0);
// Pieces of `split_size` along dim (the last may be smaller); views, differentiable.
TensorList split(const Tensor& x, int64_t split_size, int64_t dim = 0);
TensorList split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
TensorList chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

}  // namespace forge::ops
