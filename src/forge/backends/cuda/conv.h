#pragma once
// CUDA 2-D convolution and max pooling, forward and backward: the counterparts of
// backends/cpu/conv.h with the same signatures (max_pool2d_backward also takes the window),
// shapes, index convention and memory contract (x and pooling's dout read through their
// strides; weight, conv's dout and every output contiguous; outputs overwritten, an undefined
// dx / dw / db not computed). Plain C++ declarations; the kernels live in conv.cu (Note [CUDA
// conv kernels]).
#include "forge/backends/cpu/conv.h"
#include "forge/core/tensor.h"

namespace forge::cuda {

using cpu::Conv2dParams;
using cpu::Pool2dParams;

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p, Tensor& out);

// x_shape: the forward input's shape; x itself is read only for dw (undefined if dw is).
void conv2d_backward(const Tensor& dout, const Tensor& x, const Shape& x_shape, const Tensor& w, const Conv2dParams& p,
                     Tensor& dx, Tensor& dw, Tensor& db);

void max_pool2d_forward(const Tensor& x, const Pool2dParams& p, Tensor& out, Tensor& indices);

// dx: (N, C, H, W) of the forward's input. Unlike the CPU kernel (which scatters) this one
// takes the window geometry `p`: each input element gathers the outputs whose windows contain
// it, which needs no atomics and keeps the CPU's summation order.
void max_pool2d_backward(const Tensor& dout, const Tensor& indices, const Pool2dParams& p, Tensor& dx);

}  // namespace forge::cuda
