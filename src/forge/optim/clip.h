#pragma once
// Gradient clipping by the global L2 norm, as torch.nn.utils.clip_grad_norm_, and the
// non-finite guard of mixed-precision training.
//
// Over the parameters whose .grad is defined (each tensor once, if listed twice):
//   norm = sqrt( sum_p sum_i g_p,i^2 )               accumulated in double
//   if norm > max_norm:  g_p <- g_p * max_norm / (norm + 1e-6)   for every p, in place
// The 1e-6 is torch's; it leaves the clipped norm a hair under max_norm. A gradient
// at or below max_norm is not touched. A non-finite norm (a NaN or inf in some gradient)
// is returned with every gradient untouched: the caller decides (skip the step, lower
// the loss scale). The scale is applied in double and rounded once to the gradient's
// dtype. max_norm must be >= 0 (+inf: only measure).
//
// Two forms:
//   double clip_grad_norm(params, max_norm)   returns the norm to the host: on a GPU that
//                                             is one synchronisation per call
//   Tensor clip_grad_norm_(params, max_norm)  returns it as a 0-d f32 tensor on the
//                                             gradients' device; on a GPU nothing waits:
//                                             the clip decision is made by the kernels,
//                                             and the norm is read when it is logged
// The tensor form is total_grad_norm (one multi-tensor pass, deterministic: fixed
// per-block partial sums reduced in a fixed order) followed by clip_grads_with_norm_
// (one multi-tensor pass that does nothing unless the norm on the device says so).
// Optimizer::clip_next_step(max_norm, norm) (optimizer.h) replaces that second pass: the
// next step() updates with the clipped gradients, bit for bit, and AdamW on a GPU computes
// them in its update kernel without writing .grad (Note [clipping inside the update]). The
// double form keeps the norm in double on the CPU; the tensor form rounds it to f32 on
// every device, and clips with that f32 value.
//
// Note [non-finite detection]: the sum of squares is the non-finite detector. Squares are
// accumulated in double, where no finite f32/bf16/f16 gradient can overflow (the largest
// f32 square is 1.2e77), so the sum is inf or NaN exactly when some gradient element is
// inf or NaN (inf + x = inf, NaN + x = NaN, inf - inf never occurs: squares are >= 0).
// found_non_finite(norm) turns that into a 0-d f32 flag (1 = skip) computed on the device,
// which Optimizer::step(skip_if) consumes without a host synchronisation:
//   Tensor norm = optim::clip_grad_norm_(params, 1.0);
//   opt.step(optim::found_non_finite(norm));   // a NaN/inf gradient: nothing changes
//   ... log norm.item() now and then; count the skips by adding up the flags on the device
// (An f32 norm above 3.4e38 also reads as inf: such a step is skipped too.)
//
// Gradients of any floating dtype; all the defined gradients of one call on one device.
#include <vector>

#include "forge/core/tensor.h"

namespace forge::optim {

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

// The global L2 norm of the defined gradients of `params` (no clipping).
double grad_norm(const std::vector<Tensor>& params);

// ---- on the gradients' device, without host synchronisation ------------------------------
// Every result is a 0-d f32 tensor on the device of the gradients (of the first parameter
// when no parameter has a gradient: then the norm is 0).

// The global L2 norm (0-d f32).
Tensor total_grad_norm(const std::vector<Tensor>& params);
// g_p <- g_p * max_norm / (norm + 1e-6) for every defined gradient when the 0-d `norm`
// (any floating dtype, the gradients' device) is finite and > max_norm; decided on the device.
void clip_grads_with_norm_(const std::vector<Tensor>& params, double max_norm, const Tensor& norm);
// total_grad_norm, then clip_grads_with_norm_; returns the norm before clipping.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);
// 1 if the one-element `x` is inf or NaN, else 0 (0-d f32 on x's device).
Tensor found_non_finite(const Tensor& x);
// The flag of the gradients of `params`: found_non_finite(total_grad_norm(params)).
Tensor found_non_finite(const std::vector<Tensor>& params);

namespace detail {
// The norm pass behind all of the above and LossScaler::unscale_: returns the norm (0-d
// f32) and writes `found` (0-d f32 flag) if defined; with `loss_scale` (0-d f32 s) every
// gradient is first multiplied in place by float(1 / double(s)). All on the gradients' device.
Tensor grad_norm_pass(const std::vector<Tensor>& params, const char* op, const Tensor& loss_scale,
                      const Tensor& found);
}  // namespace detail

}  // namespace forge::optim
