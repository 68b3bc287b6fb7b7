// CUDA layer norm, fused residual add + layer norm, and RMS norm over the last dim, forward
// and backward: the counterparts of backends/cpu/norm.cpp (same math, same memory contract).
//
// x is viewed as (R, C): R rows of C features (R = B * T for activations (B, T, C)).
//
// Forward, per row r (w = 1 and b = 0 when the weight / bias is absent):
//   add_layer_norm  h_rj   = T(x_rj + residual_rj)                  (rounded as ops::add rounds)
//                   and then layer norm of h (h replaces x below)
//   layer_norm      mean_r = sum_j x_rj / C
//                   rstd_r = 1 / sqrt(sum_j (x_rj - mean_r)^2 / C + eps)   (two passes)
//                   y_rj   = (x_rj - mean_r) * rstd_r * w_j + b_j
//   rms_norm        rstd_r = 1 / sqrt(sum_j x_rj^2 / C + eps),   y_rj = x_rj * rstd_r * w_j
// Backward, from dy, with xhat_rj = (x_rj - mean_r) * rstd_r (mean_r = 0 for rms) and
// g_rj = dy_rj * w_j:
//   dx_rj = rstd_r * (g_rj - (1/C) sum_k g_rk - xhat_rj (1/C) sum_k g_rk xhat_rk)
//           (the first sum is absent for rms_norm)
//   dw_j  = sum_r dy_rj xhat_rj,   db_j = sum_r dy_rj (layer norm)
//
// Memory contract (as the CPU kernels):
//   x, residual, weight, bias, dy, mean, rstd   read only; every tensor contiguous
//   forward   overwrites y (R, C), mean (R), rstd (R), and h (R, C) for add_layer_norm
//   backward  overwrites each defined member of NormGrads: dx (R, C), dweight (C), dbias (C);
//             nothing is accumulated into caller memory
//   scratch   backward: (P, C) partial column sums in the stat dtype per weight/bias gradient,
//             P <= kMaxPartials, allocated through the device allocator, freed on return
//             (safe: the allocator reuses memory only in stream order)
//
// Note [CUDA norm kernels]
// ------------------------
// Precision: statistics, dx and the parameter gradients accumulate in acc_t<T> (f32 for
// bf16/f16/f32, f64 for f64); the final column sums of dweight/dbias run in f64. mean/rstd
// are written in the stat dtype (= acc_t<T>) and the forward normalises with exactly those
// values, so forward and backward see the same statistics. Values are rounded to T once.
//
// Forward (norm_forward_kernel): one warp per row, 8 rows per 256-thread block. Lane l takes
// the row's 16-byte vectors l, l + 32, l + 64, ... (V = 16 / sizeof(T) elements each: 8 for
// bf16/f16, 4 for f32), so a warp reads 512 contiguous bytes per instruction. The first
// kCache vectors of each lane stay in registers (kCache * V * 32 = kRegisterWidth = 1024
// columns: all of GPT-2's 768), so the row is read from DRAM once; wider rows re-read the
// rest from L1/L2 in the later passes. Pass 1 sums x (for add_layer_norm it also forms and
// writes h), pass 2 sums (x - mean)^2 (two-pass variance: no cancellation), pass 3 writes y.
// Warp sums are xor butterflies, so every lane holds the same bits. Rows whose width is not a
// multiple of V, or whose pointers are not 16-byte aligned, run the same kernel with V = 1
// (scalar loads, still coalesced); f64 always does.
//
// Forward, block per row (norm_forward_wide_kernel, norm_wide.cu): rows wider than
// kRegisterWidth in whole aligned vectors run a 256- to 1024-thread block per row, thread t
// holding the row's vector t, so the row is read once and the sums cross warps through shared
// memory (in warp order). Why: at LLaMA's C = 2048 the warp kernel re-read half of each row from
// L2 at low occupancy, 26.5 us per call on an H200 (2.5 TB/s), and the fused add + RMS norm
// (Note [fused residual + RMS norm in LLaMA]) moves twice the bytes through the same path.
// Narrower rows keep the warp kernel: GPT-2's add + LayerNorm (C = 768) in 128-thread blocks
// took 41 us a call on an H200 (2.4 TB/s, two loads in flight a thread), where the warp kernel,
// each lane holding three vectors of the row, took 32 us (H200 traces of b5a4cbe and c2c3f5c).
//
// Backward (norm_backward_kernel): the same warp-per-row layout. Pass 1 loads x and dy into
// registers and sums g and g * xhat; pass 2 writes dx. dweight/dbias are column sums over
// rows, reduced deterministically (no atomics):
//   Rows of 64 to 1024 whole aligned vectors (bf16/f16: 512 to 8192 columns, f32: 256 to
//     4096) take the block-per-row kernel below; the warp kernel keeps narrower rows, unaligned
//     or scalar ones and f64 (and, with FORGE_NORM_BLOCK_ROWS=0, every row of up to
//     kRegisterWidth columns, its old domain: the switch is the A/B of that change).
//   C <= kRegisterWidth (fused): while its warp walks rows w, w + W, w + 2W, ... (W warps in
//     the grid, a number that depends on R only: P = min(ceil(R / 64), kMaxPartials) blocks),
//     each lane adds dy * xhat and dy of the columns it owns into the warp's own slice of
//     dynamic shared memory, laid out (V, C / V) so a warp's 32 lanes touch 32 consecutive
//     words (no bank conflicts; no atomics: a column has one owner). At the end the block adds
//     its 8 warps' slices column by column in warp order and writes one partial row (C) of the
//     scratch. (Keeping the sums in registers instead needs ~170 registers a thread, one
//     block per SM; shared memory keeps the kernel near 120 registers, two to three blocks.)
//   Block per row (norm_backward_wide_kernel, norm_wide.cu), dx and the column sums in one
//     pass. Thread t of a 128-, 256-, 512- or 1024-thread block (the smallest that covers the
//     row) owns the row's vector t and keeps its weight and its column sums of
//     dy * xhat and dy in registers; a row's sums of g and g * xhat go through warp butterflies,
//     then every thread adds the warp sums from shared memory in warp order (the same bits
//     everywhere). Block b walks rows b, b + P, ... (P = min(R, 1024) for 128-thread blocks,
//     min(R, 512) for 256-thread blocks, min(R, 256) for wider ones: R and C alone) and writes
//     one partial row.
//     Why: the warp-per-row kernel holds only 1024 columns in registers, re-reads the rest at
//     low occupancy, and the gradients then cost a second pass over dy and x
//     (norm_param_grad_kernel): ~1 TB/s. On an H200, R = 8192, with dx_add and dweight
//     (counting the reads of x, dy, dx_add and the write of dx; column_sum_kernel included),
//     old -> new: bf16 rms C = 2048 148 -> 48 us (0.9 -> 2.8 TB/s), C = 4096 269 -> 89 us
//     (3.0 TB/s), C = 8192 533 -> 189 us (2.8 TB/s); layer norm (dweight and dbias) C = 4096
//     295 -> 100 us; f32 rms C = 4096 359 -> 156 us (3.5 TB/s). bf16 stays below f32 and the
//     ~4.3 TB/s of a copy, likely issue-bound by the software 16-bit conversions (Note [16-bit
//     conversions], core/half.h; not profiled). Measured and dropped: 256 threads with 2 or 4
//     vectors each (more registers, fewer warps: up to 1.6x slower at C = 8192), and loading
//     the next row before the current row's reduction (likewise slower).
//     GPT-2's rows (C = 768 bf16, R = 16384, with dx_add) were the warp kernel's: 95 us a call
//     on an H100 (about 1 TB/s; 25 calls, 2.4 ms of a 33 ms step), its 256 blocks of 8 warps
//     (P = R / 64) two per SM, each warp's rows one after another; as 128-thread blocks, P =
//     1024, about 8 resident per SM, the 100 MB a call should move at the wide kernel's ~3 TB/s.
//   Other rows wider than kRegisterWidth (scalar, f64, wider still): the dx kernel computes dx
//     only; norm_param_grad_kernel then re-reads dy and x in (32 columns x a slice of rows) tiles,
//     one partial row per slice.
// column_sum_kernel finally adds the P partials of each column in a fixed order (in f64; both
// gradients in one launch) and rounds to T. The result is bit-identical from run to run and
// independent of the GPU's SM count.
// dx_add (Note [residual gradient in the norm backward], ops/norm.cpp): the gradient that
// reached the norm's input by the residual path is added into dx in the same pass (read before
// dx is written, so it may be dx's own buffer).
//
// Performance notes: the forward reads x and writes y (add_layer_norm: reads x and residual,
// writes h and y); the backward reads x and dy once and writes dx once, plus (fused path)
// P x C x 4 bytes of partials per parameter gradient written and read back (P = 256 for
// R = 16384: 0.8 MB at C = 768, next to the 75 MB a bf16 backward moves; the wide kernel's
// at most 512 partial rows are 4 MB at C = 2048 against 134 MB for R = 8192 with dx_add).
// LLaMA widths: see docs/cuda-kernels.md.
#include "forge/backends/cuda/norm.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>

