// CUDA scaled dot-product attention from cuBLASLt GEMMs and a fused softmax. See
// attention.h for the contract and backends/cpu/attention.h for the math (the CPU kernel
// is the reference: same conventions, same results to rounding).
//
// Note [attention as GEMMs]
// Shapes: q (B, H, T, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv), G = H / Hkv query heads per
// kv head (query head h reads kv head h / G). The unit of work is one (b, g) pair, an
// "item": the G query heads of kv head g are stacked into one (G*T, D) matrix Qg (row
// i*T + t is query t of head g*G + i), so every GEMM of the item reads its kv head once and
// GQA's sums over a group are the GEMMs' own reductions over G*T:
//
//   forward                                        backward (dO = dL/dO)
//   S  = scale Qg K^T        (G*T, S)  GEMM        S  = scale Qg K^T              GEMM
//   P, lse = softmax(S)      (G*T, S)  kernel      dP = dOg V^T        (G*T, S)   GEMM
//   Og = P V                 (G*T, Dv) GEMM        P  = exp(S - lse), masked      kernel
//                                                  dS = P (dP - delta), delta = rowsum(dOg Og)
//                                                  dV = P^T dOg        (S, Dv)    GEMM
//                                                  dQg = scale dS K    (G*T, D)   GEMM
//                                                  dK = scale dS^T Qg  (S, D)     GEMM
//
// The softmax kernels give a warp to a row: f32 math (f64 for f64), an online max/sum pass
// over the allowed keys, then a pass writing P (zeros where masked) in the compute dtype
// over S in place, and lse = max + log(sum) in f32. A row with no allowed key gets P = 0 and
// lse = -inf, hence a zero output row and zero gradients (as the CPU). S, P, dP and dS are
// rounded to the compute dtype between the GEMMs, as PyTorch's math attention does.
//
// Items are batched: a GEMM covers a chunk of items with one batch stride per operand. The
// batch stride of an item along b is the tensor's b stride, along g its head stride times G;
// when b and g merge into one stride for every operand (contiguous (B, H, T, D) tensors) a
// chunk runs over all B*Hkv items, else the GEMMs batch over the larger of B and Hkv and loop
// over the other (the (B, T, H, D) layout of a fused QKV projection: for GPT-2, 12 calls of
// batch B per GEMM, and no copy of q, k, v). Stacking G > 1 heads needs each tensor's head
// stride to be T times its row stride; q and dout that do not have it (and any tensor whose
// last dim is not contiguous) are copied to a contiguous layout first. The scratch buffers
// hold at most set_attention_scratch_bytes() bytes of scores each, which bounds the chunk.
//
// Memory: forward one (chunk, G*T, S) scratch; backward two. Nothing of size (T, S) is
// saved between forward and backward: P is recomputed from the lse.
//
// Note [attention back-ends]
// attention_forward / attention_backward run the first of three back-ends that takes the
// problem, in this order:
//   1. cuDNN's fused attention (cudnn_attention.h, Note [cuDNN attention]): bf16 / f16, head
//      dims up to 128, no explicit mask, causal only with T <= S; when cuDNN builds a plan;
//   2. forge's flash-attention kernels (flash_attention.h, Note [flash attention]): bf16 /
//      f16, D == Dv in {64, 128}, no explicit mask, unless FORGE_FLASH_ATTENTION=0;
//   3. the composition of GEMMs and a fused softmax below (any dtype, mask, shape).
// set_attention_backend() starts the list lower (flash: skip cuDNN; composed: only 3); the
// automatic order puts cuDNN first because it was faster than forge's flash kernels
// forward and backward on every shape `forge bench attention` measured
// (benchmarks/results/attention_*.md). All three write the same lse (natural-log
// logsumexp of the scaled scores, f32), so forward and backward decide independently, e.g.
// a misaligned upstream gradient sends only the backward down another path.
// Deterministic backward (set_deterministic_attention(true), forge train's
// run.deterministic): the flash backward adds dQ with f32 atomics, so it is skipped; cuDNN
// runs its deterministic algorithm, and where it has none the composed path (no atomics)
// runs.
#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <cmath>
#include <limits>
#include <type_traits>

#include "forge/backends/cuda/attention.h"
#include "forge/backends/cuda/blaslt.h"
#include "forge/backends/cuda/cudnn_attention.h"
#include "forge/backends/cuda/flash_attention.h"
#include "forge/backends/cuda/loops.cuh"
#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/core/dispatch.h"

namespace forge::cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int kRowWarps = kRowThreads / 32;

