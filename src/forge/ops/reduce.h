#pragma once
// Reductions over any set of dims (empty dims = all), with keepdim; softmax family.
// Floating reductions accumulate in double on the CPU (f32 accumulate on CUDA).
// Dims may be negative; a 0-d tensor accepts dim 0 and -1. A dim out of range, a repeated
// dim, or reducing a zero-size dim with an op that has no identity (amax, amin, max, min,
// argmax, argmin) throws forge::Error naming the op and the input shape.
#include <vector>

#include "forge/core/tensor.h"

namespace forge::ops {

using Dims = std::vector<int64_t>;

// Any dtype; integer and bool inputs sum to i64 (as PyTorch). An empty sum is 0.
Tensor sum(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
// Floating inputs only (an integer input is an error, as in PyTorch). An empty mean is NaN.
Tensor mean(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
// Variance with Bessel's correction (`correction` = 1) by default, like torch.var: the sum
// of squared deviations over max(N - correction, 0). Floating inputs only.
Tensor var(const Tensor& x, const Dims& dims = {}, bool keepdim = false, int64_t correction = 1);
// Any dtype (the result keeps it); NaN propagates. The gradient is split evenly among the
// elements equal to the result (as PyTorch).
Tensor amax(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const Dims& dims = {}, bool keepdim = false);

struct ValuesIndices {
  Tensor values;
  Tensor indices;  // i64
};
// Max/min along one dim with the index of the first extremal element (torch.max(x, dim)); a
// NaN is the extreme, and its first index is returned. The gradient flows to that index only.
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false);
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);

// Along any dim, floating inputs only; the row max is subtracted before exp (stable for large
// inputs). bf16/f16 compute through float.
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// Sums `g` down to `shape` (the inverse of broadcasting `shape` to g's shape): used by
// the backward of every broadcasting op.
Tensor sum_to(const Tensor& g, const Shape& shape);

}  // namespace forge::ops
