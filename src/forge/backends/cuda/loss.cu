// Cross-entropy over the class dim, fused with a numerically stable log-softmax: CUDA
// kernels, the counterparts of backends/cpu/loss.cpp.
//
//   logits (N, V): N = B * T rows, V classes (GPT-2: N = 16384..32768, V = 50304, bf16)
//   targets (N):   a class per row, or ignore_index to skip the row
//
// Forward, per counted row n with target t (M = f32 for f32/bf16/f16, f64 for f64):
//   (m_n, s_n) = online max and sum_j exp(logits[n, j] - m_n)   (Note [online softmax])
//   lse_n  = m_n + log(s_n)
//   loss_n = lse_n - logits[n, t]
// and lse_n = loss_n = 0 for ignored rows. Then, in one more (tiny) kernel:
//   total = sum_n loss_n (in f64, a fixed tree), count = #{n : targets[n] != ignore_index}
//   mean: total / count (NaN if count == 0), scale = 1 / count (0 if count == 0); sum: scale = 1.
// Backward, from g_n (0-d: one value for every row; or one per row) and the device scale:
//   dlogits[n, j] = (exp(logits[n, j] - lse_n) - [j == t]) * g_n * scale
// with zero rows for ignored targets.
//
// Memory contract: logits, targets, lse (backward), grad and scale (backward) are read only.
// The forward overwrites lse, loss (when defined), total and scale (when defined); the
// backward overwrites dlogits. Forward scratch: N per-row losses in lse's dtype.
//
// Note [cross-entropy on the device]:
// - Each logits row is read exactly once by the forward (one block per row, 16-byte loads,
//   online max/sum in f32) and once by the backward (logits + lse in, dlogits out, 16-byte
//   loads and stores): no f32 copy of the logits, no softmax tensor. For GPT-2's bf16
//   (32768, 50304) logits that is 3.3 GB read forward and 3.3 GB read + 3.3 GB written
//   backward, the memory-bound minimum for a separate forward and backward.
// - The loss never leaves the device: the mean's count of non-ignored targets is computed by
//   the total kernel and handed to the backward as a device scalar (`scale`), so neither
//   the op nor its backward synchronises with the host (the CPU kernel returns host totals
//   instead; the ops layer branches on the device). The total is summed in f64 by one
//   block in a fixed order: deterministic, and independent of N's split over blocks.
// - Note [batched row loads]: a thread loads kBatch (4) of its row's vectors before it uses any.
//   With one load in flight behind each dependent update, 2048 threads an SM kept 32 KB in
//   flight, below what an H200's bandwidth needs at DRAM latency: the forward read GPT-2's bf16
//   (16384, 50304) logits at 2.2 TB/s (0.75 ms), the backward at 3.5 (0.94 ms; H200 trace of
//   b5a4cbe). The updates and the per-element math run in the order they did (the same bits).
// - exp is ex2.approx.ftz of one fused multiply-add for bf16/f16 logits (Note [fast softmax
//   statistics] in reduce.cuh: the forward was issue-bound at ~20 instructions an element) and
//   expf for f32; the backward and the fused kernel's second pass form p = exp(x - lse) the same way.
// - Note [dlogits in the forward]: cross_entropy_fused computes dlogits inside the forward
//   (llm.c's fused classifier) for a caller that never reads the logits again: a block copies
//   its row into shared memory while it folds the online max/sum (the forward's order: the same
//   lse and loss bits), then writes (softmax - onehot) x expected x scale over the row from that
//   copy. The logits are read once instead of twice (GPT-2, batch 16: 1.65 GB less). The result
//   is the backward's for the upstream gradient the caller expects (1, or a training loop's
//   1 / grad_accum: Note [expected loss gradient] in ops/loss.cpp), the same bits;
//   scale_dlogits multiplies by g / expected for another g (or skips, on the device, when g is
//   the expected one). A pre-pass over the targets gives the mean's
//   1 / count first. Rows wider than the block's shared memory (f32 past ~56k classes) and f64
//   keep the two kernels.
// - Targets are checked on the device (Note [device-side index checks] in reduce.cuh):
//   an out-of-range target that is not ignore_index fails the kernel, never reads outside
//   its row.
//
// Instantiations: forward and backward 4 dtypes x 2 target types; total 4 x 2.
#include "forge/backends/cuda/loss.h"

#include <array>
#include <cmath>
#include <limits>
#include <type_traits>

#include "forge/backends/cpu/loss.h"
#include "forge/backends/cuda/reduce.cuh"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"
#include "forge/core/env.h"

