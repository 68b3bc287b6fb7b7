// CUDA conv2d and max_pool2d, forward and backward: the counterparts of
// backends/cpu/conv.cpp (same math, same memory contract; see cpu/conv.h for both).
//
// Math (K = Cin * kh * kw, L = Ho * Wo; padded positions read as 0):
//   conv2d      out[n, co, oy, ox] = sum_{ci, i, j} x[n, ci, oy sh - ph + i, ox sw - pw + j] w[co, ci, i, j]
//                                    + bias[co]
//   dx          dx[n, ci, iy, ix]  = sum of dout[n, co, oy, ox] w[co, ci, i, j] over every (co, i, j)
//                                    with oy sh - ph + i = iy and ox sw - pw + j = ix
//   dw          dw[co, ci, i, j]   = sum_{n, oy, ox} dout[n, co, oy, ox] x[n, ci, oy sh - ph + i, ox sw - pw + j]
//   db          db[co]             = sum_{n, oy, ox} dout[n, co, oy, ox]
//   max_pool2d  out = the first maximum of the window in row-major order (a NaN wins at once),
//               indices = its iy * W + ix; dx[n, c].flat[indices[o]] += dout[o]
//
// Memory contract: x (any strides), w (contiguous), bias (any stride), dout (conv: contiguous;
// pooling: any strides), indices (contiguous i64) are read only; out, indices, dx, dw, db are
// contiguous and overwritten; no scratch.
//
// Note [CUDA conv kernels]
// ------------------------
// These are direct kernels, written for correctness and determinism on the small convolutions
// of LeNet-style CNNs (28x28 images, 5x5 kernels, 1..16 channels, batches up to a few hundred);
// they are not tuned (no tiling, no tensor cores: large convolutions belong to cuDNN's
// implicit GEMM), see docs/cuda-kernels.md.
//   conv2d_forward_kernel   one thread per output element; the K products accumulate in
//                           acc_t<T> (f32 for bf16/f16/f32), bias added last (as the CPU adds it
//                           after its GEMM); weights are read as warp-wide broadcasts.
//   conv2d_dx_kernel        one thread per input element gathers the Cout * kh * kw
//                           (output, weight) pairs that read it (no atomics), acc_t<T>.
//   conv2d_dw_kernel        one block per weight element (and one per bias element): the block's
//                           threads stride over the N * Ho * Wo products in a fixed pattern, in
//                           f64 (these sums run over 10^5 terms and more), then a fixed-shape
//                           tree in shared memory: deterministic, rounded once to T.
//   max_pool2d_forward_kernel   one thread per output, the CPU's scan and tie rules.
//   max_pool2d_backward_kernel  one thread per input element gathers the outputs whose windows
//                           contain it and whose index points at it, in row-major output order,
//                           summing in f64: bit-identical to the CPU's scatter (same order,
//                           same precision), and no atomics.
#include "forge/backends/cuda/conv.h"

#include <algorithm>
#include <limits>

