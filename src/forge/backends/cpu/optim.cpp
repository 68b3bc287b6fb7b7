// CPU optimizer kernels: the fused AdamW step, the clipping passes and the counterparts of
// the CUDA norm / flag / loss-scale primitives. See optim.h for the math and the memory
// contract.
#include "forge/backends/cpu/optim.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "forge/backends/cpu/loops.h"
#include "forge/backends/optim_functors.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cpu {
namespace {

// p, g: (n) T; m, v: (n) S; master: (n) float for 16-bit T, else unused (null).
template <class T, class S>
void adamw_kernel(T* p, const T* g, S* m, S* v, float* master, int64_t n, const fn::AdamWScalars<S>& c) {
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    S x;
    if constexpr (is_half_v<T>) x = master[i];
    else x = p[i];
    fn::adamw_update<S>(x, m[i], v[i], convert<S>(g[i]), c);
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
    const fn::AdamWHyper hp{.lr = args.lr, .beta1 = args.beta1, .beta2 = args.beta2, .eps = args.eps,
                            .weight_decay = args.weight_decay};
    adamw_kernel<T, S>(p.data<T>(), g.data<T>(), m.data<S>(), v.data<S>(), mp, n, fn::adamw_scalars<S>(hp, args.step));
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

namespace {

void check_cpu_scalar(const Tensor& t, DType dtype, const char* op, const char* what) {
  FORGE_CHECK(t.defined() && t.is_cpu() && t.numel() == 1 && t.dtype() == dtype, op, ": ", what,
              " must be a one-element ", dtype_name(dtype), " CPU tensor");
}

}  // namespace

void total_norm(const std::vector<Tensor>& ts, const Tensor& loss_scale, Tensor& norm, Tensor& found) {
  check_cpu_scalar(norm, DType::f32, "total_norm", "norm");
  if (found.defined()) check_cpu_scalar(found, DType::f32, "total_norm", "found");
  double inv_scale = 1.0;
  if (loss_scale.defined()) {
    check_cpu_scalar(loss_scale, DType::f32, "total_norm", "loss_scale");
    // torch.amp.GradScaler: inv_scale = scale.double().reciprocal().float()
    inv_scale = static_cast<double>(static_cast<float>(1.0 / static_cast<double>(*loss_scale.data<float>())));
  }
  double total = 0;
  for (const Tensor& t : ts) {
    FORGE_CHECK(t.is_cpu() && t.is_contiguous(), "cpu::total_norm: expected contiguous CPU tensors, got shape ",
                t.shape(), " on ", t.device().str());
    if (loss_scale.defined()) {
      Tensor w = t;
      scale_(w, inv_scale);
    }
    total += sum_of_squares(t);
  }
  *norm.data<float>() = static_cast<float>(std::sqrt(total));
  if (found.defined()) *found.data<float>() = std::isfinite(total) ? 0.0f : 1.0f;
}

void clip_with_norm_(const std::vector<Tensor>& ts, const Tensor& norm, double max_norm) {
  check_cpu_scalar(norm, DType::f32, "clip_with_norm_", "norm");
  const double n = static_cast<double>(*norm.data<float>());
  if (!(std::isfinite(n) && n > max_norm)) return;
  const double coef = max_norm / (n + 1e-6);
  for (const Tensor& t : ts) {
    FORGE_CHECK(t.is_cpu() && t.is_contiguous(), "cpu::clip_with_norm_: expected contiguous CPU tensors, got shape ",
                t.shape(), " on ", t.device().str());
    Tensor w = t;
    scale_(w, coef);
  }
}

void non_finite_flag(const Tensor& x, Tensor& flag) {
  check_cpu_scalar(x, DType::f32, "non_finite_flag", "x");
  check_cpu_scalar(flag, DType::f32, "non_finite_flag", "flag");
  *flag.data<float>() = std::isfinite(*x.data<float>()) ? 0.0f : 1.0f;
}

void update_loss_scale(Tensor& scale, Tensor& growth_tracker, const Tensor& found, double growth_factor,
                       double backoff_factor, int64_t growth_interval) {
  check_cpu_scalar(scale, DType::f32, "update_loss_scale", "scale");
  check_cpu_scalar(growth_tracker, DType::i32, "update_loss_scale", "growth_tracker");
  check_cpu_scalar(found, DType::f32, "update_loss_scale", "found");
  float& s = *scale.data<float>();
  int32_t& tracker = *growth_tracker.data<int32_t>();
  // As torch._amp_update_scale_ (and cuda::update_loss_scale, bit for bit).
  if (*found.data<float>() != 0.0f) {
    s = static_cast<float>(static_cast<double>(s) * backoff_factor);
    tracker = 0;
  } else {
    const int64_t successful = static_cast<int64_t>(tracker) + 1;
    if (successful == growth_interval) {
      const float grown = static_cast<float>(static_cast<double>(s) * growth_factor);
      if (std::isfinite(grown)) s = grown;
      tracker = 0;
    } else {
      tracker = static_cast<int32_t>(successful);
    }
  }
}

}  // namespace forge::cpu
