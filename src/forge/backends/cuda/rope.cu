// CUDA rotary position embedding, the counterpart of backends/cpu/rope.cpp.
//
// Math (HF "rotate_half" layout; x, out (B, H, T, D), h = D / 2, i in [0, h)):
//   freq_i   = theta^(-2i / D)                          (f64, the CPU's expression:
//              fn::rope_frequency, llama3 `scaling` included)
//   angle_ti = (position_offset + t) * freq_i           (f64)
//   out[..., t, i]     = x[..., t, i] cos(angle_ti) - x[..., t, i + h] sin(angle_ti)
//   out[..., t, i + h] = x[..., t, i + h] cos(angle_ti) + x[..., t, i] sin(angle_ti)
// inverse = true rotates by -angle_ti (the backward: dx = rope^-1(dout)).
//
// Memory contract: x is read through its strides (any, no copy); out is written through its
// strides (unit stride in the last dim: the ops layer gives it x's memory order) and
// overwritten; the (T, h) cos and sin tables in acc_t<T>: kept for position 0 (Note [rope
// table cache]), else scratch freed on return (stream-ordered).
//
// Note [CUDA rope precision]: the CPU computes cos/sin in f64. Here the angle is formed in
// f64 exactly as the CPU forms it, reduced in f64 to r = angle - 2 pi k with |r| <= pi (one
// fused multiply-add, error ~1e-16 * angle), and only then handed to sincosf in f32. Positions of
// 10^5 radians and more therefore keep full f32 accuracy (an f32 angle would be off by ~1e-2 at
// such positions), while the expensive f64 sin/cos is avoided; the rotation itself runs in
// acc_t<T> (f32 for bf16/f16/f32) and is rounded to T once. f64 inputs use f64 sincos.
//
// Note [rope cos/sin table]: cos and sin depend on (t, i) only, so a first kernel computes them
// once into (T, h) tables (T h sincos, f64 angles: about 130k for LLaMA's T = 2048, h = 64) and
// the rotation reads them: the first version evaluated them per (b, head, t, i), B x heads times
// over (128x for the 0.85B LLaMA's q at batch 4), with four 64-bit divisions per item; a profile
// on an H200 had it at 3.6 ms per step (64 calls), six times its memory bound. The values are
// the same bits as before (the same f64 angle, the same reduction, the same sincosf).
// Layout: one thread per V consecutive pairs (i .. i + V - 1, and their partners i + h ..) of
// one (b, h, t) row, a grid-stride loop over rows x h / V, 32-bit item arithmetic when it fits. V = 16 / sizeof(T) (16-byte loads
// and stores of both halves) when x's last dim is contiguous, h % V == 0 and every row start
// of x and out is 16-byte aligned; otherwise V = 1 (strided scalar loads, still coalesced
// when x's last dim is contiguous).
#include "forge/backends/cuda/rope.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "forge/backends/cuda/graph.h"
#include "forge/backends/cuda/loops.cuh"
#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"
#include "forge/core/env.h"

namespace forge::cuda {
namespace {

constexpr double kTwoPi = 6.283185307179586476925286766559;
constexpr double kInvTwoPi = 0.15915494309189533576888376337251;

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

// The (len, half) tables of cos and sin of (position_offset + t) freq_i, in the rotation's type.
template <class A>
__global__ void __launch_bounds__(kBlockSize)
    rope_table_kernel(A* __restrict__ cos_t, A* __restrict__ sin_t, int64_t len, int64_t half, int64_t D,
                      double theta, fn::RopeScaling scaling, int64_t position_offset) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= len * half) return;
  const int64_t t = k / half, i = k - t * half;
  const double angle = static_cast<double>(position_offset + t) * fn::rope_frequency(i, D, theta, scaling);
  cos_sin<A>(angle, cos_t[k], sin_t[k]);
}