#include "forge/backends/cuda/loops.cuh"
#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cuda {
namespace {

struct ConvGeometry {
  int64_t N, Cin, H, W, Cout, kh, kw, sh, sw, ph, pw, Ho, Wo;
  int64_t sx0, sx1, sx2, sx3;  // x's strides (elements)
};

ConvGeometry geometry(const Shape& x_shape, const Strides& x_strides, const Tensor& w, const Conv2dParams& p) {
  ConvGeometry g{x_shape[0], x_shape[1], x_shape[2], x_shape[3], w.size(0), w.size(2), w.size(3), p.sh, p.sw, p.ph,
                 p.pw, 0, 0, 0, 0, 0, 0};
  g.Ho = (g.H + 2 * g.ph - g.kh) / g.sh + 1;
  g.Wo = (g.W + 2 * g.pw - g.kw) / g.sw + 1;
  if (x_strides.size() == 4) {
    g.sx0 = x_strides[0];
    g.sx1 = x_strides[1];
    g.sx2 = x_strides[2];
    g.sx3 = x_strides[3];
  }
  return g;
}

#define FORGE_GRID_STRIDE(i, n)                                                                  \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);         \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <class T>
__global__ void __launch_bounds__(kBlockSize)
    conv2d_forward_kernel(const T* __restrict__ x,     // (N, Cin, H, W), strides g.sx*
                          const T* __restrict__ w,     // (Cout, Cin, kh, kw) contiguous
                          const T* __restrict__ bias,  // (Cout), stride sbias, or null
                          int64_t sbias, T* __restrict__ out,  // (N, Cout, Ho, Wo) contiguous
                          ConvGeometry g) {
  using A = acc_t<T>;
  const int64_t total = g.N * g.Cout * g.Ho * g.Wo;
  FORGE_GRID_STRIDE(idx, total) {
    const int64_t ox = idx % g.Wo, oy = (idx / g.Wo) % g.Ho, co = (idx / (g.Wo * g.Ho)) % g.Cout;
    const int64_t n = idx / (g.Wo * g.Ho * g.Cout);
    A acc = 0;
    for (int64_t ci = 0; ci < g.Cin; ++ci) {
      const T* xc = x + n * g.sx0 + ci * g.sx1;
      const T* wc = w + (co * g.Cin + ci) * g.kh * g.kw;
      for (int64_t i = 0; i < g.kh; ++i) {
        const int64_t iy = oy * g.sh - g.ph + i;
        if (iy < 0 || iy >= g.H) continue;
        for (int64_t j = 0; j < g.kw; ++j) {
          const int64_t ix = ox * g.sw - g.pw + j;
          if (ix < 0 || ix >= g.W) continue;
          acc += static_cast<A>(xc[iy * g.sx2 + ix * g.sx3]) * static_cast<A>(wc[i * g.kw + j]);
        }
      }
    }
    if (bias) acc += static_cast<A>(bias[co * sbias]);
    out[idx] = convert<T>(acc);
  }
}

template <class T>
__global__ void __launch_bounds__(kBlockSize)
    conv2d_dx_kernel(const T* __restrict__ dout,  // (N, Cout, Ho, Wo) contiguous
                     const T* __restrict__ w,     // (Cout, Cin, kh, kw) contiguous
                     T* __restrict__ dx,          // (N, Cin, H, W) contiguous
                     ConvGeometry g) {
  using A = acc_t<T>;
  const int64_t total = g.N * g.Cin * g.H * g.W;
  FORGE_GRID_STRIDE(idx, total) {
    const int64_t ix = idx % g.W, iy = (idx / g.W) % g.H, ci = (idx / (g.W * g.H)) % g.Cin;
    const int64_t n = idx / (g.W * g.H * g.Cin);
    A acc = 0;
    for (int64_t co = 0; co < g.Cout; ++co) {
      const T* dn = dout + (n * g.Cout + co) * g.Ho * g.Wo;
      const T* wc = w + (co * g.Cin + ci) * g.kh * g.kw;
      for (int64_t i = 0; i < g.kh; ++i) {
        const int64_t ty = iy + g.ph - i;  // = oy * sh
        if (ty < 0 || ty % g.sh != 0 || ty / g.sh >= g.Ho) continue;
        const int64_t oy = ty / g.sh;
        for (int64_t j = 0; j < g.kw; ++j) {
          const int64_t tx = ix + g.pw - j;  // = ox * sw
          if (tx < 0 || tx % g.sw != 0 || tx / g.sw >= g.Wo) continue;
          acc += static_cast<A>(dn[oy * g.Wo + tx / g.sw]) * static_cast<A>(wc[i * g.kw + j]);
        }
      }
    }
    dx[idx] = convert<T>(acc);
  }
}

// Block b: weight element (co, k) = (b / (K + 1), b % (K + 1)), k = (ci, i, j) row-major; k == K
// is the bias of co. dw / db may each be null (the block then has nothing to do).
template <class T>
__global__ void __launch_bounds__(kBlockSize)
    conv2d_dw_kernel(const T* __restrict__ dout,  // (N, Cout, Ho, Wo) contiguous
                     const T* __restrict__ x,     // (N, Cin, H, W), strides g.sx*; null if dw is
                     T* __restrict__ dw,          // (Cout, Cin, kh, kw) contiguous, or null
                     T* __restrict__ db,          // (Cout), or null
                     ConvGeometry g) {
  __shared__ double part[kBlockSize];
  const int64_t K = g.Cin * g.kh * g.kw, L = g.Ho * g.Wo;
  const int64_t co = blockIdx.x / (K + 1), k = blockIdx.x % (K + 1);
  const bool is_bias = k == K;
  if (is_bias ? db == nullptr : dw == nullptr) return;  // uniform over the block
  const int64_t ci = k / (g.kh * g.kw), i = (k / g.kw) % g.kh, j = k % g.kw;
  double acc = 0;
  for (int64_t m = threadIdx.x; m < g.N * L; m += blockDim.x) {
    const int64_t n = m / L, l = m % L;
    const double d = static_cast<double>(dout[(n * g.Cout + co) * L + l]);
    if (is_bias) {
      acc += d;
    } else {
      const int64_t iy = (l / g.Wo) * g.sh - g.ph + i, ix = (l % g.Wo) * g.sw - g.pw + j;
      if (iy >= 0 && iy < g.H && ix >= 0 && ix < g.W)
        acc += d * static_cast<double>(x[n * g.sx0 + ci * g.sx1 + iy * g.sx2 + ix * g.sx3]);
    }
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kBlockSize / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (is_bias) db[co] = convert<T>(part[0]);
    else dw[co * K + k] = convert<T>(part[0]);
  }
}

struct PoolGeometry {
  int64_t C, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw;
  int64_t s0, s1, s2, s3;  // strides of the strided operand (x forward, dout backward)
};

template <class T>
__global__ void __launch_bounds__(kBlockSize)
    max_pool2d_forward_kernel(const T* __restrict__ x,        // (N, C, H, W), strides g.s*
                              T* __restrict__ out,            // (N, C, Ho, Wo) contiguous
                              int64_t* __restrict__ indices,  // (N, C, Ho, Wo) contiguous
                              int64_t total, PoolGeometry g) {
  using A = acc_t<T>;
  FORGE_GRID_STRIDE(o, total) {
    const int64_t ox = o % g.Wo, oy = (o / g.Wo) % g.Ho, pl = o / (g.Wo * g.Ho);
    const T* xp = x + (pl / g.C) * g.s0 + (pl % g.C) * g.s1;
    const int64_t y0 = oy * g.sh - g.ph, y_lo = y0 > 0 ? y0 : 0, y_hi = y0 + g.kh < g.H ? y0 + g.kh : g.H;
    const int64_t x0 = ox * g.sw - g.pw, x_lo = x0 > 0 ? x0 : 0, x_hi = x0 + g.kw < g.W ? x0 + g.kw : g.W;
    A best = -std::numeric_limits<A>::infinity();
    T best_v = convert<T>(best);
    int64_t at = y_lo * g.W + x_lo;
    bool nan_seen = false;  // NaN is the maximum: the first one wins, stop looking
    for (int64_t iy = y_lo; iy < y_hi && !nan_seen; ++iy)
      for (int64_t ix = x_lo; ix < x_hi && !nan_seen; ++ix) {
        const T v = xp[iy * g.s2 + ix * g.s3];
        const A d = static_cast<A>(v);
        nan_seen = d != d;
        if (d > best || nan_seen) {
          best = d;
          best_v = v;
          at = iy * g.W + ix;
        }
      }
    out[o] = best_v;
    indices[o] = at;
  }
}

template <class T>
__global__ void __launch_bounds__(kBlockSize)
    max_pool2d_backward_kernel(const T* __restrict__ dout,           // (N, C, Ho, Wo), strides g.s*
                               const int64_t* __restrict__ indices,  // (N, C, Ho, Wo) contiguous
                               T* __restrict__ dx,                   // (N, C, H, W) contiguous
                               int64_t total, PoolGeometry g) {
  FORGE_GRID_STRIDE(idx, total) {
    const int64_t ix = idx % g.W, iy = (idx / g.W) % g.H, pl = idx / (g.W * g.H);
    // Windows oy with oy sh - ph <= iy <= oy sh - ph + kh - 1, likewise ox.
    const int64_t ylo_num = iy + g.ph - g.kh + 1, xlo_num = ix + g.pw - g.kw + 1;
    const int64_t oy_lo = ylo_num <= 0 ? 0 : (ylo_num + g.sh - 1) / g.sh;
    const int64_t ox_lo = xlo_num <= 0 ? 0 : (xlo_num + g.sw - 1) / g.sw;
    const int64_t oy_hi = (iy + g.ph) / g.sh < g.Ho - 1 ? (iy + g.ph) / g.sh : g.Ho - 1;
    const int64_t ox_hi = (ix + g.pw) / g.sw < g.Wo - 1 ? (ix + g.pw) / g.sw : g.Wo - 1;
    const int64_t flat = iy * g.W + ix;
    const int64_t* ip = indices + pl * g.Ho * g.Wo;
    const T* gp = dout + (pl / g.C) * g.s0 + (pl % g.C) * g.s1;
    double acc = 0;
    for (int64_t oy = oy_lo; oy <= oy_hi; ++oy)
      for (int64_t ox = ox_lo; ox <= ox_hi; ++ox)
        if (ip[oy * g.Wo + ox] == flat) acc += static_cast<double>(gp[oy * g.s2 + ox * g.s3]);
    dx[idx] = convert<T>(acc);
  }
}

#undef FORGE_GRID_STRIDE

unsigned grid_for_work(int device, int64_t work) {
  const int64_t max_blocks = static_cast<int64_t>(multiprocessor_count(device)) * kBlocksPerSm;
  const int64_t blocks = std::min<int64_t>((work + kBlockSize - 1) / kBlockSize, max_blocks);
  return static_cast<unsigned>(std::max<int64_t>(1, blocks));
}

void check_on(const char* op, const Tensor& ref, std::initializer_list<const Tensor*> ts) {
  FORGE_CHECK(ref.is_cuda(), op, ": expected CUDA tensors, got ", ref.device().str());
  for (const Tensor* t : ts)
    if (t->defined())
      FORGE_CHECK(t->device() == ref.device(), op, ": every operand must be on ", ref.device().str(), ", got one on ",
                  t->device().str(), " of shape ", t->shape());
}

template <class T> const T* cptr(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}
template <class T> T* mptr(const Tensor& t) { return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr; }

}  // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p, Tensor& out) {
  check_on("conv2d", x, {&w, &bias, &out});
  FORGE_CHECK(w.is_contiguous() && out.is_contiguous(), "cuda::conv2d_forward: weight and out must be contiguous");
  FORGE_CHECK(w.dtype() == x.dtype() && out.dtype() == x.dtype() && (!bias.defined() || bias.dtype() == x.dtype()),
              "cuda::conv2d_forward: x, weight, bias and out must share one dtype");
  const ConvGeometry g = geometry(x.shape(), x.strides(), w, p);
  FORGE_CHECK(out.shape() == (Shape{g.N, g.Cout, g.Ho, g.Wo}), "cuda::conv2d_forward: out has shape ", out.shape(),
              ", expected ", Shape{g.N, g.Cout, g.Ho, g.Wo});
  if (out.numel() == 0) return;
  const int device = x.device().index;
  DeviceGuard guard(device);
  dispatch_float(x.dtype(), "conv2d", [&]<class T>() {
    conv2d_forward_kernel<T><<<grid_for_work(device, out.numel()), kBlockSize, 0, current_stream(device)>>>(
        cptr<T>(x), cptr<T>(w), cptr<T>(bias), bias.defined() ? bias.stride(0) : 0, mptr<T>(out), g);
  });
  FORGE_CUDA_LAUNCH_CHECK("conv2d on ", x.device().str(), ": x ", x.shape(), " weight ", w.shape(), " ",
                          dtype_name(x.dtype()));
}

