#pragma once
// Finite-difference gradient checking in f64, and the table of cases every
// differentiable op must appear in.
#include <functional>
#include <ostream>
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

struct GradCase {
  std::string op;     // the op under test, as in kDifferentiableOps
  std::string label;  // what this case covers (shapes, broadcast, non-contiguous, ...)
  std::function<TensorList()> make_inputs;
  OpFn fn;
  // Finite-difference step and tolerances (see gradcheck()).
  double eps = 1e-6, atol = 1e-7, rtol = 1e-5;
};
void PrintTo(const GradCase& c, std::ostream* os);

// Input makers (f64, fixed seeds per call order; requires_grad = true).
Tensor arg(const Shape& shape, uint64_t seed = 1);              // normal
Tensor arg_positive(const Shape& shape, uint64_t seed = 1);     // in [0.5, 2)
Tensor arg_away_from_zero(const Shape& shape, uint64_t seed = 1);  // |x| in [0.2, 1.2), random sign
// Non-contiguous leaf: the transpose of a (shape[1], shape[0]) tensor (2-D shapes).
Tensor arg_transposed(const Shape& shape, uint64_t seed = 1);
// Non-contiguous leaf: every other element along the last dim of a wider tensor.
Tensor arg_strided(const Shape& shape, uint64_t seed = 1);

// Each op family contributes its rows (tests/ops/grad_cases_*.cpp).
std::vector<GradCase> unary_grad_cases();
std::vector<GradCase> binary_grad_cases();
std::vector<GradCase> view_grad_cases();
std::vector<GradCase> reduce_grad_cases();
std::vector<GradCase> matmul_grad_cases();
std::vector<GradCase> index_grad_cases();
std::vector<GradCase> join_grad_cases();
std::vector<GradCase> nn_grad_cases();         // embedding, norms, dropout, cross_entropy
std::vector<GradCase> attention_grad_cases();  // attention, rope, conv2d, max_pool2d
std::vector<GradCase> all_grad_cases();

// Every differentiable op of the library; the table must cover each (a test checks).
const std::vector<std::string>& differentiable_ops();

}  // namespace forge::testing
