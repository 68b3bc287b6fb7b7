#pragma once
// CUDA embedding lookup and its backward: the counterparts of backends/cpu/embedding.h,
// with the same signatures, math and memory contract (see there and embedding.cu). Ids are
// checked on the device (Note [device-side index checks] in reduce.cuh): an out-of-range
// id fails the kernel instead of throwing, and is never dereferenced.
#include "forge/core/tensor.h"

namespace forge::cuda {

// out[n, :] = weight[ids[n], :].
//   weight (V, C) contiguous, floating; ids (N) any shape, contiguous, i32/i64;
//   out (N, C) contiguous, weight's dtype; overwritten
void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out);

// dweight[v, :] = sum over n with ids[n] == v of dout[n, :]  (deterministic; f32 accumulation).
//   dout (N, C) contiguous, floating; ids (N) contiguous, i32/i64;
//   dweight (V, C) contiguous, dout's dtype; overwritten (rows no id names are zero)
void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dweight);

}  // namespace forge::cuda