void conv2d_backward(const Tensor& dout, const Tensor& x, const Shape& x_shape, const Tensor& w, const Conv2dParams& p,
                     Tensor& dx, Tensor& dw, Tensor& db) {
  check_on("conv2d_backward", dout, {&x, &w, &dx, &dw, &db});
  FORGE_CHECK(dout.is_contiguous() && w.is_contiguous(), "cuda::conv2d_backward: dout and weight must be contiguous");
  for (const Tensor* t : {&dx, &dw, &db})
    FORGE_CHECK(!t->defined() || (t->is_contiguous() && t->dtype() == dout.dtype()),
                "cuda::conv2d_backward: gradients must be contiguous, of dout's dtype");
  FORGE_CHECK(x_shape.size() == 4 && (!dw.defined() || (x.defined() && x.shape() == x_shape)),
              "cuda::conv2d_backward: dw needs the forward input x of shape ", x_shape);
  const ConvGeometry g = geometry(x_shape, x.defined() ? x.strides() : Strides{}, w, p);
  if (g.N * g.Cout * g.Ho * g.Wo == 0) {  // no output element: every gradient is zero
    for (Tensor* t : {&dx, &dw, &db})
      if (t->defined()) fill(*t, 0.0);
    return;
  }
  const int device = dout.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  dispatch_float(dout.dtype(), "conv2d_backward", [&]<class T>() {
    if (dx.defined() && dx.numel() > 0) {
      conv2d_dx_kernel<T><<<grid_for_work(device, dx.numel()), kBlockSize, 0, stream>>>(cptr<T>(dout), cptr<T>(w),
                                                                                       mptr<T>(dx), g);
      FORGE_CUDA_LAUNCH_CHECK("conv2d_backward (dx) on ", dout.device().str(), ": x ", x_shape, " weight ", w.shape(),
                              " ", dtype_name(dout.dtype()));
    }
    if (dw.defined() || db.defined()) {
      const int64_t blocks = g.Cout * (g.Cin * g.kh * g.kw + 1);
      FORGE_CHECK(blocks <= std::numeric_limits<int>::max(), "conv2d_backward: weight ", w.shape(), " too large");
      conv2d_dw_kernel<T><<<static_cast<unsigned>(blocks), kBlockSize, 0, stream>>>(
          cptr<T>(dout), dw.defined() ? cptr<T>(x) : nullptr, mptr<T>(dw), mptr<T>(db), g);
      FORGE_CUDA_LAUNCH_CHECK("conv2d_backward (dw, db) on ", dout.device().str(), ": x ", x_shape, " weight ",
                              w.shape(), " ", dtype_name(dout.dtype()));
    }
  });
}