#include "forge/backends/cuda/loops.cuh"
#include "forge/backends/cuda/norm_wide.cuh"
#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/core/env.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cuda {
namespace {

using norm_detail::kWarpSize;
using norm_detail::load_vec;
using norm_detail::read_input;
using norm_detail::store_vec;
using norm_detail::warp_sum;

constexpr int kRowWarps = 8;  // rows in flight per block (one per warp)
constexpr int kRowThreads = kRowWarps * kWarpSize;
// Columns a warp holds in registers: 32 lanes x kCache vectors x V elements.
constexpr int64_t kRegisterWidth = 1024;
// Backward, fused path: rows per warp aimed at (P = ceil(R / (kRowWarps * kRowsPerWarp)) blocks).
constexpr int64_t kRowsPerWarp = 8;
// At most this many partial rows of column sums (bounds the scratch and the final pass).
constexpr int64_t kMaxPartials = 1024;
// norm_param_grad_kernel tiles: 32 columns x 8 row lanes.
constexpr int kTileCols = 32;
constexpr int kTileRows = 8;

template <int V> constexpr int cache_vecs() { return static_cast<int>(kRegisterWidth / (kWarpSize * V)); }

// Correctly rounded 1 / sqrt (sqrtf and the division are IEEE-rounded without fast math).
template <class A> __device__ __forceinline__ A inv_sqrt(A v) {
  if constexpr (std::is_same_v<A, float>) return 1.0f / sqrtf(v);
  else return 1.0 / sqrt(v);
}

// ---- forward ---------------------------------------------------------------------------

// y[vi] = (v - mu) * rs * w + b (norm_detail::normalized).
template <class T, int V>
__device__ __forceinline__ void write_normalized(const Vec<T, V>& v, int64_t vi, acc_t<T> mu, acc_t<T> rs,
                                                 const T* weight, const T* bias, T* yr) {
  Vec<T, V> w, b;
  if (weight) w = load_vec<T, V>(weight, vi);
  if (bias) b = load_vec<T, V>(bias, vi);
  store_vec<T, V>(yr, vi, norm_detail::normalized<T, V>(v, mu, rs, w, weight != nullptr, b, bias != nullptr));
}

// One warp per row (Note [CUDA norm kernels]). V elements per vector; C % V == 0.
template <class T, int V, bool kRms, bool kResidual>
__global__ void __launch_bounds__(kRowThreads)
    norm_forward_kernel(const T* __restrict__ x,          // (R, C)
                        const T* __restrict__ residual,   // (R, C), kResidual only
                        T* __restrict__ h,                // (R, C) x + residual, kResidual only
                        const T* __restrict__ weight,     // (C) or null (1)
                        const T* __restrict__ bias,       // (C) or null (0); layer norm only
                        T* __restrict__ y,                // (R, C)
                        acc_t<T>* __restrict__ mean,      // (R), layer norm only
                        acc_t<T>* __restrict__ rstd,      // (R)
                        int64_t R, int64_t C, acc_t<T> eps) {
  using A = acc_t<T>;
  using P = Vec<T, V>;
  constexpr int kCache = cache_vecs<V>();
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarpSize;
  if (row >= R) return;  // whole warps leave together: no warp-level call below sees a partial warp
  const int64_t nvec = C / V;
  const T* xr = x + row * C;
  const T* rr = kResidual ? residual + row * C : nullptr;
  T* hr = kResidual ? h + row * C : nullptr;
  const T* src = kResidual ? hr : xr;  // where passes 2 and 3 re-read vectors beyond the cache
  T* yr = y + row * C;

  // Pass 1: load (and cache) the row; sum x (layer norm) or x^2 (rms norm).
  P cache[kCache];
  A s1 = 0;
#pragma unroll
  for (int k = 0; k < kCache; ++k) {
    const int64_t vi = static_cast<int64_t>(k) * kWarpSize + lane;
    if (vi < nvec) {
      cache[k] = read_input<T, V, kResidual>(xr, rr, hr, vi);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A v = static_cast<A>(cache[k].v[j]);
        s1 += kRms ? v * v : v;
      }
    }
  }
  for (int64_t vi = static_cast<int64_t>(kCache) * kWarpSize + lane; vi < nvec; vi += kWarpSize) {
    const P p = read_input<T, V, kResidual>(xr, rr, hr, vi);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const A v = static_cast<A>(p.v[j]);
      s1 += kRms ? v * v : v;
    }
  }
  s1 = warp_sum(s1);

  A mu = 0, ss = s1;
  if constexpr (!kRms) {
    // Pass 2: sum of squared deviations from the mean.
    mu = s1 / static_cast<A>(C);
    ss = 0;
#pragma unroll
    for (int k = 0; k < kCache; ++k) {
      const int64_t vi = static_cast<int64_t>(k) * kWarpSize + lane;
      if (vi < nvec) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const A d = static_cast<A>(cache[k].v[j]) - mu;
          ss += d * d;
        }
      }
    }
    for (int64_t vi = static_cast<int64_t>(kCache) * kWarpSize + lane; vi < nvec; vi += kWarpSize) {
      const P p = load_vec<T, V>(src, vi);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A d = static_cast<A>(p.v[j]) - mu;
        ss += d * d;
      }
    }
    ss = warp_sum(ss);
  }
  const A rs = inv_sqrt(ss / static_cast<A>(C) + eps);
  if (lane == 0) {
    if constexpr (!kRms) mean[row] = mu;
    rstd[row] = rs;
  }

  // Pass 3: y.
