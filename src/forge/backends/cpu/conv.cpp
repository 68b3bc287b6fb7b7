// CPU conv2d (im2col + GEMM) and max_pool2d. See conv.h for the math and the memory contract.
#include "forge/backends/cpu/conv.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "forge/backends/cpu/blas.h"
#include "forge/backends/cpu/loops.h"
#include "forge/backends/cpu/tensor_kernels.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cpu {
namespace {
struct Geometry {
  int64_t N, Cin, H, W, Cout, kh, kw, sh, sw, ph, pw, Ho, Wo;
  int64_t K() const { return Cin * kh * kw; }
  int64_t L() const { return Ho * Wo; }
};

Geometry geometry(const Shape& x, const Tensor& w, const Conv2dParams& p) {
  Geometry g{x[0], x[1], x[2], x[3], w.size(0), w.size(2), w.size(3), p.sh, p.sw, p.ph, p.pw, 0, 0};
  g.Ho = (g.H + 2 * g.ph - g.kh) / g.sh + 1;
  g.Wo = (g.W + 2 * g.pw - g.kw) / g.sw + 1;
  return g;
}

// The output columns [lo, hi) whose input index o * s - pad + k lies in [0, n).
void valid_range(int64_t n_out, int64_t n_in, int64_t s, int64_t pad, int64_t k, int64_t& lo, int64_t& hi) {
  const int64_t first = pad - k;  // need o * s >= pad - k
  lo = first <= 0 ? 0 : (first + s - 1) / s;
  const int64_t last = n_in - 1 + pad - k;  // need o * s <= n_in - 1 + pad - k
  hi = last < 0 ? 0 : std::min(n_out, last / s + 1);
  lo = std::min(lo, hi);
}

// col (K, L) <- the patches of one sample x (Cin, H, W) with element strides (sc, sy, sx).
template <class C, class T>
void im2col(const T* x, int64_t sc, int64_t sy, int64_t sx, const Geometry& g, C* col) {
  const int64_t L = g.L();
  for (int64_t ci = 0; ci < g.Cin; ++ci)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        C* dst = col + ((ci * g.kh + i) * g.kw + j) * L;
        int64_t ox_lo, ox_hi;
        valid_range(g.Wo, g.W, g.sw, g.pw, j, ox_lo, ox_hi);
        for (int64_t oy = 0; oy < g.Ho; ++oy) {
          C* drow = dst + oy * g.Wo;
          const int64_t iy = oy * g.sh - g.ph + i;
          if (iy < 0 || iy >= g.H) {
            std::fill(drow, drow + g.Wo, C(0));
            continue;
          }
          const T* src = x + ci * sc + iy * sy;
          std::fill(drow, drow + ox_lo, C(0));
          for (int64_t ox = ox_lo; ox < ox_hi; ++ox) drow[ox] = convert<C>(src[(ox * g.sw - g.pw + j) * sx]);
          std::fill(drow + ox_hi, drow + g.Wo, C(0));
        }
      }
}

// dx (Cin, H, W) contiguous += the columns of dcol (K, L) put back where im2col read them.
template <class C>
void col2im(const C* dcol, const Geometry& g, C* dx) {
  const int64_t L = g.L();
  for (int64_t ci = 0; ci < g.Cin; ++ci)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        const C* src = dcol + ((ci * g.kh + i) * g.kw + j) * L;
        int64_t ox_lo, ox_hi;
        valid_range(g.Wo, g.W, g.sw, g.pw, j, ox_lo, ox_hi);
        for (int64_t oy = 0; oy < g.Ho; ++oy) {
          const int64_t iy = oy * g.sh - g.ph + i;
          if (iy < 0 || iy >= g.H) continue;
          C* drow = dx + (ci * g.H + iy) * g.W;
          for (int64_t ox = ox_lo; ox < ox_hi; ++ox) drow[ox * g.sw - g.pw + j] += src[oy * g.Wo + ox];
        }
      }
}

void check_blas_range(const Geometry& g) {
  constexpr int64_t kMax = std::numeric_limits<blasint>::max();
  FORGE_CHECK(g.K() <= kMax && g.L() <= kMax && g.Cout <= kMax && g.K() * g.L() <= kMax && g.Cout * g.K() <= kMax &&
                  g.Cout * g.L() <= kMax,
              "conv2d: sizes Cout=", g.Cout, " Cin*kh*kw=", g.K(), " Ho*Wo=", g.L(), " exceed the BLAS integer range");
}