namespace forge::cuda {
namespace {

constexpr int kTotalThreads = 1024;

template <class T> using Lse = acc_t<T>;  // f32 for bf16/f16/f32, f64 for f64

// ---- kernels ------------------------------------------------------------------------------

// Vectors of a row each thread loads before using any (Note [batched row loads]).
constexpr int kBatch = 4;

// fn(v, w) for this thread's vectors w = threadIdx.x, + kReduceThreads, ... of a row of nv, in
// that order, B of them loaded before the first of them is passed on (so fn may write them back
// in place). B changes when loads are issued, never the order of fn's calls.
template <class T, int W, int B = kBatch, int kT = kReduceThreads, class Fn>
__device__ __forceinline__ void for_row_vectors(const Vec<T, W>* xv, int64_t nv, const Fn& fn) {
  int64_t w = threadIdx.x;
  for (; w + (B - 1) * kT < nv; w += B * kT) {
    Vec<T, W> b[B];
#pragma unroll
    for (int i = 0; i < B; ++i) b[i] = xv[w + i * kT];
#pragma unroll
    for (int i = 0; i < B; ++i) fn(b[i], w + i * kT);
  }
  for (; w < nv; w += kT) fn(xv[w], w);
}

// Note [wide cross-entropy rows] (FORGE_CE_WIDE_ROWS=1, the default): rows of 2048 vectors and more
// (GPT-2's and LLaMA's vocabularies) get a 1024-thread block each instead of 256 threads, in the
// forward and in the fused classifier alike (the same fold order in both, so the fused kernel still
// writes the two kernels' bits). The fused kernel keeps its row in shared memory, so at most two
// rows fit an SM: with 256 threads a row that was a quarter of the SM's threads (an H200 profile:
// 23% occupancy, DRAM 37% busy, 1.82 ms against 0.69 + 0.90 for the two kernels;
// docs/performance.md item 24); with 1024 it is all of them. kWideThreads threads fold their
// vectors (a few each), then wide_reduce combines the 32 warps' states: a shuffle tree in each
// warp, then warp 0's tree over the 32 (a fixed order: deterministic).
constexpr int kWideThreads = 1024;
constexpr int64_t kWideFrom = 2048;  // vectors a row from which FORGE_CE_WIDE_ROWS takes effect

template <class A, class Combine>
__device__ __forceinline__ A wide_reduce(A v, const Combine& combine, A* smem /* [kWideThreads / 32] */) {
  for (int off = 16; off > 0; off /= 2) v = combine(v, shfl_xor_any(v, off));
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    A r = smem[lane];
    for (int off = 16; off > 0; off /= 2) r = combine(r, shfl_xor_any(r, off));
    if (lane == 0) smem[0] = r;
  }
  __syncthreads();
  const A r = smem[0];
  __syncthreads();  // smem is reused by the next row
  return r;
}

// The block's reduction of st over its kT threads: group_reduce for 256, wide_reduce for 1024.
template <int kT, class M, class Merge>
__device__ __forceinline__ MaxSum<M> row_reduce(const MaxSum<M>& st, const Merge& merge,
                                                GroupScratch<MaxSum<M>>& group, MaxSum<M>* wide) {
  if constexpr (kT == kWideThreads) return wide_reduce(st, merge, wide);
  else return group_reduce(st, kReduceThreads, merge, group);
}

// One row per block iteration (all kT threads of the block on one row: kReduceThreads, or
// kWideThreads for wide rows, Note [wide cross-entropy rows]).
template <class T, class I, int kT = kReduceThreads>
__global__ void __launch_bounds__(kT)
    cross_entropy_forward_kernel(const T* __restrict__ logits,  // (N, V)
                                 const I* __restrict__ targets,  // (N)
                                 int64_t N, int64_t V, int64_t ignore_index, bool vec,
                                 Lse<T>* __restrict__ lse,       // (N)
                                 Lse<T>* __restrict__ row_loss,  // (N)
                                 Lse<T>* __restrict__ loss) {    // (N) or null
  using M = acc_t<T>;
  constexpr int W = kVec<T>;
  constexpr bool kFast = is_half_v<T>;
  __shared__ GroupScratch<MaxSum<M>> smem;
  __shared__ MaxSum<M> wide[kT == kWideThreads ? kWideThreads / 32 : 1];
  auto merge = [](const MaxSum<M>& a, const MaxSum<M>& b) { return maxsum_merge<kFast>(a, b); };
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const int64_t t = static_cast<int64_t>(targets[row]);
    if (t == ignore_index) {  // uniform over the block: every thread reads the same target
      if (threadIdx.x == 0) {
        lse[row] = Lse<T>(0);
        row_loss[row] = Lse<T>(0);
        if (loss) loss[row] = Lse<T>(0);
      }
      continue;
    }
    FORGE_KERNEL_CHECK(t >= 0 && t < V, "cross_entropy: target %lld at row %lld is out of range for %lld classes",
                       static_cast<long long>(t), static_cast<long long>(row), static_cast<long long>(V));
    const T* xr = logits + row * V;
    MaxSum<M> st = maxsum_identity<M>();
    if (vec) {
      // Note [batched row loads]: the same updates in the same order, kBatch loads in flight.
      for_row_vectors<T, W, kBatch, kT>(reinterpret_cast<const Vec<T, W>*>(xr), V / W,
                                        [&](const Vec<T, W>& v, int64_t) {
                                          M f[W];
#pragma unroll
                                          for (int k = 0; k < W; ++k) f[k] = convert<M>(v.v[k]);
                                          maxsum_update<kFast>(st, f);
                                        });
    } else {
      for (int64_t j = threadIdx.x; j < V; j += kT) {
        const M f[1] = {convert<M>(xr[j])};
        maxsum_update<kFast>(st, f);
      }
    }
    st = row_reduce<kT>(st, merge, smem, wide);
    if (threadIdx.x == 0) {
      const M row_lse = st.m + log(st.s);
      const M l = row_lse - convert<M>(xr[t]);
      lse[row] = row_lse;
      row_loss[row] = l;
      if (loss) loss[row] = l;
    }
  }
}

