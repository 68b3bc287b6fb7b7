// AdamW with decoupled weight decay, bias correction and f32 master weights for 16-bit
// parameters. See adamw.h for the math and Note [bf16 master weights]:
//   p *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
#include "forge/optim/adamw.h"

#include <cmath>

#include "forge/backends/cpu/optim.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/optim.h"
#endif

namespace forge::optim {
namespace {

bool is_16bit(DType t) { return t == DType::bf16 || t == DType::f16; }

// A state tensor, created at the parameter's first update.
Tensor& state_tensor(ParamState& s, const char* name, const Tensor& p, DType dtype) {
  Tensor& t = s.tensors[name];
  if (!t.defined()) t = zeros(p.shape(), {.dtype = dtype, .device = p.device()});
  return t;
}

}  // namespace

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : AdamW(std::vector<ParamGroup>{ParamGroup{.params = std::move(params)}}, options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options) : Optimizer("AdamW"), options_(options) {
  init(std::move(groups));
}

void AdamW::resolve(ParamGroup& g, size_t index) const {
  const char* foreign = g.momentum ? "momentum" : g.dampening ? "dampening" : g.nesterov ? "nesterov" : nullptr;
  FORGE_CHECK(foreign == nullptr, "AdamW: param group ", index, " sets ", foreign,
              ", which AdamW does not use (it is an SGD hyper-parameter)");
  if (!g.lr) g.lr = options_.lr;
  if (!g.weight_decay) g.weight_decay = options_.weight_decay;
  if (!g.beta1) g.beta1 = options_.beta1;
  if (!g.beta2) g.beta2 = options_.beta2;
  if (!g.eps) g.eps = options_.eps;
}

void AdamW::validate(const ParamGroup& g, size_t index) const {
  const double b1 = require(g.beta1, "beta1", index);
  const double b2 = require(g.beta2, "beta2", index);
  const double eps = require(g.eps, "eps", index);
  if (!(b1 >= 0 && b1 < 1)) throw_invalid("beta1", b1, index, "must be in [0, 1)");
  if (!(b2 >= 0 && b2 < 1)) throw_invalid("beta2", b2, index, "must be in [0, 1)");
  if (!(std::isfinite(eps) && eps > 0)) throw_invalid("eps", eps, index, "must be finite and > 0");
}

std::vector<std::pair<std::string, double>> AdamW::hyper_params(const ParamGroup& g) const {
  return {{"beta1", g.beta1.value_or(options_.beta1)},
          {"beta2", g.beta2.value_or(options_.beta2)},
          {"eps", g.eps.value_or(options_.eps)}};
}

void AdamW::set_hyper_param(ParamGroup& g, const std::string& name, double value) const {
  if (name == "beta1") g.beta1 = value;
  else if (name == "beta2") g.beta2 = value;
  else if (name == "eps") g.eps = value;
  else FORGE_THROW("AdamW: unknown hyper-parameter '", name, "'");
}

std::vector<Optimizer::StateSpec> AdamW::state_specs(const ParamGroup&, const Tensor& p) const {
  std::vector<StateSpec> specs{{"exp_avg"}, {"exp_avg_sq"}};
  if (is_16bit(p.dtype())) specs.push_back({"master"});
  return specs;
}

DType AdamW::state_dtype(const Tensor& p, const std::string&) const {
  return p.dtype() == DType::f64 ? DType::f64 : DType::f32;
}

// The state of p's update, created at its first: (exp_avg, exp_avg_sq, master or undefined).
std::tuple<Tensor, Tensor, Tensor> AdamW::state_of(const Tensor& p, ParamState& s) const {
  const DType sd = state_dtype(p, "exp_avg");
  Tensor& m = state_tensor(s, "exp_avg", p, sd);
  Tensor& v = state_tensor(s, "exp_avg_sq", p, sd);
  Tensor master;
  if (is_16bit(p.dtype())) {
    Tensor& mt = s.tensors["master"];
    if (!mt.defined()) mt = ops::to(p, DType::f32);  // a new contiguous f32 copy
    master = mt;
  }
  return {m, v, master};
}

void AdamW::update(const ParamGroup& g, Tensor& p, const Tensor& grad, ParamState& s) {
  auto [m, v, master] = state_of(p, s);
  const Tensor g_c = grad.is_contiguous() ? grad : ops::contiguous(grad);
  // The kernel wants a contiguous parameter: a strided one is updated in a copy, written back.
  Tensor p_c = p.is_contiguous() ? p : ops::contiguous(p);
  cpu::adamw_step(p_c, g_c, m, v, master,
                  {.lr = *g.lr, .beta1 = *g.beta1, .beta2 = *g.beta2, .eps = *g.eps, .weight_decay = *g.weight_decay,
                   .step = s.step});
  if (p_c.is_same(p)) p.storage()->bump_version();
  else ops::copy_(p, p_c);
}

void AdamW::update_cuda(const ParamGroup& g, std::vector<DeviceUpdate>& items, const DeviceSkip& skip) {
#ifdef FORGE_WITH_CUDA
  std::vector<cuda::AdamWParam> params;
  params.reserve(items.size());
  for (const DeviceUpdate& u : items) {
    auto [m, v, master] = state_of(u.param, *u.state);
    // The kernels want contiguous tensors: a strided parameter is updated in a copy, written back.
    const Tensor g_c = u.grad.is_contiguous() ? u.grad : ops::contiguous(u.grad);
    const Tensor p_c = u.param.is_contiguous() ? u.param : ops::contiguous(u.param);
    params.push_back({p_c, g_c, m, v, master, u.state->step, u.slot});
  }
  cuda::adamw_step(params, {.lr = *g.lr, .beta1 = *g.beta1, .beta2 = *g.beta2, .eps = *g.eps, .weight_decay = *g.weight_decay},
                   skip.flag, skip.skipped, {skip.graph_inputs, skip.graph_lr_index, skip.graph_steps_offset},
                   {skip.clip_norm, skip.clip_max_norm});
  for (size_t i = 0; i < items.size(); ++i) {
    Tensor p = items[i].param;
    if (params[i].p.is_same(p)) p.storage()->bump_version();
    else ops::copy_(p, params[i].p);
  }
#else
  (void)g;
  (void)skip;
  if (!items.empty()) ops::detail::throw_no_cuda("AdamW step");
#endif
}

}  // namespace forge::optim
