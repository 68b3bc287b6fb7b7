// CUDA indexing kernels: index_select, gather, scatter_add. The counterparts of
// backends/cpu/index.cpp.
//
//   index_select  out[o, j, i] = x[o, index[j], i]
//   gather        out[o, j, i] = x[o, index[o, j, i], i]
//   scatter_add   out[o, index[o, j, i], i] += src[o, j, i]
//
// (o: the dims before `dim`, j: along dim, i: the dims after it.) index_select iterates over
// out's shape, gather and scatter_add over index's shape (which may be smaller than x's on
// every dim but `dim`).
//
// Memory contract: x, index and src are read only and may have any strides (broadcast and
// transposed views are read in place); index_select and gather overwrite their contiguous
// out; scatter_add accumulates into a contiguous out (the op hands it a copy of x). No
// scratch. Indices are checked on the device (Note [device-side index checks]).
//
// Note [strided index kernels]: every operand is addressed through loops.cuh's OffsetCalc
// over the iteration shape, with the indexed operand's stride along `dim` replaced by 0:
// its offset then names the element at j = 0, and the kernel adds index * stride_dim. For
// index_select the index is an operand too, with stride 0 on every dim but `dim`. Dims that
// are contiguous across all operands are merged first, so a plain (rows, C) problem costs
// one division per element. No vector path: these ops are off the training hot path
// (embedding has its own kernels).
//
// Note [deterministic scatter_add]: two updates can hit the same element only if they
// share their (o, i) column, so by default one thread owns a column and walks j in order,
// exactly as the CPU does: race-free, no atomics, bit-identical to the CPU (16-bit values
// accumulate each update in f32 and round once per update, as there). That gives
// outer * inner threads; when that is too few to fill the GPU (fewer than 32768 columns)
// and the walks are long (n > 64), e.g. the backward of index_select over the rows of a
// (n, C) table, the updates are spread over all elements with atomicAdd instead (f32,
// f64, i32, i64 natively; bf16/f16 with the sm_80 16-bit atomics, rounding per update).
// That path is not deterministic in the order of the additions. u8 always walks columns.
#include "forge/backends/cuda/index.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <type_traits>

#include "forge/backends/cuda/reduce.cuh"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cuda {
namespace {

constexpr int64_t kDeterministicColumns = 32768;
constexpr int64_t kShortWalk = 64;

// Offsets of N operands with the given strides over `shape` (loops.cuh's OffsetCalc), dims of
// size 1 dropped and dims contiguous across every operand merged.
template <int N>
OffsetCalc<N> offsets_over(const char* op, const Shape& shape, const std::array<Strides, N>& strides) {
  OffsetCalc<N> c{};
  c.ndim = 0;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    bool merge = c.ndim > 0;
    for (int k = 0; k < N && merge; ++k) merge = strides[k][d] == c.strides[c.ndim - 1][k] * c.sizes[c.ndim - 1];
    if (merge) {
      c.sizes[c.ndim - 1] *= shape[d];
      continue;
    }
    FORGE_CHECK(c.ndim < kMaxDims, op, ": more than ", kMaxDims, " dims remain after merging contiguous ones (shape ",
                shape, "); make the operands contiguous first");
    c.sizes[c.ndim] = shape[d];
    for (int k = 0; k < N; ++k) c.strides[c.ndim][k] = strides[k][d];
    ++c.ndim;
  }
  return c;
}

Strides with_stride(Strides s, int64_t dim, int64_t value) {
  s[static_cast<size_t>(dim)] = value;
  return s;
}

// ---- kernels ------------------------------------------------------------------------------

// index_select and gather: operands (out, x with stride 0 along dim, index).
template <class T, class I>
__global__ void __launch_bounds__(kReduceThreads)
    take_kernel(T* __restrict__ out, const T* __restrict__ x, const I* __restrict__ index, int64_t total,
                OffsetCalc<3> calc, int64_t x_dim_stride, int64_t size, int64_t dim, bool select) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t l = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; l < total; l += step) {
    int64_t off[3];
    calc.get(l, off);
    const int64_t v = static_cast<int64_t>(index[off[2]]);
    FORGE_KERNEL_CHECK(v >= 0 && v < size, "%s: index %lld is out of range for dim %lld of size %lld",
                       select ? "index_select" : "gather", static_cast<long long>(v), static_cast<long long>(dim),
                       static_cast<long long>(size));
    out[off[0]] = x[off[1] + v * x_dim_stride];
  }
}

