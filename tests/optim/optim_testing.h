// Helpers of the optimizer tests (tests/optim/): a 1-D parameter from values, and its gradient.
#pragma once

#include <cstdint>
#include <vector>

#include "forge/forge.h"

namespace forge::optim_testing {

// A 1-D leaf that requires grad, holding `v` in `dtype`.
inline Tensor param(const std::vector<double>& v, DType dtype = DType::f64) {
  Tensor t = from_vector<double>(v, {static_cast<int64_t>(v.size())}, {.dtype = dtype});
  t.requires_grad_(true);
  return t;
}

// Sets p's gradient to `g` (in p's shape and dtype).
inline void set_grad(const Tensor& p, const std::vector<double>& g) {
  p.set_grad(from_vector<double>(g, p.shape(), {.dtype = p.dtype()}));
}

}  // namespace forge::optim_testing
