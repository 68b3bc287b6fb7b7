#pragma once
// Gradient clipping by the global L2 norm, as torch.nn.utils.clip_grad_norm_.
//
// Over the parameters whose .grad is defined (each tensor once, if listed twice):
//   norm = sqrt( sum_p sum_i g_p,i^2 )               accumulated in double
//   if norm > max_norm:  g_p <- g_p * max_norm / (norm + 1e-6)   for every p, in place
// The 1e-6 is torch's; it leaves the clipped norm a hair under max_norm. A gradient
// at or below max_norm is not touched. A non-finite norm (a NaN or inf in some gradient)
// is returned with every gradient untouched: the caller decides (skip the step, lower
// the loss scale). Returns the norm before clipping; 0 when no parameter has a gradient.
//
// CPU gradients of any floating dtype (scaled in double, rounded once to their dtype);
// CUDA gradients are refused for now (no kernel yet). max_norm must be >= 0 (+inf: only
// measure).
#include <vector>

#include "forge/core/tensor.h"

namespace forge::optim {

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

// The global L2 norm of the defined gradients of `params` (no clipping).
double grad_norm(const std::vector<Tensor>& params);

}  // namespace forge::optim
