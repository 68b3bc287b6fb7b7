// CUDA reductions: sum, mean, amax, amin, var and the arg-extremes, over the last dim of
// a contiguous (rows, cols) matrix (reduce_rows, var_rows, arg_reduce_rows) or over the
// middle dim of a contiguous (outer, n, inner) view (reduce_lanes). The counterparts of
// backends/cpu/reduce.cpp; the ops layer (ops/reduce.cpp) plans every reduction into one
// of these two shapes.
//
// Math (A: the accumulator, f32 for f32/bf16/f16, f64 for f64, i64 for integers and bool):
//   sum   out[r] = O(sum_c A(x[r, c]))                  O = x's dtype, i64 for integer sums
//   mean  out[r] = T(sum_c A(x[r, c]) / cols)
//   amax  out[r] = max_c x[r, c]   amin: min;           a NaN anywhere gives NaN
//   var   out[r] = T(M2_r / max(cols - correction, 0))  M2 = sum of squared deviations
//   arg   indices[r] = the smallest c where x[r, c] is extremal (the first NaN if any),
//         values[r] = x[r, indices[r]] (the element itself, re-read)
//   lanes out[o * inner + i] = reduce_j x[o, j, i]     (sum/mean/amax/amin)
// Memory contract: x is read only; out / values / indices are overwritten (contiguous).
// Scratch: (splits x outputs) accumulators when an output is split across blocks.
//
// Note [reduction plans]:
// - Rows: row groups (Note [row groups] in reduce.cuh): tx threads per row, tx chosen so
//   each thread reads about two items, up to a whole 256-thread block; 16-byte vector loads
//   when every row starts 16-byte aligned (cols * sizeof(T) % 16 == 0 and x aligned).
//   When the row groups cannot fill the GPU (few long rows, e.g. the sum of 1e7 elements
//   to a scalar), each row is also cut into `splits` contiguous column ranges, one per
//   blockIdx.y: pass 1 writes one partial accumulator per (split, row) to scratch, pass 2
//   (finish_partials_kernel) folds them with one warp per row: each lane a strided subset in
//   order, then a fixed xor tree. A split keeps at least 16 items per thread and there are
//   at most 1024 splits, so a length-L f32 sum sees about L / (splits * tx) sequential
//   additions per thread, a tree over tx, ~splits / 32 sequential additions and a tree of
//   32: for L = 1e7 on 132 SMs, about 74 + 8 + 17 + 5 rounding steps deep, not 1e7.
// - Lanes: a block is 32 lanes (consecutive i: coalesced) x 8 warps (j strided by 8); the
//   8 partials of a lane meet in shared memory in warp order. The n dim is split over
//   blockIdx.y when the (o, i-block) tiles cannot fill the GPU (a bias gradient: n = B*T
//   rows, inner = C), with the same finish pass. Deterministic: no atomics.
// - Var: Welford per thread, Chan's pairwise merge across threads and splits (as the CPU
//   merges its column blocks), so data far from zero (1e4 + noise) keep their variance.
// - Ties: the arg combine is symmetric (extreme value first, then the smaller index; a
//   NaN beats any number, the smaller index among NaNs), so the tree order cannot change
//   which index wins: exactly the CPU's first-extremal rule.
//
// Instantiations: sum 8 dtypes, amax/amin 8 (a runtime max/min flag), arg 8, var 4; each
// a rows kernel, a finish kernel and (sum, amax/amin) a lanes kernel.
#include "forge/backends/cuda/reduce.h"

#include <algorithm>
#include <limits>
#include <type_traits>

#include "forge/backends/cuda/reduce.cuh"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cuda {
namespace {

// ---- accumulators and reduction ops -----------------------------------------------------

template <class T> using Acc = std::conditional_t<std::is_floating_point_v<acc_t<T>>, acc_t<T>, int64_t>;

template <class A> __device__ __forceinline__ bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>) return v != v;
  else return false;
}

// The identity of max (lowest) and min (highest): infinities for floating accumulators.
template <class A> __device__ __forceinline__ A lowest() {
  if constexpr (std::is_floating_point_v<A>) return -std::numeric_limits<A>::infinity();
  else return std::numeric_limits<A>::lowest();
}
template <class A> __device__ __forceinline__ A highest() {
  if constexpr (std::is_floating_point_v<A>) return std::numeric_limits<A>::infinity();
  else return std::numeric_limits<A>::max();
}