#pragma unroll
  for (int k = 0; k < kCache; ++k) {
    const int64_t vi = static_cast<int64_t>(k) * kWarpSize + lane;
    if (vi < nvec) write_normalized<T, V>(cache[k], vi, mu, rs, weight, bias, yr);
  }
  for (int64_t vi = static_cast<int64_t>(kCache) * kWarpSize + lane; vi < nvec; vi += kWarpSize)
    write_normalized<T, V>(load_vec<T, V>(src, vi), vi, mu, rs, weight, bias, yr);
}

// ---- backward --------------------------------------------------------------------------

// Pass 1 of the backward for one vector: a1 += sum g, a2 += sum g * xhat.
template <class T, int V>
__device__ __forceinline__ void backward_sums(const Vec<T, V>& xv, const Vec<T, V>& gv, int64_t vi, const T* weight,
                                              acc_t<T> mu, acc_t<T> rs, acc_t<T>& a1, acc_t<T>& a2) {
  using A = acc_t<T>;
  Vec<T, V> w;
  if (weight) w = load_vec<T, V>(weight, vi);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const A xh = (static_cast<A>(xv.v[j]) - mu) * rs;
    const A d = static_cast<A>(gv.v[j]);
    const A g = weight ? d * static_cast<A>(w.v[j]) : d;
    a1 += g;
    a2 += g * xh;
  }
}