// The table row of row t of batch row b: t itself, or its position from `pos` ((B, len) i64,
// Note [packed positions] in ops/rope.h), clamped into [0, pos_limit) so that a bad position reads
// a wrong angle rather than memory past the table (the ops layer builds the positions itself).
__device__ __forceinline__ int64_t table_row(const int64_t* pos, int64_t pos_limit, int64_t b, int64_t len,
                                             int64_t t) {
  if (pos == nullptr) return t;
  const int64_t p = pos[b * len + t];
  return p < 0 ? 0 : (p >= pos_limit ? pos_limit - 1 : p);
}

// The rotation of one item's V pairs (x1[j], x2[j]) by the angles whose cos and sin are c and sn:
// rope_plane_kernel's; rope_kernel writes the same arithmetic out inline (the same bits).
template <class T, int V>
__device__ __forceinline__ void rotate(const Vec<T, V>& x1, const Vec<T, V>& x2, const acc_t<T> (&c)[V],
                                       const acc_t<T> (&sn)[V], bool inverse, Vec<T, V>& o1, Vec<T, V>& o2) {
  using A = acc_t<T>;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const A s = inverse ? -sn[j] : sn[j];
    const A a1 = static_cast<A>(x1.v[j]), a2 = static_cast<A>(x2.v[j]);
    o1.v[j] = convert<T>(a1 * c[j] - a2 * s);
    o2.v[j] = convert<T>(a2 * c[j] + a1 * s);
  }
}

// I: the index type of the item arithmetic (uint32_t where everything fits: 64-bit division
// costs a GPU tens of instructions more, and this kernel does four per item).
template <class T, int V, class I>
__global__ void __launch_bounds__(kBlockSize)
    rope_kernel(const T* __restrict__ x,                // (B, H, T, D), strides (sb, sh, st, sd)
                T* __restrict__ out,                    // (B, H, T, D), strides (ob, oh, ot, 1)
                const acc_t<T>* __restrict__ cos_t,     // (T, D / 2)
                const acc_t<T>* __restrict__ sin_t,     // (T, D / 2)
                I H, I len, I half, int64_t sb, int64_t sh, int64_t st, int64_t sd, int64_t ob, int64_t oh,
                int64_t ot, I items, bool inverse, const int64_t* __restrict__ pos, int64_t pos_limit) {
  using A = acc_t<T>;
  using P = Vec<T, V>;
  const I groups = half / V;  // items per row
  const I step = static_cast<I>(gridDim.x) * blockDim.x;
  for (I it = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; it < items; it += step) {
    const I r = it / groups;  // row (b, h, t)
    const I i0 = (it - r * groups) * V;
    const I bh = r / len, t = r - bh * len;
    const I b = bh / H, h = bh - b * H;
    const T* xr = x + static_cast<int64_t>(b) * sb + static_cast<int64_t>(h) * sh + static_cast<int64_t>(t) * st;
    T* orow = out + static_cast<int64_t>(b) * ob + static_cast<int64_t>(h) * oh + static_cast<int64_t>(t) * ot;
    P x1, x2;
    if constexpr (V > 1) {  // sd == 1
      x1 = *reinterpret_cast<const P*>(xr + i0);
      x2 = *reinterpret_cast<const P*>(xr + half + i0);
    } else {
      x1.v[0] = xr[static_cast<int64_t>(i0) * sd];
      x2.v[0] = xr[static_cast<int64_t>(i0 + half) * sd];
    }
    const int64_t tp = table_row(pos, pos_limit, b, len, t);
    const A* cr = cos_t + tp * half + i0;
    const A* sr = sin_t + tp * half + i0;
    P o1, o2;
#pragma unroll
    for (int j = 0; j < V; ++j) {  // rotate()'s arithmetic, written out: this kernel keeps its registers
      const A c = cr[j], s = inverse ? -sr[j] : sr[j];
      const A a1 = static_cast<A>(x1.v[j]), a2 = static_cast<A>(x2.v[j]);
      o1.v[j] = convert<T>(a1 * c - a2 * s);
      o2.v[j] = convert<T>(a2 * c + a1 * s);
    }
    *reinterpret_cast<P*>(orow + i0) = o1;
    *reinterpret_cast<P*>(orow + half + i0) = o2;
  }
}

