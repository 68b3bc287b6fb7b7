// CUDA matrix products and Linear layers on cuBLASLt: the counterparts of
// backends/cpu/matmul.cpp, plus the fused Linear entry points of ops::linear.
//
//   matmul                 out[b, m, n] = sum_k a[b, m, k] b[b, k, n]
//   linear_forward         out = x w^T + bias                 (bias in the GEMM epilogue)
//   linear_gelu_forward    pre = x w^T + bias, out = gelu_tanh(pre)   (one GEMM)
//   linear_backward_params dw = dy^T x, dbias = sum_m dy[m, :]        (one GEMM)
//
// Memory contract: outputs (out, pre, dw, dbias) are contiguous and overwritten; inputs
// are only read, through their strides. Each operand matrix is read in place when its last
// two dims are row-major (strides (ld, 1)) or column-major (strides (1, ld)), the latter
// being a transpose flag of the GEMM (Note [row-major GEMMs on cuBLASLt], blaslt.h); only
// a matrix that fits neither (every other column, a stride-0 row, ...) is copied into a
// contiguous scratch first, once per distinct matrix (a broadcast batch dim stays
// broadcast). Batch dims are coalesced across the three operands; what remains is one
// strided-batched call (a broadcast operand gets batch stride 0), or, when the batch dims
// cannot be expressed by one stride per operand, one batched call per index of the other
// batch dims. Everything runs on cuda::current_stream(device), without host
// synchronisation.
//
// Fallbacks when cuBLASLt has no algorithm for an epilogue (f64, unusual alignments):
// bias: out is filled with the broadcast bias and the GEMM accumulates onto it (beta = 1);
// GELU: GEMM + bias into pre, then the elementwise gelu_tanh kernel; bias gradient: the
// column-sum kernel below (f32 partial sums per block of rows, then one pass over them:
// deterministic).
#include <algorithm>
#include <vector>

#include "forge/backends/cuda/blaslt.h"
#include "forge/backends/cuda/elementwise.h"
#include "forge/backends/cuda/loops.cuh"
#include "forge/backends/cuda/matmul.h"
#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/backends/unary_functors.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"
#include "forge/core/env.h"

namespace forge::cuda {
namespace {

// ---- column sums (the bias gradient when no epilogue does it) ----------------------------

constexpr int kSumCols = 32;  // columns per block (one warp wide, coalesced along a row)
constexpr int kSumRows = 8;   // row lanes per block

// partial[blockIdx.y, n] = sum of dy[r, n] over the rows r of block-row blockIdx.y.
template <class T, class A>
__global__ void __launch_bounds__(kSumCols* kSumRows)
    column_sums_kernel(const T* __restrict__ dy,  // (M, N), strides (sr, sc)
                       int64_t M, int64_t N, int64_t sr, int64_t sc, int64_t rows_per_block,
                       A* __restrict__ partial) {  // (gridDim.y, N)
  __shared__ A acc[kSumRows][kSumCols];
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < M ? r0 + rows_per_block : M;
  A s = 0;
  if (n < N)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kSumRows) s += static_cast<A>(dy[r * sr + n * sc]);
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && n < N) {
    A total = 0;
#pragma unroll
    for (int i = 0; i < kSumRows; ++i) total += acc[i][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * N + n] = total;
  }
}

// out[n] = sum_y partial[y, n], rounded once to T. A block takes kSumCols columns; its kSumRows
// row lanes each add every kSumRows-th partial row (lane r: rows r, r + kSumRows, ...), then lane
// 0 adds the lanes in order: a fixed order, deterministic. (A thread a column, each adding all
// the partial rows, ran GPT-2's 2304 and 3072 columns in 9 and 12 blocks: 12-15 us on an H200
// for ~1 MB, docs/performance.md item 28.)
template <class T, class A>
__global__ void __launch_bounds__(kSumCols* kSumRows)
    column_sums_finish_kernel(const A* __restrict__ partial,  // (parts, N)
                              int64_t parts, int64_t N, T* __restrict__ out) {  // (N)
  __shared__ A lanes[kSumRows][kSumCols];
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
  A s = 0;
  if (n < N)
    for (int64_t y = threadIdx.y; y < parts; y += kSumRows) s += partial[y * N + n];
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || n >= N) return;
  A total = 0;