// One block: total = sum of the row losses (f64, fixed order), count of counted rows.
template <class T, class I>
__global__ void __launch_bounds__(kTotalThreads)
    cross_entropy_total_kernel(const Lse<T>* __restrict__ row_loss,  // (N)
                               const I* __restrict__ targets,        // (N)
                               int64_t N, int64_t ignore_index, bool mean,
                               Lse<T>* __restrict__ total,   // () or null
                               Lse<T>* __restrict__ scale) {  // () or null
  __shared__ double warp_sum[kTotalThreads / 32];
  __shared__ long long warp_count[kTotalThreads / 32];
  double sum = 0;
  long long count = 0;
  for (int64_t i = threadIdx.x; i < N; i += kTotalThreads) {
    if (row_loss) sum += static_cast<double>(row_loss[i]);  // (null: the count and scale alone)
    count += static_cast<int64_t>(targets[i]) != ignore_index ? 1 : 0;
  }
  for (int off = 16; off > 0; off /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, off);
    count += __shfl_xor_sync(0xffffffffu, count, off);
  }
  if (threadIdx.x % 32 == 0) {
    warp_sum[threadIdx.x / 32] = sum;
    warp_count[threadIdx.x / 32] = count;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  sum = 0;
  count = 0;
  for (int w = 0; w < kTotalThreads / 32; ++w) {
    sum += warp_sum[w];
    count += warp_count[w];
  }
  if (mean) {
    if (total)
      total[0] = static_cast<Lse<T>>(count > 0 ? sum / static_cast<double>(count)
                                               : __longlong_as_double(0x7ff8000000000000LL));
    if (scale) scale[0] = static_cast<Lse<T>>(count > 0 ? 1.0 / static_cast<double>(count) : 0.0);
  } else {
    if (total) total[0] = static_cast<Lse<T>>(sum);
    if (scale) scale[0] = Lse<T>(1);
  }
}

