// SGD with momentum, dampening, Nesterov and L2 weight decay. See sgd.h for the math:
//   d = g + wd * p;  b = d (first) | mu * b + (1 - tau) * d;  d = nesterov ? d + mu * b : b;
//   p -= lr * d.
#include "forge/optim/sgd.h"

#include <cmath>

#include "forge/ops/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/optim.h"
#endif

namespace forge::optim {

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : SGD(std::vector<ParamGroup>{ParamGroup{.params = std::move(params)}}, options) {}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& options) : Optimizer("SGD"), options_(options) {
  init(std::move(groups));
}

void SGD::resolve(ParamGroup& g, size_t index) const {
  const char* foreign = g.beta1 ? "beta1" : g.beta2 ? "beta2" : g.eps ? "eps" : nullptr;
  FORGE_CHECK(foreign == nullptr, "SGD: param group ", index, " sets ", foreign,
              ", which SGD does not use (it is an AdamW hyper-parameter)");
  if (!g.lr) g.lr = options_.lr;
  if (!g.weight_decay) g.weight_decay = options_.weight_decay;
  if (!g.momentum) g.momentum = options_.momentum;
  if (!g.dampening) g.dampening = options_.dampening;
  if (!g.nesterov) g.nesterov = options_.nesterov;
}

void SGD::validate(const ParamGroup& g, size_t index) const {
  const double mu = require(g.momentum, "momentum", index);
  const double tau = require(g.dampening, "dampening", index);
  FORGE_CHECK(g.nesterov.has_value(), "SGD: param group ", index, " has no nesterov");
  if (!(std::isfinite(mu) && mu >= 0)) throw_invalid("momentum", mu, index, "must be finite and >= 0");
  if (!(tau >= 0 && tau <= 1)) throw_invalid("dampening", tau, index, "must be in [0, 1]");
  if (*g.nesterov && mu <= 0) throw_invalid("momentum", mu, index, "Nesterov momentum needs momentum > 0");
  if (*g.nesterov && tau != 0) throw_invalid("dampening", tau, index, "Nesterov momentum needs dampening 0");
}

std::vector<std::pair<std::string, double>> SGD::hyper_params(const ParamGroup& g) const {
  return {{"momentum", g.momentum.value_or(options_.momentum)},
          {"dampening", g.dampening.value_or(options_.dampening)},
          {"nesterov", g.nesterov.value_or(options_.nesterov) ? 1.0 : 0.0}};
}

void SGD::set_hyper_param(ParamGroup& g, const std::string& name, double value) const {
  if (name == "momentum") g.momentum = value;
  else if (name == "dampening") g.dampening = value;
  else if (name == "nesterov") {
    FORGE_CHECK(value == 0 || value == 1, "SGD: load_state_dict: nesterov must be 0 or 1, got ", value);
    g.nesterov = value != 0;
  } else FORGE_THROW("SGD: unknown hyper-parameter '", name, "'");
}

std::vector<Optimizer::StateSpec> SGD::state_specs(const ParamGroup&, const Tensor&) const {
  return {{"momentum_buffer", /*required=*/false}};
}

DType SGD::state_dtype(const Tensor& p, const std::string&) const { return p.dtype(); }

void SGD::update(const ParamGroup& g, Tensor& p, const Tensor& grad, ParamState& s) {
  const double lr = *g.lr, wd = *g.weight_decay, mu = *g.momentum, tau = *g.dampening;
  Tensor d = wd != 0 ? ops::add(grad, p, wd) : grad;
  if (mu != 0) {
    Tensor& b = s.tensors["momentum_buffer"];
    if (!b.defined()) {
      b = ops::clone(d);
    } else {
      ops::mul_(b, mu);
      ops::add_(b, d, 1.0 - tau);
    }
    d = *g.nesterov ? ops::add(d, b, mu) : b;
  }
  ops::add_(p, d, -lr);
}

void SGD::update_cuda(const ParamGroup& g, std::vector<DeviceUpdate>& items, const DeviceSkip& skip) {
#ifdef FORGE_WITH_CUDA
  const bool momentum = *g.momentum != 0;
  // A new momentum buffer is first used (b = d) at this update's true step t, which the
  // host knows unless the parameter has skipped updates not folded in yet: fold them first
  // (a device-to-host copy, only when a parameter gets its buffer after such a skip).
  bool fold = false;
  for (const DeviceUpdate& u : items)
    fold = fold || (momentum && !u.state->tensors.count("momentum_buffer") && may_have_skipped_steps(u.slot));
  if (fold) fold_skipped_steps();
  std::vector<cuda::SGDParam> params;
  params.reserve(items.size());
  for (const DeviceUpdate& u : items) {
    ParamState& s = *u.state;
    Tensor buf;
    int64_t first = 0;
    if (momentum) {
      Tensor& b = s.tensors["momentum_buffer"];
      if (!b.defined()) {
        b = zeros(u.param.shape(), {.dtype = u.param.dtype(), .device = u.param.device()});
        s.first_use["momentum_buffer"] = s.step;
      }
      buf = b;
      if (auto it = s.first_use.find("momentum_buffer"); it != s.first_use.end()) first = it->second;
    }
    const Tensor g_c = u.grad.is_contiguous() ? u.grad : ops::contiguous(u.grad);
    const Tensor p_c = u.param.is_contiguous() ? u.param : ops::contiguous(u.param);
    params.push_back({p_c, g_c, buf, s.step, u.slot, first});
  }
  cuda::sgd_step(params,
                 {.lr = *g.lr, .weight_decay = *g.weight_decay, .momentum = *g.momentum, .dampening = *g.dampening,
                  .nesterov = *g.nesterov},
                 skip.flag, skip.skipped, {skip.graph_inputs, skip.graph_lr_index, skip.graph_steps_offset});
  for (size_t i = 0; i < items.size(); ++i) {
    Tensor p = items[i].param;
    if (params[i].p.is_same(p)) p.storage()->bump_version();
    else ops::copy_(p, params[i].p);
    if (params[i].buf.defined()) params[i].buf.storage()->bump_version();
  }
#else
  (void)g;
  (void)skip;
  if (!items.empty()) ops::detail::throw_no_cuda("SGD step");
#endif
}

}  // namespace forge::optim