// Every op: A (trivially copyable), identity(), accumulate(a, x, column), combine(a, b),
// write(output index, a). combine runs in fixed trees whose sides are not in column order,
// so its result may depend on the order only through rounding (ArgOp breaks ties by index).

template <class T, class O> struct SumOp {
  using A = Acc<T>;
  O* out;
  A divisor;  // 1 for sum, cols for mean
  __device__ A identity() const { return A(0); }
  __device__ void accumulate(A& a, T x, int64_t) const { a += convert<A>(x); }
  __device__ A combine(A a, A b) const { return a + b; }
  __device__ void write(int64_t r, A a) const { out[r] = convert<O>(a / divisor); }
};

template <class T> struct ExtremeOp {
  using A = Acc<T>;
  T* out;
  bool is_max;
  __device__ A identity() const { return is_max ? lowest<A>() : highest<A>(); }
  // NaN sticks: once either side is NaN, the result is.
  __device__ A pick(A a, A b) const {
    if (is_nan(a)) return a;
    if (is_nan(b)) return b;
    return (is_max ? b > a : b < a) ? b : a;
  }
  __device__ void accumulate(A& a, T x, int64_t) const { a = pick(a, convert<A>(x)); }
  __device__ A combine(A a, A b) const { return pick(a, b); }
  __device__ void write(int64_t r, A a) const { out[r] = convert<T>(a); }
};

template <class V> struct Best {
  V v;
  int64_t i;
};

template <class T> struct ArgOp {
  using A = Best<Acc<T>>;
  const T* x;  // (rows, cols): values are re-read from x
  int64_t cols;
  T* values;  // may be null
  int64_t* indices;
  bool is_max;
  __device__ A identity() const { return {is_max ? lowest<Acc<T>>() : highest<Acc<T>>(), INT64_MAX}; }
  // Symmetric: the extreme value wins, ties (and NaN vs NaN) go to the smaller index.
  __device__ A combine(A a, A b) const {
    const bool an = is_nan(a.v), bn = is_nan(b.v);
    if (an || bn) {
      if (an && bn) return a.i <= b.i ? a : b;
      return an ? a : b;
    }
    if (a.v == b.v) return a.i <= b.i ? a : b;
    return (is_max ? a.v > b.v : a.v < b.v) ? a : b;
  }
  __device__ void accumulate(A& a, T x, int64_t c) const { a = combine(a, A{convert<Acc<T>>(x), c}); }
  __device__ void write(int64_t r, A a) const {
    indices[r] = a.i;
    if (values) values[r] = x[r * cols + a.i];
  }
};

template <class W> struct Moments {
  W n, mean, m2;
};

template <class T> struct VarOp {
  using W = acc_t<T>;
  using A = Moments<W>;
  T* out;
  W divisor;  // max(cols - correction, 0): 0 gives inf or NaN, as torch.var
  __device__ A identity() const { return {W(0), W(0), W(0)}; }
  __device__ void accumulate(A& a, T x, int64_t) const {  // Welford
    const W v = convert<W>(x);
    a.n += W(1);
    const W d = v - a.mean;
    a.mean += d / a.n;
    a.m2 += d * (v - a.mean);
  }
  __device__ A combine(A a, A b) const {  // Chan et al.
    if (a.n == W(0)) return b;
    if (b.n == W(0)) return a;
    const W n = a.n + b.n, d = b.mean - a.mean;
    return {n, a.mean + d * (b.n / n), a.m2 + b.m2 + d * d * (a.n * (b.n / n))};
  }
  __device__ void write(int64_t r, A a) const { out[r] = convert<T>(a.m2 / divisor); }
};

// ---- kernels ------------------------------------------------------------------------------

