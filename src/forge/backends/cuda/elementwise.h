#pragma once
// CUDA elementwise kernels (unary and binary families), the counterparts of
// backends/cpu/unary.h and backends/cpu/binary.h. Declarations only; kernels in .cu files.
#include "forge/backends/binary_functors.h"
#include "forge/backends/unary_functors.h"
#include "forge/core/tensor.h"

namespace forge::cuda {

void unary(UnaryOp op, const Tensor& x, Tensor& out);
void unary_backward(UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& y, Tensor& out);
// out = op(a, b) with a, b already broadcast to out's shape (stride-0 dims) and of the
// compute dtype; comparisons write bool.
void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, double alpha = 1.0);
// out = cond ? a : b, all broadcast to out's shape; cond bool, a/b/out of one dtype.
void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out);
// SwiGLU, as cpu::swiglu / swiglu_backward (backends/swiglu_functors.h).
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out);
void swiglu_backward(const Tensor& g, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup);

}  // namespace forge::cuda