std::atomic<int64_t> g_scratch_bytes{int64_t{256} << 20};

// ---- device helpers ----------------------------------------------------------------------

template <class A> __device__ __forceinline__ A dev_exp(A x) {
  if constexpr (std::is_same_v<A, float>) return expf(x);
  else return exp(x);
}
template <class A> __device__ __forceinline__ A dev_log(A x) {
  if constexpr (std::is_same_v<A, float>) return logf(x);
  else return log(x);
}
template <class A> __device__ __forceinline__ A neg_inf() { return -std::numeric_limits<A>::infinity(); }
// The larger of a and b, NaN when either is: a row with a NaN score (a NaN in q or k) gets a NaN
// max, so its logsumexp and probabilities are NaN as in PyTorch, never the zeros of a fully
// masked row (issue 35; the CPU's kernel does the same).
template <class A> __device__ __forceinline__ A nan_max(A a, A b) { return a != a ? a : b != b ? b : a > b ? a : b; }

template <class A> __device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// The optional bool mask, element (b, h, t, j) at p[b*s0 + h*s1 + t*s2 + j*s3].
struct MaskRef {
  const bool* p = nullptr;
  int64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
};

// A 4-D tensor's first element and strides, for per-row reads (dO and O in backward).
struct Rows4 {
  const void* p = nullptr;
  int64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
};

// Which (b, h, t) a scratch row is. Row r of a chunk: item j = r / (G*T), then head
// i = (r % (G*T)) / T of the item's group and query t; the item's linear index
// L = L0 + j * step is b * Hkv + g.
struct RowMap {
  int64_t L0, step, Hkv, G, T, S;

  __device__ __forceinline__ void at(int64_t r, int64_t& b, int64_t& h, int64_t& t) const {
    const int64_t per_item = G * T;
    const int64_t j = r / per_item;
    const int64_t w = r - j * per_item;
    const int64_t i = w / T;
    t = w - i * T;
    const int64_t L = L0 + j * step;
    b = L / Hkv;
    h = (L - b * Hkv) * G + i;
  }
  // Keys [0, limit) may be attended by query t (before the mask): bottom-right causal.
  __device__ __forceinline__ int64_t limit(int64_t t, bool causal) const {
    if (!causal) return S;
    const int64_t last = t + (S - T);  // the last key query t may attend to
    return last < 0 ? 0 : (last + 1 < S ? last + 1 : S);
  }
};

template <class T, class A, int V> __device__ __forceinline__ void load_row(const T* row, int64_t j0, A (&x)[V]) {
  if constexpr (V == 1) {
    x[0] = static_cast<A>(row[j0]);
  } else {
    const Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(row + j0);
#pragma unroll
    for (int e = 0; e < V; ++e) x[e] = static_cast<A>(v.v[e]);
  }
}
template <class T, class A, int V> __device__ __forceinline__ void store_row(T* row, int64_t j0, const A (&x)[V]) {
  if constexpr (V == 1) {
    row[j0] = T(x[0]);
  } else {
    Vec<T, V> v;
#pragma unroll
    for (int e = 0; e < V; ++e) v.v[e] = T(x[e]);
    *reinterpret_cast<Vec<T, V>*>(row + j0) = v;
  }
}

// ---- kernels -----------------------------------------------------------------------------

