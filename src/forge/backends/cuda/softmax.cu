// CUDA softmax / log-softmax along one dim, forward and backward: the counterparts of
// backends/cpu/softmax.cpp.
//
// A contiguous tensor of shape (..., n, ...) is viewed as (outer, n, inner); each (o, i) is
// one problem of length n with stride `inner`.
//   forward   softmax      y_j = exp(x_j - m) / s            m = max_k x_k, s = sum_k exp(x_k - m)
//             log_softmax  y_j = (x_j - m) - log(s)
//   backward  softmax      dx_j = y_j * (g_j - sum_k g_k y_k)
//             log_softmax  dx_j = g_j - exp(y_j) * sum_k g_k
// Precision: M = f32 for f32/bf16/f16 (f64 for f64) for every exp, sum and product; each
// output is rounded once to T. exp is expf for f32 (the __expf intrinsic for bf16/f16,
// whose error is far below their rounding). The CPU sums in double: results agree to f32
// rounding. A row holding a NaN, or only -inf, gives NaN for the whole row, as the CPU.
//
// Memory contract: x, y (backward), g are read only; y (forward) and dx (backward) are
// contiguous, of the input's shape and dtype, and overwritten. No scratch.
//
// Note [softmax plans]:
// - inner == 1 (the last dim, the common case): row groups (Note [row groups] in
//   reduce.cuh), 16-byte vector loads/stores when every row is aligned. The forward reads
//   the row twice: once for the online max/sum (Note [online softmax] in reduce.cuh), once
//   to write y; the second read of a row of up to a few hundred KB usually hits L2. The
//   backward reads (y, g) twice the same way. A row is never split across blocks: a few
//   very long rows use few SMs, which is fine for the attention-sized rows this serves
//   (cross-entropy over the vocabulary has its own fused kernel, loss.cu).
// - inner > 1 (a softmax over a non-last dim): one thread per (o, i) problem walking j with
//   stride inner, so a warp reads 32 neighbouring problems' elements at once (coalesced).
//   The forward uses the per-element online update, then a second pass to write.
//
// Instantiations: {softmax, log_softmax} x {forward, backward} x {rows, columns} x 4 dtypes.
#include "forge/backends/cuda/softmax.h"

