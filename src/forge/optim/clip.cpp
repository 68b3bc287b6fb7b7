// Gradient clipping by the global L2 norm and the non-finite guard. See clip.h:
//   norm = sqrt(sum_p ||g_p||^2) in double;  norm > max_norm: g_p *= max_norm / (norm + 1e-6).
// The double API keeps its host computation on the CPU; the tensor API (and the double
// API on a GPU) runs the norm pass of the device's backend (cpu:: / cuda::total_norm).
#include "forge/optim/clip.h"

#include <cmath>
#include <unordered_set>

#include "forge/autograd/grad_mode.h"
#include "forge/backends/cpu/optim.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/optim.h"
#endif

namespace forge::optim {
namespace {

// The defined gradients of `params`, each once.
std::vector<Tensor> gradients(const std::vector<Tensor>& params, const char* op) {
  std::vector<Tensor> grads;
  std::unordered_set<const TensorImpl*> seen;
  for (const Tensor& p : params) {
    FORGE_CHECK(p.defined(), op, ": got an undefined tensor in the parameter list");
    const Tensor& g = p.grad();
    if (!g.defined() || !seen.insert(p.impl()).second) continue;
    FORGE_CHECK(is_floating(g.dtype()), op, ": gradient of dtype ", dtype_name(g.dtype()), " (shape ", g.shape(),
                ") is not floating-point");
    grads.push_back(g);
  }
  return grads;
}

// The one device of `grads` (the first parameter's when there are none; the CPU without parameters).
Device device_of(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const char* op) {
  if (grads.empty()) return params.empty() ? Device::cpu() : params[0].device();
  const Device d = grads[0].device();
  for (const Tensor& g : grads)
    FORGE_CHECK(g.device() == d, op, ": gradients on ", d.str(), " and on ", g.device().str(),
                "; the gradients of one call must be on one device");
  return d;
}

double norm_of(const std::vector<Tensor>& grads) {
  double total = 0;
  for (const Tensor& g : grads) total += cpu::sum_of_squares(g.is_contiguous() ? g : ops::contiguous(g.detach()));
  return std::sqrt(total);
}

// Contiguous working tensors for the kernels: the gradients themselves, or copies of the
// strided ones that done() writes back.
struct Work {
  std::vector<Tensor> grads, work;
  explicit Work(std::vector<Tensor> g) : grads(std::move(g)) {
    work.reserve(grads.size());
    for (const Tensor& t : grads) work.push_back(t.is_contiguous() ? t : ops::contiguous(t));
  }
  // After an in-place kernel: copy back, or bump the version of what was written in place.
  void done() {
    for (size_t i = 0; i < grads.size(); ++i) {
      if (work[i].is_same(grads[i])) grads[i].storage()->bump_version();
      else ops::copy_(grads[i], work[i]);
    }
  }
};

// A one-element tensor of `dev` as the kernels want it: contiguous f32.
Tensor f32_scalar(const Tensor& t, Device dev, const char* op, const char* what) {
  FORGE_CHECK(t.defined() && t.numel() == 1 && is_floating(t.dtype()), op, ": ", what,
              " must be a one-element floating-point tensor, got ",
              t.defined() ? shape_str(t.shape()) + " " + dtype_name(t.dtype()) : std::string("an undefined tensor"));
  FORGE_CHECK(t.device() == dev, op, ": ", what, " is on ", t.device().str(), " but the gradients are on ", dev.str());
  const Tensor d = t.detach();
  return d.dtype() == DType::f32 && d.is_contiguous() ? d : d.to(DType::f32).contiguous();
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  const std::vector<Tensor> grads = gradients(params, "grad_norm");
  if (grads.empty()) return 0.0;
  if (device_of(params, grads, "grad_norm").is_cpu()) return norm_of(grads);
  return total_grad_norm(params).item<double>();
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  FORGE_CHECK(max_norm >= 0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  NoGradGuard no_grad;
  const std::vector<Tensor> grads = gradients(params, "clip_grad_norm");
  if (grads.empty()) return 0.0;
  if (!device_of(params, grads, "clip_grad_norm").is_cpu()) return clip_grad_norm_(params, max_norm).item<double>();
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

Tensor detail::grad_norm_pass(const std::vector<Tensor>& params, const char* op, const Tensor& loss_scale,
                              const Tensor& found) {
  NoGradGuard no_grad;
  const std::vector<Tensor> grads = gradients(params, op);
  const Device dev = device_of(params, grads, op);
  Tensor norm = empty({}, {.dtype = DType::f32, .device = dev});
  const Tensor scale = loss_scale.defined() ? f32_scalar(loss_scale, dev, op, "the loss scale") : Tensor();
  if (found.defined()) {
    FORGE_CHECK(found.numel() == 1 && found.dtype() == DType::f32 && found.is_contiguous() && found.device() == dev,
                op, ": the found flag must be a one-element f32 tensor on ", dev.str());
  }
  Tensor flag = found;
  Work w(grads);
  if (dev.is_cpu()) cpu::total_norm(w.work, scale, norm, flag);
  else FORGE_ON_CUDA(op, cuda::total_norm(w.work, scale, norm, flag));
  if (scale.defined()) w.done();
  return norm;
}

Tensor total_grad_norm(const std::vector<Tensor>& params) {
  return detail::grad_norm_pass(params, "total_grad_norm", Tensor(), Tensor());
}

void clip_grads_with_norm_(const std::vector<Tensor>& params, double max_norm, const Tensor& norm) {
  FORGE_CHECK(max_norm >= 0, "clip_grads_with_norm_: max_norm must be >= 0, got ", max_norm);
  NoGradGuard no_grad;
  const std::vector<Tensor> grads = gradients(params, "clip_grads_with_norm_");
  if (grads.empty()) return;
  const Device dev = device_of(params, grads, "clip_grads_with_norm_");
  const Tensor n = f32_scalar(norm, dev, "clip_grads_with_norm_", "the norm");
  Work w(grads);
  if (dev.is_cpu()) cpu::clip_with_norm_(w.work, n, max_norm);
  else FORGE_ON_CUDA("clip_grads_with_norm_", cuda::clip_with_norm_(w.work, n, max_norm));
  w.done();
}

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  FORGE_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm must be >= 0, got ", max_norm);
  const Tensor norm = detail::grad_norm_pass(params, "clip_grad_norm_", Tensor(), Tensor());
  clip_grads_with_norm_(params, max_norm, norm);
  return norm;
}

Tensor found_non_finite(const Tensor& x) {
  FORGE_CHECK(x.defined(), "found_non_finite: got an undefined tensor");
  NoGradGuard no_grad;
  const Tensor xf = f32_scalar(x, x.device(), "found_non_finite", "the input");
  Tensor flag = empty({}, {.dtype = DType::f32, .device = x.device()});
  if (x.is_cpu()) cpu::non_finite_flag(xf, flag);
  else FORGE_ON_CUDA("found_non_finite", cuda::non_finite_flag(xf, flag));
  return flag;
}

Tensor found_non_finite(const std::vector<Tensor>& params) { return found_non_finite(total_grad_norm(params)); }

}  // namespace forge::optim
