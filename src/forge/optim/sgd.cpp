// SGD with momentum, dampening, Nesterov and L2 weight decay. See sgd.h for the math:
//   d = g + wd * p;  b = d (first) | mu * b + (1 - tau) * d;  d = nesterov ? d + mu * b : b;
//   p -= lr * d.
#include "forge/optim/sgd.h"

#include <cmath>

#include "forge/ops/binary.h"
#include "forge/ops/copy.h"

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

}  // namespace forge::optim
