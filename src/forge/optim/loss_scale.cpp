// Dynamic loss scaling (torch.amp.GradScaler). See loss_scale.h for the rule:
//   found: s *= backoff, tracker = 0;  else tracker += 1, tracker == interval: s *= growth, tracker = 0.
// The state lives on the scaler's device; the update runs there (cpu:: / cuda::update_loss_scale).
#include "forge/optim/loss_scale.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "forge/autograd/grad_mode.h"
#include "forge/backends/cpu/optim.h"
#include "forge/ops/binary.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/optim/clip.h"
#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/optim.h"
#endif

namespace forge::optim {
namespace {

void check_options(const LossScalerOptions& o, const char* ctx) {
  FORGE_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0, ctx, "init_scale must be finite and > 0, got ",
              o.init_scale);
  FORGE_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1, ctx, "growth_factor must be finite and > 1, got ",
              o.growth_factor);
  FORGE_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1, ctx, "backoff_factor must be in (0, 1), got ",
              o.backoff_factor);
  FORGE_CHECK(o.growth_interval >= 1 && o.growth_interval <= std::numeric_limits<int32_t>::max(), ctx,
              "growth_interval must be in [1, 2^31 - 1], got ", o.growth_interval);
}

}  // namespace

LossScaler::LossScaler(const LossScalerOptions& options) : LossScaler(Device::cpu(), options) { bound_ = false; }

LossScaler::LossScaler(Device device, const LossScalerOptions& options)
    : device_(device), bound_(true), options_(options) {
  check_options(options_, "LossScaler: ");
  FORGE_CHECK(std::isfinite(static_cast<float>(options_.init_scale)), "LossScaler: init_scale ", options_.init_scale,
              " overflows f32");
  scale_ = full({}, options_.init_scale, {.dtype = DType::f32, .device = device_});
  growth_tracker_ = zeros({}, {.dtype = DType::i32, .device = device_});
  found_ = zeros({}, {.dtype = DType::f32, .device = device_});
}

void LossScaler::bind(Device device, const char* op) {
  if (!bound_) {
    if (device != device_) {
      NoGradGuard no_grad;
      scale_ = scale_.to(device);
      growth_tracker_ = growth_tracker_.to(device);
      found_ = found_.to(device);
      device_ = device;
    }
    bound_ = true;
  }
  FORGE_CHECK(device == device_, "LossScaler::", op, ": got tensors on ", device.str(), " but the scaler's state is on ",
              device_.str());
}

Tensor LossScaler::scale_loss(const Tensor& loss) {
  FORGE_CHECK(loss.defined() && loss.numel() == 1, "LossScaler::scale_loss: expected a one-element loss, got ",
              loss.defined() ? shape_str(loss.shape()) : std::string("an undefined tensor"));
  bind(loss.device(), "scale_loss");
  return ops::mul(loss, scale_);
}

Tensor LossScaler::unscale_(const std::vector<Tensor>& params) {
  // The gradients' device (the first parameter's when none has a gradient, as clip.h does).
  const Tensor* first = nullptr;
  for (const Tensor& p : params) {
    if (p.defined() && p.grad().defined()) {
      first = &p.grad();
      break;
    }
  }
  if (first == nullptr && !params.empty() && params[0].defined()) first = &params[0];
  if (first != nullptr) bind(first->device(), "unscale_");
  Tensor norm = detail::grad_norm_pass(params, "LossScaler::unscale_", scale_, found_);
  found_.storage()->bump_version();
  unscaled_ = true;
  return norm;
}

void LossScaler::step(Optimizer& opt, bool skip) {
  if (!unscaled_) {
    std::vector<Tensor> params;
    for (const ParamGroup& g : opt.param_groups()) params.insert(params.end(), g.params.begin(), g.params.end());
    unscale_(params);
  }
  if (skip) opt.step(scalar_tensor(1.0));  // decided on the host: nothing to read on the device
  else opt.step(found_);
}

void LossScaler::update(bool found_non_finite) {
  FORGE_CHECK(unscaled_, "LossScaler::update: no unscale_() or step() since the last update(), so there is no "
                         "inf/NaN check to update the scale from");
  NoGradGuard no_grad;
  if (found_non_finite) found_.fill_(1.0);
  if (device_.is_cpu()) {
    cpu::update_loss_scale(scale_, growth_tracker_, found_, options_.growth_factor, options_.backoff_factor,
                           options_.growth_interval);
  } else {
    FORGE_ON_CUDA("LossScaler::update",
                  cuda::update_loss_scale(scale_, growth_tracker_, found_, options_.growth_factor,
                                          options_.backoff_factor, options_.growth_interval));
  }
  scale_.storage()->bump_version();
  growth_tracker_.storage()->bump_version();
  unscaled_ = false;
}

double LossScaler::scale() const { return scale_.item<double>(); }

int64_t LossScaler::growth_tracker() const { return growth_tracker_.item<int64_t>(); }

StateDict LossScaler::state_dict() const {
  StateDict sd;
  sd.scalars["scale"] = scale();
  sd.scalars["growth_tracker"] = static_cast<double>(growth_tracker());
  sd.scalars["growth_factor"] = options_.growth_factor;
  sd.scalars["backoff_factor"] = options_.backoff_factor;
  sd.scalars["growth_interval"] = static_cast<double>(options_.growth_interval);
  return sd;
}

void LossScaler::load_state_dict(const StateDict& sd) {
  const char* ctx = "LossScaler: load_state_dict: ";
  auto scalar = [&](const char* key) {
    auto it = sd.scalars.find(key);
    FORGE_CHECK(it != sd.scalars.end(), ctx, "missing scalar '", key, "'");
    return it->second;
  };
  for (const auto& [key, value] : sd.scalars) {
    (void)value;
    FORGE_CHECK(key == "scale" || key == "growth_tracker" || key == "growth_factor" || key == "backoff_factor" ||
                    key == "growth_interval",
                ctx, "unknown scalar '", key, "'");
  }
  FORGE_CHECK(sd.tensors.empty(), ctx, "unexpected tensor '", sd.tensors.empty() ? "" : sd.tensors.begin()->first, "'");
  LossScalerOptions o = options_;
  o.growth_factor = scalar("growth_factor");
  o.backoff_factor = scalar("backoff_factor");
  const double interval = scalar("growth_interval");
  FORGE_CHECK(interval == std::floor(interval) && interval >= 1 && interval <= std::numeric_limits<int32_t>::max(), ctx,
              "growth_interval must be an integer in [1, 2^31 - 1], got ", interval);
  o.growth_interval = static_cast<int64_t>(interval);
  check_options(o, ctx);
  const double scale = scalar("scale");
  FORGE_CHECK(std::isfinite(scale) && scale > 0 && std::isfinite(static_cast<float>(scale)), ctx,
              "scale must be a positive finite f32, got ", scale);
  const double tracker = scalar("growth_tracker");
  FORGE_CHECK(tracker == std::floor(tracker) && tracker >= 0 && tracker < interval, ctx,
              "growth_tracker must be an integer in [0, growth_interval), got ", tracker);
  NoGradGuard no_grad;
  options_ = o;
  scale_.fill_(scale);
  growth_tracker_.fill_(tracker);
  found_.zero_();
  unscaled_ = false;
}

}  // namespace forge::optim
