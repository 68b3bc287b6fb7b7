#pragma once
// CPU rotary position embedding (RoPE), the LLaMA / Hugging Face "rotate_half" layout.
//
//   x, out (B, H, T, D), D even, h = D / 2
//   pos_t   = position_offset + t
//   freq_i  = theta^(-2i / D),   angle_ti = pos_t * freq_i,   i in [0, h)
//             (rescaled by band with llama3 `scaling`: backends/rope_functors.h)
//   out[..., t, i]     = x[..., t, i] cos(angle_ti) - x[..., t, i + h] sin(angle_ti)
//   out[..., t, i + h] = x[..., t, i + h] cos(angle_ti) + x[..., t, i] sin(angle_ti)
// i.e. each pair (i, i + h) is rotated by angle_ti, which is x * cos + rotate_half(x) * sin
// with cos/sin tables repeated twice along D (HF's apply_rotary_pos_emb).
//
// `inverse` rotates by -angle_ti instead: the backward of the op (a rotation's adjoint is its
// inverse), dx = rope^-1(dout).
//
// Memory contract: x is read through its strides (any, no copy); out is contiguous and
// overwritten. The (T, h) cos/sin tables are computed in double per call; the rotation runs
// in double and is rounded once to the output dtype (f32, f64, bf16, f16).
// Threads: (b, h, t) rows are split across OpenMP threads.
#include <cstdint>

#include "forge/backends/rope_functors.h"
#include "forge/core/tensor.h"

namespace forge::cpu {

// positions: (B, T) i64 contiguous, each row's positions in [0, position_limit) (pos_t =
// positions[b, t], the offset unused: a packed row's documents restart at 0, ops/rope.h; a
// position outside throws), or undefined.
void rope(const Tensor& x, Tensor& out, int64_t position_offset, double theta, const fn::RopeScaling& scaling,
          bool inverse, const Tensor& positions = {}, int64_t position_limit = 0);

}  // namespace forge::cpu