// One warp per row of sp (rows, S): scores in, probabilities out (in place); lse (B, H, T).
// V elements per access (V > 1 needs S % V == 0; the buffer is 16-byte aligned).
template <class T, class A, int V>
__global__ void __launch_bounds__(kRowThreads)
    attention_softmax_kernel(T* __restrict__ sp,    // (rows, S)
                             A* __restrict__ lse,   // (B, H, T)
                             MaskRef mask, RowMap map, int64_t H, int64_t rows, bool causal) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (r >= rows) return;  // a whole warp at once: no block-level synchronisation below
  int64_t b, h, t;
  map.at(r, b, h, t);
  const int64_t S = map.S, limit = map.limit(t, causal);
  T* row = sp + r * S;
  const bool* mrow = mask.p ? mask.p + b * mask.s0 + h * mask.s1 + t * mask.s2 : nullptr;
  auto allowed = [&](int64_t j) { return j < limit && (mrow == nullptr || mrow[j * mask.s3]); };

  // Pass 1: running max and sum of exp over the allowed keys.
  A m = neg_inf<A>(), l = 0;
  for (int64_t j0 = static_cast<int64_t>(lane) * V; j0 < limit; j0 += 32 * V) {
    A x[V];
    load_row<T, A, V>(row, j0, x);
    A mv = neg_inf<A>();
#pragma unroll
    for (int e = 0; e < V; ++e) {
      if (!allowed(j0 + e)) x[e] = neg_inf<A>();
      mv = nan_max(mv, x[e]);
    }
    if (mv == neg_inf<A>()) continue;
    if (mv > m || mv != mv) {
      l *= dev_exp(m - mv);  // exp(-inf) = 0 on the first allowed key; NaN for a NaN score
      m = mv;
    }
#pragma unroll
    for (int e = 0; e < V; ++e) l += dev_exp(x[e] - m);  // masked: exp(-inf) = 0
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const A m2 = __shfl_xor_sync(0xffffffffu, m, off);
    const A l2 = __shfl_xor_sync(0xffffffffu, l, off);
    const A mn = nan_max(m, m2);
    if (mn != neg_inf<A>())
      l = (m == neg_inf<A>() ? A(0) : l * dev_exp(m - mn)) + (m2 == neg_inf<A>() ? A(0) : l2 * dev_exp(m2 - mn));
    m = mn;
  }
  const A row_lse = m == neg_inf<A>() ? m : m + dev_log(l);
  if (lane == 0) lse[(b * H + h) * map.T + t] = row_lse;

  // Pass 2: P = exp(S - lse) where allowed, 0 elsewhere (every key, so P V reads no garbage).
  const bool any = row_lse != neg_inf<A>();
  for (int64_t j0 = static_cast<int64_t>(lane) * V; j0 < S; j0 += 32 * V) {
    A p[V];
    if (any && j0 < limit) {
      load_row<T, A, V>(row, j0, p);
#pragma unroll
      for (int e = 0; e < V; ++e) p[e] = allowed(j0 + e) ? dev_exp(p[e] - row_lse) : A(0);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) p[e] = 0;
    }
    store_row<T, A, V>(row, j0, p);
  }
}

// One warp per row: recomputed scores in sp become P = exp(S - lse) (masked: 0), and, when
// dpds is given, dP in dpds becomes dS = P (dP - delta), delta = dO_t . O_t.
template <class T, class A, int V>
__global__ void __launch_bounds__(kRowThreads)
    attention_softmax_backward_kernel(T* __restrict__ sp,        // (rows, S)
                                      T* __restrict__ dpds,      // (rows, S) or null
                                      const A* __restrict__ lse,  // (B, H, T)
                                      Rows4 dout, Rows4 out, int64_t Dv, MaskRef mask, RowMap map, int64_t H,
                                      int64_t rows, bool causal) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (r >= rows) return;
  int64_t b, h, t;
  map.at(r, b, h, t);
  const int64_t S = map.S, limit = map.limit(t, causal);
  const bool* mrow = mask.p ? mask.p + b * mask.s0 + h * mask.s1 + t * mask.s2 : nullptr;
  auto allowed = [&](int64_t j) { return j < limit && (mrow == nullptr || mrow[j * mask.s3]); };
  A delta = 0;
  if (dpds) {
    const T* go = static_cast<const T*>(dout.p) + b * dout.s0 + h * dout.s1 + t * dout.s2;
    const T* o = static_cast<const T*>(out.p) + b * out.s0 + h * out.s1 + t * out.s2;
    for (int64_t d = lane; d < Dv; d += 32) delta += static_cast<A>(go[d * dout.s3]) * static_cast<A>(o[d * out.s3]);
    delta = warp_sum(delta);
  }
  const A L = lse[(b * H + h) * map.T + t];
  const bool any = L != neg_inf<A>();
  T* prow = sp + r * S;
  T* drow = dpds ? dpds + r * S : nullptr;
  for (int64_t j0 = static_cast<int64_t>(lane) * V; j0 < S; j0 += 32 * V) {
    A p[V], ds[V];
#pragma unroll
    for (int e = 0; e < V; ++e) p[e] = ds[e] = 0;
    if (any && j0 < limit) {
      load_row<T, A, V>(prow, j0, p);
#pragma unroll
      for (int e = 0; e < V; ++e) p[e] = allowed(j0 + e) ? dev_exp(p[e] - L) : A(0);
      if (drow) {
        load_row<T, A, V>(drow, j0, ds);
#pragma unroll
        for (int e = 0; e < V; ++e) ds[e] = p[e] * (ds[e] - delta);
      }
    }
    store_row<T, A, V>(prow, j0, p);
    if (drow) store_row<T, A, V>(drow, j0, ds);
  }
}

// ---- host side ---------------------------------------------------------------------------

