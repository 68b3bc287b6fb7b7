#pragma once
// Matrix products with torch.matmul semantics: 1-D x 1-D dot, 2-D, 1-D promoted to a
// matrix, and batched N-D with broadcast batch dims. Operands with transposed last two
// dims go to BLAS as transposed without a copy.
//
// Both operands must have one dtype (no promotion, as PyTorch): f32/f64 (BLAS), bf16/f16
// (f32 accumulation), i32/i64/u8 (exact loop, not differentiable). Gradients of
// broadcast batch dims are summed back to each operand's shape.
#include "forge/core/tensor.h"

namespace forge::ops {

// (K)·(K) -> 0-d; (K)@(*, K, N) -> (*, N); (*, M, K)@(K) -> (*, M);
// (*a, M, K)@(*b, K, N) -> (*broadcast(a, b), M, N).
Tensor matmul(const Tensor& a, const Tensor& b);
// Strictly 2-D (M, K) x (K, N).
Tensor mm(const Tensor& a, const Tensor& b);
// Strictly 3-D (B, M, K) x (B, K, N).
Tensor bmm(const Tensor& a, const Tensor& b);

}  // namespace forge::ops
