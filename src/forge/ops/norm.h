#pragma once
// Normalisation over the last dim: layer norm (GPT) and RMS norm (LLaMA).
#include "forge/core/tensor.h"

namespace forge::ops {

// torch.nn.functional.layer_norm(x, (C,), weight, bias, eps): over x's last dim C,
//   y = (x - mean) / sqrt(var + eps) * weight + bias     (biased variance)
// x (..., C) floating; weight and bias (C) of x's dtype, each optional (an undefined Tensor
// means 1 / 0). Differentiable in x, weight and bias (one fused backward kernel).
Tensor layer_norm(const Tensor& x, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), double eps = 1e-5);

// The residual stream's add fused with the layer norm that follows it (pre-LN transformers:
// h = x + attn(...); y = ln_2(h)):
//   h = x + residual                       (rounded to x's dtype exactly as ops::add)
//   y = layer_norm(h, weight, bias, eps)
// in one kernel that reads x and residual once and writes h and y. Both outputs are
// differentiable: h is recorded as an add (its gradient goes to x and residual unchanged) and
// y as a layer norm of h, so dL/dh = (gradient from h's other uses) + (layer-norm backward of
// dL/dy), summed by the autograd engine, flows to both x and residual. Bit for bit the same
// values and gradients as add followed by layer_norm. x and residual must have one shape and
// dtype; weight/bias as layer_norm.
struct AddLayerNorm {
  Tensor h;  // x + residual
  Tensor y;  // layer_norm(h)
};
AddLayerNorm add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight = Tensor(),
                            const Tensor& bias = Tensor(), double eps = 1e-5);

// LLaMA's RMSNorm over the last dim: y = x * rsqrt(mean(x^2) + eps) * weight.
// x (..., C) floating; weight (C) of x's dtype, optional. Differentiable in x and weight.
Tensor rms_norm(const Tensor& x, const Tensor& weight = Tensor(), double eps = 1e-6);

// The residual stream's add fused with the RMS norm that follows it (LLaMA: h = x + attn(...);
// y = post_attention_layernorm(h)), as add_layer_norm: h = x + residual (rounded as ops::add),
// y = rms_norm(h, weight, eps), one kernel reading x and residual once and writing h and y, the
// values and gradients of add followed by rms_norm bit for bit.
struct AddRmsNorm {
  Tensor h;  // x + residual
  Tensor y;  // rms_norm(h)
};
AddRmsNorm add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight = Tensor(), double eps = 1e-6);

}  // namespace forge::ops
