// CPU layer norm and RMS norm over the last dim: forward and one fused backward.
//
// x is viewed as (R, C): R rows of C features (R = B * T for activations (B, T, C)).
//
// Forward, per row r:
//   layer_norm  mean_r  = sum_j x_rj / C
//               rstd_r  = 1 / sqrt(sum_j (x_rj - mean_r)^2 / C + eps)   (biased variance, two passes)
//               xhat_rj = (x_rj - mean_r) * rstd_r
//               y_rj    = xhat_rj * w_j + b_j
//   rms_norm    rstd_r  = 1 / sqrt(sum_j x_rj^2 / C + eps)                (LLaMA's RMSNorm)
//               xhat_rj = x_rj * rstd_r
//               y_rj    = xhat_rj * w_j
// (w = 1 and b = 0 when the weight / bias is absent.)
//
// Backward, from dy = dL/dy, with g_rj = dy_rj * w_j and the saved mean/rstd:
//   layer_norm  dx_rj = rstd_r * (g_rj - (1/C) sum_k g_rk - xhat_rj * (1/C) sum_k g_rk xhat_rk)
//   rms_norm    dx_rj = rstd_r * (g_rj - xhat_rj * (1/C) sum_k g_rk xhat_rk)
//   both        dw_j  = sum_r dy_rj * xhat_rj
//   layer_norm  db_j  = sum_r dy_rj
//
// Precision: row sums and the dweight/dbias column sums accumulate in double (row sums in
// kSumLanes interleaved partial sums: independent add chains, a fixed order); elementwise
// math runs in acc_t<T> (float for bf16/f16/f32, double for f64). mean/rstd are rounded to
// the stat dtype (f32 for 16-bit inputs, else the input's dtype) once, and the forward's
// normalisation uses the rounded values, so forward and backward see the same statistics.
//
// add_layer_norm_forward first forms h_rj = T(x_rj + residual_rj) (the rounding of ops::add) and
// normalises h exactly as layer_norm_forward normalises x, so add + layer_norm and the fused op
// agree bit for bit.
//
// Memory contract:
//   x, residual, weight, bias, mean, rstd, dy   read only; all contiguous
//   forward   overwrites y (R, C), mean (R), rstd (R) (and h (R, C) for add_layer_norm)
//   backward  overwrites each defined member of NormGrads: dx (R, C), dweight (C), dbias (C);
//             nothing is accumulated into caller memory (the autograd engine accumulates)
//   scratch   the backward's column partial sums: parts x C doubles per weight/bias gradient
//
// Threads: rows are split across OpenMP threads. dweight/dbias are reduced
// deterministically: the rows are cut into a number of parts that depends on R only (never
// on the thread count); each part sums its rows, in order, into its own double partial; the
// partials are then combined column by column in part order. The result is bit-identical
// for any number of threads.
#include "forge/backends/cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "forge/backends/cpu/loops.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cpu {
namespace {

// The most row parts the backward cuts R rows into (each part owns C doubles of partial sums
// per reduced gradient).
constexpr int64_t kMaxRowParts = 128;

// Row sums run in kSumLanes interleaved double accumulators: element j goes to lane j % kSumLanes.
// The lanes are independent add chains (a single running sum is bound by the add latency),
// and the order is fixed, so the result does not depend on threads.
constexpr int64_t kSumLanes = 8;

// Calls body(j, lane) for j in [0, n) with lane = j % kSumLanes.
template <class Body> void for_lanes(int64_t n, const Body& body) {
  int64_t j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes)
    for (int64_t k = 0; k < kSumLanes; ++k) body(j + k, k);
  for (int64_t k = 0; j < n; ++j, ++k) body(j, k);
}

double lane_total(const double (&acc)[kSumLanes]) {
  double s = 0;
  for (double a : acc) s += a;
  return s;
}

struct Rows {
  int64_t R = 0, C = 0;
};

