#pragma once
// 2-D convolution and max pooling over (N, C, H, W) batches, as torch.nn.functional's
// conv2d / max_pool2d (no dilation, groups = 1, floor output sizes; batched 4-D inputs only).
//
//   conv2d      x (N, Cin, H, W), weight (Cout, Cin, kh, kw), bias (Cout) or undefined
//               -> (N, Cout, Ho, Wo),  Ho = (H + 2 ph - kh) / sh + 1,  Wo likewise
//               (zero padding; a cross-correlation, as in every DL library)
//   max_pool2d  x (N, C, H, W), windows (kh, kw) at stride (sh, sw) (default: the kernel),
//               padding (ph, pw) <= half the kernel, never selected
//               -> (N, C, Ho, Wo),  Ho = (H + 2 ph - kh) / sh + 1
//
// Both are differentiable (conv2d in x, weight and bias; max_pool2d routes each output's
// gradient to the element it selected: the first maximum of its window, a NaN if any).
// Sizes that leave no output (a kernel larger than the padded input), non-positive
// strides/kernels, negative padding and channel mismatches are errors naming the op and
// the shapes. Dtypes: f32, f64, bf16, f16 (16-bit convolutions accumulate in f32). CPU
// (im2col + GEMM) and CUDA (direct kernels, Note [CUDA conv kernels]).
#include <array>
#include <cstdint>

#include "forge/core/tensor.h"
#include "forge/ops/reduce.h"

namespace forge::ops {

using Size2 = std::array<int64_t, 2>;  // (height, width)

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, Size2 stride = {1, 1},
              Size2 padding = {0, 0});

// stride {0, 0} means stride = kernel (PyTorch's stride=None).
Tensor max_pool2d(const Tensor& x, Size2 kernel, Size2 stride = {0, 0}, Size2 padding = {0, 0});

// Also returns the i64 index of each selected element in its (H, W) plane (iy * W + ix), as
// torch's return_indices=True. Only `values` is differentiable.
ValuesIndices max_pool2d_with_indices(const Tensor& x, Size2 kernel, Size2 stride = {0, 0}, Size2 padding = {0, 0});

}  // namespace forge::ops