void max_pool2d_forward(const Tensor& x, const Pool2dParams& p, Tensor& out, Tensor& indices) {
  check_on("max_pool2d", x, {&out, &indices});
  FORGE_CHECK(out.is_contiguous() && indices.is_contiguous() && indices.dtype() == DType::i64 &&
                  indices.shape() == out.shape() && out.dtype() == x.dtype(),
              "cuda::max_pool2d_forward: out (x's dtype) and indices (i64) must be contiguous and of one shape");
  if (out.numel() == 0) return;
  const PoolGeometry g{x.size(1), x.size(2), x.size(3), out.size(2), out.size(3), p.kh, p.kw, p.sh, p.sw,
                       p.ph,      p.pw,      x.stride(0), x.stride(1), x.stride(2), x.stride(3)};
  const int device = x.device().index;
  DeviceGuard guard(device);
  dispatch_float(x.dtype(), "max_pool2d", [&]<class T>() {
    max_pool2d_forward_kernel<T><<<grid_for_work(device, out.numel()), kBlockSize, 0, current_stream(device)>>>(
        cptr<T>(x), mptr<T>(out), mptr<int64_t>(indices), out.numel(), g);
  });
  FORGE_CUDA_LAUNCH_CHECK("max_pool2d on ", x.device().str(), ": x ", x.shape(), " ", dtype_name(x.dtype()));
}

