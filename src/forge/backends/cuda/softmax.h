#pragma once
// CUDA softmax and log-softmax along one dim, forward and backward: the counterparts of
// backends/cpu/softmax.h, with the same signatures, math and memory contract (see there
// and softmax.cu). Elementwise math and the sums run in f32 for f32/bf16/f16 (f64 for f64).
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::cuda {

// x, y: same shape, contiguous, on one GPU; dim already wrapped into [0, max(ndim, 1)).
void softmax_forward(const Tensor& x, Tensor& y, int64_t dim, bool log);

// y: the forward's output; g: dL/dy; dx: dL/dx. Same shape, contiguous.
void softmax_backward(const Tensor& y, const Tensor& g, Tensor& dx, int64_t dim, bool log);

}  // namespace forge::cuda