#pragma unroll
  for (int r = 0; r < kSumRows; ++r) total += lanes[r][threadIdx.x];
  out[n] = static_cast<T>(total);
}

// The same sums with 16-byte loads: each thread adds kVec consecutive columns of its rows, a warp
// spans 32 * kVec columns of one row (512 contiguous bytes), 8 row lanes per block; the lanes' sums
// meet in shared memory and one partial per column and block-row is written. Needs N % kVec == 0,
// unit column stride, a row stride of whole 16-byte units and a 16-byte aligned start.
// kGelu (Note [GELU and bias gradients in one pass]): dy is the gradient of gelu_tanh(pre); each
// vector becomes dpre = dy * gelu_tanh'(pre), rounded to T and stored (pre and dpre have dy's row
// stride), and the rounded values are what is summed.
// Note [fast GELU gradient for 16-bit data] (FORGE_GELU_FAST=1): gelu_tanh' with tanhf costs ~40
// instructions an element; item 21 of docs/performance.md measured the one-pass kernel at ~116 us a
// GPT-2 layer against ~91 us at bandwidth. With e = exp(2u), u the tanh's argument,
// (1 + tanh u) / 2 = e / (e + 1) = p and (1 - tanh u) / 2 = 1 / (e + 1) = q, so
//   gelu_tanh'(x) = p + 2 x p q u'(x)
// from one __expf and one correctly rounded reciprocal, with no cancellation where tanh is near
// -1 (the small gradients of negative x keep their relative accuracy); 2u is capped at 88 so that
// e stays finite (p = 1, q ~ 1e-38 there, as tanh's limit). Within a few f32 ulps of the exact form
// above |x| ~ 0.01 and within ~1e-7 absolutely everywhere: far below bf16/f16 rounding. f32 keeps
// the exact form.
__device__ __forceinline__ float gelu_tanh_grad_fast(float g, float x) {
  constexpr float k = static_cast<float>(fn::kSqrt2OverPi);
  const float u = k * (x + 0.044715f * x * x * x);
  const float e = __expf(fminf(2.0f * u, 88.0f));
  const float q = __frcp_rn(e + 1.0f), p = e * q;
  const float du = k * (1.0f + 3.0f * 0.044715f * x * x);
  return g * (p + 2.0f * x * p * q * du);
}

// kGelu: 0 plain column sums; 1 the GELU gradient first (the shared functor); 2 the same with
// gelu_tanh_grad_fast (16-bit T only).
template <class T, class A, int kGelu = 0>
__global__ void __launch_bounds__(kSumCols* kSumRows)
    column_sums_vec_kernel(const T* __restrict__ dy,  // (M, N), strides (sr, 1)
                           int64_t M, int64_t N, int64_t sr, int64_t rows_per_block,
                           A* __restrict__ partial,  // (gridDim.y, N)
                           const T* __restrict__ pre = nullptr, T* __restrict__ dpre = nullptr) {
  constexpr int kVec = 16 / sizeof(T);
  __shared__ A acc[kSumRows][kSumCols * kVec];
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x) * kVec;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < M ? r0 + rows_per_block : M;
  A s[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) s[k] = 0;
  if (c0 < N) {
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kSumRows) {
      uint4 raw = *reinterpret_cast<const uint4*>(dy + r * sr + c0);
      if constexpr (kGelu != 0) {
        const uint4 xraw = *reinterpret_cast<const uint4*>(pre + r * sr + c0);
        T* gv = reinterpret_cast<T*>(&raw);
        const T* xv = reinterpret_cast<const T*>(&xraw);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          if constexpr (kGelu == 2)
            gv[k] = static_cast<T>(gelu_tanh_grad_fast(static_cast<float>(gv[k]), static_cast<float>(xv[k])));
          else
            gv[k] = static_cast<T>(fn::UnaryGrad<UnaryOp::gelu_tanh>{}(static_cast<A>(gv[k]), static_cast<A>(xv[k]),
                                                                       static_cast<A>(0)));
        }
        *reinterpret_cast<uint4*>(dpre + r * sr + c0) = raw;
      }
      const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < kVec; ++k) s[k] += static_cast<A>(v[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) acc[threadIdx.y][threadIdx.x * kVec + k] = s[k];
  __syncthreads();
  // kSumCols * kSumRows threads, kSumCols * kVec columns: each thread finishes kVec / kSumRows
  // (or one) of them, over the row lanes in order.
  for (int t = threadIdx.y * kSumCols + threadIdx.x; t < kSumCols * kVec; t += kSumCols * kSumRows) {
    const int64_t n = static_cast<int64_t>(blockIdx.x) * kSumCols * kVec + t;
    if (n >= N) continue;
    A total = 0;
#pragma unroll
    for (int i = 0; i < kSumRows; ++i) total += acc[i][t];
    partial[static_cast<int64_t>(blockIdx.y) * N + n] = total;
  }
}