// Pass 1 over rows (Note [reduction plans]): blockIdx.x strides over row groups, blockIdx.y
// is the column split. Writes r.write(row) when there is one split, else partial[split, row].
template <class T, class R>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_rows_kernel(const T* __restrict__ x,  // (rows, cols)
                       int64_t rows, int64_t cols, int tx, bool vec,
                       typename R::A* __restrict__ partial,  // (splits, rows) or null
                       R r) {
  using A = typename R::A;
  constexpr int V = kVec<T>;
  __shared__ GroupScratch<A> smem;
  const int ty = kReduceThreads / tx;
  const int lane = static_cast<int>(threadIdx.x) % tx, group = static_cast<int>(threadIdx.x) / tx;
  const int64_t work = vec ? cols / V : cols;
  const int64_t splits = gridDim.y;
  const int64_t chunk = (work + splits - 1) / splits;
  const int64_t w0 = static_cast<int64_t>(blockIdx.y) * chunk, w1 = min(work, w0 + chunk);
  const int64_t groups = (rows + ty - 1) / ty;
  auto combine = [&](const A& a, const A& b) { return r.combine(a, b); };
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t row = g * ty + group;
    A acc = r.identity();
    if (row < rows) {
      const T* xr = x + row * cols;
      if (vec) {
        const Vec<T, V>* xv = reinterpret_cast<const Vec<T, V>*>(xr);
        for (int64_t w = w0 + lane; w < w1; w += tx) {
          const Vec<T, V> v = xv[w];
#pragma unroll
          for (int k = 0; k < V; ++k) r.accumulate(acc, v.v[k], w * V + k);
        }
      } else {
        for (int64_t c = w0 + lane; c < w1; c += tx) r.accumulate(acc, xr[c], c);
      }
    }
    acc = group_reduce(acc, tx, combine, smem);
    if (lane == 0 && row < rows) {
      if (splits == 1) r.write(row, acc);
      else partial[blockIdx.y * rows + row] = acc;
    }
  }
}

// Pass 2: one warp per output i: lane l folds partial[l, i], partial[l + 32, i], ... in
// order, then a fixed xor tree over the 32 lanes (every op's combine is order-insensitive
// where it matters: Note [reduction plans]).
template <class R>
__global__ void __launch_bounds__(kReduceThreads)
    finish_partials_kernel(const typename R::A* __restrict__ partial,  // (splits, count)
                           int64_t count, int splits, R r) {
  using A = typename R::A;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kReduceThreads / 32);
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; i < count; i += warps) {
    A a = r.identity();
    for (int s = lane; s < splits; s += 32) a = r.combine(a, partial[s * count + i]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) a = r.combine(a, shfl_xor_any(a, off));
    if (lane == 0) r.write(i, a);
  }
}

// Over the middle dim of (outer, n, inner): 32 lanes of i x 8 warps of j per block;
// blockIdx.x strides over (o, 32-wide i block) tiles, blockIdx.y is the split of n.
template <class T, class R>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_lanes_kernel(const T* __restrict__ x,  // (outer, n, inner)
                        int64_t outer, int64_t n, int64_t inner,
                        typename R::A* __restrict__ partial,  // (splits, outer * inner) or null
                        R r) {
  using A = typename R::A;
  __shared__ A smem[kReduceWarps][32];
  const int lx = static_cast<int>(threadIdx.x) % 32, ly = static_cast<int>(threadIdx.x) / 32;
  const int64_t iblocks = (inner + 31) / 32, tiles = outer * iblocks;
  const int64_t splits = gridDim.y, chunk = (n + splits - 1) / splits;
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * chunk, j1 = min(n, j0 + chunk);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t o = t / iblocks, i = (t % iblocks) * 32 + lx;
    A acc = r.identity();
    if (i < inner) {
      const T* p = x + o * n * inner + i;
      for (int64_t j = j0 + ly; j < j1; j += kReduceWarps) r.accumulate(acc, p[j * inner], j);
    }
    smem[ly][lx] = acc;
    __syncthreads();
    if (ly == 0 && i < inner) {
      A a = smem[0][lx];
#pragma unroll
      for (int k = 1; k < kReduceWarps; ++k) a = r.combine(a, smem[k][lx]);
      const int64_t oi = o * inner + i;
      if (splits == 1) r.write(oi, a);
      else partial[blockIdx.y * outer * inner + oi] = a;
    }
    __syncthreads();
  }
}

// ---- launchers ----------------------------------------------------------------------------

// Splits of one output so that `units` blocks (or tiles) become about 4 per SM, each split
// keeping at least `min_work` items.
int64_t pick_splits(int device, int64_t units, int64_t work, int64_t min_work) {
  const int64_t target = static_cast<int64_t>(multiprocessor_count(device)) * 4;
  if (units >= target) return 1;
  const int64_t by_gpu = (target + units - 1) / units, by_work = work / min_work;
  return std::clamp<int64_t>(std::min(by_gpu, by_work), 1, 1024);
}

template <class R> void finish(const char* op, int device, const Tensor& scratch, int64_t count, int64_t splits, const R& r) {
  using A = typename R::A;
  constexpr int64_t kWarps = kReduceThreads / 32;  // one warp per output
  finish_partials_kernel<R><<<grid_blocks(device, (count + kWarps - 1) / kWarps), kReduceThreads, 0,
                              current_stream(device)>>>(static_cast<const A*>(scratch.data_ptr()), count,
                                                        static_cast<int>(splits), r);
  FORGE_CUDA_LAUNCH_CHECK(op, " (finish): ", count, " outputs, ", splits, " splits");
}

