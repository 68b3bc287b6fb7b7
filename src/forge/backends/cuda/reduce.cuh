#pragma once
// Device-side building blocks of the reduction-shaped kernels (reduce.cu, softmax.cu,
// loss.cu, embedding.cu, index.cu). Internal to backends/cuda/.
//
//   FORGE_KERNEL_CHECK(cond, what)  a device-side check (Note [device-side index checks])
//   Vec / vec_width / aligned16     16-byte vector access (from loops.cuh)
//   shfl_xor_any                    a warp shuffle of any trivially copyable accumulator
//   group_reduce                    reduces one value per thread over a "row group"
//   RowGroups                       how a 256-thread block is cut into row groups
//   device_buffer                   a scratch tensor from the caching allocator
//
// Note [row groups]: a row-reduction kernel runs 256-thread blocks, each cut into
// ty = 256 / tx groups of tx consecutive threads (tx a power of two, 1..256); group g of
// block b reduces row b * ty + g (a short row gets a few lanes, a long row the whole
// block). Within a group, each thread first folds the elements it reads (strided by tx,
// 16-byte vectors where the row allows) into its own accumulator, then group_reduce
// combines the tx accumulators with a fixed xor-shuffle tree (and, when tx > 32, the
// per-warp results through shared memory in warp order). The tree depends only on the
// launch shape, which depends only on the problem shape and the device's SM count, so
// every result is run-to-run deterministic. Every thread of the block must call
// group_reduce (it synchronises the block when tx > 32): kernels never return early.
//
// Note [device-side index checks]: ids, targets and indices live on the device, so
// checking them on the host would need a copy back and a host synchronisation inside the
// op. Instead the kernel that reads an index checks it and, when it is out of range,
// fails with a device-side assertion (__assert_fail, kept in release builds) after
// printing the op, the value and the bound, and never dereferences it. As with PyTorch's
// device-side asserts, the error is reported by the next synchronising CUDA call (as a
// forge::Error "device-side assert triggered") and the CUDA context of the process is
// unusable afterwards: an out-of-range id is a bug in the data pipeline, not a condition
// to recover from. The CPU backend throws a forge::Error naming the value instead.
#include <cuda_runtime.h>

#include <cassert>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "forge/backends/cuda/loops.cuh"
#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/core/storage.h"
#include "forge/core/tensor.h"

namespace forge::cuda {

// ---- device-side checks ----------------------------------------------------------------

// Fails the kernel (Note [device-side index checks]) unless `cond`, after printing `fmt` (a
// string literal) with the printf arguments that follow (cast 64-bit integers to long long).
#define FORGE_KERNEL_CHECK(cond, fmt, ...)                                                     \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      printf("forge: " fmt "\n", __VA_ARGS__);                                                 \
      __assert_fail(#cond, __FILE__, static_cast<unsigned>(__LINE__), __PRETTY_FUNCTION__);  \
    }                                                                                          \
  } while (0)

// ---- launch constants --------------------------------------------------------------------

inline constexpr int kReduceThreads = 256;  // threads of every row-group block
inline constexpr int kReduceWarps = kReduceThreads / 32;

// Elements of T in one 16-byte vector.
template <class T> inline constexpr int kVec = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));

// True when `p` is 16-byte aligned.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- warp and group reductions -----------------------------------------------------------

// __shfl_xor_sync for any trivially copyable value (moved as 32-bit words).
template <class A> __device__ __forceinline__ A shfl_xor_any(const A& v, int lane_mask) {
  static_assert(std::is_trivially_copyable_v<A>);
  constexpr int kWords = (sizeof(A) + 3) / 4;
  uint32_t w[kWords] = {};
  memcpy(w, &v, sizeof(A));
#pragma unroll
  for (int k = 0; k < kWords; ++k) w[k] = __shfl_xor_sync(0xffffffffu, w[k], lane_mask);
  A r;
  memcpy(&r, w, sizeof(A));
  return r;
}

template <class A> __device__ __forceinline__ A shfl_any(const A& v, int src_lane, int width) {
  constexpr int kWords = (sizeof(A) + 3) / 4;
  uint32_t w[kWords] = {};
  memcpy(w, &v, sizeof(A));
#pragma unroll
  for (int k = 0; k < kWords; ++k) w[k] = __shfl_sync(0xffffffffu, w[k], src_lane, width);
  A r;
  memcpy(&r, w, sizeof(A));
  return r;
}

