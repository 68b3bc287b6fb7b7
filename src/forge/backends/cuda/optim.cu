// CUDA optimizer kernels: multi-tensor AdamW and SGD, the gradient-norm pass (optionally
// unscaling by the loss scale in the same pass), clipping by a device-side norm, the
// non-finite flag and the loss-scale update. See optim.h for each function's contract and
// Note [skipped steps on the device]; the element math is backends/optim_functors.h.
//
// Math (per element, S = f32 state, f64 for f64 parameters; A = acc_t<T>):
//   adamw   x = master | p;  x *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//           x -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps);  p = T(x), master = x
//   sgd     d = g + wd p;  b = d (first) | mu b + (1 - tau) d;  d = nesterov ? d + mu b : b;
//           p -= lr d      (rounded to T after each op, as optim/sgd.cpp's ops round)
//   norm    sum_i x_i^2 in double per block, blocks summed in a fixed order; norm = sqrt
//   clip    x = T(double(x) * max_norm / (norm + 1e-6))   when norm is finite and > max_norm
//   adamw with a clip (Note [clipping inside the update], optim.h): g is first replaced, in
//           registers, by clip's value of it; everything else as adamw
// Memory contract: adamw overwrites p, m, v (and master) and reads g (with a clip too: it
// never writes g); sgd overwrites p and the momentum buffer and reads g; norm reads every
// tensor (and overwrites it with the unscaled values when given a loss scale); clip
// overwrites the tensors when it clips; no kernel writes anything else except the
// per-parameter skip counters (optim.h).
//
// Note [multi-tensor launches]: a launch covers a list of tensors. Each tensor is cut into
// chunks of kChunk elements (at least one chunk, even when empty, so that every tensor of
// the list has a block that does its bookkeeping) and every (tensor, chunk) pair gets one
// block of kThreads threads. The list travels in the kernel's parameters, as PyTorch's
// multi_tensor_apply does: per tensor its pointers, size and step, plus chunk_begin, the
// running count of chunks before each tensor. A block finds its tensor by binary search of
// chunk_begin for blockIdx.x (at most 6 steps, the same for every thread of the block). The
// parameters are __grid_constant__ (read in place from the constant bank, never copied to
// local memory) and kept under the classic 4 KB limit, so a list holds kMaxAdamW (48) AdamW
// tensors, kMaxSGD (56) SGD tensors or kMaxList (160) norm/clip tensors; longer lists take
// several launches. Nothing is copied to the device per step and nothing is synchronised.
// Inside a chunk each thread moves 16 bytes of the parameter dtype per load (4 f32, 8 bf16
// or f16, 2 f64; the f32 state of a 16-bit parameter with two 16-byte loads) when all of
// the tensor's pointers are 16-byte aligned, and element by element otherwise and for the
// tail of the last chunk.
//
// Instantiations: adamw (twice: Note [AdamW register cap]), sgd, norm and clip for f32, bf16, f16,
// f64 (20 kernels), adamw's pair variant for bf16 and f16 (Note [AdamW pairs]), plus the norm
// reduction, the flag and the scale update.
#include "forge/backends/cuda/optim.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"
#include "forge/core/env.h"

namespace forge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kChunk = 16384;                  // elements per block; a multiple of every vector width
constexpr int64_t kMaxBlocksPerLaunch = 1 << 30;   // far below gridDim.x's 2^31 - 1
constexpr int kMaxAdamW = 48;
constexpr int kMaxSGD = 56;
constexpr int kMaxList = 160;
constexpr size_t kParamBudget = 4000;              // bytes of kernel parameters (limit 4096)

// The state precision of a parameter dtype: double for f64, else float.
template <class T> using state_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// ---- device helpers ---------------------------------------------------------------------

// W consecutive elements, moved with 16-byte loads/stores when they span a multiple of 16 bytes.
template <class T, int W> struct alignas((W * sizeof(T)) % 16 == 0 ? 16 : alignof(T)) Pack {
  T v[W];
};

template <int W, class T> __device__ __forceinline__ Pack<T, W> load(const T* p) {
  return *reinterpret_cast<const Pack<T, W>*>(p);
}

template <int W, class T> __device__ __forceinline__ void store(T* p, const Pack<T, W>& x) {
  *reinterpret_cast<Pack<T, W>*>(p) = x;
}

