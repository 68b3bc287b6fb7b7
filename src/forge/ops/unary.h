#pragma once
// Elementwise unary math. Floating inputs keep their dtype; integer inputs are promoted
// to f32 for transcendental functions (as PyTorch does); neg/abs/relu keep integers.
#include "forge/core/tensor.h"

namespace forge::ops {

Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// approximate = false: x * Phi(x) (erf form); true: the tanh approximation (GPT-2's).
Tensor gelu(const Tensor& x, bool approximate = false);
Tensor silu(const Tensor& x);

// SwiGLU's gate: silu(gate) * up, for two tensors of one shape and floating dtype, as one
// kernel forward and two backward (dgate, dup). Saves gate and up, not silu(gate): the same
// values as mul(silu(gate), up) with one f-wide tensor less kept per token and layer, and
// three passes over memory less (Note [fused SwiGLU] in unary.cpp).
Tensor swiglu(const Tensor& gate, const Tensor& up);

}  // namespace forge::ops