// Shared memory for group_reduce: one accumulator per warp.
template <class A> struct GroupScratch {
  A warp[kReduceWarps];
};

// Reduces `v` over the tx threads of this thread's row group (Note [row groups]) with
// combine(a, b); every thread of the group receives lane 0's result. blockDim.x must be
// kReduceThreads, tx a power of two in [1, kReduceThreads], and every thread of the block
// must call it.
template <class A, class Combine>
__device__ __forceinline__ A group_reduce(A v, int tx, const Combine& combine, GroupScratch<A>& smem) {
  const int width = tx < 32 ? tx : 32;
  for (int off = width / 2; off > 0; off /= 2) v = combine(v, shfl_xor_any(v, off));
  v = shfl_any(v, 0, width);  // every lane takes lane 0's value: one result per group
  if (tx <= 32) return v;
  const int warp = static_cast<int>(threadIdx.x) / 32, per_group = tx / 32;
  if (threadIdx.x % 32 == 0) smem.warp[warp] = v;
  __syncthreads();
  const int first = warp / per_group * per_group;
  A r = smem.warp[first];
  for (int k = 1; k < per_group; ++k) r = combine(r, smem.warp[first + k]);
  __syncthreads();  // smem may be reused by the next call
  return r;
}

// ---- online softmax statistics -------------------------------------------------------------
//
// Note [online softmax]: the softmax family reads a row once for its statistics, keeping
// a running max m and s = sum exp(x - m), rescaling s when m grows (Milakov & Gimelshein,
// "Online normalizer calculation for softmax"). Edge cases match the CPU's two-pass form:
// the max propagates NaN, so a row holding a NaN gives NaN everywhere; while m is -inf
// (nothing but -inf seen) s stays 0 and exp(-inf - -inf) is never formed, so a row with one
// finite element is exact, and a row of only -inf gives NaN through exp(x - m) later.

template <class M> struct MaxSum {
  M m;  // running max (NaN once a NaN was seen)
  M s;  // sum of exp(x - m)
};

template <class M> __device__ __forceinline__ M nan_max(M a, M b) {
  if (a != a) return a;
  if (b != b) return b;
  return a > b ? a : b;
}

// exp in M; the fast intrinsic for 16-bit data (its error is far below their rounding).
template <bool kFast, class M> __device__ __forceinline__ M exp_of(M x) {
  if constexpr (std::is_same_v<M, double>) return ::exp(x);
  else if constexpr (kFast) return __expf(x);
  else return expf(x);
}

template <class M> __device__ __forceinline__ MaxSum<M> maxsum_identity() {
  return {-std::numeric_limits<M>::infinity(), M(0)};
}

// Note [fast softmax statistics]: for 16-bit data (kFast, M = float) the fold is written for few
// instructions an element. An H200 profile (ncu) had the cross-entropy forward over GPT-2's bf16
// (16384, 50304) logits issue-bound (SM throughput 86%, DRAM 50%) at ~20 instructions an element:
// nan_max compiles to two NaN tests and two branches per element, and __expf to a subtraction, a
// multiplication and a non-flushing ex2 with its range fix-up. Here the batch's max is a tree of
// max.NaN (one instruction each, NaN-propagating as nan_max), and each exp one fused multiply-add
// and ex2.approx.ftz: exp(x - m) = 2^(x log2(e) - m log2(e)), the product m log2(e) formed once per
// batch (exp_shifted); the K terms are added as a tree before they join the running sum. Results
// stay within a few f32 ulps of the exact form (the shift's rounding scales with |m|: ~1e-6
// relative for logits of ~30), far below bf16/f16 resolution; outputs under 2^-126 flush to 0,
// which a sum holding its max's exp(0) = 1 cannot see. f32 and f64 data keep the exact form.
inline constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float max_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return nan_max(a, b);
#endif
}

__device__ __forceinline__ float ex2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// exp(x - m) for an x of 16-bit data, given mb = m * kLog2e (Note [fast softmax statistics]); the
// exact exp_of<kFast>(x - m) for wider data (mb unused).
template <bool kFast, class M> __device__ __forceinline__ M exp_shifted(M x, M m, M mb) {
  if constexpr (kFast && std::is_same_v<M, float>) return ex2_ftz(__fmaf_rn(x, kLog2e, -mb));
  else return exp_of<kFast>(x - m);
}