// Pass 2 for one vector: dx (if dxr), and the warp's running column sums sum_w += dy * xhat,
// sum_b += dy (null: not kept). The sums live in shared memory as (V, nvec): column vi * V + j
// at j * nvec + vi, so the 32 lanes of a warp touch 32 consecutive words (no bank conflicts),
// and each column is owned by one lane.
template <class T, int V>
__device__ __forceinline__ void backward_apply(const Vec<T, V>& xv, const Vec<T, V>& gv, int64_t vi, const T* weight,
                                               acc_t<T> mu, acc_t<T> rs, acc_t<T> m1, acc_t<T> m2, T* dxr,
                                               const T* addr, acc_t<T>* sum_w, acc_t<T>* sum_b, int64_t nvec) {
  using A = acc_t<T>;
  Vec<T, V> w, o, a;
  if (weight) w = load_vec<T, V>(weight, vi);
  if (addr) a = load_vec<T, V>(addr, vi);  // read before dxr is written: addr may be dxr
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const A xh = (static_cast<A>(xv.v[j]) - mu) * rs;
    const A d = static_cast<A>(gv.v[j]);
    const A g = weight ? d * static_cast<A>(w.v[j]) : d;
    const A dxv = rs * (g - m1 - xh * m2);
    o.v[j] = convert<T>(addr ? dxv + static_cast<A>(a.v[j]) : dxv);
    if (sum_w) sum_w[j * nvec + vi] += d * xh;
    if (sum_b) sum_b[j * nvec + vi] += d;
  }
  if (dxr) store_vec<T, V>(dxr, vi, o);
}

// Warp per row; the grid's warps walk the rows with a stride of all warps. With part_w /
// part_b (only when C <= kRegisterWidth) each warp keeps column sums for its rows in its own
// slice of dynamic shared memory, (kRowWarps, C) per gradient, and the block writes their sum,
// added in warp order, as one partial row (Note [CUDA norm kernels]).
template <class T, int V, bool kRms>
__global__ void __launch_bounds__(kRowThreads)
    norm_backward_kernel(const T* __restrict__ dy,            // (R, C)
                         const T* __restrict__ x,             // (R, C)
                         const T* __restrict__ weight,        // (C) or null
                         const acc_t<T>* __restrict__ mean,   // (R), layer norm only
                         const acc_t<T>* __restrict__ rstd,   // (R)
                         T* dx,                               // (R, C) or null
                         const T* dx_add,                     // (R, C) or null: added into dx; may be dx
                         acc_t<T>* __restrict__ part_w,       // (gridDim.x, C) or null: sums of dy * xhat
                         acc_t<T>* __restrict__ part_b,       // (gridDim.x, C) or null: sums of dy
                         int64_t R, int64_t C) {
  using A = acc_t<T>;
  using P = Vec<T, V>;
  constexpr int kCache = cache_vecs<V>();
  extern __shared__ __align__(16) unsigned char norm_smem[];  // (kRowWarps, V, C / V) A per kept sum: w, then b
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int64_t nvec = C / V;
  const A inv_c = A(1) / static_cast<A>(C);
  A* s_w = part_w ? reinterpret_cast<A*>(norm_smem) : nullptr;
  A* s_b = part_b ? reinterpret_cast<A*>(norm_smem) + (part_w ? kRowWarps * C : 0) : nullptr;
  A* sum_w = s_w ? s_w + warp * C : nullptr;  // this warp's slice
  A* sum_b = s_b ? s_b + warp * C : nullptr;
  for (int64_t c = lane; c < C; c += kWarpSize) {
    if (sum_w) sum_w[c] = 0;
    if (sum_b) sum_b[c] = 0;
  }
  __syncwarp();  // a lane zeroed other lanes' columns

  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + warp; row < R; row += warps) {
    const T* xr = x + row * C;
    const T* gr = dy + row * C;
    T* dxr = dx ? dx + row * C : nullptr;
    const T* addr = dx_add ? dx_add + row * C : nullptr;
    const A mu = kRms ? A(0) : mean[row];
    const A rs = rstd[row];

    P xc[kCache], gc[kCache];
    A a1 = 0, a2 = 0;
#pragma unroll
    for (int k = 0; k < kCache; ++k) {
      const int64_t vi = static_cast<int64_t>(k) * kWarpSize + lane;
      if (vi < nvec) {
        xc[k] = load_vec<T, V>(xr, vi);
        gc[k] = load_vec<T, V>(gr, vi);
        backward_sums<T, V>(xc[k], gc[k], vi, weight, mu, rs, a1, a2);
      }
    }
    for (int64_t vi = static_cast<int64_t>(kCache) * kWarpSize + lane; vi < nvec; vi += kWarpSize)
      backward_sums<T, V>(load_vec<T, V>(xr, vi), load_vec<T, V>(gr, vi), vi, weight, mu, rs, a1, a2);
    const A m1 = kRms ? A(0) : warp_sum(a1) * inv_c;
    const A m2 = warp_sum(a2) * inv_c;

#pragma unroll
    for (int k = 0; k < kCache; ++k) {
      const int64_t vi = static_cast<int64_t>(k) * kWarpSize + lane;
      if (vi < nvec) backward_apply<T, V>(xc[k], gc[k], vi, weight, mu, rs, m1, m2, dxr, addr, sum_w, sum_b, nvec);
    }
    for (int64_t vi = static_cast<int64_t>(kCache) * kWarpSize + lane; vi < nvec; vi += kWarpSize)
      backward_apply<T, V>(load_vec<T, V>(xr, vi), load_vec<T, V>(gr, vi), vi, weight, mu, rs, m1, m2, dxr, addr,
                           sum_w, sum_b, nvec);
  }

  if (!s_w && !s_b) return;  // the same for the whole grid
  __syncthreads();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const int64_t at = (c % V) * nvec + c / V;  // column c in a warp's (V, nvec) slice
    if (s_w) {
      A t = s_w[at];
      for (int w = 1; w < kRowWarps; ++w) t += s_w[w * C + at];
      part_w[blockIdx.x * C + c] = t;
    }
    if (s_b) {
      A t = s_b[at];
      for (int w = 1; w < kRowWarps; ++w) t += s_b[w * C + at];
      part_b[blockIdx.x * C + c] = t;
    }
  }
}

