#include "testing/gradcheck.h"

#include <cmath>
#include <sstream>

namespace forge::testing {
namespace {

// Offsets (in elements, from the storage base) of every element of t in row-major order.
std::vector<int64_t> element_offsets(const Tensor& t) {
  const int64_t n = t.numel();
  std::vector<int64_t> offs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, o = t.offset();
    for (int64_t d = t.dim() - 1; d >= 0; --d) {
      o += (rem % t.shape()[d]) * t.strides()[d];
      rem /= t.shape()[d];
    }
    offs[static_cast<size_t>(i)] = o;
  }
  return offs;
}

double weighted_sum(const Tensor& out, const std::vector<double>& w) {
  std::vector<double> v = out.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * w[i];
  return s;
}

}  // namespace

GradCheckResult gradcheck(const OpFn& f, const TensorList& inputs, double eps, double atol, double rtol) {
  GradCheckResult r;
  for (const auto& x : inputs) {
    if (x.defined() && x.requires_grad()) {
      FORGE_CHECK(x.dtype() == DType::f64 && x.is_leaf(), "gradcheck: inputs must be f64 leaves");
      x.zero_grad();
    }
  }
  Tensor out = f(inputs);
  FORGE_CHECK(out.dtype() == DType::f64, "gradcheck: the function must return f64, got ", dtype_name(out.dtype()));
  Generator gen(1234);
  Tensor w = randn(out.shape(), {.dtype = DType::f64}, &gen);
  const std::vector<double> wv = w.to_vector<double>();
  out.backward(w);

  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.defined() || !x.requires_grad()) continue;
    Tensor g = x.grad();
    if (!g.defined()) g = zeros(x.shape(), {.dtype = DType::f64});
    const std::vector<double> analytic = g.to_vector<double>();
    double* base = static_cast<double*>(x.storage()->data());
    const std::vector<int64_t> offs = element_offsets(x);
    for (size_t i = 0; i < offs.size(); ++i) {
      double& e = base[offs[i]];
      const double orig = e;
      double fp, fm;
      {
        NoGradGuard ng;
        e = orig + eps;
        fp = weighted_sum(f(inputs), wv);
        e = orig - eps;
        fm = weighted_sum(f(inputs), wv);
        e = orig;
      }
      const double numeric = (fp - fm) / (2 * eps);
      const double err = std::abs(analytic[i] - numeric);
      r.max_abs_err = std::max(r.max_abs_err, err);
      if (!(err <= atol + rtol * std::abs(numeric)) && r.ok) {
        std::ostringstream os;
        os << "input " << k << " (shape " << shape_str(x.shape()) << ") element " << i << ": analytic "
           << analytic[i] << " vs numeric " << numeric << " (|diff| " << err << ")";
        r.ok = false;
        r.message = os.str();
      }
    }
  }
  return r;
}

}  // namespace forge::testing