// A 4-D (B, Hx, R, C) tensor as one row-major matrix per (b, kv head g): the G heads of
// the group stacked, (G*R, C) with row stride ld, starting at base + b*sb + g*sg.
struct Stack {
  Tensor t;  // the tensor read or written (the argument itself, or a contiguous stand-in)
  const char* base = nullptr;
  int64_t sb = 0, sg = 0, ld = 1;
};

bool stackable(const Tensor& t, int64_t G, Stack& s) {
  const int64_t R = t.size(2), C = t.size(3), cmin = std::max<int64_t>(1, C);
  if (C > 1 && t.stride(3) != 1) return false;
  int64_t ld;
  if (G == 1) {
    if (R > 1 && t.stride(2) < cmin) return false;
    ld = R > 1 ? t.stride(2) : cmin;
  } else if (R == 1) {  // the group's heads are the rows
    if (t.stride(1) < cmin) return false;
    ld = t.stride(1);
  } else {
    if (t.stride(1) != R * t.stride(2) || t.stride(2) < cmin) return false;
    ld = t.stride(2);
  }
  s.t = t;
  s.base = static_cast<const char*>(t.data_ptr());
  s.sb = t.stride(0);
  s.sg = G * t.stride(1);
  s.ld = ld;
  return true;
}

// t stacked in place, or a contiguous copy of it stacked.
Stack stacked_input(const Tensor& t, int64_t G) {
  Stack s;
  if (stackable(t, G, s)) return s;
  Tensor c = blas::device_empty(t.device().index, t.shape(), t.dtype());
  copy(c, t);
  FORGE_CHECK(stackable(c, G, s), "attention: internal error: a contiguous tensor must stack");
  return s;
}

// Where to write t: t itself when it stacks, else a contiguous temporary (copied into t by
// finish_output).
Stack stacked_output(const Tensor& t, int64_t G) {
  Stack s;
  if (stackable(t, G, s)) return s;
  const Tensor c = blas::device_empty(t.device().index, t.shape(), t.dtype());
  FORGE_CHECK(stackable(c, G, s), "attention: internal error: a contiguous tensor must stack");
  return s;
}

void finish_output(Tensor& t, const Stack& s) {
  if (!s.t.is_same(t)) copy(t, s.t);
}

// How the B x Hkv items are walked (Note [attention as GEMMs]).
struct Walk {
  int64_t B = 1, Hkv = 1;
  bool merged = true, inner_b = false;

  int64_t outer() const { return merged ? 1 : (inner_b ? Hkv : B); }
  int64_t inner() const { return merged ? B * Hkv : (inner_b ? B : Hkv); }
  // Item (o, j) as (b, g).
  void item(int64_t o, int64_t j, int64_t& b, int64_t& g) const {
    if (merged) {
      b = j / Hkv;
      g = j % Hkv;
    } else if (inner_b) {
      b = j;
      g = o;
    } else {
      b = o;
      g = j;
    }
  }
  int64_t stride(const Stack& s) const {
    if (merged) return Hkv == 1 ? s.sb : s.sg;
    return inner_b ? s.sb : s.sg;
  }
  int64_t step() const { return merged ? 1 : (inner_b ? Hkv : 1); }
  const char* at(const Stack& s, int64_t b, int64_t g, size_t elt) const {
    return s.base + (b * s.sb + g * s.sg) * static_cast<int64_t>(elt);
  }
};

Walk plan_walk(int64_t B, int64_t Hkv, std::initializer_list<const Stack*> stacks) {
  Walk w;
  w.B = B;
  w.Hkv = Hkv;
  bool merged = true;
  for (const Stack* s : stacks)
    if (s && B > 1 && Hkv > 1 && s->sb != Hkv * s->sg) merged = false;
  w.merged = merged;
  w.inner_b = B >= Hkv;
  return w;
}

// mask[b, t, s] = doc_q[b, t] == doc_k[b, s], (B, T, S) bool.
__global__ void document_mask_kernel(const int32_t* __restrict__ doc_q, const int32_t* __restrict__ doc_k,
                                     bool* __restrict__ mask, int64_t T, int64_t S, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t s = i % S, bt = i / S, b = bt / T;
  mask[i] = doc_q[bt] == doc_k[b * S + s];
}