template <class T, class I>
__global__ void __launch_bounds__(kReduceThreads)
    cross_entropy_backward_kernel(const T* logits,   // (N, V); may be dlogits itself (in place)
                                  const I* __restrict__ targets,  // (N)
                                  const Lse<T>* __restrict__ lse,  // (N)
                                  const Lse<T>* __restrict__ grad,  // () or (N): grad[n * gstep]
                                  int64_t gstep,
                                  const Lse<T>* __restrict__ scale,  // () or null (= 1)
                                  int64_t N, int64_t V, int64_t ignore_index, bool vec,
                                  int64_t class_start,  // >= 0: these are classes [class_start, + V)
                                  T* dlogits) {  // (N, V)
  using M = acc_t<T>;
  constexpr int W = kVec<T>;
  constexpr bool kFast = is_half_v<T>;
  const M sc = scale ? static_cast<M>(scale[0]) : M(1);
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const int64_t t = static_cast<int64_t>(targets[row]);
    const T* xr = logits + row * V;
    T* dr = dlogits + row * V;
    if (t == ignore_index) {
      const T zero = convert<T>(0.0f);
      if (vec) {
        Vec<T, W> z;
#pragma unroll
        for (int k = 0; k < W; ++k) z.v[k] = zero;
        for (int64_t w = threadIdx.x; w < V / W; w += kReduceThreads) reinterpret_cast<Vec<T, W>*>(dr)[w] = z;
      } else {
        for (int64_t j = threadIdx.x; j < V; j += kReduceThreads) dr[j] = zero;
      }
      continue;
    }
    FORGE_KERNEL_CHECK(class_start >= 0 || (t >= 0 && t < V),
                       "cross_entropy_backward: target %lld at row %lld is out of range for %lld classes",
                       static_cast<long long>(t), static_cast<long long>(row), static_cast<long long>(V));
    // The target's column in these logits; outside [0, V): another rank's class (softmax only).
    const int64_t c = class_start < 0 ? t : t - class_start;
    const M gs = static_cast<M>(grad[row * gstep]) * sc;
    const M l = static_cast<M>(lse[row]), lb = exp_shift_of<kFast>(l);
    if (vec) {
      // In place too: each thread has loaded its batch of vectors before it writes any of them.
      for_row_vectors<T, W>(reinterpret_cast<const Vec<T, W>*>(xr), V / W, [&](const Vec<T, W>& v, int64_t w) {
        Vec<T, W> o;
#pragma unroll
        for (int k = 0; k < W; ++k) {
          const M p = exp_shifted<kFast>(convert<M>(v.v[k]), l, lb);
          o.v[k] = convert<T>((w * W + k == c ? p - M(1) : p) * gs);
        }
        reinterpret_cast<Vec<T, W>*>(dr)[w] = o;
      });
    } else {
      for (int64_t j = threadIdx.x; j < V; j += kReduceThreads) {
        const M p = exp_shifted<kFast>(convert<M>(xr[j]), l, lb);
        dr[j] = convert<T>((j == c ? p - M(1) : p) * gs);
      }
    }
  }
}

constexpr int kMaxDevices = 64;

// Note [wide cross-entropy rows]: whether a row of V classes gets a kWideThreads block.
template <class T> bool wide_rows(int64_t V, bool vec) {
  return vec && V / kVec<T> >= kWideFrom && env::flag("FORGE_CE_WIDE_ROWS");
}

// The upstream gradient the fused classifier writes for (cuda::ExpectedGrad): `host`, or scale /
// divisor in f32 as autograd forms it (scale itself for a divisor of 1).
template <class M>
__device__ __forceinline__ M expected_grad(M host, const float* __restrict__ scale, float divisor) {
  if (scale == nullptr) return host;
  const float s = scale[0];
  return static_cast<M>(divisor == 1.0f ? s : s / divisor);
}

