// CPU optimizer kernels: the fused AdamW step and the clipping passes. See optim.h for the
// math and the memory contract.
#include "forge/backends/cpu/optim.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "forge/backends/cpu/loops.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cpu {
namespace {

// Per-tensor constants of one AdamW step, in the state precision S.
template <class S> struct AdamWScalars {
  S decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bias_correction2_sqrt, eps;
};

template <class S> AdamWScalars<S> adamw_scalars(const AdamWStepArgs& a) {
  const double t = static_cast<double>(a.step);
  const double bias_correction1 = 1.0 - std::pow(a.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(a.beta2, t);
  return {static_cast<S>(1.0 - a.lr * a.weight_decay),
          static_cast<S>(a.beta1),
          static_cast<S>(1.0 - a.beta1),
          static_cast<S>(a.beta2),
          static_cast<S>(1.0 - a.beta2),
          static_cast<S>(a.lr / bias_correction1),
          static_cast<S>(std::sqrt(bias_correction2)),
          static_cast<S>(a.eps)};
}

// p, g: (n) T; m, v: (n) S; master: (n) float for 16-bit T, else unused (null).
template <class T, class S>
void adamw_kernel(T* p, const T* g, S* m, S* v, float* master, int64_t n, const AdamWScalars<S>& c) {
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    const S gi = convert<S>(g[i]);
    S x;
    if constexpr (is_half_v<T>) x = master[i];
    else x = p[i];
    x *= c.decay;
    const S mi = c.beta1 * m[i] + c.one_minus_beta1 * gi;
    const S vi = c.beta2 * v[i] + c.one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    x -= c.step_size * mi / (std::sqrt(vi) / c.bias_correction2_sqrt + c.eps);
    if constexpr (is_half_v<T>) {
      master[i] = x;
      p[i] = convert<T>(x);
    } else {
      p[i] = x;
    }
  }
}

constexpr int64_t kSumBlock = 16384;  // elements per partial sum (fixes the summation order)

}  // namespace

void adamw_step(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, Tensor& master, const AdamWStepArgs& args) {
  const int64_t n = p.numel();
  FORGE_CHECK(p.is_contiguous() && g.is_contiguous() && m.is_contiguous() && v.is_contiguous(),
              "cpu::adamw_step: expected contiguous tensors (param ", p.shape(), ")");
  FORGE_CHECK(g.dtype() == p.dtype() && g.numel() == n && m.numel() == n && v.numel() == n,
              "cpu::adamw_step: gradient/state do not match the parameter of shape ", p.shape(), " ",
              dtype_name(p.dtype()));
  dispatch_float(p.dtype(), "cpu::adamw_step", [&]<class T>() {
    using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
    FORGE_CHECK(m.dtype() == dtype_v<S> && v.dtype() == dtype_v<S>, "cpu::adamw_step: moments of a ",
                dtype_name(p.dtype()), " parameter must be ", dtype_name(dtype_v<S>), ", got ", dtype_name(m.dtype()),
                " and ", dtype_name(v.dtype()));
    float* mp = nullptr;
    if constexpr (is_half_v<T>) {
      FORGE_CHECK(master.defined() && master.dtype() == DType::f32 && master.is_contiguous() && master.numel() == n,
                  "cpu::adamw_step: a ", dtype_name(p.dtype()), " parameter needs a contiguous f32 master copy");
      mp = master.data<float>();
    } else {
      FORGE_CHECK(!master.defined(), "cpu::adamw_step: a ", dtype_name(p.dtype()),
                  " parameter takes no master copy (it is updated in place)");
    }
    adamw_kernel<T, S>(p.data<T>(), g.data<T>(), m.data<S>(), v.data<S>(), mp, n, adamw_scalars<S>(args));
  });
}

double sum_of_squares(const Tensor& t) {
  FORGE_CHECK(t.is_contiguous(), "cpu::sum_of_squares: expected a contiguous tensor, got shape ", t.shape());
  const int64_t n = t.numel();
  return dispatch_float(t.dtype(), "cpu::sum_of_squares", [&]<class T>() {
    const T* d = t.data<T>();
    const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
    std::vector<double> partial(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t end = std::min(n, (b + 1) * kSumBlock);
      double s = 0;
      for (int64_t i = b * kSumBlock; i < end; ++i) {
        const double x = convert<double>(d[i]);
        s += x * x;
      }
      partial[static_cast<size_t>(b)] = s;
    }
    double total = 0;
    for (double s : partial) total += s;
    return total;
  });
}

void scale_(Tensor& t, double s) {
  FORGE_CHECK(t.is_contiguous(), "cpu::scale_: expected a contiguous tensor, got shape ", t.shape());
  const int64_t n = t.numel();
  dispatch_float(t.dtype(), "cpu::scale_", [&]<class T>() {
    T* d = t.data<T>();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) d[i] = convert<T>(convert<double>(d[i]) * s);
  });
}

}  // namespace forge::cpu
