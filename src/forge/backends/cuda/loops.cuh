#pragma once
// The CUDA elementwise engine: out[i] = f(in0[i], in1[i], in2[i]) over tensors of one
// shape with any strides (the CUDA counterpart of backends/cpu/loops.h).
//
// Math: for every linear index i of the iteration shape (row-major over out's shape),
// out[off_0(i)] = Out(f(in_k[off_k(i)]...)), where off_k(i) = sum_d idx_d(i) * stride_k[d].
// Memory contract: out is overwritten element by element and nothing else is written;
// inputs are read once per element (stride-0 broadcast dims re-read the same element);
// out may alias an input only element-for-element (same data pointer and strides: the
// in-place add_/mul_ of the ops layer).
//
// Host side, the launcher drops size-1 dims and merges dims that are contiguous across
// every operand (as the CPU engine does), so a contiguous problem becomes one dim and
// a broadcast bias add two. Two paths, chosen per launch:
//   vectorised: every operand contiguous with its data pointer aligned to one vector:
//     each thread moves V elements per operand with one load/store of up to 16 bytes
//     (V = 16 / the widest operand's element size), the tail element by element;
//   strided: per element, offsets by div/mod over the coalesced dims (at most kMaxDims;
//     more is an error), passed by value in the kernel's parameters.
// Both are grid-stride loops over a grid capped at kBlocksPerSm blocks per SM.
//
// Instantiations: one kernel per (arity, element types, functor). Functors are named
// structs, never lambdas, so two call sites of the same op and dtype share a kernel.
//
// TODO(perf): the strided path divides 64-bit integers; a fast divmod (multiply by a
// magic reciprocal, as PyTorch's IntDivider) and 32-bit indexing when numel < 2^31 are
// the next steps once benchmarks/ measures them.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "forge/backends/cuda/runtime.h"
#include "forge/core/tensor.h"

namespace forge::cuda {

inline constexpr int kMaxDims = 8;
inline constexpr int kBlockSize = 256;
inline constexpr int kBlocksPerSm = 8;  // 8 x 256 = 2048 threads: a full SM

// Note [one wave of grid-stride blocks]: a grid-stride kernel whose grid is capped at
// kBlocksPerSm blocks an SM runs in more than one wave when its registers let fewer blocks an SM
// be resident: H200 profiles (ncu) had the one-pass SwiGLU backward (40 registers, six blocks an
// SM) at 1.33 waves and the cross-entropy kernels (40-48 registers) at 2.7-3.2, each later wave a
// fraction of the GPU working alone. Every block of such a grid does the same work, so a grid of
// exactly the resident blocks (one wave) ends when its blocks do. This is that count an SM, for
// `threads`-thread blocks of `kernel` with `smem` bytes of dynamic shared memory, at least 1;
// callers cache it per kernel (it is a host query, the same for every device of one model).
template <class Kernel> int resident_blocks_per_sm(Kernel kernel, int threads, size_t smem = 0) {
  int n = 0;
  FORGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
  return std::max(n, 1);
}

// Element offsets of N operands (out first) for a linear index over the coalesced shape.
template <int N> struct OffsetCalc {
  int ndim;
  int64_t sizes[kMaxDims];       // innermost dim first
  int64_t strides[kMaxDims][N];  // in elements, per dim and operand

  __device__ __forceinline__ void get(int64_t linear, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == ndim) break;
      int64_t i = linear;
      if (d + 1 < ndim) {  // the outermost dim needs no division
        const int64_t q = linear / sizes[d];
        i = linear - q * sizes[d];
        linear = q;
      }
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += i * strides[d][k];
    }
  }
};

template <int N> struct ElementwiseArgs {
  char* ptr[N];  // operand k's first element (out is operand 0)
  int64_t n;     // elements
  bool vectorized;
  OffsetCalc<N> calc;
};

template <class T, int V> struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

