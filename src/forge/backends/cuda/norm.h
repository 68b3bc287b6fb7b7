#pragma once
// CUDA layer norm, fused residual add + layer norm, and RMS norm over the last dim: the
// counterparts of backends/cpu/norm.h, with the same signatures, shapes and memory contract
// (every tensor contiguous, x viewed as (R, C) rows, mean/rstd in the stat dtype
// cpu::norm_stat_dtype: f32 for bf16/f16/f32 inputs, f64 for f64). Plain C++ declarations;
// the kernels live in norm.cu (see Note [CUDA norm kernels] there).
#include "forge/backends/cpu/norm.h"
#include "forge/core/tensor.h"

namespace forge::cuda {

using cpu::NormGrads;

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& y,
                        Tensor& mean, Tensor& rstd);

// h = x + residual (rounded to x's dtype as ops::add rounds it), then layer norm of h, in one
// pass over memory: reads x and residual once, writes h, y, mean and rstd.
void add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                            double eps, Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd);

void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, NormGrads& grads);

void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd);

// h = x + residual, then RMS norm of h, in one pass (as add_layer_norm_forward).
void add_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps, Tensor& h,
                          Tensor& y, Tensor& rstd);

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                       NormGrads& grads);

}  // namespace forge::cuda
