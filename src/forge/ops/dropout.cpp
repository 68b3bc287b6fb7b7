// dropout: argument checks, the mask from the Philox stream and the backward.
//
// Built from device-dispatched ops (rand, ge, where), so it runs wherever they do:
//   u    = rand(x.shape) from gen        f32 uniforms k / 2^24 (Note [RNG streams])
//   keep = u >= t                        bool, t = ceil(p * 2^24) / 2^24, so that comparing
//                                        in f32 decides exactly as u >= p in real numbers
//   y    = keep ? x * 1/(1-p) : 0        x's dtype
// Backward: dx = keep ? g * 1/(1-p) : 0.
#include "forge/ops/dropout.h"

#include <cmath>

#include "forge/autograd/node.h"
#include "forge/ops/binary.h"
#include "forge/ops/creation.h"
#include "forge/ops/registry.h"

namespace forge::ops {

using autograd::GradMask;
using autograd::record;

// The differentiable ops this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({"dropout"});

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  FORGE_CHECK(x.defined(), "dropout: x must be a defined tensor");
  FORGE_CHECK(p >= 0 && p < 1, "dropout: p must lie in [0, 1), got ", p, " (x shape ", x.shape(), ", ",
              dtype_name(x.dtype()), ")");
  FORGE_CHECK(is_floating(x.dtype()), "dropout: x must be floating-point (f32, f64, bf16, f16), got ",
              dtype_name(x.dtype()), " of shape ", x.shape());
  if (p == 0 || !training) return x;
  const double scale = 1.0 / (1.0 - p);
  // The uniforms are multiples of 2^-24 in [0, 1): u >= p exactly when u >= ceil(p * 2^24) / 2^24,
  // a threshold f32 holds exactly.
  const double threshold = std::ceil(std::ldexp(p, 24)) / 16777216.0;
  const Tensor keep = ge(rand(x.shape(), {.dtype = DType::f32, .device = x.device()}, gen), threshold);
  const Tensor xs = x.detach();
  Tensor y = where(keep, mul(xs, scale), 0.0);
  record("dropout", y, {x}, [keep, scale](const Tensor& g, const GradMask&) {
    return TensorList{where(keep, mul(g, scale), 0.0)};
  }, {keep});
  return y;
}

}  // namespace forge::ops
