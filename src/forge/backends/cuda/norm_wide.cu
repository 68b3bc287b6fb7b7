// The wide-row backward of layer norm and RMS norm: a block per row (Note [CUDA norm kernels]
// in norm.cu, whose backward launcher calls norm_backward_wide and finishes the partial column
// sums with column_sum_kernel). Same math and accumulation type as norm.cu's
// norm_backward_kernel (backward_sums / backward_apply there).
#include "forge/backends/cuda/norm_wide.cuh"

#include <algorithm>
#include <type_traits>

#include "forge/backends/cuda/loops.cuh"
#include "forge/core/convert.h"

namespace forge::cuda::norm_detail {
namespace {

// A block of kThreads per row; thread t owns the row's vector t (t < C / V) and keeps its
// weight and, for part_w / part_b, its column sums in registers. Block b walks rows b, b + P,
// b + 2P, ... (P = gridDim.x) and at the end writes its partial row of each kept sum. dx null:
// the sums only.
template <class T, int V, int kThreads, bool kRms>
__global__ void __launch_bounds__(kThreads)
    norm_backward_wide_kernel(const T* __restrict__ dy,            // (R, C)
                              const T* __restrict__ x,             // (R, C)
                              const T* __restrict__ weight,        // (C) or null
                              const acc_t<T>* __restrict__ mean,   // (R), layer norm only
                              const acc_t<T>* __restrict__ rstd,   // (R)
                              T* dx,                               // (R, C) or null
                              const T* dx_add,                     // (R, C) or null: added into dx; may be dx
                              acc_t<T>* __restrict__ part_w,       // (gridDim.x, C) or null: sums of dy * xhat
                              acc_t<T>* __restrict__ part_b,       // (gridDim.x, C) or null: sums of dy
                              acc_t<T>* __restrict__ part_x,       // (gridDim.x, C) or null: sums of dx as stored
                              int64_t R, int64_t C) {
  using A = acc_t<T>;
  using P = Vec<T, V>;
  constexpr int kWarps = kThreads / kWarpSize;
  // Per-warp sums of g and g * xhat, by row parity: with two buffers one barrier per row
  // suffices (a warp writing row i + 2's slots has passed row i + 1's barrier, which every
  // thread reaches only after it has read row i's).
  __shared__ A red[2][2][kWarps];
  const int vi = static_cast<int>(threadIdx.x);
  const int lane = vi % kWarpSize, warp = vi / kWarpSize;
  const bool mine = vi < C / V;  // threads past the row's end still take part in the barrier
  const A inv_c = A(1) / static_cast<A>(C);
  // The addend is read with x and dy, before dx is written (it may be dx's own buffer: each
  // thread reads and writes only its own vector of a row).
  const T* add = dx ? dx_add : nullptr;
  P w;
  if (weight && mine) w = load_vec<T, V>(weight, vi);
  A sw[V], sb[V], sx[V];
#pragma unroll
  for (int j = 0; j < V; ++j) sw[j] = sb[j] = sx[j] = 0;

  int par = 0;
  for (int64_t row = blockIdx.x; row < R; row += gridDim.x) {  // the same rows for the whole block
    const A mu = kRms ? A(0) : mean[row];
    const A rs = rstd[row];
    P xv, gv, av;
    if (mine) {
      xv = load_vec<T, V>(x + row * C, vi);
      gv = load_vec<T, V>(dy + row * C, vi);
      if (add) av = load_vec<T, V>(add + row * C, vi);
    }
    // a1 = sum g, a2 = sum g * xhat (as backward_sums), and the column sums (as backward_apply).
    A a1 = 0, a2 = 0;
    if (mine) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A xh = (static_cast<A>(xv.v[j]) - mu) * rs;
        const A d = static_cast<A>(gv.v[j]);
        const A g = weight ? d * static_cast<A>(w.v[j]) : d;
        a1 += g;
        a2 += g * xh;
        sw[j] += d * xh;
        if constexpr (!kRms) sb[j] += d;  // (rms norm has no bias)
      }
    }
    if (!dx) continue;  // the same for the whole grid