// Whether t's rows allow column_sums_vec_kernel: unit column stride, whole 16-byte vectors per
// row and row stride, a 16-byte aligned start.
bool vector_rows(const Tensor& t) {
  const int64_t vec = 16 / static_cast<int64_t>(element_size(t.dtype()));
  return t.stride(1) == 1 && t.size(1) % vec == 0 && t.stride(0) % vec == 0 &&
         reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// The column sums' launch: kSumCols x kSumRows threads, a block per (kSumCols * vec columns,
// block-row). Vectorized (vec > 1): about eight 256-thread blocks an SM (a full SM's threads),
// at least 8 rows each; scalar: 256 rows each, at most 128 of them. (Four blocks an SM left the
// GELU variant, whose tanh makes it compute-heavy, short of its memory bound: item 21 of
// docs/performance.md.)
struct SumGrid {
  dim3 grid, block;
  int64_t parts, rows_per_block;
};
SumGrid sum_grid(int device, int64_t M, int64_t N, int64_t vec) {
  const int64_t col_blocks = (N + kSumCols * vec - 1) / (kSumCols * vec);
  const int64_t parts =
      vec > 1 ? std::max<int64_t>(1, std::min<int64_t>(std::max<int64_t>(1, 8 * multiprocessor_count(device) / col_blocks),
                                                       (M + 7) / 8))
              : std::min<int64_t>((M + 255) / 256, 128);
  return {dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(parts)), dim3(kSumCols, kSumRows), parts,
          (M + parts - 1) / parts};
}

template <class T, class A>
void finish_column_sums(const A* part, int64_t parts, int64_t N, Tensor& out, cudaStream_t stream) {
  column_sums_finish_kernel<T, A><<<static_cast<unsigned>((N + kSumCols - 1) / kSumCols), dim3(kSumCols, kSumRows), 0,
                                    stream>>>(part, parts, N, static_cast<T*>(out.data_ptr()));
  FORGE_CUDA_LAUNCH_CHECK("column sums (final pass) of width ", N);
}

}  // namespace

// out (N) = column sums of dy (M, N); out contiguous. Deterministic: fixed partials, fixed order.
void column_sums(const Tensor& dy, Tensor& out) {
  FORGE_CHECK(dy.dim() == 2 && out.shape() == Shape{dy.size(1)} && out.is_contiguous() && out.dtype() == dy.dtype() &&
                  dy.is_cuda() && out.device() == dy.device(),
              "cuda::column_sums: expected dy (M, N) and a contiguous out (N) of its dtype on its GPU, got ", dy.shape(),
              " and ", out.shape());
  const int device = out.device().index;
  DeviceGuard guard(device);
  const int64_t M = dy.size(0), N = dy.size(1);
  if (N == 0) return;
  if (M == 0) {
    fill(out, 0.0);
    return;
  }
  const bool vectorized = vector_rows(dy);
  const SumGrid s = sum_grid(device, M, N, vectorized ? 16 / static_cast<int64_t>(element_size(dy.dtype())) : 1);
  dispatch_float(dy.dtype(), "linear bias gradient", [&]<class T>() {
    using A = acc_t<T>;
    Tensor partial = blas::device_empty(device, {s.parts, N}, dtype_v<A>);
    const cudaStream_t stream = current_stream(device);
    const T* src = static_cast<const T*>(dy.data_ptr());
    A* part = static_cast<A*>(partial.data_ptr());
    if (vectorized)
      column_sums_vec_kernel<T, A><<<s.grid, s.block, 0, stream>>>(src, M, N, dy.stride(0), s.rows_per_block, part);
    else
      column_sums_kernel<T, A><<<s.grid, s.block, 0, stream>>>(src, M, N, dy.stride(0), dy.stride(1), s.rows_per_block,
                                                               part);
    FORGE_CUDA_LAUNCH_CHECK("linear bias gradient (column sums) of ", dy.shape());
    finish_column_sums<T, A>(part, s.parts, N, out, stream);
  });
}