__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The tensor of this block: the last i < count with chunk_begin[i] <= blockIdx.x.
__device__ __forceinline__ int tensor_of_block(const int32_t* chunk_begin, int count) {
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (chunk_begin[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Runs f.template operator()<W>(j) over [begin, end): W = V from begin (a multiple of V) in
// strides of the block when `vectorized`, then W = 1 for the rest.
template <int V, class F> __device__ __forceinline__ void for_chunk(int64_t begin, int64_t end, bool vectorized, F& f) {
  int64_t scalar_from = begin;
  if (vectorized) {
    scalar_from = begin + (end - begin) / V * V;
    for (int64_t j = begin + static_cast<int64_t>(threadIdx.x) * V; j < scalar_from; j += kThreads * V)
      f.template operator()<V>(j);
  }
  for (int64_t j = scalar_from + threadIdx.x; j < end; j += kThreads) f.template operator()<1>(j);
}

// for_chunk's elements, each once and with the same operator, but the vectorized ones two at a
// time: f.template pair<V>(j, j + a block's stride) while both are in range, then at most one
// single (Note [AdamW pairs]).
template <int V, class F>
__device__ __forceinline__ void for_chunk_pairs(int64_t begin, int64_t end, bool vectorized, F& f) {
  if (!vectorized) return for_chunk<V>(begin, end, false, f);
  constexpr int64_t kStride = int64_t{kThreads} * V;
  const int64_t scalar_from = begin + (end - begin) / V * V;
  int64_t j = begin + static_cast<int64_t>(threadIdx.x) * V;
  for (; j + kStride < scalar_from; j += 2 * kStride) f.template pair<V>(j, j + kStride);
  if (j < scalar_from) f.template operator()<V>(j);
  for (int64_t s = scalar_from + threadIdx.x; s < end; s += kThreads) f.template operator()<1>(s);
}

// Sum over the block, in a fixed order (shuffle tree, then warps in order); valid in thread 0.
__device__ __forceinline__ double block_sum(double x) {
  __shared__ double warp_sums[kWarps];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_down_sync(0xffffffffu, x, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  double total = 0;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
  }
  return total;
}

// ---- AdamW ------------------------------------------------------------------------------

struct AdamWEntry {
  void* p;
  const void* g;
  void* m;
  void* v;
  float* master;
  int64_t n;
  int64_t step;
  int64_t slot;
};

struct AdamWArgs {
  const float* skip;  // null: no flag this step
  int64_t* skipped;   // null: no skip counters on this device
  const double* graph_lr;     // null, or the lr to use instead of hp.lr (Note [optimizer steps in a CUDA graph])
  const double* graph_steps;  // null, or each slot's step, instead of the entries' step
  const float* clip_norm;     // null, or the norm to clip the gradients by (Note [clipping inside the update])
  double clip_max;
  fn::AdamWHyper hp;
  int32_t count;
  int32_t chunk_begin[kMaxAdamW + 1];
  AdamWEntry t[kMaxAdamW];
};
static_assert(sizeof(AdamWArgs) <= kParamBudget);

template <class T> struct AdamWChunk {
  using S = state_t<T>;
  T* p;
  const T* g;
  S* m;
  S* v;
  float* master;
  fn::AdamWScalars<S> c;
  bool clip;    // the same in every thread of the block
  double coef;  // max_norm / (norm + 1e-6), when clip

  // W elements' operands in registers.
  template <int W> struct Vec {
    Pack<T, W> p, g;
    Pack<S, W> m, v;
    Pack<float, W> x;  // the f32 master of a 16-bit weight
  };

  template <int W> __device__ __forceinline__ Vec<W> fetch(int64_t j) const {
    // A 16-bit weight is only written: its f32 master holds the value. Not reading it saves 2 of
    // the 30 bytes a bf16 parameter moves (LLaMA 0.85B: 1.7 GB a step, ~0.4 ms on an H200).
    Vec<W> e;
    if constexpr (!is_half_v<T>) e.p = load<W>(p + j);
    e.g = load<W>(g + j);
    e.m = load<W>(m + j);
    e.v = load<W>(v + j);
    if constexpr (is_half_v<T>) e.x = load<W>(master + j);
    return e;
  }

  template <int W> __device__ __forceinline__ void update(Vec<W>& e) const {
#pragma unroll
    for (int k = 0; k < W; ++k) {
      S x;
      if constexpr (is_half_v<T>) x = e.x.v[k];
      else x = e.p.v[k];
      T g_k = e.g.v[k];
      if (clip) g_k = convert<T>(fn::rn_mul(convert<double>(g_k), coef));  // as ScaleChunk would have written it
      fn::adamw_update<S>(x, e.m.v[k], e.v.v[k], convert<S>(g_k), c);
      if constexpr (is_half_v<T>) e.x.v[k] = x;
      e.p.v[k] = convert<T>(x);
    }
  }

  template <int W> __device__ __forceinline__ void put(int64_t j, const Vec<W>& e) const {
    store<W>(p + j, e.p);
    store<W>(m + j, e.m);
    store<W>(v + j, e.v);
    if constexpr (is_half_v<T>) store<W>(master + j, e.x);
  }

  template <int W> __device__ __forceinline__ void operator()(int64_t j) {
    Vec<W> e = fetch<W>(j);
    update<W>(e);
    put<W>(j, e);
  }

  // Two vectors: every load of both before the first store (Note [AdamW pairs]).
  template <int W> __device__ __forceinline__ void pair(int64_t j0, int64_t j1) {
    Vec<W> a = fetch<W>(j0), b = fetch<W>(j1);
    update<W>(a);
    update<W>(b);
    put<W>(j0, a);
    put<W>(j1, b);
  }
};

// Note [AdamW register cap] (FORGE_ADAMW_REGISTER_CAP=1): an H200 profile (ncu) had the kernel at
// 57 registers, four 256-thread blocks an SM, 50% theoretical and 46% achieved occupancy with DRAM
// 80% busy and 0.44 eligible warps a scheduler: latency-bound at the edge. (ptxas, CUDA 13, sm_90a,
// bf16, with the clip inside the update: 80 registers now, three blocks an SM.) kMinBlocks = 5 caps
// it at 45 registers with no spill (6 spills 92 bytes): five blocks, more loads in flight. The
// same arithmetic: the same bits.
// Note [AdamW pairs] (FORGE_ADAMW_PAIRS=1, 16-bit parameters): in for_chunk a thread loads one
// vector of each operand (g, m, v, master: 7 x 16 bytes for bf16), waits, computes and stores
// before its next loads, which the compiler cannot hoist above the stores (the pointers may
// alias). On an H200 the LLaMA step's AdamW moves its 23.9 GB at ~3.2 TB/s, 67% of the bandwidth
// (86% on an H100). The pair variant issues both vectors' 14 loads before the first store. ptxas
// (CUDA 13, sm_90a): the bf16 kernel takes 80 registers (three 256-thread blocks an SM), its pair
// variant 73 under __launch_bounds__(256, 3) with no spill: three blocks with twice the loads in
// flight each (f16's would spill 4 bytes at three blocks, so it runs uncapped: 110 registers, two
// blocks). Each element gets the same operations: the same bits.
template <class T, int kMinBlocks = 1, bool kPairs = false>
__global__ void __launch_bounds__(kThreads, kMinBlocks) adamw_kernel(const __grid_constant__ AdamWArgs a) {
  using S = state_t<T>;
  const int i = tensor_of_block(a.chunk_begin, a.count);
  const AdamWEntry& e = a.t[i];
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) - a.chunk_begin[i];
  if (a.skip != nullptr && *a.skip != 0.0f) {  // Note [skipped steps on the device]
    if (chunk == 0 && threadIdx.x == 0) a.skipped[e.slot] += 1;
    return;
  }
  __shared__ fn::AdamWScalars<S> scalars;
  __shared__ bool clip;
  __shared__ double coef;
  if (threadIdx.x == 0) {
    const int64_t step = a.graph_steps != nullptr ? static_cast<int64_t>(a.graph_steps[e.slot]) : e.step;
    const int64_t t = step - (a.skipped != nullptr ? a.skipped[e.slot] : 0);
    fn::AdamWHyper hp = a.hp;
    if (a.graph_lr != nullptr) hp.lr = *a.graph_lr;
    scalars = fn::adamw_scalars<S>(hp, t);
    // Note [clipping inside the update]: clip_kernel's decision and coefficient, bit for bit.
    const double norm = a.clip_norm != nullptr ? static_cast<double>(*a.clip_norm) : 0.0;
    clip = a.clip_norm != nullptr && isfinite(norm) && norm > a.clip_max;
    coef = clip ? fn::rn_div(a.clip_max, fn::rn_add(norm, 1e-6)) : 1.0;
  }
  __syncthreads();
  AdamWChunk<T> f{static_cast<T*>(e.p), static_cast<const T*>(e.g), static_cast<S*>(e.m), static_cast<S*>(e.v),
                  e.master, scalars, clip, coef};
  const int64_t begin = chunk * kChunk, end = std::min(e.n, begin + kChunk);
  const bool vectorized = aligned16(e.p) && aligned16(e.g) && aligned16(e.m) && aligned16(e.v) &&
                          (e.master == nullptr || aligned16(e.master));
  if constexpr (kPairs) for_chunk_pairs<16 / sizeof(T)>(begin, end, vectorized, f);
  else for_chunk<16 / sizeof(T)>(begin, end, vectorized, f);
}

// ---- SGD --------------------------------------------------------------------------------

struct SGDEntry {
  void* p;
  const void* g;
  void* buf;
  int64_t n;
  int64_t step;
  int64_t slot;
  int64_t buf_first_step;
};

template <class A> struct SGDArgs {
  const float* skip;
  int64_t* skipped;
  const double* graph_lr;     // as AdamWArgs
  const double* graph_steps;
  fn::SGDScalars<A> c;
  int32_t count;
  int32_t chunk_begin[kMaxSGD + 1];
  SGDEntry t[kMaxSGD];
};
static_assert(sizeof(SGDArgs<double>) <= kParamBudget);

template <class T> struct SGDChunk {
  using A = acc_t<T>;
  T* p;
  const T* g;
  T* buf;  // null without momentum
  bool first;
  fn::SGDScalars<A> c;

  template <int W> __device__ __forceinline__ void operator()(int64_t j) {
    Pack<T, W> pw = load<W>(p + j);
    const Pack<T, W> gw = load<W>(g + j);
    Pack<T, W> bw{};
    if (buf != nullptr) bw = load<W>(buf + j);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      A x = static_cast<A>(pw.v[k]), b = static_cast<A>(bw.v[k]);
      fn::sgd_update<T, A>(x, static_cast<A>(gw.v[k]), b, first, c);
      pw.v[k] = T(x);  // x and b are T values already: exact
      bw.v[k] = T(b);
    }
    store<W>(p + j, pw);
    if (buf != nullptr) store<W>(buf + j, bw);
  }
};

template <class T> __global__ void __launch_bounds__(kThreads) sgd_kernel(const __grid_constant__ SGDArgs<acc_t<T>> a) {
  const int i = tensor_of_block(a.chunk_begin, a.count);
  const SGDEntry& e = a.t[i];
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) - a.chunk_begin[i];
  if (a.skip != nullptr && *a.skip != 0.0f) {  // Note [skipped steps on the device]
    if (chunk == 0 && threadIdx.x == 0) a.skipped[e.slot] += 1;
    return;
  }
  const int64_t step = a.graph_steps != nullptr ? static_cast<int64_t>(a.graph_steps[e.slot]) : e.step;
  const int64_t t = step - (a.skipped != nullptr ? a.skipped[e.slot] : 0);
  fn::SGDScalars<acc_t<T>> c = a.c;
  if (a.graph_lr != nullptr) c.neg_lr = static_cast<acc_t<T>>(-*a.graph_lr);
  SGDChunk<T> f{static_cast<T*>(e.p), static_cast<const T*>(e.g), static_cast<T*>(e.buf),
                e.buf_first_step != 0 && t == e.buf_first_step, c};
  const int64_t begin = chunk * kChunk, end = std::min(e.n, begin + kChunk);
  const bool vectorized = aligned16(e.p) && aligned16(e.g) && (e.buf == nullptr || aligned16(e.buf));
  for_chunk<16 / sizeof(T)>(begin, end, vectorized, f);
}

