// CPU softmax / log-softmax, forward and backward. See softmax.h for the math and the
// memory contract.
#include "forge/backends/cpu/softmax.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <type_traits>

#include "forge/backends/cpu/loops.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cpu {
namespace {

// The (outer, n, inner) factoring of `shape` around `dim` (a 0-d tensor is one problem of length 1).
struct Layout {
  int64_t outer = 1, n = 1, inner = 1;
};

Layout layout_of(const Shape& shape, int64_t dim) {
  Layout l;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d < dim) l.outer *= shape[d];
    else if (d == dim) l.n = shape[d];
    else l.inner *= shape[d];
  }
  return l;
}

// Calls fn.template operator()<kOneLane>(offset, lanes) for every block of problems, where
// offset is the block's first element: one row per call when inner == 1 (kOneLane, so the
// lane loops below vanish at compile time), else runs of up to kSoftmaxLanes neighbouring
// problems, whose elements j lie side by side in memory.
template <class Fn> void for_each_block(const Layout& l, const Fn& fn) {
  const bool parallel = l.outer * l.n * l.inner >= kParallelGrain;
  if (l.inner == 1) {
#pragma omp parallel for schedule(static) if (parallel && l.outer > 1)
    for (int64_t r = 0; r < l.outer; ++r) fn.template operator()<true>(r * l.n, int64_t{1});
    return;
  }
  const int64_t per_outer = (l.inner + kSoftmaxLanes - 1) / kSoftmaxLanes;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < l.outer * per_outer; ++t) {
    const int64_t i0 = (t % per_outer) * kSoftmaxLanes;
    fn.template operator()<false>((t / per_outer) * l.n * l.inner + i0, std::min(kSoftmaxLanes, l.inner - i0));
  }
}

// Forward over `lanes` problems of length n side by side: element j of problem k is at
// x[j * stride + k] (stride 1 and one lane for a row).
template <class T, bool kLog, bool kOneLane>
void forward_block(const T* x, T* y, int64_t n, int64_t stride, int64_t lanes) {
  using M = acc_t<T>;  // elementwise math: float for bf16/f16/f32, double for f64
  // For f32/f64, y holds exp(x - m) exactly between the passes; 16-bit y would round it.
  constexpr bool kStoreExp = !kLog && std::is_same_v<T, M>;
  const int64_t L = kOneLane ? 1 : lanes;
  M m[kSoftmaxLanes];
  double s[kSoftmaxLanes];
  for (int64_t k = 0; k < L; ++k) {
    m[k] = -std::numeric_limits<M>::infinity();
    s[k] = 0;
  }
  // Pass 1: the max (a NaN never wins std::max, but poisons the sum below).
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = 0; k < L; ++k) m[k] = std::max(m[k], convert<M>(x[j * stride + k]));
  // Pass 2: sum of exp(x - m).
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = 0; k < L; ++k) {
      const M e = std::exp(convert<M>(x[j * stride + k]) - m[k]);
      s[k] += e;
      if constexpr (kStoreExp) y[j * stride + k] = e;
    }
  double f[kSoftmaxLanes];  // log(sum) for log_softmax, 1 / sum for softmax
  for (int64_t k = 0; k < L; ++k) f[k] = kLog ? std::log(s[k]) : 1.0 / s[k];
  // Pass 3: normalise.
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = 0; k < L; ++k) {
      const int64_t at = j * stride + k;
      if constexpr (kLog) {
        y[at] = convert<T>(static_cast<double>(convert<M>(x[at]) - m[k]) - f[k]);
      } else if constexpr (kStoreExp) {
        y[at] = convert<T>(static_cast<double>(y[at]) * f[k]);
      } else {
        y[at] = convert<T>(static_cast<double>(std::exp(convert<M>(x[at]) - m[k])) * f[k]);
      }
    }
}

// Backward over a block laid out as in forward_block.
template <class T, bool kLog, bool kOneLane>
void backward_block(const T* y, const T* g, T* dx, int64_t n, int64_t stride, int64_t lanes) {
  using M = acc_t<T>;
  const int64_t L = kOneLane ? 1 : lanes;
  double s[kSoftmaxLanes];  // sum_k g_k (log_softmax) or sum_k g_k y_k (softmax)
  for (int64_t k = 0; k < L; ++k) s[k] = 0;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = 0; k < L; ++k) {
      const int64_t at = j * stride + k;
      const double gv = convert<double>(g[at]);
      s[k] += kLog ? gv : gv * convert<double>(y[at]);
    }
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = 0; k < L; ++k) {
      const int64_t at = j * stride + k;
      const double gv = convert<double>(g[at]);
      if constexpr (kLog) dx[at] = convert<T>(gv - static_cast<double>(std::exp(convert<M>(y[at]))) * s[k]);
      else dx[at] = convert<T>(convert<double>(y[at]) * (gv - s[k]));
    }
}

void check_args(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor& first = **ts.begin();
  for (const Tensor* t : ts)
    FORGE_CHECK(t->is_contiguous() && t->shape() == first.shape() && t->dtype() == first.dtype(), op,
                ": the CPU kernel needs contiguous tensors of one shape and dtype, got ", t->shape(), " ",
                dtype_name(t->dtype()), " next to ", first.shape(), " ", dtype_name(first.dtype()));
}

}  // namespace

void softmax_forward(const Tensor& x, Tensor& y, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  if (x.numel() == 0) return;
  check_args(op, {&x, &y});
  const Layout l = layout_of(x.shape(), dim);
  dispatch_float(x.dtype(), op, [&]<class T>() {
    const T* in = x.data<T>();
    T* out = y.data<T>();
    auto run = [&]<bool kLog>() {
      for_each_block(l, [&]<bool kOneLane>(int64_t off, int64_t lanes) {
        forward_block<T, kLog, kOneLane>(in + off, out + off, l.n, kOneLane ? 1 : l.inner, lanes);
      });
    };
    if (log) run.template operator()<true>();
    else run.template operator()<false>();
  });
}

void softmax_backward(const Tensor& y, const Tensor& g, Tensor& dx, int64_t dim, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  if (y.numel() == 0) return;
  check_args(op, {&y, &g, &dx});
  const Layout l = layout_of(y.shape(), dim);
  dispatch_float(y.dtype(), op, [&]<class T>() {
    const T* yp = y.data<T>();
    const T* gp = g.data<T>();
    T* out = dx.data<T>();
    auto run = [&]<bool kLog>() {
      for_each_block(l, [&]<bool kOneLane>(int64_t off, int64_t lanes) {
        backward_block<T, kLog, kOneLane>(yp + off, gp + off, out + off, l.n, kOneLane ? 1 : l.inner, lanes);
      });
    };
    if (log) run.template operator()<true>();
    else run.template operator()<false>();
  });
}

}  // namespace forge::cpu