#include "forge/backends/cuda/reduce.cuh"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cuda {
namespace {

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

template <class T> inline constexpr bool kFastExp = is_half_v<T>;

// ---- rows (inner == 1) --------------------------------------------------------------------

template <class T, bool kLog>
__global__ void __launch_bounds__(kReduceThreads)
    softmax_rows_kernel(const T* __restrict__ x,  // (rows, n)
                        T* __restrict__ y,        // (rows, n)
                        int64_t rows, int64_t n, int tx, bool vec) {
  using M = acc_t<T>;
  constexpr int V = kVec<T>;
  constexpr bool kFast = kFastExp<T>;
  __shared__ GroupScratch<MaxSum<M>> smem;
  const int ty = kReduceThreads / tx;
  const int lane = static_cast<int>(threadIdx.x) % tx, group = static_cast<int>(threadIdx.x) / tx;
  const int64_t groups = (rows + ty - 1) / ty;
  auto merge = [](const MaxSum<M>& a, const MaxSum<M>& b) { return maxsum_merge<kFast>(a, b); };
  for (int64_t gi = blockIdx.x; gi < groups; gi += gridDim.x) {
    const int64_t row = gi * ty + group;
    const T* xr = x + row * n;
    T* yr = y + row * n;
    MaxSum<M> st = maxsum_identity<M>();
    if (row < rows) {
      if (vec) {
        for (int64_t w = lane; w < n / V; w += tx) {
          const Vec<T, V> v = reinterpret_cast<const Vec<T, V>*>(xr)[w];
          M f[V];
#pragma unroll
          for (int k = 0; k < V; ++k) f[k] = convert<M>(v.v[k]);
          maxsum_update<kFast>(st, f);
        }
      } else {
        for (int64_t c = lane; c < n; c += tx) {
          const M f[1] = {convert<M>(xr[c])};
          maxsum_update<kFast>(st, f);
        }
      }
    }
    st = group_reduce(st, tx, merge, smem);
    if (row < rows) {
      // softmax: y = exp(x - m) * (1 / s); log_softmax: y = (x - m) - log(s).
      const M f = kLog ? log(st.s) : M(1) / st.s;
      auto out = [&](M v) { return kLog ? (v - st.m) - f : exp_of<kFast>(v - st.m) * f; };
      if (vec) {
        for (int64_t w = lane; w < n / V; w += tx) {
          const Vec<T, V> v = reinterpret_cast<const Vec<T, V>*>(xr)[w];
          Vec<T, V> o;
#pragma unroll
          for (int k = 0; k < V; ++k) o.v[k] = convert<T>(out(convert<M>(v.v[k])));
          reinterpret_cast<Vec<T, V>*>(yr)[w] = o;
        }
      } else {
        for (int64_t c = lane; c < n; c += tx) yr[c] = convert<T>(out(convert<M>(xr[c])));
      }
    }
  }
}

template <class T, bool kLog>
__global__ void __launch_bounds__(kReduceThreads)
    softmax_backward_rows_kernel(const T* __restrict__ y,  // (rows, n)
                                 const T* __restrict__ g,  // (rows, n)
                                 T* __restrict__ dx,       // (rows, n)
                                 int64_t rows, int64_t n, int tx, bool vec) {
  using M = acc_t<T>;
  constexpr int V = kVec<T>;
  constexpr bool kFast = kFastExp<T>;
  __shared__ GroupScratch<M> smem;
  const int ty = kReduceThreads / tx;
  const int lane = static_cast<int>(threadIdx.x) % tx, group = static_cast<int>(threadIdx.x) / tx;
  const int64_t groups = (rows + ty - 1) / ty;
  auto plus = [](M a, M b) { return a + b; };
  // log_softmax: s = sum g; softmax: s = sum g * y.
  auto term = [](M yv, M gv) { return kLog ? gv : gv * yv; };
  auto grad = [&](M yv, M gv, M s) { return kLog ? gv - exp_of<kFast>(yv) * s : yv * (gv - s); };
  for (int64_t gi = blockIdx.x; gi < groups; gi += gridDim.x) {
    const int64_t row = gi * ty + group;
    const T* yr = y + row * n;
    const T* gr = g + row * n;
    T* dr = dx + row * n;
    M s = M(0);
    if (row < rows) {
      if (vec) {
        for (int64_t w = lane; w < n / V; w += tx) {
          const Vec<T, V> yv = reinterpret_cast<const Vec<T, V>*>(yr)[w];
          const Vec<T, V> gv = reinterpret_cast<const Vec<T, V>*>(gr)[w];
#pragma unroll
          for (int k = 0; k < V; ++k) s += term(convert<M>(yv.v[k]), convert<M>(gv.v[k]));
        }
      } else {
        for (int64_t c = lane; c < n; c += tx) s += term(convert<M>(yr[c]), convert<M>(gr[c]));
      }
    }
    s = group_reduce(s, tx, plus, smem);
    if (row < rows) {
      if (vec) {
        for (int64_t w = lane; w < n / V; w += tx) {
          const Vec<T, V> yv = reinterpret_cast<const Vec<T, V>*>(yr)[w];
          const Vec<T, V> gv = reinterpret_cast<const Vec<T, V>*>(gr)[w];
          Vec<T, V> o;
#pragma unroll
          for (int k = 0; k < V; ++k) o.v[k] = convert<T>(grad(convert<M>(yv.v[k]), convert<M>(gv.v[k]), s));
          reinterpret_cast<Vec<T, V>*>(dr)[w] = o;
        }
      } else {
        for (int64_t c = lane; c < n; c += tx) dr[c] = convert<T>(grad(convert<M>(yr[c]), convert<M>(gr[c]), s));
      }
    }
  }
}

// ---- columns (inner > 1) ------------------------------------------------------------------

template <class T, bool kLog>
__global__ void __launch_bounds__(kReduceThreads)
    softmax_cols_kernel(const T* __restrict__ x,  // (outer, n, inner)
                        T* __restrict__ y,        // (outer, n, inner)
                        int64_t outer, int64_t n, int64_t inner) {
  using M = acc_t<T>;
  constexpr bool kFast = kFastExp<T>;
  const int64_t problems = outer * inner, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < problems; p += step) {
    const int64_t base = (p / inner) * n * inner + p % inner;
    MaxSum<M> st = maxsum_identity<M>();
    for (int64_t j = 0; j < n; ++j) {
      const M f[1] = {convert<M>(x[base + j * inner])};
      maxsum_update<kFast>(st, f);
    }
    const M f = kLog ? log(st.s) : M(1) / st.s;
    for (int64_t j = 0; j < n; ++j) {
      const M v = convert<M>(x[base + j * inner]);
      y[base + j * inner] = convert<T>(kLog ? (v - st.m) - f : exp_of<kFast>(v - st.m) * f);
    }
  }
}