// Note [GELU and bias gradients in one pass]: linear_gelu's backward needs dpre = g * gelu'(pre)
// (an elementwise pass: reads g and pre, writes dpre) and the bias gradient, the column sums of
// dpre, which cuBLASLt's BGRADB epilogue runs as a kernel of its own after the weight-gradient
// GEMM: a second read of the (M, N) dpre (GPT-2 124M: 100 MB a layer, 40 us of an H200 step's 12
// such kernels). Here the column-sum kernel computes dpre as it loads, stores it and sums the
// stored values: one pass, the same bits as the two steps (the same derivative in the same
// precision, the same partial sums in the same order).
bool gelu_backward_column_sums_fit(const Tensor& g, const Tensor& pre) {
  return g.dim() == 2 && pre.shape() == g.shape() && pre.dtype() == g.dtype() && g.numel() > 0 && g.is_contiguous() &&
         pre.is_contiguous() && vector_rows(g) && vector_rows(pre);
}

bool gelu_backward_column_sums(const Tensor& g, const Tensor& pre, Tensor& dpre, Tensor& dbias) {
  const int64_t M = g.dim() == 2 ? g.size(0) : -1, N = g.dim() == 2 ? g.size(1) : -1;
  FORGE_CHECK(M >= 0 && pre.shape() == g.shape() && dpre.shape() == g.shape() && dbias.shape() == Shape{N} &&
                  pre.dtype() == g.dtype() && dpre.dtype() == g.dtype() && dbias.dtype() == g.dtype() &&
                  g.is_cuda() && pre.device() == g.device() && dpre.device() == g.device() &&
                  dbias.device() == g.device() && dbias.is_contiguous(),
              "cuda::gelu_backward_column_sums: expected g, pre and dpre (M, N) and dbias (N), one dtype, on one "
              "GPU; got ", g.shape(), ", ", pre.shape(), ", ", dpre.shape(), " and ", dbias.shape());
  if (!gelu_backward_column_sums_fit(g, pre) || !dpre.is_contiguous() || !vector_rows(dpre)) return false;
  const int device = g.device().index;
  DeviceGuard guard(device);
  const SumGrid s = sum_grid(device, M, N, 16 / static_cast<int64_t>(element_size(g.dtype())));
  dispatch_float(g.dtype(), "linear_gelu backward", [&]<class T>() {
    using A = acc_t<T>;
    Tensor partial = blas::device_empty(device, {s.parts, N}, dtype_v<A>);
    const cudaStream_t stream = current_stream(device);
    A* part = static_cast<A*>(partial.data_ptr());
    auto kernel = column_sums_vec_kernel<T, A, 1>;
    if constexpr (is_half_v<T>) {
      if (env::flag("FORGE_GELU_FAST")) kernel = column_sums_vec_kernel<T, A, 2>;  // Note [fast GELU gradient for 16-bit data]
    }
    kernel<<<s.grid, s.block, 0, stream>>>(static_cast<const T*>(g.data_ptr()), M, N, N, s.rows_per_block, part,
                                           static_cast<const T*>(pre.data_ptr()), static_cast<T*>(dpre.data_ptr()));
    FORGE_CUDA_LAUNCH_CHECK("linear_gelu backward (GELU gradient and its column sums) of ", g.shape());
    finish_column_sums<T, A>(part, s.parts, N, dbias, stream);
  });
  return true;
}

