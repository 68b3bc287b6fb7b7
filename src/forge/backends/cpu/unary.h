#pragma once
#include "forge/backends/unary_functors.h"
#include "forge/core/tensor.h"

namespace forge::cpu {

// out = op(x); same shape; out's dtype == x's dtype (floating, or integral for ops that keep integers).
void unary(UnaryOp op, const Tensor& x, Tensor& out);
// out = g * op'(x) given x and/or y = op(x) (pass any same-shape tensor for the one the op
// does not need); all of one floating dtype.
void unary_backward(UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& y, Tensor& out);

// SwiGLU (backends/swiglu_functors.h): out = silu(gate) * up; backward dgate and dup from the
// upstream g (an undefined dgate / dup is skipped). All of one floating dtype and shape.
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out);
void swiglu_backward(const Tensor& g, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup);

}  // namespace forge::cpu
