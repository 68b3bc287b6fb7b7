// CUDA rotary position embedding, the counterpart of backends/cpu/rope.cpp.
//
// Math (HF "rotate_half" layout; x, out (B, H, T, D), h = D / 2, i in [0, h)):
//   freq_i   = theta^(-2i / D)                          (f64, the CPU's expression:
//              ops::rope_frequency, llama3 `scaling` included)
//   angle_ti = (position_offset + t) * freq_i           (f64)
//   out[..., t, i]     = x[..., t, i] cos(angle_ti) - x[..., t, i + h] sin(angle_ti)
//   out[..., t, i + h] = x[..., t, i + h] cos(angle_ti) + x[..., t, i] sin(angle_ti)
// inverse = true rotates by -angle_ti (the backward: dx = rope^-1(dout)).
//
// Memory contract: x is read through its strides (any, no copy); out is written through its
// strides (unit stride in the last dim: the ops layer gives it x's memory order) and
// overwritten; scratch: the (h) f64 frequency table, freed on return (stream-ordered).
//
// Note [CUDA rope precision]: the CPU computes cos/sin in f64. Here the angle is formed in
// f64 exactly as the CPU forms it, reduced in f64 to r = angle - 2 pi k with |r| <= pi (one
// fused multiply-add, error ~1e-16 * angle), and only then handed to sincosf in f32. Positions of
// 10^5 radians and more therefore keep full f32 accuracy (an f32 angle would be off by ~1e-2 at
// such positions), while the expensive f64 sin/cos is avoided; the rotation itself runs in
// acc_t<T> (f32 for bf16/f16/f32) and is rounded to T once. f64 inputs use f64 sincos.
//
// Layout: one thread per V consecutive pairs (i .. i + V - 1, and their partners i + h ..) of
// one (b, h, t) row, a grid-stride loop over rows x h / V. V = 16 / sizeof(T) (16-byte loads
// and stores of both halves) when x's last dim is contiguous, h % V == 0 and every row start
// of x and out is 16-byte aligned; otherwise V = 1 (strided scalar loads, still coalesced
// when x's last dim is contiguous).
#include "forge/backends/cuda/rope.h"

#include <algorithm>
#include <memory>
#include <type_traits>

#include "forge/backends/cuda/loops.cuh"
#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cuda {
namespace {

constexpr double kTwoPi = 6.283185307179586476925286766559;
constexpr double kInvTwoPi = 0.15915494309189533576888376337251;

__global__ void __launch_bounds__(kBlockSize) rope_freq_kernel(double* __restrict__ freq,  // (half)
                                                               int64_t half, int64_t D, double theta,
                                                               ops::RopeScaling scaling) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < half) freq[i] = ops::rope_frequency(i, D, theta, scaling);
}

// cos and sin of `angle` (Note [CUDA rope precision]).
template <class A> __device__ __forceinline__ void cos_sin(double angle, A& c, A& s) {
  if constexpr (std::is_same_v<A, double>) {
    sincos(angle, &s, &c);
  } else {
    const double k = rint(angle * kInvTwoPi);
    const float r = static_cast<float>(__fma_rn(-k, kTwoPi, angle));
    sincosf(r, &s, &c);
  }
}

template <class T, int V>
__global__ void __launch_bounds__(kBlockSize)
    rope_kernel(const T* __restrict__ x,          // (B, H, T, D), strides (sb, sh, st, sd)
                T* __restrict__ out,              // (B, H, T, D), strides (ob, oh, ot, 1)
                const double* __restrict__ freq,  // (D / 2)
                int64_t H, int64_t len, int64_t half, int64_t sb, int64_t sh, int64_t st, int64_t sd,
                int64_t ob, int64_t oh, int64_t ot, int64_t position_offset, int64_t items, bool inverse) {
  using A = acc_t<T>;
  using P = Vec<T, V>;
  const int64_t groups = half / V;  // items per row
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < items; it += step) {
    const int64_t r = it / groups;  // row (b, h, t)
    const int64_t i0 = (it - r * groups) * V;
    const int64_t t = r % len, bh = r / len;
    const T* xr = x + (bh / H) * sb + (bh % H) * sh + t * st;
    T* orow = out + (bh / H) * ob + (bh % H) * oh + t * ot;
    P x1, x2;
    if constexpr (V > 1) {  // sd == 1
      x1 = *reinterpret_cast<const P*>(xr + i0);
      x2 = *reinterpret_cast<const P*>(xr + half + i0);
    } else {
      x1.v[0] = xr[i0 * sd];
      x2.v[0] = xr[(i0 + half) * sd];
    }
    const double pos = static_cast<double>(position_offset + t);
    P o1, o2;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      A c, s;
      cos_sin<A>(pos * freq[i0 + j], c, s);
      if (inverse) s = -s;
      const A a1 = static_cast<A>(x1.v[j]), a2 = static_cast<A>(x2.v[j]);
      o1.v[j] = convert<T>(a1 * c - a2 * s);
      o2.v[j] = convert<T>(a2 * c + a1 * s);
    }
    *reinterpret_cast<P*>(orow + i0) = o1;
    *reinterpret_cast<P*>(orow + half + i0) = o2;
  }
}