void max_pool2d_backward(const Tensor& dout, const Tensor& indices, const Pool2dParams& p, Tensor& dx) {
  check_on("max_pool2d_backward", dout, {&indices, &dx});
  FORGE_CHECK(dx.is_contiguous() && indices.is_contiguous() && indices.shape() == dout.shape() &&
                  indices.dtype() == DType::i64 && dx.dtype() == dout.dtype() && dx.dim() == 4 && dout.dim() == 4,
              "cuda::max_pool2d_backward: dx (N, C, H, W) and indices must be contiguous, indices i64 of dout's shape");
  if (dx.numel() == 0) return;
  if (dout.numel() == 0) {
    fill(dx, 0.0);
    return;
  }
  const PoolGeometry g{dx.size(1), dx.size(2), dx.size(3), dout.size(2), dout.size(3), p.kh, p.kw, p.sh, p.sw,
                       p.ph,       p.pw,       dout.stride(0), dout.stride(1), dout.stride(2), dout.stride(3)};
  const int device = dout.device().index;
  DeviceGuard guard(device);
  dispatch_float(dout.dtype(), "max_pool2d_backward", [&]<class T>() {
    max_pool2d_backward_kernel<T><<<grid_for_work(device, dx.numel()), kBlockSize, 0, current_stream(device)>>>(
        cptr<T>(dout), cptr<int64_t>(indices), mptr<T>(dx), dx.numel(), g);
  });
  FORGE_CUDA_LAUNCH_CHECK("max_pool2d_backward on ", dout.device().str(), ": dout ", dout.shape(), " dx ", dx.shape(),
                          " ", dtype_name(dout.dtype()));
}

}  // namespace forge::cuda
