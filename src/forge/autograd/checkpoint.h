#pragma once
// Activation checkpointing: run a region without keeping its activations, and re-run it
// during backward to get them back.
//
//   Tensor y = autograd::checkpoint([&](const TensorList& in) { return block.forward(in[0]); }, {x});
//
// Forward runs `fn` under NoGradGuard (no graph, so its intermediate tensors die at
// once) and records one node for the whole region. That node's backward re-runs `fn`
// with grad mode on, on detached copies of the inputs, and back-propagates through the
// recomputed graph: the inputs' gradients flow on to the outer graph, and parameters
// used inside `fn` receive theirs directly (their hooks fire then). The default
// generator's state is saved before the forward and restored around the recomputation,
// so dropout draws the same masks twice and the gradients equal those of the plain run.
#include <functional>

#include "forge/core/tensor.h"

namespace forge::autograd {

using RegionFn = std::function<Tensor(const TensorList&)>;

Tensor checkpoint(const RegionFn& fn, const TensorList& inputs);

}  // namespace forge::autograd
