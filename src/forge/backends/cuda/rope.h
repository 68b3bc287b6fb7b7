#pragma once
// CUDA rotary position embedding (RoPE), the counterpart of backends/cpu/rope.h: same
// signature, math ("rotate_half" layout) and memory contract (x read through its strides,
// out overwritten; on CUDA out may be any layout with unit stride in the last dim). Plain C++
// declaration; the kernel is in rope.cu.
#include <cstdint>

#include "forge/backends/rope_functors.h"
#include "forge/core/tensor.h"

namespace forge::cuda {

// positions: (B, T) i64 contiguous on x's device, each row's positions in [0, position_limit)
// (the offset then unused; a position outside is clamped into the table, not checked: no host
// synchronisation), or undefined.
void rope(const Tensor& x, Tensor& out, int64_t position_offset, double theta, const fn::RopeScaling& scaling,
          bool inverse, const Tensor& positions = {}, int64_t position_limit = 0);

}  // namespace forge::cuda