bool run_parallel(int64_t tasks, int64_t work) {
  return tasks > 1 && work >= kParallelGrain && omp_get_max_threads() > 1 && !omp_in_parallel();
}

// The weight (Cout, K) as the compute type: w itself for f32/f64, an f32 copy for 16-bit.
template <class C, class T> const C* weight_as(const Tensor& w, std::vector<C>& copy) {
  const T* wp = w.data<T>();
  if constexpr (std::is_same_v<T, C>) {
    return wp;
  } else {
    copy.resize(static_cast<size_t>(w.numel()));
    for (int64_t i = 0; i < w.numel(); ++i) copy[static_cast<size_t>(i)] = convert<C>(wp[i]);
    return copy.data();
  }
}

}  // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p, Tensor& out) {
  FORGE_CHECK(w.is_contiguous() && out.is_contiguous(), "cpu::conv2d_forward: weight and out must be contiguous");
  const Geometry g = geometry(x.shape(), w, p);
  FORGE_CHECK(out.shape() == (Shape{g.N, g.Cout, g.Ho, g.Wo}), "cpu::conv2d_forward: out has shape ", out.shape(),
              ", expected ", Shape{g.N, g.Cout, g.Ho, g.Wo});
  if (out.numel() == 0) return;  // (Cin == 0 runs through: an empty GEMM gives 0, plus the bias)
  check_blas_range(g);
  dispatch_float(x.dtype(), "conv2d", [&]<class T>() {
    using C = acc_t<T>;
    const int64_t K = g.K(), L = g.L();
    std::vector<C> wcopy;
    const C* wc = weight_as<C, T>(w, wcopy);
    std::vector<C> b;
    if (bias.defined()) {
      const T* bp = bias.data<T>();
      for (int64_t co = 0; co < g.Cout; ++co) b.push_back(convert<C>(bp[co * bias.stride(0)]));
    }
    const T* xp = x.data<T>();
    T* op = out.data<T>();
    const bool parallel = run_parallel(g.N, g.N * g.Cout * K * L);
    SerialBlasScope serial_blas(parallel);
#pragma omp parallel if (parallel)
    {
      std::vector<C> col(static_cast<size_t>(K * L)), y;
#pragma omp for schedule(static)
      for (int64_t n = 0; n < g.N; ++n) {
        im2col(xp + n * x.stride(0), x.stride(1), x.stride(2), x.stride(3), g, col.data());
        T* on = op + n * g.Cout * L;
        C* yn;
        if constexpr (std::is_same_v<T, C>) {
          yn = on;
        } else {
          y.resize(static_cast<size_t>(g.Cout * L));
          yn = y.data();
        }
        gemm<C>(CblasNoTrans, CblasNoTrans, g.Cout, L, K, C(1), wc, K, col.data(), L, C(0), yn, L);
        if (!b.empty())
          for (int64_t co = 0; co < g.Cout; ++co)
            for (int64_t l = 0; l < L; ++l) yn[co * L + l] += b[static_cast<size_t>(co)];
        if constexpr (!std::is_same_v<T, C>)
          for (int64_t i = 0; i < g.Cout * L; ++i) on[i] = convert<T>(yn[i]);
      }
    }
  });
}