// The shift exp_shifted needs for the max m.
template <bool kFast, class M> __device__ __forceinline__ M exp_shift_of(M m) {
  if constexpr (kFast && std::is_same_v<M, float>) return m * kLog2e;
  else return m;
}

// Folds k values into st: one exp per value, plus one per batch whose max grows.
template <bool kFast, class M, int K> __device__ __forceinline__ void maxsum_update(MaxSum<M>& st, const M (&v)[K]) {
  constexpr M kNegInf = -std::numeric_limits<M>::infinity();
  if constexpr (kFast && std::is_same_v<M, float>) {  // Note [fast softmax statistics]
    M t[K];
#pragma unroll
    for (int k = 0; k < K; ++k) t[k] = v[k];
#pragma unroll
    for (int w = 1; w < K; w *= 2)
#pragma unroll
      for (int k = 0; k + w < K; k += 2 * w) t[k] = max_nan(t[k], t[k + w]);
    const M mv = max_nan(st.m, t[0]);
    if (!(mv == st.m)) {  // grew, or became NaN
      st.s = st.m == kNegInf ? M(0) : st.s * exp_of<kFast>(st.m - mv);
      st.m = mv;
    }
    if (st.m != kNegInf) {
      const M mb = exp_shift_of<kFast>(st.m);
#pragma unroll
      for (int k = 0; k < K; ++k) t[k] = exp_shifted<kFast>(v[k], st.m, mb);
#pragma unroll
      for (int w = 1; w < K; w *= 2)
#pragma unroll
        for (int k = 0; k + w < K; k += 2 * w) t[k] += t[k + w];
      st.s += t[0];
    }
  } else {
    M mv = st.m;
#pragma unroll
    for (int k = 0; k < K; ++k) mv = nan_max(mv, v[k]);
    if (!(mv == st.m)) {  // grew, or became NaN
      st.s = st.m == kNegInf ? M(0) : st.s * exp_of<kFast>(st.m - mv);
      st.m = mv;
    }
    if (st.m != kNegInf) {
#pragma unroll
      for (int k = 0; k < K; ++k) st.s += exp_of<kFast>(v[k] - st.m);
    }
  }
}

// Symmetric merge of two partial states.
template <bool kFast, class M> __device__ __forceinline__ MaxSum<M> maxsum_merge(const MaxSum<M>& a, const MaxSum<M>& b) {
  constexpr M kNegInf = -std::numeric_limits<M>::infinity();
  const M m = nan_max(a.m, b.m);
  const M sa = a.m == kNegInf ? M(0) : a.s * exp_of<kFast>(a.m - m);
  const M sb = b.m == kNegInf ? M(0) : b.s * exp_of<kFast>(b.m - m);
  return {m, sa + sb};
}

// Host side: the row-group shape for rows of `work` items (vectors or elements) each.
struct RowGroups {
  int tx = 1;  // threads per row
  int ty = kReduceThreads;  // rows per block

  static RowGroups for_work(int64_t work) {
    RowGroups g;
    const int64_t want = (work + 1) / 2;  // about two items per thread before the tree
    while (g.tx < kReduceThreads && g.tx < want) g.tx *= 2;
    g.ty = kReduceThreads / g.tx;
    return g;
  }
};

// ---- host helpers ------------------------------------------------------------------------

// A contiguous scratch tensor on GPU `device` from the caching allocator (backends sit
// below ops/, so no forge::empty here). Freed when the last handle goes, stream-ordered.
inline Tensor device_buffer(int device, const Shape& shape, DType dtype) {
  auto storage =
      std::make_shared<Storage>(checked_nbytes(shape, element_size(dtype)), allocator(device));
  return Tensor::make(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

// Blocks for a grid-stride launch over `work` units of kReduceThreads threads each, at
// most `per_sm` blocks per SM.
inline unsigned grid_blocks(int device, int64_t units, int per_sm = 8) {
  const int64_t cap = static_cast<int64_t>(multiprocessor_count(device)) * per_sm;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(units, cap)));
}

}  // namespace forge::cuda
