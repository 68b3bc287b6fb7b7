#pragma once
// CPU indexing kernels (see index.cpp for the math and the memory contract). Index
// tensors are i32 or i64; every index is range-checked before any element is written,
// and an out-of-range one throws forge::Error naming the op, the value, the dim and its size.
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::cpu {

// out[..., j, ...] = x[..., index[j], ...] along dim.
//   x     (*pre, S, *post)  any strides
//   index (n) or 0-d        any stride
//   out   (*pre, n, *post)  contiguous; overwritten
void index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out);

// out[p] = x[p with p[dim] replaced by index[p]], for every position p of index.
//   x     (S0, ..., Sk)     any strides
//   index (I0, ..., Ik)     any strides; I_d <= S_d for d != dim
//   out   (I0, ..., Ik)     contiguous; overwritten
void gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out);

// out[p with p[dim] replaced by index[p]] += src[p], for every position p of index.
//   out   (S0, ..., Sk)     contiguous; accumulated in place (+=)
//   index (I0, ..., Ik)     any strides; I_d <= S_d for d != dim
//   src   (R0, ..., Rk)     any strides; I_d <= R_d for every d (only index's extent is read)
void scatter_add_(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);

}  // namespace forge::cpu
