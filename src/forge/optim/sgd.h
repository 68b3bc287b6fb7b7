#pragma once
// SGD with momentum, dampening, Nesterov momentum and L2 weight decay, as torch.optim.SGD.
//
// For a parameter p with gradient g, in a group with lr, momentum mu, dampening tau,
// weight_decay wd, and b the momentum buffer:
//   d = g + wd * p                       (L2: the decay term goes through the momentum)
//   if mu != 0:
//     b = d                              (the parameter's first update: no dampening)
//     b = mu * b + (1 - tau) * d         (every later update)
//     d = nesterov ? d + mu * b : b
//   p = p - lr * d
// State: "momentum_buffer" (b, p's dtype and device), made at the first update with
// mu != 0 (a state without one, e.g. after momentum was 0, starts it again from d).
// On the CPU the update runs as ops; for bf16/f16 parameters it rounds to their dtype at
// every op, so train 16-bit weights with AdamW (which keeps f32 master weights) rather
// than SGD. On a GPU all parameters of a group, device and dtype are updated by one
// multi-tensor kernel launch (backends/cuda/optim.h, one per 56 tensors) that computes
// exactly what those ops compute, rounding included, so both backends agree bit for bit;
// it honours a skip flag on the device (Optimizer::step(skip_if)) without a host sync.
//
// Checked (forge::Error "SGD: invalid <field> <value> in param group <i> (...)"):
// lr >= 0, weight_decay >= 0, momentum >= 0, dampening in [0, 1], all finite; Nesterov
// needs momentum > 0 and dampening 0.
#include <vector>

#include "forge/optim/optimizer.h"

namespace forge::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class SGD final : public Optimizer {
 public:
  explicit SGD(std::vector<Tensor> params, const SGDOptions& options = {});
  explicit SGD(std::vector<ParamGroup> groups, const SGDOptions& options = {});

  const SGDOptions& options() const { return options_; }

 private:
  void resolve(ParamGroup& g, size_t index) const override;
  void validate(const ParamGroup& g, size_t index) const override;
  std::vector<std::pair<std::string, double>> hyper_params(const ParamGroup& g) const override;
  void set_hyper_param(ParamGroup& g, const std::string& name, double value) const override;
  std::vector<StateSpec> state_specs(const ParamGroup& g, const Tensor& p) const override;
  DType state_dtype(const Tensor& p, const std::string& name) const override;
  void update(const ParamGroup& g, Tensor& p, const Tensor& grad, ParamState& s) override;
  void update_cuda(const ParamGroup& g, std::vector<DeviceUpdate>& items, const DeviceSkip& skip) override;

  SGDOptions options_;
};

}  // namespace forge::optim
