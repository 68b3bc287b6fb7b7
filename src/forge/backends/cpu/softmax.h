#pragma once
// CPU softmax and log-softmax along one dim, forward and backward.
//
// A contiguous tensor of shape (..., n, ...) is viewed as (outer, n, inner), the softmax
// running over n: element (o, j, i) sits at o * n * inner + j * inner + i. Each (o, i) is an
// independent problem of length n with stride `inner`.
//
// Forward (numerically stable: the row max m is subtracted before exp):
//   softmax      y_j = exp(x_j - m) / sum_k exp(x_k - m)
//   log_softmax  y_j = (x_j - m) - log(sum_k exp(x_k - m))
// Backward, from g = dL/dy and the saved output y:
//   softmax      dx_j = y_j * (g_j - sum_k g_k y_k)
//   log_softmax  dx_j = g_j - exp(y_j) * sum_k g_k
//
// Precision: the sums accumulate in double; elementwise math (exp, subtraction) runs in
// float for bf16/f16/f32 and in double for f64; results are rounded once to the output
// dtype.
//
// Memory contract: x, y, g are read only; y (forward) and dx (backward) are contiguous, of
// the input's shape and dtype, and overwritten. All tensors must be contiguous and floating.
// A row holding a NaN (or only -inf) gives NaN for the whole row, as in PyTorch.
//
// Threads: rows (inner == 1), or blocks of up to kSoftmaxLanes neighbouring problems
// (inner > 1, read as contiguous runs), are split across OpenMP threads.
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::cpu {

inline constexpr int64_t kSoftmaxLanes = 16;

// x, y: same shape, contiguous; dim already wrapped into [0, max(ndim, 1)).
void softmax_forward(const Tensor& x, Tensor& y, int64_t dim, bool log);

// y: the forward's output; g: dL/dy; dx: dL/dx. Same shape, contiguous.
void softmax_backward(const Tensor& y, const Tensor& g, Tensor& dx, int64_t dim, bool log);

}  // namespace forge::cpu