// ---- norm, clip ---------------------------------------------------------------------------

struct ListEntry {
  void* x;
  int64_t n;
};

struct NormArgs {
  const float* loss_scale;  // null: no unscaling
  double* partials;         // one per block of this launch
  int32_t count;
  int32_t chunk_begin[kMaxList + 1];
  ListEntry t[kMaxList];
};
static_assert(sizeof(NormArgs) <= kParamBudget);

template <class T> struct NormChunk {
  T* x;
  bool unscale;
  double inv_scale;
  double sum;

  template <int W> __device__ __forceinline__ void operator()(int64_t j) {
    Pack<T, W> w = load<W>(x + j);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if (unscale) w.v[k] = convert<T>(fn::rn_mul(convert<double>(w.v[k]), inv_scale));
      const double d = convert<double>(w.v[k]);
      sum = fma(d, d, sum);
    }
    if (unscale) store<W>(x + j, w);
  }
};

template <class T> __global__ void __launch_bounds__(kThreads) norm_kernel(const __grid_constant__ NormArgs a) {
  const int i = tensor_of_block(a.chunk_begin, a.count);
  const ListEntry& e = a.t[i];
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) - a.chunk_begin[i];
  NormChunk<T> f{static_cast<T*>(e.x), a.loss_scale != nullptr, 0.0, 0.0};
  // torch.amp.GradScaler: inv_scale = scale.double().reciprocal().float()
  if (f.unscale) f.inv_scale = static_cast<double>(static_cast<float>(fn::rn_div(1.0, static_cast<double>(*a.loss_scale))));
  const int64_t begin = chunk * kChunk, end = std::min(e.n, begin + kChunk);
  for_chunk<16 / sizeof(T)>(begin, end, aligned16(e.x), f);
  const double total = block_sum(f.sum);
  if (threadIdx.x == 0) a.partials[blockIdx.x] = total;
}

