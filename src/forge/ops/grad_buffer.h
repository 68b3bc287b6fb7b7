#pragma once
// Internal to ops/: parameter gradients written straight into pre-allocated gradient buffers
// (Note [claimed grad buffer], autograd/node.cpp).
//
//   const Tensor w_leaf = detail::grad_buffer_owner(weight);        // captured by the backward
//   ... dw = detail::grad_output(w_leaf, {N, K}, opt);               // DDP's bucket view, or new
#include "forge/core/tensor.h"
#include "forge/ops/creation.h"

namespace forge::ops::detail {

// What a backward closure captures for parameter `p`: p itself when it is a leaf that requires
// grad (its gradient buffer may be claimed then), else an undefined tensor.
inline Tensor grad_buffer_owner(const Tensor& p) {
  return p.defined() && p.requires_grad() && p.is_leaf() ? p : Tensor();
}

// The tensor to write owner's gradient into, every element of it: owner's pending gradient
// buffer when it has one of this shape and dtype (Tensor::claim_grad_buffer), else a new one.
inline Tensor grad_output(const Tensor& owner, const Shape& shape, const TensorOptions& opt) {
  Tensor t = owner.claim_grad_buffer(shape, opt.dtype);
  return t.defined() ? t : empty(shape, opt);
}

}  // namespace forge::ops::detail