// Note [rope planes] (FORGE_ROPE_PLANES=1, the default): a 2-D grid, blockIdx.y the (b, h) plane
// and x the (t, group) items of that plane, one item a thread and no grid-stride loop. An H200
// profile (ncu, docs/performance.md item 26) had rope_kernel's q rotation at 27.7 us for 67 MB,
// DRAM 35% busy, 30 cycles between a warp's instructions: each item did three runtime divisions
// before its loads, and a capped grid walked four items a thread one after another. Here the
// plane's b and h come from blockIdx.y once, an item costs one 32-bit division (by the groups of a
// row), and the table rows are read as 16-byte vectors (a row of V values starts at a multiple of
// V). The item math is rotate(): the same bits as rope_kernel. 40 registers (ptxas, sm_90a; 75%
// occupancy: held to 32 for a full SM it spills). Vector rows only (V > 1, f32/bf16/f16); planes up
// to gridDim.y's 65535.
template <class T, int V>
__global__ void __launch_bounds__(kBlockSize)
    rope_plane_kernel(const T* __restrict__ x, T* __restrict__ out, const float* __restrict__ cos_t,
                      const float* __restrict__ sin_t, uint32_t H, uint32_t len, uint32_t half, int64_t sb,
                      int64_t sh, int64_t st, int64_t ob, int64_t oh, int64_t ot, bool inverse,
                      const int64_t* __restrict__ pos, int64_t pos_limit) {
  static_assert(V % 4 == 0 && std::is_same_v<acc_t<T>, float>);
  using P = Vec<T, V>;
  const uint32_t groups = half / V;
  const uint32_t it = blockIdx.x * blockDim.x + threadIdx.x;
  if (it >= len * groups) return;
  const uint32_t t = it / groups, i0 = (it - t * groups) * V;
  const uint32_t b = blockIdx.y / H, h = blockIdx.y - b * H;
  const T* xr = x + static_cast<int64_t>(b) * sb + static_cast<int64_t>(h) * sh + static_cast<int64_t>(t) * st;
  T* orow = out + static_cast<int64_t>(b) * ob + static_cast<int64_t>(h) * oh + static_cast<int64_t>(t) * ot;
  const P x1 = *reinterpret_cast<const P*>(xr + i0);
  const P x2 = *reinterpret_cast<const P*>(xr + half + i0);
  const int64_t tab = table_row(pos, pos_limit, b, len, t) * half + i0;
  float c[V], sn[V];
#pragma unroll
  for (int j = 0; j < V; j += 4) {
    const float4 cv = *reinterpret_cast<const float4*>(cos_t + tab + j);
    const float4 sv = *reinterpret_cast<const float4*>(sin_t + tab + j);
    c[j] = cv.x, c[j + 1] = cv.y, c[j + 2] = cv.z, c[j + 3] = cv.w;
    sn[j] = sv.x, sn[j + 1] = sv.y, sn[j + 2] = sv.z, sn[j + 3] = sv.w;
  }
  P o1, o2;
  rotate<T, V>(x1, x2, c, sn, inverse, o1, o2);
  *reinterpret_cast<P*>(orow + i0) = o1;
  *reinterpret_cast<P*>(orow + half + i0) = o2;
}