    // The row's sums: xor butterflies, then every thread adds the warps' sums in warp order
    // (the same bits everywhere).
    if constexpr (!kRms) a1 = warp_sum(a1);
    a2 = warp_sum(a2);
    if (lane == 0) {
      red[par][0][warp] = a1;
      red[par][1][warp] = a2;
    }
    __syncthreads();
    A t1 = 0, t2 = 0;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) {
      if constexpr (!kRms) t1 += red[par][0][i];
      t2 += red[par][1][i];
    }
    par ^= 1;
    if (!mine) continue;
    const A m1 = kRms ? A(0) : t1 * inv_c;
    const A m2 = t2 * inv_c;
    P o;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const A xh = (static_cast<A>(xv.v[j]) - mu) * rs;
      const A d = static_cast<A>(gv.v[j]);
      const A g = weight ? d * static_cast<A>(w.v[j]) : d;
      const A dxv = rs * (g - m1 - xh * m2);
      o.v[j] = convert<T>(add ? dxv + static_cast<A>(av.v[j]) : dxv);
      if (part_x) sx[j] += static_cast<A>(o.v[j]);  // the value as stored
    }
    store_vec<T, V>(dx + row * C, vi, o);
  }

  // This block's partial rows (the scratch is 256-byte aligned and C % V == 0: whole vectors).
  if (!mine) return;
  Vec<A, V> ow, ob, ox;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    ow.v[j] = sw[j];
    ob.v[j] = sb[j];
    ox.v[j] = sx[j];
  }
  if (part_w) store_vec<A, V>(part_w + blockIdx.x * C, vi, ow);
  if (!kRms && part_b) store_vec<A, V>(part_b + blockIdx.x * C, vi, ob);
  if (part_x) store_vec<A, V>(part_x + blockIdx.x * C, vi, ox);
}

// The forward: thread t holds the row's vector t; the row's sums go through warp butterflies,
// then every thread adds the warps' sums in warp order (the same bits everywhere). Two-pass
// variance for layer norm (sum, then squared deviations from the mean), as norm.cu's warp
// kernel and the CPU; one sum of squares for RMS norm. Block b walks rows b, b + gridDim.x, ...
template <class T, int V, int kThreads, bool kRms>
__global__ void __launch_bounds__(kThreads)
    norm_forward_wide_kernel(const T* __restrict__ x,          // (R, C)
                             const T* __restrict__ residual,   // (R, C) or null
                             T* __restrict__ h,                // (R, C) x + residual, with residual
                             const T* __restrict__ weight,     // (C) or null
                             const T* __restrict__ bias,       // (C) or null (layer norm only)
                             T* __restrict__ y,                // (R, C)
                             acc_t<T>* __restrict__ mean,      // (R), layer norm only
                             acc_t<T>* __restrict__ rstd,      // (R)
                             int64_t R, int64_t C, acc_t<T> eps) {
  using A = acc_t<T>;
  using P = Vec<T, V>;
  constexpr int kWarps = kThreads / kWarpSize;
  // Per-warp partial sums, by row parity and pass (Note in norm_backward_wide_kernel).
  __shared__ A red[2][2][kWarps];
  const int vi = static_cast<int>(threadIdx.x);
  const int lane = vi % kWarpSize, warp = vi / kWarpSize;
  const bool mine = vi < C / V;
  P w, b;
  if (weight && mine) w = load_vec<T, V>(weight, vi);
  if (bias && mine) b = load_vec<T, V>(bias, vi);
  // The sum over the block of one value per thread, in warp order (a barrier inside).
  auto block_sum = [&](A v, int par, int pass) {
    v = warp_sum(v);
    if (lane == 0) red[par][pass][warp] = v;
    __syncthreads();
    A t = 0;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) t += red[par][pass][i];
    return t;
  };
  int par = 0;
  for (int64_t row = blockIdx.x; row < R; row += gridDim.x) {
    P v;
    A s1 = 0;
    if (mine) {
      v = residual ? read_input<T, V, true>(x + row * C, residual + row * C, h + row * C, vi)
                   : read_input<T, V, false>(x + row * C, nullptr, nullptr, vi);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A a = static_cast<A>(v.v[j]);
        s1 += kRms ? a * a : a;
      }
    }
    const A t1 = block_sum(s1, par, 0);
    A mu = 0, ss = t1;
    if constexpr (!kRms) {
      mu = t1 / static_cast<A>(C);
      A s2 = 0;
      if (mine) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const A d = static_cast<A>(v.v[j]) - mu;
          s2 += d * d;
        }
      }
      ss = block_sum(s2, par, 1);
    }
    A rs;
    if constexpr (std::is_same_v<A, float>) rs = 1.0f / sqrtf(ss / static_cast<A>(C) + eps);
    else rs = 1.0 / sqrt(ss / static_cast<A>(C) + eps);
    if (threadIdx.x == 0) {
      if constexpr (!kRms) mean[row] = mu;
      rstd[row] = rs;
    }
    par ^= 1;
    if (!mine) continue;
    store_vec<T, V>(y + row * C, vi, normalized<T, V>(v, mu, rs, w, weight != nullptr, b, bias != nullptr));
  }
}

}  // namespace