// Note [dlogits in the forward]: one row per block iteration, the row's vectors kept in dynamic
// shared memory (V / W of them) between the two passes. Vectorized rows only (V % W == 0, aligned).
template <class T, class I, int kT = kReduceThreads>
__global__ void __launch_bounds__(kT, kT == kWideThreads ? 2 : 1)
    cross_entropy_fused_kernel(T* logits,                        // (N, V): read, then dlogits written
                               const I* __restrict__ targets,    // (N)
                               int64_t N, int64_t V, int64_t ignore_index,
                               const Lse<T>* __restrict__ scale,  // (): 1 / count (mean) or 1 (sum)
                               Lse<T>* __restrict__ lse,          // (N)
                               Lse<T>* __restrict__ row_loss,     // (N)
                               Lse<T> expected,                   // the upstream gradient expected,
                               const float* __restrict__ expected_scale,  // or this / divisor
                               float divisor) {
  using M = acc_t<T>;
  constexpr int W = kVec<T>;
  constexpr bool kFast = is_half_v<T>;
  extern __shared__ uint4 row_shared[];  // (V / W) vectors of 16 bytes
  Vec<T, W>* copy = reinterpret_cast<Vec<T, W>*>(row_shared);
  __shared__ GroupScratch<MaxSum<M>> smem;
  __shared__ MaxSum<M> wide[kT == kWideThreads ? kWideThreads / 32 : 1];
  auto merge = [](const MaxSum<M>& a, const MaxSum<M>& b) { return maxsum_merge<kFast>(a, b); };
  const M gs = expected_grad<M>(static_cast<M>(expected), expected_scale, divisor) *
               static_cast<M>(scale[0]);  // the backward's grad * scale
  const int64_t nv = V / W;
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    Vec<T, W>* xr = reinterpret_cast<Vec<T, W>*>(logits + row * V);
    const int64_t t = static_cast<int64_t>(targets[row]);
    if (t == ignore_index) {  // uniform over the block: a zero row, no shared memory touched
      Vec<T, W> z;
#pragma unroll
      for (int k = 0; k < W; ++k) z.v[k] = convert<T>(0.0f);
      for (int64_t w = threadIdx.x; w < nv; w += kT) xr[w] = z;
      if (threadIdx.x == 0) {
        lse[row] = Lse<T>(0);
        row_loss[row] = Lse<T>(0);
      }
      continue;
    }
    FORGE_KERNEL_CHECK(t >= 0 && t < V, "cross_entropy: target %lld at row %lld is out of range for %lld classes",
                       static_cast<long long>(t), static_cast<long long>(row), static_cast<long long>(V));
    // Pass 1: the forward's fold, in its order, each vector also kept in shared memory. With 256
    // threads, eight loads in flight a thread (the forward's four, twice): two blocks an SM fit
    // beside 100 KB rows, a quarter of the forward's threads; with kWideThreads, four.
    MaxSum<M> st = maxsum_identity<M>();
    constexpr int kLoads = kT == kWideThreads ? kBatch : 2 * kBatch;
    for_row_vectors<T, W, kLoads, kT>(xr, nv, [&](const Vec<T, W>& v, int64_t w) {
      copy[w] = v;
      M f[W];
#pragma unroll
      for (int k = 0; k < W; ++k) f[k] = convert<M>(v.v[k]);
      maxsum_update<kFast>(st, f);
    });
    st = row_reduce<kT>(st, merge, smem, wide);  // every thread gets it; the copy is complete
    const M l = st.m + log(st.s), lb = exp_shift_of<kFast>(l);
    if (threadIdx.x == 0) {
      lse[row] = l;
      row_loss[row] = l - convert<M>(reinterpret_cast<const T*>(copy)[t]);
    }
    // Pass 2: the backward's arithmetic from the copy, written over the row.
    for (int64_t w = threadIdx.x; w < nv; w += kT) {
      const Vec<T, W> v = copy[w];
      Vec<T, W> o;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const M p = exp_shifted<kFast>(convert<M>(v.v[k]), l, lb);
        o.v[k] = convert<T>((w * W + k == t ? p - M(1) : p) * gs);
      }
      xr[w] = o;
    }
    __syncthreads();  // every thread is done with the copy before the next row overwrites it
  }
}

// out[i] = T(M(x[i]) * (grad / expected)) over n elements, x written for an upstream gradient of
// `expected` (Note [expected loss gradient] in ops/loss.cpp); in place (out == x), nothing when
// grad == expected (the device's value: no host synchronisation). With expected = 1 the factor is
// grad itself. Vectors of W where `vec`.
template <class T>
__global__ void __launch_bounds__(kReduceThreads)
    scale_dlogits_kernel(const T* x, const Lse<T>* __restrict__ grad, int64_t n, bool in_place, bool vec, T* out,
                         Lse<T> expected, const float* __restrict__ expected_scale, float divisor) {
  using M = acc_t<T>;
  constexpr int W = kVec<T>;
  const M e = expected_grad<M>(static_cast<M>(expected), expected_scale, divisor);
  if (in_place && static_cast<M>(grad[0]) == e) return;
  const M g = static_cast<M>(grad[0]) / e;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kReduceThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kReduceThreads + threadIdx.x;
  if (vec) {
    const auto* xv = reinterpret_cast<const Vec<T, W>*>(x);
    auto* ov = reinterpret_cast<Vec<T, W>*>(out);
    for (int64_t i = first; i < n / W; i += stride) {
      Vec<T, W> v = xv[i];
#pragma unroll
      for (int k = 0; k < W; ++k) v.v[k] = convert<T>(convert<M>(v.v[k]) * g);
      ov[i] = v;
    }
  } else {
    for (int64_t i = first; i < n; i += stride) out[i] = convert<T>(convert<M>(x[i]) * g);
  }
}

// ---- host side ----------------------------------------------------------------------------

struct RowsV {
  int64_t N = 0, V = 0;
};