Rows rows_of(const char* op, const Tensor& x, const Tensor& rstd) {
  const int64_t C = x.dim() == 0 ? 1 : x.shape().back();
  const int64_t R = rstd.numel();
  FORGE_CHECK(x.is_contiguous() && x.numel() == R * C && rstd.is_contiguous(), op,
              ": the CPU kernel needs contiguous x with R * C elements and R statistics, got x ", x.shape(), " and ",
              R, " statistics");
  return {R, C};
}

void check_param(const char* op, const char* what, const Tensor& p, const Tensor& x, int64_t C) {
  if (!p.defined()) return;
  FORGE_CHECK(p.is_contiguous() && p.numel() == C && p.dtype() == x.dtype(), op, ": ", what,
              " must be contiguous, of ", C, " elements and x's dtype ", dtype_name(x.dtype()), ", got shape ",
              p.shape(), " ", dtype_name(p.dtype()));
}

// With `h` non-null (add_layer_norm), each row is first h = x + residual, rounded to T as the
// binary add kernel rounds it, written to `h` and normalised from there.
template <class T, bool kRms>
void forward_rows(const Tensor& x, const Tensor& residual, Tensor* h, const Tensor& weight, const Tensor& bias,
                  double eps, Tensor& y, Tensor* mean, Tensor& rstd, Rows rc) {
  using M = acc_t<T>;  // elementwise math
  using S = acc_t<T>;  // stat dtype
  const int64_t R = rc.R, C = rc.C;  // not a structured binding: OpenMP regions capture these (clang)
  const T* px = x.data<T>();
  const T* pres = h ? residual.data<T>() : nullptr;
  T* ph = h ? h->data<T>() : nullptr;
  T* py = y.data<T>();
  const T* pw = weight.defined() ? weight.data<T>() : nullptr;
  const T* pb = bias.defined() ? bias.data<T>() : nullptr;
  S* pm = kRms ? nullptr : mean->data<S>();
  S* pr = rstd.data<S>();
  const double inv_c = 1.0 / static_cast<double>(C);
#pragma omp parallel for schedule(static) if (R * C >= kParallelGrain && R > 1)
  for (int64_t r = 0; r < R; ++r) {
    const T* xr = px + r * C;
    if (pres) {
      const T* rr = pres + r * C;
      T* hr = ph + r * C;
      for (int64_t j = 0; j < C; ++j) hr[j] = convert<T>(convert<M>(xr[j]) + convert<M>(rr[j]));
      xr = hr;
    }
    T* yr = py + r * C;
    M mu = 0;
    if constexpr (!kRms) {
      double acc[kSumLanes] = {};
      for_lanes(C, [&](int64_t j, int64_t k) { acc[k] += static_cast<double>(convert<M>(xr[j])); });
      const S m = static_cast<S>(lane_total(acc) * inv_c);
      pm[r] = m;
      mu = static_cast<M>(m);
    }
    double acc[kSumLanes] = {};
    for_lanes(C, [&](int64_t j, int64_t k) {
      const double d = static_cast<double>(convert<M>(xr[j]) - mu);
      acc[k] += d * d;
    });
    const S rs = static_cast<S>(1.0 / std::sqrt(lane_total(acc) * inv_c + eps));
    pr[r] = rs;
    const M rm = static_cast<M>(rs);
    for (int64_t j = 0; j < C; ++j) {
      M v = (convert<M>(xr[j]) - mu) * rm;
      if (pw) v *= convert<M>(pw[j]);
      if (pb) v += convert<M>(pb[j]);
      yr[j] = convert<T>(v);
    }
  }
}