// scatter_add, one thread per column (Note [deterministic scatter_add]): operands (out with
// stride 0 along dim, index, src) over index's shape with dim of size 1.
template <class T, class I>
__global__ void __launch_bounds__(kReduceThreads)
    scatter_add_columns_kernel(T* __restrict__ out, const I* __restrict__ index, const T* __restrict__ src,
                               int64_t columns, int64_t n, OffsetCalc<3> calc, int64_t out_dim_stride,
                               int64_t index_dim_stride, int64_t src_dim_stride, int64_t size, int64_t dim) {
  using A = acc_t<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t l = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; l < columns; l += step) {
    int64_t off[3];
    calc.get(l, off);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t v = static_cast<int64_t>(index[off[1] + j * index_dim_stride]);
      FORGE_KERNEL_CHECK(v >= 0 && v < size, "scatter_add: index %lld is out of range for dim %lld of size %lld",
                         static_cast<long long>(v), static_cast<long long>(dim), static_cast<long long>(size));
      T& dst = out[off[0] + v * out_dim_stride];
      dst = convert<T>(convert<A>(dst) + convert<A>(src[off[2] + j * src_dim_stride]));
    }
  }
}

template <class T> __device__ __forceinline__ void atomic_add(T* p, T v) {
  if constexpr (std::is_same_v<T, bf16>) {
    atomicAdd(reinterpret_cast<__nv_bfloat16*>(p), __ushort_as_bfloat16(v.bits));
  } else if constexpr (std::is_same_v<T, f16>) {
    atomicAdd(reinterpret_cast<__half*>(p), __ushort_as_half(v.bits));
  } else if constexpr (std::is_same_v<T, int64_t>) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));  // two's complement
  } else {
    atomicAdd(p, v);  // float, double, int32
  }
}

template <class T> inline constexpr bool kHasAtomicAdd = !std::is_same_v<T, uint8_t>;

// scatter_add over every element of index with atomics: operands (out with stride 0 along
// dim, index, src).
template <class T, class I>
__global__ void __launch_bounds__(kReduceThreads)
    scatter_add_atomic_kernel(T* __restrict__ out, const I* __restrict__ index, const T* __restrict__ src,
                              int64_t total, OffsetCalc<3> calc, int64_t out_dim_stride, int64_t size, int64_t dim) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t l = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; l < total; l += step) {
    int64_t off[3];
    calc.get(l, off);
    const int64_t v = static_cast<int64_t>(index[off[1]]);
    FORGE_KERNEL_CHECK(v >= 0 && v < size, "scatter_add: index %lld is out of range for dim %lld of size %lld",
                       static_cast<long long>(v), static_cast<long long>(dim), static_cast<long long>(size));
    if constexpr (kHasAtomicAdd<T>) atomic_add(out + off[0] + v * out_dim_stride, src[off[2]]);
  }
}

unsigned flat_grid(int device, int64_t work) {
  return grid_blocks(device, (work + kReduceThreads - 1) / kReduceThreads);
}