RowsV rows_of(const char* op, const Tensor& logits, const Tensor& targets) {
  FORGE_CHECK(logits.dim() >= 1, op, ": logits must have a class dim, got shape ", logits.shape());
  const int64_t V = logits.shape().back(), N = targets.numel();
  FORGE_CHECK(logits.is_cuda() && targets.device() == logits.device() && logits.is_contiguous() &&
                  targets.is_contiguous() && logits.numel() == N * V,
              op, ": the CUDA kernel needs contiguous logits of N * V elements and N contiguous targets on one GPU, "
                  "got logits ", logits.shape(), " on ", logits.device().str(), " and targets ", targets.shape(), " on ",
              targets.device().str());
  return {N, V};
}

void check_buffer(const char* op, const char* what, const Tensor& t, const Tensor& logits, int64_t numel, DType dtype) {
  FORGE_CHECK(t.device() == logits.device() && t.is_contiguous() && t.numel() == numel && t.dtype() == dtype, op,
              ": bad ", what, " buffer: expected ", numel, " contiguous ", dtype_name(dtype), " on ",
              logits.device().str(), ", got ", t.shape(), " ", dtype_name(t.dtype()), " on ", t.device().str());
}

}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, bool mean,
                           Tensor& loss, Tensor& lse, Tensor& total, Tensor& scale) {
  const char* op = "cross_entropy";
  const auto [N, V] = rows_of(op, logits, targets);
  const DType sd = cpu::cross_entropy_lse_dtype(logits.dtype());
  check_buffer(op, "lse", lse, logits, N, sd);
  if (loss.defined()) check_buffer(op, "loss", loss, logits, N, sd);
  if (total.defined()) check_buffer(op, "total", total, logits, 1, sd);
  if (scale.defined()) check_buffer(op, "scale", scale, logits, 1, sd);
  const int device = logits.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  dispatch_index(targets.dtype(), op, [&]<class I>() {
    dispatch_float(logits.dtype(), op, [&]<class T>() {
      using S = Lse<T>;
      const T* px = static_cast<const T*>(logits.data_ptr());
      const I* pt = static_cast<const I*>(targets.data_ptr());
      const Tensor row_loss = device_buffer(device, {N}, sd);
      if (N > 0) {
        const bool vec = V % kVec<T> == 0 && aligned16(px);
        // Note [one wave of grid-stride blocks] (loops.cuh): as many blocks as fit at once.
        static const int per_sm = resident_blocks_per_sm(cross_entropy_forward_kernel<T, I>, kReduceThreads);
        static const int wide_per_sm =
            resident_blocks_per_sm(cross_entropy_forward_kernel<T, I, kWideThreads>, kWideThreads);
        if (wide_rows<T>(V, vec))  // Note [wide cross-entropy rows]
          cross_entropy_forward_kernel<T, I, kWideThreads><<<grid_blocks(device, N, wide_per_sm), kWideThreads, 0,
                                                             stream>>>(
              px, pt, N, V, ignore_index, vec, static_cast<S*>(lse.data_ptr()), static_cast<S*>(row_loss.data_ptr()),
              loss.defined() ? static_cast<S*>(loss.data_ptr()) : nullptr);
        else
          cross_entropy_forward_kernel<T, I><<<grid_blocks(device, N, per_sm), kReduceThreads, 0, stream>>>(
              px, pt, N, V, ignore_index, vec, static_cast<S*>(lse.data_ptr()), static_cast<S*>(row_loss.data_ptr()),
              loss.defined() ? static_cast<S*>(loss.data_ptr()) : nullptr);
        FORGE_CUDA_LAUNCH_CHECK(op, ": logits ", logits.shape(), " ", dtype_name(logits.dtype()), ", targets ",
                                targets.shape(), " ", dtype_name(targets.dtype()));
      }
      if (total.defined() || scale.defined()) {
        cross_entropy_total_kernel<T, I><<<1, kTotalThreads, 0, stream>>>(
            static_cast<const S*>(row_loss.data_ptr()), pt, N, ignore_index, mean,
            total.defined() ? static_cast<S*>(total.data_ptr()) : nullptr,
            scale.defined() ? static_cast<S*>(scale.data_ptr()) : nullptr);
        FORGE_CUDA_LAUNCH_CHECK(op, " (total): ", N, " rows");
      }
    });
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& grad,
                            const Tensor& scale, int64_t ignore_index, Tensor& dlogits, int64_t class_start) {
  const char* op = "cross_entropy_backward";
  const auto [N, V] = rows_of(op, logits, targets);
  const DType sd = cpu::cross_entropy_lse_dtype(logits.dtype());
  check_buffer(op, "lse", lse, logits, N, sd);
  FORGE_CHECK(grad.device() == logits.device() && grad.is_contiguous() && grad.dtype() == sd &&
                  (grad.dim() == 0 || grad.numel() == N),
              op, ": grad must be 0-d or hold one value per row, contiguous, of the loss dtype (", dtype_name(sd), "), on ",
              logits.device().str(), "; got ", grad.shape(), " ", dtype_name(grad.dtype()), " for ", N, " rows");
  if (scale.defined()) check_buffer(op, "scale", scale, logits, 1, sd);
  check_buffer(op, "dlogits", dlogits, logits, N * V, logits.dtype());
  if (N == 0 || V == 0) return;
  const int device = logits.device().index;
  DeviceGuard guard(device);
  dispatch_index(targets.dtype(), op, [&]<class I>() {
    dispatch_float(logits.dtype(), op, [&]<class T>() {
      using S = Lse<T>;
      const T* px = static_cast<const T*>(logits.data_ptr());
      T* pd = static_cast<T*>(dlogits.data_ptr());
      const bool vec = V % kVec<T> == 0 && aligned16(px) && aligned16(pd);
      // Note [one wave of grid-stride blocks] (loops.cuh): as many blocks as fit at once.
      static const int per_sm = resident_blocks_per_sm(cross_entropy_backward_kernel<T, I>, kReduceThreads);
      cross_entropy_backward_kernel<T, I><<<grid_blocks(device, N, per_sm), kReduceThreads, 0, current_stream(device)>>>(
          px, static_cast<const I*>(targets.data_ptr()), static_cast<const S*>(lse.data_ptr()),
          static_cast<const S*>(grad.data_ptr()), grad.dim() == 0 ? 0 : 1,
          scale.defined() ? static_cast<const S*>(scale.data_ptr()) : nullptr, N, V, ignore_index, vec, class_start,
          pd);
      FORGE_CUDA_LAUNCH_CHECK(op, ": logits ", logits.shape(), " ", dtype_name(logits.dtype()), ", targets ",
                              targets.shape(), " ", dtype_name(targets.dtype()));
    });
  });
}

namespace {
void check_expected(const char* op, const ExpectedGrad& e, const Tensor& on) {
  if (e.scale.defined()) {
    FORGE_CHECK(e.scale.dim() == 0 && e.scale.dtype() == DType::f32 && e.scale.device() == on.device() &&
                    e.divisor >= 1 && e.divisor <= (int64_t{1} << 24),
                op, ": the expected upstream gradient's scale must be a 0-d f32 tensor on ", on.device().str(),
                " with a divisor in [1, 2^24], got ", dtype_name(e.scale.dtype()), " of shape ", e.scale.shape(),
                " on ", e.scale.device().str(), ", divisor ", e.divisor);
  } else {
    FORGE_CHECK(std::isfinite(e.value) && e.value > 0.0f, op,
                ": the expected upstream gradient must be finite and > 0, got ", e.value);
  }
}
const float* expected_scale_ptr(const ExpectedGrad& e) {
  return e.scale.defined() ? static_cast<const float*>(e.scale.data_ptr()) : nullptr;
}
}  // namespace

bool cross_entropy_fused(Tensor& logits, const Tensor& targets, int64_t ignore_index, bool mean, Tensor& lse,
                         Tensor& total, Tensor& scale, const ExpectedGrad& expected) {
  const char* op = "cross_entropy";
  check_expected(op, expected, logits);
  const auto [N, V] = rows_of(op, logits, targets);
  const DType sd = cpu::cross_entropy_lse_dtype(logits.dtype());
  check_buffer(op, "lse", lse, logits, N, sd);
  check_buffer(op, "total", total, logits, 1, sd);
  check_buffer(op, "scale", scale, logits, 1, sd);
  if (logits.dtype() == DType::f64 || N == 0 || V == 0) return false;
  const int device = logits.device().index;
  DeviceGuard guard(device);
  bool ran = false;
  dispatch_index(targets.dtype(), op, [&]<class I>() {
    dispatch_float(logits.dtype(), op, [&]<class T>() {
      if constexpr (!std::is_same_v<T, double>) {
        using S = Lse<T>;
        T* px = static_cast<T*>(logits.data_ptr());
        if (V % kVec<T> != 0 || !aligned16(px)) return;
        const size_t bytes = static_cast<size_t>(V) * sizeof(T);
        // The kernel may take the device's whole opt-in shared memory (less 1 KB for its own and
        // the system's): set once per device and instantiation, on the first call (a warm-up step,
        // before any CUDA graph capture).
        // Note [wide cross-entropy rows]: the forward kernel's block size for these rows, so that
        // the fold runs in the same order.
        const bool wide = wide_rows<T>(V, true);
        const int threads = wide ? kWideThreads : kReduceThreads;
        auto kernel = wide ? cross_entropy_fused_kernel<T, I, kWideThreads> : cross_entropy_fused_kernel<T, I>;
        static std::array<std::array<int, 2>, kMaxDevices> optin{};  // 0: not set yet on that device
        FORGE_CHECK(device < kMaxDevices, op, ": device index ", device, " beyond ", kMaxDevices);
        int& limit = optin[device][wide ? 1 : 0];
        if (limit == 0) {
          int v = 0;
          FORGE_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
          FORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, v - 1024));
          limit = v - 1024;
        }
        if (bytes > static_cast<size_t>(limit)) return;
        int per_sm = 0;
        FORGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, bytes));
        if (per_sm < 1) return;
        const cudaStream_t stream = current_stream(device);
        const I* pt = static_cast<const I*>(targets.data_ptr());
        S* ps = static_cast<S*>(scale.data_ptr());
        // The mean's 1 / count (or 1) before any row needs it.
        cross_entropy_total_kernel<T, I><<<1, kTotalThreads, 0, stream>>>(nullptr, pt, N, ignore_index, mean, nullptr,
                                                                          ps);
        FORGE_CUDA_LAUNCH_CHECK(op, " (count): ", N, " rows");
        const Tensor row_loss = device_buffer(device, {N}, sd);
        kernel<<<grid_blocks(device, N, per_sm), threads, bytes, stream>>>(
            px, pt, N, V, ignore_index, ps, static_cast<S*>(lse.data_ptr()), static_cast<S*>(row_loss.data_ptr()),
            static_cast<S>(expected.value), expected_scale_ptr(expected), static_cast<float>(expected.divisor));
        FORGE_CUDA_LAUNCH_CHECK(op, " (fused with its backward): logits ", logits.shape(), " ",
                                dtype_name(logits.dtype()), ", targets ", targets.shape(), " ",
                                dtype_name(targets.dtype()));
        cross_entropy_total_kernel<T, I><<<1, kTotalThreads, 0, stream>>>(
            static_cast<const S*>(row_loss.data_ptr()), pt, N, ignore_index, mean, static_cast<S*>(total.data_ptr()),
            nullptr);
        FORGE_CUDA_LAUNCH_CHECK(op, " (total): ", N, " rows");
        ran = true;
      }
    });
  });
  return ran;
}

