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

}  // namespace forge::ops
