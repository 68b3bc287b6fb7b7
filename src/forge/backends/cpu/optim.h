#pragma once
// CPU kernels of the optimizers: the fused AdamW step, the two passes of gradient
// clipping (sum of squares, in-place scale), and the counterparts of the CUDA primitives
// of backends/cuda/optim.h (total norm with optional unscaling, clipping by a norm held in
// a tensor, the non-finite flag, the loss-scale update) with the same signatures.
//
// AdamW, one pass per tensor (Loshchilov & Hutter, decoupled weight decay), with
// t = hp.step (1-based: this update is the t-th of this parameter):
//   x   = master ? master : p                     (the weight in the state precision S)
//   x  *= 1 - lr * wd                              (decoupled decay, before the moments)
//   m   = beta1 * m + (1 - beta1) * g
//   v   = beta2 * v + (1 - beta2) * g * g
//   x  -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//   p   = round_to_dtype(p)(x);  master = x        (Note [bf16 master weights], optim/adamw.h)
// S (the state and compute precision) is double for f64 parameters and float for f32,
// bf16 and f16 ones; the per-tensor scalars (bias corrections, step size) are computed
// once in double and rounded to S. The element math is fn::adamw_update and the scalars
// fn::adamw_scalars (backends/optim_functors.h), shared with the CUDA kernel, so the two
// backends produce the same bits (Note [optimizer rounding]).
//
// Memory contract (adamw_step): every tensor contiguous and on the CPU, numel equal.
//   p       (N) f32/f64/bf16/f16   read and overwritten
//   g       (N) p's dtype          read only
//   m, v    (N) S                  read and overwritten (first and second moments)
//   master  (N) f32 or undefined   read and overwritten; must be defined exactly when p is
//                                  bf16/f16 (it holds the unrounded weight)
// One read of p|master, g, m, v and one write of p, m, v (and master) per element;
// elements are split across OpenMP threads. The caller bumps the storage versions.
//
// Clipping: sum_of_squares(t) = sum_i t_i^2 accumulated in double (each element converted
// to double first), in fixed blocks whose partial sums are added in block order, so the
// result does not depend on the number of threads. scale_(t, s): t_i = round(t_i * s),
// the product taken in double (s is not rounded to t's dtype first). Both take any
// floating dtype; t contiguous.
//
// The tensor-valued primitives (contracts in backends/cuda/optim.h; here every tensor is
// on the CPU and contiguous, and the 0-d results are CPU tensors):
//   total_norm        norm = sqrt(sum over ts of sum_of_squares) rounded to f32; found =
//                     (that sum not finite); with loss_scale s, each t first gets
//                     scale_(t, float(1 / double(s))), the unscale of torch.amp.GradScaler
//   clip_with_norm_   scale_(t, max_norm / (norm + 1e-6)) for every t when the f32 norm is
//                     finite and > max_norm
//   non_finite_flag   flag = (x inf or NaN) ? 1 : 0
//   update_loss_scale torch._amp_update_scale_ (see the CUDA header)
#include <cstdint>
#include <vector>

#include "forge/core/tensor.h"

namespace forge::cpu {

struct AdamWStepArgs {
  double lr = 0;
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double weight_decay = 0;
  int64_t step = 1;  // 1-based count of updates of this tensor, including this one
};

void adamw_step(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, Tensor& master, const AdamWStepArgs& args);

double sum_of_squares(const Tensor& t);
void scale_(Tensor& t, double s);

void total_norm(const std::vector<Tensor>& ts, const Tensor& loss_scale, Tensor& norm, Tensor& found);
void clip_with_norm_(const std::vector<Tensor>& ts, const Tensor& norm, double max_norm);
void non_finite_flag(const Tensor& x, Tensor& flag);
void update_loss_scale(Tensor& scale, Tensor& growth_tracker, const Tensor& found, double growth_factor,
                       double backoff_factor, int64_t growth_interval);

}  // namespace forge::cpu
