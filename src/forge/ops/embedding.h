#pragma once
// Embedding lookup (torch.nn.functional.embedding without padding_idx / max_norm).
#include "forge/core/tensor.h"

namespace forge::ops {

// out[..., :] = weight[ids[...], :]
//   weight (V, C) floating; ids any shape, i32 or i64, each in [0, V)  ->  out ids.shape + (C)
// An out-of-range id throws forge::Error naming the id and V (on CUDA the kernels check ids
// instead and fail with a device-side assertion: Note [device-side index checks] in
// backends/cuda/reduce.cuh). Differentiable in weight:
// the gradient is a (V, C) tensor where row v sums the output gradients of every position
// whose id is v (repeated ids accumulate; deterministic).
Tensor embedding(const Tensor& weight, const Tensor& ids);

}  // namespace forge::ops