// Elements per vector: 16 bytes of the widest operand.
template <class... T> constexpr int vec_width() {
  size_t widest = 1;
  ((widest = sizeof(T) > widest ? sizeof(T) : widest), ...);
  return widest >= 16 ? 1 : static_cast<int>(16 / widest);
}

template <int NIn, class Out, class F, class A, class B, class C>
__device__ __forceinline__ Out invoke(const F& f, [[maybe_unused]] const A& x0, [[maybe_unused]] const B& x1,
                                      [[maybe_unused]] const C& x2) {
  if constexpr (NIn == 0) return static_cast<Out>(f());
  else if constexpr (NIn == 1) return static_cast<Out>(f(x0));
  else if constexpr (NIn == 2) return static_cast<Out>(f(x0, x1));
  else return static_cast<Out>(f(x0, x1, x2));
}

template <class T> __device__ __forceinline__ T load(const char* base, int64_t i) {
  return reinterpret_cast<const T*>(base)[i];
}

// Unused input types are given as Out (they are never read).
template <int NIn, class Out, class In0, class In1, class In2, class F>
__global__ void __launch_bounds__(kBlockSize) elementwise_kernel(F f, ElementwiseArgs<NIn + 1> a) {
  constexpr int N = NIn + 1;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  auto scalar_at = [&](const int64_t (&off)[N]) {
    [[maybe_unused]] In0 x0{};
    [[maybe_unused]] In1 x1{};
    [[maybe_unused]] In2 x2{};
    if constexpr (NIn >= 1) x0 = load<In0>(a.ptr[1], off[1]);
    if constexpr (NIn >= 2) x1 = load<In1>(a.ptr[2], off[2]);
    if constexpr (NIn >= 3) x2 = load<In2>(a.ptr[3], off[3]);
    reinterpret_cast<Out*>(a.ptr[0])[off[0]] = invoke<NIn, Out>(f, x0, x1, x2);
  };
  if (a.vectorized) {
    constexpr int V = vec_width<Out, In0, In1, In2>();
    const int64_t nvec = a.n / V;
    for (int64_t i = tid; i < nvec; i += step) {
      [[maybe_unused]] Vec<In0, V> x0;
      [[maybe_unused]] Vec<In1, V> x1;
      [[maybe_unused]] Vec<In2, V> x2;
      if constexpr (NIn >= 1) x0 = load<Vec<In0, V>>(a.ptr[1], i);
      if constexpr (NIn >= 2) x1 = load<Vec<In1, V>>(a.ptr[2], i);
      if constexpr (NIn >= 3) x2 = load<Vec<In2, V>>(a.ptr[3], i);
      Vec<Out, V> o;
#pragma unroll
      for (int j = 0; j < V; ++j) o.v[j] = invoke<NIn, Out>(f, x0.v[j], x1.v[j], x2.v[j]);
      reinterpret_cast<Vec<Out, V>*>(a.ptr[0])[i] = o;
    }
    for (int64_t i = nvec * V + tid; i < a.n; i += step) {
      int64_t off[N];
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] = i;
      scalar_at(off);
    }
  } else {
    for (int64_t i = tid; i < a.n; i += step) {
      int64_t off[N];
      a.calc.get(i, off);
      scalar_at(off);
    }
  }
}

// ---- host side -------------------------------------------------------------------------