Tensor scratch(int device, const Shape& shape, DType dtype) {
  auto storage = std::make_shared<Storage>(checked_nbytes(shape, element_size(dtype)),
                                           allocator(device));
  return Tensor::make(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

// Note [rope table cache]: training calls rope with the same (T, D, theta, scaling) and
// position 0 for q and k of every layer, forward and backward (64 calls a 0.85B-LLaMA step),
// and the table kernel ran each time: 2.6 us plus a launch gap per call, ~0.25 ms a step. Tables
// for position_offset 0 are now kept per (device, T, D, theta, scaling, dtype), made once outside
// any CUDA graph capture and synchronised before first use (so any stream may read them: a
// one-time host wait per shape), and never freed (a few MB at most; the map is intentionally
// leaked so that no CUDA call runs at process exit). Decoding's position offsets (a new one per
// token) and a first call during a capture compute a scratch table as before.
struct TableKey {
  int device;
  int64_t len, D;
  double theta;
  fn::RopeScaling scaling;
  DType dtype;
  bool operator<(const TableKey& o) const {
    return std::tie(device, len, D, theta, scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor,
                    scaling.original_context, dtype) < std::tie(o.device, o.len, o.D, o.theta, o.scaling.factor,
                                                                o.scaling.low_freq_factor, o.scaling.high_freq_factor,
                                                                o.scaling.original_context, o.dtype);
  }
};

std::mutex g_tables_mu;
std::map<TableKey, std::pair<Tensor, Tensor>>& tables() {
  static auto* m = new std::map<TableKey, std::pair<Tensor, Tensor>>();  // leaked on purpose (Note above)
  return *m;
}

// The (len, half) cos and sin tables of a call: cached for position 0 outside captures.
template <class A>
std::pair<Tensor, Tensor> rope_tables(int device, cudaStream_t stream, int64_t len, int64_t D, double theta,
                                      const fn::RopeScaling& scaling, int64_t position_offset) {
  const int64_t half = D / 2;
  const DType table_dtype = std::is_same_v<A, double> ? DType::f64 : DType::f32;
  auto make = [&] {
    std::pair<Tensor, Tensor> t{scratch(device, {len, half}, table_dtype), scratch(device, {len, half}, table_dtype)};
    rope_table_kernel<A><<<static_cast<unsigned>((len * half + kBlockSize - 1) / kBlockSize), kBlockSize, 0, stream>>>(
        static_cast<A*>(t.first.data_ptr()), static_cast<A*>(t.second.data_ptr()), len, half, D, theta, scaling,
        position_offset);
    FORGE_CUDA_LAUNCH_CHECK("rope (cos/sin table) on cuda:", device, ": T = ", len, ", D = ", D);
    return t;
  };
  if (position_offset != 0) return make();
  const TableKey key{device, len, D, theta, scaling, table_dtype};
  std::lock_guard<std::mutex> lock(g_tables_mu);
  if (auto it = tables().find(key); it != tables().end()) return it->second;
  if (is_capturing(device)) return make();  // a table made inside a capture would live in its pool
  auto t = make();
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));  // once per shape: then every stream may read it
  tables().emplace(key, t);
  return t;
}

}  // namespace

