#pragma once
// CPU embedding lookup and its backward (see embedding.cpp for the math and the memory
// contract). Ids are i32 or i64, any shape, flattened to N = ids.numel() positions; every
// id is range-checked before anything is written, and an out-of-range one throws
// forge::Error naming the id, its position and V.
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::cpu {

// out[n, :] = weight[ids[n], :].
//   weight (V, C)          contiguous, floating
//   ids    (N) any shape   contiguous, i32/i64, each in [0, V)
//   out    (N, C)          contiguous (any shape of N * C elements), weight's dtype; overwritten
void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out);

// dweight[v, :] = sum over n with ids[n] == v of dout[n, :]   (in increasing n).
//   dout    (N, C)  contiguous (any shape of N * C elements), floating
//   ids     (N)     contiguous, i32/i64, each in [0, V)
//   dweight (V, C)  contiguous, dout's dtype; overwritten (rows no id names are zero)
void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dweight);

}  // namespace forge::cpu