template <class T, bool kLog>
__global__ void __launch_bounds__(kReduceThreads)
    softmax_backward_cols_kernel(const T* __restrict__ y,  // (outer, n, inner)
                                 const T* __restrict__ g,  // (outer, n, inner)
                                 T* __restrict__ dx,       // (outer, n, inner)
                                 int64_t outer, int64_t n, int64_t inner) {
  using M = acc_t<T>;
  constexpr bool kFast = kFastExp<T>;
  const int64_t problems = outer * inner, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < problems; p += step) {
    const int64_t base = (p / inner) * n * inner + p % inner;
    M s = M(0);
    for (int64_t j = 0; j < n; ++j) {
      const M gv = convert<M>(g[base + j * inner]);
      s += kLog ? gv : gv * convert<M>(y[base + j * inner]);
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t at = base + j * inner;
      const M yv = convert<M>(y[at]), gv = convert<M>(g[at]);
      dx[at] = convert<T>(kLog ? gv - exp_of<kFast>(yv) * s : yv * (gv - s));
    }
  }
}

void check_args(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor& first = **ts.begin();
  for (const Tensor* t : ts)
    FORGE_CHECK(t->is_cuda() && t->device() == first.device() && t->is_contiguous() && t->shape() == first.shape() &&
                    t->dtype() == first.dtype(),
                op, ": the CUDA kernel needs contiguous tensors of one shape and dtype on one GPU, got ", t->shape(),
                " ", dtype_name(t->dtype()), " on ", t->device().str(), " next to ", first.shape(), " ",
                dtype_name(first.dtype()), " on ", first.device().str());
}

}  // namespace

void softmax_forward(const Tensor& x, Tensor& y, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  if (x.numel() == 0) return;
  check_args(op, {&x, &y});
  const Layout l = layout_of(x.shape(), dim);
  const int device = x.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  dispatch_float(x.dtype(), op, [&]<class T>() {
    const T* in = static_cast<const T*>(x.data_ptr());
    T* out = static_cast<T*>(y.data_ptr());
    auto run = [&]<bool kLog>() {
      if (l.inner == 1) {
        constexpr int V = kVec<T>;
        const bool vec = l.n % V == 0 && aligned16(in) && aligned16(out);
        const RowGroups g = RowGroups::for_work(vec ? l.n / V : l.n);
        const int64_t groups = (l.outer + g.ty - 1) / g.ty;
        softmax_rows_kernel<T, kLog><<<grid_blocks(device, groups, 32), kReduceThreads, 0, stream>>>(in, out, l.outer,
                                                                                                   l.n, g.tx, vec);
      } else {
        const int64_t problems = l.outer * l.inner;
        softmax_cols_kernel<T, kLog><<<grid_blocks(device, (problems + kReduceThreads - 1) / kReduceThreads),
                                       kReduceThreads, 0, stream>>>(in, out, l.outer, l.n, l.inner);
      }
      FORGE_CUDA_LAUNCH_CHECK(op, ": x ", x.shape(), " ", dtype_name(x.dtype()), " along dim ", dim);
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
  const int device = y.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  dispatch_float(y.dtype(), op, [&]<class T>() {
    const T* yp = static_cast<const T*>(y.data_ptr());
    const T* gp = static_cast<const T*>(g.data_ptr());
    T* out = static_cast<T*>(dx.data_ptr());
    auto run = [&]<bool kLog>() {
      if (l.inner == 1) {
        constexpr int V = kVec<T>;
        const bool vec = l.n % V == 0 && aligned16(yp) && aligned16(gp) && aligned16(out);
        const RowGroups rg = RowGroups::for_work(vec ? l.n / V : l.n);
        const int64_t groups = (l.outer + rg.ty - 1) / rg.ty;
        softmax_backward_rows_kernel<T, kLog>
            <<<grid_blocks(device, groups, 32), kReduceThreads, 0, stream>>>(yp, gp, out, l.outer, l.n, rg.tx, vec);
      } else {
        const int64_t problems = l.outer * l.inner;
        softmax_backward_cols_kernel<T, kLog><<<grid_blocks(device, (problems + kReduceThreads - 1) / kReduceThreads),
                                                kReduceThreads, 0, stream>>>(yp, gp, out, l.outer, l.n, l.inner);
      }
      FORGE_CUDA_LAUNCH_CHECK(op, ": y ", y.shape(), " ", dtype_name(y.dtype()), " along dim ", dim);
    };
    if (log) run.template operator()<true>();
    else run.template operator()<false>();
  });
}

}  // namespace forge::cuda
