#pragma once
// CPU matrix products (see matmul.cpp for the math and the memory contract).
#include "forge/core/tensor.h"

namespace forge::cpu {

// out[b] = a[b] @ b[b] for every index b of the batch dims.
//   a   (*batch, M, K)  any strides; batch strides may be 0 (broadcast, never materialised)
//   b   (*batch, K, N)  any strides; likewise
//   out (*batch, M, N)  contiguous; overwritten
// a, b and out have one dtype and the same batch shape (the caller expands beforehand).
void matmul(const Tensor& a, const Tensor& b, Tensor& out);

}  // namespace forge::cpu