// norm = sqrt(sum of partials), found = (sum not finite); one block.
__global__ void __launch_bounds__(kThreads) norm_finalize_kernel(const double* partials, int64_t count, float* norm,
                                                                 float* found) {
  double sum = 0;
  for (int64_t i = threadIdx.x; i < count; i += kThreads) sum += partials[i];
  const double total = block_sum(sum);
  if (threadIdx.x == 0) {
    *norm = static_cast<float>(fn::rn_sqrt(total));
    if (found != nullptr) *found = isfinite(total) ? 0.0f : 1.0f;
  }
}

struct ClipArgs {
  const float* norm;
  double max_norm;
  int32_t count;
  int32_t chunk_begin[kMaxList + 1];
  ListEntry t[kMaxList];
};
static_assert(sizeof(ClipArgs) <= kParamBudget);

template <class T> struct ScaleChunk {
  T* x;
  double coef;

  template <int W> __device__ __forceinline__ void operator()(int64_t j) {
    Pack<T, W> w = load<W>(x + j);
#pragma unroll
    for (int k = 0; k < W; ++k) w.v[k] = convert<T>(fn::rn_mul(convert<double>(w.v[k]), coef));
    store<W>(x + j, w);
  }
};

template <class T> __global__ void __launch_bounds__(kThreads) clip_kernel(const __grid_constant__ ClipArgs a) {
  const double norm = static_cast<double>(*a.norm);
  if (!(isfinite(norm) && norm > a.max_norm)) return;
  const int i = tensor_of_block(a.chunk_begin, a.count);
  const ListEntry& e = a.t[i];
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) - a.chunk_begin[i];
  ScaleChunk<T> f{static_cast<T*>(e.x), fn::rn_div(a.max_norm, fn::rn_add(norm, 1e-6))};
  const int64_t begin = chunk * kChunk, end = std::min(e.n, begin + kChunk);
  for_chunk<16 / sizeof(T)>(begin, end, aligned16(e.x), f);
}