// Note [flash documents] where the flash kernels cannot take the ids (f32 / f64, another head
// size, the composed back-end, a deterministic backward): their dense mask, (B, 1, T, S) bool seen
// as (B, H, T, S) (stride 0 over the heads), for the composed path.
Tensor dense_document_mask(const Tensor& doc_q, const Tensor& doc_k, int64_t H) {
  check_flash_documents_shape(doc_q, doc_k);
  const int64_t B = doc_q.size(0), T = doc_q.size(1), S = doc_k.size(1), n = B * T * S;
  const int device = doc_q.device().index;
  Tensor m = blas::device_empty(device, {B, 1, T, S}, DType::boolean);
  if (n > 0) {
    document_mask_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, current_stream(device)>>>(
        doc_q.data<int32_t>(), doc_k.data<int32_t>(), static_cast<bool*>(m.data_ptr()), T, S, n);
    FORGE_CUDA_LAUNCH_CHECK("attention document mask: ids ", doc_q.shape(), " and ", doc_k.shape());
  }
  return Tensor::make(m.storage(), {B, H, T, S}, {T * S, 0, S, 1}, 0, DType::boolean);
}

MaskRef mask_ref(const Tensor& mask) {
  MaskRef m;
  if (!mask.defined()) return m;
  m.p = static_cast<const bool*>(mask.data_ptr());
  m.s0 = mask.stride(0);
  m.s1 = mask.stride(1);
  m.s2 = mask.stride(2);
  m.s3 = mask.stride(3);
  return m;
}

Rows4 rows4(const Tensor& t) {
  return {t.data_ptr(), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

// One batched GEMM of the decomposition: C = alpha A B over `batch` items.
void gemm(int device, DType dtype, int64_t m, int64_t n, int64_t k, int64_t batch, blas::Operand a, blas::Operand b,
          const char* c, int64_t ldc, int64_t c_stride, double alpha) {
  blas::Gemm g;
  g.dtype = dtype;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = batch;
  g.a = a;
  g.b = b;
  g.c = const_cast<char*>(c);
  g.ldc = ldc;
  g.c_batch_stride = c_stride;
  g.alpha = alpha;
  blas::gemm(device, g);
}

// Items per chunk: as many (G*T, S) score matrices as fit the scratch budget (at least one).
int64_t chunk_items(int64_t rows_per_item, int64_t S, size_t elt, int64_t inner) {
  const int64_t per_item = std::max<int64_t>(1, rows_per_item * S * static_cast<int64_t>(elt));
  return std::clamp<int64_t>(g_scratch_bytes.load() / per_item, 1, std::max<int64_t>(1, inner));
}

struct Dims {
  int64_t B, H, T, D, Hkv, S, Dv, G;
};

Dims check_problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const char* op) {
  FORGE_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, ": expected 4-D q, k, v, got ", q.shape(), ", ",
              k.shape(), ", ", v.shape());
  const Dims d{q.size(0), q.size(1), q.size(2), q.size(3), k.size(1), k.size(2), v.size(3), 1};
  FORGE_CHECK(k.size(0) == d.B && v.size(0) == d.B && v.size(1) == d.Hkv && v.size(2) == d.S && k.size(3) == d.D &&
                  d.Hkv > 0 && d.H % d.Hkv == 0,
              op, ": inconsistent shapes q ", q.shape(), ", k ", k.shape(), ", v ", v.shape());
  FORGE_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() && is_floating(q.dtype()), op,
              ": q, k, v must share one floating dtype");
  FORGE_CHECK(!mask.defined() || (mask.dim() == 4 && mask.dtype() == DType::boolean &&
                                  mask.shape() == Shape{d.B, d.H, d.T, d.S}),
              op, ": mask must be a bool (B, H, T, S) view");
  Dims r = d;
  r.G = d.H / d.Hkv;
  return r;
}

// Elements per 16-byte access.
template <class T> constexpr int vec_of() { return static_cast<int>(16 / sizeof(T)); }

}  // namespace

namespace {
std::atomic<AttentionBackend> g_backend{AttentionBackend::automatic};
std::atomic<bool> g_deterministic{false};
}  // namespace

void set_attention_backend(AttentionBackend b) { g_backend = b; }

bool fused_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal) {
  const AttentionBackend b = attention_backend();
  if (b == AttentionBackend::composed) return false;
  return (b == AttentionBackend::automatic && cudnn_attention_applies(q, k, v, mask, causal)) ||
         flash_attention_applies(q, k, v, mask);
}
AttentionBackend attention_backend() { return g_backend.load(); }
void set_deterministic_attention(bool on) { g_deterministic = on; }
bool deterministic_attention() { return g_deterministic.load(); }

int64_t set_attention_scratch_bytes(int64_t bytes) {
  FORGE_CHECK(bytes > 0, "set_attention_scratch_bytes: expected a positive size, got ", bytes);
  return g_scratch_bytes.exchange(bytes);
}

