#pragma once
// Elementwise binary ops with NumPy broadcasting and PyTorch's type promotion
// (promote_types; a 0-d tensor raises a dimensioned tensor's dtype only when it is of a
// higher category, bool < integer < floating, as torch.result_type). A double scalar operand adopts the tensor's dtype when that is
// floating; on an integer tensor it keeps the integer dtype when the value is integral
// (like a Python int in PyTorch; i64 for bool tensors) and promotes to f32 otherwise (like
// a Python float).
// Comparisons return bool tensors.
#include "forge/core/tensor.h"

namespace forge::ops {

Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a - alpha * b
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor rsub(const Tensor& a, double b);  // b - a
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor rdiv(const Tensor& a, double b);  // b / a
Tensor pow(const Tensor& a, double exponent);
Tensor pow(double base, const Tensor& exponent);
Tensor maximum(const Tensor& a, double b);
Tensor minimum(const Tensor& a, double b);

Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);

// cond ? a : b, all three broadcast together; cond must be bool.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, double b);
// x with `value` where mask (bool, broadcastable to x) is true.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

// In-place (not differentiable; see check_inplace): a += alpha * b, a *= s.
Tensor& add_(Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor& mul_(Tensor& a, double s);

}  // namespace forge::ops