void conv2d_backward(const Tensor& dout, const Tensor& x, const Shape& x_shape, const Tensor& w, const Conv2dParams& p,
                     Tensor& dx, Tensor& dw, Tensor& db) {
  FORGE_CHECK(dout.is_contiguous() && w.is_contiguous(), "cpu::conv2d_backward: dout and weight must be contiguous");
  for (const Tensor* t : {&dx, &dw, &db})
    FORGE_CHECK(!t->defined() || t->is_contiguous(), "cpu::conv2d_backward: gradients must be contiguous");
  FORGE_CHECK(x_shape.size() == 4 && (!dw.defined() || (x.defined() && x.shape() == x_shape)),
              "cpu::conv2d_backward: dw needs the forward input x of shape ", x_shape);
  const Geometry g = geometry(x_shape, w, p);
  const int64_t K = g.K(), L = g.L();
  if (g.N * g.Cout * L == 0) {  // no output element: every gradient is zero
    for (Tensor* t : {&dx, &dw, &db})
      if (t->defined()) fill(*t, 0.0);
    return;
  }
  check_blas_range(g);
  dispatch_float(x.dtype(), "conv2d_backward", [&]<class T>() {
    using C = acc_t<T>;
    std::vector<C> wcopy;
    const C* wc = weight_as<C, T>(w, wcopy);
    const T* gp = dout.data<T>();
    const T* xp = x.defined() ? x.data<T>() : nullptr;
    T* dxp = dx.defined() ? dx.data<T>() : nullptr;
    const bool need_w = dw.defined(), need_b = db.defined();
    const int64_t plane = g.Cin * g.H * g.W;
    const bool parallel = run_parallel(g.N, g.N * g.Cout * K * L);
    const int nthreads = parallel ? omp_get_max_threads() : 1;
    // Per-thread partial sums of dw (Cout, K) and db (Cout).
    std::vector<std::vector<C>> dw_part(static_cast<size_t>(nthreads));
    std::vector<std::vector<double>> db_part(static_cast<size_t>(nthreads));
    {
      SerialBlasScope serial_blas(parallel);
#pragma omp parallel if (parallel) num_threads(nthreads)
      {
        const auto tid = static_cast<size_t>(omp_get_thread_num());
        std::vector<C>& dwp = dw_part[tid];
        std::vector<double>& dbp = db_part[tid];
        if (need_w) dwp.assign(static_cast<size_t>(g.Cout * K), C(0));
        if (need_b) dbp.assign(static_cast<size_t>(g.Cout), 0.0);
        std::vector<C> col, dcol, dy, dxs;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < g.N; ++n) {
          const T* gn = gp + n * g.Cout * L;
          const C* dyn;
          if constexpr (std::is_same_v<T, C>) {
            dyn = gn;
          } else {
            dy.resize(static_cast<size_t>(g.Cout * L));
            for (int64_t i = 0; i < g.Cout * L; ++i) dy[static_cast<size_t>(i)] = convert<C>(gn[i]);
            dyn = dy.data();
          }
          if (dxp) {  // dx_n = col2im(w^T dY_n)
            dcol.resize(static_cast<size_t>(K * L));
            gemm<C>(CblasTrans, CblasNoTrans, K, L, g.Cout, C(1), wc, K, dyn, L, C(0), dcol.data(), L);
            T* dxn = dxp + n * plane;
            if constexpr (std::is_same_v<T, C>) {
              std::fill(dxn, dxn + plane, C(0));
              col2im(dcol.data(), g, dxn);
            } else {
              dxs.assign(static_cast<size_t>(plane), C(0));
              col2im(dcol.data(), g, dxs.data());
              for (int64_t i = 0; i < plane; ++i) dxn[i] = convert<T>(dxs[static_cast<size_t>(i)]);
            }
          }
          if (need_w) {  // dw += dY_n col_n^T
            col.resize(static_cast<size_t>(K * L));
            im2col(xp + n * x.stride(0), x.stride(1), x.stride(2), x.stride(3), g, col.data());
            gemm<C>(CblasNoTrans, CblasTrans, g.Cout, K, L, C(1), dyn, L, col.data(), L, C(1), dwp.data(), K);
          }
          if (need_b)
            for (int64_t co = 0; co < g.Cout; ++co) {
              double s = 0;
              for (int64_t l = 0; l < L; ++l) s += static_cast<double>(dyn[co * L + l]);
              dbp[static_cast<size_t>(co)] += s;
            }
        }
      }
    }
    // Sum the partials in thread order (threads that got no sample hold zeros).
    if (need_w) {
      T* dwo = dw.data<T>();
      for (int64_t i = 0; i < g.Cout * K; ++i) {
        C s = 0;
        for (const auto& part : dw_part)
          if (!part.empty()) s += part[static_cast<size_t>(i)];
        dwo[i] = convert<T>(s);
      }
    }
    if (need_b) {
      T* dbo = db.data<T>();
      for (int64_t co = 0; co < g.Cout; ++co) {
        double s = 0;
        for (const auto& part : db_part)
          if (!part.empty()) s += part[static_cast<size_t>(co)];
        dbo[co] = convert<T>(s);
      }
    }
  });
}