template <class T, bool kRms>
void backward_rows(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor* mean, const Tensor& rstd,
                   NormGrads& grads, Rows rc) {
  using M = acc_t<T>;
  using S = acc_t<T>;
  const int64_t R = rc.R, C = rc.C;  // not a structured binding: OpenMP regions capture these (clang)
  const T* px = x.data<T>();
  const T* pg = dy.data<T>();
  const T* pw = weight.defined() ? weight.data<T>() : nullptr;
  const S* pm = kRms ? nullptr : mean->data<S>();
  const S* pr = rstd.data<S>();
  T* pdx = grads.dx.defined() ? grads.dx.data<T>() : nullptr;
  const bool want_w = grads.dweight.defined(), want_b = grads.dbias.defined();
  const int64_t parts = std::min(R, kMaxRowParts);
  std::vector<double> part_w(want_w ? static_cast<size_t>(parts * C) : 0);
  std::vector<double> part_b(want_b ? static_cast<size_t>(parts * C) : 0);
  const M inv_c = static_cast<M>(1.0 / static_cast<double>(C));
#pragma omp parallel for schedule(static) if (R * C >= kParallelGrain && parts > 1)
  for (int64_t p = 0; p < parts; ++p) {
    double* aw = want_w ? part_w.data() + p * C : nullptr;
    double* ab = want_b ? part_b.data() + p * C : nullptr;
    for (int64_t r = R * p / parts; r < R * (p + 1) / parts; ++r) {
      const T* xr = px + r * C;
      const T* gr = pg + r * C;
      const M mu = kRms ? M(0) : static_cast<M>(pm[r]);
      const M rs = static_cast<M>(pr[r]);
      double a1[kSumLanes] = {}, a2[kSumLanes] = {};  // sum_k g_k, sum_k g_k xhat_k
      for_lanes(C, [&](int64_t j, int64_t k) {
        const M xh = (convert<M>(xr[j]) - mu) * rs;
        const M d = convert<M>(gr[j]);
        const M g = pw ? d * convert<M>(pw[j]) : d;
        if constexpr (!kRms) a1[k] += static_cast<double>(g);
        a2[k] += static_cast<double>(g) * static_cast<double>(xh);
        if (aw) aw[j] += static_cast<double>(d) * static_cast<double>(xh);
        if (ab) ab[j] += static_cast<double>(d);
      });
      if (!pdx) continue;
      const M m1 = static_cast<M>(lane_total(a1)) * inv_c, m2 = static_cast<M>(lane_total(a2)) * inv_c;
      T* dxr = pdx + r * C;
      for (int64_t j = 0; j < C; ++j) {
        const M xh = (convert<M>(xr[j]) - mu) * rs;
        const M d = convert<M>(gr[j]);
        const M g = pw ? d * convert<M>(pw[j]) : d;
        dxr[j] = convert<T>(rs * (g - m1 - xh * m2));
      }
    }
  }
  // Fixed-order combine of the partials (zeros when R == 0).
  auto combine = [&](const std::vector<double>& part, Tensor& out) {
    T* po = out.data<T>();
#pragma omp parallel for schedule(static) if (parts * C >= kParallelGrain)
    for (int64_t j = 0; j < C; ++j) {
      double s = 0;
      for (int64_t p = 0; p < parts; ++p) s += part[static_cast<size_t>(p * C + j)];
      po[j] = convert<T>(s);
    }
  };
  if (want_w) combine(part_w, grads.dweight);
  if (want_b) combine(part_b, grads.dbias);
}

void check_grads(const char* op, const NormGrads& g, const Tensor& x, int64_t C) {
  FORGE_CHECK(!g.dx_add.defined(), op, ": NormGrads::dx_add is a CUDA kernel option; on the CPU add it to dx after");
  if (g.dx.defined())
    FORGE_CHECK(g.dx.is_contiguous() && g.dx.numel() == x.numel() && g.dx.dtype() == x.dtype(), op,
                ": dx must be contiguous with x's size and dtype");
  check_param(op, "dweight", g.dweight, x, C);
  check_param(op, "dbias", g.dbias, x, C);
}

}  // namespace

DType norm_stat_dtype(DType x) { return x == DType::bf16 || x == DType::f16 ? DType::f32 : x; }

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& y,
                        Tensor& mean, Tensor& rstd) {
  const Rows rc = rows_of("layer_norm", x, rstd);
  check_param("layer_norm", "weight", weight, x, rc.C);
  check_param("layer_norm", "bias", bias, x, rc.C);
  FORGE_CHECK(y.is_contiguous() && y.numel() == x.numel() && y.dtype() == x.dtype() && mean.numel() == rc.R &&
                  mean.is_contiguous(),
              "layer_norm: bad output buffers for x of shape ", x.shape());
  dispatch_float(x.dtype(), "layer_norm", [&]<class T>() {
    forward_rows<T, false>(x, Tensor(), nullptr, weight, bias, eps, y, &mean, rstd, rc);
  });
}