// ---- scalars ------------------------------------------------------------------------------

__global__ void non_finite_kernel(const float* x, float* flag) { *flag = isfinite(*x) ? 0.0f : 1.0f; }

// As torch._amp_update_scale_ (aten/src/ATen/native/cuda/AmpKernels.cu).
__global__ void update_scale_kernel(float* scale, int32_t* growth_tracker, const float* found, double growth_factor,
                                    double backoff_factor, int32_t growth_interval) {
  if (*found != 0.0f) {
    *scale = static_cast<float>(fn::rn_mul(static_cast<double>(*scale), backoff_factor));
    *growth_tracker = 0;
  } else {
    const int32_t successful = *growth_tracker + 1;
    if (successful == growth_interval) {
      const float grown = static_cast<float>(fn::rn_mul(static_cast<double>(*scale), growth_factor));
      if (isfinite(grown)) *scale = grown;
      *growth_tracker = 0;
    } else {
      *growth_tracker = successful;
    }
  }
}

// ---- host side --------------------------------------------------------------------------

int64_t chunks_of(int64_t n) { return std::max<int64_t>(1, (n + kChunk - 1) / kChunk); }

// Cuts items 0..n-1 into launches of at most kMax tensors and kMaxBlocksPerLaunch blocks:
// fill(slot, item) writes item's entry at `slot` of args.t; launch(blocks) runs one list.
template <int kMax, class Args, class Numel, class Fill, class Launch>
void for_each_launch(Args& args, size_t n, const Numel& numel, const Fill& fill, const Launch& launch) {
  int32_t count = 0;
  int64_t blocks = 0;
  auto flush = [&] {
    if (count == 0) return;
    args.count = count;
    args.chunk_begin[count] = static_cast<int32_t>(blocks);
    launch(blocks);
    count = 0;
    blocks = 0;
  };
  for (size_t k = 0; k < n; ++k) {
    const int64_t c = chunks_of(numel(k));
    FORGE_CHECK(c <= kMaxBlocksPerLaunch, "optimizer kernels: a tensor of ", numel(k), " elements is too large");
    if (count == kMax || blocks + c > kMaxBlocksPerLaunch) flush();
    args.chunk_begin[count] = static_cast<int32_t>(blocks);
    fill(count, k);
    blocks += c;
    ++count;
  }
  flush();
}

// The indices of `dtypes` grouped by dtype, in the order f32, bf16, f16, f64 (stable within one).
template <class Get> std::vector<std::pair<DType, std::vector<size_t>>> by_dtype(size_t n, const Get& dtype_of) {
  std::vector<std::pair<DType, std::vector<size_t>>> out;
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    std::vector<size_t> idx;
    for (size_t k = 0; k < n; ++k)
      if (dtype_of(k) == d) idx.push_back(k);
    if (!idx.empty()) out.emplace_back(d, std::move(idx));
  }
  return out;
}

void check_on(const Tensor& t, int device, const char* op, const char* what) {
  FORGE_CHECK(t.defined() && t.is_cuda() && t.device().index == device && t.is_contiguous(), op, ": ", what,
              " must be a contiguous tensor on cuda:", device, ", got ",
              t.defined() ? t.device().str() + " " + shape_str(t.shape()) + (t.is_contiguous() ? "" : " (strided)")
                          : std::string("an undefined tensor"));
}

void check_scalar(const Tensor& t, int device, DType dtype, const char* op, const char* what) {
  check_on(t, device, op, what);
  FORGE_CHECK(t.numel() == 1 && t.dtype() == dtype, op, ": ", what, " must be a one-element ", dtype_name(dtype),
              " tensor, got ", shape_str(t.shape()), " ", dtype_name(t.dtype()));
}

// The skip flag and counters of a step (Note [skipped steps on the device]).
void check_skip(const Tensor& skip_if, const Tensor& skipped, int device, const char* op) {
  if (skip_if.defined()) {
    check_scalar(skip_if, device, DType::f32, op, "skip_if");
    FORGE_CHECK(skipped.defined(), op, ": skip_if needs the skip counters");
  }
  if (skipped.defined()) {
    check_on(skipped, device, op, "the skip counters");
    FORGE_CHECK(skipped.dtype() == DType::i64, op, ": the skip counters must be i64");
  }
}

// The optimizer's device-held lr and step counts (Note [optimizer steps in a CUDA graph]).
template <class SlotOf>
void check_graph_inputs(const GraphInputs& graph, size_t n, SlotOf slot_of, int device, const char* op) {
  if (!graph.values.defined()) return;
  check_on(graph.values, device, op, "the graph inputs");
  FORGE_CHECK(graph.values.dtype() == DType::f64 && graph.values.is_contiguous(), op,
              ": the graph inputs must be a contiguous f64 tensor");
  const int64_t len = graph.values.numel();
  FORGE_CHECK(graph.lr_index >= 0 && graph.lr_index < len && graph.steps_offset >= 0, op, ": graph inputs of ", len,
              " values have no lr at ", graph.lr_index, " or steps at ", graph.steps_offset);
  for (size_t k = 0; k < n; ++k)
    FORGE_CHECK(slot_of(k) >= 0 && graph.steps_offset + slot_of(k) < len, op, ": slot ", slot_of(k),
                " has no step count in the graph inputs (", len, " values, steps from ", graph.steps_offset, ")");
}

