#pragma once
// Finite-difference gradient checking in f64 (the op table's cases run through it:
// testing/op_table.h).
#include <functional>
#include <string>
#include <vector>

#include "forge/forge.h"

namespace forge::testing {

using OpFn = std::function<Tensor(const TensorList&)>;

struct GradCheckResult {
  bool ok = true;
  std::string message;  // which input/element failed, with both values
  double max_abs_err = 0;
};

// Checks d<f(inputs), w>/d(inputs) from forge's backward against central differences
// (h = eps) for every element of every input that requires grad, where w is a fixed
// random weight of f's output shape (so every output element counts). Inputs must be
// f64 leaves; they may be non-contiguous views (perturbed through their strides).
// Passes when |analytic - numeric| <= atol + rtol * |numeric| for every element.
GradCheckResult gradcheck(const OpFn& f, const TensorList& inputs, double eps = 1e-6, double atol = 1e-7,
                          double rtol = 1e-5);

}  // namespace forge::testing