template <class T, class R> void launch_rows(const char* op, const Tensor& x, int64_t rows, int64_t cols, const R& r) {
  using A = typename R::A;
  if (rows == 0) return;
  constexpr int V = kVec<T>;
  const int device = x.device().index;
  DeviceGuard guard(device);
  const bool vec = V > 1 && cols % V == 0 && aligned16(x.data_ptr());
  const int64_t work = vec ? cols / V : cols;
  const RowGroups g = RowGroups::for_work(work);
  const int64_t groups = (rows + g.ty - 1) / g.ty;
  const int64_t splits = pick_splits(device, groups, work, int64_t{g.tx} * 16);
  Tensor scratch;
  A* partial = nullptr;
  if (splits > 1) {
    scratch = device_buffer(device, {splits * rows * static_cast<int64_t>(sizeof(A))}, DType::u8);
    partial = static_cast<A*>(scratch.data_ptr());
  }
  const dim3 grid(grid_blocks(device, groups, 32), static_cast<unsigned>(splits));
  reduce_rows_kernel<T, R><<<grid, kReduceThreads, 0, current_stream(device)>>>(
      static_cast<const T*>(x.data_ptr()), rows, cols, g.tx, vec, partial, r);
  FORGE_CUDA_LAUNCH_CHECK(op, ": x ", x.shape(), " ", dtype_name(x.dtype()), " as (", rows, ", ", cols, ")");
  if (splits > 1) finish(op, device, scratch, rows, splits, r);
}

template <class T, class R>
void launch_lanes(const char* op, const Tensor& x, int64_t outer, int64_t n, int64_t inner, const R& r) {
  using A = typename R::A;
  if (outer * inner == 0) return;
  const int device = x.device().index;
  DeviceGuard guard(device);
  const int64_t tiles = outer * ((inner + 31) / 32);
  const int64_t splits = pick_splits(device, tiles, n, kReduceWarps * 16);
  Tensor scratch;
  A* partial = nullptr;
  if (splits > 1) {
    scratch = device_buffer(device, {splits * outer * inner * static_cast<int64_t>(sizeof(A))}, DType::u8);
    partial = static_cast<A*>(scratch.data_ptr());
  }
  const dim3 grid(grid_blocks(device, tiles, 32), static_cast<unsigned>(splits));
  reduce_lanes_kernel<T, R><<<grid, kReduceThreads, 0, current_stream(device)>>>(
      static_cast<const T*>(x.data_ptr()), outer, n, inner, partial, r);
  FORGE_CUDA_LAUNCH_CHECK(op, ": x ", x.shape(), " ", dtype_name(x.dtype()), " as (", outer, ", ", n, ", ", inner,
                          ")");
  if (splits > 1) finish(op, device, scratch, outer * inner, splits, r);
}

void check_cuda(const char* op, const Tensor& x, const Tensor& out) {
  FORGE_CHECK(x.is_cuda() && out.device() == x.device() && x.is_contiguous() && out.is_contiguous(), op,
              ": the CUDA kernel needs a contiguous input and output on one GPU, got x ", x.shape(), " on ",
              x.device().str(), ", out ", out.shape(), " on ", out.device().str());
}

// Runs `body<T, O>()` for sum/mean: O = T for floating inputs, i64 for integer ones.
template <class F> void dispatch_sum(RowReduce op, const Tensor& x, const Tensor& out, const char* name, F&& body) {
  FORGE_CHECK(op != RowReduce::mean || is_floating(x.dtype()), name, ": mean needs a floating dtype, got ",
              dtype_name(x.dtype()));
  dispatch_all(x.dtype(), name, [&]<class T>() {
    if constexpr (std::is_floating_point_v<acc_t<T>>) {
      FORGE_CHECK(out.dtype() == x.dtype(), name, ": cannot reduce ", dtype_name(x.dtype()), " into ",
                  dtype_name(out.dtype()));
      body.template operator()<T, T>();
    } else {
      FORGE_CHECK(out.dtype() == DType::i64, name, ": the CUDA kernel sums ", dtype_name(x.dtype()),
                  " into i64, got an output of ", dtype_name(out.dtype()));
      body.template operator()<T, int64_t>();
    }
  });
}

}  // namespace