void add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                            double eps, Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd) {
  const Rows rc = rows_of("add_layer_norm", x, rstd);
  check_param("add_layer_norm", "weight", weight, x, rc.C);
  check_param("add_layer_norm", "bias", bias, x, rc.C);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&residual, &h, &y})
    FORGE_CHECK(t->is_contiguous() && t->numel() == x.numel() && t->dtype() == x.dtype(),
                "add_layer_norm: residual, h and y must be contiguous with x's size and dtype (x ", x.shape(), " ",
                dtype_name(x.dtype()), "), got ", t->shape(), " ", dtype_name(t->dtype()));
  FORGE_CHECK(mean.numel() == rc.R && mean.is_contiguous(), "add_layer_norm: bad mean buffer for x of shape ",
              x.shape());
  dispatch_float(x.dtype(), "add_layer_norm", [&]<class T>() {
    forward_rows<T, false>(x, residual, &h, weight, bias, eps, y, &mean, rstd, rc);
  });
}

void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, NormGrads& grads) {
  const Rows rc = rows_of("layer_norm_backward", x, rstd);
  check_param("layer_norm_backward", "weight", weight, x, rc.C);
  check_grads("layer_norm_backward", grads, x, rc.C);
  FORGE_CHECK(dy.is_contiguous() && dy.numel() == x.numel() && dy.dtype() == x.dtype(),
              "layer_norm_backward: dy must be contiguous with x's size and dtype, got ", dy.shape(), " ",
              dtype_name(dy.dtype()));
  dispatch_float(x.dtype(), "layer_norm_backward", [&]<class T>() {
    backward_rows<T, false>(dy, x, weight, &mean, rstd, grads, rc);
  });
}

void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd) {
  const Rows rc = rows_of("rms_norm", x, rstd);
  check_param("rms_norm", "weight", weight, x, rc.C);
  FORGE_CHECK(y.is_contiguous() && y.numel() == x.numel() && y.dtype() == x.dtype(),
              "rms_norm: bad output buffer for x of shape ", x.shape());
  dispatch_float(x.dtype(), "rms_norm", [&]<class T>() {
    forward_rows<T, true>(x, Tensor(), nullptr, weight, Tensor(), eps, y, nullptr, rstd, rc);
  });
}

void add_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps, Tensor& h,
                          Tensor& y, Tensor& rstd) {
  const Rows rc = rows_of("add_rms_norm", x, rstd);
  check_param("add_rms_norm", "weight", weight, x, rc.C);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&residual, &h, &y})
    FORGE_CHECK(t->is_contiguous() && t->numel() == x.numel() && t->dtype() == x.dtype(),
                "add_rms_norm: residual, h and y must be contiguous with x's size and dtype (x ", x.shape(), " ",
                dtype_name(x.dtype()), "), got ", t->shape(), " ", dtype_name(t->dtype()));
  dispatch_float(x.dtype(), "add_rms_norm", [&]<class T>() {
    forward_rows<T, true>(x, residual, &h, weight, Tensor(), eps, y, nullptr, rstd, rc);
  });
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                       NormGrads& grads) {
  const Rows rc = rows_of("rms_norm_backward", x, rstd);
  check_param("rms_norm_backward", "weight", weight, x, rc.C);
  FORGE_CHECK(!grads.dbias.defined(), "rms_norm_backward: RMS norm has no bias");
  check_grads("rms_norm_backward", grads, x, rc.C);
  FORGE_CHECK(dy.is_contiguous() && dy.numel() == x.numel() && dy.dtype() == x.dtype(),
              "rms_norm_backward: dy must be contiguous with x's size and dtype, got ", dy.shape(), " ",
              dtype_name(dy.dtype()));
  dispatch_float(x.dtype(), "rms_norm_backward", [&]<class T>() {
    backward_rows<T, true>(dy, x, weight, nullptr, rstd, grads, rc);
  });
}

}  // namespace forge::cpu
