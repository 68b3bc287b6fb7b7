#pragma once
// CPU 2-D convolution (im2col + GEMM) and max pooling, forward and backward.
//
// conv2d, with K = Cin * kh * kw and L = Ho * Wo:
//   x (N, Cin, H, W)   w (Cout, Cin, kh, kw)   bias (Cout) or undefined   out (N, Cout, Ho, Wo)
//   Ho = (H + 2 ph - kh) / sh + 1,  Wo = (W + 2 pw - kw) / sw + 1   (floor; zero padding)
//   col_n[(ci, i, j), (oy, ox)] = x[n, ci, oy sh - ph + i, ox sw - pw + j]  (0 in the padding)
//   out_n (Cout, L) = w (Cout, K) @ col_n (K, L) + bias
// Backward, from dY_n = dL/d(out_n) (Cout, L):
//   dx_n = col2im(w^T @ dY_n)            (col2im adds each column entry back where it was read)
//   dw   = sum_n dY_n @ col_n^T          (col_n recomputed from x: never stored for all n)
//   db   = sum_n sum_l dY_n[:, l]
//
// max_pool2d, windows of (kh, kw) at strides (sh, sw), padding (ph, pw) that is never chosen:
//   out[n, c, oy, ox] = max over the window's in-bounds elements; indices[n, c, oy, ox] =
//   iy * W + ix of that element (its flat index in the (H, W) plane, as PyTorch's
//   return_indices). The first maximum in row-major window order wins a tie; a NaN wins
//   over any number (as PyTorch).
//   Backward: dx[n, c].flat[indices[n, c, oy, ox]] += dout[n, c, oy, ox].
//
// Memory contract:
// - Read only: x and dout (any strides), w (contiguous), bias (any strides), indices
//   (contiguous i64). Written: out, indices, dx, dw, db, all contiguous and overwritten
//   (never accumulated into); an undefined dx / dw / db is not computed.
// - Scratch per thread: one (K, L) column matrix (two in backward), plus f32 copies of the
//   sample for bf16/f16; backward keeps per-thread (Cout, K) / (Cout) partial sums of dw / db,
//   added in thread order at the end (deterministic for a given thread count).
//
// Precision: f32/f64 GEMMs in their own type (cblas_sgemm / cblas_dgemm); bf16/f16 through
// f32 with one rounding of each output. Pooling compares in double and copies the chosen
// element exactly; its backward sums in double.
//
// Threads: the N samples (conv2d) or N * C planes (pooling) are split across OpenMP threads,
// with OpenBLAS held to one thread meanwhile; a single sample keeps OpenBLAS's threads.
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::cpu {

struct Conv2dParams {
  int64_t sh = 1, sw = 1, ph = 0, pw = 0;
};

struct Pool2dParams {
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;
};

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p, Tensor& out);

// x_shape: the forward input's shape; x itself is read only for dw (undefined if dw is).
void conv2d_backward(const Tensor& dout, const Tensor& x, const Shape& x_shape, const Tensor& w, const Conv2dParams& p,
                     Tensor& dx, Tensor& dw, Tensor& db);

void max_pool2d_forward(const Tensor& x, const Pool2dParams& p, Tensor& out, Tensor& indices);

// dx: (N, C, H, W) of the forward's input.
void max_pool2d_backward(const Tensor& dout, const Tensor& indices, Tensor& dx);

}  // namespace forge::cpu
