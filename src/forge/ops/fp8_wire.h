#pragma once
// Vectors coded in FP8 for the wire: the codec of compressed gradient reductions
// (dist.grad_compression = "fp8", parallel/fp8_reduce.h).
//
//   fp8::WireBlocks b = fp8::encode_blocks(x.view({-1, fp8::kWireBlock}), fp8::Format::e4m3);
//   Tensor back = fp8::decode_blocks(b.codes, b.inv_scales, fp8::Format::e4m3);   // f32, x to 2^-4
//
// Note [FP8 wire blocks]: x (rows, 128), f32, is coded a row at a time: the row's amax a, its scale
// s = max_format / a (f32 division; 1 for a row of zeros, NaN when a is not finite), the codes x s
// rounded to the format (Note [FP8 rounding] in core/fp8.h: nearest, ties to even, saturating), and
// the factor 1 / s (f32) that decodes them: value = decode(code) * (1 / s). A finite row comes back
// within half a quantum of the format at each value's own binade (e4m3: 2^-4 relative, down to
// a / 448 * 2^-9 for the subnormals), whatever its other values; a row holding a NaN or an
// infinity decodes to NaN throughout. The same numbers on either device: the CPU codes with
// core/fp8.h's rounding, the GPU with the training casts' kernel (backends/cuda/fp8.h, groups of
// 1 x 128 and one factor per row), which rounds the same way; both decode by one 256-entry table.
#include "forge/core/fp8.h"
#include "forge/core/tensor.h"

namespace forge::fp8 {

inline constexpr int64_t kWireBlock = 128;

struct WireBlocks {
  Tensor codes;       // u8 (rows, 128)
  Tensor inv_scales;  // f32 (rows): 1 / s
};

// x: contiguous f32 (rows, 128) on the CPU or a GPU. Throws naming the shape otherwise.
WireBlocks encode_blocks(const Tensor& x, Format format);
// codes u8 (rows, 128) and inv_scales f32 (rows), on one device: f32 (rows, 128).
Tensor decode_blocks(const Tensor& codes, const Tensor& inv_scales, Format format);
// decode_blocks by device-neutral tensor ops (a table lookup, then a product): what a GPU runs;
// public so that the CPU's tests check it against the CPU's own loop.
Tensor decode_blocks_by_lookup(const Tensor& codes, const Tensor& inv_scales, Format format);

}  // namespace forge::fp8
