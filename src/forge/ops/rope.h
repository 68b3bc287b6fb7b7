#pragma once
// Rotary position embedding (RoPE) in the LLaMA / Hugging Face layout ("rotate_half").
//
//   x (B, H, T, D), D even  ->  (B, H, T, D)
//
// Dim i of the first half pairs with dim i + D/2 (not with the neighbouring dim 2i + 1, as
// in Meta's original complex-number code); the pair of position t is rotated by
// (position_offset + t) * theta^(-2i/D). This is
//   x * cos + rotate_half(x) * sin,   rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])
// of transformers' apply_rotary_pos_emb, so LLaMA checkpoints in HF format load as they are.
// position_offset (>= 0) is the position of query row 0: the length of the KV cache when
// decoding. Differentiable; the backward is the inverse rotation. Any strides; f32, f64,
// bf16, f16. CPU (cos/sin in f64) and CUDA (angles in f64, reduced to [-pi, pi], then f32
// sincos: Note [CUDA rope precision]).
//
// `scaling` rescales the frequencies theta^(-2i/D) by wavelength band, as LLaMA-3.1 and later do
// (Note [llama3 rope scaling], backends/rope_functors.h); the default is none.
#include <cstdint>

#include "forge/backends/rope_functors.h"
#include "forge/core/tensor.h"

namespace forge::ops {

// The frequencies' parameters: the kernels' shared math (backends/rope_functors.h), the type the ops take.
using RopeScaling = fn::RopeScaling;

Tensor rope(const Tensor& x, int64_t position_offset = 0, double theta = 10000.0,
            const RopeScaling& scaling = RopeScaling::none());

// Note [packed positions]: a row that packs several documents (data.packing = "documents") starts
// every document at position 0, so each (b, t) has a position of its own: positions (B, T) i64 on
// x's device, every value in [0, position_limit) (the tables' length; e.g. T). Row b's item t is
// rotated by positions[b, t] * freq_i. The CPU kernel checks the range (an error names the
// position); the CUDA kernel clamps into it (no host synchronisation; the positions forge makes
// are in range by construction). Equal to rope(x[b:b+1, :, t:t+1], positions[b, t]) item by item.
Tensor rope(const Tensor& x, const Tensor& positions, int64_t position_limit, double theta = 10000.0,
            const RopeScaling& scaling = RopeScaling::none());

}  // namespace forge::ops
