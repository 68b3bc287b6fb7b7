#pragma once
// FP8 casts and scaled GEMMs on the GPU: the device side of the FP8 training recipes (issue 39;
// ops/fp8.h has the recipes, Note [FP8 recipes], and their CPU emulation, which these kernels are
// tested against). Plain C++ declarations (no CUDA headers), so ops/ can include them always and
// call them through FORGE_ON_CUDA.
//
//   // x (R, C) bf16 on cuda:0, one scale per row (rowwise activations) and, for the backward, the
//   // transposed codes with one scale per column of x:
//   Tensor amax_rows = cuda::fp8_group_amax(x, {1, C}), amax_cols = cuda::fp8_group_amax(x, {R, 1});
//   cuda::Fp8Cast c = cuda::fp8_cast(x, Format::e4m3, amax_rows, {1, C}, Fp8ScaleMode::outer, false);
//   cuda::fp8_scaled_gemm(c.operand(), w_cast.operand(), y);      // y (R, N) = x w^T, bf16
//
// Note [FP8 cast groups]: a cast scales the groups of a source matrix x (R, C): element (i, j) is in
// group (i / gr, j / gc), and every group has one amax (the largest |x| in it, NaN if any entry is
// NaN) and one scale s = max_format / amax (1 for a group of zeros, NaN for a non-finite amax),
// exactly as fp8::quantize computes them on the CPU (f32 division, then x * s rounded to the
// nearest code, ties to even, saturating; NaN stays NaN). The codes may be written as x's own
// layout (R, C) or transposed (C, R) (the backward GEMMs need x^T, w^T and dy^T with the
// reduction dimension contiguous: Note [FP8 GEMM layout] in gemm_fp8.h). Recipes' groups:
// tensorwise (R, C); rowwise (1, C), and (R, 1) for a transposed cast (one scale per row of the
// transposed matrix); blockwise activations and gradients (1, 128), or (128, 1) transposed;
// blockwise weights (128, 128) either way.
//
// Note [FP8 GEMM scales]: cuBLASLt multiplies each product by the operands' dequantisation
// factors, 1 / s, which the cast writes beside the codes in the layout the GEMM reads, for an
// operand of `rows` rows and reduction length `k` (its codes (rows, k), k contiguous):
//   scalar  one factor (tensorwise)                            CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F
//   outer   one per row: rows factors (rowwise)                 ..._OUTER_VEC_32F
//   vec128  one per row per 128 along k: factor (row, kb) at kb * rows + row (rows contiguous,
//           "outer-dimension major", as torch._scaled_mm's 1 x 128 scales)       ..._VEC128_32F
//   blk128  one per 128 x 128 block: (rb, kb) at rb * ceil4(ceil(k / 128)) + kb (the reduction
//           blocks contiguous, padded to a multiple of 4)                         ..._BLK128x128_32F
// Hopper runs vec128 x blk128 and vec128 x vec128 (the blockwise recipe's three GEMMs); outer and
// the block modes need cuBLASLt >= 12.9 and compute capability 9.0.
#include <cstdint>

#include "forge/core/fp8.h"
#include "forge/core/tensor.h"

