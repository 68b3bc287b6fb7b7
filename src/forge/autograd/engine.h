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

// True while this thread runs a backward() called with retain_graph: a node's backward must
// then leave what it saved intact (it may run again). Otherwise a backward function that holds
// the only reference to a saved tensor may reuse its memory for its result (e.g.
// cross_entropy's dlogits written over the logits: Note [dlogits in place] in ops/loss.cpp).
bool retaining_graph();

}  // namespace forge::autograd
