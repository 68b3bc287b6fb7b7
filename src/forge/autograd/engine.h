#pragma once
// The backward engine: runs the graph behind `roots` in reverse topological order.
#include "forge/core/tensor.h"

namespace forge::autograd {

// Computes gradients of sum_i <roots[i], grads[i]> with respect to every leaf that
// requires grad and accumulates them into the leaves' .grad. grads[i] may be undefined
// for a one-element root (then 1). Iterative (no recursion, so deep graphs cannot
// overflow the stack). Unless retain_graph, each node's saved tensors are freed right
// after it runs.
void backward(const TensorList& roots, const TensorList& grads = {}, bool retain_graph = false);

}  // namespace forge::autograd
