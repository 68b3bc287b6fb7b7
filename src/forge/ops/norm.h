#pragma once
// Normalisation over the last dim: layer norm (GPT) and RMS norm (LLaMA).
#include "forge/core/tensor.h"

namespace forge::ops {

// torch.nn.functional.layer_norm(x, (C,), weight, bias, eps): over x's last dim C,
//   y = (x - mean) / sqrt(var + eps) * weight + bias     (biased variance)
// x (..., C) floating; weight and bias (C) of x's dtype, each optional (an undefined Tensor
// means 1 / 0). Differentiable in x, weight and bias (one fused backward kernel).
Tensor layer_norm(const Tensor& x, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), double eps = 1e-5);

// LLaMA's RMSNorm over the last dim: y = x * rsqrt(mean(x^2) + eps) * weight.
// x (..., C) floating; weight (C) of x's dtype, optional. Differentiable in x and weight.
Tensor rms_norm(const Tensor& x, const Tensor& weight = Tensor(), double eps = 1e-6);

}  // namespace forge::ops
