// Gradient clipping by the global L2 norm. See clip.h:
//   norm = sqrt(sum_p ||g_p||^2) in double;  norm > max_norm: g_p *= max_norm / (norm + 1e-6).
#include "forge/optim/clip.h"

#include <cmath>
#include <unordered_set>

#include "forge/autograd/grad_mode.h"
#include "forge/backends/cpu/optim.h"
#include "forge/ops/copy.h"
#include "forge/ops/dispatch_device.h"

namespace forge::optim {
namespace {

// The defined gradients of `params`, each once, all checked to be on the CPU.
std::vector<Tensor> gradients(const std::vector<Tensor>& params, const char* op) {
  std::vector<Tensor> grads;
  std::unordered_set<const TensorImpl*> seen;
  for (const Tensor& p : params) {
    FORGE_CHECK(p.defined(), op, ": got an undefined tensor in the parameter list");
    const Tensor& g = p.grad();
    if (!g.defined() || !seen.insert(p.impl()).second) continue;
    if (!g.is_cpu()) ops::detail::throw_not_on_cuda(op);
    FORGE_CHECK(is_floating(g.dtype()), op, ": gradient of dtype ", dtype_name(g.dtype()), " (shape ", g.shape(),
                ") is not floating-point");
    grads.push_back(g);
  }
  return grads;
}

double norm_of(const std::vector<Tensor>& grads) {
  double total = 0;
  for (const Tensor& g : grads) total += cpu::sum_of_squares(g.is_contiguous() ? g : ops::contiguous(g.detach()));
  return std::sqrt(total);
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  return norm_of(gradients(params, "grad_norm"));
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  FORGE_CHECK(max_norm >= 0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  NoGradGuard no_grad;
  const std::vector<Tensor> grads = gradients(params, "clip_grad_norm");
  const double norm = norm_of(grads);
  if (!std::isfinite(norm) || norm <= max_norm) return norm;
  const double coef = max_norm / (norm + 1e-6);
  for (Tensor g : grads) {
    if (g.is_contiguous()) {
      cpu::scale_(g, coef);
      g.storage()->bump_version();
    } else {
      Tensor c = ops::contiguous(g);
      cpu::scale_(c, coef);
      ops::copy_(g, c);
    }
  }
  return norm;
}

}  // namespace forge::optim
