#pragma once
// CPU layer norm and RMS norm over the last dim, forward and fused backward (see norm.cpp
// for the math). The ops (ops/norm.cpp) hand every tensor here contiguous; x is viewed as
// (R, C) rows: R = x.numel() / C, C = x's last dim.
//
// Statistics (mean, rstd) are stored in the "stat dtype": f32 for bf16/f16 inputs, the
// input's own dtype for f32/f64 (norm_stat_dtype).
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::cpu {

DType norm_stat_dtype(DType x);

// Gradients a norm backward may produce; each undefined member is skipped, each defined
// one is overwritten (never accumulated into).
struct NormGrads {
  Tensor dx;       // (R, C) x's dtype
  Tensor dx_add;   // (R, C) x's dtype or undefined: added into dx (CUDA only; may be dx itself)
  Tensor dweight;  // (C)    x's dtype
  Tensor dbias;    // (C)    x's dtype (layer norm only)
  // (C) x's dtype or undefined: the column sums of dx as written (dx_add included), where the
  // backend computes them with dx (CUDA's block-per-row kernel: Note [column sums handed to the
  // producer], autograd/node.h); dx_sums_done says whether it did. The CPU never does.
  Tensor dx_sums;
  bool dx_sums_done = false;
};

// y = (x - mean) * rstd * weight + bias, mean/rstd per row.
//   x      (R, C)  contiguous, floating
//   weight (C)     contiguous, x's dtype, or undefined (1)
//   bias   (C)     contiguous, x's dtype, or undefined (0)
//   y      (R, C)  contiguous, x's dtype; overwritten
//   mean   (R)     contiguous, stat dtype; overwritten
//   rstd   (R)     contiguous, stat dtype; overwritten
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& y,
                        Tensor& mean, Tensor& rstd);

// Fused residual add + layer norm (ops::add_layer_norm): h = x + residual, rounded to x's
// dtype exactly as ops::add rounds it, then layer_norm_forward(h) into y, mean, rstd (bit for
// bit what add followed by layer_norm gives).
//   x, residual (R, C)  contiguous, x's dtype
//   h           (R, C)  contiguous, x's dtype; overwritten
//   others as layer_norm_forward
void add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                            double eps, Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd);

// From dy (R, C) and what the forward saved: dx, dweight, dbias in one pass over the rows.
void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, NormGrads& grads);

// y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps) per row. Shapes as layer norm.
void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd);

// Fused residual add + RMS norm (ops::add_rms_norm): h = x + residual rounded to x's dtype as
// ops::add rounds it, then rms_norm_forward(h) into y and rstd (the bits of add then rms_norm).
// Shapes and contiguity as add_layer_norm_forward.
void add_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps, Tensor& h,
                          Tensor& y, Tensor& rstd);

// dx, dweight from dy (grads.dbias must be undefined).
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                       NormGrads& grads);

}  // namespace forge::cpu
