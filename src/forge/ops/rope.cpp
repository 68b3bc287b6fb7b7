// rope: checks, the kernels (backends/cpu/rope.h, backends/cuda/rope.h) and the backward (the
// inverse rotation).
#include "forge/ops/rope.h"

#include <cmath>

#include "forge/autograd/node.h"
#include "forge/backends/cpu/rope.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/registry.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/rope.h"
#endif

namespace forge::ops {

using autograd::GradMask;
using autograd::record;

// The differentiable ops this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({"rope"});

namespace {

// The rotation (or its inverse) of x into a new tensor: contiguous on the CPU; on CUDA in x's
// memory order when x's last dim is contiguous, so LLaMA's (B, T, H, D) projections keep that
// order through rope, attention and the head merge (views, no layout copies), and the
// gradients come back in it too.
Tensor rotate(const Tensor& x, int64_t position_offset, double theta, const RopeScaling& scaling, bool inverse,
              const Tensor& positions = {}, int64_t position_limit = 0) {
  const bool keep_order = !x.is_cpu() && (x.size(3) <= 1 || x.stride(3) == 1);
  Tensor out =
      keep_order ? empty_in_order_of(x, x.shape()) : empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  if (x.is_cpu()) cpu::rope(x, out, position_offset, theta, scaling, inverse, positions, position_limit);
  else
    FORGE_ON_CUDA("rope", cuda::rope(x, out, position_offset, theta, scaling, inverse, positions, position_limit));
  return out;
}

void check_rope(const Tensor& x, int64_t position_offset, double theta, const RopeScaling& scaling) {
  FORGE_CHECK(x.defined(), "rope: x must be a defined tensor");
  FORGE_CHECK(x.dim() == 4, "rope: expected x of shape (B, H, T, D), got ", x.shape());
  FORGE_CHECK(x.size(3) % 2 == 0, "rope: the head dim D must be even (dims i and i + D/2 are rotated as a pair), got ",
              "x of shape ", x.shape(), " with D = ", x.size(3));
  FORGE_CHECK(is_floating(x.dtype()), "rope: expected a floating-point x (f32, f64, bf16, f16), got ",
              dtype_name(x.dtype()), " of shape ", x.shape());
  FORGE_CHECK(position_offset >= 0, "rope: position_offset must be >= 0, got ", position_offset, " (x of shape ",
              x.shape(), ")");
  FORGE_CHECK(std::isfinite(theta) && theta > 0, "rope: theta must be a positive finite base, got ", theta);
  FORGE_CHECK(!scaling.enabled() ||
                  (std::isfinite(scaling.factor) && scaling.factor > 0 && scaling.low_freq_factor > 0 &&
                   scaling.high_freq_factor > scaling.low_freq_factor && scaling.original_context > 0),
              "rope: llama3 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and original_context > 0, "
              "got factor ", scaling.factor, ", low_freq_factor ", scaling.low_freq_factor, ", high_freq_factor ",
              scaling.high_freq_factor, ", original_context ", scaling.original_context);
}

}  // namespace

Tensor rope(const Tensor& x, int64_t position_offset, double theta, const RopeScaling& scaling) {
  check_rope(x, position_offset, theta, scaling);
  Tensor out = rotate(x.detach(), position_offset, theta, scaling, false);
  record("rope", out, {x}, [position_offset, theta, scaling](const Tensor& g, const GradMask&) {
    return TensorList{rotate(g, position_offset, theta, scaling, true)};
  });
  return out;
}

// Note [packed positions] (rope.h).
Tensor rope(const Tensor& x, const Tensor& positions, int64_t position_limit, double theta,
            const RopeScaling& scaling) {
  check_rope(x, 0, theta, scaling);
  FORGE_CHECK(positions.defined() && positions.dtype() == DType::i64 && positions.dim() == 2 &&
                  positions.size(0) == x.size(0) && positions.size(1) == x.size(2),
              "rope: positions must be i64 of shape (B, T) = (", x.size(0), ", ", x.size(2), ") for x ", x.shape(),
              ", got ", positions.defined() ? dtype_name(positions.dtype()) : "undefined", " ",
              positions.defined() ? positions.shape() : Shape{});
  FORGE_CHECK(positions.device() == x.device(), "rope: positions are on ", positions.device().str(), ", x on ",
              x.device().str());
  FORGE_CHECK(position_limit > 0, "rope: position_limit must be positive, got ", position_limit);
  const Tensor pos = positions.detach().contiguous();
  Tensor out = rotate(x.detach(), 0, theta, scaling, false, pos, position_limit);
  record("rope", out, {x}, [pos, position_limit, theta, scaling](const Tensor& g, const GradMask&) {
    return TensorList{rotate(g, 0, theta, scaling, true, pos, position_limit)};
  });
  return out;
}

}  // namespace forge::ops