// A new contiguous f64 buffer on `device` (backends sit below ops/, so no forge::empty here).
Tensor device_buffer(int device, int64_t n, DType dtype) {
  auto storage = std::make_shared<Storage>(static_cast<size_t>(n) * element_size(dtype), allocator(device));
  return Tensor::make(std::move(storage), {n}, {1}, 0, dtype);
}

}  // namespace

void adamw_step(const std::vector<AdamWParam>& params, const fn::AdamWHyper& hp, const Tensor& skip_if,
                const Tensor& skipped, const GraphInputs& graph, const FusedClip& clip) {
  if (params.empty()) return;
  const int device = params[0].p.device().index;
  const int64_t slots = skipped.defined() ? skipped.numel() : 0;
  check_skip(skip_if, skipped, device, "AdamW step");
  if (clip.norm.defined()) {
    check_scalar(clip.norm, device, DType::f32, "AdamW step", "the clip norm");
    FORGE_CHECK(clip.max_norm >= 0, "AdamW step: the clip's max_norm must be >= 0, got ", clip.max_norm);
  }
  check_graph_inputs(graph, params.size(), [&](size_t k) { return params[k].slot; }, device, "AdamW step");
  for (const AdamWParam& q : params) {
    check_on(q.p, device, "AdamW step", "the parameter");
    const int64_t n = q.p.numel();
    const DType sd = q.p.dtype() == DType::f64 ? DType::f64 : DType::f32;
    const bool half = q.p.dtype() == DType::bf16 || q.p.dtype() == DType::f16;
    check_on(q.g, device, "AdamW step", "the gradient");
    check_on(q.m, device, "AdamW step", "exp_avg");
    check_on(q.v, device, "AdamW step", "exp_avg_sq");
    FORGE_CHECK(q.g.dtype() == q.p.dtype() && q.g.numel() == n && q.m.dtype() == sd && q.m.numel() == n &&
                    q.v.dtype() == sd && q.v.numel() == n,
                "AdamW step: gradient/state do not match the parameter of shape ", shape_str(q.p.shape()), " ",
                dtype_name(q.p.dtype()));
    if (half) {
      check_on(q.master, device, "AdamW step", "the f32 master copy of a 16-bit parameter");
      FORGE_CHECK(q.master.dtype() == DType::f32 && q.master.numel() == n,
                  "AdamW step: the master copy must be f32 of the parameter's size");
    } else {
      FORGE_CHECK(!q.master.defined(), "AdamW step: a ", dtype_name(q.p.dtype()), " parameter takes no master copy");
    }
    FORGE_CHECK(q.step >= 1, "AdamW step: step must be >= 1, got ", q.step);
    FORGE_CHECK(!skipped.defined() || (q.slot >= 0 && q.slot < slots), "AdamW step: slot ", q.slot,
                " outside the skip counters (", slots, ")");
  }
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  AdamWArgs args{};
  args.skip = skip_if.defined() ? static_cast<const float*>(skip_if.data_ptr()) : nullptr;
  args.skipped = skipped.defined() ? static_cast<int64_t*>(skipped.data_ptr()) : nullptr;
  args.hp = hp;
  args.graph_lr = graph.lr_ptr();
  args.graph_steps = graph.steps_ptr();
  args.clip_norm = clip.norm_ptr();
  args.clip_max = clip.max_norm;
  const bool register_cap = env::flag("FORGE_ADAMW_REGISTER_CAP"), pairs = env::flag("FORGE_ADAMW_PAIRS");
  for (const auto& group : by_dtype(params.size(), [&](size_t k) { return params[k].p.dtype(); })) {
    const DType dtype = group.first;
    const std::vector<size_t>& idx = group.second;
    dispatch_float(dtype, "AdamW step", [&]<class T>() {
      for_each_launch<kMaxAdamW>(
          args, idx.size(), [&](size_t k) { return params[idx[k]].p.numel(); },
          [&](int32_t slot, size_t k) {
            const AdamWParam& q = params[idx[k]];
            args.t[slot] = {q.p.data_ptr(), q.g.data_ptr(), q.m.data_ptr(), q.v.data_ptr(),
                            q.master.defined() ? static_cast<float*>(q.master.data_ptr()) : nullptr,
                            q.p.numel(), q.step, q.slot};
          },
          [&](int64_t blocks) {
            const auto grid = static_cast<unsigned>(blocks);
            bool paired = false;
            if constexpr (is_half_v<T>) {
              if (pairs) {  // Note [AdamW pairs]: three blocks an SM where that costs no spill
                constexpr int kBlocks = std::is_same_v<T, bf16> ? 3 : 1;
                adamw_kernel<T, kBlocks, true><<<grid, kThreads, 0, stream>>>(args);
                paired = true;
              }
            }
            if (!paired && register_cap)  // Note [AdamW register cap]
              adamw_kernel<T, 5><<<grid, kThreads, 0, stream>>>(args);
            else if (!paired)
              adamw_kernel<T><<<grid, kThreads, 0, stream>>>(args);
            FORGE_CUDA_LAUNCH_CHECK("AdamW step on cuda:", device, ": ", args.count, " ", dtype_name(dtype),
                                    " tensors, ", blocks, " blocks");
          });
    });
  }
}