// Rows wider than kRegisterWidth: the column sums of one (32 columns x rows_per_part rows)
// tile; thread (tx, ty) walks rows ty, ty + 8, ... of its column, then the 8 row lanes are
// added in order. Writes part_w / part_b[blockIdx.y, col].
template <class T, bool kRms>
__global__ void __launch_bounds__(kTileCols * kTileRows)
    norm_param_grad_kernel(const T* __restrict__ dy,           // (R, C)
                           const T* __restrict__ x,            // (R, C)
                           const acc_t<T>* __restrict__ mean,  // (R), layer norm only
                           const acc_t<T>* __restrict__ rstd,  // (R)
                           acc_t<T>* __restrict__ part_w,      // (gridDim.y, C) or null
                           acc_t<T>* __restrict__ part_b,      // (gridDim.y, C) or null
                           int64_t R, int64_t C, int64_t rows_per_part) {
  using A = acc_t<T>;
  __shared__ A s_w[kTileRows][kTileCols];
  __shared__ A s_b[kTileRows][kTileCols];
  const int tx = static_cast<int>(threadIdx.x) % kTileCols, ty = static_cast<int>(threadIdx.x) / kTileCols;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTileCols + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_part;
  const int64_t r1 = r0 + rows_per_part < R ? r0 + rows_per_part : R;
  A sw = 0, sb = 0;
  if (col < C) {
    for (int64_t r = r0 + ty; r < r1; r += kTileRows) {
      const A mu = kRms ? A(0) : mean[r];
      const A xh = (static_cast<A>(x[r * C + col]) - mu) * rstd[r];
      const A d = static_cast<A>(dy[r * C + col]);
      sw += d * xh;
      sb += d;
    }
  }
  s_w[ty][tx] = sw;
  s_b[ty][tx] = sb;
  __syncthreads();
  if (ty == 0 && col < C) {
    A tw = 0, tb = 0;
#pragma unroll
    for (int k = 0; k < kTileRows; ++k) {
      tw += s_w[k][tx];
      tb += s_b[k][tx];
    }
    if (part_w) part_w[blockIdx.y * C + col] = tw;
    if (part_b) part_b[blockIdx.y * C + col] = tb;
  }
}

// out[c] = T(sum_p part[p, c]) for up to three (partials, out) pairs (blockIdx.y picks one), in
// f64. A block takes kTileCols columns; its kSumRows row lanes each add a fixed, contiguous range
// of partials in order, then lane 0 adds the kSumRows lane sums in lane order: the same bits on
// every run and GPU, and parts / kSumRows serial adds instead of parts (the reduction is
// latency-bound: a few hundred partials of 768 columns).
constexpr int kSumRows = 8;
template <class T> struct SumPairs {
  const acc_t<T>* part[3];  // (P, C) each; the first blockIdx.y-extent of them are used
  T* out[3];                // (C) each
};
template <class T>
__global__ void __launch_bounds__(kTileCols * kSumRows)
    column_sum_kernel(const SumPairs<T> pairs, int64_t parts, int64_t C) {
  __shared__ double lane_sums[kSumRows][kTileCols];
  const acc_t<T>* part = pairs.part[blockIdx.y];
  T* out = pairs.out[blockIdx.y];
  const int tc = static_cast<int>(threadIdx.x) % kTileCols, tr = static_cast<int>(threadIdx.x) / kTileCols;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTileCols + tc;
  const int64_t per = (parts + kSumRows - 1) / kSumRows;
  const int64_t p0 = tr * per, p1 = p0 + per < parts ? p0 + per : parts;
  double s = 0;
  if (col < C)
    for (int64_t p = p0; p < p1; ++p) s += static_cast<double>(part[p * C + col]);
  lane_sums[tr][tc] = s;
  __syncthreads();
  if (tr == 0 && col < C) {
    double t = 0;
#pragma unroll
    for (int r = 0; r < kSumRows; ++r) t += lane_sums[r][tc];
    out[col] = convert<T>(t);
  }
}