Tensor scratch(int device, const Shape& shape, DType dtype) {
  auto storage = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * element_size(dtype),
                                           allocator(device));
  return Tensor::make(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

}  // namespace

void rope(const Tensor& x, Tensor& out, int64_t position_offset, double theta, const ops::RopeScaling& scaling,
          bool inverse) {
  FORGE_CHECK(x.dim() == 4 && out.shape() == x.shape() && out.dtype() == x.dtype() &&
                  (out.size(3) <= 1 || out.stride(3) == 1) && x.size(3) % 2 == 0,
              "cuda::rope: expected x (B, H, T, D) with D even and an output of its shape with unit stride in the "
              "last dim, got ", x.shape(), " -> ", out.shape(), " strides ", out.strides());
  FORGE_CHECK(x.is_cuda() && out.device() == x.device(), "cuda::rope: x and out must be on one CUDA device, got ",
              x.device().str(), " and ", out.device().str());
  if (x.numel() == 0) return;
  const int device = x.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  const int64_t H = x.size(1), len = x.size(2), D = x.size(3), half = D / 2;
  const int64_t rows = x.size(0) * H * len;

  Tensor freq = scratch(device, {half}, DType::f64);
  rope_freq_kernel<<<static_cast<unsigned>((half + kBlockSize - 1) / kBlockSize), kBlockSize, 0, stream>>>(
      static_cast<double*>(freq.data_ptr()), half, D, theta, scaling);
  FORGE_CUDA_LAUNCH_CHECK("rope (frequencies) on ", x.device().str(), ": D = ", D);

  // Strides of size-1 dims never move the pointer: count them as 0.
  int64_t s[4];
  int64_t o[4];
  for (int d = 0; d < 4; ++d) s[d] = x.size(d) == 1 ? 0 : x.stride(d);
  for (int d = 0; d < 4; ++d) o[d] = out.size(d) == 1 ? 0 : out.stride(d);
  const int64_t max_blocks = static_cast<int64_t>(multiprocessor_count(device)) * kBlocksPerSm;
  dispatch_float(x.dtype(), "rope", [&]<class T>() {
    auto launch = [&]<int V>() {
      const int64_t items = rows * (half / V);
      const auto blocks = static_cast<unsigned>(std::min<int64_t>((items + kBlockSize - 1) / kBlockSize, max_blocks));
      rope_kernel<T, V><<<blocks, kBlockSize, 0, stream>>>(static_cast<const T*>(x.data_ptr()),
                                                           static_cast<T*>(out.data_ptr()),
                                                           static_cast<const double*>(freq.data_ptr()), H, len, half,
                                                           s[0], s[1], s[2], s[3], o[0], o[1], o[2], position_offset,
                                                           items, inverse);
    };
    if constexpr (std::is_same_v<T, double>) {
      launch.template operator()<1>();
    } else {
      constexpr int V = 16 / static_cast<int>(sizeof(T));
      const bool vec = s[3] == 1 && half % V == 0 && s[0] % V == 0 && s[1] % V == 0 &&
                       s[2] % V == 0 && o[0] % V == 0 && o[1] % V == 0 && o[2] % V == 0 &&
                       reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0;
      if (vec) launch.template operator()<V>();
      else launch.template operator()<1>();
    }
  });
  FORGE_CUDA_LAUNCH_CHECK("rope on ", x.device().str(), ": x ", x.shape(), " strides ", x.strides(), " ",
                          dtype_name(x.dtype()), inverse ? " (inverse)" : "");
}

}  // namespace forge::cuda