// index_select and gather: iterate over `shape` (out's), x's offset at j = 0 plus index * its
// dim stride; `index_strides` over the same shape.
void take(const char* op, const Tensor& x, int64_t dim, const Tensor& index, const Strides& index_strides,
          Tensor& out, bool select) {
  FORGE_CHECK(x.is_cuda() && index.device() == x.device() && out.device() == x.device() && out.is_contiguous() &&
                  out.dtype() == x.dtype(),
              op, ": the CUDA kernel needs x, index and a contiguous out of x's dtype on one GPU, got x ", x.shape(),
              " on ", x.device().str(), ", index on ", index.device().str(), ", out ", out.shape(), " ",
              dtype_name(out.dtype()), " on ", out.device().str());
  const int64_t total = out.numel();
  if (total == 0) return;
  const Shape& shape = out.shape();
  // x viewed over the iteration shape: its own strides (dims of out's shape that are smaller
  // than x's read a prefix of x, as the CPU does), 0 along dim.
  const OffsetCalc<3> calc =
      offsets_over<3>(op, shape, {contiguous_strides(shape), with_stride(x.strides(), dim, 0), index_strides});
  const int device = x.device().index;
  DeviceGuard guard(device);
  dispatch_index(index.dtype(), op, [&]<class I>() {
    dispatch_all(x.dtype(), op, [&]<class T>() {
      take_kernel<T, I><<<flat_grid(device, total), kReduceThreads, 0, current_stream(device)>>>(
          static_cast<T*>(out.data_ptr()), static_cast<const T*>(x.data_ptr()),
          static_cast<const I*>(index.data_ptr()), total, calc, x.strides()[dim], x.shape()[dim], dim, select);
      FORGE_CUDA_LAUNCH_CHECK(op, ": x ", x.shape(), " ", dtype_name(x.dtype()), " strides ", x.strides(), ", dim ", dim,
                              ", index ", index.shape(), " ", dtype_name(index.dtype()));
    });
  });
}

}  // namespace

void index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
  // The index as an operand over out's shape: stride 0 everywhere but along dim.
  Strides is(static_cast<size_t>(x.dim()), 0);
  is[static_cast<size_t>(dim)] = index.dim() == 0 ? 0 : index.strides()[0];
  take("index_select", x, dim, index, is, out, true);
}

void gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
  FORGE_CHECK(out.shape() == index.shape(), "gather: out ", out.shape(), " must have index's shape ", index.shape());
  take("gather", x, dim, index, index.strides(), out, false);
}

void scatter_add_(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  FORGE_CHECK(out.is_cuda() && index.device() == out.device() && src.device() == out.device() &&
                  out.is_contiguous() && out.dtype() == src.dtype(),
              "scatter_add: the CUDA kernel needs a contiguous out of src's dtype, index and src on one GPU, got out ",
              out.shape(), " ", dtype_name(out.dtype()), " on ", out.device().str(), ", src ", dtype_name(src.dtype()),
              " on ", src.device().str(), ", index on ", index.device().str());
  const int64_t total = index.numel();
  if (total == 0) return;
  const Shape& shape = index.shape();
  const int64_t n = shape[static_cast<size_t>(dim)], columns = total / n;
  const int64_t size = out.shape()[dim], out_dim_stride = out.strides()[dim];
  const Strides out_strides = with_stride(out.strides(), dim, 0);
  const int device = out.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  dispatch_index(index.dtype(), "scatter_add", [&]<class I>() {
    dispatch_numeric(out.dtype(), "scatter_add", [&]<class T>() {
      T* po = static_cast<T*>(out.data_ptr());
      const I* pi = static_cast<const I*>(index.data_ptr());
      const T* ps = static_cast<const T*>(src.data_ptr());
      const bool atomic = kHasAtomicAdd<T> && columns < kDeterministicColumns && n > kShortWalk;
      if (atomic) {
        const OffsetCalc<3> calc = offsets_over<3>("scatter_add", shape, {out_strides, index.strides(), src.strides()});
        scatter_add_atomic_kernel<T, I><<<flat_grid(device, total), kReduceThreads, 0, stream>>>(
            po, pi, ps, total, calc, out_dim_stride, size, dim);
      } else {
        Shape column_shape = shape;
        column_shape[static_cast<size_t>(dim)] = 1;
        const OffsetCalc<3> calc =
            offsets_over<3>("scatter_add", column_shape, {out_strides, index.strides(), src.strides()});
        scatter_add_columns_kernel<T, I><<<flat_grid(device, columns), kReduceThreads, 0, stream>>>(
            po, pi, ps, columns, n, calc, out_dim_stride, index.strides()[dim], src.strides()[dim], size, dim);
      }
      FORGE_CUDA_LAUNCH_CHECK("scatter_add: out ", out.shape(), " ", dtype_name(out.dtype()), ", dim ", dim, ", index ",
                              index.shape(), " strides ", index.strides(), ", src ", src.shape(), " strides ",
                              src.strides());
    });
  });
}

}  // namespace forge::cuda
