#pragma once
// Internal to the CUDA norm kernels (norm.cu, norm_wide.cu; Note [CUDA norm kernels] in
// norm.cu): the device helpers both use, and the launcher of the wide-row backward.
#include <cuda_runtime.h>

#include <cstdint>

#include "forge/backends/cuda/loops.cuh"
#include "forge/core/convert.h"
#include "forge/core/dtype.h"

namespace forge::cuda::norm_detail {

inline constexpr int kWarpSize = 32;

// Sum over the warp by an xor butterfly: every lane ends with the same bits.
template <class A> __device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class T, int V>
__device__ __forceinline__ Vec<T, V> load_vec(const T* base, int64_t vi) {  // base: (nvec * V)
  return reinterpret_cast<const Vec<T, V>*>(base)[vi];
}

template <class T, int V> __device__ __forceinline__ void store_vec(T* base, int64_t vi, const Vec<T, V>& v) {
  reinterpret_cast<Vec<T, V>*>(base)[vi] = v;
}

// Forward read of vector vi of a row: x, or (kResidual) h = x + residual, rounded as ops::add
// rounds it and stored.
template <class T, int V, bool kResidual>
__device__ __forceinline__ Vec<T, V> read_input(const T* xr, const T* rr, T* hr, int64_t vi) {
  if constexpr (kResidual) {
    using A = acc_t<T>;
    const Vec<T, V> a = load_vec<T, V>(xr, vi), b = load_vec<T, V>(rr, vi);
    Vec<T, V> s;
#pragma unroll
    for (int j = 0; j < V; ++j) s.v[j] = convert<T>(static_cast<A>(a.v[j]) + static_cast<A>(b.v[j]));
    store_vec<T, V>(hr, vi, s);
    return s;
  } else {
    return load_vec<T, V>(xr, vi);
  }
}

// (v - mu) * rs * w + b in the CPU kernel's order of operations, rounded to T once (w, b: the
// weight's and bias's vectors, used when has_w / has_b).
template <class T, int V>
__device__ __forceinline__ Vec<T, V> normalized(const Vec<T, V>& v, acc_t<T> mu, acc_t<T> rs, const Vec<T, V>& w,
                                                bool has_w, const Vec<T, V>& b, bool has_b) {
  using A = acc_t<T>;
  Vec<T, V> o;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    A t = (static_cast<A>(v.v[j]) - mu) * rs;
    if (has_w) t *= static_cast<A>(w.v[j]);
    if (has_b) t += static_cast<A>(b.v[j]);
    o.v[j] = convert<T>(t);
  }
  return o;
}

// The wide-row backward: a block per row, one 16-byte vector of the row per thread, so rows
// of up to kWideMaxVecs vectors (bf16/f16: 8192 columns, f32: 4096).
inline constexpr int64_t kWideMaxVecs = 1024;

// Threads of a block for rows of nvec vectors: the smallest of 128, 256, 512 and 1024 that
// covers the row (128: GPT-2's 768 bf16 columns, 96 vectors).
inline int wide_threads(int64_t nvec) { return nvec <= 128 ? 128 : nvec <= 256 ? 256 : nvec <= 512 ? 512 : 1024; }

// The block sizes of the wide-row kernels: calls launch.template operator()<kThreads, kRms>()
// with kThreads = wide_threads(nvec) (kMinThreads and up: the forward, for rows wider than the
// warp kernel's 1024 columns, never needs 128) and kRms = rms.
template <int kMinThreads = 128, class Launch>
void dispatch_wide(bool rms, int64_t nvec, const Launch& launch) {
  auto pick = [&]<bool kRms>() {
    switch (wide_threads(nvec)) {
      case 128:
        if constexpr (kMinThreads <= 128) launch.template operator()<128, kRms>();
        break;
      case 256: launch.template operator()<256, kRms>(); break;
      case 512: launch.template operator()<512, kRms>(); break;
      default: launch.template operator()<1024, kRms>(); break;
    }
  };
  if (rms) pick.template operator()<true>();
  else pick.template operator()<false>();
}

// Rows of at least this many vectors (and at most kWideMaxVecs) take the block-per-row backward;
// narrower ones stay with norm.cu's warp-per-row kernel (a block of 128 threads would idle most
// of its lanes). FORGE_NORM_BLOCK_ROWS=0 keeps every row of up to 1024 columns on the warp kernel.
inline constexpr int64_t kBlockRowMinVecs = 64;

// Blocks of the grid, each writing one partial row of column sums: P = min(R, 1024) for
// 128-thread blocks, min(R, 512) for 256-thread blocks, min(R, 256) for wider ones, at most
// max_parts. A function of R and C alone, so the sums are the same bits on every run and GPU.
// At 8, 4, 2 and 1 resident blocks an SM (128, 256, 512, 1024 threads, <= 64 registers) that is
// about one wave of blocks on a 132-SM H100 / H200 (two for 1024 threads), which measured best
// on an H200 at R = 8192 and 16384 for the 256-thread and wider blocks: fewer blocks than that
// leave the GPU underused (small R: one row each), more cost a part-empty last wave plus
// scratch traffic and column_sum_kernel time (P x C x 4 bytes each way per gradient).
inline int64_t wide_blocks(int64_t R, int64_t nvec, int64_t max_parts) {
  const int threads = wide_threads(nvec);
  int64_t p = threads == 128 ? 1024 : threads == 256 ? 512 : 256;
  if (R < p) p = R < 1 ? 1 : R;
  return p < max_parts ? p : max_parts;
}

// Launches norm_backward_wide_kernel on `stream` with `parts` blocks of wide_threads(C / V):
// dx (when non-null; plus dx_add, which may be dx) and, when non-null, each block's partial
// column sums part_w[b, :] of dy * xhat, part_b[b, :] of dy (layer norm only) and part_x[b, :] of
// dx as stored (needs dx). T is float,
// bf16 or f16; with V = 16 / sizeof(T): C % V == 0, C / V <= kWideMaxVecs, every pointer
// 16-byte aligned (the partials 32-byte aligned: the allocator gives 256).
template <class T>
void norm_backward_wide(bool rms, const T* dy, const T* x, const T* weight, const acc_t<T>* mean,
                        const acc_t<T>* rstd, T* dx, const T* dx_add, acc_t<T>* part_w, acc_t<T>* part_b,
                        acc_t<T>* part_x, int64_t R, int64_t C, int64_t parts, cudaStream_t stream);

// The wide-row forward (layer norm or RMS norm; with residual, h = x + residual is formed,
// stored and normalised): a block of wide_threads(C / V) threads per row, thread t owning the
// row's vector t, the row read from DRAM once; the blocks walk the rows (no cross-block state:
// any grid gives the same bits). The grid is what fits the device's `sms` multiprocessors at
// once, at the kernel's real occupancy (Note [one wave of norm rows], norm_wide.cu), at most R.
// Same preconditions as norm_backward_wide; mean null for RMS norm.
template <class T>
void norm_forward_wide(bool rms, const T* x, const T* residual, T* h, const T* weight, const T* bias, T* y,
                       acc_t<T>* mean, acc_t<T>* rstd, int64_t R, int64_t C, double eps, int sms,
                       cudaStream_t stream);

}  // namespace forge::cuda::norm_detail