namespace {

// ---- operand layouts ---------------------------------------------------------------------

// Views built here directly (backends sit below ops/): the transpose of a 2-D tensor, and
// a vector repeated over `rows` rows (stride 0).
Tensor transposed(const Tensor& t) {
  return Tensor::make(t.storage(), {t.size(1), t.size(0)}, {t.stride(1), t.stride(0)}, t.offset(), t.dtype());
}
Tensor repeated_rows(const Tensor& v, int64_t rows) {
  return Tensor::make(v.storage(), {rows, v.size(0)}, {0, v.stride(0)}, v.offset(), v.dtype());
}

// How a (rows, cols) matrix with element strides (sr, sc) is read by the GEMM: row-major
// (element (r, c) at r * ld + c) or transposed (at c * ld + r). Strides of size-1 dims are
// free. ok == false: neither fits, the matrix must be copied.
struct MatrixLayout {
  bool ok = false;
  bool trans = false;
  int64_t ld = 1;
};

MatrixLayout matrix_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc) {
  const int64_t row_ld_min = std::max<int64_t>(1, cols), col_ld_min = std::max<int64_t>(1, rows);
  if ((sc == 1 || cols == 1) && (rows == 1 || sr >= row_ld_min)) return {true, false, rows == 1 ? row_ld_min : sr};
  if ((sr == 1 || rows == 1) && (cols == 1 || sc >= col_ld_min)) return {true, true, cols == 1 ? col_ld_min : sc};
  return {};
}

MatrixLayout layout_of(const Tensor& t) {
  const int64_t nd = t.dim();
  return matrix_layout(t.size(nd - 2), t.size(nd - 1), t.stride(nd - 2), t.stride(nd - 1));
}

blas::Operand operand(const Tensor& t, const MatrixLayout& l, int64_t batch_stride = 0) {
  return {t.data_ptr(), l.ld, l.trans, batch_stride};
}

// A contiguous copy of t whose stride-0 (broadcast) leading dims stay broadcast: the
// distinct matrices are copied once each.
Tensor compact_copy(const Tensor& t) {
  const int64_t nd = t.dim();
  Shape compact = t.shape();
  for (int64_t d = 0; d < nd - 2; ++d)
    if (t.stride(d) == 0) compact[static_cast<size_t>(d)] = 1;
  const Tensor src = Tensor::make(t.storage(), compact, t.strides(), t.offset(), t.dtype());
  Tensor dst = blas::device_empty(t.device().index, compact, t.dtype());
  copy(dst, src);
  Strides st = dst.strides();
  for (int64_t d = 0; d < nd - 2; ++d)
    if (t.stride(d) == 0) st[static_cast<size_t>(d)] = 0;
  return Tensor::make(dst.storage(), t.shape(), st, 0, t.dtype());
}

// The tensor itself when its matrices can be read in place, else a compact copy.
Tensor gemm_readable(const Tensor& t) { return layout_of(t).ok ? t : compact_copy(t); }

// One coalesced batch dim: its size and the element strides of a, b and out along it.
struct BatchDim {
  int64_t size, sa, sb, so;
};

// The batch dims of (a, b, out) with size-1 dims dropped and neighbours merged wherever one
// stride per operand describes both.
std::vector<BatchDim> coalesce_batch(const Tensor& a, const Tensor& b, const Tensor& out) {
  std::vector<BatchDim> dims;
  for (int64_t d = 0; d < out.dim() - 2; ++d) {
    const BatchDim cur{out.size(d), a.stride(d), b.stride(d), out.stride(d)};
    if (cur.size == 1) continue;
    if (!dims.empty()) {
      BatchDim& prev = dims.back();
      if (prev.sa == cur.sa * cur.size && prev.sb == cur.sb * cur.size && prev.so == cur.so * cur.size) {
        prev = {prev.size * cur.size, cur.sa, cur.sb, cur.so};
        continue;
      }
    }
    dims.push_back(cur);
  }
  return dims;
}

void check_gemm_dtype(DType t, const char* op) {
  FORGE_CHECK(t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16, op,
              ": CUDA GEMMs take f32, f64, bf16 or f16, got ", dtype_name(t),
              " (integer matmul runs on the CPU only)");
}