void sgd_step(const std::vector<SGDParam>& params, const SGDHyper& hp, const Tensor& skip_if, const Tensor& skipped,
              const GraphInputs& graph) {
  if (params.empty()) return;
  const int device = params[0].p.device().index;
  const int64_t slots = skipped.defined() ? skipped.numel() : 0;
  const bool has_momentum = hp.momentum != 0;
  check_skip(skip_if, skipped, device, "SGD step");
  check_graph_inputs(graph, params.size(), [&](size_t k) { return params[k].slot; }, device, "SGD step");
  for (const SGDParam& q : params) {
    check_on(q.p, device, "SGD step", "the parameter");
    check_on(q.g, device, "SGD step", "the gradient");
    FORGE_CHECK(q.g.dtype() == q.p.dtype() && q.g.numel() == q.p.numel(), "SGD step: the gradient does not match the ",
                "parameter of shape ", shape_str(q.p.shape()), " ", dtype_name(q.p.dtype()));
    FORGE_CHECK(q.buf.defined() == has_momentum, "SGD step: a momentum buffer is needed exactly when momentum != 0");
    if (has_momentum) {
      check_on(q.buf, device, "SGD step", "the momentum buffer");
      FORGE_CHECK(q.buf.dtype() == q.p.dtype() && q.buf.numel() == q.p.numel(),
                  "SGD step: the momentum buffer must have the parameter's dtype and size");
    }
    FORGE_CHECK(q.step >= 1, "SGD step: step must be >= 1, got ", q.step);
    FORGE_CHECK(!skipped.defined() || (q.slot >= 0 && q.slot < slots), "SGD step: slot ", q.slot,
                " outside the skip counters (", slots, ")");
  }
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  for (const auto& group : by_dtype(params.size(), [&](size_t k) { return params[k].p.dtype(); })) {
    const DType dtype = group.first;
    const std::vector<size_t>& idx = group.second;
    dispatch_float(dtype, "SGD step", [&]<class T>() {
      using A = acc_t<T>;
      SGDArgs<A> args{};
      args.skip = skip_if.defined() ? static_cast<const float*>(skip_if.data_ptr()) : nullptr;
      args.skipped = skipped.defined() ? static_cast<int64_t*>(skipped.data_ptr()) : nullptr;
      args.graph_lr = graph.lr_ptr();
      args.graph_steps = graph.steps_ptr();
      args.c = {static_cast<A>(hp.weight_decay),
                static_cast<A>(convert<T>(hp.momentum)),
                static_cast<A>(hp.momentum),
                static_cast<A>(1.0 - hp.dampening),
                static_cast<A>(-hp.lr),
                hp.weight_decay != 0,
                has_momentum,
                hp.nesterov};
      for_each_launch<kMaxSGD>(
          args, idx.size(), [&](size_t k) { return params[idx[k]].p.numel(); },
          [&](int32_t slot, size_t k) {
            const SGDParam& q = params[idx[k]];
            args.t[slot] = {q.p.data_ptr(), q.g.data_ptr(), q.buf.defined() ? q.buf.data_ptr() : nullptr,
                            q.p.numel(), q.step, q.slot, q.buf_first_step};
          },
          [&](int64_t blocks) {
            sgd_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
            FORGE_CUDA_LAUNCH_CHECK("SGD step on cuda:", device, ": ", args.count, " ", dtype_name(dtype), " tensors, ",
                                    blocks, " blocks");
          });
    });
  }
}

