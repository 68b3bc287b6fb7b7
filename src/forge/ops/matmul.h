#pragma once
// Matrix products with torch.matmul semantics: 1-D x 1-D dot, 2-D, 1-D promoted to a
// matrix, and batched N-D with broadcast batch dims. Operands with transposed last two
// dims go to BLAS as transposed without a copy.
#include "forge/core/tensor.h"

namespace forge::ops {

Tensor matmul(const Tensor& a, const Tensor& b);
// Strictly 2-D (M, K) x (K, N).
Tensor mm(const Tensor& a, const Tensor& b);
// Strictly 3-D (B, M, K) x (B, K, N).
Tensor bmm(const Tensor& a, const Tensor& b);

}  // namespace forge::ops