// out = x w^T (+ bias via the epilogue when `bias` is given). Returns false when the bias
// epilogue has no algorithm (nothing was done).
bool linear_gemm(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out, double beta = 0.0) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const Tensor xr = gemm_readable(x), wt = gemm_readable(transposed(w));
  blas::Gemm g;
  g.dtype = out.dtype();
  g.m = M;
  g.n = N;
  g.k = K;
  g.a = operand(xr, layout_of(xr));
  g.b = operand(wt, layout_of(wt));
  g.c = out.data_ptr();
  g.ldc = std::max<int64_t>(1, N);
  g.beta = beta;
  if (bias.defined()) {
    g.epilogue = blas::Epilogue::bias;
    g.bias = bias.data_ptr();
  }
  return blas::gemm(out.device().index, g);
}

void check_linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out, const char* op) {
  FORGE_CHECK(x.dim() == 2 && w.dim() == 2 && out.dim() == 2 && x.size(1) == w.size(1) && out.size(0) == x.size(0) &&
                  out.size(1) == w.size(0),
              op, ": inconsistent shapes x ", x.shape(), ", w ", w.shape(), " -> ", out.shape());
  FORGE_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == w.size(0)), op, ": bias of shape ",
              bias.defined() ? bias.shape() : Shape{}, " does not match w ", w.shape());
  FORGE_CHECK(x.dtype() == out.dtype() && w.dtype() == out.dtype() && (!bias.defined() || bias.dtype() == out.dtype()),
              op, ": dtypes differ");
  FORGE_CHECK(out.is_contiguous(), op, ": out must be contiguous");
  check_gemm_dtype(out.dtype(), op);
}

// bias as the epilogue reads it: contiguous.
Tensor packed_vector(const Tensor& v) {
  if (!v.defined() || v.size(0) <= 1 || v.stride(0) == 1) return v;
  Tensor dst = blas::device_empty(v.device().index, v.shape(), v.dtype());
  copy(dst, v);
  return dst;
}

}  // namespace

void matmul(const Tensor& a, const Tensor& b, Tensor& out, double beta) {
  const int64_t nd = out.dim();
  FORGE_CHECK(nd >= 2 && a.dim() == nd && b.dim() == nd, "cuda::matmul: expected operands of ", nd,
              " dims (batch dims expanded), got shapes ", a.shape(), ", ", b.shape(), " -> ", out.shape());
  FORGE_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(), "cuda::matmul: dtypes differ: ",
              dtype_name(a.dtype()), ", ", dtype_name(b.dtype()), " -> ", dtype_name(out.dtype()));
  FORGE_CHECK(out.is_contiguous(), "cuda::matmul: output must be contiguous (shape ", out.shape(), ")");
  const int64_t M = out.size(nd - 2), N = out.size(nd - 1), K = a.size(nd - 1);
  FORGE_CHECK(Shape(a.shape().begin(), a.shape().end() - 2) == Shape(out.shape().begin(), out.shape().end() - 2) &&
                  Shape(b.shape().begin(), b.shape().end() - 2) == Shape(out.shape().begin(), out.shape().end() - 2) &&
                  a.size(nd - 2) == M && b.size(nd - 2) == K && b.size(nd - 1) == N,
              "cuda::matmul: inconsistent shapes ", a.shape(), " @ ", b.shape(), " -> ", out.shape());
  check_gemm_dtype(out.dtype(), "matmul");
  const int device = out.device().index;
  DeviceGuard guard(device);
  if (out.numel() == 0) return;
  if (K == 0) {  // an empty sum
    if (beta == 0.0) fill(out, 0.0);
    else if (beta != 1.0) FORGE_THROW("cuda::matmul: K = 0 with beta = ", beta, " is not supported");
    return;
  }
  const Tensor ar = gemm_readable(a), br = gemm_readable(b);
  const MatrixLayout la = layout_of(ar), lb = layout_of(br);
  const std::vector<BatchDim> dims = coalesce_batch(ar, br, out);
  blas::Gemm g;
  g.dtype = out.dtype();
  g.m = M;
  g.n = N;
  g.k = K;
  g.ldc = N;
  g.beta = beta;
  // One strided batch over the largest coalesced dim; the others (rare: broadcasts that do
  // not coalesce) are walked here.
  size_t inner = 0;
  for (size_t i = 1; i < dims.size(); ++i)
    if (dims[i].size > dims[inner].size) inner = i;
  if (!dims.empty()) g.batch = dims[inner].size;
  int64_t outer_count = 1;
  for (size_t i = 0; i < dims.size(); ++i)
    if (i != inner) outer_count *= dims[i].size;
  const int64_t elt = static_cast<int64_t>(element_size(out.dtype()));
  const auto* pa = static_cast<const char*>(ar.data_ptr());
  const auto* pb = static_cast<const char*>(br.data_ptr());
  auto* po = static_cast<char*>(out.data_ptr());
  std::vector<int64_t> idx(dims.size(), 0);
  for (int64_t o = 0; o < outer_count; ++o) {
    int64_t oa = 0, ob = 0, oo = 0;
    for (size_t i = 0; i < dims.size(); ++i) {
      if (i == inner) continue;
      oa += idx[i] * dims[i].sa;
      ob += idx[i] * dims[i].sb;
      oo += idx[i] * dims[i].so;
    }
    g.a = {pa + oa * elt, la.ld, la.trans, dims.empty() ? 0 : dims[inner].sa};
    g.b = {pb + ob * elt, lb.ld, lb.trans, dims.empty() ? 0 : dims[inner].sb};
    g.c = po + oo * elt;
    g.c_batch_stride = dims.empty() ? 0 : dims[inner].so;
    blas::gemm(device, g);
    for (size_t i = dims.size(); i-- > 0;) {  // step the multi-index over the outer dims
      if (i == inner) continue;
      if (++idx[i] < dims[i].size) break;
      idx[i] = 0;
    }
  }
}

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  check_linear(x, w, bias, out, "linear");
  const int device = out.device().index;
  DeviceGuard guard(device);
  if (out.numel() == 0) return;
  const Tensor b = packed_vector(bias);
  if (x.size(1) == 0) {  // x w^T is empty: out = bias (or 0)
    if (b.defined()) copy(out, repeated_rows(b, out.size(0)));
    else fill(out, 0.0);
    return;
  }
  if (linear_gemm(x, w, b, out)) return;
  // No bias epilogue here: out = bias, then out += x w^T.
  copy(out, repeated_rows(b, out.size(0)));
  linear_gemm(x, w, Tensor(), out, 1.0);
}

void linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out, Tensor& pre) {
  check_linear(x, w, bias, out, "linear_gelu");
  FORGE_CHECK(pre.shape() == out.shape() && pre.dtype() == out.dtype() && pre.is_contiguous(),
              "linear_gelu: pre must be a contiguous tensor like out ", out.shape());
  const int device = out.device().index;
  DeviceGuard guard(device);
  if (out.numel() == 0) return;
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const Tensor b = packed_vector(bias);
  // f64 (reference checks) always takes the unfused path, so its GELU is forge's own.
  if (K > 0 && N % 8 == 0 && out.dtype() != DType::f64) {
    const Tensor xr = gemm_readable(x), wt = gemm_readable(transposed(w));
    blas::Gemm g;
    g.dtype = out.dtype();
    g.m = M;
    g.n = N;
    g.k = K;
    g.a = operand(xr, layout_of(xr));
    g.b = operand(wt, layout_of(wt));
    g.c = out.data_ptr();
    g.ldc = N;
    g.epilogue = blas::Epilogue::gelu_aux;
    g.bias = b.defined() ? b.data_ptr() : nullptr;
    g.aux = pre.data_ptr();
    g.aux_ld = N;
    if (blas::gemm(device, g)) return;
  }
  linear_forward(x, w, b, pre);
  unary(UnaryOp::gelu_tanh, pre, out);
}