void reduce_rows(RowReduce op, const Tensor& x, Tensor& out) {
  check_cuda("reduce_rows", x, out);
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  FORGE_CHECK(out.numel() == rows, "reduce_rows: out has ", out.numel(), " elements for ", rows, " rows");
  FORGE_CHECK(cols > 0 || op == RowReduce::sum, "reduce_rows: only sum can reduce empty rows");
  if (op == RowReduce::sum || op == RowReduce::mean) {
    dispatch_sum(op, x, out, "reduce_rows", [&]<class T, class O>() {
      using A = Acc<T>;
      const A divisor = op == RowReduce::mean ? static_cast<A>(cols) : A(1);
      launch_rows<T>("reduce_rows", x, rows, cols, SumOp<T, O>{static_cast<O*>(out.data_ptr()), divisor});
    });
    return;
  }
  FORGE_CHECK(out.dtype() == x.dtype(), "reduce_rows: cannot reduce ", dtype_name(x.dtype()), " into ",
              dtype_name(out.dtype()));
  dispatch_all(x.dtype(), "reduce_rows", [&]<class T>() {
    launch_rows<T>("reduce_rows", x, rows, cols, ExtremeOp<T>{static_cast<T*>(out.data_ptr()), op == RowReduce::amax});
  });
}

void reduce_lanes(RowReduce op, const Tensor& x, Tensor& out, int64_t outer, int64_t n, int64_t inner) {
  check_cuda("reduce_lanes", x, out);
  FORGE_CHECK(x.numel() == outer * n * inner && out.numel() == outer * inner, "reduce_lanes: x ", x.shape(),
              " and out ", out.shape(), " do not match (", outer, ", ", n, ", ", inner, ")");
  FORGE_CHECK(n > 0 || op == RowReduce::sum, "reduce_lanes: only sum can reduce empty rows");
  if (op == RowReduce::sum || op == RowReduce::mean) {
    dispatch_sum(op, x, out, "reduce_lanes", [&]<class T, class O>() {
      using A = Acc<T>;
      const A divisor = op == RowReduce::mean ? static_cast<A>(n) : A(1);
      launch_lanes<T>("reduce_lanes", x, outer, n, inner, SumOp<T, O>{static_cast<O*>(out.data_ptr()), divisor});
    });
    return;
  }
  FORGE_CHECK(out.dtype() == x.dtype(), "reduce_lanes: cannot reduce ", dtype_name(x.dtype()), " into ",
              dtype_name(out.dtype()));
  dispatch_all(x.dtype(), "reduce_lanes", [&]<class T>() {
    launch_lanes<T>("reduce_lanes", x, outer, n, inner,
                    ExtremeOp<T>{static_cast<T*>(out.data_ptr()), op == RowReduce::amax});
  });
}

void var_rows(const Tensor& x, Tensor& out, int64_t correction) {
  check_cuda("var_rows", x, out);
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  FORGE_CHECK(cols > 0, "var_rows: cannot reduce empty rows");
  FORGE_CHECK(out.dtype() == x.dtype() && out.numel() == rows, "var_rows: bad output ", out.shape(), " ",
              dtype_name(out.dtype()));
  dispatch_float(x.dtype(), "var", [&]<class T>() {
    using W = acc_t<T>;
    const W divisor = static_cast<W>(std::max<int64_t>(cols - correction, 0));
    launch_rows<T>("var", x, rows, cols, VarOp<T>{static_cast<T*>(out.data_ptr()), divisor});
  });
}

void arg_reduce_rows(ArgReduce op, const Tensor& x, Tensor* values, Tensor& indices) {
  check_cuda("arg_reduce_rows", x, indices);
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  FORGE_CHECK(cols > 0, "arg_reduce_rows: cannot reduce empty rows");
  FORGE_CHECK(indices.dtype() == DType::i64 && indices.numel() == rows, "arg_reduce_rows: indices must be ", rows,
              " i64, got ", indices.shape(), " ", dtype_name(indices.dtype()));
  if (values) {
    check_cuda("arg_reduce_rows", x, *values);
    FORGE_CHECK(values->dtype() == x.dtype() && values->numel() == rows, "arg_reduce_rows: bad values buffer");
  }
  dispatch_all(x.dtype(), "arg_reduce", [&]<class T>() {
    const ArgOp<T> r{static_cast<const T*>(x.data_ptr()), cols, values ? static_cast<T*>(values->data_ptr()) : nullptr,
                     static_cast<int64_t*>(indices.data_ptr()), op == ArgReduce::max};
    launch_rows<T>("arg_reduce", x, rows, cols, r);
  });
}

}  // namespace forge::cuda