void rope(const Tensor& x, Tensor& out, int64_t position_offset, double theta, const fn::RopeScaling& scaling,
          bool inverse, const Tensor& positions, int64_t position_limit) {
  FORGE_CHECK(x.dim() == 4 && out.shape() == x.shape() && out.dtype() == x.dtype() &&
                  (out.size(3) <= 1 || out.stride(3) == 1) && x.size(3) % 2 == 0,
              "cuda::rope: expected x (B, H, T, D) with D even and an output of its shape with unit stride in the "
              "last dim, got ", x.shape(), " -> ", out.shape(), " strides ", out.strides());
  FORGE_CHECK(x.is_cuda() && out.device() == x.device(), "cuda::rope: x and out must be on one CUDA device, got ",
              x.device().str(), " and ", out.device().str());
  const int64_t* pos = nullptr;
  int64_t table_len = x.size(2);
  if (positions.defined()) {
    FORGE_CHECK(positions.dtype() == DType::i64 && positions.is_contiguous() && positions.device() == x.device() &&
                    positions.shape() == Shape({x.size(0), x.size(2)}) && position_limit > 0,
                "cuda::rope: positions must be contiguous i64 (B, T) = (", x.size(0), ", ", x.size(2), ") on ",
                x.device().str(), " below a positive limit, got ", positions.shape(), " on ",
                positions.device().str(), " and limit ", position_limit);
    pos = positions.data<int64_t>();
    table_len = position_limit;
    position_offset = 0;
  }
  if (x.numel() == 0) return;
  const int device = x.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  const int64_t H = x.size(1), len = x.size(2), D = x.size(3), half = D / 2;
  const int64_t rows = x.size(0) * H * len;

  // Strides of size-1 dims never move the pointer: count them as 0.
  int64_t s[4];
  int64_t o[4];
  for (int d = 0; d < 4; ++d) s[d] = x.size(d) == 1 ? 0 : x.stride(d);
  for (int d = 0; d < 4; ++d) o[d] = out.size(d) == 1 ? 0 : out.stride(d);
  const int64_t max_blocks = static_cast<int64_t>(multiprocessor_count(device)) * kBlocksPerSm;
  dispatch_float(x.dtype(), "rope", [&]<class T>() {
    using A = acc_t<T>;
    const auto [cos_t, sin_t] = rope_tables<A>(device, stream, table_len, D, theta, scaling, position_offset);
    auto launch = [&]<int V>() {
      const int64_t items = rows * (half / V);
      const auto blocks = static_cast<unsigned>(std::min<int64_t>((items + kBlockSize - 1) / kBlockSize, max_blocks));
      const auto* ct = static_cast<const A*>(cos_t.data_ptr());
      const auto* st = static_cast<const A*>(sin_t.data_ptr());
      // 32-bit item arithmetic when every index fits (the grid-stride sum too).
      if (items + static_cast<int64_t>(blocks) * kBlockSize < (int64_t{1} << 32))
        rope_kernel<T, V, uint32_t><<<blocks, kBlockSize, 0, stream>>>(
            static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()), ct, st, static_cast<uint32_t>(H),
            static_cast<uint32_t>(len), static_cast<uint32_t>(half), s[0], s[1], s[2], s[3], o[0], o[1], o[2],
            static_cast<uint32_t>(items), inverse, pos, table_len);
      else
        rope_kernel<T, V, int64_t><<<blocks, kBlockSize, 0, stream>>>(
            static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()), ct, st, H, len, half, s[0], s[1],
            s[2], s[3], o[0], o[1], o[2], items, inverse, pos, table_len);
    };
    if constexpr (std::is_same_v<T, double>) {
      launch.template operator()<1>();
    } else {
      constexpr int V = 16 / static_cast<int>(sizeof(T));
      const bool vec = s[3] == 1 && half % V == 0 && s[0] % V == 0 && s[1] % V == 0 &&
                       s[2] % V == 0 && o[0] % V == 0 && o[1] % V == 0 && o[2] % V == 0 &&
                       reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0;
      const int64_t planes = x.size(0) * H, plane_items = len * (half / V);
      if (vec && env::flag("FORGE_ROPE_PLANES") && planes <= 65535 && plane_items < (int64_t{1} << 31) &&
          x.size(0) < (int64_t{1} << 31)) {
        const dim3 grid(static_cast<unsigned>((plane_items + kBlockSize - 1) / kBlockSize), static_cast<unsigned>(planes));
        rope_plane_kernel<T, V><<<grid, kBlockSize, 0, stream>>>(
            static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()),
            static_cast<const float*>(cos_t.data_ptr()), static_cast<const float*>(sin_t.data_ptr()),
            static_cast<uint32_t>(H), static_cast<uint32_t>(len), static_cast<uint32_t>(half), s[0], s[1], s[2], o[0],
            o[1], o[2], inverse, pos, table_len);
      } else if (vec) {
        launch.template operator()<V>();
      } else {
        launch.template operator()<1>();
      }
    }
  });
  FORGE_CUDA_LAUNCH_CHECK("rope on ", x.device().str(), ": x ", x.shape(), " strides ", x.strides(), " ",
                          dtype_name(x.dtype()), inverse ? " (inverse)" : "");
}

}  // namespace forge::cuda
