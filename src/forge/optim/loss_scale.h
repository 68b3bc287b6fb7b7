#pragma once
// Dynamic loss scaling for f16 training, as torch.amp.GradScaler.
//
// f16 has 5 exponent bits: gradients below 6e-8 flush to zero and small ones lose their
// precision. So the loss is multiplied by a scale s before backward (every gradient comes
// out s times larger), and the gradients are divided by s before the optimizer sees them.
// When s is too large some gradient overflows to inf (or becomes NaN): that step is
// skipped and s is lowered; after growth_interval clean steps in a row s is raised again.
//
//   optim::LossScaler scaler(Device::cuda(0));            // s = 2^16
//   for (...) {
//     scaler.scale_loss(loss).backward();                 // gradients of s * loss
//     Tensor norm = scaler.unscale_(params);              // one pass: g /= s, inf/NaN check, norm
//     optim::clip_grads_with_norm_(params, 1.0, norm);    // optional: clip with that norm
//     scaler.step(opt);                                   // opt.step(found): nothing changes on inf/NaN
//     scaler.update();                                    // adjust s for the next step
//     opt.zero_grad();
//   }
//
// The rule (torch._amp_update_scale_), with found = some unscaled gradient is inf or NaN:
//   found:      s *= backoff_factor (0.5); growth_tracker = 0          (and the step is skipped)
//   otherwise:  growth_tracker += 1; when it reaches growth_interval (2000):
//               s *= growth_factor (2), unless that overflows f32; growth_tracker = 0
// unscale_ multiplies every gradient by float(1 / double(s)) (torch's inv_scale), in place,
// and computes the norm of the results with the non-finite flag in the same pass
// (Note [non-finite detection], clip.h). Call it once per backward (each call divides the
// current gradients by s); step() calls it if it was not called since the last update().
//
// State: s (0-d f32), growth_tracker (0-d i32) and the flag found (0-d f32), all on the
// scaler's device: the one given, or else the device of the first loss or gradients it
// sees (torch's lazy choice). Every call above runs on that device without a host
// synchronisation: the skip is decided by the optimizer's kernels (Optimizer::step(
// skip_if)) and the update by a one-thread kernel. A caller that has already read the
// gradient norm on the host may add its own verdict: step(opt, skip) and update(found)
// OR a host-side flag into the device's. scale(), growth_tracker() and state_dict() read
// the device (a sync: for logging and checkpoints).
//
// state_dict(): scalars "scale", "growth_tracker", "growth_factor", "backoff_factor",
// "growth_interval" (torch's names, without its underscore); load_state_dict() checks and
// restores them.
//
// Checked (forge::Error "LossScaler: ..."): init_scale finite and > 0, growth_factor > 1,
// backoff_factor in (0, 1), growth_interval in [1, 2^31 - 1].
#include <cstdint>
#include <vector>

#include "forge/core/tensor.h"
#include "forge/optim/optimizer.h"

namespace forge::optim {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  // State on `device`, or (first form) on the device of the first loss or gradients seen.
  explicit LossScaler(const LossScalerOptions& options = {});
  LossScaler(Device device, const LossScalerOptions& options = {});

  // loss * s (differentiable in loss; s is f32, so an f16 loss is promoted to f32).
  Tensor scale_loss(const Tensor& loss);
  // Unscales the defined gradients of `params` in place and records whether any is inf or
  // NaN; returns their global L2 norm after unscaling (0-d f32; inf/NaN when found).
  Tensor unscale_(const std::vector<Tensor>& params);
  // unscale_ (over opt's parameters) unless called since the last update(), then
  // opt.step(found): nothing changes where found is set, or when `skip` is true.
  void step(Optimizer& opt, bool skip = false);
  // Adjusts s and growth_tracker from found (OR `found_non_finite`, a host-side verdict);
  // ends the iteration.
  void update(bool found_non_finite = false);

  // Host reads (one synchronisation on a GPU).
  double scale() const;
  int64_t growth_tracker() const;
  // The live state (0-d tensors on device()); found_non_finite is the last unscale_'s flag.
  const Tensor& scale_tensor() const { return scale_; }
  const Tensor& growth_tracker_tensor() const { return growth_tracker_; }
  const Tensor& found_non_finite() const { return found_; }

  Device device() const { return device_; }
  const LossScalerOptions& options() const { return options_; }

  StateDict state_dict() const;
  void load_state_dict(const StateDict& sd);

 private:
  // Fixes the device at the first use (moving the state there) or checks it afterwards.
  void bind(Device device, const char* op);

  Device device_;
  bool bound_ = false;     // device_ is fixed
  LossScalerOptions options_;
  Tensor scale_;           // 0-d f32
  Tensor growth_tracker_;  // 0-d i32
  Tensor found_;           // 0-d f32
  bool unscaled_ = false;  // unscale_ ran since the last update()
};

}  // namespace forge::optim