void max_pool2d_forward(const Tensor& x, const Pool2dParams& p, Tensor& out, Tensor& indices) {
  FORGE_CHECK(out.is_contiguous() && indices.is_contiguous() && indices.dtype() == DType::i64 &&
                  indices.shape() == out.shape(),
              "cpu::max_pool2d_forward: out and indices (i64) must be contiguous and of one shape");
  if (out.numel() == 0) return;
  const int64_t C = x.size(1), H = x.size(2), W = x.size(3), Ho = out.size(2), Wo = out.size(3);
  const int64_t planes = x.size(0) * C;
  dispatch_float(x.dtype(), "max_pool2d", [&]<class T>() {
    const T* xp = x.data<T>();
    T* op = out.data<T>();
    int64_t* ip = indices.data<int64_t>();
    const int64_t s0 = x.stride(0), s1 = x.stride(1), sy = x.stride(2), sx = x.stride(3);
#pragma omp parallel for if (out.numel() * p.kh * p.kw >= kParallelGrain && planes > 1)
    for (int64_t pl = 0; pl < planes; ++pl) {
      const T* xpl = xp + (pl / C) * s0 + (pl % C) * s1;
      for (int64_t oy = 0; oy < Ho; ++oy) {
        const int64_t y0 = oy * p.sh - p.ph, y_lo = std::max<int64_t>(y0, 0), y_hi = std::min(y0 + p.kh, H);
        for (int64_t ox = 0; ox < Wo; ++ox) {
          const int64_t x0 = ox * p.sw - p.pw, x_lo = std::max<int64_t>(x0, 0), x_hi = std::min(x0 + p.kw, W);
          double best = -std::numeric_limits<double>::infinity();
          int64_t at = y_lo * W + x_lo;
          T best_v = convert<T>(best);
          bool nan_seen = false;  // NaN is the maximum: the first one wins, stop looking
          for (int64_t iy = y_lo; iy < y_hi && !nan_seen; ++iy)
            for (int64_t ix = x_lo; ix < x_hi && !nan_seen; ++ix) {
              const T v = xpl[iy * sy + ix * sx];
              const double d = convert<double>(v);
              nan_seen = std::isnan(d);
              if (d > best || nan_seen) {
                best = d;
                best_v = v;
                at = iy * W + ix;
              }
            }
          const int64_t o = (pl * Ho + oy) * Wo + ox;
          op[o] = best_v;
          ip[o] = at;
        }
      }
    }
  });
}

void max_pool2d_backward(const Tensor& dout, const Tensor& indices, Tensor& dx) {
  FORGE_CHECK(dx.is_contiguous() && indices.is_contiguous() && indices.shape() == dout.shape(),
              "cpu::max_pool2d_backward: dx and indices must be contiguous, indices of dout's shape");
  if (dx.numel() == 0) return;
  const int64_t C = dx.size(1), HW = dx.size(2) * dx.size(3), Ho = dout.size(2), Wo = dout.size(3);
  const int64_t planes = dx.size(0) * C;
  dispatch_float(dx.dtype(), "max_pool2d_backward", [&]<class T>() {
    const T* gp = dout.data<T>();
    const int64_t* ip = indices.data<int64_t>();
    T* dxp = dx.data<T>();
    const int64_t s0 = dout.stride(0), s1 = dout.stride(1), sy = dout.stride(2), sx = dout.stride(3);
#pragma omp parallel if (planes * HW >= kParallelGrain && planes > 1)
    {
      std::vector<double> acc(static_cast<size_t>(HW));
#pragma omp for schedule(static)
      for (int64_t pl = 0; pl < planes; ++pl) {
        std::fill(acc.begin(), acc.end(), 0.0);
        const T* gpl = gp + (pl / C) * s0 + (pl % C) * s1;
        const int64_t* ipl = ip + pl * Ho * Wo;
        for (int64_t oy = 0; oy < Ho; ++oy)
          for (int64_t ox = 0; ox < Wo; ++ox)
            acc[static_cast<size_t>(ipl[oy * Wo + ox])] += convert<double>(gpl[oy * sy + ox * sx]);
        T* dpl = dxp + pl * HW;
        for (int64_t i = 0; i < HW; ++i) dpl[i] = convert<T>(acc[static_cast<size_t>(i)]);
      }
    }
  });
}

}  // namespace forge::cpu