void scale_dlogits(const Tensor& dlogits, const Tensor& grad, Tensor& out, const ExpectedGrad& expected) {
  const char* op = "cross_entropy backward";
  check_expected(op, expected, dlogits);
  const DType sd = cpu::cross_entropy_lse_dtype(dlogits.dtype());
  FORGE_CHECK(dlogits.is_cuda() && dlogits.is_contiguous() && out.is_contiguous() && out.device() == dlogits.device() &&
                  out.dtype() == dlogits.dtype() && out.numel() == dlogits.numel() && grad.dim() == 0 &&
                  grad.dtype() == sd && grad.device() == dlogits.device(),
              op, ": expected contiguous dlogits and out of one dtype and size and a 0-d ", dtype_name(sd),
              " grad on one GPU, got ", dlogits.shape(), ", ", out.shape(), " and ", grad.shape());
  const int64_t n = dlogits.numel();
  if (n == 0) return;
  const int device = dlogits.device().index;
  DeviceGuard guard(device);
  dispatch_float(dlogits.dtype(), op, [&]<class T>() {
    const T* px = static_cast<const T*>(dlogits.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const bool vec = n % kVec<T> == 0 && aligned16(px) && aligned16(po);
    scale_dlogits_kernel<T><<<grid_blocks(device, (n + kReduceThreads - 1) / kReduceThreads, 8), kReduceThreads, 0,
                              current_stream(device)>>>(px, static_cast<const Lse<T>*>(grad.data_ptr()), n,
                                                        px == po, vec, po, static_cast<Lse<T>>(expected.value),
                                                        expected_scale_ptr(expected),
                                                        static_cast<float>(expected.divisor));
    FORGE_CUDA_LAUNCH_CHECK(op, " (times the upstream gradient): ", dlogits.shape(), " ", dtype_name(dlogits.dtype()));
  });
}

}  // namespace forge::cuda
