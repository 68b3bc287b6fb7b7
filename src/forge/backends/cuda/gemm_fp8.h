#pragma once
// FP8 (e4m3) GEMMs through cuBLASLt, for `forge bench gemm --dtype fp8` (docs/bench.md). Plain
// C++ (no CUDA headers), so src/forge/bench/*.cpp can include it under FORGE_WITH_CUDA.
// forge has no fp8 dtype: e4m3 matrices are stored as u8 tensors holding the bit patterns.
//
//   if (cuda::fp8_gemm_supported(0)) {
//     Tensor a = cuda::random_e4m3(0, {m, k}, 1), b_t = cuda::random_e4m3(0, {n, k}, 2);
//     Tensor d = forge::empty({m, n}, {.dtype = DType::bf16, .device = Device::cuda(0)});
//     cuda::fp8_gemm_bf16_out(a, b_t, scale_a, scale_b, d);   // d = sa sb a b_t^T
//   }
//
// Note [FP8 GEMM layout]
// On Hopper cuBLASLt runs e4m3 GEMMs only in the "TN" form: in its column-major terms the
// first operand transposed and the second not, both with the reduction dimension k
// contiguous. For row-major forge matrices that is D (m, n) = A (m, k) B_t (n, k)^T: both
// operands row-major with k last (A as activations, B_t as an nn.Linear weight (out, in)).
// Row-major D is column-major D^T (n, m) = B_t A^T, so cuBLASLt's A is our B_t (stored
// column-major (k, n), ld k, op T), its B is our A (column-major (k, m), ld k, op N), and its
// D is our D (column-major (n, m), ld n). FLOPs: 2 m n k, as for A (m, k) B (k, n).
//
// Precision: products of e4m3 values accumulated in f32 (CUBLAS_COMPUTE_32F), multiplied by
// scale_a * scale_b (per-tensor f32 scales read from device memory), rounded once to bf16.
// With fast_accum cuBLASLt may keep the Hopper tensor cores' reduced-precision running sum
// instead of promoting it to f32 periodically (faster, less accurate; off by default, as in
// torch._scaled_mm).
//
// Plans (descriptor, layouts, heuristic algorithm with a 32 MiB workspace) are cached per
// (device, m, n, k, fast_accum, pointer alignments); one cuBLASLt handle per device and one
// workspace per (device, stream), separate from blaslt.h's. Calls are queued on
// cuda::current_stream(device) without host synchronisation.
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::cuda {

// Whether `device` can run fp8_gemm_bf16_out: compute capability >= 8.9 (Ada, Hopper and
// later) and a cuBLASLt with FP8 (>= 11.8). False, never an error, for an invalid device.
bool fp8_gemm_supported(int device);

// d (m, n) = scale_a * scale_b * a (m, k) @ b_t (n, k)^T (Note [FP8 GEMM layout]). a, b_t: u8
// tensors of e4m3 bit patterns, contiguous, on one CUDA device; d: contiguous bf16 (m, n) on it;
// scale_a, scale_b: one-element f32 tensors on it. m, n, k multiples of 16 (cuBLASLt's FP8
// requirement), pointers 16-byte aligned. Throws forge::Error on bad arguments, on a device
// without FP8 support, when cuBLASLt offers no algorithm, and on CUDA/cuBLAS errors.
void fp8_gemm_bf16_out(const Tensor& a, const Tensor& b_t, const Tensor& scale_a, const Tensor& scale_b, Tensor& d,
                       bool fast_accum = false);

// A new contiguous u8 tensor of `shape` on `device` holding e4m3 encodings of values uniform
// in [-max_abs, max_abs) (rounded to nearest e4m3, saturating; never NaN), from a counter-based
// hash of (seed, index): the same seed gives the same bits. 0 < max_abs <= 448. Runs on the
// current stream (no host synchronisation).
Tensor random_e4m3(int device, const Shape& shape, uint64_t seed, float max_abs = 2.0f);

// The value of an e4m3 bit pattern (1 sign, 4 exponent bits with bias 7, 3 mantissa bits;
// subnormals for exponent 0; no infinities; 0x7f and 0xff are NaN). Host code.
float e4m3_to_float(uint8_t bits);

}  // namespace forge::cuda