// Note [one wave of norm rows]: the grid was sms x (2048 / threads) blocks, the most an SM could
// hold by threads; by registers it holds fewer (the 256-thread RMS norm of LLaMA's 2048 columns:
// 43 registers, five blocks, 62.5% occupancy in an H200 profile), so 1056 blocks ran as 1.6 waves,
// the second with 60% of the rows in flight (39 us a call, DRAM 60% busy). A block's rows go one
// after another, each a memory round trip, so the kernel's time is about the longest chain of
// rows a block slot runs: 8 + 8 rows then, 12-13 with one wave of 660 blocks. Now the grid is the
// blocks that fit at once (resident_blocks_per_sm, loops.cuh; asked once per kernel).
// Expected: ~32 us a call, -0.2 ms a LLaMA step. The same bits (rows are independent).
template <class T>
void norm_forward_wide(bool rms, const T* x, const T* residual, T* h, const T* weight, const T* bias, T* y,
                       acc_t<T>* mean, acc_t<T>* rstd, int64_t R, int64_t C, double eps, int sms,
                       cudaStream_t stream) {
  constexpr int V = 16 / static_cast<int>(sizeof(T));
  using A = acc_t<T>;
  dispatch_wide<256>(rms, C / V, [&]<int kThreads, bool kRms>() {
    const auto kernel = norm_forward_wide_kernel<T, V, kThreads, kRms>;
    static const int per_sm = resident_blocks_per_sm(kernel, kThreads);  // Note [one wave of grid-stride blocks]
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(R, static_cast<int64_t>(sms) * per_sm));
    kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, residual, h, weight, bias, y, mean, rstd, R, C,
                                                                   static_cast<A>(eps));
  });
}

template void norm_forward_wide<float>(bool, const float*, const float*, float*, const float*, const float*, float*,
                                       float*, float*, int64_t, int64_t, double, int, cudaStream_t);
template void norm_forward_wide<bf16>(bool, const bf16*, const bf16*, bf16*, const bf16*, const bf16*, bf16*, float*,
                                      float*, int64_t, int64_t, double, int, cudaStream_t);
template void norm_forward_wide<f16>(bool, const f16*, const f16*, f16*, const f16*, const f16*, f16*, float*, float*,
                                     int64_t, int64_t, double, int, cudaStream_t);

template <class T>
void norm_backward_wide(bool rms, const T* dy, const T* x, const T* weight, const acc_t<T>* mean,
                        const acc_t<T>* rstd, T* dx, const T* dx_add, acc_t<T>* part_w, acc_t<T>* part_b,
                        acc_t<T>* part_x, int64_t R, int64_t C, int64_t parts, cudaStream_t stream) {
  constexpr int V = 16 / static_cast<int>(sizeof(T));
  dispatch_wide(rms, C / V, [&]<int kThreads, bool kRms>() {
    norm_backward_wide_kernel<T, V, kThreads, kRms><<<static_cast<unsigned>(parts), kThreads, 0, stream>>>(
        dy, x, weight, mean, rstd, dx, dx_add, part_w, part_b, part_x, R, C);
  });
}

template void norm_backward_wide<float>(bool, const float*, const float*, const float*, const float*, const float*,
                                        float*, const float*, float*, float*, float*, int64_t, int64_t, int64_t,
                                        cudaStream_t);
template void norm_backward_wide<bf16>(bool, const bf16*, const bf16*, const bf16*, const float*, const float*, bf16*,
                                       const bf16*, float*, float*, float*, int64_t, int64_t, int64_t, cudaStream_t);
template void norm_backward_wide<f16>(bool, const f16*, const f16*, const f16*, const float*, const float*, f16*,
                                      const f16*, float*, float*, float*, int64_t, int64_t, int64_t, cudaStream_t);

}  // namespace forge::cuda::norm_detail
