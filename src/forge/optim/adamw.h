#pragma once
// AdamW: Adam with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW.
//
// For a parameter p with gradient g, in a group with lr, betas (b1, b2), eps and
// weight_decay wd, at the parameter's t-th update (t = 1, 2, ...):
//   p = p * (1 - lr * wd)                            (decoupled: not through the moments)
//   m = b1 * m + (1 - b1) * g                        (m, v start at 0)
//   v = b2 * v + (1 - b2) * g^2
//   p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// State: "exp_avg" (m) and "exp_avg_sq" (v), f32 (f64 for an f64 parameter), and for a
// bf16/f16 parameter "master" (f32), per Note [bf16 master weights]. The scalars
// lr / (1 - b1^t) and sqrt(1 - b2^t) are computed in double and rounded once to the
// state precision; b^t by binary exponentiation (Note [optimizer rounding]).
//
// Kernels. On the CPU the step runs as one fused pass per tensor (backends/cpu/optim.h:
// reads p|master, g, m, v; writes p, m, v, master), OpenMP over elements. On a GPU all
// parameters of a param group, device and dtype are updated by one multi-tensor kernel
// launch (backends/cuda/optim.h; one launch per 48 tensors, Note [multi-tensor launches]),
// with lr, betas, eps and weight decay as kernel arguments (a schedule changes lr freely)
// and each tensor's step in the launch's parameter table: no host synchronisation, no
// per-step copy to the device. Both backends run the same element code
// (backends/optim_functors.h), so a CUDA step equals the CPU step bit for bit. With a
// skip flag on the GPU (Optimizer::step(skip_if)) the kernel itself skips, and the
// parameter's step count t does not advance (Note [skipped steps on the device]). A clip
// requested by clip_next_step is applied by the kernel to each gradient value it loads
// (Note [clipping inside the update], optimizer.h): no separate clip pass, .grad unwritten.
//
// Note [bf16 master weights]
// A bf16 weight w cannot take an update smaller than half the spacing of bf16 numbers
// near it (2^-9 to 2^-8 of |w|; 2^-12 to 2^-11 for f16): at lr ~ 1e-4 most AdamW updates
// of a bf16 weight would round away, and training stalls.
// So for a bf16 or f16 parameter the optimizer keeps the weight of record in f32: at the
// parameter's first update it copies p into state "master" (f32); every update then
// applies the rule above to the master in f32 and writes p = round(master) (round to
// nearest even, Note [16-bit conversions]), so p's rounding error never accumulates. The
// moments are f32 too. Cost: 2 (p) + 2 (g) + 4 (master) + 4 (m) + 4 (v) = 16 bytes per
// parameter, the figure `forge plan` uses (DESIGN.md, Mixed precision). Consequence: once
// a 16-bit parameter has state, writing into p directly is overwritten by the next step
// (the master wins); change such weights with load_state_dict or a fresh optimizer.
// f32 and f64 parameters are updated in place and have no master.
//
// Checked (forge::Error "AdamW: invalid <field> <value> in param group <i> (...)"):
// lr >= 0, weight_decay >= 0, beta1 and beta2 in [0, 1), eps > 0, all finite.
#include <tuple>
#include <vector>

#include "forge/optim/optimizer.h"

namespace forge::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

class AdamW final : public Optimizer {
 public:
  explicit AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  explicit AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options = {});

  const AdamWOptions& options() const { return options_; }

 private:
  void resolve(ParamGroup& g, size_t index) const override;
  void validate(const ParamGroup& g, size_t index) const override;
  std::vector<std::pair<std::string, double>> hyper_params(const ParamGroup& g) const override;
  void set_hyper_param(ParamGroup& g, const std::string& name, double value) const override;
  std::vector<StateSpec> state_specs(const ParamGroup& g, const Tensor& p) const override;
  DType state_dtype(const Tensor& p, const std::string& name) const override;
  void update(const ParamGroup& g, Tensor& p, const Tensor& grad, ParamState& s) override;
  void update_cuda(const ParamGroup& g, std::vector<DeviceUpdate>& items, const DeviceSkip& skip) override;
  bool fuses_clip() const override { return true; }
  std::tuple<Tensor, Tensor, Tensor> state_of(const Tensor& p, ParamState& s) const;

  AdamWOptions options_;
};

}  // namespace forge::optim
