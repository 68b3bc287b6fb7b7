#pragma once
// Inverted dropout (torch.nn.functional.dropout).
#include "forge/core/generator.h"
#include "forge/core/tensor.h"

namespace forge::ops {

// In training, each element of x is kept with probability 1 - p and scaled by 1 / (1 - p),
// else zeroed; the expected value of the output is x. p must lie in [0, 1). With p == 0 or
// !training x itself is returned (no copy, no history).
//
// The mask comes from the Philox stream of `gen` (the default generator when null), per
// Note [RNG streams]: element i (row-major) is kept iff the uniform of element i, drawn at
// the generator's reserved offset, is >= p. So one seed (and offset) gives the same mask
// on every device and for every dtype of x. The generator advances by x.numel() uniforms.
// Differentiable in x: the gradient is g times the same mask and scale (the mask is kept
// as a bool tensor, 1 byte per element).
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);

}  // namespace forge::ops