// ---- host side -------------------------------------------------------------------------

struct Rows {
  int64_t R = 0, C = 0;
};

// A contiguous scratch tensor on `device`, through the device allocator.
Tensor scratch(int device, const Shape& shape, DType dtype) {
  auto storage = std::make_shared<Storage>(checked_nbytes(shape, element_size(dtype)),
                                           allocator(device));
  return Tensor::make(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

std::string describe(const Tensor& t) {
  return ::forge::detail::concat(t.shape(), " ", dtype_name(t.dtype()), " on ", t.device().str(),
                        t.is_contiguous() ? "" : " (non-contiguous)");
}

// R, C of x and the checks every entry point shares: CUDA, one device, contiguous x with
// R * C elements, stats of the stat dtype.
Rows rows_of(const char* op, const Tensor& x, const Tensor& rstd, const Tensor* mean) {
  FORGE_CHECK(x.is_cuda() && x.is_contiguous(), op, ": the CUDA kernel needs a contiguous CUDA x, got ", describe(x));
  const int64_t C = x.dim() == 0 ? 1 : x.shape().back();
  const int64_t R = rstd.numel();
  const DType sd = cpu::norm_stat_dtype(x.dtype());
  for (const Tensor* s : {&rstd, mean}) {
    if (!s) continue;
    FORGE_CHECK(s->device() == x.device() && s->is_contiguous() && s->numel() == R && s->dtype() == sd, op,
                ": statistics must be contiguous ", dtype_name(sd), " of ", R, " elements on x's device, got ",
                describe(*s));
  }
  FORGE_CHECK(x.numel() == R * C, op, ": x ", x.shape(), " does not hold ", R, " rows of ", C);
  return {R, C};
}

// A defined tensor with x's device and dtype, contiguous, of `numel` elements.
void check_like(const char* op, const char* what, const Tensor& t, const Tensor& x, int64_t numel) {
  if (!t.defined()) return;
  FORGE_CHECK(t.device() == x.device() && t.is_contiguous() && t.numel() == numel && t.dtype() == x.dtype(), op,
              ": ", what, " must be contiguous ", dtype_name(x.dtype()), " of ", numel, " elements on ",
              x.device().str(), ", got ", describe(t));
}

bool aligned16(const Tensor& t) {
  return !t.defined() || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// 16-byte vectors apply when rows are whole vectors and every operand starts aligned.
template <class T> bool use_vectors(int64_t C, std::initializer_list<const Tensor*> ts) {
  constexpr int V = 16 / static_cast<int>(sizeof(T));
  if (std::is_same_v<T, double> || C % V != 0) return false;
  for (const Tensor* t : ts)
    if (!aligned16(*t)) return false;
  return true;
}

template <class T> const T* ptr(const Tensor& t) { return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr; }
template <class T> T* mut_ptr(const Tensor& t) { return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr; }

unsigned blocks_for(const char* op, int64_t work, int64_t per_block) {
  const int64_t blocks = (work + per_block - 1) / per_block;
  FORGE_CHECK(blocks <= std::numeric_limits<int>::max(), op, ": ", work, " rows exceed the grid");
  return static_cast<unsigned>(blocks);
}

// The shared forward launcher: kRms, and residual/h defined for add_layer_norm.
template <bool kRms>
void forward(const char* op, const Tensor& x, const Tensor& residual, Tensor* h, const Tensor& weight,
             const Tensor& bias, double eps, Tensor& y, Tensor* mean, Tensor& rstd) {
  const Rows rc = rows_of(op, x, rstd, mean);
  check_like(op, "weight", weight, x, rc.C);
  check_like(op, "bias", bias, x, rc.C);
  check_like(op, "y", y, x, x.numel());
  check_like(op, "residual", residual, x, x.numel());
  if (h) check_like(op, "h", *h, x, x.numel());
  FORGE_CHECK(y.defined(), op, ": y must be defined");
  if (rc.R == 0 || rc.C == 0) return;
  const int device = x.device().index;
  DeviceGuard guard(device);
  const bool add = residual.defined();
  const unsigned blocks = blocks_for(op, rc.R, kRowWarps);
  dispatch_float(x.dtype(), op, [&]<class T>() {
    using A = acc_t<T>;
    if constexpr (!std::is_same_v<T, double>) {
      // Rows wider than the warp kernel's register columns (Note [CUDA norm kernels]): a block
      // per row at a time.
      constexpr int V = 16 / static_cast<int>(sizeof(T));
      const int64_t nvec = rc.C / V;
      const Tensor none;
      if (rc.C > kRegisterWidth && nvec <= norm_detail::kWideMaxVecs &&
          use_vectors<T>(rc.C, {&x, &residual, h ? h : &none, &weight, &bias, &y})) {
        norm_detail::norm_forward_wide<T>(kRms, ptr<T>(x), ptr<T>(residual), h ? mut_ptr<T>(*h) : nullptr,
                                          ptr<T>(weight), ptr<T>(bias), mut_ptr<T>(y),
                                          mean ? mut_ptr<A>(*mean) : nullptr, mut_ptr<A>(rstd), rc.R, rc.C, eps,
                                          multiprocessor_count(device), current_stream(device));
        return;
      }
    }
    auto launch = [&]<int V>() {
      const T* px = ptr<T>(x);
      A* pm = mean ? mut_ptr<A>(*mean) : nullptr;
      A* pr = mut_ptr<A>(rstd);
      if (add)
        norm_forward_kernel<T, V, kRms, true><<<blocks, kRowThreads, 0, current_stream(device)>>>(
            px, ptr<T>(residual), mut_ptr<T>(*h), ptr<T>(weight), ptr<T>(bias), mut_ptr<T>(y), pm, pr, rc.R, rc.C,
            static_cast<A>(eps));
      else
        norm_forward_kernel<T, V, kRms, false><<<blocks, kRowThreads, 0, current_stream(device)>>>(
            px, nullptr, nullptr, ptr<T>(weight), ptr<T>(bias), mut_ptr<T>(y), pm, pr, rc.R, rc.C,
            static_cast<A>(eps));
    };
    if constexpr (std::is_same_v<T, double>) {
      launch.template operator()<1>();
    } else {
      const Tensor none;
      if (use_vectors<T>(rc.C, {&x, &residual, h ? h : &none, &weight, &bias, &y}))
        launch.template operator()<16 / static_cast<int>(sizeof(T))>();
      else
        launch.template operator()<1>();
    }
  });
  FORGE_CUDA_LAUNCH_CHECK(op, " on ", x.device().str(), ": x ", x.shape(), " ", dtype_name(x.dtype()), " (", rc.R,
                          " rows of ", rc.C, ")");
}

template <bool kRms>
void backward(const char* op, const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor* mean,
              const Tensor& rstd, NormGrads& grads) {
  const Rows rc = rows_of(op, x, rstd, mean);
  const int64_t R = rc.R, C = rc.C;
  check_like(op, "weight", weight, x, C);
  check_like(op, "dy", dy, x, x.numel());
  check_like(op, "dx", grads.dx, x, x.numel());
  check_like(op, "dx_add", grads.dx_add, x, x.numel());
  FORGE_CHECK(!grads.dx_add.defined() || grads.dx.defined(), op, ": dx_add needs dx");
  check_like(op, "dweight", grads.dweight, x, C);
  check_like(op, "dbias", grads.dbias, x, C);
  FORGE_CHECK(dy.defined(), op, ": dy must be defined");
  FORGE_CHECK(!kRms || !grads.dbias.defined(), op, ": RMS norm has no bias");
  const bool want_w = grads.dweight.defined(), want_b = grads.dbias.defined();
  grads.dx_sums_done = false;
  const bool want_x_sums = grads.dx_sums.defined() && grads.dx.defined();
  if (want_x_sums) check_like(op, "dx_sums", grads.dx_sums, x, C);
  if (R == 0 || C == 0) {  // no row: the column sums are zero
    if (want_w) fill(grads.dweight, 0.0);
    if (want_b) fill(grads.dbias, 0.0);
    return;
  }
  const int device = x.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  const DType sd = cpu::norm_stat_dtype(x.dtype());
  // Rows of kBlockRowMinVecs vectors or more run a block per row (norm_wide.cu) unless
  // FORGE_NORM_BLOCK_ROWS=0 keeps those of up to kRegisterWidth columns on the warp kernel.
  const bool block_rows = env::flag("FORGE_NORM_BLOCK_ROWS");
  const bool fused = (want_w || want_b) && C <= kRegisterWidth;  // the warp kernel's column sums (when !wide)

  dispatch_float(x.dtype(), op, [&]<class T>() {
    using A = acc_t<T>;
    const A* pm = mean ? ptr<A>(*mean) : nullptr;
    const A* pr = ptr<A>(rstd);
    int64_t parts = 0;
    Tensor part_w, part_b, part_x;
    auto make_parts = [&](int64_t p) {
      parts = p;
      if (want_w) part_w = scratch(device, {p, C}, sd);
      if (want_b) part_b = scratch(device, {p, C}, sd);
    };

    // Wide rows in whole aligned vectors, up to kWideMaxVecs of them: dx and the column sums
    // in one pass, a block per row (Note [CUDA norm kernels]).
    bool wide = false;
    if constexpr (!std::is_same_v<T, double>) {
      constexpr int V = 16 / static_cast<int>(sizeof(T));
      const bool long_row = C > kRegisterWidth || (block_rows && C / V >= norm_detail::kBlockRowMinVecs);
      wide = long_row && C / V <= norm_detail::kWideMaxVecs && (grads.dx.defined() || want_w || want_b) &&
             use_vectors<T>(C, {&dy, &x, &weight, &grads.dx, &grads.dx_add});
      if (wide) {
        const int64_t p = norm_detail::wide_blocks(R, C / V, kMaxPartials);
        parts = p;
        if (want_w || want_b) make_parts(p);
        // dx's column sums with it (Note [column sums handed to the producer]): only here.
        if (want_x_sums) part_x = scratch(device, {p, C}, sd);
        norm_detail::norm_backward_wide<T>(kRms, ptr<T>(dy), ptr<T>(x), ptr<T>(weight), pm, pr, mut_ptr<T>(grads.dx),
                                           ptr<T>(grads.dx_add), mut_ptr<A>(part_w), mut_ptr<A>(part_b),
                                           mut_ptr<A>(part_x), R, C, p, stream);
        FORGE_CUDA_LAUNCH_CHECK(op, " on ", x.device().str(), ": x ", x.shape(), " ", dtype_name(x.dtype()), " (", R,
                                " rows of ", C, ")");
      }
    }

    if (!wide && (grads.dx.defined() || fused)) {
      unsigned blocks;
      if (fused) {
        make_parts(std::clamp<int64_t>((R + kRowWarps * kRowsPerWarp - 1) / (kRowWarps * kRowsPerWarp), 1,
                                       kMaxPartials));
        blocks = static_cast<unsigned>(parts);
      } else {
        blocks = blocks_for(op, R, kRowWarps);
      }
      // Per-warp column sums of the fused path: (kRowWarps, C) of A per gradient kept.
      const size_t smem = fused ? static_cast<size_t>(kRowWarps * C) * sizeof(A) * ((want_w ? 1 : 0) + (want_b ? 1 : 0))
                                : 0;
      auto launch = [&]<int V>() {
        if (smem > 48 * 1024)  // beyond the default limit: opt in (up to 64 KB for f32, 128 KB for f64)
          FORGE_CUDA_CHECK(cudaFuncSetAttribute(norm_backward_kernel<T, V, kRms>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        norm_backward_kernel<T, V, kRms><<<blocks, kRowThreads, smem, stream>>>(
            ptr<T>(dy), ptr<T>(x), ptr<T>(weight), pm, pr, mut_ptr<T>(grads.dx), ptr<T>(grads.dx_add),
            mut_ptr<A>(part_w), mut_ptr<A>(part_b), R, C);
      };
      if constexpr (std::is_same_v<T, double>) {
        launch.template operator()<1>();
      } else {
        if (use_vectors<T>(C, {&dy, &x, &weight, &grads.dx, &grads.dx_add}))
          launch.template operator()<16 / static_cast<int>(sizeof(T))>();
        else
          launch.template operator()<1>();
      }
      FORGE_CUDA_LAUNCH_CHECK(op, " on ", x.device().str(), ": x ", x.shape(), " ", dtype_name(x.dtype()), " (", R,
                              " rows of ", C, ")");
    }

    if ((want_w || want_b) && !fused && !wide) {
      const int64_t want_parts = std::clamp<int64_t>((R + 63) / 64, 1, kMaxPartials);
      const int64_t rows_per_part = (R + want_parts - 1) / want_parts;
      make_parts((R + rows_per_part - 1) / rows_per_part);
      const dim3 grid(blocks_for(op, C, kTileCols), static_cast<unsigned>(parts));
      norm_param_grad_kernel<T, kRms><<<grid, kTileCols * kTileRows, 0, stream>>>(
          ptr<T>(dy), ptr<T>(x), pm, pr, mut_ptr<A>(part_w), mut_ptr<A>(part_b), R, C, rows_per_part);
      FORGE_CUDA_LAUNCH_CHECK(op, " (weight/bias gradients) on ", x.device().str(), ": x ", x.shape(), " ",
                              dtype_name(x.dtype()));
    }

    if (want_w || want_b || part_x.defined()) {
      SumPairs<T> pairs{};
      unsigned n = 0;
      auto pair = [&](const Tensor& part, Tensor& out) {
        pairs.part[n] = ptr<A>(part);
        pairs.out[n++] = mut_ptr<T>(out);
      };
      if (want_w) pair(part_w, grads.dweight);
      if (want_b) pair(part_b, grads.dbias);
      if (part_x.defined()) pair(part_x, grads.dx_sums);
      const dim3 grid(blocks_for(op, C, kTileCols), n);
      column_sum_kernel<T><<<grid, kTileCols * kSumRows, 0, stream>>>(pairs, parts, C);
      FORGE_CUDA_LAUNCH_CHECK(op, " (column sums of the gradients) on ", x.device().str(), ": ", C, " columns of ",
                              parts, " partials");
      grads.dx_sums_done = part_x.defined();
    }
  });
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& y,
                        Tensor& mean, Tensor& rstd) {
  forward<false>("layer_norm", x, Tensor(), nullptr, weight, bias, eps, y, &mean, rstd);
}

void add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                            double eps, Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd) {
  FORGE_CHECK(residual.defined() && h.defined(), "add_layer_norm: residual and h must be defined");
  forward<false>("add_layer_norm", x, residual, &h, weight, bias, eps, y, &mean, rstd);
}

void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, NormGrads& grads) {
  backward<false>("layer_norm_backward", dy, x, weight, &mean, rstd, grads);
}

void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd) {
  forward<true>("rms_norm", x, Tensor(), nullptr, weight, Tensor(), eps, y, nullptr, rstd);
}

void add_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps, Tensor& h,
                          Tensor& y, Tensor& rstd) {
  FORGE_CHECK(residual.defined() && h.defined(), "add_rms_norm: residual and h must be defined");
  forward<true>("add_rms_norm", x, residual, &h, weight, Tensor(), eps, y, nullptr, rstd);
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                       NormGrads& grads) {
  backward<true>("rms_norm_backward", dy, x, weight, nullptr, rstd, grads);
}

}  // namespace forge::cuda