bool gelu_input_gradient(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor& dpre, Tensor& dbias) {
  const int64_t M = dy.size(0), K = dy.size(1), N = w.size(1);
  FORGE_CHECK(dy.dim() == 2 && w.dim() == 2 && w.size(0) == K && pre.shape() == (Shape{M, N}) &&
                  dpre.shape() == (Shape{M, N}) && pre.is_contiguous() && dpre.is_contiguous() &&
                  dbias.shape() == (Shape{N}) && dbias.is_contiguous() && dy.dtype() == w.dtype() &&
                  pre.dtype() == dy.dtype() && dpre.dtype() == dy.dtype() && dbias.dtype() == dy.dtype(),
              "gelu_input_gradient: expected dy (M, K), w (K, N), pre and dpre contiguous (M, N), dbias (N), one "
              "dtype; got dy ",
              dy.shape(), ", w ", w.shape(), ", pre ", pre.shape());
  if (M == 0 || N == 0 || K == 0 || N % 8 != 0 || dy.dtype() == DType::f64) return false;
  const int device = dy.device().index;
  DeviceGuard guard(device);
  const Tensor dr = gemm_readable(dy), wr = gemm_readable(w);
  blas::Gemm g;
  g.dtype = dy.dtype();
  g.m = M;
  g.n = N;
  g.k = K;
  g.a = operand(dr, layout_of(dr));
  g.b = operand(wr, layout_of(wr));
  g.c = dpre.data_ptr();
  g.ldc = N;
  g.epilogue = blas::Epilogue::dgelu_bgrad;
  g.aux = const_cast<void*>(pre.data_ptr());
  g.aux_ld = N;
  g.bias_grad = dbias.data_ptr();
  return blas::gemm(device, g);
}

void linear_backward_params(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& dbias) {
  FORGE_CHECK(dy.dim() == 2, "linear backward: dy must be 2-D, got ", dy.shape());
  const int64_t M = dy.size(0), N = dy.size(1);
  if (dw.defined()) {
    FORGE_CHECK(x.defined() && x.dim() == 2 && x.size(0) == M && x.dtype() == dy.dtype(),
                "linear backward: x must be a 2-D tensor of dy's rows and dtype, got x ",
                x.defined() ? x.shape() : Shape{}, " and dy ", dy.shape());
    FORGE_CHECK(dw.shape() == (Shape{N, x.size(1)}) && dw.is_contiguous() && dw.dtype() == dy.dtype(),
                "linear backward: dw must be a contiguous [", N, ", ", x.size(1), "] tensor of dy's dtype");
  }
  const int64_t K = dw.defined() ? x.size(1) : 0;
  FORGE_CHECK(!dbias.defined() || (dbias.shape() == Shape{N} && dbias.is_contiguous() && dbias.dtype() == dy.dtype()),
              "linear backward: dbias must be a contiguous [", N, "] tensor of dy's dtype");
  check_gemm_dtype(dy.dtype(), "linear backward");
  const int device = dy.device().index;
  DeviceGuard guard(device);
  bool bias_done = !dbias.defined();
  // FORGE_BGRAD_EPILOGUE=0: the bias gradient from column_sums instead of the weight-gradient
  // GEMM's BGRADB epilogue (which cuBLASLt runs as a separate kernel for these shapes): an A/B
  // switch for docs/performance.md.
  static const bool epilogue = env::flag("FORGE_BGRAD_EPILOGUE");
  if (dw.defined() && dw.numel() > 0) {
    if (M == 0) {
      fill(dw, 0.0);
    } else {
      // dw (N, K) = dy^T (N, M) x (M, K); dbias = row sums of dy^T (the epilogue's A).
      const Tensor dyt = gemm_readable(transposed(dy)), xr = gemm_readable(x);
      blas::Gemm g;
      g.dtype = dy.dtype();
      g.m = N;
      g.n = K;
      g.k = M;
      g.a = operand(dyt, layout_of(dyt));
      g.b = operand(xr, layout_of(xr));
      g.c = dw.data_ptr();
      g.ldc = K;
      if (!bias_done && N > 0 && epilogue) {
        g.epilogue = blas::Epilogue::bgrad_a;
        g.bias_grad = dbias.data_ptr();
        bias_done = blas::gemm(device, g);
        if (!bias_done) {
          g.epilogue = blas::Epilogue::none;
          g.bias_grad = nullptr;
          blas::gemm(device, g);
        }
      } else {
        blas::gemm(device, g);
      }
    }
  }
  if (!bias_done) column_sums(dy, dbias);
}

int64_t gemm_plans_cached(int device) { return blas::plans_cached(device); }
void reset_gemm_plans(int device) { blas::reset_plans(device); }

}  // namespace forge::cuda