namespace forge::cuda {

using fp8::Format;

struct Fp8Groups {
  int64_t rows = 1, cols = 1;  // gr, gc (Note [FP8 cast groups])
};

enum class Fp8ScaleMode : uint8_t { scalar, outer, vec128, blk128 };

// The amax of each group of x (R, C) (contiguous bf16 or f32 on a GPU): a new f32 tensor
// (ceil(R / gr), ceil(C / gc)), row-major. When `slot` is not null (a float in device memory,
// read as its bits), the largest |x| is also maxed into it atomically (for the guardrails and the
// telemetry: Note [FP8 guardrails] in ops/fp8.h). Queued on the current stream.
Tensor fp8_group_amax(const Tensor& x, Fp8Groups g, float* slot = nullptr);
// Both tables of two groupings in one pass over x (a rowwise operand's rows and columns).
void fp8_group_amax2(const Tensor& x, Fp8Groups g0, Tensor& amax0, Fp8Groups g1, Tensor& amax1, float* slot = nullptr);

// How many factors an operand of `rows` rows and reduction length `k` has in `mode`'s layout
// (Note [FP8 GEMM scales]): 1, rows, ceil(k / 128) rows, or ceil(rows / 128) ceil4(ceil(k / 128)).
// Plain arithmetic: defined inline, usable without a GPU.
inline int64_t fp8_factor_count(Fp8ScaleMode mode, int64_t rows, int64_t k) {
  const int64_t kb = (k + 127) / 128;
  switch (mode) {
    case Fp8ScaleMode::scalar: return 1;
    case Fp8ScaleMode::outer: return rows;
    case Fp8ScaleMode::vec128: return kb * rows;
    case Fp8ScaleMode::blk128: return (rows + 127) / 128 * ((kb + 3) / 4 * 4);
  }
  return 1;
}

// An operand of fp8_scaled_gemm: codes (rows, k), u8 bit patterns of `format`, k contiguous, and
// the dequantisation factors in `mode`'s layout (Note [FP8 GEMM scales]).
struct Fp8Operand {
  Tensor codes;
  Tensor inv_scales;
  Format format = Format::e4m3;
  Fp8ScaleMode mode = Fp8ScaleMode::scalar;
};

// x (R, C) cast with the amaxes `amax` of groups `g` (fp8_group_amax), as codes (R, C), or (C, R)
// when `transposed`, and the factors in `mode`'s layout for that orientation. `mode` must match the
// groups: scalar for one group, outer for whole rows of the result, vec128 for 1 x 128 groups of
// the result, blk128 for 128 x 128. Queued on the current stream.
Fp8Operand fp8_cast(const Tensor& x, Format format, const Tensor& amax, Fp8Groups g, Fp8ScaleMode mode,
                    bool transposed);
// Both casts of x in one pass: x's own layout (groups g0, mode m0) and the transposed (g1, m1).
void fp8_cast2(const Tensor& x, Format format, const Tensor& amax0, Fp8Groups g0, Fp8ScaleMode m0, Fp8Operand& out0,
               const Tensor& amax1, Fp8Groups g1, Fp8ScaleMode m1, Fp8Operand& out1);

// d (m, n) = a (m, k) b_t (n, k)^T with each product scaled by the operands' factors, accumulated
// in f32, written as d's dtype (bf16 or f32; contiguous). m, n, k multiples of 16; not both
// operands e5m2. Throws naming the shapes, formats and modes when cuBLASLt has no algorithm.
void fp8_scaled_gemm(const Fp8Operand& a, const Fp8Operand& b_t, Tensor& d);

// Whether `device` runs FP8 GEMMs with `mode` scales: scalar from compute capability 8.9
// (cuBLASLt >= 11.8), the others on 9.0 with cuBLASLt >= 12.9.
bool fp8_scale_mode_supported(int device, Fp8ScaleMode mode);

// Note [FP8 delayed scaling] (ops/fp8.h) on the GPU, for a one-group (tensorwise) table: amax (one
// f32) holds the cast's own amax; a history of `h` floats with meta = {next position, count} (int32,
// both on the device). When the history holds any entry and the current amax is finite, amax
// becomes the history's largest (the scale the cast then uses); with `push` a finite current amax
// then enters the history (the oldest leaves once it holds h). One thread, queued on the current
// stream: no host synchronisation, capturable in a CUDA graph.
void fp8_delayed_amax(Tensor& amax, float* history, int32_t* meta, int64_t h, bool push);

// Whether this thread's current stream of `device` is capturing a CUDA graph (graph.h's
// is_capturing, for code that cannot include CUDA headers).
bool fp8_capturing(int device);

}  // namespace forge::cuda