void total_norm(const std::vector<Tensor>& ts, const Tensor& loss_scale, Tensor& norm, Tensor& found) {
  FORGE_CHECK(norm.defined() && norm.is_cuda(), "total_norm: the norm output must be a CUDA tensor");
  const int device = norm.device().index;
  check_scalar(norm, device, DType::f32, "total_norm", "norm");
  if (found.defined()) check_scalar(found, device, DType::f32, "total_norm", "found");
  if (loss_scale.defined()) check_scalar(loss_scale, device, DType::f32, "total_norm", "loss_scale");
  int64_t total_blocks = 0;
  for (const Tensor& t : ts) {
    check_on(t, device, "total_norm", "every tensor");
    FORGE_CHECK(is_floating(t.dtype()), "total_norm: expected floating-point tensors, got ", dtype_name(t.dtype()));
    total_blocks += chunks_of(t.numel());
  }
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  // One partial sum per block of every launch, in list order: deterministic for a given list.
  Tensor partials = device_buffer(device, std::max<int64_t>(total_blocks, 1), DType::f64);
  double* next = static_cast<double*>(partials.data_ptr());
  NormArgs args{};
  args.loss_scale = loss_scale.defined() ? static_cast<const float*>(loss_scale.data_ptr()) : nullptr;
  for (const auto& group : by_dtype(ts.size(), [&](size_t k) { return ts[k].dtype(); })) {
    const DType dtype = group.first;
    const std::vector<size_t>& idx = group.second;
    dispatch_float(dtype, "total_norm", [&]<class T>() {
      for_each_launch<kMaxList>(
          args, idx.size(), [&](size_t k) { return ts[idx[k]].numel(); },
          [&](int32_t slot, size_t k) { args.t[slot] = {ts[idx[k]].data_ptr(), ts[idx[k]].numel()}; },
          [&](int64_t blocks) {
            args.partials = next;
            norm_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
            FORGE_CUDA_LAUNCH_CHECK("total_norm on cuda:", device, ": ", args.count, " ", dtype_name(dtype),
                                    " tensors, ", blocks, " blocks");
            next += blocks;
          });
    });
  }
  norm_finalize_kernel<<<1, kThreads, 0, stream>>>(static_cast<const double*>(partials.data_ptr()), total_blocks,
                                                   static_cast<float*>(norm.data_ptr()),
                                                   found.defined() ? static_cast<float*>(found.data_ptr()) : nullptr);
  FORGE_CUDA_LAUNCH_CHECK("total_norm (final sum) on cuda:", device, ": ", total_blocks, " partial sums");
}

void clip_with_norm_(const std::vector<Tensor>& ts, const Tensor& norm, double max_norm) {
  FORGE_CHECK(norm.defined() && norm.is_cuda(), "clip_with_norm_: the norm must be a CUDA tensor");
  const int device = norm.device().index;
  check_scalar(norm, device, DType::f32, "clip_with_norm_", "norm");
  for (const Tensor& t : ts) {
    check_on(t, device, "clip_with_norm_", "every tensor");
    FORGE_CHECK(is_floating(t.dtype()), "clip_with_norm_: expected floating-point tensors, got ", dtype_name(t.dtype()));
  }
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  ClipArgs args{};
  args.norm = static_cast<const float*>(norm.data_ptr());
  args.max_norm = max_norm;
  for (const auto& group : by_dtype(ts.size(), [&](size_t k) { return ts[k].dtype(); })) {
    const DType dtype = group.first;
    const std::vector<size_t>& idx = group.second;
    dispatch_float(dtype, "clip_with_norm_", [&]<class T>() {
      for_each_launch<kMaxList>(
          args, idx.size(), [&](size_t k) { return ts[idx[k]].numel(); },
          [&](int32_t slot, size_t k) { args.t[slot] = {ts[idx[k]].data_ptr(), ts[idx[k]].numel()}; },
          [&](int64_t blocks) {
            clip_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
            FORGE_CUDA_LAUNCH_CHECK("clip_with_norm_ on cuda:", device, ": ", args.count, " ", dtype_name(dtype),
                                    " tensors, ", blocks, " blocks");
          });
    });
  }
}

void non_finite_flag(const Tensor& x, Tensor& flag) {
  FORGE_CHECK(x.defined() && x.is_cuda(), "non_finite_flag: expected a CUDA tensor");
  const int device = x.device().index;
  check_scalar(x, device, DType::f32, "non_finite_flag", "x");
  check_scalar(flag, device, DType::f32, "non_finite_flag", "flag");
  DeviceGuard guard(device);
  non_finite_kernel<<<1, 1, 0, current_stream(device)>>>(static_cast<const float*>(x.data_ptr()),
                                                         static_cast<float*>(flag.data_ptr()));
  FORGE_CUDA_LAUNCH_CHECK("non_finite_flag on cuda:", device);
}

void update_loss_scale(Tensor& scale, Tensor& growth_tracker, const Tensor& found, double growth_factor,
                       double backoff_factor, int64_t growth_interval) {
  FORGE_CHECK(scale.defined() && scale.is_cuda(), "update_loss_scale: expected a CUDA scale");
  const int device = scale.device().index;
  check_scalar(scale, device, DType::f32, "update_loss_scale", "scale");
  check_scalar(growth_tracker, device, DType::i32, "update_loss_scale", "growth_tracker");
  check_scalar(found, device, DType::f32, "update_loss_scale", "found");
  FORGE_CHECK(growth_interval >= 1 && growth_interval <= INT32_MAX, "update_loss_scale: growth_interval ",
              growth_interval, " out of range");
  DeviceGuard guard(device);
  update_scale_kernel<<<1, 1, 0, current_stream(device)>>>(
      static_cast<float*>(scale.data_ptr()), static_cast<int32_t*>(growth_tracker.data_ptr()),
      static_cast<const float*>(found.data_ptr()), growth_factor, backoff_factor, static_cast<int32_t>(growth_interval));
  FORGE_CUDA_LAUNCH_CHECK("update_loss_scale on cuda:", device);
}

}  // namespace forge::cuda
