#pragma once
#include "forge/backends/binary_functors.h"
#include "forge/core/tensor.h"

namespace forge::cpu {

// out = op(a, b): a and b of one dtype and already broadcast to out's shape (stride-0
// dims); out has that dtype, or bool for comparisons. out may alias a (in-place).
void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, double alpha = 1.0);
// out = cond ? a : b, all broadcast to out's shape; cond bool, a/b/out of one dtype.
void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out);

}  // namespace forge::cpu
