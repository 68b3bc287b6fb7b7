#pragma once
// Reductions over any set of dims (empty dims = all), with keepdim; softmax family.
// Floating reductions accumulate in double on the CPU (f32 accumulate on CUDA).
#include <vector>

#include "forge/core/tensor.h"

namespace forge::ops {

using Dims = std::vector<int64_t>;

Tensor sum(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
// Variance with Bessel's correction (`correction` = 1) by default, like torch.var.
Tensor var(const Tensor& x, const Dims& dims = {}, bool keepdim = false, int64_t correction = 1);
Tensor amax(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const Dims& dims = {}, bool keepdim = false);

struct ValuesIndices {
  Tensor values;
  Tensor indices;  // i64
};
// Max/min along one dim with the index of the first extremal element (torch.max(x, dim)).
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false);
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// Sums `g` down to `shape` (the inverse of broadcasting `shape` to g's shape): used by
// the backward of every broadcasting op.
Tensor sum_to(const Tensor& g, const Shape& shape);

}  // namespace forge::ops