// Coalesced offsets for `ops` over `shape`; sets `contiguous` when every operand is
// contiguous. Throws naming `op` when more than kMaxDims dims remain after coalescing.
template <int N>
OffsetCalc<N> make_offset_calc(const char* op, const Shape& shape, const std::array<const Tensor*, N>& ops,
                               bool& contiguous) {
  // Dims outer to inner, size-1 dims dropped.
  int64_t sizes[64];
  int64_t strides[64][N];
  int nd = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    FORGE_CHECK(nd < 64, op, ": too many dims (", shape.size(), ")");
    sizes[nd] = shape[d];
    for (int k = 0; k < N; ++k) strides[nd][k] = ops[k]->strides()[d];
    ++nd;
  }
  OffsetCalc<N> c{};
  c.ndim = 0;
  // Coalesce from the innermost dim out: dim i merges into the current inner dim when,
  // for every operand, stepping dim i equals stepping the inner dim across its extent.
  for (int i = nd - 1; i >= 0; --i) {
    bool merge = c.ndim > 0;
    for (int k = 0; k < N && merge; ++k)
      merge = strides[i][k] == c.strides[c.ndim - 1][k] * c.sizes[c.ndim - 1];
    if (merge) {
      c.sizes[c.ndim - 1] *= sizes[i];
      continue;
    }
    FORGE_CHECK(c.ndim < kMaxDims, describe_operands(op, ops.data(), N), ": more than ", kMaxDims,
                " dims remain after merging contiguous ones; the CUDA elementwise kernels take at most ", kMaxDims,
                " (make an operand contiguous first)");
    c.sizes[c.ndim] = sizes[i];
    for (int k = 0; k < N; ++k) c.strides[c.ndim][k] = strides[i][k];
    ++c.ndim;
  }
  contiguous = c.ndim == 0;
  if (c.ndim == 1) {
    contiguous = true;
    for (int k = 0; k < N; ++k) contiguous &= c.strides[0][k] == 1;
  }
  return c;
}

// Runs elementwise_kernel on out's device. `ins` are NIn tensors of out's shape and
// device whose dtypes are In0, In1, In2 (in order); out's dtype is Out.
template <int NIn, class Out, class In0 = Out, class In1 = Out, class In2 = Out, class F>
void launch_elementwise(const char* op, const F& f, const Tensor& out, const std::array<const Tensor*, NIn>& ins) {
  constexpr int N = NIn + 1;
  std::array<const Tensor*, N> ops{};
  ops[0] = &out;
  for (int k = 0; k < NIn; ++k) ops[k + 1] = ins[k];
  const DType dtypes[4] = {dtype_v<Out>, dtype_v<In0>, dtype_v<In1>, dtype_v<In2>};
  FORGE_CHECK(out.is_cuda(), op, ": output on ", out.device().str(), ", expected a CUDA device");
  for (int k = 0; k < N; ++k) {
    FORGE_CHECK(ops[k]->device() == out.device() && ops[k]->shape() == out.shape() && ops[k]->dtype() == dtypes[k],
                describe_operands(op, ops.data(), N), ": operand ", k, " should be ", dtype_name(dtypes[k]),
                " of the output's shape and device");
  }
  const int64_t n = out.numel();
  if (n == 0) return;

  ElementwiseArgs<N> a;
  bool contiguous = false;
  a.calc = make_offset_calc<N>(op, out.shape(), ops, contiguous);
  a.n = n;
  constexpr int V = vec_width<Out, In0, In1, In2>();
  const size_t vec_bytes[4] = {sizeof(Out) * V, sizeof(In0) * V, sizeof(In1) * V, sizeof(In2) * V};
  a.vectorized = contiguous && V > 1;
  for (int k = 0; k < N; ++k) {
    a.ptr[k] = static_cast<char*>(ops[k]->data_ptr());
    a.vectorized &= reinterpret_cast<uintptr_t>(a.ptr[k]) % vec_bytes[k] == 0;
  }

  const int device = out.device().index;
  DeviceGuard guard(device);
  const int64_t work = a.vectorized ? (n + V - 1) / V : n;
  const int64_t max_blocks = static_cast<int64_t>(multiprocessor_count(device)) * kBlocksPerSm;
  const int64_t blocks = std::min<int64_t>((work + kBlockSize - 1) / kBlockSize, max_blocks);
  elementwise_kernel<NIn, Out, In0, In1, In2, F>
      <<<static_cast<unsigned>(blocks), kBlockSize, 0, current_stream(device)>>>(f, a);
  FORGE_CUDA_LAUNCH_CHECK(describe_operands(op, ops.data(), N));
}

}  // namespace forge::cuda