bool document_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v) {
  return attention_backend() != AttentionBackend::composed && !deterministic_attention() &&
         flash_attention_applies(q, k, v, Tensor());
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                       double scale, Tensor& out, Tensor& lse, const Tensor& doc_q, const Tensor& doc_k) {
  const Dims p = check_problem(q, k, v, mask, "cuda::attention_forward");
  const DType acc = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  FORGE_CHECK(out.shape() == (Shape{p.B, p.H, p.T, p.Dv}) && out.dtype() == q.dtype(),
              "cuda::attention_forward: out must be (B, H, T, Dv) of q's dtype, got ", out.shape());
  FORGE_CHECK(lse.shape() == (Shape{p.B, p.H, p.T}) && lse.dtype() == acc && lse.is_contiguous(),
              "cuda::attention_forward: lse must be a contiguous (B, H, T) tensor of dtype ", dtype_name(acc));
  const int device = q.device().index;
  DeviceGuard guard(device);
  if (p.B * p.H * p.T == 0) return;
  if (p.S == 0) {  // no keys: zero rows, lse = -inf
    fill(out, 0.0);
    fill(lse, -std::numeric_limits<double>::infinity());
    return;
  }
  if (doc_q.defined() || doc_k.defined()) {  // Note [flash documents]
    FORGE_CHECK(!mask.defined(), "cuda::attention_forward: give a mask or document ids, not both");
    if (document_attention_applies(q, k, v) && flash_attention_layout_ok(out)) {
      flash_attention_forward(q, k, v, causal, scale, out, lse, doc_q, doc_k);
      return;
    }
    attention_forward(q, k, v, dense_document_mask(doc_q, doc_k, p.H), causal, scale, out, lse);
    return;
  }
  const AttentionBackend backend = attention_backend();  // Note [attention back-ends]
  if (backend == AttentionBackend::automatic && cudnn_attention_applies(q, k, v, mask, causal) &&
      cudnn_attention_forward(q, k, v, causal, scale, out, lse))
    return;
  if (backend != AttentionBackend::composed && flash_attention_applies(q, k, v, mask) &&
      flash_attention_layout_ok(out)) {
    flash_attention_forward(q, k, v, causal, scale, out, lse);
    return;
  }
  const Stack Q = stacked_input(q, p.G), K = stacked_input(k, 1), Vs = stacked_input(v, 1);
  const Stack O = stacked_output(out, p.G);
  const Walk w = plan_walk(p.B, p.Hkv, {&Q, &K, &Vs, &O});
  const size_t elt = element_size(q.dtype());
  const int64_t rows_per_item = p.G * p.T, item_elems = rows_per_item * p.S;
  const int64_t cap = chunk_items(rows_per_item, p.S, elt, w.inner());
  Tensor scratch = blas::device_empty(device, {cap * item_elems}, q.dtype());
  char* sp = static_cast<char*>(scratch.data_ptr());
  const MaskRef m = mask_ref(mask);
  dispatch_float(q.dtype(), "scaled_dot_product_attention", [&]<class T>() {
    using A = acc_t<T>;
    constexpr int V = vec_of<T>();
    for (int64_t o = 0; o < w.outer(); ++o) {
      for (int64_t j0 = 0; j0 < w.inner(); j0 += cap) {
        const int64_t n = std::min(cap, w.inner() - j0);
        int64_t b0, g0;
        w.item(o, j0, b0, g0);
        // S = scale Qg K^T   (G*T, S) per item
        gemm(device, q.dtype(), rows_per_item, p.S, p.D, n, {w.at(Q, b0, g0, elt), Q.ld, false, w.stride(Q)},
             {w.at(K, b0, g0, elt), K.ld, true, w.stride(K)}, sp, p.S, item_elems, scale);
        // P, lse
        const RowMap map{b0 * p.Hkv + g0, w.step(), p.Hkv, p.G, p.T, p.S};
        const int64_t rows = n * rows_per_item;
        const auto blocks = static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps);
        if (p.S % V == 0) {
          attention_softmax_kernel<T, A, V><<<blocks, kRowThreads, 0, current_stream(device)>>>(
              reinterpret_cast<T*>(sp), static_cast<A*>(lse.data_ptr()), m, map, p.H, rows, causal);
        } else {
          attention_softmax_kernel<T, A, 1><<<blocks, kRowThreads, 0, current_stream(device)>>>(
              reinterpret_cast<T*>(sp), static_cast<A*>(lse.data_ptr()), m, map, p.H, rows, causal);
        }
        FORGE_CUDA_LAUNCH_CHECK("scaled_dot_product_attention softmax: q ", q.shape(), " k ", k.shape());
        // Og = P V   (G*T, Dv) per item
        if (p.Dv > 0)
          gemm(device, q.dtype(), rows_per_item, p.Dv, p.S, n, {sp, p.S, false, item_elems},
               {w.at(Vs, b0, g0, elt), Vs.ld, false, w.stride(Vs)}, w.at(O, b0, g0, elt), O.ld, w.stride(O), 1.0);
      }
    }
  });
  finish_output(out, O);
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                        const Tensor& out, const Tensor& lse, bool causal, double scale, Tensor& dq, Tensor& dk,
                        Tensor& dv, const Tensor& doc_q, const Tensor& doc_k) {
  const Dims p = check_problem(q, k, v, mask, "cuda::attention_backward");
  const DType acc = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Shape o_shape{p.B, p.H, p.T, p.Dv};
  FORGE_CHECK(dout.shape() == o_shape && out.shape() == o_shape && dout.dtype() == q.dtype() &&
                  out.dtype() == q.dtype(),
              "cuda::attention_backward: dout and out must be (B, H, T, Dv) of q's dtype, got ", dout.shape(), " and ",
              out.shape());
  FORGE_CHECK(lse.shape() == (Shape{p.B, p.H, p.T}) && lse.dtype() == acc && lse.is_contiguous(),
              "cuda::attention_backward: lse must be a contiguous (B, H, T) tensor of dtype ", dtype_name(acc));
  FORGE_CHECK((!dq.defined() || dq.shape() == q.shape()) && (!dk.defined() || dk.shape() == k.shape()) &&
                  (!dv.defined() || dv.shape() == v.shape()),
              "cuda::attention_backward: gradients must have the shapes of q, k, v");
  const int device = q.device().index;
  DeviceGuard guard(device);
  if (p.B * p.H * p.T == 0 || p.S == 0 || p.Dv == 0) {  // whatever gradient exists is zero
    for (Tensor* t : {&dq, &dk, &dv})
      if (t->defined() && t->numel() > 0) fill(*t, 0.0);
    return;
  }
  const bool need_q = dq.defined(), need_k = dk.defined(), need_v = dv.defined(), need_ds = need_q || need_k;
  if (!need_q && !need_k && !need_v) return;
  if (doc_q.defined() || doc_k.defined()) {  // Note [flash documents]
    FORGE_CHECK(!mask.defined(), "cuda::attention_backward: give a mask or document ids, not both");
    if (document_attention_applies(q, k, v) && flash_attention_layout_ok(dout) && flash_attention_layout_ok(out) &&
        flash_attention_layout_ok(dq) && flash_attention_layout_ok(dk) && flash_attention_layout_ok(dv)) {
      flash_attention_backward(dout, q, k, v, out, lse, causal, scale, dq, dk, dv, doc_q, doc_k);
      return;
    }
    attention_backward(dout, q, k, v, dense_document_mask(doc_q, doc_k, p.H), out, lse, causal, scale, dq, dk, dv);
    return;
  }
  const AttentionBackend backend = attention_backend();  // Note [attention back-ends]
  const bool deterministic = deterministic_attention();
  if (backend == AttentionBackend::automatic && cudnn_attention_applies(q, k, v, mask, causal) &&
      flash_attention_layout_ok(dout) && flash_attention_layout_ok(out) && flash_attention_layout_ok(dq) &&
      flash_attention_layout_ok(dk) && flash_attention_layout_ok(dv) &&
      cudnn_attention_backward(dout, q, k, v, out, lse, causal, scale, deterministic, dq, dk, dv))
    return;
  if (backend != AttentionBackend::composed && !deterministic && flash_attention_applies(q, k, v, mask) &&
      flash_attention_layout_ok(dout) && flash_attention_layout_ok(out) && flash_attention_layout_ok(dq) &&
      flash_attention_layout_ok(dk) && flash_attention_layout_ok(dv)) {
    flash_attention_backward(dout, q, k, v, out, lse, causal, scale, dq, dk, dv);
    return;
  }
  const Stack Q = stacked_input(q, p.G), K = stacked_input(k, 1), Vs = stacked_input(v, 1);
  const Stack dO = stacked_input(dout, p.G);
  Stack dQ, dK, dV;
  if (need_q) dQ = stacked_output(dq, p.G);
  if (need_k) dK = stacked_output(dk, 1);
  if (need_v) dV = stacked_output(dv, 1);
  const Walk w = plan_walk(p.B, p.Hkv, {&Q, &K, &Vs, &dO, need_q ? &dQ : nullptr, need_k ? &dK : nullptr,
                                        need_v ? &dV : nullptr});
  const size_t elt = element_size(q.dtype());
  const int64_t rows_per_item = p.G * p.T, item_elems = rows_per_item * p.S;
  const int64_t cap = chunk_items(rows_per_item, p.S, elt, w.inner());
  Tensor scratch_p = blas::device_empty(device, {cap * item_elems}, q.dtype());
  Tensor scratch_ds = need_ds ? blas::device_empty(device, {cap * item_elems}, q.dtype()) : Tensor();
  char* sp = static_cast<char*>(scratch_p.data_ptr());
  char* sds = need_ds ? static_cast<char*>(scratch_ds.data_ptr()) : nullptr;
  const MaskRef m = mask_ref(mask);
  const Rows4 go = rows4(dO.t), o4 = rows4(out);
  dispatch_float(q.dtype(), "scaled_dot_product_attention_backward", [&]<class T>() {
    using A = acc_t<T>;
    constexpr int V = vec_of<T>();
    const DType dt = q.dtype();
    for (int64_t o = 0; o < w.outer(); ++o) {
      for (int64_t j0 = 0; j0 < w.inner(); j0 += cap) {
        const int64_t n = std::min(cap, w.inner() - j0);
        int64_t b0, g0;
        w.item(o, j0, b0, g0);
        const blas::Operand q_op{w.at(Q, b0, g0, elt), Q.ld, false, w.stride(Q)};
        const blas::Operand do_op{w.at(dO, b0, g0, elt), dO.ld, false, w.stride(dO)};
        // S = scale Qg K^T, recomputed
        gemm(device, dt, rows_per_item, p.S, p.D, n, q_op, {w.at(K, b0, g0, elt), K.ld, true, w.stride(K)}, sp, p.S,
             item_elems, scale);
        // dP = dOg V^T
        if (need_ds)
          gemm(device, dt, rows_per_item, p.S, p.Dv, n, do_op, {w.at(Vs, b0, g0, elt), Vs.ld, true, w.stride(Vs)},
               sds, p.S, item_elems, 1.0);
        // P and dS, in place
        const RowMap map{b0 * p.Hkv + g0, w.step(), p.Hkv, p.G, p.T, p.S};
        const int64_t rows = n * rows_per_item;
        const auto blocks = static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps);
        T* dsp = need_ds ? reinterpret_cast<T*>(sds) : nullptr;
        if (p.S % V == 0) {
          attention_softmax_backward_kernel<T, A, V><<<blocks, kRowThreads, 0, current_stream(device)>>>(
              reinterpret_cast<T*>(sp), dsp, static_cast<const A*>(lse.data_ptr()), go, o4, p.Dv, m, map, p.H, rows,
              causal);
        } else {
          attention_softmax_backward_kernel<T, A, 1><<<blocks, kRowThreads, 0, current_stream(device)>>>(
              reinterpret_cast<T*>(sp), dsp, static_cast<const A*>(lse.data_ptr()), go, o4, p.Dv, m, map, p.H, rows,
              causal);
        }
        FORGE_CUDA_LAUNCH_CHECK("scaled_dot_product_attention backward softmax: q ", q.shape(), " k ", k.shape());
        // dV = P^T dOg   (S, Dv): the sum over the group's heads is the GEMM's reduction
        if (need_v)
          gemm(device, dt, p.S, p.Dv, rows_per_item, n, {sp, p.S, true, item_elems}, do_op, w.at(dV, b0, g0, elt),
               dV.ld, w.stride(dV), 1.0);
        // dQg = scale dS K   (G*T, D)
        if (need_q)
          gemm(device, dt, rows_per_item, p.D, p.S, n, {sds, p.S, false, item_elems},
               {w.at(K, b0, g0, elt), K.ld, false, w.stride(K)}, w.at(dQ, b0, g0, elt), dQ.ld, w.stride(dQ), scale);
        // dK = scale dS^T Qg   (S, D)
        if (need_k)
          gemm(device, dt, p.S, p.D, rows_per_item, n, {sds, p.S, true, item_elems}, q_op, w.at(dK, b0, g0, elt),
               dK.ld, w.stride(dK), scale);
      }
    }
  });
  if (need_q) finish_output(dq, dQ);
  if (need_k) finish_output(dk, dK);
  if (need_v) finish_output(dv, dV);
}

}  // namespace forge::cuda
